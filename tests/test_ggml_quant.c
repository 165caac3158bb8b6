/* test_ggml_quant.c - GGUF block-quant kernels (src/backend/cpu/ggml_quant.c) against the `gguf`
 * Python package (vectors in tests/data/ggml_quant, made by tests/ref/make_ggml_quant_vectors.py):
 *   1. block sizes, row bytes, names, supported set; unknown types and misaligned K give 0;
 *   2. for every type, lmx_ggml_dequant_row equals gguf.quants.dequantize bit for bit (both evaluate
 *      scale * q - offset in float32 in the same order, without fused multiply-add);
 *   3. lmx_ggml_dot_row (SIMD where the CPU has it) and the portable dot agree with the float64
 *      reference dot within 1e-5 * sum|x * w|;
 *   4. on random rows of other lengths (odd block counts; float rows whose K is not a multiple of
 *      the SIMD width) at unaligned addresses, both dots agree with a float64 dot of the
 *      dequantized row within the same tolerance;
 *   5. the SIMD dequantization equals the portable one bit for bit, and the row-range matvec agrees
 *      with the portable dot, on random blocks of every type (odd block counts, unaligned rows), at
 *      each kernel level up to the CPU's;
 *   6. the cpu backend's decode matmul on GGUF Q4_K / Q6_K weights under LMX_CPU_ISA=scalar and avx2
 *      is the portable dot bit for bit (the forced table reaches the GGUF kernels), and by default
 *      within the dot tolerance of it;
 *   7. the cpu backend's moe op (cpu_moe.c: a few rows routed and their experts run in two dispatches) on GGUF
 *      experts (Q4_K gate / up with Q6_K down, the VNNI path where the CPU has it; Q8_0) against a float64
 *      reference of the routing and the experts from their dequantized rows, and bit for bit against the ops the
 *      model's host routing runs (forward.c moe_host: each expert's matmuls, GLU and scatter_add_rows, experts
 *      ascending), up to a batch of 12 rows; an expert of 8 rows or more, more than 64 rows, or LMX_CPU_MOE=0, and
 *      the op declines.
 *
 * The data folder is LMX_TESTS_DATA if set, else tests/data next to this source file.
 * Usage: test_ggml_quant [FIXTURES]   (the fixtures argument is not used). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/ggml_quant.h"
#include "base/half.h"
#include "check.h"
#include "moe_ref.h"
#include "test_files.h"

/* Defined in ggml_quant.c (not in the header): the dot without SIMD dispatch. */

enum { REF_K = 512 };

static const struct {
    int type, elems, bytes;
    const char *name;
    int f16_off[2]; /* byte offsets in a block of its f16 scale fields (-1: none) */
} TYPES[] = {
    {LMX_GGML_F32, 1, 4, "F32", {-1, -1}},     {LMX_GGML_F16, 1, 2, "F16", {-1, -1}},
    {LMX_GGML_BF16, 1, 2, "BF16", {-1, -1}},   {LMX_GGML_Q4_0, 32, 18, "Q4_0", {0, -1}},
    {LMX_GGML_Q4_1, 32, 20, "Q4_1", {0, 2}},   {LMX_GGML_Q5_0, 32, 22, "Q5_0", {0, -1}},
    {LMX_GGML_Q5_1, 32, 24, "Q5_1", {0, 2}},   {LMX_GGML_Q8_0, 32, 34, "Q8_0", {0, -1}},
    {LMX_GGML_Q2_K, 256, 84, "Q2_K", {80, 82}}, {LMX_GGML_Q3_K, 256, 110, "Q3_K", {108, -1}},
    {LMX_GGML_Q4_K, 256, 144, "Q4_K", {0, 2}}, {LMX_GGML_Q5_K, 256, 176, "Q5_K", {0, 2}},
    {LMX_GGML_Q6_K, 256, 210, "Q6_K", {208, -1}},
};
#define N_TYPES (sizeof TYPES / sizeof TYPES[0])

