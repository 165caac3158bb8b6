/* train.h - LoRA training over the one forward pass: the loss and its gradients through a tape
 * (train/tape.h), and AdamW.
 *
 * The trained parameters are an adapter's pairs (model/adapter.h), updated in place, so the adapter
 * serves inference as soon as a step ends.  A trainer owns the tape, the gradients (one f32 A and B
 * per pair) and the optimizer state. */
#ifndef LMX_TRAIN_TRAIN_H
#define LMX_TRAIN_TRAIN_H

#include "../model/adapter.h"
#include "tape.h"

typedef struct lmx_adamw {
    double lr, beta1, beta2, eps, weight_decay;
    double clip_grad_norm;       /* > 0: scale the gradients to at most this global L2 norm */
} lmx_adamw;

/* Sequence length from which training checkpoints every layer by default where the backend cannot say
 * how much memory is free (the cpu): it keeps only each layer's input through the forward pass, and runs
 * each layer again in backward (about a third more compute for a fraction of the memory).  Where it
 * can (cuda), the default checkpoints when a step without would not fit (lmx_trainer_checkpoints). */
#define LMX_CHECKPOINT_FROM 1024

typedef struct lmx_trainer {
    lmx_model *m;
    lmx_adapter *ad;
    lmx_tape *tape;
    int n;                       /* trained pairs */
    lmx_lora_pair **pairs;       /* [n] the adapter's pairs, in (layer, projection) order */
    lmx_tensor *grad;            /* [2n]: dA, dB of pair i at 2i, 2i+1 (backend memory) */
    lmx_tensor *mom;             /* [2n][2]: AdamW's m1, m2 of gradient i at 2i, 2i+1 (f32, backend memory) */
    int64_t step;                /* AdamW steps taken */
    int loss_rows;               /* > 0: rows of logits the loss computes at once (0: ~64 MiB of them) */
    float dropout;               /* LoRA dropout on the pairs' inputs while training (0: none) */
    uint64_t seed;               /* its masks' seed */
    int64_t micro;               /* the micro-batch of this step (gradient accumulation), for dropout's masks */
    int checkpoint;              /* gradient checkpointing: 1 on, 0 off, -1 (default): by memory, or from
                                  * LMX_CHECKPOINT_FROM tokens (lmx_trainer_checkpoints) */
    int auto_B, auto_T, auto_ckpt; /* the default's decision for steps of auto_B x auto_T tokens, made once:
                                    * memory held between steps must not flip it */
    int offload;                 /* 1 (default): a checkpointed step holds its layers' inputs in host memory where
                                  * the backend can (backward ops offload / reload); 0: in the backend's */
    int replay;                  /* 1 (default): a checkpointed layer run again takes its attention's output and the
                                  * hidden state after its attention block from its first run (lmx_tape_replay)
                                  * where it can, held as its input is; 0: computes them again */
    int replay_qkv;              /* 1 (default): with replay, also the attention's q, k and v where the layer's
                                  * ops allow (train.c qkv_replayable); 0: they are computed again */
    int keep_gu;                 /* with replay of q, k, v: how many layers below the last keep their MLP's gate and
                                  * up products for their runs again instead of computing them (through host memory
                                  * where the inputs go there; train.c gu_layers_picked; -1, default: its choice) */
    int64_t replayed[4];         /* values taken back by replay since the trainer was made: attention outputs,
                                  * hidden states, attention inputs q, k, v, the MLP's gate and up products
                                  * (layers of them; what tests and benchmarks report) */
    void *park;                  /* those inputs: page-locked host memory (the backend's host_alloc), park_bytes */
    size_t park_bytes;
    int lowest;                  /* the lowest layer with a trained pair (checkpointing stops there) */
    int profile;                 /* 1: wait for the backend after each phase and time it (prof) */
    double prof[4];              /* seconds in: forward, head + loss (and its backward), backward, AdamW */
    int64_t prof_peak[6];        /* the most bytes the backend held in each of those phases (since the trainer was
                                  * made), and in a checkpointed backward's layers run again and walked back */
    double prof_bwd[LMX_TAPE_KINDS]; /* backward's seconds by record kind (lmx_tape_kind) */
    double prof_fwd[LMX_TAPE_KINDS]; /* recorded forward ops' seconds by kind */
    lmx_err err;
} lmx_trainer;

/* 1 when a step of B sequences of T tokens runs with gradient checkpointing (tr->checkpoint's rule). */
int lmx_trainer_checkpoints(lmx_trainer *tr, int B, int T);

/* A trainer of adapter ad's pairs on model m (m's backend must have backward ops). */
lmx_status lmx_trainer_create(lmx_model *m, lmx_adapter *ad, lmx_trainer **out, lmx_err *err);
void lmx_trainer_free(lmx_trainer *tr);
/* The masked cross-entropy loss of B sequences of T tokens: mean over positions with mask > 0
 * (weighted by mask) of -log softmax(logits)[target].  With grad_weight != 0 the gradients of every
 * pair become those of grad_weight * loss, or gain them with accumulate (gradient accumulation).
 * inputs, targets [B*T]; mask [B*T] or NULL (all 1). */
lmx_status lmx_trainer_loss(lmx_trainer *tr, const int32_t *inputs, const int32_t *targets, const float *mask, int B,
                            int T, double grad_weight, int accumulate, double *loss);
/* The same with a loss of the logits computed by fn (lmx_loss_fn, lmx.h) instead of the cross-entropy:
 * targets and mask are not read (NULL), and the loss is the sum of fn's parts. */
lmx_status lmx_trainer_loss_fn(lmx_trainer *tr, const int32_t *inputs, const int32_t *targets, const float *mask,
                               lmx_loss_fn fn, void *user, int B, int T, double grad_weight, int accumulate,
                               double *loss);
/* One AdamW step from the current gradients (PyTorch's AdamW: decoupled weight decay, bias
 * correction); *gnorm the global gradient norm before clipping (may be NULL). */
lmx_status lmx_trainer_adamw(lmx_trainer *tr, const lmx_adamw *opt, double *gnorm);
/* AdamW's moment k (0: m1, 1: m2) of gradient i, the gradient's element count of floats, to or from
 * the host (checkpoints). */
lmx_status lmx_trainer_moment_read(lmx_trainer *tr, int i, int k, float *dst);
lmx_status lmx_trainer_moment_write(lmx_trainer *tr, int i, int k, const float *src);

#endif
