/* gguf_config.c - a GGUF file's metadata as an lmx_config: the keys llama.cpp's converter writes
 * ("<arch>.block_count", "<arch>.attention.head_count_kv", ...) for llama, qwen2, qwen3, qwen3moe,
 * gemma2, gemma3 and gemma4.  llama.cpp keys a size that differs between layers as an array of one
 * value per layer; lmx reads gemma4's (kv heads, MLP widths) and refuses the others' unless all
 * equal.  What the metadata leaves to the tensors (gemma4's K = V, which layers have experts, the
 * vocabularies) gguf_model.c settles once the tensors are known. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_model.h"

typedef struct meta {
    const lmx_gguf *g;
    const char *path, *arch;
    lmx_err *err;
    char key[128];
} meta;

static const char *key_of(meta *m, const char *suffix) {
    snprintf(m->key, sizeof m->key, "%s.%s", m->arch, suffix);
    return m->key;
}

/* "<arch>.<suffix>", one integer in [0, max], into *dst; absent: *dst kept (an error when required). */
static lmx_status get_int(meta *m, const char *suffix, int *dst, int required, int64_t max) {
    const char *key = key_of(m, suffix);
    int64_t v;
    if (!lmx_gguf_find_kv(m->g, key))
        return required ? lmx_err_set(m->err, LMX_ERR_MISSING, "%s: missing metadata %s", m->path, LMX_QUOTED(key)) : LMX_OK;
    if (!lmx_gguf_get_int(m->g, key, &v))
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s must be one number", m->path, LMX_QUOTED(key));
    if (v < 0 || v > max)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s = %lld is out of range", m->path, LMX_QUOTED(key), (long long)v);
    *dst = (int)v;
    return LMX_OK;
}

/* "<arch>.<suffix>" as one integer or one per layer (an array of n) into out[n]; absent: out kept,
 * *found 0 (an error when required). */
static lmx_status layer_ints(meta *m, const char *suffix, int n, int *out, int required, int *found) {
    const lmx_gguf_kv *kv = lmx_gguf_find_kv(m->g, key_of(m, suffix));
    *found = kv != NULL;
    if (!kv || kv->type != LMX_GGUF_ARRAY) {
        int v = -1;
        lmx_status st = get_int(m, suffix, &v, required, 1000000000);
        for (int l = 0; !st && v >= 0 && l < n; l++) out[l] = v;
        return st;
    }
    if (kv->elem_type == LMX_GGUF_STRING || kv->count != (uint64_t)n)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s must be a number or a list of %d (one per layer)", m->path,
                           LMX_QUOTED(m->key), n);
    for (int l = 0; l < n; l++) {
        int64_t v = lmx_gguf_array_int(kv, (uint64_t)l);
        if (v < 0 || v > 1000000000)
            return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s[%d] = %lld is out of range", m->path, LMX_QUOTED(m->key), l,
                               (long long)v);
        out[l] = (int)v;
    }
    return LMX_OK;
}

/* A per-layer key lmx needs to be the same in every layer: its value into *dst. */
static lmx_status same_in_all(meta *m, const char *suffix, const int *v, int n, int *dst) {
    for (int l = 1; l < n; l++)
        if (v[l] != v[0])
            return lmx_err_set(m->err, LMX_ERR_UNSUPPORTED, "%s: %s differs between layers (%d in layer 0, %d in layer %d), "
                               "which lmx does not support for %s", m->path, LMX_QUOTED(key_of(m, suffix)), v[0], v[l], l,
                               m->arch);
    *dst = v[0];
    return LMX_OK;
}

/* The experts (qwen3moe: required; gemma4: where expert_count is set): how many, how many each token
 * uses, their hidden size (per layer in llama.cpp, one size here; qwen3moe's default is llama.cpp's
 * F / K), renormalised top-k (llama.cpp's qwen3moe always; expert_weights_norm when the file says). */
static lmx_status read_experts(meta *m, lmx_config *c, int *per_layer, int qwen) {
    lmx_status st;
    int found;
    if ((st = get_int(m, "expert_count", &c->n_experts, qwen, 1 << 20))) return st;
    if (!qwen && c->n_experts == 0) return LMX_OK;
    if (c->n_experts == 0)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s must be positive for a %s model", m->path,
                           LMX_QUOTED(key_of(m, "expert_count")), m->arch);
    if ((st = get_int(m, "expert_used_count", &c->n_experts_used, 1, 1 << 20))) return st;
    if (c->n_experts_used == 0 || c->n_experts_used > c->n_experts)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s = %d must be in [1, %s.expert_count = %d]", m->path,
                           LMX_QUOTED(key_of(m, "expert_used_count")), c->n_experts_used, m->arch, c->n_experts);
    if ((st = layer_ints(m, "expert_feed_forward_length", c->n_layers, per_layer, !qwen, &found)) ||
        (found && (st = same_in_all(m, "expert_feed_forward_length", per_layer, c->n_layers, &c->moe_ffn))))
        return st;
    if (!found) c->moe_ffn = c->ffn / c->n_experts_used;
    if (c->moe_ffn <= 0)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s must be positive", m->path,
                           LMX_QUOTED(key_of(m, "expert_feed_forward_length")));
    int norm = 1;
    if ((st = get_int(m, "expert_weights_norm", &norm, 0, 1))) return st;
    c->norm_topk = qwen ? norm : 1;
    c->moe_beside_mlp = !qwen;
    return LMX_OK;
}

