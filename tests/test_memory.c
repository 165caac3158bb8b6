/* test_memory.c - memory controls and device info: a memory limit too small for a model fails the
 * load cleanly; a limit that allows loading but not a long context fails at the context, never
 * passes the limit, and the model keeps working after lmx_model_clear_cache; the cache limit, the
 * peak reset, the setter; lmx_devices; the embedding table in host memory (embed_on_host).  On the cpu
 * always; on cuda when a GPU is present. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "lmx.h"
#include "test_files.h"

#define SHORT_N 24
#define LONG_N 480
#define GEN_N 8

static int32_t short_ids[SHORT_N], long_ids[LONG_N];

static lmx_model *load(const char *backend, int64_t limit, int64_t cache_limit, lmx_status *st_out) {
    char *path = fixture("llama", NULL);
    lmx_load_params p = lmx_load_default_params();
    p.backend = backend;
    p.n_threads = 2;
    p.memory_limit = limit;
    p.cache_limit = cache_limit;
    lmx_model *m = NULL;
    lmx_status st = lmx_model_load(path, &p, &m);
    if (st_out) *st_out = st;
    free(path);
    return m;
}

static int64_t need_now(const lmx_model *m) { /* mapped + active now */
    lmx_memory_info mi;
    lmx_model_get_memory(m, &mi);
    return mi.mapped_bytes + mi.active_bytes;
}

static int64_t need_peak(const lmx_model *m) {
    lmx_memory_info mi;
    lmx_model_get_memory(m, &mi);
    return mi.mapped_bytes + mi.peak_bytes;
}

static lmx_status gen(lmx_model *m, const int32_t *ids, int n, int32_t *out_ids, int *n_out) {
    lmx_gen_params g = lmx_gen_default_params();
    g.max_tokens = GEN_N;
    g.sampler.temperature = 0;
    g.ignore_eos = 1;
    lmx_result r;
    lmx_status st = lmx_generate_ids(m, ids, n, &g, &r);
    if (st == LMX_OK && out_ids) {
        memcpy(out_ids, r.ids, (size_t)r.n_ids * sizeof *out_ids);
        *n_out = r.n_ids;
    }
    return st;
}

/* A limit far below the weights: the load fails before copying, with the limit in the message. */
static void case_load_too_small(const char *backend) {
    lmx_status st;
    lmx_model *m = load(backend, 1000, 0, &st);
    CHECK(m == NULL);
    CHECK(st == LMX_ERR_NOMEM);
    CHECK_CONTAINS(lmx_last_error(NULL), "out of memory: limit 1000 bytes, would need");
    lmx_model_free(m);
    m = load(backend, -1, 0, &st);
    CHECK(m == NULL && st == LMX_ERR_INVALID_ARG);
}

/* Loading fits, a short generation fits, a long context does not: it fails with LMX_ERR_NOMEM,
 * memory never passes the limit, and after clear cache the model generates as an unlimited one. */
