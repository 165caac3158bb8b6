/* jinja_ops.c - Jinja operators with Python semantics (arithmetic, ~, comparisons, in) and
 * attribute / item / slice access with jinja2's rules:
 *   - obj.name tries an attribute (a method of str, dict or list, a loop variable) and then the
 *     item obj["name"]; obj[key] tries the item first and then the attribute;
 *   - a missing attribute or item gives Undefined (printing it gives ""), but any use of an
 *     Undefined beyond printing, testing and iterating is an error ("'x' is undefined"). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jinja_internal.h"

/* Python's type name: "int", "str", "NoneType" ... */
static const char *pytype(jj_val v, char *buf, size_t n) {
    const char *s = jj_type_name(v);
    size_t k = strlen(s);
    if (k > 7 && !strcmp(s + k - 7, " object")) k -= 7;
    if (k >= n) k = n - 1;
    memcpy(buf, s, k);
    buf[k] = '\0';
    return buf;
}

static int unsupported(jj_render *r, const jj_node *at, const char *op, jj_val x, jj_val y) {
    char a[40], b[40];
    if (x.t == JJ_UNDEF) return jj_fail(r, at, "%s", x.u.undef);
    if (y.t == JJ_UNDEF) return jj_fail(r, at, "%s", y.u.undef);
    return jj_fail(r, at, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                   pytype(x, a, sizeof a), pytype(y, b, sizeof b));
}

static int is_intlike(jj_val v) { return v.t == JJ_INT || v.t == JJ_BOOL; }
static int is_num(jj_val v) { return is_intlike(v) || v.t == JJ_FLOAT; }
static int64_t ival(jj_val v) { return v.t == JJ_BOOL ? v.u.b : v.u.i; }
static double fval(jj_val v) { return v.t == JJ_FLOAT ? v.u.f : (double)ival(v); }

static int concat(jj_render *r, jj_str a, jj_str b, jj_val *out) {
    char *p = jj_alloc(r->a, a.n + b.n + 1);
    if (!p) return jj_oom(r);
    if (a.n) memcpy(p, a.p, a.n);
    if (b.n) memcpy(p + a.n, b.p, b.n);
    *out = jj_strv(p, a.n + b.n);
    return 0;
}

static int repeat(jj_render *r, const jj_node *at, jj_val seq, int64_t k, jj_val *out) {
    if (k < 0) k = 0;
    /* an empty sequence repeated is empty, however large k: no loop of k steps */
    if (seq.t == JJ_STR ? !seq.u.s.n : !seq.u.list->n) k = 0;
    if (seq.t == JJ_STR) {
        if (seq.u.s.n && (uint64_t)k > JJ_MAX_OUTPUT / seq.u.s.n)
            return jj_fail(r, at, "repeated string too long");
        size_t n = seq.u.s.n * (size_t)k;
        char *p = jj_alloc(r->a, n + 1);
        if (!p) return jj_oom(r);
        for (int64_t i = 0; i < k; i++) memcpy(p + (size_t)i * seq.u.s.n, seq.u.s.p, seq.u.s.n);
        *out = jj_strv(p, n);
        return 0;
    }
    if (seq.u.list->n && (uint64_t)k > JJ_MAX_RANGE / seq.u.list->n)
        return jj_fail(r, at, "repeated list too long");
    jj_list *l = jj_list_new(r->a, seq.u.list->n * (size_t)k);
    if (!l) return jj_oom(r);
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.list->n; j++) jj_list_push(r->a, l, seq.u.list->v[j]);
    out->t = JJ_LIST;
    out->u.list = l;
    return 0;
}

int jj_compare(jj_render *r, const jj_node *at, jj_val x, jj_val y, int *cmp) {
    if (is_num(x) && is_num(y)) {
        if (is_intlike(x) && is_intlike(y)) *cmp = (ival(x) > ival(y)) - (ival(x) < ival(y));
        else *cmp = (fval(x) > fval(y)) - (fval(x) < fval(y));
        return 0;
    }
    if (x.t == JJ_STR && y.t == JJ_STR) {
        size_t n = x.u.s.n < y.u.s.n ? x.u.s.n : y.u.s.n;
        int c = n ? memcmp(x.u.s.p, y.u.s.p, n) : 0;
        *cmp = c ? (c > 0) - (c < 0) : (x.u.s.n > y.u.s.n) - (x.u.s.n < y.u.s.n);
        return 0;
    }
    if (x.t == JJ_LIST && y.t == JJ_LIST) {
        size_t n = x.u.list->n < y.u.list->n ? x.u.list->n : y.u.list->n;
        for (size_t i = 0; i < n; i++) {
            if (jj_equal(x.u.list->v[i], y.u.list->v[i])) continue;
            return jj_compare(r, at, x.u.list->v[i], y.u.list->v[i], cmp);
        }
        *cmp = (x.u.list->n > y.u.list->n) - (x.u.list->n < y.u.list->n);
        return 0;
    }
    char a[40], b[40];
    if (x.t == JJ_UNDEF) return jj_fail(r, at, "%s", x.u.undef);
    if (y.t == JJ_UNDEF) return jj_fail(r, at, "%s", y.u.undef);
    return jj_fail(r, at, "comparison not supported between instances of '%s' and '%s'",
                   pytype(x, a, sizeof a), pytype(y, b, sizeof b));
}

