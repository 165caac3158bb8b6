/* ggml_quant_avx512.c - AVX-512 kernels for GGUF rows: dot products (decode: lmx_ggml_matvec_avx512,
 * every block type and F32 / F16 / BF16) and dequantization (prefill: lmx_ggml_dequant_row_avx512,
 * every block type, bit-identical to the portable code).  ggml_quant.c calls them only after
 * checking the CPU.  The functions carry their own target attribute, so the file builds with or
 * without per-file -mavx512* flags. */
#include "ggml_quant.h"

#if defined(LMX_HAVE_X86_SIMD)
#include <immintrin.h>
#include <stdlib.h>
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


/* ---- dequantization (prefill): every value is scale * q - offset in float32, multiply then
 * subtract (no fused multiply-add), as the portable lmx_ggml_dequant_row computes it, so the result
 * is bit-identical to it.  Offsets of 0 are skipped (x - 0 == x); Q4_1 / Q5_1 add m, which equals
 * subtracting -m exactly. ----------------------------------------------------------------------- */

/* dst[0..15] = scale * float(q[0..15]) - off */
LMX_AVX512 static inline void emit16(float *dst, __m128i q, float scale, float off) {
    __m512 v = _mm512_mul_ps(_mm512_set1_ps(scale), i8x16(q));
    _mm512_storeu_ps(dst, _mm512_sub_ps(v, _mm512_set1_ps(off)));
}

/* Two chunks of 16 (at dst and dst + cs) from 32 int8 with one scale / offset per 16. */
LMX_AVX512 static inline void emit32(float *dst, int64_t cs, __m256i q, const float *sc, const float *off) {
    emit16(dst, _mm256_castsi256_si128(q), sc[0], off[0]);
    emit16(dst + cs, _mm256_extracti128_si256(q, 1), sc[1], off[1]);
}

/* Q2_K / Q3_K: 2-bit field chunk i (32 elements, i = 4h + s) is bits 2s.. of qs[32h ..]; Q3_K adds
 * bit i of hmask[l] as bit 2 and subtracts 4. */
LMX_AVX512 static void dequant_q23_k(const uint8_t *b, int64_t nb, float *dst, int64_t cs, int q3) {
    const __m256i m3 = _mm256_set1_epi8(3), k4 = _mm256_set1_epi8(4);
    const int bytes = q3 ? 110 : 84;
    for (int64_t i = 0; i < nb; i++, b += bytes, dst += 16 * cs) {
        float sc[16], off[16];
        const uint8_t *qs = q3 ? b + 32 : b + 16;
        if (q3) {
            const uint8_t *s = b + 96;
            float d = h2f(b + 108);
            for (int j = 0; j < 16; j++) {
                int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
                int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                sc[j] = d * (float)((lo | hi << 4) - 32);
                off[j] = 0.0f;
            }
        } else {
            float d = h2f(b + 80), dmin = h2f(b + 82);
            for (int j = 0; j < 16; j++) sc[j] = d * (float)(b[j] & 15), off[j] = dmin * (float)(b[j] >> 4);
        }
        __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                int c = 4 * h + s;
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3);
                if (q3) {
                    __mmask32 set = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << c)));
                    q = _mm256_mask_sub_epi8(q, (__mmask32)~set, q, k4);
                }
                emit32(dst + 2 * c * cs, cs, q, sc + 2 * c, off + 2 * c);
            }
        }
    }
}

/* The 12-byte scales field of a Q4_K / Q5_K block at s, unpacked: sub-block j's 6-bit scale in byte j of *sc, its
 * min in byte j of *mn (lmx_ggml_k4_scale_min for all eight at once) */
LMX_AVX512 static inline void q45k_scales(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t u[3]; /* scales 0-3 and mins 0-3 in the low 6 bits of u[0] and u[1]'s bytes; 4-7 in u[2] and their top bits */
    memcpy(u, s, 12);
    *sc = (u[0] & 0x3f3f3f3fu) | (uint64_t)((u[2] & 0x0f0f0f0fu) | ((u[0] >> 2) & 0x30303030u)) << 32;
    *mn = (u[1] & 0x3f3f3f3fu) | (uint64_t)(((u[2] >> 4) & 0x0f0f0f0fu) | ((u[1] >> 2) & 0x30303030u)) << 32;
}

/* Eight bytes as floats */
LMX_AVX512 static inline __m256 bytes8_ps(uint64_t v) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)v)));
}

/* The sum of v's eight floats */
LMX_AVX512 static inline float hsum256(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)));
}

