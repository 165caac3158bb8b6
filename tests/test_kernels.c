/* test_kernels.c - checks every CPU kernel table this machine can run (scalar always, then avx2
 * and avx512 when present) against double-precision references computed here on random data
 * (fixed seed), with odd sizes, row strides larger than the rows, and canary values around every
 * output.  Conversions are checked bit for bit against base/half.h over all 65536 patterns.
 *
 * LMX_KERNEL_BENCH=1 additionally prints the single-thread bandwidth of the bf16 matmul with
 * M=1, K=2048, N=8192 for each table; nothing is timed otherwise. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/kernels.h"
#include "base/half.h"
#include "check.h"

#define CANARY 0xdeadbeefu

static uint64_t rng_next(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_unit(uint64_t *s) { /* uniform in [-1, 1) */
    return (float)((double)(rng_next(s) >> 40) * (2.0 / 16777216.0) - 1.0);
}

static void set_canary(float *p, int64_t n) {
    const uint32_t c = CANARY;
    for (int64_t i = 0; i < n; i++) memcpy(&p[i], &c, 4);
}

static int is_canary(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u == CANARY;
}

/* Bit-identical, or both NaN. */
static int same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

/* Tables runnable here: scalar first, then each forced ISA the dispatcher actually granted. */
static int available_tables(lmx_cpu_kernels *out) {
    static const char *const names[] = {"avx2", "avx512"};
    int n = 0;
    lmx_cpu_kernels_init_scalar(&out[n++]);
    for (int i = 0; i < 2; i++) {
        lmx_cpu_kernels t;
        lmx_cpu_kernels_init(&t, names[i]);
        if (strcmp(t.isa, names[i]) == 0) out[n++] = t;
    }
    return n;
}

static void test_dispatch(const lmx_cpu_kernels *ks, int nk) {
    lmx_cpu_kernels t;
    lmx_cpu_kernels_init(&t, "scalar");
    CHECK(strcmp(t.isa, "scalar") == 0);
    lmx_cpu_kernels_init(&t, NULL);
    CHECK(strcmp(t.isa, ks[nk - 1].isa) == 0);
    lmx_cpu_kernels_init(&t, "");
    CHECK(strcmp(t.isa, ks[nk - 1].isa) == 0);
#if !defined(LMX_HAVE_X86_SIMD)
    CHECK(lmx_cpu_kernels_init_avx2(&t) == 0);
    CHECK(lmx_cpu_kernels_init_avx512(&t) == 0);
    CHECK(nk == 1);
#endif
    for (int i = 0; i < nk; i++) {
        CHECK(ks[i].matmul_f32 && ks[i].matmul_bf16 && ks[i].matmul_f16 && ks[i].dot_f32);
        CHECK(ks[i].bf16_to_f32 && ks[i].f16_to_f32 && ks[i].axpy_f32);
        CHECK(ks[i].dot_rows_f32 && ks[i].axpy_rows_f32 && ks[i].sumsq_f32);
    }
}

typedef void (*conv_fn)(float *dst, const void *src, int64_t n);

static void check_conv(const char *isa, const char *what, conv_fn fn, float (*ref)(uint16_t)) {
    /* all patterns in one call */
    uint16_t *src = xmalloc(65536 * sizeof *src);
    float *dst = xmalloc((65536 + 16) * sizeof *dst);
    for (int i = 0; i < 65536; i++) src[i] = (uint16_t)i;
    set_canary(dst, 65536 + 16);
    fn(dst, src, 65536);
    int bad = 0, first = -1;
    for (int i = 0; i < 65536; i++)
        if (!same_float(dst[i], ref(src[i])) && bad++ == 0) first = i;
    for (int i = 65536; i < 65536 + 16; i++) bad += !is_canary(dst[i]);
    CHECK_MSG(bad == 0, "%s %s: %d wrong, first at 0x%04x", isa, what, bad, first);

    /* short and odd lengths from odd offsets, each source exactly sized */
    static const int64_t lens[] = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 100, 1000};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        const int64_t n = lens[li];
        const int64_t off = (int64_t)(li * 4099 + 0x7c00 - 40) % 65536; /* crosses inf/NaN */
        uint16_t *s = xmalloc((size_t)n * sizeof *s);
        for (int64_t i = 0; i < n; i++) s[i] = (uint16_t)((off + i) & 0xffff);
        set_canary(dst, n + 16);
        fn(dst, s, n);
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += !same_float(dst[i], ref(s[i]));
        for (int64_t i = n; i < n + 16; i++) bad += !is_canary(dst[i]);
        CHECK_MSG(bad == 0, "%s %s n=%lld: %d wrong", isa, what, (long long)n, bad);
        free(s);
    }
    free(src);
    free(dst);
}

