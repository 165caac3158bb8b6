/* test_backward.c - every backward op of the cpu backend (backend/backward.h) against central finite
 * differences of the backend's own forward op, on random shapes with odd sizes.
 *
 * For an op y = f(x, ...) and a fixed random dy, the loss L = sum(dy * y) has dL/dx = the op's
 * vector-Jacobian product; each input element is moved by +-h and (L+ - L-) / 2h compared with what
 * the backward op accumulated (onto a nonzero start, so that += is checked too). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../src/backend/backward.h"
#include "../src/base/half.h"
#include "../src/train/tape.h"
#include "check.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (2.0 / 16777216.0) - 1.0);
}
static float *rand_f32(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = frand() * scale;
    return p;
}
static float *dup_f32(const float *src, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, src, (size_t)n * sizeof(float));
    return p;
}
static lmx_tensor f32(float *data, int64_t rows, int64_t cols) {
    lmx_tensor t = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {rows, cols}, .data = data};
    return t;
}

typedef struct fd_case fd_case;
typedef double (*loss_fn)(fd_case *c);
static lmx_backend *be;

/* sum(dy * y) in double */
static double dot_loss(const float *dy, const float *y, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)dy[i] * y[i];
    return s;
}

/* The worst |numeric - analytic| / (3e-3 + 3e-2 |numeric|) over x's n elements (<= 1 passes); grad
 * holds the analytic gradient plus start, which is subtracted. */
static double fd_worst(loss_fn f, fd_case *c, float *x, int64_t n, const float *grad, const float *start) {
    const float h = 3e-3f;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        const float x0 = x[i];
        x[i] = x0 + h;
        const double lp = f(c);
        x[i] = x0 - h;
        const double lm = f(c);
        x[i] = x0;
        const double num = (lp - lm) / (2.0 * h), ana = (double)grad[i] - (start ? start[i] : 0.0);
        const double r = fabs(num - ana) / (3e-3 + 3e-2 * fabs(num));
        if (r > worst) worst = r;
    }
    return worst;
}

struct fd_case {
    /* rmsnorm / matmul / glu / softcap / rope / attention inputs and the fixed dy */
    float *x, *x2, *x3, *dy;
    lmx_tensor w;
    int rows, n, M;
    float eps, one, cap;
    lmx_act act;
    lmx_batch bt;
    lmx_rope rope;
    int nh, hd, H, Hk, D, window;
    float scale, softcap;
    lmx_lora_pair pair;
    const lmx_lora_pair *pairs[2];
    int B, T;
};

/* ---- rmsnorm ---------------------------------------------------------------------------- */
static double rmsnorm_loss(fd_case *c) {
    float *y = malloc((size_t)c->rows * c->n * sizeof(float));
    lmx_tensor x = f32(c->x, c->rows, c->n), out = f32(y, c->rows, c->n);
    be->ops->rmsnorm(be, &out, &x, &c->w, c->rows, c->n, c->eps, c->one);
    const double l = dot_loss(c->dy, y, (int64_t)c->rows * c->n);
    free(y);
    return l;
}
static void test_rmsnorm(float one) {
    fd_case c = {.rows = 3, .n = 37, .eps = 1e-5f, .one = one};
    const int64_t n = (int64_t)c.rows * c.n;
    c.x = rand_f32(n, 1.0f), c.dy = rand_f32(n, 1.0f);
    float *wd = rand_f32(c.n, 0.5f);
    c.w = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {c.n}, .data = wd};
    float *start = rand_f32(n, 0.1f), *dx = dup_f32(start, n);
    lmx_tensor tdx = f32(dx, c.rows, c.n), tdy = f32(c.dy, c.rows, c.n), tx = f32(c.x, c.rows, c.n);
    CHECK(lmx_cpu_backward.rmsnorm_bwd(be, &tdx, &tdy, &tx, &c.w, c.rows, c.n, c.eps, c.one, 0) == LMX_OK);
    const double w = fd_worst(rmsnorm_loss, &c, c.x, n, dx, start);
    CHECK_MSG(w <= 1.0, "rmsnorm (add_one %g): worst err/tol %.3g", one, w);
    free(c.x), free(c.dy), free(wd), free(start), free(dx);
}

