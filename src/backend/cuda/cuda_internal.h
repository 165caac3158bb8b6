/* cuda_internal.h - what the files of the cuda backend share: the backend struct, error
 * helpers, scratch memory and the dequantizing loaders used by several kernels.
 *
 * One cuda_backend owns one stream, one cuBLAS handle, the device memory of every uploaded weight
 * (freed by destroy) and a few grow-only scratch buffers.  Every op is enqueued on the stream;
 * only read / write / kv_reserve / scratch growth wait for it.  Host int arrays of an op travel
 * by value in the kernel's parameters (bounded structs, long batches are split), except inside a
 * captured decode graph, where the per-step ones come from cb->dyn (cuda_graph.cu). */
#ifndef LMX_BACKEND_CUDA_INTERNAL_H
#define LMX_BACKEND_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "../act_grad.h"
#include "../backend.h"
#include "../../formats/ggml_types.h"
}

#define CUDA_IDS_MAX 512                 /* row indices passed by value per launch */
#define CUDA_SEQ_MAX 64                  /* sequences per launch of a batch op */
#define CUDA_ROPE_MAX 256                /* rot_dim / 2 */
#define CUDA_DEQUANT_BYTES (64u << 20)   /* bf16 weight rows dequantized at once for a cuBLAS GEMM */

enum { CUDA_SCRATCH_X = 0,     /* activations narrowed to bf16/f16 for cuBLAS      [M, K] */
       CUDA_SCRATCH_W,         /* a block of weight rows dequantized to bf16       [n, K] */
       CUDA_SCRATCH_ATTN,      /* attention split partials                          see attention */
       CUDA_SCRATCH_KV16,      /* prefill attention: new keys and values as bf16   [2, M, Hk*D] */
       CUDA_SCRATCH_TOPK,      /* top-k candidates and results                      see cuda_topk.cu */
       CUDA_SCRATCH_LORA,      /* LoRA shrink results                               [M, r] */
       CUDA_SCRATCH_LORA_SUM,  /* LoRA shrink tickets and partial sums              see cuda_lora.cu */
       CUDA_SCRATCH_XQ,        /* GGUF GEMV of several rows: x quantized to int16   see cuda_ggml.cu */
       CUDA_SCRATCH_BWD,       /* training: attention scores of a query tile, the loss's rows   see cuda_backward.cu */
       CUDA_SCRATCH_MOE,       /* a mixture of experts' routing and expert outputs  see cuda_moe.cu */
       CUDA_SCRATCH_MOE_TICKET, /* its combine's tickets (zeroed when new)          see gv_moe_sum */
       CUDA_SCRATCH_GEMV,      /* tensor-core GEMV: K parts' tickets and sums       see cuda_gemv_tc.cu */
       CUDA_SCRATCH_MOE_ROWS,  /* a mixture of experts over many rows: places, rows grouped by expert
                                  see cuda_moe_grouped.cu */
       CUDA_SCRATCH_TERM,      /* lora_glu / lora_add: the shrinks x A^T            [2, M, r] */
       CUDA_SCRATCH_UDB,       /* LoRA backward's u and dB partial sums             see cuda_lora_udb.cu */
       CUDA_SCRATCH_SLOTS };

/* Decode-step CUDA graphs (cuda_graph.cu): steps of at most CUDA_G_MAX rows (one token per
 * sequence) are recorded op by op; once a step repeats with the same ops and tensors, the backend
 * replays one captured graph.  The per-step values (token ids, n_past, n_new) then come from a small
 * device array (dyn, layout below) that is refreshed with one copy before each replay. */
#define CUDA_G_MAX 32
enum { CUDA_DYN_IDS = 0, CUDA_DYN_PAST = CUDA_G_MAX, CUDA_DYN_NEW = 2 * CUDA_G_MAX, CUDA_DYN_N = 3 * CUDA_G_MAX };

struct cuda_graph;

