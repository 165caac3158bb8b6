/* cuda_backward.cu - the cuda backend's backward ops (backward.h) and the training loss.
 *
 * Matrix products are cuBLAS.  A frozen weight's input gradient dx += dy W narrows dy to bf16 and runs
 * on the tensor cores with f32 accumulation into dx; f16 and quantized weights are dequantized to bf16
 * a block of rows at a time first (as the forward matmul does; f16 gradients would underflow).  LoRA's
 * five small products run in TF32, as its forward does.  Attention runs on the tensor cores in flash
 * form for head dims 32, 64 and 128 (cuda_flash_bwd.cu); otherwise it recomputes its scores a tile of
 * TQ query rows at a time (never T x T): per tile and head, S = Q K^T and dP = dO V^T ([H, TQ, keys] in
 * scratch, TF32), one kernel turns each row into P and dS, and three more GEMMs add dV += P^T dO,
 * dK += dS^T Q and dQ += dS K.  Elementwise ops are one thread per element; RMSNorm and the loss one block per row.
 * Every op first ends a pending decode-graph step (cuda_graph_flush): the forward ops before it may
 * still be recorded, not issued.  What training keeps of the forward pass (the keep op, the ops that
 * write keeps in their pass, the values made again) is in cuda_keep.cu; the optimizer and dropout in
 * cuda_optim.cu. */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "cuda_attention.h"
#include "cuda_weights.h"

#include "../act_grad.h"

extern "C" {
#include "../backward.h"
}

#define BWD_ATTN_BYTES (256u << 20)   /* S and dP of one query tile, all heads (attention_bwd) */

/* The sum (max: op 1) of v over a block of blockDim.x (a multiple of 32, <= 1024) threads; sh holds 33
 * floats.  Every thread gets the result. */
static __device__ float block_reduce(float v, float *sh, int op) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    v = op ? cuda_warp_max(v) : cuda_warp_sum(v);
    __syncthreads(); /* sh may still be read from a previous reduction */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nw ? sh[lane] : op ? -INFINITY : 0.0f;
        t = op ? cuda_warp_max(t) : cuda_warp_sum(t);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    return sh[32];
}

/* ---- RMSNorm ---------------------------------------------------------------------------------- */

/* y_i = x_i inv g_i with inv = (ss/n + eps)^-1/2: dx_i += inv g_i dy_i - x_i inv^3 (sum_j dy_j g_j x_j) / n
 * (add 0: dx_i = ..., a fresh dx not read) */
template <typename X>
__global__ void k_rmsnorm_bwd(float *dx, const float *dy, const X *x, const void *w, lmx_dtype wt, int n, float eps,
                              float one, int add) {
    __shared__ float sh[33];
    const int64_t off = (int64_t)blockIdx.x * n;
    float ss = 0.0f, dot = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float xi = cuda_ld_f(x + off + i);
        ss += xi * xi;
        dot += dy[off + i] * (cuda_elem(w, wt, i) + one) * xi;
    }
    ss = block_reduce(ss, sh, 0);
    dot = block_reduce(dot, sh, 0);
    const float inv = rsqrtf(ss / n + eps), c = inv * inv * inv * dot / n;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = inv * (cuda_elem(w, wt, i) + one) * dy[off + i] - cuda_ld_f(x + off + i) * c;
        dx[off + i] = add ? dx[off + i] + v : v;
    }
}

/* The same for rows of n = 1024 NV: a thread's NV groups of four values of x and dy stay in registers between
 * the sums and the update (one read of each), loaded as whole groups */
template <int NV, typename X>
__global__ void __launch_bounds__(256) k_rmsnorm_bwd_v(float *dx, const float *dy, const X *x, const void *w, lmx_dtype wt,
                                                       float eps, float one, int add) {
    constexpr int n = 1024 * NV;
    __shared__ float sh[33];
    const int64_t off = (int64_t)blockIdx.x * n;
    float4 xv[NV], dv[NV];
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = 4 * (threadIdx.x + 256 * j);
        xv[j] = cuda_ld4(x + off + i), dv[j] = cuda_ld4(dy + off + i);
        const float xs[4] = {xv[j].x, xv[j].y, xv[j].z, xv[j].w}, ds[4] = {dv[j].x, dv[j].y, dv[j].z, dv[j].w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            ss += xs[e] * xs[e];
            dot += ds[e] * (cuda_elem(w, wt, i + e) + one) * xs[e];
        }
    }
    ss = block_reduce(ss, sh, 0);
    dot = block_reduce(dot, sh, 0);
    const float inv = rsqrtf(ss / n + eps), c = inv * inv * inv * dot / n;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int i = 4 * (threadIdx.x + 256 * j);
        float4 o = add ? cuda_ld4(dx + off + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        o.x += inv * (cuda_elem(w, wt, i) + one) * dv[j].x - xv[j].x * c;
        o.y += inv * (cuda_elem(w, wt, i + 1) + one) * dv[j].y - xv[j].y * c;
        o.z += inv * (cuda_elem(w, wt, i + 2) + one) * dv[j].z - xv[j].z * c;
        o.w += inv * (cuda_elem(w, wt, i + 3) + one) * dv[j].w - xv[j].w * c;
        cuda_st4(dx + off + i, o);
    }
}

/* The same, one warp per row (short rows: the per-head q / k norms, where a block a row idles) */
template <typename X>
__global__ void k_rmsnorm_bwd_warp(float *dx, const float *dy, const X *x, const void *w, lmx_dtype wt, int rows, int n,
                                   float eps, float one, int add) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const int64_t off = (int64_t)row * n;
    float ss = 0.0f, dot = 0.0f;
    for (int i = lane; i < n; i += 32) {
        const float xi = cuda_ld_f(x + off + i);
        ss += xi * xi;
        dot += dy[off + i] * (cuda_elem(w, wt, i) + one) * xi;
    }
    ss = cuda_warp_sum(ss);
    dot = cuda_warp_sum(dot);
    const float inv = rsqrtf(ss / n + eps), c = inv * inv * inv * dot / n;
    for (int i = lane; i < n; i += 32) {
        const float v = inv * (cuda_elem(w, wt, i) + one) * dy[off + i] - cuda_ld_f(x + off + i) * c;
        dx[off + i] = add ? dx[off + i] + v : v;
    }
}