/* ---- matmul (frozen weight of any format) ---------------------------------------------------- */
static double matmul_loss(fd_case *c) {
    const int64_t N = c->w.shape[0], K = c->w.shape[1];
    float *y = malloc((size_t)c->M * N * sizeof(float));
    lmx_tensor x = f32(c->x, c->M, K), out = f32(y, c->M, N);
    be->ops->matmul(be, &out, &x, &c->w, NULL, c->M);
    const double l = dot_loss(c->dy, y, (int64_t)c->M * N);
    free(y);
    return l;
}
static void check_matmul(fd_case *c, const char *what) {
    const int64_t N = c->w.shape[0], K = c->w.shape[1];
    c->x = rand_f32((int64_t)c->M * K, 1.0f), c->dy = rand_f32((int64_t)c->M * N, 1.0f);
    float *start = rand_f32((int64_t)c->M * K, 0.1f), *dx = dup_f32(start, (int64_t)c->M * K);
    lmx_tensor tdx = f32(dx, c->M, K), tdy = f32(c->dy, c->M, N);
    CHECK(lmx_cpu_backward.matmul_bwd(be, &tdx, &tdy, &c->w, c->M, 0) == LMX_OK);
    const double w = fd_worst(matmul_loss, c, c->x, (int64_t)c->M * K, dx, start);
    CHECK_MSG(w <= 1.0, "matmul %s: worst err/tol %.3g", what, w);
    free(c->x), free(c->dy), free(start), free(dx);
}
static void test_matmul(void) {
    { /* f32 [19, 45] */
        fd_case c = {.M = 3};
        float *wd = rand_f32(19 * 45, 0.3f);
        c.w = f32(wd, 19, 45);
        check_matmul(&c, "f32");
        free(wd);
    }
    { /* bf16 [70, 64]: more rows than one widened tile */
        fd_case c = {.M = 2};
        uint16_t *wd = malloc(70 * 64 * sizeof(uint16_t));
        for (int i = 0; i < 70 * 64; i++) wd[i] = lmx_f32_to_bf16(frand() * 0.3f);
        c.w = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {70, 64}, .data = wd};
        check_matmul(&c, "bf16");
        free(wd);
    }
    { /* MLX 4-bit [9, 64], groups of 32, bf16 scales and biases */
        fd_case c = {.M = 3};
        uint32_t *wd = malloc(9 * 8 * sizeof(uint32_t));
        uint16_t *sc = malloc(9 * 2 * sizeof(uint16_t)), *bi = malloc(9 * 2 * sizeof(uint16_t));
        for (int i = 0; i < 9 * 8; i++) wd[i] = (uint32_t)(frand() * 2147483647.0f) ^ (uint32_t)(frand() * 65535.0f);
        for (int i = 0; i < 9 * 2; i++) sc[i] = lmx_f32_to_bf16(0.05f + 0.02f * frand()), bi[i] = lmx_f32_to_bf16(-0.3f * frand());
        c.w = (lmx_tensor){.dtype = LMX_DTYPE_U32, .ndim = 2, .shape = {9, 64}, .data = wd,
                           .q = {.bits = 4, .group = 32, .scale_dtype = LMX_DTYPE_BF16, .scales = sc, .biases = bi}};
        check_matmul(&c, "mlx q4");
        free(wd), free(sc), free(bi);
    }
}

