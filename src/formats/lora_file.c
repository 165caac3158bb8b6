/* lora_file.c - read a PEFT or mlx-lm LoRA adapter (lora_file.h). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "lora_file.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fileio.h"
#include "../base/half.h"

static const char *const proj_modules[LMX_PROJ_N] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                     "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                     "mlp.down_proj"};

const char *lmx_proj_module(lmx_proj p) { return p >= 0 && p < LMX_PROJ_N ? proj_modules[p] : "?"; }
const char *lmx_proj_short(lmx_proj p) { return p >= 0 && p < LMX_PROJ_N ? strchr(proj_modules[p], '.') + 1 : "?"; }

/* key == t, or key ends with "." + t (PEFT's list matching) */
static int suffix_match(const char *key, const char *t) {
    size_t n = strlen(key), k = strlen(t);
    if (n == k) return memcmp(key, t, k) == 0;
    return n > k && key[n - k - 1] == '.' && memcmp(key + n - k, t, k) == 0;
}

/* ---- regular expressions (PEFT's target_modules string, rank_pattern / alpha_pattern keys) ---- */

/* 1 when subject matches the whole of pattern wrapped as wrap ("%s" inserted), 0 when not, -1 when
 * pattern does not compile (message in err). */
static int regex_match(const char *wrap, const char *pattern, const char *subject, const char *field, lmx_err *err) {
    size_t len = strlen(wrap) + strlen(pattern);
    char *full = malloc(len + 1);
    if (!full) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory"), -1;
    snprintf(full, len + 1, wrap, pattern);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)full, PCRE2_ZERO_TERMINATED, 0, &ec, &eo, NULL);
    free(full);
    if (!re) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        char q[128];
        lmx_err_set(err, LMX_ERR_FORMAT, "adapter_config.json: %s %s is not a regular expression lmx reads (%s)",
                    field, lmx_quote_str(q, sizeof q, pattern), (const char *)msg);
        return -1;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = md ? pcre2_match(re, (PCRE2_SPTR)subject, PCRE2_ZERO_TERMINATED, 0, 0, md, NULL) : -1;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc >= 0;
}

/* ---- config helpers ---------------------------------------------------------------------------- */

static int is_set(const cJSON *v) { return v && !cJSON_IsNull(v); }

static int truthy(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsTrue(v) || (cJSON_IsString(v) && v->valuestring[0]) || (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0) ||
           (cJSON_IsObject(v) && cJSON_GetArraySize(v) > 0) || (cJSON_IsNumber(v) && v->valuedouble != 0);
}

static lmx_status get_int(const cJSON *o, const char *key, int dflt, int *out, const char *where, lmx_err *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!is_set(v)) {
        if (dflt == INT32_MIN) return lmx_err_set(err, LMX_ERR_MISSING, "%s: no %s", where, LMX_QUOTED(key));
        *out = dflt;
        return LMX_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) > 1e9)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %s is not an integer", where, LMX_QUOTED(key));
    *out = (int)v->valuedouble;
    return LMX_OK;
}

/* The value of the first key of a PEFT pattern dict (rank_pattern, alpha_pattern) that matches
 * module key as re.match(rf"(.*\.)?({pattern})$", key) does; *found = 0 when none does. */
static lmx_status pattern_value(const cJSON *dict, const char *field, const char *key, double *v, int *found,
                                lmx_err *err) {
    *found = 0;
    if (!is_set(dict)) return LMX_OK;
    if (!cJSON_IsObject(dict)) return lmx_err_set(err, LMX_ERR_FORMAT, "adapter_config.json: %s is not an object", LMX_QUOTED(field));
    for (const cJSON *e = dict->child; e; e = e->next) {
        int m = regex_match("^(?:.*\\.)?(?:%s)$", e->string, key, field, err);
        if (m < 0) return err->status;
        if (m) {
            if (!cJSON_IsNumber(e) || e->valuedouble <= 0)
                return lmx_err_set(err, LMX_ERR_FORMAT, "adapter_config.json: %s[%s] is not a positive number",
                                   field, LMX_QUOTED(e->string));
            *v = e->valuedouble;
            *found = 1;
            return LMX_OK;
        }
    }
    return LMX_OK;
}

/* ---- tensor names -------------------------------------------------------------------------------- */

