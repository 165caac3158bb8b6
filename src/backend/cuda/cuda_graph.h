/* cuda_graph.h - the record of a decode step that cuda_graph.cu replays as a CUDA graph, shared with
 * the fusions applied while capturing it (cuda_graph_fuse.cu). */
#ifndef LMX_BACKEND_CUDA_GRAPH_H
#define LMX_BACKEND_CUDA_GRAPH_H

#include <stddef.h>
#include <string.h>

#include "cuda_internal.h"

enum { G_EMBED = 1, G_RMSNORM, G_MATMUL, G_ADD, G_GLU, G_SOFTCAP, G_ROPE, G_ATTENTION, G_KV_APPEND, G_GATHER, G_LORA,
       G_SCALE, G_MOE, G_READ /* read_ahead's announcement */ };
enum { G_OFF = 0, G_REC, G_REPLAY };

/* One op call.  The fields up to kvp are zero-filled before use (g_rec_clear) so that memcmp compares
 * them; of the per-sequence arrays after them only the first g_rec_nseq entries mean anything (zeroed
 * and filled by the op's wrapper), so a record costs its batch, not CUDA_G_MAX, to clear and compare. */
typedef struct g_rec {
    int op, M, B, T, i0, i1, i2, splits, has[4];
    int64_t n;
    float f0, f1;
    lmx_tensor t[4];
    lmx_rope rope;
    const lmx_tensor *experts;        /* G_MOE: the layer's experts [3 E] (t[0..2]: out, x, logits) */
    const float *escale;              /*        their scales [E], or NULL */
    int act;                          /*        the experts' activation (i0..i2: E, K, norm_topk) */
    lmx_kv_layer *kvp[CUDA_G_MAX];
    void *kd[CUDA_G_MAX], *vd[CUDA_G_MAX];
    int cap[CUDA_G_MAX], rot[CUDA_G_MAX], win[CUDA_G_MAX], rows[CUDA_G_MAX];
    lmx_lora_pair lora[CUDA_G_MAX];   /* G_LORA: each sequence's pair (a.data NULL: none) */
} g_rec;

/* Entries of r's per-sequence arrays in use: its rows (gather) or sequences, at most CUDA_G_MAX. */
static inline int g_rec_nseq(const g_rec *r) {
    const int n = r->op == G_GATHER ? r->M : r->B;
    return n < 0 ? 0 : n > CUDA_G_MAX ? CUDA_G_MAX : n;
}
/* The fixed fields zeroed; then the first n entries of every per-sequence array. */
static inline void g_rec_clear(g_rec *r) { memset(r, 0, offsetof(g_rec, kvp)); }
static inline void g_rec_clear_seq(g_rec *r, int n) {
    n = n < 0 ? 0 : n > CUDA_G_MAX ? CUDA_G_MAX : n;
    memset(r->kvp, 0, (size_t)n * sizeof r->kvp[0]);
    memset(r->kd, 0, (size_t)n * sizeof r->kd[0]);
    memset(r->vd, 0, (size_t)n * sizeof r->vd[0]);
    memset(r->cap, 0, (size_t)n * sizeof r->cap[0]);
    memset(r->rot, 0, (size_t)n * sizeof r->rot[0]);
    memset(r->win, 0, (size_t)n * sizeof r->win[0]);
    memset(r->rows, 0, (size_t)n * sizeof r->rows[0]);
    memset(r->lora, 0, (size_t)n * sizeof r->lora[0]);
}
/* The moe op's arguments of record c (G_MOE) on input x (its own, or the norm's input when the norm folds
 * in); recorded only once cuda_moe_takes took it: alike */
