"""What crosses HTTP between SkyRL's controller and a durable server, importable without vLLM or SkyRL.

SkyRL's controller (its trainer, in ``.venv-skyrl``) and the servers (on vLLM, in ``.venv``) share
no interpreter, so the samples a cut hands over travel as JSON. Every number survives the trip
exactly: token ids and versions are ints, and a float32 logprob widened to a Python float prints
and parses back to the same float32.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec

SESSION_HEADER = "X-Session-ID"
"""The header SkyRL's generator sends with each request: ``{uid}_{repetition}`` (its dataset index and
the sample's index in the group), the same across a restart."""


def split_session(session: str) -> tuple[str, int]:
    """The ``(uid, index)`` of a SkyRL session id (the uid may itself hold ``_``; the index never does).

    Raises:
        ValueError: the id does not end in ``_<index>``.
    """
    uid, _, index = session.rpartition("_")
    if not uid or not index.isdigit():
        raise ValueError(f"session id {session!r} is not SkyRL's '<uid>_<repetition>'")
    return uid, int(index)


@dataclass(frozen=True, kw_only=True)
class HeldSample:
    """A sample a server runs, holds finished, or was handed back to continue, under its session id."""

    session: str
    prompt_token_ids: list[int]
    record: SampleRecord
    """In flight (its prefix so far) or finished."""
    continued_tokens: int = 0
    """Tokens of ``record`` a snapshot held when the server was handed it (continued, not generated here)."""

    def to_json(self) -> dict[str, Any]:
        r = self.record
        return {
            "session": self.session,
            "prompt_token_ids": list(self.prompt_token_ids),
            "continued_tokens": self.continued_tokens,
            "record": {
                "index": r.index,
                "state": r.state.value,
                "sampling": r.sampling.to_json(),
                "token_ids": r.token_ids.tolist(),
                "logprobs": r.logprobs.tolist(),
                "versions": r.versions.tolist(),
                "finish_reason": r.finish_reason,
                "stop_reason": r.stop_reason,
                "sampler_state": None if r.sampler_state is None else base64.b64encode(r.sampler_state).decode(),
                "inexact": r.inexact,
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HeldSample:
        """Raises:
        ValueError: a missing or bad field, named (the record checks its own fields).
        """
        try:
            r = data["record"]
            record = SampleRecord(
                index=r["index"],
                state=SampleState(r["state"]),
                sampling=SamplingSpec.from_json(r["sampling"]),
                token_ids=np.asarray(r["token_ids"], np.int32),
                logprobs=np.asarray(r["logprobs"], np.float32),
                versions=np.asarray(r["versions"], np.int32),
                finish_reason=r["finish_reason"],
                stop_reason=r["stop_reason"],
                sampler_state=None if r["sampler_state"] is None else base64.b64decode(r["sampler_state"]),
                inexact=r["inexact"],
            )
            return cls(
                session=str(data["session"]),
                prompt_token_ids=[int(t) for t in data["prompt_token_ids"]],
                record=record,
                continued_tokens=int(data.get("continued_tokens", 0)),
            )
        except KeyError as exc:
            raise ValueError(f"held sample: field {exc.args[0]!r} is missing") from None
