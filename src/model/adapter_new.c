/* adapter_new.c - adapters that training makes: a new adapter initialised as PEFT initialises one,
 * and an adapter written back to disk in HF PEFT's or mlx-lm's layout (what lmx_adapter_load and
 * those two libraries read). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "../base/fileio.h"
#include "adapter.h"

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* rows of a GGUF llama's q/k in HF order: GGUF row h*D + 2i + j is HF row h*D + j*D/2 + i */
static int64_t hf_row(int64_t g, int64_t D) {
    const int64_t h = g / D, w = g % D;
    return h * D + (w % 2) * (D / 2) + w / 2;
}

lmx_status lmx_adapter_create(lmx_model *m, const lmx_lora_spec *s, lmx_adapter **out) {
    *out = NULL;
    const int nl = m->cfg.n_layers;
    if (s->rank <= 0 || s->rank > LMX_LORA_RANK_MAX)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA rank %d outside [1, %d]", s->rank, LMX_LORA_RANK_MAX);
    if (!(s->targets & ((1u << LMX_PROJ_N) - 1)))
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA: no target projection");
    if (s->num_layers < 0 || s->num_layers > nl)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA: %d layers of a model of %d", s->num_layers, nl);
    lmx_status st = lmx_adapter_reserve(m);
    if (st) return st;
    lmx_adapter *a = calloc(1, sizeof *a);
    if (a) a->pairs = calloc((size_t)nl * LMX_PROJ_N, sizeof *a->pairs);
    if (!a || !a->pairs || !(a->path = strdup(""))) {
        if (a) free(a->pairs);
        free(a);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    a->m = m;
    const float scale = s->use_rslora ? (float)(s->alpha / sqrt((double)s->rank)) : (float)(s->alpha / s->rank);
    const int first = s->num_layers ? nl - s->num_layers : 0;
    uint64_t rng = s->seed;
    for (int l = first; l < nl && !st; l++)
        for (int p = 0; p < LMX_PROJ_N && !st; p++) {
            if (!(s->targets & (1u << p))) continue;
            const lmx_tensor *w = lmx_proj_weight(&m->layers[l], (lmx_proj)p);
            if (!w->data && !lmx_layer_experts_only(m, l))
                continue; /* gemma4's shared KV or K = V: the layer has no such module (PEFT skips it too) */
            if (!w->data) {
                st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA target %s: layer %d has experts, not one %s "
                                 "(adapters on experts are not supported)", lmx_proj_short((lmx_proj)p), l,
                                 lmx_proj_module((lmx_proj)p));
                break;
            }
            const int64_t N = w->shape[0], K = w->shape[1], r = s->rank;
            /* PEFT: kaiming_uniform_(A, a = sqrt(5)), i.e. U(-1/sqrt(K), 1/sqrt(K)); B = 0 */
            float *A = malloc((size_t)(r * K) * sizeof *A), *B = calloc((size_t)(N * r), sizeof *B);
            const double bound = 1.0 / sqrt((double)K);
            for (int64_t i = 0; A && i < r * K; i++) A[i] = (float)(((splitmix(&rng) >> 11) * 0x1.0p-53 * 2.0 - 1.0) * bound);
            lmx_lora_pair *q = &a->pairs[l * LMX_PROJ_N + p];
            q->a = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {r, K}};
            q->b = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 2, .shape = {N, r}};
            q->scale = scale;
            if (!A || !B) st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
            if (!st && (st = m->be->ops->alloc(m->be, &q->a)) == LMX_OK)
                st = m->be->ops->write(m->be, &q->a, 0, A, (size_t)(r * K) * sizeof *A);
            if (!st && (st = m->be->ops->alloc(m->be, &q->b)) == LMX_OK)
                st = m->be->ops->write(m->be, &q->b, 0, B, (size_t)(N * r) * sizeof *B);
            if (st && st != LMX_ERR_NOMEM) lmx_err_set(&m->err, st, "%s", m->be->err.msg);
            free(A);
            free(B);
            a->info.n_modules++;
            a->info.n_params += r * (K + N);
        }
    if (st) {
        for (int i = 0; i < nl * LMX_PROJ_N; i++) {
            if (a->pairs[i].a.data) m->be->ops->release(m->be, &a->pairs[i].a);
            if (a->pairs[i].b.data) m->be->ops->release(m->be, &a->pairs[i].b);
        }
        free(a->pairs);
        free(a->path);
        free(a);
        return st;
    }
    size_t len = 0;
    for (int p = 0; p < LMX_PROJ_N; p++)
        if (s->targets & (1u << p))
            len += (size_t)snprintf(a->targets + len, sizeof a->targets - len, "%s%s", len ? "," : "", lmx_proj_short((lmx_proj)p));
    a->spec = *s;
    a->info.format = "new";
    a->info.rank = s->rank;
    a->info.scale = scale;
    a->info.first_layer = first;
    a->info.last_layer = nl - 1;
    a->info.targets = a->targets;
    a->info.path = a->path;
    a->id = ++m->adapter_seq;
    m->adapters[m->n_adapters++] = a;
    *out = a;
    return LMX_OK;
}

