/* cuda_flash_decode.cu - a decode step's attention over a long context on the tensor cores.
 *
 * A block is one sequence's row (one token), one kv head and one split of the row's visible keys.  The kv head's
 * G <= 16 query heads are the 16 rows of the mma (rows past G are zeros), so each cached key and value is read once
 * for all of them, and S = Q K^T and O += P V run as bf16 mma.sync m16n8k16 with f32 accumulators, in cuda_flash.cu's
 * layout and helpers (the online softmax in registers, P reused as the A operand).  The CUDA-core decode kernel
 * (cuda_attention.cu) issues about 900 instructions for 8 keys of 4 heads; at long contexts its issue, not its
 * bytes, held it (ncu, H200: 2.7 instructions a cycle, DRAM 20% busy).  Key tiles of 16 keys a warp come through
 * two shared-memory stages by cp.async: cached positions from the bf16 cache, the row's own new key and value (f32,
 * this call's) rounded to bf16 as they are stored.  Each warp keeps its own (o, max, sum); the block merges them,
 * then writes its split's to part for k_attention_merge, or with one split the output itself.  Operands are bf16
 * (q rounded, as the prefill's).  In a decode graph (PRE) the q / k norm, RoPE and kv append are folded in as
 * k_attention folds them (att_pre_head, the same arithmetic): the split that holds the row's own key makes it,
 * appends it and stages it for its tile.
 *
 * Warps a block (cuda_flash_decode_warps): four for few rows (74 KB of shared memory with heads of 128), two for
 * many (40 KB), and two for heads of 256.  A multiprocessor's shared memory and L1 are one store, split by the
 * carveout of the kernels it runs; a kernel of 74 KB blocks gets a 228 KB carveout, and the L1 of the GEMVs that
 * follow it in the decode chain shrinks to what is left, until the multiprocessor idles.  So the two-warp
 * instances ask for 58% (three blocks a multiprocessor, the rest L1).  H200, tok/s, the four-warp form with the
 * default carveout -> two warps at 58%: Qwen3-30B-A3B Q4_K_M (12 layers), 32 rows at 4,096 keys 9,079-9,141 ->
 * 9,782-9,915, 8 rows 4,873-4,939 -> 5,330-5,429; Llama-3.1-8B Q4_K_M (groups of 4), 32 rows 2,613-2,632 ->
 * 3,144-3,158 (the CUDA-core kernel 2,597-2,601), 16 rows at 2,048 2,424-2,432 -> 2,952-2,975 (2,744-2,745).  A
 * carveout of 72% measured the same; four warps at 44% or 72% gained less.  One row at 16,384 keys is the other way:
 * 1,311-1,317 with four warps and the default carveout, 1,260-1,261 with two. */
#include <math.h>

#include "cuda_attention.h"
#include "cuda_mma.h"

/* Q [16][D + 8], K and V [2][KT][D + 8], the row's own key and value [2][D + 8] (bf16; the pad puts an ldmatrix
 * tile's rows in different banks); after the walk the warps' (o, max, sum) [W][16][D + 2] f32 in the stages' place */
template <int D, int W> __host__ __device__ constexpr size_t fd_smem() {
    return (size_t)2 * (D + 8) * (16 + 4 * 16 * W + 2);
}

/* q, out [B, H*D]; kn, vn [B, Hk*D] (one row a sequence, offset to the launch's first); part [B, H, splits, D + 2]
 * when a.splits > 1.  PRE: q and kn before their norm and RoPE (att_pre), and the kv append is this launch's. */
