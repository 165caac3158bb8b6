/* cuda_flash_bwd_wg.cu - attention backward on Hopper's warpgroup MMA (wgmma), head dims 64 and 128.
 *
 * The same two passes as cuda_flash_bwd.cu's mma.sync kernels (which take other head dims and GPUs), with
 * the same arithmetic: products of bf16 operands accumulated in f32, P and dS rounded to bf16 where they
 * become operands, one += into dq / dk / dv at the end (no atomics: the same bits every run).  What changes
 * is the tile a product takes: a warpgroup (4 warps) multiplies 64 rows at once with its B operand read
 * once from shared memory, where mma.sync had each warp read it again for its 16 rows (the old kernels'
 * limit: shared-memory reads of B).  A block is WB_W warpgroups sharing the tiles they read.
 *   k_wg_dkdv, key-major (a block: 64 keys of one kv head a warpgroup): for each query head of the group and
 *     tile of 64 queries, S^T = K Qs^T and dP^T = V dO^T (A and B from shared memory), then dV += P^T dO
 *     (issued as soon as P is known, while dP finishes) and dK += dS^T Qs (P^T and dS^T from registers, dO
 *     and Qs read transposed).
 *   k_wg_dq, query-major (a block: 64 query rows of one head a warpgroup): for each tile of 64 keys, S = Qs
 *     K^T and dP = dO V^T, then dQ += dS K.
 * Tiles are double-buffered by cp.async into the swizzled layout of cuda_wgmma.h.  Tiles whose scores are all
 * visible skip the mask; a soft-cap is a template parameter (its tanh otherwise costs every score). */
#include "cuda_attention.h"
#include "cuda_wgmma.h"

#define LOG2E 1.4426950408889634f
#define WB_W 1 /* warpgroups a block: two sharing their tiles ran no faster on the H100 (one block of 8 warps a
                  multiprocessor instead of two of 4) */

template <int D, int W> constexpr size_t wg_dkdv_smem() { /* K, V [64 W][D]; Qs, dO [2][64][D]; L, D [2][64] */
    return (size_t)2 * (2 * 64 * W * D + 4 * WB_TILE * D) + 4 * 4 * WB_TILE + 1024;
}
template <int D, int W> constexpr size_t wg_dq_smem() { /* Qs, dO [64 W][D]; K, V [2][64][D] */
    return (size_t)2 * (2 * 64 * W * D + 4 * WB_TILE * D) + 1024;
}

/* P of each score in place of its scaled score s: att_grad's first half, with L2 = L log2(e) of the score's
 * query (stat(j, e, L2, D)) and, with MASK, vis(j, e) (a tile whose scores are all visible skips it).
 * Without a soft-cap only s is read: dP may still be on its way. */
template <bool CAP, bool MASK, class V, class S>
static __device__ __forceinline__ void wb_probs(float (&s)[8][4], float cap, V &&vis, S &&stat) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float L2, Dq;
            stat(j, e, L2, Dq);
            const float x = CAP ? cap * tanhf(s[j][e] / cap) : s[j][e];
            const float p = exp2f(fmaf(x, LOG2E, -L2));
            s[j][e] = !MASK || vis(j, e) ? p : 0.0f;
        }
}

/* dS of each score in place of dp, P in s (0 where not visible): att_grad's second half; with a soft-cap the
 * capped score again from the raw one, x0 (the scores before wb_probs). */
template <bool CAP, class S>
static __device__ __forceinline__ void wb_dscores(float (&dp)[8][4], const float (&s)[8][4], const float (&x0)[8][4],
                                                  float cap, S &&stat) {
#pragma unroll
    for (int j = 0; j < 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float L2, Dq;
            stat(j, e, L2, Dq);
            float ds = s[j][e] * (dp[j][e] - Dq);
            if constexpr (CAP) {
                const float c = tanhf(x0[j][e] / cap);
                ds *= 1.0f - c * c;
            }
            dp[j][e] = ds;
        }
}

