/* cpu_matmul.c - out[M, N] = x[M, K] @ w[N, K]^T (+ bias) on the cpu.
 *
 * Few rows (decode, small batches): the SIMD kernels stream each weight row once, split over
 * the thread pool by output rows (quantized weights: the fused dequantizing kernel, once per x
 * row).  Many rows (prefill): blocks of weight rows are widened (or dequantized) to float32 once
 * and multiplied with OpenBLAS sgemm, so conversion costs O(N*K) next to the O(M*N*K) product. */
#include <cblas.h>
#include <string.h>

#include "cpu_backend.h"

#define BLAS_MIN_ROWS 8              /* below this, the streaming kernels win */
#define BLAS_BLOCK_BYTES (8u << 20)  /* widened weight block for one sgemm call */
#define ROWS_PER_TASK_MIN 16

typedef struct matmul_job {
    const cpu_backend *cb;
    const float *x;
    const lmx_tensor *w;
    float *y;
    int M;
    int64_t K, N, n_begin, rows_per_task;
    float *widened;                  /* BLAS path: destination of widened rows */
    const float *xsum;               /* quantized: [M, K/group] per-group sums of x */
} matmul_job;

static lmx_matmul_rows_fn kernel_for(const cpu_backend *cb, lmx_dtype t) {
    switch (t) {
    case LMX_DTYPE_F32: return cb->k.matmul_f32;
    case LMX_DTYPE_BF16: return cb->k.matmul_bf16;
    case LMX_DTYPE_F16: return cb->k.matmul_f16;
    default: return NULL;
    }
}

static void matmul_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    int64_t n0 = j->n_begin + (int64_t)task * j->rows_per_task;
    int64_t n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    if (n0 >= n1) return;
    if (j->w->q.ggml_type) { /* GGUF blocks: one fused dot per row and x row */
        int type = j->w->q.ggml_type;
        size_t rb = lmx_ggml_row_bytes(type, j->K);
        for (int64_t n = n0; n < n1; n++) {
            const char *row = (const char *)j->w->data + (size_t)n * rb;
            for (int m = 0; m < j->M; m++) j->y[m * j->N + n] = lmx_ggml_dot_row(type, row, j->x + m * j->K, j->K);
        }
        return;
    }
    if (j->w->q.bits) {
        int64_t G = j->K / j->w->q.group;
        for (int m = 0; m < j->M; m++)
            j->cb->qmatvec(j->x + m * j->K, j->xsum + m * G, j->w, n0, n1, j->y + m * j->N);
        return;
    }
    lmx_matmul_rows_fn fn = kernel_for(j->cb, j->w->dtype);
    fn(j->x, j->K, j->M, j->K, j->w->data, n0, n1, j->y, j->N);
}

static void widen_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    int64_t n0 = j->n_begin + (int64_t)task * j->rows_per_task;
    int64_t n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    for (int64_t n = n0; n < n1; n++)
        cpu_row_to_f32(j->cb, j->widened + (n - j->n_begin) * j->K, j->w, n, j->K);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

static lmx_status matmul_blas(cpu_backend *cb, matmul_job *j) {
    if (j->w->dtype == LMX_DTYPE_F32) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, (int)j->N, (int)j->K, 1.0f,
                    j->x, (int)j->K, j->w->data, (int)j->K, 0.0f, j->y, (int)j->N);
        return LMX_OK;
    }
    int64_t block = BLAS_BLOCK_BYTES / (j->K * 4);
    if (block < 16) block = 16;
    if (block > j->N) block = j->N;
    j->widened = cpu_scratch(cb, 1, (size_t)(block * j->K));
    if (!j->widened) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cpu: out of memory in matmul");
    int threads = lmx_pool_size(cb->pool);
    for (int64_t n0 = 0; n0 < j->N; n0 += block) {
        int64_t nb = j->N - n0 < block ? j->N - n0 : block;
        j->n_begin = n0;
        j->rows_per_task = ceil_div(nb, threads);
        matmul_job sub = *j;
        sub.N = n0 + nb; /* widen_task clips to [n_begin, N) */
        lmx_pool_run(cb->pool, threads, widen_task, &sub);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, (int)nb, (int)j->K, 1.0f, j->x,
                    (int)j->K, j->widened, (int)j->K, 0.0f, j->y + n0, (int)j->N);
    }
    return LMX_OK;
}

lmx_status cpu_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                      const lmx_tensor *bias, int M) {
    cpu_backend *cb = (cpu_backend *)be;
    int64_t N = w->shape[0], K = w->shape[1];
    if (!w->q.bits && !w->q.ggml_type && !kernel_for(cb, w->dtype))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cpu: matmul on %s weights",
                           lmx_dtype_name(w->dtype));
    matmul_job j = {.cb = cb, .x = x->data, .w = w, .y = out->data, .M = M, .K = K, .N = N};
    if (w->q.bits && M < BLAS_MIN_ROWS) {
        int64_t G = K / w->q.group;
        float *xs = cpu_scratch(cb, 2, (size_t)(M * G));
        if (!xs) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: out of memory in matmul");
        for (int m = 0; m < M; m++) lmx_quant_xsum(j.x + m * K, K, w->q.group, xs + m * G);
        j.xsum = xs;
    }
    if (M >= BLAS_MIN_ROWS) {
        lmx_status st = matmul_blas(cb, &j);
        if (st != LMX_OK) return st;
    } else {
        int threads = lmx_pool_size(cb->pool);
        int64_t tasks = threads * 8;
        j.rows_per_task = ceil_div(N, tasks);
        if (j.rows_per_task < ROWS_PER_TASK_MIN) j.rows_per_task = ROWS_PER_TASK_MIN;
        lmx_pool_run(cb->pool, (int)ceil_div(N, j.rows_per_task), matmul_task, &j);
    }
    if (bias) {
        float *bf = cpu_scratch(cb, 0, (size_t)N);
        if (!bf) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: out of memory in matmul");
        cpu_row_to_f32(cb, bf, bias, 0, N);
        float *y = out->data;
        for (int m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[(int64_t)m * N + n] += bf[n];
    }
    return LMX_OK;
}
