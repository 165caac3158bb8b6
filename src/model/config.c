/* config.c - parse config.json / generation_config.json into an lmx_config. */
#include "config.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/fileio.h"
#include "../base/json.h"

const char *lmx_arch_name(lmx_arch a) {
    switch (a) {
    case LMX_ARCH_LLAMA: return "llama";
    case LMX_ARCH_QWEN2: return "qwen2";
    case LMX_ARCH_QWEN3: return "qwen3";
    case LMX_ARCH_GEMMA2: return "gemma2";
    case LMX_ARCH_GEMMA3: return "gemma3";
    case LMX_ARCH_GEMMA4: return "gemma4";
    default: return "unknown";
    }
}

/* ---- small JSON helpers ---------------------------------------------------------------------- */

/* Look key up in the text config first, then in the top-level config. */
typedef struct cfg_src {
    const cJSON *text;   /* text_config, or the root */
    const cJSON *root;
} cfg_src;

static const cJSON *get(const cfg_src *s, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s->text, key);
    if (!v && s->root != s->text) v = cJSON_GetObjectItemCaseSensitive(s->root, key);
    return v;
}

static int is_set(const cJSON *v) { return v && !cJSON_IsNull(v); }

/* Boolean key: 1 when true; missing, null or false: 0. */
static int get_flag(const cfg_src *s, const char *key) { return cJSON_IsTrue(get(s, key)); }

/* Integer key: *out = value; missing or null leaves *out; anything else is an error. */
static lmx_status get_int(const cfg_src *s, const char *key, int *out, int required,
                          const char *path, lmx_err *err) {
    const cJSON *v = get(s, key);
    if (!is_set(v)) {
        if (required) return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing %s", path, LMX_QUOTED(key));
        return LMX_OK;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
        v->valuedouble > 1e9)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %s must be a non-negative integer", path, LMX_QUOTED(key));
    *out = (int)v->valuedouble;
    return LMX_OK;
}

static lmx_status get_num(const cfg_src *s, const char *key, double *out, const char *path,
                          lmx_err *err) {
    const cJSON *v = get(s, key);
    if (!is_set(v)) return LMX_OK;
    if (!cJSON_IsNumber(v))
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %s must be a number", path, LMX_QUOTED(key));
    *out = v->valuedouble;
    return LMX_OK;
}

/* ---- RoPE ---------------------------------------------------------------------------------- */

/* Read one RoPE description: {"rope_type"|"type": ..., "rope_theta"?, "factor", ...}. */
static lmx_status parse_rope(const cJSON *o, double theta_default, lmx_rope_cfg *rc,
                             const char *path, lmx_err *err) {
    memset(rc, 0, sizeof *rc);
    rc->type = LMX_ROPE_DEFAULT;
    rc->theta = theta_default;
    rc->factor = 1.0;
    if (!is_set(o)) return LMX_OK;
    if (!cJSON_IsObject(o)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: RoPE parameters must be an object", path);
    rc->theta = lmx_json_num(o, "rope_theta", theta_default);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(o, "type");
    const char *type = cJSON_IsString(t) ? t->valuestring : "default";
    rc->factor = lmx_json_num(o, "factor", 1.0);
    if (strcmp(type, "default") == 0) {
        rc->type = LMX_ROPE_DEFAULT;
    } else if (strcmp(type, "linear") == 0) {
        rc->type = LMX_ROPE_LINEAR;
    } else if (strcmp(type, "proportional") == 0) {
        rc->type = LMX_ROPE_PROPORTIONAL;
        rc->partial = lmx_json_num(o, "partial_rotary_factor", 1.0);
        if (!(rc->partial > 0 && rc->partial <= 1))
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: proportional RoPE needs \"partial_rotary_factor\" in (0, 1]", path);
    } else if (strcmp(type, "llama3") == 0) {
        rc->type = LMX_ROPE_LLAMA3;
        rc->low_freq_factor = lmx_json_num(o, "low_freq_factor", 1.0);
        rc->high_freq_factor = lmx_json_num(o, "high_freq_factor", 4.0);
        rc->original_max_positions = lmx_json_num(o, "original_max_position_embeddings", 8192);
        if (rc->high_freq_factor <= rc->low_freq_factor)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: llama3 RoPE needs high_freq_factor > low_freq_factor", path);
    } else {
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: RoPE type %s is not supported (default, linear, llama3, proportional)",
                           path, LMX_QUOTED(type));
    }
    if (!(rc->factor > 0) || !(rc->theta > 0))
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: RoPE theta and factor must be positive", path);
    return LMX_OK;
}

