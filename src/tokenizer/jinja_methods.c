/* jinja_methods.c - UTF-8 helpers and the Python methods templates call on values:
 *   str:  startswith endswith split rsplit strip lstrip rstrip replace upper lower title
 *         capitalize find count join format removeprefix removesuffix isdigit isalpha isalnum
 *         isspace islower isupper
 *   dict: get items keys values      list: index count      loop: cycle
 * Methods that modify a list or dict exist but fail when called, as in transformers'
 * ImmutableSandboxedEnvironment.  Strings index and count by code point, like Python. */
#include <string.h>
#include <utf8proc.h>

#include "jinja_internal.h"

/* ---- UTF-8 ------------------------------------------------------------------------------------ */
size_t jj_utf8_next(const char *p, size_t n, size_t i, int32_t *cp) {
    const unsigned char *s = (const unsigned char *)p;
    unsigned c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + (size_t)len > n) { *cp = (int32_t)c; return i + 1; }
    int32_t v = len == 1 ? (int32_t)c : len == 2 ? (int32_t)(c & 0x1f) : len == 3 ? (int32_t)(c & 0x0f) : (int32_t)(c & 0x07);
    for (int k = 1; k < len; k++) {
        if ((s[i + (size_t)k] & 0xc0) != 0x80) { *cp = (int32_t)c; return i + 1; }
        v = (v << 6) | (s[i + (size_t)k] & 0x3f);
    }
    *cp = v;
    return i + (size_t)len;
}

void jj_utf8_put(jj_buf *b, int32_t cp) {
    char t[4];
    if (cp < 0x80) { t[0] = (char)cp; jj_buf_put(b, t, 1); }
    else if (cp < 0x800) {
        t[0] = (char)(0xc0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3f));
        jj_buf_put(b, t, 2);
    } else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        t[2] = (char)(0x80 | (cp & 0x3f));
        jj_buf_put(b, t, 3);
    } else {
        t[0] = (char)(0xf0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); t[3] = (char)(0x80 | (cp & 0x3f));
        jj_buf_put(b, t, 4);
    }
}

int jj_is_space(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* ---- helpers ---------------------------------------------------------------------------------- */
static int done_str(jj_render *r, jj_buf *b, jj_val *out) {
    int f = b->failed;
    jj_str s = jj_str_dup(r->a, b->p ? b->p : "", b->n, &f);
    jj_buf_free(b);
    if (f) return jj_oom(r);
    *out = jj_strv(s.p, s.n);
    return 0;
}

static int in_set(int32_t cp, jj_str chars) {
    for (size_t i = 0; i < chars.n;) {
        int32_t c;
        i = jj_utf8_next(chars.p, chars.n, i, &c);
        if (c == cp) return 1;
    }
    return 0;
}

/* strip: which 1 = left, 2 = right, 3 = both; chars NULL = whitespace */
static jj_str strip(jj_str s, int which, const jj_str *chars) {
    size_t b = 0, e = s.n;
    if (which & 1)
        while (b < e) {
            int32_t cp;
            size_t j = jj_utf8_next(s.p, e, b, &cp);
            if (chars ? !in_set(cp, *chars) : !jj_is_space(cp)) break;
            b = j;
        }
    if (which & 2)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s.p[k] & 0xc0) == 0x80) k--;
            int32_t cp;
            jj_utf8_next(s.p, e, k, &cp);
            if (chars ? !in_set(cp, *chars) : !jj_is_space(cp)) break;
            e = k;
        }
    jj_str o = {s.p + b, e - b};
    return o;
}

static int case_map(jj_render *r, jj_str s, int mode, jj_val *out) {   /* 0 lower 1 upper 2 title 3 cap */
    jj_buf b = {0};
    int prev_cased = 0, first = 1;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i = jj_utf8_next(s.p, s.n, i, &cp);
        int32_t o = cp;
        if (mode == 0) o = utf8proc_tolower(cp);
        else if (mode == 1) o = utf8proc_toupper(cp);
        else if (mode == 2) o = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
        else o = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        utf8proc_category_t c = utf8proc_category(cp);
        prev_cased = c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
        first = 0;
        jj_utf8_put(&b, o);
    }
    return done_str(r, &b, out);
}

