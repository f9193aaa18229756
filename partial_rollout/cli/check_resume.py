"""``partial-rollout check-resume``: prove exact resume on your own model and engine before trusting it.

Runs one workload three times, each in its own process with its own engine:

1. *reference*: uninterrupted;
2. *cut*: the same requests, a checkpoint cut at a random moment (keep-mode pause, sampler state
   captured), the snapshot written, then the process and its engine are killed with SIGKILL;
3. *resume*: a fresh engine loads the snapshot and continues every sample from its prefix.

It then compares each stitched completion with the reference, token by token and logprob by
logprob (within ``--logprob-atol``, the engine's own batch-composition numerics), and prints how many
matched, the first divergence of any that did not, and the pause time.
Exit status 0 only when every sample not declared inexact matched.

Usage::

    partial-rollout check-resume --model DIR [--requests N] [--seed S] [--max-tokens M]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.engine.exactness import BATCH_LOGPROB_TOLERANCE
from partial_rollout.errors import EXIT_FAILURE, EXIT_OK, ConfigError

_RESULT = "result.json"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "check-resume",
        help="check that interrupted generations continue exactly on this model and engine",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_workload_args(p)
    p.add_argument("--keep", default=None, help="keep the work folder (snapshot, results) here")
    p.add_argument(
        "--logprob-atol",
        type=float,
        default=BATCH_LOGPROB_TOLERANCE,
        help="largest |logprob difference| still counted as a match (default %(default)s). vLLM kernels are "
        "not batch-invariant: a request's logprobs move in the last bits with the batch it shares "
        "a step with, in uninterrupted runs too. 0 demands bit-identity",
    )
    p.set_defaults(func=run)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    p.add_argument("--requests", type=int, default=16, help="samples in the workload (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and of the cut moment")
    p.add_argument("--max-tokens", type=int, default=256, help="largest per-sample budget (default 256)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)


def _workload(args: argparse.Namespace, vocab_size: int) -> dict[str, tuple[list[int], Any]]:
    """Mixed greedy / seeded (top-p) samples with long-tailed budgets, all from ``args.seed``."""
    from partial_rollout.snapshot import SamplingSpec

    rng = random.Random(args.seed)
    work = {}
    for i in range(args.requests):
        prompt = [rng.randrange(3, vocab_size) for _ in range(rng.randrange(8, 64))]
        budget = max(2, min(args.max_tokens, int(args.max_tokens * rng.paretovariate(1.5) / 4)))
        kind = i % 3
        spec = SamplingSpec(
            max_tokens=budget,
            temperature=0.0 if kind == 0 else 1.0,
            top_p=0.95 if kind == 2 else 1.0,
            seed=None if kind == 0 else rng.randrange(2**31),
            ignore_eos=kind == 1,
        )
        work[f"s{i:04d}"] = (prompt, spec)
    return work


async def _role(args: argparse.Namespace) -> None:
    from partial_rollout.engine import ResumableEngine
    from partial_rollout.engine.factory import EngineConfig
    from partial_rollout.snapshot import GroupRecord, GroupState, Snapshot, load_snapshot, save_snapshot

    out = Path(args.workdir)
    config = EngineConfig(
        model=args.model, max_model_len=args.max_model_len, kv_cache_memory_bytes=args.kv_cache_memory_bytes
    )
    # This command is the check an untested vLLM must pass, so it uses the internals wherever they exist.
    engine = await ResumableEngine.start(config, trust_untested=True)
    fingerprints = await engine.fingerprints()
    vocab = fingerprints.vocab_size
    work = _workload(args, vocab)
    results: dict[str, Any] = {}
    if args.role == "reference":
        records = await asyncio.gather(*[engine.generate(r, p, s, index=0) for r, (p, s) in work.items()])
        results = {r: rec for r, rec in zip(work, records, strict=True)}
    elif args.role == "cut":
        tasks = {}
        for rid, (prompt, spec) in work.items():
            tasks[rid] = asyncio.ensure_future(engine.generate(rid, prompt, spec, index=0))
            await asyncio.sleep(0.002)
        # cut once a random share (10-60 %) of the whole budget has been generated
        target = random.Random(args.seed + 1).uniform(0.1, 0.6) * sum(s.max_tokens for _, s in work.values())
        # polling: the engine's counters have no event to wait on
        while (await engine.progress()).tokens_received < target and not all(t.done() for t in tasks.values()):  # noqa: ASYNC110
            await asyncio.sleep(0.001)
        cut = await engine.pause_and_capture()
        # everything of the workload: in flight or queued at the cut, or finished before it
        samples = {rid: t.result() for rid, t in tasks.items() if t.done()} | cut.samples
        groups = [
            GroupRecord(
                group_id=rid,
                prompt_token_ids=np.asarray(work[rid][0], dtype=np.int32),
                state=GroupState.IN_FLIGHT,
                dispatch_version=0,
                samples=[samples[rid]],
            )
            for rid in work
        ]
        snapshot = Snapshot(
            trainer_step=0,
            policy_version=engine.policy_version,
            fingerprints=fingerprints,
            groups=groups,
            metadata={"pause_s": cut.pause_s, "engine_tokens": cut.engine_tokens},
        )
        save_snapshot(snapshot, out)
        print("SAVED", flush=True)
        await asyncio.sleep(3600)  # the parent kills this process (and its engine) now
    else:
        snapshot = load_snapshot(out, expect=fingerprints)
        saved = {g.group_id: (g, g.samples[0]) for g in snapshot.groups}
        records = await asyncio.gather(
            *[
                engine.generate(rid, g.prompt_token_ids.tolist(), rec.sampling, index=0, resume_from=rec)
                for rid, (g, rec) in saved.items()
            ]
        )
        results = {rid: rec for rid, rec in zip(saved, records, strict=True)}
        results["__cut__"] = {rid: [rec.state.value, rec.num_tokens, rec.inexact] for rid, (_, rec) in saved.items()}
        results["__pause_s__"] = snapshot.metadata["pause_s"]
    (out / f"{args.role}-{_RESULT}").write_text(
        json.dumps(
            {
                k: v
                if k.startswith("__")
                else {"tokens": v.token_ids.tolist(), "logprobs": v.logprobs.tolist(), "inexact": v.inexact}
                for k, v in results.items()
            }
        )
    )
    await engine.shutdown()


def _child(args: argparse.Namespace, role: str, workdir: Path) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "partial_rollout.cli.check_resume",
        "--role",
        role,
        "--workdir",
        str(workdir),
        "--model",
        args.model,
        "--requests",
        str(args.requests),
        "--seed",
        str(args.seed),
        "--max-tokens",
        str(args.max_tokens),
        "--max-model-len",
        str(args.max_model_len),
    ]
    if args.kv_cache_memory_bytes:
        cmd += ["--kv-cache-memory-bytes", str(args.kv_cache_memory_bytes)]
    return cmd


def _run_child(cmd: list[str], log: Path, *, kill_after_save: bool = False) -> None:
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=fh, text=True, start_new_session=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if kill_after_save and line.strip() == "SAVED":
                os.killpg(proc.pid, signal.SIGKILL)  # the process *and* its engine-core child
                break
        code = proc.wait()
    if not kill_after_save and code != 0:
        raise RuntimeError(f"{cmd[4]} run failed (exit {code}); see {log}")
    if kill_after_save and code != -signal.SIGKILL:
        raise RuntimeError(f"cut run ended with {code} before saving; see {log}")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.requests <= 0 or args.max_tokens < 2:
        raise ConfigError("need --requests >= 1 and --max-tokens >= 2", field="requests/max-tokens")
    if args.model is None:
        from partial_rollout.models.tiny import build_tiny_model

        args.model = str(build_tiny_model())
    elif not Path(args.model, "config.json").is_file():
        raise ConfigError("no config.json here", path=args.model, field="--model")
    workdir = Path(args.keep or tempfile.mkdtemp(prefix="check-resume-"))
    workdir.mkdir(parents=True, exist_ok=True)
    steps = [("reference", False), ("cut", True), ("resume", False)]
    started = time.perf_counter()
    with tqdm(steps, desc="check-resume", unit="run") as bar:
        for role, kill in bar:
            bar.set_postfix_str(role)
            _run_child(_child(args, role, workdir), workdir / f"{role}.log", kill_after_save=kill)
    ref = json.loads((workdir / f"reference-{_RESULT}").read_text())
    res = json.loads((workdir / f"resume-{_RESULT}").read_text())
    cut = res.pop("__cut__")
    pause_s = res.pop("__pause_s__")
    bitwise, within, declared, diverged = 0, 0, 0, []
    worst = 0.0
    for rid, want in ref.items():
        got = res[rid]
        if got["inexact"]:
            declared += 1
            continue
        a, b = np.asarray(got["tokens"]), np.asarray(want["tokens"])
        n = min(len(a), len(b))
        if len(a) != len(b) or (a != b).any():
            pos = int(np.flatnonzero(a[:n] != b[:n])[0]) if (a[:n] != b[:n]).any() else n
            diverged.append((rid, cut[rid][1], pos, "token"))
            continue
        diff = np.abs(np.asarray(got["logprobs"]) - np.asarray(want["logprobs"]))
        worst = max(worst, float(diff.max(initial=0.0)))
        if not diff.any():
            bitwise += 1
        elif diff.max() <= args.logprob_atol:
            within += 1
        else:
            diverged.append((rid, cut[rid][1], int(np.flatnonzero(diff > args.logprob_atol)[0]), "logprob"))
    in_flight = sum(1 for state, k, _ in cut.values() if state == "in_flight")
    prefix = sum(k for _, k, _ in cut.values())
    print(
        f"cut: {in_flight} of {len(cut)} samples in flight, {prefix} prefix tokens; engine paused "
        f"{pause_s * 1000:.1f} ms; total {time.perf_counter() - started:.0f} s"
    )
    print(
        f"exact: {bitwise + within}/{len(ref) - declared} matched token for token ({bitwise} also bit-identical "
        f"in every logprob, {within} within {args.logprob_atol} - the engine's batch-composition numerics; "
        f"max |logprob diff| {worst:.3g}); {declared} declared inexact; {len(diverged)} diverged"
    )
    for rid, k, pos, kind in diverged[:5]:
        print(f"  {rid}: cut at {k} tokens, first {kind} divergence at position {pos}")
    print(f"work folder: {workdir}")
    return EXIT_OK if not diverged else EXIT_FAILURE


def main() -> None:
    p = argparse.ArgumentParser(description="internal: one role of check-resume")
    _add_workload_args(p)
    p.add_argument("--role", choices=("reference", "cut", "resume"), required=True)
    p.add_argument("--workdir", required=True)
    asyncio.run(_role(p.parse_args()))


if __name__ == "__main__":
    main()
