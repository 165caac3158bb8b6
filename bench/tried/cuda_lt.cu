/* cuda_lt.cu - training's backward GEMMs with the algorithm that ran fastest for their shape.
 *
 * cuBLAS's default choice for a GEMM is a heuristic; for the backward's shapes (dx += dy W, beta 1) it
 * leaves up to 20% on the table (bench/bench_gemm_lt.cu, an 8B model's shapes on the H100).  A training
 * step repeats its shapes every step, so the first time a shape comes, before its first product, cuBLAS's
 * default and the algorithms cuBLASLt's heuristic offers are each timed on it, and the fastest is kept for
 * the shape (cuda_lt_cache in the backend).  Inference does not come here: its prompt lengths vary, and a
 * timing round per length would cost more than it saves.
 *
 * Timing runs the product more than once into C.  Where it adds into C (beta != 0), C's values are copied
 * to host memory first and back after (once per shape: no device memory beyond the workspace).
 * A candidate replaces the default only where it is LT_MARGIN faster, and of candidates within LT_NEAR of
 * the fastest the heuristic's first is taken, so that runs choose alike unless two algorithms time within
 * the noise of each other.  LMX_CUDA_LT=0 keeps cuBLAS's default everywhere: bit for bit the same
 * products in every process (a resumed run's, for one). */
#include "cuda_internal.h"

#define LT_CANDIDATES 8
#define LT_WORKSPACE (32u << 20)
#define LT_MARGIN 0.97f /* a candidate's time at most this of the default's */
#define LT_NEAR 1.02f   /* within this of the fastest: taken in the heuristic's order */

static int lt_same(const cuda_lt_entry *e, const cuda_lt_problem *p) {
    return !memcmp(&e->p, p, sizeof *p);
}

/* descriptors of problem p (D = C's layout) */
static cublasStatus_t lt_describe(const cuda_lt_problem *p, cublasLtMatmulDesc_t *desc, cublasLtMatrixLayout_t *la,
                                  cublasLtMatrixLayout_t *lb, cublasLtMatrixLayout_t *lc) {
    *desc = NULL, *la = *lb = *lc = NULL;
    const cublasOperation_t ta = (cublasOperation_t)p->ta, tb = (cublasOperation_t)p->tb;
    cublasStatus_t s = cublasLtMatmulDescCreate(desc, (cublasComputeType_t)p->compute, CUDA_R_32F);
    if (!s) s = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (!s) s = cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (!s) s = cublasLtMatrixLayoutCreate(la, (cudaDataType)p->type, ta == CUBLAS_OP_N ? p->m : p->k, ta == CUBLAS_OP_N ? p->k : p->m, p->lda);
    if (!s) s = cublasLtMatrixLayoutCreate(lb, (cudaDataType)p->type, tb == CUBLAS_OP_N ? p->k : p->n, tb == CUBLAS_OP_N ? p->n : p->k, p->ldb);
    if (!s) s = cublasLtMatrixLayoutCreate(lc, CUDA_R_32F, p->m, p->n, p->ldc);
    return s;
}

static void lt_undescribe(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                          cublasLtMatrixLayout_t lc) {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
}

/* cuBLAS's default for the problem, D = C */
static cublasStatus_t lt_default(cuda_backend *cb, const cuda_lt_problem *p, float alpha, const void *A, const void *B,
                                 float beta, float *C) {
    return cublasGemmEx(cb->blas, (cublasOperation_t)p->ta, (cublasOperation_t)p->tb, p->m, p->n, p->k, &alpha, A,
                        (cudaDataType)p->type, p->lda, B, (cudaDataType)p->type, p->ldb, &beta, C, CUDA_R_32F, p->ldc,
                        (cublasComputeType_t)p->compute, CUBLAS_GEMM_DEFAULT);
}

/* milliseconds of the fastest of three runs of algorithm algo (NULL: cuBLAS's default) after one unmeasured,
 * each writing C (-1: it failed) */
static float lt_time(cuda_backend *cb, const cuda_lt_problem *p, const cublasLtMatmulAlgo_t *algo,
                     cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                     cublasLtMatrixLayout_t lc, float alpha, const void *A, const void *B, float beta, float *C) {
    float best = -1.0f;
    for (int r = 0; r < 4; r++) {
        cudaEventRecord(cb->lt_ev[0], cb->stream);
        const cublasStatus_t s = algo ? cublasLtMatmul(cb->lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, algo,
                                                       cb->lt_ws, LT_WORKSPACE, cb->stream)
                                      : lt_default(cb, p, alpha, A, B, beta, C);
        float ms;
        cudaEventRecord(cb->lt_ev[1], cb->stream);
        if (s != CUBLAS_STATUS_SUCCESS || cudaEventSynchronize(cb->lt_ev[1]) != cudaSuccess ||
            cudaEventElapsedTime(&ms, cb->lt_ev[0], cb->lt_ev[1]) != cudaSuccess)
            return -1.0f;
        if (r > 0 && (best < 0 || ms < best)) best = ms;
    }
    return best;
}

/* Time entry e's candidates, writing C.  e->state 1: a cuBLASLt algorithm is kept (e->algo), 2: cuBLAS's
 * default. */
