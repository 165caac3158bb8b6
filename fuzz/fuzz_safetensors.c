/* fuzz_safetensors.c - a safetensors file: the header (length, JSON) and its tensor table.
 * Input: the file's bytes.  Opened as one file (lmx_st_open) and as a model directory holding it
 * (lmx_st_set_open_dir); on success every tensor must lie inside the file with nbytes matching its
 * dtype and shape, be found by its name, and its first and last elements be readable. */
#include "fuzz.h"

#include "base/half.h"
#include "formats/safetensors.h"

static volatile float fz_sink;

static void check_tensor(const lmx_st_tensor *t) {
    FZ_ASSERT(t->name && t->ndim >= 0 && t->ndim <= LMX_ST_MAX_DIMS);
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        FZ_ASSERT(t->shape[d] >= 0);
        n *= t->shape[d];
    }
    FZ_ASSERT(n == t->n_elements && (size_t)n * lmx_dtype_size(t->dtype) == t->nbytes);
    if (t->nbytes && (t->dtype == LMX_DTYPE_F32 || t->dtype == LMX_DTYPE_F16 || t->dtype == LMX_DTYPE_BF16))
        fz_sink = lmx_float_at(t->data, t->dtype, 0) + lmx_float_at(t->data, t->dtype, t->n_elements - 1);
    else if (t->nbytes)
        fz_sink = (float)(((const unsigned char *)t->data)[0] + ((const unsigned char *)t->data)[t->nbytes - 1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write("model.safetensors", data, size);
    lmx_err err = {0};
    lmx_st_file *f = NULL;
    lmx_status s = lmx_st_open(path, &f, &err);
    fz_check_status("lmx_st_open", s, err.msg);
    if (s == LMX_OK) {
        /* every tensor inside the data section, which follows the 8-byte length and the header */
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
        const char *lo = NULL, *hi = NULL;
        for (size_t i = 0; i < lmx_st_count(f); i++) {
            const lmx_st_tensor *t = lmx_st_at(f, i);
            check_tensor(t);
            FZ_ASSERT(lmx_st_find(f, t->name) == t);
            const char *b = t->data, *e = b + t->nbytes;
            if (t->nbytes && (!lo || b < lo)) lo = b;
            if (t->nbytes && (!hi || e > hi)) hi = e;
        }
        FZ_ASSERT(hlen <= size - 8 && (!lo || (uint64_t)(hi - lo) <= size - 8 - hlen));
        (void)lmx_st_metadata(f, "format");
        lmx_st_close(f);
    }
    lmx_st_set *set = NULL;
    s = lmx_st_set_open_dir(fz_dir(), &set, &err);
    fz_check_status("lmx_st_set_open_dir", s, err.msg);
    if (s == LMX_OK) {
        size_t total = 0;
        for (size_t i = 0; i < lmx_st_set_count(set); i++) {
            const lmx_st_tensor *t = lmx_st_set_at(set, i);
            check_tensor(t);
            FZ_ASSERT(lmx_st_set_find(set, t->name) == t);
            total += t->nbytes;
        }
        FZ_ASSERT(total == lmx_st_set_total_bytes(set));
        lmx_st_set_close(set);
    }
    return 0;
}
