/* cuda_flash_decode.cu - a decode step's attention over a long context on the tensor cores.
 *
 * A block is one sequence's row (one token), one kv head and one split of the row's visible keys.  The kv head's
 * G <= 16 query heads are the 16 rows of the mma (rows past G are zeros), so each cached key and value is read once
 * for all of them, and S = Q K^T and O += P V run as bf16 mma.sync m16n8k16 with f32 accumulators, in cuda_flash.cu's
 * layout and helpers (the online softmax in registers, P reused as the A operand).  The CUDA-core decode kernel
 * (cuda_attention.cu) issues about 900 instructions for 8 keys of 4 heads; at long contexts its issue, not its
 * bytes, held it (ncu, H200: 2.7 instructions a cycle, DRAM 20% busy).  Key tiles of 16 keys a warp (four warps, two
 * for heads of 256) come through two shared-memory stages by cp.async: cached positions from the bf16 cache, the
 * row's own new key and value (f32, this call's) rounded to bf16 as they are stored.  Each warp keeps its own
 * (o, max, sum); the block merges them, then writes its split's to part for k_attention_merge, or with one split
 * the output itself.  Operands are bf16 (q rounded, as the prefill's).  Nothing is folded in: cuda_attention_plan
 * picks this kernel for long contexts of many rows (a norm / RoPE / append launch before it costs little there). */
#include <math.h>

#include "cuda_attention.h"
#include "cuda_mma.h"

/* warps a block (each 16 keys of a tile: heads of 256 two, for the shared memory), keys a tile */
template <int D> __host__ __device__ constexpr int fd_warps() { return D == 256 ? 2 : 4; }
template <int D> __host__ __device__ constexpr int fd_kt() { return 16 * fd_warps<D>(); }
/* Q [16][D + 8], K and V [2][KT][D + 8] (bf16; the pad puts an ldmatrix tile's rows in different banks); after the
 * walk the warps' (o, max, sum) [W][16][D + 2] f32 in the stages' place */
template <int D> __host__ __device__ constexpr size_t fd_smem() { return (size_t)2 * (D + 8) * (16 + 4 * fd_kt<D>()); }

/* q, out [B, H*D]; kn, vn [B, Hk*D] (one row a sequence, offset to the launch's first); part [B, H, splits, D + 2]
 * when a.splits > 1. */
template <int D>
__global__ void __launch_bounds__(32 * fd_warps<D>()) k_flash_decode(const float *__restrict__ q,
                                                                      const float *__restrict__ kn,
                                                                      const float *__restrict__ vn,
                                                                      float *__restrict__ out, float *__restrict__ part,
                                                                      const att_arg a) {
    constexpr int W = fd_warps<D>(), KT = fd_kt<D>(), LD = D + 8, ND = D / 8, CPR = D / 8; /* 16-byte pieces a row */
    static_assert(fd_smem<D>() >= (size_t)W * 16 * (D + 2) * 4, "the warps' merge fits in the stages");
    extern __shared__ __align__(16) unsigned char fd_mem[];
    __nv_bfloat16 *Qs = (__nv_bfloat16 *)fd_mem; /* [16][LD] */
    __nv_bfloat16 *Ks = Qs + 16 * LD;            /* [2][KT][LD] */
    __nv_bfloat16 *Vs = Ks + 2 * KT * LD;        /* [2][KT][LD] */
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
    cuda_pdl_wait(); /* q, the new row and (else) the cache come from the kernels before */
    for (int i = tid; i < 16 * D / 4; i += 32 * W) { /* Q: the kv head's query heads, scaled, as bf16; zeros past G */
        const int r = i / (D / 4), c = (i % (D / 4)) * 4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (r < a.G) v = __ldg((const float4 *)(q + (int64_t)b * HD + (int64_t)(h0 + r) * D + c));
        *(uint2 *)(Qs + r * LD + c) = make_uint2(pack_bf16(v.x * a.scale, v.y * a.scale),
                                                 pack_bf16(v.z * a.scale, v.w * a.scale));
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

template <int D>
static void fd_launch(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v, float *out,
                      float *part) {
    const dim3 grid((unsigned)a.splits, (unsigned)a.Hk, (unsigned)a.B);
    cuda_launch(cb, k_flash_decode<D>, grid, dim3(32 * fd_warps<D>()), fd_smem<D>(), q, k, v, out, part, a);
}

int cuda_flash_decode_takes(int T, int D, int G) { return T == 1 && (D == 64 || D == 128 || D == 256) && G <= 16; }

int cuda_flash_decode_keys(int D) { return D == 256 ? fd_kt<256>() : D == 128 ? fd_kt<128>() : fd_kt<64>(); }

void cuda_flash_decode(cuda_backend *cb, const att_arg &a, const float *q, const float *k, const float *v, float *out,
                       float *part) {
    if (a.D == 64) fd_launch<64>(cb, a, q, k, v, out, part);
    else if (a.D == 128) fd_launch<128>(cb, a, q, k, v, out, part);
    else fd_launch<256>(cb, a, q, k, v, out, part);
}

void cuda_flash_decode_init(void) { /* shared memory past 48 KB for every instance */
    cudaFuncSetAttribute(k_flash_decode<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fd_smem<64>());
    cudaFuncSetAttribute(k_flash_decode<128>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fd_smem<128>());
    cudaFuncSetAttribute(k_flash_decode<256>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fd_smem<256>());
    cudaGetLastError();
}