static const char *const STR_METHODS[] = {
    "startswith", "endswith", "split", "rsplit", "strip", "lstrip", "rstrip", "replace", "upper",
    "lower", "title", "capitalize", "find", "count", "join", "format", "removeprefix",
    "removesuffix", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};
static const char *const LIST_METHODS[] = {"index", "count", NULL};
static const char *const UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "clear",
                                     "sort", "reverse", "update", "setdefault", "popitem", NULL};

static int in_list(const char *const *names, const char *name) {
    for (int k = 0; names[k]; k++)
        if (!strcmp(names[k], name)) return 1;
    return 0;
}

int jj_method_exists(jj_val self, const char *name) {
    switch (self.t) {
    case JJ_STR: return in_list(STR_METHODS, name);
    case JJ_DICT: return in_list(DICT_METHODS, name) || in_list(UNSAFE, name);
    case JJ_LIST: return in_list(LIST_METHODS, name) || in_list(UNSAFE, name);
    default: return 0;
    }
}

static int want_str(jj_render *r, const jj_node *at, const char *m, jj_val v, jj_str *out) {
    if (v.t != JJ_STR) return jj_fail(r, at, "%s() argument must be str, not %s", m, jj_type_name(v));
    *out = v.u.s;
    return 0;
}

static size_t find_bytes(jj_str h, jj_str n, size_t from) {
    for (size_t i = from; i + n.n <= h.n; i++)
        if (!n.n || !memcmp(h.p + i, n.p, n.n)) return i;
    return (size_t)-1;
}

static size_t cp_count(const char *p, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; k++) {
        int32_t cp;
        i = jj_utf8_next(p, n, i, &cp);
    }
    return k;
}

static int split(jj_render *r, const jj_node *at, jj_str s, const jj_val *sep, int64_t maxsplit,
                 int right, jj_val *out) {
    jj_list *l = jj_list_new(r->a, 0);
    if (!l) return jj_oom(r);
    out->t = JJ_LIST;
    out->u.list = l;
    if (sep && sep->t != JJ_NONE) {
        jj_str d = {"", 0};
        if (want_str(r, at, "split", *sep, &d)) return -1;
        if (!d.n) return jj_fail(r, at, "empty separator");
        if (!right) {
            size_t b = 0, k;
            while ((maxsplit < 0 || (int64_t)l->n < maxsplit) && (k = find_bytes(s, d, b)) != (size_t)-1) {
                if (jj_list_push(r->a, l, jj_strv(s.p + b, k - b))) return jj_oom(r);
                b = k + d.n;
            }
            return jj_list_push(r->a, l, jj_strv(s.p + b, s.n - b)) ? jj_oom(r) : 0;
        }
        size_t e = s.n;   /* rsplit: collect from the right, then reverse */
        int64_t cnt = 0;
        for (size_t i = s.n; i >= d.n && (maxsplit < 0 || cnt < maxsplit);) {
            if (!memcmp(s.p + i - d.n, d.p, d.n)) {
                if (jj_list_push(r->a, l, jj_strv(s.p + i, e - i))) return jj_oom(r);
                cnt++;
                i -= d.n;
                e = i;
            } else i--;
        }
        if (jj_list_push(r->a, l, jj_strv(s.p, e))) return jj_oom(r);
    } else {   /* runs of whitespace; no empty strings */
        size_t i = 0;
        for (;;) {
            s = strip(s, right ? 2 : 1, NULL);
            if (!s.n) break;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                if (jj_list_push(r->a, l, jj_strv(s.p, s.n))) return jj_oom(r);
                break;
            }
            if (!right) {
                size_t j = 0;
                while (j < s.n) {
                    int32_t cp;
                    size_t nx = jj_utf8_next(s.p, s.n, j, &cp);
                    if (jj_is_space(cp)) break;
                    j = nx;
                }
                if (jj_list_push(r->a, l, jj_strv(s.p, j))) return jj_oom(r);
                s.p += j;
                s.n -= j;
            } else {
                size_t j = s.n;
                while (j > 0) {
                    size_t k = j - 1;
                    while (k > 0 && ((unsigned char)s.p[k] & 0xc0) == 0x80) k--;
                    int32_t cp;
                    jj_utf8_next(s.p, s.n, k, &cp);
                    if (jj_is_space(cp)) break;
                    j = k;
                }
                if (jj_list_push(r->a, l, jj_strv(s.p + j, s.n - j))) return jj_oom(r);
                s.n = j;
            }
            (void)i;
        }
    }
    if (right)
        for (size_t a = 0, b = l->n ? l->n - 1 : 0; a < b; a++, b--) {
            jj_val t = l->v[a];
            l->v[a] = l->v[b];
            l->v[b] = t;
        }
    return 0;
}

