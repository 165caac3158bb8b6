/* safetensors.c - strict zero-copy safetensors reader, model-directory sets, and a writer.
 *
 * A file is mapped read-only and its JSON header parsed with cJSON into lmx_st_tensor records;
 * names and metadata are copied into one string pool and the cJSON tree is freed.  Lookup by
 * name uses an open-addressing (linear probing, FNV-1a) table of record indices, shared by
 * files, sets and the writer's duplicate check. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "../base/fileio.h"

#define ST_MAX_HEADER ((uint64_t)100 * 1024 * 1024)
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers are not exact doubles */
#define ST_INDEX_NAME "model.safetensors.index.json"

/* Record an error in err and leave through the function's `done:` label with st set. */
#define GOTO_ERR(code, ...)                          \
    do {                                             \
        st = lmx_err_set(err, (code), __VA_ARGS__);  \
        goto done;                                   \
    } while (0)

/* ---- name index ----------------------------------------------------------------------------- */

/* Records are structs whose first member is `const char *name`, stride bytes apart. */
typedef struct st_hash {
    const void *base;
    size_t stride;
    size_t cap;     /* a power of two, at least twice the record count */
    size_t *slots;  /* record index + 1; 0 marks an empty slot */
} st_hash;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 14695981039346656037ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static const char *rec_name(const st_hash *h, size_t i) {
    return *(const char *const *)((const char *)h->base + i * h->stride);
}

static int hash_init(st_hash *h, const void *base, size_t stride, size_t n) {
    size_t cap = 8;
    while (cap < 2 * n) cap *= 2;
    h->base = base;
    h->stride = stride;
    h->slots = calloc(cap, sizeof *h->slots);
    h->cap = h->slots ? cap : 0;
    return h->slots ? 0 : -1;
}

