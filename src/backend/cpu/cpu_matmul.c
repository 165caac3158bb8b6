/* cpu_matmul.c - out[M, N] = x[M, K] @ w[N, K]^T (+ bias) on the cpu.
 *
 * Few rows (decode, small batches): the SIMD kernels stream each weight row once, split over
 * the thread pool by output rows (GGUF blocks: lmx_ggml_matvec over the task's rows, once per x
 * row; MLX-quantized: the fused dequantizing kernel).  Many rows (prefill), on AVX-512 CPUs: lmx's
 * own GEMM (gemm.h) on lmx's pool: x is packed once, each task dequantizes (or widens) its tile of
 * weight rows once, straight into the packed layout where it can, and multiplies it with every x
 * row; conversion costs O(N*K) next to the O(M*N*K) product, and no second thread pool competes
 * for the cores.  Without AVX-512: blocks of rows are widened to float32 by the pool and
 * multiplied with OpenBLAS sgemm. */
#include <cblas.h>
#include <string.h>

#include "cpu_backend.h"
#include "gemm.h"

#define BLAS_BLOCK_BYTES (8u << 20)  /* widened weight block for one sgemm call */
#define ROWS_PER_TASK_MIN 16

typedef struct matmul_job {
    const cpu_backend *cb;
    const float *x;
    const lmx_tensor *w;
    float *y;
    int M;
    int64_t K, N, n_begin, rows_per_task;
    float *widened;                  /* BLAS path: destination of widened rows */
    float *xp;                       /* GEMM path: packed x, then one weight tile per thread */
    size_t tile_floats;              /* GEMM path: floats per thread (packed tile + one row) */
    const void *prep;                /* few rows: x as cpu_matvec_prep made it (MLX: per-group sums; GGUF, where
                                        lmx_ggml_xq_takes: its integer form) */
} matmul_job;

static lmx_matmul_rows_fn kernel_for(const cpu_backend *cb, lmx_dtype t) {
    switch (t) {
    case LMX_DTYPE_F32: return cb->k.matmul_f32;
    case LMX_DTYPE_BF16: return cb->k.matmul_bf16;
    case LMX_DTYPE_F16: return cb->k.matmul_f16;
    default: return NULL;
    }
}

int cpu_matmul_takes(const cpu_backend *cb, const lmx_tensor *w) {
    return w->q.bits || w->q.ggml_type || kernel_for(cb, w->dtype);
}

size_t cpu_matvec_prep_bytes(const cpu_backend *cb, const lmx_tensor *w, int M) {
    const int64_t K = w->shape[1];
    if (w->q.bits) return (size_t)M * (size_t)(K / w->q.group) * sizeof(float);
    if (w->q.ggml_type && lmx_ggml_xq_takes(cb->k.ggml_simd, w->q.ggml_type, K)) return (size_t)M * lmx_ggml_xq_bytes(K);
    return 0;
}

void cpu_matvec_prep(const cpu_backend *cb, const lmx_tensor *w, const float *x, int M, void *prep) {
    const int64_t K = w->shape[1];
    if (w->q.bits) {
        const int64_t G = K / w->q.group;
        for (int m = 0; m < M; m++) lmx_quant_xsum(x + m * K, K, w->q.group, (float *)prep + m * G);
    } else if (w->q.ggml_type && lmx_ggml_xq_takes(cb->k.ggml_simd, w->q.ggml_type, K)) {
        const size_t xb = lmx_ggml_xq_bytes(K);
        for (int m = 0; m < M; m++) lmx_ggml_xq_prepare(w->q.ggml_type, x + m * K, K, (char *)prep + m * xb);
    }
}

