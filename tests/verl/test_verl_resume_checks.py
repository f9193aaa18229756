"""A snapshot that is not of the verl run resuming from it is refused, naming the file and the field.

The checks of :mod:`partial_rollout_integrations.verl.resume_checks` (no verl needed): another run's
snapshot, another ``n``, other sampling, and the last two at set-up on the checkpoint a run resumes
from. ``tests/verl/test_verl_kill_resume.py`` runs one through verl's own entry (a changed temperature:
exit status 3 and the line, before Ray starts).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from snapshot_helpers import example_snapshot

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import SNAPSHOT_FILENAME, GroupState, SampleState, SamplingSpec, Snapshot, save_snapshot
from partial_rollout_integrations.verl.reconcile import TqView
from partial_rollout_integrations.verl.resume_checks import check_before_start, check_resume

PATH = Path("/run/checkpoints/global_step_4/partial_rollouts.safetensors")
ROLLOUT = {"n": 2, "temperature": 1.0, "top_p": 1.0, "top_k": -1}


def _snapshot() -> Snapshot:
    """Two unfinished groups of 2 samples at verl's default sampling: one in flight, one ready."""
    base = example_snapshot()
    spec = SamplingSpec(max_tokens=64, temperature=1.0, top_p=1.0, top_k=0, seed=7)
    groups = []
    for group in base.groups:
        if group.group_id in ("partial-1", "ready-3"):
            samples = [dataclasses.replace(s, sampling=spec) for s in group.samples[:2]]
            groups.append(dataclasses.replace(group, samples=samples))
    return dataclasses.replace(base, groups=groups)


def _tq(*uids: str) -> TqView:
    return TqView(prompts=frozenset(uids), stored=frozenset())


def test_the_snapshot_of_this_checkpoint_passes() -> None:
    snapshot = _snapshot()
    assert [g.state for g in snapshot.groups] == [GroupState.IN_FLIGHT, GroupState.READY]
    check_resume(snapshot, PATH, tq=_tq("partial-1", "ready-3", "another-prompt"), n=2, rollout=ROLLOUT)


def test_another_runs_snapshot_is_refused() -> None:
    with pytest.raises(SnapshotError) as e:
        check_resume(_snapshot(), PATH, tq=_tq("ready-3", "a-prompt-of-this-run"), n=2, rollout=ROLLOUT)
    message = str(e.value)
    assert message.startswith(f"{PATH}: groups: holds 1 of its 2 unfinished prompt groups")
    assert "uid partial-1" in message and "another run or at another step" in message


def test_another_n_is_refused() -> None:
    with pytest.raises(SnapshotError) as e:
        check_resume(_snapshot(), PATH, tq=_tq("partial-1", "ready-3"), n=4, rollout={**ROLLOUT, "n": 4})
    message = str(e.value)
    assert message.startswith(f"{PATH}: groups[partial-1].samples: prompt group partial-1 holds 2 samples")
    assert "actor_rollout_ref.rollout.n=4" in message and "Resume with actor_rollout_ref.rollout.n=2" in message


@pytest.mark.parametrize(
    ("name", "value", "saved"), [("temperature", 0.7, "1.0"), ("top_p", 0.9, "1.0"), ("top_k", 20, "-1")]
)
def test_other_sampling_is_refused(name: str, value: float, saved: str) -> None:
    with pytest.raises(SnapshotError) as e:
        check_resume(_snapshot(), PATH, tq=_tq("partial-1", "ready-3"), n=2, rollout={**ROLLOUT, name: value})
    message = str(e.value)
    assert message.startswith(f"{PATH}: groups[partial-1].samples[0].sampling.{name}: sample 0 of prompt group")
    assert f"sampled with {name}={saved}, the run has actor_rollout_ref.rollout.{name}={value}" in message
    assert f"Resume with actor_rollout_ref.rollout.{name}={saved} as saved" in message


def test_samples_not_started_take_the_runs_sampling() -> None:
    """A sample that had not started is generated afresh under the run's sampling: nothing to refuse."""
    snapshot = _snapshot()
    group = snapshot.groups[0]
    not_started = dataclasses.replace(
        group.samples[1],
        state=SampleState.NOT_STARTED,
        token_ids=[],
        logprobs=[],
        versions=[],
        sampler_state=None,
        inexact=None,
        sampling=SamplingSpec(max_tokens=64, temperature=0.3),
    )
    changed = dataclasses.replace(group, samples=[group.samples[0], not_started])
    snapshot = dataclasses.replace(snapshot, groups=[changed, snapshot.groups[1]])
    check_resume(snapshot, PATH, tq=_tq("partial-1", "ready-3"), n=2, rollout=ROLLOUT)


def test_at_set_up_the_checkpoint_to_resume_from_is_checked(tmp_path: Path) -> None:
    """``resume_mode=resume_path`` names the checkpoint (``auto``'s verl lookup runs in the kill test)."""
    folder = tmp_path / "global_step_4"
    folder.mkdir()
    resume = {"resume_mode": "resume_path", "resume_from_path": str(folder)}
    check_before_start(resume, {**ROLLOUT, "temperature": 0.7})  # no snapshot there: left to the resume
    save_snapshot(_snapshot(), folder / SNAPSHOT_FILENAME)
    check_before_start(resume, ROLLOUT)
    check_before_start({**resume, "resume_mode": "disable"}, {**ROLLOUT, "temperature": 0.7})  # no resume
    with pytest.raises(SnapshotError) as e:
        check_before_start(resume, {**ROLLOUT, "temperature": 0.7})
    assert str(e.value).startswith(f"{folder / SNAPSHOT_FILENAME}: groups[partial-1].samples[0].sampling.temperature: ")
    (folder / SNAPSHOT_FILENAME).write_bytes(b"not a snapshot")
    with pytest.raises(SnapshotError) as e:
        check_before_start(resume, ROLLOUT)
    assert str(e.value).startswith(str(folder / SNAPSHOT_FILENAME))