static void hash_free(st_hash *h) {
    free(h->slots);
    h->slots = NULL;
    h->cap = 0;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t *hash_slot(const st_hash *h, const char *name) {
    size_t mask = h->cap - 1, i = (size_t)fnv1a(name) & mask;
    while (h->slots[i] && strcmp(rec_name(h, h->slots[i] - 1), name) != 0) i = (i + 1) & mask;
    return &h->slots[i];
}

/* Index of the record named name, or SIZE_MAX. */
static size_t hash_find(const st_hash *h, const char *name) {
    if (!h->cap || !name) return SIZE_MAX;
    size_t v = *hash_slot(h, name);
    return v ? v - 1 : SIZE_MAX;
}

/* Add record idx; returns SIZE_MAX, or the index of an earlier record of the same name. */
static size_t hash_insert(st_hash *h, size_t idx) {
    size_t *slot = hash_slot(h, rec_name(h, idx));
    if (*slot) return *slot - 1;
    *slot = idx + 1;
    return SIZE_MAX;
}

/* ---- one file ------------------------------------------------------------------------------ */

struct lmx_st_file {
    char *path;
    lmx_mmap map;
    lmx_st_tensor *tensors;  /* header order */
    size_t n;
    char *pool;              /* tensor names, metadata keys and values */
    const char **meta;       /* key, value, key, value, ... (2 * n_meta) */
    size_t n_meta;
    st_hash index;
};

typedef struct st_range {
    uint64_t begin, end;
    size_t idx;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    return (x->begin > y->begin) - (x->begin < y->begin);
}

/* NULL when j is a non-negative integer that a double holds exactly (stored in *out), else why. */
static const char *json_uint(const cJSON *j, int64_t *out) {
    if (!cJSON_IsNumber(j)) return "is not a number";
    double v = j->valuedouble;
    if (v < 0) return "is negative";
    if (!(v <= ST_MAX_EXACT)) return "is too large";
    if ((double)(int64_t)v != v) return "is not an integer";
    *out = (int64_t)v;
    return NULL;
}

static char *pool_add(char **w, const char *s) {
    size_t n = strlen(s) + 1;
    char *p = *w;
    memcpy(p, s, n);
    *w += n;
    return p;
}

/* "<path>: tensor "<name>": <detail>" in err (the name quoted with LMX_QUOTED); returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 5, 6)))
#endif
static lmx_status tensor_err(lmx_err *err, lmx_status code, const char *path, const char *name,
                             const char *fmt, ...) {
    char detail[LMX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    return lmx_err_set(err, code, "%s: tensor %s: %.300s", path, LMX_QUOTED(name), detail);
}

/* Fill t (name already set) from its header entry e; range gets its data offsets. */
static lmx_status parse_entry(const char *path, const cJSON *e, lmx_st_tensor *t,
                              const unsigned char *data, size_t data_size, st_range *range,
                              lmx_err *err) {
    const char *nm = t->name, *keys[3] = {"dtype", "shape", "data_offsets"}, *why;
    if (!cJSON_IsObject(e)) return tensor_err(err, LMX_ERR_FORMAT, path, nm, "not an object");
    const cJSON *v[3];
    for (int i = 0; i < 3; i++)
        if (!(v[i] = cJSON_GetObjectItemCaseSensitive(e, keys[i])))
            return tensor_err(err, LMX_ERR_FORMAT, path, nm, "no \"%s\"", keys[i]);
    const cJSON *dt = v[0], *sh = v[1], *off = v[2];
    if (!cJSON_IsString(dt)) return tensor_err(err, LMX_ERR_FORMAT, path, nm, "dtype not a string");
    if (lmx_dtype_from_safetensors(dt->valuestring, &t->dtype) != 0)
        return tensor_err(err, LMX_ERR_UNSUPPORTED, path, nm, "unsupported dtype %s", LMX_QUOTED(dt->valuestring));
    if (!cJSON_IsArray(sh)) return tensor_err(err, LMX_ERR_FORMAT, path, nm, "shape not an array");
    int nd = cJSON_GetArraySize(sh), k = 0;
    if (nd > LMX_ST_MAX_DIMS)
        return tensor_err(err, LMX_ERR_UNSUPPORTED, path, nm, "%d dimensions (at most %d)", nd,
                          LMX_ST_MAX_DIMS);
    int64_t nel = 1, es = (int64_t)lmx_dtype_size(t->dtype), be[2] = {0, 0};
    for (const cJSON *d = sh->child; d; d = d->next, k++) {
        if ((why = json_uint(d, &t->shape[k])))
            return tensor_err(err, LMX_ERR_FORMAT, path, nm, "shape[%d] %s", k, why);
        if (t->shape[k] != 0 && nel > INT64_MAX / t->shape[k])
            return tensor_err(err, LMX_ERR_FORMAT, path, nm, "shape overflows");
        nel *= t->shape[k];
    }
    t->ndim = nd;
    t->n_elements = nel;
    if (nel > INT64_MAX / es) return tensor_err(err, LMX_ERR_FORMAT, path, nm, "size overflows");
    long long nbytes = nel * es;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2)
        return tensor_err(err, LMX_ERR_FORMAT, path, nm, "data_offsets is not [begin, end]");
    for (int i = 0; i < 2; i++)
        if ((why = json_uint(cJSON_GetArrayItem(off, i), &be[i])))
            return tensor_err(err, LMX_ERR_FORMAT, path, nm, "data_offsets[%d] %s", i, why);
    long long b = be[0], en = be[1];
    if (en < b)
        return tensor_err(err, LMX_ERR_FORMAT, path, nm, "data_offsets [%lld, %lld]: end < begin",
                          b, en);
    if (en - b != nbytes)
        return tensor_err(err, LMX_ERR_FORMAT, path, nm,
                          "data_offsets [%lld, %lld] hold %lld bytes, but %lld %s elements "
                          "need %lld", b, en, en - b, (long long)nel, lmx_dtype_name(t->dtype),
                          nbytes);
    if ((uint64_t)en > (uint64_t)data_size)
        return tensor_err(err, LMX_ERR_FORMAT, path, nm,
                          "data_offsets [%lld, %lld] run past the data section (%zu bytes; "
                          "file truncated?)", b, en, data_size);
    t->data = data + b;
    t->nbytes = (size_t)nbytes;
    range->begin = (uint64_t)b;
    range->end = (uint64_t)en;
    return LMX_OK;
}

