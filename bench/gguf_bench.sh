#!/usr/bin/env bash
# gguf_bench.sh - issue 12's GGUF figures in one call on the GPU machine: Llama-3.1-8B-shaped random
# weights (bench/make_random_model.py) written as F16 GGUF (bench/write_gguf.py) and quantized with
# llama.cpp's own llama-quantize to each TYPE; then on the same file `lmx bench --json` and, when
# $LLAMACPP holds llama-bench / llama-batched-bench (bench/peers_cuda.sh), llama.cpp in the same run.
# Results land in OUT_DIR: TYPE.lmx.json, TYPE.llama-bench.json, TYPE.batched.txt.
#
# usage: bench/gguf_bench.sh LMX OUT_DIR [ARCH] TYPE...    e.g. llama-3.1-8b Q4_K_M Q4_0 Q8_0
#   env: LLAMACPP (default /tmp/peer: bin/llama-quantize [, bin/llama-bench, bin/llama-batched-bench], gguf-py/),
#        LLAMA_BENCH_ARGS (default "-p 512,2048 -n 128 -r 3"), BATCHED=0 skips llama-batched-bench
set -u
lmx=$1 out=$2 arch=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
llcpp=${LLAMACPP:-/tmp/peer}
mkdir -p "$out" /tmp/lmxb
. "$root/bench/peer_env.sh"
export LD_LIBRARY_PATH=$peer_ld
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
dir=/tmp/lmxb/$arch f16=/tmp/lmxb/$arch-f16.gguf
t0=$(date +%s)
[ -f "$dir/config.json" ] || python3 "$root/bench/make_random_model.py" "$arch" "$dir" >"$out/make.log" 2>&1 ||
    { echo "make_random_model failed"; tail -3 "$out/make.log"; exit 1; }
[ -f "$f16" ] || PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/write_gguf.py" "$dir" "$f16" >"$out/f16.log" 2>&1 ||
    { echo "write_gguf failed"; tail -3 "$out/f16.log"; exit 1; }
rm -rf "$dir"
echo "weights ready in $(($(date +%s) - t0)) s"
for type in "$@"; do
    gg=/tmp/lmxb/$arch-$type.gguf
    "$llcpp/bin/llama-quantize" "$f16" "$gg" "$type" "$(nproc)" >"$out/$type.quantize.log" 2>&1 ||
        { echo "$type: llama-quantize failed"; tail -3 "$out/$type.quantize.log"; continue; }
    echo "== $type ($(du -h "$gg" | cut -f1)): lmx bench"
    "$lmx" bench "$gg" --steps 32 --json >"$out/$type.lmx.json" 2>"$out/$type.lmx.err" ||
        { echo "$type: lmx bench failed"; tail -3 "$out/$type.lmx.err"; }
    if [ -x "$llcpp/bin/llama-bench" ]; then
        echo "== $type: llama-bench"
        "$llcpp/bin/llama-bench" -m "$gg" -ngl 99 ${LLAMA_BENCH_ARGS:--p 512,2048 -n 128 -r 3} -o json >"$out/$type.llama-bench.json" \
            2>"$out/$type.llama-bench.err" || tail -3 "$out/$type.llama-bench.err"
    fi
    if [ -x "$llcpp/bin/llama-batched-bench" ] && [ "${BATCHED:-1}" != 0 ]; then
        echo "== $type: llama-batched-bench"
        "$llcpp/bin/llama-batched-bench" -m "$gg" -ngl 99 -c 16384 -npp 128 -ntg 128 -npl 1,8,32 \
            >"$out/$type.batched.txt" 2>"$out/$type.batched.err" || tail -3 "$out/$type.batched.err"
    fi
    rm -f "$gg"
done
rm -f "$f16"
python3 - "$out" "$@" <<'EOF'
import json, os, sys
out, types = sys.argv[1], sys.argv[2:]
def load(path):
    try:
        return json.load(open(os.path.join(out, path)))
    except Exception:
        return None
f = lambda v: "-" if v is None else "%.1f" % v
print("%-7s %9s %9s %9s %10s %9s %9s %7s" % ("type", "lmx tg", "llcpp tg", "lmx pp2k", "llcpp pp2k", "lmx b8", "lmx b32", "GB/tok"))
for t in types:
    j = load(t + ".lmx.json") or {}
    lc = {}
    for r in load(t + ".llama-bench.json") or []:
        lc["tg" if r.get("n_gen") else "pp%d" % r.get("n_prompt", 0)] = r.get("avg_ts")
    print("%-7s %9s %9s %9s %10s %9s %9s %7s" % (t, f(j.get("decode_ctx0_tok_s")), f(lc.get("tg")), f(j.get("prefill2048_tok_s")),
          f(lc.get("pp2048")), f(j.get("batch8_tok_s")), f(j.get("batch32_tok_s")), f((j.get("bytes_per_token") or 0) / 1e9)))
EOF
