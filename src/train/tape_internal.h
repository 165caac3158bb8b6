/* tape_internal.h - what the tape's parts share: the recording (tape.c, tape_keep.c) and the walk back
 * (tape_backward.c).  Vars, records, keeps and watches as tape.c's opening comment describes them. */
#ifndef LMX_TRAIN_TAPE_INTERNAL_H
#define LMX_TRAIN_TAPE_INTERNAL_H

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tape.h"

enum { T_RMSNORM = 1, T_MATMUL, T_LORA, T_ADD, T_GLU, T_SOFTCAP, T_ROPE, T_ATTENTION, T_GATHER };

#define TAPE_DU 4                /* LoRA pairs reading one input whose input gradients wait together */
typedef struct tape_var {
    int64_t rows, cols;
    int requires;                /* depends on a watched pair */
    lmx_tensor grad;             /* f32 [rows, cols]; data NULL until backward reaches it */
    lmx_tensor grad16;           /* grad in the backend's bf16 keep dtype, while grad is unchanged: made for a
                                  * LoRA record, read by the matmul record that produced y; or the gradient
                                  * alone, grad none (only16: where bf16_grad_ok, tape_backward.c, says) */
    int n_du;                    /* LoRA input-gradient terms not added yet: u[i] pair[i]->a (backward.h
                                  * lora_dx), added in one product before anything else writes or reads grad;
                                  * a GLU's output's, by its record's glu_bwd_dx (tape_backward.c du_to_maker) */
    lmx_tensor du[TAPE_DU];
    const lmx_lora_pair *du_pair[TAPE_DU];
} tape_var;

typedef struct tape_rec {
    int op;
    int out, in[3];              /* var ids; -1: none (a constant) */
    int keep[4];                 /* keeps of what the backward op reads; -1: none */
    lmx_tensor own;              /* lora with dropout: the dropped input, which backward reads (owned) */
    lmx_tensor lse;              /* attention: the log-sum-exp the forward wrote [B, H, T] (owned), or none */
    lmx_tensor xa;               /* lora: x A^T [B*T, r] the forward wrote (owned: lora_keep), or none */
    const lmx_tensor *w;         /* rmsnorm / matmul weight (the model's) */
    int rows, n, M, nh, hd, R;
    int64_t count;
    float eps, one, cap;
    float drop;                  /* lora: dropout on the input (own is the dropped input) */
    uint64_t seed;               /* lora: its mask's seed */
    lmx_act act;
    lmx_rope rope;
    lmx_batch bt;                /* n_past / n_new point into ints */
    int *ints;                   /* owned: batch n_past[B], n_new[B], windows[B]; gather rows[R] */
    const lmx_lora_pair **pairs; /* owned [B] */
    lmx_attn_args attn;          /* H, Hk, D, scale, softcap (no pointers: records move) */
} tape_rec;

typedef struct tape_keep {
    const void *src;             /* the buffer that held the value when it was kept (NULL: a redo) */
    lmx_dtype dtype;             /* src's values: f32, or bf16 (lmx_model.mlp16's gate and up) */
    int64_t rows, cols;          /* its first rows * cols values */
    int var;                     /* the version kept (-1: a buffer the tape never saw written) */
    int refs;                    /* records reading it; 0: dropped */
    lmx_tensor copy;             /* data NULL while src still holds the value, or a redo not made yet */
    /* a redo: the value is not kept but computed again when backward first reads it, by the op that
     * made it (T_GLU or T_RMSNORM, with that record's settings) from the keeps its record reads */
    int redo, from[2];           /* redo 0: none; from: keep ids (-1: none), each holding a reference */
    lmx_act act;
    const lmx_tensor *w;
    float eps, one;
} tape_keep;

typedef struct tape_watch {
    const void *a;               /* the pair's a.data */
    lmx_tensor *da, *db;
} tape_watch;

/* A LoRA expand not added yet (lmx_lora_term): it waits for the op that reads y next (a GLU, the residual
 * add), which adds it in its own pass; any other op adds it first (tape_settle). */
typedef struct tape_term {
    void *y;                     /* the projection's output [rows, N] (N: pair's b [N, r]) */
    lmx_dtype dtype;             /* y's: f32, or bf16 (lmx_model.mlp16: only a GLU takes its term) */
    lmx_tensor xa;               /* the shrink x A^T [rows, r] (its record owns it) */
    const lmx_lora_pair *pair;   /* one pair for every row */
} tape_term;
#define TAPE_TERMS 3             /* q, k and v wait together */
/* An op recorded but not run yet: a frozen matmul, then its LoRA expand, then the residual add of its
 * output (with the expand, where it waited as a term).  They run when the tape's next op does, before
 * it; only the LoRA record and the add of the matmul's output pass them by, and lmx_tape_end_forward
 * drops what no keep reads: a checkpointed layer run again for backward leaves its last projection and
 * residual add unrun. */
