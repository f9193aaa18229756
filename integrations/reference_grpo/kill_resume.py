"""The reference trainer under the kill-and-resume harness (:mod:`partial_rollout_integrations.kill_resume`).

Its command lines (a first run, then ``--resume`` from the latest complete checkpoint) and its kill
plans: the first save holding work from a random step, and a random number of events after it.
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from partial_rollout.ledger import EVENTS_FILENAME
from partial_rollout_integrations.kill_resume import KillPlan, KillResumeRun
from partial_rollout_integrations.kill_resume import kill_and_resume as run_killed_and_resumed


def trainer_command(config: str | os.PathLike[str], overrides: Sequence[str], *, resume: bool) -> list[str]:
    return [
        sys.executable,
        "-m",
        "partial_rollout_integrations.reference_grpo",
        str(config),
        *overrides,
        "--no-progress",
        *(["--resume"] if resume else []),
    ]


def draw_plan(
    rng: random.Random, *, save_period: int, max_num_steps: int, holding: str, max_events: int = 40
) -> KillPlan:
    """The first save holding work (``holding`` > 0) from a random step, among those that leave at
    least two save periods of training, and a random number of events after it.

    A save with nothing of that kind in flight would prove nothing, and whether the drawn step's
    save holds any depends on the machine's speed: one CI run's step-8 save held no prefix. So the
    drawn step leaves at least two saves to choose from. A resume late in the run could end before
    its restored groups finish (newer, shorter groups fill the last steps), continuing nothing.
    """
    last = max_num_steps - 2 * save_period  # the last save a kill may follow
    saves = list(range(save_period, last, save_period)) or [save_period]
    return KillPlan(
        from_step=rng.choice(saves),
        before_step=max(last + 1, save_period + 1),
        holding=holding,
        after_events=rng.randint(0, max_events),
    )


def kill_and_resume(
    config: str | os.PathLike[str],
    overrides: Sequence[str],
    *,
    log_dir: Path,
    plans: Sequence[KillPlan],
    on_step: Callable[[int], None] | None = None,
    timeout_s: float | None = None,
) -> KillResumeRun:
    """Train from scratch with its logs in ``log_dir``, kill and resume per ``plans``, resume to the end."""
    return run_killed_and_resumed(
        trainer_command(config, overrides, resume=False),
        resume_command=trainer_command(config, overrides, resume=True),
        events=log_dir / EVENTS_FILENAME,
        log=log_dir / "trainer.log",
        plans=plans,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"},
        on_step=on_step,
        timeout_s=timeout_s,
    )
