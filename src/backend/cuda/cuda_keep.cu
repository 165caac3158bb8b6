/* cuda_keep.cu - what training keeps of the forward pass for backward (backward.h): the keep op and its
 * inverse (bf16 copies, f32 with LMX_CUDA_KEEP=f32), the forward ops that write their keeps in their
 * own pass (glu_keep, rmsnorm_keep), and the values the tape computes again in backward instead of
 * keeping them (glu_redo, rmsnorm_redo).  cuda_backward.cu's ops table holds them. */
#include "cuda_internal.h"

extern "C" {
#include "../backward.h"
}

/* out = act(g) u as the glu op computes it (out may be g; NULL: not written), and bf16 copies of g and u
 * (and of out: ok non-NULL); g and u f32, or bf16 (G: model.h mlp16) */
template <int V, typename G>
__global__ void k_glu_keep(float *o, __nv_bfloat16 *gk, __nv_bfloat16 *uk, __nv_bfloat16 *ok, const G *g,
                           const G *u, int64_t n, int act) {
    const int64_t step = V * (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = V * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < n; i += step)
        if constexpr (V == 4) {
            const float4 a = cuda_ld4(g + i), b = cuda_ld4(u + i);
            const float4 y = make_float4(glu_act(a.x, act) * b.x, glu_act(a.y, act) * b.y, glu_act(a.z, act) * b.z,
                                         glu_act(a.w, act) * b.w);
            cuda_st4(gk + i, a);
            cuda_st4(uk + i, b);
            if (o) cuda_st4(o + i, y);
            if (ok) cuda_st4(ok + i, y);
        } else {
            const float gi = (float)g[i], ui = (float)u[i], oi = glu_act(gi, act) * ui;
            gk[i] = __float2bfloat16(gi);
            uk[i] = __float2bfloat16(ui);
            if (o) o[i] = oi;
            if (ok) ok[i] = __float2bfloat16(oi);
        }
}

/* k_glu_keep over gate and up of type G, four values a thread where every pointer allows */
template <typename G>
static lmx_status glu_keep_of(cuda_backend *cb, float *o, __nv_bfloat16 *g16, __nv_bfloat16 *u16, __nv_bfloat16 *o16,
                              const void *gate, const void *up, int64_t n, int act) {
    const G *g = (const G *)gate, *u = (const G *)up;
    if (cuda_vec4_ok(n, o, g, u, g16, u16, o16))
        k_glu_keep<4, G><<<cuda_ew_grid(n / 4), 256, 0, cb->stream>>>(o, g16, u16, o16, g, u, n, act);
    else
        k_glu_keep<1, G><<<cuda_ew_grid(n), 256, 0, cb->stream>>>(o, g16, u16, o16, g, u, n, act);
    return cuda_check_launch(cb, "glu");
}

lmx_status cuda_bwd_glu_keep(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                               lmx_act act, lmx_tensor *gk, lmx_tensor *uk, lmx_tensor *ok, const lmx_lora_term *tg,
                               const lmx_lora_term *tu) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    if (gk->dtype != LMX_DTYPE_BF16 || uk->dtype != LMX_DTYPE_BF16 || (ok && ok->dtype != LMX_DTYPE_BF16))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "glu with keeps: bf16 keeps only");
    if (!out && !ok) return lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "glu with keeps: no output");
    const int in16 = gate->dtype == LMX_DTYPE_BF16; /* training's bf16 gate and up (model.h mlp16) */
    if (in16 != (up->dtype == LMX_DTYPE_BF16) || (!in16 && gate->dtype != LMX_DTYPE_F32) ||
        (out && out->dtype != LMX_DTYPE_F32))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "glu with keeps: gate and up both f32 or both bf16, out f32");
    float *o = out ? (float *)out->data : NULL;
    if (tg || tu) { /* the terms in the same pass (cuda_lora_term.cu), or added to gate and up first */
        int done = 0;
        st = cuda_glu_terms(cb, o, gate->data, up->data, in16, n, (int)act, (__nv_bfloat16 *)gk->data,
                            (__nv_bfloat16 *)uk->data, ok ? (__nv_bfloat16 *)ok->data : NULL, tg, tu, &done);
        if (st || done) return st;
    }
    __nv_bfloat16 *g16 = (__nv_bfloat16 *)gk->data, *u16 = (__nv_bfloat16 *)uk->data,
                  *o16 = ok ? (__nv_bfloat16 *)ok->data : NULL;
    return in16 ? glu_keep_of<__nv_bfloat16>(cb, o, g16, u16, o16, gate->data, up->data, n, (int)act)
                : glu_keep_of<float>(cb, o, g16, u16, o16, gate->data, up->data, n, (int)act);
}

