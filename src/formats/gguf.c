/* gguf.c - GGUF reader (see gguf.h).  The file is mapped read-only; keys and tensor names are
 * copied, string values and tensor data point into the mapping. */
#include "gguf.h"

#include <stdlib.h>
#include <string.h>

#include "../base/fileio.h"
#include "ggml_types.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIMS 4

struct lmx_gguf {
    char *path;
    lmx_mmap map;
    lmx_gguf_kv *kvs;
    size_t n_kvs;
    lmx_gguf_tensor *tensors;
    size_t n_tensors;
};

/* ---- a bounds-checked cursor over the mapping ------------------------------------------------- */

typedef struct cursor {
    const unsigned char *p, *end;
    int bad;
} cursor;

static int take(cursor *c, void *dst, size_t n) {
    if (c->bad || (size_t)(c->end - c->p) < n) {
        c->bad = 1;
        return 0;
    }
    if (dst) memcpy(dst, c->p, n);
    c->p += n;
    return 1;
}

static uint32_t u32(cursor *c) { uint32_t v = 0; take(c, &v, 4); return v; }
static uint64_t u64(cursor *c) { uint64_t v = 0; take(c, &v, 8); return v; }

static lmx_gguf_str str(cursor *c) {
    lmx_gguf_str s = {NULL, u64(c)};
    if (!c->bad && s.len <= (uint64_t)(c->end - c->p)) {
        s.s = (const char *)c->p;
        c->p += s.len;
    } else {
        c->bad = 1;
        s.len = 0;
    }
    return s;
}

static size_t vsize(lmx_gguf_vtype t) {
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return t < LMX_GGUF_VTYPE_COUNT ? sz[t] : 0;
}

static char *dup_str(lmx_gguf_str s) {
    char *d = malloc(s.len + 1);
    if (d) {
        memcpy(d, s.s, s.len);
        d[s.len] = 0;
    }
    return d;
}

/* Read one value of type t (arrays: elements of elem type) into kv. */
static lmx_status read_value(cursor *c, lmx_gguf_kv *kv, const char *path, lmx_err *err) {
    kv->count = 1;
    if (kv->type == LMX_GGUF_ARRAY) {
        kv->elem_type = (lmx_gguf_vtype)u32(c);
        kv->count = u64(c);
        if (kv->elem_type == LMX_GGUF_ARRAY || kv->elem_type >= LMX_GGUF_VTYPE_COUNT)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: key %s: unsupported array element type %d", path,
                               LMX_QUOTED(kv->key), (int)kv->elem_type);
    } else {
        kv->elem_type = kv->type;
    }
    if (kv->type >= LMX_GGUF_VTYPE_COUNT)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: key %s: unknown value type %d", path, LMX_QUOTED(kv->key), (int)kv->type);
    if (kv->elem_type == LMX_GGUF_STRING) {
        if (kv->count > (uint64_t)(c->end - c->p) / 8) /* each string needs at least its length */
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: key %s: %llu strings exceed the file", path, LMX_QUOTED(kv->key),
                               (unsigned long long)kv->count);
        kv->strs = malloc((size_t)(kv->count ? kv->count : 1) * sizeof *kv->strs);
        if (!kv->strs) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
        for (uint64_t i = 0; i < kv->count && !c->bad; i++) kv->strs[i] = str(c);
    } else {
        size_t es = vsize(kv->elem_type);
        if (kv->count > (uint64_t)(c->end - c->p) / es) c->bad = 1;
        kv->data = c->p;
        take(c, NULL, (size_t)kv->count * es);
    }
    if (c->bad) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: key %s: value runs past the end of the file", path, LMX_QUOTED(kv->key));
    return LMX_OK;
}

