/* cuda_attention.cu - causal attention of new query rows over cached (bf16) and new (f32) keys,
 * and appending new keys/values to the caches.  Calls of 32 or more rows per sequence (prefill) go
 * to the tensor-core kernel of cuda_flash.cu; this file's kernel serves decode steps and short calls.
 *
 * Flash-decoding layout: a block of 4 or 8 warps (launch_dpl) takes one query row, one kv head (gmax
 * of its G query heads, up to four (att_gmax) where the GPU is filled anyway, so that each key/value row
 * is loaded once per four heads: cuda_attention_plan) and one split of that row's visible keys.
 * Each warp walks keys with an online softmax, lanes holding strided dims of q, k, v; the warps'
 * partial (max, sum, acc) merge in shared memory.  With several splits the block writes its
 * partial to scratch and a second kernel merges the splits.  Scores never leave registers, so
 * no T x T matrix exists anywhere.  Query row i = n_past + t sees positions j with j <= i (and
 * i - j < window): the cached ones still held (slot j % cap), then this call's new rows. */
#include <math.h>

#include "cuda_attention.h"

#define ATT_WARPS 4            /* a block's warps, but where launch_dpl takes eight */
#define ATT_DMAX 512           /* head dims above 256 (Gemma 4's global layers): half the heads a block */
#define ATT_PLAN_TC (1 << 16)  /* cuda_attention_plan: the tensor cores' decode kernel (cuda_flash_decode.cu) */

/* Query heads a block at most (cb->att_gmax, 4 unless LMX_CUDA_ATT_GMAX says; half for heads over 256 wide).  Eight
 * heads of 128 (Qwen3-30B-A3B's groups) took 255 registers and spilled: at a context of 4,096 its 12-layer file
 * decoded one row at 1,044 tok/s and 32 rows at 3,713; with four heads a block 1,357 and 5,491 (H200), and with
 * two 1,402 and 4,576. */
static int att_gmax(const cuda_backend *cb, int D) { return D > 256 ? cb->att_gmax / 2 : cb->att_gmax; }

/* Online-softmax update of GM heads with KB keys (the first nvalid count).  Up to 32 (key, head) scores a step: each
 * summed over the warp into one lane (cuda_warp_sums_scattered: lane l holds score l % N; 31 shuffles, not the 160 of
 * a butterfly each), which alone takes its soft-cap, mask and probability; the heads' maxima over the step's keys and
 * the probabilities are then fetched by every lane.  Every lane ends with the values it had computed for itself
 * before (each sum the butterfly's tree; a max is exact in any order), so the same bits, in 70 shuffles and five
 * exponentials a lane (its probability and the heads' corrections) instead of 160 and 36 (four heads, eight keys).
 * More scores (eight heads a block, LMX_CUDA_ATT_GMAX=8): a butterfly each, and every lane takes all of them. */
template <int DPL, int GM, int KB>
__device__ __forceinline__ void att_update(const float (&qr)[GM][DPL], float (&acc)[GM][DPL], float (&m)[GM],
                                           float (&l)[GM], const float (&kf)[KB][DPL], const float (&vf)[KB][DPL],
                                           int nvalid, float softcap) {
    constexpr int N = KB * GM;
    float sc[N]; /* key u, head g: u GM + g */
#pragma unroll
    for (int u = 0; u < KB; u++)
#pragma unroll
        for (int g = 0; g < GM; g++) {
            float x = 0.0f;
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) x = fmaf(qr[g][jj], kf[u][jj], x);
            sc[u * GM + g] = x;
        }
    float mx[GM], pm = 0.0f; /* each head's new max; up to 32 scores: this lane's score's probability */
    if constexpr (N <= 32) {
        const int lane = threadIdx.x % 32, i = lane % N, gi = i % GM;
        cuda_warp_sums_scattered<16, N>(sc, lane);
        float x = sc[0];
        if (softcap > 0) x = softcap * tanhf(x / softcap);
        x = i / GM < nvalid ? x : -INFINITY;
        float mk = x; /* head gi's max over the step's keys: lanes GM, 2 GM .. apart */
#pragma unroll
        for (int o = GM; o < N; o <<= 1) mk = fmaxf(mk, __shfl_xor_sync(0xffffffffu, mk, o));
        float mo = m[0];
#pragma unroll
        for (int g = 1; g < GM; g++) mo = gi == g ? m[g] : mo;
        const float mine = fmaxf(mo, mk); /* head gi's new max */
        pm = __expf(x - mine);
#pragma unroll
        for (int g = 0; g < GM; g++) mx[g] = __shfl_sync(0xffffffffu, mine, g); /* lane g: key 0 of head g */
    } else {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
#pragma unroll
            for (int i = 0; i < N; i++) sc[i] += __shfl_xor_sync(0xffffffffu, sc[i], o);
#pragma unroll
        for (int g = 0; g < GM; g++) {
            mx[g] = m[g];
#pragma unroll
            for (int u = 0; u < KB; u++) {
                float x = sc[u * GM + g];
                if (softcap > 0) x = softcap * tanhf(x / softcap);
                x = u < nvalid ? x : -INFINITY;
                sc[u * GM + g] = x;
                mx[g] = fmaxf(mx[g], x);
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GM; g++) {
        float corr = __expf(m[g] - mx[g]);
        l[g] *= corr;
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) acc[g][jj] *= corr;
#pragma unroll
        for (int u = 0; u < KB; u++) {
            float pr;
            if constexpr (N <= 32) pr = __shfl_sync(0xffffffffu, pm, u * GM + g);
            else pr = __expf(sc[u * GM + g] - mx[g]);
            l[g] += pr;
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) acc[g][jj] = fmaf(pr, vf[u][jj], acc[g][jj]);
        }
        m[g] = mx[g];
    }
}

