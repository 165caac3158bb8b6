/* inspect.c - lmx_inspect*: what each chosen layer's attention saw for a prompt (lmx.h, "Attention
 * inspection").
 *
 *   keys    [Hk, T, D] per layer: the prompt is evaluated in a context of its own, in chunks no longer than
 *           the smallest rotating cache it reads; after each chunk its rows of the layer's cache (the shared
 *           source's for gemma4's shared-KV layers) are read back with the backend's read op and widened to
 *           float32, so no position is lost to a sliding window
 *   queries [T, H*D] per layer, with probabilities: copied to the host by the forward pass after RoPE
 *           (m->inspect_q)
 *   probs   [Hh, T, T] per layer: row i = softmax over j in (i - W, i] of cap tanh(scale q_i . k_j / cap)
 *           (cap: attention soft-capping, none when 0), in float64 on the host
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/half.h"
#include "runtime.h"

/* One inspected layer: what the caller sees, and the arrays it points at (owned). */
typedef struct insp_layer {
    lmx_inspect_layer pub;
    float *keys;                 /* [Hk, T, D] */
    int *heads;                  /* [Hh] */
    float *probs;                /* [Hh, T, T] or NULL */
    float *q;                    /* [T, H*D] while the pass runs (probabilities only), else NULL */
} insp_layer;

struct lmx_inspection {
    int T;
    int32_t *ids;                /* [T] */
    int n;
    insp_layer *layers;          /* [n] */
};

lmx_inspect_params lmx_inspect_default_params(void) {
    lmx_inspect_params p = {0};
    return p;
}

int lmx_inspection_n_tokens(const lmx_inspection *in) { return in ? in->T : 0; }
const int32_t *lmx_inspection_ids(const lmx_inspection *in) { return in ? in->ids : NULL; }
int lmx_inspection_n_layers(const lmx_inspection *in) { return in ? in->n : 0; }

const lmx_inspect_layer *lmx_inspection_layer(const lmx_inspection *in, int i) {
    return in && i >= 0 && i < in->n ? &in->layers[i].pub : NULL;
}

void lmx_inspection_free(lmx_inspection *in) {
    if (!in) return;
    for (int i = 0; in->layers && i < in->n; i++) {
        free(in->layers[i].keys);
        free(in->layers[i].heads);
        free(in->layers[i].probs);
        free(in->layers[i].q);
    }
    free(in->layers);
    free(in->ids);
    free(in);
}

/* a * b * c zeroed floats, NULL when out of memory or the product overflows. */
static float *alloc_f32(size_t a, size_t b, size_t c) {
    if (b && a > SIZE_MAX / sizeof(float) / b) return NULL;
    if (c && a * b > SIZE_MAX / sizeof(float) / c) return NULL;
    const size_t n = a * b * c;
    return calloc(n > 0 ? n : 1, sizeof(float));
}

/* idx [n] (NULL: 0..max-1, n ignored) distinct and inside [0, max)?  Names what in a message on m. */
static lmx_status check_indices(lmx_model *m, const int *idx, int n, int max, const char *what) {
    if (!idx) return LMX_OK;
    if (n < 1 || n > max)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "inspect: %d %s asked for (the model has %d)", n, what, max);
    for (int i = 0; i < n; i++) {
        if (idx[i] < 0 || idx[i] >= max)
            return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "inspect: %s index %d outside [0, %d)", what, idx[i], max);
        for (int j = 0; j < i; j++)
            if (idx[j] == idx[i])
                return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "inspect: %s index %d given twice", what, idx[i]);
    }
    return LMX_OK;
}

