/* tok_gguf.c - tokenizers stored in GGUF metadata (llama.cpp's tokenizer.ggml.* keys), built into
 * the same tables tok_load.c builds from tokenizer.json.
 *
 * tokenizer.ggml.model "llama" (SentencePiece BPE, e.g. Llama 2, TinyStories, Gemma):
 *   normalizer  Prepend "▁" (when tokenizer.ggml.add_space_prefix, default true), Replace " " -> "▁"
 *   model       BPE over characters, byte_fallback to <0xNN>, fuse_unk.  SentencePiece merges the
 *               adjacent pair whose concatenation is the best-scored token (leftmost on ties); that
 *               is BPE with a merge (a, b) -> a+b for every split of every token into two tokens,
 *               ranked by the merged token's score.  Gemma files rank by file order instead (their
 *               whitespace tokens carry a dummy score of -1000), as transformers does.
 *   decoder     Replace "▁" -> " ", ByteFallback, Fuse; with the space prefix, the leading space of
 *               the sequence is dropped (a Metaspace decoder: the first token loses its "▁").
 *   GGUF converters write user-defined tokens "pre-normalized" (spaces instead of "▁"); the "▁"
 *   is put back, so that e.g. Gemma's "▁▁" token reads as in tokenizer.json.
 * tokenizer.ggml.model "gpt2" (byte-level BPE, e.g. Llama 3, Qwen, SmolLM): vocabulary and merges
 *   from the file, the pre-tokenizer regex chosen by tokenizer.ggml.pre (an unknown name falls back
 *   to the GPT-2 regex, said in lmx_tok_info.note), ByteLevel decoder.
 * Both: control (3) and unknown (2) tokens become special added tokens, user-defined (4) tokens
 * plain added tokens, all matched in the raw text before the model; BOS / EOS are added per
 * add_bos_token (default: true for "llama", false for "gpt2") and add_eos_token. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/gguf.h"
#include "tokenizer/tok_internal.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const char META[] = "\xE2\x96\x81";   /* U+2581, SentencePiece's space */

/* ---- pre-tokenizer regexes by tokenizer.ggml.pre ------------------------------------------ */
static const char RE_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char RE_GPT4O[] =
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { PRE_GPT2, PRE_DIGITS_GPT2, PRE_SPLIT };

static const struct {
    const char *name;
    int kind;
    const char *re;   /* PRE_SPLIT: the Split regex before a regex-less ByteLevel */
} PRE_TABLE[] = {
    {"default", PRE_GPT2, NULL},         {"gpt2", PRE_GPT2, NULL},           {"gpt-2", PRE_GPT2, NULL},
    {"llama3", PRE_SPLIT, RE_LLAMA3},    {"llama-v3", PRE_SPLIT, RE_LLAMA3}, {"llama-bpe", PRE_SPLIT, RE_LLAMA3},
    {"smaug-bpe", PRE_SPLIT, RE_LLAMA3}, {"falcon3", PRE_SPLIT, RE_LLAMA3},  {"dbrx", PRE_SPLIT, RE_LLAMA3},
    {"pixtral", PRE_SPLIT, RE_LLAMA3},   {"qwen2", PRE_SPLIT, RE_QWEN2},     {"deepseek-r1-qwen", PRE_SPLIT, RE_QWEN2},
    {"gpt-4o", PRE_SPLIT, RE_GPT4O},     {"llama4", PRE_SPLIT, RE_GPT4O},
    /* llama.cpp's group of "\p{N}" then the GPT-2 regex (StarCoder-style vocabularies) */
    {"smollm", PRE_DIGITS_GPT2, NULL},   {"starcoder", PRE_DIGITS_GPT2, NULL}, {"refact", PRE_DIGITS_GPT2, NULL},
    {"codeshell", PRE_DIGITS_GPT2, NULL}, {"command-r", PRE_DIGITS_GPT2, NULL},
};

/* ---- small helpers ------------------------------------------------------------------------- */
static char *dup_bytes(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) {
        if (n) memcpy(d, s, n);
        d[n] = 0;
    }
    return d;
}

/* A token id from a scalar key: -1 when absent or outside [0, n). */
static int32_t token_id_key(const lmx_gguf *g, const char *key, int64_t n) {
    int64_t v;
    if (!lmx_gguf_get_int(g, key, &v) || v < 0 || v >= n) return -1;
    return (int32_t)v;
}