/* ---- lora: x, A and B ------------------------------------------------------------------------ */
enum { LK = 13, LN = 11, LR = 4, LT = 3 };
static double lora_loss(fd_case *c) {
    float *y = calloc((size_t)c->B * c->T * LN, sizeof(float));
    lmx_tensor x = f32(c->x, (int64_t)c->B * c->T, LK), out = f32(y, (int64_t)c->B * c->T, LN);
    be->ops->lora(be, &out, &x, c->B, c->T, c->pairs);
    const double l = dot_loss(c->dy, y, (int64_t)c->B * c->T * LN);
    free(y);
    return l;
}
static void test_lora(int shared) {
    fd_case c = {.B = 2, .T = LT};
    const int64_t M = (int64_t)c.B * c.T;
    float *A = rand_f32(LR * LK, 0.5f), *Bm = rand_f32(LN * LR, 0.5f);
    c.pair = (lmx_lora_pair){.a = f32(A, LR, LK), .b = f32(Bm, LN, LR), .scale = 1.5f};
    c.pairs[0] = &c.pair;
    c.pairs[1] = shared ? &c.pair : NULL; /* both sequences one adapter, or the second none */
    c.x = rand_f32(M * LK, 1.0f), c.dy = rand_f32(M * LN, 1.0f);
    float *s_x = rand_f32(M * LK, 0.1f), *s_a = rand_f32(LR * LK, 0.1f), *s_b = rand_f32(LN * LR, 0.1f);
    float *dx = dup_f32(s_x, M * LK), *da = dup_f32(s_a, LR * LK), *db = dup_f32(s_b, LN * LR);
    lmx_tensor tdx = f32(dx, M, LK), tda = f32(da, LR, LK), tdb = f32(db, LN, LR), tdy = f32(c.dy, M, LN), tx = f32(c.x, M, LK);
    lmx_tensor *das[2] = {&tda, shared ? &tda : NULL}, *dbs[2] = {&tdb, shared ? &tdb : NULL};
    CHECK(lmx_cpu_backward.lora_bwd(be, &tdx, das, dbs, &tdy, &tx, c.B, c.T, c.pairs, 0, NULL, NULL) == LMX_OK);
    double w = fd_worst(lora_loss, &c, c.x, M * LK, dx, s_x);
    CHECK_MSG(w <= 1.0, "lora dx (shared %d): worst err/tol %.3g", shared, w);
    w = fd_worst(lora_loss, &c, A, LR * LK, da, s_a);
    CHECK_MSG(w <= 1.0, "lora dA (shared %d): worst err/tol %.3g", shared, w);
    w = fd_worst(lora_loss, &c, Bm, LN * LR, db, s_b);
    CHECK_MSG(w <= 1.0, "lora dB (shared %d): worst err/tol %.3g", shared, w);
    free(A), free(Bm), free(c.x), free(c.dy), free(s_x), free(s_a), free(s_b), free(dx), free(da), free(db);
}

/* ---- glu, softcap ---------------------------------------------------------------------------- */
static double glu_loss(fd_case *c) {
    float *y = malloc((size_t)c->n * sizeof(float));
    lmx_tensor g = f32(c->x, 1, c->n), u = f32(c->x2, 1, c->n), out = f32(y, 1, c->n);
    be->ops->glu(be, &out, &g, &u, c->n, c->act);
    const double l = dot_loss(c->dy, y, c->n);
    free(y);
    return l;
}
static void test_glu(lmx_act act) {
    fd_case c = {.n = 29, .act = act};
    c.x = rand_f32(c.n, 3.0f), c.x2 = rand_f32(c.n, 1.0f), c.dy = rand_f32(c.n, 1.0f);
    float *s_g = rand_f32(c.n, 0.1f), *s_u = rand_f32(c.n, 0.1f), *dg = dup_f32(s_g, c.n), *du = dup_f32(s_u, c.n);
    lmx_tensor tdg = f32(dg, 1, c.n), tdu = f32(du, 1, c.n), tdy = f32(c.dy, 1, c.n), tg = f32(c.x, 1, c.n), tu = f32(c.x2, 1, c.n);
    CHECK(lmx_cpu_backward.glu_bwd(be, &tdg, &tdu, &tdy, &tg, &tu, c.n, act, 0) == LMX_OK);
    double w = fd_worst(glu_loss, &c, c.x, c.n, dg, s_g);
    CHECK_MSG(w <= 1.0, "glu (act %d) dgate: worst err/tol %.3g", (int)act, w);
    w = fd_worst(glu_loss, &c, c.x2, c.n, du, s_u);
    CHECK_MSG(w <= 1.0, "glu (act %d) dup: worst err/tol %.3g", (int)act, w);
    free(c.x), free(c.x2), free(c.dy), free(s_g), free(s_u), free(dg), free(du);
}

