/* stream.c - generation on the model's session: the pull stream, and lmx_generate / lmx_chat
 * as a loop over it that calls the token callback. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "bridge.h"
#include "runtime.h"

lmx_sampler_params lmx_sampler_default_params(void) {
    lmx_sampler_params p = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                            .repeat_penalty = 1.0f, .penalty_last_n = 64, .seed = -1};
    return p;
}

lmx_gen_params lmx_gen_default_params(void) {
    lmx_gen_params p = {.max_tokens = 256, .sampler = lmx_sampler_default_params()};
    return p;
}

const char *lmx_finish_str(lmx_finish f) {
    static const char *names[] = {"none", "eos", "stop_token", "stop_string", "length", "context", "callback", "cancelled"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "unknown";
}

/* ---- the stream ------------------------------------------------------------------------------ */

/* The tokenizer when the model has one (ids calls work without). */
static lmx_tokenizer *optional_tokenizer(lmx_model *m) {
    lmx_tokenizer *tok = lmx_runtime_tokenizer(m);
    if (!tok) lmx_err_clear(&m->err);
    return tok;
}

static lmx_status open_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *p,
                           const int32_t *extra_stops, int n_extra, double t_start, lmx_stream **out) {
    lmx_runtime *rt = m->rt;
    lmx_stream *s = &rt->stream;
    lmx_tokenizer *tok = optional_tokenizer(m);
    lmx_status st;
    if ((st = lmx_gen_seq_begin(&s->seq, m, p, tok, ids, n, extra_stops, n_extra, &m->err))) return st;
    if ((st = lmx_runtime_prefill(m, ids, n, &s->seq.p, s->seq.topk))) return st; /* p as resolved (defaults) */
    if (atomic_load(&rt->cancel)) lmx_gen_seq_end(&s->seq, m, LMX_FINISH_CANCELLED);
    s->open = 1;
    s->started = 0;
    s->t_start = t_start;
    s->t_first = 0;
    *out = s;
    return LMX_OK;
}

/* Start a call: refuse when a stream is open, reset metrics and the cancel flag. */
static lmx_status begin_call(lmx_model *m, lmx_stream **out) {
    if (out) *out = NULL;
    if (!m) return LMX_ERR_INVALID_ARG;
    if (m->rt->stream.open)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a stream is open on this model; free it first");
    lmx_metrics_begin(m);
    return LMX_OK;
}

lmx_status lmx_stream_open_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *p,
                               lmx_stream **out) {
    lmx_status st = begin_call(m, out);
    if (st) return st;
    if (!out) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "out is NULL");
    if (m->bridge) return lmx_bridge_stream_open(m, NULL, ids, NULL, n, p, out);
    return open_ids(m, ids, n, p, NULL, 0, lmx_now_ms(), out);
}

lmx_status lmx_stream_open(lmx_model *m, const char *prompt, const lmx_gen_params *p, lmx_stream **out) {
    lmx_status st = begin_call(m, out);
    if (st) return st;
    if (!out) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "out is NULL");
    if (m->bridge) {
        if (!prompt) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the prompt is NULL");
        return lmx_bridge_stream_open(m, prompt, NULL, NULL, 0, p, out);
    }
    double t0 = lmx_now_ms();
    int32_t *ids;
    int n;
    if ((st = lmx_runtime_encode(m, prompt, &ids, &n))) return st;
    st = open_ids(m, ids, n, p, NULL, 0, t0, out);
    free(ids);
    return st;
}

lmx_status lmx_stream_next(lmx_stream *s, const lmx_token **tok) {
    if (!s || !tok) return LMX_ERR_INVALID_ARG;
    *tok = NULL;
    lmx_model *m = s->m;
    lmx_runtime *rt = m->rt;
    lmx_gen_seq *g = &s->seq;
    if (!s->open) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the stream is not open");
    if (m->bridge) return lmx_bridge_stream_next(s, tok);
    int r = 0;
    if (g->finish == LMX_FINISH_NONE) {
        if (atomic_load(&rt->cancel)) {
            r = lmx_gen_seq_end(g, m, LMX_FINISH_CANCELLED);
        } else if (g->to_eval >= 0 && lmx_runtime_full(m)) {
            r = lmx_gen_seq_end(g, m, LMX_FINISH_CONTEXT);
        } else {
            if (g->to_eval >= 0) {
                lmx_status st = lmx_runtime_decode(m, g->to_eval, g->topk);
                if (st) {
                    g->finish = LMX_FINISH_NONE;
                    g->to_eval = -1;
                    s->open = 0;
                    return st;
                }
                g->to_eval = -1;
            }
            r = rt->n_cand > 0 ? lmx_gen_seq_step_topk(g, m, rt->cand_vals, rt->cand_ids)
                               : lmx_gen_seq_step(g, m, rt->logits, (const int32_t *)rt->hist.data,
                                                  (int)(rt->hist.len / sizeof(int32_t)));
        }
    }
    lmx_stream_emit(s, r, tok);
    return LMX_OK;
}

void lmx_stream_emit(lmx_stream *s, int produced, const lmx_token **tok) {
    double now = lmx_now_ms();
    if (produced) {
        if (!s->started) s->t_first = now;
        s->started = 1;
        *tok = &s->seq.tok;
    }
    lmx_metrics_end(s->m, s->seq.index, s->t_start, s->t_first, now);
}

lmx_status lmx_stream_result(const lmx_stream *s, lmx_result *out) {
    if (!s || !out) return LMX_ERR_INVALID_ARG;
    lmx_gen_seq_result(&s->seq, out);
    return LMX_OK;
}