/* Build f's records from the parsed header root. */
static lmx_status st_build(lmx_st_file *f, const cJSON *root, const unsigned char *data,
                           size_t data_size, lmx_err *err) {
    const char *path = f->path;
    if (!cJSON_IsObject(root))
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: header is not a JSON object", path);
    size_t n = 0, n_meta = 0, pool = 0;
    const cJSON *meta = NULL;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") != 0) {
            n++;
            pool += strlen(c->string) + 1;
            continue;
        }
        if (meta || !(cJSON_IsObject(c) || cJSON_IsNull(c)))
            return lmx_err_set(err, LMX_ERR_FORMAT, "%s: bad or repeated __metadata__", path);
        meta = c; /* null (as mlx writes it when there is none): no metadata */
        for (const cJSON *m = c->child; m; m = m->next) {
            if (!cJSON_IsString(m))
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: __metadata__ entry %s not a string",
                                   path, LMX_QUOTED(m->string));
            n_meta++;
            pool += strlen(m->string) + strlen(m->valuestring) + 2;
        }
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    f->meta = calloc(n_meta ? 2 * n_meta : 1, sizeof *f->meta);
    f->pool = malloc(pool ? pool : 1);
    st_range *ranges = calloc(n ? n : 1, sizeof *ranges);
    lmx_status st = LMX_OK;
    if (!f->tensors || !f->meta || !f->pool || !ranges ||
        hash_init(&f->index, f->tensors, sizeof *f->tensors, n) != 0)
        GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory for %zu tensors", path, n);
    char *w = f->pool;
    for (const cJSON *m = meta ? meta->child : NULL; m; m = m->next, f->n_meta++) {
        f->meta[2 * f->n_meta] = pool_add(&w, m->string);
        f->meta[2 * f->n_meta + 1] = pool_add(&w, m->valuestring);
    }
    for (const cJSON *c = root->child; c; c = c->next) {
        if (c == meta) continue;
        lmx_st_tensor *t = &f->tensors[f->n];
        t->name = pool_add(&w, c->string);
        t->file = f->path;
        st = parse_entry(path, c, t, data, data_size, &ranges[f->n], err);
        if (st != LMX_OK) goto done;
        ranges[f->n].idx = f->n;
        if (hash_insert(&f->index, f->n) != SIZE_MAX)
            GOTO_ERR(LMX_ERR_FORMAT, "%s: tensor %s appears twice in the header", path, LMX_QUOTED(t->name));
        f->n++;
    }
    /* Sorted by begin, each non-empty range must start at or after the furthest end so far. */
    qsort(ranges, n, sizeof *ranges, cmp_range);
    const st_range *far = NULL;
    for (const st_range *r = ranges; r < ranges + n; r++) {
        if (r->begin == r->end) continue;
        if (far && r->begin < far->end)
            GOTO_ERR(LMX_ERR_FORMAT, "%s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap",
                     path, LMX_QUOTED(f->tensors[far->idx].name), (unsigned long long)far->begin,
                     (unsigned long long)far->end, LMX_QUOTED(f->tensors[r->idx].name),
                     (unsigned long long)r->begin, (unsigned long long)r->end);
        if (!far || r->end > far->end) far = r;
    }
done:
    free(ranges);
    return st;
}

static lmx_status st_parse(lmx_st_file *f, lmx_err *err) {
    const char *path = f->path;
    const unsigned char *base = f->map.data;
    size_t size = f->map.size;
    if (size < 8)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: %zu bytes, too short", path, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > ST_MAX_HEADER)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: header length %llu is absurd (over 100 MB)",
                           path, (unsigned long long)hlen);
    if (hlen > size - 8)
        return lmx_err_set(err, LMX_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu B)",
                           path, (unsigned long long)hlen, size);
    /* cJSON gets a NUL-terminated copy so that no parse can read past the header. */
    char *text = malloc((size_t)hlen + 1);
    if (!text) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory for the header", path);
    memcpy(text, base + 8, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL, *p;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)hlen, &end, 0);
    lmx_status st = LMX_OK;
    if (!root)
        GOTO_ERR(LMX_ERR_FORMAT, "%s: header is not valid JSON (near byte %zu)", path,
                 end ? (size_t)(end - text) : (size_t)0);
    for (p = end; p < text + hlen && strchr(" \t\r\n", *p) && *p; p++) {}
    if (p < text + hlen)
        GOTO_ERR(LMX_ERR_FORMAT, "%s: unexpected bytes after the header JSON (byte %zu of %llu)",
                 path, (size_t)(p - text), (unsigned long long)hlen);
    st = st_build(f, root, base + 8 + hlen, size - 8 - (size_t)hlen, err);
