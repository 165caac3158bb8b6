/* test_adapter.c - LoRA adapters (lmx.h, "LoRA adapters"):
 *   - bad adapter folders (built in mkdtemp folders from the fixture adapters) fail with the right
 *     status and a message naming the field or tensor, and the model gives the same logits after;
 *   - lmx_adapter_get_info; rsLoRA, alpha_pattern and rank_pattern against adapters whose tensors
 *     carry the same scaling; layers_to_transform; f32 == f16 == bf16 adapters;
 *   - the real PEFT (Gemma 3) and mlx-lm (Qwen2.5) adapters parse as their configs say;
 *   - an mlx-lm numbered checkpoint file == its folder;
 *   - a batch mixing adapters == each prompt alone (generation and classify), on llama and on qwen3
 *     (the llama fixture repeats one token under any adapter; qwen3's greedy ids tell adapters apart);
 *   - the prompt cache never crosses adapters (nor the default adapter and LMX_NO_ADAPTER);
 *   - the load-time adapter; a freed adapter; an adapter of another model;
 *   - the fixture adapters (PEFT and mlx-lm, llama and qwen3) against the HF references.
 *
 * Usage: test_adapter [FIXTURES]   (default: $LMX_FIXTURES, then ../shared/fixtures).
 * LMX_TEST_BACKEND picks the backend (default cpu); LMX_TEST_VERBOSE=1 prints every error message. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "base/half.h"
#include "check.h"
#include "test_files.h"
#include "formats/lora_file.h"
#include "formats/safetensors.h"
#include "lmx.h"

static const char *g_backend = "cpu";

/* An absolute logit tolerance of the cpu (float32 throughout) as it applies on the backend under test:
 * on a GPU, activations go through bf16 (the prefill GEMMs) and LoRA's prefill GEMMs through TF32, so
 * two batch shapes of one computation differ by up to ~0.15 there (logits up to ~60: 0.25%). */
static double tol(double cpu_tol) { return strcmp(g_backend, "cpu") == 0 ? cpu_tol : 0.3; }
/* How much an adapter must move the logits to count as applied: far above either backend's noise. */
static double tol_differ(void) { return strcmp(g_backend, "cpu") == 0 ? 1e-3 : 1.0; }

/* Ten prompt ids (the llama and qwen3 fixtures have 320 tokens) for checks on logits and generation. */
static const int32_t k_tok[] = {1, 17, 42, 99, 5, 230, 64, 7, 150, 300};
#define N_TOK ((int)(sizeof k_tok / sizeof k_tok[0]))

#define PROJ_BIT(p) (1u << (p))

/* ---- models, evaluation, comparisons --------------------------------------------------------- */

static lmx_model *load_model(const char *model, const char *adapter) {
    char *dir = fixture(model, NULL);
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = g_backend;
    lp.adapter = adapter;
    lmx_model *m = NULL;
    lmx_status st = lmx_model_load(dir, &lp, &m);
    CHECK_MSG(st == LMX_OK, "load %s (adapter %s): %s", dir, adapter ? adapter : "none", lmx_last_error(NULL));
    free(dir);
    return st == LMX_OK ? m : NULL;
}

static lmx_model_info model_info(const lmx_model *m) {
    lmx_model_info in;
    memset(&in, 0, sizeof in);
    CHECK(lmx_model_get_info(m, &in) == LMX_OK);
    return in;
}

static int vocab(const lmx_model *m) { return model_info(m).vocab_size; }

/* out [n, V]: the logits of tok on a fresh context of m under a (NULL: the model's default). */
static lmx_status eval_all(lmx_model *m, lmx_adapter *a, const int32_t *tok, int n, float *out) {
    lmx_context *c = NULL;
    lmx_status st = lmx_context_create(m, NULL, &c);
    if (st == LMX_OK && a) st = lmx_context_set_adapter(c, a);
    if (st == LMX_OK) st = lmx_context_eval(c, tok, n, out, 1);
    lmx_context_free(c);
    return st;
}

/* The k_tok logits of m under a (malloc'ed [N_TOK, V]; NULL and a failed check on error). */
static float *tok_logits(lmx_model *m, lmx_adapter *a) {
    float *out = malloc((size_t)N_TOK * (size_t)vocab(m) * sizeof *out);
    lmx_status st = out ? eval_all(m, a, k_tok, N_TOK, out) : LMX_ERR_NOMEM;
    CHECK_MSG(st == LMX_OK, "eval: %s (%s)", lmx_status_str(st), lmx_last_error(m));
    if (st) {
        free(out);
        return NULL;
    }
    return out;
}

/* The largest |x - y| (infinite where either is NaN); infinite when either is NULL. */
static double max_diff(const float *x, const float *y, size_t n) {
    if (!x || !y) return INFINITY;
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)x[i] - (double)y[i]);
        if (!(e == e)) e = INFINITY;
        if (e > d) d = e;
    }
    return d;
}

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* Greedy generation of at most 12 tokens (EOS ignored) from p under a; ids [12] gets them,
 * *cached the prompt tokens reused from the prompt cache.  Returns the count, -1 on failure. */
#define GEN_MAX 12
static lmx_gen_params greedy_params(lmx_adapter *a) {
    lmx_gen_params gp = lmx_gen_default_params();
    gp.sampler.temperature = 0;
    gp.max_tokens = GEN_MAX;
    gp.ignore_eos = 1;
    gp.adapter = a;
    return gp;
}

static int gen(lmx_model *m, const int32_t *p, int n, lmx_adapter *a, int32_t *ids, int *cached) {
    lmx_gen_params gp = greedy_params(a);
    lmx_result r;
    lmx_status st = lmx_generate_ids(m, p, n, &gp, &r);
    CHECK_MSG(st == LMX_OK, "generate: %s (%s)", lmx_status_str(st), lmx_last_error(m));
    if (st) return -1;
    lmx_metrics mt;
    CHECK(lmx_get_metrics(m, &mt) == LMX_OK);
    if (cached) *cached = mt.cached_tokens;
    CHECK(r.n_ids == GEN_MAX);
    int k = r.n_ids < GEN_MAX ? r.n_ids : GEN_MAX;
    memcpy(ids, r.ids, (size_t)k * sizeof *ids);
    return k;
}

static int same_ids(const int32_t *x, int nx, const int32_t *y, int ny) {
    return nx >= 0 && nx == ny && memcmp(x, y, (size_t)nx * sizeof *x) == 0;
}

/* ---- files ------------------------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *n) {
    char *data = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(path, &data, n, &err) == LMX_OK, "%s", err.msg);
    return data;
}

static void copy_file(const char *src, const char *dst) {
    size_t n = 0;
    char *data = read_all(src, &n);
    if (data) write_file(dst, data, n);
    free(data);
}

/* dir/name, created as a folder (malloc'ed path). */
static char *sub_dir(const char *dir, const char *name) {
    char *p = lmx_path_join(dir, name);
    CHECK_MSG(p && mkdir(p, 0755) == 0, "mkdir %s/%s failed", dir, name);
    return p;
}

/* dst/<name> = src/<name> */
static void copy_into(const char *src_dir, const char *name, const char *dst_dir, const char *dst_name) {
    char *s = lmx_path_join(src_dir, name), *d = lmx_path_join(dst_dir, dst_name ? dst_name : name);
    copy_file(s, d);
    free(s);
    free(d);
}

/* Set key ("a" or "a.b") of dir/adapter_config.json to the JSON text json, or remove it (NULL). */
static void config_set(const char *dir, const char *key, const char *json) {
    char *path = lmx_path_join(dir, "adapter_config.json");
    size_t n = 0;
    char *text = read_all(path, &n);
    cJSON *root = text ? cJSON_ParseWithLength(text, n) : NULL;
    CHECK(root != NULL);
    if (root) {
        cJSON *obj = root;
        char head[64];
        const char *leaf = key, *dot = strchr(key, '.');
        if (dot) {
            snprintf(head, sizeof head, "%.*s", (int)(dot - key), key);
            obj = cJSON_GetObjectItemCaseSensitive(root, head);
            leaf = dot + 1;
        }
        CHECK_MSG(cJSON_IsObject(obj), "config has no object for %s", key);
        if (cJSON_IsObject(obj)) {
            cJSON_DeleteItemFromObjectCaseSensitive(obj, leaf);
            cJSON *v = json ? cJSON_Parse(json) : NULL;
            CHECK_MSG(!json || v, "bad JSON in the test: %s", json);
            if (v) cJSON_AddItemToObject(obj, leaf, v);
        }
        char *out = cJSON_Print(root);
        if (out) write_file(path, out, strlen(out));
        cJSON_free(out);
        cJSON_Delete(root);
    }
    free(text);
    free(path);
}

/* The sum of the element counts of a safetensors file's tensors (for a LoRA file: sum r*(in+out)). */
static int64_t st_elements(const char *path) {
    lmx_st_set *s = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_set_open_file(path, &s, &err) == LMX_OK, "%s", err.msg);
    int64_t n = 0;
    for (size_t i = 0; s && i < lmx_st_set_count(s); i++) n += lmx_st_set_at(s, i)->n_elements;
    lmx_st_set_close(s);
    return n;
}

/* ---- tensor rewriting -------------------------------------------------------------------------- */

typedef struct wt_item {
    lmx_st_write_item it;
    void *buf;            /* data allocated by the callback (freed after the write) */
    char name[192];       /* a new name (it.name points here when the callback renames) */
} wt_item;

