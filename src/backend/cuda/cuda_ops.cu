/* cuda_ops.cu - elementwise ops, RMSNorm, RoPE, row gathers and the embedding lookup on the GPU.
 *
 * All are memory-bound and small next to the matmuls; each is one launch (long index lists are
 * split into launches of CUDA_IDS_MAX).  Activations are f32 [rows, n] row-major. */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

typedef struct ids_arg { int n; int32_t id[CUDA_IDS_MAX]; } ids_arg;

/* ---- elementwise --------------------------------------------------------------------------- */

/* y += x, four values a thread a step where both are 16-byte aligned (V 4), else one */
template <int V> __global__ void k_add(float *y, const float *x, int64_t n) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / V; i += (int64_t)gridDim.x * blockDim.x) {
        if constexpr (V == 4) {
            const float4 a = cuda_ld4(y + 4 * i), b = cuda_ld4(x + 4 * i);
            cuda_st4(y + 4 * i, make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w));
        } else {
            y[i] += x[i];
        }
    }
}

/* o = act(g) u, stored as O (f32; bf16 for the grouped experts' GEMMs, rounded once); g and u f32, or bf16
 * (training's bf16 gate and up: model.h mlp16) */
template <typename O, typename G = float> __global__ void k_glu(O *o, const G *g, const G *u, int64_t n, int act) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        o[i] = O(glu_act((float)g[i], act) * (float)u[i]);
}

__global__ void k_softcap(float *x, int64_t n, float cap) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

lmx_status cuda_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    if (cuda_vec4_ok(n, (const float *)y->data, (const float *)x->data))
        cuda_launch(cb, k_add<4>, cuda_ew_grid(n / 4), 256, 0, (float *)y->data, (const float *)x->data, n);
    else
        cuda_launch(cb, k_add<1>, cuda_ew_grid(n), 256, 0, (float *)y->data, (const float *)x->data, n);
    return cuda_check_launch(cb, "add");
}

lmx_status cuda_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                    lmx_act act) {
    cuda_backend *cb = (cuda_backend *)be;
    cuda_launch(cb, k_glu<float>, cuda_ew_grid(n), 256, 0, (float *)out->data, (const float *)gate->data,
                (const float *)up->data, n, (int)act);
    return cuda_check_launch(cb, "glu");
}

lmx_status cuda_glu_bf16(cuda_backend *cb, __nv_bfloat16 *h, const float *g, const float *u, int64_t n, int act) {
    cuda_launch(cb, k_glu<__nv_bfloat16>, cuda_ew_grid(n), 256, 0, h, g, u, n, act);
    return cuda_check_launch(cb, "glu");
}

lmx_status cuda_glu_of16(cuda_backend *cb, void *out, int o16, const __nv_bfloat16 *g, const __nv_bfloat16 *u, int64_t n,
                         int act) {
    if (o16) cuda_launch(cb, k_glu<__nv_bfloat16, __nv_bfloat16>, cuda_ew_grid(n), 256, 0, (__nv_bfloat16 *)out, g, u, n, act);
    else cuda_launch(cb, k_glu<float, __nv_bfloat16>, cuda_ew_grid(n), 256, 0, (float *)out, g, u, n, act);
    return cuda_check_launch(cb, "glu");
}

lmx_status cuda_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) {
    cuda_backend *cb = (cuda_backend *)be;
    cuda_launch(cb, k_softcap, cuda_ew_grid(n), 256, 0, (float *)x->data, n, cap);
    return cuda_check_launch(cb, "softcap");
}

/* ---- RMSNorm: out[r] = x[r] / rms(x[r]) * (w + add_one)      x, out [rows, n], w [n] ------- */

/* One warp per row (short rows: per-head Q/K norms). */
__global__ void k_rmsnorm_warp(float *out, const float *x, const void *w, lmx_dtype wt, int rows, int n,
                               float eps, float add_one) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= rows) return;
    const float *xr = x + (int64_t)row * n;
    float *orow = out + (int64_t)row * n;
    float ss = 0;
    for (int i = lane; i < n; i += 32) ss += xr[i] * xr[i];
    ss = cuda_warp_sum(ss);
    float inv = rsqrtf(ss / n + eps);
    for (int i = lane; i < n; i += 32) orow[i] = cuda_norm_elem(xr[i], inv, w, wt, i, add_one);
}

