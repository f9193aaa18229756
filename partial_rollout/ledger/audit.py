"""Recompute lost and duplicated prompts from ``events.jsonl`` alone.

**The effective timeline.** A run killed and resumed writes events that training later forgets:
everything after the checkpoint it resumes from was redone from that checkpoint (the weights that
trained on those groups were thrown away with the process). So the audit replays the log into an
*effective timeline*: a ``resume`` event naming ``save_id`` S cuts the timeline back to right after
the ``save`` event S and continues from there; a ``start`` event (a fresh run) cuts it back to
nothing. The cut-away events are *rolled back*: their work was redone, which is not duplication.

**Definitions** (on the effective timeline; a prompt is a group id):

- *yielded*: prompts with a ``yield`` event.
- *trained*: prompts with a ``consume`` event.
- *evicted*: prompts with an ``evict`` event (on purpose; by reason).
- *outstanding at end*: the ``end`` event's list: yielded, not trained yet when training stopped.
  Its ``in_flight`` maps groups to the samples the engine was still generating then.
- *duplicated*: prompts consumed more than once, or yielded more than once (a resume that re-yields
  a prompt it also restored would train it twice).
- *lost*: yielded but neither trained, evicted, nor outstanding at the end. Each lost prompt is
  charged to the first resume whose save point it was outstanding at (``lost_per_resume``); a loss
  can only happen at a resume, where the process that held the prompt died.

Without an ``end`` event (a run killed and never resumed to its end) nothing can be called lost
yet: ``complete`` is False and the unaccounted prompts are reported as ``open``.

**Checks that catch a resume which merely looks clean** (a prompt left untrained at the end is not
lost, so these close the ways work could hide there):

- *stranded*: a group saved in flight and restored by a resume must produce a ``finish`` event for
  every sample it had unfinished (or be evicted, or regenerated, with a reason, or be ready with a
  reason: the trainer's own checkpoint holds it finished) before the run ends or before the next
  save that a later resume uses, unless that save holds it in flight again, or the ``end`` event
  lists every such sample as still generating (training reached its last step first; the run does
  not wait for work it will not train on), or the run ended at the step it resumed from (its last
  step's checkpoint: nothing left to train them for). A resume that silently dropped a
  continuation leaves it stranded: the engine was not generating it.
- *cursor*: the prompts a killed process yielded after the save are the prompts the resumed process
  yields after the resume, in the same order (the loader is deterministic from its saved cursor;
  ``cursor_mismatches``).
- *reference*: with ``reference=`` (the log of an uninterrupted run with the same seed), the
  prompts yielded on the effective timeline come in the same order as there (``yield_divergence``).
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from partial_rollout.errors import BadInputError
from partial_rollout.ledger.events import (
    TRAIN_STEP,
    ConsumeEvent,
    EndEvent,
    EventKind,
    EvictEvent,
    FinishEvent,
    LogEvent,
    ReadyEvent,
    RegenerateEvent,
    ResumeEvent,
    SaveEvent,
    YieldEvent,
    read_numbered_events,
)


class AuditError(BadInputError):
    """The log cannot be audited: it contradicts itself, or an event lacks a field the audit reads.

    For example a resume from a save the log does not hold, or a consume of a prompt never yielded.
    The message names the file and the event (``event <seq>``) or its line.
    """


_REQUIRED: dict[str, dict[str, type | tuple[type, ...]]] = {
    EventKind.YIELD: {"prompt": str},
    EventKind.CONSUME: {"prompt": str},
    EventKind.EVICT: {"prompt": str, "reason": str},
    EventKind.SAVE: {"save_id": str},
    EventKind.RESUME: {"save_id": (str, type(None))},
    EventKind.END: {"outstanding": list},
}
"""Fields the audit reads with ``event[...]``, by kind. It reads the others with a default (``.get``),
so a log that lacks them (hand-written, or older than the field) still audits. Either way it reads an
event through its kind's ``TypedDict`` (:mod:`partial_rollout.ledger.events`), which names every field."""
_COUNTS = ("tokens", "prefix_tokens", "discarded_tokens")
"""Token counts the audit adds up, where an event has them."""


