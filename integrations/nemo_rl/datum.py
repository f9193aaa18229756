"""A NeMo RL ``DatumSpec`` (one prompt: message log, environment info, task) to and from JSON.

NeMo RL pickles what it checkpoints (``torch.save`` of DatumSpecs and TensorDicts). A snapshot of
ours holds no pickle: a prompt yielded but not dispatched is kept as JSON inside the snapshot, with
each tensor as ``{"__tensor__": dtype, "shape": [...], "data": [...]}`` (message logs carry
``token_ids`` tensors). A value that JSON cannot hold fails the save and names its field, so no
prompt is kept half.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from partial_rollout.errors import SnapshotError

TENSOR_KEY = "__tensor__"
_DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float32, torch.float64)
}


def encode(value: Any, *, field: str) -> Any:
    """``value`` as JSON-native data; ``field`` names it in the error if it cannot be."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise SnapshotError(f"{value!r} has no JSON form", field=field, fix="Keep finite numbers in DatumSpecs")
        return value
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in _DTYPES:
            raise SnapshotError(f"tensor of dtype {dtype} cannot be stored", field=field)
        return {TENSOR_KEY: dtype, "shape": list(value.shape), "data": value.detach().cpu().flatten().tolist()}
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise SnapshotError(f"key {key!r} is not a string", field=field)
            if key == TENSOR_KEY:
                raise SnapshotError(f"the key {TENSOR_KEY!r} is reserved", field=field)
            out[key] = encode(item, field=f"{field}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [encode(item, field=f"{field}[{i}]") for i, item in enumerate(value)]
    raise SnapshotError(
        f"a {type(value).__name__} cannot be stored without pickle",
        field=field,
        fix="Keep DatumSpec fields to tensors, numbers, strings, lists and dicts, or turn partial rollouts off",
    )


def decode(value: Any, *, field: str) -> Any:
    """The inverse of :func:`encode`."""
    if isinstance(value, dict):
        if TENSOR_KEY in value:
            try:
                dtype = _DTYPES[value[TENSOR_KEY]]
                return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])
            except (KeyError, TypeError, RuntimeError, ValueError) as e:
                raise SnapshotError(f"malformed tensor ({e})", field=field) from e
        return {key: decode(item, field=f"{field}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item, field=f"{field}[{i}]") for i, item in enumerate(value)]
    return value


def prompt_token_ids(datum: Mapping[str, Any]) -> list[int]:
    """The prompt's tokens: every message's ``token_ids`` in order, as NeMo RL's rollout feeds them."""
    ids: list[int] = []
    for message in datum["message_log"]:
        ids.extend(int(t) for t in message["token_ids"].tolist())
    return ids