/* Rows of n > 256 values, a block of 256 threads per row: thread t sums the squares of the values
 * t, t + 256, ... in that order, then the warps' sums in warp order (the eager op and the decode
 * graph's fused add + norm agree bit for bit).  Up to 256 J values (J_MAX: 8192) a thread holds its
 * values in registers, so every load of the row is in flight at once, and the norm's weights are read
 * before the kernel waits for the one before it; longer rows loop over the row twice.
 * ADD: y += p first (the residual add of a decode graph), and the norm reads the sum.  o16 non-NULL: out
 * also rounded to bf16 into it (training's keep of a matmul's input); out NULL (no ADD): o16 alone. */
#define RMS_J_MAX 32
template <int J, bool ADD, bool FULL = false>
__global__ void __launch_bounds__(256) k_rmsnorm_block(float *__restrict__ out, float *__restrict__ y,
                                                       const float *__restrict__ p, const void *__restrict__ w,
                                                       lmx_dtype wt, int n, float eps, float add_one,
                                                       __nv_bfloat16 *__restrict__ o16) {
    cuda_pdl_trigger();
    __shared__ float part[8];
    const int t = threadIdx.x;
    float *yr = y + (int64_t)blockIdx.x * n, *orow = out ? out + (int64_t)blockIdx.x * n : NULL;
    __nv_bfloat16 *hrow = o16 ? o16 + (int64_t)blockIdx.x * n : NULL;
    const float *pr = ADD ? p + (int64_t)blockIdx.x * n : NULL;
    float ss = 0;
    if constexpr (J > 0) {
        /* FULL: n = 256 J, every value in the row (no clamped indices held: 48 registers, not 86, at J 16);
         * else a value past it is loaded from the row's last (an unconditional load: guarded ones were issued
         * one after another, 8.5 us for 32 rows of 4096) and then counted as 0 */
        auto in = [&](int j) { return FULL || t + 256 * j < n; };
        auto at = [&](int j) { return FULL || t + 256 * j < n ? t + 256 * j : n - 1; };
        float wv[J], v[J];
        cuda_elems<J>(wv, w, wt, t, 256, FULL ? 256 * J : n, add_one);
        cuda_pdl_wait();
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = yr[at(j)];
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = in(j) ? v[j] : 0.0f;
        if constexpr (ADD) {
            float pv[J];
#pragma unroll
            for (int j = 0; j < J; j++) pv[j] = pr[at(j)];
#pragma unroll
            for (int j = 0; j < J; j++) pv[j] = in(j) ? pv[j] : 0.0f;
#pragma unroll
            for (int j = 0; j < J; j++) v[j] += pv[j];
#pragma unroll
            for (int j = 0; j < J; j++)
                if (in(j)) yr[t + 256 * j] = v[j];
        }
#pragma unroll
        for (int j = 0; j < J; j++)
            if (in(j)) ss += v[j] * v[j];
        const float inv = cuda_rms_inv_block(ss, n, eps, part);
#pragma unroll
        for (int j = 0; j < J; j++)
            if (in(j)) {
                const float o = v[j] * inv * wv[j];
                if (orow) orow[t + 256 * j] = o;
                if (hrow) hrow[t + 256 * j] = __float2bfloat16(o);
            }
    } else {
        cuda_pdl_wait();
        for (int i = t; i < n; i += 256) {
            float v = yr[i];
            if constexpr (ADD) {
                v += pr[i];
                yr[i] = v;
            }
            ss += v * v;
        }
        const float inv = cuda_rms_inv_block(ss, n, eps, part);
        for (int i = t; i < n; i += 256) {
            const float o = cuda_norm_elem(yr[i], inv, w, wt, i, add_one);
            if (orow) orow[i] = o;
            if (hrow) hrow[i] = __float2bfloat16(o);
        }
    }
}

