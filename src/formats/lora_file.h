/* lora_file.h - LoRA adapter files as trained by HF PEFT and mlx-lm, read into one neutral list.
 *
 * PEFT:   adapter_config.json (peft_type LORA, r, lora_alpha, use_rslora, target_modules,
 *         rank_pattern, alpha_pattern, layers_to_transform) + adapter_model.safetensors with
 *         base_model.model.<module>.lora_A.weight [r, in] and .lora_B.weight [out, r];
 *         scale = alpha / r (alpha / sqrt(r) with use_rslora), per module after the patterns.
 * mlx-lm: adapter_config.json (fine_tune_type lora, num_layers, lora_parameters.rank / scale /
 *         keys) + adapters.safetensors with <module>.lora_a [in, r] and .lora_b [r, out];
 *         scale used as is.
 * A path is the adapter's folder, or one .safetensors file of it (e.g. mlx-lm's numbered
 * checkpoint 0000100_adapters.safetensors) with adapter_config.json beside it.
 *
 * Only what lmx applies is accepted: adapters on a decoder layer's seven projections
 * (self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj).  Anything else (DoRA, modules_to_save,
 * biases, embedding or lm_head adapters, other PEFT methods) is LMX_ERR_UNSUPPORTED with a
 * message naming the field or tensor; malformed files are LMX_ERR_FORMAT, LMX_ERR_MISSING or
 * LMX_ERR_SHAPE.  Tensors stay memory-mapped: the model side converts and binds them.
 */
#ifndef LMX_FORMATS_LORA_FILE_H
#define LMX_FORMATS_LORA_FILE_H

#include "safetensors.h"

/* The projections of a decoder layer an adapter may modify (in forward-pass order). */
typedef enum lmx_proj {
    LMX_PROJ_Q = 0, LMX_PROJ_K, LMX_PROJ_V, LMX_PROJ_O, LMX_PROJ_GATE, LMX_PROJ_UP, LMX_PROJ_DOWN, LMX_PROJ_N
} lmx_proj;

/* "self_attn.q_proj", ... */
const char *lmx_proj_module(lmx_proj p);
/* "q_proj", ... */
const char *lmx_proj_short(lmx_proj p);

typedef enum lmx_lora_format { LMX_LORA_PEFT = 1, LMX_LORA_MLX = 2 } lmx_lora_format;

typedef struct lmx_lora_entry {
    int layer;                   /* decoder layer index, from "layers.<N>." */
    lmx_proj proj;
    const lmx_st_tensor *a;      /* PEFT: A [r, in]; mlx-lm: lora_a [in, r] */
    const lmx_st_tensor *b;      /* PEFT: B [out, r]; mlx-lm: lora_b [r, out] */
    int transposed;              /* 1: the mlx-lm layout */
    int rank;                    /* the configured rank (r, rank_pattern, lora_parameters.rank) */
    float scale;
} lmx_lora_entry;

typedef struct lmx_lora_file {
    lmx_lora_format format;
    char *weights_path;          /* the safetensors file read */
    lmx_st_set *st;
    lmx_lora_entry *e;           /* [n], sorted by (layer, proj); no duplicates */
    int n;
    int num_layers;              /* mlx-lm: the last num_layers layers (-1 all); PEFT: 0 */
    char base_class[64];         /* PEFT auto_mapping.base_model_class, e.g. "Qwen3ForCausalLM"; "" */
    float dropout;               /* lora_dropout (PEFT) or lora_parameters.dropout (mlx-lm): training only; 0 */
} lmx_lora_file;

lmx_status lmx_lora_file_open(const char *path, lmx_lora_file *out, lmx_err *err);
/* Widen entry e of a projection [N, K] into f32 A [r, K] and B [N, r] (PEFT's layout; mlx-lm's
 * transposed one turned back).  rope_heads > 0: B's rows go to llama.cpp's interleaved-RoPE order of
 * that many heads (a GGUF llama's q/k: its row h*D + 2i + j is HF row h*D + j*D/2 + i).  NaN or
 * infinite values are LMX_ERR_FORMAT naming the tensor. */
lmx_status lmx_lora_widen(const lmx_lora_entry *e, int64_t K, int64_t N, int rope_heads, float *A, float *B,
                          lmx_err *err);
/* 1 when f's PEFT base class names a family lmx knows ("LlamaForCausalLM" -> "llama", into family)
 * other than arch (a base model's architecture name); 0 otherwise (no class, an unknown family). */
int lmx_lora_arch_mismatch(const lmx_lora_file *f, const char *arch, char *family, size_t cap);
void lmx_lora_file_close(lmx_lora_file *f);

#endif
