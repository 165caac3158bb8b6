/* test_runtime.c - the generation API: the sampler chain against hand-computed distributions,
 * seeds, greedy generation against the fixtures' HF sequences, classify against the fixtures'
 * batch logits, batch == single, prompt cache == no cache, stop ids / strings, cancellation,
 * the pull stream == the callback, memory bounded and no allocation per decoded token.
 *
 * The test links with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc so it
 * can count the library's allocations (see CMakeLists.txt). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "formats/safetensors.h"
#include "model/model.h"
#include "lmx.h"
#include "runtime/sampler.h"
#include "test_files.h"

/* ---- allocation counting ------------------------------------------------------------------- */

static atomic_long n_allocs;
void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t al, size_t n);
void *__wrap_malloc(size_t n) { atomic_fetch_add(&n_allocs, 1); return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { atomic_fetch_add(&n_allocs, 1); return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { atomic_fetch_add(&n_allocs, 1); return __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t al, size_t n) { atomic_fetch_add(&n_allocs, 1); return __real_aligned_alloc(al, n); }

/* ---- sampler: hand-computed distributions (softmax by hand, see each case) ------------------- */

typedef struct sampler_case {
    const char *name;
    lmx_sampler_params p;
    int32_t history[4];
    int n_hist;
    int n;                 /* expected survivors, in chain order */
    int32_t ids[6];
    double probs[6];
} sampler_case;

static void case_sampler_table(void) {
    /* logits of ids 0..5 */
    const float L[6] = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, 3.0f};
    lmx_sampler_params off = {.temperature = 1, .top_k = 0, .top_p = 1, .min_p = 0, .repeat_penalty = 1,
                              .penalty_last_n = 64, .seed = 1};
    sampler_case cases[8];
    int nc = 0;
    /* no filter: softmax of L, in id order */
    cases[nc] = (sampler_case){"none", off, {0}, 0, 6, {0, 1, 2, 3, 4, 5},
                               {0.22249842774649845, 0.08185259726090638, 0.04964610981585004, 0.03011188773877337,
                                0.011077544433957151, 0.6048134330040145}};
    nc++;
    /* temperature 0.5, top-k 3: softmax(6, 4, 2) */
    cases[nc] = (sampler_case){"temp+topk", off, {0}, 0, 3, {5, 0, 1},
                               {0.8668133321973347, 0.11731042782619835, 0.015876239976466762}};
    cases[nc].p.temperature = 0.5f;
    cases[nc++].p.top_k = 3;
    /* top-p 0.8: 0.605 < 0.8 <= 0.605 + 0.222 keeps ids 5, 0: softmax(3, 2) */
    cases[nc] = (sampler_case){"topp", off, {0}, 0, 2, {5, 0}, {0.7310585786300049, 0.2689414213699951}};
    cases[nc++].p.top_p = 0.8f;
    /* top-p 0.6: the first token alone reaches it */
    cases[nc] = (sampler_case){"topp-one", off, {0}, 0, 1, {5}, {1.0}};
    cases[nc++].p.top_p = 0.6f;
    /* min-p 0.2: exp(l - 3) >= 0.2 keeps logits >= 1.39: ids 5, 0 */
    cases[nc] = (sampler_case){"minp", off, {0}, 0, 2, {5, 0}, {0.7310585786300049, 0.2689414213699951}};
    cases[nc++].p.min_p = 0.2f;
    /* repetition 2 over [5, 4, 5]: l5 = 3 / 2, l4 = -1 * 2; top-k 2: softmax(2, 1.5) of ids 0, 5 */
    cases[nc] = (sampler_case){"repeat", off, {5, 4, 5}, 3, 2, {0, 5}, {0.6224593312018546, 0.37754066879814546}};
    cases[nc].p.repeat_penalty = 2;
    cases[nc++].p.top_k = 2;
    /* presence 0.5, frequency 0.25 over [1, 1, 3]: l1 = 1 - 0.5 - 0.5 = 0, l3 = -0.75; top-k 3:
     * ids 5, 0, then 2 (logit 0.5; unpenalised id 1 would have had 1): softmax(3, 2, 0.5) */
    cases[nc] = (sampler_case){"presence+frequency", off, {1, 1, 3}, 3, 3, {5, 0, 2},
                               {0.6896720861245036, 0.25371618163502524, 0.05661173224047129}};
    cases[nc].p.presence_penalty = 0.5f;
    cases[nc].p.frequency_penalty = 0.25f;
    cases[nc++].p.top_k = 3;
    /* penalty window 1 over [1, 1, 3]: only id 3 is penalised (-0.5 - 0.25); id 1 keeps logit 1 */
    cases[nc] = (sampler_case){"window", off, {1, 1, 3}, 3, 3, {5, 0, 1},
                               {0.6652409557748219, 0.24472847105479764, 0.09003057317038046}};
    cases[nc].p.presence_penalty = 0.5f;
    cases[nc].p.frequency_penalty = 0.25f;
    cases[nc].p.penalty_last_n = 1;
    cases[nc++].p.top_k = 3;

    lmx_sampler s;
    CHECK(lmx_sampler_init(&s, 6) == 0);
    for (int c = 0; c < nc; c++) {
        sampler_case *k = &cases[c];
        float logits[6];
        memcpy(logits, L, sizeof L);
        lmx_sampler_penalize(&s, &k->p, logits, k->history, k->n_hist);
        int n = lmx_sampler_filter(&s, &k->p, logits);
        CHECK_MSG(n == k->n, "%s: %d candidates, expected %d", k->name, n, k->n);
        for (int i = 0; i < n && i < k->n; i++) {
            CHECK_MSG(s.cand[i].id == k->ids[i], "%s: candidate %d is id %d, expected %d", k->name, i, s.cand[i].id, k->ids[i]);
            CHECK_MSG(fabs(s.cand[i].p - k->probs[i]) < 1e-6, "%s: p[%d] = %.9f, expected %.9f", k->name, i, s.cand[i].p,
                      k->probs[i]);
        }
        for (int i = 0; i < 6; i++) CHECK(s.counts[i] == 0); /* counts left clean */
    }

    /* greedy: the largest logit after penalties, the lowest id among equals */
    lmx_sampler_params g = off;
    g.temperature = 0;
    float tie[6] = {1, 3, 3, 0, 0, 2};
    lmx_rng rng;
    lmx_rng_seed(&rng, 1);
    CHECK(lmx_sampler_sample(&s, &g, &rng, tie, NULL, 0) == 1);

    /* draws follow the filtered distribution: 60000 draws from the "temp+topk" case */
    long hits[6] = {0};
    lmx_rng_seed(&rng, 42);
    for (int i = 0; i < 60000; i++) {
        float logits[6];
        memcpy(logits, L, sizeof L);
        hits[lmx_sampler_sample(&s, &cases[1].p, &rng, logits, NULL, 0)]++;
    }
    for (int i = 0; i < 3; i++) {
        double p = cases[1].probs[i], got = hits[cases[1].ids[i]] / 60000.0, sd = sqrt(p * (1 - p) / 60000);
        CHECK_MSG(fabs(got - p) < 5 * sd + 1e-9, "id %d drawn %.4f of the time, expected %.4f", cases[1].ids[i], got, p);
    }
    CHECK(hits[2] + hits[3] + hits[4] == 0);
    lmx_sampler_free(&s);
}

/* ---- sampling from the k best candidates (what the GPU backend returns) ----------------------- */

static const float *g_sort_logits;
static int by_logit_then_id(const void *a, const void *b) { /* largest first, equal ones by lower id */
    int i = *(const int *)a, j = *(const int *)b;
    if (g_sort_logits[i] != g_sort_logits[j]) return g_sort_logits[i] > g_sort_logits[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

/* For random logits (with ties) and random sampler settings, lmx_sampler_sample_topk on the k best
 * candidates (chosen here by a plain sort) draws the same token as lmx_sampler_sample on all V. */
static void case_sampler_topk(void) {
    uint64_t x = 0x1234567887654321ull;
    const float temps[] = {0.0f, 0.3f, 0.8f, 1.0f, 1.7f};
    const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.0f};
    const float min_ps[] = {0.0f, 0.05f, 0.3f};
    int compared = 0;
    for (int trial = 0; trial < 400; trial++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int V = 2 + (int)(x % 3000);
        float *logits = malloc((size_t)V * sizeof *logits), *work = malloc((size_t)V * sizeof *work);
        int *order = malloc((size_t)V * sizeof *order);
        for (int i = 0; i < V; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            logits[i] = (float)((int)(x % 64) - 32) * 0.25f; /* steps of 0.25: many equal logits */
            order[i] = i;
        }
        lmx_sampler_params p = lmx_sampler_default_params();
        p.temperature = temps[trial % 5];
        p.top_p = top_ps[(trial / 5) % 4];
        p.min_p = min_ps[(trial / 20) % 3];
        const int ks[] = {1, 5, 40, 256, V - 1};
        p.top_k = ks[(trial / 60) % 5];
        int k = lmx_sampler_topk_need(&p, V, 256);
        if (k > 0) {
            g_sort_logits = logits;
            qsort(order, (size_t)V, sizeof *order, by_logit_then_id);
            float vals[256];
            int32_t ids[256];
            for (int i = 0; i < k; i++) {
                vals[i] = logits[order[i]];
                ids[i] = order[i];
            }
            lmx_sampler s;
            CHECK(lmx_sampler_init(&s, V) == 0);
            lmx_rng r1, r2;
            lmx_rng_seed(&r1, (uint64_t)trial);
            r2 = r1;
            memcpy(work, logits, (size_t)V * sizeof *work);
            int32_t full = lmx_sampler_sample(&s, &p, &r1, work, NULL, 0);
            int32_t part = lmx_sampler_sample_topk(&s, &p, &r2, vals, ids, k);
            CHECK_MSG(full == part, "V=%d temp=%g top_k=%d top_p=%g min_p=%g: %d from all logits, %d from the top %d",
                      V, p.temperature, p.top_k, p.top_p, p.min_p, full, part, k);
            CHECK(r1.s[0] == r2.s[0] && r1.s[3] == r2.s[3]); /* the same draws */
            lmx_sampler_free(&s);
            compared++;
        }
        free(logits);
        free(work);
        free(order);
    }
    CHECK(compared > 250);
    /* what needs every logit */
    lmx_sampler_params p = lmx_sampler_default_params();
    CHECK(lmx_sampler_topk_need(&p, 1000, 256) == 40);
    p.repeat_penalty = 1.1f;
    CHECK(lmx_sampler_topk_need(&p, 1000, 256) == 0);
    p = lmx_sampler_default_params();
    p.top_k = 0;
    CHECK(lmx_sampler_topk_need(&p, 1000, 256) == 0);
    p.temperature = 0;
    CHECK(lmx_sampler_topk_need(&p, 1000, 256) == 1);
}

/* ---- a fixture model --------------------------------------------------------------------- */

static lmx_model *load(const char *path, int n_ctx) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = getenv("LMX_TEST_BACKEND") ? getenv("LMX_TEST_BACKEND") : "cpu"; /* cuda on a GPU machine */
    lp.n_ctx = n_ctx;
    lmx_model *m = NULL;
    CHECK_MSG(lmx_model_load(path, &lp, &m) == LMX_OK, "%s: %s", path, lmx_last_error(NULL));
    return m;
}

static lmx_gen_params greedy(int max_tokens) {
    lmx_gen_params p = lmx_gen_default_params();
    p.sampler.temperature = 0;
    p.max_tokens = max_tokens;
    return p;
}

static int same_ids(const lmx_result *a, const int32_t *b, int n) {
    return a->n_ids == n && (n == 0 || !memcmp(a->ids, b, (size_t)n * sizeof *b));
}

/* Greedy generation reproduces the HF short_sequence; the pull stream gives the same tokens. */
static void case_greedy_fixture(const char *name) {
    char *dir = fixture(name, NULL), *refp = fixture(name, "reference.safetensors");
    lmx_err err = {0};
    lmx_st_set *ref = NULL;
    CHECK(lmx_st_set_open_file(refp, &ref, &err) == LMX_OK);
    lmx_model *m = load(dir, 0);
    int64_t np = 0, ns = 0;
    int32_t *prompt = ref_ints(ref, "short_prompt", &np), *seq = ref_ints(ref, "short_sequence", &ns);
    if (m && prompt && seq) {
        int n = (int)(ns - np);
        lmx_gen_params p = greedy(n);
        p.ignore_eos = 1;
        lmx_result r;
        CHECK_MSG(lmx_generate_ids(m, prompt, (int)np, &p, &r) == LMX_OK, "%s", lmx_last_error(m));
        CHECK_MSG(same_ids(&r, seq + np, n), "%s: greedy ids differ from the reference", name);
        CHECK(r.finish == LMX_FINISH_LENGTH);

        lmx_stream *s = NULL;
        CHECK(lmx_stream_open_ids(m, prompt, (int)np, &p, &s) == LMX_OK);
        int k = 0, ok = 1;
        const lmx_token *t;
        lmx_stream *other = NULL;
        CHECK(lmx_stream_open_ids(m, prompt, (int)np, &p, &other) == LMX_ERR_INVALID_ARG); /* one at a time */
        while (s && lmx_stream_next(s, &t) == LMX_OK && t) {
            ok &= k < n && t->id == seq[np + k] && t->index == k;
            k++;
        }
        CHECK_MSG(ok && k == n, "%s: the stream gave %d tokens, differing", name, k);
        lmx_stream_free(s);

        lmx_metrics x;
        CHECK(lmx_get_metrics(m, &x) == LMX_OK);
        CHECK(x.generated_tokens == n && x.prompt_tokens == np);
        /* the same prompt again: all but the last token reused, unless a rotating (sliding-window)
         * cache has overwritten positions the restart needs */
        CHECK_MSG(x.cached_tokens == np - 1 || (!strncmp(name, "gemma", 5) && x.cached_tokens == 0),
                  "%s: %d cached tokens", name, x.cached_tokens);
    }
    lmx_model_free(m);
    lmx_st_set_close(ref);
    free(prompt);
    free(seq);
    free(dir);
    free(refp);
}

/* Classify reproduces batch_last_logits (padded batch) and the greedy next ids. */
static void case_classify(const char *name) {
    char *dir = fixture(name, NULL), *refp = fixture(name, "reference.safetensors");
    lmx_err err = {0};
    lmx_st_set *ref = NULL;
    CHECK(lmx_st_set_open_file(refp, &ref, &err) == LMX_OK);
    lmx_model *m = load(dir, 0);
    int64_t nb = 0, nl = 0;
    int32_t *prompts = ref_ints(ref, "batch_prompts", &nb), *lens = ref_ints(ref, "batch_lengths", &nl);
    const lmx_st_tensor *want = ref ? lmx_st_set_find(ref, "batch_last_logits") : NULL;
    if (m && prompts && lens && want) {
        int N = (int)nl, T = (int)(nb / nl), V = (int)want->shape[1];
        const int32_t *rows[8];
        for (int i = 0; i < N; i++) rows[i] = prompts + (size_t)i * T;
        float *logits = malloc((size_t)N * V * sizeof *logits);
        int32_t next[8];
        CHECK_MSG(lmx_classify_ids(m, rows, lens, N, NULL, NULL, next, logits) == LMX_OK, "%s", lmx_last_error(m));
        const float *w = want->data;
        /* float32 compute (the cpu): every logit within 2e-3; bf16 compute (a GPU backend): the
         * fixtures' bf16 criterion, relative L2 error per row within 2e-2 and the same argmax where
         * the reference margin exceeds 0.1 */
        const char *be = getenv("LMX_TEST_BACKEND");
        const int f32 = !be || !strcmp(be, "cpu");
        double worst = 0;
        for (int i = 0; i < N; i++) {
            double d2 = 0, r2 = 0, dmax = 0;
            for (int v = 0; v < V; v++) {
                double d = (double)logits[(size_t)i * V + v] - w[(size_t)i * V + v];
                d2 += d * d;
                r2 += (double)w[(size_t)i * V + v] * w[(size_t)i * V + v];
                dmax = fmax(dmax, fabs(d));
            }
            worst = fmax(worst, f32 ? dmax : sqrt(d2 / r2));
        }
        CHECK_MSG(worst < (f32 ? 2e-3 : 2e-2), "%s: classify logits differ from the reference by %g", name, worst);
        for (int i = 0; i < N; i++) {
            int32_t best = 0, second = -1;
            for (int v = 1; v < V; v++)
                if (w[(size_t)i * V + v] > w[(size_t)i * V + best]) best = v;
            for (int v = 0; v < V; v++)
                if (v != best && (second < 0 || w[(size_t)i * V + v] > w[(size_t)i * V + second])) second = v;
            if (f32 || w[(size_t)i * V + best] - w[(size_t)i * V + second] > 0.1) CHECK(next[i] == best);
        }
        free(logits);
    }
    lmx_model_free(m);
    lmx_st_set_close(ref);
    free(prompts);
    free(lens);
    free(dir);
    free(refp);
}

/* Batched generation equals each prompt alone (greedy), each with its own stops. */
static void case_batch_equals_single(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    const int32_t a[] = {1, 5, 9, 14, 2}, b[] = {7, 3}, c[] = {11, 12, 13, 14, 15, 16, 17, 18};
    const int32_t *prompts[3] = {a, b, c};
    int lens[3] = {5, 2, 8};
    lmx_gen_params p[3] = {greedy(12), greedy(7), greedy(15)};
    for (int i = 0; i < 3; i++) p[i].ignore_eos = 1;
    /* sequence 2 stops at the 5th token it generates alone */
    int32_t single[3][16];
    int n_single[3];
    lmx_finish f_single[3];
    for (int i = 0; m && i < 3; i++) {
        lmx_result r;
        if (i == 2) {
            CHECK(lmx_generate_ids(m, prompts[i], lens[i], &p[i], &r) == LMX_OK);
            static int32_t stop;
            stop = r.ids[4];
            p[i].stop_ids = &stop;
            p[i].n_stop_ids = 1;
        }
        CHECK(lmx_generate_ids(m, prompts[i], lens[i], &p[i], &r) == LMX_OK);
        n_single[i] = r.n_ids;
        f_single[i] = r.finish;
        memcpy(single[i], r.ids, (size_t)r.n_ids * sizeof(int32_t));
    }
    if (m) {
        CHECK(f_single[2] == LMX_FINISH_STOP_TOKEN && n_single[2] <= 4);
        lmx_result rs[3];
        CHECK_MSG(lmx_batch_generate_ids(m, prompts, lens, 3, p, rs) == LMX_OK, "%s", lmx_last_error(m));
        for (int i = 0; i < 3; i++) {
            CHECK_MSG(same_ids(&rs[i], single[i], n_single[i]), "%s: batch sequence %d differs from alone", name, i);
            CHECK(rs[i].finish == f_single[i]);
        }
    }
    lmx_model_free(m);
    free(dir);
}

/* Twelve sequences (more than the matmul's per-row path takes: the GEMM path) still equal each
 * prompt alone under greedy decoding. */
static void case_batch_wide(const char *name) {
    enum { N = 12 };
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    int32_t pr[N][8], single[N][20];
    const int32_t *ps[N];
    int lens[N], ns[N];
    lmx_gen_params p[N];
    for (int i = 0; m && i < N; i++) {
        lens[i] = 1 + i % 7;
        for (int t = 0; t < 8; t++) pr[i][t] = (i * 37 + t * 11) % 300 + 1;
        ps[i] = pr[i];
        p[i] = greedy(20);
        p[i].ignore_eos = 1;
        lmx_result r;
        CHECK(lmx_generate_ids(m, ps[i], lens[i], &p[i], &r) == LMX_OK);
        ns[i] = r.n_ids;
        memcpy(single[i], r.ids, (size_t)r.n_ids * sizeof(int32_t));
    }
    if (m) {
        lmx_result rs[N];
        CHECK(lmx_batch_generate_ids(m, ps, lens, N, p, rs) == LMX_OK);
        for (int i = 0; i < N; i++)
            CHECK_MSG(same_ids(&rs[i], single[i], ns[i]), "%s: batch-of-12 sequence %d differs from alone", name, i);
    }
    lmx_model_free(m);
    free(dir);
}

/* Sequences that end at different steps, one of them by a full context (a 500-token prompt on a 512-position model),
 * still equal each prompt alone.  pad: the finished ones keep their rows as padding (be->replays_steps, as on cuda
 * with graphs), evaluated again at one position each step until the live rows are half the step's. */
static void case_batch_ends_apart(const char *name, int pad) {
    enum { N = 6, LONG = 500 };
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    static int32_t pr[N][LONG], single[N][24];
    const int32_t *ps[N];
    int lens[N], ns[N];
    lmx_finish fs[N];
    lmx_gen_params p[N];
    for (int i = 0; m && i < N; i++) {
        lens[i] = i == 3 ? LONG : 2 + 3 * i;
        for (int t = 0; t < lens[i]; t++) pr[i][t] = (i * 41 + t * 13) % 300 + 1;
        ps[i] = pr[i];
        p[i] = greedy(i == 3 ? 24 : 2 + 4 * i); /* 2, 6, 10, (24: the context ends it at 13), 18, 22 */
        p[i].ignore_eos = 1;
        lmx_result r;
        CHECK(lmx_generate_ids(m, ps[i], lens[i], &p[i], &r) == LMX_OK);
        ns[i] = r.n_ids;
        fs[i] = r.finish;
        memcpy(single[i], r.ids, (size_t)r.n_ids * sizeof(int32_t));
    }
    if (m) {
        CHECK_MSG(fs[3] == LMX_FINISH_CONTEXT && ns[3] == 13, "%s: the long prompt alone ended by %d after %d", name,
                  (int)fs[3], ns[3]);
        m->be->replays_steps = pad; /* the cpu pads as cuda does */
        lmx_result rs[N];
        CHECK_MSG(lmx_batch_generate_ids(m, ps, lens, N, p, rs) == LMX_OK, "%s", lmx_last_error(m));
        for (int i = 0; i < N; i++) {
            CHECK_MSG(same_ids(&rs[i], single[i], ns[i]), "%s (pad %d): sequence %d differs from alone", name, pad, i);
            CHECK(rs[i].finish == fs[i]);
        }
    }
    lmx_model_free(m);
    free(dir);
}

/* The prompt cache: a prompt extending the last generation reuses its KV and gives the same
 * result as a cold model. */
static void case_prompt_cache(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *warm = load(dir, 0), *cold = load(dir, 0);
    if (warm && cold) {
        const int32_t sys[] = {3, 1, 4, 1, 5, 9, 2, 6};
        lmx_gen_params p = greedy(10);
        p.ignore_eos = 1;
        lmx_result r;
        CHECK(lmx_prompt_cache_warm_ids(warm, sys, 8) == LMX_OK);
        int32_t prompt[32];
        memcpy(prompt, sys, sizeof sys);
        prompt[8] = 7;
        prompt[9] = 8;
        CHECK(lmx_generate_ids(warm, prompt, 10, &p, &r) == LMX_OK);
        lmx_metrics x;
        lmx_get_metrics(warm, &x);
        CHECK_MSG(x.cached_tokens == 8, "cached %d after warming 8", x.cached_tokens);
        /* continue the conversation: the prompt, the answer, and more */
        int n = 10;
        for (int i = 0; i < r.n_ids; i++) prompt[n++] = r.ids[i];
        prompt[n++] = 21;
        prompt[n++] = 22;
        int32_t hot[16];
        CHECK(lmx_generate_ids(warm, prompt, n, &p, &r) == LMX_OK);
        memcpy(hot, r.ids, (size_t)r.n_ids * sizeof *hot);
        int n_hot = r.n_ids;
        lmx_get_metrics(warm, &x);
        CHECK_MSG(x.cached_tokens == 19, "cached %d of %d (the answer's last token was never evaluated)",
                  x.cached_tokens, n);
        CHECK(lmx_generate_ids(cold, prompt, n, &p, &r) == LMX_OK);
        CHECK_MSG(same_ids(&r, hot, n_hot), "%s: cached and cold generations differ", name);
        lmx_get_metrics(cold, &x);
        CHECK(x.cached_tokens == 0);
    }
    lmx_model_free(warm);
    lmx_model_free(cold);
    free(dir);
}

/* The same seed gives the same tokens; another seed other tokens. */
static void case_seeds(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    if (m) {
        const int32_t prompt[] = {1, 2, 3};
        lmx_gen_params p = lmx_gen_default_params();
        p.max_tokens = 24;
        p.ignore_eos = 1;
        p.sampler.temperature = 3.0f; /* flat enough that seeds matter */
        p.sampler.top_k = 0;
        p.sampler.top_p = 1;
        p.sampler.min_p = 0;
        p.sampler.seed = 7;
        int32_t first[24];
        lmx_result r;
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK && r.n_ids == 24);
        memcpy(first, r.ids, sizeof first);
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK);
        CHECK(same_ids(&r, first, 24));
        p.sampler.seed = 8;
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK);
        CHECK(!same_ids(&r, first, 24));
    }
    lmx_model_free(m);
    free(dir);
}

