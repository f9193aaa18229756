"""The in-memory model of a snapshot: what a trainer needs to lose nothing at resume.

A :class:`Snapshot` is one consistent cut taken at a checkpoint. It holds prompt *groups* (one
prompt x n samples, GRPO-style), the *samples* of each group with the tokens generated so far, the
data loader's cursor, fingerprints that guard the resume, and accounting counters.

These classes are plain data: the engine adapter builds them from live requests, the file format
(:mod:`partial_rollout.snapshot.writer` / :mod:`~partial_rollout.snapshot.reader`) stores them. Every
class validates itself on construction and raises :class:`ValueError` naming the field, so a bug in
the code that builds a snapshot is caught before anything is written.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from partial_rollout.snapshot import state_codec

FORMAT_NAME = "partial-rollout-snapshot"
"""Value of the ``format`` metadata key: tells our files apart from other safetensors files."""
FORMAT_VERSION = 1
"""Version of the on-disk layout this code writes and the only one it reads (docs/snapshot_format.md)."""
SNAPSHOT_FILENAME = "partial_rollouts.safetensors"
"""Name of the snapshot inside a checkpoint folder."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MAX = 2**31 - 1
GREEDY_TEMPERATURE = 1e-5
"""Temperatures below this sample greedily (vLLM's own threshold)."""


class GroupState(enum.StrEnum):
    """Where a prompt group is in its life."""

    PENDING = "pending"
    """Yielded by the data loader but not dispatched to an engine yet."""
    IN_FLIGHT = "in_flight"
    """Dispatched; at least one sample may still be generating or waiting for its reward."""
    READY = "ready"
    """Every sample finished: the group waits in the buffer to be trained on."""


class SampleState(enum.StrEnum):
    """Where one sample (one completion of a prompt) is in its life."""

    NOT_STARTED = "not_started"
    """No token generated yet (its group is pending, or the engine has not scheduled it)."""
    IN_FLIGHT = "in_flight"
    """Generation started and did not finish: the tokens so far are a prefix to continue."""
    FINISHED = "finished"
    """Generation ended (``finish_reason`` says why)."""


def canonical_json(value: Any, *, what: str, sort_keys: bool = False) -> str:
    """Encode ``value`` as compact JSON, refusing anything that would not come back equal.

    Tuples, non-string keys, NaN and infinities, and objects JSON does not know all change (or
    fail) on a round trip, so a snapshot refuses them up front instead of loading something other
    than what was saved.

    Args:
        value: the value to encode.
        what: the field's name, for the error message.
        sort_keys: sort object keys (used where equal values must encode identically).

    Raises:
        ValueError: ``value`` is not JSON-native, holds text that is not valid Unicode, or is nested
            too deeply for Python's JSON encoder.
    """
    native = f"{what} must be JSON-native (dict with str keys, list, str, int, float, bool, None)"
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=sort_keys, separators=(",", ":"))
        text.encode("utf-8")
        same = json.loads(text) == value
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{native}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply") from None
    if not same:
        raise ValueError(
            f"{native}: it changes on a JSON round trip (tuples become lists, non-str keys become str);"
            " convert it before building the snapshot"
        )
    return text


def _int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def _float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be finite, got {number}")
    return number


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} is not valid Unicode text: {exc}") from None
    return value


