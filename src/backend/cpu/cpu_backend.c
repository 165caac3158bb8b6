/* cpu_backend.c - the cpu backend: memory, elementwise ops, norms, RoPE, KV caches.
 *
 * Weights are aliased from the mmapped files (zero copy, stored dtype).  Activations are float32
 * in 64-byte aligned host memory.  Matmul and attention live in cpu_matmul.c / cpu_attention.c;
 * this file holds the table that ties them together. */
#include "../backward.h"
#include "cpu_backend.h"
#include "act.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../base/half.h"

/* ---- memory -------------------------------------------------------------------------------- */

static lmx_status cpu_upload_weight(lmx_backend *be, lmx_tensor *w) {
    int64_t bytes = lmx_weight_bytes(w); /* used in place, but counted against the limit */
    lmx_status st = lmx_backend_mem_check(be, bytes);
    if (st) return st;
    be->mem_mapped += bytes;
    w->owned = 0; /* the mapping outlives the model's use of it */
    return LMX_OK;
}

static size_t alloc_bytes(const lmx_tensor *t) {
    size_t bytes = (size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype);
    size_t rounded = (bytes + 63) / 64 * 64;
    return rounded ? rounded : 64;
}

static lmx_status cpu_alloc(lmx_backend *be, lmx_tensor *t) {
    size_t bytes = (size_t)lmx_tensor_nelem(t) * lmx_dtype_size(t->dtype);
    size_t rounded = alloc_bytes(t);
    lmx_status st = lmx_backend_mem_check(be, (int64_t)rounded);
    if (st) return st;
    void *p = aligned_alloc(64, rounded);
    if (!p) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: cannot allocate %zu bytes", bytes);
    memset(p, 0, rounded);
    t->data = p;
    t->owned = 1;
    lmx_backend_mem(be, (int64_t)rounded);
    return LMX_OK;
}

