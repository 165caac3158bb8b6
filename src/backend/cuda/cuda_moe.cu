/* cuda_moe.cu - a mixture of experts for a few rows (decode) without the host: the routing, the chosen
 * experts' GEMVs and their weighted sum as four launches that a decode graph can hold (backend.h, moe).
 *
 *   route     k_moe_route: per row, the softmax of its router logits, its K best experts and their
 *             weights (pick, pw [M, K]), as forward.c's route() computes them on the host
 *   gate/up   cuda_moe_gemv: h [M K, F] = act(gate_e x_i) * (up_e x_i) for each (row i, choice) pair
 *   down      cuda_moe_gemv: y [M K, C] = down_e h_p
 *   combine   k_moe_combine: out[i] += sum over the row's choices k (in order) of pw[i, k] y[i K + k]
 *
 * Only the chosen experts' weights are read (each pair reads its expert's; rows that chose the same
 * expert read it again).  GGUF experts take k_moe_ggemv (cuda_ggml.cu) the same way, on x quantized
 * first.  More than CUDA_MOE_PAIRS (row, choice) pairs (prefill) or experts neither GEMV takes: the
 * grouped GEMMs of cuda_moe_grouped.cu.  More than 256 experts: LMX_ERR_UNSUPPORTED, and the model
 * routes on the host (per-expert GEMMs on the rows gathered for each). */
#include "cuda_internal.h"

#define CUDA_MOE_PAIRS 512 /* rows x choices a launch takes (64 rows of 8 choices); more: grouped GEMMs */
typedef struct moe_escale { float s[CUDA_MOE_E_MAX]; int on; } moe_escale;

/* One warp per row: lane l holds logits l, l + 32, ... (NaN as -inf, so that a choice is always an
 * expert); the k-th choice is the largest not taken, the lower index first among equals. */
__global__ void __launch_bounds__(32) k_moe_route(const float *logits, int E, int kused, int norm_topk,
                                                  float scale, const __grid_constant__ moe_escale es, int *pick,
                                                  float *pw) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int i = blockIdx.x, lane = threadIdx.x;
    const float *z = logits + (int64_t)i * E;
    float v[CUDA_MOE_E_MAX / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < CUDA_MOE_E_MAX / 32; j++) {
        const int e = lane + 32 * j;
        const float t = e < E ? *(volatile const float *)(z + e) : -INFINITY; /* after the wait (k_moe_gemv1) */
        v[j] = t != t ? -INFINITY : t;
        mx = fmaxf(mx, v[j]);
    }
    mx = cuda_warp_max(mx);
    const float base = mx == -INFINITY ? 0.0f : mx; /* every logit -inf or NaN: equal weights of 0 / 0 */
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < CUDA_MOE_E_MAX / 32; j++) sum += lane + 32 * j < E ? expf((v[j] - base) * scale) : 0.0f;
    sum = cuda_warp_sum(sum);
    unsigned taken = 0;
    float ksum = 0.0f, p[32];
    int ex[32];
    for (int k = 0; k < kused; k++) {
        float bv = -INFINITY;
        int be = INT_MAX;
#pragma unroll
        for (int j = 0; j < CUDA_MOE_E_MAX / 32; j++) {
            const int e = lane + 32 * j;
            if (e < E && !(taken >> j & 1) && (be == INT_MAX || v[j] > bv)) bv = v[j], be = e;
        }
        for (int o = 16; o > 0; o >>= 1) { /* the larger value, the lower index among equals */
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe != INT_MAX && (be == INT_MAX || ov > bv || (ov == bv && oe < be))) bv = ov, be = oe;
        }
        if (be % 32 == lane) taken |= 1u << (be / 32);
        ex[k] = be;
        p[k] = expf((bv - base) * scale) / sum;
        ksum += p[k];
    }
    if (lane != 0) return;
    for (int k = 0; k < kused; k++) {
        float w = norm_topk ? p[k] / ksum : p[k];
        if (es.on) w *= es.s[ex[k]];
        pick[i * kused + k] = ex[k];
        pw[i * kused + k] = w;
    }
}

/* out[i, c] += sum_k pw[i, k] y[p, c] with p = i K + k, or slot[i K + k] (the grouped path's places):
 * blockIdx.y = i */
__global__ void k_moe_combine(float *out, const float *y, const float *pw, const int *slot, int kused, int64_t C) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int i = blockIdx.y;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < C; c += (int64_t)gridDim.x * blockDim.x) {
        float s = out[(int64_t)i * C + c];
        for (int k = 0; k < kused; k++) {
            const int p = i * kused + k, row = slot ? slot[p] : p;
            s += *(volatile const float *)(pw + p) * __ldcg(y + (int64_t)row * C + c);
        }
        out[(int64_t)i * C + c] = s;
    }
}

lmx_status cuda_moe_combine(cuda_backend *cb, float *out, const float *y, const float *pw, const int *slot, int M,
                            int kused, int64_t C) {
    const dim3 grid(cuda_blocks(C, 256) < 16 ? cuda_blocks(C, 256) : 16, (unsigned)M);
    cuda_launch(cb, k_moe_combine, grid, 256, 0, out, y, pw, slot, kused, C);
    return cuda_check_launch(cb, "moe combine");
}

lmx_status cuda_moe_route(cuda_backend *cb, const lmx_moe_args *a, int i0, int R, int *pick, float *pw) {
    moe_escale es;
    memset(&es, 0, sizeof es);
    if (a->expert_scale) {
        es.on = 1;
        memcpy(es.s, a->expert_scale, (size_t)a->E * sizeof(float));
    }
    cuda_launch(cb, k_moe_route, (unsigned)R, 32, 0, (const float *)a->logits->data + (int64_t)i0 * a->E, a->E, a->K,
                a->norm_topk, a->logit_scale, es, pick, pw);
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

lmx_status cuda_moe(lmx_backend *be, const lmx_moe_args *a) { /* the op's wrapper (w_moe) checked cuda_moe_takes */
    cuda_backend *cb = (cuda_backend *)be;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    /* scratch: pick, pw [CUDA_MOE_PAIRS]; h, u [CUDA_MOE_PAIRS, F]; y [CUDA_MOE_PAIRS, C] (the largest launch's
     * size from the first, so that a decode graph never sees it move) */
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_MOE, (size_t)CUDA_MOE_PAIRS * (2 + 2 * F + C) * sizeof(float));
    if (!buf) return cb->base.err.status;
    int *pick = (int *)buf;
    float *pw = (float *)buf + CUDA_MOE_PAIRS, *h = pw + CUDA_MOE_PAIRS, *u = h + CUDA_MOE_PAIRS * F;
    float *y = u + CUDA_MOE_PAIRS * F;
    const int P = a->M * a->K;
    const float *x = (const float *)a->x->data;
    lmx_status st = cuda_moe_route(cb, a, 0, a->M, pick, pw);
    if (!st && a->experts[0].q.ggml_type) {
        st = cuda_moe_ggemv(cb, a->experts, a->E, 0, pick, P, a->K, x, a->M, h, u, (int)a->act);
        if (!st) st = cuda_moe_ggemv(cb, a->experts, a->E, 1, pick, P, a->K, h, P, y, NULL, 0);
    } else if (!st) {
        st = cuda_moe_gemv(cb, a->experts, a->E, 0, pick, P, a->K, x, h, u, (int)a->act);
        if (!st) st = cuda_moe_gemv(cb, a->experts, a->E, 1, pick, P, a->K, h, y, NULL, 0);
    }
    return st ? st : cuda_moe_combine(cb, (float *)a->out->data, y, pw, NULL, a->M, a->K, C);
}
