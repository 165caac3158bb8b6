/* cuda_graph.cu - decode steps replayed as one CUDA graph.
 *
 * A decode step is ~18 small launches per layer; launched one by one they cost more than the
 * weight bytes they stream on small models.  The ops of the table below go through this file:
 *
 *   - a step starts at embed and ends at the next entry point that is not an op (read, write, ...)
 *     or the next embed;
 *   - a step whose ops all fit a graph (at most CUDA_G_MAX rows, one new row per sequence) runs
 *     eagerly while its ops are recorded (op kind, tensors, sizes, kv caches, attention splits:
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

#include "cuda_internal.h"

enum { G_EMBED = 1, G_RMSNORM, G_MATMUL, G_ADD, G_GLU, G_SOFTCAP, G_ROPE, G_ATTENTION, G_KV_APPEND, G_GATHER, G_LORA };
enum { G_OFF = 0, G_REC, G_REPLAY };

/* One op call; zero-filled before use so that memcmp compares it. */
typedef struct g_rec {
    int op, M, B, T, i0, i1, i2, splits, has[4];
    int64_t n;
    float f0, f1;
    lmx_tensor t[4];
    lmx_rope rope;
    lmx_kv_layer *kvp[CUDA_G_MAX];
    void *kd[CUDA_G_MAX], *vd[CUDA_G_MAX];
    int cap[CUDA_G_MAX], rot[CUDA_G_MAX], win[CUDA_G_MAX], rows[CUDA_G_MAX];
    lmx_lora_pair lora[CUDA_G_MAX];   /* G_LORA: each sequence's pair (a.data NULL: none) */
} g_rec;

typedef struct cuda_graph {
    int mode, pos;
    g_rec *rec;
    unsigned char *skip;     /* [cap_rec]: while capturing, ops already issued inside an earlier fusion */
    int n_rec, cap_rec;
    cudaGraphExec_t exec;    /* NULL: none */
    int dyn[CUDA_DYN_N];     /* this step's values, host copy */
    int have_batch;          /* dyn holds this step's n_past / n_new */
    int launched;            /* this step's graph is already running (launched early) */
    int failed;              /* capture failed once: stay eager */
    int nofuse;              /* LMX_CUDA_GRAPH=1: graphs without the fusions */
    int pdl;                 /* launch the graph's kernels with programmatic dependent launch */
} cuda_graph;

lmx_status cuda_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table, const int32_t *ids, int M,
                      float scale);
lmx_status cuda_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                        int n, float eps, float add_one);
lmx_status cuda_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n);
lmx_status cuda_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                    lmx_act act);
lmx_status cuda_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap);
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
    return LMX_OK;
}

void cuda_graph_drop(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    if (g && g->exec) {
        cudaStreamSynchronize(cb->stream); /* it may be running (launched early) */
        cudaGraphExecDestroy(g->exec);
        g->exec = NULL;
    }
}

