#!/usr/bin/env bash
# Install the project (scripts/setup.sh, and NeMo RL's controller environment with
# scripts/setup_nemo_rl.sh), check lint, format and types, then run the whole test suite against a
# real vLLM engine. The NeMo RL tests run when NEMO_RL_SRC points at a NeMo RL checkout (it defaults
# to ../shared/third_party/nemo-rl where that exists) and skip otherwise.
#
# Usage: bash scripts/test.sh [pytest args...]      e.g. -m "not engine" for the fast loop
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [[ -z "${NEMO_RL_SRC:-}" && -d ../shared/third_party/nemo-rl ]]; then
  export NEMO_RL_SRC="$PWD/../shared/third_party/nemo-rl"
fi
if [[ -n "${NEMO_RL_SRC:-}" ]]; then
  bash scripts/setup_nemo_rl.sh
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy checks integrations/ under its installed name, through this link (pyproject.toml's [tool.mypy] says why).
mkdir -p .venv/mypy-path && ln -sfn ../../integrations .venv/mypy-path/partial_rollout_integrations
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
