/* jinja_lex.c - the Jinja lexer: template text into DATA tokens and the tokens of {{ }} and {% %}
 * tags, with the whitespace rules HF transformers uses (jinja2 with trim_blocks=True,
 * lstrip_blocks=True, keep_trailing_newline=False):
 *   - newlines are normalised to \n and one trailing newline of the template is dropped;
 *   - "{%-" / "{{-" / "{#-" strip all whitespace before the tag, "-%}" / "-}}" / "-#}" all after;
 *   - trim_blocks: one newline right after "%}" or "#}" is dropped (not after "+%}");
 *   - lstrip_blocks: spaces and tabs between a line start and "{%" or "{#" are dropped
 *     (not before "{%+");
 *   - {% raw %}...{% endraw %} is kept as text;
 *   - inside a tag, "}}" and "%}" only end it outside brackets. */
#include <stdlib.h>
#include <string.h>

#include "jinja_internal.h"

typedef struct lexer {
    jj_arena *a;
    const char *s;   /* normalised source */
    size_t n;
    jj_tok *toks;
    size_t nt, cap;
    lmx_err *err;
    size_t lc_pos;   /* line/column bookkeeping: position of lc_line/lc_col */
    int lc_line, lc_col;
} lexer;

static void where(lexer *L, size_t pos, int *line, int *col) {
    if (pos < L->lc_pos) { L->lc_pos = 0; L->lc_line = 1; L->lc_col = 1; }
    for (; L->lc_pos < pos; L->lc_pos++) {
        if (L->s[L->lc_pos] == '\n') { L->lc_line++; L->lc_col = 1; }
        else L->lc_col++;
    }
    *line = L->lc_line;
    *col = L->lc_col;
}

static int fail_at(lexer *L, size_t pos, const char *msg) {
    int line, col;
    where(L, pos, &line, &col);
    lmx_err_set(L->err, LMX_ERR_FORMAT, "template syntax error at line %d, column %d: %s", line,
                col, msg);
    return -1;
}