/* q, out [B*T, H*D]; kn, vn [B*T, Hk*D] (offset to this launch's first sequence);
 * part [rows, H, splits, D + 2] when splits > 1.  PRE: q and kn before their norm and RoPE (att_pre).  W warps
 * a block, KB keys a warp and step, GM query heads a block (a.gmax); FULL: D = 32 DPL. */
template <int DPL, int GM, int KB, bool PRE, int W, bool FULL>
__global__ void __launch_bounds__(W * 32) k_attention(const float *__restrict__ q, const float *__restrict__ kn,
                                                      const float *__restrict__ vn, float *__restrict__ out,
                                                      float *__restrict__ part, const att_arg a, const att_pre p) {
    __shared__ float sm_m[W][GM], sm_l[W][GM];
    __shared__ float sm_acc[W * GM * 32 * DPL]; /* [W][a.gmax][D] */
    const int split = blockIdx.x, row = blockIdx.z;
    const int kvh = blockIdx.y / a.hchunks, h0 = kvh * a.G + (blockIdx.y % a.hchunks) * a.gmax;
    int ng = a.G - (blockIdx.y % a.hchunks) * a.gmax;
    if (ng > a.gmax) ng = a.gmax;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int b = row / a.T, t = row % a.T, D = a.D;
    cuda_pdl_trigger();
    att_seq S = att_seq_at(a, b);
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;

    /* the visible keys of this row: n_cached from the cache, then new rows u0 .. t */
    int n = 0, n_cached = 0, c0 = 0, u0 = 0;
    if (t < S.n_new) {
        int i = S.n_past + t;
        int lo = S.window > 0 ? i - S.window + 1 : 0;
        if (lo < 0) lo = 0;
        int held = S.rotating ? (S.n_past < S.cap ? S.n_past : S.cap) : S.n_past;
        c0 = S.n_past - held > lo ? S.n_past - held : lo;
        u0 = lo > S.n_past ? lo - S.n_past : 0;
        n_cached = S.n_past - c0 > 0 ? S.n_past - c0 : 0;
        n = n_cached + (t - u0 + 1);
    }
    const int chunk = (n + a.splits - 1) / a.splits;
    const int j0 = split * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    const int jc = n_cached < j1 ? n_cached : j1;
    /* KB cached keys per warp and step (bf16); loads are unconditional (indices clamped) so that all of them are
     * in flight before the first use, and (heads up to 256 wide: registers for both) the next step's are loaded
     * while this one is used */
    unsigned short kr[KB][DPL], vr[KB][DPL];
    const int c0m = c0 % S.cap; /* key j's slot: c0m + j, less cap past it (j < n_cached <= cap): no division a key */
    /* A key's row in either cache is one address, and a lane's dims lane + 32 jj are loads at offsets from it.
     * FULL (D = 32 DPL, every dim of every lane inside the head): the address is the lane's own and the offsets are
     * fixed, so a load costs no address arithmetic (that was about a third of this loop's instructions: the decode
     * kernel is held by its issue, not by its bytes).  Else dims past the head load its last one (q is 0 there). */
    int dl[DPL];
#pragma unroll
    for (int jj = 0; jj < DPL; jj++) dl[jj] = FULL ? 32 * jj : lane + 32 * jj < D ? lane + 32 * jj : D - 1;
    const unsigned short *kc = (const unsigned short *)S.kc + (int64_t)kvh * D + (FULL ? lane : 0);
    const int64_t vkd = (const unsigned short *)S.vc - (const unsigned short *)S.kc; /* v's row from k's */
    auto load_kv = [&](int jb) {
#pragma unroll
        for (int u = 0; u < KB; u++) {
            const int j = jb + u < jc ? jb + u : jc - 1, slot = c0m + j < S.cap ? c0m + j : c0m + j - S.cap;
            const unsigned short *kp = kc + (int64_t)slot * KD, *vp = kp + vkd;
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) {
                kr[u][jj] = __ldg(kp + dl[jj]);
                vr[u][jj] = __ldg(vp + dl[jj]);
            }
        }
    };
    /* The first step's cached keys before the wait when earlier steps wrote them all: this call's appends (the
     * kernel before) go to slots past them unless a rotating cache wraps now. */
    const bool early = !S.rotating || S.n_past + S.n_new <= S.cap;
    const int jb0 = j0 + warp * KB; /* this warp's first step */
    if (early && jb0 < jc) load_kv(jb0);
    /* PRE: the rotation at this token's position and the norm weights, neither written by a kernel */
    constexpr int PW = PRE ? DPL : 1;
    float pc[PW], ps[PW], wq[PW], wk[PW];
    if constexpr (PRE) att_pre_load<DPL>(p, S.n_past + t, pc, ps, wq, wk);
    cuda_pdl_wait(); /* q, the new rows and (else) the cache come from the kernels before */
    if (!early && jb0 < jc) load_kv(jb0);
    const float *knb = kn + (int64_t)b * a.T * KD + (int64_t)kvh * D;
    const float *vnb = vn + (int64_t)b * a.T * KD + (int64_t)kvh * D;
    const int jn0 = j0 > n_cached ? j0 : n_cached;
    /* The new keys' groups of KB go round the warps from wn, the warp after the last to take a group of cached
     * keys: one with the fewest steps of the walk (warp 0 has the most).  PRE (one token): the new row, when this
     * block's split holds it, is warp wn's; its loads go out now, beside q's, and it is used after that warp's
     * cached keys, as without the fold. */
    const int wn = (jc > j0 ? (jc - j0 + KB - 1) / KB : 0) % W;
    const bool own = PRE && warp == wn && jn0 < j1;
    float kn1[PW], vn1[PW];
    if constexpr (PRE)
        if (own)
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) {
                kn1[jj] = __ldg(knb + (int64_t)u0 * KD + lane + 32 * jj);
                vn1[jj] = __ldg(vnb + (int64_t)u0 * KD + lane + 32 * jj);
            }

    float qr[GM][DPL], acc[GM][DPL], m[GM], l[GM];