/* k_rmsnorm_block's launch for rows of n > 256 (p NULL: no add; y is then only read). */
template <bool ADD>
static void rmsnorm_block_launch(cuda_backend *cb, float *out, float *y, const float *p, const lmx_tensor *w, int rows,
                                 int n, float eps, float add_one, __nv_bfloat16 *o16 = NULL) {
    void (*k)(float *, float *, const float *, const void *, lmx_dtype, int, float, float, __nv_bfloat16 *) =
        n == 256 * 4 ? k_rmsnorm_block<4, ADD, true> : n == 256 * 8 ? k_rmsnorm_block<8, ADD, true>
        : n == 256 * 16 ? k_rmsnorm_block<16, ADD, true> : n == 256 * 32 ? k_rmsnorm_block<32, ADD, true>
        : n <= 256 * 8 ? k_rmsnorm_block<8, ADD> : n <= 256 * 16 ? k_rmsnorm_block<16, ADD>
        : n <= 256 * RMS_J_MAX ? k_rmsnorm_block<RMS_J_MAX, ADD> : k_rmsnorm_block<0, ADD>;
    cuda_launch(cb, k, rows, 256, 0, out, y, p, (const void *)w->data, w->dtype, n, eps, add_one, o16);
}

lmx_status cuda_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                        int n, float eps, float add_one) {
    cuda_backend *cb = (cuda_backend *)be;
    if (w->q.bits || w->q.ggml_type)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rmsnorm with a quantized weight");
    if (rows <= 0) return LMX_OK;
    if (n <= 256)
        cuda_launch(cb, k_rmsnorm_warp, cuda_blocks(rows, 8), 256, 0, (float *)out->data, (const float *)x->data,
                    (const void *)w->data, w->dtype, rows, n, eps, add_one);
    else
        rmsnorm_block_launch<false>(cb, (float *)out->data, (float *)x->data, NULL, w, rows, n, eps, add_one);
    return cuda_check_launch(cb, "rmsnorm");
}

/* The rmsnorm op that also writes out rounded to bf16 into o16 [rows, n] (training's keep of the input of
 * the matmuls that follow; out NULL: only that); rows of n > 256 only. */
lmx_status cuda_rmsnorm_o16(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows, int n,
                            float eps, float add_one, __nv_bfloat16 *o16) {
    cuda_backend *cb = (cuda_backend *)be;
    if (w->q.bits || w->q.ggml_type || n <= 256)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rmsnorm with a bf16 copy of %d values a row", n);
    if (rows <= 0) return LMX_OK;
    rmsnorm_block_launch<false>(cb, out ? (float *)out->data : NULL, (float *)x->data, NULL, w, rows, n, eps, add_one,
                                o16);
    return cuda_check_launch(cb, "rmsnorm");
}

/* y += p, then out = rmsnorm(y) (the residual add and the next norm of a decode graph) as one launch. */
lmx_status cuda_add_rmsnorm(cuda_backend *cb, lmx_tensor *y, const lmx_tensor *p, lmx_tensor *out,
                            const lmx_tensor *w, int rows, int n, float eps, float add_one, __nv_bfloat16 *o16) {
    if (w->q.bits || w->q.ggml_type || n <= 256 || rows <= 0) return LMX_ERR_UNSUPPORTED;
    rmsnorm_block_launch<true>(cb, (float *)out->data, (float *)y->data, (const float *)p->data, w, rows, n, eps, add_one,
                               o16);
    return cuda_check_launch(cb, "add + rmsnorm");
}

/* ---- RoPE ----------------------------------------------------------------------------------- */

typedef struct rope_arg {
    int B, T, nh, hd, half, interleaved;
    int hpt;                 /* heads per thread: the angle's sin and cos computed once for them */
    float attn_factor;
    int n_past[CUDA_SEQ_MAX], n_new[CUDA_SEQ_MAX];
    float inv_freq[CUDA_ROPE_MAX];
    const int *dyn;          /* non-NULL: n_past / n_new from this device array */
} rope_arg;

