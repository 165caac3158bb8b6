/* test_cuda_ops.c - every op of the cuda backend against the cpu backend on random inputs,
 * including odd sizes, quantized weights, padded batches, GQA, sliding windows, rotating caches
 * and split attention over long contexts.  Exits 77 (skipped) when lmx is built without CUDA or
 * no GPU is present. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/half.h"
#include "check.h"
#include "formats/ggml_types.h"
#include "lmx.h"

#ifndef LMX_HAVE_CUDA
int main(void) {
    printf("SKIP: lmx built without CUDA\n");
    return 77;
}
#else

#include "cuda_pair.h"
#include "moe_ref.h"

/* ---- matmul ---------------------------------------------------------------------------------- */

static void test_matmul_case_sdt(const char *name, lmx_dtype dt, int bits, int group, int gtype, int N, int K, int M,
                                 int with_bias, double tol, lmx_dtype sdt) {
    wpair w = make_weight_sdt(dt, bits, group, gtype, N, K, sdt);
    wpair b = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, N);
    float *x = rand_vec((int64_t)M * K, 1.0f);
    lmx_tensor xg = act(gpu, M, K, x), xc = act(cpu, M, K, x), yg = act(gpu, M, N, NULL), yc = act(cpu, M, N, NULL);
    CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, with_bias ? &b.g : NULL, M) == LMX_OK);
    CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, with_bias ? &b.c : NULL, M) == LMX_OK);
    char what[128];
    snprintf(what, sizeof what, "matmul %s N=%d K=%d M=%d bias=%d", name, N, K, M, with_bias);
    compare(what, &yg, &yc, (int64_t)M * N, tol);
    free_pair(&xg, &xc);
    free_pair(&yg, &yc);
    free(x);
}

/* GGUF Q8_0 whose d is past 512 in one block: 128 d (the MLX bias) leaves f16's range, so the cuda backend keeps
 * the weight's blocks (cuda_repack.cu) and the product is still right; with every d small it becomes MLX 8-bit
 * groups of 32 (unless LMX_CUDA_GGUF_REPACK=0). */
static void test_repack_fallback(void) {
    const int N = 3, K = 64, BY = 34;
    for (int big = 0; big < 2; big++) {
        uint8_t *p = malloc((size_t)N * (K / 32) * BY); /* aliased by the cpu backend: kept */
        for (int b = 0; b < N * (K / 32); b++) {
            put_f16(p + b * BY, big && b == 3 ? 600.0f : 0.01f + 0.01f * frand());
            for (int i = 0; i < 32; i++) p[b * BY + 2 + i] = (uint8_t)urand();
        }
        const lmx_tensor t = {.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {N, K}, .data = p, .q.ggml_type = LMX_GGML_Q8_0};
        wpair w = {t, t};
        CHECK(gpu->ops->upload_weight(gpu, &w.g) == LMX_OK);
        CHECK(cpu->ops->upload_weight(cpu, &w.c) == LMX_OK);
        const char *off = getenv("LMX_CUDA_GGUF_REPACK");
        const int repacked = !(off && off[0] == '0') && !big;
        CHECK_MSG(w.g.q.ggml_type == (repacked ? 0 : LMX_GGML_Q8_0) && w.g.q.bits == (repacked ? 8 : 0),
                  "Q8_0 with d %s: uploaded as ggml type %d, bits %d", big ? "600" : "small", w.g.q.ggml_type, w.g.q.bits);
        float *x = rand_vec(K, 1.0f);
        lmx_tensor xg = act(gpu, 1, K, x), xc = act(cpu, 1, K, x), yg = act(gpu, 1, N, NULL), yc = act(cpu, 1, N, NULL);
        CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, NULL, 1) == LMX_OK);
        CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, NULL, 1) == LMX_OK);
        /* (one row's int16 x; 3e-4: three sums of 64 products, whose relative error passed 2e-4 on some draws) */
        compare(big ? "matmul q8_0, d past f16's reach as 128 d" : "matmul q8_0 repacked", &yg, &yc, N, 3e-4);
        free_pair(&xg, &xc);
        free_pair(&yg, &yc);
        free(x);
    }
}

static void test_matmul_case(const char *name, lmx_dtype dt, int bits, int group, int gtype, int N, int K, int M,
                             int with_bias, double tol) {
    test_matmul_case_sdt(name, dt, bits, group, gtype, N, K, M, with_bias, tol, LMX_DTYPE_BF16);
}

/* training's inputs (backend.h matmul): x a bf16 keep on the gpu, the same rounded values in f32 on the
 * cpu; the GEMM takes bf16 or quantized weights as they are, other weights and GEMV-sized M widen x first */
static lmx_tensor bf16_act(int64_t rows, int64_t cols, float *x) {
    uint16_t *h = malloc((size_t)(rows * cols) * 2);
    for (int64_t i = 0; i < rows * cols; i++) h[i] = lmx_f32_to_bf16(x[i]), x[i] = lmx_bf16_to_f32(h[i]);
    lmx_tensor t = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, cols}};
    CHECK(gpu->ops->alloc(gpu, &t) == LMX_OK);
    CHECK(gpu->ops->write(gpu, &t, 0, h, (size_t)(rows * cols) * 2) == LMX_OK);
    free(h);
    return t;
}

static void test_matmul_bf16_x(const char *name, lmx_dtype dt, int bits, int gtype, int N, int K, int M) {
    wpair w = make_weight(dt, bits, 64, gtype, N, K);
    float *x = rand_vec((int64_t)M * K, 1.0f);
    lmx_tensor xg = bf16_act(M, K, x), xc = act(cpu, M, K, x), yg = act(gpu, M, N, NULL), yc = act(cpu, M, N, NULL);
    CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, NULL, M) == LMX_OK);
    CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, NULL, M) == LMX_OK);
    char what[128];
    snprintf(what, sizeof what, "matmul of a bf16 x, %s N=%d K=%d M=%d", name, N, K, M);
    compare(what, &yg, &yc, (int64_t)M * N, dt == LMX_DTYPE_F32 ? 1e-4 : 5e-3);
    free_pair(&xg, &xc);
    free_pair(&yg, &yc);
    free(x);
}

/* the lora op on a bf16 x: B = 3 sequences of T rows, pairs p, none, p */
static void test_lora_bf16_x(int T) {
    const int B = 3, K = 96, N = 72, r = 8, M = B * T;
    float *a = rand_vec(r * K, 0.3f), *b = rand_vec(N * r, 0.3f), *x = rand_vec((int64_t)M * K, 1.0f);
    float *y0 = rand_vec((int64_t)M * N, 1.0f);
    lmx_tensor ag = act(gpu, r, K, a), ac = act(cpu, r, K, a), bg = act(gpu, N, r, b), bc = act(cpu, N, r, b);
    const lmx_lora_pair pg = {ag, bg, 0.7f}, pc = {ac, bc, 0.7f};
    const lmx_lora_pair *pairs_g[3] = {&pg, NULL, &pg}, *pairs_c[3] = {&pc, NULL, &pc};
    lmx_tensor xg = bf16_act(M, K, x), xc = act(cpu, M, K, x), yg = act(gpu, M, N, y0), yc = act(cpu, M, N, y0);
    CHECK(gpu->ops->lora(gpu, &yg, &xg, B, T, pairs_g) == LMX_OK);
    CHECK(cpu->ops->lora(cpu, &yc, &xc, B, T, pairs_c) == LMX_OK);
    char what[64];
    snprintf(what, sizeof what, "lora of a bf16 x, T=%d", T);
    compare(what, &yg, &yc, (int64_t)M * N, 1e-3);
    free_pair(&xg, &xc);
    free_pair(&yg, &yc);
    free_pair(&ag, &ac);
    free_pair(&bg, &bc);
    free(a), free(b), free(x), free(y0);
}

/* The norm_matmuls op against the rmsnorm op then the matmul op in turn on the gpu: the same bits (its GEMMs
 * read the norm's bf16 copy, the rounding their own narrowing does); rows few enough for the one-row kernels
 * and dense f32 weights declined.  C 1024, outputs of 512, 256 and 192 (a bias on the first); one: the norm's
 * add_one. */
static void test_norm_matmuls_case(const char *name, lmx_dtype dt, int bits, int gtype, int rows, float one,
                                   lmx_status expect) {
    const int C = 1024, N[3] = {512, 256, 192};
    wpair w[3], nw = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, C), b = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, N[0]);
    for (int i = 0; i < 3; i++) w[i] = make_weight(dt, bits, 64, gtype, N[i], C);
    float *x = rand_vec((int64_t)rows * C, 2.0f);
    lmx_tensor xg = act(gpu, rows, C, x), xn0 = act(gpu, rows, C, NULL), xn1 = act(gpu, rows, C, NULL), y0[3], y1[3];
    lmx_tensor *outs[3];
    const lmx_tensor *ws[3] = {&w[0].g, &w[1].g, &w[2].g}, *bs[3] = {&b.g, NULL, NULL};
    for (int i = 0; i < 3; i++) y0[i] = act(gpu, rows, N[i], NULL), y1[i] = act(gpu, rows, N[i], NULL), outs[i] = &y1[i];
    CHECK(gpu->ops->rmsnorm(gpu, &xn0, &xg, &nw.g, rows, C, 1e-6f, one) == LMX_OK);
    for (int i = 0; i < 3; i++) CHECK(gpu->ops->matmul(gpu, &y0[i], &xn0, ws[i], bs[i], rows) == LMX_OK);
    const lmx_status st = gpu->ops->norm_matmuls(gpu, &xn1, &xg, &nw.g, rows, C, 1e-6f, one, 3, outs, ws, bs);
    CHECK_MSG(st == expect, "norm_matmuls %s rows %d: status %d, not %d", name, rows, (int)st, expect);
    for (int i = -1; st == LMX_OK && i < 3; i++) {
        const int64_t n = (int64_t)rows * (i < 0 ? C : N[i]);
        float *a = fetch(gpu, i < 0 ? &xn0 : &y0[i], n), *c = fetch(gpu, i < 0 ? &xn1 : &y1[i], n);
        CHECK_MSG(memcmp(a, c, (size_t)n * 4) == 0, "norm_matmuls %s rows %d: output %d differs from the ops in turn",
                  name, rows, i);
        free(a), free(c);
    }
    /* a bf16 xn (a prompt's activations, backend.h): the norm's output rounded, and the same products */
    lmx_tensor x16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, C}};
    CHECK(gpu->ops->alloc(gpu, &x16) == LMX_OK);
    const lmx_status s16 = gpu->ops->norm_matmuls(gpu, &x16, &xg, &nw.g, rows, C, 1e-6f, one, 3, outs, ws, bs);
    CHECK_MSG(s16 == expect, "norm_matmuls %s rows %d, bf16 xn: status %d, not %d", name, rows, (int)s16, expect);
    for (int i = -1; s16 == LMX_OK && i < 3; i++) {
        const int64_t n = (int64_t)rows * (i < 0 ? C : N[i]);
        float *a = fetch(gpu, i < 0 ? &xn0 : &y0[i], n), *c = i < 0 ? NULL : fetch(gpu, &y1[i], n);
        uint16_t *h = i < 0 ? malloc((size_t)n * 2) : NULL;
        if (h) CHECK(gpu->ops->read(gpu, &x16, 0, h, (size_t)n * 2) == LMX_OK);
        int64_t bad = 0;
        for (int64_t j = 0; j < n; j++) bad += h ? h[j] != lmx_f32_to_bf16(a[j]) : memcmp(&a[j], &c[j], 4) != 0;
        CHECK_MSG(bad == 0, "norm_matmuls %s rows %d, bf16 xn: output %d differs in %lld values", name, rows, i,
                  (long long)bad);
        free(a), free(c), free(h);
    }
    gpu->ops->release(gpu, &x16);
    for (int i = 0; i < 3; i++) gpu->ops->release(gpu, &y0[i]), gpu->ops->release(gpu, &y1[i]);
    gpu->ops->release(gpu, &xg), gpu->ops->release(gpu, &xn0), gpu->ops->release(gpu, &xn1);
    free(x);
}

static void test_norm_matmuls(void) {
    test_norm_matmuls_case("bf16", LMX_DTYPE_BF16, 0, 0, 300, 0.0f, LMX_OK);
    test_norm_matmuls_case("bf16, (1 + w)", LMX_DTYPE_BF16, 0, 0, 77, 1.0f, LMX_OK); /* Gemma's norm */
    test_norm_matmuls_case("mlx q4", LMX_DTYPE_U32, 4, 0, 300, 0.0f, LMX_OK);
    test_norm_matmuls_case("Q4_K", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 300, 0.0f, LMX_OK);
    test_norm_matmuls_case("bf16", LMX_DTYPE_BF16, 0, 0, 4, 0.0f, LMX_ERR_UNSUPPORTED);
    test_norm_matmuls_case("f32", LMX_DTYPE_F32, 0, 0, 300, 0.0f, LMX_ERR_UNSUPPORTED);
}

