/* config.h - what a model directory's config.json (and generation_config.json) says.
 *
 * Both config styles seen in the wild are read: legacy keys (rope_theta, rope_scaling,
 * rope_local_base_freq, sliding_window_pattern) and transformers-5 keys (rope_parameters, possibly
 * per layer type, and layer_types).  Multimodal gemma3 checkpoints keep the text model's keys
 * under text_config. */
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
} lmx_arch;

const char *lmx_arch_name(lmx_arch a);

typedef enum lmx_rope_type { LMX_ROPE_DEFAULT, LMX_ROPE_LINEAR, LMX_ROPE_LLAMA3 } lmx_rope_type;

typedef struct lmx_rope_cfg {
    lmx_rope_type type;
    double theta;
    double factor;                   /* linear, llama3 */
    double low_freq_factor, high_freq_factor;
    double original_max_positions;   /* llama3 */
} lmx_rope_cfg;

#define LMX_MAX_EOS 8

typedef struct lmx_config {
    lmx_arch arch;
    char model_type[32];
    int n_layers, hidden, n_heads, n_kv_heads;
    int head_dim;                    /* 0: infer from q_proj */
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
    /* mixture of experts (qwen3_moe): a layer with layer_moe[l] runs a router over n_experts experts
     * of moe_ffn hidden units and adds the n_experts_used best, weighted by their softmax (renormalised
     * over the chosen with norm_topk), instead of the dense MLP */
    int n_experts, n_experts_used, moe_ffn, norm_topk;
    unsigned char *layer_moe;        /* [n_layers] (owned); NULL when no layer is MoE */
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
