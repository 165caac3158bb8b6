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
    lmx_st_tensor *t;        /* [n] the GGUF name (for messages) and HF shape: [out, in], stacked experts
                              * [E, out, in]; data in the mapping */
    int *block_type;         /* [n] ggml block-quantized type, or 0 for F32/F16/BF16 */
    char **names;            /* [n] owned HF names, which lmx_gguf_weights_find looks up */
    int family;              /* which of gguf_model.c's name tables' entries apply */
    const void *rope_freqs;  /* divisors of the full-attention layers' RoPE frequencies ("rope_freqs.weight",
                                f32 at any address: read with lmx_float_at): llama 3's scaling, gemma4's
                                proportional RoPE (1e30: a pair not rotated); or NULL */
    int64_t n_rope_freqs;
} lmx_gguf_weights;

/* Open path, fill cfg from the metadata (and what llama.cpp reads from the tensors: the vocabularies,
 * which layers have experts, gemma4's K = V) and w with the renamed tensors.  *interleaved_rope is set
 * for architectures whose GGUF q/k rows use the interleaved RoPE layout (llama); *norms_plus_one
 * for gemma, whose converters store norm weights as (1 + w). */
lmx_status lmx_gguf_model_open(const char *path, lmx_config *cfg, lmx_gguf_weights *w,
                               int *interleaved_rope, int *norms_plus_one, lmx_err *err);
void lmx_gguf_weights_free(lmx_gguf_weights *w);
/* The tensor standing for the HF name, or NULL. */
const lmx_st_tensor *lmx_gguf_weights_find(const lmx_gguf_weights *w, const char *name);
/* The GGUF name that would stand for the HF name hf (for messages about a missing tensor) into buf;
 * 0 when no GGUF name does. */
int lmx_gguf_weights_file_name(const lmx_gguf_weights *w, const char *hf, char *buf, size_t cap);

/* The metadata of g (general.architecture arch) as a config (gguf_config.c); the sizes llama.cpp's
 * loader takes from the tensors are left to lmx_gguf_model_open. */
lmx_status lmx_gguf_config(const lmx_gguf *g, const char *arch, lmx_config *cfg, lmx_err *err);

#endif
