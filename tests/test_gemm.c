/* test_gemm.c - the AVX-512 prefill kernels against double-precision references (skipped, with a
 * note, on CPUs without AVX-512):
 *   1. the packed GEMM (src/backend/cpu/gemm.h): odd M, N, K (tails of every micro-tile shape),
 *      x rows at a stride larger than K, outputs at a stride larger than N, canaries around y;
 *      |y - ref| <= 1e-5 * sum_k |x w|;
 *   2. exp (act.h) within 2 ulp of the double exp over [-100, 88], 0 far below, inf above;
 *   3. the gated activations against their double formulas (SiLU, and GELU-tanh 0.5 g (1 + tanh u)
 *      written as g / (1 + exp(-2u)), which does not cancel in double either) within 4e-7 (1 + |t|) relative, t the argument of exp (rounded to
 *      float before exp, which is what the float32 formula does too). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/act.h"
#include "backend/cpu/gemm.h"
#include "check.h"

static uint64_t rng = 0x243f6a8885a308d3ull;
static float unit(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((double)(rng >> 40) * (2.0 / 16777216.0) - 1.0);
}

#if defined(LMX_HAVE_X86_SIMD)
static void test_gemm_shape(int M, int N, int64_t K) {
    const int64_t ldx = K + 3, ldy = N + 5;
    float *x = malloc(sizeof(float) * (size_t)(M * ldx)), *w = malloc(sizeof(float) * (size_t)(N * K));
    float *y = malloc(sizeof(float) * (size_t)(M * ldy + 16));
    float *xp = malloc(sizeof(float) * lmx_gemm_xpack_floats(M, K));
    float *wp = malloc(sizeof(float) * lmx_gemm_wpack_floats(N, K));
    if (!x || !w || !y || !xp || !wp) {
        CHECK(0);
        goto done;
    }
    for (int64_t i = 0; i < M * ldx; i++) x[i] = unit();
    for (int64_t i = 0; i < N * K; i++) w[i] = unit();
    for (int64_t i = 0; i < M * ldy + 16; i++) y[i] = 777.0f;
    lmx_gemm_pack_x_avx512(x, ldx, M, K, 0, (M + 15) / 16, xp);
    for (int j = 0; j < N; j++) lmx_gemm_pack_w_row_avx512(w + j * K, K, j, N, wp);
    lmx_gemm_run_avx512(xp, M, K, wp, N, y, ldy);
    int bad = 0;
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[m * ldx + k] * w[n * K + k];
                ref += p, mag += fabs(p);
            }
            bad += !(fabs(y[m * ldy + n] - ref) <= 1e-5 * mag + 1e-30);
        }
        for (int64_t n = N; n < ldy; n++) bad += y[m * ldy + n] != 777.0f; /* padding untouched */
    }
    for (int i = 0; i < 16; i++) bad += y[M * ldy + i] != 777.0f;
    CHECK_MSG(bad == 0, "gemm M=%d N=%d K=%lld: %d wrong", M, N, (long long)K, bad);
done:
    free(x), free(w), free(y), free(xp), free(wp);
}

static double ulps(float got, double ref) {
    if (ref == 0) return got == 0 ? 0 : 1e30;
    int e;
    frexp(ref, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs(got - ref) / ulp;
}

static void test_act(void) {
    enum { N = 20011 };
    float *src = malloc(N * sizeof(float)), *dst = malloc((N + 16) * sizeof(float));
    float *g = malloc(N * sizeof(float)), *u = malloc(N * sizeof(float));
    if (!src || !dst || !g || !u) {
        CHECK(0);
        goto done;
    }
    for (int i = 0; i < N; i++) src[i] = -100.0f + 188.0f * (float)i / (N - 1);
    dst[N] = 555.0f;
    lmx_exp_avx512(dst, src, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        double r = ulps(dst[i], exp((double)src[i]));
        if (r > worst) worst = r;
    }
    CHECK_MSG(worst <= 2.0, "exp: worst error %.2f ulp", worst);
    CHECK(dst[N] == 555.0f);
    float far[4] = {-200.0f, -1000.0f, 100.0f, 1000.0f}, out[4];
    lmx_exp_avx512(out, far, 4);
    CHECK(out[0] == 0.0f && out[1] == 0.0f && isinf(out[2]) && isinf(out[3]));

    for (int i = 0; i < N; i++) g[i] = 12.0f * unit(), u[i] = unit();
    for (int gelu = 0; gelu < 2; gelu++) {
        for (int n = N - 7; n <= N; n += 7) { /* a masked tail and a full vector */
            dst[n] = 555.0f;
            if (gelu) lmx_glu_gelu_avx512(dst, g, u, n);
            else lmx_glu_silu_avx512(dst, g, u, n);
            int bad = 0;
            for (int i = 0; i < n; i++) {
                double x = g[i], ref, t = gelu ? 2 * 0.7978845608028654 * (x + 0.044715 * x * x * x) : x;
                if (gelu) ref = x / (1.0 + exp(-t)) * u[i]; /* = 0.5 x (1 + tanh(t / 2)), no cancellation */
                else ref = x / (1.0 + exp(-x)) * u[i];
                /* exp's argument t is rounded to float first: relative error up to |t| ulp */
                bad += !(fabs(dst[i] - ref) <= 4e-7 * (1 + fabs(t)) * fabs(ref) + 1e-37);
            }
            CHECK_MSG(bad == 0, "%s n=%d: %d wrong", gelu ? "gelu" : "silu", n, bad);
            CHECK(dst[n] == 555.0f);
        }
    }
done:
    free(src), free(dst), free(g), free(u);
}
#endif

int main(int argc, char **argv) {
    (void)argc, (void)argv;
#if defined(LMX_HAVE_X86_SIMD)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        static const int Ms[] = {1, 8, 15, 16, 17, 31, 33, 47, 48, 49, 128};
        static const int Ns[] = {1, 3, 7, 8, 9, 17, 40};
        static const int64_t Ks[] = {1, 15, 16, 17, 64, 100};
        for (size_t a = 0; a < sizeof Ms / sizeof Ms[0]; a++)
            for (size_t b = 0; b < sizeof Ns / sizeof Ns[0]; b++)
                for (size_t c = 0; c < sizeof Ks / sizeof Ks[0]; c++) test_gemm_shape(Ms[a], Ns[b], Ks[c]);
        test_gemm_shape(128, 64, 2048);
        test_act();
    } else {
        printf("test_gemm: no AVX-512 on this CPU, nothing to check\n");
    }
#else
    printf("test_gemm: built without x86 SIMD, nothing to check\n");
#endif
    return check_summary("test_gemm");
}