done:
    free(text);
    cJSON_Delete(root);
    return st;
}

lmx_status lmx_st_open(const char *path, lmx_st_file **out, lmx_err *err) {
    lmx_err local;
    if (!err) err = &local;
    if (out) *out = NULL;
    if (!out || !path) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_st_open: NULL argument");
    lmx_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    }
    lmx_status s = lmx_mmap_open(path, &f->map, err);
    if (s == LMX_OK) s = st_parse(f, err);
    if (s != LMX_OK) {
        lmx_st_close(f);
        return s;
    }
    *out = f;
    return LMX_OK;
}

void lmx_st_close(lmx_st_file *f) {
    if (!f) return;
    hash_free(&f->index);
    free(f->tensors);
    free(f->meta);
    free(f->pool);
    lmx_mmap_close(&f->map);
    free(f->path);
    free(f);
}

size_t lmx_st_count(const lmx_st_file *f) { return f ? f->n : 0; }

const lmx_st_tensor *lmx_st_at(const lmx_st_file *f, size_t i) {
    return f && i < f->n ? &f->tensors[i] : NULL;
}

const lmx_st_tensor *lmx_st_find(const lmx_st_file *f, const char *name) {
    if (!f) return NULL;
    size_t i = hash_find(&f->index, name);
    return i == SIZE_MAX ? NULL : &f->tensors[i];
}

const char *lmx_st_metadata(const lmx_st_file *f, const char *key) {
    if (!f || !key) return NULL;
    for (size_t i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

/* ---- sets ---------------------------------------------------------------------------------- */

struct lmx_st_set {
    lmx_st_file **files;
    size_t n_files;
    lmx_st_tensor *tensors;  /* copies of the files' records, file by file */
    size_t n;
    size_t total_bytes;
    st_hash index;
};

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Gather the records of s->files; where names the set in messages. */
static lmx_status set_build(lmx_st_set *s, const char *where, lmx_err *err) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_files; i++) n += s->files[i]->n;
    s->tensors = calloc(n ? n : 1, sizeof *s->tensors);
    if (!s->tensors || hash_init(&s->index, s->tensors, sizeof *s->tensors, n) != 0)
        return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory for %zu tensors", where, n);
    for (size_t i = 0; i < s->n_files; i++) {
        for (size_t j = 0; j < s->files[i]->n; j++, s->n++) {
            const lmx_st_tensor *t = &s->tensors[s->n];
            s->tensors[s->n] = s->files[i]->tensors[j];
            size_t dup = hash_insert(&s->index, s->n);
            if (dup != SIZE_MAX)
                return lmx_err_set(err, LMX_ERR_FORMAT, "%s: tensor %s is in both %s and %s",
                                   where, LMX_QUOTED(t->name), s->tensors[dup].file, t->file);
            s->total_bytes += t->nbytes;
        }
    }
    return LMX_OK;
}

/* Open dir/name as the next file of s (whose files array has room). */
static lmx_status set_add_file(lmx_st_set *s, const char *dir, const char *name, lmx_err *err) {
    char *path = lmx_path_join(dir, name);
    if (!path) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", dir);
    lmx_status st = lmx_st_open(path, &s->files[s->n_files], err);
    free(path);
    if (st == LMX_OK) s->n_files++;
    return st;
}

/* 1 when dir/name is a regular file, 0 when not, -1 when out of memory. */
static int file_in(const char *dir, const char *name) {
    char *path = lmx_path_join(dir, name);
    if (!path) return -1;
    int ok = lmx_is_file(path);
    free(path);
    return ok;
}

/* file_in() for names of weight files; 0 for others. */
static int is_weight_file(const char *dir, const char *name) {
    static const char ext[] = ".safetensors";
    size_t n = strlen(name), k = sizeof ext - 1;
    if (name[0] == '.' || n <= k || strcmp(name + n - k, ext) != 0) return 0;
    if (!strcmp(name, "reference.safetensors") || !strcmp(name, "adapter_model.safetensors") ||
        !strcmp(name, "adapters.safetensors"))
        return 0;
    return file_in(dir, name);
}

