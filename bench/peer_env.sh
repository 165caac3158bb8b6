# peer_env.sh - sourced (after setting llcpp, the folder bench/peers_cuda.sh builds llama.cpp's tools in) by
# the benchmarks that run llama.cpp on the GPU machine.  Sets peer_ld, the LD_LIBRARY_PATH those tools run
# with: llama.cpp's own libraries and libnccl.so.2, which ggml's CUDA backend needs and PyTorch's wheels carry.
nccl=$(dirname "$(find /opt /usr /usr/local -name 'libnccl.so.2' 2>/dev/null | head -1)" 2>/dev/null || true)
peer_ld=$llcpp/lib:$nccl:${LD_LIBRARY_PATH:-}