/* cs [B*T][half] = attn_factor (cos, sin) of each row's angles (rows of this launch's sequences) */
__global__ void k_rope_angles(float2 *cs, const rope_arg a) {
    const int64_t total = (int64_t)a.B * a.T * a.half;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(g % a.half);
        const int64_t row = g / a.half;
        const int pos = a.n_past[row / a.T] + (int)(row % a.T);
        cs[g] = cuda_rope_angle(NULL, row, a.half, i, pos, a.inv_freq[i], a.attn_factor);
    }
}

/* the table's device memory released (stream-ordered) */
static void rope_table_release(cuda_backend *cb) {
    if (cb->rope.cs) {
        cudaFreeAsync(cb->rope.cs, cb->stream);
        lmx_backend_mem(&cb->base, -(int64_t)(cb->rope.cap * sizeof(float2)));
    }
    cb->rope.cs = NULL, cb->rope.cap = 0, cb->rope.valid = 0;
}

void cuda_rope_angles_free(cuda_backend *cb) {
    rope_table_release(cb);
    free(cb->rope.n_past);
    memset(&cb->rope, 0, sizeof cb->rope);
}

const float2 *cuda_rope_angles(cuda_backend *cb, const lmx_batch *bt, const lmx_rope *rope) {
    const int half = rope->rot_dim / 2, B = bt->B, T = bt->T;
    const size_t n = (size_t)B * T * half;
    if (cb->dyn_on || n < 32768 || half > CUDA_ROPE_MAX) return NULL;
    if (cb->rope.valid && cb->rope.B == B && cb->rope.T == T && cb->rope.half == half &&
        cb->rope.attn_factor == rope->attn_factor && !memcmp(cb->rope.inv_freq, rope->inv_freq, half * sizeof(float)) &&
        !memcmp(cb->rope.n_past, bt->n_past, (size_t)B * sizeof(int)))
        return cb->rope.cs;
    cb->rope.valid = 0;
    if (B > cb->rope.np_cap) {
        int *np = (int *)realloc(cb->rope.n_past, (size_t)B * sizeof(int));
        if (!np) return NULL;
        cb->rope.n_past = np, cb->rope.np_cap = B;
    }
    if (n > cb->rope.cap) { /* grown; no room: the kernels compute the angles themselves */
        rope_table_release(cb);
        void *p = NULL;
        if (!lmx_backend_mem_fits(&cb->base, (int64_t)(n * sizeof(float2))) ||
            cudaMallocFromPoolAsync(&p, n * sizeof(float2), cb->pool, cb->stream) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        cb->rope.cs = (float2 *)p, cb->rope.cap = n;
        lmx_backend_mem(&cb->base, (int64_t)(n * sizeof(float2)));
    }
    rope_arg a;
    a.T = T, a.half = half, a.attn_factor = rope->attn_factor;
    for (int i = 0; i < half; i++) a.inv_freq[i] = rope->inv_freq[i];
    for (int b0 = 0; b0 < B; b0 += CUDA_SEQ_MAX) {
        a.B = B - b0 < CUDA_SEQ_MAX ? B - b0 : CUDA_SEQ_MAX;
        for (int b = 0; b < a.B; b++) a.n_past[b] = bt->n_past[b0 + b];
        const int64_t total = (int64_t)a.B * T * half;
        k_rope_angles<<<cuda_ew_grid(total), 256, 0, cb->stream>>>(cb->rope.cs + (size_t)b0 * T * half, a);
        if (cudaGetLastError() != cudaSuccess) return NULL;
    }
    memcpy(cb->rope.n_past, bt->n_past, (size_t)B * sizeof(int));
    memcpy(cb->rope.inv_freq, rope->inv_freq, half * sizeof(float));
    cb->rope.B = B, cb->rope.T = T, cb->rope.half = half, cb->rope.attn_factor = rope->attn_factor;
    cb->rope.valid = 1;
    return cb->rope.cs;
}

/* x [B*T, nh*hd] (x already offset to this launch's first sequence): one thread per (row, i, run of hpt
 * heads); the angles from cs [B*T][half] (cuda_rope_angles), or computed (cs NULL). */
__global__ void k_rope(float *x, const float2 *cs, const rope_arg a) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int runs = (a.nh + a.hpt - 1) / a.hpt;
    const int64_t total = (int64_t)a.B * a.T * runs * a.half;
    for (int64_t g = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; g < total; g += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(g % a.half), run = (int)(g / a.half % runs);
        const int64_t row = g / a.half / runs;
        const int b = (int)(row / a.T), t = (int)(row % a.T);
        const int np = a.dyn ? a.dyn[CUDA_DYN_PAST + b] : a.n_past[b], nn = a.dyn ? a.dyn[CUDA_DYN_NEW + b] : a.n_new[b];
        if (t >= nn) continue;
        const float2 cs_i = cuda_rope_angle(cs, row, a.half, i, np + t, a.inv_freq[i], a.attn_factor);
        const float c = cs_i.x, s = cs_i.y;
        const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
        const int h1 = (run + 1) * a.hpt < a.nh ? (run + 1) * a.hpt : a.nh;
        float *xr = x + row * (int64_t)a.nh * a.hd;
        for (int h = run * a.hpt; h < h1; h += CUDA_ROPE_BATCH) { /* the batch's loads first, all in flight */
            float va[CUDA_ROPE_BATCH], vb[CUDA_ROPE_BATCH];
#pragma unroll
            for (int k = 0; k < CUDA_ROPE_BATCH; k++)
                if (h + k < h1) va[k] = xr[(int64_t)(h + k) * a.hd + ia], vb[k] = xr[(int64_t)(h + k) * a.hd + ib];
#pragma unroll
            for (int k = 0; k < CUDA_ROPE_BATCH; k++)
                if (h + k < h1)
                    cuda_rope_pair(va[k], vb[k], c, s, xr[(int64_t)(h + k) * a.hd + ia],
                                   xr[(int64_t)(h + k) * a.hd + ib]);
        }
    }
}

