"""The steady-state benchmark's own logic: its presets, the ratios it reports, its table and plot. No engine runs.

The rates themselves (and whether ours reach the targets) live in ``benchmarks/results/steady_state.json``;
nothing here is timed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.steady import report
from benchmarks.steady_state import parse_args

ROOT = Path(__file__).resolve().parents[1]


def _run(config: str, rep: int, tok_s: float) -> dict[str, Any]:
    cpu = {"driver": 0.1, "actor 0": 1.5}
    return dict(
        config=config,
        rep=rep,
        tok_s=tok_s,
        rounds=[dict(tokens=100, wall_s=100 / tok_s, tok_s=tok_s, cpu_s=cpu, load_1m=0.5)],
    )


RUNS = [
    _run("vllm", 0, 1000.0),
    _run("engine", 0, 990.0),
    _run("vllm-ray-1", 0, 800.0),
    _run("pool-ray-1", 0, 760.0),
    _run("pool-ray-1", 1, 600.0),  # run in reverse order in the second repetition: ours first
    _run("vllm-ray-1", 1, 1000.0),
    _run("engine", 1, 1010.0),
    _run("vllm", 1, 1000.0),
]


def test_each_of_ours_is_compared_with_its_baseline_of_the_same_repetition() -> None:
    ratios = report.ratios(RUNS)
    assert set(ratios) == {"engine / vllm", "pool-ray-1 / vllm-ray-1"}  # no run of the others: not compared
    ray1 = ratios["pool-ray-1 / vllm-ray-1"]
    assert ray1["paired"] == pytest.approx([0.95, 0.6])
    assert ray1["paired_median"] == pytest.approx(0.775) and not ray1["met"]
    assert ray1["ratio_of_medians"] == pytest.approx(680 / 900)
    engine = ratios["engine / vllm"]
    assert engine["paired"] == pytest.approx([0.99, 1.01]) and engine["met"] and engine["target"] == 0.97


def test_the_summary_gives_median_and_spread_per_configuration() -> None:
    summary = report.summarize(RUNS)
    assert list(summary) == ["vllm", "engine", "vllm-ray-1", "pool-ray-1"]
    assert summary["pool-ray-1"] | {"median_round_cpu_s": None} == dict(
        reps=2,
        median_tok_s=680.0,
        min_tok_s=600.0,
        max_tok_s=760.0,
        median_round_wall_s=pytest.approx((100 / 760 + 100 / 600) / 2),
        median_round_cpu_s=None,
    )
    assert summary["vllm"]["median_round_cpu_s"] == {"driver": 0.1, "actor 0": 1.5}


def test_the_table_and_the_plot_come_from_the_json(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    result = dict(
        config=dict(requests=64, max_tokens=256, reps=2),
        summary=report.summarize(RUNS),
        ratios=report.ratios(RUNS),
    )
    table = report.table(result)
    assert "| pool-ray-1 / vllm-ray-1 | 0.775 [0.95, 0.60] | 0.756 | 0.90 | **no** |" in table
    assert "| engine / vllm | 1.000 [0.99, 1.01] | 1.000 | 0.97 | yes |" in table
    png = report.plot(result, tmp_path / "steady.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_is_a_preset_that_explicit_options_override() -> None:
    quick = parse_args(["--quick"])
    assert (quick.reps, quick.max_tokens, quick.rounds, quick.requests) == (1, 64, 1, 64)
    full = parse_args([])
    assert (full.reps, full.max_tokens, full.rounds, full.output_kind) == (5, 256, 2, "final")
    assert parse_args(["--quick", "--reps", "3"]).reps == 3


def test_the_benchmark_runs_from_the_repository_root() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.steady_state", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--quick" in proc.stdout and "pool-ray-2" in proc.stdout
