/* tok_steps.c - parse the pipeline sections of tokenizer.json ("normalizer", "pre_tokenizer",
 * "post_processor", "decoder") into flat arrays of steps.  A Sequence becomes its members in
 * order; a step lmx does not implement fails with LMX_ERR_UNSUPPORTED naming its type. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/json.h"
#include "tokenizer/tok_internal.h"

lmx_status lmx_tok_regex_compile(const char *pat, size_t len, pcre2_code **out, lmx_err *err) {
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof msg);
        char q[160];
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "regex %s at %zu: %s", lmx_quote(q, sizeof q, pat, len),
                           (size_t)eo, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   /* without JIT, pcre2_match interprets */
    *out = re;
    return LMX_OK;
}

static char *dupn(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* {"String": s} or {"Regex": r}: exactly one of *lit / *re is set. */
static lmx_status parse_pattern(const cJSON *p, char **lit, size_t *lit_len, pcre2_code **re,
                                lmx_err *err) {
    const char *s = lmx_json_str(p, "String");
    if (s) {
        *lit_len = strlen(s);
        *lit = dupn(s, *lit_len);
        return *lit ? LMX_OK : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    const char *r = lmx_json_str(p, "Regex");
    if (r) return lmx_tok_regex_compile(r, strlen(r), re, err);
    return lmx_err_set(err, LMX_ERR_FORMAT, "pattern without \"String\" or \"Regex\"");
}

static int prepend_scheme(const cJSON *j) {
    const char *ps = lmx_json_str(j, "prepend_scheme");
    if (ps) {
        if (!strcmp(ps, "first")) return LMX_TOK_PREPEND_FIRST;
        if (!strcmp(ps, "never")) return LMX_TOK_PREPEND_NEVER;
        return LMX_TOK_PREPEND_ALWAYS;
    }
    return lmx_json_bool(j, "add_prefix_space", 1) ? LMX_TOK_PREPEND_ALWAYS : LMX_TOK_PREPEND_NEVER;
}

static void replacement(const cJSON *j, char *out, size_t *len) {
    const char *r = lmx_json_str(j, "replacement");
    if (!r || !*r || strlen(r) > 4) r = "\xE2\x96\x81";   /* U+2581 */
    *len = lmx_tok_utf8_len((unsigned char)r[0]);
    if (*len > strlen(r)) *len = strlen(r);
    memcpy(out, r, *len);
    out[*len] = 0;
}

/* ---- normalizers --------------------------------------------------------------------------- */
static lmx_tok_norm *new_norm(lmx_tokenizer *t, int kind) {
    lmx_tok_norm *g = realloc(t->norms, (t->n_norms + 1) * sizeof *g);
    if (!g) return NULL;
    t->norms = g;
    lmx_tok_norm *n = &g[t->n_norms++];
    memset(n, 0, sizeof *n);
    n->kind = kind;
    return n;
}

lmx_status lmx_tok_parse_normalizer(lmx_tokenizer *t, const cJSON *j, lmx_err *err) {
    if (!j || cJSON_IsNull(j)) return LMX_OK;
    const char *type = lmx_json_str(j, "type");
    if (!type) return lmx_err_set(err, LMX_ERR_FORMAT, "normalizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "normalizers")) {
            lmx_status st = lmx_tok_parse_normalizer(t, it, err);
            if (st) return st;
        }
        return LMX_OK;
    }
    static const char *simple[] = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"};
    for (int k = 0; k < 5; k++)
        if (!strcmp(type, simple[k]))
            return new_norm(t, k) ? LMX_OK : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (!strcmp(type, "Replace")) {
        lmx_tok_norm *n = new_norm(t, LMX_TOK_NORM_REPLACE);
        if (!n) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        const char *c = lmx_json_str(j, "content");
        n->content_len = c ? strlen(c) : 0;
        n->content = dupn(c ? c : "", n->content_len);
        if (!n->content) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        return parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &n->pat, &n->pat_len,
                             &n->re, err);
    }
    if (!strcmp(type, "Prepend")) {
        lmx_tok_norm *n = new_norm(t, LMX_TOK_NORM_PREPEND);
        if (!n) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        const char *c = lmx_json_str(j, "prepend");
        n->content_len = c ? strlen(c) : 0;
        n->content = dupn(c ? c : "", n->content_len);
        return n->content ? LMX_OK : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    if (!strcmp(type, "Strip")) {
        lmx_tok_norm *n = new_norm(t, LMX_TOK_NORM_STRIP);
        if (!n) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        n->left = lmx_json_bool(j, "strip_left", 1);
        n->right = lmx_json_bool(j, "strip_right", 1);
        return LMX_OK;
    }
    return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "normalizer type %s", LMX_QUOTED(type));
}

