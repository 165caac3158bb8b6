/* cuda_graph.cu - decode steps replayed as one CUDA graph.
 *
 * A decode step is ~18 small launches per layer; launched one by one they cost more than the
 * weight bytes they stream on small models.  The ops of the table below go through this file:
 *
 *   - a step starts at embed and ends at the next entry point that is not an op (read, write, ...)
 *     or the next embed;
 *   - a step whose ops all fit a graph (at most CUDA_G_MAX rows, one new row per sequence) runs
 *     eagerly while its ops are recorded (op kind, tensors, sizes, kv caches, attention layout:
 *     everything but the per-step token ids, n_past and n_new); at its end the record is captured
 *     into a graph whose kernels read those per-step values from the device array cb->dyn;
 *   - the next step compares each op with the record and launches nothing; once the step's first
 *     attention has matched, one small copy refreshes cb->dyn and the graph is launched, and the
 *     host checks the rest of the step while the GPU runs it.  On an op that differs, the matched
 *     ops are issued eagerly, the graph is dropped and recording goes on from there.
 *
 * Inside the graph every kernel is launched with programmatic dependent launch (Hopper): a kernel
 * is scheduled while its predecessor drains and starts streaming its weights before it waits for
 * the predecessor's results (cuda_internal.h).
 *
 * Pointers in the record are compared, never dereferenced before they matched the live call, and
 * every free of device memory (release, KV cache growth, scratch growth) drops the graph first, so a
 * freed and reused buffer cannot be replayed stale.  LMX_CUDA_GRAPH=0 turns graphs off, =1 keeps
 * them without the fusions, LMX_CUDA_PDL=0 launches their kernels plainly (A/B measurements). */
#include <stdlib.h>
#include <string.h>

#include "cuda_graph.h"

lmx_status cuda_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                        int n, float eps, float add_one);
lmx_status cuda_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n);
lmx_status cuda_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                    lmx_act act);
lmx_status cuda_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap);
lmx_status cuda_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s);
lmx_status cuda_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh, int hd,
                     const lmx_rope *rope);
lmx_status cuda_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                            int64_t n);

lmx_status cuda_graph_create(cuda_backend *cb) {
    const char *env = getenv("LMX_CUDA_GRAPH");
    if (env && env[0] == '0') return LMX_OK;
    if (cudaMalloc((void **)&cb->dyn, CUDA_DYN_N * sizeof(int)) != cudaSuccess) {
        cudaGetLastError();
        cb->dyn = NULL;
        return LMX_OK; /* no graphs */
    }
    cb->g = (cuda_graph *)calloc(1, sizeof *cb->g);
    if (!cb->g) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda backend: out of memory");
    cb->g->nofuse = env && env[0] == '1';
    const char *pdl = getenv("LMX_CUDA_PDL"); /* =0: plain launches (A/B measurements) */
    int cc = 0;
    cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, cb->device);
    cb->g->pdl = cc >= 9 && !(pdl && pdl[0] == '0');
    const char *af = getenv("LMX_CUDA_ATT_FOLD"); /* =0: the q/k norm + RoPE a launch of its own (A/B) */
    cb->g->att_fold = !(af && af[0] == '0');
    const char *gp = getenv("LMX_CUDA_GEMM_PAIR"); /* =0: k / v, gate / up as two GEMMs (A/B) */
    cb->g->gemm_pair = !(gp && gp[0] == '0');
    const char *ra = getenv("LMX_CUDA_READ_AHEAD"); /* =0: announced reads copied after the step (A/B) */
    cb->g->rd_off = ra && ra[0] == '0';
    cb->g->rd = -1;
    cb->g->ptab = (const void **)malloc(G_PTAB_CAP * sizeof(void *));
    if (!cb->g->ptab || cudaMalloc((void **)&cb->g->ptab_dev, G_PTAB_CAP * sizeof(void *)) != cudaSuccess) {
        cudaGetLastError();
        cb->g->ptab_dev = NULL; /* no batched GEMMs */
    }
    return LMX_OK;
}

