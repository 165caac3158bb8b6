/* tok_pretok.c - the pre-tokenizers: split the text pieces of an encode into pre-tokens.
 *
 * Split (regex via PCRE2, or a literal) with HF's five delimiter behaviours and invert; ByteLevel
 * (add_prefix_space, the GPT-2 regex when use_regex; its byte-to-unicode mapping is implicit since
 * the model's encode keys are raw bytes); Metaspace (replace ' ', prepend per scheme, split with
 * MergedWithNext); Digits / Whitespace / WhitespaceSplit / Punctuation are Splits with a regex.
 * Steps that only split produce new pieces over the same buffer; steps that change bytes copy the
 * text pieces into the other buffer of the work area. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct lmx_tok_seg {
    uint32_t s, e;   /* relative to the piece */
    uint8_t m;       /* a delimiter (after invert) */
} lmx_tok_seg;

static int seg_push(lmx_tok_work *w, size_t *n, uint32_t s, uint32_t e, int m) {
    if (*n == w->seg_cap) {
        size_t cap = w->seg_cap ? w->seg_cap * 2 : 64;
        lmx_tok_seg *g = realloc(w->segs, cap * sizeof *g);
        if (!g) return -1;
        w->segs = g;
        w->seg_cap = cap;
    }
    w->segs[(*n)++] = (lmx_tok_seg){s, e, (uint8_t)m};
    return 0;
}

