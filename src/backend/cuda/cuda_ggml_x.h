/* cuda_ggml_x.h - x quantized to int16 for the GEMVs of block-quantized weights (cuda_ggml.cu: GGUF blocks and
 * MLX rows; cuda_gstream.cu: one row of MLX 4-bit): the layout the kernels read, the quantization of a part
 * by eight lanes, and the launch that quantizes x ahead of a GEMV.  See cuda_ggml.cu's opening comment. */
#ifndef LMX_BACKEND_CUDA_GGML_X_H
#define LMX_BACKEND_CUDA_GGML_X_H

#include "cuda_gemv.h"

/* Where part pp of a row of x goes in the GEMV's layout of quantized x (UP = 1 << ul parts a unit,
 * gq_unit): the kernel's lane l takes units 32 g + l, so the 16-byte chunks i (0..3) of part k of
 * unit 32 g + l lie at int4 ((g UP + k) 4 + i) 32 + l, and its {d, s0, s1} at float4 (g UP + k) 32 + l:
 * the 32 lanes read each as one contiguous run.  A row takes gq_row_parts parts' room. */
static __device__ __forceinline__ int gq_xchunk(int pp, int ul) {
    const int u = pp >> ul, k = pp & ((1 << ul) - 1);
    return ((((u >> 5) << ul) + k) * 4) * 32 + (u & 31);
}
static __device__ __forceinline__ int gq_xpart(int pp, int ul) {
    const int u = pp >> ul, k = pp & ((1 << ul) - 1);
    return (((u >> 5) << ul) + k) * 32 + (u & 31);
}
static inline int64_t gq_row_parts(int64_t K, int UP) { return (K / 32 / UP + 31) / 32 * 32 * UP; }
static __host__ __device__ __forceinline__ int gq_ul(int UP) { return UP == 4 ? 2 : UP == 2 ? 1 : 0; } /* log2 UP */

/* (q . qx) over each half of a part: 8-bit codes q[8] (four per word) against 16-bit x X[16] (two per word).  SPLIT:
 * each half as two chains of four dp2a added at the end (integer sums, each under 2^31: the same value in any order),
 * half as long a chain of dependent instructions.  ggemv_body takes it where x was quantized before the launch (the
 * GEMVs of several rows, mostly: Qwen3-30B-A3B Q4_K_M batch 8 / 32 +2% on an H200), not where each block quantizes
 * one row itself (XS: those launches' registers are held so that they fit the GPU at once; one row -1.5% with it). */
template <int SPLIT = 0>
static __device__ __forceinline__ void gq_dot(const uint32_t (&q)[8], const int4 (&X)[4], int &i0, int &i1) {
    const int x[16] = {X[0].x, X[0].y, X[0].z, X[0].w, X[1].x, X[1].y, X[1].z, X[1].w,
                       X[2].x, X[2].y, X[2].z, X[2].w, X[3].x, X[3].y, X[3].z, X[3].w};
    int a[4] = {0, 0, 0, 0};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        const int c0 = SPLIT ? k & 1 : 0, c1 = 2 + c0;
        a[c0] = __dp2a_lo(x[2 * k], (int)q[k], a[c0]), a[c0] = __dp2a_hi(x[2 * k + 1], (int)q[k], a[c0]);
        a[c1] = __dp2a_lo(x[8 + 2 * k], (int)q[4 + k], a[c1]), a[c1] = __dp2a_hi(x[8 + 2 * k + 1], (int)q[4 + k], a[c1]);
    }
    i0 = SPLIT ? a[0] + a[1] : a[0], i1 = SPLIT ? a[2] + a[3] : a[2];
}

/* acc plus one part of a unit against x: its codes q, scales sc and mins mn (gq_unit::part) against x's codes X
 * and {d, s0, s1} xs, as every int16 GGUF row sum takes a part (k_ggemv, k_gstream6) */