lmx_status cuda_bwd_rmsnorm_keep(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                                   int n, float eps, float add_one, lmx_tensor *ok) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st) return st;
    if (ok->dtype != LMX_DTYPE_BF16 || lmx_tensor_nelem(ok) != (int64_t)rows * n)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "rmsnorm with a keep: a bf16 keep of [%d, %d] only", rows, n);
    return cuda_rmsnorm_o16(be, out, x, w, rows, n, eps, add_one, (__nv_bfloat16 *)ok->data);
}

/* ---- values made again in backward (the tape's redo keeps) -------------------------------------- */

/* o = act(g) u rounded to O, from gate and up as kept (f32 or bf16) */
template <int V, typename O, typename G, typename U>
__global__ void k_glu_redo(O *o, const G *g, const U *u, int64_t n, int act) {
    const int64_t step = V * (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = V * (blockIdx.x * (int64_t)blockDim.x + threadIdx.x); i < n; i += step)
        if constexpr (V == 4) {
            const float4 a = cuda_ld4(g + i), b = cuda_ld4(u + i);
            cuda_st4(o + i, make_float4(glu_act(a.x, act) * b.x, glu_act(a.y, act) * b.y, glu_act(a.z, act) * b.z,
                                        glu_act(a.w, act) * b.w));
        } else {
            o[i] = O(glu_act(cuda_ld_f(g + i), act) * cuda_ld_f(u + i));
        }
}

template <typename O, typename G, typename U>
static void glu_redo_go(cuda_backend *cb, O *o, const G *g, const U *u, int64_t n, int act) {
    if (cuda_vec4_ok(n, o, g, u)) k_glu_redo<4><<<cuda_ew_grid(n / 4), 256, 0, cb->stream>>>(o, g, u, n, act);
    else k_glu_redo<1><<<cuda_ew_grid(n), 256, 0, cb->stream>>>(o, g, u, n, act);
}

template <typename O, typename G>
static void glu_redo_launch(cuda_backend *cb, O *o, const G *g, const lmx_tensor *up, int64_t n, int act) {
    if (up->dtype == LMX_DTYPE_BF16) glu_redo_go(cb, o, g, (const __nv_bfloat16 *)up->data, n, act);
    else glu_redo_go(cb, o, g, (const float *)up->data, n, act);
}

lmx_status cuda_bwd_glu_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                               lmx_act act) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || n <= 0) return st;
    const int g16 = gate->dtype == LMX_DTYPE_BF16;
    if (out->dtype == LMX_DTYPE_BF16) {
        __nv_bfloat16 *o = (__nv_bfloat16 *)out->data;
        if (g16) glu_redo_launch(cb, o, (const __nv_bfloat16 *)gate->data, up, n, (int)act);
        else glu_redo_launch(cb, o, (const float *)gate->data, up, n, (int)act);
    } else {
        float *o = (float *)out->data;
        if (g16) glu_redo_launch(cb, o, (const __nv_bfloat16 *)gate->data, up, n, (int)act);
        else glu_redo_launch(cb, o, (const float *)gate->data, up, n, (int)act);
    }
    return cuda_check_launch(cb, "glu (again)");
}

