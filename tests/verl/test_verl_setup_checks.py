"""The verl settings partial rollouts refuse at set-up, each in one line naming verl's key and the fix
(on plain mappings shaped as verl's config; ``test_verl_env`` runs the same through Hydra and verl)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from partial_rollout.errors import ConfigError
from partial_rollout_integrations.verl.setup_checks import MODES, REQUIREMENTS, check_supported, select

SUPPORTED: dict[str, Any] = {
    "trainer": {"use_v1": True, "v1": {"trainer_mode": "colocate_async"}},
    "actor_rollout_ref": {
        "rollout": {
            "name": "vllm",
            "agent": {"default_agent_loop": "single_turn_agent"},
            "multi_turn": {"enable": False},
        },
        "actor": {"checkpoint": {"async_save": False}},
    },
}
"""verl's defaults for these keys, in the supported async mode (verl's default mode is ``sync``)."""


def with_value(key: str, value: object) -> dict[str, Any]:
    return _set(copy.deepcopy(SUPPORTED), key, value)


@pytest.mark.parametrize("mode", MODES)
def test_the_tested_async_modes_are_supported(mode: str) -> None:
    config = with_value("trainer.v1.trainer_mode", mode)
    config["actor_rollout_ref"]["hybrid_engine"] = False
    check_supported(config)


REFUSED = [
    ("trainer.use_v1", False, "false"),
    ("trainer.v1.trainer_mode", "sync", "sync"),
    ("actor_rollout_ref.hybrid_engine", True, "true"),
    ("actor_rollout_ref.rollout.name", "sglang", "sglang"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop", "tool_agent", "tool_agent"),
    ("actor_rollout_ref.rollout.multi_turn.enable", True, "true"),
    ("actor_rollout_ref.actor.checkpoint.async_save", True, "true"),
    ("actor_rollout_ref.rollout.agent.agent_loop_manager_class", "my.Manager", "my.Manager"),
]
"""One unsupported value per requirement, and how the refusal spells it."""


@pytest.mark.parametrize(("key", "value", "spelled"), REFUSED)
def test_an_unsupported_setting_is_refused_in_one_line(key: str, value: object, spelled: str) -> None:
    requirement = next(r for r in REQUIREMENTS if r.key == key)
    config = with_value(*requirement.when) if requirement.when else copy.deepcopy(SUPPORTED)
    with pytest.raises(ConfigError) as e:
        check_supported(_set(config, key, value))
    message = str(e.value)
    assert message.startswith(f"{key}: {spelled} is not supported with trainer.v1.partial_rollout_checkpoint on")
    assert requirement.fix in message and "\n" not in message


def test_every_requirement_is_exercised_above() -> None:
    assert [key for key, _, _ in REFUSED] == [r.key for r in REQUIREMENTS]


def test_select_reads_dotted_keys_and_absent_ones_as_none() -> None:
    assert select(SUPPORTED, "actor_rollout_ref.rollout.name") == "vllm"
    assert select(SUPPORTED, "actor_rollout_ref.rollout.agent.agent_loop_manager_class") is None
    assert select(SUPPORTED, "actor_rollout_ref.rollout.name.deeper") is None


@pytest.mark.parametrize(("name", "value"), [("on_stale", "drop"), ("on_stale", "regenerate")])
def test_a_block_setting_not_implemented_for_verl_is_refused_not_ignored(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        check_supported(with_value(f"trainer.v1.partial_rollout_checkpoint.{name}", value))
    assert info.value.field == f"trainer.v1.partial_rollout_checkpoint.{name}"
    assert "not implemented for verl yet" in str(info.value)


def test_recording_alone_is_supported_and_still_refuses_what_the_flag_refuses() -> None:
    """``record_events`` with ``enable`` off installs our recorder in verl's run: the same settings are
    refused (and ``on_stale`` still is), since the recorder hooks the same verl code."""
    recording = with_value("trainer.v1.partial_rollout_checkpoint.record_events", True)
    check_supported(recording)
    with pytest.raises(ConfigError, match="actor_rollout_ref.rollout.name: sglang is not supported"):
        check_supported(_set(copy.deepcopy(recording), "actor_rollout_ref.rollout.name", "sglang"))
    with pytest.raises(ConfigError, match="on_stale: drop is not implemented for verl yet"):
        check_supported(_set(recording, "trainer.v1.partial_rollout_checkpoint.on_stale", "drop"))


def test_a_mode_requirement_applies_in_that_mode_only() -> None:
    """verl's default ``hybrid_engine: true`` is refused in ``separate_async`` (untested there), not in colocate."""
    check_supported(with_value("actor_rollout_ref.hybrid_engine", True))
    with pytest.raises(ConfigError, match="actor_rollout_ref.hybrid_engine: true is not supported"):
        check_supported(
            _set(with_value("trainer.v1.trainer_mode", "separate_async"), "actor_rollout_ref.hybrid_engine", True)
        )


def _set(config: dict[str, Any], key: str, value: object) -> dict[str, Any]:
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return config