/* Called for each tensor with *out prefilled as an exact copy.  Returns a mask: 1 writes out,
 * 2 also writes *extra (which the callback fills). */
typedef int (*wt_fn)(const lmx_st_tensor *t, wt_item *out, wt_item *extra);

/* dst = the tensors of src rewritten by fn. */
static void rewrite_tensors(const char *src, const char *dst, wt_fn fn) {
    lmx_st_set *s = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_set_open_file(src, &s, &err) == LMX_OK, "%s", err.msg);
    size_t n = s ? lmx_st_set_count(s) : 0, k = 0;
    wt_item *items = calloc(2 * n + 1, sizeof *items);
    lmx_st_write_item *w = calloc(2 * n + 1, sizeof *w);
    for (size_t i = 0; items && w && i < n; i++) {
        const lmx_st_tensor *t = lmx_st_set_at(s, i);
        wt_item *o = &items[2 * i], *x = &items[2 * i + 1];
        o->it.name = t->name;
        o->it.dtype = t->dtype;
        o->it.ndim = t->ndim;
        memcpy(o->it.shape, t->shape, sizeof o->it.shape);
        o->it.data = t->data;
        int mask = fn(t, o, x);
        if (mask & 1) w[k++] = o->it;
        if (mask & 2) w[k++] = x->it;
    }
    if (s && items && w) CHECK_MSG(lmx_st_write(dst, w, k, &err) == LMX_OK, "%s", err.msg);
    for (size_t i = 0; items && i < 2 * n; i++) free(items[i].buf);
    free(items);
    free(w);
    lmx_st_set_close(s);
}

static int named(const lmx_st_tensor *t, const char *s) { return strstr(t->name, s) != NULL; }

/* An f32 [rows, cols] copy of the top-left of 2-D f32 tensor t (zeros beyond it), into o. */
static void f32_resize(const lmx_st_tensor *t, wt_item *o, int64_t rows, int64_t cols) {
    float *b = calloc((size_t)(rows * cols), sizeof *b);
    CHECK(b != NULL && t->dtype == LMX_DTYPE_F32 && t->ndim == 2);
    for (int64_t i = 0; b && i < rows && i < t->shape[0]; i++)
        for (int64_t j = 0; j < cols && j < t->shape[1]; j++)
            memcpy(&b[i * cols + j], (const char *)t->data + 4 * (i * t->shape[1] + j), 4);
    o->buf = b;
    o->it.data = b;
    o->it.shape[0] = rows;
    o->it.shape[1] = cols;
}

/* o's data times f (a power of two: exact). */
static void f32_scale(const lmx_st_tensor *t, wt_item *o, float f) {
    f32_resize(t, o, t->shape[0], t->shape[1]);
    float *b = o->buf;
    for (int64_t i = 0; b && i < t->n_elements; i++) b[i] *= f;
}

static int wt_rank_mismatch(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* B [64, 4] -> [64, 3] */
    (void)x;
    if (named(t, "layers.0.self_attn.q_proj.lora_B")) f32_resize(t, o, t->shape[0], 3);
    return 1;
}
static int wt_a_misfit(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* A [4, 64] -> [4, 32] */
    (void)x;
    if (named(t, "layers.1.self_attn.k_proj.lora_A")) f32_resize(t, o, t->shape[0], 32);
    return 1;
}
static int wt_b_misfit(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* B [32, 4] -> [48, 4] */
    (void)x;
    if (named(t, "layers.0.self_attn.v_proj.lora_B")) f32_resize(t, o, 48, t->shape[1]);
    return 1;
}
static int wt_mlx_a_misfit(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* lora_a [64, 4] -> [32, 4] */
    (void)x;
    if (named(t, "layers.0.self_attn.q_proj.lora_a")) f32_resize(t, o, 32, t->shape[1]);
    return 1;
}
static int wt_nan(const lmx_st_tensor *t, wt_item *o, wt_item *x) {
    (void)x;
    if (named(t, "layers.1.mlp.down_proj.lora_B")) {
        f32_resize(t, o, t->shape[0], t->shape[1]);
        if (o->buf) ((float *)o->buf)[5] = NAN;
    }
    return 1;
}
static int wt_layer2(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* layer 1's q_proj again as layer 2 */
    if (!named(t, "layers.1.self_attn.q_proj.lora_")) return 1;
    *x = *o;
    const char *p = strstr(t->name, "layers.1.");
    snprintf(x->name, sizeof x->name, "%.*slayers.2.%s", (int)(p - t->name), t->name, p + 9);
    x->it.name = x->name;
    return 3;
}
static int wt_i32(const lmx_st_tensor *t, wt_item *o, wt_item *x) {
    (void)x;
    if (named(t, "layers.0.mlp.gate_proj.lora_A")) o->it.dtype = LMX_DTYPE_I32;
    return 1;
}
static int wt_drop_b(const lmx_st_tensor *t, wt_item *o, wt_item *x) {
    (void)o, (void)x;
    return !named(t, "layers.1.self_attn.o_proj.lora_B");
}
static int wt_v_rank2(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* v_proj at rank 2 */
    (void)x;
    if (named(t, "v_proj.lora_A")) f32_resize(t, o, 2, t->shape[1]);
    if (named(t, "v_proj.lora_B")) f32_resize(t, o, t->shape[0], 2);
    return 1;
}
static int wt_q_double(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* every q_proj B times 2 */
    (void)x;
    if (named(t, "q_proj.lora_B")) f32_scale(t, o, 2.0f);
    return 1;
}
static int wt_q1_double(const lmx_st_tensor *t, wt_item *o, wt_item *x) { /* layer 1's q_proj B times 2 */
    (void)x;
    if (named(t, "layers.1.self_attn.q_proj.lora_B")) f32_scale(t, o, 2.0f);
    return 1;
}

/* ---- random PEFT adapters ------------------------------------------------------------------------ */

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int rng_int(uint64_t *s, int lo, int hi) { return lo + (int)(rng_next(s) % (uint64_t)(hi - lo + 1)); }

/* The in (K) and out (N) sizes of projection p of m's layers. */
static void proj_dims(const lmx_model_info *in, lmx_proj p, int64_t *K, int64_t *N) {
    int64_t C = in->hidden_size, Q = (int64_t)in->n_heads * in->head_dim, KV = (int64_t)in->n_kv_heads * in->head_dim;
    int64_t F = in->ffn_size;
    switch (p) {
    case LMX_PROJ_Q: *K = C, *N = Q; break;
    case LMX_PROJ_K:
    case LMX_PROJ_V: *K = C, *N = KV; break;
    case LMX_PROJ_O: *K = Q, *N = C; break;
    case LMX_PROJ_DOWN: *K = F, *N = C; break;
    default: *K = C, *N = F; break;
    }
}

/* dir/adapter_config.json + adapter_model.safetensors: a PEFT adapter of rank r and lora_alpha
 * alpha on the projections of projs (bit p: lmx_proj p) of every layer, stored as dt.  The values
 * come from seed and are k/512 (A) and k/256 (B), |k| <= 64: exact in f32, f16 and bf16. */
static void write_random_peft(const char *dir, const lmx_model_info *in, const char *base_class, int r, double alpha,
                              unsigned projs, lmx_dtype dt, uint64_t seed) {
    int n = 0;
    for (int p = 0; p < LMX_PROJ_N; p++) n += (projs >> p) & 1;
    n *= 2 * in->n_layers;
    lmx_st_write_item *w = calloc((size_t)n, sizeof *w);
    char (*names)[128] = calloc((size_t)n, sizeof *names);
    CHECK(w && names);
    int k = 0;
    size_t es = lmx_dtype_size(dt);
    for (int l = 0; w && names && l < in->n_layers; l++)
        for (int p = 0; p < LMX_PROJ_N; p++) {
            if (!((projs >> p) & 1)) continue;
            int64_t K, N;
            proj_dims(in, (lmx_proj)p, &K, &N);
            for (int ab = 0; ab < 2; ab++) {
                int64_t rows = ab ? N : r, cols = ab ? r : K;
                snprintf(names[k], sizeof names[k], "base_model.model.model.layers.%d.%s.lora_%s.weight", l,
                         lmx_proj_module((lmx_proj)p), ab ? "B" : "A");
                unsigned char *data = malloc((size_t)(rows * cols) * es);
                CHECK(data != NULL);
                for (int64_t i = 0; data && i < rows * cols; i++) {
                    float v = (float)rng_int(&seed, -64, 64) / (ab ? 256.0f : 512.0f);
                    if (dt == LMX_DTYPE_F16) {
                        uint16_t h = lmx_f32_to_f16(v);
                        memcpy(data + 2 * i, &h, 2);
                    } else if (dt == LMX_DTYPE_BF16) {
                        uint16_t h = lmx_f32_to_bf16(v);
                        memcpy(data + 2 * i, &h, 2);
                    } else {
                        memcpy(data + 4 * i, &v, 4);
                    }
                }
                w[k] = (lmx_st_write_item){.name = names[k], .dtype = dt, .ndim = 2, .shape = {rows, cols}, .data = data};
                k++;
            }
        }
    char *wpath = lmx_path_join(dir, "adapter_model.safetensors");
    lmx_err err = {0};
    CHECK_MSG(lmx_st_write(wpath, w, (size_t)k, &err) == LMX_OK, "%s", err.msg);
    free(wpath);
    for (int i = 0; i < k; i++) free((void *)w[i].data);
    free(w);
    free(names);

    cJSON *root = cJSON_CreateObject(), *targets = cJSON_AddArrayToObject(root, "target_modules");
    cJSON_AddStringToObject(root, "peft_type", "LORA");
    cJSON_AddNumberToObject(root, "r", r);
    cJSON_AddNumberToObject(root, "lora_alpha", alpha);
    for (int p = 0; p < LMX_PROJ_N; p++)
        if ((projs >> p) & 1) cJSON_AddItemToArray(targets, cJSON_CreateString(lmx_proj_short((lmx_proj)p)));
    if (base_class) cJSON_AddStringToObject(cJSON_AddObjectToObject(root, "auto_mapping"), "base_model_class", base_class);
    cJSON_AddStringToObject(root, "bias", "none");
    cJSON_AddFalseToObject(root, "use_dora");
    cJSON_AddNullToObject(root, "modules_to_save");
    char *text = cJSON_Print(root), *cpath = lmx_path_join(dir, "adapter_config.json");
    if (text) write_file(cpath, text, strlen(text));
    cJSON_free(text);
    cJSON_Delete(root);
    free(cpath);
}

