/* cuda_flash_bwd.cu - attention backward for training on the tensor cores (flash-attention style).
 *
 * Three kernels, none of which holds a T x T matrix:
 *   1. each query row's log-sum-exp L_i of its scaled scores and D_i = dO_i . O_i: L as the forward's
 *      flash kernel wrote it and D from its output where the tape kept both (k_fa_dsum), else k_flash in
 *      its STATS form (cuda_flash.cu: the forward pass run again; O never leaves registers).
 *   2. k_fa_dq, query-major (a block = 64 query rows of one head, 4 warps of 16): for each key tile,
 *      S = Qs K^T and dP = dO V^T, P = exp(S - L), dS = P (dP - D) (times the soft-cap's slope), and
 *      dQ += scale dS K in registers; one += into dq at the end.
 *   3. k_fa_dkdv, key-major (a block = 64 keys of one kv head, 4 warps of 16): for each query head of
 *      the group and each query tile, S^T = K Qs^T and dP^T = V dO^T, and dV += P^T dO, dK += dS^T Qs in
 *      registers; one += into dk, dv at the end (the block owns its keys: no atomics).
 * Qs = scale q, K, V and dO are bf16 (q and k, v narrowed as the forward's flash attention narrows
 * them); products accumulate in f32.  Query row t of a sequence sees keys p <= t and, with a window W,
 * p > t - W; rows t >= n_new are padding and contribute nothing.  S and dP are recomputed in both
 * kernels (9 products of T x T x D per head instead of 7, for no atomics and no transposes through
 * shared memory). */
#include <math.h>

#include "cuda_attention.h"
#include "cuda_mma.h"

#define FB_ROWS 64   /* query rows (k_fa_dq) or keys (k_fa_dkdv) per block */
#define FB_THREADS 128

/* Shared memory of k_fa_dq: Qs, dO [64][D+8], K, V [2][KT][D+8] (bf16). */
template <int D, int KT> constexpr size_t fa_dq_smem() { return (size_t)2 * (D + 8) * (2 * FB_ROWS + 4 * KT); }

