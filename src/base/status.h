/* status.h - internal error handling: a status code plus a message kept by its owner.
 *
 * Every handle that can fail embeds an lmx_err.  Internal functions take an lmx_err* and
 * return lmx_status; on failure they fill the message with lmx_err_set(), which returns the
 * status so that `return lmx_err_set(err, LMX_ERR_IO, "...")` reads naturally.
 *
 * A message is one line of valid UTF-8: lmx_err_set and lmx_err_prefix escape what the formatted
 * text would otherwise carry (control characters, C1 controls, U+2028/U+2029, bytes that are not
 * UTF-8; see lmx_quote), whatever the arguments held.  Content taken from a file (a token, a tensor
 * name, a config value) is quoted with lmx_quote, which also escapes quotes and backslashes and
 * shortens long content, so the quote cannot be misread and the rest of the message survives.
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

/* Buffer size for one lmx_quote of a short piece of file content (a name, a token). */
#define LMX_QUOTE_MAX 96

/* s[0, n) (file content, any bytes) as a quoted string for a message, in buf (cap >= 8):
 * "..." with \" \\ \n \r \t, \u00XX for other control characters (C0, DEL, C1) and \u2028
 * \u2029, \xNN for each byte that is not part of valid UTF-8; other characters are kept as they are.
 * When the whole does not fit, the quote holds a prefix (never a cut character or escape) and ...
 * follows the closing quote.  s may be NULL (n ignored: ""). Returns buf. */
const char *lmx_quote(char *buf, size_t cap, const char *s, size_t n);
/* lmx_quote of a NUL-terminated string (NULL: ""). */
const char *lmx_quote_str(char *buf, size_t cap, const char *s);
/* The same into a buffer that lives until the end of the enclosing block, for use as an argument:
 *   return lmx_err_set(err, LMX_ERR_FORMAT, "unknown type %s", LMX_QUOTED(type)); */
#define LMX_QUOTED(s) lmx_quote_str((char[LMX_QUOTE_MAX]){0}, LMX_QUOTE_MAX, (s))
#define LMX_QUOTED_N(s, n) lmx_quote((char[LMX_QUOTE_MAX]){0}, LMX_QUOTE_MAX, (s), (n))

#endif