static lmx_adapter *load_adapter(lmx_model *m, const char *path) {
    lmx_adapter *a = NULL;
    lmx_status st = m ? lmx_adapter_load(m, path, &a) : LMX_ERR_INVALID_ARG;
    CHECK_MSG(st == LMX_OK && a, "adapter %s: %s (%s)", path, lmx_status_str(st), m ? lmx_last_error(m) : "no model");
    return st == LMX_OK ? a : NULL;
}

static lmx_adapter_info adapter_info(const lmx_adapter *a) {
    lmx_adapter_info in;
    memset(&in, 0, sizeof in);
    CHECK(a && lmx_adapter_get_info(a, &in) == LMX_OK);
    if (!in.format) in.format = "";
    if (!in.targets) in.targets = "";
    if (!in.path) in.path = "";
    return in;
}

/* ---- 1. bad adapters ------------------------------------------------------------------------------ */

/* Loading path on m must fail with want, leave *out NULL, say w1 and w2 in lmx_last_error(m), and
 * leave m's k_tok logits as base. */
static void expect_fail(lmx_model *m, const float *base, const char *label, const char *path, lmx_status want,
                        const char *w1, const char *w2) {
    static int sentinel;
    lmx_adapter *a = (lmx_adapter *)(void *)&sentinel;
    int64_t mem0 = model_info(m).memory_bytes;
    lmx_status st = lmx_adapter_load(m, path, &a);
    if (!check_failed(label, st, want, a == NULL, lmx_last_error(m), w1, w2)) {
        lmx_adapter_free(a);
        return;
    }
    int64_t mem1 = model_info(m).memory_bytes; /* what a failed load allocated is released */
    CHECK_MSG(mem1 == mem0, "%s: memory_bytes %lld before, %lld after the failed load", label, (long long)mem0,
              (long long)mem1);
    float *now = tok_logits(m, NULL);
    size_t n = (size_t)N_TOK * (size_t)vocab(m);
    CHECK_MSG(max_diff(now, base, n) == 0, "%s: the model's logits changed after the failed load (max diff %g)", label,
              max_diff(now, base, n));
    free(now);
}

typedef struct bad_case {
    const char *label;
    int mlx;                 /* 1: from the fixture's mlx-lm adapter, 0: from its PEFT adapter */
    const char *key, *json;  /* a config edit (config_set), or key NULL */
    wt_fn weights;           /* a tensor rewrite, or NULL: a plain copy */
    lmx_status want;
    const char *w1, *w2;     /* words the message must hold */
} bad_case;

#define ALL7 "\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\""

static const bad_case k_bad[] = {
    {"A/B rank mismatch", 0, NULL, NULL, wt_rank_mismatch, LMX_ERR_SHAPE, "rank mismatch",
     "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"},
    {"A does not fit k_proj", 0, NULL, NULL, wt_a_misfit, LMX_ERR_SHAPE,
     "base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight", "k_proj"},
    {"B does not fit v_proj", 0, NULL, NULL, wt_b_misfit, LMX_ERR_SHAPE,
     "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", "v_proj"},
    {"mlx lora_a does not fit q_proj", 1, NULL, NULL, wt_mlx_a_misfit, LMX_ERR_SHAPE,
     "model.layers.0.self_attn.q_proj.lora_a", "q_proj"},
    {"NaN in lora_B", 0, NULL, NULL, wt_nan, LMX_ERR_FORMAT, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight",
     "NaN"},
    {"tensor for layer 2 of 2", 0, NULL, NULL, wt_layer2, LMX_ERR_SHAPE,
     "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight", "layer 2"},
    {"i32 lora_A", 0, NULL, NULL, wt_i32, LMX_ERR_UNSUPPORTED, "base_model.model.model.layers.0.mlp.gate_proj.lora_A.weight",
     NULL},
    {"lora_B missing", 0, NULL, NULL, wt_drop_b, LMX_ERR_MISSING, "o_proj", "layer 1"},
    {"target foo_proj", 0, "target_modules", "[" ALL7 ", \"foo_proj\"]", NULL, LMX_ERR_UNSUPPORTED, "foo_proj",
     "target_modules"},
    {"target embed_tokens", 0, "target_modules", "[" ALL7 ", \"embed_tokens\"]", NULL, LMX_ERR_UNSUPPORTED,
     "embed_tokens", "target_modules"},
    {"target lm_head", 0, "target_modules", "[\"lm_head\", " ALL7 "]", NULL, LMX_ERR_UNSUPPORTED, "lm_head",
     "target_modules"},
    {"use_dora", 0, "use_dora", "true", NULL, LMX_ERR_UNSUPPORTED, "use_dora", NULL},
    {"modules_to_save", 0, "modules_to_save", "[\"lm_head\"]", NULL, LMX_ERR_UNSUPPORTED, "modules_to_save", NULL},
    {"peft_type IA3", 0, "peft_type", "\"IA3\"", NULL, LMX_ERR_UNSUPPORTED, "IA3", NULL},
    {"r 3 with rank-4 tensors", 0, "r", "3", NULL, LMX_ERR_SHAPE, "lora_A.weight", "3"},
    {"rank_pattern v_proj 2 with rank-4 tensors", 0, "rank_pattern", "{\"v_proj\": 2}", NULL, LMX_ERR_SHAPE,
     "v_proj.lora_A.weight", "2"},
    {"target_modules without k_proj", 0, "target_modules",
     "[\"q_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]", NULL, LMX_ERR_FORMAT,
     "k_proj", "target_modules"},
    {"target_modules bad regex", 0, "target_modules", "\"(q_proj\"", NULL, LMX_ERR_FORMAT, "target_modules", NULL},
    {"layers_to_transform [0]", 0, "layers_to_transform", "[0]", NULL, LMX_ERR_FORMAT, "layers_to_transform",
     "layers.1."},
    {"mlx without lora_parameters.scale", 1, "lora_parameters.scale", NULL, NULL, LMX_ERR_MISSING, "scale", NULL},
    {"mlx without lora_parameters", 1, "lora_parameters", NULL, NULL, LMX_ERR_MISSING, "lora_parameters", NULL},
    {"mlx unknown key", 1, "lora_parameters.keys", "[\"self_attn.q_proj\", \"self_attn.foo\"]", NULL,
     LMX_ERR_UNSUPPORTED, "self_attn.foo", NULL},
    {"mlx keys without k_proj", 1, "lora_parameters.keys", "[\"self_attn.q_proj\"]", NULL, LMX_ERR_FORMAT,
     "lora_parameters.keys", "k_proj"},
    {"mlx num_layers 1 of 2", 1, "num_layers", "1", NULL, LMX_ERR_FORMAT, "num_layers", "layer 0"},
    {"mlx fine_tune_type dora", 1, "fine_tune_type", "\"dora\"", NULL, LMX_ERR_UNSUPPORTED, "dora", NULL},
};

