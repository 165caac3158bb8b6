/* lmx.h - the one public header of lmx, a C engine that runs language models on CPUs and GPUs.
 *
 * Conventions (see docs/STYLE.md of the project):
 *   - Every public symbol starts with lmx_.  Handles are opaque; lmx_X_free(NULL) does nothing.
 *   - Calls that can fail return lmx_status (LMX_OK == 0) and write results through out-parameters.
 *   - Each handle keeps the message of its last failure: lmx_model_last_error(m).  Calls that fail
 *     before a handle exists (lmx_model_load) keep their message per thread: lmx_last_error(NULL).
 *   - The library never prints, exits or aborts, and keeps no process-wide mutable state.
 *
 * Thread safety: distinct handles may be used from distinct threads at once.  One lmx_model may be
 * shared by several lmx_context objects, but calls that evaluate (lmx_context_eval, lmx_eval_batch)
 * on contexts of one model must not run concurrently: the model owns the backend's thread pool and
 * scratch memory.
 */
#ifndef LMX_H
#define LMX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LMX_VERSION "0.1.0"

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */
typedef enum lmx_status {
    LMX_OK = 0,
    LMX_ERR_INVALID_ARG,   /* a NULL handle, a negative size, a token id out of the vocabulary */
    LMX_ERR_IO,            /* a file could not be opened, read or mapped */
    LMX_ERR_FORMAT,        /* a file is malformed: truncated, lying header, bad JSON */
    LMX_ERR_UNSUPPORTED,   /* a valid input lmx does not handle: unknown architecture, dtype */
    LMX_ERR_MISSING,       /* a required tensor or config key is absent */
    LMX_ERR_SHAPE,         /* a tensor has the wrong shape or dtype for its role */
    LMX_ERR_NOMEM,         /* an allocation failed */
    LMX_ERR_BACKEND,       /* the backend failed (no such backend, device error) */
    LMX_ERR_CONTEXT_FULL,  /* more tokens than the context can hold */
} lmx_status;

/* A static English name for a status ("ok", "invalid argument", ...); never NULL. */
const char *lmx_status_str(lmx_status s);

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_model lmx_model;

typedef struct lmx_load_params {
    const char *backend;   /* "auto" (default), "cpu"; "cuda" where built */
    int n_threads;         /* CPU worker threads; 0 = one per online core */
} lmx_load_params;

lmx_load_params lmx_load_default_params(void);

/* Load a model: a HuggingFace model directory (config.json + *.safetensors, dense or MLX
 * affine-quantized) or a single GGUF file.  Weights are memory-mapped and used in their stored
 * format.  On success *out owns the model; free it with lmx_model_free.  On failure *out is NULL
 * and lmx_last_error(NULL) says why. */
lmx_status lmx_model_load(const char *path, const lmx_load_params *params, lmx_model **out);
void lmx_model_free(lmx_model *m);

/* The message of the last failure on m; with m == NULL, of the last failed call on this thread
 * that had no handle to keep it.  Valid until the next failing call on the same handle/thread.
 * Returns "" when there was no failure. */
const char *lmx_last_error(const lmx_model *m);

typedef struct lmx_model_info {
    const char *architecture;   /* "llama", "qwen2", "qwen3", "gemma2", "gemma3" (owned by m) */
    const char *backend;        /* "cpu", "cuda" (owned by m) */
    const char *dtype;          /* stored weights: "bf16", "f16", "f32", MLX "q4"/"q8", or the GGUF
                                   type holding most bytes, e.g. "Q4_K" (owned by m) */
    int n_layers, hidden_size, n_heads, n_kv_heads, head_dim, ffn_size, vocab_size;
    int max_context;            /* max_position_embeddings */
    int64_t n_params;           /* parameters in the bound weights (tied tensors counted once) */
    int64_t weight_bytes;       /* bytes of weights as stored (scales and biases included) */
    int n_eos;                  /* number of end-of-sequence ids in eos_ids */
    int32_t eos_ids[8];
    int32_t bos_id;             /* -1 when unknown */
} lmx_model_info;

lmx_status lmx_model_get_info(const lmx_model *m, lmx_model_info *out);

/* ---------------------------------------------------------------------------------------------
 * Contexts: one sequence's state (its KV cache) on a model
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_context lmx_context;

typedef struct lmx_context_params {
    int n_ctx;   /* 0 (default): unbounded caches for global layers, window-sized rotating caches
                    for sliding-window layers.  > 0: every layer keeps at most n_ctx positions
                    (a rotating cache), so attention sees at most the last n_ctx tokens. */
} lmx_context_params;

lmx_context_params lmx_context_default_params(void);

/* Create a context on m (m must outlive it).  Free with lmx_context_free. */
lmx_status lmx_context_create(lmx_model *m, const lmx_context_params *params, lmx_context **out);
void lmx_context_free(lmx_context *c);

/* Forget every cached position; the next eval starts at position 0. */
void lmx_context_reset(lmx_context *c);

/* Number of positions evaluated so far. */
int lmx_context_n_past(const lmx_context *c);

/* Evaluate n tokens after the cached ones (prefill when n > 1, decode when n == 1).
 * logits: NULL, or room for n * vocab_size floats (all_logits != 0) or vocab_size floats
 * (the last position only).  Row t holds the next-token logits after token t. */
lmx_status lmx_context_eval(lmx_context *c, const int32_t *tokens, int n, float *logits,
                            int all_logits);

/* Evaluate B sequences in one padded forward pass.
 * tokens: [B, T] row-major, row b right-padded after lens[b] tokens (pad values are ignored).
 * ctxs[b] receives the lens[b] tokens after its cached ones.  All contexts belong to m.
 * last_logits: room for B * vocab_size floats; row b gets the logits after token lens[b]-1. */
lmx_status lmx_eval_batch(lmx_model *m, lmx_context *const *ctxs, int B, const int32_t *tokens,
                          const int *lens, int T, float *last_logits);

#ifdef __cplusplus
}
#endif
#endif
