/* cuda_moe_mma.cu - a mixture of experts' GGUF experts for several rows (batched decode) on the integer tensor
 * cores: each chosen expert's weights read once for every (row, choice) pair that chose it.
 *
 * The per-pair kernels (k_moe_ggemv, cuda_ggml.cu) read an expert once for each pair that chose it: at batch 32
 * of Qwen3-30B-A3B's shape the 256 pairs choose about 112 distinct experts of 128, each read 2.3 times, and each
 * weight is decoded and multiplied once a pair by the CUDA cores.  Here block (bx, e) takes rows
 * [bx R, (bx + 1) R) of expert e (gate / up: R = 64 of gate, four warps, beside the same 64 of up, four warps;
 * down: R = 128, eight warps) and the pairs that chose e, found by scanning pick (in passes of up to eight, the
 * mma's n: x's rows of the pass staged in shared memory as the mma's B takes them).  A warp takes 16 rows (the
 * mma's m), its lane (g, t) = (lane / 4, lane % 4) rows g and g + 8, their codes loaded straight from the
 * weights as the mma's A, a super-block ahead.  Blocks of an expert no pair chose end at once.
 *
 * Arithmetic: x quantized per 32 values to int16 as for the GEMVs (cuda_ggml_x.h; x ~ d qx), each code split
 * into a signed high byte and an unsigned low byte, qx = 256 hi + lo, so that over a sub-block of 32 (Q4_K) or
 * 16 (Q6_K) values the weights' unsigned codes q (Q4_K's 4 bits; Q6_K's 6 bits, the code + 32) give
 *
 *     q . qx = 256 (q . hi) + (q . lo)
 *
 * by two int8 mma (m16n8k32, or m16n8k16 for Q6_K's sub-blocks of 16: u8 x s8, then u8 x u8 added to 256
 * times the first), exact in int32: the integer sums of the GEMVs' dp2a.  Then, as the GEMVs do,
 *
 *     w . x = d_x (sc (q . qx) - mn sum(qx))        Q4_K: sc = d s6, mn = dmin m6;  Q6_K: sc = d s8, mn = 32 sc
 *
 * summed over the sub-blocks in order.  Gate / up store h = act(g) u for the down projection, which takes h
 * quantized the same way (a launch of gq_quant_x between). */
#include "cuda_moe_mma.h"
#include "cuda_ggml_x.h"

#define MQ_N 8                /* pairs a pass: the mma's n */
#define MQ_SMEM (160 << 10)   /* the staged x of a pass at most (K 8,192) */

/* d = a (16 x 32 unsigned codes) . b (32 x 8 signed high bytes) */
static __device__ __forceinline__ void mq_hi32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
/* d = 256 d + a . b (32 x 8 unsigned low bytes) */
static __device__ __forceinline__ void mq_lo32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    int c[4] = {d[0] * 256, d[1] * 256, d[2] * 256, d[3] * 256};
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %11, %12, %13};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}
/* the same over 16 values: a (16 x 16), b (16 x 8) */
static __device__ __forceinline__ void mq_hi16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(0));
}
static __device__ __forceinline__ void mq_lo16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    int c[4] = {d[0] * 256, d[1] * 256, d[2] * 256, d[3] * 256};
    asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
}

/* Lane t's eight codes of part pp of row m of quantized x, as the mma's B takes them: {hi a, hi b, lo a, lo b}
 * of elements a = 8t .. 8t + 3, b = 8t + 4 .. 8t + 7 (Q4_K: one k32 over the part), or a = 4t .. 4t + 3,
 * b = 16 + 4t .. 16 + 4t + 3 (Q6_K: a k16 over each half).  A chunk of gq_xchunk holds the int16 codes of
 * elements 8c .. 8c + 7, two a word. */
