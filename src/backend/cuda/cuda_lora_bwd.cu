/* cuda_lora_bwd.cu - the LoRA backward ops (backward.h): lora_bwd (dA, dB, and the input gradient or its factor
 * u = s dy B), lora_keep (the forward's shrink x A^T kept for it) and lora_dx (the input gradients of the pairs
 * that read one input, in one product).  cuda_backward.cu's ops table holds them. */
#include "cuda_internal.h"

extern "C" {
#include "../backward.h"
}

/* ---- LoRA: dx += s (dy B) A, dA += s (dy B)^T x, dB += s dy^T (x A^T) ------------------------------- */

/* f32 data on the TF32 tensor cores, as the forward lora op */
static lmx_status sgemm(cuda_backend *cb, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                        const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    return cuda_blas(cb, cublasGemmEx(cb->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &beta, c,
                                 CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                "lora backward");
}

/* bf16 operands (a bf16 keep of x), f32 output */
static lmx_status hgemm(cuda_backend *cb, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                        const __nv_bfloat16 *a, int lda, const __nv_bfloat16 *b, int ldb, float beta, float *c, int ldc) {
    return cuda_blas(cb, cublasGemmEx(cb->blas, ta, tb, m, n, k, &alpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, c,
                                 CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                "lora backward");
}

/* rows of one segment (consecutive sequences sharing pair p): t = x A^T (or xa, the forward's), u = s dy B
 * ([rows, r] each, column-major r x rows), then the three gradients.  x is f32 (TF32 products) or bf16
 * (x16: a bf16 keep; then A and u are narrowed into h16 for the two products that read x); dy is f32 or
 * bf16 (dy16: the tape's copy, which matmul backward reads too; then B and t are narrowed for the two
 * that read dy).  h16: bf16 room for A [r, K], u and t [rows, r] and B [N, r]. */
static lmx_status lora_segment_bwd(cuda_backend *cb, float *dx, float *da, float *db, const float *dy,
                                   const __nv_bfloat16 *dy16, const float *x, const __nv_bfloat16 *x16, int rows, int K,
                                   int N, const lmx_lora_pair *p, float *t, __nv_bfloat16 *h16, float dx_beta,
                                   const float *xa, float *uo) {
    const int r = (int)p->a.shape[0];
    const float *A = (const float *)p->a.data, *B = (const float *)p->b.data, s = p->scale;
    float *u = uo ? uo : t + (size_t)rows * r;
    __nv_bfloat16 *A16 = h16, *u16 = h16 ? A16 + (size_t)r * K : NULL, *t16 = h16 ? u16 + (size_t)rows * r : NULL;
    __nv_bfloat16 *B16 = h16 ? t16 + (size_t)rows * r : NULL;
    lmx_status st = LMX_OK;
    if (xa) {
        t = (float *)xa;
    } else if (x16) {
        st = cuda_narrow_bf16(cb, A16, A, (int64_t)r * K);
        if (!st) st = hgemm(cb, CUBLAS_OP_T, CUBLAS_OP_N, r, rows, K, 1.0f, A16, K, x16, K, 0.0f, t, r);
    } else {
        st = sgemm(cb, CUBLAS_OP_T, CUBLAS_OP_N, r, rows, K, 1.0f, A, K, x, K, 0.0f, t, r);
    }
    int fused = 0; /* u and dB in one read of dy (cuda_lora_udb.cu), where it takes the shapes */
    if (dy16 && !st) st = cuda_lora_udb(cb, u, db, dy16, B, t, rows, N, r, s, &fused);
    if (dy16 && !fused) { /* u = s dy B, dB [N, r] += s dy^T t */
        if (!st) st = cuda_narrow_bf16(cb, B16, B, (int64_t)N * r);
        if (!st) st = cuda_narrow_bf16(cb, t16, t, (int64_t)rows * r);
        if (!st) st = hgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, r, rows, N, s, B16, r, dy16, N, 0.0f, u, r);
        if (!st) st = hgemm(cb, CUBLAS_OP_N, CUBLAS_OP_T, r, N, rows, s, t16, r, dy16, N, 1.0f, db, r);
    } else if (!dy16) {
        if (!st) st = sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, r, rows, N, s, B, r, dy, N, 0.0f, u, r);
        if (!st) st = sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_T, r, N, rows, s, t, r, dy, N, 1.0f, db, r);
    }
    if (!st && x16) { /* dA [r, K] */
        st = cuda_narrow_bf16(cb, u16, u, (int64_t)rows * r);
        if (!st) st = hgemm(cb, CUBLAS_OP_N, CUBLAS_OP_T, K, r, rows, 1.0f, x16, K, u16, r, 1.0f, da, K);
    } else if (!st) {
        st = sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_T, K, r, rows, 1.0f, x, K, u, r, 1.0f, da, K);
    }
    if (!st && dx) st = sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, K, rows, r, 1.0f, A, K, u, r, dx_beta, dx, K);
    return st;
}

