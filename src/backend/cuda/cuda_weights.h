/* cuda_weights.h - any weight format read element by element on the GPU: a flat descriptor of a
 * weight (dense, MLX affine or GGUF blocks) and the decoding of one element.  Used where speed does
 * not matter much (embedding rows, dequantization for the prefill GEMM, the generic GEMV). */
#ifndef LMX_BACKEND_CUDA_WEIGHTS_H
#define LMX_BACKEND_CUDA_WEIGHTS_H

#include <string.h>

#include "cuda_internal.h"

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

static __device__ __forceinline__ float f16_at(const uint8_t *p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

/* Element e of one GGUF block (layouts in backend/cpu/ggml_quant.c). */
static __device__ float ggml_elem(int type, const uint8_t *b, int e) {
    switch (type) {
    case LMX_GGML_Q8_0: return (float)(int8_t)b[2 + e] * f16_at(b);
    case LMX_GGML_Q4_0: {
        int nib = e < 16 ? b[2 + e] & 15 : b[2 + e - 16] >> 4;
        return (float)(nib - 8) * f16_at(b);
    }
    case LMX_GGML_Q4_K: {
        int s = e / 32, c = e / 64, h = (e / 32) & 1, l = e % 32;
        const uint8_t *sc = b + 4;
        int scv, m;
        if (s < 4) { scv = sc[s] & 63; m = sc[s + 4] & 63; }
        else { scv = (sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4); m = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4); }
        int q = (b[16 + 32 * c + l] >> (4 * h)) & 15;
        return f16_at(b) * (float)scv * (float)q - f16_at(b + 2) * (float)m;
    }
    case LMX_GGML_Q6_K: {
        int a = e / 128, r = e % 128, i = r / 32, l = r % 32;
        const uint8_t *ql = b + 64 * a, *qh = b + 128 + 32 * a;
        int lo = (i & 1) ? ql[l + 32] : ql[l];
        lo = i >= 2 ? lo >> 4 : lo & 15;
        int q = (lo | (((qh[l] >> (2 * i)) & 3) << 4)) - 32;
        return f16_at(b + 208) * (float)(int8_t)b[192 + e / 16] * (float)q;
    }
    default: return 0.0f;
    }
}

/* Element (n, k) of any weight. */
static __device__ __forceinline__ float w_elem(const wdesc &d, int64_t n, int64_t k) {
    if (d.gtype)
        return ggml_elem(d.gtype, (const uint8_t *)d.data + n * d.row_bytes + (k / d.gelems) * d.gbytes,
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
