/* check_train.c - `lmx check-train BASE LORA_DIR`: LoRA training against a reference made by HF
 * transformers + peft + torch.optim.AdamW (the LoRA section of ../shared/fixtures/README.md).
 *
 * LORA_DIR/train_reference.json says the loss, the LoRA settings and the optimizer; its .safetensors
 * holds inputs, targets, mask [B, T], the losses of successive steps, and per LoRA tensor (PEFT names
 * without "base_model.model."): init.* (LORA_DIR/peft_adapter holds the same), grad.* (step 0's
 * gradients) and after1.* (after the first step).  Compared: the step-0 loss, every gradient, every
 * parameter after step 1, and every step's loss; exit 1 beyond the tolerance. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../base/json.h"
#include "../base/fileio.h"
#include "../base/half.h"
#include "../formats/safetensors.h"
#include "../train/train.h"
#include "cli.h"
#include "lmx.h"

typedef struct ref_cmp {
    double worst;        /* max over tensors of max|x - ref| / (atol + rtol max|ref|) */
    char name[160];
} ref_cmp;

/* f32 host copy of a stored tensor (any float dtype); NULL on a missing tensor */
static float *st_f32(const lmx_st_file *f, const char *name, int64_t *n) {
    const lmx_st_tensor *t = lmx_st_find(f, name);
    if (!t) return NULL;
    float *p = malloc((size_t)(t->n_elements ? t->n_elements : 1) * sizeof(float));
    for (int64_t i = 0; p && i < t->n_elements; i++) p[i] = lmx_float_at(t->data, t->dtype, i);
    *n = t->n_elements;
    return p;
}

/* x against ref: max_i |x_i - ref_i| / (atol + rtol max|ref| + extra_i) (extra NULL: 0) */
static void compare(ref_cmp *c, const char *name, const float *x, const float *ref, const double *extra, int64_t n,
                    double atol, double rtol) {
    double mx = 0, r = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) r = fmax(r, fabs((double)x[i] - ref[i]) / (atol + rtol * mx + (extra ? extra[i] : 0)));
    if (r > c->worst || !c->name[0]) {
        c->worst = r;
        snprintf(c->name, sizeof c->name, "%s", name);
    }
}

/* Every pair's A and B (grads: their gradients) against prefix.* of the reference.  With opt (the
 * parameters after the first AdamW step), an element's tolerance also holds what its gradient's error
 * moves that step: the step is lr g / (|g| + eps), nearly lr sign(g), so an element whose gradient is
 * near 0 moves by up to 2 lr with a gradient error of either sign; the reference's grad.* and the
 * trainer's gradients give the difference of the two steps. */
static int compare_pairs(lmx_trainer *tr, const lmx_st_file *ref, const char *prefix, int grads, ref_cmp *c,
                         double atol, double rtol, const lmx_adamw *opt) {
    lmx_backend *be = tr->m->be;
    for (int i = 0; i < 2 * tr->n; i++) {
        const lmx_lora_pair *p = tr->pairs[i / 2];
        const int64_t k = p - tr->ad->pairs, layer = k / LMX_PROJ_N;
        char name[160];
        snprintf(name, sizeof name, "%s.model.layers.%lld.%s.lora_%c.weight", prefix, (long long)layer,
                 lmx_proj_module((lmx_proj)(k % LMX_PROJ_N)), i & 1 ? 'B' : 'A');
        int64_t n = 0;
        float *r = st_f32(ref, name, &n);
        const lmx_tensor *t = grads ? &tr->grad[i] : i & 1 ? &p->b : &p->a;
        if (!r || n != lmx_tensor_nelem(t)) {
            fprintf(stderr, "check-train: reference tensor %s %s\n", name, r ? "has another shape" : "is missing");
            free(r);
            return 0;
        }
        float *x = malloc((size_t)n * sizeof(float)), *g = opt ? malloc((size_t)n * sizeof(float)) : NULL, *gr = NULL;
        double *extra = opt ? malloc((size_t)n * sizeof(double)) : NULL;
        int64_t ng = 0;
        if (opt) {
            char gname[160];
            snprintf(gname, sizeof gname, "grad%s", name + strlen(prefix));
            gr = st_f32(ref, gname, &ng);
        }
        if (opt && (!g || !extra || !gr || ng != n || be->ops->read(be, &tr->grad[i], 0, g, (size_t)n * sizeof(float)))) {
            fprintf(stderr, "check-train: no gradient to weigh %s with\n", name);
            free(x), free(g), free(gr), free(extra), free(r);
            return 0;
        }
        for (int64_t e = 0; opt && e < n; e++) /* the first step is lr g / (|g| + eps) */
            extra[e] = opt->lr * fabs(g[e] / (fabs(g[e]) + opt->eps) - gr[e] / (fabs(gr[e]) + opt->eps));
        if (x && be->ops->read(be, t, 0, x, (size_t)n * sizeof(float)) == LMX_OK) compare(c, name, x, r, extra, n, atol, rtol);
        free(x), free(g), free(gr), free(extra);
        free(r);
    }
    return 1;
}