static int bool_key(const lmx_gguf *g, const char *key, int dflt) {
    int64_t v;
    return lmx_gguf_get_int(g, key, &v) ? v != 0 : dflt;
}

/* A numeric array key of exactly n elements, or NULL (error set when present but wrong). */
static const lmx_gguf_kv *numeric_array(const lmx_gguf *g, const char *key, uint64_t n, lmx_status *st,
                                        lmx_err *err) {
    const lmx_gguf_kv *kv = lmx_gguf_find_kv(g, key);
    if (!kv) return NULL;
    if (kv->type != LMX_GGUF_ARRAY || kv->elem_type == LMX_GGUF_STRING || kv->elem_type == LMX_GGUF_ARRAY ||
        kv->count != n) {
        *st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a numeric array of %llu elements", key,
                          (unsigned long long)n);
        return NULL;
    }
    return kv;
}

/* ---- the pipeline steps, written as the equivalent tokenizer.json sections ----------------- */
static cJSON *obj_type(const char *type) {
    cJSON *o = cJSON_CreateObject();
    if (o && !cJSON_AddStringToObject(o, "type", type)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *bytelevel_pre(int use_regex) {
    cJSON *o = obj_type("ByteLevel");
    if (o && (!cJSON_AddBoolToObject(o, "add_prefix_space", 0) || !cJSON_AddBoolToObject(o, "use_regex", use_regex))) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

static cJSON *split_pre(const char *re) {
    cJSON *o = obj_type("Split"), *p = cJSON_CreateObject();
    if (!o || !p || !cJSON_AddStringToObject(p, "Regex", re) || !cJSON_AddItemToObject(o, "pattern", p)) {
        cJSON_Delete(o);
        cJSON_Delete(p);
        return NULL;
    }
    if (!cJSON_AddStringToObject(o, "behavior", "Isolated") || !cJSON_AddBoolToObject(o, "invert", 0)) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* {"type": "Sequence", list_key: [a, b]}; takes a and b (NULL when any part is NULL). */
static cJSON *sequence(const char *list_key, cJSON *a, cJSON *b) {
    cJSON *o = obj_type("Sequence"), *arr = cJSON_CreateArray();
    if (!o || !arr || !a || !b) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        cJSON_Delete(a);
        cJSON_Delete(b);
        return NULL;
    }
    cJSON_AddItemToArray(arr, a);
    cJSON_AddItemToArray(arr, b);
    if (!cJSON_AddItemToObject(o, list_key, arr)) {
        cJSON_Delete(o);
        cJSON_Delete(arr);
        return NULL;
    }
    return o;
}

static lmx_status gpt2_pretokenizer(lmx_tokenizer *t, const char *pre, lmx_err *err) {
    int kind = PRE_GPT2;
    const char *re = NULL;
    size_t i, n = sizeof PRE_TABLE / sizeof PRE_TABLE[0];
    for (i = 0; i < n && pre; i++)
        if (!strcmp(pre, PRE_TABLE[i].name)) {
            kind = PRE_TABLE[i].kind;
            re = PRE_TABLE[i].re;
            break;
        }
    if (pre && i == n) {
        char buf[200];
        snprintf(buf, sizeof buf, "GGUF tokenizer.ggml.pre %s is not known to lmx: split with the GPT-2 regex",
                 LMX_QUOTED(pre));
        if (!(t->note = dup_bytes(buf, strlen(buf)))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    cJSON *j = NULL;
    if (kind == PRE_GPT2) j = bytelevel_pre(1);
    else if (kind == PRE_SPLIT) j = sequence("pretokenizers", split_pre(re), bytelevel_pre(0));
    else {
        cJSON *d = obj_type("Digits");
        if (d && !cJSON_AddBoolToObject(d, "individual_digits", 1)) {
            cJSON_Delete(d);
            d = NULL;
        }
        j = sequence("pretokenizers", d, bytelevel_pre(1));
    }
    if (!j) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_status st = lmx_tok_parse_pretokenizer(t, j, err);
    cJSON_Delete(j);
    return st;
}

/* Fixed sections (no regex): JSON text. */
static lmx_status parse_fixed(lmx_tokenizer *t, const char *json,
                              lmx_status (*parse)(lmx_tokenizer *, const cJSON *, lmx_err *), lmx_err *err) {
    cJSON *j = cJSON_Parse(json);
    if (!j) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_status st = parse(t, j, err);
    cJSON_Delete(j);
    return st;
}

static const char SPM_NORM_PREFIX[] =
    "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}";
static const char SPM_NORM[] = "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}";
/* Metaspace first: it turns "▁" into " " except in the first token of a sequence, where the
 * space is the prefix the normalizer added (HF: Replace, ByteFallback, Fuse, Strip(left 1)). */
static const char SPM_DEC_PREFIX[] =
    "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\","
    "\"prepend_scheme\":\"always\"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}";
static const char SPM_DEC[] =
    "{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},"
    "\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"}]}";
static const char BYTELEVEL_DEC[] = "{\"type\":\"ByteLevel\"}";

/* ---- vocabulary ----------------------------------------------------------------------------- */
typedef struct gguf_vocab {
    const lmx_gguf_kv *tokens, *scores, *types;
    int spm;            /* "llama" */
    int by_position;    /* rank SentencePiece merges by file order, not score */
} gguf_vocab;

static int token_type(const gguf_vocab *v, uint64_t i) {
    return v->types ? (int)lmx_gguf_array_int(v->types, i) : TT_NORMAL;
}

/* The token's string: as stored, or for SentencePiece with spaces put back as "▁". */
static int token_string(const gguf_vocab *v, uint64_t i, lmx_tok_buf *out) {
    const lmx_gguf_str *s = &v->tokens->strs[i];
    out->n = 0;
    if (!v->spm || !memchr(s->s, ' ', s->len)) return lmx_tok_buf_put(out, s->s, s->len);
    for (uint64_t k = 0; k < s->len; k++)
        if (s->s[k] == ' ' ? lmx_tok_buf_put(out, META, 3) : lmx_tok_buf_putc(out, s->s[k])) return -1;
    return 0;
}

static lmx_status load_vocab(lmx_tokenizer *t, const gguf_vocab *v, lmx_err *err) {
    uint64_t n = v->tokens->count;
    lmx_tok_buf s = {0}, key = {0};
    lmx_status st = LMX_OK;
    if (lmx_tok_smap_init(&t->enc, n) || lmx_tok_smap_init(&t->names, n))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n && !st; i++) {
        if (token_string(v, i, &s)) goto nomem;
        if ((st = lmx_tok_set_string(t, (int32_t)i, s.p ? s.p : "", s.n, err))) break;
        if (lmx_tok_smap_put(&t->names, s.p ? s.p : "", s.n, (int32_t)i)) goto nomem;
        int r = 0;
        if (t->byte_level) r = lmx_tok_enc_key(t, s.p ? s.p : "", s.n, &key);
        if (r == -2) goto nomem;
        if (r == 0 && (t->byte_level ? lmx_tok_smap_put(&t->enc, key.p ? key.p : "", key.n, (int32_t)i)
                                     : lmx_tok_smap_put(&t->enc, s.p ? s.p : "", s.n, (int32_t)i)))
            goto nomem;
    }
    lmx_tok_buf_free(&s);
    lmx_tok_buf_free(&key);
    return st;
nomem:
    lmx_tok_buf_free(&s);
    lmx_tok_buf_free(&key);
    return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

/* gpt2: merges "a b" in rank order. */
static lmx_status load_merges(lmx_tokenizer *t, const lmx_gguf_kv *kv, lmx_err *err) {
    lmx_tok_buf ka = {0}, kb = {0};
    lmx_status st = LMX_OK;
    if (lmx_tok_map64_init(&t->merges, kv->count)) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (uint64_t r = 0; r < kv->count && !st; r++) {
        const char *a = kv->strs[r].s;
        size_t n = kv->strs[r].len;
        const char *sp = n > 1 ? memchr(a + 1, ' ', n - 1) : NULL;
        if (!sp) {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.merges[%llu]: no space in %s",
                             (unsigned long long)r, LMX_QUOTED_N(a, n));
            break;
        }
        size_t na = (size_t)(sp - a), nb = n - na - 1;
        int ra = lmx_tok_enc_key(t, a, na, &ka), rb = lmx_tok_enc_key(t, sp + 1, nb, &kb);
        if (ra == -2 || rb == -2) goto nomem;
        int32_t ia = ra ? -1 : lmx_tok_smap_get(&t->enc, ka.p ? ka.p : "", ka.n);
        int32_t ib = rb ? -1 : lmx_tok_smap_get(&t->enc, kb.p ? kb.p : "", kb.n);
        int32_t im = -1;
        if (ia >= 0 && ib >= 0) {
            if (lmx_tok_buf_put(&ka, kb.p, kb.n)) goto nomem;
            im = lmx_tok_smap_get(&t->enc, ka.p, ka.n);
        }
        if (im < 0) {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.merges[%llu]: %s is not a merge of two tokens into a token",
                             (unsigned long long)r, LMX_QUOTED_N(a, n));
            break;
        }
        uint64_t k = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, old;
        /* a repeated pair keeps its first (best) rank */
        if (!lmx_tok_map64_get(&t->merges, k, &old) &&
            lmx_tok_map64_put(&t->merges, k, ((uint64_t)r << 32) | (uint32_t)im))
            goto nomem;
    }
    lmx_tok_buf_free(&ka);
    lmx_tok_buf_free(&kb);
    return st;
nomem:
    lmx_tok_buf_free(&ka);
    lmx_tok_buf_free(&kb);
    return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Tokens SentencePiece can form by merging (not control, unknown or byte tokens). */
static int mergeable(const gguf_vocab *v, uint64_t i) {
    int ty = token_type(v, i);
    return ty != TT_CONTROL && ty != TT_UNKNOWN && ty != TT_BYTE;
}

/* llama: a merge (a, b) -> m for every split of every mergeable token m into two tokens, ranked by
 * m's score (equal scores share a rank, so the leftmost pair wins as in SentencePiece), or by m's
 * position for by_position. */
static lmx_status spm_merges(lmx_tokenizer *t, const gguf_vocab *v, lmx_err *err) {
    uint64_t n = v->tokens->count;
    float *sorted = NULL;
    size_t n_sorted = 0;
    if (!v->by_position && v->scores) {
        if (!(sorted = malloc((size_t)n * sizeof *sorted))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < n; i++)
            if (mergeable(v, i)) sorted[n_sorted++] = (float)lmx_gguf_array_float(v->scores, i);
        qsort(sorted, n_sorted, sizeof *sorted, cmp_desc);
        size_t u = 0;   /* distinct scores, best first */
        for (size_t i = 0; i < n_sorted; i++)
            if (!u || sorted[i] != sorted[u - 1]) sorted[u++] = sorted[i];
        n_sorted = u;
    }
    if (lmx_tok_map64_init(&t->merges, (size_t)n * 2)) {
        free(sorted);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    for (uint64_t m = 0; m < n; m++) {
        if (!mergeable(v, m)) continue;
        const char *s = t->strs.p + t->str_off[m];
        size_t len = t->str_len[m];
        if (lmx_tok_smap_get(&t->enc, s, len) != (int32_t)m) continue;   /* a duplicate string */
        uint32_t rank = (uint32_t)m;
        if (sorted) {   /* binary search of the score among the distinct scores */
            float sc = (float)lmx_gguf_array_float(v->scores, m);
            size_t lo = 0, hi = n_sorted;
            while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (sorted[mid] > sc) lo = mid + 1;
                else hi = mid;
            }
            rank = (uint32_t)lo;
        } else if (!v->by_position)
            rank = 0;   /* no scores: every merge ties, leftmost first */
        for (size_t k = lmx_tok_utf8_len((unsigned char)s[0]); k < len; k += lmx_tok_utf8_len((unsigned char)s[k])) {
            int32_t ia = lmx_tok_smap_get(&t->enc, s, k);
            if (ia < 0) continue;
            int32_t ib = lmx_tok_smap_get(&t->enc, s + k, len - k);
            if (ib < 0) continue;
            uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib, old;
            if (lmx_tok_map64_get(&t->merges, key, &old) && (uint32_t)(old >> 32) <= rank) continue;
            if (lmx_tok_map64_put(&t->merges, key, ((uint64_t)rank << 32) | (uint32_t)m)) {
                free(sorted);
                return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            }
        }
    }
    free(sorted);
    return LMX_OK;
}

/* Control, unknown and user-defined tokens: added tokens matched in the raw text. */
static lmx_status load_added(lmx_tokenizer *t, const gguf_vocab *v, lmx_err *err) {
    uint64_t n = v->tokens->count, k = 0;
    if (!v->types) return LMX_OK;
    for (uint64_t i = 0; i < n; i++) {
        int ty = token_type(v, i);
        k += (ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_USER) && t->str_len[i];
    }
    if (!k) return LMX_OK;
    if (!(t->added = calloc((size_t)k, sizeof *t->added))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < n; i++) {
        int ty = token_type(v, i);
        if (!((ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_USER) && t->str_len[i])) continue;
        lmx_tok_added *a = &t->added[t->n_added];
        a->id = (int32_t)i;
        a->special = ty != TT_USER;
        a->off = t->str_off[i];
        a->len = t->str_len[i];
        t->flags[i] = (uint8_t)(LMX_TOK_F_ADDED | (a->special ? LMX_TOK_F_SPECIAL : 0));
        if (lmx_tok_smap_put(&t->names, t->strs.p + a->off, a->len, a->id) ||
            lmx_tok_trie_add(&t->trie_raw, t->strs.p + a->off, a->len, (int32_t)t->n_added))
            return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        t->n_added++;
    }
    return LMX_OK;
}

static lmx_status set_byte_ids(lmx_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char k[8];
        if (t->byte_level) {
            k[0] = (char)b;
            t->byte_id[b] = lmx_tok_smap_get(&t->enc, k, 1);
        } else {
            snprintf(k, sizeof k, "<0x%02X>", b);
            t->byte_id[b] = lmx_tok_smap_get(&t->enc, k, 6);
        }
    }
    return LMX_OK;
}

