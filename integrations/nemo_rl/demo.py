"""The kill-and-resume demo on NeMo RL's real SingleController, partial rollouts on and off.

Each side runs the CPU config (:mod:`.cpu`) through this package's launcher in the NeMo RL
environment, SIGKILLs the whole run after a checkpoint that holds unfinished work, reruns it to
the end, and audits the work ledger's ``events.jsonl``. With the flag off the ledger only records
(``record_events``): NeMo RL runs unchanged, and the audit counts the prompts its checkpoint lost.
"""

from __future__ import annotations

import functools
import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partial_rollout.errors import ConfigError
from partial_rollout.ledger import audit
from partial_rollout_integrations.kill_resume import KillPlan, kill_and_resume, side_by_side

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).resolve().parent / "configs" / "grpo_tiny_cpu.yaml"
SIDES = {"on": True, "off": False}
"""The two runs: partial rollouts on, and off (recording only); each in ``<out>/partial_rollouts_<name>``."""


@dataclass(frozen=True)
class NemoEnvironment:
    """Where NeMo RL's source and the controller's interpreter are."""

    source: Path
    python: Path

    @classmethod
    def from_environ(cls) -> NemoEnvironment:
        source = os.environ.get("NEMO_RL_SRC")
        if not source or not (Path(source) / "nemo_rl").is_dir():
            raise ConfigError(
                f"NEMO_RL_SRC is {source!r}, not a NeMo RL checkout",
                field="NEMO_RL_SRC",
                fix="Point NEMO_RL_SRC at a NeMo RL checkout (the folder holding nemo_rl/)",
            )
        python = Path(os.environ.get("NEMO_RL_PYTHON", REPO / ".venv-nemo-rl" / "bin" / "python"))
        if not python.is_file():
            raise ConfigError(
                "no interpreter for NeMo RL's controller",
                path=python,
                field="NEMO_RL_PYTHON",
                fix="Run `bash scripts/setup_nemo_rl.sh` (it creates .venv-nemo-rl)",
            )
        return cls(source=Path(source).resolve(), python=python)

    def env(self) -> dict[str, str]:
        import partial_rollout

        library = Path(partial_rollout.__file__).resolve().parents[1]
        path = os.pathsep.join([str(library), str(self.source)])
        # RAY_ADDRESS=local: the run starts a Ray cluster of its own instead of joining one found on the machine.
        return {
            **os.environ,
            "NEMO_RL_SRC": str(self.source),
            "PYTHONPATH": path,
            "PYTHONUNBUFFERED": "1",
            "RAY_ADDRESS": "local",
        }


def run_side(
    nemo: NemoEnvironment,
    out: Path,
    *,
    enabled: bool,
    seed: int,
    timeout_s: float,
    overrides: Sequence[str] = (),
    kills: int = 1,
    launcher: Sequence[str] = ("-m", "partial_rollout_integrations.nemo_rl"),
) -> dict[str, Any]:
    """Train, kill, resume and audit one side; returns its audit report as JSON.

    ``overrides``: further Hydra overrides of the demo's config (e.g. a multi-turn run). ``kills``:
    how many runs are killed, each after the first save of its own that holds work (more than one:
    a job preempted again after its resume). ``launcher``: what the controller's interpreter runs,
    given ``--config`` and the overrides (by default this package's launcher).
    """
    out.mkdir(parents=True, exist_ok=True)
    events = out / "events.jsonl"
    command = [
        str(nemo.python),
        *launcher,
        "--config",
        str(CONFIG),
        f"++checkpointing.checkpoint_dir={out / 'checkpoints'}",
        f"++logger.log_dir={out / 'logs'}",
        f"++checkpointing.partial_rollouts.enabled={str(enabled).lower()}",
        "++checkpointing.partial_rollouts.record_events=true",
        f"++checkpointing.partial_rollouts.events_path={events}",
        *overrides,
    ]
    # a checkpoint that holds work: prefixes to continue (on), or the work NeMo RL's checkpoint leaves out (off)
    holding = "prefix_tokens" if enabled else "samples_unfinished"
    rng = random.Random(seed)
    plans = [KillPlan(after_events=rng.randint(0, 30), holding=holding) for _ in range(kills)]
    run = kill_and_resume(
        command, events=events, log=out / "nemo_rl.log", plans=plans, env=nemo.env(), cwd=out, timeout_s=timeout_s
    )
    report = audit(events).to_json()
    report["wall_s"] = round(run.wall_s, 1)
    report["attempts"] = [vars(a) for a in run.attempts]
    report["kill_after_events"] = [plan.after_events for plan in plans]
    (out / "audit.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def run_demo(out: Path, *, seed: int = 0, timeout_s: float = 1800.0) -> dict[str, dict[str, Any]]:
    """Both runs, side by side (each starts a Ray cluster of its own), under ``out``."""
    nemo = NemoEnvironment.from_environ()
    return side_by_side(
        {
            name: functools.partial(
                run_side, nemo, out / f"partial_rollouts_{name}", enabled=enabled, seed=seed, timeout_s=timeout_s
            )
            for name, enabled in SIDES.items()
        }
    )
