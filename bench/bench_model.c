/* bench_model.c - prefill and decode speed of any model lmx loads (directory or GGUF file).
 *
 * usage: bench_model MODEL [--prompt N] [--tokens N] [--threads N] [--reps N] [--json]
 * Prefill: N random token ids in one lmx_context_eval (best of --reps, after one warm-up pass
 * that also faults in the mapped weights).  Decode: --tokens greedy single-token steps after the
 * prompt; reports tok/s from the mean step time.  Bytes/token: the model's weight bytes (every
 * weight is read once per decoded token except all but one row of the embedding table). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lmx.h"
#include "bench_util.h"

static int32_t argmax(const float *v, int n) {
    int32_t b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int prompt = 128, tokens = 64, threads = 0, reps = 3, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--prompt") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(a, "--tokens") && i + 1 < argc) tokens = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(a, "--json")) json = 1;
        else if (a[0] != '-' && !path) path = a;
        else {
            fprintf(stderr, "usage: bench_model MODEL [--prompt N] [--tokens N] [--threads N] [--reps N] [--json]\n");
            return 2;
        }
    }
    if (!path || prompt < 1 || tokens < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_model MODEL [--prompt N] [--tokens N] [--threads N] [--reps N] [--json]\n");
        return 2;
    }
    lmx_load_params lp = lmx_load_default_params();
    lp.n_threads = threads;
    lmx_model *m = NULL;
    double t0 = bench_now_s();
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "bench_model: %s\n", lmx_last_error(NULL));
        return 1;
    }
    double load_s = bench_now_s() - t0;
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    float *logits = malloc((size_t)in.vocab_size * sizeof *logits);
    lmx_context *c = NULL;
    int rc = 1;
    if (!ids || !logits || lmx_context_create(m, NULL, &c) != LMX_OK) goto done;
    unsigned s = 12345;
    for (int i = 0; i < prompt; i++) ids[i] = (int32_t)((s = s * 1103515245u + 12345u) >> 8) % in.vocab_size;
    double best = 1e30;
    for (int r = 0; r <= reps; r++) { /* r == 0 warms up */
        lmx_context_reset(c);
        double a = bench_now_s();
        if (lmx_context_eval(c, ids, prompt, logits, 0) != LMX_OK) goto fail;
        double dt = bench_now_s() - a;
        if (r > 0 && dt < best) best = dt;
    }
    double decode_s = 0;
    int32_t next = argmax(logits, in.vocab_size);
    for (int g = 0; g < tokens; g++) {
        double a = bench_now_s();
        if (lmx_context_eval(c, &next, 1, logits, 0) != LMX_OK) goto fail;
        decode_s += bench_now_s() - a;
        next = argmax(logits, in.vocab_size);
    }
    double pp = prompt / best, tg = tokens / decode_s;
    double bytes = (double)in.weight_bytes * (1.0 - 1.0 / in.vocab_size); /* embedding: one row */
    if (json)
        printf("{\"engine\":\"lmx\",\"model\":\"%s\",\"dtype\":\"%s\",\"load_s\":%.4f,\"prompt\":%d,\"prefill_tok_s\":%.2f,"
               "\"decode_tok_s\":%.2f,\"weight_bytes\":%lld,\"decode_gb_s\":%.2f}\n",
               path, in.dtype, load_s, prompt, pp, tg, (long long)in.weight_bytes, bytes * tg / 1e9);
    else
        printf("%s (%s, %s)\n  load %.3f s  prefill %d: %.1f tok/s  decode: %.2f tok/s  (~%.1f GB/s of weights)\n", path,
               in.architecture, in.dtype, load_s, prompt, pp, tg, bytes * tg / 1e9);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_model: %s\n", lmx_last_error(m));
done:
    lmx_context_free(c);
    lmx_model_free(m);
    free(ids);
    free(logits);
    return rc;
}