/* Matches of the step's pattern in s[0..n) as segments covering s (gaps are non-matches). */
static lmx_status find_segments(const lmx_tok_pre *p, lmx_tok_work *w, const char *s, size_t n,
                                size_t *nseg, lmx_err *err) {
    size_t k = 0, prev = 0, i = 0;
    while (i < n) {
        size_t ms, me;
        if (p->re) {
            int rc = pcre2_match(p->re, (PCRE2_SPTR)s, n, i, PCRE2_NO_UTF_CHECK, w->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0 && rc != 0) {
                PCRE2_UCHAR msg[120];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return lmx_err_set(err, LMX_ERR_INVALID_ARG, "regex match: %s", (const char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            ms = ov[0];
            me = ov[1];
            if (me == ms) {   /* HF skips empty matches */
                i = ms + lmx_tok_utf8_len((unsigned char)s[ms]);
                continue;
            }
        } else {
            if (!p->lit_len || i + p->lit_len > n) break;
            const char *f = memchr(s + i, p->lit[0], n - i - p->lit_len + 1);
            if (!f) break;
            ms = (size_t)(f - s);
            if (memcmp(f, p->lit, p->lit_len)) {
                i = ms + 1;
                continue;
            }
            me = ms + p->lit_len;
        }
        if (ms > prev && seg_push(w, &k, (uint32_t)prev, (uint32_t)ms, p->invert)) goto nomem;
        if (seg_push(w, &k, (uint32_t)ms, (uint32_t)me, !p->invert)) goto nomem;
        prev = i = me;
    }
    if (n > prev && seg_push(w, &k, (uint32_t)prev, (uint32_t)n, p->invert)) goto nomem;
    *nseg = k;
    return LMX_OK;
nomem:
    return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

/* Fold the segments by behaviour (as HF's SplitDelimiterBehavior) and emit non-empty pieces. */
static int emit_segments(lmx_tok_work *w, size_t k, int behavior, const lmx_tok_span *pc,
                         lmx_tok_pieces *out) {
    lmx_tok_seg *sg = w->segs;
    size_t m = 0;   /* folded segments written back into sg[0..m) */
    int prev_match = 0;
    if (behavior == LMX_TOK_SPLIT_NEXT) {
        /* fold from the right, writing folded segments at the end, then emit left to right */
        size_t top = k;   /* folded live in sg[top..k) in reverse build order */
        for (size_t j = k; j-- > 0;) {
            lmx_tok_seg s = sg[j];
            if (s.m && !prev_match && top < k) sg[top].s = s.s;
            else sg[--top] = s;
            prev_match = s.m;
        }
        for (size_t j = top; j < k; j++) sg[m++] = sg[j];
    } else {
        for (size_t j = 0; j < k; j++) {
            lmx_tok_seg s = sg[j];
            switch (behavior) {
            case LMX_TOK_SPLIT_REMOVED:
                if (!s.m) sg[m++] = s;
                break;
            case LMX_TOK_SPLIT_ISOLATED: sg[m++] = s; break;
            case LMX_TOK_SPLIT_PREV:
                if (s.m && !prev_match && m) sg[m - 1].e = s.e;
                else sg[m++] = s;
                break;
            default:   /* CONTIGUOUS */
                if (s.m == prev_match && m) sg[m - 1].e = s.e;
                else sg[m++] = s;
                break;
            }
            prev_match = s.m;
        }
    }
    for (size_t j = 0; j < m; j++) {
        if (sg[j].e <= sg[j].s) continue;
        if (lmx_tok_pieces_push(out, pc->off + sg[j].s, sg[j].e - sg[j].s, -1, pc->first && sg[j].s == 0))
            return -1;
    }
    return 0;
}

static lmx_status split_step(const lmx_tok_pre *p, int behavior, lmx_tok_work *w, lmx_err *err) {
    w->pb.n = 0;
    for (size_t i = 0; i < w->pa.n; i++) {
        const lmx_tok_span *pc = &w->pa.v[i];
        if (pc->added >= 0) {
            if (lmx_tok_pieces_push(&w->pb, pc->off, pc->len, pc->added, 0)) goto nomem;
            continue;
        }
        size_t k;
        lmx_status st = find_segments(p, w, w->a.p + pc->off, pc->len, &k, err);
        if (st) return st;
        if (emit_segments(w, k, behavior, pc, &w->pb)) goto nomem;
    }
    lmx_tok_pieces tmp = w->pa;
    w->pa = w->pb;
    w->pb = tmp;
    return LMX_OK;
nomem:
    return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

/* Copy the text pieces into buffer b, rewritten by the step, and swap the buffers. */
static lmx_status rewrite_step(const lmx_tok_pre *p, lmx_tok_work *w, lmx_err *err) {
    w->b.n = 0;
    w->pb.n = 0;
    for (size_t i = 0; i < w->pa.n; i++) {
        const lmx_tok_span *pc = &w->pa.v[i];
        if (pc->added >= 0) {
            if (lmx_tok_pieces_push(&w->pb, 0, 0, pc->added, 0)) goto nomem;
            continue;
        }
        const char *s = w->a.p + pc->off;
        size_t n = pc->len, start = w->b.n;
        if (lmx_tok_buf_reserve(&w->b, n * 2 + 8)) goto nomem;
        if (p->kind == LMX_TOK_PRE_BYTELEVEL) {
            if (n && s[0] != ' ' && lmx_tok_buf_putc(&w->b, ' ')) goto nomem;
            if (lmx_tok_buf_put(&w->b, s, n)) goto nomem;
        } else {   /* METASPACE */
            int starts = n >= p->repl_len ? !memcmp(s, p->repl, p->repl_len) : 0;
            int pre = p->prepend_scheme == LMX_TOK_PREPEND_ALWAYS ||
                      (p->prepend_scheme == LMX_TOK_PREPEND_FIRST && pc->first);
            if (pre && !(n && s[0] == ' ') && !starts && lmx_tok_buf_put(&w->b, p->repl, p->repl_len))
                goto nomem;
            for (size_t j = 0; j < n; j++) {
                int bad = s[j] == ' ' ? lmx_tok_buf_put(&w->b, p->repl, p->repl_len) : lmx_tok_buf_putc(&w->b, s[j]);
                if (bad) goto nomem;
            }
        }
        if (lmx_tok_pieces_push(&w->pb, (uint32_t)start, (uint32_t)(w->b.n - start), -1, pc->first)) goto nomem;
    }
    lmx_tok_buf tb = w->a;
    w->a = w->b;
    w->b = tb;
    lmx_tok_pieces tp = w->pa;
    w->pa = w->pb;
    w->pb = tp;
    return LMX_OK;
nomem:
    return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

lmx_status lmx_tok_pretokenize(const lmx_tokenizer *t, lmx_tok_work *w, lmx_err *err) {
    for (size_t k = 0; k < t->n_pres; k++) {
        const lmx_tok_pre *p = &t->pres[k];
        lmx_status st = LMX_OK;
        switch (p->kind) {
        case LMX_TOK_PRE_SPLIT: st = split_step(p, p->behavior, w, err); break;
        case LMX_TOK_PRE_BYTELEVEL:
            if (p->add_prefix_space) st = rewrite_step(p, w, err);
            if (!st && p->re) st = split_step(p, LMX_TOK_SPLIT_ISOLATED, w, err);
            break;
        case LMX_TOK_PRE_METASPACE:
            st = rewrite_step(p, w, err);
            if (!st && p->split) {
                lmx_tok_pre lit = *p;
                lit.re = NULL;
                lit.lit = (char *)p->repl;
                lit.lit_len = p->repl_len;
                lit.invert = 0;
                st = split_step(&lit, LMX_TOK_SPLIT_NEXT, w, err);
            }
            break;
        default: break;
        }
        if (st) return st;
    }
    return LMX_OK;
}
