/* context.c - one sequence's KV caches on a model, and evaluation of single and padded batches.
 *
 * Cache policy per layer: a sliding-window layer keeps a rotating cache of `window` positions;
 * a global layer keeps an unbounded cache (grown in chunks by the backend).  With n_ctx > 0
 * every layer keeps at most n_ctx positions in a rotating cache.  Gemma 4's shared-KV layers keep
 * none (they attend over an earlier layer's).  Long prompts are evaluated in
 * chunks of the backend's prefill_chunk rows so activation memory stays bounded. */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"
#include "../model/adapter.h"


struct lmx_context {
    lmx_model *m;
    lmx_kv_layer *kv;     /* [n_layers] */
    int n_past;
    unsigned adapter;     /* id of the adapter it evaluates with (0: none) */
    int *rows;            /* [rows_cap]: logit rows requested from the forward pass */
    int rows_cap;
};

lmx_context_params lmx_context_default_params(void) {
    lmx_context_params p = {.n_ctx = 0};
    return p;
}

void lmx_context_free(lmx_context *c) {
    if (!c) return;
    lmx_backend *be = c->m->be;
    for (int l = 0; c->kv && l < c->m->cfg.n_layers; l++) {
        be->ops->release(be, &c->kv[l].k);
        be->ops->release(be, &c->kv[l].v);
    }
    free(c->kv);
    free(c->rows);
    free(c);
}

lmx_status lmx_context_create(lmx_model *m, const lmx_context_params *params, lmx_context **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    if (m->bridge) /* mlx-lm keeps its own caches; only the generation calls reach it */
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the mlx_lm backend has no contexts: use the generation calls");
    lmx_context_params dp = lmx_context_default_params();
    if (!params) params = &dp;
    if (params->n_ctx < 0)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "context length %d is negative", params->n_ctx);
    lmx_context *c = calloc(1, sizeof *c);
    if (c) c->kv = calloc((size_t)m->cfg.n_layers, sizeof *c->kv);
    if (!c || !c->kv) {
        free(c);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    c->m = m;
    c->adapter = m->default_adapter;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        lmx_kv_layer *kv = &c->kv[l];
        const int64_t KD = lmx_model_kv_row(m, l); /* 0: the layer attends over another one's cache */
        int window = m->layers[l].sliding ? m->cfg.sliding_window : 0;
        if (params->n_ctx > 0 && (window == 0 || params->n_ctx < window)) window = params->n_ctx;
        kv->window = window;
        if (window == 0 || KD == 0) continue; /* unbounded: grown on demand */
        kv->rotating = 1;
        kv->cap = window;
        lmx_tensor *ts[2] = {&kv->k, &kv->v};
        for (int i = 0; i < 2; i++) {
            *ts[i] = (lmx_tensor){.dtype = m->be->ops->kv_dtype, .ndim = 2, .shape = {window, KD}};
            if (m->be->ops->alloc(m->be, ts[i]) != LMX_OK) {
                lmx_err_set(&m->err, m->be->err.status, "%s", m->be->err.msg);
                lmx_context_free(c);
                return m->err.status;
            }
        }
    }
    *out = c;
    return LMX_OK;
}

void lmx_context_reset(lmx_context *c) {
    if (c) c->n_past = 0;
}

int lmx_context_n_past(const lmx_context *c) { return c ? c->n_past : 0; }

lmx_status lmx_context_set_adapter(lmx_context *c, lmx_adapter *a) {
    if (!c) return LMX_ERR_INVALID_ARG;
    unsigned id;
    lmx_status st = lmx_adapter_resolve(c->m, a, &id);
    if (st) return st;
    if (id != c->adapter) c->n_past = 0; /* its cache was computed under the other adapter */
    c->adapter = id;
    return LMX_OK;
}

unsigned lmx_context_adapter(const lmx_context *c) { return c->adapter; }

const lmx_kv_layer *lmx_context_kv(const lmx_context *c, int l) { return &c->kv[l]; }

