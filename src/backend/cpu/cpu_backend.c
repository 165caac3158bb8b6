/* cpu_backend.c - the cpu backend: memory, elementwise ops, norms, RoPE, KV caches.
 *
 * Weights are aliased from the mmapped files (zero copy, stored dtype).  Activations are float32
 * in 64-byte aligned host memory.  Matmul and attention live in cpu_matmul.c / cpu_attention.c;
 * this file holds the table that ties them together. */
#include "cpu_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/half.h"

/* ---- memory -------------------------------------------------------------------------------- */

static lmx_status cpu_upload_weight(lmx_backend *be, lmx_tensor *w) {
    w->owned = 0; /* the mapping outlives the model's use of it */
    return LMX_OK;
}

static lmx_status cpu_alloc(lmx_backend *be, lmx_tensor *t) {
    size_t bytes = (size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype);
    size_t rounded = (bytes + 63) / 64 * 64;
    if (rounded == 0) rounded = 64;
    void *p = aligned_alloc(64, rounded);
    if (!p) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    t->data = p;
    t->owned = 1;
    return LMX_OK;
}

static void cpu_release(lmx_backend *be, lmx_tensor *t) {
    if (t->owned) free(t->data);
    t->data = NULL;
    t->owned = 0;
}

static lmx_status cpu_write(lmx_backend *be, lmx_tensor *t, size_t off, const void *src,
                            size_t n) {
    memcpy((char *)t->data + off, src, n);
    return LMX_OK;
}

static lmx_status cpu_read(lmx_backend *be, const lmx_tensor *t, size_t off, void *dst,
                           size_t n) {
    memcpy(dst, (const char *)t->data + off, n);
    return LMX_OK;
}

/* Widen n elements of a weight row (f32/bf16/f16) into dst. */
void cpu_row_to_f32(const cpu_backend *cb, float *dst, const lmx_tensor *w, int64_t row,
                    int64_t n) {
    if (w->q.bits) {
        lmx_dequant_row(w, row, dst);
        return;
    }
    if (w->q.ggml_type) {
        size_t rb = lmx_ggml_row_bytes(w->q.ggml_type, n);
        lmx_ggml_dequant_row(w->q.ggml_type, (const char *)w->data + (size_t)row * rb, n, dst);
        return;
    }
    switch (w->dtype) {
    case LMX_DTYPE_F32: memcpy(dst, (const float *)w->data + row * n, (size_t)n * 4); break;
    case LMX_DTYPE_BF16: cb->k.bf16_to_f32(dst, (const uint16_t *)w->data + row * n, n); break;
    case LMX_DTYPE_F16: cb->k.f16_to_f32(dst, (const uint16_t *)w->data + row * n, n); break;
    default: memset(dst, 0, (size_t)n * 4); break;
    }
}

/* ---- elementwise ------------------------------------------------------------------------- */

static lmx_status cpu_embed(lmx_backend *be, lmx_tensor *out, const lmx_tensor *table,
                            const int32_t *ids, int M, float scale) {
    cpu_backend *cb = (cpu_backend *)be;
    int64_t V = table->shape[0], C = table->shape[1];
    float *o = out->data;
    for (int m = 0; m < M; m++) {
        if (ids[m] < 0 || ids[m] >= V)
            return lmx_err_set(&be->err, LMX_ERR_INVALID_ARG, "token id %d outside vocabulary [0, %lld)",
                               ids[m], (long long)V);
        cpu_row_to_f32(cb, o + (int64_t)m * C, table, ids[m], C);
        if (scale != 1.0f)
            for (int64_t c = 0; c < C; c++) o[(int64_t)m * C + c] *= scale;
    }
    return LMX_OK;
}

static lmx_status cpu_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                              const lmx_tensor *w, int rows, int n, float eps, float add_one) {
    cpu_backend *cb = (cpu_backend *)be;
    float *wf = cpu_scratch(cb, 0, (size_t)n);
    if (!wf) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: out of memory in rmsnorm");
    cpu_row_to_f32(cb, wf, w, 0, n);
    for (int i = 0; i < n; i++) wf[i] += add_one;
    const float *xs = x->data;
    float *os = out->data;
    for (int r = 0; r < rows; r++) {
        const float *xr = xs + (int64_t)r * n;
        float *orow = os + (int64_t)r * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (double)xr[i] * xr[i];
        float inv = (float)(1.0 / sqrt(ss / n + eps));
        for (int i = 0; i < n; i++) orow[i] = xr[i] * inv * wf[i];
    }
    return LMX_OK;
}

static lmx_status cpu_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n) {
    float *ys = y->data;
    const float *xs = x->data;
    for (int64_t i = 0; i < n; i++) ys[i] += xs[i];
    return LMX_OK;
}

static float gelu_tanh(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}

static lmx_status cpu_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate,
                          const lmx_tensor *up, int64_t n, lmx_act act) {
    float *o = out->data;
    const float *g = gate->data, *u = up->data;
    if (act == LMX_ACT_SILU) {
        for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = gelu_tanh(g[i]) * u[i];
    }
    return LMX_OK;
}

static lmx_status cpu_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) {
    float *xs = x->data;
    for (int64_t i = 0; i < n; i++) xs[i] = cap * tanhf(xs[i] / cap);
    return LMX_OK;
}

