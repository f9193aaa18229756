"""NeMo RL's own single-controller unit tests pass in the controller environment.

They run as NeMo RL's CI runs them, in ``.venv-nemo-rl`` (``scripts/setup_nemo_rl.sh``), from a
writable copy of the ``NEMO_RL_SRC`` checkout, with NeMo RL's ``addopts`` dropped. Every listed
test must pass: none failed, none in error, none skipped, and each module collects exactly as many
tests as at the tested commit.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import nemo_rl_harness as harness
import pytest

pytestmark = [harness.needs_nemo_rl, pytest.mark.ray]


def test_nemo_rl_single_controller_unit_tests_pass(tmp_path: Path) -> None:
    run = harness.run_unit_tests(harness.nemo_rl_src(), tmp_path)
    print(f"NeMo RL single-controller unit tests: {sum(harness.EXPECTED_PASSED.values())} in {run.wall_s:.0f} s")
    tail = run.output[-6000:]
    assert run.outcomes, f"pytest wrote no JUnit report (exit {run.returncode}):\n{tail}"
    assert run.outcomes == {m: Counter(passed=n) for m, n in harness.EXPECTED_PASSED.items()}, tail
    assert run.returncode == 0, tail


def test_an_extra_path_is_importable_beside_nemo_rl(tmp_path: Path) -> None:
    """What the harness puts on PYTHONPATH for the controller: the NeMo RL copy first, then extras."""
    copy = harness.writable_copy(harness.nemo_rl_src(), tmp_path / "nemo-rl")
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "extra_marker.py").write_text("WHERE = __file__\n")
    (extra / "nemo_rl").mkdir()  # a stray package of the same name must not shadow NeMo RL
    result = subprocess.run(
        [
            str(harness.controller_python()),
            "-c",
            "import extra_marker, nemo_rl; print(extra_marker.WHERE); print(nemo_rl.__file__)",
        ],
        env=harness.controller_env([copy, extra]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    marker, nemo_rl = result.stdout.split()
    assert Path(marker) == extra / "extra_marker.py"
    assert Path(nemo_rl) == copy / "nemo_rl" / "__init__.py"
