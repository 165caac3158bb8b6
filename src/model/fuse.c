/* fuse.c - merge a LoRA adapter into a copy of a model directory (fuse.h).
 *
 * Three passes: check every adapter entry against the base (layer, tensor, shapes) before any
 * work; build the output tensor list in the base's order (merged or dequantized weights computed
 * into fresh buffers, everything else pointing into the base's mapping); then write the directory. */
#include "fuse.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../base/fileio.h"
#include "../base/half.h"
#include "../formats/gguf.h"
#include "../formats/lora_file.h"
#include "../formats/quantize.h"
#include "../formats/safetensors.h"
#include "config.h"

/* An MLX affine-quantized weight: packed U32 [N, K*bits/32], scales and biases [N, K/group]. */
typedef struct qweight {
    const lmx_st_tensor *w, *scales, *biases;
    int bits, group;
    int64_t N, K;
} qweight;

/* One adapter entry checked against the base: the weight it adapts and that weight's layout. */
typedef struct target {
    const lmx_lora_entry *e;
    const lmx_st_tensor *w;
    int quantized;
    qweight q;
    int64_t N, K;                    /* out, in */
} target;

typedef struct fuser {
    const char *base;
    lmx_st_set *set;
    char *config_text;               /* config.json as read */
    size_t config_len;
    cJSON *config;
    lmx_config cfg;
    lmx_lora_file lf;
    const char *prefix;              /* "model.", "language_model.model." or "model.language_model." */
    target *t;                       /* [lf.n] */
    int dequantize;
    int any_quantized;               /* the base holds MLX-quantized weights */
    lmx_st_write_item *items;        /* the output, in the base's order */
    size_t n_items;
    void **bufs;                     /* computed tensor data, freed at the end */
    size_t n_bufs;
    lmx_err *err;
} fuser;

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int is_float(lmx_dtype t) { return t == LMX_DTYPE_F32 || t == LMX_DTYPE_F16 || t == LMX_DTYPE_BF16; }

/* ---- the base's tensors ----------------------------------------------------------------------- */

/* "<weight name without .weight>.<role>" (role "scales", "biases"), or NULL. */
static const lmx_st_tensor *sibling(const fuser *f, const char *weight_name, const char *role) {
    char buf[1024];
    size_t len = strlen(weight_name);
    if (!lmx_ends_with(weight_name, ".weight") || len + strlen(role) >= sizeof buf) return NULL;
    memcpy(buf, weight_name, len - 6); /* keeps the '.' */
    memcpy(buf + len - 6, role, strlen(role) + 1);
    return lmx_st_set_find(f->set, buf);
}

static int is_quantized(const fuser *f, const lmx_st_tensor *t) {
    return t->dtype == LMX_DTYPE_U32 && sibling(f, t->name, "scales") && sibling(f, t->name, "biases");
}

/* Tensors of files that are no model weights (test references), which a plain directory's set
 * may hold beside the weights: never copied. */
static int is_foreign(const lmx_st_tensor *t) { return strstr(base_name(t->file), "reference") != NULL; }

/* The bits of a quantized weight: config.json "quantization" (or "quantization_config"), the
 * module's own entry first (mlx-lm's mixed quantization keys entries by module path). */
static int config_bits(const fuser *f, const char *name, int *bits) {
    static const char *const keys[2] = {"quantization", "quantization_config"};
    char mod[1024];
    snprintf(mod, sizeof mod, "%.*s", (int)(strlen(name) - 7), name);
    for (int i = 0; i < 2; i++) {
        const cJSON *q = cJSON_GetObjectItemCaseSensitive(f->config, keys[i]);
        if (!cJSON_IsObject(q)) continue;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(q, mod);
        const cJSON *b = cJSON_IsObject(m) ? cJSON_GetObjectItemCaseSensitive(m, "bits") : NULL;
        if (!cJSON_IsNumber(b)) b = cJSON_GetObjectItemCaseSensitive(q, "bits");
        if (cJSON_IsNumber(b)) {
            *bits = b->valueint; /* saturated by cJSON */
            return 1;
        }
    }
    return 0;
}

