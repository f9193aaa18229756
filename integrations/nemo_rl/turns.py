"""The completed turns of a multi-turn sample, kept so that a resume replays them instead of redoing them.

NeMo RL's ``AsyncRolloutImpl._run_single_rollout`` is one loop over turns (generate, step the
environment, append the observation) whose state (message log, environment metadata, stop strings,
reward so far, turn and token counts) lives in local variables. To continue a sample mid-rollout
without re-implementing that loop, a resume runs NeMo RL's own loop again from the prompt and
serves each turn completed before the cut from the snapshot: the generation from its saved record
(no engine request) and the environment step from its saved return (no environment call). The loop
rebuilds exactly the state it had; the turn in progress at the cut then continues from its prefix.

A turn is saved as JSON inside its group's ``data`` (tensors as in :mod:`.datum`). An environment
return that JSON cannot hold (a metadata object without a JSON form) makes its sample unsaveable;
its group is then regenerated at a resume, and the event log says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot import SampleRecord, SampleState, SamplingSpec
from partial_rollout_integrations.nemo_rl import datum as datum_codec

TURNS_KEY = "turns"
"""Key, in a group's ``data``, of its samples' completed turns: ``{sample index: [turn, ...]}``."""
UNSAVEABLE_KEY = "unsaveable"
"""Key, in a group's ``data``, of why a sample's turns could not be saved (the group is regenerated)."""
GENERATION = "generation"
ENVIRONMENT = "environment"


def encode_turn(record: SampleRecord, env_return: Any, *, field: str) -> dict[str, Any]:
    """One completed turn as JSON: the generation's record and the environment's return for this sample.

    Raises:
        SnapshotError: a field of the environment's return has no JSON form (named in the message).
    """
    assert record.state is SampleState.FINISHED, "a turn is completed only after its generation finished"
    generation = {
        "token_ids": record.token_ids.tolist(),
        "logprobs": record.logprobs.tolist(),
        "versions": record.versions.tolist(),
        "finish_reason": record.finish_reason,
        "stop_reason": record.stop_reason,
        "sampling": record.sampling.to_json(),
        "inexact": record.inexact,
    }
    observations, metadata, next_stop_strings, rewards, terminateds, answers = env_return
    if len(observations) != 1:
        raise SnapshotError(
            f"an environment step of {len(observations)} samples cannot be replayed per sample",
            field=f"{field}.{ENVIRONMENT}",
        )
    reward = {k: v[0] for k, v in rewards.items()} if isinstance(rewards, Mapping) else rewards[0]
    environment = {
        "observation": observations[0],
        "metadata": metadata[0],
        "next_stop_strings": None if next_stop_strings is None else next_stop_strings[0],
        "reward": reward,
        "terminated": terminateds[0],
        "answer": None if answers is None else answers[0],
    }
    return {
        GENERATION: generation,
        ENVIRONMENT: datum_codec.encode(environment, field=f"{field}.{ENVIRONMENT}"),
    }


def turn_record(turn: Mapping[str, Any], index: int, *, field: str) -> SampleRecord:
    """The finished generation record of a saved turn (what the engine returned for it).

    Raises:
        SnapshotError: the saved turn is malformed.
    """
    try:
        g = turn[GENERATION]
        return SampleRecord(
            index=index,
            state=SampleState.FINISHED,
            sampling=SamplingSpec.from_json(g["sampling"]),
            token_ids=g["token_ids"],
            logprobs=g["logprobs"],
            versions=g["versions"],
            finish_reason=g["finish_reason"],
            stop_reason=g["stop_reason"],
            inexact=g["inexact"],
        )
    except (KeyError, TypeError, ValueError) as e:
        raise SnapshotError(f"malformed saved turn ({e})", field=f"{field}.{GENERATION}") from e


def env_return(turn: Mapping[str, Any], make: Callable[..., Any], *, field: str) -> Any:
    """The environment's return of a saved turn, as a one-sample batch built by ``make``
    (NeMo RL's ``EnvironmentReturn``)."""
    env = datum_codec.decode(turn[ENVIRONMENT], field=f"{field}.{ENVIRONMENT}")
    reward = env["reward"]
    rewards = {k: torch.stack([v]) for k, v in reward.items()} if isinstance(reward, dict) else _batch(reward)
    return make(
        observations=[env["observation"]],
        metadata=[env["metadata"]],
        next_stop_strings=[env["next_stop_strings"]],
        rewards=rewards,
        terminateds=_batch(env["terminated"]),
        answers=[env["answer"]],
    )


def _batch(value: Any) -> torch.Tensor:
    return torch.stack([value]) if isinstance(value, torch.Tensor) else torch.tensor([value])
