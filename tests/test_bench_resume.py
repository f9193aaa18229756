"""The resume-throughput benchmark end to end, on a tiny configuration (three real engine starts).

Runs ``python -m benchmarks.resume_throughput`` as a user would, in a subprocess (vLLM spawns
processes and binds to one event loop), and checks the JSON it writes: every mode is there,
continue redid no decode token, the benchmark's figures agree with the snapshot it wrote, and the
save's cost is there in engine steps, with its windows and its no-save twin. No timing is asserted;
the step timeline that cost is measured on is checked on synthetic step logs.

The benchmarks are not part of the installed package: they run from the repository root, which
``python -m`` puts first on the import path, so the copy in the checkout is the one that runs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.resume.steps import StepLog, Timeline, cost, windows

ROOT = Path(__file__).resolve().parents[1]


def test_benchmarks_run_from_the_repository_root() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.resume_throughput", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "--full" in proc.stdout
    code = (
        "import benchmarks.resume_throughput, benchmarks.resume.phases as p, benchmarks.snapshot_io as s;"
        " print(p.__file__); print(s.__file__)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [Path(line) for line in proc.stdout.split()] == [
        ROOT / "benchmarks/resume/phases.py",
        ROOT / "benchmarks/snapshot_io.py",
    ]


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_tiny_benchmark_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.resume_throughput",
            "--samples",
            "8",
            "--prefix",
            "32",
            "--reps",
            "1",
            "--max-model-len",
            "512",
            "--max-num-seqs",
            "32",
            "--kv-cache-bytes",
            str(256 * 2**20),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.with_name("bench.json").read_text())
    for name in ("bench_recovery.png", "bench_timeline.png", "bench_ratio.png"):
        assert out.with_name(name).stat().st_size > 10_000

    assert result["consistency"]["passed"], result["consistency"]["failed"]
    assert result["continue_redone_decode_tokens_max"] == 0
    exact = result["points"][0]["reps"][0]["exact"]
    assert "mismatches" in exact  # exactness is reported here, asserted in test_resume_exact
    # token identity next to the engine's noise floor, on the samples in flight at the cut only
    assert exact["in_flight"] == result["points"][0]["reps"][0]["workload"]["samples_in_flight"] == 8
    assert exact["prefix_bit_identical"] == 8  # the saved prefix, its logprobs and versions, bit for bit
    ident = result["points"][0]["summary"]["identity"]
    assert ident["samples_in_flight"] == 8
    assert ident["beyond_noise_floor"] == (ident["continue_identical"] < ident["noise_floor_identical"])
    assert result["exact"]["beyond_noise_floor"] == (["8x32"] if ident["beyond_noise_floor"] else [])
    assert "noise floor" in result["markdown"]
    flag = "DIVERGENCE BEYOND THE NOISE FLOOR" if ident["beyond_noise_floor"] else "within the noise floor"
    assert f"{flag}: 8x32: continue token-identical to uninterrupted for" in proc.stdout
    for key in ("machine", "versions", "config", "definitions", "table", "markdown"):
        assert key in result
    (point,) = result["points"]
    (rep,) = point["reps"]
    assert set(rep["modes"]) == {"uninterrupted", "drop", "regenerate", "continue"}
    assert set(point["summary"]["modes"]) == set(rep["modes"])
    assert {row["mode"] for row in result["table"]} == set(rep["modes"])

    work, modes = rep["workload"], rep["modes"]
    assert work["samples_in_flight"] == 8 and work["groups_pending"] == 1
    assert modes["continue"]["redone_decode_tokens"] == 0
    assert modes["continue"]["decode_tokens"] == work["remaining_tokens"]
    assert modes["regenerate"]["redone_decode_tokens"] == work["prefix_tokens"] > 0
    assert modes["drop"]["prompts_lost"] == work["groups"]
    assert modes["drop"]["prefix_tokens_lost"] == work["prefix_tokens"]
    assert modes["uninterrupted"]["redone_decode_tokens"] == 0
    for mode in ("uninterrupted", "regenerate", "continue"):
        assert modes[mode]["recovery_s"] > 0 and modes[mode]["steps"] > 0 and modes[mode]["cpu_s"] > 0
    assert modes["regenerate"]["warm_s"] > 0 and modes["continue"]["warm_s"] > 0
    save = rep["save"]
    assert save["snapshot_bytes"] > 0 and save["load_s"] > 0 and rep["floor"]["floor_s"] > 0
    parts = {
        k: save[f"bytes_{k}"]
        for k in (
            "token_data",
            "prompts",
            "sampler_state",
            "per_sample_fields",
            "per_group_fields",
            "other_tensors",
            "header_sampling_tables",
            "header_rest",
        )
    }
    assert sum(parts.values()) == save["snapshot_bytes"], parts
    assert parts["sampler_state"] == save["sampler_state_bytes"]  # 0 where the engine derives it from the seed
    assert 8.0 <= save["token_data_bytes_per_token"] < 9.0  # int32 token + float32 logprob, plus version runs

    # What the save cost the engine, which is never paused: no stall figure is left, and the windows nest.
    assert not {"pause_ms", "stop_ms", "freeze_ms", "stall_ms", "stall_in_decode_steps"} & set(save)
    assert 0 <= save["cut_ms"] <= save["gate_ms"] <= save["written_ms"]
    assert save["after_window_ms"] > 0
    assert save["engine_tokens"] == save["in_flight_tokens"]  # fresh requests: the cut's tokens are the prefixes
    end_ms = save["gate_ms"] + save["after_window_ms"]
    for run in ("", "twin_"):
        # measured: the engine decoded throughout the save's own window (every sample had >= 16 tokens to go)
        assert isinstance(save[f"{run}steps_lost"], float) and save[f"{run}steady_step_ms"] > 0, run
        assert save[f"{run}decoding_until_ms"] > save["gate_ms"], run
        # the window after it is measured where the engine decoded without a gap through it; on a slow or
        # shared machine the write can outlast this tiny workload's decoding (775 ms in one CI run): then
        # the engine stood idle inside the window, and the figure is null and says where
        measured = save[f"{run}decoding_until_ms"] > end_ms
        assert isinstance(save[f"{run}steps_lost_after"], float) == measured, (run, save)
        if measured:
            assert isinstance(save[f"{run}tok_s_around"], float), (run, save)
    if save["steps_lost_after"] is not None and save["twin_steps_lost_after"] is not None:
        diff = save["steps_lost_after"] - save["twin_steps_lost_after"]
        assert save["steps_lost_after_vs_twin"] == pytest.approx(diff)
    else:
        assert save["steps_lost_after_vs_twin"] is None
    if save["tok_s_around"] is not None:
        assert save["around_vs_steady"] == pytest.approx(save["tok_s_around"] / save["steady_tok_s"])
    if save["around_vs_steady"] is not None and save["twin_around_vs_steady"] is not None:
        assert save["tok_s_around_vs_twin"] == pytest.approx(save["around_vs_steady"] / save["twin_around_vs_steady"])
    targets = point["summary"]["targets"]
    assert targets["steps_lost_target"] == 0.1
    assert targets["steps_lost_median"] == save["steps_lost"]  # one repetition
    assert targets["steps_lost_met"] == (save["steps_lost"] <= 0.1)
    verdict = "met" if targets["steps_lost_met"] else "NOT MET"
    assert f"{verdict}: 8x32: median engine decode steps lost" in proc.stdout
    assert {"steps_lost", "steps_lost_after", "twin_*", "tok_s_around_vs_twin"} <= set(result["definitions"])
    for stat in point["summary"]["modes"]["continue"]["recovery_s"], point["summary"]["save"]["steps_lost"]:
        assert stat["min"] <= stat["median"] <= stat["max"]


def _log(durations: list[float], *, lag: float = 0.0005, start: float = 100.0, tokens: int = 4) -> StepLog:
    """A step log of steps lasting ``durations`` (``nan``: a step after a gap), each received ``lag`` after its end."""
    log = StepLog()
    end = start
    for d in durations:
        end += 0.05 if math.isnan(d) else d  # a gap: the engine stood idle 50 ms, then ran one step
        log.received.append(end + lag)
        log.tokens.append(tokens)
        log.durations.append(d)
    return log


def test_step_timeline_is_anchored_to_the_engine_clock() -> None:
    """Step ends are the engine-side durations summed, put as close before the front end's times as any step came.

    A front end that stalls (a save holding the event loop) receives a burst of steps late; their
    ends stay where the engine ran them.
    """
    log = _log([math.nan] + [0.01] * 99)
    for i in range(40, 50):  # the front end blocked: steps 40-49 (ended by 100.54 s) all received at 100.6 s
        log.received[i] = 100.6
    timeline = Timeline.of(log)
    assert timeline.ends[1:] - timeline.ends[:-1] == pytest.approx([0.01] * 99)
    assert timeline.ends[0] == pytest.approx(100.05, abs=0.001)  # late by the smallest lag (0.5 ms) at most
    assert not timeline.known[0] and timeline.known[1:].all()
    assert timeline.steady(timeline.ends[60]) == pytest.approx((100.0, 400.0))  # steps/s, tokens/s


def test_steps_lost_is_zero_at_a_steady_pace_and_counts_a_slow_step() -> None:
    """Lost = steady rate x window - steps run: 0 at the steady pace, a stretched step's excess in steps, signed."""
    steady = _log([math.nan] + [0.01] * 99)
    tl = Timeline.of(steady)
    a = tl.ends[50] + 0.0037  # windows need not start or end on a step's end
    assert tl.lost(a, a + 0.1234, 100.0) == pytest.approx(0, abs=1e-9)
    slow = Timeline.of(_log([math.nan] + [0.01] * 59 + [0.025] + [0.01] * 39))  # step 60: 1.5 steps too long
    a = slow.ends[55]
    assert slow.lost(a, slow.ends[70], 100.0) == pytest.approx(1.5)
    fast = Timeline.of(_log([math.nan] + [0.01] * 59 + [0.005] + [0.01] * 39))
    assert fast.lost(fast.ends[55], fast.ends[70], 100.0) == pytest.approx(-0.5)  # noise can make it negative
    paused = Timeline.of(_log([math.nan] + [0.01] * 59 + [0.2] + [0.01] * 39))  # a weight update's pause
    assert paused.steady(paused.ends[80], 32, robust=True)[0] == pytest.approx(100.0)  # is not the engine's pace
    assert paused.steady(paused.ends[80], 32)[0] == pytest.approx(31 / (30 * 0.01 + 0.2))


