"""The NeMo RL integration's parts that need neither NeMo RL nor an engine: its config block and the DatumSpec codec."""

from __future__ import annotations

import pytest
import torch

from partial_rollout.errors import ConfigError, SnapshotError
from partial_rollout_integrations.nemo_rl import datum
from partial_rollout_integrations.nemo_rl.config import PartialRolloutsConfig


def test_absent_block_is_off_and_installs_nothing() -> None:
    for checkpointing in (None, {}, {"enabled": True}):
        config = PartialRolloutsConfig.from_checkpointing(checkpointing)
        assert not config.enabled and not config.active


def test_block_is_read_and_validated() -> None:
    config = PartialRolloutsConfig.from_checkpointing({"partial_rollouts": {"enabled": True, "on_stale": "drop"}})
    assert config.enabled and config.active and config.on_stale == "drop"
    with pytest.raises(ConfigError, match=r"checkpointing\.partial_rollouts\.enabeld: unknown key"):
        PartialRolloutsConfig.from_checkpointing({"partial_rollouts": {"enabeld": True}})
    with pytest.raises(ConfigError, match=r"checkpointing\.partial_rollouts\.on_stale: must be one of"):
        PartialRolloutsConfig.from_checkpointing({"partial_rollouts": {"on_stale": "keep"}})
    with pytest.raises(ConfigError, match=r"checkpointing\.partial_rollouts\.enabled: must be true or false"):
        PartialRolloutsConfig.from_checkpointing({"partial_rollouts": {"enabled": "yes"}})
    with pytest.raises(ConfigError, match=r"checkpointing\.partial_rollouts: must be a mapping"):
        PartialRolloutsConfig.from_checkpointing({"partial_rollouts": True})


def _datum() -> dict:
    return {
        "message_log": [{"role": "user", "content": "2+2?", "token_ids": torch.tensor([5, 6, 7])}],
        "length": torch.tensor(3),
        "loss_multiplier": torch.tensor(1.0),
        "extra_env_info": {"ground_truth": "4", "weights": [0.5, 1.5]},
        "task_name": "math",
        "idx": 17,
        "stop_strings": None,
    }


def test_datum_round_trips_through_json_without_pickle() -> None:
    import json

    original = _datum()
    encoded = json.loads(json.dumps(datum.encode(original, field="d")))
    back = datum.decode(encoded, field="d")
    assert back["message_log"][0]["token_ids"].dtype == torch.int64
    assert torch.equal(back["message_log"][0]["token_ids"], original["message_log"][0]["token_ids"])
    assert back["length"].shape == () and int(back["length"]) == 3
    assert back["loss_multiplier"].dtype == torch.float32
    assert back["extra_env_info"] == original["extra_env_info"]
    assert (back["task_name"], back["idx"], back["stop_strings"]) == ("math", 17, None)
    assert datum.prompt_token_ids(back) == [5, 6, 7]


def test_unstorable_field_fails_naming_it() -> None:
    bad = _datum()
    bad["extra_env_info"]["verifier"] = object()
    with pytest.raises(SnapshotError, match=r"d\.extra_env_info\.verifier: a object cannot be stored without pickle"):
        datum.encode(bad, field="d")
    with pytest.raises(SnapshotError, match=r"d\.x: nan has no JSON form"):
        datum.encode({"x": float("nan")}, field="d")
    with pytest.raises(SnapshotError, match=r"d\.t: malformed tensor"):
        datum.decode({"t": {datum.TENSOR_KEY: "int64", "shape": [4], "data": [1, 2]}}, field="d")