/* The adapter of c for the forward pass: *a NULL for none; an error when it has been freed. */
static lmx_status context_adapter(const lmx_context *c, const lmx_adapter **a) {
    *a = lmx_adapter_by_id(c->m, c->adapter);
    if (c->adapter && !*a)
        return lmx_err_set(&c->m->err, LMX_ERR_INVALID_ARG, "the context's adapter has been freed; set another");
    return LMX_OK;
}

/* Position p of a rotating cache lives in slot p % cap until position p + cap overwrites it.
 * Starting again at n needs positions [n - cap, n): intact iff max(cap, n) >= n_past. */
int lmx_context_rewind(lmx_context *c, int n) {
    if (n > c->n_past) return -1;
    for (int l = 0; l < c->m->cfg.n_layers; l++) {
        const lmx_kv_layer *kv = &c->kv[l];
        if (kv->rotating && (kv->cap > n ? kv->cap : n) < c->n_past) return -1;
    }
    c->n_past = n;
    return 0;
}

void lmx_context_pad_at(lmx_context *c, int n) {
    if (n <= c->n_past) c->n_past = n;
}

int64_t lmx_context_bytes(const lmx_context *c) {
    int64_t b = 0;
    for (int l = 0; l < c->m->cfg.n_layers; l++)
        b += 2 * (lmx_tensor_nelem(&c->kv[l].k) * (int64_t)lmx_dtype_size(c->kv[l].k.dtype));
    return b;
}

void lmx_context_reserve(lmx_context *c, int n) {
    lmx_backend *be = c->m->be;
    for (int l = 0; l < c->m->cfg.n_layers; l++) {
        const int64_t KD = lmx_model_kv_row(c->m, l);
        if (KD && !c->kv[l].rotating && be->ops->kv_reserve(be, &c->kv[l], n, KD) != LMX_OK) {
            lmx_err_clear(&be->err); /* no room now: the caches grow as positions come, as without */
            return;
        }
    }
}

static lmx_status reserve_rows(lmx_context *c, int n) {
    if (n <= c->rows_cap) return LMX_OK;
    int *r = realloc(c->rows, (size_t)n * sizeof *r);
    if (!r) return lmx_err_set(&c->m->err, LMX_ERR_NOMEM, "out of memory");
    c->rows = r;
    c->rows_cap = n;
    return LMX_OK;
}

/* lmx_context_eval, or with k > 0 the last position's k best candidates (see runtime.h; logits is
 * then where the row goes when the backend cannot select them). */
static lmx_status eval(lmx_context *c, const int32_t *tokens, int n, float *logits, int all_logits, int k,
                       float *vals, int32_t *ids, int *k_out) {
    if (!c) return LMX_ERR_INVALID_ARG;
    lmx_model *m = c->m;
    if (!tokens || n <= 0)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "lmx_context_eval: no tokens");
    int V = m->cfg.vocab;
    for (int i = 0; i < n; i++) /* all ids first: a bad one must not leave earlier chunks cached */
        if (tokens[i] < 0 || tokens[i] >= V)
            return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "token id %d at position %d outside the vocabulary [0, %d)",
                               tokens[i], i, V);
    const lmx_adapter *ad;
    lmx_status ast = context_adapter(c, &ad);
    if (ast) return ast;
    for (int done = 0; done < n;) {
        const int max_chunk = lmx_prefill_chunk(m);
        int chunk = n - done < max_chunk ? n - done : max_chunk;
        int last = done + chunk == n;
        int R = 0;
        float *dst = NULL;
        if (logits && all_logits) {
            R = chunk;
            dst = logits + (size_t)done * V;
        } else if (logits && last) {
            R = 1;
            dst = logits;
        }
        lmx_status st = reserve_rows(c, chunk);
        if (st) return st;
        for (int r = 0; r < R; r++) c->rows[r] = R == 1 ? chunk - 1 : r;
        int n_past = c->n_past, n_new = chunk;
        lmx_batch bt = {.B = 1, .T = chunk, .n_past = &n_past, .n_new = &n_new};
        lmx_kv_layer *kv = c->kv;
        const lmx_adapter *const *ads = ad ? &ad : NULL;
        st = k > 0 && last ? lmx_model_forward_topk(m, &kv, ads, &bt, tokens + done, c->rows, 1, k, vals, ids, dst, k_out)
                           : lmx_model_forward(m, &kv, ads, &bt, tokens + done, c->rows, R, dst);
        if (st) return st;
        c->n_past += chunk;
        done += chunk;
    }
    return LMX_OK;
}

