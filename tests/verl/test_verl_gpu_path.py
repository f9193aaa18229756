"""The GPU path (:mod:`partial_rollout_integrations.verl.gpu`) against verl 0.9.1's real wheel, without a GPU.

Nothing here starts an engine. The facts come from one script run in verl's controller environment
(``.venv-verl``), on the verl 0.9.1 wheel installed there. verl's vLLM server module
(``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) and its worker-extension module
(``vllm_rollout/utils.py``) import vLLM at their top, which ``.venv-verl`` lacks (and vLLM's CUDA
build is no package for this machine), so those two modules are not imported. Their source, the
wheel's own files, is read with ``ast`` instead, and the three classes ``gpu.py`` derives from
(``vLLMHttpServer``, ``vLLMReplica``, ``vLLMColocateWorkerExtension``) are compiled from it: each
``class`` statement exactly as verl wrote it, after those of the module's imports that need no
vLLM; the vLLM imports and the rest of the module's top level are not run. They are registered
under the module's name, so ``gpu.py``, verl's replica registry and verl's ``LLMServerManager``
find verl's real classes; their methods that call vLLM are never called.

What that checks: every verl class, method and attribute ``gpu.py`` uses exists in verl 0.9.1
(the seams probe, on the real classes) and is listed in the probe (``seam_names`` reads
``gpu.py``); each verl method ``gpu.py`` overrides keeps verl's parameters (names, kinds,
defaults; ``generate`` adds two keyword parameters after them), since verl's callers pass them by
name; verl's own lookup (``get_rollout_replica_class`` over its registry, and a real
``LLMServerManager``) returns our replica with the flag on and verl's with it off; our replica gives
the policy our server and a reward model verl's; the server answers every method the trainer side
calls on a durable server; and, with stand-ins for vLLM's ``AsyncLLM`` and our engine only, that
the version tokens are labelled with follows verl's weight sync through sleep and wake-up and that
verl's ``resume_generation`` path reopens the durable server. Whether the path works on a GPU is
``scripts/gpu_check_verl.sh``'s job; it has not run.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import verl_harness as harness

pytestmark = harness.needs_verl

FACTS = r'''
import ast, asyncio, importlib, importlib.metadata, importlib.util, inspect, json, pickle, sys, types
from pathlib import Path
from types import SimpleNamespace

SITE = Path(importlib.util.find_spec("verl").submodule_search_locations[0])


def compile_from_source(module, classes):
    """verl's ``classes`` from ``module``'s source, without running its vLLM imports (module docstring)."""
    path = SITE / (module.removeprefix("verl.").replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = types.ModuleType(module)
    mod.__file__ = str(path)  # inspect.getsource (the probe's instance attributes) reads the real file
    found = set()
    for node in tree.body:
        run = lambda: exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), mod.__dict__)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.startswith("verl.workers.rollout.vllm_rollout") for n in names):
                continue  # the package itself imports vLLM
            try:
                run()
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] != "vllm":
                    raise
        elif isinstance(node, ast.ClassDef) and node.name in classes:
            run()
            found.add(node.name)
    assert found == set(classes), f"{module} has no {sorted(set(classes) - found)}"
    sys.modules[module] = mod
    return mod


server_mod = compile_from_source(
    "verl.workers.rollout.vllm_rollout.vllm_async_server", {"vLLMHttpServer", "vLLMReplica"}
)
utils_mod = compile_from_source("verl.workers.rollout.vllm_rollout.utils", {"vLLMColocateWorkerExtension"})

import seam_names
from omegaconf import OmegaConf
from verl.workers.config import RolloutConfig
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutMode, get_rollout_replica_class

import numpy as np
from partial_rollout.engine import EngineConfig
from partial_rollout.errors import ConfigError
from partial_rollout_integrations.seams import unwrap
from partial_rollout_integrations.verl import gpu, seams
from partial_rollout.snapshot import SampleRecord, SampleState
from partial_rollout_integrations.verl.server import DurableServer

facts = {"verl": importlib.metadata.version("verl")}
try:
    gpu.check_gpu_seams()
    facts["seams"] = "ok"
except ConfigError as e:
    facts["seams"] = str(e)
repo = Path(gpu.__file__).resolve().parents[2]
uses, overrides = seam_names.scan_files([Path(gpu.__file__)], seams.ROOTS, repo)
probed = seams.SEAMS + seams.GPU_SEAMS
facts["uses"] = len(uses)
facts["unprobed"] = seam_names.uncovered(uses, probed)
overriding = seam_names.overriding(overrides)
facts["unprobed_overrides"] = seam_names.uncovered(overriding, probed)

Server, Replica = gpu.DurableVllmHttpServer, gpu.DurableVllmReplica
ours_of = {"vLLMHttpServer": Server, "vLLMReplica": Replica}
params = lambda f: [[p.name, p.kind.name, repr(p.default)] for p in inspect.signature(f).parameters.values()]
facts["overrides"] = {}
for use in overriding:
    cls_name, method = use.chain[-2], use.chain[-1]
    verl_fn = getattr(getattr(server_mod, cls_name), method)
    ours_fn = vars(ours_of[cls_name])[method]
    facts["overrides"][f"{cls_name}.{method}"] = {
        "ours": params(ours_fn), "verl": params(verl_fn),
        "async": [inspect.iscoroutinefunction(ours_fn), inspect.iscoroutinefunction(verl_fn)],
    }
facts["mro"] = {
    "server": [c.__name__ for c in Server.__mro__[:2]] + [Server.__mro__[1].__module__],
    "replica": [c.__name__ for c in Replica.__mro__[:3]],
    "extension": [c.__name__ for c in gpu.WorkerExtension.__mro__],
}
module, name = gpu.EXTENSION.rsplit(".", 1)
facts["extension_resolves"] = getattr(importlib.import_module(module), name) is gpu.WorkerExtension
facts["extension_named"] = object.__new__(Server)._get_worker_extension_cls() == gpu.EXTENSION
# Ray and vLLM find the classes by module and name, in processes that import gpu afresh.
facts["by_reference"] = all(pickle.loads(pickle.dumps(c)) is c for c in (Server, Replica, gpu.WorkerExtension))
durable_api = {
    n for n, f in vars(DurableServer).items()
    if inspect.iscoroutinefunction(f) and not n.startswith("_") and n not in ("start", "update_weights")
}
facts["durable_api_missing"] = sorted(n for n in durable_api if not inspect.iscoroutinefunction(getattr(Server, n)))


def config(enable, **rollout):
    return OmegaConf.create({
        "trainer": {"v1": {"partial_rollout_checkpoint": {"enable": enable}}},
        "actor_rollout_ref": {"model": {}, "rollout": {
            "name": "vllm", "nnodes": 1, "ignore_eos": False, "enable_rollout_routing_replay": False,
            "disaggregation": {"enabled": False}, **rollout,
        }},
    })


def lookup():
    manager = LLMServerManager(config=config(True), worker_group=SimpleNamespace(world_size=1))
    found = get_rollout_replica_class("vllm")
    return {"registry": found.__qualname__, "ours": found is Replica, "verl": found is server_mod.vLLMReplica,
            "manager_ours": manager.rollout_replica_class is Replica}


facts["off"] = {"installed": gpu.install_gpu_path(config(False)), **lookup()}
refused = {}
unsupported = {"ignore_eos": True, "enable_rollout_routing_replay": True, "disaggregation": {"enabled": True}}
for key, value in unsupported.items():
    try:
        gpu.install_gpu_path(config(True, **{key: value}))
        refused[key] = "installed"
    except ConfigError as e:
        refused[key] = str(e)
facts["refused"] = refused
facts["after_refusals"] = lookup()["verl"]
facts["on"] = {"installed": gpu.install_gpu_path(config(True)), **lookup()}
rollout = RolloutConfig(name="vllm")
policy = Replica(replica_rank=0, config=rollout, model_config=None, gpus_per_node=1)
judge = Replica(replica_rank=0, config=rollout, model_config=None, gpus_per_node=1, is_reward_model=True)
facts["server_class"] = {"policy": unwrap(policy.server_class) is Server,
                         "reward_model": unwrap(judge.server_class) is server_mod.vLLMHttpServer}


class AsyncLLM:
    """vLLM's AsyncLLM as verl's wake_up, clear_kv_cache and our labelling call it: asleep, then awake."""

    def __init__(self):
        self.asleep = {"weights", "kv_cache"}

    async def is_sleeping(self):
        return bool(self.asleep)

    async def wake_up(self, tags=None):
        self.asleep -= set(tags or ("weights", "kv_cache"))

    async def reset_prefix_cache(self, reset_connector=False):
        return True

    async def reset_mm_cache(self):
        pass

    async def reset_encoder_cache(self):
        pass


class Engine:
    """What the durable server and the labelling call on a ResumableEngine: a version, refit, generate."""

    policy_version = 0

    def __init__(self):
        self.refits, self.requests = [], []

    async def refit(self, load, version):
        await load()
        self.policy_version = version
        self.refits.append(version)

    async def generate(self, request_id, prompt_token_ids, sampling, *, index, resume_from=None):
        self.requests.append([request_id, list(prompt_token_ids), index])
        one = lambda dtype, value: np.array([value], dtype)
        return SampleRecord(index=index, state=SampleState.FINISHED, sampling=sampling, finish_reason="stop",
                            token_ids=one(np.int32, 7), logprobs=one(np.float32, -0.5),
                            versions=one(np.int32, self.policy_version))


async def weight_sync():
    """verl's naive weight sync of colocate_async as the server sees it (engine_workers.py:782-823)."""
    server = object.__new__(Server)
    server.node_rank, server.rollout_mode, server.global_steps = 0, RolloutMode.HYBRID, None
    server.engine, server._resume_event = AsyncLLM(), asyncio.Event()
    engine = Engine()
    model = Path("model")  # the durable server keeps its engine's config; nothing reads the folder here
    model.mkdir(exist_ok=True)
    for name in ("config.json", "tokenizer_config.json"):
        (model / name).write_text("{}")
    server._durable = DurableServer(EngineConfig(model=str(model)))
    server._durable.attach(engine)
    server._labelling = asyncio.Lock()
    seen = {"abort": await server.abort_all_requests()}  # on_sample_end; nothing runs, nothing is cut
    await server.wake_up(tags=["weights"])
    await server.clear_kv_cache()
    await server.set_global_steps(3)
    seen["asleep"] = [server.global_steps, engine.policy_version, server._durable.global_steps]
    await server.wake_up(tags=["kv_cache"])
    seen["awake"] = [server.global_steps, engine.policy_version, server._durable.global_steps]
    await server.set_global_steps(4)  # an engine that never sleeps: labelled at once
    seen["again"] = [server.global_steps, engine.policy_version, engine.refits]
    # verl's client sends prompt_ids, sampling_params, request_id and the rest by keyword.
    sent = {"prompt_ids": [5, 6], "sampling_params": {"temperature": 1.0, "logprobs": True}, "request_id": "r0"}
    task = asyncio.ensure_future(server.generate(**sent, image_data=None, video_data=None, sample_key="u_1"))
    await asyncio.sleep(0.05)
    seen["parked_after_abort"] = not task.done()
    await server.open_submission_gate()  # vLLMReplica.resume_generation's last call on each server
    reply = await asyncio.wait_for(task, 5)
    seen["reply"] = [reply.token_ids, reply.stop_reason, reply.extra_fields["global_steps"], engine.requests]
    return seen