/* xa [B*T, r] of pairs of rank r (lora_keep, lora_bwd): its shape, checked */
static lmx_status lora_xa_check(lmx_backend *be, const lmx_tensor *xa, int B, int T, const lmx_lora_pair *const *pairs) {
    const int64_t r = xa->shape[xa->ndim - 1];
    if (xa->dtype != LMX_DTYPE_F32 || lmx_tensor_nelem(xa) != (int64_t)B * T * r)
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora: x A^T is not [%d, %lld] f32", B * T, (long long)r);
    for (int b = 0; b < B; b++)
        if (pairs[b] && pairs[b]->a.shape[0] != r)
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora: x A^T of rank %lld for a pair of rank %lld", (long long)r,
                               (long long)pairs[b]->a.shape[0]);
    return LMX_OK;
}

lmx_status cuda_bwd_lora_keep(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                                const lmx_lora_pair *const *pairs, lmx_tensor *xa) {
    lmx_status st = lora_xa_check(be, xa, B, T, pairs);
    return st ? st : cuda_lora_xa(be, y, x, B, T, pairs, (float *)xa->data);
}

lmx_status cuda_bwd_lora(lmx_backend *be, lmx_tensor *dx, lmx_tensor *const *da, lmx_tensor *const *db,
                           const lmx_tensor *dy, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs,
                           unsigned fresh, const lmx_tensor *xa, lmx_tensor *uo) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (!st && xa) st = lora_xa_check(be, xa, B, T, pairs);
    if (!st && uo) st = lora_xa_check(be, uo, B, T, pairs); /* u has xa's shape */
    for (int b = 0; !st && uo && b < B; b++)
        if (pairs[b] != pairs[0])
            st = lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora backward: u for rows of more than one pair");
    if (st) return st;
    const int64_t K = x->shape[x->ndim - 1], N = dy->shape[dy->ndim - 1];
    int64_t need = 0, rmax = 0;
    for (int b0 = 0; b0 < B;) { /* segments: consecutive sequences with one pair and one gradient */
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0] && da[b1] == da[b0] && db[b1] == db[b0]) b1++;
        const lmx_lora_pair *p = pairs[b0];
        if (p && !lmx_lora_pair_fits(p, K, N))
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora backward: pair of sequence %d does not fit [%lld -> %lld]",
                               b0, (long long)K, (long long)N);
        if (p && 2 * (int64_t)(b1 - b0) * T * p->a.shape[0] > need) need = 2 * (int64_t)(b1 - b0) * T * p->a.shape[0];
        if (p && p->a.shape[0] > rmax) rmax = p->a.shape[0];
        b0 = b1;
    }
    /* t and u [rows, r] f32, then with a bf16 x or dy the room lora_segment_bwd narrows into */
    const int half = x->dtype == LMX_DTYPE_BF16, dyb = dy->dtype == LMX_DTYPE_BF16;
    const size_t h16n = half || dyb ? (size_t)(rmax * K + need + rmax * N) : 0;
    float *t = need ? (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)need * sizeof(float) + h16n * 2) : NULL;
    if (need && !t) return cb->base.err.status;
    __nv_bfloat16 *h16 = h16n && need ? (__nv_bfloat16 *)(t + need) : NULL;
    for (int b0 = 0; b0 < B && !st;) {
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0] && da[b1] == da[b0] && db[b1] == db[b0]) b1++;
        const int64_t r0 = (int64_t)b0 * T;
        if (pairs[b0]) {
            st = lora_segment_bwd(cb, dx ? (float *)dx->data + r0 * K : NULL, (float *)da[b0]->data,
                                  (float *)db[b0]->data, dyb ? NULL : (const float *)dy->data + r0 * N,
                                  dyb ? (const __nv_bfloat16 *)dy->data + r0 * N : NULL,
                                  half ? NULL : (const float *)x->data + r0 * K,
                                  half ? (const __nv_bfloat16 *)x->data + r0 * K : NULL, (b1 - b0) * T, (int)K, (int)N,
                                  pairs[b0], t, h16, fresh & 1 ? 0.0f : 1.0f,
                                  xa ? (const float *)xa->data + r0 * pairs[b0]->a.shape[0] : NULL,
                                  uo ? (float *)uo->data + r0 * pairs[b0]->a.shape[0] : NULL);
        } else if (dx && (fresh & 1)) { /* no pair: a fresh dx's rows are zeros */
            const cudaError_t e = cudaMemsetAsync((float *)dx->data + r0 * K, 0, (size_t)(b1 - b0) * T * K * sizeof(float),
                                                  cb->stream);
            if (e != cudaSuccess) st = cuda_fail(cb, e, "lora backward");
        }
        b0 = b1;
    }
    return st;
}

