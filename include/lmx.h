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
 * shared by several lmx_context objects, but calls that evaluate (lmx_context_eval, lmx_eval_batch,
 * and every generation call below) on one model must not run concurrently: the model owns the
 * backend's thread pool and scratch memory.  lmx_cancel is the exception: any thread, any time.
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

/* Progress of a long call, done in [0, 1]; called from the calling thread. */
typedef void (*lmx_progress_fn)(float done, void *user);

typedef struct lmx_load_params {
    const char *backend;   /* "auto" (default), "cpu"; "cuda" where built */
    int n_threads;         /* CPU worker threads; 0 = one per online core */
    int n_ctx;             /* context of the model's generation calls (lmx_generate, lmx_chat,
                              lmx_batch_generate): 0 (default) = unbounded; > 0 = rotating caches
                              of n_ctx positions (see lmx_context_params) */
    uint64_t seed;         /* the sampling seed of calls that do not name one (default 0) */
    lmx_progress_fn progress; /* NULL, or told how far loading the weights has come */
    void *progress_user;
    const char *adapter;   /* NULL, or a LoRA adapter (see lmx_adapter_load) loaded with the model
                              and applied to every request that names no other: the model's
                              default adapter */
    int64_t memory_limit;  /* > 0: a hard limit in bytes on the model's memory (see lmx_memory_info);
                              0 (default): none */
    int64_t cache_limit;   /* > 0: the most bytes the prompt cache and scratch buffers may keep
                              between calls (see lmx_model_set_cache_limit); 0 (default): no limit */
    int embed_on_host;     /* 1: a GPU backend leaves the token embedding table in host memory and
                              reads each token's row from there (a table the lm head does not share:
                              ~1 GiB of GPU memory saved on Llama-3.1-8B, training's default); 0
                              (default): on the device */
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
    int n_ctx;                  /* the generation context (lmx_load_params.n_ctx; 0 = unbounded) */
    int64_t memory_bytes;       /* memory lmx allocated for m and its contexts now (weights that
                                   stay memory-mapped are not counted; see weight_bytes) */
    int64_t peak_memory_bytes;  /* the most it has held at once since loading */
    int n_experts;              /* mixture of experts: experts per MoE layer (0: none) */
    int n_experts_used;         /*   of which each token uses this many */
    int64_t expert_bytes;       /*   bytes of all experts' weights (part of weight_bytes) */
    int64_t table_bytes;        /* bytes of the tables a token reads one row of (part of weight_bytes): the
                                   token embedding when the lm head is not tied to it, gemma4's
                                   per-layer embedding */
} lmx_model_info;

lmx_status lmx_model_get_info(const lmx_model *m, lmx_model_info *out);

/* ---------------------------------------------------------------------------------------------
 * Memory controls
 *
 * A model's memory is what its backend holds for it: weights used in place from the mapped files
 * (cpu) or copied to the device (cuda), activations, KV caches, scratch buffers and the session's
 * buffers.  With a memory limit, an allocation that would take the model past it fails with
 * LMX_ERR_NOMEM and "out of memory: limit N bytes, would need M bytes" instead of allocating; a
 * model whose weights alone pass the limit fails in lmx_model_load before any weight is copied.
 * The model stays usable after such a failure (lmx_model_clear_cache may make room).
 * These calls must not run during a generation or an eval on m.
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_memory_info {
    int64_t active_bytes;   /* allocated now (the cached bytes included; mapped weights not) */
    int64_t peak_bytes;     /* the most active at once since loading or lmx_model_reset_peak_memory */
    int64_t cached_bytes;   /* of active, what lmx_model_clear_cache would free now: the prompt
                               cache's KV and the backend's scratch buffers */
    int64_t mapped_bytes;   /* weights read in place from mapped files (cpu), counted by the limit */
    int64_t limit_bytes;    /* the memory limit (0: none): mapped + active may not pass it */
    int64_t cache_limit_bytes; /* the cache limit (0: none) */
} lmx_memory_info;

lmx_status lmx_model_get_memory(const lmx_model *m, lmx_memory_info *out);
/* Set the memory limit (0: none).  A limit below what m holds now makes later allocations fail
 * until memory is freed; nothing held is dropped. */
lmx_status lmx_model_set_memory_limit(lmx_model *m, int64_t bytes);
/* Set the cache limit (0: none): at the end of each generation call, scratch buffers and then the
 * prompt cache are dropped while cached_bytes is above it.  Applies at once. */