LMX_AVX512 static void dequant_q45_k(const uint8_t *b, int64_t nb, float *dst, int64_t cs, int q5) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), k16 = _mm256_set1_epi8(16);
    const int bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    for (int64_t i = 0; i < nb; i++, b += bytes, dst += 16 * cs) {
        float d = h2f(b), dmin = h2f(b + 2);
        uint64_t scs, mns;
        q45k_scales(b + 4, &scs, &mns);
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * c));
            __m256i nib[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h, sc = (int)(scs >> 8 * j & 0xff), m = (int)(mns >> 8 * j & 0xff);
                if (q5) {
                    __mmask32 hb = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << j)));
                    nib[h] = _mm256_mask_add_epi8(nib[h], hb, nib[h], k16);
                }
                float scale[2] = {d * (float)sc, d * (float)sc}, off[2] = {dmin * (float)m, dmin * (float)m};
                emit32(dst + 2 * j * cs, cs, nib[h], scale, off);
            }
        }
    }
}

LMX_AVX512 static void dequant_q6_k(const uint8_t *b, int64_t nb, float *dst, int64_t cs) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    for (int64_t i = 0; i < nb; i++, b += 210, dst += 16 * cs) {
        float d = h2f(b + 208), sc[16], off[16] = {0};
        for (int j = 0; j < 16; j++) sc[j] = d * (float)(int8_t)b[192 + j];
        for (int a = 0; a < 2; a++) {
            __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * a));
            __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * a + 32));
            __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * a));
            __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                             _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                             _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
            for (int c = 0; c < 4; c++) { /* elements 128a + 32c + l */
                __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 2 * c), m3);
                __m256i q = _mm256_sub_epi8(_mm256_or_si256(lo[c], _mm256_slli_epi16(hb, 4)), k32);
                int s = 8 * a + 2 * c;
                emit32(dst + (8 * a + 2 * c) * cs, cs, q, sc + s, off + s);
            }
        }
    }
}

/* ---- dot products (decode) -------------------------------------------------------------------
 * x stays float32.  Weights become floats exactly: 4- and 5-bit codes through a 16- or 32-entry
 * table (vpermps / vpermt2ps use only the low index bits, so the nibbles need no masking), 2-, 3-,
 * 6- and 8-bit codes through int8 -> int32 -> float.  The f16 scales of 16 consecutive blocks are
 * converted at once into a float array, so each block's scale is one FMA with a broadcast memory
 * operand.  Offsets (Q4_1 / Q5_1 m, Q2_K / Q4_K / Q5_K dmin * m) multiply per-(sub-)block sums of x
 * that matvec computes once for all the rows it is given, instead of once per block and row. */
#define AI static inline __attribute__((always_inline))
#define XS_MAX 2048 /* (sub-)block sums of x kept on the stack: K up to 65536 (32768 for Q2_K) */
/* software prefetch distance in the weight stream (bytes): +15-25% from DRAM at 2 KB; 4 KB, both cores streaming on
 * the 2-core EPYC: Llama-3.1-8B Q4_K_M decode 7.8-8.4 -> 8.5-9.2 tok/s (llama.cpp 8.8-9.3 beside it), Qwen3-0.6B
 * Q4_K_M 95-98 -> 99-101; 3 KB between, 6 and 8 KB no better */
#define PF_AHEAD 4096

/* Prefetch the lines of [p, p + bytes) at PF_AHEAD bytes ahead. */
LMX_AVX512 AI void prefetch_ahead(const uint8_t *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + PF_AHEAD + o, _MM_HINT_T0);
}

/* out[j] = sum of x[S j .. S j + S) for j < n (S = 16 or 32). */
LMX_AVX512 static void x_sums(const float *x, int64_t n, int S, float *out) {
    for (int64_t j = 0; j < n; j++, x += S) {
        __m512 s = _mm512_loadu_ps(x);
        if (S == 32) s = _mm512_add_ps(s, _mm512_loadu_ps(x + 16));
        out[j] = _mm512_reduce_add_ps(s);
    }
}

LMX_AVX512 AI __m512 iota16(float from) {
    return _mm512_add_ps(_mm512_set1_ps(from),
                         _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* The 32-bit words at the start of n (<= 16) blocks of `bytes` bytes (0 past n): a gather. */
LMX_AVX512 AI __m512i words16(const uint8_t *b, int n, int bytes) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(bytes));
    __mmask16 m = (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u);
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, b, 1);
}

