/* one_line.h - whether a message is one printable line: valid UTF-8 without C0/C1 controls, DEL,
 * U+2028 or U+2029 (what base/status.h promises of every error message).  Shared by the error-message
 * tests and the fuzz harnesses. */
#ifndef LMX_TESTS_ONE_LINE_H
#define LMX_TESTS_ONE_LINE_H

#include <stddef.h>
#include <stdint.h>

static inline int one_line_utf8(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; u[i];) {
        unsigned char c = u[i];
        size_t len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
        if (!len) return 0;
        uint32_t cp = len == 1 ? c : len == 2 ? c & 0x1fu : len == 3 ? c & 0x0fu : c & 0x07u;
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xc0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3fu);
        }
        if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) return 0;
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return 0;
        i += len;
    }
    return 1;
}

#endif
