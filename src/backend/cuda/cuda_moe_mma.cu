/* cuda_moe_mma.cu - a mixture of experts' GGUF experts for several rows (batched decode) on the integer tensor
 * cores: each chosen expert's weights read once for every (row, choice) pair that chose it.
 *
 * The per-pair kernels (k_moe_ggemv, cuda_ggml.cu) read an expert once for each pair that chose it: at batch 32
 * of Qwen3-30B-A3B's shape the 256 pairs choose about 112 distinct experts of 128, each read 2.3 times, and each
 * weight is decoded and multiplied once a pair by the CUDA cores.  Here block (bx, e) takes rows
 * [bx R, (bx + 1) R) of expert e (gate / up: R = 64 of gate, four warps, beside the same 64 of up, four warps;
 * down: R = 128, eight warps) and the pairs that chose e, found by scanning pick (in passes of up to eight, the
 * mma's n: x's rows of the pass copied into shared memory, laid out as the mma's B takes them, by cp.async, all
 * at once and beside the first weights' loads).  A warp takes 16 rows (the mma's m), its lane (g, t) = (lane /
 * 4, lane % 4) rows g and g + 8, their codes loaded straight from the weights as the mma's A, a super-block
 * ahead.  Blocks of an expert no pair chose end at once.
 *
 * The arithmetic is cuda_mq.h's, x quantized a super-block at a time by k_mq_quant (below).  Gate / up store h =
 * act(g) u for the down projection, which takes h quantized the same way (a k_mq_quant launch between).
 *
 * The experts are uploaded in tiles (the end of this file), and one row of them (and the gate / up of rows too few
 * for the tensor cores) takes the same arithmetic on the CUDA cores ("one row from the tiles": cuda_moe_one,
 * cuda_moe_tiles_gu). */
#include "cuda_moe_mma.h"
#include "cuda_mq.h"
#include "cuda_repack.h"

#define MQ_N 8                /* pairs a pass: the mma's n */
#define MQ_SMEM (160 << 10)   /* the staged x of a pass at most (K 8,192) */

/* the row of x that pair p reads: gate / up's x has a row for each row of pairs */
template <int PAIR> static __device__ __forceinline__ int mq_xrow(int p, int kused) { return PAIR ? p / kused : p; }

/* Super-block sb of a row of x quantized by a warp, lane l holding its values 8 l .. 8 l + 7 in v: into that row's
 * codes q [K / 32][4], sums s [K / 32 SUMS] and scales d [K / 256] (mq_x's layout) */
template <int T>
static __device__ __forceinline__ void mq_quant_sb(const float (&v)[8], int lane, int sb, uint4 *oq, int *os, float *od) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = cuda_warp_max(amax);
    const float id = amax > 0.0f ? 32767.0f / amax : 0.0f;
    int c[8], sum = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) c[i] = __float2int_rn(v[i] * id), sum += c[i];
    uint32_t w[4]; /* the int16 codes two a word */
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (uint32_t)(c[2 * i] & 0xffff) | ((uint32_t)c[2 * i + 1] << 16);
    /* hi / lo bytes of values 0..3 and 4..7 */
    const uint32_t h0 = __byte_perm(w[0], w[1], 0x7531), h1 = __byte_perm(w[2], w[3], 0x7531),
                   l0 = __byte_perm(w[0], w[1], 0x6420), l1 = __byte_perm(w[2], w[3], 0x6420);
    const int pp = 8 * sb + lane / 4, t = lane % 4;
    uint4 *q = oq + pp * 4 + t;
    if constexpr (T == LMX_GGML_Q4_K) {
        *q = make_uint4(h0, h1, l0, l1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1), sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if (t == 0) os[pp] = sum;
    } else { /* lane t of a part: values 4t .. 4t + 3 from lane t / 2's half t % 2, 16 + 4t .. from 2 + t / 2's */
        const int a = (lane & ~3) + t / 2, b = a + 2, hf = t & 1;
        const uint32_t ah0 = __shfl_sync(0xffffffffu, h0, a), ah1 = __shfl_sync(0xffffffffu, h1, a),
                       al0 = __shfl_sync(0xffffffffu, l0, a), al1 = __shfl_sync(0xffffffffu, l1, a),
                       bh0 = __shfl_sync(0xffffffffu, h0, b), bh1 = __shfl_sync(0xffffffffu, h1, b),
                       bl0 = __shfl_sync(0xffffffffu, l0, b), bl1 = __shfl_sync(0xffffffffu, l1, b);
        *q = make_uint4(hf ? ah1 : ah0, hf ? bh1 : bh0, hf ? al1 : al0, hf ? bl1 : bl0);
        sum += __shfl_xor_sync(0xffffffffu, sum, 1); /* lanes 2i, 2i + 1: a half of 16 */
        if (!(t & 1)) os[pp * 2 + t / 2] = sum;
    }
    if (lane == 0) od[sb] = amax / 32767.0f;
}

/* x [M, K] into oq, os, od (mq_x's layout): a super-block of row blockIdx.y a warp (lane l: values 8 l .. 8 l + 7,
 * part l / 4), with nm's RMSNorm where nm.w (one row: the experts' gate / up, cuda_moe_tiles_gu; as the GEMVs' own
 * quantization folds it, gquant_x_load); blocks of rows past M route row y - M (rt: gate / up's launch; warp 0 of
 * block 0) */