/* out[r] = x[r] / rms(x[r]) * (w + add_one) rounded to O, x as kept (f32 or bf16), a block of 256 threads a
 * row of any length: thread t sums the squares of values t, t + 256, ... in that order, as the rmsnorm op's
 * kernel does for rows over 256 (from an f32 x, the same values as its output). */
template <typename O, typename X>
__global__ void __launch_bounds__(256) k_rmsnorm_redo(O *out, const X *x, const void *w, lmx_dtype wt, int n, float eps,
                                                      float add_one) {
    __shared__ float part[8];
    const X *xr = x + (int64_t)blockIdx.x * n;
    O *orow = out + (int64_t)blockIdx.x * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += 256) {
        const float v = cuda_ld_f(xr + i);
        ss += v * v;
    }
    const float inv = cuda_rms_inv_block(ss, n, eps, part);
    for (int i = threadIdx.x; i < n; i += 256) orow[i] = O(cuda_norm_elem(cuda_ld_f(xr + i), inv, w, wt, i, add_one));
}

template <typename O>
static void rmsnorm_redo_launch(cuda_backend *cb, O *out, const lmx_tensor *x, const lmx_tensor *w, int rows, int n,
                                float eps, float add_one) {
    if (x->dtype == LMX_DTYPE_BF16)
        k_rmsnorm_redo<<<rows, 256, 0, cb->stream>>>(out, (const __nv_bfloat16 *)x->data, w->data, w->dtype, n, eps, add_one);
    else
        k_rmsnorm_redo<<<rows, 256, 0, cb->stream>>>(out, (const float *)x->data, w->data, w->dtype, n, eps, add_one);
}

lmx_status cuda_bwd_rmsnorm_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                                   int n, float eps, float add_one) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st || rows <= 0) return st;
    if (w->q.bits || w->q.ggml_type)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: rmsnorm with a quantized weight");
    if (out->dtype == LMX_DTYPE_BF16) rmsnorm_redo_launch(cb, (__nv_bfloat16 *)out->data, x, w, rows, n, eps, add_one);
    else rmsnorm_redo_launch(cb, (float *)out->data, x, w, rows, n, eps, add_one);
    return cuda_check_launch(cb, "rmsnorm (again)");
}

/* Forward values for backward: bf16 copies (f32 with LMX_CUDA_KEEP=f32), which the backward ops read as they are
 * (attention widens its q, k and v first). */
lmx_dtype cuda_bwd_keep_dtype(const lmx_backend *be) {
    return ((const cuda_backend *)be)->keep_f32 ? LMX_DTYPE_F32 : LMX_DTYPE_BF16;
}

/* n values of src (dtype st) into dst (dtype dt): copied where the dtypes agree, rounded from f32 to bf16 (a
 * keep, an offload's stage) or widened from bf16 to f32 (a restore, a reload); what names the op in errors */
static lmx_status convert_into(cuda_backend *cb, void *dst, lmx_dtype dt, const void *src, lmx_dtype st, int64_t n,
                               const char *what) {
    if (dt == st && (dt == LMX_DTYPE_F32 || dt == LMX_DTYPE_BF16)) {
        const cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)n * lmx_dtype_size(dt), cudaMemcpyDeviceToDevice, cb->stream);
        return e == cudaSuccess ? LMX_OK : cuda_fail(cb, e, what);
    }
    if (dt == LMX_DTYPE_BF16 && st == LMX_DTYPE_F32)
        return cuda_narrow_bf16(cb, (__nv_bfloat16 *)dst, (const float *)src, n);
    if (dt == LMX_DTYPE_F32 && st == LMX_DTYPE_BF16)
        return cuda_widen_into(cb, (float *)dst, (const __nv_bfloat16 *)src, n);
    return lmx_err_set(&cb->base.err, LMX_ERR_UNSUPPORTED, "%s: dtype %d into dtype %d", what, (int)st, (int)dt);
}