template <typename X>
static void rmsnorm_bwd_launch(cuda_backend *cb, float *dx, const float *dy, const X *x, const lmx_tensor *w, int rows,
                               int n, float eps, float one, int add) {
    if (n <= 256)
        k_rmsnorm_bwd_warp<<<cuda_blocks(rows, 8), 256, 0, cb->stream>>>(dx, dy, x, w->data, w->dtype, rows, n, eps, one,
                                                                         add);
    else if (n % 1024 == 0 && n <= 8192 && cuda_vec4_ok(n, dx, dy, x)) { /* the rows of a hidden state */
        switch (n / 1024) {
#define RMS_BWD_V(k)                                                                                \
    case k: k_rmsnorm_bwd_v<k><<<rows, 256, 0, cb->stream>>>(dx, dy, x, w->data, w->dtype, eps, one, add); break;
            RMS_BWD_V(1) RMS_BWD_V(2) RMS_BWD_V(3) RMS_BWD_V(4) RMS_BWD_V(5) RMS_BWD_V(6) RMS_BWD_V(7) RMS_BWD_V(8)
#undef RMS_BWD_V
        }
    } else
        k_rmsnorm_bwd<<<rows, 256, 0, cb->stream>>>(dx, dy, x, w->data, w->dtype, n, eps, one, add);
}

static lmx_status bwd_rmsnorm(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *x,
                              const lmx_tensor *w, int rows, int n, float eps, float add_one, unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || rows <= 0) return st;
    if (w->q.bits || w->q.ggml_type)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rmsnorm backward with a quantized norm weight");
    const int add = !(fresh & 1);
    if (x->dtype == LMX_DTYPE_BF16)
        rmsnorm_bwd_launch(cb, (float *)dx->data, (const float *)dy->data, (const __nv_bfloat16 *)x->data, w, rows, n,
                           eps, add_one, add);
    else
        rmsnorm_bwd_launch(cb, (float *)dx->data, (const float *)dy->data, (const float *)x->data, w, rows, n, eps,
                           add_one, add);
    return cuda_check_launch(cb, "rmsnorm backward");
}

/* ---- frozen matmul: dx += dy W ------------------------------------------------------------------ */

/* cuBLAS is column-major: a row-major [M, K] is its K x M, so dx^T (K x M) += W^T (K x N) dy^T (N x M). */
static lmx_status bwd_matmul(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *w, int M,
                             unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || M <= 0) return st;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const float one = 1.0f, zero = 0.0f, *beta = fresh & 1 ? &zero : &one; /* dx written, or added to */
    const int quant = w->q.bits || w->q.ggml_type;
    const int dx16 = dx->dtype == LMX_DTYPE_BF16; /* a bf16 dx: written whole by one product of bf16 weights */
    if (dx16 && (!(fresh & 1) || quant || w->dtype != LMX_DTYPE_BF16)) return LMX_ERR_UNSUPPORTED;
    if (!quant && w->dtype == LMX_DTYPE_F32) {
        if (dy->dtype == LMX_DTYPE_BF16) /* the tape's bf16 copy: this product reads f32 */
            return cuda_on_widened(cb, dy, [&](const lmx_tensor *d) { return bwd_matmul(be, dx, d, w, M, fresh); });
        return cuda_blas(cb, cublasSgemm(cb->blas, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &one, (const float *)w->data, K,
                                    (const float *)dy->data, N, beta, (float *)dx->data, K), "matmul backward");
    }
    __nv_bfloat16 *dy16 = (__nv_bfloat16 *)dy->data; /* dy as bf16: the tape's copy, or narrowed here */
    if (dy->dtype != LMX_DTYPE_BF16) {
        dy16 = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)M * N * 2);
        if (!dy16 || (st = cuda_narrow_bf16(cb, dy16, (const float *)dy->data, (int64_t)M * N))) return cb->base.err.status;
    }
    if (!quant && w->dtype == LMX_DTYPE_BF16)
        return cuda_blas(cb, cublasGemmEx(cb->blas, CUBLAS_OP_N, CUBLAS_OP_N, K, M, N, &one, w->data, CUDA_R_16BF, K, dy16,
                                     CUDA_R_16BF, N, beta, dx->data, dx16 ? CUDA_R_16BF : CUDA_R_32F, K,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "matmul backward");
    int64_t block = CUDA_DEQUANT_BYTES / ((int64_t)K * 2);
    block = block < 64 ? 64 : block > N ? N : block;
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_W, (size_t)block * K * 2);
    if (!wb) return cb->base.err.status;
    for (int64_t n0 = 0; n0 < N; n0 += block) { /* dx += dy[:, n0:n0+nb] W[n0:n0+nb, :] */
        const int nb = (int)(N - n0 < block ? N - n0 : block);
        if ((st = cuda_dequant_rows_bf16(cb, w, n0, nb, wb))) return st;
        if ((st = cuda_blas(cb, cublasGemmEx(cb->blas, CUBLAS_OP_N, CUBLAS_OP_N, K, M, nb, &one, wb, CUDA_R_16BF, K,
                                        dy16 + n0, CUDA_R_16BF, N, n0 ? &one : beta, dx->data, CUDA_R_32F, K,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), "matmul backward")))
            return st;
    }
    return LMX_OK;
}

/* ---- elementwise -------------------------------------------------------------------------------- */

/* one value: (dgate, dup) of dy d at gate g, up u */
static __device__ __forceinline__ float2 glu_grad(float d, float g, float u, int act) {
    float a, da; /* act(x) and its derivative */
    lmx_act_grad(g, act == LMX_ACT_SILU, &a, &da);
    return make_float2(d * u * da, d * a);
}

/* fresh (backward.h): bit 0 dg, bit 1 du written, not added to; O bf16: both written (fresh 3).  V values a
 * thread a step: 4 where every pointer is aligned (the same arithmetic), else 1. */