typedef struct tape_lazy {
    int op;                      /* T_MATMUL: out = x w^T + bias; T_LORA: the lora op on out; T_ADD: out += x
                                  * (+ term) */
    lmx_tensor out, x;           /* copies of the op's tensors (x: the input it reads) */
    const lmx_tensor *w, *bias;  /* matmul: the model's */
    int M, keep;                 /* matmul: rows; the keep id of x it holds a reference on (-1: none) */
    int B, T;                    /* lora: the batch */
    const lmx_lora_pair **pairs; /* lora: its record's */
    int64_t n;                   /* add: elements */
    tape_term term;              /* add: the expand taken (pair NULL: none) */
} tape_lazy;
#define TAPE_LAZY 3              /* a matmul, its LoRA and its add */
typedef struct tape_buf {
    const void *data;
    int var;
} tape_buf;

struct lmx_tape {
    lmx_backend base;            /* first: the recording backend */
    lmx_backend_ops ops;
    lmx_backend *in;
    const lmx_backward_ops *bwd;
    tape_var *vars;
    int n_vars, cap_vars;
    tape_buf *bufs;
    int n_bufs, cap_bufs;
    tape_rec *recs;
    int n_recs, cap_recs;
    tape_watch *watches;
    int n_watches, cap_watches;
    tape_keep *keeps;
    int n_keeps, cap_keeps;
    int shared;                  /* keep id + 1 of the input last handed to matmul / lora as its copy (0: none) */
    double *prof;                /* non-NULL: seconds of each record kind's backward, waited for */
    double *prof_fwd;            /* non-NULL: seconds of each kind's recorded forward op (savings included) */
    tape_term terms[TAPE_TERMS]; /* expands waiting, oldest first */
    int n_terms;
    tape_lazy lazy[TAPE_LAZY];   /* ops not run yet, oldest first */
    int n_lazy;
    double lazy_s;               /* with prof_fwd: seconds of ops left unrun that ran since the op began */
    lmx_tape_replay rp;          /* lmx_tape_set_replay (att, resid NULL: taken, or none) */
    const void *absent[3];       /* buffers whose f32 value is not there: replay's input and its norm's output,
                                  * a GLU's output written as its bf16 keep alone; ops that read them fail
                                  * (tape.c unreadable) until an op writes them (tape_var_new) */
    int keep_glu;                /* lmx_tape_set_keep_glu */
    int glu_out16;               /* lmx_tape_set_glu_out16 */
    float drop_p;                /* LoRA dropout on trained pairs' inputs (0: none) */
    uint64_t drop_seed;
};

#define TAPE(be) ((lmx_tape *)(be))

/* inner's error, as the tape's */
static inline lmx_status pass(lmx_tape *t, lmx_status st) {
    if (st) lmx_err_set(&t->base.err, st, "%s", t->in->err.msg);
    return st;
}
static inline lmx_status nomem(lmx_tape *t) { return lmx_err_set(&t->base.err, LMX_ERR_NOMEM, "tape: out of memory"); }

/* With t->prof or prof_fwd: wait for inner (a read waits for every op before it); the seconds since *t0 */
static inline double prof_lap(lmx_tape *t, const lmx_tensor *x, double *t0) {
    float v;
    t->in->ops->read(t->in, x, 0, &v, sizeof v);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    const double now = ts.tv_sec + ts.tv_nsec * 1e-9, d = now - *t0;
    *t0 = now;
    return d;
}

/* x allocated on the inner backend for an op that writes it whole (lmx_backend_alloc_raw) */
static inline lmx_status tape_alloc(lmx_tape *t, lmx_tensor *x) {
    return lmx_backend_alloc_raw(t->in, x);
}

/* ---- vars, keeps, watches ----------------------------------------------------------------------- */

static inline int var_of(const lmx_tape *t, const void *data) {
    for (int i = t->n_bufs - 1; i >= 0; i--)
        if (t->bufs[i].data == data) return t->bufs[i].var;
    return -1;
}
static inline int requires(const lmx_tape *t, int v) { return v >= 0 && t->vars[v].requires; }

/* The value keep id holds, as a tensor to read (its copy, or the buffer that still holds it; data NULL:
 * lost, its copy failed). */
