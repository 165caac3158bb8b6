/* jinja_eval.c - the Jinja evaluator: statements (output, if, for with loop variables, set,
 * namespaces, macros, break/continue), expressions, scopes and the global functions of
 * transformers' environment (range, namespace, dict, raise_exception, strftime_now).
 *
 * Scopes follow jinja2: each for-loop iteration and each macro call gets a fresh scope, so a
 * `set` inside a loop does not leak out of it (namespace attributes are how state crosses). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "jinja_internal.h"

int jj_fail(jj_render *r, const jj_node *at, const char *fmt, ...) {
    if (r->err->status != LMX_OK) return -1;   /* keep the first message */
    char msg[LMX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at) lmx_err_set(r->err, LMX_ERR_INVALID_ARG, "template error at line %d: %s", at->line, msg);
    else lmx_err_set(r->err, LMX_ERR_INVALID_ARG, "template error: %s", msg);
    return -1;
}

int jj_oom(jj_render *r) {
    if (r->err->status == LMX_OK)
        lmx_err_set(r->err, LMX_ERR_NOMEM, "template rendering ran out of memory (limit %zu MiB)",
                    (size_t)(JJ_MAX_ARENA >> 20));
    return -1;
}

static int step(jj_render *r, const jj_node *at) {
    if (++r->steps > JJ_MAX_STEPS)
        return jj_fail(r, at, "evaluation exceeded %lld steps (runaway loop?)", JJ_MAX_STEPS);
    return 0;
}

int jj_to_str(jj_render *r, jj_val v, jj_str *out) {
    if (v.t == JJ_STR) {
        *out = v.u.s;
        return 0;
    }
    jj_buf b = {0};
    jj_write_str(&b, v);
    int fail = b.failed;
    *out = jj_str_dup(r->a, b.p ? b.p : "", b.n, &fail);
    jj_buf_free(&b);
    return fail ? jj_oom(r) : 0;
}

/* A message in the arena ("'x' is undefined"); falls back to a static one. */
static const char *amsg(jj_render *r, const char *fmt, const char *s) {
    char tmp[256];
    snprintf(tmp, sizeof tmp, fmt, s);
    int f = 0;
    jj_str m = jj_str_dup(r->a, tmp, strlen(tmp), &f);
    return f ? "value is undefined" : m.p;
}

/* ---- scopes ----------------------------------------------------------------------------------- */
static jj_scope *scope_push(jj_render *r, jj_scope *parent) {
    jj_scope *s = jj_alloc(r->a, sizeof *s);
    if (!s || !(s->vars = jj_dict_new(r->a, 0))) return NULL;
    s->parent = parent;
    return s;
}

static int scope_set(jj_render *r, jj_scope *s, const char *name, jj_val v) {
    return jj_dict_set(r->a, s->vars, jj_cstr(name), v) ? jj_oom(r) : 0;
}

static const char *const FUNCS[JJ_FN_COUNT] = {"range", "namespace", "raise_exception", "dict",
                                               "strftime_now"};

static jj_val lookup(jj_render *r, const char *name) {
    for (jj_scope *s = r->cur; s; s = s->parent) {
        jj_val *v = jj_dict_gets(s->vars, name);
        if (v) return *v;
    }
    for (int k = 0; k < JJ_FN_COUNT; k++)
        if (!strcmp(name, FUNCS[k])) {
            jj_val f = {.t = JJ_FUNC};
            f.u.func = k;
            return f;
        }
    return jj_undef(amsg(r, "'%s' is undefined", name));
}

/* ---- iteration -------------------------------------------------------------------------------- */
int jj_iterate(jj_render *r, const jj_node *at, jj_val v, jj_list **out) {
    jj_list *l;
    switch (v.t) {
    case JJ_LIST: *out = v.u.list; return 0;
    case JJ_UNDEF: case JJ_NONE:
        if (v.t == JJ_NONE) return jj_fail(r, at, "'NoneType' object is not iterable");
        if (!(*out = jj_list_new(r->a, 0))) return jj_oom(r);
        return 0;
    case JJ_DICT:
        if (!(l = jj_list_new(r->a, v.u.dict->n))) return jj_oom(r);
        for (size_t i = 0; i < v.u.dict->n; i++) jj_list_push(r->a, l, v.u.dict->k[i]);
        *out = l;
        return 0;
    case JJ_STR:
        if (!(l = jj_list_new(r->a, v.u.s.n))) return jj_oom(r);
        for (size_t i = 0; i < v.u.s.n;) {
            int32_t cp;
            size_t j = jj_utf8_next(v.u.s.p, v.u.s.n, i, &cp);
            jj_list_push(r->a, l, jj_strv(v.u.s.p + i, j - i));
            i = j;
        }
        *out = l;
        return 0;
    default:
        return jj_fail(r, at, "%s is not iterable", jj_type_name(v));
    }
}

