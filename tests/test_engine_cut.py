"""The adapter's cut records, built from live request buffers without an engine: what the frozen window hands over.

The records check every token as they are built, like every record; these tests pin that they are
exactly what the constructor makes from the same fields, own their arrays, and refuse what an engine
should never send.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from partial_rollout.engine import Capabilities, Delta, EngineConfig, ResumableEngine, exactness
from partial_rollout.engine.cut import in_flight_record
from partial_rollout.engine.live import LiveRequest
from partial_rollout.engine.vllm_internals import SamplerKind
from partial_rollout.snapshot import (
    SampleRecord,
    SampleState,
    SamplingSpec,
)

SPEC = SamplingSpec(max_tokens=64, temperature=1.0, seed=5)
EXACT = Capabilities(exact=True, verified_cut=True, fast_pause=True)
STATE = b"\x01" * 16


def _versions(tokens: int, starts: list[tuple[int, int]]) -> list[int]:
    """The version of each of ``tokens`` tokens, given ``(version, first token)`` of each stretch."""
    ends = [start for _, start in starts[1:]] + [tokens]
    return [version for (version, start), end in zip(starts, ends, strict=True) for _ in range(start, end)]


def _live(
    tokens: int, *, starts: list[tuple[int, int]], base: SampleRecord | None = None, index: int = 2
) -> LiveRequest:
    """A request that generated ``tokens`` tokens, with a weight update at each stretch's first token."""
    req = LiveRequest(index=index, sampling=SPEC, base=base, policy_version=starts[0][0])
    for i, (version, start) in enumerate(starts):
        if i:
            req.mark_version(version)
        end = starts[i + 1][1] if i + 1 < len(starts) else tokens
        ids = list(range(10 + start, 10 + end))
        req.add(Delta(token_ids=ids, logprobs=[-0.25] * len(ids), versions=[req.policy_version] * len(ids)))
    return req


PREFIX = SampleRecord(
    index=2,
    state=SampleState.IN_FLIGHT,
    sampling=SPEC,
    token_ids=[7, 8, 9],
    logprobs=[-1.0, -2.0, -3.0],
    versions=[1, 1, 1],
    sampler_state=STATE,
)
STARTS = {
    "fresh": (5, [(3, 0)], None),
    "across an update": (5, [(3, 0), (4, 2)], None),
    "resumed": (4, [(1, 0)], PREFIX),
    "resumed under a newer version": (4, [(2, 0)], PREFIX),
    "resumed, not yet scheduled": (0, [(1, 0)], PREFIX),
    "resumed, then an update": (4, [(1, 0), (2, 1)], PREFIX),
}
"""Each case's tokens generated, ``(policy version, first token)`` of each stretch, and saved prefix."""
CASES = {name: _live(tokens, starts=starts, base=base) for name, (tokens, starts, base) in STARTS.items()}


@pytest.mark.parametrize("name", CASES)
def test_a_cut_record_is_what_the_checked_constructor_makes(name: str) -> None:
    req = CASES[name]
    record = in_flight_record(req, len(req.token_ids), STATE, EXACT)
    fields = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    checked = SampleRecord(**fields)
    assert record == checked
    for array in ("token_ids", "logprobs", "versions"):
        mine, theirs = getattr(record, array), getattr(checked, array)
        assert mine.dtype == theirs.dtype and mine.ndim == 1 and mine.flags.c_contiguous, array
    # The stitched prefix, the versions per token, and why it cannot continue exactly, if so.
    prefix = [] if req.base is None else req.base.token_ids.tolist()
    assert record.token_ids.tolist() == prefix + list(range(10, 10 + len(req.token_ids)))
    tokens, starts, _ = STARTS[name]
    assert record.versions.tolist() == ([] if req.base is None else [1, 1, 1]) + _versions(tokens, starts)
    expected = {
        "fresh": None,
        "across an update": exactness.version_mix(3, 4, 4),
        "resumed": None,
        "resumed under a newer version": exactness.version_mix(1, 1, 2),
        "resumed, not yet scheduled": None,
        "resumed, then an update": exactness.version_mix(1, 2, 2),
    }[name]
    assert record.inexact == expected


def test_a_cut_record_owns_its_arrays_while_the_request_goes_on() -> None:
    req = _live(5, starts=[(3, 0)])
    record = in_flight_record(req, 5, STATE, EXACT)
    req.token_ids.extend([99] * 5000)  # a view of the live buffer would refuse the resize (BufferError)
    req.logprobs.extend([-1.0] * 5000)
    record.token_ids[0] = 1  # and writing the record does not write the request
    assert record.token_ids.tolist() == [1, 11, 12, 13, 14] and req.token_ids[0] == 10


def test_a_cut_record_is_checked_as_it_is_built() -> None:
    """No logprob is positive: an engine that sent one is caught in the frozen window, where the
    record is built, before any snapshot can hold it (and the engine resumes: pause_and_capture)."""
    req = _live(3, starts=[(0, 0)], index=0)
    req.logprobs[1] = 0.5
    with pytest.raises(ValueError, match=r"logprobs must be finite and <= 0, got 0.5 at position 1"):
        in_flight_record(req, 3, STATE, EXACT)


class _FrontEnd:
    """The parts of vLLM's ``AsyncLLM`` a verified cut reads, with workers that sampled ``worker_tokens`` of "r"."""

    def __init__(self, worker_tokens: int) -> None:
        self.model_config = SimpleNamespace(max_model_len=64, try_get_generation_config=dict)
        self.output_processor = SimpleNamespace(request_states={"r-0a1b": SimpleNamespace(external_req_id="r")})
        self.paused = False
        self._worker_tokens = worker_tokens

    def get_tokenizer(self) -> None:
        return None

    async def pause_generation(self, *, mode: str, clear_cache: bool) -> None:
        self.paused = True

    async def resume_generation(self) -> None:
        self.paused = False

    async def collective_rpc(self, method: str) -> list[dict[str, tuple[int, bytes | None]]]:
        assert method == "partial_rollout_capture"
        return [{"r-0a1b": (self._worker_tokens, None)}]


def test_a_cut_whose_token_counts_disagree_with_the_engines_is_refused_and_the_engine_resumes(tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    llm = _FrontEnd(worker_tokens=3)
    engine = ResumableEngine(
        llm,
        EngineConfig(model=str(tmp_path)),
        Capabilities(exact=False, verified_cut=True),
        0,
        sampler=SamplerKind(device="cpu", state_bytes=5056),  # a torch MT19937 generator
    )
    engine._live["r"] = _live(5, starts=[(0, 0)])  # five tokens arrived here; the workers sampled three
    # A RuntimeError, not an assert: under ``python -O`` the verified cut must still be verified.
    with pytest.raises(RuntimeError, match=r"r: the cut does not verify: this process received 5 .* sampled 3"):
        asyncio.run(engine.pause_and_capture())
    assert not llm.paused
