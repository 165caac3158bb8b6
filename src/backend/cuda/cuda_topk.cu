/* cuda_topk.cu - the k largest logits of each row on the GPU, so that sampling reads k values
 * instead of the vocabulary.
 *
 * Each value becomes a 64-bit key that orders like the sampler does: the float's bits made
 * unsigned-comparable in the high word, the complement of its index in the low word (equal values:
 * lower index first), so all keys of a row are distinct and "the k largest" is exact.  Two kernels:
 * G blocks per row each select the k largest keys of their slice; one block per row then selects
 * the k largest of the G * k candidates and sorts them.  Selection is a radix select in one block:
 * 8-bit digits from the top, a shared histogram per digit, stopping as soon as the digit's bin holds
 * exactly the number still needed; the winners are then the keys whose selected prefix is at least
 * the one found. */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define TK_THREADS 256
#define TK_CAND 4096           /* candidates the second kernel merges: G * k */
#define TK_SLICE 4096          /* the most values of a slice that the first kernel stages in shared memory */
#define TK_LOADS 8             /* loads a thread has in flight while staging */

/* dst[0 .. n) = src[0 .. n) by the block, TK_LOADS independent loads a thread at a time (the selection's passes
 * then read shared memory: loading in its loops, one value a thread and step, waited on L2 at every step). */
template <typename T>
static __device__ __forceinline__ void tk_stage(T *dst, const T *src, int n) {
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x * TK_LOADS) {
        T v[TK_LOADS];
#pragma unroll
        for (int j = 0; j < TK_LOADS; j++) {
            const int i = i0 + j * (int)blockDim.x;
            v[j] = i < n ? src[i] : T(0);
        }
#pragma unroll
        for (int j = 0; j < TK_LOADS; j++) {
            const int i = i0 + j * (int)blockDim.x;
            if (i < n) dst[i] = v[j];
        }
    }
    __syncthreads();
}

static __device__ __forceinline__ uint64_t tk_key(float v, int idx) {
    uint32_t u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << 32) | (uint32_t)~(uint32_t)idx;
}
static __device__ __forceinline__ float tk_val(uint64_t c) {
    uint32_t u = (uint32_t)(c >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    return __uint_as_float(u);
}
static __device__ __forceinline__ int tk_idx(uint64_t c) { return (int)~(uint32_t)c; }

/* The largest of the block's keys v (0 for none), in thread 0; red: [32] shared.  k = 1 (greedy): no passes. */
static __device__ uint64_t tk_block_max(uint64_t v, uint64_t *red) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = (blockDim.x + 31) / 32;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t > v ? t : v;
    }
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : 0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const uint64_t t = __shfl_xor_sync(0xffffffffu, v, o);
        v = t > v ? t : v;
    }
    return v;
}

typedef struct tk_shared {
    unsigned hist[256];
    unsigned need, bin, done, count;
} tk_shared;

/* After this, the k largest of the n keys key_at(0 .. n-1) (k <= n) are exactly those with
 * (key & mask) >= pref.  Every thread of the block calls it. */
template <typename F>
static __device__ void tk_select(int n, int k, F key_at, uint64_t &pref, uint64_t &mask, tk_shared &sh) {
    const int tid = threadIdx.x, lane = tid % 32;
    pref = 0;
    mask = 0;
    if (tid == 0) sh.need = (unsigned)k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += blockDim.x) sh.hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += blockDim.x) {
            const uint64_t c = key_at(i);
            if ((c & mask) == pref) atomicAdd(&sh.hist[(c >> shift) & 255], 1u);
        }
        __syncthreads();
        if (tid < 32) { /* the bin, from the top, where the count still needed is reached */
            unsigned h[8], ls = 0;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                h[j] = sh.hist[8 * lane + j];
                ls += h[j];
            }
            const unsigned need = sh.need;
            __syncwarp(); /* every lane has read sh.need before the lane that finds the bin rewrites it */
            unsigned suf = ls; /* sum over lanes >= this one */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_down_sync(0xffffffffu, suf, o);
                if (lane + o < 32) suf += t;
            }
            unsigned cum = suf - ls;