static int bind_targets(jj_render *r, const jj_node *at, jj_scope *s, const char *const *names,
                        int n, jj_val item) {
    if (n == 1) return scope_set(r, s, names[0], item);
    jj_list *l;
    if (item.t != JJ_LIST) {
        if (jj_iterate(r, at, item, &l)) return -1;
    } else l = item.u.list;
    if ((int)l->n != n)
        return jj_fail(r, at, "cannot unpack %zu values into %d loop variables", l->n, n);
    for (int k = 0; k < n; k++)
        if (scope_set(r, s, names[k], l->v[k])) return -1;
    return 0;
}

/* ---- statements ------------------------------------------------------------------------------- */
static int exec_for(jj_render *r, const jj_node *e) {
    jj_val seq;
    jj_list *items;
    if (jj_eval(r, e->a, &seq) || jj_iterate(r, e->a, seq, &items)) return -1;
    jj_scope *saved = r->cur;
    /* one scope, emptied at each iteration: nothing outlives an iteration but values */
    jj_scope *s = scope_push(r, saved);
    if (!s) return jj_oom(r);
    if (e->b) {   /* for x in xs if cond: filter first, so loop.length counts what is kept */
        jj_list *kept = jj_list_new(r->a, items->n);
        if (!kept) return jj_oom(r);
        for (size_t i = 0; i < items->n; i++) {
            jj_val c;
            s->vars->n = 0;
            if (step(r, e) || bind_targets(r, e, s, e->names, e->n_names, items->v[i])) return -1;
            r->cur = s;
            int rc = jj_eval(r, e->b, &c);
            r->cur = saved;
            if (rc) return -1;
            if (jj_truthy(c) && jj_list_push(r->a, kept, items->v[i])) return jj_oom(r);
        }
        items = kept;
    }
    if (items->n == 0) {
        if (!e->n_items2) return 0;
        s->vars->n = 0;
        r->cur = s;
        int rc = jj_exec_body(r, e->items2, e->n_items2);
        r->cur = saved;
        return rc;
    }
    jj_loop *lp = jj_alloc(r->a, sizeof *lp);
    if (!lp) return jj_oom(r);
    lp->items = items;
    jj_val lv = {.t = JJ_LOOP};
    lv.u.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        s->vars->n = 0;
        lp->i = i;
        if (step(r, e) || bind_targets(r, e, s, e->names, e->n_names, items->v[i]) || scope_set(r, s, "loop", lv))
            return -1;
        r->cur = s;
        int rc = jj_exec_body(r, e->items, e->n_items);
        r->cur = saved;
        if (rc) return -1;
        if (r->ctl == 1) { r->ctl = 0; break; }
        r->ctl = 0;
    }
    return 0;
}

static int exec_set(jj_render *r, const jj_node *e) {
    jj_val v;
    if (e->b) {
        if (jj_eval(r, e->b, &v)) return -1;
    } else {   /* {% set x %}...{% endset %} captures its body */
        jj_buf b = {.limit = JJ_MAX_OUTPUT}, *saved = r->out;
        r->out = &b;
        int rc = jj_exec_body(r, e->items, e->n_items);
        r->out = saved;
        int fail = b.failed;
        jj_str s = jj_str_dup(r->a, b.p ? b.p : "", b.n, &fail);
        jj_buf_free(&b);
        if (rc) return -1;
        if (fail) return jj_oom(r);
        v = jj_strv(s.p, s.n);
    }
    if (e->attr) {
        jj_val ns = lookup(r, e->names[0]);
        if (ns.t != JJ_NS)
            return jj_fail(r, e, "cannot assign attribute on non-namespace object '%s'", e->names[0]);
        return jj_dict_set(r->a, ns.u.dict, jj_cstr(e->attr), v) ? jj_oom(r) : 0;
    }
    return bind_targets(r, e, r->cur, e->names, e->n_names, v);
}