static void case_long_context(const char *backend) {
    lmx_status st;
    lmx_model *ref = load(backend, 0, 0, &st);
    CHECK_MSG(ref != NULL, "%s", lmx_last_error(NULL));
    if (!ref) return;
    int32_t want[GEN_N], got[GEN_N];
    int n_want = 0, n_got = 0;
    CHECK(gen(ref, short_ids, SHORT_N, want, &n_want) == LMX_OK);
    CHECK(n_want == GEN_N);
    int64_t short_need = need_peak(ref);
    CHECK(gen(ref, long_ids, LONG_N, NULL, NULL) == LMX_OK);
    int64_t long_need = need_peak(ref);
    CHECK_MSG(long_need > short_need + 65536, "short %lld, long %lld", (long long)short_need, (long long)long_need);

    /* memory info, clear cache, peak reset on the unlimited model */
    lmx_memory_info mi;
    CHECK(lmx_model_get_memory(ref, &mi) == LMX_OK);
    CHECK(mi.limit_bytes == 0 && mi.cache_limit_bytes == 0);
    CHECK(mi.active_bytes > 0 && mi.peak_bytes >= mi.active_bytes);
    CHECK(mi.cached_bytes > 0 && mi.cached_bytes <= mi.active_bytes);
    int64_t active = mi.active_bytes, cached = mi.cached_bytes;
    lmx_model_clear_cache(ref);
    CHECK(lmx_model_get_memory(ref, &mi) == LMX_OK);
    CHECK(mi.cached_bytes == 0);
    CHECK_MSG(mi.active_bytes == active - cached, "active %lld -> %lld, cached %lld", (long long)active,
              (long long)mi.active_bytes, (long long)cached);
    CHECK(mi.peak_bytes > mi.active_bytes);
    lmx_model_reset_peak_memory(ref);
    CHECK(lmx_model_get_memory(ref, &mi) == LMX_OK);
    CHECK(mi.peak_bytes == mi.active_bytes);
    CHECK(gen(ref, short_ids, SHORT_N, got, &n_got) == LMX_OK); /* the same after clearing */
    CHECK(n_got == n_want && !memcmp(got, want, sizeof want));
    lmx_model_info info;
    lmx_model_get_info(ref, &info);
    int64_t weights = info.weight_bytes;
    lmx_model_free(ref);

    int64_t limit = (short_need + long_need) / 2;
    lmx_model *m = load(backend, limit, 0, &st);
    CHECK_MSG(m != NULL, "%s", lmx_last_error(NULL));
    if (!m) return;
    CHECK(lmx_model_get_memory(m, &mi) == LMX_OK && mi.limit_bytes == limit);
    CHECK(gen(m, short_ids, SHORT_N, got, &n_got) == LMX_OK);
    CHECK(n_got == n_want && !memcmp(got, want, sizeof want));
    st = gen(m, long_ids, LONG_N, NULL, NULL);
    CHECK(st == LMX_ERR_NOMEM);
    char limit_text[64];
    snprintf(limit_text, sizeof limit_text, "out of memory: limit %lld bytes, would need ", (long long)limit);
    CHECK_CONTAINS(lmx_last_error(m), limit_text);
    printf("test_memory: %s: short needs %lld bytes, long %lld; under %lld the long prompt fails: %s\n", backend,
           (long long)short_need, (long long)long_need, (long long)limit, lmx_last_error(m));
    CHECK_MSG(need_peak(m) <= limit, "peak %lld over the limit %lld", (long long)need_peak(m), (long long)limit);
    lmx_model_clear_cache(m);
    CHECK(lmx_model_get_memory(m, &mi) == LMX_OK && mi.cached_bytes == 0);
    CHECK(gen(m, short_ids, SHORT_N, got, &n_got) == LMX_OK);

    /* a context fed in small chunks fails when its KV cache must grow past the limit: 64 KiB more
     * than its first 16 tokens hold (a KV cache grows by 256 positions, 128 KiB on this model) */
    lmx_context *c = NULL;
    CHECK(lmx_context_create(m, NULL, &c) == LMX_OK);
    CHECK(c && lmx_context_eval(c, long_ids, 16, NULL, 0) == LMX_OK);
    int64_t kv_limit = need_now(m) + 65536;
    CHECK(lmx_model_set_memory_limit(m, kv_limit) == LMX_OK);
    lmx_model_reset_peak_memory(m);
    int fed = 16;
    st = LMX_OK;
    while (c && fed < LONG_N && (st = lmx_context_eval(c, long_ids + fed, 16, NULL, 0)) == LMX_OK) fed += 16;
    CHECK_MSG(st == LMX_ERR_NOMEM, "%d tokens fed, status %d", fed, (int)st);
    CHECK(fed >= 256 && fed < LONG_N);
    CHECK_CONTAINS(lmx_last_error(m), "KV cache of ");
    snprintf(limit_text, sizeof limit_text, "out of memory: limit %lld bytes, would need ", (long long)kv_limit);
    CHECK_CONTAINS(lmx_last_error(m), limit_text);
    printf("test_memory: %s: a context fails after %d tokens: %s\n", backend, fed, lmx_last_error(m));
    CHECK(need_peak(m) <= kv_limit);
    lmx_context_free(c);
    CHECK(lmx_model_set_memory_limit(m, limit) == LMX_OK);
    lmx_model_clear_cache(m);
    for (int round = 0; round < 2; round++) { /* it keeps working, greedy tokens unchanged */
        n_got = 0;
        CHECK_MSG(gen(m, short_ids, SHORT_N, got, &n_got) == LMX_OK, "%s", lmx_last_error(m));
        CHECK(n_got == n_want && !memcmp(got, want, sizeof want));
    }
    CHECK(need_peak(m) <= limit);

    /* the setter: a limit of the weights alone lets nothing more be allocated; 0 lifts it */
    lmx_model_clear_cache(m);
    int64_t floor_now = need_now(m);
    CHECK(lmx_model_set_memory_limit(m, floor_now) == LMX_OK);
    st = gen(m, short_ids, SHORT_N, NULL, NULL);
    CHECK(st == LMX_ERR_NOMEM);
    CHECK_CONTAINS(lmx_last_error(m), "out of memory: limit ");
    CHECK(need_now(m) <= floor_now);
    CHECK(lmx_model_set_memory_limit(m, -5) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_model_set_memory_limit(m, 0) == LMX_OK);
    lmx_model_clear_cache(m);
    CHECK_MSG(gen(m, short_ids, SHORT_N, got, &n_got) == LMX_OK, "%s", lmx_last_error(m));
    CHECK(n_got == n_want && !memcmp(got, want, sizeof want));
    lmx_model_free(m);

    /* a limit just under the weights fails the load before copying them */
    m = load(backend, weights - 1, 0, &st);
    CHECK(m == NULL && st == LMX_ERR_NOMEM);
    CHECK_CONTAINS(lmx_last_error(NULL), "out of memory: limit ");
}

