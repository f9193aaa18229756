"""Decode steps a save costs the engines in a real trainer run: the reference GRPO trainer's own checkpoints.

The reference trainer (``integrations/reference_grpo``, its fast configuration by default: 12 steps,
a checkpoint every 2) runs on engines that record each step's engine-side time
(:mod:`benchmarks.resume.steps`), and its event log says where every save was: the ``save`` event
is logged as the gate to the engines reopens and carries ``gate_ms`` (from the freeze request until
then), ``save_written`` comes when the snapshot is on disk. So, per save and per engine, the decode
steps lost in the save's window (freeze request to gate), in the window after it (until 16 steady
step times after the write), and the tokens per second from the freeze to the end of that window
over the pace before; the same figures at every training step that does not save, at the same
offset from its ``train_step`` event as the save that follows it (the same windows): what the
estimator gives where nothing is saved.

In a trainer the engine also stops for a reason of its own: every training step loads new weights
into it (a keep-mode pause), just before the checkpoint. The steady rate before a save leaves out
steps over 4 times the median (:meth:`~benchmarks.resume.steps.Timeline.steady`, ``robust``), and
a window the engine spent idle (nothing to generate) is not measured.

Run from the repository root::

    python -m benchmarks.resume.trainer_saves                      # fast config, 1 engine in this process
    python -m benchmarks.resume.trainer_saves --engines 1 2 --runs 2 --out /tmp/t

Writes ``<out>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from benchmarks import provenance
from benchmarks.resume import engine_calls as calls
from benchmarks.resume.steps import StepLog, Timeline, Windows, cost, windows
from partial_rollout.ledger import TRAIN_STEP

RESULTS = Path(__file__).resolve().parents[1] / "results"
CONFIG = Path(__file__).resolve().parents[2] / "integrations" / "reference_grpo" / "configs" / "fast.yaml"
TARGET_STEPS_LOST = 0.1
"""Decode steps a save may cost each engine (its median over the saves, save window)."""
DEFINITIONS = {
    "steps_lost": (
        "an engine's decode steps lost to a save in the save's window (from the trainer's freeze request until the"
        " gate to the engines reopened: the save event's time minus its gate_ms): its steady rate x the window, minus"
        " the steps it ran in it. Steady rate: steps per second over the 32 steps before, leaving out steps over 4x"
        " their median (a weight update pauses the engine just before each checkpoint). Steps timed on the engine's"
        " clock (benchmarks/resume/steps.py), fractional and signed. Target: each engine's median over the saves"
        " <= 0.1"
    ),
    "steps_lost_after": (
        "the same over the window after it: from the gate reopening until 16 steady step times after the"
        " save_written event (the snapshot's write runs in a thread; the trainer then commits its folder)"
    ),
    "no_save_*": (
        "the same figures at each training step that does not save, at the same offset from its train_step event"
        " as the save of the step after it, over the same windows: what the estimator gives where nothing is saved"
    ),
    "around_vs_steady": (
        "tokens per second (all engines) from the freeze request until the end of the window after it, over the"
        " steady tokens per second before it; tok_s_around_vs_no_save: the median of the saves' over the median of"
        " the steps without a save (1 = the save cost nothing)"
    ),
    "measured": (
        "saves (or steps without one: no_save_measured) whose own window every engine spent generating, of total"
        " (the others found an engine idle, or too few steps before); each figure's median is over the marks where"
        " it was measured (the window after a save can run past the end of the work)"
    ),
}


def _clock_offset() -> float:
    """``time.time() - time.perf_counter()`` now: the event log's wall-clock times onto the engines' clock."""
    return time.time() - time.perf_counter()


async def one_run(
    config_path: Path, overrides: Sequence[str], engines: int, folder: Path
) -> tuple[list[dict[str, Any]], list[StepLog], float]:
    """Train once with recording engines; the event log, each engine's step log, and the clock offset."""
    from partial_rollout.engine import EngineConfig
    from partial_rollout.models import TinyModelSpec, build_tiny_model
    from partial_rollout.pool import EnginePool, connect_ray
    from partial_rollout_integrations.reference_grpo import load_config, run_training

    config = load_config(
        config_path,
        [f"checkpointing.checkpoint_dir={folder / 'checkpoints'}", f"logger.log_dir={folder}", *overrides],
    )
    gen = config.generation
    model = config.policy.model_name or str(build_tiny_model(TinyModelSpec(arch="llama")))
    engine_config = EngineConfig(
        model=model,
        max_model_len=gen.max_model_len,
        max_num_seqs=gen.max_num_seqs,
        kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
        multiprocessing=gen.multiprocessing,
        seed=config.grpo.seed,
    )
    if engines == 1:
        log = StepLog()
        pool = EnginePool([await calls.start_recording(engine_config, log)])
    else:
        connect_ray(None, object_store_memory=256 * 2**20, log_to_driver=False)
        pool = await calls.ray_pool(engine_config, engines)
    try:
        before = _clock_offset()
        await run_training(config, engine=pool, progress=False)
        offset = (before + _clock_offset()) / 2
        logs = [log] if engines == 1 else await calls.step_logs(pool)
    finally:
        await pool.shutdown()
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return events, logs, offset


