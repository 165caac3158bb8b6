/* cuda_gemv_mq.cu - decode GEMVs of several rows (batched decode) of dense GGUF Q4_K / Q6_K weights on the tensor
 * cores, y_i [M, N_i] = x [M, K] @ w_i^T (+ b_i), two ways:
 * - k_gemv_mq, the integer tensor cores: 8..32 rows (cb->gemv_mq) and K up to 4,096, with x quantized a super-block
 *   at a time as the experts of cuda_moe_mma.cu take it (the arithmetic: cuda_mq.h); Q6_K, and Q4_K of fewer rows
 *   than cb->gemv_st;
 * - k_gemv_st (below), f16: Q4_K of 9..32 rows (cb->gemv_st), every weight byte of a block in flight at once.
 *
 * Block (bx, i, z) takes rows [grp 128, grp 128 + 128) of segment i (8 warps of 16 rows, lane (g, t) rows g and g +
 * 8) against rows [8 z, 8 z + 8) of x (the mma's n), over the super-blocks of its K part kq of kp.  Each tile of 8
 * rows of x is a block of its own: a warp taking all four tiles of 32 rows (each weight read once by the block) ran
 * slower, its chain of instructions four times as long (H200, Qwen3-30B-A3B Q4_K_M batch 32: the q / k / v launch
 * 15.2 us with four tiles a block, 18.7 with one, but the layer's launches together 3,220-3,240 against 3,244-3,250
 * tok/s).  x's slice of the part is staged in shared memory by cp.async, all at once, after the first super-block's
 * weights are in flight.  The parts meet as k_gemv_tc's do (gv_parts_meet): each leaves its sums in scratch and
 * the last block of a row block adds them in part order, so a weight gives the same bits in any launch of the same shapes.
 *
 * Measured (H200, tok/s, against k_gemv_tc with x in bf16): Qwen3-30B-A3B Q4_K_M batch 8 / 32 1,435 / 3,059 ->
 * 1,504 / 3,343 (with the attention's short-context rule, cuda_attention.cu); Qwen3-0.6B Q4_K_M 6,823 / 15,654 ->
 * 7,080 / 15,978; Llama-3.1-8B Q4_K_M (its Q4_K rewritten as MLX groups, cuda_repack.cu; Q6_K v here) unchanged. */
#include <cooperative_groups.h>

#include "cuda_mq.h"
#include "cuda_repack.h"

namespace cg = cooperative_groups;

/* K up to 16 super-blocks: the 8B's down projection (K 14,336) in parts of at most 4 ran slower than k_gemv_tc (H200,
 * Llama-3.1-8B Q4_K_M batch 8: 2,635-2,670 -> 2,573-2,585 tok/s), and in fewer, longer parts slower at 32 rows
 * (5,503-5,548 -> 5,001-5,036) */
#define MQ_GEMV_K 4096
#define MQ_GEMV_COST 1  /* a part's own cost (its staging, its sums in scratch), in super-blocks of its loop */

