/* test_model_variants.c - checkpoint and config variants of the fixture models must give the
 * fixture's reference logits (computed independently, see the fixtures README):
 *   a. a sharded checkpoint (2 shards + model.safetensors.index.json);
 *   b. the multimodal gemma3 layout (text_config, language_model.model.* / model.language_model.*) and
 *      gemma4's (text_config, model.language_model.*);
 *   c. no model_type (architecture detected from the weights);
 *   d. no head_dim (inferred from q_proj);
 *   e. F32 and F16 weights converted from the BF16 ones;
 *   f. gemma3_scaled rewritten with legacy config keys;
 *   g. a context with n_ctx set (rotating caches on every layer, nothing evicted);
 *   h. padded batches, and a second batch continuing from the cached positions;
 *   i. a sequence evaluated a few rows at a time (chunks after cached positions: rotating sliding
 *      caches, gemma4's shared KV).
 * Each variant is built in its own mkdtemp folder (removed at the end) from a fixture's
 * config.json (rewritten with cJSON) and model.safetensors (rewritten with lmx_st_write).
 *
 * Usage: test_model_variants [FIXTURES]   (default: $LMX_FIXTURES, then ../shared/fixtures). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/half.h"
#include "check.h"
#include "test_files.h"
#include "formats/safetensors.h"
#include "lmx.h"


/* ---- files and folders ----------------------------------------------------------------------- */

/* "<fixtures>/models/<model>[/<file>]" (malloc'ed). */
static void write_text(const char *dir, const char *name, const char *text) {
    char *path = lmx_path_join(dir, name);
    FILE *fp = fopen(path, "wb");
    CHECK_MSG(fp != NULL, "cannot create %s", path);
    if (fp) {
        CHECK(fputs(text, fp) >= 0);
        CHECK(fclose(fp) == 0);
    }
    free(path);
}

/* Copy models/<model>/<file> to dir/<file>. */
static void copy_fixture(const char *model, const char *file, const char *dir) {
    char *src = fixture(model, file), *dst = lmx_path_join(dir, file);
    FILE *in = fopen(src, "rb"), *out = in ? fopen(dst, "wb") : NULL;
    int ok = in && out;
    char buf[1 << 16];
    size_t n;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in && ferror(in)) ok = 0;
    if (in) fclose(in);
    if (out && fclose(out) != 0) ok = 0;
    CHECK_MSG(ok, "cannot copy %s to %s", src, dst);
    free(src);
    free(dst);
}

/* ---- config.json ----------------------------------------------------------------------------- */

/* Edits the parsed config in place, or returns a new root that owns it. */
typedef cJSON *(*cfg_edit)(cJSON *root, const void *arg);

/* dir/config.json = edit(models/<model>/config.json); generation_config.json copied as is. */
static void write_config(const char *model, const char *dir, cfg_edit edit, const void *arg) {
    char *src = fixture(model, "config.json"), *text = NULL;
    size_t n = 0;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(src, &text, &n, &err) == LMX_OK, "%s", err.msg);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(root != NULL, "%s is not JSON", src);
    if (root && edit) root = edit(root, arg);
    char *out = root ? cJSON_Print(root) : NULL;
    if (out) write_text(dir, "config.json", out);
    cJSON_free(out);
    cJSON_Delete(root);
    free(text);
    free(src);
    copy_fixture(model, "generation_config.json", dir);
}

static void set_num(cJSON *o, const char *key, double v) {
    cJSON_DeleteItemFromObjectCaseSensitive(o, key);
    cJSON_AddNumberToObject(o, key, v);
}

static cJSON *drop_key(cJSON *root, const void *key) {
    cJSON_DeleteItemFromObjectCaseSensitive(root, (const char *)key);
    return root;
}

/* ---- model.safetensors ----------------------------------------------------------------------- */

typedef struct wt_item {
    lmx_st_write_item it;   /* it.name is set to name after the callback */
    char name[256];
    void *buf;              /* data allocated by the callback (freed after writing) */
} wt_item;

/* Called for tensor i of the source with *out prefilled as an exact copy; may rename it, change
 * its dtype/shape/data (allocating out->buf).  Returns 0 to leave the tensor out. */
