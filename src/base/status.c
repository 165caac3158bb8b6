/* status.c - status names and the per-owner error message (lmx_err).
 *
 * Messages are formatted into a local buffer first, so a message may quote err->msg itself, then
 * escaped into err->msg (one line of valid UTF-8, see status.h). */
#include "status.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- escaping --------------------------------------------------------------------------------- */
/* Length of the valid UTF-8 sequence at s (n bytes left) and its code point, or 0 when the byte at s
 * does not start one (stray continuation, overlong form, surrogate, beyond U+10FFFF, cut short). */
static size_t utf8_seq(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1fu : len == 3 ? c & 0x0fu : c & 0x07u;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        v = (v << 6) | (s[i] & 0x3fu);
    }
    if ((len == 3 && (v < 0x800 || (v >= 0xd800 && v <= 0xdfff))) || (len == 4 && (v < 0x10000 || v > 0x10ffff)))
        return 0;
    *cp = v;
    return len;
}

/* Append s[0, n) to out[*len...] escaped, keeping *len + 1 <= limit (room for a NUL); quotes: also
 * escape '"' and '\'.  Stops before a piece that does not fit; returns the input bytes consumed. */
static size_t escape_into(char *out, size_t limit, size_t *len, const char *s, size_t n, int quotes) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        char piece[12];
        size_t pn, used;
        uint32_t cp = 0;
        size_t sl = utf8_seq(u + i, n - i, &cp);
        if (sl == 0) {
            pn = (size_t)snprintf(piece, sizeof piece, "\\x%02x", u[i]);
            used = 1;
        } else if (cp == '\n' || cp == '\r' || cp == '\t' || (quotes && (cp == '"' || cp == '\\'))) {
            piece[0] = '\\';
            piece[1] = cp == '\n' ? 'n' : cp == '\r' ? 'r' : cp == '\t' ? 't' : (char)cp;
            pn = 2;
            used = 1;
        } else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) {
            pn = (size_t)snprintf(piece, sizeof piece, "\\u%04x", (unsigned)cp);
            used = sl;
        } else {
            memcpy(piece, s + i, sl);
            pn = used = sl;
        }
        if (*len + pn + 1 > limit) break;
        memcpy(out + *len, piece, pn);
        *len += pn;
        i += used;
    }
    return i;
}

/* err->msg = text escaped (control characters etc.; quotes kept), cut to fit. */
static void set_msg(lmx_err *err, const char *text) {
    size_t len = 0;
    escape_into(err->msg, sizeof err->msg, &len, text, strlen(text), 0);
    err->msg[len] = '\0';
}

const char *lmx_quote(char *buf, size_t cap, const char *s, size_t n) {
    if (!buf) return "";
    if (cap < 8) {
        if (cap) buf[0] = '\0';
        return buf;
    }
    if (!s) n = 0;
    size_t len = 0;
    buf[len++] = '"';
    size_t used = escape_into(buf, cap - 4, &len, s ? s : "", n, 1); /* room for "..." after the quote */
    buf[len++] = '"';
    if (used < n) {
        memcpy(buf + len, "...", 3);
        len += 3;
    }
    buf[len] = '\0';
    return buf;
}

const char *lmx_quote_str(char *buf, size_t cap, const char *s) { return lmx_quote(buf, cap, s, s ? strlen(s) : 0); }

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
    set_msg(err, buf);
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
    set_msg(err, buf);
    return err->status;
}

void lmx_err_clear(lmx_err *err) {
    if (!err) return;
    err->status = LMX_OK;
    err->msg[0] = '\0';
}