/* Reads a whole file; *size gets its length.  NULL (and a failed check) if it cannot. */
static void *read_all(const char *dir, const char *name, const char *ext, size_t *size) {
    char path[1200];
    snprintf(path, sizeof path, "%s/%s.%s", dir, name, ext);
    FILE *fp = fopen(path, "rb");
    CHECK_MSG(fp != NULL, "cannot open %s", path);
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    void *buf = malloc(len > 0 ? (size_t)len : 1);
    size_t got = buf ? fread(buf, 1, (size_t)len, fp) : 0;
    fclose(fp);
    CHECK_MSG(buf && got == (size_t)len, "cannot read %s", path);
    if (!buf || got != (size_t)len) {
        free(buf);
        return NULL;
    }
    *size = (size_t)len;
    return buf;
}

static int g_best; /* lmx_ggml_simd_best(): the level the dot and dequantization tests run at */

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* |got - ref| <= 1e-5 * sum|x * w|, with w the dequantized row. */
static int dot_close(double got, double ref, const float *w, const float *x, int64_t K, double *rel) {
    double mag = 0;
    for (int64_t k = 0; k < K; k++) mag += fabs((double)w[k] * (double)x[k]);
    double err = fabs(got - ref);
    *rel = mag > 0 ? err / mag : err;
    return err <= 1e-5 * mag;
}

/* ---- 1. sizes and names ----------------------------------------------------------------------- */
static void test_sizes(void) {
    for (size_t i = 0; i < N_TYPES; i++) {
        int t = TYPES[i].type;
        CHECK_MSG(lmx_ggml_block_elems(t) == TYPES[i].elems, "%s", TYPES[i].name);
        CHECK_MSG(lmx_ggml_block_bytes(t) == TYPES[i].bytes, "%s", TYPES[i].name);
        CHECK_MSG(!strcmp(lmx_ggml_type_name(t), TYPES[i].name), "%s", TYPES[i].name);
        CHECK(lmx_ggml_row_bytes(t, 4096) == (size_t)(4096 / TYPES[i].elems * TYPES[i].bytes));
        CHECK(lmx_ggml_is_supported_quant(t) == (TYPES[i].elems > 1));
        if (TYPES[i].elems > 1) CHECK(lmx_ggml_row_bytes(t, TYPES[i].elems + 16) == 0);
    }
    CHECK(lmx_ggml_row_bytes(LMX_GGML_Q4_K, 11008) == 43 * 144);
    CHECK(lmx_ggml_row_bytes(LMX_GGML_Q8_0, -32) == 0);
    CHECK(lmx_ggml_block_elems(LMX_GGML_Q8_K) == 256 && lmx_ggml_block_bytes(LMX_GGML_Q8_K) == 292);
    CHECK(lmx_ggml_block_elems(LMX_GGML_Q8_1) == 32 && lmx_ggml_block_bytes(LMX_GGML_Q8_1) == 40);
    CHECK(!lmx_ggml_is_supported_quant(LMX_GGML_Q8_K) && !lmx_ggml_is_supported_quant(LMX_GGML_F32));
    int unknown[] = {4, 5, 16, 29, 31, -1, 1000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        int t = unknown[i];
        CHECK(lmx_ggml_block_elems(t) == 0 && lmx_ggml_block_bytes(t) == 0);
        CHECK(lmx_ggml_row_bytes(t, 256) == 0);
        CHECK(!strcmp(lmx_ggml_type_name(t), "unknown"));
        CHECK(!lmx_ggml_is_supported_quant(t));
        uint8_t row[64] = {1, 2, 3};
        float x[32] = {1}, y[32] = {7};
        CHECK(lmx_ggml_dot_row(g_best, t, row, x, 32) == 0.0f);
        lmx_ggml_dequant_row(g_best, t, row, 32, y);
        CHECK(y[0] == 0.0f && y[31] == 0.0f);
    }
}