typedef int (*wt_fn)(void *ud, size_t i, const lmx_st_tensor *t, wt_item *out);

/* Write dst from models/<model>/model.safetensors through fn (NULL: copy). */
static void write_weights(const char *model, const char *dst, wt_fn fn, void *ud) {
    char *src = fixture(model, "model.safetensors");
    lmx_st_file *f = NULL;
    lmx_err err = {0};
    lmx_status s = lmx_st_open(src, &f, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    size_t n = f ? lmx_st_count(f) : 0, k = 0;
    wt_item *items = calloc(n ? n : 1, sizeof *items);
    lmx_st_write_item *w = calloc(n ? n : 1, sizeof *w);
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_at(f, i);
        wt_item *o = &items[k];
        memset(o, 0, sizeof *o);
        snprintf(o->name, sizeof o->name, "%s", t->name);
        o->it.dtype = t->dtype;
        o->it.ndim = t->ndim;
        memcpy(o->it.shape, t->shape, sizeof o->it.shape);
        o->it.data = t->data;
        if (fn && !fn(ud, i, t, o)) {
            free(o->buf);
            o->buf = NULL;
            continue;
        }
        o->it.name = o->name;
        w[k++] = o->it;
    }
    if (f) {
        s = lmx_st_write(dst, w, k, &err);
        CHECK_MSG(s == LMX_OK, "writing %s: %s", dst, err.msg);
    }
    for (size_t i = 0; i < k; i++) free(items[i].buf);
    free(items);
    free(w);
    lmx_st_close(f);
    free(src);
}

/* BF16 data of t widened to F32 or F16 (malloc'ed). */
static void *convert_bf16(const lmx_st_tensor *t, lmx_dtype to) {
    size_t es = to == LMX_DTYPE_F32 ? 4 : 2;
    unsigned char *out = malloc((size_t)(t->n_elements ? t->n_elements : 1) * es);
    for (int64_t i = 0; i < t->n_elements; i++) {
        uint16_t h;
        memcpy(&h, (const char *)t->data + 2 * i, 2);
        float x = lmx_bf16_to_f32(h);
        if (to == LMX_DTYPE_F32) {
            memcpy(out + 4 * i, &x, 4);
        } else {
            uint16_t g = lmx_f32_to_f16(x);
            memcpy(out + 2 * i, &g, 2);
        }
    }
    return out;
}

/* ---- references ------------------------------------------------------------------------------ */

static lmx_st_set *open_ref(const char *model) {
    char *path = fixture(model, "reference.safetensors");
    lmx_st_set *s = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_set_open_file(path, &s, &err) == LMX_OK, "%s", err.msg);
    free(path);
    return s;
}


/* An F32 [rows, V] reference tensor as a fresh array; NULL if absent or of another shape. */
static float *ref_floats(const lmx_st_set *s, const char *name, int64_t rows, int V) {
    const lmx_st_tensor *t = s ? lmx_st_set_find(s, name) : NULL;
    int ok = t && t->dtype == LMX_DTYPE_F32 && t->ndim == 2 && t->shape[0] == rows && t->shape[1] == V;
    CHECK_MSG(ok, "reference %s missing or not F32 [%lld, %d]", name, (long long)rows, V);
    if (!ok) return NULL;
    float *out = malloc(t->nbytes);
    memcpy(out, t->data, t->nbytes);
    return out;
}

/* Worst f32 ratio over rows (a row-major [rows, V] pair). */
static double worst_ratio(const float *out, const float *ref, int rows, int V, int *at) {
    double worst = 0;
    *at = -1;
    for (int t = 0; t < rows; t++) {
        double r = f32_tol_ratio(out + (size_t)t * V, ref + (size_t)t * V, V);
        if (!(r <= worst)) { worst = r; *at = t; }
    }
    return worst;
}

static int vocab_of(const lmx_model *m) {
    lmx_model_info in;
    return lmx_model_get_info(m, &in) == LMX_OK ? in.vocab_size : 0;
}

/* Prefill of short_sequence[:-1] with all logits; returns the worst f32 ratio against the
 * reference of `model` (INFINITY when the evaluation fails). */
