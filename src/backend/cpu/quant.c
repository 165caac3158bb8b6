/* quant.c - portable kernels for MLX affine-quantized weights. */
#include "quant.h"

#include <string.h>

#include "../../base/half.h"

/* Weights, scales and biases point into the mapped file at any alignment (see lmx_load_u32). */
float lmx_quant_param(const lmx_tensor *w, const void *params, int64_t row, int64_t g) {
    return lmx_float_at(params, w->q.scale_dtype, row * (w->shape[1] / w->q.group) + g);
}

void lmx_dequant_row(const lmx_tensor *w, int64_t row, float *dst) {
    int bits = w->q.bits, per = 32 / bits, group = w->q.group;
    int64_t K = w->shape[1];
    uint32_t mask = (1u << bits) - 1u;
    const unsigned char *wr = (const unsigned char *)w->data + row * (K / per) * 4;
    for (int64_t g = 0; g < K / group; g++) {
        float s = lmx_quant_param(w, w->q.scales, row, g), b = lmx_quant_param(w, w->q.biases, row, g);
        for (int64_t k = g * group; k < (g + 1) * group; k++)
            dst[k] = (float)((lmx_load_u32(wr + 4 * (k / per)) >> ((k % per) * bits)) & mask) * s + b;
    }
}

void lmx_quant_xsum(const float *x, int64_t K, int group, float *xsum) {
    for (int64_t g = 0; g < K / group; g++) {
        float s = 0;
        for (int64_t k = g * group; k < (g + 1) * group; k++) s += x[k];
        xsum[g] = s;
    }
}

void lmx_qmatvec_scalar(const float *x, const float *xsum, const lmx_tensor *w, int64_t n0,
                        int64_t n1, float *y) {
    int bits = w->q.bits, per = 32 / bits, group = w->q.group;
    int64_t K = w->shape[1], G = K / group;
    uint32_t mask = (1u << bits) - 1u;
    for (int64_t n = n0; n < n1; n++) {
        const unsigned char *wr = (const unsigned char *)w->data + n * (K / per) * 4;
        float acc = 0;
        for (int64_t g = 0; g < G; g++) {
            float d = 0;
            for (int64_t k = g * group; k < (g + 1) * group; k++)
                d += (float)((lmx_load_u32(wr + 4 * (k / per)) >> ((k % per) * bits)) & mask) * x[k];
            acc += lmx_quant_param(w, w->q.scales, n, g) * d + lmx_quant_param(w, w->q.biases, n, g) * xsum[g];
        }
        y[n] = acc;
    }
}

#if !defined(LMX_HAVE_X86_SIMD)
lmx_qmatvec_fn lmx_qmatvec_avx512(void) { return NULL; }
#endif
