/* tok_utf8.c - UTF-8 helpers for the tokenizer: validation, lossy repair with Rust's
 * from_utf8_lossy rules (one U+FFFD per maximal invalid subpart), incomplete-tail detection for
 * streaming, White_Space, and the GPT-2 byte-level alphabet. */
#include <string.h>

#include "tokenizer/tok_internal.h"

size_t lmx_tok_utf8_len(unsigned char c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 1;
}

/* Valid range of the second byte after lead byte c (Unicode Table 3-7); 0 when c is no lead. */
static int second_range(unsigned char c, unsigned char *lo, unsigned char *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c == 0xE0) { *lo = 0xA0; return 3; }
    if (c == 0xED) { *hi = 0x9F; return 3; }
    if (c >= 0xE1 && c <= 0xEF) return 3;
    if (c == 0xF0) { *lo = 0x90; return 4; }
    if (c == 0xF4) { *hi = 0x8F; return 4; }
    if (c >= 0xF1 && c <= 0xF3) return 4;
    return 0;
}

/* Length of the valid sequence at s (0 if invalid); *bad gets the maximal subpart length. */
static size_t seq_check(const unsigned char *s, size_t n, size_t *bad) {
    unsigned char lo, hi;
    int L = second_range(s[0], &lo, &hi);
    *bad = 1;
    if (!L) return 0;
    if (n < 2 || s[1] < lo || s[1] > hi) return 0;
    for (int k = 2; k < L; k++) {
        if ((size_t)k >= n || (s[k] & 0xC0) != 0x80) {
            *bad = (size_t)k;
            return 0;
        }
    }
    return (size_t)L;
}

int lmx_tok_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, L = seq_check(s + i, n - i, &bad);
        if (!L) return 0;
        i += L;
    }
    return 1;
}

int lmx_tok_utf8_lossy(const char *str, size_t n, lmx_tok_buf *out) {
    const unsigned char *s = (const unsigned char *)str;
    if (lmx_tok_buf_reserve(out, n)) return -1;
    size_t i = 0, run = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t bad, L = seq_check(s + i, n - i, &bad);
        if (L) {
            i += L;
            continue;
        }
        if (lmx_tok_buf_put(out, str + run, i - run) || lmx_tok_buf_put(out, "\xEF\xBF\xBD", 3))
            return -1;
        i += bad;
        run = i;
    }
    return lmx_tok_buf_put(out, str + run, n - run);
}

size_t lmx_tok_utf8_incomplete_tail(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        const unsigned char *p = s + n - k;
        unsigned char lo, hi;
        int L = second_range(p[0], &lo, &hi);
        if (!L) {
            if ((p[0] & 0xC0) == 0x80) continue;   /* a continuation byte: look further back */
            return 0;
        }
        if ((size_t)L <= k) return 0;   /* complete (or already judged) */
        if (k >= 2 && (p[1] < lo || p[1] > hi)) return 0;
        for (size_t j = 2; j < k; j++)
            if ((p[j] & 0xC0) != 0x80) return 0;
        return k;
    }
    return 0;
}

uint32_t lmx_tok_utf8_decode(const char *str, size_t *len) {
    const unsigned char *s = (const unsigned char *)str;
    size_t L = lmx_tok_utf8_len(s[0]);
    *len = 1;
    if (L == 1) return s[0] < 0x80 ? s[0] : 0xFFFD; /* ASCII, or a byte that leads nothing */
    uint32_t cp = s[0] & (0x7Fu >> L);
    for (size_t i = 1; i < L; i++) { /* stops at the first byte that does not continue (a NUL too) */
        if ((s[i] & 0xC0) != 0x80) return 0xFFFD;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    *len = L;
    return cp;
}

size_t lmx_tok_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

int lmx_tok_is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

void lmx_tok_bytelevel_tables(uint16_t byte_cp[256], int16_t cp_byte[324]) {
    for (int i = 0; i < 324; i++) cp_byte[i] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_cp[b] = (uint16_t)(printable ? b : 256 + extra++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}
