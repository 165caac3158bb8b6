/* cuda_gemv.h - what the GEMV kernels share (cuda_gemv.cu: dense and MLX weights; cuda_ggml.cu: GGUF
 * blocks): the weights of one launch (up to 3 of the same input, fused q/k/v or gate/up), the
 * bias, the GLU of the gate/up pair and the LoRA expand folded into the result. */
#ifndef LMX_BACKEND_CUDA_GEMV_H
#define LMX_BACKEND_CUDA_GEMV_H

#include "cuda_weights.h"

#define G1_MAX_K 32768   /* the most x values a one-row kernel stages */

/* ---- weights of one launch ----------------------------------------------------------------- */

typedef struct gv_seg {
    const void *w;                /* dense [N, K], MLX words [N, K*bits/32], or GGUF blocks [N, row bytes] */
    const void *scales, *biases;  /* MLX [N, K/group] */
    const void *bias;             /* linear bias [N], or NULL */
    float *y;                     /* [M, N] */
    int N;
    lmx_dtype bt;                 /* of bias */
    int ks;                       /* k_gemv1, k_ggemv: warps sharing each row (K split among them) */
    const float *lb, *lt;         /* k_gemv1, k_ggemv: a LoRA expand folded in (B [N, lr], t [lr]); lb NULL: none */
    int lr;
    float *ym;                    /* k_gemv1 (one weight, ks 1): y also written here (host memory: cb->mirror), or
                                     NULL */
} gv_seg;

typedef struct gv_segs {
    gv_seg s[3];
    int b1, b2;                   /* k_gemv1: the first blocks of segments 1 and 2 in its one-dimensional grid */
    int group;                    /* MLX group size */
    lmx_dtype sdt;                /* MLX scale / bias dtype */
} gv_segs;

/* A mixture of experts' weights, by expert (k_moe_gemv1, k_moe_ggemv): a kernel parameter read in place. */
#define GV_MOE_MAX 256
typedef struct gv_moe {
    const void *w[2][GV_MOE_MAX];                          /* expert e's gate (or down) and up weights */
    const void *scales[2][GV_MOE_MAX], *biases[2][GV_MOE_MAX]; /* MLX */
} gv_moe;
/* t filled from the E experts (gate, up, down each) of a mixture: their gate and up, or (down) their down */
static inline void gv_moe_fill(gv_moe *t, const lmx_tensor *experts, int E, int down) {
    memset(t, 0, sizeof *t);
    for (int e = 0; e < E; e++)
        for (int j = 0; j < (down ? 1 : 2); j++) {
            const lmx_tensor *w = &experts[3 * e + (down ? 2 : j)];
            t->w[j][e] = w->data;
            t->scales[j][e] = w->q.scales;
            t->biases[j][e] = w->q.biases;
        }
}

/* The kernel families by weight format. */
enum { GV_BF16, GV_F16, GV_F32, GV_Q4, GV_Q8 };

/* Segment i by selects of fixed fields: indexing the parameter struct with blockIdx.y would copy
 * it to local memory and slow every GEMV. */
static __device__ __forceinline__ gv_seg seg_pick(const gv_segs &sg, int i) {
    gv_seg r;
#define PICK(f) r.f = i == 0 ? sg.s[0].f : i == 1 ? sg.s[1].f : sg.s[2].f
    PICK(w); PICK(scales); PICK(biases); PICK(bias); PICK(y); PICK(N); PICK(bt); PICK(ks);
    PICK(lb); PICK(lt); PICK(lr); PICK(ym);
#undef PICK
    return r;
}

static __device__ __forceinline__ float bias_at(const void *b, lmx_dtype bt, int64_t n) {
    return b ? cuda_elem(b, bt, n) : 0.0f;
}

/* Scales and biases are prefetched raw (a load whose value is used at once would make the prefetch
 * wait for it) and converted when used. */
static __device__ __forceinline__ uint32_t raw_at(const void *p, lmx_dtype t, int64_t i) {
    return t == LMX_DTYPE_F32 ? __ldg((const unsigned *)p + i) : (uint32_t)__ldg((const unsigned short *)p + i);
}
static __device__ __forceinline__ float raw_val(uint32_t r, lmx_dtype t) {
    return t == LMX_DTYPE_BF16  ? __uint_as_float(r << 16)
           : t == LMX_DTYPE_F16 ? __half2float(__ushort_as_half((unsigned short)r))
                                : __uint_as_float(r);
}

