"""``partial-rollout check-resume``: prove exact resume on your own model and engine before trusting it.

Runs one workload in three processes, each with its own engine:

1. *reference*: uninterrupted, every sample submitted together; then the same workload again,
   uninterrupted, submitted one by one in reverse order (other batches, prefills sharing steps
   with decodes): the **noise floor**, how often and how far two uninterrupted runs differ on this
   model and engine, since vLLM's kernels are not batch-invariant;
2. *cut*: the same requests, a checkpoint cut at a random moment (what was received so far; the
   engine is not paused), the snapshot written, then the process and its engine are killed with SIGKILL;
3. *resume*: a fresh engine loads the snapshot and continues every sample from its prefix.

It then compares each sample that was in flight with a prefix at the cut (the only ones that are
*continued*) with the reference, token by token and logprob by logprob, next to the noise floor,
and prints the first divergence of any that did not match, how long the cut and the snapshot's write
took, and how many decode steps the engine ran meanwhile (what a save costs in steps is the
benchmarks' to measure: ``benchmarks/resume/steps.py`` times each step on the engine's clock). Exit status 0
when no continued sample diverged, or when they diverged no more often than the two uninterrupted
runs did; 1 when continuing diverged more often (beyond the noise floor), or when no sample was in
flight at the cut (nothing was checked).

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

from partial_rollout.errors import EXIT_FAILURE, EXIT_OK, ConfigError

_RESULT = "result.json"
_STALL = "stall.json"
STEADY_S = 0.25
"""Seconds the cut role lets the engine run after the snapshot's write before counting its steps since the cut
(a blocked event loop delays the engine's outputs, not its steps)."""


def _steps(earlier: Any, later: Any) -> int:
    """Engine steps between two ``Progress`` readings (the cut role counts steps)."""
    return int(later.steps) - int(earlier.steps)


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
        default=None,
        help="largest |logprob difference| of a token-identical sample reported as within the engine's numerics "
        "(default: the noise floor measured in this run). vLLM kernels are not batch-invariant: a request's "
        "logprobs move in the last bits with the batch it shares a step with, in uninterrupted runs too",
    )
    p.set_defaults(func=run)


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder (default: the tiny Llama)")
    p.add_argument("--requests", type=int, default=16, help="samples in the workload (default 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload and of the cut moment")
    p.add_argument("--max-tokens", type=int, default=256, help="largest per-sample budget (default 256)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    p.add_argument(
        "--multiprocessing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the model in a vLLM worker process of its own, vLLM's default; --no-multiprocessing runs it "
        "in the engine core's process, one process fewer to start per engine (small models)",
    )


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
        model=args.model,
        max_model_len=args.max_model_len,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes,
        multiprocessing=args.multiprocessing,
    )
    # This command is the check an untested vLLM must pass, so it uses the internals wherever they exist.
    engine = await ResumableEngine.start(config, trust_untested=True, count_steps=args.role == "cut")
    fingerprints = await engine.fingerprints()
    vocab = fingerprints.vocab_size
    work = _workload(args, vocab)
    results: dict[str, Any] = {}
    if args.role == "reference":
        records = await asyncio.gather(*[engine.generate(r, p, s, index=0) for r, (p, s) in work.items()])
        results = {r: rec for r, rec in zip(work, records, strict=True)}
        # The noise floor: the same workload again, uninterrupted, in other batches: submitted one
        # by one in reverse order, so prefills share steps with decodes (as resumed prefixes do).
        await engine.reset_prefix_cache()
        again = {}
        for rid in reversed(work):
            again[rid] = asyncio.ensure_future(engine.generate(f"floor/{rid}", *work[rid], index=0))
            await asyncio.sleep(0.01)
        results["__floor__"] = {rid: _as_json(await again[rid]) for rid in work}
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
        at, t_at = await engine.progress(), time.perf_counter()
        cut = await engine.cut()
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
            metadata={"engine_tokens": cut.engine_tokens},
        )
        save_snapshot(snapshot, out)
        saved_s = time.perf_counter() - t_at
        await asyncio.sleep(STEADY_S)  # the steps of outputs the write held back are counted too
        steps = _steps(at, await engine.progress())
        (out / _STALL).write_text(json.dumps({"cut_s": cut.cut_s, "saved_s": saved_s, "steps": steps}))
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
        results["__stall__"] = json.loads((out / _STALL).read_text())
    (out / f"{args.role}-{_RESULT}").write_text(
        json.dumps({k: v if k.startswith("__") else _as_json(v) for k, v in results.items()})
    )
    await engine.shutdown()


