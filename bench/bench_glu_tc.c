/* bench_glu_tc.c - the GLU's training kernels of the cuda backend alone at a model's shape (Llama-3.1-8B's by
 * default: 8,192 rows of 14,336 columns, LoRA rank 16 on gate, up and down), as a checkpointed training step runs
 * them over bf16 gate and up (model.h mlp16):
 *   glu_keep    the run again's GLU with both terms, writing the bf16 keeps of gate and up and the output
 *               (cuda_lora_term.cu k_glu_terms_tc): reads 2, writes 3 values of 2 bytes each
 *   lora_glu    the first run's: the two shrinks x A^T (x bf16 [rows, hidden]), then the GLU with both terms
 *               into a bf16 output alone: reads 2, writes 1 (and the shrinks read x twice)
 *   glu_bwd_dx  the GLU's backward from a bf16 dy with the down projection's LoRA input gradient
 *               (k_glu_bwd_tc): reads 3, writes 2
 *   glu_redo    the plain GLU over bf16 gate and up into bf16 (cuda_keep.cu k_glu_redo, four values a thread):
 *               the bandwidth an elementwise pass of the same bytes as lora_glu's GLU gets
 *   lora_bwd    gate's LoRA backward as the tape runs it (x A^T from the forward, u = s dy B for the input
 *               gradient later): u and dB in one read of the bf16 dy (cuda_lora_udb.cu), then dA over x
 * Each: the mean of REPS back-to-back calls after warm-up, read back once at the end.
 * usage: bench_glu_tc [REPS [ROWS COLUMNS HIDDEN]]   (SiLU; prints one line per op: us/call, GB/s) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/backward.h"
#include "base/half.h"
#include "bench_util.h"

/* the tensors made on the backend, released at the end */
typedef struct pool {
    lmx_backend *be;
    uint64_t rng; /* the random values' xorshift64 state */
    lmx_tensor t[20];
    int n;
} pool;

/* a tensor [rows, cols] of dtype dt in the pool with random values times amp (NULL: failed) */
static lmx_tensor *make(pool *p, lmx_dtype dt, int64_t rows, int64_t cols, float amp) {
    lmx_backend *be = p->be;
    if (p->n == 20) return NULL;
    lmx_tensor *t = &p->t[p->n];
    *t = (lmx_tensor){.dtype = dt, .ndim = 2, .shape = {rows, cols}};
    const size_t n = (size_t)(rows * cols), es = dt == LMX_DTYPE_BF16 ? 2 : 4;
    void *h = malloc(n * es);
    if (!h || be->ops->alloc(be, t)) {
        free(h);
        return NULL;
    }
    p->n++;
    for (size_t i = 0; i < n; i++) {
        const float v = amp * bench_uniform(&p->rng);
        if (es == 2) ((uint16_t *)h)[i] = lmx_f32_to_bf16(v);
        else ((float *)h)[i] = v;
    }
    const lmx_status st = be->ops->write(be, t, 0, h, n * es);
    free(h);
    return st ? NULL : t;
}

/* the seconds of one call of op (0: ok) averaged over reps, after three */
#define TIME_OP(be, probe, reps, secs, call)                                                                          \
    do {                                                                                                              \
        float v_;                                                                                                     \
        for (int r_ = 0; r_ < 3; r_++)                                                                                \
            if ((call) != LMX_OK) goto failed;                                                                        \
        be->ops->read(be, probe, 0, &v_, 4);                                                                          \
        const double t0_ = bench_now_s();                                                                             \
        for (int r_ = 0; r_ < (reps); r_++)                                                                           \
            if ((call) != LMX_OK) goto failed;                                                                        \
        be->ops->read(be, probe, 0, &v_, 4);                                                                          \
        secs = (bench_now_s() - t0_) / (reps);                                                                        \
    } while (0)

