# shellcheck shell=bash
# uv for the environment scripts' large installs (setup_vllm_matrix.sh, setup_verl.sh,
# setup_nemo_rl.sh), sourced from the repository root after scripts/lib/steps.sh, with ENGINE_VENV set:
#
#   step "uv ..." ensure_uv      installs uv UV_VERSION into UV_HOME once, with ENGINE_VENV's pip (the
#                                environments are set up at once: one installs, the others wait)
#   "${UV_PIP[@]}" --python PYTHON ARG...   uv pip install ARG... into PYTHON's environment
#
# uv resolves and installs several times faster than pip, and its cache under UV_CACHE hard-links one
# copy of each wheel's files into every environment: in a fresh run here beside a verl test, the
# vLLM matrix's two environments took 153 s and 192 s at once where pip took 396 s and 444 s, and
# verl's controller requirements 33 s against pip's 189 s. uv reads no pip configuration (a machine's
# wheel folder or extra index): the scripts install what must come from there, the CPU torch builds,
# with pip first, and uv keeps an installed package that satisfies a requirement.

UV_VERSION=0.13.10
UV_HOME=.cache/tools/uv-$UV_VERSION
UV_CACHE=.cache/uv

ensure_uv() {
  mkdir -p .cache/tools
  flock .cache/tools/.uv.lock bash -c '
    [[ -x "$1/bin/uv" ]] && exit 0
    rm -rf "$1.partial"
    "$2/bin/pip" install --disable-pip-version-check --progress-bar off --target "$1.partial" "uv==$3" &&
      mv "$1.partial" "$1"' _ "$UV_HOME" "$ENGINE_VENV" "$UV_VERSION"
}
UV_PIP=("$UV_HOME/bin/uv" pip install --cache-dir "$UV_CACHE" --link-mode hardlink --no-config)
