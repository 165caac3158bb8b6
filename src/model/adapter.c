/* adapter.c - bind a LoRA adapter file to a model: check it against the model's projections,
 * widen it to f32 in the LoRA pair layout (A [r, K], B [N, r]), and hand it to the backend. */
#include "adapter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


const lmx_tensor *lmx_proj_weight(const lmx_layer *L, lmx_proj p) {
    switch (p) {
    case LMX_PROJ_Q: return &L->wq;
    case LMX_PROJ_K: return &L->wk;
    case LMX_PROJ_V: return &L->wv;
    case LMX_PROJ_O: return &L->wo;
    case LMX_PROJ_GATE: return &L->w_gate;
    case LMX_PROJ_UP: return &L->w_up;
    default: return &L->w_down;
    }
}

lmx_adapter *lmx_adapter_by_id(const lmx_model *m, unsigned id) {
    for (int i = 0; id && i < m->n_adapters; i++)
        if (m->adapters[i]->id == id) return m->adapters[i];
    return NULL;
}

lmx_status lmx_adapter_resolve(lmx_model *m, lmx_adapter *a, unsigned *id) {
    if (a == LMX_NO_ADAPTER) *id = 0;
    else if (!a && m->default_adapter && !lmx_adapter_by_id(m, m->default_adapter))
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the model's default adapter has been freed; set another "
                           "(lmx_model_set_adapter) or name one");
    else if (!a) *id = m->default_adapter;
    else if (a->m != m) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the adapter belongs to another model");
    else *id = a->id;
    return LMX_OK;
}

static void release_pairs(lmx_model *m, lmx_adapter *a) {
    for (int i = 0; a->pairs && i < m->cfg.n_layers * LMX_PROJ_N; i++) {
        if (a->pairs[i].a.data) m->be->ops->release(m->be, &a->pairs[i].a);
        if (a->pairs[i].b.data) m->be->ops->release(m->be, &a->pairs[i].b);
    }
}

static lmx_status upload(lmx_model *m, lmx_tensor *t, int64_t d0, int64_t d1, const float *host) {
    *t = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {d0, d1}};
    lmx_status st = m->be->ops->alloc(m->be, t);
    if (st == LMX_OK) st = m->be->ops->write(m->be, t, 0, host, (size_t)(d0 * d1) * sizeof(float));
    return st ? lmx_err_set(&m->err, st, "%s", m->be->err.msg) : LMX_OK;
}

static lmx_status bind(lmx_model *m, lmx_adapter *a, const lmx_lora_file *f) {
    const char *file = f->weights_path;
    char family[32];
    if (lmx_lora_arch_mismatch(f, lmx_arch_name(m->cfg.arch), family, sizeof family))
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "adapter_config.json: auto_mapping.base_model_class is %s (%s); "
                           "this model is %s", f->base_class, family, lmx_arch_name(m->cfg.arch));
    int nl = m->cfg.n_layers;
    a->pairs = calloc((size_t)nl * LMX_PROJ_N, sizeof *a->pairs);
    if (!a->pairs) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    int used[LMX_PROJ_N] = {0};
    a->info.first_layer = nl;
    a->info.last_layer = -1;
    for (int i = 0; i < f->n; i++) {
        const lmx_lora_entry *e = &f->e[i];
        if (e->layer >= nl)
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "%s: tensor %s is for layer %d; the model has %d layers", file,
                               LMX_QUOTED(e->a->name), e->layer, nl);
        if (f->num_layers > 0 && e->layer < nl - f->num_layers)
            return lmx_err_set(&m->err, LMX_ERR_FORMAT, "%s: tensor %s is for layer %d, outside the last num_layers = %d "
                               "of the model's %d", file, LMX_QUOTED(e->a->name), e->layer, f->num_layers, nl);
        if (e->rank > LMX_LORA_RANK_MAX)
            return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "%s: rank %d of %s is above lmx's limit %d", file, e->rank,
                               LMX_QUOTED(e->a->name), LMX_LORA_RANK_MAX);
        const lmx_tensor *w = lmx_proj_weight(&m->layers[e->layer], e->proj);
        if (!w->data && !lmx_layer_experts_only(m, e->layer))
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "%s: tensor %s adapts %s of layer %d, which that layer does not "
                               "have (it shares an earlier layer's keys and values, or takes K = V)", file,
                               LMX_QUOTED(e->a->name), lmx_proj_module(e->proj), e->layer);
        if (!w->data)
            return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "%s: tensor %s adapts %s of layer %d, which has experts "
                               "(adapters on experts are not supported)", file, LMX_QUOTED(e->a->name),
                               lmx_proj_module(e->proj), e->layer);
        int64_t N = w->shape[0], K = w->shape[1], r = e->rank;
        int64_t aK = e->transposed ? e->a->shape[0] : e->a->shape[1];
        int64_t bN = e->transposed ? e->b->shape[1] : e->b->shape[0];
        if (aK != K || bN != N)
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "%s: tensor %s is [%lld, %lld]: it does not fit %s of layer %d "
                               "(%lld inputs, %lld outputs)", file, aK != K ? LMX_QUOTED(e->a->name) : LMX_QUOTED(e->b->name),
                               (long long)(aK != K ? e->a->shape[0] : e->b->shape[0]),
                               (long long)(aK != K ? e->a->shape[1] : e->b->shape[1]), lmx_proj_module(e->proj), e->layer,
                               (long long)K, (long long)N);
        float *A = malloc((size_t)(r * K) * sizeof *A), *B = malloc((size_t)(N * r) * sizeof *B);
        int rope_heads = !m->interleaved_rope                                 ? 0
                         : e->proj == LMX_PROJ_Q ? m->cfg.n_heads
                         : e->proj == LMX_PROJ_K ? m->cfg.n_kv_heads : 0;
        lmx_status st = A && B ? lmx_lora_widen(e, K, N, rope_heads, A, B, &m->err)
                               : lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        if (st) lmx_err_prefix(&m->err, "%s", file);
        lmx_lora_pair *p = &a->pairs[e->layer * LMX_PROJ_N + e->proj];
        if (st == LMX_OK) st = upload(m, &p->a, r, K, A);
        if (st == LMX_OK) st = upload(m, &p->b, N, r, B);
        free(A);
        free(B);
        if (st) return st;
        p->scale = e->scale;
        used[e->proj] = 1;
        if (e->rank > a->info.rank) a->info.rank = e->rank;
        if (i == 0) a->info.scale = e->scale;
        else if (e->scale != a->info.scale) a->info.scales_differ = 1;
        if (e->layer < a->info.first_layer) a->info.first_layer = e->layer;
        if (e->layer > a->info.last_layer) a->info.last_layer = e->layer;
        a->info.n_modules++;
        a->info.n_params += r * (K + N);
    }
    size_t len = 0;
    for (int p = 0; p < LMX_PROJ_N; p++) {
        if (used[p]) len += (size_t)snprintf(a->targets + len, sizeof a->targets - len, "%s%s", len ? "," : "",
                                             lmx_proj_short((lmx_proj)p));
        if (used[p]) a->spec.targets |= 1u << p;
    }
    a->spec.rank = a->info.rank;
    a->spec.alpha = (double)a->info.scale * a->info.rank;
    a->spec.num_layers = a->info.first_layer > 0 ? nl - a->info.first_layer : 0;
    a->spec.dropout = f->dropout; /* what a trainer on this adapter goes on with */
    return LMX_OK;
}

