/* cpu_attention.c - causal attention of new query rows over cached and new keys.
 *
 * Keys and values are read as runs of consecutive rows (dot_rows_f32 / axpy_rows_f32 kernels:
 * 16 scores per reduction, the output row kept in registers over all values).
 * Work is split over (sequence, query head, block of query rows).  Each query row i = n_past+t
 * sees positions j with j <= i (and i - j < window for sliding layers): first the cached ones
 * still held by the layer's cache (slot j % cap), then the new rows of this call.  Scores are
 * kept in a per-thread buffer and normalised with a max-subtracted softmax in float32. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"

#define ROWS_PER_TASK 16

typedef struct attn_job {
    cpu_backend *cb;
    const lmx_attn_args *a;
    int row_blocks;          /* ceil(T / ROWS_PER_TASK) */
} attn_job;

double cpu_attn_exp(float *x, float *e, int n, float scale, float cap) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        float s = x[j] * scale;
        if (cap > 0) s = cap * tanhf(s / cap);
        x[j] = s;
        if (s > mx) mx = s;
    }
    double sum = 0;
    for (int j = 0; j < n; j++) {
        e[j] = expf(x[j] - mx);
        sum += e[j];
    }
    return sum;
}

static void attend_row(const cpu_backend *cb, const lmx_attn_args *a, int b, int h, int t,
                       float *scores) {
    const lmx_batch *bt = a->batch;
    const lmx_kv_layer *kv = a->kv[b];
    int D = a->D, kvh = h / (a->H / a->Hk);
    int64_t qrow = (int64_t)b * bt->T + t;
    int64_t kstride = (int64_t)a->Hk * D;
    const float *q = (const float *)a->q->data + qrow * a->H * D + (int64_t)h * D;
    float *out = (float *)a->out->data + qrow * a->H * D + (int64_t)h * D;

    int n_past = bt->n_past[b];
    int i = n_past + t;
    int lo = kv->window > 0 ? i - kv->window + 1 : 0;
    if (lo < 0) lo = 0;
    int held = kv->rotating ? (n_past < kv->cap ? n_past : kv->cap) : n_past;
    int c0 = n_past - held > lo ? n_past - held : lo; /* first cached position used */
    int u0 = lo > n_past ? lo - n_past : 0;           /* first new row used */
    int n_cached = n_past - c0 > 0 ? n_past - c0 : 0;
    int n = n_cached + (t - u0 + 1);

    /* the keys as up to three runs of consecutive rows: cached slots [slot0, cap), then [0, ..)
     * after the ring wraps, then the new rows of this call */
    const float *kc = kv->k.data, *vc = kv->v.data;
    int slot0 = n_cached ? c0 % kv->cap : 0;
    const float *kn = (const float *)a->k->data + (int64_t)b * bt->T * kstride + (int64_t)kvh * D;
    const float *vn = (const float *)a->v->data + (int64_t)b * bt->T * kstride + (int64_t)kvh * D;
    int64_t first = n_cached < kv->cap - slot0 ? n_cached : kv->cap - slot0, off[3] = {0, 0, 0};
    const float *ks[3], *vs[3];
    int len[3], ns = 0;
    if (first > 0) ks[ns] = kc, vs[ns] = vc, off[ns] = (int64_t)slot0 * kstride + (int64_t)kvh * D, len[ns++] = (int)first;
    if (n_cached - first > 0) ks[ns] = kc, vs[ns] = vc, off[ns] = (int64_t)kvh * D, len[ns++] = (int)(n_cached - first);
    ks[ns] = kn, vs[ns] = vn, off[ns] = (int64_t)u0 * kstride, len[ns++] = t - u0 + 1;

    for (int r = 0, j = 0; r < ns; j += len[r], r++)
        cb->k.dot_rows_f32(q, ks[r] + off[r], kstride, len[r], D, scores + j);
    double sum = cpu_attn_exp(scores, scores, n, a->scale, a->softcap);
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < n; j++) scores[j] *= inv;
    memset(out, 0, (size_t)D * sizeof(float));
    for (int r = 0, j = 0; r < ns; j += len[r], r++)
        cb->k.axpy_rows_f32(out, scores + j, vs[r] + off[r], kstride, len[r], D);
}

static void attn_task(void *arg, int task, int thread) {
    attn_job *j = arg;
    const lmx_attn_args *a = j->a;
    int blk = task % j->row_blocks;
    int bh = task / j->row_blocks;
    int h = bh % a->H, b = bh / a->H;
    int t0 = blk * ROWS_PER_TASK, t1 = t0 + ROWS_PER_TASK;
    if (t1 > a->batch->T) t1 = a->batch->T;
    int n_new = a->batch->n_new[b];
    for (int t = t0; t < t1; t++) {
        if (t >= n_new) { /* padding row: defined output, never read */
            int64_t row = (int64_t)b * a->batch->T + t;
            memset((float *)a->out->data + row * a->H * a->D + (int64_t)h * a->D, 0,
                   (size_t)a->D * sizeof(float));
            continue;
        }
        attend_row(j->cb, a, b, h, t, j->cb->attn_scratch[thread]);
    }
}

lmx_status cpu_attention(lmx_backend *be, const lmx_attn_args *a) {
    cpu_backend *cb = (cpu_backend *)be;
    const lmx_batch *bt = a->batch;
    if (a->lse) return LMX_ERR_UNSUPPORTED; /* the cpu's attention backward recomputes it */
    if (a->H % a->Hk != 0)
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "attention: %d heads not a multiple of %d kv heads",
                           a->H, a->Hk);
    size_t need = 1;
    for (int b = 0; b < bt->B; b++) {
        size_t n = (size_t)bt->n_past[b] + (size_t)bt->T;
        if (n > need) need = n;
    }
    int threads = lmx_pool_size(cb->pool);
    for (int t = 0; t < threads && t < CPU_MAX_THREADS; t++) {
        if (cb->attn_scratch_n[t] >= need) continue;
        size_t grow = (need + 1023) / 1024 * 1024; /* in steps, not once per decoded token */
        lmx_status st = lmx_backend_mem_check(be, (int64_t)(grow - cb->attn_scratch_n[t]) * (int64_t)sizeof(float));
        if (st) return lmx_err_prefix(&be->err, "attention");
        float *p = malloc(grow * sizeof(float));
        if (!p) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "attention: out of memory");
        lmx_backend_mem(be, (int64_t)(grow - cb->attn_scratch_n[t]) * (int64_t)sizeof(float));
        free(cb->attn_scratch[t]);
        cb->attn_scratch[t] = p;
        cb->attn_scratch_n[t] = grow;
    }
    attn_job j = {.cb = cb, .a = a, .row_blocks = (bt->T + ROWS_PER_TASK - 1) / ROWS_PER_TASK};
    lmx_pool_run(cb->pool, bt->B * a->H * j.row_blocks, attn_task, &j);
    return LMX_OK;
}
