/* cuda_backend.cu - the cuda backend: creation, device memory, weight upload, and the ops table.
 *
 * Weights are copied once to the device in their stored format (bf16/f16/f32, MLX packed words
 * with their scales and biases, GGUF blocks).  Activations are f32, KV caches bf16.  The kernels
 * live in cuda_ops.cu (elementwise, norms, RoPE, embedding), cuda_matmul.cu and cuda_attention.cu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_attention.h"
#include "cuda_gemv.h"
#include "cuda_internal.h"
#include "cuda_moe_mma.h"
#include "cuda_repack.h"

extern "C" {
#include "../backward.h"
}

/* ---- errors -------------------------------------------------------------------------------- */

lmx_status cuda_fail(cuda_backend *cb, cudaError_t e, const char *what) {
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* allocation failures are not sticky: clear them */
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM,
                           "cuda: out of GPU memory in %s (%zu of %zu MiB free)", what, free_b >> 20,
                           total_b >> 20);
    }
    return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda: %s in %s", cudaGetErrorString(e), what);
}

lmx_status cuda_blas_fail(cuda_backend *cb, cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_ALLOC_FAILED)
        return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda: cuBLAS out of GPU memory in %s", what);
    return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda: cuBLAS error %d (%s) in %s", (int)s,
                       cublasGetStatusString(s), what);
}

lmx_status cuda_check_launch(cuda_backend *cb, const char *what) {
    cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? LMX_OK : cuda_fail(cb, e, what);
}

/* Free scratch slot's buffer (to the pool, after the kernels enqueued before) and its count. */
static void scratch_free(cuda_backend *cb, int slot) {
    if (!cb->scratch[slot]) return;
    cudaFreeAsync(cb->scratch[slot], cb->stream);
    lmx_backend_mem(&cb->base, -(int64_t)cb->scratch_bytes[slot]);
    cb->scratch[slot] = NULL;
    cb->scratch_bytes[slot] = 0;
}

void *cuda_scratch(cuda_backend *cb, int slot, size_t bytes) {
    if (bytes <= cb->scratch_bytes[slot]) return cb->scratch[slot];
    if (cb->dyn_on) { /* a decode graph capturing: no allocation now; the capture grows the slot and tries again */
        if (bytes > cb->scratch_due[slot]) cb->scratch_due[slot] = bytes;
        lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda graph: scratch %d grows while capturing", slot);
        return NULL;
    }
    size_t want = bytes + (bytes / 4 < (32u << 20) ? bytes / 4 : (32u << 20)); /* headroom: at most 32 MiB */
    if (lmx_backend_mem_check(&cb->base, (int64_t)want - (int64_t)cb->scratch_bytes[slot]) != LMX_OK) {
        want = bytes; /* without the headroom, if that fits */
        if (lmx_backend_mem_check(&cb->base, (int64_t)want - (int64_t)cb->scratch_bytes[slot]) != LMX_OK) return NULL;
    }
    cuda_graph_drop(cb); /* a captured graph may hold the old buffer */
    scratch_free(cb, slot); /* stream-ordered: no wait for the kernels that read it */
    void *p = NULL;
    cudaError_t e = cudaMallocFromPoolAsync(&p, want, cb->pool, cb->stream);
    if (e != cudaSuccess) {
        cuda_fail(cb, e, "scratch allocation");
        return NULL;
    }
    /* the slots that hold tickets start at zero (their last blocks reset them); a slot may grow after a graph
     * capture asked for it (cuda_scratch_catch_up), so it is zeroed here rather than by its user */
    const int tickets = slot == CUDA_SCRATCH_MOE_TICKET || slot == CUDA_SCRATCH_LORA_SUM || slot == CUDA_SCRATCH_GEMV;
    if (tickets && (e = cudaMemsetAsync(p, 0, want, cb->stream)) != cudaSuccess) {
        cudaFreeAsync(p, cb->stream);
        cuda_fail(cb, e, "scratch tickets");
        return NULL;
    }
    lmx_backend_mem(&cb->base, (int64_t)want);
    cb->scratch[slot] = p;
    cb->scratch_bytes[slot] = want;
    return p;
}

int cuda_fit_blocks(cuda_backend *cb, const void *fn) {
    for (int i = 0; i < cb->n_fit; i++)
        if (cb->fit[i].fn == fn) return cb->fit[i].per_sm;
    int per_sm = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, 0) != cudaSuccess) {
        cudaGetLastError();
        per_sm = 1;
    }
    if (per_sm < 1) per_sm = 1;
    if (cb->n_fit < (int)(sizeof cb->fit / sizeof cb->fit[0])) {
        cb->fit[cb->n_fit].fn = fn;
        cb->fit[cb->n_fit++].per_sm = per_sm;
    }
    return per_sm;
}

