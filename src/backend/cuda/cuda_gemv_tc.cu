/* cuda_gemv_tc.cu - decode GEMVs of 2..CUDA_GEMV_TC_ROWS rows on the tensor cores (batched decode).
 *
 * y_i [M, N_i] = x [M, K] @ w_i^T (+ b_i) for bf16 / f16, MLX 4 / 8-bit and GGUF Q4_0 / Q8_0 / Q4_K / Q5_K /
 * Q6_K weights, one weight or a q/k/v group (blockIdx.y picks it) or the gate/up pair with the GLU, as
 * cuda_gemv's contract says.  Each weight byte is read once for all M rows: the weights are the A
 * operand of mma.sync m16n8k16 (16 rows a warp), x the B operand (8 rows of x per n-tile, NT n-tiles),
 * f32 accumulators.  The CUDA-core kernels of cuda_gemv.cu spend 2 * M flops and M loads of x per
 * weight: from M = 2 they run out of issue slots before bandwidth; here a weight costs the same
 * whatever M is.
 *
 * Operand layout.  A dot product may take its K index in any order as long as A and B agree, so each
 * lane loads whole 16-byte vectors and the k slots of the mma fragments are assigned to them: with
 * g = lane / 4 and c = lane % 4, the fragment gives lane (g, c) the k slots {2c, 2c+1, 2c+8, 2c+9} of
 * rows g and g+8 (A) and of column g (B).  Dense: lane c reads the 8 values at 32 s + 8 c of its two
 * rows (step s covers 32 k); the first mma takes the first four, the second the last four.  MLX and
 * GGUF: lane c takes the 32 values at 128 s + 32 c (MLX 4-bit: 4 words, 8-bit: 8, one group at most, as
 * group % 32 == 0; GGUF: one part, its raw bytes loaded a step ahead, gq_raw); each 8 of them feed two mmas,
 * paired (e, e + 4) as a mask of an MLX 4-bit word pairs them.  MLX codes become bf16 exactly (4-bit:
 * 0x4300 | q reads 128 + q, less 128; 8-bit: through f32, tc_dequant8) and then scale * q + bias rounded to
 * bf16 (with f16 scales and biases all of it in f16, x too: TC_Q4H / TC_Q8H below), GGUF parts their gq_value
 * rounded to bf16: the values the prefill dequantizers produce (up to 16 rows, GGUF codes below 128 take bf16
 * arithmetic with the part's scale and min rounded to bf16: tc_dequant_bytes).  x is rounded to bf16 (f16 for
 * f16 weights and f16-scaled MLX), as the prefill GEMMs round it, and staged in shared memory a chunk of K at
 * a time, already in the order the B registers take it.
 *
 * Work split: a block of 8 warps takes 128 rows (16 a warp; the gate/up pair 128 rows of each), all its
 * warps on the same range of K, so x is staged once per 128 rows.  When the row blocks alone would not
 * fill the GPU, KP blocks share a row block, each a part of K: each leaves its sums in scratch, and the
 * last to finish (a ticket counter, reset for the next launch) loads every part of a sum at once (a loop of
 * dependent L2 reads was the tail of every small matrix: 8B Q4_K_M batch 32 +16%), adds them in part order
 * and stores.  KP depends only on the launch's shapes and the GPU, so a weight gives the same bits in any
 * launch. */
#include <type_traits>

#include "cuda_gemv.h"
#include "cuda_ggml.h"

#define TC_WARPS 8
#define TC_PAD 32    /* bf16 after each staged row: consecutive rows start 16 banks apart */
#define TC_PARTS_MAX 16 /* K parts a row block at most (tc_parts; the last block loads them all at once) */

static __device__ __forceinline__ uint32_t tc_pack(float a, float b, int f16) {
    uint32_t r;
    if (f16) {
        __half2 v = __floats2half2_rn(a, b);
        r = *reinterpret_cast<uint32_t *>(&v);
    } else {
        __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
        r = *reinterpret_cast<uint32_t *>(&v);
    }
    return r;
}

template <int F16>
static __device__ __forceinline__ void tc_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    if constexpr (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                     "{%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Per kind: k values per lane and load (E), per warp and step (SK = 4 E), steps of loads in flight (U;
 * GGUF one: its raw parts take 6-21 registers a row); x values a row staged in shared memory at a time
 * (CH: 33 KB for 8 or 16 rows, 35 KB for 24 or 32). */