typedef struct cuda_backend {
    lmx_backend base;
    int device;
    int sm_count;
    cudaStream_t stream;
    cublasHandle_t blas;
    cudaMemPool_t pool;      /* activations (alloc / release): stream-ordered, idle blocks kept until trim */
    void *scratch[CUDA_SCRATCH_SLOTS];
    size_t scratch_bytes[CUDA_SCRATCH_SLOTS];
    size_t scratch_due[CUDA_SCRATCH_SLOTS]; /* bytes asked of a slot while a decode graph was capturing */
    void **weights;          /* device blocks made by upload_weight, freed by destroy */
    int n_weights, cap_weights;
    void **host_weights;     /* mapped page-locked blocks made by upload_weight_host, freed by destroy */
    int n_host_weights, cap_host_weights;
    int *dyn;                /* device [CUDA_DYN_N]: this step's ids / n_past / n_new */
    int dyn_on;              /* 1 while capturing: kernels read the per-step values from dyn */
    int pdl;                 /* 1 while capturing with programmatic dependent launch (cuda_launch) */
    int topk_off;            /* LMX_CUDA_TOPK=0: the topk op declines (sampling reads whole rows) */
    int moe_off;             /* LMX_CUDA_MOE=0: the moe op declines (the model routes on the host) */
    int moe_staged;          /* one row's GGUF gate/up experts staged in shared memory (k_moe_gu_staged);
                                LMX_CUDA_MOE_STAGED=0 turns it off for A/B measurements */
    int moe_mma[2];          /* the fewest rows whose GGUF gate/up [0] and down [1] experts take the integer tensor
                                cores (cuda_moe_mma.cu; 0: never); LMX_CUDA_MOE_MMA="G[,D]" sets them */
    int moe_mma_smem;        /* the shared memory those launches may stage x in (cuda_moe_mma_init) */
    int moe_tiles;           /* GGUF Q4_K / Q6_K experts uploaded in tiles, not rows (cuda_moe_mma.cu);
                                LMX_CUDA_MOE_TILES=0 keeps the rows, for A/B measurements */
    int one_smem;            /* the dynamic shared memory a block of the tiled experts' CUDA-core launches may take
                                (cuda_moe_tiles_gu, cuda_moe_one) */
    int sm_smem, block_smem; /* the shared memory a multiprocessor holds for blocks (0: unknown), and what each block
                                of those launches takes beside its dynamic bytes (cuda_moe_mma_init) */
    int gemv_mq;             /* the fewest rows whose dense GGUF Q4_K / Q6_K GEMVs take the integer tensor cores
                                (cuda_gemv_mq; 0: never); LMX_CUDA_GEMV_MQ sets it */
    int gemv_mq_smem;        /* the shared memory those launches may stage x in (cuda_gemv_mq_init; 0: none) */
    int gemv_st;             /* the fewest rows whose dense GGUF Q4_K GEMVs take k_gemv_st (cuda_gemv_mq.cu: every
                                weight byte of a block in flight, f16 mma; 0: never); LMX_CUDA_GEMV_ST sets it */
    void **st_unfit;         /* the device bytes of Q4_K weights whose values f16 cannot hold (cuda_gemv_st_fits),
                                which k_gemv_st declines: pairs of (first byte, past the last); freed by destroy */
    int n_st_unfit, cap_st_unfit;
    int att_short;           /* decode attention over short contexts fills the GPU with fewer heads a block
                                (cuda_attention_plan); LMX_CUDA_ATT_SHORT=0: the rule before it (A/B) */
    int att_gmax;            /* decode attention's query heads a block at most (cuda_attention.cu: 4;
                                LMX_CUDA_ATT_GMAX sets 1, 2, 4 or 8, for A/B) */
    int att_tc;              /* one-token decode attention on the tensor cores (cuda_flash_decode.cu): 0 by the
                                rule of cuda_attention_plan; LMX_CUDA_ATT_TC=N > 0 from N keys on, =0 never (-1) */
    int moe_rows;            /* many rows of GGUF experts grouped by expert on the integer tensor cores
                                (cuda_moe_rows.cu; LMX_CUDA_MOE_ROWS=0: the grouped GEMMs instead) */
    int wgmma;               /* an sm_90 GPU (Hopper): kernels on warpgroup MMA (cuda_wgmma.h); LMX_CUDA_WGMMA=0
                                turns them off for A/B measurements */
    int gguf_repack;         /* 1: GGUF Q4_0 / Q4_1 / Q4_K / Q8_0 weights uploaded as MLX groups of 32 (cuda_repack.cu;
                                LMX_CUDA_GGUF_REPACK=0 keeps the blocks, for A/B measurements) */
    int keep_f32;            /* LMX_CUDA_KEEP=f32: training keeps forward values in f32, not bf16 */
    int act16;               /* 1: norm_matmuls takes a bf16 xn (backend.h: a prompt's activations for the
                                projections in bf16); LMX_CUDA_ACT16=0 declines it, for A/B measurements */
    int gemv_variant;        /* LMX_CUDA_GEMV (A/B measurements): 1 no k_gemv1 (nor what it folds in); 2 no
                                tensor-core GEMV; 3 MLX 4/8-bit by k_gemv1 / k_qgemv / the tensor cores, not
                                cuda_ggml.cu's int16 kernel; 4 that kernel's one row with x quantized
                                in a launch before it, not by each block; 5 MLX one row by that kernel,
                                not k_gstream1; 6 no k_gemv1_wide; 7 f32 weights of few rows through
                                cuBLAS for 2..32 rows of x, not k_gemv_f32_rows */
    void *topk_host;         /* page-locked staging of the top-k results (one copy, not two pageable ones) */
    size_t topk_host_bytes;
    int64_t stream_min;      /* the fewest weights of a one-row MLX 4-bit launch that k_gstream1 takes (smaller ones: the
                                int16 kernel, cuda_ggml.cu; LMX_CUDA_STREAM_MIN) */
    int stream_bpm;          /* k_gstream1's blocks a multiprocessor (LMX_CUDA_STREAM_BPM, A/B measurements; 0: as
                                many as fit) */
    struct {                 /* while capturing: a step's read announced by read_ahead (cuda_graph.cu), which a
                                one-row GEMV writing y also writes into dptr (the host's dst, mapped) */
        const void *y;
        float *dptr;         /* NULL: dst is not device-mapped host memory */
        size_t n;
        int taken;           /* a launch of this capture writes it */
    } mirror;
    int xs_blocks;           /* the most blocks of a one-row GGUF / MLX GEMV that quantize x each (cuda_ggml.cu;
                                4 a multiprocessor, LMX_CUDA_XS_BLOCKS for A/B measurements) */
    struct {                 /* cuda_fit_blocks: the blocks of a kernel that fit a multiprocessor, asked once */
        const void *fn;
        int per_sm;
    } fit[64];
    int n_fit;
    struct cuda_graph *g;    /* decode graph state; NULL: graphs off */
    cudaStream_t side;       /* a second stream for work a decode graph runs beside the main chain */
    cudaEvent_t fork, join;  /* its fork from and join into cb->stream (cuda_lora_group stages) */
    struct cuda_park *park;  /* training's checkpoints through host memory (offload / reload, cuda_keep.cu):
                                made at the first offload */
    struct {                 /* RoPE's angles of the last large launch's rows, which the launches after it with the
                                same rows and rotation share (cuda_rope_angles) */
        float2 *cs;          /* device [B * T][half]: attn_factor (cos, sin) of (n_past[b] + t) inv_freq[i] */
        size_t cap;          /* float2s allocated */
        int valid, B, T, half, np_cap;
        float attn_factor, inv_freq[CUDA_ROPE_MAX];
        int *n_past;         /* host [np_cap]: the rows' positions the table holds */
    } rope;
} cuda_backend;

/* Turn a CUDA error into an lmx status with "cuda: <message> in <what>" (NOMEM for allocations). */
lmx_status cuda_fail(cuda_backend *cb, cudaError_t e, const char *what);
lmx_status cuda_blas_fail(cuda_backend *cb, cublasStatus_t s, const char *what);
/* LMX_OK for a successful cuBLAS call, else cuda_blas_fail's status */
static inline lmx_status cuda_blas(cuda_backend *cb, cublasStatus_t s, const char *what) {
    return s == CUBLAS_STATUS_SUCCESS ? LMX_OK : cuda_blas_fail(cb, s, what);
}
/* The launch error of the last kernel, if any. */
lmx_status cuda_check_launch(cuda_backend *cb, const char *what);
/* A tensor from the activation pool as the alloc op makes one, but left uninitialised (its writer
 * fills it); released with the release op. */
lmx_status cuda_alloc_raw(cuda_backend *cb, lmx_tensor *t);
/* A device scratch buffer of at least bytes (grown, contents lost); NULL with err set on failure.  While a
 * decode graph is capturing (dyn_on) a slot cannot grow (that needs the stream idle): the size is kept as
 * due and the call fails, and cuda_scratch_catch_up, after the capture, grows the slots due (1: some grew,
 * capture again). */
void *cuda_scratch(cuda_backend *cb, int slot, size_t bytes);
/* The blocks of 256 threads of kernel fn (no dynamic shared memory) that fit a multiprocessor at once (at least
 * 1): asked of the runtime once per kernel and kept in cb, since the query is a host call that launches outside
 * decode graphs would otherwise make every time. */
int cuda_fit_blocks(cuda_backend *cb, const void *fn);
int cuda_scratch_catch_up(cuda_backend *cb);

#define CUDA_TRY(cb, call, what)                            \
    do {                                                    \
        cudaError_t e_ = (call);                            \
        if (e_ != cudaSuccess) return cuda_fail((cb), e_, (what)); \
    } while (0)

/* Graph state (cuda_graph.cu).  cuda_graph_flush ends a pending step: replays its graph, or issues
 * its recorded ops, or captures a freshly recorded step.  Every entry point that is not an op calls
 * it first.  cuda_graph_drop forgets the graph (scratch memory moved). */
lmx_status cuda_graph_create(cuda_backend *cb);
void cuda_graph_destroy(cuda_backend *cb);
lmx_status cuda_graph_flush(cuda_backend *cb);
void cuda_graph_drop(cuda_backend *cb);
/* 1 when the pending step is its graph's replay and that graph writes this read itself (the step's read_ahead
 * announced it: cuda_read then only waits); forget_host: drop a graph that writes into host memory p. */
int cuda_graph_writes_read(const cuda_backend *cb, const lmx_tensor *t, size_t off, const void *dst, size_t n);
void cuda_graph_forget_host(cuda_backend *cb, const void *p);
/* The rest of this step eager and unrecorded (after a flush): a step whose ops depend on values the
 * record does not compare (experts routed on the host) must not be replayed.  The next step may
 * record and replay again. */