/* The low (hi = 0) or high f16 of each 32-bit word, as floats. */
LMX_AVX512 AI __m512 halves(__m512i w, int hi) {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(hi ? _mm512_srli_epi32(w, 16) : w));
}

/* Q4_0 Q4_1 Q5_0 Q5_1 Q8_0: the 32 codes of one block as exact floats (q - bias), elements 0..15
 * in *wl and 16..31 in *wh; t0 / t1 hold the 32 possible values of a 4- / 5-bit code. */
LMX_AVX512 AI void blk32_vals(int type, const uint8_t *b, __m512 t0, __m512 t1, __m512 *wl, __m512 *wh) {
    if (type == LMX_GGML_Q8_0) {
        *wl = i8x16(_mm_loadu_si128((const __m128i *)(b + 2)));
        *wh = i8x16(_mm_loadu_si128((const __m128i *)(b + 18)));
        return;
    }
    const int qs = type == LMX_GGML_Q4_0 ? 2 : type == LMX_GGML_Q4_1 ? 4 : type == LMX_GGML_Q5_0 ? 6 : 8;
    __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + qs)));
    __m512i lo = z, hi = _mm512_srli_epi32(z, 4);
    if (type == LMX_GGML_Q5_0 || type == LMX_GGML_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + (type == LMX_GGML_Q5_0 ? 2 : 4), 4);
        const __m512i k16 = _mm512_set1_epi32(16);
        lo = _mm512_and_si512(lo, _mm512_set1_epi32(15));
        lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffffu), lo, k16);
        hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, k16);
        *wl = _mm512_permutex2var_ps(t0, lo, t1), *wh = _mm512_permutex2var_ps(t0, hi, t1);
    } else {
        *wl = _mm512_permutexvar_ps(lo, t0), *wh = _mm512_permutexvar_ps(hi, t0);
    }
}

LMX_AVX512 AI __m512 blk32_dot(int type, const uint8_t *b, const float *x, __m512 t0, __m512 t1) {
    __m512 wl, wh;
    blk32_vals(type, b, t0, t1, &wl, &wh);
    return _mm512_fmadd_ps(wh, _mm512_loadu_ps(x + 16), _mm512_mul_ps(wl, _mm512_loadu_ps(x)));
}

/* The value tables of blk32_vals: codes 0..31 minus the type's bias. */
LMX_AVX512 AI void blk32_tables(int type, __m512 *t0, __m512 *t1) {
    const float bias = type == LMX_GGML_Q4_0 ? -8.0f : type == LMX_GGML_Q5_0 ? -16.0f : 0.0f;
    *t0 = iota16(bias), *t1 = iota16(bias + 16.0f);
}

/* value = d * code (+ m for Q4_1 / Q5_1): multiply, then add (= subtract -m), as the portable code */
LMX_AVX512 AI void dequant_b32(int type, const uint8_t *b, int64_t nb, float *dst, int64_t cs) {
    const int bytes = type == LMX_GGML_Q8_0 ? 34 : type == LMX_GGML_Q4_0 ? 18 : type == LMX_GGML_Q4_1 ? 20
                      : type == LMX_GGML_Q5_0 ? 22 : 24;
    const int has_min = type == LMX_GGML_Q4_1 || type == LMX_GGML_Q5_1;
    __m512 t0, t1;
    blk32_tables(type, &t0, &t1);
    for (int64_t i = 0; i < nb; i++, b += bytes, dst += 2 * cs) {
        __m512 wl, wh;
        blk32_vals(type, b, t0, t1, &wl, &wh);
        const __m512 d = _mm512_set1_ps(h2f(b));
        __m512 a = _mm512_mul_ps(d, wl), c = _mm512_mul_ps(d, wh);
        if (has_min) {
            const __m512 m = _mm512_set1_ps(h2f(b + 2));
            a = _mm512_add_ps(a, m), c = _mm512_add_ps(c, m);
        }
        _mm512_storeu_ps(dst, a);
        _mm512_storeu_ps(dst + cs, c);
    }
}