template <int D, int KT>
__global__ void __launch_bounds__(FB_THREADS)
    k_fa_dq(const __nv_bfloat16 *__restrict__ q16, const __nv_bfloat16 *__restrict__ k16,
            const __nv_bfloat16 *__restrict__ v16, const __nv_bfloat16 *__restrict__ do16, const float *__restrict__ lse,
            const float *__restrict__ dsum, float *__restrict__ dq, const att_arg a) {
    constexpr int LD = D + 8, NS = KT / 8, ND = D / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fb_smem; /* [64][LD] */
    __nv_bfloat16 *Os = Qs + FB_ROWS * LD;         /* dO [64][LD] */
    __nv_bfloat16 *Ks = Os + FB_ROWS * LD;         /* [2][KT][LD] */
    __nv_bfloat16 *Vs = Ks + 2 * KT * LD;          /* [2][KT][LD] */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int t0 = (gridDim.y - 1 - blockIdx.y) * FB_ROWS; /* the longest tiles first (fb_launch) */
    const int h = blockIdx.x % a.H, b = blockIdx.x / a.H, kvh = h / a.G;
    const int n = a.s[b].n_new, window = a.s[b].window;
    if (t0 >= n) return;
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int tmax = t0 + FB_ROWS - 1 < n - 1 ? t0 + FB_ROWS - 1 : n - 1;

    for (int i = tid; i < FB_ROWS * D / 8; i += FB_THREADS) { /* Qs and dO rows t0.. (rows past n: row n - 1) */
        const int r = i / (D / 8), c = (i % (D / 8)) * 8, t = t0 + r <= tmax ? t0 + r : tmax;
        const int64_t o = ((int64_t)b * a.T + t) * HD + (int64_t)h * D + c;
        cp_async16(smem_addr(Qs + r * LD + c), q16 + o);
        cp_async16(smem_addr(Os + r * LD + c), do16 + o);
    }
    cp_async_commit();

    const int pmin = window > 0 && t0 - window + 1 > 0 ? t0 - window + 1 : 0, pmax = tmax;
    const int ntiles = (pmax - pmin) / KT + 1;
    auto load_tile = [&](int p0, int stage) {
        __nv_bfloat16 *ks = Ks + stage * KT * LD, *vs = Vs + stage * KT * LD;
        for (int i = tid; i < KT * D / 8; i += FB_THREADS) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8, p = p0 + r < pmax ? p0 + r : pmax;
            const int64_t o = ((int64_t)b * a.T + p) * KD + (int64_t)kvh * D + c;
            cp_async16(smem_addr(ks + r * LD + c), k16 + o);
            cp_async16(smem_addr(vs + r * LD + c), v16 + o);
        }
        cp_async_commit();
    };

    const int wrow = t0 + warp * 16, pos0 = wrow + g, pos1 = pos0 + 8;
    const bool ok0 = pos0 < n, ok1 = pos1 < n;
    const int wlast = wrow + 15 < n - 1 ? wrow + 15 : n - 1;
    const int64_t si = ((int64_t)b * a.H + h) * a.T;
    const float L0 = ok0 ? lse[si + pos0] : 0.f, L1 = ok1 ? lse[si + pos1] : 0.f;
    const float D0 = ok0 ? dsum[si + pos0] : 0.f, D1 = ok1 ? dsum[si + pos1] : 0.f;
    float acc[ND][4];
    acc_zero(acc);

    load_tile(pmin, 0);
    for (int it = 0; it < ntiles; it++) {
        const int p0 = pmin + it * KT;
        cp_async_turn(it + 1 < ntiles, [&] { load_tile(p0 + KT, (it + 1) & 1); });
        const __nv_bfloat16 *ks = Ks + (it & 1) * KT * LD, *vs = Vs + (it & 1) * KT * LD;
        const bool live = wrow < n && p0 <= wlast && (window <= 0 || p0 + KT - 1 > wrow - window);
        if (live) {
            float s[NS][4], dp[NS][4];
            mma_abt<D, NS>(s, Qs, warp * 16, ks, LD);
            mma_abt<D, NS>(dp, Os, warp * 16, vs, LD);
#pragma unroll
            for (int j = 0; j < NS; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int row = e / 2, p = p0 + 8 * j + 2 * tq + (e & 1), pos = row ? pos1 : pos0;
                    const bool vis = (row ? ok1 : ok0) && att_sees(pos, p, window);
                    att_grad(s[j][e], dp[j][e], vis, row ? L1 : L0, row ? D1 : D0, a.softcap);
                }
            /* dQ += dS K: dS's accumulators are the A operand, K [keys][D] the B operand (keys as k) */
            mma_acc_pt<KT, ND>(acc, dp, ks, LD);
        }
        __syncthreads(); /* every warp is done with this stage before it is refilled */
    }

    float *o0 = dq + ((int64_t)b * a.T + pos0) * HD + (int64_t)h * D;
    if (ok0) att_add_row(o0, acc, 0, a.scale);
    if (ok1) att_add_row(o0 + 8 * HD, acc, 1, a.scale);
}

/* Shared memory of k_fa_dkdv: K, V [64][D+8], Qs, dO [2][QT][D+8] (bf16), L, D [2][QT] (f32). */
template <int D, int QT> constexpr size_t fa_dkdv_smem() {
    return (size_t)2 * (D + 8) * (2 * FB_ROWS + 4 * QT) + (size_t)4 * 4 * QT;
}

