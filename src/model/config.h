/* config.h - what a model directory's config.json (and generation_config.json) says.
 *
 * Both config styles seen in the wild are read: legacy keys (rope_theta, rope_scaling,
 * rope_local_base_freq, sliding_window_pattern) and transformers-5 keys (rope_parameters, possibly
 * per layer type, layer_types, and per_layer_config's per-layer head sizes).  Multimodal gemma3 and
 * gemma4 checkpoints keep the text model's keys under text_config. */
#ifndef LMX_MODEL_CONFIG_H
#define LMX_MODEL_CONFIG_H

#include "../backend/backend.h"
#include "../base/status.h"

typedef enum lmx_arch {
    LMX_ARCH_UNKNOWN = 0,  /* model_type absent: decided from the weights */
    LMX_ARCH_LLAMA,
    LMX_ARCH_QWEN2,
    LMX_ARCH_QWEN3,
    LMX_ARCH_GEMMA2,
    LMX_ARCH_GEMMA3,
    LMX_ARCH_GEMMA4,
} lmx_arch;

const char *lmx_arch_name(lmx_arch a);

/* proportional (gemma4): the first floor(partial D / 2) frequencies of a head of D dims are the
 * default ones over D, the rest 0 (those dims are not rotated); all divided by factor */
typedef enum lmx_rope_type { LMX_ROPE_DEFAULT, LMX_ROPE_LINEAR, LMX_ROPE_LLAMA3, LMX_ROPE_PROPORTIONAL } lmx_rope_type;

typedef struct lmx_rope_cfg {
    lmx_rope_type type;
    double theta;
    double factor;                   /* linear, llama3, proportional */
    double partial;                  /* proportional: partial_rotary_factor, in (0, 1] */
    double low_freq_factor, high_freq_factor;
    double original_max_positions;   /* llama3 */
} lmx_rope_cfg;

#define LMX_MAX_EOS 8

typedef struct lmx_config {
    lmx_arch arch;
    char model_type[32];
    int n_layers, hidden, n_heads, n_kv_heads;
    int head_dim;                    /* 0: infer from q_proj */
    int *layer_head_dim;             /* [n_layers] (owned): each layer's D (per_layer_config); NULL: head_dim */
    int *layer_kv_heads;             /* [n_layers] (owned): each layer's Hk; NULL: n_kv_heads */
    int ffn, vocab, max_positions;
    double eps;
    int tie_embeddings;              /* 1, 0, or -1 when the config does not say */
    int sliding_window;              /* window of sliding layers, 0 when none */
    unsigned char *layer_sliding;    /* [n_layers]: 1 for sliding-window layers (owned) */
    lmx_rope_cfg rope_global;        /* full-attention layers */
    lmx_rope_cfg rope_local;         /* sliding-window layers */
    double attn_softcap, final_softcap;  /* 0: none */
    double query_pre_attn_scalar;    /* 0: use head_dim */
    lmx_act act;
    /* mixture of experts (qwen3_moe, gemma4): a layer with layer_moe[l] runs a router over n_experts
     * experts of moe_ffn hidden units and adds the n_experts_used best, weighted by their softmax
     * (renormalised over the chosen with norm_topk), instead of the dense MLP (qwen3_moe) or beside it */
    int n_experts, n_experts_used, moe_ffn, norm_topk;
    unsigned char *layer_moe;        /* [n_layers] (owned); NULL when no layer is MoE */
    int moe_beside_mlp;              /* gemma4: the experts' sum joins the dense MLP's output (each normed),
                                      * routed on the scaled logits, weighted by per_expert_scale */
    /* gemma4 */
    int n_kv_shared;                 /* the last n_kv_shared layers attend over the keys and values of the
                                      * last earlier layer of their type (num_kv_shared_layers) */
    int k_eq_v;                      /* full-attention layers' values are their keys' projection (attention_k_eq_v) */
    int double_wide_mlp;             /* the shared-KV layers' MLPs have 2 F hidden units (use_double_wide_mlp) */
    int ple_dim, ple_vocab;          /* per-layer inputs: P values per layer and token, from a table of
                                      * ple_vocab rows (hidden_size_per_layer_input, vocab_size_per_layer_input); 0: none */
    int bos_id;                      /* -1 when unknown */
    int n_eos;
    int eos_ids[LMX_MAX_EOS];
} lmx_config;

/* Parse dir/config.json and dir/generation_config.json (optional). */
lmx_status lmx_config_load(const char *dir, lmx_config *cfg, lmx_err *err);
/* Parse config.json text; path is only used in messages. */
lmx_status lmx_config_parse(const char *json, const char *path, lmx_config *cfg, lmx_err *err);
void lmx_config_free(lmx_config *cfg);

/* Fill inv_freq[rot_dim/2] for a RoPE config; returns the attention factor (1 for these types). */
float lmx_rope_inv_freq(const lmx_rope_cfg *rc, int rot_dim, float *inv_freq);

#endif