/* The inspection's layers with their keys (and heads, probabilities, query buffers) allocated. */
static lmx_status plan(lmx_model *m, const lmx_inspect_params *p, int T, lmx_inspection *in) {
    const lmx_config *c = &m->cfg;
    const int H = c->n_heads, Hh = p->probs ? (p->heads ? p->n_heads : H) : 0;
    in->n = p->layers ? p->n_layers : c->n_layers;
    if (!(in->layers = calloc((size_t)in->n, sizeof *in->layers)))
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory");
    for (int i = 0; i < in->n; i++) {
        insp_layer *il = &in->layers[i];
        const int l = p->layers ? p->layers[i] : i;
        const lmx_layer *L = &m->layers[l];
        const int Hk = L->n_kv_heads, D = L->head_dim;
        il->pub = (lmx_inspect_layer){.layer = l, .shared_from = L->kv_src, .n_kv_heads = Hk, .head_dim = D};
        if (!(il->keys = alloc_f32((size_t)Hk, (size_t)T, (size_t)D)))
            return lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory for layer %d's keys", l);
        il->pub.keys = il->keys;
        if (!Hh) continue;
        il->heads = malloc((size_t)Hh * sizeof *il->heads);
        il->probs = alloc_f32((size_t)Hh, (size_t)T, (size_t)T);
        il->q = alloc_f32((size_t)T, (size_t)H, (size_t)D);
        if (!il->heads || !il->probs || !il->q)
            return lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory for layer %d's probabilities "
                               "(%d heads of %d x %d)", l, Hh, T, T);
        for (int h = 0; h < Hh; h++) il->heads[h] = p->heads ? p->heads[h] : h;
        il->pub.n_heads = Hh, il->pub.heads = il->heads, il->pub.probs = il->probs;
    }
    return LMX_OK;
}

/* Positions [p0, p1) of kv's keys (rows of Hk*D) into keys [Hk, T, D], through tmp (room for p1 - p0 rows
 * of the cache's dtype).  A rotating cache holds position p in slot p % cap: runs end where it wraps. */
static lmx_status read_keys(lmx_backend *be, const lmx_kv_layer *kv, int p0, int p1, int T, int Hk, int D, void *tmp,
                            float *keys) {
    const lmx_dtype dt = kv->k.dtype;
    const size_t es = lmx_dtype_size(dt), row = (size_t)Hk * D;
    for (int p = p0; p < p1;) {
        const int slot = kv->rotating ? p % kv->cap : p;
        const int n = kv->rotating && p1 - p > kv->cap - slot ? kv->cap - slot : p1 - p;
        lmx_status st = be->ops->read(be, &kv->k, (size_t)slot * row * es, tmp, (size_t)n * row * es);
        if (st) return st;
        for (int r = 0; r < n; r++)          /* tmp [n, Hk*D] -> keys [Hk, T, D] */
            for (int h = 0; h < Hk; h++)
                for (int d = 0; d < D; d++)
                    keys[((size_t)h * T + p + r) * D + d] = lmx_float_at(tmp, dt, (int64_t)(r * row + (size_t)h * D + d));
        p += n;
    }
    return LMX_OK;
}

/* il's probabilities from its queries il->q [T, H*D] and keys [Hk, T, D]; s: scratch [T]. */
static void layer_probs(insp_layer *il, int T, int H, double scale, double softcap, double *s) {
    const int Hk = il->pub.n_kv_heads, D = il->pub.head_dim, W = il->pub.window;
    for (int a = 0; a < il->pub.n_heads; a++) {
        const int h = il->heads[a];
        const float *k = il->keys + (size_t)(h / (H / Hk)) * T * D; /* [T, D]: the kv head h reads */
        for (int i = 0; i < T; i++) {
            const float *q = il->q + ((size_t)i * H + h) * D;      /* [D] */
            const int lo = W > 0 && i - W + 1 > 0 ? i - W + 1 : 0;
            double mx = -INFINITY, sum = 0;
            for (int j = lo; j <= i; j++) {
                double dot = 0;
                for (int d = 0; d < D; d++) dot += (double)q[d] * k[(size_t)j * D + d];
                s[j] = dot * scale;
                if (softcap > 0) s[j] = softcap * tanh(s[j] / softcap);
                if (s[j] > mx) mx = s[j];
            }
            for (int j = lo; j <= i; j++) sum += s[j] = exp(s[j] - mx);
            float *row = il->probs + ((size_t)a * T + i) * T;     /* [T], zeros outside [lo, i] */
            for (int j = lo; j <= i; j++) row[j] = (float)(s[j] / sum);
        }
    }
}

