/* tok_added.c - added (special) tokens: a byte trie with a 256-way root and hashed edges, and the
 * leftmost-longest split of text around them with HF's lstrip / rstrip / single_word rules. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

static int trie_new_node(lmx_tok_trie *tr, uint32_t *out) {
    if (tr->n_nodes == tr->cap_nodes) {
        uint32_t cap = tr->cap_nodes ? tr->cap_nodes * 2 : 256;
        int32_t *g = realloc(tr->term, cap * sizeof *g);
        if (!g) return -1;
        tr->term = g;
        tr->cap_nodes = cap;
    }
    tr->term[tr->n_nodes] = -1;
    *out = tr->n_nodes++;
    return 0;
}

int lmx_tok_trie_add(lmx_tok_trie *tr, const char *s, size_t n, int32_t idx) {
    if (!tr->n_nodes) {
        uint32_t root;
        if (trie_new_node(tr, &root) || lmx_tok_map64_init(&tr->edges, 1024)) return -1;
    }
    uint32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        uint64_t child = 0;
        if (node == 0) child = tr->root[b];
        else if (!lmx_tok_map64_get(&tr->edges, ((uint64_t)node << 8) | b, &child)) child = 0;
        if (!child) {
            uint32_t c;
            if (trie_new_node(tr, &c)) return -1;
            if (node == 0) tr->root[b] = c;
            else if (lmx_tok_map64_put(&tr->edges, ((uint64_t)node << 8) | b, c)) return -1;
            child = c;
        }
        node = (uint32_t)child;
    }
    if (tr->term[node] < 0) tr->term[node] = idx;   /* the first token with this content wins */
    return 0;
}

void lmx_tok_trie_free(lmx_tok_trie *tr) {
    lmx_tok_map64_free(&tr->edges);
    free(tr->term);
    memset(tr, 0, sizeof *tr);
}

size_t lmx_tok_trie_match(const lmx_tok_trie *tr, const char *s, size_t n, int32_t *idx) {
    if (!n || !tr->n_nodes) return 0;
    uint32_t node = tr->root[(unsigned char)s[0]];
    if (!node) return 0;
    size_t best = 0;
    for (size_t i = 1;; i++) {
        if (tr->term[node] >= 0) {
            best = i;
            *idx = tr->term[node];
        }
        if (i == n) break;
        uint64_t child;
        if (!lmx_tok_map64_get(&tr->edges, ((uint64_t)node << 8) | (unsigned char)s[i], &child)) break;
        node = (uint32_t)child;
    }
    return best;
}

int lmx_tok_pieces_push(lmx_tok_pieces *p, uint32_t off, uint32_t len, int32_t added, int first) {
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        lmx_tok_span *g = realloc(p->v, cap * sizeof *g);
        if (!g) return -1;
        p->v = g;
        p->cap = cap;
    }
    p->v[p->n++] = (lmx_tok_span){off, len, added, (uint8_t)first};
    return 0;
}

static int is_word_cp(uint32_t cp) {
    if (cp == '_') return 1;
    if (cp < 0x80) return (cp >= '0' && cp <= '9') || ((cp | 32) >= 'a' && (cp | 32) <= 'z');
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) ||
           (c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO);
}

/* The code point ending just before s[end] (start <= end). */
static uint32_t cp_before(const char *s, size_t start, size_t end, size_t *len) {
    size_t p = end;
    while (p > start && ((unsigned char)s[p - 1] & 0xC0) == 0x80) p--;
    if (p > start) p--;
    *len = end - p;
    size_t l;
    return lmx_tok_utf8_decode(s + p, &l);
}

lmx_status lmx_tok_split_added(const lmx_tokenizer *t, const lmx_tok_trie *tr, const char *buf,
                               uint32_t off, uint32_t len, int first, lmx_tok_pieces *out,
                               lmx_err *err) {
    size_t end = (size_t)off + len, prev = off, i = off;
    if (tr->n_nodes) {
        while (i < end) {
            if (!tr->root[(unsigned char)buf[i]]) {
                i++;
                continue;
            }
            int32_t idx = -1;
            size_t L = lmx_tok_trie_match(tr, buf + i, end - i, &idx);
            if (!L) {
                i++;
                continue;
            }
            const lmx_tok_added *a = &t->added[idx];
            size_t ms = i, me = i + L, cl;
            if (a->single_word) {
                int left_ok = ms == off || !is_word_cp(cp_before(buf, off, ms, &cl));
                size_t l2 = 0;
                int right_ok = me == end || !is_word_cp(lmx_tok_utf8_decode(buf + me, &l2));
                if (!left_ok || !right_ok) {
                    i = me;
                    continue;
                }
            }
            if (a->lstrip)
                while (ms > prev) {
                    uint32_t cp = cp_before(buf, prev, ms, &cl);
                    if (!lmx_tok_is_space(cp)) break;
                    ms -= cl;
                }
            if (a->rstrip)
                while (me < end) {
                    size_t l2;
                    uint32_t cp = lmx_tok_utf8_decode(buf + me, &l2);
                    if (!lmx_tok_is_space(cp)) break;
                    me += l2;
                }
            if (ms > prev && lmx_tok_pieces_push(out, (uint32_t)prev, (uint32_t)(ms - prev), -1,
                                                 first && prev == off))
                return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            if (lmx_tok_pieces_push(out, (uint32_t)ms, (uint32_t)(me - ms), idx, 0))
                return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            prev = i = me;
        }
    }
    if (end > prev && lmx_tok_pieces_push(out, (uint32_t)prev, (uint32_t)(end - prev), -1,
                                          first && prev == off))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    return LMX_OK;
}