template <int T>
__global__ void __launch_bounds__(256) k_gemv_mq(const mq_x x, int M, const gv_segs sg, int K, int kp,
                                                 float *__restrict__ part, int *__restrict__ ticket) {
    extern __shared__ uint4 mq_sm[]; /* x's codes [per * 8 parts][8][4], sums [per * 8 S][8], scales [per][8] */
    constexpr int S = mq_t<T>::SUMS;
    cuda_pdl_trigger();
    const gv_seg G = seg_pick(sg, blockIdx.y);
    const int tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    const int grp = blockIdx.x / kp, kq = blockIdx.x % kp, n0 = grp * 128 + 16 * warp, m0 = 8 * blockIdx.z;
    if (grp * 128 >= G.N) { /* the whole block past this segment's rows */
        cuda_pdl_wait();
        return;
    }
    const bool live = n0 < G.N; /* a dead warp still meets the block's barriers */
    const int NP = K / 32, SB = K / 256, per = (SB + kp - 1) / kp;
    const int sb0 = kq * per < SB ? kq * per : SB, nsb = (sb0 + per < SB ? sb0 + per : SB) - sb0;
    const int64_t rb = (int64_t)SB * gq_traits<T>::BYTES;
    const uint8_t *wr[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int n = n0 + g + 8 * h;
        wr[h] = (const uint8_t *)G.w + (n < G.N ? n : G.N - 1) * rb;
    }
    mq_rows<T> cur, next;
    if (live && nsb > 0) cur.load(wr, sb0, t); /* weights: no kernel writes them */
    uint4 *sx = mq_sm;
    int *sxs = (int *)(sx + per * 256);
    float *sxd = (float *)(sxs + per * 64 * S);
    cuda_pdl_wait(); /* x comes from the launch before */
    /* x's rows m0 + slot (zeros past M), laid out as k_moe_mma's staging lays a pass */
    for (int r = tid; r < nsb * 256; r += blockDim.x) { /* codes: entry r is lane r % 4 of pair slot r / 4 % 8 */
        const int m = m0 + r / 4 % 8;
        cp_async16_or_zeros(smem_addr(sx + r), x.q + ((size_t)(m < M ? m : 0) * NP + sb0 * 8 + r / 32) * 4 + r % 4,
                            m < M ? 16 : 0);
    }
    for (int r = tid; r < nsb * 64 * S; r += blockDim.x) { /* sums: [index][pair slot] */
        const int m = m0 + r % 8;
        cp_async4_or_zeros(smem_addr(sxs + r), x.s + (size_t)(m < M ? m : 0) * NP * S + sb0 * 8 * S + r / 8,
                           m < M ? 4 : 0);
    }
    for (int r = tid; r < nsb * 8; r += blockDim.x) { /* scales: [super-block][pair slot] */
        const int m = m0 + r % 8;
        cp_async4_or_zeros(smem_addr(sxd + r), x.d + (size_t)(m < M ? m : 0) * SB + sb0 + r / 8, m < M ? 4 : 0);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (live)
        for (int b = 0; b < nsb; b++) {
            if (b + 1 < nsb) next.load(wr, sb0 + b + 1, t);
            cur.sum(b, sx, sxs, sxd, g, t, acc);
            cur = next;
        }
    if (kp > 1) { /* scratch cell (tile, segment) of gmax row blocks, kp parts each */
        const int64_t cell = (int64_t)blockIdx.z * gridDim.y + blockIdx.y, row0 = cell * gridDim.x;
        if (!gv_parts_meet<4, 16>(acc, part, row0 + blockIdx.x, row0 + (int64_t)grp * kp,
                                  ticket + cell * (gridDim.x / kp) + grp, kp))
            return;
    }
    /* acc[o]: row n0 + g + 8 (o / 2), x's row m0 + 2 t + o % 2 */
#pragma unroll
    for (int o = 0; o < 4; o++) {
        const int m = m0 + 2 * t + o % 2, n = n0 + g + 8 * (o / 2);
        if (live && m < M && n < G.N) G.y[(int64_t)m * G.N + n] = acc[o] + bias_at(G.bias, G.bt, n);
    }
}

/* ---- 9..32 rows of Q4_K in f16, every weight byte of a block in flight at once (k_gemv_st) ----------------------
 *
 * Block (bx, i) takes rows [grp 128, grp 128 + 128) of segment i (8 warps of 16 rows, lane (g, c) rows g and g + 8)
 * against all 8 NT rows of x (NT n-tiles of the f16 mma m16n8k16), over the super-blocks of its K part kq of kp (at
 * most ST_SB).  Before the wait for x, each warp copies its 16 rows' bytes of the part into shared memory by cp.async,
 * all of them at once; then the block stages x's part in f16, already in the order the B registers take it, and
 * decodes each weight once for every row of x.  The kp blocks of a row block are a cluster: their sums meet in
 * shared memory, each block adding a kp-th of them in part order (the same bits for the same shapes).  Against
 * k_gemv_mq, which needs x quantized by a launch before it and whose blocks each take 8 rows of x, decoding each
 * weight again for every 8: H200, Qwen3-30B-A3B Q4_K_M at 32 rows, q / k and o 10.9 us a launch against 12.9 and
 * x's quantization (1.5).
 *
 * A weight is q sc - m in f16 arithmetic, the sub-block's scale d s6 and min dmin m6 rounded to f16 (one rounding of
 * the product and difference): the values of cuda_repack.cu's f16-scaled groups, which the tensor-core GEMV takes
 * with x in f16 as here.
 *
 * Lane c takes bytes 8 c .. 8 c + 7 of each 32 code bytes of its rows: values 8 c + e (e = 0..7) of sub-blocks 2 j
 * (low nibbles) and 2 j + 1 (high).  A lop3 makes the f16 pair 1024 + q of the nibbles (e, e + 2) of a word, so a
 * sub-block's eight values of a row are the pairs P0 (e0, e2), P1 (e1, e3), P2 (e4, e6), P3 (e5, e7): the first mma
 * takes P0 (k slots 2c, 2c + 1) and P1 (2c + 8, 2c + 9), the second P2 and P3, and x is staged as the same pairs,
 * {P0, P1, P2, P3} of a row of x as one 16-byte load.
 *
 * Q6_K in the same form was slower than the kernels it would replace (Qwen3-30B-A3B's v, the Llama-3.1-8B's v and
 * head): bench/tried/gemv_st_q6k.patch. */
#define ST_SB 4 /* super-blocks a K part at most */
/* a staged row's bytes for per super-blocks, padded so that consecutive rows start 8 or 24 banks apart (a half warp's
 * eight-byte loads of four rows, four lanes each, meet no bank twice) */
static __host__ __device__ __forceinline__ int st_row_bytes(int per) { return 144 * per + 4 * (((8 - 4 * per) % 16 + 16) % 16); }
/* the shared memory: the weights, and x's part in f16 */
static inline size_t st_smem(int per, int nt) { return (size_t)128 * st_row_bytes(per) + (size_t)per * nt * 32 * 256 / 2; }

/* the f16 pair 1024 + v of the bytes (or nibbles) at bits b and 16 + b of w under mask (0x00FF00FF, 0x000F000F) */
static __device__ __forceinline__ __half2 st_pair(uint32_t w, uint32_t mask) {
    uint32_t t;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"(w), "r"(mask), "r"(0x64006400u));
    return *reinterpret_cast<__half2 *>(&t);
}

/* one super-block of rows g (r[0]) and g + 8 (r[1]) against x's staged pairs sx [8 sub-blocks][NT][32 lanes] into d */
template <int NT>
static __device__ __forceinline__ void st_sb(const uint8_t *const (&r)[2], const uint4 *sx, int lane, float (&d)[NT][4]) {
    const __half2 k1024 = __floats2half2_rn(1024.0f, 1024.0f);
    __half2 sc[2][8], mn[2][8]; /* row h, sub-block s: (d s6, d s6), (-dmin m6, -dmin m6) */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint4 hd = *(const uint4 *)r[h];
        const uint32_t sw3[3] = {hd.y, hd.z, hd.w};
        const __half2 dd = __half2half2(__ushort_as_half((unsigned short)(hd.x & 0xffffu)));
        const __half2 dm = __hneg2(__half2half2(__ushort_as_half((unsigned short)(hd.x >> 16))));
#pragma unroll
        for (int k = 0; k < 2; k++) {
            uint32_t s4, m4;
            gq_k4_scale4(sw3, k, s4, m4); /* sub-blocks 4k .. 4k + 3, a byte each */
#pragma unroll
            for (int o = 0; o < 2; o++) { /* bytes (o, o + 2): 1024 + v, then v times d (or -dmin) */
                const __half2 vs = __hmul2(__hsub2(st_pair(s4 >> 8 * o, 0x00FF00FFu), k1024), dd);
                const __half2 vm = __hmul2(__hsub2(st_pair(m4 >> 8 * o, 0x00FF00FFu), k1024), dm);
                sc[h][4 * k + o] = __low2half2(vs), sc[h][4 * k + o + 2] = __high2half2(vs);
                mn[h][4 * k + o] = __low2half2(vm), mn[h][4 * k + o + 2] = __high2half2(vm);
            }
        }
    }
    const int c = lane % 4;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint2 w[2];
#pragma unroll
        for (int h = 0; h < 2; h++) w[h] = *(const uint2 *)(r[h] + 16 + 32 * j + 8 * c);
#pragma unroll
        for (int hi = 0; hi < 2; hi++) { /* sub-block 2 j + hi */
            const int s = 2 * j + hi;
            uint32_t a[2][4]; /* [row h][pair P0..P3] */
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int pq = 0; pq < 4; pq++) {
                    const __half2 q = __hsub2(st_pair((pq < 2 ? w[h].x : w[h].y) >> (8 * (pq & 1) + 4 * hi), 0x000F000Fu), k1024);
                    const __half2 v = __hfma2(q, sc[h][s], mn[h][s]);
                    a[h][pq] = *reinterpret_cast<const uint32_t *>(&v);
                }
            const uint32_t a0[4] = {a[0][0], a[1][0], a[0][1], a[1][1]}, a1[4] = {a[0][2], a[1][2], a[0][3], a[1][3]};
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const uint4 xb = sx[(s * NT + nt) * 32 + lane];
                mma_f16(d[nt], a0, xb.x, xb.y);
                mma_f16(d[nt], a1, xb.z, xb.w);
            }
        }
    }
}