void cuda_graph_drop(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    if (g && g->exec) {
        cudaStreamSynchronize(cb->stream); /* it may be running (launched early) */
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
    if (g) g->rd = -1;
}

void cuda_graph_destroy(cuda_backend *cb) {
    if (cb->g) {
        cuda_graph_drop(cb);
        free(cb->g->rec);
        free(cb->g->skip);
        free(cb->g->ptab);
        if (cb->g->ptab_dev) cudaFree(cb->g->ptab_dev);
        free(cb->g);
        cb->g = NULL;
    }
    if (cb->dyn) cudaFree(cb->dyn);
    cb->dyn = NULL;
}

static void tcopy(lmx_tensor *d, const lmx_tensor *s) {
    if (!s) return;
    d->dtype = s->dtype;
    d->ndim = s->ndim;
    for (int i = 0; i < 4; i++) d->shape[i] = s->shape[i];
    d->data = s->data;
    d->q.ggml_type = s->q.ggml_type;
    d->q.bits = s->q.bits;
    d->q.group = s->q.group;
    d->q.scale_dtype = s->q.scale_dtype;
    d->q.scales = s->q.scales;
    d->q.biases = s->q.biases;
}

static void rec_t(g_rec *r, int i, const lmx_tensor *t) {
    r->has[i] = t != NULL;
    tcopy(&r->t[i], t);
}

static lmx_status g_run_direct(cuda_backend *cb, g_rec *c, const int32_t *ids, const lmx_batch *bt,
                               lmx_kv_layer *const *kv, const int *rows);

lmx_status cuda_g_exec(cuda_backend *cb, g_rec *r) {
    cuda_graph *g = cb->g;
    const lmx_batch bt = g_rec_batch(g, r);
    return g_run_direct(cb, r, g->dyn + CUDA_DYN_IDS, &bt, r->kvp, r->rows);
}

/* The step's announced read (its first G_READ record; -1: none) when one matmul alone writes the tensor it
 * reads after it and the destination is host memory the device can write: that matmul's launch may then write
 * it there too (cb->mirror, cuda_gemv).  A soft-cap after the head (gemma2), or pageable memory: the read copies. */
static int g_mirror_plan(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    memset(&cb->mirror, 0, sizeof cb->mirror);
    int r = 0;
    while (r < g->n_rec && g->rec[r].op != G_READ) r++;
    if (r == g->n_rec) return -1;
    const void *y = g->rec[r].t[0].data;
    int writers = 0, w = -1;
    for (int j = r + 1; j < g->n_rec; j++)
        if (g->rec[j].t[0].data == y) writers++, w = j; /* t[0]: every op's output, or what it changes in place */
    void *d = NULL;
    if (writers != 1 || g->rec[w].op != G_MATMUL) return -1;
    if (cudaHostGetDevicePointer(&d, g->rec[r].t[1].data, 0) != cudaSuccess) { /* pageable */
        cudaGetLastError();
        return -1;
    }
    cb->mirror.y = y;
    cb->mirror.dptr = (float *)d;
    cb->mirror.n = (size_t)g->rec[r].n;
    return r;
}

/* One capture of the recorded step; retry: a failure that a scratch slot's growth may mend leaves g->failed
 * unset (the error cleared) for the caller to capture again. */
static void g_capture_once(cuda_backend *cb, int retry) {
    cuda_graph *g = cb->g;
    if (cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        g->failed = 1;
        return;
    }
    cb->dyn_on = 1;
    cb->pdl = g->pdl;
    g->ptab_n = 0; /* the exec that read the table is gone (cuda_graph_drop) */
    memset(g->skip, 0, (size_t)g->n_rec);
    const int rd = g_mirror_plan(cb);
    lmx_status st = LMX_OK;
    for (int i = 0; i < g->n_rec && st == LMX_OK;) {
        int used = 0;
        if (g->skip[i]) {
            i++;
            continue;
        }
        if (!g->nofuse) st = cuda_g_exec_fused(cb, i, &used);
        if (st == LMX_OK && used == 0) {
            st = cuda_g_exec(cb, &g->rec[i]);
            used = 1;
        }
        i += used;
    }
    cb->dyn_on = 0;
    cb->pdl = 0;
    const int mirrored = rd >= 0 && cb->mirror.taken;
    memset(&cb->mirror, 0, sizeof cb->mirror);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    if (st != LMX_OK || e != cudaSuccess || !graph) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        if (retry && cuda_scratch_catch_up(cb)) lmx_err_clear(&cb->base.err);
        else g->failed = 1;
        return;
    }
    cudaGraphExec_t ex = NULL;
    e = cudaGraphInstantiate(&ex, graph, 0);
    cudaGraphDestroy(graph);
    if (e == cudaSuccess && g->ptab_n) /* stream-ordered before the graph's first launch */
        e = cudaMemcpyAsync(g->ptab_dev, g->ptab, (size_t)g->ptab_n * sizeof(void *), cudaMemcpyHostToDevice, cb->stream);
    if (e != cudaSuccess) {
        if (ex) cudaGraphExecDestroy(ex);
        cudaGetLastError();
        g->failed = 1;
        return;
    }
    g->exec = ex;
    g->rd = mirrored ? rd : -1;
}

