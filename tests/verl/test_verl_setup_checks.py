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
    config = copy.deepcopy(SUPPORTED)
    *parents, last = key.split(".")
    node = config
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return config


@pytest.mark.parametrize("mode", MODES)
def test_the_tested_async_modes_are_supported(mode: str) -> None:
    check_supported(with_value("trainer.v1.trainer_mode", mode))


REFUSED = [
    ("trainer.use_v1", False, "false"),
    ("trainer.v1.trainer_mode", "sync", "sync"),
    ("actor_rollout_ref.rollout.name", "sglang", "sglang"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop", "tool_agent", "tool_agent"),
    ("actor_rollout_ref.rollout.multi_turn.enable", True, "true"),
    ("actor_rollout_ref.actor.checkpoint.async_save", True, "true"),
    ("actor_rollout_ref.rollout.agent.agent_loop_manager_class", "my.Manager", "my.Manager"),
]
"""One unsupported value per requirement, and how the refusal spells it."""


@pytest.mark.parametrize(("key", "value", "spelled"), REFUSED)
def test_an_unsupported_setting_is_refused_in_one_line(key: str, value: object, spelled: str) -> None:
    with pytest.raises(ConfigError) as e:
        check_supported(with_value(key, value))
    message = str(e.value)
    requirement = next(r for r in REQUIREMENTS if r.key == key)
    assert message.startswith(f"{key}: {spelled} is not supported with trainer.v1.partial_rollout_checkpoint on")
    assert requirement.fix in message and "\n" not in message


def test_every_requirement_is_exercised_above() -> None:
    assert [key for key, _, _ in REFUSED] == [r.key for r in REQUIREMENTS]


def test_select_reads_dotted_keys_and_absent_ones_as_none() -> None:
    assert select(SUPPORTED, "actor_rollout_ref.rollout.name") == "vllm"
    assert select(SUPPORTED, "actor_rollout_ref.rollout.agent.agent_loop_manager_class") is None
    assert select(SUPPORTED, "actor_rollout_ref.rollout.name.deeper") is None


@pytest.mark.parametrize(("name", "value"), [("record_events", True), ("on_stale", "drop")])
def test_a_block_setting_not_implemented_for_verl_is_refused_not_ignored(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        check_supported(with_value(f"trainer.v1.partial_rollout_checkpoint.{name}", value))
    assert info.value.field == f"trainer.v1.partial_rollout_checkpoint.{name}"
    assert "not implemented for verl yet" in str(info.value)


def test_separate_async_is_refused_until_it_is_tested() -> None:
    with pytest.raises(ConfigError, match="separate_async"):
        check_supported(with_value("trainer.v1.trainer_mode", "separate_async"))