/* "{}", "{0}", "{name}" fields with str() of the argument; "{{" and "}}" escape braces. */
static int format(jj_render *r, const jj_node *at, jj_str f, int n, const jj_val *args,
                  const char *const *kw, jj_val *out) {
    jj_buf b = {0};
    int auto_i = 0;
    for (size_t i = 0; i < f.n; i++) {
        char c = f.p[i];
        if ((c == '{' || c == '}') && i + 1 < f.n && f.p[i + 1] == c) { jj_buf_putc(&b, c); i++; continue; }
        if (c != '{') { jj_buf_putc(&b, c); continue; }
        size_t e = i + 1;
        while (e < f.n && f.p[e] != '}') e++;
        if (e >= f.n) { jj_buf_free(&b); return jj_fail(r, at, "format: unmatched '{'"); }
        jj_str field = {f.p + i + 1, e - i - 1};
        const jj_val *v = NULL;
        if (field.n == 0) { if (auto_i < n && !(kw && kw[auto_i])) v = &args[auto_i]; auto_i++; }
        else if (field.p[0] >= '0' && field.p[0] <= '9') {
            int k = 0;
            for (size_t q = 0; q < field.n && k < 1000; q++) k = k * 10 + (field.p[q] - '0');
            if (k < n && !(kw && kw[k])) v = &args[k];
        } else
            for (int k = 0; k < n; k++)
                if (kw && kw[k] && strlen(kw[k]) == field.n && !memcmp(kw[k], field.p, field.n)) v = &args[k];
        if (!v) { jj_buf_free(&b); return jj_fail(r, at, "format: no argument for field '{%.*s}'", (int)field.n, field.p); }
        jj_write_str(&b, *v);
        i = e;
    }
    return done_str(r, &b, out);
}

static int str_pred(jj_str s, const char *m) {
    if (!s.n) return 0;
    int cased = 0;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        i = jj_utf8_next(s.p, s.n, i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        int alpha = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        int digit = c == UTF8PROC_CATEGORY_ND;
        if (!strcmp(m, "isdigit") && !digit) return 0;
        if (!strcmp(m, "isalpha") && !alpha) return 0;
        if (!strcmp(m, "isalnum") && !alpha && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return 0;
        if (!strcmp(m, "isspace") && !jj_is_space(cp)) return 0;
        if (!strcmp(m, "islower") && (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT)) return 0;
        if (!strcmp(m, "isupper") && (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT)) return 0;
        if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) cased = 1;
    }
    return strcmp(m, "islower") && strcmp(m, "isupper") ? 1 : cased;
}

static int affix(jj_render *r, const jj_node *at, jj_str s, jj_val arg, int end, int *out) {
    *out = 0;
    if (arg.t == JJ_LIST) {
        for (size_t i = 0; i < arg.u.list->n && !*out; i++)
            if (affix(r, at, s, arg.u.list->v[i], end, out)) return -1;
        return 0;
    }
    jj_str a = {"", 0};
    if (want_str(r, at, end ? "endswith" : "startswith", arg, &a)) return -1;
    *out = a.n <= s.n && (a.n == 0 || !memcmp(end ? s.p + s.n - a.n : s.p, a.p, a.n));
    return 0;
}