static double short_ratio(lmx_model *m, const char *model) {
    lmx_st_set *ref = open_ref(model);
    int V = vocab_of(m);
    int64_t L = 0;
    int32_t *seq = ref_ints(ref, "short_sequence", &L);
    float *want = seq ? ref_floats(ref, "short_logits", L - 1, V) : NULL;
    float *out = want ? malloc((size_t)L * V * sizeof *out) : NULL;
    double worst = INFINITY;
    lmx_context *c = NULL;
    if (out && lmx_context_create(m, NULL, &c) == LMX_OK) {
        lmx_status s = lmx_context_eval(c, seq, (int)L - 1, out, 1);
        CHECK_MSG(s == LMX_OK, "eval: %s: %s", lmx_status_str(s), lmx_last_error(m));
        int at;
        if (s == LMX_OK) worst = worst_ratio(out, want, (int)L - 1, V, &at);
    }
    lmx_context_free(c);
    free(out);
    free(want);
    free(seq);
    lmx_st_set_close(ref);
    return worst;
}

static lmx_model *load(const char *dir, const char *label) {
    lmx_model *m = NULL;
    lmx_status s = lmx_model_load(dir, NULL, &m);
    CHECK_MSG(s == LMX_OK, "%s: load: %s: %s", label, lmx_status_str(s), lmx_last_error(NULL));
    return m;
}

/* Load dir, check its architecture (when arch) and its short logits against model's reference. */
static lmx_model *load_and_check(const char *dir, const char *model, const char *arch, const char *label) {
    lmx_model *m = load(dir, label);
    if (!m) return NULL;
    lmx_model_info in;
    CHECK(lmx_model_get_info(m, &in) == LMX_OK);
    if (arch) CHECK_MSG(!strcmp(in.architecture, arch), "%s: architecture %s, want %s", label, in.architecture, arch);
    double r = short_ratio(m, model);
    CHECK_MSG(r <= 1.0, "%s: short logits error/tolerance %.3f vs %s's reference", label, r, model);
    printf("  %-34s %-7s %-4s short err/tol %.4f\n", label, in.architecture, in.dtype, r);
    return m;
}

static void check_variant(const char *dir, const char *model, const char *arch, const char *label) {
    lmx_model_free(load_and_check(dir, model, arch, label));
}

/* ---- a. sharded checkpoint ------------------------------------------------------------------- */

typedef struct shard_ud {
    int shard;            /* keep tensors with i % 2 == shard */
    const char *file;
    cJSON *map;           /* weight_map being built */
    int64_t total;
} shard_ud;

static int shard_fn(void *ud, size_t i, const lmx_st_tensor *t, wt_item *out) {
    shard_ud *u = ud;
    if ((int)(i % 2) != u->shard) return 0;
    cJSON_AddStringToObject(u->map, t->name, u->file);
    u->total += (int64_t)t->nbytes;
    return 1;
}

static void case_sharded(void) {
    char *dir = case_dir("sharded");
    write_config("llama", dir, NULL, NULL);
    static const char *files[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    cJSON *index = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(index, "metadata");
    shard_ud u = {0, NULL, cJSON_AddObjectToObject(index, "weight_map"), 0};
    for (int s = 0; s < 2; s++) {
        char *path = lmx_path_join(dir, files[s]);
        u.shard = s;
        u.file = files[s];
        write_weights("llama", path, shard_fn, &u);
        free(path);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)u.total);
    char *text = cJSON_Print(index);
    write_text(dir, "model.safetensors.index.json", text);
    cJSON_free(text);
    cJSON_Delete(index);

    lmx_model *m = load_and_check(dir, "llama", "llama", "a. sharded (2 files + index)");
    char *plain = fixture("llama", NULL);
    lmx_model *p = load(plain, "llama fixture");
    lmx_model_info a, b;
    if (m && p && lmx_model_get_info(m, &a) == LMX_OK && lmx_model_get_info(p, &b) == LMX_OK)
        CHECK_MSG(a.n_params == b.n_params && a.weight_bytes == b.weight_bytes,
                  "sharded: %lld params / %lld bytes, plain %lld / %lld", (long long)a.n_params,
                  (long long)a.weight_bytes, (long long)b.n_params, (long long)b.weight_bytes);
    lmx_model_free(p);
    lmx_model_free(m);
    free(plain);
    end_case(dir);
}

