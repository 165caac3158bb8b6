/* gguf.h - zero-copy GGUF (v2, v3) reader: metadata key/values and tensor directory.
 *
 * Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, the metadata
 * (key: u64 length + bytes; u32 value type; value), the tensor infos (name, u32 n_dims,
 * u64 dims[n_dims] fastest first, u32 ggml type, u64 offset), padding to general.alignment
 * (default 32), then the tensor data.  Opening validates every length and offset against the file
 * size; errors (LMX_ERR_FORMAT / LMX_ERR_IO) name the file and the key or tensor. */
#ifndef LMX_FORMATS_GGUF_H
#define LMX_FORMATS_GGUF_H

#include <stddef.h>
#include <stdint.h>
#include "../base/status.h"

typedef enum lmx_gguf_vtype {
    LMX_GGUF_U8 = 0, LMX_GGUF_I8, LMX_GGUF_U16, LMX_GGUF_I16, LMX_GGUF_U32, LMX_GGUF_I32,
    LMX_GGUF_F32, LMX_GGUF_BOOL, LMX_GGUF_STRING, LMX_GGUF_ARRAY, LMX_GGUF_U64, LMX_GGUF_I64,
    LMX_GGUF_F64, LMX_GGUF_VTYPE_COUNT
} lmx_gguf_vtype;

typedef struct lmx_gguf_str {
    const char *s;       /* NOT NUL-terminated: points into the mapping */
    uint64_t len;
} lmx_gguf_str;

typedef struct lmx_gguf_kv {
    char *key;           /* NUL-terminated copy */
    lmx_gguf_vtype type;
    lmx_gguf_vtype elem_type;  /* arrays: the element type */
    uint64_t count;      /* arrays: number of elements; else 1 */
    const void *data;    /* scalars and numeric arrays: the raw little-endian values */
    lmx_gguf_str *strs;  /* strings (count 1) and string arrays: each string */
} lmx_gguf_kv;

typedef struct lmx_gguf_tensor {
    char *name;          /* NUL-terminated copy */
    int type;            /* ggml type (see backend/cpu/ggml_quant.h) */
    int n_dims;
    int64_t ne[4];       /* ne[0] varies fastest (the input dimension of a weight) */
    const void *data;
    size_t nbytes;
} lmx_gguf_tensor;

typedef struct lmx_gguf lmx_gguf;

lmx_status lmx_gguf_open(const char *path, lmx_gguf **out, lmx_err *err);
void lmx_gguf_close(lmx_gguf *g);
/* 1 when the file at path starts with the GGUF magic. */
int lmx_gguf_is_gguf(const char *path);

size_t lmx_gguf_kv_count(const lmx_gguf *g);
const lmx_gguf_kv *lmx_gguf_kv_at(const lmx_gguf *g, size_t i);
const lmx_gguf_kv *lmx_gguf_find_kv(const lmx_gguf *g, const char *key);
size_t lmx_gguf_tensor_count(const lmx_gguf *g);
const lmx_gguf_tensor *lmx_gguf_tensor_at(const lmx_gguf *g, size_t i);
const lmx_gguf_tensor *lmx_gguf_find_tensor(const lmx_gguf *g, const char *name);
const char *lmx_gguf_path(const lmx_gguf *g);

/* Typed getters: return 1 and set *out when key exists with a compatible scalar type. */
int lmx_gguf_get_int(const lmx_gguf *g, const char *key, int64_t *out);
int lmx_gguf_get_float(const lmx_gguf *g, const char *key, double *out);
/* A string value as a malloc'ed NUL-terminated copy (caller frees), or NULL. */
char *lmx_gguf_get_string(const lmx_gguf *g, const char *key);
/* Element i of a numeric array as double / int64 (0 if out of range or not numeric). */
double lmx_gguf_array_float(const lmx_gguf_kv *kv, uint64_t i);
int64_t lmx_gguf_array_int(const lmx_gguf_kv *kv, uint64_t i);

#endif