def test_a_window_over_an_idle_gap_is_not_measured() -> None:
    tl = Timeline.of(_log([math.nan] + [0.01] * 20 + [math.nan] + [0.01] * 20))
    assert math.isnan(tl.steps_at(tl.ends[21] - 0.001))  # inside the gap before step 21
    assert not math.isnan(tl.steps_at(tl.ends[30]))
    assert math.isnan(tl.steady(tl.ends[23])[0])  # fewer than 4 steps since the gap
    w = windows(gate_s=0.001, written_s=0.02, steady_steps_per_s=100.0)
    assert w.end_s == pytest.approx(0.02 + 0.16)
    t_cut = tl.ends[20] - 0.002
    figures = cost(tl, t_cut, w)
    assert figures["steps_lost"] is not None and figures["steps_lost_after"] is None
    assert figures["decoding_until_ms"] == pytest.approx(1000 * (tl.ends[20] - t_cut))  # why: the engine went idle
    assert math.isnan(tl.decoding_until(tl.ends[0] - 0.001))  # before the first step
    assert tl.decoding_until(tl.ends[30]) == tl.ends[-1]  # no gap after it: the log's last step


def test_trainer_saves_are_placed_from_the_event_log() -> None:
    """A save's window ends at its ``save`` event and starts ``gate_ms`` earlier; the step before it, which does not
    save, gets a mark at the same offset from its ``train_step`` event (the estimator where nothing is saved)."""
    from benchmarks.resume.trainer_saves import marks

    def train(step: int, t: float) -> dict[str, object]:
        return {"event": "log", "kind": "train_step", "step": step, "time": t}

    events = [
        train(1, 1000.0),
        train(2, 1001.0),
        {"event": "save", "save_id": "s2", "step": 2, "time": 1001.302, "gate_ms": 2.0, "engine_cut_ms": 0.5},
        {"event": "save_written", "save_id": "s2", "time": 1001.35},
        train(3, 1002.0),
    ]
    save, before = marks(events, offset=1000.0)  # the wall clock is 1000 s ahead of perf_counter
    assert save["save"] and save["step"] == 2 and save["_t"] == pytest.approx(1.3)
    assert save["written_ms"] == pytest.approx(50.0) and save["engine_cut_ms"] == 0.5
    assert not before["save"] and before["step"] == 1 and before["_t"] == pytest.approx(0.3)
    assert before["_of"] is save  # its windows are the save's