static const int64_t Ks[] = {1, 3, 15, 16, 17, 31, 64, 100, 257, 1000, 4099};
#define NKS ((int)(sizeof Ks / sizeof Ks[0]))

static void test_dot_axpy(const lmx_cpu_kernels *k, uint64_t *rng) {
    static const int64_t extra[] = {0, 2, 5, 8, 32, 33, 63, 65};
    for (int t = 0; t < NKS + 8; t++) {
        const int64_t n = t < NKS ? Ks[t] : extra[t - NKS];
        float *a = xmalloc((size_t)n * 4), *b = xmalloc((size_t)n * 4);
        float *y = xmalloc((size_t)(n + 16) * 4), *y0 = xmalloc((size_t)n * 4);
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < n; i++) {
            a[i] = rng_unit(rng);
            b[i] = rng_unit(rng);
            ref += (double)a[i] * b[i];
            mag += fabs((double)a[i] * b[i]);
        }
        const float d = k->dot_f32(a, b, n);
        CHECK_MSG(fabs(d - ref) <= 1e-5 * mag + 1e-6, "%s dot n=%lld: %g vs %g", k->isa,
                  (long long)n, d, ref);

        const float alpha = rng_unit(rng) * 3.0f;
        for (int64_t i = 0; i < n; i++) y[i] = y0[i] = rng_unit(rng);
        set_canary(y + n, 16);
        k->axpy_f32(y, alpha, a, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++) {
            const double r = (double)y0[i] + (double)alpha * a[i];
            const double tol = 1e-6 * (fabs(y0[i]) + fabs((double)alpha * a[i])) + 1e-7;
            bad += !(fabs(y[i] - r) <= tol);
        }
        for (int64_t i = n; i < n + 16; i++) bad += !is_canary(y[i]);
        CHECK_MSG(bad == 0, "%s axpy n=%lld: %d wrong", k->isa, (long long)n, bad);
        free(a);
        free(b);
        free(y);
        free(y0);
    }
}

/* dot_rows_f32 / axpy_rows_f32 (attention) and sumsq_f32 (rmsnorm): m rows of n at a stride
 * larger than n, against double references; canaries after every output. */