lmx_status lmx_model_set_cache_limit(lmx_model *m, int64_t bytes);
/* Drop the prompt cache (its KV memory too) and the backend's scratch buffers now. */
void lmx_model_clear_cache(lmx_model *m);
/* Let peak_bytes start again from active_bytes. */
void lmx_model_reset_peak_memory(lmx_model *m);

/* ---------------------------------------------------------------------------------------------
 * Devices: what each backend built into lmx can run on
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_device_info {
    char backend[16];        /* "cpu", "cuda" */
    int index;               /* the device's index within its backend */
    char name[256];          /* "AMD EPYC 9654 96-Core Processor", "NVIDIA H100 80GB HBM3" */
    int64_t total_memory;    /* bytes (host RAM for the cpu, device memory for cuda) */
    int64_t free_memory;     /* bytes available now */
    int cc_major, cc_minor;  /* cuda compute capability (0 on the cpu) */
    int sm_count;            /* cuda multiprocessors (0 on the cpu) */
    int cores;               /* cpu: online cores (0 for cuda) */
    char features[256];      /* cpu: instruction sets, space-separated ("avx2 fma avx512f ..."),
                                then "kernels=<isa>", the one lmx's kernels use */
    char driver_version[64]; /* cuda: the driver's CUDA version ("12.8"); cpu: the OS kernel */
    char runtime_version[64];/* cuda: the CUDA runtime lmx was linked with; cpu: the C library */
} lmx_device_info;

/* The devices of every backend built in: the cpu first, then each cuda device.  Fills up to cap
 * entries of out (out may be NULL when cap is 0); *n gets how many there are.  A backend without
 * a usable device lists none (no error).  On failure lmx_last_error(NULL) says why. */
lmx_status lmx_devices(lmx_device_info *out, int cap, int *n);

/* ---------------------------------------------------------------------------------------------
 * LoRA adapters, applied unmerged: every adapted projection computes W x + scale * B (A x).
 *
 * Several adapters may be loaded on one model; each request (a context, a generation, each entry
 * of a batch, each prompt of lmx_classify) names its own or none, and one batch mixes them.  Where
 * a request names none (NULL), the model's default adapter applies (lmx_load_params.adapter or
 * lmx_model_set_adapter; none unless set); LMX_NO_ADAPTER asks for the base model alone.
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_adapter lmx_adapter;

#define LMX_NO_ADAPTER ((lmx_adapter *)(uintptr_t)1)

/* Load an adapter for m: an HF PEFT folder (adapter_config.json + adapter_model.safetensors),
 * an mlx-lm folder (adapter_config.json + adapters.safetensors), or one .safetensors file of
 * either with adapter_config.json beside it (mlx-lm's numbered checkpoints).  Weights in f32, f16
 * or bf16, on any base (dense, MLX-quantized, GGUF; the base stays as stored).  What lmx does not
 * apply (DoRA, modules_to_save, embedding or lm_head adapters) and what does not fit m (a shape,
 * a layer, a rank, NaN values, another architecture) fails with a message naming the field or
 * tensor (lmx_last_error(m)); m stays usable.  The adapter belongs to m: free it with
 * lmx_adapter_free before m, or lmx_model_free frees it. */
lmx_status lmx_adapter_load(lmx_model *m, const char *path, lmx_adapter **out);
/* Free a; requests still naming it (a context, the default) fail until they name another. */
void lmx_adapter_free(lmx_adapter *a);

typedef struct lmx_adapter_info {
    const char *format;         /* "peft" or "mlx" (static) */
    const char *path;           /* as loaded (owned by a) */
    int rank;                   /* the largest rank of its projections */
    float scale;                /* of its first projection (alpha / r, alpha / sqrt(r) with
                                   rsLoRA, or mlx-lm's scale) */
    int scales_differ;          /* 1 when projections have different scales (rank/alpha patterns) */
    const char *targets;        /* adapted projections, e.g. "q_proj,v_proj" (owned by a) */
    int first_layer, last_layer;/* adapted layers */
    int n_modules;              /* adapted (layer, projection) pairs */
    int64_t n_params;           /* sum of r * (in + out) */
} lmx_adapter_info;

lmx_status lmx_adapter_get_info(const lmx_adapter *a, lmx_adapter_info *out);

/* The model's default adapter (NULL or LMX_NO_ADAPTER: none); it must belong to m.  Contexts
 * created afterwards start with it. */