lmx_status cuda_bwd_keep(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    if (st) return st;
    *dst = (lmx_tensor){.dtype = cuda_bwd_keep_dtype(be), .ndim = 2, .shape = {x->shape[0], x->shape[1]}};
    if (x->dtype != LMX_DTYPE_F32 && x->dtype != dst->dtype) /* a bf16 buffer (model.h mlp16) into a bf16 keep */
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "keep: a value of dtype %d", (int)x->dtype);
    if ((st = cuda_alloc_raw(cb, dst))) return st;
    if ((st = convert_into(cb, dst->data, dst->dtype, x->data, x->dtype, lmx_tensor_nelem(dst), "keep")))
        be->ops->release(be, dst);
    return st;
}

/* into f32, or into a buffer of the keep's dtype (a bf16 gate or up product taken back: model.h mlp16) */
lmx_status cuda_bwd_restore(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    return st ? st : convert_into(cb, dst->data, dst->dtype, x->data, x->dtype, lmx_tensor_nelem(x), "restore");
}

/* ---- checkpoints through host memory (offload / reload) ----------------------------------------- */

/* Device stages of keep dtype.  offload narrows x into a stage on the main stream and the copy stream
 * moves it to the host, the stages taking turns (offload_stage) so that a copy overlaps what follows.  reload has the
 * copy stream bring a block into a stage (at once, or ahead as an earlier reload's next) and widens (or
 * copies) it into dst on the main stream; the stage then fetches next.  Each stage remembers the block it
 * holds or is fetching (ahead), so reloads of several kinds of block that interleave (a layer's input, its
 * attention output, its hidden state, its attention's q, k and v: train.c's replay) each find theirs fetched
 * a layer ahead, a stage each; a stage that holds nothing ahead when reload runs is freed (the backward it
 * serves holds the most memory).  Before either stream touches a stage it waits for the other's last use of
 * it: ev_copy[s] marks the copy stream's, ev_main[s] the main stream's (an event never recorded is no wait). */
#define PARK_STAGES 8   /* a layer's six kinds and gate / up (train.c) fetched ahead, each in a stage */
#define OFFLOAD_STAGES 6 /* of which offload takes turns over the first this many; the others hold spread
                            offloads' blocks while their copies to the host go a share at a time */
struct cuda_park {
    cudaStream_t copy;
    cudaEvent_t ev_copy[PARK_STAGES], ev_main[PARK_STAGES];
    void *stage[PARK_STAGES];
    size_t bytes[PARK_STAGES]; /* each stage's size (0: none) */
    const void *ahead[PARK_STAGES]; /* the host block (ahead_n values) stage s holds or is fetching for a
                                       reload to come (NULL: none) */
    int64_t ahead_n[PARK_STAGES];
    int turn;                  /* the stage offload used last */
    char *to[PARK_STAGES];     /* a spread offload's host block (NULL: none), sent bytes of left, share a turn */
    size_t sent[PARK_STAGES], left[PARK_STAGES], share[PARK_STAGES];
};

/* Each spread block's next share (all that is left with all) queued on the copy stream; its stage's ev_copy
 * recorded after its last */
static lmx_status spread_send(cuda_backend *cb, int all) {
    cuda_park *P = cb->park;
    for (int s = OFFLOAD_STAGES; P && s < PARK_STAGES; s++) {
        if (!P->to[s]) continue;
        const size_t b = all || P->share[s] > P->left[s] ? P->left[s] : P->share[s];
        CUDA_TRY(cb, cudaMemcpyAsync(P->to[s] + P->sent[s], (char *)P->stage[s] + P->sent[s], b, cudaMemcpyDeviceToHost,
                                     P->copy), "offload");
        P->sent[s] += b, P->left[s] -= b;
        if (!P->left[s]) {
            P->to[s] = NULL;
            CUDA_TRY(cb, cudaEventRecord(P->ev_copy[s], P->copy), "offload");
        }
    }
    return LMX_OK;
}

