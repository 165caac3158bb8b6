/* jinja_internal.h - shared types of the Jinja engine (jinja*.c): the arena, values, tokens, the
 * syntax tree and the render state.  Not part of the engine's interface (that is jinja.h).
 *
 * Memory: everything a parse makes (tokens' strings, nodes) lives in the template's arena, and
 * everything a render makes (values, strings, scopes) in that render's arena; both are freed in
 * one go.  Values are small structs passed by value; strings are immutable (pointer + length),
 * lists, dicts and namespaces are shared by reference like Python objects.
 *
 * Errors: functions that can fail return 0 / -1 and leave the message in an lmx_err. */
#ifndef LMX_TOKENIZER_JINJA_INTERNAL_H
#define LMX_TOKENIZER_JINJA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* ---- limits (a template is user input: every loop and recursion is bounded) ----------------- */
#define JJ_MAX_DEPTH 200                        /* nesting of expressions, blocks, macro calls */
#define JJ_MAX_OUTPUT ((size_t)64 << 20)        /* bytes of rendered text */
#define JJ_MAX_ARENA ((size_t)512 << 20)        /* bytes a render may allocate */
#define JJ_MAX_STEPS 5000000LL                  /* statements, expressions, iterations */
#define JJ_MAX_RANGE 1000000                    /* elements of range() */

/* ---- arena ---------------------------------------------------------------------------------- */
typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t total;   /* bytes allocated so far */
    size_t limit;   /* 0: no limit */
} jj_arena;

void *jj_alloc(jj_arena *a, size_t n);   /* zeroed; NULL when out of memory or over the limit */
void jj_arena_free(jj_arena *a);

/* ---- growable byte buffer (malloc'ed) --------------------------------------------------------- */
typedef struct jj_buf {
    char *p;
    size_t n, cap, limit;   /* limit 0: none */
    int failed;             /* an append ran out of memory or over the limit */
} jj_buf;