lmx_status lmx_model_set_adapter(lmx_model *m, lmx_adapter *a);

/* ---------------------------------------------------------------------------------------------
 * Training: LoRA fine-tuning through the model's own forward pass (the cpu backend; README
 * "Training").  A trainer trains one adapter of a model in place: after each step the adapter
 * serves inference as it is.  Errors: lmx_last_error(m).
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_lora_params {
    int rank;              /* 8 */
    float alpha;           /* 16: scale alpha / rank (alpha / sqrt(rank) with use_rslora) */
    int use_rslora;        /* 0 */
    const char *targets;   /* "q,k,v,o,gate,up,down" (the default: all seven) */
    int num_layers;        /* the last N layers; 0 (default): all */
    uint64_t seed;         /* of A's initialisation and of dropout's masks (0) */
    float dropout;         /* training: dropout on each pair's input, PEFT's lora_dropout (0) */
} lmx_lora_params;

lmx_lora_params lmx_lora_default_params(void);
/* A new adapter on m, initialised as HF PEFT does (A uniform in +-1/sqrt(in), B = 0: it changes nothing
 * until trained); m owns it as it owns loaded ones. */
lmx_status lmx_adapter_new(lmx_model *m, const lmx_lora_params *p, lmx_adapter **out);
/* Write a to dir in "peft" layout (adapter_config.json + adapter_model.safetensors) or "mlx" (mlx-lm's
 * adapter_config.json + adapters.safetensors); lmx_adapter_load, transformers + peft and mlx-lm read them. */
lmx_status lmx_adapter_save(const lmx_adapter *a, const char *dir, const char *format);

typedef struct lmx_trainer lmx_trainer;

typedef struct lmx_optim_params {  /* AdamW as PyTorch's (decoupled weight decay, bias correction) */
    double lr;             /* 1e-4 */
    double beta1, beta2;   /* 0.9, 0.999 */
    double eps;            /* 1e-8 */
    double weight_decay;   /* 0 */
    double clip_grad_norm; /* > 0: scale the gradients to at most this global L2 norm; 0 (default): off */
} lmx_optim_params;

lmx_optim_params lmx_optim_default_params(void);
/* A trainer of adapter a (of model m): its gradients and AdamW state. */
lmx_status lmx_trainer_open(lmx_model *m, lmx_adapter *a, lmx_trainer **out);
void lmx_trainer_close(lmx_trainer *t);
/* Gradient checkpointing: 1 keeps only each layer's input and runs the layer again in backward, 0
 * records every layer, -1 (default) checkpoints when a step without it would not fit the GPU's free
 * memory (cuda), or sequences of 1024 tokens and more (cpu). */
void lmx_trainer_set_checkpointing(lmx_trainer *t, int mode);
/* Value and grad: the masked cross-entropy of B sequences of T tokens from position 0 (mean over the
 * positions with mask > 0, weighted by mask, of -log softmax(logits)[target]) into *loss, and its
 * gradient with respect to every A and B of the adapter, kept by the trainer (accumulate: added to
 * the gradients there are, for gradient accumulation).  inputs, targets: [B*T]; mask [B*T] or NULL
 * (every position). */
lmx_status lmx_trainer_value_and_grad(lmx_trainer *t, const int32_t *inputs, const int32_t *targets,
                                      const float *mask, int B, int T, int accumulate, double *loss);
/* The same loss without gradients. */
lmx_status lmx_trainer_loss_only(lmx_trainer *t, const int32_t *inputs, const int32_t *targets,
                                 const float *mask, int B, int T, double *loss);
/* One AdamW step from the gradients; *grad_norm (may be NULL): their global norm before clipping. */
lmx_status lmx_trainer_step(lmx_trainer *t, const lmx_optim_params *p, double *grad_norm);

/* A loss of the logits of your own: called for consecutive chunks of the B*T positions (rows [row0,
 * row0 + R), logits [R, V] on the host, float32), it returns the chunk's part of the loss and writes
 * d loss / d logits into grad [R, V] (zeroed before each call).  The loss is the sum of the parts. */
typedef double (*lmx_loss_fn)(void *user, int row0, int R, int V, const float *logits, float *grad);
/* Value and grad of fn's loss of the adapted model's logits for inputs [B*T].  This is also the
 * vector-Jacobian product of the logits with respect to the adapter: an fn that writes a cotangent
 * into grad (and returns 0) leaves cotangent^T d logits / d (A, B) in the trainer's gradients
 * (lmx_trainer_read_grad).  Forward-mode products (JVP) are not provided: the tape runs backward only. */
