/* cuda_gemv_any.cu - y[M, N] = x[M, K] @ w[N, K]^T (+ bias) for few rows of a weight in any format and shape
 * that cuda_gemv.cu's vector kernels do not take (2-bit, odd shapes): a warp a row, each element decoded on its
 * own (cuda_weights.h), up to GEMV_ANY_ROWS input rows a launch. */
#include "cuda_gemv.h"

#define GEMV_ANY_ROWS 8
__global__ void __launch_bounds__(256) k_gemv_any(const float *__restrict__ x, const wdesc d, const void *bias,
                                                  lmx_dtype bt, float *__restrict__ y, int N, int M) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int lane = threadIdx.x % 32;
    const int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    float acc[GEMV_ANY_ROWS];
#pragma unroll
    for (int m = 0; m < GEMV_ANY_ROWS; m++) acc[m] = 0.0f;
    for (int64_t k = lane; k < d.K; k += 32) {
        float wv = w_elem(d, n, k);
#pragma unroll
        for (int m = 0; m < GEMV_ANY_ROWS; m++)
            if (m < M) acc[m] = fmaf(wv, x[(size_t)m * d.K + k], acc[m]);
    }
#pragma unroll
    for (int m = 0; m < GEMV_ANY_ROWS; m++) {
        float s = cuda_warp_sum(acc[m]);
        if (lane == 0 && m < M) y[(size_t)m * N + n] = s + bias_at(bias, bt, n);
    }
}

lmx_status cuda_gemv_any(cuda_backend *cb, const lmx_tensor *w, const lmx_tensor *bias, float *y, const float *x,
                         int M) {
    const wdesc d = make_wdesc(w);
    const int N = (int)w->shape[0];
    for (int m0 = 0; m0 < M; m0 += GEMV_ANY_ROWS) {
        const int mc = M - m0 < GEMV_ANY_ROWS ? M - m0 : GEMV_ANY_ROWS;
        cuda_launch(cb, k_gemv_any, cuda_blocks(N, 8), 256, 0, x + (size_t)m0 * d.K, d,
                    (const void *)(bias ? bias->data : NULL), bias ? bias->dtype : LMX_DTYPE_F32, y + (size_t)m0 * N,
                    N, mc);
        lmx_status st = cuda_check_launch(cb, "matmul");
        if (st) return st;
    }
    return LMX_OK;
}