/* Capture the recorded step into a graph (nothing runs).  A fused launch may need a scratch slot larger than
 * the eager step made it (cuda_scratch): the slot grows after that capture, and the step is captured again. */
static void g_capture(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    cuda_graph_drop(cb);
    if (g->failed || g->n_rec == 0) return;
    for (int tries = 0; tries < 2 && !g->exec && !g->failed; tries++) g_capture_once(cb, tries == 0);
}

/* Issue the first n recorded ops eagerly (a replay that stopped matching). */
static lmx_status g_reissue(cuda_backend *cb, int n) {
    for (int i = 0; i < n; i++) {
        lmx_status st = cuda_g_exec(cb, &cb->g->rec[i]);
        if (st) return st;
    }
    return LMX_OK;
}

/* Refresh the step values on the device and launch the graph. */
static lmx_status g_launch(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    CUDA_TRY(cb, cudaMemcpyAsync(cb->dyn, g->dyn, sizeof g->dyn, cudaMemcpyHostToDevice, cb->stream),
             "graph step values");
    CUDA_TRY(cb, cudaGraphLaunch(g->exec, cb->stream), "graph launch");
    g->launched = 1;
    return LMX_OK;
}

void cuda_graph_step_off(cuda_backend *cb) {
    if (!cb->g) return;
    cb->g->mode = G_OFF; /* until the next step's embedding (g_op) */
    cb->g->n_rec = 0;    /* what this step recorded ran eagerly as it was recorded: nothing to capture */
}

lmx_status cuda_graph_flush(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    if (!g) return LMX_OK;
    lmx_status st = LMX_OK;
    if (g->mode == G_REPLAY && g->pos > 0) {
        if (g->pos == g->n_rec && g->exec) {
            if (!g->launched) st = g_launch(cb);
        } else {
            cuda_graph_drop(cb);
            st = g_reissue(cb, g->pos);
        }
    } else if (g->mode == G_REC) {
        g_capture(cb);
    }
    g->mode = G_OFF;
    g->pos = 0;
    g->in_step = 0;
    return st;
}