/* ---- b. multimodal gemma3 and gemma4 layouts ------------------------------------------------ */

/* arg: the family, "gemma3" or "gemma4" */
static cJSON *wrap_multimodal(cJSON *text, const void *arg) {
    const char *family = arg;
    char type[32];
    snprintf(type, sizeof type, "%s_text", family);
    cJSON_DeleteItemFromObjectCaseSensitive(text, "model_type");
    cJSON_AddStringToObject(text, "model_type", type);
    cJSON_DeleteItemFromObjectCaseSensitive(text, "architectures");
    cJSON *root = cJSON_CreateObject();
    const char *arch[1] = {!strcmp(family, "gemma4") ? "Gemma4ForConditionalGeneration" : "Gemma3ForConditionalGeneration"};
    cJSON_AddItemToObject(root, "architectures", cJSON_CreateStringArray(arch, 1));
    cJSON_AddStringToObject(root, "model_type", family);
    cJSON_AddNumberToObject(root, "image_token_index", 262144);
    cJSON_AddItemToObject(root, "text_config", text);
    cJSON *vision = cJSON_AddObjectToObject(root, "vision_config");
    cJSON_AddStringToObject(vision, "model_type", "siglip_vision_model");
    cJSON_AddNumberToObject(vision, "hidden_size", 1152);
    cJSON_AddNumberToObject(vision, "num_hidden_layers", 27);
    return root;
}

/* "model.X" -> prefix + "X" */
static int rename_fn(void *ud, size_t i, const lmx_st_tensor *t, wt_item *out) {
    if (!strncmp(t->name, "model.", 6))
        snprintf(out->name, sizeof out->name, "%s%s", (const char *)ud, t->name + 6);
    return 1;
}

static void case_multimodal(void) {
    static const char *cases[][2] = {
        {"gemma3", "language_model.model."}, {"gemma3", "model.language_model."},
        {"gemma4", "model.language_model."}, {"gemma4_moe", "model.language_model."}};
    for (int i = 0; i < 4; i++) {
        const char *model = cases[i][0], *family = strncmp(model, "gemma4", 6) ? "gemma3" : "gemma4";
        char *dir = case_dir("multimodal"), *w = lmx_path_join(dir, "model.safetensors"), label[96];
        write_config(model, dir, wrap_multimodal, family);
        write_weights(model, w, rename_fn, (void *)cases[i][1]);
        snprintf(label, sizeof label, "b. multimodal %s %sX", model, cases[i][1]);
        check_variant(dir, model, family, label);
        free(w);
        end_case(dir);
    }
}

/* ---- c, d. keys left out of config.json ------------------------------------------------------ */

static void case_config_without(const char *model, const char *key, const char *arch, const char *label) {
    char *dir = case_dir("nokey");
    write_config(model, dir, drop_key, key);
    copy_fixture(model, "model.safetensors", dir);
    lmx_model *m = load_and_check(dir, model, arch, label);
    lmx_model_info in;
    if (m && !strcmp(key, "head_dim") && lmx_model_get_info(m, &in) == LMX_OK)
        CHECK_MSG(in.head_dim == 32, "head_dim inferred as %d, want 32 (q_proj rows / heads)", in.head_dim);
    lmx_model_free(m);
    end_case(dir);
}

/* ---- e. F32 and F16 weights ------------------------------------------------------------------ */

static int convert_fn(void *ud, size_t i, const lmx_st_tensor *t, wt_item *out) {
    lmx_dtype to = *(const lmx_dtype *)ud;
    if (t->dtype != LMX_DTYPE_BF16) return 1;
    out->buf = convert_bf16(t, to);
    out->it.data = out->buf;
    out->it.dtype = to;
    return 1;
}

/* Number of BF16 weights of model that do not survive bf16 -> f16 -> f32 exactly, and the largest
 * change among them. */
