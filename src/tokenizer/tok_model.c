/* tok_model.c - load the "model" section of tokenizer.json (BPE): the vocabulary into the id ->
 * string table and the encode map, and the merges ("a b" strings or ["a", "b"] pairs) into the
 * (left, right) -> (rank, merged) map.  With a ByteLevel pre-tokenizer the encode keys are the raw
 * bytes each token stands for, so encoding needs no byte-to-unicode pass. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* The encode key of token string s: the same bytes, or for byte-level vocabularies the raw bytes
 * (returns -1 when s has a character outside the byte-level alphabet). */
int lmx_tok_enc_key(const lmx_tokenizer *t, const char *s, size_t n, lmx_tok_buf *out) {
    out->n = 0;
    if (!t->byte_level) return lmx_tok_buf_put(out, s, n) ? -2 : 0;
    if (lmx_tok_buf_reserve(out, n)) return -2;
    size_t i = 0;
    while (i < n) {
        size_t L = lmx_tok_utf8_len((unsigned char)s[i]);
        if (i + L > n) return -1;
        uint32_t cp = lmx_tok_utf8_decode(s + i, &L);
        if (cp >= 324 || t->cp_byte[cp] < 0) return -1;
        out->p[out->n++] = (char)t->cp_byte[cp];
        i += L;
    }
    return 0;
}

static lmx_status load_vocab(lmx_tokenizer *t, const cJSON *vocab, lmx_err *err) {
    lmx_tok_buf key = {0};
    const cJSON *it;
    lmx_status st = LMX_OK;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || !it->string) {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "model.vocab: bad entry");
            break;
        }
        int32_t id = it->valueint; /* saturated by cJSON: no undefined float-to-int cast */
        size_t n = strlen(it->string);
        if ((st = lmx_tok_set_string(t, id, it->string, n, err))) break;
        if (lmx_tok_smap_put(&t->names, it->string, n, id)) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
        int r = lmx_tok_enc_key(t, it->string, n, &key);
        if (r == -2 || (r == 0 && lmx_tok_smap_put(&t->enc, key.p, key.n, id))) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
    }
    lmx_tok_buf_free(&key);
    return st;
}

static lmx_status load_merges(lmx_tokenizer *t, const cJSON *merges, lmx_err *err) {
    lmx_tok_buf ka = {0}, kb = {0};
    lmx_status st = LMX_OK;
    if (lmx_tok_map64_init(&t->merges, (size_t)cJSON_GetArraySize(merges)))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    size_t pre = t->cont_prefix ? strlen(t->cont_prefix) : 0;
    const cJSON *it;
    uint32_t rank = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t na, nb;
        if (cJSON_IsString(it)) {
            a = it->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp) {
                st = lmx_err_set(err, LMX_ERR_FORMAT, "model.merges[%u]: no space in %s", rank, LMX_QUOTED(a));
                break;
            }
            na = (size_t)(sp - a);
            b = sp + 1;
            nb = strlen(b);
        } else if (cJSON_GetArraySize(it) == 2 && cJSON_IsString(cJSON_GetArrayItem(it, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(it, 1))) {
            a = cJSON_GetArrayItem(it, 0)->valuestring;
            b = cJSON_GetArrayItem(it, 1)->valuestring;
            na = strlen(a);
            nb = strlen(b);
        } else {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "model.merges[%u]: not a pair", rank);
            break;
        }
        /* the merged token drops the right part's continuing-subword prefix */
        const char *bm = b;
        size_t nbm = nb;
        if (pre && nb >= pre && !memcmp(b, t->cont_prefix, pre)) {
            bm += pre;
            nbm -= pre;
        }
        int ra = lmx_tok_enc_key(t, a, na, &ka), rb = lmx_tok_enc_key(t, b, nb, &kb);
        if (ra == -2 || rb == -2) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
        int32_t ia = ra ? -1 : lmx_tok_smap_get(&t->enc, ka.p, ka.n);
        int32_t ib = rb ? -1 : lmx_tok_smap_get(&t->enc, kb.p, kb.n);
        int32_t im = -1;
        if (ia >= 0 && ib >= 0) {
            if (lmx_tok_enc_key(t, bm, nbm, &kb) == -2 || lmx_tok_buf_put(&ka, kb.p, kb.n)) {
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
            im = lmx_tok_smap_get(&t->enc, ka.p, ka.n);
        }
        if (ia < 0 || ib < 0 || im < 0) {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "model.merges[%u]: %s + %s not in the vocabulary", rank,
                             LMX_QUOTED_N(a, na), LMX_QUOTED_N(b, nb));
            break;
        }
        uint64_t k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        if (lmx_tok_map64_put(&t->merges, k, ((uint64_t)rank << 32) | (uint32_t)im)) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
        rank++;
    }
    lmx_tok_buf_free(&ka);
    lmx_tok_buf_free(&kb);
    return st;
}

static char *opt_string(const cJSON *model, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    if (!cJSON_IsString(v) || !*v->valuestring) return NULL;
    size_t n = strlen(v->valuestring);
    char *d = malloc(n + 1);
    if (d) memcpy(d, v->valuestring, n + 1);
    return d;
}

lmx_status lmx_tok_load_bpe(lmx_tokenizer *t, const cJSON *model, lmx_err *err) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "BPE"))
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "model type %s (only BPE)", LMX_QUOTED(type->valuestring));
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return lmx_err_set(err, LMX_ERR_FORMAT, "model: no vocab object or merges array (not BPE?)");
    t->byte_fallback = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback"));
    t->fuse_unk = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "fuse_unk"));
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    t->cont_prefix = opt_string(model, "continuing_subword_prefix");
    t->eow_suffix = opt_string(model, "end_of_word_suffix");

    lmx_status st = load_vocab(t, vocab, err);
    if (st) return st;
    if ((st = load_merges(t, merges, err))) return st;

    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = -1;
    if (cJSON_IsString(unk)) t->unk_id = lmx_tok_smap_get(&t->names, unk->valuestring, strlen(unk->valuestring));
    for (int b = 0; b < 256; b++) {
        char k[8];
        if (t->byte_level) {
            k[0] = (char)b;
            t->byte_id[b] = lmx_tok_smap_get(&t->enc, k, 1);
        } else {
            snprintf(k, sizeof k, "<0x%02X>", b);
            t->byte_id[b] = t->byte_fallback ? lmx_tok_smap_get(&t->enc, k, 6) : -1;
        }
    }
    return LMX_OK;
}
