/* cuda_tpair.h - the cuda backward tests' values on both backends (test_cuda_backward.c, test_cuda_keep.c): a
 * tensor holding the same data on the gpu and the cpu, optionally as the cuda backend's bf16 keep, and their
 * comparison.  Include after cuda_pair.h. */
#ifndef LMX_TESTS_CUDA_TPAIR_H
#define LMX_TESTS_CUDA_TPAIR_H

#include "backend/backward.h"

/* tensor [rows, cols] holding data on both backends */
typedef struct tpair { lmx_tensor g, c; int64_t n; } tpair;
static inline tpair both(int64_t rows, int64_t cols, const float *data) {
    tpair t = {act(gpu, rows, cols, data), act(cpu, rows, cols, data), rows * cols};
    return t;
}
/* a forward value: with kept, the gpu side is the cuda backend's bf16 keep of it and the cpu side the
 * same values in f32 */
static inline tpair rand_in(int64_t rows, int64_t cols, float amp, int kept) {
    float *v = rand_vec(rows * cols, amp);
    for (int64_t i = 0; kept && i < rows * cols; i++) v[i] = lmx_bf16_to_f32(lmx_f32_to_bf16(v[i]));
    tpair t = both(rows, cols, v);
    free(v);
    if (!kept) return t;
    lmx_tensor k = {0};
    CHECK(lmx_cuda_backward.keep(gpu, &k, &t.g) == LMX_OK);
    CHECK_MSG(k.dtype == LMX_DTYPE_BF16, "the cuda backend keeps dtype %d, not bf16", (int)k.dtype);
    gpu->ops->release(gpu, &t.g);
    t.g = k;
    return t;
}
static inline tpair rand_both(int64_t rows, int64_t cols, float amp) { return rand_in(rows, cols, amp, 0); }
static inline void check_both(const char *what, tpair *t, double tol) {
    compare(what, &t->g, &t->c, t->n, tol);
    free_pair(&t->g, &t->c);
}
static inline void drop(tpair *t) { free_pair(&t->g, &t->c); }
/* NaN in every value of t's cuda copy: a fresh gradient (backward.h) shows any value left unwritten */
static inline void poison(tpair *t) {
    float *h = malloc((size_t)t->n * sizeof *h);
    for (int64_t i = 0; i < t->n; i++) h[i] = NAN;
    CHECK(gpu->ops->write(gpu, &t->g, 0, h, (size_t)t->n * sizeof *h) == LMX_OK);
    free(h);
}


/* A bf16 tensor's values [n] from the gpu, widened */
static inline float *fetch16(const lmx_tensor *t, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * 4);
    CHECK(gpu->ops->read(gpu, t, 0, h, (size_t)n * 2) == LMX_OK);
    for (int64_t i = 0; i < n; i++) f[i] = lmx_bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* How many of got's n values are not ref's rounded to bf16 give or take one bf16 step, or 1e-4 of ref's
 * largest (the gpu's exp and tanh and the cpu's vector forms differ by as much near GELU's zeros) */
static inline int64_t off_bf16(const float *got, const float *ref, int64_t n) {
    float big = 0;
    for (int64_t i = 0; i < n; i++) big = fmaxf(big, fabsf(ref[i]));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float r = lmx_bf16_to_f32(lmx_f32_to_bf16(ref[i]));
        bad += fabsf(got[i] - r) > fabsf(r) * (1.0f / 128) + 1e-4f * big;
    }
    return bad;
}

#endif