int cuda_scratch_catch_up(cuda_backend *cb) {
    int grew = 0;
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) {
        const size_t due = cb->scratch_due[i];
        cb->scratch_due[i] = 0;
        if (due > cb->scratch_bytes[i]) grew |= cuda_scratch(cb, i, due) != NULL;
    }
    return grew;
}

/* Give the activation pool's idle blocks back to the device (cuda_alloc), after the stream's work. */
static void pool_trim(cuda_backend *cb) {
    cudaStreamSynchronize(cb->stream);
    cudaMemPoolTrimTo(cb->pool, 0);
}

static int64_t cuda_cached_bytes(const lmx_backend *be) {
    const cuda_backend *cb = (const cuda_backend *)be;
    int64_t n = 0;
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) n += (int64_t)cb->scratch_bytes[i];
    return n;
}

/* Page-locked host memory (NULL when it cannot be had: no error kept, lmx_host_alloc's contract). */
static void *cuda_host_alloc(lmx_backend *be, size_t n) {
    (void)be;
    void *p = NULL;
    if (cudaMallocHost(&p, n ? n : 1) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}
static void cuda_host_free(lmx_backend *be, void *p) {
    cuda_park_wait((cuda_backend *)be); /* its copies may still use p */
    cuda_graph_forget_host((cuda_backend *)be, p); /* and a decode graph may write into it */
    cudaFreeHost(p);
}

/* The device's free memory, plus the pool's idle blocks (its reserve, which later allocations reuse). */
static int64_t cuda_free_bytes(const lmx_backend *be) {
    const cuda_backend *cb = (const cuda_backend *)be;
    size_t free_b = 0, total_b = 0, reserved = 0, used = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
    if (cudaMemPoolGetAttribute(cb->pool, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
        cudaMemPoolGetAttribute(cb->pool, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess)
        reserved = used = 0;
    cudaGetLastError();
    return (int64_t)free_b + (int64_t)(reserved > used ? reserved - used : 0);
}

/* Free the scratch buffers (cuda_scratch allocates them again when an op needs them) and the offload stages
 * that hold nothing to come; trim also gives the pool's idle blocks back to the device. */
static void cuda_trim_scratch(lmx_backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    cuda_graph_flush(cb); /* a failure stays in be->err */
    cuda_graph_drop(cb);  /* a captured graph may use the buffers */
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) scratch_free(cb, i);
    cuda_park_trim(cb);
}

static void cuda_trim(lmx_backend *be) {
    cuda_trim_scratch(be);
    pool_trim((cuda_backend *)be);
}

/* ---- memory -------------------------------------------------------------------------------- */

size_t cuda_weight_bytes(const lmx_tensor *w) { /* as stored on the device (cuda_stored_ggml) */
    int64_t N = w->ndim == 2 ? w->shape[0] : 1, K = w->shape[w->ndim - 1];
    const int type = cuda_stored_ggml(w->q.ggml_type);
    if (type) return lmx_ggml_is_supported_quant(type) ? lmx_ggml_row_bytes(type, K) * (size_t)N : 0;
    if (w->q.bits) return (size_t)N * (size_t)(K * w->q.bits / 32) * 4;
    return (size_t)lmx_tensor_nelem(w) * lmx_dtype_size(w->dtype);
}

/* Room for one more block in a list of *n blocks (grown by doubling): 0, or -1 out of host memory. */
static int list_room(void ***list, int *n, int *cap) {
    if (*n < *cap) return 0;
    const int c = *cap ? 2 * *cap : 256;
    void **nl = (void **)realloc(*list, (size_t)c * sizeof *nl);
    if (!nl) return -1;
    *list = nl, *cap = c;
    return 0;
}

/* device block p, freed with the backend */
static lmx_status track(cuda_backend *cb, void *p) {
    if (list_room(&cb->weights, &cb->n_weights, &cb->cap_weights)) {
        cudaFree(p);
        return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda: out of host memory");
    }
    cb->weights[cb->n_weights++] = p;
    return LMX_OK;
}

/* Copy n bytes of host memory to a new tracked device block.  src may sit at any address (a tensor of
 * a mapped safetensors file need not be aligned): the copy is bytewise, and the device block from
 * cudaMalloc is 256-byte aligned, so the kernels' word and vector loads never see the file's layout.
 * Weights, scales and biases each get their own block for that reason. */
static lmx_status weight_block(cuda_backend *cb, size_t n, void **out, const char *what) {
    void *p = NULL;
    lmx_status st = lmx_backend_mem_check(&cb->base, (int64_t)(n ? n : 16));
    if (st) return st;
    CUDA_TRY(cb, cudaMalloc(&p, n ? n : 16), what);
    st = track(cb, p);
    if (st) return st;
    lmx_backend_mem(&cb->base, (int64_t)(n ? n : 16)); /* freed with the backend */
    *out = p;
    return LMX_OK;
}

static lmx_status upload(cuda_backend *cb, const void *src, size_t n, void **out, const char *what) {
    lmx_status st = weight_block(cb, n, out, what);
    if (st) return st;
    CUDA_TRY(cb, cudaMemcpyAsync(*out, src, n, cudaMemcpyHostToDevice, cb->stream), what);
    return LMX_OK;
}

/* Give back the last n blocks weight_block made, made in the order of bytes (a repack that kept the GGUF blocks). */
static void weight_blocks_drop(cuda_backend *cb, int n, const size_t *bytes) {
    for (int i = n - 1; i >= 0 && cb->n_weights > 0; i--) {
        cudaFree(cb->weights[--cb->n_weights]);
        lmx_backend_mem(&cb->base, -(int64_t)(bytes[i] ? bytes[i] : 16));
    }
}

/* GGUF w rewritten as MLX groups of 32 of bits (cuda_repack_bits) on the device (cuda_repack.cu); *done 0: w is
 * as it was. */
static lmx_status upload_repacked(cuda_backend *cb, lmx_tensor *w, int bits, int *done) {
    *done = 0;
    const int64_t N = w->shape[0], K = w->shape[1];
    const size_t bytes[3] = {(size_t)(N * K * bits / 8), (size_t)(N * K / 32) * 2, (size_t)(N * K / 32) * 2};
    void *b[3] = {NULL, NULL, NULL}; /* words, scales, biases */
    lmx_status st = LMX_OK;
    int made = 0, ok = 0;
    while (made < 3 && !(st = weight_block(cb, bytes[made], &b[made], "weight upload"))) made++;
    if (!st) st = cuda_repack(cb, w, bits, b[0], b[1], b[2], &ok);
    if (st || !ok) {
        weight_blocks_drop(cb, made, bytes);
        return st;
    }
    w->data = b[0];
    w->q.ggml_type = 0;
    w->q.bits = bits;
    w->q.group = 32;
    w->q.scale_dtype = LMX_DTYPE_F16;
    w->q.scales = b[1];
    w->q.biases = b[2];
    w->dtype = LMX_DTYPE_U32;
    w->owned = 0;
    *done = 1;
    return LMX_OK;
}

/* The same into mapped page-locked host memory, which kernels read in place over the bus (upload_weight_host);
 * src NULL: the block is left for the caller to fill (the newest of cb->host_weights). */
static lmx_status upload_host(cuda_backend *cb, const void *src, size_t n, void **out, const char *what) {
    void *p = NULL, *d = NULL;
    if (list_room(&cb->host_weights, &cb->n_host_weights, &cb->cap_host_weights))
        return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda: out of host memory");
    CUDA_TRY(cb, cudaHostAlloc(&p, n ? n : 16, cudaHostAllocMapped), what);
    cb->host_weights[cb->n_host_weights++] = p;
    if (src) memcpy(p, src, n); /* NULL: the caller fills it */
    CUDA_TRY(cb, cudaHostGetDevicePointer(&d, p, 0), what);
    *out = d;
    return LMX_OK;
}

static lmx_status weight_upload(lmx_backend *be, lmx_tensor *w, int host) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status gst = cuda_graph_flush(cb);
    if (gst) return gst;
    if (w->q.ggml_type && !cuda_weight_bytes(w))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED,
                           "cuda: GGUF %s weights are not supported (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K to Q6_K are)",
                           lmx_ggml_type_name(w->q.ggml_type));
    if (!w->q.ggml_type && !w->q.bits && w->dtype != LMX_DTYPE_F32 && w->dtype != LMX_DTYPE_BF16 &&
        w->dtype != LMX_DTYPE_F16)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: %s weights are not supported",
                           lmx_dtype_name(w->dtype));
    lmx_status st;
    if (!host && cuda_moe_tiles_takes(cb, w)) { /* a mixture's experts in tiles (cuda_moe_mma.cu) */
        void *d = NULL;
        if ((st = weight_block(cb, cuda_weight_bytes(w), &d, "weight upload")) || (st = cuda_moe_tiles_upload(cb, w, d)))
            return st;
        w->data = d;
        w->q.ggml_type = cuda_moe_tiled_type(w->q.ggml_type);
        w->owned = 0; /* freed with the backend */
        return LMX_OK;
    }
    const int bits = host ? 0 : cuda_repack_bits(cb, w);
    if (bits) {
        int done = 0;
        if ((st = upload_repacked(cb, w, bits, &done)) || done) return st;
    }
    void *d = NULL;
    const int stored = cuda_stored_ggml(w->q.ggml_type);
    if (stored != w->q.ggml_type) { /* the blocks in another layout (Q6_K 16-byte aligned) */
        if (host) {
            if ((st = upload_host(cb, NULL, cuda_weight_bytes(w), &d, "weight upload"))) return st;
            cuda_host_aligned(w, cb->host_weights[cb->n_host_weights - 1]);
        } else if ((st = weight_block(cb, cuda_weight_bytes(w), &d, "weight upload")) ||
                   (st = cuda_upload_aligned(cb, w, d))) {
            return st;
        }
        w->data = d;
        w->q.ggml_type = stored;
        w->owned = 0; /* freed with the backend */
        return LMX_OK;
    }
    lmx_status (*up)(cuda_backend *, const void *, size_t, void **, const char *) = host ? upload_host : upload;
    if ((st = up(cb, w->data, cuda_weight_bytes(w), &d, "weight upload"))) return st;
    if (cb->gemv_st > 0 && w->q.ggml_type == LMX_GGML_Q4_K && !cuda_gemv_st_fits(w)) { /* past f16: not k_gemv_st's */
        for (int i = 0; i < 2; i++) { /* its first byte and the byte past its last: a view into it is declined too */
            if (list_room(&cb->st_unfit, &cb->n_st_unfit, &cb->cap_st_unfit))
                return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cuda: out of host memory");
            cb->st_unfit[cb->n_st_unfit++] = (char *)d + (i ? cuda_weight_bytes(w) : 0);
        }
    }
    if (w->q.bits) {
        int64_t N = w->shape[0], G = w->shape[1] / w->q.group;
        size_t sb = (size_t)N * (size_t)G * lmx_dtype_size(w->q.scale_dtype);
        void *s = NULL, *b = NULL;
        if ((st = up(cb, w->q.scales, sb, &s, "weight upload"))) return st;
        if ((st = up(cb, w->q.biases, sb, &b, "weight upload"))) return st;
        w->q.scales = s;
        w->q.biases = b;
    }
    CUDA_TRY(cb, cudaStreamSynchronize(cb->stream), "weight upload"); /* host pages may go away */
    w->data = d;
    w->owned = 0; /* freed with the backend */
    return LMX_OK;
}
static lmx_status cuda_upload_weight(lmx_backend *be, lmx_tensor *w) { return weight_upload(be, w, 0); }
static lmx_status cuda_upload_weight_host(lmx_backend *be, lmx_tensor *w) { return weight_upload(be, w, 1); }

