/* bench_gemm_lt.cu - the frozen bf16 GEMMs of a LoRA training step (f32 output, as cuda_matmul.cu and
 * cuda_backward.cu call them): cuBLAS's default choice (cublasGemmEx) against every algorithm cuBLASLt's
 * heuristic offers for the same problem, each timed with events.  Says how far the default is from the
 * best cuBLAS has for a shape.
 * build: nvcc -O2 -gencode=arch=compute_90a,code=sm_90a bench/bench_gemm_lt.cu -lcublasLt -lcublas -o bench_gemm_lt
 * usage: bench_gemm_lt M [N K ...]   (pairs N K: y [M, N] = x [M, K] W[N, K]^T, and dx [M, K] = dy [M, N] W) */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                      \
    do {                                                                           \
        if ((x) != 0) {                                                            \
            fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, (int)(x)); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* random bf16 values in about [-1, 1] (constant data draws less power and would run faster) */
__global__ void k_fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
    }
}

static float time_it(cudaStream_t s, int reps, void (*fn)(void *), void *arg) {
    cudaEvent_t a, b;
    cudaEventCreate(&a), cudaEventCreate(&b);
    fn(arg); /* warm */
    cudaEventRecord(a, s);
    for (int i = 0; i < reps; i++) fn(arg);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a), cudaEventDestroy(b);
    return ms / reps;
}

typedef struct {
    cublasHandle_t h;
    cublasLtHandle_t lt;
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldc;
    const void *A, *B;
    float *C;
    float beta;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    const cublasLtMatmulAlgo_t *algo;
    void *ws;
    size_t ws_size;
    cudaStream_t s;
} prob;

static void run_default(void *p_) {
    prob *p = (prob *)p_;
    const float one = 1.0f;
    CK(cublasGemmEx(p->h, p->ta, p->tb, p->m, p->n, p->k, &one, p->A, CUDA_R_16BF, p->lda, p->B, CUDA_R_16BF, p->ldb,
                    &p->beta, p->C, CUDA_R_32F, p->ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void run_lt(void *p_) {
    prob *p = (prob *)p_;
    const float one = 1.0f;
    CK(cublasLtMatmul(p->lt, p->desc, &one, p->A, p->la, p->B, p->lb, &p->beta, p->C, p->lc, p->C, p->lc, p->algo,
                      p->ws, p->ws_size, p->s));
}

/* one column-major problem C [m, n] (+)= op(A) op(B) */
static void bench(prob *p, const char *what, double flops) {
    const int reps = 20;
    const float t0 = time_it(p->s, reps, run_default, p);
    CK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &p->ta, sizeof p->ta));
    CK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &p->tb, sizeof p->tb));
    CK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, p->ta == CUBLAS_OP_N ? p->m : p->k, p->ta == CUBLAS_OP_N ? p->k : p->m, p->lda));
    CK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, p->tb == CUBLAS_OP_N ? p->k : p->n, p->tb == CUBLAS_OP_N ? p->n : p->k, p->ldb));
    CK(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, p->m, p->n, p->ldc));
    cublasLtMatmulPreference_t pref;
    CK(cublasLtMatmulPreferenceCreate(&pref));
    CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p->ws_size, sizeof p->ws_size));
    cublasLtMatmulHeuristicResult_t res[32];
    int got = 0;
    CK(cublasLtMatmulAlgoGetHeuristic(p->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, 32, res, &got));
    float best = 1e30f, all[32];
    int bi = -1;
    for (int i = 0; i < got; i++) {
        p->algo = &res[i].algo;
        const float t = all[i] = time_it(p->s, reps, run_lt, p);
        if (t < best) best = t, bi = i;
    }
    printf("%-34s default %8.1f us %6.1f TFLOP/s | Lt best of %2d: #%d %8.1f us %6.1f TFLOP/s (%+.1f%%)\n", what,
           t0 * 1e3, flops / (t0 * 1e-3) / 1e12, got, bi, best * 1e3, flops / (best * 1e-3) / 1e12,
           (t0 / best - 1) * 100);
    printf("    each (us):");
    for (int i = 0; i < got; i++) printf(" #%d %.1f", i, all[i] * 1e3);
    printf("\n");
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(p->la), cublasLtMatrixLayoutDestroy(p->lb), cublasLtMatrixLayoutDestroy(p->lc);
    cublasLtMatmulDescDestroy(p->desc);
}

int main(int argc, char **argv) {
    if (argc < 4 || argc % 2) {
        fprintf(stderr, "usage: %s M N K [N K ...]\n", argv[0]);
        return 2;
    }
    const int M = atoi(argv[1]);
    size_t maxe = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        const size_t n = (size_t)atoi(argv[i]), k = (size_t)atoi(argv[i + 1]);
        const size_t e = (n > (size_t)M ? n : (size_t)M) * (k > n ? k : n);
        if (e > maxe) maxe = e;
    }
    void *x, *w, *ws;
    float *y;
    CK(cudaMalloc(&x, maxe * 2));
    CK(cudaMalloc(&w, maxe * 2));
    CK(cudaMalloc((void **)&y, maxe * 4));
    k_fill<<<4096, 256>>>((__nv_bfloat16 *)x, maxe, 1u);
    k_fill<<<4096, 256>>>((__nv_bfloat16 *)w, maxe, 2u);
    CK(cudaMemset(y, 0, maxe * 4));
    const size_t ws_size = 64u << 20;
    CK(cudaMalloc(&ws, ws_size));
    prob p = {0};
    CK(cublasCreate(&p.h));
    CK(cublasLtCreate(&p.lt));
    CK(cudaStreamCreate(&p.s));
    CK(cublasSetStream(p.h, p.s));
    CK(cublasSetWorkspace(p.h, ws, ws_size));
    p.ws = ws, p.ws_size = ws_size, p.A = w, p.B = x, p.C = y;
    for (int i = 2; i + 1 < argc; i += 2) {
        const int N = atoi(argv[i]), K = atoi(argv[i + 1]);
        const double fl = 2.0 * M * N * K;
        char what[64];
        /* forward: y [M, N] = x [M, K] W^T: column-major C [N, M] = W^T? as cuda_matmul.cu: op(A)=T (W [N,K]) */
        p.ta = CUBLAS_OP_T, p.tb = CUBLAS_OP_N, p.m = N, p.n = M, p.k = K, p.lda = K, p.ldb = K, p.ldc = N, p.beta = 0;
        snprintf(what, sizeof what, "fwd  M %d N %d K %d", M, N, K);
        bench(&p, what, fl);
        /* backward: dx [M, K] (+)= dy [M, N] W [N, K]: C [K, M] = A [K, N] B [N, M], both N */
        for (int b = 1; b >= 0; b--) {
            p.ta = CUBLAS_OP_N, p.tb = CUBLAS_OP_N, p.m = K, p.n = M, p.k = N, p.lda = K, p.ldb = N, p.ldc = K, p.beta = (float)b;
            snprintf(what, sizeof what, "bwd  M %d N %d K %d (beta %d)", M, N, K, b);
            bench(&p, what, fl);
        }
    }
    return 0;
}