void cuda_graph_step_off(cuda_backend *cb);
/* Decode attention's layout for sequences [b0, b0+nb) of a (T < 32): splits | query heads a block << 8, or
 * splits | warps a block << 8 | 1 << 16 for the tensor cores' kernel (one token a sequence over long contexts). */
int cuda_attention_plan(cuda_backend *cb, const lmx_attn_args *a, int b0, int nb);

/* ops implemented in the other files (the eager versions; cuda_graph.cu wraps them) */
lmx_status cuda_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                       const lmx_tensor *bias, int M);
lmx_status cuda_attention(lmx_backend *be, const lmx_attn_args *a);
lmx_status cuda_topk(lmx_backend *be, const lmx_tensor *x, int R, int n, int k, float *vals, int32_t *idx);
/* LoRA (cuda_lora.cu): the backend op, and its decode form for B single rows
 * (y [B, N] += scale_b * B_b (A_b x[b]) for each b with pairs[b] != NULL). */
lmx_status cuda_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                     const lmx_lora_pair *const *pairs);
/* the same, each segment's shrink x A^T written into xa [B*T, r] (training's lora_keep; T > 1; y NULL: the
 * shrink alone) */
lmx_status cuda_lora_xa(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                        const lmx_lora_pair *const *pairs, float *xa);
/* y [rows, N] += s t B^T of pair p (t [rows, r] f32: the rows' shrink x A^T): the lora op's expand, a TF32 GEMM */
cublasStatus_t cuda_lora_expand(cuda_backend *cb, float *y, const float *t, int64_t rows, int64_t N,
                                const lmx_lora_pair *p);
/* the rmsnorm op that also writes out rounded to bf16 into o16 [rows, n] (training's rmsnorm_keep; n > 256) */
lmx_status cuda_rmsnorm_o16(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows, int n,
                            float eps, float add_one, __nv_bfloat16 *o16);
/* training's keeps (cuda_keep.cu): the backward ops keep, keep_dtype, restore, glu_keep, rmsnorm_keep,
 * glu_redo and rmsnorm_redo of backward.h, for cuda_backward.cu's table */
struct lmx_lora_term; /* backward.h */
lmx_status cuda_bwd_keep(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x);
lmx_dtype cuda_bwd_keep_dtype(const lmx_backend *be);
lmx_status cuda_bwd_restore(lmx_backend *be, lmx_tensor *dst, const lmx_tensor *x);
lmx_status cuda_bwd_offload(lmx_backend *be, void *host, const lmx_tensor *x, int spread);
lmx_status cuda_bwd_reload(lmx_backend *be, lmx_tensor *dst, const void *host, int64_t n, const void *next);
/* u [rows, r] = s dy B, db [N, r] += s dy^T t in one read of dy (cuda_lora_udb.cu); *done 0: not these shapes.
 * cuda_lora_udb_init: its kernels' shared memory allowed (at the backend's creation). */
void cuda_lora_udb_init(void);
/* the GLU's tensor-core kernels' shared memory allowed (cuda_lora_term.cu; at the backend's creation) */
void cuda_lora_term_init(void);
lmx_status cuda_lora_udb(cuda_backend *cb, float *u, float *db, const __nv_bfloat16 *dy, const float *B, const float *t,
                         int64_t rows, int64_t N, int r, float s, int *done);
/* offload's stages, stream and events (cuda_keep.cu), freed with the backend; wait for its copies; the
 * stages that hold no block fetched ahead freed (trim_scratch: after a forward pass's offloads) */
void cuda_park_free(cuda_backend *cb);
void cuda_park_wait(cuda_backend *cb);
void cuda_park_trim(cuda_backend *cb);
lmx_status cuda_bwd_glu_keep(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                             lmx_act act, lmx_tensor *gk, lmx_tensor *uk, lmx_tensor *ok,
                             const struct lmx_lora_term *tg, const struct lmx_lora_term *tu);
/* LoRA terms left to the op that reads the projection (cuda_lora_term.cu): glu_keep's pass over gate and up
 * (f32, or bf16: in16) with tg / tu added (*done 1; else, a rank the kernel does not take, the terms were
 * added to f32 gate and up in place by GEMMs and the caller runs its plain pass), and the lora_add backward op */
lmx_status cuda_glu_terms(cuda_backend *cb, float *out, const void *gate, const void *up, int in16, int64_t n, int act,
                          __nv_bfloat16 *gk, __nv_bfloat16 *uk, __nv_bfloat16 *ok, const struct lmx_lora_term *tg,
                          const struct lmx_lora_term *tu, int *done);
/* the LoRA backward ops (cuda_lora_bwd.cu; backward.h) */
lmx_status cuda_bwd_lora(lmx_backend *be, lmx_tensor *dx, lmx_tensor *const *da, lmx_tensor *const *db,
                         const lmx_tensor *dy, const lmx_tensor *x, int B, int T, const lmx_lora_pair *const *pairs,
                         unsigned fresh, const lmx_tensor *xa, lmx_tensor *u);
lmx_status cuda_bwd_lora_keep(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                              const lmx_lora_pair *const *pairs, lmx_tensor *xa);
lmx_status cuda_bwd_lora_dx(lmx_backend *be, lmx_tensor *dx, int count, const lmx_tensor *u,
                            const lmx_lora_pair *const *pairs, unsigned fresh);
/* the glu_bwd_dx backward op (backward.h) */
lmx_status cuda_glu_bwd_dx(lmx_backend *be, lmx_tensor *dgate, lmx_tensor *dup, const lmx_tensor *dy,
                           const lmx_tensor *gate, const lmx_tensor *up, int64_t n, lmx_act act, int count,
                           const lmx_tensor *ut, const lmx_lora_pair *const *pairs);
lmx_status cuda_bwd_lora_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n,
                             const struct lmx_lora_term *term);
/* the optimizer and dropout (cuda_optim.cu): backward.h's sumsq, adamw, adamw_many and dropout */
struct lmx_adamw_step; /* backward.h */
lmx_status cuda_bwd_sumsq(lmx_backend *be, const lmx_tensor *g, int count, double *out);
lmx_status cuda_bwd_adamw(lmx_backend *be, lmx_tensor *p, const lmx_tensor *g, lmx_tensor *m1, lmx_tensor *m2, int64_t n,
                          const struct lmx_adamw_step *s);
lmx_status cuda_bwd_adamw_many(lmx_backend *be, int count, lmx_tensor *const *p, const lmx_tensor *g, lmx_tensor *m,
                               const struct lmx_adamw_step *s);
lmx_status cuda_bwd_zero_many(lmx_backend *be, int count, lmx_tensor *g);
lmx_status cuda_bwd_dropout(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n, float p, uint64_t seed);
/* the ops table's entries the lora_glu and lora_add ops fall back on (cuda_graph.cu: decode graphs see them) */
lmx_status cuda_op_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                        const lmx_lora_pair *const *pairs);
lmx_status cuda_op_add(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int64_t n);
lmx_status cuda_op_glu(lmx_backend *be, lmx_tensor *out, const lmx_tensor *g, const lmx_tensor *u, int64_t n,
                       lmx_act act);
