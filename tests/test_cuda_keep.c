/* test_cuda_keep.c - what the cuda backend's training forward keeps and adds for backward (backend/backward.h)
 * against the cpu backend: the ops that write their keeps in their own pass (glu_keep, rmsnorm_keep), the LoRA
 * expands left to the op that reads the projection (lmx_lora_term: glu_keep, lora_add, the lora_glu and
 * lora_add ops, on tensor cores where the kernels take them), the down projection's LoRA input gradient in the
 * GLU's backward (glu_bwd_dx), the values computed again in backward (glu_redo, rmsnorm_redo), and keeps
 * through host memory (restore, offload, reload).  Exits 77 (skipped) when lmx is built without CUDA or no GPU
 * is present. */
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
        if (act_i) { /* no output but its keep: the same keep, gate left as it was */
            lmx_tensor g2 = act(gpu, 1, n, gv);
            CHECK(gpu->ops->write(gpu, &ok, 0, hg, (size_t)n * 2) == LMX_OK); /* other bits first */
            CHECK(lmx_cuda_backward.glu_keep(gpu, NULL, &g2, &u.g, n, a, &gk, &uk, &ok, NULL, NULL) == LMX_OK);
            uint16_t *h2 = malloc((size_t)n * 2);
            float *g2v = fetch(gpu, &g2, n);
            CHECK(gpu->ops->read(gpu, &ok, 0, h2, (size_t)n * 2) == LMX_OK);
            CHECK_MSG(!memcmp(h2, ho, (size_t)n * 2) && !memcmp(g2v, gv, (size_t)n * 4),
                      "glu_keep without output: its keep differs, or gate was written");
            CHECK(lmx_cuda_backward.glu_keep(gpu, NULL, &g2, &u.g, n, a, &gk, &uk, NULL, NULL, NULL) == LMX_ERR_INVALID_ARG);
            free(h2), free(g2v);
            gpu->ops->release(gpu, &g2);
        }
        check_both(act_i ? "glu_keep output (gelu)" : "glu_keep output (silu)", &g, act_i ? 1e-4 : 1e-5);
        drop(&u);
        gpu->ops->release(gpu, &gk), gpu->ops->release(gpu, &uk), gpu->ops->release(gpu, &ok);
        free(o1), free(o2), free(hg), free(hu), free(ho), free(gv), free(uv);
    }
}

/* a bf16 keep [n] against the cpu's f32 values (relative L2) */
static void compare_keep(const char *what, const lmx_tensor *k, const lmx_tensor *ref, int64_t n) {
    float *w = fetch16(k, n), *c = fetch(cpu, ref, n);
    const double e = rel_err(w, c, n);
    CHECK_MSG(e < 5e-3, "%s: relative error %.3g", what, e);
    free(w), free(c);
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
    for (int v = 0; v < 4; v++) { /* glu_keep: which 1 gate's term, 2 up's, 3 both; with v >> 1 no output but ok */
        const int act_i = v & 1, no_out = v >> 1;
        const lmx_act ac = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
        tpair g = rand_both(rows, N, 3.0f), u = rand_both(rows, N, 2.0f);
        lmx_tensor gk = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}}, uk = gk, ok = gk;
        CHECK(gpu->ops->alloc(gpu, &gk) == LMX_OK && gpu->ops->alloc(gpu, &uk) == LMX_OK && gpu->ops->alloc(gpu, &ok) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_keep(gpu, no_out ? NULL : &g.g, &g.g, &u.g, n, ac, &gk, &uk, &ok, which & 1 ? &tg : NULL,
                                         which & 2 ? &tu : NULL) == LMX_OK);
        if (which & 1) CHECK(cpu->ops->lora(cpu, &g.c, &x.c, 1, rows, &pc0) == LMX_OK);
        if (which & 2) CHECK(cpu->ops->lora(cpu, &u.c, &x.c, 1, rows, &pc1) == LMX_OK);
        snprintf(what, sizeof what, "glu_keep with terms (rank %d, terms %d, act %d%s): ", r, which, act_i,
                 no_out ? ", no output" : "");
        char w2[128];
        snprintf(w2, sizeof w2, "%sgate's keep", what), compare_keep(w2, &gk, &g.c, n);
        snprintf(w2, sizeof w2, "%sup's keep", what), compare_keep(w2, &uk, &u.c, n);
        CHECK(cpu->ops->glu(cpu, &g.c, &g.c, &u.c, n, ac) == LMX_OK);
        snprintf(w2, sizeof w2, "%sout's keep", what), compare_keep(w2, &ok, &g.c, n);
        if (no_out) drop(&g);
        else snprintf(w2, sizeof w2, "%soutput", what), check_both(w2, &g, 2e-3);
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