#define TC_GQ 64 /* KIND TC_GQ + t: GGUF blocks of type t (decoded a part of 32 at a time, cuda_ggml.h) */
/* MLX 4 / 8-bit with f16 scales and biases (GGUF blocks as cuda_repack.cu rewrites them, MLX files stored in
 * f16): decoded in f16 arithmetic, the scale and bias exact, and multiplied with x rounded to f16.  In bf16 the
 * scale and bias would be rounded once for the whole group, an error shared by its 32 weights (measured on
 * SmolLM2-135M Q4_1 against a float64 forward pass, prompts of 17-29 tokens: max |err| 0.46 in bf16, 0.043 on
 * the GGUF blocks); here each weight's one rounding (2^-11) is its own. */
#define TC_Q4H (TC_GQ - 2)
#define TC_Q8H (TC_GQ - 1)
template <int KIND, int PAIR, int NT> struct tc {
    static constexpr int GT = KIND >= TC_GQ ? KIND - TC_GQ : 0, H = KIND == TC_Q4H || KIND == TC_Q8H;
    static constexpr int Q8 = KIND == GV_Q8 || KIND == TC_Q8H, Q = KIND == GV_Q4 || Q8 || GT || H;
    static constexpr int E = Q ? 32 : 8, SK = 4 * E, U = GT ? 1 : Q ? 2 : PAIR ? 2 : 4;
    static constexpr int F16 = KIND == GV_F16 || H, CH = NT <= 2 ? 2048 / NT : 512;
    /* GGUF codes below 128 (all but Q8_0's) up to 16 rows: decoded a bf16 pair at a time (tc_dequant_bytes),
     * pairing the values (e, e + 2) of each 4, not (e, e + 4).  Measured on an H100, 8B Q4_K_M, tok/s: batch
     * 8 1,361 -> 1,466; at 32 rows (3,356 -> 3,176) the conversions were not what bound the kernel. */
    static constexpr int BP = GT != 0 && GT != LMX_GGML_Q8_0 && NT <= 2;
    /* x's staging: groups of 8 values a thread a round, loaded before any is used (of IT a chunk).  One for bf16 at 32
     * rows (registers); the quantized kinds' gate / up pair, one block a multiprocessor by its registers anyway, half
     * the chunk's: ncu on the 8B Q4_K_M's pair at 32 rows found 16% of its stall samples on these loads, and batch
     * 12 / 16 ran 3% / 2% faster (H200) */
    static constexpr int IT = NT * CH / 256, XB = Q && PAIR ? IT / 2 : NT < 4 || Q ? 2 : 1;
};

/* One step's loads of a lane: per row tile t, rows g and g + 8 (16 bytes each; MLX 8-bit 32: w then w2) and
 * for MLX their group's raw scale and bias; GGUF (type GT): the raw part of each row. */
template <int T, int GT> struct tc_ld {
    uint4 w[T][2], w2[T][2];
    uint32_t s[T][2], b[T][2];
    gq_raw<GT> r[T][2];
};

/* The pair type of the A registers: bf16, or f16 for MLX weights with f16 scales and biases (TC_Q4H, TC_Q8H):
 * the 16-bit pattern that reads OFF + q for a 4-bit code q in its low bits, and a pair of floats packed. */
template <class P> struct tc_pair;
template <> struct tc_pair<__nv_bfloat162> {
    static constexpr uint32_t MAGIC = 0x43004300u; /* 128 + q */
    static constexpr float OFF = 128.0f;
    static __device__ __forceinline__ __nv_bfloat162 pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <> struct tc_pair<__half2> {
    static constexpr uint32_t MAGIC = 0x64006400u; /* 1024 + q */
    static constexpr float OFF = 1024.0f;
    static __device__ __forceinline__ __half2 pack(float a, float b) { return __floats2half2_rn(a, b); }
};

/* 4-bit word -> the A registers of its two mmas: pairs (q_e, q_{e+4}) * scale + bias.  The code pair becomes
 * OFF + q by one lop3 ((w >> 4 j) & 0x000F000F | MAGIC, both masks in registers), q after a subtraction. */
template <class P> static __device__ __forceinline__ void tc_dequant4(uint32_t w, P s, P b, uint32_t (&p)[4]) {
    const P off = tc_pair<P>::pack(tc_pair<P>::OFF, tc_pair<P>::OFF);
    const uint32_t lo = 0x000F000Fu, hi = tc_pair<P>::MAGIC;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t t;
        asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"(w >> (4 * j)), "r"(lo), "r"(hi)); /* (a & b) | c */
        P v = __hfma2(__hsub2(*reinterpret_cast<P *>(&t), off), s, b);
        p[j] = *reinterpret_cast<uint32_t *>(&v);
    }
}

