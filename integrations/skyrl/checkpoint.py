"""The trainer's side of a SkyRL checkpoint: one cut of the servers, one snapshot, and its way back.

At a save, SkyRL's trainer knows which prompt groups it has trained on (their uids), and the servers
hold every other sample: running, finished and waiting in SkyRL's buffer, or handed back by a
resume and not yet asked for. :meth:`Servers.cut` asks each server for those in one instant, and
:func:`snapshot_of` writes them as the library's snapshot: one group per uid, the samples no server
has started yet as ``not_started``. At a resume, :meth:`Servers.restore` hands them back, so
SkyRL's own resume, which asks again for every prompt not trained on, continues each saved prefix
and replays each finished sample instead of generating them anew.

This module talks to the servers over HTTP, synchronously (SkyRL saves in a worker thread), and
imports neither SkyRL nor vLLM: it runs in SkyRL's environment, and in the tests' ``.venv``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from partial_rollout.errors import BadInputError
from partial_rollout.snapshot import (
    Fingerprints,
    GroupRecord,
    GroupState,
    SampleRecord,
    SampleState,
    Snapshot,
    load_snapshot,
    sample_seed,
)
from partial_rollout_integrations.skyrl.wire import HeldSample, split_session

STEP_KEY = "skyrl_global_step_when_scheduled"
"""Group ``data`` key: the SkyRL step the group was scheduled at, so that a resumed group keeps its
staleness (SkyRL's own resume tags every group with the resumed step)."""


class ServerError(RuntimeError):
    """A server refused or failed a call of the trainer's (its URL and answer are in the message)."""


@dataclass(frozen=True, kw_only=True)
class Cut:
    """What the servers held at one instant, less the groups trained on."""

    samples: list[HeldSample]
    policy_version: int
    fingerprints: Fingerprints
    run_seed: int
    """The servers' seed, from which an unstarted sample's seed derives."""


class Servers:
    """The durable servers of one run, addressed by URL."""

    def __init__(self, urls: Sequence[str], *, timeout_s: float = 300.0) -> None:
        if not urls:
            raise ValueError("no server URLs: the durable servers are SkyRL's external servers")
        self.urls = [u.rstrip("/") for u in urls]
        self._timeout_s = timeout_s

    def _call(self, url: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            url + path,
            data=data,
            method="GET" if body is None else "POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                answer: dict[str, Any] = json.loads(response.read())
                return answer
        except urllib.error.HTTPError as exc:
            raise ServerError(f"{url}{path}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"{url}{path}: {exc}") from None

    def state(self) -> list[dict[str, Any]]:
        """Each server's policy version, fingerprints and counters (tokens generated and continued)."""
        return [self._call(url, "/partial_rollout/state") for url in self.urls]

    def fingerprints(self) -> Fingerprints:
        """The servers' fingerprints, which must agree (one model, one vLLM)."""
        prints = [Fingerprints.from_json(s["fingerprints"]) for s in self.state()]
        for url, other in zip(self.urls[1:], prints[1:], strict=True):
            if other.mismatches(prints[0]):
                raise ServerError(
                    f"{url} serves another model or vLLM than {self.urls[0]}: {other.mismatches(prints[0])}"
                )
        return prints[0]

    def update_weights(self, weights_dir: str | Path, policy_version: int) -> None:
        for url in self.urls:
            self._call(
                url,
                "/partial_rollout/update_weights",
                {"weights_dir": str(weights_dir), "policy_version": policy_version},
            )

    def cut(self, trained_uids: Sequence[str]) -> Cut:
        """Every sample of a group not trained on, from every server.

        Servers are cut one after another; SkyRL routes a session to one server, and a sample a
        resume handed to every server is kept where it progressed furthest.
        """
        answers = [self._call(url, "/partial_rollout/cut", {"trained_uids": list(trained_uids)}) for url in self.urls]
        best: dict[str, HeldSample] = {}
        for answer in answers:
            for data in answer["samples"]:
                sample = HeldSample.from_json(data)
                kept = best.get(sample.session)
                if kept is None or _progress(sample) > _progress(kept):
                    best[sample.session] = sample
        return Cut(
            samples=list(best.values()),
            policy_version=max(a["policy_version"] for a in answers),
            fingerprints=Fingerprints.from_json(answers[0]["fingerprints"]),
            run_seed=int(answers[0]["seed"]),
        )

    def restore(self, samples: Sequence[HeldSample]) -> None:
        """Hand every server the samples to continue (a session is asked for again on one of them)."""
        body = {"samples": [s.to_json() for s in samples]}
        for url in self.urls:
            self._call(url, "/partial_rollout/restore", body)


def _progress(sample: HeldSample) -> tuple[bool, int]:
    return sample.record.state is SampleState.FINISHED, sample.record.num_tokens


def snapshot_of(
    cut: Cut,
    *,
    n: int,
    trainer_step: int,
    scheduled_at: Mapping[str, int],
    metadata: Mapping[str, Any] | None = None,
) -> Snapshot:
    """The snapshot of a cut: one group per uid, ``n`` samples each.

    Args:
        n: samples per prompt (SkyRL's ``generator.n_samples_per_prompt``).
        trainer_step: the SkyRL step being saved.
        scheduled_at: the step each group was scheduled at, by uid (a resumed group's is the one
            its snapshot recorded; a uid missing here counts as scheduled at ``trainer_step``).
    """
    by_uid: dict[str, dict[int, HeldSample]] = {}
    for sample in cut.samples:
        uid, index = split_session(sample.session)
        if index >= n:
            raise ValueError(f"session {sample.session!r}: repetition {index} but n_samples_per_prompt is {n}")
        by_uid.setdefault(uid, {})[index] = sample
    groups = []
    for uid, held in sorted(by_uid.items()):
        first = next(iter(held.values()))
        samples = [held[i].record if i in held else _unstarted(first.record, uid, i, cut.run_seed) for i in range(n)]
        done = all(s.state is SampleState.FINISHED for s in samples)
        step = scheduled_at.get(uid, trainer_step)
        groups.append(
            GroupRecord(
                group_id=uid,
                prompt_token_ids=np.asarray(first.prompt_token_ids, np.int32),
                data={STEP_KEY: int(step)},
                state=GroupState.READY if done else GroupState.IN_FLIGHT,
                dispatch_version=min(int(step), cut.policy_version),
                samples=samples,
            )
        )
    return Snapshot(
        trainer_step=trainer_step,
        policy_version=cut.policy_version,
        fingerprints=cut.fingerprints,
        groups=groups,
        counters={"groups": len(groups), "samples": len(cut.samples)},
        metadata=dict(metadata or {}),
    )


def _unstarted(sibling: SampleRecord, uid: str, index: int, run_seed: int) -> SampleRecord:
    """A sample no server has been asked for yet: its sibling's sampling, its own seed."""
    seed = None if sibling.sampling.seed is None else sample_seed(run_seed, uid, index)
    return SampleRecord(index=index, state=SampleState.NOT_STARTED, sampling=sibling.sampling.with_seed(seed))


@dataclass(frozen=True, kw_only=True)
class Restored:
    """What a resume hands back: the samples to continue or replay, and each group's scheduling step."""

    samples: list[HeldSample]
    scheduled_at: dict[str, int]
    snapshot: Snapshot


def load_restored(folder: str | Path, *, expect: Fingerprints) -> Restored:
    """The snapshot in checkpoint ``folder``, checked against the servers' ``expect``.

    Raises:
        SnapshotError: the file is missing, damaged, or of another model, tokenizer or vLLM (named).
        BadInputError: a group lacks its scheduling step (not a SkyRL snapshot).
    """
    snapshot = load_snapshot(folder, expect=expect)
    samples, scheduled_at = [], {}
    for group in snapshot.groups:
        if STEP_KEY not in group.data:
            raise BadInputError(
                f"group {group.group_id!r} has no data.{STEP_KEY}",
                path=folder,
                field=f"groups[{group.group_id}].data",
                fix="resume a SkyRL run from a snapshot a SkyRL run wrote",
            )
        scheduled_at[group.group_id] = int(group.data[STEP_KEY])
        prompt = group.prompt_token_ids.tolist()
        for sample in group.samples:
            if sample.state is not SampleState.NOT_STARTED:
                samples.append(
                    HeldSample(
                        session=f"{group.group_id}_{sample.index}",
                        prompt_token_ids=prompt,
                        record=sample,
                        continued_tokens=sample.num_tokens,
                    )
                )
    return Restored(samples=samples, scheduled_at=scheduled_at, snapshot=snapshot)
