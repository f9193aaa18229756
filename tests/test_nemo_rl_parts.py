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
