/* cli.h - the lmx command's subcommands.  Each returns the process exit code:
 * 0 success, 1 failure (a check failed, a model did not load), 2 bad arguments. */
#ifndef LMX_CLI_CLI_H
#define LMX_CLI_CLI_H

int cmd_check_reference(int argc, char **argv);
int cmd_check_train(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_template(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_fuse(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_discover(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_train(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_inspect(int argc, char **argv);

#include <stdint.h>
#include <time.h>
/* Seconds on the monotonic clock (timings of bench and train). */
static inline double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
/* The next value of a xorshift64 state (bench's and train's random ids and shuffles). */
static inline uint64_t cli_xorshift(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}
/* The median of v[0..n) (n > 0; v is sorted in place). */
double cli_median(double *v, int n);
/* check-reference against a compact top-k JSON reference (check_topk.c); returns the exit code. */
struct lmx_model;
int cli_check_topk(struct lmx_model *m, const char *ref_path, double tol, int n_ctx);

/* A YAML config (one mapping of keys to scalars or lists of scalars, yaml_config.c) as a JSON object;
 * NULL with msg ("line N: ...") when it is not one. */
#include <stddef.h>
#include <cjson/cJSON.h>
cJSON *cli_yaml_object(const char *text, size_t len, char *msg, size_t cap);
/* OUT/loss.png of `lmx train`: png drawn from metrics csv by matplotlib (plot.c); 0 when drawn. */
int cli_plot_loss(const char *csv, const char *png, const char *title);
/* Print "lmx: <msg>" to stderr; returns 2 (the bad-arguments exit code). */
int cli_usage_error(const char *fmt, ...);
/* Parse a positive int option value; returns 0 on success. */
int cli_parse_int(const char *s, int *out);
/* Comma-separated non-negative ints ("1,5,9": --prompt-ids, --layers) into a malloc'ed *out of *n; 0, or -1 for
 * an empty or malformed list. */
int cli_parse_ids(const char *s, int32_t **out, int *n);
/* --grad-checkpoint's value: on 1, off 0, auto -1 (the trainer's checkpoint field); returns 0 on success. */
int cli_parse_checkpoint(const char *s, int *out);
/* An on|off option's value: on 1, off 0; returns 0 on success. */
int cli_parse_onoff(const char *s, int *out);
/* --replay's value: on (*replay 1, *qkv 1), outputs (1, 0: the attention block's outputs taken back, not its
 * q, k, v) or off (0, 0); returns 0 on success. */
int cli_parse_replay(const char *s, int *replay, int *qkv);

#endif
