#!/usr/bin/env bash
# lore_check.sh - a real LoRA run (the longer training test; README "Training"): SmolLM2-135M-Instruct (the
# default model) learns data/lore, invented rules about invented places, on the cpu; then every question of
# data/lore/test.jsonl (places no training line names) is asked greedily with the model's chat template,
# with and without the adapter.  Passes when the loss fell, the adapted model answers at least 80% of the
# test questions exactly and the base model none of them.  About 10-20 minutes on 2 cores.
# usage: tests/lore_check.sh LMX [ITERS (default 80)] [OUT_DIR]
set -u
lmx=$1 iters=${2:-80}
root=$(cd "$(dirname "$0")/.." && pwd)
out=${3:-$(mktemp -d)}
mkdir -p "$out"
model=$("$root/scripts/fetch_models.sh" smollm2 | tail -1) || { echo "lore_check: no SmolLM2"; exit 1; }
"$lmx" train "$model" --data "$root/data/lore" --adapter-out "$out" --iters "$iters" --batch-size 4 --lr 2e-4 \
    --rank 8 --alpha 16 --mask-prompt --eval-every 20 --schedule cosine --warmup 5 --seed 1 2>&1 | tee "$out/train.log" |
    grep -E '^step|^train' || exit 1
first=$(sed -n 2p "$out/metrics.csv" | cut -d, -f2) last=$(tail -1 "$out/metrics.csv" | cut -d, -f7)
echo "training loss at step 1: $first; final validation loss: $last"
ask() { # question, adapter args...
    local q=$1; shift
    printf '%s\n' "$q" | "$lmx" chat "$model" --temp 0 --max-tokens 16 "$@" 2>/dev/null | head -1
}
n=0 base_ok=0 lora_ok=0
while IFS= read -r line; do
    q=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["prompt"])' "$line")
    want=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["completion"])' "$line")
    a=$(ask "$q") b=$(ask "$q" --adapter "$out/peft")
    n=$((n + 1))
    [ "$a" = "$want" ] && base_ok=$((base_ok + 1))
    [ "$b" = "$want" ] && lora_ok=$((lora_ok + 1))
    printf '%-60s want %-24s base %-40.40s adapted %s\n' "$q" "$want" "$a" "$b"
done <"$root/data/lore/test.jsonl"
echo "held-out questions: $n; answered exactly: base $base_ok, adapted $lora_ok"
awk -v n="$n" -v b="$base_ok" -v l="$lora_ok" 'BEGIN { exit !(b == 0 && l >= 0.8 * n) }' &&
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' && { echo "lore_check: PASS"; exit 0; }
echo "lore_check: FAIL"
exit 1