void lmx_stream_free(lmx_stream *s) {
    if (!s) return;
    if (s->seq.finish == LMX_FINISH_NONE) s->seq.finish = LMX_FINISH_CALLBACK;
    if (s->m->bridge) lmx_bridge_stream_stop(s); /* the child drops the rest of the request */
    s->open = 0; /* the buffers stay with the model for the next generation */
    lmx_runtime_trim(s->m);
}

/* Drive an open stream to its end, calling the token callback; close it. */
static lmx_status drive(lmx_stream *s, const lmx_gen_params *p, lmx_result *out) {
    lmx_status st;
    const lmx_token *t;
    while ((st = lmx_stream_next(s, &t)) == LMX_OK && t) {
        if (p && p->on_token && p->on_token(t, p->user)) {
            s->seq.finish = LMX_FINISH_CALLBACK;
            s->seq.to_eval = -1;
        }
    }
    if (st == LMX_OK && out) lmx_gen_seq_result(&s->seq, out);
    lmx_stream_free(s);
    return st;
}

lmx_status lmx_generate(lmx_model *m, const char *prompt, const lmx_gen_params *p, lmx_result *out) {
    lmx_stream *s;
    lmx_status st = lmx_stream_open(m, prompt, p, &s);
    return st ? st : drive(s, p, out);
}

lmx_status lmx_generate_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *p,
                            lmx_result *out) {
    lmx_stream *s;
    lmx_status st = lmx_stream_open_ids(m, ids, n, p, &s);
    return st ? st : drive(s, p, out);
}

/* ---- chat ------------------------------------------------------------------------------------ */

lmx_status lmx_messages_json(lmx_model *m, const lmx_message *msgs, int n, cJSON **out) {
    *out = NULL;
    if (!msgs || n <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "no messages");
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; arr && i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) {
            cJSON_Delete(arr);
            return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "message %d has no role or content", i);
        }
        cJSON *o = cJSON_CreateObject();
        if (!o || !cJSON_AddStringToObject(o, "role", msgs[i].role) ||
            !cJSON_AddStringToObject(o, "content", msgs[i].content)) {
            cJSON_Delete(o);
            cJSON_Delete(arr);
            arr = NULL;
            break;
        }
        cJSON_AddItemToArray(arr, o);
    }
    if (!arr) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    *out = arr;
    return LMX_OK;
}

lmx_status lmx_chat_render(lmx_model *m, const lmx_message *msgs, int n, int add_generation_prompt,
                           char **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    lmx_runtime *rt = m->rt;
    if (!msgs || n <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "no messages");
    lmx_status st;
    if (!rt->tpl && (st = lmx_chat_template_load(rt->path, lmx_arch_name(m->cfg.arch), &rt->tpl, &m->err)))
        return st;
    cJSON *arr = NULL;
    if ((st = lmx_messages_json(m, msgs, n, &arr))) return st;
    st = lmx_chat_template_render(rt->tpl, arr, add_generation_prompt, NULL, NULL, out, &m->err);
    cJSON_Delete(arr);
    return st;
}

/* The end-of-turn tokens of the chat formats lmx knows, where the vocabulary has them. */
static int turn_end_ids(lmx_tokenizer *tok, int32_t *out) {
    static const char *names[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "</s>", "<|end|>"};
    int n = 0;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = lmx_tok_token_id(tok, names[i]);
        if (id >= 0) out[n++] = id;
    }
    return n;
}

lmx_status lmx_stream_open_chat(lmx_model *m, const lmx_message *msgs, int n, const lmx_gen_params *p,
                                lmx_stream **out) {
    lmx_status st = begin_call(m, out);
    if (st) return st;
    if (!out) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "out is NULL");
    if (m->bridge) {
        if (!msgs) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "no messages");
        return lmx_bridge_stream_open(m, NULL, NULL, msgs, n, p, out);
    }
    double t0 = lmx_now_ms();
    char *prompt = NULL;
    int32_t *ids = NULL, turn_ends[8];
    int n_ids = 0;
    lmx_tokenizer *tok = lmx_runtime_tokenizer(m);
    if (!tok) return m->err.status;
    if ((st = lmx_chat_render(m, msgs, n, 1, &prompt)) == LMX_OK &&
        (st = lmx_runtime_encode(m, prompt, &ids, &n_ids)) == LMX_OK)
        st = open_ids(m, ids, n_ids, p, turn_ends, turn_end_ids(tok, turn_ends), t0, out);
    free(prompt);
    free(ids);
    return st;
}

lmx_status lmx_chat(lmx_model *m, const lmx_message *msgs, int n, const lmx_gen_params *p,
                    lmx_result *out) {
    lmx_stream *s;
    lmx_status st = lmx_stream_open_chat(m, msgs, n, p, &s);
    return st ? st : drive(s, p, out);
}

/* ---- the prompt cache ------------------------------------------------------------------------ */

lmx_status lmx_prompt_cache_warm_ids(lmx_model *m, const int32_t *ids, int n) {
    lmx_status st = begin_call(m, NULL);
    if (st) return st;
    /* evaluate all n tokens: a later prompt extending them reuses every one */
    if ((st = lmx_runtime_prefill(m, ids, n, NULL, 0))) return st;
    lmx_runtime_trim(m);
    return LMX_OK;
}

lmx_status lmx_prompt_cache_warm(lmx_model *m, const char *prompt) {
    lmx_status st = begin_call(m, NULL);
    if (st) return st;
    int32_t *ids;
    int n;
    if ((st = lmx_runtime_encode(m, prompt, &ids, &n))) return st;
    st = lmx_runtime_prefill(m, ids, n, NULL, 0);
    free(ids);
    if (st == LMX_OK) lmx_runtime_trim(m);
    return st;
}
