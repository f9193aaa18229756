"""SIGKILL a Ray-actor engine as an operator's fault injection would: its process and every descendant.

Shared by the engine-fault tests and the fault-injection driver they run as a child process.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


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
