"""The reference async GRPO trainer: NeMo RL's SingleController loop in miniature, on a CPU.

Run it with ``partial-rollout train CONFIG [key=value ...] [--resume]`` or
``python -m partial_rollout_integrations.reference_grpo CONFIG ...``; ``configs/demo.yaml`` is what
``partial-rollout demo`` trains, ``configs/fast.yaml`` what the tests train.

Modules: ``config`` (YAML + overrides -> checked dataclasses), ``task`` (the toy task),
``grpo`` (advantages, clipped surrogate), ``policy`` (the torch model and its files),
``checkpoint`` (``step_N.tmp`` -> ``step_N``), ``controller`` (the pumps, save, resume),
``kill_resume`` (its command lines and kill plans for the shared kill-and-resume harness).

The names below load on first use, so the ``partial-rollout`` command can register ``train``
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CONFIG_DIR": "config",
    "MasterConfig": "config",
    "load_config": "config",
    "GRPOLoop": "controller",
    "run_training": "controller",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