template <int V, typename O, typename D, typename G, typename U>
__global__ void k_glu_bwd(O *dg, O *du, const D *dy, const G *g, const U *u, int64_t n, int act, unsigned fresh) {
    const int64_t step = V * (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = V * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < n; i += step) {
        if constexpr (V == 4) {
            const float4 d = cuda_ld4(dy + i), a = cuda_ld4(g + i), b = cuda_ld4(u + i);
            const float2 r0 = glu_grad(d.x, a.x, b.x, act), r1 = glu_grad(d.y, a.y, b.y, act),
                         r2 = glu_grad(d.z, a.z, b.z, act), r3 = glu_grad(d.w, a.w, b.w, act);
            float4 vg = make_float4(r0.x, r1.x, r2.x, r3.x), vu = make_float4(r0.y, r1.y, r2.y, r3.y);
            if constexpr (sizeof(O) == 4) {
                if (!(fresh & 1)) {
                    const float4 o = cuda_ld4(dg + i);
                    vg = make_float4(o.x + vg.x, o.y + vg.y, o.z + vg.z, o.w + vg.w);
                }
                if (!(fresh & 2)) {
                    const float4 o = cuda_ld4(du + i);
                    vu = make_float4(o.x + vu.x, o.y + vu.y, o.z + vu.z, o.w + vu.w);
                }
            }
            cuda_st4(dg + i, vg);
            cuda_st4(du + i, vu);
        } else {
            const float2 r = glu_grad(cuda_ld_f(dy + i), cuda_ld_f(g + i), cuda_ld_f(u + i), act);
            if constexpr (sizeof(O) == 2) {
                dg[i] = __float2bfloat16(r.x);
                du[i] = __float2bfloat16(r.y);
            } else {
                dg[i] = fresh & 1 ? r.x : dg[i] + r.x;
                du[i] = fresh & 2 ? r.y : du[i] + r.y;
            }
        }
    }
}

template <typename O, typename D, typename G, typename U>
static void glu_bwd_go(cuda_backend *cb, O *dg, O *du, const D *dy, const G *g, const U *u, int64_t n, int act,
                       unsigned fresh) {
    if (cuda_vec4_ok(n, dg, du, dy, g, u))
        k_glu_bwd<4><<<cuda_ew_grid(n / 4), 256, 0, cb->stream>>>(dg, du, dy, g, u, n, act, fresh);
    else
        k_glu_bwd<1><<<cuda_ew_grid(n), 256, 0, cb->stream>>>(dg, du, dy, g, u, n, act, fresh);
}

template <typename O, typename G>
static void glu_bwd_launch(cuda_backend *cb, void *dg, void *du, const lmx_tensor *dy, const G *g, const lmx_tensor *up,
                           int64_t n, lmx_act act, unsigned fresh) {
    const __nv_bfloat16 *u16 = (const __nv_bfloat16 *)up->data, *d16 = (const __nv_bfloat16 *)dy->data;
    const float *uf = (const float *)up->data, *df = (const float *)dy->data;
    if (dy->dtype == LMX_DTYPE_BF16 && up->dtype == LMX_DTYPE_BF16) glu_bwd_go(cb, (O *)dg, (O *)du, d16, g, u16, n, (int)act, fresh);
    else if (dy->dtype == LMX_DTYPE_BF16) glu_bwd_go(cb, (O *)dg, (O *)du, d16, g, uf, n, (int)act, fresh);
    else if (up->dtype == LMX_DTYPE_BF16) glu_bwd_go(cb, (O *)dg, (O *)du, df, g, u16, n, (int)act, fresh);
    else glu_bwd_go(cb, (O *)dg, (O *)du, df, g, uf, n, (int)act, fresh);
}

/* dgate and dup f32, or both bf16 and written whole (the tape's bf16 gradients, backward.h) */
static lmx_status bwd_glu(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                          const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    const int o16 = dgate->dtype == LMX_DTYPE_BF16;
    if (o16 != (dup->dtype == LMX_DTYPE_BF16) || (o16 && fresh != 3))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "glu backward: bf16 gradients are written whole, both of them");
    const __nv_bfloat16 *gh = (const __nv_bfloat16 *)gate->data;
    const float *gf = (const float *)gate->data;
    const int g16 = gate->dtype == LMX_DTYPE_BF16; /* keeps, or f32 */
    if (o16 && g16) glu_bwd_launch<__nv_bfloat16>(cb, dgate->data, dup->data, dy, gh, up, n, act, fresh);
    else if (o16) glu_bwd_launch<__nv_bfloat16>(cb, dgate->data, dup->data, dy, gf, up, n, act, fresh);
    else if (g16) glu_bwd_launch<float>(cb, dgate->data, dup->data, dy, gh, up, n, act, fresh);
    else glu_bwd_launch<float>(cb, dgate->data, dup->data, dy, gf, up, n, act, fresh);
    return cuda_check_launch(cb, "glu backward");
}

template <typename X> __global__ void k_softcap_bwd(float *dx, const float *dy, const X *y, int64_t n, float cap) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float t = cuda_ld_f(y + i) / cap;
        dx[i] += dy[i] * (1.0f - t * t);
    }
}

static lmx_status bwd_softcap(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_tensor *y, int64_t n,
                              float cap) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    if (y->dtype == LMX_DTYPE_BF16)
        k_softcap_bwd<<<cuda_ew_grid(n), 256, 0, cb->stream>>>((float *)dx->data, (const float *)dy->data,
                                                            (const __nv_bfloat16 *)y->data, n, cap);
    else
        k_softcap_bwd<<<cuda_ew_grid(n), 256, 0, cb->stream>>>((float *)dx->data, (const float *)dy->data,
                                                            (const float *)y->data, n, cap);
    return cuda_check_launch(cb, "softcap backward");
}

/* ---- RoPE: dx += R^T dy ---------------------------------------------------------------------------- */

typedef struct rope_bwd_arg {
    int B, T, nh, hd, half, rot, interleaved;
    int add;                 /* f32 dx: added to (1) or written (0, a fresh one) */
    int hpt;                 /* heads per thread (the angle's sin and cos computed once for them) */
    float attn_factor;
    int n_past[CUDA_SEQ_MAX], n_new[CUDA_SEQ_MAX];
    float inv_freq[CUDA_ROPE_MAX];
} rope_bwd_arg;