float lmx_rope_inv_freq(const lmx_rope_cfg *rc, int rot_dim, float *inv_freq) {
    int half = rot_dim / 2;
    /* proportional: rotated pairs (i, i + D/2) for i < floor(partial D / 2) only, as transformers */
    int rotated = rc->type == LMX_ROPE_PROPORTIONAL ? (int)floor(rc->partial * rot_dim / 2.0) : half;
    for (int i = 0; i < half; i++) {
        double f = i < rotated ? 1.0 / pow(rc->theta, (double)(2 * i) / rot_dim) : 0.0;
        if (rc->type == LMX_ROPE_LINEAR || rc->type == LMX_ROPE_PROPORTIONAL) {
            f /= rc->factor;
        } else if (rc->type == LMX_ROPE_LLAMA3) {
            double low_wavelen = rc->original_max_positions / rc->low_freq_factor;
            double high_wavelen = rc->original_max_positions / rc->high_freq_factor;
            double wavelen = 2 * M_PI / f;
            if (wavelen > low_wavelen) {
                f /= rc->factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (rc->original_max_positions / wavelen - rc->low_freq_factor) /
                                (rc->high_freq_factor - rc->low_freq_factor);
                f = (1 - smooth) * f / rc->factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
    return 1.0f;
}

/* Global and local RoPE from either config style. */
static lmx_status parse_ropes(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    const cJSON *params = get(s, "rope_parameters");
    lmx_status st;
    if (is_set(params)) {
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(params, "full_attention");
        const cJSON *slide = cJSON_GetObjectItemCaseSensitive(params, "sliding_attention");
        if (full || slide) { /* per layer type */
            if ((st = parse_rope(full ? full : slide, 10000, &c->rope_global, path, err))) return st;
            return parse_rope(slide ? slide : full, 10000, &c->rope_local, path, err);
        }
        if ((st = parse_rope(params, 10000, &c->rope_global, path, err))) return st;
        c->rope_local = c->rope_global;
        return LMX_OK;
    }
    if (c->arch == LMX_ARCH_GEMMA4) { /* transformers' defaults: proportional full layers, default sliding ones */
        parse_rope(NULL, 1e6, &c->rope_global, path, err);
        c->rope_global.type = LMX_ROPE_PROPORTIONAL;
        c->rope_global.partial = 0.25;
        parse_rope(NULL, 10000, &c->rope_local, path, err);
        return LMX_OK;
    }
    double theta = 10000;
    if ((st = get_num(s, "rope_theta", &theta, path, err))) return st;
    if ((st = parse_rope(get(s, "rope_scaling"), theta, &c->rope_global, path, err))) return st;
    if (!is_set(get(s, "rope_scaling"))) c->rope_global.theta = theta;
    c->rope_local = c->rope_global;
    if (c->arch == LMX_ARCH_GEMMA3) { /* legacy gemma3: local layers use their own base, unscaled */
        double local = 10000;
        if ((st = get_num(s, "rope_local_base_freq", &local, path, err))) return st;
        parse_rope(NULL, local, &c->rope_local, path, err);
    }
    return LMX_OK;
}

/* ---- layer types ----------------------------------------------------------------------------- */

static lmx_status parse_layer_types(const cfg_src *s, lmx_config *c, const char *path,
                                    lmx_err *err) {
    c->layer_sliding = calloc((size_t)c->n_layers, 1);
    if (!c->layer_sliding) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    const cJSON *types = get(s, "layer_types");
    if (is_set(types)) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->n_layers)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"layer_types\" must list %d layer types", path,
                               c->n_layers);
        for (int i = 0; i < c->n_layers; i++) {
            const cJSON *t = cJSON_GetArrayItem(types, i);
            if (!cJSON_IsString(t)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: layer_types[%d] is not a string", path, i);
            if (strcmp(t->valuestring, "sliding_attention") == 0) c->layer_sliding[i] = 1;
            else if (strcmp(t->valuestring, "full_attention") != 0)
                return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: layer type %s is not supported", path,
                                   LMX_QUOTED(t->valuestring));
        }
    } else if (c->arch == LMX_ARCH_GEMMA2) {
        for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = (i % 2 == 0);
    } else if (c->arch == LMX_ARCH_GEMMA3 || c->arch == LMX_ARCH_GEMMA4) {
        int pattern = 6;
        lmx_status st = get_int(s, "sliding_window_pattern", &pattern, 0, path, err);
        if (st) return st;
        for (int i = 0; i < c->n_layers; i++) c->layer_sliding[i] = pattern > 0 && (i + 1) % pattern != 0;
    } else if (c->arch == LMX_ARCH_QWEN2 || c->arch == LMX_ARCH_QWEN3 || c->arch == LMX_ARCH_UNKNOWN) {
        /* no model_type resolves to qwen2 or qwen3 from the weights: same rule */
        const cJSON *use = get(s, "use_sliding_window");
        int from = 0;
        lmx_status st = get_int(s, "max_window_layers", &from, 0, path, err);
        if (st) return st;
        if (cJSON_IsTrue(use))
            for (int i = from; i < c->n_layers; i++) c->layer_sliding[i] = 1;
    }
    if (c->arch == LMX_ARCH_GEMMA4) c->layer_sliding[c->n_layers - 1] = 0; /* transformers forces it */
    int any = 0;
    for (int i = 0; i < c->n_layers; i++) any |= c->layer_sliding[i];
    if (!any) {
        c->sliding_window = 0;
    } else if (c->sliding_window <= 0) {
        return lmx_err_set(err, LMX_ERR_MISSING, "%s: sliding-window layers but no \"sliding_window\"", path);
    }
    return LMX_OK;
}