lmx_status lmx_context_eval(lmx_context *c, const int32_t *tokens, int n, float *logits, int all_logits) {
    return eval(c, tokens, n, logits, all_logits, 0, NULL, NULL, NULL);
}

lmx_status lmx_context_eval_topk(lmx_context *c, const int32_t *tokens, int n, int k, float *vals, int32_t *ids,
                                 float *logits, int *k_out) {
    return eval(c, tokens, n, logits, 0, k, vals, ids, k_out);
}

/* lmx_eval_batch, or with k > 0 each sequence's k best candidates (see runtime.h). */
static lmx_status eval_batch(lmx_model *m, lmx_context *const *ctxs, int B, const int32_t *tokens, const int *lens,
                             int T, float *last_logits, int k, float *vals, int32_t *ids, int *k_out) {
    if (!m) return LMX_ERR_INVALID_ARG;
    if (!ctxs || !tokens || !lens || !last_logits || B <= 0 || T <= 0)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "lmx_eval_batch: empty batch or NULL argument");
    lmx_status st = LMX_OK;
    int *n_past = malloc((size_t)B * sizeof *n_past);
    int *rows = malloc((size_t)B * sizeof *rows);
    lmx_kv_layer **kv = malloc((size_t)B * sizeof *kv);
    const lmx_adapter **ad = malloc((size_t)B * sizeof *ad);
    int any_adapter = 0;
    if (!n_past || !rows || !kv || !ad) {
        st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int b = 0; b < B; b++) {
        if (!ctxs[b] || ctxs[b]->m != m) {
            st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "lmx_eval_batch: context %d does not belong to this model", b);
            goto done;
        }
        for (int o = 0; o < b; o++)
            if (ctxs[o] == ctxs[b]) {
                st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "lmx_eval_batch: context %d appears twice", b);
                goto done;
            }
        if (lens[b] < 1 || lens[b] > T) {
            st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "lmx_eval_batch: length %d of sequence %d outside [1, %d]",
                             lens[b], b, T);
            goto done;
        }
        n_past[b] = ctxs[b]->n_past;
        rows[b] = b * T + lens[b] - 1;
        kv[b] = ctxs[b]->kv;
        if ((st = context_adapter(ctxs[b], &ad[b]))) goto done;
        any_adapter |= ad[b] != NULL;
    }
    lmx_batch bt = {.B = B, .T = T, .n_past = n_past, .n_new = lens};
    const lmx_adapter *const *ads = any_adapter ? ad : NULL;
    st = k > 0 ? lmx_model_forward_topk(m, kv, ads, &bt, tokens, rows, B, k, vals, ids, last_logits, k_out)
               : lmx_model_forward(m, kv, ads, &bt, tokens, rows, B, last_logits);
    if (st == LMX_OK)
        for (int b = 0; b < B; b++) ctxs[b]->n_past += lens[b];
done:
    free(n_past);
    free(rows);
    free(kv);
    free(ad);
    return st;
}

lmx_status lmx_eval_batch(lmx_model *m, lmx_context *const *ctxs, int B, const int32_t *tokens, const int *lens,
                          int T, float *last_logits) {
    return eval_batch(m, ctxs, B, tokens, lens, T, last_logits, 0, NULL, NULL, NULL);
}

lmx_status lmx_eval_batch_topk(lmx_model *m, lmx_context *const *ctxs, int B, const int32_t *tokens, const int *lens,
                               int T, int k, float *vals, int32_t *ids, float *last_logits, int *k_out) {
    return eval_batch(m, ctxs, B, tokens, lens, T, last_logits, k, vals, ids, k_out);
}
