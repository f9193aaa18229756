"""The policy of the trainers' CPU harnesses: real weights that each fake training step moves.

Nothing trains on CPU here, yet a resume after a weight update must meet real new weights, or the
on-policy checks (no KV of old weights, per-token versions) test nothing. So each step adds seeded
noise to every floating-point weight, and each version is written once as a model folder the
engines load (``config.json`` and ``model.safetensors``, renamed into place whole).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

VERSION_FILE = "version.json"
"""Beside a checkpoint's ``model.safetensors``: the version those weights are."""


class NoisyPolicy:
    """Weights, their version, and the model folder of that version (see the module docstring)."""

    def __init__(
        self, model_dir: Path, work_dir: Path, *, noise: float, version: int = 0, weights_from: Path | None = None
    ) -> None:
        """
        Args:
            model_dir: the model the run starts from (its ``config.json`` goes into every version).
            work_dir: where each version's model folder is written, as ``v<version>``.
            noise: the standard deviation of a step's noise.
            version: the version the starting weights are.
            weights_from: a folder whose ``model.safetensors`` holds the starting weights (a
                resumed run's checkpoint); ``None``: ``model_dir``'s.
        """
        self._model_dir = model_dir
        self._work_dir = work_dir
        self._noise = noise
        self.version = version
        self.weights = load_file(str((weights_from or model_dir) / "model.safetensors"))
        self.weights_dir = self._write()

    def step(self) -> None:
        """One fake training step: the next version, seeded by its number (a resumed run repeats it)."""
        self.version += 1
        gen = torch.Generator().manual_seed(self.version)
        self.weights = {
            k: (v.float() + self._noise * torch.randn(v.shape, generator=gen)).to(v.dtype)
            if v.is_floating_point()
            else v
            for k, v in self.weights.items()
        }
        self.weights_dir = self._write()

    def _moved(self, weight: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        return (weight.float() + self._noise * torch.randn(weight.shape, generator=gen)).to(weight.dtype)

    def save(self, folder: str | os.PathLike[str], **extra: Any) -> None:
        """Write the weights and their version (with ``extra`` beside it) into a trainer checkpoint's ``folder``."""
        os.makedirs(folder, exist_ok=True)
        save_file(self.weights, os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, VERSION_FILE), "w") as f:
            json.dump({"version": self.version, **extra}, f)

    def load(self, folder: str | os.PathLike[str]) -> None:
        """Take the weights and version a :meth:`save` wrote into ``folder``."""
        self.weights = load_file(os.path.join(folder, "model.safetensors"))
        with open(os.path.join(folder, VERSION_FILE)) as f:
            self.version = int(json.load(f)["version"])
        self.weights_dir = self._write()

    def _write(self) -> Path:
        folder = self._work_dir / f"v{self.version}"
        if not (folder / "model.safetensors").is_file():
            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            shutil.copy(self._model_dir / "config.json", tmp / "config.json")
            save_file(self.weights, str(tmp / "model.safetensors"))
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        return folder
