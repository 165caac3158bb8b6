/* backend.h - the interface every compute backend implements (cpu now, cuda later).
 *
 * A backend owns memory (weights, activations, KV caches) and runs ops on it.  It knows
 * nothing about models: the forward pass in src/model/forward.c is written once against this
 * table.  Tensors handed to ops live in the backend's memory; host data comes in only through
 * upload_weight / write and goes out only through read.
 *
 * Activations are float32 and row-major.  Dimension letters: B batch, T tokens per sequence,
 * M = B*T rows, C hidden, H query heads, Hk kv heads, D head dim, F ffn, V vocab.
 */
#ifndef LMX_BACKEND_BACKEND_H
#define LMX_BACKEND_BACKEND_H

#include <stdint.h>
#include "../base/dtype.h"
#include "../base/status.h"

/* MLX affine quantization of a 2-D weight [N, K] (bits 2, 4 or 8): row n is K/(32/bits) uint32
 * words, element k at word k/(32/bits), bit (k % (32/bits))*bits, LSB first; the value is
 * q * scale + bias with one scale and bias per group of `group` elements. */
typedef struct lmx_quant {
    int ggml_type;           /* > 0: GGUF block-quantized rows of this ggml type (the fields
                                below are unused; see backend/cpu/ggml_quant.h) */
    int bits;                /* MLX affine: 2, 4 or 8; 0 when not MLX-quantized */
    int group;
    lmx_dtype scale_dtype;   /* of scales and biases: bf16, f16 or f32 */
    void *scales, *biases;   /* [N, K/group] each, in backend memory */
    int experts;             /* > 0: the rows of that many stacked experts (a mixture's), as bound; < 0: another
                                weight of a mixture-of-experts model */
} lmx_quant;

/* A tensor in backend memory.  data is a host pointer on the cpu backend, a device pointer on
 * cuda.  A cpu weight (data, q.scales, q.biases) aliases its file at any alignment, so cpu kernels read
 * weights through lmx_load_* (base/half.h) or unaligned vector loads; cuda copies them to aligned
 * device memory.  Weights keep their stored dtype (quantized ones stay packed: dtype U32, shape the
 * logical [N, K], q says how), except that an upload may rewrite a weight's packing into another the
 * backend reads faster, with q updated to say so (cuda: GGUF Q4_0 / Q4_1 / Q4_K / Q8_0 matrices as MLX
 * groups of 32, cuda_repack.cu); activations are F32. */
typedef struct lmx_tensor {
    lmx_dtype dtype;
    int ndim;
    int64_t shape[4];        /* row-major, shape[ndim-1] fastest (logical, for quantized) */
    void *data;
    int owned;               /* 1 when the backend allocated data (freed by release) */
    lmx_quant q;
} lmx_tensor;

int64_t lmx_tensor_nelem(const lmx_tensor *t);
/* Rows [row0, row0 + n) of a 2-D tensor t [rows, K] as a tensor of its own: the same memory (dense, MLX or GGUF rows),
 * never a copy, not owned (the model's views of stacked experts). */
lmx_tensor lmx_tensor_rows(const lmx_tensor *t, int64_t row0, int64_t n);

/* One layer's KV cache for one sequence.  Position p lives in slot p % cap.  A rotating cache
 * (rotating = 1) keeps cap positions and overwrites the oldest; an unbounded one grows
 * (cap >= every stored position, slot == position). */
typedef struct lmx_kv_layer {
    lmx_tensor k, v;         /* [cap, Hk*D] each, of the backend's kv_dtype */
    int cap;
    int rotating;
    int window;              /* > 0: query i sees keys j with 0 <= i - j < window; 0: all j <= i */
} lmx_kv_layer;

typedef enum lmx_act { LMX_ACT_SILU, LMX_ACT_GELU_TANH } lmx_act;

/* RoPE for one layer over the first rot_dim dims of each head: angle = pos * inv_freq[i] for
 * i < rot_dim/2, cos/sin multiplied by attn_factor; rotate-half form (HF) or interleaved pairs
 * (the layout GGUF llama checkpoints use). */
typedef struct lmx_rope {
    int rot_dim;
    int interleaved;         /* 1: rotate pairs (2i, 2i+1) instead of (i, i + rot_dim/2) */
    const float *inv_freq;   /* host, [rot_dim/2] */
    float attn_factor;
} lmx_rope;

