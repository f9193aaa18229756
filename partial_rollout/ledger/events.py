"""The raw event log: one JSON object per line, appended and flushed as things happen.

Anyone can audit a run from this file alone, without trusting the trainer's own summary. Each line
is written with a single ``write`` and flushed at once, so a process killed with SIGKILL loses at
most the line it was writing (the operating system keeps what was flushed). That torn last line is
skipped by :func:`read_events` and cut off by :class:`EventLog` before it appends again, so the
next process never glues its first event onto a fragment. ``save`` events are also fsynced: the
checkpoint they describe is fsynced too, and the two must survive a power loss together.

Every event has ``seq`` (position in this file), ``time`` (Unix seconds), ``pid`` (the writing
process) and ``event`` (its kind, an :class:`EventKind`); the other fields depend on the kind. Each
kind's fields are a ``TypedDict`` below (:class:`YieldEvent`, :class:`SaveEvent`, ...): the ledger
builds its events from them and the audit reads events through them, so the two sides agree on
every field name and type by construction, not by matching string literals. A trainer may add
fields of its own to ``start``, ``save``, ``save_written``, ``resume`` and ``log`` events.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from partial_rollout.errors import BadInputError

EVENTS_FILENAME = "events.jsonl"
"""Name of the event log in a run folder."""


class EventKind(enum.StrEnum):
    """The ``event`` field of a log line: shared by the ledger that writes it and everyone who reads it.

    The values are what existing ``events.jsonl`` files hold: never change one.
    """

    START = "start"
    """A fresh run: an audit forgets everything logged before it (:class:`StartEvent`)."""
    YIELD = "yield"
    """The loader yielded a prompt (:class:`YieldEvent`)."""
    DISPATCH = "dispatch"
    """A pending group went to the engine (:class:`DispatchEvent`)."""
    FINISH = "finish"
    """One sample finished (:class:`FinishEvent`)."""
    READY = "ready"
    """Every sample of a group finished, or the trainer holds it finished in its own checkpoint
    (:class:`ReadyEvent`)."""
    REOPEN = "reopen"
    """A ready group went back in flight at a resume: the trainer's own checkpoint lacks it (:class:`ReopenEvent`)."""
    CONSUME = "consume"
    """A training step consumed a group (:class:`ConsumeEvent`)."""
    EVICT = "evict"
    """A group was dropped on purpose (:class:`EvictEvent`)."""
    REGENERATE = "regenerate"
    """A group's tokens were discarded and it is pending again (:class:`RegenerateEvent`)."""
    SAVE = "save"
    """A checkpoint's cut: what was outstanding and what was saved (:class:`SaveEvent`). It stands in
    the log where the cut was taken."""
    SAVE_WRITTEN = "save_written"
    """The snapshot of a save is on disk (:class:`SaveWrittenEvent`)."""
    SAVE_FAILED = "save_failed"
    """The snapshot of a save could not be written; no resume can name that save (:class:`SaveFailedEvent`)."""
    RESUME = "resume"
    """A process resumed from a save, or from nothing saved (:class:`ResumeEvent`)."""
    END = "end"
    """The run reached its end (:class:`EndEvent`)."""
    LOG = "log"
    """A trainer event of some ``kind`` with its own fields (:class:`LogEvent`)."""


TRAIN_STEP = "train_step"
"""``kind`` of the :attr:`EventKind.LOG` event a trainer writes per training step (``step``, metrics):
the audit's reward curve, and the kill harness's measure of progress."""

ENGINE_FAILOVER = "engine_failover"
"""``kind`` of the :attr:`EventKind.LOG` event a trainer writes when an engine died and its requests moved
to the engines left (``engine``, ``requests``, ``tokens_carried``, ``carried`` per request, ``error``:
:meth:`partial_rollout.pool.Failover.fields`)."""


class YieldEvent(TypedDict):
    """``yield``: the loader yielded a prompt, and the ledger holds it as a pending group."""

    prompt: str
    """The group id (every group event names its group this way)."""


class DispatchEvent(TypedDict):
    """``dispatch``: a pending group went to the engine."""

    prompt: str
    version: int
    """Policy version it was dispatched under."""


class FinishEvent(TypedDict):
    """``finish``: one sample finished (and was scored)."""

    prompt: str
    sample: int
    """The sample's index in its group."""
    tokens: int
    """Tokens of the whole completion, a continued prefix included."""
    prefix_tokens: int
    """Of those, the tokens continued from a saved prefix (0: generated in one go). The audit's
    ``tokens_continued``; ``tokens - prefix_tokens`` is the work a rollback throws away."""
    reward: float | None