/* With the angles' table cs [B*T][half] and halves (not interleaved) of four-value pieces: a row of x a block
 * row (grid-stride over y), a thread per (head, four pairs) along it: x's four values at i and i + half, and
 * their angles, one load each.  (A thread per (row, pair) over many heads ran a step's q at 2.6-2.9 TB/s, its
 * (row, pair, run) index costing more than its loads.) */
__global__ void k_rope_vec(float *__restrict__ x, const float2 *__restrict__ cs, const rope_arg a) {
    const int q4 = a.half / 4, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= a.nh * q4) return;
    const int h = i / q4, j = 4 * (i % q4);
    for (int64_t row = blockIdx.y; row < (int64_t)a.B * a.T; row += gridDim.y) {
        if (row % a.T >= a.n_new[row / a.T]) continue;
        float *p = x + (row * a.nh + h) * a.hd + j;
        const float4 u = *(const float4 *)p, v = *(const float4 *)(p + a.half);
        const float4 c01 = __ldg((const float4 *)(cs + row * a.half + j));
        const float4 c23 = __ldg((const float4 *)(cs + row * a.half + j + 2));
        float4 ou, ov;
        cuda_rope_pair(u.x, v.x, c01.x, c01.y, ou.x, ov.x);
        cuda_rope_pair(u.y, v.y, c01.z, c01.w, ou.y, ov.y);
        cuda_rope_pair(u.z, v.z, c23.x, c23.y, ou.z, ov.z);
        cuda_rope_pair(u.w, v.w, c23.z, c23.w, ou.w, ov.w);
        *(float4 *)p = ou, *(float4 *)(p + a.half) = ov;
    }
}

/* rows x nh heads of hd values: the grid of k_rope_vec and k_rope_bwd_vec (a block row a row of x) */
dim3 cuda_rope_vec_grid(int64_t rows, int nh, int half, dim3 *block) {
    const int n = nh * (half / 4), t = n < 256 ? (n + 31) / 32 * 32 : 256;
    *block = dim3((unsigned)t);
    return dim3((unsigned)((n + t - 1) / t), (unsigned)(rows < 65535 ? rows : 65535));
}

