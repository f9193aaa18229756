"""The version guard: can this vLLM build capture and restore sampler state?

The capture reaches vLLM internals (the model runner's per-request generators, the output
processor's request states). They were read and tested on the versions listed here; on any other
version, or a runner without them, the adapter degrades explicitly (seeded samples are recorded as
``inexact`` with this module's reason) or refuses to start when exactness is required.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TESTED_VLLM_VERSIONS = ("0.32.0",)
"""vLLM releases whose internals the sampler-state capture was tested against."""


@dataclass(frozen=True, kw_only=True)
class CaptureSupport:
    """What the running engine lets the adapter capture."""

    sampler_state: bool
    """Whether per-request generator states can be captured and restored."""
    reason: str | None
    """Why not, when they cannot."""
    vllm_version: str
    runner: str


def check_support(vllm_version: str, worker_reports: Sequence[dict[str, Any]], llm: Any) -> CaptureSupport:
    base = vllm_version.split("+")[0]
    runners = sorted({str(r.get("runner")) for r in worker_reports})
    runner = ",".join(runners)
    reason = None
    failed = [r for r in worker_reports if not r.get("ok")]
    if failed:
        reason = f"vLLM {vllm_version} worker: {failed[0].get('reason')}"
    elif base not in TESTED_VLLM_VERSIONS:
        reason = f"vLLM {vllm_version} is not among the versions the capture was tested with {TESTED_VLLM_VERSIONS}"
    elif not hasattr(getattr(llm, "output_processor", None), "request_states"):
        reason = f"vLLM {vllm_version} AsyncLLM has no output_processor.request_states"
    return CaptureSupport(sampler_state=reason is None, reason=reason, vllm_version=vllm_version, runner=runner)