/* gemma4's layers: which slide (attention.sliding_window_pattern, a bool per layer, or a period as HF's
 * sliding_window_pattern), each one's head size (key_length on full-attention layers, key_length_swa on
 * sliding ones) and kv heads (head_count_kv, one per layer where they differ), the MLP width (one per
 * layer in llama.cpp: F, or 2 F on the shared-KV layers with HF's use_double_wide_mlp), shared KV and
 * per-layer inputs. */
static lmx_status gemma4_layers(meta *m, lmx_config *c, const int *ffn, const int *kv) {
    const int n = c->n_layers;
    lmx_status st;
    const lmx_gguf_kv *pat = lmx_gguf_find_kv(m->g, key_of(m, "attention.sliding_window_pattern"));
    if (!pat) return lmx_err_set(m->err, LMX_ERR_MISSING, "%s: missing metadata %s", m->path, LMX_QUOTED(m->key));
    if (pat->type == LMX_GGUF_ARRAY) {
        if (pat->elem_type == LMX_GGUF_STRING || pat->count != (uint64_t)n)
            return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s must list %d layers", m->path, LMX_QUOTED(m->key), n);
        for (int l = 0; l < n; l++) c->layer_sliding[l] = lmx_gguf_array_int(pat, (uint64_t)l) != 0;
    } else {
        int period = 0;
        if ((st = get_int(m, "attention.sliding_window_pattern", &period, 1, n))) return st;
        for (int l = 0; l < n; l++) c->layer_sliding[l] = period > 0 && (l + 1) % period != 0;
    }
    int d_full = 0, d_swa = -1, v_full = -1, v_swa = -1;
    if ((st = get_int(m, "attention.key_length", &d_full, 1, 1 << 20)) ||
        (st = get_int(m, "attention.key_length_swa", &d_swa, 0, 1 << 20)) ||
        (st = get_int(m, "attention.value_length", &v_full, 0, 1 << 20)) ||
        (st = get_int(m, "attention.value_length_swa", &v_swa, 0, 1 << 20)) ||
        (st = get_int(m, "attention.shared_kv_layers", &c->n_kv_shared, 0, 1000000000)) ||
        (st = get_int(m, "embedding_length_per_layer_input", &c->ple_dim, 0, 1000000000)))
        return st;
    if (d_swa < 0) d_swa = d_full;
    if ((v_full >= 0 && v_full != d_full) || (v_swa >= 0 && v_swa != d_swa))
        return lmx_err_set(m->err, LMX_ERR_UNSUPPORTED, "%s: %s.attention.value_length%s differs from the key length "
                           "(lmx needs keys and values of one size)", m->path, m->arch, v_full != d_full ? "" : "_swa");
    c->head_dim = d_swa;
    c->layer_head_dim = malloc((size_t)n * sizeof *c->layer_head_dim);
    c->layer_kv_heads = malloc((size_t)n * sizeof *c->layer_kv_heads);
    if (!c->layer_head_dim || !c->layer_kv_heads) return lmx_err_set(m->err, LMX_ERR_NOMEM, "out of memory");
    for (int l = 0; l < n; l++) {
        const int d = c->layer_sliding[l] ? d_swa : d_full;
        if (d == 0 || d % 2)
            return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: layer %d: head size %d (%s.attention.key_length%s) must be "
                               "positive and even", m->path, l, d, m->arch, c->layer_sliding[l] ? "_swa" : "");
        if (kv[l] == 0 || c->n_heads % kv[l])
            return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: layer %d: %d attention heads are not a multiple of %d kv heads "
                               "(%s.attention.head_count_kv)", m->path, l, c->n_heads, kv[l], m->arch);
        c->layer_head_dim[l] = d;
        c->layer_kv_heads[l] = kv[l];
    }
    const int first = n - c->n_kv_shared; /* the first shared-KV layer */
    if (first < 1)
        return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s = %d must be less than the %d layers", m->path,
                           LMX_QUOTED(key_of(m, "attention.shared_kv_layers")), c->n_kv_shared, n);
    for (int l = first; l < n; l++) {
        int src = 0;
        for (int j = 0; j < first; j++) src |= c->layer_sliding[j] == c->layer_sliding[l];
        if (!src)
            return lmx_err_set(m->err, LMX_ERR_FORMAT, "%s: %s = %d leaves layer %d no earlier layer of its type to share "
                               "keys and values with", m->path, LMX_QUOTED(key_of(m, "attention.shared_kv_layers")),
                               c->n_kv_shared, l);
    }
    int rot = d_full, rot_swa = d_swa; /* proportional RoPE rotates part of a head through rope_freqs */
    if ((st = get_int(m, "rope.dimension_count", &rot, 0, 1 << 20)) ||
        (st = get_int(m, "rope.dimension_count_swa", &rot_swa, 0, 1 << 20)))
        return st;
    if (rot != d_full || rot_swa != d_swa)
        return lmx_err_set(m->err, LMX_ERR_UNSUPPORTED, "%s: %s.rope.dimension_count%s = %d: lmx rotates whole heads of %d "
                           "(partial rotation only through rope_freqs)", m->path, m->arch, rot != d_full ? "" : "_swa",
                           rot != d_full ? rot : rot_swa, rot != d_full ? d_full : d_swa);
    c->ffn = ffn[0];
    c->double_wide_mlp = ffn[n - 1] == 2 * ffn[0] && c->n_kv_shared > 0;
    for (int l = 0; l < n; l++)
        if (ffn[l] != c->ffn * (c->double_wide_mlp && l >= first ? 2 : 1))
            return lmx_err_set(m->err, LMX_ERR_UNSUPPORTED, "%s: %s[%d] = %d: lmx supports one MLP width, doubled on the "
                               "shared-KV layers (use_double_wide_mlp)", m->path, LMX_QUOTED(key_of(m, "feed_forward_length")),
                               l, ffn[l]);
    return LMX_OK;
}