static void test_rows(const lmx_cpu_kernels *k, uint64_t *rng) {
    static const int ms[] = {1, 3, 15, 16, 17, 33, 100};
    static const int64_t ns[] = {1, 7, 16, 17, 64, 100, 129, 256};
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int m = ms[mi];
            const int64_t n = ns[ni], stride = n + 5;
            float *rows = xmalloc((size_t)(m * stride) * 4), *a = xmalloc((size_t)n * 4);
            float *out = xmalloc((size_t)(m + 16) * 4), *w = xmalloc((size_t)m * 4);
            float *y = xmalloc((size_t)(n + 16) * 4), *y0 = xmalloc((size_t)n * 4);
            for (int64_t i = 0; i < m * stride; i++) rows[i] = rng_unit(rng);
            for (int64_t i = 0; i < n; i++) a[i] = rng_unit(rng), y[i] = y0[i] = rng_unit(rng);
            for (int j = 0; j < m; j++) w[j] = rng_unit(rng);
            set_canary(out, m + 16);
            set_canary(y + n, 16);
            k->dot_rows_f32(a, rows, stride, m, n, out);
            k->axpy_rows_f32(y, w, rows, stride, m, n);
            int bad = 0;
            for (int j = 0; j < m; j++) {
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++)
                    ref += (double)a[i] * rows[j * stride + i], mag += fabs((double)a[i] * rows[j * stride + i]);
                bad += !(fabs(out[j] - ref) <= 1e-5 * mag + 1e-7);
            }
            for (int j = m; j < m + 16; j++) bad += !is_canary(out[j]);
            CHECK_MSG(bad == 0, "%s dot_rows m=%d n=%lld: %d wrong", k->isa, m, (long long)n, bad);
            bad = 0;
            for (int64_t i = 0; i < n; i++) {
                double ref = y0[i], mag = fabs(y0[i]);
                for (int j = 0; j < m; j++)
                    ref += (double)w[j] * rows[j * stride + i], mag += fabs((double)w[j] * rows[j * stride + i]);
                bad += !(fabs(y[i] - ref) <= 1e-5 * mag + 1e-7);
            }
            for (int64_t i = n; i < n + 16; i++) bad += !is_canary(y[i]);
            CHECK_MSG(bad == 0, "%s axpy_rows m=%d n=%lld: %d wrong", k->isa, m, (long long)n, bad);
            double ss = 0;
            for (int64_t i = 0; i < n; i++) ss += (double)a[i] * a[i];
            CHECK_MSG(fabs(k->sumsq_f32(a, n) - ss) <= 1e-12 * ss, "%s sumsq n=%lld", k->isa, (long long)n);
            free(rows), free(a), free(out), free(w), free(y), free(y0);
        }
}

enum { T_F32, T_BF16, T_F16 };
static const char *const tnames[] = {"f32", "bf16", "f16"};

static lmx_matmul_rows_fn pick(const lmx_cpu_kernels *k, int t) {
    return t == T_F32 ? k->matmul_f32 : t == T_BF16 ? k->matmul_bf16 : k->matmul_f16;
}

/* Random weights [n1, K] of type t (exactly sized allocation) and their float values. */
static void *make_weights(int t, int64_t count, float *wf, uint64_t *rng) {
    void *w = xmalloc((size_t)count * (t == T_F32 ? 4 : 2));
    for (int64_t i = 0; i < count; i++) {
        const float v = rng_unit(rng);
        if (t == T_F32) {
            ((float *)w)[i] = wf[i] = v;
        } else if (t == T_BF16) {
            const uint16_t h = lmx_f32_to_bf16(v);
            ((uint16_t *)w)[i] = h;
            wf[i] = lmx_bf16_to_f32(h);
        } else {
            const uint16_t h = lmx_f32_to_f16(v);
            ((uint16_t *)w)[i] = h;
            wf[i] = lmx_f16_to_f32(h);
        }
    }
    return w;
}

