/* probe_moe_layout.cu - does the experts' tensor-core launch (k_moe_mma, cuda_moe_mma.cu) wait on how its weight
 * reads land, or on how many are in flight?  A measurement before any upload code: the launch's own loop (the
 * same mq_rows<Q4_K>::load / sum of cuda_mq.h, one pass of eight pairs with x staged in shared memory) over
 * random Q4_K experts in two layouts of the same bytes:
 *   rows  (what lmx uploads: GGUF's rows, 144-byte super-blocks, a row K / 256 of them): a warp's 16 rows of a
 *         super-block are 16 pieces 1,152 bytes apart (K 2,048), read by ten loads of 8 rows each;
 *   tiles (a layout written on upload): a warp's 16 rows of a super-block as one 2,304-byte run, the codes first in
 *         the order the lanes take them (four loads of 512 contiguous bytes a warp), then the 16 rows' scales.
 * Same grid (row blocks of 128 x the chosen experts), x staged by cp.async beside the first weights' loads as there,
 * same compute; printed: microseconds a launch and the
 * weights' TB/s.  Each launch reads another layer's copy, so L2 holds nothing of it.
 *   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc/backend/cuda -Isrc -Iinclude \
 *        bench/probe_moe_layout.cu -o probe
 *   ./probe [N] [K] [experts chosen of 128] [4|6]    (defaults 1536 2048 112 4: Qwen3-30B-A3B's gate | up at batch 32;
 *                                                    6: Q6_K in lmx's 224-byte blocks, the down projection's other type)
 * A third form, the rows' order kept inside tiles of TR rows (row n's super-blocks TR blocks apart), separates the
 * two things the tiles change: where a warp's bytes lie, and how many loads fetch them. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "cuda_mq.h"

#define CK(x)                                                                                   \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));        \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

constexpr int T4 = LMX_GGML_Q4_K;

/* The lane-ordered tiles are cuda_mq.h's (mq_rows::load_tiled, mq_tile); rows in tiles of TR, the rows' order kept: super-block b of a row sbs bytes after b - 1, read by mq_rows::load from
 * row pointers moved back by b (sbs - BYTES), so that its b BYTES lands on b sbs */
template <int T> struct rows_strided : mq_rows<T> {
    __device__ __forceinline__ void load_strided(const uint8_t *const (&wr)[2], int b, int t, int64_t sbs) {
        const int64_t back = b * (sbs - gq_traits<T>::BYTES);
        const uint8_t *const moved[2] = {wr[0] + back, wr[1] + back};
        this->load(moved, b, t);
    }
};