void cuda_park_wait(cuda_backend *cb) {
    if (cb->park) spread_send(cb, 1), cudaStreamSynchronize(cb->park->copy); /* a failure stays in be->err */
}

/* stage s freed after both streams' last use of it, in the copy stream's order: nobody waits (the pool hands
 * the memory on once the free has run) */
static void stage_free(cuda_backend *cb, int s) {
    cuda_park *P = cb->park;
    if (!P->stage[s]) return;
    if (P->to[s]) spread_send(cb, 1); /* a failure stays in be->err */
    cudaError_t e = cudaStreamWaitEvent(P->copy, P->ev_main[s], 0);
    if (e == cudaSuccess) e = cudaFreeAsync(P->stage[s], P->copy);
    if (e != cudaSuccess) cuda_fail(cb, e, "offload stages"); /* kept in be->err; the stage is dropped */
    lmx_backend_mem(&cb->base, -(int64_t)P->bytes[s]);
    P->stage[s] = NULL, P->bytes[s] = 0, P->ahead[s] = NULL;
}

void cuda_park_trim(cuda_backend *cb) {
    for (int s = 0; cb->park && s < PARK_STAGES; s++)
        if (!cb->park->ahead[s]) stage_free(cb, s);
}

void cuda_park_free(cuda_backend *cb) {
    cuda_park *P = cb->park;
    if (!P) return;
    for (int s = 0; s < PARK_STAGES; s++) {
        stage_free(cb, s);
        if (P->ev_copy[s]) cudaEventDestroy(P->ev_copy[s]);
        if (P->ev_main[s]) cudaEventDestroy(P->ev_main[s]);
    }
    cudaStreamSynchronize(cb->stream);
    if (P->copy) cudaStreamSynchronize(P->copy), cudaStreamDestroy(P->copy);
    free(P);
    cb->park = NULL;
}

/* cb->park made, with stage s of at least bytes (made, or grown from the stream-ordered pool; with exact, of
 * bytes exactly) */
static lmx_status park_ready(cuda_backend *cb, int s, size_t bytes, int exact) {
    if (!cb->park) {
        cuda_park *P = (cuda_park *)calloc(1, sizeof *P);
        if (!P) return lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cuda: out of memory");
        cb->park = P;
        CUDA_TRY(cb, cudaStreamCreateWithFlags(&P->copy, cudaStreamNonBlocking), "offload");
        for (int i = 0; i < PARK_STAGES; i++) {
            CUDA_TRY(cb, cudaEventCreateWithFlags(&P->ev_copy[i], cudaEventDisableTiming), "offload");
            CUDA_TRY(cb, cudaEventCreateWithFlags(&P->ev_main[i], cudaEventDisableTiming), "offload");
        }
    }
    cuda_park *P = cb->park;
    if (exact ? bytes == P->bytes[s] : bytes <= P->bytes[s]) return LMX_OK;
    stage_free(cb, s);
    lmx_status st = lmx_backend_mem_check(&cb->base, (int64_t)bytes);
    if (st) return lmx_err_prefix(&cb->base.err, "offload stages");
    CUDA_TRY(cb, cudaMallocFromPoolAsync(&P->stage[s], bytes, cb->pool, cb->stream), "offload stages");
    lmx_backend_mem(&cb->base, (int64_t)bytes);
    P->bytes[s] = bytes;
    CUDA_TRY(cb, cudaEventRecord(P->ev_main[s], cb->stream), "offload stages"); /* the copy stream waits for it */
    return LMX_OK;
}

/* The copy stream brings host block (n values) into stage s, after the main stream's last use of it; the
 * stage of the block's size exactly, so that a reload into a tensor of that size can hand it over. */
