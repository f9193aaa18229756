"""The benchmark's JSON result: one record per repetition, a summary per sweep point, the README tables.

The README table is generated from this JSON (``markdown``) and the plots are drawn from it
(:mod:`benchmarks.plots`), so every key here is part of a schema that results already on disk
(``benchmarks/results/*.json``) follow: add keys, do not rename them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.resume.measure import SavedWork, consistency_checks, exactness
from partial_rollout.atomic import atomic_write

if TYPE_CHECKING:
    from benchmarks.resume.phases import Continued, Floor, KilledRun, Lost, Restart

MODES = ("uninterrupted", "drop", "regenerate", "continue")
TARGET_CONTINUE_VS_UNINTERRUPTED = 1.15
TARGET_BYTES_PER_TOKEN = 8.0
TARGET_STEPS_LOST = 0.1
"""Engine decode steps a save may cost (median of ``steps_lost``, signed)."""

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


# --- one repetition ------------------------------------------------------------------------------


def mode_figures(
    killed: KilledRun, c: Continued, b: Restart, floor: Floor, lost: Lost, remaining: int
) -> dict[str, Any]:
    """Every mode's cost for the same remainder, and its ratios to the uninterrupted run and to continue."""
    unint = killed.uninterrupted.spent
    decode_after_cut = killed.decode_tokens_after_cut
    modes: dict[str, dict[str, Any]] = {
        "uninterrupted": dict(
            recovery_s=unint.wall_s,
            cpu_s=unint.cpu_s,
            steps=unint.steps,
            decode_tokens=decode_after_cut,
            prefill_tokens=0,
            redone_decode_tokens=decode_after_cut - remaining,
            useful_tokens=remaining,
            prompts_lost=0,
            samples_lost=0,
            prefix_tokens_lost=0,
        ),
        "drop": dict(
            recovery_s=0.0,
            cpu_s=0.0,
            steps=0,
            decode_tokens=0,
            prefill_tokens=0,
            redone_decode_tokens=0,
            useful_tokens=0,
            prompts_lost=lost.prompts,
            samples_lost=lost.samples,
            prefix_tokens_lost=lost.prefix_tokens,
        ),
        "regenerate": dict(
            recovery_s=b.spent.wall_s,
            cpu_s=b.spent.cpu_s,
            steps=b.spent.steps,
            warm_s=b.warm.wall_s,
            warm_cpu_s=b.warm.cpu_s,
            decode_tokens=b.decode_tokens,
            prefill_tokens=b.prefill_tokens,
            redone_decode_tokens=b.decode_tokens - remaining,
            useful_tokens=b.useful_tokens,
            prompts_lost=0,
            samples_lost=0,
            prefix_tokens_lost=0,
            engine_start_s=b.engine_start_s,
        ),
        "continue": dict(
            recovery_s=c.spent.wall_s,
            cpu_s=c.spent.cpu_s,
            steps=c.spent.steps,
            floor_steps=floor.spent.steps,
            warm_s=c.warm.wall_s,
            warm_cpu_s=c.warm.cpu_s,
            decode_tokens=c.decode_tokens,
            prefill_tokens=c.prefill_tokens,
            redone_decode_tokens=c.decode_tokens - remaining,
            useful_tokens=c.useful_tokens,
            prompts_lost=0,
            samples_lost=0,
            prefix_tokens_lost=0,
            engine_start_s=c.engine_start_s,
            load_s=c.load_s,
            floor_s=floor.spent.wall_s,
            floor_cpu_s=floor.spent.cpu_s,
            over_floor_s=c.spent.wall_s - floor.spent.wall_s,
            over_floor_cpu_s=c.spent.cpu_s - floor.spent.cpu_s,
            over_floor_ratio=c.spent.wall_s / floor.spent.wall_s if floor.spent.wall_s > 0 else None,
        ),
    }
    steady_tok_s = killed.cut.steady.tok_s
    for m in modes.values():
        m["useful_tok_s"] = m["useful_tokens"] / m["recovery_s"] if m["recovery_s"] > 0 else None
        m["vs_uninterrupted"] = m["recovery_s"] / unint.wall_s if unint.wall_s > 0 and m["recovery_s"] > 0 else None
        m["steps_vs_uninterrupted"] = m["steps"] / unint.steps if unint.steps and m["steps"] else None
        m["cpu_vs_uninterrupted"] = m["cpu_s"] / unint.cpu_s if unint.cpu_s > 0 and m["cpu_s"] > 0 else None
        m["useful_vs_steady"] = m["useful_tok_s"] / steady_tok_s if m["useful_tok_s"] and steady_tok_s else None
    regen = modes["regenerate"]
    regen["vs_continue"] = b.spent.wall_s / c.spent.wall_s
    regen["steps_vs_continue"] = b.spent.steps / c.spent.steps if c.spent.steps else None
    regen["cpu_vs_continue"] = b.spent.cpu_s / c.spent.cpu_s if c.spent.cpu_s > 0 else None
    regen["warm_vs_continue"] = b.warm.wall_s / c.warm.wall_s
    regen["warm_cpu_vs_continue"] = b.warm.cpu_s / c.warm.cpu_s if c.warm.cpu_s > 0 else None
    for name, r in (("regenerate", b), ("continue", c)):
        modes[name]["warm_vs_uninterrupted"] = r.warm.wall_s / unint.wall_s if unint.wall_s > 0 else None
        modes[name]["warm_cpu_vs_uninterrupted"] = r.warm.cpu_s / unint.cpu_s if unint.cpu_s > 0 else None
    return modes