def _array(name: str, values: Any, dtype: type[np.generic]) -> np.ndarray:
    """A 1-D array of ``dtype`` from a list or array, refusing values that do not fit it."""
    if isinstance(values, np.ndarray) and values.dtype == dtype and values.ndim == 1 and values.flags.c_contiguous:
        return values
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=dtype)
    target = np.dtype(dtype)
    if target.kind == "i":
        if array.dtype.kind not in "iu":
            raise ValueError(f"{name} must hold integers, got {array.dtype}")
        info = np.iinfo(target)
        if array.min() < info.min or array.max() > info.max:
            raise ValueError(f"{name} must fit in {target} ({info.min}..{info.max})")
    elif array.dtype.kind not in "iuf":
        raise ValueError(f"{name} must hold numbers, got {array.dtype}")
    return np.ascontiguousarray(array, dtype=target)


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
        set_(self, "max_tokens", _int("sampling.max_tokens", self.max_tokens, minimum=1))
        set_(self, "temperature", _float("sampling.temperature", self.temperature))
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0, got {self.temperature}")
        set_(self, "top_p", _float("sampling.top_p", self.top_p))
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")
        set_(self, "top_k", _int("sampling.top_k", self.top_k, minimum=-1))
        set_(self, "min_p", _float("sampling.min_p", self.min_p))
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"sampling.min_p must be in [0, 1], got {self.min_p}")
        set_(self, "min_tokens", _int("sampling.min_tokens", self.min_tokens, minimum=0, maximum=self.max_tokens))
        if self.seed is not None:
            set_(self, "seed", _int("sampling.seed", self.seed, minimum=INT64_MIN, maximum=INT64_MAX))
        stop: object = self.stop  # the annotation says tuple; a caller may still pass one string
        if isinstance(stop, str):
            raise ValueError("sampling.stop must be a sequence of strings, not one string")
        set_(self, "stop", tuple(_text("sampling.stop", s) for s in self.stop))
        if any(not s for s in self.stop):
            raise ValueError("sampling.stop strings must not be empty")
        set_(self, "stop_token_ids", tuple(_int("sampling.stop_token_ids", t, minimum=0) for t in self.stop_token_ids))
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"sampling.ignore_eos must be a bool, got {self.ignore_eos!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _float(f"sampling.{name}", getattr(self, name))
            if not -2 <= value <= 2:
                raise ValueError(f"sampling.{name} must be in [-2, 2], got {value}")
            set_(self, name, value)
        set_(self, "repetition_penalty", _float("sampling.repetition_penalty", self.repetition_penalty))
        if self.repetition_penalty <= 0:
            raise ValueError(f"sampling.repetition_penalty must be > 0, got {self.repetition_penalty}")
        set_(self, "logprobs", _int("sampling.logprobs", self.logprobs, minimum=0))
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"sampling.extra must be a dict, got {type(self.extra).__name__}")
        set_(self, "extra", dict(self.extra))
        clash = sorted(set(self.extra) & _SAMPLING_FIELDS)
        if clash:
            raise ValueError(f"sampling.extra must not repeat a named field: {clash}; set the field itself")
        canonical_json(self.extra, what="sampling.extra")

    def with_seed(self, seed: int | None) -> SamplingSpec:
        """A copy with another seed (a resume may derive a fresh seed for the continuation)."""
        if seed is not None:
            seed = _int("sampling.seed", seed, minimum=INT64_MIN, maximum=INT64_MAX)
        clone = object.__new__(SamplingSpec)  # every other field is already valid: skip __post_init__
        for name in _FIELD_NAMES:
            object.__setattr__(clone, name, getattr(self, name))
        object.__setattr__(clone, "seed", seed)
        object.__setattr__(clone, "extra", dict(self.extra))
        return clone

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


