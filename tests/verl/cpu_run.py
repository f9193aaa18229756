"""One verl V1 async run on the CPU harness, in verl's environment; a test starts, kills and resumes it.

Usage: ``.venv-verl/bin/python tests/verl/cpu_run.py RUN_DIR [hydra overrides...]``

It composes verl 0.9.1's own ``ppo_trainer`` config (with our block, :mod:`partial_rollout_integrations.verl`)
with the overrides a tiny CPU run needs (and those given), starts a local Ray cluster and runs
verl's ``TaskRunnerV1`` flow in this process: ``tq.init``, the trainer's ``init``, the agent-loop
manager, ``fit``. With ``trainer.v1.partial_rollout_checkpoint.enable=true`` the trainer and the
agent-loop manager are ours (:func:`partial_rollout_integrations.verl.trainer.trainer_class`); off,
verl's own. Either way :class:`~partial_rollout_integrations.verl.cpu.CpuHarness` stands in for the
GPU-only parts. ``trainer.resume_mode=auto`` (verl's default) resumes from ``RUN_DIR/checkpoints``
when a checkpoint is there. ``PARTIAL_ROLLOUT_EXIT_AFTER_SAVE=N`` kills the run (``os._exit(137)``)
right after the first checkpoint from step N on that committed with work to lose: with the flag on,
one whose snapshot holds a sample in flight with tokens (whether a step's cut catches one depends on
how fast the engine ran against the trainer, which differs from machine to machine); off, step N's.
It prints ``{"killed_after_save": step}`` first. After verl's re-issue of the prompts in flight at a
resume it prints ``{"reissued_at": step, "prompt_steps": {uid: step}}``: the dispatch step each prompt
in the TransferQueue is tagged with, which verl's sampler reads for staleness and order.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def compose(run_dir: Path, overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from partial_rollout_integrations.verl import cpu
    from partial_rollout_integrations.verl.__main__ import CONFIG_DIR, CONFIG_NAME

    engine_python = os.environ.get("PARTIAL_ROLLOUT_ENGINE_PYTHON", str(cpu.DEFAULT_ENGINE_PYTHON))
    model = cpu.verl_model(engine_python, REPO / ".cache")
    data = cpu.write_prompts(run_dir / "prompts.parquet", model, num_prompts=24, prompt_tokens=12, seed=0)
    base = [
        f"data.train_files={data}",
        f"data.val_files={data}",
        "data.train_batch_size=2",
        "data.max_prompt_length=64",
        "data.max_response_length=400",
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
        f"reward.custom_reward_function.path={REPO / 'integrations' / 'verl' / 'cpu_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "reward.num_workers=1",  # one reward worker, for the reason given at agent.num_workers above
        "trainer.use_v1=true",
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=2",
        "trainer.total_training_steps=6",
        "trainer.save_freq=1",  # a checkpoint every step: the kills find one holding samples in flight
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.logger=[console]",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        f"trainer.default_local_dir={run_dir / 'checkpoints'}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        config = compose(config_name=CONFIG_NAME, overrides=base + overrides)
    OmegaConf.set_struct(config, False)
    config.partial_rollout_cpu = {
        "engine_python": engine_python,
        "weight_noise": 0.02,
        "engine": {"dtype": "float32", "max_model_len": 512, "max_num_seqs": 2, "multiprocessing": False},
    }
    return config


def _holds_tokens_in_flight(config: Any, step: int) -> bool:
    from partial_rollout.snapshot import SampleState, load_snapshot

    snapshot = load_snapshot(Path(config.trainer.default_local_dir) / f"global_step_{step}")
    return any(s.state is SampleState.IN_FLIGHT and s.num_tokens for g in snapshot.groups for s in g.samples)


def main() -> None:
    run_dir = Path(sys.argv[1]).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    config = compose(run_dir, sys.argv[2:])

    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ, get_trainer_cls

    from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError
    from partial_rollout_integrations.verl import cpu

    enabled = bool(OmegaConf.select(config, "trainer.v1.partial_rollout_checkpoint.enable", default=False))
    if enabled:
        from partial_rollout_integrations.verl.client import DurableAgentLoopManager
        from partial_rollout_integrations.verl.trainer import trainer_class

        base, manager_cls = trainer_class(config.trainer.v1.trainer_mode), DurableAgentLoopManager
    else:
        base, manager_cls = get_trainer_cls(config.trainer.v1.trainer_mode), AgentLoopManagerTQ
    exit_after = int(os.environ.get("PARTIAL_ROLLOUT_EXIT_AFTER_SAVE", "0"))

    def save_then_maybe_die(self: Any) -> None:
        base._save_checkpoint(self)
        step = self.global_steps
        if exit_after and step >= exit_after and (not enabled or _holds_tokens_in_flight(config, step)):
            print(json.dumps({"killed_after_save": step}), flush=True)  # killed right after it committed
            os._exit(137)

    def reissue_and_report(self: Any, partition_id: str = "train") -> int:
        reissued = base._reissue_inflight_prompts(self, partition_id)
        listed = (tq.kv_list(partition_id) or {}).get(partition_id, {})
        steps = {key: tag.get("global_steps") for key, tag in listed.items() if tag.get("is_prompt", False)}
        print(json.dumps({"reissued_at": self.global_steps, "prompt_steps": steps}), flush=True)  # as verl left them
        return reissued

    methods = {"_save_checkpoint": save_then_maybe_die, "_reissue_inflight_prompts": reissue_and_report}
    trainer_cls = type(f"Cpu{base.__name__}", (cpu.CpuHarness, base), methods)

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=True)
    config.transfer_queue.enable = True
    OmegaConf.resolve(config)
    tq.init(config.transfer_queue)
    try:
        trainer = trainer_cls(config=config)
        try:
            trainer.init()  # loads the checkpoint: a snapshot that does not fit the run is refused here
        except BadInputError as e:
            print(f"partial-rollout: {e}", file=sys.stderr)  # as the entry point reports it
            sys.exit(EXIT_BAD_INPUT)
        manager = manager_cls.create(
            config=config,
            llm_client=trainer.get_llm_client(),
            teacher_client=None,
            reward_loop_worker_handles=trainer.get_reward_handles(),
        )
        trainer.fit(manager)
        print(json.dumps({"finished": True, "global_steps": trainer.global_steps}), flush=True)
    finally:
        tq.close()
        ray.shutdown()


if __name__ == "__main__":
    main()
