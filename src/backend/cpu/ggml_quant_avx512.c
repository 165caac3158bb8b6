/* ggml_quant_avx512.c - AVX-512 dot kernels for GGUF rows (decode path): Q4_0 Q4_1 Q5_0 Q5_1 Q8_0
 * Q4_K Q5_K Q6_K, and F32 / F16 / BF16.  ggml_quant.c calls lmx_ggml_dot_row_avx512 only after
 * checking the CPU; Q2_K and Q3_K stay on the portable kernel.
 *
 * x stays float32: each group of 16 quantized values widens int8 -> int32 -> float and meets x in
 * one fused multiply-add; a (sub-)block's vector sum is scaled once by its float scale.  Offsets
 * (Q4_1/Q5_1 m, Q4_K/Q5_K dmin*m) multiply the sub-block's sum of x, accumulated in a second
 * vector.  The functions carry their own target attribute, so the file builds with or without
 * per-file -mavx512* flags. */
#include "ggml_quant.h"

#if defined(LMX_HAVE_X86_SIMD)
#include <immintrin.h>
#include <string.h>

#define LMX_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))

/* F32 / F16 / BF16 rows: 32 elements a step in two accumulators, then a masked tail. */
LMX_AVX512 static inline __m512 load_w(int type, const uint8_t *p, int64_t k, __mmask16 m) {
    if (type == LMX_GGML_F32) return _mm512_maskz_loadu_ps(m, p + 4 * k);
    __m256i h = _mm256_maskz_loadu_epi16(m, p + 2 * k);
    if (type == LMX_GGML_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

LMX_AVX512 static float dot_float(int type, const uint8_t *p, const float *x, int64_t K) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        acc0 = _mm512_fmadd_ps(load_w(type, p, k, 0xffff), _mm512_loadu_ps(x + k), acc0);
        acc1 = _mm512_fmadd_ps(load_w(type, p, k + 16, 0xffff), _mm512_loadu_ps(x + k + 16), acc1);
    }
    for (; k < K; k += 16) {
        __mmask16 m = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1u);
        acc0 = _mm512_fmadd_ps(load_w(type, p, k, m), _mm512_maskz_loadu_ps(m, x + k), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}


LMX_AVX512 static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 int8 at p -> 16 floats. */
LMX_AVX512 static inline __m512 i8x16(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

LMX_AVX512 static float dot_q8_0(const uint8_t *b, const float *x, int64_t nb) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 68, x += 64) {
        __m512 s0 = _mm512_mul_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 2))), _mm512_loadu_ps(x));
        __m512 s1 = _mm512_mul_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 36))), _mm512_loadu_ps(x + 32));
        s0 = _mm512_fmadd_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 18))), _mm512_loadu_ps(x + 16), s0);
        s1 = _mm512_fmadd_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 52))), _mm512_loadu_ps(x + 48), s1);
        acc0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(h2f(b)), acc0);
        acc1 = _mm512_fmadd_ps(s1, _mm512_set1_ps(h2f(b + 34)), acc1);
    }
    if (i < nb) {
        __m512 s0 = _mm512_mul_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 2))), _mm512_loadu_ps(x));
        s0 = _mm512_fmadd_ps(i8x16(_mm_loadu_si128((const __m128i *)(b + 18))), _mm512_loadu_ps(x + 16), s0);
        acc0 = _mm512_fmadd_ps(s0, _mm512_set1_ps(h2f(b)), acc0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 (32 elements a block): 16 bytes of nibbles give elements 0..15 (low)
 * and 16..31 (high); for Q5_x bit j of the 32-bit qh adds 16 to element j.  Two blocks a step, in
 * separate accumulators. */
typedef struct {
    int bytes, qs, qh, min, bias; /* block bytes, offsets of qs / qh (-1: none) / m (-1: none) */
} blk32;

LMX_AVX512 static inline __m512 dot_blk32(const blk32 *f, const uint8_t *b, const float *x, __m512 acc,
                                          __m512 *acc_m) {
    const __m128i m4 = _mm_set1_epi8(0x0f), bias = _mm_set1_epi8((char)f->bias);
    __m128i v = _mm_loadu_si128((const __m128i *)(b + f->qs));
    __m128i lo = _mm_and_si128(v, m4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
    if (f->qh >= 0) {
        uint32_t qh;
        memcpy(&qh, b + f->qh, 4);
        const __m128i k16 = _mm_set1_epi8(16);
        lo = _mm_or_si128(lo, _mm_maskz_mov_epi8((__mmask16)(qh & 0xffffu), k16));
        hi = _mm_or_si128(hi, _mm_maskz_mov_epi8((__mmask16)(qh >> 16), k16));
    }
    lo = _mm_sub_epi8(lo, bias), hi = _mm_sub_epi8(hi, bias);
    __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    __m512 s = _mm512_fmadd_ps(i8x16(hi), x1, _mm512_mul_ps(i8x16(lo), x0));
    if (f->min >= 0) *acc_m = _mm512_fmadd_ps(_mm512_add_ps(x0, x1), _mm512_set1_ps(h2f(b + f->min)), *acc_m);
    return _mm512_fmadd_ps(s, _mm512_set1_ps(h2f(b)), acc);
}

LMX_AVX512 static float dot_q32(const blk32 *f, const uint8_t *b, const float *x, int64_t nb) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    __m512 accm0 = _mm512_setzero_ps(), accm1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= nb; i += 2, b += 2 * f->bytes, x += 64) {
        acc0 = dot_blk32(f, b, x, acc0, &accm0);
        acc1 = dot_blk32(f, b + f->bytes, x + 32, acc1, &accm1);
    }
    if (i < nb) acc0 = dot_blk32(f, b, x, acc0, &accm0);
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(accm0, accm1)));
}