static void adapter_destroy(lmx_adapter *a) {
    release_pairs(a->m, a);
    free(a->pairs);
    free(a->path);
    free(a);
}

lmx_status lmx_adapter_reserve(lmx_model *m) {
    if (m->n_adapters < m->cap_adapters) return LMX_OK;
    int cap = m->cap_adapters ? 2 * m->cap_adapters : 4;
    lmx_adapter **na = realloc(m->adapters, (size_t)cap * sizeof *na);
    if (!na) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    m->adapters = na;
    m->cap_adapters = cap;
    return LMX_OK;
}

lmx_status lmx_adapter_load(lmx_model *m, const char *path, lmx_adapter **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    lmx_err_clear(&m->err);
    if (m->bridge) /* mlx-lm applies its adapter itself */
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the mlx_lm backend takes an adapter at load only "
                                                          "(lmx_load_params.adapter, an mlx-lm adapter folder)");
    lmx_status st = lmx_adapter_reserve(m);
    if (st) return st;
    lmx_lora_file f;
    st = lmx_lora_file_open(path, &f, &m->err);
    if (st) return st;
    lmx_adapter *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        free(a);
        lmx_lora_file_close(&f);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    a->m = m;
    st = bind(m, a, &f);
    a->info.format = f.format == LMX_LORA_PEFT ? "peft" : "mlx";
    lmx_lora_file_close(&f);
    if (st) {
        adapter_destroy(a);
        return st;
    }
    a->id = ++m->adapter_seq;
    a->info.path = a->path;
    a->info.targets = a->targets;
    m->adapters[m->n_adapters++] = a;
    *out = a;
    return LMX_OK;
}

void lmx_adapter_free(lmx_adapter *a) {
    if (!a || a == LMX_NO_ADAPTER) return;
    lmx_model *m = a->m;
    for (int i = 0; i < m->n_adapters; i++)
        if (m->adapters[i] == a) {
            m->adapters[i] = m->adapters[--m->n_adapters];
            break;
        }
    adapter_destroy(a); /* a default naming it stays, and fails, until another is set */
}

void lmx_adapters_free_all(lmx_model *m) {
    while (m->n_adapters > 0) lmx_adapter_free(m->adapters[m->n_adapters - 1]);
    free(m->adapters);
    m->adapters = NULL;
    m->cap_adapters = 0;
}

lmx_status lmx_adapter_get_info(const lmx_adapter *a, lmx_adapter_info *out) {
    if (!a || a == LMX_NO_ADAPTER || !out) return LMX_ERR_INVALID_ARG;
    *out = a->info;
    return LMX_OK;
}

lmx_status lmx_model_set_adapter(lmx_model *m, lmx_adapter *a) {
    if (!m) return LMX_ERR_INVALID_ARG;
    if (a && a != LMX_NO_ADAPTER && a->m != m)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the adapter belongs to another model");
    m->default_adapter = a && a != LMX_NO_ADAPTER ? a->id : 0;
    return LMX_OK;
}
