/* cuda_matmul.cu - out[M, N] = x[M, K] @ w[N, K]^T (+ bias) on the GPU, and weight dequantization.
 *
 * Few rows (decode, M <= GEMV_MAX_ROWS): GEMV kernels that stream each weight byte once with
 * 16-byte loads, one warp per output row (two for M >= 2, so each x vector loaded serves two
 * rows), f32 accumulation, the bias fused.  Dense bf16/f16/f32 and MLX affine 2/4/8-bit have
 * vectorised kernels; GGUF blocks and odd shapes use a generic per-element kernel.
 * Many rows (prefill): cuBLAS tensor-core GEMM with bf16 (f16) operands and f32 output; x is
 * narrowed once, quantized weights are dequantized to bf16 in blocks of rows first. */
#include <string.h>

#include "cuda_internal.h"

#define GEMV_MAX_ROWS 8           /* dense: above this, cuBLAS */
#define QGEMV_MAX_ROWS 32         /* quantized: above this, dequantize + cuBLAS */
#define DEQUANT_BLOCK_BYTES (64u << 20)

/* ---- weight descriptors and per-element decoding ------------------------------------------- */

typedef struct wdesc {
    const void *data, *scales, *biases;
    lmx_dtype dtype, sdtype;
    int bits, group, gtype, gelems, gbytes;
    int64_t K, row_bytes, words_per_row, groups_per_row;
} wdesc;

static wdesc make_wdesc(const lmx_tensor *w) {
    wdesc d;
    memset(&d, 0, sizeof d);
    d.data = w->data;
    d.dtype = w->dtype;
    d.K = w->shape[w->ndim - 1];
    d.gtype = w->q.ggml_type;
    if (d.gtype) {
        d.gelems = lmx_ggml_block_elems(d.gtype);
        d.gbytes = lmx_ggml_block_bytes(d.gtype);
        d.row_bytes = (int64_t)lmx_ggml_row_bytes(d.gtype, d.K);
    }
    d.bits = w->q.bits;
    if (d.bits) {
        d.group = w->q.group;
        d.scales = w->q.scales;
        d.biases = w->q.biases;
        d.sdtype = w->q.scale_dtype;
        d.words_per_row = d.K * d.bits / 32;
        d.groups_per_row = d.K / d.group;
    }
    return d;
}

__device__ __forceinline__ float f16_at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Element e of one GGUF block (layouts in backend/cpu/ggml_quant.c). */
__device__ float ggml_elem(int type, const uint8_t *b, int e) {
    switch (type) {
    case LMX_GGML_Q8_0: return (float)(int8_t)b[2 + e] * f16_at(b);
    case LMX_GGML_Q4_0: {
        int nib = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
        return (float)(nib - 8) * f16_at(b);
    }
    case LMX_GGML_Q4_K: {
        int s = e / 32, c = e / 64, h = (e / 32) & 1, l = e % 32;
        const uint8_t *sc = b + 4;
        int scv, m;
        if (s < 4) { scv = sc[s] & 63; m = sc[s + 4] & 63; }
        else { scv = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4); m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4); }
        int q = (b[16 + 32 * c + l] >> (4 * h)) & 15;
        return f16_at(b) * (float)scv * (float)q - f16_at(b + 2) * (float)m;
    }
    case LMX_GGML_Q6_K: {
        int a = e / 128, r = e % 128, i = r / 32, l = r % 32;
        const uint8_t *ql = b + 64 * a, *qh = b + 128 + 32 * a;
        int lo = (i & 1) ? ql[l + 32] : ql[l];
        lo = i >= 2 ? lo >> 4 : lo & 15;
        int q = (lo | (((qh[l] >> (2 * i)) & 3) << 4)) - 32;
        return f16_at(b + 208) * (float)(int8_t)b[192 + e / 16] * (float)q;
    }
    default: return 0.0f;
    }
}