/* The cache limit: the prompt cache is dropped after each call when it holds more. */
static void case_cache_limit(const char *backend) {
    lmx_status st;
    lmx_model *m = load(backend, 0, 0, &st);
    CHECK_MSG(m != NULL, "%s", lmx_last_error(NULL));
    if (!m) return;
    lmx_metrics x;
    lmx_memory_info mi;
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(lmx_get_metrics(m, &x) == LMX_OK && x.cached_tokens > 0); /* reused without a limit */
    CHECK(lmx_model_set_cache_limit(m, 1) == LMX_OK); /* applies at once */
    CHECK(lmx_model_get_memory(m, &mi) == LMX_OK && mi.cached_bytes <= 1 && mi.cache_limit_bytes == 1);
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(lmx_get_metrics(m, &x) == LMX_OK && x.cached_tokens == 0);
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(lmx_get_metrics(m, &x) == LMX_OK && x.cached_tokens == 0); /* nothing kept between calls */
    CHECK(lmx_model_get_memory(m, &mi) == LMX_OK && mi.cached_bytes <= 1);
    CHECK(lmx_model_set_cache_limit(m, -1) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_model_set_cache_limit(m, 0) == LMX_OK);
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(gen(m, short_ids, SHORT_N, NULL, NULL) == LMX_OK);
    CHECK(lmx_get_metrics(m, &x) == LMX_OK && x.cached_tokens > 0);
    lmx_model_free(m);
}

/* lmx_load_params.embed_on_host on an untied model (qwen3): on cuda the table leaves the device (its
 * bytes, vocab x hidden in its dtype, fewer active) and every logit of a prompt and then a decode step
 * is the same bit for bit; the cpu has no device memory to save and ignores it. */