/* O f32: dx += R^T dy (a.add; else written); O bf16: dx = R^T dy rounded.  Written: every value (padding rows:
 * zeros).  One thread per (row, dim pair, run of hpt heads), and per (row, dim past rot, run) for the
 * pass-through; the angles from cs [B*T][half] (cuda_rope_angles), or computed (cs NULL). */
template <typename O> static __device__ __forceinline__ void rope_put(O *p, float v, int add) {
    if constexpr (sizeof(O) == 2) *p = __float2bfloat16(v);
    else *p = add ? *p + v : v;
}
template <typename O>
__global__ void k_rope_bwd(O *__restrict__ dx, const float *__restrict__ dy, const float2 *__restrict__ cs,
                           const rope_bwd_arg a) {
    const int rest = a.hd - a.rot, per = a.half + rest, runs = (a.nh + a.hpt - 1) / a.hpt;
    const int64_t total = (int64_t)a.B * a.T * runs * per;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(g % per), run = (int)(g / per % runs);
        const int64_t row = g / per / runs;
        const int b = (int)(row / a.T), t = (int)(row % a.T);
        const int h0 = run * a.hpt, h1 = h0 + a.hpt < a.nh ? h0 + a.hpt : a.nh;
        const int64_t off0 = row * a.nh * a.hd;
        const int ia = i >= a.half ? a.rot + i - a.half : a.interleaved ? 2 * i : i; /* past rot: passes through */
        const int ib = a.interleaved ? 2 * i + 1 : i + a.half;
        if (t >= a.n_new[b]) { /* padding: no gradient */
            if (sizeof(O) == 2 || !a.add)
                for (int h = h0; h < h1; h++) {
                    rope_put(dx + off0 + (int64_t)h * a.hd + ia, 0.0f, 0);
                    if (i < a.half) rope_put(dx + off0 + (int64_t)h * a.hd + ib, 0.0f, 0);
                }
            continue;
        }
        if (i >= a.half) {
            for (int h = h0; h < h1; h++)
                rope_put(dx + off0 + (int64_t)h * a.hd + ia, dy[off0 + (int64_t)h * a.hd + ia], a.add);
            continue;
        }
        const float2 cs_i = cuda_rope_angle(cs, row, a.half, i, a.n_past[b] + t, a.inv_freq[i], a.attn_factor);
        const float c = cs_i.x, s = cs_i.y;
        for (int h = h0; h < h1; h += CUDA_ROPE_BATCH) { /* the batch's loads first, all in flight */
            float ya[CUDA_ROPE_BATCH], yb[CUDA_ROPE_BATCH];
#pragma unroll
            for (int k = 0; k < CUDA_ROPE_BATCH; k++)
                if (h + k < h1) {
                    const int64_t off = off0 + (int64_t)(h + k) * a.hd;
                    ya[k] = dy[off + ia], yb[k] = dy[off + ib];
                }
#pragma unroll
            for (int k = 0; k < CUDA_ROPE_BATCH; k++)
                if (h + k < h1) {
                    const int64_t off = off0 + (int64_t)(h + k) * a.hd;
                    rope_put(dx + off + ia, ya[k] * c + yb[k] * s, a.add);
                    rope_put(dx + off + ib, yb[k] * c - ya[k] * s, a.add);
                }
        }
    }
}

/* k_rope_bwd over a table of angles cs [B*T][half] where rot = hd, not interleaved, four-value pieces
 * (cuda_rope_vec_grid: as k_rope_vec) */
template <typename O> static __device__ __forceinline__ void rope_put4(O *p, float4 v, int add) {
    if constexpr (sizeof(O) == 2) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
        *(uint2 *)p = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
    } else {
        if (add) {
            const float4 o = *(const float4 *)p;
            v.x += o.x, v.y += o.y, v.z += o.z, v.w += o.w;
        }
        *(float4 *)p = v;
    }
}
template <typename O>
__global__ void k_rope_bwd_vec(O *__restrict__ dx, const float *__restrict__ dy, const float2 *__restrict__ cs,
                               const rope_bwd_arg a) {
    const int q4 = a.half / 4, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.nh * q4) return;
    const int h = i / q4, j = 4 * (i % q4);
    for (int64_t row = blockIdx.y; row < (int64_t)a.B * a.T; row += gridDim.y) {
        const int64_t off = (row * a.nh + h) * a.hd + j;
        if (row % a.T >= a.n_new[row / a.T]) { /* padding: no gradient */
            if (sizeof(O) == 2 || !a.add)
                rope_put4(dx + off, make_float4(0, 0, 0, 0), 0), rope_put4(dx + off + a.half, make_float4(0, 0, 0, 0), 0);
            continue;
        }
        const float4 ya = __ldg((const float4 *)(dy + off)), yb = __ldg((const float4 *)(dy + off + a.half));
        const float4 c01 = __ldg((const float4 *)(cs + row * a.half + j));
        const float4 c23 = __ldg((const float4 *)(cs + row * a.half + j + 2));
        const float c[4] = {c01.x, c01.z, c23.x, c23.z}, s[4] = {c01.y, c01.w, c23.y, c23.w};
        const float pa[4] = {ya.x, ya.y, ya.z, ya.w}, pb[4] = {yb.x, yb.y, yb.z, yb.w};
        float oa[4], ob[4];
#pragma unroll
        for (int k = 0; k < 4; k++) oa[k] = pa[k] * c[k] + pb[k] * s[k], ob[k] = pb[k] * c[k] - pa[k] * s[k];
        rope_put4(dx + off, make_float4(oa[0], oa[1], oa[2], oa[3]), a.add);
        rope_put4(dx + off + a.half, make_float4(ob[0], ob[1], ob[2], ob[3]), a.add);
    }
}