template <int T>
__global__ void __launch_bounds__(256) k_mq_quant(const float *__restrict__ x, int M, int K, uint4 *oq, int *os,
                                                  float *od, const __grid_constant__ cuda_moe_router rt,
                                                  const cuda_row_norm nm) {
    __shared__ float part[8];
    cuda_pdl_trigger();
    cuda_pdl_wait();
    const int lane = threadIdx.x % 32, sb = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, m = blockIdx.y;
    if (m >= M) {
        if (blockIdx.x == 0 && threadIdx.x < 32) cuda_moe_route_row(rt, m - M, lane);
        return;
    }
    const float inv = nm.w ? cuda_rms_inv256(x + (size_t)m * K, K, nm.eps, part) : 1.0f; /* (the whole block) */
    if (sb >= K / 256) return;
    const int i0 = 256 * sb + 8 * lane;
    const float4 v0 = *(const float4 *)(x + (size_t)m * K + i0), v1 = *(const float4 *)(x + (size_t)m * K + i0 + 4);
    float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    if (nm.w)
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = cuda_norm_elem(v[i], inv, nm.w, nm.wt, i0 + i, nm.add_one);
    mq_quant_sb<T>(v, lane, sb, oq + (size_t)m * (K / 32) * 4, os + (size_t)m * (K / 32) * mq_t<T>::SUMS,
                   od + (size_t)m * (K / 256));
}

/* Block (bx, e): expert e's rows (above) for every pair p with pick[p] == e: y[p, n] = act(gate_e x) (up_e x)
 * (PAIR, x's row p / kused) or down_e x (x's row p), x quantized by k_mq_quant.  TILED: mo's weights are the experts'
 * tiles (mq_tile), N a multiple of 16. */
template <int T, int PAIR, int TILED>
__global__ void __launch_bounds__(256, 2)
    k_moe_mma(const mq_x x, const __grid_constant__ gv_moe mo, const int *pick, int P, int kused, int N, int K, int act,
              float *__restrict__ y) {
    extern __shared__ uint4 mq_sm[]; /* x's codes [K / 32][8][4], then sums [K / 32 * SUMS][8], scales [K / 256][8] */
    __shared__ int plist[CUDA_MOE_PAIRS], pn;
    __shared__ float up[PAIR ? 4 : 1][16][MQ_N + 1]; /* PAIR: the up warps' sums, for the gate warps' GLU */
    cuda_pdl_trigger();
    const int e = blockIdx.y, tid = threadIdx.x, warp = tid / 32, g = (tid % 32) / 4, t = tid % 4;
    if (tid == 0) pn = 0;
    cuda_pdl_wait(); /* pick and x come from the launches before */
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x)
        if (*(volatile const int *)(pick + p) == e) plist[atomicAdd(&pn, 1)] = p; /* any order: pairs are columns */
    __syncthreads();
    const int np = pn;
    if (np == 0) return;
    const int mat = PAIR ? warp / 4 : 0, n0 = PAIR ? blockIdx.x * 64 + 16 * (warp % 4) : blockIdx.x * 128 + 16 * warp;
    const uint8_t *wr[2], *tile; /* the warp's rows (TILED: its tiles) */
    mq_warp_rows<T>(mo.w[mat][e], n0, g, N, K, wr, tile);
    constexpr int S = mq_t<T>::SUMS;
    const int NP = K / 32, SB = K / 256;
    mq_rows<T> cur, next;
    uint4 *sx = mq_sm;
    int *sxs = (int *)(mq_sm + NP * 32);
    float *sxd = (float *)(sxs + NP * S * 8);
    for (int c0 = 0; c0 < np; c0 += MQ_N) {
        const int nc = np - c0 < MQ_N ? np - c0 : MQ_N;
        __syncthreads(); /* the last pass's reads of the staged x are done */
        /* every copy in flight at once, and the first weights with them; empty slots zeros */
        for (int i = tid; i < NP * 32; i += blockDim.x) { /* codes: entry i is lane i % 4 of pair slot i / 4 % 8 */
            const int j = i / 4 % 8;
            const size_t m = mq_xrow<PAIR>(plist[c0 + (j < nc ? j : 0)], kused);
            cp_async16_or_zeros(smem_addr(sx + i), x.q + m * NP * 4 + i / 32 * 4 + i % 4, j < nc ? 16 : 0);
        }
        for (int i = tid; i < (NP * S + SB) * 8; i += blockDim.x) { /* sums, then scales: [index][pair slot] */
            const int j = i % 8, k = i / 8;
            const size_t m = mq_xrow<PAIR>(plist[c0 + (j < nc ? j : 0)], kused);
            const void *src = k < NP * S ? (const void *)(x.s + m * NP * S + k)
                                         : (const void *)(x.d + m * SB + k - NP * S);
            cp_async4_or_zeros(smem_addr(sxs + i), src, j < nc ? 4 : 0);
        }
        cp_async_commit();
        if constexpr (TILED) cur.load_tiled(tile, tid % 32);
        else cur.load(wr, 0, t);
        cp_async_wait<0>();
        __syncthreads();
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int b = 0; b < SB; b++) {
            if (b + 1 < SB) {
                if constexpr (TILED) next.load_tiled(tile + (size_t)(b + 1) * mq_tile<T>::BYTES, tid % 32);
                else next.load(wr, b + 1, t);
            }
            cur.sum(b, sx, sxs, sxd, g, t, acc);
            cur = next;
        }
        /* acc[o]: row g + 8 (o / 2), pair slot 2t + o % 2 */
        if (PAIR && mat == 1)
