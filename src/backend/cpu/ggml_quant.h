/* ggml_quant.h - cpu kernels for GGUF (ggml) block-quantized weights.
 *
 * A row of K elements (K a multiple of the type's block size) is a sequence of blocks laid out as
 * the GGUF specification describes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: 32 elements per block; Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K: 256 per super-block).  Rows are contiguous: row n starts at byte
 * n * lmx_ggml_row_bytes(type, K). */
#ifndef LMX_BACKEND_CPU_GGML_QUANT_H
#define LMX_BACKEND_CPU_GGML_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "../../formats/ggml_types.h"

/* The kernels' instruction sets, lowest first.  Every entry point below takes one as `simd` and uses
 * nothing above it (nor above what this CPU has): the cpu backend passes its kernel table's
 * ggml_simd, which LMX_CPU_ISA lowers like the rest of the table (scalar and avx2: the portable C). */
enum { LMX_GGML_PORTABLE = 0, LMX_GGML_AVX512 = 1, LMX_GGML_VNNI = 2 };
/* The highest of them this CPU runs (and this build has). */
int lmx_ggml_simd_best(void);

/* dst[k] = dequantized element k of one row of K elements starting at `row`. */
void lmx_ggml_dequant_row(int simd, int type, const void *row, int64_t K, float *dst);

/* Dot product of one quantized row (K elements) with float x[K] (decode path).  Implementations
 * may dispatch to SIMD internally (runtime check); results agree with dequant + float dot to
 * float32 rounding. */
float lmx_ggml_dot_row(int simd, int type, const void *row, const float *x, int64_t K);

/* y[n - n0] = dot(row n, x) for the rows n in [n0, n1) of a matrix of K-element rows at w (the
 * decode matvec: CPU dispatch and per-call preparation of x happen once for all the rows).  With
 * AVX-512 VNNI (simd LMX_GGML_VNNI), Q4_K, Q5_K and Q6_K rows (K a multiple of 256) take integer dot products against x
 * held in 30 bits per 256 values (lmx_ggml_matvec_vnni, float32's precision); the rest, float32 x. */
void lmx_ggml_matvec(int simd, int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y);

/* x prepared once for many matvecs (the decode matmul's tasks): lmx_ggml_xq_takes says whether this level, CPU, type and K
 * take the VNNI path (AVX-512 VNNI; Q4_K, Q5_K, Q6_K; K a multiple of 256, any size); then lmx_ggml_xq_prepare
 * writes x's 30-bit form into lmx_ggml_xq_bytes(K) bytes, and lmx_ggml_matvec_xq computes what lmx_ggml_matvec
 * would (the same bits) from it. */
static inline int lmx_ggml_xq_type(int type) {
    return type == LMX_GGML_Q4_K || type == LMX_GGML_Q5_K || type == LMX_GGML_Q6_K;
}
int lmx_ggml_xq_takes(int simd, int type, int64_t K);
static inline size_t lmx_ggml_xq_bytes(int64_t K) { /* hi and lo int16 [K], d [K / 256], sums [K / 32] */
    return (size_t)K * 4 + (size_t)K / 256 * 4 + (size_t)K / 32 * 4;
}
void lmx_ggml_xq_prepare(int type, const float *x, int64_t K, void *xq);
void lmx_ggml_matvec_xq(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const void *xq, float *y);

/* The portable dot (the reference the SIMD path is tested against), and the AVX-512 one
 * (ggml_quant_avx512.c): returns 1 and sets *out for the types it handles, else 0. */
float lmx_ggml_dot_row_portable(int type, const void *row, const float *x, int64_t K);
int lmx_ggml_dot_row_avx512(int type, const void *row, const float *x, int64_t K, float *out);
int lmx_ggml_matvec_avx512(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y);
/* Q4_K / Q5_K / Q6_K rows (K a multiple of 256) with AVX-512 VNNI, x in 30-bit integers a super-block at a time (in a
 * heap block of lmx_ggml_xq_bytes(K)): 1 when it computed them, 0 for any other type or K, or no memory */
int lmx_ggml_matvec_vnni(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const float *x, float *y);
/* lmx_ggml_xq_prepare and lmx_ggml_matvec_xq (AVX-512 VNNI; after lmx_ggml_xq_takes) */
void lmx_ggml_xq_prepare_vnni(int type, const float *x, int64_t K, void *xq);
void lmx_ggml_matvec_xq_vnni(int type, const void *w, int64_t K, int64_t n0, int64_t n1, const void *xq, float *y);
/* AVX-512 dequantization of the block types (bit-identical to the portable one): 1 if handled. */
int lmx_ggml_dequant_row_avx512(int type, const void *row, int64_t K, float *dst);
/* The same values, written as K / 16 chunks of 16 floats: chunk c at dst + c * cs (cs = 16 is the
 * plain row; a larger cs writes straight into the GEMM's packed weight layout, gemm.h). */
int lmx_ggml_dequant_chunks_avx512(int type, const void *row, int64_t K, float *dst, int64_t cs);
/* The portable dequantization (the reference the SIMD one is tested against). */
void lmx_ggml_dequant_row_portable(int type, const void *row, int64_t K, float *dst);

#endif
