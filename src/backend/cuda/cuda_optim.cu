/* cuda_optim.cu - the cuda backend's optimizer ops (backward.h: sumsq, adamw, adamw_many, zero_many) and LoRA dropout,
 * for cuda_backward.cu's table.  AdamW runs in double arithmetic as the cpu does, element for element. */
#include <math.h>
#include <stdlib.h>

#include "cuda_internal.h"

#include "../act_grad.h"

extern "C" {
#include "../backward.h"
}

/* ---- the optimizer -------------------------------------------------------------------------------- */

/* Many tensors in one launch (sumsq, adamw_many, zero_many): a block takes OPT_CHUNK values of one tensor, part[i]'s
 * chunks the blocks from part[i].b0 on. */
#define OPT_CHUNK 2048
struct opt_part {
    float *p, *m1, *m2;
    const float *g;
    int64_t n, b0;
};

/* The part whose chunks hold block b (parts [count], b0 ascending from 0), and the chunk's values [*k0, *k1) */
static __device__ __forceinline__ const opt_part &opt_block(const opt_part *part, int count, int64_t b, int64_t *k0,
                                                            int64_t *k1) {
    int lo = 0, hi = count - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (part[mid].b0 <= b) lo = mid;
        else hi = mid - 1;
    }
    *k0 = (b - part[lo].b0) * OPT_CHUNK;
    *k1 = *k0 + OPT_CHUNK < part[lo].n ? *k0 + OPT_CHUNK : part[lo].n;
    return part[lo];
}

/* The parts of count tensors (g: the gradients, f32 [n each]; p and m: the parameters and the moments m[2 i],
 * m[2 i + 1], or NULL) in device memory (scratch slot BWD after `skip` bytes), and the launch's blocks. */
static lmx_status opt_parts(cuda_backend *cb, int count, lmx_tensor *const *p, const lmx_tensor *g, lmx_tensor *m,
                            size_t skip, opt_part **dev, int64_t *blocks) {
    opt_part *host = (opt_part *)malloc((size_t)count * sizeof *host);
    if (!host) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "optimizer: out of memory");
    int64_t b = 0;
    for (int i = 0; i < count; i++) {
        const int64_t n = lmx_tensor_nelem(&g[i]);
        host[i] = opt_part{p ? (float *)p[i]->data : NULL, m ? (float *)m[2 * i].data : NULL,
                           m ? (float *)m[2 * i + 1].data : NULL, (const float *)g[i].data, n, b};
        b += (n + OPT_CHUNK - 1) / OPT_CHUNK;
    }
    char *d = (char *)cuda_scratch(cb, CUDA_SCRATCH_BWD, skip + (size_t)count * sizeof *host);
    cudaError_t e = d ? cudaMemcpyAsync(d + skip, host, (size_t)count * sizeof *host, cudaMemcpyHostToDevice, cb->stream)
                      : cudaSuccess;
    free(host); /* pageable: the copy has read it when cudaMemcpyAsync returns */
    if (!d) return cb->base.err.status;
    if (e != cudaSuccess) return cuda_fail(cb, e, "optimizer");
    *dev = (opt_part *)(d + skip);
    *blocks = b;
    return LMX_OK;
}

__global__ void k_sumsq(const opt_part *part, int count, double *out) {
    __shared__ double sh[32];
    int64_t k0, k1;
    const opt_part &P = opt_block(part, count, blockIdx.x, &k0, &k1);
    double ss = 0;
    for (int64_t i = k0 + threadIdx.x; i < k1; i += blockDim.x) ss += (double)P.g[i] * P.g[i];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < (int)blockDim.x / 32; w++) t += sh[w];
        atomicAdd(out, t);
    }
}

lmx_status cuda_bwd_sumsq(lmx_backend *be, const lmx_tensor *g, int count, double *out) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    *out = 0;
    if (st || count <= 0) return st;
    opt_part *part;
    int64_t blocks;
    if ((st = opt_parts(cb, count, NULL, g, NULL, 16, &part, &blocks))) return st; /* the sum before the parts */
    double *d = (double *)((char *)part - 16);
    cudaError_t e = cudaMemsetAsync(d, 0, sizeof(double), cb->stream);
    if (e == cudaSuccess && blocks > 0) { /* every tensor into one sum in one launch: one wait */
        k_sumsq<<<(unsigned)blocks, 256, 0, cb->stream>>>(part, count, d);
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaMemcpyAsync(out, d, sizeof(double), cudaMemcpyDeviceToHost, cb->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cb->stream);
    return e == cudaSuccess ? LMX_OK : cuda_fail(cb, e, "gradient norm");
}

