/* test_model_errors.c - what lmx does with bad inputs: each broken model directory (built in a
 * mkdtemp folder from the llama fixture) must fail to load with the right lmx_status and a message
 * naming the culprit (file, tensor, model_type); so must patched copies of GGUF files of tests/data/gguf
 * (LMX_TESTS_DATA if set, else tests/data next to this source); bad arguments to the evaluation calls must fail
 * with LMX_ERR_INVALID_ARG and leave the context usable; and `lmx check-reference` must FAIL on a
 * model whose reference comes from another model.
 *
 * Usage: test_model_errors [FIXTURES]   (default: $LMX_FIXTURES, then ../shared/fixtures).
 * The CLI binary comes from $LMX_BIN (that check is skipped without it).
 * LMX_TEST_VERBOSE=1 prints every error message. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/fileio.h"
#include "check.h"
#include "test_files.h"
#include "formats/safetensors.h"
#include "lmx.h"


/* ---- files and folders ----------------------------------------------------------------------- */

static void write_bytes(const char *dir, const char *name, const void *data, size_t n) {
    char *path = lmx_path_join(dir, name);
    FILE *fp = fopen(path, "wb");
    CHECK_MSG(fp != NULL, "cannot create %s", path);
    if (fp) {
        CHECK(n == 0 || fwrite(data, 1, n, fp) == n);
        CHECK(fclose(fp) == 0);
    }
    free(path);
}

/* models/<model>/<file> as a malloc'ed buffer. */
static char *read_fixture(const char *model, const char *file, size_t *n) {
    char *path = fixture(model, file), *data = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(path, &data, n, &err) == LMX_OK, "%s", err.msg);
    free(path);
    return data;
}

/* dir/<file> = the first n - cut bytes of models/<model>/<file>. */
static void copy_fixture(const char *model, const char *file, const char *dir, size_t cut) {
    size_t n = 0;
    char *data = read_fixture(model, file, &n);
    if (data) write_bytes(dir, file, data, n > cut ? n - cut : 0);
    free(data);
}

/* ---- config.json and model.safetensors rewriters --------------------------------------------- */

typedef void (*cfg_edit)(cJSON *root);

/* dir/config.json = models/<model>/config.json edited by edit (NULL: a plain copy). */
static void write_config(const char *model, const char *dir, cfg_edit edit) {
    size_t n = 0;
    char *text = read_fixture(model, "config.json", &n);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK(root != NULL);
    if (root && edit) edit(root);
    char *out = root ? cJSON_Print(root) : NULL;
    if (out) write_bytes(dir, "config.json", out, strlen(out));
    cJSON_free(out);
    cJSON_Delete(root);
    free(text);
}

typedef struct wt_item {
    lmx_st_write_item it;
    void *buf;            /* data allocated by the callback */
} wt_item;

/* Called for each tensor with *out prefilled as an exact copy; returns 0 to leave it out. */
typedef int (*wt_fn)(const lmx_st_tensor *t, wt_item *out);

static void write_weights(const char *model, const char *dir, wt_fn fn) {
    char *src = fixture(model, "model.safetensors"), *dst = lmx_path_join(dir, "model.safetensors");
    lmx_st_file *f = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_open(src, &f, &err) == LMX_OK, "%s", err.msg);
    size_t n = f ? lmx_st_count(f) : 0, k = 0;
    wt_item *items = calloc(n ? n : 1, sizeof *items);
    lmx_st_write_item *w = calloc(n ? n : 1, sizeof *w);
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_at(f, i);
        wt_item *o = &items[k];
        memset(o, 0, sizeof *o);
        o->it.name = t->name;
        o->it.dtype = t->dtype;
        o->it.ndim = t->ndim;
        memcpy(o->it.shape, t->shape, sizeof o->it.shape);
        o->it.data = t->data;
        if (!fn(t, o)) {
            free(o->buf);
            continue;
        }
        w[k++] = o->it;
    }
    if (f) CHECK_MSG(lmx_st_write(dst, w, k, &err) == LMX_OK, "%s", err.msg);
    for (size_t i = 0; i < k; i++) free(items[i].buf);
    free(items);
    free(w);
    lmx_st_close(f);
    free(src);
    free(dst);
}