static inline lmx_tensor kept(const lmx_tape *t, int id) {
    const tape_keep *k = &t->keeps[id];
    if (k->copy.data) return k->copy;
    return (lmx_tensor){.dtype = k->dtype, .ndim = 2, .shape = {k->rows, k->cols}, .data = (void *)k->src};
}

static inline const tape_watch *watch_of(const lmx_tape *t, const lmx_lora_pair *p) {
    for (int i = 0; p && i < t->n_watches; i++)
        if (t->watches[i].a == p->a.data) return &t->watches[i];
    return NULL;
}

/* The record before record i that makes var v (-1: none). */
static inline int maker_of(const lmx_tape *t, int i, int v) {
    for (int j = i - 1; j >= 0; j--)
        if (t->recs[j].out == v) return j;
    return -1;
}

/* var v's gradient lives in bf16 alone */
static inline int only16(const tape_var *v) { return !v->grad.data && v->grad16.data; }

/* var v's gradient is about to change: its bf16 copy is stale */
static inline void drop16(lmx_tape *t, int v) {
    if (t->vars[v].grad16.data) t->in->ops->release(t->in, &t->vars[v].grad16);
}

/* var v's waiting LoRA input-gradient terms released (added elsewhere, or not wanted) */
static inline void drop_du(lmx_tape *t, int v) {
    tape_var *x = &t->vars[v];
    for (int k = 0; k < x->n_du; k++) t->in->ops->release(t->in, &x->du[k]);
    x->n_du = 0;
}

/* ---- vars, keeps, records (tape_keep.c; each function's comment there) -------------------------- */
lmx_status tape_grow(void **p, int *cap, int need, size_t size);
int tape_var_new(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int req);
lmx_status tape_save(lmx_tape *t, int *id, const lmx_tensor *x, int64_t rows, int64_t cols);
lmx_status tape_guard(lmx_tape *t, const void *data);
int tape_copied(const lmx_tape *t, const void *data, int64_t rows, int64_t cols);
/* drop a reference to keep id: its copy (and a redo's inputs) released with the last */
void tape_unkeep(lmx_tape *t, int id);
int tape_redo_input(lmx_tape *t, int *id, int vx, int64_t rows, int64_t cols);
void tape_set_shared(lmx_tape *t, int id);
const lmx_tensor *tape_shared_input(lmx_tape *t, const lmx_tensor *x, int64_t rows, int64_t cols);
lmx_tensor tape_keep_room(lmx_tape *t, int64_t rows, int64_t cols);
int tape_keep_made(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int var, lmx_tensor *copy);
void tape_hold_shared(lmx_tape *t, const void *data, int64_t rows, int64_t cols, int var, lmx_tensor *copy);
tape_rec *tape_rec_new(lmx_tape *t, int op);
/* release record r's keeps and arrays */
void tape_rec_free(lmx_tape *t, tape_rec *r);

/* ---- work left for later (tape_wait.c) ---------------------------------------------------------- */

/* The ops left unrun (tape_lazy), then the waiting LoRA expands of buffer data (NULL: all of them),
 * added now */
lmx_status tape_settle(lmx_tape *t, const void *data);
/* buffer data's waiting terms alone (NULL: every one) added now */
lmx_status tape_settle_terms(lmx_tape *t, const void *data);
/* every waiting term but those of buffers a and b (NULL: none) added now */
lmx_status tape_settle_others(lmx_tape *t, const void *a, const void *b);
/* waiting term i added to its buffer now */
lmx_status tape_settle_at(lmx_tape *t, int i);
/* the waiting term of buffer data (-1: none) */
int tape_term_index(const lmx_tape *t, const void *data);
/* term i off the waiting list, as the op that takes it reads it (d: room for the term's data) */
lmx_lora_term tape_term_take(lmx_tape *t, int i, tape_term *d);
/* No keep reads buffer data's present value from the buffer itself (every such keep has its copy) */
int tape_unkept(const lmx_tape *t, const void *data);
/* every op left unrun, run now (run 1) or dropped (run 0), oldest first */
lmx_status tape_lazy_end(lmx_tape *t, int run);
/* The ops left unrun are a matmul into buffer data and its LoRA, with room for one more (else 0) */
int tape_lazy_only_into(const lmx_tape *t, const void *data);
/* An op left unrun that reads xin: where xin is the tape's shared keep, a reference held on it (its id;
 * else -1) */
int tape_lazy_hold(lmx_tape *t, const lmx_tensor *xin);
/* Op z left unrun after the ops waiting; an error (z's reference given back) where TAPE_LAZY wait already */
lmx_status tape_lazy_push(lmx_tape *t, const tape_lazy *z);

#endif
