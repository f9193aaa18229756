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
from transformers import AutoConfig, AutoModelForCausalLM

from partial_rollout.atomic import atomic_write
from partial_rollout.snapshot import GroupRecord
from partial_rollout_integrations.reference_grpo.config import MasterConfig
from partial_rollout_integrations.reference_grpo.grpo import clipped_surrogate_loss, group_advantages

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
        self.model.train()
        opt = config.policy.optimizer
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay)

    def train_step(self, groups: Sequence[GroupRecord]) -> dict[str, float]:
        """One GRPO update on ``groups`` (all ready: every sample finished and rewarded)."""
        rows, behaviour, rewards = [], [], []
        for group in groups:
            rewards.append([s.reward for s in group.samples])
            for s in group.samples:
                rows.append((group.prompt_token_ids.tolist(), s.token_ids.tolist()))
                behaviour.append(torch.from_numpy(s.logprobs.astype("float32")))
        advantages = group_advantages(torch.tensor(rewards, dtype=torch.float32)).flatten()
        longest = max(len(p) + len(c) for p, c in rows)
        width = max(len(c) for _, c in rows)
        input_ids = torch.full((len(rows), longest), self.model.config.pad_token_id or 0, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        # Position j of the completion is predicted by the logits at prompt_len + j - 1.
        gather_at = torch.zeros(len(rows), width, dtype=torch.long)
        targets = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width)
        old = torch.zeros(len(rows), width)
        for r, ((prompt, completion), lp) in enumerate(zip(rows, behaviour, strict=True)):
            seq = prompt + completion
            input_ids[r, : len(seq)] = torch.tensor(seq)
            attention[r, : len(seq)] = 1
            n = len(completion)
            gather_at[r, :n] = torch.arange(len(prompt) - 1, len(prompt) - 1 + n)
            targets[r, :n] = torch.tensor(completion)
            mask[r, :n] = 1
            old[r, :n] = lp
        logits = self.model(input_ids=input_ids, attention_mask=attention).logits
        picked = logits.gather(1, gather_at.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        logprobs = torch.log_softmax(picked.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        loss_cfg = self.config.loss_fn
        loss, metrics = clipped_surrogate_loss(
            logprobs, old, advantages, mask, clip_min=loss_cfg.ratio_clip_min, clip_max=loss_cfg.ratio_clip_max
        )
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
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


def _write_json(path: Path, value: Any) -> None:
    with atomic_write(path) as tmp:
        tmp.write_text(json.dumps(value, indent=2, sort_keys=True))