/* ---- load failures --------------------------------------------------------------------------- */

/* Loading dir must fail with want, leave *out NULL, and say w1 and w2 in lmx_last_error(NULL). */
static void expect_load_fail(const char *label, const char *dir, const char *backend, lmx_status want,
                             const char *w1, const char *w2) {
    static int sentinel;
    lmx_model *m = (lmx_model *)(void *)&sentinel;
    lmx_load_params lp = lmx_load_default_params();
    if (backend) lp.backend = backend;
    lmx_status s = lmx_model_load(dir, &lp, &m);
    if (!check_failed(label, s, want, m == NULL, lmx_last_error(NULL), w1, w2)) lmx_model_free(m);
}

/* A folder holding llama's config (edited by edit) and weights (rewritten by fn, or copied). */
static char *llama_dir(cfg_edit edit, wt_fn fn) {
    char *dir = case_dir("llama");
    write_config("llama", dir, edit);
    if (fn) write_weights("llama", dir, fn);
    else copy_fixture("llama", "model.safetensors", dir, 0);
    return dir;
}

static void edit_mamba(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(r, "model_type");
    cJSON_AddStringToObject(r, "model_type", "mamba");
}
static void edit_no_type(cJSON *r) { cJSON_DeleteItemFromObjectCaseSensitive(r, "model_type"); }
static void edit_yarn(cJSON *r) {
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(r, "rope_scaling");
    cJSON_DeleteItemFromObjectCaseSensitive(rs, "rope_type");
    cJSON_AddStringToObject(rs, "rope_type", "yarn");
}
static void edit_untied(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(r, "tie_word_embeddings");
    cJSON_AddFalseToObject(r, "tie_word_embeddings");
}
static void edit_kv_heads(cJSON *r) { /* 4 heads, 3 kv heads */
    cJSON_DeleteItemFromObjectCaseSensitive(r, "num_key_value_heads");
    cJSON_AddNumberToObject(r, "num_key_value_heads", 3);
}

static int drop_up_proj(const lmx_st_tensor *t, wt_item *o) {
    return strcmp(t->name, "model.layers.1.mlp.up_proj.weight") != 0;
}
static int short_q_proj(const lmx_st_tensor *t, wt_item *o) {
    if (!strcmp(t->name, "model.layers.1.self_attn.q_proj.weight")) o->it.shape[0]--; /* first rows */
    return 1;
}
static int norm_as_i32(const lmx_st_tensor *t, wt_item *o) {
    if (!strcmp(t->name, "model.norm.weight")) {
        o->buf = calloc((size_t)t->n_elements, sizeof(int32_t));
        o->it.data = o->buf;
        o->it.dtype = LMX_DTYPE_I32;
    }
    return 1;
}

