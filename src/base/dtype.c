/* dtype.c - element sizes and names of the stored tensor types. */
#include "dtype.h"

#include <string.h>

typedef struct dtype_info {
    size_t size;
    const char *name;   /* lmx short name */
    const char *st;     /* safetensors dtype string */
} dtype_info;

/* Indexed by lmx_dtype. */
static const dtype_info k_dtypes[LMX_DTYPE_COUNT] = {
    [LMX_DTYPE_F32] = {4, "f32", "F32"},
    [LMX_DTYPE_F16] = {2, "f16", "F16"},
    [LMX_DTYPE_BF16] = {2, "bf16", "BF16"},
    [LMX_DTYPE_F64] = {8, "f64", "F64"},
    [LMX_DTYPE_I64] = {8, "i64", "I64"},
    [LMX_DTYPE_I32] = {4, "i32", "I32"},
    [LMX_DTYPE_U32] = {4, "u32", "U32"},
    [LMX_DTYPE_I16] = {2, "i16", "I16"},
    [LMX_DTYPE_U16] = {2, "u16", "U16"},
    [LMX_DTYPE_I8] = {1, "i8", "I8"},
    [LMX_DTYPE_U8] = {1, "u8", "U8"},
    [LMX_DTYPE_BOOL] = {1, "bool", "BOOL"},
};

static int dtype_valid(lmx_dtype t) { return (int)t >= 0 && t < LMX_DTYPE_COUNT; }

size_t lmx_dtype_size(lmx_dtype t) { return dtype_valid(t) ? k_dtypes[t].size : 0; }

const char *lmx_dtype_name(lmx_dtype t) { return dtype_valid(t) ? k_dtypes[t].name : "unknown"; }

int lmx_dtype_from_safetensors(const char *s, lmx_dtype *out) {
    if (!s) return -1;
    for (int i = 0; i < LMX_DTYPE_COUNT; i++) {
        if (strcmp(s, k_dtypes[i].st) == 0) {
            if (out) *out = (lmx_dtype)i;
            return 0;
        }
    }
    return -1;
}
