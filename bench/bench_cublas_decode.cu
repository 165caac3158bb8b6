/* Decode-shaped GEMMs (M = a batch of rows, bf16 weights, f32 output) through cuBLAS in the ways a decode
 * graph could call them, to measure which one streams the weights fastest: one cublasGemmEx a matrix (what
 * lmx shipped), matrices of one shape as a strided batch (k / v, gate / up; cuBLAS takes no negative stride,
 * so only where weights and outputs lie in the same order) or as a pointer batch (any order: what lmx does
 * now), matrices of one input stored side by side as one GEMM (q|k|v, gate|up), and cuBLASLt's algorithms
 * tried one by one (autotuned). *
 *   nvcc -O2 -gencode=arch=compute_90a,code=sm_90a bench/bench_cublas_decode.cu -lcublasLt -lcublas -o bcd
 *   ./bcd [M] [hidden] [ffn] [kv] [layers]        (defaults: 32 4096 14336 1024 32: Llama-3.1-8B)
 *
 * Every variant runs the layers' matmuls in a CUDA graph (weights of every layer distinct, so nothing stays
 * in L2), replayed 20 times; printed: microseconds a layer and the weights' GB/s. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_) { printf("cuda %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
#define BK(x) do { cublasStatus_t s_ = (x); if (s_) { printf("cublas %d at %d\n", (int)s_, __LINE__); exit(1); } } while (0)

__global__ void k_fill(__nv_bfloat16 *p, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 13; h *= 0x5bd1e995u; h ^= h >> 15;
        p[i] = __float2bfloat16(((int)(h & 0xffff) - 32768) * (0.02f / 32768));
    }
}

/* The decode graph's add + RMSNorm of rows of n = 256 J (lmx's k_rmsnorm_block order: thread t sums t, t + 256,
 * ..., the 8 warps in order), bf16 weights, an f32 and a bf16 output: its cost between two GEMMs measured. */
template <int J>
__global__ void __launch_bounds__(256) k_addnorm(float *out, float *y, const float *p, const __nv_bfloat16 *w, int n,
                                                 __nv_bfloat16 *o16) {
    asm volatile("griddepcontrol.launch_dependents;");
    __shared__ float part[8];
    const int t = threadIdx.x;
    float *yr = y + (size_t)blockIdx.x * n, *orow = out + (size_t)blockIdx.x * n;
    const float *pr = p + (size_t)blockIdx.x * n;
    float wv[J], v[J], ss = 0;
#pragma unroll
    for (int j = 0; j < J; j++) wv[j] = __bfloat162float(w[t + 256 * j]);
    asm volatile("griddepcontrol.wait;" ::: "memory");
#pragma unroll
    for (int j = 0; j < J; j++) v[j] = yr[t + 256 * j] + pr[t + 256 * j];
#pragma unroll
    for (int j = 0; j < J; j++) yr[t + 256 * j] = v[j], ss += v[j] * v[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (t % 32 == 0) part[t / 32] = ss;
    __syncthreads();
    float tot = 0;
    for (int i = 0; i < 8; i++) tot += part[i];
    const float inv = rsqrtf(tot / n + 1e-5f);
#pragma unroll
    for (int j = 0; j < J; j++) {
        const float o = v[j] * inv * wv[j];
        if (out) orow[t + 256 * j] = o;
        o16[(size_t)blockIdx.x * n + t + 256 * j] = __float2bfloat16(o);
    }
}
template <typename... A>
static void launch_pdl(void (*k)(A...), int grid, int block, cudaStream_t s, A... args) {
    cudaLaunchConfig_t c = {};
    c.gridDim = grid, c.blockDim = block, c.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at, c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k, args...));
}

static cublasHandle_t blas;
static cublasLtHandle_t lt;
static cudaStream_t st;
static void *ltws;
static const size_t LTWS = 32u << 20;

struct mat { const __nv_bfloat16 *w; int N, K; float *y; };

