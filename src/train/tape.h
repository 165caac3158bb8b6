/* tape.h - reverse-mode autodiff over the one forward pass: a recording backend.
 *
 * A tape wraps a real backend (its "inner" one) in a backend of its own.  Running the model's forward
 * pass on the tape's backend runs every op on the inner backend and, for the ops that lie on a path
 * from a trainable LoRA pair to the output, appends a record: the op, its parameters, and copies of
 * the inputs its backward op reads (the forward pass reuses its buffers, so they would be gone).
 * lmx_tape_backward_from then walks the records in reverse, calling the inner backend's backward ops
 * (backward.h), and leaves the gradients of the watched pairs' A and B in the tensors given to
 * lmx_tape_watch.  Inference never builds a tape and pays nothing for it.
 *
 * Values are tracked per buffer version: every write to a buffer (in-place ops included) makes a new
 * version, so a buffer that layer after layer reuses carries each layer's gradient separately.  Only
 * versions that depend on a watched pair need a gradient; everything else is run and forgotten. */
#ifndef LMX_TRAIN_TAPE_H
#define LMX_TRAIN_TAPE_H

#include "../backend/backward.h"

typedef struct lmx_tape lmx_tape;

/* A tape over inner, whose backward ops are bwd (the inner backend's). */
lmx_status lmx_tape_create(lmx_backend *inner, const lmx_backward_ops *bwd, lmx_tape **out, lmx_err *err);
void lmx_tape_free(lmx_tape *t);
/* The backend to run the forward pass on (owned by the tape; its memory and errors are inner's). */
lmx_backend *lmx_tape_backend(lmx_tape *t);
/* inner, the backend the tape runs on (its memory counts, mem_now / mem_peak, are the ones that move) */
lmx_backend *lmx_tape_inner(lmx_tape *t);
/* Pair p (in inner's memory) is trainable: the gradients of its a and b accumulate into da, db
 * (f32, p's shapes, zeroed by the caller).  Watches stay until lmx_tape_clear_watches. */
lmx_status lmx_tape_watch(lmx_tape *t, const lmx_lora_pair *p, lmx_tensor *da, lmx_tensor *db);
void lmx_tape_clear_watches(lmx_tape *t);
/* Start a new record (the previous one, its saved copies and gradients, and ops left unrun are dropped). */
void lmx_tape_reset(lmx_tape *t);
/* Backpropagate from y (a buffer the recorded pass wrote, e.g. the logits) whose gradient is the first
 * n values of dy in inner's memory (it may be y's own buffer, overwritten with its gradient after the
 * forward op that wrote it): each watched pair's da, db gain dL/dA, dL/dB.  Only the records made
 * since mark (lmx_tape_mark; 0: all) are walked back, and forgotten, leaving the gradients of earlier
 * values to a later call: the loss runs its vocabulary-wide head a chunk of rows at a time this way.
 * lmx_tape_walk walks back from mark without seeding (it goes on from the gradients there are). */
int lmx_tape_mark(const lmx_tape *t);
lmx_status lmx_tape_backward_from(lmx_tape *t, const lmx_tensor *y, const lmx_tensor *dy, int64_t n, int mark);
/* The same, taking dy's buffer over as y's gradient where dy owns it (f32, n values; dy emptied), not
 * copying it (else as lmx_tape_backward_from, dy left to the caller). */
lmx_status lmx_tape_backward_take(lmx_tape *t, const lmx_tensor *y, lmx_tensor *dy, int64_t n, int mark);
/* 1 when the backward from y may start from a bf16 dy (the backend keeps bf16, and a matmul made y, whose
 * backward reads its gradient so: the loss's head), not rounded again; else dy must be f32. */
int lmx_tape_seed16(lmx_tape *t, const lmx_tensor *y);
lmx_status lmx_tape_walk(lmx_tape *t, int mark);

/* The forward pass on the tape's backend is over: the ops it has left unrun are run now.  The tape runs
 * a projection's matmul, LoRA and residual add when its next op comes (their values whole before anything
 * reads them), so call this before reading the pass's output outside the tape or resetting it.  unread
 * non-NULL: the caller will not read buffer unread's value (backward starts from it): where the ops left
 * unrun end in the add into it and no record keeps what they write, they are dropped, their buffers left
 * as they were (a checkpointed layer run again for its backward skips its last projection). */
lmx_status lmx_tape_end_forward(lmx_tape *t, const lmx_tensor *unread);

/* Buffer x is about to be written outside the tape (by the inner backend's ops): what the records keep
 * of it is copied first. */
lmx_status lmx_tape_guard(lmx_tape *t, const lmx_tensor *x);

/* LoRA dropout: from now on, each trained pair's lora op reads dropout(x) with probability p (0: none),
 * its mask drawn from (seed, the pair's watch) alone, so that a layer run again draws the same one. */
