"""``python -m partial_rollout_integrations.verl`` on verl 0.9.1's real wheel and Hydra config, in ``.venv-verl``.

One driver process (:mod:`verl_driver`) runs the seams probe on the real verl, then the entry point
once per case, each in a fork with verl's ``run_ppo`` recorded instead of run; beside it one cold
``python -m`` subprocess, nothing stubbed, checks a refusal end to end. Each refusal: one line,
exit status 3, before anything starts.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import verl_harness as harness

from partial_rollout.errors import EXIT_BAD_INPUT
from partial_rollout_integrations.verl.config import BLOCK, PartialRolloutCheckpointConfig

pytestmark = harness.needs_verl

ON = f"{BLOCK}.enable=true"
SUPPORTED = ["trainer.v1.trainer_mode=colocate_async", "actor_rollout_ref.rollout.name=vllm"]
VALID = [
    "algorithm.adv_estimator=grpo",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
    "trainer.n_gpus_per_node=1",
]
"""What verl's own ``validate_config`` needs beyond its defaults to pass on one device."""

REFUSED = {
    "legacy_trainer": ([ON, *SUPPORTED, "trainer.use_v1=false"], "trainer.use_v1: false"),
    "sync_mode": ([ON, "actor_rollout_ref.rollout.name=vllm"], "trainer.v1.trainer_mode: sync"),
    "separate_mode_hybrid": (
        [ON, "trainer.v1.trainer_mode=separate_async", "actor_rollout_ref.rollout.name=vllm", *VALID],
        "actor_rollout_ref.hybrid_engine: true",
    ),
    "sglang": ([ON, SUPPORTED[0], "actor_rollout_ref.rollout.name=sglang"], "actor_rollout_ref.rollout.name: sglang"),
    "tool_agent": (
        [ON, *SUPPORTED, "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
        "actor_rollout_ref.rollout.agent.default_agent_loop: tool_agent",
    ),
    "multi_turn": (
        [ON, *SUPPORTED, "actor_rollout_ref.rollout.multi_turn.enable=true"],
        "actor_rollout_ref.rollout.multi_turn.enable: true",
    ),
    "async_save": (
        [ON, *SUPPORTED, "actor_rollout_ref.actor.checkpoint.async_save=true"],
        "actor_rollout_ref.actor.checkpoint.async_save: true",
    ),
    "manager_class": (
        [ON, *SUPPORTED, "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=my.Manager"],
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class: my.Manager",
    ),
    "unknown_key": ([*SUPPORTED, f"+{BLOCK}.enabel=true"], f"{BLOCK}.enabel: unknown key 'enabel'"),
    "bad_on_stale": ([ON, *SUPPORTED, f"{BLOCK}.on_stale=later"], f"{BLOCK}.on_stale: must be one of"),
}
"""Case name: the overrides, and how our one line starts after ``partial-rollout: ``."""

PASSING = {
    "on": [ON, *SUPPORTED, *VALID],
    "on_separate": [
        ON,
        "trainer.v1.trainer_mode=separate_async",
        SUPPORTED[1],
        "actor_rollout_ref.hybrid_engine=false",
        *VALID,
    ],
    "off_unsupported_settings": ["actor_rollout_ref.rollout.name=sglang", "trainer.use_v1=true", *VALID],
    "misspelled_without_plus": [f"{BLOCK}.enabel=true"],
}


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The driver's report, and the cold ``python -m`` run it ran beside."""
    workdir = tmp_path_factory.mktemp("verl")
    cases = [{"name": name, "argv": argv} for name, (argv, _) in REFUSED.items()]
    cases += [{"name": name, "argv": argv} for name, argv in PASSING.items()]
    (workdir / "cases.json").write_text(json.dumps(cases))
    (workdir / "cold").mkdir()
    start = time.monotonic()
    cold = subprocess.Popen(
        [str(harness.VERL_PYTHON), "-m", "partial_rollout_integrations.verl", *REFUSED["legacy_trainer"][0]],
        cwd=workdir / "cold",
        env=harness.verl_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    result = subprocess.run(
        [
            str(harness.VERL_PYTHON),
            str(Path(__file__).with_name("verl_driver.py")),
            str(workdir / "cases.json"),
            str(workdir / "cases"),
        ],
        env=harness.verl_env(),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    _, cold_err = cold.communicate(timeout=240)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.splitlines()[-1])
    report["cold"] = {"rc": cold.returncode, "stderr": cold_err, "wall_s": round(time.monotonic() - start, 1)}
    walls = {name: case["wall_s"] for name, case in report["cases"].items()}
    print(
        json.dumps(
            {
                "import_s": report["import_s"],
                "probe_s": report["probe"]["probe_s"],
                "cold_s": report["cold"]["wall_s"],
                "cases_s": walls,
            }
        )
    )
    return report


def test_the_seams_probe_passes_on_the_real_verl(driver: dict[str, Any]) -> None:
    probe = driver["probe"]
    assert probe["version"] == "0.9.1" and probe["error"] is None
    assert any(
        o.startswith("integrations/verl/runner.py:") and o.endswith("TaskRunnerV1.run") for o in probe["overrides"]
    )
    assert probe["overrides_unprobed"] == [], "methods of ours that override a verl method the probe lacks"


@pytest.mark.parametrize("name", REFUSED)
def test_an_unsupported_setting_is_refused_in_one_line_at_set_up(driver: dict[str, Any], name: str) -> None:
    case = driver["cases"][name]
    assert case["rc"] == EXIT_BAD_INPUT, case["stderr_tail"]
    assert len(case["ours"]) == 1, case["stderr_tail"]
    assert case["ours"][0].startswith(f"partial-rollout: {REFUSED[name][1]}"), case["ours"]
    assert case["run_ppo"] is None


def test_a_cold_python_m_refuses_the_legacy_trainer(driver: dict[str, Any]) -> None:
    cold = driver["cold"]
    assert cold["rc"] == EXIT_BAD_INPUT, cold["stderr"][-3000:]
    lines = [line for line in cold["stderr"].splitlines() if line.startswith("partial-rollout:")]
    assert lines == [driver["cases"]["legacy_trainer"]["ours"][0]]


def test_a_misspelled_key_without_plus_is_refused_by_hydra(driver: dict[str, Any]) -> None:
    case = driver["cases"]["misspelled_without_plus"]
    assert case["rc"] != 0 and case["run_ppo"] is None
    assert f"Could not override '{BLOCK}.enabel'" in case["stderr_tail"]


@pytest.mark.parametrize(("name", "mode"), [("on", "colocate_async"), ("on_separate", "separate_async")])
def test_with_the_flag_on_our_task_runner_gets_the_block(driver: dict[str, Any], name: str, mode: str) -> None:
    case = driver["cases"][name]
    assert case["rc"] == 0, case["stderr_tail"]
    want = dataclasses.asdict(PartialRolloutCheckpointConfig(enable=True))
    assert case["run_ppo"] == {"task_runner": "PartialRolloutTaskRunner", "block": want, "trainer_mode": mode}


def test_with_the_flag_off_verl_runs_as_it_is(driver: dict[str, Any]) -> None:
    """Unsupported settings pass untouched to verl's own TaskRunnerV1, and verl never sees our block."""
    case = driver["cases"]["off_unsupported_settings"]
    assert case["rc"] == 0, case["stderr_tail"]
    assert case["ours"] == []
    assert case["run_ppo"] == {"task_runner": "TaskRunnerV1", "block": None, "trainer_mode": "sync"}


def test_our_task_runner_trains_our_trainer_class_and_leaves_the_registry_as_it_was(driver: dict[str, Any]) -> None:
    swap = driver["runner_swap"]
    assert swap["rc"] == 0, swap["stderr_tail"]
    assert swap["seen"] == {"during": "Ours_separate_async", "after": "PPOTrainerSeparateAsync"}