def rep_record(
    rep: int,
    killed: KilledRun,
    c: Continued,
    b: Restart,
    floor: Floor,
    lost: Lost,
    *,
    file_bytes: int,
    sizes: dict[str, int],
    load_before: float,
    wall_start: float,
) -> dict[str, Any]:
    """One repetition's figures, checks and timelines, as stored under ``points[].reps[]``."""
    saved, loaded, cut, unint = killed.cut.snapshot, c.loaded, killed.cut, killed.uninterrupted
    counts = loaded.counts()
    work = SavedWork.of(saved)
    checks = consistency_checks(
        saved,
        loaded,
        work=work,
        prompts_lost=lost.prompts,
        saved_bytes=unint.bytes,
        file_bytes=file_bytes,
        sizes=sizes,
        uninterrupted_decode=killed.decode_tokens_after_cut,
        regenerate_decode=b.decode_tokens,
        continue_decode=c.decode_tokens,
        continue_prefill=c.prefill_tokens,
        floor_prefill=floor.prefill_tokens,
    )
    step_ms = cut.steady.step_ms
    ours, twin = killed.save_cost, killed.twin_cost
    tokens = work.prefix_tokens
    return dict(
        rep=rep,
        wall_s=time.perf_counter() - wall_start,
        loadavg_1m=dict(before=load_before, after=os.getloadavg()[0]),
        workload=dict(
            groups=len(saved.groups),
            groups_pending=counts["groups_pending"],
            samples_in_flight=work.samples_in_flight,
            samples_not_started=work.samples_not_started,
            samples_finished_before_cut=counts["samples_finished"],
            prefix_tokens=tokens,
            mean_prefix_measured=tokens / max(1, work.samples_in_flight),
            max_prefix=work.max_prefix,
            remaining_tokens=work.remaining_tokens,
            recovered_prompt_tokens=work.prompt_tokens,
        ),
        presave=dict(
            engine_start_s=killed.engine_start_s,
            precut_s=killed.precut_s,
            tokens_before_cut=cut.tokens_at_cut,
            steady_tok_s=cut.steady.tok_s,
            steady_window_s=cut.steady.window_s,
            step_ms=step_ms,
        ),
        save=dict(
            cut_ms=1000 * cut.cut_s,
            gate_ms=1000 * cut.gate_s,
            engine_tokens=cut.engine_tokens,
            written_ms=1000 * unint.written_s,
            after_window_ms=1000 * (killed.windows.end_s - killed.windows.gate_s),
            **ours,
            **{f"twin_{k}": v for k, v in twin.items()},
            steps_lost_after_vs_twin=_minus(ours["steps_lost_after"], twin["steps_lost_after"]),
            tok_s_around_vs_twin=_over(ours["around_vs_steady"], twin["around_vs_steady"]),
            save_s=unint.save_s,
            load_s=c.load_s,
            snapshot_bytes=unint.bytes,
            in_flight_tokens=tokens,
            sampler_state_bytes=work.sampler_state_bytes,
            bytes_per_in_flight_token=unint.bytes / tokens if tokens else None,
            bytes_per_in_flight_token_excl_sampler_state=(unint.bytes - work.sampler_state_bytes) / tokens
            if tokens
            else None,
            token_data_bytes_per_token=sizes["token_data"] / counts["tokens"] if counts["tokens"] else None,
            **{f"bytes_{k}": v for k, v in sizes.items()},
        ),
        floor=dict(
            floor_s=floor.spent.wall_s,
            floor_cpu_s=floor.spent.cpu_s,
            floor_steps=floor.spent.steps,
            floor_prefill_tokens=floor.prefill_tokens,
        ),
        modes=mode_figures(killed, c, b, floor, lost, work.remaining_tokens),
        exact=exactness(saved, unint.finished, c.records, b.records),
        checks=checks,
        consistent=all(v["ok"] for v in checks.values()),
        timelines=dict(
            presave=killed.timeline,
            regenerate=b.timeline,
            **{"continue": c.timeline},
            restart_s={"continue": c.engine_start_s + c.load_s, "regenerate": b.engine_start_s},
            floor_s=floor.spent.wall_s,
            save_s=unint.save_s,
            uninterrupted_s=unint.spent.wall_s,
        ),
    )


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _over(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


# --- the sweep -----------------------------------------------------------------------------------


def spread(values: list[Any]) -> dict[str, Any] | None:
    """Median, min, max and (max - min) / median of the values that are not None."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    return dict(
        median=med, min=min(vals), max=max(vals), n=len(vals), rel_spread=(max(vals) - min(vals)) / med if med else 0.0
    )


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """A sweep point's summary: every figure's spread over the repetitions, and the targets met or not."""
    summary: dict[str, Any] = {"modes": {}, "save": {}, "workload": {}, "presave": {}}
    for mode in MODES:
        keys = reps[0]["modes"][mode].keys()
        summary["modes"][mode] = {k: spread([r["modes"][mode].get(k) for r in reps]) for k in keys}
    for section in ("save", "workload", "presave", "floor"):
        summary[section] = {k: spread([r[section][k] for r in reps]) for k in reps[0][section]}

    def med(m: str, k: str) -> Any:
        return (summary["modes"][m][k] or {}).get("median")

    save = summary["save"]

    def med_save(k: str) -> Any:
        return (save.get(k) or {}).get("median")

    summary["targets"] = {
        "continue_redone_decode_tokens_max": max(r["modes"]["continue"]["redone_decode_tokens"] for r in reps),
        "continue_redone_decode_tokens_target": 0,
        "continue_vs_uninterrupted_median": med("continue", "vs_uninterrupted"),
        "continue_vs_uninterrupted_target": TARGET_CONTINUE_VS_UNINTERRUPTED,
        "continue_vs_uninterrupted_met": (med("continue", "vs_uninterrupted") or math.inf)
        <= TARGET_CONTINUE_VS_UNINTERRUPTED,
        "continue_cpu_vs_uninterrupted_median": med("continue", "cpu_vs_uninterrupted"),
        "continue_steps_vs_uninterrupted_median": med("continue", "steps_vs_uninterrupted"),
        "continue_steps_vs_uninterrupted_met": (med("continue", "steps_vs_uninterrupted") or math.inf)
        <= TARGET_CONTINUE_VS_UNINTERRUPTED,
        "regenerate_vs_continue_steps_median": med("regenerate", "steps_vs_continue"),
        "regenerate_vs_continue_median": med("regenerate", "vs_continue"),
        "regenerate_vs_continue_cpu_median": med("regenerate", "cpu_vs_continue"),
        "continue_warm_vs_uninterrupted_median": med("continue", "warm_vs_uninterrupted"),
        "regenerate_vs_continue_warm_median": med("regenerate", "warm_vs_continue"),
        "regenerate_vs_continue_warm_cpu_median": med("regenerate", "warm_cpu_vs_continue"),
        "steps_lost_median": med_save("steps_lost"),
        "steps_lost_target": TARGET_STEPS_LOST,
        "steps_lost_met": (med_save("steps_lost") if med_save("steps_lost") is not None else math.inf)
        <= TARGET_STEPS_LOST,
        "steps_lost_after_median": med_save("steps_lost_after"),
        "twin_steps_lost_after_median": med_save("twin_steps_lost_after"),
        "steps_lost_after_vs_twin_median": med_save("steps_lost_after_vs_twin"),
        "tok_s_around_vs_twin_median": med_save("tok_s_around_vs_twin"),
        "bytes_per_in_flight_token_excl_sampler_state_median": (
            save["bytes_per_in_flight_token_excl_sampler_state"] or {}
        ).get("median"),
        "bytes_per_token_target": TARGET_BYTES_PER_TOKEN,
        "bytes_per_token_met": ((save["bytes_per_in_flight_token_excl_sampler_state"] or {}).get("median") or math.inf)
        <= TARGET_BYTES_PER_TOKEN,
    }
    summary["identity"] = identity(reps)
    summary["consistent_all_reps"] = all(r["consistent"] for r in reps)
    summary["exact_all_reps"] = all(
        r["exact"]["continue_equals_uninterrupted"]
        == r["exact"]["samples"]
        == r["exact"]["regenerate_equals_uninterrupted"]
        for r in reps
    )
    return summary


def identity(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Token identity of the samples in flight at the cut, over every repetition: continue next to the noise floor.

    The noise floor is regenerate against uninterrupted on the same samples
    (:func:`benchmarks.resume.measure.exactness`). Results written before these keys existed are
    recounted from their ``mismatches`` and have no logprob figures (``None``).
    """
    samples = cont = noise = 0
    kept: int | None = 0
    worst: dict[str, float | None] = {"continue": 0.0, "noise_floor": 0.0}
    for r in reps:
        e = r["exact"]
        if "in_flight" in e:
            n, c, f = e["in_flight"], e["continue_identical_in_flight"], e["noise_floor_identical_in_flight"]
            kept = None if kept is None else kept + e["prefix_bit_identical"]
            for key in worst:
                old = worst[key]
                worst[key] = None if old is None else max(old, e[f"{key}_max_logprob_diff"])
        else:
            n = r["workload"]["samples_in_flight"]
            c = n - _diverged(e["mismatches"], "continue_vs_uninterrupted")
            f = n - _diverged(e["mismatches"], "regenerate_vs_uninterrupted")
            kept, worst = None, {"continue": None, "noise_floor": None}
        samples, cont, noise = samples + n, cont + c, noise + f
    return dict(
        samples_in_flight=samples,
        continue_identical=cont,
        noise_floor_identical=noise,
        continue_rate=cont / samples if samples else None,
        noise_floor_rate=noise / samples if samples else None,
        continue_max_logprob_diff=worst["continue"],
        noise_floor_max_logprob_diff=worst["noise_floor"],
        prefix_bit_identical=kept,
        beyond_noise_floor=cont < noise,
    )


def _diverged(mismatches: list[dict[str, Any]], pair: str) -> int:
    """Samples in flight at the cut (a saved prefix) whose ``pair`` differed."""
    return len({m["sample"] for m in mismatches if m["pair"] == pair and m["prefix_at_cut"]})


def collect(
    points_spec: list[tuple[int, int, int]], results: dict[tuple[int, int], list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """Per-point summaries of the repetitions run so far; the first repetition's timelines are kept."""
    points = []
    for n, length, reps in points_spec:
        done = results[n, length]
        if not done:
            continue
        timeline = done[0].get("timelines")
        kept = [{k: v for k, v in r.items() if k != "timelines"} for r in done]
        points.append(
            dict(
                num_in_flight=n,
                mean_prefix=length,
                reps_planned=reps,
                reps=kept,
                summary=summarize(kept),
                timeline=timeline,
            )
        )
    return points


# --- tables --------------------------------------------------------------------------------------


def table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per sweep point and mode: the medians the README table shows."""
    rows = []
    for p in points:
        s = p["summary"]
        for mode in MODES:
            m = s["modes"][mode]

            def g(k: str, m: dict[str, Any] = m) -> Any:
                return (m.get(k) or {}).get("median")

            rows.append(
                dict(
                    in_flight=p["num_in_flight"],
                    mean_prefix=p["mean_prefix"],
                    mode=mode,
                    reps=len(p["reps"]),
                    recovery_s=g("recovery_s"),
                    recovery_s_min=(m.get("recovery_s") or {}).get("min"),
                    recovery_s_max=(m.get("recovery_s") or {}).get("max"),
                    vs_uninterrupted=g("vs_uninterrupted"),
                    cpu_s=g("cpu_s"),
                    cpu_vs_uninterrupted=g("cpu_vs_uninterrupted"),
                    warm_s=g("warm_s"),
                    warm_vs_uninterrupted=g("warm_vs_uninterrupted"),
                    steps=g("steps"),
                    steps_vs_uninterrupted=g("steps_vs_uninterrupted"),
                    decode_tokens=g("decode_tokens"),
                    prefill_tokens=g("prefill_tokens"),
                    redone_decode_tokens=g("redone_decode_tokens"),
                    useful_tok_s=g("useful_tok_s"),
                    useful_vs_steady=g("useful_vs_steady"),
                    prompts_lost=g("prompts_lost"),
                    prefix_tokens_lost=g("prefix_tokens_lost"),
                )
            )
    return rows


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


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        mem = (
            int(
                next(
                    line.split()[1]
                    for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")
                )
            )
            * 1024
        )
    except (OSError, StopIteration):
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return dict(
        platform=platform.platform(),
        python=platform.python_version(),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        affinity=len(os.sched_getaffinity(0)),
        memory_bytes=mem,
        loadavg_at_end=os.getloadavg(),
        gpu=gpu,
    )


def short_commit() -> str:
    """This checkout's commit, short (empty outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def write_json(out: Path, result: dict[str, Any]) -> None:
    """``result`` as ``out`` with a ``.json`` suffix, its folder made."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")


def versions() -> dict[str, Any]:
    import torch
    import vllm

    commit = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    return dict(vllm=vllm.__version__, torch=torch.__version__, numpy=np.__version__, partial_rollout_commit=commit)


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
