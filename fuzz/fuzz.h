/* fuzz.h - what the harnesses share: the libFuzzer entry points, a private scratch directory for
 * parsers that read files, and the checks every harness makes on the library's answers.
 *
 * A harness is one small program: LLVMFuzzerTestOneInput feeds the bytes to a library entry point
 * (through a file in the scratch directory where the entry point takes a path).  It is linked either
 * with libFuzzer (clang, -fsanitize=fuzzer) or with driver.c, lmx's own mutation driver.  Beyond the
 * sanitizers, a harness aborts (a crash the fuzzer reports and keeps) when the library breaks one of
 * its promises: a failure must come with a one-line message (status.h), a success with consistent
 * results.  Harness code may abort; the library never does. */
#ifndef LMX_FUZZ_FUZZ_H
#define LMX_FUZZ_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/status.h"
#include "../tests/one_line.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Each harness uses some of these helpers; the rest must not warn. */
#define FZ_HELPER __attribute__((unused)) static

#define FZ_MAX_FILES 8

static char fz_dir_path[256];
static char fz_files[FZ_MAX_FILES][64];
static int fz_n_files;

FZ_HELPER void fz_cleanup(void) {
    char p[512];
    for (int i = 0; i < fz_n_files; i++) {
        if (snprintf(p, sizeof p, "%s/%s", fz_dir_path, fz_files[i]) < (int)sizeof p) unlink(p);
    }
    if (fz_dir_path[0]) rmdir(fz_dir_path);
}

/* The harness's scratch directory (made on first use, removed at exit). */
FZ_HELPER const char *fz_dir(void) {
    if (!fz_dir_path[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fz_dir_path, sizeof fz_dir_path, "%s/lmx_fuzz_XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fz_dir_path)) {
            perror("lmx fuzz: mkdtemp");
            abort();
        }
        atexit(fz_cleanup);
    }
    return fz_dir_path;
}

/* dir/name, in a buffer of its own per name. */
FZ_HELPER const char *fz_path(const char *name) {
    static char paths[FZ_MAX_FILES][512];
    int i = 0;
    while (i < fz_n_files && strcmp(fz_files[i], name)) i++;
    if (i == fz_n_files) {
        if (fz_n_files == FZ_MAX_FILES || strlen(name) >= sizeof fz_files[0]) abort();
        snprintf(fz_files[fz_n_files++], sizeof fz_files[0], "%s", name);
    }
    snprintf(paths[i], sizeof paths[i], "%s/%s", fz_dir(), name);
    return paths[i];
}

/* Write n bytes to dir/name (replacing it); returns the path. */
FZ_HELPER const char *fz_write(const char *name, const void *data, size_t n) {
    const char *p = fz_path(name);
    lmx_err err = {0};
    if (lmx_write_file(p, data, n, &err)) {
        fprintf(stderr, "lmx fuzz: writing the input: %s\n", err.msg);
        abort();
    }
    return p;
}

FZ_HELPER void fz_remove(const char *name) { unlink(fz_path(name)); }

/* A NUL-terminated copy of n bytes (free it). */
FZ_HELPER char *fz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (!s) abort();
    if (n) memcpy(s, data, n);
    s[n] = 0;
    return s;
}

/* Inputs made of two parts: the bytes before the first NUL, and those after it (*rest, *rest_n;
 * rest NULL when there is no NUL). */
FZ_HELPER size_t fz_split(const uint8_t *data, size_t size, const uint8_t **rest, size_t *rest_n) {
    const uint8_t *z = size ? memchr(data, 0, size) : NULL;
    *rest = z ? z + 1 : NULL;
    *rest_n = z ? size - (size_t)(z + 1 - data) : 0;
    return z ? (size_t)(z - data) : size;
}

/* A failed call must name a known status and say why on one line. */
FZ_HELPER void fz_check_status(const char *what, lmx_status s, const char *msg) {
    if (s == LMX_OK) return;
    if (!strcmp(lmx_status_str(s), "unknown status") || !msg || !msg[0] || !one_line_utf8(msg)) {
        fprintf(stderr, "lmx fuzz: %s failed with status %d and a bad message: [%s]\n", what, (int)s, msg ? msg : "(null)");
        abort();
    }
}

/* A harness's own invariant. */
#define FZ_ASSERT(cond)                                                                  \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "lmx fuzz: %s:%d: %s does not hold\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#endif