/* The dense formats' 16-byte vectors as floats (k_gemv, k_gemv1). */
template <typename WT> struct vec_traits;
template <> struct vec_traits<float> {
    static constexpr int E = 4;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        f[0] = __uint_as_float(v.x); f[1] = __uint_as_float(v.y);
        f[2] = __uint_as_float(v.z); f[3] = __uint_as_float(v.w);
    }
};
template <> struct vec_traits<__nv_bfloat16> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            f[2 * i] = __uint_as_float(u[i] << 16);
            f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};
template <> struct vec_traits<__half> {
    static constexpr int E = 8;
    static __device__ __forceinline__ void unpack(const uint4 &v, float *f) {
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 t = __half22float2(*reinterpret_cast<const __half2 *>(&u[i]));
            f[2 * i] = t.x;
            f[2 * i + 1] = t.y;
        }
    }
};

/* Codes of one word as floats: 4-bit 0.5 + q/256, 8-bit q (element order: bits BITS * e). */
template <int BITS>
static __device__ __forceinline__ void decode_word(uint32_t w, float (&q)[32 / BITS]) {
    if constexpr (BITS == 4) {
        const uint32_t lo = w & 0x0F0F0F0Fu, hi = (w >> 4) & 0x0F0F0F0Fu;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            q[2 * k] = __uint_as_float(__byte_perm(lo, 0x3F000000u, 0x7054u | ((unsigned)k << 8)));
            q[2 * k + 1] = __uint_as_float(__byte_perm(hi, 0x3F000000u, 0x7054u | ((unsigned)k << 8)));
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            q[k] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650u | (unsigned)k)) - 8388608.0f;
    }
}

/* Per word or vector: acc += scale * (q . x) + bias * sum(x), with d = sum(code * x) as decode_word
 * leaves the codes (4-bit: 0.5 + q/256). */
template <int BITS>
static __device__ __forceinline__ float qacc(float acc, uint32_t s_raw, uint32_t b_raw, lmx_dtype t, float d, float xs) {
    const float s = raw_val(s_raw, t), b = raw_val(b_raw, t);
    if constexpr (BITS == 4) return fmaf(256.0f * s, d, fmaf(fmaf(-128.0f, s, b), xs, acc));
    return fmaf(s, d, fmaf(b, xs, acc));
}
/* seg s's LoRA expand term for output n (the one-row kernels; lane 0 at the end, B and t read then: holding
 * them across the main loop, in registers or shared memory, or a wider sum measured slower) */
static __device__ __forceinline__ float gv_lora_term(const gv_seg &s, int n) {
    return s.lb ? cuda_lora_dot(s.lb + (int64_t)n * s.lr, s.lt, s.lr) : 0.0f;
}

/* Whether a launch of n weights (glu >= 0: the gate/up pair) takes opts: they need the one-row path
 * (one_row), the residual add one weight without GLU or norm, the norm an unquantized weight of K
 * values.  Sets what opts fold in; LMX_ERR_UNSUPPORTED when they do not apply. */
static inline lmx_status gv_opts_check(const cuda_gemv_opts *opts, int one_row, int n, int glu, int64_t K, int *norm,
                                       int *resid, int *lora) {
    *norm = opts && opts->norm_w, *resid = opts && opts->resid;
    *lora = opts && (opts->lora_b[0] || opts->lora_b[1] || opts->lora_b[2]);
    if ((*norm || *resid || *lora) && (!one_row || (*resid && (glu >= 0 || n != 1 || *norm)))) return LMX_ERR_UNSUPPORTED;
    if (*norm && (opts->norm_w->q.bits || opts->norm_w->q.ggml_type || lmx_tensor_nelem(opts->norm_w) != K))
        return LMX_ERR_UNSUPPORTED;
    return LMX_OK;
}