static lmx_status parse(lmx_gguf *g, lmx_err *err) {
    const char *path = g->path;
    if (!g->map.data) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a GGUF file (empty)", path);
    cursor c = {g->map.data, (const unsigned char *)g->map.data + g->map.size, 0};
    uint32_t magic = u32(&c), version = u32(&c);
    if (c.bad || magic != GGUF_MAGIC) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a GGUF file (bad magic)", path);
    if (version != 2 && version != 3)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2, 3)", path, version);
    uint64_t n_tensors = u64(&c), n_kvs = u64(&c);
    uint64_t room = (uint64_t)(c.end - c.p);
    if (c.bad || n_kvs > room / 12 || n_tensors > room / 24)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: header counts (%llu keys, %llu tensors) exceed the file", path,
                           (unsigned long long)n_kvs, (unsigned long long)n_tensors);
    g->kvs = calloc((size_t)n_kvs + 1, sizeof *g->kvs);
    g->tensors = calloc((size_t)n_tensors + 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    lmx_status st;
    for (uint64_t i = 0; i < n_kvs; i++) {
        lmx_gguf_kv *kv = &g->kvs[g->n_kvs];
        lmx_gguf_str key = str(&c);
        kv->type = (lmx_gguf_vtype)u32(&c);
        if (c.bad) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: metadata entry %llu is truncated", path, (unsigned long long)i);
        if (!(kv->key = dup_str(key))) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
        g->n_kvs++;
        if ((st = read_value(&c, kv, path, err))) return st;
    }
    uint64_t alignment = 32;
    int64_t a;
    if (lmx_gguf_get_int(g, "general.alignment", &a)) {
        if (a <= 0 || (a & (a - 1)) || a > 65536)
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: general.alignment %lld is not a power of two", path, (long long)a);
        alignment = (uint64_t)a;
    }
    uint64_t *offsets = malloc((size_t)(n_tensors + 1) * sizeof *offsets);
    if (!offsets) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    for (uint64_t i = 0; i < n_tensors; i++) {
        lmx_gguf_tensor *t = &g->tensors[g->n_tensors];
        lmx_gguf_str name = str(&c);
        if (c.bad || !(t->name = dup_str(name))) {
            free(offsets);
            return c.bad ? lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor info %llu is truncated", path, (unsigned long long)i)
                         : lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
        }
        g->n_tensors++;
        uint32_t nd = u32(&c);
        if (nd == 0 || nd > GGUF_MAX_DIMS) {
            free(offsets);
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s has %u dimensions", path, LMX_QUOTED(t->name), nd);
        }
        t->n_dims = (int)nd;
        uint64_t n = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) {
            uint64_t v = d < (int)nd ? u64(&c) : 1;
            if (v > (1ull << 40) || (v && n > (1ull << 48) / v)) c.bad = 1;
            t->ne[d] = (int64_t)v;
            n *= v;
        }
        t->type = (int)u32(&c);
        offsets[i] = u64(&c);
        if (c.bad) {
            free(offsets);
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s: truncated or absurd dimensions", path, LMX_QUOTED(t->name));
        }
        int be = t->type < LMX_GGML_LAYOUTS ? lmx_ggml_block_elems(t->type) : 0, bb = lmx_ggml_block_bytes(t->type);
        if (!be) {
            free(offsets);
            return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: tensor %s has unknown ggml type %d", path, LMX_QUOTED(t->name), t->type);
        }
        if (t->ne[0] % be) {
            free(offsets);
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s: row of %lld is not a whole number of %d-element blocks",
                               path, LMX_QUOTED(t->name), (long long)t->ne[0], be);
        }
        t->nbytes = (size_t)(n / (uint64_t)be * (uint64_t)bb);
    }
    uint64_t header = (uint64_t)(c.p - (const unsigned char *)g->map.data);
    uint64_t data_start = (header + alignment - 1) / alignment * alignment;
    for (size_t i = 0; i < g->n_tensors; i++) {
        lmx_gguf_tensor *t = &g->tensors[i];
        uint64_t off = offsets[i];
        if (off % alignment || data_start > g->map.size || off > g->map.size - data_start || /* no sum that can wrap */
            t->nbytes > g->map.size - data_start - off) {
            free(offsets);
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s: data [%llu, +%zu) is misaligned or outside the file",
                               path, LMX_QUOTED(t->name), (unsigned long long)off, t->nbytes);
        }
        t->data = (const unsigned char *)g->map.data + data_start + offsets[i];
    }
    free(offsets);
    return LMX_OK;
}

lmx_status lmx_gguf_open(const char *path, lmx_gguf **out, lmx_err *err) {
    *out = NULL;
    lmx_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    lmx_status st = lmx_mmap_open(path, &g->map, err);
    if (st == LMX_OK) st = parse(g, err);
    if (st != LMX_OK) {
        lmx_gguf_close(g);
        return st;
    }
    *out = g;
    return LMX_OK;
}

void lmx_gguf_close(lmx_gguf *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_kvs; i++) {
        free(g->kvs[i].key);
        free(g->kvs[i].strs);
    }
    for (size_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
    free(g->kvs);
    free(g->tensors);
    lmx_mmap_close(&g->map);
    free(g->path);
    free(g);
}

