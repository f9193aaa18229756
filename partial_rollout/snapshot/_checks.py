"""Value checks shared by the snapshot's records: each converts a value to its stored type or raises.

Every record validates itself on construction (:mod:`partial_rollout.snapshot.schema`,
:mod:`~partial_rollout.snapshot.sampling`, :mod:`~partial_rollout.snapshot.fingerprints`), and
all of them refuse a bad value the same way: a :class:`ValueError` that names the field and shows
the value, so a bug in the code that builds a snapshot is caught before anything is written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1


def canonical_json(value: Any, *, what: str, sort_keys: bool = False) -> str:
    """Encode ``value`` as compact JSON, refusing anything that would not come back equal.

    Tuples, non-string keys, NaN and infinities, and objects JSON does not know all change (or
    fail) on a round trip, so a snapshot refuses them up front instead of loading something other
    than what was saved.

    Args:
        value: the value to encode.
        what: the field's name, for the error message.
        sort_keys: sort object keys (used where equal values must encode identically).

    Raises:
        ValueError: ``value`` is not JSON-native, holds text that is not valid Unicode, or is nested
            too deeply for Python's JSON encoder.
    """
    native = f"{what} must be JSON-native (dict with str keys, list, str, int, float, bool, None)"
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys, separators=(",", ":"))
        text.encode("utf-8")
        same = json.loads(text) == value
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{native}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    if not same:
        raise ValueError(
            f"{native}: it changes on a JSON round trip (tuples become lists, non-str keys become str);"
            " convert it before building the snapshot"
        )
    return text


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int within the bounds; numpy integers pass, bools do not (``True`` is no count)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def check_float(name: str, value: Any) -> float:
    """``value`` as a finite float (NaN and infinities do not survive JSON)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    return number


def check_text(name: str, value: Any) -> str:
    """``value`` as a str that encodes to UTF-8 (a lone surrogate would fail only when written)."""
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode text: {exc}") from None
    return value


def check_array(name: str, values: Any, dtype: type[np.generic]) -> np.ndarray:
    """A 1-D array of ``dtype`` from a list or array, refusing values that do not fit it."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and values.ndim == 1 and values.flags.c_contiguous:
        return values
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    target = np.dtype(dtype)
    if target.kind == "i":
        if array.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got {array.dtype}")
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise ValueError(f"{name} must fit in {target} ({info.min}..{info.max})")
    elif array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=target)


def check_counts(name: str, value: Any) -> dict[str, int]:
    """``value`` as a dict of str to int >= 0 (counters, evictions by reason)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict of str to int, got {type(value).__name__}")
    return {check_text(f"{name} key", k): check_int(f"{name}[{k!r}]", v, minimum=0) for k, v in value.items()}


def values_equal(a: Any, b: Any) -> bool:
    """Field equality for the records' ``__eq__``: arrays by dtype and contents, lists and tuples item
    by item, anything else by type and value (a field holding ``1`` differs from one holding ``1.0``)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)) and type(a) is type(b):
        return len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