/* Element (n, k) of any weight. */
__device__ __forceinline__ float w_elem(const wdesc &d, int64_t n, int64_t k) {
    if (d.gtype)
        return ggml_elem(d.gtype, (const uint8_t *)d.data + n * d.row_bytes + (k / d.gelems) * d.gbytes,
                         (int)(k % d.gelems));
    if (d.bits) {
        int per = 32 / d.bits;
        uint32_t word = ((const uint32_t *)d.data)[n * d.words_per_row + k / per];
        uint32_t q = (word >> ((k % per) * d.bits)) & ((1u << d.bits) - 1u);
        int64_t g = n * d.groups_per_row + k / d.group;
        return (float)q * cuda_elem(d.scales, d.sdtype, g) + cuda_elem(d.biases, d.sdtype, g);
    }
    return cuda_elem(d.data, d.dtype, n * d.K + k);
}

/* ---- embedding rows and dequantization ------------------------------------------------------ */

typedef struct emb_ids { int32_t id[512]; } emb_ids;

__global__ void k_embed(float *out, const wdesc d, const emb_ids ids, const int *dyn, float scale) {
    int64_t n = dyn ? dyn[CUDA_DYN_IDS + blockIdx.y] : ids.id[blockIdx.y];
    float *o = out + (int64_t)blockIdx.y * d.K;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.K; k += (int64_t)gridDim.x * blockDim.x)
        o[k] = w_elem(d, n, k) * scale;
}

lmx_status cuda_embed_rows(cuda_backend *cb, float *out, const lmx_tensor *w, const int32_t *ids, int M,
                           float scale) {
    wdesc d = make_wdesc(w);
    emb_ids a;
    for (int m0 = 0; m0 < M; m0 += 512) {
        int n = M - m0 < 512 ? M - m0 : 512;
        for (int i = 0; i < n; i++) a.id[i] = ids[m0 + i];
        unsigned gx = cuda_blocks(d.K, 256);
        dim3 grid(gx < 32 ? gx : 32, n);
        k_embed<<<grid, 256, 0, cb->stream>>>(out + (int64_t)m0 * d.K, d, a, cb->dyn_on ? cb->dyn : NULL, scale);
        lmx_status st = cuda_check_launch(cb, "embed");
        if (st) return st;
    }
    return LMX_OK;
}

__global__ void k_dequant_bf16(__nv_bfloat16 *dst, const wdesc d, int64_t n0, int64_t rows) {
    int64_t total = rows * d.K;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(w_elem(d, n0 + i / d.K, i % d.K));
}

lmx_status cuda_dequant_rows_bf16(cuda_backend *cb, const lmx_tensor *w, int64_t n0, int64_t rows,
                                  __nv_bfloat16 *dst) {
    wdesc d = make_wdesc(w);
    int64_t blocks = (rows * d.K + 255) / 256;
    k_dequant_bf16<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, cb->stream>>>(dst, d, n0, rows);
    return cuda_check_launch(cb, "dequantize");
}

/* ---- GEMV kernels ----------------------------------------------------------------------------- */

template <typename WT> struct vec_traits;
template <> struct vec_traits<float> {
    static constexpr int E = 4;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
    }
};
template <> struct vec_traits<__nv_bfloat16> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};
template <> struct vec_traits<__half> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 t = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
            f[2 * i] = t.x;
            f[2 * i + 1] = t.y;
        }
    }
};

/* Bias element n (any float dtype), 0 without bias. */
__device__ __forceinline__ float bias_at(const void *b, lmx_dtype bt, int64_t n) {
    return b ? cuda_elem(b, bt, n) : 0.0f;
}

/* Dense GEMV: each warp computes R consecutive output rows for all MM input rows.
 * x [MM, K] f32, w [N, K] (K % E == 0, rows 16-byte aligned), y [MM, N]. */
/* Up to 3 weights sharing x (fused q/k/v or gate/up in decode graphs): blockIdx.y picks one. */
typedef struct gemv_seg { const void *w, *bias; float *y; int N; lmx_dtype bt; } gemv_seg;
typedef struct gemv_segs { gemv_seg s[3]; } gemv_segs;

