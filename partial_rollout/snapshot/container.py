"""The safetensors container: write it in one streaming pass, check its header exactly.

The layout is the standard one (github.com/huggingface/safetensors, "Format"): an 8-byte
little-endian header length ``N``, ``N`` bytes of UTF-8 JSON mapping each tensor name to its
``dtype``, ``shape`` and ``data_offsets`` (plus a ``__metadata__`` object of strings), padded with
spaces to a multiple of 8, then the tensors' bytes back to back. Any safetensors reader opens our
files; we read tensors with the official ``safe_open``.

We write the container ourselves because ``safetensors.numpy.save_file`` first copies into its own
temporary file and runs at about a third of disk speed here; writing each array straight from its
buffer streams at disk speed and lets :mod:`partial_rollout.atomic` own the temporary file. We
parse the header ourselves on read so damage gets a precise message (which tensor's offsets run
past the end, which bytes are unaccounted for) before any tensor is touched.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from partial_rollout.errors import SnapshotError

MAX_HEADER_SIZE = 100_000_000
"""safetensors refuses headers larger than this (100 MB)."""
_IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX"))

DTYPE_CODES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "uint16": "U16",
    "int16": "I16",
    "uint32": "U32",
    "int32": "I32",
    "uint64": "U64",
    "int64": "I64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "complex64": "C64",
}
"""numpy dtype name -> safetensors dtype code, for every dtype both know."""
DTYPE_NAMES = {code: name for name, code in DTYPE_CODES.items()}


class Chunks:
    """A one-dimensional tensor given as consecutive pieces, written without concatenating them.

    A snapshot's tokens live in one small array per sample; copying them into one big array first
    would cost a full extra pass over memory (and, for fresh pages, page faults) before the write.
    """

    def __init__(self, arrays: list[np.ndarray], dtype: type[np.generic]) -> None:
        self.dtype = np.dtype(dtype)
        for array in arrays:
            if array.dtype != self.dtype or array.ndim != 1 or not array.flags.c_contiguous:
                raise ValueError(
                    f"every chunk must be a contiguous 1-D {self.dtype} array, got {array.dtype}{list(array.shape)}"
                )
        self.arrays = arrays
        self.shape = (sum(len(a) for a in arrays),)
        self.nbytes = self.shape[0] * self.dtype.itemsize

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.arrays)


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor as the header describes it."""

    dtype: str
    """numpy dtype name (``"int32"``)."""
    shape: tuple[int, ...]
    start: int
    """First byte, relative to the data section."""
    end: int
    """One past the last byte, relative to the data section."""


