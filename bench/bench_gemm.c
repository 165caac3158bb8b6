/* bench_gemm.c - single-thread speed of the packed prefill GEMM (gemm.h) on one weight tile.
 * usage: bench_gemm [M] [N] [K] [REPS]   (defaults 128 x 48 x 640).  Prints GFLOP/s (2 per MAC). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/cpu/gemm.h"
#include "bench_util.h"

int main(int argc, char **argv) {
#if defined(LMX_HAVE_X86_SIMD)
    int M = argc > 1 ? atoi(argv[1]) : 128, N = argc > 2 ? atoi(argv[2]) : 48;
    int64_t K = argc > 3 ? atoll(argv[3]) : 640;
    int reps = argc > 4 ? atoi(argv[4]) : 200;
    float *x = malloc(sizeof(float) * M * K), *w = malloc(sizeof(float) * N * K), *y = malloc(sizeof(float) * M * N);
    float *xp = malloc(sizeof(float) * lmx_gemm_xpack_floats(M, K));
    float *wp = malloc(sizeof(float) * lmx_gemm_wpack_floats(N, K));
    for (int64_t i = 0; i < M * K; i++) x[i] = (float)(i % 13) - 6.0f;
    for (int64_t i = 0; i < N * K; i++) w[i] = (float)(i % 7) - 3.0f;
    double best = 1e30, bp = 1e30, bw = 1e30;
    for (int r = 0; r < reps; r++) {
        double a = bench_now_s();
        lmx_gemm_pack_x_avx512(x, K, M, K, 0, (M + 15) / 16, xp);
        double b = bench_now_s();
        for (int j = 0; j < N; j++) lmx_gemm_pack_w_row_avx512(w + j * K, K, j, N, wp);
        double c = bench_now_s();
        lmx_gemm_run_avx512(xp, M, K, wp, N, y, N);
        double d = bench_now_s();
        if (d - c < best) best = d - c;
        if (b - a < bp) bp = b - a;
        if (c - b < bw) bw = c - b;
    }
    double err = 0;
    for (int m = 0; m < M; m += 7)
        for (int n = 0; n < N; n += 5) {
            double s = 0;
            for (int64_t k = 0; k < K; k++) s += (double)x[m * K + k] * w[n * K + k];
            err += s - y[m * N + n] > 0 ? s - y[m * N + n] : y[m * N + n] - s;
        }
    printf("M %d N %d K %lld: gemm %.1f GFLOP/s, pack x %.2f us, pack w %.2f us, |err| %.3g\n", M, N, (long long)K,
           2.0 * M * N * K / best * 1e-9, bp * 1e6, bw * 1e6, err);
    free(x), free(w), free(y), free(xp), free(wp);
#else
    (void)argc, (void)argv;
    printf("bench_gemm: built without x86 SIMD\n");
#endif
    return 0;
}
