/* generate.h - what `lmx run` and `lmx chat` share: the model/sampling options, loading with a
 * progress bar, streaming tokens to stdout and the --json metrics line. */
#ifndef LMX_CLI_GENERATE_H
#define LMX_CLI_GENERATE_H

#include <stdint.h>

#include "lmx.h"

#define CLI_MAX_STOP 16

typedef struct cli_gen_opts {
    const char *backend;   /* --backend (default "auto") */
    const char *adapter;   /* --adapter (NULL: none) */
    int threads;           /* --threads (0: all cores) */
    int n_ctx;             /* --ctx (0: unbounded) */
    int json;              /* --json: metrics as one JSON line on stderr */
    lmx_gen_params gen;    /* --max-tokens, --temp, --top-k, --top-p, --min-p, --repeat-penalty,
                              --presence-penalty, --frequency-penalty, --seed, --stop */
    const char *stops[CLI_MAX_STOP];
} cli_gen_opts;

/* Defaults: backend auto, max_tokens as given, the library's sampler defaults. */
void cli_gen_opts_init(cli_gen_opts *o, int max_tokens);

/* If argv[*i] is one of the options above, consume it (and its value) and return 1; return 0 when
 * it is not; print a usage error for a bad value and return -1 (the command then exits 2). */
int cli_parse_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *o);

/* The option lines of --help for the options above. */
extern const char cli_gen_opts_help[];

/* Load the model with the options (a progress bar on a terminal); NULL after printing the error. */
lmx_model *cli_load(const char *path, const cli_gen_opts *o);

/* A token callback that writes the token's text to stdout (flushing). */
int cli_print_token(const lmx_token *t, void *user);

/* With --json, print the last call's metrics and finish reason as one JSON line on stderr. */
void cli_report(lmx_model *m, const cli_gen_opts *o, const lmx_result *r);

#endif