static void test_matmul(void) {
    const int Mb[] = {3, 40, 300};
    for (size_t i = 0; i < sizeof Mb / sizeof Mb[0]; i++) {
        test_matmul_bf16_x("bf16", LMX_DTYPE_BF16, 0, 0, 130, 256, Mb[i]);
        test_matmul_bf16_x("q4_k", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 70, 512, Mb[i]);
        test_matmul_bf16_x("mlx q4", LMX_DTYPE_U32, 4, 0, 50, 256, Mb[i]);
        test_matmul_bf16_x("f32", LMX_DTYPE_F32, 0, 0, 33, 100, Mb[i]);
    }
    test_lora_bf16_x(1);
    test_lora_bf16_x(40);

    /* bf16 / f16 (2..16 rows) and MLX 4-bit (2..32) run on the tensor cores with x rounded to bf16 (f16), as the
     * cuBLAS GEMMs beyond take it; odd K (not a multiple of 8) and f32 weights stay on the CUDA cores.
     * N from a few rows (K split among blocks) to 40000 (no split), K not a multiple of 32. */
    const int Ms[] = {1, 2, 3, 5, 8, 9, 16, 17, 32, 33};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        int M = Ms[i];
        double t16 = M > 32 ? 2e-2 : M > 1 ? 5e-3 : 1e-4, todd = M > 8 ? 2e-2 : 1e-4;
        test_matmul_case("bf16", LMX_DTYPE_BF16, 0, 0, 0, 37, 256, M, 1, t16);
        test_matmul_case("bf16", LMX_DTYPE_BF16, 0, 0, 0, 130, 1000, M, 0, t16);
        test_matmul_case("bf16 odd K", LMX_DTYPE_BF16, 0, 0, 0, 19, 75, M, 1, todd);
        test_matmul_case("f16", LMX_DTYPE_F16, 0, 0, 0, 33, 264, M, 1, M > 1 ? 5e-3 : 1e-4);
        test_matmul_case("f32", LMX_DTYPE_F32, 0, 0, 0, 21, 100, M, 1, 1e-4);
        test_matmul_case("f32 odd K", LMX_DTYPE_F32, 0, 0, 0, 9, 77, M, 0, 1e-4);
        /* a mixture of experts' router (K in parts of 128) and a wider f32 weight with a bias (K's last part short) */
        test_matmul_case("f32 router", LMX_DTYPE_F32, 0, 0, 0, 128, 2048, M, 0, 1e-4);
        test_matmul_case("f32 parts", LMX_DTYPE_F32, 0, 0, 0, 301, 1000, M, 1, 1e-4);
    }
    const int Mw[] = {1, 2, 8, 13, 32}; /* K split among 16, 4, 8 blocks; none for wide N (one row of MLX 4-bit: x in int16) */
    for (size_t i = 0; i < sizeof Mw / sizeof Mw[0]; i++) {
        test_matmul_case("bf16 long K", LMX_DTYPE_BF16, 0, 0, 0, 37, 4104, Mw[i], 1, 5e-3);
        test_matmul_case("bf16 parts", LMX_DTYPE_BF16, 0, 0, 0, 9001, 1000, Mw[i], 0, 5e-3);
        test_matmul_case("bf16 wide", LMX_DTYPE_BF16, 0, 0, 0, 40000, 72, Mw[i], 1, 5e-3);
        test_matmul_case("mlx q4 long K", LMX_DTYPE_U32, 4, 64, 0, 45, 8192, Mw[i], 1, 5e-3);
        test_matmul_case("mlx q4 g64 wide", LMX_DTYPE_U32, 4, 64, 0, 20000, 192, Mw[i], 1, 5e-3);
        test_matmul_case("mlx q4 g128", LMX_DTYPE_U32, 4, 128, 0, 300, 1024, Mw[i], 0, 5e-3);
        test_matmul_case("mlx q8 g128", LMX_DTYPE_U32, 8, 128, 0, 300, 1024, Mw[i], 1, 5e-3);
    }
    /* bf16 / f16 at 17-32 rows (cuBLAS, x narrowed to bf16 / f16) with the shapes of a batched decode: few rows
     * and a long K (split-K), many rows and a short K, rows that end mid-tile */
    const int Mcublas[] = {17, 24, 25, 32};
    for (size_t i = 0; i < sizeof Mcublas / sizeof Mcublas[0]; i++) {
        test_matmul_case("bf16 long K", LMX_DTYPE_BF16, 0, 0, 0, 37, 4096, Mcublas[i], 1, 5e-3);
        test_matmul_case("bf16 parts", LMX_DTYPE_BF16, 0, 0, 0, 9001, 1024, Mcublas[i], 0, 5e-3);
        test_matmul_case("bf16 wide", LMX_DTYPE_BF16, 0, 0, 0, 40000, 128, Mcublas[i], 1, 5e-3);
        test_matmul_case("f16", LMX_DTYPE_F16, 0, 0, 0, 300, 640, Mcublas[i], 1, 5e-3);
    }
    const int Mq[] = {1, 2, 3, 8, 12, 32, 40};
    for (size_t i = 0; i < sizeof Mq / sizeof Mq[0]; i++) {
        int M = Mq[i];
        double tq = M > 32 ? 2e-2 : 1e-4, t4 = M > 32 ? 2e-2 : M > 1 ? 5e-3 : 1e-4;
        test_matmul_case("mlx q4 g64", LMX_DTYPE_U32, 4, 64, 0, 45, 512, M, 1, t4);
        test_matmul_case("mlx q4 g32", LMX_DTYPE_U32, 4, 32, 0, 17, 96, M, 0, t4);
        test_matmul_case("mlx q4 g32, whole units of 64", LMX_DTYPE_U32, 4, 32, 0, 19, 320, M, 1, t4);
        test_matmul_case_sdt("mlx q4 g128 f16 scales", LMX_DTYPE_U32, 4, 128, 0, 33, 384, M, 0, t4, LMX_DTYPE_F16);
        /* f16 scales and biases (rounded to bf16 on the tensor cores), f32 ones (the CUDA-core kernels) */
        test_matmul_case_sdt("mlx q4 g64 f16 scales", LMX_DTYPE_U32, 4, 64, 0, 150, 512, M, 1, t4, LMX_DTYPE_F16);
        test_matmul_case_sdt("mlx q4 g32 f32 scales", LMX_DTYPE_U32, 4, 32, 0, 150, 256, M, 0, t4, LMX_DTYPE_F32);
        /* MLX 8-bit: one row, 2 rows and 3-4 of K <= 8192 with x in int16 (cuda_ggml.cu), more on the tensor cores */
        test_matmul_case("mlx q8 g64", LMX_DTYPE_U32, 8, 64, 0, 29, 192, M, 1, t4);
        test_matmul_case("mlx q8 g32", LMX_DTYPE_U32, 8, 32, 0, 17, 96, M, 0, t4);
        test_matmul_case_sdt("mlx q8 g64 f16 scales", LMX_DTYPE_U32, 8, 64, 0, 150, 512, M, 1, t4, LMX_DTYPE_F16);
        test_matmul_case("mlx q2 g32", LMX_DTYPE_U32, 2, 32, 0, 13, 128, M, 0, tq);
    }
    /* GGUF blocks: one row, and up to 8 rows of the types without a tensor-core kernel, take x in int16
     * per 32 values (cuda_ggml.cu); 5-32 rows of Q4_0, Q8_0, Q4_K, Q5_K and Q6_K (3-4 of them when K > 8192:
     * cuda_ggml_beats_tc) run on the tensor cores with x in bf16 (cuda_gemv_tc.cu); beyond that the weights
     * are dequantized to bf16 for cuBLAS.
     * Shapes with several blocks per row, rows that split among warps, and row counts that end mid-warp. */
    const struct { const char *name; int type, N, K; } gg[] = {
        {"gguf q4_0", LMX_GGML_Q4_0, 23, 160}, {"gguf q4_1", LMX_GGML_Q4_1, 19, 96},   {"gguf q5_0", LMX_GGML_Q5_0, 21, 224},
        {"gguf q5_1", LMX_GGML_Q5_1, 17, 64},  {"gguf q8_0", LMX_GGML_Q8_0, 23, 96},   {"gguf q2_k", LMX_GGML_Q2_K, 13, 512},
        {"gguf q3_k", LMX_GGML_Q3_K, 11, 256}, {"gguf q4_k", LMX_GGML_Q4_K, 11, 512},  {"gguf q5_k", LMX_GGML_Q5_K, 9, 768},
        {"gguf q6_k", LMX_GGML_Q6_K, 11, 256}, {"gguf q4_k long", LMX_GGML_Q4_K, 300, 4096},
        {"gguf q6_k long", LMX_GGML_Q6_K, 77, 2816}, {"gguf q4_k big", LMX_GGML_Q4_K, 1100, 4096},
        {"gguf q8_0 big", LMX_GGML_Q8_0, 1030, 4096},
        /* rows of K >= 8192: one row of Q6_K as a stream (k_gstream6) where the launch has weights enough (every
         * launch under LMX_CUDA_STREAM_MIN=0, as the device check runs this test once): three steps a group, the
         * last for 2 of 32 lanes, an odd row count; and with a bias */
        {"gguf q6_k wide", LMX_GGML_Q6_K, 301, 8448}, {"gguf q6_k wide, bias", LMX_GGML_Q6_K, 77, 16384}};
    const int Mg[] = {1, 2, 3, 5, 8, 12, 32, 40};
    for (size_t t = 0; t < sizeof gg / sizeof gg[0]; t++)
        for (size_t i = 0; i < sizeof Mg / sizeof Mg[0]; i++)
        {
            /* Q4_0, Q4_1, Q4_K and Q8_0 run as MLX groups of 32 (cuda_repack.cu; Q4_K's scales and mins
             * rounded to f16, 2^-12 relative: 5e-4 where x is int16) unless LMX_CUDA_GGUF_REPACK=0 */
            const int ty = gg[t].type, tc = ty == LMX_GGML_Q4_0 || ty == LMX_GGML_Q8_0 || ty == LMX_GGML_Q4_K ||
                                               ty == LMX_GGML_Q5_K || ty == LMX_GGML_Q6_K || ty == LMX_GGML_Q4_1;
            test_matmul_case(gg[t].name, LMX_DTYPE_U8, 0, 0, ty, gg[t].N, gg[t].K, Mg[i], (int)(t & 1),
                             Mg[i] > 32                                                 ? 2e-2
                             : tc && (Mg[i] > 4 || (Mg[i] > 2 && gg[t].K > 8192)) ? 5e-3
                             : ty == LMX_GGML_Q4_K                                      ? 5e-4
                                                                                        : 2e-4);
        }
    /* unsupported GGUF types are refused, not computed wrongly */
    lmx_tensor t = {.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {4, 256}};
    static uint8_t junk[4 * 256];
    t.data = junk;
    t.q.ggml_type = LMX_GGML_Q8_K;
    CHECK(gpu->ops->upload_weight(gpu, &t) == LMX_ERR_UNSUPPORTED);
    test_repack_fallback();
}

/* ---- small ops ------------------------------------------------------------------------------- */

static void test_embed(void) {
    struct { lmx_dtype dt; int bits, group, gtype; int K; } cases[] = {
        {LMX_DTYPE_BF16, 0, 0, 0, 100}, {LMX_DTYPE_F32, 0, 0, 0, 33}, {LMX_DTYPE_U32, 4, 64, 0, 128},
        {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q6_K, 256}, {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q4_K, 256},
        {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q3_K, 256}, {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q5_1, 64},
        {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q2_K, 256}, {LMX_DTYPE_U8, 0, 0, LMX_GGML_Q5_0, 96}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int V = 50, M = 7;
        wpair w = make_weight(cases[c].dt, cases[c].bits, cases[c].group, cases[c].gtype, V, cases[c].K);
        int32_t ids[7] = {0, 49, 3, 3, 17, 8, 25};
        lmx_tensor og = act(gpu, M, cases[c].K, NULL), oc = act(cpu, M, cases[c].K, NULL);
        CHECK(gpu->ops->embed(gpu, &og, &w.g, ids, M, 1.5f) == LMX_OK);
        CHECK(cpu->ops->embed(cpu, &oc, &w.c, ids, M, 1.5f) == LMX_OK);
        /* Q4_K: its scales and mins rounded to f16 on upload (cuda_repack.cu) */
        compare("embed", &og, &oc, (int64_t)M * cases[c].K, cases[c].gtype == LMX_GGML_Q4_K ? 5e-4 : 1e-6);
        int32_t bad = 50;
        CHECK(gpu->ops->embed(gpu, &og, &w.g, &bad, 1, 1.0f) == LMX_ERR_INVALID_ARG);
        if (cases[c].gtype == LMX_GGML_Q6_K) { /* stored with its blocks 16-byte aligned, on the device or in mapped host memory */
            CHECK_MSG(w.g.q.ggml_type == LMX_GGML_Q6_K_A16, "Q6_K uploaded as ggml type %d", w.g.q.ggml_type);
            lmx_tensor h = w.c; /* the host blocks (the cpu backend aliases them) */
            CHECK(gpu->ops->upload_weight_host && gpu->ops->upload_weight_host(gpu, &h) == LMX_OK);
            CHECK(h.q.ggml_type == LMX_GGML_Q6_K_A16);
            CHECK(gpu->ops->embed(gpu, &og, &h, ids, M, 1.5f) == LMX_OK);
            compare("embed q6_k, mapped host memory", &og, &oc, (int64_t)M * cases[c].K, 1e-6);
        }
        free_pair(&og, &oc);
    }
}

