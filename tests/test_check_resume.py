"""``partial-rollout check-resume`` end to end: three engine processes, a SIGKILL, an exact resume."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from partial_rollout.cli.check_resume import continued_samples
from partial_rollout.snapshot import SampleState, load_snapshot


@pytest.mark.engine
def test_check_resume_reports_exact_matches(tmp_path: Path, tiny_qwen2: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "partial_rollout.cli",
            "check-resume",
            "--model",
            str(tiny_qwen2),
            "--requests",
            "9",
            "--max-tokens",
            "256",
            "--seed",
            "22",
            "--no-multiprocessing",
            "--keep",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    floor = re.search(
        r"noise floor: (\d+)/(\d+) samples token-identical .*; max \|logprob diff\| ([0-9.e-]+)", proc.stdout
    )
    assert floor, proc.stdout
    assert int(floor.group(2)) == 9 and float(floor.group(3)) >= 0.0
    m = re.search(
        r"continued: (\d+)/(\d+) in-flight samples token-identical .*; (\d+) declared inexact; (\d+) diverged",
        proc.stdout,
    )
    assert m, proc.stdout
    matched, checked, declared, diverged = map(int, m.groups())
    # only samples in flight with a prefix at the cut count as continued: the snapshot the killed
    # process left behind says which they were, and it is intact and holds real prefixes
    snapshot = load_snapshot(tmp_path)
    prefixes = [s.num_tokens for _, s in snapshot.iter_samples(SampleState.IN_FLIGHT) if s.num_tokens > 0]
    assert prefixes and sum(prefixes) > 0
    assert checked + declared == len(prefixes), (proc.stdout, prefixes)
    assert matched == checked and diverged == 0
    assert f"cut: {len(prefixes)} of 9 samples in flight with a prefix ({sum(prefixes)} prefix tokens)" in proc.stdout
    stall = re.search(r"cut in [0-9.]+ ms, engine not paused: it ran (\d+) decode steps from the cut", proc.stdout)
    assert stall, proc.stdout  # what a save costs in steps is the benchmarks' to measure (no threshold here)
    assert "verdict: exact" in proc.stdout


def test_check_resume_bad_model_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "partial_rollout.cli", "check-resume", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "--model" in proc.stderr and "Traceback" not in proc.stderr


def test_only_samples_in_flight_with_a_prefix_count_as_continued() -> None:
    # which samples a cut leaves in flight depends on timing; this is the rule applied to its record
    cut = {
        "done": ["finished", 40, None],
        "queued": ["not_started", 0, None],
        "racing": ["in_flight", 0, None],
        "cut": ["in_flight", 12, None],
        "cut-inexact": ["in_flight", 7, "unseeded"],
    }
    assert continued_samples(cut) == ["cut", "cut-inexact"]