/* ---- the whole config ------------------------------------------------------------------------ */

static lmx_status parse_arch(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    const cJSON *mt = get(s, "model_type");
    if (!is_set(mt)) {
        c->arch = LMX_ARCH_UNKNOWN;
        return LMX_OK;
    }
    if (!cJSON_IsString(mt)) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"model_type\" must be a string", path);
    snprintf(c->model_type, sizeof c->model_type, "%s", mt->valuestring);
    static const struct { const char *name; lmx_arch arch; } known[] = {
        {"llama", LMX_ARCH_LLAMA},   {"qwen2", LMX_ARCH_QWEN2},       {"qwen3", LMX_ARCH_QWEN3},
        {"gemma2", LMX_ARCH_GEMMA2}, {"gemma3", LMX_ARCH_GEMMA3},     {"gemma3_text", LMX_ARCH_GEMMA3},
        {"qwen3_moe", LMX_ARCH_QWEN3}, /* qwen3 with MoE layers (parse_moe) */
        {"gemma4", LMX_ARCH_GEMMA4}, {"gemma4_text", LMX_ARCH_GEMMA4},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(mt->valuestring, known[i].name) == 0) {
            c->arch = known[i].arch;
            return LMX_OK;
        }
    return lmx_err_set(err, LMX_ERR_UNSUPPORTED,
                       "%s: unknown model_type %s (supported: llama, qwen2, qwen3, qwen3_moe, gemma2, gemma3, gemma3_text, "
                       "gemma4, gemma4_text)",
                       path, LMX_QUOTED(mt->valuestring));
}