lmx_status lmx_trainer_value_and_grad_fn(lmx_trainer *t, const int32_t *inputs, int B, int T, lmx_loss_fn fn,
                                         void *user, int accumulate, double *loss);
/* Value and grad of the mean squared error between the logits and target [B*T, V]: sum over positions
 * with mask > 0 (weighted by mask; NULL: all 1) of sum_v (logit - target)^2, over V x the weights' sum. */
lmx_status lmx_trainer_value_and_grad_mse(lmx_trainer *t, const int32_t *inputs, const float *target, const float *mask,
                                          int B, int T, int accumulate, double *loss);
/* The trained parameters: 2 per adapted projection (A, then B), in layer and projection order; each
 * one's PEFT key ("base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight") and element count,
 * and its gradient (float32, as the last value_and_grad left it) to the host. */
int lmx_trainer_param_count(const lmx_trainer *t);
lmx_status lmx_trainer_param_info(const lmx_trainer *t, int i, char *name, size_t cap, int64_t *n);
lmx_status lmx_trainer_read_grad(lmx_trainer *t, int i, float *dst);

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

/* The adapter c evaluates with (a context starts with the model's default): NULL = the model's
 * default, LMX_NO_ADAPTER = none.  Switching to another adapter forgets the cached positions
 * (they were computed under the old one).  lmx_eval_batch applies each context's own adapter. */
lmx_status lmx_context_set_adapter(lmx_context *c, lmx_adapter *a);

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

/* Host memory that m's backend copies results into at full speed: page-locked on cuda (a device copy
 * into ordinary memory goes through a staging buffer at a third of the speed or less), ordinary memory
 * on the cpu.  Worth it for logits read every step: a batch of 32 rows of a 128k vocabulary is 16 MB a
 * step, 1.7 ms into ordinary memory on an H100; and one sequence's decode step on cuda writes its logits
 * into such memory as it computes them, with no copy after the step (26 us a token at a 152k vocabulary).
 * NULL when out of memory.  Free it with lmx_host_free on the same model, before the model is freed. */
void *lmx_host_alloc(lmx_model *m, size_t bytes);
void lmx_host_free(lmx_model *m, void *p);


/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

/* The sampler chain, applied in this order to the next-token logits:
 *   1. penalties over the last penalty_last_n tokens (prompt and generated): repetition (a
 *      positive logit is divided by repeat_penalty, a negative one multiplied), presence (minus
 *      presence_penalty once per distinct token), frequency (minus frequency_penalty per
 *      occurrence);
 *   2. temperature: <= 0 is greedy (the largest logit, the lowest id among equals; the filters
 *      and the seed are then unused); otherwise the logits are divided by it;
 *   3. top-k: the top_k largest stay (0: off);
 *   4. top-p: the smallest set of most likely tokens whose probability reaches top_p (1: off);
 *   5. min-p: tokens less likely than min_p times the likeliest are dropped (0: off);
 *   6. a draw from what is left (renormalised) with a generator seeded by seed.
 * The same seed, parameters and prompt give the same tokens. */
typedef struct lmx_sampler_params {
    float temperature;        /* default 0.8 */
    int top_k;                /* default 40 */
    float top_p;              /* default 0.95 */
    float min_p;              /* default 0.05 */
    float repeat_penalty;     /* default 1 (off) */
    float presence_penalty;   /* default 0 */
    float frequency_penalty;  /* default 0 */
    int penalty_last_n;       /* default 64; -1 = every token so far */
    int64_t seed;             /* < 0 (default): lmx_load_params.seed */
} lmx_sampler_params;

lmx_sampler_params lmx_sampler_default_params(void);

/* ---------------------------------------------------------------------------------------------
 * Generation: a prompt in, tokens out, streamed through a callback or pulled one at a time.
 *
 * A model runs one generation at a time (one open lmx_stream, or one call of lmx_generate,
 * lmx_chat, lmx_batch_generate, lmx_classify, lmx_prompt_cache_warm); these calls must not run
 * concurrently with each other or with lmx_context_eval / lmx_eval_batch on the same model.
 * lmx_cancel is the one call that may come from another thread meanwhile.
 *
 * Prompt cache: the model keeps the KV cache of its last generation.  A new prompt that shares a
 * prefix of tokens with the last prompt and its generated tokens evaluates only the rest (at
 * least one token); results are the same as without the cache, and lmx_metrics.cached_tokens
 * says how many tokens were reused.  A generation under another adapter than the cached one's
 * reuses nothing.
 * ------------------------------------------------------------------------------------------- */

