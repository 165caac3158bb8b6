/* cuda_moe_mma.cu - a mixture of experts' GGUF experts for several rows (batched decode) on the integer tensor
 * cores: each chosen expert's weights read once for every (row, choice) pair that chose it.
 *
 * The per-pair kernels (k_moe_ggemv, cuda_ggml.cu) read an expert once for each pair that chose it: at batch 32
 * of Qwen3-30B-A3B's shape the 256 pairs choose about 112 distinct experts of 128, each read 2.3 times, and each
 * weight is decoded and multiplied once a pair by the CUDA cores.  Here block (bx, e) takes rows
 * [bx R, (bx + 1) R) of expert e (gate / up: R = 64 of gate, four warps, beside the same 64 of up, four warps;
 * down: R = 128, eight warps) and the pairs that chose e, found by scanning pick (in passes of up to eight, the
 * mma's n: x's rows of the pass copied into shared memory, laid out as the mma's B takes them, by cp.async, all
 * at once and beside the first weights' loads).  A warp takes 16 rows (the mma's m), its lane (g, t) = (lane /
 * 4, lane % 4) rows g and g + 8, their codes loaded straight from the weights as the mma's A, a super-block
 * ahead.  Blocks of an expert no pair chose end at once.
 *
 * Arithmetic: x quantized per super-block of 256 values to int16 (k_mq_quant: x ~ d qx, one d a super-block),
 * each code split into a signed high byte and an unsigned low byte, qx = 256 hi + lo, so that over a sub-block
 * of 32 (Q4_K) or 16 (Q6_K) values the weights' unsigned codes q (Q4_K's 4 bits; Q6_K's 6 bits, the code + 32)
 * give
 *
 *     q . qx = 256 (q . hi) + (q . lo)
 *
 * by two int8 mma (m16n8k32, or m16n8k16 for Q6_K's sub-blocks of 16: u8 x s8 and u8 x u8).  With x's scale
 * shared by the super-block's sub-blocks, only the weights' integer sub-block scales sit inside the sum over
 * sub-blocks: the two products times the sub-block's scale, and its min (or Q6_K's 32) times the sum of x's
 * codes, summed in int32 (exact: each sum's bound is at its kernel), and x's and the block's float scales
 * applied once a super-block:
 *
 *     Q4_K: w . x = d_x (d sum_s s6_s (q . qx)_s - dmin sum_s m6_s sum(qx)_s)
 *     Q6_K: w . x = d_x d sum_s s8_s ((q . qx)_s - 32 sum(qx)_s)
 *
 * (the GEMVs' x has a d a part of 32 values, so their sums take every scale a sub-block).  Gate / up store
 * h = act(g) u for the down projection, which takes h quantized the same way (a k_mq_quant launch between). */
#include "cuda_moe_mma.h"
#include "cuda_gemv.h"
#include "cuda_mma.h"

#define MQ_N 8                /* pairs a pass: the mma's n */
#define MQ_SMEM (160 << 10)   /* the staged x of a pass at most (K 8,192) */

/* d = a (16 x 32 unsigned codes) . b (32 x 8 bytes: LO 0, signed high bytes; LO 1, unsigned low bytes) */
template <int LO>
static __device__ __forceinline__ void mq_mma32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    if constexpr (LO)
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %10, %10, %10};\n"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
    else
        asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %10, %10, %10};\n"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
/* the same over 16 values: a (16 x 16), b (16 x 8) */
template <int LO> static __device__ __forceinline__ void mq_mma16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
    if constexpr (LO)
        asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.u8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a0), "r"(a1), "r"(b), "r"(0));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};\n"
            : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
            : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

/* x [M, K] quantized for type T (k_mq_quant): codes q [M][K / 32 parts][4 lanes] (lane t's eight codes of a part
 * as the mma's B takes them: {hi a, hi b, lo a, lo b}, Q4_K: a = 8t .. 8t + 3, b = 8t + 4 .. 8t + 7, one k32
 * over the part; Q6_K: a = 4t .. 4t + 3, b = 16 + 4t .. 16 + 4t + 3, a k16 over each half), the sums of the
 * codes s [M][K / 32] (Q4_K: a part's; Q6_K: each half's, [M][K / 16]), the scales d [M][K / 256]. */
struct mq_x {
    const uint4 *q;
    const int *s;
    const float *d;
};
template <int T> struct mq_t { static constexpr int SUMS = T == LMX_GGML_Q4_K ? 1 : 2; }; /* sums a part */

