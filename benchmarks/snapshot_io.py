"""Snapshot I/O throughput: save, load (full validation), dump summary, verify; and the in-memory cut.

Builds a synthetic snapshot of in-flight samples (GRPO groups of 8, 256-token prompts, random
tokens and logprobs, a weight update half-way through every fourth sample, 5056-byte sampler
states like a torch MT19937 generator's) and times each operation on it. Before every read the
file's pages are dropped from the page cache (``posix_fadvise(DONTNEED)``), so reads come from the
disk; a plain ``write + fsync`` and ``read`` of the same number of bytes give the disk's own speed
for comparison.

**The frozen window** (``frozen_window`` in the JSON): what a checkpoint does while the engine
stands still, at the same size, with the real code on synthetic requests: the engine adapter turns
each live request's token buffers into an in-flight record (``engine/cut.py``), the ledger takes
them (``WorkLedger.capture``) and cuts its groups into memory (``WorkLedger.cut``). The save above
runs after the engine resumes, so it is not part of the stall.

Usage::

    python -m benchmarks.snapshot_io [--samples 10000] [--tokens 2000] [--repeats 3]
                                     [--out benchmarks/results/snapshot_io.json]
    python -m benchmarks.snapshot_io --cut-only --out benchmarks/results/snapshot_cut.json
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from partial_rollout.atomic import atomic_write
from partial_rollout.cli import main as cli_main
from partial_rollout.engine.cut import in_flight_record
from partial_rollout.engine.live import LiveRequest
from partial_rollout.ledger import WorkLedger, request_id
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


def frozen_window(snapshot: Snapshot, repeats: int) -> dict[str, Any]:
    """Seconds of the in-memory cut of ``snapshot``'s samples, as a checkpoint takes it in its frozen window."""
    live: dict[str, LiveRequest] = {}
    ledger = WorkLedger()
    for group in snapshot.groups:
        ledger.yield_group(group.group_id, group.prompt_token_ids, [s.sampling for s in group.samples])
        ledger.dispatch(group.group_id, group.dispatch_version)
        for sample in group.samples:
            versions = sample.versions
            req = LiveRequest(index=sample.index, sampling=sample.sampling, base=None, policy_version=int(versions[0]))
            if versions[0] != versions[-1]:  # the weight update half-way through
                req.mark_version(int(versions[-1]))
            req.token_ids.frombytes(sample.token_ids.tobytes())
            req.logprobs.frombytes(sample.logprobs.tobytes())
            req.versions.frombytes(versions.tobytes())
            live[request_id(group.group_id, sample.index)] = req
    cut: dict[str, SampleRecord] = {}

    def engine_records() -> None:
        cut.clear()
        for rid, req in live.items():
            cut[rid] = in_flight_record(req, seeded=None)

    def ledger_cut() -> None:
        ledger.capture(cut)
        taken = ledger.cut(
            "unused.safetensors",
            trainer_step=1,
            policy_version=100,
            fingerprints=snapshot.fingerprints,
            loader_state={"cursor": 1250},
            metadata={"epoch": 0},
        )
        ledger.record_save(taken)  # no event log here: this only closes the cut; nothing is written

    seconds = {
        "engine_records": best_of(repeats, "engine records", engine_records),
        "ledger_capture_and_cut": best_of(repeats, "ledger capture + cut", ledger_cut),
    }
    cpu = {
        "engine_records": best_of(repeats, "engine records (CPU)", engine_records, clock=time.thread_time),
        "ledger_capture_and_cut": best_of(repeats, "ledger capture + cut (CPU)", ledger_cut, clock=time.thread_time),
    }
    seconds["total"] = sum(seconds.values())
    cpu["total"] = sum(cpu.values())
    return {
        "seconds": {k: round(v, 4) for k, v in seconds.items()},
        "cpu_seconds": {k: round(v, 4) for k, v in cpu.items()},
        "notes": (
            "Best of `repeats`; seconds are wall-clock, cpu_seconds the thread's CPU time (what the work costs"
            " on a core of its own, when other jobs share the machine). engine_records: the adapter's"
            " in-flight record of every live request"
            " (engine/cut.py in_flight_record: copies of the token and logprob buffers, versions, exactness;"
            " and each record's own checks, which read every token);"
            " ledger_capture_and_cut: WorkLedger.capture of those records plus WorkLedger.cut (copies of the"
            " group entries, loader cursor, manifest; no I/O). Both run inside the engine's frozen window;"
            " the pause and resume RPCs and the step the engine finishes first come on top (measured on the real"
            " engine in the save events). The snapshot save is after resume()."
        ),
    }


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache so the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def best_of(
    repeats: int,
    label: str,
    fn: Callable[[], Any],
    *,
    before: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """The shortest of ``repeats`` runs of ``fn`` (each after ``before``) timed on ``clock``: the least disturbed."""
    times = []
    for _ in tqdm(range(repeats), desc=label, unit="run", file=sys.stderr, leave=False):
        before()
        start = clock()
        fn()
        times.append(clock() - start)
    return min(times)


def run(num_samples: int, num_tokens: int, folder: Path, repeats: int) -> dict[str, Any]:
    snapshot = build_snapshot(num_samples, num_tokens)
    path = folder / "partial_rollouts.safetensors"
    load_before = os.getloadavg()[0]
    window = frozen_window(snapshot, repeats)
    save_s = best_of(repeats, "save", functools.partial(save_snapshot, snapshot, path))
    del snapshot
    size = path.stat().st_size

    def load() -> None:
        assert load_snapshot(path).counts()["samples_in_flight"] == num_samples

    def dump() -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli_main(["dump", str(path), "--json"]) == 0

    def verify() -> None:
        with SnapshotReader(path) as reader:
            reader.verify()

    cold = functools.partial(evict, path)
    load_s = best_of(repeats, "load", load, before=cold)
    dump_s = best_of(repeats, "dump summary", dump, before=cold)
    verify_s = best_of(repeats, "verify", verify, before=cold)

    baseline = folder / "baseline.bin"
    payload = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)

    def write_baseline() -> None:
        with open(baseline, "wb") as f:
            f.write(payload.data)  # its memoryview: numpy's stubs type ndarray as a Buffer only on Python >= 3.12
            f.flush()
            os.fsync(f.fileno())

    write_s = best_of(repeats, "baseline write + fsync", write_baseline)
    read_s = best_of(repeats, "baseline read", baseline.read_bytes, before=functools.partial(evict, baseline))

    with SnapshotReader(path) as reader:
        sampler_bytes = int(np.diff(reader.arrays["sample.sampler_state_offsets"]).sum())
        prompt_bytes = reader.arrays["group.prompt_offsets"][-1] * 4
        tokens = reader.num_tokens
    seconds = {
        "save": save_s,
        "load": load_s,
        "dump_summary": dump_s,
        "verify": verify_s,
        "baseline_write_fsync": write_s,
        "baseline_read": read_s,
    }
    return {
        "samples": num_samples,
        "tokens_per_sample": num_tokens,
        "generated_tokens": tokens,
        "sampler_state_bytes_per_sample": SAMPLER_STATE_BYTES,
        "file_bytes": size,
        "bytes_per_token": round((size - sampler_bytes) / tokens, 4),
        "bytes_per_token_without_prompts": round((size - sampler_bytes - prompt_bytes) / tokens, 4),
        "bytes_per_token_with_sampler_state": round(size / tokens, 4),
        "repeats": repeats,
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
        "MB_per_s": {k: round(size / 1e6 / v, 1) for k, v in seconds.items()},
        "frozen_window": window,
        "notes": (
            "Best of `repeats` runs. MB = 1e6 bytes of snapshot file. save includes encoding, fsync and the"
            " atomic rename (the records checked themselves when they were built);"
            " load and verify read, checksum and validate every byte and build every record; dump_summary is"
            " `partial-rollout dump --json` in-process: it streams every byte through its checksum but decodes"
            " only the structural tensors. Page cache evicted (posix_fadvise DONTNEED) before each read."
            " baseline_* write and read the same number of random bytes with plain Python I/O."
        ),
        "machine": _machine(load_before),
    }


def cut_only(num_samples: int, num_tokens: int, repeats: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    window = frozen_window(build_snapshot(num_samples, num_tokens), repeats)
    return {
        "samples": num_samples,
        "tokens_per_sample": num_tokens,
        "repeats": repeats,
        "frozen_window": window,
        "machine": _machine(load_before),
    }


def _machine(load_before: float) -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_at_start": round(load_before, 2),
        "load_average_at_end": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=10_000, help="in-flight samples (default 10000)")
    parser.add_argument("--tokens", type=int, default=2_000, help="generated tokens per sample (default 2000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per operation; the fastest counts (default 3)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON result here too")
    parser.add_argument("--dir", type=Path, default=None, help="folder for the temporary files (default: system temp)")
    parser.add_argument(
        "--cut-only",
        action="store_true",
        help="time only the in-memory cut of the frozen window (no disk I/O; benchmarks/results/snapshot_cut.json)",
    )
    args = parser.parse_args(argv)
    if args.cut_only:
        result = cut_only(args.samples, args.tokens, args.repeats)
    else:
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            result = run(args.samples, args.tokens, Path(folder), args.repeats)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(args.out) as tmp:
            tmp.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