@dataclass(kw_only=True, slots=True, eq=False)
class SampleRecord:
    """One completion of a group's prompt: the tokens generated so far and how to continue them.

    ``token_ids``, ``logprobs`` and ``versions`` are parallel: entry ``i`` is the ``i``-th generated
    token, the log-probability the behaviour policy gave it, and the policy version that sampled it.
    Lists are accepted and converted to arrays of the stored dtypes.
    """

    index: int
    """Position of this sample within its group (0..n-1)."""
    state: SampleState
    """Not started, in flight, or finished."""
    sampling: SamplingSpec
    """Sampling parameters of the whole completion (the seed among them)."""
    token_ids: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    """int32 [K]: the generated tokens so far (the prefix to continue from)."""
    logprobs: np.ndarray = field(default_factory=lambda: np.empty(0, np.float32))
    """float32 [K]: behaviour log-probability of each sampled token (finite, <= 0)."""
    versions: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    """int32 [K]: policy version that produced each token (changes when weights update mid-flight)."""
    finish_reason: str | None = None
    """Why generation ended (``"stop"``, ``"length"``, ``"abort"``, ...); set exactly when finished."""
    stop_reason: int | str | None = None
    """The stop string or token id that ended it, when that is how it ended (vLLM ``stop_reason``)."""
    reward: float | None = None
    """The score, once the finished sample has been rewarded."""
    sampler_state: bytes | None = None
    """Opaque sampler (RNG) state for an exact continuation, e.g. a torch generator's state."""
    inexact: str | None = None
    """Why a continuation cannot reproduce an uninterrupted run, when it cannot."""

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def unchecked(
        cls,
        *,
        index: int,
        state: SampleState,
        sampling: SamplingSpec,
        token_ids: np.ndarray,
        logprobs: np.ndarray,
        versions: np.ndarray,
        sampler_state: bytes | None = None,
        inexact: str | None = None,
    ) -> SampleRecord:
        """An unfinished record built without :meth:`validate`, for the engine adapter's cut.

        The cut builds one record per live request while the engine stands still, and the checks
        read every token: at 10,000 requests x 2,000 tokens they took 0.074 s of CPU, against
        0.09 s for building the records (``benchmarks/snapshot_io.py --cut-only``). The caller
        passes fields in their stored form (1-D int32 / float32 / int32 arrays of one length, bytes
        or None). The checks are not skipped but moved after the engine resumes:
        :func:`~partial_rollout.snapshot.save_snapshot` validates every sample before it writes a
        byte (records unpickled from a Ray engine actor, which skip construction, are checked there
        too).
        """
        record = object.__new__(cls)
        record.index, record.state, record.sampling = index, state, sampling
        record.token_ids, record.logprobs, record.versions = token_ids, logprobs, versions
        record.finish_reason, record.stop_reason, record.reward = None, None, None
        record.sampler_state, record.inexact = sampler_state, inexact
        return record

    def validate(self) -> None:
        """Check every field and convert lists to arrays of the stored dtypes (what construction does).

        Raises:
            ValueError: naming the field and the offending value.
        """
        self.index = _int("index", self.index, minimum=0)
        self.state = SampleState(self.state)
        if not isinstance(self.sampling, SamplingSpec):
            raise ValueError(f"sampling must be a SamplingSpec, got {type(self.sampling).__name__}")
        self.token_ids = _array("token_ids", self.token_ids, np.int32)
        self.logprobs = _array("logprobs", self.logprobs, np.float32)
        self.versions = _array("versions", self.versions, np.int32)
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"token_ids, logprobs and versions must have equal lengths, got {n}, {len(self.logprobs)},"
                f" {len(self.versions)}"
            )
        if n > self.sampling.max_tokens:
            raise ValueError(f"{n} tokens exceed sampling.max_tokens {self.sampling.max_tokens}")
        if n:
            if self.token_ids.min() < 0:
                raise ValueError(f"token_ids must be >= 0, got {self.token_ids.min()}")
            if not (np.isfinite(self.logprobs.min()) and self.logprobs.max() <= 0):  # NaN fails both
                i = int(np.flatnonzero(~(np.isfinite(self.logprobs) & (self.logprobs <= 0)))[0])
                raise ValueError(f"logprobs must be finite and <= 0, got {self.logprobs[i]} at position {i}")
            if self.versions.min() < 0:
                raise ValueError(f"versions must be >= 0, got {self.versions.min()}")
        if self.finish_reason is not None:
            self.finish_reason = _text("finish_reason", self.finish_reason)
        if isinstance(self.stop_reason, str):
            _text("stop_reason", self.stop_reason)
        elif self.stop_reason is not None:
            self.stop_reason = _int("stop_reason", self.stop_reason)
        if self.reward is not None:
            self.reward = _float("reward", self.reward)
        if self.sampler_state is not None:
            if not isinstance(self.sampler_state, (bytes, bytearray, memoryview)):
                raise ValueError(f"sampler_state must be bytes or None, got {type(self.sampler_state).__name__}")
            self.sampler_state = bytes(self.sampler_state)
            if not self.sampler_state:
                raise ValueError("sampler_state must not be empty; use None when there is none")
        if self.inexact is not None:
            self.inexact = _text("inexact", self.inexact)
            if not self.inexact:
                raise ValueError("inexact must be a non-empty reason or None")
        self._check_state()

    def _check_state(self) -> None:
        if self.state is SampleState.FINISHED:
            if not self.finish_reason:
                raise ValueError("a finished sample needs a finish_reason")
            return
        for name in ("finish_reason", "stop_reason", "reward"):
            if getattr(self, name) is not None:
                raise ValueError(f"{name} must be None while the sample is {self.state.value}")
        if self.state is SampleState.NOT_STARTED and len(self.token_ids):
            raise ValueError(f"a not_started sample has no tokens, got {len(self.token_ids)}")

    @property
    def num_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self.token_ids)

    @property
    def remaining_tokens(self) -> int:
        """What is left of the budget: ``sampling.max_tokens`` minus the prefix."""
        return self.sampling.max_tokens - len(self.token_ids)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleRecord):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))