static lmx_status parse_act(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    int gemma = c->arch == LMX_ARCH_GEMMA2 || c->arch == LMX_ARCH_GEMMA3 || c->arch == LMX_ARCH_GEMMA4;
    const cJSON *a = get(s, "hidden_activation");
    if (!is_set(a)) a = get(s, "hidden_act");
    const char *name = cJSON_IsString(a) ? a->valuestring : (gemma ? "gelu_pytorch_tanh" : "silu");
    if (strcmp(name, "silu") == 0 || strcmp(name, "swish") == 0) c->act = LMX_ACT_SILU;
    else if (strcmp(name, "gelu_pytorch_tanh") == 0 || strcmp(name, "gelu_new") == 0 ||
             strcmp(name, "gelu_fast") == 0 || (gemma && strcmp(name, "gelu") == 0))
        c->act = LMX_ACT_GELU_TANH;
    else return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: activation %s is not supported", path, LMX_QUOTED(name));
    return LMX_OK;
}

/* The experts of qwen3_moe (num_experts or num_local_experts, num_experts_per_tok, moe_intermediate_size,
 * norm_topk_prob, decoder_sparse_step, mlp_only_layers: MoE layers instead of the MLP) and of gemma4
 * (enable_moe_block, num_experts, top_k_experts, moe_intermediate_size: every layer, beside its MLP,
 * always renormalised). */
static lmx_status parse_moe(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    const int qwen = !strcmp(c->model_type, "qwen3_moe");
    if (!qwen && !(c->arch == LMX_ARCH_GEMMA4 && get_flag(s, "enable_moe_block"))) return LMX_OK;
    lmx_status st;
    int step = 1;
    const char *ek = !qwen || is_set(get(s, "num_experts")) ? "num_experts" : "num_local_experts"; /* both styles */
    const char *kk = qwen ? "num_experts_per_tok" : "top_k_experts";
    if ((st = get_int(s, ek, &c->n_experts, 0, path, err))) return st;
    if ((st = get_int(s, kk, &c->n_experts_used, 1, path, err))) return st;
    if ((st = get_int(s, "moe_intermediate_size", &c->moe_ffn, 1, path, err))) return st;
    if (qwen && (st = get_int(s, "decoder_sparse_step", &step, 0, path, err))) return st;
    c->norm_topk = qwen ? get_flag(s, "norm_topk_prob") : 1;
    c->moe_beside_mlp = !qwen;
    if (c->n_experts <= 0)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"%s\" must be positive for a %s model with experts", path, ek,
                           qwen ? "qwen3_moe" : "gemma4");
    if (c->n_experts_used <= 0 || c->n_experts_used > c->n_experts)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"%s\" %d must be in [1, %s = %d]", path, kk, c->n_experts_used,
                           ek, c->n_experts);
    if (c->moe_ffn <= 0 || step <= 0)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"moe_intermediate_size\"%s must be positive", path,
                           qwen ? " and \"decoder_sparse_step\"" : "");
    if (!(c->layer_moe = calloc((size_t)c->n_layers, 1))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) c->layer_moe[l] = (l + 1) % step == 0;
    const cJSON *only = qwen ? get(s, "mlp_only_layers") : NULL, *e;
    if (is_set(only) && !cJSON_IsArray(only))
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list of layer numbers", path);
    if (!is_set(only)) only = NULL;
    cJSON_ArrayForEach(e, only) {
        if (!cJSON_IsNumber(e) || e->valueint < 0 || e->valueint >= c->n_layers)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"mlp_only_layers\" holds a layer outside [0, %d)", path,
                               c->n_layers);
        c->layer_moe[e->valueint] = 0;
    }
    return LMX_OK;
}

/* ---- gemma4 ---------------------------------------------------------------------------------- */