/* Keep this op's per-step values in the host copy; 0 if they contradict the step's earlier ops. */
static int g_stash(cuda_graph *g, const g_rec *r, const int32_t *ids, const lmx_batch *bt) {
    if (ids)
        for (int m = 0; m < r->M; m++) g->dyn[CUDA_DYN_IDS + m] = ids[m];
    if (bt) {
        if (g->have_batch) {
            for (int b = 0; b < bt->B; b++)
                if (g->dyn[CUDA_DYN_PAST + b] != bt->n_past[b] || g->dyn[CUDA_DYN_NEW + b] != bt->n_new[b]) return 0;
        } else {
            for (int b = 0; b < bt->B; b++) {
                g->dyn[CUDA_DYN_PAST + b] = bt->n_past[b];
                g->dyn[CUDA_DYN_NEW + b] = bt->n_new[b];
            }
            g->have_batch = 1;
        }
    }
    return 1;
}

static int g_fits(const g_rec *r) {
    if (r->op == G_EMBED || r->op == G_MATMUL || r->op == G_GATHER || r->op == G_MOE) return r->M >= 1 && r->M <= CUDA_G_MAX;
    if (r->op == G_ROPE || r->op == G_ATTENTION || r->op == G_KV_APPEND || r->op == G_LORA)
        return r->T == 1 && r->B >= 1 && r->B <= CUDA_G_MAX;
    return 1;
}

/* The graph side of every op: compare with the record (replay), or record.  *absorbed = 1 when a
 * replay took the op (nothing to run now). */
static lmx_status g_op(cuda_backend *cb, const g_rec *r, const int32_t *ids, const lmx_batch *bt, int *absorbed) {
    cuda_graph *g = cb->g;
    lmx_status st;
    int fits = g_fits(r);
    *absorbed = 0;
    if (r->op == G_EMBED && (!g->in_step || r->t[1].data == g->step_table)) { /* a step begins */
        if ((st = cuda_graph_flush(cb))) return st;
        g->in_step = 1;
        g->step_table = r->t[1].data;
        g->have_batch = 0;
        g->launched = 0;
        g->mode = !fits || g->failed ? G_OFF : g->exec ? G_REPLAY : G_REC;
        if (g->mode == G_REC) g->n_rec = 0;
    }
    if (g->mode == G_REPLAY) {
        if (fits && g->pos < g->n_rec && g_rec_same(r, &g->rec[g->pos]) && g_stash(g, r, ids, bt)) {
            g->pos++;
            *absorbed = 1;
            /* From the first attention on, the step's token ids, positions and KV caches are the ones
             * recorded, and any memory the graph uses is still allocated (frees drop the graph): launch
             * it now, while the host checks the rest of the step.  A later difference is an attention
             * split count (the graph's result is the same) or something unforeseen; either way the
             * matched ops are issued again eagerly and rewrite the same values. */
            if (r->op == G_ATTENTION && !g->launched) return g_launch(cb);
            return LMX_OK;
        }
        /* the step left the recorded path: run what matched, record from here */
        cuda_graph_drop(cb);
        g->mode = G_REC;
        g->n_rec = g->pos;
        g->pos = 0;
        if ((st = g_reissue(cb, g->n_rec))) {
            g->mode = G_OFF;
            g->n_rec = 0;
            return st;
        }
    }
    if (g->mode == G_REC) {
        if (!fits) {
            g->mode = G_OFF;
            g->n_rec = 0;
        } else {
            if (g->n_rec == g->cap_rec) {
                int cap = g->cap_rec ? 2 * g->cap_rec : 1024;
                g_rec *nr = (g_rec *)realloc(g->rec, (size_t)cap * sizeof *nr);
                if (nr) g->rec = nr;
                unsigned char *ns = nr ? (unsigned char *)realloc(g->skip, (size_t)cap) : NULL;
                if (ns) g->skip = ns;
                if (!nr || !ns) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda graph: out of memory");
                g->cap_rec = cap;
            }
            g_rec_copy(&g->rec[g->n_rec++], r);
            if (!g_stash(g, r, ids, bt)) { /* inconsistent batches within a step: no graph */
                g->mode = G_OFF;
                g->n_rec = 0;
            }
        }
    }
    return LMX_OK;
}

/* ---- the wrapped ops --------------------------------------------------------------------------- */

