/* kernels_avx512.c - AVX-512 kernels (built with -mavx512f/bw/vl/dq -mfma -mf16c; only called
 * after lmx_cpu_kernels_init has checked the CPU).
 *
 * matmul layout: the weight matrix is the stream, x rows come from cache.  Weight rows are taken
 * in groups of NB = 4 (then one at a time for the rest of [n0, n1)), and for each group the x rows
 * in blocks of MB = 4 (remainder block of 1-3).  A tile holds MB x NB accumulators of 16 floats in
 * registers; every step widens 16 weights per row once (bf16: vpmovzxwd + vpslld 16, f16:
 * vcvtph2ps) and multiplies them with all MB x rows.  Tiles with at most 8 accumulators run the
 * K loop twice unrolled with a second accumulator set to shorten the FMA dependency chains.  The
 * K tail uses masked loads, so nothing past a row's end is read.  While the first block of x rows
 * runs over a group, the next group of rows is prefetched into L2 at the same offsets (each row
 * is its own short stream, which the hardware prefetchers pick up late). */
#include "kernels.h"
#include "act.h"

#if defined(LMX_HAVE_X86_SIMD)

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

enum { W_F32, W_BF16, W_F16 };

AI __m512 wload(int wt, const char *row, int64_t k) {
    if (wt == W_F32) return _mm512_loadu_ps((const float *)row + k);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + k));
    if (wt == W_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

AI __m512 wload_mask(int wt, const char *row, int64_t k, __mmask16 m) {
    if (wt == W_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + k);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k);
    if (wt == W_BF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* acc[i][j] += x[i, k:k+16] * w[j, k:k+16] */
AI void step(int wt, int MB, int NB, __m512 acc[4][4], const float *x, int64_t ldx,
             const char *const *wr, int64_t k) {
    __m512 wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) wv[j] = wload(wt, wr[j], k);
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
        const __m512 xv = _mm512_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
}

AI void step_mask(int wt, int MB, int NB, __m512 acc[4][4], const float *x, int64_t ldx,
                  const char *const *wr, int64_t k, __mmask16 m) {
    __m512 wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) wv[j] = wload_mask(wt, wr[j], k, m);
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x + i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
}

/* Prefetch `bytes` (a multiple of 32) of each row at byte offset off into L2. */
AI void prefetch_rows(int NB, const char *const *wr, int64_t off, int bytes) {
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) {
#pragma GCC unroll 4
        for (int b = 0; b < bytes; b += 64) _mm_prefetch(wr[j] + off + b, _MM_HINT_T1);
    }
}

/* y[i, n+j] = x[i, :] . w[n+j, :] for i < MB, j < NB */
AI void tile(int wt, int MB, int NB, const float *x, int64_t ldx, int64_t K, const void *w,
             int64_t n, float *y, int64_t ldy, int64_t pfd) {
    const int64_t es = wt == W_F32 ? 4 : 2;
    const int two = MB * NB <= 8 && MB > 1;
    const char *wr[4];
    __m512 a0[4][4], a1[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) wr[j] = (const char *)w + (n + j) * K * es;
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) a0[i][j] = a1[i][j] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    if (two) {
        for (; k + 32 <= K; k += 32) {
            if (pfd) prefetch_rows(NB, wr, k * es + pfd, (int)(32 * es));
            step(wt, MB, NB, a0, x, ldx, wr, k);
            step(wt, MB, NB, a1, x, ldx, wr, k + 16);
        }
    }
    for (; k + 16 <= K; k += 16) {
        if (pfd) prefetch_rows(NB, wr, k * es + pfd, (int)(16 * es));
        step(wt, MB, NB, a0, x, ldx, wr, k);
    }
    if (k < K) step_mask(wt, MB, NB, a0, x, ldx, wr, k, (__mmask16)((1u << (K - k)) - 1u));
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) {
            const __m512 s = two ? _mm512_add_ps(a0[i][j], a1[i][j]) : a0[i][j];
            y[i * ldy + n + j] = _mm512_reduce_add_ps(s);
        }
    }
}

/* All x rows against weight rows [n, n+NB).  The first block of x rows prefetches the same
 * span of the next NB rows, which the next call will read. */
