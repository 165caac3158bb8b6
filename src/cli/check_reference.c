/* check_reference.c - `lmx check-reference MODEL_DIR`: compare lmx's logits with reference logits
 * from an independent implementation, stored in MODEL_DIR/reference.safetensors:
 *   short_/long_prompt [P], short_/long_sequence [L], short_/long_logits [L-1, V]
 *   batch_prompts [B, T] (right-padded), batch_lengths [B], batch_last_logits [B, V]
 * Checks: (1) prefill of each whole sequence, (2) prefill of the prompt then one-token decode
 * steps through the KV cache, (3) the padded batch.  Tolerances (fixtures README):
 *   f32:  every logit within 2e-3 + 1e-3 * max|ref| of its position;
 *   bf16: relative L2 error <= 2e-2 per position, same argmax where the top-2 margin > 0.1;
 *   rel:X: relative L2 error <= X per position (e.g. a quantized model against dense logits). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/half.h"
#include "../formats/safetensors.h"
#include "cli.h"
#include "lmx.h"

typedef enum tol_kind { TOL_F32, TOL_BF16, TOL_REL } tol_kind;

typedef struct check {
    const lmx_st_set *ref;
    lmx_model *m;
    int V;
    tol_kind tol;
    double rel;          /* TOL_REL: the largest relative L2 error allowed per position */
    int n_ctx;
    int failed;
    int ran;             /* checks that ran */
} check;

/* A reference tensor as a fresh array of int32 / float (caller frees); NULL if absent. */
static int32_t *ref_ints(const check *k, const char *name, int64_t *n) {
    const lmx_st_tensor *t = lmx_st_set_find(k->ref, name);
    if (!t || (t->dtype != LMX_DTYPE_I32 && t->dtype != LMX_DTYPE_I64)) return NULL;
    int32_t *out = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof *out);
    if (!out) return NULL;
    for (int64_t i = 0; i < t->n_elements; i++) {
        int64_t v;
        if (t->dtype == LMX_DTYPE_I32) { int32_t x; memcpy(&x, (const char *)t->data + 4 * i, 4); v = x; }
        else memcpy(&v, (const char *)t->data + 8 * i, 8);
        out[i] = (int32_t)v;
    }
    *n = t->n_elements;
    return out;
}

static float *ref_floats(const check *k, const char *name, int64_t rows, const char **why) {
    const lmx_st_tensor *t = lmx_st_set_find(k->ref, name);
    if (!t) { *why = "missing"; return NULL; }
    if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != k->V) { *why = "has the wrong shape"; return NULL; }
    float *out = malloc((size_t)t->n_elements * sizeof *out);
    if (!out) { *why = "out of memory"; return NULL; }
    for (int64_t i = 0; i < t->n_elements; i++) {
        const char *p = t->data;
        switch (t->dtype) {
        case LMX_DTYPE_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case LMX_DTYPE_F64: { double d; memcpy(&d, p + 8 * i, 8); out[i] = (float)d; break; }
        case LMX_DTYPE_BF16: { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = lmx_bf16_to_f32(h); break; }
        case LMX_DTYPE_F16: { uint16_t h; memcpy(&h, p + 2 * i, 2); out[i] = lmx_f16_to_f32(h); break; }
        default: free(out); *why = "has a non-float dtype"; return NULL;
        }
    }
    return out;
}

typedef struct score {
    double max_abs;      /* largest |out - ref| */
    double worst;        /* largest error / tolerance (f32) or rel L2 / 2e-2 (bf16) */
    int argmax_mismatch; /* bf16: positions whose argmax differs where the margin > 0.1 */
    int positions;
} score;

static int argmax(const float *x, int n, float *margin) {
    int a = 0, b = -1;
    for (int i = 1; i < n; i++) {
        if (x[i] > x[a]) { b = a; a = i; }
        else if (b < 0 || x[i] > x[b]) b = i;
    }
    *margin = b >= 0 ? x[a] - x[b] : INFINITY;
    return a;
}

