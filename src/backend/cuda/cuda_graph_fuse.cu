/* cuda_graph_fuse.cu - the fusions a decode graph applies while it captures a recorded step
 * (cuda_graph.cu records and replays; cuda_graph.h): which recorded ops read or overwrite a buffer,
 * matmul groups sharing one input, and the launches that replace several recorded ops with one. */
#include <string.h>

#include "cuda_graph.h"

/* Whether recorded op r reads p, and whether it overwrites p without reading it. */
static int g_reads(const g_rec *r, const void *p) {
    switch (r->op) {
    case G_EMBED: return r->t[1].data == p;
    case G_RMSNORM: case G_GLU: return r->t[1].data == p || r->t[2].data == p;
    case G_MATMUL: case G_ATTENTION: return r->t[1].data == p || r->t[2].data == p || (r->has[3] && r->t[3].data == p);
    case G_ADD: case G_KV_APPEND: case G_LORA: return r->t[0].data == p || r->t[1].data == p;
    case G_GATHER: return r->t[1].data == p;
    case G_READ: return 0; /* an announcement: the read comes after the step */
    case G_MOE: return r->t[0].data == p || r->t[1].data == p || r->t[2].data == p;
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
    /* q and k in one launch, v in the next (a Q4_K_M file's Q6_K v beside Q4_K q and k, several rows) */
    if (st == LMX_ERR_UNSUPPORTED && n == 3 && !opts) {
        st = cuda_gemv(cb, 2, ws, bs, ys, x, g->rec[i].M, -1, NULL);
        if (st == LMX_OK) *used = 2;
    }
    /* ... and with the norm folded into both (each reads x and normalises it): v first, alone, so that
     * nothing has run when its kind takes no fold; q and k then take what v's launch took (one row of an 8B
     * Q4_K_M: q and k as MLX groups, cuda_repack.cu, streamed by k_gstream1, beside a Q6_K v) */
    if (st == LMX_ERR_UNSUPPORTED && n == 3 && opts && !opts->resid && !opts->lora_b[0] &&
        !opts->lora_b[1] && !opts->lora_b[2]) {
        const int M = g->rec[i].M;
        st = cuda_gemv(cb, 1, ws + 2, bs + 2, ys + 2, x, M, -1, opts);
        if (st == LMX_OK) {
            st = cuda_gemv(cb, 2, ws, bs, ys, x, M, -1, opts);
            if (st == LMX_ERR_UNSUPPORTED && (st = cuda_gemv(cb, 1, ws, bs, ys, x, M, -1, opts)) == LMX_OK)
                st = cuda_gemv(cb, 1, ws + 1, bs + 1, ys + 1, x, M, -1, opts);
            if (st == LMX_ERR_UNSUPPORTED) /* v ran with the fold and q or k cannot: the step cannot be made */
                return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda graph: q/k/v take the norm apart");
            if (st == LMX_OK) *used = 3;
        }
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
    for (int j = u; st == LMX_OK && j < n; j++) st = cuda_g_exec(cb, &g->rec[i + j]); /* what the launch left */
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

/* GEMV opts folding in norm record r */
static cuda_gemv_opts g_norm_opts(const g_rec *r) {
    cuda_gemv_opts o;
    memset(&o, 0, sizeof o);
    o.norm_w = &r->t[2];
    o.eps = r->f0;
    o.add_one = r->f1;
    return o;
}

/* Whether the norm at i can fold into the n matmuls after it (and their GLU: glu >= 0): they read only
 * its output, which nothing reads after them, and none writes its input. */
static int g_norm_folds(const cuda_graph *g, int i, int n, int glu) {
    const g_rec *r = &g->rec[i];
    int ok = r->n == g->rec[i + 1].t[2].shape[1] && g_dead_after(g, i + n + (glu >= 0 ? 1 : 0), r->t[0].data);
    for (int j = 1; j <= n; j++) ok &= g->rec[i + j].t[0].data != r->t[1].data;
    return ok;
}

/* Whether the matmuls at i .. i + n - 1 run as cuBLAS GEMMs on bf16 weights (more rows than the GEMVs take) with
 * no LoRA after them.  Each such GEMM first narrows its f32 input to bf16; in a graph the op that writes that
 * input writes its bf16 copy instead (the same rounding, so the same bits), and g_gemm_bf16_run runs the
 * matmuls on it, adding one to *used for each. */
static int g_gemm_bf16(const cuda_backend *cb, const cuda_graph *g, int i, int n) {
    for (int j = 0; j < n; j++) {
        const g_rec *m = &g->rec[i + j];
        const lmx_tensor *w = &m->t[2];
        if (m->op != G_MATMUL || w->q.bits || w->q.ggml_type || w->dtype != LMX_DTYPE_BF16 || m->M <= cuda_gemv_rows(cb, w))
            return 0;
    }
    int mi[3], lglu;
    return g_lora_after(g, i, n, mi, &lglu) <= 0;
}
/* Two neighbours of one shape and no bias (k / v, gate / up) run as one batched GEMM (g->gemm_pair), its
 * pointers in the graph's table. */
static lmx_status g_gemm_bf16_run(cuda_backend *cb, int i, int n, const __nv_bfloat16 *x16, int *used) {
    lmx_status st = LMX_OK;
    for (int j = 0; j < n && !st; j++) {
        g_rec *m = &cb->g->rec[i + j], *m1 = m + 1;
        const void **tab;
        if (cb->g->gemm_pair && j + 1 < n && !m->has[3] && !m1->has[3] && m->M == m1->M &&
            m->t[2].shape[0] == m1->t[2].shape[0] && m->t[2].shape[1] == m1->t[2].shape[1] &&
            (tab = g_ptab_take(cb->g, 6))) {
            const void *p[6] = {x16, x16, m->t[2].data, m1->t[2].data, m->t[0].data, m1->t[0].data};
            memcpy(tab, p, sizeof p);
            if ((st = cuda_gemm_bf16_batch(cb, g_ptab_dev(cb->g, tab), 2, m->M, (int)m->t[2].shape[0],
                                           (int)m->t[2].shape[1])))
                return st;
            *used += 2;
            j++;
            continue;
        }
        const lmx_tensor xb = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {m->M, m->t[2].shape[1]}, .data = (void *)x16};
        if (!(st = cuda_matmul(&cb->base, &m->t[0], &xb, &m->t[2], m->has[3] ? &m->t[3] : NULL, m->M))) (*used)++;
    }
    return st;
}

/* Fusions applied while capturing (the eager path never fuses): matmuls of one input (q/k/v,
 * gate/up) as one launch, gate/up + GLU as one launch, a row's RMSNorm folded into the matmuls that
 * read it, a matmul's residual add folded into it, per-head q/k norm + RoPE as one launch (with the
 * layer's kv append when it is safe to write the cache before the attention reads it; one token a
 * sequence, all of it inside the attention's launch: cuda_attention_fused), and a
 * residual add followed by the norm of its result as one launch, and (one row, GGUF experts) the norm
 * before a mixture of experts folded into its router's GEMV and its experts' x quantization.  Each does
 * the arithmetic of the ops it replaces in the same order, so graphs and eager steps agree bit for bit.
 * With LoRA records after a matmul group: for one row, the pairs' shrink (with the group's norm) and then
 * the group's GEMV with the expands folded in (g_exec_lora_row); for several, the group's launch and then
 * one shrink (on a side branch beside it) and one expand launch, which also does gate/up's GLU, the norm
 * before the group a launch of its own (g_exec_lora_group).
 * *used = ops consumed (0: none applied). */
lmx_status cuda_g_exec_fused(cuda_backend *cb, int i, int *used) {
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
    if (r->op == G_RMSNORM && r->M == 1 && i + 2 < g->n_rec && g->rec[i + 1].op == G_MATMUL &&
        g->rec[i + 2].op == G_MOE) {
        /* a row's norm read only by the router and the GGUF experts after it: the router's GEMV and the
         * experts' x quantization both normalise as they read x */
        g_rec *ro = &g->rec[i + 1], *mo = &g->rec[i + 2];
        if (ro->M == 1 && mo->M == 1 && ro->t[1].data == r->t[0].data && mo->t[1].data == r->t[0].data &&
            mo->t[2].data == ro->t[0].data && ro->t[0].data != r->t[1].data && mo->experts[0].q.ggml_type &&
            r->n == ro->t[2].shape[1] && g_dead_after(g, i + 2, r->t[0].data)) {
            const cuda_gemv_opts o = g_norm_opts(r);
            int u = 0;
            lmx_status st = g_gemv_group(cb, i + 1, 1, -1, (const float *)r->t[1].data, &o, NULL, &u);
            if (st || !u) return st;
            const cuda_row_norm nm = {r->t[2].data, r->t[2].dtype, r->f0, r->f1};
            const lmx_moe_args a = g_moe_args(mo, &r->t[1]);
            *used = 3;
            return cuda_moe_normed(&cb->base, &a, &nm);
        }
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
        if (g_norm_folds(g, i, n, glu)) {
            const cuda_gemv_opts o = g_norm_opts(r);
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
        if (app && g->att_fold && g->rec[ia].t[1].data == xs[0]->data && g_dead_after(g, ia, xs[0]->data) &&
            g_dead_after(g, ik, xs[1]->data)) {
            /* ... and nothing after reads the normed q and k: the attention does all of it */
            g_rec *at = &g->rec[ia];
            const lmx_batch bt = g_rec_batch(g, at);
            const lmx_attn_args aa = g_attn_args(at, &bt, at->kvp);
            /* ... and a bf16 GEMM reading the output next (the o projection): the attention writes its bf16 input */
            const int io = ik + 1;
            const g_rec *mo = io < g->n_rec ? &g->rec[io] : NULL;
            const int o16 = mo && mo->op == G_MATMUL && mo->t[1].data == at->t[0].data &&
                            (int64_t)mo->M * mo->t[2].shape[1] == (int64_t)at->B * at->T * aa.H * aa.D &&
                            g_gemm_bf16(cb, g, io, 1);
            cuda_att_pre pre = {&r0->rope, ws[0], ws[1], eps[0], eps[1], one[0], one[1], NULL};
            if (o16 && !(pre.o16 = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)mo->M * mo->t[2].shape[1] * 2)))
                return cb->base.err.status;
            lmx_status st = cuda_attention_fused(cb, &aa, &pre);
            if (st == LMX_OK && o16) { /* the GEMM now, so the loop skips it (and the append) */
                int u = 0;
                st = g_gemm_bf16_run(cb, io, 1, pre.o16, &u);
                if (st == LMX_OK) g->skip[io] = 1;
            }
            if (st != LMX_ERR_UNSUPPORTED) {
                if (st == LMX_OK) g->skip[ik] = 1;
                *used = nn + 3;
                return st;
            }
        }
        lmx_status st = cuda_norm_rope(cb, r0->B, r0->T, r0->i1, &r0->rope, 2, xs, nh, ws, eps, one, app);
        if (st == LMX_ERR_UNSUPPORTED) return LMX_OK;
        if (app && st == LMX_OK) g->skip[ik] = 1;
        *used = nn + 2;
        return st;
    }
    if (r->op == G_GLU && i + 1 < g->n_rec) {
        /* a glu whose output only the bf16 GEMM after it reads: written in bf16 alone */
        const g_rec *m = &g->rec[i + 1];
        if (m->op != G_MATMUL || m->t[1].data != r->t[0].data || m->t[0].data == r->t[0].data ||
            (int64_t)m->M * m->t[2].shape[1] != r->n || !g_dead_after(g, i + 1, r->t[0].data) || !g_gemm_bf16(cb, g, i + 1, 1))
            return LMX_OK;
        __nv_bfloat16 *h = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)r->n * 2);
        if (!h) return cb->base.err.status;
        lmx_status st = cuda_glu_bf16(cb, h, (const float *)r->t[1].data, (const float *)r->t[2].data, r->n, r->i0);
        *used = 1;
        return st ? st : g_gemm_bf16_run(cb, i + 1, 1, h, used);
    }
    if (r->op == G_ADD && i + 1 < g->n_rec) {
        g_rec *q = &g->rec[i + 1];
        if (q->op != G_RMSNORM || q->t[1].data != r->t[0].data || (int64_t)q->M * q->n != r->n ||
            q->t[0].data == r->t[0].data || q->t[0].data == r->t[1].data)
            return LMX_OK;
        /* ... and the bf16 GEMMs after it that read the norm's output: the norm writes their bf16 copy */
        int glu, n16 = i + 2 < g->n_rec && g->rec[i + 2].op == G_MATMUL && g->rec[i + 2].t[1].data == q->t[0].data
                           ? g_matmul_group(g, i + 2, &glu) : 0;
        if (n16 && !g_gemm_bf16(cb, g, i + 2, n16)) n16 = 0;
        __nv_bfloat16 *x16 = NULL;
        if (n16 && !(x16 = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)q->M * q->n * 2)))
            return cb->base.err.status;
        lmx_status st = cuda_add_rmsnorm(cb, &r->t[0], &r->t[1], &q->t[0], &q->t[2], q->M, (int)q->n, q->f0, q->f1, x16);
        if (st == LMX_ERR_UNSUPPORTED) return LMX_OK;
        *used = 2;
        return st ? st : g_gemm_bf16_run(cb, i + 2, n16, x16, used);
    }
    return LMX_OK;
}