/* glu_bwd_dx: the GLU's bf16 gradients from dy (f32, or with dy16 bf16: the tape's GLU output gradient) plus the
 * down projection's LoRA input gradient u A, against the cpu's lora_dx into dy, then its glu_bwd; columns not a
 * multiple of 32 are declined (LMX_ERR_UNSUPPORTED) */
static void test_glu_bwd_dx(int r, int N, int rows, int act_i, int dy16) {
    const int64_t n = (int64_t)rows * N;
    const lmx_act ac = act_i ? LMX_ACT_GELU_TANH : LMX_ACT_SILU;
    tpair g = rand_in(rows, N, 3.0f, 1), u = rand_in(rows, N, 2.0f, 1), dy = rand_in(rows, N, 1.0f, dy16);
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
        snprintf(what, sizeof what, "glu_bwd_dx (rank %d, %d x %d, act %d, bf16 dy %d): dgate", r, rows, N, act_i, dy16);
        compare_keep(what, &dg16, &dg.c, n);
        snprintf(what, sizeof what, "glu_bwd_dx (rank %d, %d x %d, act %d, bf16 dy %d): dup", r, rows, N, act_i, dy16);
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
            CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)l * n * 2, &x, 0) == LMX_OK);
        }
        const int order[] = {4, 3, 2, 1, 0, 2, 2, 4, 0, 3, 1};
        const int ahead[] = {3, 2, 1, 0, -1, -1, 4, -1, 3, 1, -1};
        for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++) {
            const int l = order[i];
            if (i == 9) { /* block 3, fetched ahead by the reload before, gets new values first */
                for (int64_t j = 0; j < n; j++) v[3 * n + j] = -v[3 * n + j] * 0.5f;
                CHECK(gpu->ops->write(gpu, &x, 0, v + 3 * n, (size_t)n * 4) == LMX_OK);
                CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)3 * n * 2, &x, 0) == LMX_OK);
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

/* spread offloads (train.c's gate / up products): large blocks whose copies to the host go a share with each
 * offload after them, between ordinary ones, from one device buffer rewritten between offloads.  A third spread
 * block while two are still being sent takes the stage of the one with less left (sent whole first); reloads
 * send whatever is left first.  Reloaded last to first with the next fetched ahead: each the values rounded to
 * bf16, bit for bit. */