/* MLX 8-bit: words a (values e = 0..3 of 8) and b (e = 4..7) -> the A registers of their two mmas, pairs
 * (q_e, q_{e+4}) * scale + bias as tc_dequant4 makes them.  A code becomes f32 2^23 + q by one prmt (its byte
 * under 0x4B000000), q after a subtraction, and bf16 or f16 exactly (q < 256). */
template <class P> static __device__ __forceinline__ void tc_dequant8(uint32_t a, uint32_t b, P s, P bi, uint32_t (&p)[4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float qa = __uint_as_float(__byte_perm(a, 0x4B000000u, 0x7650u + j)) - 8388608.0f;
        const float qb = __uint_as_float(__byte_perm(b, 0x4B000000u, 0x7650u + j)) - 8388608.0f;
        P v = __hfma2(tc_pair<P>::pack(qa, qb), s, bi);
        p[j] = *reinterpret_cast<uint32_t *>(&v);
    }
}

/* Two words of byte codes (values e .. e + 7 of a part, each below 128) -> the A registers of their two
 * mmas: bf16 pairs (e, e + 2), (e + 1, e + 3), (e + 4, e + 6), (e + 5, e + 7), each q * scale - min with the
 * scale and min rounded to bf16: one rounding of the product and difference, where the prefill dequantizer
 * rounds sc * q - mn from f32 (so within 2^-8 of the larger of sc * q and mn; test_cuda_ops holds it to the
 * tensor-core tolerance against the cpu).  Byte pair (0, 2) or (1, 3) becomes bf16 128 + q by one lop3, as
 * tc_dequant4's nibbles: about 2 instructions a value, where gq_value and its conversion take 3.5. */
static __device__ __forceinline__ void tc_dequant_bytes(uint32_t w0, uint32_t w1, __nv_bfloat162 s, __nv_bfloat162 nm,
                                                        uint32_t (&p)[4]) {
    const __nv_bfloat162 c128 = __floats2bfloat162_rn(128.0f, 128.0f);
    const uint32_t lo = 0x00FF00FFu, hi = 0x43004300u;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t t;
        asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(t) : "r"((j < 2 ? w0 : w1) >> (8 * (j & 1))), "r"(lo), "r"(hi));
        __nv_bfloat162 q = __hsub2(*reinterpret_cast<__nv_bfloat162 *>(&t), c128);
        __nv_bfloat162 v = __hfma2(q, s, nm);
        p[j] = *reinterpret_cast<uint32_t *>(&v);
    }
}

/* A raw 16-bit scale or bias -> a pair of it, its bits as they are: MLX scales are bf16 in bf16 pairs, or f16 in f16
 * pairs (cuda_gemv_tc sends f16-scaled groups to TC_Q4H / TC_Q8H; cuda_gemv_tc_takes takes no other dtype). */
template <class P> static __device__ __forceinline__ P tc_sb(uint32_t r) {
    const uint32_t v = __byte_perm(r, 0, 0x1010);
    return *reinterpret_cast<const P *>(&v);
}

/* 16 bytes at p, streamed (evict first).  HINT: L2 fetches the whole 256-byte run around it, which the
 * lane's next loads of the same row read (measured on an H100, 8B bf16 batch 8 / 32: 1,135 / 3,526 ->
 * 1,216 / 3,725 tok/s; for 4-bit weights, whose step reads half the bytes, within +-2%: not taken). */
