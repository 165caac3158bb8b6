/* cuda_gemv.cu - y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for few rows (decode): every weight byte is
 * read once, with 16-byte loads, f32 accumulation and the bias fused.
 *
 * A warp takes R consecutive output rows (each x vector it loads serves R rows); lanes stride over
 * the row's 16-byte vectors, the next vectors' loads in flight while the current ones are used.
 * One launch may cover up to 3 weights of the same input (fused q/k/v or gate/up in decode graphs;
 * blockIdx.y picks the weight), and gate/up may end in the GLU (a warp takes row n of both and
 * writes act(gate . x) * (up . x)).  Under programmatic dependent launch a warp loads its first
 * weight vectors before it waits for the kernel that writes x, so weight streaming starts while
 * the previous kernel drains.
 *
 * Formats: dense bf16 / f16 / f32 (K a multiple of the vector), MLX affine 4 and 8 bit (vectors
 * inside one group).  A 4- or 8-bit code q becomes a float without an int-to-float conversion:
 * __byte_perm puts its byte under the exponent of 2^23, and subtracting 2^23 leaves q exactly;
 * then acc += scale * (q . x) + bias * sum(x) per vector.  Everything else (GGUF blocks, 2-bit,
 * odd shapes) takes the generic kernel, one element at a time. */
#include "cuda_weights.h"

/* ---- weights of one launch ----------------------------------------------------------------- */

typedef struct gv_seg {
    const void *w;                /* dense [N, K], or MLX words [N, K*bits/32] */
    const void *scales, *biases;  /* MLX [N, K/group] */
    const void *bias;             /* linear bias [N], or NULL */
    float *y;                     /* [M, N] */
    int N;
    lmx_dtype bt;                 /* of bias */
} gv_seg;

typedef struct gv_segs {
    gv_seg s[3];
    int group;                    /* MLX group size */
    lmx_dtype sdt;                /* MLX scale / bias dtype */
} gv_segs;

/* Segment i by selects of fixed fields: indexing the parameter struct with blockIdx.y would copy
 * it to local memory and slow every GEMV. */
static __device__ __forceinline__ gv_seg seg_pick(const gv_segs &sg, int i) {
    gv_seg r;
#define PICK(f) r.f = i == 0 ? sg.s[0].f : i == 1 ? sg.s[1].f : sg.s[2].f
    PICK(w); PICK(scales); PICK(biases); PICK(bias); PICK(y); PICK(N); PICK(bt);
#undef PICK
    return r;
}

static __device__ __forceinline__ float bias_at(const void *b, lmx_dtype bt, int64_t n) {
    return b ? cuda_elem(b, bt, n) : 0.0f;
}

static __device__ __forceinline__ float glu_act(float a, int act) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi); the same arithmetic as the glu op */
    return act == LMX_ACT_SILU ? a / (1.0f + expf(-a)) : 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* The results of one warp: R rows x MM inputs, reduced over the lanes. */
template <int MM, int R, int PAIR>
static __device__ __forceinline__ void gemv_store(const gv_segs &sg, const gv_seg &S, int n0, float (&acc)[R][MM],
                                                  int act) {
    const int lane = threadIdx.x % 32;
    if constexpr (PAIR != 0) {
#pragma unroll
        for (int m = 0; m < MM; m++) {
            float g = cuda_warp_sum(acc[0][m]), u = cuda_warp_sum(acc[R - 1][m]);
            if (lane == 0) {
                g += bias_at(sg.s[0].bias, sg.s[0].bt, n0);
                u += bias_at(sg.s[1].bias, sg.s[1].bt, n0);
                sg.s[0].y[(size_t)m * S.N + n0] = glu_act(g, act) * u;
                sg.s[1].y[(size_t)m * S.N + n0] = u;
            }
        }
    } else {
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float s = cuda_warp_sum(acc[r][m]);
                if (lane == 0 && n0 + r < S.N) S.y[(size_t)m * S.N + n0 + r] = s + bias_at(S.bias, S.bt, n0 + r);
            }
    }
}