static int str_method(jj_render *r, const jj_node *at, jj_str s, const char *m, int n,
                      const jj_val *args, const char *const *kw, jj_val *out) {
    jj_str a = {"", 0}, b2 = {"", 0};
    int t = 0;
    const jj_val *arg0 = n > 0 ? &args[0] : NULL;
    if (!strcmp(m, "format")) return format(r, at, s, n, args, kw, out);
    for (int k = 0; k < n; k++)
        if (kw && kw[k] && strcmp(kw[k], "sep") && strcmp(kw[k], "maxsplit") && strcmp(kw[k], "count"))
            return jj_fail(r, at, "%s() got an unexpected keyword argument '%s'", m, kw[k]);
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (!arg0) return jj_fail(r, at, "%s() takes at least 1 argument", m);
        if (affix(r, at, s, *arg0, m[0] == 'e', &t)) return -1;
        *out = jj_bool(t);
        return 0;
    }
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        int64_t maxsplit = -1;
        if (n > 1) {
            if (args[1].t != JJ_INT) return jj_fail(r, at, "maxsplit must be an integer");
            maxsplit = args[1].u.i;
        }
        return split(r, at, s, arg0, maxsplit, m[0] == 'r', out);
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        int which = m[0] == 'l' ? 1 : m[0] == 'r' ? 2 : 3;
        if (arg0 && arg0->t != JJ_NONE) {
            if (want_str(r, at, m, *arg0, &a)) return -1;
            s = strip(s, which, &a);
        } else s = strip(s, which, NULL);
        *out = jj_strv(s.p, s.n);
        return 0;
    }
    if (!strcmp(m, "replace")) {
        if (n < 2 || want_str(r, at, m, args[0], &a) || want_str(r, at, m, args[1], &b2))
            return r->err->status ? -1 : jj_fail(r, at, "replace() takes 2 or 3 arguments");
        int64_t count = n > 2 && args[2].t == JJ_INT ? args[2].u.i : -1;
        jj_buf b = {0};
        size_t i = 0;
        int64_t done = 0;
        if (!a.n) {   /* "" matches between every code point */
            while (count < 0 || done < count) {
                jj_buf_put(&b, b2.p, b2.n);
                done++;
                if (i >= s.n) break;
                int32_t cp;
                size_t j = jj_utf8_next(s.p, s.n, i, &cp);
                jj_buf_put(&b, s.p + i, j - i);
                i = j;
            }
        } else {
            size_t k;
            while ((count < 0 || done < count) && (k = find_bytes(s, a, i)) != (size_t)-1) {
                jj_buf_put(&b, s.p + i, k - i);
                jj_buf_put(&b, b2.p, b2.n);
                i = k + a.n;
                done++;
            }
        }
        if (i < s.n) jj_buf_put(&b, s.p + i, s.n - i);
        return done_str(r, &b, out);
    }
    if (!strcmp(m, "lower")) return case_map(r, s, 0, out);
    if (!strcmp(m, "upper")) return case_map(r, s, 1, out);
    if (!strcmp(m, "title")) return case_map(r, s, 2, out);
    if (!strcmp(m, "capitalize")) return case_map(r, s, 3, out);
    if (!strcmp(m, "find") || !strcmp(m, "count")) {
        if (!arg0 || want_str(r, at, m, *arg0, &a))
            return r->err->status ? -1 : jj_fail(r, at, "%s() takes at least 1 argument", m);
        size_t k = find_bytes(s, a, 0);
        if (m[0] == 'f') { *out = jj_int(k == (size_t)-1 ? -1 : (int64_t)cp_count(s.p, k)); return 0; }
        int64_t c = 0;
        if (!a.n) c = (int64_t)cp_count(s.p, s.n) + 1;
        else
            for (; k != (size_t)-1; k = find_bytes(s, a, k + a.n)) c++;
        *out = jj_int(c);
        return 0;
    }
    if (!strcmp(m, "join")) {
        jj_list *l;
        if (!arg0 || jj_iterate(r, at, *arg0, &l)) return r->err->status ? -1 : jj_fail(r, at, "join() takes 1 argument");
        jj_buf b = {0};
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].t != JJ_STR) {
                jj_buf_free(&b);
                return jj_fail(r, at, "sequence item %zu: expected str instance, %s found", i, jj_type_name(l->v[i]));
            }
            if (i) jj_buf_put(&b, s.p, s.n);
            jj_buf_put(&b, l->v[i].u.s.p, l->v[i].u.s.n);
        }
        return done_str(r, &b, out);
    }
    if (!strcmp(m, "removeprefix") || !strcmp(m, "removesuffix")) {
        if (!arg0 || want_str(r, at, m, *arg0, &a)) return r->err->status ? -1 : jj_fail(r, at, "%s() takes 1 argument", m);
        int suf = m[6] == 's';
        if (a.n <= s.n && (!a.n || !memcmp(suf ? s.p + s.n - a.n : s.p, a.p, a.n))) {
            if (!suf) s.p += a.n;
            s.n -= a.n;
        }
        *out = jj_strv(s.p, s.n);
        return 0;
    }
    *out = jj_bool(str_pred(s, m));
    return 0;
}