template <int HINT> static __device__ __forceinline__ uint4 tc_ld16(const void *p) {
    if constexpr (HINT) {
        uint4 v;
        asm("ld.global.cs.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
        return v;
    } else {
        return __ldcs((const uint4 *)p);
    }
}

template <int KIND, int NT, int PAIR>
__global__ void __launch_bounds__(256) k_gemv_tc(const float *__restrict__ x, int M, const gv_segs sg, int K, int act,
                                                 int kp, float *__restrict__ part, int *__restrict__ ticket) {
    typedef tc<KIND, PAIR, NT> C;
    constexpr int T = PAIR ? 2 : 1, F = T * NT * 4; /* row tiles per warp (the pair's gate and up); sums per thread */
    cuda_pdl_trigger();
    const gv_seg S = seg_pick(sg, blockIdx.y);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
    const int grp = blockIdx.x / kp, kq = blockIdx.x % kp, n0 = grp * 16 * TC_WARPS + warp * 16;
    if (grp * 16 * TC_WARPS >= S.N) { /* the whole block past this segment's rows */
        cuda_pdl_wait();
        return;
    }
    const bool live = n0 < S.N; /* a dead warp still meets the block's barrier */
    /* rows g and g + 8 of each tile (clamped: rows past N compute row N - 1 and are not stored) */
    const char *wr[T][2];
    const void *sp[T], *bp[T];
    int64_t grow[T][2];
    int64_t rb = C::Q8 ? (int64_t)K : C::Q ? (int64_t)K / 2 : (int64_t)K * 2; /* row bytes */
    if constexpr (C::GT != 0) rb = (int64_t)(K / gq_traits<C::GT>::ELEMS) * gq_traits<C::GT>::BYTES;
    const int gpr = C::Q && !C::GT ? K / sg.group : 1, lg = __ffs(sg.group) - 1; /* group = 1 << lg */
#pragma unroll
    for (int t = 0; t < T; t++) {
        const void *base = PAIR ? (t == 0 ? sg.s[0].w : sg.s[1].w) : S.w;
        sp[t] = PAIR ? (t == 0 ? sg.s[0].scales : sg.s[1].scales) : S.scales;
        bp[t] = PAIR ? (t == 0 ? sg.s[0].biases : sg.s[1].biases) : S.biases;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int n = n0 + g + 8 * h, row = n < S.N ? n : S.N - 1 < 0 ? 0 : S.N - 1;
            wr[t][h] = (const char *)base + (int64_t)row * rb;
            grow[t][h] = (int64_t)row * gpr;
        }
    }
    const int steps = (K + C::SK - 1) / C::SK, per = (steps + kp - 1) / kp;
    const int s0 = kq * per, s1 = s0 + per < steps ? s0 + per : steps; /* this block's steps */

    auto load = [&](tc_ld<T, C::GT> &L, int s) {
        const int k = s * C::SK + c * C::E; /* this lane's first k; a lane's vector is all in K or all out */
        const bool in = live && s < s1 && k < K;
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if constexpr (C::GT != 0) { /* the part's raw bytes (out: part 0 of the row, read as zeros) */
                    constexpr int EL = gq_traits<C::GT>::ELEMS, BY = gq_traits<C::GT>::BYTES;
                    L.r[t][h].load((const uint8_t *)wr[t][h] + (in ? (int64_t)(k / EL) * BY : 0), in ? k % EL / 32 : 0, in);
                } else {
                    const char *a = wr[t][h] + (C::Q8 ? k : C::Q ? k / 2 : (int64_t)k * 2);
                    L.w[t][h] = in ? tc_ld16<!C::Q>(a) : make_uint4(0, 0, 0, 0);
                    if constexpr (C::Q8) L.w2[t][h] = in ? tc_ld16<0>(a + 16) : make_uint4(0, 0, 0, 0);
                    if constexpr (C::Q) { /* MLX: 16-bit scales and biases (cuda_gemv_tc_takes) */
                        const int64_t gi = grow[t][h] + ((in ? k : 0) >> lg);
                        L.s[t][h] = in ? __ldg((const unsigned short *)sp[t] + gi) : 0u;
                        L.b[t][h] = in ? __ldg((const unsigned short *)bp[t] + gi) : 0u; /* a zero word with a zero bias adds 0 */
                    }
                }
            }
    };

    float d[T][NT][4];