static jj_tok *emit(lexer *L, jj_tok_type type, size_t pos) {
    if (L->nt == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jj_tok *t = realloc(L->toks, cap * sizeof *t);
        if (!t) {
            lmx_err_set(L->err, LMX_ERR_NOMEM, "out of memory lexing a template");
            return NULL;
        }
        L->toks = t;
        L->cap = cap;
    }
    jj_tok *t = &L->toks[L->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    where(L, pos, &t->line, &t->col);
    return t;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static int is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* Emit text [b, e) as DATA, copied into the arena. */
static int emit_data(lexer *L, size_t b, size_t e) {
    if (e <= b) return 0;
    jj_tok *t = emit(L, JT_DATA, b);
    if (!t) return -1;
    int fail = 0;
    t->s = jj_str_dup(L->a, L->s + b, e - b, &fail);
    if (fail) return lmx_err_set(L->err, LMX_ERR_NOMEM, "out of memory lexing a template"), -1;
    return 0;
}

/* The end of the text before a tag at k whose strip sign is sign ('-', '+' or 0) and which is a
 * block or comment tag (lstrip applies) or not. */
static size_t text_end(lexer *L, size_t b, size_t k, char sign, int lstrip) {
    if (sign == '-') {
        while (k > b && is_ws(L->s[k - 1])) k--;
        return k;
    }
    if (sign == '+' || !lstrip) return k;
    size_t l = k;
    while (l > b && L->s[l - 1] != '\n') l--;
    int line_start = l > b || b == 0 || L->s[b - 1] == '\n';
    if (!line_start || l == k) return k;
    for (size_t i = l; i < k; i++)
        if (!is_ws(L->s[i])) return k;
    return l;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at pos (quote char q); Python escapes are decoded.  Sets *end. */
static int lex_string(lexer *L, size_t pos, size_t *end) {
    char q = L->s[pos];
    size_t i = pos + 1;
    jj_buf b = {0};
    while (i < L->n && L->s[i] != q) {
        char c = L->s[i];
        if (c != '\\' || i + 1 >= L->n) { jj_buf_putc(&b, c); i++; continue; }
        char e = L->s[i + 1];
        i += 2;
        switch (e) {
        case '\n': break;
        case '\\': jj_buf_putc(&b, '\\'); break;
        case '\'': jj_buf_putc(&b, '\''); break;
        case '"': jj_buf_putc(&b, '"'); break;
        case 'a': jj_buf_putc(&b, '\a'); break;
        case 'b': jj_buf_putc(&b, '\b'); break;
        case 'f': jj_buf_putc(&b, '\f'); break;
        case 'n': jj_buf_putc(&b, '\n'); break;
        case 'r': jj_buf_putc(&b, '\r'); break;
        case 't': jj_buf_putc(&b, '\t'); break;
        case 'v': jj_buf_putc(&b, '\v'); break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t cp = 0; /* 8 hex digits fit in 32 bits unsigned */
            for (int k = 0; k < nd; k++) {
                int h = i + (size_t)k < L->n ? hexval(L->s[i + (size_t)k]) : -1;
                if (h < 0) {
                    jj_buf_free(&b);
                    return fail_at(L, i - 2, "truncated \\x, \\u or \\U escape in a string");
                }
                cp = cp * 16 + (uint32_t)h;
            }
            i += (size_t)nd;
            if (cp > 0x10ffff) {
                jj_buf_free(&b);
                return fail_at(L, i, "escape out of the Unicode range");
            }
            jj_utf8_put(&b, (int32_t)cp);
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                int32_t cp = e - '0';
                for (int k = 0; k < 2 && i < L->n && L->s[i] >= '0' && L->s[i] <= '7'; k++, i++)
                    cp = cp * 8 + (L->s[i] - '0');
                jj_utf8_put(&b, cp);
            } else {
                jj_buf_putc(&b, '\\');
                jj_buf_putc(&b, e);
            }
        }
    }
    if (i >= L->n) {
        jj_buf_free(&b);
        return fail_at(L, pos, "unterminated string");
    }
    jj_tok *t = emit(L, JT_STRING, pos);
    int fail = b.failed || !t;
    if (t) t->s = jj_str_dup(L->a, b.p ? b.p : "", b.n, &fail);
    jj_buf_free(&b);
    if (fail) return lmx_err_set(L->err, LMX_ERR_NOMEM, "out of memory lexing a template"), -1;
    *end = i + 1;
    return 0;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%",
                                  "~", "[", "]", "(", ")", "{", "}", "<", ">", "=", ".", ":",
                                  "|", ",", ";", NULL};

/* Tokens of a tag starting at pos up to its end ("}}" when var, else "%}").  Sets *end after the
 * end delimiter and *strip_after when it was "-}}" / "-%}", *plus when "+%}". */
static int lex_tag(lexer *L, size_t pos, int var, size_t *end, int *strip_after, int *plus) {
    int depth = 0;
    size_t i = pos;
    const char close = var ? '}' : '%';
    for (;;) {
        while (i < L->n && is_ws(L->s[i])) i++;
        if (i >= L->n) return fail_at(L, pos, var ? "unexpected end of template, expected '}}'"
                                                  : "unexpected end of template, expected '%}'");
        const char *p = L->s + i;
        size_t left = L->n - i;
        if (depth == 0) {
            if (left >= 3 && (p[0] == '-' || p[0] == '+') && p[1] == close && p[2] == '}') {
                *strip_after = p[0] == '-';
                *plus = p[0] == '+';
                *end = i + 3;
                return emit(L, var ? JT_VAR_END : JT_BLOCK_END, i) ? 0 : -1;
            }
            if (left >= 2 && p[0] == close && p[1] == '}') {
                *strip_after = *plus = 0;
                *end = i + 2;
                return emit(L, var ? JT_VAR_END : JT_BLOCK_END, i) ? 0 : -1;
            }
        }
        if (is_alpha(*p)) {
            size_t j = i;
            while (j < L->n && (is_alpha(L->s[j]) || is_digit(L->s[j]))) j++;
            jj_tok *t = emit(L, JT_NAME, i);
            if (!t) return -1;
            t->s.p = L->s + i;
            t->s.n = j - i;
            i = j;
        } else if (is_digit(*p)) {
            size_t j = i;
            while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_')) j++;
            int isf = 0;
            if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
                isf = 1;
                j++;
                while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_')) j++;
            }
            if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
                size_t k = j + 1;
                if (k < L->n && (L->s[k] == '+' || L->s[k] == '-')) k++;
                if (k < L->n && is_digit(L->s[k])) {
                    isf = 1;
                    j = k;
                    while (j < L->n && is_digit(L->s[j])) j++;
                }
            }
            char tmp[128];
            size_t k = 0;
            for (size_t q = i; q < j && k + 1 < sizeof tmp; q++)
                if (L->s[q] != '_') tmp[k++] = L->s[q];
            tmp[k] = '\0';
            jj_tok *t = emit(L, isf ? JT_FLOAT : JT_INT, i);
            if (!t) return -1;
            if (isf) t->f = strtod(tmp, NULL);
            else {
                unsigned long long v = strtoull(tmp, NULL, 10);   /* saturates on overflow */
                if (v > (unsigned long long)INT64_MAX) return fail_at(L, i, "integer literal too large");
                t->i = (int64_t)v;
            }
            t->s.p = L->s + i;
            t->s.n = j - i;
            i = j;
        } else if (*p == '\'' || *p == '"') {
            size_t j = 0;
            if (lex_string(L, i, &j)) return -1;
            i = j;
        } else {
            const char *op = NULL;
            for (int k = 0; OPS[k]; k++) {
                size_t ol = strlen(OPS[k]);
                if (left >= ol && !memcmp(p, OPS[k], ol)) { op = OPS[k]; break; }
            }
            if (!op) return fail_at(L, i, "unexpected character");
            if (*op == '(' || *op == '[' || *op == '{') depth++;
            if (*op == ')' || *op == ']' || *op == '}') {
                if (depth == 0) return fail_at(L, i, "unexpected closing bracket");
                depth--;
            }
            jj_tok *t = emit(L, JT_OP, i);
            if (!t) return -1;
            t->s.p = op;
            t->s.n = strlen(op);
            i += t->s.n;
        }
    }
}

