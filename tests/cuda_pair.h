/* cuda_pair.h - what the cuda tests share: a gpu and a cpu backend, random data, tensors on both and
 * their comparison (relative L2 error against the cpu's result).  Included by one test file each. */
#ifndef LMX_TESTS_CUDA_PAIR_H
#define LMX_TESTS_CUDA_PAIR_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/half.h"
#include "check.h"
#include "formats/ggml_types.h"

static lmx_backend *gpu, *cpu;

/* Both backends: 0, or the exit status when they cannot be had (77: no usable GPU, a skip). */
static int pair_open(void) {
    lmx_err err = {0};
    if (lmx_cuda_device_count() == 0 || lmx_cuda_backend_create(&gpu, &err) != LMX_OK) {
        printf("SKIP: no usable GPU (%s)\n", err.msg);
        return 77;
    }
    if (lmx_cpu_backend_create(2, &cpu, &err) != LMX_OK) {
        printf("cpu backend: %s\n", err.msg);
        return 1;
    }
    return 0;
}
/* Both backends freed; the test's exit status (check_summary). */
static int pair_close(const char *name) {
    lmx_backend_free(gpu);
    lmx_backend_free(cpu);
    return check_summary(name);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}
static uint32_t urand(void) {
    frand();
    return (uint32_t)(rng >> 17);
}

/* relative L2 error of a against reference b */
static double rel_err(const float *a, const float *b, int64_t n) {
    double d2 = 0, r2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (!(d == d)) return INFINITY;
        d2 += d * d;
        r2 += (double)b[i] * b[i];
    }
    return sqrt(d2) / (sqrt(r2) > 1e-30 ? sqrt(r2) : 1.0);
}

/* an f32 activation [rows, cols] on backend be holding host data (or zeros) */
static lmx_tensor act(lmx_backend *be, int64_t rows, int64_t cols, const float *data) {
    lmx_tensor t = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {rows, cols}};
    CHECK(be->ops->alloc(be, &t) == LMX_OK);
    if (data) CHECK(be->ops->write(be, &t, 0, data, (size_t)(rows * cols) * 4) == LMX_OK);
    return t;
}

static float *fetch(lmx_backend *be, const lmx_tensor *t, int64_t n) {
    float *h = malloc((size_t)n * 4);
    CHECK(be->ops->read(be, t, 0, h, (size_t)n * 4) == LMX_OK);
    return h;
}

