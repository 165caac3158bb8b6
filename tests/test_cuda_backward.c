/* test_cuda_backward.c - every backward op of the cuda backend (backend/backward.h) and the loss against
 * the cpu backend's (themselves checked against finite differences by test_backward) on random inputs:
 * odd sizes, dense and quantized frozen weights, LoRA segments with a sequence without a pair, padded
 * batches, GQA, sliding windows, soft-capping, attention split into query tiles, repeated gather rows;
 * the optimizer's gradient norm and AdamW update.
 * Each gradient accumulates onto a random start (+= is checked too), or, where the op takes a fresh mask,
 * is written over it (the start ignored).  The ops that read forward values
 * also run on the cuda backend's bf16 keeps of them (keep op) against the cpu on the same values.  What the
 * training forward keeps and adds for backward (keeps written in an op's pass, LoRA terms, redos, offload):
 * test_cuda_keep.c.
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
#include "cuda_tpair.h"

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
        /* into a bf16 dx (the tape's GLU output gradient): written whole from bf16 weights alone, the f32 product
         * rounded give or take one bf16 step; else declined */
        lmx_tensor dx16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {M, K}};
        CHECK(gpu->ops->alloc(gpu, &dx16) == LMX_OK);
        const lmx_status st16 = lmx_cuda_backward.matmul_bwd(gpu, &dx16, &dy.g, &w.g, M, fresh);
        if (dt == LMX_DTYPE_BF16 && !bits && !gtype && fresh) {
            CHECK(st16 == LMX_OK);
            float *f32 = fetch(gpu, &dx.g, (int64_t)M * K), *f16 = fetch16(&dx16, (int64_t)M * K);
            const int64_t bad = off_bf16(f16, f32, (int64_t)M * K);
            CHECK_MSG(bad == 0, "%s: %lld bf16 dx values not the f32 ones rounded", what, (long long)bad);
            free(f32), free(f16);
        } else {
            CHECK_MSG(st16 == LMX_ERR_UNSUPPORTED, "%s: a bf16 dx not declined (status %d)", what, (int)st16);
        }
        gpu->ops->release(gpu, &dx16);
        check_both(what, &dx, tol);
        drop(&dy);
    }
}

/* B = 4 sequences of T rows: pairs p, p, none, q (dA / dB per pair) of rank r, with and without dx; x kept in
 * bf16 (then the products that read it take bf16 operands); with xa, both backends read x A^T as the cuda
 * lora_keep op wrote it, whose output is the lora op's bit for bit.  N a multiple of 512 with a bf16 dy takes
 * cuda_lora_udb's one pass for u and dB. */