static void case_bad_adapters(void) {
    lmx_model *m = load_model("llama", NULL);
    if (!m) return;
    float *base = tok_logits(m, NULL);
    char *dir = case_dir("adapter_bad");
    char *peft = fixture("llama_lora", "peft_adapter"), *mlx = fixture("llama_lora", "mlx_adapter");
    char buf[64];

    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        const bad_case *c = &k_bad[i];
        snprintf(buf, sizeof buf, "bad%02zu", i);
        char *d = sub_dir(dir, buf);
        const char *src = c->mlx ? mlx : peft, *wname = c->mlx ? "adapters.safetensors" : "adapter_model.safetensors";
        copy_into(src, "adapter_config.json", d, NULL);
        if (c->weights) {
            char *s = lmx_path_join(src, wname), *t = lmx_path_join(d, wname);
            rewrite_tensors(s, t, c->weights);
            free(s);
            free(t);
        } else {
            copy_into(src, wname, d, NULL);
        }
        if (c->key) config_set(d, c->key, c->json);
        expect_fail(m, base, c->label, d, c->want, c->w1, c->w2);
        free(d);
    }

    /* folders and files that are not adapters */
    char *p = lmx_path_join(dir, "no_such_adapter");
    expect_fail(m, base, "missing folder", p, LMX_ERR_IO, "no_such_adapter", NULL);
    free(p);
    char *d = sub_dir(dir, "no_config");
    copy_into(peft, "adapter_model.safetensors", d, NULL);
    expect_fail(m, base, "folder without adapter_config.json", d, LMX_ERR_MISSING, "adapter_config.json", NULL);
    free(d);
    d = sub_dir(dir, "peft_no_weights");
    copy_into(peft, "adapter_config.json", d, NULL);
    expect_fail(m, base, "PEFT folder without weights", d, LMX_ERR_MISSING, "adapter_model.safetensors", NULL);
    p = lmx_path_join(d, "adapter_model.bin");
    write_file(p, "PK", 2);
    expect_fail(m, base, "PEFT folder with adapter_model.bin", d, LMX_ERR_UNSUPPORTED, "adapter_model.bin", NULL);
    free(p);
    p = lmx_path_join(d, "adapter_config.json");
    expect_fail(m, base, "a .json file as the adapter", p, LMX_ERR_UNSUPPORTED, "adapter_config.json", NULL);
    free(p);
    free(d);
    d = sub_dir(dir, "mlx_no_weights");
    copy_into(mlx, "adapter_config.json", d, NULL);
    expect_fail(m, base, "mlx folder without weights", d, LMX_ERR_MISSING, "adapters.safetensors", NULL);
    free(d);

    /* corrupted JSON: the config cut in half; the safetensors header cut short */
    const char *srcs[2] = {peft, mlx}, *wnames[2] = {"adapter_model.safetensors", "adapters.safetensors"};
    for (int k = 0; k < 2; k++) {
        snprintf(buf, sizeof buf, "cut_config%d", k);
        d = sub_dir(dir, buf);
        copy_into(srcs[k], wnames[k], d, NULL);
        char *s = lmx_path_join(srcs[k], "adapter_config.json"), *t = lmx_path_join(d, "adapter_config.json");
        size_t n = 0;
        char *text = read_all(s, &n);
        if (text) write_file(t, text, n / 2);
        free(text);
        expect_fail(m, base, k ? "mlx config cut in half" : "PEFT config cut in half", d, LMX_ERR_FORMAT,
                    "adapter_config.json", NULL);
        free(s);
        free(t);
        free(d);

        snprintf(buf, sizeof buf, "cut_weights%d", k);
        d = sub_dir(dir, buf);
        copy_into(srcs[k], "adapter_config.json", d, NULL);
        s = lmx_path_join(srcs[k], wnames[k]);
        t = lmx_path_join(d, wnames[k]);
        text = read_all(s, &n);
        if (text) write_file(t, text, 100); /* the header's JSON ends in the middle */
        free(text);
        expect_fail(m, base, k ? "mlx weights cut short" : "PEFT weights cut short", d, LMX_ERR_FORMAT, wnames[k], NULL);
        free(s);
        free(t);
        free(d);
    }

    /* a PEFT adapter trained for another architecture */
    char *q = fixture("qwen3_lora", "peft_adapter");
    expect_fail(m, base, "qwen3 PEFT adapter on llama", q, LMX_ERR_UNSUPPORTED, "Qwen3ForCausalLM", "llama");
    free(q);

    /* the model still takes a good adapter; its memory is counted, and given back by lmx_adapter_free */
    int64_t mem0 = model_info(m).memory_bytes;
    lmx_adapter *a = load_adapter(m, peft);
    int64_t mem1 = model_info(m).memory_bytes;
    float *with = tok_logits(m, a);
    CHECK_MSG(max_diff(with, base, (size_t)N_TOK * (size_t)vocab(m)) > 1e-3, "the fixture adapter changes nothing");
    free(with);
    int64_t mem2 = model_info(m).memory_bytes;
    lmx_adapter_free(a);
    int64_t mem3 = model_info(m).memory_bytes;
    CHECK_MSG(mem1 > mem0 && mem2 - mem3 == mem1 - mem0, "memory_bytes %lld, %lld with the adapter, %lld after an eval, "
              "%lld after lmx_adapter_free", (long long)mem0, (long long)mem1, (long long)mem2, (long long)mem3);

    free(peft);
    free(mlx);
    free(base);
    end_case(dir);
    lmx_model_free(m);
}

/* ---- 2. info, rsLoRA, patterns, dtypes --------------------------------------------------------------- */

/* A copy of the fixture's PEFT adapter in dir/name, its tensors rewritten by fn (NULL: copied) and
 * config key set to json (key NULL: none). */
static char *peft_variant(const char *dir, const char *name, wt_fn fn, const char *key, const char *json) {
    char *peft = fixture("llama_lora", "peft_adapter"), *d = sub_dir(dir, name);
    copy_into(peft, "adapter_config.json", d, NULL);
    if (fn) {
        char *s = lmx_path_join(peft, "adapter_model.safetensors"), *t = lmx_path_join(d, "adapter_model.safetensors");
        rewrite_tensors(s, t, fn);
        free(s);
        free(t);
    } else {
        copy_into(peft, "adapter_model.safetensors", d, NULL);
    }
    if (key) config_set(d, key, json);
    free(peft);
    return d;
}

static void check_logits_equal(lmx_model *m, lmx_adapter *x, lmx_adapter *y, double tol, const char *label) {
    float *lx = tok_logits(m, x), *ly = tok_logits(m, y);
    double d = max_diff(lx, ly, (size_t)N_TOK * (size_t)vocab(m));
    CHECK_MSG(d <= tol, "%s: logits differ by %g (tolerance %g)", label, d, tol);
    free(lx);
    free(ly);
}

static void check_logits_differ(lmx_model *m, lmx_adapter *x, lmx_adapter *y, const char *label) {
    float *lx = tok_logits(m, x), *ly = tok_logits(m, y);
    double d = max_diff(lx, ly, (size_t)N_TOK * (size_t)vocab(m));
    CHECK_MSG(d > tol_differ() && d < INFINITY, "%s: logits differ by only %g", label, d);
    free(lx);
    free(ly);
}

