/* cuda_gstream.cu - one row of MLX 4-bit weights (decode of one sequence) as a stream, k_gstream1; long rows of
 * Q6_K the same way, k_gstream6. */
#include "cuda_ggml_x.h"

/* The one row x [K] into o by a block of 256 threads (k_gstream1's own, XS), normalised where nm.w: the loads of
 * four passes of 32 parts at once, then their quantization (a pass at a time, each waiting on its load, left
 * the 8B's MLX 4-bit decode at 451 tok/s against 464). */
static __device__ __forceinline__ void gquant_x_row(const float *__restrict__ x, const gq_xq &o, int K,
                                                    const cuda_row_norm &nm, float inv) {
    const int P = K / 32;
    for (int b = 0; b * 32 < P; b += 4) {
        float4 v[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int p = (b + j) * 32 + threadIdx.x / 8;
            v[j] = gquant_x_load(x, K, nm, inv, 0, p < P ? p : P - 1);
        }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int p = (b + j) * 32 + threadIdx.x / 8;
            if ((b + j) * 32 < P) gq_quant_part(v[j], o, gq_xq{}, 0, p < P ? p : P - 1, p < P);
        }
    }
}

/* k_gstream1: the one-row GEMV of MLX 4-bit rows (decode of one sequence) as a stream.  The launch's
 * segments form one space of row groups: two rows of a segment (q's, then k's, then v's), or row n of gate
 * and of up (PAIR).  The grid is the blocks that fit the multiprocessors at once, and warp w of W takes
 * groups w, w + W, ...; a step of a group is lane l's unit (64 values: two 16-byte vectors, two parts of x)
 * l + 32 s of both rows, with its scales and biases.  The next step's weights (at a group's end, the next
 * group's first) are loaded while the current ones are used, the first before the wait: a warp keeps its
 * loads in flight from its start to its end, where k_ggemv's warps (a group each, in blocks of their own)
 * ran dry at every group (H100, bench_cuda_gemv, one row of the 8B's gate/up shape: 1.83 -> 2.54 TB/s).  x
 * in the layout of 64-value units (as Q4_K's) and in nibble order (gs_dot), quantized by each block (XS; with
 * the grid this size, a few hundred times a launch) or by a launch before.  Groups of 32 (two scales a unit),
 * 64 or 128; 16-bit scales. */
struct gs_unit {
    uint4 w[2];
    uint32_t s, b; /* raw: a 16-bit scale and bias, or (groups of 32) the unit's two, the second in the high half */
};

/* dp2a of two int16 x (a) and two unsigned bytes of b (low or high half), added to c */
static __device__ __forceinline__ int gs_dp2a_lo(int a, uint32_t b, int c) {
    int d;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
static __device__ __forceinline__ int gs_dp2a_hi(int a, uint32_t b, int c) {
    int d;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* The codes of a part (four words of 8 nibbles) . its x in nibble order (gq_xq.nib): the low nibbles as
 * bytes against x0, x2, x4, x6, the high ones kept in place (16 times the code) against x1, x3, x5, x7, so a
 * word costs two masks and four dp2a (exact in int32: the second sum is a multiple of 16). */
static __device__ __forceinline__ int gs_dot(const uint4 &w, const int4 (&X)[4]) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    int il = 0, ih = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t lo = ws[i] & 0x0F0F0F0Fu, hi = ws[i] & 0xF0F0F0F0u;
        il = gs_dp2a_lo(X[i].x, lo, il), il = gs_dp2a_hi(X[i].y, lo, il);
        ih = gs_dp2a_lo(X[i].z, hi, ih), ih = gs_dp2a_hi(X[i].w, hi, ih);
    }
    return il + (ih >> 4);
}

/* The stream's walk (k_gstream1, k_gstream6): warp groups g, g + W, ... (G of them) of S steps each, the next
 * step's weights (at a group's end, the next group's first) loaded while the current ones are used; cur holds
 * group g's step 0, loaded before the kernel's wait.  pos is where group g's rows are, as rows(g) returns it
 * (pointing the loads at them); load(u, s) and use(u, s, acc) take a step of the group the loads point at, and
 * finish(g, pos, acc) stores a group's two sums and clears acc. */
template <class U, class P, class Rows, class Load, class Use, class Fin>
static __device__ __forceinline__ void gs_walk(int g, P pos, U (&cur)[2], int G, int S, int W, Rows rows, Load load,
                                               Use use, Fin finish) {
    float acc[2] = {0.0f, 0.0f};
    int s = 0;
    while (g < G) {
        int gn = g, sn = s + 1;
        P pn = pos;
        if (sn == S) gn = g + W, sn = 0;
        U nxt[2];
        if (gn < G) {
            if (gn != g) pn = rows(gn);
            load(nxt, sn);
        }
        use(cur, s, acc);
        if (sn == 0) finish(g, pos, acc);
        cur[0] = nxt[0], cur[1] = nxt[1];
        g = gn, s = sn, pos = pn;
    }
}

