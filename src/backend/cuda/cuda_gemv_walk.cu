/* cuda_gemv_walk.cu - batched decode GEMVs of MLX 4-bit weights (groups of 32, f16 scales and biases: GGUF Q4_0 /
 * Q4_1 / Q4_K as cuda_repack.cu rewrites them, or an MLX file stored in f16) for 9..32 rows of x: each block keeps
 * its part of x in shared memory and walks many row tiles, their weights streamed through a ring of cp.async stages
 * (k_gemv_walk).
 *
 * The tensor-core GEMV (cuda_gemv_tc.cu) stages x a chunk at a time in every block of 128 rows and keeps two steps
 * of loads in flight a lane: at 32 rows of x it held the H200's DRAM 11-19% busy on Llama-3.1-8B's shapes (ncu:
 * 3.4-3.8 warps a scheduler, two blocks a multiprocessor by registers, long-scoreboard and barrier stalls), and an
 * 8B Q4_K_M batch-32 step spent 5.0 of its 6.0 ms in those launches.  Here:
 *
 * - One block a multiprocessor (all of a launch's blocks resident at once).  Block (kq, j) takes the K part kq of kp
 *   (at most WK_PART_CH chunks of 256 values) and row tiles j, j + nb, j + 2 nb, ... of 128 rows (8 warps of 16) over
 *   the launch's segments (q / k / v), or of both weights of the gate / up pair.
 * - Before the wait for x (programmatic dependent launch) it starts its first WK_STAGES - 1 stages: a stage is a
 *   tile's 128 rows x 256 values of one weight, 16 KB of codes and 4 KB of scales and biases, copied by cp.async.
 * - After the wait it stages its part of x once, in f16, already in the order the mma's B registers take it.
 * - Then each stage: wait for it, start the stage WK_STAGES - 1 ahead, decode and multiply (f16 mma.sync m16n8k16,
 *   NT n-tiles of 8 rows of x, f32 accumulators): a weight is fma(q, scale, bias) in f16 (cuda_gemv_tc.cu's TC_Q4H
 *   arithmetic, one rounding).
 * - A tile's kp parts meet in the GEMVs' scratch (gv_parts_meet: the last of the kp blocks adds them in part order,
 *   so a weight gives the same bits in every launch of the same shapes); the pair's GLU and the bias after that.
 *
 * Operand layout (any order of K serves, as long as A and B agree): a lane (g, c) takes, at each step of 128 values,
 * the 32 values of group 4 s + c (four code words); nibbles (e, e + 4) of a word are one f16 pair (a lop3 makes it
 * 1024 + q), so word w's pairs j = 0..3 are pairs 4 w + j of the lane, and mma m takes pairs 2 m (k slots 2c, 2c + 1)
 * and 2 m + 1 (2c + 8, 2c + 9).  x is staged as the same pairs: for (step, n-tile, word w, lane) one 16-byte entry
 * of x's eight values 32 c + 8 w .. + 7 of row 8 nt + g, pairs (j, j + 4). */
#include "cuda_gemv.h"
#include "cuda_mma.h"

#define WK_STAGES 4                    /* the ring: stages in flight while one is summed */
#define WK_STAGE (128 * 128 + 2 * 128 * 16) /* a stage's bytes: codes [128 rows][128 B], scales and biases [128][16 B] */
#define WK_PART_CH 8                   /* chunks of 256 values a K part at most (x's part: NT x 4 KB a chunk; fewer
                                          with LMX_CUDA_WALK_CH, so that tests meet K parts on small shapes) */

/* the shared memory of a launch of nt n-tiles over K parts of ch chunks */
static inline size_t wk_smem(int nt, int ch) { return (size_t)WK_STAGES * WK_STAGE + (size_t)ch * nt * 4096; }

/* Stage u of block (kq, j)'s walk: tile j + (u / (mats ch)) nb, weight u % (mats ch) / ch, chunk kq per + u % ch of
 * K's chunks; rows past a segment's N read its last row (their sums are never stored). */
struct wk_walk {
    int j, nb, mats, ch, ch0, t1, t2; /* t1, t2: the first tiles of segments 1 and 2 (no pair) */
    __device__ __forceinline__ void at(int u, const gv_segs &sg, int &tile, int &seg, int &n0, int &chunk) const {
        const int per = mats * ch, r = u % per;
        tile = j + u / per * nb;
        chunk = ch0 + r % ch;
        if (mats == 2) {
            seg = r / ch, n0 = tile * 128;
        } else {
            seg = tile >= t2 ? 2 : tile >= t1 ? 1 : 0;
            n0 = (tile - (seg == 2 ? t2 : seg == 1 ? t1 : 0)) * 128;
        }
    }
};

