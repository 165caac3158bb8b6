/* cuda_lora.cu - unmerged LoRA on the GPU: y += scale * B (A x) per sequence (backend.h, lora).
 *
 * Decode (one row per sequence; inside the decode graph too): two launches in the spirit of Punica's
 * SGMV for up to 64 rows, each row with its own adapter or none (up to 8 distinct ones a launch), for
 * up to three projections of one input at once (q/k/v, gate/up; cuda_graph.cu groups them):
 *   shrink  t[p, m, j] = scale * (A_pm[j, :] . x[m, :])     one block per (projection, row, j, K chunk)
 *   expand  y_p[m, n] += B_pm[n, :] . t[p, m, :]             one thread per (row, output)
 * and for gate/up the GLU that follows (as the glu op computes it).  In a decode graph of several rows the
 * shrink runs on a side branch beside the group's GEMV, so only the expand lengthens the chain of launches.
 * A graph of one row (cuda_graph.cu, g_exec_lora_row) instead folds the group's RMSNorm into the shrink
 * (cuda_lora_shrink_row) and the expand into the group's GEMV (cuda_gemv_opts.lora_*), keeping the
 * GEMV's norm, GLU and residual folds: one extra launch per group.
 * Prefill (many rows per sequence): the rows of consecutive sequences sharing a pair form one
 * segment, and each segment is two cuBLAS GEMMs in TF32 (t = x A^T, y += s t B^T).
 * The pairs' A and B are f32 [r, K] and [N, r] in device memory; t lives in a scratch slot. */
#include "cuda_internal.h"

/* One launch's LoRA work: np (1..3) projections of one input x [n, K], n <= CUDA_LORA_ROWS rows (one
 * per sequence), each row using one of at most CUDA_LORA_SLOTS slots (a slot: one pair per
 * projection, i.e. one adapter) or none.  Passed by value; fields indexed only through unrolled
 * selects (a run-time index into a kernel parameter would copy it to local memory). */
#define CUDA_LORA_SLOTS 8
#define CUDA_LORA_ROWS 64
#define LORA_NONE 15u
typedef struct lora_proj {
    const float *a[CUDA_LORA_SLOTS];  /* [r, K], or NULL: the slot does not adapt this projection */
    const float *b[CUDA_LORA_SLOTS];  /* [N, r] */
    float scale[CUDA_LORA_SLOTS];
    int r[CUDA_LORA_SLOTS];
    float *y;                         /* [n, N] */
    int N;
} lora_proj;

typedef struct lora_grp {
    lora_proj p[3];
    uint32_t slot[CUDA_LORA_ROWS / 8]; /* 4 bits per row: its slot, LORA_NONE: no pair */
    const float *x;                    /* [n, K] */
    float *t;                          /* [np, n, rmax] shrink results */
    float *part;                       /* [np, n, rmax, chunks] their partial sums (chunks > 1) */
    int *ticket;                       /* [np, n, rmax] chunks done, 0 between launches */
    int64_t K;
    int np, n, rmax, chunks;
    int glu;                           /* >= 0 (an lmx_act, np = 2): then y0 = act(y0) * y1 as the glu op */
} lora_grp;

template <typename T, int N> static __device__ __forceinline__ T pick(const T (&v)[N], unsigned i) {
    T r = v[0];
#pragma unroll
    for (int k = 1; k < N; k++)
        if (i == (unsigned)k) r = v[k];
    return r;
}
static __device__ __forceinline__ const lora_proj &proj_of(const lora_grp &g, int i) {
    return i == 0 ? g.p[0] : i == 1 ? g.p[1] : g.p[2];
}
static __device__ __forceinline__ unsigned slot_of(const lora_grp &g, int m) {
    return pick(g.slot, (unsigned)m >> 3) >> ((m & 7) * 4) & 15u;
}