static void test_elementwise(void) {
    const int ns[] = {1, 37, 300, 2051, 5000, 9001}; /* rmsnorm: a warp a row; a block, 8 / 16 / 32 values a thread; a loop */
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
        int n = ns[i], rows = 5;
        float *x = rand_vec((int64_t)rows * n, 3.0f), *y = rand_vec((int64_t)rows * n, 3.0f);
        wpair w = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, n);
        for (int one = 0; one < 2; one++) {
            lmx_tensor xg = act(gpu, rows, n, x), xc = act(cpu, rows, n, x);
            CHECK(gpu->ops->rmsnorm(gpu, &xg, &xg, &w.g, rows, n, 1e-6f, (float)one) == LMX_OK); /* in place */
            CHECK(cpu->ops->rmsnorm(cpu, &xc, &xc, &w.c, rows, n, 1e-6f, (float)one) == LMX_OK);
            compare("rmsnorm", &xg, &xc, (int64_t)rows * n, 1e-5);
            free_pair(&xg, &xc);
        }
        int64_t m = (int64_t)rows * n;
        lmx_tensor xg = act(gpu, rows, n, x), xc = act(cpu, rows, n, x), yg = act(gpu, rows, n, y), yc = act(cpu, rows, n, y);
        CHECK(gpu->ops->add(gpu, &yg, &xg, m) == LMX_OK && cpu->ops->add(cpu, &yc, &xc, m) == LMX_OK);
        compare("add", &yg, &yc, m, 1e-6);
        for (int a = 0; a < 2; a++) {
            lmx_tensor og = act(gpu, rows, n, NULL), oc = act(cpu, rows, n, NULL);
            CHECK(gpu->ops->glu(gpu, &og, &xg, &yg, m, (lmx_act)a) == LMX_OK);
            CHECK(cpu->ops->glu(cpu, &oc, &xc, &yc, m, (lmx_act)a) == LMX_OK);
            /* gelu_tanh near x = -3 multiplies by 1 + tanh(...) ~ 0.006: the two backends' tanhf (fast math
             * on the GPU) differ there by ~1e-7 absolute, which that cancellation makes ~3e-5 relative */
            compare(a ? "glu gelu_tanh" : "glu silu", &og, &oc, m, a ? 1e-4 : 1e-5);
            /* a bf16 out (a prompt's activations, backend.h): the f32 output rounded */
            lmx_tensor o16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, n}};
            CHECK(gpu->ops->alloc(gpu, &o16) == LMX_OK);
            CHECK(gpu->ops->glu(gpu, &o16, &xg, &yg, m, (lmx_act)a) == LMX_OK);
            float *f = fetch(gpu, &og, m);
            uint16_t *h = malloc((size_t)m * 2);
            CHECK(gpu->ops->read(gpu, &o16, 0, h, (size_t)m * 2) == LMX_OK);
            int64_t bad = 0;
            for (int64_t j = 0; j < m; j++) bad += h[j] != lmx_f32_to_bf16(f[j]);
            CHECK_MSG(bad == 0, "glu %d into bf16, n %d: %lld values differ from the f32 output rounded", a, n, (long long)bad);
            free(f), free(h);
            gpu->ops->release(gpu, &o16);
            free_pair(&og, &oc);
        }
        CHECK(gpu->ops->softcap(gpu, &yg, m, 2.5f) == LMX_OK && cpu->ops->softcap(cpu, &yc, m, 2.5f) == LMX_OK);
        compare("softcap", &yg, &yc, m, 1e-5);
        int rows_idx[3] = {4, 0, 2};
        lmx_tensor gg = act(gpu, 3, n, NULL), gc = act(cpu, 3, n, NULL);
        CHECK(gpu->ops->gather_rows(gpu, &gg, &yg, rows_idx, 3, n) == LMX_OK);
        CHECK(cpu->ops->gather_rows(cpu, &gc, &yc, rows_idx, 3, n) == LMX_OK);
        compare("gather_rows", &gg, &gc, 3 * (int64_t)n, 1e-5);
        free_pair(&gg, &gc);
        free_pair(&xg, &xc);
        free_pair(&yg, &yc);
        free(x);
        free(y);
    }
}

/* T = 5: the angles computed by each thread, a thread per head; T = 1100: enough (row, dim pair)s for the
 * launches to share a table of the angles (cuda_rope_angles), made again for each rotation */
static void test_rope(void) {
    for (int T = 5; T <= 1100; T += 1095) {
        int n_past[3] = {0, 7, 3000}, n_new[3] = {T, 2, T - 1};
        lmx_batch bt = {.B = 3, .T = T, .n_past = n_past, .n_new = n_new};
        for (int inter = 0; inter < 2; inter++)
            for (int partial = 0; partial < 2; partial++) {
                int nh = 3, hd = 64, rot = partial ? 32 : 64;
                float inv[32];
                for (int i = 0; i < rot / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / rot);
                lmx_rope r = {.rot_dim = rot, .interleaved = inter, .inv_freq = inv, .attn_factor = 1.1f};
                int64_t n = 3LL * T * nh * hd;
                float *x = rand_vec(n, 1.0f);
                lmx_tensor xg = act(gpu, 3 * T, nh * hd, x), xc = act(cpu, 3 * T, nh * hd, x);
                CHECK(gpu->ops->rope(gpu, &xg, &bt, nh, hd, &r) == LMX_OK);
                CHECK(cpu->ops->rope(cpu, &xc, &bt, nh, hd, &r) == LMX_OK);
                compare("rope", &xg, &xc, n, 1e-5);
                free_pair(&xg, &xc);
                free(x);
            }
    }
}

/* ---- attention through a sequence of calls ---------------------------------------------------- */

typedef struct attn_case {
    const char *name;
    int B, H, Hk, D, window, rotating_cap;
    float softcap;
    int steps;           /* calls after the first */
    int T0, TS;          /* rows of the first call, of each later call */
} attn_case;

static void run_attn_case(const attn_case *ac) {
    int B = ac->B, H = ac->H, Hk = ac->Hk, D = ac->D;
    int64_t KD = (int64_t)Hk * D;
    lmx_kv_layer kg[16], kc[16];
    lmx_kv_layer *pg[16], *pc[16];
    for (int b = 0; b < B; b++) {
        lmx_kv_layer z = {.window = ac->window, .rotating = ac->rotating_cap > 0, .cap = ac->rotating_cap};
        kg[b] = kc[b] = z;
        pg[b] = &kg[b];
        pc[b] = &kc[b];
        if (ac->rotating_cap) {
            kg[b].k = kg[b].v = (lmx_tensor){.dtype = gpu->ops->kv_dtype, .ndim = 2, .shape = {ac->rotating_cap, KD}};
            kc[b].k = kc[b].v = (lmx_tensor){.dtype = cpu->ops->kv_dtype, .ndim = 2, .shape = {ac->rotating_cap, KD}};
            CHECK(gpu->ops->alloc(gpu, &kg[b].k) == LMX_OK && gpu->ops->alloc(gpu, &kg[b].v) == LMX_OK);
            CHECK(cpu->ops->alloc(cpu, &kc[b].k) == LMX_OK && cpu->ops->alloc(cpu, &kc[b].v) == LMX_OK);
        }
    }
    int n_past[16] = {0}, n_new[16];
    for (int step = 0; step <= ac->steps; step++) {
        int T = step == 0 ? ac->T0 : ac->TS;
        for (int b = 0; b < B; b++) n_new[b] = T - (b % 3) * (T > 2 ? T / 3 : 0); /* padded rows */
        lmx_batch bt = {.B = B, .T = T, .n_past = n_past, .n_new = n_new};
        int M = B * T;
        float *q = rand_vec((int64_t)M * H * D, 1.0f), *k = rand_vec((int64_t)M * KD, 1.0f),
              *v = rand_vec((int64_t)M * KD, 1.0f);
        lmx_tensor qg = act(gpu, M, H * D, q), qc = act(cpu, M, H * D, q), kg_ = act(gpu, M, KD, k),
                   kc_ = act(cpu, M, KD, k), vg = act(gpu, M, KD, v), vc = act(cpu, M, KD, v),
                   og = act(gpu, M, H * D, NULL), oc = act(cpu, M, H * D, NULL);
        for (int b = 0; b < B; b++) {
            CHECK(gpu->ops->kv_reserve(gpu, &kg[b], n_past[b] + n_new[b], KD) == LMX_OK);
            CHECK(cpu->ops->kv_reserve(cpu, &kc[b], n_past[b] + n_new[b], KD) == LMX_OK);
        }
        float scale = 1.0f / sqrtf((float)D);
        lmx_attn_args ag = {.batch = &bt, .out = &og, .q = &qg, .k = &kg_, .v = &vg, .kv = pg, .H = H, .Hk = Hk,
                            .D = D, .scale = scale, .softcap = ac->softcap};
        lmx_attn_args acp = ag;
        acp.out = &oc, acp.q = &qc, acp.k = &kc_, acp.v = &vc, acp.kv = pc;
        CHECK(gpu->ops->attention(gpu, &ag) == LMX_OK);
        CHECK(cpu->ops->attention(cpu, &acp) == LMX_OK);
        CHECK(gpu->ops->kv_append(gpu, pg, &bt, &kg_, &vg) == LMX_OK);
        CHECK(cpu->ops->kv_append(cpu, pc, &bt, &kc_, &vc) == LMX_OK);
        char what[160];
        snprintf(what, sizeof what, "attention %s step %d (T=%d)", ac->name, step, T);
        /* the cpu caches hold f32, the gpu ones bf16, and calls of 32 or more rows run on the tensor
         * cores with bf16 operands: compare those at bf16 precision */
        compare(what, &og, &oc, (int64_t)M * H * D, step == 0 && T < 32 ? 1e-5 : 1e-2);
        for (int b = 0; b < B; b++) n_past[b] += n_new[b];
        free_pair(&qg, &qc);
        free_pair(&kg_, &kc_);
        free_pair(&vg, &vc);
        free_pair(&og, &oc);
        free(q);
        free(k);
        free(v);
    }
    for (int b = 0; b < B; b++) {
        free_pair(&kg[b].k, &kc[b].k);
        free_pair(&kg[b].v, &kc[b].v);
    }
}