#pragma unroll
    for (int g = 0; g < GM; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) {
            int d = lane + 32 * jj;
            qr[g][jj] = g < ng && d < D ? q[(int64_t)row * HD + (int64_t)(h0 + g) * D + d] : 0.0f;
            acc[g][jj] = 0.0f;
        }
        if constexpr (PRE) att_pre_head<DPL>(qr[g], p.qw != NULL, wq, p.qeps, D, p.interleaved, pc, ps);
#pragma unroll
        for (int jj = 0; jj < DPL; jj++) qr[g][jj] *= a.scale;
    }
    /* Cached keys first (bf16, loaded a step ahead), then this call's new rows (f32). */
    for (int jb = jb0; jb < jc; jb += W * KB) {
        if constexpr (DPL > 8)
            if (jb != jb0) load_kv(jb);
        float kf[KB][DPL], vf[KB][DPL];
#pragma unroll
        for (int u = 0; u < KB; u++)
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) {
                kf[u][jj] = __uint_as_float((unsigned)kr[u][jj] << 16);
                vf[u][jj] = __uint_as_float((unsigned)vr[u][jj] << 16);
            }
        if constexpr (DPL <= 8)
            if (jb + W * KB < jc) load_kv(jb + W * KB);
        att_update<DPL, GM, KB>(qr, acc, m, l, kf, vf, jc - jb, a.softcap);
    }
    if constexpr (PRE) {
        if (own) {
            float kf[KB][DPL], vf[KB][DPL]; /* the new row in every slot: att_update counts the first */
#pragma unroll
            for (int jj = 0; jj < DPL; jj++)
#pragma unroll
                for (int u = 0; u < KB; u++) kf[u][jj] = kn1[jj], vf[u][jj] = vn1[jj];
            att_pre_head<DPL>(kf[0], p.kw != NULL, wk, p.keps, D, p.interleaved, pc, ps);
            if (blockIdx.y % a.hchunks == 0) { /* the kv append, once a kv head */
                const int64_t off = (int64_t)((S.n_past + t) % S.cap) * KD + (int64_t)kvh * D;
#pragma unroll
                for (int jj = 0; jj < DPL; jj++) {
                    ((__nv_bfloat16 *)S.kc)[off + lane + 32 * jj] = __float2bfloat16(kf[0][jj]);
                    ((__nv_bfloat16 *)S.vc)[off + lane + 32 * jj] = __float2bfloat16(vf[0][jj]);
                }
            }
            att_update<DPL, GM, KB>(qr, acc, m, l, kf, vf, 1, a.softcap);
        }
    } else {
        for (int jb = jn0 + ((warp - wn + W) % W) * KB; jb < j1; jb += W * KB) {
            float kf[KB][DPL], vf[KB][DPL];
#pragma unroll
            for (int u = 0; u < KB; u++) {
                const int j = jb + u < j1 ? jb + u : j1 - 1;
                const int64_t r = (int64_t)(u0 + j - n_cached) * KD;
#pragma unroll
                for (int jj = 0; jj < DPL; jj++) {
                    int d = lane + 32 * jj < D ? lane + 32 * jj : D - 1;
                    kf[u][jj] = __ldg(knb + r + d);
                    vf[u][jj] = __ldg(vnb + r + d);
                }
            }
            att_update<DPL, GM, KB>(qr, acc, m, l, kf, vf, j1 - jb, a.softcap);
        }
    }
    /* merge the warps */