AI void row_group(int wt, int NB, const float *x, int64_t ldx, int M, int64_t K, const void *w,
                  int64_t n, float *y, int64_t ldy) {
    int64_t pfd = NB * K * (wt == W_F32 ? 4 : 2);
    int m = 0;
    for (; m + 4 <= M; m += 4, pfd = 0)
        tile(wt, 4, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
    switch (M - m) {
    case 3: tile(wt, 3, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd); break;
    case 2: tile(wt, 2, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd); break;
    case 1: tile(wt, 1, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd); break;
    default: break;
    }
}

AI void matmul(int wt, const float *x, int64_t ldx, int M, int64_t K, const void *w, int64_t n0,
               int64_t n1, float *y, int64_t ldy) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) row_group(wt, 4, x, ldx, M, K, w, n, y, ldy);
    for (; n < n1; n++) row_group(wt, 1, x, ldx, M, K, w, n, y, ldy);
}

static void matmul_f32_avx512(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                              int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_F32, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_bf16_avx512(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                               int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_BF16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_f16_avx512(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                              int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_F16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static float dot_f32_avx512(const float *a, const float *b, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 32), _mm512_loadu_ps(b + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 48), _mm512_loadu_ps(b + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static void bf16_to_f32_avx512(float *dst, const void *src, int64_t n) {
    const char *s = (const char *)src;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm512_storeu_ps(dst + i, wload(W_BF16, s, i));
        _mm512_storeu_ps(dst + i + 16, wload(W_BF16, s, i + 16));
    }
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, wload(W_BF16, s, i));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, wload_mask(W_BF16, s, i, m));
    }
}

static void f16_to_f32_avx512(float *dst, const void *src, int64_t n) {
    const char *s = (const char *)src;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm512_storeu_ps(dst + i, wload(W_F16, s, i));
        _mm512_storeu_ps(dst + i + 16, wload(W_F16, s, i + 16));
    }
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, wload(W_F16, s, i));
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, m, wload_mask(W_F16, s, i, m));
    }
}

static void axpy_f32_avx512(float *y, float a, const float *x, int64_t n) {
    const __m512 av = _mm512_set1_ps(a);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m512 r0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
        const __m512 r1 =
            _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(y + i + 16));
        _mm512_storeu_ps(y + i, r0);
        _mm512_storeu_ps(y + i + 16, r1);
    }
    for (; i + 16 <= n; i += 16) {
        const __m512 r = _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i));
        _mm512_storeu_ps(y + i, r);
    }
    if (i < n) {
        const __mmask16 m = (__mmask16)((1u << (n - i)) - 1u);
        const __m512 r = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i),
                                         _mm512_maskz_loadu_ps(m, y + i));
        _mm512_mask_storeu_ps(y + i, m, r);
    }
}

/* Sums of 16 vectors at once: out lane 4L + s = sum of the lanes of in[4s + L] (a transposing
 * add tree, 4 levels of shuffle + add instead of 16 separate horizontal sums). */
AI __m512 reduce16(const __m512 in[16]) {
    __m512 t[8], u[4], w[2];
    for (int p = 0; p < 8; p++)
        t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * p], in[2 * p + 1], 0x44),
                             _mm512_shuffle_f32x4(in[2 * p], in[2 * p + 1], 0xee));
    for (int q = 0; q < 4; q++) /* lane L of u[q]: partial sums of in[4q + L] */
        u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0x88),
                             _mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0xdd));
    for (int r = 0; r < 2; r++)
        w[r] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * r], u[2 * r + 1], 0x44),
                             _mm512_shuffle_ps(u[2 * r], u[2 * r + 1], 0xee));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
}

/* 16 keys at a time: one accumulator per key over n, then one reduce16 for all 16 scores. */
static void dot_rows_f32_avx512(const float *a, const float *rows, int64_t stride, int m, int64_t n, float *out) {
    for (int j0 = 0; j0 < m; j0 += 16) {
        const int cnt = m - j0 < 16 ? m - j0 : 16;
        const float *r[16];
        __m512 acc[16];
#pragma GCC unroll 16
        for (int v = 0; v < 16; v++) { /* input v of reduce16 is key 4 (v % 4) + v / 4 */
            int key = 4 * (v % 4) + v / 4;
            r[v] = rows + (int64_t)(j0 + (key < cnt ? key : 0)) * stride;
            acc[v] = _mm512_setzero_ps();
        }
        int64_t k = 0;
        for (; k + 16 <= n; k += 16) {
            const __m512 av = _mm512_loadu_ps(a + k);
#pragma GCC unroll 16
            for (int v = 0; v < 16; v++) acc[v] = _mm512_fmadd_ps(av, _mm512_loadu_ps(r[v] + k), acc[v]);
        }
        if (k < n) {
            const __mmask16 mk = (__mmask16)((1u << (n - k)) - 1u);
            const __m512 av = _mm512_maskz_loadu_ps(mk, a + k);
#pragma GCC unroll 16
            for (int v = 0; v < 16; v++) acc[v] = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(mk, r[v] + k), acc[v]);
        }
        _mm512_mask_storeu_ps(out + j0, (__mmask16)(cnt == 16 ? 0xffffu : (1u << cnt) - 1u), reduce16(acc));
    }
}

