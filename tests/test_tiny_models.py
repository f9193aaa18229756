"""Tiny offline models: deterministic, cached, loadable by transformers, with the right specials."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_build_is_deterministic_and_cached(tmp_path: Path, arch: str) -> None:
    spec = TinyModelSpec(arch=arch, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    a = build_tiny_model(spec, tmp_path / "a")
    b = build_tiny_model(spec, tmp_path / "b")
    assert a.name == b.name and arch in a.name
    assert _digests(a) == _digests(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(_digests(a))
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(spec, tmp_path / "a") == a
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime  # reused, not rebuilt
    other = build_tiny_model(
        TinyModelSpec(arch=arch, hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128, seed=7),
        tmp_path / "a",
    )
    assert other != a and _digests(other)["model.safetensors"] != _digests(a)["model.safetensors"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tokenizer_and_model_load_offline(arch: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder = build_tiny_model(TinyModelSpec(arch=arch))
    tok = AutoTokenizer.from_pretrained(folder)
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    text = "12 + 30 = 42, the answer kalo."
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    # vLLM loads the tokenizer through AutoTokenizer: it must agree with tokenizer.json itself
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids == ids
    config = AutoConfig.from_pretrained(folder)
    assert config.model_type == arch and config.vocab_size == len(tok)
    model = AutoModelForCausalLM.from_pretrained(folder)
    logits = model(torch.tensor([ids])).logits[0, -1].float()
    entropy = -(logits.log_softmax(-1).exp() * logits.log_softmax(-1)).sum()
    assert entropy > 2.0  # random init far from degenerate: sampling exercises the sampler


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(hidden_size=64, num_heads=4), "head_dim=16"),
        (dict(arch="gpt2"), "not supported"),
        (dict(vocab_size=100), "too small"),
        (dict(num_heads=3), "must divide"),
    ],
)
def test_bad_spec_is_rejected(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelSpec(**kwargs)