facts["weight_sync"] = asyncio.run(weight_sync())
print(json.dumps(facts))
'''


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of :data:`FACTS` in ``.venv-verl`` (verl's imports take most of it)."""
    result = subprocess.run(
        [str(harness.VERL_PYTHON), "-c", FACTS],
        env=harness.verl_env(),
        cwd=tmp_path_factory.mktemp("gpu_path"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    parsed: dict[str, Any] = json.loads(result.stdout.splitlines()[-1])
    return parsed


def test_every_verl_name_gpu_py_uses_exists_in_verl_0_9_1_and_is_probed(facts: dict[str, Any]) -> None:
    assert facts["verl"] == "0.9.1"
    assert facts["seams"] == "ok"
    assert facts["uses"] > 20, "the scan sees gpu.py's uses of verl (imports, self.<name>, super())"
    assert facts["unprobed"] == []
    assert facts["unprobed_overrides"] == []


def test_each_overridden_verl_method_keeps_verls_parameters(facts: dict[str, Any]) -> None:
    overrides = facts["overrides"]
    assert set(overrides) == {
        "vLLMHttpServer._get_worker_extension_cls",
        "vLLMHttpServer.run_server",
        "vLLMHttpServer.generate",
        "vLLMHttpServer.abort_all_requests",
        "vLLMHttpServer.open_submission_gate",
        "vLLMHttpServer.set_global_steps",
        "vLLMHttpServer.wake_up",
        "vLLMHttpServer.resume_kv_cache",
        "vLLMReplica.__init__",
    }, "a method of ours shadows a verl method it was not meant to (or an override's verl method is gone)"
    for name, o in overrides.items():
        ours, verl = o["ours"], o["verl"]
        assert o["async"][0] == o["async"][1], name
        if name == "vLLMHttpServer.generate":
            # verl's client passes everything by keyword; the durable client adds the sample's identity.
            assert ours[: len(verl)] == verl
            assert ours[len(verl) :] == [
                ["sample_key", "POSITIONAL_OR_KEYWORD", "None"],
                ["resume_from", "POSITIONAL_OR_KEYWORD", "None"],
            ]
        else:
            assert ours == verl, f"{name}: ours {ours}, verl's {verl}"


def test_flag_on_makes_verls_lookup_return_our_replica_and_flag_off_leaves_verls(facts: dict[str, Any]) -> None:
    assert facts["off"] == {
        "installed": False,
        "registry": "vLLMReplica",
        "ours": False,
        "verl": True,
        "manager_ours": False,
    }
    # Settings the durable server cannot serve fail at set-up, naming verl's key, and install nothing.
    refused = facts["refused"]
    assert refused["ignore_eos"].startswith("actor_rollout_ref.rollout.ignore_eos: true is not supported")
    assert refused["enable_rollout_routing_replay"].startswith(
        "actor_rollout_ref.rollout.enable_rollout_routing_replay: true"
    )
    assert refused["disaggregation"].startswith("actor_rollout_ref.rollout.disaggregation.enabled: true")
    assert facts["after_refusals"] is True
    assert facts["on"] == {
        "installed": True,
        "registry": "DurableVllmReplica",
        "ours": True,
        "verl": False,
        "manager_ours": True,
    }
    # The policy's replicas launch our server; a reward model (a judge) keeps verl's.
    assert facts["server_class"] == {"policy": True, "reward_model": True}


def test_classes_derive_from_verls_and_resolve_by_name(facts: dict[str, Any]) -> None:
    mro = facts["mro"]
    assert mro["server"] == [
        "DurableVllmHttpServer",
        "vLLMHttpServer",
        "verl.workers.rollout.vllm_rollout.vllm_async_server",
    ]
    assert mro["replica"] == ["DurableVllmReplica", "vLLMReplica", "RolloutReplica"]
    # vLLM mixes one extension class into its worker: our hooks and verl's weight receivers in one.
    assert mro["extension"] == ["WorkerExtension", "WorkerHooks", "vLLMColocateWorkerExtension", "object"]
    assert facts["extension_named"] is True
    assert facts["extension_resolves"] is True
    assert facts["by_reference"] is True
    # Every method the trainer side (VerlServers) calls on a durable server, the server answers.
    assert facts["durable_api_missing"] == []


def test_tokens_take_verls_step_once_the_engine_is_awake(facts: dict[str, Any]) -> None:
    seen = facts["weight_sync"]
    assert seen["abort"] == {"aborted_count": 0, "request_ids": []}
    # verl's ServerAdapter sets the step before waking the KV cache: the label waits for the wake-up.
    assert seen["asleep"] == [3, 0, 0]  # verl's step, the engine's label, the replies' global_steps
    assert seen["awake"] == [3, 3, 3]
    assert seen["again"] == [4, 4, [3, 4]]
    # After verl's abort a request waits; verl's resume_generation (open_submission_gate) lets it run,
    # on the engine, named by the sample's stable key and attempt, labelled with the new step.
    assert seen["parked_after_abort"] is True
    assert seen["reply"] == [[7], "completed", 4, [["u_1/0", [5, 6], 1]]]


def test_gpu_module_and_script_say_they_have_not_run_on_a_gpu() -> None:
    text = (harness.REPO / "integrations" / "verl" / "gpu.py").read_text()
    first = text.splitlines()[0]
    assert "NOT YET RUN ON A GPU" in first and "verl 0.9.1" in first
    script = (harness.REPO / "scripts" / "gpu_check_verl.sh").read_text()
    assert "UNTESTED" in script.splitlines()[1]
