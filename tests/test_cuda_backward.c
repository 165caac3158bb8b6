/* test_cuda_backward.c - every backward op of the cuda backend (backend/backward.h) and the loss against
 * the cpu backend's (themselves checked against finite differences by test_backward) on random inputs:
 * odd sizes, dense and quantized frozen weights, LoRA segments with a sequence without a pair, padded
 * batches, GQA, sliding windows, soft-capping, attention split into query tiles, repeated gather rows;
 * the optimizer's gradient norm and AdamW update.
 * Each gradient accumulates onto a random start (+= is checked too), or, where the op takes a fresh mask,
 * is written over it (the start ignored).  The ops that read forward values
 * also run on the cuda backend's bf16 keeps of them (keep op) against the cpu on the same values.
 * Exits 77 (skipped) when lmx is built without CUDA or no GPU is present. */
#include <stdio.h>

#include "backend/backward.h"
#include "base/half.h"

#ifndef LMX_HAVE_CUDA
int main(void) {
    printf("SKIP: lmx built without CUDA\n");
    return 77;
}
#else

#include "cuda_pair.h"

/* tensor [rows, cols] holding data on both backends */
typedef struct tpair { lmx_tensor g, c; int64_t n; } tpair;
static tpair both(int64_t rows, int64_t cols, const float *data) {
    tpair t = {act(gpu, rows, cols, data), act(cpu, rows, cols, data), rows * cols};
    return t;
}
/* a forward value: with kept, the gpu side is the cuda backend's bf16 keep of it and the cpu side the
 * same values in f32 */
static tpair rand_in(int64_t rows, int64_t cols, float amp, int kept) {
    float *v = rand_vec(rows * cols, amp);
    for (int64_t i = 0; kept && i < rows * cols; i++) v[i] = lmx_bf16_to_f32(lmx_f32_to_bf16(v[i]));
    tpair t = both(rows, cols, v);
    free(v);
    if (!kept) return t;
    lmx_tensor k = {0};
    CHECK(lmx_cuda_backward.keep(gpu, &k, &t.g) == LMX_OK);
    CHECK_MSG(k.dtype == LMX_DTYPE_BF16, "the cuda backend keeps dtype %d, not bf16", (int)k.dtype);
    gpu->ops->release(gpu, &t.g);
    t.g = k;
    return t;
}
static tpair rand_both(int64_t rows, int64_t cols, float amp) { return rand_in(rows, cols, amp, 0); }
static void check_both(const char *what, tpair *t, double tol) {
    compare(what, &t->g, &t->c, t->n, tol);
    free_pair(&t->g, &t->c);
}
static void drop(tpair *t) { free_pair(&t->g, &t->c); }
/* NaN in every value of t's cuda copy: a fresh gradient (backward.h) shows any value left unwritten */
static void poison(tpair *t) {
    float *h = malloc((size_t)t->n * sizeof *h);
    for (int64_t i = 0; i < t->n; i++) h[i] = NAN;
    CHECK(gpu->ops->write(gpu, &t->g, 0, h, (size_t)t->n * sizeof *h) == LMX_OK);
    free(h);
}

/* fresh: dx written, not added to (its cuda copy NaN before) */
static void test_rmsnorm(lmx_dtype dt, int n, float one, int kept, unsigned fresh) {
    const int rows = n <= 256 ? 37 : 7; /* short rows: several blocks of 8 warps, the last one partial */
    wpair w = make_weight(dt, 0, 0, 0, 1, n);
    tpair x = rand_in(rows, n, 1.5f, kept), dy = rand_both(rows, n, 1.0f), dx = rand_both(rows, n, 0.1f);
    if (fresh) poison(&dx);
    CHECK(lmx_cuda_backward.rmsnorm_bwd(gpu, &dx.g, &dy.g, &x.g, &w.g, rows, n, 1e-5f, one, fresh) == LMX_OK);
    CHECK(lmx_cpu_backward.rmsnorm_bwd(cpu, &dx.c, &dy.c, &x.c, &w.c, rows, n, 1e-5f, one, fresh) == LMX_OK);
    char what[80];
    snprintf(what, sizeof what, "rmsnorm backward (dtype %d, n %d, +%g, kept %d, fresh %u)", (int)dt, n, one, kept, fresh);
    check_both(what, &dx, 1e-5);
    drop(&x), drop(&dy);
}

static void test_matmul(const char *name, lmx_dtype dt, int bits, int gtype, int N, int K, int M, double tol) {
    wpair w = make_weight(dt, bits, 64, gtype, N, K);
    for (unsigned fresh = 0; fresh < 2; fresh++) {
        tpair dy = rand_in(M, N, 1.0f, fresh), dx = rand_both(M, K, 0.5f); /* dy also as the tape's bf16 copy */
        CHECK(lmx_cuda_backward.matmul_bwd(gpu, &dx.g, &dy.g, &w.g, M, fresh) == LMX_OK);
        CHECK(lmx_cpu_backward.matmul_bwd(cpu, &dx.c, &dy.c, &w.c, M, fresh) == LMX_OK);
        char what[112];
        snprintf(what, sizeof what, "matmul backward (%s, %dx%d, M %d, fresh %u, bf16 dy %u)", name, N, K, M, fresh, fresh);
        check_both(what, &dx, tol);
        drop(&dy);
    }
}

/* B = 4 sequences of T rows: pairs p, p, none, q (dA / dB per pair), with and without dx; x kept in bf16
 * (then the products that read it take bf16 operands); with xa, both backends read x A^T as the cuda
 * lora_keep op wrote it, whose output is the lora op's bit for bit */
static void test_lora(int with_dx, int kept, unsigned fresh, int dy16, int with_xa) {
    const int B = 4, T = 5, K = 48, N = 40, r = 8;
    tpair a[2], b[2], da[2], db[2];
    lmx_lora_pair pg[2], pc[2];
    for (int i = 0; i < 2; i++) {
        a[i] = rand_both(r, K, 0.3f), b[i] = rand_both(N, r, 0.3f);
        da[i] = rand_both(r, K, 0.1f), db[i] = rand_both(N, r, 0.1f);
        pg[i] = (lmx_lora_pair){a[i].g, b[i].g, 0.5f + i}, pc[i] = (lmx_lora_pair){a[i].c, b[i].c, 0.5f + i};
    }
    const lmx_lora_pair *pairs_g[4] = {&pg[0], &pg[0], NULL, &pg[1]}, *pairs_c[4] = {&pc[0], &pc[0], NULL, &pc[1]};
    lmx_tensor *dag[4] = {&da[0].g, &da[0].g, NULL, &da[1].g}, *dbg[4] = {&db[0].g, &db[0].g, NULL, &db[1].g};
    lmx_tensor *dac[4] = {&da[0].c, &da[0].c, NULL, &da[1].c}, *dbc[4] = {&db[0].c, &db[0].c, NULL, &db[1].c};
    tpair x = rand_in(B * T, K, 1.0f, kept), dy = rand_in(B * T, N, 1.0f, dy16), dx = rand_both(B * T, K, 0.1f);
    tpair xa = {{0}, {0}, 0};
    if (with_xa) {
        float *yv = rand_vec(B * T * N, 1.0f);
        lmx_tensor y1 = act(gpu, B * T, N, yv), y2 = act(gpu, B * T, N, yv);
        xa.g = act(gpu, B * T, r, NULL);
        CHECK(gpu->ops->lora(gpu, &y1, &x.g, B, T, pairs_g) == LMX_OK);
        CHECK(lmx_cuda_backward.lora_keep(gpu, &y2, &x.g, B, T, pairs_g, &xa.g) == LMX_OK);
        float *o1 = fetch(gpu, &y1, B * T * N), *o2 = fetch(gpu, &y2, B * T * N), *xv = fetch(gpu, &xa.g, B * T * r);
        CHECK_MSG(!memcmp(o1, o2, (size_t)B * T * N * 4), "lora_keep: output differs from the lora op's");
        xa.c = act(cpu, B * T, r, xv);
        free(o1), free(o2), free(xv), free(yv);
        gpu->ops->release(gpu, &y1), gpu->ops->release(gpu, &y2);
    }
    CHECK(lmx_cuda_backward.lora_bwd(gpu, with_dx ? &dx.g : NULL, dag, dbg, &dy.g, &x.g, B, T, pairs_g, fresh,
                                     with_xa ? &xa.g : NULL, NULL) == LMX_OK);
    CHECK(lmx_cpu_backward.lora_bwd(cpu, with_dx ? &dx.c : NULL, dac, dbc, &dy.c, &x.c, B, T, pairs_c, fresh,
                                    with_xa ? &xa.c : NULL, NULL) == LMX_OK);
    if (with_xa) drop(&xa);
    const double tol = kept || dy16 ? 1e-2 : 2e-3; /* TF32 products, as the forward; bf16 ones with a kept x or dy */
    check_both("lora backward dx", &dx, tol);
    for (int i = 0; i < 2; i++) {
        check_both("lora backward dA", &da[i], tol);
        check_both("lora backward dB", &db[i], tol);
        drop(&a[i]), drop(&b[i]);
    }
    drop(&x), drop(&dy);
}

