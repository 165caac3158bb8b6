/* tok_bpe.c - the BPE model on one pre-token, as HF tokenizers' Word::merge_all does it.
 *
 * Symbols start as the word's bytes (byte-level vocabularies) or characters (others: unknown
 * characters become <0xNN> byte tokens with byte_fallback, else the unk token, fused when
 * fuse_unk).  A binary min-heap of candidate merges ordered by (rank, position) drives the merging
 * over a doubly linked list of symbols; stale candidates are skipped when popped.  O(n log n) per
 * word, which matters for SentencePiece-style tokenizers whose "words" can be whole texts. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct lmx_tok_merge {
    uint64_t key;     /* rank << 32 | position of the left symbol */
    int32_t new_id;
} lmx_tok_merge;

static void heap_push(lmx_tok_merge *h, size_t *n, lmx_tok_merge m) {
    size_t i = (*n)++;
    while (i) {
        size_t p = (i - 1) / 2;
        if (h[p].key <= m.key) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static lmx_tok_merge heap_pop(lmx_tok_merge *h, size_t *n) {
    lmx_tok_merge top = h[0], last = h[--*n];
    size_t i = 0, N = *n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= N) break;
        if (c + 1 < N && h[c + 1].key < h[c].key) c++;
        if (last.key <= h[c].key) break;
        h[i] = h[c];
        i = c;
    }
    if (N) h[i] = last;
    return top;
}

static int reserve(lmx_tok_work *w, size_t n) {
    if (n <= w->sym_cap) return 0;
    size_t cap = w->sym_cap ? w->sym_cap : 64;
    while (cap < n) cap *= 2;
    int32_t *a = realloc(w->sym_id, cap * sizeof *a);
    if (!a) return -1;
    w->sym_id = a;
    int32_t *b = realloc(w->sym_prev, cap * sizeof *b);
    if (!b) return -1;
    w->sym_prev = b;
    int32_t *c = realloc(w->sym_next, cap * sizeof *c);
    if (!c) return -1;
    w->sym_next = c;
    uint32_t *d = realloc(w->sym_len, cap * sizeof *d);
    if (!d) return -1;
    w->sym_len = d;
    /* n - 1 initial candidates plus at most two per merge */
    lmx_tok_merge *h = realloc(w->heap, (3 * cap + 4) * sizeof *h);
    if (!h) return -1;
    w->heap = h;
    w->heap_cap = 3 * cap + 4;
    w->sym_cap = cap;
    return 0;
}

static inline int merge_of(const lmx_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *id) {
    uint64_t v;
    if (!lmx_tok_map64_get(&t->merges, ((uint64_t)(uint32_t)a << 32) | (uint32_t)b, &v)) return 0;
    *rank = (uint32_t)(v >> 32);
    *id = (int32_t)(uint32_t)v;
    return 1;
}

/* Initial symbols of the word; returns their count. */
static size_t initial_symbols(const lmx_tokenizer *t, lmx_tok_work *w, const char *s, size_t n,
                              lmx_tok_buf *key) {
    size_t k = 0;
    int unk_open = 0;   /* the last symbol is a fusable unk */
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(unsigned char)s[i]];
            if (id < 0) {
                if (t->unk_id < 0) continue;
                if (t->fuse_unk && unk_open) {
                    w->sym_len[k - 1]++;
                    continue;
                }
                id = t->unk_id;
                unk_open = 1;
            } else
                unk_open = 0;
            w->sym_id[k] = id;
            w->sym_len[k++] = 1;
        }
        return k;
    }
    size_t pre = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    size_t suf = t->eow_suffix ? strlen(t->eow_suffix) : 0;
    for (size_t i = 0; i < n;) {
        size_t L = lmx_tok_utf8_len((unsigned char)s[i]);
        if (i + L > n) L = n - i;
        int32_t id;
        if ((pre && i > 0) || (suf && i + L == n)) {
            key->n = 0;
            if (pre && i > 0) lmx_tok_buf_put(key, t->cont_prefix, pre);
            lmx_tok_buf_put(key, s + i, L);
            if (suf && i + L == n) lmx_tok_buf_put(key, t->eow_suffix, suf);
            id = lmx_tok_smap_get(&t->enc, key->p ? key->p : "", key->n);
        } else
            id = lmx_tok_smap_get(&t->enc, s + i, L);
        if (id >= 0) {
            w->sym_id[k] = id;
            w->sym_len[k++] = (uint32_t)L;
            unk_open = 0;
        } else {
            int done = 0;
            if (t->byte_fallback) {
                done = 1;
                for (size_t j = 0; j < L; j++)
                    if (t->byte_id[(unsigned char)s[i + j]] < 0) done = 0;
                if (done) {
                    for (size_t j = 0; j < L; j++) {
                        w->sym_id[k] = t->byte_id[(unsigned char)s[i + j]];
                        w->sym_len[k++] = 1;
                    }
                    unk_open = 0;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (t->fuse_unk && unk_open) w->sym_len[k - 1] += (uint32_t)L;
                else {
                    w->sym_id[k] = t->unk_id;
                    w->sym_len[k++] = (uint32_t)L;
                    unk_open = 1;
                }
            }
        }
        i += L;
    }
    return k;
}

lmx_status lmx_tok_bpe_word(const lmx_tokenizer *t, lmx_tok_work *w, const char *s, size_t n,
                            lmx_tok_ids *out, lmx_err *err) {
    if (!n) return LMX_OK;
    if (t->ignore_merges) {
        int32_t id = lmx_tok_smap_get(&t->enc, s, n);
        if (id >= 0) return lmx_tok_ids_push(out, id) ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : LMX_OK;
    }
    if (reserve(w, n)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_tok_buf key = {0};
    size_t k = initial_symbols(t, w, s, n, &key);
    lmx_tok_buf_free(&key);
    int32_t *id = w->sym_id, *prev = w->sym_prev, *next = w->sym_next;
    uint32_t *len = w->sym_len;
    lmx_tok_merge *h = w->heap;
    size_t hn = 0;
    for (size_t i = 0; i < k; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < k ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < k; i++) {
        uint32_t r;
        int32_t m;
        if (merge_of(t, id[i], id[i + 1], &r, &m)) heap_push(h, &hn, (lmx_tok_merge){((uint64_t)r << 32) | i, m});
    }
    while (hn) {
        lmx_tok_merge top = heap_pop(h, &hn);
        uint32_t pos = (uint32_t)top.key;
        if (!len[pos] || next[pos] < 0) continue;
        int32_t rp = next[pos];
        uint32_t r;
        int32_t m;
        if (!merge_of(t, id[pos], id[rp], &r, &m) || m != top.new_id) continue;
        id[pos] = m;
        len[pos] += len[rp];
        len[rp] = 0;
        next[pos] = next[rp];
        if (next[rp] >= 0) prev[next[rp]] = (int32_t)pos;
        if (hn + 2 > w->heap_cap) return lmx_err_set(err, LMX_ERR_NOMEM, "BPE heap overflow");
        if (prev[pos] >= 0 && merge_of(t, id[prev[pos]], m, &r, &m))
            heap_push(h, &hn, (lmx_tok_merge){((uint64_t)r << 32) | (uint32_t)prev[pos], m});
        if (next[pos] >= 0 && merge_of(t, id[pos], id[next[pos]], &r, &m))
            heap_push(h, &hn, (lmx_tok_merge){((uint64_t)r << 32) | pos, m});
    }
    for (int32_t i = k ? 0 : -1; i >= 0; i = next[i])
        if (lmx_tok_ids_push(out, id[i])) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    return LMX_OK;
}