#pragma unroll
            for (int o = 0; o < 4; o++) up[warp % 4][g + 8 * (o / 2)][2 * t + o % 2] = acc[o];
        if (PAIR) __syncthreads();
        if (mat == 0)
#pragma unroll
            for (int o = 0; o < 4; o++) {
                const int r = g + 8 * (o / 2), c = 2 * t + o % 2, n = n0 + r;
                if (c >= nc || n >= N) continue;
                const float v = PAIR ? glu_act(acc[o], act) * up[warp % 4][r][c] : acc[o];
                y[(size_t)plist[c0 + c] * N + n] = v;
            }
    }
}

/* Whether every expert's weights j0 .. j1 - 1 (0, 1: gate and up [F, C]; 2: down [C, F], as expert 0's gate) are
 * 16-byte aligned and of type t0 or t1 (blocks: the type of their blocks, cuda_moe_blocks; else as stored) */
static int moe_experts_are(const lmx_moe_args *a, int j0, int j1, int t0, int t1, int blocks) {
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    for (int e = 0; e < a->E; e++)
        for (int j = j0; j < j1; j++) {
            const lmx_tensor *w = &a->experts[3 * e + j];
            const int type = blocks ? cuda_moe_blocks(w->q.ggml_type) : w->q.ggml_type;
            if ((type != t0 && type != t1) || (uintptr_t)w->data % 16 || w->shape[0] != (j == 2 ? C : F) ||
                w->shape[1] != (j == 2 ? F : C))
                return 0;
        }
    return 1;
}

int cuda_moe_mma_takes(const cuda_backend *cb, const lmx_moe_args *a, int down) {
    const int min_rows = cb->moe_mma[down];
    /* never one row: its pairs each read another expert, and cuda_moe_normed folds its norm into gate / up's x
     * and its combine into the per-pair down projection */
    return min_rows > 0 && a->M >= (min_rows > 2 ? min_rows : 2) && cuda_moe_mma_fits(cb, a, down);
}

int cuda_moe_mma_fits(const cuda_backend *cb, const lmx_moe_args *a, int down) {
    if (a->E > GV_MOE_MAX) return 0;
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    if (F % 256 || C % 256 || (int64_t)mq_stage_bytes<LMX_GGML_Q6_K_A16>((int)(down ? F : C) / 256) > cb->moe_mma_smem)
        return 0; /* (Q6_K's the larger) */
    return down ? moe_experts_are(a, 2, 3, LMX_GGML_Q4_K, LMX_GGML_Q6_K_A16, 1)
                : moe_experts_are(a, 0, 2, LMX_GGML_Q4_K, LMX_GGML_Q4_K, 1);
}

template <int T>
__global__ void k_moe_gu1(const mq_x x, const __grid_constant__ gv_moe mo, const int *pick, int kused, int N, int K,
                          int act, float *__restrict__ h);
template <int T>
__global__ void k_moe_down1(const float *__restrict__ h, const __grid_constant__ gv_moe mo, const int *pick, int kused,
                            int N, int K, float *__restrict__ y, const gv_moe_sum cs);

/* The staged x beside each instance's own tables may pass the 48 KB a launch takes without asking: each is allowed
 * MQ_SMEM, or what the device lets a block have beside its static tables where that is less; cb->moe_mma_smem, the
 * least of them, bounds the rows that take it. */