template <int PAIR, int XS, int F16>
__global__ void __launch_bounds__(256, 2) k_gstream1(const int4 *__restrict__ xq, const float4 *__restrict__ xm,
                                                     const gv_segs sg, int K, int PR, int act, int resid,
                                                     const float *__restrict__ xf, const cuda_row_norm nm) {
    cuda_pdl_trigger();
    constexpr lmx_dtype sdt = F16 ? LMX_DTYPE_F16 : LMX_DTYPE_BF16; /* the scales' and biases' */
    const int lane = threadIdx.x % 32, NU = K / 64, S = (NU + 31) / 32; /* units of a row; steps a group */
    const int4 *xqv = XS ? gq_xs : xq; /* x's codes and scales: the block's own (XS) or the launch before's */
    const float4 *xmv = XS ? (const float4 *)(gq_xs + PR * 4) : xm;
    const int W = gridDim.x * 8, g32 = sg.group == 32, lgs = sg.group == 128; /* a unit's scales: 2, 1, 1/2 */
    const int e0 = PAIR ? sg.s[0].N : (sg.s[0].N + 1) / 2, e1 = PAIR ? e0 : e0 + (sg.s[1].N + 1) / 2;
    const int G = PAIR ? e0 : e1 + (sg.s[2].N + 1) / 2; /* groups; segment i's end at e_i */
    const int64_t row_bytes = (int64_t)K / 2, srow = (int64_t)K / sg.group * 2; /* codes, scales of a row */
    auto seg_of = [&](int g, int &j) { /* group g's segment, j its index there */
        const int i = g < e0 ? 0 : g < e1 ? 1 : 2;
        j = g - (i == 0 ? 0 : i == 1 ? e0 : e1);
        return i;
    };
    const uint8_t *wr[2];        /* the rows of the group whose step loads next: codes, */
    const unsigned short *sr[2], *br[2]; /* scales and biases */
    auto rows = [&](int g) { /* and group g's segment and its index there */
        int j = g;
        const int i = PAIR ? 0 : seg_of(g, j);
        const gv_seg S0 = PAIR ? sg.s[0] : seg_pick(sg, i);
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const gv_seg &Sr = PAIR && r ? sg.s[1] : S0;
            const int n = PAIR ? j : 2 * j + r, row = n < Sr.N ? n : Sr.N - 1;
            wr[r] = (const uint8_t *)Sr.w + row * row_bytes + lane * 32;
            sr[r] = (const unsigned short *)((const char *)Sr.scales + row * srow);
            br[r] = (const unsigned short *)((const char *)Sr.biases + row * srow);
        }
        return make_int2(i, j);
    };
    auto load = [&](gs_unit (&u)[2], int s) {
        const int c = lane + 32 * s;
        if (c >= NU) return;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const uint4 *p = (const uint4 *)(wr[r] + s * 1024);
            u[r].w[0] = __ldcs(p), u[r].w[1] = __ldcs(p + 1);
            if (g32) { /* the unit's two, each a 16-bit load (the scales' alignment is theirs) */
                u[r].s = __ldg(sr[r] + 2 * c) | (uint32_t)__ldg(sr[r] + 2 * c + 1) << 16;
                u[r].b = __ldg(br[r] + 2 * c) | (uint32_t)__ldg(br[r] + 2 * c + 1) << 16;
            } else {
                u[r].s = __ldg(sr[r] + (c >> lgs)), u[r].b = __ldg(br[r] + (c >> lgs));
            }
        }
    };
    auto use = [&](const gs_unit (&u)[2], int s, float (&acc)[2]) {
        const int c = lane + 32 * s;
        if (c >= NU) return;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int pp = 2 * c + k; /* the part */
            const int4 *xv = xqv + gq_xchunk(pp, 1);
            const int4 X[4] = {gq_ldx<XS>(xv), gq_ldx<XS>(xv + 32), gq_ldx<XS>(xv + 64), gq_ldx<XS>(xv + 96)};
            const float4 xs = gq_ldx<XS>(xmv + gq_xpart(pp, 1));
            const float xsum = xs.y + xs.z; /* d * the codes' sum */
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const uint32_t sh = g32 && k ? 16 : 0;
                const float sv = raw_val((u[r].s >> sh) & 0xffffu, sdt), bv = raw_val((u[r].b >> sh) & 0xffffu, sdt);
                acc[r] = fmaf(xs.x * sv, (float)gs_dot(u[r].w[k], X), fmaf(bv, xsum, acc[r]));
            }
        }
    };
    auto finish = [&](int g, int2 pos, float (&acc)[2]) { /* group g's (segment pos.x's pos.y) sums over the
                                                              lanes, stored as k_ggemv stores them */
        const int i = pos.x, j = pos.y;
        const float a0 = cuda_warp_sum(acc[0]), a1 = cuda_warp_sum(acc[1]);
        acc[0] = acc[1] = 0.0f;
        if (lane != 0) return;
        if constexpr (PAIR != 0) {
            float gv = a0 + bias_at(sg.s[0].bias, sg.s[0].bt, g), uv = a1 + bias_at(sg.s[1].bias, sg.s[1].bt, g);
            if (sg.s[0].lb) gv = gv + gv_lora_term(sg.s[0], g); /* as the lora op adds it, before the GLU */
            if (sg.s[1].lb) uv = uv + gv_lora_term(sg.s[1], g);
            sg.s[0].y[g] = glu_act(gv, act) * uv;
            sg.s[1].y[g] = uv;
        } else {
            const gv_seg S0 = seg_pick(sg, i);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int n = 2 * j + r;
                if (n >= S0.N) break;
                float o = (r ? a1 : a0) + bias_at(S0.bias, S0.bt, n);
                if (S0.lb) o = o + gv_lora_term(S0, n);
                S0.y[n] = resid ? S0.y[n] + o : o;
            }
        }
    };

    const int g = blockIdx.x * 8 + threadIdx.x / 32; /* the warp's first group */
    int2 pos = make_int2(0, g);
    gs_unit cur[2];
    if (g < G) { /* weights, which no kernel writes: before the wait */
        pos = rows(g);
        load(cur, 0);
    }
    cuda_pdl_wait(); /* x is ready */
    if constexpr (XS) {
        __shared__ float part[8];
        const gq_xq o = {gq_xs, (float4 *)(gq_xs + PR * 4), PR, 1, 1};
        const float inv = nm.w ? cuda_rms_inv256(xf, K, nm.eps, part) : 1.0f;
        gquant_x_row(xf, o, K, nm, inv);
        __syncthreads();
    }
    gs_walk(g, pos, cur, G, S, W, rows, load, use, finish);
}