static void compare_row(const check *k, const float *out, const float *ref, score *s) {
    double max_ref = 0, max_err = 0, d2 = 0, r2 = 0;
    for (int v = 0; v < k->V; v++) {
        double e = fabs((double)out[v] - ref[v]);
        if (!(e == e)) e = INFINITY; /* NaN counts as infinitely wrong */
        if (fabs(ref[v]) > max_ref) max_ref = fabs(ref[v]);
        if (e > max_err) max_err = e;
        d2 += e * e;
        r2 += (double)ref[v] * ref[v];
    }
    double ratio;
    if (k->tol == TOL_F32) {
        ratio = max_err / (2e-3 + 1e-3 * max_ref);
    } else if (k->tol == TOL_REL) {
        ratio = sqrt(d2) / (sqrt(r2) > 0 ? sqrt(r2) : 1) / k->rel;
    } else {
        ratio = sqrt(d2) / (sqrt(r2) > 0 ? sqrt(r2) : 1) / 2e-2;
        float mo, mr;
        int ao = argmax(out, k->V, &mo), ar = argmax(ref, k->V, &mr);
        if (mr > 0.1f && ao != ar) s->argmax_mismatch++;
    }
    if (max_err > s->max_abs) s->max_abs = max_err;
    if (ratio > s->worst) s->worst = ratio;
    s->positions++;
}

static void report(check *k, const char *what, const score *s) {
    int ok = s->worst <= 1.0 && s->argmax_mismatch == 0 && s->positions > 0;
    printf("%-28s %4d positions  max|err| %.3e  err/tol %.3f%s  %s\n", what, s->positions, s->max_abs,
           s->worst, s->argmax_mismatch ? "  ARGMAX MISMATCH" : "", ok ? "ok" : "FAIL");
    if (!ok) k->failed = 1;
    k->ran++;
}

static int fail_api(check *k, const char *what) {
    printf("%-28s FAIL: %s\n", what, lmx_last_error(k->m));
    k->failed = 1;
    return -1;
}

/* (1) whole-sequence prefill and (2) prompt prefill + cached decode, for one sequence set. */
static int check_sequence(check *k, const char *set) {
    char name[64], what[64];
    int64_t L = 0, P = 0;
    snprintf(name, sizeof name, "%s_logits", set);
    if (!lmx_st_set_find(k->ref, name)) {
        printf("%-28s skipped (no %s in the reference)\n", set, name);
        return 0;
    }
    snprintf(name, sizeof name, "%s_sequence", set);
    int32_t *seq = ref_ints(k, name, &L);
    snprintf(name, sizeof name, "%s_prompt", set);
    int32_t *prompt = ref_ints(k, name, &P);
    snprintf(name, sizeof name, "%s_logits", set);
    const char *why = "";
    float *ref = seq ? ref_floats(k, name, L - 1, &why) : NULL;
    float *out = ref ? malloc((size_t)L * k->V * sizeof *out) : NULL;
    lmx_context *c = NULL;
    float *row = NULL;
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = k->n_ctx;
    int rc = -1;
    if (!seq || !prompt || !ref || !out || L < 2 || P < 1 || P >= L) {
        printf("%-28s FAIL: reference %s_sequence/_prompt/_logits missing or inconsistent%s%s\n", set, set,
               *why ? ": logits " : "", why);
        k->failed = 1;
        goto done;
    }
    if (lmx_context_create(k->m, &cp, &c) != LMX_OK) { fail_api(k, set); goto done; }

    score s1 = {0};
    snprintf(what, sizeof what, "%s prefill", set);
    if (lmx_context_eval(c, seq, (int)L - 1, out, 1) != LMX_OK) { fail_api(k, what); goto done; }
    for (int64_t t = 0; t < L - 1; t++) compare_row(k, out + t * k->V, ref + t * k->V, &s1);
    report(k, what, &s1);

    score s2 = {0};
    snprintf(what, sizeof what, "%s prompt+decode", set);
    lmx_context_reset(c);
    if (lmx_context_eval(c, prompt, (int)P, out, 1) != LMX_OK) { fail_api(k, what); goto done; }
    for (int64_t t = 0; t < P; t++) compare_row(k, out + t * k->V, ref + t * k->V, &s2);
    /* each decoded row into the backend's host memory, as an application reading logits every step would
     * hold them (on cuda a replayed decode graph writes them there itself: cuda_graph.cu, read_ahead) */
    row = lmx_host_alloc(k->m, (size_t)k->V * sizeof *row);
    if (!row) { fail_api(k, what); goto done; }
    for (int64_t t = P; t < L - 1; t++) {
        if (lmx_context_eval(c, &seq[t], 1, row, 0) != LMX_OK) { fail_api(k, what); goto done; }
        compare_row(k, row, ref + t * k->V, &s2);
    }
    report(k, what, &s2);
    rc = 0;
done:
    lmx_context_free(c);
    lmx_host_free(k->m, row);
    free(seq);
    free(prompt);
    free(ref);
    free(out);
    return rc;
}