void cuda_moe_mma_init(cuda_backend *cb) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cb->device);
    const void *fn[6] = {(const void *)k_moe_mma<LMX_GGML_Q4_K, 1, 0>, (const void *)k_moe_mma<LMX_GGML_Q4_K, 0, 0>,
                         (const void *)k_moe_mma<LMX_GGML_Q6_K_A16, 0, 0>, (const void *)k_moe_mma<LMX_GGML_Q4_K, 1, 1>,
                         (const void *)k_moe_mma<LMX_GGML_Q4_K, 0, 1>, (const void *)k_moe_mma<LMX_GGML_Q6_K_A16, 0, 1>};
    cb->moe_mma_smem = MQ_SMEM;
    for (int i = 0; i < 6; i++) {
        cudaFuncAttributes at;
        int allow = 0;
        if (cudaFuncGetAttributes(&at, fn[i]) == cudaSuccess) allow = optin - (int)at.sharedSizeBytes;
        allow = allow < MQ_SMEM ? allow : MQ_SMEM;
        if (allow < 0 || cudaFuncSetAttribute(fn[i], cudaFuncAttributeMaxDynamicSharedMemorySize, allow) != cudaSuccess)
            allow = 0;
        cb->moe_mma_smem = allow < cb->moe_mma_smem ? allow : cb->moe_mma_smem;
    }
    /* the CUDA-core launches on tiles (below): allowed what the device lets a block have (cb->one_smem), so that mq1_spread may ask
     * for more than a launch needs; the multiprocessor's bytes, and each block's static and reserved ones beside */
    int sm = 0, reserved = 0, st = 0;
    cudaDeviceGetAttribute(&sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, cb->device);
    cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, cb->device);
    const void *one[3] = {(const void *)k_moe_gu1<LMX_GGML_Q4_K>, (const void *)k_moe_down1<LMX_GGML_Q4_K>,
                          (const void *)k_moe_down1<LMX_GGML_Q6_K_A16>};
    for (int i = 0; i < 3; i++) {
        cudaFuncAttributes at;
        if (cudaFuncGetAttributes(&at, one[i]) == cudaSuccess && (int)at.sharedSizeBytes > st) st = (int)at.sharedSizeBytes;
    }
    cb->one_smem = optin - st, cb->sm_smem = sm, cb->block_smem = reserved + st;
    for (int i = 0; i < 3; i++)
        if (cudaFuncSetAttribute(one[i], cudaFuncAttributeMaxDynamicSharedMemorySize, cb->one_smem) != cudaSuccess)
            cb->one_smem = (48 << 10) - st, cb->sm_smem = 0; /* the bytes any launch may take; no spreading */
    cudaGetLastError();
}

/* cuda_mq_quant (cuda_mq.h) for type T */
template <int T>
static int mq_quant(cuda_backend *cb, const float *x, int rows, int K, const cuda_moe_router *rt, mq_x *xo,
                    const cuda_row_norm &nm = cuda_row_norm{}) {
    const size_t nq = (size_t)rows * K / 8, ns = (size_t)rows * K / 32 * mq_t<T>::SUMS, nd = (size_t)rows * K / 256;
    uint4 *q = (uint4 *)cuda_scratch(cb, CUDA_SCRATCH_XQ, nq * sizeof(uint4) + ns * sizeof(int) + nd * sizeof(float));
    if (!q) return 0;
    int *s = (int *)(q + nq);
    float *d = (float *)(s + ns);
    *xo = mq_x{q, s, d};
    cuda_launch(cb, k_mq_quant<T>, dim3((unsigned)cuda_blocks(K / 256, 8), (unsigned)(rt ? 2 * rows : rows)), 256, 0, x,
                rows, K, q, s, d, rt ? *rt : cuda_moe_router{}, nm);
    return 1;
}

int cuda_mq_quant(cuda_backend *cb, int type, const float *x, int rows, int K, const cuda_moe_router *rt, mq_x *xo) {
    return type == LMX_GGML_Q4_K ? mq_quant<LMX_GGML_Q4_K>(cb, x, rows, K, rt, xo)
                                 : mq_quant<LMX_GGML_Q6_K_A16>(cb, x, rows, K, rt, xo);
}

/* One projection's launch on x quantized in xo (mq_quant<T>): y [pairs, N] */
template <int T, int PAIR>
static lmx_status mq_launch(cuda_backend *cb, const lmx_moe_args *a, const mq_x &xo, const int *pick, float *y) {
    const int j = PAIR ? 0 : 2, N = (int)a->experts[j].shape[0], K = (int)a->experts[j].shape[1];
    gv_moe tab; /* gate and up, or down */
    gv_moe_fill(&tab, a->experts, a->E, !PAIR);
    const dim3 grid((unsigned)cuda_blocks(N, PAIR ? 64 : 128), (unsigned)a->E);
    const size_t smem = mq_stage_bytes<T>(K / 256);
    if (cuda_moe_tile_base(a->experts[j].q.ggml_type))
        cuda_launch(cb, k_moe_mma<T, PAIR, 1>, grid, 256, smem, xo, tab, pick, a->M * a->K, a->K, N, K, (int)a->act, y);
    else
        cuda_launch(cb, k_moe_mma<T, PAIR, 0>, grid, 256, smem, xo, tab, pick, a->M * a->K, a->K, N, K, (int)a->act, y);
    return cuda_check_launch(cb, PAIR ? "moe gate/up (mma)" : "moe down (mma)");
}

lmx_status cuda_moe_mma_gu(cuda_backend *cb, const lmx_moe_args *a, int *pick, float *pw, float *h) {
    cuda_moe_router rt;
    cuda_moe_router_set(&rt, a, 0, pick, pw);
    mq_x xo;
    if (!mq_quant<LMX_GGML_Q4_K>(cb, (const float *)a->x->data, a->M, (int)a->experts[0].shape[1], &rt, &xo))
        return cb->base.err.status;
    return mq_launch<LMX_GGML_Q4_K, 1>(cb, a, xo, pick, h);
}