static char *token_copy(const lmx_tokenizer *t, int32_t id) {
    if (id < 0) return NULL;
    return dup_bytes(t->strs.p + t->str_off[id], t->str_len[id]);
}

/* BOS / EOS ids and strings, add_bos / add_eos, the post-processor, the chat template. */
static lmx_status load_specials(lmx_tokenizer *t, const lmx_gguf *g, int spm, lmx_err *err) {
    int64_t n = t->n_vocab;
    t->bos_id = token_id_key(g, "tokenizer.ggml.bos_token_id", n);
    t->eos_id = token_id_key(g, "tokenizer.ggml.eos_token_id", n);
    t->pad_id = token_id_key(g, "tokenizer.ggml.padding_token_id", n);
    t->unk_id = token_id_key(g, "tokenizer.ggml.unknown_token_id", n);
    if (spm && t->unk_id < 0) t->unk_id = lmx_tok_smap_get(&t->names, "<unk>", 5);
    t->add_bos = bool_key(g, "tokenizer.ggml.add_bos_token", spm);
    t->add_eos = bool_key(g, "tokenizer.ggml.add_eos_token", 0);
    if ((t->bos_id >= 0 && !(t->bos_token = token_copy(t, t->bos_id))) ||
        (t->eos_id >= 0 && !(t->eos_token = token_copy(t, t->eos_id))) ||
        (t->pad_id >= 0 && !(t->pad_token = token_copy(t, t->pad_id))) ||
        (t->unk_id >= 0 && !(t->unk_token = token_copy(t, t->unk_id))))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (t->add_bos && t->bos_id >= 0) {
        if (!(t->post_pre = malloc(sizeof *t->post_pre))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        t->post_pre[0] = t->bos_id;
        t->n_post_pre = 1;
    }
    if (t->add_eos && t->eos_id >= 0) {
        if (!(t->post_post = malloc(sizeof *t->post_post))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        t->post_post[0] = t->eos_id;
        t->n_post_post = 1;
    }
    const lmx_gguf_kv *ct = lmx_gguf_find_kv(g, "tokenizer.chat_template");
    if (ct && ct->type == LMX_GGUF_STRING && !(t->chat_template = lmx_gguf_get_string(g, "tokenizer.chat_template")))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    return LMX_OK;
}

static lmx_status build(lmx_tokenizer *t, const lmx_gguf *g, lmx_err *err) {
    const lmx_gguf_kv *model = lmx_gguf_find_kv(g, "tokenizer.ggml.model");
    if (!model) return lmx_err_set(err, LMX_ERR_MISSING, "no tokenizer in the GGUF metadata (no tokenizer.ggml.model)");
    if (model->type != LMX_GGUF_STRING) return lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.model: not a string");
    const lmx_gguf_str *ms = &model->strs[0];
    gguf_vocab v = {0};
    if (ms->len == 5 && !memcmp(ms->s, "llama", 5)) v.spm = 1;
    else if (!(ms->len == 4 && !memcmp(ms->s, "gpt2", 4)))
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "tokenizer.ggml.model %s (lmx reads \"llama\" and \"gpt2\")",
                           LMX_QUOTED_N(ms->s, ms->len));
    v.tokens = lmx_gguf_find_kv(g, "tokenizer.ggml.tokens");
    if (!v.tokens) return lmx_err_set(err, LMX_ERR_MISSING, "no tokenizer.ggml.tokens");
    if (v.tokens->type != LMX_GGUF_ARRAY || v.tokens->elem_type != LMX_GGUF_STRING || !v.tokens->count)
        return lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.tokens: not a non-empty array of strings");
    if (v.tokens->count >= (1u << 28)) return lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.tokens: too many tokens");
    lmx_status st = LMX_OK;
    v.scores = numeric_array(g, "tokenizer.ggml.scores", v.tokens->count, &st, err);
    if (st) return st;
    v.types = numeric_array(g, "tokenizer.ggml.token_type", v.tokens->count, &st, err);
    if (st) return st;
    char *arch = lmx_gguf_get_string(g, "general.architecture");
    v.by_position = v.spm && arch && !strncmp(arch, "gemma", 5);
    free(arch);

    if (v.spm) {
        int prefix = bool_key(g, "tokenizer.ggml.add_space_prefix", 1);
        t->byte_fallback = t->fuse_unk = 1;
        if ((st = parse_fixed(t, prefix ? SPM_NORM_PREFIX : SPM_NORM, lmx_tok_parse_normalizer, err)) ||
            (st = parse_fixed(t, prefix ? SPM_DEC_PREFIX : SPM_DEC, lmx_tok_parse_decoder, err)))
            return st;
    } else {
        char *pre = lmx_gguf_get_string(g, "tokenizer.ggml.pre");
        st = gpt2_pretokenizer(t, pre, err);   /* sets byte_level */
        free(pre);
        if (st || (st = parse_fixed(t, BYTELEVEL_DEC, lmx_tok_parse_decoder, err))) return st;
    }
    if ((st = load_vocab(t, &v, err))) return st;
    if (v.spm) st = spm_merges(t, &v, err);
    else {
        const lmx_gguf_kv *merges = lmx_gguf_find_kv(g, "tokenizer.ggml.merges");
        if (!merges) return lmx_err_set(err, LMX_ERR_MISSING, "no tokenizer.ggml.merges (needed by a \"gpt2\" tokenizer)");
        if (merges->type != LMX_GGUF_ARRAY || merges->elem_type != LMX_GGUF_STRING)
            return lmx_err_set(err, LMX_ERR_FORMAT, "tokenizer.ggml.merges: not an array of strings");
        st = load_merges(t, merges, err);
    }
    if (st || (st = load_added(t, &v, err)) || (st = set_byte_ids(t))) return st;
    return load_specials(t, g, v.spm, err);
}

lmx_status lmx_tok_load_gguf(const lmx_gguf *g, lmx_tokenizer **out, lmx_err *err) {
    *out = NULL;
    if (!g) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "no GGUF file");
    lmx_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_tok_bytelevel_tables(t->byte_cp, t->cp_byte);
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = -1;
    lmx_status st = build(t, g, err);
    if (st) {
        lmx_tok_free(t);
        return st;
    }
    *out = t;
    return LMX_OK;
}

lmx_status lmx_tok_load_gguf_path(const char *path, lmx_tokenizer **out, lmx_err *err) {
    *out = NULL;
    lmx_gguf *g = NULL;
    lmx_status st = lmx_gguf_open(path, &g, err);
    if (st) return st;
    st = lmx_tok_load_gguf(g, out, err);
    lmx_gguf_close(g);
    if (st) lmx_err_prefix(err, "%s", path);
    return st;
}
