"""``partial-rollout dump --plot``: a snapshot drawn, so what it holds reads at a glance.

One horizontal bar per sample: the tokens generated so far, coloured by the policy version that
sampled them (a stale prefix, or one that spans a weight update, shows as colour), then the budget
left up to ``max_tokens``, hatched. A finished sample has no budget left to show; an in-flight one
ends in an arrow, where its continuation picks up. The rows are grouped by prompt group and shaded
by the group's state. A pending group's samples are all alike (nothing generated, the whole budget
left), so they share one row.

A snapshot may hold thousands of samples; past :data:`MAX_ROWS` rows the bars would be too thin to
read, so whole groups are drawn in a fixed order, in flight first (the work a resume continues),
then pending, then ready, until the rows are used up; the figure says what it left out, and its
title counts everything. Groups are chosen from the structural tensors and only the drawn ones are
read, so a huge snapshot costs no more to draw than a small one.

This module lives in the command line, not in :mod:`partial_rollout.snapshot`: it is a view for
people, like the dump's text, and matplotlib (the optional ``bench`` extra) is imported only here,
only when a plot is asked for, so neither the snapshot format nor the trainers that import it
depend on it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.atomic import atomic_write
from partial_rollout.cli.escapes import printable
from partial_rollout.errors import BadInputError
from partial_rollout.snapshot import layout
from partial_rollout.snapshot.reader import SnapshotReader
from partial_rollout.snapshot.runs import encode_runs, run_ends
from partial_rollout.snapshot.schema import GroupState, SampleState

MAX_ROWS = 60
"""Most bar rows in one figure: at about 0.2 inch a row, more no longer read at a glance."""
ORDER = (GroupState.IN_FLIGHT, GroupState.PENDING, GroupState.READY)
"""Which groups are drawn first when not all fit, and the order they are drawn in (top to bottom)."""
VERSION_COLOURS = ("#2b59c3", "#d1495b", "#8e44ad", "#8c6d1f", "#e377c2", "#222222")
"""Colour of tokens sampled under the snapshot's policy version, one version behind it, two, ...; the
last also for all older ones. Far apart, so one weight update inside a prefix shows."""
OLDEST_AGE = len(VERSION_COLOURS) - 1
"""Tokens this many policy versions behind the snapshot's, or more, share the last colour."""
LABEL_CHARS = 28
"""Group ids are cut to this many characters on the axis."""
_STATE_SHADES = {GroupState.IN_FLIGHT: "#fbe3c4", GroupState.PENDING: "#e4e4e4", GroupState.READY: "#d6efd6"}
_STATE_INKS = {GroupState.IN_FLIGHT: "#b35900", GroupState.PENDING: "#555555", GroupState.READY: "#2a7a2a"}
_END_MARKERS = ((SampleState.IN_FLIGHT, ">", "in flight: continues here"), (SampleState.FINISHED, "|", "finished"))


@dataclasses.dataclass(frozen=True)
class Drawn:
    """How much of the snapshot the figure shows (the rest is counted in its title)."""

    groups: int
    samples: int
    of_groups: int
    of_samples: int

    @property
    def everything(self) -> bool:
        return (self.groups, self.samples) == (self.of_groups, self.of_samples)

    def __str__(self) -> str:
        if self.everything:
            return f"{self.groups} groups, {self.samples} samples"
        return f"{self.groups} of {self.of_groups} groups, {self.samples} of {self.of_samples} samples"


@dataclasses.dataclass(frozen=True)
class _Row:
    """One bar: a sample, or all the samples of a pending group."""

    runs: list[tuple[int, int, int]]
    """``(first token, tokens, policy version)`` of each version run of the prefix."""
    tokens: int
    max_tokens: int
    state: SampleState
    samples: int = 1


@dataclasses.dataclass(frozen=True)
class _Block:
    group_id: str
    state: GroupState
    rows: list[_Row]
    samples_left_out: int