static int64_t f16_inexact(const char *model, double *max_change) {
    char *src = fixture(model, "model.safetensors");
    lmx_st_file *f = NULL;
    lmx_err err = {0};
    int64_t bad = 0;
    *max_change = 0;
    CHECK_MSG(lmx_st_open(src, &f, &err) == LMX_OK, "%s", err.msg);
    for (size_t i = 0; f && i < lmx_st_count(f); i++) {
        const lmx_st_tensor *t = lmx_st_at(f, i);
        for (int64_t j = 0; t->dtype == LMX_DTYPE_BF16 && j < t->n_elements; j++) {
            uint16_t h;
            memcpy(&h, (const char *)t->data + 2 * j, 2);
            float x = lmx_bf16_to_f32(h);
            float y = lmx_f16_to_f32(lmx_f32_to_f16(x));
            if (y != x) {
                bad++;
                if (fabs((double)y - x) > *max_change) *max_change = fabs((double)y - x);
            }
        }
    }
    lmx_st_close(f);
    free(src);
    return bad;
}

static void case_dtypes(void) {
    static const lmx_dtype to[2] = {LMX_DTYPE_F32, LMX_DTYPE_F16};
    static const char *names[2] = {"f32", "f16"};
    for (int i = 0; i < 2; i++) {
        double change = 0;
        int64_t bad = to[i] == LMX_DTYPE_F16 ? f16_inexact("llama", &change) : 0;
        /* a few tiny weights fall into f16 subnormals; a change this small cannot move a logit by
         * anything near the tolerance, so the same reference still applies */
        if (bad && change > 1e-6) {
            printf("  e. f16 weights: SKIPPED, %lld llama weights change by up to %.2e in f16\n",
                   (long long)bad, change);
            continue;
        }
        if (bad)
            printf("  e. f16 weights: %lld weights round (f16 subnormals), largest change %.2e\n",
                   (long long)bad, change);
        char *dir = case_dir("dtype"), *w = lmx_path_join(dir, "model.safetensors"), label[64];
        write_config("llama", dir, NULL, NULL);
        write_weights("llama", w, convert_fn, (void *)&to[i]);
        snprintf(label, sizeof label, "e. llama weights as %s", names[i]);
        lmx_model *m = load_and_check(dir, "llama", "llama", label);
        lmx_model_info in;
        if (m && lmx_model_get_info(m, &in) == LMX_OK) {
            CHECK_MSG(!strcmp(in.dtype, names[i]), "dtype %s, want %s", in.dtype, names[i]);
            CHECK(in.weight_bytes == in.n_params * (to[i] == LMX_DTYPE_F32 ? 4 : 2));
        }
        lmx_model_free(m);
        free(w);
        end_case(dir);
    }
}

/* ---- f. legacy config keys for gemma3_scaled ------------------------------------------------- */

static cJSON *legacy_gemma3(cJSON *root, const void *arg) {
    int with_scaling = *(const int *)arg;
    cJSON_DeleteItemFromObjectCaseSensitive(root, "layer_types");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "rope_parameters");
    cJSON_DeleteItemFromObjectCaseSensitive(root, "_sliding_window_pattern");
    set_num(root, "rope_theta", 1e6);
    set_num(root, "rope_local_base_freq", 1e4);
    set_num(root, "sliding_window_pattern", 6);
    cJSON_DeleteItemFromObjectCaseSensitive(root, "rope_scaling");
    if (with_scaling) {
        cJSON *rs = cJSON_AddObjectToObject(root, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddNumberToObject(rs, "factor", 8);
    } else {
        cJSON_AddNullToObject(root, "rope_scaling");
    }
    return root;
}

static void case_legacy_keys(void) {
    char *dir = case_dir("legacy");
    int with_scaling = 1;
    write_config("gemma3_scaled", dir, legacy_gemma3, &with_scaling);
    copy_fixture("gemma3_scaled", "model.safetensors", dir);
    check_variant(dir, "gemma3_scaled", "gemma3", "f. gemma3_scaled, legacy keys");
    /* control: without the linear scaling the same weights must miss the reference */
    with_scaling = 0;
    write_config("gemma3_scaled", dir, legacy_gemma3, &with_scaling);
    lmx_model *m = load(dir, "f. control");
    if (m) {
        double r = short_ratio(m, "gemma3_scaled");
        CHECK_MSG(r > 1.0, "legacy gemma3_scaled without rope_scaling still matches (err/tol %.3f)", r);
        printf("  %-34s unscaled control err/tol %.1f (must exceed 1)\n", "f. control", r);
    }
    lmx_model_free(m);
    end_case(dir);
}

