/* cuda_ggml.h - GGUF block formats on the GPU, decoded 32 elements (a "part") at a time.
 *
 * Every block-quantized type lmx computes with (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: one part per 32-element
 * block; Q2_K Q3_K Q4_K Q5_K Q6_K: eight parts per 256-element super-block) decodes part j of a
 * block into 8-bit codes and two scale/offset pairs, one per half of 16 elements:
 *
 *     element e of the part = sc[e / 16] * q[e] - mn[e / 16]
 *
 * with q packed four to a 32-bit word in element order (q[0] holds elements 0..3, byte 0 first):
 * unsigned codes below 64 for every type but Q8_0, whose codes are signed.  Either way they read
 * correctly as signed bytes, the form the GEMV's 16 x 8-bit integer dot products (dp2a) take (cuda_ggml.cu);
 * the bf16 dequantization for prefill and the per-element reads of embedding rows use it too.
 * Block layouts: backend/cpu/ggml_quant.c (the cpu reference of every type). */
#ifndef LMX_BACKEND_CUDA_GGML_H
#define LMX_BACKEND_CUDA_GGML_H

#include "cuda_internal.h"

/* The block types with kernels (X(type) for each): every type lmx_ggml_is_supported_quant takes, Q6_K in the
 * layout its upload writes (LMX_GGML_Q6_K_A16: each 210-byte block 224 bytes from the last, so that it starts on
 * 16 bytes and a lane reads its codes as 16-byte loads; from the file's 2-byte-aligned blocks a one-row GEMV
 * issued 30 word loads a 128-element unit and was bound by its load queue at under half the bandwidth). */
#define GQ_TYPES(X)                                                                                                 \
    X(LMX_GGML_Q4_0) X(LMX_GGML_Q4_1) X(LMX_GGML_Q5_0) X(LMX_GGML_Q5_1) X(LMX_GGML_Q8_0) X(LMX_GGML_Q2_K)           \
    X(LMX_GGML_Q3_K) X(LMX_GGML_Q4_K) X(LMX_GGML_Q5_K) X(LMX_GGML_Q6_K_A16)

/* MLX 4-bit and 8-bit rows (element 8 i + k at bits 4 k of word i, or 4 i + k at bits 8 k; a scale and a
 * bias per group of 32, 64 or 128) taken by the same GEMV as pseudo block types of 32 elements in 16 or 32
 * bytes, their scales and biases read beside (k_ggemv). */
#define GQ_MLX4 1000
#define GQ_MLX8 1001
#define GQ_IS_MLX(t) ((t) == GQ_MLX4 || (t) == GQ_MLX8)

/* Bytes and elements of a block (the same table as formats/ggml_types.c, for device code). */
template <int T> struct gq_traits;
#define GQ_TRAITS(t, e, b)                                                                                          \
    template <> struct gq_traits<t> {                                                                               \
        static constexpr int ELEMS = e, BYTES = b, PARTS = e / 32;                                                  \
    }
GQ_TRAITS(LMX_GGML_Q4_0, 32, 18);
GQ_TRAITS(LMX_GGML_Q4_1, 32, 20);
GQ_TRAITS(LMX_GGML_Q5_0, 32, 22);
GQ_TRAITS(LMX_GGML_Q5_1, 32, 24);
GQ_TRAITS(LMX_GGML_Q8_0, 32, 34);
GQ_TRAITS(LMX_GGML_Q2_K, 256, 84);
GQ_TRAITS(LMX_GGML_Q3_K, 256, 110);
GQ_TRAITS(LMX_GGML_Q4_K, 256, 144);
GQ_TRAITS(LMX_GGML_Q5_K, 256, 176);
GQ_TRAITS(LMX_GGML_Q6_K_A16, 256, 224);
GQ_TRAITS(GQ_MLX4, 32, 16);
GQ_TRAITS(GQ_MLX8, 32, 32);
#undef GQ_TRAITS

