/* ggml_types.c - the ggml type table (see ggml_types.h). */
#include "ggml_types.h"

#include <stddef.h>

typedef struct {
    int type, elems, bytes, sub; /* sub: elements per scale (0 for float types / not computed) */
    const char *name;
} type_info;

static const type_info TYPES[] = {
    {LMX_GGML_F32, 1, 4, 0, "F32"},       {LMX_GGML_F16, 1, 2, 0, "F16"},
    {LMX_GGML_BF16, 1, 2, 0, "BF16"},     {LMX_GGML_Q4_0, 32, 18, 32, "Q4_0"},
    {LMX_GGML_Q4_1, 32, 20, 32, "Q4_1"},  {LMX_GGML_Q5_0, 32, 22, 32, "Q5_0"},
    {LMX_GGML_Q5_1, 32, 24, 32, "Q5_1"},  {LMX_GGML_Q8_0, 32, 34, 32, "Q8_0"},
    {LMX_GGML_Q8_1, 32, 40, 0, "Q8_1"},   {LMX_GGML_Q2_K, 256, 84, 16, "Q2_K"},
    {LMX_GGML_Q3_K, 256, 110, 16, "Q3_K"}, {LMX_GGML_Q4_K, 256, 144, 32, "Q4_K"},
    {LMX_GGML_Q5_K, 256, 176, 32, "Q5_K"}, {LMX_GGML_Q6_K, 256, 210, 16, "Q6_K"},
    {LMX_GGML_Q8_K, 256, 292, 0, "Q8_K"},  {LMX_GGML_Q6_K_A16, 256, 224, 16, "Q6_K (16-byte aligned)"},
    {LMX_GGML_Q4_K_T16, 256, 144, 32, "Q4_K (tiles of 16 rows)"}, {LMX_GGML_Q6_K_T16, 256, 224, 16, "Q6_K (tiles of 16 rows)"},
    {24, 1, 1, 0, "I8"}, {25, 1, 2, 0, "I16"}, {26, 1, 4, 0, "I32"}, {27, 1, 8, 0, "I64"}, {28, 1, 8, 0, "F64"},
};

static const type_info *find_type(int type) {
    for (size_t i = 0; i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (TYPES[i].type == type) return &TYPES[i];
    return NULL;
}

int lmx_ggml_block_elems(int type) {
    const type_info *t = find_type(type);
    return t ? t->elems : 0;
}

int lmx_ggml_block_bytes(int type) {
    const type_info *t = find_type(type);
    return t ? t->bytes : 0;
}

size_t lmx_ggml_row_bytes(int type, int64_t K) {
    const type_info *t = find_type(type);
    if (!t || K < 0 || K % t->elems) return 0;
    return (size_t)(K / t->elems) * (size_t)t->bytes;
}

const char *lmx_ggml_type_name(int type) {
    const type_info *t = find_type(type);
    return t ? t->name : "unknown";
}

int lmx_ggml_scale_elems(int type) {
    const type_info *t = find_type(type);
    return t ? t->sub : 0;
}

int lmx_ggml_is_supported_quant(int type) {
    const type_info *t = find_type(type);
    return t && t->sub > 0;
}
