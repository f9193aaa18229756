"""A run that reaches its last step while a restored continuation still generates: cut short, not stranded.

A fresh-clone CI run of the kill test resumed with a long group (``e0:313``) in flight, trained its
remaining steps on shorter groups and ended with that group still generating; the audit called it
stranded. Here the same situation is built on purpose, on the real trainer and engine: a checkpoint
at step 2 holding two ready groups (enough for the last step, 3) and one group in flight whose
samples must each generate about 2,000 more tokens, so training ends long before they can.

Then the run is resumed once more, from its last step's checkpoint, as a kill after the last save
resumes it: nothing is left to train, so nothing is continued, and nothing is stranded either.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from snapshot_helpers import save_ledger

from partial_rollout.engine import EngineConfig
from partial_rollout.ledger import EVENTS_FILENAME, EventLog, WorkLedger, audit, read_events
from partial_rollout.pool import EnginePool
from partial_rollout.snapshot import Fingerprints, SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, checkpoint, load_config, run_training, task
from partial_rollout_integrations.reference_grpo.policy import Policy

pytestmark = pytest.mark.engine

SAVED_STEP = 2
MAX_MODEL_LEN = 2048
LONG = "long"
"""The group restored in flight: each sample holds 8 tokens and must generate about 2,000 more."""
FIRST_RESUME = "first_resume.jsonl"
"""The event log as the first resume left it, before the resume from the last step."""


def _checkpoint(root: Path, config: Any, fingerprints: Fingerprints) -> None:
    """What a save at step 2 would hold: the policy, its training info, and a cut with two groups
    ready and ``LONG`` in flight with a short prefix per sample."""
    folder = checkpoint.begin(Path(config.checkpointing.checkpoint_dir), SAVED_STEP)
    Policy(_model(), config).save(folder / checkpoint.POLICY_DIR)
    checkpoint.write_training_info(
        folder,
        {
            "current_step": SAVED_STEP,
            "policy_version": SAVED_STEP,
            "current_epoch": 0,
            "consumed_samples": 0,
            "sampler_name": config.async_rl.sampler.name,
        },
    )
    ledger = WorkLedger(EventLog(root / EVENTS_FILENAME, fresh=True))
    ledger.record_start()
    data = task.BucketTask(config.data, seed=config.grpo.seed)
    n = config.grpo.num_generations_per_prompt
    for k, gid in enumerate(("ready_a", "ready_b")):
        spec = SamplingSpec(max_tokens=8, temperature=1.0, ignore_eos=True, seed=k)
        ledger.yield_group(gid, data[k]["prompt_token_ids"], [spec] * n, data=data[k])
        ledger.dispatch(gid, SAVED_STEP)
        for i in range(n):
            tokens = np.arange(8) + 40 + i
            ledger.finish(
                gid,
                SampleRecord(
                    index=i,
                    state=SampleState.FINISHED,
                    sampling=spec,
                    token_ids=tokens,
                    logprobs=np.full(8, -3.0),
                    versions=np.full(8, SAVED_STEP),
                    finish_reason="length",
                    reward=float(i % 2),
                ),
            )
    item = data[2]
    prompt = item["prompt_token_ids"]
    spec = SamplingSpec(max_tokens=MAX_MODEL_LEN - 16 - len(prompt), temperature=1.0, ignore_eos=True, seed=7)
    ledger.yield_group(LONG, prompt, [spec] * n, data=item)
    ledger.dispatch(LONG, SAVED_STEP)
    ledger.capture(
        {
            f"{LONG}/{i}": SampleRecord(
                index=i,
                state=SampleState.IN_FLIGHT,
                sampling=spec,
                token_ids=np.arange(8) + 60,
                logprobs=np.full(8, -3.0),
                versions=np.full(8, SAVED_STEP),
                inexact="built by the test without a sampler state",
            )
            for i in range(n)
        }
    )
    save_ledger(
        ledger,
        folder,
        trainer_step=SAVED_STEP,
        policy_version=SAVED_STEP,
        fingerprints=fingerprints,
        loader_state=None,
        metadata={"epoch": 0},
    )
    ledger.events.close()
    checkpoint.commit(folder)


def _model() -> Path:
    from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model

    return build_tiny_model(TinyModelSpec(arch="llama"))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The run's folder, and what the trainer logged while resumed from its last step."""
    root = tmp_path_factory.mktemp("end")
    records = _Records()
    config = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.checkpoint_dir={root / 'checkpoints'}",
            f"logger.log_dir={root}",
            f"grpo.max_num_steps={SAVED_STEP + 1}",
            f"generation.max_model_len={MAX_MODEL_LEN}",
        ],
    )

    async def train() -> None:
        gen = config.generation
        engine = await EnginePool.local(
            EngineConfig(
                model=str(_model()),
                max_model_len=gen.max_model_len,
                max_num_seqs=gen.max_num_seqs,
                kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
                multiprocessing=gen.multiprocessing,
                seed=config.grpo.seed,
            ),
            policy_version=SAVED_STEP,
        )
        try:
            _checkpoint(root, config, await engine.fingerprints())
            await run_training(config, resume=True, engine=engine, progress=False)
            shutil.copy(root / EVENTS_FILENAME, root / FIRST_RESUME)
            trainer_log = logging.getLogger("partial_rollout_integrations.reference_grpo.controller")
            trainer_log.addHandler(records)
            try:
                await run_training(config, resume=True, engine=engine, progress=False)
            finally:
                trainer_log.removeHandler(records)
        finally:
            await engine.shutdown()

    asyncio.run(train())
    return root, records.messages


