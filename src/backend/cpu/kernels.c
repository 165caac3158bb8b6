/* kernels.c - portable C kernels, and the run-time choice of kernel table.
 *
 * Scalar matmul: weight rows are taken one at a time (each is read once per block of up to
 * MBLK x rows).  The row is widened to float in chunks of CHUNK elements into a stack buffer, so
 * a bf16/f16 element is widened once per block rather than once per x row; each x row of the
 * block accumulates into 8 partial sums that are added pairwise at the end (shorter rounding
 * chains than a single running sum).
 *
 * Dispatch: lmx_cpu_kernels_init starts from the scalar table and, where the build defines
 * LMX_HAVE_X86_SIMD, upgrades it to the AVX-512 or AVX2 table after checking the CPU. */
#include "kernels.h"

#include <math.h>
#include <string.h>

#include "../../base/half.h"
#include "ggml_quant.h"

#if defined(LMX_HAVE_X86_SIMD)
#include <cpuid.h>
#endif

enum { W_F32, W_BF16, W_F16 };

#define CHUNK 64 /* weight elements widened at a time */
#define MBLK 16  /* x rows sharing one pass over a weight row */

static inline float sum8(const float *a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* Weight rows may sit at any address (kernels.h): read through lmx_load_*. */
static inline void widen_chunk(int wt, float *dst, const void *row, int64_t k0, int64_t n) {
    const char *s = (const char *)row + 2 * k0;
    if (wt == W_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = lmx_bf16_to_f32(lmx_load_u16(s + 2 * i));
    else
        for (int64_t i = 0; i < n; i++) dst[i] = lmx_f16_to_f32(lmx_load_u16(s + 2 * i));
}

static inline void matmul_scalar(int wt, const float *x, int64_t ldx, int M, int64_t K,
                                 const void *w, int64_t n0, int64_t n1, float *y, int64_t ldy) {
    const int64_t es = wt == W_F32 ? 4 : 2;
    float buf[CHUNK];
    float acc[MBLK][8];
    for (int64_t n = n0; n < n1; n++) {
        const void *row = (const char *)w + n * K * es;
        for (int m0 = 0; m0 < M; m0 += MBLK) {
            const int mb = M - m0 < MBLK ? M - m0 : MBLK;
            memset(acc, 0, sizeof acc);
            for (int64_t k0 = 0; k0 < K; k0 += CHUNK) {
                const int64_t kc = K - k0 < CHUNK ? K - k0 : CHUNK;
                const float *wc = buf;
                if (wt == W_F32 && ((uintptr_t)row & 3) == 0)
                    wc = (const float *)row + k0;
                else if (wt == W_F32)
                    memcpy(buf, (const char *)row + 4 * k0, (size_t)kc * 4);
                else
                    widen_chunk(wt, buf, row, k0, kc);
                for (int i = 0; i < mb; i++) {
                    const float *xr = x + (int64_t)(m0 + i) * ldx + k0;
                    float *a = acc[i];
                    int64_t k = 0;
                    for (; k + 8 <= kc; k += 8)
                        for (int l = 0; l < 8; l++) a[l] += xr[k + l] * wc[k + l];
                    for (; k < kc; k++) a[k & 7] += xr[k] * wc[k];
                }
            }
            for (int i = 0; i < mb; i++) y[(int64_t)(m0 + i) * ldy + n] = sum8(acc[i]);
        }
    }
}

static void matmul_f32_scalar(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                              int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul_scalar(W_F32, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_bf16_scalar(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                               int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul_scalar(W_BF16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static void matmul_f16_scalar(const float *x, int64_t ldx, int M, int64_t K, const void *w,
                              int64_t n0, int64_t n1, float *y, int64_t ldy) {
    matmul_scalar(W_F16, x, ldx, M, K, w, n0, n1, y, ldy);
}

static float dot_f32_scalar(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++) acc[i & 7] += a[i] * b[i];
    return sum8(acc);
}

static void bf16_to_f32_scalar(float *dst, const void *src, int64_t n) {
    widen_chunk(W_BF16, dst, src, 0, n);
}

static void f16_to_f32_scalar(float *dst, const void *src, int64_t n) {
    widen_chunk(W_F16, dst, src, 0, n);
}

static void axpy_f32_scalar(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void dot_rows_f32_scalar(const float *a, const float *rows, int64_t stride, int m, int64_t n, float *out) {
    for (int j = 0; j < m; j++) out[j] = dot_f32_scalar(a, rows + (int64_t)j * stride, n);
}

static void axpy_rows_f32_scalar(float *y, const float *w, const float *rows, int64_t stride, int m, int64_t n) {
    for (int j = 0; j < m; j++) axpy_f32_scalar(y, w[j], rows + (int64_t)j * stride, n);
}

static double attn_exp_scalar(float *x, float *e, int n, float scale, float cap) {
    float mx = -INFINITY;
    for (int j = 0; j < n; j++) {
        float s = x[j] * scale;
        if (cap > 0) s = cap * tanhf(s / cap);
        x[j] = s;
        if (s > mx) mx = s;
    }
    double sum = 0;
    for (int j = 0; j < n; j++) {
        e[j] = expf(x[j] - mx);
        sum += e[j];
    }
    return sum;
}

static double sumsq_f32_scalar(const float *x, int64_t n) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return ss;
}

void lmx_cpu_kernels_init_scalar(lmx_cpu_kernels *k) {
    k->isa = "scalar";
    k->ggml_simd = LMX_GGML_PORTABLE;
    k->matmul_f32 = matmul_f32_scalar;
    k->matmul_bf16 = matmul_bf16_scalar;
    k->matmul_f16 = matmul_f16_scalar;
    k->dot_f32 = dot_f32_scalar;
    k->bf16_to_f32 = bf16_to_f32_scalar;
    k->f16_to_f32 = f16_to_f32_scalar;
    k->axpy_f32 = axpy_f32_scalar;
    k->dot_rows_f32 = dot_rows_f32_scalar;
    k->axpy_rows_f32 = axpy_rows_f32_scalar;
    k->sumsq_f32 = sumsq_f32_scalar;
    k->attn_exp = attn_exp_scalar;
}

#if defined(LMX_HAVE_X86_SIMD)
/* F16C is read from CPUID directly: not every compiler's __builtin_cpu_supports knows it. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    return (c & bit_F16C) != 0;
}
#endif

void lmx_cpu_kernels_init(lmx_cpu_kernels *k, const char *force_isa) {
    lmx_cpu_kernels_init_scalar(k);
#if defined(LMX_HAVE_X86_SIMD)
    int level = 2; /* 2: avx512, 1: avx2, 0: scalar; unknown names mean auto */
    if (force_isa && force_isa[0]) {
        if (strcmp(force_isa, "scalar") == 0)
            level = 0;
        else if (strcmp(force_isa, "avx2") == 0)
            level = 1;
    }
    if (level == 0) return;
    __builtin_cpu_init();
    if (level >= 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        lmx_cpu_kernels_init_avx512(k)) {
        k->ggml_simd = lmx_ggml_simd_best();
        return;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c() &&
        lmx_cpu_kernels_init_avx2(k))
        return;
#else
    (void)force_isa;
#endif
}
