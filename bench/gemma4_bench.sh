#!/usr/bin/env bash
# gemma4_bench.sh - issue 13's Gemma 4 figures on the GPU machine: random weights of transformers' default
# gemma4_text config (Gemma4TextConfig(): 30 layers, hidden 2304, 8 heads of 256 / 512 on full layers, MLP
# 9216, per-layer inputs of 256 from a 262,144-token table, 5 sliding layers to a full one), made by HF
# transformers itself (Gemma4ForCausalLM, bf16, save_pretrained), then on the same weights: `lmx bench`,
# HF transformers (bench/hf_decode.py: prefill of 2048 tokens and decode after them) and, when $LLAMACPP
# holds llama-bench, llama.cpp on a bf16 GGUF copy (tests/ref/hf_to_gguf.py --placeholder-vocab).
#
# usage: bench/gemma4_bench.sh LMX OUT_DIR        env: LLAMACPP (default /tmp/peer: bin/llama-bench, gguf-py/)
set -u
lmx=$1 out=$2
root=$(cd "$(dirname "$0")/.." && pwd)
llcpp=${LLAMACPP:-/tmp/peer}
d=/tmp/lmxb/gemma4-default
mkdir -p "$out" /tmp/lmxb
[ -f "$d/config.json" ] || python3 - "$d" >"$out/make.log" 2>&1 <<'PY' || { echo "model failed"; tail -3 "$out/make.log"; exit 1; }
import sys
import torch
from transformers import Gemma4ForCausalLM, Gemma4TextConfig
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Gemma4ForCausalLM(Gemma4TextConfig())
model.save_pretrained(sys.argv[1], max_shard_size="100GB")
print(sum(p.numel() for p in model.parameters()), "parameters")
PY
timeout 200 "$lmx" bench "$d" --steps 16 --long-ctx 2048 --json >"$out/lmx.json" 2>"$out/lmx.err" || tail -3 "$out/lmx.err"
timeout 200 python3 "$root/bench/hf_decode.py" "$d" --steps 16 --prompt 2048 >"$out/hf.txt" 2>"$out/hf.err" || tail -3 "$out/hf.err"
if [ -x "$llcpp/bin/llama-bench" ]; then
    PYTHONPATH=$llcpp/gguf-py timeout 300 python3 "$root/tests/ref/hf_to_gguf.py" "$d" "$d.gguf" --placeholder-vocab \
        >"$out/gguf.log" 2>&1 || tail -3 "$out/gguf.log"
    . "$root/bench/peer_env.sh"
    LD_LIBRARY_PATH=$peer_ld timeout 200 "$llcpp/bin/llama-bench" -m "$d.gguf" -ngl 99 \
        -p 2048 -n 128 -r 2 -o json >"$out/llama-bench.json" 2>"$out/llama-bench.err" || tail -3 "$out/llama-bench.err"
fi
python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
try:
    j = json.load(open(os.path.join(out, "lmx.json")))
    print("lmx: decode ctx 0 %.1f, ctx 2048 %.1f, prefill 2048 %.0f, batch 8 %.1f, batch 32 %.1f tok/s; %.2f GB/token"
          % (j["decode_ctx0_tok_s"], j["decode_long_tok_s"], j["prefill2048_tok_s"], j["batch8_tok_s"],
             j["batch32_tok_s"], j["bytes_per_token"] / 1e9))
except Exception as e:
    print("lmx: none", e)
try:
    print("".join(open(os.path.join(out, "hf.txt")).readlines()[1:]).rstrip())
except OSError:
    print("hf: none")
try:
    for r in json.load(open(os.path.join(out, "llama-bench.json"))):
        print("llama.cpp: pp%d tg%d %.1f tok/s" % (r["n_prompt"], r["n_gen"], r["avg_ts"]))
except Exception as e:
    print("llama.cpp: none", e)
PY