LMX_AVX512 AI float dot_b32(int type, const uint8_t *b, int64_t nb, const float *x, const float *xs) {
    const int bytes = type == LMX_GGML_Q8_0 ? 34 : type == LMX_GGML_Q4_0 ? 18 : type == LMX_GGML_Q4_1 ? 20
                      : type == LMX_GGML_Q5_0 ? 22 : 24;
    const int has_min = type == LMX_GGML_Q4_1 || type == LMX_GGML_Q5_1;
    __m512 t0, t1;
    blk32_tables(type, &t0, &t1);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, accm = acc0;
    float d[16];
    for (int64_t i0 = 0; i0 < nb; i0 += 16) {
        int n = nb - i0 < 16 ? (int)(nb - i0) : 16;
        const __m512i dm = words16(b, n, bytes); /* d, and m for Q4_1 / Q5_1 */
        _mm512_storeu_ps(d, halves(dm, 0));
        if (has_min) {
            __mmask16 m = (__mmask16)(n == 16 ? 0xffffu : (1u << n) - 1u);
            accm = _mm512_fmadd_ps(halves(dm, 1), _mm512_maskz_loadu_ps(m, xs + i0), accm);
        }
        int j = 0;
        for (; j + 2 <= n; j += 2, b += 2 * bytes, x += 64) {
            _mm_prefetch((const char *)b + PF_AHEAD, _MM_HINT_T0); /* 2 blocks <= 68 bytes */
            acc0 = _mm512_fmadd_ps(blk32_dot(type, b, x, t0, t1), _mm512_set1_ps(d[j]), acc0);
            acc1 = _mm512_fmadd_ps(blk32_dot(type, b + bytes, x + 32, t0, t1), _mm512_set1_ps(d[j + 1]), acc1);
        }
        if (j < n) {
            acc0 = _mm512_fmadd_ps(blk32_dot(type, b, x, t0, t1), _mm512_set1_ps(d[j]), acc0);
            b += bytes, x += 32;
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), accm));
}

/* Q4_K / Q5_K: sub-block j = 2c + h is nibble h of qs[32c ..]; Q5_K: bit j of qh[l] adds 16. */
LMX_AVX512 AI float dot_q45k(int q5, const uint8_t *b, int64_t nb, const float *x, const float *xs) {
    const int bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    const __m512 t0 = iota16(0.0f), t1 = iota16(16.0f);
    const __m512i m15 = _mm512_set1_epi32(15), k16 = _mm512_set1_epi32(16);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += bytes, x += 256, xs += 8) {
        prefetch_ahead(b, bytes);
        const float d = h2f(b), dmin = h2f(b + 2);
        uint64_t scs, mns;
        q45k_scales(b + 4, &scs, &mns);
        float sc[8]; /* d s6 */
        _mm256_storeu_ps(sc, _mm256_mul_ps(_mm256_set1_ps(d), bytes8_ps(scs)));
        accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), bytes8_ps(mns)), _mm256_loadu_ps(xs), accm);
        __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * c));
            __m512i z0 = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(v));
            __m512i z1 = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(v, 1));
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                __m512i i0 = h ? _mm512_srli_epi32(z0, 4) : z0, i1 = h ? _mm512_srli_epi32(z1, 4) : z1;
                __m512 w0, w1;
                if (q5) {
                    __mmask32 hb = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << j)));
                    if (!h) i0 = _mm512_and_si512(i0, m15), i1 = _mm512_and_si512(i1, m15);
                    i0 = _mm512_mask_or_epi32(i0, (__mmask16)hb, i0, k16);
                    i1 = _mm512_mask_or_epi32(i1, (__mmask16)(hb >> 16), i1, k16);
                    w0 = _mm512_permutex2var_ps(t0, i0, t1), w1 = _mm512_permutex2var_ps(t0, i1, t1);
                } else {
                    w0 = _mm512_permutexvar_ps(i0, t0), w1 = _mm512_permutexvar_ps(i1, t0);
                }
                const float *xj = x + 32 * j;
                __m512 t = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xj + 16), _mm512_mul_ps(w0, _mm512_loadu_ps(xj)));
                if (h) acc1 = _mm512_fmadd_ps(t, _mm512_set1_ps(sc[j]), acc1);
                else acc0 = _mm512_fmadd_ps(t, _mm512_set1_ps(sc[j]), acc0);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) - hsum256(accm);
}

/* 32 int8 codes times x[0..31] with one scale per 16: acc += sc[0] * (q[0..15] . x[0..15]) + ... */
LMX_AVX512 AI void q32_acc(__m256i q, const float *x, const float *sc, __m512 *acc0, __m512 *acc1) {
    __m512 a = _mm512_mul_ps(i8x16(_mm256_castsi256_si128(q)), _mm512_loadu_ps(x));
    __m512 c = _mm512_mul_ps(i8x16(_mm256_extracti128_si256(q, 1)), _mm512_loadu_ps(x + 16));
    *acc0 = _mm512_fmadd_ps(a, _mm512_set1_ps(sc[0]), *acc0);
    *acc1 = _mm512_fmadd_ps(c, _mm512_set1_ps(sc[1]), *acc1);
}