def marks(events: list[dict[str, Any]], offset: float) -> list[dict[str, Any]]:
    """Every save's windows on the engines' clock, and a mark without a save at each training step before one."""
    trained = {e["step"]: e["time"] - offset for e in events if e["event"] == "log" and e.get("kind") == TRAIN_STEP}
    written = {e["save_id"]: e["time"] - offset for e in events if e["event"] == "save_written"}
    out: list[dict[str, Any]] = []
    for e in events:
        if e["event"] != "save" or e["save_id"] not in written or "gate_ms" not in e:
            continue
        gate = e["time"] - offset
        t_cut = gate - e["gate_ms"] / 1e3
        mark = dict(
            save=True,
            step=e["step"],
            gate_ms=e["gate_ms"],
            cut_ms=e.get("cut_ms"),
            engine_cut_ms=e.get("engine_cut_ms"),
            engine_tokens=e.get("engine_tokens"),
            samples_in_flight=e.get("samples_in_flight"),
            written_ms=1e3 * (written[e["save_id"]] - t_cut),
            _t=t_cut,
        )
        out.append(mark)
        step = e["step"]
        if step in trained and step - 1 in trained and step - 1 > 0:
            out.append(dict(save=False, step=step - 1, _t=trained[step - 1] + (t_cut - trained[step]), _of=mark))
    return out


def measure(found: list[dict[str, Any]], timelines: list[Timeline]) -> list[dict[str, Any]]:
    """Each mark's windows (sized by the save it belongs to) and every engine's figures in them."""
    for mark in found:
        save = mark if mark["save"] else mark.pop("_of")
        rates = [r for r in (tl.steady(save["_t"], robust=True)[0] for tl in timelines) if not math.isnan(r)]
        spans: Windows = windows(
            gate_s=save["gate_ms"] / 1e3,
            written_s=save["written_ms"] / 1e3,
            steady_steps_per_s=statistics.median(rates) if rates else 0.0,
        )
        per_engine = [cost(tl, mark["_t"], spans, robust=True) for tl in timelines]
        around = [e["tok_s_around"] for e in per_engine]
        steady = [e["steady_tok_s"] for e in per_engine]
        mark.update(
            after_window_ms=1e3 * (spans.end_s - spans.gate_s),
            per_engine=per_engine,
            measured=all(e["steps_lost"] is not None for e in per_engine),
            around_vs_steady=None
            if None in around or None in steady
            else sum(a for a in around if a is not None) / sum(s for s in steady if s is not None),
        )
    return found


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(found: list[dict[str, Any]], engines: int) -> dict[str, Any]:
    """Each engine's median of each figure over the saves (and steps without one) where it was measured; the target."""
    out: dict[str, Any] = {}
    for kind, chosen in (("", [m for m in found if m["save"]]), ("no_save_", [m for m in found if not m["save"]])):
        out[f"{kind}total"] = len(chosen)
        out[f"{kind}measured"] = sum(m["measured"] for m in chosen)
        for key in ("steps_lost", "steps_lost_after", "steady_step_ms"):
            out[f"{kind}{key}_per_engine"] = [
                _median([m["per_engine"][e][key] for m in chosen]) for e in range(engines)
            ]
        out[f"{kind}around_vs_steady"] = _median([m["around_vs_steady"] for m in chosen])
    worst = [v for v in out["steps_lost_per_engine"] if v is not None]
    out["steps_lost_worst_engine"] = max(worst) if len(worst) == engines else None
    out["steps_lost_target"] = TARGET_STEPS_LOST
    out["steps_lost_met"] = out["steps_lost_worst_engine"] is not None and (
        out["steps_lost_worst_engine"] <= TARGET_STEPS_LOST
    )
    a, b = out["around_vs_steady"], out["no_save_around_vs_steady"]
    out["tok_s_around_vs_no_save"] = a / b if a is not None and b else None
    saves = [m for m in found if m["save"]]
    for key in ("gate_ms", "cut_ms", "engine_cut_ms", "written_ms"):
        out[key] = _median([m[key] for m in saves])
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = dict(
        benchmark="resume_trainer_saves",
        command=" ".join(["python -m benchmarks.resume.trainer_saves", *sys.argv[1:]]),
        machine=dict(cpus=os.cpu_count(), platform=platform.platform(), load_before=os.getloadavg()),
        commit=provenance.short_commit(),
        config=dict(config=str(args.config), overrides=args.override, engines=args.engines, runs=args.runs),
        definitions=DEFINITIONS,
        points=[],
    )
    for n in args.engines:
        found: list[dict[str, Any]] = []
        started = time.perf_counter()
        for r in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="trainer-saves-") as tmp:
                events, logs, offset = await one_run(args.config, args.override, n, Path(tmp))
            run_marks = measure(marks(events, offset), [Timeline.of(log) for log in logs])
            found += [dict(m, run=r) for m in run_marks]
        point = dict(
            engines=n,
            wall_s=time.perf_counter() - started,
            marks=[{k: v for k, v in m.items() if not k.startswith("_")} for m in found],
            **summarize(found, n),
        )
        result["points"].append(point)
        print(_line(point), flush=True)
        provenance.write_json(args.out, result)
    result["machine"]["load_after"] = os.getloadavg()
    provenance.write_json(args.out, result)
    return result


