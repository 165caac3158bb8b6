/* cuda_moe.cu - a mixture of experts for a few rows (decode) without the host: the routing, the chosen
 * experts' GEMVs and their weighted sum as four launches (three for GGUF experts) that a decode graph can
 * hold (backend.h, moe).
 *
 *   route     k_moe_route (cuda_moe_route_row): per row, the softmax of its router logits, its K best
 *             experts and their weights (pick, pw [M, K]), as forward.c's route() computes them on the
 *             host; for GGUF experts, in the launch that quantizes x (k_moe_quant_route)
 *   gate/up   cuda_moe_gemv: h [M K, F] = act(gate_e x_i) * (up_e x_i) for each (row i, choice) pair
 *   down      cuda_moe_gemv: y [M K, C] = down_e h_p; for GGUF experts, cuda_moe_ggemv, which reads pick
 *             before its wait and so loads its first weights while gate/up finishes
 *   combine   k_moe_combine: out[i] += sum over the row's choices k (in order) of pw[i, k] y[i K + k]; for
 *             one row of GGUF experts, in the down projection's launch (gv_moe_sum: the last of the row's
 *             pairs to finish a block of rows adds them, the same bits)
 *
 * Only the chosen experts' weights are read (each pair reads its expert's; rows that chose the same
 * expert read it again).  GGUF experts take k_moe_ggemv (cuda_ggml.cu) the same way, on x quantized
 * first; Q4_K / Q6_K experts of several rows take the integer tensor cores instead (cuda_moe_mma.cu: each
 * chosen expert read once for all its pairs; gate / up from CUDA_MOE_MMA_ROWS_GU rows, down from
 * CUDA_MOE_MMA_ROWS_DOWN); in tiles (as uploaded by default), one row of them and the gate / up of fewer rows take
 * that arithmetic on the CUDA cores (cuda_moe_one, cuda_moe_tiles_gu).  More than CUDA_MOE_PAIRS (row, choice) pairs
 * (prefill) or experts neither GEMV takes: the grouped GEMMs of cuda_moe_grouped.cu.  More than 256 experts: LMX_ERR_UNSUPPORTED, and the model
 * routes on the host (per-expert GEMMs on the rows gathered for each). */
#include "cuda_moe_mma.h"

__global__ void __launch_bounds__(32) k_moe_route(const __grid_constant__ cuda_moe_router rt) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    cuda_moe_route_row(rt, blockIdx.x, threadIdx.x);
}

/* out[i, c] += sum_k pw[i, k] y[p, c] with p = i K + k, or slot[i K + k] (the grouped path's places):
 * blockIdx.y = i */
__global__ void k_moe_combine(float *out, const float *y, const float *pw, const int *slot, int kused, int64_t C) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int i = blockIdx.y;
    const float *yi = slot ? y : y + (int64_t)i * kused * C; /* row i's choices: rows i K + k, or slot[i K + k] */
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x)
        out[(int64_t)i * C + c] =
            cuda_moe_sum(out[(int64_t)i * C + c], yi, pw + i * kused, slot ? slot + i * kused : NULL, kused, C, c);
}

/* k_moe_combine without slots, four columns a thread (C a multiple of 4, 16-byte rows): each thread's loads of a
 * run of eight choices in flight together (k_moe_combine's loop waited on a few at a time: H200, Qwen3-30B-A3B batch
 * 32, 5.7 us a launch), added in choice order as cuda_moe_sum adds them, so the same bits. */
__global__ void __launch_bounds__(128) k_moe_combine4(float *__restrict__ out, const float *__restrict__ y,
                                                      const float *__restrict__ pw, int kused, int64_t C) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int i = blockIdx.y;
    const int64_t c = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * 4;
    if (c >= C) return;
    float4 *o = (float4 *)(out + (int64_t)i * C + c), s = *o;
    const float *yi = y + (int64_t)i * kused * C + c, *wi = pw + (int64_t)i * kused;
    for (int k0 = 0; k0 < kused; k0 += 8) {
        float w[8];
        float4 v[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k0 + k < kused) w[k] = wi[k0 + k], v[k] = *(const float4 *)(yi + (int64_t)(k0 + k) * C);
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k0 + k < kused) s.x += w[k] * v[k].x, s.y += w[k] * v[k].y, s.z += w[k] * v[k].z, s.w += w[k] * v[k].w;
    }
    *o = s;
}

lmx_status cuda_moe_combine(cuda_backend *cb, float *out, const float *y, const float *pw, const int *slot, int M,
                            int kused, int64_t C) {
    if (!slot && C % 4 == 0 && (uintptr_t)out % 16 == 0 && (uintptr_t)y % 16 == 0) {
        cuda_launch(cb, k_moe_combine4, dim3(cuda_blocks(C / 4, 128), (unsigned)M), 128, 0, out, y, pw, kused, C);
        return cuda_check_launch(cb, "moe combine");
    }
    const dim3 grid(cuda_blocks(C, 256) < 16 ? cuda_blocks(C, 256) : 16, (unsigned)M);
    cuda_launch(cb, k_moe_combine, grid, 256, 0, out, y, pw, slot, kused, C);
    return cuda_check_launch(cb, "moe combine");
}