static lmx_status quant_layout(const fuser *f, const lmx_st_tensor *t, qweight *q) {
    memset(q, 0, sizeof *q);
    q->w = t;
    q->scales = sibling(f, t->name, "scales");
    q->biases = sibling(f, t->name, "biases");
    int bits;
    if (!config_bits(f, t->name, &bits))
        return lmx_err_set(f->err, LMX_ERR_MISSING, "%s/config.json: no \"quantization\" bits for the quantized tensor %s",
                           f->base, LMX_QUOTED(t->name));
    if (bits != 2 && bits != 4 && bits != 8)
        return lmx_err_set(f->err, LMX_ERR_UNSUPPORTED, "quantized tensor %s: %d-bit weights are not supported (2, 4, 8)",
                           LMX_QUOTED(t->name), bits);
    const lmx_st_tensor *s = q->scales, *b = q->biases;
    if (t->ndim != 2 || s->ndim != 2 || b->ndim != 2 || s->shape[0] != t->shape[0] || b->shape[0] != t->shape[0] ||
        s->shape[1] != b->shape[1] || s->shape[1] <= 0 || !is_float(s->dtype) || !is_float(b->dtype) ||
        (t->shape[1] * 32 / bits) % s->shape[1] != 0)
        return lmx_err_set(f->err, LMX_ERR_SHAPE, "scales/biases of quantized tensor %s in %s do not match it", LMX_QUOTED(t->name),
                           t->file);
    q->bits = bits;
    q->N = t->shape[0];
    q->K = t->shape[1] * 32 / bits;
    q->group = (int)(q->K / s->shape[1]);
    return LMX_OK;
}

/* Row n of a quantized weight as floats: w = q * scale + bias per group. */
static void dequant_row(const qweight *q, int64_t n, float *out) {
    int per = 32 / q->bits;
    uint32_t mask = (1u << q->bits) - 1u;
    int64_t W = q->K / per, G = q->K / q->group;
    const char *words = (const char *)q->w->data + 4 * n * W;
    for (int64_t g = 0; g < G; g++) {
        float s = lmx_float_at(q->scales->data, q->scales->dtype, n * G + g);
        float b = lmx_float_at(q->biases->data, q->biases->dtype, n * G + g);
        for (int64_t k = g * q->group; k < (g + 1) * q->group; k++) {
            uint32_t word;
            memcpy(&word, words + 4 * (k / per), 4);
            out[k] = (float)((word >> ((k % per) * q->bits)) & mask) * s + b;
        }
    }
}

/* ---- checking the adapter against the base -------------------------------------------------------- */

static lmx_status check_entry(fuser *f, const lmx_lora_entry *e, target *t) {
    const char *file = f->lf.weights_path;
    int nl = f->cfg.n_layers;
    t->e = e;
    if (e->layer >= nl)
        return lmx_err_set(f->err, LMX_ERR_SHAPE, "%s: tensor %s is for layer %d; the model has %d layers", file,
                           LMX_QUOTED(e->a->name), e->layer, nl);
    if (f->lf.num_layers > 0 && e->layer < nl - f->lf.num_layers)
        return lmx_err_set(f->err, LMX_ERR_FORMAT, "%s: tensor %s is for layer %d, outside the last num_layers = %d "
                           "of the model's %d", file, LMX_QUOTED(e->a->name), e->layer, f->lf.num_layers, nl);
    char name[512];
    snprintf(name, sizeof name, "%slayers.%d.%s.weight", f->prefix, e->layer, lmx_proj_module(e->proj));
    t->w = lmx_st_set_find(f->set, name);
    if (!t->w)
        return lmx_err_set(f->err, LMX_ERR_MISSING, "%s: tensor %s adapts %s, which the base does not have", file,
                           LMX_QUOTED(e->a->name), LMX_QUOTED(name));
    const lmx_st_tensor *w = t->w;
    if (is_quantized(f, w)) {
        lmx_status st = quant_layout(f, w, &t->q);
        if (st) return st;
        t->quantized = 1;
        t->N = t->q.N;
        t->K = t->q.K;
    } else if (is_float(w->dtype) && w->ndim == 2) {
        t->N = w->shape[0];
        t->K = w->shape[1];
    } else {
        return lmx_err_set(f->err, LMX_ERR_UNSUPPORTED, "tensor %s in %s is %s with %d dimensions: lmx merges into 2-D "
                           "f32, f16, bf16 or MLX-quantized weights", LMX_QUOTED(w->name), w->file, lmx_dtype_name(w->dtype), w->ndim);
    }
    int64_t aK = e->transposed ? e->a->shape[0] : e->a->shape[1];
    int64_t bN = e->transposed ? e->b->shape[1] : e->b->shape[0];
    if (aK != t->K || bN != t->N) {
        const lmx_st_tensor *bad = aK != t->K ? e->a : e->b;
        return lmx_err_set(f->err, LMX_ERR_SHAPE, "%s: tensor %s is [%lld, %lld]: it does not fit %s (%lld inputs, "
                           "%lld outputs)", file, LMX_QUOTED(bad->name), (long long)bad->shape[0], (long long)bad->shape[1], LMX_QUOTED(name),
                           (long long)t->K, (long long)t->N);
    }
    return LMX_OK;
}

