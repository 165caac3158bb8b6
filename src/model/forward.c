/* forward.c - the one decoder forward pass shared by llama, qwen2, qwen3 (and qwen3_moe), gemma2,
 * gemma3 and gemma4.
 *
 * Per layer (pre-norm residual blocks; D, Hk and F are the layer's own):
 *   h   = norm(x)                                       x [M, C]
 *   q,k,v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)   q [M, H*D], k/v [M, Hk*D]
 *   q,k = qk_norm(q, k) (qwen3, gemma3, gemma4); v = norm(v) (gemma4, no weight); rope(q, k)
 *   a   = attention(q, cache + k, cache + v)            a [M, H*D]
 *   x  += post_attn_norm(a Wo^T)                        (post norm: gemma only)
 *   x  += post_ffn_norm(down(act(gate(h')) * up(h')))   h' = ffn_norm(x)
 * then logits = final_norm(x) lm_head^T (soft-capped for gemma2, gemma4) on the requested rows.
 * A mixture of experts replaces the MLP (qwen3_moe) or joins it (gemma4: moe_block).  Gemma 4 also
 * adds a per-layer input to each layer's output (ple_block), scales it by the layer's scalar, lets
 * its last layers attend over an earlier layer's keys and values (their new rows kept in ws.ks/vs
 * and appended to that layer's cache after its last sharer), and takes K = V on full layers.
 * With adapters, each of the seven projections' outputs gains its sequence's LoRA term s B (A x)
 * (the backend's lora op, right after the matmul; model/adapter.h).
 * The model code only calls backend ops; it never touches tensor memory. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adapter.h"
#include "model.h"

/* A backend op's failure st as the model's (its message the backend's); LMX_OK as it is. */
static lmx_status be_failed(lmx_model *m, lmx_status st) {
    return st ? lmx_err_set(&m->err, st, "%s", m->be->err.msg) : LMX_OK;
}

/* The bias to pass to matmul: NULL when the checkpoint has none. */
static const lmx_tensor *bias(const lmx_tensor *b) { return b->data ? b : NULL; }

#define TRY(call)                                                     \
    do {                                                              \
        lmx_status s_ = (call);                                       \
        if (s_ != LMX_OK) return lmx_err_set(&m->err, s_, "%s", be->err.msg); \
    } while (0)

/* t's memory as [rows, cols]: a layer's own width of a workspace buffer sized for the widest. */
static lmx_tensor as_rows(const lmx_tensor *t, int64_t rows, int64_t cols) {
    lmx_tensor v = *t;
    v.ndim = 2;
    v.shape[0] = rows;
    v.shape[1] = cols;
    v.owned = 0;
    return v;
}

static lmx_status ws_tensor_of(lmx_backend *be, lmx_tensor *t, int64_t rows, int64_t cols, lmx_dtype dt) {
    be->ops->release(be, t);
    *t = (lmx_tensor){.dtype = dt, .ndim = 2, .shape = {rows, cols}};
    return be->ops->alloc(be, t);
}
static lmx_status ws_tensor(lmx_backend *be, lmx_tensor *t, int64_t rows, int64_t cols) {
    return ws_tensor_of(be, t, rows, cols, LMX_DTYPE_F32);
}

void lmx_workspace_free(lmx_backend *be, lmx_workspace *ws) {
    lmx_tensor *all[] = {&ws->x,      &ws->xn,     &ws->q,      &ws->k,      &ws->v,      &ws->att,
                         &ws->proj,   &ws->gate,   &ws->up,     &ws->xr,     &ws->logits, &ws->router,
                         &ws->mx,     &ws->my,     &ws->moe_sum, &ws->ks[0], &ws->ks[1], &ws->vs[0],
                         &ws->vs[1],  &ws->ple,    &ws->ple_in, &ws->ple_gate, &ws->ple_emb};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->data) be->ops->release(be, all[i]);
    free(ws->ids);
    free(ws->ple_rows);
    free(ws->kv);
    free(ws->lora);
    free(ws->route.logits);
    memset(ws, 0, sizeof *ws);
}

/* The host arrays of a MoE layer's routing for up to rows rows, in one block (route.logits owns it). */
static lmx_status route_reserve(lmx_moe_route *r, const lmx_config *c, int rows) {
    const size_t E = (size_t)c->n_experts, RK = (size_t)rows * c->n_experts_used;
    float *f = realloc(r->logits, ((size_t)rows * E + 2 * RK) * sizeof(float) + (2 * E + 2 * RK) * sizeof(int));
    if (!f) return LMX_ERR_NOMEM;
    r->logits = f;                          /* [rows, E] */
    r->w = f + (size_t)rows * E;            /* [rows K]: weights grouped by expert */
    r->pick_w = r->w + RK;                  /* [rows, K]: each row's experts' weights */
    r->rows = (int *)(r->pick_w + RK);      /* [rows K]: rows grouped by expert */
    r->pick = r->rows + RK;                 /* [rows, K]: each row's experts (-1 first: padding) */
    r->count = r->pick + RK, r->off = r->count + E; /* [E] each */
    return LMX_OK;
}

/* The buffers a layer's pass writes before it reads them, [max_rows, width] each: all but x, the hidden
 * state that goes from layer to layer (and the MoE's and per-layer inputs'); gate and up in bf16 where
 * m->mlp16 asks (not for MoE layers, whose experts share them in f32). */
