/* cuda_moe_mma.h - a mixture of experts' GGUF experts for several rows on the integer tensor cores
 * (cuda_moe_mma.cu), for cuda_moe.cu. */
#ifndef LMX_BACKEND_CUDA_MOE_MMA_H
#define LMX_BACKEND_CUDA_MOE_MMA_H

#include "cuda_internal.h"

/* The fewest rows that take it by default (cb->moe_mma; fewer: the per-pair kernels, k_moe_ggemv).  H200, Qwen3-30B-A3B
 * Q4_K_M, tok/s with gate / up on the tensor cores from 8 rows against from 16 (down on them in both): 48 layers
 * batch 8 1,392-1,393 / 1,284, batch 12 1,734-1,736 / 1,390; 12 layers batch 4 from 4 rows 2,964-2,970 against
 * 3,172-3,181 from 8 or 16. */
#define CUDA_MOE_MMA_ROWS_GU 8
#define CUDA_MOE_MMA_ROWS_DOWN 2

/* At the backend's creation: the kernels' shared memory allowed (cb->moe_mma_smem; one row: cb->one_smem, sm_smem,
 * block_smem) */
void cuda_moe_mma_init(cuda_backend *cb);
/* 1 when cuda_moe_mma_gu (down 0) or cuda_moe_mma_down (1) takes a's experts: Q4_K gate and up, Q4_K or Q6_K
 * down, every expert 16-byte aligned, rows that fit its shared memory, enough rows (one row's pairs each read a
 * different expert: the per-pair kernels, k_moe_gu_staged and k_moe_ggemv, are as fast). */
int cuda_moe_mma_takes(const cuda_backend *cb, const lmx_moe_args *a, int down);
/* The same for any number of rows: the experts' types, shapes and alignment, and the staging of x's rows */
int cuda_moe_mma_fits(const cuda_backend *cb, const lmx_moe_args *a, int down);
/* x's routing (pick, pw [M, K]) in its quantization's launch, then h [M K, F] = act(gate_e x_i) * (up_e x_i) for
 * each (row i, choice) pair */
lmx_status cuda_moe_mma_gu(cuda_backend *cb, const lmx_moe_args *a, int *pick, float *pw, float *h);
/* h quantized, then y [M K, C] = down_e h_p for each pair p (the combine is the caller's) */
lmx_status cuda_moe_mma_down(cuda_backend *cb, const lmx_moe_args *a, const int *pick, const float *h, float *y);

/* Many rows grouped by expert (cuda_moe_rows.cu, for cuda_moe_grouped.cu): whether it takes a's experts (those of
 * cuda_moe_mma_fits, gate / up and down; cb->moe_rows); a round's plan from its P = R K pairs' choices (pick [P]):
 * slot [P] (pair -> place), src [P] (place -> row) and tiles [cuda_moe_rows_tiles_max(P, E)] (expert, first place,
 * places, 0; empty ones last), one launch; the launches of a round: x [R, C] of its R rows quantized, h [P, F] =
 * act(gate_e x[src[s]]) (up_e x[src[s]]) for each of its places s (of expert e), h quantized, y [P, C] = down_e h[s]. */
int cuda_moe_rows_takes(const cuda_backend *cb, const lmx_moe_args *a);
int cuda_moe_rows_tiles_max(int P, int E);
lmx_status cuda_moe_rows_plan(cuda_backend *cb, const int *pick, int P, int E, int K, int *slot, int *src,
                              int4 *tiles);
lmx_status cuda_moe_rows(cuda_backend *cb, const lmx_moe_args *a, const float *x, int R, const int *src,
                         const int4 *tiles, float *h, float *y);

/* Gate and up experts in tiles (LMX_GGML_Q4_K_T16) for rows too few for the tensor cores, on the CUDA cores in their
 * arithmetic (each pair's h the bits k_moe_mma gives it): whether cuda_moe_tiles_gu takes a's experts, and the
 * launches: x's quantization (nm's RMSNorm folded in where nm and nm->w) with its routing (pick, pw [M, K]), then
 * h [M K, F] = act(gate_e x_i) * (up_e x_i). */
int cuda_moe_tiles_gu_takes(const cuda_backend *cb, const lmx_moe_args *a);
lmx_status cuda_moe_tiles_gu(cuda_backend *cb, const lmx_moe_args *a, const cuda_row_norm *nm, int *pick, float *pw,
                             float *h);
/* One row (decode of one sequence) of experts in tiles (those, beside Q4_K_T16 or Q6_K_T16 down): whether
 * cuda_moe_one takes a's experts, and the launches: cuda_moe_tiles_gu, then y [K, C] = down_e h_p and the combine
 * into a->out, in the same arithmetic. */
int cuda_moe_one_takes(const cuda_backend *cb, const lmx_moe_args *a);
lmx_status cuda_moe_one(cuda_backend *cb, const lmx_moe_args *a, const cuda_row_norm *nm, int *pick, float *pw,
                        float *h, float *y);

/* Whether (cb->moe_tiles) a stacked GGUF expert weight w (on the host: Q4_K or Q6_K; each expert's rows a
 * multiple of 32) is uploaded in tiles (LMX_GGML_Q4_K_T16 / Q6_K_T16, cuda_moe_tiled_type); cuda_moe_tiles_upload
 * writes them into dst (cuda_weight_bytes(w) bytes) through a staging copy of the rows. */
int cuda_moe_tiles_takes(const cuda_backend *cb, const lmx_tensor *w);
int cuda_moe_tiled_type(int type);
lmx_status cuda_moe_tiles_upload(cuda_backend *cb, const lmx_tensor *w, void *dst);
/* The block type a tiled type's blocks are (Q4_K, Q6_K_A16), else 0 */
static inline int cuda_moe_tile_base(int type) {
    return type == LMX_GGML_Q4_K_T16 ? LMX_GGML_Q4_K : type == LMX_GGML_Q6_K_T16 ? LMX_GGML_Q6_K_A16 : 0;
}
/* The type of a stored type's blocks: a tiled type's base, else the type itself */
static inline int cuda_moe_blocks(int type) { return cuda_moe_tile_base(type) ? cuda_moe_tile_base(type) : type; }

#endif