/* dx f32 (added to, or written where fresh), or bf16 (the tape's bf16 gradient: written whole) */
static lmx_status bwd_rope(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dy, const lmx_batch *bt, int nh, int hd,
                           const lmx_rope *rope, unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st) return st;
    const int half = rope->rot_dim / 2, o16 = dx->dtype == LMX_DTYPE_BF16;
    if (half > CUDA_ROPE_MAX || rope->rot_dim > hd)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rope backward over %d dims", rope->rot_dim);
    const float2 *cs = cuda_rope_angles(cb, bt, rope);
    const int vec = cs && !rope->interleaved && 2 * half == hd && half % 4 == 0 &&
                    !((uintptr_t)dx->data & (o16 ? 7 : 15)) && !((uintptr_t)dy->data & 15);
    rope_bwd_arg a;
    a.T = bt->T, a.nh = nh, a.hd = hd, a.half = half, a.rot = 2 * half, a.interleaved = rope->interleaved;
    a.attn_factor = rope->attn_factor, a.add = !(fresh & 1);
    for (int i = 0; i < half; i++) a.inv_freq[i] = rope->inv_freq[i];
    for (int b0 = 0; b0 < bt->B; b0 += CUDA_SEQ_MAX) {
        a.B = bt->B - b0 < CUDA_SEQ_MAX ? bt->B - b0 : CUDA_SEQ_MAX;
        for (int b = 0; b < a.B; b++) a.n_past[b] = bt->n_past[b0 + b], a.n_new[b] = bt->n_new[b0 + b];
        a.hpt = cuda_rope_heads_per_thread((int64_t)a.B * a.T * half, nh);
        const int64_t off = (int64_t)b0 * bt->T * nh * hd;
        const float2 *csb = cs ? cs + (int64_t)b0 * bt->T * half : NULL;
        if (vec) {
            dim3 block, vg = cuda_rope_vec_grid((int64_t)a.B * a.T, nh, half, &block);
            if (o16)
                k_rope_bwd_vec<<<vg, block, 0, cb->stream>>>((__nv_bfloat16 *)dx->data + off, (const float *)dy->data + off,
                                                             csb, a);
            else k_rope_bwd_vec<<<vg, block, 0, cb->stream>>>((float *)dx->data + off, (const float *)dy->data + off, csb, a);
            if ((st = cuda_check_launch(cb, "rope backward"))) return st;
            continue;
        }
        const unsigned grid = cuda_ew_grid((int64_t)a.B * a.T * ((nh + a.hpt - 1) / a.hpt) * (hd - half));
        if (o16)
            k_rope_bwd<<<grid, 256, 0, cb->stream>>>((__nv_bfloat16 *)dx->data + off, (const float *)dy->data + off, csb, a);
        else k_rope_bwd<<<grid, 256, 0, cb->stream>>>((float *)dx->data + off, (const float *)dy->data + off, csb, a);
        if ((st = cuda_check_launch(cb, "rope backward"))) return st;
    }
    return LMX_OK;
}

/* ---- attention ------------------------------------------------------------------------------------ */

/* Row r (query i0 + r) of head blockIdx.y: S [nk] (scores of keys lo..lo+nk) becomes P, dP becomes
 * dS = scale * P (dP - sum_j P_j dP_j) (times the soft-cap's slope); keys after the query or outside its
 * window give 0.  A block of 256 threads holds the row in registers (PER values each: nk <= 256 PER),
 * so S and dP are read and written once. */
template <int PER>
__global__ void __launch_bounds__(256) k_attn_ds(float *S, float *dP, int tq, int nk, int i0, int lo, int window,
                                                  float scale, float cap) {
    __shared__ float sh[33];
    const int r = blockIdx.x, i = i0 + r;
    const int64_t off = ((int64_t)blockIdx.y * tq + r) * nk;
    float *s = S + off, *dp = dP + off;
    const int jlo = window > 0 && i - window + 1 > lo ? i - window + 1 - lo : 0, jhi = i - lo + 1; /* valid [jlo, jhi) */
    float v[PER], d[PER];
    float mx = -INFINITY;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        const int j = threadIdx.x + e * 256;
        v[e] = -INFINITY, d[e] = 0.0f;
        if (j >= jlo && j < jhi) {
            float x = s[j] * scale;
            if (cap > 0) x = cap * tanhf(x / cap);
            v[e] = x, d[e] = dp[j];
            mx = fmaxf(mx, x);
        }
    }
    mx = block_reduce(mx, sh, 1);
    float sum = 0.0f, dsum = 0.0f;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        const float p = v[e] == -INFINITY ? 0.0f : expf(v[e] - mx);
        sum += p, dsum += p * d[e];
    }
    sum = block_reduce(sum, sh, 0);
    dsum = block_reduce(dsum, sh, 0) / sum;
    const float inv = 1.0f / sum;
#pragma unroll
    for (int e = 0; e < PER; e++) {
        const int j = threadIdx.x + e * 256;
        if (j >= nk) break;
        float p = 0.0f, ds = 0.0f;
        if (v[e] != -INFINITY) {
            p = expf(v[e] - mx) * inv;
            ds = att_ds(p, d[e], dsum, v[e], cap);
        }
        s[j] = p;
        dp[j] = ds * scale;
    }
}

/* k_attn_ds for rows longer than the registers hold: three passes over the row in memory. */
__global__ void k_attn_ds_long(float *S, float *dP, int tq, int nk, int i0, int lo, int window, float scale, float cap) {
    __shared__ float sh[33];
    const int r = blockIdx.x, i = i0 + r;
    const int64_t off = ((int64_t)blockIdx.y * tq + r) * nk;
    float *s = S + off, *dp = dP + off;
    const int jlo = window > 0 && i - window + 1 > lo ? i - window + 1 - lo : 0, jhi = i - lo + 1;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        float v = s[j] * scale;
        if (cap > 0) v = cap * tanhf(v / cap);
        s[j] = v;
        if (j >= jlo && j < jhi) mx = fmaxf(mx, v);
    }
    mx = block_reduce(mx, sh, 1);
    float sum = 0.0f, dsum = 0.0f;
    for (int j = threadIdx.x; j < nk; j += blockDim.x)
        if (j >= jlo && j < jhi) {
            const float e = expf(s[j] - mx);
            sum += e, dsum += e * dp[j];
        }
    sum = block_reduce(sum, sh, 0);
    dsum = block_reduce(dsum, sh, 0) / sum;
    for (int j = threadIdx.x; j < nk; j += blockDim.x) {
        float p = 0.0f, ds = 0.0f;
        if (j >= jlo && j < jhi) {
            p = expf(s[j] - mx) / sum;
            ds = att_ds(p, dp[j], dsum, s[j], cap);
        }
        s[j] = p;
        dp[j] = ds * scale;
    }
}