template <int T, int TILED, int TR>
__global__ void __launch_bounds__(256, 2)
    k_probe(const uint8_t *w, const int *chosen, const uint4 *xsrc, int nwords, int N, int K, float *y) {
    extern __shared__ uint4 sm[];
    const int e = chosen[blockIdx.y], tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int NP = K / 32, SB = K / 256, n0 = blockIdx.x * 128 + 16 * warp;
    constexpr int BY = gq_traits<T>::BYTES;
    for (int i = tid; i < nwords; i += blockDim.x) cp_async16_or_zeros(smem_addr(sm + i), xsrc + i, 16); /* x, as k_moe_mma */
    cp_async_commit();
    const int64_t rb = (int64_t)SB * BY;
    const uint8_t *we = w + (size_t)e * N * rb;
    const uint8_t *wr[2] = {we + (n0 + g) * rb, we + (n0 + g + 8) * rb};
    if (TR > 1) /* row n: its tile's base + its place in the tile */
        for (int h = 0; h < 2; h++) {
            const int n = n0 + g + 8 * h;
            wr[h] = we + (size_t)(n / TR) * TR * rb + (n % TR) * BY;
        }
    const uint8_t *tile = we + (size_t)(n0 / 16) * SB * 16 * BY;
    uint4 *sx = sm;
    int *sxs = (int *)(sm + NP * 32);
    float *sxd = (float *)(sxs + NP * mq_t<T>::SUMS * 8);
    rows_strided<T> cur, next;
    if (TILED) cur.load_tiled(tile, lane);
    else if (TR > 1) cur.load_strided(wr, 0, t, TR * BY);
    else cur.load(wr, 0, t);
    cp_async_wait<0>();
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int b = 0; b < SB; b++) {
        if (b + 1 < SB) {
            if (TILED) next.load_tiled(tile + (size_t)(b + 1) * 16 * BY, lane);
            else if (TR > 1) next.load_strided(wr, b + 1, t, TR * BY);
            else next.load(wr, b + 1, t);
        }
        cur.sum(b, sx, sxs, sxd, g, t, acc);
        cur = next;
    }
    y[((size_t)blockIdx.y * N + n0 + g) * 4 + t] = acc[0] + acc[1] + acc[2] + acc[3];
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 1536, K = argc > 2 ? atoi(argv[2]) : 2048,
              EA = argc > 3 ? atoi(argv[3]) : 112, Q6 = argc > 4 && argv[4][0] == '6', E = 128, LAYERS = 6, REPS = 120;
    const size_t rb = (size_t)K / 256 * (Q6 ? 224 : 144), layer = (size_t)E * N * rb;
    uint8_t *w;
    CK(cudaMalloc(&w, layer * LAYERS));
    { /* random bytes; halves of moderate size where the scales' d and dmin sit (either layout: timing only) */
        std::vector<uint8_t> h(layer);
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < layer; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, h[i] = (uint8_t)(s >> 24);
        for (int l = 0; l < LAYERS; l++) CK(cudaMemcpy(w + l * layer, h.data(), layer, cudaMemcpyHostToDevice));
    }
    std::vector<int> pick(E);
    for (int i = 0; i < E; i++) pick[i] = i;
    uint64_t s = 12345;
    for (int i = E - 1; i > 0; i--) s = s * 6364136223846793005ull + 1, std::swap(pick[i], pick[(s >> 33) % (i + 1)]);
    int *chosen;
    CK(cudaMalloc(&chosen, E * sizeof(int)));
    CK(cudaMemcpy(chosen, pick.data(), E * sizeof(int), cudaMemcpyHostToDevice));
    const size_t smem = Q6 ? mq_stage_bytes<LMX_GGML_Q6_K_A16>(K / 256) : mq_stage_bytes<T4>(K / 256);
    uint4 *xsrc;
    float *y;
    CK(cudaMalloc(&xsrc, smem));
    CK(cudaMemset(xsrc, 1, smem));
    CK(cudaMalloc(&y, (size_t)EA * N * 4 * sizeof(float)));
    typedef void (*probe_fn)(const uint8_t *, const int *, const uint4 *, int, int, int, float *);
    constexpr int T6 = LMX_GGML_Q6_K_A16;
    const probe_fn fns4[] = {k_probe<T4, 0, 1>,  k_probe<T4, 1, 1>,  k_probe<T4, 0, 8>,
                             k_probe<T4, 0, 16>, k_probe<T4, 0, 32>, k_probe<T4, 0, 128>};
    const probe_fn fns6[] = {k_probe<T6, 0, 1>,  k_probe<T6, 1, 1>,  k_probe<T6, 0, 8>,
                             k_probe<T6, 0, 16>, k_probe<T6, 0, 32>, k_probe<T6, 0, 128>};
    const probe_fn *fns = Q6 ? fns6 : fns4;
    const char *names[] = {"rows", "tiles", "rows in tiles of 8", "rows in tiles of 16", "rows in tiles of 32",
                           "rows in tiles of 128"};
    const int NV = 6;
    for (int v = 0; v < NV; v++) CK(cudaFuncSetAttribute(fns[v], cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const dim3 grid(N / 128, EA);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const double bytes = (double)EA * N * rb;
    printf("%s N %d K %d, %d experts of %d: %.1f MB a launch\n", Q6 ? "Q6_K" : "Q4_K", N, K, EA, E, bytes / 1e6);
    for (int round = 0; round < 3; round++)
        for (int v = 0; v < NV; v++) {
            for (int r = 0; r < REPS + 10; r++) {
                if (r == 10) CK(cudaEventRecord(a));
                const uint8_t *wl = w + (size_t)(r % LAYERS) * layer;
                fns[v]<<<grid, 256, smem>>>(wl, chosen, xsrc, (int)(smem / 16), N, K, y);
            }
            CK(cudaEventRecord(b));
            CK(cudaEventSynchronize(b));
            CK(cudaGetLastError());
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, a, b));
            const double us = ms * 1e3 / REPS;
            printf("round %d %-20s %8.2f us  %6.2f TB/s\n", round, names[v], us, bytes / (us * 1e-6) / 1e12);
        }
    return 0;
}