/* Batch layout shared by rope and attention: B sequences of T rows each (M = B*T rows);
 * sequence b has n_new[b] real rows (the rest is padding) starting at position n_past[b]. */
typedef struct lmx_batch {
    int B, T;
    const int *n_past;       /* host [B] */
    const int *n_new;        /* host [B] */
    int no_cache;            /* 1: sequences from position 0 whose keys and values are not kept (training's):
                              * the model's layers neither grow nor write their caches */
} lmx_batch;

typedef struct lmx_attn_args {
    const lmx_batch *batch;
    lmx_tensor *out;         /* [M, H*D] */
    const lmx_tensor *q;     /* [M, H*D]  (already normed/roped) */
    const lmx_tensor *k;     /* [M, Hk*D] new keys (roped) */
    const lmx_tensor *v;     /* [M, Hk*D] new values */
    lmx_kv_layer *const *kv; /* [B] this layer's cache of each sequence (holds positions < n_past) */
    int H, Hk, D;            /* each sequence's window comes from its kv layer */
    float scale;             /* multiplies q.k */
    float softcap;           /* > 0: scores = softcap * tanh(scores / softcap) */
    lmx_tensor *lse;         /* NULL, or (training: every n_past 0) [B, H, T] f32 that the op also fills
                              * with each new row's log-sum-exp of its scaled (soft-capped) scores, 0 for
                              * padding rows; a backend that cannot returns LMX_ERR_UNSUPPORTED, having
                              * done nothing and set no message */
} lmx_attn_args;

/* One LoRA pair of one projection: the projection's output gains scale * B (A x).
 * a [r, K] and b [N, r], f32 in backend memory (K, N: the adapted weight's in, out). */
typedef struct lmx_lora_pair {
    lmx_tensor a, b;
    float scale;
} lmx_lora_pair;

#define LMX_LORA_RANK_MAX 1024   /* adapters of larger rank are refused at load */

/* Whether p is a pair the lora op takes for a projection of K inputs and N outputs. */
static inline int lmx_lora_pair_fits(const lmx_lora_pair *p, int64_t K, int64_t N) {
    return p->a.dtype == LMX_DTYPE_F32 && p->b.dtype == LMX_DTYPE_F32 && p->a.shape[1] == K && p->b.shape[0] == N &&
           p->b.shape[1] == p->a.shape[0] && p->a.shape[0] <= LMX_LORA_RANK_MAX;
}

typedef struct lmx_backend lmx_backend;

/* A mixture of experts' layer for M rows, routed where the backend runs (the moe op):
 *   for each row i: the softmax of logits[i] * logit_scale over the E experts, its K best (the lower
 *   index first among equals) with their probabilities, renormalised over the K with norm_topk and
 *   times expert_scale[e] (NULL: 1), and
 *   out[i] += sum over those experts e of w_e * down_e(act(gate_e x[i]) * up_e x[i])
 * x, out [M, C]; logits [M, E] f32; experts [3 E]: gate_e, up_e [F, C] and down_e [C, F] of expert e;
 * expert_scale host [E].  Padding rows are computed as any other (their out rows are never read). */
typedef struct lmx_moe_args {
    lmx_tensor *out;
    const lmx_tensor *x, *logits, *experts;
    const float *expert_scale;
    int M, E, K, norm_topk;
    float logit_scale;
    lmx_act act;
    int alike;               /* every expert's gate, up and down stored as expert 0's (lmx_layer.experts_alike) */
} lmx_moe_args;

/* The routing on the host (forward.c's moe_host and the cpu's moe op).  lmx_moe_pick: one row's, as lmx_moe_args
 * says: z [E] its logits; ex [K], p [K] its experts, best first, and their weights.  lmx_moe_group: M rows' picks
 * and weights pick, pw [M, K] (a row whose pick[i K] is -1 left out: padding) by expert: expert e's count[e] pairs at
 * off[e] .. of rows (their rows, ascending) and w (their weights). */
void lmx_moe_pick(const float *z, int E, int K, double logit_scale, int norm_topk, const float *expert_scale, int *ex,
                  float *p);
void lmx_moe_group(const int *pick, const float *pw, int M, int K, int E, int *count, int *off, int *rows, float *w);