__device__ __forceinline__ float glu_act(float a, int act) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi); the same arithmetic as k_glu */
    return act == LMX_ACT_SILU ? a / (1.0f + expf(-a)) : 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* PAIR = 1 (R = 2): each warp takes row n of segment 0 (gate) and row n of segment 1 (up) and
 * writes gate[n] = act(gate . x) * (up . x), up[n] = up . x: the gate/up matvecs and the GLU of
 * a decode graph in one launch. */
template <typename WT, int MM, int R, int PAIR = 0>
__global__ void __launch_bounds__(256) k_gemv(const float *__restrict__ x, const gemv_segs sg, int K, int act = 0) {
    /* selects of fixed fields: a dynamic index into the parameter struct would copy it to local
     * memory and slow every GEMV */
    const int sy = blockIdx.y;
#define SEG_FIELD(f) (sy == 0 ? sg.s[0].f : sy == 1 ? sg.s[1].f : sg.s[2].f)
    const WT *__restrict__ w = (const WT *)SEG_FIELD(w);
    const void *bias = SEG_FIELD(bias);
    const lmx_dtype bt = SEG_FIELD(bt);
    float *__restrict__ y = SEG_FIELD(y);
    const int N = SEG_FIELD(N);
#undef SEG_FIELD
    constexpr int E = vec_traits<WT>::E;
    const int lane = threadIdx.x % 32;
    const int n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (PAIR ? 1 : R);
    if (n0 >= N) return;
    const int nv = K / E;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = PAIR ? (const uint4 *)((const WT *)(r == 0 ? sg.s[0].w : sg.s[1].w) + (size_t)n0 * K)
                     : (const uint4 *)(w + (size_t)(n0 + r < N ? n0 + r : n0) * K);
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;
    constexpr int U = R == 1 ? 4 : 2; /* vectors in flight per row and lane */
    int v = lane;
    for (; v + 32 * (U - 1) < nv; v += 32 * U) {
        uint4 q[U][R];
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) q[u][r] = __ldcs(wr[r] + v + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = (v + 32 * u) * E;
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float xf[E];
#pragma unroll
                for (int e = 0; e < E; e += 4) {
                    float4 t = __ldg((const float4 *)(x + (size_t)m * K + k + e));
                    xf[e] = t.x; xf[e + 1] = t.y; xf[e + 2] = t.z; xf[e + 3] = t.w;
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf[E];
                    vec_traits<WT>::unpack(q[u][r], wf);
#pragma unroll
                    for (int e = 0; e < E; e++) acc[r][m] = fmaf(wf[e], xf[e], acc[r][m]);
                }
            }
        }
    }
    for (; v < nv; v += 32) {
        const int k = v * E;
#pragma unroll
        for (int r = 0; r < R; r++) {
            float wf[E];
            vec_traits<WT>::unpack(__ldcs(wr[r] + v), wf);
#pragma unroll
            for (int m = 0; m < MM; m++)
#pragma unroll
                for (int e = 0; e < E; e++) acc[r][m] = fmaf(wf[e], x[(size_t)m * K + k + e], acc[r][m]);
        }
    }
    if constexpr (PAIR != 0) {
#pragma unroll
        for (int m = 0; m < MM; m++) {
            float sg0 = cuda_warp_sum(acc[0][m]), su = cuda_warp_sum(acc[R - 1][m]);
            if (lane == 0) {
                float gv = sg0 + bias_at(sg.s[0].bias, sg.s[0].bt, n0);
                float uv = su + bias_at(sg.s[1].bias, sg.s[1].bt, n0);
                sg.s[0].y[(size_t)m * N + n0] = glu_act(gv, act) * uv;
                sg.s[1].y[(size_t)m * N + n0] = uv;
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float s = cuda_warp_sum(acc[r][m]);
                if (lane == 0 && n0 + r < N) y[(size_t)m * N + n0 + r] = s + bias_at(bias, bt, n0 + r);
            }
    }
}

/* MLX affine GEMV: warp per row; a lane takes 4 packed words (one 16-byte load) at a time, all in
 * one group (group % (128 / bits) == 0).  acc += scale * (q . x) + bias * sum(x). */