static void case_info(void) {
    lmx_model *m = load_model("llama", NULL);
    if (!m) return;
    lmx_model_info mi = model_info(m);
    char *peft = fixture("llama_lora", "peft_adapter"), *mlx = fixture("llama_lora", "mlx_adapter");
    char *peft_st = lmx_path_join(peft, "adapter_model.safetensors"), *mlx_st = lmx_path_join(mlx, "adapters.safetensors");
    const char *all = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";

    lmx_adapter *ap = load_adapter(m, peft), *am = load_adapter(m, mlx);
    lmx_adapter_info ip = adapter_info(ap), im = adapter_info(am);
    CHECK_MSG(strcmp(ip.format, "peft") == 0, "format %s", ip.format);
    CHECK_MSG(strcmp(ip.path, peft) == 0, "path %s", ip.path);
    CHECK_MSG(ip.rank == 4, "rank %d", ip.rank);
    CHECK_MSG(ip.scale == 2.0f, "scale %g (alpha 8 / r 4)", ip.scale);
    CHECK(ip.scales_differ == 0);
    CHECK_MSG(strcmp(ip.targets, all) == 0, "targets %s", ip.targets);
    CHECK_MSG(ip.first_layer == 0 && ip.last_layer == mi.n_layers - 1, "layers %d..%d", ip.first_layer, ip.last_layer);
    CHECK_MSG(ip.n_modules == 7 * mi.n_layers, "n_modules %d", ip.n_modules);
    int64_t np = st_elements(peft_st);
    CHECK_MSG(ip.n_params == np && np > 0, "n_params %lld, the file holds %lld", (long long)ip.n_params, (long long)np);

    CHECK_MSG(strcmp(im.format, "mlx") == 0, "format %s", im.format);
    CHECK_MSG(im.rank == 4 && im.scale == 2.0f && im.scales_differ == 0, "mlx rank %d scale %g", im.rank, im.scale);
    CHECK_MSG(strcmp(im.targets, all) == 0, "mlx targets %s", im.targets);
    CHECK_MSG(im.n_modules == 7 * mi.n_layers && im.n_params == st_elements(mlx_st), "mlx n_modules %d n_params %lld",
              im.n_modules, (long long)im.n_params);
    /* the same adapter in two layouts */
    check_logits_equal(m, ap, am, tol(1e-4), "PEFT vs mlx-lm layout of the fixture adapter");
    check_logits_differ(m, ap, LMX_NO_ADAPTER, "fixture adapter vs none");

    lmx_adapter_info dummy;
    CHECK(lmx_adapter_get_info(NULL, &dummy) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_adapter_get_info(LMX_NO_ADAPTER, &dummy) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_adapter_get_info(ap, NULL) == LMX_ERR_INVALID_ARG);
    lmx_adapter_free(NULL);           /* no-ops */
    lmx_adapter_free(LMX_NO_ADAPTER);

    char *dir = case_dir("adapter_info");
    /* rsLoRA: alpha / sqrt(r) = 8 / 2 = 4, the same as lora_alpha 16 without it */
    char *d_rs = peft_variant(dir, "rslora", NULL, "use_rslora", "true");
    char *d_a16 = peft_variant(dir, "alpha16", NULL, "lora_alpha", "16");
    lmx_adapter *rs = load_adapter(m, d_rs), *a16 = load_adapter(m, d_a16);
    lmx_adapter_info irs = adapter_info(rs), i16 = adapter_info(a16);
    CHECK_MSG(irs.scale == 4.0f && irs.scales_differ == 0, "rsLoRA scale %g, want 8/sqrt(4) = 4", irs.scale);
    CHECK_MSG(i16.scale == 4.0f, "lora_alpha 16 scale %g", i16.scale);
    check_logits_equal(m, rs, a16, tol(1e-5), "rsLoRA vs lora_alpha 16");
    check_logits_differ(m, rs, ap, "rsLoRA vs plain");

    /* alpha_pattern {"q_proj": 16}: q_proj at scale 4 == q_proj's B doubled at scale 2 */
    char *d_aq = peft_variant(dir, "alpha_q", NULL, "alpha_pattern", "{\"q_proj\": 16}");
    char *d_q2 = peft_variant(dir, "q_doubled", wt_q_double, NULL, NULL);
    lmx_adapter *aq = load_adapter(m, d_aq), *q2 = load_adapter(m, d_q2);
    lmx_adapter_info iaq = adapter_info(aq);
    CHECK_MSG(iaq.scales_differ == 1, "alpha_pattern: scales_differ %d", iaq.scales_differ);
    CHECK_MSG(iaq.scale == 4.0f, "alpha_pattern: first projection (layer 0 q_proj) scale %g, want 16/4", iaq.scale);
    CHECK(adapter_info(q2).scales_differ == 0);
    check_logits_equal(m, aq, q2, tol(1e-5), "alpha_pattern q_proj 16 vs q_proj B doubled");
    check_logits_differ(m, aq, ap, "alpha_pattern vs plain");

    /* an alpha_pattern key naming one module by path: layer 1's q_proj only */
    char *d_a1 = peft_variant(dir, "alpha_q1", NULL, "alpha_pattern",
                              "{\"model\\\\.layers\\\\.1\\\\.self_attn\\\\.q_proj\": 16}");
    char *d_q12 = peft_variant(dir, "q1_doubled", wt_q1_double, NULL, NULL);
    lmx_adapter *a1q = load_adapter(m, d_a1), *q12 = load_adapter(m, d_q12);
    lmx_adapter_info ia1 = adapter_info(a1q);
    CHECK_MSG(ia1.scales_differ == 1 && ia1.scale == 2.0f, "alpha_pattern layer 1: scale %g differ %d", ia1.scale,
              ia1.scales_differ);
    check_logits_equal(m, a1q, q12, tol(1e-5), "alpha_pattern layers.1 q_proj 16 vs its B doubled");

    /* rank_pattern {"v_proj": 2} with rank-2 v_proj tensors: loads, v_proj at alpha / 2 */
    char *d_rp = peft_variant(dir, "rank_v2", wt_v_rank2, "rank_pattern", "{\"v_proj\": 2}");
    char *rp_st = lmx_path_join(d_rp, "adapter_model.safetensors");
    lmx_adapter *rp = load_adapter(m, d_rp);
    lmx_adapter_info irp = adapter_info(rp);
    CHECK_MSG(irp.rank == 4 && irp.scales_differ == 1, "rank_pattern: rank %d scales_differ %d", irp.rank,
              irp.scales_differ);
    CHECK_MSG(irp.n_params == st_elements(rp_st), "rank_pattern: n_params %lld", (long long)irp.n_params);
    check_logits_differ(m, rp, ap, "rank_pattern vs plain");

    /* layers_to_transform naming every layer loads; leaving out a layer with tensors fails (case 1) */
    char *d_lt = peft_variant(dir, "layers01", NULL, "layers_to_transform", "[0, 1]");
    lmx_adapter *lt = load_adapter(m, d_lt);
    check_logits_equal(m, lt, ap, 0, "layers_to_transform [0, 1] vs none");
    char *d_l1 = peft_variant(dir, "layer1", NULL, "layers_to_transform", "1");
    lmx_adapter *bad = NULL;
    lmx_status st = lmx_adapter_load(m, d_l1, &bad);
    CHECK_MSG(st == LMX_ERR_FORMAT && !bad, "layers_to_transform 1: %s", lmx_status_str(st));
    CHECK_CONTAINS(lmx_last_error(m), "layers_to_transform");
    CHECK_CONTAINS(lmx_last_error(m), "layers.0.");

    /* the same random adapter stored as f32, f16 and bf16 gives the same logits */
    const lmx_dtype dts[3] = {LMX_DTYPE_F32, LMX_DTYPE_F16, LMX_DTYPE_BF16};
    lmx_adapter *ad[3] = {0};
    char *dd[3] = {0};
    for (int k = 0; k < 3; k++) {
        char name[16];
        snprintf(name, sizeof name, "rand_%s", lmx_dtype_name(dts[k]));
        dd[k] = sub_dir(dir, name);
        write_random_peft(dd[k], &mi, "LlamaForCausalLM", 8, 4.0, PROJ_BIT(LMX_PROJ_Q) | PROJ_BIT(LMX_PROJ_UP), dts[k], 77);
        ad[k] = load_adapter(m, dd[k]);
        lmx_adapter_info ik = adapter_info(ad[k]);
        CHECK_MSG(ik.rank == 8 && ik.scale == 0.5f && strcmp(ik.targets, "q_proj,up_proj") == 0 &&
                      ik.n_modules == 2 * mi.n_layers,
                  "%s adapter: rank %d scale %g targets %s n_modules %d", name, ik.rank, ik.scale, ik.targets, ik.n_modules);
    }
    check_logits_equal(m, ad[0], ad[1], 1e-6, "f32 vs f16 adapter");
    check_logits_equal(m, ad[0], ad[2], 1e-6, "f32 vs bf16 adapter");
    check_logits_differ(m, ad[0], LMX_NO_ADAPTER, "random adapter vs none");
    for (int k = 0; k < 3; k++) free(dd[k]);

    /* adapters left loaded (ap, am, rs, ...) are freed by lmx_model_free */
    lmx_adapter_free(a16);
    lmx_adapter_free(q2);
    free(d_rs), free(d_a16), free(d_aq), free(d_q2), free(d_a1), free(d_q12);
    free(d_rp), free(rp_st), free(d_lt), free(d_l1);
    end_case(dir);
    free(peft), free(mlx), free(peft_st), free(mlx_st);
    lmx_model_free(m);
}

/* ---- 2b. the real adapters --------------------------------------------------------------------------- */

static char *real_adapter(const char *name) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/real/adapters/%s", g_fixtures, name);
    return strdup(buf);
}

static void case_real_adapters(void) {
    lmx_err err = {0};
    lmx_lora_file f;

    /* Gemma 3 270M, PEFT r=8 alpha=16 on q_proj, v_proj of its 18 layers */
    char *gemma = real_adapter("gemma-3-270m-it-peft-lora");
    CHECK_MSG(lmx_is_dir(gemma), "%s missing", gemma);
    lmx_status st = lmx_lora_file_open(gemma, &f, &err);
    CHECK_MSG(st == LMX_OK, "%s", err.msg);
    if (st == LMX_OK) {
        CHECK(f.format == LMX_LORA_PEFT);
        CHECK_MSG(f.n == 36, "gemma: %d modules, want 18 x {q, v}", f.n);
        int ok = 1;
        for (int i = 0; i < f.n; i++) {
            const lmx_lora_entry *e = &f.e[i];
            int good = e->layer == i / 2 && e->proj == (i % 2 ? LMX_PROJ_V : LMX_PROJ_Q) && e->rank == 8 &&
                       e->scale == 2.0f && !e->transposed && e->a && e->b && e->a->shape[0] == 8 && e->b->shape[1] == 8;
            if (!good) fprintf(stderr, "  gemma entry %d: layer %d proj %d rank %d scale %g\n", i, e->layer, e->proj,
                               e->rank, e->scale);
            ok &= good;
        }
        CHECK_MSG(ok, "gemma entries are not layers 0..17 x {q_proj, v_proj} at rank 8, scale 2");
        CHECK(f.base_class[0] == 0);
        lmx_lora_file_close(&f);
    }
    /* on a fixture base of another size: a shape error naming the first tensor */
    lmx_model *m = load_model("gemma3", NULL);
    if (m) {
        lmx_adapter *a = NULL;
        st = lmx_adapter_load(m, gemma, &a);
        CHECK_MSG(st == LMX_ERR_SHAPE && !a, "gemma adapter on the gemma3 fixture: %s", lmx_status_str(st));
        CHECK_CONTAINS(lmx_last_error(m), "model.layers.0.self_attn.q_proj.lora_A.weight");
        if (getenv("LMX_TEST_VERBOSE")) printf("  %-34s %s\n", "real gemma adapter", lmx_last_error(m));
        lmx_model_free(m);
    }
    free(gemma);

    /* Qwen2.5 0.5B, mlx-lm rank 8 scale 10, num_layers 4, no keys: q_proj, v_proj of layers 20..23 */
    char *qwen = real_adapter("qwen2.5-0.5b-instruct-mlx-lora");
    CHECK_MSG(lmx_is_dir(qwen), "%s missing", qwen);
    st = lmx_lora_file_open(qwen, &f, &err);
    CHECK_MSG(st == LMX_OK, "%s", err.msg);
    if (st == LMX_OK) {
        CHECK(f.format == LMX_LORA_MLX);
        CHECK_MSG(f.num_layers == 4, "num_layers %d", f.num_layers);
        CHECK_MSG(f.n == 8, "qwen: %d modules, want layers 20..23 x {q, v}", f.n);
        int ok = 1;
        for (int i = 0; i < f.n; i++) {
            const lmx_lora_entry *e = &f.e[i];
            int good = e->layer == 20 + i / 2 && e->proj == (i % 2 ? LMX_PROJ_V : LMX_PROJ_Q) && e->rank == 8 &&
                       e->scale == 10.0f && e->transposed && e->a && e->b && e->a->shape[1] == 8 && e->b->shape[0] == 8;
            if (!good) fprintf(stderr, "  qwen entry %d: layer %d proj %d rank %d scale %g\n", i, e->layer, e->proj,
                               e->rank, e->scale);
            ok &= good;
        }
        CHECK_MSG(ok, "qwen entries are not layers 20..23 x {q_proj, v_proj} at rank 8, scale 10");
        lmx_lora_file_close(&f);
    }
    m = load_model("qwen2", NULL);
    if (m) {
        lmx_adapter *a = NULL;
        st = lmx_adapter_load(m, qwen, &a);
        CHECK_MSG(st == LMX_ERR_SHAPE && !a, "qwen adapter on the 2-layer qwen2 fixture: %s", lmx_status_str(st));
        CHECK_CONTAINS(lmx_last_error(m), "model.layers.20.self_attn.q_proj.lora_a");
        CHECK_CONTAINS(lmx_last_error(m), "layer 20");
        if (getenv("LMX_TEST_VERBOSE")) printf("  %-34s %s\n", "real qwen adapter", lmx_last_error(m));
        lmx_model_free(m);
    }
    free(qwen);
}

