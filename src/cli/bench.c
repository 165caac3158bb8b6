/* bench.c - `lmx bench MODEL [--json]`: load time, prefill and decode speed, batched decode, peak
 * GPU memory and the achieved weight bandwidth next to the device's measured copy bandwidth.
 *
 * Every timed call returns logits to the host, so wall-clock time covers the device work; they land in
 * the backend's fastest host memory (lmx_host_alloc: page-locked on cuda), as an application reading
 * logits every step would hold them.  Token ids are random (xorshift); each figure is the median of its
 * repetitions after one warm-up.
 * "generate" runs the stream API (sampling included; only the sampler's top-k candidates cross to
 * the host on a GPU) and reports its decode tokens/s; "batch B generate" the same for B sequences at once
 * (lmx_batch_generate_ids, greedy).
 * Bytes per decoded token = every weight byte except the embedding table (one row is read), plus
 * the output head (the table itself when tied), plus the KV cache read at that context (bf16 on
 * cuda, f32 on the cpu).  Achieved bandwidth = bytes per token x tokens/s. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef LMX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "cli.h"
#include "lmx.h"

typedef struct bench {
    lmx_model *m;
    lmx_model_info in;
    int V, cuda;
    uint64_t rng;
    double peak_gpu;      /* bytes in use on the device (total - free), the most seen */
    lmx_adapter *ad[4];   /* --adapter: the first is the model's default; batches take them in turn */
    int n_ad;
} bench;

static int32_t tok(bench *b) {
    return (int32_t)(cli_xorshift(&b->rng) % (uint64_t)(b->V > 1000 ? 1000 : b->V)) + (b->V > 2000 ? 500 : 0);
}

static void sample_gpu_mem(bench *b) {
#ifdef LMX_HAVE_CUDA
    size_t fr = 0, tot = 0;
    if (b->cuda && cudaMemGetInfo(&fr, &tot) == cudaSuccess && (double)(tot - fr) > b->peak_gpu)
        b->peak_gpu = (double)(tot - fr);
#else
    (void)b;
#endif
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double cli_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Device-to-device copy bandwidth (read + write bytes per second) of a 1 GiB buffer; 0 on the cpu. */
static double copy_bandwidth(bench *b) {
#ifdef LMX_HAVE_CUDA
    if (!b->cuda) return 0;
    size_t n = (size_t)1 << 30;
    void *src = NULL, *dst = NULL;
    if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&dst, n) != cudaSuccess) {
        cudaGetLastError();
        cudaFree(src);
        return 0;
    }
    cudaMemset(src, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float best = 1e30f;
    for (int i = 0; i < 8; i++) {
        cudaEventRecord(e0, 0);
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, 0);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        if (i > 0 && ms < best) best = ms;
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(src);
    cudaFree(dst);
    return 2.0 * (double)n / (best * 1e-3);
#else
    (void)b;
    return 0;
#endif
}

/* Tokens/s of prefilling n tokens into a fresh context (median of reps after a warm-up). */
static double prefill(bench *b, int n, int reps, float *logits) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    lmx_context *c = NULL;
    double t[8], r = -1;
    if (!ids || lmx_context_create(b->m, NULL, &c) != LMX_OK) goto done;
    for (int i = 0; i < n; i++) ids[i] = tok(b);
    for (int i = 0; i <= reps; i++) {
        lmx_context_reset(c);
        double t0 = cli_now_s();
        if (lmx_context_eval(c, ids, n, logits, 0) != LMX_OK) goto done;
        if (i > 0) t[i - 1] = cli_now_s() - t0;
        sample_gpu_mem(b);
    }
    r = n / cli_median(t, reps);
done:
    lmx_context_free(c);
    free(ids);
    return r;
}

/* Decode tokens/s of one sequence after a prompt of ctx tokens (steps timed one by one). */
static double decode(bench *b, int ctx, int steps, float *logits) {
    lmx_context *c = NULL;
    double r = -1;
    int n0 = ctx > 0 ? ctx : 1;
    int32_t *ids = malloc((size_t)n0 * sizeof *ids);
    double *t = malloc((size_t)steps * sizeof *t);
    if (!ids || !t || lmx_context_create(b->m, NULL, &c) != LMX_OK) goto done;
    for (int i = 0; i < n0; i++) ids[i] = tok(b);
    if (lmx_context_eval(c, ids, n0, logits, 0) != LMX_OK) goto done;
    int32_t next = tok(b);
    if (lmx_context_eval(c, &next, 1, logits, 0) != LMX_OK) goto done; /* warm-up */
    for (int s = 0; s < steps; s++) {
        next = tok(b);
        double t0 = cli_now_s();
        if (lmx_context_eval(c, &next, 1, logits, 0) != LMX_OK) goto done;
        t[s] = cli_now_s() - t0;
    }
    sample_gpu_mem(b);
    r = 1.0 / cli_median(t, steps);
done:
    lmx_context_free(c);
    free(ids);
    free(t);
    return r;
}

