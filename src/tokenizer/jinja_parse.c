/* jinja_parse.c - recursive-descent parser from Jinja tokens to the syntax tree (jinja_internal.h).
 *
 * Expression precedence follows jinja2's parser, loosest first:
 *   a if c else b  <  or  <  and  <  not  <  comparisons, in, not in (chainable)
 *   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  filters |f, tests `is`, calls
 *   <  postfix .attr [key] [a:b:c] (call)  <  literals, names, (...), [...], {...}
 * Statements: if/elif/else, for (with `if` filter and else), set (name, a, b, ns.attr, block
 * form), macro, break, continue, raw (in the lexer), generation (transformers' tag). */
#include <string.h>

#include "jinja_internal.h"

typedef struct parser {
    jj_arena *a;
    const jj_tok *t;
    size_t n, i;
    lmx_err *err;
    int depth;
} parser;

typedef struct nodevec {
    jj_node **v;
    int n, cap;
} nodevec;

typedef struct namevec {
    const char **v;
    int n, cap;
} namevec;

static const jj_tok *cur(parser *P) { return &P->t[P->i < P->n ? P->i : P->n - 1]; }
static const jj_tok *peek(parser *P, size_t k) {
    return &P->t[P->i + k < P->n ? P->i + k : P->n - 1];
}
static void next(parser *P) { if (P->i + 1 < P->n) P->i++; }

static int tok_is(const jj_tok *t, jj_tok_type type, const char *s) {
    if (t->type != type) return 0;
    size_t n = strlen(s);
    return t->s.n == n && !memcmp(t->s.p, s, n);
}
static int is_op(parser *P, const char *s) { return tok_is(cur(P), JT_OP, s); }
static int is_name(parser *P, const char *s) { return tok_is(cur(P), JT_NAME, s); }

static const char *describe(const jj_tok *t) {
    switch (t->type) {
    case JT_DATA: return "template text";
    case JT_VAR_BEGIN: return "'{{'";
    case JT_VAR_END: return "'}}'";
    case JT_BLOCK_BEGIN: return "'{%'";
    case JT_BLOCK_END: return "'%}'";
    case JT_STRING: return "a string";
    case JT_INT: case JT_FLOAT: return "a number";
    case JT_EOF: return "end of template";
    default: return NULL;
    }
}

static void *fail(parser *P, const char *what) {
    if (P->err->status != LMX_OK) return NULL;   /* keep the first message */
    const jj_tok *t = cur(P);
    const char *d = describe(t);
    if (d)
        lmx_err_set(P->err, LMX_ERR_FORMAT, "template syntax error at line %d, column %d: %s, got %s",
                    t->line, t->col, what, d);
    else
        lmx_err_set(P->err, LMX_ERR_FORMAT, "template syntax error at line %d, column %d: %s, got %s", t->line,
                    t->col, what, LMX_QUOTED_N(t->s.p, t->s.n));
    return NULL;
}

static void *oom(parser *P) {
    lmx_err_set(P->err, LMX_ERR_NOMEM, "out of memory parsing a template");
    return NULL;
}

static jj_node *node(parser *P, jj_kind kind, const jj_tok *at) {
    jj_node *e = jj_alloc(P->a, sizeof *e);
    if (!e) return oom(P);
    e->kind = kind;
    e->line = at->line;
    e->col = at->col;
    return e;
}

static int push(parser *P, nodevec *v, jj_node *e) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        jj_node **nv = jj_alloc(P->a, (size_t)cap * sizeof *nv);
        if (!nv) return oom(P), -1;
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = e;
    return 0;
}

static int push_name(parser *P, namevec *v, const char *s) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        const char **nv = jj_alloc(P->a, (size_t)cap * sizeof *nv);
        if (!nv) return oom(P), -1;
        if (v->n) memcpy(nv, v->v, (size_t)v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = s;
    return 0;
}

static const char *tok_name(parser *P, const jj_tok *t) {
    int f = 0;
    jj_str s = jj_str_dup(P->a, t->s.p, t->s.n, &f);
    return f ? oom(P) : s.p;
}

