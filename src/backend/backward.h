/* backward.h - the backward ops a backend implements for training (the LoRA fine-tuning issue).
 *
 * Each op is the vector-Jacobian product of one forward op of backend.h: given the gradient of the
 * loss with respect to the op's output (dy), it ADDS the gradients with respect to the op's inputs
 * into the d* tensors (a value read by several ops collects a sum) -- except that the ops taking a
 * `fresh` mask WRITE each gradient whose bit is set (bit i: the op's i-th d* tensor, which holds no
 * values yet and may hold anything: writing saves its zeroing and a read) -- reading what the forward op read
 * (saved by the caller when the forward pass overwrote it).  Frozen weights get no gradient: matmul's
 * and rmsnorm's weights, embeddings; LoRA's A and B do.  Shapes and letters as in backend.h; every
 * tensor f32 in backend memory except frozen weights, which keep their stored format (dense, MLX or
 * GGUF: dequantized on the fly, never copied whole).
 *
 * Training runs each sequence from position 0 with no cache: attention_bwd takes the batch's own
 * keys and values (n_past must be 0) and recomputes the probabilities row by row, never holding a
 * T x T matrix. */
#ifndef LMX_BACKEND_BACKWARD_H
#define LMX_BACKEND_BACKWARD_H

#include "backend.h"

/* One AdamW update as PyTorch computes it (decoupled weight decay, bias corrections bc1 = 1 - beta1^t,
 * bc2 = 1 - beta2^t), the gradient first scaled by clip (global norm clipping; 1: none). */
typedef struct lmx_adamw_step {
    double lr, beta1, beta2, eps, weight_decay, bc1, bc2, clip;
} lmx_adamw_step;

/* A low-rank term that an op adds to one of its inputs before it reads it (the tape's LoRA expand, left
 * to the op that reads the projection next: glu_keep, lora_add): v[m, n] += pair->scale * sum_j xa[m, j]
 * pair->b[n, j], with xa [rows, r] f32 the shrink x A^T that lora_keep wrote, one pair for every row. */
typedef struct lmx_lora_term {
    const lmx_tensor *xa;
    const lmx_lora_pair *pair;
} lmx_lora_term;

