/* test_safetensors.c - the safetensors reader and writer: a fixture model, a round trip, sharded
 * and plain model directories, and one malformed file per validation rule (status and message).
 *
 * Usage: test_safetensors [FIXTURES]   (default: $LMX_FIXTURES).  Scratch files live in a mkdtemp
 * directory under /tmp, removed at the end. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "check.h"
#include "test_files.h"
#include "formats/safetensors.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* A hand-made file: header length hlen (or strlen(json) when hlen < 0), json, data_len bytes. */
static void put_raw(const char *dir, const char *name, const char *json, long long hlen,
                    size_t data_len) {
    size_t jl = strlen(json), n = 8 + jl + data_len;
    uint64_t h = hlen < 0 ? (uint64_t)jl : (uint64_t)hlen;
    unsigned char *buf = malloc(n);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(h >> (8 * i));
    memcpy(buf + 8, json, jl);
    memset(buf + 8 + jl, 0xab, data_len);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    write_file(path, buf, n);
    free(buf);
}

/* A file of F32 [4] tensors {1, 2, 3, 4}, written with lmx_st_write. */
static void put_st(const char *dir, const char *name, const char *const *tensors, int n_tensors) {
    float v[4] = {1, 2, 3, 4};
    lmx_st_write_item items[8];
    memset(items, 0, sizeof items);
    for (int i = 0; i < n_tensors; i++)
        items[i] = (lmx_st_write_item){tensors[i], LMX_DTYPE_F32, 1, {4}, v};
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    lmx_err err;
    lmx_status s = lmx_st_write(path, items, (size_t)n_tensors, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
}

/* Opening dir/name must fail with want; the message names the file and each of words. */
static void expect_open_fail(const char *dir, const char *name, lmx_status want, const char *w1,
                             const char *w2) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    lmx_st_file *f = NULL;
    lmx_err err;
    lmx_err_clear(&err);
    lmx_status s = lmx_st_open(path, &f, &err);
    CHECK_MSG(s == want, "%s: got %s (%s), want %s", name, lmx_status_str(s), err.msg,
              lmx_status_str(want));
    if (s == LMX_OK) {
        lmx_st_close(f);
        return;
    }
    if (getenv("LMX_TEST_VERBOSE")) printf("  %s\n", err.msg);
    CHECK(f == NULL);
    CHECK(err.status == want);
    CHECK_CONTAINS(err.msg, name);
    if (w1) CHECK_CONTAINS(err.msg, w1);
    if (w2) CHECK_CONTAINS(err.msg, w2);
}

static void expect_dir_fail(const char *dir, lmx_status want, const char *w1, const char *w2) {
    lmx_st_set *s = NULL;
    lmx_err err;
    lmx_err_clear(&err);
    lmx_status st = lmx_st_set_open_dir(dir, &s, &err);
    CHECK_MSG(st == want, "%s: got %s (%s), want %s", dir, lmx_status_str(st), err.msg,
              lmx_status_str(want));
    if (st == LMX_OK) {
        lmx_st_set_close(s);
        return;
    }
    if (getenv("LMX_TEST_VERBOSE")) printf("  %s\n", err.msg);
    CHECK(s == NULL);
    if (w1) CHECK_CONTAINS(err.msg, w1);
    if (w2) CHECK_CONTAINS(err.msg, w2);
}

static char *sub(const char *tmp, const char *name) {
    char *p = lmx_path_join(tmp, name);
    CHECK(p && mkdir(p, 0700) == 0);
    return p;
}

/* ---- the fixture model ---------------------------------------------------------------------- */