/* Every weight *.safetensors file of dir, sorted by name. */
static lmx_status open_listed(lmx_st_set *s, const char *dir, lmx_err *err) {
    DIR *d = opendir(dir);
    if (!d) return lmx_err_set(err, LMX_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    lmx_status st = LMX_OK;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e && errno) GOTO_ERR(LMX_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
        if (!e) break;
        int weight = is_weight_file(dir, e->d_name);
        if (weight < 0) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", dir);
        if (!weight) continue;
        if (n == cap) {
            char **nn = realloc(names, (cap = cap ? 2 * cap : 16) * sizeof *names);
            if (!nn) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", dir);
            names = nn;
        }
        if (!(names[n] = strdup(e->d_name))) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", dir);
        n++;
    }
    if (n == 0) GOTO_ERR(LMX_ERR_MISSING, "no *.safetensors file in %s", dir);
    qsort(names, n, sizeof *names, cmp_str);
    if (!(s->files = calloc(n, sizeof *s->files)))
        GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", dir);
    for (size_t i = 0; st == LMX_OK && i < n; i++) st = set_add_file(s, dir, names[i], err);
done:
    closedir(d);
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    return st;
}

/* The shards named by the index's weight_map; each listed tensor must be in its shard. */
static lmx_status open_indexed(lmx_st_set *s, const char *dir, const char *ipath, lmx_err *err) {
    char *text = NULL;
    size_t len = 0, n = 0, n_shards = 0;
    lmx_status st = lmx_read_file(ipath, &text, &len, err);
    if (st != LMX_OK) return st;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const char **shards = NULL;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!root) GOTO_ERR(LMX_ERR_FORMAT, "%s: not valid JSON", ipath);
    if (!cJSON_IsObject(wm)) GOTO_ERR(LMX_ERR_FORMAT, "%s: no \"weight_map\" object", ipath);
    for (const cJSON *c = wm->child; c; c = c->next) n++;
    if (n == 0) GOTO_ERR(LMX_ERR_MISSING, "%s: weight_map lists no tensor", ipath);
    if (!(shards = malloc(n * sizeof *shards))) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", ipath);
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char *sh = cJSON_IsString(c) ? c->valuestring : "(not a string)";
        if (!cJSON_IsString(c) || !sh[0] || strchr(sh, '/') || strstr(sh, ".."))
            GOTO_ERR(LMX_ERR_FORMAT, "%s: tensor %s: shard %s is not a plain file name", ipath,
                     LMX_QUOTED(c->string), LMX_QUOTED(sh));
        shards[n_shards++] = sh;
    }
    qsort(shards, n_shards, sizeof *shards, cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < n_shards; i++)
        if (u == 0 || strcmp(shards[u - 1], shards[i]) != 0) shards[u++] = shards[i];
    n_shards = u;
    if (!(s->files = calloc(n_shards, sizeof *s->files)))
        GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", ipath);
    for (size_t i = 0; i < n_shards; i++) {
        int present = file_in(dir, shards[i]);
        if (present < 0) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", ipath);
        if (!present)
            GOTO_ERR(LMX_ERR_MISSING, "%s: shard %s is missing from %s", ipath, LMX_QUOTED(shards[i]), dir);
        if ((st = set_add_file(s, dir, shards[i], err)) != LMX_OK) goto done;
    }
    for (const cJSON *c = wm->child; c; c = c->next) {
        const char **k = bsearch(&c->valuestring, shards, n_shards, sizeof *shards, cmp_str);
        if (!k || !lmx_st_find(s->files[k - shards], c->string))
            GOTO_ERR(LMX_ERR_MISSING, "%s: tensor %s is not in its shard %s", ipath, LMX_QUOTED(c->string),
                     LMX_QUOTED(c->valuestring));
    }
done:
    free(shards);
    cJSON_Delete(root);
    return st;
}

/* Finish opening s after its files were opened with status st. */
static lmx_status set_finish(lmx_st_set *s, lmx_status st, const char *where, lmx_st_set **out,
                             lmx_err *err) {
    if (st == LMX_OK) st = set_build(s, where, err);
    if (st != LMX_OK) lmx_st_set_close(s);
    else *out = s;
    return st;
}

