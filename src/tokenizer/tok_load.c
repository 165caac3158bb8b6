/* tok_load.c - lmx_tok_load / lmx_tok_free: read tokenizer.json (and tokenizer_config.json) once
 * with cJSON, build the compact tables of tok_internal.h, free the JSON.  GGUF files go to
 * tok_gguf.c. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "base/json.h"
#include "formats/gguf.h"
#include "tokenizer/tok_internal.h"

lmx_status lmx_tok_set_string(lmx_tokenizer *t, int32_t id, const char *s, size_t n, lmx_err *err) {
    if (id < 0 || id >= (1 << 28)) return lmx_err_set(err, LMX_ERR_FORMAT, "token id %d out of range", id);
    if (id >= t->n_vocab) {
        if ((size_t)id >= t->str_cap) {
            size_t cap = t->str_cap ? t->str_cap : 1024;
            while (cap <= (size_t)id) cap *= 2;
            uint32_t *o = realloc(t->str_off, cap * sizeof *o);
            if (!o) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            t->str_off = o;
            uint32_t *l = realloc(t->str_len, cap * sizeof *l);
            if (!l) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            t->str_len = l;
            uint8_t *f = realloc(t->flags, cap);
            if (!f) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            t->flags = f;
            t->str_cap = cap;
        }
        for (size_t i = (size_t)t->n_vocab; i <= (size_t)id; i++) {
            t->str_off[i] = 0;
            t->str_len[i] = UINT32_MAX;
            t->flags[i] = 0;
        }
        t->n_vocab = id + 1;
    }
    if (t->strs.n + n + 1 >= UINT32_MAX) return lmx_err_set(err, LMX_ERR_FORMAT, "vocabulary too large");
    t->str_off[id] = (uint32_t)t->strs.n;
    t->str_len[id] = (uint32_t)n;
    if (lmx_tok_buf_put(&t->strs, s, n) || lmx_tok_buf_putc(&t->strs, 0))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    return LMX_OK;
}

static lmx_status load_added(lmx_tokenizer *t, const cJSON *arr, lmx_err *err) {
    int n = cJSON_GetArraySize(arr);
    if (n <= 0) return LMX_OK;
    t->added = calloc((size_t)n, sizeof *t->added);
    if (!t->added) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    lmx_tok_buf norm = {0};
    lmx_status st = LMX_OK;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || !cJSON_IsString(content) || !*content->valuestring) {
            st = lmx_err_set(err, LMX_ERR_FORMAT, "added_tokens: bad entry");
            break;
        }
        lmx_tok_added *a = &t->added[t->n_added];
        a->id = id->valueint; /* saturated by cJSON */
        a->lstrip = (uint8_t)lmx_json_bool(it, "lstrip", 0);
        a->rstrip = (uint8_t)lmx_json_bool(it, "rstrip", 0);
        a->single_word = (uint8_t)lmx_json_bool(it, "single_word", 0);
        a->normalized = (uint8_t)lmx_json_bool(it, "normalized", 0);
        a->special = (uint8_t)lmx_json_bool(it, "special", 0);
        const char *s = content->valuestring;
        size_t len = strlen(s);
        if ((st = lmx_tok_set_string(t, a->id, s, len, err))) break;
        t->flags[a->id] = (uint8_t)(LMX_TOK_F_ADDED | (a->special ? LMX_TOK_F_SPECIAL : 0));
        if (lmx_tok_smap_put(&t->names, s, len, a->id)) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            break;
        }
        /* the pattern: the content itself, or for normalized tokens its normalized form */
        a->off = t->str_off[a->id];
        a->len = (uint32_t)len;
        if (a->normalized && t->n_norms) {
            norm.n = 0;
            if ((st = lmx_tok_normalize(t, s, len, &norm, err))) break;
            a->off = (uint32_t)t->strs.n;
            a->len = (uint32_t)norm.n;
            if (lmx_tok_buf_put(&t->strs, norm.p, norm.n) || lmx_tok_buf_putc(&t->strs, 0)) {
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
        }
        if (a->len) {
            lmx_tok_trie *tr = a->normalized ? &t->trie_norm : &t->trie_raw;
            if (lmx_tok_trie_add(tr, t->strs.p + a->off, a->len, (int32_t)t->n_added)) {
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
        }
        t->n_added++;
    }
    lmx_tok_buf_free(&norm);
    return st;
}

/* bos_token etc.: a string, {"content": ...}, or null. */
static char *config_token(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!cJSON_IsString(v)) return NULL;
    size_t n = strlen(v->valuestring);
    char *d = malloc(n + 1);
    if (d) memcpy(d, v->valuestring, n + 1);
    return d;
}

static int config_bool(const cJSON *cfg, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : -1;
}

