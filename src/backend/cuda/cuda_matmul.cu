/* cuda_matmul.cu - out[M, N] = x[M, K] @ w[N, K]^T (+ bias) on the GPU, embedding rows and weight
 * dequantization.
 *
 * Few rows (decode: dense M <= 8, or 32 for bf16 / f16; quantized M <= 32): the GEMV kernels of
 * cuda_gemv.cu and cuda_gemv_tc.cu, which stream each weight byte once per launch; f32 weights of few rows
 * (a mixture of experts' router) for 2..32 rows: cuda_gemv_f32.cu.  Many rows (prefill): cuBLAS tensor-core
 * GEMM with bf16 (f16) operands and f32 output; x is narrowed once, quantized weights are dequantized to bf16
 * in blocks of rows first. */
#include <string.h>

#include "cuda_gemv.h"
#include "cuda_moe_mma.h"

#define QGEMV_MAX_ROWS 32         /* quantized: above this, dequantize + cuBLAS (dense: CUDA_GEMV_ROWS) */

/* ---- embedding rows and dequantization ------------------------------------------------------ */

typedef struct emb_ids { int32_t id[512]; } emb_ids;

__global__ void k_embed(float *out, const wdesc d, const emb_ids ids, const int *dyn, float scale) {
    cuda_pdl_trigger();
    cuda_pdl_wait();
    int64_t n = dyn ? dyn[CUDA_DYN_IDS + blockIdx.y] : ids.id[blockIdx.y];
    float *o = out + (int64_t)blockIdx.y * d.K;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < d.K; k += (int64_t)gridDim.x * blockDim.x)
        o[k] = w_elem(d, n, k) * scale;
}

lmx_status cuda_embed_rows(cuda_backend *cb, float *out, const lmx_tensor *w, const int32_t *ids, int M,
                           float scale) {
    wdesc d = make_wdesc(w);
    emb_ids a;
    for (int m0 = 0; m0 < M; m0 += 512) {
        int n = M - m0 < 512 ? M - m0 : 512;
        for (int i = 0; i < n; i++) a.id[i] = ids[m0 + i];
        unsigned gx = cuda_blocks(d.K, 256);
        dim3 grid(gx < 32 ? gx : 32, n);
        cuda_launch(cb, k_embed, grid, 256, 0, out + (int64_t)m0 * d.K, d, a, (const int *)(cb->dyn_on ? cb->dyn : NULL), scale);
        lmx_status st = cuda_check_launch(cb, "embed");
        if (st) return st;
    }
    return LMX_OK;
}

/* bf16 rows [n0, n0 + rows) of d, any format, an element a thread (elements first, first + step, ..) */
static __device__ __forceinline__ void dequant_rows(__nv_bfloat16 *dst, const wdesc &d, int64_t n0, int64_t rows,
                                                    int64_t first, int64_t step) {
    const int64_t total = rows * d.K;
    for (int64_t i = first; i < total; i += step) dst[i] = __float2bfloat16(w_elem(d, n0 + i / d.K, i % d.K));
}

/* MLX 4 / 8 bit: a thread per packed word (words first, first + step, ..), its 32 / BITS values written as one 16- or
 * 8-byte store. */
template <int BITS>
static __device__ __forceinline__ void dequant_mlx_rows(__nv_bfloat16 *__restrict__ dst, const wdesc &d, int64_t n0,
                                                        int64_t rows, int64_t first, int64_t step) {
    constexpr int PER = 32 / BITS;
    const int64_t wpr = d.words_per_row, total = rows * wpr;
    for (int64_t i = first; i < total; i += step) {
        const int64_t n = n0 + i / wpr, j = i % wpr;
        const uint32_t w = __ldcs((const uint32_t *)d.data + n * wpr + j);
        const int64_t g = n * d.groups_per_row + j * PER / d.group;
        const float sc = cuda_elem(d.scales, d.sdtype, g), bi = cuda_elem(d.biases, d.sdtype, g);
        uint32_t out[PER / 2];
#pragma unroll
        for (int e = 0; e < PER; e += 2) {
            const float a = (float)((w >> (BITS * e)) & ((1u << BITS) - 1u)) * sc + bi;
            const float b = (float)((w >> (BITS * (e + 1))) & ((1u << BITS) - 1u)) * sc + bi;
            __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
            out[e / 2] = *reinterpret_cast<uint32_t *>(&v);
        }
        if constexpr (BITS == 4) *(uint4 *)(dst + i * PER) = make_uint4(out[0], out[1], out[2], out[3]);
        else *(uint2 *)(dst + i * PER) = make_uint2(out[0], out[1]);
    }
}