/* (3) the right-padded batch: each row's last logits equal the prompt's computed alone. */
static void check_batch(check *k) {
    if (!lmx_st_set_find(k->ref, "batch_last_logits")) {
        printf("%-28s skipped (no batch_last_logits in the reference)\n", "batch");
        return;
    }
    const lmx_st_tensor *bp = lmx_st_set_find(k->ref, "batch_prompts");
    int64_t nb = 0, nl = 0;
    int32_t *prompts = ref_ints(k, "batch_prompts", &nb);
    int32_t *lens = ref_ints(k, "batch_lengths", &nl);
    int B = bp && bp->ndim == 2 ? (int)bp->shape[0] : 0, T = B ? (int)bp->shape[1] : 0;
    const char *why = "";
    float *ref = B ? ref_floats(k, "batch_last_logits", B, &why) : NULL;
    float *out = B ? malloc((size_t)B * k->V * sizeof *out) : NULL;
    lmx_context **ctxs = B ? calloc((size_t)B, sizeof *ctxs) : NULL;
    int *ilens = B ? malloc((size_t)B * sizeof *ilens) : NULL;
    if (!prompts || !lens || !ref || !out || !ctxs || !ilens || nl != B) {
        printf("%-28s FAIL: reference batch_prompts/_lengths/_last_logits missing or inconsistent%s%s\n", "batch",
               *why ? ": " : "", why);
        k->failed = 1;
        goto done;
    }
    lmx_context_params cp = lmx_context_default_params();
    cp.n_ctx = k->n_ctx;
    for (int b = 0; b < B; b++) {
        ilens[b] = lens[b];
        if (lmx_context_create(k->m, &cp, &ctxs[b]) != LMX_OK) { fail_api(k, "batch"); goto done; }
    }
    if (lmx_eval_batch(k->m, ctxs, B, prompts, ilens, T, out) != LMX_OK) { fail_api(k, "batch"); goto done; }
    score s = {0};
    for (int b = 0; b < B; b++) compare_row(k, out + (size_t)b * k->V, ref + (size_t)b * k->V, &s);
    report(k, "batch (padded, masked)", &s);
done:
    for (int b = 0; ctxs && b < B; b++) lmx_context_free(ctxs[b]);
    free(ctxs);
    free(ilens);
    free(prompts);
    free(lens);
    free(ref);
    free(out);
}