/* Split a tensor name "<...>layers.<N>.<module>.<role>" into layer, projection and role (the text
 * after the module).  Returns 0, or -1 when the name holds no decoder-layer projection. */
static int split_name(const char *name, int *layer, lmx_proj *proj, const char **role) {
    for (const char *p = strstr(name, "layers."); p; p = strstr(p + 1, "layers.")) {
        if (p != name && p[-1] != '.') continue;
        const char *d = p + 7;
        if (*d < '0' || *d > '9') continue;
        long l = strtol(d, (char **)&d, 10);
        if (*d != '.' || l > 1000000) continue;
        d++;
        for (int k = 0; k < LMX_PROJ_N; k++) {
            size_t n = strlen(proj_modules[k]);
            if (strncmp(d, proj_modules[k], n) == 0 && d[n] == '.') {
                *layer = (int)l;
                *proj = (lmx_proj)k;
                *role = d + n + 1;
                return 0;
            }
        }
    }
    return -1;
}

static const char *short_file(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static lmx_status unsupported_tensor(const lmx_st_tensor *t, const char *file, lmx_err *err) {
    const char *n = t->name;
    const char *why = strstr(n, "lora_magnitude_vector") || lmx_ends_with(n, ".m") ? "a DoRA magnitude (DoRA is not supported)"
                      : strstr(n, "lora_embedding") || strstr(n, "embed_tokens") ? "an embedding adapter (not supported)"
                      : strstr(n, "lm_head")                                     ? "an lm_head adapter (not supported)"
                      : strstr(n, "bias")                                        ? "a LoRA bias (not supported)"
                      : "not a LoRA matrix of a decoder layer's q/k/v/o/gate/up/down projection";
    return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: tensor %s is %s", short_file(file), LMX_QUOTED(n), why);
}

/* ---- PEFT -------------------------------------------------------------------------------------- */

typedef struct peft_cfg {
    const cJSON *root, *targets, *rank_pattern, *alpha_pattern, *layers;
    int r, rslora;
    double alpha;
} peft_cfg;

static lmx_status peft_config(const cJSON *root, peft_cfg *c, lmx_lora_file *f, lmx_err *err) {
    const char *W = "adapter_config.json";
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(root, "peft_type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "LORA") != 0)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: peft_type %s is not supported (LORA)", W,
                           cJSON_IsString(type) ? LMX_QUOTED(type->valuestring) : "?");
    static const char *const refused[] = {"use_dora", "modules_to_save", "lora_bias", "fan_in_fan_out",
                                          "layer_replication", "trainable_token_indices", "use_qalora",
                                          "target_parameters", "alora_invocation_tokens", "use_bdlora"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        if (truthy(root, refused[i]))
            return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: %s is set; lmx does not support it", W, LMX_QUOTED(refused[i]));
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(root, "bias");
    if (cJSON_IsString(bias) && strcmp(bias->valuestring, "none") != 0)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: \"bias\": %s is not supported (\"none\")", W, LMX_QUOTED(bias->valuestring));
    lmx_status st = get_int(root, "r", INT32_MIN, &c->r, W, err);
    if (st) return st;
    if (c->r <= 0) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"r\" is %d", W, c->r);
    const cJSON *alpha = cJSON_GetObjectItemCaseSensitive(root, "lora_alpha");
    if (is_set(alpha) && !cJSON_IsNumber(alpha)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"lora_alpha\" is not a number", W);
    c->alpha = is_set(alpha) ? alpha->valuedouble : 8.0; /* PEFT's default */
    c->rslora = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_rslora"));
    c->targets = cJSON_GetObjectItemCaseSensitive(root, "target_modules");
    c->rank_pattern = cJSON_GetObjectItemCaseSensitive(root, "rank_pattern");
    c->alpha_pattern = cJSON_GetObjectItemCaseSensitive(root, "alpha_pattern");
    c->layers = cJSON_GetObjectItemCaseSensitive(root, "layers_to_transform");
    if (is_set(c->layers) && !cJSON_IsNumber(c->layers) && !cJSON_IsArray(c->layers))
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"layers_to_transform\" is neither an integer nor a list", W);
    if (is_set(c->targets) && cJSON_IsArray(c->targets)) {
        /* every listed target must name one of the projections lmx adapts */
        for (const cJSON *t = c->targets->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: target_modules holds a non-string", W);
            int known = 0;
            for (int k = 0; k < LMX_PROJ_N; k++) known |= suffix_match(proj_modules[k], t->valuestring) ||
                                                        suffix_match(t->valuestring, proj_modules[k]);
            if (!known) {
                const char *s = t->valuestring;
                if (strstr(s, "embed") || strstr(s, "lm_head"))
                    return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: target_modules names %s: adapters on "
                                       "embeddings or the lm head are not supported", W, LMX_QUOTED(s));
                return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: target_modules names %s, which is no projection "
                                   "lmx adapts (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)", W, LMX_QUOTED(s));
            }
        }
    } else if (is_set(c->targets) && !cJSON_IsString(c->targets)) {
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: target_modules is neither a list nor a string", W);
    }
    const cJSON *auto_map = cJSON_GetObjectItemCaseSensitive(root, "auto_mapping");
    const cJSON *cls = cJSON_IsObject(auto_map) ? cJSON_GetObjectItemCaseSensitive(auto_map, "base_model_class") : NULL;
    if (cJSON_IsString(cls)) snprintf(f->base_class, sizeof f->base_class, "%s", cls->valuestring);
    return LMX_OK;
}

