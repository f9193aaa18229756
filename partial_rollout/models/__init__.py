"""Tiny causal LMs and tokenizers built offline (see :mod:`partial_rollout.models.tiny`).

Tests, the demo and the benchmarks build the same model from a :class:`TinyModelSpec` with
:func:`build_tiny_model`. Both load on first use: ``python -m partial_rollout.models.tiny`` would
otherwise find its module imported by this package before it runs (runpy warns, and runs it twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model

__all__ = ["TinyModelSpec", "build_tiny_model"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from partial_rollout.models import tiny

    return getattr(tiny, name)