#pragma unroll
    for (int g = 0; g < GM; g++) {
        if (lane == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
#pragma unroll
        for (int jj = 0; jj < DPL; jj++)
            if (g < a.gmax && lane + 32 * jj < D) sm_acc[(warp * a.gmax + g) * D + lane + 32 * jj] = acc[g][jj];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < ng * D; idx += blockDim.x) {
        int g = idx / D, d = idx % D;
        float mx = -INFINITY;
        for (int w = 0; w < W; w++) mx = fmaxf(mx, sm_m[w][g]);
        float L = 0.0f, o = 0.0f;
        if (mx != -INFINITY)
            for (int w = 0; w < W; w++) {
                float c = __expf(sm_m[w][g] - mx);
                L += sm_l[w][g] * c;
                o += sm_acc[(w * a.gmax + g) * D + d] * c;
            }
        int h = h0 + g;
        if (a.splits == 1) {
            const float y = L > 0 ? o / L : 0.0f;
            out[(int64_t)row * HD + (int64_t)h * D + d] = y;
            if (a.o16) a.o16[(int64_t)row * HD + (int64_t)h * D + d] = __float2bfloat16(y);
        } else {
            float *p = part + (((int64_t)row * a.H + h) * a.splits + split) * (D + 2);
            p[d] = o;
            if (d == 0) { p[D] = mx; p[D + 1] = L; }
        }
    }
}

/* out[row, h, :] = merge of the splits' partials (splits <= 64), in split order. */
#define ATT_MERGE_U 16
__global__ void k_attention_merge(float *__restrict__ out, __nv_bfloat16 *__restrict__ o16, const float *__restrict__ part,
                                  int H, int D, int splits) {
    __shared__ float w[64];
    __shared__ float tot;
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int64_t rh = blockIdx.x; /* row * H + h */
    const float *p = part + rh * splits * (D + 2);
    if (threadIdx.x < 32) {
        float ms[2], ls[2], mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int s = threadIdx.x + 32 * i;
            ms[i] = s < splits ? p[s * (D + 2) + D] : -INFINITY;
            ls[i] = s < splits ? p[s * (D + 2) + D + 1] : 0.0f;
            if (!(ls[i] > 0.0f)) ms[i] = -INFINITY;
            mx = fmaxf(mx, ms[i]);
        }
        mx = cuda_warp_max(mx);
        float L = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float c = ms[i] == -INFINITY ? 0.0f : __expf(ms[i] - mx);
            w[threadIdx.x + 32 * i] = c;
            L += ls[i] * c;
        }
        L = cuda_warp_sum(L);
        if (threadIdx.x == 0) tot = L;
    }
    __syncthreads();
    const float inv = tot > 0 ? 1.0f / tot : 0.0f;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        /* the splits' values 16 at a time, all loaded before the sums (one round trip a 16, not a few splits) */
        float o = 0.0f;
        int s = 0;
        for (; s + ATT_MERGE_U <= splits; s += ATT_MERGE_U) {
            float v[ATT_MERGE_U];
#pragma unroll
            for (int j = 0; j < ATT_MERGE_U; j++) v[j] = p[(s + j) * (D + 2) + d];
#pragma unroll
            for (int j = 0; j < ATT_MERGE_U; j++) o = fmaf(v[j], w[s + j], o);
        }
        for (; s < splits; s++) o = fmaf(p[s * (D + 2) + d], w[s], o);
        out[rh * D + d] = o * inv;
        if (o16) o16[rh * D + d] = __float2bfloat16(o * inv);
    }
}

template <int DPL, bool PRE, int W, int KB, bool FULL>
static void launch_w(cuda_backend *cb, int gm, dim3 grid, const float *q, const float *k, const float *v, float *o,
                     float *part, const att_arg &a, const att_pre &p) {
    switch (gm) {
    case 1: cuda_launch(cb, k_attention<DPL, 1, KB, PRE, W, FULL>, grid, W * 32, 0, q, k, v, o, part, a, p); break;
    case 2: cuda_launch(cb, k_attention<DPL, 2, KB, PRE, W, FULL>, grid, W * 32, 0, q, k, v, o, part, a, p); break;
    case 4: /* eight warps take at most two heads (launch_dpl) */
        if constexpr (W == ATT_WARPS)
            cuda_launch(cb, k_attention<DPL, 4, KB, PRE, W, FULL>, grid, W * 32, 0, q, k, v, o, part, a, p);
        break;
    default:
        if constexpr (W == ATT_WARPS && DPL * 32 <= 256)
            cuda_launch(cb, k_attention<DPL, 8, KB, PRE, W, FULL>, grid, W * 32, 0, q, k, v, o, part, a, p);
        break;
    }
}