template <int T>
static __device__ __forceinline__ uint4 mq_xcodes(const int4 *__restrict__ xq, int PR, int m, int pp, int t) {
    const int4 *c = xq + (size_t)m * PR * 4 + gq_xchunk(pp, gq_ul(gq_unit<T>::UP));
    uint32_t w0, w1, w2, w3;
    if constexpr (T == LMX_GGML_Q4_K) {
        const int4 v = __ldg(c + 32 * t);
        w0 = v.x, w1 = v.y, w2 = v.z, w3 = v.w;
    } else {
        const int4 a = __ldg(c + 32 * (t >> 1)), b = __ldg(c + 32 * (2 + (t >> 1)));
        w0 = t & 1 ? a.z : a.x, w1 = t & 1 ? a.w : a.y, w2 = t & 1 ? b.z : b.x, w3 = t & 1 ? b.w : b.y;
    }
    return make_uint4(__byte_perm(w0, w1, 0x7531), __byte_perm(w2, w3, 0x7531), __byte_perm(w0, w1, 0x6420),
                      __byte_perm(w2, w3, 0x6420));
}

/* acc (rows g, g + 8 x pairs 2t, 2t + 1, the mma's C order) plus one sub-block: its integer sums D, the rows'
 * scales sc and mins mn, x's scales xa (pair 2t) and xc (2t + 1), each {d, sum of the sub-block's d qx} */
static __device__ __forceinline__ void mq_acc(float (&acc)[4], const int (&D)[4], const float (&sc)[2],
                                              const float (&mn)[2], float2 xa, float2 xc) {
    acc[0] = fmaf(xa.x * sc[0], (float)D[0], fmaf(-mn[0], xa.y, acc[0]));
    acc[1] = fmaf(xc.x * sc[0], (float)D[1], fmaf(-mn[0], xc.y, acc[1]));
    acc[2] = fmaf(xa.x * sc[1], (float)D[2], fmaf(-mn[1], xa.y, acc[2]));
    acc[3] = fmaf(xc.x * sc[1], (float)D[3], fmaf(-mn[1], xc.y, acc[3]));
}

/* A lane's share of its warp's 16 rows of type T (wr: rows g and g + 8): load takes super-block b's bytes, sum adds
 * them times the staged x to acc: codes sx [K / 32][8 pairs][4 lanes] (mq_xcodes), scales sxs [K / 32][8 pairs] (Q4_K
 * {d, d sum(qx), 0, 0}; Q6_K {d, 0, -32 d sum(qx) over the first 16, over the last 16}) */
template <int T> struct mq_rows;

template <> struct mq_rows<LMX_GGML_Q4_K> {
    uint4 hd[2];    /* d, dmin, the 12 scale bytes */
    uint2 qs[2][4]; /* lane t's bytes 8t .. 8t + 7 of each 32 of the codes */
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[2], int b, int t) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = wr[h] + (size_t)b * 144;
            hd[h] = __ldg((const uint4 *)p);
#pragma unroll
            for (int j = 0; j < 4; j++) qs[h][j] = __ldg((const uint2 *)(p + 16 + 32 * j + 8 * t));
        }
    }
    __device__ __forceinline__ void sum(int b, const uint4 *sx, const float4 *sxs, int g, int t,
                                        float (&acc)[4]) const {
        float d[2], dm[2];
        uint32_t sw[2][3];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            d[h] = gq_half(hd[h].x, 0), dm[h] = gq_half(hd[h].x, 1);
            sw[h][0] = hd[h].y, sw[h][1] = hd[h].z, sw[h][2] = hd[h].w;
        }
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int s = 0; s < 2; s++) { /* sub-block 2j + s: the low, then the high nibbles */
                const int pp = 8 * b + 2 * j + s;
                const uint32_t a[4] = {(qs[0][j].x >> 4 * s) & 0x0F0F0F0Fu, (qs[1][j].x >> 4 * s) & 0x0F0F0F0Fu,
                                       (qs[0][j].y >> 4 * s) & 0x0F0F0F0Fu, (qs[1][j].y >> 4 * s) & 0x0F0F0F0Fu};
                const uint4 xb = sx[pp * 32 + g * 4 + t];
                int D[4];
                mq_hi32(D, a, xb.x, xb.y);
                mq_lo32(D, a, xb.z, xb.w);
                float sc[2], mn[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int s6, m6;
                    gq_k4_scale(sw[h], 2 * j + s, s6, m6);
                    sc[h] = d[h] * (float)s6, mn[h] = dm[h] * (float)m6;
                }
                const float4 xa = sxs[pp * 8 + 2 * t], xc = sxs[pp * 8 + 2 * t + 1];
                mq_acc(acc, D, sc, mn, make_float2(xa.x, xa.y), make_float2(xc.x, xc.y));
            }
    }
};

