"""The benchmark's figures: one repetition's record, the sweep summary with its targets, the table rows.

Every key here is part of the JSON schema that results already on disk (``benchmarks/results/*.json``)
follow: add keys, do not rename them (:mod:`~benchmarks.resume.report` defines each one).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

from benchmarks.resume.measure import SavedWork, consistency_checks, exactness

if TYPE_CHECKING:
    from benchmarks.resume.phases import Continued, Floor, KilledRun, Lost, Restart

MODES = ("uninterrupted", "drop", "regenerate", "continue")
TARGET_CONTINUE_VS_UNINTERRUPTED = 1.15
TARGET_BYTES_PER_TOKEN = 8.0
TARGET_STEPS_LOST = 0.1
"""Engine decode steps a save may cost (median of ``steps_lost``, signed)."""


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


# --- table rows --------------------------------------------------------------------------------------


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
