#!/usr/bin/env bash
# Install the project (scripts/setup.sh) and run the whole test suite against a real vLLM engine.
#
# Usage: bash scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