typedef struct lmx_backend_ops {
    const char *name;
    lmx_dtype kv_dtype;      /* element type of KV cache tensors (F32 on cpu; bf16 on cuda) */
    int prefill_chunk;       /* rows per forward pass when a long prompt is evaluated in chunks */
    void (*destroy)(lmx_backend *be);

    /* memory */
    /* Make weight w usable by ops.  On entry w->data (and w->q.scales / biases) point at host
     * memory that stays valid while the model lives; the cpu backend keeps them (zero copy), a
     * device backend copies them and replaces the pointers (and may change w's packing, q and dtype
     * with it: see lmx_tensor). */
    lmx_status (*upload_weight)(lmx_backend *be, lmx_tensor *w);
    /* Allocate t->data for t's dtype and shape (zeroed).  release frees what alloc made. */
    lmx_status (*alloc)(lmx_backend *be, lmx_tensor *t);
    void (*release)(lmx_backend *be, lmx_tensor *t);
    /* host <-> tensor copies of n_bytes at byte offset off */
    lmx_status (*write)(lmx_backend *be, lmx_tensor *t, size_t off, const void *src, size_t n);
    lmx_status (*read)(lmx_backend *be, const lmx_tensor *t, size_t off, void *dst, size_t n);

    /* ops; every tensor argument is in backend memory, every int array on the host */
    /* out[m, :] = table[ids[m], :] * scale                out [M, C], table [V, C] */
    lmx_status (*embed)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table,
                        const int32_t *ids, int M, float scale);
    /* out[m] = x[m] / rms(x[m]) * (w + add_one)             x, out [rows, n], w [n] */
    lmx_status (*rmsnorm)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                          const lmx_tensor *w, int rows, int n, float eps, float add_one);
    /* out[m, :] = x[m, :] @ w^T + bias                    x [M, K], w [N, K], out [M, N]
     * (x, as lora's x, f32; or, in training, the backend's bf16 keep of it where its keeps are bf16:
     * backward.h keep, which the tape makes once for the ops that read one input; out f32, or bf16 where
     * training asks it of the MLP's gate and up, model.h mlp16: the product rounded once) */
    lmx_status (*matmul)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                         const lmx_tensor *w, const lmx_tensor *bias, int M);
    /* Unmerged LoRA over a batch of B sequences of T rows (M = B*T), each with its own pair or none:
     *   y[b*T + t, :] += p->scale * (x[b*T + t, :] @ p->a^T) @ p->b^T   with p = pairs[b] != NULL
     * x [M, K], y [M, N]; rows of sequences without a pair are left alone.  pairs: host [B]. */
    lmx_status (*lora)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                       const lmx_lora_pair *const *pairs);
    /* y += x, n elements */
    lmx_status (*add)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n);
    /* out = act(gate) * up, n elements (gate and up f32, or both bf16: model.h mlp16) */
    lmx_status (*glu)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate,
                      const lmx_tensor *up, int64_t n, lmx_act act);
    /* x = cap * tanh(x / cap), n elements */
    lmx_status (*softcap)(lmx_backend *be, lmx_tensor *x, int64_t n, float cap);
    /* rotate x [M, nh*hd] in place; row (b, t) has position n_past[b] + t */
    lmx_status (*rope)(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh, int hd,
                       const lmx_rope *rope);
    /* causal attention of the new rows over cached + new keys (see lmx_attn_args) */
    lmx_status (*attention)(lmx_backend *be, const lmx_attn_args *a);
    /* append the n_new[b] new rows of k, v [M, Hk*D] to each sequence's cache */
    lmx_status (*kv_append)(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *batch,
                            const lmx_tensor *k, const lmx_tensor *v);
    /* grow an unbounded cache to hold at least need positions (no-op when rotating) */
    lmx_status (*kv_reserve)(lmx_backend *be, lmx_kv_layer *kv, int need, int64_t row_elems);
    /* out[r, :] = x[rows[r], :]                           x [*, n], out [R, n] */
    lmx_status (*gather_rows)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                              const int *rows, int R, int64_t n);
    /* The k largest values of each row of x [R, n] (1 <= k <= min(n, LMX_TOPK_MAX)), largest first,
     * equal values by lower index, into host vals / idx [R, k]: what sampling needs without reading
     * whole rows.  Optional (NULL on the cpu); LMX_ERR_UNSUPPORTED when the backend declines. */
    lmx_status (*topk)(lmx_backend *be, const lmx_tensor *x, int R, int n, int k, float *vals, int32_t *idx);
    /* Free the scratch buffers the backend keeps between ops (they grow again on demand). */
    void (*trim)(lmx_backend *be);
    /* Bytes of those scratch buffers now (part of mem_now). */
    int64_t (*cached_bytes)(const lmx_backend *be);
    /* Training: the backward ops (backward.h); NULL when the backend cannot train. */
    const struct lmx_backward_ops *backward;
    /* y[rows[r], :] += w[r] * x[r, :] for r < R, rows distinct (host rows / w)   x [R, n]: a mixture of
     * experts adds each expert's output to the rows routed to it */
    lmx_status (*scatter_add_rows)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, const int *rows, const float *w,
                                   int R, int64_t n);
    /* x[i] = s * x[i] for i < n (x f32); s == 0 writes zeros whatever x held (inf, NaN).  Gemma 4's
     * layer scalars and per-layer input scales, and with s = 0 the clearing of its experts' sum.
     * Optional (last in the table): models that need it are refused with a message where it is NULL. */
    lmx_status (*scale)(lmx_backend *be, lmx_tensor *x, int64_t n, float s);
    /* A mixture of experts routed on the backend (lmx_moe_args).  Optional: NULL, or LMX_ERR_UNSUPPORTED
     * (nothing done) for what it does not take, and the model routes on the host (forward.c). */
    lmx_status (*moe)(lmx_backend *be, const lmx_moe_args *a);
    /* Bytes the backend's device could still allocate (optional; NULL where it is not known, as on the
     * cpu): training decides from it whether a step fits without checkpointing. */
    int64_t (*free_bytes)(const lmx_backend *be);
    /* Host memory that read copies into fastest (page-locked), and its free (optional: NULL where
     * ordinary memory is as fast, as on the cpu; lmx_host_alloc then uses malloc). */
    void *(*host_alloc)(lmx_backend *be, size_t n);
    void (*host_free)(lmx_backend *be, void *p);
    /* As alloc, the contents left undefined (optional: NULL where zeroing costs little, as on the cpu;
     * training's fresh gradients, which the backward op writes whole, backward.h). */
    lmx_status (*alloc_raw)(lmx_backend *be, lmx_tensor *t);
    /* As upload_weight, the copy left in host memory that the device reads in place over the bus
     * (optional: NULL where the backend's memory is the host's): for a table read a few rows a token,
     * the token embeddings, whose device memory it saves (lmx_load_params.embed_on_host). */
    lmx_status (*upload_weight_host)(lmx_backend *be, lmx_tensor *w);
    /* trim's scratch buffers alone, whatever else trim gives back kept for reuse (optional: NULL where
     * trim does no more): training's checkpointed backward, which needs less scratch than its forward. */
    void (*trim_scratch)(lmx_backend *be);
    /* The step that has begun (its embedding issued) ends in read(t, 0, dst, n) (optional: NULL, or ignored
     * where the backend has no use for it).  A backend that replays the step as a graph may write t's values
     * into dst while it computes them, so that the read only waits: dst must stay valid and unread by the
     * caller until that read, and t must be what the read reads. */
    lmx_status (*read_ahead)(lmx_backend *be, const lmx_tensor *t, void *dst, size_t n);
    /* Optional (NULL: the ops in turn): gate and up [M, F] each given its pairs' LoRA expand of x (the lora
     * op; pg / pu NULL: none), then the glu op out = act(gate) * up, in one pass where the backend can (a
     * LoRA expand alone reads and writes its projection in f32).  gate and up may be left with their
     * expands added.  As lora, glu. */
    lmx_status (*lora_glu)(lmx_backend *be, lmx_tensor *out, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x,
                           int B, int T, const lmx_lora_pair *const *pg, const lmx_lora_pair *const *pu, int64_t n,
                           lmx_act act);
    /* Optional (NULL: the ops in turn): y += proj + proj's LoRA expand of x (pairs, as the lora op): the
     * residual add of the o or down projection in the pass of its expand.  proj may be left with it added. */
    lmx_status (*lora_add)(lmx_backend *be, lmx_tensor *y, lmx_tensor *proj, const lmx_tensor *x, int B, int T,
                           const lmx_lora_pair *const *pairs, int64_t n);
    /* Optional (NULL: the ops in turn): xn = rmsnorm(x) as the rmsnorm op ([rows, n]), then for i < count
     * outs[i] = xn @ ws[i]^T + biases[i] (NULL: none) as the matmul op: q, k and v, or gate and up, in fewer
     * passes where the backend can (cuda: the norm also writes a bf16 copy of xn, which the GEMMs read
     * instead of each narrowing xn).  The same values as the ops in turn; LMX_ERR_UNSUPPORTED (nothing done,
     * no message) where the backend declines (rows few enough for its one-row kernels, other weights).
     * xn may be bf16 (forward.c asks so for a prompt's rows): the norm's output rounded, written alone, for the
     * projections to read as it is.  A backend that takes it promises that its matmul, lora, lora_glu (x) and
     * lora_add (x) ops take such bf16 activations, and its glu and lora_glu ops a bf16 out (the GLU's output,
     * which only the down projection reads). */
    lmx_status (*norm_matmuls)(lmx_backend *be, lmx_tensor *xn, const lmx_tensor *x, const lmx_tensor *norm_w, int rows,
                               int n, float eps, float add_one, int count, lmx_tensor *const *outs,
                               const lmx_tensor *const *ws, const lmx_tensor *const *biases);
} lmx_backend_ops;