/* the row of x that pair p reads: gate / up's x has a row for each row of pairs */
template <int PAIR> static __device__ __forceinline__ int mq_xrow(int p, int kused) { return PAIR ? p / kused : p; }

/* x [M, K] into oq, os, od (mq_x's layout): a super-block of row blockIdx.y a warp (lane l: values 8 l .. 8 l + 7,
 * part l / 4); blocks of rows past M route row y - M (rt: gate / up's launch; warp 0 of block 0) */
template <int T>
__global__ void __launch_bounds__(256) k_mq_quant(const float *__restrict__ x, int M, int K, uint4 *oq, int *os,
                                                  float *od, const __grid_constant__ cuda_moe_router rt) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int lane = threadIdx.x % 32, sb = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, m = blockIdx.y;
    if (m >= M) {
        if (blockIdx.x == 0 && threadIdx.x < 32) cuda_moe_route_row(rt, m - M, lane);
        return;
    }
    if (sb >= K / 256) return;
    const float *xv = x + (size_t)m * K + 256 * sb + 8 * lane;
    const float4 v0 = *(const float4 *)xv, v1 = *(const float4 *)(xv + 4);
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = cuda_warp_max(amax);
    const float id = amax > 0.0f ? 32767.0f / amax : 0.0f;
    int c[8], sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) c[i] = __float2int_rn(v[i] * id), sum += c[i];
    uint32_t w[4]; /* the int16 codes two a word */
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (uint32_t)(c[2 * i] & 0xffff) | ((uint32_t)c[2 * i + 1] << 16);
    /* hi / lo bytes of values 0..3 and 4..7 */
    const uint32_t h0 = __byte_perm(w[0], w[1], 0x7531), h1 = __byte_perm(w[2], w[3], 0x7531),
                   l0 = __byte_perm(w[0], w[1], 0x6420), l1 = __byte_perm(w[2], w[3], 0x6420);
    const int pp = 8 * sb + lane / 4, t = lane % 4;
    uint4 *q = oq + ((size_t)m * (K / 32) + pp) * 4 + t;
    if constexpr (T == LMX_GGML_Q4_K) {
        *q = make_uint4(h0, h1, l0, l1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1), sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0) os[(size_t)m * (K / 32) + pp] = sum;
    } else { /* lane t of a part: values 4t .. 4t + 3 from lane t / 2's half t % 2, 16 + 4t .. from 2 + t / 2's */
        const int a = (lane & ~3) + t / 2, b = a + 2, hf = t & 1;
        const uint32_t ah0 = __shfl_sync(0xffffffffu, h0, a), ah1 = __shfl_sync(0xffffffffu, h1, a),
                       al0 = __shfl_sync(0xffffffffu, l0, a), al1 = __shfl_sync(0xffffffffu, l1, a),
                       bh0 = __shfl_sync(0xffffffffu, h0, b), bh1 = __shfl_sync(0xffffffffu, h1, b),
                       bl0 = __shfl_sync(0xffffffffu, l0, b), bl1 = __shfl_sync(0xffffffffu, l1, b);
        *q = make_uint4(hf ? ah1 : ah0, hf ? bh1 : bh0, hf ? al1 : al0, hf ? bl1 : bl0);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1); /* lanes 2i, 2i + 1: a half of 16 */
        if (!(t & 1)) os[((size_t)m * (K / 32) + pp) * 2 + t / 2] = sum;
    }
    if (lane == 0) od[(size_t)m * (K / 256) + sb] = amax / 32767.0f;
}

/* A Q4_K weight load through the read-only path, each L2 miss fetching 256 bytes (the row's next bytes, which its
 * next super-block reads).  H200, 12-layer Qwen3-30B-A3B Q4_K_M batch 32: gate / up 74.2 -> 70.2 us, 48 layers batch
 * 8 / 32 1,393 / 3,023 -> 1,435 / 3,056 tok/s; Q6_K's down (224-byte blocks) 64.4 -> 66.9 us, so it keeps __ldg. */