/* the f16 pair 1024 + q of nibbles (j, j + 4) of w */
static __device__ __forceinline__ uint32_t wk_pair(uint32_t w, int j) {
    uint32_t t;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"(w >> (4 * j)), "r"(0x000F000Fu), "r"(0x64006400u));
    return t;
}

/* y = x @ w^T for the segments of sg (PAIR: y_0 = act(x @ w_0^T) (x @ w_1^T)), x [M, K] f32, M <= 8 NT */
template <int NT, int PAIR>
__global__ void __launch_bounds__(256, 1)
    k_gemv_walk(const float *__restrict__ x, int M, const gv_segs sg, int K, int act, int kp, const wk_walk walk, int T,
                float *part, int *ticket) {
    extern __shared__ uint4 wk_sm[]; /* stages [WK_STAGES][WK_STAGE], then x [steps][NT][4 words][32 lanes] */
    cuda_pdl_trigger();
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
    const int kq = blockIdx.x % kp, nch = K / 256;
    wk_walk wk = walk; /* this block's: walker j, part kq's chunks (walk.ch: a part's at most) */
    wk.j = blockIdx.x / kp, wk.ch0 = kq * walk.ch, wk.ch = nch - wk.ch0 < walk.ch ? nch - wk.ch0 : walk.ch;
    const int tiles = wk.j < T ? (T - wk.j + wk.nb - 1) / wk.nb : 0, U = tiles * wk.mats * wk.ch;
    uint8_t *ring = (uint8_t *)wk_sm;
    uint4 *sx = (uint4 *)(ring + WK_STAGES * WK_STAGE);
    const int64_t rw = K / 2, rs = K / 16; /* a row's code and scale bytes */
    auto load = [&](int u) { /* stage u into its slot: 4 copies of codes a thread, then one of scales or biases */
        int tile, seg, n0, chunk;
        wk.at(u, sg, tile, seg, n0, chunk);
        const gv_seg G = seg_pick(sg, seg);
        uint8_t *st = ring + (u % WK_STAGES) * WK_STAGE;
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int i = tid + 256 * v, r = i / 8, q = i % 8, n = n0 + r < G.N ? n0 + r : G.N - 1;
            cp_async16(smem_addr(st + r * 128 + 16 * (q ^ ((r & 1) << 2))),
                       (const uint8_t *)G.w + n * rw + (int64_t)chunk * 128 + 16 * q);
        }
        const int r = tid % 128, n = n0 + r < G.N ? n0 + r : G.N - 1;
        cp_async16(smem_addr(st + 128 * 128 + (tid / 128) * 128 * 16 + r * 16),
                   (const uint8_t *)(tid < 128 ? G.scales : G.biases) + n * rs + (int64_t)chunk * 16);
    };
    for (int u = 0; u < WK_STAGES - 1; u++) { /* weights (no kernel writes them) before the wait */
        if (u < U) load(u);
        cp_async_commit();
    }
    cuda_pdl_wait(); /* x comes from the launch before */
    { /* x's part in f16: entry (step, n-tile, word w, lane (g, c)) holds row 8 nt + g's values 32 c + 8 w .. + 7 of
       * the step, as pairs (j, j + 4) */
        const int steps = 2 * wk.ch, entries = steps * NT * 128, k0 = 256 * wk.ch0;
        constexpr int R = 8; /* entries a thread a round: 16 loads in flight */
        for (int e0 = tid; e0 < entries; e0 += R * 256) {
            float4 v[R][2];
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int e = e0 + 256 * i, l = e % 32, w = e / 32 % 4, nt = e / 128 % NT, s = e / (128 * NT);
                const int m = 8 * nt + l / 4, k = k0 + 128 * s + 32 * (l % 4) + 8 * w;
                v[i][0] = v[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if (e < entries && m < M && k < K) {
                    v[i][0] = __ldg((const float4 *)(x + (int64_t)m * K + k));
                    v[i][1] = __ldg((const float4 *)(x + (int64_t)m * K + k + 4));
                }
            }
#pragma unroll
            for (int i = 0; i < R; i++) {
                const int e = e0 + 256 * i;
                if (e >= entries) break;
                __half2 p[4] = {__floats2half2_rn(v[i][0].x, v[i][1].x), __floats2half2_rn(v[i][0].y, v[i][1].y),
                                __floats2half2_rn(v[i][0].z, v[i][1].z), __floats2half2_rn(v[i][0].w, v[i][1].w)};
                sx[e] = *reinterpret_cast<uint4 *>(p);
            }
        }
    }
    const __half2 k1024 = __floats2half2_rn(1024.0f, 1024.0f);
    const int r0 = 16 * warp + g; /* the warp's rows r0 and r0 + 8 of a tile (the same parity: the same swizzle) */
    float acc[NT][4], gate[PAIR ? NT : 1][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    for (int u = 0; u < U; u++) {
        cp_async_wait<WK_STAGES - 2>();
        __syncthreads(); /* stage u is in (and every warp is done with the slot refilled next) */
        if (u + WK_STAGES - 1 < U) load(u + WK_STAGES - 1);
        cp_async_commit();
        const uint8_t *st = ring + (u % WK_STAGES) * WK_STAGE;
        const __half *ss = (const __half *)(st + 128 * 128), *sb = ss + 128 * 8;
        const int xs = 2 * (u % wk.ch); /* the stage's first step of x's part */
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int gi = 4 * s + c, q = gi ^ ((r0 & 1) << 2);
            const uint4 wa = *(const uint4 *)(st + r0 * 128 + 16 * q), wb = *(const uint4 *)(st + (r0 + 8) * 128 + 16 * q);
            const __half2 sa = __half2half2(ss[r0 * 8 + gi]), ba = __half2half2(sb[r0 * 8 + gi]);
            const __half2 sb2 = __half2half2(ss[(r0 + 8) * 8 + gi]), bb = __half2half2(sb[(r0 + 8) * 8 + gi]);
            const uint32_t a4[4] = {wa.x, wa.y, wa.z, wa.w}, b4[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
            for (int w = 0; w < 4; w++) { /* word w: pairs 4 w .. 4 w + 3, mmas 2 w and 2 w + 1 */
                uint32_t pa[4], pb[4];
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    uint32_t ta = wk_pair(a4[w], j), tb = wk_pair(b4[w], j);
                    const __half2 va = __hfma2(__hsub2(*reinterpret_cast<__half2 *>(&ta), k1024), sa, ba);
                    const __half2 vb = __hfma2(__hsub2(*reinterpret_cast<__half2 *>(&tb), k1024), sb2, bb);
                    pa[j] = *reinterpret_cast<const uint32_t *>(&va), pb[j] = *reinterpret_cast<const uint32_t *>(&vb);
                }
                const uint32_t m0[4] = {pa[0], pb[0], pa[1], pb[1]}, m1[4] = {pa[2], pb[2], pa[3], pb[3]};
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    const uint4 xb = sx[(((xs + s) * NT + t) * 4 + w) * 32 + lane];
                    mma_f16(acc[t], m0, xb.x, xb.y);
                    mma_f16(acc[t], m1, xb.z, xb.w);
                }
            }
        }
        if ((u + 1) % wk.ch) continue; /* the weight's part of the tile is not done */
        int tile, seg, n0, chunk;
        wk.at(u, sg, tile, seg, n0, chunk);
        if (PAIR && seg == 0) { /* the gate's sums wait for the up's */
#pragma unroll
            for (int t = 0; t < NT; t++)
#pragma unroll
                for (int i = 0; i < 4; i++) gate[t][i] = acc[t][i], acc[t][i] = 0.0f;
            continue;
        }
        constexpr int F = NT * 4 * (PAIR ? 2 : 1);
        float v[F];
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[4 * t + i] = acc[t][i], acc[t][i] = 0.0f;
                if (PAIR) v[NT * 4 + 4 * t + i] = gate[t][i];
            }
        if (kp > 1 && !gv_parts_meet<F, 8>(v, part, (int64_t)tile * kp + kq, (int64_t)tile * kp, ticket + tile, kp))
            continue;
        const gv_seg G = seg_pick(sg, PAIR ? 0 : seg);
        /* v[4 t + i]: weight row n0 + r0 + 8 (i / 2), x's row 8 t + 2 c + i % 2 (PAIR: the up's; the gate's after
         * them); the pair's outputs as k_gemv_tc writes them: y_0 the GLU, y_1 the up */
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int m = 8 * t + 2 * c + i % 2, n = n0 + r0 + 8 * (i / 2);
                if (m >= M || n >= G.N) continue;
                if constexpr (PAIR) {
                    const float gt = v[NT * 4 + 4 * t + i] + bias_at(sg.s[0].bias, sg.s[0].bt, n);
                    const float up = v[4 * t + i] + bias_at(sg.s[1].bias, sg.s[1].bt, n);
                    sg.s[0].y[(int64_t)m * G.N + n] = glu_act(gt, act) * up;
                    sg.s[1].y[(int64_t)m * G.N + n] = up;
                } else {
                    G.y[(int64_t)m * G.N + n] = v[4 * t + i] + bias_at(G.bias, G.bt, n);
                }
            }
    }
    cp_async_wait<0>();
}