template <int SPLIT = 0>
static __device__ __forceinline__ float gq_part_acc(const uint32_t (&q)[8], const float (&sc)[2], const float (&mn)[2],
                                                    const int4 (&X)[4], const float4 &xs, float acc) {
    int i0, i1;
    gq_dot<SPLIT>(q, X, i0, i1);
    const float dot = fmaf(sc[0], (float)i0, sc[1] * (float)i1);
    return fmaf(xs.x, dot, acc - fmaf(mn[0], xs.y, mn[1] * xs.z));
}

/* acc[r] plus part k of unit u[r] of two rows against one part of x (X, xs): a gate / up pair, or two rows of one
 * weight (k_gstream6, k_moe_gu_staged) */
template <class U>
static __device__ __forceinline__ void gq_two_acc(const U (&u)[2], int k, const int4 (&X)[4], const float4 &xs,
                                                  float (&acc)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        uint32_t q[8];
        float sc[2], mn[2];
        u[r].part(k, q, sc, mn);
        acc[r] = gq_part_acc(q, sc, mn, X, xs, acc[r]);
    }
}

/* A layout of quantized x (gq_xchunk for units of 1 << ul parts): codes xq and {d, s0, s1, 0} xm, each row PR
 * parts' room.  The quantization writes one or two (a launch of weights of unit sizes 2 and 4: Q4_K q and k
 * with a Q6_K v); xq NULL: none.  nib: each chunk's 8 codes in the order of a 4-bit word's nibbles, low ones
 * then high ones: words (x0, x2), (x4, x6), (x1, x3), (x5, x7) (k_gstream1). */
struct gq_xq {
    int4 *xq;
    float4 *xm;
    int PR, ul, nib;
};

/* Eight lanes quantize a part, lane i of them holding elements 4i .. 4i + 3 in v, into part pc of row m of
 * o (and of o1 where o1.xq): codes to the part's chunks (gq_xchunk), {d, d * sum of codes 0..15, d * sum
 * of codes 16..31, 0} to its xm (gq_xpart); store 0: the reductions only (every lane of the warp takes
 * part in them). */
static __device__ __forceinline__ void gq_quant_part(float4 v, const gq_xq &o, const gq_xq &o1, int m, int pc,
                                                     bool store) {
    const int i = threadIdx.x & 7;
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float id = amax > 0.0f ? 32767.0f / amax : 0.0f, d = amax / 32767.0f;
    const int a = __float2int_rn(v.x * id), b = __float2int_rn(v.y * id), c = __float2int_rn(v.z * id),
              e = __float2int_rn(v.w * id);
    int s = a + b + c + e;
#pragma unroll
    for (int o = 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o); /* lanes 0-3: half 0, 4-7: half 1 */
    const int s1 = __shfl_down_sync(0xffffffffu, s, 4);
    if (!store) return;
    const uint2 w = make_uint2((uint32_t)(a & 0xffff) | ((uint32_t)b << 16), (uint32_t)(c & 0xffff) | ((uint32_t)e << 16));
    const float4 mv = make_float4(d, d * (float)s, d * (float)s1, 0.0f);
#pragma unroll
    for (int t = 0; t < 2; t++) {
        const gq_xq &q = t ? o1 : o;
        if (!q.xq) break;
        int4 *ch = q.xq + (size_t)m * q.PR * 4 + gq_xchunk(pc, q.ul) + 32 * (i >> 1);
        if (q.nib) { /* lane i & 1 holds x0..x3 or x4..x7 of the chunk */
            ((uint32_t *)ch)[i & 1] = (uint32_t)(a & 0xffff) | ((uint32_t)c << 16);
            ((uint32_t *)ch)[2 + (i & 1)] = (uint32_t)(b & 0xffff) | ((uint32_t)e << 16);
        } else {
            ((uint2 *)ch)[i & 1] = w;
        }
        if (i == 0) q.xm[(size_t)m * q.PR + gq_xpart(pc, q.ul)] = mv;
    }
}