#pragma unroll
            for (int j = 7; j >= 0; j--) {
                if (cum < need && cum + h[j] >= need) {
                    sh.bin = 8 * lane + j;
                    sh.need = need - cum;
                    sh.done = h[j] == need - cum;
                }
                cum += h[j];
            }
        }
        __syncthreads();
        pref |= (uint64_t)sh.bin << shift;
        mask |= (uint64_t)0xFF << shift;
        const unsigned done = sh.done;
        __syncthreads(); /* everyone has read sh before the next pass rewrites it */
        if (done) break;
    }
}

/* Block (g, r): the k largest keys of slice [g * per, (g + 1) * per) of row r of x [R, n], unordered,
 * into cand [R, G, k] (slots past a short slice's size hold 0, below every key). */
__global__ void __launch_bounds__(TK_THREADS) k_topk_part(const float *__restrict__ x, int n, int k, int per,
                                                          uint64_t *__restrict__ cand) {
    __shared__ tk_shared sh;
    __shared__ float xs[TK_SLICE];
    const int r = blockIdx.y, g = blockIdx.x, G = gridDim.x;
    const int i0 = g * per, cnt = n - i0 < per ? n - i0 : per;
    const float *xr = x + (size_t)r * n + i0;
    uint64_t *out = cand + ((size_t)r * G + g) * k;
    const bool staged = cnt <= TK_SLICE; /* uniform over the block */
    if (staged) tk_stage(xs, xr, cnt > 0 ? cnt : 0);
    auto key_at = [&](int i) { return tk_key(staged ? xs[i] : __ldg(xr + i), i0 + i); };
    if (k == 1) { /* the largest key: a maximum, no radix passes (an empty slice leaves 0, as below) */
        __shared__ uint64_t red[32];
        uint64_t best = 0;
        for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
            const uint64_t c = key_at(i);
            best = c > best ? c : best;
        }
        best = tk_block_max(best, red);
        if (threadIdx.x == 0) out[0] = best;
        return;
    }
    const int kk = cnt < k ? (cnt > 0 ? cnt : 0) : k;
    uint64_t pref = 0, mask = 0;
    if (kk > 0 && kk < cnt) tk_select(cnt, kk, key_at, pref, mask, sh);
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < cnt; i += blockDim.x) {
        const uint64_t c = key_at(i);
        if ((c & mask) >= pref) out[atomicAdd(&sh.count, 1u)] = c;
    }
    for (int i = kk + threadIdx.x; i < k; i += blockDim.x) out[i] = 0;
}

