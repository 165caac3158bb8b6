/* cuda_moe_grouped.cu - a mixture of experts for many rows (prefill, large batches): the rows routed on
 * the GPU, grouped by expert, and each projection as batched GEMMs over the experts that have rows.
 *
 *   route    cuda_moe_route (cuda_moe.cu): pick, pw [R, K] for a round of R rows
 *   count    k_moe_count: rows per expert, read to the host (the GEMMs' sizes: one wait a round)
 *   place    k_moe_place: the round's P = R K (row, choice) pairs ordered by expert (within an expert in
 *            no set order): slot [P] (pair -> its place), src (place -> row); each active expert's
 *            places padded to its size, the power of two at or above its count (under 2 P places in all;
 *            the padding reads row 0, and nothing reads what it writes)
 *   gather   k_moe_gather: xs [places, C] bf16 = x[src]
 *   gate/up  a batched GEMM for the experts of each size: g, u [places, F] f32, expert e's places times
 *            gate_e^T and up_e^T
 *   glu      cuda_glu_bf16: h [places, F] bf16 = act(g) u
 *   down     the same: y [places, C] f32 = h down_e^T on each expert's places
 *   combine  cuda_moe_combine (cuda_moe.cu): out[i] += sum over k in order of pw[i, k] y[slot[i K + k]]
 *
 * bf16 experts are read where they are; other types (MLX, GGUF, f16, f32) are dequantized to bf16 a run
 * of experts at a time (at most CUDA_MOE_DEQUANT_BYTES, at least one expert).  GGUF Q4_K experts (Q4_K or
 * Q6_K down) take none of these after the routing: cuda_moe_rows.cu plans the round on the device (counts,
 * places, tiles: no wait for the host) and its launches over the places, a tile of an expert's places a block,
 * read each chosen expert once a round on the integer tensor cores.  Rows come at most MOE_ROUND_PAIRS pairs a
 * round.  Not a graph op (the GEMMs' host waits for the counts; decode graphs take at most CUDA_G_MAX rows). */
#include "cuda_gemv.h"
#include "cuda_moe_mma.h"

#define MOE_ROUND_PAIRS 16384                /* (row, choice) pairs a round: bounds the scratch */
#define CUDA_MOE_DEQUANT_BYTES (256u << 20)  /* experts dequantized to bf16 at once */

typedef struct moe_offs { int off[CUDA_MOE_E_MAX]; } moe_offs;

/* count[e] += pairs of this block's that chose e (count zeroed before; a pick outside [0, E) is counted nowhere,
 * which the host's sum finds) */
__global__ void k_moe_count(const int *pick, int P, int E, int *count) {
    __shared__ int n[CUDA_MOE_E_MAX];
    for (int e = threadIdx.x; e < E; e += blockDim.x) n[e] = 0;
    __syncthreads();
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p < P && pick[p] >= 0 && pick[p] < E) atomicAdd(&n[pick[p]], 1);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        if (n[e]) atomicAdd(&count[e], n[e]);
}

/* Expert e's pairs take places o.off[e] .. in no set order (a place's results are its own GEMM rows, whatever its
 * position): slot[p] = place, src[place] = p / K.  cursor [E] zeroed before. */
__global__ void k_moe_place(const int *pick, int P, int E, int K, const __grid_constant__ moe_offs o, int *cursor,
                            int *slot, int *src) {
    __shared__ int n[CUDA_MOE_E_MAX], base[CUDA_MOE_E_MAX];
    for (int e = threadIdx.x; e < E; e += blockDim.x) n[e] = 0;
    __syncthreads();
    const int p = blockIdx.x * blockDim.x + threadIdx.x, e = p < P ? pick[p] : -1;
    const int r = e >= 0 && e < E ? atomicAdd(&n[e], 1) : 0; /* its rank among the block's pairs of e */
    __syncthreads();
    for (int f = threadIdx.x; f < E; f += blockDim.x)
        if (n[f]) base[f] = atomicAdd(&cursor[f], n[f]);
    __syncthreads();
    if (e >= 0 && e < E) {
        const int s = o.off[e] + base[e] + r;
        slot[p] = s;
        src[s] = p / K;
    }
}