/* ---- pre-tokenizers ------------------------------------------------------------------------ */
static lmx_tok_pre *new_pre(lmx_tokenizer *t, int kind) {
    lmx_tok_pre *g = realloc(t->pres, (t->n_pres + 1) * sizeof *g);
    if (!g) return NULL;
    t->pres = g;
    lmx_tok_pre *p = &g[t->n_pres++];
    memset(p, 0, sizeof *p);
    p->kind = kind;
    return p;
}

static lmx_status regex_split(lmx_tokenizer *t, const char *re, int behavior, int invert,
                              lmx_err *err) {
    lmx_tok_pre *p = new_pre(t, LMX_TOK_PRE_SPLIT);
    if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    p->behavior = behavior;
    p->invert = invert;
    return lmx_tok_regex_compile(re, strlen(re), &p->re, err);
}

static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

lmx_status lmx_tok_parse_pretokenizer(lmx_tokenizer *t, const cJSON *j, lmx_err *err) {
    if (!j || cJSON_IsNull(j)) return LMX_OK;
    const char *type = lmx_json_str(j, "type");
    if (!type) return lmx_err_set(err, LMX_ERR_FORMAT, "pre_tokenizer without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "pretokenizers")) {
            lmx_status st = lmx_tok_parse_pretokenizer(t, it, err);
            if (st) return st;
        }
        return LMX_OK;
    }
    if (!strcmp(type, "Split")) {
        const char *b = lmx_json_str(j, "behavior");
        int behavior = LMX_TOK_SPLIT_ISOLATED;
        if (!b) return lmx_err_set(err, LMX_ERR_FORMAT, "Split without a behavior");
        if (!strcmp(b, "Removed")) behavior = LMX_TOK_SPLIT_REMOVED;
        else if (!strcmp(b, "Isolated")) behavior = LMX_TOK_SPLIT_ISOLATED;
        else if (!strcmp(b, "MergedWithPrevious")) behavior = LMX_TOK_SPLIT_PREV;
        else if (!strcmp(b, "MergedWithNext")) behavior = LMX_TOK_SPLIT_NEXT;
        else if (!strcmp(b, "Contiguous")) behavior = LMX_TOK_SPLIT_CONTIGUOUS;
        else return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "Split behavior %s", LMX_QUOTED(b));
        lmx_tok_pre *p = new_pre(t, LMX_TOK_PRE_SPLIT);
        if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        p->behavior = behavior;
        p->invert = lmx_json_bool(j, "invert", 0);
        return parse_pattern(cJSON_GetObjectItemCaseSensitive(j, "pattern"), &p->lit, &p->lit_len,
                             &p->re, err);
    }
    if (!strcmp(type, "ByteLevel")) {
        lmx_tok_pre *p = new_pre(t, LMX_TOK_PRE_BYTELEVEL);
        if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        p->add_prefix_space = lmx_json_bool(j, "add_prefix_space", 1);
        t->byte_level = 1;
        if (lmx_json_bool(j, "use_regex", 1)) return lmx_tok_regex_compile(GPT2_RE, strlen(GPT2_RE), &p->re, err);
        return LMX_OK;
    }
    if (!strcmp(type, "Metaspace")) {
        lmx_tok_pre *p = new_pre(t, LMX_TOK_PRE_METASPACE);
        if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        replacement(j, p->repl, &p->repl_len);
        p->prepend_scheme = prepend_scheme(j);
        p->split = lmx_json_bool(j, "split", 1);
        return LMX_OK;
    }
    if (!strcmp(type, "Digits"))
        return regex_split(t, lmx_json_bool(j, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+",
                           LMX_TOK_SPLIT_ISOLATED, 0, err);
    if (!strcmp(type, "WhitespaceSplit")) return regex_split(t, "\\s+", LMX_TOK_SPLIT_REMOVED, 0, err);
    if (!strcmp(type, "Whitespace")) return regex_split(t, "\\w+|[^\\w\\s]+", LMX_TOK_SPLIT_REMOVED, 1, err);
    if (!strcmp(type, "Punctuation"))
        return regex_split(t, "[\\p{P}!-/:-@\\[-`{-~]", LMX_TOK_SPLIT_ISOLATED, 0, err);
    return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "pre_tokenizer type %s", LMX_QUOTED(type));
}