static void case_bad_weights(void) {
    char *dir = case_dir("truncated");
    write_config("llama", dir, NULL);
    copy_fixture("llama", "model.safetensors", dir, 1000);
    expect_load_fail("truncated weights", dir, NULL, LMX_ERR_FORMAT, "model.safetensors", NULL);
    end_case(dir);

    /* a header length beyond the end of the file, and one that cuts the JSON short */
    for (int i = 0; i < 2; i++) {
        dir = case_dir("header");
        write_config("llama", dir, NULL);
        size_t n = 0;
        unsigned char *data = (unsigned char *)read_fixture("llama", "model.safetensors", &n);
        uint64_t h = 0;
        for (int b = 0; data && b < 8; b++) h |= (uint64_t)data[b] << (8 * b);
        h = i == 0 ? (uint64_t)n : h - 16;
        for (int b = 0; data && b < 8; b++) data[b] = (unsigned char)(h >> (8 * b));
        if (data) write_bytes(dir, "model.safetensors", data, n);
        expect_load_fail(i == 0 ? "header length too long" : "header length too short", dir, NULL, LMX_ERR_FORMAT,
                         "model.safetensors", NULL);
        free(data);
        end_case(dir);
    }

    dir = llama_dir(NULL, drop_up_proj);
    expect_load_fail("missing tensor", dir, NULL, LMX_ERR_MISSING, "model.layers.1.mlp.up_proj.weight", NULL);
    end_case(dir);

    dir = llama_dir(NULL, short_q_proj);
    expect_load_fail("q_proj one row short", dir, NULL, LMX_ERR_SHAPE, "model.layers.1.self_attn.q_proj.weight",
                     "63");
    end_case(dir);

    dir = llama_dir(NULL, norm_as_i32);
    expect_load_fail("I32 weight", dir, NULL, LMX_ERR_UNSUPPORTED, "model.norm.weight", "i32");
    end_case(dir);

    dir = llama_dir(edit_untied, NULL);
    expect_load_fail("untied without lm_head", dir, NULL, LMX_ERR_MISSING, "lm_head.weight", NULL);
    end_case(dir);
}

/* qwen3_moe's config with key set to v (NULL: removed) */
static const char *moe_key;
static double moe_val;
static void edit_moe(cJSON *r) {
    cJSON_DeleteItemFromObjectCaseSensitive(r, moe_key);
    cJSON_DeleteItemFromObjectCaseSensitive(r, "num_local_experts");
    if (strcmp(moe_key, "num_local_experts")) cJSON_AddNumberToObject(r, "num_local_experts", 8);
    cJSON_AddNumberToObject(r, moe_key, moe_val);
}
static void expect_moe_fail(const char *key, double v, const char *w1) {
    char *dir = case_dir("qwen3_moe");
    moe_key = key, moe_val = v;
    write_config("qwen3_moe", dir, edit_moe);
    copy_fixture("qwen3_moe", "model.safetensors", dir, 0);
    char label[96];
    snprintf(label, sizeof label, "qwen3_moe with %s %g", key, v);
    expect_load_fail(label, dir, NULL, LMX_ERR_FORMAT, key, w1);
    end_case(dir);
}

/* A gemma4 fixture's config with the keys of a JSON object patch set (replacing the fixture's). */
static const char *g4_patch;
static void edit_gemma4(cJSON *r) {
    cJSON *p = cJSON_Parse(g4_patch), *e;
    CHECK_MSG(p != NULL, "bad patch %s", g4_patch);
    cJSON_ArrayForEach(e, p) {
        cJSON_DeleteItemFromObjectCaseSensitive(r, e->string);
        cJSON_AddItemToObject(r, e->string, cJSON_Duplicate(e, 1));
    }
    cJSON_Delete(p);
}
static void expect_gemma4_fail(const char *model, const char *patch, lmx_status want, const char *w1, const char *w2) {
    char *dir = case_dir(model);
    g4_patch = patch;
    write_config(model, dir, edit_gemma4);
    copy_fixture(model, "model.safetensors", dir, 0);
    char label[160];
    snprintf(label, sizeof label, "%s with %s", model, patch);
    expect_load_fail(label, dir, NULL, want, w1, w2);
    end_case(dir);
}

