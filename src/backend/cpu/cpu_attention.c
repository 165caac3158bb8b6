/* cpu_attention.c - causal attention of new query rows over cached and new keys.
 *
 * A task takes the query vectors that read one kv head's keys: up to CPU_ATTN_LANES of them (a few
 * positions of one sequence x the query heads of that kv head), so that each key and value row is
 * fetched from memory once for all of them.  The keys are walked in chunks (cpu_backend.h), which stay
 * in L1 while every query vector of the task takes its scores over the chunk (dot_rows_f32: 16 scores
 * a reduction); then each vector's softmax (the kernel table's attn_exp, float32 with the sum in
 * double); then the values in the same chunks (axpy_rows_f32, the output row in registers).
 *
 * Query row i = n_past + t sees positions j <= i (and i - j < window for sliding layers) that the
 * layer still holds: the cached ones at slot j % cap, then the new rows of this call.  So a task's
 * keys are up to three runs of consecutive rows (cached up to the ring's end, cached from its start,
 * new), and each vector takes the positions [its first, i] of them. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"

#define LANES_MAX 128 /* query vectors a task, at most */

typedef struct attn_job {
    cpu_backend *cb;
    const lmx_attn_args *a;
    int heads;      /* query heads a task (of the G = H / Hk that read one kv head) */
    int rows;       /* positions a task */
    int row_blocks; /* ceil(T / rows) */
    int chunk;      /* keys a chunk */
} attn_job;

typedef struct key_run {
    int p0, n;            /* positions p0 .. p0 + n - 1 */
    const float *k, *v;   /* position p0's row; the next at + Hk * D */
} key_run;

/* The runs of positions [p0, p1] of sequence b's kv head kvh: cached slots to the ring's end, cached
 * from its start, then this call's new rows (position n_past + u at row u). */
static int key_runs(const lmx_attn_args *a, int b, int kvh, int p0, int p1, key_run *run) {
    const lmx_kv_layer *kv = a->kv[b];
    const int n_past = a->batch->n_past[b];
    const int64_t ks = (int64_t)a->Hk * a->D, col = (int64_t)kvh * a->D;
    int nr = 0;
    for (int p = p0; p < n_past && p <= p1;) {
        const int slot = p % kv->cap, end = n_past - 1 < p1 ? n_past - 1 : p1;
        const int n = end - p + 1 < kv->cap - slot ? end - p + 1 : kv->cap - slot;
        run[nr++] = (key_run){p, n, (const float *)kv->k.data + slot * ks + col, (const float *)kv->v.data + slot * ks + col};
        p += n;
    }
    if (p1 >= n_past) {
        const int u0 = p0 > n_past ? p0 - n_past : 0;
        const int64_t row = ((int64_t)b * a->batch->T + u0) * ks + col;
        run[nr++] = (key_run){n_past + u0, p1 - n_past - u0 + 1, (const float *)a->k->data + row,
                              (const float *)a->v->data + row};
    }
    return nr;
}