static const char *expect_name(parser *P, const char *what) {
    if (cur(P)->type != JT_NAME) return fail(P, what);
    const char *s = tok_name(P, cur(P));
    next(P);
    return s;
}

static int expect_op(parser *P, const char *op) {
    if (is_op(P, op)) { next(P); return 0; }
    char what[32];
    strcpy(what, "expected '");
    strcat(what, op);
    strcat(what, "'");
    fail(P, what);
    return -1;
}

static int expect_block_end(parser *P) {
    if (cur(P)->type == JT_BLOCK_END) { next(P); return 0; }
    fail(P, "expected end of statement block '%}'");
    return -1;
}

static jj_node *parse_expr(parser *P, int with_cond);
static jj_node *parse_unary(parser *P, int with_filter);

static jj_node *binary(parser *P, jj_kind kind, int op, const jj_tok *at, jj_node *x, jj_node *y) {
    if (!x || !y) return NULL;
    jj_node *e = node(P, kind, at);
    if (!e) return NULL;
    e->op = op;
    e->a = x;
    e->b = y;
    return e;
}

/* Arguments of a call, filter or test: "(" [expr | name=expr] {"," ...} ")" */
static int parse_args(parser *P, jj_node *e) {
    if (expect_op(P, "(")) return -1;
    nodevec args = {0};
    namevec kws = {0};
    while (!is_op(P, ")")) {
        if (args.n && expect_op(P, ",")) return -1;
        if (is_op(P, ")")) break;
        const char *kw = NULL;
        if (cur(P)->type == JT_NAME && tok_is(peek(P, 1), JT_OP, "=")) {
            kw = tok_name(P, cur(P));
            if (!kw) return -1;
            next(P);
            next(P);
        } else if (is_op(P, "*") || is_op(P, "**")) {
            fail(P, "*args and **kwargs are not supported");
            return -1;
        }
        jj_node *v = parse_expr(P, 1);
        if (!v || push(P, &args, v) || push_name(P, &kws, kw)) return -1;
    }
    next(P);
    e->items = args.v;
    e->n_items = args.n;
    e->names = kws.v;
    e->n_names = kws.n;
    return 0;
}

/* [a] or [a:b:c] after the '[' */
static jj_node *parse_subscript(parser *P, jj_node *obj, const jj_tok *at) {
    jj_node *start = NULL, *stop = NULL, *step = NULL;
    if (!is_op(P, ":")) {
        start = parse_expr(P, 1);
        if (!start) return NULL;
        if (!is_op(P, ":")) {
            if (expect_op(P, "]")) return NULL;
            jj_node *e = node(P, E_ITEM, at);
            if (!e) return NULL;
            e->a = obj;
            e->b = start;
            return e;
        }
    }
    next(P);   /* ':' */
    if (!is_op(P, "]") && !is_op(P, ":")) {
        if (!(stop = parse_expr(P, 1))) return NULL;
    }
    if (is_op(P, ":")) {
        next(P);
        if (!is_op(P, "]") && !(step = parse_expr(P, 1))) return NULL;
    }
    if (expect_op(P, "]")) return NULL;
    jj_node *e = node(P, E_SLICE, at);
    if (!e) return NULL;
    e->a = obj;
    e->b = start;
    e->c = stop;
    e->d = step;
    return e;
}

static jj_node *parse_postfix(parser *P, jj_node *e) {
    while (e) {
        const jj_tok *at = cur(P);
        if (is_op(P, ".")) {
            next(P);
            if (cur(P)->type == JT_NAME) {
                jj_node *x = node(P, E_ATTR, at);
                if (!x) return NULL;
                x->a = e;
                if (!(x->name = tok_name(P, cur(P)))) return NULL;
                next(P);
                e = x;
            } else if (cur(P)->type == JT_INT) {
                jj_node *x = node(P, E_ITEM, at), *k = node(P, E_LIT, at);
                if (!x || !k) return NULL;
                k->lit = jj_int(cur(P)->i);
                x->a = e;
                x->b = k;
                next(P);
                e = x;
            } else return fail(P, "expected a name after '.'");
        } else if (is_op(P, "[")) {
            next(P);
            e = parse_subscript(P, e, at);
        } else if (is_op(P, "(")) {
            jj_node *x = node(P, E_CALL, at);
            if (!x) return NULL;
            x->a = e;
            if (parse_args(P, x)) return NULL;
            e = x;
        } else break;
    }
    return e;
}

