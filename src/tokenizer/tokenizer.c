/* tokenizer.c - the encode pipeline (added tokens -> normalizer -> normalized added tokens ->
 * pre-tokenizers -> BPE -> post-processor), decode entry points and accessors. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

void lmx_tok_work_free(lmx_tok_work *w) {
    lmx_tok_buf_free(&w->a);
    lmx_tok_buf_free(&w->b);
    free(w->pa.v);
    free(w->pb.v);
    pcre2_match_data_free(w->md);
    free(w->segs);
    free(w->sym_id);
    free(w->sym_prev);
    free(w->sym_next);
    free(w->sym_len);
    free(w->heap);
}

static lmx_status push_ids(lmx_tok_ids *out, const int32_t *ids, size_t n, lmx_err *err) {
    for (size_t i = 0; i < n; i++)
        if (lmx_tok_ids_push(out, ids[i])) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    return LMX_OK;
}

/* Steps 1-2: split the raw text around added tokens, normalize the rest, split the normalized
 * text around normalized added tokens.  Result: w->pa over w->a. */
static lmx_status split_and_normalize(const lmx_tokenizer *t, lmx_tok_work *w, const char *text,
                                      size_t len, lmx_err *err) {
    lmx_status st = lmx_tok_split_added(t, &t->trie_raw, text, 0, (uint32_t)len, 1, &w->pb, err);
    if (st) return st;
    if (lmx_tok_buf_reserve(&w->a, len)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < w->pb.n; i++) {
        lmx_tok_span pc = w->pb.v[i];
        if (pc.added >= 0) {
            if (lmx_tok_pieces_push(&w->pa, 0, 0, pc.added, 0)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            continue;
        }
        size_t start = w->a.n;
        if (t->n_norms) {
            if ((st = lmx_tok_normalize(t, text + pc.off, pc.len, &w->a, err))) return st;
        } else if (lmx_tok_buf_put(&w->a, text + pc.off, pc.len))
            return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        if (w->a.n >= UINT32_MAX) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "text too long");
        uint32_t nlen = (uint32_t)(w->a.n - start);
        if (!nlen) continue;
        if (t->trie_norm.n_nodes) {
            if ((st = lmx_tok_split_added(t, &t->trie_norm, w->a.p, (uint32_t)start, nlen, pc.first, &w->pa, err)))
                return st;
        } else if (lmx_tok_pieces_push(&w->pa, (uint32_t)start, nlen, -1, pc.first))
            return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    return LMX_OK;
}

lmx_status lmx_tok_encode_into(const lmx_tokenizer *t, const char *text, size_t len,
                               int add_special, lmx_tok_ids *out, lmx_err *err) {
    if (!t || !out || (!text && len)) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "encode: NULL argument");
    if (len >= UINT32_MAX / 2) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "encode: text too long");
    if (!lmx_tok_utf8_valid(text, len)) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "encode: text is not valid UTF-8");
    size_t n0 = out->n;
    lmx_tok_work w = {0};
    lmx_status st = LMX_OK;
    w.md = pcre2_match_data_create(32, NULL);
    if (!w.md) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (!st && add_special) st = push_ids(out, t->post_pre, t->n_post_pre, err);
    if (!st && len) st = split_and_normalize(t, &w, text, len, err);
    if (!st) st = lmx_tok_pretokenize(t, &w, err);
    for (size_t i = 0; i < w.pa.n && !st; i++) {
        const lmx_tok_span *pc = &w.pa.v[i];
        if (pc->added >= 0) {
            if (lmx_tok_ids_push(out, t->added[pc->added].id)) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        } else
            st = lmx_tok_bpe_word(t, &w, w.a.p + pc->off, pc->len, out, err);
    }
    if (!st && add_special) st = push_ids(out, t->post_post, t->n_post_post, err);
    lmx_tok_work_free(&w);
    if (st) out->n = n0;
    return st;
}

lmx_status lmx_tok_encode(const lmx_tokenizer *t, const char *text, size_t len, int add_special,
                          int32_t **ids, size_t *n, lmx_err *err) {
    lmx_tok_ids v = {0};
    *ids = NULL;
    *n = 0;
    lmx_status st = lmx_tok_encode_into(t, text, len, add_special, &v, err);
    if (st) {
        lmx_tok_ids_free(&v);
        return st;
    }
    *ids = v.ids;
    *n = v.n;
    return LMX_OK;
}

lmx_status lmx_tok_decode(const lmx_tokenizer *t, const int32_t *ids, size_t n, int skip_special,
                          char **out, size_t *len, lmx_err *err) {
    *out = NULL;
    if (len) *len = 0;
    if (!t || (!ids && n)) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "decode: NULL argument");
    lmx_tok_buf b = {0};
    lmx_status st = lmx_tok_decode_ids(t, ids, n, skip_special, 1, &b, err);
    if (!st && lmx_tok_buf_reserve(&b, 0)) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (st) {
        lmx_tok_buf_free(&b);
        return st;
    }
    b.p[b.n] = 0;
    *out = b.p;
    if (len) *len = b.n;
    return LMX_OK;
}

lmx_status lmx_tok_piece(const lmx_tokenizer *t, int32_t id, char **out, size_t *len, lmx_err *err) {
    return lmx_tok_decode(t, &id, 1, 0, out, len, err);
}

const char *lmx_tok_token_str(const lmx_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX) return NULL;
    if (len) *len = t->str_len[id];
    return t->strs.p + t->str_off[id];
}

int32_t lmx_tok_token_id_n(const lmx_tokenizer *t, const char *s, size_t len) {
    if (!t || !s) return -1;
    return lmx_tok_smap_get(&t->names, s, len);
}

int32_t lmx_tok_token_id(const lmx_tokenizer *t, const char *s) {
    return s ? lmx_tok_token_id_n(t, s, strlen(s)) : -1;
}

int lmx_tok_is_special(const lmx_tokenizer *t, int32_t id) {
    return t && id >= 0 && id < t->n_vocab && (t->flags[id] & LMX_TOK_F_SPECIAL) != 0;
}

int32_t lmx_tok_vocab_size(const lmx_tokenizer *t) { return t ? t->n_vocab : 0; }

void lmx_tok_get_info(const lmx_tokenizer *t, lmx_tok_info *o) {
    memset(o, 0, sizeof *o);
    o->vocab_size = t->n_vocab;
    o->bos_id = t->bos_id;
    o->eos_id = t->eos_id;
    o->pad_id = t->pad_id;
    o->unk_id = t->unk_id;
    o->bos_token = t->bos_token;
    o->eos_token = t->eos_token;
    o->pad_token = t->pad_token;
    o->unk_token = t->unk_token;
    o->add_bos = t->add_bos;
    o->add_eos = t->add_eos;
    o->model = "BPE";
    o->chat_template = t->chat_template;
    o->note = t->note;
}