void cuda_graph_destroy(cuda_backend *cb) {
    if (cb->g) {
        cuda_graph_drop(cb);
        free(cb->g->rec);
        free(cb->g->skip);
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

/* Run one recorded op eagerly (or into a capture), its per-step values from the host copy. */
static lmx_status g_exec(cuda_backend *cb, g_rec *r) {
    cuda_graph *g = cb->g;
    lmx_batch bt = {r->B, r->T, g->dyn + CUDA_DYN_PAST, g->dyn + CUDA_DYN_NEW};
    return g_run_direct(cb, r, g->dyn + CUDA_DYN_IDS, &bt, r->kvp, r->rows);
}

/* Whether recorded op r reads p, and whether it overwrites p without reading it. */
static int g_reads(const g_rec *r, const void *p) {
    switch (r->op) {
    case G_EMBED: return r->t[1].data == p;
    case G_RMSNORM: case G_GLU: return r->t[1].data == p || r->t[2].data == p;
    case G_MATMUL: case G_ATTENTION: return r->t[1].data == p || r->t[2].data == p || (r->has[3] && r->t[3].data == p);
    case G_ADD: case G_KV_APPEND: case G_LORA: return r->t[0].data == p || r->t[1].data == p;
    case G_GATHER: return r->t[1].data == p;
    default: return r->t[0].data == p; /* softcap, rope: in place */
    }
}
static int g_overwrites(const g_rec *r, const void *p) {
    switch (r->op) {
    case G_EMBED: case G_RMSNORM: case G_MATMUL: case G_GLU: case G_ATTENTION: case G_GATHER:
        return r->t[0].data == p && !g_reads(r, p);
    default: return 0;
    }
}

/* 1 when no op after index i reads p before one overwrites it (the rest of the step; the forward pass
 * writes every temporary before it reads it, so a step never reads the last one's). */
static int g_dead_after(const cuda_graph *g, int i, const void *p) {
    for (int j = i + 1; j < g->n_rec; j++) {
        if (g_reads(&g->rec[j], p)) return 0;
        if (g_overwrites(&g->rec[j], p)) return 1;
    }
    return 1;
}

/* The matmuls at i sharing one input (1 to 3, none writing what another reads), and with *glu >= 0 the
 * glu op that follows a pair (gate, up).  Returns how many matmuls. */
static int g_matmul_group(const cuda_graph *g, int i, int *glu) {
    const g_rec *r = &g->rec[i];
    int n = 1;
    *glu = -1;
    while (n < 3 && i + n < g->n_rec) {
        const g_rec *q = &g->rec[i + n];
        if (q->op != G_MATMUL || q->M != r->M || q->t[1].data != r->t[1].data) break;
        int clash = q->t[0].data == r->t[1].data;
        for (int j = 0; j < n; j++) clash |= q->t[0].data == g->rec[i + j].t[0].data;
        if (clash) break;
        n++;
    }
    if (n == 2 && i + 2 < g->n_rec) {
        const g_rec *q = &g->rec[i + 2];
        if (q->op == G_GLU && q->t[0].data == r->t[0].data && q->t[1].data == r->t[0].data &&
            q->t[2].data == g->rec[i + 1].t[0].data && q->n == (int64_t)r->M * r->t[2].shape[0])
            *glu = q->i0;
    }
    return r->t[0].data == r->t[1].data ? 1 : n;
}

/* The matmul group at i as one launch (opts: what it folds in; y0: where the first result goes
 * instead of its op's output, or NULL); *used = ops consumed, 0 when the launch does not apply. */
static lmx_status g_gemv_group(cuda_backend *cb, int i, int n, int glu, const float *x, const cuda_gemv_opts *opts,
                               float *y0, int *used) {
    cuda_graph *g = cb->g;
    float *ys[3];
    const lmx_tensor *ws[3], *bs[3];
    for (int j = 0; j < n; j++) {
        g_rec *q = &g->rec[i + j];
        ys[j] = j == 0 && y0 ? y0 : (float *)q->t[0].data;
        ws[j] = &q->t[2];
        bs[j] = q->has[3] ? &q->t[3] : NULL;
    }
    *used = 0;
    lmx_status st = LMX_ERR_UNSUPPORTED;
    if (glu >= 0) st = cuda_gemv(cb, 2, ws, bs, ys, x, g->rec[i].M, glu, opts);
    if (st == LMX_OK) *used = 3;
    if (st == LMX_ERR_UNSUPPORTED && (n > 1 || opts)) {
        st = cuda_gemv(cb, n, ws, bs, ys, x, g->rec[i].M, -1, opts);
        if (st == LMX_OK) *used = n;
    }
    return st == LMX_ERR_UNSUPPORTED ? LMX_OK : st;
}

/* LoRA after a matmul group (i: its first matmul, n matmuls): the LORA records right after it that
 * apply to its outputs from its input, and with gate/up the GLU after them.  Returns how many LORA
 * records (0: none), their projections' matmul index in mi[], *glu the GLU's act or -1. */
static int g_lora_after(const cuda_graph *g, int i, int n, int mi[3], int *glu) {
    const g_rec *r = &g->rec[i];
    int nl = 0;
    *glu = -1;
    while (nl < n && i + n + nl < g->n_rec) {
        const g_rec *q = &g->rec[i + n + nl];
        if (q->op != G_LORA || q->t[1].data != r->t[1].data || q->B != r->M || q->T != 1) break;
        int k = -1;
        for (int j = 0; j < n; j++)
            if (q->t[0].data == g->rec[i + j].t[0].data) k = j;
        for (int j = 0; j < nl; j++)
            if (mi[j] == k) k = -1;
        if (k < 0) break;
        mi[nl++] = k;
    }
    if (nl == 2 && n == 2 && i + 4 < g->n_rec) {
        const g_rec *q = &g->rec[i + 4];
        if (q->op == G_GLU && q->t[0].data == r->t[0].data && q->t[1].data == r->t[0].data &&
            q->t[2].data == g->rec[i + 1].t[0].data && q->n == (int64_t)r->M * r->t[2].shape[0])
            *glu = q->i0;
    }
    return nl;
}

/* The matmul group at i followed by its LoRA records (and GLU): the group as one GEMV launch (or its
 * matmuls one by one), then every LoRA of it as one shrink and one expand launch (with the GLU). */
static lmx_status g_exec_lora_group(cuda_backend *cb, int i, int n, int nl, const int mi[3], int glu, int *used) {
    cuda_graph *g = cb->g;
    float *ys[3];
    int Ns[3];
    const lmx_lora_pair *pp[3][CUDA_G_MAX];
    const lmx_lora_pair *const *pairs[3] = {pp[0], pp[1], pp[2]};
    for (int k = 0; k < nl; k++) {
        g_rec *q = &g->rec[i + n + k];
        ys[k] = (float *)q->t[0].data;
        Ns[k] = (int)g->rec[i + mi[k]].t[2].shape[0];
        for (int b = 0; b < q->B; b++) pp[k][b] = q->lora[b].a.data ? &q->lora[b] : NULL;
    }
    const g_rec *r = &g->rec[i];
    const float *x = (const float *)r->t[1].data;
    const int64_t K = r->t[2].shape[1];
    const int side = cb->side != NULL; /* the shrink beside the GEMV, the expand after both */
    lmx_status st = side ? cuda_lora_group(cb, nl, ys, Ns, x, K, r->M, pairs, glu, 1) : LMX_OK;
    int u = 0;
    if (st == LMX_OK && n > 1) st = g_gemv_group(cb, i, n, -1, x, NULL, NULL, &u);
    for (int j = 0; st == LMX_OK && u == 0 && j < n; j++) st = g_exec(cb, &g->rec[i + j]);
    if (st == LMX_OK) st = cuda_lora_group(cb, nl, ys, Ns, x, K, r->M, pairs, glu, side ? 2 : 0);
    *used = n + nl + (glu >= 0 ? 1 : 0);
    return st;
}

/* The residual add at j folded into the single matmul at i (its output only feeds that add): y += W x + b.
 * Returns the add's output, or NULL. */
static float *g_resid_into(const cuda_graph *g, int i, int j) {
    const g_rec *r = &g->rec[i], *a = j < g->n_rec ? &g->rec[j] : NULL;
    if (r->M == 1 && a && a->op == G_ADD && a->t[1].data == r->t[0].data && a->t[0].data != r->t[0].data &&
        a->t[0].data != r->t[1].data && a->n == r->t[2].shape[0] && g_dead_after(g, j, r->t[0].data))
        return (float *)a->t[0].data;
    return NULL;
}

/* One row's matmul group at i (n matmuls) with its nl LoRA records after it (mi, glu: g_lora_after) and
 * with nrm the RMSNorm record before it, or NULL: the pairs' shrink as one launch (the norm folded in),
 * then the group as one GEMV launch that folds in each expand, the norm, the GLU, and for a single
 * matmul the residual add after it.  *used: ops consumed from i (0: it does not apply). */
static lmx_status g_exec_lora_row(cuda_backend *cb, int i, int n, int nl, const int mi[3], int glu, const g_rec *nrm,
                                  int *used) {
    cuda_graph *g = cb->g;
    const g_rec *r = &g->rec[i];
    const int last = i + n + nl + (glu >= 0 ? 1 : 0); /* the first op after the group */
    *used = 0;
    if (r->M != 1 || !cuda_gemv_one_row(cb, &r->t[2], 1)) return LMX_OK;
    if (nrm && (nrm->n != r->t[2].shape[1] || !g_dead_after(g, last - 1, nrm->t[0].data))) return LMX_OK;
    for (int j = 0; nrm && j < n; j++)
        if (g->rec[i + j].t[0].data == nrm->t[1].data) return LMX_OK;
    float *resid = n == 1 && glu < 0 && !nrm ? g_resid_into(g, i, last) : NULL;
    const lmx_lora_pair *pairs[3] = {NULL, NULL, NULL};
    int any = 0;
    for (int k = 0; k < nl; k++) {
        const g_rec *q = &g->rec[i + n + k];
        pairs[k] = q->lora[0].a.data ? &q->lora[0] : NULL;
        any |= pairs[k] != NULL;
    }
    cuda_gemv_opts o;
    memset(&o, 0, sizeof o);
    cuda_row_norm rn;
    memset(&rn, 0, sizeof rn);
    if (nrm) {
        o.norm_w = &nrm->t[2];
        o.eps = rn.eps = nrm->f0;
        o.add_one = rn.add_one = nrm->f1;
        rn.w = nrm->t[2].data;
        rn.wt = nrm->t[2].dtype;
        if (nrm->t[2].q.bits || nrm->t[2].q.ggml_type) return LMX_OK;
    }
    o.resid = resid != NULL;
    const float *x = (const float *)(nrm ? nrm->t[1].data : r->t[1].data);
    if (any) {
        float *t;
        int rmax;
        lmx_status st = cuda_lora_shrink_row(cb, nl, pairs, x, r->t[2].shape[1], &rn, &t, &rmax);
        if (st) return st;
        for (int k = 0; k < nl; k++)
            if (pairs[k]) {
                o.lora_b[mi[k]] = (const float *)pairs[k]->b.data;
                o.lora_t[mi[k]] = t + k * rmax;
                o.lora_r[mi[k]] = (int)pairs[k]->a.shape[0];
            }
    }
    float *ys[3];
    const lmx_tensor *ws[3], *bs[3];
    for (int j = 0; j < n; j++) {
        const g_rec *q = &g->rec[i + j];
        ys[j] = j == 0 && resid ? resid : (float *)q->t[0].data;
        ws[j] = &q->t[2];
        bs[j] = q->has[3] ? &q->t[3] : NULL;
    }
    const int plain = !nrm && !resid && !any;
    lmx_status st = cuda_gemv(cb, n, ws, bs, ys, x, 1, glu, plain ? NULL : &o);
    if (st == LMX_ERR_UNSUPPORTED && any) /* the shrink is in the graph: the graph fails, never a wrong step */
        return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda graph: a LoRA GEMV the check allowed declined");
    if (st == LMX_ERR_UNSUPPORTED) return LMX_OK;
    if (st == LMX_OK) *used = last - i + (resid ? 1 : 0);
    return st;
}

/* Fusions applied while capturing (the eager path never fuses): matmuls of one input (q/k/v,
 * gate/up) as one launch, gate/up + GLU as one launch, a row's RMSNorm folded into the matmuls that
 * read it, a matmul's residual add folded into it, per-head q/k norm + RoPE as one launch (with the
 * layer's kv append when it is safe to write the cache before the attention reads it), and a
 * residual add followed by the norm of its result as one launch.  Each does the arithmetic of the
 * ops it replaces in the same order, so graphs and eager steps agree bit for bit.  With LoRA records
 * after a matmul group: for one row, the pairs' shrink (with the group's norm) and then the group's GEMV
 * with the expands folded in (g_exec_lora_row); for several, the group's launch and then one shrink (on
 * a side branch beside it) and one expand launch, which also does gate/up's GLU, the norm before the
 * group a launch of its own (g_exec_lora_group).
 * *used = ops consumed (0: none applied). */
static lmx_status g_exec_fused(cuda_backend *cb, int i, int *used) {
    cuda_graph *g = cb->g;
    g_rec *r = &g->rec[i];
    *used = 0;
    if (r->op == G_MATMUL) {
        int glu, n = g_matmul_group(g, i, &glu), mi[3], lglu;
        int nl = g_lora_after(g, i, n, mi, &lglu);
        if (nl > 0) {
            lmx_status st = g_exec_lora_row(cb, i, n, nl, mi, lglu, NULL, used);
            if (st || *used) return st;
            return g_exec_lora_group(cb, i, n, nl, mi, lglu, used);
        }
        /* a single matmul whose output only feeds the residual add after it: y += W x + b */
        float *resid = n == 1 ? g_resid_into(g, i, i + 1) : NULL;
        if (resid) {
            cuda_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.resid = 1;
            lmx_status st = g_gemv_group(cb, i, 1, -1, (const float *)r->t[1].data, &o, resid, used);
            if (st || *used) {
                if (*used) *used = 2;
                return st;
            }
        }
        if (n < 2) return LMX_OK;
        return g_gemv_group(cb, i, n, glu, (const float *)r->t[1].data, NULL, NULL, used);
    }
    if (r->op == G_RMSNORM && r->M == 1 && i + 1 < g->n_rec && g->rec[i + 1].op == G_MATMUL &&
        g->rec[i + 1].t[1].data == r->t[0].data && g->rec[i + 1].M == 1) {
        /* a row's norm read only by the matmuls after it: they normalise as they stage x (with LoRA
         * after them, the shrink too) */
        int glu, n = g_matmul_group(g, i + 1, &glu), mi[3], lglu;
        int nl = g_lora_after(g, i + 1, n, mi, &lglu);
        if (nl > 0) {
            int u = 0;
            lmx_status st = g_exec_lora_row(cb, i + 1, n, nl, mi, lglu, r, &u);
            if (u) *used = 1 + u;
            return st;
        }
        const int last = i + n + (glu >= 0 ? 1 : 0);
        int ok = r->n == g->rec[i + 1].t[2].shape[1] && g_dead_after(g, last, r->t[0].data);
        for (int j = 1; j <= n; j++) ok &= g->rec[i + j].t[0].data != r->t[1].data;
        if (ok) {
            cuda_gemv_opts o;
            memset(&o, 0, sizeof o);
            o.norm_w = &r->t[2];
            o.eps = r->f0;
            o.add_one = r->f1;
            int u = 0;
            lmx_status st = g_gemv_group(cb, i + 1, n, glu, (const float *)r->t[1].data, &o, NULL, &u);
            if (st) return st;
            if (u) {
                *used = 1 + u;
                return LMX_OK;
            }
        }
    }
    if (r->op == G_RMSNORM || r->op == G_ROPE) {
        /* [norm q, norm k,] rope q, rope k  (norms per head, in place) */
        int nn = 0;
        while (nn < 2 && i + nn < g->n_rec && g->rec[i + nn].op == G_RMSNORM) nn++;
        if (nn == 1) return LMX_OK;
        int nr = 0;
        while (nr < 2 && i + nn + nr < g->n_rec && g->rec[i + nn + nr].op == G_ROPE) nr++;
        if (nr != 2) return LMX_OK;
        const g_rec *r0 = &g->rec[i + nn], *r1 = &g->rec[i + nn + 1];
        if (memcmp(&r0->rope, &r1->rope, sizeof r0->rope) || r0->B != r1->B || r0->T != r1->T || r0->i1 != r1->i1 ||
            r0->t[0].data == r1->t[0].data)
            return LMX_OK;
        lmx_tensor *xs[2] = {&g->rec[i + nn].t[0], &g->rec[i + nn + 1].t[0]};
        int nh[2] = {r0->i0, r1->i0};
        const lmx_tensor *ws[2] = {NULL, NULL};
        float eps[2] = {0, 0}, one[2] = {0, 0};
        for (int k = 0; k < nn; k++) {
            const g_rec *q = &g->rec[i + k];
            if (q->t[0].data != xs[k]->data || q->t[1].data != xs[k]->data || q->n != r0->i1 ||
                (int64_t)q->M != (int64_t)r0->B * r0->T * nh[k])
                return LMX_OK;
            ws[k] = &g->rec[i + k].t[2];
            eps[k] = q->f0;
            one[k] = q->f1;
        }
        /* ... attention, kv_append of the same k and v: the append joins this launch when the slot it
         * writes is not one the attention reads (an unbounded cache, or a rotating one at least as
         * long as its window) */
        const int ia = i + nn + 2, ik = ia + 1;
        cuda_kv_dst dst;
        const cuda_kv_dst *app = NULL;
        if (ik < g->n_rec && g->rec[ia].op == G_ATTENTION && g->rec[ik].op == G_KV_APPEND) {
            const g_rec *at = &g->rec[ia], *kv = &g->rec[ik];
            int ok = r0->T == 1 && kv->T == 1 && kv->B == r0->B && at->B == r0->B && kv->t[0].data == xs[1]->data &&
                     at->t[2].data == kv->t[0].data && at->t[3].data == kv->t[1].data &&
                     kv->t[0].shape[kv->t[0].ndim - 1] == (int64_t)nh[1] * r0->i1 && kv->t[0].shape[0] == r0->B &&
                     kv->t[1].shape[kv->t[1].ndim - 1] == (int64_t)nh[1] * r0->i1;
            memset(&dst, 0, sizeof dst);
            for (int b = 0; ok && b < kv->B; b++) {
                ok = kv->kvp[b] == at->kvp[b] && kv->kd[b] && kv->vd[b] && kv->cap[b] > 0 &&
                     (!kv->rot[b] || (kv->win[b] > 0 && kv->cap[b] >= kv->win[b]));
                dst.kc[b] = kv->kd[b];
                dst.vc[b] = kv->vd[b];
                dst.cap[b] = kv->cap[b];
            }
            dst.v = (const float *)kv->t[1].data;
            if (ok) app = &dst;
        }
        lmx_status st = cuda_norm_rope(cb, r0->B, r0->T, r0->i1, &r0->rope, 2, xs, nh, ws, eps, one, app);
        if (st == LMX_ERR_UNSUPPORTED) return LMX_OK;
        if (app && st == LMX_OK) g->skip[ik] = 1;
        *used = nn + 2;
        return st;
    }
    if (r->op == G_ADD && i + 1 < g->n_rec) {
        g_rec *q = &g->rec[i + 1];
        if (q->op != G_RMSNORM || q->t[1].data != r->t[0].data || (int64_t)q->M * q->n != r->n ||
            q->t[0].data == r->t[0].data || q->t[0].data == r->t[1].data)
            return LMX_OK;
        lmx_status st = cuda_add_rmsnorm(cb, &r->t[0], &r->t[1], &q->t[0], &q->t[2], q->M, (int)q->n, q->f0, q->f1);
        if (st == LMX_ERR_UNSUPPORTED) return LMX_OK;
        *used = 2;
        return st;
    }
    return LMX_OK;
}

/* Capture the recorded step into a graph (nothing runs). */
static void g_capture(cuda_backend *cb) {
    cuda_graph *g = cb->g;
    cuda_graph_drop(cb);
    if (g->failed || g->n_rec == 0) return;
    if (cudaStreamBeginCapture(cb->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        cudaGetLastError();
        g->failed = 1;
        return;
    }
    cb->dyn_on = 1;
    cb->pdl = g->pdl;
    memset(g->skip, 0, (size_t)g->n_rec);
    lmx_status st = LMX_OK;
    for (int i = 0; i < g->n_rec && st == LMX_OK;) {
        int used = 0;
        if (g->skip[i]) {
            i++;
            continue;
        }
        if (!g->nofuse) st = g_exec_fused(cb, i, &used);
        if (st == LMX_OK && used == 0) {
            st = g_exec(cb, &g->rec[i]);
            used = 1;
        }
        i += used;
    }
    cb->dyn_on = 0;
    cb->pdl = 0;
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(cb->stream, &graph);
    if (st != LMX_OK || e != cudaSuccess || !graph) {
        cudaGetLastError();
        if (graph) cudaGraphDestroy(graph);
        g->failed = 1;
        return;
    }
    cudaGraphExec_t ex = NULL;
    e = cudaGraphInstantiate(&ex, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cudaGetLastError();
        g->failed = 1;
        return;
    }
    g->exec = ex;
}

/* Issue the first n recorded ops eagerly (a replay that stopped matching). */
static lmx_status g_reissue(cuda_backend *cb, int n) {
    for (int i = 0; i < n; i++) {
        lmx_status st = g_exec(cb, &cb->g->rec[i]);
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
    if (r->op == G_EMBED || r->op == G_MATMUL || r->op == G_GATHER) return r->M >= 1 && r->M <= CUDA_G_MAX;
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
    if (r->op == G_EMBED) {
        if ((st = cuda_graph_flush(cb))) return st;
        g->have_batch = 0;
        g->launched = 0;
        g->mode = !fits || g->failed ? G_OFF : g->exec ? G_REPLAY : G_REC;
        if (g->mode == G_REC) g->n_rec = 0;
    }
    if (g->mode == G_REPLAY) {
        if (fits && g->pos < g->n_rec && memcmp(r, &g->rec[g->pos], sizeof *r) == 0 && g_stash(g, r, ids, bt)) {
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
            memcpy(&g->rec[g->n_rec++], r, sizeof *r);
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
    case G_ROPE: return cuda_rope(be, &c->t[0], bt, c->i0, c->i1, &c->rope);
    case G_ATTENTION: {
        lmx_attn_args a = {bt, &c->t[0], &c->t[1], &c->t[2], &c->t[3], kv, c->i0, c->i1, c->i2, c->f0, c->f1};
        return cuda_attention(be, &a);
    }
    case G_KV_APPEND: return cuda_kv_append(be, kv, bt, &c->t[0], &c->t[1]);
    case G_GATHER: return cuda_gather_rows(be, &c->t[0], &c->t[1], rows, c->M, c->n);
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
    memset(&r, 0, sizeof r);
    r.op = G_EMBED;
    r.M = M;
    r.f0 = scale;
    rec_t(&r, 0, out);
    rec_t(&r, 1, table);
    return g_dispatch(cb, &r, ids, NULL, NULL, NULL);
}

static lmx_status w_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                            int n, float eps, float add_one) {
    g_rec r;
    memset(&r, 0, sizeof r);
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
    memset(&r, 0, sizeof r);
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
    memset(&r, 0, sizeof r);
    r.op = G_ADD;
    r.n = n;
    rec_t(&r, 0, y);
    rec_t(&r, 1, x);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                        lmx_act act) {
    g_rec r;
    memset(&r, 0, sizeof r);
    r.op = G_GLU;
    r.n = n;
    r.i0 = (int)act;
    rec_t(&r, 0, out);
    rec_t(&r, 1, gate);
    rec_t(&r, 2, up);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static lmx_status w_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) {
    g_rec r;
    memset(&r, 0, sizeof r);
    r.op = G_SOFTCAP;
    r.n = n;
    r.f0 = cap;
    rec_t(&r, 0, x);
    return g_dispatch((cuda_backend *)be, &r, NULL, NULL, NULL, NULL);
}

static void rec_batch(g_rec *r, const lmx_batch *bt) {
    r->B = bt->B;
    r->T = bt->T;
}

static lmx_status w_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh, int hd,
                         const lmx_rope *rope) {
    g_rec r;
    memset(&r, 0, sizeof r);
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
    memset(&r, 0, sizeof r);
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
        r.splits = cuda_attention_splits(cb, a, 0, a->batch->B);
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
    memset(&r, 0, sizeof r);
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
    memset(&r, 0, sizeof r);
    r.op = G_GATHER;
    r.M = R;
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
    memset(&r, 0, sizeof r);
    r.op = G_LORA;
    r.M = B * T;
    r.B = B;
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
    return w_lora(be, y, x, B, T, pairs);
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
    return w_matmul(be, out, x, w, bias, M);
}
lmx_status cuda_op_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) { return w_add(be, y, x, n); }
lmx_status cuda_op_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *g, const lmx_tensor *u, int64_t n,
                       lmx_act act) {
    return w_glu(be, out, g, u, n, act);
}
lmx_status cuda_op_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) { return w_softcap(be, x, n, cap); }
lmx_status cuda_op_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *b, int nh, int hd, const lmx_rope *rope) {
    return w_rope(be, x, b, nh, hd, rope);
}
lmx_status cuda_op_attention(lmx_backend *be, const lmx_attn_args *a) { return w_attention(be, a); }
lmx_status cuda_op_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *b, const lmx_tensor *k,
                             const lmx_tensor *v) {
    return w_kv_append(be, kv, b, k, v);
}
lmx_status cuda_op_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                               int64_t n) {
    return w_gather_rows(be, out, x, rows, R, n);
}