static const target *target_of(const fuser *f, const lmx_st_tensor *w) {
    for (int i = 0; i < f->lf.n; i++)
        if (f->t[i].w == w) return &f->t[i];
    return NULL;
}

/* ---- computing the output --------------------------------------------------------------------------- */

static void *keep(fuser *f, size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p) f->bufs[f->n_bufs++] = p;
    return p;
}

/* Write weight w (merged with t's adapter when t != NULL, else a quantized weight dequantized):
 * a quantized base weight stays quantized (same bits and group) unless dequantizing; everything
 * else becomes bf16.  Appends one item, or three (weight, scales, biases). */
static lmx_status emit_weight(fuser *f, const lmx_st_tensor *w, const target *t) {
    qweight q = {0};
    int quant = is_quantized(f, w);
    lmx_status st = LMX_OK;
    if (t) q = t->q;
    else if (quant && (st = quant_layout(f, w, &q))) return st;
    int64_t N = quant ? q.N : w->shape[0], K = quant ? q.K : w->shape[1];
    int64_t r = t ? t->e->rank : 0;
    double scale = t ? t->e->scale : 0;
    int requant = quant && !f->dequantize;
    float *A = malloc((size_t)(r * K + 1) * sizeof *A), *B = malloc((size_t)(N * r + 1) * sizeof *B);
    float *row = malloc((size_t)K * sizeof *row);
    double *acc = malloc((size_t)K * sizeof *acc);
    int64_t W = requant ? K * q.bits / 32 : 0, G = requant ? K / q.group : 0;
    uint32_t *packed = requant ? keep(f, (size_t)(N * W) * 4) : NULL;
    uint16_t *sc = requant ? keep(f, (size_t)(N * G) * 2) : NULL, *bi = requant ? keep(f, (size_t)(N * G) * 2) : NULL;
    uint16_t *dense = requant ? NULL : keep(f, (size_t)(N * K) * 2);
    if (!A || !B || !row || !acc || (requant ? !packed || !sc || !bi : !dense)) {
        st = lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory merging %s", LMX_QUOTED(w->name));
        goto done;
    }
    if (t && (st = lmx_lora_widen(t->e, K, N, 0, A, B, f->err))) {
        lmx_err_prefix(f->err, "%s", f->lf.weights_path);
        goto done;
    }
    for (int64_t n = 0; n < N; n++) {
        if (quant) dequant_row(&q, n, row);
        else
            for (int64_t k = 0; k < K; k++) row[k] = lmx_float_at(w->data, w->dtype, n * K + k);
        if (r > 0) { /* row n of W + scale * B A, accumulated in float64 */
            memset(acc, 0, (size_t)K * sizeof *acc);
            for (int64_t i = 0; i < r; i++) {
                double b = B[n * r + i];
                const float *a = A + i * K;
                for (int64_t k = 0; k < K; k++) acc[k] += b * a[k];
            }
            for (int64_t k = 0; k < K; k++) row[k] = (float)((double)row[k] + scale * acc[k]);
        }
        if (requant) lmx_quantize_row(row, K, q.bits, q.group, packed + n * W, sc + n * G, bi + n * G);
        else
            for (int64_t k = 0; k < K; k++) dense[n * K + k] = lmx_f32_to_bf16(row[k]);
    }
    if (requant) {
        f->items[f->n_items++] = (lmx_st_write_item){.name = w->name, .dtype = LMX_DTYPE_U32, .ndim = 2, .shape = {N, W}, .data = packed};
        f->items[f->n_items++] = (lmx_st_write_item){.name = q.scales->name, .dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {N, G}, .data = sc};
        f->items[f->n_items++] = (lmx_st_write_item){.name = q.biases->name, .dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {N, G}, .data = bi};
    } else {
        f->items[f->n_items++] = (lmx_st_write_item){.name = w->name, .dtype = LMX_DTYPE_BF16, .ndim = 2, .shape = {N, K}, .data = dense};
    }
done:
    free(A);
    free(B);
    free(row);
    free(acc);
    return st;
}