lmx_status cuda_bwd_rmsnorm_keep(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                                 int n, float eps, float add_one, lmx_tensor *ok);
lmx_status cuda_bwd_glu_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *gate, const lmx_tensor *up, int64_t n,
                             lmx_act act);
lmx_status cuda_bwd_rmsnorm_redo(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w, int rows,
                                 int n, float eps, float add_one);
lmx_status cuda_lora_decode(cuda_backend *cb, float *y, const float *x, int64_t K, int64_t N, int B,
                            const lmx_lora_pair *const *pairs);

/* np (1..3) projections of one input x [n, K] as one shrink and one expand launch (per 64 rows and 8
 * distinct adapters): ys[p] [n, Ns[p]] += pairs[p][m] applied to row m; glu >= 0 (np = 2): then
 * ys[0] = act(ys[0]) * ys[1] as the glu op leaves it.  The same arithmetic as cuda_lora_decode.
 * stage 0: both launches; in a decode graph (n <= 64, cb->side set) stage 1 forks the shrink onto
 * cb->side, beside what the main stream runs next (the group's GEMV), and stage 2 (the same
 * arguments) joins it and launches the expand. */
lmx_status cuda_lora_group(cuda_backend *cb, int np, float *const *ys, const int *Ns, const float *x, int64_t K, int n,
                           const lmx_lora_pair *const *const *pairs, int glu, int stage);
/* The RMSNorm a kernel applies to the row it reads (w NULL: none): x * inv_rms(x) * (w + add_one). */
typedef struct cuda_row_norm {
    const void *w;   /* [K] */
    lmx_dtype wt;
    float eps, add_one;
} cuda_row_norm;
/* One row x [K] (with norm->w: its RMSNorm, as the norm op computes it): t[p, :r_p] = scale_p A_p x
 * for the np (1..3) pairs (NULL: none) as one launch; *t (f32 [np, *rmax], scratch) holds them for the
 * GEMV that folds in the expands (cuda_gemv_opts.lora_*).  The same arithmetic as cuda_lora_group. */
lmx_status cuda_lora_shrink_row(cuda_backend *cb, int np, const lmx_lora_pair *const *pairs, const float *x,
                                int64_t K, const cuda_row_norm *norm, float **t, int *rmax);
lmx_status cuda_kv_append(lmx_backend *be, lmx_kv_layer *const *kv, const lmx_batch *batch,
                          const lmx_tensor *k, const lmx_tensor *v);
/* GEMV (cuda_gemv.cu): y_i [M, N_i] = x [M, K] @ w_i^T (+ b_i) for n (1..3) weights of one format
 * and K as one launch, M <= CUDA_GEMV_ROWS (CUDA_GEMV_TC_ROWS for the formats of the tensor-core
 * kernels: cuda_gemv_rows); glu >= 0 (an lmx_act, n = 2): also y_0 = act(y_0) * y_1
 * as the glu op would leave it.  With opts (M = 1 only), the launch also folds in: the RMSNorm of
 * x (norm_w: W multiplies rmsnorm(x) * (norm_w + add_one), computed as the norm op computes it; x
 * itself is only read), or the residual add of its result (resid, n = 1: y_0 += W x + b), and LoRA
 * expands (lora_b / lora_t: y_i += B_i t_i after the bias, before the GLU or the residual add, as the
 * lora op would add them).
 * GGUF blocks go to cuda_ggml.cu's kernels (cuda_gemv_ggml, the same contract).
 * LMX_ERR_UNSUPPORTED (nothing launched) when no vector kernel takes the weights (2-bit, odd K,
 * mixed formats) or the options; cuda_gemv_any then takes one weight of any format.
 * cuda_add_rmsnorm: y += p followed by out = rmsnorm(y) over rows of n (> 256) as one launch (o16 non-NULL:
 * out also rounded to bf16 into it, as the narrow before a bf16 GEMM would round it), LMX_ERR_UNSUPPORTED
 * otherwise. */
#define CUDA_GEMV_ROWS 8
#define CUDA_GEMV_TC_ROWS 32 /* the tensor-core kernels' most rows (MLX 4-bit, GGUF; bf16 / f16: cuda_gemv_tc_rows) */
typedef struct cuda_gemv_opts {
    const lmx_tensor *norm_w;
    float eps, add_one;
    int resid;
    /* LoRA expands folded in (weight i; lora_b[i] NULL: none): y_i[n] += B_i[n, :] . t_i, with
     * B_i f32 [N_i, lora_r[i]] and t_i [lora_r[i]] the scaled shrink (cuda_lora_shrink_row) */
    const float *lora_b[3], *lora_t[3];
    int lora_r[3];
} cuda_gemv_opts;
/* The most rows of x cuda_gemv runs well for weight w (cuda_matmul takes a GEMM beyond them). */
int cuda_gemv_rows(const cuda_backend *cb, const lmx_tensor *w);
/* 1 when cuda_gemv takes weight w for M rows with its one-row kernel (what opts need). */
int cuda_gemv_one_row(const cuda_backend *cb, const lmx_tensor *w, int M);
lmx_status cuda_gemv(cuda_backend *cb, int n, const lmx_tensor *const *ws, const lmx_tensor *const *biases,
                     float *const *ys, const float *x, int M, int glu, const cuda_gemv_opts *opts);
lmx_status cuda_gemv_any(cuda_backend *cb, const lmx_tensor *w, const lmx_tensor *bias, float *y, const float *x,
                         int M);
/* Mixture of experts (cuda_gemv.cu, for cuda_moe.cu): whether the one-row kernel takes the experts
 * [3 E] (gate, up, down of each; every expert stored as expert 0, whose three must share one format), and one launch of the gate/up pair with
 * the GLU (down 0: y0 [pairs, F] = act(gate x) * up x, y1 = up x, x row pair / kused) or the down
 * projection (down 1: y0 [pairs, C], x row pair) of expert pick[pair] (device) for each pair. */
int cuda_moe_gemv_takes(const cuda_backend *cb, const lmx_tensor *experts, int E);
/* The same for GGUF experts (cuda_ggml.cu): x [rows, K] f32 quantized first (rows: M for gate/up, the
 * pairs for down) */
int cuda_moe_ggemv_takes(const lmx_tensor *experts, int E);
#define CUDA_MOE_E_MAX 256 /* experts the routing kernel takes (8 per lane) */
#define CUDA_MOE_PAIRS 512 /* rows x choices a launch takes (64 rows of 8 choices); more: grouped GEMMs */
/* The routing of row i0 + i of a, as a kernel parameter (cuda_moe_route_row) */
typedef struct cuda_moe_router {
    const float *logits; /* [R, E] from row i0 */
    int E, kused, norm_topk, es_on;
    float scale;           /* on the logits before the softmax */
    int *pick;             /* [R, kused] */
    float *pw;             /* [R, kused] */
    float es[CUDA_MOE_E_MAX]; /* es_on: each expert's weight scale */
} cuda_moe_router;
/* A mixture of experts' combine in its down projection's launch (k_moe_ggemv): out [M, N] += each row's
 * kused outputs weighted by pw [M, kused], in choice order, by the last of a row's pairs to finish a block
 * of rows (a ticket [M, row blocks], reset for the next launch).  out NULL: none. */