static void lt_tune(cuda_backend *cb, cuda_lt_entry *e, float alpha, const void *A, const void *B, float beta, float *C) {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res[LT_CANDIDATES];
    float t[LT_CANDIDATES];
    int got = 0;
    const size_t ws = LT_WORKSPACE;
    cublasStatus_t s = lt_describe(&e->p, &desc, &la, &lb, &lc);
    if (!s) s = cublasLtMatmulPreferenceCreate(&pref);
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (!s) s = cublasLtMatmulAlgoGetHeuristic(cb->lt, desc, la, lb, lc, lc, pref, LT_CANDIDATES, res, &got);
    e->state = 2;
    const float t0 = s ? -1.0f : lt_time(cb, &e->p, NULL, desc, la, lb, lc, alpha, A, B, beta, C);
    float best = t0;
    for (int i = 0; i < got; i++) {
        t[i] = t0 < 0 || res[i].state != CUBLAS_STATUS_SUCCESS
                   ? -1.0f
                   : lt_time(cb, &e->p, &res[i].algo, desc, la, lb, lc, alpha, A, B, beta, C);
        if (t[i] >= 0 && t[i] < best) best = t[i];
    }
    for (int i = 0; t0 >= 0 && best < LT_MARGIN * t0 && i < got; i++)
        if (t[i] >= 0 && t[i] <= LT_NEAR * best) {
            e->algo = res[i].algo, e->state = 1;
            break;
        }
    cudaGetLastError(); /* a candidate that failed to launch leaves nothing behind */
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    lt_undescribe(desc, la, lb, lc);
}

/* The workspace and events, made at the first tuning (0: there are none and the default runs) */
static int lt_ready(cuda_backend *cb) {
    if (cb->lt_ws) return 1;
    if (!lmx_backend_mem_fits(&cb->base, LT_WORKSPACE)) return 0;
    if (!cb->lt && cublasLtCreate(&cb->lt) != CUBLAS_STATUS_SUCCESS) return cb->lt = NULL, 0;
    if (!cb->lt_ev[0] && (cudaEventCreate(&cb->lt_ev[0]) != cudaSuccess || cudaEventCreate(&cb->lt_ev[1]) != cudaSuccess))
        return cudaGetLastError(), 0;
    if (cudaMallocFromPoolAsync(&cb->lt_ws, LT_WORKSPACE, cb->pool, cb->stream) != cudaSuccess)
        return cb->lt_ws = NULL, cudaGetLastError(), 0;
    lmx_backend_mem(&cb->base, LT_WORKSPACE);
    return 1;
}

lmx_status cuda_lt_gemm(cuda_backend *cb, const cuda_lt_problem *p, float alpha, const void *A, const void *B, float beta,
                        float *C, const char *what) {
    cuda_lt_entry *e = NULL;
    for (int i = 0; i < cb->n_lt && !e; i++)
        if (lt_same(&cb->lt_cache[i], p)) e = &cb->lt_cache[i];
    if (!e && cb->n_lt < CUDA_LT_CACHE && !cb->lt_off) {
        e = &cb->lt_cache[cb->n_lt++];
        memset(e, 0, sizeof *e);
        e->p = *p;
    }
    if (e && e->state == 0 && lt_ready(cb)) { /* not timed yet: now, C's values kept in host memory meanwhile */
        const size_t bytes = p->beta1 ? (size_t)p->ldc * p->n * sizeof(float) : 0;
        void *keep = bytes ? malloc(bytes) : NULL;
        if (!bytes || (keep && cudaMemcpyAsync(keep, C, bytes, cudaMemcpyDeviceToHost, cb->stream) == cudaSuccess)) {
            lt_tune(cb, e, alpha, A, B, beta, C);
            if (bytes && cudaMemcpyAsync(C, keep, bytes, cudaMemcpyHostToDevice, cb->stream) != cudaSuccess) {
                free(keep);
                return cuda_fail(cb, cudaGetLastError(), what);
            }
            if (bytes) cudaStreamSynchronize(cb->stream); /* keep is read before it goes */
        }
        free(keep);
    }
    cublasStatus_t s;
    if (e && e->state == 1) {
        cublasLtMatmulDesc_t desc;
        cublasLtMatrixLayout_t la, lb, lc;
        s = lt_describe(p, &desc, &la, &lb, &lc);
        if (!s) s = cublasLtMatmul(cb->lt, desc, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &e->algo, cb->lt_ws,
                                   LT_WORKSPACE, cb->stream);
        lt_undescribe(desc, la, lb, lc);
    } else {
        s = lt_default(cb, p, alpha, A, B, beta, C);
    }
    return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, what);
}

void cuda_lt_free(cuda_backend *cb) {
    if (cb->lt_ws) cudaFreeAsync(cb->lt_ws, cb->stream), lmx_backend_mem(&cb->base, -(int64_t)LT_WORKSPACE);
    for (int i = 0; i < 2; i++)
        if (cb->lt_ev[i]) cudaEventDestroy(cb->lt_ev[i]);
    if (cb->lt) cublasLtDestroy(cb->lt);
    cb->lt_ws = NULL, cb->lt = NULL, cb->lt_ev[0] = cb->lt_ev[1] = NULL, cb->n_lt = 0;
}