/* Q6_K in its GPU layout (LMX_GGML_Q6_K_A16: codes' low nibbles ql [128], high bits qh [64], 16 signed scales,
 * d; 224 bytes): half hh of 128 values, quarter q of 32, half is of 16 is element 128 hh + 32 q + 16 is + l,
 * its low nibble in ql[64 hh + 32 (q & 1) + 16 is + l] >> 4 (q >> 1), its high bits qh[32 hh + 16 is + l] >> 2q,
 * its scale byte 8 hh + 2 q + is. */
template <> struct mq_rows<LMX_GGML_Q6_K_A16> {
    uint32_t ql[2][2][2][2]; /* [row][hh][is][q & 1]: lane t's bytes 4t .. 4t + 3 */
    uint32_t qh[2][2][2];    /* [row][hh][is] */
    uint32_t sc[2][4]; /* [row]: the 16 scale bytes */
    uint32_t dw[2];
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[2], int b, int t) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = wr[h] + (size_t)b * 224;
#pragma unroll
            for (int hh = 0; hh < 2; hh++)
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    ql[h][hh][is][0] = __ldg((const uint32_t *)(p + 64 * hh + 16 * is + 4 * t));
                    ql[h][hh][is][1] = __ldg((const uint32_t *)(p + 64 * hh + 32 + 16 * is + 4 * t));
                    qh[h][hh][is] = __ldg((const uint32_t *)(p + 128 + 32 * hh + 16 * is + 4 * t));
                }
            const uint4 v = __ldg((const uint4 *)(p + 192));
            sc[h][0] = v.x, sc[h][1] = v.y, sc[h][2] = v.z, sc[h][3] = v.w;
            dw[h] = __ldg((const uint32_t *)(p + 208));
        }
    }
    __device__ __forceinline__ void sum(int b, const uint4 *sx, const float4 *sxs, int g, int t,
                                        float (&acc)[4]) const {
        float d[2];
#pragma unroll
        for (int h = 0; h < 2; h++) d[h] = gq_half(dw[h], 0);
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int pp = 8 * b + 4 * hh + q;
                const uint4 xb = sx[pp * 32 + g * 4 + t];
                const float4 xa = sxs[pp * 8 + 2 * t], xc = sxs[pp * 8 + 2 * t + 1];
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    uint32_t a[2];
                    float s[2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        a[h] = ((ql[h][hh][is][q & 1] >> 4 * (q >> 1)) & 0x0F0F0F0Fu) |
                               (((qh[h][hh][is] >> 2 * q) & 0x03030303u) << 4);
                        const int k = 8 * hh + 2 * q + is;
                        s[h] = d[h] * (float)(int8_t)(sc[h][k >> 2] >> 8 * (k & 3));
                    }
                    int D[4];
                    mq_hi16(D, a[0], a[1], is ? xb.y : xb.x);
                    mq_lo16(D, a[0], a[1], is ? xb.w : xb.z);
                    const float an = is ? xa.w : xa.z, cn = is ? xc.w : xc.z; /* -32 sum(d qx) */
                    acc[0] = fmaf(s[0], fmaf(xa.x, (float)D[0], an), acc[0]);
                    acc[1] = fmaf(s[0], fmaf(xc.x, (float)D[1], cn), acc[1]);
                    acc[2] = fmaf(s[1], fmaf(xa.x, (float)D[2], an), acc[2]);
                    acc[3] = fmaf(s[1], fmaf(xc.x, (float)D[3], cn), acc[3]);
                }
            }
    }
};

/* Block (bx, e): expert e's rows (above) for every pair p with pick[p] == e: y[p, n] = act(gate_e x) (up_e x)
 * (PAIR, x's row p / kused) or down_e x (x's row p).  x quantized in the layout of T's units (xq, xm; PR parts'
 * room a row). */