/* The prefill of ids [T] in ctx, chunk by chunk, with each chunk's keys read back into in's layers. */
static lmx_status prefill(lmx_model *m, lmx_context *ctx, const int32_t *ids, int T, lmx_inspection *in) {
    lmx_backend *be = m->be;
    int chunk = T;
    for (int i = 0; i < in->n; i++) { /* no longer than a rotating cache read: its rows must all be held */
        const lmx_kv_layer *kv = lmx_context_kv(ctx, in->layers[i].pub.shared_from);
        if (kv->rotating && kv->cap < chunk) chunk = kv->cap;
    }
    void *tmp = malloc((size_t)chunk * (size_t)m->kv_width * lmx_dtype_size(be->ops->kv_dtype));
    if (!tmp) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory");
    lmx_status st = LMX_OK;
    for (int p0 = 0; p0 < T && !st; p0 += chunk) {
        const int p1 = T - p0 < chunk ? T : p0 + chunk;
        if ((st = lmx_context_eval(ctx, ids + p0, p1 - p0, NULL, 0))) break;
        for (int i = 0; i < in->n && !st; i++) {
            const lmx_inspect_layer *pl = &in->layers[i].pub;
            if ((st = read_keys(be, lmx_context_kv(ctx, pl->shared_from), p0, p1, T, pl->n_kv_heads, pl->head_dim, tmp,
                                in->layers[i].keys)))
                lmx_err_set(&m->err, st, "inspect: reading layer %d's keys: %s", pl->shared_from, be->err.msg);
        }
    }
    free(tmp);
    return st;
}

lmx_status lmx_inspect_ids(lmx_model *m, const int32_t *ids, int n, const lmx_inspect_params *p, lmx_inspection **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    const lmx_inspect_params dp = lmx_inspect_default_params();
    if (!p) p = &dp;
    const lmx_config *c = &m->cfg;
    if (m->bridge) /* mlx-lm keeps its caches in its own process */
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the mlx_lm backend cannot inspect attention");
    if (!ids || n <= 0) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "inspect: no tokens");
    lmx_status st;
    if ((st = check_indices(m, p->layers, p->n_layers, c->n_layers, "layer")) ||
        (p->probs && (st = check_indices(m, p->heads, p->n_heads, c->n_heads, "head"))))
        return st;
    lmx_context *ctx = NULL;
    float **qs = NULL;                    /* [n_layers] the forward pass's query buffers */
    double *scratch = NULL;               /* [T] */
    lmx_inspection *in = calloc(1, sizeof *in);
    if (!in || !(in->ids = malloc((size_t)n * sizeof *in->ids))) {
        st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory");
        goto done;
    }
    in->T = n;
    memcpy(in->ids, ids, (size_t)n * sizeof *ids);
    if ((st = plan(m, p, n, in)) || (st = lmx_context_create(m, NULL, &ctx)) ||
        (st = lmx_context_set_adapter(ctx, p->adapter)))
        goto done;
    for (int i = 0; i < in->n; i++) in->layers[i].pub.window = lmx_context_kv(ctx, in->layers[i].pub.shared_from)->window;
    if (p->probs) {
        qs = calloc((size_t)c->n_layers, sizeof *qs);
        scratch = malloc((size_t)n * sizeof *scratch);
        if (!qs || !scratch) {
            st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "inspect: out of memory");
            goto done;
        }
        for (int i = 0; i < in->n; i++) qs[in->layers[i].pub.layer] = in->layers[i].q;
    }
    m->inspect_q = qs;
    st = prefill(m, ctx, ids, n, in);
    m->inspect_q = NULL;
    if (st) goto done;
    for (int i = 0; p->probs && i < in->n; i++) {
        layer_probs(&in->layers[i], n, c->n_heads, m->attn_scale, c->attn_softcap, scratch);
        free(in->layers[i].q);
        in->layers[i].q = NULL;
    }
    *out = in;
    in = NULL;
done:
    lmx_inspection_free(in);
    lmx_context_free(ctx);
    free(qs);
    free(scratch);
    return st;
}

lmx_status lmx_inspect(lmx_model *m, const char *prompt, const lmx_inspect_params *p, lmx_inspection **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    int32_t *ids = NULL;
    int n = 0;
    lmx_status st = lmx_runtime_encode(m, prompt, &ids, &n);
    if (!st) st = lmx_inspect_ids(m, ids, n, p, out);
    free(ids);
    return st;
}