/* Gemma 4's config keys: experts, per-layer head sizes, shared KV. */
static void case_bad_gemma4(void) {
    expect_gemma4_fail("gemma4_moe", "{\"num_experts\": 0}", LMX_ERR_FORMAT, "\"num_experts\"", "positive");
    expect_gemma4_fail("gemma4_moe", "{\"num_experts\": null}", LMX_ERR_FORMAT, "\"num_experts\"", "positive");
    expect_gemma4_fail("gemma4_moe", "{\"top_k_experts\": 5}", LMX_ERR_FORMAT, "\"top_k_experts\" 5", "num_experts = 4");
    expect_gemma4_fail("gemma4_moe", "{\"top_k_experts\": null}", LMX_ERR_MISSING, "\"top_k_experts\"", NULL);
    expect_gemma4_fail("gemma4_moe", "{\"moe_intermediate_size\": 0}", LMX_ERR_FORMAT, "\"moe_intermediate_size\"", NULL);
    /* experts of another width than the checkpoint's: the stacked tensor's shape is named */
    expect_gemma4_fail("gemma4_moe", "{\"moe_intermediate_size\": 16}", LMX_ERR_SHAPE, "experts.gate_up_proj",
                       "[4, 32, 64]");
    expect_gemma4_fail("gemma4", "{\"per_layer_config\": {\"5\": {\"num_key_value_heads\": 3}}}", LMX_ERR_FORMAT,
                       "layer 5", "\"num_key_value_heads\" 3");
    expect_gemma4_fail("gemma4", "{\"per_layer_config\": {\"05\": {\"head_dim\": 33}}}", LMX_ERR_FORMAT, "layer 5",
                       "\"head_dim\" 33");
    expect_gemma4_fail("gemma4", "{\"per_layer_config\": {\"6\": {\"head_dim\": 32}}}", LMX_ERR_FORMAT,
                       "per_layer_config", "\"6\"");
    expect_gemma4_fail("gemma4", "{\"per_layer_config\": {\"5\": {\"intermediate_size\": 64}}}", LMX_ERR_UNSUPPORTED,
                       "per_layer_config", "intermediate_size");
    expect_gemma4_fail("gemma4", "{\"num_attention_heads\": 3}", LMX_ERR_FORMAT, "heads", NULL);
    expect_gemma4_fail("gemma4_kv", "{\"num_kv_shared_layers\": 12}", LMX_ERR_FORMAT, "\"num_kv_shared_layers\" 12",
                       "12 layers");
    expect_gemma4_fail("gemma4_kv", "{\"num_kv_shared_layers\": 7}", LMX_ERR_FORMAT, "\"num_kv_shared_layers\" 7",
                       "layer 5");
    expect_gemma4_fail("gemma4", "{\"use_bidirectional_attention\": \"all\"}", LMX_ERR_UNSUPPORTED,
                       "use_bidirectional_attention", NULL);
    expect_gemma4_fail("gemma4", "{\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"proportional\", "
                       "\"rope_theta\": 1e6, \"partial_rotary_factor\": 1.5}}}", LMX_ERR_FORMAT, "partial_rotary_factor",
                       NULL);
}

/* ---- GGUF files: copies of tests/data/gguf's with one name or value patched in place ------------- */

/* tests/data/gguf/<file> (LMX_TESTS_DATA/gguf if set) as a malloc'ed buffer. */
static unsigned char *read_gguf_data(const char *file, size_t *n) {
    char dir[900], path[1024];
    test_data_dir(dir, sizeof dir, "gguf");
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *data = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(path, &data, n, &err) == LMX_OK, "%s", err.msg);
    return (unsigned char *)data;
}

/* The first occurrence of the string s in data[0, n), or NULL. */
static unsigned char *find_bytes(unsigned char *data, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; data && i + k <= n; i++)
        if (!memcmp(data + i, s, k)) return data + i;
    return NULL;
}

/* <file> with the tensor name `from` renamed to `to` (same length) or, with to NULL, the u32 metadata value
 * of the key `from` set to v, must fail to load with want and a message saying w1 and w2. */
static void expect_gguf_fail(const char *file, const char *from, const char *to, uint32_t v, lmx_status want,
                             const char *w1, const char *w2) {
    size_t n = 0;
    unsigned char *data = read_gguf_data(file, &n), *at = find_bytes(data, n, from);
    CHECK_MSG(at != NULL, "%s holds no %s", file, from);
    if (!at) {
        free(data);
        return;
    }
    if (to) {
        memcpy(at, to, strlen(to));
    } else { /* key, then its u32 value type (4) and the value, little-endian */
        unsigned char *p = at + strlen(from);
        CHECK(p + 8 <= data + n && p[0] == 4 && !p[1] && !p[2] && !p[3]);
        for (int b = 0; b < 4 && p + 8 <= data + n; b++) p[4 + b] = (unsigned char)(v >> (8 * b));
    }
    char *dir = case_dir("gguf"), *path = lmx_path_join(dir, file), label[200];
    write_bytes(dir, file, data, n);
    snprintf(label, sizeof label, "%s with %s %s", file, from, to ? to : "patched");
    expect_load_fail(label, path, NULL, want, w1, w2);
    free(path);
    free(data);
    end_case(dir);
}

