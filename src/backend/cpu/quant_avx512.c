/* quant_avx512.c - AVX-512 decode kernel for 4- and 8-bit MLX affine-quantized weights.
 *
 * 16 elements at a time: 8 bytes of nibbles (4-bit) or 16 bytes (8-bit) widen to 16 int32 and then
 * to floats; a group's q.x accumulates in one vector, scaled once per group. */
#include "quant.h"

#if defined(LMX_HAVE_X86_SIMD)
#include <immintrin.h>
#include <string.h>

/* 16 consecutive 4-bit values (8 bytes, low nibble first) as floats. */
static inline __m512 load_q4(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    __m128i b = _mm_cvtsi64_si128((long long)v);
    __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
    __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

static inline __m512 load_q8(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

static void qmatvec_avx512(const float *x, const float *xsum, const lmx_tensor *w, int64_t n0,
                           int64_t n1, float *y) {
    int bits = w->q.bits, group = w->q.group;
    if ((bits != 4 && bits != 8) || group % 16) {
        lmx_qmatvec_scalar(x, xsum, w, n0, n1, y);
        return;
    }
    int64_t K = w->shape[1], G = K / group, row_bytes = K * bits / 8;
    int64_t step = 16 * bits / 8; /* bytes per 16 elements */
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wr = (const uint8_t *)w->data + n * row_bytes;
        _mm_prefetch((const char *)(wr + row_bytes), _MM_HINT_T0);
        __m512 acc = _mm512_setzero_ps();
        float bias_acc = 0;
        for (int64_t g = 0; g < G; g++) {
            __m512 d0 = _mm512_setzero_ps(), d1 = _mm512_setzero_ps();
            const uint8_t *p = wr + g * group * bits / 8;
            const float *xg = x + g * group;
            int k = 0;
            if (bits == 4) {
                for (; k + 32 <= group; k += 32, p += 2 * step) {
                    d0 = _mm512_fmadd_ps(load_q4(p), _mm512_loadu_ps(xg + k), d0);
                    d1 = _mm512_fmadd_ps(load_q4(p + step), _mm512_loadu_ps(xg + k + 16), d1);
                }
                for (; k < group; k += 16, p += step) d0 = _mm512_fmadd_ps(load_q4(p), _mm512_loadu_ps(xg + k), d0);
            } else {
                for (; k + 32 <= group; k += 32, p += 2 * step) {
                    d0 = _mm512_fmadd_ps(load_q8(p), _mm512_loadu_ps(xg + k), d0);
                    d1 = _mm512_fmadd_ps(load_q8(p + step), _mm512_loadu_ps(xg + k + 16), d1);
                }
                for (; k < group; k += 16, p += step) d0 = _mm512_fmadd_ps(load_q8(p), _mm512_loadu_ps(xg + k), d0);
            }
            float s = lmx_quant_param(w, w->q.scales, n, g);
            acc = _mm512_fmadd_ps(_mm512_add_ps(d0, d1), _mm512_set1_ps(s), acc);
            bias_acc += lmx_quant_param(w, w->q.biases, n, g) * xsum[g];
        }
        y[n] = _mm512_reduce_add_ps(acc) + bias_acc;
    }
}

lmx_qmatvec_fn lmx_qmatvec_avx512(void) { return qmatvec_avx512; }
#endif
