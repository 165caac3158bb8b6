/* model.h - a loaded model: config, bound weights, per-layer attention setup, backend.
 *
 * One forward pass (forward.c) serves every family; the families differ only in the flags of
 * lmx_arch_traits, in each layer's sizes and in which optional weights are bound. */
#ifndef LMX_MODEL_MODEL_H
#define LMX_MODEL_MODEL_H

#include "../backend/backend.h"
#include "../formats/safetensors.h"
#include "config.h"
#include "gguf_model.h"

/* What distinguishes the families inside the shared forward pass. */
typedef struct lmx_arch_traits {
    int gemma_norms;      /* sqrt(C) embedding scale, sandwich norms; (1 + w) RMSNorm but for gemma4 */
    int qk_norm;          /* RMSNorm of each q and k head before RoPE */
    int qkv_bias;         /* q/k/v projections must have biases (other biases bind when present) */
    int gemma4;           /* w RMSNorm, unscaled RMSNorm of v, attention scale 1, layer scalars, optional
                           * per-layer inputs, shared KV, K = V, experts beside the MLP */
} lmx_arch_traits;

/* D, Hk and F are this layer's (gemma4's differ between layers: per_layer_config, double-wide MLPs). */
typedef struct lmx_layer {
    int head_dim, n_kv_heads;    /* D, Hk */
    int ffn;                     /* F */
    lmx_tensor attn_norm;        /* [C] */
    lmx_tensor wq, wk, wv, wo;   /* [H*D, C], [Hk*D, C], [Hk*D, C], [C, H*D]  (wk, wv: none when KV is shared;
                                  * wv: none with gemma4's K = V) */
    lmx_tensor bq, bk, bv, bo;   /* [H*D], [Hk*D], [Hk*D], [C]  (required for qwen2, else optional) */
    lmx_tensor q_norm, k_norm;   /* [D]  (qk_norm) */
    lmx_tensor post_attn_norm;   /* [C]  (gemma) */
    lmx_tensor ffn_norm;         /* [C] */
    lmx_tensor post_ffn_norm;    /* [C]  (gemma) */
    lmx_tensor w_gate, w_up;     /* [F, C] */
    lmx_tensor w_down;           /* [C, F] */
    lmx_tensor b_gate, b_up, b_down; /* [F], [F], [C]  (optional: llama mlp_bias) */
    int moe;                     /* a mixture of experts instead of the dense MLP (cfg.layer_moe), or beside it
                                  * (cfg.moe_beside_mlp) */
    lmx_tensor router;           /* [E, C] */
    lmx_tensor *experts;         /* [3 E] (owned): expert e's gate [Fm, C], up [Fm, C], down [C, Fm] at 3e..;
                                  * stacked experts (gemma4, GGUF): 2-D views of rows of gate_up_exps (or of
                                  * GGUF's separate ffn_gate_exps / ffn_up_exps) and down_exps */
    int experts_alike;           /* every expert stored as expert 0 (format, quantization): stacked ones always */
    lmx_tensor gate_up_exps;     /* [E*2Fm, C]: gemma4's experts.gate_up_proj [E, 2Fm, C] (gate rows, then up),
                                  * GGUF's ffn_gate_up_exps */
    lmx_tensor down_exps;        /* [E*C, Fm]: gemma4's experts.down_proj [E, C, Fm], GGUF's ffn_down_exps */
    lmx_tensor router_norm;      /* [C]  gemma4: router.scale, the weight of the router input's RMSNorm */
    float *expert_scale;         /* host [E] (owned): gemma4's router.per_expert_scale; NULL: none */
    lmx_tensor ffn_norm_2;       /* [C]  gemma4 experts: pre_feedforward_layernorm_2 (their input) */
    lmx_tensor post_ffn_norm_1;  /* [C]  gemma4 experts: post_feedforward_layernorm_1 (the MLP's output) */
    lmx_tensor post_ffn_norm_2;  /* [C]  gemma4 experts: post_feedforward_layernorm_2 (the experts' sum) */
    lmx_tensor ple_gate;         /* [P, C]  gemma4 per-layer input: per_layer_input_gate */
    lmx_tensor ple_proj;         /* [C, P]  per_layer_projection */
    lmx_tensor ple_norm;         /* [C]  post_per_layer_input_norm */
    float layer_scalar;          /* gemma4: the layer's output times this (1: none) */
    int kv_src;                  /* the layer whose cache (and new keys and values) it attends over: itself,
                                  * or for gemma4's shared-KV layers the last earlier one of its type */
    int kv_last;                 /* the last layer attending over this layer's cache (itself unless shared);
                                  * its new rows join the cache after that layer */
    int kv_slot;                 /* -1, or the workspace's ks/vs slot holding kv_src's new rows for sharers */
    int sliding;                 /* uses the sliding window */
    lmx_rope rope;               /* inv_freq points into lmx_model.inv_freq */
} lmx_layer;

/* A MoE layer's routing on the host (forward.c, route): one block of max_rows rows, owned by logits. */
typedef struct lmx_moe_route {
    float *logits, *w, *pick_w;
    int *rows, *pick, *count, *off;
} lmx_moe_route;