/* C_g = op(A_g) op(B_g) (+ C_g) for g < n with f32 data, TF32 tensor cores */
static lmx_status gemm_batched(cuda_backend *cb, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                               const float *a, int lda, long long sa, const float *b, int ldb, long long sb, float beta,
                               float *c, int ldc, long long sc, int count) {
    const float one = 1.0f;
    return cuda_blas(cb, cublasGemmStridedBatchedEx(cb->blas, ta, tb, m, n, k, &one, a, CUDA_R_32F, lda, sa, b, CUDA_R_32F,
                                               ldb, sb, &beta, c, CUDA_R_32F, ldc, sc, count,
                                               CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                "attention backward");
}

/* One query tile [i0, i0 + tq) of one sequence (q, k, v, dout, dq, dk, dv at its first row): keys
 * [lo, i0 + tq).  Head h = g * grp + hh reads kv head g; the products are batched over g for each hh,
 * so no two batches of one call add into the same dK / dV rows. */
static lmx_status attn_tile(cuda_backend *cb, const lmx_attn_args *a, const float *q, const float *k, const float *v,
                            const float *dout, float *dq, float *dk, float *dv, int i0, int tq, int lo, int window,
                            float *S, float *dP) {
    const int H = a->H, Hk = a->Hk, D = a->D, grp = H / Hk, nk = i0 + tq - lo;
    const int qs = H * D, ks = Hk * D;
    const long long tile = (long long)tq * nk;
    const float *kt = k + (int64_t)lo * ks, *vt = v + (int64_t)lo * ks;
    const float *qt = q + (int64_t)i0 * qs, *ot = dout + (int64_t)i0 * qs;
    lmx_status st = LMX_OK;
    for (int hh = 0; hh < grp && !st; hh++) { /* S = Q K^T, dP = dO V^T: column-major nk x tq per head */
        st = gemm_batched(cb, CUBLAS_OP_T, CUBLAS_OP_N, nk, tq, D, kt, ks, D, qt + hh * D, qs, (long long)grp * D, 0.0f,
                          S + hh * tile, nk, grp * tile, Hk);
        if (!st)
            st = gemm_batched(cb, CUBLAS_OP_T, CUBLAS_OP_N, nk, tq, D, vt, ks, D, ot + hh * D, qs, (long long)grp * D,
                              0.0f, dP + hh * tile, nk, grp * tile, Hk);
    }
    if (st) return st;
    const dim3 grid(tq, H);
    if (nk <= 256 * 2) k_attn_ds<2><<<grid, 256, 0, cb->stream>>>(S, dP, tq, nk, i0, lo, window, a->scale, a->softcap);
    else if (nk <= 256 * 8) k_attn_ds<8><<<grid, 256, 0, cb->stream>>>(S, dP, tq, nk, i0, lo, window, a->scale, a->softcap);
    else if (nk <= 256 * 32) k_attn_ds<32><<<grid, 256, 0, cb->stream>>>(S, dP, tq, nk, i0, lo, window, a->scale, a->softcap);
    else k_attn_ds_long<<<grid, 256, 0, cb->stream>>>(S, dP, tq, nk, i0, lo, window, a->scale, a->softcap);
    if ((st = cuda_check_launch(cb, "attention backward"))) return st;
    float *dkt = dk + (int64_t)lo * ks, *dvt = dv + (int64_t)lo * ks, *dqt = dq + (int64_t)i0 * qs;
    for (int hh = 0; hh < grp && !st; hh++) {
        /* dV^T (D x nk) += dO^T (D x tq) P (tq x nk); dK likewise from dS and Q; dQ^T += K^T dS^T */
        st = gemm_batched(cb, CUBLAS_OP_N, CUBLAS_OP_T, D, nk, tq, ot + hh * D, qs, (long long)grp * D, S + hh * tile,
                          nk, grp * tile, 1.0f, dvt, ks, D, Hk);
        if (!st)
            st = gemm_batched(cb, CUBLAS_OP_N, CUBLAS_OP_T, D, nk, tq, qt + hh * D, qs, (long long)grp * D,
                              dP + hh * tile, nk, grp * tile, 1.0f, dkt, ks, D, Hk);
        if (!st)
            st = gemm_batched(cb, CUBLAS_OP_N, CUBLAS_OP_N, D, tq, nk, kt, ks, D, dP + hh * tile, nk, grp * tile, 1.0f,
                              dqt + hh * D, qs, (long long)grp * D, Hk);
    }
    return st;
}

static lmx_status bwd_attention(lmx_backend *be, lmx_tensor *dq, lmx_tensor *dk, lmx_tensor *dv, const lmx_tensor *dout,
                                const lmx_attn_args *a, const int *windows, unsigned fresh) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st) return st;
    /* the tensor cores' flash form where it has kernels for the head dim (LMX_CUDA_ATTN_BWD_ROWS, for tests
     * and measurements, forces the tiled form); with the forward's output and log-sum-exp it reads the
     * keeps as they are, and needs no second forward pass */
    const char *env = getenv("LMX_CUDA_ATTN_BWD_ROWS");
    if (a->lse && a->out) {
        if (!env) {
            if ((st = lmx_attention_bwd_check(be, a))) return st;
            st = cuda_flash_attention_bwd(cb, a, windows, (const float *)dout->data, (float *)dq->data,
                                          (float *)dk->data, (float *)dv->data, fresh);
            if (st != LMX_ERR_UNSUPPORTED) return st;
        }
        lmx_attn_args af = *a; /* the forms below recompute them */
        af.lse = NULL, af.out = NULL;
        return bwd_attention(be, dq, dk, dv, dout, &af, windows, fresh);
    }
    if (a->q->dtype != LMX_DTYPE_F32 || a->k->dtype != LMX_DTYPE_F32 || a->v->dtype != LMX_DTYPE_F32) {
        lmx_tensor w[3]; /* bf16 keeps: the kernels read f32 q, k, v */
        memset(w, 0, sizeof w);
        const lmx_tensor *in[3] = {a->q, a->k, a->v};
        for (int i = 0; i < 3 && !st; i++)
            if (in[i]->dtype != LMX_DTYPE_F32 && !(st = cuda_widen(cb, &w[i], in[i]))) in[i] = &w[i];
        lmx_attn_args af = *a;
        af.q = in[0], af.k = in[1], af.v = in[2];
        if (!st) st = bwd_attention(be, dq, dk, dv, dout, &af, windows, fresh);
        for (int i = 0; i < 3; i++)
            if (w[i].data) be->ops->release(be, &w[i]);
        return st;
    }
    const lmx_batch *bt = a->batch;
    const int H = a->H, Hk = a->Hk, D = a->D, T = bt->T;
    if ((st = lmx_attention_bwd_check(be, a))) return st;
    if (!env) {
        st = cuda_flash_attention_bwd(cb, a, windows, (const float *)dout->data, (float *)dq->data, (float *)dk->data,
                                      (float *)dv->data, fresh);
        if (st != LMX_ERR_UNSUPPORTED) return st;
        st = LMX_OK;
    }
    const int64_t qs = (int64_t)H * D, ks = (int64_t)Hk * D;
    if ((st = cuda_attn_fresh_clear(cb, (float *)dq->data, (float *)dk->data, (float *)dv->data, qs, ks, 0,
                                    (int64_t)bt->B * T, fresh))) /* the tiled form adds */
        return st;
    /* query rows per tile: S and dP take 2 x 4 bytes x H x tq x keys */
    int tq = env && atoi(env) > 0 ? atoi(env) : (int)(BWD_ATTN_BYTES / (8 * (int64_t)H * (T > 0 ? T : 1)));
    tq = tq > T ? T : tq < 16 && !env ? 16 : tq > 16 ? tq & ~15 : tq;
    if (tq <= 0) return LMX_OK;
    float *S = (float *)cuda_scratch(cb, CUDA_SCRATCH_BWD, (size_t)2 * H * tq * T * sizeof(float));
    if (!S) return cb->base.err.status;
    float *dP = S + (size_t)H * tq * T;
    for (int b = 0; b < bt->B && !st; b++) {
        const int64_t row = (int64_t)b * T;
        const int n = bt->n_new[b], W = windows ? windows[b] : 0;
        for (int i0 = 0; i0 < n && !st; i0 += tq) {
            const int m = n - i0 < tq ? n - i0 : tq, lo = W > 0 && i0 - W + 1 > 0 ? i0 - W + 1 : 0;
            st = attn_tile(cb, a, (const float *)a->q->data + row * qs, (const float *)a->k->data + row * ks,
                           (const float *)a->v->data + row * ks, (const float *)dout->data + row * qs,
                           (float *)dq->data + row * qs, (float *)dk->data + row * ks, (float *)dv->data + row * ks, i0,
                           m, lo, W, S, dP);
        }
    }
    return st;
}

