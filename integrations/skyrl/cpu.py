"""SkyRL's real fully async loop on a CPU: a stand-in for training, our servers for generation.

SkyRL's training workers need GPUs (FSDP on NCCL, placement groups of GPUs). Its own
``FullyAsyncTrainerSim`` shows the seam: with ``trainer.fully_async.simulate_training=true`` its
entry point builds no models, and a trainer overriding ``_run_training`` and the weight-sync
``dispatch`` runs the real loop (staleness control, the generation buffer, pauses around each weight
sync) with nothing else changed. SkyRL's simulator forbids checkpoints; this harness adds them:
:class:`CpuDispatch` stands in for SkyRL's ``WorkerDispatch`` with a :class:`~..noisy_policy.NoisyPolicy`
(real weights that each step moves), saved into and loaded from SkyRL's checkpoint folder, and pushed
to the durable servers at each weight sync (a folder the engines load; on GPUs SkyRL broadcasts them).

Each training step logs a ``train_step`` event with the uids it trained, so that a test can count
what was lost or trained twice across a kill.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer

from partial_rollout.ledger import TRAIN_STEP, EventKind, EventLog
from partial_rollout.snapshot import load_snapshot
from partial_rollout_integrations.noisy_policy import NoisyPolicy
from partial_rollout_integrations.skyrl.checkpoint import Servers
from partial_rollout_integrations.skyrl.experiment import EVENTS_FILE, PartialRolloutExp, parse
from partial_rollout_integrations.skyrl.seams import check_cpu_seams
from partial_rollout_integrations.skyrl.trainer import PartialRolloutTrainer

NOISE = 1e-3
"""The standard deviation of a fake training step's noise: enough to change sampled tokens."""


@dataclass(frozen=True)
class KillPoint:
    """Where a test's run SIGKILLs itself (``--kill after_save:STEP`` or ``inside_save:STEP``).

    ``after_save``: right after a checkpoint of step ``STEP`` or later committed (flag on: the first
    whose snapshot holds work, in flight or finished and not trained on, so a resume has some to hand
    back; how much of it is still in flight depends on the machine's speed). ``inside_save``:
    in the save of step ``STEP`` or later, after our snapshot and SkyRL's state file, before SkyRL's model
    save and commit marker. The test then kills what the run started (servers, Ray), as a preempted
    node loses them.
    """

    where: str
    step: int

    @classmethod
    def parse(cls, text: str) -> KillPoint:
        where, _, step = text.partition(":")
        if where not in ("after_save", "inside_save") or not step.isdigit():
            raise ValueError(f"--kill {text!r}: give after_save:STEP or inside_save:STEP")
        return cls(where, int(step))


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class CpuDispatch:
    """The parts of SkyRL's ``WorkerDispatch`` its fully async loop and checkpoints call, on CPU."""

    def __init__(self, client: Any, servers: Servers, policy: NoisyPolicy, kill: KillPoint | None) -> None:
        self._client = client
        self._servers = servers
        self.policy = policy
        self._kill = kill

    def init_weight_sync_state(self, inference_engine_client: Any) -> None:
        """No process group: the servers load a folder."""

    def get_lcm_dp_size(self) -> int:
        return 1

    async def save_weights_for_sampler(self) -> None:
        """SkyRL's weight sync: pause (keep), load this version into every server, resume."""
        await self._client.pause_generation()
        try:
            await asyncio.to_thread(self._servers.update_weights, self.policy.weights_dir, self.policy.version)
        finally:
            await self._client.resume_generation()
        self._client.increment_weight_version()

    def get_timing_metrics(self) -> dict[str, float]:
        return {}

    def save_checkpoint(self, model: str, ckpt_dir: str, tokenizer: Any = None) -> None:
        step = int(Path(ckpt_dir).parent.name.removeprefix("global_step_"))
        if self._kill is not None and self._kill.where == "inside_save" and step >= self._kill.step:
            _die()  # SkyRL's base save runs this first, then writes its commit marker
        if model == "policy":
            self.policy.save(ckpt_dir)

    def load_checkpoint(self, model: str, ckpt_dir: str, **_: Any) -> None:
        if model == "policy":
            self.policy.load(ckpt_dir)

    def get_node_ids(self) -> list[str]:
        return [ray.get_runtime_context().get_node_id()]

    def finalize_pending_saves(self, model: str) -> None:
        """Saves here are synchronous: nothing pending."""