/* ---- decoders ------------------------------------------------------------------------------ */
static lmx_tok_dec *new_dec(lmx_tokenizer *t, int kind) {
    lmx_tok_dec *g = realloc(t->decs, (t->n_decs + 1) * sizeof *g);
    if (!g) return NULL;
    t->decs = g;
    lmx_tok_dec *d = &g[t->n_decs++];
    memset(d, 0, sizeof *d);
    d->kind = kind;
    return d;
}

lmx_status lmx_tok_parse_decoder(lmx_tokenizer *t, const cJSON *j, lmx_err *err) {
    if (!j || cJSON_IsNull(j)) return LMX_OK;
    t->has_decoder = 1;
    const char *type = lmx_json_str(j, "type");
    if (!type) return lmx_err_set(err, LMX_ERR_FORMAT, "decoder without a type");
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "decoders")) {
            lmx_status st = lmx_tok_parse_decoder(t, it, err);
            if (st) return st;
        }
        return LMX_OK;
    }
    lmx_tok_dec *d = NULL;
    if (!strcmp(type, "ByteLevel")) d = new_dec(t, LMX_TOK_DEC_BYTELEVEL);
    else if (!strcmp(type, "ByteFallback")) d = new_dec(t, LMX_TOK_DEC_BYTEFALLBACK);
    else if (!strcmp(type, "Fuse")) d = new_dec(t, LMX_TOK_DEC_FUSE);
    else if (!strcmp(type, "Replace")) {
        if (!(d = new_dec(t, LMX_TOK_DEC_REPLACE))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "pattern");
        const char *s = lmx_json_str(p, "String"), *c = lmx_json_str(j, "content");
        if (!s) return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "decoder Replace with a Regex pattern");
        d->pat_len = strlen(s);
        d->content_len = c ? strlen(c) : 0;
        d->pat = dupn(s, d->pat_len);
        d->content = dupn(c ? c : "", d->content_len);
        if (!d->pat || !d->content) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        if (!d->pat_len) return lmx_err_set(err, LMX_ERR_FORMAT, "decoder Replace with an empty pattern");
        return LMX_OK;
    } else if (!strcmp(type, "Strip")) {
        if (!(d = new_dec(t, LMX_TOK_DEC_STRIP))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        const char *c = lmx_json_str(j, "content");
        if (!c || !*c) c = " ";
        d->strip_len = lmx_tok_utf8_len((unsigned char)c[0]);
        if (d->strip_len > strlen(c)) d->strip_len = strlen(c);
        memcpy(d->strip_c, c, d->strip_len);
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "start");
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "stop");
        d->start = cJSON_IsNumber(a) ? a->valueint : 0;
        d->stop = cJSON_IsNumber(b) ? b->valueint : 0;
        return LMX_OK;
    } else if (!strcmp(type, "Metaspace")) {
        if (!(d = new_dec(t, LMX_TOK_DEC_METASPACE))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        replacement(j, d->repl, &d->repl_len);
        d->prepend_scheme = prepend_scheme(j);
        return LMX_OK;
    } else
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "decoder type %s", LMX_QUOTED(type));
    return d ? LMX_OK : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

