/* gen_seq.c - one sequence's generation: sampling, stop ids, stop strings, streamed text.
 *
 * Text flows from the streaming detokenizer into `pending`; whatever cannot be the start of a
 * stop string is released at once as the token's text, the rest waits for the next tokens.
 * Buffers are kept between generations, so a decode step allocates nothing once they have grown
 * (the id buffer is reserved for max_tokens up front). */
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

#define DETOK_SEED 8   /* prompt ids pushed through the detokenizer so the first token decodes in context */

static lmx_status nomem(lmx_err *err) { return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory"); }

static int push_stop(lmx_backend *be, lmx_gen_seq *g, int32_t id) {
    const int32_t *s = (const int32_t *)g->stops.data;
    for (size_t i = 0; i < g->stops.len / sizeof id; i++)
        if (s[i] == id) return 0;
    return lmx_buf_append(be, &g->stops, &id, sizeof id);
}

lmx_status lmx_gen_seq_begin(lmx_gen_seq *g, lmx_model *m, const lmx_gen_params *p,
                             lmx_tokenizer *tok, const int32_t *prompt, int n_prompt,
                             const int32_t *extra_stops, int n_extra, lmx_err *err) {
    lmx_backend *be = m->be;
    lmx_gen_params dp = lmx_gen_default_params();
    if (!p) p = &dp;
    if (p->max_tokens < 0) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "max_tokens %d is negative", p->max_tokens);
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids) || p->n_stop_strings < 0 ||
        (p->n_stop_strings > 0 && !p->stop_strings))
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "stop ids or stop strings: a count without an array");
    for (int i = 0; i < p->n_stop_strings; i++)
        if (!p->stop_strings[i] || !p->stop_strings[i][0])
            return lmx_err_set(err, LMX_ERR_INVALID_ARG, "stop string %d is empty", i);
    if (p->n_stop_strings > 0 && !tok)
        return lmx_err_set(err, LMX_ERR_MISSING, "stop strings need the model's tokenizer, and it has none");
    const lmx_sampler_params *sp = &p->sampler;
    if (sp->top_p < 0 || sp->min_p < 0 || sp->min_p > 1 || sp->repeat_penalty <= 0 || sp->top_k < 0)
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "sampler: top_k, top_p, min_p or repeat_penalty out of range");

    g->p = *p;
    g->topk = be->ops->topk ? lmx_sampler_topk_need(sp, m->cfg.vocab, LMX_TOPK_MAX) : 0;
    lmx_rng_seed(&g->rng, sp->seed < 0 ? m->rt->seed : (uint64_t)sp->seed);
    g->stops.len = g->text.len = g->pending.len = g->emit.len = g->ids.len = 0;
    g->index = 0;
    g->finish = LMX_FINISH_NONE;
    g->finish_id = -1;
    g->to_eval = -1;
    g->tok = (lmx_token){.id = -1, .text = ""};
    int ok = 1;
    if (!p->ignore_eos) {
        for (int i = 0; i < m->cfg.n_eos; i++) ok &= !push_stop(be, g, m->cfg.eos_ids[i]);
        if (tok) {
            lmx_tok_info ti;
            lmx_tok_get_info(tok, &ti);
            if (ti.eos_id >= 0) ok &= !push_stop(be, g, ti.eos_id);
        }
    }
    g->n_eos = (int)(g->stops.len / sizeof(int32_t));
    for (int i = 0; i < n_extra; i++) ok &= !push_stop(be, g, extra_stops[i]);
    for (int i = 0; i < p->n_stop_ids; i++) ok &= !push_stop(be, g, p->stop_ids[i]);
    int reserve = p->max_tokens < (1 << 16) ? p->max_tokens : (1 << 16);
    ok &= !lmx_buf_reserve(be, &g->ids, (size_t)reserve * sizeof(int32_t));
    ok &= !lmx_buf_reserve(be, &g->text, 256) && !lmx_buf_reserve(be, &g->pending, 256) &&
          !lmx_buf_reserve(be, &g->emit, 256);
    if (!ok) return nomem(err);
    g->text.data[0] = g->emit.data[0] = 0;

    if (tok) {
        lmx_status st;
        if (!g->detok && (st = lmx_tok_stream_create(tok, 1, &g->detok, err))) return st;
        lmx_tok_stream_reset(g->detok);
        for (int i = n_prompt > DETOK_SEED ? n_prompt - DETOK_SEED : 0; i < n_prompt; i++) {
            const char *s;
            size_t len;
            if ((st = lmx_tok_stream_push(g->detok, prompt[i], &s, &len, err))) return st;
        }
    } else if (g->detok) {
        lmx_tok_stream_free(g->detok);
        g->detok = NULL;
    }
    if (p->max_tokens == 0) g->finish = LMX_FINISH_LENGTH;
    return LMX_OK;
}

/* Move the first n bytes of pending into emit (and the result text). */
static int release(lmx_backend *be, lmx_gen_seq *g, size_t n) {
    if (lmx_buf_append(be, &g->emit, g->pending.data, n) || lmx_buf_append(be, &g->text, g->pending.data, n))
        return -1;
    memmove(g->pending.data, g->pending.data + n, g->pending.len - n);
    g->pending.len -= n;
    g->pending.data[g->pending.len] = 0;
    return 0;
}