template <int D, int QT>
__global__ void __launch_bounds__(FB_THREADS)
    k_fa_dkdv(const __nv_bfloat16 *__restrict__ q16, const __nv_bfloat16 *__restrict__ k16,
              const __nv_bfloat16 *__restrict__ v16, const __nv_bfloat16 *__restrict__ do16,
              const float *__restrict__ lse, const float *__restrict__ dsum, float *__restrict__ dk,
              float *__restrict__ dv, const att_arg a) {
    constexpr int LD = D + 8, NQ = QT / 8, ND = D / 8;
    extern __shared__ __align__(16) unsigned char fb_smem[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)fb_smem; /* [64][LD] */
    __nv_bfloat16 *Vs = Ks + FB_ROWS * LD;         /* [64][LD] */
    __nv_bfloat16 *Qs = Vs + FB_ROWS * LD;         /* [2][QT][LD] */
    __nv_bfloat16 *Os = Qs + 2 * QT * LD;          /* dO [2][QT][LD] */
    float *Ls = (float *)(Os + 2 * QT * LD);       /* [2][QT] */
    float *Ds = Ls + 2 * QT;                       /* [2][QT] */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int k0 = blockIdx.y * FB_ROWS, kvh = blockIdx.x % a.Hk, b = blockIdx.x / a.Hk; /* longest first */
    const int n = a.s[b].n_new, window = a.s[b].window;
    if (k0 >= n) return;
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int kmax = k0 + FB_ROWS - 1 < n - 1 ? k0 + FB_ROWS - 1 : n - 1;

    for (int i = tid; i < FB_ROWS * D / 8; i += FB_THREADS) { /* the block's keys and values */
        const int r = i / (D / 8), c = (i % (D / 8)) * 8, p = k0 + r <= kmax ? k0 + r : kmax;
        const int64_t o = ((int64_t)b * a.T + p) * KD + (int64_t)kvh * D + c;
        cp_async16(smem_addr(Ks + r * LD + c), k16 + o);
        cp_async16(smem_addr(Vs + r * LD + c), v16 + o);
    }
    cp_async_commit();

    /* queries [qmin, qmax] see some key of the block; tiles of QT of them for each head of the group */
    const int qmin = k0, qmax = window > 0 && kmax + window - 1 < n - 1 ? kmax + window - 1 : n - 1;
    const int per_head = (qmax - qmin) / QT + 1, ntiles = per_head * a.G;
    auto load_tile = [&](int it, int stage) {
        const int h = kvh * a.G + it / per_head, t0 = qmin + (it % per_head) * QT;
        __nv_bfloat16 *qs = Qs + stage * QT * LD, *os = Os + stage * QT * LD;
        for (int i = tid; i < QT * D / 8; i += FB_THREADS) {
            const int r = i / (D / 8), c = (i % (D / 8)) * 8, t = t0 + r < qmax ? t0 + r : qmax;
            const int64_t o = ((int64_t)b * a.T + t) * HD + (int64_t)h * D + c;
            cp_async16(smem_addr(qs + r * LD + c), q16 + o);
            cp_async16(smem_addr(os + r * LD + c), do16 + o);
        }
        const int64_t si = ((int64_t)b * a.H + h) * a.T;
        for (int r = tid; r < QT; r += FB_THREADS) {
            const int t = t0 + r < qmax ? t0 + r : qmax;
            Ls[stage * QT + r] = lse[si + t];
            Ds[stage * QT + r] = dsum[si + t];
        }
        cp_async_commit();
    };

    const int wkey = k0 + warp * 16, key0 = wkey + g, key1 = key0 + 8;
    float adk[ND][4], adv[ND][4];
    acc_zero(adk);
    acc_zero(adv);

    load_tile(0, 0);
    for (int it = 0; it < ntiles; it++) {
        const int t0 = qmin + (it % per_head) * QT;
        cp_async_turn(it + 1 < ntiles, [&] { load_tile(it + 1, (it + 1) & 1); });
        const int st = it & 1;
        const __nv_bfloat16 *qs = Qs + st * QT * LD, *os = Os + st * QT * LD;
        const float *ls = Ls + st * QT, *ds = Ds + st * QT;
        const int tlast = t0 + QT - 1 < qmax ? t0 + QT - 1 : qmax;
        const bool live = wkey <= kmax && wkey <= tlast && (window <= 0 || t0 < wkey + 15 + window);
        if (live) {
            float s[NQ][4], dp[NQ][4];
            mma_abt<D, NQ>(s, Ks, warp * 16, qs, LD);
            mma_abt<D, NQ>(dp, Vs, warp * 16, os, LD);
#pragma unroll
            for (int j = 0; j < NQ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = 8 * j + 2 * tq + (e & 1), t = t0 + c, key = e / 2 ? key1 : key0;
                    const bool vis = t <= qmax && key <= kmax && att_sees(t, key, window);
                    att_grad(s[j][e], dp[j][e], vis, ls[c], ds[c], a.softcap);
                }
            /* dV += P^T dO and dK += dS^T Qs: the accumulators are the A operands, dO and Qs [queries][D]
             * the B operands (queries as k) */
            mma_acc_pt<QT, ND>(adv, s, os, LD);
            mma_acc_pt<QT, ND>(adk, dp, qs, LD);
        }
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = r ? key1 : key0;
        if (key > kmax) continue;
        const int64_t o = ((int64_t)b * a.T + key) * KD + (int64_t)kvh * D;
        att_add_row(dk + o, adk, r, 1.0f);
        att_add_row(dv + o, adv, r, 1.0f);
    }
}

