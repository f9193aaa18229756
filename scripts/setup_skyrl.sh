#!/usr/bin/env bash
# Create .venv-skyrl, the environment SkyRL's controller (its fully async trainer, generator,
# skyrl-gym environments and HTTP inference client) runs in, beside the project's .venv.
#
# Usage: bash scripts/setup.sh && bash scripts/setup_skyrl.sh
#
# SkyRL 0.4.0 caps transformers at 5.16.1 and pins Ray 2.57.0, and its own extras pull CUDA-only
# packages (flash-attn, nixl, vllm, vllm-router, flashinfer), so its controller gets its own
# environment; the vLLM engines stay in .venv. SkyRL reaches them over HTTP only (its
# RemoteInferenceClient, generator.inference_engine.run_engines_locally=false), never as Ray actors,
# so this venv keeps SkyRL's Ray pin instead of matching .venv's. This venv gets:
# - integrations/skyrl/requirements-controller.txt: SkyRL's controller dependencies, pinned (Ray among
#   them);
# - skyrl==0.4.0 from the package index, without dependency resolution and ignoring its
#   Requires-Python (>=3.12): the list above holds what the controller imports;
# - partial-rollout itself, editable and without dependencies: the controller side uses our snapshot
#   and ledger code, which imports without vLLM (the script checks that vLLM is absent);
# - below Python 3.12 only, integrations/nemo_rl/nemo_rl_py311.py and the .pth file that imports it at
#   every interpreter start (the same shim .venv-nemo-rl gets): typing.TypedDict as of 3.12, which
#   SkyRL needs on 3.11 (skyrl/tinker/types.py puts a typing.TypedDict in a pydantic model, and every
#   skyrl.backends import reaches it; pydantic refuses that below 3.12), and asyncio.wait_for as of 3.12.
# It ends by importing SkyRL's fully async trainer, its simulated-trainer variant, its entry point,
# its HTTP inference client, its skyrl-gym generator and skyrl_gym, timed.
#
# The venv is made with the interpreter .venv was made with (Python 3.11 here), not a 3.12 one: the
# CPU torch 2.13.0 wheel this machine holds is for 3.11, and on 3.12 torch would come from PyPI as
# a multi-GB CUDA build. Re-running is cheap: nothing is reinstalled unless the requirements,
# pyproject.toml, the shim, this script, or .venv's Python changed.
#
# Prints one line per step with its time (scripts/lib/steps.sh); pip's output goes to
# .cache/logs/setup-skyrl.log, whose last lines and path are printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh
source scripts/lib/uv.sh

VENV=.venv-skyrl
ENGINE_VENV=.venv
REQUIREMENTS=integrations/skyrl/requirements-controller.txt
NO_DEPS=(skyrl==0.4.0)
SHIM=(integrations/nemo_rl/nemo_rl_py311.py integrations/nemo_rl/nemo_rl_py311.pth)
STAMP="$VENV/.skyrl-controller-installed"
MODULES=(
  skyrl.train.fully_async_trainer
  skyrl.train.fully_async_trainer_sim
  skyrl.train.entrypoints.main_base
  skyrl.backends.skyrl_train.inference_servers.remote_inference_client
  skyrl.train.generators.skyrl_gym_generator
  skyrl_gym
)

if [[ ! -x "$ENGINE_VENV/bin/python" ]]; then
  echo "setup-skyrl: $ENGINE_VENV does not exist; run bash scripts/setup.sh first (this venv takes its Python from it)" >&2
  exit 1
fi
# The engine venv's base interpreter and its Python version, on one line.
read -r BASE_PYTHON PY_VERSION < <("$ENGINE_VENV/bin/python" -c '
import sys
print(sys._base_executable, "%d.%d.%d" % sys.version_info[:3])
')

WANT="python $PY_VERSION $(cat "$REQUIREMENTS" pyproject.toml "${SHIM[@]}" scripts/setup_skyrl.sh | sha256sum | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup-skyrl: $VENV is up to date (python $PY_VERSION)"
  exit 0
fi

start=$(date +%s)
steps_log setup-skyrl setup-skyrl
echo "setup-skyrl: installing SkyRL's pinned controller dependencies ($REQUIREMENTS, a CPU torch and Ray among them), ${NO_DEPS[*]} and partial-rollout (no dependencies) into $VENV (about a minute with a warm uv cache; log: $STEP_LOG)"
if [[ -x "$VENV/bin/python" ]] && ! "$VENV/bin/python" -c "import sys; sys.exit('%d.%d.%d' % sys.version_info[:3] != '$PY_VERSION')"; then
  step "removing $VENV: it was made with another Python than $ENGINE_VENV" rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  step "creating $VENV with $BASE_PYTHON ($PY_VERSION, as $ENGINE_VENV)" "$BASE_PYTHON" -m venv "$VENV"
fi
# --no-compile: Python compiles what it imports when it first imports it, not every module of torch
# and the rest.
PIP=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off --no-compile)
# The CPU torch build the requirements pin comes from this machine's wheel folder (pip's configuration)
# or PyTorch's CPU index, not PyPI: pip installs it, then uv the rest, keeping it (scripts/lib/uv.sh).
TORCH_PIN=$(grep -E '^torch==' "$REQUIREMENTS")
if ! step --may-fail "pip install --no-deps $TORCH_PIN" "${PIP[@]}" --no-deps "$TORCH_PIN"; then
  step "retrying with PyTorch's CPU wheel index for the +cpu torch build" \
    "${PIP[@]}" --no-deps --extra-index-url "${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}" "$TORCH_PIN"
fi
step "uv $UV_VERSION in $UV_HOME" ensure_uv
step "uv pip install -r $REQUIREMENTS" "${UV_PIP[@]}" --python "$VENV/bin/python" -r "$REQUIREMENTS"
step "pip install --no-deps --ignore-requires-python ${NO_DEPS[*]}" \
  "${PIP[@]}" --no-deps --ignore-requires-python "${NO_DEPS[@]}"
# One at a time: it writes partial_rollout.egg-info here.
step "pip install --no-deps -e ." flock .venv/.editable-install.lock "${PIP[@]}" --no-deps -e .

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for file in "${SHIM[@]}"; do
  rm -f "$SITE/$(basename "$file")"
done
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info >= (3, 12))'; then
  cp "${SHIM[@]}" "$SITE/"
fi

step "importing the controller's packages (without vLLM)" "$VENV/bin/python" - <<'PY'
import importlib.metadata
import importlib.util
import os
import sys

import partial_rollout.ledger  # noqa: F401  the controller side of our code must import without vLLM
import partial_rollout.snapshot  # noqa: F401

if importlib.util.find_spec("vllm") is not None:
    sys.exit("setup-skyrl: vllm is importable in the controller venv; it must stay in .venv only")
names = ("skyrl", "skyrl-gym", "torch", "transformers", "ray")
with open(os.environ["STEP_RESULT"], "w") as result:
    result.write(", ".join(f"{name} {importlib.metadata.version(name)}" for name in names))
PY
MODULE_LIST=$(IFS=,; echo "${MODULES[*]}")
step "importing ${MODULE_LIST//,/, }" "$VENV/bin/python" -c "import sys; import $MODULE_LIST; sys.exit('vllm' in sys.modules)"
echo "$WANT" > "$STAMP"
echo "setup-skyrl: done in $(( $(date +%s) - start )) s; $VENV is $(du -sh "$VENV" | cut -f1)"