/* A mixture's experts in tiles (LMX_GGML_Q4_K_T16 / Q6_K_T16; uploaded by cuda_moe_mma.cu's k_moe_tile): a tile is
 * 16 rows' super-block b, and tile (i, b) of a matrix of N rows sits at (i K / 256 + b) BYTES, so rows [16 i,
 * 16 i + 16) of any expert's view start where they would in rows.  A tile holds the codes first, in the order the
 * tensor-core launch's lane l = 4 g + t takes them for rows g and g + 8 (cuda_mq.h's mq_rows): its uint4 i at
 * slot(i, l), SLOTS of them (Q4_K: i = 2 h + j, row g + 8 h's code bytes 8 t .. 8 t + 7 of groups 2 j and 2 j + 1;
 * Q6_K: i = 3 h + k, row g + 8 h's ql words of half k (k < 2) or its qh words (k = 2)); then row r's scales at
 * scales(r) (Q4_K: d, dmin and the 12 scale bytes; Q6_K: the 16 scales and d, in 32 bytes). */
template <int T> struct mq_tile {
    static constexpr int BYTES = 16 * gq_traits<T>::BYTES; /* 2,304 / 3,584 */
    static constexpr int SLOTS = T == LMX_GGML_Q4_K ? 4 : 6, ROW_SCALES = T == LMX_GGML_Q4_K ? 16 : 32;
    static __host__ __device__ constexpr int slot(int i, int lane) { return (32 * i + lane) * 16; }
    static __host__ __device__ constexpr int scales(int r) { return 32 * 16 * SLOTS + ROW_SCALES * r; }
};

/* N little-endian words from p, whose address is a multiple of AL (2, 4, 8 or 16) bytes: 16-byte or
 * 8-byte loads, word loads, or (AL 2) the aligned words around the run joined by funnel shifts, the word
 * after the run read only when the run is not itself aligned (never a byte past the run's word).
 * load issues the loads and keeps what they return; get makes the words (after the loads have come,
 * so a kernel can have a run in flight while it computes with the previous one). */
template <int N, int AL> struct gq_run {
    static constexpr int X = AL < 4 ? 1 : 0; /* the extra word of an unaligned run */
    uint32_t r[N + X], sh;
    __device__ __forceinline__ void load(const uint8_t *p) {
        if constexpr (AL >= 16 && N % 4 == 0) {
#pragma unroll
            for (int i = 0; i < N / 4; i++) {
                const uint4 v = __ldg((const uint4 *)p + i);
                r[4 * i] = v.x, r[4 * i + 1] = v.y, r[4 * i + 2] = v.z, r[4 * i + 3] = v.w;
            }
        } else if constexpr (AL >= 8 && N % 2 == 0) {
#pragma unroll
            for (int i = 0; i < N / 2; i++) {
                const uint2 v = __ldg((const uint2 *)p + i);
                r[2 * i] = v.x, r[2 * i + 1] = v.y;
            }
        } else if constexpr (AL >= 4) {
#pragma unroll
            for (int i = 0; i < N; i++) r[i] = __ldg((const unsigned *)p + i);
        } else {
            const uintptr_t a = (uintptr_t)p;
            const unsigned *b = (const unsigned *)(a & ~(uintptr_t)3);
            sh = (unsigned)(a & 3) * 8;
#pragma unroll
            for (int i = 0; i < N; i++) r[i] = __ldg(b + i);
            r[N] = sh ? __ldg(b + N) : 0u;
        }
    }
    __device__ __forceinline__ void get(uint32_t (&w)[N]) const {
#pragma unroll
        for (int i = 0; i < N; i++) w[i] = X ? __funnelshift_r(r[i], r[i + X], sh) : r[i];
    }
};

template <int N, int AL>
static __device__ __forceinline__ void gq_words(const uint8_t *p, uint32_t (&w)[N]) {
    gq_run<N, AL> run;
    run.load(p);
    run.get(w);
}

static __device__ __forceinline__ float gq_f16(const uint8_t *p) { /* p 2-byte aligned */
    return __half2float(__ushort_as_half(__ldg((const unsigned short *)p)));
}
static __device__ __forceinline__ float gq_half(uint32_t w, int hi) {
    return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffffu)));
}