/* ---- 3. an mlx-lm numbered checkpoint ------------------------------------------------------------------ */

static void case_checkpoint(void) {
    lmx_model *m = load_model("llama", NULL);
    if (!m) return;
    char *mlx = fixture("llama_lora", "mlx_adapter"), *dir = case_dir("adapter_ckpt");
    copy_into(mlx, "adapter_config.json", dir, NULL);
    copy_into(mlx, "adapters.safetensors", dir, "0000100_adapters.safetensors");
    char *file = lmx_path_join(dir, "0000100_adapters.safetensors");
    lmx_adapter *folder = load_adapter(m, mlx), *ckpt = load_adapter(m, file);
    lmx_adapter_info ic = adapter_info(ckpt);
    CHECK_MSG(strcmp(ic.format, "mlx") == 0 && strcmp(ic.path, file) == 0, "checkpoint format %s path %s", ic.format,
              ic.path);
    check_logits_equal(m, folder, ckpt, 0, "numbered checkpoint vs its folder");
    /* the folder itself has no adapters.safetensors */
    lmx_adapter *bad = NULL;
    lmx_status st = lmx_adapter_load(m, dir, &bad);
    CHECK_MSG(st == LMX_ERR_MISSING && !bad, "checkpoint folder without adapters.safetensors: %s", lmx_status_str(st));
    CHECK_CONTAINS(lmx_last_error(m), "adapters.safetensors");
    free(file);
    free(mlx);
    end_case(dir);
    lmx_model_free(m);
}

/* ---- 4. a batch mixing adapters ------------------------------------------------------------------------ */

#define NB 5

/* On model (base class cls): the fixture's PEFT adapter, a random rank-2 one and a random rank-8 one. */
static void case_mixed_batch(const char *model, const char *cls, int min_changed) {
    lmx_model *m = load_model(model, NULL);
    if (!m) return;
    lmx_model_info mi = model_info(m);
    int V = mi.vocab_size;
    char lora[64];
    snprintf(lora, sizeof lora, "%s_lora", model);
    char *dir = case_dir("adapter_batch"), *peft = fixture(lora, "peft_adapter");
    char *d2 = sub_dir(dir, "r2"), *d3 = sub_dir(dir, "r8");
    write_random_peft(d2, &mi, cls, 2, 4.0,
                      PROJ_BIT(LMX_PROJ_Q) | PROJ_BIT(LMX_PROJ_V) | PROJ_BIT(LMX_PROJ_DOWN), LMX_DTYPE_F32, 11);
    write_random_peft(d3, &mi, NULL, 8, 16.0,
                      PROJ_BIT(LMX_PROJ_K) | PROJ_BIT(LMX_PROJ_O) | PROJ_BIT(LMX_PROJ_GATE) | PROJ_BIT(LMX_PROJ_UP),
                      LMX_DTYPE_BF16, 12);
    lmx_adapter *a1 = load_adapter(m, peft), *a2 = load_adapter(m, d2), *a3 = load_adapter(m, d3);
    lmx_adapter_info i2 = adapter_info(a2), i3 = adapter_info(a3);
    CHECK_MSG(i2.rank == 2 && i2.scale == 2.0f && strcmp(i2.targets, "q_proj,v_proj,down_proj") == 0,
              "rank-2 adapter: rank %d scale %g targets %s", i2.rank, i2.scale, i2.targets);
    CHECK_MSG(i3.rank == 8 && i3.scale == 2.0f && strcmp(i3.targets, "k_proj,o_proj,gate_proj,up_proj") == 0,
              "rank-8 adapter: rank %d scale %g targets %s", i3.rank, i3.scale, i3.targets);
    if (!a1 || !a2 || !a3) goto out;

    lmx_adapter *ads[NB] = {a1, a2, a3, LMX_NO_ADAPTER, a2};
    const char *ad_names[NB] = {"fixture", "rank 2", "rank 8", "none", "rank 2"};
    const int lens[NB] = {3, 9, 6, 12, 4};
    int32_t store[NB][12];
    const int32_t *prompts[NB];
    uint64_t seed = 5;
    for (int i = 0; i < NB; i++) {
        for (int t = 0; t < lens[i]; t++) store[i][t] = rng_int(&seed, 3, V - 1);
        prompts[i] = store[i];
    }

    /* generation: each entry equals its prompt generated alone under its adapter */
    lmx_gen_params params[NB];
    for (int i = 0; i < NB; i++) params[i] = greedy_params(ads[i]);
    lmx_result res[NB];
    int32_t got[NB][GEN_MAX];
    int n_got[NB];
    lmx_status st = lmx_batch_generate_ids(m, prompts, lens, NB, params, res);
    CHECK_MSG(st == LMX_OK, "batch generate: %s (%s)", lmx_status_str(st), lmx_last_error(m));
    for (int i = 0; i < NB; i++) {
        n_got[i] = st == LMX_OK ? (res[i].n_ids < GEN_MAX ? res[i].n_ids : GEN_MAX) : -1;
        if (n_got[i] > 0) memcpy(got[i], res[i].ids, (size_t)n_got[i] * sizeof(int32_t));
        if (st == LMX_OK) CHECK_MSG(res[i].n_ids == GEN_MAX, "batch entry %d: %d ids", i, res[i].n_ids);
    }
    int n_other = 0; /* entries whose ids another adapter changes: what makes the comparison mean something */
    for (int i = 0; i < NB; i++) {
        int32_t one[GEN_MAX], alt[GEN_MAX];
        int n = gen(m, prompts[i], lens[i], ads[i], one, NULL);
        CHECK_MSG(same_ids(got[i], n_got[i], one, n), "%s: batch entry %d (adapter %s) differs from its prompt alone",
                  model, i, ad_names[i]);
        int k = gen(m, prompts[i], lens[i], ads[(i + 1) % NB], alt, NULL);
        n_other += !same_ids(one, n, alt, k);
    }
    if (getenv("LMX_TEST_VERBOSE"))
        printf("  %s batch: %d of %d entries change under another adapter\n", model, n_other, NB);
    CHECK_MSG(n_other >= min_changed, "%s: only %d of %d prompts generate differently under another adapter", model,
              n_other, NB);

    /* classify: the batch's logits equal each prompt's alone, and differ from no adapter */
    float *all = malloc((size_t)NB * V * sizeof *all), *none = malloc((size_t)NB * V * sizeof *none);
    float *one = malloc((size_t)V * sizeof *one);
    int32_t next[NB];
    if (all && none && one) {
        st = lmx_classify_ids(m, prompts, lens, NB, ads, NULL, next, all);
        CHECK_MSG(st == LMX_OK, "classify: %s (%s)", lmx_status_str(st), lmx_last_error(m));
        CHECK(lmx_classify_ids(m, prompts, lens, NB, NULL, NULL, NULL, none) == LMX_OK);
        for (int i = 0; st == LMX_OK && i < NB; i++) {
            const float *row = all + (size_t)i * V;
            CHECK(next[i] == argmax(row, V));
            int32_t nid;
            CHECK(lmx_classify_ids(m, &prompts[i], &lens[i], 1, &ads[i], NULL, &nid, one) == LMX_OK);
            double d = max_diff(row, one, (size_t)V);
            CHECK_MSG(d <= tol(1e-4), "classify prompt %d: batch vs alone differ by %g", i, d);
            double dn = max_diff(row, none + (size_t)i * V, (size_t)V);
            if (ads[i] == LMX_NO_ADAPTER) CHECK_MSG(dn <= tol(1e-4), "classify prompt %d without adapter: %g", i, dn);
            else CHECK_MSG(dn > tol_differ(), "classify prompt %d: the adapter changes the logits by only %g", i, dn);
        }
    }
    free(all);
    free(none);
    free(one);
out:
    free(d2);
    free(d3);
    free(peft);
    end_case(dir);
    lmx_model_free(m); /* frees a1, a2, a3 */
}

/* ---- 5. the prompt cache never crosses adapters ---------------------------------------------------------- */

/* check_distinct: whether P must generate three different sequences under A1, A2 and none (so that
 * "equals a fresh run" tells the adapters apart; the llama fixture repeats one token whatever the adapter). */
