"""``partial-rollout check-resume`` end to end: three engine processes, a SIGKILL, an exact resume."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

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
            "96",
            "--seed",
            "4",
            "--keep",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    m = re.search(r"exact: (\d+)/(\d+) matched token for token .*; (\d+) declared inexact; (\d+) diverged", proc.stdout)
    assert m, proc.stdout
    matched, total, declared, diverged = map(int, m.groups())
    assert matched == total and total + declared == 9 and diverged == 0
    assert re.search(r"engine paused [0-9.]+ ms", proc.stdout)
    # the snapshot the killed process left behind is intact and holds real prefixes
    snapshot = load_snapshot(tmp_path)
    prefixes = [s.num_tokens for _, s in snapshot.iter_samples(SampleState.IN_FLIGHT)]
    assert prefixes and sum(prefixes) > 0


def test_check_resume_bad_model_is_one_line(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "partial_rollout.cli", "check-resume", "--model", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert proc.stderr.count("\n") == 1 and "--model" in proc.stderr and "Traceback" not in proc.stderr