#define LMX_TOPK_MAX 256

struct lmx_backend {
    const lmx_backend_ops *ops;
    lmx_err err;             /* message of the last failing op */
    int64_t mem_now;         /* bytes the backend (and the runtime, for its buffers) holds now */
    int64_t mem_peak;        /* the most held at once */
    int64_t mem_mapped;      /* bytes of weights used in place from mapped files (cpu) */
    int64_t mem_limit;       /* > 0: mem_mapped + mem_now may not pass it (lmx_backend_mem_check) */
    int replays_steps;       /* 1: a decode step replays as one graph while its rows stay the same (cuda), so a batch
                              * keeps its rows when sequences end (batch.c) */
};

/* Count delta bytes allocated (> 0) or freed (< 0) against be's memory accounting. */
static inline void lmx_backend_mem(lmx_backend *be, int64_t delta) {
    be->mem_now += delta;
    if (be->mem_now > be->mem_peak) be->mem_peak = be->mem_now;
}

/* Whether delta more bytes fit be's memory limit (1) or not (0). */
static inline int lmx_backend_mem_fits(const lmx_backend *be, int64_t delta) {
    return be->mem_limit <= 0 || delta <= 0 || be->mem_mapped + be->mem_now + delta <= be->mem_limit;
}

/* Whether delta more bytes fit be's memory limit: LMX_OK, or LMX_ERR_NOMEM with "out of memory:
 * limit N bytes, would need M bytes" in be->err.  Every allocation asks before it allocates. */