static int exec_one(jj_render *r, const jj_node *e) {
    if (step(r, e)) return -1;
    jj_val v;
    jj_str s;
    switch (e->kind) {
    case S_TEXT:
        jj_buf_put(r->out, e->lit.u.s.p, e->lit.u.s.n);
        break;
    case S_OUT:
        if (jj_eval(r, e->a, &v) || jj_to_str(r, v, &s)) return -1;
        jj_buf_put(r->out, s.p, s.n);
        break;
    case S_IF:
        if (jj_eval(r, e->a, &v)) return -1;
        return jj_truthy(v) ? jj_exec_body(r, e->items, e->n_items)
                            : jj_exec_body(r, e->items2, e->n_items2);
    case S_FOR: return exec_for(r, e);
    case S_SET: return exec_set(r, e);
    case S_MACRO: {
        jj_val m = {.t = JJ_MACRO};
        m.u.macro = e;
        return scope_set(r, r->cur, e->name, m);
    }
    case S_BREAK: r->ctl = 1; break;
    case S_CONTINUE: r->ctl = 2; break;
    case S_BLOCK: return jj_exec_body(r, e->items, e->n_items);
    default: return jj_fail(r, e, "not a statement");
    }
    if (r->out->failed)
        return jj_fail(r, e, "rendered text exceeds %zu MiB or memory ran out",
                       (size_t)(JJ_MAX_OUTPUT >> 20));
    return 0;
}

int jj_exec_body(jj_render *r, jj_node *const *body, int n) {
    if (++r->depth > JJ_MAX_DEPTH) return jj_fail(r, n ? body[0] : NULL, "nesting too deep");
    for (int i = 0; i < n && !r->ctl; i++)
        if (exec_one(r, body[i])) return -1;
    r->depth--;
    return 0;
}

/* ---- calls ------------------------------------------------------------------------------------ */
static int call_macro(jj_render *r, const jj_node *at, const jj_node *m, int n, const jj_val *args,
                      const char *const *kw, jj_val *out) {
    jj_scope *s = scope_push(r, r->root), *saved = r->cur;
    if (!s) return jj_oom(r);
    int pos = 0;
    for (int k = 0; k < n; k++) {
        if (kw && kw[k]) {
            int found = 0;
            for (int p = 0; p < m->n_names; p++)
                if (!strcmp(m->names[p], kw[k])) found = 1;
            if (!found) return jj_fail(r, at, "macro '%s' takes no keyword argument '%s'", m->name, kw[k]);
            if (scope_set(r, s, kw[k], args[k])) return -1;
        } else {
            if (pos >= m->n_names) return jj_fail(r, at, "macro '%s' takes not more than %d argument(s)", m->name, m->n_names);
            if (scope_set(r, s, m->names[pos++], args[k])) return -1;
        }
    }
    r->cur = s;
    for (int p = 0; p < m->n_names; p++) {
        if (jj_dict_gets(s->vars, m->names[p])) continue;
        jj_val d = jj_undef(amsg(r, "parameter '%s' was not provided", m->names[p]));
        if (m->items2[p] && jj_eval(r, m->items2[p], &d)) { r->cur = saved; return -1; }
        if (scope_set(r, s, m->names[p], d)) { r->cur = saved; return -1; }
    }
    jj_buf b = {.limit = JJ_MAX_OUTPUT}, *saved_out = r->out;
    r->out = &b;
    int rc = jj_exec_body(r, m->items, m->n_items);
    r->out = saved_out;
    r->cur = saved;
    r->ctl = 0;
    int fail = b.failed;
    jj_str str = jj_str_dup(r->a, b.p ? b.p : "", b.n, &fail);
    jj_buf_free(&b);
    if (rc) return -1;
    if (fail) return jj_oom(r);
    *out = jj_strv(str.p, str.n);
    return 0;
}

static int as_int(jj_render *r, const jj_node *at, jj_val v, int64_t *out) {
    if (v.t == JJ_INT) *out = v.u.i;
    else if (v.t == JJ_BOOL) *out = v.u.b;
    else return jj_fail(r, at, "'%s' cannot be interpreted as an integer", jj_type_name(v));
    return 0;
}

