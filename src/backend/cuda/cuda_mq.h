/* cuda_mq.h - GGUF Q4_K / Q6_K weights against x quantized a super-block at a time, on the integer tensor cores: the
 * pieces the experts' kernel (cuda_moe_mma.cu) and the dense GEMV of several rows (cuda_gemv_mq.cu) share.
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
 * (the GEMVs' x has a d a part of 32 values, so their sums take every scale a sub-block). */
#ifndef LMX_BACKEND_CUDA_MQ_H
#define LMX_BACKEND_CUDA_MQ_H

#include "cuda_gemv.h"
#include "cuda_mma.h"

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

/* The shared memory that sbs super-blocks of x staged for 8 rows (pair slots) take, as mq_rows::sum reads them: codes
 * [sbs * 8 parts][8][4], sums [sbs * 8 SUMS][8], scales [sbs][8] */
template <int T> static inline size_t mq_stage_bytes(int sbs) {
    return (size_t)sbs * (256 * sizeof(uint4) + 64 * mq_t<T>::SUMS * sizeof(int) + 8 * sizeof(float));
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

/* v summed over the four lanes t of a row (lane % 4), in every one of them: integers, exact in any order */
static __device__ __forceinline__ int mq_lanes4(int v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* A warp's 16 rows n0 .. n0 + 15 of a weight w [N, K] of type T (an expert's): lane row g's rows g and g + 8 (wr: past
 * N, the last row), and the rows' tile (mq_tile, as the experts are uploaded: past N, the last tile) */
template <int T>
static __device__ __forceinline__ void mq_warp_rows(const void *w, int n0, int g, int N, int K, const uint8_t *(&wr)[2],
                                                    const uint8_t *&tile) {
    const int64_t rb = (int64_t)(K / 256) * gq_traits<T>::BYTES;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = n0 + g + 8 * h;
        wr[h] = (const uint8_t *)w + (n < N ? n : N - 1) * rb;
    }
    tile = (const uint8_t *)w + (size_t)(n0 < N ? n0 : N - 16) * rb;
}

