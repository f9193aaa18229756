"""The trainer's config: NeMo RL-style overrides, and bad values failing at start with one clear line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from snapshot_helpers import save_ledger

from partial_rollout.errors import EXIT_BAD_INPUT, ConfigError
from partial_rollout.snapshot import Fingerprints
from partial_rollout_integrations.reference_grpo import CONFIG_DIR, load_config, run_training
from partial_rollout_integrations.reference_grpo.__main__ import main

DEMO = CONFIG_DIR / "demo.yaml"


def test_shipped_configs_load_with_the_nemo_rl_keys() -> None:
    cfg = load_config(DEMO)
    assert cfg.grpo.num_prompts_per_step == 2 and cfg.async_rl.sampler.name == "windowed"
    assert (
        cfg.checkpointing.partial_rollouts.enabled is True and cfg.checkpointing.partial_rollouts.on_stale == "continue"
    )
    fast = load_config(CONFIG_DIR / "fast.yaml")
    # The seed's timeline: 2 prompts per step, a buffer of 4, windowed sampler, save every 2 steps.
    assert (fast.grpo.num_prompts_per_step, fast.async_rl.max_buffered_rollouts, fast.checkpointing.save_period) == (
        2,
        4,
        2,
    )


def test_overrides_change_existing_keys_and_plus_plus_adds_schema_keys() -> None:
    cfg = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            "grpo.max_num_steps=3",
            "checkpointing.partial_rollouts.on_stale=drop",
            "++loss_fn.ratio_clip_max=0.3",
        ],
    )
    assert cfg.grpo.max_num_steps == 3 and cfg.checkpointing.partial_rollouts.on_stale == "drop"
    assert cfg.loss_fn.ratio_clip_max == 0.3
    with pytest.raises(ConfigError, match=r"no key 'loss_fn.ratio_clip_max'.*\+\+loss_fn.ratio_clip_max=0.3"):
        load_config(CONFIG_DIR / "fast.yaml", ["loss_fn.ratio_clip_max=0.3"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "++grpo.num_prompt_per_step=3",
            r"unknown key 'grpo.num_prompt_per_step'; grpo has \[.*'num_prompts_per_step'",
        ),
        ("++checkpointing.partial_rollout.enabled=true", r"unknown key 'checkpointing.partial_rollout'"),
        ("checkpointing.save_period=-2", r"checkpointing.save_period: must be a positive number of steps, got -2"),
        (
            "checkpointing.partial_rollouts.on_stale=retry",
            r"on_stale: must be one of \['continue', 'regenerate', 'drop'\]",
        ),
        ("checkpointing.partial_rollouts.enabled=maybe", r"enabled: must be true or false, got 'maybe'"),
        ("grpo.num_generations_per_prompt=1", r"must be >= 2: GRPO normalises rewards within a group"),
        ("async_rl.max_buffered_rollouts=1", r"max_buffered_rollouts: 1 < grpo.num_prompts_per_step 2"),
        ("async_rl.max_inflight_prompts=0", r"async_rl.max_inflight_prompts: must be positive, got 0"),
        ("data.max_tokens=5000", r"generation.max_model_len: 1024 cannot hold"),
        ("grpo.max_num_steps", r"is not key=value"),
        (
            "++generation.min_engines=2",
            r"generation.min_engines: must be at most generation.num_engines \(1\), got 2",
        ),
        ("++generation.min_engines=0", r"generation.min_engines: must be positive, got 0"),
    ],
)
def test_bad_values_fail_at_load_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(DEMO, [override])


def test_unknown_yaml_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(DEMO.read_text() + "\nvalidation:\n  val_period: 10\n")
    with pytest.raises(ConfigError, match=r"unknown key 'validation'; the top level has"):
        load_config(path)


class _PlainEngine:
    """An engine that generates but cannot cut its in-flight requests (no cut)."""

    async def generate(self, request_id, prompt_token_ids, sampling, *, index, resume_from=None):
        raise AssertionError("must not be reached: the config check comes first")

    async def update_weights(self, weights_dir: str, policy_version: int) -> None:
        raise AssertionError("must not be reached")

    async def fingerprints(self) -> Fingerprints:
        raise AssertionError("must not be reached")


def test_an_engine_that_cannot_capture_fails_at_start(tmp_path: Path) -> None:
    cfg = load_config(
        CONFIG_DIR / "fast.yaml", [f"checkpointing.checkpoint_dir={tmp_path}/c", f"logger.log_dir={tmp_path}/l"]
    )
    with pytest.raises(
        ConfigError,
        match=r"engine: _PlainEngine is not a RolloutEngine: it lacks capabilities, cut, progress, "
        r"reset_prefix_cache, shutdown",
    ):
        asyncio.run(run_training(cfg, engine=_PlainEngine(), progress=False))
    assert not (tmp_path / "l").exists()  # nothing was started or written


def test_a_folder_with_checkpoints_is_not_silently_reused(tmp_path: Path) -> None:
    (tmp_path / "c" / "step_2").mkdir(parents=True)
    cfg = load_config(
        CONFIG_DIR / "fast.yaml", [f"checkpointing.checkpoint_dir={tmp_path}/c", f"logger.log_dir={tmp_path}/l"]
    )
    with pytest.raises(ConfigError, match="already holds checkpoints.*--resume"):
        asyncio.run(run_training(cfg, progress=False))


def test_command_line_prints_one_line_and_exits_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(DEMO), "checkpointing.save_period=0"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err == "error: checkpointing.save_period: must be a positive number of steps, got 0"


def test_resume_with_another_model_names_both_models_before_loading_weights(tmp_path: Path, tiny_qwen2: Path) -> None:
    """A checkpoint of the tiny Llama resumed with ``policy.model_name`` set to the tiny Qwen2 fails in one line."""
    from partial_rollout.fingerprint import model_fingerprint, tokenizer_fingerprint
    from partial_rollout.ledger import WorkLedger
    from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model
    from partial_rollout_integrations.reference_grpo import checkpoint

    llama = build_tiny_model(TinyModelSpec(arch="llama"))
    folder = checkpoint.begin(tmp_path / "c", 2)
    prints = Fingerprints(
        model=model_fingerprint(llama),
        tokenizer=tokenizer_fingerprint(llama),
        vocab_size=512,
        vllm_version="0.32.0",
        model_path=str(llama),
    )
    save_ledger(WorkLedger(), folder, trainer_step=2, policy_version=2, fingerprints=prints, loader_state=None)
    checkpoint.commit(folder)
    cfg = load_config(
        CONFIG_DIR / "fast.yaml",
        [
            f"checkpointing.checkpoint_dir={tmp_path}/c",
            f"logger.log_dir={tmp_path}/l",
            f"++policy.model_name={tiny_qwen2}",
        ],
    )
    with pytest.raises(
        ConfigError,
        match=rf"policy.model_name: the checkpoint was trained from '{llama}', "
        rf"this run has '{tiny_qwen2}'",
    ):
        asyncio.run(run_training(cfg, resume=True, progress=False))
