"""Snapshot builders shared by the snapshot, atomic and dump tests (a helpers module: pytest collects no tests from it).

``save_ledger`` saves a work ledger without an engine, as the checkpointer's window does with one.
``example_snapshot`` covers every group and sample state in a few groups; ``snapshots`` is the
hypothesis strategy of arbitrary valid snapshots; ``rewrite`` and ``patch_header`` craft files that
break exactly one rule while keeping every checksum right, so a test sees the check it targets.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file

from partial_rollout.ledger import WorkLedger
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    container,
    save_snapshot,
)
from partial_rollout.snapshot.checksum import metadata_checksum, tensor_checksum

VOCAB = 1000


def save_ledger(
    ledger: WorkLedger,
    folder: str | os.PathLike[str],
    *,
    trainer_step: int,
    policy_version: int,
    fingerprints: Fingerprints,
    loader_state: dict[str, Any] | None,
    states: Collection[GroupState] = frozenset(GroupState),
    metadata: dict[str, Any] | None = None,
    **event_fields: Any,
) -> Snapshot:
    """The ledger's cut, its ``save`` event, then the snapshot written and its outcome logged; returns the snapshot.

    The order of :class:`partial_rollout.checkpoint.RolloutCheckpointer`'s window (cut, thaw, write),
    for tests of the ledger and its events that need no engine.
    """
    cut = ledger.cut(
        folder,
        trainer_step=trainer_step,
        policy_version=policy_version,
        fingerprints=fingerprints,
        loader_state=loader_state,
        states=states,
        metadata=metadata,
    )
    ledger.record_save(cut, **event_fields)
    try:
        snapshot = cut.to_snapshot()
        size = save_snapshot(snapshot, cut.path)
    except BaseException as exc:
        ledger.record_save_failed(cut, error=f"{type(exc).__name__}: {exc}")
        raise
    ledger.record_written(cut, bytes=size)
    return snapshot


def fingerprints(**overrides: Any) -> Fingerprints:
    fields = dict(
        model="sha256:model", tokenizer="sha256:tokenizer", vocab_size=VOCAB, vllm_version="0.32.0", model_path=""
    )
    fields.update(overrides)
    return Fingerprints(**fields)


def sample(index: int, state: SampleState, n: int = 0, *, version: int = 3, **fields: Any) -> SampleRecord:
    """A sample with ``n`` tokens ``[index * 10 + i]`` at ``version``."""
    fields.setdefault("sampling", SamplingSpec(max_tokens=64, temperature=0.8, seed=1000 + index))
    if state is SampleState.FINISHED:
        fields.setdefault("finish_reason", "stop")
    return SampleRecord(
        index=index,
        state=state,
        token_ids=np.arange(n, dtype=np.int32) + index * 10,
        logprobs=-np.linspace(0.1, 1.0, n, dtype=np.float32),
        versions=np.full(n, version, dtype=np.int32),
        **fields,
    )


def example_snapshot(**overrides: Any) -> Snapshot:
    """Four groups: a pending prompt, a partial in-flight group, an in-flight group, a ready group."""
    ready = [sample(i, SampleState.FINISHED, 4, reward=float(i), stop_reason=1) for i in range(2)]
    groups = [
        GroupRecord(
            group_id="pending-0",
            prompt_token_ids=[1, 2, 3],
            data={"task": "math", "answer": "42"},
            state=GroupState.PENDING,
            samples=[sample(i, SampleState.NOT_STARTED) for i in range(2)],
        ),
        GroupRecord(
            group_id="partial-1",
            prompt_token_ids=[4, 5],
            data={"task": "code"},
            state=GroupState.IN_FLIGHT,
            dispatch_version=2,
            samples=[
                sample(0, SampleState.FINISHED, 3, finish_reason="length"),
                sample(
                    1,
                    SampleState.IN_FLIGHT,
                    5,
                    sampler_state=b"\x01" * 16,
                    inexact="presence_penalty counts only output tokens",
                ),
                sample(2, SampleState.NOT_STARTED),
            ],
        ),
        GroupRecord(
            group_id="flight-2",
            prompt_token_ids=[6],
            state=GroupState.IN_FLIGHT,
            dispatch_version=3,
            samples=[
                SampleRecord(
                    index=0,
                    state=SampleState.IN_FLIGHT,
                    sampling=SamplingSpec(max_tokens=10, temperature=0.0),
                    token_ids=[7, 8, 9, 10],
                    logprobs=[-0.5, -0.25, 0.0, -3.0],
                    versions=[2, 2, 3, 3],
                )
            ],
        ),
        GroupRecord(
            group_id="ready-3", prompt_token_ids=[11, 12], state=GroupState.READY, dispatch_version=1, samples=ready
        ),
    ]
    fields = dict(
        trainer_step=7,
        policy_version=3,
        fingerprints=fingerprints(),
        groups=groups,
        loader_state={"_num_yielded": 3, "generator": np.arange(8, dtype=np.uint8), "seen": (1, 2)},
        counters={"yielded": 9, "consumed": 4, "evicted": 1},
        evicted_by_reason={"too_stale": 1},
        metadata={"run": "test", "note": "unicode \u00e9\u4e2d"},
    )
    fields.update(overrides)
    return Snapshot(**fields)


# -- hypothesis -------------------------------------------------------------------------------

TEXT = st.text(st.characters(codec="utf-8"), max_size=12)
JSON_SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
JSON = st.recursive(
    JSON_SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8
)


@st.composite
def sampling_specs(draw: st.DrawFn) -> SamplingSpec:
    max_tokens = draw(st.integers(1, 12))
    return SamplingSpec(
        max_tokens=max_tokens,
        temperature=draw(st.sampled_from([0.0, 1e-6, 0.7, 1.0, 1.5])),
        top_p=draw(st.floats(0.01, 1.0)),
        top_k=draw(st.sampled_from([-1, 0, 1, 50])),
        min_p=draw(st.floats(0.0, 1.0)),
        min_tokens=draw(st.integers(0, max_tokens)),
        seed=draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
        stop=tuple(draw(st.lists(TEXT.filter(bool), max_size=2))),
        stop_token_ids=tuple(draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))),
        ignore_eos=draw(st.booleans()),
        presence_penalty=draw(st.floats(-2, 2)),
        frequency_penalty=draw(st.floats(-2, 2)),
        repetition_penalty=draw(st.floats(0.5, 2)),
        logprobs=draw(st.integers(0, 5)),
        extra=draw(
            st.dictionaries(st.sampled_from(["bad_words", "truncate_prompt_tokens", "\u00fcber"]), JSON, max_size=2)
        ),
    )


@st.composite
def samples(draw: st.DrawFn, index: int, state: SampleState, policy_version: int) -> SampleRecord:
    spec = draw(sampling_specs())
    n = 0 if state is SampleState.NOT_STARTED else draw(st.integers(0, spec.max_tokens))
    finished = state is SampleState.FINISHED
    return SampleRecord(
        index=index,
        state=state,
        sampling=spec,
        token_ids=draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n)),
        logprobs=draw(st.lists(st.floats(-50, 0, width=32), min_size=n, max_size=n)),
        versions=sorted(draw(st.lists(st.integers(0, policy_version), min_size=n, max_size=n))),
        finish_reason=draw(st.sampled_from(["stop", "length", "abort", "\u505c"])) if finished else None,
        stop_reason=draw(st.none() | st.integers(0, 2**40) | TEXT) if finished else None,
        reward=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False)) if finished else None,
        sampler_state=draw(st.none() | st.binary(min_size=1, max_size=40)),
        inexact=draw(st.none() | TEXT.filter(bool)),
    )


@st.composite
def groups(draw: st.DrawFn, group_id: str, policy_version: int) -> GroupRecord:
    state = draw(st.sampled_from(list(GroupState)))
    allowed = {
        GroupState.PENDING: [SampleState.NOT_STARTED],
        GroupState.IN_FLIGHT: list(SampleState),
        GroupState.READY: [SampleState.FINISHED],
    }[state]
    sample_states = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=3))
    return GroupRecord(
        group_id=group_id,
        prompt_token_ids=draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6)),
        data=draw(st.dictionaries(TEXT, JSON, max_size=3)),
        state=state,
        dispatch_version=-1 if state is GroupState.PENDING else draw(st.integers(0, policy_version)),
        samples=[draw(samples(i, s, policy_version)) for i, s in enumerate(sample_states)],
    )


LOADER_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | TEXT
    | st.binary(max_size=8)
    | st.builds(lambda v: np.array(v, dtype=np.int64), st.lists(st.integers(-5, 5), max_size=4))
    | st.builds(lambda v: np.array(v, dtype=np.float32).reshape(-1, 1), st.lists(st.floats(width=32), max_size=4))
    | st.builds(np.uint8, st.integers(0, 255))
)
LOADER_STATES = st.dictionaries(
    TEXT,
    st.recursive(
        LOADER_LEAVES,
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.builds(tuple, st.lists(inner, max_size=3))
            | st.dictionaries(TEXT | st.integers(), inner, max_size=3)
        ),
        max_leaves=6,
    ),
    max_size=4,
)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    policy_version = draw(st.integers(0, 2**31 - 1) | st.integers(0, 5))
    ids = draw(st.lists(TEXT.filter(bool), max_size=4, unique=True))
    return Snapshot(
        trainer_step=draw(st.integers(0, 2**63 - 1)),
        policy_version=policy_version,
        fingerprints=fingerprints(extra=draw(st.dictionaries(TEXT, TEXT, max_size=2)), model_path=draw(TEXT)),
        groups=[draw(groups(group_id, policy_version)) for group_id in ids],
        loader_state=draw(st.none() | LOADER_STATES),
        counters=draw(st.dictionaries(TEXT, st.integers(0, 2**62), max_size=3)),
        evicted_by_reason=draw(st.dictionaries(TEXT, st.integers(0, 100), max_size=2)),
        metadata=draw(st.dictionaries(TEXT, JSON, max_size=3)),
    )


# -- crafting damaged files -------------------------------------------------------------------


def replace_samples(snapshot: Snapshot, change: Callable[[SampleRecord], SampleRecord]) -> Snapshot:
    """``snapshot`` with ``change`` applied to every sample (records are frozen: a changed one is new)."""
    return dataclasses.replace(
        snapshot,
        groups=[dataclasses.replace(g, samples=[change(s) for s in g.samples]) for g in snapshot.groups],
    )


def read_file(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """A snapshot's tensors and metadata, read with the official safetensors reader."""
    with safe_open(path, framework="np") as f:
        metadata = f.metadata()
    return load_file(path), metadata