typedef struct gv_moe_sum {
    float *out;
    const float *pw;
    int *ticket;
    int rows; /* output rows a block computes */
} gv_moe_sum;
/* rt for rows i0 .. of a, writing pick and pw (cuda_moe.cu) */
void cuda_moe_router_set(cuda_moe_router *rt, const lmx_moe_args *a, int i0, int *pick, float *pw);
/* rt (gate/up only; NULL: none): the routing that writes pick, done in x's quantization launch; nm (gate/up,
 * one row; NULL or nm->w NULL: none): x's RMSNorm, folded into that quantization; sum (down only; NULL:
 * none): the combine into sum->out, with weights sum->pw, done in the same launch (gv_moe_sum) */
lmx_status cuda_moe_ggemv(cuda_backend *cb, const lmx_tensor *experts, int E, int down, const int *pick, int pairs,
                          int kused, const float *x, int rows, float *y0, float *y1, int act,
                          const cuda_moe_router *rt, const cuda_row_norm *nm, const gv_moe_sum *sum = NULL);
lmx_status cuda_moe_gemv(cuda_backend *cb, const lmx_tensor *experts, int E, int down, const int *pick, int pairs,
                         int kused, const float *x, float *y0, float *y1, int act);
lmx_status cuda_moe(lmx_backend *be, const lmx_moe_args *a);
/* The moe op on x's RMSNorm by nm (a decode graph's fusion of the norm before the router and the experts:
 * GGUF experts, one row; LMX_ERR_UNSUPPORTED otherwise), or on x as it is (nm NULL). */
lmx_status cuda_moe_normed(lmx_backend *be, const lmx_moe_args *a, const cuda_row_norm *nm);
/* h = bf16(act(g) u), n elements: the glu op's arithmetic rounded once (cuda_ops.cu) */
lmx_status cuda_glu_bf16(cuda_backend *cb, __nv_bfloat16 *h, const float *g, const float *u, int64_t n, int act);
/* out (f32, or bf16: o16) = act(g) u of bf16 g and u (training's bf16 gate and up: model.h mlp16) */
lmx_status cuda_glu_of16(cuda_backend *cb, void *out, int o16, const __nv_bfloat16 *g, const __nv_bfloat16 *u, int64_t n,
                         int act);
/* 1 when the GPU routes a's rows (both paths): on, 1..CUDA_MOE_E_MAX experts, 1..32 choices, f32 router
 * logits, a SiLU or GELU-tanh GLU */
int cuda_moe_routes(const cuda_backend *cb, const lmx_moe_args *a);
int cuda_moe_takes(const cuda_backend *cb, const lmx_moe_args *a);
/* The routing of rows i0 .. i0 + R - 1 of a (cuda_moe.cu): pick, pw [R, K] */
lmx_status cuda_moe_route(cuda_backend *cb, const lmx_moe_args *a, int i0, int R, int *pick, float *pw);
/* out [M, C] += each row's K outputs of y weighted by pw [M, K], in choice order; y's row of pair i K + k
 * is that pair's (slot NULL) or slot[i K + k] (cuda_moe.cu) */
lmx_status cuda_moe_combine(cuda_backend *cb, float *out, const float *y, const float *pw, const int *slot, int M,
                            int kused, int64_t C);
/* Any number of rows, any expert type the GEMMs dequantize (cuda_moe_grouped.cu; GGUF Q4_K / Q6_K experts grouped by
 * expert on the integer tensor cores, cuda_moe_rows.cu); eager, not a graph op */
int cuda_moe_grouped_takes(const cuda_backend *cb, const lmx_moe_args *a);
lmx_status cuda_moe_grouped(lmx_backend *be, const lmx_moe_args *a);
/* Raise the shared memory limits of the GEMV kernels that stage x (once, at backend creation). */
void cuda_gemv_init(void);
lmx_status cuda_add_rmsnorm(cuda_backend *cb, lmx_tensor *y, const lmx_tensor *p, lmx_tensor *out,
                            const lmx_tensor *w, int rows, int n, float eps, float add_one, __nv_bfloat16 *o16 = NULL);
/* Where the fused norm + RoPE launch also appends this step's keys (its second tensor, after RoPE)
 * and values v [B*T, nh[1]*hd] to bf16 caches: row t of sequence b to slot (n_past + t) % cap[b]. */
typedef struct cuda_kv_dst {
    const float *v;
    void *kc[CUDA_G_MAX], *vc[CUDA_G_MAX];
    int cap[CUDA_G_MAX];
} cuda_kv_dst;
/* Per-head RMSNorm (w[k] NULL: none) then RoPE of nset (1 or 2) tensors x[k] [B*T, nh[k]*hd] in
 * place, as one launch, and with app (nset 2, B <= CUDA_G_MAX) the kv append of the result;
 * positions from cb->dyn (capture only). */
lmx_status cuda_norm_rope(cuda_backend *cb, int B, int T, int hd, const lmx_rope *rope, int nset, lmx_tensor *const *x,
                          const int *nh, const lmx_tensor *const *w, const float *eps, const float *add_one,
                          const cuda_kv_dst *app);
/* What a decode graph folds into its attention launch (cuda_attention_fused): the per-head RMSNorm (weights
 * [D], NULL: none) and RoPE of q and k, then the append of the new key and value rows to args->kv's caches,
 * which no query of the step reads back (an unbounded cache, or a rotating one at least its window long). */
typedef struct cuda_att_pre {
    const lmx_rope *rope;
    const lmx_tensor *qw, *kw;
    float qeps, keps, qone, kone;
    __nv_bfloat16 *o16;      /* non-NULL: the output also rounded to bf16 here (the o projection's GEMM input) */
} cuda_att_pre;
/* Attention of one new token a sequence on q and k as the q/k/v matmul left them (positions from cb->dyn:
 * capture only); LMX_ERR_UNSUPPORTED, nothing launched, where the fold does not apply (it takes heads of 64,
 * 128 or 256 values, every value rotated, in rotate-half or interleaved pairs). */
lmx_status cuda_attention_fused(cuda_backend *cb, const lmx_attn_args *args, const cuda_att_pre *pre);
/* Bytes of weight w's packed data (dense, MLX or GGUF); 0 if the layout is not supported. */
size_t cuda_weight_bytes(const lmx_tensor *w);
/* dst[i] = bf16(src[i]) for n values, on the stream; the _scaled form narrows src[i] * scale (rounded once). */
lmx_status cuda_narrow_bf16(cuda_backend *cb, __nv_bfloat16 *dst, const float *src, int64_t n);
/* count GEMMs of bf16 x [M, K] and bf16 weights of one shape [N, K] into f32 [M, N] as one cuBLAS batch; ptr:
 * device memory holding the x, weight and output pointers (count each, in that order). */