#define DQ_FIRST (blockIdx.x * (int64_t)blockDim.x + threadIdx.x)
#define DQ_STEP ((int64_t)gridDim.x * blockDim.x)
__global__ void k_dequant_bf16(__nv_bfloat16 *dst, const wdesc d, int64_t n0, int64_t rows) {
    dequant_rows(dst, d, n0, rows, DQ_FIRST, DQ_STEP);
}
template <int BITS>
__global__ void k_dequant_mlx_bf16(__nv_bfloat16 *__restrict__ dst, const wdesc d, int64_t n0, int64_t rows) {
    dequant_mlx_rows<BITS>(dst, d, n0, rows, DQ_FIRST, DQ_STEP);
}
/* the list's weight blockIdx.y (d: its format and shape), whole, at dst + blockIdx.y stride */
static __device__ __forceinline__ wdesc dq_listed(wdesc d, const cuda_dq_list &l) {
    d.data = l.data[blockIdx.y], d.scales = l.scales[blockIdx.y], d.biases = l.biases[blockIdx.y];
    return d;
}
__global__ void k_dequant_list(__nv_bfloat16 *dst, int64_t stride, const wdesc d, const __grid_constant__ cuda_dq_list l,
                               int64_t rows) {
    dequant_rows(dst + blockIdx.y * stride, dq_listed(d, l), 0, rows, DQ_FIRST, DQ_STEP);
}
template <int BITS>
__global__ void k_dequant_mlx_list(__nv_bfloat16 *__restrict__ dst, int64_t stride, const wdesc d,
                                   const __grid_constant__ cuda_dq_list l, int64_t rows) {
    dequant_mlx_rows<BITS>(dst + blockIdx.y * stride, dq_listed(d, l), 0, rows, DQ_FIRST, DQ_STEP);
}

static int mlx_words(const wdesc &d) { return (d.bits == 4 || d.bits == 8) && d.group % (32 / d.bits) == 0; }

lmx_status cuda_dequant_rows_bf16(cuda_backend *cb, const lmx_tensor *w, int64_t n0, int64_t rows,
                                  __nv_bfloat16 *dst) {
    if (w->q.ggml_type) return cuda_ggml_dequant_bf16(cb, w, n0, rows, dst); /* upload took only its types */
    wdesc d = make_wdesc(w);
    if (mlx_words(d)) {
        const int64_t words = rows * d.words_per_row, nb = (words + 255) / 256;
        const unsigned grid = (unsigned)(nb < 16384 ? nb : 16384);
        if (d.bits == 4) k_dequant_mlx_bf16<4><<<grid, 256, 0, cb->stream>>>(dst, d, n0, rows);
        else k_dequant_mlx_bf16<8><<<grid, 256, 0, cb->stream>>>(dst, d, n0, rows);
        return cuda_check_launch(cb, "dequantize");
    }
    int64_t blocks = (rows * d.K + 255) / 256;
    k_dequant_bf16<<<(unsigned)(blocks < 8192 ? blocks : 8192), 256, 0, cb->stream>>>(dst, d, n0, rows);
    return cuda_check_launch(cb, "dequantize");
}