typedef struct lmx_backward_ops {
    /* y = rmsnorm(x) * (w + add_one)                  dx += dy . dy/dx          x, dy, dx [rows, n]
     * fresh bit 0: dx */
    lmx_status (*rmsnorm_bwd)(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *x,
                              const lmx_tensor *w, int rows, int n, float eps, float add_one, unsigned fresh);
    /* dy of matmul_bwd and lora_bwd: f32, or in keep_dtype (a copy the tape makes once for both) */
    /* y = x W^T + b                                   dx += dy W                dy [M, N], dx [M, K]
     * dx f32, or in keep_dtype where that is bf16, written whole (fresh 1) from bf16 weights: the product rounded
     * once (the tape's gradient of a GLU's output); LMX_ERR_UNSUPPORTED, with no message, for other weights */
    lmx_status (*matmul_bwd)(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *w, int M,
                             unsigned fresh);
    /* y += s B (A x) per sequence (lora op): dx += s (dy B) A, dA += s (dy B)^T x, dB += s dy (A x)^T,
     * with da[b] / db[b] the gradients of pairs[b]'s a / b ([r, K] / [N, r]; pairs of one adapter share
     * them), NULL where pairs[b] is NULL.  dx may be NULL (the input needs no gradient); fresh bit 0: dx
     * (rows of sequences without a pair get zeros).  xa: x A^T [B*T, r] as lora_keep wrote it (every
     * pair of rank r), or NULL: computed here.  u non-NULL (dx NULL; one pair of rank r for every row,
     * with lora_dx): s dy B [B*T, r] f32 written into u, which lora_dx turns into dx's terms later. */
    lmx_status (*lora_bwd)(lmx_backend *be, lmx_tensor *dx, lmx_tensor *const *da, lmx_tensor *const *db,
                           const lmx_tensor *dy, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs,
                           unsigned fresh, const lmx_tensor *xa, lmx_tensor *u);
    /* y = act(gate) * up                              dgate, dup += ...         n elements each
     * dgate and dup both in keep_dtype where that is bf16 (fresh 3): written rounded to it (the tape's
     * bf16 gradients of a GLU's gate and up, which matmul_bwd and lora_bwd read as their dy); dy f32, or
     * in keep_dtype (as matmul_bwd wrote it) */
    lmx_status (*glu_bwd)(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                          const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, unsigned fresh);
    /* y = cap tanh(x / cap), given y                  dx += dy (1 - (y/cap)^2)  n elements */
    lmx_status (*softcap_bwd)(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *y, int64_t n,
                              float cap);
    /* y = rope(x)                                     dx += R^T dy              dy, dx [M, nh*hd]
     * dx in keep_dtype where that is bf16: dx = R^T dy rounded to it, every value written (the tape's
     * bf16 gradient of a projection that RoPE rotates next); an f32 dx with fresh bit 0 written too (padding
     * rows: zeros) */
    lmx_status (*rope_bwd)(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_batch *batch, int nh,
                           int hd, const lmx_rope *rope, unsigned fresh);
    /* out = attention(q, k, v) of lmx_attn_args a with n_past 0 and a->kv ignored (each sequence's
     * window: windows[b], 0 for none): dq, dk, dv += ...; dout [M, H*D].  a->out and a->lse: both NULL,
     * or the forward's output (f32 or keep dtype) and the log-sum-exp it wrote, which the backend may
     * take instead of recomputing them.  fresh bits 0, 1, 2: dq, dk, dv (padding rows: zeros). */
    lmx_status (*attention_bwd)(lmx_backend *be, lmx_tensor *dq, lmx_tensor *dk, lmx_tensor *dv, const lmx_tensor *dout,
                                const lmx_attn_args *a, const int *windows, unsigned fresh);
    /* out[r] = x[rows[r]]                             dx[rows[r]] += dout[r]    dout [R, n] */
    lmx_status (*gather_rows_bwd)(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dout, const int *rows, int R,
                                  int64_t n);
    /* The loss itself (not a tape op): cross-entropy of logits z [R, V] against targets[r] (in [0, V))
     * with weights w[r] (NULL: all 1; 0 skips the row): *loss = sum_r w_r (logsumexp(z_r) - z_r[t_r]),
     * and with c != 0, z is overwritten by its gradient times c: c w_r (softmax(z_r) - onehot(t_r)).
     * g16 non-NULL (c != 0; bf16 [R, V], the caller's): the gradient written there instead, rounded, z
     * left as it is (the head matmul's backward reads it so); a backend that cannot returns
     * LMX_ERR_UNSUPPORTED, having done nothing and set no message. */
    lmx_status (*xent)(lmx_backend *be, lmx_tensor *z, const int32_t *targets, const float *w, int R, int V, double c,
                       double *loss, lmx_tensor *g16);
    /* The optimizer (not tape ops either): *out = sum of x^2 over every value of the count tensors g[]
     * (one wait for all of them); and one AdamW update of n parameters p with gradients g and moments
     * m1, m2 (all f32 in backend memory), in double. */
    lmx_status (*sumsq)(lmx_backend *be, const lmx_tensor *g, int count, double *out);
    lmx_status (*adamw)(lmx_backend *be, lmx_tensor *p, const lmx_tensor *g, lmx_tensor *m1, lmx_tensor *m2, int64_t n,
                        const lmx_adamw_step *s);
    /* LoRA dropout: y[i] = x[i] / (1 - p) where lmx_dropout_keep(seed, i, p), else 0 (y may be x).  The
     * mask is a function of (seed, i) alone: the same on every backend, and the backward of the op is
     * the op itself with the same seed. */
    lmx_status (*dropout)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n, float p, uint64_t seed);
    /* A copy of a forward value that backward reads: *dst becomes a new tensor of x's shape (x is f32
     * [rows, cols], or already in keep_dtype: lmx_model.mlp16's gate and up) holding x's values, released
     * with the backend's release; in f32, or in bf16 where the backend keeps activations as bf16 training
     * does (cuda: half the bytes; LMX_CUDA_KEEP=f32 keeps f32).  The ops above take what they read of the
     * forward pass (rmsnorm's x, lora's x, glu's gate and up, softcap's y, attention's q, k, v) in f32 or in
     * the dtype this op keeps (keep_dtype). */
    lmx_status (*keep)(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x);
    lmx_dtype (*keep_dtype)(const lmx_backend *be);
    /* keep's inverse: the values of x (a keep) into dst, f32 of x's size (the input a checkpointed layer
     * runs on again), or a buffer of x's dtype (a bf16 gate or up product taken back: copied as it is) */
    lmx_status (*restore)(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x);
    /* Optional, both or neither (NULL on the cpu, whose memory is the host's): keep and restore through
     * host memory, for the inputs a checkpointed step holds through its forward pass.  offload copies x
     * (f32) into host (page-locked, from host_alloc; room for x's values in keep_dtype) without waiting
     * for the copy; reload writes such a block of n values back into dst (f32, or keep_dtype: copied as it
     * is, or where dst is the backend's allocation of n values, its memory exchanged for the block's),
     * and with next non-NULL (a block of n values offloaded before) starts fetching it for a reload to come
     * (several kinds of block may interleave, each fetching its next: train.c's replay); with dst and host
     * NULL it only starts fetching next.  The backend orders the copies after the ops before them and
     * before the ops after, so the caller never waits; host blocks are freed with host_free, which waits
     * for their copies.  With spread > 0 offload copies x's values aside at once but moves them to the host a
     * share at a time with each of the next spread offloads (all of what is left before any reload): a
     * large block whose copy would hold up the smaller ones behind it (train.c's gate / up products). */
    lmx_status (*offload)(lmx_backend *be, void *host, const lmx_tensor *x, int spread);
    lmx_status (*reload)(lmx_backend *be, lmx_tensor *dst, const void *host, int64_t n, const void *next);
    /* Optional (NULL: none): the glu op (backend.h; out may be gate) that also writes gate's and up's
     * values into gk and uk, and with ok non-NULL out's into ok, which the caller allocated in keep_dtype
     * and gate's shape: one pass over gate and up where the op and their keeps take three or four.  out
     * NULL (with ok): the output in ok alone.
     * tg / tu (NULL: none): terms added to gate / up first ([n / cols, cols] each), in the same pass where
     * the backend can; the keeps hold the values with them. */
    lmx_status (*glu_keep)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                           lmx_act act, lmx_tensor *gk, lmx_tensor *uk, lmx_tensor *ok, const lmx_lora_term *tg,
                           const lmx_lora_term *tu);
    /* Optional (NULL: none): the lora op (backend.h) that also writes each row's shrink x A^T into xa
     * [B*T, r] (f32, allocated by the caller; every pair of rank r; rows of sequences without a pair
     * are left as they are), which lora_bwd then reads instead of computing it again.  y NULL: the
     * shrink alone (the caller adds the expand later as a term: glu_keep, lora_add).
     * LMX_ERR_UNSUPPORTED where the backend cannot (the caller runs the lora op). */
    lmx_status (*lora_keep)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                            const lmx_lora_pair *const *pairs, lmx_tensor *xa);
    /* Optional (NULL: none): the rmsnorm op (backend.h) that also writes out's values into ok, allocated
     * by the caller in keep_dtype and out's shape (the keep of the matmuls' input that follows).
     * LMX_ERR_UNSUPPORTED where the backend cannot (the caller runs the rmsnorm op). */
    lmx_status (*rmsnorm_keep)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                               int n, float eps, float add_one, lmx_tensor *ok);
    /* Optional (NULL: none; both or neither): a value the tape computes again in backward rather than
     * keeping it from the forward pass (the input of a LoRA record that is a GLU's or a norm's output),
     * out allocated by the caller in keep_dtype: the glu op over gate and up as kept (keep_dtype), and the
     * rmsnorm op over x as kept (f32 or keep_dtype; rows of any length). */
    lmx_status (*glu_redo)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                           lmx_act act);
    lmx_status (*rmsnorm_redo)(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                               int n, float eps, float add_one);
    /* Optional (NULL: none; with lora_keep and glu_keep): y += x + term over n = rows * cols values (x
     * NULL: y += term), term as glu_keep's: the add op of a projection's output into the residual stream
     * with the projection's LoRA expand in the same pass. */
    lmx_status (*lora_add)(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n, const lmx_lora_term *term);
    /* Optional (NULL: the adamw op for each): the adamw op over all the values of count parameters p[i], with
     * gradients g[i] and moments m[2 i], m[2 i + 1], in one launch: the same values as the op on each. */
    lmx_status (*adamw_many)(lmx_backend *be, int count, lmx_tensor *const *p, const lmx_tensor *g, lmx_tensor *m,
                             const lmx_adamw_step *s);
    /* Optional (NULL: none, and lora_bwd is never given u): dx [rows, K] += sum_i u[i] pairs[i]->a over
     * count >= 1 terms (u[i] [rows, r_i] f32 as lora_bwd wrote it, pairs[i] of rank r_i); fresh bit 0: dx
     * written.  The input gradients of the LoRA pairs that read one input (q, k, v; gate, up) in one
     * product where the backend can: one pass over dx where each pair's took one. */
    lmx_status (*lora_dx)(lmx_backend *be, lmx_tensor *dx, int count, const lmx_tensor *u,
                          const lmx_lora_pair *const *pairs, unsigned fresh);
    /* Optional (NULL: none): glu_bwd with both gradients bf16 and written whole (fresh 3), from dy plus the
     * LoRA input-gradient terms of the projection that read the GLU's output (u[i] pairs[i]->a as lora_dx
     * adds them, count of them): the down projection's, in the pass that reads dy anyway.
     * LMX_ERR_UNSUPPORTED, with no message, where the backend does not take these shapes or dtypes (the
     * caller adds the terms with lora_dx, then runs glu_bwd). */
    lmx_status (*glu_bwd_dx)(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                             const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, int count,
                             const lmx_tensor *u, const lmx_lora_pair *const *pairs);
    /* Every value of the count f32 tensors g[] set to 0 (a step's gradients before it adds to them), without
     * a wait. */
    lmx_status (*zero_many)(lmx_backend *be, int count, lmx_tensor *g);
} lmx_backward_ops;

/* Whether the backend computes values again in backward (glu_redo and rmsnorm_redo): the tape keeps redos
 * instead of those values, and the trainer's memory estimate counts them so. */
static inline int lmx_backward_redoes(const lmx_backward_ops *b) { return b->glu_redo && b->rmsnorm_redo; }

/* What attention_bwd takes, as every backend checks it: whole KV head groups, sequences from position 0. */
static inline lmx_status lmx_attention_bwd_check(lmx_backend *be, const lmx_attn_args *a) {
    if (a->Hk <= 0 || a->H % a->Hk)
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "attention backward: %d heads not a multiple of %d kv heads", a->H,
                           a->Hk);
    for (int b = 0; b < a->batch->B; b++)
        if (a->batch->n_past[b] != 0)
            return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "attention backward: sequence %d starts at position %d, not 0",
                               b, a->batch->n_past[b]);
    return LMX_OK;
}

/* The cpu backend's backward ops (backend/cpu/cpu_backward.c; its ops table's backward). */
extern const lmx_backward_ops lmx_cpu_backward;
/* The cuda backend's (backend/cuda/cuda_backward.cu). */
extern const lmx_backward_ops lmx_cuda_backward;

#endif
