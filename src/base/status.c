/* status.c - status names and the per-owner error message (lmx_err).
 *
 * Messages are formatted into a local buffer first, so a message may quote err->msg itself. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *lmx_status_str(lmx_status s) {
    switch (s) {
    case LMX_OK: return "ok";
    case LMX_ERR_INVALID_ARG: return "invalid argument";
    case LMX_ERR_IO: return "I/O error";
    case LMX_ERR_FORMAT: return "malformed file";
    case LMX_ERR_UNSUPPORTED: return "unsupported";
    case LMX_ERR_MISSING: return "missing";
    case LMX_ERR_SHAPE: return "wrong shape";
    case LMX_ERR_NOMEM: return "out of memory";
    case LMX_ERR_BACKEND: return "backend error";
    case LMX_ERR_CONTEXT_FULL: return "context full";
    }
    return "unknown status";
}

lmx_status lmx_err_set(lmx_err *err, lmx_status status, const char *fmt, ...) {
    if (!err) return status;
    char buf[LMX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) buf[0] = '\0';
    err->status = status;
    memcpy(err->msg, buf, sizeof buf);
    err->msg[LMX_ERR_MSG_MAX - 1] = '\0';
    return status;
}

lmx_status lmx_err_prefix(lmx_err *err, const char *fmt, ...) {
    /* Without an err there is no status to return; report that the call itself was misused. */
    if (!err) return LMX_ERR_INVALID_ARG;
    char prefix[LMX_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0) prefix[0] = '\0';
    /* "<prefix>: <old message>", cut to fit. */
    char buf[LMX_ERR_MSG_MAX];
    const char *parts[3] = {prefix, ": ", err->msg};
    size_t len = 0;
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(parts[i]);
        if (k > sizeof buf - 1 - len) k = sizeof buf - 1 - len;
        memcpy(buf + len, parts[i], k);
        len += k;
    }
    buf[len] = '\0';
    memcpy(err->msg, buf, len + 1);
    return err->status;
}

void lmx_err_clear(lmx_err *err) {
    if (!err) return;
    err->status = LMX_OK;
    err->msg[0] = '\0';
}