/* Activations come from the backend's stream-ordered pool: a release returns the block to the pool on
 * the stream (no wait), and a later allocation on the stream reuses it.  mem_now counts the tensors'
 * bytes; the pool's idle blocks stay reserved for reuse until trim gives them back to the device. */
lmx_status cuda_alloc_raw(cuda_backend *cb, lmx_tensor *t) {
    lmx_backend *be = &cb->base;
    lmx_status gst = cuda_graph_flush(cb);
    if (gst) return gst;
    size_t bytes = (size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype);
    lmx_status st = lmx_backend_mem_check(be, (int64_t)bytes);
    if (st) return st;
    void *p = NULL;
    CUDA_TRY(cb, cudaMallocFromPoolAsync(&p, bytes ? bytes : 16, cb->pool, cb->stream), "tensor allocation");
    t->data = p;
    t->owned = 1;
    lmx_backend_mem(be, (int64_t)bytes);
    return LMX_OK;
}

static lmx_status cuda_alloc(lmx_backend *be, lmx_tensor *t) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_alloc_raw(cb, t);
    if (st) return st;
    cudaError_t e = cudaMemsetAsync(t->data, 0, (size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype), cb->stream);
    if (e != cudaSuccess) {
        be->ops->release(be, t);
        return cuda_fail(cb, e, "tensor allocation");
    }
    return LMX_OK;
}