/* Bit k (k = 0..3) of h to bit 4 of byte k: the fifth bit of four 5-bit codes. */
static __device__ __forceinline__ uint32_t gq_bit4(uint32_t h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

/* Byte i (0..11) of three words, by selects: indexing the array with a variable would put it in local memory. */
static __device__ __forceinline__ int gq_byte(const uint32_t (&s)[3], int i) {
    const uint32_t w = i < 4 ? s[0] : i < 8 ? s[1] : s[2];
    return (w >> (8 * (i & 3))) & 255;
}

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) from the 12 scale bytes. */
static __device__ __forceinline__ void gq_k4_scale(const uint32_t (&sw)[3], int j, int &s6, int &m6) {
    const int sh = 8 * (j & 3), b0 = (sw[0] >> sh) & 255, b1 = (sw[1] >> sh) & 255, b2 = (sw[2] >> sh) & 255;
    /* both forms, then a select: the lanes of a warp take sub-blocks of both halves, so a branch ran both anyway */
    const int s_lo = b0 & 63, m_lo = b1 & 63, s_hi = (b2 & 15) | ((b0 >> 6) << 4), m_hi = (b2 >> 4) | ((b1 >> 6) << 4);
    s6 = j < 4 ? s_lo : s_hi, m6 = j < 4 ? m_lo : m_hi;
}

/* Q4_K / Q5_K: the 6-bit scales and mins of unit c's two parts (sub-blocks 2c and 2c + 1, of one form, from bytes
 * 2 (c & 1) and 2 (c & 1) + 1 of the scale words): part k's in byte k of s2 and m2, gq_k4_scale's values for both
 * parts in one pass of paired bytes, where each part would extract both forms of its own */
static __device__ __forceinline__ void gq_k4_scale2(const uint32_t (&sw)[3], int c, uint32_t &s2, uint32_t &m2) {
    const int sh = 16 * (c & 1);
    const uint32_t a = sw[0] >> sh, b = sw[1] >> sh, h = sw[2] >> sh;
    s2 = c < 2 ? a & 0x3F3Fu : (h & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    m2 = c < 2 ? b & 0x3F3Fu : ((h >> 4) & 0x0F0Fu) | ((b >> 2) & 0x3030u);
}

/* Q4_K / Q5_K: the 6-bit scales and mins of sub-blocks 4 hi .. 4 hi + 3 (one form), sub-block 4 hi + k's in byte k of
 * s4 and m4: gq_k4_scale2's bytes four at a time */
static __device__ __forceinline__ void gq_k4_scale4(const uint32_t (&sw)[3], int hi, uint32_t &s4, uint32_t &m4) {
    s4 = hi ? (sw[2] & 0x0F0F0F0Fu) | ((sw[0] >> 2) & 0x30303030u) : sw[0] & 0x3F3F3F3Fu;
    m4 = hi ? ((sw[2] >> 4) & 0x0F0F0F0Fu) | ((sw[1] >> 2) & 0x30303030u) : sw[1] & 0x3F3F3F3Fu;
}

/* A part's scale and min from its 6-bit s6 and m6: d * s6, dmin * m6 (dd: d and dmin, f16 each) */
static __device__ __forceinline__ void gq_k4_floats(uint32_t dd, int s6, int m6, float (&sc)[2], float (&mn)[2]) {
    sc[0] = sc[1] = gq_half(dd, 0) * (float)s6;
    mn[0] = mn[1] = gq_half(dd, 1) * (float)m6;
}

/* ... of part j (gq_k4_scale) */
static __device__ __forceinline__ void gq_k4_scales(const uint32_t (&sw)[3], uint32_t dd, int j, float (&sc)[2], float (&mn)[2]) {
    int s6, m6;
    gq_k4_scale(sw, j, s6, m6);
    gq_k4_floats(dd, s6, m6, sc, mn);
}

/* Q4_K / Q5_K codes of part j from its chunk's code words v (nibble j & 1) [and Q5_K's high bits hb]. */
template <int T>
static __device__ __forceinline__ void gq_k4_codes(const uint32_t *v, const uint32_t *hb, int j, uint32_t (&q)[8]) {
#pragma unroll
    for (int i = 0; i < 8; i++) {
        q[i] = (v[i] >> (4 * (j & 1))) & 0x0F0F0F0Fu;
        if constexpr (T == LMX_GGML_Q5_K) q[i] |= ((hb[i] >> j) & 0x01010101u) << 4;
    }
}

/* Q6_K part i4 (0..3) of a 128-element half: codes from its low-bit words l and high-bit words h; scale and
 * min from its two int8 scales (the low 16 bits of s) and d. */
static __device__ __forceinline__ void gq_q6_part(const uint32_t *l, const uint32_t *h, int i4, uint32_t s, float d,
                                                  uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        q[i] = ((l[i] >> (i4 >= 2 ? 4 : 0)) & 0x0F0F0F0Fu) | (((h[i] >> (2 * i4)) & 0x03030303u) << 4);
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const float ds = d * (float)(int8_t)((s >> (8 * k)) & 255u);
        sc[k] = ds, mn[k] = 32.0f * ds;
    }
}