/* Half a (128 elements) of a Q6_K block: the codes (low nibbles ql, high bits qh) less 32, as four quarters of 32
 * signed bytes, q[c] elements 128a + 32c .. + 31 */
LMX_AVX512 AI void q6k_half(const uint8_t *b, int a, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
    const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * a));
    const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * a + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * a));
    const __m256i lo[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                           _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
    for (int c = 0; c < 4; c++) {
        const __m256i hb = _mm256_and_si256(_mm256_srli_epi16(h, 2 * c), m3);
        q[c] = _mm256_sub_epi8(_mm256_or_si256(lo[c], _mm256_slli_epi16(hb, 4)), k32);
    }
}

LMX_AVX512 static float dot_q6k(const uint8_t *b, int64_t nb, const float *x) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int64_t i = 0; i < nb; i++, b += 210, x += 256) {
        prefetch_ahead(b, 210);
        float d = h2f(b + 208), sc[16];
        for (int j = 0; j < 16; j++) sc[j] = d * (float)(int8_t)b[192 + j];
        for (int a = 0; a < 2; a++) {
            __m256i q[4];
            q6k_half(b, a, q);
            for (int c = 0; c < 4; c++) q32_acc(q[c], x + 128 * a + 32 * c, sc + 8 * a + 2 * c, &acc0, &acc1);
        }
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

/* Q2_K / Q3_K (see dequant_q23_k); Q2_K offsets dmin * m per 16 use the 16-sums xs. */
LMX_AVX512 AI float dot_q23k(int q3, const uint8_t *b, int64_t nb, const float *x, const float *xs) {
    const __m256i m3 = _mm256_set1_epi8(3), k4 = _mm256_set1_epi8(4);
    const int bytes = q3 ? 110 : 84;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, accm = acc0;
    for (int64_t i = 0; i < nb; i++, b += bytes, x += 256) {
        prefetch_ahead(b, bytes);
        float sc[16];
        const uint8_t *qs = q3 ? b + 32 : b + 16;
        if (q3) {
            const uint8_t *s = b + 96;
            float d = h2f(b + 108);
            for (int j = 0; j < 16; j++) {
                int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
                int hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                sc[j] = d * (float)((lo | hi << 4) - 32);
            }
        } else {
            float d = h2f(b + 80), dmin = h2f(b + 82), mn[16];
            for (int j = 0; j < 16; j++) sc[j] = d * (float)(b[j] & 15), mn[j] = (float)(b[j] >> 4);
            accm = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dmin), _mm512_loadu_ps(mn)),
                                   _mm512_loadu_ps(xs + 16 * i), accm);
        }
        __m256i hm = q3 ? _mm256_loadu_si256((const __m256i *)b) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * h));
            for (int s = 0; s < 4; s++) {
                int c = 4 * h + s;
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(v, 2 * s), m3);
                if (q3) {
                    __mmask32 set = _mm256_test_epi8_mask(hm, _mm256_set1_epi8((char)(1 << c)));
                    q = _mm256_mask_sub_epi8(q, (__mmask32)~set, q, k4);
                }
                q32_acc(q, x + 32 * c, sc + 2 * c, &acc0, &acc1);
            }
        }
    }
    return _mm512_reduce_add_ps(_mm512_sub_ps(_mm512_add_ps(acc0, acc1), accm));
}

/* ---- entry points ----------------------------------------------------------------------------- */
LMX_AVX512 int lmx_ggml_dequant_chunks_avx512(int type, const void *row, int64_t K, float *dst, int64_t cs) {
    const uint8_t *b = (const uint8_t *)row;
    switch (type) {
    case LMX_GGML_Q8_0: dequant_b32(LMX_GGML_Q8_0, b, K / 32, dst, cs); return 1;
    case LMX_GGML_Q4_0: dequant_b32(LMX_GGML_Q4_0, b, K / 32, dst, cs); return 1;
    case LMX_GGML_Q4_1: dequant_b32(LMX_GGML_Q4_1, b, K / 32, dst, cs); return 1;
    case LMX_GGML_Q5_0: dequant_b32(LMX_GGML_Q5_0, b, K / 32, dst, cs); return 1;
    case LMX_GGML_Q5_1: dequant_b32(LMX_GGML_Q5_1, b, K / 32, dst, cs); return 1;
    case LMX_GGML_Q2_K: dequant_q23_k(b, K / 256, dst, cs, 0); return 1;
    case LMX_GGML_Q3_K: dequant_q23_k(b, K / 256, dst, cs, 1); return 1;
    case LMX_GGML_Q4_K: dequant_q45_k(b, K / 256, dst, cs, 0); return 1;
    case LMX_GGML_Q5_K: dequant_q45_k(b, K / 256, dst, cs, 1); return 1;
    case LMX_GGML_Q6_K: dequant_q6_k(b, K / 256, dst, cs); return 1;
    default: return 0;
    }
}