/* ---- row gather ---------------------------------------------------------------------------------- */

typedef struct rows_arg { int n; int32_t r[CUDA_IDS_MAX]; } rows_arg;

/* dx[rows[r]] += dout[r]: one block row per r (atomic: a row may be gathered twice) */
__global__ void k_gather_bwd(float *dx, const float *dout, const rows_arg a, int64_t n) {
    const float *d = dout + (int64_t)blockIdx.y * n;
    float *o = dx + (int64_t)a.r[blockIdx.y] * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        atomicAdd(o + i, d[i]);
}

static lmx_status bwd_gather_rows(lmx_backend *be, lmx_tensor *dx, const lmx_tensor *dout, const int *rows, int R,
                                  int64_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    rows_arg a;
    for (int r0 = 0; r0 < R && !st; r0 += CUDA_IDS_MAX) {
        a.n = R - r0 < CUDA_IDS_MAX ? R - r0 : CUDA_IDS_MAX;
        for (int i = 0; i < a.n; i++) a.r[i] = rows[r0 + i];
        const unsigned gx = cuda_blocks(n, 256);
        k_gather_bwd<<<dim3(gx < 32 ? gx : 32, a.n), 256, 0, cb->stream>>>((float *)dx->data,
                                                                            (const float *)dout->data + r0 * n, a, n);
        st = cuda_check_launch(cb, "gather backward");
    }
    return st;
}

/* ---- the loss ------------------------------------------------------------------------------------- */

/* One value x into a running max m and sum s of exp(z - m) (m starts at -FLT_MAX, so that no -inf - -inf). */
static __device__ __forceinline__ void xent_acc(float &m, float &s, float x) {
    const float mn = fmaxf(m, x);
    s = s * __expf(m - mn) + __expf(x - mn);
    m = mn;
}

/* One block per row of z [R, V]: loss[r] = w (logsumexp(z) - z[t]); with c != 0, g = c w (softmax(z) - onehot(t)),
 * g either z itself (G float) or a bf16 [R, V] of its own.  The row is read twice: once for its max and sum
 * (online, as flash attention's softmax), once to write.  V4: V a multiple of 4 (and g's rows aligned to four
 * values), four values a thread a step, each into its own running max and sum (four chains of exps in flight
 * instead of one). */