/* The RMSNorm opts folds in (w NULL: none). */
static inline cuda_row_norm gv_row_norm(const cuda_gemv_opts *opts) {
    cuda_row_norm nm;
    memset(&nm, 0, sizeof nm);
    if (opts && opts->norm_w) {
        nm.w = opts->norm_w->data;
        nm.wt = opts->norm_w->dtype;
        nm.eps = opts->eps;
        nm.add_one = opts->add_one;
    }
    return nm;
}

/* Segment i of a launch: weight w (its data, MLX scales and biases), its bias, its output y and, with
 * lora, the LoRA expand opts gives weight i. */
static inline void gv_seg_set(gv_seg *s, const lmx_tensor *w, const lmx_tensor *bias, float *y,
                              const cuda_gemv_opts *opts, int i, int lora) {
    s->w = w->data;
    s->scales = w->q.scales;
    s->biases = w->q.biases;
    s->bias = bias ? bias->data : NULL;
    s->bt = bias ? bias->dtype : LMX_DTYPE_F32;
    s->y = y;
    s->N = (int)w->shape[0];
    if (lora) {
        s->lb = opts->lora_b[i];
        s->lt = opts->lora_t[i];
        s->lr = opts->lora_r[i];
    }
}

/* Several rows (cuda_gemv_rows.cu): k_gemv (dense) or k_qgemv (MLX) for M (1..8) rows of kind's weights in sg,
 * gx x gy blocks (blockIdx.y the weight, or 1 for the gate/up pair, glu >= 0), and the output rows a block of
 * those kernels takes. */
void cuda_gemv_rows_launch(cuda_backend *cb, int kind, int M, unsigned gx, unsigned gy, const float *x,
                           const gv_segs &sg, int K, int glu);
int cuda_gemv_rows_block(int kind, int M, int glu);

/* Tensor cores (cuda_gemv_tc.cu): 1 when k_gemv_tc takes weight w (of kind, gv_kind) for M rows (2 ..
 * cuda_gemv_tc_rows: 16 for bf16 / f16, whose 17-32 rows cuBLAS runs faster even outside the fused
 * launches (H100, 8B bf16 batch 32: 3,690 tok/s here, 4,062 through cuBLAS; gate/up at 32 rows 57.6 against
 * 49.4 us); 32 for MLX 4-bit with groups of 32 << i and 16-bit scales); cuda_gemv_tc launches it for the n
 * segments of sg, no opts. */
int cuda_gemv_tc_rows(int kind);
/* The tensor-core kind of GGUF weight w for M rows (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K; 2..32 rows but where
 * cuda_ggml_beats_tc says), or -1. */
int cuda_gemv_tc_kind_gguf(const cuda_backend *cb, const lmx_tensor *w, int M);
int cuda_gemv_tc_takes(const cuda_backend *cb, int kind, const lmx_tensor *w, int M);
lmx_status cuda_gemv_tc(cuda_backend *cb, int kind, int n, gv_segs *sg, int glu, const float *x, int M, int K);
/* The K parts' scratch of cuda_gemv_tc and cuda_gemv_mq: tickets [3, 4 SMs] and sums [3, 4 SMs, 32 * 256]; NULL (no
 * error kept) when it cannot grow */
int *cuda_gemv_tc_scratch(cuda_backend *cb, float **part);

/* The K parts of a row block meeting in that scratch (k_gemv_tc, k_gemv_mq, k_gemv_f32_rows; blocks of 256 threads):
 * each block leaves its F sums a thread in its cell of F * 256 floats (sum f of thread t at f * 256 + t), and the last
 * of the row block's kp blocks to arrive (its ticket) adds the kp cells from cell first on, every part's load in
 * flight, in part order, into v: true for that block alone, so a weight gives the same bits in every launch. */
template <int F, int PMAX>
static __device__ __forceinline__ bool gv_parts_meet(float (&v)[F], float *part, int64_t cell, int64_t first,
                                                     int *ticket, int kp) {
    float *mine = part + cell * F * 256 + threadIdx.x;
#pragma unroll
    for (int f = 0; f < F; f++) __stcg(mine + f * 256, v[f]);
    if (!cuda_block_last(ticket, kp)) return false;
    const float *all = part + first * F * 256 + threadIdx.x;
#pragma unroll
    for (int f = 0; f < F; f++) {
        float p[PMAX], s = 0.0f;
#pragma unroll
        for (int q = 0; q < PMAX; q++) p[q] = q < kp ? __ldcg(all + ((int64_t)q * F + f) * 256) : 0.0f;
#pragma unroll
        for (int q = 0; q < PMAX; q++)
            if (q < kp) s += p[q];
        v[f] = s;
    }
    return true;
}