/* ---- cancellation from another thread ------------------------------------------------------- */

static void *cancel_thread(void *m) {
    lmx_cancel(m);
    return NULL;
}

static int cancel_at_3(const lmx_token *t, void *m) {
    if (t->index == 3) {
        pthread_t th;
        pthread_create(&th, NULL, cancel_thread, m);
        pthread_join(th, NULL);
    }
    return 0;
}

static void case_cancel(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    if (m) {
        const int32_t prompt[] = {1, 2, 3};
        lmx_gen_params p = greedy(50);
        p.ignore_eos = 1;
        p.on_token = cancel_at_3;
        p.user = m;
        lmx_result r;
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK);
        CHECK_MSG(r.finish == LMX_FINISH_CANCELLED && r.n_ids == 4, "finish %s after %d tokens",
                  lmx_finish_str(r.finish), r.n_ids);
        p.on_token = NULL; /* the next call runs again */
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK && r.n_ids == 50);
    }
    lmx_model_free(m);
    free(dir);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void case_errors(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 0);
    if (m) {
        lmx_gen_params p = greedy(4);
        lmx_result r;
        CHECK(lmx_generate(m, "hello", &p, &r) == LMX_ERR_MISSING); /* the fixtures have no tokenizer */
        CHECK(strstr(lmx_last_error(m), "tokenizer") != NULL);
        int32_t bad[] = {1, 1000000};
        CHECK(lmx_generate_ids(m, bad, 2, &p, &r) == LMX_ERR_INVALID_ARG);
        CHECK(lmx_generate_ids(m, bad, 0, &p, &r) == LMX_ERR_INVALID_ARG);
        const char *stop[] = {"x"};
        p.stop_strings = stop;
        p.n_stop_strings = 1;
        CHECK(lmx_generate_ids(m, bad, 1, &p, &r) == LMX_ERR_MISSING);
        lmx_model_info in;
        lmx_model_get_info(m, &in);
        int n = in.max_context + 1;
        int32_t *longp = calloc((size_t)n, sizeof *longp);
        p = greedy(4);
        CHECK(lmx_generate_ids(m, longp, n, &p, &r) == LMX_ERR_CONTEXT_FULL);
        free(longp);
        p.max_tokens = -1;
        CHECK(lmx_generate_ids(m, bad, 1, &p, &r) == LMX_ERR_INVALID_ARG);
    }
    lmx_model_free(m);
    free(dir);
}