template <int NT>
__global__ void __launch_bounds__(256, 2) k_gemv_st(const float *__restrict__ x, int M, const gv_segs sg, int K, int kp) {
    constexpr int BY = 144, SUBS = 8; /* a super-block's bytes and sub-blocks */
    extern __shared__ uint4 st_sm[]; /* weights [8 warps][16 rows][st_row_bytes(per)], x [per][SUBS][NT][32 lanes] */
    cuda_pdl_trigger();
    const gv_seg G = seg_pick(sg, blockIdx.y);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int grp = blockIdx.x / kp, kq = blockIdx.x % kp, n0 = grp * 128 + 16 * warp;
    if (grp * 128 >= G.N) { /* the whole block past this segment's rows */
        cuda_pdl_wait();
        return;
    }
    const bool live = n0 < G.N; /* a dead warp still meets the block's barriers */
    const int SB = K / 256, per = (SB + kp - 1) / kp, rs = st_row_bytes(per);
    const int sb0 = kq * per < SB ? kq * per : SB, nsb = (sb0 + per < SB ? sb0 + per : SB) - sb0;
    uint8_t *sw = (uint8_t *)st_sm + warp * 16 * rs;
    uint4 *sx = (uint4 *)((uint8_t *)st_sm + 128 * rs);
    if (live) { /* weights (no kernel writes them): the warp's 16 rows, nsb super-blocks each, 16 bytes a copy */
        const int ch = BY / 16 * nsb;
        const int64_t rb = (int64_t)SB * BY;
        for (int i = lane; i < 16 * ch; i += 32) {
            const int r = i / ch, q = i % ch, n = n0 + r < G.N ? n0 + r : G.N - 1;
            cp_async16(smem_addr(sw + r * rs + 16 * q), (const uint8_t *)G.w + n * rb + sb0 * BY + 16 * q);
        }
    }
    cp_async_commit();
    cuda_pdl_wait(); /* x comes from the launch before */
    { /* x: unit u (row m, super-block b, sub-block s, lane c) is the 8 values at 256 (sb0 + b) + 32 s + 8 c, staged
       * as the pairs P0 (e0, e2), P1 (e1, e3), P2 (e4, e6), P3 (e5, e7) */
        const int run = 4 * SUBS * nsb, units = NT * 8 * run; /* a row's units */
        constexpr int UN = 8; /* units a round: 16 loads of 16 bytes a thread in flight */
        for (int u0 = tid; u0 < units; u0 += UN * 256) {
            float4 v4[UN][2];
#pragma unroll
            for (int v = 0; v < UN; v++) {
                const int u = u0 + 256 * v, m = u / run;
                v4[v][0] = v4[v][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (u < units && m < M) {
                    const float *p = x + (int64_t)m * K + 256 * sb0 + 8 * (u % run);
                    v4[v][0] = __ldg((const float4 *)p), v4[v][1] = __ldg((const float4 *)(p + 4));
                }
            }
#pragma unroll
            for (int v = 0; v < UN; v++) {
                const int u = u0 + 256 * v, m = u / run, b = u % run / (4 * SUBS), s = u / 4 % SUBS;
                if (u >= units) continue;
                const __half2 p[4] = {__floats2half2_rn(v4[v][0].x, v4[v][0].z), __floats2half2_rn(v4[v][0].y, v4[v][0].w),
                                      __floats2half2_rn(v4[v][1].x, v4[v][1].z), __floats2half2_rn(v4[v][1].y, v4[v][1].w)};
                sx[((b * SUBS + s) * NT + m / 8) * 32 + m % 8 * 4 + u % 4] = *reinterpret_cast<const uint4 *>(p);
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads();
    float d[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) d[j][i] = 0.0f;
    if (live)
        for (int b = 0; b < nsb; b++) {
            const uint8_t *r[2] = {sw + g * rs + BY * b, sw + (g + 8) * rs + BY * b};
            st_sb<NT>(r, sx + b * SUBS * NT * 32, lane, d);
        }
    if (kp > 1) { /* the kp blocks of a row block are a cluster: each adds a kp-th of the sums, in part order */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        constexpr int F = NT * 4;
        cg::cluster_group cl = cg::this_cluster();
        float *mine = (float *)st_sm; /* [F][256 threads] */
        __syncthreads();              /* every warp is past its last read of the staging */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) mine[(4 * j + i) * 256 + tid] = d[j][i];
        cl.sync();
        const int share = F * 256 / kp, rank = (int)cl.block_rank(); /* kp is 2, 4 or 8 */
        for (int o = tid; o < share; o += 256) {
            const int idx = rank * share + o, t = idx % 256, f = idx / 256, l = t % 32;
            float p[8], v = 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++) p[q] = q < kp ? cl.map_shared_rank(mine, q)[idx] : 0.0f;
#pragma unroll
            for (int q = 0; q < 8; q++)
                if (q < kp) v += p[q];
            const int m = 8 * (f / 4) + 2 * (l % 4) + f % 2, n = grp * 128 + 16 * (t / 32) + l / 4 + 8 * (f % 4 / 2);
            if (m < M && n < G.N) G.y[(int64_t)m * G.N + n] = v + bias_at(G.bias, G.bt, n);
        }
        cl.sync(); /* the others' reads of this block's sums are done */
#endif
        return; /* (before sm_90 never launched: cuda_gemv_mq_init turns k_gemv_st off) */
    }
    /* d[j][i]: row n0 + g + 8 (i / 2), x's row 8 j + 2 c + i % 2 */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int m = 8 * j + 2 * c + i % 2, n = n0 + g + 8 * (i / 2);
            if (live && m < M && n < G.N) G.y[(int64_t)m * G.N + n] = d[j][i] + bias_at(G.bias, G.bt, n);
        }
}

/* K parts for SB super-blocks and row blocks of gmax (the largest segment's) and groups (all of them) a tile: of the
 * counts 1, 2, 4, .. 16 within the scratch's 4 SMs of cells a segment whose parts hold at most cap super-blocks, the
 * one whose waves of blocks take the least time, a block counted as its super-blocks and MQ_GEMV_COST, the fewer parts
 * where two cost the same; 0: none.  A launch's parts may hold all of K (MQ_GEMV_K: x's slice up to 16 x 4.6 KB,
 * Q6_K): with parts of at most 4 super-blocks, Qwen3-30B-A3B's q / k / v (K 2,048) ran in four parts where one takes
 * the same one wave of blocks, and then met (its 48 layers at batch 32 3,444-3,446 -> 3,485-3,491 tok/s in one part,
 * H200).  Which matrices take the kernel is still decided with parts of at most MQ_TAKES_SB, the shapes measured. */
#define MQ_TAKES_SB 4
/* the count of parts up to pmax for blocks of at most cap super-blocks, gmax times it at most cells, slots(per) the
 * blocks of per super-blocks a wave takes */
template <class F>
static int parts_plan(int groups, int gmax, int SB, int cap, int pmax, int64_t cells, F slots) {
    int kp = 0;
    int64_t best = -1;
    for (int p = 1; p <= pmax && (int64_t)gmax * p <= cells; p *= 2) {
        const int per = (SB + p - 1) / p;
        if (per > cap) continue;
        const int64_t sl = slots(per), waves = ((int64_t)groups * p + sl - 1) / sl, c = waves * (per + MQ_GEMV_COST);
        if (best < 0 || c < best) best = c, kp = p;
    }
    return kp;
}
static int mq_gemv_parts(const cuda_backend *cb, int slots, int groups, int gmax, int SB, int cap) {
    return parts_plan(groups, gmax, SB, cap, 16, 4 * cb->sm_count, [&](int) { return slots; });
}

typedef void (*st_fn)(const float *, int, const gv_segs, int, int);
static st_fn st_kernel(int nt) { return nt == 2 ? k_gemv_st<2> : nt == 3 ? k_gemv_st<3> : k_gemv_st<4>; }

void cuda_gemv_mq_init(cuda_backend *cb) {
    const void *fn[2] = {(const void *)k_gemv_mq<LMX_GGML_Q4_K>, (const void *)k_gemv_mq<LMX_GGML_Q6_K_A16>};
    /* x's slice of a K part, up to all of K (Q6_K's the larger) */
    cb->gemv_mq_smem = (int)mq_stage_bytes<LMX_GGML_Q6_K_A16>(MQ_GEMV_K / 256);
    for (int i = 0; i < 2; i++)
        if (cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, cb->gemv_mq_smem) != cudaSuccess)
            cb->gemv_mq_smem = 0;
    int cc = 0; /* k_gemv_st's K parts meet in a cluster (sm_90 on) */
    cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, cb->device);
    for (int nt = 2; nt <= 4; nt++)
        if (cc < 9 || !cb->sm_smem ||
            cudaFuncSetAttribute((const void *)st_kernel(nt), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)st_smem(ST_SB, nt)) != cudaSuccess)
            cb->gemv_st = 0;
    cudaGetLastError();
}

