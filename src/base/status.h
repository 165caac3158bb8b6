/* status.h - internal error handling: a status code plus a message kept by its owner.
 *
 * Every handle that can fail embeds an lmx_err.  Internal functions take an lmx_err* and
 * return lmx_status; on failure they fill the message with lmx_err_set(), which returns the
 * status so that `return lmx_err_set(err, LMX_ERR_IO, "...")` reads naturally.
 */
#ifndef LMX_BASE_STATUS_H
#define LMX_BASE_STATUS_H

#include "lmx.h"

#define LMX_ERR_MSG_MAX 512

typedef struct lmx_err {
    lmx_status status;
    char msg[LMX_ERR_MSG_MAX];
} lmx_err;

/* Record status and a printf-style message in err (which may be NULL); returns status. */
lmx_status lmx_err_set(lmx_err *err, lmx_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Prefix the message already in err with "<fmt>: "; returns err->status. */
lmx_status lmx_err_prefix(lmx_err *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

void lmx_err_clear(lmx_err *err);

#endif