static void test_fixture(const char *fx) {
    char dir[1024], path[1100], ref[1100];
    snprintf(dir, sizeof dir, "%s/models/llama", fx);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    snprintf(ref, sizeof ref, "%s/reference.safetensors", dir);
    lmx_err err;
    lmx_st_file *f = NULL;
    lmx_status s = lmx_st_open(path, &f, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s != LMX_OK) return;
    const lmx_st_tensor *t = lmx_st_find(f, "model.embed_tokens.weight");
    CHECK(t != NULL);
    if (t) {
        CHECK(t->dtype == LMX_DTYPE_BF16);
        CHECK(t->ndim == 2 && t->shape[0] == 320 && t->shape[1] == 64);
        CHECK(t->n_elements == 320 * 64 && t->nbytes == 320 * 64 * 2);
        CHECK(strcmp(t->file, path) == 0);
    }
    CHECK(lmx_st_find(f, "model.embed_tokens") == NULL);
    CHECK(lmx_st_find(f, "") == NULL);
    const char *fmt = lmx_st_metadata(f, "format");
    CHECK(fmt && strcmp(fmt, "pt") == 0);
    CHECK(lmx_st_metadata(f, "nope") == NULL);
    CHECK(lmx_st_count(f) > 1 && lmx_st_at(f, lmx_st_count(f)) == NULL);
    size_t total = 0;
    for (size_t i = 0; i < lmx_st_count(f); i++) {
        const lmx_st_tensor *ti = lmx_st_at(f, i);
        CHECK(lmx_st_find(f, ti->name) == ti);
        total += ti->nbytes;
    }

    /* The directory (model.safetensors + reference.safetensors, which is skipped). */
    lmx_st_set *set = NULL;
    s = lmx_st_set_open_dir(dir, &set, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        CHECK(lmx_st_set_count(set) == lmx_st_count(f));
        CHECK(lmx_st_set_total_bytes(set) == total);
        CHECK(lmx_st_set_find(set, "short_logits") == NULL);
        for (size_t i = 0; i < lmx_st_count(f); i++) {
            const lmx_st_tensor *a = lmx_st_at(f, i), *b = lmx_st_set_find(set, a->name);
            CHECK_MSG(b != NULL, "%s not in the set", a->name);
            if (!b) continue;
            CHECK(a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
            CHECK(memcmp(a->shape, b->shape, sizeof a->shape) == 0);
            CHECK(memcmp(a->data, b->data, a->nbytes) == 0);
            CHECK(strcmp(b->file, path) == 0);
        }
        lmx_st_set_close(set);
    }

    /* reference.safetensors as a one-file set. */
    s = lmx_st_set_open_file(ref, &set, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        const lmx_st_tensor *sp = lmx_st_set_find(set, "short_prompt");
        CHECK(sp && sp->dtype == LMX_DTYPE_I32 && sp->ndim == 1 && sp->shape[0] == 7);
        CHECK(lmx_st_set_at(set, 0) != NULL && lmx_st_set_at(set, lmx_st_set_count(set)) == NULL);
        lmx_st_set_close(set);
    }
    lmx_st_close(f);
}

/* ---- round trip ----------------------------------------------------------------------------- */

static void test_round_trip(const char *tmp) {
    float a[6] = {1.5f, -2, 3, 0.25f, -0.0f, 1e30f};
    uint16_t bf[4] = {0x3f80, 0xc000, 0x7f80, 0x0001};
    int32_t c[8] = {1, -2, 3, -4, 5, -6, 7, INT32_MIN};
    const char *odd = "we\"ird\\name\n\x01 \xc3\xa9";
    lmx_st_write_item items[] = {
        {"w.f32", LMX_DTYPE_F32, 2, {2, 3}, a},
        {"w.bf16", LMX_DTYPE_BF16, 1, {4}, bf},
        {"w.i32", LMX_DTYPE_I32, 3, {2, 2, 2}, c},
        {"w.empty", LMX_DTYPE_F32, 2, {0, 5}, NULL},
        {odd, LMX_DTYPE_I32, 0, {0}, &c[2]},
    };
    size_t n = sizeof items / sizeof items[0];
    char *path = lmx_path_join(tmp, "round.safetensors");
    lmx_err err;
    lmx_status s = lmx_st_write(path, items, n, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);

    char *raw = NULL;
    size_t raw_n = 0;
    CHECK(lmx_read_file(path, &raw, &raw_n, &err) == LMX_OK);
    if (raw && raw_n >= 8) {
        uint64_t h = 0;
        for (int i = 7; i >= 0; i--) h = (h << 8) | (unsigned char)raw[i];
        CHECK(h % 8 == 0 && raw_n == 8 + h + sizeof a + sizeof bf + sizeof c + 4);
        CHECK(raw[8 + h - 1] == ' ' || raw[8 + h - 1] == '}');
    }
    free(raw);

    lmx_st_file *f = NULL;
    s = lmx_st_open(path, &f, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        CHECK(lmx_st_count(f) == n);
        for (size_t i = 0; i < n && i < lmx_st_count(f); i++) {
            const lmx_st_tensor *t = lmx_st_at(f, i);
            size_t nb = lmx_dtype_size(items[i].dtype);
            for (int d = 0; d < items[i].ndim; d++) nb *= (size_t)items[i].shape[d];
            CHECK(strcmp(t->name, items[i].name) == 0);
            CHECK(t->dtype == items[i].dtype && t->ndim == items[i].ndim && t->nbytes == nb);
            for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == items[i].shape[d]);
            CHECK(nb == 0 || memcmp(t->data, items[i].data, nb) == 0);
            CHECK(lmx_st_find(f, items[i].name) == t);
        }
        const lmx_st_tensor *t = lmx_st_find(f, "w.i32");
        CHECK(t && t->n_elements == 8);
        CHECK(((uintptr_t)lmx_st_at(f, 0)->data) % 8 == 0);
        lmx_st_close(f);
    }

    /* The writer refuses bad input and leaves no file behind. */
    lmx_st_write_item dup[] = {{"x", LMX_DTYPE_F32, 1, {1}, a}, {"x", LMX_DTYPE_F32, 1, {1}, a}};
    char *bad = lmx_path_join(tmp, "bad_write.safetensors");
    CHECK(lmx_st_write(bad, dup, 2, &err) == LMX_ERR_INVALID_ARG);
    lmx_st_write_item neg[] = {{"x", LMX_DTYPE_F32, 1, {-1}, a}};
    CHECK(lmx_st_write(bad, neg, 1, &err) == LMX_ERR_INVALID_ARG);
    CHECK(!lmx_is_file(bad));
    CHECK(lmx_st_write(bad, NULL, 0, &err) == LMX_OK);   /* an empty file "{}" is valid */
    s = lmx_st_open(bad, &f, &err);
    CHECK(s == LMX_OK && lmx_st_count(f) == 0 && lmx_st_find(f, "x") == NULL);
    if (s == LMX_OK) lmx_st_close(f);
    free(bad);
    free(path);
}