/* The scores' P and dS for a tile, masked or not: S and dP were committed as two groups (S first).
 * Without a soft-cap P is computed while dP finishes; after_p(s) runs between, committing AFTER groups of
 * its own (dkdv: dV += P^T dO). */
template <bool CAP, int AFTER, class V, class S, class A>
static __device__ __forceinline__ void wb_grads(float (&s)[8][4], float (&dp)[8][4], bool masked, float cap, V &&vis,
                                                S &&stat, A &&after_p) {
    float x0[8][4];
    if constexpr (CAP) {
        wg_wait<0>();
        wg_hold(s);
        wg_hold(dp);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) x0[j][e] = s[j][e];
    } else {
        wg_wait<1>();
        wg_hold(s);
    }
    if (masked) wb_probs<CAP, true>(s, cap, vis, stat);
    else wb_probs<CAP, false>(s, cap, vis, stat);
    after_p(s);
    if constexpr (!CAP) {
        wg_wait<AFTER>(); /* dP: every group but after_p's */
        wg_hold(dp);
    }
    wb_dscores<CAP>(dp, s, x0, cap, stat);
}

template <int D, int W, bool CAP>
__global__ void __launch_bounds__(128 * W, 2 / W)
    k_wg_dkdv(const __nv_bfloat16 *__restrict__ q16, const __nv_bfloat16 *__restrict__ k16,
              const __nv_bfloat16 *__restrict__ v16, const __nv_bfloat16 *__restrict__ do16, const float *__restrict__ lse,
              const float *__restrict__ dsum, float *__restrict__ dk, float *__restrict__ dv, const att_arg a) {
#ifdef CUDA_WGMMA
    constexpr int R = 64 * W, NT = 128 * W;
    extern __shared__ unsigned char wb_raw[];
    __nv_bfloat16 *Ks = (__nv_bfloat16 *)wb_smem_base(wb_raw); /* [R][D] */
    __nv_bfloat16 *Vs = Ks + R * D;                             /* [R][D] */
    __nv_bfloat16 *Qs = Vs + R * D;                             /* [2][64][D] */
    __nv_bfloat16 *Os = Qs + 2 * WB_TILE * D;                   /* dO [2][64][D] */
    float *Ls = (float *)(Os + 2 * WB_TILE * D);                /* [2][64]: L log2(e) */
    float *Ds = Ls + 2 * WB_TILE;                               /* [2][64] */
    const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int k0 = blockIdx.y * R, kvh = blockIdx.x % a.Hk, b = blockIdx.x / a.Hk; /* the longest first */
    const int n = a.s[b].n_new, window = a.s[b].window;
    if (k0 >= n) return;
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int kmax = k0 + R - 1 < n - 1 ? k0 + R - 1 : n - 1;
    const int64_t kvo = (int64_t)b * a.T * KD + (int64_t)kvh * D;
    wb_load<D, R, NT>(Ks, k16 + kvo, KD, k0, kmax);
    wb_load<D, R, NT>(Vs, v16 + kvo, KD, k0, kmax);
    cp_async_commit();

    /* queries [qmin, qmax] see some key of the block; tiles of 64 of them for each head of the group */
    const int qmin = k0, qmax = window > 0 && kmax + window - 1 < n - 1 ? kmax + window - 1 : n - 1;
    const int per_head = (qmax - qmin) / WB_TILE + 1, ntiles = per_head * a.G;
    auto load_tile = [&](int it, int st) {
        const int h = kvh * a.G + it / per_head, t0 = qmin + (it % per_head) * WB_TILE;
        const int64_t qo = (int64_t)b * a.T * HD + (int64_t)h * D, si = ((int64_t)b * a.H + h) * a.T;
        wb_load<D, WB_TILE, NT>(Qs + st * WB_TILE * D, q16 + qo, HD, t0, qmax);
        wb_load<D, WB_TILE, NT>(Os + st * WB_TILE * D, do16 + qo, HD, t0, qmax);
        for (int r = tid; r < WB_TILE; r += NT) {
            const int t = t0 + r < qmax ? t0 + r : qmax;
            Ls[st * WB_TILE + r] = lse[si + t] * LOG2E;
            Ds[st * WB_TILE + r] = dsum[si + t];
        }
        cp_async_commit();
    };

    const int wkey = k0 + 64 * wg, key0 = wkey + 16 * warp + g, key1 = key0 + 8; /* the warpgroup's keys */
    const uint32_t ks = smem_addr(Ks) + wg * 64 * 128, vs = smem_addr(Vs) + wg * 64 * 128;
    float adk[D / 8][4], adv[D / 8][4];
    acc_zero(adk);
    acc_zero(adv);

    load_tile(0, 0);
    for (int it = 0; it < ntiles; it++) {
        const int t0 = qmin + (it % per_head) * WB_TILE, st = it & 1;
        wb_turn(it + 1 < ntiles, [&] { load_tile(it + 1, st ^ 1); });
        const uint32_t qs = smem_addr(Qs + st * WB_TILE * D), os = smem_addr(Os + st * WB_TILE * D);
        const float *ls = Ls + st * WB_TILE, *ds = Ds + st * WB_TILE;
        const int tlast = t0 + WB_TILE - 1 < qmax ? t0 + WB_TILE - 1 : qmax;
        if (wkey <= kmax && wkey <= tlast && (window <= 0 || t0 < wkey + 63 + window)) { /* the group's keys */
            /* every score visible: the group's keys all exist, precede the tile's first query, and sit in the
             * last query's window; the tile's queries all exist */
            const bool masked = !(wkey + 63 <= kmax && wkey + 63 <= t0 && t0 + WB_TILE - 1 <= qmax &&
                                  (window <= 0 || wkey > t0 + WB_TILE - 1 - window));
            float s[8][4], dp[8][4];
            wg_fence();
            wb_abt<D>(s, ks, R * 128, qs, WB_TILE * 128);
            wg_commit();
            wb_abt<D>(dp, vs, R * 128, os, WB_TILE * 128);
            wg_commit();
            uint32_t pa[4][4], sa[4][4];
            wb_grads<CAP, 1>(
                s, dp, masked, a.softcap,
                [&](int j, int e) {
                    const int t = t0 + 8 * j + 2 * tq + (e & 1), key = e / 2 ? key1 : key0;
                    return t <= qmax && key <= kmax && att_sees(t, key, window);
                },
                [&](int j, int e, float &L2, float &Dq) {
                    const int c = 8 * j + 2 * tq + (e & 1);
                    L2 = ls[c], Dq = ds[c];
                },
                [&](const float (&p)[8][4]) { /* dV += P^T dO while dP finishes */
#pragma unroll
                    for (int kk = 0; kk < 4; kk++) acc_to_a(pa[kk], p[2 * kk], p[2 * kk + 1]);
                    wg_fence();
                    wb_acc<D>(adv, pa, os);
                    wg_commit();
                });
#pragma unroll
            for (int kk = 0; kk < 4; kk++) acc_to_a(sa[kk], dp[2 * kk], dp[2 * kk + 1]);
            wg_fence();
            wb_acc<D>(adk, sa, qs); /* dK += dS^T Qs */
            wg_commit();
            wg_wait<0>();
            wg_hold(adv);
            wg_hold(adk);
        }
        __syncthreads(); /* the stage is refilled next turn */
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = r ? key1 : key0;
        if (key > kmax) continue;
        const int64_t o = ((int64_t)b * a.T + key) * KD + (int64_t)kvh * D;
        att_add_row(dk + o, adk, r, 1.0f, !(a.fresh & 2));
        att_add_row(dv + o, adv, r, 1.0f, !(a.fresh & 4));
    }
#endif
}

