#!/usr/bin/env bash
# Alternating runs of lmx (bench_model) and llama.cpp (llamacpp_bench.py) on the two real GGUF
# models, same prompt / decode lengths and thread count, one JSON line per run.
# usage: bench/compare_llamacpp.sh BENCH_MODEL_BIN [ROUNDS] [THREADS]
#   LLAMACPP_PYTHONPATH: where llama-cpp-python is installed (default /root/.cache/lmx/llamacpp)
set -euo pipefail
bin=$1 rounds=${2:-3} threads=${3:-2}
here=$(cd "$(dirname "$0")" && pwd)
pp=${LLAMACPP_PYTHONPATH:-/root/.cache/lmx/llamacpp}
smol=$("$here/../scripts/fetch_models.sh" --cached smollm2) gemma=$("$here/../scripts/fetch_models.sh" --cached gemma3)
for r in $(seq "$rounds"); do
    for m in "$smol" "$gemma"; do
        "$bin" "$m" --json --threads "$threads"
        PYTHONPATH=$pp python3 "$here/llamacpp_bench.py" "$m" 128 64 "$threads" 3 2>/dev/null
    done
done