lmx_status cuda_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh, int hd,
                     const lmx_rope *rope) {
    cuda_backend *cb = (cuda_backend *)be;
    int half = rope->rot_dim / 2;
    if (half > CUDA_ROPE_MAX || rope->rot_dim > hd)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rope over %d dims", rope->rot_dim);
    if (half == 0) return LMX_OK;
    const float2 *cs = cuda_rope_angles(cb, batch, rope);
    const int vec = cs && !rope->interleaved && half % 4 == 0 && hd % 4 == 0 && !((uintptr_t)x->data & 15);
    rope_arg a;
    a.T = batch->T;
    a.nh = nh;
    a.hd = hd;
    a.half = half;
    a.interleaved = rope->interleaved;
    a.attn_factor = rope->attn_factor;
    a.dyn = cb->dyn_on ? cb->dyn : NULL;
    for (int i = 0; i < half; i++) a.inv_freq[i] = rope->inv_freq[i];
    for (int b0 = 0; b0 < batch->B; b0 += CUDA_SEQ_MAX) {
        a.B = batch->B - b0 < CUDA_SEQ_MAX ? batch->B - b0 : CUDA_SEQ_MAX;
        for (int b = 0; b < a.B; b++) {
            a.n_past[b] = batch->n_past[b0 + b];
            a.n_new[b] = batch->n_new[b0 + b];
        }
        if (vec) {
            dim3 block, grid = cuda_rope_vec_grid((int64_t)a.B * a.T, nh, half, &block);
            k_rope_vec<<<grid, block, 0, cb->stream>>>((float *)x->data + (int64_t)b0 * batch->T * nh * hd,
                                                       cs + (int64_t)b0 * batch->T * half, a);
            lmx_status st = cuda_check_launch(cb, "rope");
            if (st) return st;
            continue;
        }
        a.hpt = cuda_rope_heads_per_thread((int64_t)a.B * a.T * half, nh);
        int64_t total = (int64_t)a.B * a.T * ((nh + a.hpt - 1) / a.hpt) * half;
        float *base = (float *)x->data + (int64_t)b0 * batch->T * nh * hd;
        cuda_launch(cb, k_rope, cuda_ew_grid(total), 256, 0, base, cs ? cs + (int64_t)b0 * batch->T * half : NULL, a);
        lmx_status st = cuda_check_launch(cb, "rope");
        if (st) return st;
    }
    return LMX_OK;
}

/* ---- fused per-head norm + RoPE of q and k (decode graphs) ------------------------------------ */

typedef struct nr_set {
    float *x;
    const void *w;           /* norm weight [hd]; NULL: no norm */
    lmx_dtype wt;
    int nh;
    float eps, add_one;
} nr_set;

typedef struct nr_arg {
    nr_set s[2];
    int rows, T, hd, half, interleaved;
    float attn_factor;
    const int *dyn;          /* n_past / n_new */
    float inv_freq[CUDA_ROPE_MAX];
    cuda_kv_dst kv;          /* kv.v non-NULL: append set 1 (k) and kv.v to these caches */
} nr_arg;

/* One warp per (row, head) of either set: the same arithmetic as k_rmsnorm_warp then k_rope.  What no kernel
 * writes (the norm weight, this step's positions in dyn, and so the rotation's sin and cos) comes before
 * cuda_pdl_wait, in the shadow of the kernel before: after it, one load of the head and its stores. */
