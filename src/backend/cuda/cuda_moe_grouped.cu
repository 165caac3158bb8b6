/* cuda_moe_grouped.cu - a mixture of experts for many rows (prefill, large batches): the rows routed on
 * the GPU, grouped by expert, and each projection as one grouped GEMM over the experts that have rows.
 *
 *   route    cuda_moe_route (cuda_moe.cu): pick, pw [R, K] for a round of R rows
 *   count    k_moe_count: rows per expert, read to the host (the GEMMs' sizes: one wait a round)
 *   place    k_moe_place: the round's P = R K (row, choice) pairs ordered by expert and, within an
 *            expert, by row: slot [P] (pair -> its place), src (place -> row); where it fits twice P, each
 *            active expert's places padded to the most any has (the padding reads row 0, and nothing
 *            reads what it writes)
 *   gather   k_moe_gather: xs [places, C] bf16 = x[src]
 *   gate/up  one batched GEMM (padded) or a grouped GEMM: g, u [places, F] f32, expert e's places times
 *            gate_e^T and up_e^T
 *   glu      cuda_glu_bf16: h [places, F] bf16 = act(g) u
 *   down     batched or grouped GEMM: y [places, C] f32 = h down_e^T on each expert's places
 *   combine  cuda_moe_combine (cuda_moe.cu): out[i] += sum over k in order of pw[i, k] y[slot[i K + k]]
 *
 * bf16 experts are read where they are; other types (MLX, GGUF, f16, f32) are dequantized to bf16 a run
 * of experts at a time (at most CUDA_MOE_DEQUANT_BYTES, at least one expert).  GGUF Q4_K experts (Q4_K or
 * Q6_K down) take none of these after the routing: cuda_moe_rows.cu plans the round on the device (counts,
 * places, tiles: no wait for the host) and its launches over the places, a tile of an expert's places a block,
 * read each chosen expert once a round on the integer tensor cores.  Rows come at most MOE_ROUND_PAIRS pairs a
 * round.  Not a graph op (the GEMMs' host waits for the counts; decode graphs take at most CUDA_G_MAX rows). */
#include "cuda_gemv.h"
#include "cuda_moe_mma.h"

#define MOE_ROUND_PAIRS 8192                 /* (row, choice) pairs a round: bounds the scratch */
#define CUDA_MOE_DEQUANT_BYTES (256u << 20)  /* experts dequantized to bf16 at once */

typedef struct moe_offs { int off[CUDA_MOE_E_MAX]; } moe_offs;

/* count[e] = pairs that chose e: a warp per expert */
__global__ void k_moe_count(const int *pick, int P, int E, int *count) {
    const int e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (e >= E) return;
    int n = 0;
    for (int p0 = 0; p0 < P; p0 += 32) {
        const int p = p0 + lane;
        n += __popc(__ballot_sync(0xffffffffu, p < P && pick[p] == e));
    }
    if (lane == 0) count[e] = n;
}

/* Expert e's pairs, in pair order, take places o.off[e] ..: slot[p] = place, src[place] = p / K */
__global__ void k_moe_place(const int *pick, int P, int E, int K, const __grid_constant__ moe_offs o, int *slot,
                            int *src) {
    const int e = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (e >= E) return;
    int base = o.off[e];
    for (int p0 = 0; p0 < P; p0 += 32) {
        const int p = p0 + lane;
        const int mine = p < P && pick[p] == e;
        const unsigned b = __ballot_sync(0xffffffffu, mine);
        if (mine) {
            const int s = base + __popc(b & ((1u << lane) - 1u));
            slot[p] = s;
            src[s] = p / K;
        }
        base += __popc(b);
    }
}

/* xs[s] = bf16(x[src[s]]): blockIdx.y = place */
__global__ void k_moe_gather(__nv_bfloat16 *xs, const float *x, const int *src, int64_t C) {
    const int64_t s = blockIdx.y;
    const float *xi = x + (int64_t)src[s] * C;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x)
        xs[s * C + c] = __float2bfloat16(xi[c]);
}

static int direct(const lmx_tensor *w) { return !w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_BF16; }

int cuda_moe_grouped_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    if (!cuda_moe_routes(cb, a)) return 0;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    for (int e = 0; e < a->E; e++) /* every expert's shapes agree (one GEMM's m and k per projection) */
        for (int j = 0; j < 3; j++) {
            const lmx_tensor *w = &a->experts[3 * e + j];
            if (w->shape[0] != (j == 2 ? C : F) || w->shape[1] != (j == 2 ? F : C)) return 0;
        }
    return 1;
}