template <class V> static __device__ __forceinline__ V mq_ld(const uint8_t *p) {
    V v;
    if constexpr (sizeof(V) == 16)
        asm("ld.global.nc.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p));
    else
        asm("ld.global.nc.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* byte k of w (one PRMT) */
static __device__ __forceinline__ int mq_byte(uint32_t w, int k) { return (int)__byte_perm(w, 0u, 0x4440u | k); }

/* A lane's share of its warp's 16 rows of type T (wr: rows g and g + 8): load takes super-block b's bytes, sum adds
 * them times the staged x to acc (pairs 2t, 2t + 1): x's codes sx [K / 32][8 pairs][4 lanes], sums sxs
 * [K / 32 * SUMS][8 pairs] and scales sxd [K / 256][8 pairs], as mq_x holds them a row */
template <int T> struct mq_rows;

template <> struct mq_rows<LMX_GGML_Q4_K> {
    uint4 hd[2];    /* d, dmin, the 12 scale bytes */
    uint2 qs[2][4]; /* lane t's bytes 8t .. 8t + 7 of each 32 of the codes */
    __device__ __forceinline__ void load(const uint8_t *const (&wr)[2], int b, int t) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint8_t *p = wr[h] + (size_t)b * 144;
            hd[h] = mq_ld<uint4>(p);
#pragma unroll
            for (int j = 0; j < 4; j++) qs[h][j] = mq_ld<uint2>(p + 16 + 32 * j + 8 * t);
        }
    }
    __device__ __forceinline__ void sum(int b, const uint4 *sx, const int *sxs, const float *sxd, int g, int t,
                                        float (&acc)[4]) const {
        uint32_t sc[2][2], mn[2][2]; /* each row's eight 6-bit scales and mins, a byte each */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t sw[3] = {hd[h].y, hd[h].z, hd[h].w};
            gq_k4_scale4(sw, 0, sc[h][0], mn[h][0]);
            gq_k4_scale4(sw, 1, sc[h][1], mn[h][1]);
        }
        /* over the sub-blocks, in int32: s6 (q . hi), s6 (q . lo), m6 sum(qx) (each bounded: 63 x 8 sub-blocks of at
         * most 15 x 128 x 32, 15 x 255 x 32, 32 x 32,768) */
        int ih[4] = {0, 0, 0, 0}, il[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int s = 0; s < 2; s++) { /* sub-block 2j + s: the low, then the high nibbles */
                const int pp = 8 * b + 2 * j + s, k = 2 * j + s;
                const uint32_t a[4] = {(qs[0][j].x >> 4 * s) & 0x0F0F0F0Fu, (qs[1][j].x >> 4 * s) & 0x0F0F0F0Fu,
                                       (qs[0][j].y >> 4 * s) & 0x0F0F0F0Fu, (qs[1][j].y >> 4 * s) & 0x0F0F0F0Fu};
                const uint4 xb = sx[pp * 32 + g * 4 + t];
                int Dh[4], Dl[4];
                mq_mma32<0>(Dh, a, xb.x, xb.y);
                mq_mma32<1>(Dl, a, xb.z, xb.w);
                const int2 xs = *(const int2 *)(sxs + pp * 8 + 2 * t); /* pairs 2t, 2t + 1 */
#pragma unroll
                for (int o = 0; o < 4; o++) {
                    const int s6 = mq_byte(sc[o / 2][k >> 2], k & 3), m6 = mq_byte(mn[o / 2][k >> 2], k & 3);
                    ih[o] += s6 * Dh[o], il[o] += s6 * Dl[o], im[o] += m6 * (o % 2 ? xs.y : xs.x);
                }
            }
        const float2 dx = *(const float2 *)(sxd + b * 8 + 2 * t);
#pragma unroll
        for (int o = 0; o < 4; o++) {
            const uint32_t dd = hd[o / 2].x;
            const float dot = fmaf(256.0f, (float)ih[o], (float)il[o]);
            acc[o] = fmaf(o % 2 ? dx.y : dx.x, fmaf(gq_half(dd, 0), dot, -gq_half(dd, 1) * (float)im[o]), acc[o]);
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
    __device__ __forceinline__ void sum(int b, const uint4 *sx, const int *sxs, const float *sxd, int g, int t,
                                        float (&acc)[4]) const {
        /* over the halves, in int32: s8 (q . hi), s8 (q . lo), s8 sum(qx) (each bounded: 128 x 16 halves of at most
         * 63 x 128 x 16, 63 x 255 x 16, 16 x 32,768) */
        int ih[4] = {0, 0, 0, 0}, il[4] = {0, 0, 0, 0}, im[4] = {0, 0, 0, 0};
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int pp = 8 * b + 4 * hh + q;
                const uint4 xb = sx[pp * 32 + g * 4 + t];
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    uint32_t a[2];
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        a[h] = ((ql[h][hh][is][q & 1] >> 4 * (q >> 1)) & 0x0F0F0F0Fu) |
                               (((qh[h][hh][is] >> 2 * q) & 0x03030303u) << 4);
                    int Dh[4], Dl[4];
                    mq_mma16<0>(Dh, a[0], a[1], is ? xb.y : xb.x);
                    mq_mma16<1>(Dl, a[0], a[1], is ? xb.w : xb.z);
                    const int2 xs = *(const int2 *)(sxs + (2 * pp + is) * 8 + 2 * t);
                    const int k = 8 * hh + 2 * q + is;
#pragma unroll
                    for (int o = 0; o < 4; o++) {
                        const int s8 = (int8_t)(sc[o / 2][k >> 2] >> 8 * (k & 3));
                        ih[o] += s8 * Dh[o], il[o] += s8 * Dl[o], im[o] += s8 * (o % 2 ? xs.y : xs.x);
                    }
                }
            }
        const float2 dx = *(const float2 *)(sxd + b * 8 + 2 * t);
#pragma unroll
        for (int o = 0; o < 4; o++) {
            const float dot = fmaf(256.0f, (float)ih[o], fmaf(-32.0f, (float)im[o], (float)il[o]));
            acc[o] = fmaf((o % 2 ? dx.y : dx.x) * gq_half(dw[o / 2], 0), dot, acc[o]);
        }
    }
};