/* lmx_st_write_meta: the "__metadata__" strings read back (escaped characters too); bad entries refused. */
static void test_write_meta(const char *tmp) {
    float a[2] = {1, 2};
    lmx_st_write_item items[] = {{"x", LMX_DTYPE_F32, 1, {2}, a}};
    lmx_st_meta meta[] = {{"layers.3.shared_from", "1"}, {"model", "/a \"b\"\\c"}};
    char *path = lmx_path_join(tmp, "meta.safetensors");
    lmx_err err;
    CHECK_MSG(lmx_st_write_meta(path, items, 1, meta, 2, &err) == LMX_OK, "%s", err.msg);
    lmx_st_file *f = NULL;
    CHECK_MSG(lmx_st_open(path, &f, &err) == LMX_OK, "%s", err.msg);
    if (f) {
        CHECK(lmx_st_count(f) == 1 && lmx_st_find(f, "x") && lmx_st_find(f, "x")->n_elements == 2);
        const char *v = lmx_st_metadata(f, "layers.3.shared_from"), *w = lmx_st_metadata(f, "model");
        CHECK(v && !strcmp(v, "1") && w && !strcmp(w, meta[1].value));
        lmx_st_close(f);
    }
    /* metadata and no tensor: still one JSON object */
    CHECK_MSG(lmx_st_write_meta(path, NULL, 0, meta, 1, &err) == LMX_OK, "%s", err.msg);
    CHECK_MSG(lmx_st_open(path, &f, &err) == LMX_OK, "%s", err.msg);
    if (f) {
        const char *v = lmx_st_metadata(f, "layers.3.shared_from");
        CHECK(lmx_st_count(f) == 0 && v && !strcmp(v, "1"));
        lmx_st_close(f);
    }
    char *bad = lmx_path_join(tmp, "bad_meta.safetensors");
    lmx_st_meta twice[] = {{"k", "1"}, {"k", "2"}}, null_value[] = {{"k", NULL}};
    CHECK(lmx_st_write_meta(bad, items, 1, twice, 2, &err) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(err.msg, "given twice");
    CHECK(lmx_st_write_meta(bad, items, 1, null_value, 1, &err) == LMX_ERR_INVALID_ARG);
    CHECK(!lmx_is_file(bad));
    free(bad);
    free(path);
}

/* ---- malformed files ------------------------------------------------------------------------ */

static void test_malformed(const char *tmp) {
    const char *one = "{\"t.ok\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";

    char path[1024];
    snprintf(path, sizeof path, "%s/empty.safetensors", tmp);
    write_file(path, NULL, 0);
    expect_open_fail(tmp, "empty.safetensors", LMX_ERR_FORMAT, NULL, NULL);
    snprintf(path, sizeof path, "%s/short.safetensors", tmp);
    write_file(path, "\x02\0\0\0\0", 5);
    expect_open_fail(tmp, "short.safetensors", LMX_ERR_FORMAT, NULL, NULL);
    expect_open_fail(tmp, "no_such.safetensors", LMX_ERR_IO, NULL, NULL);

    /* Data cut short after writing. */
    const char *tn[] = {"t.trunc"};
    put_st(tmp, "truncated.safetensors", tn, 1);
    snprintf(path, sizeof path, "%s/truncated.safetensors", tmp);
    struct stat st;
    CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 3) == 0);
    expect_open_fail(tmp, "truncated.safetensors", LMX_ERR_FORMAT, "t.trunc", "past the data");

    /* Header lengths that lie. */
    put_raw(tmp, "lying_short.safetensors", one, (long long)strlen(one) - 3, 4);
    expect_open_fail(tmp, "lying_short.safetensors", LMX_ERR_FORMAT, "JSON", NULL);
    put_raw(tmp, "lying_long.safetensors", one, (long long)strlen(one) + 2, 4);
    expect_open_fail(tmp, "lying_long.safetensors", LMX_ERR_FORMAT, "after the header", NULL);
    put_raw(tmp, "hlen_beyond.safetensors", one, 1000, 4);
    expect_open_fail(tmp, "hlen_beyond.safetensors", LMX_ERR_FORMAT, "exceeds", NULL);
    put_raw(tmp, "hlen_absurd.safetensors", one, 1ll << 40, 4);
    expect_open_fail(tmp, "hlen_absurd.safetensors", LMX_ERR_FORMAT, "absurd", NULL);

    /* JSON. */
    put_raw(tmp, "bad_json.safetensors", "{\"t.x\": {\"dtype\": \"F32\", ", -1, 4);
    expect_open_fail(tmp, "bad_json.safetensors", LMX_ERR_FORMAT, "JSON", NULL);
    put_raw(tmp, "not_object.safetensors", "[1, 2]  ", -1, 0);
    expect_open_fail(tmp, "not_object.safetensors", LMX_ERR_FORMAT, "object", NULL);
    put_raw(tmp, "missing_key.safetensors", "{\"t.nokey\":{\"dtype\":\"F32\",\"shape\":[1]}}",
            -1, 4);
    expect_open_fail(tmp, "missing_key.safetensors", LMX_ERR_FORMAT, "t.nokey", "data_offsets");
    put_raw(tmp, "wrong_type.safetensors",
            "{\"t.str\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", -1, 4);
    expect_open_fail(tmp, "wrong_type.safetensors", LMX_ERR_FORMAT, "t.str", "shape");
    put_raw(tmp, "num_dtype.safetensors",
            "{\"t.nd\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4);
    expect_open_fail(tmp, "num_dtype.safetensors", LMX_ERR_FORMAT, "t.nd", "dtype");
    put_raw(tmp, "bad_meta.safetensors", "{\"__metadata__\":{\"format\":1}}", -1, 0);
    expect_open_fail(tmp, "bad_meta.safetensors", LMX_ERR_FORMAT, "__metadata__", "format");
    put_raw(tmp, "dup.safetensors",
            "{\"t.dup\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
            "\"t.dup\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", -1, 8);
    expect_open_fail(tmp, "dup.safetensors", LMX_ERR_FORMAT, "t.dup", "twice");

    /* Tensor entries. */
    put_raw(tmp, "unknown_dtype.safetensors",
            "{\"t.q\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", -1, 4);
    expect_open_fail(tmp, "unknown_dtype.safetensors", LMX_ERR_UNSUPPORTED, "t.q", "Q4");
    put_raw(tmp, "size_mismatch.safetensors",
            "{\"t.mis\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", -1, 24);
    expect_open_fail(tmp, "size_mismatch.safetensors", LMX_ERR_FORMAT, "t.mis", "need 24");
    put_raw(tmp, "out_of_range.safetensors",
            "{\"t.far\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[100,108]}}", -1, 8);
    expect_open_fail(tmp, "out_of_range.safetensors", LMX_ERR_FORMAT, "t.far", "past the data");
    put_raw(tmp, "end_before.safetensors",
            "{\"t.back\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", -1, 8);
    expect_open_fail(tmp, "end_before.safetensors", LMX_ERR_FORMAT, "t.back", "before");
    put_raw(tmp, "overlap.safetensors",
            "{\"t.one\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
            "\"t.two\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", -1, 24);
    expect_open_fail(tmp, "overlap.safetensors", LMX_ERR_FORMAT, "t.one", "t.two");
    put_raw(tmp, "neg_dim.safetensors",
            "{\"t.neg\":{\"dtype\":\"F32\",\"shape\":[-1,2],\"data_offsets\":[0,8]}}", -1, 8);
    expect_open_fail(tmp, "neg_dim.safetensors", LMX_ERR_FORMAT, "t.neg", "negative");
    put_raw(tmp, "frac_dim.safetensors",
            "{\"t.frac\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", -1, 8);
    expect_open_fail(tmp, "frac_dim.safetensors", LMX_ERR_FORMAT, "t.frac", "integer");
    put_raw(tmp, "neg_offset.safetensors",
            "{\"t.nego\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", -1, 8);
    expect_open_fail(tmp, "neg_offset.safetensors", LMX_ERR_FORMAT, "t.nego", "negative");
    put_raw(tmp, "many_dims.safetensors",
            "{\"t.many\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
            -1, 4);
    expect_open_fail(tmp, "many_dims.safetensors", LMX_ERR_UNSUPPORTED, "t.many", "dimensions");
    put_raw(tmp, "overflow.safetensors",
            "{\"t.huge\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
            "\"data_offsets\":[0,4]}}", -1, 4);
    expect_open_fail(tmp, "overflow.safetensors", LMX_ERR_FORMAT, "t.huge", "overflow");

    /* Hand-made valid file: metadata, a zero-size tensor, an 8-dim tensor, space padding. */
    put_raw(tmp, "valid.safetensors",
            "{\"__metadata__\":{\"format\":\"pt\"},"
            "\"t.zero\":{\"dtype\":\"BF16\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
            "\"t.b\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,4],\"data_offsets\":[0,4]}}     ",
            -1, 4);
    snprintf(path, sizeof path, "%s/valid.safetensors", tmp);
    lmx_st_file *f = NULL;
    lmx_err err;
    lmx_status s = lmx_st_open(path, &f, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        CHECK(lmx_st_count(f) == 2 && strcmp(lmx_st_at(f, 0)->name, "t.zero") == 0);
        CHECK(lmx_st_at(f, 0)->nbytes == 0 && lmx_st_at(f, 0)->n_elements == 0);
        CHECK(lmx_st_find(f, "t.b") && lmx_st_find(f, "t.b")->ndim == 8);
        CHECK(lmx_st_metadata(f, "format") && !strcmp(lmx_st_metadata(f, "format"), "pt"));
        lmx_st_close(f);
    }
}