int cmd_check_train(int argc, char **argv) {
    const char *base = NULL, *dir = NULL, *backend = "cpu";
    int loss_rows = 0, ckpt = -1, replay = -1, replay_qkv = 1, keep_gu = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--keep-gu") && i + 1 < argc) {
            if (cli_parse_int(argv[++i], &keep_gu) || keep_gu < 0) {
                fprintf(stderr, "check-train: --keep-gu takes a count of layers\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--loss-rows") && i + 1 < argc) loss_rows = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--grad-checkpoint") && i + 1 < argc) {
            if (cli_parse_checkpoint(argv[++i], &ckpt)) {
                fprintf(stderr, "check-train: --grad-checkpoint takes on, off or auto\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--replay") && i + 1 < argc) {
            if (cli_parse_replay(argv[++i], &replay, &replay_qkv)) {
                fprintf(stderr, "check-train: --replay takes on, outputs or off\n");
                return 2;
            }
        }
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: lmx check-train BASE_MODEL LORA_DIR [--backend cpu|cuda] [--loss-rows N] [--grad-checkpoint on|off|auto]\n"
                   "         [--replay on|outputs|off] [--keep-gu N]\n"
                   "  trains LORA_DIR/peft_adapter on the batch of LORA_DIR/train_reference.safetensors and compares\n"
                   "  the loss, the gradients, the parameters after one AdamW step and every step's loss\n"
                   "  (--loss-rows: the loss's logits N rows at a time, as large vocabularies need; --grad-checkpoint:\n"
                   "  each layer run again in backward, as long sequences have it by default; --replay off: such a layer\n"
                   "  computes its attention and the hidden state after it again instead of taking its first run's; on:\n"
                   "  fails unless it took them, and takes the attention's q, k, v too where the layer allows; outputs:\n"
                   "  not q, k, v; --keep-gu: with replay, N layers below the last keep their MLP's gate and up\n"
                   "  products for their runs again, through host memory where the backend can; default: the trainer's)\n");
            return 0;
        } else if (!base) base = argv[i];
        else if (!dir) dir = argv[i];
        else {
            fprintf(stderr, "check-train: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!base || !dir) {
        fprintf(stderr, "usage: lmx check-train BASE_MODEL LORA_DIR [--backend cpu|cuda]\n");
        return 2;
    }
    char *jpath = lmx_path_join(dir, "train_reference.json"), *spath = lmx_path_join(dir, "train_reference.safetensors");
    char *apath = lmx_path_join(dir, "peft_adapter"), *text = NULL;
    size_t len = 0;
    lmx_err err = {0};
    lmx_st_file *ref = NULL;
    cJSON *js = NULL;
    lmx_model *m = NULL;
    lmx_adapter *ad = NULL;
    lmx_trainer *tr = NULL;
    int rc = 1;
    if (lmx_read_file(jpath, &text, &len, &err) || !(js = cJSON_ParseWithLength(text, len))) {
        fprintf(stderr, "check-train: %s\n", err.msg[0] ? err.msg : "train_reference.json is not JSON");
        goto done;
    }
    if (lmx_st_open(spath, &ref, &err)) {
        fprintf(stderr, "check-train: %s\n", err.msg);
        goto done;
    }
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    if (lmx_model_load(base, &lp, &m) || lmx_adapter_load(m, apath, &ad)) {
        fprintf(stderr, "check-train: %s\n", lmx_last_error(m));
        goto done;
    }
    if (lmx_trainer_create(m, ad, &tr, &err)) {
        fprintf(stderr, "check-train: %s\n", err.msg);
        goto done;
    }
    tr->loss_rows = loss_rows;
    tr->checkpoint = ckpt;
    if (replay >= 0) tr->replay = replay, tr->replay_qkv = replay_qkv;
    if (keep_gu >= 0) tr->keep_gu = keep_gu;
    const lmx_st_tensor *ti = lmx_st_find(ref, "inputs"), *tt = lmx_st_find(ref, "targets");
    int64_t nmask = 0, nloss = 0;
    float *mask = st_f32(ref, "mask", &nmask), *losses = st_f32(ref, "losses", &nloss);
    if (!ti || !tt || ti->ndim != 2 || tt->n_elements != ti->n_elements || !mask || nmask != ti->n_elements || !losses) {
        fprintf(stderr, "check-train: the reference lacks inputs / targets / mask / losses of one shape\n");
        free(mask), free(losses);
        goto done;
    }
    const int B = (int)ti->shape[0], T = (int)ti->shape[1];
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    for (int i = 0; i < B * T; i++) in[i] = (int32_t)lmx_load_u32((const char *)ti->data + 4 * i),
                                    tg[i] = (int32_t)lmx_load_u32((const char *)tt->data + 4 * i);
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(js, "optimizer");
    const lmx_adamw opt = {.lr = lmx_json_num(o, "lr", 1e-3), .beta1 = lmx_json_num(o, "beta1", 0.9), .beta2 = lmx_json_num(o, "beta2", 0.999),
                           .eps = lmx_json_num(o, "eps", 1e-8), .weight_decay = lmx_json_num(o, "weight_decay", 0.0),
                           .clip_grad_norm = lmx_json_num(o, "clip_grad_norm", 0.0)};
    /* cpu: float32 compute against a float64 reference: each loss within the fixtures' logit tolerance
     * (2e-3 + 1e-3 |ref|); each gradient and parameter tensor within 1e-6 + 1e-4 max|ref| (the
     * parameters also within what their gradients' error moves the step, compare_pairs).  Other
     * backends (cuda: bf16 keys and values in the cache, bf16 matmul operands, TF32 attention backward):
     * losses within 2e-2 + 1e-2 |ref|, gradients within 1e-5 + 3e-2 max|ref|. */
    const int f32 = !strcmp(tr->m->be->ops->name, "cpu");
    const double atol = f32 ? 2e-3 : 2e-2, rtol = f32 ? 1e-3 : 1e-2, gatol = f32 ? 1e-6 : 1e-5, grtol = f32 ? 1e-4 : 3e-2;
    const double patol = 1e-6, prtol = 1e-4;
    int ok = 1;
    printf("check-train %s with %s: %d pairs, batch %d x %d, AdamW lr %g wd %g\n", base, apath, tr->n, B, T, opt.lr,
           opt.weight_decay);
    for (int s = 0; s < nloss && ok; s++) {
        double loss = 0;
        if (lmx_trainer_loss(tr, in, tg, mask, B, T, 1.0, 0, &loss)) {
            fprintf(stderr, "check-train: %s\n", tr->err.msg);
            ok = 0;
            break;
        }
        const double lerr = fabs(loss - losses[s]), ltol = atol + rtol * fabs(losses[s]);
        printf("step %d: loss %.6f reference %.6f (err %.2e, tol %.2e)\n", s, loss, losses[s], lerr, ltol);
        ok &= lerr <= ltol;
        if (s == 0) {
            ref_cmp c = {0};
            ok &= compare_pairs(tr, ref, "grad", 1, &c, gatol, grtol, NULL);
            printf("step 0 gradients: worst err/tol %.3g (%s)\n", c.worst, c.name);
            ok &= c.worst <= 1.0;
        }
        if (lmx_trainer_adamw(tr, &opt, NULL)) {
            fprintf(stderr, "check-train: %s\n", tr->err.msg);
            ok = 0;
            break;
        }
        if (s == 0) {
            ref_cmp c = {0};
            ok &= compare_pairs(tr, ref, "after1", 0, &c, patol, prtol, &opt);
            printf("parameters after step 1: worst err/tol %.3g (%s)\n", c.worst, c.name);
            ok &= c.worst <= 1.0;
        }
    }
    if (tr->replayed[0] || tr->replayed[1] || replay > 0)
        printf("replay: %lld attention outputs, %lld hidden states, %lld gate, up, %lld q, k, v taken back\n",
               (long long)tr->replayed[0], (long long)tr->replayed[1], (long long)tr->replayed[3],
               (long long)tr->replayed[2]);
    if (replay > 0 && ckpt > 0 && !tr->replayed[1]) {
        fprintf(stderr, "check-train: --replay on, but no checkpointed layer took back its hidden state\n");
        ok = 0;
    }
    printf("%s\n", ok ? "check-train: PASS" : "check-train: FAIL");
    rc = ok ? 0 : 1;
    free(in), free(tg), free(mask), free(losses);
done:
    lmx_trainer_free(tr);
    if (m) lmx_model_free(m);
    lmx_st_close(ref);
    cJSON_Delete(js);
    free(text), free(jpath), free(spath), free(apath);
    return rc;
}