static void test_offload_spread(void) {
    const int64_t big = 4096 * 1031, small = 9 * 301; /* 8 MB a large block in bf16: four 2 MiB shares and a rest */
    const int64_t n[7] = {big, small, big, big, small, small, small};
    const int spread[7] = {5, 0, 5, 3, 0, 0, 0}; /* the third large block while both others are being sent */
    int64_t at[8] = {0};
    for (int i = 0; i < 7; i++) at[i + 1] = at[i] + n[i];
    float *v = rand_vec(at[7], 25.0f);
    char *host = gpu->ops->host_alloc(gpu, (size_t)at[7] * 2);
    lmx_tensor x = act(gpu, 1, big, NULL);
    CHECK(host != NULL);
    for (int i = 0; i < 7 && host; i++) {
        lmx_tensor xi = x;
        xi.shape[1] = n[i];
        CHECK(gpu->ops->write(gpu, &xi, 0, v + at[i], (size_t)n[i] * 4) == LMX_OK);
        CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)at[i] * 2, &xi, spread[i]) == LMX_OK);
    }
    for (int i = 6; i >= 0 && host; i--) {
        lmx_tensor back = act(gpu, 1, n[i], NULL);
        const char *next = i > 0 && n[i - 1] == n[i] ? host + (size_t)at[i - 1] * 2 : NULL;
        CHECK(lmx_cuda_backward.reload(gpu, &back, host + (size_t)at[i] * 2, n[i], next) == LMX_OK);
        float *got = fetch(gpu, &back, n[i]);
        int64_t bad = 0;
        for (int64_t j = 0; j < n[i]; j++) bad += got[j] != lmx_bf16_to_f32(lmx_f32_to_bf16(v[at[i] + j]));
        CHECK_MSG(bad == 0, "spread offload: block %d (%lld values, spread %d): %lld values not the offloaded ones rounded",
                  i, (long long)n[i], spread[i], (long long)bad);
        free(got);
        gpu->ops->release(gpu, &back);
    }
    gpu->ops->release(gpu, &x);
    if (host) gpu->ops->host_free(gpu, host);
    free(v);
}

/* offload / reload of several kinds of block interleaved, as a checkpointed step with replay has them (a
 * layer's input, attention output and hidden state; train.c): three blocks a layer, the middle one wider and
 * reloaded into a bf16 tensor (copied as it is into one a row longer in the first step; in the second, of the
 * block's size, it takes the stage's memory), reloaded from the last layer down, kind by kind, each
 * fetching its kind's block of the layer below ahead; two steps, the second offloading new values over the
 * stages the first left, and its last layer's blocks never offloaded (train.c keeps them on the device):
 * only their fetches of the layer below (reload of no dst).  Each the values rounded to bf16, bit for bit. */
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
        const int top = step ? L - 1 : L; /* the layers below it offloaded */
        for (int l = 0; l < top; l++)
            for (int k = 0; k < K; k++) {
                lmx_tensor x = act(gpu, rows, cols[k], v + l * per + off[k]);
                CHECK(lmx_cuda_backward.offload(gpu, host + (size_t)(l * per + off[k]) * 2, &x, 0) == LMX_OK);
                gpu->ops->release(gpu, &x);
            }
        for (int l = L - 1; l >= 0; l--)
            for (int k = 0; k < K; k++) {
                const int64_t n = rows * cols[k];
                const char *next = l > 0 ? host + (size_t)((l - 1) * per + off[k]) * 2 : NULL;
                if (l == top) {
                    CHECK(lmx_cuda_backward.reload(gpu, NULL, NULL, n, next) == LMX_OK);
                    continue;
                }
                lmx_tensor back = k == 1 ? (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows + !step, cols[k]}}
                                         : act(gpu, rows, cols[k], NULL); /* bf16 of the block's size: the stage's memory taken */
                if (k == 1) CHECK(gpu->ops->alloc(gpu, &back) == LMX_OK);
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

/* Training's bf16 gate and up (model.h mlp16): glu_keep (with no term, gate's, both), the glu op (into f32 and
 * bf16) and the lora_glu op over bf16 gate and up write what they write over the same values in f32, bit for
 * bit (terms of a rank the kernels do not take: added to f32 copies by GEMMs, as the f32 path adds them in
 * place); the matmul op's bf16 output is its f32 output rounded, give or take one bf16 step. */