/* Flush the detokenizer into pending. */
static int flush_detok(lmx_backend *be, lmx_gen_seq *g) {
    if (!g->detok) return 0;
    const char *s;
    size_t len;
    lmx_err e;
    if (lmx_tok_stream_flush(g->detok, &s, &len, &e)) return 0;
    return lmx_buf_append(be, &g->pending, s, len);
}

/* The earliest stop string in pending: its offset, or -1. */
static long find_stop(const lmx_gen_seq *g) {
    long best = -1;
    for (int i = 0; i < g->p.n_stop_strings; i++) {
        const char *hit = strstr(g->pending.data, g->p.stop_strings[i]);
        if (hit && (best < 0 || hit - g->pending.data < best)) best = hit - g->pending.data;
    }
    return best;
}

/* How many bytes at the end of pending could begin a stop string. */
static size_t held_tail(const lmx_gen_seq *g) {
    size_t hold = 0;
    for (int i = 0; i < g->p.n_stop_strings; i++) {
        const char *stop = g->p.stop_strings[i];
        size_t sl = strlen(stop);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= g->pending.len && !memcmp(g->pending.data + g->pending.len - k, stop, k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

int lmx_gen_seq_end(lmx_gen_seq *g, lmx_model *m, lmx_finish f) {
    if (g->finish != LMX_FINISH_NONE) return 0;
    g->finish = f;
    g->to_eval = -1;
    g->emit.len = 0;
    if (flush_detok(m->be, g) || release(m->be, g, g->pending.len) || g->emit.len == 0) return 0;
    g->tok = (lmx_token){.id = -1, .text = g->emit.data, .text_len = g->emit.len, .index = g->index};
    return 1;
}

/* Yield the sampled id: the stops, the text, the length limit. */
static int take(lmx_gen_seq *g, lmx_model *m, int32_t id);

int lmx_gen_seq_step(lmx_gen_seq *g, lmx_model *m, float *logits, const int32_t *history, int n_hist) {
    if (g->finish != LMX_FINISH_NONE) return 0;
    return take(g, m, lmx_sampler_sample(&m->rt->sampler, &g->p.sampler, &g->rng, logits, history, n_hist));
}

int lmx_gen_seq_step_topk(lmx_gen_seq *g, lmx_model *m, const float *vals, const int32_t *ids) {
    if (g->finish != LMX_FINISH_NONE) return 0;
    return take(g, m, lmx_sampler_sample_topk(&m->rt->sampler, &g->p.sampler, &g->rng, vals, ids, g->topk));
}

static int take(lmx_gen_seq *g, lmx_model *m, int32_t id) {
    lmx_backend *be = m->be;
    const int32_t *stops = (const int32_t *)g->stops.data;
    for (size_t i = 0; i < g->stops.len / sizeof id; i++)
        if (stops[i] == id) {
            int r = lmx_gen_seq_end(g, m, (int)i < g->n_eos ? LMX_FINISH_EOS : LMX_FINISH_STOP_TOKEN);
            g->finish_id = id;
            return r;
        }
    lmx_buf_append(be, &g->ids, &id, sizeof id); /* reserved for max_tokens ids up front */
    g->emit.len = 0;
    g->emit.data[0] = 0;
    if (g->detok) {
        const char *s;
        size_t len;
        lmx_err e;
        if (lmx_tok_stream_push(g->detok, id, &s, &len, &e) == LMX_OK) lmx_buf_append(be, &g->pending, s, len);
        long at = g->p.n_stop_strings ? find_stop(g) : -1;
        if (at >= 0) {
            release(be, g, (size_t)at);
            g->pending.len = 0;
            g->finish = LMX_FINISH_STOP_STRING;
        } else {
            release(be, g, g->pending.len - held_tail(g));
        }
    }
    g->tok = (lmx_token){.id = id, .index = g->index++};
    if (g->finish == LMX_FINISH_NONE && g->index == g->p.max_tokens) {
        g->finish = LMX_FINISH_LENGTH;
        if (!flush_detok(be, g)) release(be, g, g->pending.len);
    }
    g->tok.text = g->emit.data ? g->emit.data : "";
    g->tok.text_len = g->emit.len;
    g->to_eval = g->finish == LMX_FINISH_NONE ? id : -1;
    return 1;
}

void lmx_gen_seq_result(const lmx_gen_seq *g, lmx_result *out) {
    out->text = g->text.data ? g->text.data : "";
    out->text_len = g->text.len;
    out->ids = (const int32_t *)g->ids.data;
    out->n_ids = (int)(g->ids.len / sizeof(int32_t));
    out->finish = g->finish;
    out->finish_id = g->finish_id;
}

void lmx_gen_seq_free(lmx_gen_seq *g, lmx_backend *be) {
    lmx_tok_stream_free(g->detok);
    lmx_buf *bufs[] = {&g->stops, &g->text, &g->pending, &g->emit, &g->ids};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) lmx_buf_free(be, bufs[i]);
    memset(g, 0, sizeof *g);
}