/* The same with FULL where the head is 32 DPL wide (always with PRE: heads of 64, 128 or 256) */
template <int DPL, bool PRE, int W, int KB>
static void launch_full(cuda_backend *cb, int gm, dim3 grid, const float *q, const float *k, const float *v, float *o,
                        float *part, const att_arg &a, const att_pre &p) {
    if (PRE || a.D == 32 * DPL) return launch_w<DPL, PRE, W, KB, true>(cb, gm, grid, q, k, v, o, part, a, p);
    if constexpr (!PRE) launch_w<DPL, PRE, W, KB, false>(cb, gm, grid, q, k, v, o, part, a, p);
}

/* The decode kernel for heads of 32 DPL values, gm query heads a block.  A block of four warps takes KB keys a
 * warp and step (eight for heads up to 128 wide, two up to 256: one step's loads in flight ahead of the one
 * used).  With at most two heads a block and heads up to 256 wide, eight warps of half as many keys each: the
 * same keys a step, twice the warps to hide their latency (H100, same call: Qwen3-0.6B at a context of 4,096
 * 949-979 -> 1,009-1,018 tok/s, one row 1,432-1,491 -> 1,491-1,499; Gemma-3-1B 755-768 -> 809-810 and 906 ->
 * 923-929).  At four heads, the 8B's long contexts, eight warps' 173 registers would leave one block a
 * multiprocessor (169.7 -> 166.4). */
template <int DPL, bool PRE>
static void launch_dpl(cuda_backend *cb, int gm, dim3 grid, const float *q, const float *k, const float *v, float *o,
                       float *part, const att_arg &a, const att_pre &p) {
    if constexpr (DPL <= 8)
        if (gm <= 2) return launch_full<DPL, PRE, 8, DPL >= 8 ? 2 : 4>(cb, gm, grid, q, k, v, o, part, a, p);
    launch_full<DPL, PRE, ATT_WARPS, DPL >= 8 ? 2 : 8>(cb, gm, grid, q, k, v, o, part, a, p);
}

/* The decode kernel's layout for sequences [b0, b0 + nb) of args: the query heads a block takes (a power of
 * two, at most att_gmax) and the splits of each row's keys, so that rows x Hk x hchunks x splits blocks fill
 * the GPU.  Keys are split first, in a power of two of splits down to 128 keys a split (each kv head's keys read
 * once a row); a context too short to fill half the multiprocessors so takes fewer query heads a block instead (a
 * decode step of 32 heads over 4 kv heads was 4 blocks of 8 heads each: 17 us of latency for a few hundred keys).
 * Keys that one split holds (at most 128 a row) leave the heads as the only way to more blocks: there the heads a
 * block halve down to 2 until the blocks fill the GPU twice (cb->att_short; H200, Qwen3-30B-A3B Q4_K_M batch 32
 * at a context under 128: 8 heads a block, 128 blocks of 4 warps, 22 us a layer; 2 heads, 512 blocks of 8 warps:
 * 3,101 -> 3,334-3,343 tok/s; 1 head 3,246-3,250).
 * One token a sequence over long contexts: the tensor cores' kernel instead (ATT_PLAN_TC, cuda_flash_decode.cu), where
 * it was measured faster (H200, Q4_K_M, tok/s against this kernel; cb->att_tc = N > 0: every step of N keys or more
 * in groups up to 16, < 0: never):
 * - from ATT_TC_KEYS (1,024) keys, 8 sequences or more in groups of 4-16 query heads, 32 or more in groups of 2,
 *   in blocks of two warps.  Qwen3-30B-A3B (12 layers, groups of 8), 32 rows at 4,096 keys 6,852 -> 9,866-9,904,
 *   8 rows 4,495 -> 5,413-5,474, 8 rows at 1,024 5,561 -> 5,706-5,727; Llama-3.1-8B (groups of 4), 32 rows at 4,096
 *   2,604 -> 3,139-3,156, 16 rows at 2,048 2,743 -> 2,966-2,969, 8 rows at 4,096 1,663 -> 1,885; Qwen3-0.6B (groups
 *   of 2), 32 rows at 4,096 4,922 -> 5,458.
 * - from ATT_TC_FEW_KEYS (8,192) keys, fewer sequences in groups of 8-16, four warps: the 12-layer mixture, one row
 *   at 8,192 keys 1,360 -> 1,420-1,432, at 16,384 1,130 -> 1,319-1,322; at 4,096 the two kernels are even (1,493 /
 *   1,476), and groups of 4 lose (the 8B, one row at 16,384: 308 -> 281). */
