/* gemm_avx512.c - the packed float32 GEMM of gemm.h (prefill).  Built with AVX-512 flags; every
 * function also carries its own target attribute, and is called only after a CPU check.
 *
 * Micro-tile: MV (1 to 3) blocks of 16 x rows times g <= 8 weight rows.  For each k, one vector of
 * 16 x values (one per row) per block meets the broadcast weight w[j, k] of each of the g rows:
 * acc[v][j] holds 16 output rows of column j, so a tile ends with no reduction, only a transposed
 * (masked scatter) store.  The weight tile (a task's rows, a few hundred KB) and the packed x block
 * stay in L2 while the tile loops run. */
#include "gemm.h"

#if defined(LMX_HAVE_X86_SIMD)
#include <immintrin.h>
#include <string.h>

#define LMX_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))
#define AI static inline __attribute__((always_inline))


/* 16 x 16 transpose: r[i] holds row i (16 columns); afterwards r[k] holds column k. */
LMX_AVX512 AI void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* 64-bit pairs */
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    /* r[4q + s] holds, in 128-bit lane L, column 4L + s of rows 4q..4q+3 */
    for (int s = 0; s < 4; s++) {
        __m512 a = _mm512_shuffle_f32x4(r[s], r[4 + s], 0x88), b = _mm512_shuffle_f32x4(r[s], r[4 + s], 0xdd);
        __m512 c = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0x88), d = _mm512_shuffle_f32x4(r[8 + s], r[12 + s], 0xdd);
        t[s] = _mm512_shuffle_f32x4(a, c, 0x88);      /* column s */
        t[8 + s] = _mm512_shuffle_f32x4(a, c, 0xdd);  /* column 8 + s */
        t[4 + s] = _mm512_shuffle_f32x4(b, d, 0x88);  /* column 4 + s */
        t[12 + s] = _mm512_shuffle_f32x4(b, d, 0xdd); /* column 12 + s */
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

LMX_AVX512 void lmx_gemm_pack_x_avx512(const float *x, int64_t ldx, int M, int64_t K, int b0, int b1,
                                       float *xp) {
    const int64_t Kp = lmx_gemm_kpad(K);
    for (int b = b0; b < b1; b++) {
        float *dst = xp + (size_t)b * Kp * 16;
        const float *src = x + (int64_t)16 * b * ldx;
        int rows = M - 16 * b < 16 ? M - 16 * b : 16;
        for (int64_t k = 0; k < Kp; k += 16) {
            __mmask16 km = (__mmask16)(K - k >= 16 ? 0xffffu : (1u << (K - k)) - 1u);
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < rows ? _mm512_maskz_loadu_ps(km, src + i * ldx + k) : _mm512_setzero_ps();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + (k + i) * 16, r[i]);
        }
    }
}

LMX_AVX512 void lmx_gemm_pack_w_row_avx512(const float *src, int64_t K, int j, int N, float *wp) {
    int64_t cs, k = 0;
    float *base = lmx_gemm_w_row_slot(wp, K, j, N, &cs);
    for (int64_t c = 0; k + 16 <= K; k += 16, c++) _mm512_storeu_ps(base + c * cs, _mm512_loadu_ps(src + k));
    if (k < K) {
        __mmask16 m = (__mmask16)((1u << (K - k)) - 1u);
        _mm512_storeu_ps(base + (k / 16) * cs, _mm512_maskz_loadu_ps(m, src + k));
    }
}

/* y[16 v + i, j] for v < MV, i < 16 (rows in all: `rows`), j < G. */
LMX_AVX512 AI void tile(int MV, int G, const float *xa, int64_t Kp, const float *wg, float *y, int64_t ldy,
                        int rows) {
    __m512 acc[3][LMX_GEMM_NR];
#pragma GCC unroll 3
    for (int v = 0; v < MV; v++)
#pragma GCC unroll 16
        for (int j = 0; j < G; j++) acc[v][j] = _mm512_setzero_ps();
    for (int64_t c = 0; c < Kp / 16; c++, xa += 256, wg += G * 16) {
#pragma GCC unroll 16
        for (int kk = 0; kk < 16; kk++) {
            __m512 xv[3];
#pragma GCC unroll 3
            for (int v = 0; v < MV; v++) xv[v] = _mm512_loadu_ps(xa + v * Kp * 16 + kk * 16);
#pragma GCC unroll 16
            for (int j = 0; j < G; j++) {
                const __m512 w = _mm512_set1_ps(wg[j * 16 + kk]);
#pragma GCC unroll 3
                for (int v = 0; v < MV; v++) acc[v][j] = _mm512_fmadd_ps(xv[v], w, acc[v][j]);
            }
        }
    }
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)ldy));
#pragma GCC unroll 3
    for (int v = 0; v < MV; v++) {
        int r = rows - 16 * v;
        __mmask16 m = (__mmask16)(r >= 16 ? 0xffffu : r > 0 ? (1u << r) - 1u : 0u);
        float *yv = y + 16 * v * ldy;
        if (ldy < (1 << 26)) { /* 16 * ldy * 4 bytes fits the int32 scatter index */
#pragma GCC unroll 16
            for (int j = 0; j < G; j++) _mm512_mask_i32scatter_ps(yv + j, m, idx, acc[v][j], 4);
        } else {
            float t[16];
            for (int j = 0; j < G; j++) {
                _mm512_storeu_ps(t, acc[v][j]);
                for (int i = 0; i < r && i < 16; i++) yv[i * ldy + j] = t[i];
            }
        }
    }
}

#define TILE_CASES(MV)                                                                             \
    switch (g) {                                                                                   \
    case 8: tile(MV, 8, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 7: tile(MV, 7, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 6: tile(MV, 6, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 5: tile(MV, 5, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 4: tile(MV, 4, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 3: tile(MV, 3, xa, Kp, wg, yt, ldy, rows); break;                                         \
    case 2: tile(MV, 2, xa, Kp, wg, yt, ldy, rows); break;                                         \
    default: tile(MV, 1, xa, Kp, wg, yt, ldy, rows); break;                                        \
    }

LMX_AVX512 void lmx_gemm_run_avx512(const float *xp, int M, int64_t K, const float *wp, int N, float *y,
                                    int64_t ldy) {
    const int64_t Kp = lmx_gemm_kpad(K);
    for (int m = 0; m < M;) {
        const float *xa = xp + (size_t)(m / 16) * Kp * 16;
        int left = M - m, mv = left > 32 ? 3 : left > 16 ? 2 : 1;
        int rows = left < 16 * mv ? left : 16 * mv;
        for (int n = 0; n < N; n += LMX_GEMM_NR) {
            int g = N - n < LMX_GEMM_NR ? N - n : LMX_GEMM_NR;
            const float *wg = wp + (size_t)(n / LMX_GEMM_NR) * LMX_GEMM_NR * Kp;
            float *yt = y + (int64_t)m * ldy + n;
            if (mv == 3) {
                TILE_CASES(3)
            } else if (mv == 2) {
                TILE_CASES(2)
            } else {
                TILE_CASES(1)
            }
        }
        m += rows;
    }
}
#else
typedef int lmx_gemm_avx512_unused; /* ISO C forbids an empty translation unit */
#endif