/* A fixture's model and reference with its long sequence, the reference's logits of it and room for
 * lmx's (cases g and i). */
typedef struct long_case {
    char *dir;
    lmx_model *m;
    lmx_st_set *ref;
    int V;
    int64_t L;
    int32_t *seq;      /* [L] */
    float *want, *out; /* [L - 1, V] */
} long_case;

static long_case long_open(const char *model, const char *label) {
    long_case k = {0};
    k.dir = fixture(model, NULL);
    k.m = load(k.dir, label);
    k.ref = open_ref(model);
    k.V = k.m ? vocab_of(k.m) : 0;
    k.seq = ref_ints(k.ref, "long_sequence", &k.L);
    k.want = k.seq ? ref_floats(k.ref, "long_logits", k.L - 1, k.V) : NULL;
    k.out = malloc((size_t)(k.L > 0 ? k.L : 1) * (k.V > 0 ? k.V : 1) * sizeof *k.out);
    return k;
}

static void long_close(long_case *k) {
    free(k->out);
    free(k->want);
    free(k->seq);
    lmx_st_set_close(k->ref);
    lmx_model_free(k->m);
    free(k->dir);
}

/* ---- g. n_ctx larger than the sequence ------------------------------------------------------- */

static void case_n_ctx(const char *model) {
    char label[64];
    snprintf(label, sizeof label, "g. %s n_ctx 64", model);
    long_case k = long_open(model, label);
    int64_t P = 0;
    int32_t *prompt = ref_ints(k.ref, "long_prompt", &P);
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = 64;
    lmx_context *c = NULL;
    if (k.m && k.want && prompt && P < k.L && k.L - 1 <= cp.n_ctx && lmx_context_create(k.m, &cp, &c) == LMX_OK) {
        int at;
        CHECK(lmx_context_eval(c, k.seq, (int)k.L - 1, k.out, 1) == LMX_OK);
        double prefill = worst_ratio(k.out, k.want, (int)k.L - 1, k.V, &at);
        CHECK_MSG(prefill <= 1.0, "%s prefill: err/tol %.3f at position %d", label, prefill, at);
        lmx_context_reset(c);
        CHECK(lmx_context_eval(c, prompt, (int)P, k.out, 1) == LMX_OK);
        double decode = worst_ratio(k.out, k.want, (int)P, k.V, &at);
        for (int64_t t = P; t < k.L - 1; t++) {
            lmx_status s = lmx_context_eval(c, &k.seq[t], 1, k.out, 0);
            CHECK_MSG(s == LMX_OK, "%s decode at %lld: %s", label, (long long)t, lmx_last_error(k.m));
            if (s != LMX_OK) break;
            double r = f32_tol_ratio(k.out, k.want + t * k.V, k.V);
            if (!(r <= decode)) decode = r;
        }
        CHECK_MSG(decode <= 1.0, "%s prompt+decode: err/tol %.3f", label, decode);
        CHECK(lmx_context_n_past(c) == (int)k.L - 1);
        printf("  %-34s long prefill %.4f, prompt+decode %.4f\n", label, prefill, decode);
    } else {
        CHECK_MSG(0, "%s: setup failed", label);
    }
    lmx_context_free(c);
    free(prompt);
    long_close(&k);
}

/* ---- h. batches ------------------------------------------------------------------------------ */

static int argmax(const float *x, int n) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    return a;
}

/* Last logits of tokens[0..n) evaluated alone in a fresh context. */
static lmx_status eval_alone(lmx_model *m, const int32_t *tokens, int n, float *logits) {
    lmx_context *c = NULL;
    lmx_status s = lmx_context_create(m, NULL, &c);
    if (s == LMX_OK) s = lmx_context_eval(c, tokens, n, logits, 0);
    lmx_context_free(c);
    return s;
}

#define MAX_B 8
#define MAX_SEQ 64

