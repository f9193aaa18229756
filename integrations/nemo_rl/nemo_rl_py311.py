"""Python 3.11 support for NeMo RL's controller venv, run at every start of that venv's interpreter.

NeMo RL asks for Python 3.13, and its code runs on 3.11 once two behaviours are those of 3.12+.
``scripts/setup_nemo_rl.sh`` copies this module and ``nemo_rl_py311.pth`` (one line that imports
it) into ``.venv-nemo-rl``'s site-packages, only when that venv's Python is older than 3.12, so the
changes are in place before any NeMo RL module is imported, in the driver and in its Ray workers.
It is not part of the installed package: nothing else imports it.

- ``typing.TypedDict`` becomes ``typing_extensions.TypedDict``: NeMo RL's configs are TypedDicts
  that pydantic validates, and pydantic refuses ``typing.TypedDict`` below 3.12.
- ``asyncio.wait_for`` keeps a cancellation: on 3.11 a cancellation that arrives once the awaited
  future has finished, before ``wait_for`` has resumed, is dropped and the result returned (CPython
  issue gh-86296; 3.12 rebuilt ``wait_for`` on ``asyncio.timeout``). A loop around ``wait_for``
  then cannot be cancelled: NeMo RL's stall-watchdog pump is such a loop, and its own unit tests
  (``TestEnvHealthCheck`` in ``test_watchdog_pump.py``) hang on 3.11 when the race is hit.
"""

from __future__ import annotations

import asyncio
import sys
import typing
from collections.abc import Awaitable
from typing import TypeVar

import typing_extensions

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:  # noqa: ASYNC109  asyncio.wait_for's signature
    """``asyncio.wait_for`` as of 3.12: past ``timeout`` seconds ``aw`` is cancelled and
    ``TimeoutError`` raised; a cancellation of the caller always reaches the caller."""
    async with asyncio.timeout(timeout):
        return await aw


if sys.version_info < (3, 12):
    typing.TypedDict = typing_extensions.TypedDict
    asyncio.wait_for = asyncio.tasks.wait_for = wait_for  # type: ignore[assignment]