/* ---- 2, 3. the gguf reference vectors --------------------------------------------------------- */
static void test_reference(const char *dir, const float *x, int i) {
    const char *name = TYPES[i].name;
    int t = TYPES[i].type;
    size_t nbin = 0, nf = 0, nd = 0;
    uint8_t *bin = read_all(dir, name, "bin", &nbin);
    float *ref = read_all(dir, name, "f32", &nf);
    double *dot = read_all(dir, name, "dot", &nd);
    size_t rb = lmx_ggml_row_bytes(t, REF_K), rows = nf / (REF_K * sizeof(float));
    CHECK_MSG(bin && ref && dot && rows > 0 && nbin == rows * rb && nd == rows * sizeof(double),
              "%s: sizes bin %zu f32 %zu dot %zu", name, nbin, nf, nd);
    if (!bin || !ref || !dot || !rows || nbin != rows * rb || nd != rows * sizeof(double)) goto done;
    float got[REF_K];
    for (size_t r = 0; r < rows; r++) {
        const float *want = ref + r * REF_K;
        lmx_ggml_dequant_row(g_best, t, bin + r * rb, REF_K, got);
        int bad = -1;
        for (int k = 0; k < REF_K && bad < 0; k++)
            if (bits(got[k]) != bits(want[k])) bad = k;
        CHECK_MSG(bad < 0, "%s row %zu: dequant[%d] = %.9g, gguf %.9g", name, r, bad,
                  bad < 0 ? 0.0 : got[bad], bad < 0 ? 0.0 : want[bad]);
        double rel;
        float d = lmx_ggml_dot_row(g_best, t, bin + r * rb, x, REF_K);
        CHECK_MSG(dot_close(d, dot[r], want, x, REF_K, &rel), "%s row %zu: dot %.9g, ref %.9g (rel %.3g)",
                  name, r, d, dot[r], rel);
        d = lmx_ggml_dot_row_portable(t, bin + r * rb, x, REF_K);
        CHECK_MSG(dot_close(d, dot[r], want, x, REF_K, &rel),
                  "%s row %zu: portable dot %.9g, ref %.9g (rel %.3g)", name, r, d, dot[r], rel);
    }
done:
    free(bin);
    free(ref);
    free(dot);
}

/* ---- 4. longer random rows -------------------------------------------------------------------- */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static void test_random(int i) {
    int t = TYPES[i].type, E = TYPES[i].elems;
    int nblocks[] = {1, 3, 7, 16, 37, 515};
    for (size_t n = 0; n < sizeof nblocks / sizeof nblocks[0]; n++) {
        int64_t K = (int64_t)nblocks[n] * E;
        size_t rb = lmx_ggml_row_bytes(t, K);
        uint8_t *buf = malloc(rb + 1);
        float *x = malloc((size_t)K * sizeof *x), *w = malloc((size_t)K * sizeof *w);
        if (!buf || !x || !w) {
            CHECK(0);
            free(buf), free(x), free(w);
            return;
        }
        uint8_t *row = buf + 1; /* rows in a GGUF file need not be aligned */
        for (size_t k = 0; k < rb; k++) row[k] = (uint8_t)rnd();
        for (int64_t k = 0; E == 1 && k < K; k++) { /* float rows: finite values */
            float v = (float)((int32_t)(rnd() % 2001u) - 1000) / 300.0f;
            uint16_t h = t == LMX_GGML_F16 ? lmx_f32_to_f16(v) : lmx_f32_to_bf16(v);
            if (t == LMX_GGML_F32) memcpy(row + 4 * k, &v, 4);
            else memcpy(row + 2 * k, &h, 2);
        }
        for (int64_t b = 0; b < nblocks[n]; b++)
            for (int f = 0; f < 2; f++) {
                int off = TYPES[i].f16_off[f];
                if (off < 0) continue;
                /* f16 with exponent 5..14 (about 1e-3 .. 1), random sign and mantissa */
                uint16_t h = (uint16_t)((rnd() & 0x83ffu) | ((5u + rnd() % 10u) << 10));
                row[b * TYPES[i].bytes + off] = (uint8_t)h;
                row[b * TYPES[i].bytes + off + 1] = (uint8_t)(h >> 8);
            }
        for (int64_t k = 0; k < K; k++) x[k] = (float)((int32_t)(rnd() % 2001u) - 1000) / 500.0f;
        lmx_ggml_dequant_row(g_best, t, row, K, w);
        double ref = 0, rel;
        for (int64_t k = 0; k < K; k++) ref += (double)w[k] * (double)x[k];
        float d = lmx_ggml_dot_row(g_best, t, row, x, K);
        CHECK_MSG(dot_close(d, ref, w, x, K, &rel), "%s K=%lld: dot %.9g, ref %.9g (rel %.3g)",
                  TYPES[i].name, (long long)K, d, ref, rel);
        d = lmx_ggml_dot_row_portable(t, row, x, K);
        CHECK_MSG(dot_close(d, ref, w, x, K, &rel), "%s K=%lld: portable dot %.9g, ref %.9g (rel %.3g)",
                  TYPES[i].name, (long long)K, d, ref, rel);
        free(buf), free(x), free(w);
    }
}

