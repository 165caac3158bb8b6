/* check.h - minimal test assertions.  A failed CHECK prints file:line and the expression, and
 * counts a failure; test programs end with `return check_summary("name");`, which prints
 * "name: N checks, M failed" and returns nonzero when anything failed. */
#ifndef LMX_TESTS_CHECK_H
#define LMX_TESTS_CHECK_H

#include <stdio.h>
#include <string.h>

static int check_n_total, check_n_failed;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        check_n_total++;                                                                   \
        if (!(cond)) {                                                                     \
            check_n_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);      \
        }                                                                                  \
    } while (0)

#define CHECK_MSG(cond, ...)                                                               \
    do {                                                                                   \
        check_n_total++;                                                                   \
        if (!(cond)) {                                                                     \
            check_n_failed++;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fprintf(stderr, "\n");                                                         \
        }                                                                                  \
    } while (0)

#define CHECK_CONTAINS(haystack, needle)                                                   \
    CHECK_MSG(strstr((haystack), (needle)) != NULL, "\"%s\" does not contain \"%s\"",      \
              (haystack), (needle))

static inline int check_summary(const char *name) {
    printf("%s: %d checks, %d failed\n", name, check_n_total, check_n_failed);
    return check_n_failed ? 1 : 0;
}

#endif