lmx_status cuda_moe_mma_down(cuda_backend *cb, const lmx_moe_args *a, const int *pick, const float *h, float *y) {
    const int rows = a->M * a->K, K = (int)a->experts[2].shape[1];
    mq_x xo;
    if (cuda_moe_blocks(a->experts[2].q.ggml_type) == LMX_GGML_Q6_K_A16) {
        if (!mq_quant<LMX_GGML_Q6_K_A16>(cb, h, rows, K, NULL, &xo)) return cb->base.err.status;
        return mq_launch<LMX_GGML_Q6_K_A16, 0>(cb, a, xo, pick, y);
    }
    if (!mq_quant<LMX_GGML_Q4_K>(cb, h, rows, K, NULL, &xo)) return cb->base.err.status;
    return mq_launch<LMX_GGML_Q4_K, 0>(cb, a, xo, pick, y);
}

/* ---- the experts' tiles (LMX_CUDA_MOE_TILES) ---------------------------------------------------------------------
 * A warp of k_moe_mma reads its 16 rows' super-block as ten loads of 8 rows, pieces 1,152 bytes apart (Q4_K, K
 * 2,048); from a tile (mq_tile: the same bytes as one run, the codes in the lanes' order) as four (Q6_K: six) loads
 * of 512 contiguous bytes and two of the scales.  bench/probe_moe_layout.cu, H200: gate / up 70.0 -> 61.4 us, Q4_K /
 * Q6_K down 42.3 / 57.5 -> 35.7 / 48.0 us at batch 32's 112 experts.  Uploaded so, the experts are only tiles: every
 * kernel that reads them takes the tiled types (the per-pair GEMVs and the prefill's dequantization, cuda_ggml.cu). */

/* thread (tile, super-block, lane): lane l's uint4s of the tile, and (l < 16) row l's scales */
template <int T>
__global__ void k_moe_tile(const uint8_t *__restrict__ src, int64_t tiles, int SB, uint8_t *__restrict__ dst) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= tiles * SB * 32) return;
    const int lane = (int)(i % 32), b = (int)(i / 32 % SB), g = lane / 4, t = lane % 4;
    const int64_t tile = i / 32 / SB;
    constexpr int BY = gq_traits<T>::BYTES;
    const int64_t rb = (int64_t)SB * BY;
    const uint8_t *r[2] = {src + (tile * 16 + g) * rb + (int64_t)b * BY, src + (tile * 16 + g + 8) * rb + (int64_t)b * BY};
    typedef mq_tile<T> TL;
    uint8_t *out = dst + (tile * SB + b) * TL::BYTES;
    if constexpr (T == LMX_GGML_Q4_K) {
        for (int q = 0; q < 4; q++) { /* uint4 q: qs[q / 2][2 (q % 2)], qs[q / 2][2 (q % 2) + 1] */
            const uint8_t *row = r[q / 2];
            const uint2 a = *(const uint2 *)(row + 16 + 32 * (2 * (q % 2)) + 8 * t),
                        c = *(const uint2 *)(row + 16 + 32 * (2 * (q % 2) + 1) + 8 * t);
            *(uint4 *)(out + TL::slot(q, lane)) = make_uint4(a.x, a.y, c.x, c.y);
        }
        if (lane < 16) *(uint4 *)(out + TL::scales(lane)) = *(const uint4 *)(src + (tile * 16 + lane) * rb + (int64_t)b * BY);
    } else {
        uint32_t u[24];
        for (int h = 0; h < 2; h++)
            for (int hh = 0; hh < 2; hh++)
                for (int is = 0; is < 2; is++) {
                    const uint8_t *p = r[h];
                    u[12 * h + 4 * hh + 2 * is] = *(const uint32_t *)(p + 64 * hh + 16 * is + 4 * t);
                    u[12 * h + 4 * hh + 2 * is + 1] = *(const uint32_t *)(p + 64 * hh + 32 + 16 * is + 4 * t);
                    u[12 * h + 8 + 2 * hh + is] = *(const uint32_t *)(p + 128 + 32 * hh + 16 * is + 4 * t);
                }
        for (int q = 0; q < 6; q++)
            *(uint4 *)(out + TL::slot(q, lane)) = make_uint4(u[4 * q], u[4 * q + 1], u[4 * q + 2], u[4 * q + 3]);
        if (lane < 16) {
            const uint8_t *p = src + (tile * 16 + lane) * rb + (int64_t)b * BY;
            *(uint4 *)(out + TL::scales(lane)) = *(const uint4 *)(p + 192);
            *(uint4 *)(out + TL::scales(lane) + 16) = make_uint4(*(const uint32_t *)(p + 208), 0u, 0u, 0u);
        }
    }
}

/* Each expert's rows a multiple of 32, so that no tile straddles two experts' views, nor (gate_up_proj: gate's rows,
 * then up's) gate and up. */
int cuda_moe_tiles_takes(const cuda_backend *cb, const lmx_tensor *w) {
    return cb->moe_tiles && !cb->moe_off && w->q.experts > 0 && w->ndim == 2 && w->shape[0] % w->q.experts == 0 &&
           w->shape[0] / w->q.experts % 32 == 0 && w->shape[1] % 256 == 0 &&
           (w->q.ggml_type == LMX_GGML_Q4_K || w->q.ggml_type == LMX_GGML_Q6_K);
}

int cuda_moe_tiled_type(int type) { return type == LMX_GGML_Q4_K ? LMX_GGML_Q4_K_T16 : LMX_GGML_Q6_K_T16; }