/* Block (bx, e): expert e's rows (above) for every pair p with pick[p] == e: y[p, n] = act(gate_e x) (up_e x)
 * (PAIR, x's row p / kused) or down_e x (x's row p), x quantized by k_mq_quant. */
template <int T, int PAIR>
__global__ void __launch_bounds__(256, 2)
    k_moe_mma(const mq_x x, const __grid_constant__ gv_moe mo, const int *pick, int P, int kused, int N, int K, int act,
              float *__restrict__ y) {
    extern __shared__ uint4 mq_sm[]; /* x's codes [K / 32][8][4], then sums [K / 32 * SUMS][8], scales [K / 256][8] */
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
    constexpr int S = mq_t<T>::SUMS;
    const int NP = K / 32, SB = K / 256;
    mq_rows<T> cur, next;
    uint4 *sx = mq_sm;
    int *sxs = (int *)(mq_sm + NP * 32);
    float *sxd = (float *)(sxs + NP * S * 8);
    for (int c0 = 0; c0 < np; c0 += MQ_N) {
        const int nc = np - c0 < MQ_N ? np - c0 : MQ_N;
        __syncthreads(); /* the last pass's reads of the staged x are done */
        /* every copy in flight at once, and the first weights with them; empty slots zeros */
        for (int i = tid; i < NP * 32; i += blockDim.x) { /* codes: entry i is lane i % 4 of pair slot i / 4 % 8 */
            const int j = i / 4 % 8;
            const size_t m = mq_xrow<PAIR>(plist[c0 + (j < nc ? j : 0)], kused);
            cp_async16_or_zeros(smem_addr(sx + i), x.q + m * NP * 4 + i / 32 * 4 + i % 4, j < nc ? 16 : 0);
        }
        for (int i = tid; i < (NP * S + SB) * 8; i += blockDim.x) { /* sums, then scales: [index][pair slot] */
            const int j = i % 8, k = i / 8;
            const size_t m = mq_xrow<PAIR>(plist[c0 + (j < nc ? j : 0)], kused);
            const void *src = k < NP * S ? (const void *)(x.s + m * NP * S + k)
                                         : (const void *)(x.d + m * SB + k - NP * S);
            cp_async4_or_zeros(smem_addr(sxs + i), src, j < nc ? 4 : 0);
        }
        cp_async_commit();
        cur.load(wr, 0, t);
        cp_async_wait<0>();
        __syncthreads();
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int b = 0; b < SB; b++) {
            if (b + 1 < SB) next.load(wr, b + 1, t);
            cur.sum(b, sx, sxs, sxd, g, t, acc);
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

template <int T> static size_t mq_smem(int K) {
    return (size_t)MQ_N * (K / 32 * 4 * sizeof(uint4) + K / 32 * mq_t<T>::SUMS * sizeof(int) + K / 256 * sizeof(float));
}

int cuda_moe_mma_takes(const cuda_backend *cb, const lmx_moe_args *a, int down) {
    const int min_rows = cb->moe_mma[down];
    /* never one row: its pairs each read another expert, and cuda_moe_normed folds its norm into gate / up's x
     * and its combine into the per-pair down projection */
    if (min_rows <= 0 || a->M < (min_rows > 2 ? min_rows : 2) || a->E > GV_MOE_MAX) return 0;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    if (F % 256 || C % 256 || (int64_t)mq_smem<LMX_GGML_Q6_K_A16>((int)(down ? F : C)) > cb->moe_mma_smem)
        return 0; /* (Q6_K's the larger) */
    for (int e = 0; e < a->E; e++)
        for (int j = down ? 2 : 0; j < (down ? 3 : 2); j++) {
            const lmx_tensor *w = &a->experts[3 * e + j];
            const int type = w->q.ggml_type;
            if (type != LMX_GGML_Q4_K && !(down && type == LMX_GGML_Q6_K_A16)) return 0;
            if ((uintptr_t)w->data % 16 || w->shape[0] != (j == 2 ? C : F) || w->shape[1] != (j == 2 ? F : C)) return 0;
        }
    return 1;
}

template <int T> static size_t mq_gemv_smem(int nt, int per);
template <int T, int NT>
__global__ void k_gemv_mq(const mq_x x, int M, const gv_segs sg, int K, int kp, float *__restrict__ part, int *__restrict__ ticket);
#define MQ_GEMV_SB 4    /* super-blocks a K part at most: the staged x of 32 rows, 4 x 18.6 KB (Q6_K) */

/* The staged x beside each instance's own tables may pass the 48 KB a launch takes without asking: each is allowed
 * MQ_SMEM, or what the device lets a block have beside its static tables where that is less; cb->moe_mma_smem, the
 * least of them, bounds the rows that take it. */
void cuda_moe_mma_init(cuda_backend *cb) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cb->device);
    const void *fn[3] = {(const void *)k_moe_mma<LMX_GGML_Q4_K, 1>, (const void *)k_moe_mma<LMX_GGML_Q4_K, 0>,
                         (const void *)k_moe_mma<LMX_GGML_Q6_K_A16, 0>};
    cb->moe_mma_smem = MQ_SMEM;
    for (int i = 0; i < 3; i++) {
        cudaFuncAttributes at;
        int allow = 0;
        if (cudaFuncGetAttributes(&at, fn[i]) == cudaSuccess) allow = optin - (int)at.sharedSizeBytes;
        allow = allow < MQ_SMEM ? allow : MQ_SMEM;
        if (allow < 0 || cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, allow) != cudaSuccess)
            allow = 0;
        cb->moe_mma_smem = allow < cb->moe_mma_smem ? allow : cb->moe_mma_smem;
    }
    const void *gf[8] = {(const void *)k_gemv_mq<LMX_GGML_Q4_K, 1>, (const void *)k_gemv_mq<LMX_GGML_Q4_K, 2>,
                         (const void *)k_gemv_mq<LMX_GGML_Q4_K, 3>, (const void *)k_gemv_mq<LMX_GGML_Q4_K, 4>,
                         (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16, 1>, (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16, 2>,
                         (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16, 3>, (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16, 4>};
    cb->gemv_mq_smem = (int)mq_gemv_smem<LMX_GGML_Q6_K_A16>(4, MQ_GEMV_SB);
    for (int i = 0; i < 8; i++)
        if (cudaFuncSetAttribute(gf[i], cudaFuncAttributeMaxDynamicSharedMemorySize, cb->gemv_mq_smem) != cudaSuccess)
            cb->gemv_mq_smem = 0;
    cudaGetLastError();
}

/* x [rows, K] quantized for type T into scratch (k_mq_quant; rt: gate / up's launch, which routes the rows too):
 * its layout in xo; 0 with the error set when the scratch cannot grow */
template <int T>
static int mq_quant(cuda_backend *cb, const float *x, int rows, int K, const cuda_moe_router *rt, mq_x *xo) {
    const size_t nq = (size_t)rows * K / 8, ns = (size_t)rows * K / 32 * mq_t<T>::SUMS, nd = (size_t)rows * K / 256;
    uint4 *q = (uint4 *)cuda_scratch(cb, CUDA_SCRATCH_XQ, nq * sizeof(uint4) + ns * sizeof(int) + nd * sizeof(float));
    if (!q) return 0;
    int *s = (int *)(q + nq);
    float *d = (float *)(s + ns);
    *xo = mq_x{q, s, d};
    cuda_launch(cb, k_mq_quant<T>, dim3((unsigned)cuda_blocks(K / 256, 8), (unsigned)(rt ? 2 * rows : rows)), 256, 0, x,
                rows, K, q, s, d, rt ? *rt : cuda_moe_router{});
    return 1;
}

/* One projection's launch on x quantized in xo (mq_quant<T>): y [pairs, N] */
template <int T, int PAIR>
static lmx_status mq_launch(cuda_backend *cb, const lmx_moe_args *a, const mq_x &xo, const int *pick, float *y) {
    const int j = PAIR ? 0 : 2, N = (int)a->experts[j].shape[0], K = (int)a->experts[j].shape[1];
    gv_moe tab; /* gate and up, or down */
    gv_moe_fill(&tab, a->experts, a->E, !PAIR);
    const dim3 grid((unsigned)cuda_blocks(N, PAIR ? 64 : 128), (unsigned)a->E);
    cuda_launch(cb, k_moe_mma<T, PAIR>, grid, 256, mq_smem<T>(K), xo, tab, pick, a->M * a->K, a->K, N, K, (int)a->act,
                y);
    return cuda_check_launch(cb, PAIR ? "moe gate/up (mma)" : "moe down (mma)");
}

lmx_status cuda_moe_mma_gu(cuda_backend *cb, const lmx_moe_args *a, int *pick, float *pw, float *h) {
    cuda_moe_router rt;
    cuda_moe_router_set(&rt, a, 0, pick, pw);
    mq_x xo;
    if (!mq_quant<LMX_GGML_Q4_K>(cb, (const float *)a->x->data, a->M, (int)a->experts[0].shape[1], &rt, &xo))
        return cb->base.err.status;
    return mq_launch<LMX_GGML_Q4_K, 1>(cb, a, xo, pick, h);
}

lmx_status cuda_moe_mma_down(cuda_backend *cb, const lmx_moe_args *a, const int *pick, const float *h, float *y) {
    const int rows = a->M * a->K, K = (int)a->experts[2].shape[1];
    mq_x xo;
    if (a->experts[2].q.ggml_type == LMX_GGML_Q6_K_A16) {
        if (!mq_quant<LMX_GGML_Q6_K_A16>(cb, h, rows, K, NULL, &xo)) return cb->base.err.status;
        return mq_launch<LMX_GGML_Q6_K_A16, 0>(cb, a, xo, pick, y);
    }
    if (!mq_quant<LMX_GGML_Q4_K>(cb, h, rows, K, NULL, &xo)) return cb->base.err.status;
    return mq_launch<LMX_GGML_Q4_K, 0>(cb, a, xo, pick, y);
}

/* Dense GGUF weights for several rows (cuda_gemv's launches of M = 2..32 rows without a GLU): y_i [M, N_i] = x [M, K]
 * @ w_i^T (+ b_i) on the same integer tensor cores, x quantized by k_mq_quant<T>.  Block (bx, i) takes rows [grp 128,
 * grp 128 + 128) of segment i (a warp 16 of them, as down's blocks) over the super-blocks [sb0, sb1) of its K part kq
 * of kp, for every one of the NT tiles of 8 rows of x at once, so each weight is read once for all M rows.  The parts
 * meet as k_gemv_tc's do: each leaves its sums in scratch and the last block of a row block adds them in part order,
 * so a weight gives the same bits in any launch of the same shapes. */
/* K up to 16 super-blocks: the 8B's down projection (K 14,336) in parts of at most 4 ran slower than k_gemv_tc (H200,
 * Llama-3.1-8B Q4_K_M batch 8 2,635-2,670 -> 2,573-2,585 tok/s), and in fewer, longer parts slower at 32 rows (5,503-5,548
 * -> 5,001-5,036) */
#define MQ_GEMV_K 4096
#define MQ_GEMV_COST 1  /* a part's own cost (its staging, its sums in scratch), in super-blocks of its loop */

template <int T> static size_t mq_gemv_smem(int nt, int per) {
    return (size_t)nt * per * (256 * sizeof(uint4) + 64 * mq_t<T>::SUMS * sizeof(int) + 8 * sizeof(float));
}

template <int T, int NT>
__global__ void __launch_bounds__(256) k_gemv_mq(const mq_x x, int M, const gv_segs sg, int K, int kp,
                                                 float *__restrict__ part, int *__restrict__ ticket) {
    extern __shared__ uint4 mq_sm[]; /* per tile j: x's codes [per * 8 parts][8][4], sums [per * 8 S][8], scales [per][8] */
    constexpr int S = mq_t<T>::SUMS, F = 4 * NT;
    cuda_pdl_trigger();
    const gv_seg G = seg_pick(sg, blockIdx.y);
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    const int grp = blockIdx.x / kp, kq = blockIdx.x % kp, n0 = grp * 128 + 16 * warp;
    if (grp * 128 >= G.N) { /* the whole block past this segment's rows */
        cuda_pdl_wait();
        return;
    }
    const bool live = n0 < G.N; /* a dead warp still meets the block's barriers */
    const int NP = K / 32, SB = K / 256, per = (SB + kp - 1) / kp, m0 = 8 * NT * blockIdx.z; /* x's rows m0 .. */
    const int sb0 = kq * per < SB ? kq * per : SB, nsb = (sb0 + per < SB ? sb0 + per : SB) - sb0;
    const int64_t rb = (int64_t)SB * gq_traits<T>::BYTES;
    const uint8_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = n0 + g + 8 * h;
        wr[h] = (const uint8_t *)G.w + (n < G.N ? n : G.N - 1) * rb;
    }
    mq_rows<T> cur, next;
    if (live && nsb > 0) cur.load(wr, sb0, t); /* weights: no kernel writes them */
    uint4 *sx = mq_sm;
    int *sxs = (int *)(sx + NT * per * 256);
    float *sxd = (float *)(sxs + NT * per * 64 * S);
    cuda_pdl_wait(); /* x comes from the launch before */
#pragma unroll
    for (int j = 0; j < NT; j++) { /* tile j's rows m0 + 8 j + slot, as the staging in k_moe_mma lays them */
        const int mj = m0 + 8 * j;
        for (int r = tid; r < nsb * 256; r += blockDim.x) { /* codes: entry r is lane r % 4 of pair slot r / 4 % 8 */
            const int m = mj + r / 4 % 8;
            cp_async16_or_zeros(smem_addr(sx + j * per * 256 + r),
                                x.q + ((size_t)(m < M ? m : 0) * NP + sb0 * 8 + r / 32) * 4 + r % 4, m < M ? 16 : 0);
        }
        for (int r = tid; r < nsb * 64 * S; r += blockDim.x) { /* sums: [index][pair slot] */
            const int m = mj + r % 8;
            cp_async4_or_zeros(smem_addr(sxs + j * per * 64 * S + r),
                               x.s + (size_t)(m < M ? m : 0) * NP * S + sb0 * 8 * S + r / 8, m < M ? 4 : 0);
        }
        for (int r = tid; r < nsb * 8; r += blockDim.x) { /* scales: [super-block][pair slot] */
            const int m = mj + r % 8;
            cp_async4_or_zeros(smem_addr(sxd + j * per * 8 + r), x.d + (size_t)(m < M ? m : 0) * SB + sb0 + r / 8,
                               m < M ? 4 : 0);
        }
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    if (live)
        for (int b = 0; b < nsb; b++) {
            if (b + 1 < nsb) next.load(wr, sb0 + b + 1, t);
#pragma unroll
            for (int j = 0; j < NT; j++) cur.sum(b, sx + j * per * 256, sxs + j * per * 64 * S, sxd + j * per * 8, g, t, acc[j]);
            cur = next;
        }
    if (kp > 1) {
        const int64_t cell = (int64_t)blockIdx.z * gridDim.y + blockIdx.y; /* (tile group, segment) */
        float *mine = part + (cell * gridDim.x + blockIdx.x) * F * 256;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int o = 0; o < 4; o++) __stcg(mine + (j * 4 + o) * 256 + tid, acc[j][o]);
        if (!cuda_block_last(ticket + cell * (gridDim.x / kp) + grp, kp)) return;
        const float *all = part + (cell * gridDim.x + (int64_t)grp * kp) * F * 256;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int o = 0; o < 4; o++) { /* every part's load in flight before the sum, added in part order */
                float v[16], s = 0.0f;
#pragma unroll
                for (int q = 0; q < 16; q++) v[q] = q < kp ? __ldcg(all + ((int64_t)q * F + j * 4 + o) * 256 + tid) : 0.0f;
#pragma unroll
                for (int q = 0; q < 16; q++)
                    if (q < kp) s += v[q];
                acc[j][o] = s;
            }
    }
    /* acc[j][o]: row n0 + g + 8 (o / 2), x's row 8 j + 2 t + o % 2 */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int o = 0; o < 4; o++) {
            const int m = m0 + 8 * j + 2 * t + o % 2, n = n0 + g + 8 * (o / 2);
            if (live && m < M && n < G.N) G.y[(int64_t)m * G.N + n] = acc[j][o] + bias_at(G.bias, G.bt, n);
        }
}