enum { LAYER_BUFS = 8 };
static void layer_buffers(lmx_model *m, lmx_tensor **t, int64_t *width, lmx_dtype *dt) {
    lmx_workspace *ws = &m->ws;
    const int64_t C = m->cfg.hidden, HD = m->q_width, KD = m->kv_width, F = m->max_ffn;
    lmx_tensor *all[LAYER_BUFS] = {&ws->xn, &ws->q, &ws->k, &ws->v, &ws->att, &ws->proj, &ws->gate, &ws->up};
    const int64_t w[LAYER_BUFS] = {C, HD, KD, KD, HD, C, F, F};
    const lmx_dtype f = LMX_DTYPE_F32, gu = m->mlp16 && !m->cfg.layer_moe ? LMX_DTYPE_BF16 : LMX_DTYPE_F32;
    const lmx_dtype d[LAYER_BUFS] = {f, f, f, f, f, f, gu, gu};
    memcpy(t, all, sizeof all);
    memcpy(width, w, sizeof w);
    memcpy(dt, d, sizeof d);
}

/* Whether a buffer of layer_buffers' was made in another dtype than it would be now (m->mlp16 changed) */
static int layer_buffers_retyped(lmx_model *m) {
    lmx_tensor *t[LAYER_BUFS];
    int64_t w[LAYER_BUFS];
    lmx_dtype dt[LAYER_BUFS];
    layer_buffers(m, t, w, dt);
    for (int i = 0; i < LAYER_BUFS; i++)
        if (t[i]->data && t[i]->dtype != dt[i]) return 1;
    return 0;
}

/* Grow the buffers to B sequences, M rows and R logit rows; a no-op once large enough, so decode
 * steps never allocate. */
static lmx_status ws_reserve(lmx_model *m, int B, int M, int R) {
    lmx_backend *be = m->be;
    lmx_workspace *ws = &m->ws;
    const lmx_config *c = &m->cfg;
    const int64_t C = c->hidden, KD = m->kv_width, LP = (int64_t)c->n_layers * c->ple_dim;
    if (B > ws->max_batch) {
        lmx_kv_layer **kv = realloc(ws->kv, (size_t)B * sizeof *kv);
        if (kv) ws->kv = kv;
        const lmx_lora_pair **lora = kv ? realloc(ws->lora, (size_t)2 * B * sizeof *lora) : NULL;
        if (lora) ws->lora = lora;
        if (!kv || !lora) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        ws->max_batch = B;
    }
    if (M > ws->max_rows) {
        int rows = M;
        int32_t *ids = realloc(ws->ids, (size_t)rows * sizeof *ids);
        if (ids) ws->ids = ids;
        int *ple_rows = ids && LP ? realloc(ws->ple_rows, (size_t)rows * sizeof *ple_rows) : NULL;
        if (ple_rows) ws->ple_rows = ple_rows;
        if (!ids || (LP && !ple_rows)) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        ws->max_rows = 0; /* until every buffer has grown: a failure (a memory limit) leaves some freed */
        TRY(ws_tensor(be, &ws->x, rows, C));
        lmx_tensor *lb[LAYER_BUFS];
        int64_t lw[LAYER_BUFS];
        lmx_dtype ld[LAYER_BUFS];
        layer_buffers(m, lb, lw, ld);
        for (int i = 0; i < LAYER_BUFS; i++) TRY(ws_tensor_of(be, lb[i], rows, lw[i], ld[i]));
        if (c->layer_moe) {
            TRY(ws_tensor(be, &ws->router, rows, c->n_experts));
            TRY(ws_tensor(be, &ws->mx, rows, C));
            TRY(ws_tensor(be, &ws->my, rows, C));
            if (c->moe_beside_mlp) TRY(ws_tensor(be, &ws->moe_sum, rows, C));
            if (route_reserve(&ws->route, c, rows)) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        }
        for (int l = 0; l < c->n_layers; l++) /* the kept keys and values of each shared source layer */
            if (m->layers[l].kv_slot >= 0 && m->layers[l].kv_src == l) {
                TRY(ws_tensor(be, &ws->ks[m->layers[l].kv_slot], rows, KD));
                TRY(ws_tensor(be, &ws->vs[m->layers[l].kv_slot], rows, KD));
            }
        if (LP) {
            TRY(ws_tensor(be, &ws->ple, rows, LP));
            TRY(ws_tensor(be, &ws->ple_emb, rows, LP));
            TRY(ws_tensor(be, &ws->ple_in, rows, c->ple_dim));
            TRY(ws_tensor(be, &ws->ple_gate, rows, c->ple_dim));
        }
        ws->max_rows = rows;
    }
    if (R > ws->max_out_rows) {
        ws->max_out_rows = 0;
        TRY(ws_tensor(be, &ws->xr, R, C));
        TRY(ws_tensor(be, &ws->logits, R, c->vocab));
        ws->max_out_rows = R;
    }
    return LMX_OK;
}

/* Projection p's pair of each sequence into pairs [B]: whether any sequence has one. */
static int lora_pairs(const lmx_adapter *const *ad, int l, lmx_proj p, int B, const lmx_lora_pair **pairs) {
    int any = 0;
    for (int b = 0; b < B; b++) {
        pairs[b] = ad && ad[b] ? lmx_adapter_pair(ad[b], l, p) : NULL;
        any |= pairs[b] != NULL;
    }
    return any;
}