lmx_status lmx_st_set_open_dir(const char *dir, lmx_st_set **out, lmx_err *err) {
    lmx_err local;
    if (!err) err = &local;
    if (out) *out = NULL;
    if (!out || !dir) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_st_set_open_dir: NULL");
    lmx_st_set *s = calloc(1, sizeof *s);
    char *index_path = lmx_path_join(dir, ST_INDEX_NAME);
    lmx_status st;
    if (!s || !index_path)
        st = lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", dir);
    else if (lmx_is_file(index_path))
        st = open_indexed(s, dir, index_path, err);
    else
        st = open_listed(s, dir, err);
    free(index_path);
    return set_finish(s, st, dir, out, err);
}

lmx_status lmx_st_set_open_file(const char *path, lmx_st_set **out, lmx_err *err) {
    lmx_err local;
    if (!err) err = &local;
    if (out) *out = NULL;
    if (!out || !path) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_st_set_open_file: NULL");
    lmx_st_set *s = calloc(1, sizeof *s);
    lmx_status st = LMX_OK;
    if (!s || !(s->files = calloc(1, sizeof *s->files)))
        st = lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    else if ((st = lmx_st_open(path, &s->files[0], err)) == LMX_OK)
        s->n_files = 1;
    return set_finish(s, st, path, out, err);
}

void lmx_st_set_close(lmx_st_set *s) {
    if (!s) return;
    for (size_t i = 0; i < s->n_files; i++) lmx_st_close(s->files[i]);
    free(s->files);
    free(s->tensors);
    hash_free(&s->index);
    free(s);
}

size_t lmx_st_set_count(const lmx_st_set *s) { return s ? s->n : 0; }

const lmx_st_tensor *lmx_st_set_at(const lmx_st_set *s, size_t i) {
    return s && i < s->n ? &s->tensors[i] : NULL;
}

const lmx_st_tensor *lmx_st_set_find(const lmx_st_set *s, const char *name) {
    if (!s) return NULL;
    size_t i = hash_find(&s->index, name);
    return i == SIZE_MAX ? NULL : &s->tensors[i];
}

size_t lmx_st_set_total_bytes(const lmx_st_set *s) { return s ? s->total_bytes : 0; }

/* ---- writer -------------------------------------------------------------------------------- */

/* s as a JSON string literal (UTF-8 passes through; quotes, backslashes and controls escaped). */
static void put_json_str(FILE *ms, const char *s) {
    fputc('"', ms);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(ms, "\\%c", c);
        else if (c < 0x20) fprintf(ms, "\\u%04x", c);
        else fputc(c, ms);
    }
    fputc('"', ms);
}

/* Byte size of a valid item, or -1. */
static int64_t item_bytes(const lmx_st_write_item *it) {
    int64_t nb = (int64_t)lmx_dtype_size(it->dtype);
    if (!it->name || !strcmp(it->name, "__metadata__") || nb == 0 || it->ndim < 0 ||
        it->ndim > LMX_ST_MAX_DIMS)
        return -1;
    for (int d = 0; d < it->ndim; d++) {
        int64_t dim = it->shape[d];
        if (dim < 0 || (dim != 0 && nb > INT64_MAX / dim)) return -1;
        nb *= dim;
    }
    return nb > 0 && !it->data ? -1 : nb;
}

/* The "__metadata__" entry of meta [n_meta] (validated here: keys distinct through the tensor names'
 * hash), or nothing when n_meta is 0. */
static lmx_status put_meta(FILE *ms, const char *path, const lmx_st_meta *meta, size_t n_meta, lmx_err *err) {
    if (!n_meta) return LMX_OK;
    if (!meta) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "%s: NULL metadata", path);
    st_hash seen = {0};
    if (hash_init(&seen, meta, sizeof *meta, n_meta) != 0) return lmx_err_set(err, LMX_ERR_NOMEM, "%s: out of memory", path);
    lmx_status st = LMX_OK;
    fputs("\"__metadata__\":{", ms);
    for (size_t i = 0; i < n_meta && !st; i++) {
        if (!meta[i].key || !meta[i].value || hash_insert(&seen, i) != SIZE_MAX) {
            st = lmx_err_set(err, LMX_ERR_INVALID_ARG, "%s: metadata entry %s: NULL key or value, or given twice", path,
                             meta[i].key ? LMX_QUOTED(meta[i].key) : "(null)");
            break;
        }
        if (i) fputc(',', ms);
        put_json_str(ms, meta[i].key);
        fputc(':', ms);
        put_json_str(ms, meta[i].value);
    }
    fputc('}', ms);
    hash_free(&seen);
    return st;
}

