/* gguf_model.c - GGUF metadata -> lmx_config, GGUF tensor names -> HF names. */
#include "gguf_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GGUF per-layer tensor names and the HF names they stand for (gemma: ffn_norm is the pre-FFN norm). */
static const struct { const char *gguf, *hf, *hf_gemma; } layer_names[] = {
    {"attn_norm", "input_layernorm", NULL},
    {"attn_q", "self_attn.q_proj", NULL},
    {"attn_k", "self_attn.k_proj", NULL},
    {"attn_v", "self_attn.v_proj", NULL},
    {"attn_output", "self_attn.o_proj", NULL},
    {"attn_q_norm", "self_attn.q_norm", NULL},
    {"attn_k_norm", "self_attn.k_norm", NULL},
    {"ffn_norm", "post_attention_layernorm", "pre_feedforward_layernorm"},
    {"post_attention_norm", "post_attention_layernorm", NULL},
    {"post_ffw_norm", "post_feedforward_layernorm", NULL},
    {"ffn_gate", "mlp.gate_proj", NULL},
    {"ffn_up", "mlp.up_proj", NULL},
    {"ffn_down", "mlp.down_proj", NULL},
};

/* "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; NULL when not a model tensor. */
static char *hf_name(const char *g, int gemma) {
    char buf[256];
    if (!strcmp(g, "token_embd.weight")) return strdup("model.embed_tokens.weight");
    if (!strcmp(g, "output_norm.weight")) return strdup("model.norm.weight");
    if (!strcmp(g, "output.weight")) return strdup("lm_head.weight");
    int layer, used = 0;
    if (sscanf(g, "blk.%d.%n", &layer, &used) != 1 || used == 0) return NULL;
    const char *rest = g + used, *dot = strrchr(rest, '.');
    if (!dot) return NULL;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        size_t n = strlen(layer_names[i].gguf);
        if ((size_t)(dot - rest) == n && !strncmp(rest, layer_names[i].gguf, n)) {
            const char *hf = gemma && layer_names[i].hf_gemma ? layer_names[i].hf_gemma : layer_names[i].hf;
            snprintf(buf, sizeof buf, "model.layers.%d.%s%s", layer, hf, dot);
            return strdup(buf);
        }
    }
    return NULL;
}

static lmx_status config_from_metadata(const lmx_gguf *g, const char *arch, lmx_config *c, lmx_err *err) {
    const char *path = lmx_gguf_path(g);
    char key[128];
    int64_t v;
    double d;
#define KEY(suffix) (snprintf(key, sizeof key, "%s.%s", arch, suffix), key)
    static const struct { const char *name; lmx_arch arch; } known[] = {
        {"llama", LMX_ARCH_LLAMA}, {"qwen2", LMX_ARCH_QWEN2}, {"qwen3", LMX_ARCH_QWEN3},
        {"gemma2", LMX_ARCH_GEMMA2}, {"gemma3", LMX_ARCH_GEMMA3},
    };
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(arch, known[i].name)) c->arch = known[i].arch;
    if (c->arch == LMX_ARCH_UNKNOWN)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: unknown GGUF architecture %s (supported: llama, qwen2, qwen3, gemma2, gemma3)",
                           path, LMX_QUOTED(arch));
    snprintf(c->model_type, sizeof c->model_type, "%s", arch);
    struct { const char *suffix; int *dst; int required; } ints[] = {
        {"block_count", &c->n_layers, 1},          {"embedding_length", &c->hidden, 1},
        {"attention.head_count", &c->n_heads, 1},  {"feed_forward_length", &c->ffn, 1},
        {"attention.head_count_kv", &c->n_kv_heads, 0}, {"attention.key_length", &c->head_dim, 0},
        {"context_length", &c->max_positions, 0},  {"attention.sliding_window", &c->sliding_window, 0},
    };
    c->n_kv_heads = 0;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (lmx_gguf_get_int(g, KEY(ints[i].suffix), &v)) {
            if (v < 0 || v > 1000000000)
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %s = %lld is out of range", path, LMX_QUOTED(key), (long long)v);
            *ints[i].dst = (int)v;
        } else if (ints[i].required) {
            return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing metadata %s", path, LMX_QUOTED(key));
        }
    }
    if (c->n_kv_heads == 0) c->n_kv_heads = c->n_heads;
    if (c->n_layers == 0 || c->hidden == 0 || c->n_heads == 0 || c->ffn == 0 || c->n_heads % c->n_kv_heads)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: inconsistent sizes in the metadata", path);
    c->eps = 1e-6;
    if (lmx_gguf_get_float(g, KEY("attention.layer_norm_rms_epsilon"), &d)) c->eps = d;
    c->rope_global = (lmx_rope_cfg){.type = LMX_ROPE_DEFAULT, .theta = 10000, .factor = 1};
    if (lmx_gguf_get_float(g, KEY("rope.freq_base"), &d)) c->rope_global.theta = d;
    c->rope_local = c->rope_global;
    char *scaling = lmx_gguf_get_string(g, KEY("rope.scaling.type"));
    if (scaling && strcmp(scaling, "none")) {
        if (strcmp(scaling, "linear")) {
            lmx_status st = lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: RoPE scaling %s is not supported", path, LMX_QUOTED(scaling));
            free(scaling);
            return st;
        }
        c->rope_global.type = LMX_ROPE_LINEAR;
        if (lmx_gguf_get_float(g, KEY("rope.scaling.factor"), &d) && d > 0) c->rope_global.factor = d;
    }
    free(scaling);
    if (lmx_gguf_get_float(g, KEY("attn_logit_softcapping"), &d)) c->attn_softcap = d;
    if (lmx_gguf_get_float(g, KEY("final_logit_softcapping"), &d)) c->final_softcap = d;
    c->act = LMX_ACT_SILU;
    c->layer_sliding = calloc((size_t)c->n_layers, 1);
    if (!c->layer_sliding) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
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
    } else {
        c->sliding_window = 0;
    }
    if (lmx_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v)) c->bos_id = (int)v;
    if (lmx_gguf_get_int(g, "tokenizer.ggml.eos_token_id", &v)) {
        c->n_eos = 1;
        c->eos_ids[0] = (int)v;
    }
    return LMX_OK;
