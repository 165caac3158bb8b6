/* generate.c - see generate.h. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_parse_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *o) {
    const char *a = argv[*i];
    int *dst = !strcmp(a, "--threads") ? &o->threads : !strcmp(a, "--ctx") ? &o->n_ctx
             : !strcmp(a, "--max-tokens") ? &o->max_tokens : NULL;
    if (!dst && strcmp(a, "--backend")) return 0;
    if (*i + 1 >= argc) return 0; /* the caller reports the missing value */
    const char *v = argv[++*i];
    if (!dst) {
        o->backend = v;
        return 1;
    }
    if (cli_parse_int(v, dst)) {
        cli_usage_error("%s: bad %s", cmd, a);
        return -1;
    }
    return 1;
}

int cli_greedy(lmx_model *m, int n_ctx, const int32_t *ids, int n, int max_tokens, const int32_t *stop,
               int n_stop, int emit_stop, cli_emit_fn emit, void *user) {
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = n_ctx;
    lmx_context *c = NULL;
    float *logits = malloc((size_t)in.vocab_size * sizeof *logits);
    int rc = -1;
    if (!logits) {
        fprintf(stderr, "lmx: out of memory\n");
        return -1;
    }
    if (lmx_context_create(m, &cp, &c) != LMX_OK || lmx_context_eval(c, ids, n, logits, 0) != LMX_OK) goto fail;
    for (int g = 0; g < max_tokens; g++) {
        int32_t best = 0;
        for (int v = 1; v < in.vocab_size; v++)
            if (logits[v] > logits[best]) best = v;
        int end = 0;
        for (int s = 0; s < n_stop; s++) end |= best == stop[s];
        if (!end || emit_stop) emit(best, g, user);
        if (end || g + 1 == max_tokens) break;
        if (lmx_context_eval(c, &best, 1, logits, 0) != LMX_OK) goto fail;
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
done:
    lmx_context_free(c);
    free(logits);
    return rc;
}