int lmx_gguf_is_gguf(const char *path) {
    lmx_mmap m;
    if (lmx_mmap_open(path, &m, NULL) != LMX_OK) return 0;
    uint32_t magic = 0;
    if (m.size >= 4) memcpy(&magic, m.data, 4);
    lmx_mmap_close(&m);
    return magic == GGUF_MAGIC;
}

size_t lmx_gguf_kv_count(const lmx_gguf *g) { return g->n_kvs; }
const lmx_gguf_kv *lmx_gguf_kv_at(const lmx_gguf *g, size_t i) { return i < g->n_kvs ? &g->kvs[i] : NULL; }
size_t lmx_gguf_tensor_count(const lmx_gguf *g) { return g->n_tensors; }
const lmx_gguf_tensor *lmx_gguf_tensor_at(const lmx_gguf *g, size_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}
const char *lmx_gguf_path(const lmx_gguf *g) { return g->path; }

const lmx_gguf_kv *lmx_gguf_find_kv(const lmx_gguf *g, const char *key) {
    for (size_t i = 0; i < g->n_kvs; i++)
        if (strcmp(g->kvs[i].key, key) == 0) return &g->kvs[i];
    return NULL;
}

const lmx_gguf_tensor *lmx_gguf_find_tensor(const lmx_gguf *g, const char *name) {
    for (size_t i = 0; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i].name, name) == 0) return &g->tensors[i];
    return NULL;
}

/* d as an int64, saturated (NaN: 0): a plain cast of an out-of-range float is undefined. */
static int64_t sat_int64(double d) {
    if (!(d == d)) return 0;
    if (d >= 9223372036854775807.0) return INT64_MAX;
    if (d <= -9223372036854775807.0) return INT64_MIN;
    return (int64_t)d;
}

/* Element i of numeric data of type t. */
static int numeric(lmx_gguf_vtype t, const void *data, uint64_t i, double *d, int64_t *n) {
    const unsigned char *p = data;
    switch (t) {
#define CASE(T, CT, TO_INT)                                 \
    case T: {                                               \
        CT v;                                               \
        memcpy(&v, p + i * sizeof(CT), sizeof(CT));         \
        *d = (double)v;                                     \
        *n = TO_INT(v);                                     \
        return 1;                                           \
    }
        CASE(LMX_GGUF_U8, uint8_t, (int64_t))
        CASE(LMX_GGUF_I8, int8_t, (int64_t))
        CASE(LMX_GGUF_U16, uint16_t, (int64_t))
        CASE(LMX_GGUF_I16, int16_t, (int64_t))
        CASE(LMX_GGUF_U32, uint32_t, (int64_t))
        CASE(LMX_GGUF_I32, int32_t, (int64_t))
        CASE(LMX_GGUF_U64, uint64_t, (int64_t))
        CASE(LMX_GGUF_I64, int64_t, (int64_t))
        CASE(LMX_GGUF_F32, float, sat_int64)
        CASE(LMX_GGUF_F64, double, sat_int64)
        CASE(LMX_GGUF_BOOL, uint8_t, (int64_t))
#undef CASE
    default: return 0;
    }
}

int lmx_gguf_get_int(const lmx_gguf *g, const char *key, int64_t *out) {
    const lmx_gguf_kv *kv = lmx_gguf_find_kv(g, key);
    double d;
    return kv && kv->type != LMX_GGUF_ARRAY && numeric(kv->type, kv->data, 0, &d, out);
}

int lmx_gguf_get_float(const lmx_gguf *g, const char *key, double *out) {
    const lmx_gguf_kv *kv = lmx_gguf_find_kv(g, key);
    int64_t n;
    return kv && kv->type != LMX_GGUF_ARRAY && numeric(kv->type, kv->data, 0, out, &n);
}

char *lmx_gguf_get_string(const lmx_gguf *g, const char *key) {
    const lmx_gguf_kv *kv = lmx_gguf_find_kv(g, key);
    return kv && kv->type == LMX_GGUF_STRING ? dup_str(kv->strs[0]) : NULL;
}

double lmx_gguf_array_float(const lmx_gguf_kv *kv, uint64_t i) {
    double d = 0;
    int64_t n;
    if (kv->type == LMX_GGUF_ARRAY && i < kv->count) numeric(kv->elem_type, kv->data, i, &d, &n);
    return d;
}

int64_t lmx_gguf_array_int(const lmx_gguf_kv *kv, uint64_t i) {
    double d;
    int64_t n = 0;
    if (kv->type == LMX_GGUF_ARRAY && i < kv->count) numeric(kv->elem_type, kv->data, i, &d, &n);
    return n;
}