/* Activation buffers of the forward pass, sized for up to max_rows rows (grown, never per token). */
typedef struct lmx_workspace {
    int max_rows, max_out_rows;
    lmx_tensor x, xn, q, k, v, att, proj, gate, up;   /* [M, ...] */
    lmx_tensor xr, logits;                            /* [R, C], [R, V] */
    lmx_tensor router, mx, my;                        /* MoE: [M, E], an expert's rows in and out [M, C] */
    lmx_tensor moe_sum;                               /* MoE beside the MLP: the experts' sum [M, C] */
    lmx_tensor ks[2], vs[2];                          /* shared KV: a source layer's new k, v [M, Hk*D] */
    lmx_tensor ple, ple_in, ple_gate;                 /* per-layer inputs: every layer's [M, L*P], one layer's
                                                       * [M, P], its gate [M, P] */
    lmx_tensor ple_emb;                               /* per-layer inputs' token embeddings [M, L*P] */
    int *ple_rows;                                    /* host [max_rows]: rows of one layer's input in ple */
    lmx_moe_route route;                              /* MoE: the routing (host) */
    int max_batch;
    int32_t *ids;                /* host [max_rows]: token ids with padding replaced */
    lmx_kv_layer **kv;           /* host [max_batch]: one layer's cache of each sequence */
    const lmx_lora_pair **lora;  /* host [2 max_batch]: one projection's LoRA pair of each sequence (two: gate, up) */
} lmx_workspace;

/* Gradient checkpointing's replay (train.c, tape.h lmx_tape_replay): a checkpointed step's first run of
 * layer l has its attention also write the log-sum-exp into lse[l] (where that tensor is given, data
 * non-NULL) and then hands save the attention's output (what LMX_SAVE_ATT; not where the backend writes no
 * log-sum-exp), and, where the block ends in the plain residual add, the hidden state after it
 * (LMX_SAVE_RESID); the layer's run again for backward takes them back instead of computing them.  Before
 * the attention op it also hands over the op's q, k and v (LMX_SAVE_Q + 0, 1, 2: after their norms and RoPE),
 * and after the MLP's gate and up projections their frozen products (LMX_SAVE_GATE, LMX_SAVE_UP: without
 * their LoRA expands, in the buffers' dtype), which save may ignore. */
enum { LMX_SAVE_ATT, LMX_SAVE_RESID, LMX_SAVE_Q, LMX_SAVE_GATE = LMX_SAVE_Q + 3, LMX_SAVE_UP };
typedef struct lmx_layer_save {
    lmx_status (*save)(void *user, int l, int what, const lmx_tensor *x); /* x [M, cols]; NULL: none */
    lmx_status (*mid)(void *user, int l); /* NULL, or called between layer l's attention block and its MLP */
    lmx_tensor *lse;             /* [n_layers] tensors [B*H*T] f32 (data NULL: none asked) */
    void *user;
} lmx_layer_save;

struct lmx_model {
    lmx_err err;
    lmx_config cfg;
    lmx_arch_traits traits;
    lmx_backend *be;
    lmx_st_set *weights;         /* a model directory's checkpoint, or */
    lmx_gguf_weights gguf;       /* a GGUF file's tensors under HF names (gguf.file != NULL) */
    int interleaved_rope;        /* GGUF llama: q/k rows in interleaved-pair RoPE layout */
    int norms_stored_plus_one;   /* GGUF gemma: norm weights already hold (1 + w) */
    lmx_tensor embed;            /* [V, C] */
    lmx_tensor final_norm;       /* [C] */
    lmx_tensor lm_head;          /* [V, C]; aliases embed when tied */
    lmx_layer *layers;           /* [n_layers] */
    float *inv_freq;             /* [n_layers, max D / 2]: each layer's RoPE frequencies */
    int head_dim;                /* D of the config (layers may differ: lmx_layer.head_dim) */
    int64_t q_width, kv_width;   /* the widest layer's H*D and Hk*D (workspace columns) */
    int max_ffn;                 /* the widest layer's F */
    lmx_tensor embed_ple;        /* [Vp, L*P]  gemma4 per-layer inputs: embed_tokens_per_layer */
    lmx_tensor ple_model_proj;   /* [L*P, C]  per_layer_model_projection */
    lmx_tensor ple_proj_norm;    /* [P]  per_layer_projection_norm */
    lmx_tensor unit_norm;        /* [max D] zeros, owned: with add_one 1 an RMSNorm without weight (gemma4's v) */
    float attn_scale, embed_scale, norm_add_one;
    int64_t n_params, weight_bytes;
    char dtype_name[8];          /* stored weight dtype: "bf16", or "q4" etc. when quantized */
    int quantized;
    int64_t bytes_by_ggml_type[32];  /* GGUF: weight bytes of each block type (for dtype_name) */
    lmx_workspace ws;
    struct lmx_adapter **adapters;   /* [n_adapters] loaded on this model (model/adapter.c) */
    int n_adapters, cap_adapters;
    unsigned adapter_seq;        /* the last adapter id handed out */
    unsigned default_adapter;    /* id of the adapter requests get when they name none; 0: none */
    struct lmx_runtime *rt;      /* generation session (runtime/runtime.h) */
    struct lmx_bridge *bridge;   /* backend mlx_lm: generation runs in a child process (runtime/bridge.h) */
    float **inspect_q;           /* NULL, or [n_layers] while an inspection runs (runtime/inspect.c): host buffers
                                  * [T, H*D] (NULL entries: layers not asked for) into which each pass of one
                                  * sequence copies the layer's post-RoPE queries of its rows, from row n_past */
    struct lmx_layer_save *layer_save; /* NULL, or while a checkpointed training step first runs its layers
                                  * (train.c): what a layer run again for backward takes back (below) */
    lmx_progress_fn progress;    /* loading progress, while lmx_model_load runs */
    void *progress_user;
    int embed_on_host;           /* lmx_load_params.embed_on_host: an untied embed in host memory where the backend can */
    int mlp16;                   /* 1 while training asks it (train.c, on a backend whose keeps are bf16): the MLP's
                                  * gate and up buffers in bf16, which the GEMMs write rounded (as HF's bf16
                                  * Linear does) and the GLU reads at half the bytes; 0: f32 */
};