lmx_status cuda_moe_tiles_upload(cuda_backend *cb, const lmx_tensor *w, void *dst) {
    const int SB = (int)(w->shape[1] / 256), q4 = w->q.ggml_type == LMX_GGML_Q4_K;
    const int64_t tiles = w->shape[0] / 16, threads = tiles * SB * 32;
    const size_t bytes = cuda_weight_bytes(w);
    uint8_t *stage = NULL;
    cudaError_t e = cudaMallocFromPoolAsync((void **)&stage, bytes, cb->pool, cb->stream);
    if (e != cudaSuccess) return cuda_fail(cb, e, "weight upload (expert tiles)");
    lmx_status st = LMX_OK;
    if (q4) { /* the rows into the stage (Q6_K: as its 16-byte-aligned blocks) */
        e = cudaMemcpyAsync(stage, w->data, bytes, cudaMemcpyHostToDevice, cb->stream);
        if (e != cudaSuccess) st = cuda_fail(cb, e, "weight upload (expert tiles)");
    } else {
        st = cuda_upload_aligned(cb, w, stage);
    }
    if (!st) {
        const dim3 grid((unsigned)((threads + 255) / 256));
        cuda_launch(cb, q4 ? k_moe_tile<LMX_GGML_Q4_K> : k_moe_tile<LMX_GGML_Q6_K_A16>, grid, 256, 0, (const uint8_t *)stage,
                    tiles, SB, (uint8_t *)dst);
        st = cuda_check_launch(cb, "weight upload (expert tiles)");
    }
    cudaFreeAsync(stage, cb->stream);
    e = cudaStreamSynchronize(cb->stream); /* the host rows may go away */
    return st ? st : e == cudaSuccess ? LMX_OK : cuda_fail(cb, e, "weight upload (expert tiles)");
}

/* ---- one row from the tiles ---------------------------------------------------------------------------------------
 * One row's pairs each read another expert, so k_moe_mma's blocks would hold one column of x of its eight.  Here the
 * CUDA cores do the mma's sums for that column (mq_rows::one: each lane's dp4a over the values it gives the mma, added
 * over the row's four lanes) on the tiles' bytes as k_moe_mma's lanes load them (a warp's whole 512-byte runs), so
 * each pair's output has the bits k_moe_mma gives it: three launches, as the per-pair GEMVs' (x's quantization with
 * the norm and the routing, gate / up, down with the combine), where the per-pair GEMVs read tiles as half-slot
 * pieces (twice the L1 wavefronts of rows). */

#define MQ1_NB 4         /* super-blocks a warp of k_moe_down1 holds in flight */
/* the shared memory of one row of x in mq_x's layout for type T */
template <int T> static inline size_t mq1_x_bytes(int K) {
    return (size_t)K / 32 * (4 * sizeof(uint4) + mq_t<T>::SUMS * sizeof(int)) + K / 256 * sizeof(float);
}

/* Block b: tile b % (N / 16) of pair p = b / (N / 16)'s gate and up (16 rows of expert pick[p], against x's row
 * p / kused), copied into shared memory by cp.async in two groups (rows 0-7: each tile's first 1,024 bytes of codes
 * and 128 of scales, with x; rows 8-15: the rest), the second in flight while the first is summed: warp w their
 * super-blocks w, w + 8, ..., lane (g, t) row g + 8 h of group h as k_moe_mma's lane; each super-block's step (f, v)
 * to shared memory, then chained in super-block order as k_moe_mma's sum: h [pairs, N] = act(gate x) (up x).
 * (Loaded into registers instead, a block's 37 KB need 99 registers a thread, and one row's launch does not fit the
 * GPU at once.) */
