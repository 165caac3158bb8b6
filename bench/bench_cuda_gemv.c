/* bench_cuda_gemv.c - the cuda backend's matmul op alone on decode shapes: per weight format, shape
 * [N, K] and row count M, the time of one call (mean of REPS back-to-back calls, after warm-up) and
 * the weight bytes it streams per second.  The shapes are Llama-3.1-8B's projections and lm head.
 * usage: bench_cuda_gemv [REPS [FORMAT SHAPE M]]   (LMX_CUDA_GEMV=2: the CUDA-core kernels for 2..8 rows,
 * cuBLAS above; FORMAT bf16, q4 / q8 (MLX, groups of 64) or a GGUF block type (q4_0 q8_0 q4_k q5_k q6_k), SHAPE
 * as printed ("q/o", "lm head"...) or "all", M: only that case (0: all), e.g. for ncu)
 * Prints one line per case: format N K M  us/call  GB/s; then the time of reading M rows of logits to
 * the host. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "base/half.h"
#include "formats/ggml_types.h"
#include "bench_util.h"

/* The formats: bits 4 or 8 MLX (groups of 64), else gtype > 0 a GGUF block type, else bf16. */
static const struct fmt { const char *name; int bits, gtype; } fmts[] = {
    {"bf16", 0, 0},  {"q4", 4, 0}, {"q8", 8, 0}, {"q4_0", 0, LMX_GGML_Q4_0}, {"q8_0", 0, LMX_GGML_Q8_0},
    {"q4_k", 0, LMX_GGML_Q4_K}, {"q5_k", 0, LMX_GGML_Q5_K}, {"q6_k", 0, LMX_GGML_Q6_K}};

