"""The verl classes, methods and attributes partial rollouts use, checked at set-up.

verl's V1 trainer is young and its private methods move between releases, so the integration names
the verl versions it was tested on and, before a run starts, looks up every name it calls,
overrides or reads. A verl without one of them fails at set-up in one line naming what is missing,
the tested version and the fix, never at the first checkpoint. ``tests/verl`` keeps this list
complete: a verl name used in ``integrations/verl/`` that is not probed here fails them.
"""

from __future__ import annotations

import importlib.metadata

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.seams import Seam, check
from partial_rollout_integrations.verl.config import BLOCK

TESTED_VERSIONS = ("0.9.1",)
"""verl releases the integration's tests ran against (the package index's wheel)."""

ROOTS = ("verl", "transfer_queue")
"""The top-level packages whose names :data:`SEAMS` lists (TransferQueue is verl's replay store)."""


_TRAINER = "verl.trainer.ppo.v1.trainer_base"
_AGENT_LOOP = "verl.trainer.ppo.v1.agent_loop_tq"
_LLM_SERVER = "verl.workers.rollout.llm_server"
_REPLICA = "verl.workers.rollout.replica"
VLLM_SERVER = "verl.workers.rollout.vllm_rollout.vllm_async_server"
"""verl's vLLM server module (the GPU path, :mod:`.gpu`)."""

SEAMS: tuple[Seam, ...] = (
    # The entry point (__main__, runner): verl's main_ppo, mirrored.
    Seam("verl.trainer.main_ppo", None, ("main", "run_ppo", "TaskRunnerV1")),
    Seam("verl.trainer.main_ppo", "TaskRunnerV1", ("run",)),
    Seam("verl.utils.config", None, ("validate_config",)),
    Seam("verl.trainer.ppo.utils", None, ("need_critic", "need_reference_policy")),
    Seam("verl.utils.device", None, ("auto_set_device",)),
    # The checkpoint verl will resume from, found at set-up as its _load_checkpoint finds it.
    Seam("verl.utils.checkpoint.checkpoint_manager", None, ("find_latest_ckpt_path",)),
    # The trainer: save, load and re-issue own the in-flight work.
    Seam(_TRAINER, None, ("get_trainer_cls", "TRAINER_REGISTRY")),
    Seam(
        _TRAINER,
        "PPOTrainer",
        (
            "_save_checkpoint",
            "_load_checkpoint",
            "on_init_end",
            "_reissue_inflight_prompts",
            "_setup",
            "fit",
            "get_llm_client",
            "_rollout_server_managers",
            "llm_server_manager",
            "agent_loop_manager",
            "global_steps",
            "config",
            # The CPU harness's _setup builds what verl's builds, from verl's own steps and these.
            "_init_tokenizer",
            "_init_dataloader",
            "_init_dump_executor",
            "actor_rollout_wg",
            "checkpoint_manager",
            "reward_loop_manager",
            "resource_pool_manager",
        ),
    ),
    Seam("verl.trainer.ppo.v1.trainer_colocate_async", "PPOTrainerColocateAsync", bases=("PPOTrainer",)),
    Seam(
        "verl.trainer.ppo.v1.trainer_separate_async",
        "PPOTrainerSeparateAsync",
        ("standalone_server_manager", "standalone_checkpoint_manager", "_enable_hybrid_replicas"),
        bases=("PPOTrainer",),
    ),
    # The mode the CPU harness sets once its standalone servers run, as verl's _setup does.
    Seam("verl.trainer.ppo.v1.trainer_separate_async", "HybridEngineMode", ("TRAINER",)),
    Seam("verl.utils.tensordict_utils", None, ("assign_non_tensor_data",)),
    # The agent loops: where a trajectory's stable identity (TQ uid, session, turn) is known.
    Seam(
        _AGENT_LOOP,
        "AgentLoopWorkerTQ",
        ("__init__", "_run_agent_loop", "generate_sequences", "llm_client"),
        # Our _run_agent_loop is reached through _run_prompt, and what it returns for a sample the
        # snapshot holds finished (no engine work) is what _agent_loop_postprocess takes.
        relied_on=("_run_prompt", "_agent_loop_postprocess"),
    ),
    Seam(
        _AGENT_LOOP,
        "AgentLoopManagerTQ",
        ("__init__", "create", "generate_sequences", "agent_loop_workers_class", "agent_loop_workers"),
    ),
    # The async client: every attempt of a sample goes through its generate.
    Seam(_LLM_SERVER, "LLMServerClient", ("generate",)),
    Seam(_LLM_SERVER, "FullyAsyncLLMServerClient", ("__init__", "generate"), bases=("LLMServerClient",)),
    Seam(
        _LLM_SERVER,
        "LLMServerManager",
        ("create", "get_client", "get_replicas", "server_handles", "rollout_replica_class"),
    ),
    # The LLM servers behind verl's router, and what they return.
    Seam(_REPLICA, "RolloutReplicaRegistry", ("register",)),
    Seam(
        _REPLICA,
        "RolloutReplica",
        (
            "init_standalone",
            "init_hybrid",
            "launch_servers",
            "servers",
            "_server_handle",
            "_server_address",
            "config",
            "replica_rank",
            "max_concurrency",
        ),
    ),
    Seam(_REPLICA, "TokenOutput", ("token_ids", "log_probs", "stop_reason", "extra_fields")),
    # Weight syncs abort every request; the cut must see them drained.
    Seam(
        "verl.checkpoint_engine",
        "CheckpointEngineManager",
        ("update_weights", "abort_replicas", "sleep_replicas", "resume_generation_replicas"),
    ),
    # The CPU harness: verl's reward loop as is, and what verl's trainer calls on a worker group.
    Seam("verl.experimental.reward_loop", None, ("RewardLoopManager",)),
    Seam("verl.single_controller.base.worker_group", "WorkerGroup", ("_dispatch_info",)),
    Seam("verl.single_controller.base.worker", "Worker", ("_query_dispatch_info",)),
    # TransferQueue: verl's replay state, saved beside our snapshot.
    Seam(
        "transfer_queue",
        None,
        # init and close: the CPU run (demo) starts TransferQueue as verl's TaskRunnerV1 does.
        ("save_checkpoint", "load_checkpoint", "kv_list", "kv_batch_get", "kv_batch_put", "init", "close"),
    ),
)
"""Every verl (and TransferQueue) name the integration uses, checked by :func:`check_seams`."""