#pragma unroll
    for (int t = 0; t < T; t++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) d[t][j][i] = 0.0f;

    /* x of the chunk being computed: 8 NT rows of C::CH values as bf16 (f16) pairs in the order the B
     * registers take them (stage), read back as one 16-byte load per n-tile and pair of mmas */
    __shared__ __align__(16) uint32_t xs[NT * 8][(C::CH + TC_PAD) / 2];
    auto stage = [&](int cs, int ce) {
        /* groups of 8 values a row, IT a thread, loaded B at a time (tc::XB) */
        constexpr int N8 = C::CH / 8, IT = C::IT, B = C::XB;
        static_assert(IT % B == 0, "whole rounds of the block");
        const int n8 = (ce - cs) * C::SK / 8, k0 = cs * C::SK; /* the chunk's groups a row */
#pragma unroll 1
        for (int i0 = 0; i0 < IT; i0 += B) { /* B groups' loads before any use */
            float4 lo[B], hi[B];
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int idx = threadIdx.x + 256 * (i0 + u), r = idx / N8, q = idx % N8, k = k0 + 8 * q;
                lo[u] = hi[u] = make_float4(0, 0, 0, 0);
                if (r < M && q < n8 && k < K) {
                    lo[u] = __ldg((const float4 *)(x + (int64_t)r * K + k));
                    hi[u] = __ldg((const float4 *)(x + (int64_t)r * K + k + 4));
                }
            }
#pragma unroll
            for (int u = 0; u < B; u++) {
                const int idx = threadIdx.x + 256 * (i0 + u), r = idx / N8, q = idx % N8;
                if (q >= n8) continue;
                uint4 v;
                int at = 8 * q; /* dense: in order, pairs (0,1) (2,3) (4,5) (6,7) */
                if constexpr (C::Q) { /* word i of lane c at 32 i + 8 c of its step; pairs (e, e + 4), BP's (e, e + 2) */
                    const int kk = at % 128;
                    at = at - kk + 32 * (kk % 32 / 8) + 8 * (kk / 32);
                    v = C::BP ? make_uint4(tc_pack(lo[u].x, lo[u].z, 0), tc_pack(lo[u].y, lo[u].w, 0), tc_pack(hi[u].x, hi[u].z, 0),
                                           tc_pack(hi[u].y, hi[u].w, 0))
                              : make_uint4(tc_pack(lo[u].x, hi[u].x, C::F16), tc_pack(lo[u].y, hi[u].y, C::F16),
                                           tc_pack(lo[u].z, hi[u].z, C::F16), tc_pack(lo[u].w, hi[u].w, C::F16));
                } else {
                    v = make_uint4(tc_pack(lo[u].x, lo[u].y, C::F16), tc_pack(lo[u].z, lo[u].w, C::F16),
                                   tc_pack(hi[u].x, hi[u].y, C::F16), tc_pack(hi[u].z, hi[u].w, C::F16));
                }
                *(uint4 *)&xs[r][at / 2] = v;
            }
        }
    };

    auto compute = [&](const tc_ld<T, C::GT> &L, int s, int cs) {
        const int kc = (s - cs) * C::SK; /* the step's first value in the chunk */
        if constexpr (C::Q) {
            /* GGUF: this lane's part of rows g and g + 8 (values k .. k + 31, loaded a step ahead), decoded
             * once for its 4 words */
            uint32_t q[T][2][8];
            float sc[T][2][2], mn[T][2][2];
            typedef std::conditional_t<C::H, __half2, __nv_bfloat162> P; /* the A registers' pairs */
            P s2[T][2], b2[T][2]; /* MLX: the step's scale and bias of each row */
            if constexpr (C::GT == 0) {
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) s2[t][h] = tc_sb<P>(L.s[t][h]), b2[t][h] = tc_sb<P>(L.b[t][h]);
            }
            __nv_bfloat162 ps[T][2][2], pm[T][2][2]; /* BP: each half part's scale and -min, bf16 pairs */
            if constexpr (C::GT != 0) { /* (braces: nvcc's front end rejects this lambda without them) */
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) L.r[t][h].part(q[t][h], sc[t][h], mn[t][h]);
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int e = 0; e < 2; e++)
                            ps[t][h][e] = __float2bfloat162_rn(sc[t][h][e]), pm[t][h][e] = __float2bfloat162_rn(-mn[t][h][e]);
            }
#pragma unroll
            for (int i = 0; i < 4; i++) { /* word i: values k + 8 i .. k + 8 i + 7, paired (e, e + 4) */
                uint4 b[NT];
#pragma unroll
                for (int j = 0; j < NT; j++) b[j] = *(const uint4 *)&xs[8 * j + g][(kc + 32 * i + 8 * c) / 2];
                uint32_t a[T][2][4];
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if constexpr (C::GT != 0) {
                            if (C::BP)
                                tc_dequant_bytes(q[t][h][2 * i], q[t][h][2 * i + 1], ps[t][h][i >> 1], pm[t][h][i >> 1], a[t][h]);
#pragma unroll
                            for (int jj = 0; jj < 4 && !C::BP; jj++) { /* else (!BP): the prefill dequantizer's value, rounded to bf16 */
                                __nv_bfloat162 v = __floats2bfloat162_rn(
                                    gq_value(q[t][h], sc[t][h], mn[t][h], 8 * i + jj, C::GT == LMX_GGML_Q8_0),
                                    gq_value(q[t][h], sc[t][h], mn[t][h], 8 * i + 4 + jj, C::GT == LMX_GGML_Q8_0));
                                a[t][h][jj] = *reinterpret_cast<uint32_t *>(&v);
                            }
                        } else if constexpr (C::Q8) { /* word i: bytes 8 i .. 8 i + 7 of the lane's 32 */
                            const uint4 &v = i < 2 ? L.w[t][h] : L.w2[t][h];
                            tc_dequant8(i % 2 ? v.z : v.x, i % 2 ? v.w : v.y, s2[t][h], b2[t][h], a[t][h]);
                        } else {
                            const uint32_t wi = i == 0 ? L.w[t][h].x : i == 1 ? L.w[t][h].y : i == 2 ? L.w[t][h].z : L.w[t][h].w;
                            tc_dequant4(wi, s2[t][h], b2[t][h], a[t][h]);
                        }
                    }