/* Whether a PEFT target list / regex names module key (the module path without base_model.model.). */
static lmx_status peft_targeted(const peft_cfg *c, const char *key, int *yes, lmx_err *err) {
    *yes = 1;
    if (!is_set(c->targets)) return LMX_OK;
    if (cJSON_IsString(c->targets)) {
        if (strcmp(c->targets->valuestring, "all-linear") == 0) return LMX_OK;
        int m = regex_match("^(?:%s)$", c->targets->valuestring, key, "target_modules", err);
        if (m < 0) return err->status;
        *yes = m;
        return LMX_OK;
    }
    *yes = 0;
    for (const cJSON *t = c->targets->child; t && !*yes; t = t->next) *yes = suffix_match(key, t->valuestring);
    return LMX_OK;
}

static int layer_listed(const cJSON *layers, int l) {
    if (!is_set(layers)) return 1;
    if (cJSON_IsNumber(layers)) return layers->valuedouble == l;
    for (const cJSON *v = layers->child; v; v = v->next)
        if (cJSON_IsNumber(v) && v->valuedouble == l) return 1;
    return 0;
}

/* ---- the pairs ----------------------------------------------------------------------------------- */

static lmx_lora_entry *entry_for(lmx_lora_file *f, int layer, lmx_proj proj) {
    for (int i = 0; i < f->n; i++)
        if (f->e[i].layer == layer && f->e[i].proj == proj) return &f->e[i];
    lmx_lora_entry *e = &f->e[f->n++];
    memset(e, 0, sizeof *e);
    e->layer = layer;
    e->proj = proj;
    return e;
}

static int cmp_entry(const void *x, const void *y) {
    const lmx_lora_entry *a = x, *b = y;
    return a->layer != b->layer ? (a->layer > b->layer) - (a->layer < b->layer) : (int)a->proj - (int)b->proj;
}