/* The input gradient of count pairs that read one x (q, k, v) as the tape takes it: lora_bwd writing u = s dy B
 * alone, then lora_dx adding every u A in one product (fresh: written), against the cpu's lora_bwd adding
 * each pair's dx; ranks 8, 16, 8 (the products side by side), x bf16 as the tape keeps it */
static void test_lora_dx(int count, unsigned fresh) {
    const int B = 2, T = 37, K = 96, rows = B * T, ranks[3] = {8, 16, 8}, Ns[3] = {96, 40, 40};
    tpair x = rand_in(rows, K, 1.0f, 1), dx = rand_both(rows, K, 0.1f);
    if (fresh) poison(&dx);
    tpair a[3], b[3], da[3], db[3], dy[3];
    lmx_lora_pair pg[3], pc[3];
    lmx_tensor u[3];
    const lmx_lora_pair *pgs[3];
    for (int i = 0; i < count; i++) {
        a[i] = rand_both(ranks[i], K, 0.3f), b[i] = rand_both(Ns[i], ranks[i], 0.3f);
        da[i] = rand_both(ranks[i], K, 0.1f), db[i] = rand_both(Ns[i], ranks[i], 0.1f);
        dy[i] = rand_in(rows, Ns[i], 1.0f, 1);
        pg[i] = (lmx_lora_pair){a[i].g, b[i].g, 0.5f + i}, pc[i] = (lmx_lora_pair){a[i].c, b[i].c, 0.5f + i};
        const lmx_lora_pair *gp[2] = {&pg[i], &pg[i]}, *cp[2] = {&pc[i], &pc[i]};
        lmx_tensor *dag[2] = {&da[i].g, &da[i].g}, *dbg[2] = {&db[i].g, &db[i].g};
        lmx_tensor *dac[2] = {&da[i].c, &da[i].c}, *dbc[2] = {&db[i].c, &db[i].c};
        u[i] = act(gpu, rows, ranks[i], NULL);
        pgs[i] = &pg[i];
        CHECK(lmx_cuda_backward.lora_bwd(gpu, NULL, dag, dbg, &dy[i].g, &x.g, B, T, gp, 0, NULL, &u[i]) == LMX_OK);
        CHECK(lmx_cpu_backward.lora_bwd(cpu, &dx.c, dac, dbc, &dy[i].c, &x.c, B, T, cp, i == 0 ? fresh : 0, NULL,
                                        NULL) == LMX_OK);
    }
    CHECK(lmx_cuda_backward.lora_dx(gpu, &dx.g, count, u, pgs, fresh) == LMX_OK);
    char what[64];
    snprintf(what, sizeof what, "lora_dx (%d terms, fresh %u)", count, fresh);
    check_both(what, &dx, 1e-2); /* bf16 x and dy, as test_lora's */
    for (int i = 0; i < count; i++) {
        snprintf(what, sizeof what, "lora backward with u: dA of pair %d", i), check_both(what, &da[i], 1e-2);
        snprintf(what, sizeof what, "lora backward with u: dB of pair %d", i), check_both(what, &db[i], 1e-2);
        drop(&a[i]), drop(&b[i]), drop(&dy[i]);
        gpu->ops->release(gpu, &u[i]);
    }
    drop(&x);
}

/* kept: gate from a bf16 keep, and up too for GELU (a layer's kept gate beside its up still in f32) */
static void test_elementwise(int kept, int64_t n) {
    for (int act_i = 0; act_i < 2; act_i++) {
        const lmx_act a = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        tpair g = rand_in(1, n, 4.0f, kept), u = rand_in(1, n, 2.0f, kept && act_i), dy = rand_both(1, n, 1.0f);
        tpair dg = rand_both(1, n, 0.1f), du = rand_both(1, n, 0.1f);
        const unsigned fresh = (unsigned)(act_i + 2 * kept) % 4; /* none, dgate, dup, both */
        CHECK(lmx_cuda_backward.glu_bwd(gpu, &dg.g, &du.g, &dy.g, &g.g, &u.g, n, a, fresh) == LMX_OK);
        CHECK(lmx_cpu_backward.glu_bwd(cpu, &dg.c, &du.c, &dy.c, &g.c, &u.c, n, a, fresh) == LMX_OK);
        check_both("glu backward dgate", &dg, 1e-5);
        check_both("glu backward dup", &du, 1e-5);
        drop(&g), drop(&u), drop(&dy);
    }
    tpair y = rand_in(1, n, 29.0f, kept), dy = rand_both(1, n, 1.0f), dx = rand_both(1, n, 0.1f);
    CHECK(lmx_cuda_backward.softcap_bwd(gpu, &dx.g, &dy.g, &y.g, n, 30.0f) == LMX_OK);
    CHECK(lmx_cpu_backward.softcap_bwd(cpu, &dx.c, &dy.c, &y.c, n, 30.0f) == LMX_OK);
    check_both("softcap backward", &dx, 1e-6);
    drop(&y), drop(&dy);
}

/* glu_keep: in place (out = gate), the cuda glu op's output bit for bit (and the cpu's within the glu
 * op's test tolerances), and the keeps equal to gate's, up's and (with GELU) out's values rounded to
 * bf16, bit for bit */
static void test_glu_keep(void) {
    for (int64_t n = 3000; n <= 3001; n++) /* four values a thread, and one */
    for (int act_i = 0; act_i < 2; act_i++) {
        const lmx_act a = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        float *gv = rand_vec(n, 4.0f), *uv = rand_vec(n, 2.0f);
        tpair g = both(1, n, gv), u = both(1, n, uv);
        lmx_tensor gk = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {1, n}}, uk = gk, ok = gk;
        CHECK(gpu->ops->alloc(gpu, &gk) == LMX_OK && gpu->ops->alloc(gpu, &uk) == LMX_OK && gpu->ops->alloc(gpu, &ok) == LMX_OK);
        lmx_tensor plain = act(gpu, 1, n, gv);
        CHECK(gpu->ops->glu(gpu, &plain, &plain, &u.g, n, a) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_keep(gpu, &g.g, &g.g, &u.g, n, a, &gk, &uk, act_i ? &ok : NULL, NULL, NULL) == LMX_OK);
        CHECK(cpu->ops->glu(cpu, &g.c, &g.c, &u.c, n, a) == LMX_OK);
        float *o1 = fetch(gpu, &plain, n), *o2 = fetch(gpu, &g.g, n);
        CHECK_MSG(!memcmp(o1, o2, (size_t)n * 4), "glu_keep (act %d): output differs from the glu op's", act_i);
        gpu->ops->release(gpu, &plain);
        uint16_t *hg = malloc((size_t)n * 2), *hu = malloc((size_t)n * 2), *ho = malloc((size_t)n * 2);
        CHECK(gpu->ops->read(gpu, &gk, 0, hg, (size_t)n * 2) == LMX_OK && gpu->ops->read(gpu, &uk, 0, hu, (size_t)n * 2) == LMX_OK &&
              gpu->ops->read(gpu, &ok, 0, ho, (size_t)n * 2) == LMX_OK);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += hg[i] != lmx_f32_to_bf16(gv[i]) || hu[i] != lmx_f32_to_bf16(uv[i]) ||
                   (act_i && ho[i] != lmx_f32_to_bf16(o2[i]));
        CHECK_MSG(bad == 0, "glu_keep (act %d): %lld keeps differ from the values rounded to bf16", act_i, (long long)bad);
        check_both(act_i ? "glu_keep output (gelu)" : "glu_keep output (silu)", &g, act_i ? 1e-4 : 1e-5);
        drop(&u);
        gpu->ops->release(gpu, &gk), gpu->ops->release(gpu, &uk), gpu->ops->release(gpu, &ok);
        free(o1), free(o2), free(hg), free(hu), free(ho), free(gv), free(uv);
    }
}

/* a bf16 keep [n] against the cpu's f32 values (relative L2) */
static void compare_keep(const char *what, const lmx_tensor *k, const lmx_tensor *ref, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    float *w = malloc((size_t)n * 4), *c = fetch(cpu, ref, n);
    CHECK(gpu->ops->read(gpu, k, 0, h, (size_t)n * 2) == LMX_OK);
    for (int64_t i = 0; i < n; i++) w[i] = lmx_bf16_to_f32(h[i]);
    const double e = rel_err(w, c, n);
    CHECK_MSG(e < 5e-3, "%s: relative error %.3g", what, e);
    free(h), free(w), free(c);
}

