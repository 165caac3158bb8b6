/* info.c - `lmx info MODEL` and `lmx run MODEL --prompt-ids ...`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"
#include "generate.h"
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

static void emit_id(int32_t id, int index, void *user) {
    printf("%s%d", index ? " " : "", id);
    fflush(stdout);
}

static void emit_text(int32_t id, int index, void *user) { cli_text_emit(user, id, 0); }

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *ids_arg = NULL, *prompt = NULL;
    cli_gen_opts o = {.backend = "auto", .max_tokens = 16};
    cli_text io = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: lmx run MODEL PROMPT              [--max-tokens N] [--ctx N] [--threads N] [--backend NAME]\n"
                   "       lmx run MODEL --prompt-ids ID,ID,... [same options]\n\n"
                   "Greedy generation.  With PROMPT (text), the model's tokenizer encodes it and the generated\n"
                   "text streams to stdout.  With --prompt-ids, prints the generated ids, space-separated.\n"
                   "Stops at an end-of-sequence id or after --max-tokens (default 16).\n");
            return 0;
        }
        int r = cli_parse_gen_opt("run", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--prompt-ids") && i + 1 < argc) ids_arg = argv[++i];
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
    lp.backend = o.backend;
    lp.n_threads = o.threads;
    lmx_model *m = NULL;
    int rc = 1;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
    } else {
        lmx_model_info in;
        lmx_model_get_info(m, &in);
        /* ids mode prints the end-of-sequence id too; text mode stops before it */
        if (cli_greedy(m, o.n_ctx, ids, n, o.max_tokens, in.eos_ids, in.n_eos, !prompt,
                       prompt ? emit_text : emit_id, &io) == 0) {
            if (prompt) cli_text_emit(&io, 0, 1);
            printf("\n");
            rc = 0;
        }
    }
    cli_text_close(&io);
    lmx_model_free(m);
    free(ids);
    return rc;
}
