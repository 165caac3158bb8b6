/* tok_decode.c - decoding ids back to text: the decoder chain of tokenizer.json applied to the
 * list of token strings exactly as HF's decode_chain does (ByteLevel, Replace, ByteFallback,
 * Fuse, Strip, Metaspace), and the streaming detokenizer built on it. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* A list of strings: spans over one buffer. */
typedef struct strlist {
    lmx_tok_buf buf;
    uint32_t *off, *len;
    size_t n, cap;
} strlist;

static int sl_push(strlist *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 32;
        uint32_t *o = realloc(l->off, cap * sizeof *o);
        if (!o) return -1;
        l->off = o;
        uint32_t *g = realloc(l->len, cap * sizeof *g);
        if (!g) return -1;
        l->len = g;
        l->cap = cap;
    }
    l->off[l->n] = (uint32_t)l->buf.n;
    l->len[l->n] = (uint32_t)n;
    if (lmx_tok_buf_put(&l->buf, s, n)) return -1;
    l->n++;
    return 0;
}

/* Extend the last string of l by s. */
static int sl_append(strlist *l, const char *s, size_t n) {
    if (lmx_tok_buf_put(&l->buf, s, n)) return -1;
    l->len[l->n - 1] += (uint32_t)n;
    return 0;
}

static void sl_free(strlist *l) {
    lmx_tok_buf_free(&l->buf);
    free(l->off);
    free(l->len);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" -> NN, else -1 */
static int byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int a = hexval(s[3]), b = hexval(s[4]);
    return a < 0 || b < 0 ? -1 : a * 16 + b;
}

static int bytelevel_raw(const lmx_tokenizer *t, const char *s, size_t n, lmx_tok_buf *out) {
    size_t start = out->n, i = 0;
    if (lmx_tok_buf_reserve(out, n)) return -1;
    while (i < n) {
        size_t L = lmx_tok_utf8_len((unsigned char)s[i]);
        uint32_t cp = i + L <= n ? lmx_tok_utf8_decode(s + i, &L) : 0xFFFFFFFF;
        if (cp >= 324 || t->cp_byte[cp] < 0) {   /* not byte-level: the token's own bytes */
            out->n = start;
            return lmx_tok_buf_put(out, s, n);
        }
        out->p[out->n++] = (char)t->cp_byte[cp];
        i += L;
    }
    out->p[out->n] = 0;
    return 0;
}

static int flush_bytes(strlist *dst, lmx_tok_buf *pend) {
    if (!pend->n) return 0;
    int bad = 0;
    if (lmx_tok_utf8_valid(pend->p, pend->n)) bad = sl_push(dst, pend->p, pend->n);
    else
        for (size_t i = 0; i < pend->n && !bad; i++) bad = sl_push(dst, "\xEF\xBF\xBD", 3);
    pend->n = 0;
    return bad;
}

/* One decoder step from src to dst (dst emptied first).  first: src starts the sequence (not a
 * later chunk of a streamed decode); fused: an earlier Fuse step joined the tokens into one string,
 * so in a whole-sequence decode a Strip would only see the sequence's start. */
