"""The trainer's checkpoint on a real engine: cut in memory while frozen, written after the resume, failure-safe.

One in-process run of the fast config (6 steps, a save every 2) on the real vLLM engine, whose
snapshot writer fails half-way through the step-4 file with ``ENOSPC``, then a resume of that run
from its latest checkpoint on the same engine. Every assertion reads the files and the event log.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from partial_rollout.checkpoint import FrozenWindow
from partial_rollout.engine import EngineConfig
from partial_rollout.engine.protocol import Capabilities, Cut, Progress
from partial_rollout.ledger import EVENTS_FILENAME, audit, read_events
from partial_rollout.pool import EnginePool
from partial_rollout.snapshot import Fingerprints, SampleRecord, SamplingSpec, load_snapshot
from partial_rollout.snapshot import container as snapshot_container
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config, run_training

pytestmark = pytest.mark.engine

FAILING_STEP = 4


class FreezeWatch:
    """A real engine that remembers whether a checkpoint's window is open (from its cut until the thaw)."""

    def __init__(self, engine: EnginePool) -> None:
        self.engine = engine
        self.frozen = False

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingSpec,
        *,
        index: int,
        resume_from: SampleRecord | None = None,
    ) -> SampleRecord:
        return await self.engine.generate(request_id, prompt_token_ids, sampling, index=index, resume_from=resume_from)

    async def cut(self) -> Cut:
        cut = await self.engine.cut()
        self.frozen = True  # until the window thaws (see the fixture)
        return cut

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        await self.engine.update_weights(weights_dir, policy_version)

    async def fingerprints(self) -> Fingerprints:
        return await self.engine.fingerprints()

    async def capabilities(self) -> Capabilities:
        return await self.engine.capabilities()

    async def progress(self) -> Progress:
        return await self.engine.progress()

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def shutdown(self) -> None:
        await self.engine.shutdown()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("save")
    overrides = [
        f"checkpointing.checkpoint_dir={root / 'checkpoints'}",
        f"logger.log_dir={root}",
        "grpo.max_num_steps=6",
    ]
    config = load_config(CONFIG_DIR / "fast.yaml", overrides)
    resumed_config = load_config(CONFIG_DIR / "fast.yaml", [*overrides[:2], "grpo.max_num_steps=8"])
    seen: dict[str, Any] = {"writes": []}
    real_write = snapshot_container.write_file

    def write_file(path: Any, tensors: Any, metadata: Any) -> int:
        step = int(Path(path).parent.name.removeprefix("step_").removesuffix(".tmp"))
        seen["writes"].append((step, watch.frozen))
        if step != FAILING_STEP:
            return real_write(path, tensors, metadata)
        earlier = root / "checkpoints" / "step_2" / "partial_rollouts.safetensors"
        seen["step_2_sha"] = hashlib.sha256(earlier.read_bytes()).hexdigest()
        with open(path, "wb") as f:  # half a file, then the disk is full
            f.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))

    async def train() -> None:
        nonlocal watch
        gen = config.generation
        from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model

        engine = await EnginePool.local(
            EngineConfig(
                model=str(build_tiny_model(TinyModelSpec(arch="llama"))),
                max_model_len=gen.max_model_len,
                max_num_seqs=gen.max_num_seqs,
                kv_cache_memory_bytes=gen.kv_cache_memory_bytes,
                multiprocessing=gen.multiprocessing,
                seed=config.grpo.seed,
            )
        )
        watch = FreezeWatch(engine)
        try:
            seen["first"] = await run_training(config, engine=watch, progress=False)  # type: ignore[arg-type]
            snapshot_container.write_file = real_write
            seen["resumed"] = await run_training(resumed_config, resume=True, engine=watch, progress=False)  # type: ignore[arg-type]
        finally:
            await engine.shutdown()

    real_thaw = FrozenWindow.thaw

    async def thaw(window: FrozenWindow) -> None:
        await real_thaw(window)
        watch.frozen = False

    watch: FreezeWatch
    snapshot_container.write_file = write_file
    FrozenWindow.thaw = thaw  # type: ignore[method-assign]
    try:
        asyncio.run(train())
    finally:
        snapshot_container.write_file = real_write
        FrozenWindow.thaw = real_thaw  # type: ignore[method-assign]
    seen["root"] = root
    seen["events"] = list(read_events(root / EVENTS_FILENAME))
    return seen


def test_the_snapshot_is_written_after_the_window_thawed(run: dict[str, Any]) -> None:
    assert [step for step, _ in run["writes"]][:3] == [2, 4, 6]
    assert not any(frozen for _, frozen in run["writes"])  # never inside the frozen window
    saves = [e for e in run["events"] if e["event"] == "save"]
    for save in saves:
        # The window and the write are measured apart: the gate reopens before any byte is written, and it
        # spans the engine's cut (no engine paused for it) and the ledger's copy.
        assert save["cut_ms"] > 0 and save["engine_cut_ms"] >= 0
        assert save["gate_ms"] >= save["engine_cut_ms"] + save["cut_ms"] - 0.002  # each rounded to the us
    written = {e["save_id"]: e for e in run["events"] if e["event"] == "save_written"}
    assert {s["step"] for s in saves if s["save_id"] in written} == {2, 6, 8}
    assert all(w["write_ms"] > 0 and w["bytes"] > 0 for w in written.values())


def test_a_failed_write_keeps_the_previous_checkpoint_and_the_run_goes_on(run: dict[str, Any]) -> None:
    root, events = run["root"], run["events"]
    checkpoints = root / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_2", "step_6", "step_8"]  # no step_4, no .tmp
    after = hashlib.sha256((checkpoints / "step_2" / "partial_rollouts.safetensors").read_bytes()).hexdigest()
    assert after == run["step_2_sha"]
    (failed,) = [e for e in events if e["event"] == "save_failed"]
    assert "No space left on device" in failed["error"]
    failed_save = next(e for e in events if e["event"] == "save" and e["save_id"] == failed["save_id"])
    assert failed_save["step"] == FAILING_STEP
    assert run["first"]["step"] == 6  # training went on past the failed save
    # The next save is whole: it loads, holds what its save event says, and the run resumed from it.
    snapshot = load_snapshot(checkpoints / "step_6")
    (resume,) = [e for e in events if e["event"] == "resume"]
    save_6 = next(e for e in events if e["event"] == "save" and e["save_id"] == resume["save_id"])
    assert save_6["step"] == 6 and [g.group_id for g in snapshot.groups] == save_6["saved"]
    assert snapshot.metadata["ledger"]["last_save_id"] == save_6["save_id"]
    assert run["resumed"]["step"] == 8
    report = audit(root / EVENTS_FILENAME)
    assert report.complete and report.clean, (report.lost_ids, report.duplicated_ids, report.stranded_ids)
    assert report.trained == 8 * 2