void cpu_matvec_rows(const cpu_backend *cb, const lmx_tensor *w, const float *x, const void *prep, int M, int64_t n0,
                     int64_t n1, float *y, int64_t ldy) {
    const int64_t K = w->shape[1];
    if (w->q.ggml_type && prep) { /* GGUF Q4_K / Q5_K / Q6_K: x prepared once for every task */
        const size_t xb = lmx_ggml_xq_bytes(K);
        for (int m = 0; m < M; m++)
            lmx_ggml_matvec_xq(w->q.ggml_type, w->data, K, n0, n1, (const char *)prep + m * xb, y + m * ldy + n0);
        return;
    }
    if (w->q.ggml_type) { /* GGUF blocks: fused dots of the task's rows, per x row */
        for (int m = 0; m < M; m++)
            lmx_ggml_matvec(cb->k.ggml_simd, w->q.ggml_type, w->data, K, n0, n1, x + m * K, y + m * ldy + n0);
        return;
    }
    if (w->q.bits) {
        const int64_t G = K / w->q.group;
        for (int m = 0; m < M; m++) cb->qmatvec(x + m * K, (const float *)prep + m * G, w, n0, n1, y + m * ldy);
        return;
    }
    kernel_for(cb, w->dtype)(x, K, M, K, w->data, n0, n1, y, ldy);
}

static void matmul_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    int64_t n0 = j->n_begin + (int64_t)task * j->rows_per_task;
    int64_t n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    if (n0 >= n1) return;
    cpu_matvec_rows(j->cb, j->w, j->x, j->prep, j->M, n0, n1, j->y, j->N);
}

static void widen_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    int64_t n0 = j->n_begin + (int64_t)task * j->rows_per_task;
    int64_t n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    for (int64_t n = n0; n < n1; n++)
        cpu_row_to_f32(j->cb, j->widened + (n - j->n_begin) * j->K, j->w, n, j->K);
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* ---- own GEMM (AVX-512): each task dequantizes its tile of weight rows once, then multiplies it
 * with every x row (gemm.h).  Runs on the lmx pool only. ------------------------------------------ */
#define GEMM_TILE_BYTES (384u << 10) /* a task's packed weight tile (stays in L2) */

static void pack_x_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    lmx_gemm_pack_x_avx512(j->x, j->K, j->M, j->K, task, task + 1, j->xp);
}

static void gemm_task(void *arg, int task, int thread) {
    const matmul_job *j = arg;
    int64_t n0 = (int64_t)task * j->rows_per_task, n1 = n0 + j->rows_per_task;
    if (n1 > j->N) n1 = j->N;
    if (n0 >= n1) return;
    int nt = (int)(n1 - n0);
    float *wp = j->xp + lmx_gemm_xpack_floats(j->M, j->K) + (size_t)thread * j->tile_floats;
    float *row = wp + lmx_gemm_wpack_floats(nt, j->K);
    int type = j->w->q.ggml_type;
    size_t rb = type ? lmx_ggml_row_bytes(type, j->K) : 0;
    for (int r = 0; r < nt; r++) {
        int64_t cs;
        float *slot = lmx_gemm_w_row_slot(wp, j->K, r, nt, &cs);
        /* GGUF blocks dequantize straight into the packed tile; other weights go through a row */
        if (type && lmx_ggml_is_supported_quant(type) &&
            lmx_ggml_dequant_chunks_avx512(type, (const char *)j->w->data + (size_t)(n0 + r) * rb, j->K, slot, cs))
            continue;
        cpu_row_to_f32(j->cb, row, j->w, n0 + r, j->K);
        lmx_gemm_pack_w_row_avx512(row, j->K, r, nt, wp);
    }
    lmx_gemm_run_avx512(j->xp, j->M, j->K, wp, nt, j->y + n0, j->N);
}

static lmx_status matmul_gemm(cpu_backend *cb, matmul_job *j) {
    int threads = lmx_pool_size(cb->pool);
    int64_t rows = GEMM_TILE_BYTES / (lmx_gemm_kpad(j->K) * 4) / LMX_GEMM_NR * LMX_GEMM_NR;
    if (rows < LMX_GEMM_NR) rows = LMX_GEMM_NR;
    /* at least 4 tasks per thread where the matrix allows, for balance */
    int64_t balanced = ceil_div(ceil_div(j->N, 4 * threads), LMX_GEMM_NR) * LMX_GEMM_NR;
    if (balanced < rows) rows = balanced;
    j->rows_per_task = rows;
    j->tile_floats = lmx_gemm_wpack_floats((int)rows, j->K) + (size_t)j->K + 16;
    size_t total = lmx_gemm_xpack_floats(j->M, j->K) + (size_t)threads * j->tile_floats;
    j->xp = cpu_scratch(cb, 1, total);
    if (!j->xp) return lmx_err_prefix(&cb->base.err, "matmul");
    lmx_pool_run(cb->pool, (j->M + 15) / 16, pack_x_task, j);
    lmx_pool_run(cb->pool, (int)ceil_div(j->N, rows), gemm_task, j);
    return LMX_OK;
}