static double softcap_loss(fd_case *c) {
    float *y = dup_f32(c->x, c->n);
    lmx_tensor t = f32(y, 1, c->n);
    be->ops->softcap(be, &t, c->n, c->cap);
    const double l = dot_loss(c->dy, y, c->n);
    free(y);
    return l;
}
static void test_softcap(void) {
    fd_case c = {.n = 17, .cap = 5.0f};
    c.x = rand_f32(c.n, 12.0f), c.dy = rand_f32(c.n, 1.0f);
    float *y = dup_f32(c.x, c.n), *start = rand_f32(c.n, 0.1f), *dx = dup_f32(start, c.n);
    lmx_tensor ty = f32(y, 1, c.n), tdx = f32(dx, 1, c.n), tdy = f32(c.dy, 1, c.n);
    be->ops->softcap(be, &ty, c.n, c.cap);
    CHECK(lmx_cpu_backward.softcap_bwd(be, &tdx, &tdy, &ty, c.n, c.cap) == LMX_OK);
    const double w = fd_worst(softcap_loss, &c, c.x, c.n, dx, start);
    CHECK_MSG(w <= 1.0, "softcap: worst err/tol %.3g", w);
    free(c.x), free(c.dy), free(y), free(start), free(dx);
}

/* ---- rope ------------------------------------------------------------------------------------- */
static const int rope_past[2] = {0, 0}, rope_new[2] = {3, 2};
static double rope_loss(fd_case *c) {
    const int64_t n = (int64_t)c->bt.B * c->bt.T * c->nh * c->hd;
    float *y = dup_f32(c->x, n);
    lmx_tensor t = f32(y, (int64_t)c->bt.B * c->bt.T, (int64_t)c->nh * c->hd);
    be->ops->rope(be, &t, &c->bt, c->nh, c->hd, &c->rope);
    const double l = dot_loss(c->dy, y, n);
    free(y);
    return l;
}
static void test_rope(int interleaved) {
    static const float inv_freq[3] = {1.0f, 0.31f, 0.07f};
    fd_case c = {.nh = 2, .hd = 8};
    c.bt = (lmx_batch){.B = 2, .T = 3, .n_past = rope_past, .n_new = rope_new};
    c.rope = (lmx_rope){.rot_dim = 6, .interleaved = interleaved, .inv_freq = inv_freq, .attn_factor = 1.3f};
    const int64_t rows = (int64_t)c.bt.B * c.bt.T, n = rows * c.nh * c.hd;
    c.x = rand_f32(n, 1.0f), c.dy = rand_f32(n, 1.0f);
    for (int64_t i = 2 * 3 * 16 - 16; i < n; i++) c.dy[i] = 0.0f; /* sequence 1's padding row */
    float *start = rand_f32(n, 0.1f), *dx = dup_f32(start, n);
    lmx_tensor tdx = f32(dx, rows, c.nh * c.hd), tdy = f32(c.dy, rows, c.nh * c.hd);
    CHECK(lmx_cpu_backward.rope_bwd(be, &tdx, &tdy, &c.bt, c.nh, c.hd, &c.rope, 0) == LMX_OK);
    const double w = fd_worst(rope_loss, &c, c.x, n, dx, start);
    CHECK_MSG(w <= 1.0, "rope (interleaved %d): worst err/tol %.3g", interleaved, w);
    free(c.x), free(c.dy), free(start), free(dx);
}

