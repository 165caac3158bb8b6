/* cuda_weights.h - any weight format read element by element on the GPU: a flat descriptor of a
 * weight (dense, MLX affine or GGUF blocks) and the decoding of one element.  Used where speed does
 * not matter much (embedding rows, dequantization for the prefill GEMM, the generic GEMV). */
#ifndef LMX_BACKEND_CUDA_WEIGHTS_H
#define LMX_BACKEND_CUDA_WEIGHTS_H

#include <string.h>

#include "cuda_internal.h"
#include "cuda_ggml.h"

/* ---- weight descriptors and per-element decoding ------------------------------------------- */

typedef struct wdesc {
    const void *data, *scales, *biases;
    lmx_dtype dtype, sdtype;
    int bits, group, gtype, gelems, gbytes;
    int64_t K, row_bytes, words_per_row, groups_per_row;
} wdesc;

static inline wdesc make_wdesc(const lmx_tensor *w) {
    wdesc d;
    memset(&d, 0, sizeof d);
    d.data = w->data;
    d.dtype = w->dtype;
    d.K = w->shape[w->ndim - 1];
    d.gtype = w->q.ggml_type;
    if (d.gtype) {
        d.gelems = lmx_ggml_block_elems(d.gtype);
        d.gbytes = lmx_ggml_block_bytes(d.gtype);
        d.row_bytes = (int64_t)lmx_ggml_row_bytes(d.gtype, d.K);
    }
    d.bits = w->q.bits;
    if (d.bits) {
        d.group = w->q.group;
        d.scales = w->q.scales;
        d.biases = w->q.biases;
        d.sdtype = w->q.scale_dtype;
        d.words_per_row = d.K * d.bits / 32;
        d.groups_per_row = d.K / d.group;
    }
    return d;
}

/* Element (n, k) of any weight. */
static __device__ __forceinline__ float w_elem(const wdesc &d, int64_t n, int64_t k) {
    if (d.gtype)
        return gq_elem(d.gtype, (const uint8_t *)d.data + n * d.row_bytes + (k / d.gelems) * d.gbytes,
                         (int)(k % d.gelems));
    if (d.bits) {
        int per = 32 / d.bits;
        uint32_t word = ((const uint32_t *)d.data)[n * d.words_per_row + k / per];
        uint32_t q = (word >> ((k % per) * d.bits)) & ((1u << d.bits) - 1u);
        int64_t g = n * d.groups_per_row + k / d.group;
        return (float)q * cuda_elem(d.scales, d.sdtype, g) + cuda_elem(d.biases, d.sdtype, g);
    }
    return cuda_elem(d.data, d.dtype, n * d.K + k);
}

#endif
