/* test_inspect.c - attention inspection (lmx_inspect_ids, `lmx inspect`) against HF transformers 5.17.
 *
 * tests/data/inspect/<model>.safetensors (tests/ref/make_inspect_reference.py) holds, for the fixture's
 * short_prompt (7 tokens) and long_prompt (40: longer than every sliding window), HF's post-RoPE keys of
 * every layer [Hk, T, D] (past_key_values, every position; a Gemma 4 shared-KV layer's from HF's
 * shared_kv_states) and eager attention probabilities [H, T, T], with "layers.N.shared_from" in its
 * metadata.  Models: llama (GQA, llama3 RoPE scaling), gemma2 (attention soft-capping, alternating
 * windows), gemma3 (5:1 sliding / global, dual RoPE bases), gemma4_kv (shared KV, K = V, head sizes 16 and 32).
 *
 * Tolerances (the cpu computes in float32, the reference in float64; gemma4 float32): every key within
 * 1e-4 + 1e-4 max|ref| of the layer's reference, every probability within 1e-4 (measured: 3e-6 and 4e-7).
 * With LMX_TEST_BACKEND=cuda (bf16 caches): keys' relative L2 error per layer <= 2e-2, probabilities within 2e-2.
 * Also: chosen layers and heads, errors, and the CLI's file (LMX_BIN).  Exits 77 (skipped) when the
 * reference files are absent (run the script where torch is installed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lmx.h"
#include "test_files.h"

static const char *g_backend = "cpu";

static lmx_model *load(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = g_backend;
    lp.n_threads = 2;
    lmx_model *m = NULL;
    CHECK_MSG(lmx_model_load(dir, &lp, &m) == LMX_OK, "%s: %s", dir, lmx_last_error(NULL));
    free(dir);
    return m;
}

/* The reference's int32 ids tensor name [T] as a malloc'ed array. */
static int32_t *ref_ids(lmx_st_file *f, const char *name, int *T) {
    const lmx_st_tensor *t = lmx_st_find(f, name);
    CHECK_MSG(t && t->dtype == LMX_DTYPE_I32 && t->ndim == 1, "reference tensor %s", name);
    if (!t) return NULL;
    int32_t *ids = malloc((size_t)t->n_elements * sizeof *ids);
    for (int64_t i = 0; ids && i < t->n_elements; i++) ids[i] = (int32_t)lmx_load_u32((const char *)t->data + 4 * i);
    *T = (int)t->n_elements;
    return ids;
}

/* got [n] against ref's F32 tensor of shape dims [3]: cpu absolute tolerance atol + rtol max|ref|, cuda relative
 * L2 error 2e-2 (keys) or absolute 2e-2 (probs). */
static void compare(const char *what, const float *got, const lmx_st_tensor *ref, const int64_t dims[3], double atol,
                    double rtol, int l2) {
    CHECK_MSG(ref && ref->ndim == 3 && ref->shape[0] == dims[0] && ref->shape[1] == dims[1] && ref->shape[2] == dims[2],
              "%s: reference shape differs from [%lld, %lld, %lld]", what, (long long)dims[0], (long long)dims[1],
              (long long)dims[2]);
    if (!ref || !got || ref->n_elements != dims[0] * dims[1] * dims[2]) return;
    double max_ref = 0, max_diff = 0, err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < ref->n_elements; i++) {
        const double r = lmx_float_at(ref->data, ref->dtype, i), d = fabs(got[i] - r);
        max_ref = fabs(r) > max_ref ? fabs(r) : max_ref;
        max_diff = d > max_diff ? d : max_diff;
        err2 += d * d, ref2 += r * r;
    }
    const int cuda = strcmp(g_backend, "cpu") != 0;
    if (cuda && l2) CHECK_MSG(sqrt(err2) <= 2e-2 * sqrt(ref2), "%s: relative L2 error %.3g", what, sqrt(err2 / ref2));
    else {
        const double tol = cuda ? 2e-2 : atol + rtol * max_ref;
        CHECK_MSG(max_diff <= tol, "%s: max |diff| %.3g > %.3g", what, max_diff, tol);
    }
    if (getenv("LMX_TEST_VERBOSE")) printf("  %-28s max |diff| %.3g (max |ref| %.3g)\n", what, max_diff, max_ref);
}

