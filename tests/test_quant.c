/* test_quant.c - quantized kernels against a double-precision dot product of the dequantized
 * weights built from the MLX formula w = q * scale + bias (element k of a row in word
 * k / (32/bits) at bit (k % (32/bits)) * bits), for bits 2/4/8, groups 32/64/128, bf16/f16/f32
 * scales, odd row ranges; and lmx_dequant_row exactly against that formula. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quant.h"
#include "base/half.h"
#include "check.h"

static uint32_t rng = 12345;
static uint32_t next(void) { rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5; return rng; }
static float frand(void) { return (float)(next() % 20001) / 10000.0f - 1.0f; }

/* Round v through the scale dtype so the reference sees the stored value. */
static float store_param(void *arr, int64_t i, lmx_dtype t, float v) {
    if (t == LMX_DTYPE_BF16) { ((uint16_t *)arr)[i] = lmx_f32_to_bf16(v); return lmx_bf16_to_f32(((uint16_t *)arr)[i]); }
    if (t == LMX_DTYPE_F16) { ((uint16_t *)arr)[i] = lmx_f32_to_f16(v); return lmx_f16_to_f32(((uint16_t *)arr)[i]); }
    ((float *)arr)[i] = v;
    return v;
}

static void run_case(int bits, int group, lmx_dtype sdt, int64_t N, int64_t K) {
    int per = 32 / bits;
    int64_t G = K / group;
    size_t ssz = sdt == LMX_DTYPE_F32 ? 4 : 2;
    uint32_t *packed = calloc((size_t)(N * K / per), 4);
    void *scales = malloc((size_t)(N * G) * ssz), *biases = malloc((size_t)(N * G) * ssz);
    double *dense = malloc((size_t)(N * K) * sizeof(double));
    float *x = malloc((size_t)K * 4), *y = malloc((size_t)(N + 2) * 4), *row = malloc((size_t)K * 4);
    float *xsum = malloc((size_t)G * 4);
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < G; g++) {
            float s = store_param(scales, n * G + g, sdt, 0.01f + 0.05f * (float)(next() % 100) / 100);
            float b = store_param(biases, n * G + g, sdt, 0.1f * frand());
            for (int64_t k = g * group; k < (g + 1) * group; k++) {
                uint32_t q = next() & ((1u << bits) - 1u);
                packed[n * (K / per) + k / per] |= q << ((k % per) * bits);
                dense[n * K + k] = (double)q * s + b;
            }
        }
    for (int64_t k = 0; k < K; k++) x[k] = frand();
    lmx_tensor w = {.dtype = LMX_DTYPE_U32, .ndim = 2, .shape = {N, K}, .data = packed,
                    .q = {.bits = bits, .group = group, .scale_dtype = sdt, .scales = scales, .biases = biases}};

    int exact = 1;
    for (int64_t n = 0; n < N; n++) {
        lmx_dequant_row(&w, n, row);
        for (int64_t k = 0; k < K; k++) exact &= fabs(row[k] - dense[n * K + k]) <= 1e-6 * (1 + fabs(dense[n * K + k]));
    }
    CHECK_MSG(exact, "dequant_row bits %d group %d", bits, group);

    lmx_quant_xsum(x, K, group, xsum);
    lmx_cpu_kernels k; /* the AVX-512 kernel only where this CPU runs it */
    lmx_cpu_kernels_init(&k, NULL);
    lmx_qmatvec_fn fns[2] = {lmx_qmatvec_scalar, strcmp(k.isa, "avx512") == 0 ? lmx_qmatvec_avx512() : NULL};
    for (int f = 0; f < 2; f++) {
        if (!fns[f]) continue;
        int64_t n0 = N > 3 ? 1 : 0, n1 = N > 3 ? N - 1 : N;
        for (int64_t i = 0; i < N + 2; i++) y[i] = 12345.0f; /* canaries */
        fns[f](x, xsum, &w, n0, n1, y);
        int ok = 1;
        for (int64_t n = 0; n < N; n++) {
            if (n < n0 || n >= n1) { ok &= y[n] == 12345.0f; continue; }
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) { ref += dense[n * K + k] * x[k]; mag += fabs(dense[n * K + k] * x[k]); }
            ok &= fabs(y[n] - ref) <= 1e-5 * mag + 1e-5;
        }
        CHECK_MSG(ok, "%s qmatvec bits %d group %d scales %d N %lld K %lld", f ? "avx512" : "scalar", bits, group,
                  (int)sdt, (long long)N, (long long)K);
    }
    free(packed); free(scales); free(biases); free(dense); free(x); free(y); free(row); free(xsum);
}

int main(void) {
    const int bits[] = {2, 4, 8}, groups[] = {32, 64, 128};
    const lmx_dtype sdts[] = {LMX_DTYPE_BF16, LMX_DTYPE_F16, LMX_DTYPE_F32};
    const int64_t shapes[][2] = {{1, 128}, {5, 256}, {17, 384}, {64, 1024}};
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 3; g++)
            for (int s = 0; s < 3; s++)
                for (int i = 0; i < 4; i++) run_case(bits[b], groups[g], sdts[s], shapes[i][0], shapes[i][1]);
    return check_summary("test_quant");
}