template <int D, bool PRE, int W>
__global__ void __launch_bounds__(32 * W) k_flash_decode(const float *__restrict__ q, const float *__restrict__ kn,
                                                         const float *__restrict__ vn, float *__restrict__ out,
                                                         float *__restrict__ part, const att_arg a, const att_pre p) {
    constexpr int KT = 16 * W, LD = D + 8, ND = D / 8, CPR = D / 8; /* 16-byte pieces a row */
    constexpr int DPL = D / 32, PW = PRE ? DPL : 1; /* att_pre_head's values a lane */
    static_assert(fd_smem<D, W>() >= (size_t)W * 16 * (D + 2) * 4, "the warps' merge fits in the stages");
    extern __shared__ __align__(16) unsigned char fd_mem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fd_mem; /* [16][LD] */
    __nv_bfloat16 *Ks = Qs + 16 * LD;            /* [2][KT][LD] */
    __nv_bfloat16 *Vs = Ks + 2 * KT * LD;        /* [2][KT][LD] */
    __nv_bfloat16 *Ns = Vs + 2 * KT * LD;        /* [2][LD]: PRE, the row's own key and value */
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, h0 = kvh * a.G;
    cuda_pdl_trigger();
    att_seq S = att_seq_at(a, b);
    const int64_t HD = (int64_t)a.H * D, KD = (int64_t)a.Hk * D;
    /* the row's visible keys, as k_attention's for t = 0: n_cached from the cache from position c0, then its own */
    int n = 0, n_cached = 0, c0 = 0;
    if (S.n_new > 0) {
        const int lo = S.window > 0 && S.n_past - S.window + 1 > 0 ? S.n_past - S.window + 1 : 0;
        const int held = S.rotating ? (S.n_past < S.cap ? S.n_past : S.cap) : S.n_past;
        c0 = S.n_past - held > lo ? S.n_past - held : lo;
        n_cached = S.n_past - c0;
        n = n_cached + 1;
    }
    const int chunk = (n + a.splits - 1) / a.splits;
    const int j0 = split * chunk, j1 = j0 + chunk < n ? j0 + chunk : n;
    const int ntiles = j1 > j0 ? (j1 - j0 + KT - 1) / KT : 0;
    const bool own = j0 <= n_cached && n_cached < j1; /* the split that holds the row's own key (one a kv head) */
    const int c0m = c0 % S.cap; /* key j's slot: c0m + j, less cap past it */
    /* this thread's 16-byte piece of every row it copies: rows tid / CPR + i 32 W / CPR */
    const int pc = (tid % CPR) * 8;
    const __nv_bfloat16 *kc = S.kc + (int64_t)kvh * D + pc;
    const int64_t vkd = S.vc - S.kc; /* v's row from k's */
    const int64_t nrow = (int64_t)b * KD + (int64_t)kvh * D + pc; /* the row's own key and value */
    const float *knr = kn + nrow, *vnr = vn + nrow;

    /* keys [jt, jt + KT) of the split into a stage (rows past j1 repeat its last key: masked, and finite) */
    auto load_tile = [&](int jt, int stage) {
        __nv_bfloat16 *ks = Ks + stage * KT * LD + pc, *vs = Vs + stage * KT * LD + pc;
#pragma unroll
        for (int r = tid / CPR; r < KT; r += 32 * W / CPR) {
            const int j = jt + r < j1 ? jt + r : j1 - 1;
            if (j < n_cached) {
                const int slot = c0m + j < S.cap ? c0m + j : c0m + j - S.cap;
                const __nv_bfloat16 *kp = kc + (int64_t)slot * KD;
                cp_async16(smem_addr(ks + r * LD), kp);
                cp_async16(smem_addr(vs + r * LD), kp + vkd);
            } else if (PRE) { /* the row's own key and value, made after the wait */
                *(uint4 *)(ks + r * LD) = *(const uint4 *)(Ns + pc);
                *(uint4 *)(vs + r * LD) = *(const uint4 *)(Ns + LD + pc);
            } else { /* the row's own key and value */
                const float4 k0 = __ldg((const float4 *)knr), k1 = __ldg((const float4 *)(knr + 4));
                const float4 v0 = __ldg((const float4 *)vnr), v1 = __ldg((const float4 *)(vnr + 4));
                *(uint4 *)(ks + r * LD) = make_uint4(pack_bf16(k0.x, k0.y), pack_bf16(k0.z, k0.w),
                                                     pack_bf16(k1.x, k1.y), pack_bf16(k1.z, k1.w));
                *(uint4 *)(vs + r * LD) = make_uint4(pack_bf16(v0.x, v0.y), pack_bf16(v0.z, v0.w),
                                                     pack_bf16(v1.x, v1.y), pack_bf16(v1.z, v1.w));
            }
        }
        cp_async_commit();
    };
    /* The first tile before the wait when it holds cached keys only and earlier steps wrote them all (this call's
     * appends go to slots past them unless a rotating cache wraps now). */
    const int last0 = j0 + KT - 1 < j1 - 1 ? j0 + KT - 1 : j1 - 1;
    const bool early = ntiles > 0 && last0 < n_cached && (!S.rotating || S.n_past + S.n_new <= S.cap);
    if (early) load_tile(j0, 0);
    float pcs[PW], psn[PW], wq[PW], wk[PW]; /* PRE: the rotation at the row's position, the norm weights */
    if constexpr (PRE) att_pre_load<DPL>(p, S.n_past, pcs, psn, wq, wk);
    cuda_pdl_wait(); /* q, the new row and (else) the cache come from the kernels before */
    if constexpr (PRE) {
        /* The own key normed and rotated, and the value, as bf16 for its tile (and once a kv head into the cache)
         * by the last warp; each query head normed, rotated and scaled by a warp, a lane's dims lane + 32 jj. */
        if (own && warp == W - 1) {
            float kx[DPL], vx[DPL];
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) {
                kx[jj] = __ldg(knr - pc + lane + 32 * jj);
                vx[jj] = __ldg(vnr - pc + lane + 32 * jj);
            }
            att_pre_head<DPL>(kx, p.kw != NULL, wk, p.keps, D, p.interleaved, pcs, psn);
            const int64_t off = (int64_t)(S.n_past % S.cap) * KD + (int64_t)kvh * D;
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) {
                const int d = lane + 32 * jj;
                Ns[d] = __float2bfloat16(kx[jj]);
                Ns[LD + d] = __float2bfloat16(vx[jj]);
                ((__nv_bfloat16 *)S.kc)[off + d] = Ns[d];
                ((__nv_bfloat16 *)S.vc)[off + d] = Ns[LD + d];
            }
        }
        for (int r = warp; r < 16; r += W) {
            float x[DPL];
#pragma unroll
            for (int jj = 0; jj < DPL; jj++)
                x[jj] = r < a.G ? __ldg(q + (int64_t)b * HD + (int64_t)(h0 + r) * D + lane + 32 * jj) : 0.f;
            if (r < a.G) att_pre_head<DPL>(x, p.qw != NULL, wq, p.qeps, D, p.interleaved, pcs, psn);
#pragma unroll
            for (int jj = 0; jj < DPL; jj++) Qs[r * LD + lane + 32 * jj] = __float2bfloat16(x[jj] * a.scale);
        }
        if (own) __syncthreads(); /* the own row before a tile's copy of it */
    } else {
        /* Q: the kv head's query heads, scaled, as bf16; zeros past G */
        for (int i = tid; i < 16 * D / 4; i += 32 * W) {
            const int r = i / (D / 4), c = (i % (D / 4)) * 4;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < a.G) v = __ldg((const float4 *)(q + (int64_t)b * HD + (int64_t)(h0 + r) * D + c));
            *(uint2 *)(Qs + r * LD + c) = make_uint2(pack_bf16(v.x * a.scale, v.y * a.scale),
                                                     pack_bf16(v.z * a.scale, v.w * a.scale));
        }
    }
    if (ntiles > 0 && !early) load_tile(j0, 0);

    /* warp w: keys [16 w, 16 w + 16) of each tile */
    float o[ND][4], m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f};
    acc_zero(o);
    for (int it = 0; it < ntiles; it++) {
        const int jt = j0 + it * KT;
        cp_async_turn(it + 1 < ntiles, [&] { load_tile(jt + KT, (it + 1) & 1); }); /* tile it (and Q) */
        const __nv_bfloat16 *ks = Ks + ((it & 1) * KT + 16 * warp) * LD, *vs = Vs + ((it & 1) * KT + 16 * warp) * LD;
        float s[2][4];
        mma_abt<D, 2>(s, Qs, 0, ks, LD);
#pragma unroll
        for (int jj = 0; jj < 2; jj++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = s[jj][e];
                if (a.softcap > 0) x = a.softcap * tanhf(x / a.softcap);
                s[jj][e] = jt + 16 * warp + 8 * jj + 2 * tq + (e & 1) < j1 ? x : -INFINITY;
            }
        att_softmax_step(s, m_r, l_r, o);
        mma_acc_pt<16, ND>(o, s, vs, LD); /* O += P V: the two key octets' scores are the k-step's A operand */
        __syncthreads();                 /* the stage is read before it is refilled */
    }

    /* the warps' partials, then their merge: a thread a (row, dim) */
    float inv[2], ls[2];
    att_softmax_end(l_r, m_r, inv, ls); /* l_r: the rows' sums over their four threads */
    float *ms = (float *)Ks;            /* [W][16][D + 2]: o, then max and sum */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float *p = ms + (warp * 16 + g + 8 * r) * (D + 2);
