"""Tiny random-weight causal LMs with a locally trained byte-level BPE tokenizer.

Nothing here touches the network: the tokenizer is trained on text generated from a fixed seed,
the weights are drawn from a fixed seed, and the result is cached under a folder named by the hash
of everything that went into it. The same spec gives byte-identical files on every machine with
the same library versions, so tests, the demo and the benchmarks agree on one model.

Usage::

    python -m partial_rollout.models.tiny [--arch llama|qwen2] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

BUILDER_VERSION = 3
"""Bumped whenever the build recipe changes, so old cache entries are not reused."""

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, ENDOFTEXT)
"""Special tokens, in id order: bos=0, eos=1, pad=2. transformers loads a Qwen2 model's tokenizer
as ``Qwen2Tokenizer``, which adds ``<|endoftext|>`` past the vocabulary unless it already exists,
so it gets id 3 here."""

SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Head sizes vLLM's CPU attention backend accepts (head_dim=16 fails at engine start)."""

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    """What a tiny model is made of; its hash names the cache folder."""

    arch: Literal["llama", "qwen2"] = "llama"
    """Transformer family; both are served by vLLM's standard decoder implementations."""
    hidden_size: int = 128
    """Model width; ``hidden_size // num_heads`` must be a head size vLLM's CPU attention supports."""
    num_layers: int = 2
    """Decoder layers."""
    num_heads: int = 4
    """Attention heads."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention when fewer than ``num_heads``)."""
    intermediate_size: int = 256
    """MLP width."""
    vocab_size: int = 512
    """Tokenizer vocabulary size, special tokens included; also the embedding size."""
    max_position_embeddings: int = 4096
    """Longest sequence the model's rotary embedding is configured for."""
    init_range: float = 0.2
    """Std of the random init; large enough that sampling is far from degenerate."""
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    """Dtype of the saved weights."""
    seed: int = 1234
    """Seed of the weights and of the tokenizer's training text."""

    def __post_init__(self) -> None:
        if self.arch not in _ARCHITECTURES:
            raise ValueError(f"arch={self.arch!r} is not supported; choose one of {sorted(_ARCHITECTURES)}")
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must divide by num_heads={self.num_heads}, "
                f"which must divide by num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim not in SUPPORTED_HEAD_DIMS:
            raise ValueError(
                f"head_dim={self.head_dim} (hidden_size/num_heads) is not supported by vLLM's CPU "
                f"attention; use one of {SUPPORTED_HEAD_DIMS}"
            )
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size={self.vocab_size} is too small: byte-level BPE needs 256 bytes + specials")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"dtype={self.dtype!r} must be 'bfloat16' or 'float32'")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def digest(self) -> str:
        """Hash of the spec, the recipe version and the library versions that shape the files."""
        import tokenizers
        import torch
        import transformers

        payload = {
            "spec": dataclasses.asdict(self),
            "builder": BUILDER_VERSION,
            "versions": [torch.__version__, transformers.__version__, tokenizers.__version__],
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def default_cache_dir() -> Path:
    """Where built models live: ``$PARTIAL_ROLLOUT_CACHE``, else the checkout's ``.cache/``.

    Installed outside a source checkout, falls back to ``~/.cache/partial-rollout``.
    """
    env = os.environ.get("PARTIAL_ROLLOUT_CACHE")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    if (repo / "pyproject.toml").is_file():
        return repo / ".cache"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "partial-rollout"


def _training_text(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic English-like text with digits and arithmetic, so the BPE learns useful merges."""
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "ra", "tu", "shi", "po", "an", "el", "or", "us", "the", "ing", "er"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 3))) for _ in range(300)]
    words += ["the", "a", "is", "of", "and", "to", "answer", "sum", "plus", "minus", "count", "reverse"]
    out = []
    for _ in range(lines):
        kind = rng.random()
        if kind < 0.5:
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 14))) + ".")
        elif kind < 0.8:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            out.append(f"{a} + {b} = {a + b}")
        else:
            out.append(" ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(2, 10))))
    return out


def _build_tokenizer(spec: TinyModelSpec, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    if spec.arch == "qwen2":
        # transformers (and so vLLM) always load a Qwen2 model's tokenizer as Qwen2Tokenizer, which
        # rebuilds the pipeline from vocab + merges with its own normalizer and split pattern; train
        # with the same pipeline so tokenizer.json and the loaded tokenizer encode alike.
        from tokenizers import Regex, normalizers
        from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_training_text(spec.seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)
    fast.save_pretrained(out)


def _build_weights(spec: TinyModelSpec, out: Path, vocab_size: int) -> None:
    import torch
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_range,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        torch_dtype=spec.dtype,
    )
    if spec.arch == "llama":
        config = transformers.LlamaConfig(head_dim=spec.head_dim, **common)
        model_cls = transformers.LlamaForCausalLM
    else:
        config = transformers.Qwen2Config(use_sliding_window=False, **common)
        model_cls = transformers.Qwen2ForCausalLM
    torch.manual_seed(spec.seed)
    model = model_cls(config).to(getattr(torch, spec.dtype))
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)


def build_tiny_model(spec: TinyModelSpec | None = None, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Return the folder of the tiny model described by ``spec``, building it on first use.

    Concurrent builders (pytest workers, Ray actors) are safe: each builds in a private temporary
    folder and the first rename wins.
    """
    spec = spec or TinyModelSpec()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = root / "models" / f"tiny-{spec.arch}-{spec.digest()[:16]}"
    if (target / "spec.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _build_tokenizer(spec, tmp)
        from tokenizers import Tokenizer

        vocab_size = Tokenizer.from_file(str(tmp / "tokenizer.json")).get_vocab_size()
        _build_weights(spec, tmp, vocab_size)
        # spec.json is written last: its presence marks a complete build.
        (tmp / "spec.json").write_text(json.dumps(dataclasses.asdict(spec), indent=2, sort_keys=True) + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "spec.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", choices=sorted(_ARCHITECTURES), default="llama")
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args(argv)
    print(build_tiny_model(TinyModelSpec(arch=args.arch), args.cache_dir))


if __name__ == "__main__":
    main()
