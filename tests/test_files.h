/* test_files.h - shared helpers of the model tests: fixture paths, scratch directories made per
 * case and removed after it, and integer tensors of a reference file.  Include after check.h;
 * a test sets g_fixtures from argv[1] or LMX_FIXTURES. */
#ifndef LMX_TESTS_TEST_FILES_H
#define LMX_TESTS_TEST_FILES_H

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/half.h"
#include "formats/safetensors.h"

/* Each test uses some of these helpers; the rest must not warn. */
#define TEST_HELPER __attribute__((unused)) static

TEST_HELPER const char *g_fixtures = "../shared/fixtures";

TEST_HELPER char *fixture(const char *model, const char *file) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s/models/%s%s%s", g_fixtures, model, file ? "/" : "", file ? file : "");
    return strdup(buf);
}

/* The test data folder sub: LMX_TESTS_DATA/sub when set, else tests/data/sub next to this header. */
TEST_HELPER void test_data_dir(char *out, size_t n, const char *sub) {
    const char *env = getenv("LMX_TESTS_DATA"), *f = __FILE__, *slash = strrchr(f, '/');
    if (env && *env) snprintf(out, n, "%s/%s", env, sub);
    else snprintf(out, n, "%.*s/data/%s", slash ? (int)(slash - f) : 1, slash ? f : ".", sub);
}

TEST_HELPER char *case_dir(const char *tag) {
    char buf[256];
    snprintf(buf, sizeof buf, "/tmp/lmx_test_%s_XXXXXX", tag);
    CHECK_MSG(mkdtemp(buf) != NULL, "mkdtemp %s failed", buf);
    return strdup(buf);
}

TEST_HELPER void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = lmx_path_join(path, e->d_name);
            if (p) remove_tree(p);
            free(p);
        }
        if (d) closedir(d);
        CHECK(rmdir(path) == 0);
    } else {
        CHECK(unlink(path) == 0);
    }
}

TEST_HELPER void end_case(char *dir) {
    remove_tree(dir);
    free(dir);
}


/* Write n bytes to path (a failed check if that fails). */
TEST_HELPER void write_file(const char *path, const void *data, size_t n) {
    lmx_err err = {0};
    CHECK_MSG(lmx_write_file(path, data, n, &err) == LMX_OK, "%s", err.msg);
}

/* A call that must fail: status got == want, its out-parameter cleared (out_null), a message msg
 * holding w1 and w2 (either may be NULL).  Returns 1 when the call did fail (whether as wanted or
 * not), 0 when it succeeded. */
TEST_HELPER int check_failed(const char *label, lmx_status got, lmx_status want, int out_null, const char *msg,
                             const char *w1, const char *w2) {
    CHECK_MSG(got == want, "%s: got \"%s\" (%s), want \"%s\"", label, lmx_status_str(got), msg, lmx_status_str(want));
    if (got == LMX_OK) return 0;
    CHECK_MSG(out_null, "%s: *out not cleared on failure", label);
    CHECK_MSG(msg && *msg, "%s: no message", label);
    if (w1) CHECK_CONTAINS(msg, w1);
    if (w2) CHECK_CONTAINS(msg, w2);
    if (getenv("LMX_TEST_VERBOSE")) printf("  %-34s %-18s %s\n", label, lmx_status_str(got), msg);
    return 1;
}

/* max |out - ref| / (2e-3 + 1e-3 max|ref|) over a row of V logits: <= 1 within the fixtures' f32
 * tolerance (NaN counts as infinite).  ref: V f32 values at any alignment (a reference file's data). */
TEST_HELPER double f32_tol_ratio(const float *out, const void *ref, int V) {
    double max_ref = 0, max_err = 0;
    for (int v = 0; v < V; v++) {
        double x = lmx_float_at(ref, LMX_DTYPE_F32, v), e = fabs((double)out[v] - x);
        if (!(e == e)) e = INFINITY;
        if (fabs(x) > max_ref) max_ref = fabs(x);
        if (e > max_err) max_err = e;
    }
    return max_err / (2e-3 + 1e-3 * max_ref);
}

/* An I32 reference tensor as a fresh int32 array (caller frees); a failed check and NULL if absent. */
TEST_HELPER int32_t *ref_ints(const lmx_st_set *s, const char *name, int64_t *n) {
    const lmx_st_tensor *t = s ? lmx_st_set_find(s, name) : NULL;
    CHECK_MSG(t && t->dtype == LMX_DTYPE_I32, "reference %s missing or not I32", name);
    if (!t || t->dtype != LMX_DTYPE_I32) return NULL;
    int32_t *out = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof *out);
    if (out && t->n_elements) memcpy(out, t->data, (size_t)t->n_elements * sizeof *out);
    *n = t->n_elements;
    return out;
}

#endif
