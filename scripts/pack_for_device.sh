#!/usr/bin/env bash
# pack_for_device.sh - what a CUDA build needs on the GPU machine (the `device` tool's, which has the
# CUDA runtime and cuBLAS but none of the Debian libraries lmx links), packed into one file that
# travels with `carry`: the lmx command, test_cuda_ops and test_runtime, the shared objects the
# machine lacks, and the fixture models the device check reads.  Unpack there with `tar xJf .devbuild/pack.tar.xz -C /tmp/d`;
# then /tmp/d/bin/lmx runs with LD_LIBRARY_PATH=/tmp/d/lib, and /tmp/d/fixtures is the fixtures folder.
# usage: scripts/pack_for_device.sh BUILD_DIR [FIXTURES_DIR]        (writes .devbuild/pack.tar.xz)
#   env PACK_BINS: the programs to pack (default: lmx and the tests the device check runs); PACK_FIXTURES=0: no
#   fixtures (a pack small enough to travel beside llama.cpp's, bench/peers_cuda.sh)
set -euo pipefail
build=$1
fix=${2:-$(cd "$(dirname "$0")/../.." && pwd)/shared/fixtures}
root=$(cd "$(dirname "$0")/.." && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" "$stage/fixtures/models" "$root/.devbuild"
for b in ${PACK_BINS:-lmx test_cuda_ops test_cuda_backward test_cuda_keep test_runtime test_adapter test_memory test_inspect}; do if [ -x "$build/$b" ]; then strip -o "$stage/bin/$b" "$build/$b"; fi; done
ldd "$build/lmx" | awk '/=> \// {print $3}' | grep -v -E 'libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc|libgcc_s|libcublas' |
    while read -r so; do cp -L "$so" "$stage/lib/"; done
if [ "${PACK_FIXTURES:-1}" != 0 ]; then
    for m in llama qwen2 qwen3 gemma2 gemma3 gemma3_scaled qwen3_moe llama_q4 llama_q8 qwen3_q4 qwen3_q8 gemma3_q4 gemma3_q8 \
        llama_lora qwen3_lora gemma4 gemma4_kv gemma4_moe; do
        cp -r "$fix/models/$m" "$stage/fixtures/models/"
    done
    mkdir -p "$stage/fixtures/real" && cp "$fix/real/stories260K.gguf" "$stage/fixtures/real/"
    cp -r "$fix/real/adapters" "$stage/fixtures/real/"
fi
XZ_OPT=${XZ_OPT:--9 -T2} tar cJf "$root/.devbuild/pack.tar.xz" -C "$stage" .
ls -la "$root/.devbuild/pack.tar.xz"
