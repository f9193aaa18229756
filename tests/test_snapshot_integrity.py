"""A damaged, truncated, mismatched or unknown snapshot is never loaded silently."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from snapshot_helpers import (
    data_span,
    example_snapshot,
    fingerprints,
    header_length,
    patch_header,
    read_file,
    rewrite,
)

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import (
    SNAPSHOT_FILENAME,
    SampleState,
    SnapshotReader,
    container,
    find_snapshot,
    load_snapshot,
    save_snapshot,
)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "good.safetensors"
    save_snapshot(example_snapshot(), path)
    return path


def rejected(path: Path) -> SnapshotError:
    """The error loading ``path`` raises; fails the test if it loads or raises anything else.

    The dump's path (open lazily, then stream every checksum) must refuse the file as well.
    """
    with pytest.raises(SnapshotError) as info:
        load_snapshot(path)
    assert str(path) in str(info.value)
    with pytest.raises(SnapshotError), SnapshotReader(path) as reader:
        reader.verify_checksums()
        reader.verify()
    return info.value


def test_every_header_byte_flip_is_rejected(saved: Path, tmp_path: Path) -> None:
    """Flipping any byte of the header (length, JSON, metadata, padding) fails the load, two ways each."""
    raw = saved.read_bytes()
    damaged = tmp_path / "damaged.safetensors"
    for position in range(header_length(saved)):
        for mask in (0xFF, 1 << (position % 8)):
            data = bytearray(raw)
            data[position] ^= mask
            damaged.write_bytes(data)
            rejected(damaged)


def test_data_byte_flips_are_rejected(saved: Path, tmp_path: Path) -> None:
    """Flipping any single bit in the tensor data fails the load (every byte of one tensor, a sample elsewhere)."""
    raw = saved.read_bytes()
    start = header_length(saved)
    tokens = range(*data_span(saved, "sample.tokens"))
    positions = sorted(set(tokens) | set(random.Random(0).sample(range(start, len(raw)), 300)))
    damaged = tmp_path / "damaged.safetensors"
    for position in positions:
        data = bytearray(raw)
        data[position] ^= 1 << (position % 8)
        damaged.write_bytes(data)
        error = rejected(damaged)
        assert "checksum mismatch" in str(error)


def test_truncation_anywhere_is_rejected(saved: Path, tmp_path: Path) -> None:
    """A file cut short at any length (every header length, a sample of data lengths) fails the load."""
    raw = saved.read_bytes()
    lengths = set(range(header_length(saved) + 16)) | set(random.Random(1).sample(range(len(raw)), 200))
    damaged = tmp_path / "cut.safetensors"
    for length in sorted(lengths - {len(raw)}):
        damaged.write_bytes(raw[:length])
        rejected(damaged)


def test_appended_bytes_are_rejected(saved: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "long.safetensors"
    damaged.write_bytes(saved.read_bytes() + b"\x00")
    assert "belong to none" in str(rejected(damaged))


def test_newer_version_is_refused_clearly(saved: Path, tmp_path: Path) -> None:
    """A file claiming format_version 2 is refused with a message that says to upgrade."""
    newer = rewrite(saved, tmp_path / "v2.safetensors", metadata=lambda m: m.update(format_version="2"))
    error = rejected(newer)
    assert error.field == "format_version"
    assert "newer partial-rollout" in str(error) and "Upgrade partial-rollout" in str(error)
    for bad in ("0", "x", "1.0", ""):
        other = rewrite(saved, tmp_path / "bad.safetensors", metadata=lambda m, bad=bad: m.update(format_version=bad))
        assert rejected(other).field == "format_version"


def test_other_safetensors_files_are_refused(tmp_path: Path) -> None:
    """Model weights or another format's file are not mistaken for a snapshot."""
    weights = tmp_path / "model.safetensors"
    save_file({"w": np.zeros(3, np.float32)}, weights, metadata={"format": "pt"})
    error = rejected(weights)
    assert error.field == "format" and "not a partial-rollout snapshot" in str(error)
    save_file({"w": np.zeros(3, np.float32)}, weights)
    assert rejected(weights).field == "format"