@dataclass(kw_only=True, slots=True, eq=False)
class GroupRecord:
    """One prompt and its n samples (GRPO's unit of training)."""

    group_id: str
    """Stable id, unique within a snapshot (a resume uses it to match the loader's bookkeeping)."""
    prompt_token_ids: np.ndarray
    """int32 [P]: the prompt, stored once for all samples."""
    data: dict[str, Any] = field(default_factory=dict)
    """JSON-native payload needed to re-dispatch and score the prompt (task name, ground truth, ...)."""
    state: GroupState
    """Pending, in flight, or ready."""
    dispatch_version: int = -1
    """Policy version when the group was dispatched; -1 while pending."""
    samples: list[SampleRecord]
    """The samples, in index order."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field, and the samples' states against the group's (what construction does).

        Raises:
            ValueError: naming the field and the offending value.
        """
        self.group_id = _text("group_id", self.group_id)
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        self.prompt_token_ids = _array("prompt_token_ids", self.prompt_token_ids, np.int32)
        if not len(self.prompt_token_ids):
            raise ValueError("prompt_token_ids must not be empty (engines refuse empty prompts)")
        if self.prompt_token_ids.min() < 0:
            raise ValueError(f"prompt_token_ids must be >= 0, got {self.prompt_token_ids.min()}")
        if not isinstance(self.data, dict):
            raise ValueError(f"data must be a dict, got {type(self.data).__name__}")
        canonical_json(self.data, what="data")
        self.state = GroupState(self.state)
        self.dispatch_version = _int("dispatch_version", self.dispatch_version, minimum=-1, maximum=INT64_MAX)
        self.samples = list(self.samples)
        if not self.samples:
            raise ValueError("a group needs at least one sample (they carry the sampling parameters)")
        for position, sample in enumerate(self.samples):
            if not isinstance(sample, SampleRecord):
                raise ValueError(f"samples[{position}] must be a SampleRecord, got {type(sample).__name__}")
            if sample.index != position:
                raise ValueError(f"samples[{position}] has index {sample.index}; samples must be in index order 0..n-1")
        self.check_states()

    def check_states(self) -> None:
        """Check the group's state against its dispatch version and its samples' states.

        A ledger changes these after construction, so the writer checks them again; the other
        fields it checks only once, here.

        Raises:
            ValueError: naming what disagrees.
        """
        if self.state is GroupState.PENDING:
            if self.dispatch_version != -1:
                raise ValueError(f"a pending group has dispatch_version -1, got {self.dispatch_version}")
            if any(s.state is not SampleState.NOT_STARTED for s in self.samples):
                raise ValueError("every sample of a pending group must be not_started")
        elif self.dispatch_version < 0:
            raise ValueError(f"a dispatched ({self.state.value}) group needs dispatch_version >= 0")
        if self.state is GroupState.READY and any(s.state is not SampleState.FINISHED for s in self.samples):
            raise ValueError("every sample of a ready group must be finished")

    @property
    def is_partial(self) -> bool:
        """True when some samples finished and some did not (a resume continues only the others)."""
        finished = sum(s.state is SampleState.FINISHED for s in self.samples)
        return 0 < finished < len(self.samples)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GroupRecord):
            return NotImplemented
        return all(_equal(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))


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
    """Kind of the per-request sampler generator whose state in-flight samples carry, e.g.
    ``torch.Generator(cpu)`` (a CPU MT19937) or ``torch.Generator(cuda)`` (Philox seed + offset).
    Compared: a state of one kind cannot seed the other."""
    sampler_state_bytes: int | None = None
    """Size of one such state in bytes (5056 for the CPU generator). Compared with ``sampler``."""
    max_model_len: int | None = None
    """The engine's longest prompt + completion at save time. Informational, never compared: a
    resume under a smaller limit finishes the prefixes that no longer fit as length-truncated."""
    extra: dict[str, str] = field(default_factory=dict)
    """Further identities a trainer wants checked on resume (compared like the fields above)."""

    COMPARED = ("model", "tokenizer", "vocab_size", "vllm_version", "logprobs_kind", "sampler", "sampler_state_bytes")
    """Fields :meth:`mismatches` compares, besides every key of ``extra``."""

    def __post_init__(self) -> None:
        for name in ("model", "tokenizer", "vllm_version", "model_path"):
            setattr(self, name, _text(f"fingerprints.{name}", getattr(self, name)))
        self.vocab_size = _int("fingerprints.vocab_size", self.vocab_size, minimum=1, maximum=INT32_MAX + 1)
        for name in ("logprobs_kind", "sampler"):
            if getattr(self, name) is not None:
                setattr(self, name, _text(f"fingerprints.{name}", getattr(self, name)))
        for name in ("sampler_state_bytes", "max_model_len"):
            if getattr(self, name) is not None:
                setattr(self, name, _int(f"fingerprints.{name}", getattr(self, name), minimum=1, maximum=INT64_MAX))
        if not isinstance(self.extra, Mapping):
            raise ValueError(f"fingerprints.extra must be a dict, got {type(self.extra).__name__}")
        self.extra = {
            _text("fingerprints.extra key", k): _text(f"fingerprints.extra[{k!r}]", v) for k, v in self.extra.items()
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


@dataclass(kw_only=True, slots=True, eq=False)
class Snapshot:
    """Everything a trainer needs to resume without losing a prompt or a generated token."""

    trainer_step: int
    """Training step of the checkpoint this snapshot belongs to."""
    policy_version: int
    """Policy version at save time; no token was generated by a newer one."""
    fingerprints: Fingerprints
    """Identities a resume must match."""
    groups: list[GroupRecord] = field(default_factory=list)
    """Every prompt group the trainer had handed out and not consumed."""
    loader_state: dict[str, Any] | None = None
    """The data loader's cursor, e.g. ``StatefulDataLoader.state_dict()`` (tensors allowed, no pickle)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Accounting, e.g. prompts ``yielded``, ``consumed`` by training, ``evicted``."""
    evicted_by_reason: dict[str, int] = field(default_factory=dict)
    """Prompts evicted on purpose, by reason (e.g. ``too_stale``)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """JSON-native extras of the trainer (run name, config hash, ...)."""

    def __post_init__(self) -> None:
        self.trainer_step = _int("trainer_step", self.trainer_step, minimum=0, maximum=INT64_MAX)
        self.policy_version = _int("policy_version", self.policy_version, minimum=0, maximum=INT32_MAX)
        if not isinstance(self.fingerprints, Fingerprints):
            raise ValueError(f"fingerprints must be a Fingerprints, got {type(self.fingerprints).__name__}")
        self.groups = list(self.groups)
        seen: set[str] = set()
        for position, group in enumerate(self.groups):
            if not isinstance(group, GroupRecord):
                raise ValueError(f"groups[{position}] must be a GroupRecord, got {type(group).__name__}")
            if group.group_id in seen:
                raise ValueError(f"group_id {group.group_id!r} appears twice; group ids must be unique")
            seen.add(group.group_id)
            check_group(group, vocab_size=self.fingerprints.vocab_size, policy_version=self.policy_version)
        if self.loader_state is not None:
            if not isinstance(self.loader_state, dict):
                raise ValueError(f"loader_state must be a dict or None, got {type(self.loader_state).__name__}")
            state_codec.encode(self.loader_state)
        self.counters = _counts("counters", self.counters)
        self.evicted_by_reason = _counts("evicted_by_reason", self.evicted_by_reason)
        if not isinstance(self.metadata, dict):
            raise ValueError(f"metadata must be a dict, got {type(self.metadata).__name__}")
        canonical_json(self.metadata, what="metadata")

    def iter_groups(self, *states: GroupState) -> Iterator[GroupRecord]:
        """The groups in any of ``states`` (all groups when none is given)."""
        return (g for g in self.groups if not states or g.state in states)

    def iter_samples(self, *states: SampleState) -> Iterator[tuple[GroupRecord, SampleRecord]]:
        """``(group, sample)`` for the samples in any of ``states`` (all when none is given).

        ``snapshot.iter_samples(SampleState.IN_FLIGHT)`` is what a resume re-submits.
        """
        return ((g, s) for g in self.groups for s in g.samples if not states or s.state in states)

    def counts(self) -> dict[str, int]:
        """Groups per state, samples per state, partial groups and tokens, for logs and the dump."""
        out = {f"groups_{state.value}": 0 for state in GroupState}
        out.update({f"samples_{state.value}": 0 for state in SampleState})
        out.update(groups_partial=0, tokens=0, tokens_in_flight=0)
        for group in self.groups:
            out[f"groups_{group.state.value}"] += 1
            out["groups_partial"] += group.is_partial
            for sample in group.samples:
                out[f"samples_{sample.state.value}"] += 1
                out["tokens"] += sample.num_tokens
                if sample.state is SampleState.IN_FLIGHT:
                    out["tokens_in_flight"] += sample.num_tokens
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Snapshot):
            return NotImplemented
        return all(
            state_codec.states_equal(getattr(self, f.name), getattr(other, f.name))
            if f.name == "loader_state"
            else _equal(getattr(self, f.name), getattr(other, f.name))
            for f in dataclasses.fields(self)
        )


def check_group(group: GroupRecord, *, vocab_size: int, policy_version: int) -> None:
    """Check what a group cannot check alone: token ids against the vocabulary, versions against the policy.

    Raises:
        ValueError: naming the group, the sample and the offending value.
    """
    where = f"group {group.group_id!r}"
    vocab = f"fingerprints.vocab_size {vocab_size}"
    if group.prompt_token_ids.max() >= vocab_size:
        raise ValueError(f"{where}: prompt token id {group.prompt_token_ids.max()} >= {vocab}")
    if group.dispatch_version > policy_version:
        raise ValueError(f"{where}: dispatch_version {group.dispatch_version} > policy_version {policy_version}")
    for sample in group.samples:
        if not sample.num_tokens:
            continue
        if sample.token_ids.max() >= vocab_size:
            raise ValueError(f"{where} sample {sample.index}: token id {sample.token_ids.max()} >= {vocab}")
        if sample.versions.max() > policy_version:
            version = sample.versions.max()
            raise ValueError(f"{where} sample {sample.index}: version {version} > policy_version {policy_version}")


def _counts(name: str, value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a dict of str to int, got {type(value).__name__}")
    return {_text(f"{name} key", k): _int(f"{name}[{k!r}]", v, minimum=0) for k, v in value.items()}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