/* the cpu's update, element for element (double arithmetic, f32 storage) */
static __device__ __forceinline__ void adamw_value(float *p, const float *g, float *m1, float *m2, int64_t k,
                                                   const lmx_adamw_step &s) {
    const double gk = g[k] * s.clip;
    double pk = p[k] * (1.0 - s.lr * s.weight_decay);
    const float a = (float)(s.beta1 * m1[k] + (1.0 - s.beta1) * gk);
    const float b = (float)(s.beta2 * m2[k] + (1.0 - s.beta2) * gk * gk);
    m1[k] = a, m2[k] = b;
    pk -= s.lr / s.bc1 * a / (sqrt((double)b) / sqrt(s.bc2) + s.eps);
    p[k] = (float)pk;
}

__global__ void k_adamw(float *p, const float *g, float *m1, float *m2, int64_t n, const lmx_adamw_step s) {
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x)
        adamw_value(p, g, m1, m2, k, s);
}

__global__ void k_adamw_many(const opt_part *part, int count, const lmx_adamw_step s) {
    int64_t k0, k1;
    const opt_part &P = opt_block(part, count, blockIdx.x, &k0, &k1);
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) adamw_value(P.p, P.g, P.m1, P.m2, k, s);
}

lmx_status cuda_bwd_adamw_many(lmx_backend *be, int count, lmx_tensor *const *p, const lmx_tensor *g, lmx_tensor *m,
                                 const lmx_adamw_step *s) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    opt_part *part;
    int64_t blocks;
    if (st || count <= 0 || (st = opt_parts(cb, count, p, g, m, 0, &part, &blocks))) return st;
    if (blocks > 0) k_adamw_many<<<(unsigned)blocks, 256, 0, cb->stream>>>(part, count, *s);
    return cuda_check_launch(cb, "AdamW");
}

__global__ void k_zero_many(const opt_part *part, int count) {
    int64_t k0, k1;
    const opt_part &P = opt_block(part, count, blockIdx.x, &k0, &k1);
    float *g = (float *)P.g; /* the tensors zero_many was given to write */
    for (int64_t k = k0 + threadIdx.x; k < k1; k += blockDim.x) g[k] = 0.0f;
}

lmx_status cuda_bwd_zero_many(lmx_backend *be, int count, lmx_tensor *g) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    opt_part *part;
    int64_t blocks;
    if (st || count <= 0 || (st = opt_parts(cb, count, NULL, g, NULL, 0, &part, &blocks))) return st;
    if (blocks > 0) k_zero_many<<<(unsigned)blocks, 256, 0, cb->stream>>>(part, count);
    return cuda_check_launch(cb, "clearing the gradients");
}

lmx_status cuda_bwd_adamw(lmx_backend *be, lmx_tensor *p, const lmx_tensor *g, lmx_tensor *m1, lmx_tensor *m2, int64_t n,
                            const lmx_adamw_step *s) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    k_adamw<<<cuda_ew_grid(n), 256, 0, cb->stream>>>((float *)p->data, (const float *)g->data, (float *)m1->data,
                                                  (float *)m2->data, n, *s);
    return cuda_check_launch(cb, "AdamW");
}

__global__ void k_dropout(float *y, const float *x, int64_t n, float p, uint64_t seed) {
    const float s = 1.0f / (1.0f - p);
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = lmx_dropout_keep(seed, i, p) ? x[i] * s : 0.0f;
}

lmx_status cuda_bwd_dropout(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n, float p, uint64_t seed) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    k_dropout<<<cuda_ew_grid(n), 256, 0, cb->stream>>>((float *)y->data, (const float *)x->data, n, p, seed);
    return cuda_check_launch(cb, "dropout");
}