def edit_array(name: str, fn):
    def apply(arrays: dict[str, np.ndarray]) -> None:
        arrays[name] = fn(arrays[name].copy())

    return apply


def setitem(index: int, value: float):
    def apply(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array

    return apply


def set_group_ids(arrays: dict[str, np.ndarray], ids: list[str]) -> None:
    encoded = [i.encode("utf-8", "surrogateescape") for i in ids]
    arrays["group.id_bytes"] = np.frombuffer(b"".join(encoded), np.uint8).copy()
    arrays["group.id_offsets"] = np.cumsum([0] + [len(e) for e in encoded]).astype(np.int64)


# Each case breaks one rule with every checksum recomputed, so the rule itself must catch it.
SEMANTIC_CASES = {
    "missing tensor": (dict(tensors=lambda a: a.pop("sample.logprobs")), "sample.logprobs", "tensor missing"),
    "unknown tensor": (
        dict(tensors=lambda a: a.update({"sample.extra": np.zeros(1, np.uint8)})),
        "sample.extra",
        "unknown tensors",
    ),
    "wrong dtype": (
        dict(tensors=edit_array("sample.tokens", lambda x: x.astype(np.int64))),
        "sample.tokens",
        "dtype is int64",
    ),
    "wrong length": (dict(tensors=edit_array("sample.seed", lambda x: x[:-1])), "sample.seed", "entries"),
    "two-dimensional": (
        dict(tensors=edit_array("group.state", lambda x: x.reshape(1, -1))),
        "group.state",
        "one-dimensional",
    ),
    "offsets not monotone": (
        dict(tensors=edit_array("sample.token_offsets", setitem(4, 0))),
        "sample.token_offsets",
        "decrease",
    ),
    "offsets past the data": (
        dict(tensors=edit_array("group.prompt_offsets", setitem(-1, 999))),
        "group.prompt_offsets",
        "must run from 0",
    ),
    "empty group": (dict(tensors=edit_array("group.sample_offsets", setitem(1, 0))), "group.sample_offsets", "empty"),
    "bad state code": (dict(tensors=edit_array("sample.state", setitem(0, 7))), "sample.state", "outside 0..2"),
    "bad table code": (
        dict(tensors=edit_array("sample.finish_reason", setitem(0, 5))),
        "sample.finish_reason",
        "outside -1..",
    ),
    "flag not 0/1": (dict(tensors=edit_array("sample.has_seed", setitem(0, 2))), "sample.has_seed", "outside 0..1"),
    "runs do not add up": (
        dict(tensors=edit_array("sample.version_run_lengths", setitem(0, 99))),
        "sample.version_run_lengths",
        "add up",
    ),
    "version after policy": (
        dict(tensors=edit_array("sample.version_run_values", setitem(0, 4))),
        "sample.version_run_values",
        "outside 0..3",
    ),
    "token id past vocab": (
        dict(tensors=edit_array("sample.tokens", setitem(0, 1000))),
        "snapshot",
        "fingerprints.vocab_size",
    ),
    "positive logprob": (
        dict(tensors=edit_array("sample.logprobs", setitem(0, 0.5))),
        "sample partial-1/0",
        "finite and <= 0",
    ),
    "nan logprob": (
        dict(tensors=edit_array("sample.logprobs", setitem(2, np.nan))),
        "sample partial-1/0",
        "finite and <= 0",
    ),
    "prefix over max_tokens": (
        dict(metadata=lambda m: m.update(tables=m["tables"].replace('"max_tokens":64', '"max_tokens":4'))),
        "sample partial-1/1",
        "exceed sampling.max_tokens",
    ),
    "malformed JSON": (dict(metadata=lambda m: m.update(tables="{not json")), "tables", "not valid JSON"),
    "malformed group data": (
        dict(tensors=edit_array("group.data_bytes", setitem(0, ord("[")))),
        "group.data_bytes",
        "not valid UTF-8 JSON",
    ),
    "unknown metadata key": (dict(metadata=lambda m: m.update(extra="1")), "__metadata__", "unknown metadata keys"),
    "missing metadata key": (dict(metadata=lambda m: m.pop("counters")), "__metadata__", "missing metadata keys"),
    "bad fingerprints": (
        dict(metadata=lambda m: m.update(fingerprints='{"model": "x"}')),
        "fingerprints",
        "missing fingerprint keys",
    ),
    "negative counter": (dict(metadata=lambda m: m.update(counters='{"yielded": -1}')), "counters", "non-negative"),
    "seed in table": (
        dict(metadata=lambda m: m.update(tables=m["tables"].replace('"max_tokens":10', '"max_tokens":10,"seed":1'))),
        "tables.sampling[1]",
        "seeds are stored in sample.seed",
    ),
    "duplicate group id": (
        dict(tensors=lambda a: set_group_ids(a, ["pending-0", "partial-1", "ready-3", "ready-3"])),
        "group.id_bytes",
        "appears twice",
    ),
    "group id not UTF-8": (
        dict(tensors=lambda a: set_group_ids(a, ["pending-0", "partial-1", "\udcff", "ready-3"])),
        "group.id_bytes",
        "UTF-8",
    ),
    "loader tensor unreferenced": (
        dict(tensors=lambda a: a.update({"loader.9": np.zeros(1, np.uint8)})),
        "loader_state",
        "not referenced",
    ),
    "pending group with tokens": (
        dict(tensors=edit_array("sample.state", setitem(0, 1))),
        "group 'pending-0'",
        "every sample of a pending group",
    ),
}


@pytest.mark.parametrize("case", sorted(SEMANTIC_CASES))
def test_each_broken_rule_is_named(saved: Path, tmp_path: Path, case: str) -> None:
    """Every rule of the format, broken alone with valid checksums, is caught and names its field."""
    edits, field, message = SEMANTIC_CASES[case]
    error = rejected(rewrite(saved, tmp_path / "bad.safetensors", **edits))
    assert error.field == field, str(error)
    assert message in str(error)


def test_checksum_of_a_tensor_must_match(saved: Path, tmp_path: Path) -> None:
    """A valid-looking edit of a tensor, with the old checksums kept, is caught and names the tensor."""
    arrays, metadata = read_file(saved)
    arrays["sample.reward"] = arrays["sample.reward"] + 1.0
    container.write_file(tmp_path / "edited.safetensors", arrays, metadata)
    error = rejected(tmp_path / "edited.safetensors")
    assert error.field == "sample.reward" and "checksum mismatch" in str(error)


def test_header_offsets_past_the_end(saved: Path, tmp_path: Path) -> None:
    """A header whose data_offsets point past the end of the file names the tensor."""

    def grow(header: dict) -> None:
        header["sample.tokens"]["data_offsets"][1] += 10_000_000
        header["sample.tokens"]["shape"][0] += 2_500_000

    error = rejected(patch_header(saved, tmp_path / "past.safetensors", grow))
    assert error.field == "sample.tokens" and "past the end" in str(error)


def test_fingerprint_mismatch_names_the_field(saved: Path) -> None:
    """load_snapshot(expect=...) refuses another tokenizer, model, vocab or vLLM, naming the field."""
    assert load_snapshot(saved, expect=fingerprints(model_path="/elsewhere")) is not None  # model_path is informational
    for field, value in (
        ("tokenizer", "sha256:other"),
        ("model", "sha256:other"),
        ("vocab_size", 2000),
        ("vllm_version", "0.99"),
    ):
        with pytest.raises(SnapshotError) as info:
            load_snapshot(saved, expect=fingerprints(**{field: value}))
        assert info.value.field == f"fingerprints.{field}"
        assert repr(value) in str(info.value)
    with pytest.raises(SnapshotError, match=r"fingerprints\.extra\.world_size"):
        load_snapshot(saved, expect=fingerprints(extra={"world_size": "8"}))


def test_a_snapshot_of_another_vllm_resumes_only_on_request_and_inexactly(saved: Path) -> None:
    """Never stranded, never silently exact: refused naming both versions and the override, or loaded
    with every in-flight sample's sampler state dropped and the change declared."""
    other = fingerprints(vllm_version="0.99")
    with pytest.raises(SnapshotError, match=r"saved under vLLM '0\.32\.0' but this run has '0\.99'.*allow_vllm_change"):
        load_snapshot(saved, expect=other)
    original = load_snapshot(saved)
    assert any(s.sampler_state for _, s in original.iter_samples(SampleState.IN_FLIGHT)), "fixture has sampler states"
    with pytest.warns(UserWarning, match="continue inexactly"):
        moved = load_snapshot(saved, expect=other, allow_vllm_change=True)
    for (_, before), (_, after) in zip(original.iter_samples(), moved.iter_samples(), strict=True):
        np.testing.assert_array_equal(after.token_ids, before.token_ids)
        if before.state is SampleState.IN_FLIGHT:
            assert after.sampler_state is None
            assert after.inexact == (before.inexact or "saved under vLLM 0.32.0, continued under vLLM 0.99")
        else:
            assert after == before
    with pytest.raises(SnapshotError, match=r"fingerprints\.tokenizer"):  # the override covers vLLM only
        load_snapshot(saved, expect=fingerprints(vllm_version="0.99", tokenizer="sha256:other"), allow_vllm_change=True)


def test_find_snapshot_in_folders(tmp_path: Path) -> None:
    """A folder lookup finds only the real file: leftover temporaries of a killed save never count."""
    (tmp_path / f".{SNAPSHOT_FILENAME}.0123abcd.tmp").write_bytes(b"half written")
    with pytest.raises(SnapshotError, match="no partial_rollouts.safetensors in this folder"):
        find_snapshot(tmp_path)
    with pytest.raises(SnapshotError, match="no such file or folder"):
        find_snapshot(tmp_path / "missing")
    save_snapshot(example_snapshot(), tmp_path)
    assert find_snapshot(tmp_path) == tmp_path / SNAPSHOT_FILENAME
    assert load_snapshot(tmp_path).trainer_step == 7


def test_lazy_reader_checks_structure_on_open(saved: Path, tmp_path: Path) -> None:
    """Opening verifies the structural tensors; payload checksums wait for verify_checksums() or verify()."""
    raw = bytearray(saved.read_bytes())
    start, _ = data_span(saved, "sample.state")
    raw[start] ^= 1
    (tmp_path / "s.safetensors").write_bytes(raw)
    with pytest.raises(SnapshotError, match=r"sample\.state: checksum mismatch"):
        SnapshotReader(tmp_path / "s.safetensors")

    raw = bytearray(saved.read_bytes())
    start, _ = data_span(saved, "sample.logprobs")
    raw[start] ^= 1
    (tmp_path / "p.safetensors").write_bytes(raw)
    with SnapshotReader(tmp_path / "p.safetensors") as reader:
        assert reader.num_samples == 8
        with pytest.raises(SnapshotError, match=r"sample\.logprobs: checksum mismatch"):
            reader.verify_checksums()
        with pytest.raises(SnapshotError, match=r"sample\.logprobs: checksum mismatch"):
            reader.verify()
    with SnapshotReader(saved) as reader:
        reader.verify_checksums()  # an intact file passes the streamed check


def nested(depth: int) -> str:
    """JSON lists nested ``depth`` deep: a few hundred kB that make ``json.loads`` recurse past Python's limit."""
    return "[" * depth + "]" * depth


def set_group_data(arrays: dict[str, np.ndarray], data: list[bytes]) -> None:
    arrays["group.data_bytes"] = np.frombuffer(b"".join(data), np.uint8).copy()
    arrays["group.data_offsets"] = np.cumsum([0] + [len(d) for d in data]).astype(np.int64)


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deeply_nested_json_is_refused_naming_the_field(saved: Path, tmp_path: Path, depth: int) -> None:
    """Nesting that makes Python's JSON parser (or the loader-state decoder) recurse too deep is a
    SnapshotError naming the field, never a RecursionError."""
    raw = saved.read_bytes()
    length = header_length(saved) - 8
    header = b'{"deep":' + nested(depth).encode() + b"," + raw[8 : 8 + length].rstrip()[1:]
    header += b" " * (-len(header) % 8)
    deep_header = tmp_path / "header.safetensors"
    deep_header.write_bytes(struct.pack("<Q", len(header)) + header + raw[8 + length :])
    error = rejected(deep_header)
    assert error.field == "header" and "nested too deeply" in str(error)

    for key in ("metadata", "loader_state", "tables"):
        error = rejected(
            rewrite(saved, tmp_path / f"{key}.safetensors", metadata=lambda m, key=key: m.update({key: nested(depth)}))
        )
        assert error.field == key and "nested too deeply" in str(error), str(error)

    data = [b'{"task":"math"}', nested(depth).encode(), b"{}", b"{}"]
    error = rejected(rewrite(saved, tmp_path / "data.safetensors", tensors=lambda a: set_group_data(a, data)))
    assert error.field == "group.data_bytes" and "nested too deeply" in str(error), str(error)


LOADER_TREES = {
    "unknown numpy dtype": (
        {"__type__": "tensor", "framework": "numpy", "dtype": "float128", "name": "loader.0"},
        "unknown numpy dtype",
    ),
    "dtype not a string": (
        {"__type__": "tensor", "framework": "numpy", "dtype": ["uint8"], "name": "loader.0"},
        "unknown numpy dtype",
    ),
    "unknown torch dtype": (
        {"__type__": "tensor", "framework": "torch", "dtype": "float99", "name": "loader.0"},
        "unknown torch dtype",
    ),
    "torch alias": (
        {"__type__": "tensor", "framework": "torch", "dtype": "half", "name": "loader.0"},
        "unknown torch dtype",
    ),
    "torch complex128": (
        {"__type__": "tensor", "framework": "torch", "dtype": "complex128", "name": "loader.0"},
        "cannot be stored",
    ),
    "torch quantized": (
        {"__type__": "tensor", "framework": "torch", "dtype": "qint8", "name": "loader.0"},
        "cannot be stored",
    ),
    "unknown framework": (
        {"__type__": "tensor", "framework": {"jax": 1}, "dtype": "uint8", "name": "loader.0"},
        "unknown tensor framework",
    ),
    "scalar dtype unhashable": ({"__type__": "numpy_scalar", "dtype": {"a": 1}, "value": 1}, "unknown numpy dtype"),
    "scalar out of range": ({"__type__": "numpy_scalar", "dtype": "uint8", "value": 300}, "is not a uint8"),
    "tag unhashable": ({"__type__": ["tensor"], "name": "loader.0"}, "malformed tagged value"),
    "float unhashable": ({"__type__": "float", "value": ["nan"]}, "unknown float"),
}


@pytest.mark.parametrize("case", sorted(LOADER_TREES))
def test_a_loader_state_with_an_unknown_dtype_is_refused(saved: Path, tmp_path: Path, case: str) -> None:
    """A crafted loader_state (dtype unknown, of the wrong type, or out of range) is a SnapshotError
    naming loader_state, never a KeyError, TypeError or OverflowError."""
    node, message = LOADER_TREES[case]
    tree = {"generator": node}
    error = rejected(
        rewrite(saved, tmp_path / "loader.safetensors", metadata=lambda m: m.update(loader_state=json.dumps(tree)))
    )
    assert error.field == "loader_state" and message in str(error), str(error)