/* Decode tokens/s of a generation through the stream API (what `lmx run` does: sampling included,
 * on the GPU when the backend selects the candidates) after a 16-token prompt; temperature 0 is
 * greedy, else the default sampler (top-k 40, top-p 0.95, min-p 0.05) at that temperature. */
static double generate(bench *b, int steps, float temperature) {
    int32_t ids[16];
    for (int i = 0; i < 16; i++) ids[i] = tok(b);
    lmx_gen_params gp = lmx_gen_default_params();
    gp.max_tokens = steps + 1;
    gp.ignore_eos = 1;
    gp.sampler.temperature = temperature;
    gp.sampler.seed = 1;
    lmx_stream *s = NULL;
    if (lmx_stream_open_ids(b->m, ids, 16, &gp, &s) != LMX_OK) return -1;
    const lmx_token *t;
    int n = 0;
    while (lmx_stream_next(s, &t) == LMX_OK && t) n++;
    lmx_stream_free(s);
    lmx_metrics x;
    lmx_get_metrics(b->m, &x);
    return n == steps + 1 ? x.decode_tokens_per_s : -1;
}

/* Batched decode: B sequences after a prompt of ctx tokens each (prefilled CH tokens a call), tokens/s summed over
 * the batch. */
static double decode_batch(bench *b, int B, int steps, int ctx) {
    enum { CH = 256 };
    const int P = ctx < CH ? ctx : CH;
    lmx_context **cs = calloc((size_t)B, sizeof *cs);
    int32_t *ids = malloc((size_t)B * P * sizeof *ids);
    int *lens = malloc((size_t)B * sizeof *lens);
    float *logits = lmx_host_alloc(b->m, (size_t)B * b->V * sizeof *logits);
    double *t = malloc((size_t)steps * sizeof *t), r = -1;
    if (!cs || !ids || !lens || !logits || !t) goto done;
    for (int i = 0; i < B; i++)
        if (lmx_context_create(b->m, NULL, &cs[i]) != LMX_OK ||
            (b->n_ad > 1 && lmx_context_set_adapter(cs[i], b->ad[i % b->n_ad]) != LMX_OK))
            goto done;
    for (int at = 0; at < ctx; at += P) {
        const int n = ctx - at < P ? ctx - at : P;
        for (int i = 0; i < B * n; i++) ids[i] = tok(b);
        for (int i = 0; i < B; i++) lens[i] = n;
        if (lmx_eval_batch(b->m, cs, B, ids, lens, n, logits) != LMX_OK) goto done;
    }
    for (int i = 0; i < B; i++) lens[i] = 1;
    for (int s = -1; s < steps; s++) {
        for (int i = 0; i < B; i++) ids[i] = tok(b);
        double t0 = cli_now_s();
        if (lmx_eval_batch(b->m, cs, B, ids, lens, 1, logits) != LMX_OK) goto done;
        if (s >= 0) t[s] = cli_now_s() - t0;
    }
    sample_gpu_mem(b);
    r = B / cli_median(t, steps);
done:
    for (int i = 0; cs && i < B; i++) lmx_context_free(cs[i]);
    free(cs);
    free(ids);
    free(lens);
    lmx_host_free(b->m, logits);
    free(t);
    return r;
}

/* Decode tokens/s of a greedy batched generation (lmx_batch_generate_ids, the C API's batched generation: host
 * sampling included; on a GPU only each sequence's next id crosses to the host, where decode_batch brings every
 * row's logits) of B prompts of ctx tokens, summed over the batch: its decode time from the first token to the last,
 * after a warm-up generation of the same batch (each call makes new contexts, so its first steps record and capture
 * the decode graph again, as a user's call would).  stagger: as requests come, prompts of ctx .. ctx + 28 tokens
 * and sequences that end at different steps (max_tokens from steps / 4 + 1 to steps + 1, all of them different up
 * to B = 3 steps / 4).  *prefill_tok_s: the batch's prompts, tokens/s (prefilled together, lmx_batch_generate_ids). */