class ReadyEvent(TypedDict):
    """``ready``: every sample of the group finished; it waits to be trained on."""

    prompt: str
    reason: NotRequired[str]
    """Present when the trainer holds the group finished in its own checkpoint while the ledger's
    records are unfinished (:meth:`~partial_rollout.ledger.WorkLedger.adopt_ready`): the audit then
    counts its unfinished samples as accounted for."""


class ReopenEvent(TypedDict):
    """``reopen``: a ready group went back in flight at a resume (the trainer's own checkpoint lacks it)."""

    prompt: str


class ConsumeEvent(TypedDict):
    """``consume``: a training step consumed the group; it leaves the ledger."""

    prompt: str
    step: int


class EvictEvent(TypedDict):
    """``evict``: the group was dropped on purpose; it leaves the ledger."""

    prompt: str
    reason: str
    """Why, e.g. ``too_stale`` (the audit counts evictions by reason)."""
    state: str
    """The group's state when it was dropped (a :class:`~partial_rollout.snapshot.GroupState` value)."""


class RegenerateEvent(TypedDict):
    """``regenerate``: the group's tokens were discarded and it is pending again."""

    prompt: str
    reason: str
    discarded_tokens: int
    """Tokens thrown away (the audit adds them to ``tokens_regenerated``)."""


class StartEvent(TypedDict):
    """``start``: a fresh run; an audit forgets everything logged before it. Its fields are the trainer's."""


class SaveEvent(TypedDict):
    """``save``: a checkpoint's cut, where it stands in the log (the trainer adds ``gate_ms``, ``cut_ms``)."""

    save_id: str
    """Id of the save; a ``resume`` from its checkpoint names it."""
    step: int
    """Training step of the checkpoint."""
    policy_version: int
    outstanding: dict[str, int]
    """Groups outstanding at the cut, by state (every state, saved or not)."""
    groups: dict[str, int]
    """Groups saved, by state."""
    samples_unfinished: int
    """Unfinished samples of the in-flight groups outstanding at the cut."""
    samples_in_flight: int
    """Samples saved in flight (with a prefix to continue)."""
    prefix_tokens: int
    """Tokens of those prefixes."""
    saved: list[str]
    """Ids of the groups saved, in yield order."""
    in_flight: dict[str, list[int]]
    """Each saved in-flight group's unfinished samples: what a resume from this save must finish."""


class SaveWrittenEvent(TypedDict):
    """``save_written``: the snapshot of a save is on disk (the trainer adds e.g. ``write_ms``, ``bytes``)."""

    save_id: str


class SaveFailedEvent(TypedDict):
    """``save_failed``: the snapshot of a save could not be written; no resume can name that save."""

    save_id: str
    error: str
    """The exception, as ``<type>: <message>``."""


class ResumeEvent(TypedDict):
    """``resume``: a process resumed from a save (the trainer adds e.g. ``step``, ``checkpoint``)."""

    save_id: str | None
    """The save resumed from; None: from nothing saved (the audit then rolls back everything before)."""


class EndEvent(TypedDict):
    """``end``: the run reached its end."""

    step: int
    """The last training step."""
    outstanding: list[str]
    """Ids of the groups still outstanding (untrained, not lost)."""
    in_flight: dict[str, list[int]]
    """Each in-flight group's samples the engine was still generating when training stopped."""
    engines_left: NotRequired[int]
    """For a pool of engines, how many were alive at the end."""


class LogEvent(TypedDict):
    """``log``: a trainer event with fields of its own."""

    kind: str
    """What it is, e.g. :data:`TRAIN_STEP` or :data:`ENGINE_FAILOVER`."""


EventFields = (
    YieldEvent
    | DispatchEvent
    | FinishEvent
    | ReadyEvent
    | ReopenEvent
    | ConsumeEvent
    | EvictEvent
    | RegenerateEvent
    | StartEvent
    | SaveEvent
    | SaveWrittenEvent
    | SaveFailedEvent
    | ResumeEvent
    | EndEvent
    | LogEvent
)
"""The fields of any event the ledger writes (besides ``seq``, ``time``, ``pid`` and ``event``)."""


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

    @property
    def logged(self) -> int:
        """Events in the log: those it held when opened and those appended since."""
        return self._seq

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
