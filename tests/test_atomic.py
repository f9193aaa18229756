"""A save that dies at any instant leaves the previous file loadable."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from partial_rollout.atomic import TEMP_SUFFIX, atomic_write
from partial_rollout.snapshot import SNAPSHOT_FILENAME, load_snapshot, save_snapshot

REPO = Path(__file__).resolve().parents[1]


def test_atomic_write_replaces_on_success(tmp_path: Path) -> None:
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    with atomic_write(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".state.bin.") and tmp.name.endswith(TEMP_SUFFIX)
        tmp.write_bytes(b"new")
        assert target.read_bytes() == b"old"  # nothing is visible before the block ends
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_atomic_write_keeps_previous_on_error(tmp_path: Path) -> None:
    """An exception mid-write removes the temporary and leaves the previous file untouched."""
    target = tmp_path / "state.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="disk full"), atomic_write(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def test_atomic_write_needs_the_folder(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such folder"), atomic_write(tmp_path / "missing" / "x.bin"):
        pass


def test_a_checkpoint_folder_not_made_yet_gets_the_snapshot_inside_it(tmp_path: Path) -> None:
    """A trainer may cut before it makes its step folder: the snapshot goes inside, not in its place."""
    from snapshot_helpers import example_snapshot

    save_snapshot(example_snapshot(trainer_step=1), tmp_path / "step_1")
    assert sorted(p.name for p in (tmp_path / "step_1").iterdir()) == [SNAPSHOT_FILENAME]
    assert load_snapshot(tmp_path / "step_1").trainer_step == 1
    save_snapshot(example_snapshot(trainer_step=2), tmp_path / "named.safetensors")  # a file, by its suffix
    assert load_snapshot(tmp_path / "named.safetensors").trainer_step == 2
    with pytest.raises(FileNotFoundError, match="no such folder"):  # only the folder itself is made
        save_snapshot(example_snapshot(trainer_step=3), tmp_path / "missing" / "step_3")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["named.safetensors", "step_1"]


def test_refused_snapshot_save_keeps_previous(tmp_path: Path) -> None:
    """A snapshot whose header would exceed safetensors' 100 MB limit is refused; the old file stays."""
    from snapshot_helpers import example_snapshot

    save_snapshot(example_snapshot(trainer_step=1), tmp_path)
    with pytest.raises(ValueError, match="over safetensors' limit"):
        save_snapshot(example_snapshot(trainer_step=2, metadata={"blob": "x" * 100_000_000}), tmp_path)
    assert load_snapshot(tmp_path).trainer_step == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [SNAPSHOT_FILENAME]


WRITER = textwrap.dedent(
    """
    import sys
    import numpy as np
    from partial_rollout.snapshot import (
        Fingerprints, GroupRecord, GroupState, SampleRecord, SampleState, SamplingSpec, Snapshot, save_snapshot,
    )

    path = sys.argv[1]
    rng = np.random.default_rng(0)
    fp = Fingerprints(model="m", tokenizer="t", vocab_size=50_000, vllm_version="v")
    tokens = rng.integers(0, 50_000, 3_000_000, dtype=np.int32)
    logprobs = -rng.random(3_000_000, dtype=np.float32)
    versions = np.zeros(3_000_000, dtype=np.int32)
    groups = [
        GroupRecord(
            group_id=f"g{g}", prompt_token_ids=[1, 2], state=GroupState.IN_FLIGHT, dispatch_version=0,
            samples=[
                SampleRecord(
                    index=0, state=SampleState.IN_FLIGHT, sampling=SamplingSpec(max_tokens=10_000),
                    token_ids=tokens[g * 10_000:(g + 1) * 10_000], logprobs=logprobs[g * 10_000:(g + 1) * 10_000],
                    versions=versions[g * 10_000:(g + 1) * 10_000], sampler_state=bytes(5056),
                )
            ],
        )
        for g in range(300)
    ]
    print("ready", flush=True)
    step = 1
    while True:
        save_snapshot(Snapshot(trainer_step=step, policy_version=0, fingerprints=fp, groups=groups), path)
        step += 1
    """
)


def test_sigkill_during_save_leaves_previous_snapshot_loadable(tmp_path: Path) -> None:
    """Kill a process that keeps saving 26 MB snapshots over one path; the file always loads intact.

    Half the kills wait until a temporary exists (the save is mid-write), half land at random.
    """
    from snapshot_helpers import example_snapshot

    path = tmp_path / SNAPSHOT_FILENAME
    save_snapshot(example_snapshot(trainer_step=0), path)
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    mid_write_kills = 0
    steps = set()
    for attempt in range(6):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, env=env)
        try:
            assert child.stdout.readline() == b"ready\n"
            if attempt % 2 == 0:  # wait until a save is writing its temporary, then kill it
                _wait_for(lambda: list(tmp_path.glob(f".*{TEMP_SUFFIX}")))
                time.sleep(rng.uniform(0, 0.02))
            else:  # wait until a save has completed (the file was replaced), then kill at random
                inode = path.stat().st_ino
                _wait_for(lambda inode=inode: path.stat().st_ino != inode)
                time.sleep(rng.uniform(0.0, 0.5))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        mid_write_kills += bool(list(tmp_path.glob(f".*{TEMP_SUFFIX}")))
        snapshot = load_snapshot(path)  # the real file is always whole
        steps.add(snapshot.trainer_step)
        for leftover in tmp_path.glob(f".*{TEMP_SUFFIX}"):
            leftover.unlink()
    assert mid_write_kills >= 3
    assert steps - {0}


def _wait_for(condition: Callable[[], object], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the saving process made no progress"
        time.sleep(0.001)
