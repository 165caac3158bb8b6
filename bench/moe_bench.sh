#!/usr/bin/env bash
# moe_bench.sh - mixture-of-experts decode and prefill on the GPU machine: random weights with
# Qwen3-30B-A3B's shape (bench/make_random_model.py qwen3-30b-a3b: 48 layers, hidden 2048, 128 experts
# of 768, 8 chosen) as MLX 4-bit (all 48 layers) and bf16 (the first LAYERS layers: the whole bf16
# model is 61 GB, more than the machine's disk holds beside the rest), `lmx bench --json` with the
# experts routed on the GPU (the moe op, inside decode graphs) and on the host (LMX_CUDA_MOE=0).
# bytes_per_token counts the chosen experts' bytes only; achieved_bw_ctx0 = that x decode tok/s.
# usage: bench/moe_bench.sh LMX OUT_DIR [LAYERS]        (LAYERS of the bf16 copy, default 24)
set -u
lmx=$1 out=$2 layers=${3:-24}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out" /tmp/lmxb
q4=/tmp/lmxb/qwen3-30b-a3b-q4 bf=/tmp/lmxb/qwen3-30b-a3b-bf16-l$layers
[ -f "$q4/config.json" ] || python3 "$root/bench/make_random_model.py" qwen3-30b-a3b "$q4" --bits 4 >"$out/make.log" 2>&1 ||
    { echo "make_random_model q4 failed"; tail -3 "$out/make.log"; exit 1; }
[ -f "$bf/config.json" ] || python3 "$root/bench/make_random_model.py" qwen3-30b-a3b "$bf" --layers "$layers" >>"$out/make.log" 2>&1 ||
    { echo "make_random_model bf16 failed"; tail -3 "$out/make.log"; exit 1; }
for m in q4 bf; do
    dir=${!m}
    for mode in gpu host; do
        env=()
        [ $mode = host ] && env=(LMX_CUDA_MOE=0)
        echo "== $m $mode"
        env "${env[@]}" "$lmx" bench "$dir" --steps 32 --long-ctx 0 --json >"$out/$m-$mode.json" 2>"$out/$m-$mode.err" ||
            { echo "$m $mode failed"; tail -3 "$out/$m-$mode.err"; }
    done
done
python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
keys = ["prefill2048_tok_s", "decode_ctx0_tok_s", "generate_greedy_tok_s", "batch8_tok_s", "batch32_tok_s"]
print("%-10s %14s %12s" % ("", "bytes/token", "copy GB/s") + "".join("%24s" % k for k in keys) + "%14s" % "bw/copy")
for m in ("q4", "bf"):
    for mode in ("gpu", "host"):
        p = os.path.join(out, "%s-%s.json" % (m, mode))
        try:
            j = json.load(open(p))
        except Exception as e:
            print(m, mode, "missing", e)
            continue
        print("%-10s %14.3g %12.0f" % (m + " " + mode, j["bytes_per_token"], j["copy_bw"] / 1e9) +
              "".join("%24.1f" % j[k] for k in keys) + "%14.2f" % (j["achieved_bw_ctx0"] / j["copy_bw"]))
PY