static int apply(const lmx_tokenizer *t, const lmx_tok_dec *d, const strlist *src, strlist *dst,
                 int first, int fused) {
    dst->n = 0;
    dst->buf.n = 0;
    lmx_tok_buf tmp = {0};
    int bad = 0;
    switch (d->kind) {
    case LMX_TOK_DEC_BYTELEVEL: {
        lmx_tok_buf raw = {0};
        for (size_t i = 0; i < src->n && !bad; i++) bad = bytelevel_raw(t, src->buf.p + src->off[i], src->len[i], &raw);
        if (!bad) bad = lmx_tok_utf8_lossy(raw.p ? raw.p : "", raw.n, &tmp) || sl_push(dst, tmp.p ? tmp.p : "", tmp.n);
        lmx_tok_buf_free(&raw);
        break;
    }
    case LMX_TOK_DEC_FUSE:
        if (src->n) bad = sl_push(dst, src->buf.p, src->buf.n);   /* spans are contiguous */
        break;
    case LMX_TOK_DEC_BYTEFALLBACK:
        for (size_t i = 0; i < src->n && !bad; i++) {
            const char *s = src->buf.p + src->off[i];
            int b = byte_token(s, src->len[i]);
            if (b >= 0) {
                char c = (char)b;
                bad = lmx_tok_buf_put(&tmp, &c, 1);
            } else
                bad = flush_bytes(dst, &tmp) || sl_push(dst, s, src->len[i]);
        }
        if (!bad) bad = flush_bytes(dst, &tmp);
        break;
    case LMX_TOK_DEC_REPLACE:
        for (size_t i = 0; i < src->n && !bad; i++) {
            const char *s = src->buf.p + src->off[i];
            size_t n = src->len[i], j = 0, run = 0;
            bad = sl_push(dst, "", 0);
            while (!bad && j + d->pat_len <= n) {
                if (!memcmp(s + j, d->pat, d->pat_len)) {
                    bad = sl_append(dst, s + run, j - run) || sl_append(dst, d->content, d->content_len);
                    j += d->pat_len;
                    run = j;
                } else
                    j++;
            }
            if (!bad) bad = sl_append(dst, s + run, n - run);
        }
        break;
    case LMX_TOK_DEC_STRIP:
        for (size_t i = 0; i < src->n && !bad; i++) {
            const char *s = src->buf.p + src->off[i];
            size_t a = 0, b = src->len[i], cl = d->strip_len;
            int start = fused && !first ? 0 : d->start; /* a streamed chunk is no sequence start */
            for (int k = 0; k < start && a + cl <= b && !memcmp(s + a, d->strip_c, cl); k++) a += cl;
            for (int k = 0; k < d->stop && b >= a + cl && !memcmp(s + b - cl, d->strip_c, cl); k++) b -= cl;
            bad = sl_push(dst, s + a, b - a);
        }
        break;
    case LMX_TOK_DEC_METASPACE:
        for (size_t i = 0; i < src->n && !bad; i++) {
            const char *s = src->buf.p + src->off[i];
            size_t n = src->len[i], j = 0, run = 0;
            int drop = i == 0 && first && d->prepend_scheme != LMX_TOK_PREPEND_NEVER;
            bad = sl_push(dst, "", 0);
            while (!bad && j + d->repl_len <= n) {
                if (!memcmp(s + j, d->repl, d->repl_len)) {
                    bad = sl_append(dst, s + run, j - run) || (!drop && sl_append(dst, " ", 1));
                    j += d->repl_len;
                    run = j;
                } else
                    j++;
            }
            if (!bad) bad = sl_append(dst, s + run, n - run);
        }
        break;
    default: break;
    }
    lmx_tok_buf_free(&tmp);
    return bad;
}

lmx_status lmx_tok_decode_ids(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                              int skip_special, int first, lmx_tok_buf *out, lmx_err *err) {
    strlist a = {0}, b = {0};
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX) continue;
        if (skip_special && (t->flags[id] & LMX_TOK_F_SPECIAL)) continue;
        if (!t->has_decoder && a.n) bad = sl_append(&a, " ", 1);
        if (!bad) bad = (!t->has_decoder && a.n) ? sl_append(&a, t->strs.p + t->str_off[id], t->str_len[id])
                                                 : sl_push(&a, t->strs.p + t->str_off[id], t->str_len[id]);
    }
    strlist *src = &a, *dst = &b;
    int fused = 0;
    for (size_t k = 0; k < t->n_decs && !bad && src->n; k++) {
        bad = apply(t, &t->decs[k], src, dst, first, fused);
        fused |= t->decs[k].kind == LMX_TOK_DEC_FUSE;
        strlist *x = src;
        src = dst;
        dst = x;
    }
    if (!bad && src->n) bad = lmx_tok_buf_put(out, src->buf.p, src->buf.n);
    if (!bad) bad = lmx_tok_buf_reserve(out, 0);
    sl_free(&a);
    sl_free(&b);
    return bad ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
}

/* ---- streaming ----------------------------------------------------------------------------- */
struct lmx_tok_stream {
    const lmx_tokenizer *tok;
    int skip_special;
    int at_start;          /* nothing emitted yet: the next token is the sequence's first */
    lmx_tok_ids pending;   /* ids not yet turned into final text */
    lmx_tok_buf text;      /* the last returned text */
    lmx_tok_buf raw;       /* scratch: byte-level bytes of the pending ids */
    int has_bytelevel, has_bytefallback;
};

