"""Plots for :mod:`benchmarks.resume_throughput` results.

``python -m benchmarks.plots benchmarks/results/resume_full.json`` redraws the PNGs next to it:

- ``<prefix>_recovery.png``: recovery time (median, min-max bars) against the mean prefix length,
  one line per mode, one panel per number of in-flight samples; the prefill floor dashed. Rows:
  engine steps (immune to other jobs on the machine), wall-clock seconds, CPU seconds.
- ``<prefix>_timeline.png``: tokens per second across the save, the kill and the resume for one
  sweep point (first repetition): the run that is cut, then the same remainder finished in place
  (uninterrupted), after a restart from the saved prefixes (continue), and from scratch
  (regenerate). Solid: useful tokens/s (tokens not already in the snapshot); dotted: all tokens
  the engine generated (regenerate redoes the prefixes).
- ``<prefix>_ratio.png``: what regenerating from scratch costs over continuing, against the mean
  prefix length, one line per number of in-flight samples: decode tokens, engine steps, and warm
  wall-clock time (medians).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

COLORS = {"uninterrupted": "tab:green", "drop": "tab:gray", "regenerate": "tab:red", "continue": "tab:blue"}


def _rate(timeline: list[list[float]], column: int, window: float = 0.5) -> tuple[list[float], list[float]]:
    """Tokens/s from a cumulative (t, engine, useful) timeline, over sliding windows of ``window`` s."""
    ts, rs = [], []
    j = 0
    for i in range(1, len(timeline)):
        t = timeline[i][0]
        while timeline[j][0] < t - window and j < i - 1:
            j += 1
        dt = t - timeline[j][0]
        if dt > 0:
            ts.append(t)
            rs.append((timeline[i][column] - timeline[j][column]) / dt)
    return ts, rs


def plot_recovery(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({p["num_in_flight"] for p in result["points"]})
    has: Callable[[str], bool] = lambda key: all(key in p["summary"]["modes"]["continue"] for p in result["points"])  # noqa: E731
    rows = ([("steps", "floor_steps", "engine steps")] if has("floor_steps") else []) + [
        ("recovery_s", "floor_s", "recovery time (s)")
    ]
    rows += [("cpu_s", "floor_cpu_s", "CPU time (s)")] if has("cpu_s") else []
    fig, axes = plt.subplots(
        len(rows), len(sizes), figsize=(max(7.5, 5 * len(sizes)), 0.6 + 3.8 * len(rows)), squeeze=False
    )
    for row, (metric, floor_metric, label) in enumerate(rows):
        for ax, n in zip(axes[row], sizes, strict=True):
            pts = sorted((p for p in result["points"] if p["num_in_flight"] == n), key=lambda p: p["mean_prefix"])
            xs = [p["mean_prefix"] for p in pts]
            for mode in ("uninterrupted", "regenerate", "continue"):
                stats = [p["summary"]["modes"][mode][metric] for p in pts]
                med = [s["median"] for s in stats]
                below = [m - s["min"] for m, s in zip(med, stats, strict=True)]
                above = [s["max"] - m for m, s in zip(med, stats, strict=True)]
                err = [below, above]
                ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, color=COLORS[mode], label=mode)
            floor = [p["summary"]["modes"]["continue"][floor_metric]["median"] for p in pts]
            ax.plot(xs, floor, ls="--", marker=".", color=COLORS["continue"], alpha=0.6, label="prefill floor")
            if row == 0:
                lost = ", ".join(
                    f"{p['mean_prefix']}: {int(p['summary']['modes']['drop']['prompts_lost']['median'])}" for p in pts
                )
                reps = ", ".join(str(len(p["reps"])) for p in pts)
                ax.set_title(f"{n} samples in flight (reps {reps})\n(drop loses prompts {lost})", fontsize=9)
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("mean prefix length at the cut (tokens)")
            ax.set_ylabel(f"{label}, median, min-max")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    engine = result["config"]["engine"]
    fig.suptitle(
        f"Recovery after a restart: {Path(engine['model']).name}\nvLLM {result['versions']['vllm']}, "
        f"{result['machine']['cpu_count']} CPUs"
        + (f", {result['machine']['gpu']}" if result["machine"].get("gpu") else ""),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_timeline(result: dict[str, Any], path: Path, point: dict[str, Any] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if point is None:  # the biggest point that has a timeline: the most visible save/kill/resume
        point = max(result["points"], key=lambda p: p["num_in_flight"] * p["mean_prefix"])
    tl = point["timeline"]
    pre = tl["presave"]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    before = [row for row in pre if row[0] <= 0]
    after = [row for row in pre if row[0] >= 0]
    t, r = _rate(before, 1)
    ax.plot(t, r, color="black", label="before the cut (all modes)")
    t, r = _rate(after, 1)
    ax.plot(t, r, color=COLORS["uninterrupted"], label="uninterrupted: remainder in place")
    end_unint = tl["uninterrupted_s"]
    for mode in ("continue", "regenerate"):
        offset = tl["restart_s"][mode]
        rows = tl[mode]
        t, r = _rate(rows, 2)
        ax.plot([x + offset for x in t], r, color=COLORS[mode], label=f"{mode}: useful tokens/s")
        if mode == "regenerate":
            t, r = _rate(rows, 1)
            ax.plot(
                [x + offset for x in t],
                r,
                color=COLORS[mode],
                ls=":",
                alpha=0.7,
                label="regenerate: all generated tokens/s",
            )
        done = offset + rows[-1][0] if rows else offset
        ax.axvline(done, color=COLORS[mode], ls="--", alpha=0.5)
        ax.axvspan(0, tl["restart_s"][mode], color=COLORS[mode], alpha=0.06)
    ax.axvline(0, color="black", lw=1)
    ax.axvline(end_unint, color=COLORS["uninterrupted"], ls="--", alpha=0.5)
    ax.text(0, ax.get_ylim()[1] * 0.95, " cut + save; kill", fontsize=8, va="top")
    ax.text(
        tl["restart_s"]["continue"],
        ax.get_ylim()[1] * 0.85,
        " engine ready + load (continue)",
        fontsize=8,
        va="top",
        color=COLORS["continue"],
    )
    ax.set_xlabel("seconds since the cut (restart modes: engine start-up, + snapshot load for continue, shaded)")
    ax.set_ylabel("tokens / s (0.5 s windows)")
    ax.set_title(
        f"{point['num_in_flight']} samples in flight, mean prefix {point['mean_prefix']} tokens"
        f" (rep 0; save {tl['save_s'] * 1000:.0f} ms in a thread after the cut)",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ratio(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
        (
            "decode tokens",
            lambda m: _median(m["regenerate"], "decode_tokens") / _median(m["continue"], "decode_tokens"),
        ),
        ("engine steps", lambda m: _median(m["regenerate"], "steps_vs_continue")),
        ("wall time, warm engine", lambda m: _median(m["regenerate"], "warm_vs_continue")),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4))
    for ax, (label, ratio) in zip(axes, panels, strict=True):
        for n in sorted({p["num_in_flight"] for p in result["points"]}):
            pts = sorted((p for p in result["points"] if p["num_in_flight"] == n), key=lambda p: p["mean_prefix"])
            ax.plot(
                [p["mean_prefix"] for p in pts],
                [ratio(p["summary"]["modes"]) for p in pts],
                marker="o",
                label=f"{n} in flight",
            )
        ax.axhline(1, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        xs = sorted({p["mean_prefix"] for p in result["points"]})
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("mean prefix length at the cut (tokens)")
        ax.set_title(f"regenerate / continue: {label}", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _median(mode: dict[str, Any], key: str) -> float:
    return float((mode.get(key) or {}).get("median") or float("nan"))


def plot_all(result: dict[str, Any], prefix: Path) -> list[Path]:
    if not result["points"]:
        return []
    return [
        plot_recovery(result, prefix.with_name(prefix.name + "_recovery.png")),
        plot_timeline(result, prefix.with_name(prefix.name + "_timeline.png")),
        plot_ratio(result, prefix.with_name(prefix.name + "_ratio.png")),
    ]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.plots RESULT.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    result = json.loads(path.read_text())
    for p in plot_all(result, path.with_suffix("")):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