/* ---- dense ----------------------------------------------------------------------------------- */

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

/* acc[r][m] += w_r[vector v] . x_m[vector v] */
template <typename WT, int MM, int R>
static __device__ __forceinline__ void dense_dot(const float *__restrict__ x, int K, int v, const uint4 (&q)[R],
                                                 float (&acc)[R][MM]) {
    constexpr int E = vec_traits<WT>::E;
    const int k = v * E;
    float wf[R][E];
#pragma unroll
    for (int r = 0; r < R; r++) vec_traits<WT>::unpack(q[r], wf[r]);
#pragma unroll
    for (int m = 0; m < MM; m++) {
        float xf[E];
#pragma unroll
        for (int e = 0; e < E; e += 4) {
            float4 t = __ldg((const float4 *)(x + (size_t)m * K + k + e));
            xf[e] = t.x; xf[e + 1] = t.y; xf[e + 2] = t.z; xf[e + 3] = t.w;
        }
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int e = 0; e < E; e++) acc[r][m] = fmaf(wf[r][e], xf[e], acc[r][m]);
    }
}

/* x [MM, K] f32, w [N, K] of WT with 16-byte aligned rows; U vectors per row in flight per lane. */
template <typename WT, int MM, int R, int U, int PAIR>
__global__ void __launch_bounds__(256) k_gemv(const float *__restrict__ x, const gv_segs sg, int K, int act) {
    cuda_pdl_trigger();
    const gv_seg S = seg_pick(sg, blockIdx.y);
    constexpr int E = vec_traits<WT>::E;
    const int lane = threadIdx.x % 32;
    const int n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (PAIR ? 1 : R);
    if (n0 >= S.N) {
        cuda_pdl_wait();
        return;
    }
    const int nv = K / E;
    const uint4 *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        wr[r] = PAIR ? (const uint4 *)((const WT *)(r == 0 ? sg.s[0].w : sg.s[1].w) + (size_t)n0 * K)
                     : (const uint4 *)((const WT *)S.w + (size_t)(n0 + r < S.N ? n0 + r : n0) * K);
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;

    int v = lane;
    bool full = v + 32 * (U - 1) < nv;
    uint4 cur[U][R];
    if (full)
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) cur[u][r] = __ldcs(wr[r] + v + 32 * u);
    cuda_pdl_wait(); /* x is ready */
    while (full) {
        const int vn = v + 32 * U;
        const bool nfull = vn + 32 * (U - 1) < nv;
        uint4 nxt[U][R];
        if (nfull)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) nxt[u][r] = __ldcs(wr[r] + vn + 32 * u);
#pragma unroll
        for (int u = 0; u < U; u++) dense_dot<WT, MM, R>(x, K, v + 32 * u, cur[u], acc);
        if (nfull)
#pragma unroll
            for (int u = 0; u < U; u++)
#pragma unroll
                for (int r = 0; r < R; r++) cur[u][r] = nxt[u][r];
        v = vn;
        full = nfull;
    }
    for (; v < nv; v += 32) {
        uint4 q[R];
#pragma unroll
        for (int r = 0; r < R; r++) q[r] = __ldcs(wr[r] + v);
        dense_dot<WT, MM, R>(x, K, v, q, acc);
    }
    gemv_store<MM, R, PAIR>(sg, S, n0, acc, act);
}

/* ---- MLX affine 4 / 8 bit --------------------------------------------------------------------- */

/* Code k (byte k of w, 0..255) as an exact float. */
static __device__ __forceinline__ float code_at(uint32_t w, int k) {
    return __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (unsigned)k)) - 8388608.0f;
}

/* acc[r][m] += scale_r * (q_r . x_m) + bias_r * sum(x_m) over vector v (EV = 128 / BITS elements,
 * MLX order: element j of a word at bits BITS * j). */
