/* info.c - `lmx info MODEL`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"

int cmd_info(int argc, char **argv) {
    const char *path = NULL, *adapter = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help")) {
            printf("usage: lmx info MODEL [--adapter DIR]\n\nPrint the architecture, sizes and weight dtype of a model "
                   "directory;\nwith --adapter, also the LoRA adapter's format, rank, targets, scale and parameters.\n");
            return 0;
        }
        if (!strcmp(argv[i], "--adapter")) {
            if (i + 1 >= argc) return cli_usage_error("info: --adapter needs a value");
            adapter = argv[++i];
            continue;
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
    if (adapter) {
        lmx_adapter *a = NULL;
        lmx_adapter_info ai;
        if (lmx_adapter_load(m, adapter, &a) != LMX_OK || lmx_adapter_get_info(a, &ai) != LMX_OK) {
            fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
            lmx_model_free(m);
            return 1;
        }
        printf("adapter       %s (%s)\nrank          %d\nscale         %g%s\ntargets       %s\n"
               "layers        %d..%d (%d projections)\nadapter params %lld\n",
               ai.path, ai.format, ai.rank, ai.scale, ai.scales_differ ? " (first; others differ)" : "", ai.targets,
               ai.first_layer, ai.last_layer, ai.n_modules, (long long)ai.n_params);
    }
    lmx_model_free(m);
    return 0;
}
