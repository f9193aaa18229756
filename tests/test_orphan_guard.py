"""A trainer killed with SIGKILL must not leave its vLLM engine core running (vllm 0.32.0 does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

_CHILD = r"""
import asyncio, os, sys
from partial_rollout.engine import ResumableEngine
from partial_rollout.engine.factory import EngineConfig

async def main():
    engine = await ResumableEngine.start(EngineConfig(model=sys.argv[1], max_model_len=512, multiprocessing=False))
    print("READY", flush=True)
    await asyncio.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid,ppid"], capture_output=True, text=True).stdout.split("\n")[1:]
    return [int(p) for p, pp in (line.split() for line in out if line.strip()) if int(pp) == pid]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state not in ("Z", "X")


@pytest.mark.engine
def test_engine_core_exits_when_its_trainer_is_killed(tiny_llama: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(tiny_llama)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # vLLM logs to stdout too
            if line.strip() == "READY":
                break
        else:
            pytest.fail("the child exited before its engine was ready")
        cores = [p for p in _children(proc.pid) if "EngineCore" in Path(f"/proc/{p}/cmdline").read_text()]
        assert cores, "expected a VLLM::EngineCore child"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 15
        while any(_alive(p) for p in cores) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(_alive(p) for p in cores), "the engine core outlived its killed front end"
    finally:
        if proc.poll() is None:
            proc.kill()