/* t[p, m, j] = scale * (A[j, :] . x[m, :]): one block per (projection, row, j, chunk of K), its threads
 * striding over the chunk with 16-byte loads, LORA_UNROLL in flight each, all issued before the wait for
 * x (a chunk is one such round: LORA_CHUNK vectors).  With several chunks each block leaves its partial
 * sum and the last block of a (p, m, j) to finish (a ticket counter, reset for the next launch) adds them
 * in chunk order: the same bits whichever block finishes last.  NORM: x is the row's RMSNorm (n = 1),
 * computed by each block as the norm op computes it. */
#define LORA_SHRINK_THREADS 256
#define LORA_UNROLL 4
#define LORA_CHUNK (LORA_UNROLL * LORA_SHRINK_THREADS)
template <int NORM>
__global__ void __launch_bounds__(LORA_SHRINK_THREADS) k_lora_shrink(const lora_grp g, const cuda_row_norm nm) {
    __shared__ float part[LORA_SHRINK_THREADS / 32];
    cuda_pdl_trigger();
    const int S = g.chunks, blk = blockIdx.x / S, c = blockIdx.x % S;
    const int p = blk / (g.n * g.rmax), m = blk / g.rmax % g.n, j = blk % g.rmax;
    const lora_proj &P = proj_of(g, p);
    const unsigned sl = slot_of(g, m);
    const float *A = sl == LORA_NONE ? NULL : pick(P.a, sl);
    if (p >= g.np || !A || j >= pick(P.r, sl)) {
        cuda_pdl_wait(); /* a block ends only after its predecessor (cuda_internal.h) */
        return;
    }
    const float *arow = A + (int64_t)j * g.K;
    const float *xr = g.x + (int64_t)m * g.K;
    float acc = 0.0f;
    if ((g.K & 3) == 0) {
        const float4 *a4 = (const float4 *)arow, *x4 = (const float4 *)xr;
        const int64_t nv = g.K / 4, k0 = (int64_t)c * LORA_CHUNK + threadIdx.x;
        float4 av[LORA_UNROLL], wv[NORM ? LORA_UNROLL : 1]; /* A and the norm's weights + add_one: before the wait */
#pragma unroll
        for (int u = 0; u < LORA_UNROLL; u++) {
            const int64_t kk = k0 + u * LORA_SHRINK_THREADS;
            av[u] = kk < nv ? __ldg(a4 + kk) : make_float4(0, 0, 0, 0);
            if constexpr (NORM != 0)
                wv[u] = kk < nv ? make_float4(cuda_elem(nm.w, nm.wt, 4 * kk) + nm.add_one, cuda_elem(nm.w, nm.wt, 4 * kk + 1) + nm.add_one,
                                              cuda_elem(nm.w, nm.wt, 4 * kk + 2) + nm.add_one, cuda_elem(nm.w, nm.wt, 4 * kk + 3) + nm.add_one)
                                : make_float4(0, 0, 0, 0);
        }
        cuda_pdl_wait();
        float4 xs[LORA_UNROLL]; /* loaded before the norm's pass over x, so that both are in flight at once */
#pragma unroll
        for (int u = 0; u < LORA_UNROLL; u++)
            xs[u] = k0 + u * LORA_SHRINK_THREADS < nv ? x4[k0 + u * LORA_SHRINK_THREADS] : make_float4(0, 0, 0, 0);
        const float inv = NORM ? cuda_rms_inv256(xr, (int)g.K, nm.eps, part) : 1.0f;
#pragma unroll
        for (int u = 0; u < LORA_UNROLL; u++) {
            const int64_t kk = k0 + u * LORA_SHRINK_THREADS;
            if (kk < nv) {
                float4 xv = xs[u];
                if constexpr (NORM != 0) { /* the norm op's arithmetic, element by element */
                    xv.x = xv.x * inv * wv[u].x;
                    xv.y = xv.y * inv * wv[u].y;
                    xv.z = xv.z * inv * wv[u].z;
                    xv.w = xv.w * inv * wv[u].w;
                }
                acc = __fmaf_rn(av[u].x, xv.x, acc);
                acc = __fmaf_rn(av[u].y, xv.y, acc);
                acc = __fmaf_rn(av[u].z, xv.z, acc);
                acc = __fmaf_rn(av[u].w, xv.w, acc);
            }
        }
    } else { /* one chunk (lora_shrink_launch) */
        cuda_pdl_wait();
        const float inv = NORM ? cuda_rms_inv256(xr, (int)g.K, nm.eps, part) : 1.0f;
        for (int64_t k = threadIdx.x; k < g.K; k += LORA_SHRINK_THREADS) {
            const float xv = NORM ? cuda_norm_elem(xr[k], inv, nm.w, nm.wt, k, nm.add_one) : xr[k];
            acc = __fmaf_rn(__ldg(arow + k), xv, acc);
        }
    }
    __syncthreads(); /* part is free again (the norm's partial sums) */
    acc = cuda_warp_sum(acc);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x / 32] = acc;
    __syncthreads();
    if (threadIdx.x != 0) return;
    float sum = 0.0f;
    for (int w = 0; w < LORA_SHRINK_THREADS / 32; w++) sum += part[w];
    const int i = (p * g.n + m) * g.rmax + j;
    if (S == 1) {
        g.t[i] = pick(P.scale, sl) * sum;
        return;
    }
    g.part[(int64_t)i * S + c] = sum;
    __threadfence();
    if (atomicAdd(g.ticket + i, 1) != S - 1) return;
    __threadfence();
    float tot = 0.0f;
    for (int k = 0; k < S; k++) tot += __ldcg(g.part + (int64_t)i * S + k);
    g.t[i] = pick(P.scale, sl) * tot;
    g.ticket[i] = 0;
}

