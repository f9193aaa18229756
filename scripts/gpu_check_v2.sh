#!/usr/bin/env bash
# UNTESTED: written without a GPU; nobody has run it yet. Expect to fix it.
#
# The GPU check of the engine adapter on vLLM's Model Runner V2, the default runner of every GPU
# engine: for each vLLM release, a tiny model on one GPU, then `partial-rollout check-resume`:
# a reference run, a run cut while its requests decode (no pause) and killed with SIGKILL right
# after its snapshot is written, and a fresh engine that continues every saved prefix. It prints
# what the probe found (runner module, sampler family, exactness), check-resume's verdict (token
# identity of the continued samples against the uninterrupted run, next to the noise floor) and
# how long the cut and the write took and the decode steps the engine ran meanwhile (it is not paused).
#
# Usage, on a Linux x86_64 machine with one NVIDIA GPU and Python 3.12:
#   bash scripts/gpu_check_v2.sh                  # vLLM 0.25.1 and 0.34.0, from the package index
#   VLLM_VERSIONS="0.30.0" bash scripts/gpu_check_v2.sh
#   WHEELS=/path/to/wheels bash scripts/gpu_check_v2.sh   # offline: every wheel needed, in one folder
# Environment: OUT (results, default /tmp/partial_rollout_gpu_check_v2), VLLM_VERSIONS, WHEELS, PYTHON.
# Exit status: 0 when every release's verdict passed.
#
# Why it has not run on the project's lent GPU machine (the `device` tool): that machine reaches no
# package index and a call carries at most 64 MiB, while each release needs its own torch: vLLM 0.25.1
# pins torch 2.11.0 and 0.34.0 pins torch 2.14.0 (each a CUDA wheel of several hundred MB), and the
# vllm wheels alone are 250 MB (0.25.1) and 239 MB (0.34.0); vLLM 0.34.0 also pins flashinfer-python
# 0.7.3, which PyPI does not have (0.7.2.post1 and 0.7.4 only, seen 2026-12-06), so even with an index
# it installs only where that wheel is found (FlashInfer's own index). Carrying about 2 GB in 64 MiB
# calls does not fit the session's 15 minutes of device time.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/partial_rollout_gpu_check_v2}
VERSIONS=${VLLM_VERSIONS:-0.25.1 0.34.0}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_check_v2: no NVIDIA GPU answers nvidia-smi"; exit 1; }

status=0
for version in $VERSIONS; do
  venv="$OUT/venv-$version"
  log="$OUT/install-$version.log"
  echo "== vLLM $version: installing into $venv (log: $log)"
  [[ -x "$venv/bin/python" ]] || "$PYTHON" -m venv "$venv"
  pip=("$venv/bin/pip" install --disable-pip-version-check -q)
  [[ -n "${WHEELS:-}" ]] && pip+=(--no-index --find-links "$WHEELS")
  if ! { "${pip[@]}" "vllm==$version" && "${pip[@]}" --no-deps -e "$REPO"; } >"$log" 2>&1; then
    echo "== vLLM $version: install failed"; tail -20 "$log"; status=1; continue
  fi
  py="$venv/bin/python"
  model=$("$py" -c 'from partial_rollout.models.tiny import TinyModelSpec, build_tiny_model; print(build_tiny_model(TinyModelSpec(arch="llama")))')
  echo "== vLLM $version: what the engine adapter finds"
  "$py" - "$model" <<'PY' | tee "$OUT/capabilities-$version.txt"
import asyncio, sys
from partial_rollout.engine import EngineConfig, ResumableEngine

async def main() -> None:
    engine = await ResumableEngine.start(EngineConfig(model=sys.argv[1], max_model_len=2048))
    caps = await engine.capabilities()
    await engine.shutdown()
    print(f"build {caps.vllm_build}; runner {caps.runner}; sampler {caps.sampler}; exact {caps.exact}; "
          f"verified weight updates {caps.verified_updates}; reason {caps.reason}")
    if "vllm.v1.worker.gpu.model_runner" not in caps.runner:
        print("NOT Model Runner V2: this check is about V2 (is VLLM_USE_V2_MODEL_RUNNER=0 set?)")

asyncio.run(main())
PY
  echo "== vLLM $version: check-resume (cut while decoding, SIGKILL, resume)"
  if ! "$venv/bin/partial-rollout" check-resume --model "$model" --requests 32 --max-tokens 512 \
      --keep "$OUT/check-$version" | tee "$OUT/check-resume-$version.txt"; then
    status=1
  fi
done
echo "== results under $OUT"
exit "$status"