/* LoRA expands taken by the op that reads the projection (lmx_lora_term): the shrink alone (lora_keep with
 * y NULL), then glu_keep with gate's and / or up's term, and lora_add with and without x, against the cpu's
 * lora op (the expand) followed by its glu / add.  rows and columns (N) not multiples of the kernels' tiles;
 * rank 12 takes the GEMM before the plain pass; columns a multiple of 32 take the GLU's tensor-core kernel at
 * ranks 8 and 16. */
static void test_lora_terms(int r, int which, int N, int rows) {
    const int K = 40;
    const int64_t n = (int64_t)rows * N;
    tpair x = rand_both(rows, K, 1.0f), a[2], b[2];
    lmx_lora_pair pg[2], pc[2];
    lmx_tensor xa[2] = {act(gpu, rows, r, NULL), act(gpu, rows, r, NULL)};
    for (int i = 0; i < 2; i++) {
        a[i] = rand_both(r, K, 0.3f), b[i] = rand_both(N, r, 0.3f);
        pg[i] = (lmx_lora_pair){a[i].g, b[i].g, 0.5f + i}, pc[i] = (lmx_lora_pair){a[i].c, b[i].c, 0.5f + i};
        const lmx_lora_pair *one = &pg[i];
        CHECK(lmx_cuda_backward.lora_keep(gpu, NULL, &x.g, 1, rows, &one, &xa[i]) == LMX_OK);
    }
    const lmx_lora_term tg = {&xa[0], &pg[0]}, tu = {&xa[1], &pg[1]};
    const lmx_lora_pair *pc0 = &pc[0], *pc1 = &pc[1];
    char what[96];
    for (int act_i = 0; act_i < 2; act_i++) { /* glu_keep: which 1 gate's term, 2 up's, 3 both */
        const lmx_act ac = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        tpair g = rand_both(rows, N, 3.0f), u = rand_both(rows, N, 2.0f);
        lmx_tensor gk = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}}, uk = gk, ok = gk;
        CHECK(gpu->ops->alloc(gpu, &gk) == LMX_OK && gpu->ops->alloc(gpu, &uk) == LMX_OK && gpu->ops->alloc(gpu, &ok) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_keep(gpu, &g.g, &g.g, &u.g, n, ac, &gk, &uk, &ok, which & 1 ? &tg : NULL,
                                         which & 2 ? &tu : NULL) == LMX_OK);
        if (which & 1) CHECK(cpu->ops->lora(cpu, &g.c, &x.c, 1, rows, &pc0) == LMX_OK);
        if (which & 2) CHECK(cpu->ops->lora(cpu, &u.c, &x.c, 1, rows, &pc1) == LMX_OK);
        snprintf(what, sizeof what, "glu_keep with terms (rank %d, terms %d, act %d): ", r, which, act_i);
        char w2[128];
        snprintf(w2, sizeof w2, "%sgate's keep", what), compare_keep(w2, &gk, &g.c, n);
        snprintf(w2, sizeof w2, "%sup's keep", what), compare_keep(w2, &uk, &u.c, n);
        CHECK(cpu->ops->glu(cpu, &g.c, &g.c, &u.c, n, ac) == LMX_OK);
        snprintf(w2, sizeof w2, "%sout's keep", what), compare_keep(w2, &ok, &g.c, n);
        snprintf(w2, sizeof w2, "%soutput", what), check_both(w2, &g, 2e-3);
        drop(&u);
        gpu->ops->release(gpu, &gk), gpu->ops->release(gpu, &uk), gpu->ops->release(gpu, &ok);
    }
    for (int with_x = 0; with_x < 2; with_x++) { /* lora_add */
        tpair y = rand_both(rows, N, 1.0f), xx = rand_both(rows, N, 1.0f);
        CHECK(lmx_cuda_backward.lora_add(gpu, &y.g, with_x ? &xx.g : NULL, n, &tg) == LMX_OK);
        if (with_x) CHECK(cpu->ops->add(cpu, &y.c, &xx.c, n) == LMX_OK);
        CHECK(cpu->ops->lora(cpu, &y.c, &x.c, 1, rows, &pc0) == LMX_OK);
        snprintf(what, sizeof what, "lora_add (rank %d, x %d)", r, with_x);
        check_both(what, &y, 2e-3);
        drop(&xx);
    }
    /* the lora_glu and lora_add ops (backend.h): one sequence of all the rows (the shrinks, then the kernels
     * above), and the rows as one-row sequences (decode: the lora ops, then the glu op) */
    const lmx_lora_pair **gg = calloc(rows, sizeof *gg), **gu = calloc(rows, sizeof *gu);
    const lmx_lora_pair **cg = calloc(rows, sizeof *cg), **cu = calloc(rows, sizeof *cu);
    for (int i = 0; i < rows; i++) {
        gg[i] = which & 1 ? &pg[0] : NULL, gu[i] = which & 2 ? &pg[1] : NULL;
        cg[i] = which & 1 ? &pc[0] : NULL, cu[i] = which & 2 ? &pc[1] : NULL;
    }
    tpair xk = rand_in(rows, K, 1.0f, 1); /* a prompt's bf16 activations (backend.h): x, and lora_glu's out */
    for (int v = 0; v < 4; v++) {
        const int one_row = v & 1, a16 = v >> 1, B = one_row ? rows : 1, T = one_row ? 1 : rows;
        const tpair *xv = a16 ? &xk : &x;
        tpair g = rand_both(rows, N, 3.0f), u = rand_both(rows, N, 2.0f);
        lmx_tensor o16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}};
        if (a16) CHECK(gpu->ops->alloc(gpu, &o16) == LMX_OK);
        CHECK(gpu->ops->lora_glu(gpu, a16 ? &o16 : &g.g, &g.g, &u.g, &xv->g, B, T, gg, gu, n, LMX_ACT_SILU) == LMX_OK);
        if (which & 1) CHECK(cpu->ops->lora(cpu, &g.c, &xv->c, B, T, cg) == LMX_OK);
        if (which & 2) CHECK(cpu->ops->lora(cpu, &u.c, &xv->c, B, T, cu) == LMX_OK);
        CHECK(cpu->ops->glu(cpu, &g.c, &g.c, &u.c, n, LMX_ACT_SILU) == LMX_OK);
        snprintf(what, sizeof what, "lora_glu op (rank %d, terms %d, %d rows a sequence%s)", r, which, T,
                 a16 ? ", bf16 x and out" : "");
        if (a16) compare_keep(what, &o16, &g.c, n), drop(&g), gpu->ops->release(gpu, &o16);
        else check_both(what, &g, 2e-3);
        drop(&u);
        tpair y = rand_both(rows, N, 1.0f), pj = rand_both(rows, N, 1.0f);
        CHECK(gpu->ops->lora_add(gpu, &y.g, &pj.g, &xv->g, B, T, gg[0] ? gg : gu, n) == LMX_OK);
        CHECK(cpu->ops->lora(cpu, &pj.c, &xv->c, B, T, gg[0] ? cg : cu) == LMX_OK);
        CHECK(cpu->ops->add(cpu, &y.c, &pj.c, n) == LMX_OK);
        snprintf(what, sizeof what, "lora_add op (rank %d, %d rows a sequence%s)", r, T, a16 ? ", bf16 x" : "");
        check_both(what, &y, 2e-3);
        drop(&pj);
    }
    drop(&xk);
    free(gg), free(gu), free(cg), free(cu);
    for (int i = 0; i < 2; i++) drop(&a[i]), drop(&b[i]), gpu->ops->release(gpu, &xa[i]);
    drop(&x);
}

/* glu_bwd_dx: the GLU's bf16 gradients from dy plus the down projection's LoRA input gradient u A, against the
 * cpu's lora_dx into dy, then its glu_bwd; columns not a multiple of 32 are declined (LMX_ERR_UNSUPPORTED) */