int cuda_gemv_mq_takes(const cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu) {
    const int type = ws[0]->q.ggml_type;
    const int64_t K = ws[0]->shape[1];
    if (cb->gemv_mq <= 0 || cb->gemv_mq_smem <= 0 || M < cb->gemv_mq || M > 32 || glu >= 0 || K % 256 ||
        K > MQ_GEMV_K || (type != LMX_GGML_Q4_K && type != LMX_GGML_Q6_K_A16))
        return 0;
    int gmax = 1;
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)ws[i]->data % 16) return 0;
        const int gi = (int)((ws[i]->shape[0] + 127) / 128);
        gmax = gi > gmax ? gi : gmax;
    }
    const int z = (M + 7) / 8;
    return mq_gemv_parts(cb, 2 * cb->sm_count, gmax * z, gmax * z, (int)(K / 256), MQ_TAKES_SB) > 0;
}

/* k_gemv_st's K parts for n weights (row blocks gi each) and M rows, planned with the blocks that fit by registers and
 * by their shared memory (no scratch: the parts meet in a cluster, of 8 at most: 16 ran slower, H200, Qwen3-30B-A3B
 * Q4_K_M batch 32 3,932-3,959 tok/s against 4,020-4,029); 0: none */
static int st_parts(cuda_backend *cb, const int *gi, int n, int M, int K) {
    int groups = 0, gmax = 1;
    for (int i = 0; i < n; i++) groups += gi[i], gmax = gi[i] > gmax ? gi[i] : gmax;
    const int nt = (M + 7) / 8, regs = cuda_fit_blocks(cb, (const void *)st_kernel(nt));
    auto slots = [&](int per) {
        const int by_smem = cb->sm_smem / (int)(st_smem(per, nt) + cb->block_smem);
        return cb->sm_count * (by_smem < regs ? (by_smem > 0 ? by_smem : 1) : regs);
    };
    const int kp = parts_plan(groups, gmax, K / 256, ST_SB, 8, INT64_MAX, slots);
    /* one wave only: a block stages its part of x (as many bytes as its weights' in f32), so where blocks of many
     * waves stream a large matrix (an output head) x's staging is read again for every 128 rows and the launch ran
     * slower than k_gemv_tc (H200, Llama-3.1-8B's Q6_K head at 32 rows in the Q6_K form: 551 us against 474) */
    return kp && (int64_t)groups * kp <= slots((K / 256 + kp - 1) / kp) ? kp : 0;
}

