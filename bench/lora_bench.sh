#!/usr/bin/env bash
# lora_bench.sh - LoRA decode cost on the GPU machine: a random-weight model with a real shape
# (bench/make_random_model.py), four random rank-R adapters on all seven projections
# (bench/make_random_adapter.py), and `lmx bench --json` with no adapter, one adapter, and the four
# mixed in every batch (batch 8 and 32: sequence i takes adapter i % 4).  Summary table last.
# With llama.cpp's CUDA build in $LLAMACPP (default /tmp/peer: bin/llama-batched-bench, gguf-py/; see
# bench/peers_cuda.sh), also llama.cpp on the same weights (F16 GGUF, bench/write_gguf.py) with no adapter
# (llama-batched-bench -npp 128 -ntg 128 -npl 1,8,32), and one sequence's decode (llama-completion, 256 tokens)
# without and with adapter 1 (bench/write_lora_gguf.py, `--lora`; llama-batched-bench ignores --lora).
# usage: bench/lora_bench.sh LMX OUT_DIR [SPEC] [RANK]     (SPEC default llama-3.1-8b, RANK 16)
set -u
lmx=$1 out=$2 spec=${3:-llama-3.1-8b} rank=${4:-16}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=/tmp/lmxb/$spec
mkdir -p "$out" /tmp/lmxb
[ -f "$dir/config.json" ] || python3 "$root/bench/make_random_model.py" "$spec" "$dir" >"$out/make.log" 2>&1 ||
    { echo "make_random_model failed"; tail -3 "$out/make.log"; exit 1; }
for s in 1 2 3 4; do
    [ -f "$dir-lora$s/adapter_config.json" ] ||
        python3 "$root/bench/make_random_adapter.py" "$dir" "$dir-lora$s" --rank "$rank" --seed $s >>"$out/make.log" 2>&1
done
steps=32
run() { # name, extra args
    local name=$1; shift
    echo "== $name"
    "$lmx" bench "$dir" --steps $steps --long-ctx 0 --json "$@" >"$out/$name.json" 2>"$out/$name.err" ||
        { echo "$name failed"; tail -3 "$out/$name.err"; }
}
run base
run lora1 --adapter "$dir-lora1"
run lora4 --adapter "$dir-lora1" --adapter "$dir-lora2" --adapter "$dir-lora3" --adapter "$dir-lora4"
llcpp=${LLAMACPP:-/tmp/peer}
if [ -x "$llcpp/bin/llama-batched-bench" ]; then
    . "$root/bench/peer_env.sh"
    gg=/tmp/lmxb/$spec-f16.gguf
    [ -f "$gg" ] || PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/write_gguf.py" "$dir" "$gg" >>"$out/make.log" 2>&1
    PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/write_lora_gguf.py" "$dir-lora1" "$dir-lora1.gguf" >>"$out/make.log" 2>&1
    echo "== llama.cpp base, batched"
    LD_LIBRARY_PATH=$peer_ld "$llcpp/bin/llama-batched-bench" -m "$gg" -ngl 99 -c 8192 \
        -b 2048 -ub 512 -npp 128 -ntg 128 -npl 1,8,32 >"$out/llamacpp-base.txt" 2>"$out/llamacpp-base.err" ||
        { echo "llama.cpp base failed"; tail -3 "$out/llamacpp-base.err"; }
    grep '^|' "$out/llamacpp-base.txt"
    # llama-batched-bench takes no adapter: one sequence's decode through llama-completion, without and
    # with --lora (its perf print: "eval time = ... tokens per second")
    for v in base lora1; do
        la=()
        [ $v = lora1 ] && la=(--lora "$dir-lora1.gguf")
        LD_LIBRARY_PATH=$peer_ld "$llcpp/bin/llama-completion" -m "$gg" "${la[@]}" -ngl 99 \
            -c 1024 -p "The quick brown fox" -n 256 --ignore-eos -no-cnv -s 1 --temp 0 </dev/null \
            >"$out/llamacpp-decode-$v.txt" 2>"$out/llamacpp-decode-$v.err" ||
            { echo "llama-completion $v failed"; tail -3 "$out/llamacpp-decode-$v.err"; }
        echo "llama.cpp decode $v: $(grep -E ' eval time' "$out/llamacpp-decode-$v.err" | grep -v prompt | tail -1)"
        grep -iE "lora|adapter" "$out/llamacpp-decode-$v.err" | head -3
    done
fi
python3 - "$out" <<'PY'
import json, sys, os
out = sys.argv[1]
rows = []
for name in ("base", "lora1", "lora4"):
    try: rows.append((name, json.load(open(os.path.join(out, name + ".json")))))
    except Exception as e: print(name, "missing", e)
keys = ["prefill2048_tok_s", "decode_ctx0_tok_s", "generate_greedy_tok_s", "batch1_tok_s", "batch8_tok_s", "batch32_tok_s"]
print("%-8s" % "" + "".join("%24s" % k for k in keys))
base = dict(rows[0][1]) if rows and rows[0][0] == "base" else None
for name, d in rows:
    print("%-8s" % name + "".join("%24s" % ("%.1f%s" % (d[k], "" if not base or name == "base" else " (%+.1f%%)" % (100 * (d[k] / base[k] - 1))))
                                   for k in keys))
PY
