/* ggml_types.h - the ggml tensor types a GGUF file can hold: numbers, names and block geometry.
 *
 * A row of K elements (K a multiple of the type's block size) is K / elems blocks of `bytes` bytes
 * each (Q4_0 .. Q8_0: 32 elements per block; Q2_K .. Q8_K: 256 per super-block; F32/F16/BF16: 1). */
#ifndef LMX_FORMATS_GGML_TYPES_H
#define LMX_FORMATS_GGML_TYPES_H

#include <stddef.h>
#include <stdint.h>

/* ggml type numbers as stored in GGUF files. */
typedef enum lmx_ggml_type {
    LMX_GGML_F32 = 0,
    LMX_GGML_F16 = 1,
    LMX_GGML_Q4_0 = 2,
    LMX_GGML_Q4_1 = 3,
    LMX_GGML_Q5_0 = 6,
    LMX_GGML_Q5_1 = 7,
    LMX_GGML_Q8_0 = 8,
    LMX_GGML_Q8_1 = 9,
    LMX_GGML_Q2_K = 10,
    LMX_GGML_Q3_K = 11,
    LMX_GGML_Q4_K = 12,
    LMX_GGML_Q5_K = 13,
    LMX_GGML_Q6_K = 14,
    LMX_GGML_Q8_K = 15,
    LMX_GGML_BF16 = 30,
    /* Layouts a backend may store a type's blocks in after upload; never in a file (gguf.c refuses them). */
    LMX_GGML_LAYOUTS = 256,
    LMX_GGML_Q6_K_A16 = 256 + 14, /* Q6_K's 210-byte blocks 224 bytes apart: each starts on 16 bytes (cuda) */
    /* a mixture's experts in tiles of 16 rows (cuda, LMX_CUDA_MOE_TILES): a tile's super-block b holds its rows' blocks
     * in the order the tensor-core launch's lanes read them, and rows [16 i, 16 i + 16) start where they would in rows */
    LMX_GGML_Q4_K_T16 = 512 + 12,
    LMX_GGML_Q6_K_T16 = 512 + 14, /* from Q6_K_A16's blocks */
} lmx_ggml_type;

/* Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..7) of a super-block, from its 12-byte scales field (the cpu
 * kernels; the cuda upload's repack and its f16 checks, on the host and the device). */
#ifdef __CUDACC__
#define LMX_GGML_HOST_DEVICE __host__ __device__
#else
#define LMX_GGML_HOST_DEVICE
#endif
static inline LMX_GGML_HOST_DEVICE void lmx_ggml_k4_scale_min(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Elements per block and bytes per block; 0 for types this table does not know. */
int lmx_ggml_block_elems(int type);
int lmx_ggml_block_bytes(int type);
/* Elements sharing one scale inside a block (0 for float types and types lmx does not compute). */
int lmx_ggml_scale_elems(int type);
/* Bytes of a row of K elements (K a multiple of the block size), or 0 if unknown/misaligned. */
size_t lmx_ggml_row_bytes(int type, int64_t K);
/* "Q4_K" etc.; "unknown" otherwise. */
const char *lmx_ggml_type_name(int type);
/* 1 for the block-quantized types lmx computes with (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K, and the layouts a
 * backend stores them in after upload). */
int lmx_ggml_is_supported_quant(int type);

#endif