/* ---- memory: bounded over a long generation, nothing allocated per token ---------------------- */

typedef struct alloc_probe {
    long at_token[1001];
    int64_t peak_at_100;
    lmx_model *m;
} alloc_probe;

static int probe(const lmx_token *t, void *user) {
    alloc_probe *a = user;
    if (t->index <= 1000) a->at_token[t->index] = atomic_load(&n_allocs);
    if (t->index == 100) {
        lmx_model_info in;
        lmx_model_get_info(a->m, &in);
        a->peak_at_100 = in.peak_memory_bytes;
    }
    return 0;
}

static void case_memory(const char *name) {
    char *dir = fixture(name, NULL);
    lmx_model *m = load(dir, 64); /* rotating caches of 64 positions */
    if (m) {
        static alloc_probe a;
        a.m = m;
        const int32_t prompt[] = {1, 2, 3};
        lmx_gen_params p = lmx_gen_default_params(); /* sampling, penalties on */
        p.max_tokens = 1000;
        p.ignore_eos = 1;
        p.sampler.repeat_penalty = 1.1f;
        p.on_token = probe;
        p.user = &a;
        lmx_result r;
        CHECK(lmx_generate_ids(m, prompt, 3, &p, &r) == LMX_OK && r.n_ids == 1000);
        long per_token = a.at_token[999] - a.at_token[2];
        CHECK_MSG(per_token == 0, "%ld allocations while decoding 997 tokens", per_token);
        lmx_model_info in;
        lmx_model_get_info(m, &in);
        CHECK_MSG(in.peak_memory_bytes == a.peak_at_100, "peak memory grew from %lld to %lld bytes",
                  (long long)a.peak_at_100, (long long)in.peak_memory_bytes);
        CHECK(in.memory_bytes > 0 && in.memory_bytes <= in.peak_memory_bytes);
    }
    lmx_model_free(m);
    free(dir);
}