static void test_attention(void) {
    const attn_case cases[] = {
        {"mha", 1, 2, 2, 32, 0, 0, 0.0f, 3, 7, 1},
        {"gqa padded batch", 3, 8, 2, 64, 0, 0, 0.0f, 4, 9, 3},
        {"gqa softcap", 2, 4, 1, 128, 0, 0, 30.0f, 3, 5, 1},
        {"sliding rotating", 2, 4, 2, 64, 8, 8, 0.0f, 6, 11, 3},
        {"sliding unbounded", 1, 4, 2, 32, 5, 0, 0.0f, 4, 12, 2},
        {"long context splits", 1, 16, 4, 128, 0, 0, 0.0f, 3, 700, 1},
        {"long prefill batch", 2, 6, 3, 80, 0, 0, 0.0f, 1, 300, 2},
        {"head dim 256", 1, 4, 4, 256, 0, 0, 50.0f, 2, 40, 1},
        {"many heads per kv", 1, 20, 1, 64, 0, 0, 0.0f, 2, 30, 1},
        {"tiled sliding rotating", 2, 4, 2, 64, 40, 40, 0.0f, 2, 100, 33},
        {"tiled softcap gqa", 1, 8, 2, 32, 0, 0, 20.0f, 2, 70, 40},
        {"tiled chunks", 3, 4, 4, 128, 0, 0, 0.0f, 3, 64, 64},
        {"prefill llama shape", 1, 32, 8, 128, 0, 0, 0.0f, 1, 300, 40},
        {"prefill head dim 256 sliding", 2, 4, 1, 256, 48, 48, 0.0f, 2, 100, 50},
        {"prefill odd head dim", 1, 4, 2, 96, 0, 0, 0.0f, 1, 50, 1},
        {"head dim 512 (gemma 4 global)", 2, 8, 2, 512, 0, 0, 0.0f, 3, 40, 1},
        {"head dim 512, long, gqa 8", 1, 8, 1, 512, 0, 0, 30.0f, 2, 300, 2},
        {"head dim 320, sliding", 1, 6, 3, 320, 16, 0, 0.0f, 2, 50, 5},
        /* the decode kernel (cuda_attention.cu): long walks a warp (few splits: 16 kv heads' blocks of 4 rows fill
         * the GPU), a rotating cache wrapping (its keys loaded after the wait), and heads narrower than a lane's
         * dims (D < 32 DPL: the clamped loads, not FULL) */
        {"decode, batch 4, 16 kv heads, 1,100 keys", 4, 32, 16, 128, 0, 0, 0.0f, 2, 1100, 1},
        {"decode over a rotating cache as it wraps", 2, 8, 2, 128, 300, 300, 0.0f, 5, 290, 4},
        {"head dim 36", 2, 4, 2, 36, 0, 0, 10.0f, 3, 200, 1},
        /* one token a sequence on the tensor cores' decode kernel (cuda_flash_decode.cu; cuda_attention_plan): over
         * 1,024 keys or more (ATT_TC_KEYS) for 8 sequences or more in groups of 4 query heads or more (blocks of
         * two warps), over 8,192 or more for fewer in groups of 8 (four warps); the cases after them take it where
         * LMX_CUDA_ATT_TC says (the device check runs them so): with splits or one, gqa 1-16, a window over a rotating
         * cache as it wraps, two warps (8 sequences or more) and four */
        {"tensor-core decode: batch 16, gqa 8, 1,100 keys", 16, 16, 2, 128, 0, 0, 0.0f, 2, 1100, 1},
        {"tensor-core decode: batch 8, gqa 8, 1,100 keys", 8, 16, 2, 128, 0, 0, 0.0f, 2, 1100, 1},
        {"tensor-core decode: one row, gqa 8, 8,200 keys", 1, 16, 2, 128, 0, 0, 0.0f, 2, 8200, 1},
        {"tensor-core decode: gqa 8, softcap, 2,000 keys", 2, 16, 2, 128, 0, 0, 30.0f, 3, 2000, 1},
        {"tensor-core decode: heads of 64, gqa 16, rotating window", 1, 16, 1, 64, 1100, 1100, 0.0f, 14, 1090, 1},
        {"tensor-core decode: heads of 256, no gqa, padded batch", 3, 4, 4, 256, 0, 0, 0.0f, 2, 1030, 1},
        {"tensor-core decode: batch 8, gqa 4, splits", 8, 32, 8, 128, 0, 0, 0.0f, 2, 1500, 1},
        {"tensor-core decode: 64 kv heads, one split each", 8, 64, 64, 64, 0, 0, 0.0f, 2, 1100, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attn_case(&cases[i]);
}

/* The first prefill on Hopper's warpgroup kernel (head dims 64, 128): windows across its 64-row tiles,
 * soft-capping, padded rows, then prefill over the cache on the mma.sync kernel.  Run last, so that the
 * random data of the tests before it stay as they were. */
static void test_attention_wg(void) {
    const attn_case cases[] = {
        {"prefill sliding softcap gqa", 3, 8, 2, 128, 70, 0, 30.0f, 1, 260, 40},
        {"prefill head dim 64, long", 2, 6, 6, 64, 0, 0, 0.0f, 1, 700, 33},
        {"prefill head dim 128, long, gqa", 2, 8, 2, 128, 0, 0, 0.0f, 1, 700, 33},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_attn_case(&cases[i]);
}

/* ---- top-k --------------------------------------------------------------------------------- */

static const float *g_rowp;
static int desc_then_index(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    if (g_rowp[i] != g_rowp[j]) return g_rowp[i] > g_rowp[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* The k largest of each row (largest first, equal values by lower index) against a host sort, with
 * many equal values, rows shorter and longer than one slice, and every k up to the maximum. */
static void test_topk(void) {
    struct { int R, n, k; float step; } cases[] = {
        {1, 151936, 40, 0.01f}, {1, 151936, 1, 0.5f}, {3, 262144, 256, 0.25f}, {2, 1000, 7, 0.0f},
        {5, 300, 256, 1.0f}, {1, 4097, 256, 0.125f}, {8, 128256, 1, 1e-3f}, {2, 50, 1, 0.0f}, {1, 70000, 100, 2.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int R = cases[c].R, n = cases[c].n, k = cases[c].k;
        int64_t total = (int64_t)R * n;
        float *x = malloc((size_t)total * 4);
        for (int64_t i = 0; i < total; i++) /* step 0: all equal; else a coarse grid with many ties */
            x[i] = cases[c].step > 0 ? (float)(int)(40.0f * frand() / cases[c].step) * cases[c].step : 1.5f;
        lmx_tensor xg = act(gpu, R, n, x);
        float *vals = malloc((size_t)R * k * 4);
        int32_t *idx = malloc((size_t)R * k * 4);
        CHECK(gpu->ops->topk(gpu, &xg, R, n, k, vals, idx) == LMX_OK);
        int *order = malloc((size_t)n * sizeof *order), bad = 0;
        for (int r = 0; r < R; r++) {
            for (int i = 0; i < n; i++) order[i] = i;
            g_rowp = x + (int64_t)r * n;
            qsort(order, (size_t)n, sizeof *order, desc_then_index);
            for (int i = 0; i < k; i++)
                bad += idx[(int64_t)r * k + i] != order[i] || vals[(int64_t)r * k + i] != g_rowp[order[i]];
        }
        CHECK_MSG(bad == 0, "topk R=%d n=%d k=%d: %d of %d entries differ from the sort", R, n, k, bad, R * k);
        gpu->ops->release(gpu, &xg);
        free(x);
        free(vals);
        free(idx);
        free(order);
    }
    lmx_tensor xg = act(gpu, 1, 10, NULL);
    float v[1];
    int32_t i1[1];
    CHECK(gpu->ops->topk(gpu, &xg, 1, 10, 11, v, i1) == LMX_ERR_INVALID_ARG);
    gpu->ops->release(gpu, &xg);
}

/* ---- mixture of experts ----------------------------------------------------------------------- */

/* The cuda moe op (routing and the chosen experts on the GPU) against the routing of backend.h done
 * here in double (logits: LOGITS_TIES equal and NaN ones in rows 0 and 1, LOGITS_SKEWED every row choosing expert 0;
 * else random) and the experts
 * run by the cpu backend's matmul and glu, row by row.  Up to 512 pairs:
 * the one-row kernels with x in f32 (float32 tolerance; GGUF experts: x in int16, 5e-4); more: Q4_K gate / up
 * beside Q4_K or Q6_K down grouped by expert on the integer tensor cores (cuda_moe_rows.cu: 5e-4, and the rows
 * after the first 512 pairs the bits of a launch of those rows alone), other experts (and every one with
 * LMX_CUDA_MOE_ROWS=0) by the grouped GEMMs, which take x and the GLU's output as bf16 (a bf16 tolerance). */
enum { LOGITS_RANDOM, LOGITS_TIES, LOGITS_SKEWED }; /* test_moe_case's router logits */
static lmx_backend *cuda_with2(const char *var, const char *val, const char *var2, const char *val2);
static int g_tiled_cases; /* moe cases whose experts the gpu holds in tiles (unless LMX_CUDA_MOE_TILES=0) */
static void test_moe_case_down(const char *name, lmx_dtype dt, int bits, int gtype, int gdown, int E, int K, int C,
                               int F, int M, int norm_topk, int scaled, int logits) {
    wpair *w = malloc((size_t)3 * E * sizeof *w);
    lmx_tensor *eg = malloc((size_t)3 * E * sizeof *eg);
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            const int gt = j == 2 ? gdown : gtype;
            /* one expert's weight: experts 1 (its rows are one expert's, as a stacked tensor's views are) */
            w[3 * e + j] = make_weight_ex(dt, bits, bits ? 64 : 0, gt, j == 2 ? C : F, j == 2 ? F : C, LMX_DTYPE_BF16, 1);
            eg[3 * e + j] = w[3 * e + j].g;
        }
    float *x = rand_vec((int64_t)M * C, 1.0f), *out0 = rand_vec((int64_t)M * C, 1.0f), *z = rand_vec((int64_t)M * E, 3.0f);
    float *es = scaled ? rand_vec(E, 1.0f) : NULL;
    if (logits == LOGITS_TIES) /* row 0: every logit equal (the lower indices win); row 1, if any: NaN everywhere */
        for (int e = 0; e < E; e++) z[e] = 0.5f, z[(M > 1 ? E : 0) + e] = M > 1 ? NAN : 0.5f;
    if (logits == LOGITS_SKEWED) /* every row chooses expert 0, by a little */
        for (int i = 0; i < M; i++) {
            float *zi = z + (int64_t)i * E;
            for (int e = 1; e < E; e++) zi[0] = zi[e] > zi[0] ? zi[e] : zi[0];
            zi[0] += 0.01f;
        }
    const float lscale = scaled ? 0.25f : 1.0f;
    lmx_tensor xg = act(gpu, M, C, x), og = act(gpu, M, C, out0), zg = act(gpu, M, E, z);
    const lmx_moe_args a = {&og, &xg, &zg, eg, es, M, E, K, norm_topk, lscale, LMX_ACT_SILU, 1};
    CHECK(gpu->ops->moe && gpu->ops->moe(gpu, &a) == LMX_OK);
    float *got = fetch(gpu, &og, (int64_t)M * C);
    double *want = malloc((size_t)M * C * sizeof *want);
    lmx_tensor xr = act(cpu, 1, C, NULL), g = act(cpu, 1, F, NULL), u = act(cpu, 1, F, NULL), y = act(cpu, 1, C, NULL);
    for (int i = 0; i < M; i++) {
        const float *zi = z + (int64_t)i * E;
        for (int c = 0; c < C; c++) want[(int64_t)i * C + c] = out0[(int64_t)i * C + c];
        if (logits == LOGITS_TIES && i == 1) continue; /* NaN logits: only that nothing breaks (checked below) */
        double p[64];
        int pick[64];
        const double ksum = moe_ref_route(zi, E, K, lscale, pick, p);
        CHECK(cpu->ops->write(cpu, &xr, 0, x + (int64_t)i * C, (size_t)C * 4) == LMX_OK);
        for (int k = 0; k < K; k++) {
            const int e = pick[k];
            const double wk = (norm_topk ? p[k] / ksum : p[k]) * (es ? es[e] : 1.0);
            CHECK(cpu->ops->matmul(cpu, &g, &xr, &w[3 * e].c, NULL, 1) == LMX_OK);
            CHECK(cpu->ops->matmul(cpu, &u, &xr, &w[3 * e + 1].c, NULL, 1) == LMX_OK);
            CHECK(cpu->ops->glu(cpu, &g, &g, &u, F, LMX_ACT_SILU) == LMX_OK);
            CHECK(cpu->ops->matmul(cpu, &y, &g, &w[3 * e + 2].c, NULL, 1) == LMX_OK);
            for (int c = 0; c < C; c++) want[(int64_t)i * C + c] += wk * ((const float *)y.data)[c];
        }
    }
    double d2 = 0, r2 = 0;
    for (int i = 0; i < M; i++)
        for (int c = 0; c < C; c++) {
            const int64_t o = (int64_t)i * C + c;
            if (logits == LOGITS_TIES && i == 1) continue;
            d2 += (got[o] - want[o]) * (got[o] - want[o]), r2 += want[o] * want[o];
        }
    const char *mm = getenv("LMX_CUDA_MOE_MMA"), *rw = getenv("LMX_CUDA_MOE_ROWS");
    const int by_expert = M * K > 512 && gtype == LMX_GGML_Q4_K && (gdown == LMX_GGML_Q4_K || gdown == LMX_GGML_Q6_K) &&
                          F % 256 == 0 && C % 256 == 0 && !(rw && rw[0] == '0'); /* cuda_moe_rows.cu */
    const double err = sqrt(d2) / sqrt(r2 > 0 ? r2 : 1),
                 tol = M * K > 512 && !by_expert ? 1e-2 : gtype ? 5e-4 : 1e-4;
    CHECK_MSG(err <= tol, "moe %s E=%d K=%d C=%d F=%d M=%d norm_topk=%d scaled=%d logits=%d%s: relative error %.3g", name,
              E, K, C, F, M, norm_topk, scaled, logits, by_expert ? " (by expert)" : "", err);
    /* the rows after the first launch's (512 pairs): the bits of a launch of those rows alone (the decode kernels, on
     * the tensor cores from 8 rows: LMX_CUDA_MOE_MMA unset; in tiles, any rows take their arithmetic) */
    if (by_expert && !mm && M - 512 / K >= 8) {
        const int R = 512 / K, n = M - R < R ? M - R : R;
        lmx_tensor x1 = act(gpu, n, C, x + (int64_t)R * C), o1 = act(gpu, n, C, out0 + (int64_t)R * C),
                   z1 = act(gpu, n, E, z + (int64_t)R * E);
        lmx_moe_args a1 = a;
        a1.out = &o1, a1.x = &x1, a1.logits = &z1, a1.M = n;
        CHECK(gpu->ops->moe(gpu, &a1) == LMX_OK);
        float *got1 = fetch(gpu, &o1, (int64_t)n * C);
        CHECK_MSG(!memcmp(got1, got + (int64_t)R * C, (size_t)n * C * sizeof *got1),
                  "moe %s M=%d: rows %d.. differ from a launch of %d rows alone", name, M, R, n);
        gpu->ops->release(gpu, &x1), gpu->ops->release(gpu, &o1), gpu->ops->release(gpu, &z1);
        free(got1);
    }
    /* experts uploaded in tiles (by default): the same bits as a backend that keeps their rows.  Q4_K gate / up in
     * tiles take the tensor-core path's arithmetic at any row count (cuda_moe_tiles_gu), and so does one row's Q4_K or
     * Q6_K down beside them (cuda_moe_one): then the rows' backend takes the tensor cores from two rows
     * (LMX_CUDA_MOE_MMA=2, down as this run's unless one row's), one row run twice as a batch of two. */
    int tiled = 0;
    for (int i = 0; i < 3 * E; i++)
        tiled |= eg[i].q.ggml_type == LMX_GGML_Q4_K_T16 || eg[i].q.ggml_type == LMX_GGML_Q6_K_T16;
    const char *mma = getenv("LMX_CUDA_MOE_MMA");
    const int dmin = mma ? atoi(strchr(mma, ',') ? strchr(mma, ',') + 1 : mma) : 2; /* down's fewest rows */
    const int gu_mq = tiled && gtype == LMX_GGML_Q4_K && F % 16 == 0 && C % 256 == 0;
    const int down_mq = (gdown == LMX_GGML_Q4_K || gdown == LMX_GGML_Q6_K) && F % 256 == 0 &&
                        (M == 1 ? gu_mq : dmin > 0 && M >= (dmin > 2 ? dmin : 2));
    if (tiled) {
        g_tiled_cases++;
        lmx_backend *g2 = cuda_with2("LMX_CUDA_MOE_TILES", "0", gu_mq ? "LMX_CUDA_MOE_MMA" : NULL, down_mq ? "2" : "2,0");
        const int one = gu_mq && M == 1;
        lmx_tensor *rows = malloc((size_t)3 * E * sizeof *rows);
        for (int i = 0; i < 3 * E && g2; i++) {
            rows[i] = w[i].c; /* the host blocks (the cpu backend reads them in place) */
            CHECK(g2->ops->upload_weight(g2, &rows[i]) == LMX_OK);
            CHECK(rows[i].q.ggml_type != LMX_GGML_Q4_K_T16 && rows[i].q.ggml_type != LMX_GGML_Q6_K_T16);
        }
        if (g2) {
            const int M2 = one ? 2 : M; /* one: the row twice */
            float *x2h = malloc((size_t)M2 * C * sizeof *x2h), *o2h = malloc((size_t)M2 * C * sizeof *o2h),
                  *z2h = malloc((size_t)M2 * E * sizeof *z2h);
            for (int i = 0; i < M2; i++) {
                memcpy(x2h + (int64_t)i * C, x + (int64_t)(i % M) * C, (size_t)C * sizeof *x);
                memcpy(o2h + (int64_t)i * C, out0 + (int64_t)(i % M) * C, (size_t)C * sizeof *x);
                memcpy(z2h + (int64_t)i * E, z + (int64_t)(i % M) * E, (size_t)E * sizeof *z);
            }
            lmx_tensor x2 = act(g2, M2, C, x2h), o2 = act(g2, M2, C, o2h), z2 = act(g2, M2, E, z2h);
            lmx_moe_args a2 = a;
            a2.out = &o2, a2.x = &x2, a2.logits = &z2, a2.experts = rows, a2.M = M2;
            CHECK(g2->ops->moe(g2, &a2) == LMX_OK);
            float *got2 = fetch(g2, &o2, (int64_t)M * C);
            int64_t bad = -1;
            for (int64_t o = 0; o < (int64_t)M * C && bad < 0; o++)
                if (memcmp(&got[o], &got2[o], sizeof *got) && !(isnan(got[o]) && isnan(got2[o]))) bad = o;
            CHECK_MSG(bad < 0, "moe %s M=%d: in tiles y[%lld] %.9g, in rows%s %.9g", name, M, (long long)bad,
                      bad < 0 ? 0.0 : got[bad], one ? " (tensor cores, two rows)" : "", bad < 0 ? 0.0 : got2[bad]);
            g2->ops->release(g2, &x2), g2->ops->release(g2, &o2), g2->ops->release(g2, &z2);
            free(got2), free(x2h), free(o2h), free(z2h);
            lmx_backend_free(g2);
        }
        free(rows);
    }
    /* the op declines what it does not take (nothing written): more experts than it routes */
    lmx_moe_args big = a;
    big.E = 300;
    CHECK(gpu->ops->moe(gpu, &big) == LMX_ERR_UNSUPPORTED);
    cpu->ops->release(cpu, &xr), cpu->ops->release(cpu, &g), cpu->ops->release(cpu, &u), cpu->ops->release(cpu, &y);
    gpu->ops->release(gpu, &xg), gpu->ops->release(gpu, &og), gpu->ops->release(gpu, &zg);
    free(got), free(want), free(x), free(out0), free(z), free(es), free(eg), free(w);
}

/* down as a Q4_K_M file mixes them: Q6_K beside Q4_K gate / up */
static void test_moe_case(const char *name, lmx_dtype dt, int bits, int gtype, int E, int K, int C, int F, int M,
                          int norm_topk, int scaled, int logits) {
    test_moe_case_down(name, dt, bits, gtype, gtype == LMX_GGML_Q4_K ? LMX_GGML_Q6_K : gtype, E, K, C, F, M, norm_topk,
                       scaled, logits);
}

static void test_moe(void) {
    const int Ms[] = {1, 3, 8, 40};
    for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
        test_moe_case("bf16", LMX_DTYPE_BF16, 0, 0, 16, 4, 256, 96, Ms[i], 1, 0, 0);
        test_moe_case("bf16", LMX_DTYPE_BF16, 0, 0, 40, 8, 128, 64, Ms[i], 0, 1, 0);
        test_moe_case("mlx q4", LMX_DTYPE_U32, 4, 0, 12, 2, 192, 128, Ms[i], 1, 0, 0);
        test_moe_case("mlx q8", LMX_DTYPE_U32, 8, 0, 8, 2, 128, 64, Ms[i], 1, 1, 0);
        test_moe_case("gguf q4_k / q6_k", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 8, 2, 256, 256, Ms[i], 1, 0, 0);
        test_moe_case("gguf q8_0", LMX_DTYPE_U8, 0, LMX_GGML_Q8_0, 6, 3, 64, 96, Ms[i], 0, 1, 0);
        test_moe_case("gguf q5_k", LMX_DTYPE_U8, 0, LMX_GGML_Q5_K, 8, 2, 256, 256, Ms[i], 1, 0, 0);
    }
    /* one row of Q4_K gate / up staged in shared memory (k_moe_gu_staged) over more rows than a block's first group
     * (8 x 512 rows: about 11 a block on 132 multiprocessors) and rows of 36 units (lanes 0-3 take two) */
    test_moe_case("gguf q4_k / q6_k, wide", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 16, 8, 2304, 512, 1, 1, 0, 0);
    test_moe_case("bf16 ties", LMX_DTYPE_BF16, 0, 0, 16, 4, 64, 32, 2, 1, 0, LOGITS_TIES);
    test_moe_case("f32 ties", LMX_DTYPE_F32, 0, 0, 8, 3, 64, 32, 1, 0, 0, LOGITS_TIES);
    test_moe_case("f32 ties, grouped", LMX_DTYPE_F32, 0, 0, 8, 3, 64, 32, 200, 0, 0, LOGITS_TIES);
    test_moe_case("bf16, idle experts", LMX_DTYPE_BF16, 0, 0, 200, 2, 64, 32, 300, 1, 0, 0);
    test_moe_case("bf16, two rounds", LMX_DTYPE_BF16, 0, 0, 24, 8, 64, 32, 2100, 1, 0, 0); /* rounds of 16,384 pairs */
    test_moe_case("mlx q4, two rounds", LMX_DTYPE_U32, 4, 0, 24, 8, 64, 64, 2100, 1, 0, 0);
    /* the grouped GEMMs' experts dequantized a launch a run (cuda_dequant_list_bf16): MLX 8-bit, GGUF Q8_0, Q5_K
     * gate / up beside Q6_K down (Q4_K's with LMX_CUDA_MOE_ROWS=0, below) */
    test_moe_case("mlx q8, grouped", LMX_DTYPE_U32, 8, 0, 8, 2, 128, 64, 300, 1, 1, 0);
    test_moe_case("gguf q8_0, grouped", LMX_DTYPE_U8, 0, LMX_GGML_Q8_0, 6, 3, 64, 96, 200, 0, 1, 0);
    test_moe_case_down("gguf q5_k / q6_k, grouped", LMX_DTYPE_U8, 0, LMX_GGML_Q5_K, LMX_GGML_Q6_K, 8, 2, 256, 256, 300, 1,
                       0, 0);
    /* every expert's places padded to the power of two at or above its count (a batched GEMM for each size in a
     * run of experts): every row choosing expert 0 (skewed: one expert of 2,048 places in a round beside small ones) */
    test_moe_case("mlx q4, skewed", LMX_DTYPE_U32, 4, 0, 64, 2, 64, 64, 1100, 1, 0, LOGITS_SKEWED);
    /* past 512 pairs, grouped by expert: rows that spread over the experts (16, 200 rows), places of an expert past a
     * block's 32 (8 experts, 1,100 rows; by the grouped GEMMs with LMX_CUDA_MOE_ROWS=0), two rounds (4,200 rows),
     * experts no pair chose and the plan's empty tiles after the others (256 experts, 300 rows of 2) */
    test_moe_case("gguf q4_k / q6_k, spread", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 16, 4, 256, 256, 200, 1, 0, 0);
    test_moe_case("gguf q4_k / q6_k, idle experts", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 256, 2, 256, 256, 300, 1, 0, 0);
    test_moe_case("gguf q4_k / q6_k, grouped", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 8, 4, 256, 256, 1100, 1, 0, 0);
    test_moe_case_down("gguf q4_k, two rounds", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q4_K, 12, 4, 512, 256, 4200, 0,
                       1, 0);
    /* several rows of Q4_K gate / up beside Q4_K or Q6_K down on the integer tensor cores (cuda_moe_mma.cu): rows of
     * several super-blocks, experts chosen by one pair to twenty (passes of eight) */
    test_moe_case_down("gguf q4_k, mma", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q4_K, 16, 4, 512, 768, 8, 1, 0, 0);
    test_moe_case_down("gguf q4_k / q6_k, mma", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q6_K, 16, 8, 512, 768, 32, 1, 0, 0);
    test_moe_case_down("gguf q4_k, mma, passes", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q4_K, 6, 3, 256, 512, 40, 0, 1, 0);
    /* only gate / up (Q4_K) or only down (Q6_K) in tiles: gate / up by cuda_moe_tiles_gu beside the per-pair down
     * from rows, or the per-pair GEMVs' tiled down (k_moe_ggemv) beside rows' gate / up; not cuda_moe_one */
    for (int m = 1; m <= 3; m += 2) {
        test_moe_case_down("gguf q4_k / q5_k", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q5_K, 8, 2, 256, 256, m, 1, 0, 0);
        test_moe_case_down("gguf q5_k / q6_k", LMX_DTYPE_U8, 0, LMX_GGML_Q5_K, LMX_GGML_Q6_K, 8, 2, 256, 256, m, 1, 0, 0);
    }
    /* gate / up's x staged for 2,304 values: with the kernel's own tables past the 48 KB a launch takes unasked */
    test_moe_case_down("gguf q4_k / q6_k, mma, wide", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, LMX_GGML_Q6_K, 16, 8, 2304, 512, 16, 1, 0, 0);
    const char *tiles = getenv("LMX_CUDA_MOE_TILES");
    CHECK_MSG((tiles && tiles[0] == '0') || g_tiled_cases > 0, "experts in tiles by default, but no moe case's were");
}

/* A second cuda backend created with environment variable var set to val and (var2 not NULL) var2 to val2 (its
 * switches are read at creation), or NULL (a failed check). */
static lmx_backend *cuda_with2(const char *var, const char *val, const char *var2, const char *val2) {
    lmx_backend *be = NULL;
    lmx_err err = {0};
    const char *vars[2] = {var, var2}, *vals[2] = {val, val2};
    char was[2][64];
    int had[2] = {0, 0}; /* restored after: the run's own settings for the tests after */
    for (int i = 0; i < 2 && vars[i]; i++) {
        had[i] = getenv(vars[i]) != NULL;
        if (had[i]) snprintf(was[i], sizeof was[i], "%s", getenv(vars[i]));
        setenv(vars[i], vals[i], 1);
    }
    CHECK_MSG(lmx_cuda_backend_create(&be, &err) == LMX_OK, "a second cuda backend (%s=%s): %s", var, val, err.msg);
    for (int i = 0; i < 2 && vars[i]; i++)
        if (had[i]) setenv(vars[i], was[i], 1);
        else unsetenv(vars[i]);
    return be;
}
static lmx_backend *cuda_with(const char *var, const char *val) { return cuda_with2(var, val, NULL, NULL); }

/* ... with graphs off: the eager reference of the graph tests. */
static lmx_backend *eager_cuda(void) { return cuda_with("LMX_CUDA_GRAPH", "0"); }

/* ---- decode graphs: fused groups of GGUF weights ------------------------------------------------ */

#define GG_C 512 /* hidden size */
#define GG_E 8   /* experts, 2 chosen, each an FFN of 256 */
#define GG_F 300 /* the dense cases' gate / up rows */
/* One backend's tensors for a decode step: x = table[ids]; [h = norm1(x), z = router h, x += experts(h, z);]
 * xn = norm2(x); y[j] = w[j] xn (the q/k/v group, of the types the case gives); [yu = wu xn, yg = glu(wg xn, yu):
 * the dense cases]. */
typedef struct gg_set {
    lmx_tensor table, n1, n2, router, w[3], ex[3 * GG_E], wg, wu, wd;
    lmx_tensor x, h, z, xn, y[3], yg, yu, yd;
} gg_set;

static void gg_alloc(lmx_backend *be, gg_set *s, int M, const int *N) {
    s->x = act(be, M, GG_C, NULL), s->h = act(be, M, GG_C, NULL), s->z = act(be, M, GG_E, NULL);
    s->xn = act(be, M, GG_C, NULL);
    for (int j = 0; j < 3; j++) s->y[j] = act(be, M, N[j], NULL);
    if (M % 2) /* gate's and up's outputs in both orders (the graph's batched pair takes either) */
        s->yu = act(be, M, GG_F, NULL), s->yg = act(be, M, GG_F, NULL);
    else
        s->yg = act(be, M, GG_F, NULL), s->yu = act(be, M, GG_F, NULL);
    s->yd = act(be, M, GG_C, NULL);
}
static void gg_release(lmx_backend *be, gg_set *s) {
    lmx_tensor *t[] = {&s->x, &s->h, &s->z, &s->xn, &s->y[0], &s->y[1], &s->y[2], &s->yg, &s->yu, &s->yd};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) be->ops->release(be, t[i]);
}
/* weight w (its host form) uploaded to backend be as well */
static lmx_tensor gg_upload(lmx_backend *be, const lmx_tensor *host) {
    lmx_tensor t = *host;
    CHECK(be->ops->upload_weight(be, &t) == LMX_OK);
    return t;
}

/* Q4_K kept in blocks (a mixture model's weights, marked as the loader marks them, are never repacked): 9-32 rows of x
 * by k_gemv_st (x and the weights in f16, K parts of 1-4 super-blocks meeting in a cluster; K past 4,096 too), 40
 * cuBLAS, each against the cpu at the tensor cores' tolerance, and so a second backend with LMX_CUDA_GEMV_ST=0 (the
 * integer tensor cores, x in int16; K past 4,096 the bf16 ones), which must give other bits where k_gemv_st takes the
 * rows (unless this run turned it off or up, or the GPU is older than sm_90): it ran.  Then weights whose values f16
 * cannot hold, which neither k_gemv_st nor the f16 MLX groups may take. */
static void test_matmul_st(void) {
    const struct { int N, K; } sh[] = {{300, 4096}, {1100, 2048}, {70, 256}, {130, 768}, {90, 6144}};
    const int Ms[] = {9, 16, 17, 24, 25, 32, 40};
    const char *st = getenv("LMX_CUDA_GEMV_ST");
    lmx_device_info dev[8];
    int ndev = 0, cc = 0; /* the GPU's compute capability: k_gemv_st's parts meet in a cluster, sm_90 on */
    if (lmx_devices(dev, 8, &ndev) == LMX_OK)
        for (int i = 0; i < ndev && i < 8 && !cc; i++)
            if (!strcmp(dev[i].backend, "cuda")) cc = dev[i].cc_major;
    const int st_from = cc < 9 ? 0 : st ? atoi(st) : 9; /* CUDA_GEMV_ST_ROWS */
    lmx_backend *plain = cuda_with("LMX_CUDA_GEMV_ST", "0");
    if (!plain) return;
    for (size_t s = 0; s < sizeof sh / sizeof sh[0]; s++)
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
            const int N = sh[s].N, K = sh[s].K, M = Ms[i], bias = (int)(i & 1);
            wpair w = make_weight_ex(LMX_DTYPE_U8, 0, 0, LMX_GGML_Q4_K, N, K, LMX_DTYPE_BF16, -1);
            wpair b = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, N);
            lmx_tensor wp = gg_upload(plain, &w.c), bp = gg_upload(plain, &b.c);
            CHECK(w.g.q.ggml_type == LMX_GGML_Q4_K); /* kept in blocks */
            float *x = rand_vec((int64_t)M * K, 1.0f);
            lmx_tensor xg = act(gpu, M, K, x), xc = act(cpu, M, K, x), yg = act(gpu, M, N, NULL), yc = act(cpu, M, N, NULL);
            lmx_tensor xp = act(plain, M, K, x), yp = act(plain, M, N, NULL);
            CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, bias ? &b.g : NULL, M) == LMX_OK);
            CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, bias ? &b.c : NULL, M) == LMX_OK);
            CHECK(plain->ops->matmul(plain, &yp, &xp, &wp, bias ? &bp : NULL, M) == LMX_OK);
            float *a = fetch(gpu, &yg, (int64_t)M * N), *p = fetch(plain, &yp, (int64_t)M * N);
            const int same = !memcmp(a, p, (size_t)M * N * sizeof *a), want_same = !(st_from > 0 && M >= st_from && M <= 32);
            CHECK_MSG(same == want_same, "matmul q4_k blocks N=%d K=%d M=%d: %s bits as LMX_CUDA_GEMV_ST=0", N, K, M,
                      same ? "the same" : "other");
            char what[128];
            snprintf(what, sizeof what, "matmul q4_k blocks N=%d K=%d M=%d bias=%d", N, K, M, bias);
            compare(what, &yg, &yc, (int64_t)M * N, M > 32 ? 2e-2 : 5e-3);
            float *r = fetch(cpu, &yc, (int64_t)M * N); /* and the second backend's kernels */
            const double e = rel_err(p, r, (int64_t)M * N), tol = M > 32 ? 2e-2 : 5e-3;
            CHECK_MSG(e <= tol, "%s, LMX_CUDA_GEMV_ST=0: relative error %.3g > %.3g", what, e, tol);
            free(a), free(p), free(r);
            free_pair(&xg, &xc);
            free_pair(&yg, &yc);
            plain->ops->release(plain, &xp), plain->ops->release(plain, &yp);
            free(x);
        }
    /* one block's d of 100 and its first sub-block's scale 63: 15 x 63 x 100 is past f16's 65,504.  A mixture model's
     * weight (kept in blocks): k_gemv_st declines it (the integer kernel's bits).  A dense model's: the upload does
     * not rewrite it as f16-scaled MLX groups (the tensor-core GEMV forms q s + b in f16), so it keeps its blocks too.
     * Either way the product is the cpu's. */
    const struct { int experts, M; } big[] = {{-1, 24}, {0, 1}, {0, 8}, {0, 24}};
    for (size_t c = 0; c < sizeof big / sizeof big[0]; c++) {
        const int N = 70, K = 512, experts = big[c].experts, M = big[c].M;
        const size_t rb = lmx_ggml_row_bytes(LMX_GGML_Q4_K, K);
        uint8_t *h = malloc(rb * N); /* aliased by the cpu backend: kept */
        for (size_t i = 0; i < rb * N; i++) h[i] = (uint8_t)urand();
        for (int b = 0; b < N * (K / 256); b++)
            put_f16(h + 144 * b, b == 3 ? 100.0f : 0.002f * (1.5f + frand())), put_f16(h + 144 * b + 2, 0.002f * (1.5f + frand()));
        h[144 * 3 + 4] |= 63;
        const lmx_tensor t = {.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {N, K}, .data = h,
                              .q = {.ggml_type = LMX_GGML_Q4_K, .experts = experts}};
        wpair w = {t, t};
        CHECK(gpu->ops->upload_weight(gpu, &w.g) == LMX_OK);
        CHECK(cpu->ops->upload_weight(cpu, &w.c) == LMX_OK);
        CHECK_MSG(w.g.q.ggml_type == LMX_GGML_Q4_K, "q4_k past f16's reach (experts %d): rewritten as f16 groups", experts);
        lmx_tensor wp = gg_upload(plain, &w.c);
        float *x = rand_vec((int64_t)M * K, 1.0f);
        lmx_tensor xg = act(gpu, M, K, x), xc = act(cpu, M, K, x), yg = act(gpu, M, N, NULL), yc = act(cpu, M, N, NULL);
        lmx_tensor xp = act(plain, M, K, x), yp = act(plain, M, N, NULL);
        CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, NULL, M) == LMX_OK);
        CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, NULL, M) == LMX_OK);
        CHECK(plain->ops->matmul(plain, &yp, &xp, &wp, NULL, M) == LMX_OK);
        float *a = fetch(gpu, &yg, (int64_t)M * N), *p = fetch(plain, &yp, (int64_t)M * N);
        char what[128];
        snprintf(what, sizeof what, "matmul q4_k, d past f16's reach, experts %d, M=%d", experts, M);
        CHECK_MSG(!memcmp(a, p, (size_t)M * N * sizeof *a), "%s: k_gemv_st took it", what);
        compare(what, &yg, &yc, (int64_t)M * N, 5e-3);
        free(a), free(p);
        free_pair(&xg, &xc);
        free_pair(&yg, &yc);
        plain->ops->release(plain, &xp), plain->ops->release(plain, &yp);
        free(x);
    }
    lmx_backend_free(plain);
}

