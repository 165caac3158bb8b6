/* jinja_filters.c - Jinja filters and tests.
 *
 * tojson is transformers' own (json.dumps, see jinja_json.c), not jinja2's HTML-escaping one.
 * Filters: abs capitalize center count d default
 * dictsort e escape first float indent int items join last length list lower map max min reject
 * rejectattr replace reverse round safe select selectattr sort string sum title tojson trim
 * unique upper.  Tests: boolean callable defined divisibleby eq equalto even false float ge gt in
 * integer iterable le lower lt mapping ne none number odd sameas sequence string true undefined
 * upper, and the operator spellings == != < <= > >=.  On empty sequences, false values and ties they
 * answer as jinja2 3.1 does (tests/test_jinja_empty.c). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "jinja_internal.h"

/* ---- argument helpers ------------------------------------------------------------------------- */
/* s as Python's repr() writes it (quoted, escaped, one line), for a message; in the arena. */
static const char *repr_of(jj_render *r, jj_str s) {
    jj_buf b = {0};
    jj_write_repr(&b, jj_strv(s.p, s.n));
    int f = b.failed;
    jj_str d = jj_str_dup(r->a, b.p ? b.p : "", b.n, &f);
    jj_buf_free(&b);
    return f ? "''" : d.p;
}

/* The argument at position pos or named name; NULL when absent. */
static const jj_val *arg(int n, const jj_val *args, const char *const *kw, int pos, const char *name) {
    int p = 0;
    for (int k = 0; k < n; k++) {
        if (kw && kw[k]) {
            if (!strcmp(kw[k], name)) return &args[k];
        } else if (p++ == pos) return &args[k];
    }
    return NULL;
}

static int done_buf(jj_render *r, jj_buf *b, jj_val *out) {
    int f = b->failed;
    jj_str s = jj_str_dup(r->a, b->p ? b->p : "", b->n, &f);
    jj_buf_free(b);
    if (f) return jj_oom(r);
    *out = jj_strv(s.p, s.n);
    return 0;
}

static int call_str_method(jj_render *r, const jj_node *at, jj_val v, const char *m, int n,
                           const jj_val *args, jj_val *out) {
    jj_str s;
    if (jj_to_str(r, v, &s)) return -1;
    jj_method meth = {jj_strv(s.p, s.n), m};
    return jj_call_method(r, at, &meth, n, args, NULL, out);
}

static int length(jj_render *r, const jj_node *at, jj_val v, int64_t *n) {
    switch (v.t) {
    case JJ_UNDEF: *n = 0; return 0;
    case JJ_STR: {
        int64_t k = 0;
        for (size_t i = 0; i < v.u.s.n; k++) { int32_t cp; i = jj_utf8_next(v.u.s.p, v.u.s.n, i, &cp); }
        *n = k;
        return 0;
    }
    case JJ_LIST: *n = (int64_t)v.u.list->n; return 0;
    case JJ_DICT: *n = (int64_t)v.u.dict->n; return 0;
    default: return jj_fail(r, at, "object of type '%s' has no len()", jj_type_name(v));
    }
}

static jj_val list_val(jj_list *l) { jj_val v = {.t = JJ_LIST}; v.u.list = l; return v; }

/* Follow a dotted attribute path ("a.b", "0") like jinja2's make_attrgetter. */
static int attr_path(jj_render *r, const jj_node *at, jj_val v, jj_str path, jj_val *out) {
    size_t b = 0;
    while (b <= path.n) {
        size_t e = b;
        while (e < path.n && path.p[e] != '.') e++;
        int isnum = e > b;
        for (size_t i = b; i < e; i++) isnum &= path.p[i] >= '0' && path.p[i] <= '9';
        jj_val key;
        if (isnum) {
            int64_t k = 0;
            for (size_t i = b; i < e; i++) k = k * 10 + (path.p[i] - '0');
            key = jj_int(k);
        } else key = jj_strv(path.p + b, e - b);
        if (jj_getitem(r, at, v, key, &v)) return -1;
        b = e + 1;
    }
    *out = v;
    return 0;
}

