"""The raw event log: one JSON object per line, appended and flushed as things happen.

Anyone can audit a run from this file alone, without trusting the trainer's own summary. Each line
is written with a single ``write`` and flushed at once, so a process killed with SIGKILL loses at
most the line it was writing (the operating system keeps what was flushed). That torn last line is
skipped by :func:`read_events` and cut off by :class:`EventLog` before it appends again, so the
next process never glues its first event onto a fragment. ``save`` events are also fsynced: the
checkpoint they describe is fsynced too, and the two must survive a power loss together.

Every event has ``seq`` (position in this file), ``time`` (Unix seconds), ``pid`` (the writing
process) and ``event`` (its kind); the other fields depend on the kind (see
:mod:`partial_rollout.ledger.ledger`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

EVENTS_FILENAME = "events.jsonl"
"""Name of the event log in a run folder."""


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

    def append(self, event: str, *, durable: bool = False, **fields: Any) -> dict[str, Any]:
        """Write one event and flush it; ``durable=True`` also fsyncs the file.

        Returns:
            The event as written.
        """
        record = {"seq": self._seq, "time": round(time.time(), 6), "pid": os.getpid(), "event": event, **fields}
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
        ValueError: a line other than the last one is not a JSON object, which a kill cannot
            cause: the file was damaged some other way.
    """
    path = Path(path)
    if not path.exists():
        return
    lines = path.read_bytes().split(b"\n")
    # After the split the last item is the text past the final newline: empty or a torn line.
    complete = lines[:-1]
    for number, line in enumerate(complete, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {number} is not JSON ({exc}); only the last line may be torn by a kill") from None
        if not isinstance(record, dict) or "event" not in record:
            raise ValueError(f"{path}: line {number} is not an event object")
        yield record


def _cut_torn_tail(path: Path) -> None:
    """Truncate ``path`` after its last newline (drops a line a killed writer left unfinished)."""
    if not path.exists():
        return
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