#define NR_PER (256 / 32)            /* a lane's values of a head (hd <= 256) */
#define NR_ROT (NR_PER / 2)          /* a lane's rotated pairs (half <= hd / 2) */
__global__ void __launch_bounds__(256) k_norm_rope(const nr_arg a) {
    cuda_pdl_trigger();
    __shared__ float sm[8][256];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int gw = blockIdx.x * 8 + warp, per0 = a.rows * a.s[0].nh;
    const int si = gw < per0 ? 0 : 1, idx = si ? gw - per0 : gw;
#define NR_FIELD(f) (si == 0 ? a.s[0].f : a.s[1].f)
    const int nh = NR_FIELD(nh);
    if (si == 1 && idx >= a.rows * nh) return;
    float *x = NR_FIELD(x);
    const void *w = NR_FIELD(w);
    const lmx_dtype wt = NR_FIELD(wt);
    const float eps = NR_FIELD(eps), add_one = NR_FIELD(add_one);
#undef NR_FIELD
    const int row = idx / nh, h = idx % nh, n = a.hd;
    const int b = row / a.T, t = row % a.T;
    const int np = a.dyn[CUDA_DYN_PAST + b], nn = a.dyn[CUDA_DYN_NEW + b];
    const int rot = t < nn ? 2 * a.half : 0;
    float wv[NR_PER], cs[NR_ROT], sn[NR_ROT];
#pragma unroll
    for (int k = 0; k < NR_PER; k++) wv[k] = 0.0f;
    if (w) cuda_elems<NR_PER>(wv, w, wt, lane, 32, n, add_one);
#pragma unroll
    for (int k = 0; k < NR_ROT; k++) {
        const int i = lane + 32 * k;
        if (!rot || i >= a.half) break;
        const float2 r = cuda_rope_angle(NULL, 0, 0, i, np + t, a.inv_freq[i], a.attn_factor);
        cs[k] = r.x, sn[k] = r.y;
    }
    cuda_pdl_wait();
    float *v = x + (int64_t)row * nh * n + (int64_t)h * n;
    float *t_ = sm[warp];
    if (w) {
        float xv[NR_PER], ss = 0;
#pragma unroll
        for (int k = 0; k < NR_PER; k++) {
            xv[k] = lane + 32 * k < n ? v[lane + 32 * k] : 0.0f;
            ss += xv[k] * xv[k];
        }
        ss = cuda_warp_sum(ss);
        float inv = rsqrtf(ss / n + eps);
#pragma unroll
        for (int k = 0; k < NR_PER; k++)
            if (lane + 32 * k < n) t_[lane + 32 * k] = xv[k] * inv * wv[k];
    } else {
        for (int i = lane; i < n; i += 32) t_[i] = v[i];
    }
    __syncwarp();
    /* the kv append of a key head: its rotated values and the value head of the same row */
    __nv_bfloat16 *kc = NULL;
    if (si == 1 && a.kv.v && t < nn) {
        const int64_t off = (int64_t)((np + t) % a.kv.cap[b]) * nh * n + (int64_t)h * n;
        kc = (__nv_bfloat16 *)a.kv.kc[b] + off;
        __nv_bfloat16 *vc = (__nv_bfloat16 *)a.kv.vc[b] + off;
        const float *vr = a.kv.v + (int64_t)row * nh * n + (int64_t)h * n;
        for (int i = lane; i < n; i += 32) vc[i] = __float2bfloat16(vr[i]);
    }
    for (int i = rot + lane; i < n; i += 32) {
        v[i] = t_[i];
        if (kc) kc[i] = __float2bfloat16(t_[i]);
    }
    if (!rot) return;
#pragma unroll
    for (int k = 0; k < NR_ROT; k++) {
        const int i = lane + 32 * k;
        if (i >= a.half) break;
        const int ia = a.interleaved ? 2 * i : i, ib = a.interleaved ? 2 * i + 1 : i + a.half;
        const float x1 = t_[ia], x2 = t_[ib];
        float ya, yb;
        cuda_rope_pair(x1, x2, cs[k], sn[k], ya, yb);
        v[ia] = ya;
        v[ib] = yb;
        if (kc) {
            kc[ia] = __float2bfloat16(ya);
            kc[ib] = __float2bfloat16(yb);
        }
    }
}