/* GGUF copies of the qwen3_moe and gemma4_moe fixtures: a missing expert tensor, expert counts and shared
 * KV layers out of range, experts of another width than the stacked tensors. */
static void case_bad_gguf(void) {
    expect_gguf_fail("qwen3_moe.gguf", "blk.1.ffn_up_exps.weight", "blk.1.ffn_up_exps.weighX", 0, LMX_ERR_MISSING,
                     "\"blk.1.ffn_up_exps.weight\"", NULL);
    expect_gguf_fail("qwen3_moe.gguf", "blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_inp.weighX", 0, LMX_ERR_MISSING,
                     "\"blk.0.ffn_gate_inp.weight\"", NULL);
    expect_gguf_fail("qwen3_moe.gguf", "qwen3moe.expert_used_count", NULL, 9, LMX_ERR_FORMAT,
                     "\"qwen3moe.expert_used_count\" = 9", "expert_count = 8");
    expect_gguf_fail("qwen3_moe.gguf", "qwen3moe.expert_count", NULL, 0, LMX_ERR_FORMAT, "\"qwen3moe.expert_count\"",
                     "positive");
    expect_gguf_fail("qwen3_moe.gguf", "qwen3moe.expert_feed_forward_length", NULL, 16, LMX_ERR_SHAPE,
                     "\"blk.0.ffn_gate_exps.weight\"", "[8, 32, 64]");
    expect_gguf_fail("gemma4_moe.gguf", "gemma4.attention.shared_kv_layers", NULL, 6, LMX_ERR_FORMAT,
                     "\"gemma4.attention.shared_kv_layers\" = 6", "6 layers");
    expect_gguf_fail("gemma4_moe.gguf", "blk.2.ffn_gate_inp.scale", "blk.2.ffn_gate_inp.scalX", 0, LMX_ERR_MISSING,
                     "\"blk.2.ffn_gate_inp.scale\"", NULL);
    expect_gguf_fail("gemma4_moe.gguf", "blk.3.ffn_gate_up_exps.weight", "blk.3.ffn_gate_up_exps.weighX", 0,
                     LMX_ERR_MISSING, "\"blk.3.ffn_gate_up_exps.weight\"", NULL);
}