#define ATT_TC_KEYS 1024     /* the tensor cores from this many keys: 8 rows or more (32 in groups of 2) */
#define ATT_TC_FEW_KEYS 8192 /* ... fewer rows, in groups of 8 or more */
int cuda_attention_plan(cuda_backend *cb, const lmx_attn_args *args, int b0, int nb) {
    const lmx_batch *bt = args->batch;
    int max_n = 1;
    for (int b = 0; b < nb; b++) {
        const lmx_kv_layer *kv = args->kv[b0 + b];
        int np = bt->n_past[b0 + b];
        int held = kv->rotating ? (np < kv->cap ? np : kv->cap) : np;
        if (kv->window > 0 && held > kv->window) held = kv->window;
        if (held + bt->T > max_n) max_n = held + bt->T;
    }
    const int G = args->H / args->Hk;
    const int by_rule = (max_n >= ATT_TC_KEYS && ((G >= 4 && nb >= 8) || (G >= 2 && nb >= 32))) ||
                        (max_n >= ATT_TC_FEW_KEYS && G >= 8);
    if (cuda_flash_decode_takes(bt->T, args->D, G) && (cb->att_tc ? cb->att_tc > 0 && max_n >= cb->att_tc : by_rule)) {
        /* a power of two of splits, the fewest whose blocks fill the GPU twice, each at least a key tile, at most 64
         * (k_attention_merge) */
        const int warps = cuda_flash_decode_warps(args->D, nb < 8), kt = 16 * warps;
        const int64_t base = (int64_t)nb * args->Hk, max_splits = (max_n + kt - 1) / kt;
        int splits = 1;
        while (splits < 64 && 2 * splits <= max_splits && base * splits < 2 * cb->sm_count) splits *= 2;
        return splits | warps << 8 | ATT_PLAN_TC;
    }
    const int max_splits = (max_n + 127) / 128;
    int gmax = 1, splits;
    while (gmax < G && gmax < att_gmax(cb, args->D)) gmax *= 2;
    for (;; gmax /= 2) {
        const int64_t base = (int64_t)nb * bt->T * args->Hk * ((G + gmax - 1) / gmax);
        int fill = (int)((2 * cb->sm_count + base - 1) / base);
        if (fill > 64) fill = 64;
        /* a power of two: the fewest that give each split at most 128 keys, at most the largest that fill
         * allows; so a decode graph, which records the plan, is captured again 6 times in a context of 4096
         * (1, 2, 4 .. 32 splits), not at every 128 keys */
        for (splits = 1; splits < max_splits && 2 * splits <= fill;) splits *= 2;
        const int64_t blocks = base * splits;
        const int short_fill = cb->att_short && max_splits == 1 && gmax > 2; /* (above) */
        if (gmax == 1 || (blocks >= cb->sm_count / 2 && (!short_fill || blocks >= 2 * cb->sm_count))) break;
    }
    return splits | gmax << 8;
}

/* The CUDA-core decode kernel for a's layout (a.splits, a.gmax heads a block in a.hchunks chunks of a group) */
static void att_decode_cores(cuda_backend *cb, const att_arg &a, const float *qp, const float *kp, const float *vp,
                             float *op, float *part, const att_pre *pre) {
    const dim3 grid(a.splits, a.Hk * a.hchunks, a.B * a.T);
    const int gm = a.gmax; /* the kernel's GM */
    if (pre) {
        if (a.D == 64) launch_dpl<2, true>(cb, gm, grid, qp, kp, vp, op, part, a, *pre);
        else if (a.D == 128) launch_dpl<4, true>(cb, gm, grid, qp, kp, vp, op, part, a, *pre);
        else launch_dpl<8, true>(cb, gm, grid, qp, kp, vp, op, part, a, *pre);
    } else {
        const att_pre none{};
        if (a.D <= 64) launch_dpl<2, false>(cb, gm, grid, qp, kp, vp, op, part, a, none);
        else if (a.D <= 128) launch_dpl<4, false>(cb, gm, grid, qp, kp, vp, op, part, a, none);
        else if (a.D <= 256) launch_dpl<8, false>(cb, gm, grid, qp, kp, vp, op, part, a, none);
        else launch_dpl<16, false>(cb, gm, grid, qp, kp, vp, op, part, a, none);
    }
}