/* B[n, :] . t[p, m, :] of projection p, row m, output n (0 when the row has no pair) */
static __device__ __forceinline__ float lora_term(const lora_grp &g, const lora_proj &P, int p, int m, int64_t n) {
    const unsigned sl = slot_of(g, m);
    const float *B = sl == LORA_NONE ? NULL : pick(P.b, sl);
    if (!B) return 0.0f;
    const int r = pick(P.r, sl);
    return cuda_lora_dot(B + n * r, g.t + (p * g.n + m) * g.rmax, r);
}

static __device__ __forceinline__ float lora_act(float a, int act) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi): the glu op's arithmetic */
    return act == LMX_ACT_SILU ? a / (1.0f + expf(-a)) : 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* y_p[m, n] += B . t (blockIdx.y = p), or with glu both projections and then the GLU */
__global__ void k_lora_expand(const lora_grp g) {
    cuda_pdl_trigger();
    const int p = blockIdx.y;
    const lora_proj &P = proj_of(g, p);
    const int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int m = (int)(i / P.N);
    const int64_t n = i % P.N;
    cuda_pdl_wait();
    if (m >= g.n) return;
    if (g.glu >= 0) {
        float *yg = g.p[0].y + (int64_t)m * P.N + n, *yu = g.p[1].y + (int64_t)m * P.N + n;
        const float gv = *yg + lora_term(g, g.p[0], 0, m, n), uv = *yu + lora_term(g, g.p[1], 1, m, n);
        *yu = uv;
        *yg = lora_act(gv, g.glu) * uv;
        return;
    }
    P.y[(int64_t)m * P.N + n] += lora_term(g, P, p, m, n);
}

/* The shrink results' scratch: t [3, CUDA_LORA_ROWS, rmax], the most any launch of rank <= rmax writes
 * (one size for every group, so a graph capture never grows it). */
static float *lora_t_scratch(cuda_backend *cb, int rmax) {
    return (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)3 * CUDA_LORA_ROWS * rmax * sizeof(float));
}

/* Launch g's shrink (g.t set): its chunks of K, and with more than one the tickets and partial sums
 * (their own scratch, which cuda_scratch zeroes whenever it is new so that every ticket starts at 0). */