template <int BITS, int MM, int R>
static __device__ __forceinline__ void quant_dot(const float *__restrict__ x, int K, int v, const uint4 (&q)[R],
                                                 const float (&sc)[R], const float (&bi)[R], float (&acc)[R][MM]) {
    constexpr int EV = 128 / BITS;
    const int k0 = v * EV;
#pragma unroll
    for (int m = 0; m < MM; m++) {
        float xf[EV];
#pragma unroll
        for (int e = 0; e < EV; e += 4) {
            float4 t = __ldg((const float4 *)(x + (size_t)m * K + k0 + e));
            xf[e] = t.x; xf[e + 1] = t.y; xf[e + 2] = t.z; xf[e + 3] = t.w;
        }
        float xs = 0.0f;
#pragma unroll
        for (int e = 0; e < EV; e++) xs += xf[e];
#pragma unroll
        for (int r = 0; r < R; r++) {
            const uint32_t words[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                if constexpr (BITS == 4) {
                    const uint32_t lo = words[i] & 0x0F0F0F0Fu, hi = (words[i] >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        d = fmaf(code_at(lo, k), xf[8 * i + 2 * k], d);
                        d = fmaf(code_at(hi, k), xf[8 * i + 2 * k + 1], d);
                    }
                } else {
#pragma unroll
                    for (int k = 0; k < 4; k++) d = fmaf(code_at(words[i], k), xf[4 * i + k], d);
                }
            }
            acc[r][m] = fmaf(sc[r], d, fmaf(bi[r], xs, acc[r][m]));
        }
    }
}

template <int BITS, int MM, int R, int PAIR>
__global__ void __launch_bounds__(256) k_qgemv(const float *__restrict__ x, const gv_segs sg, int K, int act) {
    cuda_pdl_trigger();
    const gv_seg S = seg_pick(sg, blockIdx.y);
    constexpr int EV = 128 / BITS;
    const int lane = threadIdx.x % 32;
    const int n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * (PAIR ? 1 : R);
    if (n0 >= S.N) {
        cuda_pdl_wait();
        return;
    }
    const int nv = K / EV, wpr = K / (32 / BITS), gpr = K / sg.group, vpg = sg.group / EV;
    const uint4 *wr[R];
    const void *scp[R], *bip[R];
    int64_t g0[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int row = PAIR ? n0 : (n0 + r < S.N ? n0 + r : n0);
        const void *w = PAIR ? (r == 0 ? sg.s[0].w : sg.s[1].w) : S.w;
        scp[r] = PAIR ? (r == 0 ? sg.s[0].scales : sg.s[1].scales) : S.scales;
        bip[r] = PAIR ? (r == 0 ? sg.s[0].biases : sg.s[1].biases) : S.biases;
        wr[r] = (const uint4 *)((const uint32_t *)w + (size_t)row * wpr);
        g0[r] = (int64_t)row * gpr;
    }
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;

    int v = lane;
    bool have = v < nv;
    uint4 cur[R];
    float cs[R], cb[R];
    if (have)
#pragma unroll
        for (int r = 0; r < R; r++) {
            cur[r] = __ldcs(wr[r] + v);
            cs[r] = cuda_elem(scp[r], sg.sdt, g0[r] + v / vpg);
            cb[r] = cuda_elem(bip[r], sg.sdt, g0[r] + v / vpg);
        }
    cuda_pdl_wait(); /* x is ready */
    while (have) {
        const int vn = v + 32;
        const bool nhave = vn < nv;
        uint4 nxt[R];
        float ns[R], nb[R];
        if (nhave)
#pragma unroll
            for (int r = 0; r < R; r++) {
                nxt[r] = __ldcs(wr[r] + vn);
                ns[r] = cuda_elem(scp[r], sg.sdt, g0[r] + vn / vpg);
                nb[r] = cuda_elem(bip[r], sg.sdt, g0[r] + vn / vpg);
            }
        quant_dot<BITS, MM, R>(x, K, v, cur, cs, cb, acc);
        if (nhave)
#pragma unroll
            for (int r = 0; r < R; r++) {
                cur[r] = nxt[r];
                cs[r] = ns[r];
                cb[r] = nb[r];
            }
        v = vn;
        have = nhave;
    }
    gemv_store<MM, R, PAIR>(sg, S, n0, acc, act);
}

