"""The NeMo RL methods partial rollouts hook, checked at set-up.

Private methods of NeMo RL's SingleController change often upstream, so the integration names the
commit it was tested on and, before a run starts, looks up every method it hooks. A NeMo RL without
one of them fails at set-up in one line naming the missing method and the tested commit (upstream's
own rule: unsupported configurations fail at set-up), never at the first checkpoint.
"""

from __future__ import annotations

import importlib

from partial_rollout.errors import ConfigError

TESTED_COMMITS = ("7ea279abfbeb698b092856d0dab61e7cf39bc909",)
"""NeMo RL commits the integration's tests ran against (main, 2026-08-22)."""

SEAMS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "nemo_rl.algorithms.single_controller",
        "SingleControllerActor",
        ("_save_checkpoint", "_maybe_restore_replay_buffer", "_rollout_pump", "_sync_weights", "run"),
    ),
    ("nemo_rl.experience.rollout_manager", "RolloutManager", ("generate_and_push", "run_rollout")),
    ("nemo_rl.experience.rollout_manager", "AsyncRolloutImpl", ("run_rollout", "_run_single_rollout")),
    ("nemo_rl.algorithms.async_utils.replay_buffer", "TQReplayBuffer", ("reserve", "commit", "remove", "state_dict")),
    ("nemo_rl.utils.checkpoint", "CheckpointManager", ("init_tmp_checkpoint", "begin_finalization")),
)
"""``(module, class, methods)`` the hooks call or override."""

ATTRIBUTES = (
    ("SingleControllerActor", ("_dataloader", "_buffer", "_rollout_manager", "_checkpointer", "_trainer_version")),
    ("RolloutManager", ("_impl",)),
    ("TQReplayBuffer", ("_group_ids", "ready_list")),
)
"""Instance attributes read or replaced (checked on the live objects, see :func:`check_instance`)."""


def _fail(what: str) -> ConfigError:
    return ConfigError(
        f"this NeMo RL has no {what}",
        field="checkpointing.partial_rollouts.enabled",
        fix=f"Use a NeMo RL commit partial rollouts were tested on ({', '.join(c[:9] for c in TESTED_COMMITS)}) "
        "or turn the flag off",
    )


def check_seams() -> None:
    """Raise :class:`ConfigError` naming the first hooked method this NeMo RL lacks."""
    for module_name, class_name, methods in SEAMS:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise _fail(f"module {module_name} ({e})") from e
        cls = getattr(module, class_name, None)
        cls = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", cls)  # a Ray actor class
        if cls is None:
            raise _fail(f"{module_name}.{class_name}")
        for method in methods:
            if not callable(getattr(cls, method, None)):
                raise _fail(f"{class_name}.{method}")


def check_instance(name: str, obj: object) -> None:
    """Raise :class:`ConfigError` if the live object ``obj`` (of seam class ``name``) lacks an attribute we use."""
    for class_name, attributes in ATTRIBUTES:
        if class_name == name:
            for attribute in attributes:
                if not hasattr(obj, attribute):
                    raise _fail(f"{class_name}.{attribute}")