/* sort helper: stable merge sort of l by key (case-insensitive strings unless cs) */
static int sort_cmp(jj_render *r, const jj_node *at, jj_val a, jj_val b, int cs, int *c) {
    if (!cs && a.t == JJ_STR && b.t == JJ_STR) {
        jj_val la, lb;
        jj_method m1 = {a, "lower"}, m2 = {b, "lower"};
        if (jj_call_method(r, at, &m1, 0, NULL, NULL, &la) || jj_call_method(r, at, &m2, 0, NULL, NULL, &lb)) return -1;
        a = la;
        b = lb;
    }
    return jj_compare(r, at, a, b, c);
}

static int sort_list(jj_render *r, const jj_node *at, jj_list *l, const jj_val *keys, int cs, int rev) {
    /* insertion sort over an index permutation; lists in templates are short */
    size_t n = l->n;
    size_t *ix = jj_alloc(r->a, (n + 1) * sizeof *ix);
    jj_val *tmp = jj_alloc(r->a, (n + 1) * sizeof *tmp);
    if (!ix || !tmp) return jj_oom(r);
    for (size_t i = 0; i < n; i++) ix[i] = i;
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0; j--) {
            int c;
            if (sort_cmp(r, at, keys[ix[j - 1]], keys[ix[j]], cs, &c)) return -1;
            if (rev ? c >= 0 : c <= 0) break;
            size_t t = ix[j]; ix[j] = ix[j - 1]; ix[j - 1] = t;
        }
    for (size_t i = 0; i < n; i++) tmp[i] = l->v[ix[i]];
    if (n) memcpy(l->v, tmp, n * sizeof *tmp); /* an empty list has no storage (v NULL) */
    return 0;
}

/* min/max as Python's: the first item whose key no later key beats (strictly less for min, strictly
 * greater for max), so ties keep the earliest item; jinja2's undefined for an empty sequence. */