template <int V4, typename G>
__global__ void k_xent(float *z, G *g, const int32_t *tg, const float *wt, int V, float c, float *loss) {
    __shared__ float sh[33];
    const float *zr = z + (int64_t)blockIdx.x * V;
    G *gr = g + (int64_t)blockIdx.x * V;
    const float w = wt[blockIdx.x];
    const int t = tg[blockIdx.x];
    if (w == 0.0f) {
        for (int v = threadIdx.x; c != 0.0f && v < V; v += blockDim.x) gr[v] = (G)0.0f;
        if (threadIdx.x == 0) loss[blockIdx.x] = 0.0f;
        return;
    }
    float m[4] = {-FLT_MAX, -FLT_MAX, -FLT_MAX, -FLT_MAX}, sm[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if constexpr (V4) {
        for (int v = threadIdx.x; v < V / 4; v += blockDim.x) {
            const float4 x = ((const float4 *)zr)[v];
            xent_acc(m[0], sm[0], x.x), xent_acc(m[1], sm[1], x.y), xent_acc(m[2], sm[2], x.z), xent_acc(m[3], sm[3], x.w);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) xent_acc(m[0], sm[0], zr[v]);
    }
    const float mt = fmaxf(fmaxf(m[0], m[1]), fmaxf(m[2], m[3]));
    float st = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; k++) st += sm[k] * __expf(m[k] - mt);
    const float mx = block_reduce(mt, sh, 1);
    const float se = block_reduce(st * __expf(mt - mx), sh, 0);
    const float zt = zr[t];
    __syncthreads(); /* every thread has read z[t] before it is overwritten */
    if (threadIdx.x == 0) loss[blockIdx.x] = w * (logf(se) + mx - zt);
    if (c == 0.0f) return;
    const float cw = c * w, inv = 1.0f / se;
    if constexpr (V4) {
        for (int v = threadIdx.x; v < V / 4; v += blockDim.x) {
            float4 x = ((const float4 *)zr)[v];
            x = make_float4(cw * (__expf(x.x - mx) * inv - (4 * v == t ? 1.0f : 0.0f)),
                            cw * (__expf(x.y - mx) * inv - (4 * v + 1 == t ? 1.0f : 0.0f)),
                            cw * (__expf(x.z - mx) * inv - (4 * v + 2 == t ? 1.0f : 0.0f)),
                            cw * (__expf(x.w - mx) * inv - (4 * v + 3 == t ? 1.0f : 0.0f)));
            cuda_st4(gr + 4 * v, x);
        }
    } else {
        for (int v = threadIdx.x; v < V; v += blockDim.x) gr[v] = (G)(cw * (__expf(zr[v] - mx) * inv - (v == t ? 1.0f : 0.0f)));
    }
}

static lmx_status bwd_xent(lmx_backend *be, lmx_tensor *z, const int32_t *targets, const float *w, int R, int V, double c,
                           double *loss, lmx_tensor *g16) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    *loss = 0;
    if (st || R <= 0) return st;
    if (g16 && (g16->dtype != LMX_DTYPE_BF16 || lmx_tensor_nelem(g16) < (int64_t)R * V || c == 0))
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "loss: the bf16 gradient is not [%d, %d] bf16", R, V);
    const size_t n = (size_t)R;
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_BWD, n * 12);
    float *host = (float *)malloc(n * sizeof(float));
    if (!buf || !host) {
        free(host);
        return buf ? lmx_err_set(&be->err, LMX_ERR_NOMEM, "loss: out of memory") : cb->base.err.status;
    }
    int32_t *dt = (int32_t *)buf;
    float *dw = (float *)(buf + n * 4), *dl = (float *)(buf + n * 8);
    for (size_t i = 0; i < n; i++) host[i] = w ? w[i] : 1.0f;
    cudaError_t e = cudaMemcpyAsync(dt, targets, n * 4, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dw, host, n * 4, cudaMemcpyHostToDevice, cb->stream);
    if (e == cudaSuccess) {
        float *zf = (float *)z->data;
        __nv_bfloat16 *gb = g16 ? (__nv_bfloat16 *)g16->data : NULL;
        const bool v4 = cuda_vec4_ok(V, zf, gb); /* every row aligned */
        if (gb && v4) k_xent<1><<<R, 1024, 0, cb->stream>>>(zf, gb, dt, dw, V, (float)c, dl);
        else if (gb) k_xent<0><<<R, 1024, 0, cb->stream>>>(zf, gb, dt, dw, V, (float)c, dl);
        else if (v4) k_xent<1><<<R, 1024, 0, cb->stream>>>(zf, zf, dt, dw, V, (float)c, dl);
        else k_xent<0><<<R, 1024, 0, cb->stream>>>(zf, zf, dt, dw, V, (float)c, dl);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(host, dl, n * 4, cudaMemcpyDeviceToHost, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
    double sum = 0;
    for (size_t i = 0; e == cudaSuccess && i < n; i++) sum += host[i];
    free(host);
    if (e != cudaSuccess) return cuda_fail(cb, e, "loss");
    *loss = sum;
    return LMX_OK;
}

extern "C" const lmx_backward_ops lmx_cuda_backward = {
    /* .rmsnorm_bwd = */ bwd_rmsnorm,
    /* .matmul_bwd = */ bwd_matmul,
    /* .lora_bwd = */ cuda_bwd_lora,
    /* .glu_bwd = */ bwd_glu,
    /* .softcap_bwd = */ bwd_softcap,
    /* .rope_bwd = */ bwd_rope,
    /* .attention_bwd = */ bwd_attention,
    /* .gather_rows_bwd = */ bwd_gather_rows,
    /* .xent = */ bwd_xent,
    /* .sumsq = */ cuda_bwd_sumsq,
    /* .adamw = */ cuda_bwd_adamw,
    /* .dropout = */ cuda_bwd_dropout,
    /* .keep = */ cuda_bwd_keep,
    /* .keep_dtype = */ cuda_bwd_keep_dtype,
    /* .restore = */ cuda_bwd_restore,
    /* .offload = */ cuda_bwd_offload,
    /* .reload = */ cuda_bwd_reload,
    /* .glu_keep = */ cuda_bwd_glu_keep,
    /* .lora_keep = */ cuda_bwd_lora_keep,
    /* .rmsnorm_keep = */ cuda_bwd_rmsnorm_keep,
    /* .glu_redo = */ cuda_bwd_glu_redo,
    /* .rmsnorm_redo = */ cuda_bwd_rmsnorm_redo,
    /* .lora_add = */ cuda_bwd_lora_add,
    /* .adamw_many = */ cuda_bwd_adamw_many,
    /* .lora_dx = */ cuda_bwd_lora_dx,
    /* .glu_bwd_dx = */ cuda_glu_bwd_dx,
    /* .zero_many = */ cuda_bwd_zero_many,
};
