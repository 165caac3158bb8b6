/* test_attention.c - the cpu backend's attention op against a plain reference in double: each query
 * row's scores over the keys it may see, their softmax and the weighted values, computed here from
 * the definition (lmx_attn_args in backend.h).  Shapes cover one-row decode and prefill, grouped
 * query heads (1 to 150 a kv head), head sizes 64 / 72 / 128 / 256, cached keys before new ones,
 * sliding windows over a ring that has wrapped and one that has not, a soft cap, two sequences of
 * different lengths with padding rows (whose output must be written: zeros), and every kernel table
 * (LMX_CPU_ISA scalar, avx2, avx512, where the CPU has them), at 1 and 3 threads. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/backend/backend.h"
#include "check.h"

static uint64_t rng = 0x2545f4914f6cdd1dull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}
static float *rand_f32(int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

typedef struct acase {
    const char *name;
    int B, T, H, Hk, D;
    int cap, rotating, window;
    float softcap;
    int n_past[2], n_new[2];
} acase;

/* The key (or value) row of position p of sequence b, kv head g: cached slot p % cap below n_past, else
 * this call's row p - n_past. */
static const float *row_of(const acase *c, const float *cache, const float *fresh, int b, int g, int p) {
    const int64_t ks = (int64_t)c->Hk * c->D;
    if (p < c->n_past[b]) return cache + (int64_t)(p % c->cap) * ks + (int64_t)g * c->D;
    return fresh + ((int64_t)b * c->T + (p - c->n_past[b])) * ks + (int64_t)g * c->D;
}

static void run_case(lmx_backend *be, const acase *c, const char *isa, int threads) {
    const int64_t M = (int64_t)c->B * c->T, qs = (int64_t)c->H * c->D, ks = (int64_t)c->Hk * c->D;
    float *q = rand_f32(M * qs), *k = rand_f32(M * ks), *v = rand_f32(M * ks), *out = malloc((size_t)(M * qs) * sizeof(float));
    for (int64_t i = 0; i < M * qs; i++) out[i] = NAN; /* every row must be written */
    float *kc[2], *vc[2];
    lmx_kv_layer kv[2];
    lmx_kv_layer *kvp[2];
    for (int b = 0; b < c->B; b++) {
        kc[b] = rand_f32((int64_t)c->cap * ks), vc[b] = rand_f32((int64_t)c->cap * ks);
        kv[b] = (lmx_kv_layer){.cap = c->cap, .rotating = c->rotating, .window = c->window};
        kv[b].k = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {c->cap, ks}, .data = kc[b]};
        kv[b].v = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {c->cap, ks}, .data = vc[b]};
        kvp[b] = &kv[b];
    }
    lmx_batch bt = {.B = c->B, .T = c->T, .n_past = c->n_past, .n_new = c->n_new};
    lmx_tensor tq = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, qs}, .data = q};
    lmx_tensor tk = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, ks}, .data = k};
    lmx_tensor tv = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, ks}, .data = v};
    lmx_tensor to = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, qs}, .data = out};
    const float scale = 1.0f / sqrtf((float)c->D) * 2.0f; /* sharper than usual: softmaxes far from flat */
    lmx_attn_args a = {.batch = &bt, .out = &to, .q = &tq, .k = &tk, .v = &tv, .kv = kvp, .H = c->H, .Hk = c->Hk,
                       .D = c->D, .scale = scale, .softcap = c->softcap};
    CHECK(be->ops->attention(be, &a) == LMX_OK);

    double worst = 0;
    double *s = malloc((size_t)(c->cap + c->T + 1) * 4 * sizeof(double)), *o = malloc((size_t)c->D * sizeof(double));
    int *pos = malloc((size_t)(c->cap + c->T + 1) * 4 * sizeof(int));
    for (int b = 0; b < c->B; b++)
        for (int t = 0; t < c->T; t++)
            for (int h = 0; h < c->H; h++) {
                const float *y = out + ((int64_t)b * c->T + t) * qs + (int64_t)h * c->D;
                if (t >= c->n_new[b]) { /* padding */
                    for (int d = 0; d < c->D; d++) worst = y[d] == 0.0f ? worst : INFINITY;
                    continue;
                }
                const int g = h / (c->H / c->Hk), i = c->n_past[b] + t;
                const int held_from = c->rotating && c->n_past[b] > c->cap ? c->n_past[b] - c->cap : 0;
                const float *qv = q + ((int64_t)b * c->T + t) * qs + (int64_t)h * c->D;
                int n = 0;
                double mx = -INFINITY;
                for (int p = 0; p <= i; p++) {
                    if (p < held_from || (c->window > 0 && i - p >= c->window)) continue;
                    const float *kr = row_of(c, kc[b], k, b, g, p);
                    double dot = 0;
                    for (int d = 0; d < c->D; d++) dot += (double)qv[d] * kr[d];
                    dot *= scale;
                    if (c->softcap > 0) dot = c->softcap * tanh(dot / c->softcap);
                    pos[n] = p, s[n++] = dot;
                    if (dot > mx) mx = dot;
                }
                double sum = 0;
                for (int j = 0; j < n; j++) s[j] = exp(s[j] - mx), sum += s[j];
                memset(o, 0, (size_t)c->D * sizeof(double));
                for (int j = 0; j < n; j++) {
                    const float *vr = row_of(c, vc[b], v, b, g, pos[j]);
                    for (int d = 0; d < c->D; d++) o[d] += s[j] / sum * vr[d];
                }
                for (int d = 0; d < c->D; d++) {
                    const double e = fabs(y[d] - o[d]) / (2e-6 + 2e-5 * fabs(o[d]));
                    if (!(e <= worst)) worst = e; /* a NaN fails */
                }
            }
    CHECK_MSG(worst <= 1.0, "%s (%s, %d threads): worst err/tol %.3g", c->name, isa, threads, worst);
    free(s), free(o), free(pos), free(q), free(k), free(v), free(out);
    for (int b = 0; b < c->B; b++) free(kc[b]), free(vc[b]);
}

