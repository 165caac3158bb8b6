/* api.c - the public training calls of lmx.h over the trainer (train.h) and new adapters
 * (model/adapter.h); errors land in the model's message (lmx_last_error). */
#include <stdio.h>
#include <string.h>

#include "lmx.h"
#include "train.h"

lmx_lora_params lmx_lora_default_params(void) {
    lmx_lora_params p = {.rank = 8, .alpha = 16.0f, .targets = "q,k,v,o,gate,up,down"};
    return p;
}

lmx_optim_params lmx_optim_default_params(void) {
    lmx_optim_params p = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    return p;
}

lmx_status lmx_adapter_new(lmx_model *m, const lmx_lora_params *p, lmx_adapter **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    const lmx_lora_params d = lmx_lora_default_params();
    if (!p) p = &d;
    const unsigned targets = lmx_lora_targets_parse(p->targets ? p->targets : d.targets);
    if (!targets)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA targets %s: use q,k,v,o,gate,up,down",
                           LMX_QUOTED(p->targets));
    if (!(p->dropout >= 0 && p->dropout < 1))
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "LoRA dropout %g: use a probability in [0, 1)", p->dropout);
    const lmx_lora_spec s = {.rank = p->rank, .alpha = p->alpha, .use_rslora = p->use_rslora, .targets = targets,
                             .num_layers = p->num_layers, .seed = p->seed, .dropout = p->dropout};
    return lmx_adapter_create(m, &s, out);
}

lmx_status lmx_adapter_save(const lmx_adapter *a, const char *dir, const char *format) {
    if (!a || a == LMX_NO_ADAPTER || !dir || !format) return LMX_ERR_INVALID_ARG;
    lmx_model *m = a->m;
    lmx_lora_format f = !strcmp(format, "peft") ? LMX_LORA_PEFT : !strcmp(format, "mlx") ? LMX_LORA_MLX : 0;
    if (!f) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "adapter format %s: \"peft\" or \"mlx\"", LMX_QUOTED(format));
    return lmx_adapter_write(a, dir, f, &m->err);
}

lmx_status lmx_trainer_open(lmx_model *m, lmx_adapter *a, lmx_trainer **out) {
    if (!m || !out) return LMX_ERR_INVALID_ARG;
    *out = NULL;
    if (!a || a == LMX_NO_ADAPTER || a->m != m)
        return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "a trainer needs an adapter of this model");
    return lmx_trainer_create(m, a, out, &m->err);
}

void lmx_trainer_close(lmx_trainer *t) { lmx_trainer_free(t); }

void lmx_trainer_set_checkpointing(lmx_trainer *t, int mode) {
    if (t) t->checkpoint = mode > 0 ? 1 : mode == 0 ? 0 : -1;
}

static lmx_status report(lmx_trainer *t, lmx_status st) {
    if (st) lmx_err_set(&t->m->err, st, "%s", t->err.msg);
    return st;
}

lmx_status lmx_trainer_value_and_grad(lmx_trainer *t, const int32_t *inputs, const int32_t *targets,
                                      const float *mask, int B, int T, int accumulate, double *loss) {
    if (!t || !inputs || !targets || !loss) return LMX_ERR_INVALID_ARG;
    return report(t, lmx_trainer_loss(t, inputs, targets, mask, B, T, 1.0, accumulate, loss));
}

lmx_status lmx_trainer_loss_only(lmx_trainer *t, const int32_t *inputs, const int32_t *targets, const float *mask,
                                 int B, int T, double *loss) {
    if (!t || !inputs || !targets || !loss) return LMX_ERR_INVALID_ARG;
    return report(t, lmx_trainer_loss(t, inputs, targets, mask, B, T, 0.0, 0, loss));
}

lmx_status lmx_trainer_value_and_grad_fn(lmx_trainer *t, const int32_t *inputs, int B, int T, lmx_loss_fn fn,
                                         void *user, int accumulate, double *loss) {
    if (!t || !inputs || !fn || !loss) return LMX_ERR_INVALID_ARG;
    return report(t, lmx_trainer_loss_fn(t, inputs, NULL, NULL, fn, user, B, T, 1.0, accumulate, loss));
}

typedef struct mse_arg {
    const float *target, *mask;
    double scale; /* 1 / (V x the weights' sum) */
} mse_arg;

static double mse_part(void *user, int row0, int R, int V, const float *z, float *grad) {
    const mse_arg *a = user;
    double sum = 0;
    for (int r = 0; r < R; r++) {
        const double w = a->mask ? a->mask[row0 + r] : 1.0;
        const float *y = a->target + (size_t)(row0 + r) * V;
        for (int v = 0; w != 0 && v < V; v++) {
            const double d = (double)z[(size_t)r * V + v] - y[v];
            sum += w * d * d;
            grad[(size_t)r * V + v] = (float)(2.0 * w * d * a->scale);
        }
    }
    return sum * a->scale;
}

lmx_status lmx_trainer_value_and_grad_mse(lmx_trainer *t, const int32_t *inputs, const float *target, const float *mask,
                                          int B, int T, int accumulate, double *loss) {
    if (!t || !inputs || !target || !loss || B <= 0 || T <= 0) return LMX_ERR_INVALID_ARG;
    double wsum = 0;
    for (int i = 0; i < B * T; i++) wsum += mask ? mask[i] : 1.0;
    if (wsum <= 0) return lmx_err_set(&t->m->err, LMX_ERR_INVALID_ARG, "training batch: the mask selects no position");
    mse_arg a = {target, mask, 1.0 / ((double)t->m->cfg.vocab * wsum)};
    return report(t, lmx_trainer_loss_fn(t, inputs, NULL, NULL, mse_part, &a, B, T, 1.0, accumulate, loss));
}

int lmx_trainer_param_count(const lmx_trainer *t) { return t ? 2 * t->n : 0; }

lmx_status lmx_trainer_param_info(const lmx_trainer *t, int i, char *name, size_t cap, int64_t *n) {
    if (!t || i < 0 || i >= 2 * t->n) return LMX_ERR_INVALID_ARG;
    const lmx_lora_pair *p = t->pairs[i / 2];
    const int64_t k = p - t->ad->pairs;
    if (name && cap)
        lmx_lora_peft_name(name, cap, k / LMX_PROJ_N, (lmx_proj)(k % LMX_PROJ_N), i & 1);
    if (n) *n = lmx_tensor_nelem(&t->grad[i]);
    return LMX_OK;
}

lmx_status lmx_trainer_read_grad(lmx_trainer *t, int i, float *dst) {
    if (!t || !dst || i < 0 || i >= 2 * t->n) return LMX_ERR_INVALID_ARG;
    lmx_backend *be = t->m->be;
    lmx_status st = be->ops->read(be, &t->grad[i], 0, dst, (size_t)lmx_tensor_nelem(&t->grad[i]) * sizeof(float));
    return st ? lmx_err_set(&t->m->err, st, "%s", be->err.msg) : LMX_OK;
}

lmx_status lmx_trainer_step(lmx_trainer *t, const lmx_optim_params *p, double *grad_norm) {
    if (!t) return LMX_ERR_INVALID_ARG;
    const lmx_optim_params d = lmx_optim_default_params();
    if (!p) p = &d;
    const lmx_adamw o = {.lr = p->lr, .beta1 = p->beta1, .beta2 = p->beta2, .eps = p->eps,
                         .weight_decay = p->weight_decay, .clip_grad_norm = p->clip_grad_norm};
    return report(t, lmx_trainer_adamw(t, &o, grad_norm));
}