static int min_max(jj_render *r, const jj_node *at, const jj_list *l, const jj_val *keys, int cs, int is_max,
                   jj_val *out) {
    if (!l->n) {
        *out = jj_undef("No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    for (size_t i = 1; i < l->n; i++) {
        int c;
        if (sort_cmp(r, at, keys[i], keys[best], cs, &c)) return -1;
        if (is_max ? c > 0 : c < 0) best = i;
    }
    *out = l->v[best];
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------------ */
static const char *const TESTS[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even", "false", "float",
    "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number",
    "odd", "sameas", "sequence", "string", "true", "undefined", "upper", "==", "!=", "<", "<=",
    ">", ">=", "greaterthan", "lessthan", NULL};

int jj_test_exists(const char *name) {
    for (int k = 0; TESTS[k]; k++)
        if (!strcmp(TESTS[k], name)) return 1;
    return 0;
}

int jj_test(jj_render *r, const jj_node *at, const char *t, jj_val v, int n, const jj_val *args,
            int *out) {
    jj_val o;
    int c;
    if (!strcmp(t, "defined")) *out = v.t != JJ_UNDEF;
    else if (!strcmp(t, "undefined")) *out = v.t == JJ_UNDEF;
    else if (!strcmp(t, "none")) *out = v.t == JJ_NONE;
    else if (!strcmp(t, "string")) *out = v.t == JJ_STR;
    else if (!strcmp(t, "mapping")) *out = v.t == JJ_DICT;
    else if (!strcmp(t, "iterable")) *out = v.t == JJ_STR || v.t == JJ_LIST || v.t == JJ_DICT || v.t == JJ_UNDEF;
    else if (!strcmp(t, "sequence")) *out = v.t == JJ_STR || v.t == JJ_LIST || v.t == JJ_DICT || v.t == JJ_UNDEF;
    else if (!strcmp(t, "number")) *out = v.t == JJ_INT || v.t == JJ_FLOAT || v.t == JJ_BOOL;
    else if (!strcmp(t, "integer")) *out = v.t == JJ_INT;
    else if (!strcmp(t, "float")) *out = v.t == JJ_FLOAT;
    else if (!strcmp(t, "boolean")) *out = v.t == JJ_BOOL;
    else if (!strcmp(t, "true")) *out = v.t == JJ_BOOL && v.u.b;
    else if (!strcmp(t, "false")) *out = v.t == JJ_BOOL && !v.u.b;
    else if (!strcmp(t, "callable")) *out = v.t == JJ_MACRO || v.t == JJ_FUNC || v.t == JJ_METHOD;
    else if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
        if (v.t != JJ_STR) { *out = 0; return 0; }
        jj_method m = {v, t[0] == 'l' ? "islower" : "isupper"};
        if (jj_call_method(r, at, &m, 0, NULL, NULL, &o)) return -1;
        *out = o.u.b;
    } else if (!strcmp(t, "odd") || !strcmp(t, "even") || !strcmp(t, "divisibleby")) {
        jj_val d = !strcmp(t, "divisibleby") ? (n ? args[0] : jj_none()) : jj_int(2);
        if (jj_binop(r, at, OP_MOD, v, d, &o)) return -1;
        *out = t[0] == 'o' ? jj_truthy(o) : !jj_truthy(o);
    } else {
        if (n < 1) return jj_fail(r, at, "test '%s' needs an argument", t);
        if (!strcmp(t, "sameas")) {   /* Python `is`: containers by identity, scalars by value */
            jj_val w = args[0];
            *out = v.t == w.t && (v.t == JJ_LIST ? v.u.list == w.u.list
                                  : v.t == JJ_DICT ? v.u.dict == w.u.dict : jj_equal(v, w));
        }
        else if (!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==")) *out = jj_equal(v, args[0]);
        else if (!strcmp(t, "ne") || !strcmp(t, "!=")) *out = !jj_equal(v, args[0]);
        else if (!strcmp(t, "in")) {
            if (jj_binop(r, at, OP_IN, v, args[0], &o)) return -1;
            *out = o.u.b;
        } else {
            if (jj_compare(r, at, v, args[0], &c)) return -1;
            if (!strcmp(t, "lt") || !strcmp(t, "<") || !strcmp(t, "lessthan")) *out = c < 0;
            else if (!strcmp(t, "le") || !strcmp(t, "<=")) *out = c <= 0;
            else if (!strcmp(t, "gt") || !strcmp(t, ">") || !strcmp(t, "greaterthan")) *out = c > 0;
            else if (!strcmp(t, "ge") || !strcmp(t, ">=")) *out = c >= 0;
            else return jj_fail(r, at, "no test named '%s'", t);
        }
    }
    return 0;
}

/* The result of map/select/reject/selectattr/rejectattr on a false value (empty, none, undefined, 0):
 * jinja2 checks nothing (neither the value's type nor the arguments) and yields nothing. */
static int empty_list(jj_render *r, jj_val *out) {
    jj_list *l = jj_list_new(r->a, 0);
    if (!l) return jj_oom(r);
    *out = list_val(l);
    return 0;
}

/* select/reject/selectattr/rejectattr: keep items whose (attribute's) test result is want. */
static int select_items(jj_render *r, const jj_node *at, jj_val v, int n, const jj_val *args,
                        int by_attr, int want, jj_val *out) {
    jj_list *src, *l;
    if (!jj_truthy(v)) return empty_list(r, out);
    if (jj_iterate(r, at, v, &src) || !(l = jj_list_new(r->a, src->n))) return r->err->status ? -1 : jj_oom(r);
    int k = 0;
    jj_str path = {"", 0};
    if (by_attr) {
        if (n < 1 || args[0].t != JJ_STR) return jj_fail(r, at, "selectattr/rejectattr need an attribute name");
        path = args[0].u.s;
        k = 1;
    }
    char tname[64] = "";
    if (k < n) {
        if (args[k].t != JJ_STR) return jj_fail(r, at, "the test name must be a string");
        snprintf(tname, sizeof tname, "%.*s", (int)args[k].u.s.n, args[k].u.s.p);
        if (!jj_test_exists(tname)) return jj_fail(r, at, "no test named %s", repr_of(r, args[k].u.s));
        k++;
    }
    for (size_t i = 0; i < src->n; i++) {
        jj_val x = src->v[i];
        int t;
        if (by_attr && attr_path(r, at, x, path, &x)) return -1;
        if (tname[0]) {
            if (jj_test(r, at, tname, x, n - k, args + k, &t)) return -1;
        } else t = jj_truthy(x);
        if (t == want && jj_list_push(r->a, l, src->v[i])) return jj_oom(r);
    }
    *out = list_val(l);
    return 0;
}

/* ---- filters ---------------------------------------------------------------------------------- */
static const char *const FILTERS[] = {
    "abs", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min",
    "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort",
    "string", "sum", "title", "tojson", "trim", "unique", "upper", NULL};

int jj_filter_exists(const char *name) {
    for (int k = 0; FILTERS[k]; k++)
        if (!strcmp(FILTERS[k], name)) return 1;
    return 0;
}


static int get_bool(const jj_val *v, int dflt) { return v ? jj_truthy(*v) : dflt; }

static int first_last(jj_render *r, const jj_node *at, jj_val v, int last, jj_val *out) {
    jj_list *l;
    if (jj_iterate(r, at, v, &l)) return -1;
    if (!l->n) *out = jj_undef(last ? "No last item, sequence was empty." : "No first item, sequence was empty.");
    else *out = l->v[last ? l->n - 1 : 0];
    return 0;
}

static int to_int(jj_render *r, jj_val v, const jj_val *dflt, jj_val *out) {
    *out = dflt ? *dflt : jj_int(0);
    if (v.t == JJ_INT) *out = v;
    else if (v.t == JJ_BOOL) *out = jj_int(v.u.b);
    else if (v.t == JJ_FLOAT) {
        if (isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) *out = jj_int((int64_t)v.u.f);
    } else if (v.t == JJ_STR) {
        char tmp[128], *e;
        size_t k = 0;
        jj_val s;
        jj_method m = {v, "strip"};
        if (jj_call_method(r, NULL, &m, 0, NULL, NULL, &s)) return -1;
        for (size_t i = 0; i < s.u.s.n && k + 1 < sizeof tmp; i++)
            if (s.u.s.p[i] != '_') tmp[k++] = s.u.s.p[i];
        tmp[k] = '\0';
        if (!k) return 0;
        long long x = strtoll(tmp, &e, 10);
        if (!*e) { *out = jj_int(x); return 0; }
        double d = strtod(tmp, &e);
        if (!*e && isfinite(d) && fabs(d) < 9.2e18) *out = jj_int((int64_t)d);
    }
    return 0;
}

static int to_float(jj_render *r, jj_val v, const jj_val *dflt, jj_val *out) {
    *out = dflt ? *dflt : jj_float(0.0);
    if (v.t == JJ_FLOAT) *out = v;
    else if (v.t == JJ_INT || v.t == JJ_BOOL) *out = jj_float(v.t == JJ_INT ? (double)v.u.i : v.u.b);
    else if (v.t == JJ_STR) {
        char tmp[128], *e;
        jj_val s;
        jj_method m = {v, "strip"};
        if (jj_call_method(r, NULL, &m, 0, NULL, NULL, &s)) return -1;
        snprintf(tmp, sizeof tmp, "%.*s", (int)s.u.s.n, s.u.s.p);
        double d = strtod(tmp, &e);
        if (tmp[0] && !*e) *out = jj_float(d);
    }
    return 0;
}

/* jinja2's title: upper-case the first letter after -, whitespace, ( { [ <; lower the rest */
static int jinja_title(jj_render *r, jj_str s, jj_val *out) {
    jj_buf b = {0};
    int start = 1;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i = jj_utf8_next(s.p, s.n, i, &cp);
        int delim = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jj_is_space(cp);
        jj_utf8_put(&b, delim ? cp : start ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
        start = delim;
    }
    return done_buf(r, &b, out);
}

static int indent(jj_render *r, jj_str s, const jj_val *w, int first, int blank, jj_val *out) {
    jj_buf ind = {0}, b = {0};
    if (w && w->t == JJ_STR) jj_buf_put(&ind, w->u.s.p, w->u.s.n);
    else for (int64_t i = 0; i < (w && w->t == JJ_INT ? w->u.i : 4) && i < 256; i++) jj_buf_putc(&ind, ' ');
    const char *ip = ind.p ? ind.p : "";
    if (first) jj_buf_put(&b, ip, ind.n);
    size_t i = 0, line = 0;
    while (i <= s.n) {
        size_t e = i;
        while (e < s.n && s.p[e] != '\n' && s.p[e] != '\r') e++;
        if (e >= s.n && i == s.n && line > 0) break;   /* splitlines drops the final empty piece */
        if (line > 0) {
            jj_buf_putc(&b, '\n');
            if (blank || e > i) jj_buf_put(&b, ip, ind.n);
        }
        jj_buf_put(&b, s.p + i, e - i);
        line++;
        if (e >= s.n) break;
        i = e + (s.p[e] == '\r' && e + 1 < s.n && s.p[e + 1] == '\n' ? 2 : 1);
    }
    jj_buf_free(&ind);
    return done_buf(r, &b, out);
}

int jj_filter(jj_render *r, const jj_node *at, const char *f, jj_val v, int n,
              const jj_val *args, const char *const *kw, jj_val *out) {
    jj_list *l, *nl;
    jj_str s = {"", 0};
    int64_t k = 0;
    if (!strcmp(f, "safe")) { *out = v; return 0; }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        const jj_val *dv = arg(n, args, kw, 0, "default_value");
        int boolean = get_bool(arg(n, args, kw, 1, "boolean"), 0);
        *out = v.t == JJ_UNDEF || (boolean && !jj_truthy(v)) ? (dv ? *dv : jj_strv("", 0)) : v;
        return 0;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (length(r, at, v, &k)) return -1;
        *out = jj_int(k);
        return 0;
    }
    if (!strcmp(f, "string")) {
        if (jj_to_str(r, v, &s)) return -1;
        *out = jj_strv(s.p, s.n);
        return 0;
    }
    if (!strcmp(f, "trim")) {
        const jj_val *c = arg(n, args, kw, 0, "chars");
        return call_str_method(r, at, v, "strip", c ? 1 : 0, c, out);
    }
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize"))
        return call_str_method(r, at, v, f, 0, NULL, out);
    if (!strcmp(f, "center")) {   /* Python's str.center(width) */
        const jj_val *w = arg(n, args, kw, 0, "width");
        int64_t width = w && w->t == JJ_INT ? w->u.i : 80, len = 0;
        if (jj_to_str(r, v, &s) || length(r, at, jj_strv(s.p, s.n), &len)) return -1;
        if (width > (int64_t)JJ_MAX_RANGE) width = JJ_MAX_RANGE;
        int64_t pad = width > len ? width - len : 0, left = pad / 2 + (pad & width & 1);
        jj_buf b = {0};
        for (int64_t i = 0; i < left; i++) jj_buf_putc(&b, ' ');
        jj_buf_put(&b, s.p, s.n);
        for (int64_t i = left; i < pad; i++) jj_buf_putc(&b, ' ');
        return done_buf(r, &b, out);
    }
    if (!strcmp(f, "title")) return jj_to_str(r, v, &s) || jinja_title(r, s, out);
    if (!strcmp(f, "replace")) return call_str_method(r, at, v, "replace", n, args, out);
    if (!strcmp(f, "first") || !strcmp(f, "last")) return first_last(r, at, v, f[0] == 'l', out);
    if (!strcmp(f, "int")) return to_int(r, v, arg(n, args, kw, 0, "default"), out);
    if (!strcmp(f, "float")) return to_float(r, v, arg(n, args, kw, 0, "default"), out);
    if (!strcmp(f, "abs")) {
        if (v.t == JJ_INT) *out = jj_int(v.u.i < 0 ? (int64_t)(0 - (uint64_t)v.u.i) : v.u.i);
        else if (v.t == JJ_FLOAT) *out = jj_float(fabs(v.u.f));
        else if (v.t == JJ_BOOL) *out = jj_int(v.u.b);
        else return jj_fail(r, at, "bad operand type for abs(): '%s'", jj_type_name(v));
        return 0;
    }
    if (!strcmp(f, "round")) {
        const jj_val *p = arg(n, args, kw, 0, "precision"), *m = arg(n, args, kw, 1, "method");
        double x = v.t == JJ_FLOAT ? v.u.f : v.t == JJ_INT ? (double)v.u.i : v.t == JJ_BOOL ? v.u.b : NAN;
        if (isnan(x) && v.t != JJ_FLOAT) return jj_fail(r, at, "round: not a number");
        double scale = pow(10.0, p && p->t == JJ_INT ? (double)p->u.i : 0.0);
        const char *meth = m && m->t == JJ_STR ? m->u.s.p : "common";
        double y = x * scale;
        y = !strncmp(meth, "ceil", 4) ? ceil(y) : !strncmp(meth, "floor", 5) ? floor(y) : nearbyint(y);
        *out = jj_float(y / scale);
        return 0;
    }
    if (!strcmp(f, "escape") || !strcmp(f, "e")) {
        if (jj_to_str(r, v, &s)) return -1;
        jj_buf b = {0};
        for (size_t i = 0; i < s.n; i++) {
            char c = s.p[i];
            if (c == '&') jj_buf_puts(&b, "&amp;");
            else if (c == '<') jj_buf_puts(&b, "&lt;");
            else if (c == '>') jj_buf_puts(&b, "&gt;");
            else if (c == '"') jj_buf_puts(&b, "&#34;");
            else if (c == '\'') jj_buf_puts(&b, "&#39;");
            else jj_buf_putc(&b, c);
        }
        return done_buf(r, &b, out);
    }
    if (!strcmp(f, "indent")) {
        if (jj_to_str(r, v, &s)) return -1;
        return indent(r, s, arg(n, args, kw, 0, "width"), get_bool(arg(n, args, kw, 1, "first"), 0),
                      get_bool(arg(n, args, kw, 2, "blank"), 0), out);
    }
    if (!strcmp(f, "tojson")) {
        jj_json_opts o = {.indent = -1};
        const jj_val *ind = arg(n, args, kw, 0, "indent"), *sep = arg(n, args, kw, 99, "separators");
        if (ind && ind->t == JJ_INT) o.indent = ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : (int)ind->u.i;
        o.ensure_ascii = get_bool(arg(n, args, kw, 99, "ensure_ascii"), 0);
        o.sort_keys = get_bool(arg(n, args, kw, 99, "sort_keys"), 0);
        char seps[2][16] = {"", ""};
        if (sep && sep->t == JJ_LIST && sep->u.list->n == 2 && sep->u.list->v[0].t == JJ_STR &&
            sep->u.list->v[1].t == JJ_STR) {
            for (int q = 0; q < 2; q++)
                snprintf(seps[q], sizeof seps[q], "%.*s", (int)sep->u.list->v[q].u.s.n, sep->u.list->v[q].u.s.p);
            o.item_sep = seps[0];
            o.key_sep = seps[1];
        }
        jj_buf b = {.limit = JJ_MAX_OUTPUT};
        lmx_err e = {0};
        if (jj_write_json(&b, v, &o, 0, &e)) {
            jj_buf_free(&b);
            return jj_fail(r, at, "%s", e.msg);
        }
        return done_buf(r, &b, out);
    }
    if (!strcmp(f, "items")) {
        if (v.t == JJ_UNDEF) {
            if (!(l = jj_list_new(r->a, 0))) return jj_oom(r);
            *out = list_val(l);
            return 0;
        }
        if (v.t != JJ_DICT) return jj_fail(r, at, "Can only get item pairs from a mapping.");
        jj_method m = {v, "items"};
        return jj_call_method(r, at, &m, 0, NULL, NULL, out);
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject"))
        return select_items(r, at, v, n, args, 0, f[0] == 's', out);
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr"))
        return select_items(r, at, v, n, args, 1, f[0] == 's', out);

    if (!strcmp(f, "map") && !jj_truthy(v)) return empty_list(r, out);
    /* the rest iterate over v */
    if (jj_iterate(r, at, v, &l)) return -1;
    if (!strcmp(f, "list")) {
        if (!(nl = jj_list_new(r->a, l->n))) return jj_oom(r);
        for (size_t i = 0; i < l->n; i++) jj_list_push(r->a, nl, l->v[i]);
        *out = list_val(nl);
        return 0;
    }
    if (!strcmp(f, "join")) {
        const jj_val *d = arg(n, args, kw, 0, "d"), *attr = arg(n, args, kw, 1, "attribute");
        jj_str sep = {"", 0};
        if (d && jj_to_str(r, *d, &sep)) return -1;
        jj_buf b = {.limit = JJ_MAX_OUTPUT};
        for (size_t i = 0; i < l->n; i++) {
            jj_val x = l->v[i];
            if (attr && attr->t == JJ_STR && attr_path(r, at, x, attr->u.s, &x)) { jj_buf_free(&b); return -1; }
            if (jj_to_str(r, x, &s)) { jj_buf_free(&b); return -1; }
            if (i) jj_buf_put(&b, sep.p, sep.n);
            jj_buf_put(&b, s.p, s.n);
        }
        return done_buf(r, &b, out);
    }
    if (!strcmp(f, "reverse")) {
        if (v.t == JJ_STR) {
            jj_buf b = {0};
            for (size_t i = l->n; i > 0; i--) jj_buf_put(&b, l->v[i - 1].u.s.p, l->v[i - 1].u.s.n);
            return done_buf(r, &b, out);
        }
        if (!(nl = jj_list_new(r->a, l->n))) return jj_oom(r);
        for (size_t i = l->n; i > 0; i--) jj_list_push(r->a, nl, l->v[i - 1]);
        *out = list_val(nl);
        return 0;
    }
    if (!strcmp(f, "map")) {
        const jj_val *attr = arg(n, args, kw, 99, "attribute"), *dflt = arg(n, args, kw, 99, "default");
        if (!(nl = jj_list_new(r->a, l->n))) return jj_oom(r);
        char fname[64] = "";
        if (!attr) {
            if (n < 1 || args[0].t != JJ_STR) return jj_fail(r, at, "map needs a filter name or attribute=");
            snprintf(fname, sizeof fname, "%.*s", (int)args[0].u.s.n, args[0].u.s.p);
            if (!jj_filter_exists(fname)) return jj_fail(r, at, "no filter named %s", repr_of(r, args[0].u.s));
        } else if (attr->t != JJ_STR) return jj_fail(r, at, "map: attribute must be a string");
        for (size_t i = 0; i < l->n; i++) {
            jj_val x = l->v[i];
            if (attr) {
                if (attr_path(r, at, x, attr->u.s, &x)) return -1;
                if (x.t == JJ_UNDEF && dflt) x = *dflt;
            } else if (jj_filter(r, at, fname, x, n - 1, args + 1, kw ? kw + 1 : NULL, &x)) return -1;
            if (jj_list_push(r->a, nl, x)) return jj_oom(r);
        }
        *out = list_val(nl);
        return 0;
    }
    if (!strcmp(f, "sum")) {
        const jj_val *attr = arg(n, args, kw, 0, "attribute"), *start = arg(n, args, kw, 1, "start");
        if (start && start->t == JJ_STR) /* Python's sum refuses a string start, even for no items */
            return jj_fail(r, at, "sum() can't sum strings [use ''.join(seq) instead]");
        jj_val acc = start ? *start : jj_int(0);
        for (size_t i = 0; i < l->n; i++) {
            jj_val x = l->v[i];
            if (attr && attr->t == JJ_STR && attr_path(r, at, x, attr->u.s, &x)) return -1;
            if (jj_binop(r, at, OP_ADD, acc, x, &acc)) return -1;
        }
        *out = acc;
        return 0;
    }
    /* sorting family: keys by attribute, case-insensitive strings unless case_sensitive */
    int is_sort = !strcmp(f, "sort"), is_dictsort = !strcmp(f, "dictsort");
    int is_min = !strcmp(f, "min"), is_max = !strcmp(f, "max"), is_unique = !strcmp(f, "unique");
    if (!is_sort && !is_dictsort && !is_min && !is_max && !is_unique)
        return jj_fail(r, at, "no filter named '%s'", f);
    int cs = get_bool(arg(n, args, kw, is_sort ? 1 : 0, "case_sensitive"), 0);
    int rev = is_sort ? get_bool(arg(n, args, kw, 0, "reverse"), 0)
            : is_dictsort ? get_bool(arg(n, args, kw, 2, "reverse"), 0) : 0;
    const jj_val *attr = is_dictsort ? NULL : arg(n, args, kw, is_sort ? 2 : 1, "attribute");
    if (is_dictsort) {
        if (v.t != JJ_DICT) return jj_fail(r, at, "dictsort needs a mapping");
        jj_method m = {v, "items"};
        jj_val items;
        if (jj_call_method(r, at, &m, 0, NULL, NULL, &items)) return -1;
        l = items.u.list;
    }
    if (!(nl = jj_list_new(r->a, l->n))) return jj_oom(r);
    jj_val *keys = jj_alloc(r->a, (l->n + 1) * sizeof *keys);
    if (!keys) return jj_oom(r);
    const jj_val *by = is_dictsort ? arg(n, args, kw, 1, "by") : NULL;
    int by_value = by && by->t == JJ_STR && by->u.s.n == 5 && !memcmp(by->u.s.p, "value", 5);
    for (size_t i = 0; i < l->n; i++) {
        jj_val x = l->v[i];
        if (is_dictsort) x = x.u.list->v[by_value ? 1 : 0];
        else if (attr && attr->t == JJ_STR && attr_path(r, at, x, attr->u.s, &x)) return -1;
        keys[i] = x;
        jj_list_push(r->a, nl, l->v[i]);
    }
    if (is_unique) {
        jj_list *u = jj_list_new(r->a, l->n);
        if (!u) return jj_oom(r);
        for (size_t i = 0; i < l->n; i++) {
            int dup = 0;
            for (size_t j = 0; j < i && !dup; j++) {
                int c;
                if (keys[i].t != keys[j].t && !(keys[i].t <= JJ_FLOAT && keys[j].t <= JJ_FLOAT)) continue;
                if (keys[i].t == JJ_STR || (keys[i].t <= JJ_FLOAT && keys[i].t >= JJ_BOOL)) {
                    if (sort_cmp(r, at, keys[i], keys[j], cs, &c)) return -1;
                    dup = c == 0;
                } else dup = jj_equal(keys[i], keys[j]);
            }
            if (!dup) jj_list_push(r->a, u, l->v[i]);
        }
        *out = list_val(u);
        return 0;
    }
    if (is_min || is_max) return min_max(r, at, nl, keys, cs, is_max, out);
    if (sort_list(r, at, nl, keys, cs, rev)) return -1;
    *out = list_val(nl);
    return 0;
}
