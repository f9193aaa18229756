"""The sampling parameters of one sample: what a request asks of the engine, and what a snapshot stores.

A :class:`SamplingSpec` is the library's spelling of vLLM's ``SamplingParams``: the trainer builds
one per sample, the ledger keeps it with the sample, the engine adapter turns it into
``SamplingParams`` (for the continuation of a saved prefix too), and a snapshot stores the distinct
ones in its ``tables.sampling``, the seeds apart (docs/snapshot_format.md). It lives here, beside
the records, because the file format stores it; nothing in it is specific to the file. It is frozen
and validated on construction, so a bad parameter fails where the trainer builds the spec, not
inside an engine call.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from partial_rollout.snapshot._checks import INT64_MAX, INT64_MIN, canonical_json, check_float, check_int, check_text

GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (vLLM's own threshold)."""


def sample_seed(run_seed: int, group_id: str, index: int, turn: int = 0) -> int:
    """The sampler seed of sample ``index`` of group ``group_id`` (its ``turn``-th generation, for a
    multi-turn sample): one rule for every trainer.

    A seeded request is one an engine can continue exactly from its seed and its tokens, so a
    sample regenerated or continued after a restart draws what it would have drawn uninterrupted;
    deriving the seed from the sample's identity (not from a counter) keeps it the same however the
    restart reordered the work. 63 bits of BLAKE2b, so that it fits every engine's signed 64-bit seed.
    """
    key = f"{run_seed}:{group_id}:{index}" + (f":{turn}" if turn else "")
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & INT64_MAX


@dataclass(kw_only=True, slots=True, frozen=True)
class SamplingSpec:
    """The sampling parameters of one sample, as vLLM's ``SamplingParams`` takes them.

    ``max_tokens`` and ``min_tokens`` are the budget of the *whole* completion, not of what is left:
    a resume subtracts the saved prefix itself.
    """

    max_tokens: int
    """Most tokens the completion may have (vLLM ``max_tokens``)."""
    temperature: float = 1.0
    """Softmax temperature; below 1e-5 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass, in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 or -1 disables it."""
    min_p: float = 0.0
    """Drop tokens below this fraction of the top token's probability, in [0, 1]."""
    min_tokens: int = 0
    """Suppress EOS and stop tokens until the completion has this many tokens."""
    seed: int | None = None
    """Per-request sampler seed, or None for the engine's global generator."""
    stop: tuple[str, ...] = ()
    """Stop strings."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that stop generation besides EOS."""
    ignore_eos: bool = False
    """Keep generating after EOS."""
    presence_penalty: float = 0.0
    """Penalty for tokens already present, in [-2, 2]."""
    frequency_penalty: float = 0.0
    """Penalty proportional to a token's count so far, in [-2, 2]."""
    repetition_penalty: float = 1.0
    """Multiplicative penalty for repeated tokens, > 0 (1 disables it)."""
    logprobs: int = 0
    """How many top logprobs the engine returns per token besides the sampled one's."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Other JSON-native ``SamplingParams`` fields (e.g. ``bad_words``), passed through unchanged."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise in place once
        set_(self, "max_tokens", check_int("sampling.max_tokens", self.max_tokens, minimum=1))
        set_(self, "temperature", check_float("sampling.temperature", self.temperature))
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        set_(self, "top_p", check_float("sampling.top_p", self.top_p))
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        set_(self, "top_k", check_int("sampling.top_k", self.top_k, minimum=-1))
        set_(self, "min_p", check_float("sampling.min_p", self.min_p))
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling.min_p must be in [0, 1], got {self.min_p}")
        set_(self, "min_tokens", check_int("sampling.min_tokens", self.min_tokens, minimum=0, maximum=self.max_tokens))
        if self.seed is not None:
            set_(self, "seed", check_int("sampling.seed", self.seed, minimum=INT64_MIN, maximum=INT64_MAX))
        stop: object = self.stop  # the annotation says tuple; a caller may still pass one string
        if isinstance(stop, str):
            raise ValueError("sampling.stop must be a sequence of strings, not one string")
        set_(self, "stop", tuple(check_text("sampling.stop", s) for s in self.stop))
        if any(not s for s in self.stop):
            raise ValueError("sampling.stop strings must not be empty")
        set_(
            self,
            "stop_token_ids",
            tuple(check_int("sampling.stop_token_ids", t, minimum=0) for t in self.stop_token_ids),
        )
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"sampling.ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = check_float(f"sampling.{name}", getattr(self, name))
            if not -2 <= value <= 2:
                raise ValueError(f"sampling.{name} must be in [-2, 2], got {value}")
            set_(self, name, value)
        set_(self, "repetition_penalty", check_float("sampling.repetition_penalty", self.repetition_penalty))
        if self.repetition_penalty <= 0:
            raise ValueError(f"sampling.repetition_penalty must be > 0, got {self.repetition_penalty}")
        set_(self, "logprobs", check_int("sampling.logprobs", self.logprobs, minimum=0))
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"sampling.extra must be a dict, got {type(self.extra).__name__}")
        set_(self, "extra", dict(self.extra))
        clash = sorted(set(self.extra) & _SAMPLING_FIELDS)
        if clash:
            raise ValueError(f"sampling.extra must not repeat a named field: {clash}; set the field itself")
        if self.extra:  # an empty one is JSON; a reader rebuilds a spec per seeded sample
            canonical_json(self.extra, what="sampling.extra")

    def with_seed(self, seed: int | None) -> SamplingSpec:
        """A copy with another seed (a resume may derive a fresh seed for the continuation)."""
        return dataclasses.replace(self, seed=seed)

    def unseeded_key(self) -> tuple[Any, ...]:
        """A hashable key equal for specs that differ at most in ``seed`` (for deduplication)."""
        extra = canonical_json(self.extra, what="sampling.extra", sort_keys=True) if self.extra else ""
        return (*(getattr(self, name) for name in _KEY_FIELDS), extra)

    @property
    def is_greedy(self) -> bool:
        """True when the temperature is so low that vLLM samples greedily."""
        return self.temperature < GREEDY_TEMPERATURE

    def to_json(self) -> dict[str, Any]:
        """A JSON-native dict of every field (``stop`` and ``stop_token_ids`` as lists)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["stop"] = list(self.stop)
        out["stop_token_ids"] = list(self.stop_token_ids)
        out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SamplingSpec:
        """Rebuild from :meth:`to_json`'s output; omitted keys take their defaults.

        Raises:
            ValueError: an unknown key (other fields belong in ``extra``) or a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"sampling parameters must be a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - _SAMPLING_FIELDS)
        if unknown:
            raise ValueError(f"unknown sampling parameters {unknown}; other vLLM fields belong in 'extra'")
        if "max_tokens" not in data:
            raise ValueError("sampling parameters lack 'max_tokens'")
        kwargs = dict(data)
        for name in ("stop", "stop_token_ids"):
            if name in kwargs:
                if not isinstance(kwargs[name], list):
                    raise ValueError(f"sampling.{name} must be a list, got {type(kwargs[name]).__name__}")
                kwargs[name] = tuple(kwargs[name])
        return cls(**kwargs)


_FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SamplingSpec))
_SAMPLING_FIELDS = frozenset(_FIELD_NAMES)
_KEY_FIELDS = tuple(name for name in _FIELD_NAMES if name not in ("seed", "extra"))