/* One grouped GEMM of G <= 2 CUDA_MOE_E_MAX groups (gate and up of every expert): for each group i,
 * C_i [n_i, m] = B_i [n_i, k] A_i [m, k]^T, bf16 in, f32 out, with A_i = p[i], B_i = p[stride + i] and
 * C_i = p[2 stride + i] of the pointer table p: dp on the device for the grouped call, hp (the same) on the
 * host for the loop of single GEMMs that replaces it where cuBLAS has none (LMX_CUDA_MOE_GROUPED=0, or not
 * supported).  batched: every n_i is n_0, and one batched GEMM takes them (dp on the device); cuBLAS's grouped GEMM
 * runs a kernel a group (H200, Qwen3-30B-A3B Q8_0: 384 GEMMs a layer for a prompt of 512, 13.8 ms at 12 layers). */
static lmx_status gemm_grouped(cuda_backend *cb, int G, int m, int k, const int *n, void *const *hp, void *const *dp,
                               int stride, int batched) {
    if (G <= 0) return LMX_OK;
    if (G > 2 * CUDA_MOE_E_MAX) return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "moe: %d GEMM groups", G);
    const float one = 1.0f, zero = 0.0f;
    if (batched) { /* every group's rows alike (padded places): one launch */
        cublasStatus_t s = cublasGemmBatchedEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n[0], k, &one,
                                               (const void *const *)dp, CUDA_R_16BF, k, (const void *const *)dp + stride,
                                               CUDA_R_16BF, k, &zero, dp + 2 * stride, CUDA_R_32F, m, G,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, "moe batched GEMM");
    }
#if CUBLAS_VERSION >= 120500 /* cuBLAS's grouped GEMM came with CUDA 12.5 (Debian's toolkits are older) */
    if (cb->moe_grouped) {
        cublasOperation_t ta[2 * CUDA_MOE_E_MAX], tb[2 * CUDA_MOE_E_MAX];
        int ms[2 * CUDA_MOE_E_MAX], ks[2 * CUDA_MOE_E_MAX], sizes[2 * CUDA_MOE_E_MAX];
        float alpha[2 * CUDA_MOE_E_MAX], beta[2 * CUDA_MOE_E_MAX];
        for (int i = 0; i < G; i++)
            ta[i] = CUBLAS_OP_T, tb[i] = CUBLAS_OP_N, ms[i] = m, ks[i] = k, sizes[i] = 1, alpha[i] = one, beta[i] = zero;
        cublasStatus_t s = cublasGemmGroupedBatchedEx(cb->blas, ta, tb, ms, n, ks, alpha, (const void *const *)dp,
                                                      CUDA_R_16BF, ks, (const void *const *)dp + stride, CUDA_R_16BF, ks,
                                                      beta, dp + 2 * stride, CUDA_R_32F, ms, G, sizes, CUBLAS_COMPUTE_32F);
        if (s == CUBLAS_STATUS_SUCCESS) return LMX_OK;
        if (s != CUBLAS_STATUS_NOT_SUPPORTED) return cuda_blas_fail(cb, s, "moe grouped GEMM");
        cb->moe_grouped = 0; /* this cuBLAS has no grouped GEMM of these types: single GEMMs from now on */
    }
#endif
    for (int i = 0; i < G; i++) {
        cublasStatus_t s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n[i], k, &one, hp[i], CUDA_R_16BF, k,
                                        hp[stride + i], CUDA_R_16BF, k, &zero, hp[2 * stride + i], CUDA_R_32F, m,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (s != CUBLAS_STATUS_SUCCESS) return cuda_blas_fail(cb, s, "moe GEMM");
    }
    return LMX_OK;
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The host's plan of a round: the active experts (count > 0) in order, the rows of each GEMM group and
 * the GEMMs' pointer table (gemm_grouped's layout: A, B, C of the 3 n_act groups).  Active expert j's gate
 * and up GEMMs are groups 2 j and 2 j + 1, its down GEMM group 2 n_act + j. */
typedef struct moe_plan {
    int n_act, act[CUDA_MOE_E_MAX], rows[3 * CUDA_MOE_E_MAX];
    void *ptr[9 * CUDA_MOE_E_MAX];
} moe_plan;