template <int D, int W, bool CAP>
__global__ void __launch_bounds__(128 * W, 2 / W)
    k_wg_dq(const __nv_bfloat16 *__restrict__ q16, const __nv_bfloat16 *__restrict__ k16,
            const __nv_bfloat16 *__restrict__ v16, const __nv_bfloat16 *__restrict__ do16, const float *__restrict__ lse,
            const float *__restrict__ dsum, float *__restrict__ dq, const att_arg a) {
#ifdef CUDA_WGMMA
    constexpr int R = 64 * W, NT = 128 * W;
    extern __shared__ unsigned char wb_raw[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)wb_smem_base(wb_raw); /* [R][D] */
    __nv_bfloat16 *Os = Qs + R * D;                             /* dO [R][D] */
    __nv_bfloat16 *Ks = Os + R * D;                             /* [2][64][D] */
    __nv_bfloat16 *Vs = Ks + 2 * WB_TILE * D;                   /* [2][64][D] */
    const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int t0 = (gridDim.y - 1 - blockIdx.y) * R; /* the longest tiles first */
    const int h = blockIdx.x % a.H, b = blockIdx.x / a.H, kvh = h / a.G;
    const int n = a.s[b].n_new, window = a.s[b].window;
    if (t0 >= n) return;
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    const int tmax = t0 + R - 1 < n - 1 ? t0 + R - 1 : n - 1;
    const int64_t qo = (int64_t)b * a.T * HD + (int64_t)h * D, kvo = (int64_t)b * a.T * KD + (int64_t)kvh * D;
    wb_load<D, R, NT>(Qs, q16 + qo, HD, t0, tmax);
    wb_load<D, R, NT>(Os, do16 + qo, HD, t0, tmax);
    cp_async_commit();

    const int pmin = window > 0 && t0 - window + 1 > 0 ? t0 - window + 1 : 0, pmax = tmax;
    const int ntiles = (pmax - pmin) / WB_TILE + 1;
    auto load_tile = [&](int p0, int st) {
        wb_load<D, WB_TILE, NT>(Ks + st * WB_TILE * D, k16 + kvo, KD, p0, pmax);
        wb_load<D, WB_TILE, NT>(Vs + st * WB_TILE * D, v16 + kvo, KD, p0, pmax);
        cp_async_commit();
    };

    const int wrow = t0 + 64 * wg, pos0 = wrow + 16 * warp + g, pos1 = pos0 + 8; /* the warpgroup's rows */
    const bool ok0 = pos0 < n, ok1 = pos1 < n;
    const int wlast = wrow + 63 < n - 1 ? wrow + 63 : n - 1;
    const int64_t si = ((int64_t)b * a.H + h) * a.T;
    const float L0 = ok0 ? lse[si + pos0] * LOG2E : 0.f, L1 = ok1 ? lse[si + pos1] * LOG2E : 0.f;
    const float D0 = ok0 ? dsum[si + pos0] : 0.f, D1 = ok1 ? dsum[si + pos1] : 0.f;
    const uint32_t qs = smem_addr(Qs) + wg * 64 * 128, os = smem_addr(Os) + wg * 64 * 128;
    float acc[D / 8][4];
    acc_zero(acc);

    load_tile(pmin, 0);
    for (int it = 0; it < ntiles; it++) {
        const int p0 = pmin + it * WB_TILE, st = it & 1;
        wb_turn(it + 1 < ntiles, [&] { load_tile(p0 + WB_TILE, st ^ 1); });
        const uint32_t ks = smem_addr(Ks + st * WB_TILE * D), vs = smem_addr(Vs + st * WB_TILE * D);
        if (wrow < n && p0 <= wlast && (window <= 0 || p0 + WB_TILE - 1 > wrow - window)) {
            /* every score visible: the group's rows all exist, the tile's last key precedes its first row,
             * and the tile's first key sits in its last row's window */
            const bool masked = !(wrow + 63 < n && p0 + WB_TILE - 1 <= wrow &&
                                  (window <= 0 || p0 > wrow + 63 - window));
            float s[8][4], dp[8][4];
            wg_fence();
            wb_abt<D>(s, qs, R * 128, ks, WB_TILE * 128);
            wg_commit();
            wb_abt<D>(dp, os, R * 128, vs, WB_TILE * 128);
            wg_commit();
            wb_grads<CAP, 0>(
                s, dp, masked, a.softcap,
                [&](int j, int e) {
                    const int row = e / 2, p = p0 + 8 * j + 2 * tq + (e & 1);
                    return (row ? ok1 : ok0) && att_sees(row ? pos1 : pos0, p, window);
                },
                [&](int j, int e, float &L2, float &Dq) {
                    (void)j;
                    L2 = e / 2 ? L1 : L0, Dq = e / 2 ? D1 : D0;
                },
                [](const float (&)[8][4]) {});
            uint32_t sa[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++) acc_to_a(sa[kk], dp[2 * kk], dp[2 * kk + 1]);
            wg_fence();
            wb_acc<D>(acc, sa, ks); /* dQ += dS K */
            wg_commit();
            wg_wait<0>();
            wg_hold(acc);
        }
        __syncthreads();
    }

    float *o0 = dq + ((int64_t)b * a.T + pos0) * HD + (int64_t)h * D;
    if (ok0) att_add_row(o0, acc, 0, a.scale, !(a.fresh & 1));
    if (ok1) att_add_row(o0 + 8 * HD, acc, 1, a.scale, !(a.fresh & 1));
#endif
}

