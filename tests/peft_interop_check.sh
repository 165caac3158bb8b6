#!/usr/bin/env bash
# peft_interop_check.sh - an adapter lmx trains loads in HF transformers + peft with the same logits: `lmx
# train` on the llama fixture (byte-level tokenizer of tests/data/bridge, a small prompt/completion set,
# 20 steps: B is no longer 0), then tests/ref/make_peft_reference.py computes the fixture's reference
# sequences with transformers + PeftModel on OUT/peft, and `lmx check-reference --adapter OUT/peft` must
# match it at the fixtures' float32 tolerance.  Needs torch, transformers and peft (the GPU machine has
# them): exits 77 (skipped) without.
# usage: tests/peft_interop_check.sh LMX FIXTURES [--backend cpu|cuda]
set -u
lmx=$1 fix=$2 backend=${4:-cpu}
[ "${3:-}" = "--backend" ] || backend=cpu
root=$(cd "$(dirname "$0")/.." && pwd)
python3 -c 'import torch, transformers, peft' 2>/dev/null || { echo "skip: torch, transformers and peft are not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/model" "$tmp/data"
for f in "$fix"/models/llama/*; do ln -s "$f" "$tmp/model/"; done
cp "$root"/tests/data/bridge/tokenizer.json "$root"/tests/data/bridge/tokenizer_config.json "$tmp/model/"
for i in $(seq 0 31); do echo "{\"prompt\": \"item $((i % 8))?\", \"completion\": \"value $((i * 3 % 5))\"}"; done >"$tmp/data/train.jsonl"
"$lmx" train "$tmp/model" --data "$tmp/data" --adapter-out "$tmp/out" --iters 20 --batch-size 8 --lr 1e-2 --rank 4 \
    --backend "$backend" 2>"$tmp/train.log" || { echo "FAIL: lmx train"; tail -3 "$tmp/train.log"; exit 1; }
python3 "$root/tests/ref/make_peft_reference.py" "$fix/models/llama" "$tmp/out/peft" \
    "$fix/models/llama/reference.safetensors" "$tmp/ref.safetensors" || { echo "FAIL: transformers + peft"; exit 1; }
"$lmx" check-reference "$fix/models/llama" --backend cpu --adapter "$tmp/out/peft" --reference "$tmp/ref.safetensors" ||
    { echo "FAIL: lmx and transformers + peft differ on the adapter lmx trained"; exit 1; }
# and the adapter moved the logits: the base model alone must not match the reference
if "$lmx" check-reference "$fix/models/llama" --backend cpu --reference "$tmp/ref.safetensors" >/dev/null 2>&1; then
    echo "FAIL: the trained adapter changes nothing"; exit 1
fi
echo "peft interop: ok"