/* ---- directories ---------------------------------------------------------------------------- */

static void put_index(const char *dir, const char *json) {
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    write_file(path, json, strlen(json));
}

static void test_dirs(const char *tmp) {
    const char *s1[] = {"l0.w", "l0.b"}, *s2[] = {"l1.w"}, *x[] = {"l0.w"};
    const char *sh1 = "model-00001-of-00002.safetensors", *sh2 = "model-00002-of-00002.safetensors";
    lmx_err err;
    lmx_st_set *set = NULL;

    /* Plain directory: sorted files, non-weight files skipped. */
    char *plain = sub(tmp, "plain");
    put_st(plain, "b.safetensors", s2, 1);
    put_st(plain, "a.safetensors", s1, 2);
    put_st(plain, "reference.safetensors", x, 1);
    put_st(plain, "adapters.safetensors", x, 1);
    put_st(plain, "adapter_model.safetensors", x, 1);
    char notes[1024];
    snprintf(notes, sizeof notes, "%s/notes.txt", plain);
    write_file(notes, "hi", 2);
    lmx_status s = lmx_st_set_open_dir(plain, &set, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        CHECK(lmx_st_set_count(set) == 3 && lmx_st_set_total_bytes(set) == 48);
        CHECK(!strcmp(lmx_st_set_at(set, 0)->name, "l0.w"));
        CHECK(!strcmp(lmx_st_set_at(set, 2)->name, "l1.w"));
        CHECK(strstr(lmx_st_set_find(set, "l1.w")->file, "b.safetensors") != NULL);
        CHECK(lmx_st_set_find(set, "nope") == NULL);
        lmx_st_set_close(set);
    }

    /* Duplicate names across files; empty and absent directories. */
    char *dup = sub(tmp, "dupdir");
    put_st(dup, "a.safetensors", x, 1);
    put_st(dup, "b.safetensors", x, 1);
    expect_dir_fail(dup, LMX_ERR_FORMAT, "l0.w", "b.safetensors");
    char *empty = sub(tmp, "emptydir");
    expect_dir_fail(empty, LMX_ERR_MISSING, "no *.safetensors file in", "emptydir");
    char *absent = lmx_path_join(tmp, "absent");
    expect_dir_fail(absent, LMX_ERR_IO, "absent", NULL);

    /* Sharded with an index (a stray unlisted file is ignored). */
    char *sharded = sub(tmp, "sharded");
    put_st(sharded, sh1, s1, 2);
    put_st(sharded, sh2, s2, 1);
    put_st(sharded, "stray.safetensors", x, 1);
    put_index(sharded, "{\"metadata\":{\"total_size\":48},\"weight_map\":{"
                       "\"l0.w\":\"model-00001-of-00002.safetensors\","
                       "\"l1.w\":\"model-00002-of-00002.safetensors\","
                       "\"l0.b\":\"model-00001-of-00002.safetensors\"}}");
    s = lmx_st_set_open_dir(sharded, &set, &err);
    CHECK_MSG(s == LMX_OK, "%s", err.msg);
    if (s == LMX_OK) {
        CHECK(lmx_st_set_count(set) == 3);
        const char *names[] = {"l0.w", "l0.b", "l1.w"}, *files[] = {sh1, sh1, sh2};
        for (int i = 0; i < 3; i++) {
            const lmx_st_tensor *t = lmx_st_set_find(set, names[i]);
            CHECK_MSG(t != NULL, "%s not found", names[i]);
            if (t) CHECK_CONTAINS(t->file, files[i]);
            if (t) CHECK(t->nbytes == 16 && ((const float *)t->data)[3] == 4.0f);
        }
        lmx_st_set_close(set);
    }

    /* Bad indexes. */
    char *mt = sub(tmp, "missing_tensor");
    put_st(mt, sh1, s1, 2);
    put_st(mt, sh2, s2, 1);
    put_index(mt, "{\"weight_map\":{\"l0.w\":\"model-00001-of-00002.safetensors\","
                  "\"l1.x\":\"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail(mt, LMX_ERR_MISSING, "l1.x", sh2);
    char *mf = sub(tmp, "missing_shard");
    put_st(mf, sh1, s1, 2);
    put_index(mf, "{\"weight_map\":{\"l0.w\":\"model-00001-of-00002.safetensors\","
                  "\"l1.w\":\"model-00002-of-00002.safetensors\"}}");
    expect_dir_fail(mf, LMX_ERR_MISSING, sh2, "missing_shard");
    char *dd = sub(tmp, "dotdot");
    put_st(dd, sh1, s1, 2);
    put_index(dd, "{\"weight_map\":{\"l0.w\":\"../x.safetensors\"}}");
    expect_dir_fail(dd, LMX_ERR_FORMAT, "../x.safetensors", "l0.w");
    char *bj = sub(tmp, "bad_index");
    put_st(bj, sh1, s1, 2);
    put_index(bj, "{\"weight_map\":");
    expect_dir_fail(bj, LMX_ERR_FORMAT, "model.safetensors.index.json", "bad_index");

    char *all[] = {plain, dup, empty, absent, sharded, mt, mf, dd, bj};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* ---- small units ---------------------------------------------------------------------------- */

static void test_units(void) {
    CHECK(!strcmp(lmx_status_str(LMX_OK), "ok"));
    CHECK(!strcmp(lmx_status_str((lmx_status)999), "unknown status"));
    for (int i = 0; i <= LMX_ERR_CONTEXT_FULL; i++)
        CHECK(strcmp(lmx_status_str((lmx_status)i), "unknown status") != 0);
    lmx_dtype t;
    CHECK(lmx_dtype_from_safetensors("BF16", &t) == 0 && t == LMX_DTYPE_BF16);
    CHECK(lmx_dtype_size(LMX_DTYPE_BF16) == 2 && !strcmp(lmx_dtype_name(LMX_DTYPE_BF16), "bf16"));
    CHECK(lmx_dtype_from_safetensors("bf16", &t) == -1);
    CHECK(lmx_dtype_from_safetensors(NULL, &t) == -1);
    CHECK(lmx_dtype_size(LMX_DTYPE_COUNT) == 0);
    lmx_err err;
    lmx_err_clear(&err);
    CHECK(lmx_err_set(&err, LMX_ERR_IO, "read %s", "x") == LMX_ERR_IO);
    CHECK(!strcmp(err.msg, "read x"));
    CHECK(lmx_err_prefix(&err, "load %d", 7) == LMX_ERR_IO && !strcmp(err.msg, "load 7: read x"));
    char *j = lmx_path_join("a/", "b");
    CHECK(j && !strcmp(j, "a/b"));
    free(j);
    j = lmx_path_join("a", "b");
    CHECK(j && !strcmp(j, "a/b"));
    free(j);
}

int main(int argc, char **argv) {
    const char *fx = argc > 1 ? argv[1] : getenv("LMX_FIXTURES");
    test_units();
    CHECK_MSG(fx != NULL, "usage: test_safetensors FIXTURES (or set LMX_FIXTURES)");
    if (fx) test_fixture(fx);

    char tmp[] = "/tmp/lmx_test_st_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL);
    test_round_trip(tmp);
    test_write_meta(tmp);
    test_malformed(tmp);
    test_dirs(tmp);
    remove_tree(tmp);
    return check_summary("test_safetensors");
}