/* (w's weights share w[0]'s format and shape: the caller's mixture is alike) */
lmx_status cuda_dequant_list_bf16(cuda_backend *cb, const lmx_tensor *const *w, int n, __nv_bfloat16 *dst,
                                  int64_t stride) {
    const int64_t N = w[0]->shape[0];
    for (int j0 = 0; j0 < n; j0 += CUDA_MOE_E_MAX) {
        const int m = n - j0 < CUDA_MOE_E_MAX ? n - j0 : CUDA_MOE_E_MAX;
        cuda_dq_list l;
        memset(&l, 0, sizeof l);
        for (int j = 0; j < m; j++)
            l.data[j] = w[j0 + j]->data, l.scales[j] = w[j0 + j]->q.scales, l.biases[j] = w[j0 + j]->q.biases;
        __nv_bfloat16 *o = dst + (int64_t)j0 * stride;
        lmx_status st;
        if (w[0]->q.ggml_type) {
            st = cuda_ggml_dequant_list(cb, w[0], l, m, o, stride);
        } else {
            const wdesc d = make_wdesc(w[0]);
            const int64_t units = mlx_words(d) ? N * d.words_per_row : N * d.K, nb = (units + 255) / 256;
            const dim3 grid((unsigned)(nb < 4096 ? nb : 4096), (unsigned)m);
            if (mlx_words(d) && d.bits == 4) k_dequant_mlx_list<4><<<grid, 256, 0, cb->stream>>>(o, stride, d, l, N);
            else if (mlx_words(d)) k_dequant_mlx_list<8><<<grid, 256, 0, cb->stream>>>(o, stride, d, l, N);
            else k_dequant_list<<<grid, 256, 0, cb->stream>>>(o, stride, d, l, N);
            st = cuda_check_launch(cb, "dequantize");
        }
        if (st) return st;
    }
    return LMX_OK;
}

/* ---- GEMM (cuBLAS) ---------------------------------------------------------------------------- */

/* dst = bf16(src * scale), four values a thread a step where both are aligned for it (V 4; the same
 * rounding as one at a time), else one (V 1) */
template <int V> __global__ void k_narrow_bf16(__nv_bfloat16 *dst, const float *src, int64_t n, float scale) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / V; i += step) {
        if constexpr (V == 4) {
            float4 v = cuda_ld4(src + 4 * i);
            if (scale != 1.0f) v = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
            cuda_st4(dst + 4 * i, v);
        } else {
            dst[i] = __float2bfloat16(scale == 1.0f ? src[i] : src[i] * scale); /* 1: no flush of denormals */
        }
    }
}
/* dst = f32(src), four values a thread a step where aligned (V 4), else one */
template <int V> __global__ void k_widen_bf16(float *dst, const __nv_bfloat16 *src, int64_t n) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / V; i += step) {
        if constexpr (V == 4) {
            cuda_st4(dst + 4 * i, cuda_ld4(src + 4 * i));
        } else {
            dst[i] = __bfloat162float(src[i]);
        }
    }
}
__global__ void k_narrow_f16(__half *dst, const float *src, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __float2half(src[i]);
}
/* y [M, N] += bias [N] */
__global__ void k_add_bias(float *y, const void *b, lmx_dtype bt, int64_t M, int64_t N) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < M * N; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += cuda_elem(b, bt, i % N);
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 16384 ? (b ? b : 1) : 16384);
}

lmx_status cuda_narrow_bf16_scaled(cuda_backend *cb, __nv_bfloat16 *dst, const float *src, int64_t n, float scale) {
    if (cuda_vec4_ok(n, dst, src)) k_narrow_bf16<4><<<grid_for(n / 4), 256, 0, cb->stream>>>(dst, src, n, scale);
    else k_narrow_bf16<1><<<grid_for(n), 256, 0, cb->stream>>>(dst, src, n, scale);
    return cuda_check_launch(cb, "narrow to bf16");
}

lmx_status cuda_narrow_bf16(cuda_backend *cb, __nv_bfloat16 *dst, const float *src, int64_t n) {
    return cuda_narrow_bf16_scaled(cb, dst, src, n, 1.0f);
}

/* y[:, n0:n0+nb] = x16 [M, K] @ w16[nb, K]^T with f32 output, or bf16 (y16: rounded once), ldc N. */
static lmx_status gemm16(cuda_backend *cb, const void *x16, const void *w16, cudaDataType t, void *y, int y16, int M,
                         int nb, int K, int N) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, nb, M, K, &one, w16, t, K, x16, t, K, &zero,
                                    y, y16 ? CUDA_R_16BF : CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return cuda_blas(cb, s, "matmul");
}

/* y_i = x_i @ w_i^T for i < count (bf16 x [M, K], bf16 weights of one shape [N, K], f32 outputs [M, N]) as one
 * cuBLAS batch; ptr: the batch's pointers in device memory, x's, w's and y's, count each. */
lmx_status cuda_gemm_bf16_batch(cuda_backend *cb, const void *const *ptr, int count, int M, int N, int K) {
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmBatchedEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, ptr + count, CUDA_R_16BF, K,
                                           ptr, CUDA_R_16BF, K, &zero, (void *const *)(ptr + 2 * count), CUDA_R_32F, N,
                                           count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return cuda_blas(cb, s, "matmul batch");
}