def _as_json(rec: Any) -> dict[str, Any]:
    return {"tokens": rec.token_ids.tolist(), "logprobs": rec.logprobs.tolist(), "inexact": rec.inexact}


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
    if not args.multiprocessing:
        cmd.append("--no-multiprocessing")
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
    floor_runs = ref.pop("__floor__")
    res = json.loads((workdir / f"resume-{_RESULT}").read_text())
    cut = res.pop("__cut__")
    stall = res.pop("__stall__")

    floor = [_compare(floor_runs[rid], want) for rid, want in ref.items()]
    floor_diverged = sum(pos is not None for pos, _ in floor)
    floor_worst = max(worst for _, worst in floor)
    atol = floor_worst if args.logprob_atol is None else args.logprob_atol
    continued = continued_samples(cut)
    declared = [rid for rid in continued if res[rid]["inexact"]]
    bitwise, within, beyond, diverged = 0, 0, 0, []
    worst = 0.0
    for rid in continued:
        if res[rid]["inexact"]:
            continue
        pos, diff = _compare(res[rid], ref[rid])
        worst = max(worst, diff)
        if pos is not None:
            diverged.append((rid, cut[rid][1], pos))
        elif diff == 0.0:
            bitwise += 1
        elif diff <= atol:
            within += 1
        else:
            beyond += 1
    others = [rid for rid in ref if rid not in continued]
    others_same = sum(_compare(res[rid], ref[rid])[0] is None for rid in others)
    checked = len(continued) - len(declared)
    finished = sum(1 for rid in others if cut[rid][0] == "finished")
    prefix = sum(cut[rid][1] for rid in continued)
    print(
        f"cut: {len(continued)} of {len(cut)} samples in flight with a prefix ({prefix} prefix tokens), {finished} "
        f"finished before it, {len(others) - finished} not started; cut in {stall['cut_s'] * 1000:.2f} ms, engine not "
        f"paused: it ran {stall['steps']} decode steps from the cut to {STEADY_S} s after the snapshot's write "
        f"({stall['saved_s'] * 1000:.0f} ms from the cut); "
        f"total {time.perf_counter() - started:.0f} s"
    )
    print(
        f"noise floor: {len(ref) - floor_diverged}/{len(ref)} samples token-identical between two uninterrupted runs "
        f"in different batches; max |logprob diff| {floor_worst:.3g}"
    )
    print(
        f"continued: {checked - len(diverged)}/{checked} in-flight samples token-identical to the uninterrupted run "
        f"({bitwise} also bit-identical in every logprob, {within} within {atol:.3g}, {beyond} beyond it; max |logprob "
        f"diff| {worst:.3g}); {len(declared)} declared inexact; {len(diverged)} diverged"
    )
    print(f"not continued (finished before the cut or restarted): {others_same}/{len(others)} token-identical")
    for rid, k, pos in diverged[:5]:
        print(f"  {rid}: cut at {k} tokens, first token divergence at position {pos}")
    # Tokens decide: two uninterrupted runs already differ this often, so continuing is held to
    # that rate, not to zero. Logprobs beyond the floor are reported, not failed: the prefix is
    # prefilled where the uninterrupted run decoded it, which moves logprobs in the last bits.
    beyond_floor = bool(diverged) and len(diverged) / checked > floor_diverged / len(ref)
    verdict = (
        "nothing checked: no sample was in flight with a prefix at the cut (a loaded machine lets the engine "
        "run ahead of the cut); rerun, or raise --max-tokens"
        if not checked
        else "exact: every continued sample token-identical"
        if not diverged
        else "BEYOND the noise floor: continuing diverged more often than two uninterrupted runs"
        if beyond_floor
        else "within the noise floor: continuing diverged no more often than two uninterrupted runs"
    )
    print(f"verdict: {verdict}")
    print(f"work folder: {workdir}")
    return EXIT_FAILURE if beyond_floor or not checked else EXIT_OK


def continued_samples(cut: dict[str, list[Any]]) -> list[str]:
    """The samples a resume continues: in flight with a prefix at the cut (``cut``: id -> [state, tokens, inexact]).

    The others come back finished (done before the cut) or restart from scratch, and tell nothing
    about continuing.
    """
    return [rid for rid, (state, k, _) in cut.items() if state == "in_flight" and k > 0]


def _compare(got: dict[str, Any], want: dict[str, Any]) -> tuple[int | None, float]:
    """(first position whose token differs, or None; largest |logprob diff| before it)."""
    a, b = np.asarray(got["tokens"]), np.asarray(want["tokens"])
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    pos = int(differ[0]) if len(differ) else (None if len(a) == len(b) else n)
    upto = n if pos is None else pos
    diff = np.abs(np.asarray(got["logprobs"][:upto]) - np.asarray(want["logprobs"][:upto]))
    return pos, float(diff.max(initial=0.0))


def main() -> None:
    p = argparse.ArgumentParser(description="internal: one role of check-resume")
    _add_workload_args(p)
    p.add_argument("--role", choices=("reference", "cut", "resume"), required=True)
    p.add_argument("--workdir", required=True)
    asyncio.run(_role(p.parse_args()))


if __name__ == "__main__":
    main()