static void test_glu_bwd_dx(int r, int N, int rows, int act_i) {
    const int64_t n = (int64_t)rows * N;
    const lmx_act ac = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
    tpair g = rand_in(rows, N, 3.0f, 1), u = rand_in(rows, N, 2.0f, 1), dy = rand_both(rows, N, 1.0f);
    tpair ut = rand_both(rows, r, 1.0f), a = rand_both(r, N, 0.3f), b = rand_both(N, r, 0.3f);
    tpair dg = rand_both(rows, N, 0.1f), du = rand_both(rows, N, 0.1f);
    const lmx_lora_pair pg = {a.g, b.g, 1.0f}, pc = {a.c, b.c, 1.0f}, *pgs = &pg, *pcs = &pc;
    lmx_tensor dg16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}}, du16 = dg16;
    CHECK(gpu->ops->alloc(gpu, &dg16) == LMX_OK && gpu->ops->alloc(gpu, &du16) == LMX_OK);
    const lmx_status st = lmx_cuda_backward.glu_bwd_dx(gpu, &dg16, &du16, &dy.g, &g.g, &u.g, n, ac, 1, &ut.g, &pgs);
    char what[96];
    if (N % 32) {
        CHECK_MSG(st == LMX_ERR_UNSUPPORTED, "glu_bwd_dx with %d columns: status %d, not declined", N, (int)st);
    } else {
        CHECK(st == LMX_OK);
        CHECK(lmx_cpu_backward.lora_dx(cpu, &dy.c, 1, &ut.c, &pcs, 0) == LMX_OK);
        CHECK(lmx_cpu_backward.glu_bwd(cpu, &dg.c, &du.c, &dy.c, &g.c, &u.c, n, ac, 3) == LMX_OK);
        snprintf(what, sizeof what, "glu_bwd_dx (rank %d, %d x %d, act %d): dgate", r, rows, N, act_i);
        compare_keep(what, &dg16, &dg.c, n);
        snprintf(what, sizeof what, "glu_bwd_dx (rank %d, %d x %d, act %d): dup", r, rows, N, act_i);
        compare_keep(what, &du16, &du.c, n);
    }
    gpu->ops->release(gpu, &dg16), gpu->ops->release(gpu, &du16);
    drop(&g), drop(&u), drop(&dy), drop(&ut), drop(&a), drop(&b), drop(&dg), drop(&du);
}

/* rmsnorm_keep: the rmsnorm op's output bit for bit and its keep the output rounded to bf16, bit for
 * bit (rows of 257 and 5000 values: the two block kernels); a per-head row of 128 is refused */
static void test_rmsnorm_keep(void) {
    const int ns[3] = {257, 5000, 128}, rows = 9;
    for (int i = 0; i < 3; i++) {
        const int n = ns[i];
        wpair w = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, n);
        float *xv = rand_vec((int64_t)rows * n, 1.5f);
        lmx_tensor x = act(gpu, rows, n, xv), o1 = act(gpu, rows, n, NULL), o2 = act(gpu, rows, n, NULL);
        lmx_tensor ok = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, n}};
        CHECK(gpu->ops->alloc(gpu, &ok) == LMX_OK);
        CHECK(gpu->ops->rmsnorm(gpu, &o1, &x, &w.g, rows, n, 1e-5f, 1.0f) == LMX_OK);
        const lmx_status st = lmx_cuda_backward.rmsnorm_keep(gpu, &o2, &x, &w.g, rows, n, 1e-5f, 1.0f, &ok);
        if (n <= 256) {
            CHECK_MSG(st == LMX_ERR_UNSUPPORTED, "rmsnorm_keep of %d values a row: status %d", n, (int)st);
        } else {
            CHECK(st == LMX_OK);
            float *f1 = fetch(gpu, &o1, (int64_t)rows * n), *f2 = fetch(gpu, &o2, (int64_t)rows * n);
            uint16_t *h = malloc((size_t)rows * n * 2);
            CHECK(gpu->ops->read(gpu, &ok, 0, h, (size_t)rows * n * 2) == LMX_OK);
            CHECK_MSG(!memcmp(f1, f2, (size_t)rows * n * 4), "rmsnorm_keep (n %d): output differs from the rmsnorm op's", n);
            int64_t bad = 0;
            for (int64_t j = 0; j < (int64_t)rows * n; j++) bad += h[j] != lmx_f32_to_bf16(f1[j]);
            CHECK_MSG(bad == 0, "rmsnorm_keep (n %d): %lld keeps differ from the output rounded to bf16", n, (long long)bad);
            free(f1), free(f2), free(h);
        }
        gpu->ops->release(gpu, &x), gpu->ops->release(gpu, &o1), gpu->ops->release(gpu, &o2), gpu->ops->release(gpu, &ok);
        free_pair(&w.g, &w.c);
        free(xv);
    }
}

/* A bf16 tensor's values [n] from the gpu, widened */
static float *fetch16(const lmx_tensor *t, int64_t n) {
    uint16_t *h = malloc((size_t)n * 2);
    float *f = malloc((size_t)n * 4);
    CHECK(gpu->ops->read(gpu, t, 0, h, (size_t)n * 2) == LMX_OK);
    for (int64_t i = 0; i < n; i++) f[i] = lmx_bf16_to_f32(h[i]);
    free(h);
    return f;
}

/* How many of got's n values are not ref's rounded to bf16 give or take one bf16 step, or 1e-4 of ref's
 * largest (the gpu's exp and tanh and the cpu's vector forms differ by as much near GELU's zeros) */
static int64_t off_bf16(const float *got, const float *ref, int64_t n) {
    float big = 0;
    for (int64_t i = 0; i < n; i++) big = fmaxf(big, fabsf(ref[i]));
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float r = lmx_bf16_to_f32(lmx_f32_to_bf16(ref[i]));
        bad += fabsf(got[i] - r) > fabsf(r) * (1.0f / 128) + 1e-4f * big;
    }
    return bad;
}

/* The values the tape computes again in backward (glu_redo, rmsnorm_redo): from bf16 keeps into bf16, the
 * cpu's ops on the same values rounded to bf16 (within a step); from f32, the f32 forward ops' outputs
 * rounded (the norm of rows over 256: bit for bit), and f32 out where keeps are f32 */
static void test_redo(void) {
    for (int64_t n = 3000; n <= 3001; n++) /* four values a thread, and one */
    for (int act_i = 0; act_i < 2; act_i++) {
        const lmx_act a = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        for (int mix = 0; mix < 3; mix++) { /* gate and up kept bf16; gate f32 and up bf16; both f32 into f32 */
            tpair g = rand_in(1, n, 4.0f, mix == 0), u = rand_in(1, n, 2.0f, mix < 2);
            lmx_tensor o = {.dtype = mix == 2 ? LMX_DTYPE_F32 : LMX_DTYPE_BF16, .ndim = 2, .shape = {1, n}};
            CHECK(gpu->ops->alloc(gpu, &o) == LMX_OK);
            lmx_tensor oc = act(cpu, 1, n, NULL);
            CHECK(lmx_cuda_backward.glu_redo(gpu, &o, &g.g, &u.g, n, a) == LMX_OK);
            CHECK(lmx_cpu_backward.glu_redo(cpu, &oc, &g.c, &u.c, n, a) == LMX_OK);
            if (mix == 2) {
                tpair out = {o, oc, n};
                check_both(act_i ? "glu_redo f32 (gelu)" : "glu_redo f32 (silu)", &out, act_i ? 1e-4 : 1e-5);
            } else {
                float *got = fetch16(&o, n);
                const int64_t bad = off_bf16(got, oc.data, n);
                CHECK_MSG(bad == 0, "glu_redo (act %d, mix %d): %lld values off the cpu's rounded", act_i, mix, (long long)bad);
                free(got);
                gpu->ops->release(gpu, &o), cpu->ops->release(cpu, &oc);
            }
            drop(&g), drop(&u);
        }
    }
    const int ns[3] = {128, 257, 4096}, rows = 9;
    for (int i = 0; i < 3; i++)
        for (int kept = 0; kept < 2; kept++) {
            const int n = ns[i];
            wpair w = make_weight(LMX_DTYPE_BF16, 0, 0, 0, 1, n);
            tpair x = rand_in(rows, n, 1.5f, kept);
            lmx_tensor o = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, n}};
            lmx_tensor fwd = act(gpu, rows, n, NULL), oc = act(cpu, rows, n, NULL);
            CHECK(gpu->ops->alloc(gpu, &o) == LMX_OK);
            CHECK(lmx_cuda_backward.rmsnorm_redo(gpu, &o, &x.g, &w.g, rows, n, 1e-5f, 1.0f) == LMX_OK);
            CHECK(lmx_cpu_backward.rmsnorm_redo(cpu, &oc, &x.c, &w.c, rows, n, 1e-5f, 1.0f) == LMX_OK);
            float *got = fetch16(&o, (int64_t)rows * n);
            int64_t bad = off_bf16(got, oc.data, (int64_t)rows * n);
            CHECK_MSG(bad == 0, "rmsnorm_redo (n %d, kept %d): %lld values off the cpu's rounded", n, kept, (long long)bad);
            if (!kept && n > 256) { /* the forward op's output, rounded, exactly */
                CHECK(gpu->ops->rmsnorm(gpu, &fwd, &x.g, &w.g, rows, n, 1e-5f, 1.0f) == LMX_OK);
                float *f = fetch(gpu, &fwd, (int64_t)rows * n);
                bad = 0;
                for (int64_t j = 0; j < (int64_t)rows * n; j++) bad += lmx_f32_to_bf16(f[j]) != lmx_f32_to_bf16(got[j]);
                CHECK_MSG(bad == 0, "rmsnorm_redo (n %d): %lld values not the rmsnorm op's rounded", n, (long long)bad);
                free(f);
            }
            free(got);
            gpu->ops->release(gpu, &o), gpu->ops->release(gpu, &fwd), cpu->ops->release(cpu, &oc);
            drop(&x);
            free_pair(&w.g, &w.c);
        }
}