lmx_status cuda_norm_rope(cuda_backend *cb, int B, int T, int hd, const lmx_rope *rope, int nset, lmx_tensor *const *x,
                          const int *nh, const lmx_tensor *const *w, const float *eps, const float *add_one,
                          const cuda_kv_dst *app) {
    int half = rope->rot_dim / 2;
    if (!cb->dyn_on || nset < 1 || nset > 2 || hd > 256 || half < 1 || half > CUDA_ROPE_MAX || rope->rot_dim > hd ||
        B > CUDA_G_MAX || (app && nset != 2))
        return LMX_ERR_UNSUPPORTED;
    nr_arg a;
    memset(&a, 0, sizeof a);
    a.rows = B * T;
    a.T = T;
    a.hd = hd;
    a.half = half;
    a.interleaved = rope->interleaved;
    a.attn_factor = rope->attn_factor;
    a.dyn = cb->dyn;
    for (int i = 0; i < half; i++) a.inv_freq[i] = rope->inv_freq[i];
    if (app) a.kv = *app;
    int warps = 0;
    for (int k = 0; k < nset; k++) {
        if (w[k] && (w[k]->q.bits || w[k]->q.ggml_type)) return LMX_ERR_UNSUPPORTED;
        a.s[k].x = (float *)x[k]->data;
        a.s[k].w = w[k] ? w[k]->data : NULL;
        a.s[k].wt = w[k] ? w[k]->dtype : LMX_DTYPE_F32;
        a.s[k].nh = nh[k];
        a.s[k].eps = eps[k];
        a.s[k].add_one = add_one[k];
        warps += a.rows * nh[k];
    }
    cuda_launch(cb, k_norm_rope, cuda_blocks(warps, 8), 256, 0, a);
    return cuda_check_launch(cb, "norm + rope");
}

/* ---- row gathers ----------------------------------------------------------------------------- */

/* out [R, n] = x[rows[r], :] */
__global__ void k_gather(float *out, const float *x, const ids_arg r, int64_t n) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const float *src = x + (int64_t)r.id[blockIdx.y] * n;
    float *dst = out + (int64_t)blockIdx.y * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

lmx_status cuda_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                            int64_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    ids_arg a;
    for (int r0 = 0; r0 < R; r0 += CUDA_IDS_MAX) {
        a.n = R - r0 < CUDA_IDS_MAX ? R - r0 : CUDA_IDS_MAX;
        for (int i = 0; i < a.n; i++) a.id[i] = rows[r0 + i];
        dim3 grid(cuda_blocks(n, 256) < 16 ? cuda_blocks(n, 256) : 16, a.n);
        cuda_launch(cb, k_gather, grid, 256, 0, (float *)out->data + (int64_t)r0 * n, (const float *)x->data, a, n);
        lmx_status st = cuda_check_launch(cb, "gather_rows");
        if (st) return st;
    }
    return LMX_OK;
}

typedef struct scatter_arg { int n; int32_t row[CUDA_IDS_MAX / 2]; float w[CUDA_IDS_MAX / 2]; } scatter_arg;

/* y[row[r]] += w[r] x[r]: blockIdx.y = r (the rows of one launch are distinct) */
__global__ void k_scatter_add(float *y, const float *x, const scatter_arg a, int64_t n) {
    const float w = a.w[blockIdx.y];
    float *o = y + (int64_t)a.row[blockIdx.y] * n;
    const float *s = x + (int64_t)blockIdx.y * n;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        o[i] += w * s[i];
}

lmx_status cuda_scatter_add_rows(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, const int *rows, const float *w,
                                 int R, int64_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb); /* not a graph op: what is recorded runs first */
    cuda_graph_step_off(cb); /* experts routed on the host: their rows and launches vary by step (not this one) */
    scatter_arg a;
    for (int r0 = 0; r0 < R && !st; r0 += CUDA_IDS_MAX / 2) {
        a.n = R - r0 < CUDA_IDS_MAX / 2 ? R - r0 : CUDA_IDS_MAX / 2;
        for (int i = 0; i < a.n; i++) a.row[i] = rows[r0 + i], a.w[i] = w[r0 + i];
        dim3 grid(cuda_blocks(n, 256) < 16 ? cuda_blocks(n, 256) : 16, a.n);
        cuda_launch(cb, k_scatter_add, grid, 256, 0, (float *)y->data, (const float *)x->data + (int64_t)r0 * n, a, n);
        st = cuda_check_launch(cb, "scatter_add_rows");
    }
    return st;
}

/* x[i] = s x[i]; s == 0 writes zeros (whatever x held) */
__global__ void k_scale(float *x, int64_t n, float s) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = s == 0.0f ? 0.0f : s * x[i];
}

lmx_status cuda_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s) {
    cuda_backend *cb = (cuda_backend *)be;
    if (n <= 0) return LMX_OK;
    cuda_launch(cb, k_scale, cuda_ew_grid(n), 256, 0, (float *)x->data, n, s);
    return cuda_check_launch(cb, "scale");
}

