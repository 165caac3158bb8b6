/* kernels_avx2.c - AVX2 + FMA + F16C kernels (built with -mavx2 -mfma -mf16c; only called after
 * lmx_cpu_kernels_init has checked the CPU).
 *
 * matmul layout: as in kernels_avx512.c, the weight matrix is the stream and x rows come from
 * cache.  Weight rows are taken in groups of 4 (then one at a time).  With 16 ymm registers a
 * tile keeps at most 8 accumulators of 8 floats: for f32 weights, x rows go in blocks of 4
 * (remainder 1-3) against two tiles of 2 weight rows; for bf16/f16 weights, whose widening costs
 * more than an x load, x rows go in blocks of 2 (remainder 1) against all 4 weight rows.  Each
 * step widens 8 weights per row once (bf16: vpmovzxwd + vpslld 16, f16: vcvtph2ps) and uses them
 * for every x row of the tile; tiles with at most 4 accumulators unroll K twice with a second
 * accumulator set.  The K tail (< 8 elements) is done in scalar code after the horizontal sum.
 * While the first block of x rows runs over a group, the next group of rows is prefetched into
 * L2 at the same offsets (each row is its own short stream, which the hardware prefetchers pick
 * up late). */
#include "kernels.h"

#if defined(LMX_HAVE_X86_SIMD)

#include <immintrin.h>

#include "../../base/half.h"

#define AI static inline __attribute__((always_inline))

enum { W_F32, W_BF16, W_F16 };

AI __m256 wload(int wt, const char *row, int64_t k) {
    if (wt == W_F32) return _mm256_loadu_ps((const float *)row + k);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + k));
    if (wt == W_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* Weight rows may sit at any address (kernels.h): unaligned vector loads above, lmx_load_* here. */
AI float wscalar(int wt, const char *row, int64_t k) {
    if (wt == W_F32) return lmx_load_f32(row + 4 * k);
    if (wt == W_BF16) return lmx_bf16_to_f32(lmx_load_u16(row + 2 * k));
    return lmx_f16_to_f32(lmx_load_u16(row + 2 * k));
}

AI float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* acc[i][j] += x[i, k:k+8] * w[j, k:k+8] */
AI void step(int wt, int MB, int NB, __m256 acc[4][4], const float *x, int64_t ldx,
             const char *const *wr, int64_t k) {
    __m256 wv[4];
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) wv[j] = wload(wt, wr[j], k);
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
        const __m256 xv = _mm256_loadu_ps(x + i * ldx + k);
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
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
    const int two = MB * NB <= 4;
    const char *wr[4];
    __m256 a0[4][4], a1[4][4];
#pragma GCC unroll 4
    for (int j = 0; j < NB; j++) wr[j] = (const char *)w + (n + j) * K * es;
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) a0[i][j] = a1[i][j] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    if (two) {
        for (; k + 16 <= K; k += 16) {
            if (pfd) prefetch_rows(NB, wr, k * es + pfd, (int)(16 * es));
            step(wt, MB, NB, a0, x, ldx, wr, k);
            step(wt, MB, NB, a1, x, ldx, wr, k + 8);
        }
    }
    for (; k + 8 <= K; k += 8) {
        if (pfd) prefetch_rows(NB, wr, k * es + pfd, (int)(8 * es));
        step(wt, MB, NB, a0, x, ldx, wr, k);
    }
#pragma GCC unroll 4
    for (int i = 0; i < MB; i++) {
#pragma GCC unroll 4
        for (int j = 0; j < NB; j++) {
            float s = hsum(two ? _mm256_add_ps(a0[i][j], a1[i][j]) : a0[i][j]);
            for (int64_t t = k; t < K; t++) s += x[i * ldx + t] * wscalar(wt, wr[j], t);
            y[i * ldy + n + j] = s;
        }
    }
}

/* All x rows against weight rows [n, n+NB).  The first block of x rows prefetches the same
 * span of the next NB rows, which the next call will read. */