/* restore: a keep's values back in f32 (a checkpointed layer's input): the values rounded to bf16, bit for
 * bit, from the bf16 keep; the values themselves from an f32 one */
static void test_restore(void) {
    const int64_t rows = 7, cols = 301, n = rows * cols;
    float *v = rand_vec(n, 30.0f);
    lmx_tensor x = act(gpu, rows, cols, v), k = {0}, back = act(gpu, rows, cols, NULL);
    CHECK(lmx_cuda_backward.keep(gpu, &k, &x) == LMX_OK);
    CHECK(lmx_cuda_backward.restore(gpu, &back, &k) == LMX_OK);
    float *got = fetch(gpu, &back, n);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += got[i] != lmx_bf16_to_f32(lmx_f32_to_bf16(v[i]));
    CHECK_MSG(bad == 0, "restore of a bf16 keep: %lld values not the rounded ones", (long long)bad);
    CHECK(lmx_cuda_backward.restore(gpu, &back, &x) == LMX_OK); /* an f32 keep (LMX_CUDA_KEEP=f32) */
    free(got);
    got = fetch(gpu, &back, n);
    CHECK_MSG(!memcmp(got, v, (size_t)n * 4), "restore of an f32 keep: values differ");
    gpu->ops->release(gpu, &x), gpu->ops->release(gpu, &k), gpu->ops->release(gpu, &back);
    free(got), free(v);
}

/* offload / reload: blocks of a checkpointed step's inputs through page-locked host memory.  Five blocks
 * offloaded from one device buffer rewritten between offloads (each copy must read it before the next
 * write), reloaded last to first with the next one fetched ahead, then out of order, one twice, a block
 * fetched ahead and offloaded again before it is read (the new values must come back), and a larger size
 * (the stages grow): each the values rounded to bf16, bit for bit. */
static void test_offload(void) {
    const int L = 5;
    for (int pass = 0; pass < 2; pass++) {
        const int64_t rows = pass ? 64 : 7, cols = pass ? 1031 : 301, n = rows * cols;
        float *v = rand_vec(n * L, 30.0f);
        char *host = gpu->ops->host_alloc(gpu, (size_t)n * L * 2);
        lmx_tensor x = act(gpu, rows, cols, NULL), back = act(gpu, rows, cols, NULL);
        CHECK(host != NULL);
        for (int l = 0; l < L; l++) {
            CHECK(gpu->ops->write(gpu, &x, 0, v + l * n, (size_t)n * 4) == LMX_OK);
            CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)l * n * 2, &x) == LMX_OK);
        }
        const int order[] = {4, 3, 2, 1, 0, 2, 2, 4, 0, 3, 1};
        const int ahead[] = {3, 2, 1, 0, -1, -1, 4, -1, 3, 1, -1};
        for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++) {
            const int l = order[i];
            if (i == 9) { /* block 3, fetched ahead by the reload before, gets new values first */
                for (int64_t j = 0; j < n; j++) v[3 * n + j] = -v[3 * n + j] * 0.5f;
                CHECK(gpu->ops->write(gpu, &x, 0, v + 3 * n, (size_t)n * 4) == LMX_OK);
                CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)3 * n * 2, &x) == LMX_OK);
            }
            const char *next = ahead[i] >= 0 ? host + (size_t)ahead[i] * n * 2 : NULL;
            CHECK(lmx_cuda_backward.reload(gpu, &back, host + (size_t)l * n * 2, n, next) == LMX_OK);
            float *got = fetch(gpu, &back, n);
            int64_t bad = 0;
            for (int64_t j = 0; j < n; j++) bad += got[j] != lmx_bf16_to_f32(lmx_f32_to_bf16(v[l * n + j]));
            CHECK_MSG(bad == 0, "reload %d of block %d (%lldx%lld): %lld values not the offloaded ones rounded", i, l,
                      (long long)rows, (long long)cols, (long long)bad);
            free(got);
        }
        gpu->ops->release(gpu, &x), gpu->ops->release(gpu, &back);
        gpu->ops->host_free(gpu, host);
        free(v);
    }
}

/* offload / reload of several kinds of block interleaved, as a checkpointed step with replay has them (a
 * layer's input, attention output and hidden state; train.c): three blocks a layer, the middle one wider and
 * reloaded into a bf16 tensor (copied as it is), reloaded from the last layer down, kind by kind, each
 * fetching its kind's block of the layer below ahead; two steps, the second offloading new values over the
 * stages the first left: each the values rounded to bf16, bit for bit. */
static void test_offload_kinds(void) {
    const int L = 4, K = 3;
    const int64_t rows = 9, cols[3] = {301, 517, 301};
    int64_t off[4] = {0};
    for (int k = 0; k < K; k++) off[k + 1] = off[k] + rows * cols[k];
    const int64_t per = off[K]; /* values a layer */
    char *host = gpu->ops->host_alloc(gpu, (size_t)per * L * 2);
    CHECK(host != NULL);
    for (int step = 0; step < 2 && host; step++) {
        float *v = rand_vec(per * L, 20.0f);
        for (int l = 0; l < L; l++)
            for (int k = 0; k < K; k++) {
                lmx_tensor x = act(gpu, rows, cols[k], v + l * per + off[k]);
                CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)(l * per + off[k]) * 2, &x) == LMX_OK);
                gpu->ops->release(gpu, &x);
            }
        for (int l = L - 1; l >= 0; l--)
            for (int k = 0; k < K; k++) {
                const int64_t n = rows * cols[k];
                lmx_tensor back = k == 1 ? (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, cols[k]}}
                                         : act(gpu, rows, cols[k], NULL);
                if (k == 1) CHECK(gpu->ops->alloc(gpu, &back) == LMX_OK);
                const char *next = l > 0 ? host + (size_t)((l - 1) * per + off[k]) * 2 : NULL;
                CHECK(lmx_cuda_backward.reload(gpu, &back, host + (size_t)(l * per + off[k]) * 2, n, next) == LMX_OK);
                float *got = k == 1 ? fetch16(&back, n) : fetch(gpu, &back, n);
                int64_t bad = 0;
                for (int64_t j = 0; j < n; j++) bad += got[j] != lmx_bf16_to_f32(lmx_f32_to_bf16(v[l * per + off[k] + j]));
                CHECK_MSG(bad == 0, "step %d, reload of layer %d's block %d: %lld values not the offloaded ones rounded",
                          step, l, k, (long long)bad);
                free(got);
                gpu->ops->release(gpu, &back);
            }
        free(v);
    }
    if (host) gpu->ops->host_free(gpu, host);
}

/* glu backward into bf16 gradients (the tape's for a GLU's gate and up): the f32 ones rounded to bf16,
 * bit for bit; and the bf16 form refuses to add (fresh must be 3) */
static void test_glu_bwd16(void) {
    for (int64_t n = 2999; n <= 3000; n++) /* one value a thread, and four */
    for (int act_i = 0; act_i < 2; act_i++) {
        const lmx_act a = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        tpair g = rand_in(1, n, 4.0f, 1), u = rand_in(1, n, 2.0f, act_i), dy = rand_both(1, n, 1.0f);
        tpair dg = rand_both(1, n, 0.1f), du = rand_both(1, n, 0.1f);
        lmx_tensor dg16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {1, n}}, du16 = dg16;
        CHECK(gpu->ops->alloc(gpu, &dg16) == LMX_OK && gpu->ops->alloc(gpu, &du16) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_bwd(gpu, &dg.g, &du.g, &dy.g, &g.g, &u.g, n, a, 3) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_bwd(gpu, &dg16, &du16, &dy.g, &g.g, &u.g, n, a, 3) == LMX_OK);
        CHECK_MSG(lmx_cuda_backward.glu_bwd(gpu, &dg16, &du16, &dy.g, &g.g, &u.g, n, a, 1) != LMX_OK,
                  "glu backward: bf16 gradients added to");
        float *fg = fetch(gpu, &dg.g, n), *fu = fetch(gpu, &du.g, n);
        uint16_t *hg = malloc((size_t)n * 2), *hu = malloc((size_t)n * 2);
        CHECK(gpu->ops->read(gpu, &dg16, 0, hg, (size_t)n * 2) == LMX_OK && gpu->ops->read(gpu, &du16, 0, hu, (size_t)n * 2) == LMX_OK);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += hg[i] != lmx_f32_to_bf16(fg[i]) || hu[i] != lmx_f32_to_bf16(fu[i]);
        CHECK_MSG(bad == 0, "glu backward (act %d): %lld bf16 gradients differ from the f32 ones rounded", act_i, (long long)bad);
        free(fg), free(fu), free(hg), free(hu);
        gpu->ops->release(gpu, &dg16), gpu->ops->release(gpu, &du16);
        drop(&g), drop(&u), drop(&dy), drop(&dg), drop(&du);
    }
}