lmx_status cuda_moe_grouped(lmx_backend *be, const lmx_moe_args *a) {
    cuda_backend *cb = (cuda_backend *)be;
    const int E = a->E, K = a->K;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    const int RM = MOE_ROUND_PAIRS / K > 0 ? MOE_ROUND_PAIRS / K : 1; /* rows a round */
    const int PM = RM * K, rows = cuda_moe_rows_takes(cb, a);
    /* Places: the round's pairs by expert (rows: PS = PM); for the GEMMs, each expert's padded to the most any has
     * where that fits PS = 2 PM places (one batched GEMM a projection; else grouped over each expert's own rows).
     * scratch: pick, pw, slot [PM]; src [PS]; count [E]; pointers [3, 3 E] (rows: tiles [4 tiles_max]); xs [PS, C]
     * bf16 (rows: none); g, u [PS, F] f32 (rows: g alone, h's values); h [PS, F] bf16 (rows: none); y [PS, C] f32 */
    const int PS = rows ? PM : 2 * PM;
    const size_t table = rows ? (size_t)4 * cuda_moe_rows_tiles_max(PM, CUDA_MOE_E_MAX) * sizeof(int)
                              : 9 * CUDA_MOE_E_MAX * sizeof(void *);
    const size_t o_pw = align256((size_t)PM * 4), o_slot = o_pw + align256((size_t)PM * 4),
                 o_src = o_slot + align256((size_t)PM * 4), o_cnt = o_src + align256((size_t)PS * 4),
                 o_ptr = o_cnt + align256((size_t)CUDA_MOE_E_MAX * 4), o_xs = o_ptr + align256(table),
                 o_g = o_xs + (rows ? 0 : align256((size_t)PS * C * 2)), o_u = o_g + align256((size_t)PS * F * 4),
                 o_h = o_u + (rows ? 0 : align256((size_t)PS * F * 4)),
                 o_y = o_h + (rows ? 0 : align256((size_t)PS * F * 2)), total = o_y + align256((size_t)PS * C * 4);
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_MOE_ROWS, total);
    if (!buf) return cb->base.err.status;
    int *pick = (int *)buf, *slot = (int *)(buf + o_slot), *src = (int *)(buf + o_src), *count = (int *)(buf + o_cnt);
    float *pw = (float *)(buf + o_pw), *g = (float *)(buf + o_g), *u = (float *)(buf + o_u), *y = (float *)(buf + o_y);
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(buf + o_xs), *h = (__nv_bfloat16 *)(buf + o_h);
    void **dptr = (void **)(buf + o_ptr); /* the plan's pointer table on the device */
    int alldirect = 1;
    for (int e = 0; e < E && alldirect; e++)
        for (int j = 0; j < 3; j++) alldirect &= direct(&a->experts[3 * e + j]);
    const size_t per_expert = (size_t)3 * F * C * 2; /* bf16 gate, up, down */
    int run = alldirect ? E : (int)(CUDA_MOE_DEQUANT_BYTES / per_expert);
    if (run < 1) run = 1;
    if (run > E) run = E;
    __nv_bfloat16 *wq = NULL; /* the dequantized run of experts (after the first round's choice) */
    moe_plan *pl = (moe_plan *)malloc(sizeof *pl);
    if (!pl) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "moe: out of host memory");
    lmx_status st = LMX_OK;
    for (int i0 = 0; i0 < a->M && !st; i0 += RM) {
        const int R = a->M - i0 < RM ? a->M - i0 : RM, P = R * K;
        const float *x = (const float *)a->x->data + (int64_t)i0 * C;
        float *out = (float *)a->out->data + (int64_t)i0 * C;
        if ((st = cuda_moe_route(cb, a, i0, R, pick, pw))) break;
        if (rows) { /* the experts on the integer tensor cores, a tile of places a block, planned on the device */
            int4 *tiles = (int4 *)(buf + o_ptr);
            if ((st = cuda_moe_rows_plan(cb, pick, P, E, K, slot, src, tiles)) ||
                (st = cuda_moe_rows(cb, a, x, R, src, tiles, g, y)) ||
                (st = cuda_moe_combine(cb, out, y, pw, slot, R, K, C)))
                break;
            continue;
        }
        k_moe_count<<<cuda_blocks(E, 8), 256, 0, cb->stream>>>(pick, P, E, count);
        int hc[CUDA_MOE_E_MAX];
        if (cudaMemcpyAsync(hc, count, (size_t)E * sizeof *hc, cudaMemcpyDeviceToHost, cb->stream) != cudaSuccess ||
            cudaStreamSynchronize(cb->stream) != cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe counts");
            break;
        }
        moe_offs o;
        int sum = 0, most = 0;
        pl->n_act = 0;
        for (int e = 0; e < E; e++) {
            o.off[e] = sum, sum += hc[e];
            if (hc[e]) pl->act[pl->n_act++] = e, most = hc[e] > most ? hc[e] : most;
        }
        if (sum != P) {
            st = lmx_err_set(&be->err, LMX_ERR_BACKEND, "moe: %d of %d pairs routed", sum, P);
            break;
        }
        /* padded: active expert j's places j most .. (the padding's src row 0: finite rows nothing reads) */
        const int pad = (int64_t)pl->n_act * most <= PS, places = pad ? pl->n_act * most : P;
        for (int j = 0; j < pl->n_act && pad; j++) o.off[pl->act[j]] = j * most;
        if (pad && cudaMemsetAsync(src, 0, (size_t)places * sizeof *src, cb->stream) != cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe places");
            break;
        }
        k_moe_place<<<cuda_blocks(E, 8), 256, 0, cb->stream>>>(pick, P, E, K, o, slot, src);
        if (!alldirect && !wq && !(wq = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_W, (size_t)run * per_expert))) {
            st = cb->base.err.status;
            break;
        }
        k_moe_gather<<<dim3(cuda_blocks(C, 256) < 8 ? cuda_blocks(C, 256) : 8, (unsigned)places), 256, 0,
                       cb->stream>>>(xs, x, src, C);
        if ((st = cuda_check_launch(cb, "moe placing"))) break;
        /* active expert j is expert q = j % run of its run's dequantized weights */
        const int na = pl->n_act, G = 3 * na;
        void **A = pl->ptr, **Bp = pl->ptr + G, **Cp = pl->ptr + 2 * G;
        for (int j = 0; j < na; j++) {
            const int e = pl->act[j], q = j % run;
            const lmx_tensor *w = &a->experts[3 * e];
            for (int t = 0; t < 3; t++) {
                const int grp = t < 2 ? 2 * j + t : 2 * na + j;
                A[grp] = alldirect ? w[t].data : (void *)(wq + (size_t)q * 3 * F * C + (size_t)t * F * C);
                Bp[grp] = t < 2 ? (void *)(xs + (int64_t)o.off[e] * C) : (void *)(h + (int64_t)o.off[e] * F);
                Cp[grp] = t < 2 ? (void *)((t ? u : g) + (int64_t)o.off[e] * F) : (void *)(y + (int64_t)o.off[e] * C);
            }
            pl->rows[2 * j] = pl->rows[2 * j + 1] = pl->rows[2 * na + j] = pad ? most : hc[e];
        }
        if ((cb->moe_grouped || pad) &&
            cudaMemcpyAsync(dptr, pl->ptr, (size_t)3 * G * sizeof(void *), cudaMemcpyHostToDevice, cb->stream) !=
                cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe GEMM pointers");
            break;
        }
        for (int j0 = 0; j0 < na && !st; j0 += run) {
            const int nr = na - j0 < run ? na - j0 : run;
            for (int t = 0; t < 3 && !alldirect && !st; t++) { /* the run's gates, ups, downs: a launch each */
                const lmx_tensor *ws[CUDA_MOE_E_MAX];
                for (int j = 0; j < nr; j++) ws[j] = &a->experts[3 * pl->act[j0 + j] + t];
                for (int j = 0; j < nr && !st; j += a->alike ? nr : 1) /* (unlike experts: one at a time) */
                    st = cuda_dequant_list_bf16(cb, ws + j, a->alike ? nr : 1, wq + ((size_t)j * 3 + t) * F * C,
                                                (int64_t)3 * F * C);
            }
            if (!st)
                st = gemm_grouped(cb, 2 * nr, (int)F, (int)C, pl->rows + 2 * j0, pl->ptr + 2 * j0, dptr + 2 * j0, G,
                                  pad);
            const int elast = pl->act[j0 + nr - 1];
            const int64_t s0 = o.off[pl->act[j0]], s1 = o.off[elast] + pl->rows[2 * na + j0 + nr - 1]; /* the run's */
            if (!st) st = cuda_glu_bf16(cb, h + s0 * F, g + s0 * F, u + s0 * F, (s1 - s0) * F, (int)a->act);
            if (!st)
                st = gemm_grouped(cb, nr, (int)C, (int)F, pl->rows + 2 * na + j0, pl->ptr + 2 * na + j0,
                                  dptr + 2 * na + j0, G, pad);
        }
        if (st) break;
        st = cuda_moe_combine(cb, out, y, pw, slot, R, K, C);
    }
    free(pl);
    return st;
}
