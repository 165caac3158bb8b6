/* info.c - `lmx info MODEL` and `lmx run MODEL --prompt-ids ...`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"
#include "text_io.h"

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: lmx info MODEL\n\nPrint the architecture, sizes and weight dtype of a model directory.\n");
            return 0;
        }
        if (argv[i][0] == '-') return cli_usage_error("info: unknown option %s", argv[i]);
        if (path) return cli_usage_error("info: more than one model given");
        path = argv[i];
    }
    if (!path) return cli_usage_error("info: no model given");
    lmx_model *m = NULL;
    lmx_load_params lp = lmx_load_default_params();
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        return 1;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    printf("architecture  %s\nbackend       %s\ndtype         %s\nparameters    %lld\n"
           "weight bytes  %lld\nlayers        %d\nhidden        %d\nheads         %d (kv %d, dim %d)\n"
           "ffn           %d\nvocab         %d\ncontext       %d\n",
           in.architecture, in.backend, in.dtype, (long long)in.n_params, (long long)in.weight_bytes,
           in.n_layers, in.hidden_size, in.n_heads, in.n_kv_heads, in.head_dim, in.ffn_size,
           in.vocab_size, in.max_context);
    lmx_model_free(m);
    return 0;
}

/* Comma-separated ids into a malloc'ed array. */
static int parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 2147483647L || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) { free(ids); return -1; }
            ids = g;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (k == 0) { free(ids); return -1; }
    *out = ids;
    *n = k;
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *ids_arg = NULL, *backend = "auto", *prompt = NULL;
    cli_text io = {0};
    int max_tokens = 16, threads = 0, n_ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help")) {
            printf("usage: lmx run MODEL PROMPT              [--max-tokens N] [--ctx N] [--threads N] [--backend NAME]\n"
                   "       lmx run MODEL --prompt-ids ID,ID,... [same options]\n\n"
                   "Greedy generation.  With PROMPT (text), the model's tokenizer encodes it and the generated\n"
                   "text streams to stdout.  With --prompt-ids, prints the generated ids, space-separated.\n"
                   "Stops at an end-of-sequence id or after --max-tokens (default 16).\n");
            return 0;
        }
        if (!strcmp(a, "--prompt-ids") && has_val) ids_arg = argv[++i];
        else if (!strcmp(a, "--backend") && has_val) backend = argv[++i];
        else if (!strcmp(a, "--max-tokens") && has_val) { if (cli_parse_int(argv[++i], &max_tokens)) return cli_usage_error("run: bad --max-tokens"); }
        else if (!strcmp(a, "--threads") && has_val) { if (cli_parse_int(argv[++i], &threads)) return cli_usage_error("run: bad --threads"); }
        else if (!strcmp(a, "--ctx") && has_val) { if (cli_parse_int(argv[++i], &n_ctx)) return cli_usage_error("run: bad --ctx"); }
        else if (a[0] == '-') return cli_usage_error("run: unknown option or missing value: %s", a);
        else if (!path) path = a;
        else if (!prompt) prompt = a;
        else return cli_usage_error("run: more than one prompt given");
    }
    if (!path) return cli_usage_error("run: no model given");
    if (!ids_arg == !prompt) return cli_usage_error("run: give a PROMPT or --prompt-ids (one of them)");
    int32_t *ids = NULL;
    int n = 0;
    if (ids_arg && parse_ids(ids_arg, &ids, &n)) return cli_usage_error("run: --prompt-ids wants comma-separated token ids");
    if (prompt && (cli_text_open(&io, path) != 0 || cli_text_encode(&io, prompt, 1, &ids, &n) != 0)) {
        cli_text_close(&io);
        free(ids);
        return 1;
    }

    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    lp.n_threads = threads;
    lmx_model *m = NULL;
    lmx_context *c = NULL;
    float *logits = NULL;
    int rc = 1;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        goto done;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = n_ctx;
    logits = malloc((size_t)in.vocab_size * sizeof *logits);
    if (!logits || lmx_context_create(m, &cp, &c) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", logits ? lmx_last_error(m) : "out of memory");
        goto done;
    }
    if (lmx_context_eval(c, ids, n, logits, 0) != LMX_OK) goto fail;
    for (int g = 0; g < max_tokens; g++) {
        int32_t best = 0;
        for (int v = 1; v < in.vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        int eos = 0;
        for (int e = 0; e < in.n_eos; e++) eos |= best == in.eos_ids[e];
        if (prompt) {
            if (!eos) cli_text_emit(&io, best, 0);
        } else {
            printf("%s%d", g ? " " : "", best);
            fflush(stdout);
        }
        if (eos || g + 1 == max_tokens) break;
        if (lmx_context_eval(c, &best, 1, logits, 0) != LMX_OK) goto fail;
    }
    if (prompt) cli_text_emit(&io, 0, 1);
    printf("\n");
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
done:
    cli_text_close(&io);
    lmx_context_free(c);
    lmx_model_free(m);
    free(logits);
    free(ids);
    return rc;
}
