/* test_train_api.c - the public training calls of lmx.h on the llama fixture (cpu): a new adapter
 * changes nothing until trained (its loss is the base model's), value-and-grad and AdamW steps lower the
 * loss of a fixed batch, an adapter saved in either layout loads back with the same loss, a user loss
 * (the cross-entropy by hand) gives the built-in one's loss and gradients, MSE has its value, and bad
 * input (targets, batch, mask, token ids, format) fails with a message and leaves the trainer usable.
 * The gradients themselves are checked against HF + peft by `lmx check-train` (ctest train_*).
 * Usage: test_train_api [FIXTURES]   (default: $LMX_FIXTURES, then ../shared/fixtures). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "lmx.h"
#include "model/adapter.h"

enum { B = 2, T = 9 };

/* the masked cross-entropy of the batch's targets, written as a user loss (lmx_loss_fn): the same
 * number and gradients as the built-in one must come out */
typedef struct ce_arg { const int32_t *tg; const float *mask; double wsum; } ce_arg;
static double ce_part(void *user, int row0, int R, int V, const float *z, float *grad) {
    const ce_arg *a = user;
    double sum = 0;
    for (int r = 0; r < R; r++) {
        const float *zr = z + (size_t)r * V, w = a->mask[row0 + r];
        if (w == 0) continue;
        double mx = zr[0], se = 0;
        for (int v = 1; v < V; v++) mx = zr[v] > mx ? zr[v] : mx;
        for (int v = 0; v < V; v++) se += exp(zr[v] - mx);
        sum += w * (log(se) + mx - zr[a->tg[row0 + r]]) / a->wsum;
        for (int v = 0; v < V; v++)
            grad[(size_t)r * V + v] = (float)(w / a->wsum * (exp(zr[v] - mx) / se - (v == a->tg[row0 + r])));
    }
    return sum;
}
/* a loss of 0 that keeps a copy of the logits [B*T, V] (user: the float buffer) */
static double keep_logits(void *user, int row0, int R, int V, const float *z, float *grad) {
    (void)grad;
    memcpy((float *)user + (size_t)row0 * V, z, (size_t)R * V * sizeof *z);
    return 0;
}

