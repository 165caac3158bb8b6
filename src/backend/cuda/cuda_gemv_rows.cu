/* cuda_gemv_rows.cu - cuda_gemv's kernels for 2 to 8 input rows (batched decode; one row where K is too long
 * to stage for k_gemv1): k_gemv for dense bf16 / f16 / f32, k_qgemv for MLX 4 / 8 bit.  A warp takes R
 * consecutive output rows (each x vector it loads serves R rows), lanes stride over the rows' 16-byte
 * vectors (k_gemv) or consecutive packed words (k_qgemv). */
#include "cuda_gemv.h"

/* The results of one warp: R rows x MM inputs, reduced over the lanes (the GLU pair: rows
 * n0 .. n0 + R/2 of gate in acc[0 .. R/2), the same rows of up after them). */
template <int MM, int R, int PAIR>
static __device__ __forceinline__ void gemv_store(const gv_segs &sg, const gv_seg &S, int n0, float (&acc)[R][MM],
                                                  int act) {
    const int lane = threadIdx.x % 32;
    if constexpr (PAIR != 0) {
        constexpr int RO = R / 2;
#pragma unroll
        for (int o = 0; o < RO; o++)
#pragma unroll
            for (int m = 0; m < MM; m++) {
                float g = cuda_warp_sum(acc[o][m]), u = cuda_warp_sum(acc[o + RO][m]);
                const int n = n0 + o;
                if (lane == 0 && n < S.N) {
                    g += bias_at(sg.s[0].bias, sg.s[0].bt, n);
                    u += bias_at(sg.s[1].bias, sg.s[1].bt, n);
                    sg.s[0].y[(size_t)m * S.N + n] = glu_act(g, act) * u;
                    sg.s[1].y[(size_t)m * S.N + n] = u;
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

    auto load = [&](uint4 (&dst)[U][R], int v0) { /* vectors v0, v0 + 32, ... (a step) of each row */
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int r = 0; r < R; r++) dst[u][r] = __ldcs(wr[r] + v0 + 32 * u);
    };
    int v = lane;
    bool full = v + 32 * (U - 1) < nv;
    uint4 cur[U][R];
    if (full) load(cur, v);
    cuda_pdl_wait(); /* x is ready */
    while (full) {
        const int vn = v + 32 * U;
        const bool nfull = vn + 32 * (U - 1) < nv;
        uint4 nxt[U][R];
        if (nfull) load(nxt, vn);
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
/* A warp takes R rows (for the GLU pair R/2 rows of gate and the same rows of up); lane l takes the
 * packed words l, l + 32, l + 64, ... of each row, QG_U of them per step, the next step's words (and
 * their scales and biases) loading while the current ones are used.  Consecutive lanes read
 * consecutive words and the x values under them, and each x value loaded serves R rows.
 *
 * Decoding without int-to-float conversions: a 4-bit code q goes under the exponent of 0.5 into
 * mantissa bits 16-19 by one byte permute, which reads as 0.5 + q / 256 exactly; per word
 * d = sum (0.5 + q/256) x, so q . x = 256 d - 128 sum(x).  An 8-bit code goes under 2^23, and
 * subtracting 2^23 leaves q exactly.  Per word, acc += scale * (q . x) + bias * sum(x). */

#define QG_U 2   /* words per row and lane in one step */
template <int R> struct qg_step {
    uint32_t w[QG_U][R];
    uint32_t s[QG_U][R], b[QG_U][R]; /* raw scale and bias (raw_at) */
};
template <int BITS, int MM, int R, int PAIR>
__global__ void __launch_bounds__(256) k_qgemv(const float *__restrict__ x, const gv_segs sg, int K, int act) {
    cuda_pdl_trigger();
    constexpr int PER = 32 / BITS, RO = PAIR ? R / 2 : R; /* RO output rows per warp */
    const gv_seg S = seg_pick(sg, blockIdx.y);
    const int lane = threadIdx.x % 32;
    const int n0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RO;
    if (n0 >= S.N) {
        cuda_pdl_wait();
        return;
    }
    const int wpr = K / PER, gpr = K / sg.group, gw = sg.group / PER; /* words per row, groups, words per group */
    const uint32_t *wp[R];
    const void *sp[R], *bp[R];
    int64_t g0[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        const int sel = PAIR && r >= RO;
        const int n = n0 + (PAIR ? r % RO : r), row = n < S.N ? n : S.N - 1;
        wp[r] = (const uint32_t *)(PAIR ? sg.s[sel].w : S.w) + (size_t)row * wpr;
        sp[r] = PAIR ? sg.s[sel].scales : S.scales;
        bp[r] = PAIR ? sg.s[sel].biases : S.biases;
        g0[r] = (int64_t)row * gpr;
    }
    auto load = [&](qg_step<R> &st, int j0) {
#pragma unroll
        for (int u = 0; u < QG_U; u++) {
            const int j = j0 + 32 * u < wpr ? j0 + 32 * u : wpr - 1;
#pragma unroll
            for (int r = 0; r < R; r++) {
                st.w[u][r] = __ldcs(wp[r] + j);
                st.s[u][r] = raw_at(sp[r], sg.sdt, g0[r] + j / gw);
                st.b[u][r] = raw_at(bp[r], sg.sdt, g0[r] + j / gw);
            }
        }
    };
    float acc[R][MM];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int m = 0; m < MM; m++) acc[r][m] = 0.0f;

    qg_step<R> cur, nxt;
    load(cur, lane);
    cuda_pdl_wait(); /* x is ready */
    for (int j0 = lane; j0 < wpr; j0 += 32 * QG_U) {
        const bool more = j0 + 32 * QG_U < wpr;
        if (more) load(nxt, j0 + 32 * QG_U);
#pragma unroll
        for (int u = 0; u < QG_U; u++) {
            const int j = j0 + 32 * u;
            if (j >= wpr) break;
            float xf[MM][PER], xs[MM];
#pragma unroll
            for (int m = 0; m < MM; m++) {
#pragma unroll
                for (int e = 0; e < PER; e += 4) {
                    const float4 t = __ldg((const float4 *)(x + (size_t)m * K + (size_t)j * PER + e));
                    xf[m][e] = t.x; xf[m][e + 1] = t.y; xf[m][e + 2] = t.z; xf[m][e + 3] = t.w;
                }
                xs[m] = 0.0f;
#pragma unroll
                for (int e = 0; e < PER; e++) xs[m] += xf[m][e];
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                float qf[PER];
                decode_word<BITS>(cur.w[u][r], qf);
#pragma unroll
                for (int m = 0; m < MM; m++) {
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < PER; e++) d = fmaf(qf[e], xf[m][e], d);
                    acc[r][m] = qacc<BITS>(acc[r][m], cur.s[u][r], cur.b[u][r], sg.sdt, d, xs[m]);
                }
            }
        }
        if (more) cur = nxt;
    }
    gemv_store<MM, R, PAIR>(sg, S, n0, acc, act);
}

/* ---- launch ------------------------------------------------------------------------------------ */

/* Quantized: weight rows per warp (4 for one or two inputs, 2 beyond; for the GLU pair half of them
 * gate rows, half the same rows of up). */
template <int MM> constexpr int qg_rows() { return MM <= 2 ? 4 : 2; }

/* PAIR: the gate/up pair with its GLU (k_gemv one row of each a warp), else blockIdx.y the weight (two rows). */
template <int MM, int PAIR>
static void gv_launch_pair(cuda_backend *cb, int kind, unsigned gx, unsigned gy, const float *x, const gv_segs &sg, int K,
                      int act) {
    constexpr int QR = qg_rows<MM>(), R = PAIR ? 1 : 2;
    const dim3 grid(gx, gy);
    switch (kind) {
    case GV_BF16: cuda_launch(cb, k_gemv<__nv_bfloat16, MM, 2, R, PAIR>, grid, 256, 0, x, sg, K, act); break;
    case GV_F16: cuda_launch(cb, k_gemv<__half, MM, 2, R, PAIR>, grid, 256, 0, x, sg, K, act); break;
    case GV_F32: cuda_launch(cb, k_gemv<float, MM, 2, R, PAIR>, grid, 256, 0, x, sg, K, act); break;
    case GV_Q4: cuda_launch(cb, k_qgemv<4, MM, QR, PAIR>, grid, 256, 0, x, sg, K, act); break;
    default: cuda_launch(cb, k_qgemv<8, MM, QR, PAIR>, grid, 256, 0, x, sg, K, act); break;
    }
}
template <int MM>
static void gv_launch(cuda_backend *cb, int kind, unsigned gx, unsigned gy, const float *x, const gv_segs &sg, int K,
                      int glu) {
    if (glu >= 0) gv_launch_pair<MM, 1>(cb, kind, gx, gy, x, sg, K, glu);
    else gv_launch_pair<MM, 0>(cb, kind, gx, gy, x, sg, K, 0);
}

int cuda_gemv_rows_block(int kind, int M, int glu) {
    if (kind == GV_Q4 || kind == GV_Q8) return 8 * (M <= 2 ? qg_rows<2>() : qg_rows<3>()) / (glu >= 0 ? 2 : 1);
    return glu >= 0 ? 8 : 16; /* k_gemv: R = 2 rows a warp, the pair one row of gate and of up */
}

void cuda_gemv_rows_launch(cuda_backend *cb, int kind, int M, unsigned gx, unsigned gy, const float *x,
                           const gv_segs &sg, int K, int glu) {
    switch (M) {
    case 1: gv_launch<1>(cb, kind, gx, gy, x, sg, K, glu); break; /* K too long to stage */
    case 2: gv_launch<2>(cb, kind, gx, gy, x, sg, K, glu); break;
    case 3: gv_launch<3>(cb, kind, gx, gy, x, sg, K, glu); break;
    case 4: gv_launch<4>(cb, kind, gx, gy, x, sg, K, glu); break;
    case 5: gv_launch<5>(cb, kind, gx, gy, x, sg, K, glu); break;
    case 6: gv_launch<6>(cb, kind, gx, gy, x, sg, K, glu); break;
    case 7: gv_launch<7>(cb, kind, gx, gy, x, sg, K, glu); break;
    default: gv_launch<8>(cb, kind, gx, gy, x, sg, K, glu); break;
    }
}