lmx_status lmx_tok_stream_create(const lmx_tokenizer *tok, int skip_special, lmx_tok_stream **out,
                                 lmx_err *err) {
    *out = NULL;
    if (!tok) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "no tokenizer");
    lmx_tok_stream *s = calloc(1, sizeof *s);
    if (!s) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    s->tok = tok;
    s->skip_special = skip_special;
    s->at_start = 1;
    for (size_t k = 0; k < tok->n_decs; k++) {
        if (tok->decs[k].kind == LMX_TOK_DEC_BYTELEVEL) s->has_bytelevel = 1;
        if (tok->decs[k].kind == LMX_TOK_DEC_BYTEFALLBACK) s->has_bytefallback = 1;
    }
    *out = s;
    return LMX_OK;
}

void lmx_tok_stream_free(lmx_tok_stream *s) {
    if (!s) return;
    lmx_tok_ids_free(&s->pending);
    lmx_tok_buf_free(&s->text);
    lmx_tok_buf_free(&s->raw);
    free(s);
}

void lmx_tok_stream_reset(lmx_tok_stream *s) {
    if (!s) return;
    s->pending.n = 0;
    s->text.n = 0;
    s->at_start = 1;
}

/* 1 when decoding the pending ids now could differ from their part of a longer decode. */
static int pending_open(lmx_tok_stream *s) {
    const lmx_tokenizer *t = s->tok;
    if (!s->pending.n) return 0;
    int32_t last = s->pending.ids[s->pending.n - 1];
    if (s->has_bytefallback && byte_token(t->strs.p + t->str_off[last], t->str_len[last]) >= 0) return 1;
    if (s->has_bytelevel) {
        s->raw.n = 0;
        /* an incomplete sequence spans at most 3 bytes: the tail of the last few tokens */
        for (size_t i = s->pending.n; i-- > 0;) {
            int32_t id = s->pending.ids[i];
            lmx_tok_buf one = {0};
            if (bytelevel_raw(t, t->strs.p + t->str_off[id], t->str_len[id], &one)) {
                lmx_tok_buf_free(&one);
                return 0;
            }
            /* prepend: rebuild raw as one + raw */
            if (!lmx_tok_buf_put(&one, s->raw.p ? s->raw.p : "", s->raw.n)) {
                lmx_tok_buf_free(&s->raw);
                s->raw = one;
            } else
                lmx_tok_buf_free(&one);
            if (s->raw.n >= 4) break;
        }
        if (lmx_tok_utf8_incomplete_tail(s->raw.p ? s->raw.p : "", s->raw.n)) return 1;
    }
    return 0;
}

static lmx_status emit(lmx_tok_stream *s, const char **text, size_t *len, lmx_err *err) {
    s->text.n = 0;
    /* without a decoder HF joins tokens with spaces: one goes between two emitted groups */
    if (!s->tok->has_decoder && !s->at_start && s->pending.n && lmx_tok_buf_putc(&s->text, ' '))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_status st = lmx_tok_decode_ids(s->tok, s->pending.ids, s->pending.n, s->skip_special,
                                       s->at_start, &s->text, err);
    if (st) return st;
    if (lmx_tok_buf_reserve(&s->text, 0)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    s->text.p[s->text.n] = 0;
    if (s->pending.n) s->at_start = 0;
    s->pending.n = 0;
    *text = s->text.p;
    if (len) *len = s->text.n;
    return LMX_OK;
}

lmx_status lmx_tok_stream_push(lmx_tok_stream *s, int32_t id, const char **text, size_t *len,
                               lmx_err *err) {
    const lmx_tokenizer *t = s->tok;
    *text = "";
    if (len) *len = 0;
    if (id < 0 || id >= t->n_vocab || t->str_len[id] == UINT32_MAX) return LMX_OK;
    if (s->skip_special && (t->flags[id] & LMX_TOK_F_SPECIAL)) return LMX_OK;
    if (lmx_tok_ids_push(&s->pending, id)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (pending_open(s)) return LMX_OK;
    return emit(s, text, len, err);
}

lmx_status lmx_tok_stream_flush(lmx_tok_stream *s, const char **text, size_t *len, lmx_err *err) {
    return emit(s, text, len, err);
}
