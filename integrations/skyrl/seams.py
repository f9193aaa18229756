"""The SkyRL classes, methods and attributes partial rollouts use, checked at set-up.

SkyRL moves fast (0.3.0 to 0.4.0 moved its vLLM pin from 0.23 to 0.30 and its Python floor), so the
integration names the SkyRL versions it was tested on and, before a run starts, looks up every name
it calls, overrides or reads. A SkyRL without one of them fails at set-up in one line naming what is
missing, the tested version and the fix, never at the first checkpoint. ``tests/skyrl`` keeps this
list complete: a SkyRL name used in ``integrations/skyrl/`` that is not probed here fails them.
"""

from __future__ import annotations

import importlib.metadata

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.seams import Seam, check

TESTED_VERSIONS = ("0.4.0",)
"""SkyRL releases the integration's tests ran against (the package index's wheel)."""

ROOTS = ("skyrl",)
"""The top-level package whose names :data:`SEAMS` lists."""

BLOCK = "trainer.fully_async.partial_rollout_checkpoint"
_FULLY_ASYNC = "skyrl.train.fully_async_trainer"
_MAIN = "skyrl.train.entrypoints.main_base"
_CLIENT = "skyrl.backends.skyrl_train.inference_servers.remote_inference_client"

SEAMS: tuple[Seam, ...] = (
    # The flag: SkyRL's typed config, subclassed.
    Seam("skyrl.train.config.config", None, ("BaseConfig", "FullyAsyncConfig", "TrainerConfig", "make_config")),
    Seam("skyrl.train.utils", None, ("validate_cfg",)),
    Seam("skyrl.train.utils.utils", None, ("initialize_ray", "prepare_runtime_environment")),
    # The experiment: its public hooks pick our generator and trainer.
    Seam(
        _MAIN,
        "BasePPOExp",
        (
            "__init__",
            "get_generator",
            "get_trainer",
            "run",
            "cfg",
            "tokenizer",
            "train_dataset",
            "eval_dataset",
            "colocate_pg",
            "trainer",
            "get_train_dataset",
            "get_inference_client",
            "get_tracker",
            "get_trajectory_logger",
            "_setup_trainer",  # the CPU harness's, without the FSDP worker imports
        ),
    ),
    Seam("skyrl.backends.skyrl_train.inference_servers.utils", None, ("resolve_policy_model_name",)),
    # The generator: notes the step each group is scheduled at.
    Seam("skyrl.train.generators.skyrl_gym_generator", "SkyRLGymGenerator", ("__init__", "generate")),
    # The trainer: its public save, load and batch hooks.
    Seam("skyrl.train.trainer", "RayPPOTrainer", ("save_checkpoints",)),
    Seam(
        _FULLY_ASYNC,
        "FullyAsyncRayPPOTrainer",
        (
            "__init__",
            "save_checkpoints",
            "load_checkpoints",
            "convert_generation_group_mini_batch_to_training_input",
            "async_train_dataloader",
            "generator",
            "cfg",
            "epoch",
            "global_step",
            # SkyRL's simulate_training seam, which the CPU harness (.cpu) takes: no models built,
            # training and the weight-sync dispatch replaced.
            "_run_training",
            "init_weight_sync_state",
            "dispatch",
            "inference_engine_client",
            "ref_model",
        ),
        bases=("RayPPOTrainer",),
    ),
    Seam(_FULLY_ASYNC, "_AsyncDataloader", ("get_consumed_uids_list", "get_filtered_uids_list")),
    Seam(_FULLY_ASYNC, "GeneratedOutputGroup", ("uid", "global_step_when_scheduled")),
)
"""Every SkyRL name the integration uses, checked by :func:`check_seams`."""

CPU_SEAMS: tuple[Seam, ...] = (
    Seam(_CLIENT, "RemoteInferenceClient", ("pause_generation", "resume_generation", "increment_weight_version")),
    Seam("skyrl.train.dataset", None, ("PromptDataset",)),
    Seam("skyrl.backends.skyrl_train.utils.ppo_utils", None, ("sync_registries",)),
)
"""What the CPU harness (:mod:`.cpu`) uses beyond :data:`SEAMS`."""


def installed_version() -> str:
    """SkyRL's installed version, or ``"not installed"``."""
    try:
        return importlib.metadata.version("skyrl")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"this SkyRL ({installed_version()}) has no {what}",
        field=f"{BLOCK}.enable",
        fix=f"Use a SkyRL release partial rollouts were tested on ({', '.join(TESTED_VERSIONS)}) or turn the flag off",
    )


def check_seams() -> None:
    """Raise :class:`ConfigError` naming the first SkyRL name the integration uses that this SkyRL lacks."""
    check(SEAMS, _fail)


def check_cpu_seams() -> None:
    """Raise :class:`ConfigError` naming the first name of :data:`CPU_SEAMS` this SkyRL lacks."""
    check(CPU_SEAMS, _fail)
