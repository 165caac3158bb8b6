/* batch.c - several prompts at once: classification (one padded forward pass) and batched
 * generation (each sequence prefilled alone, then all decoded together, one row each). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define CLASSIFY_ROWS 4096   /* padded rows per forward pass; larger batches go in groups */

static lmx_status check_prompts(lmx_model *m, const int32_t *const *prompts, const int *lens, int N) {
    if (!prompts || !lens || N <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "no prompts");
    for (int i = 0; i < N; i++) {
        if (!prompts[i] || lens[i] <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "prompt %d is empty", i);
        for (int t = 0; t < lens[i]; t++)
            if (prompts[i][t] < 0 || prompts[i][t] >= m->cfg.vocab)
                return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "prompt %d: token id %d outside the vocabulary [0, %d)",
                                   i, prompts[i][t], m->cfg.vocab);
    }
    return LMX_OK;
}

static lmx_status begin(lmx_model *m) {
    if (!m) return LMX_ERR_INVALID_ARG;
    if (m->rt->stream.open)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a stream is open on this model; free it first");
    lmx_metrics_begin(m);
    return lmx_runtime_ready(m);
}

/* Encode N text prompts into malloc'ed arrays (freed with free_prompts). */
static lmx_status encode_all(lmx_model *m, const char *const *texts, int N, int32_t ***ids, int **lens) {
    if (!texts || N <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "no prompts");
    *ids = calloc((size_t)N, sizeof **ids);
    *lens = calloc((size_t)N, sizeof **lens);
    if (!*ids || !*lens) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int i = 0; i < N; i++) {
        lmx_status st = lmx_runtime_encode(m, texts[i], &(*ids)[i], &(*lens)[i]);
        if (st) return lmx_err_prefix(&m->err, "prompt %d", i);
    }
    return LMX_OK;
}

static void free_prompts(int32_t **ids, int *lens, int N) {
    for (int i = 0; ids && i < N; i++) free(ids[i]);
    free(ids);
    free(lens);
}

/* ---- classify ------------------------------------------------------------------------------ */

static lmx_status classify_group(lmx_model *m, const int32_t *const *prompts, const int *lens, int N,
                                 lmx_adapter *const *adapters, float *logits /* [N, V] */) {
    int T = 0;
    for (int i = 0; i < N; i++) T = lens[i] > T ? lens[i] : T;
    int32_t *tokens = calloc((size_t)N * (size_t)T, sizeof *tokens); /* [N, T], right-padded */
    lmx_context **ctxs = calloc((size_t)N, sizeof *ctxs);
    lmx_status st = LMX_OK;
    if (!tokens || !ctxs) st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int i = 0; st == LMX_OK && i < N; i++) {
        memcpy(tokens + (size_t)i * T, prompts[i], (size_t)lens[i] * sizeof *tokens);
        st = lmx_context_create(m, NULL, &ctxs[i]);
        if (st == LMX_OK && adapters) st = lmx_context_set_adapter(ctxs[i], adapters[i]);
    }
    if (st == LMX_OK) st = lmx_eval_batch(m, ctxs, N, tokens, lens, T, logits);
    for (int i = 0; ctxs && i < N; i++) lmx_context_free(ctxs[i]);
    free(ctxs);
    free(tokens);
    return st;
}