static double generate_batch(bench *b, int B, int steps, int ctx, int stagger, double *prefill_tok_s) {
    int32_t **ps = calloc((size_t)B, sizeof *ps);
    int *lens = malloc((size_t)B * sizeof *lens);
    lmx_gen_params *gp = malloc((size_t)B * sizeof *gp);
    lmx_result *res = calloc((size_t)B, sizeof *res);
    double r = -1;
    if (!ps || !lens || !gp || !res) goto done;
    for (int i = 0; i < B; i++) {
        if (!(ps[i] = malloc((size_t)(ctx + 28) * sizeof **ps))) goto done;
        for (int t = 0; t < ctx + 28; t++) ps[i][t] = tok(b);
        lens[i] = ctx + (stagger ? i * 7 % 29 : 0);
        gp[i] = lmx_gen_default_params();
        gp[i].ignore_eos = 1;
        gp[i].sampler.temperature = 0.0f;
        gp[i].adapter = b->n_ad > 1 ? b->ad[i % b->n_ad] : NULL;
    }
    int total = 0;
    for (int pass = 0; pass < 2; pass++) { /* a warm-up, then the measure */
        total = 0;
        for (int i = 0; i < B; i++) {
            const int spread = (int)((int64_t)i * (steps - steps / 4) / (B > 1 ? B - 1 : 1)); /* 0 .. 3 steps / 4 */
            gp[i].max_tokens = !pass ? 8 : stagger ? steps / 4 + 1 + spread : steps + 1;
            total += gp[i].max_tokens;
        }
        if (lmx_batch_generate_ids(b->m, (const int32_t *const *)ps, lens, B, gp, res) != LMX_OK) goto done;
    }
    sample_gpu_mem(b);
    lmx_metrics x;
    lmx_get_metrics(b->m, &x);
    r = x.generated_tokens == total ? x.decode_tokens_per_s : -1;
    *prefill_tok_s = x.prompt_tokens > 0 && r >= 0 ? x.prefill_tokens_per_s : -1;
done:
    for (int i = 0; ps && i < B; i++) free(ps[i]);
    free(ps);
    free(lens);
    free(gp);
    free(res);
    return r;
}

