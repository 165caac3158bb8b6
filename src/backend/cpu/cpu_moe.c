/* cpu_moe.c - a mixture of experts for decode (a few rows, or a batch) on the cpu: the moe op (backend.h).
 *
 * The rows are routed here as the host routes them (lmx_moe_pick, lmx_moe_group), then the pool runs two dispatches:
 *   gate / up  a task an (active expert, slice of MOE_SLICE of its F rows): for each of the expert's pairs, the
 *              slice of g = gate_e x and u = up_e x, then h = act(g) u over the slice, into g
 *   down       a task a slice of the C outputs: for each active expert in ascending order, for each of its pairs,
 *              y = down_e h over the slice, then out[row] += w y over the slice
 * where the host's routing (forward.c, moe_host) runs each chosen expert's gate, up, GLU, down and scatter as ops
 * of their own: 48 pool dispatches a layer for one row of Qwen3-30B-A3B, and x prepared for every matvec.  x is
 * prepared once a row for the gate / up, each pair's h once for the down.  The same matvec kernels on the same
 * prepared x, the GLU and the add elementwise as those ops do them, and each row's experts added in ascending
 * order as scatter_add_rows adds them: for GGUF experts moe_host's bits (test_ggml_quant checks them); dense and
 * MLX ones agree to float32 rounding (not checked bit for bit).
 *
 * Taken for up to MOE_ROWS_MAX rows (decode, batched decode) where every chosen expert has fewer than
 * CPU_MATVEC_ROWS of them (moe_host's matmuls then stream its weights a row of x at a time too; with more it takes
 * the GEMM), and experts stored alike (one type a projection, gate's and up's the same); else LMX_ERR_UNSUPPORTED,
 * nothing written, and the model routes on the host.  LMX_CPU_MOE=0 turns the op off (for A/B). */
#include <string.h>

#include "cpu_backend.h"

#define MOE_SLICE 64     /* rows of a task's slice: a multiple of 16 (the GLU and the add in whole vectors) */
#define MOE_ROWS_MAX 64  /* rows of x at most (a prompt's chunk routes on the host, its experts' GEMMs) */

typedef struct moe_job {
    const cpu_backend *cb;
    const lmx_moe_args *a;
    int n_act;
    const int *act;      /* [n_act] active experts, ascending */
    const int *count;    /* [E]: expert e's pairs are pairs off[e] .. off[e] + count[e] - 1 (lmx_moe_group) */
    const int *off;      /* [E] */
    const int *row;      /* [P] a pair's row of x */
    const float *w;      /* [P] its weight */
    const void *xprep;   /* gate's form of x's rows (NULL: x itself) */
    size_t xprep_bytes;  /* a row's */
    float *g, *u;        /* [P, F] */
    const void *hprep;   /* down's form of each pair's h (NULL: h, in g) */
    size_t hprep_bytes;  /* a pair's */
    float *y;            /* [P, C] */
    int64_t C, F, slices_f;
} moe_job;

static void gate_up_task(void *arg, int task, int thread) {
    const moe_job *j = arg;
    const int a = task / (int)j->slices_f;
    const int64_t n0 = task % j->slices_f * MOE_SLICE, n1 = n0 + MOE_SLICE < j->F ? n0 + MOE_SLICE : j->F;
    const int e = j->act[a];
    const lmx_tensor *ex = &j->a->experts[3 * e];
    const float *x = j->a->x->data;
    for (int p = j->off[e]; p < j->off[e] + j->count[e]; p++) {
        const int i = j->row[p];
        const void *xp = j->xprep ? (const char *)j->xprep + (size_t)i * j->xprep_bytes : NULL;
        float *g = j->g + (int64_t)p * j->F, *u = j->u + (int64_t)p * j->F;
        cpu_matvec_rows(j->cb, &ex[0], x + (int64_t)i * j->C, xp, 1, n0, n1, g, j->F);
        cpu_matvec_rows(j->cb, &ex[1], x + (int64_t)i * j->C, xp, 1, n0, n1, u, j->F);
        cpu_glu_range(j->cb, g + n0, g + n0, u + n0, n1 - n0, j->a->act);
    }
}