static void gg_step(lmx_backend *be, gg_set *s, const int32_t *ids, int M, int moe) {
    CHECK(be->ops->embed(be, &s->x, &s->table, ids, M, 1.0f) == LMX_OK);
    if (s->wg.data) { /* the dense cases: a residual add before the norm (one launch with it in a graph) */
        CHECK(be->ops->embed(be, &s->h, &s->table, ids, M, -0.5f) == LMX_OK);
        CHECK(be->ops->add(be, &s->x, &s->h, (int64_t)M * GG_C) == LMX_OK);
    }
    if (moe) {
        CHECK(be->ops->rmsnorm(be, &s->h, &s->x, &s->n1, M, GG_C, 1e-6f, 0.0f) == LMX_OK);
        CHECK(be->ops->matmul(be, &s->z, &s->h, &s->router, NULL, M) == LMX_OK);
        const lmx_moe_args a = {&s->x, &s->h, &s->z, s->ex, NULL, M, GG_E, 2, 1, 1.0f, LMX_ACT_SILU, 1};
        CHECK(be->ops->moe(be, &a) == LMX_OK);
    }
    CHECK(be->ops->rmsnorm(be, &s->xn, &s->x, &s->n2, M, GG_C, 1e-6f, 0.0f) == LMX_OK);
    for (int j = 0; j < 3; j++) CHECK(be->ops->matmul(be, &s->y[j], &s->xn, &s->w[j], NULL, M) == LMX_OK);
    if (s->wg.data) { /* the dense cases: gate / up and the GLU, one launch in a graph */
        CHECK(be->ops->matmul(be, &s->yg, &s->xn, &s->wg, NULL, M) == LMX_OK);
        CHECK(be->ops->matmul(be, &s->yu, &s->xn, &s->wu, NULL, M) == LMX_OK);
        CHECK(be->ops->glu(be, &s->yg, &s->yg, &s->yu, (int64_t)M * GG_F, LMX_ACT_SILU) == LMX_OK);
        if (s->wd.data) CHECK(be->ops->matmul(be, &s->yd, &s->yg, &s->wd, NULL, M) == LMX_OK); /* down */
    }
}