/* After projection p's matmul y = x W^T of layer l: y += s B (A x) for each sequence whose adapter
 * adapts it (none: nothing runs). */
static lmx_status lora(lmx_model *m, const lmx_adapter *const *ad, int l, lmx_proj p, lmx_tensor *y,
                       const lmx_tensor *x, const lmx_batch *bt) {
    if (!ad || !lora_pairs(ad, l, p, bt->B, m->ws.lora)) return LMX_OK;
    lmx_backend *be = m->be;
    if (!be->ops->lora)
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the %s backend does not apply LoRA adapters", be->ops->name);
    TRY(be->ops->lora(be, y, x, bt->B, bt->T, m->ws.lora));
    return LMX_OK;
}

/* The residual add x += proj after projection p (input in) with its pairs' expand: one op where the
 * backend has lora_add, else the lora op and the add op. */
static lmx_status lora_then_add(lmx_model *m, const lmx_adapter *const *ad, int l, lmx_proj p, lmx_tensor *proj,
                                const lmx_tensor *in, const lmx_batch *bt, int64_t n) {
    lmx_backend *be = m->be;
    if (ad && be->ops->lora_add && lora_pairs(ad, l, p, bt->B, m->ws.lora)) {
        TRY(be->ops->lora_add(be, &m->ws.x, proj, in, bt->B, bt->T, m->ws.lora, n));
        return LMX_OK;
    }
    lmx_status st = lora(m, ad, l, p, proj, in, bt);
    if (!st) st = be->ops->add(be, &m->ws.x, proj, n);
    return st;
}

/* xn = rmsnorm(ws.x) by norm_w, then outs[i] = xn W_i^T + b_i for i < count (the rows' q, k, v or gate, up):
 * one op where the backend has norm_matmuls and takes it (a prompt's or training's rows), else the ops in
 * turn.  *xn is what the projections read: ws.xn, or where the op takes a bf16 xn (backend.h) a bf16 tensor
 * [M, hidden] made here, which the caller releases (x16). */
static lmx_status norm_matmuls(lmx_model *m, const lmx_batch *bt, const lmx_tensor *norm_w, int M, int count,
                               lmx_tensor *const *outs, const lmx_tensor *const *ws, const lmx_tensor *const *bs,
                               lmx_tensor *x16, const lmx_tensor **xn) {
    lmx_backend *be = m->be;
    const float one = m->norm_add_one, eps = (float)m->cfg.eps;
    const int C = m->cfg.hidden;
    lmx_status st = LMX_ERR_UNSUPPORTED; /* one row a sequence (decode): the ops in turn, which its graphs fuse */
    *x16 = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {M, C}};
    *xn = &m->ws.xn;
    if (be->ops->norm_matmuls && bt->T > 1) {
        if (lmx_backend_alloc_raw(be, x16) == LMX_OK) {
            st = be->ops->norm_matmuls(be, x16, &m->ws.x, norm_w, M, C, eps, one, count, outs, ws, bs);
            if (st == LMX_OK) {
                *xn = x16;
            } else {
                be->ops->release(be, x16);
                x16->data = NULL;
            }
        } else {
            lmx_err_clear(&be->err); /* no room for the bf16 rows: the f32 way */
        }
        if (st == LMX_ERR_UNSUPPORTED) /* not in bf16: with ws.xn in f32 */
            st = be->ops->norm_matmuls(be, &m->ws.xn, &m->ws.x, norm_w, M, C, eps, one, count, outs, ws, bs);
    }
    if (st != LMX_ERR_UNSUPPORTED) return st ? lmx_err_set(&m->err, st, "%s", be->err.msg) : LMX_OK;
    TRY(be->ops->rmsnorm(be, &m->ws.xn, &m->ws.x, norm_w, M, C, eps, one));
    for (int i = 0; i < count; i++) TRY(be->ops->matmul(be, outs[i], &m->ws.xn, ws[i], bs[i], M));
    return LMX_OK;
}