static const acase cases[] = {
    {"decode, 2 heads a kv head", 1, 1, 16, 8, 128, 512, 0, 0, 0, {300}, {1}},
    {"decode, one kv head of 4 (split)", 1, 1, 4, 1, 64, 1024, 0, 0, 0, {1000}, {1}},
    {"decode, 20 heads a kv head", 1, 1, 20, 1, 64, 256, 0, 0, 0, {200}, {1}},
    {"decode, 150 heads a kv head (split in tasks)", 1, 1, 150, 1, 64, 64, 0, 0, 0, {40}, {1}},
    {"decode, two sequences", 2, 1, 8, 2, 128, 256, 0, 0, 0, {90, 7}, {1, 1}},
    {"prefill", 1, 100, 8, 2, 128, 128, 0, 0, 0, {0}, {100}},
    {"prefill after cached keys, padding, D 72", 2, 37, 6, 3, 72, 128, 0, 0, 0, {50, 0}, {37, 20}},
    {"sliding window, ring wrapped, D 256", 1, 40, 4, 1, 256, 64, 1, 64, 0, {200}, {40}},
    {"sliding window, ring not full", 1, 9, 8, 4, 64, 64, 1, 64, 0, {30}, {9}},
    {"sliding window, more new rows than the ring", 1, 30, 4, 2, 64, 16, 1, 16, 0, {40}, {30}},
    {"ring shorter than the window: what it holds", 1, 5, 4, 2, 64, 32, 1, 48, 0, {100}, {5}},
    {"window on a full cache, soft cap", 1, 20, 4, 2, 64, 256, 0, 32, 50.0f, {100}, {20}},
    {"prefill, 3 heads a kv head, soft cap", 1, 33, 9, 3, 64, 64, 0, 0, 30.0f, {0}, {33}},
};

int main(void) {
    static const char *isas[] = {"scalar", "avx2", "avx512"};
    for (int i = 0; i < 3; i++)
        for (int threads = 1; threads <= 3; threads += 2) {
            setenv("LMX_CPU_ISA", isas[i], 1);
            lmx_backend *be = NULL;
            lmx_err err = {0};
            CHECK(lmx_cpu_backend_create(threads, &be, &err) == LMX_OK);
            if (!be) continue;
            for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(be, &cases[c], isas[i], threads);
            lmx_backend_free(be);
        }
    return check_summary("test_attention");
}