template <int BITS, int MM>
__global__ void __launch_bounds__(256) k_qgemv(const float *__restrict__ x, const wdesc d, const void *bias,
                                               lmx_dtype bt, float *__restrict__ y, int N, int M0) {
    constexpr int PER = 32 / BITS, EV = 4 * PER; /* elements per word, per vector */
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const int K = (int)d.K;
    const uint4 *wr = (const uint4 *)((const uint32_t *)d.data + (size_t)n * d.words_per_row);
    const int nv = K / EV;
    float acc[MM];
#pragma unroll
    for (int m = 0; m < MM; m++) acc[m] = 0.0f;
    for (int v = lane; v < nv; v += 32) {
        uint4 q = __ldcs(wr + v);
        const int k0 = v * EV;
        const int64_t g = (int64_t)n * d.groups_per_row + k0 / d.group;
        const float s = cuda_elem(d.scales, d.sdtype, g), b = cuda_elem(d.biases, d.sdtype, g);
        const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int m = 0; m < MM; m++) {
            const float *xm = x + (size_t)m * K + k0;
            float dot = 0.0f, xs = 0.0f;
#pragma unroll
            for (int wi = 0; wi < 4; wi++) {
#pragma unroll
                for (int e = 0; e < PER; e += 4) {
                    float4 t = __ldg((const float4 *)(xm + wi * PER + e));
                    const float xv[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        float qv = (float)((words[wi] >> ((e + j) * BITS)) & ((1u << BITS) - 1u));
                        dot = fmaf(qv, xv[j], dot);
                        xs += xv[j];
                    }
                }
            }
            acc[m] = fmaf(s, dot, fmaf(b, xs, acc[m]));
        }
    }
#pragma unroll
    for (int m = 0; m < MM; m++) {
        float s = cuda_warp_sum(acc[m]);
        if (lane == 0) y[(size_t)m * N + n] = s + bias_at(bias, bt, n);
    }
}

/* Any weight format, any shape: warp per row, per-element decoding.  M <= GEMV_ANY_ROWS. */
#define GEMV_ANY_ROWS 8
__global__ void __launch_bounds__(256) k_gemv_any(const float *__restrict__ x, const wdesc d, const void *bias,
                                                  lmx_dtype bt, float *__restrict__ y, int N, int M) {
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    float acc[GEMV_ANY_ROWS];
#pragma unroll
    for (int m = 0; m < GEMV_ANY_ROWS; m++) acc[m] = 0.0f;
    for (int64_t k = lane; k < d.K; k += 32) {
        float wv = w_elem(d, n, k);
#pragma unroll
        for (int m = 0; m < GEMV_ANY_ROWS; m++)
            if (m < M) acc[m] = fmaf(wv, x[(size_t)m * d.K + k], acc[m]);
    }
#pragma unroll
    for (int m = 0; m < GEMV_ANY_ROWS; m++) {
        float s = cuda_warp_sum(acc[m]);
        if (lane == 0 && m < M) y[(size_t)m * N + n] = s + bias_at(bias, bt, n);
    }
}

template <typename WT, int MM>
static void launch_dense(cuda_backend *cb, const float *x, const lmx_tensor *w, const void *bias, lmx_dtype bt,
                         float *y, int N, int K) {
    constexpr int R = MM == 1 ? 1 : 2;
    unsigned grid = cuda_blocks(N, 8 * R);
    gemv_segs sg;
    memset(&sg, 0, sizeof sg);
    sg.s[0].w = w->data;
    sg.s[0].bias = bias;
    sg.s[0].bt = bt;
    sg.s[0].y = y;
    sg.s[0].N = N;
    k_gemv<WT, MM, R><<<grid, 256, 0, cb->stream>>>(x, sg, K);
}

template <typename WT, int MM>
static void launch_dense_multi(cuda_backend *cb, const float *x, const gemv_segs &sg, int n, int K) {
    constexpr int R = MM == 1 ? 1 : 2;
    unsigned grid = 1;
    for (int i = 0; i < n; i++)
        if (cuda_blocks(sg.s[i].N, 8 * R) > grid) grid = cuda_blocks(sg.s[i].N, 8 * R);
    k_gemv<WT, MM, R><<<dim3(grid, n), 256, 0, cb->stream>>>(x, sg, K);
}