static void case_bad_config(void) {
    expect_moe_fail("num_local_experts", 0, "positive");
    expect_moe_fail("num_experts_per_tok", 9, "num_local_experts = 8");
    expect_moe_fail("moe_intermediate_size", 0, NULL);
    char *dir = llama_dir(edit_mamba, NULL);
    expect_load_fail("model_type mamba", dir, NULL, LMX_ERR_UNSUPPORTED, "mamba", NULL);
    end_case(dir);

    dir = llama_dir(edit_no_type, NULL); /* llama weights have neither q_norm nor q_proj.bias */
    expect_load_fail("no model_type, llama weights", dir, NULL, LMX_ERR_UNSUPPORTED, "model_type", NULL);
    end_case(dir);

    dir = llama_dir(edit_yarn, NULL);
    expect_load_fail("rope type yarn", dir, NULL, LMX_ERR_UNSUPPORTED, "yarn", NULL);
    end_case(dir);

    dir = llama_dir(edit_kv_heads, NULL);
    static int sentinel;
    lmx_model *m = (lmx_model *)(void *)&sentinel;
    lmx_status s = lmx_model_load(dir, NULL, &m);
    CHECK_MSG(s != LMX_OK && m == NULL, "4 heads over 3 kv heads: got %s", lmx_status_str(s));
    if (s == LMX_OK) lmx_model_free(m);
    else CHECK_CONTAINS(lmx_last_error(NULL), "heads");
    end_case(dir);

    dir = case_dir("notjson");
    static const char not_json[] = "{\"model_type\": \"llama\", \"hidden_size\": 64,";
    write_bytes(dir, "config.json", not_json, sizeof not_json - 1);
    copy_fixture("llama", "model.safetensors", dir, 0);
    expect_load_fail("config.json not JSON", dir, NULL, LMX_ERR_FORMAT, "config.json", NULL);
    end_case(dir);

    dir = case_dir("noconfig");
    copy_fixture("llama", "model.safetensors", dir, 0);
    expect_load_fail("no config.json", dir, NULL, LMX_ERR_IO, "config.json", NULL);
    end_case(dir);

    dir = case_dir("noweights");
    write_config("llama", dir, NULL);
    expect_load_fail("no safetensors", dir, NULL, LMX_ERR_MISSING, "safetensors", NULL);
    char *gone = lmx_path_join(dir, "no_such_model");
    expect_load_fail("nonexistent directory", gone, NULL, LMX_ERR_IO, "no_such_model", NULL);
    free(gone);
    end_case(dir);

    char *llama = fixture("llama", NULL);
    expect_load_fail("backend nonsense", llama, "nonsense", LMX_ERR_BACKEND, "nonsense", NULL);
    CHECK(lmx_model_load(llama, NULL, NULL) == LMX_ERR_INVALID_ARG);
    free(llama);
}

/* ---- evaluation errors ----------------------------------------------------------------------- */


/* Row t of the reference's short_logits within the f32 tolerance of out. */
static int row_ok(const lmx_st_set *ref, int64_t t, const float *out, int V) {
    const lmx_st_tensor *r = lmx_st_set_find(ref, "short_logits");
    if (!r || r->dtype != LMX_DTYPE_F32 || r->ndim != 2 || r->shape[1] != V || t >= r->shape[0]) return 0;
    return f32_tol_ratio(out, (const char *)r->data + (size_t)t * V * 4, V) <= 1;
}

static void expect_eval_fail(lmx_model *m, lmx_context *c, const int32_t *tok, int n, const char *word,
                             const char *label) {
    int past = lmx_context_n_past(c);
    float logits[320 * 4];
    lmx_status s = lmx_context_eval(c, tok, n, logits, 1);
    CHECK_MSG(s == LMX_ERR_INVALID_ARG, "%s: got %s", label, lmx_status_str(s));
    if (word) CHECK_CONTAINS(lmx_last_error(m), word);
    CHECK_MSG(lmx_context_n_past(c) == past, "%s: n_past moved from %d to %d", label, past, lmx_context_n_past(c));
    if (getenv("LMX_TEST_VERBOSE")) printf("  %-28s %s\n", label, lmx_last_error(m));
}