static lmx_status cuda_op_alloc_raw(lmx_backend *be, lmx_tensor *t) { return cuda_alloc_raw((cuda_backend *)be, t); }

static void cuda_release(lmx_backend *be, lmx_tensor *t) {
    cuda_backend *cb = (cuda_backend *)be;
    cuda_graph_flush(cb); /* a failure stays in be->err */
    if (t->owned && t->data) {
        cuda_graph_drop(cb); /* a captured graph may use this memory: it is never launched again */
        cudaFreeAsync(t->data, cb->stream); /* after every op enqueued before */
        lmx_backend_mem(be, -(int64_t)((size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype)));
    }
    t->data = NULL;
    t->owned = 0;
}

static lmx_status cuda_write(lmx_backend *be, lmx_tensor *t, size_t off, const void *src, size_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status gst = cuda_graph_flush(cb);
    if (gst) return gst;
    CUDA_TRY(cb, cudaMemcpyAsync((char *)t->data + off, src, n, cudaMemcpyHostToDevice, cb->stream), "write");
    CUDA_TRY(cb, cudaStreamSynchronize(cb->stream), "write");
    return LMX_OK;
}

static lmx_status cuda_read(lmx_backend *be, const lmx_tensor *t, size_t off, void *dst, size_t n) {
    cuda_backend *cb = (cuda_backend *)be;
    /* the read the step's graph announced and writes itself (cuda_graph.cu, G_READ): only wait for it */
    const int written = cuda_graph_writes_read(cb, t, off, dst, n);
    lmx_status gst = cuda_graph_flush(cb);
    if (gst) return gst;
    if (written) {
        CUDA_TRY(cb, cudaStreamSynchronize(cb->stream), "read");
        return LMX_OK;
    }
    CUDA_TRY(cb, cudaMemcpyAsync(dst, (const char *)t->data + off, n, cudaMemcpyDeviceToHost, cb->stream), "read");
    CUDA_TRY(cb, cudaStreamSynchronize(cb->stream), "read");
    return LMX_OK;
}