static lmx_status collect(lmx_lora_file *f, const peft_cfg *pc, int mlx_rank, float mlx_scale, const cJSON *mlx_keys,
                          lmx_err *err) {
    const char *file = f->weights_path;
    size_t n = lmx_st_set_count(f->st);
    f->e = calloc(n ? n : 1, sizeof *f->e);
    if (!f->e) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_set_at(f->st, i);
        int layer;
        lmx_proj proj;
        const char *role;
        if (split_name(t->name, &layer, &proj, &role)) return unsupported_tensor(t, file, err);
        int is_a;
        if (f->format == LMX_LORA_PEFT) {
            if (strcmp(role, "lora_A.weight") == 0) is_a = 1;
            else if (strcmp(role, "lora_B.weight") == 0) is_a = 0;
            else return unsupported_tensor(t, file, err);
        } else {
            if (strcmp(role, "lora_a") == 0) is_a = 1;
            else if (strcmp(role, "lora_b") == 0) is_a = 0;
            else return unsupported_tensor(t, file, err);
        }
        if (t->dtype != LMX_DTYPE_F32 && t->dtype != LMX_DTYPE_F16 && t->dtype != LMX_DTYPE_BF16)
            return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: tensor %s is %s (f32, f16 or bf16)", short_file(file),
                               LMX_QUOTED(t->name), lmx_dtype_name(t->dtype));
        if (t->ndim != 2)
            return lmx_err_set(err, LMX_ERR_SHAPE, "%s: tensor %s has %d dimensions, not 2", short_file(file), LMX_QUOTED(t->name),
                               t->ndim);
        lmx_lora_entry *e = entry_for(f, layer, proj);
        const lmx_st_tensor **slot = is_a ? &e->a : &e->b;
        if (*slot)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: two tensors for %s of layer %d (%s, %s)", short_file(file),
                               is_a ? "A" : "B", layer, LMX_QUOTED((*slot)->name), LMX_QUOTED(t->name));
        *slot = t;
        e->transposed = f->format == LMX_LORA_MLX;
        if (f->format == LMX_LORA_PEFT && is_a) { /* targets, layers and patterns apply per module */
            const char *key = t->name;
            if (strncmp(key, "base_model.model.", 17) == 0) key += 17;
            size_t klen = strlen(key) - strlen(".lora_A.weight");
            char mod[512];
            snprintf(mod, sizeof mod, "%.*s", (int)(klen < sizeof mod ? klen : sizeof mod - 1), key);
            int yes;
            lmx_status st = peft_targeted(pc, mod, &yes, err);
            if (st) return st;
            if (!yes)
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s adapts %s, which target_modules does not name",
                                   short_file(file), LMX_QUOTED(t->name), mod);
            if (!layer_listed(pc->layers, layer))
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s is for layer %d, which layers_to_transform "
                                   "leaves out", short_file(file), LMX_QUOTED(t->name), layer);
            double r = pc->r, alpha = pc->alpha;
            int found;
            if ((st = pattern_value(pc->rank_pattern, "rank_pattern", mod, &r, &found, err)) ||
                (st = pattern_value(pc->alpha_pattern, "alpha_pattern", mod, &alpha, &found, err)))
                return st;
            e->rank = (int)r;
            e->scale = (float)(pc->rslora ? alpha / sqrt(r) : alpha / r);
        } else if (f->format == LMX_LORA_MLX) {
            if (is_set(mlx_keys)) {
                int listed = 0;
                for (const cJSON *k = mlx_keys->child; k; k = k->next)
                    listed |= cJSON_IsString(k) && strcmp(k->valuestring, proj_modules[proj]) == 0;
                if (!listed)
                    return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s adapts %s, which lora_parameters.keys "
                                       "does not name", short_file(file), LMX_QUOTED(t->name), proj_modules[proj]);
            }
            e->rank = mlx_rank;
            e->scale = mlx_scale;
        }
    }
    for (int i = 0; i < f->n; i++) {
        lmx_lora_entry *e = &f->e[i];
        if (!e->a || !e->b)
            return lmx_err_set(err, LMX_ERR_MISSING, "%s: tensor %s (%s of layer %d) has no %s beside it",
                               short_file(file), LMX_QUOTED((e->a ? e->a : e->b)->name), proj_modules[e->proj], e->layer,
                               e->a ? "B" : "A");
        /* rank: A's [r, in] / lora_a's [in, r] against B's and the configuration */
        int64_t ra = e->transposed ? e->a->shape[1] : e->a->shape[0];
        int64_t rb = e->transposed ? e->b->shape[0] : e->b->shape[1];
        if (ra != rb)
            return lmx_err_set(err, LMX_ERR_SHAPE, "%s: A/B rank mismatch: %s has rank %lld, %s rank %lld",
                               short_file(file), LMX_QUOTED(e->a->name), (long long)ra, LMX_QUOTED(e->b->name), (long long)rb);
        if (ra != e->rank)
            return lmx_err_set(err, LMX_ERR_SHAPE, "%s: %s has rank %lld; adapter_config.json says %d",
                               short_file(file), LMX_QUOTED(e->a->name), (long long)ra, e->rank);
    }
    if (f->n == 0) return lmx_err_set(err, LMX_ERR_MISSING, "%s holds no LoRA tensors", short_file(file));
    qsort(f->e, (size_t)f->n, sizeof *f->e, cmp_entry);
    return LMX_OK;
}