static void cpu_release(lmx_backend *be, lmx_tensor *t) {
    if (t->owned) {
        free(t->data);
        lmx_backend_mem(be, -(int64_t)alloc_bytes(t));
    }
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
        lmx_ggml_dequant_row(cb->k.ggml_simd, w->q.ggml_type, (const char *)w->data + (size_t)row * rb, n, dst);
        return;
    }
    const char *src = w->data; /* at any alignment (kernels.h) */
    switch (w->dtype) {
    case LMX_DTYPE_F32: memcpy(dst, src + row * n * 4, (size_t)n * 4); break;
    case LMX_DTYPE_BF16: cb->k.bf16_to_f32(dst, src + row * n * 2, n); break;
    case LMX_DTYPE_F16: cb->k.f16_to_f32(dst, src + row * n * 2, n); break;
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

typedef struct rmsnorm_job {
    const lmx_cpu_kernels *k;
    const float *x, *w;
    float *out;
    int rows, n, per_task;
    float eps;
} rmsnorm_job;

static void rmsnorm_task(void *arg, int task, int thread) {
    const rmsnorm_job *j = arg;
    int r0 = task * j->per_task, r1 = r0 + j->per_task < j->rows ? r0 + j->per_task : j->rows;
    int n = j->n;
    for (int r = r0; r < r1; r++) {
        const float *xr = j->x + (int64_t)r * n;
        float *orow = j->out + (int64_t)r * n;
        double ss = j->k->sumsq_f32(xr, n);
        float inv = (float)(1.0 / sqrt(ss / n + j->eps));
        for (int i = 0; i < n; i++) orow[i] = xr[i] * inv * j->w[i];
    }
}

/* Rows are split over the pool when there are several (prefill); one row runs inline. */
static lmx_status cpu_rmsnorm(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x,
                              const lmx_tensor *w, int rows, int n, float eps, float add_one) {
    cpu_backend *cb = (cpu_backend *)be;
    float *wf = cpu_scratch(cb, 0, (size_t)n);
    if (!wf) return lmx_err_prefix(&be->err, "rmsnorm");
    cpu_row_to_f32(cb, wf, w, 0, n);
    for (int i = 0; i < n; i++) wf[i] += add_one;
    rmsnorm_job j = {.k = &cb->k, .x = x->data, .w = wf, .out = out->data, .rows = rows, .n = n, .eps = eps};
    int threads = lmx_pool_size(cb->pool);
    j.per_task = rows >= 8 ? (rows + 2 * threads - 1) / (2 * threads) : rows;
    if (j.per_task < 1) j.per_task = 1;
    int tasks = (rows + j.per_task - 1) / j.per_task;
    if (tasks <= 1) rmsnorm_task(&j, 0, 0);
    else lmx_pool_run(cb->pool, tasks, rmsnorm_task, &j);
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

typedef struct glu_job {
    float *o;
    const float *g, *u;
    int64_t n, chunk;
    lmx_act act;
    int simd; /* AVX-512 (act.h) */
} glu_job;

static void glu_range(int simd, float *o, const float *g, const float *u, int64_t n, lmx_act act) {
#if defined(LMX_HAVE_X86_SIMD)
    if (simd) {
        if (act == LMX_ACT_SILU) lmx_glu_silu_avx512(o, g, u, n);
        else lmx_glu_gelu_avx512(o, g, u, n);
        return;
    }
#endif
    if (act == LMX_ACT_SILU) {
        for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    } else {
        for (int64_t i = 0; i < n; i++) o[i] = gelu_tanh(g[i]) * u[i];
    }
}

void cpu_glu_range(const cpu_backend *cb, float *o, const float *g, const float *u, int64_t n, lmx_act act) {
    glu_range(!strcmp(cb->k.isa, "avx512"), o, g, u, n, act);
}

static void glu_task(void *arg, int task, int thread) {
    const glu_job *j = arg;
    int64_t i0 = (int64_t)task * j->chunk, i1 = i0 + j->chunk;
    if (i1 > j->n) i1 = j->n;
    glu_range(j->simd, j->o + i0, j->g + i0, j->u + i0, i1 - i0, j->act);
}

/* Split over the pool in chunks of at least 4096 elements (decode rows stay on one thread). */
static lmx_status cpu_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate,
                          const lmx_tensor *up, int64_t n, lmx_act act) {
    cpu_backend *cb = (cpu_backend *)be;
    glu_job j = {.o = out->data, .g = gate->data, .u = up->data, .n = n, .act = act,
                 .simd = !strcmp(cb->k.isa, "avx512")};
    int threads = lmx_pool_size(cb->pool);
    j.chunk = (n + threads - 1) / threads;
    if (j.chunk < 4096) j.chunk = 4096;
    j.chunk = (j.chunk + 15) / 16 * 16;
    int tasks = (int)((n + j.chunk - 1) / j.chunk);
    if (tasks <= 1) glu_task(&j, 0, 0);
    else lmx_pool_run(cb->pool, tasks, glu_task, &j);
    return LMX_OK;
}

static lmx_status cpu_softcap(lmx_backend *be, lmx_tensor *x, int64_t n, float cap) {
    float *xs = x->data;
    for (int64_t i = 0; i < n; i++) xs[i] = cap * tanhf(xs[i] / cap);
    return LMX_OK;
}

typedef struct rope_job {
    float *x;
    const lmx_batch *batch;
    int nh, hd;
    const lmx_rope *rope;
    float *tab;  /* cached cos/sin table (cpu_rope_cache), or NULL */
    int fill;    /* 1: compute the table rows first */
} rope_job;

/* Task = one row (sequence b, token t) of the batch.  Angles are computed in double and rounded
 * to float exactly as without the table. */
static void rope_task(void *arg, int task, int thread) {
    const rope_job *j = arg;
    const lmx_batch *batch = j->batch;
    const lmx_rope *rope = j->rope;
    int b = task / batch->T, t = task % batch->T;
    if (t >= batch->n_new[b]) return;
    int half = rope->rot_dim / 2, nh = j->nh, hd = j->hd;
    double pos = (double)(batch->n_past[b] + t);
    float *row = j->x + ((int64_t)b * batch->T + t) * nh * hd;
    float *tab = j->tab ? j->tab + (int64_t)task * rope->rot_dim : NULL;
    for (int i = 0; i < half; i++) {
        float c, s;
        if (!tab || j->fill) {
            double ang = pos * rope->inv_freq[i];
            c = (float)cos(ang) * rope->attn_factor;
            s = (float)sin(ang) * rope->attn_factor;
            if (tab) tab[2 * i] = c, tab[2 * i + 1] = s;
        } else {
            c = tab[2 * i], s = tab[2 * i + 1];
        }
        int a = rope->interleaved ? 2 * i : i, bb = rope->interleaved ? 2 * i + 1 : i + half;
        for (int h = 0; h < nh; h++) {
            float *v = row + (int64_t)h * hd;
            float x1 = v[a], x2 = v[bb];
            v[a] = x1 * c - x2 * s;
            v[bb] = x2 * c + x1 * s;
        }
    }
}

/* Free a rope cache entry's arrays (its bytes stay counted: the caller uncounts them) and clear it. */
static void rope_entry_free(cpu_rope_cache *e) {
    free(e->tab), free(e->inv_freq), free(e->pos);
    memset(e, 0, sizeof *e);
}

/* The cache entry for this call's positions and frequencies: *fill = 0 when it already holds the
 * table, 1 when the caller must compute it.  NULL (no caching) if memory runs out. */
static float *rope_table(cpu_backend *cb, const lmx_batch *bt, const lmx_rope *rope, int *fill) {
    int half = rope->rot_dim / 2, rows = bt->B * bt->T;
    cpu_rope_cache *e = NULL, *old = &cb->rope[0];
    cb->rope_clock++;
    for (int i = 0; i < CPU_ROPE_CACHE; i++) {
        cpu_rope_cache *c = &cb->rope[i];
        if (c->used && c->B == bt->B && c->T == bt->T && c->rot_dim == rope->rot_dim &&
            c->attn_factor == rope->attn_factor && !memcmp(c->inv_freq, rope->inv_freq, (size_t)half * sizeof(float)) &&
            !memcmp(c->pos, bt->n_past, (size_t)bt->B * sizeof(int)) &&
            !memcmp(c->pos + bt->B, bt->n_new, (size_t)bt->B * sizeof(int))) {
            c->stamp = cb->rope_clock;
            *fill = 0;
            return c->tab;
        }
        if (!c->used || c->stamp < old->stamp) old = c;
    }
    e = old;
    e->used = 0;
    if (e->rows_alloc < rows * rope->rot_dim || e->n_freq_alloc < half || e->pos_alloc < bt->B) {
        lmx_backend_mem(&cb->base, -(int64_t)e->bytes);
        rope_entry_free(e);
        size_t want = ((size_t)rows * rope->rot_dim + (size_t)half) * sizeof(float) + (size_t)2 * bt->B * sizeof(int);
        if (!lmx_backend_mem_fits(&cb->base, (int64_t)want))
            return NULL; /* over the memory limit: no table, the angles are computed in place */
        e->tab = malloc((size_t)rows * rope->rot_dim * sizeof(float));
        e->inv_freq = malloc((size_t)half * sizeof(float));
        e->pos = malloc((size_t)2 * bt->B * sizeof(int));
        if (!e->tab || !e->inv_freq || !e->pos) {
            rope_entry_free(e);
            return NULL;
        }
        e->rows_alloc = rows * rope->rot_dim, e->n_freq_alloc = half, e->pos_alloc = bt->B;
        e->bytes = want;
        lmx_backend_mem(&cb->base, (int64_t)e->bytes);
    }
    e->B = bt->B, e->T = bt->T, e->rot_dim = rope->rot_dim, e->attn_factor = rope->attn_factor;
    memcpy(e->inv_freq, rope->inv_freq, (size_t)half * sizeof(float));
    memcpy(e->pos, bt->n_past, (size_t)bt->B * sizeof(int));
    memcpy(e->pos + bt->B, bt->n_new, (size_t)bt->B * sizeof(int));
    e->used = 1, e->stamp = cb->rope_clock;
    *fill = 1;
    return e->tab;
}

/* Prefill (8 rows or more): rows over the pool, cos/sin from the cache; decode rows inline. */
static lmx_status cpu_rope(lmx_backend *be, lmx_tensor *x, const lmx_batch *batch, int nh,
                           int hd, const lmx_rope *rope) {
    cpu_backend *cb = (cpu_backend *)be;
    rope_job j = {.x = x->data, .batch = batch, .nh = nh, .hd = hd, .rope = rope};
    int tasks = batch->B * batch->T;
    if (tasks < 8) {
        for (int t = 0; t < tasks; t++) rope_task(&j, t, 0);
    } else {
        j.tab = rope_table(cb, batch, rope, &j.fill);
        lmx_pool_run(cb->pool, tasks, rope_task, &j);
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
    lmx_status st = lmx_backend_mem_check(be, 2 * (int64_t)(bytes - (kv->k.owned ? old : 0)));
    if (st) return lmx_err_prefix(&be->err, "KV cache of %d positions", cap);
    lmx_tensor *ts[2] = {&kv->k, &kv->v};
    for (int i = 0; i < 2; i++) {
        void *p = realloc(ts[i]->owned ? ts[i]->data : NULL, bytes);
        if (!p) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "cpu: cannot grow KV cache to %d positions", cap);
        memset((char *)p + old, 0, bytes - old);
        lmx_backend_mem(be, ts[i]->owned ? (int64_t)(bytes - old) : (int64_t)bytes);
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

float *cpu_work(lmx_backend *be, size_t n, const char *what) {
    if (lmx_backend_mem_check(be, (int64_t)(n * sizeof(float)))) {
        lmx_err_prefix(&be->err, "%s", what);
        return NULL;
    }
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        lmx_err_set(&be->err, LMX_ERR_NOMEM, "%s: out of memory", what);
        return NULL;
    }
    lmx_backend_mem(be, (int64_t)(n * sizeof(float)));
    return p;
}

void cpu_work_free(lmx_backend *be, float *p, size_t n) {
    if (!p) return;
    free(p);
    lmx_backend_mem(be, -(int64_t)(n * sizeof(float)));
}

float *cpu_scratch(cpu_backend *cb, int slot, size_t n_floats) {
    if (n_floats > cb->scratch_n[slot]) {
        if (lmx_backend_mem_check(&cb->base, (int64_t)(n_floats - cb->scratch_n[slot]) * (int64_t)sizeof(float)))
            return NULL; /* be->err says why */
        float *p = aligned_alloc(64, (n_floats * sizeof(float) + 63) / 64 * 64);
        if (!p) {
            lmx_err_set(&cb->base.err, LMX_ERR_NOMEM, "cpu: cannot allocate %zu bytes of scratch", n_floats * sizeof(float));
            return NULL;
        }
        lmx_backend_mem(&cb->base, (int64_t)(n_floats - cb->scratch_n[slot]) * (int64_t)sizeof(float));
        free(cb->scratch[slot]);
        cb->scratch[slot] = p;
        cb->scratch_n[slot] = n_floats;
    }
    return cb->scratch[slot];
}

static int64_t cpu_cached_bytes(const lmx_backend *be) {
    const cpu_backend *cb = (const cpu_backend *)be;
    int64_t n = 0;
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) n += (int64_t)cb->scratch_n[i] * (int64_t)sizeof(float);
    for (int i = 0; i < CPU_MAX_THREADS; i++) n += (int64_t)cb->attn_scratch_n[i] * (int64_t)sizeof(float);
    for (int i = 0; i < CPU_ROPE_CACHE; i++) n += (int64_t)cb->rope[i].bytes;
    return n;
}

static void cpu_trim(lmx_backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    lmx_backend_mem(be, -cpu_cached_bytes(be));
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) free(cb->scratch[i]), cb->scratch[i] = NULL, cb->scratch_n[i] = 0;
    for (int i = 0; i < CPU_MAX_THREADS; i++)
        free(cb->attn_scratch[i]), cb->attn_scratch[i] = NULL, cb->attn_scratch_n[i] = 0;
    for (int i = 0; i < CPU_ROPE_CACHE; i++) rope_entry_free(&cb->rope[i]);
}

