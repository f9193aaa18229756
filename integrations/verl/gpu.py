"""verl's vLLM server with partial rollouts, for GPUs: written against verl 0.9.1, NOT YET RUN ON A GPU.

What runs where (all in verl's GPU environment, which must import ``partial_rollout`` and
``partial_rollout_integrations``: install this project there):

- **verl's task-runner actor** (the process that builds verl's trainer and its
  ``LLMServerManager``): :func:`install_gpu_path`, run there by :func:`gpu_task_runner`'s
  ``run``, makes verl's replica lookup for ``vllm`` return :class:`DurableVllmReplica`.
- **each rollout replica's node-0 server actor**: :class:`DurableVllmHttpServer`, verl's
  ``vLLMHttpServer`` holding vLLM's ``AsyncLLM``, with a :class:`~.server.DurableServer` on it.
- **vLLM's GPU workers** (that actor's child processes): :data:`EXTENSION`, verl's worker extension
  (its weight receivers) with our capture hooks mixed in (vLLM takes one extension class).
- The trainer side (:mod:`.trainer`, :mod:`.rollouts`, :mod:`.client`) is unchanged: it reaches
  the server actors by the same protocol as the CPU harness's (:mod:`.cpu`, which does not use
  this module).

The server. Once verl's ``run_server`` has started the ``AsyncLLM``
(``vllm_async_server.py:481-533``), :meth:`ResumableEngine.attach` takes it over and a
``DurableServer`` serves on it by composition (:meth:`DurableServer.attach`): verl's ``generate``
and ``abort_all_requests`` go to it, so an abort cuts each sample's prefix as received, the
client's retry continues that very sample by its stable key, and a restart continues its saved
prefix; the trainer's cut (``freeze``, ``thaw``, ``forget``, ``fingerprints``, ``capabilities``,
``progress``, ``shutdown``) is served by it too. verl's ``sleep``, ``wake_up``, ``clear_kv_cache``,
``release_kv_cache``, ``resume_kv_cache``, ``collective_rpc``, weight receivers and HTTP app
stay verl's own. verl's ``vLLMReplica.resume_generation`` ends in each server's
``open_submission_gate`` (``vllm_async_server.py:1449-1455``), which here also reopens the
durable server; the ``resume_engine_generation`` before it (vLLM's ``resume_generation``) stays
verl's: the durable server leaves vLLM unpaused after every abort, and verl calls it only after a
weight sync; the trainer's cut pauses nothing.

Weights and versions. In verl 0.9.1 a weight transfer is not one call on the server, so it cannot
be wrapped in :meth:`ResumableEngine.refit`: verl's ``ServerAdapter.update_weights``
(``vllm_rollout/vllm_rollout.py:210-253``; run by the training workers in ``colocate_async``,
whose checkpoint engine is always ``naive``: ``trainer_base.py:382``, ``checkpoint_engine/base.py:518``)
drives vLLM's workers through the server's ``collective_rpc`` and a ZMQ socket, then calls the
server's ``clear_kv_cache`` and ``set_global_steps(global_steps)`` (``vllm_rollout.py:248-250``).
Every request was aborted before that (``trainer_colocate_async.py:46``, before the replicas
sleep; ``checkpoint_engine/base.py:523`` for the other backends), which here is a capture, so no
sample is running. :meth:`~DurableVllmHttpServer.set_global_steps` is therefore where tokens change
label: it runs ``ResumableEngine.refit`` with nothing to load, labelling every later token with
verl's step, once vLLM is fully awake: vLLM 0.24's ``sleep`` pauses its scheduler and only the
``wake_up`` that makes all memory resident resumes it, and a refit pauses and resumes the
scheduler, so on a half-asleep engine (``set_global_steps`` comes before
``wake_up(tags=["kv_cache"])``: ``engine_workers.py:804-823``) the label waits for the
``wake_up``/``resume_kv_cache`` that follows, and in any case is applied before the next request
starts.

The replica and the lookup. :class:`DurableVllmReplica` is verl's ``vLLMReplica`` launching
:class:`DurableVllmHttpServer` for the policy's replicas (reward-model and teacher replicas keep
verl's server). verl 0.9.1's ``LLMServerManager.__init__`` takes a ``rollout_replica_class``
attribute of the manager if it has one (``llm_server.py:391-396``; none of the managers verl's V1
trainers build has one) and otherwise ``get_rollout_replica_class``, which for a backend without
prefill/decode disaggregation returns ``RolloutReplicaRegistry.get(name)`` (``replica.py:393-418``).
:func:`install_gpu_path` registers :func:`load_replica_class` there (``replica.py:318``), which
covers the standalone replicas of ``separate_async`` as well; the registry is per process, hence
the task runner.

On a CPU, ``tests/verl/test_verl_gpu_path.py`` checks against verl 0.9.1's real source every verl
name used here, the signatures of the verl methods overridden, that verl's lookup (the registry and
a manager) returns :class:`DurableVllmReplica` with the flag on and verl's replica with it off, and
the version labelling across verl's sleep and wake-up; nothing here has started a vLLM engine, and
no weight transfer has run through it. Run with ``python -m partial_rollout_integrations.verl.gpu
[hydra overrides]``; ``scripts/gpu_check_verl.sh`` is the kill/resume check to run on a GPU.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import Any

import ray
from verl.workers.rollout.replica import RolloutReplicaRegistry

from partial_rollout.engine import Capabilities, EngineConfig, Progress, ResumableEngine, WorkerHooks, with_worker_hooks
from partial_rollout.errors import EXIT_BAD_INPUT, BadInputError, ConfigError
from partial_rollout.snapshot import Fingerprints
from partial_rollout_integrations.seams import unwrap
from partial_rollout_integrations.verl.__main__ import read_block
from partial_rollout_integrations.verl.config import BLOCK
from partial_rollout_integrations.verl.seams import check_gpu_seams
from partial_rollout_integrations.verl.server import DurableServer
from partial_rollout_integrations.verl.setup_checks import Requirement, select, shown
from partial_rollout_integrations.verl.wire import HeldSample, ServerOutput

BACKEND = "vllm"
"""The ``actor_rollout_ref.rollout.name`` whose registry entry :func:`install_gpu_path` replaces."""
EXTENSION = f"{__name__}.WorkerExtension"
"""verl's worker extension with :class:`~partial_rollout.engine.WorkerHooks` mixed in, built on
first use (verl's extension module imports vLLM, which verl's controller environment may lack)."""
LAZY = ("DurableVllmHttpServer", "DurableVllmReplica", "WorkerExtension")
"""Classes of this module built on first use: their verl bases import vLLM."""

GPU_REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "actor_rollout_ref.rollout.disaggregation.enabled",
        (False, None),
        "verl's prefill/decode replicas (vLLMPDReplica) bypass the replica registry",
        "Set actor_rollout_ref.rollout.disaggregation.enabled=false",
    ),
    Requirement(
        "actor_rollout_ref.rollout.ignore_eos",
        (False, None),
        "the durable server's sampling has no ignore_eos",
        "Set actor_rollout_ref.rollout.ignore_eos=false",
    ),
    Requirement(
        "actor_rollout_ref.rollout.enable_rollout_routing_replay",
        (False, None),
        "the durable server returns no routed experts",
        "Set actor_rollout_ref.rollout.enable_rollout_routing_replay=false",
    ),
)
"""verl settings the GPU path does not support, refused at set-up (the others: :mod:`.setup_checks`)."""


def check_gpu_config(config: Any) -> None:
    """Raise :class:`ConfigError` on the first setting of :data:`GPU_REQUIREMENTS` ``config`` breaks."""
    for requirement in GPU_REQUIREMENTS:
        value = select(config, requirement.key)
        if value not in requirement.allowed:
            raise ConfigError(
                f"{shown(value)} is not supported on the GPU path of {BLOCK}: {requirement.why}",
                field=requirement.key,
                fix=requirement.fix,
            )


async def _loaded_by_verl() -> None:
    """The refit's transfer: nothing, verl's ``ServerAdapter`` has already moved the weights in."""


@functools.cache
def _build_extension() -> type:
    """:data:`EXTENSION`: verl's worker extension with our hooks (vLLM's workers import it by name)."""
    from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension

    return type(
        "WorkerExtension",
        (WorkerHooks, vLLMColocateWorkerExtension),
        {"__module__": __name__, "__doc__": "verl's weight receivers and partial rollouts' capture hooks."},
    )


@functools.cache
def _build_servers() -> dict[str, type]:
    """Subclass verl's vLLM server and replica (their module imports vLLM, so not at this module's import)."""
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

    class DurableVllmHttpServer(vLLMHttpServer):  # type: ignore[misc]
        """verl's vLLM server actor whose samples survive verl's aborts and a restart (see the module doc)."""

        __qualname__ = "DurableVllmHttpServer"
        _durable: DurableServer | None = None
        """Set once verl's ``run_server`` started the engine (node 0 of the replica only)."""
        _pending_version: int | None = None
        """A step verl's ``set_global_steps`` announced that the engine does not label tokens with yet."""
        _labelling: asyncio.Lock | None = None
        """Held while a new version is applied: requests start after it, under the new label."""

        def _get_worker_extension_cls(self) -> str:
            """verl's hook for the ``worker_extension_cls`` its ``launch_server`` starts vLLM with."""
            return EXTENSION

        async def run_server(self, args: Any) -> None:
            """verl's: start vLLM's ``AsyncLLM`` and its HTTP app; then take the engine over (module doc)."""
            if self.lora_as_adapter:  # verl's own test of its config, before vLLM starts
                raise ConfigError(
                    "is a LoRA adapter: the durable server sends vLLM no LoRA request",
                    field="actor_rollout_ref.model.lora_rank",
                    fix="Merge the adapter (actor_rollout_ref.model.lora.merge=true) or turn partial rollouts off",
                )
            await super().run_server(args)
            config = with_worker_hooks(
                EngineConfig(
                    model=str(self.model_config.local_path),
                    max_model_len=int(self.engine.model_config.max_model_len),
                    tensor_parallel_size=int(self.config.tensor_model_parallel_size),
                    logprobs_mode=str(self.engine.model_config.logprobs_mode),
                    seed=int(self.config.seed),
                )
            )
            # The config describes the running engine for fingerprints; vLLM runs EXTENSION, a WorkerHooks.
            engine = await ResumableEngine.attach(self.engine, config)
            durable = DurableServer(
                config, seed=int(self.config.seed), response_length=int(self.config.response_length)
            )
            durable.attach(engine)
            self._labelling = asyncio.Lock()
            self._durable = durable

        def _server(self) -> DurableServer:
            if self._durable is None:
                raise RuntimeError(
                    f"no durable engine on this server (node rank {self.node_rank}; only node 0 runs vLLM's"
                    " front end, once verl's launch_server has run)"
                )
            return self._durable

        # ------------------------------------------------------------ verl's server protocol

        async def generate(
            self,
            prompt_ids: list[int],
            sampling_params: dict[str, Any],
            request_id: str,
            image_data: list[Any] | None = None,
            video_data: list[Any] | None = None,
            audio_data: list[Any] | None = None,
            mm_processor_kwargs: dict[str, Any] | None = None,
            priority: int = 0,
            kv_transfer_params: dict[str, Any] | None = None,
            sample_key: str | None = None,
            resume_from: HeldSample | None = None,
        ) -> ServerOutput:
            """One attempt of a sample, on the durable server (verl's parameters; ``sample_key`` and
            ``resume_from`` come from :class:`~.client.DurableLLMServerClient`)."""
            if mm_processor_kwargs or priority or kv_transfer_params is not None:
                raise ValueError("the durable server takes text prompts at priority 0, without PD transfer")
            server = self._server()
            await self._label_new_tokens()
            return await server.generate(
                request_id,
                prompt_ids,
                sampling_params,
                image_data=image_data,
                video_data=video_data,
                audio_data=audio_data,
                sample_key=sample_key,
                resume_from=resume_from,
            )

        async def abort_all_requests(self, reset_prefix_cache: bool = True, reject_request: bool = False) -> Any:
            """End every running attempt, keeping its prefix as received (verl's abort drops it).

            Requests arriving afterwards wait for :meth:`open_submission_gate`. vLLM is left running,
            not paused as verl's abort leaves it: nothing is submitted until the gate opens.
            ``reject_request`` is passed on (the durable server parks those requests too: verl's
            ``colocate_async`` never sets it).
            """
            if self._durable is None:
                return await super().abort_all_requests(
                    reset_prefix_cache=reset_prefix_cache, reject_request=reject_request
                )
            result = await self._durable.abort_all_requests(reject_request=reject_request)
            if reset_prefix_cache:
                await self.clear_kv_cache()  # verl's: KV of the old weights is not reused
            return result

        async def open_submission_gate(self) -> None:
            """verl's ``resume_generation`` ends here (``vLLMReplica.resume_generation``): admit requests again."""
            await super().open_submission_gate()
            if self._durable is not None:
                await self._label_new_tokens()
                await self._durable.resume_generation()

        async def set_global_steps(self, global_steps: int) -> None:
            """verl's last call of a weight update: label every later token with ``global_steps`` (module doc)."""
            await super().set_global_steps(global_steps)
            if self._durable is not None:
                self._pending_version = int(global_steps)
                await self._label_new_tokens()

        async def wake_up(self, tags: list[str] | None = None) -> None:
            await super().wake_up(tags)
            await self._label_new_tokens()

        async def resume_kv_cache(self) -> None:
            await super().resume_kv_cache()
            await self._label_new_tokens()

        async def _label_new_tokens(self) -> None:
            """Apply the pending version once vLLM is fully awake (a refit pauses and resumes it)."""
            durable, lock = self._durable, self._labelling
            if durable is None or lock is None or self._pending_version is None:
                return
            async with lock:
                version = self._pending_version
                if version is None or await self.engine.is_sleeping():
                    return  # applied while this call waited, or applied at the wake-up to come
                await durable.engine.refit(_loaded_by_verl, version)
                await durable.set_global_steps(version)
                if self._pending_version == version:  # not a newer step announced meanwhile
                    self._pending_version = None

        # ------------------------------------------------------------ the trainer's cut (VerlServers)

        async def freeze(self) -> list[HeldSample]:
            return await self._server().freeze()

        async def thaw(self) -> None:
            await self._server().thaw()

        async def forget(self, keys: list[str]) -> None:
            await self._server().forget(keys)

        async def fingerprints(self) -> Fingerprints:
            return await self._server().fingerprints()

        async def capabilities(self) -> Capabilities:
            return await self._server().capabilities()

        async def progress(self) -> Progress:
            return await self._server().progress()

        async def shutdown(self) -> None:
            await self._server().shutdown()

    class DurableVllmReplica(vLLMReplica):  # type: ignore[misc]
        """verl's vLLM replica whose servers are :class:`DurableVllmHttpServer` (the policy's replicas only)."""

        __qualname__ = "DurableVllmReplica"

        def __init__(
            self,
            replica_rank: int,
            config: Any,
            model_config: Any,
            gpus_per_node: int = 8,
            is_reward_model: bool = False,
            is_teacher_model: bool = False,
            name_suffix: str = "",
        ) -> None:
            super().__init__(
                replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
            )
            if not (self.is_reward_model or self.is_teacher_model):  # a judge or a teacher is not cut
                self.server_class = ray.remote(DurableVllmHttpServer)

    return {"DurableVllmHttpServer": DurableVllmHttpServer, "DurableVllmReplica": DurableVllmReplica}


