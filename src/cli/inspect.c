/* inspect.c - `lmx inspect MODEL PROMPT [options]`: each chosen layer's post-RoPE keys after the prompt's
 * prefill (lmx_inspect; with --probs also attention probabilities), one summary line per layer on stdout
 * and, with --out, a safetensors file:
 *   ids               I32 [T]
 *   layers.N.keys     F32 [Hk, T, D]   (a shared-KV layer's are those of the layer it shares)
 *   layers.N.probs    F32 [Hh, T, T]   (--probs)
 *   __metadata__      format, model, backend; layers.N.shared_from, layers.N.window, layers.N.heads */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "../formats/safetensors.h"
#include "lmx.h"

static void usage(void) {
    printf("usage: lmx inspect MODEL PROMPT [options]\n"
           "       lmx inspect MODEL --prompt-ids ID,ID,... [options]\n\n"
           "Evaluate the prompt and report what each layer's attention saw: its post-RoPE keys [kv_heads, tokens,\n"
           "head_dim] read from the KV cache (a shared-KV layer names the layer it shares and reports its keys),\n"
           "and with --probs the attention probabilities [heads, tokens, tokens].  Prints one line per layer\n"
           "(shapes, shared-from layer, window, key norms); --out writes the tensors as layers.N.keys and\n"
           "layers.N.probs (F32) with the prompt's ids and metadata layers.N.shared_from / window / heads.\n\n"
           "options:\n"
           "  --prompt-ids ID,...   token ids instead of a text prompt (no tokenizer needed)\n"
           "  --layers N,...        the layers to report (default: all)\n"
           "  --probs               also the attention probabilities (4 heads*tokens^2 bytes per layer)\n"
           "  --heads H,...         with --probs: these query heads only (default: all)\n"
           "  --out FILE            write FILE.safetensors\n"
           "  --backend NAME        auto (default), cpu or cuda\n"
           "  --threads N           CPU threads (default: all cores)\n"
           "  --adapter DIR         a LoRA adapter applied to the pass\n");
}

/* A comma list of non-negative ints into a malloc'ed int *out [*n]; 0 or -1. */
static int parse_list(const char *s, int **out, int *n) {
    int32_t *v = NULL;
    if (cli_parse_ids(s, &v, n)) return -1;
    int *w = malloc((size_t)*n * sizeof *w);
    for (int i = 0; w && i < *n; i++) w[i] = v[i];
    free(v);
    *out = w;
    return w ? 0 : -1;
}

/* One layer's summary: shapes, whose keys, window, and the L2 norms of its Hk*T key vectors. */
static void summary(const lmx_inspect_layer *L, int T) {
    const int D = L->head_dim;
    double lo = INFINITY, hi = 0, sum = 0;
    for (int64_t r = 0; r < (int64_t)L->n_kv_heads * T; r++) {
        double ss = 0;
        for (int d = 0; d < D; d++) ss += (double)L->keys[r * D + d] * L->keys[r * D + d];
        ss = sqrt(ss);
        lo = ss < lo ? ss : lo, hi = ss > hi ? ss : hi, sum += ss;
    }
    char from[32] = "own cache";
    if (L->shared_from != L->layer) snprintf(from, sizeof from, "shared from %d", L->shared_from);
    printf("layer %3d  keys [%d, %d, %d]  %-14s  window %-5d  key norm min %.4g mean %.4g max %.4g", L->layer,
           L->n_kv_heads, T, D, from, L->window, lo, sum / ((double)L->n_kv_heads * T), hi);
    if (L->probs) printf("  probs [%d, %d, %d]", L->n_heads, T, T);
    printf("\n");
}