static int call_func(jj_render *r, const jj_node *at, int fn, int n, const jj_val *args,
                     const char *const *kw, jj_val *out) {
    int npos = 0;
    for (int k = 0; k < n; k++) npos += !(kw && kw[k]);
    if (fn == JJ_FN_RANGE) {
        int64_t a[3] = {0, 0, 1};
        if (npos < 1 || npos > 3 || npos != n) return jj_fail(r, at, "range expects 1 to 3 integers");
        for (int k = 0; k < n; k++)
            if (as_int(r, at, args[k], &a[npos == 1 ? 1 : k])) return -1;
        if (a[2] == 0) return jj_fail(r, at, "range() arg 3 must not be zero");
        jj_list *l = jj_list_new(r->a, 0);
        if (!l) return jj_oom(r);
        for (int64_t x = a[0]; a[2] > 0 ? x < a[1] : x > a[1]; x += a[2]) {
            if (l->n >= JJ_MAX_RANGE) return jj_fail(r, at, "range() longer than %d", JJ_MAX_RANGE);
            if (jj_list_push(r->a, l, jj_int(x))) return jj_oom(r);
        }
        out->t = JJ_LIST;
        out->u.list = l;
        return 0;
    }
    if (fn == JJ_FN_NAMESPACE || fn == JJ_FN_DICT) {
        jj_dict *d = jj_dict_new(r->a, 0);
        if (!d) return jj_oom(r);
        for (int k = 0; k < n; k++) {
            if (kw && kw[k]) {
                if (jj_dict_set(r->a, d, jj_cstr(kw[k]), args[k])) return jj_oom(r);
            } else if (args[k].t == JJ_DICT || args[k].t == JJ_NS) {
                for (size_t i = 0; i < args[k].u.dict->n; i++)
                    if (jj_dict_set(r->a, d, args[k].u.dict->k[i], args[k].u.dict->v[i]))
                        return jj_oom(r);
            } else return jj_fail(r, at, "%s() takes a mapping or keyword arguments", FUNCS[fn]);
        }
        out->t = fn == JJ_FN_NAMESPACE ? JJ_NS : JJ_DICT;
        out->u.dict = d;
        return 0;
    }
    if (fn == JJ_FN_RAISE) {
        jj_str s = {"", 0};
        if (n >= 1 && jj_to_str(r, args[0], &s)) return -1;
        /* The message is the template's own, up to any NUL; an empty one still says what happened. */
        int len = (int)strnlen(s.p, s.n);
        if (r->err->status == LMX_OK) {
            if (len) lmx_err_set(r->err, LMX_ERR_INVALID_ARG, "%.*s", len, s.p);
            else lmx_err_set(r->err, LMX_ERR_INVALID_ARG, "template raised an exception without a message");
        }
        return -1;
    }
    if (fn == JJ_FN_STRFTIME) {
        jj_str f;
        if (n != 1 || args[0].t != JJ_STR) return jj_fail(r, at, "strftime_now expects a format string");
        if (jj_to_str(r, args[0], &f)) return -1;
        char fmt[128], buf[256];
        snprintf(fmt, sizeof fmt, "%.*s", (int)f.n, f.p);
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        size_t k = strftime(buf, sizeof buf, fmt, &tmv);
        int fail = 0;
        jj_str s = jj_str_dup(r->a, buf, k, &fail);
        if (fail) return jj_oom(r);
        *out = jj_strv(s.p, s.n);
        return 0;
    }
    return jj_fail(r, at, "unknown function");
}

int jj_call(jj_render *r, const jj_node *at, jj_val f, int n, const jj_val *args,
            const char *const *kw, jj_val *out) {
    if (++r->depth > JJ_MAX_DEPTH) return jj_fail(r, at, "calls nested too deeply");
    int rc;
    switch (f.t) {
    case JJ_MACRO: rc = call_macro(r, at, f.u.macro, n, args, kw, out); break;
    case JJ_FUNC: rc = call_func(r, at, f.u.func, n, args, kw, out); break;
    case JJ_METHOD: rc = jj_call_method(r, at, f.u.method, n, args, kw, out); break;
    case JJ_UNDEF: rc = jj_fail(r, at, "%s", f.u.undef); break;
    default: rc = jj_fail(r, at, "'%s' is not callable", jj_type_name(f));
    }
    r->depth--;
    return rc;
}

/* ---- expressions ------------------------------------------------------------------------------ */
static int eval_args(jj_render *r, const jj_node *e, jj_val **args) {
    *args = NULL;
    if (!e->n_items) return 0;
    jj_val *v = jj_alloc(r->a, (size_t)e->n_items * sizeof *v);
    if (!v) return jj_oom(r);
    for (int k = 0; k < e->n_items; k++)
        if (jj_eval(r, e->items[k], &v[k])) return -1;
    *args = v;
    return 0;
}