static lmx_status load_config(lmx_tokenizer *t, const char *path, lmx_err *err) {
    t->add_bos = t->add_eos = -1;
    t->bos_id = t->eos_id = t->pad_id = -1;
    if (!lmx_is_file(path)) return LMX_OK;
    char *text = NULL;
    size_t size = 0;
    lmx_status st = lmx_read_file(path, &text, &size, err);
    if (st) return st;
    cJSON *cfg = cJSON_ParseWithLength(text, size);
    free(text);
    if (!cfg) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: not valid JSON", path);
    t->bos_token = config_token(cfg, "bos_token");
    t->eos_token = config_token(cfg, "eos_token");
    t->pad_token = config_token(cfg, "pad_token");
    t->unk_token = config_token(cfg, "unk_token");
    t->add_bos = config_bool(cfg, "add_bos_token");
    t->add_eos = config_bool(cfg, "add_eos_token");
    cJSON_Delete(cfg);
    if (t->bos_token) t->bos_id = lmx_tok_token_id(t, t->bos_token);
    if (t->eos_token) t->eos_id = lmx_tok_token_id(t, t->eos_token);
    if (t->pad_token) t->pad_id = lmx_tok_token_id(t, t->pad_token);
    return LMX_OK;
}

static lmx_status build(lmx_tokenizer *t, const cJSON *root, lmx_err *err) {
    lmx_status st;
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsObject(model)) return lmx_err_set(err, LMX_ERR_FORMAT, "no \"model\" object");
    if ((st = lmx_tok_parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), err)))
        return lmx_err_prefix(err, "normalizer");
    if ((st = lmx_tok_parse_pretokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), err)))
        return lmx_err_prefix(err, "pre_tokenizer");
    if ((st = lmx_tok_parse_postprocessor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), err)))
        return lmx_err_prefix(err, "post_processor");
    if ((st = lmx_tok_parse_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"), err)))
        return lmx_err_prefix(err, "decoder");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    size_t nv = (size_t)cJSON_GetArraySize(vocab) + (size_t)cJSON_GetArraySize(added);
    if (lmx_tok_smap_init(&t->enc, nv) || lmx_tok_smap_init(&t->names, nv))
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if ((st = lmx_tok_load_bpe(t, model, err))) return lmx_err_prefix(err, "model");
    if ((st = load_added(t, added, err))) return st;
    return LMX_OK;
}

lmx_status lmx_tok_load(const char *path, lmx_tokenizer **out, lmx_err *err) {
    *out = NULL;
    if (!path) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "no tokenizer path");
    if (lmx_is_file(path) && lmx_gguf_is_gguf(path)) return lmx_tok_load_gguf_path(path, out, err);
    char *json_path = NULL, *cfg_path = NULL;
    if (lmx_is_dir(path)) {
        json_path = lmx_path_join(path, "tokenizer.json");
        cfg_path = lmx_path_join(path, "tokenizer_config.json");
    } else {
        size_t n = strlen(path);
        const char *slash = strrchr(path, '/');
        size_t dn = slash ? (size_t)(slash - path) : 0;
        json_path = malloc(n + 1);
        if (json_path) memcpy(json_path, path, n + 1);
        char *dir = malloc(dn + 2);
        if (dir) {
            if (slash) memcpy(dir, path, dn), dir[dn] = 0;
            else strcpy(dir, ".");
            cfg_path = lmx_path_join(dir, "tokenizer_config.json");
            free(dir);
        }
    }
    lmx_tokenizer *t = calloc(1, sizeof *t);
    if (!json_path || !cfg_path || !t) {
        free(json_path);
        free(cfg_path);
        free(t);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    lmx_tok_bytelevel_tables(t->byte_cp, t->cp_byte);
    t->unk_id = -1;
    char *text = NULL;
    size_t size = 0;
    lmx_status st = lmx_read_file(json_path, &text, &size, err);
    if (!st) {
        cJSON *root = cJSON_ParseWithLength(text, size);
        free(text);
        if (!root) st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: not valid JSON", json_path);
        else {
            st = build(t, root, err);
            cJSON_Delete(root);
            if (st) lmx_err_prefix(err, "%s", json_path);
        }
    }
    if (!st) st = load_config(t, cfg_path, err);
    free(json_path);
    free(cfg_path);
    if (st) {
        lmx_tok_free(t);
        return st;
    }
    *out = t;
    return LMX_OK;
}

void lmx_tok_free(lmx_tokenizer *t) {
    if (!t) return;
    lmx_tok_buf_free(&t->strs);
    free(t->str_off);
    free(t->str_len);
    free(t->flags);
    lmx_tok_smap_free(&t->names);
    lmx_tok_smap_free(&t->enc);
    lmx_tok_map64_free(&t->merges);
    free(t->cont_prefix);
    free(t->eow_suffix);
    lmx_tok_steps_free(t);
    free(t->added);
    lmx_tok_trie_free(&t->trie_raw);
    lmx_tok_trie_free(&t->trie_norm);
    free(t->bos_token);
    free(t->eos_token);
    free(t->pad_token);
    free(t->unk_token);
    free(t->chat_template);
    free(t->note);
    free(t);
}