/* Every layer's keys, shared-from layer and probabilities of one prompt against the reference; 0 when absent. */
static int case_reference(const char *name, const char *tag) {
    char dir[1024], path[1200], key[96], what[160];
    test_data_dir(dir, sizeof dir, "inspect");
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, name);
    lmx_st_file *f = NULL;
    if (lmx_st_open(path, &f, NULL) != LMX_OK) {
        printf("skip: %s is absent (make it with tests/ref/make_inspect_reference.py where torch is installed)\n", path);
        return 0;
    }
    lmx_model *m = load(name);
    int T = 0;
    snprintf(key, sizeof key, "%s_prompt", tag);
    int32_t *ids = ref_ids(f, key, &T);
    lmx_inspect_params p = lmx_inspect_default_params();
    p.probs = 1;
    lmx_inspection *in = NULL;
    lmx_model_info info;
    if (m && ids && lmx_model_get_info(m, &info) == LMX_OK) {
        CHECK_MSG(lmx_inspect_ids(m, ids, T, &p, &in) == LMX_OK, "%s %s: %s", name, tag, lmx_last_error(m));
        CHECK(lmx_inspection_n_tokens(in) == T && lmx_inspection_n_layers(in) == info.n_layers);
        CHECK(lmx_inspection_ids(in) && !memcmp(lmx_inspection_ids(in), ids, (size_t)T * sizeof *ids));
    }
    for (int i = 0; in && i < lmx_inspection_n_layers(in); i++) {
        const lmx_inspect_layer *L = lmx_inspection_layer(in, i);
        CHECK(L->layer == i && L->n_heads == info.n_heads && L->probs && L->heads[L->n_heads - 1] == L->n_heads - 1);
        snprintf(key, sizeof key, "layers.%d.shared_from", i);
        const char *src = lmx_st_metadata(f, key);
        CHECK_MSG(src && atoi(src) == L->shared_from, "%s layer %d: shared from %d, HF says %s", name, i,
                  L->shared_from, src ? src : "(none)");
        snprintf(key, sizeof key, "%s.layers.%d.keys", tag, i);
        snprintf(what, sizeof what, "%s %s", name, key);
        compare(what, L->keys, lmx_st_find(f, key), (int64_t[3]){L->n_kv_heads, T, L->head_dim}, 1e-4, 1e-4, 1);
        snprintf(key, sizeof key, "%s.layers.%d.probs", tag, i);
        snprintf(what, sizeof what, "%s %s", name, key);
        compare(what, L->probs, lmx_st_find(f, key), (int64_t[3]){L->n_heads, T, T}, 1e-4, 0, 0);
    }
    lmx_inspection_free(in);
    lmx_model_free(m);
    free(ids);
    lmx_st_close(f);
    return 1;
}