/* x f32, or xb non-NULL: x already bf16 (a training keep) for a bf16 or quantized w; y f32, or bf16 (y16: a
 * bf16 or quantized w) */
static lmx_status matmul_gemm(cuda_backend *cb, const float *x, const __nv_bfloat16 *xb, const lmx_tensor *w, void *y,
                              int y16, int M, int N, int K) {
    lmx_status st;
    if (!w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_F32) {
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t s = cublasSgemm(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, (const float *)w->data, K,
                                       x, K, &zero, (float *)y, N);
        return cuda_blas(cb, s, "matmul");
    }
    int f16 = !w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_F16;
    void *x16 = xb ? (void *)xb : cuda_scratch(cb, CUDA_SCRATCH_X, (size_t)M * K * 2);
    if (!x16) return cb->base.err.status;
    if (xb) {
        st = LMX_OK;
    } else if (f16) {
        k_narrow_f16<<<grid_for((int64_t)M * K), 256, 0, cb->stream>>>((__half *)x16, x, (int64_t)M * K);
        st = cuda_check_launch(cb, "matmul");
    } else {
        st = cuda_narrow_bf16(cb, (__nv_bfloat16 *)x16, x, (int64_t)M * K);
    }
    if (st) return st;
    if (!w->q.bits && !w->q.ggml_type)
        return gemm16(cb, x16, w->data, f16 ? CUDA_R_16F : CUDA_R_16BF, y, y16, M, N, K, N);
    int64_t block = CUDA_DEQUANT_BYTES / ((int64_t)K * 2);
    if (block < 64) block = 64;
    if (block > N) block = N;
    __nv_bfloat16 *wb = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_W, (size_t)block * K * 2);
    if (!wb) return cb->base.err.status;
    for (int64_t n0 = 0; n0 < N; n0 += block) {
        int nb = (int)(N - n0 < block ? N - n0 : block);
        if ((st = cuda_dequant_rows_bf16(cb, w, n0, nb, wb))) return st;
        if ((st = gemm16(cb, x16, wb, CUDA_R_16BF, (char *)y + n0 * (y16 ? 2 : 4), y16, M, nb, K, N))) return st;
    }
    return LMX_OK;
}

/* ---- the op ------------------------------------------------------------------------------------ */

lmx_status cuda_widen_into(cuda_backend *cb, float *dst, const __nv_bfloat16 *src, int64_t n) {
    if (n <= 0) return LMX_OK;
    if (cuda_vec4_ok(n, dst, src)) k_widen_bf16<4><<<grid_for(n / 4), 256, 0, cb->stream>>>(dst, src, n);
    else k_widen_bf16<1><<<grid_for(n), 256, 0, cb->stream>>>(dst, src, n);
    return cuda_check_launch(cb, "widen");
}

/* *wide = an f32 copy of bf16 x [n] (released by the caller) */
lmx_status cuda_widen(cuda_backend *cb, lmx_tensor *wide, const lmx_tensor *x) {
    *wide = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = x->ndim};
    memcpy(wide->shape, x->shape, sizeof wide->shape);
    lmx_status st = cuda_alloc_raw(cb, wide);
    if (st) return st;
    if ((st = cuda_widen_into(cb, (float *)wide->data, (const __nv_bfloat16 *)x->data, lmx_tensor_nelem(x))))
        cb->base.ops->release(&cb->base, wide);
    return st;
}