/* Norms, RoPE (the global layers' scaling; gemma4's sliding layers their own base), soft-capping, the
 * activation, which layers slide (gemma2: every other, gemma3: 5 of 6; gemma4: gemma4_layers), the
 * query scale of the largest gemmas, and the special token ids. */
static lmx_status attention_and_rope(meta *m, lmx_config *c) {
    const lmx_gguf *g = m->g;
    double d;
    c->eps = 1e-6;
    if (lmx_gguf_get_float(g, key_of(m, "attention.layer_norm_rms_epsilon"), &d)) c->eps = d;
    c->rope_global = (lmx_rope_cfg){.type = LMX_ROPE_DEFAULT, .theta = 10000, .factor = 1};
    if (lmx_gguf_get_float(g, key_of(m, "rope.freq_base"), &d)) c->rope_global.theta = d;
    c->rope_local = c->rope_global;
    if (c->arch == LMX_ARCH_GEMMA4 && lmx_gguf_get_float(g, key_of(m, "rope.freq_base_swa"), &d)) c->rope_local.theta = d;
    char *scaling = lmx_gguf_get_string(g, key_of(m, "rope.scaling.type"));
    if (scaling && strcmp(scaling, "none")) {
        if (strcmp(scaling, "linear")) {
            lmx_status st = lmx_err_set(m->err, LMX_ERR_UNSUPPORTED, "%s: RoPE scaling %s is not supported", m->path,
                                        LMX_QUOTED(scaling));
            free(scaling);
            return st;
        }
        c->rope_global.type = LMX_ROPE_LINEAR;
        if (lmx_gguf_get_float(g, key_of(m, "rope.scaling.factor"), &d) && d > 0) c->rope_global.factor = d;
    }
    free(scaling);
    if (lmx_gguf_get_float(g, key_of(m, "attn_logit_softcapping"), &d)) c->attn_softcap = d;
    if (lmx_gguf_get_float(g, key_of(m, "final_logit_softcapping"), &d)) c->final_softcap = d;
    c->act = LMX_ACT_SILU;
    if (c->arch == LMX_ARCH_GEMMA2 || c->arch == LMX_ARCH_GEMMA3) {
        c->act = LMX_ACT_GELU_TANH;
        int gemma3 = c->arch == LMX_ARCH_GEMMA3;
        if (gemma3) c->rope_local = (lmx_rope_cfg){.type = LMX_ROPE_DEFAULT, .theta = 10000, .factor = 1};
        for (int i = 0; c->sliding_window > 0 && i < c->n_layers; i++)
            c->layer_sliding[i] = gemma3 ? (i + 1) % 6 != 0 : i % 2 == 0;
        /* the largest models scale queries by hidden/heads, the others by head_dim (as the
         * reference implementations do; GGUF stores no query_pre_attn_scalar) */
        int big = (c->arch == LMX_ARCH_GEMMA2 && c->n_layers == 46) || (gemma3 && c->n_layers == 62);
        if (big) c->query_pre_attn_scalar = (double)c->hidden / c->n_heads;
    } else if (c->arch == LMX_ARCH_GEMMA4) {
        c->act = LMX_ACT_GELU_TANH;
        int any = 0;
        for (int i = 0; i < c->n_layers; i++) any |= c->layer_sliding[i];
        if (any && c->sliding_window == 0)
            return lmx_err_set(m->err, LMX_ERR_MISSING, "%s: sliding-window layers but no %s", m->path,
                               LMX_QUOTED(key_of(m, "attention.sliding_window")));
        if (!any) c->sliding_window = 0;
    } else {
        c->sliding_window = 0;
    }
    int64_t v;
    if (lmx_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v)) c->bos_id = (int)v;
    if (lmx_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)v;
    }
    return LMX_OK;
}