static lmx_status lora_shrink_launch(cuda_backend *cb, lora_grp &g, const cuda_row_norm *nm) {
    g.chunks = g.K & 3 ? 1 : (int)((g.K / 4 + LORA_CHUNK - 1) / LORA_CHUNK);
    if (g.chunks > 1) {
        const size_t cells = (size_t)3 * CUDA_LORA_ROWS * g.rmax;
        char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_LORA_SUM, cells * (sizeof(int) + g.chunks * sizeof(float)));
        if (!buf) return cb->base.err.status;
        g.ticket = (int *)buf;
        g.part = (float *)(buf + cells * sizeof(int));
    }
    const unsigned blocks = (unsigned)(g.np * g.n * g.rmax * g.chunks);
    if (nm && nm->w)
        cuda_launch(cb, k_lora_shrink<1>, blocks, LORA_SHRINK_THREADS, 0, g, *nm);
    else
        cuda_launch(cb, k_lora_shrink<0>, blocks, LORA_SHRINK_THREADS, 0, g, cuda_row_norm{});
    return LMX_OK;
}

/* Rows [0, n) in launches of at most CUDA_LORA_ROWS rows and CUDA_LORA_SLOTS distinct pair sets. */
lmx_status cuda_lora_group(cuda_backend *cb, int np, float *const *ys, const int *Ns, const float *x, int64_t K, int n,
                           const lmx_lora_pair *const *const *pairs, int glu, int stage) {
    if (stage && (!cb->side || n > CUDA_LORA_ROWS))
        return lmx_err_set(&cb->base.err, LMX_ERR_BACKEND, "cuda lora: staged launch without a side stream");
    int Nmax = 0, rmax = 1;
    for (int p = 0; p < np; p++) {
        if (Ns[p] > Nmax) Nmax = Ns[p];
        for (int m = 0; m < n; m++)
            if (pairs[p][m] && pairs[p][m]->a.shape[0] > rmax) rmax = (int)pairs[p][m]->a.shape[0];
    }
    float *t = lora_t_scratch(cb, rmax);
    if (!t) return cb->base.err.status;
    for (int m0 = 0; m0 < n;) {
        lora_grp g;
        memset(&g, 0, sizeof g);
        g.np = np;
        g.x = x + (int64_t)m0 * K;
        g.t = t;
        g.K = K;
        g.rmax = rmax;
        g.glu = glu;
        int slot_row[CUDA_LORA_SLOTS], ns = 0, m = m0;
        for (; m < n && m - m0 < CUDA_LORA_ROWS; m++) { /* a row's slot: the first row with its pairs */
            unsigned sl = LORA_NONE;
            int any = 0;
            for (int p = 0; p < np; p++) any |= pairs[p][m] != NULL;
            for (int k = 0; any && k < ns && sl == LORA_NONE; k++) {
                int same = 1;
                for (int p = 0; p < np; p++) same &= pairs[p][m] == pairs[p][slot_row[k]];
                if (same) sl = (unsigned)k;
            }
            if (any && sl == LORA_NONE) {
                if (ns == CUDA_LORA_SLOTS) break; /* the next launch takes it */
                slot_row[ns] = m;
                sl = (unsigned)ns++;
                for (int p = 0; p < np; p++) {
                    const lmx_lora_pair *q = pairs[p][m];
                    if (!q) continue;
                    g.p[p].a[sl] = (const float *)q->a.data;
                    g.p[p].b[sl] = (const float *)q->b.data;
                    g.p[p].scale[sl] = q->scale;
                    g.p[p].r[sl] = (int)q->a.shape[0];
                }
            }
            g.slot[(m - m0) >> 3] |= sl << (((m - m0) & 7) * 4);
        }
        g.n = m - m0;
        for (int p = 0; p < np; p++) {
            g.p[p].y = ys[p] + (int64_t)m0 * Ns[p];
            g.p[p].N = Ns[p];
        }
        if (ns > 0 && stage == 1) { /* the shrink beside the main stream */
            cudaStream_t main = cb->stream;
            int pdl = cb->pdl;
            CUDA_TRY(cb, cudaEventRecord(cb->fork, main), "lora fork");
            CUDA_TRY(cb, cudaStreamWaitEvent(cb->side, cb->fork, 0), "lora fork");
            cb->stream = cb->side;
            cb->pdl = 0;
            lmx_status st = lora_shrink_launch(cb, g, NULL);
            cudaError_t e = st ? cudaSuccess : cudaEventRecord(cb->join, cb->side);
            cb->stream = main;
            cb->pdl = pdl;
            if (st) return st;
            if (e != cudaSuccess) return cuda_fail(cb, e, "lora fork");
        } else if (ns > 0 && stage == 0) {
            lmx_status st = lora_shrink_launch(cb, g, NULL);
            if (st) return st;
        }
        if (ns > 0 && stage == 2) CUDA_TRY(cb, cudaStreamWaitEvent(cb->stream, cb->join, 0), "lora join");
        if (stage != 1 && (ns > 0 || glu >= 0)) { /* with no row adapted, still the GLU the group promised */
            dim3 grid(cuda_blocks((int64_t)g.n * Nmax, 256), glu >= 0 ? 1 : np);
            cuda_launch(cb, k_lora_expand, grid, 256, 0, g);
        }
        m0 = m;
    }
    return cuda_check_launch(cb, "lora");
}