static inline lmx_moe_args g_moe_args(g_rec *c, lmx_tensor *x) {
    const lmx_moe_args a = {&c->t[0], x, &c->t[2], c->experts, c->escale, c->M, c->i0, c->i1, c->i2, c->f0,
                            (lmx_act)c->act, 1};
    return a;
}
/* The attention op's arguments of record c (G_ATTENTION) for batch bt and caches kv */
static inline lmx_attn_args g_attn_args(g_rec *c, const lmx_batch *bt, lmx_kv_layer *const *kv) {
    const lmx_attn_args a = {bt, &c->t[0], &c->t[1], &c->t[2], &c->t[3], kv, c->i0, c->i1, c->i2, c->f0, c->f1};
    return a;
}
/* 1 when a and b record the same call (fixed fields and the entries in use). */
static inline int g_rec_same(const g_rec *a, const g_rec *b) {
    if (memcmp(a, b, offsetof(g_rec, kvp))) return 0;
    const size_t n = (size_t)g_rec_nseq(a);
    return !memcmp(a->kvp, b->kvp, n * sizeof a->kvp[0]) && !memcmp(a->kd, b->kd, n * sizeof a->kd[0]) &&
           !memcmp(a->vd, b->vd, n * sizeof a->vd[0]) && !memcmp(a->cap, b->cap, n * sizeof a->cap[0]) &&
           !memcmp(a->rot, b->rot, n * sizeof a->rot[0]) && !memcmp(a->win, b->win, n * sizeof a->win[0]) &&
           !memcmp(a->rows, b->rows, n * sizeof a->rows[0]) && !memcmp(a->lora, b->lora, n * sizeof a->lora[0]);
}
static inline void g_rec_copy(g_rec *dst, const g_rec *src) {
    const size_t n = (size_t)g_rec_nseq(src);
    memcpy(dst, src, offsetof(g_rec, kvp));
    memcpy(dst->kvp, src->kvp, n * sizeof src->kvp[0]);
    memcpy(dst->kd, src->kd, n * sizeof src->kd[0]);
    memcpy(dst->vd, src->vd, n * sizeof src->vd[0]);
    memcpy(dst->cap, src->cap, n * sizeof src->cap[0]);
    memcpy(dst->rot, src->rot, n * sizeof src->rot[0]);
    memcpy(dst->win, src->win, n * sizeof src->win[0]);
    memcpy(dst->rows, src->rows, n * sizeof src->rows[0]);
    memcpy(dst->lora, src->lora, n * sizeof src->lora[0]);
}

typedef struct cuda_graph {
    int mode, pos;
    g_rec *rec;
    unsigned char *skip;     /* [cap_rec]: while capturing, ops already issued inside an earlier fusion */
    int n_rec, cap_rec;
    cudaGraphExec_t exec;    /* NULL: none */
    int dyn[CUDA_DYN_N];     /* this step's values, host copy */
    int have_batch;          /* dyn holds this step's n_past / n_new */
    int in_step;             /* an embedding of table step_table began a step that no flush has ended: an
                                embedding of another table (gemma4's per-layer inputs) belongs to it and
                                must take the same token ids (the step's graph reads them from dyn) */
    const void *step_table;
    int launched;            /* this step's graph is already running (launched early) */
    int failed;              /* capture failed once: stay eager */
    int nofuse;              /* LMX_CUDA_GRAPH=1: graphs without the fusions */
    int pdl;                 /* launch the graph's kernels with programmatic dependent launch */
    int att_fold;            /* one-token q/k norm + RoPE + kv append folded into the attention launch */
    int gemm_pair;           /* two bf16 cuBLAS GEMMs of one shape and input as one batch */
    int rd;                  /* the captured step's G_READ record whose read its launches write into host memory
                                themselves (cuda_read then only waits); -1: none */
    int rd_off;              /* LMX_CUDA_READ_AHEAD=0: announced reads are copied after the step (A/B) */
    /* pointers that the captured graph's batched GEMMs read: written on the host while capturing, copied to
       the device once the capture succeeds (before its first launch) */
    const void **ptab, **ptab_dev;
    int ptab_n;
} cuda_graph;

enum { G_PTAB_CAP = 4096 };
/* n slots of the pointer table (NULL: full, or none) and their device address */
static inline const void **g_ptab_take(cuda_graph *g, int n) {
    if (!g->ptab_dev || g->ptab_n + n > G_PTAB_CAP) return NULL;
    g->ptab_n += n;
    return g->ptab + g->ptab_n - n;
}
static inline const void *const *g_ptab_dev(const cuda_graph *g, const void **slot) {
    return g->ptab_dev + (slot - g->ptab);
}

/* Record r's batch with the step's positions from the host copy of the per-step values */
static inline lmx_batch g_rec_batch(const cuda_graph *g, const g_rec *r) {
    const lmx_batch bt = {r->B, r->T, g->dyn + CUDA_DYN_PAST, g->dyn + CUDA_DYN_NEW};
    return bt;
}
/* Run one recorded op eagerly (or into a capture), its per-step values from the host copy. */
lmx_status cuda_g_exec(cuda_backend *cb, g_rec *r);
/* While capturing: the ops from record i as fused launches; *used = ops consumed (0: none applied). */
lmx_status cuda_g_exec_fused(cuda_backend *cb, int i, int *used);

#endif
