/* runtime.h - generation on a model (internal): the model's session (prompt cache, tokenizer,
 * chat template, metrics), one sequence's generation state, and what context.c exposes to them.
 *
 *   session.c   the lmx_runtime of a model: lazy tokenizer / template, prompt cache, metrics
 *   gen_seq.c   one sequence: sampling, stop ids, stop strings, streamed text
 *   stream.c    lmx_stream_*, lmx_generate*, lmx_chat*, lmx_prompt_cache_*
 *   batch.c     lmx_classify*, lmx_batch_generate*
 *   inspect.c   lmx_inspect*: each layer's keys read from a context's caches, attention probabilities
 */
#ifndef LMX_RUNTIME_RUNTIME_H
#define LMX_RUNTIME_RUNTIME_H

#include <stdatomic.h>

#include "../model/model.h"
#include "../tokenizer/chat_template.h"
#include "../tokenizer/tokenizer.h"
#include "sampler.h"

/* ---- context.c internals ------------------------------------------------------------------ */

/* Rows per forward pass when a prompt is evaluated in chunks (the backend's choice). */
static inline int lmx_prefill_chunk(const lmx_model *m) {
    return m->be->ops->prefill_chunk > 0 ? m->be->ops->prefill_chunk : 512;
}

/* Keep only the first n positions of c's caches (the next eval starts at position n).  Returns 0,
 * or -1 when a rotating cache has already overwritten positions that the new start needs
 * (the caller then resets instead). */
int lmx_context_rewind(lmx_context *c, int n);
/* The next eval of c starts at position n <= n_past whatever its caches hold: for a finished sequence whose row pads
 * a batch's steps (batch.c), whose caches no longer matter. */
void lmx_context_pad_at(lmx_context *c, int n);
/* Room in every unbounded cache of c for n positions, as far as memory allows (best effort: what does not fit
 * is grown later, as positions come).  A generation that knows its length reserves it up front: a cache
 * that grows mid-generation copies itself and makes a decode graph be captured again. */
void lmx_context_reserve(lmx_context *c, int n);
/* Positions past its prompt a generation of max_tokens reserves in its caches up front (at most 4,096: longer ones
 * grow later; none for max_tokens 0, which ends at once). */
static inline int lmx_gen_reserve(int max_tokens) { return max_tokens <= 0 ? 0 : max_tokens < 4096 ? max_tokens : 4096; }
/* The id of the adapter c evaluates with (0: none). */
unsigned lmx_context_adapter(const lmx_context *c);
/* Layer l's KV cache of c (what an inspection reads after a prefill). */
const lmx_kv_layer *lmx_context_kv(const lmx_context *c, int l);
/* Bytes the context's caches hold now. */
int64_t lmx_context_bytes(const lmx_context *c);
/* lmx_context_eval for the last position's next-token candidates: the k largest logits (largest
 * first, equal ones by lower id) in vals / ids [k], *k_out = k.  When the backend cannot select
 * them (the cpu), the logits [V] land in logits instead and *k_out = 0. */
lmx_status lmx_context_eval_topk(lmx_context *c, const int32_t *tokens, int n, int k, float *vals, int32_t *ids,
                                 float *logits, int *k_out);
/* lmx_eval_batch likewise: vals / ids [B, k], or the logits [B, V] in last_logits with *k_out = 0. */
lmx_status lmx_eval_batch_topk(lmx_model *m, lmx_context *const *ctxs, int B, const int32_t *tokens, const int *lens,
                               int T, int k, float *vals, int32_t *ids, float *last_logits, int *k_out);

/* ---- growable buffers (counted against the backend's memory accounting) -------------------- */

typedef struct lmx_buf {
    char *data;           /* NUL-terminated when used for text */
    size_t len, cap;
} lmx_buf;

/* Make room for need bytes (+1 for a NUL); 0 or -1.  Grows geometrically. */
int lmx_buf_reserve(lmx_backend *be, lmx_buf *b, size_t need);
/* The same, refusing growth past be's memory limit (-1, the message in be->err). */
int lmx_buf_reserve_limited(lmx_backend *be, lmx_buf *b, size_t need);
int lmx_buf_append(lmx_backend *be, lmx_buf *b, const void *p, size_t n);
void lmx_buf_free(lmx_backend *be, lmx_buf *b);

/* ---- one sequence's generation ------------------------------------------------------------- */

typedef struct lmx_gen_seq {
    lmx_gen_params p;
    lmx_rng rng;
    lmx_buf stops;        /* int32 ids that end it: EOS (unless ignored), turn ends, stop_ids */
    int n_eos;            /* the first n_eos of stops are end-of-sequence ids */
    lmx_tok_stream *detok;  /* NULL without a tokenizer */
    lmx_buf text;         /* emitted text */
    lmx_buf pending;      /* decoded text held back: it may begin a stop string */
    lmx_buf emit;         /* the text of the token being yielded */
    lmx_buf ids;          /* int32 generated ids */
    lmx_token tok;
    int topk;             /* candidates the sampler needs per token from a backend that selects them
                             (0: whole logit rows), fixed for the generation */
    int index;
    lmx_finish finish;
    int32_t finish_id;
    int32_t to_eval;      /* the last yielded id, not yet evaluated (-1: none) */
} lmx_gen_seq;