/* (a, b), [a, b], {k: v} after the opening bracket; close is the closing bracket */
static jj_node *parse_seq(parser *P, const jj_tok *at, const char *close, int dict) {
    jj_node *e = node(P, dict ? E_DICT : E_LIST, at);
    if (!e) return NULL;
    nodevec keys = {0}, vals = {0};
    while (!is_op(P, close)) {
        if (vals.n && expect_op(P, ",")) return NULL;
        if (is_op(P, close)) break;
        jj_node *k = parse_expr(P, 1);
        if (!k) return NULL;
        if (dict) {
            if (expect_op(P, ":")) return NULL;
            jj_node *v = parse_expr(P, 1);
            if (!v || push(P, &keys, k) || push(P, &vals, v)) return NULL;
        } else if (push(P, &vals, k)) return NULL;
    }
    next(P);
    if (dict) {
        e->items = keys.v;
        e->items2 = vals.v;
        e->n_items2 = vals.n;
    } else e->items = vals.v;
    e->n_items = vals.n;
    return e;
}

static jj_node *parse_primary(parser *P) {
    const jj_tok *t = cur(P);
    jj_node *e;
    switch (t->type) {
    case JT_NAME:
        if (!(e = node(P, E_LIT, t))) return NULL;
        if (tok_is(t, JT_NAME, "true") || tok_is(t, JT_NAME, "True")) e->lit = jj_bool(1);
        else if (tok_is(t, JT_NAME, "false") || tok_is(t, JT_NAME, "False")) e->lit = jj_bool(0);
        else if (tok_is(t, JT_NAME, "none") || tok_is(t, JT_NAME, "None")) e->lit = jj_none();
        else {
            e->kind = E_NAME;
            if (!(e->name = tok_name(P, t))) return NULL;
        }
        next(P);
        return e;
    case JT_STRING: {
        if (!(e = node(P, E_LIT, t))) return NULL;
        jj_buf b = {0};
        while (cur(P)->type == JT_STRING) {   /* adjacent literals concatenate */
            jj_buf_put(&b, cur(P)->s.p, cur(P)->s.n);
            next(P);
        }
        int f = b.failed;
        jj_str s = jj_str_dup(P->a, b.p ? b.p : "", b.n, &f);
        jj_buf_free(&b);
        if (f) return oom(P);
        e->lit = jj_strv(s.p, s.n);
        return e;
    }
    case JT_INT: case JT_FLOAT:
        if (!(e = node(P, E_LIT, t))) return NULL;
        e->lit = t->type == JT_INT ? jj_int(t->i) : jj_float(t->f);
        next(P);
        return e;
    case JT_OP:
        if (is_op(P, "(")) {
            next(P);
            if (is_op(P, ")")) {   /* () is an empty tuple */
                next(P);
                jj_node *tup = node(P, E_LIST, t);
                if (tup) tup->flag = 1;
                return tup;
            }
            jj_node *x = parse_expr(P, 1);
            if (!x) return NULL;
            if (is_op(P, ")")) { next(P); return x; }
            if (!is_op(P, ",")) return fail(P, "expected ')' or ','");
            next(P);
            jj_node *tup = parse_seq(P, t, ")", 0);
            if (!tup) return NULL;
            /* put x in front */
            jj_node **v = jj_alloc(P->a, (size_t)(tup->n_items + 1) * sizeof *v);
            if (!v) return oom(P);
            v[0] = x;
            if (tup->n_items) memcpy(v + 1, tup->items, (size_t)tup->n_items * sizeof *v);
            tup->items = v;
            tup->n_items++;
            tup->flag = 1;
            return tup;
        }
        if (is_op(P, "[")) { next(P); return parse_seq(P, t, "]", 0); }
        if (is_op(P, "{")) { next(P); return parse_seq(P, t, "}", 1); }
        return fail(P, "unexpected operator");
    default:
        return fail(P, "expected an expression");
    }
}