static lmx_status attention_block(lmx_model *m, int l, lmx_kv_layer *const *kv_all, const lmx_adapter *const *ad,
                                  lmx_kv_layer **kv, const lmx_batch *bt, int M) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    const lmx_layer *L = &m->layers[l];
    const lmx_config *c = &m->cfg;
    const int H = c->n_heads, Hk = L->n_kv_heads, D = L->head_dim, own = L->kv_src == l;
    const float one = m->norm_add_one, eps = (float)c->eps;
    lmx_tensor q = as_rows(&ws->q, M, (int64_t)H * D);   /* [M, H*D] */
    lmx_tensor att = as_rows(&ws->att, M, (int64_t)H * D); /* [M, H*D] */
    /* the new keys and values [M, Hk*D]: of this layer, or (shared) of kv_src, kept in a slot */
    lmx_tensor k = as_rows(L->kv_slot >= 0 ? &ws->ks[L->kv_slot] : &ws->k, M, (int64_t)Hk * D);
    lmx_tensor v = as_rows(L->kv_slot >= 0 ? &ws->vs[L->kv_slot] : &ws->v, M, (int64_t)Hk * D);
    lmx_status st;

    /* the matmuls, then their LoRA pairs: in this order a cuda decode graph runs q/k/v as one launch with
     * the pairs' expands folded in (cuda_graph_fuse.cu); interleaved, each would be its own group */
    const int own_v = own && L->wv.data != NULL; /* else gemma4's K = V: the values come from the keys' projection */
    lmx_tensor *const outs[3] = {&q, &k, &v};
    const lmx_tensor *const wts[3] = {&L->wq, &L->wk, &L->wv}, *const bs[3] = {bias(&L->bq), bias(&L->bk), bias(&L->bv)};
    lmx_tensor x16;
    const lmx_tensor *xn;
    if ((st = norm_matmuls(m, bt, &L->attn_norm, M, 1 + own + own_v, outs, wts, bs, &x16, &xn))) return st;
    if (!(st = lora(m, ad, l, LMX_PROJ_Q, &q, xn, bt)) && own && !(st = lora(m, ad, l, LMX_PROJ_K, &k, xn, bt)) && own_v)
        st = lora(m, ad, l, LMX_PROJ_V, &v, xn, bt);
    if (x16.data) op->release(be, &x16);
    if (st) return st;
    if (m->traits.qk_norm) TRY(op->rmsnorm(be, &q, &q, &L->q_norm, M * H, D, eps, one));
    if (own && m->traits.gemma4) /* each value head RMS-normed without a weight (before k's norm: K = V) */
        TRY(op->rmsnorm(be, &v, L->wv.data ? &v : &k, &m->unit_norm, M * Hk, D, eps, 1.0f));
    if (own && m->traits.qk_norm) TRY(op->rmsnorm(be, &k, &k, &L->k_norm, M * Hk, D, eps, one));
    TRY(op->rope(be, &q, bt, H, D, &L->rope));
    if (own) TRY(op->rope(be, &k, bt, Hk, D, &L->rope));
    if (m->inspect_q && m->inspect_q[l]) /* an inspection's queries (B = 1): rows n_past.. of [T, H*D] */
        TRY(op->read(be, &q, 0, m->inspect_q[l] + (size_t)bt->n_past[0] * H * D, (size_t)M * H * D * sizeof(float)));

    for (int b = 0; b < bt->B; b++) kv[b] = &kv_all[b][L->kv_src];
    lmx_attn_args a = {.batch = bt, .out = &att, .q = &q, .k = &k, .v = &v,
                       .kv = kv, .H = H, .Hk = Hk, .D = D, .scale = m->attn_scale,
                       .softcap = (float)c->attn_softcap};
    const lmx_layer_save *sv = m->layer_save; /* a checkpointed training step's first run (model.h) */
    for (int i = 0; sv && sv->save && i < 3; i++) /* the op's inputs, as it reads them */
        if ((st = sv->save(sv->user, l, LMX_SAVE_Q + i, outs[i]))) return st;
    if (sv && sv->lse && sv->lse[l].data) a.lse = &sv->lse[l];
    st = op->attention(be, &a);
    if (st == LMX_ERR_UNSUPPORTED && a.lse) { /* no log-sum-exp from this backend: the output is not saved */
        lmx_err_clear(&be->err);
        a.lse = NULL;
        st = op->attention(be, &a);
    }
    TRY(st);
    if (a.lse && sv->save && (st = sv->save(sv->user, l, LMX_SAVE_ATT, &att))) return st;
    if (!bt->no_cache && m->layers[L->kv_src].kv_last == l) /* the last layer to attend over kv_src's cache without these rows */
        TRY(op->kv_append(be, kv, bt, &k, &v));

    TRY(op->matmul(be, &ws->proj, &att, &L->wo, bias(&L->bo), M));
    if (!L->post_attn_norm.data) {
        if ((st = lora_then_add(m, ad, l, LMX_PROJ_O, &ws->proj, &att, bt, (int64_t)M * c->hidden)) || !sv || !sv->save)
            return st;
        return sv->save(sv->user, l, LMX_SAVE_RESID, &ws->x);
    }
    if ((st = lora(m, ad, l, LMX_PROJ_O, &ws->proj, &att, bt))) return st;
    TRY(op->rmsnorm(be, &ws->proj, &ws->proj, &L->post_attn_norm, M, c->hidden, eps, one));
    TRY(op->add(be, &ws->x, &ws->proj, (int64_t)M * c->hidden));
    return LMX_OK;
}

static lmx_status moe_block(lmx_model *m, int l, const lmx_batch *bt, int M);