static void attn_task(void *arg, int task, int thread) {
    const attn_job *j = arg;
    const lmx_attn_args *a = j->a;
    const lmx_cpu_kernels *kn = &j->cb->k;
    const lmx_batch *bt = a->batch;
    const int D = a->D, G = a->H / a->Hk, groups = G / j->heads;
    const int blk = task % j->row_blocks, hg = task / j->row_blocks % groups;
    const int kvh = task / j->row_blocks / groups % a->Hk, b = task / j->row_blocks / groups / a->Hk;
    const int h0 = kvh * G + hg * j->heads, t0 = blk * j->rows;
    const int t1 = t0 + j->rows < bt->T ? t0 + j->rows : bt->T, n_new = bt->n_new[b];
    const int64_t qs = (int64_t)a->H * D, ks = (int64_t)a->Hk * D;
    for (int t = t0 > n_new ? t0 : n_new; t < t1; t++) /* padding rows: a defined output, never read */
        memset((float *)a->out->data + ((int64_t)b * bt->T + t) * qs + (int64_t)h0 * D, 0,
               (size_t)j->heads * D * sizeof(float));
    const int tn = t1 < n_new ? t1 : n_new;
    if (t0 >= tn) return;

    /* the vectors: position i = n_past + t sees [first, i]; scores of position p at p - p0 of its row */
    const lmx_kv_layer *kv = a->kv[b];
    const int n_past = bt->n_past[b], held = kv->rotating && n_past > kv->cap ? kv->cap : n_past;
    const int nv = (tn - t0) * j->heads;
    int first[LANES_MAX], last[LANES_MAX];
    const float *q[LANES_MAX];
    float *out[LANES_MAX];
    int p0 = n_past + tn, p1 = 0;
    for (int v = 0; v < nv; v++) {
        const int t = t0 + v / j->heads, h = h0 + v % j->heads, i = n_past + t;
        int lo = kv->window > 0 ? i - kv->window + 1 : 0;
        if (lo < n_past - held) lo = n_past - held;
        first[v] = lo > 0 ? lo : 0, last[v] = i;
        q[v] = (const float *)a->q->data + ((int64_t)b * bt->T + t) * qs + (int64_t)h * D;
        out[v] = (float *)a->out->data + ((int64_t)b * bt->T + t) * qs + (int64_t)h * D;
        if (first[v] < p0) p0 = first[v];
        if (i > p1) p1 = i;
    }
    const int64_t span = p1 - p0 + 1;
    float *cbuf = j->cb->attn_scratch[thread], *sc = cbuf + (int64_t)j->chunk * D;
    key_run run[3];
    const int nr = key_runs(a, b, kvh, p0, p1, run);

    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (int v = 0; v < nv; v++) memset(out[v], 0, (size_t)D * sizeof(float));
        for (int r = 0; r < nr; r++)
            for (int c0 = run[r].p0; c0 < run[r].p0 + run[r].n; c0 += j->chunk) {
                const int c1 = c0 + j->chunk < run[r].p0 + run[r].n ? c0 + j->chunk : run[r].p0 + run[r].n;
                /* the chunk's rows, copied side by side where several vectors read them */
                const float *rows = (pass ? run[r].v : run[r].k) + (int64_t)(c0 - run[r].p0) * ks;
                int64_t stride = ks;
                if (nv > 1) cpu_attn_pack(cbuf, rows, ks, c1 - c0, D), rows = cbuf, stride = D;
                for (int v = 0; v < nv; v++) {
                    const int lo = c0 > first[v] ? c0 : first[v], hi = c1 - 1 < last[v] ? c1 - 1 : last[v];
                    if (lo > hi) continue;
                    const float *at = rows + (int64_t)(lo - c0) * stride;
                    float *s = sc + v * span + (lo - p0);
                    if (pass == 0) kn->dot_rows_f32(q[v], at, stride, hi - lo + 1, D, s);
                    else kn->axpy_rows_f32(out[v], s, at, stride, hi - lo + 1, D);
                }
            }
        if (pass == 0)
            for (int v = 0; v < nv; v++) {
                float *s = sc + v * span + (first[v] - p0);
                const double sum = kn->attn_exp(s, s, last[v] - first[v] + 1, a->scale, a->softcap);
                const float inv = (float)(1.0 / sum);
                for (int k = 0; k < last[v] - first[v] + 1; k++) s[k] *= inv;
            }
    }
}

lmx_status cpu_attention(lmx_backend *be, const lmx_attn_args *a) {
    cpu_backend *cb = (cpu_backend *)be;
    const lmx_batch *bt = a->batch;
    if (a->lse) return LMX_ERR_UNSUPPORTED; /* the cpu's attention backward recomputes it */
    if (a->H % a->Hk != 0)
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "attention: %d heads not a multiple of %d kv heads",
                           a->H, a->Hk);
    const int threads = lmx_pool_size(cb->pool), G = a->H / a->Hk;
    /* a kv head's G query heads in one task (at most LANES_MAX), or in fewer where that leaves under two
     * tasks a thread (one row of a model with one or two kv heads); then positions up to CPU_ATTN_LANES vectors */
    attn_job j = {.cb = cb, .a = a, .heads = G, .chunk = cpu_attn_chunk(a->D)};
    for (;;) {
        j.rows = j.heads >= CPU_ATTN_LANES ? 1 : CPU_ATTN_LANES / j.heads;
        if (j.rows > bt->T) j.rows = bt->T > 0 ? bt->T : 1;
        j.row_blocks = (bt->T + j.rows - 1) / j.rows;
        if (j.heads == 1 || (j.heads <= LANES_MAX && (int64_t)bt->B * a->H / j.heads * j.row_blocks >= 2 * threads))
            break;
        int h = j.heads - 1;
        while (G % h) h--;
        j.heads = h;
    }
    size_t need = 1;
    for (int b = 0; b < bt->B; b++) {
        size_t n = (size_t)bt->n_past[b] + (size_t)bt->T;
        if (n > need) need = n;
    }
    need = need * (size_t)j.rows * (size_t)j.heads + (size_t)j.chunk * (size_t)a->D; /* each vector's scores, a chunk */
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
    lmx_pool_run(cb->pool, bt->B * a->Hk * (G / j.heads) * j.row_blocks, attn_task, &j);
    return LMX_OK;
}