AI void row_group(int wt, int NB, const float *x, int64_t ldx, int M, int64_t K, const void *w,
                  int64_t n, float *y, int64_t ldy) {
    int64_t pfd = NB * K * (wt == W_F32 ? 4 : 2);
    int m = 0;
    if (NB == 4 && wt != W_F32) {
        /* 16-bit weights: widening is the larger cost, so tiles of 2 x rows take all 4 rows */
        for (; m + 2 <= M; m += 2, pfd = 0)
            tile(wt, 2, 4, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
        if (m < M) tile(wt, 1, 4, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
        return;
    }
    if (NB == 4) {
        for (; m + 4 <= M; m += 4, pfd = 0) {
            tile(wt, 4, 2, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
            tile(wt, 4, 2, x + m * ldx, ldx, K, w, n + 2, y + m * ldy, ldy, pfd);
        }
        if (M - m == 3) {
            tile(wt, 3, 2, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
            tile(wt, 3, 2, x + m * ldx, ldx, K, w, n + 2, y + m * ldy, ldy, pfd);
            return;
        }
    } else {
        for (; m + 4 <= M; m += 4, pfd = 0)
            tile(wt, 4, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
        if (M - m == 3) {
            tile(wt, 3, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
            return;
        }
    }
    if (M - m == 2) tile(wt, 2, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
    if (M - m == 1) tile(wt, 1, NB, x + m * ldx, ldx, K, w, n, y + m * ldy, ldy, pfd);
}

AI void matmul(int wt, const float *x, int64_t ldx, int M, int64_t K, const void *w, int64_t n0,
               int64_t n1, float *y, int64_t ldy) {
    int64_t n = n0;
    for (; n + 4 <= n1; n += 4) row_group(wt, 4, x, ldx, M, K, w, n, y, ldy);
    for (; n < n1; n++) row_group(wt, 1, x, ldx, M, K, w, n, y, ldy);
}

static void matmul_f32_avx2(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                            int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_F32, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_bf16_avx2(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                             int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_BF16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_f16_avx2(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                            int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul(W_F16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static float dot_f32_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void bf16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const char *s = (const char *)src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, wload(W_BF16, s, i));
        _mm256_storeu_ps(dst + i + 8, wload(W_BF16, s, i + 8));
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, wload(W_BF16, s, i));
    for (; i < n; i++) dst[i] = wscalar(W_BF16, s, i);
}

static void f16_to_f32_avx2(float *dst, const void *src, int64_t n) {
    const char *s = (const char *)src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(dst + i, wload(W_F16, s, i));
        _mm256_storeu_ps(dst + i + 8, wload(W_F16, s, i + 8));
    }
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, wload(W_F16, s, i));
    for (; i < n; i++) dst[i] = wscalar(W_F16, s, i);
}

static void axpy_f32_avx2(float *y, float a, const float *x, int64_t n) {
    const __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m256 r0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        const __m256 r1 =
            _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8));
        _mm256_storeu_ps(y + i, r0);
        _mm256_storeu_ps(y + i + 8, r1);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 r = _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i));
        _mm256_storeu_ps(y + i, r);
    }
    for (; i < n; i++) y[i] += a * x[i];
}

int lmx_cpu_kernels_init_avx2(lmx_cpu_kernels *k) {
    k->isa = "avx2";
    k->matmul_f32 = matmul_f32_avx2;
    k->matmul_bf16 = matmul_bf16_avx2;
    k->matmul_f16 = matmul_f16_avx2;
    k->dot_f32 = dot_f32_avx2;
    k->bf16_to_f32 = bf16_to_f32_avx2;
    k->f16_to_f32 = f16_to_f32_avx2;
    k->axpy_f32 = axpy_f32_avx2;
    return 1;
}

#else /* !LMX_HAVE_X86_SIMD */

int lmx_cpu_kernels_init_avx2(lmx_cpu_kernels *k) {
    (void)k;
    return 0;
}

#endif
