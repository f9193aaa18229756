#!/usr/bin/env bash
# Install the project (scripts/setup.sh), check lint, format and types, then run the whole test
# suite against a real vLLM engine.
#
# Usage: bash scripts/test.sh [pytest args...]      e.g. -m "not engine" for the fast loop
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