/* ---- raw parts: the loads of part j of a block apart from its decoding ----------------------------
 * gq_raw<T>::load(b, j, in) reads what part j of the block at b needs (in false: b must still be a valid
 * block; its scales read as zero, so the part decodes to zeros); part() decodes it as gq_part does (gq_part
 * of these types is load + part).  The tensor-core GEMV loads a step's parts a step ahead of their use.
 * Types without a raw form: an empty struct. */
template <int T> struct gq_raw {};

template <int N> struct gq_raw_d { /* Q8_0, Q4_0: d, then N words of codes */
    gq_run<N, 2> qs;
    uint32_t d;
    __device__ __forceinline__ void load(const uint8_t *b, int, bool in) {
        qs.load(b + 2);
        d = in ? __ldg((const unsigned short *)b) : 0u;
    }
};

template <> struct gq_raw<LMX_GGML_Q8_0> : gq_raw_d<8> { /* d, int8 q[32] */
    __device__ __forceinline__ void part(uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        qs.get(q);
        sc[0] = sc[1] = gq_half(d, 0), mn[0] = mn[1] = 0.0f;
    }
};

template <> struct gq_raw<LMX_GGML_Q4_0> : gq_raw_d<4> { /* d, qs[16]: elements 0..15 low nibbles, 16..31 high */
    __device__ __forceinline__ void part(uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        uint32_t v[4];
        qs.get(v);
#pragma unroll
        for (int i = 0; i < 4; i++) q[i] = v[i] & 0x0F0F0F0Fu, q[4 + i] = (v[i] >> 4) & 0x0F0F0F0Fu;
        sc[0] = sc[1] = gq_half(d, 0), mn[0] = mn[1] = 8.0f * sc[0];
    }
};

/* Q4_K, Q5_K: d, dmin, scales[12] (6-bit scale and min of 8 sub-blocks) [, qh[32]: bit j of byte l is bit 4 of
 * element 32 j + l], qs[128]: element 64 c + 32 h + l is nibble h of qs[32 c + l] */
template <int T> struct gq_raw_k4 {
    static constexpr int QS = T == LMX_GGML_Q4_K ? 16 : 48;
    gq_run<8, 16> v;
    gq_run<T == LMX_GGML_Q5_K ? 8 : 1, 16> hb;
    gq_run<3, 4> sw;
    uint32_t dd;
    int j;
    __device__ __forceinline__ void load(const uint8_t *b, int j_, bool in) {
        j = j_;
        v.load(b + QS + 32 * (j >> 1));
        if constexpr (T == LMX_GGML_Q5_K) hb.load(b + 16);
        dd = in ? __ldg((const unsigned *)b) : 0u;
        sw.load(b + 4);
    }
    __device__ __forceinline__ void part(uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        uint32_t w[8], h[8], s[3];
        v.get(w);
        if constexpr (T == LMX_GGML_Q5_K) hb.get(h);
        sw.get(s);
        gq_k4_codes<T>(w, h, j, q);
        gq_k4_scales(s, dd, j, sc, mn);
    }
};
template <> struct gq_raw<LMX_GGML_Q4_K> : gq_raw_k4<LMX_GGML_Q4_K> {};
template <> struct gq_raw<LMX_GGML_Q5_K> : gq_raw_k4<LMX_GGML_Q5_K> {};

/* Q6_K (16-byte aligned): ql[128], qh[64], int8 scales[16], d; element 128 a + 32 i + l: low nibble (i < 2) or
 * high nibble of ql[64 a + 32 (i & 1) + l], bits 2 i.. of qh[32 a + l] above it; minus 32 */