/* The header JSON for items and meta (validated here), padded with spaces to a multiple of 8 bytes, in a
 * malloc'ed *hdr of *hlen bytes. */
static lmx_status build_header(const char *path, const lmx_st_write_item *items, size_t n, const lmx_st_meta *meta,
                               size_t n_meta, char **hdr, size_t *hlen, lmx_err *err) {
    st_hash seen = {0};
    lmx_status st = LMX_OK;
    FILE *ms = open_memstream(hdr, hlen);
    if (!ms || hash_init(&seen, items, sizeof *items, n) != 0)
        GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", path);
    int64_t off = 0;
    fputc('{', ms);
    if ((st = put_meta(ms, path, meta, n_meta, err))) goto done;
    for (size_t i = 0; i < n; i++) {
        const lmx_st_write_item *it = &items[i];
        int64_t nb = item_bytes(it);
        if (nb < 0 || nb > (int64_t)ST_MAX_EXACT - off || hash_insert(&seen, i) != SIZE_MAX)
            GOTO_ERR(LMX_ERR_INVALID_ARG, "%s: tensor %s: bad name, dtype, shape or data, or "
                     "given twice", path, it->name ? LMX_QUOTED(it->name) : "(null)");
        char dt[8] = {0};  /* "bf16" -> "BF16" */
        const char *lower = lmx_dtype_name(it->dtype);
        for (size_t k = 0; k < sizeof dt - 1 && lower[k]; k++)
            dt[k] = lower[k] >= 'a' && lower[k] <= 'z' ? (char)(lower[k] - 'a' + 'A') : lower[k];
        if (i || n_meta) fputc(',', ms);
        put_json_str(ms, it->name);
        fprintf(ms, ":{\"dtype\":\"%s\",\"shape\":[", dt);
        for (int d = 0; d < it->ndim; d++)
            fprintf(ms, "%s%lld", d ? "," : "", (long long)it->shape[d]);
        fprintf(ms, "],\"data_offsets\":[%lld,%lld]}", (long long)off, (long long)(off + nb));
        off += nb;
    }
    fputc('}', ms);
    for (long pos = ftell(ms); pos >= 0 && pos % 8; pos++) fputc(' ', ms);
    int bad = ferror(ms) || ftell(ms) % 8;
    int closed = fclose(ms);
    ms = NULL;
    if (bad || closed != 0) GOTO_ERR(LMX_ERR_NOMEM, "%s: out of memory", path);
done:
    if (ms) fclose(ms);
    hash_free(&seen);
    return st;
}

lmx_status lmx_st_write(const char *path, const lmx_st_write_item *items, size_t n, lmx_err *err) {
    return lmx_st_write_meta(path, items, n, NULL, 0, err);
}

lmx_status lmx_st_write_meta(const char *path, const lmx_st_write_item *items, size_t n, const lmx_st_meta *meta,
                             size_t n_meta, lmx_err *err) {
    lmx_err local;
    if (!err) err = &local;
    if (!path || (n && !items))
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "lmx_st_write: NULL path or items");
    char *hdr = NULL;
    size_t hlen = 0;
    lmx_status st = build_header(path, items, n, meta, n_meta, &hdr, &hlen, err);
    FILE *fp = st == LMX_OK ? fopen(path, "wb") : NULL;
    if (st == LMX_OK && !fp) GOTO_ERR(LMX_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    if (st != LMX_OK) goto done;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = 0; ok && i < n; i++) {
        size_t nb = (size_t)item_bytes(&items[i]);
        ok = nb == 0 || fwrite(items[i].data, 1, nb, fp) == nb;
    }
    int e = ok ? 0 : errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (!ok) {
        unlink(path);
        GOTO_ERR(LMX_ERR_IO, "%s: write failed: %s", path, strerror(e));
    }
done:
    free(hdr);
    return st;
}
