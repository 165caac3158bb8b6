/* cpu_backend.h - internals shared by the cpu backend's files. */
#ifndef LMX_BACKEND_CPU_BACKEND_H
#define LMX_BACKEND_CPU_BACKEND_H

#include <stddef.h>
#include <string.h>
#include "../../base/threadpool.h"
#include "../backend.h"
#include "kernels.h"
#include "ggml_quant.h"
#include "quant.h"

#define CPU_SCRATCH_SLOTS 4   /* 0: norm weights / bias, 1: widened weight rows for BLAS,
                                 2: x prepared for few rows' matmul, 3: the moe op's (cpu_moe.c) */
#define CPU_SCRATCH_MOE 3
#define CPU_MAX_THREADS 256

/* cos/sin of a rope call's positions, reused by the next calls with the same positions and
 * frequencies (q and k of every layer): tab[row * rot_dim + 2i (+1)] = cos, sin of angle i. */
typedef struct cpu_rope_cache {
    int B, T, rot_dim, n_freq_alloc, rows_alloc, pos_alloc, used;
    size_t bytes;             /* allocated, as counted by lmx_backend_mem */
    float attn_factor;
    int *pos;                 /* [2 * B]: n_past then n_new */
    float *inv_freq;          /* [rot_dim / 2] */
    float *tab;
    unsigned stamp;           /* last use, for replacement */
} cpu_rope_cache;

#define CPU_ROPE_CACHE 2      /* e.g. Gemma 3's local and global rope */

typedef struct cpu_backend {
    lmx_backend base;         /* first: an lmx_backend* is a cpu_backend* */
    lmx_cpu_kernels k;
    lmx_qmatvec_fn qmatvec;   /* quantized decode kernel for k.isa */
    lmx_pool *pool;
    float *scratch[CPU_SCRATCH_SLOTS];
    size_t scratch_n[CPU_SCRATCH_SLOTS];
    float *attn_scratch[CPU_MAX_THREADS];  /* per-thread attention scores */
    cpu_rope_cache rope[CPU_ROPE_CACHE];
    unsigned rope_clock;
    int moe_op;               /* the moe op for few rows (cpu_moe.c; LMX_CPU_MOE=0: the host's routing) */
    size_t attn_scratch_n[CPU_MAX_THREADS];
} cpu_backend;

/* n floats of working memory, counted against be's memory (limit included); NULL with be->err set ("what: ..."). */
float *cpu_work(lmx_backend *be, size_t n, const char *what);
void cpu_work_free(lmx_backend *be, float *p, size_t n);
/* A float buffer of at least n_floats in scratch slot `slot`, reused between calls. */
float *cpu_scratch(cpu_backend *cb, int slot, size_t n_floats);
/* Widen rows [n0, n0 + nb) of weight w (any format) into dst [nb, K] on the pool's threads. */
void cpu_widen_rows(cpu_backend *cb, const lmx_tensor *w, int64_t n0, int64_t nb, float *dst);
/* Widen row `row` (n elements) of weight w into dst. */
void cpu_row_to_f32(const cpu_backend *cb, float *dst, const lmx_tensor *w, int64_t row,
                    int64_t n);

lmx_status cpu_matmul(lmx_backend *be, lmx_tensor *out, const lmx_tensor *x, const lmx_tensor *w,
                      const lmx_tensor *bias, int M);
/* Fewer rows than CPU_MATVEC_ROWS stream the weights through the matvec kernels, each task a range of rows against
 * every x row (cpu_matmul.c); more take the GEMM.  The pieces, for ops that run many matvecs in one dispatch (the moe
 * op): whether matmul takes w at all; x [M, K] in the form w's kernels take (cpu_matvec_prep_bytes, 0 where x serves
 * as it is: then prep may be NULL); and y[m * ldy + n] = x[m] . w[n] for n in [n0, n1). */
#define CPU_MATVEC_ROWS 8
int cpu_matmul_takes(const cpu_backend *cb, const lmx_tensor *w);
size_t cpu_matvec_prep_bytes(const cpu_backend *cb, const lmx_tensor *w, int M);
void cpu_matvec_prep(const cpu_backend *cb, const lmx_tensor *w, const float *x, int M, void *prep);
void cpu_matvec_rows(const cpu_backend *cb, const lmx_tensor *w, const float *x, const void *prep, int M, int64_t n0,
                     int64_t n1, float *y, int64_t ldy);
/* The GLU's o[i] = act(g[i]) u[i] for i < n, as the glu op computes each element (the pool's chunks of it) */
void cpu_glu_range(const cpu_backend *cb, float *o, const float *g, const float *u, int64_t n, lmx_act act);
lmx_status cpu_moe(lmx_backend *be, const lmx_moe_args *a);
lmx_status cpu_attention(lmx_backend *be, const lmx_attn_args *a);
/* Attention and its backward by tiles (cpu_attention.c, cpu_backward.c): a task takes a kv head's query heads at
 * a few positions, CPU_ATTN_LANES query vectors (or its heads, where more), and walks their keys in chunks of
 * cpu_attn_chunk(D) rows, about 16 KB, each copied side by side by cpu_attn_pack (in the cache and the batch a
 * kv head's rows lie Hk D floats apart, so many of them in one L1 set) and read from L1 by every vector. */
#define CPU_ATTN_LANES 16
static inline int cpu_attn_chunk(int D) {
    const int c = 4096 / (D > 0 ? D : 1);
    return c > 16 ? c : 16;
}
static inline void cpu_attn_pack(float *dst, const float *rows, int64_t stride, int n, int D) {
    for (int k = 0; k < n; k++) memcpy(dst + (int64_t)k * D, rows + k * stride, (size_t)D * sizeof(float));
}
lmx_status cpu_lora(lmx_backend *be, lmx_tensor *y, const lmx_tensor *x, int B, int T,
                    const lmx_lora_pair *const *pairs);

#endif