static int contains(jj_render *r, const jj_node *at, jj_val hay, jj_val needle, int *out) {
    char a[40];
    switch (hay.t) {
    case JJ_STR:
        if (needle.t != JJ_STR)
            return jj_fail(r, at, "'in <string>' requires string as left operand, not %s",
                           pytype(needle, a, sizeof a));
        *out = 0;
        if (needle.u.s.n == 0) { *out = 1; return 0; }
        for (size_t i = 0; i + needle.u.s.n <= hay.u.s.n; i++)
            if (!memcmp(hay.u.s.p + i, needle.u.s.p, needle.u.s.n)) { *out = 1; break; }
        return 0;
    case JJ_LIST:
        *out = 0;
        for (size_t i = 0; i < hay.u.list->n && !*out; i++) *out = jj_equal(hay.u.list->v[i], needle);
        return 0;
    case JJ_DICT: *out = jj_dict_get(hay.u.dict, needle) != NULL; return 0;
    case JJ_UNDEF: *out = 0; return 0;
    default:
        return jj_fail(r, at, "argument of type '%s' is not iterable", pytype(hay, a, sizeof a));
    }
}

static int int_result(jj_render *r, const jj_node *at, int overflow, int64_t v, jj_val *out) {
    if (overflow) return jj_fail(r, at, "integer overflow");
    *out = jj_int(v);
    return 0;
}

int jj_binop(jj_render *r, const jj_node *at, int op, jj_val x, jj_val y, jj_val *out) {
    int c;
    int64_t v = 0;
    jj_str a, b;
    switch (op) {
    case OP_CONCAT:
        if (jj_to_str(r, x, &a) || jj_to_str(r, y, &b)) return -1;
        return concat(r, a, b, out);
    case OP_EQ: *out = jj_bool(jj_equal(x, y)); return 0;
    case OP_NE: *out = jj_bool(!jj_equal(x, y)); return 0;
    case OP_LT: case OP_LE: case OP_GT: case OP_GE:
        if (jj_compare(r, at, x, y, &c)) return -1;
        *out = jj_bool(op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
        return 0;
    case OP_IN: case OP_NOTIN:
        if (contains(r, at, y, x, &c)) return -1;
        *out = jj_bool(op == OP_IN ? c : !c);
        return 0;
    case OP_ADD:
        if (x.t == JJ_STR && y.t == JJ_STR) return concat(r, x.u.s, y.u.s, out);
        if (x.t == JJ_LIST && y.t == JJ_LIST) {
            jj_list *l = jj_list_new(r->a, x.u.list->n + y.u.list->n);
            if (!l) return jj_oom(r);
            l->tuple = x.u.list->tuple;
            for (size_t i = 0; i < x.u.list->n; i++) jj_list_push(r->a, l, x.u.list->v[i]);
            for (size_t i = 0; i < y.u.list->n; i++) jj_list_push(r->a, l, y.u.list->v[i]);
            out->t = JJ_LIST;
            out->u.list = l;
            return 0;
        }
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, "+", x, y);
        if (is_intlike(x) && is_intlike(y))
            { int ovf = __builtin_add_overflow(ival(x), ival(y), &v); return int_result(r, at, ovf, v, out); }
        *out = jj_float(fval(x) + fval(y));
        return 0;
    case OP_SUB:
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, "-", x, y);
        if (is_intlike(x) && is_intlike(y))
            { int ovf = __builtin_sub_overflow(ival(x), ival(y), &v); return int_result(r, at, ovf, v, out); }
        *out = jj_float(fval(x) - fval(y));
        return 0;
    case OP_MUL:
        if ((x.t == JJ_STR || x.t == JJ_LIST) && is_intlike(y)) return repeat(r, at, x, ival(y), out);
        if ((y.t == JJ_STR || y.t == JJ_LIST) && is_intlike(x)) return repeat(r, at, y, ival(x), out);
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, "*", x, y);
        if (is_intlike(x) && is_intlike(y))
            { int ovf = __builtin_mul_overflow(ival(x), ival(y), &v); return int_result(r, at, ovf, v, out); }
        *out = jj_float(fval(x) * fval(y));
        return 0;
    case OP_DIV:
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, "/", x, y);
        if (fval(y) == 0.0) return jj_fail(r, at, "division by zero");
        *out = jj_float(fval(x) / fval(y));
        return 0;
    case OP_FLOORDIV: case OP_MOD:
        if (op == OP_MOD && x.t == JJ_STR) return jj_fail(r, at, "string %% formatting is not supported");
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, op == OP_MOD ? "%" : "//", x, y);
        if (fval(y) == 0.0) return jj_fail(r, at, "integer division or modulo by zero");
        if (is_intlike(x) && is_intlike(y)) {
            int64_t p = ival(x), q = ival(y);
            if (p == INT64_MIN && q == -1) return jj_fail(r, at, "integer overflow");
            int64_t d = p / q, m = p % q;
            if (m != 0 && ((m < 0) != (q < 0))) { d--; m += q; }   /* Python floors */
            *out = jj_int(op == OP_MOD ? m : d);
            return 0;
        }
        {
            double p = fval(x), q = fval(y), m = fmod(p, q);
            if (m != 0 && ((m < 0) != (q < 0))) m += q;
            *out = jj_float(op == OP_MOD ? m : floor(p / q));
        }
        return 0;
    case OP_POW:
        if (!is_num(x) || !is_num(y)) return unsupported(r, at, "**", x, y);
        if (is_intlike(x) && is_intlike(y) && ival(y) >= 0) {
            int64_t base = ival(x), e = ival(y), acc = 1;
            int ovf = 0;
            for (int64_t i = 0; i < e && !ovf; i++) {
                ovf = __builtin_mul_overflow(acc, base, &acc);
                if (acc == 0 || acc == 1) break;
                if (acc == -1) { acc = (e - i - 1) % 2 ? -acc : acc; break; }
            }
            return int_result(r, at, ovf, acc, out);
        }
        *out = jj_float(pow(fval(x), fval(y)));
        return 0;
    default:
        return jj_fail(r, at, "unknown operator");
    }
}

