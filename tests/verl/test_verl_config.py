"""The ``trainer.v1.partial_rollout_checkpoint`` block: its defaults, validation and round trip,
and its YAML defaults agreeing with the dataclass (no verl needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from partial_rollout.checkpoint import ON_STALE_CHOICES
from partial_rollout.errors import ConfigError
from partial_rollout_integrations.verl.config import BLOCK, PartialRolloutCheckpointConfig

YAML = Path(__file__).resolve().parents[2] / "integrations" / "verl" / "configs" / "partial_rollout_checkpoint.yaml"


def test_absent_block_is_off_and_verl_unchanged() -> None:
    for v1 in (None, {}, {"trainer_mode": "colocate_async"}, {"partial_rollout_checkpoint": None}):
        config = PartialRolloutCheckpointConfig.from_trainer_v1(v1)
        assert config == PartialRolloutCheckpointConfig()
        assert not config.enable and not config.active


def test_the_block_round_trips() -> None:
    config = PartialRolloutCheckpointConfig(
        enable=True, record_events=True, events_path="/x/events.jsonl", allow_vllm_change=True, on_stale="drop"
    )
    raw = dataclasses.asdict(config)
    assert PartialRolloutCheckpointConfig.from_trainer_v1({"partial_rollout_checkpoint": raw}) == config
    assert yaml.safe_load(yaml.safe_dump(raw)) == raw


def test_the_yaml_defaults_are_the_dataclass_defaults() -> None:
    """Our Hydra config is verl's ppo_trainer plus exactly the block's defaults."""
    raw = yaml.safe_load(YAML.read_text())
    assert raw["defaults"] == ["ppo_trainer", "_self_"]
    assert raw["hydra"]["searchpath"] == ["pkg://verl.trainer.config"]
    assert set(raw) == {"hydra", "defaults", "trainer"}
    block = raw["trainer"]["v1"]["partial_rollout_checkpoint"]
    assert block == dataclasses.asdict(PartialRolloutCheckpointConfig())


def test_a_misspelled_key_is_refused_naming_it_and_the_known_ones() -> None:
    with pytest.raises(ConfigError) as e:
        PartialRolloutCheckpointConfig.from_trainer_v1({"partial_rollout_checkpoint": {"enabel": True}})
    message = str(e.value)
    assert message.startswith(f"{BLOCK}.enabel: unknown key 'enabel'")
    assert "Known keys: allow_vllm_change, enable, events_path, on_stale, record_events" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"enable": "yes"}, "enable"),
        ({"record_events": 1}, "record_events"),
        ({"allow_vllm_change": None}, "allow_vllm_change"),
        ({"on_stale": "later"}, "on_stale"),
        ({"events_path": ""}, "events_path"),
        ({"events_path": 3}, "events_path"),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(raw: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"^{BLOCK}.{field}: "):
        PartialRolloutCheckpointConfig.from_trainer_v1({"partial_rollout_checkpoint": raw})


def test_a_block_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ConfigError, match=f"^{BLOCK}: must be a mapping, got bool"):
        PartialRolloutCheckpointConfig.from_trainer_v1({"partial_rollout_checkpoint": True})


def test_on_stale_has_the_library_choices_and_events_go_beside_the_checkpoints() -> None:
    for choice in ON_STALE_CHOICES:
        assert PartialRolloutCheckpointConfig(on_stale=choice).on_stale == choice  # type: ignore[arg-type]
    assert PartialRolloutCheckpointConfig().events_file("ckpt/run") == "ckpt/run/partial_rollouts/events.jsonl"
    assert PartialRolloutCheckpointConfig(events_path="/e.jsonl").events_file("ckpt/run") == "/e.jsonl"
    assert PartialRolloutCheckpointConfig(record_events=True).active