/* A key that is an integer, or null for none (0): *out keeps its default when the key is absent. */
static lmx_status get_int_or_null(const cfg_src *s, const char *key, int *out, const char *path, lmx_err *err) {
    const cJSON *v = get(s, key);
    if (v && cJSON_IsNull(v)) *out = 0;
    return get_int(s, key, out, 0, path, err);
}

/* per_layer_config: {"<layer>": {"head_dim": D, "num_key_value_heads": Hk}, ...}, layer numbers in
 * decimal (transformers zero-pads them: "05"), other per-layer keys refused.  Without it,
 * full-attention layers take global_head_dim (512 unless given) and, with attention_k_eq_v,
 * num_global_key_value_heads, as transformers derives them. */
static lmx_status parse_layer_heads(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    const int n = c->n_layers;
    c->layer_head_dim = malloc((size_t)n * sizeof *c->layer_head_dim);
    c->layer_kv_heads = malloc((size_t)n * sizeof *c->layer_kv_heads);
    if (!c->layer_head_dim || !c->layer_kv_heads) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    for (int l = 0; l < n; l++) c->layer_head_dim[l] = c->head_dim, c->layer_kv_heads[l] = c->n_kv_heads;
    const cJSON *plc = get(s, "per_layer_config"), *o;
    lmx_status st;
    if (!is_set(plc)) {
        int global_d = 512, global_hk = 0;
        if ((st = get_int(s, "global_head_dim", &global_d, 0, path, err)) ||
            (st = get_int(s, "num_global_key_value_heads", &global_hk, 0, path, err)))
            return st;
        for (int l = 0; l < n; l++)
            if (!c->layer_sliding[l]) {
                c->layer_head_dim[l] = global_d;
                if (c->k_eq_v && global_hk > 0) c->layer_kv_heads[l] = global_hk;
            }
    } else if (!cJSON_IsObject(plc)) {
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"per_layer_config\" must be an object of layer numbers", path);
    }
    const cJSON *layers = is_set(plc) ? plc : NULL;
    cJSON_ArrayForEach(o, layers) {
        const char *key = o->string;
        char *end = NULL;
        long l = strtol(key, &end, 10);
        if (!*key || *end || key[0] == '-' || key[0] == '+' || l < 0 || l >= n)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"per_layer_config\" key %s is not a layer in [0, %d)", path,
                               LMX_QUOTED(key), n);
        if (!cJSON_IsObject(o))
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: per_layer_config[%s] must be an object", path, LMX_QUOTED(key));
        const cJSON *v;
        cJSON_ArrayForEach(v, o) {
            int *dst = !strcmp(v->string, "head_dim")              ? &c->layer_head_dim[l]
                       : !strcmp(v->string, "num_key_value_heads") ? &c->layer_kv_heads[l]
                                                                   : NULL;
            if (!dst)
                return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: per_layer_config[%s] sets %s, which lmx does not support "
                                   "per layer (head_dim, num_key_value_heads)", path, LMX_QUOTED(key), LMX_QUOTED(v->string));
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 1e6)
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: per_layer_config[%s].%s must be a positive integer", path,
                                   LMX_QUOTED(key), v->string);
            *dst = (int)v->valuedouble;
        }
    }
    for (int l = 0; l < n; l++) {
        const int d = c->layer_head_dim[l], hk = c->layer_kv_heads[l];
        if (d <= 0 || d % 2)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: layer %d: \"head_dim\" %d must be positive and even", path, l, d);
        if (hk <= 0 || c->n_heads % hk)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: layer %d: %d attention heads are not a multiple of "
                               "\"num_key_value_heads\" %d", path, l, c->n_heads, hk);
    }
    return LMX_OK;
}

