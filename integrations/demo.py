"""``partial-rollout demo``: train, SIGKILL, resume, audit; with partial rollouts on, then off.

Registered as a subcommand of the library's ``partial-rollout`` command through the
``partial_rollout.commands`` entry point (``pyproject.toml``): the library imports no trainer.

For each setting of ``checkpointing.partial_rollouts.enabled`` the reference async GRPO trainer
(``integrations/reference_grpo``, config ``configs/demo.yaml``) trains the tiny model in a child
process, is killed with SIGKILL at a random moment after a save that holds work, and is resumed from its
latest checkpoint to the end. Both runs use the same seed and the same drawn step and event count for the kill,
and run side by side. Then the demo audits
each run from its ``events.jsonl`` alone and prints them side by side: prompts yielded, trained,
evicted on purpose, lost, duplicated, stranded (restored in flight but never finished); whether
the resumed loader yielded what the killed one did; what was in flight at the save; tokens
continued versus regenerated; the reward curve. The exit status is 0 only when the run with partial
rollouts on passes (:func:`verdict`).

Under ``--out`` (default ``runs/demo``), per run: ``events.jsonl``, ``audit.json``,
``reward.png`` (reward and generation throughput per step), the checkpoints and the trainer log;
and ``audit.json`` with both runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RUNS = (("on", True), ("off", False))
CHILD_TIMEOUT_S = 1200
"""A trainer process that runs longer than this is taken for hung (a healthy one takes one to three minutes)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="train, kill and resume the reference GRPO trainer with partial rollouts on and off; audit both",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="output folder (default runs/demo; replaced if it exists)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the sampling and the kill moment")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
    p.add_argument(
        "--config",
        default=None,
        help="trainer config (default: the reference trainer's configs/demo.yaml; configs/fast.yaml is a short run)",
    )
    p.add_argument(
        "--trainer",
        choices=("reference", "nemo-rl", "verl"),
        default="reference",
        help="reference: our async GRPO trainer (default); nemo-rl: NeMo RL's real SingleController on the CPU "
        "harness (needs NEMO_RL_SRC and scripts/setup_nemo_rl.sh); verl: verl 0.9.1's own V1 trainer "
        "(colocate_async) on the CPU harness (needs scripts/setup_verl.sh)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.trainer == "nemo-rl":
        return run_nemo_rl(args)
    if args.trainer == "verl":
        return run_verl(args)
    from tqdm import tqdm

    from partial_rollout.ledger import EVENTS_FILENAME, audit
    from partial_rollout.models import TinyModelSpec, build_tiny_model
    from partial_rollout_integrations.kill_resume import side_by_side
    from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config
    from partial_rollout_integrations.reference_grpo.kill_resume import draw_plan, kill_and_resume

    started = time.perf_counter()
    out = Path(args.out)
    config_path = Path(args.config) if args.config else CONFIG_DIR / "demo.yaml"
    base = [f"grpo.seed={args.seed}"] + ([f"grpo.max_num_steps={args.steps}"] if args.steps else [])
    config = load_config(config_path, base)
    print(f"tiny model: {build_tiny_model(TinyModelSpec(arch='llama'))}")
    steps = config.grpo.max_num_steps
    # One drawn step and event count for both runs; each is killed after its first save from that step that holds
    # work: prefixes to continue (on), or unfinished samples, which a save with partial rollouts off leaves out.
    plan = draw_plan(
        random.Random(args.seed),
        save_period=config.checkpointing.save_period,
        max_num_steps=steps,
        holding="prefix_tokens",
    )
    # The run without partial rollouts continues nothing, so any save before the last step may be its kill: on a
    # fast engine its saves can finish every sample first (a CI run's saves of steps 2 to 8 held none unfinished,
    # those of steps 10 and 12 held 2 and 8), and a run never killed shows no loss.
    plans = {True: plan, False: dataclasses.replace(plan, holding="samples_unfinished", before_step=steps)}
    print(
        f"kill plan: SIGKILL {plan.after_events} events after the first save from step {plan.from_step}"
        " that holds work (or at the next step if sooner), then resume"
    )
    bars = {
        name: tqdm(total=steps, desc=f"partial rollouts {name:>3}", unit="step", position=i)
        for i, (name, _) in enumerate(RUNS)
    }

    def train_killed_resumed(name: str, enabled: bool) -> dict[str, Any]:
        run_dir = out / f"partial_rollouts_{name}"
        if run_dir.exists():
            shutil.rmtree(run_dir)
        overrides = [
            *base,
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            f"logger.log_dir={run_dir}",
            f"checkpointing.partial_rollouts.enabled={str(enabled).lower()}",
        ]
        bar = bars[name]

        def on_step(step: int) -> None:
            bar.n = step  # a resume starts again from its checkpoint's step
            bar.refresh()

        attempts = kill_and_resume(
            config_path, overrides, log_dir=run_dir, plans=[plans[enabled]], on_step=on_step, timeout_s=CHILD_TIMEOUT_S
        )
        report = audit(run_dir / EVENTS_FILENAME).to_json()
        report["wall_s"] = round(attempts.wall_s, 1)
        report["processes"] = [dataclasses.asdict(a) for a in attempts.attempts]
        (run_dir / "audit.json").write_text(json.dumps(report, indent=2))
        _plot(report, run_dir / "reward.png", title=f"partial rollouts {name}")
        return report

    results = side_by_side({name: functools.partial(train_killed_resumed, name, enabled) for name, enabled in RUNS})
    for bar in bars.values():
        bar.close()
    kill_plans = {name: vars(plans[on]) for name, on in RUNS}
    (out / "audit.json").write_text(json.dumps({"seed": args.seed, "kill_plans": kill_plans, **results}, indent=2))
    print(format_table(results))
    print(f"\ndemo wall time {time.perf_counter() - started:.0f} s; files under {out}/")
    return 0 if verdict(results["on"]) is None else 1


def run_nemo_rl(args: argparse.Namespace) -> int:
    """The same demo on NeMo RL's SingleController (:mod:`partial_rollout_integrations.nemo_rl.demo`)."""
    from partial_rollout_integrations.nemo_rl.demo import run_demo

    return _run_trainer_demo(args, "NeMo RL SingleController", run_demo, plot=True)


def run_verl(args: argparse.Namespace) -> int:
    """The same demo on verl's V1 trainer (:mod:`partial_rollout_integrations.verl.demo`); off, verl only records.

    verl logs no training metrics to the work ledger, so this demo draws no reward curve."""
    from partial_rollout_integrations.verl.demo import VerlEnvironment, reissues, run_demo

    VerlEnvironment.from_environ()  # no .venv-verl: one line naming the fix, before anything runs
    return _run_trainer_demo(args, "verl 0.9.1 V1 trainer (colocate_async)", run_demo, plot=False, footer=reissues)


def _run_trainer_demo(
    args: argparse.Namespace,
    trainer: str,
    run_demo: Callable[..., dict[str, dict[str, Any]]],
    *,
    plot: bool,
    footer: Callable[[dict[str, dict[str, Any]]], str] | None = None,
) -> int:
    """An integration's demo (``run_demo(out, seed=)``: both runs' audits), its table and its verdict."""
    started = time.perf_counter()
    out = Path(args.out)
    for name, _ in RUNS:
        shutil.rmtree(out / f"partial_rollouts_{name}", ignore_errors=True)
    print(f"{trainer}, partial rollouts on and off side by side: train, SIGKILL, resume, audit")
    results = run_demo(out, seed=args.seed)
    out.mkdir(parents=True, exist_ok=True)
    if plot:
        for name, report in results.items():
            _plot(report, out / f"partial_rollouts_{name}" / "reward.png", title=f"{trainer}, partial rollouts {name}")
    (out / "audit.json").write_text(json.dumps({"seed": args.seed, "trainer": args.trainer, **results}, indent=2))
    print(format_table(results))
    if footer is not None:
        print(footer(results))
    print(f"\ndemo wall time {time.perf_counter() - started:.0f} s; files under {out}/")
    return 0 if verdict(results["on"]) is None else 1


def verdict(report: dict[str, Any]) -> str | None:
    """Why a run with partial rollouts on failed its audit (None: it passed).

    Nothing lost, duplicated or stranded, the resumed loader yielded what the killed one did, and
    the resume continued saved prefixes (tokens continued > 0)."""
    problems = [f"{key} {report[key]}" for key in ("lost", "duplicated", "stranded") if report[key]] + [
        f"loader cursor mismatch {m}" for m in report["cursor_mismatches"]
    ]
    if report["resumes"] and report["resumes"][0]["prefix_tokens_at_save"] and not report["tokens_continued"]:
        problems.append("no saved prefix was continued")
    return "; ".join(problems) or None


def _rewards(report: dict[str, Any]) -> list[float]:
    return [s["reward"] for s in report["steps"]]


def _curve(report: dict[str, Any], every: int = 4) -> str:
    rewards = _rewards(report)
    chunks = [rewards[i : i + every] for i in range(0, len(rewards), every)]
    return " ".join(f"{sum(c) / len(c):.2f}" for c in chunks)


def format_table(results: dict[str, dict[str, Any]]) -> str:
    """The side-by-side audit of the runs (columns in ``results`` order)."""

    def resumed(report: dict[str, Any], key: str) -> Any:
        return report["resumes"][0][key] if report["resumes"] else "-"

    def by_state(report: dict[str, Any], key: str) -> str:
        if not report["resumes"]:
            return "-"
        d = report["resumes"][0][key]
        return f"{d.get('pending', 0)}/{d.get('in_flight', 0)}/{d.get('ready', 0)}"

    rows: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("prompts yielded", lambda r: r["yielded"]),
        ("prompts trained", lambda r: r["trained"]),
        ("evicted on purpose", lambda r: f"{r['evicted']} {r['evicted_by_reason'] or ''}".strip()),
        ("untrained at the end (not lost)", lambda r: r["outstanding_at_end"]),
        ("LOST", lambda r: r["lost"]),
        ("DUPLICATED", lambda r: r["duplicated"]),
        ("STRANDED (restored, never finished)", lambda r: r["stranded"]),
        ("loader cursor as before the kill", lambda r: "no" if r["cursor_mismatches"] else "yes"),
        ("resumed from step", lambda r: resumed(r, "step")),
        ("at that save: groups pend/fly/ready", lambda r: by_state(r, "outstanding_at_save_by_state")),
        ("  of which saved  pend/fly/ready", lambda r: by_state(r, "saved_by_state")),
        ("  unfinished samples", lambda r: resumed(r, "samples_unfinished_at_save")),
        ("  prefix tokens saved", lambda r: resumed(r, "prefix_tokens_at_save")),
        ("tokens continued from prefixes", lambda r: r["tokens_continued"]),
        ("tokens regenerated (rolled back)", lambda r: r["tokens_regenerated"]),
        ("work rolled back: consumes redone", lambda r: resumed(r, "rolled_back_consumes")),
        ("reward first 4 -> last 4 steps", lambda r: _first_last(r)),
        ("wall time (s)", lambda r: r["wall_s"]),
    ]
    names = list(results)
    width = 38
    lines = [f"{'':<{width}}" + "".join(f"{'partial rollouts ' + n:>24}" for n in names)]
    lines.append("-" * (width + 24 * len(names)))
    for label, get in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{get(results[n])!s:>24}" for n in names))
    lines.append("")
    for n in names:
        if _rewards(results[n]):  # verl's runs log no rewards to the ledger
            lines.append(f"reward curve ({n}, mean of 4 steps): {_curve(results[n])}")
    return "\n".join(lines)


def _first_last(report: dict[str, Any]) -> str:
    rewards = _rewards(report)
    if len(rewards) < 8:
        return "-"
    return f"{sum(rewards[:4]) / 4:.2f} -> {sum(rewards[-4:]) / 4:.2f}"


def _plot(report: dict[str, Any], path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [s["step"] for s in report["steps"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.plot(steps, [s["reward"] for s in report["steps"]], marker=".", color="tab:blue")
    top.set_ylabel("reward (mean of the step's samples)")
    top.set_title(title)
    bottom.plot(steps, [s["tokens_per_s"] for s in report["steps"]], marker=".", color="tab:green")
    bottom.set_ylabel("generated tokens/s")
    bottom.set_xlabel("training step")
    for r in report["resumes"]:
        for ax in (top, bottom):
            ax.axvline(r["step"], color="tab:red", linestyle="--", linewidth=1)
    top.text(
        0.01,
        0.95,
        "dashed: resumed from this step's checkpoint after SIGKILL",
        transform=top.transAxes,
        fontsize=8,
        va="top",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
