/* quant.h - cpu kernels for MLX affine-quantized weights (see lmx_quant in backend.h).
 *
 * A row's dot product with x is computed per group g as
 *     scale_g * sum_k q_k x_k  +  bias_g * sum_k x_k
 * so the bias term needs only the per-group sums of x (xsum), computed once per x row. */
#ifndef LMX_BACKEND_CPU_QUANT_H
#define LMX_BACKEND_CPU_QUANT_H

#include <stdint.h>
#include "../backend.h"

/* dst[k] = dequantized w[row, k] for k < K. */
void lmx_dequant_row(const lmx_tensor *w, int64_t row, float *dst);

/* xsum[g] = sum of x over group g (K/group entries). */
void lmx_quant_xsum(const float *x, int64_t K, int group, float *xsum);

/* y[n] = x . w[n, :] for n in [n0, n1): one x row against packed rows (decode). */
typedef void (*lmx_qmatvec_fn)(const float *x, const float *xsum, const lmx_tensor *w, int64_t n0,
                               int64_t n1, float *y);

void lmx_qmatvec_scalar(const float *x, const float *xsum, const lmx_tensor *w, int64_t n0,
                        int64_t n1, float *y);
/* The AVX-512 version (bits 4 and 8; others fall back to scalar); NULL if not compiled in. */
lmx_qmatvec_fn lmx_qmatvec_avx512(void);

/* Scale or bias g of row `row` as float. */
float lmx_quant_param(const lmx_tensor *w, const void *params, int64_t row, int64_t g);

#endif