def rewrite(
    path: Path,
    out: Path,
    *,
    tensors: Callable[[dict[str, np.ndarray]], None] | None = None,
    metadata: Callable[[dict[str, str]], None] | None = None,
) -> Path:
    """Copy the snapshot at ``path`` to ``out`` after editing it in place, with every checksum recomputed."""
    arrays, meta = read_file(path)
    if tensors is not None:
        tensors(arrays)
    if metadata is not None:
        metadata(meta)
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    if "checksums" in meta:
        meta["checksums"] = json.dumps(
            {
                "algorithm": "crc32",
                "metadata": metadata_checksum(meta),
                "tensors": {k: tensor_checksum(v) for k, v in sorted(arrays.items())},
            }
        )
    container.write_file(out, arrays, meta)
    return out


def patch_header(path: Path, out: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    """Copy ``path`` to ``out`` with its raw safetensors header JSON edited (data bytes unchanged)."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    out.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length :])
    return out


def header_length(path: Path) -> int:
    """8 + the header's length: where the tensor data starts."""
    return 8 + struct.unpack("<Q", path.read_bytes()[:8])[0]


def data_span(path: Path, name: str) -> tuple[int, int]:
    """Absolute file offsets of tensor ``name``'s bytes."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    start, end = json.loads(raw[8 : 8 + length])[name]["data_offsets"]
    return 8 + length + start, 8 + length + end


def bytes_per_token(size: int, snap: Snapshot) -> float:
    """File bytes per generated token, not counting sampler states."""
    sampler = sum(len(s.sampler_state or b"") for _, s in snap.iter_samples())
    tokens = sum(s.num_tokens for _, s in snap.iter_samples())
    return (size - sampler) / tokens if tokens else math.inf