static lmx_status park_fetch(cuda_backend *cb, int s, const void *host, int64_t n, size_t es) {
    cuda_park *P = cb->park;
    lmx_status st = park_ready(cb, s, (size_t)n * es, 1);
    if (st) return st;
    CUDA_TRY(cb, cudaStreamWaitEvent(P->copy, P->ev_main[s], 0), "reload");
    CUDA_TRY(cb, cudaMemcpyAsync(P->stage[s], host, (size_t)n * es, cudaMemcpyHostToDevice, P->copy), "reload");
    CUDA_TRY(cb, cudaEventRecord(P->ev_copy[s], P->copy), "reload");
    P->ahead[s] = host, P->ahead_n[s] = n;
    return LMX_OK;
}

/* The stage offload narrows a block of bytes into: after the last one it used, the first whose copy to the
 * host is done and that is large enough (no wait), else one not made yet, else one large enough (its copy
 * waited for): a burst of blocks (a layer's q, k, v and attention output) takes as many stages as the copies
 * lag behind, up to OFFLOAD_STAGES, and blocks whose copies keep up one. */
static int offload_stage(cuda_park *P, size_t bytes) {
    for (int pass = 0; pass < 3; pass++)
        for (int k = 1; k <= OFFLOAD_STAGES; k++) {
            const int s = (P->turn + k) % OFFLOAD_STAGES;
            if (pass == 0 ? P->bytes[s] >= bytes && cudaEventQuery(P->ev_copy[s]) == cudaSuccess
                          : pass == 1 ? !P->stage[s] : P->bytes[s] >= bytes)
                return s;
        }
    return (P->turn + 1) % OFFLOAD_STAGES;
}

/* The stage a spread offload takes: one holding no block still being sent, else the one with the least left
 * (sent whole first) */
static int spread_stage(cuda_backend *cb) {
    cuda_park *P = cb->park;
    int s = OFFLOAD_STAGES;
    for (int i = OFFLOAD_STAGES; i < PARK_STAGES; i++)
        if (!P->to[i] || (P->to[s] && P->left[i] < P->left[s])) s = i;
    return s;
}

lmx_status cuda_bwd_offload(lmx_backend *be, void *host, const lmx_tensor *x, int spread) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    const int64_t n = lmx_tensor_nelem(x);
    const lmx_dtype dt = cuda_bwd_keep_dtype(be);
    const size_t es = lmx_dtype_size(dt), bytes = (size_t)n * es;
    if (st || n <= 0 || (st = park_ready(cb, 0, 0, 0))) return st; /* the park itself */
    cuda_park *P = cb->park;
    const int s = spread > 0 ? spread_stage(cb) : offload_stage(P, bytes);
    if (P->to[s] && (st = spread_send(cb, 1))) return st;
    if ((st = park_ready(cb, s, bytes, 0))) return st;
    if (spread <= 0) P->turn = s;
    for (int i = 0; i < PARK_STAGES; i++) /* overwritten, or its contents change */
        if (i == s || P->ahead[i] == host) P->ahead[i] = NULL;
    CUDA_TRY(cb, cudaStreamWaitEvent(cb->stream, P->ev_copy[s], 0), "offload");
    if ((st = convert_into(cb, P->stage[s], dt, x->data, x->dtype, n, "offload"))) return st;
    CUDA_TRY(cb, cudaEventRecord(P->ev_main[s], cb->stream), "offload");
    CUDA_TRY(cb, cudaStreamWaitEvent(P->copy, P->ev_main[s], 0), "offload");
    if (spread > 0) { /* its shares go with this offload and the next spread - 1 (2 MiB at least) */
        const size_t share = (bytes + (size_t)spread - 1) / (size_t)spread;
        P->to[s] = (char *)host, P->sent[s] = 0, P->left[s] = bytes, P->share[s] = share > (2u << 20) ? share : 2u << 20;
    } else {
        CUDA_TRY(cb, cudaMemcpyAsync(host, P->stage[s], bytes, cudaMemcpyDeviceToHost, P->copy), "offload");
        CUDA_TRY(cb, cudaEventRecord(P->ev_copy[s], P->copy), "offload");
    }
    return spread_send(cb, 0); /* a share of each spread block, this one's first */
}

