"""The adapter's cut records, built from live request buffers without an engine: what the frozen window hands over.

The records are built unchecked (the checks read every token, and the engine stands still while
they are built); these tests pin that they are exactly what the checked constructor makes, own
their arrays, and that the checks still run before a byte is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from partial_rollout.engine import exactness
from partial_rollout.engine.cut import in_flight_record
from partial_rollout.engine.live import LiveRequest
from partial_rollout.engine.protocol import Capabilities
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    save_snapshot,
)

SPEC = SamplingSpec(max_tokens=64, temperature=1.0, seed=5)
EXACT = Capabilities(exact=True, verified_cut=True, fast_pause=True)
STATE = b"\x01" * 16


def _live(
    tokens: int, *, starts: list[tuple[int, int]], base: SampleRecord | None = None, index: int = 2
) -> LiveRequest:
    req = LiveRequest(index=index, sampling=SPEC, base=base, version_starts=starts)
    req.token_ids.extend(range(10, 10 + tokens))
    req.logprobs.extend([-0.25] * tokens)
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
CASES = {
    "fresh": _live(5, starts=[(3, 0)]),
    "across an update": _live(5, starts=[(3, 0), (4, 2)]),
    "resumed": _live(4, starts=[(1, 0)], base=PREFIX),
    "resumed under a newer version": _live(4, starts=[(2, 0)], base=PREFIX),
    "resumed, not yet scheduled": _live(0, starts=[(1, 0)], base=PREFIX),
    "resumed, then an update": _live(4, starts=[(1, 0), (2, 1)], base=PREFIX),
}


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
    assert (
        record.versions.tolist() == ([] if req.base is None else [1, 1, 1]) + req.versions(len(req.token_ids)).tolist()
    )
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


def test_the_checks_a_cut_skips_run_before_the_snapshot_is_written(tmp_path: Path) -> None:
    req = _live(3, starts=[(0, 0)], index=0)
    req.logprobs[1] = 0.5  # no logprob is positive: an engine that sent one is caught at the write
    record = in_flight_record(req, 3, STATE, EXACT)  # the frozen window does not read the tokens
    group = GroupRecord(
        group_id="g", prompt_token_ids=[1, 2], state=GroupState.IN_FLIGHT, dispatch_version=0, samples=[record]
    )
    snapshot = Snapshot(
        trainer_step=1,
        policy_version=1,
        fingerprints=Fingerprints(model="m", tokenizer="t", vocab_size=512, vllm_version="0.32.0"),
        groups=[group],
    )
    with pytest.raises(
        ValueError, match=r"group 'g' sample 0: logprobs must be finite and <= 0, got 0.5 at position 1"
    ):
        save_snapshot(snapshot, tmp_path / "s.safetensors")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="logprobs must be finite"):
        dataclasses.replace(record)  # any copy of it is checked as usual