static lmx_status mlp_block(lmx_model *m, int l, const lmx_adapter *const *ad, const lmx_batch *bt, int M) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    const lmx_layer *L = &m->layers[l];
    const lmx_config *c = &m->cfg;
    const float one = m->norm_add_one, eps = (float)c->eps;
    const int64_t F = L->ffn, MC = (int64_t)M * c->hidden;
    lmx_tensor gate = as_rows(&ws->gate, M, F), up = as_rows(&ws->up, M, F); /* [M, F] */

    lmx_tensor *const outs[2] = {&gate, &up};
    const lmx_tensor *const wts[2] = {&L->w_gate, &L->w_up}, *const bs[2] = {bias(&L->b_gate), bias(&L->b_up)};
    lmx_tensor x16;
    const lmx_tensor *xn;
    lmx_status st = norm_matmuls(m, bt, &L->ffn_norm, M, 2, outs, wts, bs, &x16, &xn);
    const lmx_layer_save *sv = m->layer_save; /* a checkpointed training step's first run (model.h) */
    for (int i = 0; !st && sv && sv->save && i < 2; i++) st = sv->save(sv->user, l, LMX_SAVE_GATE + i, outs[i]);
    if (st) {
        if (x16.data) op->release(be, &x16);
        return st;
    }
    /* the GLU's output h [M, F]: into gate, or where the norm's output was bf16 (backend.h) a bf16 tensor of its own */
    lmx_tensor h16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {M, F}}, *h = &gate;
    if (x16.data && lmx_backend_alloc_raw(be, &h16) == LMX_OK) h = &h16;
    else if (x16.data) lmx_err_clear(&be->err); /* no room: into gate in f32 */
    /* gate's and up's pairs ([B] each; `|`: both filled), and their expands in the GLU's pass where the backend can */
    const lmx_lora_pair **pg = ws->lora, **pu = ws->lora + bt->B;
    const int paired = ad && op->lora_glu &&
                       (lora_pairs(ad, l, LMX_PROJ_GATE, bt->B, pg) | lora_pairs(ad, l, LMX_PROJ_UP, bt->B, pu));
    if (paired) st = be_failed(m, op->lora_glu(be, h, &gate, &up, xn, bt->B, bt->T, pg, pu, (int64_t)M * F, c->act));
    else if (!(st = lora(m, ad, l, LMX_PROJ_GATE, &gate, xn, bt)) && !(st = lora(m, ad, l, LMX_PROJ_UP, &up, xn, bt)))
        st = be_failed(m, op->glu(be, h, &gate, &up, (int64_t)M * F, c->act));
    if (x16.data) op->release(be, &x16);
    if (!st) st = be_failed(m, op->matmul(be, &ws->proj, h, &L->w_down, bias(&L->b_down), M));
    const int plain = !(L->moe && c->moe_beside_mlp) && !L->post_ffn_norm.data; /* x += down's output */
    if (!st && plain) st = lora_then_add(m, ad, l, LMX_PROJ_DOWN, &ws->proj, h, bt, MC);
    else if (!st) st = lora(m, ad, l, LMX_PROJ_DOWN, &ws->proj, h, bt);
    if (h16.data) op->release(be, &h16);
    if (st || plain) return st;
    if (L->moe && c->moe_beside_mlp) { /* gemma4: the experts beside the MLP, each output normed, then summed */
        TRY(op->rmsnorm(be, &ws->proj, &ws->proj, &L->post_ffn_norm_1, M, c->hidden, eps, one));
        if ((st = moe_block(m, l, bt, M))) return st;
        TRY(op->add(be, &ws->proj, &ws->moe_sum, MC));
    }
    if (L->post_ffn_norm.data)
        TRY(op->rmsnorm(be, &ws->proj, &ws->proj, &L->post_ffn_norm, M, c->hidden, eps, one));
    TRY(op->add(be, &ws->x, &ws->proj, MC));
    return LMX_OK;
}

/* The routing of a MoE layer (host), for each of the M rows that are not padding: lmx_moe_pick of its
 * router logits r->logits [M, E] (backend.h); then the rows grouped by expert (lmx_moe_group): expert e's
 * count[e] rows at rows[off[e] ..] with weights w[..]. */
static void route(const lmx_config *c, const lmx_batch *bt, double logit_scale, const float *expert_scale,
                  lmx_moe_route *r) {
    const int E = c->n_experts, K = c->n_experts_used, M = bt->B * bt->T;
    for (int i = 0; i < M; i++) {
        int *ex = r->pick + (int64_t)i * K;
        ex[0] = -1;
        if (i % bt->T >= bt->n_new[i / bt->T]) continue; /* padding: never read */
        lmx_moe_pick(r->logits + (int64_t)i * E, E, K, logit_scale, c->norm_topk, expert_scale, ex,
                     r->pick_w + (int64_t)i * K);
    }
    lmx_moe_group(r->pick, r->pick_w, M, K, E, r->count, r->off, r->rows, r->w);
}

/* The experts on the host's routing: the router's logits (ws->router) read to the host and routed
 * there; each expert with rows runs on them alone (gathered from ws->xn), and its output is added to
 * the rows of out weighted by the router (scatter_add_rows). */
static lmx_status moe_host(lmx_model *m, int l, const lmx_batch *bt, int M, lmx_tensor *out, double logit_scale) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    lmx_moe_route *r = &ws->route;
    const lmx_layer *L = &m->layers[l];
    const lmx_config *c = &m->cfg;
    const int64_t C = c->hidden, Fm = c->moe_ffn;
    lmx_tensor gate = as_rows(&ws->gate, M, Fm), up = as_rows(&ws->up, M, Fm); /* [ne, Fm] used */
    if (!op->scatter_add_rows)
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the %s backend does not run mixture-of-experts layers",
                           op->name);
    TRY(op->read(be, &ws->router, 0, r->logits, (size_t)M * c->n_experts * sizeof *r->logits));
    route(c, bt, logit_scale, L->expert_scale, r);
    for (int e = 0; e < c->n_experts; e++) {
        const int ne = r->count[e], *re = r->rows + r->off[e];
        if (!ne) continue;
        const lmx_tensor *ex = &L->experts[3 * e];
        TRY(op->gather_rows(be, &ws->mx, &ws->xn, re, ne, C));
        TRY(op->matmul(be, &gate, &ws->mx, &ex[0], NULL, ne));
        TRY(op->matmul(be, &up, &ws->mx, &ex[1], NULL, ne));
        TRY(op->glu(be, &gate, &gate, &up, (int64_t)ne * Fm, c->act));
        TRY(op->matmul(be, &ws->my, &gate, &ex[2], NULL, ne));
        TRY(op->scatter_add_rows(be, out, &ws->my, re, r->w + r->off[e], ne, C));
    }
    return LMX_OK;
}