static void case_embed_on_host(const char *backend) {
    char *path = fixture("qwen3", NULL);
    lmx_model *m[2] = {NULL, NULL};
    int64_t active[2] = {0, 0};
    float *logits[2] = {NULL, NULL};
    int V = 0, C = 0;
    for (int h = 0; h < 2; h++) {
        lmx_load_params p = lmx_load_default_params();
        p.backend = backend;
        p.n_threads = 2;
        p.embed_on_host = h;
        CHECK_MSG(lmx_model_load(path, &p, &m[h]) == LMX_OK, "%s", lmx_last_error(NULL));
        if (!m[h]) break;
        lmx_model_info info;
        lmx_model_get_info(m[h], &info);
        V = info.vocab_size, C = info.hidden_size;
        lmx_memory_info mi;
        lmx_model_get_memory(m[h], &mi);
        active[h] = mi.active_bytes;
        lmx_context *c = NULL;
        const lmx_context_params cp = lmx_context_default_params();
        logits[h] = malloc((size_t)(SHORT_N + 1) * V * sizeof(float));
        CHECK(lmx_context_create(m[h], &cp, &c) == LMX_OK);
        CHECK(c && lmx_context_eval(c, short_ids, SHORT_N, logits[h], 1) == LMX_OK);
        CHECK(c && lmx_context_eval(c, short_ids + 3, 1, logits[h] + (size_t)SHORT_N * V, 0) == LMX_OK);
        lmx_context_free(c);
    }
    if (m[0] && m[1]) {
        const int64_t saved = active[0] - active[1], table = (int64_t)V * C * 2; /* the fixture's bf16 */
        if (!strcmp(backend, "cuda")) CHECK_MSG(saved == table, "embed_on_host saved %lld bytes of the device's, not the "
                                                "table's %lld", (long long)saved, (long long)table);
        else CHECK_MSG(saved == 0, "embed_on_host on the cpu changed the active bytes by %lld", (long long)saved);
        CHECK_MSG(!memcmp(logits[0], logits[1], (size_t)(SHORT_N + 1) * V * sizeof(float)),
                  "embed_on_host (%s): the logits differ", backend);
    }
    for (int h = 0; h < 2; h++) lmx_model_free(m[h]), free(logits[h]);
    free(path);
}

static int case_devices(void) {
    int n = -1;
    CHECK(lmx_devices(NULL, 0, &n) == LMX_OK);
    CHECK(n >= 1);
    CHECK(lmx_devices(NULL, 1, &n) == LMX_ERR_INVALID_ARG);
    lmx_device_info d[16];
    CHECK(lmx_devices(d, 16, &n) == LMX_OK);
    CHECK(!strcmp(d[0].backend, "cpu") && d[0].index == 0);
    CHECK(d[0].cores >= 1 && d[0].name[0]);
    CHECK(d[0].total_memory > 0 && d[0].free_memory > 0 && d[0].free_memory <= d[0].total_memory);
    CHECK_CONTAINS(d[0].features, "kernels=");
    int n_cuda = 0;
    for (int i = 1; i < n && i < 16; i++) {
        CHECK(!strcmp(d[i].backend, "cuda"));
        CHECK(d[i].cc_major > 0 && d[i].sm_count > 0 && d[i].total_memory > 0 && d[i].name[0]);
        CHECK(d[i].driver_version[0] && d[i].runtime_version[0]);
        n_cuda++;
    }
    return n_cuda;
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");
    for (int i = 0; i < SHORT_N; i++) short_ids[i] = 3 + (i * 7) % 300;
    for (int i = 0; i < LONG_N; i++) long_ids[i] = 5 + (i * 13) % 310;
    int n_cuda = case_devices();
    const char *backends[] = {"cpu", "cuda"};
    for (int b = 0; b < 2; b++) {
        if (b == 1 && n_cuda == 0) {
            printf("test_memory: no CUDA device; the cuda cases are skipped\n");
            break;
        }
        case_load_too_small(backends[b]);
        case_long_context(backends[b]);
        case_cache_limit(backends[b]);
        case_embed_on_host(backends[b]);
    }
    return check_summary("test_memory");
}
