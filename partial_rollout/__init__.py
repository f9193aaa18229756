"""partial-rollout: lose nothing at a checkpoint in asynchronous RL post-training.

What a trainer needs, importable from the top level::

    from partial_rollout import EngineConfig, EnginePool, RolloutCheckpointer, SamplingSpec

The names are loaded on first use, so ``import partial_rollout.snapshot`` (the format alone, as
``partial-rollout dump`` needs it) does not import the engine adapter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from partial_rollout.checkpoint import Restored, RolloutCheckpointer
    from partial_rollout.engine import EngineConfig, RolloutEngine
    from partial_rollout.ledger import audit
    from partial_rollout.pool import EnginePool
    from partial_rollout.snapshot import GroupState, SamplingSpec

_EXPORTS = {
    "RolloutCheckpointer": "partial_rollout.checkpoint",
    "Restored": "partial_rollout.checkpoint",
    "EngineConfig": "partial_rollout.engine",
    "EnginePool": "partial_rollout.pool",
    "RolloutEngine": "partial_rollout.engine",
    "GroupState": "partial_rollout.snapshot",
    "SamplingSpec": "partial_rollout.snapshot",
    "audit": "partial_rollout.ledger",
}
"""Public name -> the subpackage that defines it."""

__all__ = [
    "EngineConfig",
    "EnginePool",
    "GroupState",
    "Restored",
    "RolloutCheckpointer",
    "RolloutEngine",
    "SamplingSpec",
    "__version__",
    "audit",
]
assert set(__all__) == {"__version__", *_EXPORTS}, "every lazy export is listed"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'partial_rollout' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