@dataclass(kw_only=True)
class AuditReport:
    """What the event log says happened to every prompt."""

    complete: bool
    """The effective timeline ends with an ``end`` event."""
    yielded: int
    trained: int
    evicted: int
    evicted_by_reason: dict[str, int]
    outstanding_at_end: int
    lost: int
    duplicated: int
    lost_ids: list[str]
    duplicated_ids: list[str]
    open_ids: list[str]
    """Unaccounted prompts of an incomplete timeline (neither lost nor safe yet)."""
    resumes: list[dict[str, Any]] = field(default_factory=list)
    """Per resume: the save it used, what was in flight there, what it lost, what it rolled back."""
    tokens_continued: int = 0
    """Tokens of saved prefixes that resumed samples continued from."""
    tokens_regenerated: int = 0
    """Tokens generated and then thrown away: rolled back by a kill, or discarded by ``regenerate``."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The trainer's ``log`` events of kind ``train_step`` on the effective timeline (the reward curve)."""
    yield_order: list[str] = field(default_factory=list)
    """Prompts in the order they were yielded on the effective timeline."""
    stranded: int = 0
    """Groups restored in flight at a resume that never finished, nor were evicted or regenerated, nor
    were still being generated when the run ended."""
    stranded_ids: list[str] = field(default_factory=list)
    cursor_mismatches: list[dict[str, Any]] = field(default_factory=list)
    """Per resume whose resumed process yielded other prompts than the killed one did after the save:
    the save, the first position that differs, and the two prompts there."""
    yield_divergence: dict[str, Any] | None = None
    """With a reference log: the first position where the yield order differs from it (None: same order)."""

    @property
    def clean(self) -> bool:
        """Nothing lost, duplicated or stranded, and the loader cursor checks passed."""
        return not (self.lost or self.duplicated or self.stranded or self.cursor_mismatches or self.yield_divergence)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def effective_timeline(
    events: list[dict[str, Any]], *, path: str | os.PathLike[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay ``events`` into the effective timeline; returns it and one record per resume event.

    Args:
        events: the log's events, in order (:func:`~partial_rollout.ledger.read_events`).
        path: the log they were read from, named in errors.

    Raises:
        AuditError: a ``resume`` names a save that is not on the effective timeline.
    """
    timeline: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    for event in events:
        kind = event["event"]
        if kind == EventKind.START:
            timeline = [event]
            continue
        if kind == EventKind.RESUME:
            save_id = cast(ResumeEvent, event).get("save_id")
            if save_id is None:
                rolled, timeline = timeline, [event]
                resumes.append({"save_id": None, "event": event, "rolled_back": rolled, "save": None})
                continue
            at = next(
                (
                    i
                    for i in range(len(timeline) - 1, -1, -1)
                    if timeline[i]["event"] == EventKind.SAVE and cast(SaveEvent, timeline[i]).get("save_id") == save_id
                ),
                None,
            )
            if at is None:
                raise AuditError(
                    f"resume from save {save_id!r}, which the log does not hold before it",
                    path=path,
                    field=_where(event),
                    fix="A resume must follow the save event of the checkpoint it loaded.",
                )
            rolled = timeline[at + 1 :]
            timeline = [*timeline[: at + 1], event]
            resumes.append({"save_id": save_id, "event": event, "rolled_back": rolled, "save": timeline[at]})
            continue
        timeline.append(event)
    return timeline, resumes


def audit(path: str | os.PathLike[str], *, reference: str | os.PathLike[str] | None = None) -> AuditReport:
    """Audit the event log at ``path`` (see the module docstring for the definitions).

    Args:
        path: the ``events.jsonl`` to audit.
        reference: the log of an uninterrupted run with the same seed; the prompts yielded must
            come in its order (``yield_divergence``).

    Raises:
        BadInputError: a line of the log is damaged (not a JSON event object).
        AuditError: an event lacks a field the audit needs, or the log contradicts itself.
    """
    events = []
    for line, event in read_numbered_events(path):
        _check_fields(event, path=path, line=line)
        events.append(event)
    timeline, resumes = effective_timeline(events, path=path)
    # Work rolled back by any resume was done and thrown away, even if a later resume discards that resume too.
    rolled_back_tokens = sum(
        finish.get("tokens", 0) - finish.get("prefix_tokens", 0)
        for r in resumes
        for finish in (cast(FinishEvent, e) for e in r["rolled_back"] if e["event"] == EventKind.FINISH)
    )
    position_of = {id(e): i for i, e in enumerate(timeline)}
    resumes = [r for r in resumes if id(r["event"]) in position_of]  # a later resume may roll one back
    tally = _tally(timeline, resume_starts={position_of[id(r["event"])] for r in resumes}, path=path)
    end = tally.end
    at_end = set(end["outstanding"]) if end is not None else set()
    unaccounted = sorted(set(tally.yields) - set(tally.consumes) - set(tally.evicted) - at_end)
    lost = unaccounted if end is not None else []
    duplicated = sorted({p for p, n in tally.consumes.items() if n > 1} | {p for p, n in tally.yields.items() if n > 1})
    rows, stranded, cursor_mismatches = _per_resume(timeline, resumes, position_of, tally, lost=lost)
    divergence = None
    if reference is not None:
        found = _first_difference(audit(reference).yield_order, tally.yield_order)
        if found is not None:
            divergence = {"position": found[0], "expected": found[1], "got": found[2]}
    return AuditReport(
        complete=end is not None,
        yielded=len(tally.yields),
        trained=len(tally.consumes),
        evicted=len(tally.evicted),
        evicted_by_reason=dict(Counter(tally.evicted.values())),
        outstanding_at_end=len(at_end),
        lost=len(lost),
        duplicated=len(duplicated),
        lost_ids=lost,
        duplicated_ids=duplicated,
        open_ids=[] if end is not None else unaccounted,
        resumes=rows,
        tokens_continued=tally.tokens_continued,
        tokens_regenerated=rolled_back_tokens + tally.tokens_discarded,
        steps=tally.steps,
        yield_order=tally.yield_order,
        stranded=len(stranded),
        stranded_ids=sorted(stranded),
        cursor_mismatches=cursor_mismatches,
        yield_divergence=divergence,
    )


@dataclass(kw_only=True)
class _Tally:
    """What one pass over the effective timeline counts, prompt by prompt."""

    yields: Counter[str] = field(default_factory=Counter)
    """How often each prompt was yielded."""
    consumes: Counter[str] = field(default_factory=Counter)
    """How often each prompt was trained on."""
    evicted: dict[str, str] = field(default_factory=dict)
    """Evicted prompts and the reason."""
    outstanding_at: dict[int, set[str]] = field(default_factory=dict)
    """The prompts outstanding (yielded, neither consumed nor evicted) at each resume's position."""
    end: EndEvent | None = None
    """The ``end`` event, if the timeline reached one (the last, should there be several)."""
    tokens_continued: int = 0
    """Saved prefix tokens that finished samples continued from."""
    tokens_discarded: int = 0
    """Tokens ``regenerate`` events threw away."""
    steps: list[dict[str, Any]] = field(default_factory=list)
    """The ``train_step`` log events, without the log's own fields."""
    yield_order: list[str] = field(default_factory=list)
    """Prompts in the order they were yielded."""


def _tally(timeline: list[dict[str, Any]], *, resume_starts: set[int], path: str | os.PathLike[str]) -> _Tally:
    """Count the effective timeline's events (``resume_starts``: the positions of its resume events).

    Raises:
        AuditError: a ``consume`` or ``evict`` of a prompt never yielded.
    """
    tally = _Tally()
    outstanding: set[str] = set()
    for position, event in enumerate(timeline):
        if position in resume_starts:
            tally.outstanding_at[position] = set(outstanding)
        kind = event["event"]
        if kind == EventKind.YIELD:
            prompt = cast(YieldEvent, event)["prompt"]
            tally.yields[prompt] += 1
            tally.yield_order.append(prompt)
            outstanding.add(prompt)
        elif kind in (EventKind.CONSUME, EventKind.EVICT):
            prompt = cast(ConsumeEvent | EvictEvent, event)["prompt"]
            if prompt not in tally.yields:
                raise AuditError(f"{kind} of {prompt!r}, which was never yielded", path=path, field=_where(event))
            outstanding.discard(prompt)
            if kind == EventKind.CONSUME:
                tally.consumes[prompt] += 1
            else:
                tally.evicted[prompt] = cast(EvictEvent, event)["reason"]
        elif kind == EventKind.FINISH:
            tally.tokens_continued += cast(FinishEvent, event).get("prefix_tokens", 0)
        elif kind == EventKind.REGENERATE:
            tally.tokens_discarded += cast(RegenerateEvent, event).get("discarded_tokens", 0)
        elif kind == EventKind.END:
            tally.end = cast(EndEvent, event)
        elif kind == EventKind.LOG and cast(LogEvent, event).get("kind") == TRAIN_STEP:
            tally.steps.append({k: v for k, v in event.items() if k not in ("seq", "pid", "event", "kind")})
    return tally


def _per_resume(
    timeline: list[dict[str, Any]],
    resumes: list[dict[str, Any]],
    position_of: dict[int, int],
    tally: _Tally,
    *,
    lost: list[str],
) -> tuple[list[dict[str, Any]], set[str], list[dict[str, Any]]]:
    """One row per resume on the timeline (what its save held, what it lost, what it rolled back),
    the groups stranded after any of them, and the resumes whose loader cursor went elsewhere.

    The timeline's events from one resume to the next (its *segment*) are what the resumed process
    did; each lost prompt is charged to the first resume whose save point it was outstanding at.
    """
    end = tally.end
    charged: set[str] = set()
    rows = []
    stranded: set[str] = set()
    cursor_mismatches = []
    starts = sorted(position_of[id(r["event"])] for r in resumes)
    # A resume from nothing saved has no save event: every field of it reads as its default.
    saves = {position_of[id(r["event"])]: cast(SaveEvent, r["save"] or {}) for r in resumes}
    for r in resumes:
        rolled = r["rolled_back"]
        start = position_of[id(r["event"])]
        following = next((p for p in starts if p > start), None)
        segment = timeline[start + 1 : following]
        save = saves[start]
        stranded_here: list[str] = []
        if following is not None:
            stranded_here = _stranded(save, segment, saved_again=saves[following].get("in_flight", {}))
        elif end is not None and end.get("step") != save.get("step"):
            # else the run may still finish them, or it ended at the step it resumed from (its last
            # step's checkpoint): it had nothing to train them for
            stranded_here = _stranded(save, segment, running=end.get("in_flight", {}))
        stranded |= set(stranded_here)
        mismatch = _first_difference(
            [cast(YieldEvent, e)["prompt"] for e in rolled if e["event"] == EventKind.YIELD],
            [cast(YieldEvent, e)["prompt"] for e in segment if e["event"] == EventKind.YIELD],
        )
        if mismatch is not None:
            position, before, after = mismatch
            cursor_mismatches.append(
                {"save_id": r["save_id"], "position": position, "before_kill": before, "after_resume": after}
            )
        was_out = tally.outstanding_at[start]
        lost_here = sorted((set(lost) & was_out) - charged)
        charged |= set(lost_here)
        rows.append(
            {
                "save_id": r["save_id"],
                "step": save.get("step", 0),
                "outstanding_at_save": len(was_out),
                "outstanding_at_save_by_state": save.get("outstanding", {}),
                "saved_by_state": save.get("groups", {}),
                "samples_unfinished_at_save": save.get("samples_unfinished", 0),
                "samples_in_flight_saved": save.get("samples_in_flight", 0),
                "prefix_tokens_at_save": save.get("prefix_tokens", 0),
                "restored_in_flight": len(save.get("in_flight", {})),
                "stranded_ids": stranded_here,
                "lost": len(lost_here),
                "lost_ids": lost_here,
                "rolled_back_events": len(rolled),
                "rolled_back_consumes": sum(e["event"] == EventKind.CONSUME for e in rolled),
            }
        )
    return rows, stranded, cursor_mismatches


def _stranded(
    save: SaveEvent,
    segment: list[dict[str, Any]],
    *,
    saved_again: dict[str, list[int]] | None = None,
    running: dict[str, list[int]] | None = None,
) -> list[str]:
    """Groups ``save`` held in flight whose unfinished samples ``segment`` (the events after the resume
    from it) never finished, evicted or regenerated.

    Not stranded: a group the next save used by a resume holds in flight again (``saved_again``, that
    save's ``in_flight``), whole, since its capture may have found samples finished that no ``finish``
    event reports yet; and a group whose every waiting sample the engine was still generating when
    the run ended (``running``, the ``end`` event's ``in_flight``), sample by sample.
    """
    saved_again, running = saved_again or {}, running or {}
    waiting = {group: set(samples) for group, samples in save.get("in_flight", {}).items()}
    for event in segment:
        group = event.get("prompt")
        if group not in waiting:
            continue
        if event["event"] == EventKind.FINISH:
            waiting[group].discard(cast(FinishEvent, event).get("sample"))
        elif event["event"] in (EventKind.EVICT, EventKind.REGENERATE) or (
            event["event"] == EventKind.READY and "reason" in cast(ReadyEvent, event)
        ):
            waiting[group].clear()
    return sorted(
        group
        for group, samples in waiting.items()
        if samples and group not in saved_again and not samples <= set(running.get(group, ()))
    )


def _first_difference(a: list[str], b: list[str]) -> tuple[int, str, str] | None:
    """Where two yield orders first differ within their common length, and the prompts there (None:
    one is a prefix of the other; how far a run yields ahead of training depends on timing)."""
    for position, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return position, x, y
    return None


def _check_fields(event: dict[str, Any], *, path: str | os.PathLike[str], line: int) -> None:
    """Refuse an event the audit cannot read: a missing ``seq``, or a field of the wrong type."""
    if type(event.get("seq")) is not int:
        raise AuditError("the event has no integer 'seq'", path=path, field=f"line {line}")
    for name, expected in _REQUIRED.get(event["event"], {}).items():
        if not isinstance(event.get(name), expected):
            what = f"a {event['event']} event needs {name!r} of type {_names(expected)}, got {event.get(name)!r}"
            raise AuditError(what, path=path, field=f"line {line}")
    if event["event"] == EventKind.END and not all(isinstance(p, str) for p in event["outstanding"]):
        raise AuditError("'outstanding' must list prompt ids (strings)", path=path, field=f"line {line}")
    if event["event"] in (EventKind.SAVE, EventKind.END) and "in_flight" in event:
        held = event["in_flight"]
        if not isinstance(held, dict) or not all(
            isinstance(v, list) and all(type(i) is int for i in v) for v in held.values()
        ):
            what = f"'in_flight' must map prompt ids to lists of sample indices, got {held!r}"
            raise AuditError(what, path=path, field=f"line {line}")
    for name in _COUNTS:
        if name in event and (type(event[name]) is not int or event[name] < 0):
            raise AuditError(f"{name!r} must be a token count, got {event[name]!r}", path=path, field=f"line {line}")


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


def _where(event: dict[str, Any]) -> str:
    return f"event {event.get('seq', '?')}"
