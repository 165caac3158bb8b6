/* bench_train.c - `lmx bench-train MODEL`: LoRA training speed.
 *
 * A fresh adapter (rank R, alpha 2R, all seven projections of every layer) on MODEL as stored (dense,
 * MLX or GGUF: the base stays frozen in its format), B random sequences of T tokens a step, each step
 * the loss with its gradients and one AdamW update.  After one warm-up step it reports the median
 * step's tokens/s, the backend's peak memory (weights included), and the model FLOPs utilisation
 * against --peak-tflops: per token 4 x the matmul weights' parameters (forward 2, input gradients 2)
 * plus attention's 6 T H D per layer (forward 2 T H D for causal scores and values, backward twice that);
 * checkpointing's second forward is not counted (as MFU is usually reported).
 * Tokens are random: the loss says nothing, the speed is that of real text of that length. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../model/adapter.h"
#include "../train/train.h"
#include "cli.h"
#include "lmx.h"

int cmd_bench_train(int argc, char **argv) {
    const char *path = NULL, *backend = "auto";
    int rank = 16, B = 1, T = 512, steps = 5, json = 0, profile = 0, ckpt = -1, offload = 1, embed_host = 1, replay = 1,
        replay_qkv = 1, keep_gu = -1;
    double peak_tflops = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: lmx bench-train MODEL [--backend NAME] [--rank R] [--batch B] [--seq T] [--steps N]\n"
                   "                         [--grad-checkpoint on|off|auto] [--offload on|off] [--embed-host on|off]\n"
                   "                         [--replay on|outputs|off] [--keep-gu N]\n"
                   "                         [--peak-tflops F] [--profile] [--json]\n\n"
                   "LoRA training speed on random tokens: tokens/s, peak memory and MFU (F: the device's dense\n"
                   "bf16 peak, 989 for an H100 SXM when the backend is cuda and F is not given).  --profile waits\n"
                   "for the device after each phase and prints the seconds of each (forward, loss, backward, AdamW).\n"
                   "--keep-gu: how many layers below the last keep their MLP's gate and up products for their runs\n"
                   "again, through host memory with --offload on (checkpointed, with replay; default: the trainer's).\n");
            return 0;
        }
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--profile")) profile = 1;
        else if (!strcmp(a, "--grad-checkpoint") && i + 1 < argc) {
            if (cli_parse_checkpoint(argv[++i], &ckpt))
                return cli_usage_error("bench-train: --grad-checkpoint takes on, off or auto");
        }
        else if ((!strcmp(a, "--offload") || !strcmp(a, "--embed-host")) && i + 1 < argc) {
            if (cli_parse_onoff(argv[++i], !strcmp(a, "--offload") ? &offload : &embed_host))
                return cli_usage_error("bench-train: %s takes on or off", a);
        }
        else if (!strcmp(a, "--replay") && i + 1 < argc) {
            if (cli_parse_replay(argv[++i], &replay, &replay_qkv))
                return cli_usage_error("bench-train: --replay takes on, outputs or off");
        }
        else if (!strcmp(a, "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(a, "--keep-gu") && i + 1 < argc) { if (cli_parse_int(argv[++i], &keep_gu) || keep_gu < 0) return cli_usage_error("bench-train: bad --keep-gu"); }
        else if (!strcmp(a, "--rank") && i + 1 < argc) { if (cli_parse_int(argv[++i], &rank) || rank < 1) return cli_usage_error("bench-train: bad --rank"); }
        else if (!strcmp(a, "--batch") && i + 1 < argc) { if (cli_parse_int(argv[++i], &B) || B < 1) return cli_usage_error("bench-train: bad --batch"); }
        else if (!strcmp(a, "--seq") && i + 1 < argc) { if (cli_parse_int(argv[++i], &T) || T < 2) return cli_usage_error("bench-train: bad --seq"); }
        else if (!strcmp(a, "--steps") && i + 1 < argc) { if (cli_parse_int(argv[++i], &steps) || steps < 1) return cli_usage_error("bench-train: bad --steps"); }
        else if (!strcmp(a, "--peak-tflops") && i + 1 < argc) peak_tflops = atof(argv[++i]);
        else if (a[0] == '-') return cli_usage_error("bench-train: unknown option or missing value: %s", a);
        else if (path) return cli_usage_error("bench-train: more than one model given");
        else path = a;
    }
    if (!path) return cli_usage_error("bench-train: no model given");
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    lp.embed_on_host = embed_host;
    lmx_model *m = NULL;
    lmx_adapter *ad = NULL;
    lmx_trainer *tr = NULL;
    lmx_err err = {0};
    int rc = 1;
    int32_t *in = malloc((size_t)B * T * sizeof *in), *tg = malloc((size_t)B * T * sizeof *tg);
    double *times = malloc((size_t)steps * sizeof *times);
    if (!in || !tg || !times) {
        fprintf(stderr, "bench-train: out of memory\n");
        goto done;
    }
    if (lmx_model_load(path, &lp, &m)) {
        fprintf(stderr, "bench-train: %s\n", lmx_last_error(m));
        goto done;
    }
    const lmx_lora_spec spec = {.rank = rank, .alpha = 2.0 * rank, .targets = (1u << LMX_PROJ_N) - 1, .seed = 1};
    if (lmx_adapter_create(m, &spec, &ad) || lmx_trainer_create(m, ad, &tr, &err)) {
        fprintf(stderr, "bench-train: %s\n", ad ? err.msg : lmx_last_error(m));
        goto done;
    }
    tr->profile = profile;
    tr->checkpoint = ckpt;
    tr->offload = offload;
    tr->replay = replay, tr->replay_qkv = replay_qkv;
    if (keep_gu >= 0) tr->keep_gu = keep_gu;
    if (profile) lmx_tape_profile(tr->tape, tr->prof_bwd, tr->prof_fwd);
    const lmx_config *c = &m->cfg;
    const int64_t C = c->hidden, HD = (int64_t)c->n_heads * m->head_dim, KD = (int64_t)c->n_kv_heads * m->head_dim;
    const double params = (double)c->n_layers * (C * HD * 2 + C * KD * 2 + 3.0 * C * c->ffn) + (double)C * c->vocab;
    const double flops_tok = 4.0 * params + 6.0 * c->n_layers * (double)T * HD;
    if (peak_tflops <= 0 && !strcmp(m->be->ops->name, "cuda")) peak_tflops = 989;
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    const lmx_adamw opt = {.lr = 1e-5, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    double loss = 0;
    for (int s = -1; s < steps; s++) { /* step -1: the warm-up */
        for (int i = 0; i < B * T; i++) in[i] = (int32_t)(cli_xorshift(&rng) % (uint64_t)c->vocab);
        for (int i = 0; i < B * T; i++) tg[i] = (i + 1) % T ? in[i + 1] : in[i];
        const double t0 = cli_now_s();
        if (lmx_trainer_loss(tr, in, tg, NULL, B, T, 1.0, 0, &loss) || lmx_trainer_adamw(tr, &opt, NULL)) {
            fprintf(stderr, "bench-train: %s\n", tr->err.msg);
            goto done;
        }
        if (s >= 0) times[s] = cli_now_s() - t0;
        if (s < 0) memset(tr->prof, 0, sizeof tr->prof), memset(tr->prof_bwd, 0, sizeof tr->prof_bwd),
                    memset(tr->prof_fwd, 0, sizeof tr->prof_fwd); /* warm-up */
        if (!json) fprintf(stderr, "step %d: %.3f s, loss %.4f\n", s, cli_now_s() - t0, loss);
    }
    const double med = cli_median(times, steps);
    int64_t peak = m->be->mem_peak; /* with --profile, the phases' peaks too (each starts its own) */
    for (size_t k = 0; k < sizeof tr->prof_peak / sizeof *tr->prof_peak; k++)
        peak = tr->prof_peak[k] > peak ? tr->prof_peak[k] : peak;
    const double tok_s = B * T / med, peak_gib = peak / 1073741824.0;
    const int ckpt_on = lmx_trainer_checkpoints(tr, B, T);
    const double mfu = peak_tflops > 0 ? tok_s * flops_tok / (peak_tflops * 1e12) : 0;
    if (json)
        printf("{\"backend\": \"%s\", \"rank\": %d, \"batch\": %d, \"seq\": %d, \"steps\": %d, \"step_s\": %.4f, "
               "\"tokens_per_s\": %.1f, \"peak_gib\": %.2f, \"flops_per_token\": %.4g, \"mfu\": %.4f, \"checkpointing\": %d, "
               "\"replayed\": [%lld, %lld, %lld, %lld]}\n",
               m->be->ops->name, rank, B, T, steps, med, tok_s, peak_gib, flops_tok, mfu, ckpt_on,
               (long long)tr->replayed[0], (long long)tr->replayed[1], (long long)tr->replayed[2],
               (long long)tr->replayed[3]);
    else {
        char rp[96] = ""; /* what a layer run again took back */
        const char *kinds[4] = {"attention outputs", "hidden states", "q, k, v", "gate, up"};
        for (int k = 0; k < 4; k++)
            if (tr->replayed[k])
                snprintf(rp + strlen(rp), sizeof rp - strlen(rp), "%s%s", rp[0] ? ", " : ", replayed: ", kinds[k]);
        printf("bench-train %s (%s): rank %d, batch %d x %d%s%s: %.3f s a step, %.1f tokens/s, peak %.2f GiB, MFU %.1f%%\n",
               path, m->be->ops->name, rank, B, T,
               ckpt_on ? (tr->park ? ", checkpointing (layer inputs in host memory)" : ", checkpointing") : "", rp, med,
               tok_s, peak_gib, 100 * mfu);
    }
    if (profile) {
        const double G = 1073741824.0;
        fprintf(stderr, "phases a step: forward %.3f s, head + loss %.3f s, backward %.3f s, AdamW %.3f s\n",
                tr->prof[0] / steps, tr->prof[1] / steps, tr->prof[2] / steps, tr->prof[3] / steps);
        fprintf(stderr, "peak GiB in: forward %.2f, head + loss %.2f, backward %.2f (checkpointed: layers run again "
                "%.2f, walked back %.2f), AdamW %.2f\n", tr->prof_peak[0] / G, tr->prof_peak[1] / G,
                tr->prof_peak[2] / G, tr->prof_peak[4] / G, tr->prof_peak[5] / G, tr->prof_peak[3] / G);
    }
    for (int k = 1; profile && k < LMX_TAPE_KINDS; k++)
        if (tr->prof_bwd[k] > 0 || tr->prof_fwd[k] > 0)
            fprintf(stderr, "  %-10s backward %.4f s, recorded forward %.4f s a step\n", lmx_tape_kind(k),
                    tr->prof_bwd[k] / steps, tr->prof_fwd[k] / steps);
    rc = 0;
done:
    lmx_trainer_free(tr);
    lmx_adapter_free(ad);
    lmx_model_free(m);
    free(in), free(tg), free(times);
    return rc;
}
