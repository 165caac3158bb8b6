/* gguf_model.h - a model from a single GGUF file: config from the metadata, and the tensors
 * renamed to their HuggingFace names and shapes so that weights.c binds them like a checkpoint. */
#ifndef LMX_MODEL_GGUF_MODEL_H
#define LMX_MODEL_GGUF_MODEL_H

#include "../formats/gguf.h"
#include "../formats/safetensors.h"
#include "config.h"

typedef struct lmx_gguf_weights {
    lmx_gguf *file;
    size_t n;
    lmx_st_tensor *t;        /* [n] HF name and [out, in] shape; data in the mapping */
    int *block_type;         /* [n] ggml block-quantized type, or 0 for F32/F16/BF16 */
    char **names;            /* [n] owned HF names */
    const void *rope_freqs;  /* llama3-style per-frequency divisors ("rope_freqs.weight", f32 at any
                                address: read with lmx_float_at), or NULL */
    int64_t n_rope_freqs;
} lmx_gguf_weights;

/* Open path, fill cfg from the metadata and w with the renamed tensors.  *interleaved_rope is set
 * for architectures whose GGUF q/k rows use the interleaved RoPE layout (llama); *norms_plus_one
 * for gemma, whose converters store norm weights as (1 + w). */
lmx_status lmx_gguf_model_open(const char *path, lmx_config *cfg, lmx_gguf_weights *w,
                               int *interleaved_rope, int *norms_plus_one, lmx_err *err);
void lmx_gguf_weights_free(lmx_gguf_weights *w);
const lmx_st_tensor *lmx_gguf_weights_find(const lmx_gguf_weights *w, const char *name);

#endif