template <int T> static inline size_t gu1_smem(int K) { /* tiles [gate, up][K / 256]; steps [K / 256][2][16]; x */
    return (size_t)2 * (K / 256) * (mq_tile<T>::BYTES + 16 * sizeof(float2)) + mq1_x_bytes<T>(K);
}
template <int T>
__global__ void __launch_bounds__(256) k_moe_gu1(const mq_x x, const __grid_constant__ gv_moe mo, const int *pick,
                                                 int kused, int N, int K, int act, float *__restrict__ h) {
    extern __shared__ __align__(16) uint8_t gu1_sm[];
    cuda_pdl_wait(); /* pick and x come from the launch before */
    typedef mq_tile<T> TL;
    /* a group's 16-byte copies of a tile: its codes, then its rows' scales */
    constexpr int TB = TL::BYTES, CODES = TL::slot(2, 0) / 16, HALF = CODES + (TL::scales(8) - TL::scales(0)) / 16;
    const int SB = K / 256, tiles = N / 16, p = blockIdx.x / tiles, tile = blockIdx.x % tiles, m = p / kused;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4, e = pick[p];
    float2 *fv = (float2 *)(gu1_sm + (size_t)2 * SB * TB);
    uint4 *sx = (uint4 *)(fv + SB * 32);
    int *sxs = (int *)(sx + K / 32 * 4);
    float *sxd = (float *)(sxs + K / 32);
    for (int hh = 0; hh < 2; hh++) {
        for (int c = threadIdx.x; c < 2 * SB * HALF; c += blockDim.x) {
            const int j = c / (SB * HALF), b = c / HALF % SB, o = c % HALF;
            const size_t off = ((size_t)j * SB + b) * TB +
                               (o < CODES ? TL::slot(2 * hh, 0) + 16 * o : TL::scales(8 * hh) + 16 * (o - CODES));
            cp_async16(smem_addr(gu1_sm + off), (const uint8_t *)mo.w[j][e] + (size_t)tile * SB * TB + off - j * SB * TB);
        }
        for (int c = threadIdx.x; hh == 0 && c < K / 32 * 4 + K / 32 + K / 256; c += blockDim.x) /* x */
            if (c < K / 32 * 4) cp_async16(smem_addr(sx + c), x.q + (size_t)m * K / 32 * 4 + c);
            else if (c < K / 32 * 5) cp_async4_or_zeros(smem_addr(sxs + c - K / 32 * 4), x.s + (size_t)m * K / 32 + c - K / 32 * 4, 4);
            else cp_async4_or_zeros(smem_addr(sxd + c - K / 32 * 5), x.d + (size_t)m * K / 256 + c - K / 32 * 5, 4);
        cp_async_commit();
    }
    for (int hh = 0; hh < 2; hh++) {
        if (hh == 0) cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        /* the down projection may launch once every block's bytes are in (it reads pick before its wait, so after
         * this launch's): at the launch's start, its blocks' loads ran beside these (H200, 12 layers of Qwen3-30B-A3B
         * Q4_K_M, one row: 1,846-1,880 tok/s, against 1,910-1,917) */
        if (hh == 1) cuda_pdl_trigger();
        for (int b = warp; b < SB; b += blockDim.x / 32)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                mq_rows<T> r;
                r.template load_half<0, false>(gu1_sm + ((size_t)j * SB + b) * TB, lane, hh);
                float f, v;
                r.template one<0>(b, sx, sxs, sxd[b], t, f, v);
                if (t == 0) fv[(b * 2 + j) * 16 + g + 8 * hh] = make_float2(f, v);
            }
    }
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int row = threadIdx.x % 16, j = threadIdx.x / 16; /* lanes 0-15 gate's rows, 16-31 up's */
    float acc = 0.0f;
    for (int b = 0; b < SB; b++) {
        const float2 s = fv[(b * 2 + j) * 16 + row];
        acc = fmaf(s.x, s.y, acc);
    }
    const float u = __shfl_down_sync(0xffffffffu, acc, 16);
    if (j == 0) h[(size_t)p * N + tile * 16 + row] = glu_act(acc, act) * u;
}

/* Block (bx, p): rows [32 bx, 32 bx + 32) of expert pick[p]'s down projection (two tiles; warp w half w % 2 of tile
 * w / 2, lane (g, t) its row g as k_moe_mma's lane), its weights' loads issued before the wait (pick is the gate / up
 * launch's input), then h's row p quantized into shared memory (mq_quant_sb, a warp a super-block), the row's
 * super-blocks chained in order as k_moe_mma's sum: y [pairs, N]; then the combine (moe_sum_tail). */
template <int T>
__global__ void __launch_bounds__(128) k_moe_down1(const float *__restrict__ h, const __grid_constant__ gv_moe mo,
                                                   const int *pick, int kused, int N, int K, float *__restrict__ y,
                                                   const gv_moe_sum cs) {
    extern __shared__ uint4 d1_sm[]; /* h's row: codes [K / 32][4], sums [K / 32 SUMS], scales [K / 256] */
    constexpr int TB = mq_tile<T>::BYTES, S = mq_t<T>::SUMS;
    const int SB = K / 256, p = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32, t = lane % 4;
    const int e = *(volatile const int *)(pick + p), n0 = blockIdx.x * 32 + 16 * (warp / 2), hf = warp % 2;
    const uint8_t *tile = (const uint8_t *)mo.w[0][e] + (size_t)(n0 / 16) * SB * TB;
    int *sxs = (int *)(d1_sm + K / 32 * 4);
    float *sxd = (float *)(sxs + K / 32 * S);
    float acc = 0.0f;
    for (int b0 = 0; b0 < SB; b0 += MQ1_NB) {
        mq_rows<T> r[MQ1_NB];
#pragma unroll
        for (int i = 0; i < MQ1_NB; i++)
            if (b0 + i < SB) r[i].template load_half<0>(tile + (size_t)(b0 + i) * TB, lane, hf);
        if (b0 == 0) {
            cuda_pdl_wait(); /* h comes from the launch before */
            for (int sb = warp; sb < SB; sb += blockDim.x / 32) {
                const float *hv = h + (size_t)p * K + 256 * sb + 8 * lane;
                const float4 v0 = *(const float4 *)hv, v1 = *(const float4 *)(hv + 4);
                const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
                mq_quant_sb<T>(v, lane, sb, d1_sm, sxs, sxd);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < MQ1_NB; i++)
            if (b0 + i < SB) {
                float f, v;
                r[i].template one<0>(b0 + i, d1_sm, sxs, sxd[b0 + i], t, f, v);
                acc = fmaf(f, v, acc);
            }
    }
    if (t == 0) y[(size_t)p * N + n0 + 8 * hf + lane / 4] = acc;
    cuda_pdl_trigger(); /* after the sums (at the start, as the GEMVs do: 1,791-1,815 tok/s, as above) */
    if (cs.out) moe_sum_tail(cs, y, kused, N);
}

int cuda_moe_tiles_gu_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    const int64_t F = a->experts[0].shape[0], C = a->experts[0].shape[1];
    return a->E <= GV_MOE_MAX && C % 256 == 0 && F % 16 == 0 && gu1_smem<LMX_GGML_Q4_K>((int)C) <= (size_t)cb->one_smem &&
           moe_experts_are(a, 0, 2, LMX_GGML_Q4_K_T16, LMX_GGML_Q4_K_T16, 0);
}