class CpuTraining:
    """What makes a SkyRL fully async trainer run on CPU (see the module docstring); mixed in first."""

    def __init__(
        self,
        *args: Any,
        policy: NoisyPolicy,
        weights_to: Servers,
        train_log: EventLog,
        kill: KillPoint | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.ref_model = None  # no models are built; SkyRL's epoch end reads it
        # load_checkpoints runs before init_weight_sync_state and reads the dispatch: set it now
        self.dispatch = CpuDispatch(self.inference_engine_client, weights_to, policy, kill)  # type: ignore[attr-defined]
        self.train_log = train_log
        self.kill = kill

    def load_checkpoints(self) -> Any:
        loaded = super().load_checkpoints()  # type: ignore[misc]
        if not isinstance(self, PartialRolloutTrainer):  # ours logs its own resumes
            self.train_log.append(EventKind.RESUME, step=int(loaded[0]))
        return loaded

    def save_checkpoints(self) -> str:
        folder: str = super().save_checkpoints()  # type: ignore[misc]
        step = int(self.global_step)  # type: ignore[attr-defined]
        if not isinstance(self, PartialRolloutTrainer):  # ours logs its own saves
            self.train_log.append(EventKind.SAVE, step=step, durable=True)
        if self.kill is not None and self.kill.where == "after_save" and step >= self.kill.step:
            # flag on: a checkpoint holding work to hand back (the last steps' may hold none)
            holding = not isinstance(self, PartialRolloutTrainer) or bool(load_snapshot(folder).groups)
            if holding:
                _die()
        return folder

    def init_weight_sync_state(self) -> None:
        """The dispatch is already set."""

    async def _run_training(self, training_input: Any) -> dict[str, Any]:
        """One fake step: the weights move (seeded by the step), and what the step trains on is logged:
        each sample's uid, repetition, response tokens and rollout logprobs, as SkyRL's batch holds them."""
        step = int(self.global_step)  # type: ignore[attr-defined]
        policy = self.dispatch.policy
        await asyncio.to_thread(policy.step)
        assert policy.version == step, f"policy version {policy.version} at SkyRL step {step}"
        rows = [str(uid) for uid in training_input.metadata["uids"]]
        rewards = training_input.get("rewards")
        self.train_log.append(
            EventKind.LOG,
            kind=TRAIN_STEP,
            step=step,
            uids=sorted(set(rows)),
            reward=None if rewards is None else float(rewards.sum(dim=-1).mean()),
            samples=_trained_samples(training_input, rows),
        )
        return {"cpu_step": step}


def _trained_samples(batch: Any, rows: list[str]) -> list[dict[str, Any]]:
    """Each row of SkyRL's training batch: its session, response tokens and rollout logprobs.

    Rows are SkyRL's groups one after another, each group's samples in repetition order; a response is
    the last ``response_mask`` columns of ``sequences``, masked.
    """
    mask = batch["response_mask"].bool()
    responses = batch["sequences"][:, -mask.shape[1] :]
    logprobs = batch["rollout_logprobs"]
    seen: dict[str, int] = {}
    samples = []
    for i, uid in enumerate(rows):
        repetition = seen.get(uid, 0)
        seen[uid] = repetition + 1
        samples.append(
            {
                "session": f"{uid}_{repetition}",
                "tokens": responses[i][mask[i]].tolist(),
                "logprobs": None if logprobs is None else logprobs[i][mask[i]].tolist(),
            }
        )
    return samples


class CpuTrainer(CpuTraining, FullyAsyncRayPPOTrainer):  # type: ignore[misc]
    """SkyRL's own fully async trainer on CPU (the flag off)."""


class CpuPartialRolloutTrainer(CpuTraining, PartialRolloutTrainer):
    """Ours on CPU (the flag on)."""


# -------------------------------------------------------------------- one CPU run, servers included

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""SkyRL applies a chat template to every prompt; the project's tiny tokenizers have none."""


class CpuExp(PartialRolloutExp):
    """The experiment on CPU: the same hooks, with what SkyRL's GPU set-up needs replaced.

    - ``_setup_trainer`` without its first lines: SkyRL imports its FSDP worker classes before it
      reads ``simulate_training``, and their module imports ``flash_attn`` (CUDA only); with
      ``simulate_training`` it builds no models, so nothing else of it is skipped.
    - the inference client built as SkyRL's "fully external" branch builds it: the module holding
      that branch imports ``vllm_router`` (CUDA only).
    - the dataset with one preprocessing process (SkyRL's hard-codes 8) and a chat template.
    """

    def __init__(self, cfg: Any, *, model: Path, kill: KillPoint | None, noise: float = NOISE) -> None:
        self.model = model
        self.kill = kill
        self.noise = noise
        super().__init__(cfg)
        if self.events is None:
            self.events = EventLog(Path(cfg.trainer.ckpt_path) / EVENTS_FILE)

    def get_train_dataset(self) -> Any:
        from skyrl.train.dataset import PromptDataset

        self.tokenizer.chat_template = CHAT_TEMPLATE
        return PromptDataset(
            datasets=self.cfg.data.train_data,
            tokenizer=self.tokenizer,
            max_prompt_length=self.cfg.trainer.max_prompt_length,
            num_workers=1,
        )

    def get_inference_client(self) -> Any:
        from skyrl.backends.skyrl_train.inference_servers.remote_inference_client import RemoteInferenceClient

        ie = self.cfg.generator.inference_engine
        return RemoteInferenceClient(
            proxy_url=ie.external_proxy_url,
            server_urls=list(ie.external_server_urls),
            model_name=ie.served_model_name or self.cfg.trainer.policy.model.path,
            data_parallel_size=ie.data_parallel_size,
            tokenizer=self.tokenizer,
        )

    def _setup_trainer(self) -> Any:
        os.makedirs(self.cfg.trainer.export_path, exist_ok=True)
        os.makedirs(self.cfg.trainer.ckpt_path, exist_ok=True)
        client = self.get_inference_client()
        trainer = self.get_trainer(
            cfg=self.cfg,
            tracker=self.get_tracker(),
            tokenizer=self.tokenizer,
            train_dataset=self.train_dataset,
            eval_dataset=self.eval_dataset,
            inference_engine_client=client,
            generator=self.get_generator(self.cfg, self.tokenizer, client),
            colocate_pg=self.colocate_pg,
        )
        trainer.trajectory_logger = self.get_trajectory_logger()
        self.trainer = trainer
        return trainer

    def trainer_class(self) -> type:
        return CpuPartialRolloutTrainer if self.block.enable else CpuTrainer

    def trainer_kwargs(self) -> dict[str, Any]:
        policy = NoisyPolicy(self.model, Path(self.cfg.trainer.ckpt_path).parent / "weights", noise=self.noise)
        return {
            **super().trainer_kwargs(),
            "policy": policy,
            "weights_to": Servers(self.urls),
            "train_log": self.events,
            "kill": self.kill,
        }


def write_prompts(path: Path, *, count: int, seed: int) -> Path:
    """``count`` single-turn GSM8K-style prompts (SkyRL's ``gsm8k`` environment scores them)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(count):
            a, b = rng.randrange(2, 50), rng.randrange(2, 50)
            row = {
                "prompt": [{"role": "user", "content": f"Question {i}: what is {a} plus {b}? Answer after ####."}],
                "env_class": "gsm8k",
                "reward_spec": {"method": "rule", "ground_truth": str(a + b)},
            }
            f.write(json.dumps(row) + "\n")
    return path


def start_servers(
    python: str, model: Path, *, ports: list[int], seed: int, logs: Path
) -> list[subprocess.Popen[bytes]]:
    """One durable server per port, each in ``python``'s environment (where vLLM is)."""
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
    servers = []
    for port in ports:
        command = [python, "-m", "partial_rollout_integrations.skyrl.server", "--model", str(model)]
        command += ["--port", str(port), "--seed", str(seed), "--dtype", "float32", "--max-model-len", "1024"]
        command += ["--request-log", str(logs / f"requests-{port}.jsonl")]
        with open(logs / f"server-{port}.log", "ab") as log:
            servers.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))
    return servers


