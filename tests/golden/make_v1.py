"""Write the golden format-version-1 snapshot that tests/test_snapshot_golden.py reads bit for bit.

Usage, from the repository root::

    .venv/bin/python -m tests.golden.make_v1              # refuses: the golden files exist
    .venv/bin/python -m tests.golden.make_v1 --force      # overwrite them (a deliberate regeneration)
    .venv/bin/python -m tests.golden.make_v1 --out /tmp/g # write elsewhere (e.g. to check determinism)

(``python tests/golden/make_v1.py ...`` works too.) It builds one deterministic :class:`Snapshot`
that uses every feature of format version 1, saves it with :func:`save_snapshot` as
``partial_rollouts_v1.safetensors``, reads it back, and writes ``partial_rollouts_v1.json``: the
decoded content as plain JSON (every field of every record, arrays as lists, float32 logprobs as
the exact doubles they widen to, bytes as hex) plus the file's size and sha256.

Only a human regenerates the golden files, on purpose. The committed file *is* the definition of
format v1: if the test fails, the code changed what v1 means, which needs a ``FORMAT_VERSION`` bump
and a reader for v1 files, not a new golden file. Regenerate only to cover more of what v1 already
allows, or after a writer change that section 9 of docs/snapshot_format.md lets vary within a
version (tensor order, header padding, JSON key order, table order), and only once the old file
passes every reading check unchanged.

The file's ``writer`` metadata is ``partial-rollout <installed version>``: the one byte range that
depends on the environment (docs/snapshot_format.md, section 9: informational, varies without a
version bump). The test pins it to the golden file's text before comparing bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import struct
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from partial_rollout.snapshot import (
    FORMAT_VERSION,
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    SamplingSpec,
    Snapshot,
    SnapshotReader,
    load_snapshot,
    save_snapshot,
)

HERE = Path(__file__).resolve().parent
SNAPSHOT_NAME = "partial_rollouts_v1.safetensors"
EXPECTED_NAME = "partial_rollouts_v1.json"
VOCAB = 32000
POLICY_VERSION = 7
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Logprobs that float32 stores with rounding (-0.1), signed zeros, a subnormal and the extremes,
# so a reader that converts through another type changes bits.
LOGPROBS = [-0.1, -2.5, -1e-8, -0.0, 0.0, -1e-45, -3.4028234663852886e38, -12.345678, -0.693147]


def _sha(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _philox_state(seed: int, offset: int) -> bytes:
    """A 16-byte ``torch.Generator(cuda)``-style state (seed, offset): opaque to the format."""
    return struct.pack("<QQ", seed & (2**64 - 1), offset)


def _sampling_specs() -> dict[str, SamplingSpec]:
    return {
        # every named field away from its default, and nested extra options
        "full": SamplingSpec(
            max_tokens=64,
            temperature=0.7,
            top_p=0.95,
            top_k=50,
            min_p=0.05,
            min_tokens=2,
            stop=("</answer>", "\n\nUser:", "\u505c"),
            stop_token_ids=(2, VOCAB - 1),
            ignore_eos=False,
            presence_penalty=0.5,
            frequency_penalty=-0.25,
            repetition_penalty=1.1,
            logprobs=5,
            extra={
                "bad_words": ["foo", "bar baz"],
                "include_stop_str_in_output": True,
                "truncate_prompt_tokens": 512,
                "structured_outputs": {"json": {"type": "object", "required": ["answer"], "minimum": -1.5}},
                "allowed_token_ids": None,
            },
        ),
        "defaults": SamplingSpec(max_tokens=16),
        "greedy": SamplingSpec(max_tokens=8, temperature=0.0, ignore_eos=True, stop_token_ids=(0,), top_k=-1),
        "tight": SamplingSpec(max_tokens=3, min_tokens=3, top_p=0.5, repetition_penalty=0.8, presence_penalty=-2.0),
    }


def _sample(index: int, state: SampleState, spec: SamplingSpec, tokens: list[int], **fields: Any) -> SampleRecord:
    versions = fields.pop("versions", [POLICY_VERSION] * len(tokens))
    return SampleRecord(
        index=index,
        state=state,
        sampling=spec,
        token_ids=np.array(tokens, dtype=np.int32),
        logprobs=np.array([LOGPROBS[(index + i) % len(LOGPROBS)] for i in range(len(tokens))], dtype=np.float32),
        versions=np.array(versions, dtype=np.int32),
        **fields,
    )


def _groups() -> list[GroupRecord]:
    spec = _sampling_specs()
    full, defaults, greedy, tight = spec["full"], spec["defaults"], spec["greedy"], spec["tight"]
    return [
        GroupRecord(
            group_id="pending-0",
            prompt_token_ids=[1, 2, 3],
            data={
                "task": "math",
                "answer": "42",
                "meta": {"difficulty": 3, "tags": ["algebra", "\u00e9t\u00e9"], "source": None, "weight": 0.25},
                "big": 2**70,
                "ok": True,
                "empty": {"list": [], "dict": {}},
            },
            state=GroupState.PENDING,
            samples=[
                # same parameters, other seeds: one table entry, per-sample seeds (0 is a seed, not "none")
                _sample(0, SampleState.NOT_STARTED, full.with_seed(0), []),
                _sample(1, SampleState.NOT_STARTED, full.with_seed(-7), []),
            ],
        ),
        GroupRecord(
            group_id="pending-unseeded",
            prompt_token_ids=[0],
            state=GroupState.PENDING,
            samples=[_sample(0, SampleState.NOT_STARTED, defaults, [])],
        ),
        GroupRecord(
            group_id="flight/\u03b1-1",
            prompt_token_ids=[5, 6, 7, 8, VOCAB - 1],
            data={"task": "code", "tests": [{"in": "1 2\n", "out": "3\n"}], "unicode": "\u65e5\u672c\u8a9e \u202e"},
            state=GroupState.IN_FLIGHT,
            dispatch_version=5,
            samples=[
                _sample(
                    0,
                    SampleState.FINISHED,
                    full.with_seed(1001),
                    [10, 11, 2],
                    versions=[5, 5, 6],
                    finish_reason="stop",
                    stop_reason=2,
                    reward=1.0,
                ),
                _sample(
                    1,
                    SampleState.IN_FLIGHT,
                    full.with_seed(1002),
                    [20, 21, 22, 23, 24],
                    versions=[5, 5, 6, 6, 7],
                    sampler_state=_philox_state(1002, 20),
                ),
                _sample(2, SampleState.IN_FLIGHT, full.with_seed(1003), []),  # scheduled, nothing generated yet
                _sample(3, SampleState.NOT_STARTED, full.with_seed(1004), []),
                _sample(
                    4,
                    SampleState.FINISHED,
                    full.with_seed(1005),
                    [40, 41, 42, 43],
                    versions=[6, 6, 6, 7],
                    finish_reason="stop",
                    stop_reason="</answer>",
                    reward=-0.5,
                ),
                _sample(
                    5,
                    SampleState.IN_FLIGHT,
                    full.with_seed(INT64_MIN),
                    [50, 51],
                    versions=[7, 7],
                    sampler_state=_philox_state(INT64_MIN, 8),
                    inexact="presence_penalty counts only output tokens",
                ),
            ],
        ),
        GroupRecord(
            group_id="flight-2",
            prompt_token_ids=[9, 9, 9],
            data={"n": 1},
            state=GroupState.IN_FLIGHT,
            dispatch_version=0,
            samples=[
                _sample(
                    0,
                    SampleState.IN_FLIGHT,
                    greedy,
                    [0, 1, 2, 3, 4, VOCAB - 1],
                    versions=[0, 0, 3, 3, 3, 7],
                    inexact="saved under vLLM 0.31.0, continued under vLLM 0.32.0",
                )
            ],
        ),
        GroupRecord(
            group_id="ready-3",
            prompt_token_ids=[12, 13],
            data={"score": [0.5, -0.0, 1e300]},
            state=GroupState.READY,
            dispatch_version=4,
            samples=[
                _sample(0, SampleState.FINISHED, tight.with_seed(INT64_MAX), [60, 61, 62], finish_reason="length"),
                _sample(
                    1,
                    SampleState.FINISHED,
                    defaults,
                    [70, 2],
                    versions=[4, 4],
                    finish_reason="stop",
                    stop_reason="2",  # the string "2", a different table entry than the token id 2
                    reward=5e-324,
                ),
                _sample(2, SampleState.FINISHED, defaults, [], finish_reason="abort"),  # no tokens, no reward
                _sample(3, SampleState.FINISHED, defaults, [80], finish_reason="\u505c\u6b62", reward=-0.0),
            ],
        ),
        GroupRecord(
            group_id="ready-4",
            prompt_token_ids=[14],
            state=GroupState.READY,
            dispatch_version=POLICY_VERSION,
            samples=[
                _sample(
                    0,
                    SampleState.FINISHED,
                    full.with_seed(INT64_MAX),
                    [90, VOCAB - 1],
                    finish_reason="stop",
                    stop_reason=VOCAB - 1,
                    reward=1e300,
                    inexact="presence_penalty counts only output tokens",
                )
            ],
        ),
    ]


def _loader_state() -> dict[str, Any]:
    """A loader state with every tag of the codec (docs/snapshot_format.md, section 8).

    Tensors of every rank the format allows (0-d included), and ``np.float64`` scalars next to plain
    floats: ``np.float64`` subclasses ``float``, yet it is a numpy scalar and must come back as one.
    """
    return {
        "_num_yielded": 30,
        "_sampler_iter_yielded": 2**65,
        "fraction": 0.1,
        "special": [math.nan, math.inf, -math.inf],
        "flags": [True, False, None],
        "name": "\u00e9pisode \u202e\x1b",
        "tuple": (1, "a", (2.5, None)),
        "int_keys": {0: "a", -1: "b", 2**70: "c"},
        "mixed_keys": {None: 1, 1.5: 2, (1, "x"): 3, "s": 4},
        "reserved": {"__type__": "not a tag", "x": 1},
        "ordered": OrderedDict([("b", 1), ("a", 2)]),
        "bytes": b"\x00\xffabc",
        "empty_bytes": b"",
        "numpy_scalars": [
            np.float64(0.1),  # a float subclass: tagged numpy_scalar all the same, unlike "fraction"
            np.float64(-math.inf),
            np.int64(-3),
            np.float32(0.1),
            np.float32(math.nan),
            np.float16(-0.0),
            np.uint8(255),
            np.bool_(1),
        ],
        "numpy": {
            "f32_2d": np.array([[0.1, math.nan], [math.inf, -0.0]], dtype=np.float32),
            "f16_empty": np.zeros((0, 3), dtype=np.float16),
            "bool": np.array([True, False]),
            "c64": np.array([1 + 2j, -0.5j], dtype=np.complex64),
            "u16": np.array([0, 65535], dtype=np.uint16),
            "i8": np.array([-128, 127], dtype=np.int8),
            "i64_0d": np.array(INT64_MIN, dtype=np.int64),  # 0-d: shape [] in the header
        },
        "torch": {
            "generator": torch.arange(16, dtype=torch.uint8),
            "bf16": torch.tensor([1.5, -2.0, math.nan], dtype=torch.bfloat16),
            "f8": torch.tensor([0.5, -1.0]).to(torch.float8_e4m3fn),
            "i32_2d": torch.arange(6, dtype=torch.int32).reshape(2, 3),
            "f64_0d": torch.tensor(-0.1, dtype=torch.float64),
        },
    }


def build_snapshot() -> Snapshot:
    """The golden snapshot: every group state, sample state and optional field of format v1."""
    return Snapshot(
        trainer_step=1234567890123,
        policy_version=POLICY_VERSION,
        fingerprints=Fingerprints(
            model=_sha("golden model"),
            tokenizer=_sha("golden tokenizer"),
            vocab_size=VOCAB,
            vllm_version="0.32.0",
            model_path="/models/golden-tiny",
            logprobs_kind="processed_logprobs",
            sampler="torch.Generator(cuda)",
            sampler_state_bytes=16,
            max_model_len=4096,
            extra={"dp_size": "2", "chat_template": _sha("template")},
        ),
        groups=_groups(),
        loader_state=_loader_state(),
        counters={"yielded": 40, "consumed": 31, "evicted": 2, "dispatched_twice": 0},
        evicted_by_reason={"too_stale": 1, "over_budget": 1},
        metadata={
            "run": "golden-v1",
            "config_hash": _sha("config"),
            "nested": {"list": [1, 2.5, None, True, "x"], "empty": {}, "text": "\u65e5\u672c \u00e9 \u202e \x1b"},
            "big": 2**64,
        },
    )


# -- the expectation, as plain JSON ------------------------------------------------------------


def plain_value(value: Any) -> Any:
    """A loader-state value as plain JSON: every non-JSON type tagged by a one-key object (the test reads
    the loaded state back through this same form)."""
    if isinstance(value, torch.Tensor):
        raw = value.contiguous().flatten().view(torch.uint8).numpy().tobytes()
        dtype = str(value.dtype).removeprefix("torch.")
        return {"torch": {"dtype": dtype, "shape": list(value.shape), "hex": raw.hex()}}
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
    if isinstance(value, dict):
        return {"dict": [[plain_value(k), plain_value(v)] for k, v in value.items()]}
    raise TypeError(f"no plain form for {type(value).__name__}")


def _sample_json(sample: SampleRecord) -> dict[str, Any]:
    return {
        "index": sample.index,
        "state": sample.state.value,
        "sampling": sample.sampling.to_json(),
        "token_ids": sample.token_ids.tolist(),
        "logprobs": sample.logprobs.tolist(),  # float32 -> the double it widens to, exactly
        "versions": sample.versions.tolist(),
        "finish_reason": sample.finish_reason,
        "stop_reason": sample.stop_reason,
        "reward": sample.reward,
        "sampler_state": None if sample.sampler_state is None else sample.sampler_state.hex(),
        "inexact": sample.inexact,
    }


def expectation(path: Path) -> dict[str, Any]:
    """The decoded content of the snapshot at ``path``, with its size and sha256."""
    snap = load_snapshot(path)
    with SnapshotReader(path) as reader:
        writer, version, tables = reader.writer, reader.format_version, reader.tables
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    tensors = {name: [e["dtype"], e["shape"]] for name, e in sorted(header.items()) if name != "__metadata__"}
    return {
        "_about": "The decoded content of the file, written by tests/golden/make_v1.py: do not edit.",
        "file": path.name,
        "size": len(raw),
        "sha256": hashlib.sha256(raw).hexdigest(),
        "format": "partial-rollout-snapshot",
        "format_version": version,
        "writer": writer,
        "tensors": tensors,
        "trainer_step": snap.trainer_step,
        "policy_version": snap.policy_version,
        "fingerprints": snap.fingerprints.to_json(),
        "counters": snap.counters,
        "evicted_by_reason": snap.evicted_by_reason,
        "metadata": snap.metadata,
        "tables": tables,
        "counts": snap.counts(),
        "loader_state": plain_value(snap.loader_state),
        "groups": [
            {
                "group_id": g.group_id,
                "prompt_token_ids": g.prompt_token_ids.tolist(),
                "data": g.data,
                "state": g.state.value,
                "dispatch_version": g.dispatch_version,
                "samples": [_sample_json(s) for s in g.samples],
            }
            for g in snap.groups
        ],
    }


def dumps(value: Any, depth: int = 0) -> str:
    """JSON with one item per line down to depth 4; what fits in 110 characters or lies deeper stays on one line."""
    flat = json.dumps(value, ensure_ascii=True, allow_nan=False)
    if depth > 4 or 2 * depth + len(flat) <= 110 or not isinstance(value, (dict, list)) or not value:
        return flat
    inner = "  " * (depth + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=True)}: {dumps(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * depth + "}"
    return "[\n" + ",\n".join(inner + dumps(v, depth + 1) for v in value) + "\n" + "  " * depth + "]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write into (default: tests/golden)")
    parser.add_argument("--force", action="store_true", help="overwrite existing golden files")
    args = parser.parse_args(argv)
    if FORMAT_VERSION != 1:
        parser.error(f"this code writes format version {FORMAT_VERSION}; the v1 golden file must stay as committed")
    snapshot_path, expected_path = args.out / SNAPSHOT_NAME, args.out / EXPECTED_NAME
    existing = [str(p) for p in (snapshot_path, expected_path) if p.exists()]
    if existing and not args.force:
        parser.error(f"{', '.join(existing)} exist; the golden files are regenerated only on purpose (--force)")
    args.out.mkdir(parents=True, exist_ok=True)
    snapshot = build_snapshot()
    save_snapshot(snapshot, snapshot_path)
    if load_snapshot(snapshot_path) != snapshot:
        raise SystemExit(f"{snapshot_path} does not load back equal to what was saved")
    expected = expectation(snapshot_path)
    expected_path.write_text(dumps(expected) + "\n", encoding="utf-8")
    print(f"{snapshot_path}: {expected['size']} bytes, sha256 {expected['sha256']}")
    print(f"{expected_path}: expected content")
    return 0


if __name__ == "__main__":
    sys.exit(main())