typedef void (*wk_fn)(const float *, int, const gv_segs, int, int, int, const wk_walk, int, float *, int *);
template <int PAIR> static wk_fn wk_kernel(int nt) {
    return nt == 2 ? k_gemv_walk<2, PAIR> : nt == 3 ? k_gemv_walk<3, PAIR> : k_gemv_walk<4, PAIR>;
}

void cuda_gemv_walk_init(cuda_backend *cb) {
    int optin = 0;
    cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cb->device);
    cb->gemv_walk_smem = optin;
    for (int nt = 2; nt <= 4 && cb->gemv_walk_smem > 0; nt++)
        for (int pair = 0; pair < 2; pair++)
            if (cudaFuncSetAttribute((const void *)(pair ? wk_kernel<1>(nt) : wk_kernel<0>(nt)),
                                     cudaFuncAttributeMaxDynamicSharedMemorySize, optin) != cudaSuccess)
                cb->gemv_walk_smem = 0;
    cudaGetLastError();
}

/* K parts: the fewest whose chunks (per a part) fit x's staging beside the ring */
static int wk_parts(const cuda_backend *cb, int nch, int nt, int *per) {
    const int fit = (int)(((int64_t)cb->gemv_walk_smem - WK_STAGES * WK_STAGE - 1024) / (nt * 4096));
    const int most = cb->gemv_walk_ch < WK_PART_CH ? cb->gemv_walk_ch : WK_PART_CH, cap = fit < most ? fit : most;
    if (cap < 1) return 0;
    const int kp = (nch + cap - 1) / cap;
    *per = (nch + kp - 1) / kp;
    return (kp - 1) * *per < nch ? kp : 0; /* every part holds a chunk */
}