/* |name(args), is [not] name(args), (args) after an operand */
static jj_node *parse_filters(parser *P, jj_node *e) {
    while (e) {
        const jj_tok *at = cur(P);
        if (is_op(P, "|")) {
            next(P);
            jj_node *f = node(P, E_FILTER, at);
            if (!f || !(f->name = expect_name(P, "expected a filter name"))) return NULL;
            f->a = e;
            if (is_op(P, "(") && parse_args(P, f)) return NULL;
            e = f;
        } else if (is_name(P, "is")) {
            next(P);
            jj_node *f = node(P, E_TEST, at);
            if (!f) return NULL;
            if (is_name(P, "not")) { f->flag = 1; next(P); }
            if (!(f->name = expect_name(P, "expected a test name"))) return NULL;
            f->a = e;
            const jj_tok *t = cur(P);
            if (is_op(P, "(")) {
                if (parse_args(P, f)) return NULL;
            } else if ((t->type == JT_NAME || t->type == JT_STRING || t->type == JT_INT ||
                        t->type == JT_FLOAT || is_op(P, "[") || is_op(P, "{")) &&
                       !is_name(P, "else") && !is_name(P, "or") && !is_name(P, "and") &&
                       !is_name(P, "if") && !is_name(P, "in") && !is_name(P, "not") &&
                       !is_name(P, "is")) {
                jj_node *arg = parse_postfix(P, parse_primary(P));
                if (!arg) return NULL;
                f->items = jj_alloc(P->a, sizeof *f->items);
                f->names = jj_alloc(P->a, sizeof *f->names);
                if (!f->items || !f->names) return oom(P);
                f->items[0] = arg;
                f->n_items = f->n_names = 1;
            }
            e = f;
        } else if (is_op(P, "(")) {
            jj_node *x = node(P, E_CALL, at);
            if (!x) return NULL;
            x->a = e;
            if (parse_args(P, x)) return NULL;
            e = x;
        } else break;
    }
    return e;
}

static jj_node *parse_unary(parser *P, int with_filter) {
    if (++P->depth > JJ_MAX_DEPTH) return fail(P, "expression nested too deeply");
    const jj_tok *at = cur(P);
    jj_node *e;
    if (is_op(P, "-") || is_op(P, "+")) {
        int op = is_op(P, "-") ? OP_NEG : OP_POS;
        next(P);
        jj_node *x = parse_unary(P, 0);
        if (!x || !(e = node(P, E_UNARY, at))) return NULL;
        e->op = op;
        e->a = x;
    } else e = parse_primary(P);
    e = parse_postfix(P, e);
    if (with_filter) e = parse_filters(P, e);
    P->depth--;
    return e;
}

static jj_node *parse_pow(parser *P) {
    jj_node *e = parse_unary(P, 1);
    while (e && is_op(P, "**")) {
        const jj_tok *at = cur(P);
        next(P);
        e = binary(P, E_BIN, OP_POW, at, e, parse_unary(P, 1));
    }
    return e;
}

static jj_node *parse_math2(parser *P) {
    jj_node *e = parse_pow(P);
    for (;;) {
        int op = is_op(P, "*") ? OP_MUL : is_op(P, "/") ? OP_DIV : is_op(P, "//") ? OP_FLOORDIV
               : is_op(P, "%") ? OP_MOD : -1;
        if (!e || op < 0) return e;
        const jj_tok *at = cur(P);
        next(P);
        e = binary(P, E_BIN, op, at, e, parse_pow(P));
    }
}

static jj_node *parse_concat(parser *P) {
    jj_node *e = parse_math2(P);
    while (e && is_op(P, "~")) {
        const jj_tok *at = cur(P);
        next(P);
        e = binary(P, E_BIN, OP_CONCAT, at, e, parse_math2(P));
    }
    return e;
}

static jj_node *parse_math1(parser *P) {
    jj_node *e = parse_concat(P);
    while (e && (is_op(P, "+") || is_op(P, "-"))) {
        const jj_tok *at = cur(P);
        int op = is_op(P, "+") ? OP_ADD : OP_SUB;
        next(P);
        e = binary(P, E_BIN, op, at, e, parse_concat(P));
    }
    return e;
}

