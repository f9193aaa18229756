"""Model and tokenizer fingerprints change when identity changes, and only then."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from partial_rollout.errors import BadInputError
from partial_rollout.fingerprint import model_fingerprint, tokenizer_fingerprint


def make_model(
    folder: Path, *, config: dict | None = None, weights: dict[str, np.ndarray] | None = None, shards: int = 1
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(config or {"model_type": "llama", "hidden_size": 8, "vocab_size": 32})
    )
    weights = (
        weights
        if weights is not None
        else {"embed.weight": np.zeros((32, 8), np.float32), "lm_head.weight": np.zeros((32, 8), np.float32)}
    )
    names = sorted(weights)
    for shard in range(shards):
        part = {n: weights[n] for n in names[shard::shards]}
        save_file(part, folder / f"model-{shard:05d}-of-{shards:05d}.safetensors", metadata={"format": "pt"})
    return folder


def test_tokenizer_fingerprint_is_sha256_of_the_file(tmp_path: Path) -> None:
    content = json.dumps({"model": {"type": "BPE"}, "added_tokens": []}).encode()
    (tmp_path / "tokenizer.json").write_bytes(content)
    expected = "sha256:" + hashlib.sha256(content).hexdigest()
    assert tokenizer_fingerprint(tmp_path) == expected
    assert tokenizer_fingerprint(tmp_path / "tokenizer.json") == expected
    (tmp_path / "tokenizer.json").write_bytes(content + b" ")
    assert tokenizer_fingerprint(tmp_path) != expected


def test_tokenizer_fingerprint_needs_a_file(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match=r"tokenizer: no tokenizer.json or tokenizer.model here") as info:
        tokenizer_fingerprint(tmp_path)
    assert str(tmp_path) in str(info.value)
    with pytest.raises(BadInputError, match=r"tokenizer: no tokenizer.json here"):
        tokenizer_fingerprint(tmp_path / "missing")


def sentencepiece_identity(model: bytes, *, added_tokens: dict | None = None, decoder: dict | None = None) -> str:
    """The documented digest of a sentencepiece-only folder, computed independently."""
    identity = {
        "added_tokens": added_tokens or {},
        "added_tokens_decoder": decoder or {},
        "tokenizer_model": hashlib.sha256(model).hexdigest(),
    }
    return "sha256:" + hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_sentencepiece_only_folder(tmp_path: Path) -> None:
    """A folder with only tokenizer.model (which vLLM and the engine factory accept) has a fingerprint:
    its model's bytes and its added tokens, not the rest of tokenizer_config.json."""
    model = bytes(range(256)) * 4  # arbitrary bytes: hashed, never parsed (no sentencepiece needed)
    (tmp_path / "tokenizer.model").write_bytes(model)
    base = tokenizer_fingerprint(tmp_path)
    assert base == sentencepiece_identity(model)
    assert tokenizer_fingerprint(tmp_path / "tokenizer.model") == base  # the file names its folder

    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": "{{ messages }}", "model_max_length": 4096})
    )
    assert tokenizer_fingerprint(tmp_path) == base  # nothing that changes what an id means
    decoder = {"32000": {"content": "<tool>", "special": True}}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "x", "added_tokens_decoder": decoder}))
    assert tokenizer_fingerprint(tmp_path) == sentencepiece_identity(model, decoder=decoder) != base
    (tmp_path / "added_tokens.json").write_text(json.dumps({"<extra>": 32001}))
    assert tokenizer_fingerprint(tmp_path) == sentencepiece_identity(
        model, added_tokens={"<extra>": 32001}, decoder=decoder
    )

    (tmp_path / "tokenizer.model").write_bytes(model[:-1] + b"\x00")
    assert tokenizer_fingerprint(tmp_path) != sentencepiece_identity(
        model, added_tokens={"<extra>": 32001}, decoder=decoder
    )

    (tmp_path / "tokenizer.json").write_bytes(b"{}")  # a fast tokenizer beside it is what identifies the folder
    assert tokenizer_fingerprint(tmp_path) == "sha256:" + hashlib.sha256(b"{}").hexdigest()


def test_sentencepiece_folder_with_a_damaged_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.model").write_bytes(b"\x00\x01")
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(BadInputError, match=r"tokenizer_config.json: tokenizer: not valid JSON"):
        tokenizer_fingerprint(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[]")
    with pytest.raises(BadInputError, match=r"tokenizer_config.json: tokenizer: must be a JSON object, got list"):
        tokenizer_fingerprint(tmp_path)


def test_model_fingerprint_ignores_weight_values_and_sharding(tmp_path: Path) -> None:
    """RL updates weights every step and checkpoints get resharded: neither changes the identity."""
    base = model_fingerprint(make_model(tmp_path / "a"))
    assert base.startswith("sha256:") and len(base) == len("sha256:") + 64
    trained = {"embed.weight": np.ones((32, 8), np.float32), "lm_head.weight": np.full((32, 8), 2, np.float32)}
    assert model_fingerprint(make_model(tmp_path / "b", weights=trained)) == base
    assert model_fingerprint(make_model(tmp_path / "c", shards=2)) == base
    reordered = {"vocab_size": 32, "hidden_size": 8, "model_type": "llama"}
    assert model_fingerprint(make_model(tmp_path / "d", config=reordered)) == base


def test_model_fingerprint_tracks_architecture(tmp_path: Path) -> None:
    base = model_fingerprint(make_model(tmp_path / "a"))
    wider = {"embed.weight": np.zeros((32, 16), np.float32), "lm_head.weight": np.zeros((32, 8), np.float32)}
    half = {"embed.weight": np.zeros((32, 8), np.float16), "lm_head.weight": np.zeros((32, 8), np.float32)}
    renamed = {"embed.weight": np.zeros((32, 8), np.float32), "head.weight": np.zeros((32, 8), np.float32)}
    other_config = {"model_type": "llama", "hidden_size": 8, "vocab_size": 33}
    variants = [
        make_model(tmp_path / "b", weights=wider),
        make_model(tmp_path / "c", weights=half),
        make_model(tmp_path / "d", weights=renamed),
        make_model(tmp_path / "e", config=other_config),
    ]
    prints = {model_fingerprint(v) for v in variants}
    assert base not in prints and len(prints) == 4


def test_model_fingerprint_errors(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no config.json"):
        model_fingerprint(tmp_path)
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(BadInputError, match="config.json: not valid JSON"):
        model_fingerprint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    with pytest.raises(BadInputError, match="model.safetensors: header"):
        model_fingerprint(tmp_path)
