#!/usr/bin/env bash
# train_bench.sh - LoRA training speed on the GPU machine (issue 16's table): random-weight Qwen3-0.6B and
# Llama-3.1-8B bf16 models (bench/make_random_model.py), `lmx bench-train` (rank 16, all seven
# projections, sequence 2048) with checkpointing on, off and by default (auto: off where the step fits
# the GPU), at the batches of the table; with `hf` last also HF transformers + peft on the same weights
# (bench/hf_train.py, SDPA) with and without checkpointing.  Each run's output in OUT_DIR/NAME-B-FORM.txt.
# usage: bench/train_bench.sh LMX OUT_DIR [hf]
set -u
lmx=$1 out=$2 hf=${3:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" /tmp/lmxb
# name, then "batch:checkpointing" runs of lmx, then "batch:checkpointing" runs of HF
for spec in "qwen3-0.6b 8:on 8:off 16:auto / 8:on 8:off" "llama-3.1-8b 4:on 2:on 2:off 4:auto 6:auto 8:auto / 4:on 2:on 2:off"; do
    set -- $spec
    name=$1 dir=/tmp/lmxb/$1
    shift
    [ -f "$dir/config.json" ] || python3 "$root/bench/make_random_model.py" "$name" "$dir" >"$out/make.log" 2>&1 ||
        { echo "make_random_model $name failed"; tail -3 "$out/make.log"; continue; }
    engine=lmx
    for run in "$@"; do
        [ "$run" = / ] && { engine=hf; continue; }
        batch=${run%:*} ck=${run#*:}
        if [ $engine = lmx ]; then
            echo "== $name batch $batch, checkpointing $ck, lmx"
            "$lmx" bench-train "$dir" --backend cuda --batch "$batch" --seq 2048 --steps 3 --grad-checkpoint "$ck" 2>&1 |
                grep -v '^step' | tee "$out/$name-$batch-$ck.txt"
        elif [ "$hf" = hf ]; then
            echo "== $name batch $batch, checkpointing $ck, HF transformers + peft"
            flag=(); [ "$ck" = on ] && flag=(--checkpointing)
            python3 "$root/bench/hf_train.py" "$dir" --batch "$batch" --seq 2048 --steps 3 "${flag[@]}" 2>&1 |
                tail -1 | tee "$out/$name-$batch-$ck-hf.txt"
        fi
    done
done