lmx_status lmx_classify_ids(lmx_model *m, const int32_t *const *prompts, const int *lens, int N,
                            lmx_adapter *const *adapters, const lmx_sampler_params *sampler, int32_t *next_ids,
                            float *logits) {
    lmx_status st = begin(m);
    if (st || (st = check_prompts(m, prompts, lens, N))) return st;
    if (!next_ids && !logits) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "neither next_ids nor logits asked for");
    size_t V = (size_t)m->cfg.vocab;
    double t0 = lmx_now_ms();
    lmx_rng rng;
    if (sampler) lmx_rng_seed(&rng, sampler->seed < 0 ? m->rt->seed : (uint64_t)sampler->seed);
    int T = 0, total = 0;
    for (int i = 0; i < N; i++) {
        T = lens[i] > T ? lens[i] : T;
        total += lens[i];
    }
    int group = CLASSIFY_ROWS / T > 0 ? CLASSIFY_ROWS / T : 1;
    if (group > N) group = N;
    float *own = logits ? NULL : malloc((size_t)group * V * sizeof *own);
    if (!logits && !own) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int i0 = 0; st == LMX_OK && i0 < N; i0 += group) {
        int n = N - i0 < group ? N - i0 : group;
        float *out = logits ? logits + (size_t)i0 * V : own;
        if ((st = classify_group(m, prompts + i0, lens + i0, n, adapters ? adapters + i0 : NULL, out))) break;
        for (int i = 0; next_ids && i < n; i++) {
            float *row = out + (size_t)i * V;
            if (!sampler) {
                next_ids[i0 + i] = lmx_argmax(row, (int)V);
                continue;
            }
            float *work = m->rt->logits; /* sampling must not change the returned logits */
            memcpy(work, row, V * sizeof *work);
            next_ids[i0 + i] = lmx_sampler_sample(&m->rt->sampler, sampler, &rng, work, prompts[i0 + i], lens[i0 + i]);
        }
    }
    free(own);
    lmx_metrics *x = &m->rt->metrics;
    x->prompt_tokens = total;
    x->prefill_ms = lmx_now_ms() - t0;
    x->prefill_tokens_per_s = x->prefill_ms > 0 ? total / (x->prefill_ms * 1e-3) : 0;
    return st;
}

lmx_status lmx_classify(lmx_model *m, const char *const *prompts, int N, lmx_adapter *const *adapters,
                        const lmx_sampler_params *sampler, int32_t *next_ids, float *logits) {
    if (!m) return LMX_ERR_INVALID_ARG;
    int32_t **ids = NULL;
    int *lens = NULL;
    lmx_status st = encode_all(m, prompts, N, &ids, &lens);
    if (st == LMX_OK) st = lmx_classify_ids(m, (const int32_t *const *)ids, lens, N, adapters, sampler, next_ids, logits);
    free_prompts(ids, lens, N);
    return st;
}

/* ---- batch generation ------------------------------------------------------------------------ */

typedef struct batch_state {
    lmx_context **ctx;    /* [N] */
    lmx_buf *hist;        /* [N] int32 ids evaluated in ctx[i] */
    float *logits;        /* [N, V] */
    float *cvals;         /* [N, LMX_TOPK_MAX]: candidates when the backend selects them */
    int32_t *cids;
    lmx_context **act_ctx;  /* [N]: the step's rows (live sequences, then padding ones), in sequence order */
    int32_t *act_tok;
    int *act_idx, *ones;
    int *pad_at;          /* [N]: a finished sequence's row that pads the step: the position it is evaluated at
                           * again every step; -1: its row has left the step */
    int *first_row;       /* [N]: the row of logits that holds sequence i's logits after its prompt (prefill_all) */
} batch_state;

static void batch_state_free(lmx_model *m, batch_state *b, int N) {
    for (int i = 0; i < N; i++) {
        if (b->ctx) lmx_context_free(b->ctx[i]);
        if (b->hist) lmx_buf_free(m->be, &b->hist[i]);
    }
    free(b->ctx);
    free(b->hist);
    lmx_host_free(m, b->logits);
    free(b->cvals);
    free(b->cids);
    free(b->act_ctx);
    free(b->act_tok);
    free(b->act_idx);
    free(b->ones);
    free(b->pad_at);
    free(b->first_row);
}

static int by_length(const void *a, const void *b) { /* keys (length << 32 | index), ascending */
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}
static int seq_of(int64_t key) { return (int)(key & 0x7fffffff); }