/* Start a generation with params p after the prompt ids (whose tail seeds the detokenizer);
 * extra_stops (n_extra) end it too, like stop_ids.  tok may be NULL (ids only; stop strings then
 * are an error).  Returns a status, message in *err. */
lmx_status lmx_gen_seq_begin(lmx_gen_seq *g, lmx_model *m, const lmx_gen_params *p,
                             lmx_tokenizer *tok, const int32_t *prompt, int n_prompt,
                             const int32_t *extra_stops, int n_extra, lmx_err *err);
/* With the next-token logits [V] (modified): sample, apply the stops.  Returns 1 with g->tok to
 * yield, or 0 when the generation finished with nothing more to yield.  history: the tokens
 * evaluated so far (for the penalties). */
int lmx_gen_seq_step(lmx_gen_seq *g, lmx_model *m, float *logits, const int32_t *history, int n_hist);
/* The same from g->topk best candidates, vals / ids largest first (lmx_sampler_sample_topk). */
int lmx_gen_seq_step_topk(lmx_gen_seq *g, lmx_model *m, const float *vals, const int32_t *ids);
/* End the generation now with reason f; returns 1 when held-back text is left to yield (as
 * g->tok with id -1). */
int lmx_gen_seq_end(lmx_gen_seq *g, lmx_model *m, lmx_finish f);
void lmx_gen_seq_result(const lmx_gen_seq *g, lmx_result *out);
void lmx_gen_seq_free(lmx_gen_seq *g, lmx_backend *be);

/* ---- the model's session --------------------------------------------------------------------- */

struct lmx_stream {
    lmx_model *m;
    int open;
    lmx_gen_seq seq;
    int started;          /* a token has been yielded (ttft measured) */
    double t_start, t_first;
};

typedef struct lmx_runtime {
    char *path;                  /* where the model came from (tokenizer, template) */
    int n_ctx;
    uint64_t seed;
    atomic_int cancel;
    lmx_tokenizer *tok;          /* loaded on first use; tok_status says how that went */
    lmx_status tok_status;
    lmx_err tok_err;
    lmx_chat_template *tpl;
    lmx_context *ctx;            /* the prompt cache: KV of hist */
    lmx_buf hist;                /* int32 ids evaluated in ctx */
    float *logits;               /* [V] next-token logits after hist (when n_cand == 0) */
    int n_cand;                  /* > 0: the last decode step left only its n_cand best candidates */
    float cand_vals[LMX_TOPK_MAX];   /* their logits, largest first */
    int32_t cand_ids[LMX_TOPK_MAX];
    lmx_sampler sampler;
    lmx_stream stream;           /* the one generation stream of the model */
    lmx_metrics metrics;
    /* batch calls */
    lmx_gen_seq *bseq;
    int n_bseq;
    int64_t cache_limit;         /* > 0: the most the prompt cache and scratch keep between calls */
} lmx_runtime;

/* Create / free m->rt (model.c calls these). */
lmx_status lmx_runtime_create(lmx_model *m, const char *path, const lmx_load_params *p);
void lmx_runtime_free(lmx_model *m);

/* The model's tokenizer, loaded on first use; NULL with m->err set when there is none. */
lmx_tokenizer *lmx_runtime_tokenizer(lmx_model *m);
/* Encode prompt text with the tokenizer's BOS rules (no second BOS when the text has one). */
lmx_status lmx_runtime_encode(lmx_model *m, const char *text, int32_t **ids, int *n);
/* Ensure the session context, logits and sampler buffers exist. */
lmx_status lmx_runtime_ready(lmx_model *m);
/* Evaluate ids into the session (prompt cache reused) for the generation of params p (NULL: none follows, as when
 * warming the prompt cache; else the caches are reserved for its max_tokens too), leaving their last logits in
 * rt->logits, or with k > 0 the last position's k best candidates in rt->cand_* (rt->n_cand = k) when the backend
 * can select them (as lmx_runtime_decode: the first token is then drawn without the vocabulary crossing to the
 * host).  Fills metrics' prompt fields. */
lmx_status lmx_runtime_prefill(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *p, int k);
/* Evaluate one more token into the session: its logits into rt->logits, or with k > 0 its k best
 * candidates into rt->cand_* (rt->n_cand = k) when the backend can select them. */
lmx_status lmx_runtime_decode(lmx_model *m, int32_t id, int k);
/* 1 when the session's (unrotating) context can take no more tokens. */
int lmx_runtime_full(const lmx_model *m);
/* At the end of a generation call: drop scratch, then the prompt cache, while they hold more than
 * the cache limit (memory.c). */
void lmx_runtime_trim(lmx_model *m);
/* Reset metrics at the start of a call. */
void lmx_metrics_begin(lmx_model *m);
void lmx_metrics_end(lmx_model *m, int generated, double t_start, double t_first, double t_end);
/* After a step of stream s (native or bridge): produced != 0 hands out its token in *tok (the first
 * one's time noted), and the metrics are brought up to date. */
void lmx_stream_emit(lmx_stream *s, int produced, const lmx_token **tok);
/* msgs [n] as the JSON array of {"role", "content"} objects a chat template reads (*out, cJSON_Delete
 * it); INVALID_ARG for no messages or one without role or content. */
struct cJSON;
lmx_status lmx_messages_json(lmx_model *m, const lmx_message *msgs, int n, struct cJSON **out);
double lmx_now_ms(void);

#endif
