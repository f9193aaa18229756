"""The benchmark's JSON result and its README tables.

The README table is generated from this JSON (``markdown``) and the plots are drawn from it
(:mod:`benchmarks.plots`), so every key here is part of a schema that results already on disk
(``benchmarks/results/*.json``) follow: add keys, do not rename them. The figures themselves are
computed in :mod:`~benchmarks.resume.figures`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.provenance import machine, versions
from benchmarks.resume.figures import identity, table
from partial_rollout.atomic import atomic_write

DEFINITIONS = {
    "recovery_s": "seconds from engine-ready after the restart until every recovered sample finished (uninterrupted: from the snapshot built after the cut, the engine generating throughout)",
    "decode_tokens": "tokens the engine generated for the recovered samples",
    "prefill_tokens": "prompt tokens submitted for the recovered samples (continue: prompt + saved prefix); prefix caching is on, so shared group prompts may be computed once",
    "steps": "engine steps (scheduler iterations that produced outputs) over the same interval as recovery_s: the latency structure, immune to other jobs on the machine",
    "cpu_s": "CPU seconds (user + system) of this process and the engine core over the same interval as recovery_s; robust to other jobs on the machine",
    "warm_s": "the same recovery rerun on the same engine right after (prefix cache emptied): no fresh-engine start-up effects",
    "warm_cpu_s": "CPU seconds of the warm rerun",
    "redone_decode_tokens": "decode_tokens minus the tokens the recovered samples still needed at the cut",
    "useful_tokens": "generated tokens that were not already in the snapshot",
    "useful_tok_s": "useful_tokens / recovery_s",
    "useful_vs_steady": "useful_tok_s over the pre-cut steady-state rate (all groups dispatched, full batch)",
    "vs_uninterrupted": "recovery_s over the uninterrupted mode's time for the same remainder",
    "prompts_lost": "prompt groups (in flight or pending) that never come back",
    "cut_ms": "the engine's cut (ResumableEngine.cut, Cut.cut_s): what its front end had received of every request in flight; the engine is not paused and generates throughout",
    "gate_ms": "from the cut call until the snapshot is built in memory (engine cut + the benchmark's ledger-like copy into a Snapshot): where a trainer's gate to the engine reopens (the save event's gate_ms). The save's own window",
    "engine_tokens": "tokens the engine had delivered of the requests in the cut (Cut.engine_tokens)",
    "written_ms": "from the cut call until save_snapshot returned in its thread (encode, fsync, atomic rename, beside generation)",
    "after_window_ms": "the window after the save's own: from the snapshot built until 16 steady step times after written_ms, where the engine should be back at its pace",
    "steady_step_ms": "the engine's mean step time over the 32 steps before the cut (fewer when the last group was dispatched later: from the step after its prefill), on the engine's clock",
    "steps_lost": "engine decode steps lost to the save in its window (cut call to gate): steady rate x window minus the steps the engine ran in it. Steps are timed on the engine's side (each step's end from vLLM's per-step inter-token latencies, the engine core's own clock, anchored to this process's; benchmarks/resume/steps.py), the steps at the window's ends counted for the share inside it, so it is fractional and signed: noise makes it negative. Target: median <= 0.1 (steps_lost_target)",
    "steps_lost_after": "the same over after_window_ms: what the save costs later (the write in a thread competing for the CPU), plus whatever else happens there (the pending groups launched at the cut prefill, samples finish): read it next to twin_steps_lost_after",
    "twin_*": "the same figures over the same windows (the same offsets from the cut) in the twin run: the same workload rerun on engine A after the uninterrupted remainder (prefix cache emptied), to the same cut point, where nothing runs for the save's own window (the event loop waits it out) and then everything the save run did after it but the save (clocks read, pending groups launched). What the estimator gives without a save",
    "steps_lost_after_vs_twin": "steps_lost_after minus twin_steps_lost_after: the steps the save cost in the window after it, net of what the same point costs without one",
    "decoding_until_ms": "from the cut to the end of the engine's last step before its first gap after the cut (a step in which no request decoded: the work ran out, or the step only prefilled): a window reaching past it is not measured (null), as happens when the write outlasts the in-flight samples' decoding on a slow or shared machine; twin_decoding_until_ms: the same in the twin run",
    "tok_s_around": "tokens the engine sampled per second from the cut until the end of the window after it (engine clock); twin_tok_s_around: the same without a save",
    "around_vs_steady": "tok_s_around over the engine's steady tokens/s in the steady_step_ms window before the cut",
    "tok_s_around_vs_twin": "around_vs_steady of the save run over that of the twin: tokens per second around a save against around the same point without one, each run relative to its own pace before the cut (so a run slower throughout, the machine being shared, does not count as the save's cost). 1 = the save cost nothing",
    "token_data_bytes_per_token": "bytes of the per-token tensors (token ids, logprobs, version runs) per stored token: the marginal cost of a generated token",
    "bytes_*": "the snapshot file split by what the bytes hold (token_data, prompts, sampler_state, per-sample and per-group fields, the sampling-parameter tables in the header, the rest of the header); they add up to the file size. The workload gives every sample its own max_tokens (to shape the length distribution), so every sample has its own sampling-table entry; a trainer with one max_tokens has one",
    "save_s": "save_snapshot wall time (fsync + atomic rename), overlapping generation in a thread",
    "load_s": "load_snapshot wall time, page cache evicted first (full checksum + validation)",
    "floor_s": "time to prefill every saved prompt+prefix alone (max_tokens=1, all together), on the regenerate engine after it finished and its prefix cache was emptied",
    "over_floor_s": "continue recovery_s minus floor_s",
    "identity": "token identity of the samples in flight at the cut, over all repetitions: continue vs uninterrupted next to the noise floor, regenerate vs uninterrupted on the same samples (two uninterrupted runs of the same seeded samples in different batches); beyond_noise_floor when continue matched fewer; logprob diffs over the tokens before the first divergence (continue: after the saved prefix)",
}


# --- the README tables -----------------------------------------------------------------------


def fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not v.is_integer():
        return f"{v:.{digits}f}"
    return f"{int(v)}"


def markdown(result: dict[str, Any]) -> str:
    """The README's two tables: recovery per mode, then the save, load and floor per sweep point."""
    lines = [
        "| in flight | mean prefix | mode | engine steps (x uninterrupted) | recovery s (median [min-max]) | x uninterrupted | CPU s (x uninterrupted) | warm engine s (x uninterrupted) | decode tok | prefill tok | redone decode | useful tok/s (x steady) | prompts lost |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in result["table"]:
        lines.append(
            f"| {r['in_flight']} | {r['mean_prefix']} | {r['mode']} | {fmt(r.get('steps'), 0)} ({fmt(r.get('steps_vs_uninterrupted'))}) | {fmt(r['recovery_s'])} [{fmt(r['recovery_s_min'])}-{fmt(r['recovery_s_max'])}]"
            f" | {fmt(r['vs_uninterrupted'])} | {fmt(r.get('cpu_s'))} ({fmt(r.get('cpu_vs_uninterrupted'))}) | {fmt(r.get('warm_s'))} ({fmt(r.get('warm_vs_uninterrupted'))}) | {fmt(r['decode_tokens'])} | {fmt(r['prefill_tokens'])} | {fmt(r['redone_decode_tokens'])}"
            f" | {fmt(r['useful_tok_s'], 0)} ({fmt(r['useful_vs_steady'])}) | {fmt(r['prompts_lost'])} |"
        )
    lines += [
        "",
        "| in flight | mean prefix | cut ms; gate ms | decode steps lost per save: save window; after it (same windows, no save) | tok/s around the save: x steady (no save); save / no save | save s | load s | bytes / in-flight token (excl. sampler state) [token data only] | floor s (steps) | continue - floor s | regenerate / continue (steps; wall; CPU; warm wall) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in result["points"]:
        s = p["summary"]

        def sv(k: str, s: dict[str, Any] = s) -> Any:
            return (s["save"].get(k) or {}).get("median")

        c = s["modes"]["continue"]
        lines.append(
            f"| {p['num_in_flight']} | {p['mean_prefix']} | {fmt(sv('cut_ms'), 1)}; {fmt(sv('gate_ms'), 1)}"
            f" | {fmt(sv('steps_lost'), 3)}; {fmt(sv('steps_lost_after'))} ({fmt(sv('twin_steps_lost_after'))})"
            f" | {fmt(sv('around_vs_steady'))} ({fmt(sv('twin_around_vs_steady'))}); {fmt(sv('tok_s_around_vs_twin'))}"
            f" | {fmt(sv('save_s'), 3)}"
            f" | {fmt(sv('load_s'), 3)} | {fmt(sv('bytes_per_in_flight_token'))} ({fmt(sv('bytes_per_in_flight_token_excl_sampler_state'))}) [{fmt(sv('token_data_bytes_per_token'), 3)}]"
            f" | {fmt((c['floor_s'] or {}).get('median'))} ({fmt((c.get('floor_steps') or {}).get('median'), 0)}) | {fmt((c['over_floor_s'] or {}).get('median'))}"
            f" | {fmt((s['modes']['regenerate'].get('steps_vs_continue') or {}).get('median'))}; {fmt((s['modes']['regenerate']['vs_continue'] or {}).get('median'))};"
            f" {fmt((s['modes']['regenerate'].get('cpu_vs_continue') or {}).get('median'))};"
            f" {fmt((s['modes']['regenerate'].get('warm_vs_continue') or {}).get('median'))} |"
        )
    lines += [
        "",
        "| in flight | mean prefix | reps | samples in flight at the cut | token-identical to uninterrupted: continue | noise floor: regenerate | max abs logprob diff before the first divergence: continue; noise floor | prefix kept bit for bit | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in result["points"]:
        i = p["summary"].get("identity") or identity(p["reps"])
        lines.append(
            f"| {p['num_in_flight']} | {p['mean_prefix']} | {len(p['reps'])} | {i['samples_in_flight']}"
            f" | {i['continue_identical']} ({fmt(100 * (i['continue_rate'] or 0), 0)}%)"
            f" | {i['noise_floor_identical']} ({fmt(100 * (i['noise_floor_rate'] or 0), 0)}%)"
            f" | {_g(i['continue_max_logprob_diff'])}; {_g(i['noise_floor_max_logprob_diff'])}"
            f" | {fmt(i['prefix_bit_identical'])}"
            f" | {'**beyond the noise floor**' if i['beyond_noise_floor'] else 'within the noise floor'} |"
        )
    return "\n".join(lines)


def readme_table(result: dict[str, Any]) -> str:
    """The README's resume table: one row per sweep point, medians, token identity next to the noise floor."""
    lines = [
        "| in flight x mean prefix | reps | engine steps: uninterrupted / continue / regenerate | wall s (warm engine):"
        " uninterrupted / continue / regenerate | continue / uninterrupted (wall) | regenerate / continue: decode"
        " tokens; steps; warm wall | decode tokens redone: continue / regenerate | prompts lost by drop | decode steps"
        " lost per save: save window; after it (no save) | tok/s around the save / without | save / cold load ms"
        " | bytes per in-flight token: token data; whole file without sampler state | token-identical to"
        " uninterrupted, samples in flight at the cut: continue / noise floor |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["points"]:
        s = p["summary"]

        def m(mode: str, key: str, s: dict[str, Any] = s) -> Any:
            return (s["modes"][mode].get(key) or {}).get("median")

        def sv(key: str, s: dict[str, Any] = s) -> Any:
            return (s["save"].get(key) or {}).get("median")

        i = s.get("identity") or identity(p["reps"])
        n = i["samples_in_flight"]
        flag = " **beyond**" if i["beyond_noise_floor"] else ""
        lines.append(
            f"| {p['num_in_flight']} x {p['mean_prefix']} | {len(p['reps'])}"
            f" | {m('uninterrupted', 'steps'):,.0f} / {m('continue', 'steps'):,.0f} / {m('regenerate', 'steps'):,.0f}"
            f" | {m('uninterrupted', 'recovery_s'):.1f} / {m('continue', 'recovery_s'):.1f}"
            f" ({m('continue', 'warm_s'):.1f}) / {m('regenerate', 'recovery_s'):.1f} ({m('regenerate', 'warm_s'):.1f})"
            f" | {m('continue', 'vs_uninterrupted'):.2f}"
            f" | {m('regenerate', 'decode_tokens') / m('continue', 'decode_tokens'):.2f};"
            f" {m('regenerate', 'steps_vs_continue'):.2f}; {m('regenerate', 'warm_vs_continue'):.2f}"
            f" | {m('continue', 'redone_decode_tokens'):,.0f} / {m('regenerate', 'redone_decode_tokens'):,.0f}"
            f" | {m('drop', 'prompts_lost'):.0f} | {fmt(sv('steps_lost'), 3)}; {fmt(sv('steps_lost_after'))}"
            f" ({fmt(sv('twin_steps_lost_after'))}) | {fmt(sv('tok_s_around_vs_twin'))}"
            f" | {1000 * sv('save_s'):.0f} / {1000 * sv('load_s'):.0f}"
            f" | {sv('token_data_bytes_per_token'):.3f}; {sv('bytes_per_in_flight_token_excl_sampler_state'):.2f}"
            f" | {i['continue_identical']}/{n} / {i['noise_floor_identical']}/{n}{flag} |"
        )
    return "\n".join(lines)


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.2g}"


# --- the result file -----------------------------------------------------------------------------


def assemble(args: argparse.Namespace, config: Any, points: list[dict[str, Any]], started: float) -> dict[str, Any]:
    """The whole JSON result: machine, versions, configuration, definitions, points, tables and verdicts."""
    result = dict(
        benchmark="resume_throughput",
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        wall_s=time.time() - started,
        command=" ".join(["python -m benchmarks.resume_throughput", *sys.argv[1:]]),
        machine=machine(),
        versions=versions(),
        config=dict(
            engine={k: v for k, v in dataclasses.asdict(config).items() if k != "extra"},
            samples=args.samples,
            prefix=args.prefix,
            reps=args.reps,
            big_point=args.big_point,
            big_reps=args.big_reps,
            group_size=args.group_size,
            prompt_tokens=args.prompt_tokens,
            seed=args.seed,
            workload="prefix K ~ U[0.5L, 1.5L] per group (staggered dispatch), remainder ~ lognormal(mean 0.5L, sigma 1) clipped to [16, 2L] and the context; temperature 1, per-sample seeds, ignore_eos; pending groups = max(1, groups/8)",
            restart="in-process: engine shut down after the uninterrupted remainder; each recovery mode starts a fresh ResumableEngine (new engine-core process, cold KV cache) and reads the snapshot from disk",
        ),
        definitions=DEFINITIONS,
        points=points,
    )
    loads = [r["loadavg_1m"]["before"] for p in points for r in p["reps"]] + [
        r["loadavg_1m"]["after"] for p in points for r in p["reps"]
    ]
    if loads:
        result["notes"] = (
            f"1-minute load average around the repetitions: median {statistics.median(loads):.1f}, max {max(loads):.1f}"
            f" on {os.cpu_count()} CPUs. Above the CPU count, other jobs shared the machine and the timings are"
            " correspondingly slower and noisier; token counts, checks and snapshot sizes are unaffected."
        )
    result["table"] = table(points)
    result["consistency"] = dict(
        passed=bool(points) and all(p["summary"]["consistent_all_reps"] for p in points),
        failed=[
            dict(point=f"{p['num_in_flight']}x{p['mean_prefix']}", rep=r["rep"], check=k, **v)
            for p in points
            for r in p["reps"]
            for k, v in r["checks"].items()
            if not v["ok"]
        ],
    )
    result["exact"] = dict(
        all_reps=bool(points) and all(p["summary"]["exact_all_reps"] for p in points),
        beyond_noise_floor=[
            f"{p['num_in_flight']}x{p['mean_prefix']}" for p in points if p["summary"]["identity"]["beyond_noise_floor"]
        ],
    )
    result["continue_redone_decode_tokens_max"] = max(
        (r["modes"]["continue"]["redone_decode_tokens"] for p in points for r in p["reps"]), default=None
    )
    result["markdown"] = markdown(result)
    return result


def write(result: dict[str, Any], out: Path, *, plots: bool = True) -> list[Path]:
    """``<out>.json`` (replaced atomically: it is rewritten after every repetition) and, with ``plots``, the PNGs."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_name(out.name + ".json")
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    written = [path]
    if plots:
        from benchmarks.plots import plot_all

        written += plot_all(result, out)
    return written


if __name__ == "__main__":  # python -m benchmarks.resume.report RESULT.json: the README table of a result
    print(readme_table(json.loads(Path(sys.argv[1]).read_text())))