/* The decode kernel (and the merge of its splits) for the a.B sequences from b0; pre: with att_pre's fold. */
static lmx_status att_decode(cuda_backend *cb, const lmx_attn_args *args, int b0, att_arg &a, const float *qp,
                             const float *kp, const float *vp, float *op, const att_pre *pre) {
    const int rows = a.B * a.T;
    const int plan = cuda_attention_plan(cb, args, b0, a.B), splits = plan & 255, tc = plan & ATT_PLAN_TC;
    const int per = plan >> 8 & 255; /* query heads a block, or the tensor cores' warps a block */
    a.splits = splits;
    a.gmax = tc ? a.G : per; /* a tensor-core block takes every head of its group */
    a.hchunks = (a.G + a.gmax - 1) / a.gmax;
    float *part = NULL;
    if (splits > 1) {
        part = (float *)cuda_scratch(cb, CUDA_SCRATCH_ATTN, (size_t)rows * a.H * splits * (a.D + 2) * sizeof(float));
        if (!part) return cb->base.err.status;
    }
    if (tc) cuda_flash_decode(cb, a, qp, kp, vp, op, part, pre, per);
    else att_decode_cores(cb, a, qp, kp, vp, op, part, pre);
    lmx_status st = cuda_check_launch(cb, "attention");
    if (st) return st;
    if (splits > 1) {
        cuda_launch(cb, k_attention_merge, dim3((unsigned)(rows * a.H)), dim3(128), 0, op, a.o16, (const float *)part, a.H,
                    a.D, splits);
        if ((st = cuda_check_launch(cb, "attention merge"))) return st;
    }
    return LMX_OK;
}

/* The launch's description of sequences [b0, b0 + a.B) (a.B set). */
static void att_seqs(att_arg &a, const lmx_attn_args *args, int b0) {
    const lmx_batch *bt = args->batch;
    for (int b = 0; b < a.B; b++) {
        const lmx_kv_layer *kv = args->kv[b0 + b];
        att_seq *s = &a.s[b];
        s->kc = (const __nv_bfloat16 *)kv->k.data;
        s->vc = (const __nv_bfloat16 *)kv->v.data;
        s->n_past = bt->n_past[b0 + b];
        s->n_new = bt->n_new[b0 + b];
        s->cap = kv->cap > 0 ? kv->cap : 1;
        s->rotating = kv->rotating;
        s->window = kv->window;
    }
}

static void att_init(att_arg &a, cuda_backend *cb, const lmx_attn_args *args) {
    a.T = args->batch->T;
    a.H = args->H;
    a.Hk = args->Hk;
    a.D = args->D;
    a.G = args->H / args->Hk;
    a.gmax = a.G, a.hchunks = 1; /* the decode launch's, per cuda_attention_plan (att_decode) */
    a.scale = args->scale;
    a.softcap = args->softcap;
    a.dyn = cb->dyn_on ? cb->dyn : NULL;
    a.o16 = NULL;
}

lmx_status cuda_attention(lmx_backend *be, const lmx_attn_args *args) {
    cuda_backend *cb = (cuda_backend *)be;
    const lmx_batch *bt = args->batch;
    if (args->H % args->Hk != 0)
        return lmx_err_set(&be->err, LMX_ERR_SHAPE, "attention: %d heads not a multiple of %d kv heads", args->H,
                           args->Hk);
    if (args->D > ATT_DMAX)
        return lmx_err_set(&be->err, LMX_ERR_UNSUPPORTED, "cuda: attention with head dim %d (at most %d)", args->D,
                           ATT_DMAX);
    if (args->lse) { /* the flash kernels write it, for sequences from position 0 */
        if (args->D != 32 && args->D != 64 && args->D != 128 && args->D != 256) return LMX_ERR_UNSUPPORTED;
        for (int b = 0; b < bt->B; b++)
            if (bt->n_past[b] != 0) return LMX_ERR_UNSUPPORTED;
    }
    att_arg a;
    att_init(a, cb, args);
    const int64_t HD = (int64_t)a.H * a.D, KD = (int64_t)a.Hk * a.D;
    for (int b0 = 0; b0 < bt->B; b0 += ATT_SEQ_MAX) {
        a.B = bt->B - b0 < ATT_SEQ_MAX ? bt->B - b0 : ATT_SEQ_MAX;
        att_seqs(a, args, b0);
        int64_t r0 = (int64_t)b0 * a.T;
        const float *qp = (const float *)args->q->data + r0 * HD, *kp = (const float *)args->k->data + r0 * KD,
                    *vp = (const float *)args->v->data + r0 * KD;
        float *op = (float *)args->out->data + r0 * HD;
        if (a.T >= 32 || args->lse) { /* prefill: tensor cores */
            float *lse = args->lse ? (float *)args->lse->data + r0 * a.H : NULL; /* [B, H, T] */
            lmx_status st = cuda_flash_attention(cb, a, qp, kp, vp, op, lse);
            if (st == LMX_OK) continue;
            if (st != LMX_ERR_UNSUPPORTED) return st;
        }
        lmx_status st = att_decode(cb, args, b0, a, qp, kp, vp, op, NULL);
        if (st) return st;
    }
    return LMX_OK;
}