def __getattr__(name: str) -> Any:
    """The classes of :data:`LAZY`, built on first use (pickle and vLLM find them here by name)."""
    if name not in LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    classes = {"WorkerExtension": _build_extension()} if name == "WorkerExtension" else _build_servers()
    globals().update(classes)
    return classes[name]


def load_replica_class() -> type:
    """verl's registry loader for ``vllm`` with the flag on: :class:`DurableVllmReplica`."""
    replica: type = __getattr__("DurableVllmReplica")
    return replica


def install_gpu_path(config: Any) -> bool:
    """With the flag on, make verl's replica lookup for ``vllm`` return :class:`DurableVllmReplica`.

    Call it in the process that builds verl's ``LLMServerManager`` (verl's task runner,
    :func:`gpu_task_runner`). Returns whether it installed anything; with the flag off, nothing.

    Raises:
        ConfigError: a setting the GPU path does not support, or a verl without a name it uses.
    """
    if not read_block(config).enable:
        return False
    check_gpu_config(config)
    check_gpu_seams()
    RolloutReplicaRegistry.register(BACKEND, load_replica_class)
    return True


@functools.cache
def gpu_task_runner() -> Any:
    """The task runner of :mod:`.runner`, installing the GPU path in its own process before the run."""
    from partial_rollout_integrations.verl.runner import PartialRolloutTaskRunner

    base: Any = unwrap(PartialRolloutTaskRunner)

    class GpuTaskRunner(base):  # type: ignore[misc]
        def run(self, config: Any) -> None:
            install_gpu_path(config)
            super().run(config)

    return ray.remote(GpuTaskRunner)


def run(config: Any) -> None:
    """Hydra's task function: as ``python -m partial_rollout_integrations.verl``, with the GPU path."""
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from partial_rollout_integrations.verl.__main__ import check, run_verl

    try:
        block = read_block(config)
        if block.active:
            check(config)
            check_gpu_config(config)
    except BadInputError as e:
        print(f"partial-rollout: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if not block.active:
        run_verl(config)
        return
    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    try:
        run_ppo(config, task_runner_class=gpu_task_runner())
    except BadInputError as e:  # a snapshot refused at the resume, in verl's task-runner actor
        print(f"partial-rollout: {getattr(e, 'cause', e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def main() -> None:
    import hydra

    from partial_rollout_integrations.verl.__main__ import CONFIG_DIR, CONFIG_NAME

    hydra.main(config_path=CONFIG_DIR, config_name=CONFIG_NAME, version_base=None)(run)()


if __name__ == "__main__":
    # Run as the imported module, not as __main__: Ray and vLLM's workers find EXTENSION and the server
    # classes by this module's own name (``python -m`` names this copy ``__main__``).
    from partial_rollout_integrations.verl import gpu

    gpu.main()