template <int D, int W, bool CAP>
static lmx_status wb_launch(cuda_backend *cb, const att_arg &a, const __nv_bfloat16 *q16, const __nv_bfloat16 *k16,
                            const __nv_bfloat16 *v16, const __nv_bfloat16 *do16, const float *lse, const float *dsum,
                            float *dq, float *dk, float *dv) {
    const unsigned tiles = (unsigned)((a.T + 64 * W - 1) / (64 * W));
    k_wg_dq<D, W, CAP><<<dim3(a.H * a.B, tiles), 128 * W, wg_dq_smem<D, W>(), cb->stream>>>(q16, k16, v16, do16, lse,
                                                                                           dsum, dq, a);
    lmx_status st = cuda_check_launch(cb, "attention backward");
    if (st) return st;
    k_wg_dkdv<D, W, CAP><<<dim3(a.Hk * a.B, tiles), 128 * W, wg_dkdv_smem<D, W>(), cb->stream>>>(q16, k16, v16, do16,
                                                                                                lse, dsum, dk, dv, a);
    return cuda_check_launch(cb, "attention backward");
}

template <int D, int W>
static lmx_status wb_cap(cuda_backend *cb, const att_arg &a, const __nv_bfloat16 *q16, const __nv_bfloat16 *k16,
                         const __nv_bfloat16 *v16, const __nv_bfloat16 *do16, const float *lse, const float *dsum,
                         float *dq, float *dk, float *dv) {
    return a.softcap > 0 ? wb_launch<D, W, true>(cb, a, q16, k16, v16, do16, lse, dsum, dq, dk, dv)
                         : wb_launch<D, W, false>(cb, a, q16, k16, v16, do16, lse, dsum, dq, dk, dv);
}

