/* generate.h - what `lmx run` and `lmx chat` share: the model/context options and the greedy loop. */
#ifndef LMX_CLI_GENERATE_H
#define LMX_CLI_GENERATE_H

#include <stdint.h>

#include "lmx.h"

typedef struct cli_gen_opts {
    const char *backend;   /* --backend (default "auto") */
    int threads;           /* --threads (0: all cores) */
    int n_ctx;             /* --ctx (0: unbounded) */
    int max_tokens;        /* --max-tokens */
} cli_gen_opts;

/* If argv[*i] is one of the options above, consume it (and its value) and return 1; return 0 when
 * it is not; print a usage error for a bad value and return -1 (the command then exits 2). */
int cli_parse_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *o);

/* Called for each generated id (index counts from 0). */
typedef void (*cli_emit_fn)(int32_t id, int index, void *user);

/* Prefill ids in a fresh context, then decode greedily up to max_tokens ids.  An id in stop[] ends
 * the generation; it is passed to emit only when emit_stop is set.  0, or -1 after printing the
 * error. */
int cli_greedy(lmx_model *m, int n_ctx, const int32_t *ids, int n, int max_tokens, const int32_t *stop,
               int n_stop, int emit_stop, cli_emit_fn emit, void *user);

#endif
