/* quantize.c - MLX-layout affine quantization of a model directory (see quantize.h). */
#include "quantize.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../base/fileio.h"
#include "../base/half.h"
#include "safetensors.h"

void lmx_quantize_row(const float *w, int64_t K, int bits, int group, uint32_t *packed,
                      uint16_t *scales, uint16_t *biases) {
    int per = 32 / bits;
    float levels = (float)((1u << bits) - 1u);
    memset(packed, 0, (size_t)(K / per) * sizeof *packed);
    for (int64_t g = 0; g < K / group; g++) {
        const float *x = w + g * group;
        float lo = x[0], hi = x[0];
        for (int i = 1; i < group; i++) {
            if (x[i] < lo) lo = x[i];
            if (x[i] > hi) hi = x[i];
        }
        scales[g] = lmx_f32_to_bf16((hi - lo) / levels);
        biases[g] = lmx_f32_to_bf16(lo);
        float s = lmx_bf16_to_f32(scales[g]), b = lmx_bf16_to_f32(biases[g]);
        for (int i = 0; i < group; i++) {
            float q = s > 0 ? rintf((x[i] - b) / s) : 0;
            q = q < 0 ? 0 : q > levels ? levels : q;
            int64_t k = g * group + i;
            packed[k / per] |= (uint32_t)q << ((k % per) * bits);
        }
    }
}

/* The roles MLX quantizes: projections, the embedding table and the output head. */
static int is_quantizable(const lmx_st_tensor *t, int group) {
    const char *n = t->name;
    size_t len = strlen(n);
    int role = (len > 12 && strcmp(n + len - 12, "_proj.weight") == 0) ||
               strstr(n, "embed_tokens.weight") || strstr(n, "lm_head.weight");
    int fp = t->dtype == LMX_DTYPE_F32 || t->dtype == LMX_DTYPE_F16 || t->dtype == LMX_DTYPE_BF16;
    return role && fp && t->ndim == 2 && t->shape[1] % group == 0;
}

static lmx_status copy_file(const char *from, const char *to, lmx_err *err) {
    char *buf = NULL;
    size_t n = 0;
    lmx_status st = lmx_read_file(from, &buf, &n, err);
    if (st == LMX_OK) st = lmx_write_file(to, buf, n, err);
    free(buf);
    return st;
}

/* config.json with "quantization" (and HF's "quantization_config") added. */
static lmx_status write_config(const char *src, const char *dst, int bits, int group, lmx_err *err) {
    char *in = lmx_path_join(src, "config.json"), *out = lmx_path_join(dst, "config.json");
    char *text = NULL, *json = NULL;
    size_t n = 0;
    cJSON *root = NULL;
    lmx_status st = !in || !out ? lmx_err_set(err, LMX_ERR_NOMEM, "out of memory") : lmx_read_file(in, &text, &n, err);
    if (st) goto done;
    root = cJSON_Parse(text);
    if (!cJSON_IsObject(root)) {
        st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: not a JSON object", in);
        goto done;
    }
    const char *keys[2] = {"quantization", "quantization_config"};
    for (int i = 0; i < 2; i++) {
        cJSON *q = cJSON_CreateObject();
        cJSON_AddNumberToObject(q, "group_size", group);
        cJSON_AddNumberToObject(q, "bits", bits);
        cJSON_DeleteItemFromObjectCaseSensitive(root, keys[i]);
        cJSON_AddItemToObject(root, keys[i], q);
    }
    json = cJSON_Print(root);
    st = json ? lmx_write_file(out, json, strlen(json), err) : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
done:
    cJSON_Delete(root);
    free(json);
    free(text);
    free(in);
    free(out);
    return st;
}

/* Copy the directory's other files: everything but weights, the shard index and config.json. */
static lmx_status copy_side_files(const char *src, const char *dst, lmx_err *err) {
    DIR *d = opendir(src);
    if (!d) return lmx_err_set(err, LMX_ERR_IO, "%s: %s", src, strerror(errno));
    lmx_status st = LMX_OK;
    struct dirent *e;
    while (st == LMX_OK && (e = readdir(d))) {
        const char *n = e->d_name;
        size_t len = strlen(n);
        if (n[0] == '.' || strcmp(n, "config.json") == 0 || strcmp(n, "model.safetensors.index.json") == 0 ||
            (len > 12 && strcmp(n + len - 12, ".safetensors") == 0))
            continue;
        char *from = lmx_path_join(src, n), *to = lmx_path_join(dst, n);
        if (!from || !to) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        else if (lmx_is_file(from)) st = copy_file(from, to, err);
        free(from);
        free(to);
    }
    closedir(d);
    return st;
}

