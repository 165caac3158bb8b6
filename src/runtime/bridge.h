/* bridge.h - the mlx_lm backend (internal): a model whose generation runs in a child Python
 * process with mlx-lm (src/runtime/mlx_lm_bridge.py, embedded at build time), spoken to in JSON
 * Lines over a socket pair on the child's stdin / stdout.  One request at a time per child; the
 * child is ended when the model is freed and on any protocol error (a malformed reply, a crash,
 * a timeout), and the next request starts a fresh one.
 *
 * Environment: LMX_PYTHON (default "python3") names the interpreter; LMX_MLX_LM_TIMEOUT_MS bounds
 * the wait for each reply line (default 300000; loading waits twice that). */
#ifndef LMX_RUNTIME_BRIDGE_H
#define LMX_RUNTIME_BRIDGE_H

#include "lmx.h"

typedef struct lmx_bridge lmx_bridge;

/* The backend name that selects the bridge (lmx_load_params.backend). */
#define LMX_BRIDGE_BACKEND "mlx_lm"

/* lmx_model_load for backend "mlx_lm": start the child and load path there. */
lmx_status lmx_bridge_model_load(const char *path, const lmx_load_params *p, lmx_model **out);
/* End the child (reaped) and remove the script file. */
void lmx_bridge_free(lmx_bridge *b);
lmx_status lmx_bridge_get_info(const lmx_model *m, lmx_model_info *out);

/* The stream calls for a bridge model (stream.c dispatches here after its checks): exactly one of
 * prompt, ids (n) or msgs (n) is given. */
lmx_status lmx_bridge_stream_open(lmx_model *m, const char *prompt, const int32_t *ids, const lmx_message *msgs,
                                  int n, const lmx_gen_params *p, lmx_stream **out);
lmx_status lmx_bridge_stream_next(lmx_stream *s, const lmx_token **tok);
/* Stop an unfinished generation (the child is told to cancel and drained, or ended). */
void lmx_bridge_stream_stop(lmx_stream *s);

/* The child's process id (0: none running), for tests. */
long lmx_bridge_child_pid(const lmx_model *m);

#endif
