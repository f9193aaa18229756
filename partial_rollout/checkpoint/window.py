"""The save half of a checkpoint: the frozen window in which one cut is taken, and its pending write.

A cut is consistent only if nothing changes between the engine's cut and the ledger's copy: no
coroutine may run, so no token is received, no sample finishes and the loader yields nothing. The
engines themselves never stop: the engine's cut is what this process has received of each request
(:mod:`partial_rollout.engine.cut`), and what they sample meanwhile is simply not in it.
:class:`FrozenWindow` is that stretch of code: the gate to the engine closed (no request is
submitted until it thaws), the engine's cut taken, then :meth:`FrozenWindow.cut`, which does no
I/O and awaits nothing; :meth:`FrozenWindow.thaw` opens the gate and logs the ``save`` event with
its timings. Only then is anything encoded or written: :meth:`PendingSnapshot.write` runs in any
thread, fsyncs, lets the trainer commit its checkpoint folder, and logs ``save_written`` or
``save_failed`` itself, so the previous checkpoint stays the latest whenever a write fails.

Most trainers never see a window: :meth:`RolloutCheckpointer.save` opens, cuts and thaws one.
A trainer that must read its own state in the same await-free turn as the cut (NeMo RL reads its
loader cursor inside its own save) opens one with :meth:`RolloutCheckpointer.freeze`.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

from partial_rollout.engine import Cut
from partial_rollout.ledger import WorkLedger
from partial_rollout.ledger.cut import LedgerCut
from partial_rollout.snapshot import Fingerprints, GroupState, SampleRecord, snapshot_path

ENGINE_OF_REQUEST = "engine_of_request"
"""Snapshot ``metadata`` key: which engine of a pool held each request in flight at the cut (request
id to engine index). A hint for logs only: a resume places every request anew, on however many
engines it has."""
ALL_STATES = frozenset(GroupState)


class StatefulLoader(Protocol):
    """A loader whose cursor can be saved and restored (torchdata's ``StatefulDataLoader`` is one)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class PendingSnapshot:
    """A checkpoint cut into memory and logged, to be written once (:meth:`write`)."""

    def __init__(self, cut: LedgerCut, ledger: WorkLedger, loop: asyncio.AbstractEventLoop) -> None:
        self.cut = cut
        """The ledger's copy of the outstanding work."""
        self._ledger = ledger
        self._loop = loop
        self._logged = threading.Event()
        self._written = False

    @property
    def save_id(self) -> str:
        """The id of this checkpoint's ``save`` event; a resume from it names it."""
        return self.cut.save_id

    @property
    def path(self) -> Path:
        """The snapshot file :meth:`write` creates."""
        return self.cut.path

    def write(self, folder: str | os.PathLike[str] | None = None, *, commit: Callable[[], object] | None = None) -> int:
        """Encode, write and fsync the snapshot, then ``commit``; log the outcome; return the file's size.

        Safe to call from a worker thread (``asyncio.to_thread(pending.write)``): the outcome is
        logged on the event loop the save ran on.

        Args:
            folder: write into this folder instead of the one given to the save (a trainer whose
                framework creates the real checkpoint folder later, e.g. NeMo RL's ``tmp_step_N``).
            commit: the trainer's own commit of its checkpoint (e.g. renaming ``step_N.tmp`` to
                ``step_N``), run after the snapshot is on disk; a failure in it counts as a failed save.

        Raises:
            Exception: whatever the writer, the disk or ``commit`` raised, after ``save_failed`` is logged.
                The snapshot file is then absent (never half-written) and every earlier checkpoint intact.
        """
        if self._written:
            raise RuntimeError(f"save {self.save_id} was already written")
        if not self._logged.is_set():
            if _running_loop() is self._loop:
                raise RuntimeError(f"save {self.save_id}: thaw() its window before writing it")
            self._logged.wait()  # the save event must precede its outcome in the log
        self._written = True
        if folder is not None:
            self.cut.path = snapshot_path(folder)
        ledger = self._ledger
        started = time.perf_counter()
        try:
            size = self.cut.write()
            if commit is not None:
                commit()
        except BaseException as exc:
            error = f"{type(exc).__name__}: {exc}"
            self._report(lambda: ledger.record_save_failed(self.cut, error=error))
            raise
        write_ms = _ms(time.perf_counter() - started)
        self._report(lambda: ledger.record_written(self.cut, write_ms=write_ms, bytes=size))
        return size

    def _report(self, log: Callable[[], None]) -> None:
        """Run ``log`` on the save's event loop (directly when already there or when that loop is gone)."""
        if self._loop.is_closed() or _running_loop() is self._loop:
            log()
        else:
            self._loop.call_soon_threadsafe(log)


class FrozenWindow:
    """The gate to the engine closed for one cut, with the engine's cut taken (or, for a save that keeps
    no in-flight work, without one)."""

    def __init__(
        self,
        *,
        ledger: WorkLedger,
        loader: StatefulLoader | None,
        fingerprints: Fingerprints,
        running: Callable[[], frozenset[str]],
        engine_cut: Cut | None,
        requested: float,
        open_gate: Callable[[], None],
        on_cut: Callable[[LedgerCut], None],
    ) -> None:
        """
        Args:
            ledger: the work ledger the cut copies.
            loader: the loader whose cursor the cut reads (``None``: no loader).
            fingerprints: what the snapshot is bound to.
            running: the request ids submitted and not returned, which the engine's cut must hold.
            engine_cut: the engine's cut (``None``: none was taken).
            requested: when the freeze was asked for (``time.perf_counter``), for the timings.
            open_gate: lets the requests waiting on the gate go to the engine.
            on_cut: told of the cut once it is taken.
        """
        self.engine_cut = engine_cut
        """The engine's cut (``None``: none was taken)."""
        self._ledger, self._loader, self._fingerprints, self._running = ledger, loader, fingerprints, running
        self._open_gate, self._on_cut = open_gate, on_cut
        self._requested = requested
        self._pending: PendingSnapshot | None = None
        self._cut_ms = 0.0
        self._thawed = False

    def cut(
        self,
        folder: str | os.PathLike[str],
        *,
        trainer_step: int,
        policy_version: int,
        states: Collection[GroupState] = ALL_STATES,
        metadata: Mapping[str, Any] | None = None,
        samples: Mapping[str, SampleRecord] | None = None,
    ) -> PendingSnapshot:
        """Copy the outstanding work into memory, with the loader's cursor read now; awaits nothing.

        Args:
            folder: the checkpoint folder the snapshot goes into.
            trainer_step: the training step the checkpoint is of.
            policy_version: the policy version at the cut.
            states: the group states to save (all of them; a baseline that keeps what trainers
                keep today passes ``{GroupState.READY}``).
            metadata: the trainer's own JSON-native values, stored in the snapshot.
            samples: the engine-side record of each request, by request id, when the trainer
                knows more than the engine (NeMo RL holds generations returned to it and not yet
                stepped by an environment); default: the engine's cut.

        Raises:
            RuntimeError: a request the checkpointer submitted and that has not returned is
                missing from the engine's cut (its tokens would be lost), or the window was cut
                or thawed already.
        """
        if self._pending is not None or self._thawed:
            raise RuntimeError("a window holds one cut, taken before thaw()")
        copying = time.perf_counter()
        extra = dict(metadata or {})
        if self.engine_cut is not None:
            captured = self.engine_cut.samples if samples is None else samples
            missing = sorted(self._running() - set(captured))
            if missing:
                raise RuntimeError(
                    f"the engine's cut lacks {len(missing)} running request(s) {missing[:5]}: their tokens"
                    " would be lost; the engine does not capture every request it was given"
                )
            self._ledger.capture(captured)
            if self.engine_cut.engines:
                extra[ENGINE_OF_REQUEST] = dict(self.engine_cut.engines)
        loader_state = None if self._loader is None else self._loader.state_dict()
        cut = self._ledger.cut(
            folder,
            trainer_step=trainer_step,
            policy_version=policy_version,
            fingerprints=self._fingerprints,
            loader_state=loader_state,
            states=states,
            metadata=extra,
        )
        self._on_cut(cut)
        self._cut_ms = _ms(time.perf_counter() - copying)
        self._pending = PendingSnapshot(cut, self._ledger, asyncio.get_running_loop())
        return self._pending

    async def thaw(self) -> None:
        """Open the gate to the engine, then log the ``save`` event with the window's timings.

        ``gate_ms`` is how long requests could not be submitted (from the freeze request until the
        gate opened); ``engine_cut_ms`` and ``cut_ms`` what the engine's cut and the ledger's copy
        took. No engine stopped for any of it.
        """
        if self._thawed:
            return
        self._thawed = True
        frozen = self.engine_cut
        try:
            self._open_gate()
        finally:
            pending = self._pending
            if pending is not None:
                try:
                    timings: dict[str, Any] = {"cut_ms": self._cut_ms}
                    if frozen is not None:
                        timings |= {
                            "gate_ms": _ms(time.perf_counter() - self._requested),
                            "engine_cut_ms": _ms(frozen.cut_s),
                            "engine_tokens": frozen.engine_tokens,
                        }
                    self._ledger.record_save(pending.cut, **timings)
                finally:
                    pending._logged.set()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)