template <> struct gq_raw<LMX_GGML_Q6_K_A16> {
    gq_run<8, 16> lo, hi;
    uint32_t s2, d;
    int j;
    __device__ __forceinline__ void load(const uint8_t *b, int j_, bool in) {
        j = j_;
        const int a = j >> 2;
        lo.load(b + 64 * a + 32 * (j & 1));
        hi.load(b + 128 + 32 * a);
        s2 = __ldg((const unsigned short *)(b + 192 + 2 * j));
        d = in ? __ldg((const unsigned short *)(b + 208)) : 0u;
    }
    __device__ __forceinline__ void part(uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        uint32_t l[8], h[8];
        lo.get(l);
        hi.get(h);
        gq_q6_part(l, h, j & 3, s2, gq_half(d, 0), q, sc, mn);
    }
};

/* Part j of the block at b (see the top of this file). */
template <int T>
static __device__ __forceinline__ void gq_part(const uint8_t *b, int j, uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) {
    if constexpr (T == LMX_GGML_Q8_0 || T == LMX_GGML_Q4_0 || T == LMX_GGML_Q4_K || T == LMX_GGML_Q5_K ||
                  T == LMX_GGML_Q6_K_A16) {
        gq_raw<T> r;
        r.load(b, j, true);
        r.part(q, sc, mn);
    } else if constexpr (T == LMX_GGML_Q4_1 || T == LMX_GGML_Q5_0 || T == LMX_GGML_Q5_1) {
        /* d [, m] [, qh: bit e is bit 4 of element e], qs[16]: elements 0..15 low nibbles, 16..31 high */
        constexpr int MIN = T == LMX_GGML_Q4_1 || T == LMX_GGML_Q5_1, FIVE = T == LMX_GGML_Q5_0 || T == LMX_GGML_Q5_1;
        constexpr int QS = 2 + 2 * MIN + 4 * FIVE;
        uint32_t v[4];
        gq_words<4, (T == LMX_GGML_Q4_1 || T == LMX_GGML_Q5_1) ? 4 : 2>(b + QS, v);
#pragma unroll
        for (int i = 0; i < 4; i++) q[i] = v[i] & 0x0F0F0F0Fu, q[4 + i] = (v[i] >> 4) & 0x0F0F0F0Fu;
        if constexpr (FIVE) {
            uint32_t h[1];
            gq_words<1, MIN ? 4 : 2>(b + 2 + 2 * MIN, h);
#pragma unroll
            for (int i = 0; i < 8; i++) q[i] |= gq_bit4(h[0] >> (4 * i));
        }
        const float d = gq_f16(b);
        sc[0] = sc[1] = d;
        mn[0] = mn[1] = MIN ? -gq_f16(b + 2) : (FIVE ? 16.0f : 8.0f) * d;
    } else if constexpr (T == LMX_GGML_Q2_K) { /* scales[16] (4-bit scale | min << 4), qs[64], d, dmin */
        const int h = j >> 2, s = j & 3;
        uint32_t v[8];
        gq_words<8, 4>(b + 16 + 32 * h, v);
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = (v[i] >> (2 * s)) & 0x03030303u;
        const uint32_t dd = __ldg((const unsigned *)(b + 80));
        const unsigned s2 = __ldg((const unsigned short *)(b + 2 * j));
        const float d = gq_half(dd, 0), dmin = gq_half(dd, 1);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const unsigned S = (s2 >> (8 * k)) & 255u;
            sc[k] = d * (float)(S & 15u), mn[k] = dmin * (float)(S >> 4);
        }
    } else if constexpr (T == LMX_GGML_Q3_K) { /* hmask[32], qs[64], scales[12] (6-bit, -32), d */
        const int h = j >> 2, s = j & 3;
        uint32_t v[8], hm[8], sw[3];
        gq_words<8, 2>(b + 32 + 32 * h, v);
        gq_words<8, 2>(b, hm);
        gq_words<3, 2>(b + 96, sw);
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = ((v[i] >> (2 * s)) & 0x03030303u) | (((hm[i] >> j) & 0x01010101u) << 2);
        const float d = gq_f16(b + 108);
#pragma unroll
        for (int k = 0; k < 2; k++) { /* codes are q3 + 4 (hmask set: q3 as is; clear: q3 - 4) */
            const int t = 2 * j + k;
            const int lo = t < 8 ? gq_byte(sw, t) & 15 : gq_byte(sw, t - 8) >> 4;
            const int hi = (gq_byte(sw, 8 + (t & 3)) >> (2 * (t >> 2))) & 3;
            const float ds = d * (float)((lo | hi << 4) - 32);
            sc[k] = ds, mn[k] = 4.0f * ds;
        }
    }
}

