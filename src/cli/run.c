/* run.c - `lmx run MODEL [PROMPT]`: generation streamed to stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "generate.h"
#include "lmx.h"

/* All of stdin, NUL-terminated and malloc'ed (a trailing newline dropped); NULL when out of memory. */
static char *read_stdin(void) {
    size_t len = 0, cap = 4096;
    char *s = malloc(cap);
    while (s) {
        size_t got = fread(s + len, 1, cap - len - 1, stdin);
        len += got;
        if (got == 0) break;
        if (len + 1 == cap) {
            char *g = realloc(s, cap *= 2);
            if (!g) free(s);
            s = g;
        }
    }
    if (!s) return NULL;
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r')) len--;
    s[len] = 0;
    return s;
}

static int print_id(const lmx_token *t, void *user) {
    int *first = user;
    if (t->id < 0) return 0;
    printf("%s%d", *first ? "" : " ", t->id);
    *first = 0;
    fflush(stdout);
    return 0;
}

int cmd_run(int argc, char **argv) {
    const char *path = NULL, *ids_arg = NULL, *prompt = NULL;
    cli_gen_opts o;
    cli_gen_opts_init(&o, 256);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: lmx run MODEL [PROMPT] [options]\n"
                   "       lmx run MODEL --prompt-ids ID,ID,... [options]\n\n"
                   "Generate from PROMPT (or stdin when no PROMPT is given), encoded with the model's tokenizer;\n"
                   "the text streams to stdout.  With --prompt-ids, prints the generated ids, space-separated (an\n"
                   "ending end-of-sequence id included).  Stops at an end-of-sequence token, a --stop string or\n"
                   "--max-tokens (default 256).\n\noptions:\n%s",
                   cli_gen_opts_help);
            return 0;
        }
        int r = cli_parse_gen_opt("run", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--prompt-ids") && i + 1 < argc) ids_arg = argv[++i];
        else if (a[0] == '-' && a[1]) return cli_usage_error("run: unknown option or missing value: %s", a);
        else if (!path) path = a;
        else if (!prompt) prompt = a;
        else return cli_usage_error("run: more than one prompt given");
    }
    if (!path) return cli_usage_error("run: no model given");
    if (ids_arg && prompt) return cli_usage_error("run: give a PROMPT or --prompt-ids, not both");
    int32_t *ids = NULL;
    int n = 0;
    if (ids_arg && cli_parse_ids(ids_arg, &ids, &n)) return cli_usage_error("run: --prompt-ids wants comma-separated token ids");
    char *input = NULL;
    if (!ids_arg && !prompt) {
        if (!(input = read_stdin())) {
            fprintf(stderr, "lmx: out of memory\n");
            return 1;
        }
        prompt = input;
    }
    lmx_model *m = cli_load(path, &o);
    int rc = 1, first = 1;
    if (m) {
        lmx_result r;
        lmx_status st;
        if (ids) {
            o.gen.on_token = print_id;
            o.gen.user = &first;
            st = lmx_generate_ids(m, ids, n, &o.gen, &r);
            if (st == LMX_OK && (r.finish == LMX_FINISH_EOS || r.finish == LMX_FINISH_STOP_TOKEN))
                printf("%s%d", first ? "" : " ", r.finish_id);
        } else {
            o.gen.on_token = cli_print_token;
            st = lmx_generate(m, prompt, &o.gen, &r);
        }
        if (st == LMX_OK) {
            printf("\n");
            cli_report(m, &o, &r);
            rc = 0;
        } else {
            fflush(stdout);
            fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
        }
    }
    lmx_model_free(m);
    free(ids);
    free(input);
    return rc;
}