/* ---- open ----------------------------------------------------------------------------------------- */

lmx_status lmx_lora_widen(const lmx_lora_entry *e, int64_t K, int64_t N, int rope_heads, float *A, float *B,
                          lmx_err *err) {
    const int64_t r = e->rank, D = rope_heads > 0 ? N / rope_heads : 0;
    for (int64_t i = 0; i < r; i++)
        for (int64_t k = 0; k < K; k++) A[i * K + k] = lmx_float_at(e->a->data, e->a->dtype, e->transposed ? k * r + i : i * K + k);
    for (int64_t n = 0; n < N; n++) {
        const int64_t src = D ? (n / D) * D + (n % 2) * (D / 2) + (n % D) / 2 : n;
        for (int64_t i = 0; i < r; i++)
            B[n * r + i] = lmx_float_at(e->b->data, e->b->dtype, e->transposed ? i * N + src : src * r + i);
    }
    for (int64_t i = 0; i < r * K; i++)
        if (!isfinite(A[i])) return lmx_err_set(err, LMX_ERR_FORMAT, "tensor %s holds NaN or infinite values", LMX_QUOTED(e->a->name));
    for (int64_t i = 0; i < N * r; i++)
        if (!isfinite(B[i])) return lmx_err_set(err, LMX_ERR_FORMAT, "tensor %s holds NaN or infinite values", LMX_QUOTED(e->b->name));
    return LMX_OK;
}

int lmx_lora_arch_mismatch(const lmx_lora_file *f, const char *arch, char *family, size_t cap) {
    const char *cls = f->base_class, *x = strstr(cls, "For");
    if (!cls[0] || !x || x == cls || (size_t)(x - cls) >= cap) return 0;
    for (size_t i = 0; i < (size_t)(x - cls); i++) family[i] = (char)tolower((unsigned char)cls[i]);
    family[x - cls] = 0;
    static const char *const known[] = {"llama", "qwen2", "qwen3", "gemma2", "gemma3", "gemma4"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(family, known[i]) == 0) return strcmp(family, arch) != 0;
    return 0;
}

void lmx_lora_file_close(lmx_lora_file *f) {
    if (!f) return;
    lmx_st_set_close(f->st);
    free(f->e);
    free(f->weights_path);
    memset(f, 0, sizeof *f);
}

static lmx_status mlx_config(const cJSON *root, int *rank, float *scale, const cJSON **keys, int *num_layers,
                             lmx_err *err) {
    const char *W = "adapter_config.json";
    const cJSON *ft = cJSON_GetObjectItemCaseSensitive(root, "fine_tune_type");
    if (is_set(ft) && (!cJSON_IsString(ft) || strcmp(ft->valuestring, "lora") != 0))
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: fine_tune_type %s is not supported (lora)", W,
                           cJSON_IsString(ft) ? LMX_QUOTED(ft->valuestring) : "?");
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "use_dora")))
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: \"use_dora\" is set; lmx does not support DoRA", W);
    const cJSON *lp = cJSON_GetObjectItemCaseSensitive(root, "lora_parameters");
    if (!cJSON_IsObject(lp)) return lmx_err_set(err, LMX_ERR_MISSING, "%s: no \"lora_parameters\" object", W);
    lmx_status st = get_int(lp, "rank", INT32_MIN, rank, "adapter_config.json lora_parameters", err);
    if (st) return st;
    if (*rank <= 0) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: lora_parameters.rank is %d", W, *rank);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(lp, "scale");
    if (!cJSON_IsNumber(s)) return lmx_err_set(err, LMX_ERR_MISSING, "%s: lora_parameters has no numeric \"scale\"", W);
    *scale = (float)s->valuedouble;
    *keys = cJSON_GetObjectItemCaseSensitive(lp, "keys");
    if (is_set(*keys)) {
        if (!cJSON_IsArray(*keys)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: lora_parameters.keys is not a list", W);
        for (const cJSON *k = (*keys)->child; k; k = k->next) {
            int known = 0;
            for (int p = 0; p < LMX_PROJ_N && cJSON_IsString(k); p++) known |= strcmp(k->valuestring, proj_modules[p]) == 0;
            if (!known)
                return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: lora_parameters.keys names %s, which is no "
                                   "projection lmx adapts (self_attn.q_proj ... mlp.down_proj)", W,
                                   cJSON_IsString(k) ? LMX_QUOTED(k->valuestring) : "?");
        }
    }
    return get_int(root, "num_layers", 16, num_layers, W, err); /* mlx-lm's default */
}