def wait_ready(urls: list[str], servers: list[subprocess.Popen[bytes]], *, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(urls)
    while waiting:
        for server in servers:
            if server.poll() is not None:
                raise RuntimeError(f"a durable server exited with {server.returncode} before it was ready")
        try:
            with urllib.request.urlopen(waiting[0] + "/health", timeout=5):
                waiting.pop(0)
                continue
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{waiting[0]} was not ready after {timeout_s:.0f} s")
        time.sleep(0.5)


def overrides(work: Path, model: Path, urls: list[str], *, prompts: Path, args: argparse.Namespace) -> list[str]:
    """SkyRL's config for a small fully async run on CPU, in SkyRL's own override syntax."""
    return [
        f"data.train_data=['{prompts}']",
        "data.dataloader.num_workers=0",
        f"trainer.policy.model.path={model}",
        f"trainer.ckpt_path={work / 'ckpt'}",
        f"trainer.export_path={work / 'export'}",
        f"trainer.log_path={work / 'logs'}",
        "trainer.logger=console",
        "trainer.strategy=fsdp",
        "trainer.placement.colocate_all=false",
        "trainer.epochs=1",
        f"trainer.train_batch_size={args.batch}",
        f"trainer.policy_mini_batch_size={args.batch}",
        f"trainer.ckpt_interval={args.ckpt_interval}",
        "trainer.eval_interval=-1",
        "trainer.eval_before_train=false",
        "trainer.hf_save_interval=-1",
        "trainer.max_prompt_length=128",
        "trainer.enable_ray_gpu_monitor=false",
        f"trainer.seed={args.seed}",
        "trainer.algorithm.advantage_estimator=grpo",
        "trainer.algorithm.policy_loss_type=rollout_is",
        "trainer.fully_async.enabled=true",
        "trainer.fully_async.simulate_training=true",
        f"trainer.fully_async.max_staleness_steps={args.max_staleness}",
        f"trainer.fully_async.num_parallel_generation_workers={args.workers}",
        f"trainer.fully_async.partial_rollout_checkpoint.enable={str(args.enable).lower()}",
        f"generator.n_samples_per_prompt={args.n}",
        f"generator.sampling_params.max_generate_length={args.max_tokens}",
        "generator.sampling_params.temperature=1.0",
        "generator.sampling_params.logprobs=0",
        "generator.batched=false",
        "generator.inference_engine.run_engines_locally=false",
        f"generator.inference_engine.external_proxy_url={urls[0]}",
        f"generator.inference_engine.external_server_urls={json.dumps(urls)}",
        "environment.env_class=gsm8k",
    ]


def main(argv: list[str] | None = None) -> None:
    """``python -m partial_rollout_integrations.skyrl.cpu --work DIR --model DIR [--enable]``: one run
    (or its resume, if ``DIR`` holds a checkpoint) of SkyRL's fully async loop on CPU, with its servers."""
    parser = argparse.ArgumentParser(prog="python -m partial_rollout_integrations.skyrl.cpu", description=main.__doc__)
    parser.add_argument("--work", type=Path, required=True, help="the run's folder (checkpoints, events, logs)")
    parser.add_argument("--model", type=Path, required=True, help="the tiny model the policy starts from")
    parser.add_argument("--engine-python", default=str(Path(".venv/bin/python").absolute()), help="vLLM's Python")
    parser.add_argument("--enable", action="store_true", help="partial rollouts on (off: SkyRL as it is)")
    parser.add_argument("--port", type=int, default=18710, help="the first server's port")
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2, help="groups per training step")
    parser.add_argument("--n", type=int, default=2, help="samples per prompt")
    parser.add_argument("--workers", type=int, default=4, help="SkyRL's parallel generation workers")
    parser.add_argument("--max-staleness", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--ckpt-interval", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill", default=None, help="after_save:STEP or inside_save:STEP (tests)")
    parser.add_argument("--noise", type=float, default=NOISE, help="each step's weight noise (0: weights never change)")
    args = parser.parse_args(argv)
    kill = None if args.kill is None else KillPoint.parse(args.kill)
    work = args.work.absolute()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    prompts = write_prompts(work / "prompts.jsonl", count=args.prompts, seed=args.seed)
    ports = [args.port + i for i in range(args.servers)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    cfg = parse(overrides(work, args.model.absolute(), urls, prompts=prompts, args=args))
    check_cpu_seams()
    servers = start_servers(args.engine_python, args.model, ports=ports, seed=args.seed, logs=work / "logs")
    try:
        _start_ray(cfg)
        wait_ready(urls, servers)
        CpuExp(cfg, model=args.model.absolute(), kill=kill, noise=args.noise).run()
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=60)


def _start_ray(cfg: Any) -> None:
    """A local Ray of 2 CPUs and no dashboard (SkyRL's ``initialize_ray`` takes every core and starts
    one), with the runtime environment and registries ``initialize_ray`` sets up."""
    from skyrl.backends.skyrl_train.utils.ppo_utils import sync_registries
    from skyrl.train.utils.utils import prepare_runtime_environment

    env_vars = prepare_runtime_environment(cfg)
    for name in ("PYTHONPYCACHEPREFIX", "OMP_NUM_THREADS"):
        if os.environ.get(name):
            env_vars[name] = os.environ[name]
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": env_vars})
    sync_registries()


if __name__ == "__main__":
    main()