static inline lmx_status lmx_backend_mem_check(lmx_backend *be, int64_t delta) {
    int64_t need = be->mem_mapped + be->mem_now + delta;
    if (lmx_backend_mem_fits(be, delta)) return LMX_OK;
    return lmx_err_set(&be->err, LMX_ERR_NOMEM, "out of memory: limit %lld bytes, would need %lld bytes",
                       (long long)be->mem_limit, (long long)need);
}

/* t allocated for an op that writes it whole: uninitialised where the backend can (alloc_raw), else zeroed. */
static inline lmx_status lmx_backend_alloc_raw(lmx_backend *be, lmx_tensor *t) {
    return (be->ops->alloc_raw ? be->ops->alloc_raw : be->ops->alloc)(be, t);
}

/* Bytes a weight occupies as stored (data, plus scales and biases when MLX-quantized). */
int64_t lmx_weight_bytes(const lmx_tensor *w);

/* Create a backend by name ("cpu", "cuda" where built, "auto": cuda when built and a GPU is
 * present, else cpu); n_threads 0 = all cores (cpu). */
lmx_status lmx_backend_create(const char *name, int n_threads, lmx_backend **out, lmx_err *err);
void lmx_backend_free(lmx_backend *be);

lmx_status lmx_cpu_backend_create(int n_threads, lmx_backend **out, lmx_err *err);

#ifdef LMX_HAVE_CUDA
/* The cuda backend on the current device (backend/cuda); LMX_ERR_BACKEND without a usable GPU. */
lmx_status lmx_cuda_backend_create(lmx_backend **out, lmx_err *err);
/* Number of usable CUDA devices (0 when the driver or a GPU is missing). */
int lmx_cuda_device_count(void);
/* Name, memory, compute capability, SMs and driver / runtime versions of CUDA device i. */
lmx_status lmx_cuda_device_info(int i, lmx_device_info *out, lmx_err *err);
#endif

#endif