/* Position of the "{%" of a "{% endraw %}" tag at or after pos (its strip sign in *sign) and the
 * end of that tag in *end; 0 when there is none. */
static int find_endraw(lexer *L, size_t pos, size_t *at, char *sign, size_t *end, char *esign) {
    for (size_t k = pos; k + 1 < L->n; k++) {
        if (L->s[k] != '{' || L->s[k + 1] != '%') continue;
        size_t i = k + 2;
        *sign = 0;
        if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) *sign = L->s[i++];
        while (i < L->n && is_ws(L->s[i])) i++;
        if (L->n - i < 6 || memcmp(L->s + i, "endraw", 6)) continue;
        i += 6;
        while (i < L->n && is_ws(L->s[i])) i++;
        *esign = 0;
        if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) *esign = L->s[i++];
        if (i + 1 < L->n && L->s[i] == '%' && L->s[i + 1] == '}') {
            *at = k;
            *end = i + 2;
            return 1;
        }
    }
    return 0;
}

/* If the block tag whose content starts at i is "raw", lex the raw section; returns 1 when it
 * was, 0 when not, -1 on error.  *pos becomes the position after "{% endraw %}". */
static int lex_raw(lexer *L, size_t i, size_t *pos, int *strip_next) {
    while (i < L->n && is_ws(L->s[i])) i++;
    if (L->n - i < 3 || memcmp(L->s + i, "raw", 3) || (i + 3 < L->n && (is_alpha(L->s[i + 3]) || is_digit(L->s[i + 3]))))
        return 0;
    i += 3;
    while (i < L->n && is_ws(L->s[i])) i++;
    int strip = 0;
    if (i < L->n && (L->s[i] == '-' || L->s[i] == '+')) strip = L->s[i++] == '-';
    if (i + 1 >= L->n || L->s[i] != '%' || L->s[i + 1] != '}') return 0;
    i += 2;
    if (strip)
        while (i < L->n && is_ws(L->s[i])) i++;
    size_t at = 0, end = 0;
    char sign, esign;
    if (!find_endraw(L, i, &at, &sign, &end, &esign))
        return fail_at(L, i, "missing {% endraw %}");
    if (emit_data(L, i, text_end(L, i, at, sign, 1))) return -1;
    *pos = end;
    *strip_next = esign == '-';
    if (esign == 0 && end < L->n && L->s[end] == '\n') (*pos)++;
    return 1;
}

int jj_lex(jj_arena *a, const char *src, size_t len, jj_tok **toks, size_t *n_toks,
           lmx_err *err) {
    lexer L = {.a = a, .err = err, .lc_line = 1, .lc_col = 1};
    *toks = NULL;
    *n_toks = 0;
    char *s = jj_alloc(a, len + 1);
    if (!s) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory lexing a template"), -1;
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    L.s = s;
    L.n = n;

    size_t pos = 0;
    int strip_next = 0;
    while (pos <= n) {
        if (strip_next)
            while (pos < n && is_ws(s[pos])) pos++;
        strip_next = 0;
        size_t k = pos;
        while (k + 1 < n && !(s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')))
            k++;
        if (k + 1 >= n) {
            if (emit_data(&L, pos, n)) goto fail;
            break;
        }
        char kind = s[k + 1];
        char sign = k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+') ? s[k + 2] : 0;
        if (emit_data(&L, pos, text_end(&L, pos, k, sign, kind != '{'))) goto fail;
        size_t body = k + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t e = body;
            while (e + 1 < n && !(s[e] == '#' && s[e + 1] == '}')) e++;
            if (e + 1 >= n) {
                fail_at(&L, k, "missing end of comment tag");
                goto fail;
            }
            char esign = e > body && (s[e - 1] == '-' || s[e - 1] == '+') ? s[e - 1] : 0;
            pos = e + 2;
            strip_next = esign == '-';
            if (!esign && pos < n && s[pos] == '\n') pos++;
            continue;
        }
        if (kind == '%') {
            int r = lex_raw(&L, body, &pos, &strip_next);
            if (r < 0) goto fail;
            if (r) continue;
        }
        if (!emit(&L, kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN, k)) goto fail;
        size_t end = 0;
        int strip_after = 0, plus = 0;
        if (lex_tag(&L, body, kind == '{', &end, &strip_after, &plus)) goto fail;
        pos = end;
        strip_next = strip_after;
        if (kind == '%' && !strip_after && !plus && pos < n && s[pos] == '\n') pos++;
    }
    if (!emit(&L, JT_EOF, n)) goto fail;
    *toks = L.toks;
    *n_toks = L.nt;
    return 0;
fail:
    free(L.toks);
    return -1;
}
