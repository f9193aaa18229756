"""Store a nested state dict (a data loader's cursor) as JSON plus tensors, without pickle.

A ``StatefulDataLoader.state_dict()`` is a tree of dicts and lists whose leaves are Python scalars
and torch tensors (a generator's state is a ``uint8`` tensor). :func:`encode` turns such a tree
into a JSON-native tree in which every tensor or array is replaced by a reference to a named tensor
stored next to it in the snapshot file; :func:`decode` reverses it. Types that JSON would lose are
tagged with an object holding the reserved key ``"__type__"``:

=============================  ===========================================================
value                          encoded as
=============================  ===========================================================
None, bool, int, str           itself (ints of any size)
finite float                   itself
NaN, inf, -inf                 ``{"__type__": "float", "value": "nan" | "inf" | "-inf"}``
list                           a JSON array of encoded items
tuple                          ``{"__type__": "tuple", "items": [...]}``
dict with str keys             a JSON object of encoded values (unless a key is ``__type__``)
any other dict                 ``{"__type__": "dict", "items": [[key, value], ...]}``
numpy scalar (np.int64(3))     ``{"__type__": "numpy_scalar", "dtype": "int64", "value": ...}``
bytes                          ``{"__type__": "bytes", "name": "loader.N"}`` (a uint8 tensor)
numpy array                    ``{"__type__": "tensor", "framework": "numpy", "dtype": ..., "name": ...}``
torch tensor                   ``{"__type__": "tensor", "framework": "torch", "dtype": ..., "name": ...}``
=============================  ===========================================================

A numpy scalar is tagged even where its type subclasses a Python one (``np.float64`` is a
``float``), so it comes back as itself; ``np.str_`` and ``np.bytes_`` have no safetensors dtype and
are stored as ``str`` and ``bytes``; complex scalars are refused. Dict subclasses (``OrderedDict``)
come back as ``dict``. Tensors are stored with their own dtype and shape (0-d included); torch
dtypes numpy lacks (``bfloat16``, float8) are stored as unsigned integers of the same width and
viewed back. Anything else is refused with a :class:`ValueError` naming its path in
the tree, because the only way to store an arbitrary object is pickle, which this project never
loads.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from partial_rollout.snapshot.container import DTYPE_CODES

TYPE_KEY = "__type__"
"""The reserved key that marks a tagged value."""

NUMPY_DTYPES = frozenset(DTYPE_CODES)
"""numpy dtypes safetensors can store (by ``dtype.name``)."""

_UINT_OF_WIDTH = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode(state: Any, *, prefix: str = "loader.") -> tuple[Any, dict[str, np.ndarray]]:
    """Split ``state`` into a JSON-native tree and the tensors it references.

    Args:
        state: the tree to store.
        prefix: tensors are named ``<prefix>0``, ``<prefix>1``, ... in traversal order.

    Returns:
        ``(tree, tensors)``: ``tree`` is JSON-native, ``tensors`` maps names to contiguous
        little-endian numpy arrays.

    Raises:
        ValueError: a leaf that cannot be stored without pickle, named by its path in ``state``, or
            a state nested too deeply to walk.
    """
    tensors: dict[str, np.ndarray] = {}

    def store(array: np.ndarray) -> str:
        name = f"{prefix}{len(tensors)}"
        tensors[name] = np.asarray(array, dtype=array.dtype.newbyteorder("<"), order="C")
        return name

    def walk(value: Any, path: str) -> Any:
        # numpy scalars first: np.float64 subclasses float, and the float case below would store it
        # as a plain number (np.complex128 subclasses complex; it is refused here). np.str_ and
        # np.bytes_ (np.character: no safetensors dtype) are left to the str and bytes cases.
        if isinstance(value, np.generic) and not isinstance(value, np.character):
            if value.dtype.name not in NUMPY_DTYPES or value.dtype.kind == "c":
                raise ValueError(f"{path}: cannot store a numpy scalar of dtype {value.dtype}")
            return {TYPE_KEY: "numpy_scalar", "dtype": value.dtype.name, "value": walk(value.item(), path)}
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            if math.isfinite(value):
                return float(value)
            return {TYPE_KEY: "float", "value": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {TYPE_KEY: "tuple", "items": [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value) and TYPE_KEY not in value:
                return {k: walk(v, f"{path}[{k!r}]") for k, v in value.items()}
            items = []
            for k, v in value.items():
                if not isinstance(k, (str, int, float, tuple)) and k is not None:
                    raise ValueError(f"{path}: cannot store a dict key of type {type(k).__name__} without pickle")
                items.append([walk(k, f"{path} key {k!r}"), walk(v, f"{path}[{k!r}]")])
            return {TYPE_KEY: "dict", "items": items}
        if isinstance(value, bytes):
            return {TYPE_KEY: "bytes", "name": store(np.frombuffer(value, dtype=np.uint8))}
        if isinstance(value, np.ndarray):
            if value.dtype.name not in NUMPY_DTYPES:
                known = sorted(NUMPY_DTYPES)
                raise ValueError(f"{path}: cannot store a numpy array of dtype {value.dtype}; storable: {known}")
            return {TYPE_KEY: "tensor", "framework": "numpy", "dtype": value.dtype.name, "name": store(value)}
        torch = sys.modules.get("torch")  # a torch tensor implies torch is imported; never import it here
        if torch is not None and isinstance(value, torch.Tensor):
            return {TYPE_KEY: "tensor", "framework": "torch", **_torch_to_numpy(value, path, store)}
        raise ValueError(
            f"{path}: cannot store a {type(value).__module__}.{type(value).__qualname__} without pickle; convert it"
            " to tensors, numbers, strings, lists and dicts in state_dict()"
        )

    try:
        return walk(state, "loader_state"), tensors
    except RecursionError:
        raise ValueError("loader_state is nested too deeply to store") from None


def _torch_to_numpy(tensor: Any, path: str, store: Any) -> dict[str, str]:
    import torch  # already imported: the caller holds a torch tensor

    if tensor.layout != torch.strided:
        raise ValueError(f"{path}: cannot store a {tensor.layout} tensor; convert it to a dense one")
    dtype = str(tensor.dtype).removeprefix("torch.")
    tensor = tensor.detach().cpu().contiguous()
    if dtype not in NUMPY_DTYPES:
        width = tensor.element_size()
        if tensor.is_complex() or width not in _UINT_OF_WIDTH:
            raise ValueError(f"{path}: cannot store a torch tensor of dtype {dtype}")
        tensor = tensor.view(getattr(torch, _UINT_OF_WIDTH[width]))
    return {"dtype": dtype, "name": store(tensor.numpy())}


def decode(tree: Any, tensors: Mapping[str, np.ndarray]) -> Any:
    """Rebuild the state that :func:`encode` split into ``tree`` and ``tensors``.

    Every tensor in ``tensors`` must be referenced exactly once, with the dtype the reference
    names, so a damaged or hand-edited file cannot load as a subtly different state.

    Raises:
        ValueError: a malformed tag, an unknown dtype, a missing, unused or reused tensor, or a
            dtype mismatch, named by its path in the tree; or a tree nested too deeply to walk.
    """
    used: set[str] = set()

    def take(node: dict[str, Any], path: str, stored_dtype: str) -> np.ndarray:
        name = node.get("name")
        if not isinstance(name, str) or name not in tensors:
            raise ValueError(f"{path}: references tensor {name!r}, which the file does not hold")
        if name in used:
            raise ValueError(f"{path}: tensor {name!r} is referenced twice")
        used.add(name)
        array = tensors[name]
        if array.dtype.name != stored_dtype:
            raise ValueError(f"{path}: tensor {name!r} is stored as {array.dtype.name}, expected {stored_dtype}")
        return array

    def walk(node: Any, path: str) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            raise ValueError(f"{path}: {type(node).__name__} is not a JSON value")
        if TYPE_KEY not in node:
            return {k: walk(v, f"{path}[{k!r}]") for k, v in node.items()}
        kind = node[TYPE_KEY]
        expected_keys = _TAG_KEYS.get(kind) if isinstance(kind, str) else None
        if expected_keys is None or set(node) != expected_keys:
            raise ValueError(f"{path}: malformed tagged value {_short(node)}")
        if kind == "float":
            if not isinstance(node["value"], str) or node["value"] not in _SPECIAL_FLOATS:
                raise ValueError(f"{path}: unknown float {_short(node['value'])}")
            return _SPECIAL_FLOATS[node["value"]]
        if kind in ("tuple", "dict"):
            if not isinstance(node["items"], list):
                raise ValueError(f"{path}: 'items' must be a list")
            if kind == "tuple":
                return tuple(walk(v, f"{path}[{i}]") for i, v in enumerate(node["items"]))
            out = {}
            for item in node["items"]:
                if not isinstance(item, list) or len(item) != 2:
                    raise ValueError(f"{path}: dict items must be [key, value] pairs")
                key = walk(item[0], f"{path} key")
                try:
                    out[key] = walk(item[1], f"{path}[{key!r}]")
                except TypeError:
                    raise ValueError(f"{path}: unhashable dict key {key!r}") from None
            return out
        if kind == "numpy_scalar":
            dtype = _numpy_dtype(node, path)
            value = walk(node["value"], path)
            if not isinstance(value, (bool, int, float)):
                raise ValueError(f"{path}: a numpy scalar's value must be a number, got {_short(value)}")
            try:
                return np.dtype(dtype).type(value)
            except (OverflowError, TypeError) as exc:
                raise ValueError(f"{path}: {value!r} is not a {dtype}: {exc}") from None
        if kind == "bytes":
            array = take(node, path, "uint8")
            if array.ndim != 1:
                raise ValueError(f"{path}: bytes must be stored one-dimensional, got shape {array.shape}")
            return array.tobytes()
        return _decode_tensor(node, path, take)

    try:
        state = walk(tree, "loader_state")
    except RecursionError:
        raise ValueError("loader_state is nested too deeply to decode") from None
    unused = sorted(set(tensors) - used)
    if unused:
        raise ValueError(f"loader_state: tensors {unused} are stored but not referenced")
    return state


_TAG_KEYS = {
    "float": {TYPE_KEY, "value"},
    "tuple": {TYPE_KEY, "items"},
    "dict": {TYPE_KEY, "items"},
    "numpy_scalar": {TYPE_KEY, "dtype", "value"},
    "bytes": {TYPE_KEY, "name"},
    "tensor": {TYPE_KEY, "framework", "dtype", "name"},
}


def _decode_tensor(node: dict[str, Any], path: str, take: Any) -> Any:
    framework = node["framework"]
    if framework == "numpy":
        return np.array(take(node, path, _numpy_dtype(node, path)))
    if framework != "torch":
        raise ValueError(f"{path}: unknown tensor framework {_short(framework)} (expected 'numpy' or 'torch')")
    import torch

    dtype = node["dtype"]
    torch_dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    # Only what encode writes: its canonical name ("float32", not the alias "float"), and besides
    # numpy's dtypes only floats stored as unsigned integers of their width (bfloat16, float8_*).
    if not isinstance(torch_dtype, torch.dtype) or str(torch_dtype) != f"torch.{dtype}":
        raise ValueError(f"{path}: unknown torch dtype {_short(dtype)}")
    if dtype in NUMPY_DTYPES:
        return torch.from_numpy(np.array(take(node, path, dtype)))
    if not torch_dtype.is_floating_point or torch_dtype.itemsize not in _UINT_OF_WIDTH:
        raise ValueError(f"{path}: torch dtype {dtype} cannot be stored (not a float of 1, 2, 4 or 8 bytes)")
    return torch.from_numpy(np.array(take(node, path, _UINT_OF_WIDTH[torch_dtype.itemsize]))).view(torch_dtype)


def _numpy_dtype(node: dict[str, Any], path: str) -> str:
    """The node's ``dtype``, which must name a numpy dtype safetensors stores."""
    dtype = node["dtype"]
    if not isinstance(dtype, str) or dtype not in NUMPY_DTYPES:
        raise ValueError(f"{path}: unknown numpy dtype {_short(dtype)}; known: {sorted(NUMPY_DTYPES)}")
    return dtype


def _short(value: Any) -> str:
    """``repr(value)``, cut to keep an error message on one readable line."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def states_equal(a: Any, b: Any) -> bool:
    """Deep, type-strict equality of two states (tensors compared by framework, dtype, shape, values).

    ``==`` cannot compare states: tensors compare element-wise, and ``1 == 1.0 == True``.
    """
    torch = sys.modules.get("torch")
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and (
                bool(torch.equal(a.cpu(), b.cpu()))
                or (a.is_floating_point() and bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True)))
            )
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
        )
    if type(a) is not type(b):
        return isinstance(a, dict) and isinstance(b, dict) and _dicts_equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return _dicts_equal(a, b)
    if isinstance(a, (float, np.floating)) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _dicts_equal(a: Mapping[Any, Any], b: Mapping[Any, Any]) -> bool:
    return list(a) == list(b) and all(states_equal(a[k], b[k]) for k in a)