static void case_bad_eval(void) {
    char *dir = fixture("llama", NULL), *refp = fixture("llama", "reference.safetensors");
    lmx_model *m = NULL, *other = NULL;
    lmx_st_set *ref = NULL;
    lmx_err err = {0};
    lmx_context *c = NULL, *c2 = NULL, *c3 = NULL;
    int64_t L = 0, P = 0;
    int32_t *seq = NULL, *prompt = NULL;
    lmx_model_info in = {0};
    int ok = lmx_model_load(dir, NULL, &m) == LMX_OK && lmx_model_load(dir, NULL, &other) == LMX_OK &&
             lmx_st_set_open_file(refp, &ref, &err) == LMX_OK && lmx_model_get_info(m, &in) == LMX_OK &&
             in.vocab_size == 320 && lmx_context_create(m, NULL, &c) == LMX_OK &&
             lmx_context_create(m, NULL, &c2) == LMX_OK && lmx_context_create(other, NULL, &c3) == LMX_OK &&
             (seq = ref_ints(ref, "short_sequence", &L)) && (prompt = ref_ints(ref, "short_prompt", &P)) && P < L;
    CHECK_MSG(ok, "eval errors: setup failed: %s %s", lmx_last_error(NULL), err.msg);
    if (!ok) goto done;
    int V = in.vocab_size;
    float *logits = malloc((size_t)L * V * sizeof *logits);

    /* out-of-range ids before anything is cached, and in the middle of a sequence */
    const int32_t big[3] = {1, V, 2}, neg[1] = {-1};
    expect_eval_fail(m, c, big, 3, "320", "token id == vocab_size");
    expect_eval_fail(m, c, neg, 1, "-1", "token id -1");
    CHECK(lmx_context_eval(c, prompt, (int)P, logits, 1) == LMX_OK);
    for (int64_t t = 0; t < P; t++) CHECK_MSG(row_ok(ref, t, logits + t * V, V), "prompt row %lld", (long long)t);
    expect_eval_fail(m, c, neg, 1, "-1", "decode token id -1");
    const int32_t huge[1] = {INT32_MAX};
    expect_eval_fail(m, c, huge, 1, "2147483647", "decode token id INT32_MAX");
    { /* a bad id past the first 512-token prefill chunk: nothing may be cached */
        int32_t *many = malloc(600 * sizeof *many);
        for (int i = 0; many && i < 600; i++) many[i] = i == 550 ? V : 1;
        int past2 = lmx_context_n_past(c2);
        CHECK(many && lmx_context_eval(c2, many, 600, NULL, 0) == LMX_ERR_INVALID_ARG);
        CHECK_MSG(lmx_context_n_past(c2) == past2, "600-token eval with a bad id at 550 moved n_past to %d",
                  lmx_context_n_past(c2));
        free(many);
    }
    CHECK(lmx_context_eval(c, NULL, 1, logits, 0) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_context_eval(c, seq, 0, logits, 0) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_context_eval(NULL, seq, 1, logits, 0) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_context_n_past(c) == (int)P);
    /* the context still works: decoding the rest of the sequence gives the reference logits */
    for (int64_t t = P; t < L - 1; t++) {
        lmx_status s = lmx_context_eval(c, &seq[t], 1, logits, 0);
        CHECK_MSG(s == LMX_OK && row_ok(ref, t, logits, V), "decode after errors, position %lld: %s",
                  (long long)t, lmx_last_error(m));
    }

    /* lmx_eval_batch: lengths outside [1, T], a context twice, a context of another model */
    const int32_t toks[2 * 4] = {1, 5, 9, 0, 2, 6, 10, 11};
    lmx_context *pair[2] = {c2, c3}, *same[2] = {c2, c2}, *good[2] = {c2, c};
    struct { lmx_context **ctxs; int lens[2]; const char *word, *label; } bad[] = {
        {good, {0, 3}, "length 0", "batch length 0"},
        {good, {4, 5}, "length 5", "batch length > T"},
        {good, {-1, 2}, "length -1", "batch length -1"},
        {same, {2, 3}, "twice", "same context twice"},
        {pair, {2, 3}, "does not belong", "context of another model"},
    };
    int past_c = lmx_context_n_past(c);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lmx_status s = lmx_eval_batch(m, bad[i].ctxs, 2, toks, bad[i].lens, 4, logits);
        CHECK_MSG(s == LMX_ERR_INVALID_ARG, "%s: got %s", bad[i].label, lmx_status_str(s));
        CHECK_CONTAINS(lmx_last_error(m), bad[i].word);
        CHECK(lmx_context_n_past(c2) == 0 && lmx_context_n_past(c) == past_c);
        if (getenv("LMX_TEST_VERBOSE")) printf("  %-28s %s\n", bad[i].label, lmx_last_error(m));
    }
    const int lens_ok[2] = {3, 4};
    CHECK(lmx_eval_batch(m, good, 0, toks, lens_ok, 4, logits) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_eval_batch(m, good, 2, toks, lens_ok, 0, logits) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_eval_batch(NULL, good, 2, toks, lens_ok, 4, logits) == LMX_ERR_INVALID_ARG);
    /* a valid batch still works after the failures */
    lmx_context *fresh[2] = {c2, c3};
    fresh[1] = NULL;
    CHECK(lmx_context_create(m, NULL, &fresh[1]) == LMX_OK);
    lmx_status s = lmx_eval_batch(m, fresh, 2, toks, lens_ok, 4, logits);
    CHECK_MSG(s == LMX_OK, "valid batch after errors: %s", lmx_last_error(m));
    CHECK(lmx_context_n_past(c2) == 3 && lmx_context_n_past(fresh[1]) == 4);
    lmx_context_free(fresh[1]);
    free(logits);