typedef void (*mq_gemv_fn)(const mq_x, int, const gv_segs, int, int, float *, int *);
template <int T> static mq_gemv_fn mq_gemv_kernel(int nt) {
    return nt == 1 ? k_gemv_mq<T, 1> : nt == 2 ? k_gemv_mq<T, 2> : nt == 3 ? k_gemv_mq<T, 3> : k_gemv_mq<T, 4>;
}

/* K parts for rows of G row blocks (gmax in the largest segment) and SB super-blocks: at most MQ_GEMV_SB super-blocks a
 * part, and of the counts that allow (1, 2, 4, .. 16 within the scratch's cells) the one whose waves of blocks take the
 * least time, a block counted as its super-blocks and MQ_GEMV_COST; 0: none fits */
static int mq_gemv_parts(const cuda_backend *cb, int slots, int groups, int gmax, int SB, int nt) {
    int kp = 0;
    int64_t best = -1;
    for (int p = 1; p <= 16 && (int64_t)gmax * p <= 4 * cb->sm_count; p *= 2) {
        if ((SB + p - 1) / p > MQ_GEMV_SB) continue;
        const int64_t waves = ((int64_t)groups * p + slots - 1) / slots, c = waves * ((SB + p - 1) / p + MQ_GEMV_COST);
        if (best < 0 || c < best) best = c, kp = p;
    }
    return kp;
}