/* ---- 5. the SIMD kernels against the portable ones on random blocks, at each level simd up to the CPU's ----
 * lmx_ggml_dequant_row (AVX-512 where present) equals lmx_ggml_dequant_row_portable bit for bit;
 * lmx_ggml_matvec over a range of rows [n0, n1) of a small matrix equals the portable dot of each
 * row within 1e-5 * sum|x * w| (Q4_K / Q5_K / Q6_K with VNNI: x in 30-bit integers per 256 values),
 * and writes nothing outside y[0 .. n1 - n0); x prepared once (lmx_ggml_xq_*, where the CPU takes it) gives the
 * same bits, and at any K the portable dot's value.  At LMX_GGML_PORTABLE (what LMX_CPU_ISA=scalar or avx2 gives the
 * cpu backend) the matvec is the portable dot's bits.  x has one value 50 times the others' scale, which sets its
 * super-block's integer scale. */
static void test_simd_vs_portable(int i, int simd) {
    int t = TYPES[i].type, E = TYPES[i].elems;
    int nblocks[] = {1, 2, 5, 17, 33, 65}; /* Q4_K / Q5_K / Q6_K: up to 65 super-blocks (K 16,640) */
    for (size_t bn = 0; bn < sizeof nblocks / sizeof nblocks[0]; bn++) {
        int64_t K = (int64_t)nblocks[bn] * (E == 1 ? 37 : E); /* float rows: odd K */
        int N = 7;
        size_t rb = lmx_ggml_row_bytes(t, K);
        uint8_t *buf = malloc(rb * N + 3);
        float *x = malloc((size_t)K * sizeof *x), *w = malloc((size_t)K * sizeof *w), *w2 = malloc((size_t)K * sizeof *w2);
        float y[7 + 4];
        if (!buf || !x || !w || !w2) {
            CHECK(0);
            free(buf), free(x), free(w), free(w2);
            return;
        }
        uint8_t *mat = buf + 3; /* unaligned */
        for (size_t k = 0; k < rb * N; k++) mat[k] = (uint8_t)rnd();
        for (int64_t k = 0; E == 1 && k < K * N; k++) {
            float v = (float)((int32_t)(rnd() % 2001u) - 1000) / 300.0f;
            uint16_t h = t == LMX_GGML_F16 ? lmx_f32_to_f16(v) : lmx_f32_to_bf16(v);
            if (t == LMX_GGML_F32) memcpy(mat + 4 * k, &v, 4);
            else memcpy(mat + 2 * k, &h, 2);
        }
        for (int64_t b = 0; E > 1 && b < (int64_t)nblocks[bn] * N; b++)
            for (int f = 0; f < 2; f++) {
                int off = TYPES[i].f16_off[f];
                if (off < 0) continue;
                uint16_t h = (uint16_t)((rnd() & 0x83ffu) | ((5u + rnd() % 10u) << 10));
                memcpy(mat + b * TYPES[i].bytes + off, &h, 2);
            }
        for (int64_t k = 0; k < K; k++) x[k] = (float)((int32_t)(rnd() % 2001u) - 1000) / 500.0f;
        x[K / 3] *= 50.0f;
        int n0 = 1, n1 = N - 1;
        for (int j = 0; j < 11; j++) y[j] = -12345.0f;
        lmx_ggml_matvec(simd, t, mat, K, n0, n1, x, y);
        for (int n = 0; n < N; n++) {
            const uint8_t *row = mat + (size_t)n * rb;
            lmx_ggml_dequant_row(simd, t, row, K, w);
            lmx_ggml_dequant_row_portable(t, row, K, w2);
            int bad = -1;
            for (int64_t k = 0; k < K && bad < 0; k++)
                if (bits(w[k]) != bits(w2[k])) bad = (int)k;
            CHECK_MSG(bad < 0, "%s K=%lld row %d: dequant[%d] %.9g, portable %.9g", TYPES[i].name, (long long)K, n, bad,
                      bad < 0 ? 0.0 : w[bad], bad < 0 ? 0.0 : w2[bad]);
            if (n < n0 || n >= n1) continue;
            double rel, ref = lmx_ggml_dot_row_portable(t, row, x, K);
            CHECK_MSG(dot_close(y[n - n0], ref, w2, x, K, &rel), "%s K=%lld row %d simd %d: matvec %.9g, portable %.9g (rel %.3g)",
                      TYPES[i].name, (long long)K, n, simd, y[n - n0], ref, rel);
            CHECK_MSG(simd != LMX_GGML_PORTABLE || bits(y[n - n0]) == bits((float)ref),
                      "%s K=%lld row %d: portable-level matvec %.9g, portable dot %.9g", TYPES[i].name, (long long)K, n,
                      y[n - n0], ref);
        }
        for (int j = n1 - n0; j < 11; j++) CHECK_MSG(y[j] == -12345.0f, "%s: matvec wrote y[%d]", TYPES[i].name, j);
        if (lmx_ggml_xq_takes(simd, t, K)) { /* x prepared once (the decode matmul's form): lmx_ggml_matvec's bits, any K */
            void *xq = malloc(lmx_ggml_xq_bytes(K));
            float yq[7];
            lmx_ggml_xq_prepare(t, x, K, xq);
            lmx_ggml_matvec_xq(t, mat, K, n0, n1, xq, yq);
            for (int n = n0; n < n1; n++) {
                double rel, ref = lmx_ggml_dot_row_portable(t, mat + (size_t)n * rb, x, K);
                lmx_ggml_dequant_row_portable(t, mat + (size_t)n * rb, K, w2);
                CHECK_MSG(bits(yq[n - n0]) == bits(y[n - n0]), "%s K=%lld row %d: prepared x %.9g, matvec %.9g",
                          TYPES[i].name, (long long)K, n, yq[n - n0], y[n - n0]);
                CHECK_MSG(dot_close(yq[n - n0], ref, w2, x, K, &rel), "%s K=%lld row %d: prepared x %.9g, portable %.9g (rel %.3g)",
                          TYPES[i].name, (long long)K, n, yq[n - n0], ref, rel);
            }
            free(xq);
        }
        x[K / 2] = NAN; /* a NaN in x reaches every row's dot, as in float arithmetic */
        lmx_ggml_matvec(simd, t, mat, K, n0, n1, x, y);
        for (int n = n0; n < n1; n++) CHECK_MSG(isnan(y[n - n0]), "%s K=%lld: a NaN in x gave %g", TYPES[i].name, (long long)K, y[n - n0]);
        free(buf), free(x), free(w), free(w2);
    }
}

