/* memory.c - a model's memory controls: the memory limit, the cache limit, clearing the cache,
 * active / peak / cached memory (lmx_memory_info).
 *
 * The accounting lives in the backend (lmx_backend.mem_*): every allocation asks
 * lmx_backend_mem_check first, so the limit holds on every backend.  What counts as "cached" is
 * what can go without losing anything but speed: the prompt cache's KV and the backend's scratch
 * buffers (ops->trim frees them; they grow again on demand). */
#include "runtime.h"

static int64_t prompt_cache_bytes(const lmx_model *m) {
    return m->rt && m->rt->ctx ? lmx_context_bytes(m->rt->ctx) : 0;
}

static int64_t scratch_bytes(const lmx_model *m) {
    return m->be->ops->cached_bytes ? m->be->ops->cached_bytes(m->be) : 0;
}

/* A stream that is open and unfinished still evaluates into the prompt cache's context. */
static int stream_running(const lmx_model *m) {
    return m->rt && m->rt->stream.open && m->rt->stream.seq.finish == LMX_FINISH_NONE;
}

static void drop_prompt_cache(lmx_model *m) {
    lmx_runtime *rt = m->rt;
    if (!rt || !rt->ctx || stream_running(m)) return;
    lmx_context_free(rt->ctx); /* lmx_runtime_ready creates it again */
    rt->ctx = NULL;
    rt->hist.len = 0;
    rt->n_cand = 0;
}

static void drop_scratch(lmx_model *m) {
    if (m->be->ops->trim) m->be->ops->trim(m->be);
}

void lmx_runtime_trim(lmx_model *m) {
    int64_t limit = m->rt ? m->rt->cache_limit : 0;
    if (limit <= 0) return;
    if (prompt_cache_bytes(m) + scratch_bytes(m) > limit) drop_scratch(m);
    if (prompt_cache_bytes(m) + scratch_bytes(m) > limit) drop_prompt_cache(m);
}

lmx_status lmx_model_get_memory(const lmx_model *m, lmx_memory_info *out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    const lmx_backend *be = m->be;
    out->active_bytes = be->mem_now;
    out->peak_bytes = be->mem_peak;
    out->cached_bytes = prompt_cache_bytes(m) + scratch_bytes(m);
    out->mapped_bytes = be->mem_mapped;
    out->limit_bytes = be->mem_limit;
    out->cache_limit_bytes = m->rt ? m->rt->cache_limit : 0;
    return LMX_OK;
}

lmx_status lmx_model_set_memory_limit(lmx_model *m, int64_t bytes) {
    if (!m) return LMX_ERR_INVALID_ARG;
    if (bytes < 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a negative memory limit (%lld)", (long long)bytes);
    m->be->mem_limit = bytes;
    return LMX_OK;
}

lmx_status lmx_model_set_cache_limit(lmx_model *m, int64_t bytes) {
    if (!m) return LMX_ERR_INVALID_ARG;
    if (bytes < 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a negative cache limit (%lld)", (long long)bytes);
    m->rt->cache_limit = bytes;
    lmx_runtime_trim(m);
    return LMX_OK;
}

void lmx_model_clear_cache(lmx_model *m) {
    if (!m) return;
    drop_prompt_cache(m);
    drop_scratch(m);
}

void lmx_model_reset_peak_memory(lmx_model *m) {
    if (m) m->be->mem_peak = m->be->mem_now;
}
