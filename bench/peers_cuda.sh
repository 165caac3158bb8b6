#!/usr/bin/env bash
# peers_cuda.sh - llama.cpp, the peer engine of bench/cuda_bench.sh, built with CUDA from the source
# in the llama-cpp-python source distribution on PyPI (0.3.36: ggml 0.25.3) and packed to travel to
# the GPU machine with `carry`.  nvcc compiles for sm_90 without a GPU, so the build runs on the
# development machine (about 45 minutes on 2 cores; 5 on the GPU machine's 16) and costs no device time.
#   bench/peers_cuda.sh build    # /tmp/peer/build/bin/llama-bench (static ggml, shared CUDA runtime)
#   bench/peers_cuda.sh pack     # .devbuild/peer.tar.xz: bin/llama-bench, lib/libgomp.so.1, gguf-py/
# On the GPU machine: mkdir /tmp/peer && tar xJf .devbuild/peer.tar.xz -C /tmp/peer; cuda_bench.sh
# finds it there (LLAMACPP=/tmp/peer).  llama-bench needs libnccl.so.2, which PyTorch's wheels carry.
# Or build it on the GPU machine itself (about 5 minutes of its 16 cores, no network there):
#   bench/peers_cuda.sh pack-src        # here: .devbuild/peer-src.tar.xz, the sources the build needs (6 MB)
#   bench/peers_cuda.sh build-src       # there: /tmp/peer/bin/{llama-bench,llama-batched-bench,llama-completion}, gguf-py/
set -euo pipefail
peer=/tmp/peer
ver=0.3.36
case "$1" in
build)
    mkdir -p "$peer/src"
    python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$peer/sdist"
    tar xzf "$peer/sdist/llama_cpp_python-$ver.tar.gz" -C "$peer/src"
    cmake -S "$peer/src/llama_cpp_python-$ver/vendor/llama.cpp" -B "$peer/build" -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$peer/build" -j"$(nproc)" --target llama-bench 2>&1 | tail -2
    ;;
pack)
    root=$(cd "$(dirname "$0")/.." && pwd)
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/bin" "$stage/lib" "$root/.devbuild"
    strip -o "$stage/bin/llama-bench" "$peer/build/bin/llama-bench"
    cp -L "$(ldd "$peer/build/bin/llama-bench" | awk '/libgomp/ {print $3}')" "$stage/lib/"
    cp -r "$peer/src/llama_cpp_python-$ver/vendor/llama.cpp/gguf-py" "$stage/"
    tar cJf "$root/.devbuild/peer.tar.xz" -C "$stage" .
    ls -la "$root/.devbuild/peer.tar.xz"
    ;;
pack-src)
    root=$(cd "$(dirname "$0")/.." && pwd)
    [ -d "$peer/src/llama_cpp_python-$ver" ] || {
        python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$peer/sdist"
        mkdir -p "$peer/src" && tar xzf "$peer/sdist/llama_cpp_python-$ver.tar.gz" -C "$peer/src"; }
    mkdir -p "$root/.devbuild"
    tar cJf "$root/.devbuild/peer-src.tar.xz" -C "$peer/src/llama_cpp_python-$ver/vendor" \
        --exclude=llama.cpp/models --exclude=llama.cpp/docs --exclude=llama.cpp/media --exclude=llama.cpp/tests \
        --exclude=llama.cpp/benches --exclude=llama.cpp/examples --exclude=llama.cpp/tools/ui llama.cpp
    ls -la "$root/.devbuild/peer-src.tar.xz"
    ;;
build-src)
    root=$(cd "$(dirname "$0")/.." && pwd)
    mkdir -p "$peer/src" "$peer/bin" "$peer/lib"
    tar xJf "$root/.devbuild/peer-src.tar.xz" -C "$peer/src"
    cmake -S "$peer/src/llama.cpp" -B "$peer/build" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$peer/build" -j"$(nproc)" --target llama-bench llama-batched-bench llama-completion llama-quantize 2>&1 | tail -2
    cp "$peer/build/bin/llama-bench" "$peer/build/bin/llama-batched-bench" "$peer/build/bin/llama-completion" "$peer/build/bin/llama-quantize" "$peer/bin/"
    rm -rf "$peer/gguf-py" && cp -r "$peer/src/llama.cpp/gguf-py" "$peer/"
    ;;
esac