/* ---- 6. LMX_CPU_ISA reaches the GGUF kernels -------------------------------------------------- */
static void test_backend_isa(void) {
    static const char *const isas[] = {"scalar", "avx2", ""};
    static const int types[] = {LMX_GGML_Q4_K, LMX_GGML_Q6_K};
    enum { N = 9, K = 512, M = 2 };
    for (size_t ti = 0; ti < 2; ti++) {
        int t = types[ti];
        size_t rb = lmx_ggml_row_bytes(t, K);
        uint8_t *w = malloc(rb * N);
        float x[M * K], y[M * N], row[K];
        if (!w) {
            CHECK(0);
            return;
        }
        for (size_t k = 0; k < rb * N; k++) w[k] = (uint8_t)rnd();
        for (int64_t b = 0; b < (int64_t)N * K / 256; b++) { /* f16 d / dmin of moderate size */
            int off = t == LMX_GGML_Q4_K ? 0 : 208;
            uint16_t h = (uint16_t)((rnd() & 0x83ffu) | ((5u + rnd() % 10u) << 10));
            memcpy(w + b * lmx_ggml_block_bytes(t) + off, &h, 2);
            if (t == LMX_GGML_Q4_K) memcpy(w + b * lmx_ggml_block_bytes(t) + 2, &h, 2);
        }
        for (int k = 0; k < M * K; k++) x[k] = (float)((int32_t)(rnd() % 2001u) - 1000) / 500.0f;
        lmx_tensor tw = {.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {N, K}, .data = w, .q.ggml_type = t};
        lmx_tensor tx = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, K}, .data = x};
        lmx_tensor ty = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, N}, .data = y};
        for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
            setenv("LMX_CPU_ISA", isas[i], 1);
            lmx_backend *be = NULL;
            lmx_err err = {0};
            CHECK(lmx_cpu_backend_create(2, &be, &err) == LMX_OK);
            if (!be) continue;
            for (int rows = 1; rows <= M; rows++) {
                memset(y, 0, sizeof y);
                CHECK(be->ops->matmul(be, &ty, &tx, &tw, NULL, rows) == LMX_OK);
                for (int m = 0; m < rows; m++)
                    for (int n = 0; n < N; n++) {
                        float ref = lmx_ggml_dot_row_portable(t, w + (size_t)n * rb, x + m * K, K);
                        double rel;
                        lmx_ggml_dequant_row_portable(t, w + (size_t)n * rb, K, row);
                        if (isas[i][0])
                            CHECK_MSG(bits(y[m * N + n]) == bits(ref), "%s LMX_CPU_ISA=%s, %d rows: y[%d, %d] %.9g, portable %.9g",
                                      lmx_ggml_type_name(t), isas[i], rows, m, n, y[m * N + n], ref);
                        else
                            CHECK_MSG(dot_close(y[m * N + n], ref, row, x + m * K, K, &rel),
                                      "%s, %d rows: y[%d, %d] %.9g, portable %.9g (rel %.3g)", lmx_ggml_type_name(t), rows, m,
                                      n, y[m * N + n], ref, rel);
                    }
            }
            lmx_backend_free(be);
        }
        unsetenv("LMX_CPU_ISA");
        free(w);
    }
}