/* ---- the table --------------------------------------------------------------------------- */

static void cpu_destroy(lmx_backend *be) {
    cpu_backend *cb = (cpu_backend *)be;
    if (!cb) return;
    lmx_pool_free(cb->pool);
    for (int i = 0; i < CPU_SCRATCH_SLOTS; i++) free(cb->scratch[i]);
    for (int i = 0; i < CPU_MAX_THREADS; i++) free(cb->attn_scratch[i]);
    for (int i = 0; i < CPU_ROPE_CACHE; i++) rope_entry_free(&cb->rope[i]);
    free(cb);
}

static lmx_status cpu_scatter_add_rows(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, const int *rows,
                                       const float *w, int R, int64_t n) {
    const cpu_backend *cb = (const cpu_backend *)be;
    for (int r = 0; r < R; r++)
        cb->k.axpy_f32((float *)y->data + (int64_t)rows[r] * n, w[r], (const float *)x->data + (int64_t)r * n, n);
    return LMX_OK;
}

static lmx_status cpu_scale(lmx_backend *be, lmx_tensor *x, int64_t n, float s) {
    float *xs = x->data;
    if (s == 0.0f) memset(xs, 0, (size_t)n * sizeof *xs);
    else
        for (int64_t i = 0; i < n; i++) xs[i] *= s;
    return LMX_OK;
}