/* A lane's share of its warp's 16 rows of type T (wr: rows g and g + 8): load takes super-block b's bytes, sum adds
 * them times the staged x's super-block b (its index in the staging: the dense GEMV stages its K part alone) to acc
 * (pairs 2t, 2t + 1): x's codes sx [K / 32][8 pairs][4 lanes], sums sxs [K / 32 * SUMS][8 pairs] and scales sxd
 * [K / 256][8 pairs], as mq_x holds them a row */
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
    /* the same bytes from a tile (mq_tile<T>: the warp's 16 rows of a super-block, lane l's slot i holding
     * qs[i / 2][2 (i % 2)] and qs[i / 2][2 (i % 2) + 1], then each row's 16 bytes): half h (rows g + 8 h: slots 2 h and
     * 2 h + 1, and its scales) into half H's registers, through the read-only path (LDG) or from shared memory (a
     * staged tile) */
    template <int H, bool LDG = true> __device__ __forceinline__ void load_half(const uint8_t *tile, int lane, int h) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const uint8_t *p = tile + mq_tile<LMX_GGML_Q4_K>::slot(2 * h + j, lane);
            const uint4 v = LDG ? mq_ld<uint4>(p) : *(const uint4 *)p;
            qs[H][2 * j] = make_uint2(v.x, v.y);
            qs[H][2 * j + 1] = make_uint2(v.z, v.w);
        }
        const uint8_t *s = tile + mq_tile<LMX_GGML_Q4_K>::scales(lane / 4 + 8 * h);
        hd[H] = LDG ? mq_ld<uint4>(s) : *(const uint4 *)s;
    }
    __device__ __forceinline__ void load_tiled(const uint8_t *tile, int lane) {
        load_half<0>(tile, lane, 0);
        load_half<1>(tile, lane, 1);
    }
    /* a super-block's float step for row g + 8 h from its integer sums (below) and x's scale dx: acc = fmaf(f, v, acc) */
    __device__ __forceinline__ void step(int h, int ih, int il, int im, float dx, float &f, float &v) const {
        const uint32_t dd = hd[h].x;
        f = dx, v = fmaf(gq_half(dd, 0), fmaf(256.0f, (float)ih, (float)il), -gq_half(dd, 1) * (float)im);
    }
    /* one row of x (its codes sx [K / 32][4 lanes], sums sxs [K / 32], super-block b's scale dx) against row g + 8 H
     * of super-block b on the CUDA cores: lane t's share of each sub-block's two products (dp4a over its eight
     * values, the ones it gives the mma) added over the row's four lanes, then sum's step for that column of x */
    template <int H>
    __device__ __forceinline__ void one(int b, const uint4 *sx, const int *sxs, float dx, int t, float &f, float &v) const {
        uint32_t sc[2], mn[2];
        const uint32_t sw[3] = {hd[H].y, hd[H].z, hd[H].w};
        gq_k4_scale4(sw, 0, sc[0], mn[0]);
        gq_k4_scale4(sw, 1, sc[1], mn[1]);
        int ih = 0, il = 0, im = 0;
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const int pp = 8 * b + 2 * j + s, k = 2 * j + s;
                const uint32_t a0 = (qs[H][j].x >> 4 * s) & 0x0F0F0F0Fu, a1 = (qs[H][j].y >> 4 * s) & 0x0F0F0F0Fu;
                const uint4 xb = sx[pp * 4 + t];
                const int s6 = mq_byte(sc[k >> 2], k & 3), m6 = mq_byte(mn[k >> 2], k & 3);
                ih += s6 * __dp4a((int)a1, (int)xb.y, __dp4a((int)a0, (int)xb.x, 0));
                il += s6 * (int)__dp4a(a1, xb.w, __dp4a(a0, xb.z, 0u));
                im += m6 * sxs[pp];
            }
        step(H, mq_lanes4(ih), mq_lanes4(il), im, dx, f, v);
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
            float f, v;
            step(o / 2, ih[o], il[o], im[o], o % 2 ? dx.y : dx.x, f, v);
            acc[o] = fmaf(f, v, acc[o]);
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
    /* the same bytes from a tile (mq_tile<T>): lane l's words of rows g and g + 8 in its six slots, word
     * 12 h + 4 hh + 2 is + (q & 1) of them ql[h][hh][is][q & 1], word 12 h + 8 + 2 hh + is qh[h][hh][is]; then each
     * row's 16 scale bytes and d: half h (rows g + 8 h) into half H's registers */
    template <int H> __device__ __forceinline__ void load_half(const uint8_t *tile, int lane, int h) {
        uint32_t u[12];
#pragma unroll
        for (int i = 0; i < 3; i++) {
            const uint4 v = __ldg((const uint4 *)(tile + mq_tile<LMX_GGML_Q6_K_A16>::slot(3 * h + i, lane)));
            u[4 * i] = v.x, u[4 * i + 1] = v.y, u[4 * i + 2] = v.z, u[4 * i + 3] = v.w;
        }
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int is = 0; is < 2; is++) {
                ql[H][hh][is][0] = u[4 * hh + 2 * is];
                ql[H][hh][is][1] = u[4 * hh + 2 * is + 1];
                qh[H][hh][is] = u[8 + 2 * hh + is];
            }
        const uint8_t *r = tile + mq_tile<LMX_GGML_Q6_K_A16>::scales(lane / 4 + 8 * h);
        const uint4 v = __ldg((const uint4 *)r);
        sc[H][0] = v.x, sc[H][1] = v.y, sc[H][2] = v.z, sc[H][3] = v.w;
        dw[H] = __ldg((const uint32_t *)(r + 16));
    }
    __device__ __forceinline__ void load_tiled(const uint8_t *tile, int lane) {
        load_half<0>(tile, lane, 0);
        load_half<1>(tile, lane, 1);
    }
    /* as mq_rows<Q4_K>'s */
    __device__ __forceinline__ void step(int h, int ih, int il, int im, float dx, float &f, float &v) const {
        f = dx * gq_half(dw[h], 0), v = fmaf(256.0f, (float)ih, fmaf(-32.0f, (float)im, (float)il));
    }
    /* as mq_rows<Q4_K>'s (sums sxs [K / 16], a half's) */
    template <int H>
    __device__ __forceinline__ void one(int b, const uint4 *sx, const int *sxs, float dx, int t, float &f, float &v) const {
        int ih = 0, il = 0, im = 0;
#pragma unroll
        for (int hh = 0; hh < 2; hh++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int pp = 8 * b + 4 * hh + q;
                const uint4 xb = sx[pp * 4 + t];
#pragma unroll
                for (int is = 0; is < 2; is++) {
                    const uint32_t a = ((ql[H][hh][is][q & 1] >> 4 * (q >> 1)) & 0x0F0F0F0Fu) |
                                       (((qh[H][hh][is] >> 2 * q) & 0x03030303u) << 4);
                    const int k = 8 * hh + 2 * q + is, s8 = (int8_t)(sc[H][k >> 2] >> 8 * (k & 3));
                    ih += s8 * __dp4a((int)a, (int)(is ? xb.y : xb.x), 0);
                    il += s8 * (int)__dp4a(a, is ? xb.w : xb.z, 0u);
                    im += s8 * sxs[2 * pp + is];
                }
            }
        step(H, mq_lanes4(ih), mq_lanes4(il), im, dx, f, v);
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
            float f, v;
            step(o / 2, ih[o], il[o], im[o], o % 2 ? dx.y : dx.x, f, v);
            acc[o] = fmaf(f, v, acc[o]);
        }
    }
};

/* x [rows, K] quantized for type (Q4_K or Q6_K_A16) into scratch (k_mq_quant, cuda_moe_mma.cu; rt: the experts' gate
 * / up launch, which routes the rows too, else NULL): its layout in xo; 0 with the error set when the scratch cannot
 * grow */
int cuda_mq_quant(cuda_backend *cb, int type, const float *x, int rows, int K, const cuda_moe_router *rt, mq_x *xo);

#endif