/* xs[s] = bf16(x[src[s]]): blockIdx.y = place; eight values a thread where C allows */
__global__ void k_moe_gather(__nv_bfloat16 *xs, const float *x, const int *src, int64_t C) {
    const int64_t s = blockIdx.y;
    const float *xi = x + (int64_t)src[s] * C;
    const int64_t first = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, step = (int64_t)gridDim.x * blockDim.x;
    if (C % 8 == 0) {
        for (int64_t c = first; c < C / 8; c += step) {
            const float4 a = ((const float4 *)xi)[2 * c], b = ((const float4 *)xi)[2 * c + 1];
            __nv_bfloat162 v[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                   __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
            ((uint4 *)(xs + s * C))[c] = *(const uint4 *)v;
        }
        return;
    }
    for (int64_t c = first; c < C; c += step) xs[s * C + c] = __float2bfloat16(xi[c]);
}

static int direct(const lmx_tensor *w) { return !w->q.bits && !w->q.ggml_type && w->dtype == LMX_DTYPE_BF16; }

int cuda_moe_grouped_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    if (!cuda_moe_routes(cb, a)) return 0;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    for (int e = 0; e < a->E; e++) /* every expert's shapes agree (one GEMM's m and k per projection) */
        for (int j = 0; j < 3; j++) {
            const lmx_tensor *w = &a->experts[3 * e + j];
            if (w->shape[0] != (j == 2 ? C : F) || w->shape[1] != (j == 2 ? F : C)) return 0;
        }
    return 1;
}

/* One batched GEMM of G <= 2 CUDA_MOE_E_MAX groups of n rows each (an expert's gate and up, or its down, for a
 * segment of experts whose places agree in number): for each group i, C_i [n, m] = B_i [n, k] A_i [m, k]^T, bf16
 * in, f32 out, with A_i = p[i], B_i = p[stride + i] and C_i = p[2 stride + i] of the pointer table p on the
 * device.  (cuBLAS's grouped GEMM, for groups of their own sizes, ran a kernel a group: H200, Qwen3-30B-A3B Q8_0,
 * 384 GEMMs a layer for a prompt of 512, 13.8 ms at 12 layers.) */
static lmx_status gemm_batched(cuda_backend *cb, int G, int m, int k, int n, void *const *p, int stride) {
    if (G <= 0) return LMX_OK;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s = cublasGemmBatchedEx(cb->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, (const void *const *)p,
                                           CUDA_R_16BF, k, (const void *const *)p + stride, CUDA_R_16BF, k, &zero,
                                           p + 2 * stride, CUDA_R_32F, m, G, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, "moe batched GEMM");
}

static size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The host's plan of a round: the active experts (count > 0) in order of their places' number (size: the power
 * of two at or above the count), then of index, and the GEMMs' pointer table (gemm_batched's layout: A, B, C of
 * the 3 n_act groups).  Active expert j's gate and up GEMMs are groups 2 j and 2 j + 1, its down GEMM group
 * 2 n_act + j. */
typedef struct moe_plan {
    int n_act, act[CUDA_MOE_E_MAX], size[CUDA_MOE_E_MAX];
    void *ptr[9 * CUDA_MOE_E_MAX];
} moe_plan;

