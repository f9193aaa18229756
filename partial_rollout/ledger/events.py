"""The raw event log: one JSON object per line, appended and flushed as things happen.

Anyone can audit a run from this file alone, without trusting the trainer's own summary. Each line
is written with a single ``write`` and flushed at once, so a process killed with SIGKILL loses at
most the line it was writing (the operating system keeps what was flushed). That torn last line is
skipped by :func:`read_events` and cut off by :class:`EventLog` before it appends again, so the
next process never glues its first event onto a fragment. ``save`` events are also fsynced: the
checkpoint they describe is fsynced too, and the two must survive a power loss together.

Every event has ``seq`` (position in this file), ``time`` (Unix seconds), ``pid`` (the writing
process) and ``event`` (its kind, an :class:`EventKind`); the other fields depend on the kind (see
:mod:`partial_rollout.ledger.ledger`).
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from partial_rollout.errors import BadInputError

EVENTS_FILENAME = "events.jsonl"
"""Name of the event log in a run folder."""


class EventKind(enum.StrEnum):
    """The ``event`` field of a log line: shared by the ledger that writes it and everyone who reads it.

    The values are what existing ``events.jsonl`` files hold: never change one.
    """

    START = "start"
    """A fresh run: an audit forgets everything logged before it."""
    YIELD = "yield"
    """The loader yielded a prompt (``prompt``)."""
    DISPATCH = "dispatch"
    """A pending group went to the engine (``prompt``, ``version``)."""
    FINISH = "finish"
    """One sample finished (``prompt``, ``sample``, ``tokens``, ``prefix_tokens``, ``reward``)."""
    READY = "ready"
    """Every sample of a group finished (``prompt``); with a ``reason``, the trainer holds it finished
    in its own checkpoint (:meth:`~partial_rollout.ledger.WorkLedger.adopt_ready`)."""
    REOPEN = "reopen"
    """A ready group went back in flight at a resume: the trainer's own checkpoint lacks it (``prompt``)."""
    CONSUME = "consume"
    """Training step ``step`` consumed a group (``prompt``)."""
    EVICT = "evict"
    """A group was dropped on purpose (``prompt``, ``reason``, ``state``)."""
    REGENERATE = "regenerate"
    """A group's tokens were discarded and it is pending again (``prompt``, ``reason``, ``discarded_tokens``)."""
    SAVE = "save"
    """A checkpoint's cut (``save_id``, ``step``, what was outstanding and what was saved, the
    unfinished samples of each saved in-flight group as ``in_flight``, and the trainer's timings of
    the cut, e.g. ``stall_ms``). It stands in the log where the cut was taken."""
    SAVE_WRITTEN = "save_written"
    """The snapshot of save ``save_id`` is on disk (the trainer adds e.g. ``write_ms``, ``bytes``)."""
    SAVE_FAILED = "save_failed"
    """The snapshot of save ``save_id`` could not be written (``error``); no resume can name that save."""
    RESUME = "resume"
    """A process resumed from the save ``save_id`` (None: from nothing saved)."""
    END = "end"
    """The run reached its end (``step``, the ``outstanding`` group ids)."""
    LOG = "log"
    """A trainer event of some ``kind`` (e.g. :data:`TRAIN_STEP`) with its own fields."""


TRAIN_STEP = "train_step"
"""``kind`` of the :attr:`EventKind.LOG` event a trainer writes per training step (``step``, metrics):
the audit's reward curve, and the kill harness's measure of progress."""

ENGINE_FAILOVER = "engine_failover"
"""``kind`` of the :attr:`EventKind.LOG` event a trainer writes when an engine died and its requests moved
to the engines left (``engine``, ``requests``, ``tokens_carried``, ``carried`` per request, ``error``:
:meth:`partial_rollout.pool.Failover.fields`)."""


class EventLog:
    """Append-only writer of ``events.jsonl``."""

    def __init__(self, path: str | os.PathLike[str], *, fresh: bool = False) -> None:
        """Open ``path`` for appending (``fresh=True`` starts an empty log instead).

        A torn last line left by a killed writer is cut off first.
        """
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            self.path.write_bytes(b"")
        else:
            _cut_torn_tail(self.path)
        self._seq = sum(1 for _ in read_events(self.path))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def append(self, event: EventKind, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        """Write one event and flush it; ``durable=True`` also fsyncs the file.

        Returns:
            The event as written.
        """
        record = {"seq": self._seq, "time": round(time.time(), 6), "pid": os.getpid(), "event": str(event), **fields}
        self._file.write(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
        self._file.flush()
        if durable:
            os.fsync(self._file.fileno())
        self._seq += 1
        return record

    def close(self) -> None:
        """Flush and close the file."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The events of a log, in order; a torn (unterminated or unparsable) last line is skipped.

    Raises:
        BadInputError: a line other than the last one is not a JSON object with a string
            ``event``, which a kill cannot cause: the file was damaged some other way.
    """
    for _, record in read_numbered_events(path):
        yield record


def read_numbered_events(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """:func:`read_events` with each event's line number (from 1), for messages that point into the file."""
    path = Path(path)
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    # After the split the last item is the text past the final newline: empty or a torn line.
    complete = lines[:-1]
    for number, line in enumerate(complete, start=1):
        if line.strip():
            yield number, _parse(line, path=path, number=number)


class EventTail:
    """Follow a log another process is writing: each :meth:`read` returns the events completed since
    the last one, reading only the bytes added since (a watcher polling a long run's log many times a
    second would otherwise parse the whole file each time).

    It starts after the events already complete, where a resumed writer appends: :class:`EventLog`
    cuts a torn last line off before it appends again.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        data = self.path.read_bytes() if self.path.exists() else b""
        self._offset = data.rfind(b"\n") + 1
        self._lines = data.count(b"\n")

    def read(self) -> list[dict[str, Any]]:
        """The events completed since the last call (a line still being written waits for the next).

        Raises:
            BadInputError: a completed line is not an event (see :func:`read_events`).
        """
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read()
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        events = []
        for line in complete.split(b"\n")[:-1]:
            self._lines += 1
            if line.strip():
                events.append(_parse(line, path=self.path, number=self._lines))
        return events


def _parse(line: bytes, *, path: Path, number: int) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly nested JSON
        what = f"not JSON ({exc}); only the last line may be torn by a kill"
        raise BadInputError(what, path=path, field=f"line {number}") from None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        raise BadInputError(
            "not an event object (a JSON object with a string 'event')", path=path, field=f"line {number}"
        )
    return record


def _cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline (drops a line a killed writer left unfinished)."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