int main(int argc, char **argv) {
    const char *fix = argc > 1 ? argv[1] : getenv("LMX_FIXTURES") ? getenv("LMX_FIXTURES") : "../shared/fixtures";
    char path[1024];
    snprintf(path, sizeof path, "%s/models/llama", fix);
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lmx_model *m = NULL;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "test_train_api: %s\n", lmx_last_error(NULL));
        return 1;
    }
    int32_t in[B * T], tg[B * T];
    float mask[B * T];
    for (int i = 0; i < B * T; i++) {
        in[i] = (i * 37 + 11) % 320;
        tg[i] = (i * 53 + 7) % 320;
        mask[i] = i % T >= 2 ? 1.0f : 0.0f; /* the first two positions of each row are "prompt" */
    }

    /* bad arguments to adapter_new */
    lmx_lora_params lp8 = lmx_lora_default_params();
    lp8.targets = "q,w";
    lmx_adapter *bad = NULL;
    CHECK(lmx_adapter_new(m, &lp8, &bad) == LMX_ERR_INVALID_ARG && !bad);
    CHECK_CONTAINS(lmx_last_error(m), "\"q,w\"");
    lp8 = lmx_lora_default_params();
    lp8.rank = 0;
    CHECK(lmx_adapter_new(m, &lp8, &bad) == LMX_ERR_INVALID_ARG);

    /* a new adapter, a trainer on it */
    lmx_lora_params p = lmx_lora_default_params();
    p.rank = 4, p.alpha = 8, p.seed = 3;
    lmx_adapter *ad = NULL;
    lmx_trainer *tr = NULL;
    CHECK(lmx_adapter_new(m, &p, &ad) == LMX_OK && ad);
    CHECK(lmx_trainer_open(m, ad, &tr) == LMX_OK && tr);
    lmx_trainer *none = NULL;
    CHECK(lmx_trainer_open(m, LMX_NO_ADAPTER, &none) == LMX_ERR_INVALID_ARG && !none);
    if (!tr) return check_summary("test_train_api");

    /* B = 0 at first: the adapted model is the base model.  The base's loss through a rank-1 adapter
     * on one projection (also B = 0) must be the same number. */
    double l0 = 0, lg = 0, lbase = 0;
    CHECK(lmx_trainer_loss_only(tr, in, tg, mask, B, T, &l0) == LMX_OK);
    CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, B, T, 0, &lg) == LMX_OK);
    CHECK_MSG(l0 == lg, "loss %.9g, value_and_grad %.9g", l0, lg);
    {
        lmx_lora_params q = lmx_lora_default_params();
        q.rank = 1, q.targets = "v";
        lmx_adapter *a1 = NULL;
        lmx_trainer *t1 = NULL;
        CHECK(lmx_adapter_new(m, &q, &a1) == LMX_OK && lmx_trainer_open(m, a1, &t1) == LMX_OK);
        CHECK(t1 && lmx_trainer_loss_only(t1, in, tg, mask, B, T, &lbase) == LMX_OK);
        CHECK_MSG(fabs(lbase - l0) <= 1e-6 * fabs(l0), "untrained adapters: %.9g and %.9g", lbase, l0);
        lmx_trainer_close(t1);
        lmx_adapter_free(a1);
    }

    /* AdamW steps lower the loss of the batch */
    lmx_optim_params o = lmx_optim_default_params();
    o.lr = 1e-2;
    double l = l0, gn = 0;
    for (int s = 0; s < 20; s++) {
        CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, B, T, 0, &l) == LMX_OK);
        CHECK(lmx_trainer_step(tr, &o, &gn) == LMX_OK);
        CHECK(isfinite(gn) && gn > 0);
    }
    CHECK(lmx_trainer_loss_only(tr, in, tg, mask, B, T, &l) == LMX_OK);
    CHECK_MSG(l < 0.5 * l0, "loss %.4f after 20 steps, %.4f before", l, l0);

    /* gradient accumulation: two half batches accumulated step like the whole batch would, i.e. the
     * step is taken (finite norm) and the loss keeps falling */
    double la = 0, lb = 0;
    CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, 1, T, 0, &la) == LMX_OK);
    CHECK(lmx_trainer_value_and_grad(tr, in + T, tg + T, mask + T, 1, T, 1, &lb) == LMX_OK);
    CHECK(lmx_trainer_step(tr, &o, &gn) == LMX_OK && isfinite(gn));

    /* saved in both layouts, loaded back: the same loss */
    double now = 0, ck = 0;
    CHECK(lmx_trainer_loss_only(tr, in, tg, mask, B, T, &now) == LMX_OK);
    /* with checkpointing (the layers run again in backward: ctest train_*_lora_checkpointed checks
     * its gradients against the reference) the same loss */
    lmx_trainer_set_checkpointing(tr, 1);
    CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, B, T, 0, &ck) == LMX_OK);
    CHECK_MSG(fabs(ck - now) <= 1e-6 * fabs(now), "checkpointed loss %.9g, %.9g", ck, now);
    lmx_trainer_set_checkpointing(tr, -1);
    char dir[] = "/tmp/lmx_train_api_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    const char *formats[2] = {"peft", "mlx"};
    for (int f = 0; f < 2; f++) {
        char out[1100];
        snprintf(out, sizeof out, "%s/%s", dir, formats[f]);
        CHECK(lmx_adapter_save(ad, out, formats[f]) == LMX_OK);
        lmx_adapter *back = NULL;
        lmx_trainer *tb = NULL;
        double lback = 0;
        CHECK(lmx_adapter_load(m, out, &back) == LMX_OK);
        CHECK(back && lmx_trainer_open(m, back, &tb) == LMX_OK);
        CHECK(tb && lmx_trainer_loss_only(tb, in, tg, mask, B, T, &lback) == LMX_OK);
        CHECK_MSG(fabs(lback - now) <= 1e-6 * fabs(now), "%s reload: %.9g, trained %.9g", formats[f], lback, now);
        lmx_trainer_close(tb);
        lmx_adapter_free(back);
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", out);
        if (system(cmd)) fprintf(stderr, "test_train_api: could not remove %s\n", out);
    }
    rmdir(dir);
    CHECK(lmx_adapter_save(ad, "/tmp/x", "gguf") == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "\"gguf\"");

    /* a user loss: the cross-entropy written by hand gives the built-in one's loss and gradients
     * (this is also the VJP: the gradient fn writes is the logits' cotangent) */
    {
        const int np = lmx_trainer_param_count(tr);
        CHECK(np == 2 * 7 * 2); /* the fixture's 2 layers, 7 projections, A and B */
        char name[128];
        int64_t n0 = 0;
        CHECK(lmx_trainer_param_info(tr, 0, name, sizeof name, &n0) == LMX_OK && n0 == 4 * 64);
        CHECK_MSG(!strcmp(name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), "param 0: %s", name);
        CHECK(lmx_trainer_param_info(tr, np, name, sizeof name, &n0) == LMX_ERR_INVALID_ARG);
        double lce = 0, lfn = 0, wsum = 0;
        for (int i = 0; i < B * T; i++) wsum += mask[i];
        ce_arg a = {tg, mask, wsum};
        float *g1[28], *g2[28];
        CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, B, T, 0, &lce) == LMX_OK);
        for (int i = 0; i < np && i < 28; i++) {
            lmx_trainer_param_info(tr, i, NULL, 0, &n0);
            g1[i] = malloc((size_t)n0 * sizeof(float)), g2[i] = malloc((size_t)n0 * sizeof(float));
            CHECK(lmx_trainer_read_grad(tr, i, g1[i]) == LMX_OK);
        }
        CHECK(lmx_trainer_value_and_grad_fn(tr, in, B, T, ce_part, &a, 0, &lfn) == LMX_OK);
        CHECK_MSG(fabs(lfn - lce) <= 1e-6 * fabs(lce), "user cross-entropy %.9g, built-in %.9g", lfn, lce);
        double worst = 0;
        for (int i = 0; i < np && i < 28; i++) {
            lmx_trainer_param_info(tr, i, NULL, 0, &n0);
            CHECK(lmx_trainer_read_grad(tr, i, g2[i]) == LMX_OK);
            double mx = 0;
            for (int64_t e = 0; e < n0; e++) mx = fmax(mx, fabs(g1[i][e]));
            for (int64_t e = 0; e < n0; e++) worst = fmax(worst, fabs(g1[i][e] - g2[i][e]) / (1e-9 + 1e-5 * mx));
            free(g1[i]), free(g2[i]);
        }
        CHECK_MSG(worst <= 1.0, "user cross-entropy gradients: worst err/tol %.3g", worst);

        /* mean squared error against logits moved by a known pattern: (0.1 p)^2 on average */
        const int V = 320;
        float *z = malloc((size_t)B * T * V * sizeof *z);
        double lz = 1, lmse = 0, want = 0, ws = 0;
        CHECK(lmx_trainer_value_and_grad_fn(tr, in, B, T, keep_logits, z, 0, &lz) == LMX_OK && lz == 0);
        for (int i = 0; i < B * T; i++)
            for (int v = 0; v < V; v++) {
                const float p = (float)((i * 7 + v * 3) % 11) - 5.0f;
                z[(size_t)i * V + v] += 0.1f * p;
                want += mask[i] * 0.01 * p * p;
            }
        for (int i = 0; i < B * T; i++) ws += mask[i];
        want /= V * ws;
        CHECK(lmx_trainer_value_and_grad_mse(tr, in, z, mask, B, T, 0, &lmse) == LMX_OK);
        CHECK_MSG(fabs(lmse - want) <= 1e-4 * want, "mse %.9g, expected %.9g", lmse, want);
        lmx_adapter *am = NULL; /* training towards the moved logits lowers the error (another adapter) */
        lmx_trainer *tm = NULL;
        CHECK(lmx_adapter_new(m, &p, &am) == LMX_OK && lmx_trainer_open(m, am, &tm) == LMX_OK);
        lmx_optim_params om = lmx_optim_default_params();
        om.lr = 1e-3;
        double first = 0;
        for (int s = 0; tm && s < 5; s++) {
            CHECK(lmx_trainer_value_and_grad_mse(tm, in, z, mask, B, T, 0, s ? &lz : &first) == LMX_OK);
            CHECK(lmx_trainer_step(tm, &om, NULL) == LMX_OK);
        }
        CHECK(tm && lmx_trainer_value_and_grad_mse(tm, in, z, mask, B, T, 0, &lz) == LMX_OK);
        CHECK_MSG(lz < first, "mse %.6g after 5 steps, %.6g before", lz, first);
        lmx_trainer_close(tm);
        lmx_adapter_free(am);
        free(z);
    }

    /* LoRA dropout: a trained adapter's loss with dropout is not the loss without; the gradient of an
     * element of layer 0's q_proj B (its path back crosses layer 1's dropped inputs) matches central
     * differences of the loss under the same masks (value_and_grad calls of one step draw the same);
     * checkpointing draws them again when it runs a layer again: the same loss and gradient */
    {
        lmx_lora_params pd = p;
        pd.dropout = 0.3f, pd.seed = 11;
        lmx_adapter *ad2 = NULL;
        lmx_trainer *t2 = NULL;
        CHECK(lmx_adapter_new(m, &pd, &ad2) == LMX_OK && lmx_trainer_open(m, ad2, &t2) == LMX_OK);
        pd.dropout = 1.0f;
        lmx_adapter *bad_d = NULL;
        CHECK(lmx_adapter_new(m, &pd, &bad_d) == LMX_ERR_INVALID_ARG && !bad_d);
        double ld = 0, lnd = 0, lp = 0, lm = 0, lck = 0;
        for (int s = 0; t2 && s < 10; s++) {
            CHECK(lmx_trainer_value_and_grad(t2, in, tg, mask, B, T, 0, &ld) == LMX_OK);
            CHECK(lmx_trainer_step(t2, &o, NULL) == LMX_OK);
        }
        CHECK(t2 && lmx_trainer_value_and_grad(t2, in, tg, mask, B, T, 0, &ld) == LMX_OK);
        CHECK(t2 && lmx_trainer_loss_only(t2, in, tg, mask, B, T, &lnd) == LMX_OK);
        CHECK_MSG(fabs(ld - lnd) > 1e-4, "dropout changes nothing: %.9g and %.9g", ld, lnd);
        float grad[64 * 4];
        CHECK(t2 && lmx_trainer_read_grad(t2, 1, grad) == LMX_OK); /* layer 0 q_proj's B [64, 4] */
        float *b = (float *)ad2->pairs[LMX_PROJ_Q].b.data;
        const int e = 5;
        const float h = 1e-2f, b0 = b[e];
        b[e] = b0 + h;
        CHECK(lmx_trainer_value_and_grad(t2, in, tg, mask, B, T, 0, &lp) == LMX_OK);
        b[e] = b0 - h;
        CHECK(lmx_trainer_value_and_grad(t2, in, tg, mask, B, T, 0, &lm) == LMX_OK);
        b[e] = b0;
        const double num = (lp - lm) / (2.0 * h);
        CHECK_MSG(fabs(num - grad[e]) <= 1e-3 + 2e-2 * fabs(num), "dropout gradient %.6g, central difference %.6g",
                  grad[e], num);
        lmx_trainer_set_checkpointing(t2, 1);
        float grad_ck[64 * 4];
        CHECK(lmx_trainer_value_and_grad(t2, in, tg, mask, B, T, 0, &lck) == LMX_OK);
        CHECK(lmx_trainer_read_grad(t2, 1, grad_ck) == LMX_OK);
        CHECK_MSG(fabs(lck - ld) <= 1e-6 * fabs(ld), "checkpointed dropout loss %.9g, %.9g", lck, ld);
        CHECK_MSG(fabs(grad_ck[e] - grad[e]) <= 1e-5 * fabs(grad[e]) + 1e-9, "checkpointed gradient %.9g, %.9g",
                  grad_ck[e], grad[e]);
        lmx_trainer_close(t2);
        lmx_adapter_free(ad2);
    }

    /* a mixture-of-experts model infers but does not train yet: a clear error, not wrong gradients */
    {
        char mp[1024];
        snprintf(mp, sizeof mp, "%s/models/qwen3_moe", fix);
        lmx_model *mm = NULL;
        CHECK(lmx_model_load(mp, &lp, &mm) == LMX_OK);
        lmx_lora_params pq = lmx_lora_default_params();
        pq.rank = 2;
        lmx_adapter *aq = NULL;
        lmx_trainer *tq = NULL;
        CHECK(mm && lmx_adapter_new(mm, &pq, &aq) == LMX_ERR_INVALID_ARG && !aq); /* gate/up/down: experts */
        CHECK_CONTAINS(mm ? lmx_last_error(mm) : "", "expert");
        pq.targets = "q,v";
        CHECK(mm && lmx_adapter_new(mm, &pq, &aq) == LMX_OK && lmx_trainer_open(mm, aq, &tq) == LMX_OK);
        double lq = 0;
        CHECK(tq && lmx_trainer_loss_only(tq, in, tg, mask, B, T, &lq) == LMX_OK && isfinite(lq));
        CHECK(tq && lmx_trainer_value_and_grad(tq, in, tg, mask, B, T, 0, &lq) == LMX_ERR_UNSUPPORTED);
        CHECK_CONTAINS(mm ? lmx_last_error(mm) : "", "mixture-of-experts");
        lmx_trainer_close(tq);
        lmx_model_free(mm);
    }

    /* gemma2 (soft-capped attention and logits, (1 + w) norms, post-norms, GELU): after a few steps, the
     * gradients of elements of layer 0's q A and layer 3's down B match central differences of the loss,
     * with checkpointing off and on (the final soft-cap's backward reads its output, which the loss then
     * overwrites with its gradient: the tape must keep the value, not the buffer) */
    {
        char gp[1024];
        snprintf(gp, sizeof gp, "%s/models/gemma2", fix);
        lmx_model *mg = NULL;
        CHECK(lmx_model_load(gp, &lp, &mg) == LMX_OK);
        lmx_adapter *ag = NULL;
        lmx_trainer *tgr = NULL;
        CHECK(mg && lmx_adapter_new(mg, &p, &ag) == LMX_OK && lmx_trainer_open(mg, ag, &tgr) == LMX_OK);
        double lg = 0;
        for (int s = 0; tgr && s < 5; s++) {
            CHECK(lmx_trainer_value_and_grad(tgr, in, tg, mask, B, T, 0, &lg) == LMX_OK);
            CHECK(lmx_trainer_step(tgr, &o, NULL) == LMX_OK);
        }
        const int q0 = 0 * LMX_PROJ_N + LMX_PROJ_Q, d3 = 3 * LMX_PROJ_N + LMX_PROJ_DOWN;
        struct { int grad, e; float *w; } probe[2] = {
            {2 * q0, 17, tgr ? (float *)ag->pairs[q0].a.data : NULL},     /* q A [4, 64] */
            {2 * d3 + 1, 9, tgr ? (float *)ag->pairs[d3].b.data : NULL},  /* down B [64, 4] */
        };
        for (int ck = 0; tgr && ck < 2; ck++) {
            lmx_trainer_set_checkpointing(tgr, ck);
            for (int k = 0; k < 2; k++) {
                float grad[4 * 128];
                double l0 = 0, lp1 = 0, lm1 = 0;
                CHECK(lmx_trainer_value_and_grad(tgr, in, tg, mask, B, T, 0, &l0) == LMX_OK);
                CHECK(lmx_trainer_read_grad(tgr, probe[k].grad, grad) == LMX_OK);
                float *w = probe[k].w;
                const int e = probe[k].e;
                const float h = 1e-2f, w0 = w[e];
                w[e] = w0 + h;
                CHECK(lmx_trainer_loss_only(tgr, in, tg, mask, B, T, &lp1) == LMX_OK);
                w[e] = w0 - h;
                CHECK(lmx_trainer_loss_only(tgr, in, tg, mask, B, T, &lm1) == LMX_OK);
                w[e] = w0;
                const double num = (lp1 - lm1) / (2.0 * h);
                CHECK_MSG(fabs(num) > 1e-5, "gemma2 probe %d: a zero central difference checks nothing", k);
                CHECK_MSG(fabs(num - grad[e]) <= 1e-4 + 2e-2 * fabs(num),
                          "gemma2 gradient %d (checkpointing %d): %.6g, central difference %.6g", k, ck, grad[e], num);
            }
        }
        lmx_trainer_close(tgr);
        lmx_adapter_free(ag);
        lmx_model_free(mg);
    }

    /* bad batches fail with a message; the trainer stays usable */
    float zero[B * T] = {0};
    int32_t badtg[B * T];
    memcpy(badtg, tg, sizeof tg);
    badtg[5] = 320;
    double x = 0;
    CHECK(lmx_trainer_value_and_grad(tr, in, tg, mask, 0, T, 0, &x) == LMX_ERR_INVALID_ARG);
    CHECK(lmx_trainer_value_and_grad(tr, in, tg, zero, B, T, 0, &x) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "mask");
    CHECK(lmx_trainer_value_and_grad(tr, in, badtg, mask, B, T, 0, &x) == LMX_ERR_INVALID_ARG);
    CHECK_CONTAINS(lmx_last_error(m), "outside the vocabulary");
    int32_t badin[B * T];
    memcpy(badin, in, sizeof in);
    badin[3] = -4;
    CHECK(lmx_trainer_value_and_grad(tr, badin, tg, mask, B, T, 0, &x) != LMX_OK);
    double again = 0;
    CHECK(lmx_trainer_loss_only(tr, in, tg, mask, B, T, &again) == LMX_OK);
    CHECK_MSG(again == now, "after the errors: %.9g, before %.9g", again, now);

    lmx_trainer_close(tr);
    lmx_model_free(m);
    return check_summary("test_train_api");
}
