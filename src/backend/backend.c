/* backend.c - picking a backend by name ("auto" may be pinned with the LMX_BACKEND variable). */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

int64_t lmx_tensor_nelem(const lmx_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
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