/* ---- attention -------------------------------------------------------------------------------- */
static const int attn_past[2] = {0, 0}, attn_new[2] = {5, 3};
static double attention_loss(fd_case *c) {
    const int64_t M = (int64_t)c->bt.B * c->bt.T;
    float *o = calloc((size_t)(M * c->H * c->D), sizeof(float));
    lmx_tensor q = f32(c->x, M, c->H * c->D), k = f32(c->x2, M, c->Hk * c->D), v = f32(c->x3, M, c->Hk * c->D);
    lmx_tensor out = f32(o, M, c->H * c->D);
    lmx_kv_layer kv[2] = {{.cap = 16, .window = c->window}, {.cap = 16, .window = c->window}};
    lmx_kv_layer *kvp[2] = {&kv[0], &kv[1]};
    lmx_attn_args a = {.batch = &c->bt, .out = &out, .q = &q, .k = &k, .v = &v, .kv = kvp, .H = c->H, .Hk = c->Hk,
                       .D = c->D, .scale = c->scale, .softcap = c->softcap};
    be->ops->attention(be, &a);
    const double l = dot_loss(c->dy, o, M * c->H * c->D);
    free(o);
    return l;
}
static void test_attention(int window, float softcap) {
    fd_case c = {.H = 4, .Hk = 2, .D = 6, .window = window, .scale = 0.4f, .softcap = softcap};
    c.bt = (lmx_batch){.B = 2, .T = 5, .n_past = attn_past, .n_new = attn_new};
    const int64_t M = 10, nq = M * c.H * c.D, nk = M * c.Hk * c.D;
    c.x = rand_f32(nq, 1.5f), c.x2 = rand_f32(nk, 1.5f), c.x3 = rand_f32(nk, 1.0f), c.dy = rand_f32(nq, 1.0f);
    for (int64_t i = (5 + 3) * c.H * c.D; i < nq; i++) c.dy[i] = 0.0f; /* sequence 1's padding rows */
    float *s_q = rand_f32(nq, 0.1f), *s_k = rand_f32(nk, 0.1f), *s_v = rand_f32(nk, 0.1f);
    float *dq = dup_f32(s_q, nq), *dk = dup_f32(s_k, nk), *dv = dup_f32(s_v, nk);
    lmx_tensor q = f32(c.x, M, c.H * c.D), k = f32(c.x2, M, c.Hk * c.D), v = f32(c.x3, M, c.Hk * c.D);
    lmx_tensor tdq = f32(dq, M, c.H * c.D), tdk = f32(dk, M, c.Hk * c.D), tdv = f32(dv, M, c.Hk * c.D);
    lmx_tensor tdo = f32(c.dy, M, c.H * c.D);
    lmx_attn_args a = {.batch = &c.bt, .q = &q, .k = &k, .v = &v, .H = c.H, .Hk = c.Hk, .D = c.D, .scale = c.scale,
                       .softcap = c.softcap};
    const int windows[2] = {window, window};
    CHECK(lmx_cpu_backward.attention_bwd(be, &tdq, &tdk, &tdv, &tdo, &a, windows, 0) == LMX_OK);
    double w = fd_worst(attention_loss, &c, c.x, nq, dq, s_q);
    CHECK_MSG(w <= 1.0, "attention dq (window %d, softcap %g): worst err/tol %.3g", window, softcap, w);
    w = fd_worst(attention_loss, &c, c.x2, nk, dk, s_k);
    CHECK_MSG(w <= 1.0, "attention dk (window %d, softcap %g): worst err/tol %.3g", window, softcap, w);
    w = fd_worst(attention_loss, &c, c.x3, nk, dv, s_v);
    CHECK_MSG(w <= 1.0, "attention dv (window %d, softcap %g): worst err/tol %.3g", window, softcap, w);
    free(c.x), free(c.x2), free(c.x3), free(c.dy), free(s_q), free(s_k), free(s_v), free(dq), free(dk), free(dv);
}

static void test_gather_rows(void) {
    float x[4 * 3] = {0}, d[3 * 3] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    lmx_tensor tx = f32(x, 4, 3), td = f32(d, 3, 3);
    const int rows[3] = {2, 0, 2};
    CHECK(lmx_cpu_backward.gather_rows_bwd(be, &tx, &td, rows, 3, 3) == LMX_OK);
    CHECK(x[0] == 4 && x[2] == 6 && x[3] == 0 && x[6] == 8 && x[8] == 12); /* row 2 gets rows 0 and 2 of d */
}

/* dropout: a fraction p of zeros (within 1% at n = 200000), the rest scaled by 1/(1-p), the same mask
 * for the same seed (in place too) and another for another seed */