lmx_status cuda_gemm_bf16_batch(cuda_backend *cb, const void *const *ptr, int count, int M, int N, int K);
/* dst[i] = src[i] widened to f32 for n values, on the stream */
lmx_status cuda_widen_into(cuda_backend *cb, float *dst, const __nv_bfloat16 *src, int64_t n);
/* *wide = a new f32 tensor of bf16 x's shape and values (the caller releases it) */
lmx_status cuda_widen(cuda_backend *cb, lmx_tensor *wide, const lmx_tensor *x);
/* op(&wide) on an f32 copy of bf16 x, released after (an op that reads f32 given training's bf16 keep) */
template <class F> static inline lmx_status cuda_on_widened(cuda_backend *cb, const lmx_tensor *x, F &&op) {
    lmx_tensor wide;
    lmx_status st = cuda_widen(cb, &wide, x);
    if (st) return st;
    st = op(&wide);
    cb->base.ops->release(&cb->base, &wide);
    return st;
}
lmx_status cuda_narrow_bf16_scaled(cuda_backend *cb, __nv_bfloat16 *dst, const float *src, int64_t n, float scale);
/* Dequantize rows [n0, n0+rows) of w into dst (bf16 [rows, K]) on the stream. */
lmx_status cuda_dequant_rows_bf16(cuda_backend *cb, const lmx_tensor *w, int64_t n0, int64_t rows,
                                  __nv_bfloat16 *dst);
/* The same for GGUF block weights of the types lmx computes with (cuda_ggml.cu); LMX_ERR_UNSUPPORTED
 * (nothing launched) for others. */
lmx_status cuda_ggml_dequant_bf16(cuda_backend *cb, const lmx_tensor *w, int64_t n0, int64_t rows,
                                  __nv_bfloat16 *dst);
/* n weights of one type and shape [N, K] (a mixture's experts for its grouped GEMMs), whole: weight j's bf16 rows
 * at dst + j stride, one launch a CUDA_MOE_E_MAX of them (a launch a weight cost the grouped GEMMs ~46 us an expert
 * and round, on the H200) */
lmx_status cuda_dequant_list_bf16(cuda_backend *cb, const lmx_tensor *const *w, int n, __nv_bfloat16 *dst,
                                  int64_t stride);
/* The weights of one launch of the list: data (GGUF blocks, MLX words, or plain values), MLX scales and biases */
typedef struct cuda_dq_list {
    const void *data[CUDA_MOE_E_MAX], *scales[CUDA_MOE_E_MAX], *biases[CUDA_MOE_E_MAX];
} cuda_dq_list;
/* The GGUF form of cuda_dequant_list_bf16's launch (cuda_ggml.cu): w0 stands for the list's type and shape */
lmx_status cuda_ggml_dequant_list(cuda_backend *cb, const lmx_tensor *w0, const cuda_dq_list &l, int n,
                                  __nv_bfloat16 *dst, int64_t stride);
/* out[m, :] = row ids[m] of w (any weight format) * scale, as f32. */
lmx_status cuda_embed_rows(cuda_backend *cb, float *out, const lmx_tensor *w, const int32_t *ids,
                           int M, float scale);

/* ---- device helpers ------------------------------------------------------------------------ */

static __device__ __forceinline__ float cuda_ld_f(const float *p) { return __ldg(p); }
static __device__ __forceinline__ float cuda_ld_f(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
static __device__ __forceinline__ float cuda_ld_f(const __half *p) { return __half2float(*p); }

/* Four consecutive values as floats, and four floats stored rounded to the pointer's type (f32: 16-byte
 * aligned; bf16: 8): the elementwise kernels' vector form, four values a thread. */
static __device__ __forceinline__ float4 cuda_ld4(const float *p) { return *(const float4 *)p; }
static __device__ __forceinline__ float4 cuda_ld4(const __nv_bfloat16 *p) {
    const uint2 u = *(const uint2 *)p;
    const float2 lo = __bfloat1622float2(*(const __nv_bfloat162 *)&u.x);
    const float2 hi = __bfloat1622float2(*(const __nv_bfloat162 *)&u.y);
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
static __device__ __forceinline__ void cuda_st4(float *p, float4 v) { *(float4 *)p = v; }
static __device__ __forceinline__ void cuda_st4(__nv_bfloat16 *p, float4 v) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    *(uint2 *)p = make_uint2(*(const uint32_t *)&lo, *(const uint32_t *)&hi);
}
/* Whether count values of every pointer p (NULL ones left out) take cuda_ld4 / cuda_st4 at every fourth value:
 * the count a multiple of four, each pointer aligned to four of its values (f32 16 bytes, bf16 8). */
template <typename... P> static inline bool cuda_vec4_ok(int64_t count, const P *...p) {
    return count % 4 == 0 && ((!p || (uintptr_t)p % (4 * sizeof(P)) == 0) && ...);
}

/* The sums of a[MM] (MM a power of two up to 32) over the warp's lanes, lane l's in its a[0] for index l % MM: sums
 * across lanes 16 .. MM apart (S >= MM), then halves exchanged (S < MM: 31 shuffles for 32 values, not 32 reductions
 * of five).  Each index's sum is the tree of the butterfly it would take alone (xor 16 .. 1), so the same bits on
 * every run and as that butterfly.  Recursive in S so that every index is a constant (a loop over S left the
 * exchanges' selects to run-time indexing: 2,600 instructions a warp in k_gemv_f32_rows, spills in k_attention). */
template <int S, int MM> static __device__ __forceinline__ void cuda_warp_sums_scattered(float (&a)[MM], int lane) {
    static_assert(MM <= 32, "a value a lane at most");
    if constexpr (S >= MM) {
#pragma unroll
        for (int i = 0; i < MM; i++) a[i] += __shfl_xor_sync(0xffffffffu, a[i], S);
    } else {
        const bool hi = lane & S;
#pragma unroll
        for (int i = 0; i < S; i++) { /* keep index i (+ S where hi), send the other */
            const float send = hi ? a[i] : a[i + S], keep = hi ? a[i + S] : a[i];
            a[i] = keep + __shfl_xor_sync(0xffffffffu, send, S);
        }
    }
    if constexpr (S > 1) cuda_warp_sums_scattered<S / 2, MM>(a, lane);
}

/* RoPE's rotation of the pair (x1, x2) by (c, s): ya = x1 c - x2 s, yb = x2 c + x1 s, rounded alike (one fma
 * over a rounded product) in every kernel that rotates (k_rope, k_norm_rope, the attention's fold), which the
 * compiler's own contraction of the expression does not promise. */
static __device__ __forceinline__ void cuda_rope_pair(float x1, float x2, float c, float s, float &ya, float &yb) {
    ya = __fmaf_rn(x1, c, -__fmul_rn(x2, s));
    yb = __fmaf_rn(x2, c, __fmul_rn(x1, s));
}

/* Element i of a float vector stored as f32 / bf16 / f16. */
static __device__ __forceinline__ float cuda_elem(const void *p, lmx_dtype t, int64_t i) {
    if (t == LMX_DTYPE_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    if (t == LMX_DTYPE_F16) return __half2float(((const __half *)p)[i]);
    return ((const float *)p)[i];
}

/* Element i of a row's RMSNorm, x (the row's value i) * inv (its inverse rms) * (w[i] + add_one), in the order of
 * the norm op (cuda_ops.cu) and of every kernel that folds a norm in, so that they agree bit for bit. */
static __device__ __forceinline__ float cuda_norm_elem(float x, float inv, const void *w, lmx_dtype wt, int64_t i,
                                                       float add_one) {
    return x * inv * (cuda_elem(w, wt, i) + add_one);
}

/* v[j] = element i0 + stride * j of such a vector (0 from n on; n > 0), j < J, plus add: the dtype asked
 * once and every load unconditional (an index past n reads element n - 1, then counted as 0), so all of them
 * are in flight before the first is used. */
template <int J>
static __device__ __forceinline__ void cuda_elems(float *v, const void *p, lmx_dtype t, int i0, int stride, int n,
                                                  float add) {
    int at[J];
#pragma unroll
    for (int j = 0; j < J; j++) at[j] = i0 + stride * j < n ? i0 + stride * j : n - 1;
    if (t == LMX_DTYPE_BF16) {
        __nv_bfloat16 r[J];
#pragma unroll
        for (int j = 0; j < J; j++) r[j] = ((const __nv_bfloat16 *)p)[at[j]];
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = i0 + stride * j < n ? __bfloat162float(r[j]) + add : 0.0f;
    } else if (t == LMX_DTYPE_F32) {
        float r[J];
#pragma unroll
        for (int j = 0; j < J; j++) r[j] = ((const float *)p)[at[j]];
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = i0 + stride * j < n ? r[j] + add : 0.0f;
    } else {
#pragma unroll
        for (int j = 0; j < J; j++) v[j] = i0 + stride * j < n ? cuda_elem(p, t, at[j]) + add : 0.0f;
    }
}

static __device__ __forceinline__ float cuda_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float cuda_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The routing of row i by one warp (after the wait for the logits): lane l holds logits l, l + 32, ... (NaN
 * as -inf, so that a choice is always an expert; -0 as +0); the k-th choice is the largest not taken, the
 * lower index first among equals: the largest of the order-preserving bits of the values (cuda_moe_key; 0: no
 * expert, past E or taken), then the least index holding it, each one warp reduction (redux.sync; a choice
 * took ten shuffles as one butterfly over 64-bit keys).  Every lane follows every choice; lane k writes
 * choice k (no per-choice arrays, so nothing in local memory). */
static __device__ __forceinline__ unsigned cuda_moe_key(float v) {
    const unsigned r = __float_as_uint(v), u = r == 0x80000000u ? 0u : r;
    return u >> 31 ? ~u : u | 0x80000000u; /* above 0 for every value but NaN (taken as -inf) */
}
static __device__ __forceinline__ float cuda_moe_key_value(unsigned o) {
    return __uint_as_float(o >> 31 ? o & 0x7fffffffu : ~o);
}
static __device__ __forceinline__ void cuda_moe_route_row(const cuda_moe_router &rt, int i, int lane) {
    constexpr int J = CUDA_MOE_E_MAX / 32;
    const int E = rt.E, kused = rt.kused;
    const float scale = rt.scale;
    const float *z = rt.logits + (int64_t)i * E;
    float v[J];
    unsigned key[J];
    unsigned km = 0;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        const float t = e < E ? *(volatile const float *)(z + e) : -INFINITY; /* a volatile read: k_moe_gemv1 */
        v[j] = t != t ? -INFINITY : t;
        key[j] = e < E ? cuda_moe_key(v[j]) : 0u;
        km = key[j] > km ? key[j] : km;
    }
    const float mx = cuda_moe_key_value(__reduce_max_sync(0xffffffffu, km));
    const float base = mx == -INFINITY ? 0.0f : mx; /* every logit -inf or NaN: equal weights of 0 / 0 */
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < J; j++) sum += lane + 32 * j < E ? expf((v[j] - base) * scale) : 0.0f;
    sum = cuda_warp_sum(sum);
    float ksum = 0.0f, mine = 0.0f;
    int mine_e = 0;
    for (int k = 0; k < kused; k++) {
        unsigned b = 0;
#pragma unroll
        for (int j = 0; j < J; j++) b = key[j] > b ? key[j] : b;
        b = __reduce_max_sync(0xffffffffu, b);
        unsigned first = 0xffffffffu; /* this lane's least index holding b (j rising: e rising) */
#pragma unroll
        for (int j = J - 1; j >= 0; j--)
            if (key[j] == b) first = lane + 32 * j;
        const int be = (int)__reduce_min_sync(0xffffffffu, first);
        const float bv = cuda_moe_key_value(b);
#pragma unroll
        for (int j = 0; j < J; j++)
            if (be == lane + 32 * j) key[j] = 0;
        const float pk = expf((bv - base) * scale) / sum;
        ksum += pk;
        if (lane == k) mine = pk, mine_e = be;
    }
    if (lane >= kused) return;
    float w = rt.norm_topk ? mine / ksum : mine;
    if (rt.es_on) w *= rt.es[mine_e];
    rt.pick[i * kused + lane] = mine_e;
    rt.pw[i * kused + lane] = w;
}