/* ---- KV cache growth ------------------------------------------------------------------------ */

#define KV_CHUNK 256

static lmx_status cuda_kv_reserve(lmx_backend *be, lmx_kv_layer *kv, int need, int64_t row_elems) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status gst = cuda_graph_flush(cb);
    if (gst) return gst;
    if (kv->rotating || need <= kv->cap) return LMX_OK;
    int64_t cap = ((int64_t)need + KV_CHUNK - 1) / KV_CHUNK * KV_CHUNK;
    int64_t grown = (int64_t)kv->cap + kv->cap / 2;
    if (grown > cap) cap = (grown + KV_CHUNK - 1) / KV_CHUNK * KV_CHUNK;
    size_t es = lmx_dtype_size(LMX_DTYPE_BF16);
    size_t bytes = (size_t)cap * (size_t)row_elems * es;
    size_t old = (size_t)kv->cap * (size_t)row_elems * es;
    lmx_status st = lmx_backend_mem_check(be, 2 * (int64_t)(bytes - (kv->k.owned && kv->k.data ? old : 0)));
    if (st) return lmx_err_prefix(&be->err, "KV cache of %d positions", (int)cap);
    /* from the stream-ordered pool, as activations: the copy, the zeroing and the old buffers' free follow the work
     * before them on the stream, and the host waits for none of it (a batch's 32 contexts of 48 layers reserved
     * through cudaMalloc and a wait each took 65-100 ms before its prefill, H200) */
    void *np[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        cudaError_t e = cudaMallocFromPoolAsync(&np[i], bytes, cb->pool, cb->stream);
        if (e != cudaSuccess) {
            if (i) cudaFreeAsync(np[0], cb->stream);
            return cuda_fail(cb, e, "KV cache growth");
        }
    }
    lmx_tensor *ts[2] = {&kv->k, &kv->v};
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
        if (old && ts[i]->data) e = cudaMemcpyAsync(np[i], ts[i]->data, old, cudaMemcpyDeviceToDevice, cb->stream);
        if (e == cudaSuccess) e = cudaMemsetAsync((char *)np[i] + old, 0, bytes - old, cb->stream);
    }
    if (e != cudaSuccess) {
        cudaFreeAsync(np[0], cb->stream);
        cudaFreeAsync(np[1], cb->stream);
        return cuda_fail(cb, e, "KV cache growth");
    }
    if (kv->k.owned && kv->k.data) cuda_graph_drop(cb); /* the old buffers go (new ones no graph can hold) */
    for (int i = 0; i < 2; i++) {
        lmx_backend_mem(&cb->base, ts[i]->owned && ts[i]->data ? (int64_t)(bytes - old) : (int64_t)bytes);
        if (ts[i]->owned && ts[i]->data) cudaFreeAsync(ts[i]->data, cb->stream);
        ts[i]->data = np[i];
        ts[i]->owned = 1;
        ts[i]->dtype = LMX_DTYPE_BF16;
        ts[i]->ndim = 2;
        ts[i]->shape[0] = cap;
        ts[i]->shape[1] = row_elems;
    }
    kv->cap = (int)cap;
    return LMX_OK;
}

/* ---- the table ----------------------------------------------------------------------------- */