/* ---- 7. the cpu moe op ---------------------------------------------------------------------------------- */

/* n random rows of type TYPES[i] and K elements, their f16 scale fields about 2^-10 .. 2^-6 (malloc'ed) */
static uint8_t *random_rows(int i, int64_t n, int64_t K) {
    const size_t rb = lmx_ggml_row_bytes(TYPES[i].type, K), bb = (size_t)TYPES[i].bytes;
    uint8_t *w = malloc(rb * (size_t)n);
    for (size_t k = 0; w && k < rb * (size_t)n; k++) w[k] = (uint8_t)rnd();
    for (size_t b = 0; w && b < rb * (size_t)n / bb; b++)
        for (int f = 0; f < 2; f++)
            if (TYPES[i].f16_off[f] >= 0) {
                const uint16_t h = (uint16_t)((rnd() & 0x83ffu) | ((5u + rnd() % 5u) << 10));
                memcpy(w + b * bb + TYPES[i].f16_off[f], &h, 2);
            }
    return w;
}

static int type_index(int t) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (TYPES[i].type == t) return (int)i;
    return 0;
}

/* The op on M rows of E experts (K chosen): where every expert has fewer than 8 of the rows, against the float64
 * reference and the host routing's ops bit for bit; else it must decline, out untouched. */