GPU_SEAMS: tuple[Seam, ...] = (
    Seam(
        VLLM_SERVER,
        "vLLMHttpServer",
        (
            "run_server",
            "generate",
            "abort_all_requests",
            "open_submission_gate",
            "set_global_steps",
            "wake_up",
            "resume_kv_cache",
            "clear_kv_cache",
            "_get_worker_extension_cls",
            "lora_as_adapter",
            "engine",
            "config",
            "model_config",
            "node_rank",
            "global_steps",
        ),
    ),
    Seam(VLLM_SERVER, "vLLMReplica", ("__init__", "server_class", "is_reward_model", "is_teacher_model")),
    Seam("verl.workers.rollout.vllm_rollout.utils", "vLLMColocateWorkerExtension"),
)
"""Every verl name the GPU path uses beyond :data:`SEAMS` (it imports verl's vLLM server
module, which needs vLLM: checked where the path is installed, :func:`check_gpu_seams`)."""


def installed_version() -> str:
    """verl's installed version, or ``"not installed"``."""
    try:
        return importlib.metadata.version("verl")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"this verl ({installed_version()}) has no {what}",
        field=f"{BLOCK}.enable",
        fix=f"Use a verl release partial rollouts were tested on ({', '.join(TESTED_VERSIONS)}) or turn the flag off",
    )


def check_seams() -> None:
    """Raise :class:`ConfigError` naming the first verl name the integration uses that this verl lacks."""
    check(SEAMS, _fail)


def check_gpu_seams() -> None:
    """Raise :class:`ConfigError` naming the first name of :data:`GPU_SEAMS` this verl lacks."""
    check(GPU_SEAMS, _fail)
