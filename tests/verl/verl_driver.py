"""Run in ``.venv-verl``: the seams probe on the real verl, then ``python -m partial_rollout_integrations.verl``
once per case, each in a fork of this process (verl imported once, ~10 s, instead of once per case).

Usage: verl_driver.py CASES.json WORKDIR    (prints one JSON line: the probe's outcome, each case's,
and our task runner's trainer-class swap on verl's real registry)

A case is ``{"name": ..., "argv": [hydra overrides]}``. Each child runs the entry point as ``-m``
does (:func:`runpy.run_module` with ``alter_sys``), its stdout and stderr in files, in a folder of
its own (Hydra writes ``outputs/`` there), with verl's ``run_ppo`` replaced by a recorder: what
would start Ray and the training workers instead writes down which task runner it was given and
the config's block, so a case that passes set-up exits 0 having started nothing.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import seam_names  # on PYTHONPATH: tests/ (verl_harness.verl_env)

REPO = Path(__file__).resolve().parents[2]


def probe() -> dict[str, Any]:
    """The seams probe on this verl, and the methods of ours that override a verl method it lacks."""
    from partial_rollout.errors import ConfigError
    from partial_rollout_integrations.verl import seams

    start = time.monotonic()
    try:
        seams.check_seams()
        error = None
    except ConfigError as e:
        error = str(e)
    probe_s = time.monotonic() - start
    # gpu.py derives from verl's vLLM server classes, whose module imports vLLM (absent in .venv-verl):
    # test_verl_gpu_path checks its overrides against verl's source instead.
    files = [f for f in (REPO / "integrations" / "verl").rglob("*.py") if f.name != "gpu.py"]
    _, overrides = seam_names.scan_files(files, seams.ROOTS, REPO)
    overriding = seam_names.overriding(overrides)
    return {
        "version": seams.installed_version(),
        "error": error,
        "probe_s": round(probe_s, 2),
        "overrides": [f"{u.where}: {'.'.join(u.chain[1:])}" for u in overriding],
        "overrides_unprobed": seam_names.uncovered(overriding, seams.SEAMS),
    }


def in_fork(folder: Path, work: Callable[[], Any]) -> tuple[int, str, float]:
    """Run ``work`` in a fork of this process inside ``folder`` (its stdout and stderr in files there):
    its exit status (``SystemExit``'s code; 1 on another exception), its stderr and its wall time."""
    folder.mkdir(parents=True)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        for fd, name in ((1, "stdout"), (2, "stderr")):
            os.dup2(os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        code: Any = 0
        try:
            work()
        except SystemExit as e:
            code = e.code
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), (folder / "stderr").read_text(), time.monotonic() - start


def entry_point(argv: list[str]) -> None:
    """``python -m partial_rollout_integrations.verl ARGV`` with verl's ``run_ppo`` recorded, not run."""
    from omegaconf import OmegaConf
    from verl.trainer import main_ppo

    def record(config: Any, task_runner_class: Any) -> None:
        v1 = config.trainer.v1
        block = v1.get("partial_rollout_checkpoint")
        Path("run_ppo.json").write_text(
            json.dumps(
                {
                    "task_runner": task_runner_class.__ray_metadata__.class_name,
                    "block": OmegaConf.to_container(block) if block is not None else None,
                    "trainer_mode": v1.trainer_mode,
                }
            )
        )

    main_ppo.run_ppo = record
    sys.argv = ["partial_rollout_integrations.verl", *argv]
    runpy.run_module("partial_rollout_integrations.verl", run_name="__main__", alter_sys=True)


def run_case(case: dict[str, Any], workdir: Path) -> dict[str, Any]:
    folder = workdir / case["name"]
    rc, stderr, wall_s = in_fork(folder, lambda: entry_point(case["argv"]))
    recorded = folder / "run_ppo.json"
    return {
        "name": case["name"],
        "rc": rc,
        "ours": [line for line in stderr.splitlines() if line.startswith("partial-rollout:")],
        "stderr_tail": stderr[-3000:],
        "run_ppo": json.loads(recorded.read_text()) if recorded.is_file() else None,
        "wall_s": round(wall_s, 2),
    }


def runner_swap() -> None:
    """Our task runner's ``run`` on verl's real trainer registry, verl's own ``run`` replaced by a
    recorder of the trainer class it would build, and a stand-in for the lead's trainer module."""
    import types

    from omegaconf import OmegaConf
    from verl.trainer.main_ppo import TaskRunnerV1
    from verl.trainer.ppo.v1 import trainer_base

    from partial_rollout_integrations.seams import unwrap

    ours = types.ModuleType("partial_rollout_integrations.verl.trainer")
    ours.trainer_class = lambda mode: type(f"Ours_{mode}", (trainer_base.get_trainer_cls(mode),), {})  # type: ignore[attr-defined]
    sys.modules[ours.__name__] = ours
    seen = {}

    def verl_run(self: Any, config: Any) -> None:
        seen["during"] = trainer_base.get_trainer_cls(config.trainer.v1.trainer_mode).__name__

    unwrap(TaskRunnerV1).run = verl_run  # type: ignore[attr-defined]
    from partial_rollout_integrations.verl.runner import PartialRolloutTaskRunner

    runner = PartialRolloutTaskRunner.__ray_metadata__.modified_class()
    runner.run(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "separate_async"}}}))
    seen["after"] = trainer_base.get_trainer_cls("separate_async").__name__
    Path("seen.json").write_text(json.dumps(seen))


def main() -> None:
    cases = json.loads(Path(sys.argv[1]).read_text())
    workdir = Path(sys.argv[2])
    start = time.monotonic()
    import hydra  # noqa: F401  imported once here, for every child
    import verl.trainer.main_ppo  # noqa: F401

    import_s = time.monotonic() - start
    report = {"probe": probe(), "import_s": round(import_s, 2)}
    report["cases"] = {case["name"]: run_case(case, workdir) for case in cases}
    rc, stderr, _ = in_fork(workdir / "runner_swap", runner_swap)
    seen = workdir / "runner_swap" / "seen.json"
    report["runner_swap"] = {
        "rc": rc,
        "stderr_tail": stderr[-3000:],
        "seen": json.loads(seen.read_text()) if rc == 0 else None,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