int jj_call_method(jj_render *r, const jj_node *at, const jj_method *m, int n, const jj_val *args,
                   const char *const *kw, jj_val *out) {
    jj_val self = m->self;
    const char *name = m->name;
    if (self.t == JJ_LOOP) {   /* loop.cycle(a, b, ...) */
        if (n == 0) return jj_fail(r, at, "no items for cycling given");
        *out = args[self.u.loop->i % (size_t)n];
        return 0;
    }
    if ((self.t == JJ_DICT || self.t == JJ_LIST) && in_list(UNSAFE, name))
        return jj_fail(r, at, "access to attribute '%s' of '%s' is unsafe", name, jj_type_name(self));
    if (self.t == JJ_STR) return str_method(r, at, self.u.s, name, n, args, kw, out);
    if (self.t == JJ_LIST) {
        if (n != 1) return jj_fail(r, at, "%s() takes exactly one argument", name);
        int64_t c = 0;
        for (size_t i = 0; i < self.u.list->n; i++)
            if (jj_equal(self.u.list->v[i], args[0])) {
                if (!strcmp(name, "index")) { *out = jj_int((int64_t)i); return 0; }
                c++;
            }
        if (!strcmp(name, "index")) return jj_fail(r, at, "value is not in list");
        *out = jj_int(c);
        return 0;
    }
    /* dict */
    jj_dict *d = self.u.dict;
    if (!strcmp(name, "get")) {
        if (n < 1 || n > 2) return jj_fail(r, at, "get expected 1 or 2 arguments, got %d", n);
        jj_val *v = jj_dict_get(d, args[0]);
        *out = v ? *v : n > 1 ? args[1] : jj_none();
        return 0;
    }
    if (n) return jj_fail(r, at, "%s() takes no arguments", name);
    jj_list *l = jj_list_new(r->a, d->n);
    if (!l) return jj_oom(r);
    for (size_t i = 0; i < d->n; i++) {
        jj_val item;
        if (!strcmp(name, "items")) {
            jj_list *pair = jj_list_new(r->a, 2);
            if (!pair) return jj_oom(r);
            pair->tuple = 1;
            jj_list_push(r->a, pair, d->k[i]);
            jj_list_push(r->a, pair, d->v[i]);
            item.t = JJ_LIST;
            item.u.list = pair;
        } else item = !strcmp(name, "keys") ? d->k[i] : d->v[i];
        jj_list_push(r->a, l, item);
    }
    out->t = JJ_LIST;
    out->u.list = l;
    return 0;
}