void lmx_tape_set_dropout(lmx_tape *t, float p, uint64_t seed);

/* Whether a LoRA record whose input a GLU made shares the GLU's bf16 copy of its output where the op wrote
 * one (glu_keep), rather than computing that value again in backward (a redo, the default): a checkpointed
 * layer records one layer at a time, so holding it costs no more than the redo's own copy in its backward. */
void lmx_tape_set_keep_glu(lmx_tape *t, int on);
/* With on, a GLU output's gradient may live in bf16 alone, as the frozen down projection's input gradient writes
 * it (tape_backward.c glu_out16; a checkpointed step's, where gate and up are bf16 too: model.h mlp16). */
void lmx_tape_set_glu_out16(lmx_tape *t, int on);

/* Gradient checkpointing's replay: the layer about to run again for backward takes back what its first run
 * saved (model.h lmx_layer_save) instead of computing it.  With att non-NULL (and lse given), its attention
 * op is recorded but not run: att writes the op's output, into the output's keep (allocated by the tape in
 * the backend's keep dtype) where that is bf16, else into the op's output buffer, and the record takes lse
 * over (its log-sum-exp [B*H*T] f32, released by the tape).  With resid non-NULL, the residual add into
 * buffer resid_buf that follows a frozen matmul left unrun (the attention block's last projection) is
 * recorded, but neither it nor that matmul and its LoRA run: resid writes the buffer's value after the add
 * (f32 [M, C]).  Each is taken once; one not taken (the layer's ops are not these) is dropped, with its lse,
 * by lmx_tape_reset or the next lmx_tape_set_replay.  With qkv non-NULL, buffers qkv_buf (the attention's q,
 * k and v) are muted until the attention op that reads them: the frozen matmuls, LoRA and RoPE that write
 * them are recorded but not run (LoRA's backward then computes its x A^T itself), and before that attention
 * op runs (or replays) qkv writes its inputs (which 0, 1, 2: q, k, v, into dst f32 [M, cols]); any other op
 * reading a muted buffer fails.  With input.data set (the tape's from the call; released where not taken),
 * buffer input_buf (a leaf: the layer's input) does not hold its value, which input holds in the backend's
 * keep dtype: the first rmsnorm of input_buf is recorded with input as its keep but not run, and an op that
 * reads input_buf or that norm's output fails until an op writes them (for a layer whose only readers of them
 * are left unrun or replayed: with qkv and resid).  With gu non-NULL, the frozen matmuls by weights gu_w[0] and
 * gu_w[1] (the MLP's gate and up) are recorded but not run: gu writes their products into their outputs (which
 * 0, 1), each once.  NULL: none. */
typedef struct lmx_tape_replay {
    lmx_status (*att)(void *user, lmx_tensor *dst);
    lmx_tensor lse;
    lmx_status (*resid)(void *user, lmx_tensor *x);
    const void *resid_buf;
    lmx_status (*qkv)(void *user, int which, lmx_tensor *dst);
    const void *qkv_buf[3];
    lmx_tensor input;
    const void *input_buf;
    lmx_status (*gu)(void *user, int which, lmx_tensor *dst);
    const lmx_tensor *gu_w[2];
    void *user;
} lmx_tape_replay;
void lmx_tape_set_replay(lmx_tape *t, const lmx_tape_replay *r);

/* Gradient checkpointing: a leaf is buffer x's current contents ([rows, cols], written outside the tape)
 * as a value whose gradient backward computes (a recomputed layer's input); returns its var id (-1:
 * out of memory).  lmx_tape_take_grad moves var v's gradient out to the caller (who releases it on the
 * inner backend); g is all zero when v got none. */
int lmx_tape_leaf(lmx_tape *t, const lmx_tensor *x, int64_t rows, int64_t cols);
/* Buffer x was made outside the tape (on the inner backend): no version the tape saw is its (0; -1: out of
 * memory) */
int lmx_tape_fresh(lmx_tape *t, const lmx_tensor *x);
void lmx_tape_take_grad(lmx_tape *t, int v, lmx_tensor *g);

/* Profiling: with acc non-NULL ([LMX_TAPE_KINDS]), backward waits for inner after each record and adds
 * its seconds to acc[kind]; with acc_fwd non-NULL, each op run on the tape's backend (a recorded pass,
 * or a layer run again by checkpointing) likewise adds its own and its saved copies' seconds to
 * acc_fwd[kind]; lmx_tape_kind names kind k (1 .. LMX_TAPE_KINDS - 1). */
#define LMX_TAPE_KINDS 10
void lmx_tape_profile(lmx_tape *t, double *acc, double *acc_fwd);
const char *lmx_tape_kind(int k);

#endif