/* T = 5: a thread per head; T = 1100: enough (row, dim pair)s that a thread takes every head; fresh: an f32 dx
 * written (NaN before; padding rows zeros) */
static void test_rope(int rot_dim, int interleaved, int T, unsigned fresh) {
    const int B = 2, nh = 3, hd = 64, past[2] = {0, 0}, nnew[2] = {T, T / 2 + 1};
    float inv[32];
    for (int i = 0; i < rot_dim / 2; i++) inv[i] = powf(10000.0f, -2.0f * i / rot_dim);
    const lmx_rope rope = {.rot_dim = rot_dim, .interleaved = interleaved, .inv_freq = inv, .attn_factor = 1.1f};
    const lmx_batch bt = {.B = B, .T = T, .n_past = past, .n_new = nnew};
    tpair dy = rand_both(B * T, nh * hd, 1.0f), dx = rand_both(B * T, nh * hd, 0.1f);
    if (fresh) poison(&dx);
    CHECK(lmx_cuda_backward.rope_bwd(gpu, &dx.g, &dy.g, &bt, nh, hd, &rope, fresh) == LMX_OK);
    CHECK(lmx_cpu_backward.rope_bwd(cpu, &dx.c, &dy.c, &bt, nh, hd, &rope, fresh) == LMX_OK);
    char what[80];
    snprintf(what, sizeof what, "rope backward (rot %d, interleaved %d, T %d, fresh %u)", rot_dim, interleaved, T, fresh);
    check_both(what, &dx, 1e-5);
    /* into a bf16 gradient (the tape's): R^T dy rounded, every value written (padding rows zeros) */
    const int64_t n = (int64_t)B * T * nh * hd;
    float *zero = calloc((size_t)n, 4), *ref;
    lmx_tensor d16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {B * T, nh * hd}}, dc = act(cpu, B * T, nh * hd, zero);
    CHECK(gpu->ops->alloc(gpu, &d16) == LMX_OK);
    uint16_t *h = malloc((size_t)n * 2);
    for (int64_t i = 0; i < n; i++) h[i] = 0x7fc0; /* NaN: a value left unwritten shows */
    CHECK(gpu->ops->write(gpu, &d16, 0, h, (size_t)n * 2) == LMX_OK);
    CHECK(lmx_cuda_backward.rope_bwd(gpu, &d16, &dy.g, &bt, nh, hd, &rope, 1) == LMX_OK);
    CHECK(lmx_cpu_backward.rope_bwd(cpu, &dc, &dy.c, &bt, nh, hd, &rope, 1) == LMX_OK);
    CHECK(gpu->ops->read(gpu, &d16, 0, h, (size_t)n * 2) == LMX_OK);
    ref = (float *)dc.data;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = lmx_bf16_to_f32(h[i]);
        bad += !(fabsf(v - ref[i]) <= fabsf(ref[i]) / 128.0f + 1e-6f);
    }
    CHECK_MSG(bad == 0, "%s into bf16: %lld of %lld values differ beyond rounding", what, (long long)bad, (long long)n);
    gpu->ops->release(gpu, &d16), cpu->ops->release(cpu, &dc);
    free(zero), free(h);
    drop(&dy);
}

/* attention of 2 sequences (the second padded), H heads over Hk kv heads; tile > 0 forces query tiles
 * of that many rows; with saved, the cuda backward takes the output and log-sum-exp of the cuda forward
 * op (run with lse, as the tape runs it; the output kept as q, k, v are) while the cpu recomputes them;
 * fresh bits: dq, dk, dv written (NaN before; padding rows zeros) */
static void test_attention(int T, int H, int Hk, int D, int window, float softcap, int tile, int kept, int saved,
                           unsigned fresh) {
    const int past[2] = {0, 0}, nnew[2] = {T, T / 2 + 1}, M = 2 * T;
    const lmx_batch bt = {.B = 2, .T = T, .n_past = past, .n_new = nnew};
    tpair q = rand_in(M, H * D, 1.5f, kept), k = rand_in(M, Hk * D, 1.5f, kept), v = rand_in(M, Hk * D, 1.0f, kept);
    tpair dout = rand_both(M, H * D, 1.0f);
    tpair dq = rand_both(M, H * D, 0.1f), dk = rand_both(M, Hk * D, 0.1f), dv = rand_both(M, Hk * D, 0.1f);
    if (fresh & 1) poison(&dq);
    if (fresh & 2) poison(&dk);
    if (fresh & 4) poison(&dv);
    lmx_attn_args ag = {.batch = &bt, .q = &q.g, .k = &k.g, .v = &v.g, .H = H, .Hk = Hk, .D = D,
                        .scale = 1.0f / sqrtf((float)D), .softcap = softcap};
    lmx_attn_args ac = ag;
    ac.q = &q.c, ac.k = &k.c, ac.v = &v.c;
    const int windows[2] = {window, window};
    lmx_tensor out = {0}, lse = {.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {2 * (int64_t)H * T}};
    if (saved) {
        lmx_tensor qf = act(gpu, M, H * D, q.c.data), kf = act(gpu, M, Hk * D, k.c.data), vf = act(gpu, M, Hk * D, v.c.data);
        lmx_kv_layer kvl = {.window = window}; /* no cache: n_past 0 */
        lmx_kv_layer *kvs[2] = {&kvl, &kvl};
        out = act(gpu, M, H * D, NULL);
        CHECK(gpu->ops->alloc(gpu, &lse) == LMX_OK);
        lmx_attn_args fa = ag;
        fa.q = &qf, fa.k = &kf, fa.v = &vf, fa.kv = kvs, fa.out = &out, fa.lse = &lse;
        CHECK(gpu->ops->attention(gpu, &fa) == LMX_OK);
        lmx_attn_args fc = ac; /* the cpu leaves the log-sum-exp to its backward */
        fc.kv = kvs, fc.out = &out, fc.lse = &lse;
        CHECK(cpu->ops->attention(cpu, &fc) == LMX_ERR_UNSUPPORTED);
        if (kept) {
            lmx_tensor o16 = {0};
            CHECK(lmx_cuda_backward.keep(gpu, &o16, &out) == LMX_OK);
            gpu->ops->release(gpu, &out);
            out = o16;
        }
        ag.out = &out, ag.lse = &lse;
        gpu->ops->release(gpu, &qf), gpu->ops->release(gpu, &kf), gpu->ops->release(gpu, &vf);
    }
    char n[16];
    snprintf(n, sizeof n, "%d", tile);
    if (tile) setenv("LMX_CUDA_ATTN_BWD_ROWS", n, 1);
    CHECK(lmx_cuda_backward.attention_bwd(gpu, &dq.g, &dk.g, &dv.g, &dout.g, &ag, windows, fresh) == LMX_OK);
    unsetenv("LMX_CUDA_ATTN_BWD_ROWS");
    CHECK(lmx_cpu_backward.attention_bwd(cpu, &dq.c, &dk.c, &dv.c, &dout.c, &ac, windows, fresh) == LMX_OK);
    char what[160];
    const char *names[3] = {"dq", "dk", "dv"};
    tpair *gs[3] = {&dq, &dk, &dv};
    /* the flash form (head dims 32, 64, 128 without forced tiles) takes bf16 operands: about 4e-3; the
     * tiled form's TF32 products about 1e-3 */
    const double tol = !tile && (D == 32 || D == 64 || D == 128) ? 2e-2 : 5e-3;
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what,
                 "attention backward %s (T %d, H %d/%d, D %d, window %d, cap %g, tile %d, kept %d, saved %d, fresh %u)",
                 names[i], T, H, Hk, D, window, softcap, tile, kept, saved, fresh);
        check_both(what, gs[i], tol);
    }
    drop(&q), drop(&k), drop(&v), drop(&dout);
    if (out.data) gpu->ops->release(gpu, &out);
    if (lse.data) gpu->ops->release(gpu, &lse);
}

