"""The GPU path (:mod:`partial_rollout_integrations.nemo_rl.gpu`) against the tested NeMo RL commit, without a GPU.

Nothing here starts an engine: NeMo RL's GPU worker cannot run on this machine, so these tests check
what can be checked from NeMo RL's code alone, in NeMo RL's controller environment: the worker
subclass imports; NeMo RL's own worker-class resolution (``vllm_generation.resolve_generation_worker_cls``,
which ``VllmGeneration`` calls) returns our worker with the flag on and NeMo RL's worker with it off,
and the worker's Python environment is registered; every NeMo RL method the subclass overrides keeps
NeMo RL's signature (a changed one would break ``VllmGeneration``'s calls on a GPU, where no CI
runs). Whether the path works on a GPU is ``scripts/gpu_check_nemo_rl.sh``'s job; it has not run.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import nemo_rl_harness as harness
import pytest

pytestmark = harness.needs_nemo_rl

FACTS = """
import importlib, inspect, json
from nemo_rl.distributed import ray_actor_environment_registry as registry
from nemo_rl.models.generation.vllm import vllm_generation
from nemo_rl.models.generation.vllm.vllm_worker_async import VllmAsyncGenerationWorkerImpl
from partial_rollout_integrations.nemo_rl import gpu
from partial_rollout_integrations.nemo_rl.config import PartialRolloutsConfig

def resolve(default, cfg):
    try:
        return vllm_generation.resolve_generation_worker_cls(default, cfg)
    except Exception as e:
        return f"{type(e).__name__}: {e}"

ASYNC = gpu.NEMO_ASYNC_WORKER
SYNC = "nemo_rl.models.generation.vllm.vllm_worker.VllmGenerationWorker"
facts = {"off": {}, "on": {}, "after": {}}
facts["off"]["installed"] = gpu.install_worker_resolution(PartialRolloutsConfig(enabled=False, record_events=True))
facts["off"]["async"] = resolve(ASYNC, {"quant_cfg": None})
facts["on"]["installed"] = gpu.install_worker_resolution(PartialRolloutsConfig(enabled=True))
facts["on"]["async"] = resolve(ASYNC, {"quant_cfg": None})
facts["on"]["sync"] = resolve(SYNC, {"quant_cfg": None})
facts["on"]["quant"] = resolve(ASYNC, {"quant_cfg": "q.yaml"})
facts["on"]["registry"] = registry.get_actor_python_env(gpu.WORKER)
facts["on"]["nemo_registry"] = registry.get_actor_python_env(ASYNC)
facts["on"]["same_signature"] = str(inspect.signature(vllm_generation.resolve_generation_worker_cls)) == str(
    inspect.signature(vllm_generation.resolve_generation_worker_cls.__wrapped__))
gpu.uninstall_worker_resolution()
facts["after"]["async"] = resolve(ASYNC, {"quant_cfg": None})

worker = gpu.PartialRolloutVllmWorker.__ray_metadata__.modified_class
facts["worker_mro"] = [c.__name__ for c in worker.__mro__]
module, name = gpu.WORKER.rsplit(".", 1)
facts["resolved_class"] = getattr(importlib.import_module(module), name) is gpu.PartialRolloutVllmWorker
overrides = {}
for name, member in vars(gpu.PartialRolloutVllmWorkerImpl).items():
    nemo = getattr(VllmAsyncGenerationWorkerImpl, name, None)
    if callable(member) and nemo is not None and not name.startswith("__"):
        params = lambda f: [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(f).parameters.values()]
        overrides[name] = [params(member), params(nemo),
                           inspect.iscoroutinefunction(member), inspect.iscoroutinefunction(nemo)]
facts["overrides"] = overrides
ours = vars(gpu.PartialRolloutVllmWorkerImpl).items()
facts["new_methods"] = sorted(
    n for n, m in ours if callable(m) and not n.startswith("_") and not hasattr(VllmAsyncGenerationWorkerImpl, n))
try:
    gpu.WorkerExtension
    facts["extension"] = "built"
except ImportError as e:
    facts["extension"] = f"ImportError: {e}"[:120]
print(json.dumps(facts))
"""


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of :data:`FACTS` in the controller environment (NeMo RL imports take a while here)."""
    src = harness.nemo_rl_src()
    result = subprocess.run(
        [str(harness.controller_python()), "-c", FACTS],
        env=harness.controller_env([src]),
        cwd=tmp_path_factory.mktemp("gpu_path"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    parsed: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return parsed


def test_flag_on_resolves_our_worker_and_flag_off_leaves_nemo_rls(facts: dict[str, Any]) -> None:
    from_nemo = "nemo_rl.models.generation.vllm.vllm_worker_async.VllmAsyncGenerationWorker"
    ours = "partial_rollout_integrations.nemo_rl.gpu.PartialRolloutVllmWorker"
    assert facts["off"] == {"installed": False, "async": from_nemo}
    assert facts["on"]["installed"] is True
    assert facts["on"]["async"] == ours
    assert facts["resolved_class"] is True  # the name resolves to the Ray actor class VllmGeneration builds
    assert facts["on"]["same_signature"] is True
    # The worker runs in the same Python environment as NeMo RL's async vLLM worker.
    assert facts["on"]["registry"] == facts["on"]["nemo_registry"]
    # Configurations the worker does not cover fail at set-up, naming the field.
    assert "ConfigError" in facts["on"]["sync"] and "vllm_cfg.async_engine" in facts["on"]["sync"]
    assert "ConfigError" in facts["on"]["quant"] and "quant_cfg" in facts["on"]["quant"]
    assert facts["after"]["async"] == from_nemo


def test_worker_subclasses_nemo_rls_and_keeps_every_overridden_signature(facts: dict[str, Any]) -> None:
    mro = facts["worker_mro"]  # Ray's actor class subclasses ours under the same name
    assert mro[0] == "PartialRolloutVllmWorker"
    impl = mro.index("PartialRolloutVllmWorkerImpl")
    assert mro[impl + 1] == "VllmAsyncGenerationWorkerImpl"
    overrides = facts["overrides"]
    assert set(overrides) == {
        "_create_engine",
        "post_init_async",
        "update_weights_from_collective_async",
        "update_weights_via_ipc_zmq_async",
        "nccl_reshard_refit_async",
    }
    for name, (ours, nemo, ours_async, nemo_async) in overrides.items():
        assert ours_async == nemo_async, name
        # Names, kinds and defaults of the parameters (annotations differ in spelling only).
        assert ours == nemo, f"{name}: ours {ours}, NeMo RL's {nemo}"
    # The Ray methods the controller's WorkerPool calls; none shadows a NeMo RL method.
    assert {
        "call",
        "stream",
        "generate_sample",
        "cut",
        "fingerprints",
        "policy_version",
    } <= set(facts["new_methods"])


def test_combined_worker_extension_is_built_only_where_vllm_is(facts: dict[str, Any]) -> None:
    # NeMo RL's extension imports vLLM, which the controller's environment does not have: the
    # combined class is made on first use in vLLM's worker process, not when gpu.py is imported.
    assert facts["extension"].startswith("ImportError: vLLM is not installed")


def test_gpu_module_says_it_has_not_run_on_a_gpu() -> None:
    text = (harness.REPO / "integrations" / "nemo_rl" / "gpu.py").read_text()
    assert "NOT YET RUN ON A GPU" in text.splitlines()[0]
    readme = (harness.REPO / "README.md").read_text()
    assert "NeMo RL on GPU (not yet run on a GPU)" in readme
    script = (harness.REPO / "scripts" / "gpu_check_nemo_rl.sh").read_text()
    assert "UNTESTED" in script