static void gemm(const __nv_bfloat16 *x, const mat &m, int M, int ldc) {
    const float one = 1, zero = 0;
    BK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, m.N, M, m.K, &one, m.w, CUDA_R_16BF, m.K, x, CUDA_R_16BF, m.K,
                    &zero, m.y, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
/* two matrices of one shape and one input as a strided batch (the stride is the distance between them) */
static void gemm2(const __nv_bfloat16 *x, const mat &a, const mat &b, int M) {
    const float one = 1, zero = 0;
    const mat &lo = a.w < b.w ? a : b, &hi = a.w < b.w ? b : a;
    long long sa = hi.w - lo.w, sc = hi.y - lo.y;
    BK(cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, a.N, M, a.K, &one, lo.w, CUDA_R_16BF, a.K, sa, x,
                                  CUDA_R_16BF, a.K, 0, &zero, lo.y, CUDA_R_32F, a.N, sc, 2, CUBLAS_COMPUTE_32F,
                                  CUBLAS_GEMM_DEFAULT));
}

/* cuBLASLt: y[M, N] = x[M, K] w[N, K]^T, column-major view: y^T [N, M] = w^T... as cuBLAS sees it (op T on w). */
struct ltplan { cublasLtMatmulDesc_t d; cublasLtMatrixLayout_t a, b, c; cublasLtMatmulAlgo_t algo; };
static void lt_layouts(ltplan &p, int N, int M, int K, int ldc) {
    BK(cublasLtMatmulDescCreate(&p.d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
    BK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    BK(cublasLtMatmulDescSetAttribute(p.d, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
    BK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K));
    BK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K));
    BK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, N, M, ldc));
}
static void lt_run(const ltplan &p, const __nv_bfloat16 *x, const __nv_bfloat16 *w, float *y, const cublasLtMatmulAlgo_t *algo) {
    const float one = 1, zero = 0;
    BK(cublasLtMatmul(lt, p.d, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, algo, ltws, LTWS, st));
}
/* the fastest of cuBLASLt's heuristic algorithms for this shape, timed over `reps` calls on layer-distinct weights */
static ltplan lt_tune(int N, int M, int K, const std::vector<const __nv_bfloat16 *> &ws, const __nv_bfloat16 *x, float *y,
                      int *nalgo, float *best_us, float *first_us) {
    ltplan p;
    lt_layouts(p, N, M, K, N);
    cublasLtMatmulPreference_t pref;
    BK(cublasLtMatmulPreferenceCreate(&pref));
    BK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &LTWS, sizeof LTWS));
    cublasLtMatmulHeuristicResult_t res[32];
    int n = 0;
    BK(cublasLtMatmulAlgoGetHeuristic(lt, p.d, p.a, p.b, p.c, p.c, pref, 32, res, &n));
    *nalgo = n;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int i = 0; i < n; i++) {
        for (size_t l = 0; l < ws.size(); l++) lt_run(p, x, ws[l], y, &res[i].algo); /* warm */
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < 3; r++)
            for (size_t l = 0; l < ws.size(); l++) lt_run(p, x, ws[l], y, &res[i].algo);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        float us = ms * 1000 / (3 * ws.size());
        if (i == 0) *first_us = us;
        if (us < best) { best = us; p.algo = res[i].algo; }
    }
    *best_us = best;
    return p;
}

