/* cuda_graph.h - the record of a decode step that cuda_graph.cu replays as a CUDA graph, shared with
 * the fusions applied while capturing it (cuda_graph_fuse.cu). */
#ifndef LMX_BACKEND_CUDA_GRAPH_H
#define LMX_BACKEND_CUDA_GRAPH_H

#include "cuda_internal.h"

enum { G_EMBED = 1, G_RMSNORM, G_MATMUL, G_ADD, G_GLU, G_SOFTCAP, G_ROPE, G_ATTENTION, G_KV_APPEND, G_GATHER, G_LORA, G_SCALE, G_MOE };
enum { G_OFF = 0, G_REC, G_REPLAY };

/* One op call; zero-filled before use so that memcmp compares it. */
typedef struct g_rec {
    int op, M, B, T, i0, i1, i2, splits, has[4];
    int64_t n;
    float f0, f1;
    lmx_tensor t[4];
    lmx_rope rope;
    lmx_kv_layer *kvp[CUDA_G_MAX];
    void *kd[CUDA_G_MAX], *vd[CUDA_G_MAX];
    int cap[CUDA_G_MAX], rot[CUDA_G_MAX], win[CUDA_G_MAX], rows[CUDA_G_MAX];
    lmx_lora_pair lora[CUDA_G_MAX];   /* G_LORA: each sequence's pair (a.data NULL: none) */
    const lmx_tensor *experts;        /* G_MOE: the layer's experts [3 E] (t[0..2]: out, x, logits) */
    const float *escale;              /*        their scales [E], or NULL */
    int act;                          /*        the experts' activation (i0..i2: E, K, norm_topk) */
} g_rec;

typedef struct cuda_graph {
    int mode, pos;
    g_rec *rec;
    unsigned char *skip;     /* [cap_rec]: while capturing, ops already issued inside an earlier fusion */
    int n_rec, cap_rec;
    cudaGraphExec_t exec;    /* NULL: none */
    int dyn[CUDA_DYN_N];     /* this step's values, host copy */
    int have_batch;          /* dyn holds this step's n_past / n_new */
    int launched;            /* this step's graph is already running (launched early) */
    int failed;              /* capture failed once: stay eager */
    int nofuse;              /* LMX_CUDA_GRAPH=1: graphs without the fusions */
    int pdl;                 /* launch the graph's kernels with programmatic dependent launch */
} cuda_graph;

/* Run one recorded op eagerly (or into a capture), its per-step values from the host copy. */
lmx_status cuda_g_exec(cuda_backend *cb, g_rec *r);
/* While capturing: the ops from record i as fused launches; *used = ops consumed (0: none applied). */
lmx_status cuda_g_exec_fused(cuda_backend *cb, int i, int *used);

#endif