static void test_matmul(const lmx_cpu_kernels *ks, int nk, uint64_t *rng) {
    static const int Ms[] = {1, 2, 3, 4, 5, 7, 8, 13};
    static const int64_t ranges[][2] = {{2, 5}, {3, 7}, {1, 13}, {5, 43}};
    for (int t = 0; t < 3; t++) {
        for (int ki = 0; ki < NKS; ki++) {
            const int64_t K = Ks[ki], ldx = K + 3;
            for (int ri = 0; ri < 4; ri++) {
                const int64_t n0 = ranges[ri][0], n1 = ranges[ri][1], ldy = n1 + 5;
                float *wf = xmalloc((size_t)(n1 * K) * 4);
                void *w = make_weights(t, n1 * K, wf, rng);
                for (int mi = 0; mi < 8; mi++) {
                    const int M = Ms[mi];
                    const int64_t xn = (M - 1) * ldx + K;
                    float *x = xmalloc((size_t)xn * 4);
                    for (int64_t i = 0; i < xn; i++) x[i] = rng_unit(rng);
                    double *ref = xmalloc((size_t)(M * n1) * sizeof *ref);
                    double *mag = xmalloc((size_t)(M * n1) * sizeof *mag);
                    for (int m = 0; m < M; m++)
                        for (int64_t n = n0; n < n1; n++) {
                            double s = 0, a = 0;
                            for (int64_t k = 0; k < K; k++) {
                                const double p = (double)x[m * ldx + k] * wf[n * K + k];
                                s += p;
                                a += fabs(p);
                            }
                            ref[m * n1 + n] = s;
                            mag[m * n1 + n] = a;
                        }
                    float *y = xmalloc((size_t)((M + 1) * ldy) * 4);
                    for (int i = 0; i < nk; i++) {
                        set_canary(y, (M + 1) * ldy);
                        pick(&ks[i], t)(x, ldx, M, K, w, n0, n1, y, ldy);
                        int bad = 0;
                        int64_t bm = -1, bn = -1;
                        for (int m = 0; m <= M; m++)
                            for (int64_t n = 0; n < ldy; n++) {
                                const float v = y[m * ldy + n];
                                int ok;
                                if (m < M && n >= n0 && n < n1)
                                    ok = fabs(v - ref[m * n1 + n]) <= 1e-5 * mag[m * n1 + n] + 1e-6;
                                else
                                    ok = is_canary(v);
                                if (!ok && bad++ == 0) bm = m, bn = n;
                            }
                        CHECK_MSG(bad == 0,
                                  "%s matmul_%s K=%lld M=%d n=[%lld,%lld): %d wrong, "
                                  "first y[%lld,%lld]",
                                  ks[i].isa, tnames[t], (long long)K, M, (long long)n0,
                                  (long long)n1, bad, (long long)bm, (long long)bn);
                    }
                    free(y);
                    free(ref);
                    free(mag);
                    free(x);
                }
                free(w);
                free(wf);
            }
        }
    }
}

static double now_s(void) {
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(const lmx_cpu_kernels *ks, int nk, uint64_t *rng) {
    const int64_t K = 2048, N = 8192;
    float *wf = xmalloc((size_t)(N * K) * 4);
    void *w = make_weights(T_BF16, N * K, wf, rng);
    float *x = xmalloc((size_t)K * 4), *y = xmalloc((size_t)N * 4);
    for (int64_t i = 0; i < K; i++) x[i] = rng_unit(rng);
    const double bytes = (double)(N * K * 2);
    for (int i = 0; i < nk; i++) {
        ks[i].matmul_bf16(x, K, 1, K, w, 0, N, y, N); /* warm-up */
        double best = 1e30, total = 0;
        int reps = 0;
        while (reps < 5 || total < 1.0) {
            const double t0 = now_s();
            ks[i].matmul_bf16(x, K, 1, K, w, 0, N, y, N);
            const double dt = now_s() - t0;
            best = dt < best ? dt : best;
            total += dt;
            reps++;
        }
        printf("bench matmul_bf16 M=1 K=%lld N=%lld %-6s: "
               "best %.2f GB/s, mean %.2f GB/s (%d reps)\n",
               (long long)K, (long long)N, ks[i].isa, bytes / best * 1e-9,
               bytes * reps / total * 1e-9, reps);
    }
    free(wf);
    free(w);
    free(x);
    free(y);
}

int main(void) {
    lmx_cpu_kernels ks[3];
    const int nk = available_tables(ks);
    uint64_t rng = 12345;
    printf("test_kernels: tables:");
    for (int i = 0; i < nk; i++) printf(" %s", ks[i].isa);
    printf("\n");

    test_dispatch(ks, nk);
    for (int i = 0; i < nk; i++) {
        check_conv(ks[i].isa, "bf16_to_f32", ks[i].bf16_to_f32, lmx_bf16_to_f32);
        check_conv(ks[i].isa, "f16_to_f32", ks[i].f16_to_f32, lmx_f16_to_f32);
        test_dot_axpy(&ks[i], &rng);
        test_rows(&ks[i], &rng);
    }
    test_matmul(ks, nk, &rng);

    const char *b = getenv("LMX_KERNEL_BENCH");
    if (b && strcmp(b, "1") == 0) bench(ks, nk, &rng);
    return check_summary("test_kernels");
}
