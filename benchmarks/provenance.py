"""Where a benchmark result was measured: the machine, the versions, the commit; and its plain JSON write."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import numpy as np


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        pass
    mem = None
    try:
        mem = (
            int(
                next(
                    line.split()[1]
                    for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")
                )
            )
            * 1024
        )
    except (OSError, StopIteration):
        pass
    gpu = None
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return dict(
        platform=platform.platform(),
        python=platform.python_version(),
        cpu=cpu,
        cpu_count=os.cpu_count(),
        affinity=len(os.sched_getaffinity(0)),
        memory_bytes=mem,
        loadavg_at_end=os.getloadavg(),
        gpu=gpu,
    )


def short_commit() -> str:
    """This checkout's commit, short (empty outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def write_json(out: Path, result: dict[str, Any]) -> None:
    """``result`` as ``out`` with a ``.json`` suffix, its folder made."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")


def versions() -> dict[str, Any]:
    import torch
    import vllm

    commit = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        pass
    return dict(vllm=vllm.__version__, torch=torch.__version__, numpy=np.__version__, partial_rollout_commit=commit)