/* Chosen layers (in the order asked) and heads give what the full inspection gives for them. */
static void case_subset(void) {
    lmx_model *m = load("gemma4_kv");
    if (!m) return;
    const int32_t ids[] = {2, 17, 4, 99, 250, 31, 8, 8, 64, 120, 7, 3}; /* 12 > the window of 8 */
    const int layers[] = {11, 0, 10}, heads[] = {3, 1};
    lmx_inspect_params all = lmx_inspect_default_params(), some = all;
    all.probs = 1;
    some.probs = 1, some.layers = layers, some.n_layers = 3, some.heads = heads, some.n_heads = 2;
    lmx_inspection *a = NULL, *s = NULL;
    CHECK(lmx_inspect_ids(m, ids, 12, &all, &a) == LMX_OK);
    CHECK(lmx_inspect_ids(m, ids, 12, &some, &s) == LMX_OK);
    CHECK(lmx_inspection_n_layers(s) == 3 && !lmx_inspection_layer(s, 3) && !lmx_inspection_layer(s, -1));
    for (int i = 0; a && s && i < 3; i++) {
        const lmx_inspect_layer *L = lmx_inspection_layer(s, i), *F = lmx_inspection_layer(a, layers[i]);
        CHECK(L->layer == layers[i] && L->shared_from == F->shared_from && L->window == F->window);
        CHECK(L->n_heads == 2 && L->heads[0] == 3 && L->heads[1] == 1);
        const size_t nk = (size_t)L->n_kv_heads * 12 * L->head_dim, TT = 12 * 12;
        CHECK(!memcmp(L->keys, F->keys, nk * sizeof(float)));
        for (int h = 0; h < 2; h++)
            CHECK(!memcmp(L->probs + h * TT, F->probs + (size_t)heads[h] * TT, TT * sizeof(float)));
    }
    if (s) { /* gemma4_kv: layer 11 (full, head size 32) shares layer 5's keys, layer 10 (sliding) layer 9's */
        const lmx_inspect_layer *L11 = lmx_inspection_layer(s, 0), *L10 = lmx_inspection_layer(s, 2);
        CHECK(L11->shared_from == 5 && L11->head_dim == 32 && L11->window == 0);
        CHECK(L10->shared_from == 9 && L10->head_dim == 16 && L10->window == 8);
        CHECK(!memcmp(L11->keys, lmx_inspection_layer(a, 5)->keys, (size_t)2 * 12 * 32 * sizeof(float)));
        const float *row = L10->probs + 11 * 12; /* query 11 of head 3 sees keys 4..11 only */
        double sum = 0;
        for (int j = 0; j < 12; j++) sum += row[j];
        CHECK(row[3] == 0.0f && row[4] > 0.0f && fabs(sum - 1) < 1e-5);
    }
    /* without probabilities: keys only */
    lmx_inspection *k = NULL;
    CHECK(lmx_inspect_ids(m, ids, 12, NULL, &k) == LMX_OK);
    CHECK(k && lmx_inspection_layer(k, 0)->probs == NULL && lmx_inspection_layer(k, 0)->n_heads == 0);
    if (k && a) CHECK(!memcmp(lmx_inspection_layer(k, 7)->keys, lmx_inspection_layer(a, 7)->keys, 2 * 12 * 16 * sizeof(float)));
    lmx_inspection_free(k);
    lmx_inspection_free(a);
    lmx_inspection_free(s);
    lmx_model_free(m);
}

static void case_errors(void) {
    lmx_model *m = load("llama");
    if (!m) return;
    const int32_t ids[] = {1, 2, 3};
    const int bad_layer[] = {0, 2}, twice[] = {1, 1};
    lmx_inspect_params p = lmx_inspect_default_params();
    lmx_inspection *in = (lmx_inspection *)&p; /* set to NULL by every failing call */
    CHECK(lmx_inspect_ids(m, ids, 0, NULL, &in) == LMX_ERR_INVALID_ARG && in == NULL);
    CHECK_CONTAINS(lmx_last_error(m), "no tokens");
    p.layers = bad_layer, p.n_layers = 2;
    CHECK(lmx_inspect_ids(m, ids, 3, &p, &in) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "layer index 2 outside [0, 2)");
    p.layers = NULL, p.probs = 1, p.heads = twice, p.n_heads = 2;
    CHECK(lmx_inspect_ids(m, ids, 3, &p, &in) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "head index 1 given twice");
    const int32_t big[] = {1, 1 << 30};
    CHECK(lmx_inspect_ids(m, big, 2, NULL, &in) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "outside the vocabulary");
    CHECK(lmx_inspect(m, "hello", NULL, &in) == LMX_ERR_MISSING && in == NULL); /* the fixture has no tokenizer */
    CHECK(lmx_inspect_ids(NULL, ids, 3, NULL, &in) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_inspection_n_layers(NULL) == 0 && lmx_inspection_n_tokens(NULL) == 0 && !lmx_inspection_ids(NULL));
    CHECK(lmx_inspection_layer(NULL, 0) == NULL);
    lmx_inspection_free(NULL);
    /* the model still evaluates */
    CHECK(lmx_inspect_ids(m, ids, 3, NULL, &in) == LMX_OK && lmx_inspection_n_layers(in) == 2);
    lmx_inspection_free(in);
    lmx_model_free(m);
}

