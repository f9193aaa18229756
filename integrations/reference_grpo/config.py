"""The trainer's configuration: NeMo RL-style YAML, Hydra-style overrides, checked dataclasses.

Keys mirror NeMo RL's SingleController (``grpo.*``, ``async_rl.*`` with a windowed sampler,
``checkpointing.*``, ``policy.*``, ``loss_fn.*``) so its users recognise every knob; the one new
block is ``checkpointing.partial_rollouts``. Overrides follow NeMo RL's struct mode:
``key=value`` changes a key the YAML has, ``++key=value`` sets a key of the schema the YAML left
out, and any key the schema does not know is refused, naming the closest known keys. Everything is
checked at start, so a bad value fails with one :class:`~partial_rollout.errors.ConfigError` line
before an engine starts.
"""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import yaml
from omegaconf import OmegaConf

from partial_rollout.checkpoint import OnStale
from partial_rollout.errors import ConfigError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

CONFIG_DIR = Path(__file__).parent / "configs"
"""Where the shipped configs live (``demo.yaml``, ``fast.yaml``)."""


@dataclass(kw_only=True, slots=True)
class GRPOConfig:
    num_prompts_per_step: int = 2
    """Prompt groups per training step; also the data loader's batch size."""
    num_generations_per_prompt: int = 8
    """Samples per prompt (the group GRPO normalises over)."""
    max_num_steps: int = 40
    """Training steps of the whole run."""
    max_num_epochs: int = 1
    """Passes over the data set."""
    seed: int = 0
    """Seed of data order, sampling and initialisation."""

    def __post_init__(self) -> None:
        _positive(self, "grpo", "num_prompts_per_step", "num_generations_per_prompt", "max_num_steps", "max_num_epochs")
        if self.num_generations_per_prompt < 2:
            raise ConfigError(
                "must be >= 2: GRPO normalises rewards within a group", field="grpo.num_generations_per_prompt"
            )


@dataclass(kw_only=True, slots=True)
class SamplerConfig:
    name: Literal["windowed"] = "windowed"
    """NeMo RL's windowed sampler: train on ready groups whose dispatch version is within the window."""
    max_staleness_versions: int = 2
    """Groups dispatched more than this many policy versions ago are evicted (on purpose, counted)."""

    def __post_init__(self) -> None:
        _non_negative(self, "async_rl.sampler", "max_staleness_versions")


@dataclass(kw_only=True, slots=True)
class AsyncRLConfig:
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    max_inflight_prompts: int = 4
    """Prompt groups generating at once (the rollout pump's in-flight permits)."""
    max_buffered_rollouts: int = 8
    """Prompt groups dispatched and not yet trained or evicted (the replay buffer's capacity permits)."""

    def __post_init__(self) -> None:
        _positive(self, "async_rl", "max_inflight_prompts", "max_buffered_rollouts")


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ConfigError(f"must be > 0, got {self.lr}", field="policy.optimizer.lr")
        _non_negative(self, "policy.optimizer", "weight_decay")