static void test_moe_case(lmx_backend *be, int gt, int dt, int E, int K, int64_t C, int64_t F, int M) {
    lmx_tensor *ex = calloc((size_t)3 * E, sizeof *ex);
    uint8_t **mem = calloc((size_t)3 * E, sizeof *mem);
    float **wf = calloc((size_t)3 * E, sizeof *wf); /* dequantized [rows, cols] */
    for (int e = 0; e < E; e++)
        for (int j = 0; j < 3; j++) {
            const int t = j == 2 ? dt : gt;
            const int64_t N = j == 2 ? C : F, Kj = j == 2 ? F : C;
            const size_t rb = lmx_ggml_row_bytes(t, Kj);
            mem[3 * e + j] = random_rows(type_index(t), N, Kj);
            wf[3 * e + j] = malloc((size_t)(N * Kj) * sizeof(float));
            for (int64_t n = 0; mem[3 * e + j] && n < N; n++)
                lmx_ggml_dequant_row_portable(t, mem[3 * e + j] + n * rb, Kj, wf[3 * e + j] + n * Kj);
            ex[3 * e + j] = (lmx_tensor){.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {N, Kj}, .data = mem[3 * e + j],
                                         .q.ggml_type = t, .q.experts = 1};
        }
    float *x = malloc((size_t)(M * C) * 4), *z = malloc((size_t)(M * E) * 4), *out = malloc((size_t)(M * C) * 4),
          *host = malloc((size_t)(M * C) * 4), *pw = malloc((size_t)(M * K) * 4), *rw = malloc((size_t)M * 4);
    int *pk = malloc((size_t)(M * K) * sizeof *pk), *rows = malloc((size_t)M * sizeof *rows), most = 0;
    for (int64_t k = 0; k < M * C; k++) x[k] = (float)((int32_t)(rnd() % 2001u) - 1000) / 500.0f, out[k] = host[k] = x[k] / 3;
    for (int64_t k = 0; k < M * E; k++) z[k] = (float)((int32_t)(rnd() % 2001u) - 1000) / 300.0f;
    for (int i = 0; i < M; i++) lmx_moe_pick(z + (int64_t)i * E, E, K, 1.0, 1, NULL, pk + i * K, pw + i * K);
    for (int e = 0; e < E; e++) { /* the most rows any expert has */
        int ne = 0;
        for (int p = 0; p < M * K; p++) ne += pk[p] == e;
        most = ne > most ? ne : most;
    }
    lmx_tensor tx = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, C}, .data = x};
    lmx_tensor tz = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, E}, .data = z};
    lmx_tensor to = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, C}, .data = out};
    const lmx_moe_args a = {&to, &tx, &tz, ex, NULL, M, E, K, 1, 1.0f, LMX_ACT_SILU, 1};
    const lmx_status st = be->ops->moe ? be->ops->moe(be, &a) : LMX_ERR_UNSUPPORTED;
    if (most >= 8) {
        CHECK_MSG(st == LMX_ERR_UNSUPPORTED && !memcmp(out, host, (size_t)(M * C) * 4),
                  "moe E=%d K=%d M=%d: an expert of %d rows, and the op did not decline (status %d)", E, K, M, most, st);
    } else {
        CHECK_MSG(st == LMX_OK, "moe E=%d K=%d M=%d: status %d", E, K, M, st);
        double *want = malloc((size_t)(M * C) * sizeof *want), *g = malloc((size_t)F * sizeof *g);
        for (int i = 0; i < M; i++) { /* the routing and the experts in float64 */
            double p[16];
            int pick[16];
            const double ksum = moe_ref_route(z + (int64_t)i * E, E, K, 1.0, pick, p);
            for (int64_t c = 0; c < C; c++) want[i * C + c] = host[i * C + c];
            for (int k = 0; k < K; k++) {
                const float *wg = wf[3 * pick[k]], *wu = wf[3 * pick[k] + 1], *wd = wf[3 * pick[k] + 2];
                for (int64_t f = 0; f < F; f++) {
                    double s = 0, t = 0;
                    for (int64_t c = 0; c < C; c++)
                        s += (double)wg[f * C + c] * x[i * C + c], t += (double)wu[f * C + c] * x[i * C + c];
                    g[f] = s / (1.0 + exp(-s)) * t;
                }
                for (int64_t c = 0; c < C; c++) {
                    double y = 0;
                    for (int64_t f = 0; f < F; f++) y += (double)wd[c * F + f] * g[f];
                    want[i * C + c] += p[k] / ksum * y;
                }
            }
        }
        double d2 = 0, r2 = 0;
        for (int64_t k = 0; k < M * C; k++) d2 += (out[k] - want[k]) * (out[k] - want[k]), r2 += want[k] * want[k];
        CHECK_MSG(sqrt(d2) <= 1e-5 * sqrt(r2), "moe %s / %s E=%d K=%d M=%d: relative error %.3g", lmx_ggml_type_name(gt),
                  lmx_ggml_type_name(dt), E, K, M, sqrt(d2 / r2));
        /* the host's routing (forward.c moe_host): each expert ascending on the rows that chose it */
        float *mxh = malloc((size_t)(M * C) * 4), *gh = malloc((size_t)(M * F) * 4), *uh = malloc((size_t)(M * F) * 4),
              *yh = malloc((size_t)(M * C) * 4);
        lmx_tensor tm = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, C}, .data = mxh},
                   tg = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, F}, .data = gh},
                   tu = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, F}, .data = uh},
                   ty = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, C}, .data = yh},
                   th = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, C}, .data = host};
        for (int e = 0; e < E; e++) {
            int ne = 0;
            for (int i = 0; i < M; i++)
                for (int k = 0; k < K; k++)
                    if (pk[i * K + k] == e) rows[ne] = i, rw[ne++] = pw[i * K + k];
            if (!ne) continue;
            CHECK(be->ops->gather_rows(be, &tm, &tx, rows, ne, C) == LMX_OK);
            CHECK(be->ops->matmul(be, &tg, &tm, &ex[3 * e], NULL, ne) == LMX_OK);
            CHECK(be->ops->matmul(be, &tu, &tm, &ex[3 * e + 1], NULL, ne) == LMX_OK);
            CHECK(be->ops->glu(be, &tg, &tg, &tu, ne * F, LMX_ACT_SILU) == LMX_OK);
            CHECK(be->ops->matmul(be, &ty, &tg, &ex[3 * e + 2], NULL, ne) == LMX_OK);
            CHECK(be->ops->scatter_add_rows(be, &th, &ty, rows, rw, ne, C) == LMX_OK);
        }
        CHECK_MSG(!memcmp(out, host, (size_t)(M * C) * 4), "moe %s / %s E=%d K=%d M=%d: not the host routing's bits",
                  lmx_ggml_type_name(gt), lmx_ggml_type_name(dt), E, K, M);
        free(want), free(g), free(mxh), free(gh), free(uh), free(yh);
    }
    for (int k = 0; k < 3 * E; k++) free(mem[k]), free(wf[k]);
    free(ex), free(mem), free(wf), free(x), free(z), free(out), free(host), free(pw), free(rw), free(pk), free(rows);
}