lmx_status cuda_lora_shrink_row(cuda_backend *cb, int np, const lmx_lora_pair *const *pairs, const float *x,
                                int64_t K, const cuda_row_norm *norm, float **t, int *rmax) {
    lora_grp g;
    memset(&g, 0, sizeof g);
    g.np = np;
    g.n = 1;
    g.x = x;
    g.K = K;
    g.rmax = 1;
    g.glu = -1;
    g.slot[0] = 0; /* the row's slot: 0 */
    for (int p = 0; p < np; p++) {
        const lmx_lora_pair *q = pairs[p];
        if (!q) continue;
        g.p[p].a[0] = (const float *)q->a.data;
        g.p[p].scale[0] = q->scale;
        g.p[p].r[0] = (int)q->a.shape[0];
        if (g.p[p].r[0] > g.rmax) g.rmax = g.p[p].r[0];
    }
    g.t = lora_t_scratch(cb, g.rmax);
    if (!g.t) return cb->base.err.status;
    lmx_status st = lora_shrink_launch(cb, g, norm);
    if (st) return st;
    *t = g.t;
    *rmax = g.rmax;
    return cuda_check_launch(cb, "lora shrink");
}

lmx_status cuda_lora_decode(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t N, int B,
                            const lmx_lora_pair *const *pairs) {
    int Ni = (int)N;
    return cuda_lora_group(cb, 1, &y, &Ni, x, K, B, &pairs, -1, 0);
}

cublasStatus_t cuda_lora_expand(cuda_backend *cb, float *y, const float *t, int64_t rows, int64_t N,
                                const lmx_lora_pair *p) {
    const int r = (int)p->a.shape[0];
    const float one = 1.0f, s = p->scale;
    return cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)rows, r, &s, p->b.data, CUDA_R_32F, r, t,
                        CUDA_R_32F, r, &one, y, CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
}

/* rows [r0, r0 + rows) share pair p: two GEMMs on the tensor cores in TF32 with f32 accumulation
 * (the low-rank delta is small next to the base output, so TF32's 10-bit mantissa costs nothing at the
 * bf16 criterion); cuBLAS is column-major: a row-major [M, K] is its K x M.  With xb (x a training keep
 * in bf16) the first product takes bf16 operands, A narrowed into a16 [r, K]. */
static lmx_status lora_segment(cuda_backend *cb, float *y, const float *x, const __nv_bfloat16 *xb, int64_t K,
                               int64_t N, int64_t r0, int64_t rows, const lmx_lora_pair *p, float *t,
                               __nv_bfloat16 *a16) {
    int r = (int)p->a.shape[0];
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st;
    if (xb) {
        lmx_status e = cuda_narrow_bf16(cb, a16, (const float *)p->a.data, (int64_t)r * K);
        if (e) return e;
        st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, r, (int)rows, (int)K, &one, a16, CUDA_R_16BF, (int)K,
                          xb + r0 * K, CUDA_R_16BF, (int)K, &zero, t, CUDA_R_32F, r, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    } else {
        st = cublasGemmEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, r, (int)rows, (int)K, &one, p->a.data, CUDA_R_32F, (int)K,
                          x + r0 * K, CUDA_R_32F, (int)K, &zero, t, CUDA_R_32F, r, CUBLAS_COMPUTE_32F_FAST_TF32,
                          CUBLAS_GEMM_DEFAULT);
    }
    if (st == CUBLAS_STATUS_SUCCESS && y) /* y NULL: the shrink alone (lora_keep's deferred expand) */
        st = cuda_lora_expand(cb, y + r0 * N, t, rows, N, p);
    return cuda_blas(cb, st, "lora gemm");
}