/* Integer tensor cores (cuda_gemv_mq.cu): dense GGUF Q4_K / Q6_K weights (K a multiple of 256 up to 4,096) for
 * cb->gemv_mq (CUDA_GEMV_MQ_ROWS by default, LMX_CUDA_GEMV_MQ; 0: never) to 32 rows without a GLU, x quantized a
 * super-block at a time: init at the backend's creation (cb->gemv_mq_smem); takes: 1 when it computes the n weights
 * ws for M rows; cuda_gemv_mq: sg's n segments of that type, y_i = x @ w_i^T (+ b_i). */
#define CUDA_GEMV_MQ_ROWS 8
void cuda_gemv_mq_init(cuda_backend *cb);
int cuda_gemv_mq_takes(const cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu);
lmx_status cuda_gemv_mq(cuda_backend *cb, int n, const gv_segs *sg, int type, const float *x, int M, int K);
/* Tensor cores in f16 with every weight byte of a block in flight at once (cuda_gemv_mq.cu, k_gemv_st; sm_90 on): dense
 * GGUF Q4_K weights (K a multiple of 256 up to 8,192; launches of one wave of blocks) for cb->gemv_st (CUDA_GEMV_ST_ROWS
 * by default, LMX_CUDA_GEMV_ST; 0: never; 9 at the fewest) to 32 rows without a GLU: takes: its K parts (> 0) when it
 * computes the n weights ws for M rows, else 0; cuda_gemv_st: sg's n segments in those kp parts, y_i = x @ w_i^T
 * (+ b_i). */
#define CUDA_GEMV_ST_ROWS 9
int cuda_gemv_st_takes(cuda_backend *cb, const lmx_tensor *const *ws, int n, int M, int glu);
/* 1 when k_gemv_st's f16 arithmetic holds GGUF Q4_K weight w (its host blocks): every weight within f16's range;
 * the upload lists the device blocks of those it does not (cb->st_unfit), which k_gemv_st then declines */
int cuda_gemv_st_fits(const lmx_tensor *w);
lmx_status cuda_gemv_st(cuda_backend *cb, int n, const gv_segs *sg, const float *x, int M, int K, int kp);

/* f32 weights of at most 16 rows a multiprocessor (a mixture of experts' router) for 2..32 rows of x (cuda_gemv_f32.cu,
 * LMX_CUDA_GEMV=7: cuBLAS instead): takes: 1 when it computes w for x's M rows; cuda_gemv_f32: y [M, N] = x @ w^T. */
int cuda_gemv_f32_takes(const cuda_backend *cb, const lmx_tensor *w, const lmx_tensor *x, int M);
lmx_status cuda_gemv_f32(cuda_backend *cb, const lmx_tensor *w, const float *x, float *y, int M);

/* GGUF blocks (cuda_ggml.cu): cuda_gemv's contract for the block-quantized types, which it hands
 * over; takes: 1 when those kernels compute w for M rows. */
lmx_status cuda_gemv_ggml(cuda_backend *cb, int n, const lmx_tensor *const *ws, const lmx_tensor *const *biases,
                          float *const *ys, const float *x, int M, int glu, const cuda_gemv_opts *opts);
int cuda_ggml_gemv_takes(const lmx_tensor *w, int M);
/* 1 when those int16 kernels beat the tensor-core GEMV on 4-bit weights (GGUF, MLX) of width K for M rows
 * (2..CUDA_GEMV_ROWS): at 2 rows, and at 3-4 up to K = 8192.  Measured on an H100, 8B shapes
 * (bench_cuda_gemv): Q4_K gate/up 22.3 / 28.0 us against 32.0 / 32.2 at 2 / 4 rows, the K = 14336 down
 * projection 35.3 against 31.1 at 4 rows; at 8 rows the tensor cores win everywhere. */
static inline int cuda_ggml_beats_tc(int M, int64_t K) { return M <= 2 || (M <= 4 && K <= 8192); }

#endif