#pragma unroll
                for (int t = 0; t < T; t++)
#pragma unroll
                    for (int j = 0; j < NT; j++) {
                        tc_mma<C::F16>(d[t][j], a[t][0][0], a[t][1][0], a[t][0][1], a[t][1][1], b[j].x, b[j].y);
                        tc_mma<C::F16>(d[t][j], a[t][0][2], a[t][1][2], a[t][0][3], a[t][1][3], b[j].z, b[j].w);
                    }
            }
        } else {
            uint4 b[NT];
#pragma unroll
            for (int j = 0; j < NT; j++) b[j] = *(const uint4 *)&xs[8 * j + g][(kc + 8 * c) / 2];
#pragma unroll
            for (int t = 0; t < T; t++)
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const uint4 &w0 = L.w[t][0], &w1 = L.w[t][1];
                    tc_mma<C::F16>(d[t][j], w0.x, w1.x, w0.y, w1.y, b[j].x, b[j].y);
                    tc_mma<C::F16>(d[t][j], w0.z, w1.z, w0.w, w1.w, b[j].z, b[j].w);
                }
        }
    };

    /* chunks of C::CH values (a whole number of U-step rounds, so a round never straddles two);
     * the weights of the next round are in flight across the chunk's barriers */
    constexpr int SPC = C::CH / C::SK;
    static_assert(SPC % C::U == 0, "a chunk holds whole rounds of loads");
    tc_ld<T, C::GT> cur[C::U], nxt[C::U];
#pragma unroll
    for (int u = 0; u < C::U; u++) load(cur[u], s0 + u);
    cuda_pdl_wait(); /* x is ready */
    for (int cs = s0; cs < s1; cs += SPC) {
        const int ce = cs + SPC < s1 ? cs + SPC : s1;
        __syncthreads(); /* the previous chunk is read */
        stage(cs, ce);
        __syncthreads();
        for (int s = cs; s < ce; s += C::U) {
            const bool more = s + C::U < s1;
            if (more)
#pragma unroll
                for (int u = 0; u < C::U; u++) load(nxt[u], s + C::U + u);
            if (live)
#pragma unroll
                for (int u = 0; u < C::U; u++)
                    if (s + u < ce) compute(cur[u], s + u, cs);
            if (more)
#pragma unroll
                for (int u = 0; u < C::U; u++) cur[u] = nxt[u];
        }
    }

    /* the K parts of a row block meet in scratch; the last block to arrive adds them in part order */
    if (kp > 1) {
        float v[F]; /* d flat: (t NT + j) 4 + i */
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) v[(t * NT + j) * 4 + i] = d[t][j][i];
        const int64_t row0 = (int64_t)blockIdx.y * gridDim.x;
        if (!gv_parts_meet<F, TC_PARTS_MAX>(v, part, row0 + blockIdx.x, row0 + (int64_t)grp * kp,
                                            ticket + blockIdx.y * (gridDim.x / kp) + grp, kp))
            return;
#pragma unroll
        for (int t = 0; t < T; t++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) d[t][j][i] = v[(t * NT + j) * 4 + i];
    }
    /* d[t][j][i]: row n0 + g + 8 (i / 2), column (x row) 8 j + 2 c + i % 2 */
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int m = 8 * j + 2 * c + (i & 1), n = n0 + g + 8 * (i >> 1);
            if (!live || m >= M || n >= S.N) continue;
            if constexpr (PAIR) {
                const float gt = d[0][j][i] + bias_at(sg.s[0].bias, sg.s[0].bt, n);
                const float up = d[1][j][i] + bias_at(sg.s[1].bias, sg.s[1].bt, n);
                sg.s[0].y[(int64_t)m * S.N + n] = glu_act(gt, act) * up;
                sg.s[1].y[(int64_t)m * S.N + n] = up;
            } else {
                S.y[(int64_t)m * S.N + n] = d[0][j][i] + bias_at(S.bias, S.bt, n);
            }
        }
}