/* The blocks a row block's tiles of 8 rows of x take (each *nt of them, cb->gemv_mq_nt) */
static int mq_gemv_z(const cuda_backend *cb, int M, int *nt) {
    const int tiles = (M + 7) / 8, n = cb->gemv_mq_nt > 0 && cb->gemv_mq_nt < tiles ? cb->gemv_mq_nt : tiles;
    if (nt) *nt = n;
    return (tiles + n - 1) / n;
}

int cuda_gemv_mq_takes(const cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu) {
    const int type = ws[0]->q.ggml_type;
    if (cb->gemv_mq <= 0 || M < cb->gemv_mq || M > 32 || glu >= 0 || ws[0]->shape[1] % 256 || ws[0]->shape[1] > MQ_GEMV_K ||
        (type != LMX_GGML_Q4_K && type != LMX_GGML_Q6_K_A16))
        return 0;
    int gmax = 1;
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)ws[i]->data % 16) return 0;
        const int gi = (int)((ws[i]->shape[0] + 127) / 128);
        gmax = gi > gmax ? gi : gmax;
    }
    int nt;
    const int SB = (int)(ws[0]->shape[1] / 256), z = mq_gemv_z(cb, M, &nt);
    return cb->gemv_mq_smem > 0 && mq_gemv_parts(cb, 2 * cb->sm_count, gmax * z, gmax * z, SB, nt) > 0;
}