static int eval_inner(jj_render *r, const jj_node *e, jj_val *out) {
    jj_val x, y, z, w, *args;
    switch (e->kind) {
    case E_LIT: *out = e->lit; return 0;
    case E_NAME: *out = lookup(r, e->name); return 0;
    case E_LIST: {
        jj_list *l = jj_list_new(r->a, (size_t)e->n_items);
        if (!l) return jj_oom(r);
        l->tuple = e->flag;
        for (int k = 0; k < e->n_items; k++) {
            if (jj_eval(r, e->items[k], &x)) return -1;
            if (jj_list_push(r->a, l, x)) return jj_oom(r);
        }
        out->t = JJ_LIST;
        out->u.list = l;
        return 0;
    }
    case E_DICT: {
        jj_dict *d = jj_dict_new(r->a, (size_t)e->n_items);
        if (!d) return jj_oom(r);
        for (int k = 0; k < e->n_items; k++) {
            if (jj_eval(r, e->items[k], &x) || jj_eval(r, e->items2[k], &y)) return -1;
            if (jj_dict_set(r->a, d, x, y)) return jj_oom(r);
        }
        out->t = JJ_DICT;
        out->u.dict = d;
        return 0;
    }
    case E_ATTR:
        if (jj_eval(r, e->a, &x)) return -1;
        return jj_getattr(r, e, x, e->name, out);
    case E_ITEM:
        if (jj_eval(r, e->a, &x) || jj_eval(r, e->b, &y)) return -1;
        return jj_getitem(r, e, x, y, out);
    case E_SLICE:
        y = z = w = jj_none();
        if (jj_eval(r, e->a, &x) || (e->b && jj_eval(r, e->b, &y)) ||
            (e->c && jj_eval(r, e->c, &z)) || (e->d && jj_eval(r, e->d, &w)))
            return -1;
        return jj_slice(r, e, x, y, z, w, out);
    case E_CALL:
        if (jj_eval(r, e->a, &x) || eval_args(r, e, &args)) return -1;
        return jj_call(r, e, x, e->n_items, args, e->names, out);
    case E_FILTER:
        if (jj_eval(r, e->a, &x) || eval_args(r, e, &args)) return -1;
        return jj_filter(r, e, e->name, x, e->n_items, args, e->names, out);
    case E_TEST: {
        int t;
        if (jj_eval(r, e->a, &x) || eval_args(r, e, &args)) return -1;
        if (jj_test(r, e, e->name, x, e->n_items, args, &t)) return -1;
        *out = jj_bool(e->flag ? !t : t);
        return 0;
    }
    case E_UNARY:
        if (jj_eval(r, e->a, &x)) return -1;
        if (e->op == OP_NOT) { *out = jj_bool(!jj_truthy(x)); return 0; }
        if (x.t == JJ_BOOL) x = jj_int(x.u.b);
        if (x.t == JJ_UNDEF) return jj_fail(r, e, "%s", x.u.undef);
        if (x.t != JJ_INT && x.t != JJ_FLOAT)
            return jj_fail(r, e, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+",
                           jj_type_name(x));
        if (e->op == OP_NEG) {
            if (x.t == JJ_INT) x.u.i = (int64_t)(0 - (uint64_t)x.u.i);
            else x.u.f = -x.u.f;
        }
        *out = x;
        return 0;
    case E_BIN:
        if (jj_eval(r, e->a, &x) || jj_eval(r, e->b, &y)) return -1;
        return jj_binop(r, e, e->op, x, y, out);
    case E_AND: case E_OR:
        if (jj_eval(r, e->a, &x)) return -1;
        if (jj_truthy(x) == (e->kind == E_OR)) { *out = x; return 0; }
        return jj_eval(r, e->b, out);
    case E_COND:
        if (jj_eval(r, e->b, &x)) return -1;
        if (jj_truthy(x)) return jj_eval(r, e->a, out);
        if (e->c) return jj_eval(r, e->c, out);
        *out = jj_undef("the inline if expression had no else branch");
        return 0;
    default: return jj_fail(r, e, "not an expression");
    }
}

int jj_eval(jj_render *r, const jj_node *e, jj_val *out) {
    if (step(r, e)) return -1;
    if (++r->depth > JJ_MAX_DEPTH) return jj_fail(r, e, "expression nested too deeply");
    int rc = eval_inner(r, e, out);
    r->depth--;
    return rc;
}
