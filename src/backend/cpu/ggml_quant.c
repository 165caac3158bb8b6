/* ggml_quant.c - portable kernels for GGUF (ggml) block-quantized rows, and the run-time choice of
 * the AVX-512 dot kernels (ggml_quant_avx512.c).
 *
 * Written from the GGUF block layouts.  Every supported block is first unpacked into small
 * integers q[] (int8) plus, per sub-block of S elements, a float scale and a float offset, so that
 *     element i = scale[i / S] * q[i] - offset[i / S]
 * with the scale and offset computed exactly as the format defines them (e.g. Q4_K:
 * scale = d * sc, offset = dmin * m; Q4_1: scale = d, offset = -m).  Dequantization evaluates that
 * expression in float32 (no fused multiply-add: C11 mode compiles with -ffp-contract=off), which
 * is the order gguf.quants uses, so results are bit-identical to it.  The dot product does one
 * float dot of q with x per sub-block, then scales it:  sum_s scale_s * (q_s . x_s) - offset_s *
 * sum(x_s).
 *
 * Block layouts (bytes, little-endian; "f16" is an IEEE half):
 *   Q4_0  f16 d, qs[16]: element j<16 = low nibble of qs[j], j>=16 = high nibble of qs[j-16];
 *         value (nibble - 8) * d.
 *   Q4_1  f16 d, f16 m, qs[16]: value nibble * d + m.
 *   Q5_0  f16 d, u32 qh, qs[16]: nibble as Q4_0, bit j of qh is bit 4 of element j; value (q-16)*d.
 *   Q5_1  f16 d, f16 m, u32 qh, qs[16]: value q * d + m.
 *   Q8_0  f16 d, int8 qs[32]: value q * d.
 *   Q2_K  scales[16] (low nibble scale, high nibble min), qs[64], f16 d, f16 dmin; element
 *         e = 128h + 32s + l is bits 2s..2s+1 of qs[32h + l]; value d*sc*q - dmin*m per 16.
 *   Q3_K  hmask[32], qs[64], scales[12], f16 d; low 2 bits as Q2_K, bit 2 is bit (e/32) of
 *         hmask[e%32] and subtracts 4 when clear; 16 six-bit scales (minus 32) per 16 elements.
 *   Q4_K  f16 d, f16 dmin, scales[12] (8 six-bit scales + 8 six-bit mins), qs[128]; element
 *         e = 64c + 32h + l is nibble h of qs[32c + l]; value d*sc*q - dmin*m per 32.
 *   Q5_K  f16 d, f16 dmin, scales[12], qh[32], qs[128]; bit 4 of element e is bit e/32 of qh[e%32].
 *   Q6_K  ql[128], qh[64], int8 scales[16], f16 d; element e = 128a + r: low 4 bits are nibble r/64
 *         of ql[64a + r%64], bits 4-5 are bits 2(r/32).. of qh[32a + r%32]; value d*sc*(q-32).
 *
 * Rows of an unknown type, or whose K is not a multiple of the block size, dequantize to zeros
 * and dot to 0. */
#include "ggml_quant.h"

#include <string.h>

#include "../../base/half.h"

/* ---- block geometry (from the format's type table) ------------------------------------------ */
typedef struct {
    int elems, bytes, sub; /* sub: elements per scale (0 for float types / not computed) */
} type_info;

/* Fill *t for type; returns t, or NULL for an unknown type. */
static const type_info *find_type(int type, type_info *t) {
    t->elems = lmx_ggml_block_elems(type);
    t->bytes = lmx_ggml_block_bytes(type);
    t->sub = lmx_ggml_scale_elems(type);
    return t->elems ? t : NULL;
}

/* ---- unpacking one block ---------------------------------------------------------------------- */
/* IEEE half -> float, exact and branch-free: the 15 magnitude bits moved to float position give a
 * float 2^-112 times the value (subnormal halves become normal floats), fixed by one exact
 * multiply; infinities and NaNs keep an all-ones exponent. */
static inline float f16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)(h & 0x7fffu) << 13;
    float f, scale = 0x1p112f;
    memcpy(&f, &u, 4);
    f *= scale;
    memcpy(&u, &f, 4);
    if ((h & 0x7c00u) == 0x7c00u) u = 0x7f800000u | (uint32_t)(h & 0x3ffu) << 13;
    u |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &u, 4);
    return f;
}