/* The weight a ".scales" / ".biases" tensor belongs to, when that weight is quantized. */
static const lmx_st_tensor *quant_owner(const fuser *f, const lmx_st_tensor *t) {
    const char *n = t->name;
    if (!lmx_ends_with(n, ".scales") && !lmx_ends_with(n, ".biases")) return NULL;
    char buf[1024];
    snprintf(buf, sizeof buf, "%.*s.weight", (int)(strlen(n) - 7), n);
    const lmx_st_tensor *w = lmx_st_set_find(f->set, buf);
    return w && is_quantized(f, w) ? w : NULL;
}

static lmx_status build(fuser *f) {
    size_t n = lmx_st_set_count(f->set);
    f->items = calloc(n + 1, sizeof *f->items);
    f->bufs = calloc(3 * n + 1, sizeof *f->bufs);
    if (!f->items || !f->bufs) return lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *w = lmx_st_set_at(f->set, i);
        if (is_foreign(w)) continue;
        int quant = is_quantized(f, w);
        f->any_quantized |= quant;
        const target *t = target_of(f, w);
        if (t || (quant && f->dequantize)) {
            lmx_status st = emit_weight(f, w, t);
            if (st) return st;
            continue;
        }
        const lmx_st_tensor *owner = quant_owner(f, w);
        if (owner && (f->dequantize || target_of(f, owner))) continue; /* written with its weight */
        lmx_st_write_item it = {.name = w->name, .dtype = w->dtype, .ndim = w->ndim, .data = w->data};
        memcpy(it.shape, w->shape, sizeof it.shape);
        f->items[f->n_items++] = it;
    }
    return LMX_OK;
}

/* ---- the output directory ------------------------------------------------------------------------- */

/* The files fuse writes besides model.safetensors: config.json and these, where the base has them. */
static const char *const side_files[] = {"generation_config.json", "tokenizer.json", "tokenizer_config.json",
                                         "chat_template.jinja", "chat_template.json", "special_tokens_map.json",
                                         "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json"};
#define N_SIDE_FILES (sizeof side_files / sizeof side_files[0])

/* out must be absent or an empty directory; *absent says whether it must be made. */
static lmx_status check_out(const char *out, int *absent, lmx_err *err) {
    struct stat sb;
    *absent = stat(out, &sb) != 0;
    if (*absent) return LMX_OK;
    DIR *d = S_ISDIR(sb.st_mode) ? opendir(out) : NULL;
    int empty = d != NULL;
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) empty = 0;
    if (d) closedir(d);
    if (!empty) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "%s: the output exists and is not an empty directory", out);
    return LMX_OK;
}

/* config.json: as read, or without the quantization entries when every weight left dense. */
static lmx_status write_config(fuser *f, const char *path) {
    if (!(f->dequantize && f->any_quantized)) return lmx_write_file(path, f->config_text, f->config_len, f->err);
    cJSON *text = cJSON_GetObjectItemCaseSensitive(f->config, "text_config");
    static const char *const keys[2] = {"quantization", "quantization_config"};
    for (int i = 0; i < 2; i++) {
        cJSON_DeleteItemFromObjectCaseSensitive(f->config, keys[i]);
        if (cJSON_IsObject(text)) cJSON_DeleteItemFromObjectCaseSensitive(text, keys[i]);
    }
    char *json = cJSON_Print(f->config);
    lmx_status st = json ? lmx_write_file(path, json, strlen(json), f->err) : lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory");
    free(json);
    return st;
}

static lmx_status write_out(fuser *f, const char *out) {
    int absent;
    lmx_status st = check_out(out, &absent, f->err);
    if (st) return st;
    if (absent && mkdir(out, 0755) != 0)
        return lmx_err_set(f->err, LMX_ERR_IO, "%s: cannot create: %s", out, strerror(errno));
    char *written[N_SIDE_FILES + 2] = {0};
    int nw = 0;
    char *model = lmx_path_join(out, "model.safetensors"), *config = lmx_path_join(out, "config.json");
    if (!model || !config) st = lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory");
    if (st == LMX_OK && (st = lmx_st_write(model, f->items, f->n_items, f->err)) == LMX_OK) written[nw++] = model, model = NULL;
    if (st == LMX_OK && (st = write_config(f, config)) == LMX_OK) written[nw++] = config, config = NULL;
    free(model);
    free(config);
    for (size_t i = 0; st == LMX_OK && i < N_SIDE_FILES; i++) {
        char *from = lmx_path_join(f->base, side_files[i]), *to = lmx_path_join(out, side_files[i]);
        char *data = NULL;
        size_t n = 0;
        if (!from || !to) st = lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory");
        else if (lmx_is_file(from) && (st = lmx_read_file(from, &data, &n, f->err)) == LMX_OK &&
                 (st = lmx_write_file(to, data, n, f->err)) == LMX_OK)
            written[nw++] = to, to = NULL;
        free(data);
        free(from);
        free(to);
    }
    for (int i = 0; i < nw; i++) { /* on failure leave nothing behind */
        if (st) unlink(written[i]);
        free(written[i]);
    }
    if (st && absent) rmdir(out);
    return st;
}