int cuda_gemv_st_fits(const lmx_tensor *w) {
    if (w->q.ggml_type != LMX_GGML_Q4_K || w->ndim != 2 || w->shape[1] % 256) return 0;
    const int64_t blocks = w->shape[0] * (w->shape[1] / 256);
    const uint8_t *p = (const uint8_t *)w->data;
    for (int64_t b = 0; b < blocks; b++) { /* k_gemv_st's q sc - m: sc = d s6 and m = dmin m6 rounded to f16 */
        unsigned short h[2];
        memcpy(h, p + 144 * b, sizeof h);
        const float d = __half2float(__ushort_as_half(h[0])), dmin = __half2float(__ushort_as_half(h[1]));
        /* almost every block: |15 sc - m| <= 945 |d| + 63 |dmin| (with f16's rounding, 2^-11 of it) fits at once */
        if (945.0f * fabsf(d) + 63.0f * fabsf(dmin) < 65000.0f) continue;
        for (int j = 0; j < 8; j++) {
            int s6, m6;
            lmx_ggml_k4_scale_min(p + 144 * b + 4, j, &s6, &m6);
            const float sc = __half2float(__float2half_rn(d * (float)s6)), m = __half2float(__float2half_rn(dmin * (float)m6));
            if (!cuda_f16_affine_fits(15.0f, sc, -m)) return 0;
        }
    }
    return 1;
}