/* Whether this block is the last of count blocks to arrive at *ticket (a block-wide call; the same answer in
 * every thread): the threads' global writes before it are visible to the last block's reads past L1 (__ldcg),
 * and the last block resets the ticket for the next launch.  K parts of the tensor-core GEMV (cuda_gemv_tc.cu),
 * a mixture of experts' combine (cuda_ggml.cu). */
static __device__ __forceinline__ bool cuda_block_last(int *ticket, int count) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1) == count - 1;
    __syncthreads();
    if (!last) return false;
    __threadfence();
    if (threadIdx.x == 0) *ticket = 0;
    return true;
}

/* s + the sum over a row's choices k < kused, in order, of pw[k] y[row k, c] (rows of C values; row k: slot[k], or
 * k without slots): a mixture of experts' combine, the same bits wherever it runs (k_moe_combine, and
 * the GGUF experts' down projection: gv_moe_sum).  pw and y come from earlier kernels: read past any cache they might miss. */
static __device__ __forceinline__ float cuda_moe_sum(float s, const float *y, const float *pw, const int *slot,
                                                     int kused, int64_t C, int64_t c) {
    for (int k = 0; k < kused; k++)
        s += *(volatile const float *)(pw + k) * __ldcg(y + (int64_t)(slot ? slot[k] : k) * C + c);
    return s;
}

/* The combine (gv_moe_sum) after block (bx, p) of a down projection wrote rows [bx rows, (bx + 1) rows) of y's row p
 * (blockIdx.y = p; a block-wide call): the last of row i's kused pairs to get there adds them to out's rows, as
 * k_moe_combine does (k_moe_ggemv, k_moe_down1). */
static __device__ __forceinline__ void moe_sum_tail(const gv_moe_sum &cs, const float *y, int kused, int N) {
    const int i = blockIdx.y / kused;
    if (!cuda_block_last(cs.ticket + (size_t)i * gridDim.x + blockIdx.x, kused)) return;
    const int n1 = (blockIdx.x + 1) * cs.rows < N ? (blockIdx.x + 1) * cs.rows : N;
    for (int n = blockIdx.x * cs.rows + threadIdx.x; n < n1; n += blockDim.x)
        cs.out[(size_t)i * N + n] =
            cuda_moe_sum(cs.out[(size_t)i * N + n], y + (size_t)i * kused * N, cs.pw + i * kused, NULL, kused, N, n);
}

/* act(a) of a GLU (SiLU or GELU-tanh): the glu op, the GEMVs that fold it in and the experts' GLU; SiLU as
 * a sigmoid(a) with act_grad.h's lmx_sigmoid, the training ops' */
static __device__ __forceinline__ float glu_act(float a, int act) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return act == LMX_ACT_SILU ? a * lmx_sigmoid(a) : 0.5f * a * (1.0f + tanhf(k * (a + 0.044715f * a * a * a)));
}