static const lmx_backend_ops cpu_ops = {
    .name = "cpu",
    .backward = &lmx_cpu_backward,
    .kv_dtype = LMX_DTYPE_F32,
    .topk = NULL, /* the logits are on the host already */
    .prefill_chunk = 512,
    .destroy = cpu_destroy,
    .upload_weight = cpu_upload_weight,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .write = cpu_write,
    .read = cpu_read,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .lora = cpu_lora,
    .add = cpu_add,
    .glu = cpu_glu,
    .softcap = cpu_softcap,
    .rope = cpu_rope,
    .attention = cpu_attention,
    .kv_append = cpu_kv_append,
    .kv_reserve = cpu_kv_reserve,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .moe = cpu_moe,
    .scale = cpu_scale,
    .trim = cpu_trim,
    .cached_bytes = cpu_cached_bytes,
};

lmx_status lmx_cpu_backend_create(int n_threads, lmx_backend **out, lmx_err *err) {
    *out = NULL;
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return lmx_err_set(err, LMX_ERR_NOMEM, "cpu backend: out of memory");
    cb->base.ops = &cpu_ops;
    lmx_cpu_kernels_init(&cb->k, getenv("LMX_CPU_ISA"));
    cb->qmatvec = lmx_qmatvec_scalar;
    const char *mo = getenv("LMX_CPU_MOE");
    cb->moe_op = !(mo && mo[0] == '0');
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