void cpu_widen_rows(cpu_backend *cb, const lmx_tensor *w, int64_t n0, int64_t nb, float *dst) {
    const int threads = lmx_pool_size(cb->pool);
    matmul_job j = {.cb = cb, .w = w, .K = w->shape[1], .N = n0 + nb, .n_begin = n0, .widened = dst,
                    .rows_per_task = ceil_div(nb, threads)}; /* widen_task clips to [n_begin, N) */
    if (nb <= 1 || threads <= 1) {
        for (int64_t n = n0; n < n0 + nb; n++) cpu_row_to_f32(cb, dst + (n - n0) * j.K, w, n, j.K);
        return;
    }
    lmx_pool_run(cb->pool, threads, widen_task, &j);
}

static lmx_status matmul_blas(cpu_backend *cb, matmul_job *j) {
    if (j->w->dtype == LMX_DTYPE_F32 && ((uintptr_t)j->w->data & 3) == 0) { /* else widened: any address */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, (int)j->N, (int)j->K, 1.0f,
                    j->x, (int)j->K, j->w->data, (int)j->K, 0.0f, j->y, (int)j->N);
        return LMX_OK;
    }
    int64_t block = BLAS_BLOCK_BYTES / (j->K * 4);
    if (block < 16) block = 16;
    if (block > j->N) block = j->N;
    j->widened = cpu_scratch(cb, 1, (size_t)(block * j->K));
    if (!j->widened) return lmx_err_prefix(&cb->base.err, "matmul");
    for (int64_t n0 = 0; n0 < j->N; n0 += block) {
        int64_t nb = j->N - n0 < block ? j->N - n0 : block;
        cpu_widen_rows(cb, j->w, n0, nb, j->widened);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, j->M, (int)nb, (int)j->K, 1.0f, j->x,
                    (int)j->K, j->widened, (int)j->K, 0.0f, j->y + n0, (int)j->N);
    }
    return LMX_OK;
}

lmx_status cpu_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                      const lmx_tensor *bias, int M) {
    cpu_backend *cb = (cpu_backend *)be;
    int64_t N = w->shape[0], K = w->shape[1];
    if (!cpu_matmul_takes(cb, w))
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cpu: matmul on %s weights",
                           lmx_dtype_name(w->dtype));
    matmul_job j = {.cb = cb, .x = x->data, .w = w, .y = out->data, .M = M, .K = K, .N = N};
    const size_t pb = M < CPU_MATVEC_ROWS ? cpu_matvec_prep_bytes(cb, w, M) : 0;
    if (pb) { /* x's form once, not a task */
        void *prep = cpu_scratch(cb, 2, (pb + sizeof(float) - 1) / sizeof(float));
        if (!prep) return lmx_err_prefix(&be->err, "matmul");
        cpu_matvec_prep(cb, w, j.x, M, prep);
        j.prep = prep;
    }
    if (M >= CPU_MATVEC_ROWS && !strcmp(cb->k.isa, "avx512")) {
        lmx_status st = matmul_gemm(cb, &j);
        if (st != LMX_OK) return st;
    } else if (M >= CPU_MATVEC_ROWS) {
        lmx_status st = matmul_blas(cb, &j);
        if (st != LMX_OK) return st;
    } else {
        int threads = lmx_pool_size(cb->pool);
        int64_t tasks = threads * 8;
        j.rows_per_task = ceil_div(N, tasks);
        if (j.rows_per_task < ROWS_PER_TASK_MIN) j.rows_per_task = ROWS_PER_TASK_MIN;
        lmx_pool_run(cb->pool, (int)ceil_div(N, j.rows_per_task), matmul_task, &j);
    }
    if (bias) {
        float *bf = cpu_scratch(cb, 0, (size_t)N);
        if (!bf) return lmx_err_prefix(&be->err, "matmul");
        cpu_row_to_f32(cb, bf, bias, 0, N);
        float *y = out->data;
        for (int m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[(int64_t)m * N + n] += bf[n];
    }
    return LMX_OK;
}