lmx_status lmx_gguf_config(const lmx_gguf *g, const char *arch, lmx_config *c, lmx_err *err) {
    meta m = {.g = g, .path = lmx_gguf_path(g), .arch = arch, .err = err};
    static const struct { const char *name; lmx_arch arch; } known[] = {
        {"llama", LMX_ARCH_LLAMA},   {"qwen2", LMX_ARCH_QWEN2},   {"qwen3", LMX_ARCH_QWEN3}, {"qwen3moe", LMX_ARCH_QWEN3},
        {"gemma2", LMX_ARCH_GEMMA2}, {"gemma3", LMX_ARCH_GEMMA3}, {"gemma4", LMX_ARCH_GEMMA4},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(arch, known[i].name)) c->arch = known[i].arch;
    if (c->arch == LMX_ARCH_UNKNOWN)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: unknown GGUF architecture %s (supported: llama, qwen2, qwen3, "
                           "qwen3moe, gemma2, gemma3, gemma4)", m.path, LMX_QUOTED(arch));
    snprintf(c->model_type, sizeof c->model_type, "%s", arch);
    const int gemma4 = c->arch == LMX_ARCH_GEMMA4, qwen_moe = !strcmp(arch, "qwen3moe");
    lmx_status st = get_int(&m, "block_count", &c->n_layers, 1, 65536);
    if (st) return st;
    const int n = c->n_layers;
    if (n == 0) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %s must be positive", m.path, LMX_QUOTED(key_of(&m, "block_count")));
    int *heads = malloc(4 * (size_t)n * sizeof *heads); /* heads, kv heads, MLP widths, expert widths: [n] each */
    c->layer_sliding = calloc((size_t)n, 1);
    if (!heads || !c->layer_sliding) {
        free(heads);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    int *kv = heads + n, *ffn = kv + n, *tmp = ffn + n;
    int found_kv = 0, found;
    if ((st = get_int(&m, "embedding_length", &c->hidden, 1, 1000000000)) ||
        (st = layer_ints(&m, "attention.head_count", n, heads, 1, &found)) ||
        (st = same_in_all(&m, "attention.head_count", heads, n, &c->n_heads)) ||
        (st = layer_ints(&m, "feed_forward_length", n, ffn, 1, &found)) ||
        (st = layer_ints(&m, "attention.head_count_kv", n, kv, 0, &found_kv)) ||
        (st = get_int(&m, "attention.key_length", &c->head_dim, 0, 1 << 20)) ||
        (st = get_int(&m, "context_length", &c->max_positions, 0, 1000000000)) ||
        (st = get_int(&m, "attention.sliding_window", &c->sliding_window, 0, 1000000000)))
        goto done;
    for (int l = 0; !found_kv && l < n; l++) kv[l] = c->n_heads;
    if (gemma4) {
        st = gemma4_layers(&m, c, ffn, kv);
        c->n_kv_heads = kv[0]; /* the per-layer counts are in c->layer_kv_heads */
    } else if (!(st = same_in_all(&m, "feed_forward_length", ffn, n, &c->ffn))) {
        st = same_in_all(&m, "attention.head_count_kv", kv, n, &c->n_kv_heads);
    }
    if (st) goto done;
    if (c->hidden == 0 || c->n_heads == 0 || c->ffn == 0 || c->n_kv_heads == 0 || c->n_heads % c->n_kv_heads) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: inconsistent sizes in the metadata", m.path);
        goto done;
    }
    if ((qwen_moe || gemma4) && (st = read_experts(&m, c, tmp, qwen_moe))) goto done;
    st = attention_and_rope(&m, c);
done:
    free(heads);
    return st;
}
