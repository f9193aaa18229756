"""Resume throughput: continue from saved prefixes vs regenerate vs drop, with the cost of the save.

One workload, one engine configuration, the same seeds, compared within one run. Each repetition
cuts a run with samples in flight (the engine is not paused), saves the snapshot, finishes the
remainder in place (**uninterrupted**), reruns the same workload to the same point without a save
(the **twin**, what the save's cost is measured against), kills the engine, and recovers the same
work on fresh engines by **continue** (from the saved prefixes) and **regenerate** (from scratch);
**drop** loses it. The save's cost is counted in engine decode steps lost, timed on the engine's
side (:mod:`benchmarks.resume.steps`), and in tokens per second around the save against the twin's. Every repetition
checks its figures against the snapshot it wrote (``consistency.passed`` in the JSON is the verdict),
and compares the tokens of continue and of regenerate with the uninterrupted run on the samples in
flight at the cut: regenerate against uninterrupted is the engine's own noise floor (the same
seeded samples generated twice without interruption, in different batches), and a point where
continue matches fewer samples than that is flagged (``exact.beyond_noise_floor``, and a line on
stdout).
The parts: :mod:`benchmarks.resume.workload` (what is generated), :mod:`benchmarks.resume.phases`
(the phases of a repetition), :mod:`benchmarks.resume.measure` (clocks, token counts, checks),
:mod:`benchmarks.resume.report` (the JSON result and its tables).

On this machine the model is the project's tiny Llama (0.4 M parameters), so the timings measure
the engine's per-token and per-step overheads more than model compute; the token counts and
ratios carry over, the absolute seconds do not.

Run from the repository root (the benchmarks are not part of the installed package)::

    python -m benchmarks.resume_throughput              # quick default: a few minutes on 2 CPU cores
    python -m benchmarks.resume_throughput --full       # 16/64/256 in-flight x 128/512/2048 prefix
    python -m benchmarks.resume_throughput --samples 8 --prefix 32 --reps 1 --out /tmp/r   # smoke test

On a GPU with a real model (Hugging Face folder, nothing is downloaded)::

    python -m benchmarks.resume_throughput --full --model /models/Qwen2.5-1.5B-Instruct \\
        --max-model-len 8192 --max-num-seqs 256 --gpu-memory-utilization 0.85 --dtype bfloat16 \\
        --out benchmarks/results/resume_gpu

Writes ``<out>.json`` (machine, versions, config, every figure per repetition, medians and spread)
and the plots ``<out>_recovery.png``, ``<out>_timeline.png`` and ``<out>_ratio.png`` (see :mod:`benchmarks.plots`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from tqdm import tqdm

from benchmarks.resume.figures import collect
from benchmarks.resume.phases import one_rep
from benchmarks.resume.report import assemble, write
from benchmarks.resume.workload import build_workload

RESULTS = Path(__file__).resolve().parent / "results"
QUICK = dict(samples=[32], prefix=[128, 512], reps=3)
FULL = dict(samples=[16, 64, 256], prefix=[128, 512, 2048], reps=3)


def engine_config(args: argparse.Namespace, model: str) -> Any:
    from partial_rollout.engine import EngineConfig

    return EngineConfig(
        model=model,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        kv_cache_memory_bytes=args.kv_cache_bytes,
        gpu_memory_utilization=args.gpu_memory_utilization,
        tensor_parallel_size=args.tensor_parallel_size,
        multiprocessing=args.multiprocessing,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The sweep; the JSON is rewritten after every repetition, so an interrupted run keeps what it measured."""
    if args.model:
        model = args.model
    else:
        from partial_rollout.models import build_tiny_model

        model = str(build_tiny_model())
    config = engine_config(args, model)
    vocab = json.loads((Path(model) / "config.json").read_text()).get("vocab_size")
    points_spec = [
        (n, L, args.reps if n * L < args.big_point else min(args.reps, args.big_reps))
        for n in args.samples
        for L in args.prefix
    ]
    points_spec.sort(key=lambda p: p[0] * p[1])
    workloads = {
        (n, L): build_workload(
            n,
            L,
            group_size=args.group_size,
            prompt_tokens=args.prompt_tokens,
            max_model_len=args.max_model_len,
            vocab_size=vocab,
            seed=args.seed,
        )
        for n, L, _ in points_spec
    }
    results: dict[tuple[int, int], list[dict[str, Any]]] = {(n, L): [] for n, L, _ in points_spec}
    started = time.time()
    # Rounds: every point's first repetition, then every point's second, and so on, so that a
    # deadline costs repetitions evenly and never a whole sweep point.
    with tqdm(
        total=sum(r for _, _, r in points_spec) * 3,
        desc="resume bench",
        unit="phase",
        file=sys.stderr,
        dynamic_ncols=True,
    ) as bar:
        for rep in range(max(r for _, _, r in points_spec)):
            if rep and args.deadline and time.time() > args.deadline:
                break
            for n, length in [(n, length) for n, length, reps in points_spec if rep < reps]:
                if rep and args.deadline and time.time() > args.deadline:
                    tqdm.write(
                        f"deadline reached: no repetition {rep + 1} for {n}x{length} and later points", file=sys.stderr
                    )
                    break
                bar.set_description(f"rep {rep + 1}: {n} in flight x {length} prefix")
                r = await one_rep(config, workloads[n, length], rep, bar)
                results[n, length].append(r)
                tqdm.write(
                    f"{n:>4} x {length:>5} rep {rep}: uninterrupted {r['modes']['uninterrupted']['recovery_s']:.2f}s"
                    f" continue {r['modes']['continue']['recovery_s']:.2f}s"
                    f" regenerate {r['modes']['regenerate']['recovery_s']:.2f}s"
                    f" floor {r['floor']['floor_s']:.2f}s consistent={r['consistent']};"
                    f" save: steps lost {_g(r['save']['steps_lost'])}, after {_g(r['save']['steps_lost_after'])}"
                    f" (no save {_g(r['save']['twin_steps_lost_after'])}),"
                    f" tok/s around vs without {_g(r['save']['tok_s_around_vs_twin'])}",
                    file=sys.stderr,
                )
                write(assemble(args, config, collect(points_spec, results), started), args.out, plots=False)
    return assemble(args, config, collect(points_spec, results), started)


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.resume_throughput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    parser.add_argument("--full", action="store_true", help="the full sweep: --samples 16,64,256 --prefix 128,512,2048")
    parser.add_argument(
        "--samples", type=ints, default=None, help="in-flight samples at the cut, comma-separated (quick: 32)"
    )
    parser.add_argument(
        "--prefix", type=ints, default=None, help="mean prefix lengths L, comma-separated (quick: 128,512)"
    )
    parser.add_argument("--reps", type=int, default=None, help="repetitions per point (default 3)")
    parser.add_argument(
        "--big-point",
        type=int,
        default=256 * 2048,
        help="points with samples x prefix >= this run at most --big-reps reps (default 524288)",
    )
    parser.add_argument("--big-reps", type=int, default=1, help="reps for the biggest points (default 1)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="unix time after which no further repetition starts (every point always gets its first)",
    )
    parser.add_argument("--budget-min", type=float, default=None, help="sets --deadline to now + this many minutes")
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt group (default 4)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output prefix: writes PREFIX.json and PREFIX_*.png "
        "(default benchmarks/results/resume_quick or resume_full)",
    )
    engine = parser.add_argument_group("engine (defaults suit the tiny CPU model; on GPU pass a real --model)")
    engine.add_argument("--model", default=None, help="Hugging Face model folder (default: the project's tiny Llama)")
    engine.add_argument("--dtype", default="bfloat16")
    engine.add_argument("--max-model-len", type=int, default=4096)
    engine.add_argument("--max-num-seqs", type=int, default=256)
    engine.add_argument(
        "--kv-cache-bytes",
        type=int,
        default=None,
        help="KV cache bytes (default 2 GiB on CPU; on GPU unset means --gpu-memory-utilization)",
    )
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    engine.add_argument("--tensor-parallel-size", type=int, default=1)
    engine.add_argument(
        "--multiprocessing",
        action="store_true",
        help="run vLLM's worker in its own process (default: in the engine core)",
    )
    args = parser.parse_args(argv)
    if args.budget_min is not None:
        args.deadline = time.time() + 60 * args.budget_min
    base = FULL if args.full else QUICK
    args.samples = args.samples or base["samples"]
    args.prefix = args.prefix or base["prefix"]
    args.reps = args.reps or base["reps"]
    if args.out is None:
        args.out = RESULTS / ("resume_full" if args.full else "resume_quick")
    if args.kv_cache_bytes is None:
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            args.kv_cache_bytes = 2 * 2**30
    if args.multiprocessing:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # unwind: engines shut down their engine-core processes
    result = asyncio.run(run(args))
    paths = write(result, args.out)
    print(result["markdown"])
    print(
        f"\nconsistency check: {'passed' if result['consistency']['passed'] else 'FAILED'};"
        f" continue redid {result['continue_redone_decode_tokens_max']} decode tokens;"
        f" exact: {result['exact']['all_reps']}"
    )
    for p in result["points"]:
        t = p["summary"]["targets"]
        print(
            f"{'met' if t['steps_lost_met'] else 'NOT MET'}: {p['num_in_flight']}x{p['mean_prefix']}: median engine"
            f" decode steps lost per save {_g(t['steps_lost_median'])} (target <= {t['steps_lost_target']}); in the"
            f" window after it {_g(t['steps_lost_after_median'])},"
            f" without a save {_g(t['twin_steps_lost_after_median'])};"
            f" tokens/s around the save vs without {_g(t['tok_s_around_vs_twin_median'])}"
        )
    for p in result["points"]:
        i = p["summary"]["identity"]
        print(
            f"{'DIVERGENCE BEYOND THE NOISE FLOOR' if i['beyond_noise_floor'] else 'within the noise floor'}:"
            f" {p['num_in_flight']}x{p['mean_prefix']}: continue token-identical to uninterrupted for"
            f" {i['continue_identical']}/{i['samples_in_flight']} samples in flight at the cut, regenerate"
            f" (two uninterrupted runs in different batches) for {i['noise_floor_identical']}"
        )
    for p in paths:
        print(f"wrote {p}")
    return 0 if result["consistency"]["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