static jj_node *parse_compare(parser *P) {
    jj_node *first = parse_math1(P), *last = first, *res = NULL;
    while (first) {
        const jj_tok *at = cur(P);
        int op = is_op(P, "==") ? OP_EQ : is_op(P, "!=") ? OP_NE : is_op(P, "<") ? OP_LT
               : is_op(P, "<=") ? OP_LE : is_op(P, ">") ? OP_GT : is_op(P, ">=") ? OP_GE
               : is_name(P, "in") ? OP_IN : -1;
        if (op < 0 && is_name(P, "not") && tok_is(peek(P, 1), JT_NAME, "in")) {
            op = OP_NOTIN;
            next(P);
        }
        if (op < 0) break;
        next(P);
        jj_node *r = parse_math1(P);
        jj_node *cmp = binary(P, E_BIN, op, at, last, r);
        if (!cmp) return NULL;
        res = res ? binary(P, E_AND, 0, at, res, cmp) : cmp;   /* a < b < c: a < b and b < c */
        last = r;
    }
    return res ? res : first;
}

static jj_node *parse_not(parser *P) {
    if (is_name(P, "not")) {
        if (++P->depth > JJ_MAX_DEPTH) return fail(P, "expression nested too deeply");
        const jj_tok *at = cur(P);
        next(P);
        jj_node *x = parse_not(P), *e;
        if (!x || !(e = node(P, E_UNARY, at))) return NULL;
        e->op = OP_NOT;
        e->a = x;
        P->depth--;
        return e;
    }
    return parse_compare(P);
}

static jj_node *parse_and(parser *P) {
    jj_node *e = parse_not(P);
    while (e && is_name(P, "and")) {
        const jj_tok *at = cur(P);
        next(P);
        e = binary(P, E_AND, 0, at, e, parse_not(P));
    }
    return e;
}

static jj_node *parse_or(parser *P) {
    jj_node *e = parse_and(P);
    while (e && is_name(P, "or")) {
        const jj_tok *at = cur(P);
        next(P);
        e = binary(P, E_OR, 0, at, e, parse_and(P));
    }
    return e;
}

static jj_node *parse_expr(parser *P, int with_cond) {
    if (++P->depth > JJ_MAX_DEPTH) return fail(P, "expression nested too deeply");
    jj_node *e = parse_or(P);
    while (with_cond && e && is_name(P, "if")) {
        const jj_tok *at = cur(P);
        next(P);
        jj_node *c = node(P, E_COND, at);
        if (!c || !(c->b = parse_or(P))) return NULL;
        c->a = e;
        if (is_name(P, "else")) {
            next(P);
            if (!(c->c = parse_expr(P, 1))) return NULL;
        }
        e = c;
    }
    P->depth--;
    return e;
}

/* An expression or an unparenthesised tuple (a, b) as in `set x = a, b` and `for x in a, b`. */
static jj_node *parse_tuple(parser *P, int with_cond) {
    const jj_tok *at = cur(P);
    jj_node *e = parse_expr(P, with_cond);
    if (!e || !is_op(P, ",")) return e;
    nodevec v = {0};
    if (push(P, &v, e)) return NULL;
    while (is_op(P, ",")) {
        next(P);
        if (cur(P)->type == JT_BLOCK_END || cur(P)->type == JT_VAR_END || is_name(P, "if")) break;
        jj_node *x = parse_expr(P, with_cond);
        if (!x || push(P, &v, x)) return NULL;
    }
    jj_node *t = node(P, E_LIST, at);
    if (!t) return NULL;
    t->flag = 1;
    t->items = v.v;
    t->n_items = v.n;
    return t;
}

/* ---- statements ------------------------------------------------------------------------------ */
static int parse_body(parser *P, const char *const *ends, nodevec *out);

/* The body of a block up to one of ends; leaves the end tag's name as the current token. */
static int body_until(parser *P, const char *const *ends, jj_node ***items, int *n) {
    nodevec v = {0};
    if (parse_body(P, ends, &v)) return -1;
    *items = v.v;
    *n = v.n;
    return 0;
}