/* ---- attribute and item access ---------------------------------------------------------------- */
static jj_val missing(jj_render *r, jj_val obj, const char *name) {
    jj_buf b = {0};
    jj_buf_printf(&b, "'%s' has no attribute ", jj_type_name(obj));
    jj_write_repr(&b, jj_strv(name, strlen(name))); /* as jinja2 words it: the name's repr(), escaped */
    int f = b.failed;
    jj_str m = jj_str_dup(r->a, b.p ? b.p : "", b.n < 200 ? b.n : 200, &f);
    jj_buf_free(&b);
    return jj_undef(f ? "value is undefined" : m.p);
}

static int method(jj_render *r, jj_val self, const char *name, jj_val *out) {
    jj_method *m = jj_alloc(r->a, sizeof *m);
    if (!m) return jj_oom(r);
    m->self = self;
    m->name = name;
    out->t = JJ_METHOD;
    out->u.method = m;
    return 0;
}

static int loop_attr(jj_render *r, const jj_loop *lp, const char *name, jj_val *out) {
    size_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index")) *out = jj_int((int64_t)i + 1);
    else if (!strcmp(name, "index0")) *out = jj_int((int64_t)i);
    else if (!strcmp(name, "revindex")) *out = jj_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0")) *out = jj_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first")) *out = jj_bool(i == 0);
    else if (!strcmp(name, "last")) *out = jj_bool(i + 1 == n);
    else if (!strcmp(name, "length")) *out = jj_int((int64_t)n);
    else if (!strcmp(name, "depth")) *out = jj_int(1);
    else if (!strcmp(name, "depth0")) *out = jj_int(0);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : jj_undef("there is no previous item");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1] : jj_undef("there is no next item");
    else return 1;
    return 0;
}

int jj_getattr(jj_render *r, const jj_node *at, jj_val obj, const char *name, jj_val *out) {
    switch (obj.t) {
    case JJ_UNDEF: return jj_fail(r, at, "%s", obj.u.undef);
    case JJ_DICT: {
        if (jj_method_exists(obj, name)) return method(r, obj, name, out);
        jj_val *v = jj_dict_gets(obj.u.dict, name);
        *out = v ? *v : missing(r, obj, name);
        return 0;
    }
    case JJ_NS: {
        jj_val *v = jj_dict_gets(obj.u.dict, name);
        *out = v ? *v : missing(r, obj, name);
        return 0;
    }
    case JJ_LOOP:
        if (!strcmp(name, "cycle")) return method(r, obj, name, out);
        if (loop_attr(r, obj.u.loop, name, out)) *out = missing(r, obj, name);
        return 0;
    default:
        if (jj_method_exists(obj, name)) return method(r, obj, name, out);
        *out = missing(r, obj, name);
        return 0;
    }
}