template <int T, int PAIR>
__global__ void __launch_bounds__(256, 2)
    k_moe_mma(const int4 *__restrict__ xq, const float4 *__restrict__ xm, int PR, const __grid_constant__ gv_moe mo,
              const int *pick, int P, int kused, int N, int K, int act, float *__restrict__ y) {
    extern __shared__ uint4 mq_sm[]; /* x's codes [K / 32][8][4], then scales [K / 32][8] (float4) */
    __shared__ int plist[CUDA_MOE_PAIRS], pn;
    __shared__ float up[PAIR ? 4 : 1][16][MQ_N + 1]; /* PAIR: the up warps' sums, for the gate warps' GLU */
    cuda_pdl_trigger();
    const int e = blockIdx.y, tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    if (tid == 0) pn = 0;
    cuda_pdl_wait(); /* pick and x come from the launches before */
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x)
        if (*(volatile const int *)(pick + p) == e) plist[atomicAdd(&pn, 1)] = p; /* any order: pairs are columns */
    __syncthreads();
    const int np = pn;
    if (np == 0) return;
    constexpr int BYTES = gq_traits<T>::BYTES;
    const int mat = PAIR ? warp / 4 : 0, n0 = PAIR ? blockIdx.x * 64 + 16 * (warp % 4) : blockIdx.x * 128 + 16 * warp;
    const int64_t rb = (int64_t)(K / 256) * BYTES;
    const uint8_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = n0 + g + 8 * h;
        wr[h] = (const uint8_t *)mo.w[mat][e] + (n < N ? n : N - 1) * rb;
    }
    const int NP = K / 32, SB = K / 256;
    uint4 *sx = mq_sm;
    float4 *sxs = (float4 *)(mq_sm + NP * 32);
    for (int c0 = 0; c0 < np; c0 += MQ_N) {
        const int nc = np - c0 < MQ_N ? np - c0 : MQ_N;
        __syncthreads(); /* the last pass's reads of the staged x are done */
        for (int i = tid; i < NP * 32; i += blockDim.x) {
            const int pp = i / 32, j = i / 4 % 8, tt = i % 4;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (j < nc) {
                const int p = plist[c0 + j], m = PAIR ? p / kused : p;
                v = mq_xcodes<T>(xq, PR, m, pp, tt);
                if (tt == 0) {
                    const float4 q = __ldg(xm + (size_t)m * PR + gq_xpart(pp, gq_ul(gq_unit<T>::UP)));
                    s = T == LMX_GGML_Q4_K ? make_float4(q.x, q.y + q.z, 0.0f, 0.0f)
                                           : make_float4(q.x, 0.0f, -32.0f * q.y, -32.0f * q.z);
                }
            }
            sx[i] = v;
            if (tt == 0) sxs[pp * 8 + j] = s;
        }
        __syncthreads();
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mq_rows<T> cur, next;
        cur.load(wr, 0, t);
        for (int b = 0; b < SB; b++) {
            if (b + 1 < SB) next.load(wr, b + 1, t);
            cur.sum(b, sx, sxs, g, t, acc);
            cur = next;
        }
        /* acc[o]: row g + 8 (o / 2), pair slot 2t + o % 2 */
        if (PAIR && mat == 1)
#pragma unroll
            for (int o = 0; o < 4; o++) up[warp % 4][g + 8 * (o / 2)][2 * t + o % 2] = acc[o];
        if (PAIR) __syncthreads();
        if (mat == 0)
#pragma unroll
            for (int o = 0; o < 4; o++) {
                const int r = g + 8 * (o / 2), c = 2 * t + o % 2, n = n0 + r;
                if (c >= nc || n >= N) continue;
                const float v = PAIR ? glu_act(acc[o], act) * up[warp % 4][r][c] : acc[o];
                y[(size_t)plist[c0 + c] * N + n] = v;
            }
    }
}

static size_t mq_smem(int K) { return (size_t)K / 32 * (MQ_N * 4 * sizeof(uint4) + MQ_N * sizeof(float4)); }