template <typename WT, int MM>
static void launch_dense_glu(cuda_backend *cb, const float *x, const gemv_segs &sg, int K, int act) {
    k_gemv<WT, MM, 2, 1><<<cuda_blocks(sg.s[0].N, 8), 256, 0, cb->stream>>>(x, sg, K, act);
}

template <typename WT>
static void dense_glu(cuda_backend *cb, const float *x, const gemv_segs &sg, int K, int M, int act) {
    switch (M) {
    case 1: launch_dense_glu<WT, 1>(cb, x, sg, K, act); break;
    case 2: launch_dense_glu<WT, 2>(cb, x, sg, K, act); break;
    case 3: launch_dense_glu<WT, 3>(cb, x, sg, K, act); break;
    case 4: launch_dense_glu<WT, 4>(cb, x, sg, K, act); break;
    case 5: launch_dense_glu<WT, 5>(cb, x, sg, K, act); break;
    case 6: launch_dense_glu<WT, 6>(cb, x, sg, K, act); break;
    case 7: launch_dense_glu<WT, 7>(cb, x, sg, K, act); break;
    default: launch_dense_glu<WT, 8>(cb, x, sg, K, act); break;
    }
}

template <typename WT>
static void dense_multi(cuda_backend *cb, const float *x, const gemv_segs &sg, int n, int K, int M) {
    switch (M) {
    case 1: launch_dense_multi<WT, 1>(cb, x, sg, n, K); break;
    case 2: launch_dense_multi<WT, 2>(cb, x, sg, n, K); break;
    case 3: launch_dense_multi<WT, 3>(cb, x, sg, n, K); break;
    case 4: launch_dense_multi<WT, 4>(cb, x, sg, n, K); break;
    case 5: launch_dense_multi<WT, 5>(cb, x, sg, n, K); break;
    case 6: launch_dense_multi<WT, 6>(cb, x, sg, n, K); break;
    case 7: launch_dense_multi<WT, 7>(cb, x, sg, n, K); break;
    default: launch_dense_multi<WT, 8>(cb, x, sg, n, K); break;
    }
}

template <typename WT>
static void dense_rows(cuda_backend *cb, const float *x, const lmx_tensor *w, const void *bias, lmx_dtype bt,
                       float *y, int N, int K, int M) {
    switch (M) {
    case 1: launch_dense<WT, 1>(cb, x, w, bias, bt, y, N, K); break;
    case 2: launch_dense<WT, 2>(cb, x, w, bias, bt, y, N, K); break;
    case 3: launch_dense<WT, 3>(cb, x, w, bias, bt, y, N, K); break;
    case 4: launch_dense<WT, 4>(cb, x, w, bias, bt, y, N, K); break;
    case 5: launch_dense<WT, 5>(cb, x, w, bias, bt, y, N, K); break;
    case 6: launch_dense<WT, 6>(cb, x, w, bias, bt, y, N, K); break;
    case 7: launch_dense<WT, 7>(cb, x, w, bias, bt, y, N, K); break;
    default: launch_dense<WT, 8>(cb, x, w, bias, bt, y, N, K); break;
    }
}

template <int BITS>
static void quant_rows(cuda_backend *cb, const float *x, const wdesc &d, const void *bias, lmx_dtype bt, float *y,
                       int N, int M) {
    unsigned grid = cuda_blocks(N, 8);
    switch (M) {
    case 1: k_qgemv<BITS, 1><<<grid, 256, 0, cb->stream>>>(x, d, bias, bt, y, N, M); break;
    case 2: k_qgemv<BITS, 2><<<grid, 256, 0, cb->stream>>>(x, d, bias, bt, y, N, M); break;
    case 3: k_qgemv<BITS, 3><<<grid, 256, 0, cb->stream>>>(x, d, bias, bt, y, N, M); break;
    case 4: k_qgemv<BITS, 4><<<grid, 256, 0, cb->stream>>>(x, d, bias, bt, y, N, M); break;
    default: k_qgemv<BITS, 8><<<grid, 256, 0, cb->stream>>>(x, d, bias, bt, y, N, M); break;
    }
}