/* the ops, through the decode-graph layer (cuda_graph.cu; lora, add and glu: cuda_internal.h) */
lmx_status cuda_op_read_ahead(lmx_backend *be, const lmx_tensor *t, void *dst, size_t n);
lmx_status cuda_op_lora_glu(lmx_backend *be, lmx_tensor *out, lmx_tensor *gate, lmx_tensor *up, const lmx_tensor *x,
                            int B, int T, const lmx_lora_pair *const *pg, const lmx_lora_pair *const *pu, int64_t n,
                            lmx_act act);
lmx_status cuda_op_lora_add(lmx_backend *be, lmx_tensor *y, lmx_tensor *proj, const lmx_tensor *x, int B, int T,
                            const lmx_lora_pair *const *pairs, int64_t n);
lmx_status cuda_op_norm_matmuls(lmx_backend *be, lmx_tensor *xn, const lmx_tensor *x, const lmx_tensor *norm_w, int rows,
                                int n, float eps, float add_one, int count, lmx_tensor *const *outs,
                                const lmx_tensor *const *ws, const lmx_tensor *const *biases);
lmx_status cuda_op_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *t, const int32_t *ids, int M, float s);
lmx_status cuda_op_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                           int n, float eps, float add_one);
lmx_status cuda_op_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                          const lmx_tensor *bias, int M);
lmx_status cuda_op_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap);
lmx_status cuda_op_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *b, int nh, int hd, const lmx_rope *rope);
lmx_status cuda_op_attention(lmx_backend *be, const lmx_attn_args *a);
lmx_status cuda_op_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *b, const lmx_tensor *k,
                             const lmx_tensor *v);
lmx_status cuda_op_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const int *rows, int R,
                               int64_t n);

lmx_status cuda_scatter_add_rows(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, const int *rows, const float *w,
                                 int R, int64_t n);
lmx_status cuda_op_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s);
lmx_status cuda_op_moe(lmx_backend *be, const lmx_moe_args *a);

static void cuda_destroy(lmx_backend *be) {
    cuda_backend *cb = (cuda_backend *)be;
    if (!cb) return;
    if (cb->stream) cudaStreamSynchronize(cb->stream);
    cuda_park_free(cb);
    cuda_graph_destroy(cb);
    for (int i = 0; i < cb->n_weights; i++) cudaFree(cb->weights[i]);
    for (int i = 0; i < cb->n_host_weights; i++) cudaFreeHost(cb->host_weights[i]);
    free(cb->host_weights);
    free(cb->st_unfit);
    for (int i = 0; i < CUDA_SCRATCH_SLOTS; i++) scratch_free(cb, i);
    cuda_rope_angles_free(cb);
    if (cb->topk_host) cudaFreeHost(cb->topk_host);
    if (cb->stream) cudaStreamSynchronize(cb->stream); /* the frees before the pool goes */
    if (cb->blas) cublasDestroy(cb->blas);
    if (cb->pool) cudaMemPoolDestroy(cb->pool); /* tensors still held are freed with it */
    if (cb->stream) cudaStreamDestroy(cb->stream);
    if (cb->side) cudaStreamDestroy(cb->side);
    if (cb->fork) cudaEventDestroy(cb->fork);
    if (cb->join) cudaEventDestroy(cb->join);
    free(cb->weights);
    free(cb);
}

static const lmx_backend_ops cuda_ops = {
    /* .name = */ "cuda",
    /* .kv_dtype = */ LMX_DTYPE_BF16,
    /* .prefill_chunk = */ 2048, /* quantized weights are dequantized once per chunk */
    /* .destroy = */ cuda_destroy,
    /* .upload_weight = */ cuda_upload_weight,
    /* .alloc = */ cuda_alloc,
    /* .release = */ cuda_release,
    /* .write = */ cuda_write,
    /* .read = */ cuda_read,
    /* .embed = */ cuda_op_embed,
    /* .rmsnorm = */ cuda_op_rmsnorm,
    /* .matmul = */ cuda_op_matmul,
    /* .lora = */ cuda_op_lora,
    /* .add = */ cuda_op_add,
    /* .glu = */ cuda_op_glu,
    /* .softcap = */ cuda_op_softcap,
    /* .rope = */ cuda_op_rope,
    /* .attention = */ cuda_op_attention,
    /* .kv_append = */ cuda_op_kv_append,
    /* .kv_reserve = */ cuda_kv_reserve,
    /* .gather_rows = */ cuda_op_gather_rows,
    /* .topk = */ cuda_topk,
    /* .trim = */ cuda_trim,
    /* .cached_bytes = */ cuda_cached_bytes,
    /* .backward = */ &lmx_cuda_backward,
    /* .scatter_add_rows = */ cuda_scatter_add_rows,
    /* .scale = */ cuda_op_scale,
    /* .moe = */ cuda_op_moe,
    /* .free_bytes = */ cuda_free_bytes,
    /* .host_alloc = */ cuda_host_alloc,
    /* .host_free = */ cuda_host_free,
    /* .alloc_raw = */ cuda_op_alloc_raw,
    /* .upload_weight_host = */ cuda_upload_weight_host,
    /* .trim_scratch = */ cuda_trim_scratch,
    /* .read_ahead = */ cuda_op_read_ahead,
    /* .lora_glu = */ cuda_op_lora_glu,
    /* .lora_add = */ cuda_op_lora_add,
    /* .norm_matmuls = */ cuda_op_norm_matmuls,
};

