#!/usr/bin/env bash
# train_bench.sh - LoRA training speed on the GPU machine (issue 16's table): random-weight Qwen3-0.6B and
# Llama-3.1-8B bf16 models (bench/make_random_model.py), `lmx bench-train` (rank 16, all seven
# projections, sequence 2048, checkpointing on) with the attention backward's flash form and, for
# comparison, its tiled cuBLAS form (LMX_CUDA_ATTN_BWD_ROWS=512), and with `hf` last also HF transformers
# + peft on the same weights (bench/hf_train.py, SDPA, checkpointing).  Each run's output in OUT_DIR/NAME-FORM.txt.
# usage: bench/train_bench.sh LMX OUT_DIR [hf]
set -u
lmx=$1 out=$2 hf=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" /tmp/lmxb
for spec in "qwen3-0.6b 8" "llama-3.1-8b 4"; do
    set -- $spec
    name=$1 batch=$2 dir=/tmp/lmxb/$1
    [ -f "$dir/config.json" ] || python3 "$root/bench/make_random_model.py" "$name" "$dir" >"$out/make.log" 2>&1 ||
        { echo "make_random_model $name failed"; tail -3 "$out/make.log"; continue; }
    for form in flash tiled; do
        env=(); [ $form = tiled ] && env=(LMX_CUDA_ATTN_BWD_ROWS=512)
        echo "== $name batch $batch, attention backward $form"
        env "${env[@]}" "$lmx" bench-train "$dir" --backend cuda --batch "$batch" --seq 2048 --steps 3 \
            --grad-checkpoint on --profile 2>&1 | tee "$out/$name-$form.txt"
    done
    if [ "$hf" = hf ]; then
        echo "== $name batch $batch, HF transformers + peft"
        python3 "$root/bench/hf_train.py" "$dir" --batch "$batch" --seq 2048 --steps 3 --checkpointing 2>&1 |
            tail -1 | tee "$out/$name-hf.txt"
    fi
done