#pragma unroll
        for (int j = 0; j < ND; j++) *(float2 *)(p + 8 * j + 2 * tq) = make_float2(o[j][2 * r], o[j][2 * r + 1]);
        if (tq == 0) p[D] = m_r[r], p[D + 1] = l_r[r];
    }
    __syncthreads();
    for (int i = tid; i < a.G * D; i += 32 * W) {
        const int gi = i / D, d = i % D, h = h0 + gi;
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; w++) mx = fmaxf(mx, ms[(w * 16 + gi) * (D + 2) + D]);
        float L = 0.f, y = 0.f;
        if (mx != -INFINITY)
#pragma unroll
            for (int w = 0; w < W; w++) {
                const float *p = ms + (w * 16 + gi) * (D + 2), c = __expf(p[D] - mx);
                L += p[D + 1] * c;
                y += p[d] * c;
            }
        if (a.splits == 1) {
            const int64_t e = (int64_t)b * HD + (int64_t)h * D + d;
            out[e] = L > 0 ? y / L : 0.f;
            if (a.o16) a.o16[e] = __float2bfloat16(out[e]);
        } else {
            float *p = part + (((int64_t)b * a.H + h) * a.splits + split) * (D + 2);
            p[d] = y;
            if (d == 0) p[D] = mx, p[D + 1] = L;
        }
    }
}