typedef enum lmx_finish {
    LMX_FINISH_NONE = 0,      /* still running */
    LMX_FINISH_EOS,           /* an end-of-sequence token of the model (not emitted) */
    LMX_FINISH_STOP_TOKEN,    /* one of lmx_gen_params.stop_ids (not emitted) */
    LMX_FINISH_STOP_STRING,   /* one of stop_strings appeared (it and what follows not emitted) */
    LMX_FINISH_LENGTH,        /* max_tokens generated */
    LMX_FINISH_CONTEXT,       /* the context (n_ctx of an unrotating model) is full */
    LMX_FINISH_CALLBACK,      /* the token callback returned nonzero */
    LMX_FINISH_CANCELLED,     /* lmx_cancel */
} lmx_finish;

/* A static name: "none", "eos", "stop_token", "stop_string", "length", "context", "callback",
 * "cancelled". */
const char *lmx_finish_str(lmx_finish f);

/* One generated token.  text is what it adds to the output, NUL-terminated, valid until the
 * next call on the stream (or until the callback returns): often its decoded piece, "" while a
 * multi-byte character or a possible stop string is incomplete, or several tokens' text at once
 * when such a hold is released.  The token that completes a stop string carries the text before
 * the stop string. */
typedef struct lmx_token {
    int32_t id;
    const char *text;
    size_t text_len;
    int index;                /* 0 for the first generated token */
} lmx_token;

/* Return nonzero to stop the generation (finish reason LMX_FINISH_CALLBACK). */
typedef int (*lmx_token_fn)(const lmx_token *tok, void *user);

typedef struct lmx_gen_params {
    int max_tokens;                      /* default 256 */
    lmx_sampler_params sampler;
    const int32_t *stop_ids;             /* further ids that end the generation */
    int n_stop_ids;
    const char *const *stop_strings;     /* texts that end it (matched in the generated text) */
    int n_stop_strings;
    int ignore_eos;                      /* 1: the model's EOS ids do not end it */
    lmx_token_fn on_token;               /* lmx_generate / lmx_chat / lmx_batch_generate call it
                                            for each token (NULL: none) */
    void *user;
    lmx_progress_fn on_prefill;          /* NULL, or told how far the prompt's evaluation is */
    void *prefill_user;
    lmx_adapter *adapter;                /* NULL: the model's default; LMX_NO_ADAPTER: none */
} lmx_gen_params;

lmx_gen_params lmx_gen_default_params(void);

/* What a generation produced.  Pointers are owned by the model (or the stream) and stay valid
 * until the next generation call on the model (or until the stream is freed). */
typedef struct lmx_result {
    const char *text;         /* the emitted text, NUL-terminated (stop strings left out) */
    size_t text_len;
    const int32_t *ids;       /* the generated ids, the ending EOS / stop id left out */
    int n_ids;
    lmx_finish finish;
    int32_t finish_id;        /* the EOS / stop id that ended it, else -1 */
} lmx_result;

/* Generate from a text prompt, encoded with the model's tokenizer (its BOS rules applied), or
 * from token ids; calls params->on_token for each token.  out may be NULL.  Errors:
 * LMX_ERR_MISSING when the model has no tokenizer (text calls), LMX_ERR_INVALID_ARG for an empty
 * prompt or a bad id, LMX_ERR_CONTEXT_FULL when the prompt does not fit the context. */
lmx_status lmx_generate(lmx_model *m, const char *prompt, const lmx_gen_params *params,
                        lmx_result *out);
lmx_status lmx_generate_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *params,
                            lmx_result *out);

/* A chat message: role "system", "user", "assistant" (or any role the template knows). */
typedef struct lmx_message {
    const char *role;
    const char *content;
} lmx_message;

/* Render messages with the model's chat template (generation prompt on) and generate the
 * assistant's answer; the model's end-of-turn tokens end it. */
lmx_status lmx_chat(lmx_model *m, const lmx_message *msgs, int n, const lmx_gen_params *params,
                    lmx_result *out);
