/* test_train_api.c - the public training calls of lmx.h on the llama fixture (cpu): a new adapter
 * changes nothing until trained (its loss is the base model's), value-and-grad and AdamW steps lower the
 * loss of a fixed batch, an adapter saved in either layout loads back with the same loss, and bad
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

enum { B = 2, T = 9 };

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
