#!/usr/bin/env bash
# train_placement_check.sh - where training keeps things changes no value: `lmx train --backend ${BACKEND:-cuda}` on the
# llama (tied embeddings) and qwen3 (untied) fixtures and tests/data/train's llama_hd64, checkpointed, with the
# layers' inputs and the embedding table in host memory (--offload on --embed-host on, the defaults) and on the
# device (off off), must print the
# same losses digit for digit at every step and validation, and write the same adapter byte for byte (offload
# narrows to bf16 as the device keep does; the embed kernel reads the same table).  Run by scripts/cuda_device_check.sh on a GPU machine.
# usage: tests/train_placement_check.sh LMX FIXTURES   (BACKEND=cpu: on the cpu, where both placements are the host)
set -u
lmx=$1 fix=$(cd "$2" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
names=(Zor Kel Mip Tav Rux Bel Quo Dax) colors=(red blue green gold)
mkdir -p "$tmp/data"
for i in $(seq 0 31); do
    n=$((i * 5 % 8))
    echo "{\"prompt\": \"color of ${names[$n]}?\", \"completion\": \"${colors[$((n % 4))]}\"}"
done >"$tmp/data/train.jsonl"
head -8 "$tmp/data/train.jsonl" >"$tmp/data/valid.jsonl"
# and tests/data/train's llama_hd64: heads of 64, whose q, k, v a layer run again takes straight into its keeps
for m in llama qwen3 llama_hd64; do
    src=$fix/models/$m
    [ $m = llama_hd64 ] && src=$root/tests/data/train/$m
    mkdir -p "$tmp/$m"
    for f in "$src"/*; do ln -s "$f" "$tmp/$m/"; done
    cp "$root"/tests/data/bridge/tokenizer.json "$root"/tests/data/bridge/tokenizer_config.json "$tmp/$m/"
    for place in on off; do
        "$lmx" train "$tmp/$m" --data "$tmp/data" --adapter-out "$tmp/out-$m-$place" --iters 6 --batch-size 4 --lr 1e-2 \
            --rank 4 --mask-prompt --eval-every 3 --backend ${BACKEND:-cuda} --grad-checkpoint on --offload $place --embed-host $place \
            >"$tmp/$m-$place.log" 2>&1 || { echo "FAIL: lmx train ($m, placement $place)"; tail -3 "$tmp/$m-$place.log"; fail=1; }
        grep -o 'loss [0-9][0-9.]*' "$tmp/$m-$place.log" >"$tmp/$m-$place.loss"
    done
    n=$(wc -l <"$tmp/$m-on.loss")
    a=$tmp/out-$m-on/peft/adapter_model.safetensors b=$tmp/out-$m-off/peft/adapter_model.safetensors
    if [ "$n" -lt 8 ] || ! cmp -s "$tmp/$m-on.loss" "$tmp/$m-off.loss"; then
        echo "FAIL: $m: the losses with the inputs and the table in host memory differ from those on the device"
        paste "$tmp/$m-on.loss" "$tmp/$m-off.loss" | head -5
        fail=1
    elif ! cmp -s "$a" "$b"; then
        echo "FAIL: $m: the trained adapters differ (host and device placement)"
        fail=1
    else
        echo "$m: $n losses and the trained adapter the same with host and device placement ($(tail -1 "$tmp/$m-on.loss"))"
    fi
done
[ $fail = 0 ] && echo "train placement check: PASS"
exit $fail