static jj_node *parse_if(parser *P, const jj_tok *at) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    jj_node *e = node(P, S_IF, at);
    if (!e || !(e->a = parse_tuple(P, 1)) || expect_block_end(P)) return NULL;
    if (body_until(P, ends, &e->items, &e->n_items)) return NULL;
    const jj_tok *t = cur(P);
    next(P);
    if (tok_is(t, JT_NAME, "elif")) {
        jj_node *x = parse_if(P, t);
        if (!x) return NULL;
        e->items2 = jj_alloc(P->a, sizeof *e->items2);
        if (!e->items2) return oom(P);
        e->items2[0] = x;
        e->n_items2 = 1;
        return e;   /* the nested if consumed endif */
    }
    if (tok_is(t, JT_NAME, "else")) {
        static const char *const end[] = {"endif", NULL};
        if (expect_block_end(P) || body_until(P, end, &e->items2, &e->n_items2)) return NULL;
        next(P);
    }
    return expect_block_end(P) ? NULL : e;
}

static jj_node *parse_for(parser *P, const jj_tok *at) {
    static const char *const ends[] = {"else", "endfor", NULL};
    jj_node *e = node(P, S_FOR, at);
    if (!e) return NULL;
    namevec names = {0};
    int paren = is_op(P, "(");
    if (paren) next(P);
    do {
        if (names.n) next(P);
        const char *s = expect_name(P, "expected a loop variable name");
        if (!s || push_name(P, &names, s)) return NULL;
    } while (is_op(P, ","));
    if (paren && expect_op(P, ")")) return NULL;
    e->names = names.v;
    e->n_names = names.n;
    if (!is_name(P, "in")) return fail(P, "expected 'in'");
    next(P);
    if (!(e->a = parse_tuple(P, 0))) return NULL;
    if (is_name(P, "if")) {
        next(P);
        if (!(e->b = parse_expr(P, 1))) return NULL;
    }
    if (is_name(P, "recursive")) return fail(P, "recursive loops are not supported");
    if (expect_block_end(P) || body_until(P, ends, &e->items, &e->n_items)) return NULL;
    const jj_tok *t = cur(P);
    next(P);
    if (tok_is(t, JT_NAME, "else")) {
        static const char *const end[] = {"endfor", NULL};
        if (expect_block_end(P) || body_until(P, end, &e->items2, &e->n_items2)) return NULL;
        next(P);
    }
    return expect_block_end(P) ? NULL : e;
}

static jj_node *parse_set(parser *P, const jj_tok *at) {
    jj_node *e = node(P, S_SET, at);
    if (!e) return NULL;
    namevec names = {0};
    do {
        if (names.n) next(P);
        const char *s = expect_name(P, "expected a variable name");
        if (!s || push_name(P, &names, s)) return NULL;
        if (is_op(P, ".")) {
            if (names.n > 1) return fail(P, "cannot mix attribute and tuple assignment");
            next(P);
            if (!(e->attr = expect_name(P, "expected an attribute name"))) return NULL;
            break;
        }
    } while (is_op(P, ","));
    e->names = names.v;
    e->n_names = names.n;
    if (is_op(P, "=")) {
        next(P);
        if (!(e->b = parse_tuple(P, 1))) return NULL;
        return expect_block_end(P) ? NULL : e;
    }
    if (names.n != 1 || e->attr) return fail(P, "expected '='");
    static const char *const end[] = {"endset", NULL};
    if (expect_block_end(P) || body_until(P, end, &e->items, &e->n_items)) return NULL;
    next(P);
    return expect_block_end(P) ? NULL : e;
}

