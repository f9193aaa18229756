"""The committed golden file defines format version 1: every later version must read it bit for bit.

tests/golden/partial_rollouts_v1.safetensors was written by tests/golden/make_v1.py with the
library's writer; partial_rollouts_v1.json holds its decoded content and sha256. A change that
fails these tests changes what v1 means: bump FORMAT_VERSION and keep a reader for v1 files
instead of regenerating the golden file (docs/snapshot_format.md, section 9, says when the byte
check alone may be answered by regenerating).
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from partial_rollout.snapshot import (
    FORMAT_VERSION,
    Fingerprints,
    GroupRecord,
    SampleRecord,
    Snapshot,
    SnapshotReader,
    load_snapshot,
    save_snapshot,
)
from partial_rollout.snapshot import writer as snapshot_writer

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
GOLDEN = GOLDEN_DIR / "partial_rollouts_v1.safetensors"
EXPECTED: dict[str, Any] = json.loads((GOLDEN_DIR / "partial_rollouts_v1.json").read_text(encoding="utf-8"))
SNAPSHOT_FIELDS = ("trainer_step", "policy_version", "fingerprints", "counters", "evicted_by_reason", "metadata")


# -- the loaded objects as plain JSON (kept apart from make_v1's on purpose: editing one cannot move both) --


def assert_same(actual: Any, expected: Any, where: str) -> None:
    """Equal types and values, dict keys in order, floats bit for bit (``==`` says 0.0 == -0.0 == False)."""
    assert type(actual) is type(expected), f"{where}: {actual!r} is not {expected!r}"
    if isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)} != {list(expected)}"
        for key, value in expected.items():
            assert_same(actual[key], value, f"{where}.{key}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_same(a, e, f"{where}[{i}]")
    elif isinstance(expected, float):
        assert struct.pack("<d", actual) == struct.pack("<d", expected), f"{where}: {actual!r} != {expected!r}"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def plain_value(value: Any) -> Any:
    """A loader-state value in the tagged form of the JSON (dicts as ordered pairs, tensors as raw bytes)."""
    if isinstance(value, torch.Tensor):
        raw = value.contiguous().flatten().view(torch.uint8).numpy().tobytes()
        return {
            "torch": {"dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape), "hex": raw.hex()}
        }
    if isinstance(value, np.ndarray):
        return {"numpy": {"dtype": value.dtype.name, "shape": list(value.shape), "hex": value.tobytes().hex()}}
    if isinstance(value, np.generic):
        return {"numpy_scalar": {"dtype": value.dtype.name, "hex": value.tobytes().hex()}}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, tuple):
        return {"tuple": [plain_value(v) for v in value]}
    if isinstance(value, list):
        return [plain_value(v) for v in value]
    assert type(value) is dict, f"unexpected {type(value).__name__} in loader_state"
    return {"dict": [[plain_value(k), plain_value(v)] for k, v in value.items()]}


def plain_sample(sample: SampleRecord) -> dict[str, Any]:
    assert (sample.token_ids.dtype, sample.logprobs.dtype, sample.versions.dtype) == (np.int32, np.float32, np.int32)
    return {
        "index": sample.index,
        "state": sample.state.value,
        "sampling": sample.sampling.to_json(),
        "token_ids": sample.token_ids.tolist(),
        "logprobs": sample.logprobs.tolist(),  # float32 widened exactly: bit-for-bit via assert_same
        "versions": sample.versions.tolist(),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "reward": sample.reward,
        "sampler_state": None if sample.sampler_state is None else sample.sampler_state.hex(),
        "inexact": sample.inexact,
    }


def plain_group(group: GroupRecord) -> dict[str, Any]:
    assert group.prompt_token_ids.dtype == np.int32
    return {
        "group_id": group.group_id,
        "prompt_token_ids": group.prompt_token_ids.tolist(),
        "data": group.data,
        "state": group.state.value,
        "dispatch_version": group.dispatch_version,
        "samples": [plain_sample(s) for s in group.samples],
    }


def plain_snapshot(snap: Snapshot) -> dict[str, Any]:
    return {
        "trainer_step": snap.trainer_step,
        "policy_version": snap.policy_version,
        "fingerprints": snap.fingerprints.to_json(),
        "counters": snap.counters,
        "evicted_by_reason": snap.evicted_by_reason,
        "metadata": snap.metadata,
        "counts": snap.counts(),
        "loader_state": plain_value(snap.loader_state),
        "groups": [plain_group(g) for g in snap.groups],
    }


def raw_header(data: bytes) -> dict[str, Any]:
    """The safetensors header, parsed without the library (its own reader is what is under test)."""
    (length,) = struct.unpack("<Q", data[:8])
    header: dict[str, Any] = json.loads(data[8 : 8 + length])
    return header


# -- the tests -------------------------------------------------------------------------------


def test_golden_file_is_the_recorded_one() -> None:
    """The committed bytes are the ones the expectation was recorded from (not regenerated by accident)."""
    data = GOLDEN.read_bytes()
    assert EXPECTED["file"] == GOLDEN.name
    assert len(data) == EXPECTED["size"]
    assert hashlib.sha256(data).hexdigest() == EXPECTED["sha256"]


def test_golden_file_is_format_version_1() -> None:
    """The golden file is v1 whatever FORMAT_VERSION says now: later readers must still read it."""
    header = raw_header(GOLDEN.read_bytes())
    metadata = header.pop("__metadata__")
    assert metadata["format"] == EXPECTED["format"] == "partial-rollout-snapshot"
    assert metadata["format_version"] == "1" and EXPECTED["format_version"] == 1
    assert metadata["writer"] == EXPECTED["writer"]
    assert {name: [e["dtype"], e["shape"]] for name, e in sorted(header.items())} == EXPECTED["tensors"]
    assert FORMAT_VERSION >= 1  # a reader never drops v1
    with SnapshotReader(GOLDEN) as reader:
        assert reader.format_version == 1


def test_load_snapshot_reads_every_field() -> None:
    """load_snapshot decodes every field of every record exactly as recorded."""
    snap = load_snapshot(GOLDEN)
    actual = plain_snapshot(snap)
    for key, value in actual.items():
        assert_same(value, EXPECTED[key], key)
    assert load_snapshot(GOLDEN, expect=Fingerprints.from_json(EXPECTED["fingerprints"])) == snap


def test_reader_reads_every_group_lazily() -> None:
    """SnapshotReader's per-field and per-group reads (payload slices, no full load) agree with the record."""
    with SnapshotReader(GOLDEN) as reader:
        assert reader.file_size == EXPECTED["size"]
        assert reader.writer == EXPECTED["writer"]
        for name in SNAPSHOT_FIELDS:
            value = getattr(reader, name)
            assert_same(value.to_json() if name == "fingerprints" else value, EXPECTED[name], name)
        assert_same(reader.tables, EXPECTED["tables"], "tables")
        assert reader.group_ids == [g["group_id"] for g in EXPECTED["groups"]]
        assert reader.num_groups == len(EXPECTED["groups"])
        assert reader.num_samples == sum(len(g["samples"]) for g in EXPECTED["groups"])
        assert reader.num_tokens == EXPECTED["counts"]["tokens"]
        for expected in reversed(EXPECTED["groups"]):  # out of file order: each read is its own slice
            assert_same(plain_group(reader.group(expected["group_id"])), expected, expected["group_id"])
        reader.verify_checksums()


def test_todays_writer_reproduces_the_golden_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Re-encoding the loaded snapshot with today's writer gives the golden file, byte for byte."""
    golden = load_snapshot(GOLDEN)
    # `writer` is free text naming the installed package version (spec section 9: it varies without a
    # version bump), the one field that is not the format's; pin it to the golden file's text.
    monkeypatch.setattr(snapshot_writer, "_writer", lambda: EXPECTED["writer"])
    out = tmp_path / "again.safetensors"
    size = save_snapshot(golden, out)
    if FORMAT_VERSION != 1:  # a later writer writes its own version; the v1 content must survive it
        assert load_snapshot(out) == golden
        return
    data, expected = out.read_bytes(), GOLDEN.read_bytes()
    if data != expected:
        first = next((i for i, (a, b) in enumerate(zip(data, expected, strict=False)) if a != b), len(expected))
        where = "header" if first < 8 + struct.unpack("<Q", expected[:8])[0] else "tensor data"
        assert raw_header(data) == raw_header(expected), f"the header differs (from byte {first})"
        pytest.fail(f"the {where} bytes differ from byte {first} of {len(expected)} (got {len(data)} bytes)")
    assert size == len(expected)
