/* jinja_json.c - json.dumps(value, ensure_ascii, indent, separators, sort_keys) as Python
 * writes it, for transformers' tojson filter: ", " and ": " separators (",", ": " with an
 * indent), floats as repr(), NaN/Infinity, non-ASCII kept raw unless ensure_ascii, control
 * characters as \u00XX, non-string keys as strings. */
#include <math.h>
#include <string.h>

#include "jinja_internal.h"

static void json_str(jj_buf *b, jj_str s, int ascii) {
    jj_buf_putc(b, '"');
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        size_t j = jj_utf8_next(s.p, s.n, i, &cp);
        switch (cp) {
        case '"': jj_buf_puts(b, "\\\""); break;
        case '\\': jj_buf_puts(b, "\\\\"); break;
        case '\n': jj_buf_puts(b, "\\n"); break;
        case '\r': jj_buf_puts(b, "\\r"); break;
        case '\t': jj_buf_puts(b, "\\t"); break;
        case '\b': jj_buf_puts(b, "\\b"); break;
        case '\f': jj_buf_puts(b, "\\f"); break;
        default:
            if (cp < 0x20 || (ascii && cp >= 0x7f)) {
                if (cp >= 0x10000) {
                    int32_t v = cp - 0x10000;
                    jj_buf_printf(b, "\\u%04x\\u%04x", (unsigned)(0xd800 | (v >> 10)), (unsigned)(0xdc00 | (v & 0x3ff)));
                } else jj_buf_printf(b, "\\u%04x", (unsigned)cp);
            } else jj_buf_put(b, s.p + i, j - i);
        }
        i = j;
    }
    jj_buf_putc(b, '"');
}

static void json_float(jj_buf *b, double f) {
    if (isnan(f)) jj_buf_puts(b, "NaN");
    else if (isinf(f)) jj_buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else jj_write_float(b, f);
}

static void newline_indent(jj_buf *b, const jj_json_opts *o, int level) {
    jj_buf_putc(b, '\n');
    for (int i = 0; i < o->indent * level; i++) jj_buf_putc(b, ' ');
}

static int key_cmp(jj_val a, jj_val b) {
    jj_buf x = {0}, y = {0};
    jj_write_str(&x, a);
    jj_write_str(&y, b);
    int c = strcmp(x.p ? x.p : "", y.p ? y.p : "");
    jj_buf_free(&x);
    jj_buf_free(&y);
    return c;
}

int jj_write_json(jj_buf *b, jj_val v, const jj_json_opts *o, int depth, lmx_err *err) {
    if (depth > JJ_MAX_DEPTH) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "tojson: value nested too deeply"), -1;
    const char *item_sep = o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
    const char *key_sep = o->key_sep ? o->key_sep : ": ";
    switch (v.t) {
    case JJ_NONE: jj_buf_puts(b, "null"); return 0;
    case JJ_BOOL: jj_buf_puts(b, v.u.b ? "true" : "false"); return 0;
    case JJ_INT: jj_buf_printf(b, "%lld", (long long)v.u.i); return 0;
    case JJ_FLOAT: json_float(b, v.u.f); return 0;
    case JJ_STR: json_str(b, v.u.s, o->ensure_ascii); return 0;
    case JJ_LIST:
        if (!v.u.list->n) { jj_buf_puts(b, "[]"); return 0; }
        jj_buf_putc(b, '[');
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i) jj_buf_puts(b, item_sep);
            if (o->indent >= 0) newline_indent(b, o, depth + 1);
            if (jj_write_json(b, v.u.list->v[i], o, depth + 1, err)) return -1;
        }
        if (o->indent >= 0) newline_indent(b, o, depth);
        jj_buf_putc(b, ']');
        return 0;
    case JJ_DICT: {
        jj_dict *d = v.u.dict;
        if (!d->n) { jj_buf_puts(b, "{}"); return 0; }
        size_t order[256], *ord = order;
        size_t n = d->n < 256 ? d->n : 256;   /* sort_keys handles the first 256 keys in order */
        for (size_t i = 0; i < n; i++) order[i] = i;
        if (o->sort_keys)
            for (size_t i = 1; i < n; i++)   /* insertion sort: stable, dicts are small */
                for (size_t j = i; j > 0 && key_cmp(d->k[ord[j - 1]], d->k[ord[j]]) > 0; j--) {
                    size_t t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
                }
        jj_buf_putc(b, '{');
        for (size_t i = 0; i < d->n; i++) {
            size_t k = i < n ? ord[i] : i;
            jj_val key = d->k[k];
            if (i) jj_buf_puts(b, item_sep);
            if (o->indent >= 0) newline_indent(b, o, depth + 1);
            if (key.t == JJ_STR) json_str(b, key.u.s, o->ensure_ascii);
            else if (key.t == JJ_INT || key.t == JJ_BOOL || key.t == JJ_NONE || key.t == JJ_FLOAT) {
                jj_buf_putc(b, '"');
                if (jj_write_json(b, key, o, depth + 1, err)) return -1;
                jj_buf_putc(b, '"');
            } else
                return lmx_err_set(err, LMX_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s", jj_type_name(key)), -1;
            jj_buf_puts(b, key_sep);
            if (jj_write_json(b, d->v[k], o, depth + 1, err)) return -1;
        }
        if (o->indent >= 0) newline_indent(b, o, depth);
        jj_buf_putc(b, '}');
        return 0;
    }
    default:
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable", jj_type_name(v)), -1;
    }
}