static void test_gather(void) {
    const int rows[5] = {3, 0, 3, 6, 3};
    tpair dout = rand_both(5, 700, 1.0f), dx = rand_both(7, 700, 0.1f);
    CHECK(lmx_cuda_backward.gather_rows_bwd(gpu, &dx.g, &dout.g, rows, 5, 700) == LMX_OK);
    CHECK(lmx_cpu_backward.gather_rows_bwd(cpu, &dx.c, &dout.c, rows, 5, 700) == LMX_OK);
    check_both("gather backward", &dx, 1e-6);
    drop(&dout);
}

static void test_xent(double c) {
    const int R = 6, V = 3001;
    const int32_t tg[6] = {0, 3000, 17, 5, 5, 2999};
    const float w[6] = {1.0f, 0.5f, 0.0f, 1.0f, 2.0f, 1.0f};
    tpair z = rand_both(R, V, 8.0f);
    double lg = 0, lc = 0;
    CHECK(lmx_cuda_backward.xent(gpu, &z.g, tg, w, R, V, c, &lg, NULL) == LMX_OK);
    CHECK(lmx_cpu_backward.xent(cpu, &z.c, tg, w, R, V, c, &lc, NULL) == LMX_OK);
    CHECK_MSG(fabs(lg - lc) <= 1e-4 * fabs(lc), "xent loss %.7g, cpu %.7g", lg, lc);
    check_both(c != 0 ? "xent gradient" : "xent logits untouched", &z, 1e-5);
}

/* The gradient into a bf16 tensor of its own (g16): the cpu's in-place gradient rounded, the gpu's logits left
 * as they were; V 3001 (one value a thread) and 3000 (four) */
static void test_xent16(int V) {
    const int R = 6;
    const int32_t tg[6] = {0, 2999, 17, 5, 5, 2998};
    const float w[6] = {1.0f, 0.5f, 0.0f, 1.0f, 2.0f, 1.0f};
    tpair z = rand_both(R, V, 8.0f);
    float *z0 = malloc((size_t)R * V * sizeof *z0);
    CHECK(gpu->ops->read(gpu, &z.g, 0, z0, (size_t)R * V * sizeof *z0) == LMX_OK);
    lmx_tensor g16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {R, V}};
    CHECK(gpu->ops->alloc(gpu, &g16) == LMX_OK);
    double lg = 0, lc = 0;
    CHECK(lmx_cuda_backward.xent(gpu, &z.g, tg, w, R, V, 0.37, &lg, &g16) == LMX_OK);
    CHECK(lmx_cpu_backward.xent(cpu, &z.c, tg, w, R, V, 0.37, &lc, NULL) == LMX_OK);
    CHECK_MSG(fabs(lg - lc) <= 1e-4 * fabs(lc), "xent16 loss %.7g, cpu %.7g", lg, lc);
    float *got = fetch16(&g16, (int64_t)R * V), *zg = malloc((size_t)R * V * sizeof *zg);
    const int64_t bad = off_bf16(got, z.c.data, (int64_t)R * V);
    CHECK_MSG(bad == 0, "xent16 (V %d): %lld gradients are not the cpu's rounded to bf16", V, (long long)bad);
    CHECK(gpu->ops->read(gpu, &z.g, 0, zg, (size_t)R * V * sizeof *zg) == LMX_OK);
    CHECK_MSG(memcmp(zg, z0, (size_t)R * V * sizeof *zg) == 0, "xent16 (V %d) wrote the logits", V);
    lmx_tensor f32 = {.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {R, V}, .data = z.g.data};
    CHECK(lmx_cuda_backward.xent(gpu, &z.g, tg, w, R, V, 0.37, &lg, &f32) == LMX_ERR_SHAPE); /* not bf16 */
    free(got), free(zg), free(z0);
    gpu->ops->release(gpu, &g16);
    drop(&z);
}

static void test_optimizer(void) {
    const int64_t n = 4099;
    tpair p = rand_both(1, n, 0.5f), g = rand_both(1, n, 1e-3f), m1 = rand_both(1, n, 1e-4f), m2 = rand_both(1, n, 0.0f);
    double sg = 0, sc = 0;
    const lmx_tensor gs[2] = {g.g, m1.g}, cs[2] = {g.c, m1.c}; /* two tensors into one sum */
    CHECK(lmx_cuda_backward.sumsq(gpu, gs, 2, &sg) == LMX_OK);
    CHECK(lmx_cpu_backward.sumsq(cpu, cs, 2, &sc) == LMX_OK);
    CHECK_MSG(fabs(sg - sc) <= 1e-12 + 1e-9 * sc, "sumsq %.12g, cpu %.12g", sg, sc);
    const lmx_adamw_step s = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                              .bc1 = 1 - 0.9 * 0.9, .bc2 = 1 - 0.999 * 0.999, .clip = 0.7};
    for (int step = 0; step < 2; step++) {
        CHECK(lmx_cuda_backward.adamw(gpu, &p.g, &g.g, &m1.g, &m2.g, n, &s) == LMX_OK);
        CHECK(lmx_cpu_backward.adamw(cpu, &p.c, &g.c, &m1.c, &m2.c, n, &s) == LMX_OK);
    }
    check_both("adamw parameters", &p, 1e-6);
    check_both("adamw m1", &m1, 1e-6);
    check_both("adamw m2", &m2, 1e-6);
    drop(&g);
}

/* adamw_many over parameters of 4099, 1 and 70000 values (chunks of a launch that end inside a tensor and
 * tensors of one value) against the cpu's adamw op on each; sumsq over the same three gradients, then
 * zero_many over them */
static void test_optimizer_many(void) {
    const int64_t ns[3] = {4099, 1, 70000};
    tpair p[3], g[3], m[6];
    lmx_tensor *pg[3], gg[3], mg[6], gc[3];
    for (int i = 0; i < 3; i++) {
        p[i] = rand_both(1, ns[i], 0.5f), g[i] = rand_both(1, ns[i], 1e-3f);
        m[2 * i] = rand_both(1, ns[i], 1e-4f), m[2 * i + 1] = rand_both(1, ns[i], 0.0f); /* m2 >= 0: zeros */
        pg[i] = &p[i].g, gg[i] = g[i].g, gc[i] = g[i].c, mg[2 * i] = m[2 * i].g, mg[2 * i + 1] = m[2 * i + 1].g;
    }
    double sg = 0, sc = 0;
    CHECK(lmx_cuda_backward.sumsq(gpu, gg, 3, &sg) == LMX_OK);
    CHECK(lmx_cpu_backward.sumsq(cpu, gc, 3, &sc) == LMX_OK);
    CHECK_MSG(fabs(sg - sc) <= 1e-12 + 1e-9 * sc, "sumsq of three, %.12g, cpu %.12g", sg, sc);
    const lmx_adamw_step s = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                              .bc1 = 1 - 0.9, .bc2 = 1 - 0.999, .clip = 1.0};
    CHECK(lmx_cuda_backward.adamw_many(gpu, 3, pg, gg, mg, &s) == LMX_OK);
    for (int i = 0; i < 3; i++) {
        CHECK(lmx_cpu_backward.adamw(cpu, &p[i].c, &g[i].c, &m[2 * i].c, &m[2 * i + 1].c, ns[i], &s) == LMX_OK);
        char what[64];
        snprintf(what, sizeof what, "adamw_many parameter %d", i), check_both(what, &p[i], 1e-6);
        snprintf(what, sizeof what, "adamw_many m1 %d", i), check_both(what, &m[2 * i], 1e-6);
        snprintf(what, sizeof what, "adamw_many m2 %d", i), check_both(what, &m[2 * i + 1], 1e-6);
    }
    /* zero_many over the same three (the gradients are nonzero random values) */
    CHECK(lmx_cuda_backward.zero_many(gpu, 3, gg) == LMX_OK);
    CHECK(lmx_cpu_backward.zero_many(cpu, 3, gc) == LMX_OK);
    for (int i = 0; i < 3; i++) {
        float *got = malloc((size_t)ns[i] * sizeof *got);
        CHECK(gpu->ops->read(gpu, &g[i].g, 0, got, (size_t)ns[i] * sizeof *got) == LMX_OK);
        int64_t nz = 0, cz = 0;
        for (int64_t k = 0; k < ns[i]; k++) nz += got[k] != 0.0f, cz += ((const float *)g[i].c.data)[k] != 0.0f;
        CHECK_MSG(nz == 0 && cz == 0, "zero_many tensor %d: %lld values left on cuda, %lld on the cpu", i, (long long)nz,
                  (long long)cz);
        free(got);
        drop(&g[i]);
    }
}