static void case_prompt_cache(const char *model, int check_distinct) {
    lmx_model *m = load_model(model, NULL);
    if (!m) return;
    lmx_model_info mi = model_info(m);
    char lora[64];
    snprintf(lora, sizeof lora, "%s_lora", model);
    char *dir = case_dir("adapter_cache"), *peft = fixture(lora, "peft_adapter");
    char *d2 = sub_dir(dir, "r2");
    write_random_peft(d2, &mi, NULL, 2, 4.0, PROJ_BIT(LMX_PROJ_Q) | PROJ_BIT(LMX_PROJ_V) | PROJ_BIT(LMX_PROJ_DOWN),
                      LMX_DTYPE_F32, 21);
    lmx_adapter *a1 = load_adapter(m, peft), *a2 = load_adapter(m, d2);
    const int32_t *P = k_tok;
    const int n = N_TOK;
    int32_t ids1[GEN_MAX], ids2[GEN_MAX], idsN[GEN_MAX], x[GEN_MAX], ref[GEN_MAX];
    int cached = -1;

    /* references from fresh models */
    int n_ref2 = -1, n_refN = -1, n_ref1 = -1;
    int32_t refN[GEN_MAX], ref1[GEN_MAX];
    lmx_model *f = load_model(model, NULL);
    if (f) {
        lmx_adapter *f2 = load_adapter(f, d2);
        n_ref2 = f2 ? gen(f, P, n, f2, ref, NULL) : -1;
        lmx_model_free(f);
    }
    f = load_model(model, NULL);
    if (f) {
        n_refN = gen(f, P, n, LMX_NO_ADAPTER, refN, NULL);
        lmx_model_free(f);
    }
    f = load_model(model, peft);
    if (f) {
        n_ref1 = gen(f, P, n, NULL, ref1, NULL);
        lmx_model_free(f);
    }

    int n1 = gen(m, P, n, a1, ids1, &cached);
    CHECK_MSG(same_ids(ids1, n1, ref1, n_ref1), "P under A1 differs from a fresh model with A1");
    int n2 = gen(m, P, n, a2, ids2, &cached);
    CHECK_MSG(cached == 0, "P under A2 after P under A1 reused %d cached tokens", cached);
    CHECK_MSG(same_ids(ids2, n2, ref, n_ref2), "P under A2 after A1 differs from a fresh model with A2");
    if (check_distinct)
        CHECK_MSG(!same_ids(ref1, n_ref1, ref, n_ref2) && !same_ids(ref1, n_ref1, refN, n_refN) &&
                      !same_ids(ref, n_ref2, refN, n_refN),
                  "%s: P generates the same ids under two of A1, A2, none", model);
    int k = gen(m, P, n, a2, x, &cached);
    CHECK_MSG(cached > 0, "P under A2 twice: nothing reused");
    CHECK_MSG(same_ids(x, k, ids2, n2), "P under A2 from the cache differs");

    /* the default adapter (set on the model) against LMX_NO_ADAPTER */
    CHECK(lmx_model_set_adapter(m, a1) == LMX_OK);
    k = gen(m, P, n, NULL, x, &cached);
    CHECK_MSG(cached == 0, "P under the default (A1) after A2 reused %d tokens", cached);
    CHECK_MSG(same_ids(x, k, ids1, n1), "P under the default A1 differs from P under A1");
    k = gen(m, P, n, NULL, x, &cached);
    CHECK_MSG(cached > 0 && same_ids(x, k, ids1, n1), "P under the default twice: cached %d", cached);
    k = gen(m, P, n, LMX_NO_ADAPTER, idsN, &cached);
    CHECK_MSG(cached == 0, "P without adapter after the default A1 reused %d tokens", cached);
    CHECK_MSG(same_ids(idsN, k, refN, n_refN), "P without adapter differs from a fresh base model");
    int nN = k;
    k = gen(m, P, n, LMX_NO_ADAPTER, x, &cached);
    CHECK_MSG(cached > 0 && same_ids(x, k, idsN, nN), "P without adapter twice: cached %d", cached);
    k = gen(m, P, n, NULL, x, &cached);
    CHECK_MSG(cached == 0, "P under the default after no adapter reused %d tokens", cached);
    CHECK_MSG(same_ids(x, k, ids1, n1), "P under the default after no adapter differs");
    k = gen(m, P, n, a1, x, &cached); /* naming the default's adapter is the same adapter */
    CHECK_MSG(cached > 0 && same_ids(x, k, ids1, n1), "P under A1 after the default A1: cached %d", cached);
    CHECK(lmx_model_set_adapter(m, LMX_NO_ADAPTER) == LMX_OK);
    k = gen(m, P, n, NULL, x, &cached);
    CHECK_MSG(cached == 0 && same_ids(x, k, idsN, nN), "P under a cleared default: cached %d", cached);

    free(d2);
    free(peft);
    end_case(dir);
    lmx_model_free(m);
}

/* ---- 6. the load-time adapter, a freed adapter, another model's adapter ------------------------------------ */

static void case_load_time(void) {
    char *peft = fixture("llama_lora", "peft_adapter");
    lmx_status st;
    lmx_model *mA = load_model("llama", peft), *mB = load_model("llama", NULL);
    if (!mA || !mB) goto out;
    int V = vocab(mA);
    size_t nv = (size_t)N_TOK * V;
    lmx_adapter *aB = load_adapter(mB, peft);
    float *LA = malloc(nv * sizeof *LA), *LB = malloc(nv * sizeof *LB), *L = malloc(nv * sizeof *L);
    float *base = tok_logits(mB, LMX_NO_ADAPTER);
    lmx_context *cA = NULL, *cB = NULL;
    CHECK(lmx_context_create(mA, NULL, &cA) == LMX_OK);
    CHECK(lmx_context_create(mB, NULL, &cB) == LMX_OK);
    if (!LA || !LB || !L || !cA || !cB || !aB) goto free_ctx;
    CHECK(lmx_context_set_adapter(cB, aB) == LMX_OK);
    CHECK(lmx_context_eval(cA, k_tok, N_TOK, LA, 1) == LMX_OK);
    CHECK(lmx_context_eval(cB, k_tok, N_TOK, LB, 1) == LMX_OK);
    CHECK_MSG(max_diff(LA, LB, nv) <= 1e-6, "load-time adapter vs lmx_adapter_load + set_adapter: %g", max_diff(LA, LB, nv));
    CHECK_MSG(max_diff(LA, base, nv) > 1e-3, "the load-time adapter changes nothing");
    int32_t x[GEN_MAX], y[GEN_MAX];
    int nx = gen(mA, k_tok, N_TOK, NULL, x, NULL), ny = gen(mB, k_tok, N_TOK, aB, y, NULL);
    CHECK_MSG(same_ids(x, nx, y, ny), "generation under the load-time adapter differs");

    /* an adapter of another model is refused everywhere */
    lmx_gen_params gp = greedy_params(aB);
    lmx_result r;
    CHECK(lmx_context_set_adapter(cA, aB) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_model_set_adapter(mA, aB) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_generate_ids(mA, k_tok, N_TOK, &gp, &r) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(mA), "another model");
    const int32_t *pr = k_tok;
    int len = N_TOK;
    CHECK(lmx_classify_ids(mA, &pr, &len, 1, &aB, NULL, NULL, L) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_batch_generate_ids(mA, &pr, &len, 1, &gp, &r) == LMX_ERR_INVALID_ARG);

    /* a freed adapter: the context that uses it fails, then works again with another */
    int past = lmx_context_n_past(cB);
    lmx_adapter_free(aB);
    st = lmx_context_eval(cB, k_tok, N_TOK, L, 1);
    CHECK_MSG(st == LMX_ERR_INVALID_ARG, "eval with a freed adapter: %s", lmx_status_str(st));
    CHECK_CONTAINS(lmx_last_error(mB), "freed");
    CHECK(lmx_context_n_past(cB) == past);
    CHECK(lmx_context_set_adapter(cB, LMX_NO_ADAPTER) == LMX_OK);
    CHECK_MSG(lmx_context_n_past(cB) == 0, "switching adapters kept %d cached positions", lmx_context_n_past(cB));
    st = lmx_context_eval(cB, k_tok, N_TOK, L, 1);
    CHECK_MSG(st == LMX_OK, "eval after set_adapter(NO_ADAPTER): %s (%s)", lmx_status_str(st), lmx_last_error(mB));
    CHECK_MSG(max_diff(L, base, nv) == 0, "after the freed adapter: logits differ from the base by %g",
              max_diff(L, base, nv));
free_ctx:
    lmx_context_free(cA);
    lmx_context_free(cB);
    free(LA), free(LB), free(L), free(base);
out:
    lmx_model_free(mA);
    lmx_model_free(mB);

    /* a bad load-time adapter fails the load and says why */
    static int sentinel;
    lmx_model *m = (lmx_model *)(void *)&sentinel;
    char *dir = fixture("llama", NULL);
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = g_backend;
    lp.adapter = "/nonexistent/lmx_no_adapter";
    st = lmx_model_load(dir, &lp, &m);
    CHECK_MSG(st == LMX_ERR_IO && m == NULL, "load with a missing adapter: %s", lmx_status_str(st));
    CHECK_CONTAINS(lmx_last_error(NULL), "adapter");
    CHECK_CONTAINS(lmx_last_error(NULL), "lmx_no_adapter");
    if (st == LMX_OK) lmx_model_free(m);
    lp.adapter = fixture("qwen3_lora", "peft_adapter"); /* another architecture */
    m = (lmx_model *)(void *)&sentinel;
    st = lmx_model_load(dir, &lp, &m);
    CHECK_MSG(st == LMX_ERR_UNSUPPORTED && m == NULL, "load with a qwen3 adapter: %s", lmx_status_str(st));
    CHECK_CONTAINS(lmx_last_error(NULL), "Qwen3ForCausalLM");
    if (st == LMX_OK) lmx_model_free(m);
    free((char *)lp.adapter);
    free(dir);
    free(peft);
}

