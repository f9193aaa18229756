#!/usr/bin/env bash
# Does `pip install 'partial-rollout[gpu]'` resolve against a given vLLM release? A dry run of pip's
# resolver in a throwaway venv (nothing is installed; a few minutes and a few hundred MB of metadata
# and wheels the first time), printing the vLLM, torch and FlashInfer it would install.
#
# Usage: bash scripts/check_gpu_extra.sh [VERSION ...]        (default: 0.30.0 0.34.0)
#        FIND_LINKS=/folder/of/wheels bash scripts/check_gpu_extra.sh 0.34.0
#
# vLLM 0.34.0 pins flashinfer-python==0.7.3, which PyPI does not have (it lists 0.7.2.post1 and 0.7.4;
# seen 2026-12-06), so `pip install vllm==0.34.0` fails from PyPI alone, with or without this project.
# FIND_LINKS points pip at a folder holding that wheel (FlashInfer's own index has it); for a check of
# the resolution alone, a wheel named flashinfer-python 0.7.3 built from an empty project will do.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(0.30.0 0.34.0)
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
extra=()
[[ -n "${FIND_LINKS:-}" ]] && extra=(--find-links "$FIND_LINKS")
status=0
for version in "${VERSIONS[@]}"; do
  report="$venv/report-$version.json"
  log="$venv/pip-$version.log"
  if "$venv/bin/pip" install --disable-pip-version-check --dry-run --ignore-installed --quiet \
    "${extra[@]}" --report "$report" ".[gpu]" "vllm==$version" >"$log" 2>&1; then
    "$venv/bin/python" - "$report" "$version" <<'PY'
import json, sys
report, version = json.load(open(sys.argv[1])), sys.argv[2]
names = {i["metadata"]["name"]: i["metadata"]["version"] for i in report["install"]}
picked = ", ".join(f"{n} {names[n]}" for n in ("vllm", "torch", "flashinfer-python") if n in names)
print(f"vLLM {version}: resolves ({len(names)} packages: {picked})")
PY
  else
    echo "vLLM $version: does not resolve: $(grep '^ERROR' "$log" | tail -1 | cut -c1-300)"
    status=1
  fi
done
exit "$status"