int cuda_gemv_st_takes(cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu) {
    const int type = ws[0]->q.ggml_type;
    const int64_t K = ws[0]->shape[1];
    if (cb->gemv_st <= 0 || M < cb->gemv_st || M <= 8 || M > 32 || glu >= 0 || K % 256 || K > 8 * 256 * ST_SB ||
        type != LMX_GGML_Q4_K)
        return 0;
    int gi[3];
    for (int i = 0; i < n; i++) {
        if ((uintptr_t)ws[i]->data % 16) return 0;
        for (int j = 0; j + 1 < cb->n_st_unfit; j += 2)
            if ((const char *)ws[i]->data >= (const char *)cb->st_unfit[j] &&
                (const char *)ws[i]->data < (const char *)cb->st_unfit[j + 1])
                return 0;
        gi[i] = (int)((ws[i]->shape[0] + 127) / 128);
    }
    return st_parts(cb, gi, n, M, (int)K);
}

lmx_status cuda_gemv_st(cuda_backend *cb, int n, const gv_segs *sg, const float *x, int M, int K, int kp) {
    int gmax = 1;
    for (int i = 0; i < n; i++) {
        const int gi = (sg->s[i].N + 127) / 128;
        gmax = gi > gmax ? gi : gmax;
    }
    const int nt = (M + 7) / 8;
    cuda_launch_cluster(cb, st_kernel(nt), dim3((unsigned)(gmax * kp), (unsigned)n), 256,
                        st_smem((K / 256 + kp - 1) / kp, nt), (unsigned)kp, x, M, *sg, K, kp);
    return cuda_check_launch(cb, "matmul (tensor cores, staged)");
}