template <int D, int W>
static void fd_launch(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v, float *out,
                      float *part, const att_pre *pre) {
    const dim3 grid((unsigned)a.splits, (unsigned)a.Hk, (unsigned)a.B);
    const dim3 block(32 * W);
    if (pre) cuda_launch(cb, k_flash_decode<D, true, W>, grid, block, fd_smem<D, W>(), q, k, v, out, part, a, *pre);
    else cuda_launch(cb, k_flash_decode<D, false, W>, grid, block, fd_smem<D, W>(), q, k, v, out, part, a, att_pre{});
}

int cuda_flash_decode_takes(int T, int D, int G) { return T == 1 && (D == 64 || D == 128 || D == 256) && G <= 16; }

int cuda_flash_decode_warps(int D, int few) { return D == 256 ? 2 : few ? 4 : 2; }

void cuda_flash_decode(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v, float *out,
                       float *part, const att_pre *pre, int warps) {
    if (a.D == 64 && warps == 2) fd_launch<64, 2>(cb, a, q, k, v, out, part, pre);
    else if (a.D == 64) fd_launch<64, 4>(cb, a, q, k, v, out, part, pre);
    else if (a.D == 128 && warps == 2) fd_launch<128, 2>(cb, a, q, k, v, out, part, pre);
    else if (a.D == 128) fd_launch<128, 4>(cb, a, q, k, v, out, part, pre);
    else fd_launch<256, 2>(cb, a, q, k, v, out, part, pre);
}

/* Shared memory past 48 KB for every instance, and the two-warp ones of heads up to 128 a carveout of 58% (the
 * file's head) */
template <int D, int W> static void fd_init() {
    const int co = D < 256 && W == 2 ? 58 : -1;
    for (int pre = 0; pre < 2; pre++) {
        const void *k = pre ? (const void *)k_flash_decode<D, true, W> : (const void *)k_flash_decode<D, false, W>;
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fd_smem<D, W>());
        if (co >= 0) cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, co);
    }
}

void cuda_flash_decode_init(void) {
    fd_init<64, 2>(), fd_init<64, 4>(), fd_init<128, 2>(), fd_init<128, 4>(), fd_init<256, 2>();
    cudaGetLastError();
}