static void compare(const char *what, lmx_tensor *g, lmx_tensor *c, int64_t n, double tol) {
    float *a = fetch(gpu, g, n), *b = fetch(cpu, c, n);
    double e = rel_err(a, b, n);
    CHECK_MSG(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
    free(a);
    free(b);
}

/* A weight [N, K] (dtype dense; bits > 0 MLX, its scales and biases of dtype sdt: bf16, f16 or f32; gtype > 0
 * GGUF) uploaded to both backends.  Host buffers stay alive (the cpu backend aliases them): they are leaked
 * on purpose. */
typedef struct wpair { lmx_tensor g, c; } wpair;

static void put_f16(uint8_t *p, float v) { uint16_t h = lmx_f32_to_f16(v); memcpy(p, &h, 2); }

/* experts != 0: a GGUF weight marked as the loader marks stacked experts (> 0) and a mixture model's other
 * weights (< 0): the cuda backend keeps their blocks */
static wpair make_weight_ex(lmx_dtype dt, int bits, int group, int gtype, int64_t N, int64_t K, lmx_dtype sdt, int experts) {
    lmx_tensor t = {.dtype = dt, .ndim = 2, .shape = {N, K}};
    if (gtype) {
        size_t rb = lmx_ggml_row_bytes(gtype, K), bb = (size_t)lmx_ggml_block_bytes(gtype);
        uint8_t *p = malloc(rb * (size_t)N);
        for (size_t i = 0; i < rb * (size_t)N; i++) p[i] = (uint8_t)urand();
        for (size_t b = 0; b < rb * (size_t)N / bb; b++) { /* sane f16 scale fields */
            uint8_t *blk = p + b * bb;
            switch (gtype) { /* d (and the min or dmin after it) where each layout keeps them */
            case LMX_GGML_Q4_1: case LMX_GGML_Q5_1: put_f16(blk + 2, 0.02f * (frand() - 0.5f)); /* fall through */
            case LMX_GGML_Q8_0: case LMX_GGML_Q4_0: case LMX_GGML_Q5_0: put_f16(blk, 0.01f + 0.01f * frand()); break;
            case LMX_GGML_Q4_K: case LMX_GGML_Q5_K:
                put_f16(blk, 0.002f * (1.5f + frand())), put_f16(blk + 2, 0.002f * (1.5f + frand())); break;
            case LMX_GGML_Q2_K: put_f16(blk + 80, 0.004f * (1.5f + frand())), put_f16(blk + 82, 0.004f * (1.5f + frand())); break;
            case LMX_GGML_Q3_K: put_f16(blk + 108, 0.001f * (1.5f + frand())); break;
            case LMX_GGML_Q6_K: put_f16(blk + 208, 0.001f * (1.5f + frand())); break;
            default: break;
            }
        }
        t.dtype = LMX_DTYPE_U8;
        t.data = p;
        t.q.ggml_type = gtype;
        t.q.experts = experts;
    } else if (bits) {
        int64_t W = K * bits / 32, G = K / group;
        uint32_t *p = malloc((size_t)(N * W) * 4);
        for (int64_t i = 0; i < N * W; i++) p[i] = urand() ^ (urand() << 15);
        const size_t es = lmx_dtype_size(sdt);
        uint8_t *s = malloc((size_t)(N * G) * es), *b = malloc((size_t)(N * G) * es);
        for (int64_t i = 0; i < N * G; i++) {
            const float sv = 0.02f * (1.2f + frand()), bv = 0.05f * frand();
            if (sdt == LMX_DTYPE_F32) memcpy(s + 4 * i, &sv, 4), memcpy(b + 4 * i, &bv, 4);
            else {
                const uint16_t hs = sdt == LMX_DTYPE_F16 ? lmx_f32_to_f16(sv) : lmx_f32_to_bf16(sv);
                const uint16_t hb = sdt == LMX_DTYPE_F16 ? lmx_f32_to_f16(bv) : lmx_f32_to_bf16(bv);
                memcpy(s + 2 * i, &hs, 2), memcpy(b + 2 * i, &hb, 2);
            }
        }
        t.dtype = LMX_DTYPE_U32;
        t.data = p;
        t.q = (lmx_quant){.bits = bits, .group = group, .scale_dtype = sdt, .scales = s, .biases = b};
    } else {
        size_t es = lmx_dtype_size(dt);
        uint8_t *p = malloc((size_t)(N * K) * es);
        for (int64_t i = 0; i < N * K; i++) {
            float v = 0.1f * frand();
            if (dt == LMX_DTYPE_F32) memcpy(p + 4 * i, &v, 4);
            else { uint16_t h = dt == LMX_DTYPE_BF16 ? lmx_f32_to_bf16(v) : lmx_f32_to_f16(v); memcpy(p + 2 * i, &h, 2); }
        }
        t.data = p;
        if (N == 1) { t.ndim = 1; t.shape[0] = K; t.shape[1] = 0; }
    }
    wpair w = {t, t};
    CHECK(gpu->ops->upload_weight(gpu, &w.g) == LMX_OK);
    CHECK(cpu->ops->upload_weight(cpu, &w.c) == LMX_OK);
    return w;
}

static wpair make_weight_sdt(lmx_dtype dt, int bits, int group, int gtype, int64_t N, int64_t K, lmx_dtype sdt) {
    return make_weight_ex(dt, bits, group, gtype, N, K, sdt, 0);
}

static wpair make_weight(lmx_dtype dt, int bits, int group, int gtype, int64_t N, int64_t K) {
    return make_weight_sdt(dt, bits, group, gtype, N, K, LMX_DTYPE_BF16);
}

static float *rand_vec(int64_t n, float amp) {
    float *v = calloc((size_t)n, 4);
    for (int64_t i = 0; i < n; i++) v[i] = amp * frand();
    return v;
}

static void free_pair(lmx_tensor *g, lmx_tensor *c) {
    gpu->ops->release(gpu, g);
    cpu->ops->release(cpu, c);
}

#endif
