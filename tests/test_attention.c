/* test_attention.c - the cpu backend's attention op against a plain reference in double: each query
 * row's scores over the keys it may see, their softmax and the weighted values, computed here from
 * the definition (lmx_attn_args in backend.h).  Shapes cover one-row decode and prefill, grouped
 * query heads (1 to 150 a kv head), head sizes 64 / 72 / 128 / 256, cached keys before new ones,
 * sliding windows over a ring that has wrapped and one that has not, a soft cap, two sequences of
 * different lengths with padding rows (whose output must be written: zeros), and every kernel table
 * (LMX_CPU_ISA scalar, avx2, avx512, where the CPU has them), at 1 and 3 threads; and the backward (training's)
 * against the definition's gradients in double. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/backend/backend.h"
#include "../src/backend/backward.h"
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

/* The backward (training: sequences from position 0, no cache) against the same definition's gradients in
 * double: for each row, p = softmax(s), s the scaled (soft-capped) scores; dS = p (dP - sum p dP) (times the soft
 * cap's slope) times the scale, dP = dO . v; dq = sum dS k, dk_j += dS_j q, dv_j += p_j dO.  The gradients start
 * from random values (the op adds). */
typedef struct bcase {
    const char *name;
    int B, T, H, Hk, D, window;
    float softcap;
    int n_new[2];
} bcase;

static void run_bwd(lmx_backend *be, const bcase *c, const char *isa, int threads) {
    const int64_t M = (int64_t)c->B * c->T, qs = (int64_t)c->H * c->D, ks = (int64_t)c->Hk * c->D;
    float *q = rand_f32(M * qs), *k = rand_f32(M * ks), *v = rand_f32(M * ks), *dout = rand_f32(M * qs);
    float *dq = rand_f32(M * qs), *dk = rand_f32(M * ks), *dv = rand_f32(M * ks);
    double *rq = malloc((size_t)(M * qs) * sizeof(double)), *rk = malloc((size_t)(M * ks) * sizeof(double));
    double *rv = malloc((size_t)(M * ks) * sizeof(double));
    for (int64_t i = 0; i < M * qs; i++) rq[i] = dq[i];
    for (int64_t i = 0; i < M * ks; i++) rk[i] = dk[i], rv[i] = dv[i];
    for (int b = 0; b < c->B; b++) /* padding rows' dO: what the loss gives them */
        for (int64_t i = ((int64_t)b * c->T + c->n_new[b]) * qs; i < (int64_t)(b + 1) * c->T * qs; i++) dout[i] = 0.0f;
    const int n_past[2] = {0, 0}, windows[2] = {c->window, c->window};
    lmx_batch bt = {.B = c->B, .T = c->T, .n_past = n_past, .n_new = c->n_new, .no_cache = 1};
    lmx_tensor tq = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, qs}, .data = q};
    lmx_tensor tk = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, ks}, .data = k}, tv = tk;
    tv.data = v;
    lmx_tensor tdq = tq, tdk = tk, tdv = tk, tdo = tq;
    tdq.data = dq, tdk.data = dk, tdv.data = dv, tdo.data = dout;
    const float scale = 2.0f / sqrtf((float)c->D);
    lmx_attn_args a = {.batch = &bt, .q = &tq, .k = &tk, .v = &tv, .H = c->H, .Hk = c->Hk, .D = c->D, .scale = scale,
                       .softcap = c->softcap};
    CHECK(lmx_cpu_backward.attention_bwd(be, &tdq, &tdk, &tdv, &tdo, &a, windows, 0) == LMX_OK);
    double *p = malloc((size_t)c->T * sizeof(double)), *s = malloc((size_t)c->T * sizeof(double));
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int t = 0; t < c->n_new[b]; t++) {
                const int g = h / (c->H / c->Hk), lo = c->window > 0 && t - c->window + 1 > 0 ? t - c->window + 1 : 0;
                const float *qv = q + ((int64_t)b * c->T + t) * qs + (int64_t)h * c->D;
                const float *go = dout + ((int64_t)b * c->T + t) * qs + (int64_t)h * c->D;
                double mx = -INFINITY, sum = 0, dsum = 0;
                for (int j = lo; j <= t; j++) {
                    const float *kr = k + ((int64_t)b * c->T + j) * ks + (int64_t)g * c->D;
                    double d = 0;
                    for (int e = 0; e < c->D; e++) d += (double)qv[e] * kr[e];
                    d *= scale;
                    if (c->softcap > 0) d = c->softcap * tanh(d / c->softcap);
                    s[j] = d, mx = d > mx ? d : mx;
                }
                for (int j = lo; j <= t; j++) p[j] = exp(s[j] - mx), sum += p[j];
                for (int j = lo; j <= t; j++) {
                    const float *vr = v + ((int64_t)b * c->T + j) * ks + (int64_t)g * c->D;
                    double dpj = 0;
                    for (int e = 0; e < c->D; e++) dpj += (double)go[e] * vr[e];
                    p[j] /= sum, dsum += p[j] * dpj, s[j] = dpj; /* s: dP from here */
                }
                for (int j = lo; j <= t; j++) {
                    const int64_t kr = ((int64_t)b * c->T + j) * ks + (int64_t)g * c->D;
                    double ds = p[j] * (s[j] - dsum) * scale;
                    if (c->softcap > 0) { /* the slope at the capped score, recomputed */
                        double d = 0;
                        for (int e = 0; e < c->D; e++) d += (double)qv[e] * k[kr + e];
                        const double th = tanh(d * scale / c->softcap);
                        ds *= 1.0 - th * th;
                    }
                    for (int e = 0; e < c->D; e++) {
                        rq[((int64_t)b * c->T + t) * qs + (int64_t)h * c->D + e] += ds * k[kr + e];
                        rk[kr + e] += ds * qv[e];
                        rv[kr + e] += p[j] * go[e];
                    }
                }
            }
    double worst = 0;
    const double *ref[3] = {rq, rk, rv};
    const float *got[3] = {dq, dk, dv};
    const int64_t n[3] = {M * qs, M * ks, M * ks};
    for (int w = 0; w < 3; w++)
        for (int64_t i = 0; i < n[w]; i++) {
            const double e = fabs(got[w][i] - ref[w][i]) / (1e-5 + 2e-5 * fabs(ref[w][i]));
            if (!(e <= worst)) worst = e;
        }
    CHECK_MSG(worst <= 1.0, "backward: %s (%s, %d threads): worst err/tol %.3g", c->name, isa, threads, worst);
    free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv), free(rq), free(rk), free(rv), free(p), free(s);
}

static const bcase bcases[] = {
    {"4 heads a kv head, keys over several chunks and tiles", 1, 300, 8, 2, 64, 0, 0, {300}},
    {"two sequences with padding, a window, head dim 72", 2, 90, 6, 3, 72, 20, 0, {90, 41}},
    {"20 heads a kv head (tiles of 16 heads and 4), soft cap", 1, 40, 20, 1, 32, 0, 30.0f, {40}},
    {"one head a kv head, head dim 256, window past the tile", 1, 70, 3, 3, 256, 5, 0, {70}},
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
            for (size_t c = 0; c < sizeof bcases / sizeof bcases[0]; c++) run_bwd(be, &bcases[c], isas[i], threads);
            lmx_backend_free(be);
        }
    return check_summary("test_attention");
}