static void test_dropout(void) {
    const int64_t n = 200000;
    const float p = 0.3f;
    float *x = rand_f32(n, 1.0f), *y = malloc((size_t)n * sizeof *y), *y2 = malloc((size_t)n * sizeof *y2);
    lmx_tensor tx = f32(x, 1, n), ty = f32(y, 1, n), ty2 = f32(y2, 1, n);
    CHECK(lmx_cpu_backward.dropout(be, &ty, &tx, n, p, 42) == LMX_OK);
    int64_t zeros = 0, bad = 0;
    for (int64_t i = 0; i < n; i++) {
        if (y[i] == 0.0f) zeros++;
        else bad += fabsf(y[i] - x[i] / (1.0f - p)) > 1e-6f * fabsf(x[i]);
    }
    CHECK_MSG(fabs((double)zeros / n - p) < 0.01, "dropout kept %.4f, expected %.4f", 1.0 - (double)zeros / n, 1.0 - p);
    CHECK(bad == 0);
    memcpy(y2, x, (size_t)n * sizeof *y2);
    CHECK(lmx_cpu_backward.dropout(be, &ty2, &ty2, n, p, 42) == LMX_OK);
    CHECK(memcmp(y, y2, (size_t)n * sizeof *y) == 0);
    CHECK(lmx_cpu_backward.dropout(be, &ty2, &tx, n, p, 43) == LMX_OK);
    CHECK(memcmp(y, y2, (size_t)n * sizeof *y) != 0);
    free(x), free(y), free(y2);
}

/* ---- the tape's muted q, k, v (tape.h lmx_tape_replay qkv) ------------------------------------------ */
static lmx_status no_fill(void *user, int which, lmx_tensor *dst) {
    (void)user, (void)which, (void)dst;
    return LMX_OK;
}
/* a matmul into a muted buffer is recorded but never runs (the buffer keeps what it held), an op that reads
 * one fails with a message, and once replay is set to none the same matmul runs */
static void test_tape_mute(void) {
    lmx_err err = {0};
    lmx_tape *t = NULL;
    CHECK(lmx_tape_create(be, &lmx_cpu_backward, &t, &err) == LMX_OK);
    if (!t) return;
    lmx_backend *tb = lmx_tape_backend(t);
    enum { M = 3, K = 5, N = 4 };
    float *x = rand_f32(M * K, 1), *w = rand_f32(N * K, 1), q[M * N], k[M * N], v[M * N], y[M * N];
    for (int i = 0; i < M * N; i++) q[i] = 7.0f;
    lmx_tensor xt = f32(x, M, K), wt = f32(w, N, K), qt = f32(q, M, N), yt = f32(y, M, N);
    lmx_tensor nw = {.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {N}, .data = w};
    const lmx_tape_replay rp = {.qkv = no_fill, .qkv_buf = {q, k, v}};
    lmx_tape_set_replay(t, &rp);
    CHECK(tb->ops->matmul(tb, &qt, &xt, &wt, NULL, M) == LMX_OK);
    CHECK(lmx_tape_end_forward(t, NULL) == LMX_OK);
    int kept = 1;
    for (int i = 0; i < M * N; i++) kept &= q[i] == 7.0f;
    CHECK(kept);
    CHECK(tb->ops->rmsnorm(tb, &yt, &qt, &nw, M, N, 1e-6f, 0.0f) == LMX_ERR_BACKEND);
    CHECK(strstr(tb->err.msg, "is not there") != NULL);
    lmx_tape_set_replay(t, NULL);
    CHECK(tb->ops->matmul(tb, &qt, &xt, &wt, NULL, M) == LMX_OK);
    CHECK(lmx_tape_end_forward(t, NULL) == LMX_OK);
    double want = 0;
    for (int j = 0; j < K; j++) want += (double)x[j] * w[j]; /* q[0][0] = x[0] . w[0] */
    CHECK(fabs(q[0] - want) < 1e-4);
    lmx_tape_free(t);
    free(x), free(w);
}

/* replay's given input (tape.h lmx_tape_replay input): the norm of a leaf whose buffer holds other values is
 * recorded with the given copy as its keep and not run (its output keeps what it held); a matmul that would
 * read that output, or an add that reads the leaf's buffer, fails; and backward from the norm's output gives
 * the leaf the gradient that the same norm run on the real values gives, bit for bit. */