/* ---- fuse ------------------------------------------------------------------------------------------ */

static lmx_status open_base(fuser *f) {
    const char *base = f->base;
    if (lmx_is_file(base)) {
        if (lmx_gguf_is_gguf(base) || lmx_ends_with(base, ".gguf"))
            return lmx_err_set(f->err, LMX_ERR_UNSUPPORTED, "%s: fuse needs a HF model directory; GGUF bases are not supported",
                               base);
        return lmx_err_set(f->err, LMX_ERR_UNSUPPORTED, "%s: fuse needs a HF model directory", base);
    }
    if (!lmx_is_dir(base)) return lmx_err_set(f->err, LMX_ERR_IO, "%s: no such model directory", base);
    char *path = lmx_path_join(base, "config.json");
    lmx_status st = !path ? lmx_err_set(f->err, LMX_ERR_NOMEM, "out of memory")
                    : !lmx_is_file(path)
                        ? lmx_err_set(f->err, LMX_ERR_MISSING, "%s: no config.json (fuse needs a HF model directory)", base)
                        : lmx_read_file(path, &f->config_text, &f->config_len, f->err);
    if (st == LMX_OK) st = lmx_config_parse(f->config_text, path, &f->cfg, f->err);
    if (st == LMX_OK && !cJSON_IsObject(f->config = cJSON_ParseWithLength(f->config_text, f->config_len)))
        st = lmx_err_set(f->err, LMX_ERR_FORMAT, "%s: not a JSON object", path);
    free(path);
    if (st == LMX_OK) st = lmx_st_set_open_dir(base, &f->set, f->err);
    if (st) return st;
    static const char *const prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0] && !f->prefix; i++) {
        char name[64];
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (lmx_st_set_find(f->set, name)) f->prefix = prefixes[i];
    }
    if (!f->prefix) return lmx_err_set(f->err, LMX_ERR_MISSING, "%s: missing tensor \"model.embed_tokens.weight\"", base);
    return LMX_OK;
}

lmx_status lmx_fuse_dir(const char *base, const char *adapter, const char *out, int dequantize, lmx_err *err) {
    if (!base || !adapter || !out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "fuse: NULL argument");
    fuser f = {.base = base, .dequantize = dequantize, .err = err};
    int absent;
    lmx_status st = check_out(out, &absent, err); /* fail before the work */
    if (st == LMX_OK) st = open_base(&f);
    if (st == LMX_OK) st = lmx_lora_file_open(adapter, &f.lf, err);
    char family[32];
    if (st == LMX_OK && f.cfg.arch != LMX_ARCH_UNKNOWN &&
        lmx_lora_arch_mismatch(&f.lf, lmx_arch_name(f.cfg.arch), family, sizeof family))
        st = lmx_err_set(err, LMX_ERR_UNSUPPORTED, "%s: the adapter was trained for %s (%s); the base is %s", adapter,
                         f.lf.base_class, family, lmx_arch_name(f.cfg.arch));
    if (st == LMX_OK && !(f.t = calloc((size_t)f.lf.n + 1, sizeof *f.t))) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    for (int i = 0; st == LMX_OK && i < f.lf.n; i++) st = check_entry(&f, &f.lf.e[i], &f.t[i]);
    if (st == LMX_OK) st = build(&f);
    if (st == LMX_OK) st = write_out(&f, out);
    for (size_t i = 0; i < f.n_bufs; i++) free(f.bufs[i]);
    free(f.bufs);
    free(f.items);
    free(f.t);
    lmx_lora_file_close(&f.lf);
    lmx_st_set_close(f.set);
    cJSON_Delete(f.config);
    free(f.config_text);
    lmx_config_free(&f.cfg);
    return st;
}