/* A decode step run three times: the first records it, the next two replay it as a graph whose launches
 * fold the norm into q/k/v, take q/k/v of one or two GGUF types as one launch after one quantization of x
 * (k_ggemv_mix; other mixes a launch per type), and (moe) fold the norm before the router into it and the
 * experts' combine into q/k/v's quantization.  Without moe every step is checked against the cpu
 * (int16 x: 2e-4, as one row of test_matmul); with it against the same steps on a second cuda backend
 * with graphs off, which test_moe checks against the cpu: the fusions do the eager arithmetic in its
 * order (1e-6). */
static void test_graph_gguf_case(const char *name, const int *types, int M, int moe, lmx_backend *eager) {
    const int N[3] = {200, 64, 72};
    wpair table = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 16, GG_C), n1 = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, GG_C),
          n2 = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, GG_C), router = make_weight(LMX_DTYPE_F32, 0, 0, 0, GG_E, GG_C);
    gg_set g, c;
    memset(&g, 0, sizeof g), memset(&c, 0, sizeof c);
    g.table = table.g, g.n1 = n1.g, g.n2 = n2.g, g.router = router.g;
    c.table = table.c, c.n1 = n1.c, c.n2 = n2.c, c.router = router.c;
    for (int j = 0; j < 3; j++) { /* (moe: marked as a mixture model's, as the loader marks them: kept in blocks) */
        wpair w = make_weight_ex(LMX_DTYPE_U8, 0, 0, types[j], N[j], GG_C, LMX_DTYPE_BF16, moe ? -1 : 0);
        g.w[j] = w.g, c.w[j] = w.c;
    }
    for (int e = 0; moe && e < GG_E; e++)
        for (int j = 0; j < 3; j++) {
            wpair w = make_weight_ex(LMX_DTYPE_U8, 0, 0, j == 2 ? LMX_GGML_Q6_K : LMX_GGML_Q4_K, j == 2 ? GG_C : 256,
                                     j == 2 ? 256 : GG_C, LMX_DTYPE_BF16, GG_E);
            g.ex[3 * e + j] = w.g, c.ex[3 * e + j] = w.c;
        }
    lmx_backend *ref = moe ? eager : cpu;
    if (moe) { /* the reference is the eager cuda backend: c's weights there */
        c.table = gg_upload(ref, &table.c), c.n1 = gg_upload(ref, &n1.c), c.n2 = gg_upload(ref, &n2.c);
        c.router = gg_upload(ref, &router.c);
        for (int j = 0; j < 3; j++) c.w[j] = gg_upload(ref, &c.w[j]);
        for (int i = 0; i < 3 * GG_E; i++) c.ex[i] = gg_upload(ref, &c.ex[i]);
    }
    gg_alloc(gpu, &g, M, N);
    gg_alloc(ref, &c, M, N);
    for (int step = 0; step < 3; step++) {
        int32_t ids[32] = {1 + step, 9 - step, 15 - 2 * step}; /* (M up to 32: rows 3 on cycle the table's 16) */
        for (int i = 3; i < M; i++) ids[i] = (5 * i + step) % 16;
        gg_step(gpu, &g, ids, M, moe);
        gg_step(ref, &c, ids, M, moe);
        for (int j = 0; j < 4; j++) {
            const lmx_tensor *tg = j < 3 ? &g.y[j] : &g.x, *tc = j < 3 ? &c.y[j] : &c.x;
            const int64_t n = (int64_t)M * (j < 3 ? N[j] : GG_C);
            float *a = fetch(gpu, tg, n), *b = fetch(ref, tc, n);
            /* Q4_K: scales and mins rounded to f16 (cuda_repack.cu) */
            const int q4k = types[0] == LMX_GGML_Q4_K || types[1] == LMX_GGML_Q4_K || types[2] == LMX_GGML_Q4_K;
            const double e = rel_err(a, b, n), tol = moe ? 1e-6 : q4k ? 5e-4 : 2e-4;
            CHECK_MSG(e <= tol, "graph %s M=%d step %d %s: relative error %.3g > %.3g", name, M, step,
                      j < 3 ? (const char *[]){"y0", "y1", "y2"}[j] : "x", e, tol);
            free(a), free(b);
        }
    }
    gg_release(gpu, &g);
    gg_release(ref, &c);
}