/* Block r: the k largest of row r's G * k candidates, sorted (largest first), as values and indices. */
__global__ void __launch_bounds__(TK_THREADS) k_topk_merge(const uint64_t *__restrict__ cand, int nc, int k,
                                                           float *__restrict__ vals, int32_t *__restrict__ idx) {
    __shared__ tk_shared sh;
    __shared__ uint64_t win[LMX_TOPK_MAX];
    __shared__ uint64_t cs[TK_CAND]; /* the row's candidates */
    const int r = blockIdx.x, tid = threadIdx.x;
    tk_stage(cs, cand + (size_t)r * nc, nc);
    auto key_at = [&](int i) { return cs[i]; };
    if (k == 1) {
        uint64_t best = 0;
        for (int i = tid; i < nc; i += blockDim.x) best = cs[i] > best ? cs[i] : best;
        best = tk_block_max(best, win);
        if (tid == 0) {
            vals[r] = tk_val(best);
            idx[r] = tk_idx(best);
        }
        return;
    }
    uint64_t pref = 0, mask = 0;
    if (k < nc) tk_select(nc, k, key_at, pref, mask, sh);
    int P = 1;
    while (P < k) P <<= 1;
    for (int i = tid; i < P; i += blockDim.x) win[i] = 0;
    if (tid == 0) sh.count = 0;
    __syncthreads();
    for (int i = tid; i < nc; i += blockDim.x) {
        const uint64_t c = cs[i];
        if ((c & mask) >= pref) {
            const unsigned s = atomicAdd(&sh.count, 1u);
            if (s < (unsigned)k) win[s] = c; /* exactly k unless fewer candidates than k */
        }
    }
    __syncthreads();
    /* bitonic sort of P keys, descending */
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size / 2; stride > 0; stride >>= 1) {
            for (int i = tid; i < P; i += blockDim.x) {
                const int j = i ^ stride;
                if (j > i) {
                    const bool desc = (i & size) == 0;
                    const uint64_t a = win[i], b = win[j];
                    if (desc ? a < b : a > b) {
                        win[i] = b;
                        win[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    for (int i = tid; i < k; i += blockDim.x) {
        vals[(size_t)r * k + i] = tk_val(win[i]);
        idx[(size_t)r * k + i] = tk_idx(win[i]);
    }
}

lmx_status cuda_topk(lmx_backend *be, const lmx_tensor *x, int R, int n, int k, float *vals, int32_t *idx) {
    cuda_backend *cb = (cuda_backend *)be;
    if (cb->topk_off) return LMX_ERR_UNSUPPORTED;
    if (R <= 0) return LMX_OK;
    if (k < 1 || k > LMX_TOPK_MAX || k > n)
        return lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "topk: k = %d outside [1, %d]", k,
                           n < LMX_TOPK_MAX ? n : LMX_TOPK_MAX);
    lmx_status st = cuda_graph_flush(cb);
    if (st) return st;
    /* slices: as many as fill the GPU, each at least 1024 values, their candidates at most TK_CAND */
    int G = cb->sm_count;
    if (G > TK_CAND / k) G = TK_CAND / k;
    if (G > (n + 1023) / 1024) G = (n + 1023) / 1024;
    if (G < 1) G = 1;
    const int per = (n + G - 1) / G;
    G = (n + per - 1) / per;
    const size_t cand_bytes = (size_t)R * G * k * sizeof(uint64_t), out_bytes = (size_t)R * k * 8;
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_TOPK, cand_bytes + out_bytes);
    if (!buf) return be->err.status;
    uint64_t *cand = (uint64_t *)buf;
    float *dv = (float *)(buf + cand_bytes);
    int32_t *di = (int32_t *)(dv + (size_t)R * k);
    k_topk_part<<<dim3(G, R), TK_THREADS, 0, cb->stream>>>((const float *)x->data, n, k, per, cand);
    if ((st = cuda_check_launch(cb, "topk"))) return st;
    k_topk_merge<<<R, TK_THREADS, 0, cb->stream>>>(cand, G * k, k, dv, di);
    if ((st = cuda_check_launch(cb, "topk"))) return st;
    /* values and indices (contiguous) in one copy to page-locked staging: copies to the caller's pageable
     * arrays would each be a synchronous staged copy */
    if (cb->topk_host_bytes < out_bytes) {
        if (cb->topk_host) cudaFreeHost(cb->topk_host);
        cb->topk_host = NULL;
        cb->topk_host_bytes = 0;
        CUDA_TRY(cb, cudaHostAlloc(&cb->topk_host, out_bytes, cudaHostAllocDefault), "topk staging");
        cb->topk_host_bytes = out_bytes;
    }
    CUDA_TRY(cb, cudaMemcpyAsync(cb->topk_host, dv, out_bytes, cudaMemcpyDeviceToHost, cb->stream), "topk");
    CUDA_TRY(cb, cudaStreamSynchronize(cb->stream), "topk");
    memcpy(vals, cb->topk_host, (size_t)R * k * sizeof(float));
    memcpy(idx, (const char *)cb->topk_host + (size_t)R * k * sizeof(float), (size_t)R * k * sizeof(int32_t));
    return LMX_OK;
}