/* Only next fetched ahead (n values), into a stage that holds nothing to come; the stages left from offload go */
static lmx_status park_ahead(cuda_backend *cb, const void *next, int64_t n, size_t es) {
    lmx_status st = park_ready(cb, 0, 0, 0); /* the park itself */
    if (st) return st;
    cuda_park *P = cb->park;
    for (int i = 0; i < PARK_STAGES; i++)
        if (P->ahead[i] == next && P->ahead_n[i] == n) return LMX_OK; /* on its way already */
    int s = -1;
    for (int i = 0; i < PARK_STAGES; i++)
        if (!P->ahead[i] && (s < 0 || (P->bytes[s] < (size_t)n * es && P->bytes[i] > P->bytes[s]))) s = i;
    if (s < 0) return LMX_OK; /* every stage holds a block to come: next is reloaded when asked */
    for (int i = 0; i < PARK_STAGES; i++)
        if (i != s && !P->ahead[i]) stage_free(cb, i);
    return park_fetch(cb, s, next, n, es);
}

lmx_status cuda_bwd_reload(lmx_backend *be, lmx_tensor *dst, const void *host, int64_t n, const void *next) {
    cuda_backend *cb = (cuda_backend *)be;
    lmx_status st = cuda_graph_flush(cb);
    const lmx_dtype dt = cuda_bwd_keep_dtype(be);
    const size_t es = lmx_dtype_size(dt);
    if (st || n <= 0 || (st = spread_send(cb, 1))) return st; /* every block on its way before any comes back */
    if (!dst) return next ? park_ahead(cb, next, n, es) : LMX_OK;
    if (lmx_tensor_nelem(dst) < n) return lmx_err_set(&be->err, LMX_ERR_SHAPE, "reload: %lld values into a tensor of %lld",
                                                      (long long)n, (long long)lmx_tensor_nelem(dst));
    if (dst->dtype != LMX_DTYPE_F32 && dst->dtype != dt)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "reload: into a tensor of dtype %d", (int)dst->dtype);
    if ((st = park_ready(cb, 0, 0, 0))) return st; /* the park itself */
    cuda_park *P = cb->park;
    int s = -1;
    for (int i = 0; i < PARK_STAGES && s < 0; i++)
        if (P->ahead[i] == host && P->ahead_n[i] == n) s = i;
    for (int i = 0; i < PARK_STAGES && s < 0; i++) /* not fetched ahead: a stage that holds nothing to come */
        if (!P->ahead[i]) s = i;
    if (s < 0) s = 0; /* every stage holds a block ahead that nobody took: stage 0's is dropped */
    for (int i = 0; i < PARK_STAGES; i++) /* the stages left from offload, and any other holding nothing to come */
        if (i != s && !P->ahead[i]) stage_free(cb, i);
    if (P->ahead[s] != host || P->ahead_n[s] != n) {
        P->ahead[s] = NULL;
        if ((st = park_fetch(cb, s, host, n, es))) return st;
    }
    P->ahead[s] = NULL;
    CUDA_TRY(cb, cudaStreamWaitEvent(cb->stream, P->ev_copy[s], 0), "reload");
    if (dst->dtype != LMX_DTYPE_F32 && dst->owned && (size_t)lmx_tensor_nelem(dst) * es == P->bytes[s]) {
        void *d = dst->data; /* the memories exchanged */
        dst->data = P->stage[s], P->stage[s] = d;
    } else {
        st = convert_into(cb, dst->data, dst->dtype, P->stage[s], dt, n, "reload");
    }
    if (st) return st;
    CUDA_TRY(cb, cudaEventRecord(P->ev_main[s], cb->stream), "reload");
    return next ? park_fetch(cb, s, next, n, es) : LMX_OK;
}