/* The GGUF types with a tensor-core instance: those of Q4_0, Q4_K_M, Q5_K_M, Q6_K and Q8_0 files. */
#define TC_GQ_TYPES(X) X(LMX_GGML_Q4_0) X(LMX_GGML_Q8_0) X(LMX_GGML_Q4_K) X(LMX_GGML_Q5_K) X(LMX_GGML_Q6_K_A16)

int cuda_gemv_tc_rows(int kind) { return kind == GV_BF16 || kind == GV_F16 ? 16 : kind >= 0 ? CUDA_GEMV_TC_ROWS : 0; }

int cuda_gemv_tc_kind_gguf(const cuda_backend *cb, const lmx_tensor *w, int M) {
    if (M < 2 || M > CUDA_GEMV_TC_ROWS || cb->gemv_variant == 2 || w->ndim != 2) return -1;
    /* up to 8 rows, the int16 kernels (cuda_ggml.cu) where cuda_ggml_beats_tc says.  Small matrices (under 4M
     * values) took them too until the K parts below filled the GPU for them (H200, batch 8: Qwen3-0.6B
     * Q4_K_M 3,418 -> 4,705 tok/s, Q4_0 4,377 -> 5,099, Q8_0 4,313 -> 4,503) */
    if (M <= CUDA_GEMV_ROWS && cuda_ggml_beats_tc(M, w->shape[1])) return -1;
    switch (w->q.ggml_type) {
#define TC_GQ_TAKES(t) case t: return w->shape[1] % lmx_ggml_block_elems(t) ? -1 : TC_GQ + t;
        TC_GQ_TYPES(TC_GQ_TAKES)
#undef TC_GQ_TAKES
    default: return -1;
    }
}

int cuda_gemv_tc_takes(const cuda_backend *cb, int kind, const lmx_tensor *w, int M) {
    if (M < 2 || M > cuda_gemv_tc_rows(kind) || cb->gemv_variant == 2 || w->shape[1] % 8) return 0;
    if (kind == GV_Q4 || kind == GV_Q8) /* groups of 32 << i; bf16 or f16 scales and biases (f32: CUDA-core kernels) */
        return w->q.group >= 32 && !(w->q.group & (w->q.group - 1)) &&
               (w->q.scale_dtype == LMX_DTYPE_BF16 || w->q.scale_dtype == LMX_DTYPE_F16);
    return kind == GV_BF16 || kind == GV_F16;
}

/* Blocks sharing a row block (K parts), 1, 2, 4, ... 16 of them.  Dense kinds: the fewest that fill the
 * slots (one block a multiprocessor), while each part keeps at least 8 steps of K (measured on an H100, 8B
 * Llama shapes: bf16 q/o at 8 rows 17.8 us with two slots a multiprocessor, 12.2 with one).
 * GGUF and MLX 4-bit kinds (slots: the blocks that fit, up to two a multiprocessor): the count whose waves of
 * blocks take the least time, counting a block as its steps plus TC_PART_COST steps of its own (staging x,
 * the sums in scratch).  The dense rule left small matrices a few blocks (Qwen3-0.6B's q/k/v, K = 1024: 32
 * of them for 264 slots) and sent large ones a second, part-empty wave (the 8B's q/o: 512 blocks of 2 steps).
 * Measured on an H200, tok/s, batch 8 / 32 (with the small matrices on the tensor cores, above): Qwen3-0.6B
 * Q4_K_M 3,418 / 8,293 -> 4,705 / 9,124, Q4_0 4,377 / 9,570 -> 5,099 / 10,231, Q8_0 4,313 / 8,451 -> 4,503 /
 * 9,692; Llama-3.1-8B Q4_K_M 1,602 / 3,594 -> 1,727 / 3,715, Q8_0 1,231 / 3,465 -> 1,310 / 3,601, MLX 4-bit
 * 2,495 / 5,395 -> 2,652 / 5,495 (with one slot a multiprocessor it lost 15%).  A cost of 3 steps measured
 * the same, 1 lost 2-9% on the 8B; for bf16 the rule lost 4% on the 8B at batch 8 (won 4% on the 0.6B). */
#define TC_PART_COST 2
static int tc_parts(int timed, int slots, int groups, int gmax, int steps, int sm_count) {
    int kp = 1;
    if (!timed) {
        while (kp < TC_PARTS_MAX && (int64_t)groups * kp < slots && steps / (2 * kp) >= 8) kp *= 2;
        return kp;
    }
    int64_t best = -1;
    for (int p = 1; p <= TC_PARTS_MAX && p <= steps && (int64_t)gmax * p <= 4 * sm_count; p *= 2) { /* tc_scratch's cells */
        const int64_t waves = ((int64_t)groups * p + slots - 1) / slots, t = waves * ((steps + p - 1) / p + TC_PART_COST);
        if (best < 0 || t < best) best = t, kp = p;
    }
    return kp;
}