/* Run r now with the caller's per-step values. */
static lmx_status g_run_direct(cuda_backend *cb, g_rec *c, const int32_t *ids, const lmx_batch *bt,
                               lmx_kv_layer *const *kv, const int *rows) {
    lmx_backend *be = &cb->base;
    switch (c->op) {
    case G_EMBED: return cuda_embed_rows(cb, (float *)c->t[0].data, &c->t[1], ids, c->M, c->f0);
    case G_RMSNORM: return cuda_rmsnorm(be, &c->t[0], &c->t[1], &c->t[2], c->M, (int)c->n, c->f0, c->f1);
    case G_MATMUL: return cuda_matmul(be, &c->t[0], &c->t[1], &c->t[2], c->has[3] ? &c->t[3] : NULL, c->M);
    case G_ADD: return cuda_add(be, &c->t[0], &c->t[1], c->n);
    case G_GLU: return cuda_glu(be, &c->t[0], &c->t[1], &c->t[2], c->n, (lmx_act)c->i0);
    case G_SOFTCAP: return cuda_softcap(be, &c->t[0], c->n, c->f0);
    case G_SCALE: return cuda_scale(be, &c->t[0], c->n, c->f0);
    case G_MOE: {
        const lmx_moe_args a = g_moe_args(c, &c->t[1]);
        return cuda_moe(be, &a);
    }
    case G_ROPE: return cuda_rope(be, &c->t[0], bt, c->i0, c->i1, &c->rope);
    case G_ATTENTION: {
        const lmx_attn_args a = g_attn_args(c, bt, kv);
        return cuda_attention(be, &a);
    }
    case G_KV_APPEND: return cuda_kv_append(be, kv, bt, &c->t[0], &c->t[1]);
    case G_GATHER: return cuda_gather_rows(be, &c->t[0], &c->t[1], rows, c->M, c->n);
    case G_READ: return LMX_OK; /* an announcement (g_mirror_plan) */
    case G_LORA: {
        const lmx_lora_pair *pairs[CUDA_G_MAX];
        for (int b = 0; b < c->B; b++) pairs[b] = c->lora[b].a.data ? &c->lora[b] : NULL;
        return cuda_lora(be, &c->t[0], &c->t[1], c->B, c->T, pairs);
    }
    }
    return lmx_err_set(&be->err, LMX_ERR_BACKEND, "cuda: unknown op %d", c->op);
}

/* Every op: offered to the graph side when graphs are on, run now unless a replay absorbed it. */
static lmx_status g_dispatch(cuda_backend *cb, g_rec *r, const int32_t *ids, const lmx_batch *bt,
                             lmx_kv_layer *const *kv, const int *rows) {
    if (cb->g) {
        int absorbed = 0;
        lmx_status st = g_op(cb, r, ids, bt, &absorbed);
        if (st || absorbed) return st;
    }
    return g_run_direct(cb, r, ids, bt, kv, rows);
}

static lmx_status w_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids, int M,
                          float scale) {
    cuda_backend *cb = (cuda_backend *)be;
    int64_t V = table->shape[0];
    for (int m = 0; m < M; m++)
        if (ids[m] < 0 || ids[m] >= V)
            return lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "token id %d outside vocabulary [0, %lld)", ids[m],
                               (long long)V);
    if (M <= 0) return LMX_OK;
    g_rec r;
    g_rec_clear(&r);
    r.op = G_EMBED;
    r.M = M;
    r.f0 = scale;
    rec_t(&r, 0, out);
    rec_t(&r, 1, table);
    return g_dispatch(cb, &r, ids, NULL, NULL, NULL);
}

