/* kernels.h - CPU compute kernels, chosen at run time for the best instruction set present
 * (AVX-512 with BF16, AVX2+FMA+F16C, or portable C).  All arithmetic is float32; bf16 and f16
 * weights are widened exactly on the fly, never converted in bulk.
 *
 * Shapes: x [M, K] row-major with row stride ldx; w [N, K] row-major (the HF Linear layout);
 * y [M, N] with row stride ldy. */
#ifndef LMX_BACKEND_CPU_KERNELS_H
#define LMX_BACKEND_CPU_KERNELS_H

#include <stdint.h>
#include "../../base/dtype.h"

/* y[m, n] = sum_k x[m, k] * w[n, k]  for m in [0, M), n in [n0, n1).
 * w points at row 0 of the weight (element type given by the kernel). */
typedef void (*lmx_matmul_rows_fn)(const float *x, int64_t ldx, int M, int64_t K,
                                   const void *w, int64_t n0, int64_t n1,
                                   float *y, int64_t ldy);
/* Stored weights (w of the matmuls, src of the widenings) may sit at any address: they point into
 * a mapped file, whose format need not align them.  x, y and dst are the caller's float arrays. */

typedef struct lmx_cpu_kernels {
    const char *isa;                  /* "avx512", "avx2" or "scalar" */
    int ggml_simd;                    /* the GGUF block kernels' level (ggml_quant.h): the portable C but with avx512 */
    lmx_matmul_rows_fn matmul_f32;    /* w is float */
    lmx_matmul_rows_fn matmul_bf16;   /* w is uint16_t bf16 */
    lmx_matmul_rows_fn matmul_f16;    /* w is uint16_t IEEE half */
    float (*dot_f32)(const float *a, const float *b, int64_t n);
    /* dst[i] = widen(src[i]), src n bf16 / f16 values at any address */
    void (*bf16_to_f32)(float *dst, const void *src, int64_t n);
    void (*f16_to_f32)(float *dst, const void *src, int64_t n);
    /* y[i] += a * x[i] */
    void (*axpy_f32)(float *y, float a, const float *x, int64_t n);
    /* out[j] = a . rows[j * stride .. + n] for j < m  (attention scores over m keys) */
    void (*dot_rows_f32)(const float *a, const float *rows, int64_t stride, int m, int64_t n, float *out);
    /* sum of x[i]^2 accumulated in double (rmsnorm) */
    double (*sumsq_f32)(const float *x, int64_t n);
    /* y[i] += sum_j w[j] * rows[j * stride + i] for i < n, j < m  (attention-weighted values) */
    void (*axpy_rows_f32)(float *y, const float *w, const float *rows, int64_t stride, int m, int64_t n);
    /* One query row's softmax numerators (attention and its backward): x [n] holds the dot products
     * q . k and becomes the scores s = x * scale, soft-capped where cap > 0 (cap * tanh(s / cap));
     * e [n] (may be x) gets exp(s - max s); returns the sum of e, added in double. */
    double (*attn_exp)(float *x, float *e, int n, float scale, float cap);
} lmx_cpu_kernels;

/* Fill k with the best kernels this CPU supports.  force_isa: NULL/"" for auto, or "scalar",
 * "avx2", "avx512" to force one (falls back to the best available below it). */
void lmx_cpu_kernels_init(lmx_cpu_kernels *k, const char *force_isa);

/* The portable versions, for tests and fallbacks. */
void lmx_cpu_kernels_init_scalar(lmx_cpu_kernels *k);

/* Per-ISA tables; each returns 0 if the ISA was not compiled in. */
int lmx_cpu_kernels_init_avx2(lmx_cpu_kernels *k);
int lmx_cpu_kernels_init_avx512(lmx_cpu_kernels *k);

#endif