/* The rest of gemma4's text config: shared KV, K = V, per-layer inputs, double-wide MLPs. */
static lmx_status parse_gemma4(const cfg_src *s, lmx_config *c, const char *path, lmx_err *err) {
    lmx_status st;
    const cJSON *bidi = get(s, "use_bidirectional_attention");
    if (cJSON_IsString(bidi) && !strcmp(bidi->valuestring, "all"))
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: \"use_bidirectional_attention\": \"all\" is not supported "
                           "(causal text models only)", path);
    c->k_eq_v = get_flag(s, "attention_k_eq_v");
    c->double_wide_mlp = get_flag(s, "use_double_wide_mlp");
    c->ple_dim = 256, c->ple_vocab = 262144; /* transformers' defaults */
    if ((st = get_int_or_null(s, "hidden_size_per_layer_input", &c->ple_dim, path, err)) ||
        (st = get_int_or_null(s, "vocab_size_per_layer_input", &c->ple_vocab, path, err)) ||
        (st = get_int(s, "num_kv_shared_layers", &c->n_kv_shared, 0, path, err)))
        return st;
    if (c->ple_dim > 0 && c->ple_vocab <= 0)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"vocab_size_per_layer_input\" must be positive with per-layer "
                           "inputs", path);
    if (c->n_kv_shared >= c->n_layers)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"num_kv_shared_layers\" %d must be less than the %d layers", path,
                           c->n_kv_shared, c->n_layers);
    const int first = c->n_layers - c->n_kv_shared;
    for (int l = first; l < c->n_layers; l++) {
        int src = -1;
        for (int j = 0; j < first; j++)
            if (c->layer_sliding[j] == c->layer_sliding[l]) src = j;
        if (src < 0)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: \"num_kv_shared_layers\" %d leaves layer %d (%s attention) no "
                               "earlier layer of its type to share keys and values with", path, c->n_kv_shared, l,
                               c->layer_sliding[l] ? "sliding" : "full");
    }
    return parse_layer_heads(s, c, path, err);
}

/* eos_token_id: an integer or a list of integers. */
static void parse_eos(const cJSON *v, lmx_config *c) {
    if (cJSON_IsNumber(v)) {
        c->n_eos = 1;
        c->eos_ids[0] = v->valueint;
    } else if (cJSON_IsArray(v)) {
        c->n_eos = 0;
        const cJSON *e;
        cJSON_ArrayForEach(e, v) if (cJSON_IsNumber(e) && c->n_eos < LMX_MAX_EOS) c->eos_ids[c->n_eos++] = e->valueint;
    }
}