lmx_status cuda_attention_fused(cuda_backend *cb, const lmx_attn_args *args, const cuda_att_pre *pre) {
    const lmx_batch *bt = args->batch;
    const lmx_rope *r = pre->rope;
    if (!cb->dyn_on || bt->T != 1 || bt->B > ATT_SEQ_MAX || args->lse || args->Hk < 1 || args->H % args->Hk ||
        (args->D != 64 && args->D != 128 && args->D != 256) || r->rot_dim != args->D)
        return LMX_ERR_UNSUPPORTED;
    att_pre p;
    memset(&p, 0, sizeof p);
    if (pre->qw) p.qw = pre->qw->data, p.qwt = pre->qw->dtype;
    if (pre->kw) p.kw = pre->kw->data, p.kwt = pre->kw->dtype;
    p.qeps = pre->qeps, p.keps = pre->keps, p.qone = pre->qone, p.kone = pre->kone;
    p.attn_factor = r->attn_factor;
    p.interleaved = r->interleaved;
    for (int i = 0; i < args->D / 2; i++) p.inv_freq[i] = r->inv_freq[i];
    att_arg a;
    att_init(a, cb, args);
    a.o16 = pre->o16;
    a.B = bt->B;
    att_seqs(a, args, 0);
    return att_decode(cb, args, 0, a, (const float *)args->q->data, (const float *)args->k->data,
                      (const float *)args->v->data, (float *)args->out->data, &p);
}

/* ---- KV append ------------------------------------------------------------------------------ */

typedef struct app_seq {
    __nv_bfloat16 *kc, *vc;
    int n_past, n_new, cap, first, rotating;
} app_seq;

typedef struct app_arg {
    int B, T;
    int64_t KD;
    const int *dyn;          /* non-NULL: n_past / n_new from this device array */
    app_seq s[ATT_SEQ_MAX];
} app_arg;

/* k, v [B*T, KD] f32 rows t in [first, n_new) of each sequence -> cache slot (n_past + t) % cap. */
__global__ void k_kv_append(const float *__restrict__ k, const float *__restrict__ v, const app_arg a) {
    const int row = blockIdx.y, b = row / a.T, t = row % a.T;
    cuda_pdl_trigger();
    app_seq S = a.s[b];
    if (a.dyn) { /* a graph's per-step values: read before the wait (cuda_pdl_wait) */
        S.n_past = a.dyn[CUDA_DYN_PAST + b];
        S.n_new = a.dyn[CUDA_DYN_NEW + b];
        S.first = S.rotating && S.n_new > S.cap ? S.n_new - S.cap : 0;
    }
    cuda_pdl_wait();
    if (t < S.first || t >= S.n_new) return;
    int64_t slot = (int64_t)(S.n_past + t) % S.cap;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < a.KD; i += (int64_t)gridDim.x * blockDim.x) {
        S.kc[slot * a.KD + i] = __float2bfloat16(k[(int64_t)row * a.KD + i]);
        S.vc[slot * a.KD + i] = __float2bfloat16(v[(int64_t)row * a.KD + i]);
    }
}

lmx_status cuda_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *batch, const lmx_tensor *k,
                          const lmx_tensor *v) {
    cuda_backend *cb = (cuda_backend *)be;
    app_arg a;
    a.T = batch->T;
    a.KD = k->shape[k->ndim - 1];
    a.dyn = cb->dyn_on ? cb->dyn : NULL;
    for (int b0 = 0; b0 < batch->B; b0 += ATT_SEQ_MAX) {
        a.B = batch->B - b0 < ATT_SEQ_MAX ? batch->B - b0 : ATT_SEQ_MAX;
        for (int b = 0; b < a.B; b++) {
            lmx_kv_layer *c = kv[b0 + b];
            app_seq *s = &a.s[b];
            s->kc = (__nv_bfloat16 *)c->k.data;
            s->vc = (__nv_bfloat16 *)c->v.data;
            s->n_past = batch->n_past[b0 + b];
            s->n_new = batch->n_new[b0 + b];
            s->cap = c->cap;
            s->rotating = c->rotating;
            s->first = c->rotating && s->n_new > c->cap ? s->n_new - c->cap : 0;
            if (s->n_new > 0 && !c->rotating && s->n_past + s->n_new > c->cap)
                return lmx_err_set(&be->err, LMX_ERR_CONTEXT_FULL, "KV cache holds %d positions, need %d", c->cap,
                                   s->n_past + s->n_new);
        }
        unsigned gx = cuda_blocks(a.KD, 256);
        dim3 grid(gx < 8 ? gx : 8, a.B * a.T);
        int64_t r0 = (int64_t)b0 * a.T;
        cuda_launch(cb, k_kv_append, grid, dim3(256), 0, (const float *)k->data + r0 * a.KD,
                    (const float *)v->data + r0 * a.KD, a);
        lmx_status st = cuda_check_launch(cb, "kv_append");
        if (st) return st;
    }
    return LMX_OK;
}