static void test_tape_input(void) {
    enum { M = 3, N = 8 };
    float *x = rand_f32(M * N, 1), *w = rand_f32(N, 1), *g = rand_f32(M * N, 1), dx[2][M * N];
    for (int given = 0; given < 2; given++) {
        lmx_err err = {0};
        lmx_tape *t = NULL;
        CHECK(lmx_tape_create(be, &lmx_cpu_backward, &t, &err) == LMX_OK);
        if (!t) return;
        lmx_backend *tb = lmx_tape_backend(t);
        float xb[M * N], yn[M * N], o[M * N];
        for (int i = 0; i < M * N; i++) xb[i] = given ? 7.0f : x[i], yn[i] = 5.0f;
        lmx_tensor xt = f32(xb, M, N), yt = f32(yn, M, N), ot = f32(o, M, N), wm = f32(w, 1, N), gt = f32(g, M, N);
        lmx_tensor nw = {.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {N}, .data = w};
        const int leaf = lmx_tape_leaf(t, &xt, M, N);
        CHECK(leaf >= 0);
        if (given) {
            lmx_tape_replay rp = {.input = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {M, N}}, .input_buf = xb};
            CHECK(be->ops->alloc(be, &rp.input) == LMX_OK);
            memcpy(rp.input.data, x, sizeof xb);
            lmx_tape_set_replay(t, &rp);
        }
        CHECK(tb->ops->rmsnorm(tb, &yt, &xt, &nw, M, N, 1e-6f, 0.0f) == LMX_OK);
        int kept = 1;
        for (int i = 0; i < M * N; i++) kept &= yn[i] == 5.0f;
        CHECK(kept == given);
        if (given) {
            CHECK(tb->ops->matmul(tb, &ot, &yt, &wm, NULL, M) == LMX_ERR_BACKEND);
            CHECK(strstr(tb->err.msg, "is not there") != NULL);
            CHECK(tb->ops->add(tb, &ot, &xt, M * N) == LMX_ERR_BACKEND);
        }
        CHECK(lmx_tape_end_forward(t, NULL) == LMX_OK);
        CHECK(lmx_tape_backward_from(t, &yt, &gt, M * N, 0) == LMX_OK);
        lmx_tensor d = {0};
        lmx_tape_take_grad(t, leaf, &d);
        CHECK(d.data != NULL);
        if (d.data) memcpy(dx[given], d.data, sizeof dx[given]), be->ops->release(be, &d);
        lmx_tape_free(t);
    }
    double mag = 0;
    for (int i = 0; i < M * N; i++) mag += fabsf(dx[0][i]);
    CHECK(mag > 1e-3); /* a gradient there to compare */
    CHECK_MSG(!memcmp(dx[0], dx[1], sizeof dx[0]), "the given input's gradient differs from the norm's run");
    free(x), free(w), free(g);
}

int main(void) {
    lmx_err err = {0};
    if (lmx_cpu_backend_create(1, &be, &err) != LMX_OK) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    test_rmsnorm(0.0f);
    test_rmsnorm(1.0f);
    test_matmul();
    test_lora(0);
    test_lora(1);
    test_glu(LMX_ACT_SILU);
    test_glu(LMX_ACT_GELU_TANH);
    test_softcap();
    test_rope(0);
    test_rope(1);
    test_attention(0, 0.0f);
    test_attention(2, 0.0f);
    test_attention(3, 3.0f);
    test_gather_rows();
    test_dropout();
    test_tape_mute();
    test_tape_input();
    /* attention from a cached position is not a training shape */
    {
        const int past[1] = {2}, nn[1] = {1};
        lmx_batch bt = {.B = 1, .T = 1, .n_past = past, .n_new = nn};
        lmx_attn_args a = {.batch = &bt, .H = 1, .Hk = 1, .D = 1};
        float z[1] = {0};
        lmx_tensor t = f32(z, 1, 1);
        CHECK(lmx_cpu_backward.attention_bwd(be, &t, &t, &t, &t, &a, NULL, 0) == LMX_ERR_UNSUPPORTED);
    }
    lmx_backend_free(be);
    return check_summary("test_backward");
}
