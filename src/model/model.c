/* model.c - lmx_model_load / lmx_model_free / info, and the per-thread error of handle-less calls. */
#include "model.h"
#include "adapter.h"

#include <stdlib.h>
#include <string.h>

#include "../base/fileio.h"
#include "../runtime/bridge.h"
#include "../runtime/runtime.h"

static _Thread_local lmx_err thread_err; /* per thread, like errno: for calls with no handle */

void lmx_set_thread_error(const lmx_err *err) { thread_err = *err; }

const char *lmx_last_error(const lmx_model *m) {
    if (m) return m->err.status == LMX_OK ? "" : m->err.msg;
    return thread_err.status == LMX_OK ? "" : thread_err.msg;
}

lmx_load_params lmx_load_default_params(void) {
    lmx_load_params p = {.backend = "auto", .n_threads = 0, .n_ctx = 0, .seed = 0};
    return p;
}

void lmx_model_free(lmx_model *m) {
    if (!m) return;
    lmx_bridge_free(m->bridge);
    lmx_runtime_free(m);
    lmx_adapters_free_all(m);
    if (m->be) {
        lmx_workspace_free(m->be, &m->ws);
        if (m->unit_norm.data) m->be->ops->release(m->be, &m->unit_norm);
        lmx_backend_free(m->be);
    }
    lmx_st_set_close(m->weights);
    lmx_gguf_weights_free(&m->gguf);
    for (int l = 0; m->layers && l < m->cfg.n_layers; l++) {
        free(m->layers[l].experts);
        free(m->layers[l].expert_scale);
    }
    lmx_config_free(&m->cfg);
    free(m->layers);
    free(m->inv_freq);
    free(m);
}

lmx_status lmx_model_load(const char *path, const lmx_load_params *params, lmx_model **out) {
    lmx_err err = {0};
    lmx_status st;
    if (!out) {
        st = lmx_err_set(&err, LMX_ERR_INVALID_ARG, "lmx_model_load: out is NULL");
        lmx_set_thread_error(&err);
        return st;
    }
    *out = NULL;
    lmx_load_params dp = lmx_load_default_params();
    if (!params) params = &dp;
    if (params->backend && !strcmp(params->backend, LMX_BRIDGE_BACKEND)) return lmx_bridge_model_load(path, params, out);
    lmx_model *m = calloc(1, sizeof *m);
    if (!m) {
        st = lmx_err_set(&err, LMX_ERR_NOMEM, "out of memory");
        lmx_set_thread_error(&err);
        return st;
    }
    if (path && lmx_is_file(path)) {
        if (!lmx_gguf_is_gguf(path)) {
            st = lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "%s: neither a model directory nor a GGUF file", path);
            goto fail;
        }
        if ((st = lmx_gguf_model_open(path, &m->cfg, &m->gguf, &m->interleaved_rope, &m->norms_stored_plus_one,
                                      &m->err)))
            goto fail;
    } else if (!path || !lmx_is_dir(path)) {
        st = lmx_err_set(&m->err, LMX_ERR_IO, "%s: no such model directory or file", path ? path : "(null)");
        goto fail;
    } else {
        if ((st = lmx_config_load(path, &m->cfg, &m->err))) goto fail;
        if ((st = lmx_st_set_open_dir(path, &m->weights, &m->err))) goto fail;
    }
    if (params->n_ctx < 0) {
        st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "context length %d is negative", params->n_ctx);
        goto fail;
    }
    if (params->memory_limit < 0 || params->cache_limit < 0) {
        st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a negative %s limit",
                         params->memory_limit < 0 ? "memory" : "cache");
        goto fail;
    }
    if ((st = lmx_backend_create(params->backend, params->n_threads, &m->be, &m->err))) goto fail;
    m->be->mem_limit = params->memory_limit;
    if (params->memory_limit > 0) { /* a model that cannot fit fails before any weight is copied */
        int64_t need = m->weights ? (int64_t)lmx_st_set_total_bytes(m->weights) : 0;
        for (size_t i = 0; i < m->gguf.n; i++) need += (int64_t)m->gguf.t[i].nbytes;
        if (need > params->memory_limit) {
            st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory: limit %lld bytes, would need %lld bytes for "
                             "the weights of %s", (long long)params->memory_limit, (long long)need, path);
            goto fail;
        }
    }
    m->progress = params->progress;
    m->progress_user = params->progress_user;
    m->embed_on_host = params->embed_on_host;
    if ((st = lmx_model_bind(m))) {
        lmx_err_prefix(&m->err, "%s", path);
        goto fail;
    }
    m->progress = NULL;
    if ((st = lmx_runtime_create(m, path, params))) goto fail;
    if (params->adapter) {
        lmx_adapter *a = NULL;
        if ((st = lmx_adapter_load(m, params->adapter, &a))) {
            lmx_err_prefix(&m->err, "adapter");
            goto fail;
        }
        m->default_adapter = a->id;
    }
    *out = m;
    return LMX_OK;
fail:
    lmx_set_thread_error(&m->err);
    lmx_model_free(m);
    return st;
}

void *lmx_host_alloc(lmx_model *m, size_t bytes) {
    if (!m) return NULL;
    const lmx_backend_ops *op = m->be ? m->be->ops : NULL;
    return op && op->host_alloc ? op->host_alloc(m->be, bytes) : malloc(bytes);
}

void lmx_host_free(lmx_model *m, void *p) {
    if (!m || !p) return;
    const lmx_backend_ops *op = m->be ? m->be->ops : NULL;
    if (op && op->host_free) op->host_free(m->be, p);
    else free(p);
}

lmx_status lmx_model_get_info(const lmx_model *m, lmx_model_info *out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if (m->bridge) return lmx_bridge_get_info(m, out);
    const lmx_config *c = &m->cfg;
    out->architecture = lmx_arch_name(c->arch);
    out->backend = m->be->ops->name;
    out->dtype = m->dtype_name;
    out->n_layers = c->n_layers;
    out->hidden_size = c->hidden;
    out->n_heads = c->n_heads;
    out->n_kv_heads = c->n_kv_heads;
    out->head_dim = m->head_dim;
    out->ffn_size = c->ffn;
    out->vocab_size = c->vocab;
    out->max_context = c->max_positions;
    out->n_params = m->n_params;
    out->weight_bytes = m->weight_bytes;
    out->n_eos = c->n_eos;
    memcpy(out->eos_ids, c->eos_ids, sizeof out->eos_ids);
    out->bos_id = c->bos_id;
    out->n_ctx = m->rt ? m->rt->n_ctx : 0;
    out->memory_bytes = m->be->mem_now;
    out->peak_memory_bytes = m->be->mem_peak;
    if (m->lm_head.data != m->embed.data) out->table_bytes += lmx_weight_bytes(&m->embed);
    if (m->embed_ple.data) out->table_bytes += lmx_weight_bytes(&m->embed_ple);
    if (c->layer_moe) {
        out->n_experts = c->n_experts;
        out->n_experts_used = c->n_experts_used;
        for (int l = 0; l < c->n_layers; l++) {
            const lmx_tensor *ex = m->layers[l].experts; /* NULL: a dense layer */
            for (int i = 0; ex && i < 3 * c->n_experts; i++) out->expert_bytes += lmx_weight_bytes(&ex[i]);
        }
    }
    return LMX_OK;
}
