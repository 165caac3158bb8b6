/* jinja_value.c - the Jinja engine's memory (arena, byte buffer) and values: constructors, lists
 * and ordered dicts, Python truthiness and equality, str()/repr() formatting, and conversion
 * from cJSON. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "jinja_internal.h"

/* ---- arena ---------------------------------------------------------------------------------- */
struct jj_chunk {
    jj_chunk *next;
    size_t cap, used;
    max_align_t data[];
};

void *jj_alloc(jj_arena *a, size_t n) {
    const size_t al = sizeof(max_align_t);
    n = (n + al - 1) / al * al;
    if (n == 0) n = al;
    jj_chunk *h = a->head;
    if (!h || h->cap - h->used < n) {
        size_t cap = n > ((size_t)32 << 10) ? n : ((size_t)32 << 10);
        if (a->limit && a->total + cap > a->limit) return NULL;
        h = calloc(1, sizeof(jj_chunk) + cap);
        if (!h) return NULL;
        h->cap = cap;
        a->total += cap;
        /* a big allocation goes behind the head so the head's free room stays usable */
        if (a->head && cap == n) {
            h->next = a->head->next;
            a->head->next = h;
            h->used = n;
            return (char *)h->data;
        }
        h->next = a->head;
        a->head = h;
    }
    void *p = (char *)h->data + h->used;
    h->used += n;
    return p;
}

