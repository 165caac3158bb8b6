/* backend.c - picking a backend by name ("auto" may be pinned with the LMX_BACKEND variable). */
#include "backend.h"
#include "../formats/ggml_types.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int64_t lmx_tensor_nelem(const lmx_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

lmx_tensor lmx_tensor_rows(const lmx_tensor *t, int64_t row0, int64_t n) {
    lmx_tensor v = *t;
    const int64_t K = t->shape[1];
    size_t row_bytes;
    if (t->q.ggml_type) row_bytes = lmx_ggml_row_bytes(t->q.ggml_type, K);
    else if (t->q.bits) row_bytes = (size_t)(K * t->q.bits / 8);
    else row_bytes = (size_t)K * lmx_dtype_size(t->dtype);
    v.data = (char *)t->data + (size_t)row0 * row_bytes;
    if (t->q.bits) {
        const size_t sb = (size_t)(K / t->q.group) * lmx_dtype_size(t->q.scale_dtype);
        v.q.scales = (char *)t->q.scales + (size_t)row0 * sb;
        v.q.biases = (char *)t->q.biases + (size_t)row0 * sb;
    }
    v.shape[0] = n;
    v.owned = 0;
    return v;
}

void lmx_moe_pick(const float *z, int E, int K, double logit_scale, int norm_topk, const float *expert_scale, int *ex,
                  float *p) {
    double mx = z[0], sum = 0, ksum = 0;
    for (int e = 1; e < E; e++) mx = z[e] > mx ? z[e] : mx;
    for (int e = 0; e < E; e++) sum += exp(((double)z[e] - mx) * logit_scale);
    for (int k = 0; k < K; k++) { /* the k-th best: the largest logit not taken yet */
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int j = 0; j < k; j++) taken |= ex[j] == e;
            if (!taken && (best < 0 || z[e] > z[best])) best = e;
        }
        ex[k] = best;
        p[k] = (float)(exp(((double)z[best] - mx) * logit_scale) / sum);
        ksum += p[k];
    }
    for (int k = 0; norm_topk && k < K; k++) p[k] = (float)(p[k] / ksum);
    for (int k = 0; expert_scale && k < K; k++) p[k] *= expert_scale[ex[k]];
}

void lmx_moe_group(const int *pick, const float *pw, int M, int K, int E, int *count, int *off, int *rows, float *w) {
    memset(count, 0, (size_t)E * sizeof *count);
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K && pick[(int64_t)i * K] >= 0; k++) count[pick[(int64_t)i * K + k]]++;
    for (int e = 0, o = 0; e < E; e++) o += count[e], off[e] = o; /* each expert's end: filled from the back */
    for (int i = M - 1; i >= 0; i--)
        for (int k = K - 1; k >= 0 && pick[(int64_t)i * K] >= 0; k--) {
            const int j = --off[pick[(int64_t)i * K + k]];
            rows[j] = i, w[j] = pw[(int64_t)i * K + k];
        }
}

int64_t lmx_weight_bytes(const lmx_tensor *w) {
    int64_t N = w->ndim == 2 ? w->shape[0] : 1, K = w->ndim > 0 ? w->shape[w->ndim - 1] : 1;
    if (w->q.ggml_type) return (int64_t)lmx_ggml_row_bytes(w->q.ggml_type, K) * N;
    if (w->q.bits) {
        int64_t groups = w->q.group > 0 ? K / w->q.group : 0;
        return N * (K * w->q.bits / 32) * 4 + 2 * N * groups * (int64_t)lmx_dtype_size(w->q.scale_dtype);
    }
    return lmx_tensor_nelem(w) * (int64_t)lmx_dtype_size(w->dtype);
}

lmx_status lmx_backend_create(const char *name, int n_threads, lmx_backend **out, lmx_err *err) {
    *out = NULL;
    int is_auto = !name || !*name || strcmp(name, "auto") == 0;
    const char *env = is_auto ? getenv("LMX_BACKEND") : NULL; /* lets tests pin what "auto" means */
    if (env && *env && strcmp(env, "auto") != 0) {
        name = env;
        is_auto = 0;
    }
#ifdef LMX_HAVE_CUDA
    if (is_auto && lmx_cuda_device_count() > 0) {
        lmx_err ignored = {0}; /* no usable GPU after all: fall back to the cpu */
        if (lmx_cuda_backend_create(out, &ignored) == LMX_OK) return LMX_OK;
    }
    if (name && strcmp(name, "cuda") == 0) return lmx_cuda_backend_create(out, err);
#else
    if (name && strcmp(name, "cuda") == 0)
        return lmx_err_set(err, LMX_ERR_BACKEND, "backend \"cuda\" is not built into this lmx");
#endif
    if (is_auto || strcmp(name, "cpu") == 0) return lmx_cpu_backend_create(n_threads, out, err);
    return lmx_err_set(err, LMX_ERR_BACKEND, "unknown backend \"%s\" (known: auto, cpu, cuda)", name);
}

void lmx_backend_free(lmx_backend *be) {
    if (be) be->ops->destroy(be);
}