LMX_AVX512 int lmx_ggml_dequant_row_avx512(int type, const void *row, int64_t K, float *dst) {
    return lmx_ggml_dequant_chunks_avx512(type, row, K, dst, 16);
}

/* Rows [n0, n1) of a matrix of rows of K elements at w: y[n - n0] = row n . x. */
#define ROWS(expr)                                                                                 \
    for (int64_t n = n0; n < n1; n++) {                                                            \
        const uint8_t *b = (const uint8_t *)w + (size_t)n * rb;                                    \
        y[n - n0] = (expr);                                                                        \
    }

LMX_AVX512 int lmx_ggml_matvec_avx512(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y) {
    const size_t rb = lmx_ggml_row_bytes(type, K);
    float xs[XS_MAX];
    if (!rb) return 0;
    switch (type) { /* offsets: sums of x per 32 (per 16 for Q2_K) */
    case LMX_GGML_Q4_1:
    case LMX_GGML_Q5_1:
    case LMX_GGML_Q4_K:
    case LMX_GGML_Q5_K:
        if (K / 32 > XS_MAX) return 0;
        x_sums(x, K / 32, 32, xs);
        break;
    case LMX_GGML_Q2_K:
        if (K / 16 > XS_MAX) return 0;
        x_sums(x, K / 16, 16, xs);
        break;
    default: break;
    }
    switch (type) {
    case LMX_GGML_Q8_0: ROWS(dot_b32(LMX_GGML_Q8_0, b, K / 32, x, xs)) return 1;
    case LMX_GGML_Q4_0: ROWS(dot_b32(LMX_GGML_Q4_0, b, K / 32, x, xs)) return 1;
    case LMX_GGML_Q4_1: ROWS(dot_b32(LMX_GGML_Q4_1, b, K / 32, x, xs)) return 1;
    case LMX_GGML_Q5_0: ROWS(dot_b32(LMX_GGML_Q5_0, b, K / 32, x, xs)) return 1;
    case LMX_GGML_Q5_1: ROWS(dot_b32(LMX_GGML_Q5_1, b, K / 32, x, xs)) return 1;
    case LMX_GGML_Q2_K: ROWS(dot_q23k(0, b, K / 256, x, xs)) return 1;
    case LMX_GGML_Q3_K: ROWS(dot_q23k(1, b, K / 256, x, xs)) return 1;
    case LMX_GGML_Q4_K: ROWS(dot_q45k(0, b, K / 256, x, xs)) return 1;
    case LMX_GGML_Q5_K: ROWS(dot_q45k(1, b, K / 256, x, xs)) return 1;
    case LMX_GGML_Q6_K: ROWS(dot_q6k(b, K / 256, x)) return 1;
    case LMX_GGML_F32:
    case LMX_GGML_F16:
    case LMX_GGML_BF16: ROWS(dot_float(type, b, x, K)) return 1;
    default: return 0;
    }
}

/* ---- integer dot products (decode, AVX-512 VNNI): Q4_K, Q5_K and Q6_K rows against x in 30-bit integers a
 * super-block at a time: x ~ dx (32768 hi + lo), hi and lo int16 (|hi| <= 32,766, 0 <= lo < 32,768), one dx per 256
 * values, x rounded from its float product with 2^30 / max|x|, so each value keeps float32's own precision down to
 * 2^-30 of its block's largest.  Each weight code times its (sub-)block's integer scale is an int16 (Q4_K: at most
 * 15 x 63; Q5_K: 31 x 63; Q6_K: 32 x 128), and vpdpwssd adds its products with hi and with lo, two a lane an
 * instruction, into int32 lanes: a lane takes 16 products a super-block, at most 16 x 4,096 x 32,766 < 2^31, so
 * both sums are exact and meet the float scales once a super-block.  Q4_K / Q5_K's offsets (dmin m) take the float
 * sums of x, as the float path does.  One core of the 2-core EPYC (Zen 4) development machine, 32,768 rows of 2,048
 * from DRAM, against the float path: Q4_K 25.5-26 -> 39.5-42 Gweights/s (22-24 GB/s), Q5_K 21.2 -> 31.5-32 (22
 * GB/s), Q6_K 18.5-19.2 -> 30.4-32.4 (25-26.6 GB/s), where a plain read of the same bytes runs at 29 GB/s.  (x in
 * int16 alone, one product a pair, ran at 47 and 35, but moved Gemma 3's logits by 1e-3 where its activations'
 * outliers set their block's scale.) */