static void test_mlp16(int r, int N, int rows) {
    const int K = 40;
    const int64_t n = (int64_t)rows * N;
    const lmx_act ac = LMX_ACT_SILU;
    tpair g16 = rand_in(rows, N, 3.0f, 1), u16 = rand_in(rows, N, 2.0f, 1); /* the gpu's bf16, the cpu's f32 */
    float *gv = fetch(cpu, &g16.c, n), *uv = fetch(cpu, &u16.c, n);
    lmx_tensor gf = act(gpu, rows, N, gv), uf = act(gpu, rows, N, uv);
    tpair x = rand_both(rows, K, 1.0f), a[2], b[2];
    lmx_lora_pair pg[2];
    lmx_tensor xa[2] = {act(gpu, rows, r, NULL), act(gpu, rows, r, NULL)};
    for (int i = 0; i < 2; i++) {
        a[i] = rand_both(r, K, 0.3f), b[i] = rand_both(N, r, 0.3f);
        pg[i] = (lmx_lora_pair){a[i].g, b[i].g, 0.5f + i};
        const lmx_lora_pair *one = &pg[i];
        CHECK(lmx_cuda_backward.lora_keep(gpu, NULL, &x.g, 1, rows, &one, &xa[i]) == LMX_OK);
    }
    const lmx_lora_term tg = {&xa[0], &pg[0]}, tu = {&xa[1], &pg[1]};
    char what[96];
    for (int v = 0; v < 3; v++) { /* glu_keep: 0 no term, 1 gate's, 2 both */
        lmx_tensor k[2][3];
        for (int j = 0; j < 6; j++) {
            k[j / 3][j % 3] = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}};
            CHECK(gpu->ops->alloc(gpu, &k[j / 3][j % 3]) == LMX_OK);
        }
        const lmx_lora_term *t0 = v ? &tg : NULL, *t1 = v == 2 ? &tu : NULL;
        CHECK(lmx_cuda_backward.glu_keep(gpu, NULL, &g16.g, &u16.g, n, ac, &k[1][0], &k[1][1], &k[1][2], t0, t1) == LMX_OK);
        CHECK(gpu->ops->write(gpu, &gf, 0, gv, (size_t)n * 4) == LMX_OK && gpu->ops->write(gpu, &uf, 0, uv, (size_t)n * 4) == LMX_OK);
        CHECK(lmx_cuda_backward.glu_keep(gpu, NULL, &gf, &uf, n, ac, &k[0][0], &k[0][1], &k[0][2], t0, t1) == LMX_OK);
        for (int j = 0; j < 3; j++) {
            float *k0 = fetch16(&k[0][j], n), *k1 = fetch16(&k[1][j], n);
            snprintf(what, sizeof what, "glu_keep of bf16 gate and up (rank %d, N %d, terms %d): keep %d", r, N, v, j);
            CHECK_MSG(!memcmp(k0, k1, (size_t)n * 4), "%s differs from the f32 inputs'", what);
            free(k0), free(k1);
        }
        for (int j = 0; j < 6; j++) gpu->ops->release(gpu, &k[j / 3][j % 3]);
    }
    { /* the glu op into f32 and into bf16, and the lora_glu op (a prompt's: one pair a projection) */
        lmx_tensor o[2] = {act(gpu, rows, N, NULL), act(gpu, rows, N, NULL)}, h[2];
        for (int i = 0; i < 2; i++) {
            h[i] = (lmx_tensor){.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}};
            CHECK(gpu->ops->alloc(gpu, &h[i]) == LMX_OK);
        }
        for (int op = 0; op < 3; op++) {
            CHECK(gpu->ops->write(gpu, &gf, 0, gv, (size_t)n * 4) == LMX_OK && gpu->ops->write(gpu, &uf, 0, uv, (size_t)n * 4) == LMX_OK);
            for (int i = 0; i < 2; i++) {
                lmx_tensor *gi = i ? &g16.g : &gf, *ui = i ? &u16.g : &uf;
                const lmx_lora_pair *p0 = &pg[0], *p1 = &pg[1];
                CHECK((op < 2 ? gpu->ops->glu(gpu, op ? &h[i] : &o[i], gi, ui, n, ac)
                              : gpu->ops->lora_glu(gpu, &h[i], gi, ui, &x.g, 1, rows, &p0, &p1, n, ac)) == LMX_OK);
            }
            float *w0 = op ? fetch16(&h[0], n) : fetch(gpu, &o[0], n), *w1 = op ? fetch16(&h[1], n) : fetch(gpu, &o[1], n);
            CHECK_MSG(!memcmp(w0, w1, (size_t)n * 4), "the %s op over bf16 gate and up (rank %d, N %d) differs from "
                      "over f32", op == 0 ? "glu (f32 out)" : op == 1 ? "glu (bf16 out)" : "lora_glu", r, N);
            free(w0), free(w1);
        }
        const lmx_lora_pair *p0 = &pg[0]; /* its expand goes to the GLU: the lora op into bf16 is refused */
        CHECK_MSG(gpu->ops->lora(gpu, &h[0], &x.g, 1, rows, &p0) == LMX_ERR_UNSUPPORTED, "the lora op into bf16 ran");
        lmx_err_clear(&gpu->err);
        for (int i = 0; i < 2; i++) gpu->ops->release(gpu, &o[i]), gpu->ops->release(gpu, &h[i]);
        wpair w = make_weight(LMX_DTYPE_BF16, 0, 0, 0, N, K);
        tpair xk = rand_in(rows, K, 1.0f, 1);
        lmx_tensor y = act(gpu, rows, N, NULL), y16 = {.dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {rows, N}};
        CHECK(gpu->ops->alloc(gpu, &y16) == LMX_OK);
        CHECK(gpu->ops->matmul(gpu, &y, &xk.g, &w.g, NULL, rows) == LMX_OK);
        CHECK(gpu->ops->matmul(gpu, &y16, &xk.g, &w.g, NULL, rows) == LMX_OK);
        float *yf = fetch(gpu, &y, n), *yh = fetch16(&y16, n);
        const int64_t off = off_bf16(yh, yf, n);
        CHECK_MSG(off == 0, "matmul into bf16 (N %d, %d rows): %lld values not the f32 output rounded", N, rows, (long long)off);
        free(yf), free(yh);
        gpu->ops->release(gpu, &y), gpu->ops->release(gpu, &y16);
        drop(&xk);
    }
    for (int i = 0; i < 2; i++) drop(&a[i]), drop(&b[i]), gpu->ops->release(gpu, &xa[i]);
    drop(&x), drop(&g16), drop(&u16);
    gpu->ops->release(gpu, &gf), gpu->ops->release(gpu, &uf);
    free(gv), free(uv);
}