done:
    lmx_context_free(c);
    lmx_context_free(c2);
    lmx_context_free(c3);
    lmx_model_free(m);
    lmx_model_free(other);
    lmx_st_set_close(ref);
    free(seq);
    free(prompt);
    free(refp);
    free(dir);
}

/* ---- odds and ends --------------------------------------------------------------------------- */

static void case_api_misc(void) {
    lmx_model_free(NULL);
    lmx_context_free(NULL);
    lmx_context_reset(NULL);
    CHECK(lmx_context_n_past(NULL) == 0);
    CHECK(lmx_model_get_info(NULL, NULL) == LMX_ERR_INVALID_ARG);
    for (int s = LMX_OK; s <= LMX_ERR_CONTEXT_FULL; s++) {
        const char *name = lmx_status_str((lmx_status)s);
        CHECK_MSG(name && *name, "lmx_status_str(%d) is empty", s);
        for (int o = LMX_OK; name && o < s; o++)
            CHECK_MSG(strcmp(name, lmx_status_str((lmx_status)o)) != 0, "statuses %d and %d share \"%s\"", o, s, name);
    }
}

/* Run `$LMX_BIN check-reference dir`; returns its exit status (-1 if it did not exit) and its
 * output in out. */
static int run_check_reference(const char *bin, const char *dir, char *out, size_t cap) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' check-reference '%s' 2>&1", bin, dir);
    FILE *p = popen(cmd, "r");
    CHECK_MSG(p != NULL, "cannot run %s", cmd);
    if (!p) return -1;
    size_t n = 0, k;
    while (n + 1 < cap && (k = fread(out + n, 1, cap - 1 - n, p)) > 0) n += k;
    out[n] = '\0';
    char sink[256];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void case_check_reference_fails(void) {
    const char *bin = getenv("LMX_BIN");
    if (!bin || !*bin) {
        printf("  check-reference: SKIPPED, LMX_BIN is not set\n");
        return;
    }
    char *dir = case_dir("checkref");
    static char out[1 << 16];
    copy_fixture("gemma3", "config.json", dir, 0);
    copy_fixture("gemma3", "model.safetensors", dir, 0);
    copy_fixture("gemma3", "reference.safetensors", dir, 0);
    int rc = run_check_reference(bin, dir, out, sizeof out);  /* control: its own reference */
    CHECK_MSG(rc == 0, "check-reference with gemma3's own reference: exit %d:\n%s", rc, out);
    char *path = lmx_path_join(dir, "reference.safetensors");
    CHECK(unlink(path) == 0);
    free(path);
    copy_fixture("gemma3_scaled", "reference.safetensors", dir, 0);
    rc = run_check_reference(bin, dir, out, sizeof out);
    CHECK_MSG(rc == 1, "check-reference with gemma3_scaled's reference: exit %d, want 1:\n%s", rc, out);
    CHECK_CONTAINS(out, "FAIL");
    if (getenv("LMX_TEST_VERBOSE")) printf("%s", out);
    end_case(dir);
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");

    case_bad_weights();
    case_bad_config();
    case_bad_gemma4();
    case_bad_gguf();
    case_bad_eval();
    case_api_misc();
    case_check_reference_fails();
    return check_summary("test_model_errors");
}