#define LMX_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define XQ_RANGE 1073676288.0f /* 2^30 - 2^16: |hi| <= 32,766 */

/* x [nsb 256] -> hi and lo (int16 [nsb][256] each) and d (a scale a super-block) */
LMX_VNNI static void x_quant30(const float *x, int64_t nsb, int16_t *hi, int16_t *lo, float *d) {
    const __m512i m15 = _mm512_set1_epi32(0x7fff);
    for (int64_t i = 0; i < nsb; i++, x += 256, hi += 256, lo += 256) {
        __m512 m = _mm512_setzero_ps(), nf = m; /* nf: NaN where x is not finite (x 0) */
        for (int k = 0; k < 256; k += 16) {
            const __m512 v = _mm512_loadu_ps(x + k);
            m = _mm512_max_ps(m, _mm512_abs_ps(v)), nf = _mm512_add_ps(nf, _mm512_mul_ps(v, _mm512_setzero_ps()));
        }
        const float amax = _mm512_reduce_max_ps(m);
        const __m512 id = _mm512_set1_ps(amax > 0.0f ? XQ_RANGE / amax : 0.0f);
        d[i] = amax / XQ_RANGE + _mm512_reduce_add_ps(nf); /* a NaN or infinity in x gives NaN, as the float path */
        for (int k = 0; k < 256; k += 16) {
            const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + k), id)); /* nearest */
            _mm256_storeu_si256((__m256i *)(hi + k), _mm512_cvtepi32_epi16(_mm512_srai_epi32(q, 15)));
            _mm256_storeu_si256((__m256i *)(lo + k), _mm512_cvtepi32_epi16(_mm512_and_si512(q, m15)));
        }
    }
}

/* the float dot of a super-block's two sums: dx d (32768 hi + lo) */
LMX_VNNI AI __m512 hilo_acc(__m512i sh, __m512i sl, float scale, __m512 acc) {
    const __m512 s = _mm512_set1_ps(scale);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sl), s,
                           _mm512_fmadd_ps(_mm512_cvtepi32_ps(sh), _mm512_mul_ps(s, _mm512_set1_ps(32768.0f)), acc));
}

/* Q4_K / Q5_K (see dot_q45k) */
LMX_VNNI AI float dot_q45k_vnni(int q5, const uint8_t *b, int64_t nb, const int16_t *xh, const int16_t *xl,
                                const float *xd, const float *xs) {
    const int bytes = q5 ? 176 : 144, qs = q5 ? 48 : 16;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m512i k16 = _mm512_set1_epi16(16);
    __m512 acc = _mm512_setzero_ps();
    __m256 accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += bytes, xh += 256, xl += 256, xs += 8) {
        prefetch_ahead(b, bytes);
        const float d = h2f(b), dmin = h2f(b + 2);
        uint64_t scs, mns;
        q45k_scales(b + 4, &scs, &mns);
        accm = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), bytes8_ps(mns)), _mm256_loadu_ps(xs), accm);
        /* s6 as int16, lane j of sv; sub-block j's spread over all lanes by one permute */
        const __m512i sv = _mm512_cvtepu8_epi16(_mm256_castsi128_si256(_mm_cvtsi64_si128((long long)scs)));
        const __m256i qh = q5 ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m512i sh = _mm512_setzero_si512(), sl = sh;
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) { /* sub-blocks 2c (low nibbles) and 2c + 1 (high); Q5_K: bit j of qh[l] adds 16 */
            const __m256i v = _mm256_loadu_si256((const __m256i *)(b + qs + 32 * c));
            __m512i q0 = _mm512_cvtepu8_epi16(_mm256_and_si256(v, m4)),
                    q1 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            if (q5) {
                q0 = _mm512_mask_add_epi16(q0, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(1 << (2 * c)))), q0, k16);
                q1 = _mm512_mask_add_epi16(q1, _mm256_test_epi8_mask(qh, _mm256_set1_epi8((char)(2 << (2 * c)))), q1, k16);
            }
            const __m512i w0 = _mm512_mullo_epi16(q0, _mm512_permutexvar_epi16(_mm512_set1_epi16((short)(2 * c)), sv));
            const __m512i w1 = _mm512_mullo_epi16(q1, _mm512_permutexvar_epi16(_mm512_set1_epi16((short)(2 * c + 1)), sv));
            sh = _mm512_dpwssd_epi32(sh, w0, _mm512_loadu_si512(xh + 64 * c));
            sl = _mm512_dpwssd_epi32(sl, w0, _mm512_loadu_si512(xl + 64 * c));
            sh = _mm512_dpwssd_epi32(sh, w1, _mm512_loadu_si512(xh + 64 * c + 32));
            sl = _mm512_dpwssd_epi32(sl, w1, _mm512_loadu_si512(xl + 64 * c + 32));
        }
        acc = hilo_acc(sh, sl, d * xd[i], acc);
    }
    return _mm512_reduce_add_ps(acc) - hsum256(accm);
}