lmx_status cuda_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                     const lmx_lora_pair *const *pairs) {
    return cuda_lora_xa(be, y, x, B, T, pairs, NULL);
}

lmx_status cuda_lora_xa(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                        const lmx_lora_pair *const *pairs, float *xa) {
    cuda_backend *cb = (cuda_backend *)be;
    const lmx_lora_pair *p0 = NULL;
    for (int b = 0; b < B && !p0; b++) p0 = pairs[b];
    if (!y && (!xa || T == 1)) return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda lora: a shrink alone of one row");
    if (y && y->dtype != LMX_DTYPE_F32) /* training's bf16 gate and up (model.h mlp16) take their expand in the GLU */
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda lora: an expand into a projection of dtype %d", (int)y->dtype);
    int64_t K = x->shape[x->ndim - 1], N = y ? y->shape[y->ndim - 1] : p0 ? p0->b.shape[0] : 0;
    for (int b = 0; b < B; b++) {
        const lmx_lora_pair *p = pairs[b];
        if (p && !lmx_lora_pair_fits(p, K, N))
            return lmx_err_set(&be->err, LMX_ERR_SHAPE, "cuda lora: pair of sequence %d does not fit [%lld -> %lld]", b,
                               (long long)K, (long long)N);
    }
    const int xb = x->dtype == LMX_DTYPE_BF16; /* a training keep (backend.h) */
    if (T == 1 && xa) return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda lora: x A^T of one row");
    if (T == 1 && xb) /* the decode kernels read f32 */
        return cuda_on_widened(cb, x, [&](const lmx_tensor *xf) {
            return cuda_lora_decode(cb, (float *)y->data, (const float *)xf->data, K, N, B, pairs);
        });
    if (T == 1) return cuda_lora_decode(cb, (float *)y->data, (const float *)x->data, K, N, B, pairs);
    int64_t seg_max = 0, rk = 0;
    for (int b0 = 0; b0 < B;) {
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0]) b1++;
        if (pairs[b0] && (int64_t)(b1 - b0) * T * pairs[b0]->a.shape[0] > seg_max)
            seg_max = (int64_t)(b1 - b0) * T * pairs[b0]->a.shape[0];
        if (pairs[b0] && pairs[b0]->a.shape[0] * K > rk) rk = pairs[b0]->a.shape[0] * K;
        b0 = b1;
    }
    /* t [rows, r] (f32), then with xb A as bf16 [r, K] */
    const int64_t t_len = (seg_max + 7) & ~(int64_t)7; /* a16 16-byte aligned */
    float *t = seg_max ? (float *)cuda_scratch(cb, CUDA_SCRATCH_LORA, (size_t)t_len * sizeof(float) + (xb ? rk * 2 : 0))
                       : NULL;
    if (seg_max && !t) return cb->base.err.status;
    for (int b0 = 0; b0 < B;) {
        int b1 = b0 + 1;
        while (b1 < B && pairs[b1] == pairs[b0]) b1++;
        if (pairs[b0]) { /* t: the scratch, or xa's rows of the segment */
            const int64_t r0 = (int64_t)b0 * T;
            lmx_status st = lora_segment(cb, y ? (float *)y->data : NULL, xb ? NULL : (const float *)x->data,
                                         xb ? (const __nv_bfloat16 *)x->data : NULL, K, N, r0, (int64_t)(b1 - b0) * T,
                                         pairs[b0], xa ? xa + r0 * pairs[b0]->a.shape[0] : t,
                                         xb ? (__nv_bfloat16 *)(t + t_len) : NULL);
            if (st) return st;
        }
        b0 = b1;
    }
    return LMX_OK;
}