/* ---- GEMM (cuBLAS) ---------------------------------------------------------------------------- */

__global__ void k_narrow_bf16(__nv_bfloat16 *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}
__global__ void k_narrow_f16(__half *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2half(src[i]);
}
/* y [M, N] += bias [N] */
__global__ void k_add_bias(float *y, const void *b, lmx_dtype bt, int64_t M, int64_t N) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += cuda_elem(b, bt, i % N);
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 16384 ? (b ? b : 1) : 16384);
}

/* y[:, n0:n0+nb] = x16 [M, K] @ w16[nb, K]^T with f32 output (ldc N). */
static lmx_status gemm16(cuda_backend *cb, const void *x16, const void *w16, cudaDataType t, float *y, int M,
                         int nb, int K, int N) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, nb, M, K, &one, w16, t, K, x16, t, K, &zero,
                                    y, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, "matmul");
}

static lmx_status matmul_gemm(cuda_backend *cb, const float *x, const lmx_tensor *w, float *y, int M, int N,
                              int K) {
    lmx_status st;
    if (!w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t s = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, (const float *)w->data, K,
                                       x, K, &zero, y, N);
        return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, "matmul");
    }
    int f16 = !w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_F16;
    void *x16 = cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)M * K * 2);
    if (!x16) return cb->base.err.status;
    if (f16) k_narrow_f16<<<grid_for((int64_t)M * K), 256, 0, cb->stream>>>((__half *)x16, x, (int64_t)M * K);
    else k_narrow_bf16<<<grid_for((int64_t)M * K), 256, 0, cb->stream>>>((__nv_bfloat16 *)x16, x, (int64_t)M * K);
    if ((st = cuda_check_launch(cb, "matmul"))) return st;
    if (!w->q.bits && !w->q.ggml_type)
        return gemm16(cb, x16, w->data, f16 ? CUDA_R_16F : CUDA_R_16BF, y, M, N, K, N);
    int64_t block = DEQUANT_BLOCK_BYTES / ((int64_t)K * 2);
    if (block < 64) block = 64;
    if (block > N) block = N;
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_W, (size_t)block * K * 2);
    if (!wb) return cb->base.err.status;
    for (int64_t n0 = 0; n0 < N; n0 += block) {
        int nb = (int)(N - n0 < block ? N - n0 : block);
        if ((st = cuda_dequant_rows_bf16(cb, w, n0, nb, wb))) return st;
        if ((st = gemm16(cb, x16, wb, CUDA_R_16BF, y + n0, M, nb, K, N))) return st;
    }
    return LMX_OK;
}

/* ---- the op ------------------------------------------------------------------------------------ */

lmx_status cuda_matmul_multi(cuda_backend *cb, int n, lmx_tensor *const *outs, const lmx_tensor *x,
                             const lmx_tensor *const *ws, const lmx_tensor *const *biases, int M, int glu) {
    if (n < 1 || n > 3 || M < 1 || M > GEMV_MAX_ROWS) return LMX_ERR_UNSUPPORTED;
    lmx_dtype dt = ws[0]->dtype;
    int K = (int)ws[0]->shape[1];
    int E = dt == LMX_DTYPE_F32 ? 4 : 8;
    if (K % E != 0 || (dt != LMX_DTYPE_BF16 && dt != LMX_DTYPE_F16 && dt != LMX_DTYPE_F32)) return LMX_ERR_UNSUPPORTED;
    gemv_segs sg;
    memset(&sg, 0, sizeof sg);
    for (int i = 0; i < n; i++) {
        const lmx_tensor *w = ws[i];
        if (w->q.bits || w->q.ggml_type || w->dtype != dt || w->ndim != 2 || (int)w->shape[1] != K)
            return LMX_ERR_UNSUPPORTED;
        sg.s[i].w = w->data;
        sg.s[i].bias = biases[i] ? biases[i]->data : NULL;
        sg.s[i].bt = biases[i] ? biases[i]->dtype : LMX_DTYPE_F32;
        sg.s[i].y = (float *)outs[i]->data;
        sg.s[i].N = (int)w->shape[0];
    }
    const float *xs = (const float *)x->data;
    if (glu >= 0) {
        if (n != 2 || sg.s[0].N != sg.s[1].N) return LMX_ERR_UNSUPPORTED;
        if (dt == LMX_DTYPE_BF16) dense_glu<__nv_bfloat16>(cb, xs, sg, K, M, glu);
        else if (dt == LMX_DTYPE_F16) dense_glu<__half>(cb, xs, sg, K, M, glu);
        else dense_glu<float>(cb, xs, sg, K, M, glu);
        return cuda_check_launch(cb, "matmul + glu");
    }
    if (dt == LMX_DTYPE_BF16) dense_multi<__nv_bfloat16>(cb, xs, sg, n, K, M);
    else if (dt == LMX_DTYPE_F16) dense_multi<__half>(cb, xs, sg, n, K, M);
    else dense_multi<float>(cb, xs, sg, n, K, M);
    return cuda_check_launch(cb, "matmul");
}