/* `lmx inspect` writes layers.N.keys / probs, ids and the shared-from metadata; its keys are the API's. */
static void case_cli(void) {
    const char *bin = getenv("LMX_BIN");
    if (!bin) {
        printf("skip: LMX_BIN unset, `lmx inspect` not run\n");
        return;
    }
    char *dir = case_dir("inspect"), *model = fixture("gemma4_kv", NULL), cmd[4096], out[1200];
    snprintf(out, sizeof out, "%s/k.safetensors", dir);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --prompt-ids 2,17,4,99,250 --layers 11,3 --probs --heads 2 "
             "--backend %s --out '%s' > '%s/stdout'", bin, model, g_backend, out, dir);
    CHECK_MSG(system(cmd) == 0, "%s", cmd);
    lmx_st_file *f = NULL;
    CHECK(lmx_st_open(out, &f, NULL) == LMX_OK);
    if (f) {
        const lmx_st_tensor *k11 = lmx_st_find(f, "layers.11.keys"), *p3 = lmx_st_find(f, "layers.3.probs");
        const lmx_st_tensor *ids = lmx_st_find(f, "ids");
        CHECK(k11 && k11->dtype == LMX_DTYPE_F32 && k11->ndim == 3 && k11->shape[0] == 2 && k11->shape[1] == 5 &&
              k11->shape[2] == 32);
        CHECK(p3 && p3->shape[0] == 1 && p3->shape[1] == 5 && p3->shape[2] == 5);
        CHECK(ids && ids->n_elements == 5 && lmx_st_count(f) == 5);
        CHECK(lmx_st_metadata(f, "layers.11.shared_from") && !strcmp(lmx_st_metadata(f, "layers.11.shared_from"), "5"));
        CHECK(lmx_st_metadata(f, "layers.3.shared_from") && !strcmp(lmx_st_metadata(f, "layers.3.shared_from"), "3"));
        CHECK(lmx_st_metadata(f, "layers.3.window") && !strcmp(lmx_st_metadata(f, "layers.3.window"), "8"));
        CHECK(lmx_st_metadata(f, "layers.11.heads") && !strcmp(lmx_st_metadata(f, "layers.11.heads"), "2"));
        lmx_model *m = load("gemma4_kv");
        const int32_t pid[] = {2, 17, 4, 99, 250};
        const int l11[] = {11};
        lmx_inspect_params p = lmx_inspect_default_params();
        p.layers = l11, p.n_layers = 1;
        lmx_inspection *in = NULL;
        if (m && k11 && lmx_inspect_ids(m, pid, 5, &p, &in) == LMX_OK)
            CHECK(!memcmp(k11->data, lmx_inspection_layer(in, 0)->keys, k11->nbytes));
        lmx_inspection_free(in);
        lmx_model_free(m);
        lmx_st_close(f);
    }
    char *text = NULL;
    size_t len = 0;
    snprintf(out, sizeof out, "%s/stdout", dir);
    CHECK(lmx_read_file(out, &text, &len, NULL) == LMX_OK);
    if (text) CHECK_CONTAINS(text, "layer  11  keys [2, 5, 32]  shared from 5");
    free(text);
    snprintf(cmd, sizeof cmd, "'%s' inspect '%s' --prompt-ids 1,2 --layers 99 --backend %s 2> /dev/null", bin, model,
             g_backend);
    CHECK(system(cmd) != 0);
    free(model);
    end_case(dir);
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");
    if (getenv("LMX_TEST_BACKEND")) g_backend = getenv("LMX_TEST_BACKEND"); /* cuda on a GPU machine */
    const char *models[] = {"llama", "gemma2", "gemma3", "gemma4_kv"};
    int found = 0;
    for (int i = 0; i < 4; i++) found += case_reference(models[i], "short") & case_reference(models[i], "long");
    case_subset();
    case_errors();
    case_cli();
    int rc = check_summary("test_inspect");
    if (!rc && found < 4) {
        printf("test_inspect: skipped: %d of 4 reference files present\n", found);
        return 77;
    }
    return rc;
}
