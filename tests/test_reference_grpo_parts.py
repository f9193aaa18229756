"""The trainer's parts without an engine: GRPO math, the toy task, policy files, checkpoint folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model
from partial_rollout.snapshot import GroupRecord, SampleRecord, SamplingSpec
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, checkpoint, load_config, task
from partial_rollout_integrations.reference_grpo.grpo import clipped_surrogate_loss, group_advantages
from partial_rollout_integrations.reference_grpo.policy import Policy


def test_advantages_are_normalised_within_each_group() -> None:
    adv = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]))
    std = (1 / 3) ** 0.5  # unbiased std of [1, 0, 0, 1]
    assert torch.allclose(adv[0], torch.tensor([0.5, -0.5, -0.5, 0.5]) / (std + 1e-4))
    assert torch.equal(adv[1], torch.zeros(4))  # equal rewards: no signal, not NaN


def test_surrogate_clips_ratios_per_token_and_ignores_padding() -> None:
    behaviour = torch.log(torch.tensor([[0.5, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.5, 1.0, 0.25]])).requires_grad_()  # ratios 1, 2, 0.5
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = clipped_surrogate_loss(new, behaviour, torch.tensor([1.0]), mask, clip_min=0.2, clip_max=0.2)
    # Positive advantage: min(r, clip(r)) = 1 and 1.2; the padded third token does not count.
    assert loss.item() == pytest.approx(-(1.0 + 1.2) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    assert new.grad[0, 1] == 0 and new.grad[0, 0] < 0  # the clipped token gets no gradient


def test_task_reward_and_long_tailed_budgets() -> None:
    cfg = load_config(CONFIG_DIR / "demo.yaml").data
    data = task.BucketTask(cfg, seed=0)
    items = [data[i] for i in range(2000)]
    assert data[7] == items[7]  # deterministic
    budgets = np.array([it["max_tokens"] for it in items])
    assert budgets.min() == cfg.min_tokens and budgets.max() == cfg.max_tokens
    assert np.median(budgets) < 48 and (budgets > 8 * cfg.min_tokens).mean() > 0.05  # short mostly, a long tail
    item = {"bucket": 2}
    assert task.reward(item, np.array([2, 6, 3, 10, 1]), num_buckets=4, reward_tokens=4) == 0.75
    specs = task.sampling_specs(items[7], "e0:7", n=8, temperature=1.0, seed=0, min_tokens=cfg.min_tokens)
    assert specs == task.sampling_specs(items[7], "e0:7", n=8, temperature=1.0, seed=0, min_tokens=cfg.min_tokens)
    assert len({s.seed for s in specs}) == 8 and all(s.ignore_eos for s in specs)
    assert all(
        max(cfg.min_tokens, items[7]["max_tokens"] // 2) <= s.max_tokens <= items[7]["max_tokens"] for s in specs
    )


@pytest.fixture(scope="module")
def tiny() -> Path:
    return build_tiny_model(TinyModelSpec(arch="llama"))


def _group(seed: int) -> GroupRecord:
    rng = np.random.default_rng(seed)
    samples = [
        SampleRecord(
            index=i,
            state="finished",
            sampling=SamplingSpec(max_tokens=12),
            token_ids=rng.integers(3, 500, 12),
            logprobs=np.full(12, -6.0, np.float32),
            versions=np.zeros(12, np.int32),
            finish_reason="length",
            reward=float(i % 2),
        )
        for i in range(4)
    ]
    return GroupRecord(
        group_id=f"g{seed}", prompt_token_ids=[0, 401, 401, 401], state="ready", dispatch_version=0, samples=samples
    )


def test_policy_checkpoint_round_trip_continues_identically(tiny: Path, tmp_path: Path) -> None:
    cfg = load_config(CONFIG_DIR / "fast.yaml")
    a = Policy(tiny, cfg)
    a.train_step([_group(1), _group(2)])
    a.save(tmp_path)
    assert not list(tmp_path.glob("*.tmp"))
    b = Policy(tiny, cfg)
    b.load(tmp_path)
    ma, mb = a.train_step([_group(3)]), b.train_step([_group(3)])
    assert ma == mb  # same weights and same optimizer moments give the same second step
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    export = a.export_for_engine(tmp_path / "v2")
    assert (export / "config.json").is_file() and (export / "tokenizer.json").is_file()


def test_checkpoint_folders_commit_by_rename_and_latest_ignores_tmp(tmp_path: Path) -> None:
    assert checkpoint.latest(tmp_path) is None
    for step in (2, 10):
        folder = checkpoint.begin(tmp_path, step)
        checkpoint.write_training_info(folder, {"current_step": step})
        checkpoint.commit(folder)
    checkpoint.begin(tmp_path, 12)  # a save killed before its rename
    assert checkpoint.latest(tmp_path) == tmp_path / "step_10"  # numeric, not lexical; the .tmp never counts
    assert checkpoint.read_training_info(tmp_path / "step_10") == {"current_step": 10}
    again = checkpoint.begin(tmp_path, 12)
    assert not any(again.glob("*.json"))  # a leftover tmp folder is started afresh