/* dsum [a.B, H, T] = dO . O of each row and head (0 for padding rows), and do16 = dO narrowed to bf16 (every
 * row): a warp a row and head; dout [B*T, H*D] f32, O the forward's output (f32, or bf16 as the tape keeps
 * it).  One read of dO for both. */
template <typename O>
__global__ void k_fa_dsum(float *__restrict__ dsum, __nv_bfloat16 *__restrict__ do16, const float *__restrict__ dout,
                          const O *__restrict__ o, const att_arg a) {
    const int64_t w = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32; /* (b, h, t) */
    if (w >= (int64_t)a.B * a.H * a.T) return;
    const int t = (int)(w % a.T), h = (int)(w / a.T % a.H), b = (int)(w / a.T / a.H), lane = threadIdx.x % 32;
    const int64_t r = ((int64_t)b * a.T + t) * a.H * a.D + (int64_t)h * a.D;
    const bool live = t < a.s[b].n_new;
    float d = 0.f;
    for (int i = lane; i < a.D; i += 32) {
        const float x = dout[r + i];
        do16[r + i] = __float2bfloat16(x);
        if (live) d += x * cuda_ld_f(o + r + i);
    }
    d = cuda_warp_sum(d);
    if (lane == 0) dsum[w] = d;
}

/* dst = bf16(src * scale): q kept as bf16, scaled as the forward's flash kernel scales it; eight values a
 * thread a step (n a multiple of 8, both 16-byte aligned: the scratch and a keep's rows of H*D) */
__global__ void k_fa_scale_bf16(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int64_t n, float scale) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n / 8; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 u = ((const uint4 *)src)[i];
        uint32_t *w = (uint32_t *)&u;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const float2 f = __bfloat1622float2(*(const __nv_bfloat162 *)&w[k]);
            const __nv_bfloat162 r = __floats2bfloat162_rn(f.x * scale, f.y * scale);
            w[k] = *(const uint32_t *)&r;
        }
        ((uint4 *)dst)[i] = u;
    }
}

template <int D, int KT, int QT>
static lmx_status fb_launch(cuda_backend *cb, const att_arg &a, const __nv_bfloat16 *q16, const __nv_bfloat16 *k16,
                            const __nv_bfloat16 *v16, const __nv_bfloat16 *do16, const float *lse, const float *dsum,
                            float *dq, float *dk, float *dv) {
    const size_t s1 = fa_dq_smem<D, KT>(), s2 = fa_dkdv_smem<D, QT>(); /* allowed by cuda_flash_bwd_init */
    /* blocks run in order of x, then y: y is the tile, so that every head's and sequence's longest tiles
     * start first and the short ones fill the tail (the causal work of a tile falls linearly with it) */
    const unsigned tiles = (unsigned)((a.T + FB_ROWS - 1) / FB_ROWS);
    k_fa_dq<D, KT><<<dim3(a.H * a.B, tiles), FB_THREADS, s1, cb->stream>>>(q16, k16, v16, do16, lse, dsum, dq, a);
    lmx_status st = cuda_check_launch(cb, "attention backward");
    if (st) return st;
    k_fa_dkdv<D, QT><<<dim3(a.Hk * a.B, tiles), FB_THREADS, s2, cb->stream>>>(q16, k16, v16, do16, lse, dsum, dk, dv, a);
    return cuda_check_launch(cb, "attention backward");
}

/* The tiles of head dim D: keys 64 rows for dQ; queries 64 rows for dK dV, 32 for D = 128 (shared memory). */
constexpr int FB_KT = 64;
template <int D> constexpr int fb_qt() { return D == 128 ? 32 : 64; }

