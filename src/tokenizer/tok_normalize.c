/* tok_normalize.c - the normalizers: NFC/NFD/NFKC/NFKD (utf8proc), Lowercase, Replace (literal or
 * regex), Prepend, Strip; applied in order to one piece of text. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

static int all_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

static lmx_status unicode_form(int kind, const char *s, size_t n, lmx_tok_buf *out, lmx_err *err) {
    if (all_ascii(s, n)) return lmx_tok_buf_put(out, s, n) ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
    int opt = UTF8PROC_STABLE;
    if (kind == LMX_TOK_NORM_NFC) opt |= UTF8PROC_COMPOSE;
    else if (kind == LMX_TOK_NORM_NFD) opt |= UTF8PROC_DECOMPOSE;
    else if (kind == LMX_TOK_NORM_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    else opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
                                      (utf8proc_option_t)opt);
    if (r < 0) {
        free(dst);
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "unicode normalization: %s", utf8proc_errmsg(r));
    }
    int bad = lmx_tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return bad ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
}

static lmx_status lowercase(const char *s, size_t n, lmx_tok_buf *out, lmx_err *err) {
    if (lmx_tok_buf_reserve(out, n)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    size_t i = 0;
    while (i < n) {
        size_t L;
        uint32_t cp = lmx_tok_utf8_decode(s + i, &L);
        char tmp[4];
        size_t k = lmx_tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), tmp);
        if (lmx_tok_buf_put(out, tmp, k)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        i += L;
    }
    return LMX_OK;
}

static lmx_status replace(const lmx_tok_norm *nm, const char *s, size_t n, lmx_tok_buf *out,
                          lmx_err *err) {
    size_t i = 0, run = 0;
    if (nm->re) {
        pcre2_match_data *md = pcre2_match_data_create_from_pattern(nm->re, NULL);
        if (!md) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        while (i <= n) {
            int rc = pcre2_match(nm->re, (PCRE2_SPTR)s, n, i, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (me == ms) {   /* empty match: step one character */
                if (ms >= n) break;
                i = ms + lmx_tok_utf8_len((unsigned char)s[ms]);
                continue;
            }
            if (lmx_tok_buf_put(out, s + run, ms - run) || lmx_tok_buf_put(out, nm->content, nm->content_len)) {
                pcre2_match_data_free(md);
                return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            }
            run = i = me;
        }
        pcre2_match_data_free(md);
    } else if (nm->pat_len) {
        while (i + nm->pat_len <= n) {
            const char *f = memchr(s + i, nm->pat[0], n - i - nm->pat_len + 1);
            if (!f) break;
            size_t ms = (size_t)(f - s);
            if (memcmp(f, nm->pat, nm->pat_len)) {
                i = ms + 1;
                continue;
            }
            if (lmx_tok_buf_put(out, s + run, ms - run) || lmx_tok_buf_put(out, nm->content, nm->content_len))
                return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            run = i = ms + nm->pat_len;
        }
    }
    return lmx_tok_buf_put(out, s + run, n - run) ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
}

static lmx_status strip(const lmx_tok_norm *nm, const char *s, size_t n, lmx_tok_buf *out, lmx_err *err) {
    size_t a = 0, b = n, L;
    if (nm->left)
        while (a < b && lmx_tok_is_space(lmx_tok_utf8_decode(s + a, &L))) a += L;
    if (nm->right)
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            if (!lmx_tok_is_space(lmx_tok_utf8_decode(s + p, &L))) break;
            b = p;
        }
    return lmx_tok_buf_put(out, s + a, b - a) ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
}

lmx_status lmx_tok_normalize(const lmx_tokenizer *t, const char *s, size_t n, lmx_tok_buf *out,
                             lmx_err *err) {
    lmx_tok_buf x = {0}, y = {0};
    const char *cur = s;
    size_t cur_n = n;
    lmx_status st = LMX_OK;
    for (size_t k = 0; k < t->n_norms && !st; k++) {
        const lmx_tok_norm *nm = &t->norms[k];
        lmx_tok_buf *dst = (cur == x.p && x.p) ? &y : &x;
        dst->n = 0;
        if (lmx_tok_buf_reserve(dst, cur_n)) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
        switch (nm->kind) {
        case LMX_TOK_NORM_NFC: case LMX_TOK_NORM_NFD: case LMX_TOK_NORM_NFKC: case LMX_TOK_NORM_NFKD:
            st = unicode_form(nm->kind, cur, cur_n, dst, err);
            break;
        case LMX_TOK_NORM_LOWERCASE: st = lowercase(cur, cur_n, dst, err); break;
        case LMX_TOK_NORM_REPLACE: st = replace(nm, cur, cur_n, dst, err); break;
        case LMX_TOK_NORM_PREPEND:
            if (cur_n && lmx_tok_buf_put(dst, nm->content, nm->content_len))
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            else if (lmx_tok_buf_put(dst, cur, cur_n))
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        case LMX_TOK_NORM_STRIP: st = strip(nm, cur, cur_n, dst, err); break;
        default: break;
        }
        cur = dst->p;
        cur_n = dst->n;
    }
    if (!st && lmx_tok_buf_put(out, cur, cur_n)) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_tok_buf_free(&x);
    lmx_tok_buf_free(&y);
    return st;
}