int main(void) {
    const int skip = pair_open();
    if (skip) return skip;
    for (int dy16 = 0; dy16 < 2; dy16++) {
        test_glu_bwd_dx(16, 320, 67, 0, dy16);
        test_glu_bwd_dx(8, 64, 300, 1, dy16);
        test_glu_bwd_dx(16, 300, 20, 0, dy16);
    }
    test_glu_keep();
    test_lora_terms(16, 3, 300, 67);
    test_lora_terms(16, 3, 301, 67); /* odd columns: the GLU's kernel a value at a time */
    test_lora_terms(8, 1, 300, 67);
    test_lora_terms(32, 2, 300, 67);
    test_lora_terms(12, 3, 300, 67); /* not a kernel's rank: the GEMMs first */
    test_lora_terms(16, 3, 320, 67); /* the GLU's tensor-core kernel: a block's columns in part, rows in part */
    test_lora_terms(8, 1, 64, 300);  /* three blocks of rows */
    test_lora_terms(16, 2, 512, 261);
    test_mlp16(16, 320, 67);  /* the tensor-core kernel */
    test_mlp16(8, 300, 67);   /* the kernel a value at a time */
    test_mlp16(32, 256, 100);
    test_mlp16(12, 256, 67);  /* not a kernel's rank: the GEMMs into f32 copies */
    test_rmsnorm_keep();
    test_redo();
    test_restore();
    test_offload();
    test_offload_spread();
    test_offload_kinds();
    return pair_close("test_cuda_keep");
}
#endif