template <int D> static void fb_allow() {
    cudaFuncSetAttribute(k_fa_dq<D, FB_KT>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_dq_smem<D, FB_KT>());
    cudaFuncSetAttribute(k_fa_dkdv<D, fb_qt<D>()>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         (int)fa_dkdv_smem<D, fb_qt<D>()>());
}
void cuda_flash_bwd_init(void) { /* every instance cuda_flash_attention_bwd launches */
    fb_allow<32>(), fb_allow<64>(), fb_allow<128>();
    cudaGetLastError();
}

lmx_status cuda_attn_fresh_clear(cuda_backend *cb, float *dq, float *dk, float *dv, int64_t HD, int64_t KD, int64_t r0,
                                 int64_t r1, unsigned fresh) {
    float *const d[3] = {dq, dk, dv};
    const int64_t w[3] = {HD, KD, KD};
    for (int i = 0; i < 3 && r1 > r0; i++) {
        if (!(fresh & (1u << i))) continue;
        const cudaError_t e = cudaMemsetAsync(d[i] + r0 * w[i], 0, (size_t)((r1 - r0) * w[i]) * sizeof(float), cb->stream);
        if (e != cudaSuccess) return cuda_fail(cb, e, "attention backward");
    }
    return LMX_OK;
}

lmx_status cuda_flash_attention_bwd(cuda_backend *cb, const lmx_attn_args *args, const int *windows, const float *dout,
                                    float *dq, float *dk, float *dv, unsigned fresh) {
    const lmx_batch *bt = args->batch;
    const int D = args->D, T = bt->T;
    if (D != 32 && D != 64 && D != 128) return LMX_ERR_UNSUPPORTED;
    const int saved = args->lse && args->out; /* the forward's log-sum-exp and output: no second forward */
    const lmx_tensor *in[3] = {args->q, args->k, args->v};
    for (int i = 0; i < 3; i++) /* bf16 keeps are read as they are with saved only (STATS reads f32 q) */
        if (in[i]->dtype != LMX_DTYPE_F32 && (!saved || in[i]->dtype != LMX_DTYPE_BF16)) return LMX_ERR_UNSUPPORTED;
    if (saved && args->out->dtype != LMX_DTYPE_F32 && args->out->dtype != LMX_DTYPE_BF16) return LMX_ERR_UNSUPPORTED;
    const int64_t HD = (int64_t)args->H * D, KD = (int64_t)args->Hk * D;
    const int nb = bt->B < ATT_SEQ_MAX ? bt->B : ATT_SEQ_MAX; /* sequences per launch */
    const int64_t nq = nb * (int64_t)T * HD, nk = nb * (int64_t)T * KD, ns = (int64_t)nb * args->H * T;
    /* scratch: q and dO narrowed, k and v where they are not bf16 keeps, L and D */
    const int64_t nk16 = args->k->dtype == LMX_DTYPE_BF16 ? 0 : nk, nv16 = args->v->dtype == LMX_DTYPE_BF16 ? 0 : nk;
    __nv_bfloat16 *q16 = (__nv_bfloat16 *)cuda_scratch(cb, CUDA_SCRATCH_BWD, (size_t)(2 * nq + nk16 + nv16) * 2 + ns * 8);
    if (!q16) return cb->base.err.status;
    __nv_bfloat16 *do16 = q16 + nq, *k16 = do16 + nq, *v16 = k16 + nk16;
    float *lse = (float *)(v16 + nv16), *dsum = lse + ns;
    att_arg a;
    a.T = T, a.H = args->H, a.Hk = args->Hk, a.D = D, a.G = args->H / args->Hk;
    a.gmax = a.G, a.hchunks = 1, a.splits = 1, a.scale = args->scale, a.softcap = args->softcap, a.dyn = NULL;
    a.fresh = (int)fresh; /* the warpgroup kernels write what it marks */
    lmx_status st = LMX_OK;
    for (int b0 = 0; b0 < bt->B && !st; b0 += nb) {
        a.B = bt->B - b0 < nb ? bt->B - b0 : nb;
        for (int b = 0; b < a.B; b++)
            a.s[b] = (att_seq){NULL, NULL, 0, bt->n_new[b0 + b], 1, 0, windows ? windows[b0 + b] : 0};
        const int64_t r0 = (int64_t)b0 * T, mq = a.B * (int64_t)T * HD, mk = a.B * (int64_t)T * KD;
        const float *o = dout + r0 * HD;
        /* q scaled to bf16; k and v bf16 (a bf16 keep is read in place); dO to bf16 */
        const __nv_bfloat16 *kb = k16, *vb = v16;
        if (args->q->dtype == LMX_DTYPE_BF16) {
            k_fa_scale_bf16<<<cuda_ew_grid(mq / 8), 256, 0, cb->stream>>>(q16, (const __nv_bfloat16 *)args->q->data + r0 * HD,
                                                                     mq, a.scale);
            st = cuda_check_launch(cb, "attention backward");
        } else {
            st = cuda_narrow_bf16_scaled(cb, q16, (const float *)args->q->data + r0 * HD, mq, a.scale);
        }
        if (!st && !saved) st = cuda_narrow_bf16(cb, do16, o, mq); /* else with dsum, below */
        if (!st && args->k->dtype == LMX_DTYPE_BF16) kb = (const __nv_bfloat16 *)args->k->data + r0 * KD;
        else if (!st) st = cuda_narrow_bf16(cb, k16, (const float *)args->k->data + r0 * KD, mk);
        if (!st && args->v->dtype == LMX_DTYPE_BF16) vb = (const __nv_bfloat16 *)args->v->data + r0 * KD;
        else if (!st) st = cuda_narrow_bf16(cb, v16, (const float *)args->v->data + r0 * KD, mk);
        const float *ls = lse;
        if (!st && saved) { /* L as the forward wrote it, D from its output (and dO narrowed) */
            ls = (const float *)args->lse->data + r0 * a.H;
            const unsigned blocks = (unsigned)((a.B * (int64_t)a.H * T + 7) / 8);
            if (args->out->dtype == LMX_DTYPE_BF16)
                k_fa_dsum<<<blocks, 256, 0, cb->stream>>>(dsum, do16, o, (const __nv_bfloat16 *)args->out->data + r0 * HD,
                                                          a);
            else
                k_fa_dsum<<<blocks, 256, 0, cb->stream>>>(dsum, do16, o, (const float *)args->out->data + r0 * HD, a);
            st = cuda_check_launch(cb, "attention backward");
        } else if (!st) {
            st = cuda_flash_stats(cb, a, (const float *)args->q->data + r0 * HD, kb, vb, o, lse, dsum);
        }
        if (st) break;
        float *gq = dq + r0 * HD, *gk = dk + r0 * KD, *gv = dv + r0 * KD;
        for (int b = 0; b < a.B && !st; b++) { /* a fresh gradient's padding rows: no kernel writes them */
            const int64_t p0 = (int64_t)b * T + a.s[b].n_new, p1 = (int64_t)(b + 1) * T;
            st = cuda_attn_fresh_clear(cb, gq, gk, gv, HD, KD, p0, p1, fresh);
        }
        if (!st) st = cuda_flash_bwd_wg(cb, a, q16, kb, vb, do16, ls, dsum, gq, gk, gv);
        if (st != LMX_ERR_UNSUPPORTED) continue;
        /* the kernels below add: a fresh gradient's rows cleared first */
        if ((st = cuda_attn_fresh_clear(cb, gq, gk, gv, HD, KD, 0, (int64_t)a.B * T, fresh))) break;
        switch (D) {
        case 32: st = fb_launch<32, FB_KT, fb_qt<32>()>(cb, a, q16, kb, vb, do16, ls, dsum, gq, gk, gv); break;
        case 64: st = fb_launch<64, FB_KT, fb_qt<64>()>(cb, a, q16, kb, vb, do16, ls, dsum, gq, gk, gv); break;
        default: st = fb_launch<128, FB_KT, fb_qt<128>()>(cb, a, q16, kb, vb, do16, ls, dsum, gq, gk, gv); break;
        }
    }
    return st;
}
