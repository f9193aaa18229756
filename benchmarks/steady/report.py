"""The steady-state benchmark's result: medians per configuration, each of ours against its baseline, table, plot.

A ratio is ours over its baseline. Two are given: the ratio of the medians, and the median of the
paired ratios (ours over the baseline run right before it in the same repetition, so that a burst of
other work on the machine hits both alike). The target is met when the paired median reaches it.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

COMPARISONS: dict[str, tuple[str, str, float]] = {
    "engine / vllm": ("engine", "vllm", 0.97),
    "local / vllm": ("local", "vllm", 0.97),
    "pool-ray-1 / vllm-ray-1": ("pool-ray-1", "vllm-ray-1", 0.9),
    "pool-ray-2 / vllm-ray-2": ("pool-ray-2", "vllm-ray-2", 0.9),
    "pool-ray-1-streams / vllm-ray-1": ("pool-ray-1-streams", "vllm-ray-1", 0.9),
    "pool-ray-2-streams / vllm-ray-2": ("pool-ray-2-streams", "vllm-ray-2", 0.9),
}
"""Each comparison: ours, its baseline, and the rate ours must reach relative to it (issue 33)."""
LABELS = {
    "vllm": "plain vLLM\nin process",
    "engine": "ResumableEngine\nin process",
    "local": "EnginePool.local",
    "vllm-ray-1": "plain vLLM\n1 Ray actor",
    "pool-ray-1": "EnginePool.ray\n1 engine",
    "vllm-ray-2": "plain vLLM\n2 Ray actors",
    "pool-ray-2": "EnginePool.ray\n2 engines",
    "pool-ray-1-streams": "EnginePool.ray, 1 engine\na Ray stream a request",
    "pool-ray-2-streams": "EnginePool.ray, 2 engines\na Ray stream a request",
}


def summarize(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration: median, min and max tokens/s over its repetitions, and median CPU seconds per round."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == name]
        rates = [r["tok_s"] for r in mine]
        rounds = [x for r in mine for x in r["rounds"]]
        cpu = {k: statistics.median(x["cpu_s"].get(k, 0.0) for x in rounds) for k in rounds[0]["cpu_s"]}
        out[name] = dict(
            reps=len(mine),
            median_tok_s=statistics.median(rates),
            min_tok_s=min(rates),
            max_tok_s=max(rates),
            median_round_wall_s=statistics.median(x["wall_s"] for x in rounds),
            median_round_cpu_s=cpu,
        )
    return out


def ratios(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every comparison both configurations of which ran: ratio of medians, paired ratios and their median."""
    summary = summarize(runs)
    out: dict[str, dict[str, Any]] = {}
    for label, (ours, base, target) in COMPARISONS.items():
        if ours not in summary or base not in summary:
            continue
        rate = {(r["config"], r["rep"]): r["tok_s"] for r in runs}
        paired = [rate[ours, rep] / rate[base, rep] for (c, rep) in rate if c == ours and (base, rep) in rate]
        paired_median = statistics.median(paired) if paired else None
        out[label] = dict(
            ours=ours,
            baseline=base,
            target=target,
            ratio_of_medians=summary[ours]["median_tok_s"] / summary[base]["median_tok_s"],
            paired=paired,
            paired_median=paired_median,
            met=paired_median is not None and paired_median >= target,
        )
    return out


def table(result: dict[str, Any]) -> str:
    """Markdown: tokens/s per configuration, then each comparison."""
    summary, compared = result["summary"], result["ratios"]
    rows = [
        "| configuration | tokens/s median [min-max] | reps | CPU s per round (median): by process |",
        "|---|---|---|---|",
    ]
    for name, s in summary.items():
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in s["median_round_cpu_s"].items() if v >= 0.05)
        rows.append(
            f"| {LABELS.get(name, name).replace(chr(10), ' ')} (`{name}`) | {s['median_tok_s']:.0f}"
            f" [{s['min_tok_s']:.0f}-{s['max_tok_s']:.0f}] | {s['reps']} | {cpu} |"
        )
    rows += [
        "",
        "| ours / baseline | paired ratio: median [each] | ratio of medians | target | met |",
        "|---|---|---|---|---|",
    ]
    for label, c in compared.items():
        each = ", ".join(f"{x:.2f}" for x in c["paired"])
        med = "-" if c["paired_median"] is None else f"{c['paired_median']:.3f}"
        rows.append(
            f"| {label} | {med} [{each}] | {c['ratio_of_medians']:.3f} | {c['target']:.2f}"
            f" | {'yes' if c['met'] else '**no**'} |"
        )
    return "\n".join(rows)


def plot(result: dict[str, Any], path: Path) -> Path:
    """Left: tokens/s per configuration (median, min-max bars), baselines grey. Right: the paired ratios against
    their targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, compared = result["summary"], result["ratios"]
    names = list(summary)
    fig, (a, b) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    med = [summary[n]["median_tok_s"] for n in names]
    err = [
        [m - summary[n]["min_tok_s"] for n, m in zip(names, med, strict=True)],
        [summary[n]["max_tok_s"] - m for n, m in zip(names, med, strict=True)],
    ]
    colors = [
        "tab:gray" if n.startswith("vllm") else "tab:orange" if n.endswith("streams") else "tab:blue" for n in names
    ]
    a.bar(range(len(names)), med, yerr=err, capsize=4, color=colors)
    a.set_xticks(range(len(names)), [LABELS.get(n, n) for n in names], fontsize=8)
    a.set_ylabel("generated tokens / s")
    cfg = result["config"]
    a.set_title(
        f"{cfg['requests']} requests x {cfg['max_tokens']} tokens, temperature 1, sampled logprob; plain vLLM reads"
        f" {cfg.get('output_kind', 'final')} outputs{', no text' if cfg.get('plain_no_text') else ''}"
        f" (median of {cfg['reps']}, min-max)",
        fontsize=9,
    )
    labels = list(compared)
    for i, label in enumerate(labels):
        c = compared[label]
        b.scatter([i] * len(c["paired"]), c["paired"], color="tab:blue", alpha=0.5, s=18)
        if c["paired_median"] is not None:
            b.scatter([i], [c["paired_median"]], color="tab:blue", marker="_", s=600)
        b.plot([i - 0.35, i + 0.35], [c["target"]] * 2, ls="--", color="tab:red")
    b.axhline(1.0, color="tab:gray", lw=0.8)
    b.set_xticks(range(len(labels)), [lb.replace(" / ", "\n/ ") for lb in labels], fontsize=8)
    b.set_ylabel("ours / baseline (same repetition)")
    b.set_title("paired ratios (dots), median (bar), target (dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