/* MLX 4- or 8-bit weights (bits, groups of 64) in a one-row decode graph: the norm folded into the q/k/v
 * group's launch (three sizes, odd rows), the gate/up pair with its GLU in another (k_gstream1; with K = GG_C
 * every block quantizes x), each step against the cpu at one row's int16 tolerance.
 * Dense weights (bf16 or f16) in a decode graph of 9-32 rows: the residual add and the norm as one launch; up
 * to 16 rows the q/k/v group as one launch and the gate/up pair with its GLU as another (k_gemv_tc), from 17
 * rows cuBLAS for each matmul (bf16: reading the norm's bf16 copy of its output, written in its launch) and the
 * glu op; each step against the cpu at the tensor cores' tolerance (x rounded to bf16 or f16), and (eager
 * non-NULL, bf16 from 17 rows) against a cuda backend with graphs off bit for bit.  GGUF weights (types: q, k,
 * v, gate and up) and MLX 8-bit, 9-32 rows: the tensor-core GEMV's groups and pairs (cuda_gemv_tc.cu). */
static void test_graph_dense_case(lmx_dtype dt, int bits, const int *types, int M, lmx_backend *eager) {
    const int N[3] = {200, 64, 72};
    wpair table = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 16, GG_C), n2 = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, GG_C);
    gg_set g, c;
    memset(&g, 0, sizeof g), memset(&c, 0, sizeof c);
    g.table = table.g, g.n2 = n2.g, c.table = table.c, c.n2 = n2.c;
    for (int j = 0; j < 5; j++) {
        wpair w = make_weight(dt, bits, bits ? 64 : 0, types ? types[j] : 0, j < 3 ? N[j] : GG_F, GG_C);
        lmx_tensor *tg = j < 3 ? &g.w[j] : j == 3 ? &g.wg : &g.wu, *tc = j < 3 ? &c.w[j] : j == 3 ? &c.wg : &c.wu;
        *tg = w.g, *tc = w.c;
    }
    const int down = eager && dt == LMX_DTYPE_BF16 && !types && M > 16; /* the glu's output then read by down alone */
    if (down) {
        wpair w = make_weight(dt, 0, 0, 0, GG_C, GG_F);
        g.wd = w.g, c.wd = w.c;
    }
    gg_set ge;
    memset(&ge, 0, sizeof ge);
    if (!(eager && dt == LMX_DTYPE_BF16 && !types && M > 16)) eager = NULL;
    if (eager) {
        ge.table = gg_upload(eager, &c.table), ge.n2 = gg_upload(eager, &c.n2);
        for (int j = 0; j < 3; j++) ge.w[j] = gg_upload(eager, &c.w[j]);
        ge.wg = gg_upload(eager, &c.wg), ge.wu = gg_upload(eager, &c.wu), ge.wd = gg_upload(eager, &c.wd);
        gg_alloc(eager, &ge, M, N);
    }
    gg_alloc(gpu, &g, M, N);
    gg_alloc(cpu, &c, M, N);
    for (int step = 0; step < 3; step++) {
        int32_t ids[32];
        for (int i = 0; i < M; i++) ids[i] = (i * 7 + step) % 16;
        gg_step(gpu, &g, ids, M, 0);
        gg_step(cpu, &c, ids, M, 0);
        if (eager) gg_step(eager, &ge, ids, M, 0);
        for (int j = 0; j < 6; j++) {
            if (down ? j == 3 : j == 5) continue; /* with down after it, the graph writes the glu's output in bf16 alone */
            const lmx_tensor *tg = j < 3 ? &g.y[j] : j == 3 ? &g.yg : j == 4 ? &g.yu : &g.yd,
                             *tc = j < 3 ? &c.y[j] : j == 3 ? &c.yg : j == 4 ? &c.yu : &c.yd;
            const int64_t n = (int64_t)M * (j < 3 ? N[j] : j < 5 ? GG_F : GG_C);
            float *a = fetch(gpu, tg, n), *b = fetch(cpu, tc, n);
            const double e = rel_err(a, b, n);
            /* x and the weights rounded to bf16 on the tensor cores: 5e-3 a GEMV, twice that for the glu, the
             * product of two of them */
            const double tol = bits && M == 1 ? 2e-4 : j == 3 ? 1e-2 : 5e-3;
            CHECK_MSG(e <= tol, "graph %s M=%d step %d %s: relative error %.3g > %.3g",
                      bits == 4 ? "mlx q4" : bits ? "mlx q8" : types ? "gguf" : dt == LMX_DTYPE_F16 ? "f16" : "bf16", M,
                      step, (const char *[]){"y0", "y1", "y2", "glu", "up", "down"}[j], e, tol);
            if (eager) {
                const lmx_tensor *te = j < 3 ? &ge.y[j] : j == 3 ? &ge.yg : j == 4 ? &ge.yu : &ge.yd;
                float *h = fetch(eager, te, n);
                CHECK_MSG(!memcmp(a, h, (size_t)n * sizeof(float)), "graph bf16 M=%d step %d %s: not the eager bits", M,
                          step, (const char *[]){"y0", "y1", "y2", "glu", "up", "down"}[j]);
                free(h);
            }
            free(a), free(b);
        }
    }
    gg_release(gpu, &g);
    gg_release(cpu, &c);
    if (eager) gg_release(eager, &ge);
}

static void test_graph_dense(void) {
    /* GGUF: Q4_K_M's mix (q and k in one launch, a Q6_K v in the next; a Q4_K gate/up pair), and Q4_0, Q5_K and
     * Q8_0 (a Q8_0 pair) */
    const int q4km[5] = {LMX_GGML_Q4_K, LMX_GGML_Q4_K, LMX_GGML_Q6_K, LMX_GGML_Q4_K, LMX_GGML_Q4_K};
    const int q80[5] = {LMX_GGML_Q4_0, LMX_GGML_Q5_K, LMX_GGML_Q8_0, LMX_GGML_Q8_0, LMX_GGML_Q8_0};
    lmx_backend *eager = eager_cuda();
    const int Md[] = {9, 17, 24, 32};
    for (size_t i = 0; i < sizeof Md / sizeof Md[0]; i++) {
        test_graph_dense_case(LMX_DTYPE_BF16, 0, NULL, Md[i], eager);
        test_graph_dense_case(LMX_DTYPE_F16, 0, NULL, Md[i], NULL);
        test_graph_dense_case(LMX_DTYPE_U8, 0, q4km, Md[i], NULL);
        test_graph_dense_case(LMX_DTYPE_U8, 0, q80, Md[i], NULL);
        test_graph_dense_case(LMX_DTYPE_U32, 8, NULL, Md[i], NULL); /* MLX 8-bit on the tensor cores */
    }
    test_graph_dense_case(LMX_DTYPE_U32, 4, NULL, 1, NULL);
    test_graph_dense_case(LMX_DTYPE_U32, 8, NULL, 1, NULL);
    if (eager) lmx_backend_free(eager);
}

static void test_graph_gguf(void) {
    const struct { const char *name; int t[3]; } cases[] = {
        {"q4_k q4_k q6_k", {LMX_GGML_Q4_K, LMX_GGML_Q4_K, LMX_GGML_Q6_K}},
        {"q6_k q5_k q5_k", {LMX_GGML_Q6_K, LMX_GGML_Q5_K, LMX_GGML_Q5_K}},
        {"q4_0 q8_0 q4_0", {LMX_GGML_Q4_0, LMX_GGML_Q8_0, LMX_GGML_Q4_0}},
        {"q4_0 q6_k q4_0", {LMX_GGML_Q4_0, LMX_GGML_Q6_K, LMX_GGML_Q4_0}},
        {"q3_k q4_k q6_k", {LMX_GGML_Q3_K, LMX_GGML_Q4_K, LMX_GGML_Q6_K}},
        {"q4_k", {LMX_GGML_Q4_K, LMX_GGML_Q4_K, LMX_GGML_Q4_K}}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_graph_gguf_case(cases[i].name, cases[i].t, 1, 0, NULL);
        test_graph_gguf_case(cases[i].name, cases[i].t, 3, 0, NULL);
    }
    lmx_backend *eager = eager_cuda();
    if (!eager) return;
    test_graph_gguf_case("moe, q4_k q4_k q6_k", cases[0].t, 1, 1, eager);
    test_graph_gguf_case("moe, q4_k", cases[5].t, 1, 1, eager);
    /* 24 rows: q / k / v of Q4_K by k_gemv_st, launched in clusters inside the graph */
    test_graph_gguf_case("moe, q4_k", cases[5].t, 24, 1, eager);
    lmx_backend_free(eager);
}

/* One row of a bf16 weight whose blocks are at most one a multiprocessor (k_gemv1_wide: four vectors a lane in
 * flight) against the cpu, and against a cuda backend without that form (LMX_CUDA_GEMV=6: k_gemv1) bit for bit:
 * the o / down projection shapes of a small model, K split into four vectors a lane or more (and not). */
static void test_gemv_wide(void) {
    lmx_backend *plain = cuda_with("LMX_CUDA_GEMV", "6");
    if (!plain) return;
    const int shapes[][2] = {{1024, 2048}, {1024, 3072}, {1000, 4096}, {512, 6144}, {96, 1032}, {1024, 1024}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int N = shapes[i][0], K = shapes[i][1];
        wpair w = make_weight(LMX_DTYPE_BF16, 0, 0, 0, N, K);
        const lmx_tensor wp = gg_upload(plain, &w.c);
        float *xh = malloc((size_t)K * 4);
        for (int k = 0; k < K; k++) xh[k] = frand();
        lmx_tensor xg = act(gpu, 1, K, xh), xc = act(cpu, 1, K, xh), xp = act(plain, 1, K, xh);
        lmx_tensor yg = act(gpu, 1, N, NULL), yc = act(cpu, 1, N, NULL), yp = act(plain, 1, N, NULL);
        CHECK(gpu->ops->matmul(gpu, &yg, &xg, &w.g, NULL, 1) == LMX_OK);
        CHECK(cpu->ops->matmul(cpu, &yc, &xc, &w.c, NULL, 1) == LMX_OK);
        CHECK(plain->ops->matmul(plain, &yp, &xp, &wp, NULL, 1) == LMX_OK);
        float *a = fetch(gpu, &yg, N), *b = fetch(cpu, &yc, N), *c = fetch(plain, &yp, N);
        const double e = rel_err(a, b, N);
        CHECK_MSG(e <= 1e-5, "gemv wide %d x %d: relative error %.3g > 1e-5", N, K, e);
        CHECK_MSG(!memcmp(a, c, (size_t)N * 4), "gemv wide %d x %d: not k_gemv1's bits", N, K);
        free(a), free(b), free(c), free(xh);
        free_pair(&xg, &xc), free_pair(&yg, &yc);
        plain->ops->release(plain, &xp), plain->ops->release(plain, &yp);
    }
    lmx_backend_free(plain);
}

/* ---- decode graphs: q/k norm, RoPE, attention and kv append as one launch --------------------- */

#define GA_C 64 /* hidden size */
typedef struct ga_case {
    const char *name;
    int B, H, Hk, D, norm, P, window; /* P: the prefill's rows; window > 0: a rotating cache that long */
    float add_one, softcap;
    int interleaved; /* RoPE of pairs (2i, 2i + 1): GGUF llama checkpoints */
    int xnorm;       /* q/k/v read the RMSNorm of x (in a graph of one row: folded into the q/k/v launch) */
    int resid;       /* the o projection added into x, as in a model (one row's graph: the add folded into its launch) */
} ga_case;
#define GA_B 20 /* sequences at most */
/* One backend's tensors: the embedding [16, GA_C], q/k/v [N_j, GA_C], the o projection [GA_C, H*D], the q and k
 * norms [D]; activations [0] of the prefill (B*P rows) and [1] of a decode step (B rows), each kept for the
 * whole case (a release drops a graph). */
typedef struct ga_set {
    lmx_tensor table, w[3], wo, nq, nk, nx;
    lmx_tensor x[2], xn[2], y[2][3], o[2], z[2];
    lmx_kv_layer kv[GA_B];
    lmx_kv_layer *pk[GA_B];
} ga_set;

/* x = table[ids]; [x = rmsnorm(x);] q, k, v = x W^T; [per-head norms of q and k;] RoPE of q and k; attention; kv append; z = the
 * attention's output through the o projection. */