extern "C" int lmx_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static void cuda_version(char *dst, size_t cap, int v) { /* 12080 -> "12.8" */
    snprintf(dst, cap, "%d.%d", v / 1000, (v % 1000) / 10);
}

extern "C" lmx_status lmx_cuda_device_info(int i, lmx_device_info *out, lmx_err *err) {
    memset(out, 0, sizeof *out);
    snprintf(out->backend, sizeof out->backend, "cuda");
    out->index = i;
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, i);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return lmx_err_set(err, LMX_ERR_BACKEND, "cuda: device %d: %s", i, cudaGetErrorString(e));
    }
    snprintf(out->name, sizeof out->name, "%s", p.name);
    out->total_memory = (int64_t)p.totalGlobalMem;
    out->cc_major = p.major;
    out->cc_minor = p.minor;
    out->sm_count = p.multiProcessorCount;
    int prev = 0; /* free memory is the current device's: switch, then switch back */
    size_t free_b = 0, total_b = 0;
    if (cudaGetDevice(&prev) == cudaSuccess && cudaSetDevice(i) == cudaSuccess &&
        cudaMemGetInfo(&free_b, &total_b) == cudaSuccess)
        out->free_memory = (int64_t)free_b;
    cudaSetDevice(prev);
    cudaGetLastError();
    int v = 0;
    if (cudaDriverGetVersion(&v) == cudaSuccess) cuda_version(out->driver_version, sizeof out->driver_version, v);
    if (cudaRuntimeGetVersion(&v) == cudaSuccess) cuda_version(out->runtime_version, sizeof out->runtime_version, v);
    cudaGetLastError();
    return LMX_OK;
}