template <int T> static lmx_status mq_gemv(cuda_backend *cb, int n, const gv_segs *sg, const float *x, int M, int K) {
    mq_x xo;
    if (!mq_quant<T>(cb, x, M, K, NULL, &xo)) return cb->base.err.status;
    int groups = 0, gmax = 1;
    for (int i = 0; i < n; i++) {
        const int gi = (sg->s[i].N + 127) / 128;
        groups += gi;
        gmax = gi > gmax ? gi : gmax;
    }
    int nt;
    const int SB = K / 256, z = mq_gemv_z(cb, M, &nt);
    const mq_gemv_fn k = mq_gemv_kernel<T>(nt);
    int per_sm = cuda_fit_blocks(cb, (const void *)k);
    per_sm = per_sm > 2 ? 2 : per_sm < 1 ? 1 : per_sm;
    int kp = mq_gemv_parts(cb, cb->sm_count * per_sm, groups * z, gmax * z, SB, nt);
    float *part = NULL;
    int *ticket = kp > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    if (kp > 1 && !ticket) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "matmul (integer tensor cores): no scratch");
    const int per = (SB + kp - 1) / kp;
    cuda_launch(cb, k, dim3((unsigned)(gmax * kp), (unsigned)n, (unsigned)z), 256, mq_gemv_smem<T>(nt, per), xo, M, *sg, K, kp, part,
                ticket);
    return cuda_check_launch(cb, "matmul (integer tensor cores)");
}

lmx_status cuda_gemv_mq(cuda_backend *cb, int n, const gv_segs *sg, int type, const float *x, int M, int K) {
    return type == LMX_GGML_Q4_K ? mq_gemv<LMX_GGML_Q4_K>(cb, n, sg, x, M, K) : mq_gemv<LMX_GGML_Q6_K_A16>(cb, n, sg, x, M, K);
}