static void case_batch(const char *model) {
    char *dir = fixture(model, NULL), label[64];
    snprintf(label, sizeof label, "h. %s batch", model);
    lmx_model *m = load(dir, label);
    lmx_st_set *ref = open_ref(model);
    const lmx_st_tensor *bp = ref ? lmx_st_set_find(ref, "batch_prompts") : NULL;
    int V = m ? vocab_of(m) : 0, B = bp && bp->ndim == 2 ? (int)bp->shape[0] : 0, T = B ? (int)bp->shape[1] : 0;
    int64_t nb = 0, nl = 0;
    int32_t *prompts = ref_ints(ref, "batch_prompts", &nb), *lens32 = ref_ints(ref, "batch_lengths", &nl);
    float *want = B ? ref_floats(ref, "batch_last_logits", B, V) : NULL;
    lmx_context *ctxs[MAX_B] = {0};
    int ok = m && prompts && lens32 && want && B > 0 && B <= MAX_B && nl == B && T + 3 * B <= MAX_SEQ;
    CHECK_MSG(ok, "%s: setup failed", label);
    /* the batch's logits in the backend's host memory (lmx_host_alloc), as an application reading them
     * every step would hold them */
    float *out = ok ? lmx_host_alloc(m, (size_t)B * V * sizeof *out) : NULL, *alone = ok ? malloc((size_t)V * sizeof *alone) : NULL;
    ok = ok && out && alone;
    int lens[MAX_B], lens2[MAX_B], T2 = 0;
    int32_t seqs[MAX_B][MAX_SEQ], tokens2[MAX_B * MAX_SEQ];
    for (int b = 0; ok && b < B; b++) {
        lens[b] = lens32[b];
        ok = lmx_context_create(m, NULL, &ctxs[b]) == LMX_OK;
    }
    if (ok) { /* first batch: the reference's padded prompts */
        lmx_status s = lmx_eval_batch(m, ctxs, B, prompts, lens, T, out);
        CHECK_MSG(s == LMX_OK, "%s: %s", label, lmx_last_error(m));
        int at;
        double r = s == LMX_OK ? worst_ratio(out, want, B, V, &at) : INFINITY;
        CHECK_MSG(r <= 1.0, "%s: err/tol %.3f at row %d", label, r, at);
        printf("  %-34s last logits err/tol %.4f\n", label, r);
        for (int b = 0; b < B; b++) CHECK(lmx_context_n_past(ctxs[b]) == lens[b]);
    }
    /* continuation: row b gets the next 3(b+1) greedy tokens of its prompt run alone */
    for (int b = 0; ok && b < B; b++) {
        lens2[b] = 3 * (b + 1);
        if (lens2[b] > T2) T2 = lens2[b];
        memcpy(seqs[b], prompts + (size_t)b * T, (size_t)lens[b] * sizeof(int32_t));
        lmx_context *c = NULL;
        ok = lmx_context_create(m, NULL, &c) == LMX_OK && lmx_context_eval(c, seqs[b], lens[b], alone, 0) == LMX_OK;
        for (int j = 0; ok && j < lens2[b]; j++) {
            seqs[b][lens[b] + j] = argmax(alone, V);
            ok = lmx_context_eval(c, &seqs[b][lens[b] + j], 1, alone, 0) == LMX_OK;
        }
        lmx_context_free(c);
    }
    if (ok) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T2; t++) /* padding with an invalid id: pad values are ignored */
                tokens2[b * T2 + t] = t < lens2[b] ? seqs[b][lens[b] + t] : -7;
        lmx_status s = lmx_eval_batch(m, ctxs, B, tokens2, lens2, T2, out);
        CHECK_MSG(s == LMX_OK, "%s continuation: %s", label, lmx_last_error(m));
        double worst = 0;
        for (int b = 0; s == LMX_OK && b < B; b++) {
            CHECK(lmx_context_n_past(ctxs[b]) == lens[b] + lens2[b]);
            CHECK(eval_alone(m, seqs[b], lens[b] + lens2[b], alone) == LMX_OK);
            double max_ref = 0, max_err = 0;
            for (int v = 0; v < V; v++) {
                double e = fabs((double)out[(size_t)b * V + v] - alone[v]);
                if (!(e == e)) e = INFINITY;
                if (fabs(alone[v]) > max_ref) max_ref = fabs(alone[v]);
                if (e > max_err) max_err = e;
            }
            double r = max_err / (1e-4 * max_ref + 1e-6);
            CHECK_MSG(r <= 1.0, "%s continuation row %d (%d + %d tokens): max|err| %.3e, err/tol %.3f", label, b,
                      lens[b], lens2[b], max_err, r);
            if (r > worst) worst = r;
        }
        printf("  %-34s continuation vs alone err/tol %.4f\n", label, worst);
    }
    for (int b = 0; b < MAX_B; b++) lmx_context_free(ctxs[b]);
    lmx_host_free(m, out);
    free(alone);
    free(want);
    free(prompts);
    free(lens32);
    lmx_st_set_close(ref);
    lmx_model_free(m);
    free(dir);
}