void jj_buf_put(jj_buf *b, const char *s, size_t n);
void jj_buf_puts(jj_buf *b, const char *s);
void jj_buf_putc(jj_buf *b, char c);
void jj_buf_printf(jj_buf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void jj_buf_free(jj_buf *b);

/* ---- values ----------------------------------------------------------------------------------- */
typedef enum jj_type {
    JJ_UNDEF, JJ_NONE, JJ_BOOL, JJ_INT, JJ_FLOAT, JJ_STR, JJ_LIST, JJ_DICT, JJ_NS,
    JJ_LOOP, JJ_MACRO, JJ_FUNC, JJ_METHOD
} jj_type;

typedef struct jj_str {
    const char *p;   /* not NUL-terminated in general */
    size_t n;
} jj_str;

typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_loop jj_loop;
typedef struct jj_method jj_method;
typedef struct jj_node jj_node;

typedef struct jj_val {
    jj_type t;
    union {
        int b;
        int64_t i;
        double f;
        jj_str s;
        jj_list *list;
        jj_dict *dict;             /* JJ_DICT and JJ_NS */
        jj_loop *loop;
        const jj_node *macro;      /* the S_MACRO node */
        int func;                  /* JJ_FUNC: a global function (JJ_FN_*) */
        jj_method *method;
        const char *undef;         /* JJ_UNDEF: the error message its misuse raises */
    } u;
} jj_val;

struct jj_list {
    size_t n, cap;
    jj_val *v;
    int tuple;   /* a Python tuple: (a, b) literals, dict item pairs; repr with ( ) */
};

struct jj_dict {
    size_t n, cap;
    jj_val *k, *v;
};

struct jj_method {
    jj_val self;
    const char *name;
};

struct jj_loop {
    jj_list *items;   /* what is iterated (after the loop's `if` filter) */
    size_t i;         /* current index0 */
};

enum { JJ_FN_RANGE, JJ_FN_NAMESPACE, JJ_FN_RAISE, JJ_FN_DICT, JJ_FN_STRFTIME, JJ_FN_COUNT };

/* constructors */
jj_val jj_undef(const char *msg);
jj_val jj_none(void);
jj_val jj_bool(int b);
jj_val jj_int(int64_t i);
jj_val jj_float(double f);
jj_val jj_strv(const char *p, size_t n);   /* p must outlive the value (arena or static) */
jj_val jj_cstr(const char *p);

jj_list *jj_list_new(jj_arena *a, size_t cap);
int jj_list_push(jj_arena *a, jj_list *l, jj_val v);
jj_dict *jj_dict_new(jj_arena *a, size_t cap);
int jj_dict_set(jj_arena *a, jj_dict *d, jj_val k, jj_val v);
jj_val *jj_dict_get(const jj_dict *d, jj_val k);     /* NULL when absent */
jj_val *jj_dict_gets(const jj_dict *d, const char *key);
jj_str jj_str_dup(jj_arena *a, const char *p, size_t n, int *fail);

/* Python semantics */
int jj_truthy(jj_val v);
int jj_equal(jj_val a, jj_val b);
const char *jj_type_name(jj_val v);   /* "dict object", "str object", ... as in jinja2 messages */

/* str(v) / repr(v) appended to b (Python's formatting: None, True, 1.5, ['a', 1], {'k': 'v'}) */
void jj_write_str(jj_buf *b, jj_val v);
void jj_write_repr(jj_buf *b, jj_val v);
void jj_write_float(jj_buf *b, double f);   /* Python repr of a float */

/* json.dumps(v, ensure_ascii, indent (< 0: none), separators (NULL: default), sort_keys);
 * returns -1 with a message in err for values JSON cannot hold. */
typedef struct jj_json_opts {
    int indent;            /* < 0: compact form with ", " and ": " */
    int ensure_ascii;
    int sort_keys;
    const char *item_sep;  /* NULL: default */
    const char *key_sep;
} jj_json_opts;
int jj_write_json(jj_buf *b, jj_val v, const jj_json_opts *o, int depth, lmx_err *err);

/* Make arena values from parsed JSON (a cJSON *); returns -1 when out of memory. */
int jj_from_cjson(jj_arena *a, const void *cjson, jj_val *out);

/* ---- UTF-8 helpers (jinja_strings.c) ---------------------------------------------------------- */
size_t jj_utf8_next(const char *p, size_t n, size_t i, int32_t *cp);   /* returns next index */
void jj_utf8_put(jj_buf *b, int32_t cp);
int jj_is_space(int32_t cp);   /* Python str.isspace() */

/* ---- tokens ---------------------------------------------------------------------------------- */
typedef enum jj_tok_type {
    JT_DATA, JT_VAR_BEGIN, JT_VAR_END, JT_BLOCK_BEGIN, JT_BLOCK_END,
    JT_NAME, JT_STRING, JT_INT, JT_FLOAT, JT_OP, JT_EOF
} jj_tok_type;

typedef struct jj_tok {
    jj_tok_type type;
    int line, col;
    jj_str s;       /* DATA and STRING: the processed text; NAME and OP: the text */
    int64_t i;
    double f;
} jj_tok;

/* Tokenize src (len bytes) into *toks (malloc'ed, ends with JT_EOF); strings go to a. */
int jj_lex(jj_arena *a, const char *src, size_t len, jj_tok **toks, size_t *n_toks, lmx_err *err);

/* ---- syntax tree ----------------------------------------------------------------------------- */
typedef enum jj_kind {
    /* expressions */
    E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_UNARY, E_BIN, E_AND, E_OR, E_COND,
    /* statements */
    S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_MACRO, S_BREAK, S_CONTINUE, S_BLOCK
} jj_kind;

typedef enum jj_op {
    OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN, OP_NOT, OP_NEG, OP_POS
} jj_op;

/* One node shape for all kinds; the comment of each kind says which fields it uses:
 *   E_LIT lit | E_NAME name | E_LIST items (flag: a tuple) | E_DICT items (keys), items2 (values)
 *   E_ATTR a.name | E_ITEM a[b] | E_SLICE a[b:c:d] (NULLs allowed)
 *   E_CALL a(items) with names[i] the keyword of items[i] or NULL
 *   E_FILTER a|name(items, names) | E_TEST a is [not: flag] name(items, names)
 *   E_UNARY op a | E_BIN a op b | E_AND, E_OR a b | E_COND a if b else c (c may be NULL)
 *   S_TEXT lit | S_OUT a | S_IF if a: items else items2
 *   S_FOR for names in a [if b]: items else items2
 *   S_SET names = b (attr: names[0].attr = b; b NULL: the block body items is captured)
 *   S_MACRO name(names = items2 defaults, NULL for none): items | S_BLOCK items */
struct jj_node {
    jj_kind kind;
    int line, col;
    int op, flag;
    const char *name, *attr;
    jj_val lit;
    jj_node *a, *b, *c, *d;
    jj_node **items, **items2;
    int n_items, n_items2;
    const char **names;
    int n_names;
};

/* Parse tokens into the statement list of the template (a S_BLOCK node). */
int jj_parse(jj_arena *a, const jj_tok *toks, size_t n_toks, jj_node **root, lmx_err *err);

/* ---- rendering ------------------------------------------------------------------------------- */
typedef struct jj_scope jj_scope;
struct jj_scope {
    jj_scope *parent;
    jj_dict *vars;
};

typedef struct jj_render {
    jj_arena *a;
    lmx_err *err;
    jj_buf *out;
    jj_scope *root, *cur;
    int depth;
    long long steps;
    int ctl;   /* 1 break, 2 continue pending */
} jj_render;

/* "line N: " prefixed runtime error; returns -1 */
int jj_fail(jj_render *r, const jj_node *at, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Fail for an arena allocation that returned NULL. */
int jj_oom(jj_render *r);

int jj_eval(jj_render *r, const jj_node *e, jj_val *out);
int jj_exec_body(jj_render *r, jj_node *const *body, int n);
/* Turn a value into a string in the render arena (str(v)). */
int jj_to_str(jj_render *r, jj_val v, jj_str *out);
/* The items a for loop or filter iterates: list items, dict keys, string characters. */
int jj_iterate(jj_render *r, const jj_node *at, jj_val v, jj_list **out);
/* Call a macro, global function or method with evaluated arguments. */
int jj_call(jj_render *r, const jj_node *at, jj_val f, int n, const jj_val *args,
            const char *const *kw, jj_val *out);
/* Binary operators (jinja_ops.c). */
int jj_binop(jj_render *r, const jj_node *at, int op, jj_val x, jj_val y, jj_val *out);
int jj_compare(jj_render *r, const jj_node *at, jj_val x, jj_val y, int *cmp);
/* Attribute and item access (jinja_ops.c). */
int jj_getattr(jj_render *r, const jj_node *at, jj_val obj, const char *name, jj_val *out);
int jj_getitem(jj_render *r, const jj_node *at, jj_val obj, jj_val key, jj_val *out);
int jj_slice(jj_render *r, const jj_node *at, jj_val obj, jj_val start, jj_val stop,
             jj_val step, jj_val *out);
/* Filters and tests (jinja_filters.c); args do not include the operand. */
int jj_filter(jj_render *r, const jj_node *at, const char *name, jj_val v, int n,
              const jj_val *args, const char *const *kw, jj_val *out);
int jj_test(jj_render *r, const jj_node *at, const char *name, jj_val v, int n,
            const jj_val *args, int *out);
int jj_filter_exists(const char *name);
int jj_test_exists(const char *name);
/* Methods of str, dict and list values (jinja_methods.c). */
int jj_method_exists(jj_val self, const char *name);
int jj_call_method(jj_render *r, const jj_node *at, const jj_method *m, int n,
                   const jj_val *args, const char *const *kw, jj_val *out);

#endif
