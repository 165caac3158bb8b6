/* safetensors.h - zero-copy safetensors reader (one file, or a sharded checkpoint directory).
 *
 * File layout: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "BF16", "shape": [a, b], "data_offsets": [begin, end]}, ...,
 *    "__metadata__": {"k": "v"}}
 * then the data section; offsets are relative to its start.  Opening validates strictly:
 * header length within the file, JSON well formed, known dtype, non-negative shape, end-begin ==
 * product(shape) * dtype size, ranges inside the data section, no two tensors overlapping, no
 * duplicate names.  Errors are LMX_ERR_FORMAT / LMX_ERR_IO / LMX_ERR_UNSUPPORTED (an unknown dtype,
 * more than LMX_ST_MAX_DIMS dimensions) and name the file and tensor.
 */
#ifndef LMX_FORMATS_SAFETENSORS_H
#define LMX_FORMATS_SAFETENSORS_H

#include <stdint.h>
#include "../base/dtype.h"
#include "../base/status.h"

#define LMX_ST_MAX_DIMS 8

typedef struct lmx_st_tensor {
    const char *name;                 /* owned by the file / set */
    lmx_dtype dtype;
    int ndim;
    int64_t shape[LMX_ST_MAX_DIMS];   /* row-major: shape[ndim-1] varies fastest */
    int64_t n_elements;
    const void *data;                 /* points into the read-only mapping, at any alignment (the
                                         format aligns nothing): read it with lmx_load_* / lmx_float_at */
    size_t nbytes;
    const char *file;                 /* path of the file holding it (owned by the file / set) */
} lmx_st_tensor;

typedef struct lmx_st_file lmx_st_file;

lmx_status lmx_st_open(const char *path, lmx_st_file **out, lmx_err *err);
void lmx_st_close(lmx_st_file *f);
size_t lmx_st_count(const lmx_st_file *f);
const lmx_st_tensor *lmx_st_at(const lmx_st_file *f, size_t i);      /* in header order */
const lmx_st_tensor *lmx_st_find(const lmx_st_file *f, const char *name); /* NULL if absent */
/* Value of a "__metadata__" string entry, or NULL. */
const char *lmx_st_metadata(const lmx_st_file *f, const char *key);

/* All tensors of a model directory:
 *   - model.safetensors.index.json present: every tensor of the shards its "weight_map" names
 *     (each shard opened once).  A shard name that is not a plain file name (has '/' or "..")
 *     is LMX_ERR_FORMAT; a missing shard file, or a listed tensor absent from its shard, is
 *     LMX_ERR_MISSING;
 *   - else every *.safetensors file of the directory (sorted by name; dot-files skipped),
 *     excluding files that are not model weights by convention: reference.safetensors (test
 *     references), adapter_model.safetensors and adapters.safetensors (LoRA adapters), which
 *     our fixtures keep beside the weights.
 * A duplicate tensor name across files is LMX_ERR_FORMAT.  A directory with no safetensors file
 * is LMX_ERR_MISSING. */
typedef struct lmx_st_set lmx_st_set;

lmx_status lmx_st_set_open_dir(const char *dir, lmx_st_set **out, lmx_err *err);
/* A set made of exactly one file (e.g. reference.safetensors). */
lmx_status lmx_st_set_open_file(const char *path, lmx_st_set **out, lmx_err *err);
void lmx_st_set_close(lmx_st_set *s);
size_t lmx_st_set_count(const lmx_st_set *s);
const lmx_st_tensor *lmx_st_set_at(const lmx_st_set *s, size_t i);
const lmx_st_tensor *lmx_st_set_find(const lmx_st_set *s, const char *name); /* O(1) hash */
size_t lmx_st_set_total_bytes(const lmx_st_set *s); /* sum of tensor nbytes */

/* Write tensors to path (header keys in the given order, 8-byte aligned header).  Used by tests,
 * quantization and adapter saving.  A bad item (NULL or "__metadata__" name, repeated name,
 * unknown dtype, negative dim, NULL data for a non-empty tensor) is LMX_ERR_INVALID_ARG and
 * writes nothing; a failed write (LMX_ERR_IO) removes the partial file. */
typedef struct lmx_st_write_item {
    const char *name;
    lmx_dtype dtype;
    int ndim;
    int64_t shape[LMX_ST_MAX_DIMS];
    const void *data;                 /* product(shape) * dtype size bytes */
} lmx_st_write_item;

lmx_status lmx_st_write(const char *path, const lmx_st_write_item *items, size_t n, lmx_err *err);

/* One "__metadata__" entry (safetensors metadata values are strings). */
typedef struct lmx_st_meta {
    const char *key, *value;
} lmx_st_meta;

/* lmx_st_write with a "__metadata__" object of n_meta entries first in the header (none when n_meta is
 * 0); a NULL key or value, or a key given twice, is LMX_ERR_INVALID_ARG. */
lmx_status lmx_st_write_meta(const char *path, const lmx_st_write_item *items, size_t n, const lmx_st_meta *meta,
                             size_t n_meta, lmx_err *err);

#endif