int cuda_moe_mma_takes(const cuda_backend *cb, const lmx_moe_args *a, int down) {
    const int min_rows = cb->moe_mma[down];
    /* never one row: its pairs each read another expert, and cuda_moe_normed folds its norm into gate / up's x
     * and its combine into the per-pair down projection */
    if (min_rows <= 0 || a->M < (min_rows > 2 ? min_rows : 2) || a->E > GV_MOE_MAX) return 0;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    if (F % 256 || C % 256 || mq_smem((int)(down ? F : C)) > MQ_SMEM) return 0;
    for (int e = 0; e < a->E; e++)
        for (int j = down ? 2 : 0; j < (down ? 3 : 2); j++) {
            const lmx_tensor *w = &a->experts[3 * e + j];
            const int type = w->q.ggml_type;
            if (type != LMX_GGML_Q4_K && !(down && type == LMX_GGML_Q6_K_A16)) return 0;
            if ((uintptr_t)w->data % 16 || w->shape[0] != (j == 2 ? C : F) || w->shape[1] != (j == 2 ? F : C)) return 0;
        }
    return 1;
}

/* One projection's launch on x quantized in xo (T's layout): y [pairs, N] */
template <int T, int PAIR>
static lmx_status mq_launch(cuda_backend *cb, const lmx_moe_args *a, const gq_xq &xo, const int *pick, float *y) {
    const int j = PAIR ? 0 : 2, N = (int)a->experts[j].shape[0], K = (int)a->experts[j].shape[1];
    gv_moe tab; /* gate and up, or down */
    memset(&tab, 0, sizeof tab);
    for (int e = 0; e < a->E; e++) {
        tab.w[0][e] = a->experts[3 * e + j].data;
        if (PAIR) tab.w[1][e] = a->experts[3 * e + 1].data;
    }
    const size_t sm = mq_smem(K);
    /* the staged x beside the kernel's own tables may pass the 48 KB a launch takes without asking */
    cudaFuncSetAttribute(k_moe_mma<T, PAIR>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    cuda_launch(cb, k_moe_mma<T, PAIR>, dim3((unsigned)cuda_blocks(N, PAIR ? 64 : 128), (unsigned)a->E), 256, sm,
                (const int4 *)xo.xq, (const float4 *)xo.xm, xo.PR, tab, pick, a->M * a->K, a->K, N, K, (int)a->act, y);
    return cuda_check_launch(cb, PAIR ? "moe gate/up (mma)" : "moe down (mma)");
}

lmx_status cuda_moe_mma_gu(cuda_backend *cb, const lmx_moe_args *a, int *pick, float *pw, float *h) {
    cuda_moe_router rt;
    cuda_moe_router_set(&rt, a, 0, pick, pw);
    const int up = gq_unit<LMX_GGML_Q4_K>::UP; /* x in the layout of Q4_K's units */
    gq_xq xo;
    if (!gq_quant_x(cb, &up, 1, (const float *)a->x->data, a->M, (int)a->experts[0].shape[1], cuda_row_norm{}, &xo, &rt))
        return cb->base.err.status;
    return mq_launch<LMX_GGML_Q4_K, 1>(cb, a, xo, pick, h);
}

lmx_status cuda_moe_mma_down(cuda_backend *cb, const lmx_moe_args *a, const int *pick, const float *h, float *y) {
    const int q6 = a->experts[2].q.ggml_type == LMX_GGML_Q6_K_A16;
    const int up = q6 ? gq_unit<LMX_GGML_Q6_K_A16>::UP : gq_unit<LMX_GGML_Q4_K>::UP;
    gq_xq xo;
    if (!gq_quant_x(cb, &up, 1, h, a->M * a->K, (int)a->experts[2].shape[1], cuda_row_norm{}, &xo))
        return cb->base.err.status;
    return q6 ? mq_launch<LMX_GGML_Q6_K_A16, 0>(cb, a, xo, pick, y) : mq_launch<LMX_GGML_Q4_K, 0>(cb, a, xo, pick, y);
}