lmx_status cuda_moe_grouped(lmx_backend *be, const lmx_moe_args *a) {
    cuda_backend *cb = (cuda_backend *)be;
    const int E = a->E, K = a->K;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    const int rows = cuda_moe_rows_takes(cb, a);
    int alldirect = 1;
    for (int e = 0; e < E && alldirect; e++)
        for (int j = 0; j < 3; j++) alldirect &= direct(&a->experts[3 * e + j]);
    /* rows a round (a prompt chunk of 2,048 rows of 8 choices is one: each chosen expert read, or dequantized, once) */
    const int RM = MOE_ROUND_PAIRS / K > 0 ? MOE_ROUND_PAIRS / K : 1;
    const int PM = (a->M < RM ? a->M : RM) * K; /* pairs a round at most */
    /* Places: the round's pairs by expert (rows: PS = PM); for the GEMMs, each expert's padded to its size, under
     * PS = 2 PM places in all.
     * scratch: pick, pw, slot [PM]; src [PS]; count [E]; pointers [3, 3 E] (rows: tiles [4 tiles_max]); xs [PS, C]
     * bf16 (rows: none); g, u [PS, F] f32 (rows: g alone, h's values); h [PS, F] bf16 (rows: none); y [PS, C] f32 */
    const int PS = rows ? PM : 2 * PM;
    const size_t table = rows ? (size_t)4 * cuda_moe_rows_tiles_max(PM, CUDA_MOE_E_MAX) * sizeof(int)
                              : 9 * CUDA_MOE_E_MAX * sizeof(void *);
    const size_t o_pw = align256((size_t)PM * 4), o_slot = o_pw + align256((size_t)PM * 4),
                 o_src = o_slot + align256((size_t)PM * 4), o_cnt = o_src + align256((size_t)PS * 4),
                 o_ptr = o_cnt + align256((size_t)CUDA_MOE_E_MAX * 4), o_xs = o_ptr + align256(table),
                 o_g = o_xs + (rows ? 0 : align256((size_t)PS * C * 2)), o_u = o_g + align256((size_t)PS * F * 4),
                 o_h = o_u + (rows ? 0 : align256((size_t)PS * F * 4)),
                 o_y = o_h + (rows ? 0 : align256((size_t)PS * F * 2)), total = o_y + align256((size_t)PS * C * 4);
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_MOE_ROWS, total);
    if (!buf) return cb->base.err.status;
    int *pick = (int *)buf, *slot = (int *)(buf + o_slot), *src = (int *)(buf + o_src), *count = (int *)(buf + o_cnt);
    float *pw = (float *)(buf + o_pw), *g = (float *)(buf + o_g), *u = (float *)(buf + o_u), *y = (float *)(buf + o_y);
    __nv_bfloat16 *xs = (__nv_bfloat16 *)(buf + o_xs), *h = (__nv_bfloat16 *)(buf + o_h);
    void **dptr = (void **)(buf + o_ptr); /* the plan's pointer table on the device */
    const size_t per_expert = (size_t)3 * F * C * 2; /* bf16 gate, up, down */
    int run = alldirect ? E : (int)(CUDA_MOE_DEQUANT_BYTES / per_expert);
    if (run < 1) run = 1;
    if (run > E) run = E;
    __nv_bfloat16 *wq = NULL; /* the dequantized run of experts (after the first round's choice) */
    moe_plan *pl = (moe_plan *)malloc(sizeof *pl);
    if (!pl) return lmx_err_set(&be->err, LMX_ERR_NOMEM, "moe: out of host memory");
    lmx_status st = LMX_OK;
    for (int i0 = 0; i0 < a->M && !st; i0 += RM) {
        const int R = a->M - i0 < RM ? a->M - i0 : RM, P = R * K;
        const float *x = (const float *)a->x->data + (int64_t)i0 * C;
        float *out = (float *)a->out->data + (int64_t)i0 * C;
        if ((st = cuda_moe_route(cb, a, i0, R, pick, pw))) break;
        if (rows) { /* the experts on the integer tensor cores, a tile of places a block, planned on the device */
            int4 *tiles = (int4 *)(buf + o_ptr);
            if ((st = cuda_moe_rows_plan(cb, pick, P, E, K, slot, src, tiles)) ||
                (st = cuda_moe_rows(cb, a, x, R, src, tiles, g, y)) ||
                (st = cuda_moe_combine(cb, out, y, pw, slot, R, K, C)))
                break;
            continue;
        }
        int hc[CUDA_MOE_E_MAX];
        if (cudaMemsetAsync(count, 0, (size_t)E * sizeof *count, cb->stream) != cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe counts");
            break;
        }
        k_moe_count<<<cuda_blocks(P, 256), 256, 0, cb->stream>>>(pick, P, E, count);
        if (cudaMemcpyAsync(hc, count, (size_t)E * sizeof *hc, cudaMemcpyDeviceToHost, cb->stream) != cudaSuccess ||
            cudaStreamSynchronize(cb->stream) != cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe counts");
            break;
        }
        moe_offs o;
        int sum = 0, *size = pl->size;
        pl->n_act = 0;
        for (int e = 0; e < E; e++) {
            sum += hc[e];
            if (!hc[e]) continue;
            int b = 1;
            while (b < hc[e]) b *= 2;
            int j = pl->n_act++; /* (so a run of experts is a few segments of one size each) */
            for (; j > 0 && size[j - 1] > b; j--) pl->act[j] = pl->act[j - 1], size[j] = size[j - 1];
            pl->act[j] = e, size[j] = b;
        }
        if (sum != P) {
            st = lmx_err_set(&be->err, LMX_ERR_BACKEND, "moe: %d of %d pairs routed", sum, P);
            break;
        }
        /* expert act[j]'s places from the sum of the sizes before it, under 2 P in all (the padding's src row 0:
         * finite rows that nothing reads) */
        int places = 0;
        for (int j = 0; j < pl->n_act; j++) o.off[pl->act[j]] = places, places += size[j];
        if (cudaMemsetAsync(src, 0, (size_t)places * sizeof *src, cb->stream) != cudaSuccess ||
            cudaMemsetAsync(count, 0, (size_t)E * sizeof *count, cb->stream) != cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe places");
            break;
        }
        k_moe_place<<<cuda_blocks(P, 256), 256, 0, cb->stream>>>(pick, P, E, K, o, count, slot, src); /* count: cursors */
        if (!alldirect && !wq && !(wq = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_W, (size_t)run * per_expert))) {
            st = cb->base.err.status;
            break;
        }
        const int gb = cuda_blocks(C % 8 ? C : C / 8, 256);
        k_moe_gather<<<dim3(gb < 8 ? gb : 8, (unsigned)places), 256, 0, cb->stream>>>(xs, x, src, C);
        if ((st = cuda_check_launch(cb, "moe placing"))) break;
        /* active expert j is expert q = j % run of its run's dequantized weights */
        const int na = pl->n_act, G = 3 * na;
        void **A = pl->ptr, **Bp = pl->ptr + G, **Cp = pl->ptr + 2 * G;
        for (int j = 0; j < na; j++) {
            const int e = pl->act[j], q = j % run;
            const lmx_tensor *w = &a->experts[3 * e];
            for (int t = 0; t < 3; t++) {
                const int grp = t < 2 ? 2 * j + t : 2 * na + j;
                A[grp] = alldirect ? w[t].data : (void *)(wq + (size_t)q * 3 * F * C + (size_t)t * F * C);
                Bp[grp] = t < 2 ? (void *)(xs + (int64_t)o.off[e] * C) : (void *)(h + (int64_t)o.off[e] * F);
                Cp[grp] = t < 2 ? (void *)((t ? u : g) + (int64_t)o.off[e] * F) : (void *)(y + (int64_t)o.off[e] * C);
            }
        }
        if (cudaMemcpyAsync(dptr, pl->ptr, (size_t)3 * G * sizeof(void *), cudaMemcpyHostToDevice, cb->stream) !=
            cudaSuccess) {
            st = cuda_fail(cb, cudaGetLastError(), "moe GEMM pointers");
            break;
        }
        for (int j0 = 0; j0 < na && !st; j0 += run) {
            const int nr = na - j0 < run ? na - j0 : run;
            for (int t = 0; t < 3 && !alldirect && !st; t++) { /* the run's gates, ups, downs: a launch each */
                const lmx_tensor *ws[CUDA_MOE_E_MAX];
                for (int j = 0; j < nr; j++) ws[j] = &a->experts[3 * pl->act[j0 + j] + t];
                for (int j = 0; j < nr && !st; j += a->alike ? nr : 1) /* (unlike experts: one at a time) */
                    st = cuda_dequant_list_bf16(cb, ws + j, a->alike ? nr : 1, wq + ((size_t)j * 3 + t) * F * C,
                                                (int64_t)3 * F * C);
            }
            /* a batched GEMM a segment of the run whose experts' sizes agree: gate and up, the GLU, down */
            for (int s0 = j0, s1; s0 < j0 + nr && !st; s0 = s1) {
                for (s1 = s0; s1 < j0 + nr && size[s1] == size[s0]; s1++) {}
                st = gemm_batched(cb, 2 * (s1 - s0), (int)F, (int)C, size[s0], dptr + 2 * s0, G);
            }
            const int elast = pl->act[j0 + nr - 1];
            const int64_t p0 = o.off[pl->act[j0]], p1 = o.off[elast] + size[j0 + nr - 1]; /* the run's places */
            if (!st) st = cuda_glu_bf16(cb, h + p0 * F, g + p0 * F, u + p0 * F, (p1 - p0) * F, (int)a->act);
            for (int s0 = j0, s1; s0 < j0 + nr && !st; s0 = s1) {
                for (s1 = s0; s1 < j0 + nr && size[s1] == size[s0]; s1++) {}
                st = gemm_batched(cb, s1 - s0, (int)C, (int)F, size[s0], dptr + 2 * na + s0, G);
            }
        }
        if (st) break;
        st = cuda_moe_combine(cb, out, y, pw, slot, R, K, C);
    }
    free(pl);
    return st;
}