template <int T> static lmx_status mq_gemv(cuda_backend *cb, int n, const gv_segs *sg, const float *x, int M, int K) {
    mq_x xo;
    if (!cuda_mq_quant(cb, T, x, M, K, NULL, &xo)) return cb->base.err.status;
    int groups = 0, gmax = 1;
    for (int i = 0; i < n; i++) {
        const int gi = (sg->s[i].N + 127) / 128;
        groups += gi;
        gmax = gi > gmax ? gi : gmax;
    }
    const int SB = K / 256, z = (M + 7) / 8;
    int per_sm = cuda_fit_blocks(cb, (const void *)k_gemv_mq<T>);
    per_sm = per_sm > 2 ? 2 : per_sm;
    const int want = mq_gemv_parts(cb, cb->sm_count * per_sm, groups * z, gmax * z, SB, SB);
    float *part = NULL;
    int *ticket = want > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    const int kp = ticket ? want : 1, per = (SB + kp - 1) / kp; /* no scratch (a graph capturing): one part */
    const dim3 grid((unsigned)(gmax * kp), (unsigned)n, (unsigned)z);
    cuda_launch(cb, k_gemv_mq<T>, grid, 256, mq_stage_bytes<T>(per), xo, M, *sg, K, kp, part, ticket);
    return cuda_check_launch(cb, "matmul (integer tensor cores)");
}

lmx_status cuda_gemv_mq(cuda_backend *cb, int n, const gv_segs *sg, int type, const float *x, int M, int K) {
    return type == LMX_GGML_Q4_K ? mq_gemv<LMX_GGML_Q4_K>(cb, n, sg, x, M, K)
                                 : mq_gemv<LMX_GGML_Q6_K_A16>(cb, n, sg, x, M, K);
}