/* ---- i. chunks ------------------------------------------------------------------------------- */

/* The long sequence evaluated `chunk` rows at a time in one context: every logit row against the
 * reference's long_logits. */
static void case_chunks(const char *model, int chunk) {
    char label[64];
    snprintf(label, sizeof label, "i. %s in chunks of %d", model, chunk);
    long_case k = long_open(model, label);
    lmx_context *c = NULL;
    if (k.m && k.want && k.out && k.L > 1 && lmx_context_create(k.m, NULL, &c) == LMX_OK) {
        lmx_status s = LMX_OK;
        for (int64_t t = 0; t < k.L - 1 && s == LMX_OK; t += chunk) {
            const int n = (int)(k.L - 1 - t < chunk ? k.L - 1 - t : chunk);
            s = lmx_context_eval(c, k.seq + t, n, k.out + t * k.V, 1);
            CHECK_MSG(s == LMX_OK, "%s at %lld: %s", label, (long long)t, lmx_last_error(k.m));
        }
        int at;
        double r = s == LMX_OK ? worst_ratio(k.out, k.want, (int)k.L - 1, k.V, &at) : INFINITY;
        CHECK_MSG(r <= 1.0, "%s: err/tol %.3f at position %d", label, r, at);
        printf("  %-34s long err/tol %.4f\n", label, r);
    } else {
        CHECK_MSG(0, "%s: setup failed", label);
    }
    lmx_context_free(c);
    long_close(&k);
}

/* ---- model info: the tables a token reads one row of (lmx bench's bytes per token) ---------------- */

/* table_bytes against the sizes of the file's own tensors: the token embedding when the head has its own
 * weight (qwen3), gemma4's per-layer table, nothing for a tied llama. */
static void case_table_bytes(const char *model) {
    char *path = fixture(model, "model.safetensors");
    lmx_st_set *s = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_set_open_file(path, &s, &err) == LMX_OK, "%s", err.msg);
    char *dir = fixture(model, NULL);
    lmx_model *m = load(dir, model);
    lmx_model_info in;
    if (s && m && lmx_model_get_info(m, &in) == LMX_OK) {
        const lmx_st_tensor *emb = lmx_st_set_find(s, "model.embed_tokens.weight"),
                            *head = lmx_st_set_find(s, "lm_head.weight"),
                            *ple = lmx_st_set_find(s, "model.embed_tokens_per_layer.weight");
        const int64_t want = (head && emb ? (int64_t)emb->nbytes : 0) + (ple ? (int64_t)ple->nbytes : 0);
        CHECK_MSG(in.table_bytes == want, "%s: table_bytes %lld, want %lld", model, (long long)in.table_bytes,
                  (long long)want);
    }
    lmx_model_free(m);
    lmx_st_set_close(s);
    free(dir);
    free(path);
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");

    case_sharded();
    case_multimodal();
    case_config_without("qwen3", "model_type", "qwen3", "c. qwen3 without model_type");
    case_config_without("qwen2", "model_type", "qwen2", "c. qwen2 without model_type");
    case_config_without("qwen3", "head_dim", "qwen3", "d. qwen3 without head_dim");
    case_dtypes();
    case_legacy_keys();
    case_n_ctx("llama");
    case_n_ctx("gemma3");
    case_n_ctx("gemma4_kv");
    case_batch("llama");
    case_batch("gemma3");
    case_batch("gemma4_kv");
    case_batch("gemma4_moe");
    case_chunks("gemma3", 5);
    case_chunks("gemma4_kv", 5);
    case_chunks("gemma4_kv", 13);
    case_chunks("gemma4_moe", 7);
    case_table_bytes("llama");
    case_table_bytes("qwen3");
    case_table_bytes("gemma4");
    return check_summary("test_model_variants");
}