static inline float rd_f16(const uint8_t *p) {
    return f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Element k of an F32 / F16 / BF16 row. */
static inline float float_elem(int type, const uint8_t *p, int64_t k) {
    if (type == LMX_GGML_F32) {
        float f;
        memcpy(&f, p + 4 * k, 4);
        return f;
    }
    uint16_t h = (uint16_t)(p[2 * k] | (p[2 * k + 1] << 8));
    return type == LMX_GGML_F16 ? f16_to_f32(h) : lmx_bf16_to_f32(h);
}

/* 32 four-bit values: low nibbles are elements 0..15, high nibbles 16..31. */
static inline void nibbles32(const uint8_t *qs, int8_t *q, int bias) {
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 15) - bias);
        q[j + 16] = (int8_t)((qs[j] >> 4) - bias);
    }
}

/* Bit 4 of element j is bit j of qh. */
static inline void add_high_bits32(uint32_t qh, int8_t *q, int bias) {
    uint8_t hb[32];
    for (int j = 0; j < 32; j++) hb[j] = (uint8_t)(((qh >> j) & 1u) << 4);
    for (int j = 0; j < 32; j++) q[j] = (int8_t)(q[j] + hb[j] - bias);
}

/* 2-bit fields: element 128h + 32s + l is bits 2s..2s+1 of qs[32h + l] (Q2_K, Q3_K). */
static inline void crumbs256(const uint8_t *qs, int8_t *q) {
    for (int h = 0; h < 2; h++)
        for (int s = 0; s < 4; s++)
            for (int l = 0; l < 32; l++) q[128 * h + 32 * s + l] = (int8_t)((qs[32 * h + l] >> (2 * s)) & 3);
}

/* Q4_K / Q5_K nibbles: element 64c + 32h + l is nibble h of qs[32c + l]. */
static inline void nibbles256(const uint8_t *qs, int8_t *q) {
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            q[64 * c + l] = (int8_t)(qs[32 * c + l] & 15);
            q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
}

/* Unpacks block b of `type` into q[] (elems values) and per-sub-block scale[] / off[].  Returns 0
 * for types without a block kernel. */
static int unpack_block(int type, const uint8_t *b, int8_t *q, float *scale, float *off) {
    switch (type) {
    case LMX_GGML_Q4_0:
        scale[0] = rd_f16(b), off[0] = 0.0f;
        nibbles32(b + 2, q, 8);
        return 1;
    case LMX_GGML_Q4_1:
        scale[0] = rd_f16(b), off[0] = -rd_f16(b + 2);
        nibbles32(b + 4, q, 0);
        return 1;
    case LMX_GGML_Q5_0:
        scale[0] = rd_f16(b), off[0] = 0.0f;
        nibbles32(b + 6, q, 0);
        add_high_bits32(rd_u32(b + 2), q, 16);
        return 1;
    case LMX_GGML_Q5_1:
        scale[0] = rd_f16(b), off[0] = -rd_f16(b + 2);
        nibbles32(b + 8, q, 0);
        add_high_bits32(rd_u32(b + 4), q, 0);
        return 1;
    case LMX_GGML_Q8_0:
        scale[0] = rd_f16(b), off[0] = 0.0f;
        memcpy(q, b + 2, 32);
        return 1;
    case LMX_GGML_Q2_K: {
        const uint8_t *sc = b, *qs = b + 16;
        float d = rd_f16(b + 80), dmin = rd_f16(b + 82);
        for (int s = 0; s < 16; s++) {
            scale[s] = d * (float)(sc[s] & 15);
            off[s] = dmin * (float)(sc[s] >> 4);
        }
        crumbs256(qs, q);
        return 1;
    }
    case LMX_GGML_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
        float d = rd_f16(b + 108);
        for (int s = 0; s < 16; s++) {
            int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4;
            int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
            scale[s] = d * (float)((lo | hi << 4) - 32);
            off[s] = 0.0f;
        }
        crumbs256(qs, q);
        for (int i = 0; i < 8; i++) /* bit i of hmask[l] is bit 2 of element 32i + l; clear: -4 */
            for (int l = 0; l < 32; l++) q[32 * i + l] = (int8_t)(q[32 * i + l] - 4 + (((hm[l] >> i) & 1) << 2));
        return 1;
    }
    case LMX_GGML_Q4_K:
    case LMX_GGML_Q5_K: {
        float d = rd_f16(b), dmin = rd_f16(b + 2);
        for (int s = 0; s < 8; s++) {
            int sc, m;
            lmx_ggml_k4_scale_min(b + 4, s, &sc, &m);
            scale[s] = d * (float)sc;
            off[s] = dmin * (float)m;
        }
        const uint8_t *qh = b + 16, *qs = type == LMX_GGML_Q4_K ? b + 16 : b + 48;
        nibbles256(qs, q);
        if (type == LMX_GGML_Q5_K) /* bit i of qh[l] is bit 4 of element 32i + l */
            for (int i = 0; i < 8; i++)
                for (int l = 0; l < 32; l++) q[32 * i + l] = (int8_t)(q[32 * i + l] | (((qh[l] >> i) & 1) << 4));
        return 1;
    }
    case LMX_GGML_Q6_K: {
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = rd_f16(b + 208);
        for (int s = 0; s < 16; s++) scale[s] = d * (float)sc[s], off[s] = 0.0f;
        for (int a = 0; a < 2; a++, ql += 64, qh += 32, q += 128)
            for (int l = 0; l < 32; l++) { /* element 128a + 32i + l, i = 0..3 */
                q[l] = (int8_t)(((ql[l] & 15) | (qh[l] & 3) << 4) - 32);
                q[l + 32] = (int8_t)(((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4) - 32);
                q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
                q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
            }
        return 1;
    }
    default: return 0;
    }
}