static lmx_status cpu_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh,
                           int hd, const lmx_rope *rope) {
    int half = rope->rot_dim / 2;
    float *xs = x->data;
    for (int b = 0; b < batch->B; b++) {
        for (int t = 0; t < batch->n_new[b]; t++) {
            double pos = (double)(batch->n_past[b] + t);
            float *row = xs + ((int64_t)b * batch->T + t) * nh * hd;
            for (int i = 0; i < half; i++) {
                double ang = pos * rope->inv_freq[i];
                float c = (float)cos(ang) * rope->attn_factor;
                float s = (float)sin(ang) * rope->attn_factor;
                int a = rope->interleaved ? 2 * i : i, b = rope->interleaved ? 2 * i + 1 : i + half;
                for (int h = 0; h < nh; h++) {
                    float *v = row + (int64_t)h * hd;
                    float x1 = v[a], x2 = v[b];
                    v[a] = x1 * c - x2 * s;
                    v[b] = x2 * c + x1 * s;
                }
            }
        }
    }
    return LMX_OK;
}

static lmx_status cpu_gather_rows(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                                  const int *rows, int R, int64_t n) {
    for (int r = 0; r < R; r++)
        memcpy((float *)out->data + (int64_t)r * n, (const float *)x->data + (int64_t)rows[r] * n,
               (size_t)n * sizeof(float));
    return LMX_OK;
}

/* ---- KV cache ---------------------------------------------------------------------------- */

#define KV_CHUNK 256

static lmx_status cpu_kv_reserve(lmx_backend *be, lmx_kv_layer *kv, int need,
                                 int64_t row_elems) {
    if (kv->rotating || need <= kv->cap) return LMX_OK;
    int cap = (need + KV_CHUNK - 1) / KV_CHUNK * KV_CHUNK;
    size_t bytes = (size_t)cap * (size_t)row_elems * sizeof(float);
    size_t old = (size_t)kv->cap * (size_t)row_elems * sizeof(float);
    lmx_tensor *ts[2] = {&kv->k, &kv->v};
    for (int i = 0; i < 2; i++) {
        void *p = realloc(ts[i]->owned ? ts[i]->data : NULL, bytes);
        if (!p) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: cannot grow KV cache to %d positions", cap);
        memset((char *)p + old, 0, bytes - old);
        ts[i]->data = p;
        ts[i]->owned = 1;
        ts[i]->dtype = LMX_DTYPE_F32;
        ts[i]->ndim = 2;
        ts[i]->shape[0] = cap;
        ts[i]->shape[1] = row_elems;
    }
    kv->cap = cap;
    return LMX_OK;
}

static lmx_status cpu_kv_append(lmx_backend *be, lmx_kv_layer *const *kv,
                                const lmx_batch *batch, const lmx_tensor *k,
                                const lmx_tensor *v) {
    int64_t row = k->shape[k->ndim - 1];
    for (int b = 0; b < batch->B; b++) {
        lmx_kv_layer *c = kv[b];
        int n = batch->n_new[b];
        int first = 0;
        if (c->rotating && n > c->cap) first = n - c->cap; /* older rows would be overwritten */
        for (int t = first; t < n; t++) {
            int pos = batch->n_past[b] + t;
            if (!c->rotating && pos >= c->cap)
                return lmx_err_set(&be->err, LMX_ERR_CONTEXT_FULL, "KV cache holds %d positions, need %d",
                                   c->cap, pos + 1);
            int64_t slot = pos % c->cap;
            int64_t src = ((int64_t)b * batch->T + t) * row;
            memcpy((float *)c->k.data + slot * row, (const float *)k->data + src, (size_t)row * 4);
            memcpy((float *)c->v.data + slot * row, (const float *)v->data + src, (size_t)row * 4);
        }
    }
    return LMX_OK;
}

/* ---- scratch ----------------------------------------------------------------------------- */

float *cpu_scratch(cpu_backend *cb, int slot, size_t n_floats) {
    if (n_floats > cb->scratch_n[slot]) {
        float *p = aligned_alloc(64, (n_floats * sizeof(float) + 63) / 64 * 64);
        if (!p) return NULL;
        free(cb->scratch[slot]);
        cb->scratch[slot] = p;
        cb->scratch_n[slot] = n_floats;
    }
    return cb->scratch[slot];
}

/* ---- the table --------------------------------------------------------------------------- */

static void cpu_destroy(lmx_backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!cb) return;
    lmx_pool_free(cb->pool);
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) free(cb->scratch[i]);
    for (int i = 0; i < CPU_MAX_THREADS; i++) free(cb->attn_scratch[i]);
    free(cb);
}

static const lmx_backend_ops cpu_ops = {
    .name = "cpu",
    .kv_dtype = LMX_DTYPE_F32,
    .destroy = cpu_destroy,
    .upload_weight = cpu_upload_weight,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .write = cpu_write,
    .read = cpu_read,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .add = cpu_add,
    .glu = cpu_glu,
    .softcap = cpu_softcap,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_append = cpu_kv_append,
    .kv_reserve = cpu_kv_reserve,
    .gather_rows = cpu_gather_rows,
};

lmx_status lmx_cpu_backend_create(int n_threads, lmx_backend **out, lmx_err *err) {
    *out = NULL;
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return lmx_err_set(err, LMX_ERR_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    lmx_cpu_kernels_init(&cb->k, getenv("LMX_CPU_ISA"));
    cb->qmatvec = lmx_qmatvec_scalar;
    if (strcmp(cb->k.isa, "avx512") == 0 && lmx_qmatvec_avx512()) cb->qmatvec = lmx_qmatvec_avx512();
    if (n_threads > CPU_MAX_THREADS) n_threads = CPU_MAX_THREADS;
    lmx_status st = lmx_pool_create(n_threads, &cb->pool, err);
    if (st != LMX_OK) {
        free(cb);
        return st;
    }
    *out = &cb->base;
    return LMX_OK;
}