typedef void (*tc_fn)(const float *, int, const gv_segs, int, int, int, float *, int *);
template <int KIND, int PAIR> static tc_fn tc_kernel(int nt) {
    switch (nt) {
    case 1: return k_gemv_tc<KIND, 1, PAIR>;
    case 2: return k_gemv_tc<KIND, 2, PAIR>;
    case 3: return k_gemv_tc<KIND, 3, PAIR>;
    default: return k_gemv_tc<KIND, 4, PAIR>;
    }
}
template <int PAIR> static tc_fn tc_kernel(int kind, int nt) {
    switch (kind) {
    case GV_BF16: return tc_kernel<GV_BF16, PAIR>(nt);
    case GV_F16: return tc_kernel<GV_F16, PAIR>(nt);
    case GV_Q4: return tc_kernel<GV_Q4, PAIR>(nt);
    case GV_Q8: return tc_kernel<GV_Q8, PAIR>(nt);
    case TC_Q4H: return tc_kernel<TC_Q4H, PAIR>(nt);
    case TC_Q8H: return tc_kernel<TC_Q8H, PAIR>(nt);
#define TC_GQ_CASE(t) case TC_GQ + t: return tc_kernel<TC_GQ + t, PAIR>(nt);
        TC_GQ_TYPES(TC_GQ_CASE)
#undef TC_GQ_CASE
    default: return NULL;
    }
}

/* The K parts' scratch: tickets [3, 4 SMs] (cuda_scratch zeroes them when new) and sums [3, 4 SMs, 32 * 256] floats, the
 * most a launch of kp > 1 needs (tc_parts keeps gmax * kp within 4 SMs; one size, so a graph capture never
 * grows it).  NULL (no error kept) when it does not fit: the launch then takes no K parts. */
int *cuda_gemv_tc_scratch(cuda_backend *cb, float **part) {
    const size_t cells = (size_t)3 * 4 * cb->sm_count, bytes = cells * sizeof(int) + cells * 32 * 256 * sizeof(float);
    const lmx_err keep = cb->base.err;
    char *buf = (char *)cuda_scratch(cb, CUDA_SCRATCH_GEMV, bytes);
    if (!buf) {
        cb->base.err = keep;
        return NULL;
    }
    *part = (float *)(buf + cells * sizeof(int));
    return (int *)buf;
}

lmx_status cuda_gemv_tc(cuda_backend *cb, int kind, int n, gv_segs *sg, int glu, const float *x, int M, int K) {
    if ((kind == GV_Q4 || kind == GV_Q8) && sg->sdt == LMX_DTYPE_F16) kind = kind == GV_Q4 ? TC_Q4H : TC_Q8H;
    const int quant = kind == GV_Q4 || kind == GV_Q8 || kind >= TC_Q4H; /* MLX or GGUF: steps of 128 values */
    const int rows = 16 * TC_WARPS, sk = quant ? 128 : 32;
    int groups = 0, gmax = 1;
    for (int i = 0; i < n; i++) {
        const int gi = (sg->s[i].N + rows - 1) / rows;
        groups += gi;
        if (gi > gmax) gmax = gi;
    }
    const int nt = (M + 7) / 8;
    const tc_fn k = glu >= 0 ? tc_kernel<1>(kind, nt) : tc_kernel<0>(kind, nt);
    /* GGUF and MLX 4-bit kinds: K parts timed over the blocks that fit at once (up to two a multiprocessor),
     * dense ones counted for one a multiprocessor (tc_parts) */
    int per_sm = quant ? cuda_fit_blocks(cb, (const void *)k) : 1;
    per_sm = per_sm > 2 ? 2 : per_sm;
    int kp = tc_parts(quant, cb->sm_count * per_sm, groups, gmax, (K + sk - 1) / sk, cb->sm_count);
    float *part = NULL;
    int *ticket = kp > 1 ? cuda_gemv_tc_scratch(cb, &part) : NULL;
    if (!ticket) kp = 1;
    cuda_launch(cb, k, dim3((unsigned)(gmax * kp), glu >= 0 ? 1 : n), 256, 0, x, M, *sg, K, glu < 0 ? 0 : glu, kp, part,
                ticket);
    return cuda_check_launch(cb, glu >= 0 ? "matmul + glu (tensor cores)" : "matmul (tensor cores)");
}