static void put_f16(uint8_t *p, float v) {
    const uint16_t h = lmx_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* A random [N, K] weight of format f (values from the xorshift64 state *rng); its bytes in *bytes.  GGUF blocks
 * are random bytes with sane f16 scale fields.  The backend owns the uploaded copy until it is freed; the host
 * copy is left to the process's end. */
static int make_weight(lmx_backend *be, const struct fmt *f, int64_t N, int64_t K, lmx_tensor *w, double *bytes,
                       uint64_t *rng) {
    memset(w, 0, sizeof *w);
    w->ndim = 2;
    w->shape[0] = N;
    w->shape[1] = K;
    if (f->gtype) {
        const size_t rb = lmx_ggml_row_bytes(f->gtype, K), bb = (size_t)lmx_ggml_block_bytes(f->gtype), n = rb * (size_t)N;
        uint8_t *p = malloc(n);
        if (!p) return -1;
        for (size_t i = 0; i < n; i += 4) {
            const uint32_t r = (uint32_t)(bench_xorshift64(rng) >> 32);
            memcpy(p + i, &r, n - i < 4 ? n - i : 4);
        }
        for (size_t b = 0; b < n / bb; b++) { /* d (and dmin) where each layout keeps them */
            uint8_t *blk = p + b * bb;
            switch (f->gtype) {
            case LMX_GGML_Q4_0: case LMX_GGML_Q8_0: put_f16(blk, 0.01f); break;
            case LMX_GGML_Q4_K: case LMX_GGML_Q5_K: put_f16(blk, 0.002f), put_f16(blk + 2, 0.001f); break;
            case LMX_GGML_Q6_K: put_f16(blk + 208, 0.001f); break;
            default: break;
            }
        }
        w->dtype = LMX_DTYPE_U8;
        w->data = p;
        w->q.ggml_type = f->gtype;
        *bytes = (double)n;
    } else if (f->bits) {
        const int64_t words = N * K * f->bits / 32, groups = N * K / 64;
        uint32_t *p = malloc((size_t)words * 4);
        uint16_t *s = malloc((size_t)groups * 2), *b = malloc((size_t)groups * 2);
        if (!p || !s || !b) return -1;
        for (int64_t i = 0; i < words; i++) p[i] = (uint32_t)(bench_xorshift64(rng) >> 32);
        for (int64_t i = 0; i < groups; i++) s[i] = lmx_f32_to_bf16(0.01f), b[i] = lmx_f32_to_bf16(0.02f * bench_uniform(rng));
        w->dtype = LMX_DTYPE_U32;
        w->data = p;
        w->q = (lmx_quant){.bits = f->bits, .group = 64, .scale_dtype = LMX_DTYPE_BF16, .scales = s, .biases = b};
        *bytes = (double)words * 4 + (double)groups * 4;
    } else {
        uint16_t *p = malloc((size_t)(N * K) * 2);
        if (!p) return -1;
        for (int64_t i = 0; i < N * K; i++) p[i] = lmx_f32_to_bf16(0.05f * bench_uniform(rng));
        w->dtype = LMX_DTYPE_BF16;
        w->data = p;
        *bytes = (double)N * K * 2;
    }
    return be->ops->upload_weight(be, w) == LMX_OK ? 0 : -1;
}

int main(int argc, char **argv) {
#ifndef LMX_HAVE_CUDA
    (void)argc, (void)argv, (void)make_weight, (void)fmts;
    printf("built without CUDA\n");
    return 0;
#else
    const int reps = argc > 1 ? atoi(argv[1]) : 50;
    const char *only_fmt = argc > 4 ? argv[2] : NULL, *only_shape = argc > 4 ? argv[3] : NULL;
    const int only_m = argc > 4 ? atoi(argv[4]) : 0;
    uint64_t rng = 88172645463325252ull; /* the random inputs' xorshift64 state */
    lmx_err err = {0};
    lmx_backend *be = NULL;
    if (lmx_cuda_device_count() == 0 || lmx_cuda_backend_create(&be, &err) != LMX_OK) {
        printf("no usable GPU (%s)\n", err.msg);
        return 0;
    }
    const struct { const char *name; int64_t N, K; } shapes[] = {
        {"q/o", 4096, 4096}, {"k/v", 1024, 4096}, {"gate/up", 14336, 4096}, {"down", 4096, 14336}, {"lm head", 128256, 4096}};
    const int Ms[] = {1, 2, 4, 8, 16, 32};
    printf("%-6s %-8s %7s %6s %3s %10s %8s\n", "format", "shape", "N", "K", "M", "us/call", "GB/s");
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0]; f++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            if (only_fmt ? strcmp(only_fmt, fmts[f].name) || (strcmp(only_shape, "all") && strcmp(only_shape, shapes[s].name))
                         : fmts[f].gtype != 0 || fmts[f].bits == 8)
                continue;
            lmx_tensor w;
            double bytes;
            if (make_weight(be, &fmts[f], shapes[s].N, shapes[s].K, &w, &bytes, &rng)) {
                printf("weight upload failed: %s\n", be->err.msg);
                return 1;
            }
            for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
                const int M = Ms[i];
                if (only_m && M != only_m) continue;
                lmx_tensor x = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, shapes[s].K}};
                lmx_tensor y = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, shapes[s].N}};
                if (be->ops->alloc(be, &x) || be->ops->alloc(be, &y)) return 1;
                float *h = malloc((size_t)(M * shapes[s].K) * 4), probe;
                for (int64_t k = 0; k < M * shapes[s].K; k++) h[k] = bench_uniform(&rng);
                be->ops->write(be, &x, 0, h, (size_t)(M * shapes[s].K) * 4);
                for (int r = 0; r < 3; r++) be->ops->matmul(be, &y, &x, &w, NULL, M);
                be->ops->read(be, &y, 0, &probe, 4);
                const double t0 = bench_now_s();
                for (int r = 0; r < reps; r++)
                    if (be->ops->matmul(be, &y, &x, &w, NULL, M) != LMX_OK) {
                        printf("matmul failed: %s\n", be->err.msg);
                        return 1;
                    }
                be->ops->read(be, &y, 0, &probe, 4);
                const double t = (bench_now_s() - t0) / reps;
                printf("%-6s %-8s %7lld %6lld %3d %10.1f %8.0f\n", fmts[f].name, shapes[s].name,
                       (long long)shapes[s].N, (long long)shapes[s].K, M, t * 1e6, bytes / t * 1e-9);
                be->ops->release(be, &x);
                be->ops->release(be, &y);
                free(h);
            }
        }
    /* what a batched decode step's logits cost to bring to the host (128256-entry vocabulary) */
    for (int M = 1; M <= 32 && !only_fmt; M *= 2) {
        lmx_tensor y = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, 128256}};
        if (be->ops->alloc(be, &y)) return 1;
        const size_t n = (size_t)M * 128256 * 4;
        float *h = malloc(n);
        be->ops->read(be, &y, 0, h, n);
        const double t0 = bench_now_s();
        for (int r = 0; r < 10; r++) be->ops->read(be, &y, 0, h, n);
        const double t = (bench_now_s() - t0) / 10;
        printf("read logits of %2d rows (%5.1f MB): %7.1f us, %5.1f GB/s\n", M, n / 1e6, t * 1e6, n / t * 1e-9);
        be->ops->release(be, &y);
        free(h);
    }
    lmx_backend_free(be);
    return 0;
#endif
}