/* Bind every weight the architecture needs from m->weights (model/weights.c). */
lmx_status lmx_model_bind(lmx_model *m);

/* The forward pass over a padded batch (model/forward.c).  tokens [B*T] (padding ignored);
 * kv[b] is the n_layers caches of sequence b; ad: NULL, or [B] the adapter of each sequence (NULL
 * entries: none); rows[R] picks the rows whose logits land in logits [R, V] on the host. */
lmx_status lmx_model_forward(lmx_model *m, lmx_kv_layer *const *kv, const struct lmx_adapter *const *ad,
                             const lmx_batch *batch, const int32_t *tokens, const int *rows, int R, float *logits);
/* The same pass, returning only the k largest logits of each row (largest first, equal ones by
 * lower id) in vals / ids [R, k] with *k_out = k, selected by the backend (on the GPU: k values
 * cross to the host instead of V); when the backend cannot select them (the cpu), the rows' logits
 * [R, V] land in logits instead and *k_out = 0. */
lmx_status lmx_model_forward_topk(lmx_model *m, lmx_kv_layer *const *kv, const struct lmx_adapter *const *ad,
                                  const lmx_batch *batch,
                                  const int32_t *tokens, const int *rows, int R, int k, float *vals, int32_t *ids,
                                  float *logits, int *k_out);

/* Training's pieces of lmx_model_forward (R = 0): the embedding of tokens into ws.x with the pass's
 * checks and cache reservations, then layers [l0, l1) on ws.x (gradient checkpointing runs each layer
 * again in backward). */
lmx_status lmx_model_embed(lmx_model *m, lmx_kv_layer *const *kv, const lmx_batch *bt, const int32_t *tokens);
lmx_status lmx_model_layers(lmx_model *m, lmx_kv_layer *const *kv, const struct lmx_adapter *const *ad,
                            const lmx_batch *bt, int l0, int l1);

/* After a pass with R = 0: the logits of rows[R] of its tokens into logits [R, V] on the host (the
 * final norm and lm head alone; training runs them a chunk of rows at a time); logits NULL leaves
 * them in backend memory (m->ws.logits, rows [0, R)). */
lmx_status lmx_model_head(lmx_model *m, const int *rows, int R, float *logits);
/* The head's buffers (ws.xr, ws.logits) released until a head or a pass next needs them: training's
 * backward through the layers holds no logits. */
void lmx_model_head_release(lmx_model *m);
/* The buffers a layer's pass writes before it reads them (all of ws but x: norm output, q, k, v,
 * attention output, projection, gate, up), released (release 1) or made again (0: a no-op while they are
 * there): training releases them while it walks back a checkpointed layer, whose backward reads only
 * what the tape kept of them, and makes them again before the next layer runs. */
lmx_status lmx_model_layer_buffers(lmx_model *m, int release);
/* The same for some of them: groups LMX_WS_ATTN (q, k, v, the attention output), LMX_WS_MLP (gate, up),
 * LMX_WS_SHARED (the norm output, the projection): a layer run again for backward holds its attention's
 * and its MLP's in turn (train.c). */
enum { LMX_WS_ATTN = 1, LMX_WS_MLP = 2, LMX_WS_SHARED = 4, LMX_WS_ALL = 7 };
lmx_status lmx_model_layer_buffers_of(lmx_model *m, unsigned groups, int release);

void lmx_workspace_free(lmx_backend *be, lmx_workspace *ws);

/* Elements of one position of layer l's KV cache rows (Hk*D), 0 for a layer that keeps no cache of its
 * own (gemma4's shared-KV layers). */
int64_t lmx_model_kv_row(const lmx_model *m, int l);

/* Record a failure on the calling thread for lmx_last_error(NULL). */
void lmx_set_thread_error(const lmx_err *err);

#endif