int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 32, H = argc > 2 ? atoi(argv[2]) : 4096, F = argc > 3 ? atoi(argv[3]) : 14336,
        KV = argc > 4 ? atoi(argv[4]) : 1024, L = argc > 5 ? atoi(argv[5]) : 32;
    CK(cudaStreamCreate(&st));
    BK(cublasCreate(&blas));
    BK(cublasSetStream(blas, st));
    BK(cublasLtCreate(&lt));
    CK(cudaMalloc(&ltws, LTWS));
    BK(cublasSetWorkspace(blas, ltws, LTWS));
    /* a layer's weights in one allocation, in the order q k v o gate up down (so q|k|v and gate|up are
     * adjacent for the side-by-side variant) */
    const size_t nq = (size_t)H * H, nkv = (size_t)KV * H, nf = (size_t)F * H;
    const size_t per = nq + 2 * nkv + nq + 3 * nf;
    std::vector<__nv_bfloat16 *> base(L);
    for (int l = 0; l < L; l++) {
        CK(cudaMalloc(&base[l], per * 2));
        k_fill<<<1024, 256>>>(base[l], per, 77u * l + 1);
    }
    __nv_bfloat16 *x;
    float *yq, *yk, *yv, *yo, *yg, *yu, *yd, *yqkv, *ygu;
    CK(cudaMalloc(&x, (size_t)M * F * 2));
    k_fill<<<64, 256>>>(x, (size_t)M * F, 5);
    CK(cudaMalloc(&yq, (size_t)M * H * 4)); CK(cudaMalloc(&yk, (size_t)M * KV * 4)); CK(cudaMalloc(&yv, (size_t)M * KV * 4));
    CK(cudaMalloc(&yo, (size_t)M * H * 4)); CK(cudaMalloc(&yg, (size_t)M * F * 4)); CK(cudaMalloc(&yu, (size_t)M * F * 4));
    CK(cudaMalloc(&yd, (size_t)M * H * 4)); CK(cudaMalloc(&yqkv, (size_t)M * (H + 2 * KV) * 4));
    CK(cudaMalloc(&ygu, (size_t)M * 2 * F * 4));
    CK(cudaDeviceSynchronize());
    struct lw { mat q, k, v, o, g, u, d; };
    std::vector<lw> W(L);
    for (int l = 0; l < L; l++) {
        __nv_bfloat16 *p = base[l];
        W[l].q = {p, H, H, yq}; p += nq;
        W[l].k = {p, KV, H, yk}; p += nkv;
        W[l].v = {p, KV, H, yv}; p += nkv;
        W[l].o = {p, H, H, yo}; p += nq;
        W[l].g = {p, F, H, yg}; p += nf;
        W[l].u = {p, F, H, yu}; p += nf;
        W[l].d = {p, H, F, yd};
    }
    const double bytes = per * 2.0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    auto timed = [&](const char *name, auto body) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        body(); /* warm: cuBLAS's first call may allocate */
        CK(cudaStreamSynchronize(st));
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        body();
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e0, st));
        for (int r = 0; r < 20; r++) CK(cudaGraphLaunch(ge, st));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        double us = ms * 1000.0 / (20 * L);
        printf("%-44s %8.1f us a layer  %7.0f GB/s\n", name, us, bytes / (us * 1e3));
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
    };
    printf("M %d hidden %d ffn %d kv %d layers %d: %.1f MB a layer\n", M, H, F, KV, L, bytes / 1e6);
    timed("GemmEx each (shipped)", [&] {
        for (int l = 0; l < L; l++) {
            gemm(x, W[l].q, M, H); gemm(x, W[l].k, M, KV); gemm(x, W[l].v, M, KV); gemm(x, W[l].o, M, H);
            gemm(x, W[l].g, M, F); gemm(x, W[l].u, M, F); gemm(x, W[l].d, M, H);
        }
    });
    timed("k/v and gate/up strided-batched", [&] {
        for (int l = 0; l < L; l++) {
            gemm(x, W[l].q, M, H); gemm2(x, W[l].k, W[l].v, M); gemm(x, W[l].o, M, H);
            gemm2(x, W[l].g, W[l].u, M); gemm(x, W[l].d, M, H);
        }
    });
    /* the same pairs through cublasGemmBatchedEx, pointers in device memory (x, w, y; 2 each), any order */
    std::vector<const void *> ph(L * 12);
    for (int l = 0; l < L; l++) {
        const void *kv[6] = {x, x, W[l].v.w, W[l].k.w, W[l].v.y, W[l].k.y}; /* v first: the other order */
        const void *gu[6] = {x, x, W[l].u.w, W[l].g.w, W[l].u.y, W[l].g.y};
        memcpy(&ph[l * 12], kv, sizeof kv), memcpy(&ph[l * 12 + 6], gu, sizeof gu);
    }
    const void **pd;
    CK(cudaMalloc(&pd, ph.size() * sizeof(void *)));
    CK(cudaMemcpy(pd, ph.data(), ph.size() * sizeof(void *), cudaMemcpyHostToDevice));
    auto gemmb = [&](const void *const *p, int N, int K) {
        const float one = 1, zero = 0;
        BK(cublasGemmBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, p + 2, CUDA_R_16BF, K, p, CUDA_R_16BF, K,
                               &zero, (void *const *)(p + 4), CUDA_R_32F, N, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    };
    {
        const size_t ny = (size_t)M * F;
        std::vector<float> a(2 * ny), b(2 * ny);
        gemm(x, W[0].g, M, F), gemm(x, W[0].u, M, F);
        CK(cudaMemcpy(a.data(), yg, ny * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(a.data() + ny, yu, ny * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemset(yg, 0, ny * 4)); CK(cudaMemset(yu, 0, ny * 4));
        gemmb(pd + 6, F, H);
        CK(cudaStreamSynchronize(st));
        CK(cudaMemcpy(b.data(), yg, ny * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(b.data() + ny, yu, ny * 4, cudaMemcpyDeviceToHost));
        printf("pointer batch: %s\n", memcmp(a.data(), b.data(), 2 * ny * 4) ? "NOT the bits of two GEMMs" : "the bits of two GEMMs");
    }
    timed("k/v and gate/up pointer-batched", [&] {
        for (int l = 0; l < L; l++) {
            gemm(x, W[l].q, M, H); gemmb(pd + l * 12, KV, H); gemm(x, W[l].o, M, H);
            gemmb(pd + l * 12 + 6, F, H); gemm(x, W[l].d, M, H);
        }
    });
    /* q beside the k / v pair on a second stream (fork / join in the graph; a second handle, its own workspace) */
    cudaStream_t st2;
    cublasHandle_t blas2;
    void *ws2;
    cudaEvent_t ef[64], ej[64];
    CK(cudaStreamCreateWithFlags(&st2, cudaStreamNonBlocking));
    BK(cublasCreate(&blas2));
    BK(cublasSetStream(blas2, st2));
    CK(cudaMalloc(&ws2, LTWS));
    BK(cublasSetWorkspace(blas2, ws2, LTWS));
    for (int l = 0; l < 64; l++) {
        CK(cudaEventCreateWithFlags(&ef[l], cudaEventDisableTiming));
        CK(cudaEventCreateWithFlags(&ej[l], cudaEventDisableTiming));
    }
    timed("q beside the k/v pair (two streams)", [&] {
        for (int l = 0; l < L; l++) {
            CK(cudaEventRecord(ef[l % 64], st));
            CK(cudaStreamWaitEvent(st2, ef[l % 64], 0));
            std::swap(blas, blas2);
            gemmb(pd + l * 12, KV, H);
            std::swap(blas, blas2);
            CK(cudaEventRecord(ej[l % 64], st2));
            gemm(x, W[l].q, M, H);
            CK(cudaStreamWaitEvent(st, ej[l % 64], 0));
            gemm(x, W[l].o, M, H);
            gemmb(pd + l * 12 + 6, F, H); gemm(x, W[l].d, M, H);
        }
    });
    /* the add + norm between the GEMMs: its cost in a graph (with PDL, as lmx launches it) */
    float *ny, *np2, *nout;
    __nv_bfloat16 *n16, *nw;
    CK(cudaMalloc(&ny, (size_t)M * H * 4)); CK(cudaMalloc(&np2, (size_t)M * H * 4)); CK(cudaMalloc(&nout, (size_t)M * H * 4));
    CK(cudaMalloc(&n16, (size_t)M * H * 2)); CK(cudaMalloc(&nw, (size_t)L * H * 2));
    CK(cudaMemset(ny, 0, (size_t)M * H * 4)); CK(cudaMemset(np2, 0, (size_t)M * H * 4));
    k_fill<<<64, 256>>>(nw, (size_t)L * H, 9);
    if (H == 4096) {
        timed("  q, o alone", [&] { for (int l = 0; l < L; l++) gemm(x, W[l].q, M, H), gemm(x, W[l].o, M, H); });
        timed("  q, add+norm, o, add+norm", [&] {
            for (int l = 0; l < L; l++) {
                gemm(x, W[l].q, M, H);
                launch_pdl(k_addnorm<16>, M, 256, st, nout, ny, (const float *)np2, (const __nv_bfloat16 *)nw + (size_t)l * H, H, n16);
                gemm(x, W[l].o, M, H);
                launch_pdl(k_addnorm<16>, M, 256, st, nout, ny, (const float *)np2, (const __nv_bfloat16 *)nw + (size_t)l * H, H, n16);
            }
        });
        timed("  the same, no f32 output", [&] {
            for (int l = 0; l < L; l++) {
                gemm(x, W[l].q, M, H);
                launch_pdl(k_addnorm<16>, M, 256, st, (float *)NULL, ny, (const float *)np2, (const __nv_bfloat16 *)nw + (size_t)l * H, H, n16);
                gemm(x, W[l].o, M, H);
                launch_pdl(k_addnorm<16>, M, 256, st, (float *)NULL, ny, (const float *)np2, (const __nv_bfloat16 *)nw + (size_t)l * H, H, n16);
            }
        });
    }
    timed("q|k|v and gate|up side by side", [&] {
        for (int l = 0; l < L; l++) {
            mat qkv = {W[l].q.w, H + 2 * KV, H, yqkv}, gu = {W[l].g.w, 2 * F, H, ygu};
            gemm(x, qkv, M, H + 2 * KV); gemm(x, W[l].o, M, H); gemm(x, gu, M, 2 * F); gemm(x, W[l].d, M, H);
        }
    });
    /* per matrix kind, shipped way, to see where a layer goes */
    const char *kn[7] = {"q", "k", "v", "o", "gate", "up", "down"};
    for (int k = 0; k < 7; k++) {
        char nm[64];
        snprintf(nm, sizeof nm, "  only %s (GemmEx)", kn[k]);
        timed(nm, [&] {
            for (int l = 0; l < L; l++) {
                const mat *m = &W[l].q + k;
                gemm(x, *m, M, m->N);
            }
        });
    }
    /* cuBLASLt autotuned per shape */
    struct shp { const char *n; int N, K, off; } shapes[] = {
        {"q/o", H, H, 0}, {"k/v", KV, H, 1}, {"gate/up", F, H, 4}, {"down", H, F, 6}, {"q|k|v", H + 2 * KV, H, 0},
        {"gate|up", 2 * F, H, 4}};
    ltplan plans[6];
    for (int s = 0; s < 6; s++) {
        std::vector<const __nv_bfloat16 *> ws;
        for (int l = 0; l < L; l++) ws.push_back((&W[l].q + shapes[s].off)->w);
        float *y = shapes[s].N > F ? ygu : yg;
        int na;
        float best, first;
        plans[s] = lt_tune(shapes[s].N, M, shapes[s].K, ws, x, y, &na, &best, &first);
        printf("  Lt %-8s %2d algorithms: first %.1f us, best %.1f us\n", shapes[s].n, na, first, best);
    }
    timed("Lt tuned each", [&] {
        for (int l = 0; l < L; l++) {
            lt_run(plans[0], x, W[l].q.w, yq, &plans[0].algo); lt_run(plans[1], x, W[l].k.w, yk, &plans[1].algo);
            lt_run(plans[1], x, W[l].v.w, yv, &plans[1].algo); lt_run(plans[0], x, W[l].o.w, yo, &plans[0].algo);
            lt_run(plans[2], x, W[l].g.w, yg, &plans[2].algo); lt_run(plans[2], x, W[l].u.w, yu, &plans[2].algo);
            lt_run(plans[3], x, W[l].d.w, yd, &plans[3].algo);
        }
    });
    timed("Lt tuned, q|k|v and gate|up side by side", [&] {
        for (int l = 0; l < L; l++) {
            lt_run(plans[4], x, W[l].q.w, yqkv, &plans[4].algo); lt_run(plans[0], x, W[l].o.w, yo, &plans[0].algo);
            lt_run(plans[5], x, W[l].g.w, ygu, &plans[5].algo); lt_run(plans[3], x, W[l].d.w, yd, &plans[3].algo);
        }
    });
    return 0;
}