static void test_moe(void) {
    lmx_backend *be = NULL;
    lmx_err err = {0};
    CHECK(lmx_cpu_backend_create(2, &be, &err) == LMX_OK);
    if (!be) return;
    const int Ms[] = {1, 3, 7};
    for (size_t i = 0; i < 3; i++) {
        test_moe_case(be, LMX_GGML_Q4_K, LMX_GGML_Q6_K, 16, 8, 512, 256, Ms[i]);
        test_moe_case(be, LMX_GGML_Q8_0, LMX_GGML_Q8_0, 6, 3, 96, 160, Ms[i]);
    }
    test_moe_case(be, LMX_GGML_Q4_K, LMX_GGML_Q6_K, 64, 4, 256, 256, 12); /* a batch, each expert a few rows */
    test_moe_case(be, LMX_GGML_Q8_0, LMX_GGML_Q8_0, 6, 3, 96, 160, 40);   /* experts of 8 rows or more: declined */
    /* what it declines before routing: more than 64 rows (a prompt's chunk), and every call under LMX_CPU_MOE=0 */
    lmx_tensor none = {.dtype = LMX_DTYPE_F32, .ndim = 2};
    lmx_tensor ex[3] = {{.dtype = LMX_DTYPE_U8, .ndim = 2, .shape = {32, 32}, .q.ggml_type = LMX_GGML_Q8_0}};
    ex[1] = ex[0], ex[2] = ex[0];
    lmx_moe_args a = {&none, &none, &none, ex, NULL, 65, 1, 1, 1, 1.0f, LMX_ACT_SILU, 1};
    CHECK(be->ops->moe(be, &a) == LMX_ERR_UNSUPPORTED);
    lmx_backend_free(be);
    setenv("LMX_CPU_MOE", "0", 1);
    CHECK(lmx_cpu_backend_create(2, &be, &err) == LMX_OK);
    a.M = 1;
    if (be) CHECK(be->ops->moe(be, &a) == LMX_ERR_UNSUPPORTED);
    unsetenv("LMX_CPU_MOE");
    lmx_backend_free(be);
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    g_best = lmx_ggml_simd_best();
    char dir[1024];
    test_data_dir(dir, sizeof dir, "ggml_quant");
    test_sizes();
    size_t nx = 0;
    float *x = read_all(dir, "x", "f32", &nx);
    CHECK_MSG(x && nx == REF_K * sizeof(float), "x.f32: %zu bytes", nx);
    for (size_t i = 0; i < N_TYPES; i++) {
        if (x && nx == REF_K * sizeof(float)) test_reference(dir, x, (int)i);
        test_random((int)i);
        for (int simd = LMX_GGML_PORTABLE; simd <= g_best; simd++) test_simd_vs_portable((int)i, simd);
    }
    free(x);
    test_backend_isa();
    test_moe();
    return check_summary("test_ggml_quant");
}
