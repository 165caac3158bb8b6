/* act_avx512.c - AVX-512 SiLU / GELU-tanh gated activations, and attention's softmax numerators (act.h). */
#include "act.h"

#include <math.h>

#if defined(LMX_HAVE_X86_SIMD)
#include <immintrin.h>

#define LMX_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

/* exp(x): n = round(x / ln 2), r = x - n ln2 (two-part constant, exact first product), e^r by a
 * degree-7 Taylor polynomial on |r| <= ln2 / 2 (truncation < 2e-9 relative), times 2^n by
 * vscalefps, which also gives 0 / inf where the result under/overflows.  NaN stays NaN. */
LMX_AVX512 static inline __m512 exp16(__m512 x) {
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693145751953125f);     /* 12 significant bits */
    const __m512 ln2_lo = _mm512_set1_ps(1.42860682030941723e-06f);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.0f)), _mm512_set1_ps(-120.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

LMX_AVX512 void lmx_exp_avx512(float *dst, const float *src, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, exp16(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, exp16(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

/* attn_exp (kernels.h): the scores and their maximum sixteen at a time (tanh, for a soft cap, one at a
 * time), exp16 of each less the maximum, the sum in two double accumulators.  A NaN score is passed
 * over by the maximum, as the scalar loop does, and gives a NaN numerator. */
LMX_AVX512 double lmx_attn_exp_avx512(float *x, float *e, int n, float scale, float cap) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int i = 0;
    if (cap > 0) {
        float mx = -INFINITY;
        for (; i < n; i++) {
            const float s = cap * tanhf(x[i] * scale / cap);
            x[i] = s;
            if (s > mx) mx = s;
        }
        vm = _mm512_set1_ps(mx);
    } else {
        const __m512 vs = _mm512_set1_ps(scale);
        for (; i + 16 <= n; i += 16) {
            const __m512 s = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
            _mm512_storeu_ps(x + i, s);
            vm = _mm512_max_ps(s, vm); /* a NaN s gives vm */
        }
        if (i < n) {
            const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
            const __m512 s = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
            _mm512_mask_storeu_ps(x + i, m, s);
            vm = _mm512_mask_max_ps(vm, m, s, vm);
        }
        vm = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
    }
    __m512d s0 = _mm512_setzero_pd(), s1 = s0;
    for (i = 0; i < n; i += 16) {
        const __mmask16 m = (__mmask16)(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1u);
        const __m512 p = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
        _mm512_mask_storeu_ps(e + i, m, p);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(p)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(p), 1))));
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* g / (1 + exp(-s * t)) * u, with t = g (SiLU) or t = g + 0.044715 g^3 (GELU), s the factor. */
LMX_AVX512 static inline __m512 gate16(__m512 g, __m512 u, int gelu) {
    __m512 t;
    if (gelu) {
        const __m512 c = _mm512_set1_ps(0.044715f), s = _mm512_set1_ps(-2.0f * 0.7978845608028654f);
        t = _mm512_mul_ps(s, _mm512_fmadd_ps(_mm512_mul_ps(c, g), _mm512_mul_ps(g, g), g));
    } else {
        t = _mm512_sub_ps(_mm512_setzero_ps(), g);
    }
    __m512 den = _mm512_add_ps(_mm512_set1_ps(1.0f), exp16(t));
    return _mm512_mul_ps(_mm512_div_ps(g, den), u);
}

LMX_AVX512 static void glu(float *out, const float *g, const float *u, int64_t n, int gelu) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, gate16(_mm512_loadu_ps(g + i), _mm512_loadu_ps(u + i), gelu));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(out + i, m, gate16(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, u + i), gelu));
    }
}

void lmx_glu_silu_avx512(float *out, const float *gate, const float *up, int64_t n) { glu(out, gate, up, n, 0); }
void lmx_glu_gelu_avx512(float *out, const float *gate, const float *up, int64_t n) { glu(out, gate, up, n, 1); }
#else
typedef int lmx_act_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