/* ---- text: stories260K has a tokenizer ------------------------------------------------------- */

typedef struct text_sink {
    char buf[8192];
    size_t len;
} text_sink;

static int collect(const lmx_token *t, void *user) {
    text_sink *s = user;
    if (s->len + t->text_len < sizeof s->buf) {
        memcpy(s->buf + s->len, t->text, t->text_len);
        s->len += t->text_len;
        s->buf[s->len] = 0;
    }
    return 0;
}

static void case_stop_strings(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/real/stories260K.gguf", g_fixtures);
    lmx_model *m = load(path, 0);
    if (!m) return;
    lmx_gen_params p = greedy(60);
    lmx_result r;
    CHECK_MSG(lmx_generate(m, "Once upon a time", &p, &r) == LMX_OK, "%s", lmx_last_error(m));
    char full[8192];
    snprintf(full, sizeof full, "%s", r.text);
    int n_full = r.n_ids;
    /* the text of each token alone, to find a stop string that spans two tokens */
    text_sink sink = {.len = 0};
    p.on_token = collect;
    p.user = &sink;
    lmx_stream *s;
    CHECK(lmx_stream_open(m, "Once upon a time", &p, &s) == LMX_OK);
    const lmx_token *t;
    size_t ends[128];
    int k = 0;
    while (lmx_stream_next(s, &t) == LMX_OK && t && k < 128) {
        collect(t, &sink);
        ends[k++] = sink.len;
    }
    lmx_stream_free(s);
    CHECK_MSG(!strcmp(sink.buf, full), "stream text \"%s\" != generate text \"%s\"", sink.buf, full);
    /* a stop string made of the last 2 bytes of token j and the first 2 of token j + 1 */
    int j = -1;
    for (int i = 3; i + 1 < k && j < 0; i++)
        if (ends[i] - ends[i - 1] >= 2 && ends[i + 1] - ends[i] >= 2) j = i;
    CHECK(j > 0);
    if (j > 0) {
        char stop[8];
        memcpy(stop, full + ends[j] - 2, 4);
        stop[4] = 0;
        const char *stops[] = {"never appears", stop};
        size_t first = (size_t)(strstr(full, stop) - full);
        static text_sink got;
        got.len = 0;
        got.buf[0] = 0;
        p.user = &got;
        p.stop_strings = stops;
        p.n_stop_strings = 2;
        CHECK(lmx_generate(m, "Once upon a time", &p, &r) == LMX_OK);
        CHECK(r.finish == LMX_FINISH_STOP_STRING);
        CHECK_MSG(r.text_len == first && !strncmp(r.text, full, first), "stopped text \"%s\", expected the first %zu bytes of \"%s\"",
                  r.text, first, full);
        CHECK_MSG(!strcmp(got.buf, r.text), "streamed \"%s\" != result \"%s\"", got.buf, r.text);
        CHECK(r.n_ids < n_full);
    }
    lmx_model_free(m);
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");
    case_sampler_table();
    case_sampler_topk();
    const char *models[] = {"llama", "qwen3", "gemma3", "gemma4_kv", "gemma4_moe"};
    for (int i = 0; i < 5; i++) {
        case_greedy_fixture(models[i]);
        case_classify(models[i]);
    }
    case_batch_equals_single("qwen3");
    case_batch_wide("llama");
    case_batch_wide("gemma3");
    for (int pad = 0; pad < 2; pad++) {
        case_batch_ends_apart("llama", pad);
        case_batch_ends_apart("gemma3", pad); /* sliding-window layers: rotating caches */
    }
    case_prompt_cache("llama");
    case_seeds("llama");
    case_cancel("llama");
    case_errors("llama");
    case_memory("qwen3");
    case_memory("gemma4_kv");  /* shared KV, per-layer inputs */
    case_memory("gemma4_moe"); /* experts beside the MLP */
    case_stop_strings();
    return check_summary("test_runtime");
}