/* lmx.h: "Free a; requests still naming it (a context, the default) fail until they name another." */
static void case_free_default(void) {
    char *peft = fixture("llama_lora", "peft_adapter");
    lmx_model *m = load_model("llama", NULL);
    lmx_adapter *a = m ? load_adapter(m, peft) : NULL;
    if (a) {
        CHECK(lmx_model_set_adapter(m, a) == LMX_OK);
        lmx_context *c = NULL;
        CHECK(lmx_context_create(m, NULL, &c) == LMX_OK); /* starts with the default */
        lmx_adapter_free(a);
        float *L = malloc((size_t)N_TOK * vocab(m) * sizeof *L);
        CHECK(c && L && lmx_context_eval(c, k_tok, N_TOK, L, 1) == LMX_ERR_INVALID_ARG);
        lmx_gen_params gp = greedy_params(NULL); /* names the default, which was freed */
        lmx_result r;
        lmx_status st = lmx_generate_ids(m, k_tok, N_TOK, &gp, &r);
        CHECK_MSG(st == LMX_ERR_INVALID_ARG, "generation under a freed default adapter: %s, want \"%s\" (lmx.h: "
                  "requests still naming it (a context, the default) fail until they name another)",
                  lmx_status_str(st), lmx_status_str(LMX_ERR_INVALID_ARG));
        gp.adapter = LMX_NO_ADAPTER;
        CHECK(lmx_generate_ids(m, k_tok, N_TOK, &gp, &r) == LMX_OK);
        CHECK(lmx_model_set_adapter(m, NULL) == LMX_OK);
        gp.adapter = NULL;
        CHECK(lmx_generate_ids(m, k_tok, N_TOK, &gp, &r) == LMX_OK);
        free(L);
        lmx_context_free(c);
    }
    lmx_model_free(m);
    free(peft);
}

/* ---- 7. the fixture adapters against the HF references ------------------------------------------------------ */

/* Whether out [V] is within the fixtures' tolerance of row t of F32 tensor r [*, V] (f32 on the cpu,
 * bf16 elsewhere); *err: the error over the tolerance (f32), or the relative L2 error (bf16). */
static int row_close(const lmx_st_tensor *r, int64_t t, const float *out, int V, double *err) {
    if (strcmp(g_backend, "cpu") != 0) { /* the fixtures' bf16 criterion: relative L2 error <= 2e-2 */
        double num = 0, den = 0;
        for (int v = 0; v < V; v++) {
            float x;
            memcpy(&x, (const char *)r->data + ((size_t)t * V + v) * 4, 4);
            num += ((double)out[v] - x) * ((double)out[v] - x);
            den += (double)x * x;
        }
        *err = sqrt(num / (den > 0 ? den : 1));
        return *err <= 2e-2;
    }
    *err = f32_tol_ratio(out, (const char *)r->data + (size_t)t * V * 4, V);
    return *err <= 1;
}

static const lmx_st_tensor *ref_f32(const lmx_st_set *s, const char *name, int V) {
    const lmx_st_tensor *t = s ? lmx_st_set_find(s, name) : NULL;
    int ok = t && t->dtype == LMX_DTYPE_F32 && t->ndim == 2 && t->shape[1] == V;
    CHECK_MSG(ok, "reference %s missing or not F32 [*, %d]", name, V);
    return ok ? t : NULL;
}

static lmx_st_set *open_ref(const char *model) {
    char *p = fixture(model, "reference.safetensors");
    lmx_st_set *s = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_st_set_open_file(p, &s, &err) == LMX_OK, "%s", err.msg);
    free(p);
    return s;
}

static void case_reference(const char *model, const char *kind) {
    char lora[64];
    snprintf(lora, sizeof lora, "%s_lora", model);
    char *apath = fixture(lora, kind);
    lmx_model *m = load_model(model, NULL);
    lmx_st_set *ref = open_ref(lora), *bref = open_ref(model);
    lmx_adapter *a = m ? load_adapter(m, apath) : NULL;
    int V = m ? vocab(m) : 0;
    const lmx_st_tensor *logits = ref_f32(ref, "short_logits", V);
    int64_t n_seq = 0;
    int32_t *seq = ref ? ref_ints(ref, "short_sequence", &n_seq) : NULL;
    if (!a || !logits || !seq || n_seq < logits->shape[0]) goto out;

    /* teacher-forced: every position of the short sequence */
    int T = (int)logits->shape[0];
    float *out = malloc((size_t)T * V * sizeof *out);
    lmx_status st = out ? eval_all(m, a, seq, T, out) : LMX_ERR_NOMEM;
    CHECK_MSG(st == LMX_OK, "%s %s: eval %s", model, kind, lmx_status_str(st));
    int bad = 0, worst = -1;
    double worst_err = 0, e;
    for (int t = 0; st == LMX_OK && t < T; t++)
        if (!row_close(logits, t, out + (size_t)t * V, V, &e)) {
            bad++;
            if (e > worst_err) worst_err = e, worst = t;
        }
    CHECK_MSG(st == LMX_OK && bad == 0, "%s %s: %d of %d positions off the reference (worst: position %d, %g)", model,
              kind, bad, T, worst, worst_err);
    /* the base model alone is not the reference (the adapter matters) */
    if (out && eval_all(m, LMX_NO_ADAPTER, seq, T, out) == LMX_OK) {
        int close = 1;
        for (int t = 0; t < T; t++) close &= row_close(logits, t, out + (size_t)t * V, V, &e);
        CHECK_MSG(!close, "%s: the base model alone matches the adapter's reference", model);
    }
    free(out);

    /* one padded batch: rows 0 and 2 under the adapter (its reference), row 1 without (the base's) */
    const lmx_st_tensor *bl = ref_f32(ref, "batch_last_logits", V), *bbl = ref_f32(bref, "batch_last_logits", V);
    int64_t np = 0, nl = 0, bnp = 0, bnl = 0;
    int32_t *bp = ref_ints(ref, "batch_prompts", &np), *blen = ref_ints(ref, "batch_lengths", &nl);
    int32_t *bbp = bref ? ref_ints(bref, "batch_prompts", &bnp) : NULL;
    int32_t *bblen = bref ? ref_ints(bref, "batch_lengths", &bnl) : NULL;
    if (bl && bbl && bp && blen && bbp && bblen && nl == 3 && bnl == 3 && np % 3 == 0 && bnp == np) {
        int W = (int)(np / 3);
        int32_t *tok = malloc((size_t)np * sizeof *tok);
        int lens[3] = {blen[0], bblen[1], blen[2]};
        float *last = malloc((size_t)3 * V * sizeof *last);
        lmx_context *c[3] = {0};
        st = tok && last ? LMX_OK : LMX_ERR_NOMEM;
        for (int b = 0; st == LMX_OK && b < 3; b++) {
            memcpy(tok + (size_t)b * W, (b == 1 ? bbp : bp) + (size_t)b * W, (size_t)W * sizeof *tok);
            if ((st = lmx_context_create(m, NULL, &c[b])) == LMX_OK)
                st = lmx_context_set_adapter(c[b], b == 1 ? LMX_NO_ADAPTER : a);
        }
        if (st == LMX_OK) st = lmx_eval_batch(m, c, 3, tok, lens, W, last);
        CHECK_MSG(st == LMX_OK, "%s %s: mixed batch: %s (%s)", model, kind, lmx_status_str(st), lmx_last_error(m));
        for (int b = 0; st == LMX_OK && b < 3; b++)
            CHECK_MSG(row_close(b == 1 ? bbl : bl, b, last + (size_t)b * V, V, &e),
                      "%s %s: mixed batch row %d (%s) off its reference by %g", model, kind, b,
                      b == 1 ? "no adapter" : "adapter", e);
        for (int b = 0; b < 3; b++) lmx_context_free(c[b]);
        free(tok);
        free(last);
    } else {
        CHECK_MSG(0, "%s: batch references missing or of unexpected shapes", model);
    }
    free(bp), free(blen), free(bbp), free(bblen);
out:
    free(seq);
    lmx_st_set_close(ref);
    lmx_st_set_close(bref);
    lmx_model_free(m);
    free(apath);
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");
    if (getenv("LMX_TEST_BACKEND")) g_backend = getenv("LMX_TEST_BACKEND");

    case_bad_adapters();
    case_info();
    case_real_adapters();
    case_checkpoint();
    case_mixed_batch("llama", "LlamaForCausalLM", 0); /* the llama fixture repeats one token */
    case_mixed_batch("qwen3", "Qwen3ForCausalLM", 4);
    case_prompt_cache("llama", 0);
    case_prompt_cache("qwen3", 1);
    case_load_time();
    case_free_default();
    const char *models[2] = {"llama", "qwen3"}, *kinds[2] = {"peft_adapter", "mlx_adapter"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 2; k++) case_reference(models[i], kinds[k]);
    return check_summary("test_adapter");
}
