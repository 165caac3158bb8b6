#!/usr/bin/env bash
# moe_peer_bench.sh - issue 13's mixture-of-experts figures beside llama.cpp, on the GPU machine, on one
# GGUF file both engines read: random weights of Qwen3-30B-A3B's shape, the first LAYERS layers.  TYPE
# F16: bench/make_random_model.py, written as F16 GGUF by bench/write_gguf.py (architecture qwen3moe,
# stacked ffn_*_exps; the whole model's F16 file, 61 GB, is more than the machine's disk holds beside
# its copies); other TYPEs: that file quantized by llama.cpp's own llama-quantize; TYPE Q4_K_M-random:
# bench/random_gguf.py's random Q4_K / Q6_K blocks with llama-quantize's Q4_K_M type choices, written in
# seconds at any depth (the whole 48 layers: 17 GB).  On each file: `lmx bench --json` (the experts
# routed on the GPU; with MODES "gpu host", also with LMX_CUDA_MOE=0, routed on the host, the path before
# the moe op), llama-bench (pp2048, tg128) and llama-batched-bench (batch 1, 8, 32; BATCHED=0: none).
# Results land in OUT_DIR; a summary is printed.
#
# usage: bench/moe_peer_bench.sh LMX OUT_DIR [LAYERS] [TYPE...]      (default 12 layers, F16 Q4_K_M)
#   env: LLAMACPP (default /tmp/peer: bin/llama-quantize, bin/llama-bench, bin/llama-batched-bench, gguf-py/;
#        bench/peers_cuda.sh build-src makes it on the GPU machine in about 8 minutes), MODES (default "gpu host"),
#        BATCHED (default 1)
set -u
lmx=$1 out=$2 layers=${3:-12}
shift 3 2>/dev/null || shift $#
types=${*:-F16 Q4_K_M}
root=$(cd "$(dirname "$0")/.." && pwd)
llcpp=${LLAMACPP:-/tmp/peer}
m=/tmp/lmxb/moe$layers
mkdir -p "$out" /tmp/lmxb
. "$root/bench/peer_env.sh"
for t in $types; do
    [ -f "$m-$t.gguf" ] || [ "$t" = Q4_K_M-random ] || need_f16=1
done
[ -f "$m-F16.gguf" ] || [ -z "${need_f16:-}" ] || {
    python3 "$root/bench/make_random_model.py" qwen3-30b-a3b "$m" --layers "$layers" >"$out/make.log" 2>&1 &&
        PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/write_gguf.py" "$m" "$m-F16.gguf" >"$out/f16.log" 2>&1 ||
        { echo "weights failed"; tail -3 "$out/make.log" "$out/f16.log"; exit 1; }
    rm -rf "$m"
}
for t in $types; do
    f=$m-$t.gguf
    if [ "$t" = Q4_K_M-random ]; then
        [ -f "$f" ] || PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/random_gguf.py" qwen3-30b-a3b "$f" --layers "$layers" \
            >"$out/$t.random.log" 2>&1 || { echo "$t: random_gguf.py failed"; continue; }
    else
        [ -f "$f" ] || "$llcpp/bin/llama-quantize" "$m-F16.gguf" "$f" "$t" "$(nproc)" >"$out/$t.quantize.log" 2>&1 ||
            { echo "$t: llama-quantize failed"; continue; }
    fi
    for mode in ${MODES:-gpu host}; do
        env=(X=1)
        [ $mode = host ] && env=(LMX_CUDA_MOE=0)
        env "${env[@]}" "$lmx" bench "$f" --steps 16 --long-ctx 0 --json >"$out/$t.lmx-$mode.json" 2>"$out/$t.lmx-$mode.err" ||
            { echo "$t $mode: lmx bench failed"; tail -3 "$out/$t.lmx-$mode.err"; }
    done
    LD_LIBRARY_PATH=$peer_ld "$llcpp/bin/llama-bench" -m "$f" -ngl 99 -p 2048 -n 128 -r 2 \
        -o json >"$out/$t.llama-bench.json" 2>"$out/$t.llama-bench.err" || tail -3 "$out/$t.llama-bench.err"
    [ "${BATCHED:-1}" = 0 ] || LD_LIBRARY_PATH=$peer_ld "$llcpp/bin/llama-batched-bench" -m "$f" -ngl 99 -c 16384 \
        -npp 128 -ntg 128 -npl 1,8,32 >"$out/$t.batched.txt" 2>"$out/$t.batched.err" || tail -3 "$out/$t.batched.err"
done
python3 - "$out" $types <<'PY'
import json, os, re, sys
out, types = sys.argv[1], sys.argv[2:]
def load(p):
    try:
        return json.load(open(p))
    except Exception:
        return None
print("%-8s %-24s %10s %10s %10s %10s %12s" % ("type", "engine", "decode", "pp2048", "batch 8", "batch 32", "GB/token"))
for t in types:
    for mode in ("gpu", "host"):
        j = load(os.path.join(out, "%s.lmx-%s.json" % (t, mode)))
        if j:
            print("%-8s %-24s %10.1f %10.1f %10.1f %10.1f %12.3f" % (t, "lmx (%s routing)" % mode, j["decode_ctx0_tok_s"],
                  j["prefill2048_tok_s"], j["batch8_tok_s"], j["batch32_tok_s"], j["bytes_per_token"] / 1e9))
    lb = load(os.path.join(out, t + ".llama-bench.json")) or []
    tg = [r["avg_ts"] for r in lb if r["n_gen"] > 0]
    pp = [r["avg_ts"] for r in lb if r["n_prompt"] > 0]
    stg = {}
    try:
        for line in open(os.path.join(out, t + ".batched.txt")):
            c = [x.strip() for x in line.split("|")]
            if len(c) > 9 and c[3].isdigit():
                stg[int(c[3])] = float(c[8])
    except OSError:
        pass
    print("%-8s %-24s %10s %10s %10s %10s" % (t, "llama.cpp", "%.1f" % tg[0] if tg else "-", "%.1f" % pp[0] if pp else "-",
          stg.get(8, "-"), stg.get(32, "-")))
PY
