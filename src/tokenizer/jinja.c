/* jinja.c - the Jinja engine's entry points: parse (lex, parse, check filter and test names)
 * and render (variables from cJSON, a per-render arena, output buffer). */
#include "jinja.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

struct lmx_jinja {
    jj_arena arena;   /* every node and literal */
    jj_node *root;
};

/* Unknown filters and tests are errors when the template is parsed, as in jinja2. */
static int check_names(const jj_node *e, lmx_err *err, int depth) {
    if (!e || depth > 4 * JJ_MAX_DEPTH) return 0;
    if (e->kind == E_FILTER && !jj_filter_exists(e->name))
        return lmx_err_set(err, LMX_ERR_FORMAT,
                           "template syntax error at line %d, column %d: no filter named '%s'",
                           e->line, e->col, e->name), -1;
    if (e->kind == E_TEST && !jj_test_exists(e->name))
        return lmx_err_set(err, LMX_ERR_FORMAT,
                           "template syntax error at line %d, column %d: no test named '%s'",
                           e->line, e->col, e->name), -1;
    const jj_node *kids[4] = {e->a, e->b, e->c, e->d};
    for (int k = 0; k < 4; k++)
        if (check_names(kids[k], err, depth + 1)) return -1;
    for (int k = 0; k < e->n_items; k++)
        if (check_names(e->items[k], err, depth + 1)) return -1;
    for (int k = 0; k < e->n_items2; k++)
        if (check_names(e->items2[k], err, depth + 1)) return -1;
    return 0;
}

lmx_status lmx_jinja_parse(const char *src, size_t len, lmx_jinja **out, lmx_err *err) {
    *out = NULL;
    if (!src) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "template source is NULL");
    lmx_jinja *t = calloc(1, sizeof *t);
    if (!t) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory parsing a template");
    lmx_err e = {0};
    jj_tok *toks = NULL;
    size_t nt = 0;
    if (jj_lex(&t->arena, src, len, &toks, &nt, &e) || jj_parse(&t->arena, toks, nt, &t->root, &e) ||
        check_names(t->root, &e, 0)) {
        free(toks);
        lmx_jinja_free(t);
        return lmx_err_set(err, e.status ? e.status : LMX_ERR_FORMAT, "%s", e.msg);
    }
    free(toks);
    *out = t;
    return LMX_OK;
}

lmx_status lmx_jinja_render(const lmx_jinja *t, const cJSON *vars, char **out, lmx_err *err) {
    *out = NULL;
    if (!t) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "template is NULL");
    if (vars && !cJSON_IsObject(vars))
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "template variables must be a JSON object");
    jj_arena arena = {.limit = JJ_MAX_ARENA};
    jj_buf buf = {.limit = JJ_MAX_OUTPUT};
    lmx_err e = {0};
    jj_render r = {.a = &arena, .err = &e, .out = &buf};
    jj_scope *root = jj_alloc(&arena, sizeof *root);
    int rc = -1;
    if (!root || !(root->vars = jj_dict_new(&arena, 8))) {
        jj_oom(&r);
        goto done;
    }
    r.root = r.cur = root;
    for (const cJSON *c = vars ? vars->child : NULL; c; c = c->next) {
        jj_val v;
        int fail = 0;
        jj_str name = jj_str_dup(&arena, c->string ? c->string : "", c->string ? strlen(c->string) : 0, &fail);
        if (fail || jj_from_cjson(&arena, c, &v) || jj_dict_set(&arena, root->vars, jj_strv(name.p, name.n), v)) {
            jj_oom(&r);
            goto done;
        }
    }
    jj_buf_put(&buf, "", 0);   /* an empty render still returns "" */
    rc = jj_exec_body(&r, t->root->items, t->root->n_items);
    if (!rc && buf.failed) rc = jj_fail(&r, NULL, "rendered text too long or out of memory");
done:
    jj_arena_free(&arena);
    if (rc) {
        jj_buf_free(&buf);
        return lmx_err_set(err, e.status ? e.status : LMX_ERR_INVALID_ARG, "%s", e.msg);
    }
    if (!buf.p) {
        buf.p = calloc(1, 1);
        if (!buf.p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    *out = buf.p;
    return LMX_OK;
}

void lmx_jinja_free(lmx_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->arena);
    free(t);
}