@dataclass(kw_only=True, slots=True)
class PolicyConfig:
    model_name: str | None = None
    """A Hugging Face-format model folder; ``null`` builds the tiny Llama of :mod:`partial_rollout.models.tiny`."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    max_grad_norm: float = 1.0
    """Gradient clipping norm."""

    def __post_init__(self) -> None:
        if self.model_name is not None and not (Path(self.model_name) / "config.json").is_file():
            raise ConfigError(
                "no config.json in this folder",
                path=self.model_name,
                field="policy.model_name",
                fix="Point to a local Hugging Face-format model folder, or null for the tiny model",
            )
        if not self.max_grad_norm > 0:
            raise ConfigError(f"must be > 0, got {self.max_grad_norm}", field="policy.max_grad_norm")


@dataclass(kw_only=True, slots=True)
class LossConfig:
    ratio_clip_min: float = 0.2
    """PPO clip below 1: the ratio is clipped to ``[1 - ratio_clip_min, 1 + ratio_clip_max]``."""
    ratio_clip_max: float = 0.2

    def __post_init__(self) -> None:
        _non_negative(self, "loss_fn", "ratio_clip_min", "ratio_clip_max")
        if self.ratio_clip_min >= 1:
            raise ConfigError(f"must be < 1, got {self.ratio_clip_min}", field="loss_fn.ratio_clip_min")


@dataclass(kw_only=True, slots=True)
class GenerationConfig:
    temperature: float = 1.0
    max_model_len: int = 1024
    max_num_seqs: int = 64
    kv_cache_memory_bytes: int = 128 * 2**20
    multiprocessing: bool = False
    """vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING``: off runs the model worker inside the engine-core process
    instead of one more process (cheaper on CPU). The engine core itself always has its own process."""
    num_engines: int = 1
    """vLLM engines: 1 runs in the trainer's process; more run as Ray actors, on the cluster ``ray.address``
    names or a local one (on CPU each pinned to its own group of cores, on a GPU cluster each on its own
    GPU). May change between a save and its resume: restored requests spread over the new engines."""
    min_engines: int = 1
    """With ``num_engines`` > 1: the fewest engines the run starts with. An engine that dies while
    starting leaves a smaller pool (a warning and a failover event name it); below this many the run
    stops at once, naming each engine that did not start and why."""

    def __post_init__(self) -> None:
        _positive(
            self, "generation", "max_model_len", "max_num_seqs", "kv_cache_memory_bytes", "num_engines", "min_engines"
        )
        if self.temperature < 0:
            raise ConfigError(f"must be >= 0, got {self.temperature}", field="generation.temperature")
        if self.min_engines > self.num_engines:
            raise ConfigError(
                f"must be at most generation.num_engines ({self.num_engines}), got {self.min_engines}",
                field="generation.min_engines",
            )


@dataclass(kw_only=True, slots=True)
class RayConfig:
    address: str | None = None
    """The Ray cluster the engines join when ``generation.num_engines`` > 1: ``host:port`` of its head
    (what ``ray start --head`` printed), ``ray://host:port`` (Ray Client) or ``auto`` (a cluster running on
    this machine). ``null``: the ``RAY_ADDRESS`` variable's cluster if set, else a new local cluster."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    num_prompts: int = 4096
    """Size of the generated data set."""
    shuffle: bool = True
    num_buckets: int = 4
    """The task: the prompt names a residue class b; reward = share of the first tokens t with t % num_buckets == b."""
    reward_tokens: int = 4
    """How many leading generated tokens the reward scores."""
    min_tokens: int = 16
    """Shortest completion budget; budgets follow a Pareto tail from here."""
    max_tokens: int = 256
    """Longest completion budget (the tail is cut here)."""
    length_tail_alpha: float = 1.0
    """Pareto shape of the budgets: smaller means a longer tail."""

    def __post_init__(self) -> None:
        _positive(self, "data", "num_prompts", "num_buckets", "reward_tokens", "min_tokens", "max_tokens")
        if self.min_tokens > self.max_tokens:
            raise ConfigError(f"min_tokens {self.min_tokens} > max_tokens {self.max_tokens}", field="data.min_tokens")
        if self.reward_tokens > self.min_tokens:
            raise ConfigError(
                f"reward_tokens {self.reward_tokens} > min_tokens {self.min_tokens}: "
                "some completions would be too short to score",
                field="data.reward_tokens",
            )
        if not self.length_tail_alpha > 0:
            raise ConfigError(f"must be > 0, got {self.length_tail_alpha}", field="data.length_tail_alpha")


@dataclass(kw_only=True, slots=True)
class PartialRolloutsConfig:
    enabled: bool = True
    """On: save one consistent cut of all outstanding work and resume it. Off: NeMo RL's semantics
    (live loader cursor + ready groups only; in-flight and undispatched prompts are lost)."""
    on_stale: OnStale = "continue"
    """Restored work dispatched more than ``max_staleness_versions`` ago: continue it anyway (the
    sampler may evict it later), regenerate it from scratch, or drop it (evicted, reason
    ``stale_at_resume``)."""
    allow_vllm_change: bool = False
    """Resume a checkpoint written under another vLLM version: its in-flight samples continue
    without their sampler states, declared inexact. Off, such a resume fails naming both versions."""


