"""The policy being trained: a transformers causal LM on CPU, its optimizer, and their files.

Everything written is safetensors or JSON (never pickle): the float32 master weights and the AdamW
moments for a checkpoint, and an export (safetensors + the model's config and
tokenizer) that the running vLLM engine reloads as the next policy version, in the dtype the
engine serves (the base model's, e.g. bfloat16).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from partial_rollout.atomic import atomic_write
from partial_rollout.ledger import GroupEntry
from partial_rollout_integrations.reference_grpo.config import MasterConfig
from partial_rollout_integrations.reference_grpo.grpo import clipped_surrogate_loss, group_advantages, sampled_logprobs

WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
OPTIMIZER_META_FILE = "optimizer.json"
_MODEL_SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")


class Policy:
    """The trainable model; ``model_dir`` is the base model (architecture, tokenizer)."""

    def __init__(self, model_dir: str | Path, config: MasterConfig) -> None:
        self.model_dir = Path(model_dir)
        self.config = config
        torch.manual_seed(config.grpo.seed)
        self.serve_dtype = AutoConfig.from_pretrained(self.model_dir).dtype or torch.float32
        """The dtype the engine serves the weights in (the base model's); training runs in float32."""
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        self.stop_token_ids = min_tokens_stop_ids(self.model_dir)
        """Token ids vLLM masks until a completion reaches ``min_tokens`` (the loss masks them too)."""
        self.model.train()
        opt = config.policy.optimizer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)

    def train_step(self, groups: Sequence[GroupEntry]) -> dict[str, float]:
        """One GRPO update on ``groups`` (all ready: every sample finished and rewarded)."""
        rows, behaviour, rewards, samplings = [], [], [], []
        for group in groups:
            rewards.append([s.reward for s in group.samples])
            for s in group.samples:
                rows.append((group.prompt_token_ids.tolist(), s.token_ids.tolist()))
                behaviour.append(torch.from_numpy(s.logprobs.astype("float32")))
                samplings.append(s.sampling)
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32)).flatten()
        longest = max(len(p) + len(c) for p, c in rows)
        width = max(len(c) for _, c in rows)
        input_ids = torch.full((len(rows), longest), self.model.config.pad_token_id or 0, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        mask = torch.zeros(len(rows), width)
        old = torch.zeros(len(rows), width)
        for r, ((prompt, completion), lp) in enumerate(zip(rows, behaviour, strict=True)):
            seq = prompt + completion
            input_ids[r, : len(seq)] = torch.tensor(seq)
            attention[r, : len(seq)] = 1
            mask[r, : len(completion)] = 1
            old[r, : len(completion)] = lp
        logits = self.model(input_ids=input_ids, attention_mask=attention).logits
        per_row = []
        for r, ((prompt, completion), sampling) in enumerate(zip(rows, samplings, strict=True)):
            # Position j of the completion is predicted by the logits at prompt_len + j - 1, under the
            # distribution the engine sampled it from (the behaviour logprobs are of that distribution).
            n = len(completion)
            lp = sampled_logprobs(
                logits[r, len(prompt) - 1 : len(prompt) - 1 + n],
                torch.tensor(completion, dtype=torch.long),
                sampling,
                stop_token_ids=self.stop_token_ids,
            )
            per_row.append(torch.cat([lp, lp.new_zeros(width - n)]))
        logprobs = torch.stack(per_row)
        loss_cfg = self.config.loss_fn
        loss, metrics = clipped_surrogate_loss(
            logprobs, old, advantages, mask, clip_min=loss_cfg.ratio_clip_min, clip_max=loss_cfg.ratio_clip_max
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.policy.max_grad_norm)
        self.optimizer.step()
        return {"loss": float(loss), "grad_norm": float(grad_norm), **metrics}

    # ---------------------------------------------------------------- files

    def export_for_engine(self, folder: Path) -> Path:
        """Write the current weights as a Hugging Face model folder the engine can reload."""
        folder.mkdir(parents=True, exist_ok=True)
        for name in _MODEL_SIDE_FILES:
            if (self.model_dir / name).is_file():
                shutil.copyfile(self.model_dir / name, folder / name)
        self._save_weights(folder / WEIGHTS_FILE, dtype=self.serve_dtype)
        return folder

    def save(self, folder: Path) -> None:
        """Weights and optimizer state into a checkpoint folder (atomic file by file)."""
        self._save_weights(folder / WEIGHTS_FILE)
        tensors: dict[str, torch.Tensor] = {}
        names = {p: n for n, p in self.model.named_parameters()}
        steps: dict[str, float] = {}
        for param, state in self.optimizer.state.items():
            name = names[param]
            tensors[f"{name}.exp_avg"] = state["exp_avg"].contiguous()
            tensors[f"{name}.exp_avg_sq"] = state["exp_avg_sq"].contiguous()
            steps[name] = float(state["step"])
        with atomic_write(folder / OPTIMIZER_FILE) as tmp:
            save_file(tensors, str(tmp))
        meta = {
            "steps": steps,
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups],
        }
        _write_json(folder / OPTIMIZER_META_FILE, meta)

    def load(self, folder: Path) -> None:
        """Restore what :meth:`save` wrote."""
        self.model.load_state_dict(load_file(str(folder / WEIGHTS_FILE)), strict=True)
        tensors = load_file(str(folder / OPTIMIZER_FILE))
        meta = json.loads((folder / OPTIMIZER_META_FILE).read_text())
        index = {n: i for i, (n, _) in enumerate(self.model.named_parameters())}
        state = {
            index[name]: {
                "step": torch.tensor(step),
                "exp_avg": tensors[f"{name}.exp_avg"],
                "exp_avg_sq": tensors[f"{name}.exp_avg_sq"],
            }
            for name, step in meta["steps"].items()
        }
        groups = [{**g, "params": list(range(len(index)))} for g in meta["param_groups"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})

    def _save_weights(self, path: Path, dtype: torch.dtype = torch.float32) -> None:
        state = {k: v.detach().to(dtype).contiguous() for k, v in self.model.state_dict().items()}
        with atomic_write(path) as tmp:
            save_file(state, str(tmp), metadata={"format": "pt"})


def min_tokens_stop_ids(model_dir: Path) -> frozenset[int]:
    """What vLLM masks until ``min_tokens``: the tokenizer's EOS and the generation config's EOS ids
    (the model config's when there is no generation_config.json, as vLLM falls back)."""
    ids: set[int] = set()
    eos = AutoTokenizer.from_pretrained(model_dir).eos_token_id
    if eos is not None:
        ids.add(int(eos))
    try:
        generation = GenerationConfig.from_pretrained(model_dir)
    except OSError:
        generation = GenerationConfig.from_model_config(AutoConfig.from_pretrained(model_dir))
    more = generation.eos_token_id
    ids.update([more] if isinstance(more, int) else (more or ()))
    return frozenset(ids)


def _write_json(path: Path, value: Any) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=True))
