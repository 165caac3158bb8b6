/* gguf_model.c - a GGUF file's tensors under their HF names (the config: gguf_config.c). */
#include "gguf_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The families of name table entries: an entry applies to every file (0) or to those of its families. */
enum { FAM_GEMMA = 1, FAM_GEMMA4 = 2, FAM_MOE = 4 };

/* GGUF tensor names and the HF names they stand for, the first entry of the file's family winning.  A
 * GGUF name with a dot is a whole name (e.g. "ffn_gate_inp.scale"); one without is a role whose
 * ".weight" or ".bias" carries over.  Stacked experts [E, rows, cols] (llama.cpp's *_exps) take the
 * names of transformers' fused expert tensors (gate_up_proj) and their split forms. */
static const struct { const char *gguf, *hf; int fam; } global_names[] = {
    {"token_embd.weight", "model.embed_tokens.weight", 0},
    {"output_norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
    {"per_layer_token_embd.weight", "model.embed_tokens_per_layer.weight", FAM_GEMMA4},
    {"per_layer_model_proj.weight", "model.per_layer_model_projection.weight", FAM_GEMMA4},
    {"per_layer_proj_norm.weight", "model.per_layer_projection_norm.weight", FAM_GEMMA4},
};
static const struct { const char *gguf, *hf; int fam; } layer_names[] = {
    {"attn_norm", "input_layernorm", 0},
    {"attn_q", "self_attn.q_proj", 0},
    {"attn_k", "self_attn.k_proj", 0},
    {"attn_v", "self_attn.v_proj", 0},
    {"attn_output", "self_attn.o_proj", 0},
    {"attn_q_norm", "self_attn.q_norm", 0},
    {"attn_k_norm", "self_attn.k_norm", 0},
    {"ffn_norm", "pre_feedforward_layernorm", FAM_GEMMA | FAM_GEMMA4},
    {"ffn_norm", "post_attention_layernorm", 0},
    {"post_attention_norm", "post_attention_layernorm", 0},
    {"post_ffw_norm", "post_feedforward_layernorm", 0},
    {"ffn_gate", "mlp.gate_proj", 0},
    {"ffn_up", "mlp.up_proj", 0},
    {"ffn_down", "mlp.down_proj", 0},
    {"ffn_gate_inp", "mlp.gate", FAM_MOE}, /* the router [E, C] */
    {"ffn_gate_up_exps.weight", "mlp.experts.gate_up_proj", FAM_MOE},
    {"ffn_gate_exps.weight", "mlp.experts.gate_proj", FAM_MOE},
    {"ffn_up_exps.weight", "mlp.experts.up_proj", FAM_MOE},
    {"ffn_down_exps.weight", "mlp.experts.down_proj", FAM_MOE},
    {"ffn_gate_inp.scale", "router.scale", FAM_GEMMA4}, /* before the role ffn_gate_inp */
    {"ffn_down_exps.scale", "router.per_expert_scale", FAM_GEMMA4},
    {"ffn_gate_inp", "router.proj", FAM_GEMMA4},
    {"ffn_gate_up_exps.weight", "experts.gate_up_proj", FAM_GEMMA4},
    {"ffn_gate_exps.weight", "experts.gate_proj", FAM_GEMMA4},
    {"ffn_up_exps.weight", "experts.up_proj", FAM_GEMMA4},
    {"ffn_down_exps.weight", "experts.down_proj", FAM_GEMMA4},
    {"pre_ffw_norm_2", "pre_feedforward_layernorm_2", FAM_GEMMA4},
    {"post_ffw_norm_1", "post_feedforward_layernorm_1", FAM_GEMMA4},
    {"post_ffw_norm_2", "post_feedforward_layernorm_2", FAM_GEMMA4},
    {"inp_gate", "per_layer_input_gate", FAM_GEMMA4},
    {"proj", "per_layer_projection", FAM_GEMMA4},
    {"post_norm", "post_per_layer_input_norm", FAM_GEMMA4},
    {"layer_output_scale.weight", "layer_scalar", FAM_GEMMA4},
};
#define N_OF(a) (sizeof a / sizeof a[0])

static int family_of(lmx_arch arch, const char *model_type) {
    if (arch == LMX_ARCH_GEMMA2 || arch == LMX_ARCH_GEMMA3) return FAM_GEMMA;
    if (arch == LMX_ARCH_GEMMA4) return FAM_GEMMA4;
    return strcmp(model_type, "qwen3moe") ? 0 : FAM_MOE;
}

/* "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight" into buf; 0 when not a model tensor. */
static int hf_name(const char *g, int fam, char *buf, size_t cap) {
    for (size_t i = 0; i < N_OF(global_names); i++)
        if ((!global_names[i].fam || (global_names[i].fam & fam)) && !strcmp(g, global_names[i].gguf))
            return snprintf(buf, cap, "%s", global_names[i].hf) < (int)cap;
    int layer, used = 0;
    if (sscanf(g, "blk.%d.%n", &layer, &used) != 1 || used == 0 || layer < 0) return 0;
    const char *rest = g + used, *dot = strrchr(rest, '.');
    if (!dot) return 0;
    for (size_t i = 0; i < N_OF(layer_names); i++) {
        if (layer_names[i].fam && !(layer_names[i].fam & fam)) continue;
        const char *gg = layer_names[i].gguf;
        size_t n = strlen(gg);
        if (strchr(gg, '.') ? !strcmp(rest, gg) : (size_t)(dot - rest) == n && !strncmp(rest, gg, n))
            return snprintf(buf, cap, "model.layers.%d.%s%s", layer, layer_names[i].hf, strchr(gg, '.') ? "" : dot) < (int)cap;
    }
    return 0;
}

int lmx_gguf_weights_file_name(const lmx_gguf_weights *w, const char *hf, char *buf, size_t cap) {
    char back[256];
    for (size_t i = 0; i < N_OF(global_names); i++)
        if (!strcmp(hf, global_names[i].hf) && hf_name(global_names[i].gguf, w->family, back, sizeof back) &&
            !strcmp(back, hf))
            return snprintf(buf, cap, "%s", global_names[i].gguf) < (int)cap;
    int layer, used = 0;
    if (sscanf(hf, "model.layers.%d.%n", &layer, &used) != 1 || used == 0) return 0;
    const char *rest = hf + used;
    for (size_t i = 0; i < N_OF(layer_names); i++) { /* each candidate must map back to hf */
        size_t n = strlen(layer_names[i].hf);
        if (strncmp(rest, layer_names[i].hf, n)) continue;
        const char *suffix = strchr(layer_names[i].gguf, '.') ? "" : rest + n;
        if (snprintf(buf, cap, "blk.%d.%s%s", layer, layer_names[i].gguf, suffix) < (int)cap &&
            hf_name(buf, w->family, back, sizeof back) && !strcmp(back, hf))
            return 1;
    }
    return 0;
}

/* What llama.cpp's loader takes from the tensors, not the metadata: the vocabularies (token_embd's and
 * gemma4's per_layer_token_embd's rows), which layers have experts (qwen3moe: every layer but one with a
 * dense MLP and no router; gemma4: those with a router, ffn_gate_inp), and gemma4's K = V (full-attention
 * layers without attn_v). */
static lmx_status config_from_tensors(const lmx_gguf_weights *w, lmx_config *c, lmx_err *err) {
    const char *path = lmx_gguf_path(w->file);
    const lmx_st_tensor *emb = lmx_gguf_weights_find(w, "model.embed_tokens.weight");
    if (!emb) return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing tensor \"token_embd.weight\"", path);
    c->vocab = (int)emb->shape[0];
    if (c->ple_dim > 0) {
        const lmx_st_tensor *ple = lmx_gguf_weights_find(w, "model.embed_tokens_per_layer.weight");
        if (!ple) return lmx_err_set(err, LMX_ERR_MISSING, "%s: missing tensor \"per_layer_token_embd.weight\"", path);
        c->ple_vocab = (int)ple->shape[0];
    }
    if (!(w->family & (FAM_MOE | FAM_GEMMA4))) return LMX_OK;
    char name[96];
#define HAS(fmt, l) (snprintf(name, sizeof name, fmt, l), lmx_gguf_find_tensor(w->file, name) != NULL)
    int first_full = -1, any_moe = 0;
    for (int l = 0; l < c->n_layers - c->n_kv_shared; l++)
        if (!c->layer_sliding[l] && first_full < 0) first_full = l;
    if (w->family & FAM_GEMMA4) c->k_eq_v = first_full >= 0 && !HAS("blk.%d.attn_v.weight", first_full);
    if (!(c->layer_moe = calloc((size_t)c->n_layers, 1))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (int l = 0; l < c->n_layers; l++) {
        const int router = HAS("blk.%d.ffn_gate_inp.weight", l);
        c->layer_moe[l] = w->family & FAM_MOE ? router || !HAS("blk.%d.ffn_gate.weight", l) : router;
        any_moe |= c->layer_moe[l];
    }
#undef HAS
    if (any_moe && c->n_experts == 0) /* gemma4 routers without experts in the metadata */
        return lmx_err_set(err, LMX_ERR_MISSING, "%s: the layers have routers (ffn_gate_inp) but there is no \"%s.expert_count\"",
                           path, c->model_type);
    if (!any_moe) {
        free(c->layer_moe);
        c->layer_moe = NULL;
    }
    return LMX_OK;
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
    st = lmx_gguf_config(w->file, arch, cfg, err);
    free(arch);
    if (st) return st;
    w->family = family_of(cfg->arch, cfg->model_type);
    *interleaved_rope = cfg->arch == LMX_ARCH_LLAMA;
    *norms_plus_one = (w->family & FAM_GEMMA) != 0; /* gemma4's converter stores them as they are */

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
        char hf[256];
        if (!hf_name(gt->name, w->family, hf, sizeof hf)) continue; /* not a tensor of the text model */
        if (!(w->names[w->n] = strdup(hf))) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        lmx_st_tensor *t = &w->t[w->n];
        t->name = gt->name;
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
    return config_from_tensors(w, cfg, err);
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
        if (!strcmp(w->names[i], name)) return &w->t[i];
    return NULL;
}