/* ---- any format, any shape: warp per row, per-element decoding -------------------------------- */

#define GEMV_ANY_ROWS 8
__global__ void __launch_bounds__(256) k_gemv_any(const float *__restrict__ x, const wdesc d, const void *bias,
                                                  lmx_dtype bt, float *__restrict__ y, int N, int M) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
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

lmx_status cuda_gemv_any(cuda_backend *cb, const lmx_tensor *w, const lmx_tensor *bias, float *y, const float *x,
                         int M) {
    const wdesc d = make_wdesc(w);
    const int N = (int)w->shape[0];
    for (int m0 = 0; m0 < M; m0 += GEMV_ANY_ROWS) {
        const int mc = M - m0 < GEMV_ANY_ROWS ? M - m0 : GEMV_ANY_ROWS;
        cuda_launch(cb, k_gemv_any, cuda_blocks(N, 8), 256, 0, x + (size_t)m0 * d.K, d,
                    (const void *)(bias ? bias->data : NULL), bias ? bias->dtype : LMX_DTYPE_F32, y + (size_t)m0 * N,
                    N, mc);
        lmx_status st = cuda_check_launch(cb, "matmul");
        if (st) return st;
    }
    return LMX_OK;
}

/* ---- launch ------------------------------------------------------------------------------------ */

enum { GV_BF16, GV_F16, GV_F32, GV_Q4, GV_Q8 };

/* The kernel family for weight w, or -1 when no vector kernel takes it. */
static int gv_kind(const lmx_tensor *w) {
    if (w->ndim != 2 || w->q.ggml_type) return -1;
    const int64_t K = w->shape[1];
    if (w->q.bits) {
        const int bits = w->q.bits, ev = 128 / (bits ? bits : 1);
        if ((bits != 4 && bits != 8) || w->q.group % ev || K % w->q.group || K % ev) return -1;
        return bits == 4 ? GV_Q4 : GV_Q8;
    }
    switch (w->dtype) {
    case LMX_DTYPE_BF16: return K % 8 ? -1 : GV_BF16;
    case LMX_DTYPE_F16: return K % 8 ? -1 : GV_F16;
    case LMX_DTYPE_F32: return K % 4 ? -1 : GV_F32;
    default: return -1;
    }
}

template <int MM>
static void gv_launch(cuda_backend *cb, int kind, dim3 grid, const float *x, const gv_segs &sg, int K, int glu) {
    const int act = glu < 0 ? 0 : glu;
    /* one row per warp and 4 vectors in flight for M = 1; two rows sharing x for M >= 2 */
    constexpr int DR = MM == 1 ? 1 : 2, DU = MM == 1 ? 4 : 2;
    if (glu >= 0) {
        switch (kind) {
        case GV_BF16: cuda_launch(cb, k_gemv<__nv_bfloat16, MM, 2, DU / 2 ? DU / 2 : 1, 1>, grid, 256, 0, x, sg, K, act); break;
        case GV_F16: cuda_launch(cb, k_gemv<__half, MM, 2, DU / 2 ? DU / 2 : 1, 1>, grid, 256, 0, x, sg, K, act); break;
        case GV_F32: cuda_launch(cb, k_gemv<float, MM, 2, DU / 2 ? DU / 2 : 1, 1>, grid, 256, 0, x, sg, K, act); break;
        case GV_Q4: cuda_launch(cb, k_qgemv<4, MM, 2, 1>, grid, 256, 0, x, sg, K, act); break;
        default: cuda_launch(cb, k_qgemv<8, MM, 2, 1>, grid, 256, 0, x, sg, K, act); break;
        }
        return;
    }
    switch (kind) {
    case GV_BF16: cuda_launch(cb, k_gemv<__nv_bfloat16, MM, DR, DU, 0>, grid, 256, 0, x, sg, K, act); break;
    case GV_F16: cuda_launch(cb, k_gemv<__half, MM, DR, DU, 0>, grid, 256, 0, x, sg, K, act); break;
    case GV_F32: cuda_launch(cb, k_gemv<float, MM, DR, DU, 0>, grid, 256, 0, x, sg, K, act); break;
    case GV_Q4: cuda_launch(cb, k_qgemv<4, MM, 2, 0>, grid, 256, 0, x, sg, K, act); break;
    default: cuda_launch(cb, k_qgemv<8, MM, 2, 0>, grid, 256, 0, x, sg, K, act); break;
    }
}