static lmx_status w_read_ahead(lmx_backend *be, const lmx_tensor *t, void *dst, size_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb->g || cb->g->rd_off || !dst || !n) return LMX_OK;
    g_rec r;
    g_rec_clear(&r);
    r.op = G_READ;
    r.n = (int64_t)n;
    rec_t(&r, 0, t);
    r.t[1].data = dst;
    return g_dispatch(cb, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                            int n, float eps, float add_one) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_RMSNORM;
    r.M = rows;
    r.n = n;
    r.f0 = eps;
    r.f1 = add_one;
    rec_t(&r, 0, out);
    rec_t(&r, 1, x);
    rec_t(&r, 2, w);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                           const lmx_tensor *bias, int M) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_MATMUL;
    r.M = M;
    rec_t(&r, 0, out);
    rec_t(&r, 1, x);
    rec_t(&r, 2, w);
    rec_t(&r, 3, bias);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_ADD;
    r.n = n;
    rec_t(&r, 0, y);
    rec_t(&r, 1, x);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                        lmx_act act) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_GLU;
    r.n = n;
    r.i0 = (int)act;
    rec_t(&r, 0, out);
    rec_t(&r, 1, gate);
    rec_t(&r, 2, up);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

/* an in-place op on n values of x with one parameter f (softcap, scale) */
static lmx_status w_in_place(lmx_backend *be, int op, lmx_tensor *x, int64_t n, float f) {
    g_rec r;
    g_rec_clear(&r);
    r.op = op;
    r.n = n;
    r.f0 = f;
    rec_t(&r, 0, x);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_moe(lmx_backend *be, const lmx_moe_args *a) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cuda_moe_takes(cb, a)) {
        if (!cuda_moe_grouped_takes(cb, a)) return LMX_ERR_UNSUPPORTED; /* nothing recorded: the host routes */
        lmx_status st = cuda_graph_flush(cb); /* not a graph op: what is recorded runs first */
        cuda_graph_step_off(cb); /* eager: the grouped GEMMs' host waits for each round's counts, and a decode graph
                                    takes at most CUDA_G_MAX rows */
        return st ? st : cuda_moe_grouped(be, a);
    }
    g_rec r;
    g_rec_clear(&r);
    r.op = G_MOE;
    r.M = a->M;
    r.i0 = a->E;
    r.i1 = a->K;
    r.i2 = a->norm_topk;
    r.f0 = a->logit_scale;
    r.act = (int)a->act;
    r.experts = a->experts;
    r.escale = a->expert_scale;
    rec_t(&r, 0, a->out);
    rec_t(&r, 1, a->x);
    rec_t(&r, 2, a->logits);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static void rec_batch(g_rec *r, const lmx_batch *bt) {
    r->B = bt->B;
    r->T = bt->T;
    g_rec_clear_seq(r, bt->B);
}

static lmx_status w_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh, int hd,
                         const lmx_rope *rope) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_ROPE;
    rec_batch(&r, batch);
    r.i0 = nh;
    r.i1 = hd;
    r.rope.rot_dim = rope->rot_dim;
    r.rope.interleaved = rope->interleaved;
    r.rope.inv_freq = rope->inv_freq;
    r.rope.attn_factor = rope->attn_factor;
    rec_t(&r, 0, x);
    return g_dispatch((cuda_backend *)be, &r, NULL, batch, NULL, NULL);
}

static void rec_kv(g_rec *r, lmx_kv_layer *const *kv, int B) {
    if (B > CUDA_G_MAX) return; /* not graphable anyway */
    for (int b = 0; b < B; b++) {
        r->kvp[b] = kv[b];
        r->kd[b] = kv[b]->k.data;
        r->vd[b] = kv[b]->v.data;
        r->cap[b] = kv[b]->cap;
        r->rot[b] = kv[b]->rotating;
        r->win[b] = kv[b]->window;
    }
}