def _num(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _list(values: list[float | None], digits: int = 2) -> str:
    return ", ".join(_num(v, digits) for v in values)


def _line(p: dict[str, Any]) -> str:
    return (
        f"{p['engines']} engine(s): {p['measured']}/{p['total']} saves measured; decode steps lost per save, each"
        f" engine's median {_list(p['steps_lost_per_engine'], 3)} (steps without a save"
        f" {_list(p['no_save_steps_lost_per_engine'], 3)}); after it {_list(p['steps_lost_after_per_engine'])}"
        f" (without {_list(p['no_save_steps_lost_after_per_engine'])}); tokens/s around a save vs without"
        f" {_num(p['tok_s_around_vs_no_save'])}; gate {_num(p['gate_ms'], 1)} ms;"
        f" {'met' if p['steps_lost_met'] else 'NOT MET'} (<= {p['steps_lost_target']})"
    )


def table(result: dict[str, Any]) -> str:
    """The README table of a result: one row per engine count."""
    rows = [
        "| engines | saves measured | decode steps lost per save, each engine (median): save window (steps without"
        " a save) | after it (without) | tok/s around a save / without | gate ms; engine cut ms; write ms |"
        " one decode step ms, each engine |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result["points"]:
        rows.append(
            f"| {p['engines']} | {p['measured']}/{p['total']} | {_list(p['steps_lost_per_engine'], 3)}"
            f" ({_list(p['no_save_steps_lost_per_engine'], 3)}){'' if p['steps_lost_met'] else ' **over 0.1**'}"
            f" | {_list(p['steps_lost_after_per_engine'])} ({_list(p['no_save_steps_lost_after_per_engine'])})"
            f" | {_num(p['tok_s_around_vs_no_save'])} | {_num(p['gate_ms'], 1)}; {_num(p['engine_cut_ms'], 2)};"
            f" {_num(p['written_ms'], 1)} | {_list(p['steady_step_ms_per_engine'], 1)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG, help="the reference trainer's config (default: fast.yaml)")
    ap.add_argument("--override", action="append", default=[], help="a config override, key=value (repeatable)")
    ap.add_argument("--engines", type=int, nargs="+", default=[1], help="engine counts (1 runs in this process)")
    ap.add_argument("--runs", type=int, default=1, help="training runs per engine count")
    ap.add_argument("--out", type=Path, default=RESULTS / "resume_trainer_saves")
    ap.add_argument("--report", type=Path, help="print the README table of this result JSON and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(table(json.loads(args.report.read_text())))
        return 0
    print(table(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
