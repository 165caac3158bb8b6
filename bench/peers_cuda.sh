#!/usr/bin/env bash
# The peer engines on the GPU machine, on the same random-weight models as `lmx bench`:
# llama.cpp (built with CUDA from the llama-cpp-python 0.3.36 source distribution, trimmed of docs
# and non-CUDA backends into .peer/llamacpp-min.tar.xz, which travels with `carry`) and
# HF transformers (bench/hf_decode.py).
#   bench/peers_cuda.sh build            # build llama-bench + llama-quantize into /tmp/peer (~5 min;
#                                        # outside the repo, since a carried .peer replaces its folder)
#   bench/peers_cuda.sh run MODEL_DIR... # GGUF F16 + Q4_0 of each model, llama-bench pp512/pp2048/tg128
set -euo pipefail
peer=/tmp/peer
case "$1" in
build)
    mkdir -p "$peer/src" && tar xJf .peer/llamacpp-min.tar.xz -C "$peer/src"
    cmake -S "$peer/src/llama.cpp" -B "$peer/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
        -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$peer/build" -j16 --target llama-bench llama-quantize 2>&1 | tail -2
    ;;
run)
    shift
    export PYTHONPATH=$peer/src/llama.cpp/gguf-py
    for dir in "$@"; do
        name=$(basename "$dir")
        python3 bench/write_gguf.py "$dir" "/tmp/$name-f16.gguf"
        "$peer/build/bin/llama-quantize" "/tmp/$name-f16.gguf" "/tmp/$name-q4_0.gguf" Q4_0 >/dev/null 2>&1
        for q in f16 q4_0; do
            "$peer/build/bin/llama-bench" -m "/tmp/$name-$q.gguf" -ngl 99 -p 512,2048 -n 128 -r 3 2>&1 |
                grep -E "^\|" | sed "s/^/$name $q /"
        done
        rm -f "/tmp/$name-f16.gguf" "/tmp/$name-q4_0.gguf"
    done
    ;;
esac