/* k_gstream6: one row of one segment of Q6_K (the 16-byte-aligned layout) as k_gstream1 streams MLX rows: warp w
 * of W takes groups of two rows w, w + W, ...; a step of a group is lane l's unit (half a block: 128 values, its
 * codes, scales and d) l + 32 s of both rows.  x is quantized by a launch before in the layout of Q6_K's units.
 * For rows of K >= GS6_MIN_K: the int16 kernel (k_ggemv) loads a lane's next unit only after it has used the
 * last, and its launch over the 8B's Q6_K down projection (K = 14,336) took 28.8 us in a decode graph for 51 MB.
 * One block a multiprocessor: two units of two rows a lane in registers (246; held to 128 for two blocks, it
 * spilled and ran 7% below the int16 kernel). */
#define GS6_MIN_K 8192
__global__ void __launch_bounds__(256, 1) k_gstream6(const int4 *__restrict__ xq, const float4 *__restrict__ xm,
                                                      const gv_segs sg, int K, int resid) {
    cuda_pdl_trigger();
    constexpr int T = LMX_GGML_Q6_K_A16, UP = gq_unit<T>::UP, BYTES = gq_traits<T>::BYTES;
    const gv_seg &S0 = sg.s[0];
    const int lane = threadIdx.x % 32, NU = K / 128, S = (NU + 31) / 32, W = gridDim.x * 8, G = (S0.N + 1) / 2;
    const int64_t row_bytes = (int64_t)(K / gq_traits<T>::ELEMS) * BYTES;
    const uint8_t *wr[2]; /* the rows of the group whose step loads next */
    auto rows = [&](int g) {
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int n = 2 * g + r, row = n < S0.N ? n : S0.N - 1;
            wr[r] = (const uint8_t *)S0.w + row * row_bytes;
        }
        return 0;
    };
    auto load = [&](gq_unit<T> (&u)[2], int s) {
        const int c = lane + 32 * s;
        if (c >= NU) return;
#pragma unroll
        for (int r = 0; r < 2; r++) u[r].load(wr[r] + (int64_t)(c >> 1) * BYTES, c & 1);
    };
    auto use = [&](const gq_unit<T> (&u)[2], int s, float (&acc)[2]) { /* as ggemv_body's one row: gq_part_acc */
        const int c = lane + 32 * s;
        if (c >= NU) return;
#pragma unroll
        for (int k = 0; k < UP; k++) {
            const int pp = c * UP + k; /* the part */
            const int4 *xv = xq + gq_xchunk(pp, gq_ul(UP));
            const int4 X[4] = {__ldg(xv), __ldg(xv + 32), __ldg(xv + 64), __ldg(xv + 96)};
            const float4 xs = __ldg(xm + gq_xpart(pp, gq_ul(UP)));
            gq_two_acc(u, k, X, xs, acc);
        }
    };
    auto finish = [&](int g, int, float (&acc)[2]) { /* as k_ggemv stores them */
        const float a0 = cuda_warp_sum(acc[0]), a1 = cuda_warp_sum(acc[1]);
        acc[0] = acc[1] = 0.0f;
        if (lane != 0) return;
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const int n = 2 * g + r;
            if (n >= S0.N) break;
            const float o = (r ? a1 : a0) + bias_at(S0.bias, S0.bt, n);
            S0.y[n] = resid ? S0.y[n] + o : o;
        }
    };
    const int g = blockIdx.x * 8 + threadIdx.x / 32;
    gq_unit<T> cur[2];
    if (g < G) { /* weights, which no kernel writes: before the wait */
        rows(g);
        load(cur, 0);
    }
    cuda_pdl_wait(); /* x is ready */
    gs_walk(g, 0, cur, G, S, W, rows, load, use, finish);
}