/* ---- saving --------------------------------------------------------------------------------- */

static char *json_config(const lmx_adapter *a, lmx_lora_format fmt, const lmx_lora_spec *s, int first, int last) {
    cJSON *o = cJSON_CreateObject(), *t = cJSON_CreateArray();
    for (int p = 0; p < LMX_PROJ_N; p++)
        if (s->targets & (1u << p))
            cJSON_AddItemToArray(t, cJSON_CreateString(fmt == LMX_LORA_PEFT ? lmx_proj_short((lmx_proj)p)
                                                                             : lmx_proj_module((lmx_proj)p)));
    if (fmt == LMX_LORA_PEFT) {
        cJSON_AddStringToObject(o, "peft_type", "LORA");
        cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM");
        cJSON_AddNumberToObject(o, "r", s->rank);
        cJSON_AddNumberToObject(o, "lora_alpha", s->alpha);
        cJSON_AddBoolToObject(o, "use_rslora", s->use_rslora);
        cJSON_AddNumberToObject(o, "lora_dropout", s->dropout);
        cJSON_AddStringToObject(o, "bias", "none");
        cJSON_AddBoolToObject(o, "fan_in_fan_out", 0);
        cJSON_AddItemToObject(o, "target_modules", t);
        if (first > 0 || last < a->m->cfg.n_layers - 1) {
            cJSON *ls = cJSON_CreateArray();
            for (int l = first; l <= last; l++) cJSON_AddItemToArray(ls, cJSON_CreateNumber(l));
            cJSON_AddItemToObject(o, "layers_to_transform", ls);
        } else {
            cJSON_AddNullToObject(o, "layers_to_transform");
        }
        cJSON_AddNullToObject(o, "modules_to_save");
    } else {
        cJSON_AddStringToObject(o, "fine_tune_type", "lora");
        cJSON_AddNumberToObject(o, "num_layers", last - first + 1);
        cJSON *lp = cJSON_CreateObject();
        cJSON_AddNumberToObject(lp, "rank", s->rank);
        cJSON_AddNumberToObject(lp, "scale", a->info.scale);
        cJSON_AddNumberToObject(lp, "dropout", s->dropout);
        cJSON_AddItemToObject(lp, "keys", t);
        cJSON_AddItemToObject(o, "lora_parameters", lp);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

unsigned lmx_lora_targets_parse(const char *list) {
    static const char *names[LMX_PROJ_N] = {"q", "k", "v", "o", "gate", "up", "down"};
    unsigned out = 0;
    for (const char *p = list; p && *p;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        int found = 0;
        for (int k = 0; k < LMX_PROJ_N; k++) {
            const char *sh = lmx_proj_short((lmx_proj)k);
            if ((strlen(names[k]) == n && !strncmp(p, names[k], n)) || (strlen(sh) == n && !strncmp(p, sh, n)))
                out |= 1u << k, found = 1;
        }
        if (!found) return 0;
        p = e ? e + 1 : p + n;
    }
    return out;
}

lmx_status lmx_adapter_write(const lmx_adapter *a, const char *dir, lmx_lora_format fmt, lmx_err *err) {
    const lmx_lora_spec *s = &a->spec;
    lmx_model *m = a->m;
    const int nl = m->cfg.n_layers;
    int first = nl, last = -1, n = 0, rank = -1;
    for (int i = 0; i < nl * LMX_PROJ_N; i++)
        if (a->pairs[i].a.data) {
            const int l = i / LMX_PROJ_N, r = (int)a->pairs[i].a.shape[0];
            first = l < first ? l : first, last = l > last ? l : last, n++;
            if (rank >= 0 && r != rank)
                return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "saving an adapter: ranks %d and %d differ", rank, r);
            rank = r;
        }
    if (!n) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "saving an adapter: it adapts nothing");
    if (fmt == LMX_LORA_MLX && last != nl - 1)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED, "saving an mlx-lm adapter: mlx-lm adapts the last layers, and "
                           "this adapter ends at layer %d of %d", last, nl);
    if (mkdir(dir, 0777) && !lmx_is_dir(dir)) return lmx_err_set(err, LMX_ERR_IO, "cannot create %s", dir);
    lmx_st_write_item *items = calloc((size_t)2 * n, sizeof *items);
    float **bufs = calloc((size_t)2 * n, sizeof *bufs);
    char **names = calloc((size_t)2 * n, sizeof *names);
    lmx_status st = items && bufs && names ? LMX_OK : lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < nl * LMX_PROJ_N && !st; i++) {
        const lmx_lora_pair *p = &a->pairs[i];
        if (!p->a.data) continue;
        const int l = i / LMX_PROJ_N;
        const lmx_proj pj = (lmx_proj)(i % LMX_PROJ_N);
        const int64_t r = p->a.shape[0], K = p->a.shape[1], N = p->b.shape[0];
        const int64_t D = m->head_dim;
        const int perm = m->interleaved_rope && (pj == LMX_PROJ_Q || pj == LMX_PROJ_K);
        for (int j = 0; j < 2 && !st; j++) {
            const lmx_tensor *t = j ? &p->b : &p->a;
            const int64_t cnt = lmx_tensor_nelem(t);
            float *h = malloc((size_t)cnt * sizeof *h), *o = malloc((size_t)cnt * sizeof *o);
            char *nm = malloc(200);
            bufs[k] = o, names[k] = nm;
            if (!h || !o || !nm) {
                free(h);
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
            if ((st = m->be->ops->read(m->be, t, 0, h, (size_t)cnt * sizeof *h))) {
                lmx_err_set(err, st, "%s", m->be->err.msg);
                free(h);
                break;
            }
            /* A [r, K] and B [N, r] as stored; GGUF llama q/k B rows back to HF order; mlx-lm transposed */
            const int64_t rows = j ? N : r, cols = j ? r : K;
            for (int64_t y = 0; y < rows; y++) {
                const int64_t yo = j && perm ? hf_row(y, D) : y;
                for (int64_t x = 0; x < cols; x++)
                    if (fmt == LMX_LORA_PEFT) o[yo * cols + x] = h[y * cols + x];
                    else o[x * rows + yo] = h[y * cols + x];
            }
            free(h);
            if (fmt == LMX_LORA_PEFT)
                lmx_lora_peft_name(nm, 200, l, pj, j);
            else
                snprintf(nm, 200, "model.layers.%d.%s.lora_%c", l, lmx_proj_module(pj), j ? 'b' : 'a');
            items[k] = (lmx_st_write_item){.name = nm, .dtype = LMX_DTYPE_F32, .ndim = 2, .data = o};
            items[k].shape[0] = fmt == LMX_LORA_PEFT ? rows : cols;
            items[k].shape[1] = fmt == LMX_LORA_PEFT ? cols : rows;
            k++;
        }
    }
    lmx_lora_spec sp = *s;
    sp.rank = rank;
    char *cfg = st ? NULL : json_config(a, fmt, &sp, first, last);
    char *cpath = lmx_path_join(dir, "adapter_config.json");
    char *wpath = lmx_path_join(dir, fmt == LMX_LORA_PEFT ? "adapter_model.safetensors" : "adapters.safetensors");
    if (!st && (!cfg || !cpath || !wpath)) st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    if (!st) st = lmx_st_write(wpath, items, (size_t)k, err);
    if (!st) st = lmx_write_file(cpath, cfg, strlen(cfg), err);
    for (int i = 0; i < 2 * n && bufs && names; i++) free(bufs[i]), free(names[i]);
    free(items), free(bufs), free(names), free(cfg), free(cpath), free(wpath);
    return st;
}
