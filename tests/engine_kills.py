"""SIGKILL a Ray-actor engine as an operator's fault injection would: its process and every descendant.

Shared by the engine-fault tests and the fault-injection driver they run as a child process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (an engine host's vLLM engine core among them)."""
    tree, i = [pid], 0
    while i < len(tree):
        try:
            tasks = list(Path(f"/proc/{tree[i]}/task").iterdir())
        except FileNotFoundError:
            tasks = []
        for task in tasks:
            try:
                tree += [int(c) for c in (task / "children").read_text().split()]
            except FileNotFoundError:
                pass
        i += 1
    return tree


def engine_hosts() -> list[int]:
    """Pids of this process's Ray workers that run an engine host (Ray titles them ``ray::_EngineHost...``).

    Only descendants of this process, whose ``ray.init`` started the cluster: no other run's engines.
    """
    ours = set(process_tree(os.getpid()))
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return sorted(
        pid for line in out.splitlines() if "ray::_EngineHost" in line and (pid := int(line.split()[0])) in ours
    )


def send(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants."""
    send(process_tree(pid), signal.SIGKILL)


async def kill_one_while_starting(start: Awaitable[T], num_engines: int) -> T:
    """Run ``start`` (a pool of ``num_engines`` starting); SIGKILL one engine host while all are starting."""
    while engine_hosts():  # noqa: ASYNC110 - the engines of an earlier pool are still going away
        await asyncio.sleep(0.1)
    starting = asyncio.ensure_future(start)
    while len(hosts := engine_hosts()) < num_engines:
        assert not starting.done(), "the pool started before its engines could be seen"
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)  # every engine is inside its start (vLLM takes seconds to come up)
    assert not starting.done(), "the engines finished starting before the kill"
    kill(hosts[-1])
    return await starting
