/* jinja.h - a Jinja template engine: the subset of jinja2 that chat templates use, configured
 * like HF transformers' environment (trim_blocks, lstrip_blocks, ImmutableSandboxedEnvironment,
 * loop controls, raise_exception, strftime_now, transformers' tojson).
 *
 * Supported: {{ }}, {% %}, {# #}, whitespace control (- and +), raw; statements if/elif/else,
 * for (loop.index, index0, revindex, revindex0, first, last, length, previtem, nextitem, cycle;
 * `for x in xs if cond`; else; break/continue), set (names, tuples, ns.attr, block form),
 * macro, generation; Python literals, operators, filters, tests and str/dict methods (see
 * jinja_filters.c and jinja_methods.c).  Undefined values behave like jinja2's default
 * Undefined.  Every loop and recursion is bounded (jinja_internal.h).
 *
 * Thread safety: a parsed template is immutable; several threads may render it at once. */
#ifndef LMX_TOKENIZER_JINJA_H
#define LMX_TOKENIZER_JINJA_H

#include <stddef.h>

#include "base/status.h"

typedef struct lmx_jinja lmx_jinja;
struct cJSON;

/* Parse a template of len bytes.  On success *out owns it (free with lmx_jinja_free).  Syntax
 * errors, unknown filters and unknown tests fail with LMX_ERR_FORMAT and a message that names
 * the line and column. */
lmx_status lmx_jinja_parse(const char *src, size_t len, lmx_jinja **out, lmx_err *err);

/* Render with the members of vars (a cJSON object, or NULL) as the template's variables.
 * On success *out is a malloc'ed NUL-terminated string the caller frees.  Failures:
 * LMX_ERR_INVALID_ARG with "template error at line N: ..." for runtime errors, or with the
 * message itself for raise_exception(message); LMX_ERR_NOMEM past the memory limits. */
lmx_status lmx_jinja_render(const lmx_jinja *t, const struct cJSON *vars, char **out,
                            lmx_err *err);

void lmx_jinja_free(lmx_jinja *t);

#endif
