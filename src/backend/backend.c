/* backend.c - picking a backend by name. */
#include "backend.h"

#include <string.h>

int64_t lmx_tensor_nelem(const lmx_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

lmx_status lmx_backend_create(const char *name, int n_threads, lmx_backend **out, lmx_err *err) {
    *out = NULL;
    if (!name || !*name || strcmp(name, "auto") == 0 || strcmp(name, "cpu") == 0)
        return lmx_cpu_backend_create(n_threads, out, err);
    if (strcmp(name, "cuda") == 0)
        return lmx_err_set(err, LMX_ERR_BACKEND, "backend \"cuda\" is not built into this lmx");
    return lmx_err_set(err, LMX_ERR_BACKEND, "unknown backend \"%s\" (known: auto, cpu)", name);
}

void lmx_backend_free(lmx_backend *be) {
    if (be) be->ops->destroy(be);
}