/* ---- dequantization --------------------------------------------------------------------------- */
void lmx_ggml_dequant_row_portable(int type, const void *row, int64_t K, float *dst) {
    type_info ti;
    const type_info *t = find_type(type, &ti);
    const uint8_t *p = (const uint8_t *)row;
    if (K <= 0) return;
    if (!t || K % t->elems || (t->sub == 0 && t->elems != 1)) {
        memset(dst, 0, (size_t)K * sizeof *dst);
        return;
    }
    if (type == LMX_GGML_F32) {
        memcpy(dst, row, (size_t)K * sizeof *dst);
        return;
    }
    if (type == LMX_GGML_F16 || type == LMX_GGML_BF16) {
        for (int64_t k = 0; k < K; k++) dst[k] = float_elem(type, p, k);
        return;
    }
    int8_t q[256];
    float scale[16], off[16];
    for (int64_t i = 0; i < K / t->elems; i++, p += t->bytes, dst += t->elems) {
        unpack_block(type, p, q, scale, off);
        for (int e = 0; e < t->elems; e++) dst[e] = scale[e / t->sub] * (float)q[e] - off[e / t->sub];
    }
}

/* ---- dot products ----------------------------------------------------------------------------- */
/* n a multiple of 8; eight partial sums, added pairwise. */
static inline float dot_q(const int8_t *q, const float *x, int n) {
    float s[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += (float)q[i + l] * x[i + l];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static inline float sum_x(const float *x, int n) {
    float s[8] = {0};
    for (int i = 0; i < n; i += 8)
        for (int l = 0; l < 8; l++) s[l] += x[i + l];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
}

static float dot_float_row(int type, const uint8_t *p, const float *x, int64_t K) {
    float s[8] = {0}, w[8], tail = 0.0f;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        switch (type) { /* one loop per type, so each vectorizes */
        case LMX_GGML_F32: for (int l = 0; l < 8; l++) w[l] = float_elem(LMX_GGML_F32, p, k + l); break;
        case LMX_GGML_F16: for (int l = 0; l < 8; l++) w[l] = float_elem(LMX_GGML_F16, p, k + l); break;
        default: for (int l = 0; l < 8; l++) w[l] = float_elem(LMX_GGML_BF16, p, k + l); break;
        }
        for (int l = 0; l < 8; l++) s[l] += w[l] * x[k + l];
    }
    for (; k < K; k++) tail += float_elem(type, p, k) * x[k];
    return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + tail;
}

/* The portable dot; lmx_ggml_dot_row uses it where no SIMD kernel applies.  Not in the header:
 * tests call it to check the SIMD kernels against it. */

float lmx_ggml_dot_row_portable(int type, const void *row, const float *x, int64_t K) {
    type_info ti;
    const type_info *t = find_type(type, &ti);
    const uint8_t *p = (const uint8_t *)row;
    if (!t || K <= 0 || K % t->elems) return 0.0f;
    if (t->elems == 1) return dot_float_row(type, p, x, K);
    if (t->sub == 0) return 0.0f;
    int8_t q[256];
    float scale[16], off[16];
    float acc = 0.0f, acc_off = 0.0f;
    int has_off = type == LMX_GGML_Q4_1 || type == LMX_GGML_Q5_1 || type == LMX_GGML_Q2_K ||
                  type == LMX_GGML_Q4_K || type == LMX_GGML_Q5_K;
    for (int64_t i = 0; i < K / t->elems; i++, p += t->bytes, x += t->elems) {
        unpack_block(type, p, q, scale, off);
        float blk = 0.0f, blk_off = 0.0f;
        for (int s = 0; s < t->elems / t->sub; s++) {
            blk += scale[s] * dot_q(q + s * t->sub, x + s * t->sub, t->sub);
            if (has_off) blk_off += off[s] * sum_x(x + s * t->sub, t->sub);
        }
        acc += blk;
        acc_off += blk_off;
    }
    return acc - acc_off;
}

/* ---- dispatch --------------------------------------------------------------------------------- */
int lmx_ggml_simd_best(void) {
#if defined(LMX_HAVE_X86_SIMD)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma")))
        return LMX_GGML_PORTABLE;
    return __builtin_cpu_supports("avx512vnni") ? LMX_GGML_VNNI : LMX_GGML_AVX512;
#else
    return LMX_GGML_PORTABLE;
#endif
}

/* The caller's level, never above this CPU's (a level is a promise about instructions, not a request). */
static int simd_at(int simd) {
    int best = lmx_ggml_simd_best();
    return simd < best ? simd : best;
}

void lmx_ggml_dequant_row(int simd, int type, const void *row, int64_t K, float *dst) {
#if defined(LMX_HAVE_X86_SIMD)
    if (K > 0 && lmx_ggml_is_supported_quant(type) && lmx_ggml_row_bytes(type, K) && simd_at(simd) >= LMX_GGML_AVX512 &&
        lmx_ggml_dequant_row_avx512(type, row, K, dst))
        return;
#else
    (void)simd;
#endif
    lmx_ggml_dequant_row_portable(type, row, K, dst);
}

float lmx_ggml_dot_row(int simd, int type, const void *row, const float *x, int64_t K) {
#if defined(LMX_HAVE_X86_SIMD)
    float r;
    if (K > 0 && lmx_ggml_row_bytes(type, K) && simd_at(simd) >= LMX_GGML_AVX512 &&
        lmx_ggml_dot_row_avx512(type, row, x, K, &r))
        return r;
#else
    (void)simd;
#endif
    return lmx_ggml_dot_row_portable(type, row, x, K);
}

int lmx_ggml_xq_takes(int simd, int type, int64_t K) {
#if defined(LMX_HAVE_X86_SIMD)
    return lmx_ggml_xq_type(type) && K > 0 && K % 256 == 0 && simd_at(simd) >= LMX_GGML_VNNI;
#else
    (void)simd, (void)type, (void)K;
    return 0;
#endif
}

#if defined(LMX_HAVE_X86_SIMD)
void lmx_ggml_xq_prepare(int type, const float *x, int64_t K, void *xq) { lmx_ggml_xq_prepare_vnni(type, x, K, xq); }
void lmx_ggml_matvec_xq(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const void *xq, float *y) {
    lmx_ggml_matvec_xq_vnni(type, w, K, n0, n1, xq, y);
}
#else /* lmx_ggml_xq_takes is 0: never called */
void lmx_ggml_xq_prepare(int type, const float *x, int64_t K, void *xq) { (void)type, (void)x, (void)K, (void)xq; }
void lmx_ggml_matvec_xq(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const void *xq, float *y) {
    (void)type, (void)w, (void)K, (void)n0, (void)n1, (void)xq, (void)y;
}
#endif

void lmx_ggml_matvec(int simd, int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y) {
    size_t rb = lmx_ggml_row_bytes(type, K);
#if defined(LMX_HAVE_X86_SIMD)
    simd = simd_at(simd);
    if (K > 0 && rb && simd >= LMX_GGML_AVX512) {
        if (simd >= LMX_GGML_VNNI && lmx_ggml_matvec_vnni(type, w, K, n0, n1, x, y)) return;
        if (lmx_ggml_matvec_avx512(type, w, K, n0, n1, x, y)) return;
    }
#else
    (void)simd;
#endif
    for (int64_t n = n0; n < n1; n++)
        y[n - n0] = lmx_ggml_dot_row_portable(type, (const char *)w + (size_t)n * rb, x, K);
}