/* Terms of lora_dx side by side, in one launch: A_i [r_i, K] one after another into a [rt, K], u_i [rows, r_i]
 * into the columns [off_i, off_i + r_i) of ut [rows, rt].  (A copy each, of A and of u's strided rows, took 2-7 us
 * apiece on the copy engine: about 30 us a call on the 8B, whose step makes 63.) */
#define LORA_DX_TERMS 8 /* terms a gather takes (the tape sends up to TAPE_DU, 4; more go in several products) */
struct lora_terms {
    const float *a[LORA_DX_TERMS], *u[LORA_DX_TERMS];
    int r[LORA_DX_TERMS], off[LORA_DX_TERMS + 1], n; /* off[n] = rt */
};
__global__ void k_lora_dx_gather(float *__restrict__ a, float *__restrict__ ut, const lora_terms g, int64_t K,
                                 int64_t rows) {
    const int rt = g.off[g.n];
    const int64_t na = rt * K, n = na + rows * rt;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < n; e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t f = e < na ? e / K : (e - na) % rt; /* A's row, or ut's column */
        int i = 0;
        while (i + 1 < g.n && f >= g.off[i + 1]) i++;
        if (e < na) a[e] = g.a[i][e - g.off[i] * K];
        else ut[e - na] = g.u[i][(e - na) / rt * g.r[i] + (f - g.off[i])];
    }
}

/* dx [rows, K] (+)= sum_i u[i] A_i (backward.h lora_dx): one TF32 product over the terms side by side (u's
 * columns and A's rows gathered in scratch: K = the ranks' sum), so that dx is read and written once */
lmx_status cuda_bwd_lora_dx(lmx_backend *be, lmx_tensor *dx, int count, const lmx_tensor *u,
                              const lmx_lora_pair *const *pairs, unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    const int64_t K = dx->shape[dx->ndim - 1], rows = lmx_tensor_nelem(dx) / K;
    int64_t rt = 0;
    for (int i = 0; i < count && !st; i++) {
        if (pairs[i]->a.shape[1] != K || lmx_tensor_nelem(&u[i]) != rows * pairs[i]->a.shape[0])
            st = lmx_err_set(&be->err, LMX_ERR_SHAPE, "lora dx: term %d does not fit [%lld, %lld]", i, (long long)rows,
                             (long long)K);
        rt += pairs[i]->a.shape[0];
    }
    if (!st && count < 1) st = lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "lora dx: no terms");
    if (st || rows <= 0) return st;
    const float beta = fresh & 1 ? 0.0f : 1.0f;
    if (count == 1)
        return sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)rows, (int)rt, 1.0f, (const float *)pairs[0]->a.data,
                     (int)K, (const float *)u[0].data, (int)rt, beta, (float *)dx->data, (int)K);
    float *a = (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)rt * (K + rows) * sizeof(float));
    if (!a) return cb->base.err.status;
    for (int c0 = 0; c0 < count && !st; c0 += LORA_DX_TERMS) { /* LORA_DX_TERMS at a time, added after the first */
        lora_terms g;
        g.n = count - c0 < LORA_DX_TERMS ? count - c0 : LORA_DX_TERMS, g.off[0] = 0;
        for (int i = 0; i < g.n; i++) {
            g.a[i] = (const float *)pairs[c0 + i]->a.data, g.u[i] = (const float *)u[c0 + i].data;
            g.r[i] = (int)pairs[c0 + i]->a.shape[0], g.off[i + 1] = g.off[i] + g.r[i];
        }
        const int rc = g.off[g.n];
        float *uc = a + (int64_t)rc * K; /* [rows, rc] */
        const int64_t n = rc * (K + rows);
        k_lora_dx_gather<<<cuda_ew_grid(n), 256, 0, cb->stream>>>(a, uc, g, K, rows);
        st = cuda_check_launch(cb, "lora dx");
        if (!st)
            st = sgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, (int)K, (int)rows, rc, 1.0f, a, (int)K, uc, rc, c0 ? 1.0f : beta,
                       (float *)dx->data, (int)K);
    }
    return st;
}