/* The streamed one-row GEMV (k_gstream1) of the n MLX 4-bit segments of sg (glu >= 0: the gate/up pair), x
 * quantized by each block where K <= GQ_XS_MAX_K, else by a launch before (the 8B's down projection, K = 14,336,
 * quantizing in each of its 264 blocks: 464 -> 451 tok/s); nm's norm folded in. */
int cuda_gstream_takes(const cuda_backend *cb, const lmx_tensor *w) {
    return w->q.bits == 4 && !w->q.ggml_type && w->shape[1] % 64 == 0 && cb->gemv_variant != 5 &&
           (w->q.scale_dtype == LMX_DTYPE_BF16 || w->q.scale_dtype == LMX_DTYPE_F16);
}
lmx_status cuda_gstream(cuda_backend *cb, int n, const gv_segs &sg, int glu, const float *x, int K,
                        const cuda_row_norm &nm, int resid) {
    const int xs = K <= GQ_XS_MAX_K && cb->gemv_variant != 4, pair = glu >= 0;
    typedef void (*gs_fn)(const int4 *, const float4 *, gv_segs, int, int, int, int, const float *, cuda_row_norm);
    const gs_fn k = sg.sdt == LMX_DTYPE_F16
                        ? (pair ? (xs ? k_gstream1<1, 1, 1> : k_gstream1<1, 0, 1>) : (xs ? k_gstream1<0, 1, 1> : k_gstream1<0, 0, 1>))
                        : (pair ? (xs ? k_gstream1<1, 1, 0> : k_gstream1<1, 0, 0>) : (xs ? k_gstream1<0, 1, 0> : k_gstream1<0, 0, 0>));
    int64_t groups = 0; /* k_gstream1's row groups */
    for (int i = 0; i < (pair ? 1 : n); i++) groups += pair ? sg.s[i].N : (sg.s[i].N + 1) / 2;
    const int up = 2; /* x in the layout of 64-value units */
    gq_xq xo = {NULL, NULL, (int)gq_row_parts(K, up), 1, 1};
    if (!xs && !gq_quant_x(cb, &up, 1, x, 1, K, nm, &xo, NULL, 1)) return cb->base.err.status;
    const int64_t fit = (int64_t)(cb->stream_bpm > 0 ? cb->stream_bpm : cuda_fit_blocks(cb, (const void *)k)) * cb->sm_count;
    const int64_t blocks = (groups + 7) / 8 < fit ? (groups + 7) / 8 : fit;
    cuda_launch(cb, k, dim3((unsigned)blocks), 256, gq_xs_bytes(xs, xo), (const int4 *)xo.xq, (const float4 *)xo.xm, sg,
                K, xo.PR, pair ? glu : 0, resid, x, nm);
    return cuda_check_launch(cb, pair ? "matmul + glu" : "matmul");
}

int cuda_gstream6_takes(const cuda_backend *cb, int type, int n, int glu, const gv_segs &sg, int64_t K) {
    return type == LMX_GGML_Q6_K_A16 && n == 1 && glu < 0 && K >= GS6_MIN_K && K % 256 == 0 && !sg.s[0].lb &&
           cb->gemv_variant != 5;
}
lmx_status cuda_gstream6(cuda_backend *cb, const gv_segs &sg, const gq_xq &xo, int K, int resid) {
    const int64_t groups = (sg.s[0].N + 1) / 2;
    const int64_t fit = (int64_t)cuda_fit_blocks(cb, (const void *)k_gstream6) * cb->sm_count;
    const int64_t blocks = (groups + 7) / 8 < fit ? (groups + 7) / 8 : fit;
    cuda_launch(cb, k_gstream6, dim3((unsigned)blocks), 256, 0, (const int4 *)xo.xq, (const float4 *)xo.xm, sg, K, resid);
    return cuda_check_launch(cb, "matmul");
}
