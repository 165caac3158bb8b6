/* cuda_lora.cu - unmerged LoRA on the GPU: y += scale * B (A x) per sequence (backend.h, lora).
 *
 * Decode (one row per sequence, at most CUDA_LORA_SEQS sequences, inside the decode graph): two
 * launches in the spirit of Punica's SGMV, each sequence with its own pair or none:
 *   shrink  t[m, j] = scale_m * (A_m[j, :] . x[m, :])      one warp per (row, j), 16-byte loads
 *   expand  y[m, n] += B_m[n, :] . t[m, :]                  one thread per (row, output)
 * Prefill (many rows per sequence): the rows of consecutive sequences sharing a pair form one
 * segment, and each segment is two f32 cuBLAS GEMMs (t = x A^T, y += s t B^T).
 * The pairs' A and B are f32 [r, K] and [N, r] in device memory; t lives in a scratch slot. */
#include "cuda_internal.h"

typedef struct lora_seqs {
    const float *a[CUDA_LORA_SEQS];  /* [r, K] or NULL: the sequence has no pair */
    const float *b[CUDA_LORA_SEQS];  /* [N, r] */
    float scale[CUDA_LORA_SEQS];
    int r[CUDA_LORA_SEQS];
    int n, rmax;
} lora_seqs;

__global__ void k_lora_shrink(const float *x, float *t, int64_t K, lora_seqs s) {
    cuda_pdl_trigger();
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    int m = warp / s.rmax, j = warp % s.rmax;
    if (m >= s.n) return;
    const float *A = s.a[m];
    if (!A || j >= s.r[m]) return;
    const float *arow = A + (int64_t)j * K;
    cuda_pdl_wait();
    const float *xr = x + (int64_t)m * K;
    float acc = 0.0f;
    if ((K & 3) == 0) {
        const float4 *a4 = (const float4 *)arow, *x4 = (const float4 *)xr;
        for (int64_t k = lane; k < K / 4; k += 32) {
            float4 av = __ldg(a4 + k), xv = x4[k];
            acc += av.x * xv.x + av.y * xv.y + av.z * xv.z + av.w * xv.w;
        }
    } else {
        for (int64_t k = lane; k < K; k += 32) acc += __ldg(arow + k) * xr[k];
    }
    acc = cuda_warp_sum(acc);
    if (lane == 0) t[m * s.rmax + j] = s.scale[m] * acc;
}

__global__ void k_lora_expand(const float *t, float *y, int64_t N, lora_seqs s) {
    cuda_pdl_trigger();
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    int m = (int)(i / N);
    int64_t n = i % N;
    if (m >= s.n || !s.b[m]) return;
    const float *brow = s.b[m] + n * s.r[m];
    cuda_pdl_wait();
    const float *tm = t + m * s.rmax;
    float acc = 0.0f;
    for (int j = 0; j < s.r[m]; j++) acc += __ldg(brow + j) * tm[j];
    y[m * N + n] += acc;
}

lmx_status cuda_lora_decode(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t N, int B,
                            const lmx_lora_pair *const *pairs) {
    lora_seqs s;
    memset(&s, 0, sizeof s);
    s.n = B;
    s.rmax = 1;
    for (int b = 0; b < B; b++) {
        if (!pairs[b]) continue;
        s.a[b] = (const float *)pairs[b]->a.data;
        s.b[b] = (const float *)pairs[b]->b.data;
        s.scale[b] = pairs[b]->scale;
        s.r[b] = (int)pairs[b]->a.shape[0];
        if (s.r[b] > s.rmax) s.rmax = s.r[b];
    }
    float *t = (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)B * s.rmax * sizeof(float));
    if (!t) return cb->base.err.status;
    int warps = B * s.rmax;
    cuda_launch(cb, k_lora_shrink, cuda_blocks((int64_t)warps * 32, 256), 256, 0, x, t, K, s);
    cuda_launch(cb, k_lora_expand, cuda_blocks((int64_t)B * N, 256), 256, 0, (const float *)t, y, N, s);
    return cuda_check_launch(cb, "lora");
}

/* rows [r0, r0 + rows) share pair p: two f32 GEMMs (cuBLAS is column-major: a row-major [M, K] is
 * its K x M). */
static lmx_status lora_segment(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t N, int64_t r0,
                               int64_t rows, const lmx_lora_pair *p, float *t) {
    int r = (int)p->a.shape[0];
    const float one = 1.0f, zero = 0.0f, s = p->scale;
    cublasStatus_t st = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, r, (int)rows, (int)K, &one,
                                    (const float *)p->a.data, (int)K, x + r0 * K, (int)K, &zero, t, r);
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)rows, r, &s, (const float *)p->b.data, r, t, r,
                         &one, y + r0 * N, (int)N);
    return st == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, st, "lora gemm");
}

lmx_status cuda_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                     const lmx_lora_pair *const *pairs) {
    cuda_backend *cb = (cuda_backend *)be;
    int64_t K = x->shape[x->ndim - 1], N = y->shape[y->ndim - 1];
    for (int b = 0; b < B; b++) {
        const lmx_lora_pair *p = pairs[b];
        if (p && (p->a.dtype != LMX_DTYPE_F32 || p->b.dtype != LMX_DTYPE_F32 || p->a.shape[1] != K ||
                  p->b.shape[0] != N || p->b.shape[1] != p->a.shape[0]))
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "cuda lora: pair of sequence %d does not fit [%lld -> %lld]", b,
                               (long long)K, (long long)N);
    }
    if (T == 1 && B <= CUDA_LORA_SEQS)
        return cuda_lora_decode(cb, (float *)y->data, (const float *)x->data, K, N, B, pairs);
    int64_t seg_max = 0;
    for (int b0 = 0; b0 < B;) {
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0]) b1++;
        if (pairs[b0] && (int64_t)(b1 - b0) * T * pairs[b0]->a.shape[0] > seg_max)
            seg_max = (int64_t)(b1 - b0) * T * pairs[b0]->a.shape[0];
        b0 = b1;
    }
    float *t = seg_max ? (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)seg_max * sizeof(float)) : NULL;
    if (seg_max && !t) return cb->base.err.status;
    for (int b0 = 0; b0 < B;) {
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0]) b1++;
        if (pairs[b0]) {
            lmx_status st = lora_segment(cb, (float *)y->data, (const float *)x->data, K, N, (int64_t)b0 * T,
                                         (int64_t)(b1 - b0) * T, pairs[b0], t);
            if (st) return st;
        }
        b0 = b1;
    }
    return LMX_OK;
}