int cmd_bench(int argc, char **argv) {
    const char *path = NULL, *backend = "auto", *adapters[4];
    int json = 0, steps = 64, long_ctx = 4096, n_adapters = 0, only_batch = 0, batch_ctx = 16;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: lmx bench MODEL [--backend NAME] [--steps N] [--long-ctx N] [--adapter DIR]... [--batch B]\n"
                   "                 [--batch-ctx N] [--json]\n\n"
                   "Load time; prefill tokens/s at 512 and 2048 tokens; decode tokens/s at context 0 and\n"
                   "--long-ctx (4096); decode through the stream API, greedy and sampled (sampling included);\n"
                   "batched decode (lmx_eval_batch: every row's logits to the host) at batch 1, 8 and 32, and\n"
                   "batched greedy generation (lmx_batch_generate_ids: ids only) at 8 and 32, and at 32 staggered\n"
                   "(prompts of N..N+28 tokens, sequences ending at different steps, as requests come), with\n"
                   "their prefill tokens/s (the prompts together); peak GPU memory;\n"
                   "achieved bandwidth (bytes read per token x tokens/s) next to the measured device copy\n"
                   "bandwidth.  Token ids are random.  --json prints one JSON object instead.\n"
                   "--adapter DIR (up to 4 times) loads LoRA adapters: the first applies to every figure; with\n"
                   "several, the sequences of a batch take them in turn (one batch mixes them).\n"
                   "--batch B (1 to 64) measures batched decode at batch B alone (for a profiler, or a batch size\n"
                   "between the three); the rest print 0.  --batch-ctx N: each batched sequence decodes after a\n"
                   "prompt of N tokens (default 16).\n");
            return 0;
        }
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(a, "--adapter") && i + 1 < argc) {
            if (n_adapters == 4) return cli_usage_error("bench: at most 4 adapters");
            adapters[n_adapters++] = argv[++i];
        }
        else if (!strcmp(a, "--steps") && i + 1 < argc) { if (cli_parse_int(argv[++i], &steps) || steps < 1) return cli_usage_error("bench: bad --steps"); }
        else if (!strcmp(a, "--batch") && i + 1 < argc) { if (cli_parse_int(argv[++i], &only_batch) || only_batch < 1 || only_batch > 64) return cli_usage_error("bench: --batch takes 1 to 64"); }
        else if (!strcmp(a, "--batch-ctx") && i + 1 < argc) { if (cli_parse_int(argv[++i], &batch_ctx) || batch_ctx < 1) return cli_usage_error("bench: bad --batch-ctx"); }
        else if (!strcmp(a, "--long-ctx") && i + 1 < argc) { if (cli_parse_int(argv[++i], &long_ctx) || long_ctx < 0) return cli_usage_error("bench: bad --long-ctx"); }
        else if (a[0] == '-') return cli_usage_error("bench: unknown option or missing value: %s", a);
        else if (path) return cli_usage_error("bench: more than one model given");
        else path = a;
    }
    if (!path) return cli_usage_error("bench: no model given");
    bench b = {.rng = 0x2545F4914F6CDD1Dull};
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    double t0 = cli_now_s();
    if (lmx_model_load(path, &lp, &b.m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        return 1;
    }
    double load_s = cli_now_s() - t0;
    for (int i = 0; i < n_adapters; i++)
        if (lmx_adapter_load(b.m, adapters[i], &b.ad[b.n_ad++]) != LMX_OK) {
            fprintf(stderr, "lmx: %s: %s\n", adapters[i], lmx_last_error(b.m));
            lmx_model_free(b.m);
            return 1;
        }
    if (b.n_ad) lmx_model_set_adapter(b.m, b.ad[0]);
    lmx_model_get_info(b.m, &b.in);
    b.V = b.in.vocab_size;
    b.cuda = !strcmp(b.in.backend, "cuda");
    sample_gpu_mem(&b);
    float *logits = lmx_host_alloc(b.m, (size_t)b.V * sizeof *logits);
    if (!logits) {
        lmx_model_free(b.m);
        return 1;
    }

    /* bytes per decoded token */
    const lmx_model_info *in = &b.in;
    double KD = (double)in->n_kv_heads * in->head_dim;
    double bytes_tok = (double)in->weight_bytes - (double)in->table_bytes; /* a row of each table */
    if (in->n_experts > 0) /* a mixture of experts reads only the experts each token chooses */
        bytes_tok -= (double)in->expert_bytes * (1.0 - (double)in->n_experts_used / in->n_experts);
    double kv_bytes_pos = 2.0 * in->n_layers * KD * (b.cuda ? 2 : 4);

    double copy_bw = 0, pp512 = 0, pp2048 = 0, tg0 = 0, tgL = 0, gen_greedy = 0, gen_sampled = 0; /* --batch: 0 */
    if (!only_batch) {
        copy_bw = copy_bandwidth(&b);
        pp512 = prefill(&b, 512, 3, logits);
        pp2048 = prefill(&b, 2048, 3, logits);
        tg0 = decode(&b, 0, steps, logits);
        tgL = long_ctx > 0 ? decode(&b, long_ctx, steps / 2 > 8 ? steps / 2 : 8, logits) : 0;
        generate(&b, 8, 0.0f); /* warm-up */
        gen_greedy = generate(&b, steps, 0.0f);
        gen_sampled = generate(&b, steps, 0.8f);
    }
    int Bs[3] = {1, 8, 32};
    if (only_batch && only_batch != 1 && only_batch != 32) Bs[1] = only_batch; /* reported in the middle place */
    double bt[3] = {0, 0, 0}, gb[3] = {0, 0, 0}; /* gb: batched greedy generation, batches of 2 or more */
    double gs = 0, gp[3] = {0, 0, 0}, gsp = 0; /* the same at 32, staggered; the batches' prefill tokens/s */
    const int bsteps = steps / 4 > 8 ? steps / 4 : 8;
    for (int i = 0; i < 3; i++)
        if (!only_batch || Bs[i] == only_batch) {
            bt[i] = decode_batch(&b, Bs[i], bsteps, batch_ctx);
            if (Bs[i] > 1) /* on a GPU over all the steps: its first steps capture the decode graph */
                gb[i] = generate_batch(&b, Bs[i], b.cuda ? steps : bsteps, batch_ctx, 0, &gp[i]);
        }
    if (!only_batch || only_batch == 32) gs = generate_batch(&b, 32, b.cuda ? steps : bsteps, batch_ctx, 1, &gsp);
    double bw0 = bytes_tok * tg0, bwL = (bytes_tok + kv_bytes_pos * long_ctx) * tgL;
    const int failed = pp512 < 0 || pp2048 < 0 || tg0 < 0 || tgL < 0 || gen_greedy < 0 || gen_sampled < 0 || bt[0] < 0 ||
                       bt[1] < 0 || bt[2] < 0 || gb[1] < 0 || gb[2] < 0 || gs < 0;
    if (failed) /* the figures print as -1; the last error says why */
        fprintf(stderr, "lmx bench: a measurement failed: %s\n", lmx_last_error(b.m));

    if (json) {
        printf("{\"model\": \"%s\", \"architecture\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", "
               "\"n_params\": %lld, \"weight_bytes\": %lld, \"bytes_per_token\": %.0f, \"load_s\": %.3f, "
               "\"prefill512_tok_s\": %.1f, \"prefill2048_tok_s\": %.1f, \"decode_ctx0_tok_s\": %.2f, "
               "\"long_ctx\": %d, \"decode_long_tok_s\": %.2f, \"generate_greedy_tok_s\": %.2f, "
               "\"generate_sampled_tok_s\": %.2f, "
               "\"batch_ctx\": %d, \"batch1_tok_s\": %.2f, \"batch%d_tok_s\": %.2f, "
               "\"batch32_tok_s\": %.2f, \"generate_batch%d_tok_s\": %.2f, \"generate_batch32_tok_s\": %.2f, "
               "\"generate_batch32_staggered_tok_s\": %.2f, \"generate_batch32_prefill_tok_s\": %.1f, "
               "\"generate_batch32_staggered_prefill_tok_s\": %.1f, "
               "\"peak_gpu_bytes\": %.0f, \"achieved_bw_ctx0\": %.4g, "
               "\"achieved_bw_long\": %.4g, \"copy_bw\": %.4g, \"adapters\": %d}\n",
               path, in->architecture, in->backend, in->dtype, (long long)in->n_params, (long long)in->weight_bytes,
               bytes_tok, load_s, pp512, pp2048, tg0, long_ctx, tgL, gen_greedy, gen_sampled, batch_ctx, bt[0], Bs[1],
               bt[1], bt[2], Bs[1], gb[1], gb[2], gs, gp[2], gsp, b.peak_gpu, bw0, bwL, copy_bw, b.n_ad);
    } else {
        printf("%s: %s, %s weights, %s backend, %.2f B params, %.2f GB weights, %.2f GB read per token\n", path,
               in->architecture, in->dtype, in->backend, in->n_params / 1e9, in->weight_bytes / 1e9, bytes_tok / 1e9);
        if (b.n_ad) printf("adapters             %d (LoRA, unmerged; batches mix them)\n", b.n_ad);
        printf("load                 %8.2f s\n", load_s);
        printf("prefill 512          %8.1f tok/s\n", pp512);
        printf("prefill 2048         %8.1f tok/s\n", pp2048);
        printf("decode ctx 0         %8.2f tok/s   %7.1f GB/s\n", tg0, bw0 / 1e9);
        if (long_ctx > 0) printf("decode ctx %-5d     %8.2f tok/s   %7.1f GB/s\n", long_ctx, tgL, bwL / 1e9);
        printf("generate, greedy     %8.2f tok/s   (stream API, sampling included)\n", gen_greedy);
        printf("generate, sampled    %8.2f tok/s   (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05)\n", gen_sampled);
        for (int i = 0; i < 3; i++)
            printf("batch %-2d decode      %8.2f tok/s   (after %d tokens a sequence)\n", Bs[i], bt[i], batch_ctx);
        for (int i = 1; i < 3; i++)
            printf("batch %-2d generate    %8.2f tok/s   (greedy, lmx_batch_generate_ids)\n", Bs[i], gb[i]);
        printf("batch 32 staggered   %8.2f tok/s   (prompts of %d..%d tokens, sequences ending at different steps)\n",
               gs, batch_ctx, batch_ctx + 28);
        printf("batch 32 prefill     %8.1f tok/s   (its 32 prompts together; staggered %.1f)\n", gp[2], gsp);
        if (b.cuda) {
            printf("peak GPU memory      %8.2f GiB (device total - free)\n", b.peak_gpu / 1073741824.0);
            printf("copy bandwidth       %8.1f GB/s (device to device, read + write)\n", copy_bw / 1e9);
            if (copy_bw > 0) printf("roofline (ctx 0)     %8.1f %% of copy bandwidth\n", 100 * bw0 / copy_bw);
        }
    }
    lmx_host_free(b.m, logits);
    lmx_model_free(b.m);
    return failed;
}