/* The rendered prompt text of msgs (malloc'ed; the caller frees it). */
lmx_status lmx_chat_render(lmx_model *m, const lmx_message *msgs, int n, int add_generation_prompt,
                           char **out);

/* The pull form: open, then lmx_stream_next until it gives NULL.  params->on_token is not
 * called.  Free with lmx_stream_free (which also ends an unfinished generation). */
typedef struct lmx_stream lmx_stream;

lmx_status lmx_stream_open(lmx_model *m, const char *prompt, const lmx_gen_params *params,
                           lmx_stream **out);
lmx_status lmx_stream_open_ids(lmx_model *m, const int32_t *ids, int n, const lmx_gen_params *params,
                               lmx_stream **out);
lmx_status lmx_stream_open_chat(lmx_model *m, const lmx_message *msgs, int n,
                                const lmx_gen_params *params, lmx_stream **out);
/* *tok: the next token (owned by s, valid until the next call), or NULL when the generation has
 * finished (lmx_stream_result says why). */
lmx_status lmx_stream_next(lmx_stream *s, const lmx_token **tok);
lmx_status lmx_stream_result(const lmx_stream *s, lmx_result *out);
void lmx_stream_free(lmx_stream *s);

/* Ask the generation running on m to stop at its next token (LMX_FINISH_CANCELLED; a prompt
 * being evaluated stops at its next chunk).  Safe from any thread; no effect when none runs. */
void lmx_cancel(lmx_model *m);

/* Evaluate a prompt into the prompt cache (e.g. a fixed system prompt), generating nothing. */
lmx_status lmx_prompt_cache_warm(lmx_model *m, const char *prompt);
lmx_status lmx_prompt_cache_warm_ids(lmx_model *m, const int32_t *ids, int n);
/* Forget the prompt cache. */
void lmx_prompt_cache_clear(lmx_model *m);

/* ---------------------------------------------------------------------------------------------
 * Batches
 * ------------------------------------------------------------------------------------------- */

/* N prompts in one padded forward pass.  adapters: NULL (every prompt under the model's default
 * adapter) or [N], prompt i's adapter (NULL entries: the default; LMX_NO_ADAPTER: none).
 * next_ids [N] gets each prompt's next token drawn with sampler (NULL: greedy); logits (NULL, or
 * room for N * vocab_size floats) gets each prompt's last-position logits.  Uses neither the
 * prompt cache nor the generation context. */
lmx_status lmx_classify(lmx_model *m, const char *const *prompts, int N, lmx_adapter *const *adapters,
                        const lmx_sampler_params *sampler, int32_t *next_ids, float *logits);
lmx_status lmx_classify_ids(lmx_model *m, const int32_t *const *prompts, const int *lens, int N,
                            lmx_adapter *const *adapters, const lmx_sampler_params *sampler,
                            int32_t *next_ids, float *logits);

/* N prompts generated together, each with its own params[i] (stops, sampler, max_tokens,
 * on_token, adapter: one decode batch mixes adapters); results[i] as lmx_result (owned by the
 * model until its next generation call).  Under greedy sampling each result equals generating
 * that prompt alone. */
lmx_status lmx_batch_generate(lmx_model *m, const char *const *prompts, int N,
                              const lmx_gen_params *params, lmx_result *results);
lmx_status lmx_batch_generate_ids(lmx_model *m, const int32_t *const *prompts, const int *lens,
                                  int N, const lmx_gen_params *params, lmx_result *results);

/* ---------------------------------------------------------------------------------------------
 * Metrics of the last generation call (lmx_generate, lmx_chat, a stream, lmx_batch_generate,
 * lmx_classify, lmx_prompt_cache_warm)
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_metrics {
    int prompt_tokens;        /* tokens of the prompt(s) */
    int cached_tokens;        /* of those, reused from the prompt cache */
    int generated_tokens;
    double prefill_ms;        /* evaluating the prompt tokens that were not cached */
    double ttft_ms;           /* from the call to the first token */
    double decode_ms;         /* from the first token to the last */
    double prefill_tokens_per_s;
    double decode_tokens_per_s;
    int64_t memory_bytes, peak_memory_bytes;   /* as in lmx_model_info */
} lmx_metrics;

lmx_status lmx_get_metrics(const lmx_model *m, lmx_metrics *out);