int cmd_check_reference(int argc, char **argv) {
    const char *dir = NULL, *backend = "auto", *tol = NULL, *ref_path = NULL, *adapter = NULL;
    int threads = 0, n_ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--help")) {
            printf("usage: lmx check-reference MODEL_DIR [--reference FILE] [--backend NAME] [--threads N] [--ctx N]\n"
                   "                           [--tolerance f32|bf16|rel:X] [--adapter DIR]\n\n"
                   "Compares lmx's logits with MODEL_DIR/reference.safetensors (or FILE): prefill of each\n"
                   "sequence, prompt prefill plus cached decode, and the right-padded batch.  Prints the max\n"
                   "error of each check; exits 1 if any exceeds its tolerance (f32 on the cpu, bf16 on GPUs)\n"
                   "or if the reference holds nothing to check.  --ctx N evaluates with every layer's cache\n"
                   "bounded to N positions (the reference must be computed that way).  --adapter DIR applies a\n"
                   "LoRA adapter (PEFT or mlx-lm) unmerged; the reference must include it.\n");
            return 0;
        }
        if (!strcmp(a, "--backend") && has_val) backend = argv[++i];
        else if (!strcmp(a, "--reference") && has_val) ref_path = argv[++i];
        else if (!strcmp(a, "--tolerance") && has_val) tol = argv[++i];
        else if (!strcmp(a, "--adapter") && has_val) adapter = argv[++i];
        else if (!strcmp(a, "--threads") && has_val) { if (cli_parse_int(argv[++i], &threads)) return cli_usage_error("check-reference: bad --threads"); }
        else if (!strcmp(a, "--ctx") && has_val) { if (cli_parse_int(argv[++i], &n_ctx)) return cli_usage_error("check-reference: bad --ctx"); }
        else if (a[0] == '-') return cli_usage_error("check-reference: unknown option or missing value: %s", a);
        else if (dir) return cli_usage_error("check-reference: more than one model given");
        else dir = a;
    }
    if (!dir) return cli_usage_error("check-reference: no model directory given");
    double rel = 0;
    if (tol && strcmp(tol, "f32") && strcmp(tol, "bf16") && (strncmp(tol, "abs:", 4) || strtod(tol + 4, NULL) <= 0) &&
        (strncmp(tol, "rel:", 4) || (rel = strtod(tol + 4, NULL)) <= 0))
        return cli_usage_error("check-reference: --tolerance is f32, bf16, rel:X or abs:X (X > 0)");

    check k = {0};
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    lp.n_threads = threads;
    lp.adapter = adapter;
    if (lmx_model_load(dir, &lp, &k.m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        return 1;
    }
    lmx_model_info in;
    lmx_model_get_info(k.m, &in);
    k.V = in.vocab_size;
    k.n_ctx = n_ctx;
    k.tol = !tol ? (strcmp(in.backend, "cpu") ? TOL_BF16 : TOL_F32)
                 : rel > 0 ? TOL_REL : strcmp(tol, "bf16") == 0 ? TOL_BF16 : TOL_F32;
    k.rel = rel;

    size_t rl = ref_path ? strlen(ref_path) : 0;
    if (rl > 5 && !strcmp(ref_path + rl - 5, ".json")) { /* a real model's compact top-k reference */
        double abs_tol = 0.5;
        if (tol && !strncmp(tol, "abs:", 4)) abs_tol = strtod(tol + 4, NULL);
        printf("%s: %s, %d layers, %s weights, %s backend, top-k reference %s, tolerance %.3g\n", dir, in.architecture,
               in.n_layers, in.dtype, in.backend, ref_path, abs_tol);
        int rc = cli_check_topk(k.m, ref_path, abs_tol, n_ctx);
        lmx_model_free(k.m);
        return rc;
    }
    char path[4096];
    if (ref_path) snprintf(path, sizeof path, "%s", ref_path);
    else snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    lmx_st_set *ref = NULL;
    lmx_err err = {0};
    if (lmx_st_set_open_file(path, &ref, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        lmx_model_free(k.m);
        return 1;
    }
    k.ref = ref;
    printf("%s: %s, %d layers, %s weights, %s backend, %s tolerance%s%s\n", dir, in.architecture, in.n_layers,
           in.dtype, in.backend, tol ? tol : k.tol == TOL_F32 ? "f32" : "bf16", adapter ? ", adapter " : "",
           adapter ? adapter : "");
    check_sequence(&k, "short");
    check_sequence(&k, "long");
    check_batch(&k);
    if (k.ran == 0) {
        printf("nothing to check in %s\n", path);
        k.failed = 1;
    }
    printf("%s\n", k.failed ? "FAILED" : "all checks passed");
    lmx_st_set_close(ref);
    lmx_model_free(k.m);
    return k.failed ? 1 : 0;
}
