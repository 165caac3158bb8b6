/* session.c - a model's generation session: lazily loaded tokenizer and chat template, the
 * prompt cache (one context whose KV holds the last prompt and its generated tokens), metrics. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime.h"


double lmx_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- buffers -------------------------------------------------------------------------------- */

/* Grow b to hold need bytes and a NUL; with limited, refuse growth past be's memory limit. */
static int buf_grow(lmx_backend *be, lmx_buf *b, size_t need, int limited) {
    if (need + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need + 1) cap *= 2;
    if (limited && lmx_backend_mem_check(be, (int64_t)(cap - b->cap))) return -1;
    char *p = realloc(b->data, cap);
    if (!p) {
        lmx_err_set(&be->err, LMX_ERR_NOMEM, "out of memory (%zu bytes)", cap);
        return -1;
    }
    lmx_backend_mem(be, (int64_t)(cap - b->cap));
    b->data = p;
    b->cap = cap;
    return 0;
}

int lmx_buf_reserve(lmx_backend *be, lmx_buf *b, size_t need) { return buf_grow(be, b, need, 0); }
int lmx_buf_reserve_limited(lmx_backend *be, lmx_buf *b, size_t need) { return buf_grow(be, b, need, 1); }

int lmx_buf_append(lmx_backend *be, lmx_buf *b, const void *p, size_t n) {
    if (lmx_buf_reserve(be, b, b->len + n)) return -1;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void lmx_buf_free(lmx_backend *be, lmx_buf *b) {
    if (b->data) lmx_backend_mem(be, -(int64_t)b->cap);
    free(b->data);
    memset(b, 0, sizeof *b);
}

/* ---- the session --------------------------------------------------------------------------- */

lmx_status lmx_runtime_create(lmx_model *m, const char *path, const lmx_load_params *p) {
    lmx_runtime *rt = calloc(1, sizeof *rt);
    if (rt) rt->path = strdup(path);
    if (!rt || !rt->path) {
        free(rt);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    rt->n_ctx = p->n_ctx;
    rt->cache_limit = p->cache_limit;
    rt->seed = p->seed;
    atomic_init(&rt->cancel, 0);
    rt->stream.m = m;
    m->rt = rt;
    return LMX_OK;
}

void lmx_runtime_free(lmx_model *m) {
    lmx_runtime *rt = m->rt;
    if (!rt) return;
    lmx_backend *be = m->be;
    lmx_gen_seq_free(&rt->stream.seq, be);
    for (int i = 0; i < rt->n_bseq; i++) lmx_gen_seq_free(&rt->bseq[i], be);
    free(rt->bseq);
    lmx_context_free(rt->ctx);
    lmx_buf_free(be, &rt->hist);
    if (rt->logits) lmx_backend_mem(be, -(int64_t)((size_t)m->cfg.vocab * sizeof(float)));
    lmx_host_free(m, rt->logits);
    if (rt->sampler.cand) lmx_backend_mem(be, -(int64_t)lmx_sampler_bytes(m->cfg.vocab));
    lmx_sampler_free(&rt->sampler);
    lmx_tok_free(rt->tok);
    lmx_chat_template_free(rt->tpl);
    free(rt->path);
    free(rt);
    m->rt = NULL;
}

lmx_tokenizer *lmx_runtime_tokenizer(lmx_model *m) {
    lmx_runtime *rt = m->rt;
    if (!rt->tok && rt->tok_status == LMX_OK) {
        rt->tok_status = lmx_tok_load(rt->path, &rt->tok, &rt->tok_err);
        if (rt->tok_status == LMX_OK && lmx_tok_vocab_size(rt->tok) > m->cfg.vocab)
            rt->tok_status = lmx_err_set(&rt->tok_err, LMX_ERR_SHAPE, "the tokenizer has %d tokens, the model %d",
                                         (int)lmx_tok_vocab_size(rt->tok), m->cfg.vocab);
        if (rt->tok_status != LMX_OK) {
            lmx_tok_free(rt->tok);
            rt->tok = NULL;
            if (rt->tok_status == LMX_ERR_IO) rt->tok_status = LMX_ERR_MISSING;
            lmx_err_prefix(&rt->tok_err, "no usable tokenizer");
        }
    }
    if (!rt->tok) lmx_err_set(&m->err, rt->tok_status, "%s", rt->tok_err.msg);
    return rt->tok;
}

lmx_status lmx_runtime_encode(lmx_model *m, const char *text, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    lmx_tokenizer *tok = lmx_runtime_tokenizer(m);
    if (!tok) return m->err.status;
    if (!text) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the prompt is NULL");
    lmx_tok_info ti;
    lmx_tok_get_info(tok, &ti);
    /* a prompt (or rendered template) that writes the BOS token itself must not get a second */
    int has_bos = ti.bos_token && *ti.bos_token && !strncmp(text, ti.bos_token, strlen(ti.bos_token));
    size_t count = 0;
    lmx_status st = lmx_tok_encode(tok, text, strlen(text), !has_bos, ids, &count, &m->err);
    if (st) return st;
    if (count == 0) {
        free(*ids);
        *ids = NULL;
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the prompt encodes to no tokens");
    }
    *n = (int)count;
    return LMX_OK;
}

lmx_status lmx_runtime_ready(lmx_model *m) {
    lmx_runtime *rt = m->rt;
    int V = m->cfg.vocab;
    if (!rt->ctx) {
        lmx_context_params cp = lmx_context_default_params();
        cp.n_ctx = rt->n_ctx;
        lmx_status st = lmx_context_create(m, &cp, &rt->ctx);
        if (st) return st;
    }
    if (!rt->logits) {
        if (lmx_backend_mem_check(m->be, (int64_t)((size_t)V * sizeof(float)) + (int64_t)lmx_sampler_bytes(V)))
            return lmx_err_set(&m->err, LMX_ERR_NOMEM, "%s", m->be->err.msg);
        if (!(rt->logits = lmx_host_alloc(m, (size_t)V * sizeof(float)))) /* read every step */
            return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        lmx_backend_mem(m->be, (int64_t)((size_t)V * sizeof(float)));
    }
    if (!rt->sampler.cand) {
        if (lmx_sampler_init(&rt->sampler, V)) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        lmx_backend_mem(m->be, (int64_t)lmx_sampler_bytes(V));
    }
    return LMX_OK;
}

/* Room for need bytes of history ids, within the memory limit (the session's other buffers, a few
 * hundred bytes of text per generation, are counted but not refused: a started generation never
 * loses text); 0, or -1 with m->err set. */
static int hist_reserve(lmx_model *m, size_t need) {
    if (!lmx_buf_reserve_limited(m->be, &m->rt->hist, need)) return 0;
    lmx_err_set(&m->err, LMX_ERR_NOMEM, "%s", m->be->err.msg);
    return -1;
}

/* The most positions a session may hold: unbounded caches stop at the model's trained length. */
static int session_limit(const lmx_model *m) {
    if (m->rt->n_ctx > 0) return 0; /* rotating: no limit */
    return m->cfg.max_positions > 0 ? m->cfg.max_positions : 0;
}

lmx_status lmx_runtime_prefill(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *p, int k) {
    lmx_runtime *rt = m->rt;
    if (!ids || n <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the prompt is empty");
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab)
            return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "token id %d at position %d outside the vocabulary [0, %d)",
                               ids[i], i, m->cfg.vocab);
    int limit = session_limit(m);
    if (limit && n > limit)
        return lmx_err_set(&m->err, LMX_ERR_CONTEXT_FULL, "the prompt has %d tokens; the context holds %d", n, limit);
    lmx_status st = lmx_runtime_ready(m);
    if (st) return st;
    /* KV cached under another adapter is never reused: switching forgets the cached positions */
    unsigned cached_under = lmx_context_adapter(rt->ctx);
    if ((st = lmx_context_set_adapter(rt->ctx, p ? p->adapter : NULL))) return st;
    if (lmx_context_adapter(rt->ctx) != cached_under) rt->hist.len = 0;

    /* the prompt cache: the longest common prefix, leaving at least one token to evaluate */
    const int32_t *hist = (const int32_t *)rt->hist.data;
    int n_hist = (int)(rt->hist.len / sizeof(int32_t)), L = 0;
    while (L < n_hist && L < n - 1 && hist[L] == ids[L]) L++;
    if (lmx_context_rewind(rt->ctx, L)) {
        L = 0;
        lmx_context_reset(rt->ctx);
    }
    rt->hist.len = (size_t)L * sizeof(int32_t);
    size_t more = p ? (size_t)(p->max_tokens < (1 << 16) ? p->max_tokens : (1 << 16)) : 0;
    if (hist_reserve(m, ((size_t)n + more) * sizeof(int32_t))) return m->err.status;
    if (p) { /* a generation follows: the caches for it too */
        const int gen = lmx_gen_reserve(p->max_tokens);
        lmx_context_reserve(rt->ctx, limit && n + gen > limit ? limit : n + gen);
    }
    rt->metrics.prompt_tokens = n;
    rt->metrics.cached_tokens = L;
    rt->n_cand = 0;
    double t0 = lmx_now_ms();
    const int step = lmx_prefill_chunk(m); /* rows per eval: the cancel / progress granularity */
    for (int done = L; done < n;) {
        if (atomic_load(&rt->cancel)) break; /* the caller sees the flag and finishes */
        int chunk = n - done < step ? n - done : step;
        st = k > 0 && done + chunk == n
                 ? lmx_context_eval_topk(rt->ctx, ids + done, chunk, k, rt->cand_vals, rt->cand_ids, rt->logits, &rt->n_cand)
                 : lmx_context_eval(rt->ctx, ids + done, chunk, rt->logits, 0);
        if (st) {
            rt->n_cand = 0;
            lmx_context_reset(rt->ctx); /* a partial chunk may be cached: start clean next time */
            rt->hist.len = 0;
            return st;
        }
        memcpy(rt->hist.data + rt->hist.len, ids + done, (size_t)chunk * sizeof(int32_t));
        rt->hist.len += (size_t)chunk * sizeof(int32_t);
        done += chunk;
        if (p && p->on_prefill) p->on_prefill((float)(done - L) / (float)(n - L), p->prefill_user);
    }
    rt->metrics.prefill_ms = lmx_now_ms() - t0;
    rt->metrics.prefill_tokens_per_s = rt->metrics.prefill_ms > 0 ? (n - L) / (rt->metrics.prefill_ms * 1e-3) : 0;
    return LMX_OK;
}

lmx_status lmx_runtime_decode(lmx_model *m, int32_t id, int k) {
    lmx_runtime *rt = m->rt;
    int limit = session_limit(m);
    if (limit && lmx_context_n_past(rt->ctx) >= limit)
        return lmx_err_set(&m->err, LMX_ERR_CONTEXT_FULL, "the context holds %d positions", limit);
    if (hist_reserve(m, rt->hist.len + sizeof(int32_t))) return m->err.status;
    rt->n_cand = 0;
    lmx_status st = k > 0 ? lmx_context_eval_topk(rt->ctx, &id, 1, k, rt->cand_vals, rt->cand_ids, rt->logits, &rt->n_cand)
                          : lmx_context_eval(rt->ctx, &id, 1, rt->logits, 0);
    if (st) {
        rt->n_cand = 0;
        lmx_context_reset(rt->ctx);
        rt->hist.len = 0;
        return st;
    }
    memcpy(rt->hist.data + rt->hist.len, &id, sizeof id);
    rt->hist.len += sizeof id;
    return LMX_OK;
}

int lmx_runtime_full(const lmx_model *m) {
    int limit = session_limit(m);
    return limit && lmx_context_n_past(m->rt->ctx) >= limit;
}

void lmx_metrics_begin(lmx_model *m) {
    memset(&m->rt->metrics, 0, sizeof m->rt->metrics);
    atomic_store(&m->rt->cancel, 0);
    lmx_err_clear(&m->err);
}

void lmx_metrics_end(lmx_model *m, int generated, double t_start, double t_first, double t_end) {
    lmx_metrics *x = &m->rt->metrics;
    x->generated_tokens = generated;
    x->ttft_ms = t_first > 0 ? t_first - t_start : 0;
    x->decode_ms = t_first > 0 ? t_end - t_first : 0;
    x->decode_tokens_per_s = generated > 1 && x->decode_ms > 0 ? (generated - 1) / (x->decode_ms * 1e-3) : 0;
}

lmx_status lmx_get_metrics(const lmx_model *m, lmx_metrics *out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = m->rt->metrics;
    out->memory_bytes = m->be->mem_now;
    out->peak_memory_bytes = m->be->mem_peak;
    return LMX_OK;
}

void lmx_cancel(lmx_model *m) {
    if (m && m->rt) atomic_store(&m->rt->cancel, 1);
}

void lmx_prompt_cache_clear(lmx_model *m) {
    if (!m || !m->rt) return;
    if (m->rt->ctx) lmx_context_reset(m->rt->ctx);
    m->rt->hist.len = 0;
}
