/* info.c - `lmx info MODEL`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"

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
    lp.backend = "cpu"; /* reading what a model is needs no device */
    lp.n_threads = 1;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        return 1;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    printf("architecture  %s\nbackend       %s\ndtype         %s\nparameters    %lld\n"
           "weight bytes  %lld\nlayers        %d\nhidden        %d\nheads         %d (kv %d, dim %d)\n"
           "ffn           %d\nvocab         %d\ncontext       %d\nmemory        %lld bytes\n",
           in.architecture, in.backend, in.dtype, (long long)in.n_params, (long long)in.weight_bytes,
           in.n_layers, in.hidden_size, in.n_heads, in.n_kv_heads, in.head_dim, in.ffn_size,
           in.vocab_size, in.max_context, (long long)in.memory_bytes);
    lmx_model_free(m);
    return 0;
}