static void ga_call(lmx_backend *be, ga_set *s, int i, const int32_t *ids, const lmx_batch *bt, const ga_case *c,
                    const lmx_rope *rope) {
    const int M = bt->B * bt->T;
    lmx_tensor *y = s->y[i];
    CHECK(be->ops->embed(be, &s->x[i], &s->table, ids, M, 1.0f) == LMX_OK);
    if (c->xnorm) CHECK(be->ops->rmsnorm(be, &s->xn[i], &s->x[i], &s->nx, M, GA_C, 1e-6f, 0.0f) == LMX_OK);
    const lmx_tensor *xin = c->xnorm ? &s->xn[i] : &s->x[i];
    for (int j = 0; j < 3; j++) CHECK(be->ops->matmul(be, &y[j], xin, &s->w[j], NULL, M) == LMX_OK);
    if (c->norm) {
        CHECK(be->ops->rmsnorm(be, &y[0], &y[0], &s->nq, M * c->H, c->D, 1e-6f, c->add_one) == LMX_OK);
        CHECK(be->ops->rmsnorm(be, &y[1], &y[1], &s->nk, M * c->Hk, c->D, 1e-6f, c->add_one) == LMX_OK);
    }
    CHECK(be->ops->rope(be, &y[0], bt, c->H, c->D, rope) == LMX_OK);
    CHECK(be->ops->rope(be, &y[1], bt, c->Hk, c->D, rope) == LMX_OK);
    const lmx_attn_args a = {.batch = bt, .out = &s->o[i], .q = &y[0], .k = &y[1], .v = &y[2], .kv = s->pk, .H = c->H,
                             .Hk = c->Hk, .D = c->D, .scale = 1.0f / sqrtf((float)c->D), .softcap = c->softcap};
    CHECK(be->ops->attention(be, &a) == LMX_OK);
    CHECK(be->ops->kv_append(be, s->pk, bt, &y[1], &y[2]) == LMX_OK);
    CHECK(be->ops->matmul(be, &s->z[i], &s->o[i], &s->wo, NULL, M) == LMX_OK);
    if (c->resid) CHECK(be->ops->add(be, &s->x[i], &s->z[i], (int64_t)M * GA_C) == LMX_OK);
}

/* A prefill, then decode steps in a graph (gpu) against a cuda backend with graphs off (eager: bit for bit, the
 * fold doing k_norm_rope's arithmetic) and the cpu (bf16 caches: 1e-2).  Heads of 64, 128 and 256 values fold
 * the norms, RoPE (rotate-half or interleaved pairs) and append into the attention launch, which leaves q as
 * the matmul wrote it: the last step's q tells that the fold ran (and, for other head sizes, that it did not). */
static void test_graph_attention_case(const ga_case *c, lmx_backend *eager) {
    lmx_backend *be[3] = {gpu, eager, cpu};
    const int N[3] = {c->H * c->D, c->Hk * c->D, c->Hk * c->D}, B = c->B, steps = 6;
    const int64_t KD = (int64_t)c->Hk * c->D;
    wpair table = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 16, GA_C), nq = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, c->D),
          nk = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, c->D), wo = make_weight(LMX_DTYPE_BF16, 0, 0, 0, GA_C, N[0]), w[3],
          nx = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, GA_C);
    for (int j = 0; j < 3; j++) w[j] = make_weight(LMX_DTYPE_BF16, 0, 0, 0, N[j], GA_C);
    ga_set s[3];
    memset(s, 0, sizeof s);
    s[0].table = table.g, s[0].nq = nq.g, s[0].nk = nk.g, s[0].nx = nx.g;
    s[2].table = table.c, s[2].nq = nq.c, s[2].nk = nk.c, s[2].nx = nx.c;
    s[1].table = gg_upload(eager, &table.c), s[1].nq = gg_upload(eager, &nq.c), s[1].nk = gg_upload(eager, &nk.c);
    s[1].nx = gg_upload(eager, &nx.c);
    for (int j = 0; j < 3; j++) s[0].w[j] = w[j].g, s[2].w[j] = w[j].c, s[1].w[j] = gg_upload(eager, &w[j].c);
    s[0].wo = wo.g, s[2].wo = wo.c, s[1].wo = gg_upload(eager, &wo.c);
    for (int e = 0; e < 3; e++) {
        for (int i = 0; i < 2; i++) {
            const int M = i ? B : B * c->P;
            s[e].x[i] = act(be[e], M, GA_C, NULL), s[e].o[i] = act(be[e], M, N[0], NULL), s[e].z[i] = act(be[e], M, GA_C, NULL);
            s[e].xn[i] = act(be[e], M, GA_C, NULL);
            for (int j = 0; j < 3; j++) s[e].y[i][j] = act(be[e], M, N[j], NULL);
        }
        for (int b = 0; b < B; b++) {
            lmx_kv_layer *kv = &s[e].kv[b];
            *kv = (lmx_kv_layer){.window = c->window, .rotating = c->window > 0, .cap = c->window};
            if (c->window) {
                kv->k = kv->v = (lmx_tensor){.dtype = be[e]->ops->kv_dtype, .ndim = 2, .shape = {c->window, KD}};
                CHECK(be[e]->ops->alloc(be[e], &kv->k) == LMX_OK && be[e]->ops->alloc(be[e], &kv->v) == LMX_OK);
            }
            CHECK(be[e]->ops->kv_reserve(be[e], kv, c->P + steps, KD) == LMX_OK);
            s[e].pk[b] = kv;
        }
    }
    float inv[128];
    for (int i = 0; i < c->D / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / c->D);
    const lmx_rope rope = {.rot_dim = c->D, .interleaved = c->interleaved, .inv_freq = inv, .attn_factor = 1.1f};
    int n_past[GA_B] = {0}, n_new[GA_B];
    int32_t ids[16 * 1030]; /* a prefill's rows (B P) at most: the tensor cores' case */
    for (int step = -1; step < steps; step++) {
        const int T = step < 0 ? c->P : 1;
        for (int b = 0; b < B; b++) n_new[b] = T;
        for (int m = 0; m < B * T; m++) ids[m] = (m * 5 + 3 * step + 7) % 16;
        const lmx_batch bt = {.B = B, .T = T, .n_past = n_past, .n_new = n_new};
        for (int e = 0; e < 3; e++) ga_call(be[e], &s[e], step >= 0, ids, &bt, c, &rope);
        for (int b = 0; b < B; b++) n_past[b] += T;
        if (step < 0) continue;
        const int64_t n = (int64_t)B * N[0];
        float *o[3], *q[2];
        for (int e = 0; e < 3; e++) o[e] = fetch(be[e], &s[e].o[1], n);
        const double err = rel_err(o[0], o[2], n);
        CHECK_MSG(err <= 1e-2, "graph attention %s step %d: relative error %.3g > 1e-2", c->name, step, err);
        CHECK_MSG(!memcmp(o[0], o[1], (size_t)n * 4), "graph attention %s step %d: not the eager bits", c->name, step);
        if (step == steps - 1) {
            for (int e = 0; e < 2; e++) q[e] = fetch(be[e], &s[e].y[1][0], n);
            /* either decode kernel folds (k_attention, or on the tensor cores k_flash_decode) */
            const char *off = getenv("LMX_CUDA_ATT_FOLD");
            const int folded = (c->D == 64 || c->D == 128 || c->D == 256) && !(off && off[0] == '0');
            CHECK_MSG(folded == !!memcmp(q[0], q[1], (size_t)n * 4), "graph attention %s: the fold %s", c->name,
                      folded ? "did not run" : "ran");
            free(q[0]), free(q[1]);
        }
        for (int e = 0; e < 3; e++) free(o[e]);
        /* the o projection (from 17 rows a cuBLAS GEMM: in a graph it reads the attention's bf16 copy), or x after
         * the projection was added into it */
        const int64_t nz = (int64_t)B * GA_C;
        for (int e = 0; e < 3; e++) o[e] = fetch(be[e], c->resid ? &s[e].x[1] : &s[e].z[1], nz);
        const double ez = rel_err(o[0], o[2], nz);
        CHECK_MSG(ez <= 1e-2, "graph attention %s step %d: o projection relative error %.3g > 1e-2", c->name, step, ez);
        CHECK_MSG(!memcmp(o[0], o[1], (size_t)nz * 4), "graph attention %s step %d: o projection not the eager bits",
                  c->name, step);
        for (int e = 0; e < 3; e++) free(o[e]);
    }
    for (int e = 0; e < 3; e++) {
        for (int i = 0; i < 2; i++) {
            be[e]->ops->release(be[e], &s[e].x[i]), be[e]->ops->release(be[e], &s[e].o[i]);
            be[e]->ops->release(be[e], &s[e].xn[i]);
            be[e]->ops->release(be[e], &s[e].z[i]);
            for (int j = 0; j < 3; j++) be[e]->ops->release(be[e], &s[e].y[i][j]);
        }
        for (int b = 0; b < B; b++) be[e]->ops->release(be[e], &s[e].kv[b].k), be[e]->ops->release(be[e], &s[e].kv[b].v);
    }
}

static void test_graph_attention(void) {
    const ga_case cases[] = {
        {"qwen3 shape", 1, 16, 8, 128, 1, 20, 0, 0.0f, 0.0f, 0, 0, 0},
        {"gqa 8, batch 2", 2, 16, 2, 128, 1, 12, 0, 0.0f, 0.0f, 0, 0, 0},
        {"(1 + w) norms, softcap, rotating window", 2, 4, 1, 256, 1, 20, 24, 1.0f, 30.0f, 0, 0, 0},
        {"no norms, batch 3", 3, 8, 2, 64, 0, 9, 0, 0.0f, 0.0f, 0, 0, 0},
        {"long context, splits", 1, 8, 2, 128, 1, 300, 0, 0.0f, 0.0f, 0, 0, 0},
        {"head dim 32, not folded", 2, 4, 2, 32, 1, 10, 0, 0.0f, 0.0f, 0, 0, 0},
        {"interleaved pairs (gguf llama)", 1, 32, 8, 128, 0, 20, 0, 0.0f, 0.0f, 1, 0, 0},
        {"interleaved pairs, norms, batch 2", 2, 4, 2, 64, 1, 150, 0, 0.0f, 0.0f, 1, 0, 0},
        {"interleaved pairs, head dim 256, rotating window", 1, 4, 1, 256, 1, 20, 24, 1.0f, 0.0f, 1, 0, 0},
        {"batch 20: the o projection's GEMM reads the attention's bf16 copy", 20, 8, 2, 128, 0, 12, 0, 0.0f, 0.0f, 0, 0,
         0},
        {"batch 18, norms, splits", 18, 4, 2, 64, 1, 200, 0, 0.0f, 0.0f, 0, 0, 0},
        /* x normed before q/k/v, as in a model: one row's graph folds that norm into the q/k/v launch before
         * the attention launch folds the per-head norms, RoPE and the append */
        {"normed x, qwen3 shape", 1, 16, 8, 128, 1, 20, 0, 0.0f, 0.0f, 0, 1, 0},
        {"normed x, heads of 64, no gqa", 1, 8, 8, 64, 1, 9, 0, 0.0f, 0.0f, 0, 1, 0},
        {"normed x, head dim 256, (1 + w), softcap, rotating window", 1, 4, 1, 256, 1, 20, 24, 1.0f, 30.0f, 0, 1, 0},
        {"normed x, interleaved pairs, gqa 4", 1, 32, 8, 128, 0, 20, 0, 0.0f, 0.0f, 1, 1, 0},
        {"normed x, gqa 3", 1, 6, 2, 128, 1, 40, 0, 0.0f, 0.0f, 0, 1, 0},
        {"normed x, long context, splits", 1, 8, 2, 128, 1, 300, 0, 0.0f, 0.0f, 0, 1, 0},
        {"normed x, batch 2", 2, 16, 8, 128, 1, 20, 0, 0.0f, 0.0f, 0, 1, 0},
        /* one row with its keys split (past 128 keys; up to 64 splits): the splits' merge, then the o projection with
         * the residual add folded in */
        {"normed x, qwen3 shape, splits, o into the residual", 1, 16, 8, 128, 1, 140, 0, 0.0f, 0.0f, 0, 1, 1},
        {"normed x, long context, splits, o into the residual", 1, 8, 2, 128, 1, 300, 0, 0.0f, 0.0f, 0, 1, 1},
        {"head dim 256, (1 + w), softcap, rotating window, splits, o into the residual", 1, 4, 1, 256, 1, 150, 200,
         1.0f, 30.0f, 0, 0, 1},
        {"heads of 64, interleaved pairs, 64 splits", 1, 16, 4, 64, 1, 5000, 0, 0.0f, 0.0f, 1, 1, 0},
        /* 16 rows in groups of 8 over 1,024 keys or more: the tensor cores' decode kernel, the norms, RoPE and append
         * folded into it */
        {"batch 16, gqa 8, 1,030 keys: tensor cores", 16, 16, 2, 128, 1, 1030, 0, 0.0f, 0.0f, 0, 0, 0},
        /* ... from the fifth step on: the graph recorded with the CUDA-core kernel is recorded again with the other */
        {"batch 16, gqa 8, 1,020 keys: the tensor cores from 1,024", 16, 16, 2, 128, 1, 1020, 0, 0.0f, 0.0f, 0, 1, 1},
    };
    lmx_backend *eager = eager_cuda();
    if (!eager) return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_graph_attention_case(&cases[i], eager);
    lmx_backend_free(eager);
}

int main(void) {
    const int skip = pair_open();
    if (skip) return skip;
    test_matmul();
    test_norm_matmuls();
    test_embed();
    test_elementwise();
    test_rope();
    test_attention();
    test_topk();
    test_moe();
    test_gemv_wide();
    test_graph_gguf();
    test_graph_dense();
    test_attention_wg();
    test_graph_attention(); /* after test_attention_wg, whose random data stay as they were */
    test_matmul_st();
    return pair_close("test_cuda_ops");
}
#endif