int cuda_gemv_walk_takes(const cuda_backend *cb, int n, const gv_segs *sg, int glu, int M, int64_t K) {
    if (cb->gemv_walk <= 0 || cb->gemv_walk_smem <= 0 || M < cb->gemv_walk || M <= 8 || M > 32 || K % 256 ||
        sg->group != 32 || sg->sdt != LMX_DTYPE_F16 || (glu >= 0 && n != 2))
        return 0;
    int T = 0, per = 0;
    for (int i = 0; i < n; i++) {
        const gv_seg *s = &sg->s[i];
        if ((uintptr_t)s->w % 16 || (uintptr_t)s->scales % 16 || (uintptr_t)s->biases % 16) return 0;
        if (glu < 0 || i == 0) T += (s->N + 127) / 128;
    }
    const int kp = wk_parts(cb, (int)(K / 256), (M + 7) / 8, &per);
    return kp > 0 && (int64_t)T * kp <= (int64_t)3 * 4 * cb->sm_count; /* the scratch's cells and tickets */
}

lmx_status cuda_gemv_walk(cuda_backend *cb, int n, const gv_segs *sg, int glu, const float *x, int M, int K) {
    const int nt = (M + 7) / 8;
    int per = 0, T = 0, first[3] = {0, 0, 0};
    const int kp = wk_parts(cb, K / 256, nt, &per);
    for (int i = 0; i < n; i++) {
        first[i] = T;
        if (glu < 0 || i == 0) T += (sg->s[i].N + 127) / 128;
    }
    float *part = NULL;
    int *ticket = kp > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    if (kp > 1 && !ticket) return LMX_ERR_UNSUPPORTED; /* (no error kept) */
    int nb = cb->sm_count / kp;
    nb = nb < 1 ? 1 : nb > T ? T : nb;
    const wk_fn k = glu >= 0 ? wk_kernel<1>(nt) : wk_kernel<0>(nt);
    const size_t smem = wk_smem(nt, per);
    /* the block's walker (blockIdx.x / kp) and part (% kp) are set in the kernel */
    const wk_walk w = {0, nb, glu >= 0 ? 2 : 1, per, 0, n > 1 && glu < 0 ? first[1] : T, n > 2 && glu < 0 ? first[2] : T};
    cuda_launch(cb, k, dim3((unsigned)(nb * kp)), 256, smem, x, M, *sg, K, glu < 0 ? 0 : glu, kp, w, T, part, ticket);
    return cuda_check_launch(cb, glu >= 0 ? "matmul + glu (walk)" : "matmul (walk)");
}