static void test_dropout(void) {
    tpair x = rand_both(37, 1001, 1.0f), y = rand_both(37, 1001, 0.0f);
    CHECK(lmx_cuda_backward.dropout(gpu, &y.g, &x.g, y.n, 0.25f, 7) == LMX_OK);
    CHECK(lmx_cpu_backward.dropout(cpu, &y.c, &x.c, y.n, 0.25f, 7) == LMX_OK);
    check_both("dropout (the same mask)", &y, 1e-7);
    drop(&x);
}

int main(void) {
    const int skip = pair_open();
    if (skip) return skip;
    test_rmsnorm(LMX_DTYPE_F32, 300, 0.0f, 0, 0);
    test_rmsnorm(LMX_DTYPE_BF16, 1000, 1.0f, 0, 0);
    test_rmsnorm(LMX_DTYPE_BF16, 1000, 1.0f, 1, 0);
    test_rmsnorm(LMX_DTYPE_BF16, 128, 0.0f, 0, 0); /* a warp a row: per-head q / k norms */
    test_rmsnorm(LMX_DTYPE_F32, 100, 1.0f, 1, 0);
    test_rmsnorm(LMX_DTYPE_BF16, 2048, 0.0f, 1, 0); /* rows of 1,024 n: a thread's values in registers */
    test_rmsnorm(LMX_DTYPE_F32, 3072, 1.0f, 0, 0);
    test_rmsnorm(LMX_DTYPE_BF16, 128, 0.0f, 1, 1); /* fresh dx: each of the three kernels */
    test_rmsnorm(LMX_DTYPE_BF16, 2048, 0.0f, 1, 1);
    test_rmsnorm(LMX_DTYPE_F32, 300, 1.0f, 0, 1);
    test_matmul("f32", LMX_DTYPE_F32, 0, 0, 37, 65, 9, 1e-5);
    test_matmul("bf16", LMX_DTYPE_BF16, 0, 0, 100, 256, 33, 1e-2);
    test_matmul("f16", LMX_DTYPE_F16, 0, 0, 96, 128, 17, 1e-2);
    test_matmul("mlx4", LMX_DTYPE_U32, 4, 0, 96, 256, 40, 1e-2);
    test_matmul("mlx8", LMX_DTYPE_U32, 8, 0, 64, 192, 3, 1e-2);
    test_matmul("q4_k", LMX_DTYPE_U8, 0, LMX_GGML_Q4_K, 64, 512, 21, 1e-2);
    test_matmul("q8_0", LMX_DTYPE_U8, 0, LMX_GGML_Q8_0, 50, 96, 12, 1e-2);
    test_lora(1, 0, 0, 0, 0);
    test_lora(0, 0, 0, 0, 0);
    test_lora(1, 1, 0, 0, 0);
    test_lora(1, 0, 1, 0, 0); /* dx written: its rows of the sequence without a pair are zeros */
    test_lora(1, 1, 1, 0, 0);
    test_lora(1, 1, 1, 1, 0); /* dy as the tape's bf16 copy too */
    test_lora(1, 0, 0, 1, 0); /* an f32 x (dropout's copy) beside it */
    test_lora(1, 1, 1, 1, 1); /* x A^T from the forward (lora_keep), as the tape runs it */
    test_lora(0, 0, 0, 0, 1);
    test_lora_dx(1, 0);
    test_lora_dx(3, 1);
    test_lora_dx(2, 0);
    test_glu_bwd_dx(16, 320, 67, 0);
    test_glu_bwd_dx(8, 64, 300, 1);
    test_glu_bwd_dx(16, 300, 20, 0);
    test_elementwise(0, 1001);
    test_elementwise(1, 1001);
    test_elementwise(0, 1024); /* four values a thread */
    test_elementwise(1, 1024);
    test_glu_keep();
    test_lora_terms(16, 3, 300, 67);
    test_lora_terms(16, 3, 301, 67); /* odd columns: the GLU's kernel a value at a time */
    test_lora_terms(8, 1, 300, 67);
    test_lora_terms(32, 2, 300, 67);
    test_lora_terms(12, 3, 300, 67); /* not a kernel's rank: the GEMMs first */
    test_lora_terms(16, 3, 320, 67); /* the GLU's tensor-core kernel: a block's columns in part, rows in part */
    test_lora_terms(8, 1, 64, 300);  /* three blocks of rows */
    test_lora_terms(16, 2, 512, 261);
    test_glu_bwd16();
    test_rmsnorm_keep();
    test_redo();
    test_restore();
    test_offload();
    test_offload_kinds();
    for (int T = 5; T <= 1100; T += 1095) {
        test_rope(64, 0, T, 0);
        test_rope(64, 1, T, 0);
        test_rope(32, 0, T, 0);
        test_rope(32, 1, T, 1); /* fresh: the pass-through dims and padding rows written too */
    }
    test_attention(37, 4, 2, 64, 0, 0.0f, 0, 0, 0, 0);
    test_attention(37, 4, 2, 64, 8, 0.0f, 0, 0, 0, 0);
    test_attention(37, 4, 4, 32, 0, 20.0f, 0, 0, 0, 0);
    test_attention(100, 6, 2, 64, 0, 0.0f, 16, 0, 0, 0);
    test_attention(100, 6, 3, 64, 24, 30.0f, 5, 0, 0, 0);
    test_attention(150, 8, 2, 128, 0, 0.0f, 0, 0, 0, 0);   /* flash: several key and query tiles, a ragged last one */
    test_attention(150, 4, 1, 128, 40, 30.0f, 0, 0, 0, 0); /* flash: a window across tiles, soft-capping, 4 heads a kv head */
    test_attention(150, 4, 1, 128, 40, 30.0f, 0, 1, 0, 0); /* the same from bf16 keeps */
    test_attention(70, 2, 1, 256, 0, 0.0f, 0, 1, 0, 0);   /* the tiled form from bf16 keeps */
    test_attention(200, 2, 2, 64, 70, 0.0f, 0, 0, 0, 0);
    test_attention(130, 4, 2, 32, 0, 0.0f, 0, 0, 0, 0);
    test_attention(150, 8, 2, 128, 0, 0.0f, 48, 0, 0, 0);  /* the tiled form at D 128 */
    test_attention(70, 2, 1, 256, 0, 0.0f, 0, 0, 0, 0);    /* no flash kernels for D 256: the tiled form */
    /* the forward's output and log-sum-exp taken, not recomputed: f32 and bf16 keeps, GQA, windows,
     * soft-capping, ragged tiles; D 256 (the forward writes it, the tiled form recomputes it) */
    test_attention(150, 8, 2, 128, 0, 0.0f, 0, 0, 1, 0);
    test_attention(150, 4, 1, 128, 40, 30.0f, 0, 1, 1, 0);
    test_attention(130, 4, 2, 32, 0, 0.0f, 0, 1, 1, 0);
    test_attention(37, 4, 2, 64, 8, 0.0f, 0, 1, 1, 0);
    test_attention(20, 4, 4, 64, 0, 20.0f, 0, 0, 1, 0);
    test_attention(70, 2, 1, 256, 0, 0.0f, 0, 1, 1, 0);
    /* several blocks of 128 keys / query rows (the warpgroup kernels on Hopper): a window across them, GQA */
    test_attention(300, 4, 2, 128, 130, 0.0f, 0, 1, 1, 0);
    test_attention(260, 6, 2, 64, 0, 30.0f, 0, 1, 1, 0);
    test_attention(257, 2, 2, 128, 0, 0.0f, 0, 0, 0, 0);
    /* fresh gradients: the warpgroup kernels (D 128, 64) with the padding rows set apart, the other flash
     * kernels (D 32), the tiled form (forced, and D 256), and some of the three alone */
    test_attention(300, 4, 2, 128, 130, 0.0f, 0, 1, 1, 7);
    test_attention(260, 6, 2, 64, 0, 30.0f, 0, 1, 1, 5);
    test_attention(130, 4, 2, 32, 0, 0.0f, 0, 1, 1, 7);
    test_attention(100, 6, 2, 64, 0, 0.0f, 16, 0, 0, 2);
    test_attention(70, 2, 1, 256, 0, 0.0f, 0, 1, 1, 7);
    test_gather();
    test_xent(0.37);
    test_xent(0.0);
    test_xent16(3001);
    test_xent16(3000);
    test_optimizer();
    test_optimizer_many();
    test_dropout();
    return pair_close("test_cuda_backward");
}
#endif