static void test_lora(int with_dx, int kept, unsigned fresh, int dy16, int with_xa, int T, int N, int r) {
    const int B = 4, K = 48;
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
 * alone, then lora_dx adding every u A in one product (fresh: written; past eight terms, several), against the
 * cpu's lora_bwd adding each pair's dx; ranks 8, 16, 8, ... (the products side by side), x bf16 as the tape keeps it */
#define DX_TERMS 10
static void test_lora_dx(int count, unsigned fresh) {
    const int B = 2, T = 37, K = 96, rows = B * T, ranks[3] = {8, 16, 8}, Ns[3] = {96, 40, 40};
    tpair x = rand_in(rows, K, 1.0f, 1), dx = rand_both(rows, K, 0.1f);
    if (fresh) poison(&dx);
    tpair a[DX_TERMS], b[DX_TERMS], da[DX_TERMS], db[DX_TERMS], dy[DX_TERMS];
    lmx_lora_pair pg[DX_TERMS], pc[DX_TERMS];
    lmx_tensor u[DX_TERMS];
    const lmx_lora_pair *pgs[DX_TERMS];
    for (int i = 0; i < count; i++) {
        const int r = ranks[i % 3], N = Ns[i % 3];
        a[i] = rand_both(r, K, 0.3f), b[i] = rand_both(N, r, 0.3f);
        da[i] = rand_both(r, K, 0.1f), db[i] = rand_both(N, r, 0.1f);
        dy[i] = rand_in(rows, N, 1.0f, 1);
        pg[i] = (lmx_lora_pair){a[i].g, b[i].g, 0.5f + i % 3}, pc[i] = (lmx_lora_pair){a[i].c, b[i].c, 0.5f + i % 3};
        const lmx_lora_pair *gp[2] = {&pg[i], &pg[i]}, *cp[2] = {&pc[i], &pc[i]};
        lmx_tensor *dag[2] = {&da[i].g, &da[i].g}, *dbg[2] = {&db[i].g, &db[i].g};
        lmx_tensor *dac[2] = {&da[i].c, &da[i].c}, *dbc[2] = {&db[i].c, &db[i].c};
        u[i] = act(gpu, rows, r, NULL);
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
        /* from bf16 keeps of gate and up, and the same written over those keeps (the tape's, where the GLU is their
         * last reader): the same bits */
        lmx_tensor gk = {0}, uk = {0};
        CHECK(lmx_cuda_backward.keep(gpu, &gk, &g.g) == LMX_OK && lmx_cuda_backward.keep(gpu, &uk, &u.g) == LMX_OK);
        CHECK(gk.dtype == LMX_DTYPE_BF16);
        CHECK(lmx_cuda_backward.glu_bwd(gpu, &dg16, &du16, &dy.g, &gk, &uk, n, a, 3) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_bwd(gpu, &gk, &uk, &dy.g, &gk, &uk, n, a, 3) == LMX_OK);
        uint16_t *ig = malloc((size_t)n * 2), *iu = malloc((size_t)n * 2);
        CHECK(gpu->ops->read(gpu, &dg16, 0, hg, (size_t)n * 2) == LMX_OK && gpu->ops->read(gpu, &du16, 0, hu, (size_t)n * 2) == LMX_OK);
        CHECK(gpu->ops->read(gpu, &gk, 0, ig, (size_t)n * 2) == LMX_OK && gpu->ops->read(gpu, &uk, 0, iu, (size_t)n * 2) == LMX_OK);
        bad = 0;
        for (int64_t i = 0; i < n; i++) bad += hg[i] != ig[i] || hu[i] != iu[i];
        CHECK_MSG(bad == 0, "glu backward (act %d) over its own keeps: %lld gradients differ", act_i, (long long)bad);
        free(ig), free(iu);
        gpu->ops->release(gpu, &gk), gpu->ops->release(gpu, &uk);
        /* dy in bf16 (the down projection's input gradient, which the tape may keep so): the same bits as from
         * its values in f32, into f32 and into bf16 gradients */
        lmx_tensor dyk = {0};
        CHECK(lmx_cuda_backward.keep(gpu, &dyk, &dy.g) == LMX_OK);
        float *dyv = fetch16(&dyk, n);
        lmx_tensor dyw = act(gpu, 1, n, dyv);
        for (int o16 = 0; o16 < 2; o16++) {
            lmx_tensor *pg = o16 ? &dg16 : &dg.g, *pu = o16 ? &du16 : &du.g;
            const size_t es = o16 ? 2 : 4;
            char *w1 = malloc((size_t)n * es * 2), *w2 = malloc((size_t)n * es * 2);
            CHECK(lmx_cuda_backward.glu_bwd(gpu, pg, pu, &dyw, &g.g, &u.g, n, a, 3) == LMX_OK);
            CHECK(gpu->ops->read(gpu, pg, 0, w1, (size_t)n * es) == LMX_OK && gpu->ops->read(gpu, pu, 0, w1 + n * es, (size_t)n * es) == LMX_OK);
            CHECK(lmx_cuda_backward.glu_bwd(gpu, pg, pu, &dyk, &g.g, &u.g, n, a, 3) == LMX_OK);
            CHECK(gpu->ops->read(gpu, pg, 0, w2, (size_t)n * es) == LMX_OK && gpu->ops->read(gpu, pu, 0, w2 + n * es, (size_t)n * es) == LMX_OK);
            CHECK_MSG(!memcmp(w1, w2, (size_t)n * es * 2), "glu backward (act %d, %s gradients): a bf16 dy not its f32 values'",
                      act_i, o16 ? "bf16" : "f32");
            free(w1), free(w2);
        }
        gpu->ops->release(gpu, &dyk), gpu->ops->release(gpu, &dyw);
        free(dyv);
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
    test_lora(1, 0, 0, 0, 0, 5, 40, 8);
    test_lora(0, 0, 0, 0, 0, 5, 40, 8);
    test_lora(1, 1, 1, 1, 1, 77, 1024, 16); /* u and dB in one pass: segments of 154 and 77 rows */
    test_lora(1, 0, 0, 1, 0, 40, 512, 8);
    test_lora(0, 1, 0, 1, 1, 300, 2048, 16); /* several chunks of rows */
    test_lora(1, 1, 0, 0, 0, 5, 40, 8);
    test_lora(1, 0, 1, 0, 0, 5, 40, 8); /* dx written: its rows of the sequence without a pair are zeros */
    test_lora(1, 1, 1, 0, 0, 5, 40, 8);
    test_lora(1, 1, 1, 1, 0, 5, 40, 8); /* dy as the tape's bf16 copy too */
    test_lora(1, 0, 0, 1, 0, 5, 40, 8); /* an f32 x (dropout's copy) beside it */
    test_lora(1, 1, 1, 1, 1, 5, 40, 8); /* x A^T from the forward (lora_keep), as the tape runs it */
    test_lora(0, 0, 0, 0, 1, 5, 40, 8);
    test_lora_dx(1, 0);
    test_lora_dx(3, 1);
    test_lora_dx(2, 0);
    test_lora_dx(DX_TERMS, 1);
    test_elementwise(0, 1001);
    test_elementwise(1, 1001);
    test_elementwise(0, 1024); /* four values a thread */
    test_elementwise(1, 1024);
    test_glu_bwd16();
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