/* Byte offsets of the code points of s (n + 1 entries, the last one s.n). */
static size_t *cp_offsets(jj_render *r, jj_str s, size_t *n) {
    size_t *off = jj_alloc(r->a, (s.n + 1) * sizeof *off), k = 0;
    if (!off) return NULL;
    for (size_t i = 0; i < s.n;) {
        int32_t cp;
        off[k++] = i;
        i = jj_utf8_next(s.p, s.n, i, &cp);
    }
    off[k] = s.n;
    *n = k;
    return off;
}

int jj_getitem(jj_render *r, const jj_node *at, jj_val obj, jj_val key, jj_val *out) {
    char tmp[64];
    if (obj.t == JJ_UNDEF) return jj_fail(r, at, "%s", obj.u.undef);
    if (obj.t == JJ_DICT) {
        jj_val *v = jj_dict_get(obj.u.dict, key);
        if (v) { *out = *v; return 0; }
    } else if ((obj.t == JJ_LIST || obj.t == JJ_STR) && is_intlike(key)) {
        size_t n, *off = NULL;
        if (obj.t == JJ_LIST) n = obj.u.list->n;
        else if (!(off = cp_offsets(r, obj.u.s, &n))) return jj_oom(r);
        int64_t i = ival(key);
        if (i < 0) i += (int64_t)n;
        if (i >= 0 && (uint64_t)i < n) {
            if (obj.t == JJ_LIST) *out = obj.u.list->v[i];
            else *out = jj_strv(obj.u.s.p + off[i], off[i + 1] - off[i]);
            return 0;
        }
        snprintf(tmp, sizeof tmp, "'%s' has no element %lld", jj_type_name(obj), (long long)ival(key));
        int f = 0;
        jj_str m = jj_str_dup(r->a, tmp, strlen(tmp), &f);
        *out = jj_undef(f ? "index out of range" : m.p);
        return 0;
    }
    if (key.t == JJ_STR) {
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)key.u.s.n, key.u.s.p);
        int f = 0;
        jj_str nm = jj_str_dup(r->a, name, strlen(name), &f);
        if (f) return jj_oom(r);
        return jj_getattr(r, at, obj, nm.p, out);
    }
    jj_buf b = {0};
    jj_write_repr(&b, key);
    *out = missing(r, obj, b.p ? b.p : "");
    jj_buf_free(&b);
    return 0;
}

static int64_t clamp_index(jj_val v, int64_t n, int64_t step, int is_start) {
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? n : n - 1;
    if (v.t == JJ_NONE) return (step < 0) == is_start ? upper : lower;
    int64_t i = ival(v);
    if (i < 0) {
        i += n;
        if (i < lower) i = lower;
    } else if (i > upper) i = upper;
    return i;
}

int jj_slice(jj_render *r, const jj_node *at, jj_val obj, jj_val start, jj_val stop, jj_val step,
             jj_val *out) {
    if (obj.t == JJ_UNDEF) return jj_fail(r, at, "%s", obj.u.undef);
    if (obj.t != JJ_LIST && obj.t != JJ_STR)
        return jj_fail(r, at, "'%s' is not subscriptable", jj_type_name(obj));
    jj_val parts[3] = {start, stop, step};
    for (int k = 0; k < 3; k++)
        if (parts[k].t != JJ_NONE && !is_intlike(parts[k]))
            return jj_fail(r, at, "slice indices must be integers or None");
    int64_t st = step.t == JJ_NONE ? 1 : ival(step);
    if (st == 0) return jj_fail(r, at, "slice step cannot be zero");
    size_t n, *off = NULL;
    if (obj.t == JJ_LIST) n = obj.u.list->n;
    else if (!(off = cp_offsets(r, obj.u.s, &n))) return jj_oom(r);
    int64_t b = clamp_index(start, (int64_t)n, st, 1), e = clamp_index(stop, (int64_t)n, st, 0);
    if (obj.t == JJ_LIST) {
        jj_list *l = jj_list_new(r->a, 0);
        if (!l) return jj_oom(r);
        l->tuple = obj.u.list->tuple;
        for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
            if (jj_list_push(r->a, l, obj.u.list->v[i])) return jj_oom(r);
        out->t = JJ_LIST;
        out->u.list = l;
        return 0;
    }
    jj_buf buf = {0};
    for (int64_t i = b; st > 0 ? i < e : i > e; i += st)
        jj_buf_put(&buf, obj.u.s.p + off[i], off[i + 1] - off[i]);
    int f = buf.failed;
    jj_str s = jj_str_dup(r->a, buf.p ? buf.p : "", buf.n, &f);
    jj_buf_free(&buf);
    if (f) return jj_oom(r);
    *out = jj_strv(s.p, s.n);
    return 0;
}