@dataclass(frozen=True, slots=True)
class Header:
    """A parsed and checked safetensors header."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_start: int
    """File offset of the data section (8 + header length)."""
    file_size: int


def write_file(path: str | os.PathLike[str], tensors: dict[str, np.ndarray | Chunks], metadata: dict[str, str]) -> int:
    """Write ``tensors`` and ``metadata`` as a safetensors file; returns the bytes written.

    Tensors are laid out widest dtype first, then by name (as safetensors does), so each one is
    aligned to its element size. Arrays must be C-contiguous and little-endian; a :class:`Chunks`
    is written piece by piece.

    Raises:
        ValueError: a dtype safetensors cannot store, a non-contiguous array, or a header over 100 MB.
    """
    order = sorted(tensors, key=lambda name: (-tensors[name].dtype.itemsize, name))
    header: dict[str, Any] = {}
    offset = 0
    for name in order:
        array = tensors[name]
        if array.dtype.name not in DTYPE_CODES or array.dtype.byteorder == ">":
            raise ValueError(f"tensor {name!r}: safetensors cannot store dtype {array.dtype}")
        if isinstance(array, np.ndarray) and not array.flags.c_contiguous:
            raise ValueError(f"tensor {name!r} is not contiguous; pass np.ascontiguousarray(...)")
        header[name] = {
            "dtype": DTYPE_CODES[array.dtype.name],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    header["__metadata__"] = metadata
    text = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_SIZE:
        raise ValueError(f"the header would be {len(text)} bytes, over safetensors' limit of {MAX_HEADER_SIZE}")
    pieces: list[bytes | np.ndarray] = [struct.pack("<Q", len(text)), text]
    for name in order:
        tensor = tensors[name]
        pieces.extend(tensor if isinstance(tensor, Chunks) else (tensor,))
    with open(path, "wb", buffering=0) as f:
        _write_all(f.fileno(), pieces)
    return 8 + len(text) + offset


def _write_all(fd: int, pieces: list[bytes | np.ndarray]) -> None:
    """Write ``pieces`` back to back with ``writev``: one system call per thousand small arrays.

    A snapshot holds a few small arrays per sample; writing them one call at a time costs several
    times the copy itself.
    """
    views = [p.reshape(-1).view(np.uint8).data if isinstance(p, np.ndarray) else memoryview(p) for p in pieces]
    views = [v for v in views if v.nbytes]
    first = 0
    while first < len(views):
        batch = views[first : first + _IOV_MAX]
        written = os.writev(fd, batch)
        for view in batch:  # skip what was written; a short write resumes mid-view
            if written < view.nbytes:
                views[first] = view[written:]
                break
            written -= view.nbytes
            first += 1


def read_header(path: str | os.PathLike[str]) -> Header:
    """Read and check the header of the safetensors file at ``path``.

    Checks that the header length fits in the file, the JSON is well-formed with no duplicate keys,
    every entry has a known dtype, a shape, and offsets that match its size, and the tensors cover
    the data section exactly: no gap, no overlap, nothing past the end, nothing left over.

    Raises:
        SnapshotError: naming the file and the field at fault.
    """
    size = os.path.getsize(path)
    if size == 0:
        raise SnapshotError("the file is empty", path=path, field="header")
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SnapshotError(f"the file is {size} bytes, too short for safetensors", path=path, field="header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_SIZE:
            raise SnapshotError(
                f"header length {length} exceeds safetensors' limit of {MAX_HEADER_SIZE}: damaged, or not safetensors",
                path=path,
                field="header",
            )
        if 8 + length > size:
            raise SnapshotError(
                f"header length {length} runs past the end of the {size}-byte file: truncated, or not safetensors",
                path=path,
                field="header",
            )
        raw = f.read(length)
    try:
        entries = loads_json(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as exc:
        what = f"the header is not valid UTF-8 JSON ({exc}): damaged, or not safetensors"
        raise SnapshotError(what, path=path, field="header") from None
    if not isinstance(entries, dict):
        raise SnapshotError("the header is not a JSON object", path=path, field="header")
    metadata = entries.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise SnapshotError("must be an object of strings", path=path, field="__metadata__")
    data_size = size - 8 - length
    tensors = {name: _entry(path, name, value, data_size) for name, value in entries.items()}
    covered = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end)):
        if entry.start != covered:
            raise SnapshotError(
                f"data_offsets start at {entry.start}, expected {covered}: tensors overlap or leave a gap (damaged)",
                path=path,
                field=name,
            )
        covered = entry.end
    if covered != data_size:
        raise SnapshotError(
            f"{data_size - covered} bytes after the last tensor belong to none: the file was appended to or damaged",
            path=path,
            field="header",
        )
    return Header(tensors=tensors, metadata=metadata, data_start=8 + length, file_size=size)


def loads_json(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads``, with JSON nested too deeply for Python's parser refused like any other bad JSON.

    A crafted file can nest lists 100,000 deep in a few hundred kilobytes; ``json.loads`` then
    raises :class:`RecursionError`, which callers that catch :class:`ValueError` would miss.

    Raises:
        ValueError: the text is not valid JSON (:class:`json.JSONDecodeError`,
            :class:`UnicodeDecodeError`) or is nested too deeply.
    """
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        names = [k for k, _ in pairs]
        raise ValueError(f"duplicate key {next(k for k in names if names.count(k) > 1)!r}")
    return out


def _entry(path: str | os.PathLike[str], name: str, value: Any, data_size: int) -> TensorEntry:
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise SnapshotError("a tensor entry needs exactly dtype, shape and data_offsets", path=path, field=name)
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPE_NAMES:
        raise SnapshotError(f"unknown or unsupported dtype {dtype!r}", path=path, field=name)
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise SnapshotError(f"shape {shape!r} is not a list of sizes", path=path, field=name)
    pair = isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)
    if not (pair and 0 <= offsets[0] <= offsets[1]):
        raise SnapshotError(f"data_offsets {offsets!r} are not two increasing byte offsets", path=path, field=name)
    if offsets[1] > data_size:
        raise SnapshotError(
            f"data_offsets {offsets} run past the end of the data ({data_size} bytes): the file is truncated",
            path=path,
            field=name,
        )
    nbytes = math.prod(shape) * np.dtype(DTYPE_NAMES[dtype]).itemsize
    if offsets[1] - offsets[0] != nbytes:
        raise SnapshotError(
            f"data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but {dtype}{shape} needs {nbytes}",
            path=path,
            field=name,
        )
    return TensorEntry(dtype=DTYPE_NAMES[dtype], shape=tuple(shape), start=offsets[0], end=offsets[1])
