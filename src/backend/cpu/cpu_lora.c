/* cpu_lora.c - unmerged LoRA on the cpu: y += scale * B (A x) for each row of a sequence with a pair.
 *
 * Prefill and training (T > 1): the rows of consecutive sequences sharing a pair are one segment, and a
 * segment is two GEMMs (OpenBLAS): t = scale x A^T [rows, r], then y += t B^T.  Decode (one row a
 * sequence, each its own pair): per row the shrink t = A x (r dot products of length K, the row's r values
 * on the stack), then the expand y[n] += scale * (B[n, :] . t) over the N outputs, rows split over the
 * pool; a single row is split over its outputs instead, after one shrink. */
#include <cblas.h>

#include "cpu_backend.h"

typedef struct lora_job {
    const cpu_backend *cb;
    const float *x;           /* [M, K]: one row a sequence (decode) */
    float *y;                 /* [M, N] */
    int64_t K, N;
    int M, rows_per_task;
    const lmx_lora_pair *const *pairs; /* [M] */
    const float *t1;          /* single-row mode: the row's shrink [r], else NULL */
    int64_t n_per_task;
} lora_job;

static void shrink(const cpu_backend *cb, const lmx_lora_pair *p, const float *x, int64_t K, float *t) {
    int r = (int)p->a.shape[0];
    const float *A = p->a.data;
    for (int j = 0; j < r; j++) t[j] = p->scale * cb->k.dot_f32(A + (int64_t)j * K, x, K);
}

static void expand(const lmx_lora_pair *p, const float *t, float *y, int64_t n0, int64_t n1) {
    int r = (int)p->a.shape[0];
    const float *B = p->b.data;
    for (int64_t n = n0; n < n1; n++) {
        const float *bn = B + n * r;
        float acc = 0.0f;
        for (int j = 0; j < r; j++) acc += bn[j] * t[j];
        y[n] += acc;
    }
}

static void rows_task(void *arg, int task, int thread) {
    const lora_job *j = arg;
    float t[LMX_LORA_RANK_MAX];
    int m1 = (task + 1) * j->rows_per_task < j->M ? (task + 1) * j->rows_per_task : j->M;
    for (int m = task * j->rows_per_task; m < m1; m++) {
        const lmx_lora_pair *p = j->pairs[m];
        if (!p) continue;
        shrink(j->cb, p, j->x + (int64_t)m * j->K, j->K, t);
        expand(p, t, j->y + (int64_t)m * j->N, 0, j->N);
    }
}

static void cols_task(void *arg, int task, int thread) {
    const lora_job *j = arg;
    int64_t n0 = task * j->n_per_task, n1 = n0 + j->n_per_task < j->N ? n0 + j->n_per_task : j->N;
    if (n0 < n1) expand(j->pairs[0], j->t1, j->y, n0, n1);
}

/* rows [0, rows) of x [.., K] and y [.., N] share pair p: two GEMMs through t [rows, r] */
static lmx_status segment(cpu_backend *cb, const lmx_lora_pair *p, const float *x, float *y, int64_t rows, int64_t K,
                          int64_t N) {
    const int r = (int)p->a.shape[0];
    float *t = cpu_work(&cb->base, (size_t)rows * r, "cpu lora");
    if (!t) return cb->base.err.status;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, r, (int)K, p->scale, x, (int)K,
                (const float *)p->a.data, (int)K, 0.0f, t, r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, (int)N, r, 1.0f, t, r, (const float *)p->b.data, r,
                1.0f, y, (int)N);
    cpu_work_free(&cb->base, t, (size_t)rows * r);
    return LMX_OK;
}

lmx_status cpu_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs) {
    cpu_backend *cb = (cpu_backend *)be;
    int M = B * T;
    if (M <= 0) return LMX_OK;
    int64_t K = x->shape[x->ndim - 1], N = y->shape[y->ndim - 1];
    for (int b = 0; b < B; b++) {
        const lmx_lora_pair *p = pairs[b];
        if (p && !lmx_lora_pair_fits(p, K, N))
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "cpu lora: pair of sequence %d does not fit [%lld -> %lld]", b,
                               (long long)K, (long long)N);
    }
    for (int b0 = 0; T > 1 && b0 < B;) { /* segments: consecutive sequences with one pair */
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0]) b1++;
        const int64_t r0 = (int64_t)b0 * T;
        lmx_status st = pairs[b0] ? segment(cb, pairs[b0], (const float *)x->data + r0 * K, (float *)y->data + r0 * N,
                                            (int64_t)(b1 - b0) * T, K, N)
                                  : LMX_OK;
        if (st) return st;
        b0 = b1;
    }
    if (T > 1) return LMX_OK;
    int threads = lmx_pool_size(cb->pool);
    lora_job j = {.cb = cb, .x = x->data, .y = y->data, .K = K, .N = N, .M = M, .pairs = pairs};
    if (M == 1) { /* one row: shrink once, expand split over the outputs */
        float t[LMX_LORA_RANK_MAX];
        if (!pairs[0]) return LMX_OK;
        shrink(cb, pairs[0], j.x, K, t);
        j.t1 = t;
        int tasks = N >= 4096 ? threads : 1;
        j.n_per_task = (N + tasks - 1) / tasks;
        lmx_pool_run(cb->pool, tasks, cols_task, &j);
        return LMX_OK;
    }
    int tasks = M < threads ? M : threads;
    j.rows_per_task = (M + tasks - 1) / tasks;
    lmx_pool_run(cb->pool, tasks, rows_task, &j);
    return LMX_OK;
}