lmx_status cuda_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                       const lmx_tensor *bias, int M) {
    cuda_backend *cb = (cuda_backend *)be;
    const int N = (int)w->shape[0], K = (int)w->shape[1];
    const float *xs = (const float *)x->data;
    float *y = (float *)out->data;
    if (M <= 0) return LMX_OK;
    const int quant = w->q.bits || w->q.ggml_type;
    lmx_status st;
    const int rows = cuda_gemv_rows(cb, w); /* rows of one GEMV launch */
    /* (a mixture's experts in tiles, routed on the host: only the dequantizing GEMM reads them) */
    const int gemv = M <= (quant ? QGEMV_MAX_ROWS : rows) && !cuda_moe_tile_base(w->q.ggml_type);
    const int xb = x->dtype == LMX_DTYPE_BF16; /* a training keep (backend.h): the GEMM takes it as it is */
    const int y16 = out->dtype == LMX_DTYPE_BF16; /* training's bf16 gate and up (model.h mlp16) */
    if (y16 && (gemv || bias || (!quant && w->dtype != LMX_DTYPE_BF16)))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda matmul: a bf16 output of %d rows%s", M,
                           bias ? " with a bias" : " of these weights");
    if (out->dtype != LMX_DTYPE_F32 && !y16)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda matmul: an output of dtype %d", (int)out->dtype);
    if (xb && (gemv || (!quant && w->dtype != LMX_DTYPE_BF16))) /* elsewhere x in f32 */
        return cuda_on_widened(cb, x, [&](const lmx_tensor *xf) { return cuda_matmul(be, out, xf, w, bias, M); });
    if (gemv) {
        for (int m0 = 0; m0 < M; m0 += rows) { /* quantized: each chunk of rows streams w once */
            const int mc = M - m0 < rows ? M - m0 : rows;
            float *ym = y + (size_t)m0 * N;
            st = cuda_gemv(cb, 1, &w, &bias, &ym, xs + (size_t)m0 * K, mc, -1, NULL);
            if (st == LMX_ERR_UNSUPPORTED) st = cuda_gemv_any(cb, w, bias, ym, xs + (size_t)m0 * K, mc);
            if (st) return st;
        }
        return LMX_OK;
    }
    if (!y16 && cuda_gemv_f32_takes(cb, w, x, M)) { /* f32 weights of few rows (a router), 2..32 rows */
        if ((st = cuda_gemv_f32(cb, w, xs, y, M))) return st;
    } else if ((st = matmul_gemm(cb, xb ? NULL : xs, xb ? (const __nv_bfloat16 *)x->data : NULL, w, out->data, y16, M,
                                 N, K)))
        return st;
    if (bias) {
        k_add_bias<<<grid_for((int64_t)M * N), 256, 0, cb->stream>>>(y, bias->data, bias->dtype, M, N);
        return cuda_check_launch(cb, "matmul bias");
    }
    return LMX_OK;
}

/* The norm_matmuls op (backend.h): where every GEMM takes a bf16 x as it is (bf16 or quantized weights, rows
 * past the one-row kernels'), the norm writes xn's bf16 copy in its pass (the rounding the GEMMs' own
 * narrowing does: the same values) and the GEMMs read it; else declined.  A bf16 xn is that copy, and the
 * norm writes nothing else. */
lmx_status cuda_op_norm_matmuls(lmx_backend *be, lmx_tensor *xn, const lmx_tensor *x, const lmx_tensor *norm_w, int rows,
                                int n, float eps, float add_one, int count, lmx_tensor *const *outs,
                                const lmx_tensor *const *ws, const lmx_tensor *const *biases) {
    cuda_backend *cb = (cuda_backend *)be;
    const int only16 = xn->dtype == LMX_DTYPE_BF16; /* xn the bf16 copy alone */
    if (n <= 256 || x->dtype != LMX_DTYPE_F32 || (only16 && !cb->act16)) /* n: cuda_rmsnorm_o16's rows */
        return LMX_ERR_UNSUPPORTED;
    for (int i = 0; i < count; i++) {
        const int quant = ws[i]->q.bits || ws[i]->q.ggml_type;
        if ((!quant && ws[i]->dtype != LMX_DTYPE_BF16) || rows <= (quant ? QGEMV_MAX_ROWS : cuda_gemv_rows(cb, ws[i])))
            return LMX_ERR_UNSUPPORTED;
    }
    lmx_status st = cuda_graph_flush(cb);
    lmx_tensor x16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, n}}; /* [rows, n] */
    if (only16) x16 = *xn;
    else if (st || (st = cuda_alloc_raw(cb, &x16))) return st;
    if (!st) st = cuda_rmsnorm_o16(be, only16 ? NULL : xn, x, norm_w, rows, n, eps, add_one, (__nv_bfloat16 *)x16.data);
    for (int i = 0; i < count && !st; i++) st = cuda_matmul(be, outs[i], &x16, ws[i], biases[i], rows);
    if (!only16) be->ops->release(be, &x16);
    return st;
}