static lmx_status w_attention(lmx_backend *be, const lmx_attn_args *a) {
    cuda_backend *cb = (cuda_backend *)be;
    g_rec r;
    g_rec_clear(&r);
    r.op = G_ATTENTION;
    rec_batch(&r, a->batch);
    r.i0 = a->H;
    r.i1 = a->Hk;
    r.i2 = a->D;
    r.f0 = a->scale;
    r.f1 = a->softcap;
    rec_t(&r, 0, a->out);
    rec_t(&r, 1, a->q);
    rec_t(&r, 2, a->k);
    rec_t(&r, 3, a->v);
    rec_kv(&r, a->kv, a->batch->B);
    if (a->batch->T < 32 && a->batch->B <= CUDA_G_MAX && a->Hk > 0 && a->H % a->Hk == 0)
        r.splits = cuda_attention_plan(cb, a, 0, a->batch->B);
    return g_dispatch(cb, &r, NULL, a->batch, a->kv, NULL);
}

static lmx_status w_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *batch,
                              const lmx_tensor *k, const lmx_tensor *v) {
    for (int b = 0; b < batch->B; b++) {
        const lmx_kv_layer *c = kv[b];
        if (batch->n_new[b] > 0 && !c->rotating && batch->n_past[b] + batch->n_new[b] > c->cap)
            return lmx_err_set(&be->err, LMX_ERR_CONTEXT_FULL, "KV cache holds %d positions, need %d", c->cap,
                               batch->n_past[b] + batch->n_new[b]);
    }
    g_rec r;
    g_rec_clear(&r);
    r.op = G_KV_APPEND;
    rec_batch(&r, batch);
    rec_t(&r, 0, k);
    rec_t(&r, 1, v);
    rec_kv(&r, kv, batch->B);
    return g_dispatch((cuda_backend *)be, &r, NULL, batch, kv, NULL);
}

static lmx_status w_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                                int64_t n) {
    g_rec r;
    g_rec_clear(&r);
    r.op = G_GATHER;
    r.M = R;
    g_rec_clear_seq(&r, R);
    r.n = n;
    rec_t(&r, 0, out);
    rec_t(&r, 1, x);
    if (R <= CUDA_G_MAX)
        for (int i = 0; i < R; i++) r.rows[i] = rows[i];
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, rows);
}

static lmx_status w_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                         const lmx_lora_pair *const *pairs) {
    cuda_backend *cb = (cuda_backend *)be;
    g_rec r;
    g_rec_clear(&r);
    r.op = G_LORA;
    r.M = B * T;
    r.B = B;
    g_rec_clear_seq(&r, B);
    r.T = T;
    if (B > CUDA_G_MAX || T != 1) { /* never graphed (the record cannot hold the pairs): leave graph mode */
        int absorbed = 0;
        lmx_status st = cb->g ? g_op(cb, &r, NULL, NULL, &absorbed) : LMX_OK;
        return st ? st : cuda_lora(be, y, x, B, T, pairs);
    }
    rec_t(&r, 0, y);
    rec_t(&r, 1, x);
    for (int b = 0; b < B; b++)
        if (pairs[b]) {
            tcopy(&r.lora[b].a, &pairs[b]->a);
            tcopy(&r.lora[b].b, &pairs[b]->b);
            r.lora[b].scale = pairs[b]->scale;
        }
    return g_dispatch(cb, &r, NULL, NULL, NULL, NULL);
}

