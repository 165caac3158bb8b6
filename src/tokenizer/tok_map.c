/* tok_map.c - the tokenizer's containers: a growable byte buffer, a string -> int32 hash map
 * (keys copied into one arena) and a uint64 -> uint64 hash map (open addressing, linear probing). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

int lmx_tok_buf_reserve(lmx_tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int lmx_tok_buf_put(lmx_tok_buf *b, const void *s, size_t n) {
    if (lmx_tok_buf_reserve(b, n)) return -1;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int lmx_tok_buf_putc(lmx_tok_buf *b, char c) { return lmx_tok_buf_put(b, &c, 1); }

void lmx_tok_buf_free(lmx_tok_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

int lmx_tok_ids_push(lmx_tok_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->ids, cap * sizeof *p);
        if (!p) return -1;
        v->ids = p;
        v->cap = cap;
    }
    v->ids[v->n++] = id;
    return 0;
}

void lmx_tok_ids_free(lmx_tok_ids *v) {
    if (!v) return;
    free(v->ids);
    v->ids = NULL;
    v->n = v->cap = 0;
}

static uint32_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    for (size_t i = 0; i < n; i++) w |= (uint64_t)(unsigned char)s[i] << (8 * i);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 16;
    while (c < n) c *= 2;
    return c;
}

int lmx_tok_smap_init(lmx_tok_smap *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2 + 16);
    m->slot = calloc(m->cap, sizeof *m->slot);
    return m->slot ? 0 : -1;
}

static int smap_grow_entries(lmx_tok_smap *m) {
    uint32_t cap = m->ecap ? m->ecap * 2 : 1024;
    uint32_t *o = realloc(m->eoff, cap * sizeof *o);
    if (!o) return -1;
    m->eoff = o;
    uint32_t *l = realloc(m->elen, cap * sizeof *l);
    if (!l) return -1;
    m->elen = l;
    uint32_t *h = realloc(m->ehash, cap * sizeof *h);
    if (!h) return -1;
    m->ehash = h;
    int32_t *v = realloc(m->eval, cap * sizeof *v);
    if (!v) return -1;
    m->eval = v;
    m->ecap = cap;
    return 0;
}

static int smap_rehash(lmx_tok_smap *m) {
    uint32_t cap = m->cap * 2;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot) return -1;
    for (uint32_t e = 0; e < m->n; e++) {
        uint32_t i = m->ehash[e] & (cap - 1);
        while (slot[i]) i = (i + 1) & (cap - 1);
        slot[i] = e + 1;
    }
    free(m->slot);
    m->slot = slot;
    m->cap = cap;
    return 0;
}

int32_t lmx_tok_smap_get(const lmx_tok_smap *m, const char *k, size_t n) {
    if (!m->slot) return -1;
    uint32_t h = hash_bytes(k, n);
    uint32_t i = h & (m->cap - 1);
    for (;;) {
        uint32_t e = m->slot[i];
        if (!e) return -1;
        e--;
        if (m->ehash[e] == h && m->elen[e] == n && !memcmp(m->keys.p + m->eoff[e], k, n))
            return m->eval[e];
        i = (i + 1) & (m->cap - 1);
    }
}

int lmx_tok_smap_put(lmx_tok_smap *m, const char *k, size_t n, int32_t v) {
    uint32_t h = hash_bytes(k, n);
    uint32_t i = h & (m->cap - 1);
    for (;;) {
        uint32_t e = m->slot[i];
        if (!e) break;
        e--;
        if (m->ehash[e] == h && m->elen[e] == n && !memcmp(m->keys.p + m->eoff[e], k, n)) {
            m->eval[e] = v;
            return 0;
        }
        i = (i + 1) & (m->cap - 1);
    }
    if (m->n == m->ecap && smap_grow_entries(m)) return -1;
    if (m->keys.n + n >= UINT32_MAX) return -1;
    uint32_t e = m->n;
    m->eoff[e] = (uint32_t)m->keys.n;
    m->elen[e] = (uint32_t)n;
    m->ehash[e] = h;
    m->eval[e] = v;
    if (lmx_tok_buf_put(&m->keys, k, n)) return -1;
    m->slot[i] = e + 1;
    m->n++;
    if ((uint64_t)m->n * 2 > m->cap) return smap_rehash(m);
    return 0;
}

void lmx_tok_smap_free(lmx_tok_smap *m) {
    free(m->slot);
    free(m->eoff);
    free(m->elen);
    free(m->ehash);
    free(m->eval);
    lmx_tok_buf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

static uint32_t hash64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (uint32_t)k;
}

int lmx_tok_map64_init(lmx_tok_map64 *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 16);
    m->n = 0;
    m->keys = malloc(m->cap * sizeof *m->keys);
    m->vals = malloc(m->cap * sizeof *m->vals);
    if (!m->keys || !m->vals) return -1;
    memset(m->keys, 0xff, m->cap * sizeof *m->keys);
    return 0;
}

static int map64_rehash(lmx_tok_map64 *m) {
    lmx_tok_map64 g;
    g.cap = m->cap * 2;
    g.n = 0;
    g.keys = malloc(g.cap * sizeof *g.keys);
    g.vals = malloc(g.cap * sizeof *g.vals);
    if (!g.keys || !g.vals) {
        free(g.keys);
        free(g.vals);
        return -1;
    }
    memset(g.keys, 0xff, g.cap * sizeof *g.keys);
    for (uint32_t i = 0; i < m->cap; i++) {
        if (m->keys[i] == UINT64_MAX) continue;
        uint32_t j = hash64(m->keys[i]) & (g.cap - 1);
        while (g.keys[j] != UINT64_MAX) j = (j + 1) & (g.cap - 1);
        g.keys[j] = m->keys[i];
        g.vals[j] = m->vals[i];
        g.n++;
    }
    free(m->keys);
    free(m->vals);
    *m = g;
    return 0;
}

int lmx_tok_map64_put(lmx_tok_map64 *m, uint64_t k, uint64_t v) {
    uint32_t i = hash64(k) & (m->cap - 1);
    while (m->keys[i] != UINT64_MAX) {
        if (m->keys[i] == k) {
            m->vals[i] = v;
            return 0;
        }
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = k;
    m->vals[i] = v;
    m->n++;
    if ((uint64_t)m->n * 2 > m->cap) return map64_rehash(m);
    return 0;
}

int lmx_tok_map64_get(const lmx_tok_map64 *m, uint64_t k, uint64_t *v) {
    if (!m->keys) return 0;
    uint32_t i = hash64(k) & (m->cap - 1);
    for (;;) {
        uint64_t x = m->keys[i];
        if (x == k) {
            *v = m->vals[i];
            return 1;
        }
        if (x == UINT64_MAX) return 0;
        i = (i + 1) & (m->cap - 1);
    }
}

void lmx_tok_map64_free(lmx_tok_map64 *m) {
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}