/* ---- post-processors ----------------------------------------------------------------------- */
static lmx_status add_ids(int32_t **arr, size_t *n, const int32_t *ids, size_t k, lmx_err *err) {
    if (!k) return LMX_OK;
    int32_t *g = realloc(*arr, (*n + k) * sizeof *g);
    if (!g) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    memcpy(g + *n, ids, k * sizeof *g);
    *arr = g;
    *n += k;
    return LMX_OK;
}

/* ["[CLS]", 101] -> 101 */
static int32_t pair_id(const cJSON *p) {
    const cJSON *id = cJSON_GetArrayItem(p, 1);
    return cJSON_IsNumber(id) ? id->valueint : -1; /* saturated by cJSON */
}

lmx_status lmx_tok_parse_postprocessor(lmx_tokenizer *t, const cJSON *j, lmx_err *err) {
    if (!j || cJSON_IsNull(j)) return LMX_OK;
    const char *type = lmx_json_str(j, "type");
    if (!type) return lmx_err_set(err, LMX_ERR_FORMAT, "post_processor without a type");
    if (!strcmp(type, "ByteLevel")) return LMX_OK;   /* only adjusts offsets */
    if (!strcmp(type, "Sequence")) {
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "processors")) {
            lmx_status st = lmx_tok_parse_postprocessor(t, it, err);
            if (st) return st;
        }
        return LMX_OK;
    }
    if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
        int32_t cls = pair_id(cJSON_GetObjectItemCaseSensitive(j, "cls"));
        int32_t sep = pair_id(cJSON_GetObjectItemCaseSensitive(j, "sep"));
        if (cls < 0 || sep < 0) return lmx_err_set(err, LMX_ERR_FORMAT, "%s without cls/sep ids", type);
        lmx_status st = add_ids(&t->post_pre, &t->n_post_pre, &cls, 1, err);
        return st ? st : add_ids(&t->post_post, &t->n_post_post, &sep, 1, err);
    }
    if (!strcmp(type, "TemplateProcessing")) {
        const cJSON *specials = cJSON_GetObjectItemCaseSensitive(j, "special_tokens");
        int seen_seq = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, cJSON_GetObjectItemCaseSensitive(j, "single")) {
            if (cJSON_GetObjectItemCaseSensitive(it, "Sequence")) {
                seen_seq = 1;
                continue;
            }
            const char *name = lmx_json_str(cJSON_GetObjectItemCaseSensitive(it, "SpecialToken"), "id");
            if (!name) return lmx_err_set(err, LMX_ERR_FORMAT, "TemplateProcessing: bad item");
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(specials, name);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(sp, "ids"), *x;
            if (!cJSON_IsArray(ids))
                return lmx_err_set(err, LMX_ERR_FORMAT, "TemplateProcessing: no ids for %s", LMX_QUOTED(name));
            cJSON_ArrayForEach(x, ids) {
                int32_t v = x->valueint; /* saturated by cJSON */
                lmx_status st = seen_seq ? add_ids(&t->post_post, &t->n_post_post, &v, 1, err)
                                         : add_ids(&t->post_pre, &t->n_post_pre, &v, 1, err);
                if (st) return st;
            }
        }
        return LMX_OK;
    }
    return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "post_processor type %s", LMX_QUOTED(type));
}

void lmx_tok_steps_free(lmx_tokenizer *t) {
    for (size_t i = 0; i < t->n_norms; i++) {
        free(t->norms[i].pat);
        free(t->norms[i].content);
        pcre2_code_free(t->norms[i].re);
    }
    free(t->norms);
    for (size_t i = 0; i < t->n_pres; i++) {
        free(t->pres[i].lit);
        pcre2_code_free(t->pres[i].re);
    }
    free(t->pres);
    for (size_t i = 0; i < t->n_decs; i++) {
        free(t->decs[i].pat);
        free(t->decs[i].content);
    }
    free(t->decs);
    free(t->post_pre);
    free(t->post_post);
}
