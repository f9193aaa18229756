"""Snapshot I/O throughput: save, load (full validation), dump summary (lazy), verify.

Builds a synthetic snapshot of in-flight samples (GRPO groups of 8, 256-token prompts, random
tokens and logprobs, a weight update half-way through every fourth sample, 5056-byte sampler
states like a torch MT19937 generator's) and times each operation on it. Before every read the
file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``), so reads come from the
disk; a plain ``write + fsync`` and ``read`` of the same number of bytes give the disk's own speed
for comparison.

Usage::

    python -m benchmarks.snapshot_io [--samples 10000] [--tokens 2000] [--out benchmarks/results/snapshot_io.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from partial_rollout.cli import main as cli_main
from partial_rollout.snapshot import (
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

GROUP_SIZE = 8
PROMPT_TOKENS = 256
SAMPLER_STATE_BYTES = 5056
VOCAB_SIZE = 151_936


def build_snapshot(num_samples: int, num_tokens: int, *, seed: int = 0) -> Snapshot:
    """A snapshot of ``num_samples`` in-flight samples with ``num_tokens`` tokens each."""
    rng = np.random.default_rng(seed)
    policy_version = 100
    total = num_samples * num_tokens
    tokens = rng.integers(0, VOCAB_SIZE, total, dtype=np.int32)
    logprobs = -rng.exponential(1.0, total).astype(np.float32)
    versions = np.full(total, policy_version, dtype=np.int32)
    for s in range(0, num_samples, 4):  # a weight update half-way through every fourth sample
        versions[s * num_tokens : s * num_tokens + num_tokens // 2] = policy_version - 1
    sampler_states = rng.integers(0, 256, num_samples * SAMPLER_STATE_BYTES, dtype=np.uint8).tobytes()
    prompts = rng.integers(0, VOCAB_SIZE, (num_samples // GROUP_SIZE + 1, PROMPT_TOKENS), dtype=np.int32)
    sampling = SamplingSpec(max_tokens=num_tokens * 2, temperature=1.0, top_p=0.95)
    groups = []
    for g, first in enumerate(tqdm(range(0, num_samples, GROUP_SIZE), desc="build", unit="group", file=sys.stderr)):
        samples = []
        for index, s in enumerate(range(first, min(first + GROUP_SIZE, num_samples))):
            span = slice(s * num_tokens, (s + 1) * num_tokens)
            samples.append(
                SampleRecord(
                    index=index,
                    state=SampleState.IN_FLIGHT,
                    sampling=SamplingSpec(max_tokens=sampling.max_tokens, top_p=0.95, seed=s),
                    token_ids=tokens[span],
                    logprobs=logprobs[span],
                    versions=versions[span],
                    sampler_state=sampler_states[s * SAMPLER_STATE_BYTES : (s + 1) * SAMPLER_STATE_BYTES],
                )
            )
        groups.append(
            GroupRecord(
                group_id=f"prompt-{g:06d}",
                prompt_token_ids=prompts[g],
                data={"task": "math", "answer": str(g)},
                state=GroupState.IN_FLIGHT,
                dispatch_version=policy_version - 1,
                samples=samples,
            )
        )
    fingerprints = Fingerprints(model="bench", tokenizer="bench", vocab_size=VOCAB_SIZE, vllm_version="bench")
    return Snapshot(trainer_step=1000, policy_version=policy_version, fingerprints=fingerprints, groups=groups)


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(label: str, fn: Any) -> tuple[float, Any]:
    print(f"{label} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def run(num_samples: int, num_tokens: int, folder: Path) -> dict[str, Any]:
    snapshot = build_snapshot(num_samples, num_tokens)
    path = folder / "partial_rollouts.safetensors"
    save_s, size = timed("save", lambda: save_snapshot(snapshot, path))
    del snapshot
    mb = size / 1e6

    evict(path)
    load_s, loaded = timed("load", lambda: load_snapshot(path))
    assert loaded.counts()["samples_in_flight"] == num_samples
    del loaded

    def dump() -> int:
        with contextlib.redirect_stdout(io.StringIO()):
            return cli_main(["dump", str(path), "--json"])

    evict(path)
    dump_s, status = timed("dump summary", dump)
    assert status == 0

    def verify() -> None:
        with SnapshotReader(path) as reader:
            reader.verify()

    evict(path)
    verify_s, _ = timed("verify", verify)

    baseline = folder / "baseline.bin"
    payload = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)

    def write_baseline() -> None:
        with open(baseline, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    write_s, _ = timed("baseline write + fsync", write_baseline)
    evict(baseline)
    read_s, _ = timed("baseline read", lambda: baseline.read_bytes())

    with SnapshotReader(path) as reader:
        sampler_bytes = int(np.diff(reader.arrays["sample.sampler_state_offsets"]).sum())
        tokens = reader.num_tokens
    return {
        "samples": num_samples,
        "tokens_per_sample": num_tokens,
        "generated_tokens": tokens,
        "sampler_state_bytes_per_sample": SAMPLER_STATE_BYTES,
        "file_bytes": size,
        "bytes_per_token": round((size - sampler_bytes) / tokens, 4),
        "bytes_per_token_with_sampler_state": round(size / tokens, 4),
        "seconds": {
            "save": round(save_s, 3),
            "load": round(load_s, 3),
            "dump_summary": round(dump_s, 3),
            "verify": round(verify_s, 3),
            "baseline_write_fsync": round(write_s, 3),
            "baseline_read": round(read_s, 3),
        },
        "MB_per_s": {
            "save": round(mb / save_s, 1),
            "load": round(mb / load_s, 1),
            "dump_summary": round(mb / dump_s, 1),
            "verify": round(mb / verify_s, 1),
            "baseline_write_fsync": round(mb / write_s, 1),
            "baseline_read": round(mb / read_s, 1),
        },
        "notes": (
            "MB = 1e6 bytes of snapshot file. save includes fsync and the atomic rename; load and verify read,"
            " checksum and validate every byte; dump_summary is `partial-rollout dump --json` in-process, which"
            " reads only the structural tensors (its MB/s is the file size over its time). Page cache evicted"
            " (posix_fadvise DONTNEED) before each read."
        ),
        "machine": {"python": platform.python_version(), "cpu_count": os.cpu_count(), "platform": platform.platform()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000, help="in-flight samples (default 10000)")
    parser.add_argument("--tokens", type=int, default=2_000, help="generated tokens per sample (default 2000)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here too")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the temporary files (default: system temp)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        result = run(args.samples, args.tokens, Path(folder))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