static void down_task(void *arg, int task, int thread) {
    const moe_job *j = arg;
    const int64_t n0 = (int64_t)task * MOE_SLICE, n1 = n0 + MOE_SLICE < j->C ? n0 + MOE_SLICE : j->C;
    float *out = j->a->out->data;
    for (int a = 0; a < j->n_act; a++) {
        const int e = j->act[a];
        const lmx_tensor *down = &j->a->experts[3 * e + 2];
        for (int p = j->off[e]; p < j->off[e] + j->count[e]; p++) {
            const void *hp = j->hprep ? (const char *)j->hprep + (size_t)p * j->hprep_bytes : NULL;
            float *y = j->y + (int64_t)p * j->C;
            cpu_matvec_rows(j->cb, down, j->g + (int64_t)p * j->F, hp, 1, n0, n1, y, j->C);
            j->cb->k.axpy_f32(out + (int64_t)j->row[p] * j->C + n0, j->w[p], y + n0, n1 - n0);
        }
    }
}

static int moe_takes(const cpu_backend *cb, const lmx_moe_args *a) {
    const lmx_tensor *ex = a->experts;
    if (!cb->moe_op || a->M > MOE_ROWS_MAX || !a->alike || a->E <= 0 || a->K <= 0 || a->K > a->E ||
        a->x->dtype != LMX_DTYPE_F32 || a->logits->dtype != LMX_DTYPE_F32 || a->out->dtype != LMX_DTYPE_F32)
        return 0;
    const int same = ex[0].dtype == ex[1].dtype && ex[0].q.bits == ex[1].q.bits && ex[0].q.group == ex[1].q.group &&
                     ex[0].q.ggml_type == ex[1].q.ggml_type;
    return same && cpu_matmul_takes(cb, &ex[0]) && cpu_matmul_takes(cb, &ex[2]);
}

lmx_status cpu_moe(lmx_backend *be, const lmx_moe_args *a) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!moe_takes(cb, a)) return LMX_ERR_UNSUPPORTED;
    const int M = a->M, E = a->E, K = a->K, P = M * K;
    const int64_t C = a->experts[0].shape[1], F = a->experts[0].shape[0];
    const size_t xb = cpu_matvec_prep_bytes(cb, &a->experts[0], 1), hb = cpu_matvec_prep_bytes(cb, &a->experts[2], 1);
    /* scratch (floats): g, u [P, F], y [P, C]; the prepared forms; weights [P] a row's, then by expert; ints: picks
     * [P], counts, offsets and act [E] each, rows [P] */
    const size_t fl = (size_t)P * (2 * F + C), pf = ((size_t)M * xb + (size_t)P * hb + 3) / 4,
                 ni = (size_t)2 * P + 3 * (size_t)E;
    float *buf = cpu_scratch(cb, CPU_SCRATCH_MOE, fl + pf + 2 * (size_t)P + ni);
    if (!buf) return lmx_err_prefix(&be->err, "moe");
    float *pw = buf + fl + pf, *w = pw + P;
    int *pick = (int *)(w + P);
    int *count = pick + P, *off = count + E, *act = off + E, *row = act + E;
    const float *z = a->logits->data;
    for (int i = 0; i < M; i++)
        lmx_moe_pick(z + (int64_t)i * E, E, K, a->logit_scale, a->norm_topk, a->expert_scale, pick + i * K, pw + i * K);
    lmx_moe_group(pick, pw, M, K, E, count, off, row, w);
    int n_act = 0; /* the active experts ascending */
    for (int e = 0; e < E; e++) {
        if (count[e] >= CPU_MATVEC_ROWS) return LMX_ERR_UNSUPPORTED; /* that expert's rows: a GEMM, on the host */
        if (count[e]) act[n_act++] = e;
    }
    moe_job job = {.cb = cb, .a = a, .n_act = n_act, .act = act, .count = count, .off = off, .row = row, .w = w,
                   .xprep_bytes = xb, .hprep_bytes = hb, .C = C, .F = F, .slices_f = (F + MOE_SLICE - 1) / MOE_SLICE};
    job.g = buf, job.u = job.g + (int64_t)P * F, job.y = job.u + (int64_t)P * F;
    char *prep = (char *)(job.y + (int64_t)P * C);
    if (xb) cpu_matvec_prep(cb, &a->experts[0], a->x->data, M, prep), job.xprep = prep;
    lmx_pool_run(cb->pool, (int)(n_act * job.slices_f), gate_up_task, &job);
    if (hb) {
        char *hp = prep + (size_t)M * xb;
        for (int p = 0; p < P; p++) cpu_matvec_prep(cb, &a->experts[2], job.g + (int64_t)p * F, 1, hp + (size_t)p * hb);
        job.hprep = hp;
    }
    lmx_pool_run(cb->pool, (int)((C + MOE_SLICE - 1) / MOE_SLICE), down_task, &job);
    return LMX_OK;
}
