"""The resume-throughput benchmark end to end, on a tiny configuration (three real engine starts).

Runs ``python -m benchmarks.resume_throughput`` as a user would, in a subprocess (vLLM spawns
processes and binds to one event loop), and checks the JSON it writes: every mode is there,
continue redid no decode token, and the benchmark's figures agree with the snapshot it wrote.
No timing is asserted.

The benchmarks are not part of the installed package: they run from the repository root, which
``python -m`` puts first on the import path, so the copy in the checkout is the one that runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_run_from_the_repository_root() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.resume_throughput", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--full" in proc.stdout
    code = (
        "import benchmarks.resume_throughput, benchmarks.resume.phases as p, benchmarks.snapshot_io as s;"
        " print(p.__file__); print(s.__file__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [Path(line) for line in proc.stdout.split()] == [
        ROOT / "benchmarks/resume/phases.py",
        ROOT / "benchmarks/snapshot_io.py",
    ]


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_tiny_benchmark_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.resume_throughput",
            "--samples",
            "8",
            "--prefix",
            "32",
            "--reps",
            "1",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "32",
            "--kv-cache-bytes",
            str(256 * 2**20),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.with_name("bench.json").read_text())
    for name in ("bench_recovery.png", "bench_timeline.png", "bench_ratio.png"):
        assert out.with_name(name).stat().st_size > 10_000

    assert result["consistency"]["passed"], result["consistency"]["failed"]
    assert result["continue_redone_decode_tokens_max"] == 0
    exact = result["points"][0]["reps"][0]["exact"]
    assert "mismatches" in exact  # exactness is reported here, asserted in test_resume_exact
    # token identity next to the engine's noise floor, on the samples in flight at the cut only
    assert exact["in_flight"] == result["points"][0]["reps"][0]["workload"]["samples_in_flight"] == 8
    assert exact["prefix_bit_identical"] == 8  # the saved prefix, its logprobs and versions, bit for bit
    ident = result["points"][0]["summary"]["identity"]
    assert ident["samples_in_flight"] == 8
    assert ident["beyond_noise_floor"] == (ident["continue_identical"] < ident["noise_floor_identical"])
    assert result["exact"]["beyond_noise_floor"] == (["8x32"] if ident["beyond_noise_floor"] else [])
    assert "noise floor" in result["markdown"]
    flag = "DIVERGENCE BEYOND THE NOISE FLOOR" if ident["beyond_noise_floor"] else "within the noise floor"
    assert f"{flag}: 8x32: continue token-identical to uninterrupted for" in proc.stdout
    for key in ("machine", "versions", "config", "definitions", "table", "markdown"):
        assert key in result
    (point,) = result["points"]
    (rep,) = point["reps"]
    assert set(rep["modes"]) == {"uninterrupted", "drop", "regenerate", "continue"}
    assert set(point["summary"]["modes"]) == set(rep["modes"])
    assert {row["mode"] for row in result["table"]} == set(rep["modes"])

    work, modes = rep["workload"], rep["modes"]
    assert work["samples_in_flight"] == 8 and work["groups_pending"] == 1
    assert modes["continue"]["redone_decode_tokens"] == 0
    assert modes["continue"]["decode_tokens"] == work["remaining_tokens"]
    assert modes["regenerate"]["redone_decode_tokens"] == work["prefix_tokens"] > 0
    assert modes["drop"]["prompts_lost"] == work["groups"]
    assert modes["drop"]["prefix_tokens_lost"] == work["prefix_tokens"]
    assert modes["uninterrupted"]["redone_decode_tokens"] == 0
    for mode in ("uninterrupted", "regenerate", "continue"):
        assert modes[mode]["recovery_s"] > 0 and modes[mode]["steps"] > 0 and modes[mode]["cpu_s"] > 0
    assert modes["regenerate"]["warm_s"] > 0 and modes["continue"]["warm_s"] > 0
    save = rep["save"]
    assert save["snapshot_bytes"] > 0 and save["load_s"] > 0 and rep["floor"]["floor_s"] > 0
    parts = {
        k: save[f"bytes_{k}"]
        for k in (
            "token_data",
            "prompts",
            "sampler_state",
            "per_sample_fields",
            "per_group_fields",
            "other_tensors",
            "header_sampling_tables",
            "header_rest",
        )
    }
    assert sum(parts.values()) == save["snapshot_bytes"], parts
    assert parts["sampler_state"] == save["sampler_state_bytes"] > 0
    assert 8.0 <= save["token_data_bytes_per_token"] < 9.0  # int32 token + float32 logprob, plus version runs
    assert 0 <= save["stop_ms"] <= save["pause_ms"] <= save["freeze_ms"]
    assert save["stall_ms"] == pytest.approx(save["freeze_ms"] - save["stop_ms"])
    for stat in point["summary"]["modes"]["continue"]["recovery_s"], point["summary"]["save"]["pause_ms"]:
        assert stat["min"] <= stat["median"] <= stat["max"]