lmx_status cuda_flash_bwd_wg(cuda_backend *cb, const att_arg &a, const __nv_bfloat16 *q16, const __nv_bfloat16 *k16,
                             const __nv_bfloat16 *v16, const __nv_bfloat16 *do16, const float *lse, const float *dsum,
                             float *dq, float *dk, float *dv) {
    if (!cb->wgmma) return LMX_ERR_UNSUPPORTED;
    if (a.D == 128) return wb_cap<128, WB_W>(cb, a, q16, k16, v16, do16, lse, dsum, dq, dk, dv);
    if (a.D == 64) return wb_cap<64, WB_W>(cb, a, q16, k16, v16, do16, lse, dsum, dq, dk, dv);
    return LMX_ERR_UNSUPPORTED;
}

template <int D, int W, bool CAP> static void wb_allow() {
    cudaFuncSetAttribute(k_wg_dq<D, W, CAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_dq_smem<D, W>());
    cudaFuncSetAttribute(k_wg_dkdv<D, W, CAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)wg_dkdv_smem<D, W>());
}
void cuda_flash_bwd_wg_init(void) {
    wb_allow<64, WB_W, false>(), wb_allow<64, WB_W, true>(), wb_allow<128, WB_W, false>(), wb_allow<128, WB_W, true>();
    cudaGetLastError();
}