/* Parts B bx .. B bx + B - 1 of row m of x [M, K] (eight lanes a part, B = blockDim.x / 8) into o [and o1]; with
 * nm.w (one row) the RMSNorm of x as the norm kernels compute it, inv its 1 / rms (cuda_rms_inv256). */
static __device__ __forceinline__ float4 gquant_x_load(const float *__restrict__ x, int K, const cuda_row_norm &nm,
                                                       float inv, int m, int pc) { /* this lane's 4 values of part pc */
    const int i = 32 * pc + 4 * (threadIdx.x & 7);
    float4 v = *(const float4 *)(x + (size_t)m * K + i);
    if (nm.w) {
        v.x = cuda_norm_elem(v.x, inv, nm.w, nm.wt, i, nm.add_one);
        v.y = cuda_norm_elem(v.y, inv, nm.w, nm.wt, i + 1, nm.add_one);
        v.z = cuda_norm_elem(v.z, inv, nm.w, nm.wt, i + 2, nm.add_one);
        v.w = cuda_norm_elem(v.w, inv, nm.w, nm.wt, i + 3, nm.add_one);
    }
    return v;
}
static __device__ __forceinline__ void gquant_x_parts(const float *__restrict__ x, const gq_xq &o, const gq_xq &o1,
                                                      int K, const cuda_row_norm &nm, float inv, int m, int bx) {
    const int P = K / 32, p = bx * (blockDim.x / 8) + threadIdx.x / 8, pc = p < P ? p : P - 1;
    gq_quant_part(gquant_x_load(x, K, nm, inv, m, pc), o, o1, m, pc, p < P);
}

/* x's codes and scales as the GEMV reads them: from global memory (read-only cache), or (XS) from the
 * block's shared memory. */
template <int XS, class V> static __device__ __forceinline__ V gq_ldx(const V *p) {
    if constexpr (XS) return *p;
    else return __ldg(p);
}

extern __shared__ int4 gq_xs[]; /* XS: x's codes [PR * 4], then its scales [PR] (float4) */

#define GQ_XS_MAX_K 4096 /* the longest row of x a GEMV block quantizes itself (XS; 10 KB of shared memory) */
static inline size_t gq_xs_bytes(int xs, const gq_xq &o) { return xs ? (size_t)o.PR * (4 * sizeof(int4) + sizeof(float4)) : 0; }


/* x [M, K] quantized (k_gquant_x, with nm's RMSNorm folded in where nm.w) into scratch for GEMVs of units of
 * ups[j] parts (j < nl, 1 or 2): xo[j], its layout.  With rt (one layout), the launch also routes the rows
 * (k_moe_quant_route).  0 with the error set when the scratch cannot grow. */
int gq_quant_x(cuda_backend *cb, const int *ups, int nl, const float *x, int M, int K, const cuda_row_norm &nm, gq_xq *xo,
               const cuda_moe_router *rt = NULL, int nib = 0);

/* One row of MLX 4-bit weights as a stream (cuda_gstream.cu): whether k_gstream1 takes weight w, and the launch
 * for the n segments of sg (glu >= 0: the gate/up pair) with nm's norm (where nm.w) and the residual add. */
int cuda_gstream_takes(const cuda_backend *cb, const lmx_tensor *w);
lmx_status cuda_gstream(cuda_backend *cb, int n, const gv_segs &sg, int glu, const float *x, int K, const cuda_row_norm &nm,
                        int resid);
/* One row of n segments of type (glu >= 0: the gate/up pair) of width K as a stream (k_gstream6): whether it takes
 * them (one segment of Q6_K, 16-byte aligned, a long row, no LoRA term), and the launch on x quantized in xo (Q6_K's
 * unit layout). */
int cuda_gstream6_takes(const cuda_backend *cb, int type, int n, int glu, const gv_segs &sg, int64_t K);
lmx_status cuda_gstream6(cuda_backend *cb, const gv_segs &sg, const gq_xq &xo, int K, int resid);

#endif