/* Evaluate every prompt into its context: shortest first, together in padded batches of at most a prefill chunk's rows
 * (lmx_eval_batch: a batch of short prompts reads the weights once, not once a prompt), a prompt that makes a batch
 * alone by itself (chunked).  The logits after sequence i's prompt land in row b->first_row[i] of b->logits. */
static lmx_status prefill_all(lmx_model *m, batch_state *b, const int32_t *const *prompts, const int *lens, int N) {
    const int chunk = lmx_prefill_chunk(m);
    const size_t V = (size_t)m->cfg.vocab;
    int64_t *ord = malloc((size_t)N * sizeof *ord);
    int *glen = malloc((size_t)N * sizeof *glen);
    int32_t *ids = malloc((size_t)chunk * sizeof *ids); /* [B, T] of a batch, B T <= chunk */
    lmx_context **gctx = malloc((size_t)N * sizeof *gctx);
    lmx_status st = LMX_OK;
    if (!ord || !glen || !ids || !gctx) st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int i = 0; st == LMX_OK && i < N; i++) ord[i] = (int64_t)lens[i] << 32 | i;
    if (st == LMX_OK) qsort(ord, (size_t)N, sizeof *ord, by_length);
    for (int j = 0; st == LMX_OK && j < N;) {
        int k = j + 1; /* the batch [j, k) of the sorted prompts: its rows, B times the longest, within a chunk */
        while (k < N && (int64_t)(k - j + 1) * lens[seq_of(ord[k])] <= chunk) k++;
        const int B = k - j, T = lens[seq_of(ord[k - 1])];
        if (B == 1) {
            const int i = seq_of(ord[j]);
            st = lmx_context_eval(b->ctx[i], prompts[i], lens[i], b->logits + (size_t)j * V, 0);
        } else {
            for (int r = 0; r < B; r++) {
                const int i = seq_of(ord[j + r]);
                gctx[r] = b->ctx[i];
                glen[r] = lens[i];
                memcpy(ids + (size_t)r * T, prompts[i], (size_t)lens[i] * sizeof *ids);
                memset(ids + (size_t)r * T + lens[i], 0, (size_t)(T - lens[i]) * sizeof *ids); /* padding (ignored) */
            }
            st = lmx_eval_batch(m, gctx, B, ids, glen, T, b->logits + (size_t)j * V);
        }
        for (int r = j; r < k; r++) b->first_row[seq_of(ord[r])] = r;
        j = k;
    }
    free(ord);
    free(glen);
    free(ids);
    free(gctx);
    return st;
}

/* Yield seq i's token to its callback (finishing it when the callback says stop). */
static void deliver(lmx_gen_seq *g) {
    if (g->p.on_token && g->p.on_token(&g->tok, g->p.user)) {
        g->finish = LMX_FINISH_CALLBACK;
        g->to_eval = -1;
    }
}