/* A malloc'ed printf; NULL when out of memory. */
static char *dupf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s) {
        va_start(ap, fmt);
        vsnprintf(s, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return s;
}

/* layers.N.heads' value: "0,1,..." (malloc'ed). */
static char *heads_list(const lmx_inspect_layer *L) {
    char *s = calloc((size_t)L->n_heads * 12 + 1, 1);
    for (int h = 0, o = 0; s && h < L->n_heads; h++) o += sprintf(s + o, "%s%d", h ? "," : "", L->heads[h]);
    return s;
}

/* The inspection as path (see the top of the file); 0, or 1 after printing the error. */
static int write_out(const char *path, const char *model, const char *backend, const lmx_inspection *in) {
    const int nl = lmx_inspection_n_layers(in), T = lmx_inspection_n_tokens(in);
    lmx_st_write_item *items = calloc((size_t)2 * nl + 1, sizeof *items);
    lmx_st_meta *meta = calloc((size_t)3 * nl + 3, sizeof *meta);
    char **strs = calloc((size_t)8 * nl, sizeof *strs); /* every name and value made here, freed at the end */
    size_t ni = 0, nm = 0, ns = 0;
    int ok = items && meta && strs;
    if (ok) {
        items[ni++] = (lmx_st_write_item){.name = "ids", .dtype = LMX_DTYPE_I32, .ndim = 1, .shape = {T},
                                          .data = lmx_inspection_ids(in)};
        meta[nm++] = (lmx_st_meta){"format", "lmx inspect"};
        meta[nm++] = (lmx_st_meta){"model", model};
        meta[nm++] = (lmx_st_meta){"backend", backend};
    }
    for (int i = 0; ok && i < nl; i++) {
        const lmx_inspect_layer *L = lmx_inspection_layer(in, i);
        const int l = L->layer;
        char *s[8] = {dupf("layers.%d.keys", l), dupf("layers.%d.shared_from", l), dupf("%d", L->shared_from),
                      dupf("layers.%d.window", l), dupf("%d", L->window)};
        if (L->probs) s[5] = dupf("layers.%d.probs", l), s[6] = dupf("layers.%d.heads", l), s[7] = heads_list(L);
        for (int k = 0; k < 8; k++) strs[ns++] = s[k];
        for (int k = 0; k < (L->probs ? 8 : 5); k++) ok &= s[k] != NULL;
        if (!ok) break;
        items[ni++] = (lmx_st_write_item){.name = s[0], .dtype = LMX_DTYPE_F32, .ndim = 3,
                                          .shape = {L->n_kv_heads, T, L->head_dim}, .data = L->keys};
        meta[nm++] = (lmx_st_meta){s[1], s[2]};
        meta[nm++] = (lmx_st_meta){s[3], s[4]};
        if (!L->probs) continue;
        items[ni++] = (lmx_st_write_item){.name = s[5], .dtype = LMX_DTYPE_F32, .ndim = 3, .shape = {L->n_heads, T, T},
                                          .data = L->probs};
        meta[nm++] = (lmx_st_meta){s[6], s[7]};
    }
    lmx_err err = {0};
    int rc = 0;
    if (!ok) rc = 1, fprintf(stderr, "lmx: out of memory\n");
    else if (lmx_st_write_meta(path, items, ni, meta, nm, &err)) rc = 1, fprintf(stderr, "lmx: %s\n", err.msg);
    for (size_t k = 0; strs && k < ns; k++) free(strs[k]);
    free(strs);
    free(items);
    free(meta);
    return rc;
}

int cmd_inspect(int argc, char **argv) {
    const char *path = NULL, *prompt = NULL, *ids_arg = NULL, *out = NULL, *adapter = NULL;
    const char *layers_arg = NULL, *heads_arg = NULL;
    lmx_load_params lp = lmx_load_default_params();
    lmx_inspect_params ip = lmx_inspect_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int has = i + 1 < argc;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--probs")) ip.probs = 1;
        else if (!strcmp(a, "--prompt-ids") && has) ids_arg = argv[++i];
        else if (!strcmp(a, "--layers") && has) layers_arg = argv[++i];
        else if (!strcmp(a, "--heads") && has) heads_arg = argv[++i];
        else if (!strcmp(a, "--out") && has) out = argv[++i];
        else if (!strcmp(a, "--backend") && has) lp.backend = argv[++i];
        else if (!strcmp(a, "--adapter") && has) adapter = argv[++i];
        else if (!strcmp(a, "--threads") && has) {
            if (cli_parse_int(argv[++i], &lp.n_threads)) return cli_usage_error("inspect: bad --threads %s", argv[i]);
        } else if (a[0] == '-' && a[1]) return cli_usage_error("inspect: unknown option or missing value: %s", a);
        else if (!path) path = a;
        else if (!prompt) prompt = a;
        else return cli_usage_error("inspect: more than one prompt given");
    }
    if (!path) return cli_usage_error("inspect: no model given");
    if (!!ids_arg == !!prompt) return cli_usage_error("inspect: give a PROMPT or --prompt-ids (one of them)");
    if (heads_arg && !ip.probs) return cli_usage_error("inspect: --heads needs --probs");
    int32_t *ids = NULL;
    int *layers = NULL, *heads = NULL, n = 0, rc = 1;
    lmx_model *m = NULL;
    lmx_inspection *in = NULL;
    if (ids_arg && cli_parse_ids(ids_arg, &ids, &n)) {
        rc = cli_usage_error("inspect: --prompt-ids wants comma-separated token ids");
        goto done;
    }
    if ((layers_arg && parse_list(layers_arg, &layers, &ip.n_layers)) ||
        (heads_arg && parse_list(heads_arg, &heads, &ip.n_heads))) {
        rc = cli_usage_error("inspect: --layers and --heads want comma-separated indices");
        goto done;
    }
    ip.layers = layers, ip.heads = heads;
    lp.adapter = adapter;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        goto done;
    }
    if ((ids ? lmx_inspect_ids(m, ids, n, &ip, &in) : lmx_inspect(m, prompt, &ip, &in)) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
        goto done;
    }
    lmx_model_info info;
    lmx_model_get_info(m, &info);
    const int T = lmx_inspection_n_tokens(in);
    printf("%s (%s, %s): %d tokens\n", path, info.architecture, info.backend, T);
    for (int i = 0; i < lmx_inspection_n_layers(in); i++) summary(lmx_inspection_layer(in, i), T);
    rc = out ? write_out(out, path, info.backend, in) : 0;
    if (out && !rc) printf("wrote %s\n", out);
done:
    lmx_inspection_free(in);
    lmx_model_free(m);
    free(ids);
    free(layers);
    free(heads);
    return rc;
}