def plot_snapshot(reader: SnapshotReader, summary: dict[str, Any], path: Path) -> Drawn:
    """Draw the snapshot ``reader`` has open into the PNG ``path``, written whole or not at all.

    Args:
        reader: an open snapshot, its checksums verified.
        summary: :func:`~partial_rollout.snapshot.summary.summarize` of it, for the title.
        path: the PNG to write; its folder must exist.

    Raises:
        BadInputError: ``path`` cannot be written (naming it and ``--plot``).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # optional: the bench extra
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    blocks = _blocks(reader)
    rows = sum(len(b.rows) for b in blocks)
    height = max(4.0, 1.4 + 0.22 * rows + 0.12 * len(blocks))
    fig = Figure(figsize=(11, height))
    FigureCanvasAgg(fig)
    fig.subplots_adjust(top=1 - 0.75 / height, bottom=0.65 / height)  # inches for the title and the x axis
    ax = fig.add_subplot()
    handles = _draw(ax, blocks, reader.policy_version)
    handles += [Patch(facecolor=_STATE_SHADES[s], label=f"group {s.value.replace('_', ' ')}") for s in ORDER]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.suptitle(_title(reader, summary), fontsize=10, x=0.02, ha="left")
    drawn = Drawn(
        groups=len(blocks),
        samples=sum(r.samples for b in blocks for r in b.rows),
        of_groups=reader.num_groups,
        of_samples=reader.num_samples,
    )
    if not drawn.everything:
        note = f"Drawn: {drawn} (at most {MAX_ROWS} rows: in-flight groups first, then pending, then ready)."
        fig.text(0.02, 0.0, f"{note} The title counts them all.", va="top", fontsize=9, color="#b30000")
    try:
        with atomic_write(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100, bbox_inches="tight")
    except OSError as exc:
        raise BadInputError(f"cannot write it: {exc.strerror or exc}", path=path, field="--plot") from None
    return drawn


def _blocks(reader: SnapshotReader) -> list[_Block]:
    """The groups to draw, in :data:`ORDER`, whole until :data:`MAX_ROWS` rows are used (the last may be cut)."""
    states = reader.arrays["group.state"]
    sizes = np.diff(reader.arrays["group.sample_offsets"])
    blocks: list[_Block] = []
    rows_left = MAX_ROWS
    for state in ORDER:
        for g in np.flatnonzero(states == layout.GROUP_STATE_CODES[state]).tolist():
            if not rows_left:
                return blocks
            group = reader.group(reader.group_ids[g])
            if state is GroupState.PENDING:
                budget = max(s.sampling.max_tokens for s in group.samples)
                rows = [_Row([], 0, budget, SampleState.NOT_STARTED, samples=len(group.samples))]
            else:
                rows = [_row(s.versions, s.sampling.max_tokens, s.state) for s in group.samples[:rows_left]]
            blocks.append(_Block(group.group_id, state, rows, int(sizes[g]) - sum(r.samples for r in rows)))
            rows_left -= len(rows)
    return blocks


def _row(versions: np.ndarray, max_tokens: int, state: SampleState) -> _Row:
    _, values, lengths = encode_runs([versions])
    starts = run_ends(lengths)[:-1]
    runs = [(int(a), int(n), int(v)) for a, n, v in zip(starts, lengths, values, strict=True)]
    return _Row(runs, len(versions), max_tokens, state)


def _draw(ax: Any, blocks: list[_Block], policy_version: int) -> list[Any]:
    """The bars, their labels and shading on ``ax``; returns the legend handles of what is drawn."""
    y, ticks, labels, inks = 0.0, [], [], []
    segments: dict[int, list[tuple[float, int, int]]] = {}
    budgets: list[tuple[float, int, int]] = []
    ends: dict[SampleState, list[tuple[int, float]]] = {SampleState.IN_FLIGHT: [], SampleState.FINISHED: []}
    widest = 1
    for block in blocks:
        top = y
        for row in block.rows:
            for start, n, version in row.runs:
                segments.setdefault(min(policy_version - version, OLDEST_AGE), []).append((y, start, n))
            if row.state is not SampleState.FINISHED:
                budgets.append((y, row.tokens, row.max_tokens - row.tokens))
            if row.state in ends:
                ends[row.state].append((row.tokens, y))
            text = f"{row.tokens}/{row.max_tokens}" if row.samples == 1 else f"{row.samples} × 0/{row.max_tokens}"
            end = row.tokens if row.state is SampleState.FINISHED else row.max_tokens
            ax.text(end, y, f" {text}", va="center", fontsize=6, color="#444444")
            widest = max(widest, row.max_tokens)
            y += 1
        ax.axhspan(top - 0.5, y - 0.5, color=_STATE_SHADES[block.state], zorder=0, linewidth=0)
        ticks.append((top + y - 1) / 2)
        cut = f" ({len(block.rows)} of {len(block.rows) + block.samples_left_out})" if block.samples_left_out else ""
        labels.append(_text(block.group_id, LABEL_CHARS) + cut)
        inks.append(_STATE_INKS[block.state])
        y += 0.4  # a gap between groups
    handles = []
    for age in sorted(segments):
        ys, lefts, widths = zip(*segments[age], strict=True)
        version = policy_version - age
        name = f"v{version} (current)" if not age else f"v{version} ({age} behind)"
        if age == OLDEST_AGE:
            name = f"v{version} or older"
        handles.append(
            ax.barh(ys, widths, left=lefts, height=0.7, color=VERSION_COLOURS[age], label=f"tokens of {name}")
        )
    if budgets:
        ys, lefts, widths = zip(*budgets, strict=True)
        budget = dict(facecolor="none", edgecolor="#999999", hatch="////", linewidth=0.5)
        handles.append(ax.barh(ys, widths, left=lefts, height=0.7, label="budget left (max_tokens - tokens)", **budget))
    for state, marker, name in _END_MARKERS:
        if ends[state]:
            xs, ys = zip(*ends[state], strict=True)
            handles += ax.plot(
                xs, ys, marker=marker, linestyle="none", color="black", markersize=6, mew=1.5, label=name
            )
    ax.set_yticks(ticks, labels, fontsize=8)
    for tick, ink in zip(ax.get_yticklabels(), inks, strict=True):
        tick.set_color(ink)
    ax.set_ylim(y - 0.9 if blocks else 1, -0.6)  # row 0 on top
    ax.set_xlim(0, widest * 1.12)
    ax.set_xlabel("tokens: generated so far, coloured by the policy version that sampled them; then the budget left")
    if not blocks:
        ax.text(0.5, 0.5, "the snapshot holds no groups", transform=ax.transAxes, ha="center", va="center")
    return handles


def _title(reader: SnapshotReader, summary: dict[str, Any]) -> str:
    c = summary["counts"]
    name = _text(str(Path(reader.path.parent.name) / reader.path.name))
    return (
        f"{name}: trainer step {reader.trainer_step}, policy version {reader.policy_version}\n"
        f"{c['groups']} groups: {c['groups_pending']} pending, {c['groups_in_flight']} in flight"
        f" ({c['groups_partial']} partial), {c['groups_ready']} ready;"
        f" {c['samples']} samples: {c['samples_not_started']} not started, {c['samples_in_flight']} in flight,"
        f" {c['samples_finished']} finished; {c['tokens_in_flight']} prefix tokens in flight"
    )


def _text(text: str, limit: int | None = None) -> str:
    """Snapshot text as figure text: control characters escaped as the dump's text output escapes them
    (:func:`~partial_rollout.cli.escapes.printable`), cut to ``limit`` characters, and ``$`` kept literal
    (not mathtext)."""
    shown = printable(text)
    if limit is not None and len(shown) > limit:
        shown = shown[: limit - 1] + "…"
    return shown.replace("$", r"\$")