def test_a_continuation_still_generating_at_the_last_step_is_not_stranded(run: tuple[Path, list[str]]) -> None:
    events = list(read_events(run[0] / FIRST_RESUME))
    # The situation of the CI failure: restored in flight, no finish after the resume, outstanding at the end.
    resume = next(i for i, e in enumerate(events) if e["event"] == "resume")
    assert not [e for e in events[resume:] if e["event"] == "finish" and e["prompt"] == LONG]
    end = events[-1]
    assert end["event"] == "end" and end["step"] == SAVED_STEP + 1 and LONG in end["outstanding"]
    report = audit(run[0] / FIRST_RESUME)
    assert report.complete and report.lost == 0 and report.duplicated == 0
    (row,) = report.resumes
    assert row["restored_in_flight"] == 1 and report.stranded == 0 and report.clean, report.stranded_ids
    # Because the engine was still generating every one of its samples when training stopped, and the end event
    # says so (a continuation the trainer never resubmitted would not be running: tests/test_ledger.py).
    progress = next(e for e in reversed(events) if e.get("kind") == "engine_progress")
    samples = list(range(len(next(e for e in events if e["event"] == "save")["in_flight"][LONG])))
    assert all(f"{LONG}/{i}" in progress["live_tokens"] for i in samples)
    assert end["in_flight"][LONG] == samples


def test_a_run_resumed_from_its_last_steps_checkpoint_ends_at_once_and_strands_nothing(
    run: tuple[Path, list[str]],
) -> None:
    folder, messages = run
    events = list(read_events(folder / EVENTS_FILENAME))
    last = max(i for i, e in enumerate(events) if e["event"] == "resume")
    save = next(e for e in events if e["event"] == "save" and e["save_id"] == events[last]["save_id"])
    assert save["step"] == SAVED_STEP + 1 and LONG in save["in_flight"]  # the last step's save, LONG still in it
    # Nothing trained, nothing generated, LONG still outstanding: the user is told why.
    after = events[last + 1 :]
    assert [e["event"] for e in after if e["event"] != "log"] == ["end"]
    assert after[-1]["step"] == SAVED_STEP + 1 and LONG in after[-1]["outstanding"]
    assert [m for m in messages if "nothing left to train" in m] == [
        f"step {SAVED_STEP + 1} is grpo.max_num_steps: nothing left to train (raise it to train on)"
    ]
    report = audit(folder / EVENTS_FILENAME)
    assert len(report.resumes) == 2 and report.resumes[-1]["restored_in_flight"] == len(save["in_flight"])
    assert report.stranded == 0 and report.clean and report.lost == 0 and report.duplicated == 0