def test_a_group_nemo_rl_committed_after_our_cut_is_saved_again_as_we_hold_it(tmp_path) -> None:
    """NeMo RL reads its replay buffer for a checkpoint some awaits after our cut, so a group that
    finishes in between is ready in NeMo RL's buffer and in flight in our snapshot. The resume made
    it ready in the ledger, and the next save wrote it ready with unfinished samples: a checkpoint
    the reader refuses, so the run could not be resumed a second time."""
    from snapshot_helpers import fingerprints, sample, save_ledger

    from partial_rollout.ledger import EventLog, WorkLedger, read_events
    from partial_rollout.snapshot import GroupState, SampleState, load_snapshot
    from partial_rollout_integrations.nemo_rl.session import (
        COMMITTED_AFTER_CUT,
        DATUM_KEY,
        GROUP_KEY,
        NEMO_GROUP_KEY,
    )

    fp, spec = fingerprints(), sample(0, SampleState.NOT_STARTED).sampling
    killed = WorkLedger(EventLog(tmp_path / "events.jsonl", fresh=True))
    killed.record_start()
    for group_id, nemo_id in (("e0:1", "uuid-a"), ("e0:2", "uuid-b")):
        data = {NEMO_GROUP_KEY: nemo_id, DATUM_KEY: datum.encode(_datum(), field="d")}
        killed.yield_group(group_id, [5, 6, 7], [spec, spec], data=data)
        killed.dispatch(group_id, policy_version=3)
    for index in (0, 1):
        killed.finish("e0:2", sample(index, SampleState.FINISHED, 2, sampling=spec, reward=1.0))
    killed.capture({"e0:1/0": sample(0, SampleState.IN_FLIGHT, 4, sampling=spec)})  # e0:1/1 not submitted yet
    save_ledger(killed, tmp_path / "step_2", trainer_step=2, policy_version=3, fingerprints=fp, loader_state=None)
    killed.events.close()

    # NeMo RL's checkpoint holds e0:1 finished (committed after our cut) and lacks e0:2 (taken after its read).
    session = _session(tmp_path, group_size=2)
    again = session.restore(session.ledger.load(tmp_path / "step_2"), in_nemo_buffer=["uuid-a"])
    assert [d[GROUP_KEY] for d in again] == ["e0:2"]  # dispatched again: its finished samples return at once
    assert session.ledger["e0:1"].state is GroupState.READY and session.ledger["e0:2"].state is GroupState.IN_FLIGHT

    # The next save, before NeMo RL trains e0:1: our records of it, in flight with its prefix.
    save_ledger(
        session.ledger, tmp_path / "step_3", trainer_step=3, policy_version=3, fingerprints=fp, loader_state=None
    )
    saved = {g.group_id: g for g in load_snapshot(tmp_path / "step_3").groups}
    assert {k: g.state for k, g in saved.items()} == {"e0:1": GroupState.IN_FLIGHT, "e0:2": GroupState.IN_FLIGHT}
    assert [s.state for s in saved["e0:1"].samples] == [SampleState.IN_FLIGHT, SampleState.NOT_STARTED]
    assert saved["e0:1"].samples[0].num_tokens == 4
    session.ledger.consume(["e0:1"], step=3)  # NeMo RL trains its copy
    events = [e for e in read_events(tmp_path / "events.jsonl") if e.get("prompt") in ("e0:1", "e0:2")][-4:]
    assert [(e["event"], e["prompt"], e.get("reason")) for e in events] == [
        ("ready", "e0:2", None),
        ("ready", "e0:1", COMMITTED_AFTER_CUT),
        ("reopen", "e0:2", None),
        ("consume", "e0:1", None),
    ]


def test_an_environment_step_that_returns_after_its_group_was_aborted_is_dropped(tmp_path) -> None:
    """An environment step returns in a worker thread and is recorded later on the loop: NeMo RL may
    have aborted the group meanwhile (a stale abort at a weight sync), or the run ended."""
    from partial_rollout_integrations.nemo_rl.session import SampleContext

    session = _session(tmp_path, group_size=1)
    ctx = SampleContext("e0:7", 0)
    session.on_env_step(ctx, env_return=None)  # its group was forgotten: nothing to record, nothing raised
    assert ctx.turn == 0 and session.turn_of("e0:7", 0) == 0


def _session(tmp_path, *, group_size: int):
    """A flag-on session with no engine, its event log in ``tmp_path``."""
    from partial_rollout_integrations.nemo_rl.session import GenerationSettings, Session

    settings = GenerationSettings(
        temperature=1.0,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=64,
        max_seq_len=128,
        stop_token_ids=(),
        stop_strings=(),
        seed=0,
    )
    return Session(
        PartialRolloutsConfig(enabled=True),
        events_path=str(tmp_path / "events.jsonl"),
        settings=settings,
        group_size=group_size,
        engine=None,
    )