lmx_status lmx_quantize_dir(const char *src, const char *dst, int bits, int group, lmx_err *err) {
    if (bits != 2 && bits != 4 && bits != 8)
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "quantize: bits must be 2, 4 or 8 (not %d)", bits);
    if (group != 32 && group != 64 && group != 128)
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "quantize: group size must be 32, 64 or 128 (not %d)", group);
    if (mkdir(dst, 0755) != 0) {
        if (errno != EEXIST) return lmx_err_set(err, LMX_ERR_IO, "%s: cannot create: %s", dst, strerror(errno));
        DIR *d = opendir(dst); /* an existing destination must be empty: no stale shards */
        struct dirent *e;
        int empty = d != NULL;
        while (d && (e = readdir(d)))
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
        if (d) closedir(d);
        if (!empty) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "%s: destination exists and is not an empty directory", dst);
    }
    lmx_st_set *in = NULL;
    lmx_status st = lmx_st_set_open_dir(src, &in, err);
    if (st) return st;
    size_t n = lmx_st_set_count(in);
    lmx_st_write_item *items = calloc(3 * n + 1, sizeof *items);
    char **names = calloc(2 * n + 1, sizeof *names);
    void **bufs = calloc(3 * n + 1, sizeof *bufs);
    size_t ni = 0, nn = 0, nb = 0;
    float *row = NULL;
    if (!items || !names || !bufs) {
        st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n && st == LMX_OK; i++) {
        const lmx_st_tensor *t = lmx_st_set_at(in, i);
        if (!is_quantizable(t, group)) {
            lmx_st_write_item it = {.name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data};
            memcpy(it.shape, t->shape, sizeof it.shape);
            items[ni++] = it;
            continue;
        }
        int64_t N = t->shape[0], K = t->shape[1], W = K * bits / 32, G = K / group;
        uint32_t *packed = malloc((size_t)(N * W) * 4);
        uint16_t *sc = malloc((size_t)(N * G) * 2), *bi = malloc((size_t)(N * G) * 2);
        float *r = realloc(row, (size_t)K * sizeof *row);
        bufs[nb++] = packed;
        bufs[nb++] = sc;
        bufs[nb++] = bi;
        if (r) row = r;
        size_t base_len = strlen(t->name) - strlen(".weight");
        char *sname = malloc(base_len + 8), *bname = malloc(base_len + 8);
        names[nn++] = sname;
        names[nn++] = bname;
        if (!packed || !sc || !bi || !r || !sname || !bname) {
            st = lmx_err_set(err, LMX_ERR_NOMEM, "quantize: out of memory at %s", LMX_QUOTED(t->name));
            break;
        }
        snprintf(sname, base_len + 8, "%.*s.scales", (int)base_len, t->name);
        snprintf(bname, base_len + 8, "%.*s.biases", (int)base_len, t->name);
        for (int64_t r0 = 0; r0 < N; r0++) {
            for (int64_t k = 0; k < K; k++) row[k] = lmx_float_at(t->data, t->dtype, r0 * K + k);
            lmx_quantize_row(row, K, bits, group, packed + r0 * W, sc + r0 * G, bi + r0 * G);
        }
        items[ni++] = (lmx_st_write_item){.name = t->name, .dtype = LMX_DTYPE_U32, .ndim = 2, .shape = {N, W}, .data = packed};
        items[ni++] = (lmx_st_write_item){.name = sname, .dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {N, G}, .data = sc};
        items[ni++] = (lmx_st_write_item){.name = bname, .dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {N, G}, .data = bi};
    }
    if (st == LMX_OK) {
        char *out = lmx_path_join(dst, "model.safetensors");
        st = out ? lmx_st_write(out, items, ni, err) : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
        free(out);
    }
    if (st == LMX_OK) st = write_config(src, dst, bits, group, err);
    if (st == LMX_OK) st = copy_side_files(src, dst, err);
done:
    for (size_t i = 0; bufs && i < nb; i++) free(bufs[i]);
    for (size_t i = 0; names && i < nn; i++) free(names[i]);
    free(bufs);
    free(names);
    free(items);
    free(row);
    lmx_st_set_close(in);
    return st;
}
