/* bench_ggml_dot.c - single-thread speed of the GGUF decode matvec (lmx_ggml_matvec) and of the
 * dequantization used by prefill (lmx_ggml_dequant_row), per block type, on random rows.
 *
 * usage: bench_ggml_dot [N] [K] [REPS]   (defaults 1536 x 576: in L2, the compute-bound case;
 *        a large N, e.g. 65536, streams from DRAM).  Prints Gelem/s and GB/s of weight bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/ggml_quant.h"
#include "bench_util.h"

int main(int argc, char **argv) {
    int64_t N = argc > 1 ? atoll(argv[1]) : 1536, K = argc > 2 ? atoll(argv[2]) : 576;
    int reps = argc > 3 ? atoi(argv[3]) : 50;
    const int types[] = {LMX_GGML_Q4_0, LMX_GGML_Q4_1, LMX_GGML_Q5_0, LMX_GGML_Q5_1, LMX_GGML_Q8_0, LMX_GGML_Q2_K,
                         LMX_GGML_Q3_K, LMX_GGML_Q4_K, LMX_GGML_Q5_K, LMX_GGML_Q6_K};
    float *x = malloc((size_t)K * 4), *y = malloc((size_t)N * 4), *row = malloc((size_t)K * 4);
    uint64_t s = 88172645463325252ull;
    for (int64_t k = 0; k < K; k++) x[k] = (float)((int)(k % 17) - 8) / 8.0f;
    printf("N %lld K %lld, 1 thread\n%-6s %12s %10s %14s\n", (long long)N, (long long)K, "type", "matvec Ge/s",
           "GB/s", "dequant Ge/s");
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        int type = types[t];
        size_t rb = lmx_ggml_row_bytes(type, K);
        if (!rb) continue;
        uint8_t *w = malloc(rb * (size_t)N);
        for (size_t i = 0; i < rb * (size_t)N; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            w[i] = (uint8_t)s;
        }
        /* finite f16 scales about 1e-3 .. 1 (random bytes would give infinities, NaNs, subnormals) */
        int offs[2] = {0, -1}, bb = lmx_ggml_block_bytes(type);
        if (type == LMX_GGML_Q4_1 || type == LMX_GGML_Q5_1 || type == LMX_GGML_Q4_K || type == LMX_GGML_Q5_K) offs[1] = 2;
        if (type == LMX_GGML_Q2_K) offs[0] = 80, offs[1] = 82;
        if (type == LMX_GGML_Q3_K) offs[0] = 108;
        if (type == LMX_GGML_Q6_K) offs[0] = 208;
        for (size_t i = 0; i < rb * (size_t)N; i += (size_t)bb)
            for (int f = 0; f < 2; f++)
                if (offs[f] >= 0) {
                    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
                    uint16_t h = (uint16_t)((s & 0x83ffu) | ((5u + (s >> 20) % 10u) << 10));
                    memcpy(w + i + offs[f], &h, 2);
                }
        double best = 1e30, bestd = 1e30;
        for (int r = 0; r < reps; r++) {
            double a = bench_now_s();
            lmx_ggml_matvec(lmx_ggml_simd_best(), type, w, K, 0, N, x, y);
            double b = bench_now_s();
            for (int64_t n = 0; n < N; n++) lmx_ggml_dequant_row(lmx_ggml_simd_best(), type, w + (size_t)n * rb, K, row);
            double c = bench_now_s();
            if (b - a < best) best = b - a;
            if (c - b < bestd) bestd = c - b;
        }
        printf("%-6s %12.2f %10.2f %14.2f\n", lmx_ggml_type_name(type), N * K / best * 1e-9, rb * N / best * 1e-9,
               N * K / bestd * 1e-9);
        free(w);
    }
    free(x), free(y), free(row);
    return 0;
}