/* y[0..n) += sum_j w[j] rows[j]: 4 vectors of y (64 floats) stay in registers while all m rows
 * are added in; a last partial chunk uses masked loads. */
static void axpy_rows_f32_avx512(float *y, const float *w, const float *rows, int64_t stride, int m, int64_t n) {
    int64_t d = 0;
    for (; d + 64 <= n; d += 64) {
        __m512 a0 = _mm512_loadu_ps(y + d), a1 = _mm512_loadu_ps(y + d + 16);
        __m512 a2 = _mm512_loadu_ps(y + d + 32), a3 = _mm512_loadu_ps(y + d + 48);
        const float *r = rows + d;
        for (int j = 0; j < m; j++, r += stride) {
            const __m512 wj = _mm512_set1_ps(w[j]);
            a0 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r), a0);
            a1 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 16), a1);
            a2 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 32), a2);
            a3 = _mm512_fmadd_ps(wj, _mm512_loadu_ps(r + 48), a3);
        }
        _mm512_storeu_ps(y + d, a0);
        _mm512_storeu_ps(y + d + 16, a1);
        _mm512_storeu_ps(y + d + 32, a2);
        _mm512_storeu_ps(y + d + 48, a3);
    }
    for (; d < n; d += 16) {
        const __mmask16 mk = (__mmask16)(n - d >= 16 ? 0xffffu : (1u << (n - d)) - 1u);
        __m512 a = _mm512_maskz_loadu_ps(mk, y + d);
        const float *r = rows + d;
        for (int j = 0; j < m; j++, r += stride) a = _mm512_fmadd_ps(_mm512_set1_ps(w[j]), _mm512_maskz_loadu_ps(mk, r), a);
        _mm512_mask_storeu_ps(y + d, mk, a);
    }
}

/* Squares are exact in double, so only the order of the double additions differs from the scalar
 * loop (4 x 8 partial sums). */
static double sumsq_f32_avx512(const float *x, int64_t n) {
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i)), b = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 8));
        __m512d c = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 16)), d = _mm512_cvtps_pd(_mm256_loadu_ps(x + i + 24));
        s0 = _mm512_fmadd_pd(a, a, s0), s1 = _mm512_fmadd_pd(b, b, s1);
        s2 = _mm512_fmadd_pd(c, c, s2), s3 = _mm512_fmadd_pd(d, d, s3);
    }
    for (; i < n; i += 8) {
        __mmask8 m = (__mmask8)(n - i >= 8 ? 0xffu : (1u << (n - i)) - 1u);
        __m512d a = _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, x + i));
        s0 = _mm512_fmadd_pd(a, a, s0);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
}

int lmx_cpu_kernels_init_avx512(lmx_cpu_kernels *k) {
    k->isa = "avx512";
    k->matmul_f32 = matmul_f32_avx512;
    k->matmul_bf16 = matmul_bf16_avx512;
    k->matmul_f16 = matmul_f16_avx512;
    k->dot_f32 = dot_f32_avx512;
    k->bf16_to_f32 = bf16_to_f32_avx512;
    k->f16_to_f32 = f16_to_f32_avx512;
    k->axpy_f32 = axpy_f32_avx512;
    k->dot_rows_f32 = dot_rows_f32_avx512;
    k->axpy_rows_f32 = axpy_rows_f32_avx512;
    k->sumsq_f32 = sumsq_f32_avx512;
    k->attn_exp = lmx_attn_exp_avx512;
    return 1;
}

#else /* !LMX_HAVE_X86_SIMD */

int lmx_cpu_kernels_init_avx512(lmx_cpu_kernels *k) {
    (void)k;
    return 0;
}

#endif