/* A mixture of experts, routed by the backend (the moe op) or else on the host (moe_host).  qwen3_moe,
 * in place of the MLP: router on ffn_norm(x), out the residual stream x.  gemma4, beside the MLP:
 * router on rmsnorm(x) router.scale / sqrt(C), experts on ffn_norm_2(x), out ws->moe_sum (cleared
 * first), then normed by post_ffn_norm_2. */
static lmx_status moe_block(lmx_model *m, int l, const lmx_batch *bt, int M) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    const lmx_layer *L = &m->layers[l];
    const lmx_config *c = &m->cfg;
    const int64_t C = c->hidden;
    const float eps = (float)c->eps;
    const int beside = c->moe_beside_mlp;
    const double logit_scale = beside ? 1.0 / sqrt((double)C) : 1.0;
    lmx_tensor *out = beside ? &ws->moe_sum : &ws->x; /* [M, C] */
    TRY(op->rmsnorm(be, &ws->xn, &ws->x, beside ? &L->router_norm : &L->ffn_norm, M, (int)C, eps,
                    beside ? 0.0f : m->norm_add_one));
    TRY(op->matmul(be, &ws->router, &ws->xn, &L->router, NULL, M)); /* [M, E] */
    if (beside) {
        TRY(op->rmsnorm(be, &ws->xn, &ws->x, &L->ffn_norm_2, M, (int)C, eps, m->norm_add_one));
        TRY(op->scale(be, out, (int64_t)M * C, 0.0f));
    }
    const lmx_moe_args a = {out, &ws->xn, &ws->router, L->experts, L->expert_scale, M, c->n_experts, c->n_experts_used,
                            c->norm_topk, (float)logit_scale, c->act, L->experts_alike};
    lmx_status st = op->moe ? op->moe(be, &a) : LMX_ERR_UNSUPPORTED;
    if (st == LMX_ERR_UNSUPPORTED) st = moe_host(m, l, bt, M, out, logit_scale);
    else if (st) return lmx_err_set(&m->err, st, "%s", be->err.msg);
    if (st) return st;
    if (beside) TRY(op->rmsnorm(be, out, out, &L->post_ffn_norm_2, M, (int)C, eps, m->norm_add_one));
    return LMX_OK;
}

/* gemma4's per-layer input of layer l joins the residual stream:
 *   x += post_norm(((act(x W_gate^T) * ple[:, l]) W_proj^T)       ple[:, l] [M, P] gathered from ws->ple */
static lmx_status ple_block(lmx_model *m, int l, int M) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    const lmx_layer *L = &m->layers[l];
    const lmx_config *c = &m->cfg;
    const int nl = c->n_layers;
    const int64_t P = c->ple_dim;
    lmx_tensor all = as_rows(&ws->ple, (int64_t)M * nl, P);                          /* [M L, P] */
    lmx_tensor in = as_rows(&ws->ple_in, M, P), gate = as_rows(&ws->ple_gate, M, P); /* [M, P] */
    for (int i = 0; i < M; i++) ws->ple_rows[i] = i * nl + l;
    TRY(op->gather_rows(be, &in, &all, ws->ple_rows, M, P));
    TRY(op->matmul(be, &gate, &ws->x, &L->ple_gate, NULL, M));
    TRY(op->glu(be, &gate, &gate, &in, (int64_t)M * P, c->act));
    TRY(op->matmul(be, &ws->proj, &gate, &L->ple_proj, NULL, M));
    TRY(op->rmsnorm(be, &ws->proj, &ws->proj, &L->ple_norm, M, c->hidden, (float)c->eps, m->norm_add_one));
    TRY(op->add(be, &ws->x, &ws->proj, (int64_t)M * c->hidden));
    return LMX_OK;
}

/* gemma4's per-layer inputs of every layer from the embeddings ws->x and the tokens ids, into ws->ple
 * [M, L*P] (layer l's P values at columns l P ..):
 *   ple = (rmsnorm_P(x W_model^T / sqrt(C)) + embed_ple[ids] sqrt(P)) / sqrt(2) */
static lmx_status ple_inputs(lmx_model *m, const int32_t *ids, int M) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    lmx_workspace *ws = &m->ws;
    const lmx_config *c = &m->cfg;
    const int64_t P = c->ple_dim, LP = (int64_t)c->n_layers * P, n = (int64_t)M * LP;
    lmx_tensor ple = as_rows(&ws->ple, M, LP), emb = as_rows(&ws->ple_emb, M, LP); /* [M, L*P] */
    TRY(op->matmul(be, &ple, &ws->x, &m->ple_model_proj, NULL, M));
    TRY(op->scale(be, &ple, n, (float)(1.0 / sqrt((double)c->hidden))));
    TRY(op->rmsnorm(be, &ple, &ple, &m->ple_proj_norm, M * c->n_layers, (int)P, (float)c->eps, m->norm_add_one));
    TRY(op->embed(be, &emb, &m->embed_ple, ids, M, sqrtf((float)P)));
    TRY(op->add(be, &ple, &emb, n));
    TRY(op->scale(be, &ple, n, (float)(1.0 / sqrt(2.0))));
    return LMX_OK;
}

