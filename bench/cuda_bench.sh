#!/usr/bin/env bash
# cuda_bench.sh - issue 6's benchmark in one call on the GPU machine: random-weight models with real
# shapes (bench/make_random_model.py, bf16 or MLX 4/8-bit), `lmx bench --json` on each, and the peer
# engines on the same weights: HF transformers (bench/hf_decode.py, bf16 models) and llama.cpp
# (llama-bench on the weights written as F16 and as Q4_0 GGUF by bench/write_gguf.py, when $LLAMACPP
# holds its CUDA build: bin/llama-bench and gguf-py/, as bench/peers_cuda.sh packs them).
# Everything lands in OUT_DIR; the last thing printed is bench/cuda_summary.py's table.
#
# usage: bench/cuda_bench.sh LMX OUT_DIR SPEC...      SPEC = ARCH[:BITS], e.g. qwen3-0.6b llama-3.1-8b:4
#   env: PEERS (default "hf llamacpp"), LLAMACPP (default /tmp/peer), KEEP=1 keeps the models in /tmp/lmxb
set -u
lmx=$1 out=$2
shift 2
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${PEERS-hf llamacpp}
llcpp=${LLAMACPP:-/tmp/peer}
mkdir -p "$out" /tmp/lmxb
. "$root/bench/peer_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader >"$out/gpu.txt" 2>&1
for spec in "$@"; do
    arch=${spec%%:*} bits=0
    [ "$spec" != "$arch" ] && bits=${spec#*:}
    name=$arch
    [ "$bits" != 0 ] && name=$arch-q$bits
    dir=/tmp/lmxb/$name
    if [ ! -f "$dir/config.json" ]; then
        qa=()
        [ "$bits" != 0 ] && qa=(--bits "$bits")
        python3 "$root/bench/make_random_model.py" "$arch" "$dir" "${qa[@]}" >"$out/$name.make.log" 2>&1 ||
            { echo "$name: make_random_model failed"; tail -3 "$out/$name.make.log"; continue; }
    fi
    steps=64
    case $arch in *8b*) steps=32 ;; esac
    echo "== $name: lmx bench"
    "$lmx" bench "$dir" --steps $steps --json >"$out/$name.lmx.json" 2>"$out/$name.lmx.err" ||
        { echo "$name: lmx bench failed"; tail -3 "$out/$name.lmx.err"; }
    if [ "$bits" = 0 ]; then
        case " $peers " in *" hf "*)
            echo "== $name: HF transformers"
            python3 "$root/bench/hf_decode.py" "$dir" --steps 32 >"$out/$name.hf.txt" 2>"$out/$name.hf.err" ||
                tail -3 "$out/$name.hf.err" ;;
        esac
        case " $peers " in *" llamacpp "*)
            if [ -x "$llcpp/bin/llama-bench" ] && [ "$arch" != gemma-3-1b ]; then
                echo "== $name: llama.cpp"
                gg=/tmp/lmxb/$name
                for q in f16 q4_0; do
                    PYTHONPATH=$llcpp/gguf-py python3 "$root/bench/write_gguf.py" "$dir" "$gg-$q.gguf" $q \
                        >"$out/$name.gguf-$q.log" 2>&1 &&
                        LD_LIBRARY_PATH=$peer_ld "$llcpp/bin/llama-bench" -m "$gg-$q.gguf" \
                            -ngl 99 -p 512,2048 -n 128 -r 3 -o json >"$out/$name.llamacpp-$q.json" 2>"$out/$name.llamacpp-$q.err"
                    rm -f "$gg-$q.gguf"
                done
            fi ;;
        esac
    fi
    [ "${KEEP:-0}" = 1 ] || rm -rf "$dir"
done
python3 "$root/bench/cuda_summary.py" "$out"