int main(int argc, char **argv) {
#ifndef LMX_HAVE_CUDA
    (void)argc, (void)argv;
    printf("built without cuda\n");
    return 0;
#else
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    const int64_t rows = argc > 4 ? atoll(argv[2]) : 8192, N = argc > 4 ? atoll(argv[3]) : 14336,
                  K = argc > 4 ? atoll(argv[4]) : 4096, R = 16, n = rows * N;
    lmx_err err = {0};
    lmx_backend *be = NULL;
    if (lmx_cuda_device_count() == 0 || lmx_cuda_backend_create(&be, &err) != LMX_OK) {
        printf("no usable GPU (%s)\n", err.msg);
        return 0;
    }
    const lmx_backward_ops *bw = &lmx_cuda_backward;
    pool pl = {.be = be, .rng = 88172645463325252ull};
    lmx_tensor *g = make(&pl, LMX_DTYPE_BF16, rows, N, 8.0f), *u = make(&pl, LMX_DTYPE_BF16, rows, N, 8.0f);
    lmx_tensor *gk = make(&pl, LMX_DTYPE_BF16, rows, N, 0), *uk = make(&pl, LMX_DTYPE_BF16, rows, N, 0);
    lmx_tensor *ok = make(&pl, LMX_DTYPE_BF16, rows, N, 0), *dy = make(&pl, LMX_DTYPE_BF16, rows, N, 1.0f);
    lmx_tensor *x = make(&pl, LMX_DTYPE_BF16, rows, K, 2.0f), *xg = make(&pl, LMX_DTYPE_F32, rows, R, 1.0f);
    lmx_tensor *xu = make(&pl, LMX_DTYPE_F32, rows, R, 1.0f), *ut = make(&pl, LMX_DTYPE_F32, rows, R, 1.0f);
    lmx_lora_pair pg = {.scale = 2.0f}, pu = {.scale = 2.0f}, pd = {.scale = 2.0f}; /* gate, up: [R, K], [N, R]; down [R, N] */
    lmx_tensor *t[6] = {make(&pl, LMX_DTYPE_F32, R, K, 0.1f), make(&pl, LMX_DTYPE_F32, N, R, 0.1f),
                        make(&pl, LMX_DTYPE_F32, R, K, 0.1f), make(&pl, LMX_DTYPE_F32, N, R, 0.1f),
                        make(&pl, LMX_DTYPE_F32, R, N, 0.1f), make(&pl, LMX_DTYPE_F32, K, R, 0.1f)};
    lmx_tensor *da = make(&pl, LMX_DTYPE_F32, R, K, 0), *db = make(&pl, LMX_DTYPE_F32, N, R, 0);
    for (int i = 0; i < 6; i++)
        if (!t[i]) goto failed;
    if (!da || !db) goto failed;
    if (!g || !u || !gk || !uk || !ok || !dy || !x || !xg || !xu || !ut) goto failed;
    pg.a = *t[0], pg.b = *t[1], pu.a = *t[2], pu.b = *t[3], pd.a = *t[4], pd.b = *t[5];
    const lmx_lora_term tg = {xg, &pg}, tu = {xu, &pu};
    const lmx_lora_pair *pgs[1] = {&pg}, *pus[1] = {&pu}, *pds[1] = {&pd};
    const double bytes = 2.0 * n;
    lmx_tensor *das[1] = {da}, *dbs[1] = {db};
    double s_keep = 0, s_first = 0, s_bwd = 0, s_plain = 0, s_lora = 0;
    TIME_OP(be, ok, reps, s_keep, bw->glu_keep(be, NULL, g, u, n, LMX_ACT_SILU, gk, uk, ok, &tg, &tu));
    TIME_OP(be, ok, reps, s_first, be->ops->lora_glu(be, ok, g, u, x, 1, (int)rows, pgs, pus, n, LMX_ACT_SILU));
    TIME_OP(be, gk, reps, s_bwd, bw->glu_bwd_dx(be, gk, uk, dy, g, u, n, LMX_ACT_SILU, 1, ut, pds));
    TIME_OP(be, ok, reps, s_plain, bw->glu_redo(be, ok, g, u, n, LMX_ACT_SILU));
    TIME_OP(be, ut, reps, s_lora, bw->lora_bwd(be, NULL, das, dbs, dy, x, 1, (int)rows, pgs, 0, xg, ut));
    printf("shape: %lld rows x %lld columns (hidden %lld), rank %lld, bf16\n", (long long)rows, (long long)N,
           (long long)K, (long long)R);
    printf("%-11s %9s %8s\n", "op", "us/call", "GB/s");
    printf("%-11s %9.1f %8.0f\n", "glu_keep", s_keep * 1e6, 5 * bytes / s_keep * 1e-9);
    printf("%-11s %9.1f %8.0f   (with the shrinks; GB/s of the GLU's bytes)\n", "lora_glu", s_first * 1e6,
           3 * bytes / s_first * 1e-9);
    printf("%-11s %9.1f %8.0f\n", "glu_bwd_dx", s_bwd * 1e6, 5 * bytes / s_bwd * 1e-9);
    printf("%-11s %9.1f %8.0f   (the plain GLU of bf16 values, no terms: reads 2, writes 1)\n", "glu_redo",
           s_plain * 1e6, 3 * bytes / s_plain * 1e-9);
    printf("%-11s %9.1f %8.0f   (GB/s of dy's and x's bytes)\n", "lora_bwd", s_lora * 1e6,
           (bytes + 2.0 * rows * K) / s_lora * 1e-9);
    for (int i = 0; i < pl.n; i++) be->ops->release(be, &pl.t[i]);
    lmx_backend_free(be);
    return 0;
failed:
    printf("failed: %s\n", be->err.msg);
    for (int i = 0; i < pl.n; i++) be->ops->release(be, &pl.t[i]);
    lmx_backend_free(be);
    return 1;
#endif
}