extern "C" lmx_status lmx_cuda_backend_create(lmx_backend **out, lmx_err *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return lmx_err_set(err, LMX_ERR_BACKEND, "cuda: no usable GPU (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    }
    cuda_backend *cb = (cuda_backend *)calloc(1, sizeof *cb);
    if (!cb) return lmx_err_set(err, LMX_ERR_NOMEM, "cuda backend: out of memory");
    cb->base.ops = &cuda_ops;
    cudaGetDevice(&cb->device);
    cudaDeviceGetAttribute(&cb->sm_count, cudaDevAttrMultiProcessorCount, cb->device);
    if ((e = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        lmx_err_set(err, LMX_ERR_BACKEND, "cuda: %s in stream creation", cudaGetErrorString(e));
        cuda_destroy(&cb->base);
        return LMX_ERR_BACKEND;
    }
    cublasStatus_t s = cublasCreate(&cb->blas);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cb->blas = NULL;
        lmx_err_set(err, LMX_ERR_BACKEND, "cuda: cuBLAS initialisation failed (%s)", cublasGetStatusString(s));
        cuda_destroy(&cb->base);
        return LMX_ERR_BACKEND;
    }
    cublasSetStream(cb->blas, cb->stream);
    cudaMemPoolProps pp = {};
    pp.allocType = cudaMemAllocationTypePinned;
    pp.location.type = cudaMemLocationTypeDevice;
    pp.location.id = cb->device;
    uint64_t keep = UINT64_MAX; /* idle blocks stay reserved until trim */
    if ((e = cudaMemPoolCreate(&cb->pool, &pp)) != cudaSuccess ||
        (e = cudaMemPoolSetAttribute(cb->pool, cudaMemPoolAttrReleaseThreshold, &keep)) != cudaSuccess) {
        lmx_err_set(err, LMX_ERR_BACKEND, "cuda: %s in memory pool creation", cudaGetErrorString(e));
        cuda_destroy(&cb->base);
        return LMX_ERR_BACKEND;
    }
    if (cudaStreamCreateWithFlags(&cb->side, cudaStreamNonBlocking) != cudaSuccess ||
        cudaEventCreateWithFlags(&cb->fork, cudaEventDisableTiming) != cudaSuccess ||
        cudaEventCreateWithFlags(&cb->join, cudaEventDisableTiming) != cudaSuccess) {
        cudaGetLastError(); /* graphs then run LoRA's shrink in line */
        if (cb->side) cudaStreamDestroy(cb->side);
        if (cb->fork) cudaEventDestroy(cb->fork);
        cb->side = NULL;
        cb->fork = NULL;
    }
    const char *tk = getenv("LMX_CUDA_TOPK");
    cb->topk_off = tk && tk[0] == '0';
    const char *mo = getenv("LMX_CUDA_MOE");
    cb->moe_off = mo && mo[0] == '0';
    const char *ms = getenv("LMX_CUDA_MOE_STAGED");
    cb->moe_staged = !(ms && ms[0] == '0');
    const char *mm = getenv("LMX_CUDA_MOE_MMA"); /* "G[,D]": gate / up from G rows, down from D (G alone: both) */
    cb->moe_mma[0] = mm ? atoi(mm) : CUDA_MOE_MMA_ROWS_GU;
    cb->moe_mma[1] = mm ? (strchr(mm, ',') ? atoi(strchr(mm, ',') + 1) : cb->moe_mma[0]) : CUDA_MOE_MMA_ROWS_DOWN;
    const char *mt = getenv("LMX_CUDA_MOE_TILES");
    cb->moe_tiles = !(mt && mt[0] == '0');
    const char *as = getenv("LMX_CUDA_ATT_SHORT");
    cb->att_short = !(as && as[0] == '0');
    const char *ag = getenv("LMX_CUDA_ATT_GMAX");
    cb->att_gmax = ag && (!strcmp(ag, "1") || !strcmp(ag, "2") || !strcmp(ag, "8")) ? atoi(ag) : 4;
    const char *tc = getenv("LMX_CUDA_ATT_TC");
    cb->att_tc = tc ? (atoi(tc) > 0 ? atoi(tc) : -1) : 0; /* 0: the rule of cuda_attention_plan */
    const char *gq = getenv("LMX_CUDA_GEMV_MQ");
    cb->gemv_mq = gq ? atoi(gq) : CUDA_GEMV_MQ_ROWS;
    const char *gs = getenv("LMX_CUDA_GEMV_ST");
    cb->gemv_st = gs ? atoi(gs) : CUDA_GEMV_ST_ROWS;
    const char *mw = getenv("LMX_CUDA_MOE_ROWS");
    cb->moe_rows = !(mw && mw[0] == '0');
    const char *gr = getenv("LMX_CUDA_GGUF_REPACK");
    cb->gguf_repack = !(gr && gr[0] == '0');
    const char *kp = getenv("LMX_CUDA_KEEP");
    cb->keep_f32 = kp && !strcmp(kp, "f32");
    const char *a16 = getenv("LMX_CUDA_ACT16");
    cb->act16 = !(a16 && a16[0] == '0');
    const char *gv = getenv("LMX_CUDA_GEMV");
    cb->gemv_variant = gv ? atoi(gv) : 0;
    const char *sm = getenv("LMX_CUDA_STREAM_MIN");
    cb->stream_min = sm ? atoll(sm) : (int64_t)8 << 20; /* cuda_ggml.cu measures it */
    const char *sb = getenv("LMX_CUDA_STREAM_BPM");
    cb->stream_bpm = sb ? atoi(sb) : 0;
    const char *xb = getenv("LMX_CUDA_XS_BLOCKS");
    cb->xs_blocks = xb ? atoi(xb) : 4 * cb->sm_count;
    int cc_major = 0, cc_minor = 0;
    cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, cb->device);
    cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, cb->device);
    const char *wg = getenv("LMX_CUDA_WGMMA");
    cb->wgmma = cc_major == 9 && cc_minor == 0 && !(wg && wg[0] == '0'); /* the sm_90a code of the build */
    cuda_gemv_init();
    cuda_flash_init();
    cuda_flash_decode_init();
    cuda_flash_bwd_init();
    cuda_flash_bwd_wg_init();
    cuda_lora_udb_init();
    cuda_lora_term_init();
    cuda_moe_mma_init(cb);
    cuda_gemv_mq_init(cb);
    cuda_flash_wg_init();
    cublasSetMathMode(cb->blas, CUBLAS_DEFAULT_MATH);
    if (cuda_graph_create(cb) != LMX_OK) {
        lmx_err_set(err, LMX_ERR_NOMEM, "cuda backend: out of memory");
        cuda_destroy(&cb->base);
        return LMX_ERR_NOMEM;
    }
    const char *pad = getenv("LMX_CUDA_BATCH_PAD"); /* =0: a batch's finished sequences leave its steps at once (A/B) */
    cb->base.replays_steps = cb->g != NULL && !(pad && pad[0] == '0');
    *out = &cb->base;
    return LMX_OK;
}