lmx_status lmx_config_parse(const char *json, const char *path, lmx_config *c, lmx_err *err) {
    memset(c, 0, sizeof *c);
    cJSON *root = cJSON_Parse(json);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a JSON object", path);
    }
    cfg_src s = {root, root};
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    if (cJSON_IsObject(text)) s.text = text;

    lmx_status st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt) && (!strcmp(mt->valuestring, "gemma3") || !strcmp(mt->valuestring, "gemma4")) &&
        s.text != root)
        s.root = s.text; /* multimodal: the top-level model_type names the wrapper */
    if ((st = parse_arch(&s, c, path, err))) goto done;
    if (c->arch == LMX_ARCH_UNKNOWN && cJSON_IsString(mt)) { /* text_config without model_type */
        cfg_src top = {root, root};
        if ((st = parse_arch(&top, c, path, err))) goto done;
    }
    s.root = root;

    c->eps = 1e-6;
    c->tie_embeddings = -1;
    c->bos_id = -1;
    if (c->arch == LMX_ARCH_GEMMA4) c->head_dim = 256, c->sliding_window = 512; /* transformers' defaults */
    if ((st = get_int(&s, "num_hidden_layers", &c->n_layers, 1, path, err))) goto done;
    if ((st = get_int(&s, "hidden_size", &c->hidden, 1, path, err))) goto done;
    if ((st = get_int(&s, "num_attention_heads", &c->n_heads, 1, path, err))) goto done;
    c->n_kv_heads = c->n_heads;
    if ((st = get_int(&s, "num_key_value_heads", &c->n_kv_heads, 0, path, err))) goto done;
    if ((st = get_int(&s, "head_dim", &c->head_dim, 0, path, err))) goto done;
    if ((st = get_int(&s, "intermediate_size", &c->ffn, 1, path, err))) goto done;
    if ((st = get_int(&s, "vocab_size", &c->vocab, 1, path, err))) goto done;
    if ((st = get_int(&s, "max_position_embeddings", &c->max_positions, 0, path, err))) goto done;
    if ((st = get_int(&s, "sliding_window", &c->sliding_window, 0, path, err))) goto done;
    if ((st = get_num(&s, "rms_norm_eps", &c->eps, path, err))) goto done;
    if ((st = get_num(&s, "attn_logit_softcapping", &c->attn_softcap, path, err))) goto done;
    if ((st = get_num(&s, "final_logit_softcapping", &c->final_softcap, path, err))) goto done;
    if ((st = get_num(&s, "query_pre_attn_scalar", &c->query_pre_attn_scalar, path, err))) goto done;
    if (c->n_layers == 0 || c->hidden == 0 || c->n_heads == 0 || c->n_kv_heads == 0 || c->vocab == 0 ||
        c->ffn == 0) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: layer, hidden, head, ffn and vocab sizes must be positive", path);
        goto done;
    }
    if (c->n_heads % c->n_kv_heads != 0) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: %d attention heads (\"num_attention_heads\") are not a multiple of "
                         "%d kv heads (\"num_key_value_heads\")", path, c->n_heads, c->n_kv_heads);
        goto done;
    }
    const cJSON *tie = get(&s, "tie_word_embeddings");
    if (cJSON_IsBool(tie)) c->tie_embeddings = cJSON_IsTrue(tie);
    const cJSON *bos = get(&s, "bos_token_id");
    if (cJSON_IsNumber(bos)) c->bos_id = bos->valueint;
    parse_eos(get(&s, "eos_token_id"), c);
    if ((st = parse_act(&s, c, path, err))) goto done;
    if ((st = parse_ropes(&s, c, path, err))) goto done;
    if ((st = parse_layer_types(&s, c, path, err))) goto done;
    if ((st = parse_moe(&s, c, path, err))) goto done;
    if (c->arch == LMX_ARCH_GEMMA4 && (st = parse_gemma4(&s, c, path, err))) goto done;
done:
    cJSON_Delete(root);
    if (st != LMX_OK) lmx_config_free(c);
    return st;
}

lmx_status lmx_config_load(const char *dir, lmx_config *c, lmx_err *err) {
    char *path = lmx_path_join(dir, "config.json");
    if (!path) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    char *text = NULL;
    size_t n = 0;
    lmx_status st = lmx_read_file(path, &text, &n, err);
    if (st == LMX_OK) st = lmx_config_parse(text, path, c, err);
    free(text);
    free(path);
    if (st != LMX_OK) return st;

    /* generation_config.json overrides the ids when present (optional file) */
    path = lmx_path_join(dir, "generation_config.json");
    if (path && lmx_is_file(path) && lmx_read_file(path, &text, &n, NULL) == LMX_OK) {
        cJSON *g = cJSON_Parse(text);
        if (g) {
            parse_eos(cJSON_GetObjectItemCaseSensitive(g, "eos_token_id"), c);
            const cJSON *bos = cJSON_GetObjectItemCaseSensitive(g, "bos_token_id");
            if (cJSON_IsNumber(bos)) c->bos_id = bos->valueint;
        }
        cJSON_Delete(g);
        free(text);
    }
    free(path);
    return LMX_OK;
}

void lmx_config_free(lmx_config *c) {
    free(c->layer_sliding);
    c->layer_sliding = NULL;
    free(c->layer_moe);
    c->layer_moe = NULL;
    free(c->layer_head_dim);
    c->layer_head_dim = NULL;
    free(c->layer_kv_heads);
    c->layer_kv_heads = NULL;
}
