"""The NeMo RL classes, methods and attributes partial rollouts use, checked at set-up.

Private methods of NeMo RL's SingleController change often upstream, so the integration names the
commit it was tested on and, before a run starts, looks up every name it calls, overrides or reads.
A NeMo RL without one of them fails at set-up in one line naming what is missing and the tested
commit (upstream's own rule: unsupported configurations fail at set-up), never at the first
checkpoint. ``tests/nemo_rl`` keeps these lists complete: a NeMo RL name used in
``integrations/nemo_rl/`` that is not probed here fails them.
"""

from __future__ import annotations

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.seams import Seam, check

TESTED_COMMITS = ("7ea279abfbeb698b092856d0dab61e7cf39bc909",)
"""NeMo RL commits the integration's tests ran against (main, 2026-08-22)."""

ROOTS = ("nemo_rl",)
"""The top-level package whose names :data:`SEAMS`, :data:`GPU_SEAMS` and :data:`VLLM_SEAMS` list."""

_CONTROLLER = "nemo_rl.algorithms.single_controller"
_ROLLOUT = "nemo_rl.experience.rollout_manager"
_BUFFER = "nemo_rl.algorithms.async_utils.replay_buffer"
_INTERFACES = "nemo_rl.experience.interfaces"
_WORKER = "nemo_rl.models.generation.vllm.vllm_worker_async"

SEAMS: tuple[Seam, ...] = (
    # The entry point (__main__): NeMo RL's config loading and its controller's arguments.
    Seam(
        "nemo_rl.utils.config",
        None,
        ("load_config", "merge_with_override", "parse_hydra_overrides", "register_omegaconf_resolvers"),
    ),
    Seam("nemo_rl.algorithms.single_controller_utils", None, ("MasterConfig",)),
    Seam("nemo_rl.algorithms.metric_utils", None, ("SetupTimingMetrics",)),
    # The controller (controller.py): its save, restore, pumps and weight sync own the in-flight work.
    Seam(
        _CONTROLLER,
        "SingleControllerActor",
        (
            "__init__",
            "_save_checkpoint",
            "_maybe_restore_replay_buffer",
            "_sync_weights",
            "run",
            "_dataloader",
            "_buffer",
            "_rollout_manager",
            "_checkpointer",
            "_trainer_version",
            "_gen",
            "_inflight_by_group_id",
            "_last_checkpoint_path",
            "_logger",
            "_sampler",
            "_train_steps",
        ),
        # The prompts a restore hands back enter through NeMo RL's own pump (permits, staleness).
        relied_on=("_rollout_pump",),
    ),
    # What the hooks (hooks.py) derive from or read: the rollout, its records, the environment's
    # return, the replay buffer and the checkpoint manager.
    # generate_and_push reserves a buffer slot, calls the run_rollout we wrap and commits the group.
    Seam(_ROLLOUT, "RolloutManager", ("run_rollout", "_impl"), relied_on=("generate_and_push",)),
    Seam(_ROLLOUT, "AsyncRolloutImpl", ("run_rollout", "_run_single_rollout", "_task_to_env")),
    Seam(_INTERFACES, "PromptGroupRecord", ("completions",)),
    Seam(_INTERFACES, "Completion", ("reward",)),
    Seam(
        "nemo_rl.environments.interfaces",
        "EnvironmentReturn",
        ("observations", "metadata", "next_stop_strings", "rewards", "terminateds", "answers"),
    ),
    # reserve and commit fill the _group_ids and ready_list our remove reads.
    Seam(
        _BUFFER,
        "TQReplayBuffer",
        ("remove", "state_dict", "_group_ids", "ready_list"),
        relied_on=("reserve", "commit"),
    ),
    # init_tmp_checkpoint makes the tmp_step_N folder our snapshot is written into before the rename.
    Seam(
        "nemo_rl.utils.checkpoint",
        "CheckpointManager",
        ("begin_finalization",),
        relied_on=("init_tmp_checkpoint",),
    ),
    Seam("nemo_rl.distributed.batched_data_dict", None, ("BatchedDataDict",)),
    # The CPU harness (cpu.py): NeMo RL's own loss, advantages, collation and set-up pieces.
    Seam("nemo_rl.algorithms.grpo", None, ("_create_advantage_estimator", "_get_grpo_save_state")),
    Seam("nemo_rl.algorithms.loss", None, ("ClippedPGLossFn",)),
    Seam(
        "nemo_rl.algorithms.single_controller_utils.setup",
        None,
        ("SingleControllerActorArgs", "_build_retry_policy"),
    ),
    Seam("nemo_rl.data.collate_fn", None, ("rl_collate_fn",)),
    Seam("nemo_rl.data.utils", None, ("load_dataloader_state",)),
    Seam("nemo_rl.data_plane.adapters.noop", None, ("NoOpDataPlaneClient",)),
)
"""Every NeMo RL name the controller path uses, checked by :func:`check_seams` before a run."""

GPU_SEAMS: tuple[Seam, ...] = (
    Seam(
        _WORKER,
        "VllmAsyncGenerationWorkerImpl",
        (
            "_create_engine",
            "post_init_async",
            "update_weights_from_collective_async",
            "update_weights_via_ipc_zmq_async",
            "nccl_reshard_refit_async",
            "llm",
            "cfg",
            "model_name",
            "tensor_parallel_size",
        ),
    ),
    Seam("nemo_rl.models.generation.vllm.vllm_generation", None, ("resolve_generation_worker_cls",)),
    Seam("nemo_rl.models.generation", None, ("configure_generation_config",)),
    Seam("nemo_rl.distributed.ray_actor_environment_registry", None, ("ACTOR_ENVIRONMENT_REGISTRY",)),
    Seam("nemo_rl.distributed.worker_group_utils", None, ("get_nsight_config_if_pattern_matches",)),
    Seam("nemo_rl.distributed.virtual_cluster", None, ("init_ray",)),
    Seam("nemo_rl.algorithms.single_controller_utils", None, ("setup_single_controller",)),
    Seam("nemo_rl.algorithms.utils", None, ("get_tokenizer",)),
)
"""Every NeMo RL name the GPU worker path (gpu.py) uses. It imports NeMo RL's vLLM worker modules,
so it is checked where that path is set up (:func:`check_gpu_seams`), not on the controller path."""

VLLM_SEAMS: tuple[Seam, ...] = (Seam("nemo_rl.models.generation.vllm.vllm_backend", "VllmInternalWorkerExtension"),)
"""NeMo RL's worker extension, which imports vLLM: checked where the GPU worker builds its extension
(``gpu.WorkerExtension``), in the environment that has vLLM (:func:`check_vllm_seams`)."""


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"this NeMo RL has no {what}",
        field="checkpointing.partial_rollouts.enabled",
        fix=f"Use a NeMo RL commit partial rollouts were tested on ({', '.join(c[:9] for c in TESTED_COMMITS)}) "
        "or turn the flag off",
    )


def check_seams() -> None:
    """Raise :class:`ConfigError` naming the first name of :data:`SEAMS` this NeMo RL lacks."""
    check(SEAMS, _fail)


def check_gpu_seams() -> None:
    """Raise :class:`ConfigError` naming the first name of :data:`GPU_SEAMS` this NeMo RL lacks."""
    check(GPU_SEAMS, _fail)


def check_vllm_seams() -> None:
    """Raise :class:`ConfigError` naming the first name of :data:`VLLM_SEAMS` this NeMo RL lacks."""
    check(VLLM_SEAMS, _fail)