/* ---- units: the parts one lane decodes together ----------------------------------------------------
 * Where parts of a block share code bytes (Q4_K / Q5_K: the two nibbles of a 64-element chunk; Q6_K: the
 * low and high bits of a 128-element half), a GEMV lane takes all of them as one unit, so that every
 * byte is loaded once and the scales are read once: load(b, u) reads unit u of the block at b, part(k)
 * decodes its part k (part UP u + k of the block).  Every other type's unit is one part. */
template <int T> struct gq_unit {
    static constexpr int UP = 1;
    uint32_t q_[8];
    float sc_[2], mn_[2];
    __device__ __forceinline__ void load(const uint8_t *b, int u) { gq_part<T>(b, u, q_, sc_, mn_); }
    template <bool PAIRED = false> /* gq_unit_k4's choice; one part a unit here */
    __device__ __forceinline__ void part(int, uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
#pragma unroll
        for (int i = 0; i < 8; i++) q[i] = q_[i];
        sc[0] = sc_[0], sc[1] = sc_[1], mn[0] = mn_[0], mn[1] = mn_[1];
    }
};

template <int T> struct gq_unit_k4 { /* Q4_K, Q5_K: chunk c of 64 elements (parts 2c, 2c + 1) */
    static constexpr int UP = 2, QS = T == LMX_GGML_Q4_K ? 16 : 48;
    uint32_t v[8], hb[T == LMX_GGML_Q5_K ? 8 : 1], dd, sw[3];
    int c;
    __device__ __forceinline__ void load(const uint8_t *b, int u) {
        c = u;
        gq_words<8, 16>(b + QS + 32 * u, v);
        if constexpr (T == LMX_GGML_Q5_K) gq_words<8, 16>(b + 16, hb);
        dd = __ldg((const unsigned *)b);
        gq_words<3, 4>(b + 4, sw);
    }
    /* Q4_K's unit u of row r of a tile (LMX_GGML_Q4_K_T16, mq_tile: row r's 8 bytes of code group u for lane
     * 4 (r % 8) + t in half u % 2 of its slot 2 (r / 8) + u / 2) */
    __device__ __forceinline__ void load_tiled(const uint8_t *tile, int r, int u) {
        c = u;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const uint2 *pv =
                (const uint2 *)(tile + mq_tile<LMX_GGML_Q4_K>::slot(2 * (r / 8) + u / 2, 4 * (r % 8) + t) + 8 * (u % 2));
            const uint2 p = __ldg(pv);
            v[2 * t] = p.x, v[2 * t + 1] = p.y;
        }
        const uint4 *hv = (const uint4 *)(tile + mq_tile<LMX_GGML_Q4_K>::scales(r));
        const uint4 h = __ldg(hv);
        dd = h.x, sw[0] = h.y, sw[1] = h.z, sw[2] = h.w;
    }
    /* PAIRED: both parts' scales from one gq_k4_scale2, the same expression for k 0 and 1 (so computed once where
     * the caller takes both parts: ggemv_body without XS, e.g. the experts of batched decode); else each part's own
     * (gq_k4_scales: the launches that quantize one row of x themselves, held to few registers, ran slower paired:
     * H200, Qwen3-30B-A3B Q4_K_M one row -5%) */
    template <bool PAIRED = false>
    __device__ __forceinline__ void part(int k, uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        gq_k4_codes<T>(v, hb, 2 * c + k, q);
        if constexpr (PAIRED) {
            uint32_t s2, m2;
            gq_k4_scale2(sw, c, s2, m2);
            gq_k4_floats(dd, (int)(s2 >> 8 * k) & 255, (int)(m2 >> 8 * k) & 255, sc, mn);
        } else {
            gq_k4_scales(sw, dd, 2 * c + k, sc, mn);
        }
    }
};
template <> struct gq_unit<LMX_GGML_Q4_K> : gq_unit_k4<LMX_GGML_Q4_K> {};
template <> struct gq_unit<LMX_GGML_Q5_K> : gq_unit_k4<LMX_GGML_Q5_K> {};