lmx_status lmx_lora_file_open(const char *path, lmx_lora_file *f, lmx_err *err) {
    memset(f, 0, sizeof *f);
    if (!path) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "adapter path is NULL");
    char *dir = NULL, *cfg_path = NULL, *text = NULL;
    cJSON *root = NULL;
    lmx_status st = LMX_OK;
    int is_file = lmx_is_file(path);
    if (is_file) {
        if (!lmx_ends_with(path, ".safetensors")) {
            st = lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: an adapter is a folder or a .safetensors file", path);
            goto done;
        }
        const char *slash = strrchr(path, '/');
        dir = slash ? strndup(path, (size_t)(slash - path)) : strdup(".");
    } else if (lmx_is_dir(path)) {
        dir = strdup(path);
    } else {
        st = lmx_err_set(err, LMX_ERR_IO, "%s: no such adapter folder or file", path);
        goto done;
    }
    if (!dir || !(cfg_path = lmx_path_join(dir, "adapter_config.json"))) {
        st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!lmx_is_file(cfg_path)) {
        st = lmx_err_set(err, LMX_ERR_MISSING, "%s: no adapter_config.json", dir);
        goto done;
    }
    size_t size;
    if ((st = lmx_read_file(cfg_path, &text, &size, err))) goto done;
    root = cJSON_ParseWithLength(text, size);
    if (!cJSON_IsObject(root)) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a JSON object", cfg_path);
        goto done;
    }
    f->format = cJSON_GetObjectItemCaseSensitive(root, "peft_type") ? LMX_LORA_PEFT
                : cJSON_GetObjectItemCaseSensitive(root, "lora_parameters") ||
                          cJSON_GetObjectItemCaseSensitive(root, "fine_tune_type")
                    ? LMX_LORA_MLX
                    : 0;
    if (!f->format) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: neither a PEFT (peft_type) nor an mlx-lm (lora_parameters) adapter "
                         "configuration", cfg_path);
        goto done;
    }
    peft_cfg pc = {0};
    int mlx_rank = 0;
    float mlx_scale = 0;
    const cJSON *mlx_keys = NULL;
    if (f->format == LMX_LORA_PEFT) st = peft_config(root, &pc, f, err);
    else st = mlx_config(root, &mlx_rank, &mlx_scale, &mlx_keys, &f->num_layers, err);
    if (st) {
        lmx_err_prefix(err, "%s", dir);
        goto done;
    }
    const cJSON *dropout = f->format == LMX_LORA_PEFT
                               ? cJSON_GetObjectItemCaseSensitive(root, "lora_dropout")
                               : cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "lora_parameters"),
                                                                  "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble > 0 && dropout->valuedouble < 1)
        f->dropout = (float)dropout->valuedouble;
    const char *wname = f->format == LMX_LORA_PEFT ? "adapter_model.safetensors" : "adapters.safetensors";
    f->weights_path = is_file ? strdup(path) : lmx_path_join(dir, wname);
    if (!f->weights_path) {
        st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (!is_file && !lmx_is_file(f->weights_path)) {
        char *bin = lmx_path_join(dir, "adapter_model.bin");
        int has_bin = bin && lmx_is_file(bin);
        free(bin);
        st = has_bin ? lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: adapter_model.bin (a PyTorch pickle) is not read; save "
                                   "the adapter as safetensors", dir)
                     : lmx_err_set(err, LMX_ERR_MISSING, "%s: no %s", dir, wname);
        goto done;
    }
    if ((st = lmx_st_set_open_file(f->weights_path, &f->st, err))) goto done;
    st = collect(f, &pc, mlx_rank, mlx_scale, mlx_keys, err);
    if (st) lmx_err_prefix(err, "%s", dir);
done:
    cJSON_Delete(root);
    free(text);
    free(cfg_path);
    free(dir);
    if (st) lmx_lora_file_close(f);
    return st;
}
