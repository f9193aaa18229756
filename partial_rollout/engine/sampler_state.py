"""Capture and restore per-request sampler RNG state inside vLLM's worker.

vLLM gives each *seeded* request its own ``torch.Generator`` in the worker
(``GPUModelRunner._update_states``), and every sampled token advances it. A request resumed from a
prefix as a new request would get a fresh generator seeded from the same seed, and diverge at the
first resampled token. So at a cut we read each generator's state, and on resume we put it back
into the new request's generator right after vLLM creates it and before its first token is sampled.

vLLM has no public API for this (0.32.0). This module is a *worker extension* (vLLM's supported
mixin hook, ``worker_extension_cls``), whose methods run in every worker through
``collective_rpc``; the restore wraps the runner's ``_update_states`` on the instance. Both reach
internals, so :meth:`SamplerStateExtension.partial_rollout_install` reports what it found and the
adapter refuses or degrades explicitly (:mod:`partial_rollout.engine.support`) instead of silently
producing inexact continuations.
"""

from __future__ import annotations

import base64
from typing import Any

SAMPLER_STATE_ARG = "partial_rollout_sampler_state"
"""Key in ``SamplingParams.extra_args`` carrying a base64 generator state to restore."""


class SamplerStateExtension:
    """Mixed into vLLM's worker; ``self`` is the worker (it has ``model_runner``)."""

    def partial_rollout_install(self, frontend_pid: int | None = None) -> dict[str, Any]:
        """Install the restore hook once; report whether capture and restore can work here.

        With ``frontend_pid``, also make the engine core exit when that process dies
        (:mod:`partial_rollout.engine.orphan_guard`).
        """
        import torch

        if frontend_pid is not None:
            from partial_rollout.engine import orphan_guard

            orphan_guard.start(frontend_pid)

        runner = getattr(self, "model_runner", None)
        missing = [
            name for name in ("_update_states", "requests", "device") if runner is None or not hasattr(runner, name)
        ]
        if missing:
            return {"ok": False, "runner": type(runner).__name__, "reason": f"model runner lacks {missing}"}
        report = {
            "ok": True,
            "runner": type(runner).__name__,
            "device": str(runner.device),
            "generator_state_bytes": int(torch.Generator(device=runner.device).get_state().numel()),
        }
        if getattr(runner, "_partial_rollout_hooked", False):
            return report
        original = runner._update_states

        def _update_states(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scheduler_output, *args, **kwargs)
            for new_req in scheduler_output.scheduled_new_reqs:
                params = new_req.sampling_params
                encoded = (params.extra_args or {}).get(SAMPLER_STATE_ARG) if params is not None else None
                if encoded is None:
                    continue
                state = runner.requests.get(new_req.req_id)
                if state is None or state.generator is None:
                    raise RuntimeError(
                        f"request {new_req.req_id} carries a sampler state but vLLM gave it no generator; "
                        "it must be seeded with temperature > 0"
                    )
                raw = torch.frombuffer(bytearray(base64.b64decode(encoded)), dtype=torch.uint8)
                state.generator.set_state(raw)
            return result

        runner._update_states = _update_states
        runner._partial_rollout_hooked = True
        return report

    def partial_rollout_capture(self) -> dict[str, tuple[int, bytes | None]]:
        """For every request the worker holds: (output tokens sampled so far, generator state or None)."""
        out: dict[str, tuple[int, bytes | None]] = {}
        for req_id, state in self.model_runner.requests.items():
            generator = state.generator
            out[req_id] = (
                len(state.output_token_ids),
                None if generator is None else generator.get_state().numpy().tobytes(),
            )
        return out


def encode_sampler_state(state: bytes) -> str:
    """Encode a captured state for ``SamplingParams.extra_args`` (which must stay JSON/msgpack-able)."""
    return base64.b64encode(state).decode("ascii")