/* 1 / rms of a row of K values + eps folded in, from each thread's sum of squares, by a block of 256
 * threads (part: 8 floats of shared memory): the warps' sums, then the 8 warps' in warp order.  A larger
 * block's threads past 256 take part in the barrier only. */
static __device__ __forceinline__ float cuda_rms_inv_block(float ss, int K, float eps, float *part) {
    ss = cuda_warp_sum(ss);
    if (threadIdx.x % 32 == 0 && threadIdx.x < 256) part[threadIdx.x / 32] = ss;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < 8; i++) tot += part[i];
    return rsqrtf(tot / K + eps);
}

/* 1 / rms(x[0..K)) + eps folded in, by a block of 256 threads or more (part: 8 floats of shared memory), in
 * the reduction order of the rmsnorm op's kernels (the first 256 threads' sums). */
static __device__ __forceinline__ float cuda_rms_inv256(const float *x, int K, float eps, float *part) {
    const int tid = threadIdx.x, lane = tid % 32;
    float ss = 0.0f;
    if (K > 256) {
        if (tid < 256)
            for (int i = tid; i < K; i += 256) ss += x[i] * x[i];
        return cuda_rms_inv_block(ss, K, eps, part);
    }
    for (int i = lane; i < K; i += 32) ss += x[i] * x[i];
    ss = cuda_warp_sum(ss);
    return rsqrtf(ss / K + eps);
}

/* B[n, :] . t over rank r: LoRA's expand term for one output, one fixed chain of fused multiply-adds
 * (the expand kernel and the GEMVs that fold it in agree bit for bit).  Up to rank 16 every load is
 * issued before the chain starts: the GEMVs' epilogue waits for one round trip to L2, not one per 4. */
static __device__ __forceinline__ float cuda_lora_dot(const float *brow, const float *t, int r) {
    float acc = 0.0f;
    if ((r & 3) == 0 && r <= 16 && ((uintptr_t)t & 15) == 0) { /* every load in flight before the first FMA */
        float4 b4[4], t4[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (4 * q < r) {
                b4[q] = __ldg((const float4 *)(brow + 4 * q));
                t4[q] = __ldg((const float4 *)(t + 4 * q)); /* t: written by an earlier kernel, read-only here */
            }
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (4 * q < r) {
                acc = __fmaf_rn(b4[q].x, t4[q].x, acc);
                acc = __fmaf_rn(b4[q].y, t4[q].y, acc);
                acc = __fmaf_rn(b4[q].z, t4[q].z, acc);
                acc = __fmaf_rn(b4[q].w, t4[q].w, acc);
            }
        return acc;
    }
    int j = 0;
    if ((r & 3) == 0) /* the rows of B are 16-byte aligned: r * 4 bytes, a multiple of 16 */
        for (; j < r; j += 4) {
            const float4 b4 = __ldg((const float4 *)(brow + j));
            acc = __fmaf_rn(b4.x, t[j], acc);
            acc = __fmaf_rn(b4.y, t[j + 1], acc);
            acc = __fmaf_rn(b4.z, t[j + 2], acc);
            acc = __fmaf_rn(b4.w, t[j + 3], acc);
        }
    for (; j < r; j++) acc = __fmaf_rn(__ldg(brow + j), t[j], acc);
    return acc;
}

static inline unsigned cuda_blocks(int64_t n, int per) { return (unsigned)((n + per - 1) / per); }

/* RoPE's heads per thread for rows * half (row, i) pairs over nh heads (k_rope, k_rope_bwd): all of them
 * where the pairs alone fill the GPU, so that each angle (computed, or read from cuda_rope_angles' table) is
 * had once; else one.  (More threads of fewer heads each ran k's RoPE at 40-55 us a layer against 25.)  The
 * kernels load CUDA_ROPE_BATCH heads' values at once. */
#define CUDA_ROPE_BATCH 4
static inline int cuda_rope_heads_per_thread(int64_t pairs, int nh) { return pairs >= 32768 ? nh : 1; }
/* RoPE's rotation of pair i at position pos: attn_factor (cos, sin) of pos inv_freq (double precision), or
 * row's entry of a table of them (cs [rows][half], cuda_rope_angles; NULL: none) */
static __device__ __forceinline__ float2 cuda_rope_angle(const float2 *cs, int64_t row, int half, int i, int pos,
                                                         float inv_freq, float attn_factor) {
    if (cs) return cs[row * half + i];
    double sd, cd;
    sincos((double)pos * (double)inv_freq, &sd, &cd);
    return make_float2((float)cd * attn_factor, (float)sd * attn_factor);
}
/* Where RoPE over batch bt's rows is large (pairs >= 32768, not while a decode graph captures): the device table
 * [B * T][half] of attn_factor (cos, sin) of each row's angles, made where the last one was not of these rows and
 * rotation (cuda_ops.cu); NULL: not taken (the kernels compute the angles themselves). */
const float2 *cuda_rope_angles(cuda_backend *cb, const lmx_batch *bt, const lmx_rope *rope);
void cuda_rope_angles_free(cuda_backend *cb);
/* The grid and block of the RoPE kernels over a table of angles and four-value pieces (cuda_ops.cu
 * k_rope_vec, cuda_backward.cu k_rope_bwd_vec): a block row a row of x [rows, nh * 2 half] */
dim3 cuda_rope_vec_grid(int64_t rows, int nh, int half, dim3 *block);

/* Blocks of 256 threads for a grid-stride loop over n elements (at least 1, at most 65535 * 4). */
static inline unsigned cuda_ew_grid(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 65535 * 4 ? (b ? b : 1) : 65535 * 4);
}

/* ---- programmatic dependent launch (Hopper) --------------------------------------------------
 * Inside a decode graph every kernel is launched through cuda_launch with programmatic stream
 * serialization: it may be scheduled while the kernel before it is still running.  So every kernel
 * that a graph can hold begins with cuda_pdl_trigger() (its own dependents may launch early) and
 * calls cuda_pdl_wait() before it reads or writes any memory an earlier kernel writes or reads;
 * only reads of weights (never written after upload) and of a graph's per-step values (cb->dyn, copied
 * before the graph is launched) may come before the wait.  Both are no-ops
 * when the kernel was launched normally and on GPUs before sm_90. */
static __device__ __forceinline__ void cuda_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
static __device__ __forceinline__ void cuda_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

/* k<<<grid, block, smem, cb->stream>>>(args...), with programmatic serialization while cb->pdl, in clusters of cluster
 * blocks along x (1: none; sm_90 and later). */
template <typename... KArgs, typename... Args>
static inline void cuda_launch_cluster(cuda_backend *cb, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                       unsigned cluster, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cb->stream;
    cfg.attrs = at;
    if (cb->pdl) {
        at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[cfg.numAttrs++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        at[cfg.numAttrs].val.clusterDim.x = cluster;
        at[cfg.numAttrs].val.clusterDim.y = 1;
        at[cfg.numAttrs++].val.clusterDim.z = 1;
    }
    cudaLaunchKernelEx(&cfg, k, args...);
}
template <typename... KArgs, typename... Args>
static inline void cuda_launch(cuda_backend *cb, void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem,
                               Args... args) {
    cuda_launch_cluster(cb, k, grid, block, smem, 1, args...);
}

#endif