static jj_node *parse_macro(parser *P, const jj_tok *at) {
    jj_node *e = node(P, S_MACRO, at);
    if (!e || !(e->name = expect_name(P, "expected a macro name")) || expect_op(P, "("))
        return NULL;
    namevec names = {0};
    nodevec defs = {0};
    while (!is_op(P, ")")) {
        if (names.n && expect_op(P, ",")) return NULL;
        const char *s = expect_name(P, "expected a parameter name");
        jj_node *d = NULL;
        if (!s) return NULL;
        if (is_op(P, "=")) {
            next(P);
            if (!(d = parse_expr(P, 1))) return NULL;
        }
        if (push_name(P, &names, s) || push(P, &defs, d)) return NULL;
    }
    next(P);
    e->names = names.v;
    e->n_names = names.n;
    e->items2 = defs.v;
    e->n_items2 = defs.n;
    static const char *const end[] = {"endmacro", NULL};
    if (expect_block_end(P) || body_until(P, end, &e->items, &e->n_items)) return NULL;
    next(P);
    return expect_block_end(P) ? NULL : e;
}

static jj_node *parse_statement(parser *P) {
    const jj_tok *at = cur(P);
    if (at->type != JT_NAME) return fail(P, "expected a statement name");
    next(P);
    if (tok_is(at, JT_NAME, "if")) return parse_if(P, at);
    if (tok_is(at, JT_NAME, "for")) return parse_for(P, at);
    if (tok_is(at, JT_NAME, "set")) return parse_set(P, at);
    if (tok_is(at, JT_NAME, "macro")) return parse_macro(P, at);
    if (tok_is(at, JT_NAME, "break") || tok_is(at, JT_NAME, "continue")) {
        jj_node *e = node(P, tok_is(at, JT_NAME, "break") ? S_BREAK : S_CONTINUE, at);
        return !e || expect_block_end(P) ? NULL : e;
    }
    if (tok_is(at, JT_NAME, "generation")) {
        static const char *const end[] = {"endgeneration", NULL};
        jj_node *e = node(P, S_BLOCK, at);
        if (!e || expect_block_end(P) || body_until(P, end, &e->items, &e->n_items)) return NULL;
        next(P);
        return expect_block_end(P) ? NULL : e;
    }
    P->i--;
    return fail(P, "unknown or unexpected tag");
}

static int parse_body(parser *P, const char *const *ends, nodevec *out) {
    if (++P->depth > JJ_MAX_DEPTH) return fail(P, "blocks nested too deeply"), -1;
    for (;;) {
        const jj_tok *t = cur(P);
        jj_node *e = NULL;
        if (t->type == JT_EOF) {
            if (ends && ends[0]) {
                int k = 0;
                while (ends[k + 1]) k++;   /* name the closing tag: endif, endfor, ... */
                char what[96];
                strcpy(what, "unexpected end of template, expected '");
                strcat(what, ends[k]);
                strcat(what, "'");
                fail(P, what);
                return -1;
            }
            break;
        }
        if (t->type == JT_DATA) {
            if (!(e = node(P, S_TEXT, t))) return -1;
            e->lit = jj_strv(t->s.p, t->s.n);
            next(P);
        } else if (t->type == JT_VAR_BEGIN) {
            next(P);
            if (!(e = node(P, S_OUT, t)) || !(e->a = parse_tuple(P, 1))) return -1;
            if (cur(P)->type != JT_VAR_END) return fail(P, "expected end of print statement '}}'"), -1;
            next(P);
        } else if (t->type == JT_BLOCK_BEGIN) {
            next(P);
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(P, ends[k])) { P->depth--; return 0; }
            if (!(e = parse_statement(P))) return -1;
        } else return fail(P, "unexpected token"), -1;
        if (push(P, out, e)) return -1;
    }
    P->depth--;
    return 0;
}

int jj_parse(jj_arena *a, const jj_tok *toks, size_t n_toks, jj_node **root, lmx_err *err) {
    parser P = {.a = a, .t = toks, .n = n_toks, .err = err};
    lmx_err_clear(err);
    *root = NULL;
    jj_node *r = node(&P, S_BLOCK, &toks[0]);
    nodevec v = {0};
    if (!r || parse_body(&P, NULL, &v)) {
        if (err->status == LMX_OK) lmx_err_set(err, LMX_ERR_FORMAT, "template syntax error");
        return -1;
    }
    r->items = v.v;
    r->n_items = v.n;
    *root = r;
    return 0;
}