lmx_status cuda_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                       const lmx_tensor *bias, int M) {
    cuda_backend *cb = (cuda_backend *)be;
    int N = (int)w->shape[0], K = (int)w->shape[1];
    const float *xs = (const float *)x->data;
    float *y = (float *)out->data;
    const void *bp = bias ? bias->data : NULL;
    lmx_dtype bt = bias ? bias->dtype : LMX_DTYPE_F32;
    if (M <= 0) return LMX_OK;
    int quant = w->q.bits || w->q.ggml_type;
    if (!quant && M <= GEMV_MAX_ROWS) {
        int E = w->dtype == LMX_DTYPE_F32 ? 4 : 8;
        if (K % E == 0) {
            if (w->dtype == LMX_DTYPE_BF16) dense_rows<__nv_bfloat16>(cb, xs, w, bp, bt, y, N, K, M);
            else if (w->dtype == LMX_DTYPE_F16) dense_rows<__half>(cb, xs, w, bp, bt, y, N, K, M);
            else dense_rows<float>(cb, xs, w, bp, bt, y, N, K, M);
            return cuda_check_launch(cb, "matmul");
        }
    }
    if (quant && M <= QGEMV_MAX_ROWS) {
        wdesc d = make_wdesc(w);
        int ev = d.bits ? 128 / d.bits : 0;
        int vec = d.bits && d.group % ev == 0 && K % ev == 0 && (d.words_per_row * 4) % 16 == 0;
        for (int m0 = 0; m0 < M; m0 += 8) {
            int mc = M - m0 < 8 ? M - m0 : 8;
            const float *xm = xs + (size_t)m0 * K;
            float *ym = y + (size_t)m0 * N;
            if (vec && d.bits == 4) quant_rows<4>(cb, xm, d, bp, bt, ym, N, mc);
            else if (vec && d.bits == 8) quant_rows<8>(cb, xm, d, bp, bt, ym, N, mc);
            else if (vec && d.bits == 2) quant_rows<2>(cb, xm, d, bp, bt, ym, N, mc);
            else k_gemv_any<<<cuda_blocks(N, 8), 256, 0, cb->stream>>>(xm, d, bp, bt, ym, N, mc);
            lmx_status st = cuda_check_launch(cb, "matmul");
            if (st) return st;
        }
        return LMX_OK;
    }
    if (M <= GEMV_MAX_ROWS) { /* dense with an odd K */
        wdesc d = make_wdesc(w);
        k_gemv_any<<<cuda_blocks(N, 8), 256, 0, cb->stream>>>(xs, d, bp, bt, y, N, M);
        return cuda_check_launch(cb, "matmul");
    }
    lmx_status st = matmul_gemm(cb, xs, w, y, M, N, K);
    if (st) return st;
    if (bp) {
        k_add_bias<<<grid_for((int64_t)M * N), 256, 0, cb->stream>>>(y, bp, bt, M, N);
        return cuda_check_launch(cb, "matmul bias");
    }
    return LMX_OK;
}