@dataclass(kw_only=True, slots=True)
class CheckpointingConfig:
    enabled: bool = True
    checkpoint_dir: str = "runs/reference_grpo/checkpoints"
    save_period: int = 4
    """Save every this many training steps (and at the last step)."""
    partial_rollouts: PartialRolloutsConfig = field(default_factory=PartialRolloutsConfig)

    def __post_init__(self) -> None:
        if self.save_period <= 0:
            raise ConfigError(
                f"must be a positive number of steps, got {self.save_period}", field="checkpointing.save_period"
            )


@dataclass(kw_only=True, slots=True)
class LoggerConfig:
    log_dir: str = "runs/reference_grpo/logs"
    """Holds ``events.jsonl`` (the work ledger's raw log) and the engine's weight exports."""


@dataclass(kw_only=True, slots=True)
class MasterConfig:
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    async_rl: AsyncRLConfig = field(default_factory=AsyncRLConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    loss_fn: LossConfig = field(default_factory=LossConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpointing: CheckpointingConfig = field(default_factory=CheckpointingConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        if self.async_rl.max_buffered_rollouts < self.grpo.num_prompts_per_step:
            raise ConfigError(
                f"{self.async_rl.max_buffered_rollouts} < grpo.num_prompts_per_step {self.grpo.num_prompts_per_step}:"
                " a training step could never gather its groups",
                field="async_rl.max_buffered_rollouts",
            )
        needed = self.data.max_tokens + 8
        if self.generation.max_model_len < needed:
            raise ConfigError(
                f"{self.generation.max_model_len} cannot hold a prompt plus data.max_tokens={self.data.max_tokens}",
                field="generation.max_model_len",
                fix=f"Set it to at least {needed}",
            )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(path: str | os.PathLike[str], overrides: typing.Sequence[str] = ()) -> MasterConfig:
    """Load a YAML config, apply ``key=value`` / ``++key=value`` overrides, and check it all.

    Raises:
        ConfigError: an unreadable file, a malformed override, an unknown key, or a bad value.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError("no such config file", path=path)
    try:
        cfg = OmegaConf.load(path)
    except (yaml.YAMLError, ValueError) as exc:
        raise ConfigError(f"not valid YAML: {exc}", path=path) from None
    for item in overrides:
        _apply_override(cfg, item)
    data = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a mapping", path=path)
    return _build(MasterConfig, data, prefix="")


def _apply_override(cfg: Any, item: str) -> None:
    add = item.startswith("++")
    text = item[2:] if add else item
    if "=" not in text or text.startswith(("+", "~")):
        raise ConfigError(f"override {item!r} is not key=value or ++key=value", fix="Write e.g. grpo.max_num_steps=10")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw else None
    if not add and OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
        raise ConfigError(
            f"override {item!r}: the config has no key {key!r}",
            fix=f"Use ++{key}={raw} to add a key the YAML leaves at its default",
        )
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


_ABSENT = object()
_Config = TypeVar("_Config", bound="DataclassInstance")


def _build(cls: type[_Config], data: Any, *, prefix: str) -> _Config:
    """Build dataclass ``cls`` from nested dicts, refusing unknown keys and values of the wrong type."""
    where = prefix or "the top level"
    if not isinstance(data, dict):
        raise ConfigError(f"must be a mapping, got {data!r}", field=prefix or None)
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"unknown key {key!r}; {where} has {sorted(names)}", field=key)
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _convert(hints[name], value, key)
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str) -> Any:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, prefix=key)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"must be one of {list(args)}, got {value!r}", field=key)
        return value
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"must be true or false, got {value!r}", field=key)
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"must be an integer, got {value!r}", field=key)
    elif hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"must be a number, got {value!r}", field=key)
        value = float(value)
    elif hint is str and not isinstance(value, str):
        raise ConfigError(f"must be a string, got {value!r}", field=key)
    return value


def _positive(obj: Any, section: str, *names: str) -> None:
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"must be positive, got {getattr(obj, name)}", field=f"{section}.{name}")


def _non_negative(obj: Any, section: str, *names: str) -> None:
    for name in names:
        if getattr(obj, name) < 0:
            raise ConfigError(f"must be >= 0, got {getattr(obj, name)}", field=f"{section}.{name}")