/* Q6_K (see dot_q6k): a quarter c of half a holds 32 codes, two scales of 16 */
LMX_VNNI static float dot_q6k_vnni(const uint8_t *b, int64_t nb, const int16_t *xh, const int16_t *xl, const float *xd) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 210, xh += 256, xl += 256) {
        prefetch_ahead(b, 210);
        /* the 16 scales as int16 (lane k); a quarter's two spread over its 16 + 16 lanes by one permute */
        const __m512i s16 = _mm512_cvtepi8_epi16(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(b + 192))));
        __m512i sh = _mm512_setzero_si512(), sl = sh;
#pragma GCC unroll 2
        for (int a = 0; a < 2; a++) {
            __m256i q[4];
            q6k_half(b, a, q);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                const int j = 8 * a + 2 * c;
                const __m512i sc = _mm512_permutexvar_epi16(
                    _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16((short)j), _mm512_set1_epi16((short)(j + 1))),
                    s16);
                const __m512i w = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(q[c]), sc);
                sh = _mm512_dpwssd_epi32(sh, w, _mm512_loadu_si512(xh + 128 * a + 32 * c));
                sl = _mm512_dpwssd_epi32(sl, w, _mm512_loadu_si512(xl + 128 * a + 32 * c));
            }
        }
        acc = hilo_acc(sh, sl, h2f(b + 208) * xd[i], acc);
    }
    return _mm512_reduce_add_ps(acc);
}

/* x prepared (ggml_quant.h, lmx_ggml_xq_*): hi [K], lo [K] (int16), d [K / 256], then Q4_K / Q5_K's sums of x per
 * 32 [K / 32] */
LMX_VNNI void lmx_ggml_xq_prepare_vnni(int type, const float *x, int64_t K, void *xq) {
    int16_t *hi = xq, *lo = hi + K;
    float *d = (float *)(lo + K);
    x_quant30(x, K / 256, hi, lo, d);
    if (type != LMX_GGML_Q6_K) x_sums(x, K / 32, 32, d + K / 256); /* the offsets' sums of x per 32 */
}

LMX_VNNI void lmx_ggml_matvec_xq_vnni(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const void *xq,
                                      float *y) {
    const size_t rb = lmx_ggml_row_bytes(type, K);
    const int16_t *xh = xq, *xl = xh + K;
    const float *xd = (const float *)(xl + K), *xs = xd + K / 256;
    switch (type) {
    case LMX_GGML_Q4_K: ROWS(dot_q45k_vnni(0, b, K / 256, xh, xl, xd, xs)) return;
    case LMX_GGML_Q5_K: ROWS(dot_q45k_vnni(1, b, K / 256, xh, xl, xd, xs)) return;
    default: ROWS(dot_q6k_vnni(b, K / 256, xh, xl, xd)) return;
    }
}

/* x's form on the heap, not the stack (64 KB at K 16,384 on the caller's thread, whatever its stack) */
LMX_VNNI int lmx_ggml_matvec_vnni(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y) {
    if (!lmx_ggml_xq_type(type) || K <= 0 || K % 256) return 0;
    void *xq = aligned_alloc(64, (lmx_ggml_xq_bytes(K) + 63) / 64 * 64);
    if (!xq) return 0; /* the float path instead */
    lmx_ggml_xq_prepare_vnni(type, x, K, xq);
    lmx_ggml_matvec_xq_vnni(type, w, K, n0, n1, xq, y);
    free(xq);
    return 1;
}

LMX_AVX512 int lmx_ggml_dot_row_avx512(int type, const void *row, const float *x, int64_t K, float *out) {
    return lmx_ggml_matvec_avx512(type, row, K, 0, 1, x, out);
}
#else
typedef int lmx_ggml_quant_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