/* ---------------------------------------------------------------------------------------------
 * Attention inspection: what each layer's attention saw for a prompt
 *
 * lmx_inspect evaluates a prompt in a fresh context of its own (the prompt cache and every
 * lmx_context stay as they were) and returns, for each chosen layer:
 *   - its keys: the post-RoPE keys the layer attends over, read from its KV cache after the
 *     prefill and widened to float32 (the cache's dtype: float32 on the cpu, bf16 on cuda, so
 *     cuda keys are bf16 values).  Every position is reported, sliding-window layers' too: the
 *     prompt is evaluated in chunks no longer than the smallest window and each chunk's keys are
 *     read before a rotating cache overwrites them.  A shared-KV layer (gemma4's last
 *     num_kv_shared_layers) keeps no cache: it names the layer it shares (shared_from) and
 *     reports that layer's keys;
 *   - optionally its attention probabilities for chosen query heads, computed on the host in
 *     float64 from the pass's post-RoPE queries (float32, captured as the forward pass makes
 *     them) and those keys, with the layer's scale, causal mask, sliding window and soft-capping
 *     as the forward pass applies them.  They take 4 H T^2 bytes per layer: ask for few layers
 *     on long prompts.
 * The result is host memory malloc'ed outside the model's memory accounting (lmx_memory_info).
 * An inspection is an evaluation on m: it must not run concurrently with the generation calls or
 * lmx_context_eval on m.  Not available on the mlx_lm backend (LMX_ERR_UNSUPPORTED).
 * ------------------------------------------------------------------------------------------- */
typedef struct lmx_inspect_params {
    const int *layers;       /* NULL (default): every layer in order; else n_layers distinct layer indices */
    int n_layers;
    int probs;               /* 1: also the attention probabilities (default 0) */
    const int *heads;        /* with probs: NULL (default) every query head; else n_heads distinct indices */
    int n_heads;
    lmx_adapter *adapter;    /* NULL: the model's default adapter; LMX_NO_ADAPTER: none */
} lmx_inspect_params;

lmx_inspect_params lmx_inspect_default_params(void);

/* One inspected layer.  T: the prompt's tokens, Hk / D: this layer's kv heads and head size (gemma4's
 * differ between layers).  Pointers are owned by the inspection. */
typedef struct lmx_inspect_layer {
    int layer;               /* its index in the model */
    int shared_from;         /* the layer whose keys and values it attends over: itself, or for a
                                shared-KV layer the last earlier layer of its attention type */
    int n_kv_heads, head_dim;/* Hk, D */
    int window;              /* > 0: sliding window (query i sees keys j with 0 <= i - j < window);
                                0: every j <= i */
    const float *keys;       /* [Hk, T, D]: keys[(kh T + j) D + d] (shared_from's keys) */
    int n_heads;             /* heads in probs; 0 when probabilities were not asked for */
    const int *heads;        /* [n_heads] their query head indices (query head h reads kv head
                                h / (H / Hk)) */
    const float *probs;      /* NULL, or [n_heads, T, T]: probs[(h T + i) T + j] the weight of key j in
                                query i's attention; 0 where masked */
} lmx_inspect_layer;

typedef struct lmx_inspection lmx_inspection;

/* Inspect a text prompt (encoded with the model's tokenizer, its BOS rules applied) or n token
 * ids.  On success *out owns the result (free it with lmx_inspection_free; it does not refer to m
 * afterwards).  Errors (lmx_last_error(m)): LMX_ERR_INVALID_ARG for an empty prompt, a bad id, a
 * layer or head index out of range or repeated; LMX_ERR_MISSING without a tokenizer (text). */
lmx_status lmx_inspect(lmx_model *m, const char *prompt, const lmx_inspect_params *p, lmx_inspection **out);
lmx_status lmx_inspect_ids(lmx_model *m, const int32_t *ids, int n, const lmx_inspect_params *p,
                           lmx_inspection **out);
/* T, and the prompt's ids [T] (owned by in). */
int lmx_inspection_n_tokens(const lmx_inspection *in);
const int32_t *lmx_inspection_ids(const lmx_inspection *in);
/* The number of inspected layers, and the i-th in the order asked for (NULL when i is out of range;
 * valid until lmx_inspection_free). */
int lmx_inspection_n_layers(const lmx_inspection *in);
const lmx_inspect_layer *lmx_inspection_layer(const lmx_inspection *in, int i);
void lmx_inspection_free(lmx_inspection *in);

#ifdef __cplusplus
}
#endif
#endif