lmx_status lmx_batch_generate_ids(lmx_model *m, const int32_t *const *prompts, const int *lens, int N,
                                  const lmx_gen_params *params, lmx_result *results) {
    lmx_status st = begin(m);
    if (st || (st = check_prompts(m, prompts, lens, N))) return st;
    if (!params || !results) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "params or results is NULL");
    lmx_runtime *rt = m->rt;
    size_t V = (size_t)m->cfg.vocab;
    double t0 = lmx_now_ms(), t_first = 0;
    if (N > rt->n_bseq) {
        lmx_gen_seq *gs = realloc(rt->bseq, (size_t)N * sizeof *gs);
        if (!gs) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        memset(gs + rt->n_bseq, 0, (size_t)(N - rt->n_bseq) * sizeof *gs);
        rt->bseq = gs;
        rt->n_bseq = N;
    }
    batch_state b = {0};
    b.ctx = calloc((size_t)N, sizeof *b.ctx);
    b.hist = calloc((size_t)N, sizeof *b.hist);
    b.logits = lmx_host_alloc(m, (size_t)N * V * sizeof *b.logits); /* read every step */
    b.cvals = malloc((size_t)N * LMX_TOPK_MAX * sizeof *b.cvals);
    b.cids = malloc((size_t)N * LMX_TOPK_MAX * sizeof *b.cids);
    b.act_ctx = malloc((size_t)N * sizeof *b.act_ctx);
    b.act_tok = malloc((size_t)N * sizeof *b.act_tok);
    b.act_idx = malloc((size_t)N * sizeof *b.act_idx);
    b.ones = malloc((size_t)N * sizeof *b.ones);
    b.pad_at = malloc((size_t)N * sizeof *b.pad_at);
    b.first_row = malloc((size_t)N * sizeof *b.first_row);
    if (!b.ctx || !b.hist || !b.logits || !b.cvals || !b.cids || !b.act_ctx || !b.act_tok || !b.act_idx || !b.ones ||
        !b.pad_at || !b.first_row) {
        batch_state_free(m, &b, N);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    lmx_tokenizer *tok = lmx_runtime_tokenizer(m);
    if (!tok) lmx_err_clear(&m->err);
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = rt->n_ctx;
    int limit = rt->n_ctx > 0 ? 0 : m->cfg.max_positions, prompt_total = 0;

    /* each sequence's context, its caches reserved for the whole generation; then the prompts, and each first token */
    for (int i = 0; st == LMX_OK && i < N; i++) {
        lmx_gen_seq *g = &rt->bseq[i];
        prompt_total += lens[i];
        b.ones[i] = 1;
        b.pad_at[i] = -1;
        if (limit && lens[i] > limit) {
            st = lmx_err_set(&m->err, LMX_ERR_CONTEXT_FULL, "prompt %d has %d tokens; the context holds %d", i, lens[i], limit);
            break;
        }
        if ((st = lmx_gen_seq_begin(g, m, &params[i], tok, prompts[i], lens[i], NULL, 0, &m->err)) ||
            (st = lmx_context_create(m, &cp, &b.ctx[i])) || (st = lmx_context_set_adapter(b.ctx[i], params[i].adapter)))
            break;
        /* as a session's (its row's padding included) */
        const int gen = lmx_gen_reserve(params[i].max_tokens);
        lmx_context_reserve(b.ctx[i], limit && lens[i] + gen > limit ? limit : lens[i] + gen);
        if (lmx_buf_append(m->be, &b.hist[i], prompts[i], (size_t)lens[i] * sizeof(int32_t))) {
            st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
    }
    if (st == LMX_OK) st = prefill_all(m, &b, prompts, lens, N);
    double t_prefilled = lmx_now_ms();
    for (int i = 0; st == LMX_OK && i < N; i++) {
        lmx_gen_seq *g = &rt->bseq[i];
        if (lmx_gen_seq_step(g, m, b.logits + (size_t)b.first_row[i] * V, (const int32_t *)b.hist[i].data, lens[i])) {
            if (!t_first) t_first = lmx_now_ms();
            deliver(g);
        }
    }

    /* decode every unfinished sequence together, one row each; when every one of them samples from
     * its best candidates, the backend selects the most any needs (K) and only those come back.
     * Where the backend replays a step's graph only for the same rows (be->replays_steps), a sequence that ends
     * keeps its row: it evaluates its last id again at one position every step (its output unread), so the step
     * keeps its rows and its graph, where a new set of rows would record and capture another (tens of ms on a
     * large model; a batch whose sequences end one by one did so at every end).  Once the live rows are half
     * the step's or fewer, the padding goes: one capture for the smaller batch, whose steps cost less. */
    const int pad = m->be->replays_steps;
    int in_step = 0; /* the last step's rows */
    while (st == LMX_OK) {
        int live = 0, cancel = atomic_load(&rt->cancel), K = 0, all_k = 1, R = 0; /* live sequences, the step's rows */
        for (int i = 0; i < N; i++) {
            lmx_gen_seq *g = &rt->bseq[i];
            if (g->to_eval < 0) continue;
            int full = limit && lmx_context_n_past(b.ctx[i]) >= limit;
            if (cancel || full) {
                if (lmx_gen_seq_end(g, m, cancel ? LMX_FINISH_CANCELLED : LMX_FINISH_CONTEXT)) deliver(g);
                continue;
            }
            live++;
        }
        if (live == 0) break;
        const int keep = pad && 2 * live > in_step; /* the finished rows of the last step stay in it */
        for (int i = 0; i < N; i++) {
            lmx_gen_seq *g = &rt->bseq[i];
            if (g->to_eval < 0) { /* finished: pads the step at its last position, or leaves it */
                if (!keep || b.pad_at[i] < 0) {
                    b.pad_at[i] = -1;
                    continue;
                }
                lmx_context_pad_at(b.ctx[i], b.pad_at[i]);
                b.act_ctx[R] = b.ctx[i];
                b.act_tok[R] = ((const int32_t *)b.hist[i].data)[b.hist[i].len / sizeof(int32_t) - 1];
                b.act_idx[R++] = -1;
                continue;
            }
            if (lmx_buf_append(m->be, &b.hist[i], &g->to_eval, sizeof(int32_t))) {
                st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
            /* where its row pads the steps after it ends: the next position, or the last where the cache is full */
            const int at = lmx_context_n_past(b.ctx[i]) + 1;
            b.pad_at[i] = limit && at >= limit ? limit - 1 : at;
            b.act_ctx[R] = b.ctx[i];
            b.act_tok[R] = g->to_eval;
            b.act_idx[R++] = i;
            all_k &= g->topk > 0;
            if (g->topk > K) K = g->topk;
        }
        if (st) break;
        in_step = R;
        int got = 0;
        if (all_k) st = lmx_eval_batch_topk(m, b.act_ctx, R, b.act_tok, b.ones, 1, K, b.cvals, b.cids, b.logits, &got);
        else st = lmx_eval_batch(m, b.act_ctx, R, b.act_tok, b.ones, 1, b.logits);
        if (st) break;
        for (int a = 0; a < R; a++) {
            int i = b.act_idx[a];
            if (i < 0) continue; /* a padding row */
            lmx_gen_seq *g = &rt->bseq[i];
            g->to_eval = -1;
            int r = got ? lmx_gen_seq_step_topk(g, m, b.cvals + (size_t)a * K, b.cids + (size_t)a * K)
                        : lmx_gen_seq_step(g, m, b.logits + (size_t)a * V, (const int32_t *)b.hist[i].data,
                                           (int)(b.hist[i].len / sizeof(int32_t)));
            if (r) deliver(g);
        }
    }
    int generated = 0;
    for (int i = 0; i < N; i++) {
        if (st == LMX_OK) lmx_gen_seq_result(&rt->bseq[i], &results[i]);
        generated += rt->bseq[i].index;
    }
    batch_state_free(m, &b, N);
    lmx_metrics *x = &rt->metrics;
    x->prompt_tokens = prompt_total;
    x->prefill_ms = t_prefilled - t0;
    x->prefill_tokens_per_s = x->prefill_ms > 0 ? prompt_total / (x->prefill_ms * 1e-3) : 0;
    lmx_metrics_end(m, generated, t0, t_first, lmx_now_ms());
    lmx_runtime_trim(m);
    if (generated > N && x->decode_ms > 0) x->decode_tokens_per_s = (generated - N) / (x->decode_ms * 1e-3);
    return st;
}

lmx_status lmx_batch_generate(lmx_model *m, const char *const *prompts, int N, const lmx_gen_params *params,
                              lmx_result *results) {
    if (!m) return LMX_ERR_INVALID_ARG;
    int32_t **ids = NULL;
    int *lens = NULL;
    lmx_status st = encode_all(m, prompts, N, &ids, &lens);
    if (st == LMX_OK)
        st = lmx_batch_generate_ids(m, (const int32_t *const *)ids, lens, N, params, results);
    free_prompts(ids, lens, N);
    return st;
}
