/* dtype.h - element types of stored tensors. */
#ifndef LMX_BASE_DTYPE_H
#define LMX_BASE_DTYPE_H

#include <stddef.h>

typedef enum lmx_dtype {
    LMX_DTYPE_F32 = 0,
    LMX_DTYPE_F16,
    LMX_DTYPE_BF16,
    LMX_DTYPE_F64,
    LMX_DTYPE_I64,
    LMX_DTYPE_I32,
    LMX_DTYPE_U32,
    LMX_DTYPE_I16,
    LMX_DTYPE_U16,
    LMX_DTYPE_I8,
    LMX_DTYPE_U8,
    LMX_DTYPE_BOOL,
    LMX_DTYPE_COUNT
} lmx_dtype;

/* Bytes per element (e.g. 2 for BF16). */
size_t lmx_dtype_size(lmx_dtype t);
/* Lower-case short name: "f32", "bf16", ... */
const char *lmx_dtype_name(lmx_dtype t);
/* Parse a safetensors dtype string ("F32", "BF16", "U32", ...); returns 0 and sets *out, or -1. */
int lmx_dtype_from_safetensors(const char *s, lmx_dtype *out);

#endif