#undef KEY
}

lmx_status lmx_gguf_model_open(const char *path, lmx_config *cfg, lmx_gguf_weights *w,
                               int *interleaved_rope, int *norms_plus_one, lmx_err *err) {
    memset(cfg, 0, sizeof *cfg);
    memset(w, 0, sizeof *w);
    cfg->bos_id = -1;
    cfg->tie_embeddings = -1;
    lmx_status st = lmx_gguf_open(path, &w->file, err);
    if (st) return st;
    char *arch = lmx_gguf_get_string(w->file, "general.architecture");
    if (!arch) return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing metadata \"general.architecture\"", path);
    st = config_from_metadata(w->file, arch, cfg, err);
    free(arch);
    if (st) return st;
    int gemma = cfg->arch == LMX_ARCH_GEMMA2 || cfg->arch == LMX_ARCH_GEMMA3;
    *interleaved_rope = cfg->arch == LMX_ARCH_LLAMA;
    *norms_plus_one = gemma;

    size_t n = lmx_gguf_tensor_count(w->file);
    w->t = calloc(n + 1, sizeof *w->t);
    w->block_type = calloc(n + 1, sizeof *w->block_type);
    w->names = calloc(n + 1, sizeof *w->names);
    if (!w->t || !w->block_type || !w->names) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const lmx_gguf_tensor *gt = lmx_gguf_tensor_at(w->file, i);
        if (!strcmp(gt->name, "rope_freqs.weight") && gt->type == 0) {
            w->rope_freqs = gt->data;
            w->n_rope_freqs = gt->ne[0];
            continue;
        }
        char *name = hf_name(gt->name, gemma);
        if (!name) continue; /* not a tensor of the text model */
        w->names[w->n] = name;
        lmx_st_tensor *t = &w->t[w->n];
        t->name = name;
        t->file = lmx_gguf_path(w->file);
        t->data = gt->data;
        t->nbytes = gt->nbytes;
        t->ndim = gt->n_dims;
        for (int d = 0; d < gt->n_dims; d++) t->shape[d] = gt->ne[gt->n_dims - 1 - d]; /* fastest last */
        t->n_elements = 1;
        for (int d = 0; d < gt->n_dims; d++) t->n_elements *= gt->ne[d];
        switch (gt->type) {
        case 0: t->dtype = LMX_DTYPE_F32; break;
        case 1: t->dtype = LMX_DTYPE_F16; break;
        case 30: t->dtype = LMX_DTYPE_BF16; break;
        default: t->dtype = LMX_DTYPE_U8; w->block_type[w->n] = gt->type; break;
        }
        w->n++;
    }
    if (!lmx_gguf_weights_find(w, "model.embed_tokens.weight"))
        return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing tensor \"token_embd.weight\"", path);
    cfg->vocab = (int)lmx_gguf_weights_find(w, "model.embed_tokens.weight")->shape[0];
    return LMX_OK;
}

void lmx_gguf_weights_free(lmx_gguf_weights *w) {
    for (size_t i = 0; w->names && i < w->n; i++) free(w->names[i]);
    free(w->names);
    free(w->t);
    free(w->block_type);
    lmx_gguf_close(w->file);
    memset(w, 0, sizeof *w);
}

const lmx_st_tensor *lmx_gguf_weights_find(const lmx_gguf_weights *w, const char *name) {
    for (size_t i = 0; i < w->n; i++)
        if (!strcmp(w->t[i].name, name)) return &w->t[i];
    return NULL;
}