void jj_arena_free(jj_arena *a) {
    jj_chunk *c = a->head;
    while (c) {
        jj_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- byte buffer ------------------------------------------------------------------------------ */
void jj_buf_put(jj_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->limit && b->n + n > b->limit) {
        b->failed = 1;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jj_buf_puts(jj_buf *b, const char *s) { jj_buf_put(b, s, strlen(s)); }
void jj_buf_putc(jj_buf *b, char c) { jj_buf_put(b, &c, 1); }

void jj_buf_printf(jj_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    jj_buf_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

void jj_buf_free(jj_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- constructors ----------------------------------------------------------------------------- */
jj_val jj_undef(const char *msg) { jj_val v = {.t = JJ_UNDEF}; v.u.undef = msg; return v; }
jj_val jj_none(void) { jj_val v = {.t = JJ_NONE}; return v; }
jj_val jj_bool(int b) { jj_val v = {.t = JJ_BOOL}; v.u.b = !!b; return v; }
jj_val jj_int(int64_t i) { jj_val v = {.t = JJ_INT}; v.u.i = i; return v; }
jj_val jj_float(double f) { jj_val v = {.t = JJ_FLOAT}; v.u.f = f; return v; }
jj_val jj_strv(const char *p, size_t n) {
    jj_val v = {.t = JJ_STR};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}
jj_val jj_cstr(const char *p) { return jj_strv(p, strlen(p)); }

jj_str jj_str_dup(jj_arena *a, const char *p, size_t n, int *fail) {
    jj_str s = {"", 0};
    if (n == 0) return s;
    char *q = jj_alloc(a, n + 1);
    if (!q) {
        *fail = 1;
        return s;
    }
    memcpy(q, p, n);
    s.p = q;
    s.n = n;
    return s;
}

jj_list *jj_list_new(jj_arena *a, size_t cap) {
    jj_list *l = jj_alloc(a, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        l->v = jj_alloc(a, cap * sizeof(jj_val));
        if (!l->v) return NULL;
        l->cap = cap;
    }
    return l;
}

int jj_list_push(jj_arena *a, jj_list *l, jj_val v) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        jj_val *nv = jj_alloc(a, cap * sizeof(jj_val));
        if (!nv) return -1;
        if (l->n) memcpy(nv, l->v, l->n * sizeof(jj_val));
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

jj_dict *jj_dict_new(jj_arena *a, size_t cap) {
    jj_dict *d = jj_alloc(a, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        d->k = jj_alloc(a, cap * sizeof(jj_val));
        d->v = jj_alloc(a, cap * sizeof(jj_val));
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

jj_val *jj_dict_get(const jj_dict *d, jj_val k) {
    for (size_t i = 0; i < d->n; i++)
        if (jj_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

jj_val *jj_dict_gets(const jj_dict *d, const char *key) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == JJ_STR && d->k[i].u.s.n == n && !memcmp(d->k[i].u.s.p, key, n))
            return &d->v[i];
    return NULL;
}

int jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v) {
    jj_val *old = jj_dict_get(d, k);
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        jj_val *nk = jj_alloc(a, cap * sizeof(jj_val)), *nv = jj_alloc(a, cap * sizeof(jj_val));
        if (!nk || !nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof(jj_val));
            memcpy(nv, d->v, d->n * sizeof(jj_val));
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ---- Python semantics ------------------------------------------------------------------------- */
int jj_truthy(jj_val v) {
    switch (v.t) {
    case JJ_UNDEF: case JJ_NONE: return 0;
    case JJ_BOOL: return v.u.b;
    case JJ_INT: return v.u.i != 0;
    case JJ_FLOAT: return v.u.f != 0.0;
    case JJ_STR: return v.u.s.n != 0;
    case JJ_LIST: return v.u.list->n != 0;
    case JJ_DICT: return v.u.dict->n != 0;
    default: return 1;
    }
}

static int is_num(jj_val v) { return v.t == JJ_BOOL || v.t == JJ_INT || v.t == JJ_FLOAT; }

int jj_equal(jj_val a, jj_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JJ_FLOAT && b.t != JJ_FLOAT) {
            int64_t x = a.t == JJ_BOOL ? a.u.b : a.u.i, y = b.t == JJ_BOOL ? b.u.b : b.u.i;
            return x == y;
        }
        double x = a.t == JJ_FLOAT ? a.u.f : a.t == JJ_BOOL ? a.u.b : (double)a.u.i;
        double y = b.t == JJ_FLOAT ? b.u.f : b.t == JJ_BOOL ? b.u.b : (double)b.u.i;
        return x == y;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case JJ_UNDEF: case JJ_NONE: return 1;
    case JJ_STR: return a.u.s.n == b.u.s.n && (a.u.s.n == 0 || !memcmp(a.u.s.p, b.u.s.p, a.u.s.n));
    case JJ_LIST:
        if (a.u.list->n != b.u.list->n || a.u.list->tuple != b.u.list->tuple) return 0;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!jj_equal(a.u.list->v[i], b.u.list->v[i])) return 0;
        return 1;
    case JJ_DICT:
        if (a.u.dict->n != b.u.dict->n) return 0;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            jj_val *o = jj_dict_get(b.u.dict, a.u.dict->k[i]);
            if (!o || !jj_equal(a.u.dict->v[i], *o)) return 0;
        }
        return 1;
    case JJ_NS: return a.u.dict == b.u.dict;
    case JJ_LOOP: return a.u.loop == b.u.loop;
    case JJ_MACRO: return a.u.macro == b.u.macro;
    case JJ_FUNC: return a.u.func == b.u.func;
    case JJ_METHOD: return a.u.method == b.u.method;
    default: return 0;
    }
}

const char *jj_type_name(jj_val v) {
    switch (v.t) {
    case JJ_UNDEF: return "Undefined";
    case JJ_NONE: return "NoneType object";
    case JJ_BOOL: return "bool object";
    case JJ_INT: return "int object";
    case JJ_FLOAT: return "float object";
    case JJ_STR: return "str object";
    case JJ_LIST: return "list object";
    case JJ_DICT: return "dict object";
    case JJ_NS: return "Namespace object";
    case JJ_LOOP: return "LoopContext object";
    case JJ_MACRO: return "Macro object";
    default: return "builtin_function_or_method object";
    }
}

/* ---- str() and repr() ------------------------------------------------------------------------- */
void jj_write_float(jj_buf *b, double f) {
    if (isnan(f)) { jj_buf_puts(b, "nan"); return; }
    if (isinf(f)) { jj_buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {   /* the shortest form that reads back the same */
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp is [-]d[.ddd]e[+-]XX: split into digits and a decimal exponent */
    const char *p = tmp;
    if (*p == '-') { jj_buf_putc(b, '-'); p++; }
    char digits[32];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int e = atoi(p + 1);
    if (e >= -4 && e < 16) {
        if (e >= 0) {
            for (int i = 0; i <= e; i++) jj_buf_putc(b, i < nd ? digits[i] : '0');
            jj_buf_putc(b, '.');
            if (nd > e + 1) jj_buf_put(b, digits + e + 1, (size_t)(nd - e - 1));
            else jj_buf_putc(b, '0');
        } else {
            jj_buf_puts(b, "0.");
            for (int i = 0; i < -e - 1; i++) jj_buf_putc(b, '0');
            jj_buf_put(b, digits, (size_t)nd);
        }
    } else {
        jj_buf_putc(b, digits[0]);
        if (nd > 1) {
            jj_buf_putc(b, '.');
            jj_buf_put(b, digits + 1, (size_t)(nd - 1));
        }
        jj_buf_printf(b, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    }
}

/* Python's str.isprintable() for one code point (approximation through utf8proc categories). */
static int printable(int32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp < 0x7f) return 1;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS: return 0;
    default: return 1;
    }
}

static void write_str_repr(jj_buf *b, jj_str s) {
    int has_sq = memchr(s.p, '\'', s.n) != NULL, has_dq = memchr(s.p, '"', s.n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jj_buf_putc(b, q);
    size_t i = 0;
    while (i < s.n) {
        int32_t cp;
        size_t j = jj_utf8_next(s.p, s.n, i, &cp);
        if (cp == q || cp == '\\') { jj_buf_putc(b, '\\'); jj_buf_putc(b, (char)cp); }
        else if (cp == '\n') jj_buf_puts(b, "\\n");
        else if (cp == '\r') jj_buf_puts(b, "\\r");
        else if (cp == '\t') jj_buf_puts(b, "\\t");
        else if (printable(cp)) jj_buf_put(b, s.p + i, j - i);
        else if (cp < 0x100) jj_buf_printf(b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000) jj_buf_printf(b, "\\u%04x", (unsigned)cp);
        else jj_buf_printf(b, "\\U%08x", (unsigned)cp);
        i = j;
    }
    jj_buf_putc(b, q);
}

static void write_any(jj_buf *b, jj_val v, int repr, int depth) {
    if (depth > JJ_MAX_DEPTH) { jj_buf_puts(b, "..."); return; }
    switch (v.t) {
    case JJ_UNDEF: if (repr) jj_buf_puts(b, "Undefined"); return;
    case JJ_NONE: jj_buf_puts(b, "None"); return;
    case JJ_BOOL: jj_buf_puts(b, v.u.b ? "True" : "False"); return;
    case JJ_INT: jj_buf_printf(b, "%lld", (long long)v.u.i); return;
    case JJ_FLOAT: jj_write_float(b, v.u.f); return;
    case JJ_STR:
        if (repr) write_str_repr(b, v.u.s);
        else jj_buf_put(b, v.u.s.p, v.u.s.n);
        return;
    case JJ_LIST:
        jj_buf_putc(b, v.u.list->tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            write_any(b, v.u.list->v[i], 1, depth + 1);
        }
        if (v.u.list->tuple && v.u.list->n == 1) jj_buf_putc(b, ',');
        jj_buf_putc(b, v.u.list->tuple ? ')' : ']');
        return;
    case JJ_DICT: case JJ_NS:
        if (v.t == JJ_NS) jj_buf_puts(b, "<Namespace ");
        jj_buf_putc(b, '{');
        for (size_t i = 0; i < v.u.dict->n; i++) {
            if (i) jj_buf_puts(b, ", ");
            write_any(b, v.u.dict->k[i], 1, depth + 1);
            jj_buf_puts(b, ": ");
            write_any(b, v.u.dict->v[i], 1, depth + 1);
        }
        jj_buf_putc(b, '}');
        if (v.t == JJ_NS) jj_buf_putc(b, '>');
        return;
    case JJ_LOOP:
        jj_buf_printf(b, "<LoopContext %zu/%zu>", v.u.loop->i + 1, v.u.loop->items->n);
        return;
    case JJ_MACRO: jj_buf_printf(b, "<Macro '%s'>", v.u.macro->name); return;
    case JJ_FUNC: jj_buf_puts(b, "<built-in function>"); return;
    case JJ_METHOD: jj_buf_printf(b, "<built-in method %s>", v.u.method->name); return;
    }
}

void jj_write_str(jj_buf *b, jj_val v) { write_any(b, v, 0, 0); }
void jj_write_repr(jj_buf *b, jj_val v) { write_any(b, v, 1, 0); }

/* ---- from cJSON ------------------------------------------------------------------------------- */
static int from_cjson(jj_arena *a, const cJSON *j, jj_val *out, int depth) {
    if (depth > JJ_MAX_DEPTH) return -1;
    int fail = 0;
    if (!j || cJSON_IsNull(j)) *out = jj_none();
    else if (cJSON_IsBool(j)) *out = jj_bool(cJSON_IsTrue(j));
    else if (cJSON_IsNumber(j)) {
        /* cJSON keeps no int/float distinction: integral values within 2^53 become ints */
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0) *out = jj_int((int64_t)d);
        else *out = jj_float(d);
    } else if (cJSON_IsString(j)) {
        const char *s = j->valuestring ? j->valuestring : "";
        jj_str st = jj_str_dup(a, s, strlen(s), &fail);
        *out = jj_strv(st.p, st.n);
    } else if (cJSON_IsArray(j)) {
        jj_list *l = jj_list_new(a, (size_t)cJSON_GetArraySize(j));
        if (!l) return -1;
        for (const cJSON *c = j->child; c; c = c->next) {
            jj_val v;
            if (from_cjson(a, c, &v, depth + 1) || jj_list_push(a, l, v)) return -1;
        }
        out->t = JJ_LIST;
        out->u.list = l;
    } else if (cJSON_IsObject(j)) {
        jj_dict *d = jj_dict_new(a, (size_t)cJSON_GetArraySize(j));
        if (!d) return -1;
        for (const cJSON *c = j->child; c; c = c->next) {
            jj_val v;
            const char *k = c->string ? c->string : "";
            jj_str ks = jj_str_dup(a, k, strlen(k), &fail);
            if (from_cjson(a, c, &v, depth + 1) || jj_dict_set(a, d, jj_strv(ks.p, ks.n), v))
                return -1;
        }
        out->t = JJ_DICT;
        out->u.dict = d;
    } else *out = jj_none();
    return fail ? -1 : 0;
}

int jj_from_cjson(jj_arena *a, const void *cjson, jj_val *out) {
    return from_cjson(a, (const cJSON *)cjson, out, 0);
}
