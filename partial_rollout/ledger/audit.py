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
- *duplicated*: prompts consumed more than once, or yielded more than once (a resume that re-yields
  a prompt it also restored would train it twice).
- *lost*: yielded but neither trained, evicted, nor outstanding at the end. Each lost prompt is
  charged to the first resume whose save point it was outstanding at (``lost_per_resume``); a loss
  can only happen at a resume, where the process that held the prompt died.

Without an ``end`` event (a run killed and never resumed to its end) nothing can be called lost
yet: ``complete`` is False and the unaccounted prompts are reported as ``open``.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from partial_rollout.ledger.events import read_events


class AuditError(ValueError):
    """The log contradicts itself (a resume from a save it does not hold, a consume of an unknown prompt)."""


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

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def effective_timeline(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Replay ``events`` into the effective timeline; returns it and one record per resume event.

    Raises:
        AuditError: a ``resume`` names a save that is not on the effective timeline.
    """
    timeline: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    for event in events:
        kind = event["event"]
        if kind == "start":
            timeline = [event]
            continue
        if kind == "resume":
            save_id = event.get("save_id")
            if save_id is None:
                rolled, timeline = timeline, [event]
                resumes.append({"save_id": None, "event": event, "rolled_back": rolled, "save": None})
                continue
            at = next((i for i in range(len(timeline) - 1, -1, -1)
                       if timeline[i]["event"] == "save" and timeline[i].get("save_id") == save_id), None)
            if at is None:
                raise AuditError(f"event {event['seq']}: resume from save {save_id!r}, which the log does not hold")
            rolled = timeline[at + 1:]
            timeline = [*timeline[: at + 1], event]
            resumes.append({"save_id": save_id, "event": event, "rolled_back": rolled, "save": timeline[at]})
            continue
        timeline.append(event)
    return timeline, resumes


def audit(path: str | os.PathLike[str]) -> AuditReport:
    """Audit the event log at ``path`` (see the module docstring for the definitions)."""
    timeline, resumes = effective_timeline(list(read_events(path)))
    # Work rolled back by any resume was done and thrown away, even if a later resume discards that resume too.
    tokens_regenerated = sum(
        e.get("tokens", 0) - e.get("prefix_tokens", 0) for r in resumes for e in r["rolled_back"] if e["event"] == "finish"
    )
    yields: Counter[str] = Counter()
    consumes: Counter[str] = Counter()
    evicted: dict[str, str] = {}
    outstanding: set[str] = set()
    outstanding_at: dict[int, set[str]] = {}
    position_of = {id(e): i for i, e in enumerate(timeline)}
    resumes = [r for r in resumes if id(r["event"]) in position_of]  # a later resume may roll one back
    resume_starts = {position_of[id(r["event"])] for r in resumes}
    end: dict[str, Any] | None = None
    tokens_continued = 0
    steps = []
    for position, event in enumerate(timeline):
        if position in resume_starts:
            outstanding_at[position] = set(outstanding)
        kind, prompt = event["event"], event.get("prompt")
        if kind == "yield":
            yields[prompt] += 1
            outstanding.add(prompt)
        elif kind in ("consume", "evict"):
            if prompt not in yields:
                raise AuditError(f"event {event['seq']}: {kind} of {prompt!r}, which was never yielded")
            outstanding.discard(prompt)
            if kind == "consume":
                consumes[prompt] += 1
            else:
                evicted[prompt] = event.get("reason", "unknown")
        elif kind == "finish":
            tokens_continued += event.get("prefix_tokens", 0)
        elif kind == "regenerate":
            tokens_regenerated += event.get("discarded_tokens", 0)
        elif kind == "end":
            end = event
        elif kind == "log" and event.get("kind") == "train_step":
            steps.append({k: v for k, v in event.items() if k not in ("seq", "pid", "event", "kind")})
    at_end = set(end["outstanding"]) if end is not None else set()
    unaccounted = sorted(set(yields) - set(consumes) - set(evicted) - at_end)
    lost = unaccounted if end is not None else []
    duplicated = sorted({p for p, n in consumes.items() if n > 1} | {p for p, n in yields.items() if n > 1})
    charged: set[str] = set()
    resume_rows = []
    for r in resumes:
        rolled = r["rolled_back"]
        was_out = outstanding_at[position_of[id(r["event"])]]
        lost_here = sorted((set(lost) & was_out) - charged)
        charged |= set(lost_here)
        save = r["save"] or {}
        resume_rows.append({
            "save_id": r["save_id"],
            "step": save.get("step", 0),
            "outstanding_at_save": len(was_out),
            "outstanding_at_save_by_state": save.get("outstanding", {}),
            "saved_by_state": save.get("groups", {}),
            "samples_unfinished_at_save": save.get("samples_unfinished", 0),
            "samples_in_flight_saved": save.get("samples_in_flight", 0),
            "prefix_tokens_at_save": save.get("prefix_tokens", 0),
            "lost": len(lost_here),
            "lost_ids": lost_here,
            "rolled_back_events": len(rolled),
            "rolled_back_consumes": sum(e["event"] == "consume" for e in rolled),
        })
    return AuditReport(
        complete=end is not None,
        yielded=len(yields),
        trained=len(consumes),
        evicted=len(evicted),
        evicted_by_reason=dict(Counter(evicted.values())),
        outstanding_at_end=len(at_end),
        lost=len(lost),
        duplicated=len(duplicated),
        lost_ids=lost,
        duplicated_ids=duplicated,
        open_ids=[] if end is not None else unaccounted,
        resumes=resume_rows,
        tokens_continued=tokens_continued,
        tokens_regenerated=tokens_regenerated,
        steps=steps,
    )