/* Rows of one block: 8 warps of R rows (1 per warp for the GLU pair and dense M = 1). */
static int gv_rows_per_block(int kind, int M, int glu) {
    if (glu >= 0) return 8;
    if (kind == GV_Q4 || kind == GV_Q8) return 16;
    return M == 1 ? 8 : 16;
}

lmx_status cuda_gemv(cuda_backend *cb, int n, const lmx_tensor *const *ws, const lmx_tensor *const *biases,
                     float *const *ys, const float *x, int M, int glu) {
    if (n < 1 || n > 3 || M < 1 || M > CUDA_GEMV_ROWS || (glu >= 0 && n != 2)) return LMX_ERR_UNSUPPORTED;
    const int kind = gv_kind(ws[0]);
    if (kind < 0) return LMX_ERR_UNSUPPORTED;
    const int64_t K = ws[0]->shape[1];
    gv_segs sg;
    memset(&sg, 0, sizeof sg);
    sg.group = ws[0]->q.group;
    sg.sdt = ws[0]->q.scale_dtype;
    for (int i = 0; i < n; i++) {
        const lmx_tensor *w = ws[i];
        if (gv_kind(w) != kind || w->shape[1] != K || w->dtype != ws[0]->dtype || w->q.group != sg.group ||
            w->q.scale_dtype != sg.sdt)
            return LMX_ERR_UNSUPPORTED;
        sg.s[i].w = w->data;
        sg.s[i].scales = w->q.scales;
        sg.s[i].biases = w->q.biases;
        sg.s[i].bias = biases[i] ? biases[i]->data : NULL;
        sg.s[i].bt = biases[i] ? biases[i]->dtype : LMX_DTYPE_F32;
        sg.s[i].y = ys[i];
        sg.s[i].N = (int)w->shape[0];
    }
    if (glu >= 0 && sg.s[0].N != sg.s[1].N) return LMX_ERR_UNSUPPORTED;
    const int rpb = gv_rows_per_block(kind, M, glu);
    unsigned gx = 1;
    for (int i = 0; i < n; i++)
        if (cuda_blocks(sg.s[i].N, rpb) > gx) gx = cuda_blocks(sg.s[i].N, rpb);
    const dim3 grid(gx, glu >= 0 ? 1 : n);
    switch (M) {
    case 1: gv_launch<1>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 2: gv_launch<2>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 3: gv_launch<3>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 4: gv_launch<4>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 5: gv_launch<5>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 6: gv_launch<6>(cb, kind, grid, x, sg, (int)K, glu); break;
    case 7: gv_launch<7>(cb, kind, grid, x, sg, (int)K, glu); break;
    default: gv_launch<8>(cb, kind, grid, x, sg, (int)K, glu); break;
    }
    return cuda_check_launch(cb, glu >= 0 ? "matmul + glu" : "matmul");
}