/* What the pass leaves on the host for its R rows: logits [R, V], or with k > 0 the k best of each
 * row in vals / ids [R, k] (*k_out = k), the logits when the backend cannot select them (*k_out = 0). */
typedef struct fwd_out {
    float *logits;
    int k;
    float *vals;
    int32_t *ids;
    int *k_out;
} fwd_out;

/* The final norm and the lm head (soft-capped for gemma2) on R rows of the last layer's output ws->x:
 * logits [R, V] in ws->logits. */
static lmx_status head(lmx_model *m, const int *rows, int R) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    const lmx_config *c = &m->cfg;
    lmx_workspace *ws = &m->ws;
    lmx_status st;
    if ((st = op->gather_rows(be, &ws->xr, &ws->x, rows, R, c->hidden)) ||
        (st = op->rmsnorm(be, &ws->xr, &ws->xr, &m->final_norm, R, c->hidden, (float)c->eps, m->norm_add_one)) ||
        (st = op->matmul(be, &ws->logits, &ws->xr, &m->lm_head, NULL, R)) ||
        (c->final_softcap > 0 && (st = op->softcap(be, &ws->logits, (int64_t)R * c->vocab, (float)c->final_softcap))))
        return lmx_err_set(&m->err, st, "%s", be->err.msg);
    return LMX_OK;
}

lmx_status lmx_model_head(lmx_model *m, const int *rows, int R, float *logits) {
    lmx_status st = ws_reserve(m, m->ws.max_batch, m->ws.max_rows, R);
    if (!st) st = head(m, rows, R);
    if (!st && logits && (st = m->be->ops->read(m->be, &m->ws.logits, 0, logits, (size_t)R * m->cfg.vocab * sizeof(float))))
        lmx_err_set(&m->err, st, "%s", m->be->err.msg);
    return st;
}

lmx_status lmx_model_layer_buffers(lmx_model *m, int release) { return lmx_model_layer_buffers_of(m, LMX_WS_ALL, release); }

lmx_status lmx_model_layer_buffers_of(lmx_model *m, unsigned groups, int release) {
    static const unsigned group[LAYER_BUFS] = {LMX_WS_SHARED, LMX_WS_ATTN, LMX_WS_ATTN, LMX_WS_ATTN,
                                               LMX_WS_ATTN,   LMX_WS_SHARED, LMX_WS_MLP, LMX_WS_MLP};
    lmx_backend *be = m->be;
    lmx_tensor *t[LAYER_BUFS];
    int64_t w[LAYER_BUFS];
    lmx_dtype dt[LAYER_BUFS];
    layer_buffers(m, t, w, dt);
    for (int i = 0; i < LAYER_BUFS; i++) {
        if (!(group[i] & groups)) continue;
        if (release) {
            if (t[i]->data) be->ops->release(be, t[i]);
            continue;
        }
        if (t[i]->data || m->ws.max_rows <= 0) continue;
        *t[i] = (lmx_tensor){.dtype = dt[i], .ndim = 2, .shape = {m->ws.max_rows, w[i]}};
        lmx_status st = lmx_backend_alloc_raw(be, t[i]);
        if (st) {
            m->ws.max_rows = 0; /* the next pass makes every buffer again */
            return lmx_err_set(&m->err, st, "%s", be->err.msg);
        }
    }
    return LMX_OK;
}

void lmx_model_head_release(lmx_model *m) {
    if (m->ws.xr.data) m->be->ops->release(m->be, &m->ws.xr);
    if (m->ws.logits.data) m->be->ops->release(m->be, &m->ws.logits);
    m->ws.max_out_rows = 0;
}

/* The pass up to the layers: checked token ids, caches reserved, embeddings in ws->x (room for R head rows). */
static lmx_status embed_pass(lmx_model *m, lmx_kv_layer *const *kv_all, const lmx_batch *bt, const int32_t *tokens, int R) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    const lmx_config *c = &m->cfg;
    int M = bt->B * bt->T;
    if (m->traits.gemma4 && !op->scale)
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the %s backend cannot run gemma4 models (no scale op)", op->name);
    if (layer_buffers_retyped(m)) m->ws.max_rows = 0; /* every buffer made again */
    lmx_status st = ws_reserve(m, bt->B, M, R);
    if (st) return st;
    int32_t *ids = m->ws.ids;

    /* padding rows look up token 0; their results are never read */
    for (int b = 0; b < bt->B; b++)
        for (int t = 0; t < bt->T; t++) {
            int32_t id = tokens[b * bt->T + t];
            if (t < bt->n_new[b] && (id < 0 || id >= c->vocab)) {
                st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "token id %d outside the vocabulary [0, %d)", id,
                                 c->vocab);
                return st;
            }
            if (t < bt->n_new[b] && c->ple_dim > 0 && id >= c->ple_vocab)
                return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "token id %d outside the per-layer input vocabulary "
                                   "[0, %d)", id, c->ple_vocab);
            ids[b * bt->T + t] = t < bt->n_new[b] ? id : 0;
        }
    for (int b = 0; b < bt->B && st == LMX_OK; b++)
        for (int l = 0; l < c->n_layers && st == LMX_OK; l++) {
            const int64_t KD = lmx_model_kv_row(m, l); /* 0: a shared-KV layer keeps no cache */
            if (KD && !bt->no_cache && op->kv_reserve(be, &kv_all[b][l], bt->n_past[b] + bt->n_new[b], KD) != LMX_OK)
                st = lmx_err_set(&m->err, be->err.status, "%s", be->err.msg);
        }
    if (st) return st;
    if ((st = op->embed(be, &m->ws.x, &m->embed, ids, M, m->embed_scale)) != LMX_OK)
        return lmx_err_set(&m->err, st, "%s", be->err.msg);
    return c->ple_dim > 0 ? ple_inputs(m, ids, M) : LMX_OK;
}