/* The table entries (cuda_backend.cu). */
lmx_status cuda_op_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                        const lmx_lora_pair *const *pairs) {
    if (x->dtype == LMX_DTYPE_F32 && y->dtype == LMX_DTYPE_F32) return w_lora(be, y, x, B, T, pairs);
    lmx_status st = cuda_graph_flush((cuda_backend *)be); /* training's bf16 keep: never in a decode graph */
    return st ? st : cuda_lora(be, y, x, B, T, pairs);
}
lmx_status cuda_op_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *t, const int32_t *ids, int M, float s) {
    return w_embed(be, out, t, ids, M, s);
}
lmx_status cuda_op_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                           int n, float eps, float add_one) {
    return w_rmsnorm(be, out, x, w, rows, n, eps, add_one);
}
lmx_status cuda_op_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                          const lmx_tensor *bias, int M) {
    if (x->dtype == LMX_DTYPE_F32 && out->dtype == LMX_DTYPE_F32) return w_matmul(be, out, x, w, bias, M);
    lmx_status st = cuda_graph_flush((cuda_backend *)be); /* training's bf16 keep or output: never in a decode graph */
    return st ? st : cuda_matmul(be, out, x, w, bias, M);
}
lmx_status cuda_op_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) { return w_add(be, y, x, n); }
lmx_status cuda_op_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *g, const lmx_tensor *u, int64_t n,
                       lmx_act act) {
    const int f32 = g->dtype == LMX_DTYPE_F32 && u->dtype == LMX_DTYPE_F32;
    if (out->dtype == LMX_DTYPE_F32 && f32) return w_glu(be, out, g, u, n, act);
    cuda_backend *cb = (cuda_backend *)be; /* bf16 activations (backend.h, model.h mlp16): never in a decode graph */
    lmx_status st = cuda_graph_flush(cb);
    const int o16 = out->dtype == LMX_DTYPE_BF16, in16 = g->dtype == LMX_DTYPE_BF16 && u->dtype == LMX_DTYPE_BF16;
    if (!st && ((!o16 && out->dtype != LMX_DTYPE_F32) || (!f32 && !in16)))
        st = lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda glu: gate and up of one dtype, f32 or bf16, into f32 or bf16");
    if (st) return st;
    if (in16)
        return cuda_glu_of16(cb, out->data, o16, (const __nv_bfloat16 *)g->data, (const __nv_bfloat16 *)u->data, n, (int)act);
    return cuda_glu_bf16(cb, (__nv_bfloat16 *)out->data, (const float *)g->data, (const float *)u->data, n, (int)act);
}
lmx_status cuda_op_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) { return w_in_place(be, G_SOFTCAP, x, n, cap); }
lmx_status cuda_op_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s) { return w_in_place(be, G_SCALE, x, n, s); }
lmx_status cuda_op_moe(lmx_backend *be, const lmx_moe_args *a) { return w_moe(be, a); }
lmx_status cuda_op_read_ahead(lmx_backend *be, const lmx_tensor *t, void *dst, size_t n) {
    return w_read_ahead(be, t, dst, n);
}

/* The captured graph's G_READ record whose read its launches write into host memory (g->rd), or NULL. */
static const g_rec *g_mirrored_read(const cuda_graph *g) {
    return g && g->exec && g->rd >= 0 && g->rd < g->n_rec ? &g->rec[g->rd] : NULL;
}

int cuda_graph_writes_read(const cuda_backend *cb, const lmx_tensor *t, size_t off, const void *dst, size_t n) {
    const g_rec *r = g_mirrored_read(cb->g); /* this step's own announcement once the whole step matched */
    return r && cb->g->mode == G_REPLAY && cb->g->pos == cb->g->n_rec && t->data == r->t[0].data && !off &&
           dst == r->t[1].data && n == (size_t)r->n;
}

void cuda_graph_forget_host(cuda_backend *cb, const void *p) {
    const g_rec *r = g_mirrored_read(cb->g);
    if (r && r->t[1].data == p) cuda_graph_drop(cb);
}
lmx_status cuda_op_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *b, int nh, int hd, const lmx_rope *rope) {
    return w_rope(be, x, b, nh, hd, rope);
}
lmx_status cuda_op_attention(lmx_backend *be, const lmx_attn_args *a) {
    if (!a->lse) return w_attention(be, a);
    lmx_status st = cuda_graph_flush((cuda_backend *)be); /* training's prefill: never in a decode graph */
    return st ? st : cuda_attention(be, a);
}
lmx_status cuda_op_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *b, const lmx_tensor *k,
                             const lmx_tensor *v) {
    return w_kv_append(be, kv, b, k, v);
}
lmx_status cuda_op_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                               int64_t n) {
    return w_gather_rows(be, out, x, rows, R, n);
}