template <> struct gq_unit<LMX_GGML_Q6_K_A16> { /* half a of 128 elements (parts 4a .. 4a + 3), as in gq_raw */
    static constexpr int UP = 4;
    uint32_t lo[16], hi[8], s2[2];
    float d;
    __device__ __forceinline__ void load(const uint8_t *b, int a) {
        gq_words<16, 16>(b + 64 * a, lo);
        gq_words<8, 16>(b + 128 + 32 * a, hi);
        gq_words<2, 8>(b + 192 + 8 * a, s2);
        d = gq_f16(b + 208);
    }
    /* half a of row r of a tile (LMX_GGML_Q6_K_T16, mq_tile): lane (r % 8, t)'s slot 3 (r / 8) + a holds ql words
     * 8 q1 + 4 is + t of the half as its words 2 is + q1, its slot 3 (r / 8) + 2 its qh words 4 is + t as words
     * 2 a + is; then the row's scales and d */
    __device__ __forceinline__ void load_tiled(const uint8_t *tile, int r, int a) {
        typedef mq_tile<LMX_GGML_Q6_K_A16> TL;
        const int lane0 = 4 * (r % 8), h3 = 3 * (r / 8);
#pragma unroll
        for (int t = 0; t < 4; t++) {
            const uint4 q = __ldg((const uint4 *)(tile + TL::slot(h3 + a, lane0 + t)));
            lo[t] = q.x, lo[8 + t] = q.y, lo[4 + t] = q.z, lo[12 + t] = q.w;
            const uint2 e = __ldg((const uint2 *)(tile + TL::slot(h3 + 2, lane0 + t) + 8 * a));
            hi[t] = e.x, hi[4 + t] = e.y;
        }
        const uint2 sv = __ldg((const uint2 *)(tile + TL::scales(r) + 8 * a));
        s2[0] = sv.x, s2[1] = sv.y;
        d = gq_f16(tile + TL::scales(r) + 16);
    }
    template <bool PAIRED = false> /* gq_unit_k4's choice; Q6_K's scales are one byte a part */
    __device__ __forceinline__ void part(int i4, uint32_t (&q)[8], float (&sc)[2], float (&mn)[2]) const {
        gq_q6_part(lo + 8 * (i4 & 1), hi, i4, s2[i4 >> 1] >> (16 * (i4 & 1)), d, q, sc, mn);
    }
};

/* Element e of part j: sc * q - mn.  The code becomes a float by its bits (2^23 + byte, less 2^23: a
 * permute and an add, exact) instead of an integer conversion, which runs at a quarter of the rate and
 * bounded the tensor-core GEMVs that decode every element. */
static __device__ __forceinline__ float gq_value(const uint32_t (&q)[8], const float (&sc)[2], const float (&mn)[2],
                                                 int e, int sgn) {
    const uint32_t w = q[e >> 2] ^ (sgn ? 0x80808080u : 0u); /* signed: the code + 128 */
    const float c = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (unsigned)(e & 3))) -
                    (sgn ? 8388736.0f : 8388608.0f);
    return sc[e >> 4] * c - mn[e >> 4];
}

template <int T>
static __device__ __forceinline__ float gq_elem_t(const uint8_t *b, int e) {
    uint32_t q[8];
    float sc[2], mn[2];
    gq_part<T>(b, e >> 5, q, sc, mn);
    return gq_value(q, sc, mn, e & 31, T == LMX_GGML_Q8_0);
}

/* Element e of the block at b of any supported type (slow: for embedding rows and the generic GEMV). */
static __device__ float gq_elem(int type, const uint8_t *b, int e) {
    switch (type) {
#define GQ_ELEM(t) case t: return gq_elem_t<t>(b, e);
        GQ_TYPES(GQ_ELEM)
#undef GQ_ELEM
    default: return 0.0f;
    }
}

#endif
