"""Make vLLM's engine-core process die with the process that started it.

vllm 0.32.0's engine core does not watch its front-end process: when a trainer is killed with
SIGKILL (a preemption, an OOM kill, our own demo), the ``VLLM::EngineCore`` child is re-parented
to init and keeps polling, holding its memory and a core's worth of CPU, forever. A trainer that
is restarted after such a kill then competes with its own ghost. The guard is a daemon thread in
the worker (which vLLM places inside the engine-core process, or in a child of it that vLLM
already kills when the core dies) that checks the front end every second and ends the engine core
once it is gone.
"""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_S = 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _engine_core_pid(frontend_pid: int) -> int:
    """The engine-core process: this one, or this worker's parent when workers are separate."""
    parent = os.getppid()
    return os.getpid() if parent == frontend_pid else parent


def start(frontend_pid: int) -> bool:
    """Start the guard once per process; returns False when it was already running."""
    if getattr(start, "_started", False):
        return False
    start._started = True  # type: ignore[attr-defined]
    core = _engine_core_pid(frontend_pid)

    def watch() -> None:
        while _alive(frontend_pid):
            time.sleep(POLL_S)
        if core != os.getpid():
            os.kill(core, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="partial-rollout-orphan-guard", daemon=True).start()
    return True
