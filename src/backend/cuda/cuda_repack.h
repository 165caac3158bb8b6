/* cuda_repack.h - GGUF Q4_0 / Q4_1 / Q4_K / Q8_0 weights written on upload as MLX groups of 32, Q6_K blocks
 * 16-byte aligned (cuda_repack.cu). */
#ifndef LMX_BACKEND_CUDA_REPACK_H
#define LMX_BACKEND_CUDA_REPACK_H

#include "cuda_internal.h"
#include "../../formats/ggml_types.h"

/* Whether an affine group's values q s + b, q in [0, qmax], stay inside f16's range (|v| < 65,504; NaN fails) when
 * an f16 kernel forms them as one fused multiply-add of the f16 s and b: the bound every f16 decode of a weight asks
 * (k_repack for the tensor-core GEMV's MLX groups, cuda_gemv_st_fits for k_gemv_st's Q4_K blocks).  The values are
 * linear in q, so the two ends decide. */
static __host__ __device__ __forceinline__ int cuda_f16_affine_fits(float qmax, float s, float b) {
    return fabsf(b) < 65504.0f && fabsf(fmaf(qmax, s, b)) < 65504.0f;
}

/* The MLX bits (4 or 8) the upload of w rewrites it as, or 0: it stays in its GGUF blocks (another type,
 * not a matrix, or LMX_CUDA_GGUF_REPACK=0). */
int cuda_repack_bits(const cuda_backend *cb, const lmx_tensor *w);
/* w's host blocks -> words [N, K * bits / 32] (bits: cuda_repack_bits), f16 scales and biases [N, K / 32]
 * (device blocks the caller made).  *ok 0 (with LMX_OK): some group's values do not fit f16 (cuda_f16_affine_fits
 * of its f16 scale and bias), and the caller keeps the GGUF blocks. */
lmx_status cuda_repack(cuda_backend *cb, const lmx_tensor *w, int bits, void *words, void *scales, void *biases,
                       int *ok);

/* The ggml type a GGUF type is stored as on the device: LMX_GGML_Q6_K_A16 for Q6_K (its blocks 16-byte aligned),
 * else the type itself.  cuda_weight_bytes counts the stored layout. */
int cuda_stored_ggml(int type);
/* w's host blocks (a type cuda_stored_ggml changes) into dst (cuda_weight_bytes(w) of device memory) in the
 * stored layout, through a staging buffer; it waits for the copies. */
lmx_status cuda_upload_aligned(cuda_backend *cb, const lmx_tensor *w, void *dst);
/* The same into host memory (mapped page-locked memory the kernels read over the bus). */
void cuda_host_aligned(const lmx_tensor *w, void *dst);

#endif