/* Layers [l0, l1) on ws->x. */
static lmx_status layers(lmx_model *m, lmx_kv_layer *const *kv_all, const lmx_adapter *const *ad, const lmx_batch *bt,
                         int l0, int l1) {
    lmx_backend *be = m->be;
    const int M = bt->B * bt->T;
    lmx_status st = LMX_OK;
    for (int l = l0; l < l1 && !st; l++) {
        const lmx_layer *L = &m->layers[l];
        st = attention_block(m, l, kv_all, ad, m->ws.kv, bt, M);
        if (!st && m->layer_save && m->layer_save->mid) st = m->layer_save->mid(m->layer_save->user, l);
        if (!st) st = lmx_layer_experts_only(m, l) ? moe_block(m, l, bt, M) : mlp_block(m, l, ad, bt, M);
        if (!st && L->ple_gate.data) st = ple_block(m, l, M);
        if (!st && L->layer_scalar != 1.0f) TRY(be->ops->scale(be, &m->ws.x, (int64_t)M * m->cfg.hidden, L->layer_scalar));
    }
    return st;
}

lmx_status lmx_model_embed(lmx_model *m, lmx_kv_layer *const *kv, const lmx_batch *bt, const int32_t *tokens) {
    return embed_pass(m, kv, bt, tokens, 0);
}

lmx_status lmx_model_layers(lmx_model *m, lmx_kv_layer *const *kv, const lmx_adapter *const *ad, const lmx_batch *bt,
                            int l0, int l1) {
    if (l0 < 0 || l1 > m->cfg.n_layers || l0 > l1)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "layers [%d, %d) of a model of %d", l0, l1, m->cfg.n_layers);
    return layers(m, kv, ad, bt, l0, l1);
}

static lmx_status forward(lmx_model *m, lmx_kv_layer *const *kv_all, const lmx_adapter *const *ad, const lmx_batch *bt,
                          const int32_t *tokens, const int *rows, int R, const fwd_out *out) {
    lmx_backend *be = m->be;
    const lmx_backend_ops *op = be->ops;
    const lmx_config *c = &m->cfg;
    lmx_workspace *ws = &m->ws;
    const size_t logit_bytes = (size_t)R * c->vocab * sizeof(float);
    lmx_status st = embed_pass(m, kv_all, bt, tokens, R);
    if (!st && R > 0 && out->k == 0 && out->logits && op->read_ahead && /* the step ends reading the logits */
        (st = op->read_ahead(be, &ws->logits, out->logits, logit_bytes)))
        return lmx_err_set(&m->err, st, "%s", be->err.msg);
    if (!st) st = layers(m, kv_all, ad, bt, 0, c->n_layers);
    if (st) return st;
    if (R > 0) {
        if ((st = head(m, rows, R))) return st;
        st = LMX_ERR_UNSUPPORTED;
        if (out->k > 0) {
            if (op->topk) st = op->topk(be, &ws->logits, R, c->vocab, out->k, out->vals, out->ids);
            *out->k_out = st == LMX_OK ? out->k : 0;
        }
        if (st == LMX_ERR_UNSUPPORTED) { /* whole rows: asked for, or the backend declined to select */
            lmx_err_clear(&be->err);
            st = op->read(be, &ws->logits, 0, out->logits, logit_bytes);
        }
        if (st) return lmx_err_set(&m->err, st, "%s", be->err.msg);
    }
    return LMX_OK;
}

lmx_status lmx_model_forward(lmx_model *m, lmx_kv_layer *const *kv, const lmx_adapter *const *ad, const lmx_batch *bt,
                             const int32_t *tokens, const int *rows, int R, float *logits) {
    const fwd_out out = {.logits = logits};
    return forward(m, kv, ad, bt, tokens, rows, R, &out);
}

lmx_status lmx_model_forward_topk(lmx_model *m, lmx_kv_layer *const *kv, const lmx_adapter *const *ad,
                                  const lmx_batch *bt, const int32_t *tokens, const int *rows, int R, int k, float *vals,
                                  int32_t *ids, float *logits, int *k_out) {
    const fwd_out out = {.logits = logits, .k = k, .vals = vals, .ids = ids, .k_out = k_out};
    return forward(m, kv, ad, bt, tokens, rows, R, &out);
}