int cuda_moe_one_takes(const cuda_backend *cb, const lmx_moe_args *a) {
    const int64_t F = a->experts[0].shape[0];
    return a->M == 1 && cuda_moe_tiles_gu_takes(cb, a) && F % 256 == 0 &&
           mq1_x_bytes<LMX_GGML_Q6_K_A16>((int)F) <= (size_t)cb->one_smem &&
           moe_experts_are(a, 2, 3, LMX_GGML_Q4_K_T16, LMX_GGML_Q6_K_T16, 0);
}

/* The dynamic shared memory of a launch of `blocks` blocks of k_moe_gu1 that need `need` bytes each: enough more that
 * a multiprocessor holds no more than its share of them (blocks / SMs, rounded up), so that they spread over the GPU.
 * The gate / up of Qwen3-30B-A3B's one row is 384 blocks of 44 KB, which fit five a multiprocessor: H200, 12 layers
 * in Q4_K_M, 1,757-1,761 tok/s so, 1,910-1,922 held to three (the rows' staged launch: 1,876-1,887). */
static size_t mq1_spread(const cuda_backend *cb, size_t need, int64_t blocks) {
    const int64_t share = (blocks + cb->sm_count - 1) / cb->sm_count;
    const int64_t want = cb->sm_smem / (share + 1) - cb->block_smem + 1024; /* share + 1 blocks do not fit */
    return cb->sm_smem && want > (int64_t)need && want <= cb->one_smem ? (size_t)want : need;
}

template <int T>
static lmx_status mq1_down(cuda_backend *cb, const lmx_moe_args *a, const int *pick, const float *h, float *y,
                           const gv_moe_sum &sum) {
    const int N = (int)a->experts[2].shape[0], K = (int)a->experts[2].shape[1];
    gv_moe tab;
    gv_moe_fill(&tab, a->experts, a->E, 1);
    const dim3 grid((unsigned)(N / 32), (unsigned)a->K);
    gv_moe_sum cs = sum; /* tickets [CUDA_MOE_PAIRS, row blocks] */
    cs.rows = 32;
    cs.ticket = (int *)cuda_scratch(cb, CUDA_SCRATCH_MOE_TICKET, (size_t)CUDA_MOE_PAIRS * grid.x * sizeof(int));
    if (!cs.ticket) return cb->base.err.status;
    cuda_launch(cb, k_moe_down1<T>, grid, 128, mq1_x_bytes<T>(K), h, tab, pick, a->K, N, K, y, cs);
    return cuda_check_launch(cb, "moe down (one row)");
}

lmx_status cuda_moe_tiles_gu(cuda_backend *cb, const lmx_moe_args *a, const cuda_row_norm *nm, int *pick, float *pw,
                             float *h) {
    const int F = (int)a->experts[0].shape[0], C = (int)a->experts[0].shape[1];
    cuda_moe_router rt;
    cuda_moe_router_set(&rt, a, 0, pick, pw);
    mq_x xo;
    if (!mq_quant<LMX_GGML_Q4_K>(cb, (const float *)a->x->data, a->M, C, &rt, &xo, nm ? *nm : cuda_row_norm{}))
        return cb->base.err.status;
    gv_moe tab;
    gv_moe_fill(&tab, a->experts, a->E, 0);
    const int64_t blocks = (int64_t)a->M * a->K * F / 16;
    cuda_launch(cb, k_moe_gu1<LMX_GGML_Q4_K>, dim3((unsigned)blocks), 256, mq1_spread(cb, gu1_smem<LMX_GGML_Q4_K>(C), blocks),
                xo, tab, pick, a->K, F, C, (int)a->act, h);
    return cuda_check_launch(cb, "moe gate/up (tiles)");
}

lmx_status cuda_moe_one(cuda_backend *cb, const lmx_moe_args *a, const cuda_row_norm *nm, int *pick, float *pw,
                        float *h, float *y) {
    lmx_status st = cuda_moe_tiles_gu(cb, a, nm, pick, pw, h);
    if (st) return st;
    const gv_moe_sum sum = {(float *)a->out->data, pw, NULL, 0};
    if (cuda_moe_blocks(a->experts[2].q.ggml_type) == LMX_GGML_Q6_K_A16)
        return mq1_down<LMX_GGML_Q6_K_A16>(cb, a, pick, h, y, sum);
    return mq1_down<LMX_GGML_Q4_K>(cb, a, pick, h, y, sum);
}