void cuda_moe_router_set(cuda_moe_router *rt, const lmx_moe_args *a, int i0, int *pick, float *pw) {
    memset(rt, 0, sizeof *rt);
    rt->logits = (const float *)a->logits->data + (int64_t)i0 * a->E;
    rt->E = a->E;
    rt->kused = a->K;
    rt->norm_topk = a->norm_topk;
    rt->scale = a->logit_scale;
    rt->pick = pick;
    rt->pw = pw;
    if (a->expert_scale) {
        rt->es_on = 1;
        memcpy(rt->es, a->expert_scale, (size_t)a->E * sizeof(float));
    }
}

lmx_status cuda_moe_route(cuda_backend *cb, const lmx_moe_args *a, int i0, int R, int *pick, float *pw) {
    cuda_moe_router rt;
    cuda_moe_router_set(&rt, a, i0, pick, pw);
    cuda_launch(cb, k_moe_route, (unsigned)R, 32, 0, rt);
    return cuda_check_launch(cb, "moe routing");
}

int cuda_moe_routes(const cuda_backend *cb, const lmx_moe_args *a) {
    return !cb->moe_off && a->M >= 1 && a->K >= 1 && a->K <= 32 && a->K <= a->E && a->E <= CUDA_MOE_E_MAX &&
           a->logits->dtype == LMX_DTYPE_F32 && (a->act == LMX_ACT_SILU || a->act == LMX_ACT_GELU_TANH);
}

int cuda_moe_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    return cuda_moe_routes(cb, a) && a->alike && (int64_t)a->M * a->K <= CUDA_MOE_PAIRS &&
           (cuda_moe_gemv_takes(cb, a->experts, a->E) || cuda_moe_ggemv_takes(a->experts, a->E));
}

lmx_status cuda_moe_normed(lmx_backend *be, const lmx_moe_args *a, const cuda_row_norm *nm) {
    cuda_backend *cb = (cuda_backend *)be; /* the op's wrapper (w_moe) checked cuda_moe_takes */
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    const int gguf = a->experts[0].q.ggml_type != 0;
    if (nm && nm->w && (!gguf || a->M != 1)) return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "moe: a folded norm");
    /* scratch: pick, pw [CUDA_MOE_PAIRS]; h, u [CUDA_MOE_PAIRS, F]; y [CUDA_MOE_PAIRS, C] (the largest launch's
     * size from the first, so that a decode graph never sees it move) */
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_MOE, (size_t)CUDA_MOE_PAIRS * (2 + 2 * F + C) * sizeof(float));
    if (!buf) return cb->base.err.status;
    int *pick = (int *)buf;
    float *pw = (float *)buf + CUDA_MOE_PAIRS, *h = pw + CUDA_MOE_PAIRS, *u = h + CUDA_MOE_PAIRS * F;
    float *y = u + CUDA_MOE_PAIRS * F;
    const int P = a->M * a->K;
    const float *x = (const float *)a->x->data;
    lmx_status st;
    if (gguf && cuda_moe_one_takes(cb, a)) return cuda_moe_one(cb, a, nm, pick, pw, h, y); /* one row from tiles */
    if (gguf) { /* the routing joins x's quantization */
        /* the tensor cores: several rows (never one, so never a folded norm) */
        const int mma_gu = cuda_moe_mma_takes(cb, a, 0), mma_down = cuda_moe_mma_takes(cb, a, 1);
        if (mma_gu) {
            st = cuda_moe_mma_gu(cb, a, pick, pw, h);
        } else if (cuda_moe_tiles_gu_takes(cb, a)) { /* fewer rows of Q4_K in tiles: a pair's expert a block */
            st = cuda_moe_tiles_gu(cb, a, nm, pick, pw, h);
        } else {
            cuda_moe_router rt;
            cuda_moe_router_set(&rt, a, 0, pick, pw);
            st = cuda_moe_ggemv(cb, a->experts, a->E, 0, pick, P, a->K, x, a->M, h, u, (int)a->act, &rt, nm);
        }
        /* one row: the combine joins the down projection (its blocks fit the GPU at once; with more rows, each
         * of many waves of blocks waits on its ticket: H100, Qwen3-30B-A3B's shape, batch 32 4% slower) */
        const gv_moe_sum sum = {(float *)a->out->data, pw, NULL, 0};
        if (!st)
            st = mma_down ? cuda_moe_mma_down(cb, a, pick, h, y)
                          : cuda_moe_ggemv(cb, a->experts, a->E, 1, pick, P, a->K, h, P, y, NULL, 0, NULL, NULL,
                                           a->M == 1 ? &sum : NULL);
        if (st || a->M == 1) return st;
    } else {
        st = cuda_moe_route(cb, a, 0, a->M, pick, pw);
        if (!st) st = cuda_moe_gemv(cb, a->experts, a->E, 0, pick, P, a->K, x, h, u, (int)a->act);
        if (!st) st = cuda_moe_gemv(cb, a->experts, a->E, 1, pick, P, a->K, h, y, NULL, 0);
    }
    return st ? st : cuda_moe_combine(cb, (float *)a->out->data, y, pw, NULL, a->M, a->K, C);
}

lmx_status cuda_moe(lmx_backend *be, const lmx_moe_args *a) { return cuda_moe_normed(be, a, NULL); }