static const blk32 Q4_0 = {18, 2, -1, -1, 8}, Q4_1 = {20, 4, -1, 2, 0};
static const blk32 Q5_0 = {22, 6, 2, -1, 16}, Q5_1 = {24, 8, 4, 2, 0};

/* Q4_K / Q5_K: per 32-byte chunk c of qs, low nibbles are sub-block 2c, high nibbles sub-block
 * 2c+1; for Q5_K, bit j of qh[l] adds 16 to element l of sub-block j. */
LMX_AVX512 static float dot_q45_k(const uint8_t *b, const float *x, int64_t nb, int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), k16 = _mm256_set1_epi8(16);
    const int bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    __m512 acc = _mm512_setzero_ps(), acc_m = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += bytes, x += 256) {
        float d = h2f(b), dmin = h2f(b + 2);
        const uint8_t *s = b + 4;
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * c));
            __m256i nib[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
            if (q5)
                for (int h = 0; h < 2; h++) {
                    __mmask32 hb = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * c + h))));
                    nib[h] = _mm256_mask_add_epi8(nib[h], hb, nib[h], k16);
                }
            for (int h = 0; h < 2; h++) {
                int j = 2 * c + h, sc, m;
                if (j < 4) {
                    sc = s[j] & 63, m = s[j + 4] & 63;
                } else {
                    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                const float *xs = x + 32 * j;
                __m512 x0 = _mm512_loadu_ps(xs), x1 = _mm512_loadu_ps(xs + 16);
                __m512 q0 = i8x16(_mm256_castsi256_si128(nib[h]));
                __m512 q1 = i8x16(_mm256_extracti128_si256(nib[h], 1));
                __m512 t = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
                acc = _mm512_fmadd_ps(t, _mm512_set1_ps(d * (float)sc), acc);
                acc_m = _mm512_fmadd_ps(_mm512_add_ps(x0, x1), _mm512_set1_ps(dmin * (float)m), acc_m);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_sub_ps(acc, acc_m));
}

/* Q6_K: for half a (128 elements), 16-element chunk c takes nibble c/4 of ql[64a + 16(c%4) ..] and
 * bits 2(c/2).. of qh[32a + 16(c%2) ..]; chunk c is sub-block 8a + c. */
LMX_AVX512 static float dot_q6_k(const uint8_t *b, const float *x, int64_t nb) {
    const __m128i m4 = _mm_set1_epi8(0x0f), m2 = _mm_set1_epi8(0x03), k32 = _mm_set1_epi8(32);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 210, x += 256) {
        float d = h2f(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int a = 0; a < 2; a++) {
            const uint8_t *ql = b + 64 * a, *qh = b + 128 + 32 * a;
            __m128i l[4], h[2];
            for (int c = 0; c < 4; c++) l[c] = _mm_loadu_si128((const __m128i *)(ql + 16 * c));
            for (int c = 0; c < 2; c++) h[c] = _mm_loadu_si128((const __m128i *)(qh + 16 * c));
            for (int c = 0; c < 8; c += 2) {
                __m128i q[2];
                for (int u = 0; u < 2; u++) {
                    int cc = c + u;
                    __m128i lo = cc < 4 ? _mm_and_si128(l[cc], m4)
                                        : _mm_and_si128(_mm_srli_epi16(l[cc - 4], 4), m4);
                    __m128i hb = _mm_and_si128(_mm_srl_epi16(h[cc % 2], _mm_cvtsi32_si128(2 * (cc / 2))), m2);
                    q[u] = _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hb, 4)), k32);
                }
                const float *xs = x + 128 * a + 16 * c;
                __m512 t0 = _mm512_mul_ps(i8x16(q[0]), _mm512_loadu_ps(xs));
                __m512 t1 = _mm512_mul_ps(i8x16(q[1]), _mm512_loadu_ps(xs + 16));
                acc0 = _mm512_fmadd_ps(t0, _mm512_set1_ps(d * (float)sc[8 * a + c]), acc0);
                acc1 = _mm512_fmadd_ps(t1, _mm512_set1_ps(d * (float)sc[8 * a + c + 1]), acc1);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

int lmx_ggml_dot_row_avx512(int type, const void *row, const float *x, int64_t K, float *out) {
    const uint8_t *b = (const uint8_t *)row;
    switch (type) {
    case LMX_GGML_Q8_0: *out = dot_q8_0(b, x, K / 32); return 1;
    case LMX_GGML_Q4_0: *out = dot_q32(&Q4_0, b, x, K / 32); return 1;
    case LMX_GGML_Q4_1: *out = dot_q32(&Q4_1, b, x, K / 32); return 1;
    case LMX_GGML_Q5_0: *out = dot_q32(&Q5_0, b, x, K / 32); return 1;
    case LMX_GGML_Q5_1: *out = dot_q32(&Q5_1, b, x, K / 32); return 1;
    case LMX_GGML_Q4_K: *out = dot_q45_k(b, x, K / 256, 0); return 1;
    case LMX_GGML_Q5_K: *out = dot_q45_k(b, x, K / 256, 1); return 1;
    case LMX_GGML_F32:
    case LMX_GGML_F16:
    case LMX_GGML_BF16: *out = dot_float(type, b, x, K); return 1;
    case LMX_GGML_Q6_K: *out = dot_q6_k(b, x, K / 256); return 1;
    default: return 0;
    }
}
#else
typedef int lmx_ggml_quant_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
