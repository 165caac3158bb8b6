/* train.c - `lmx train MODEL --data DIR`: LoRA fine-tuning (train/train.h) on mlx-lm's data layout
 * (DIR/train.jsonl, optional DIR/valid.jsonl; train/data.h), and `lmx eval`: loss and perplexity.
 *
 * Each step takes batch-size examples (an epoch is a shuffled pass; a batch's examples are of similar
 * length: the epoch order sorts each window of 8 batches by length), pads them to the longest, and
 * trains on next-token prediction (inputs ids[:-1], targets ids[1:]; with --mask-prompt only the
 * completion's).  Progress goes to stderr, one line per step; OUT/metrics.csv keeps every step; the
 * adapter is written to OUT/peft (HF PEFT) and OUT/mlx (mlx-lm) at the end and every --save-every. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "../base/fileio.h"
#include "../formats/safetensors.h"
#include "../train/data.h"
#include "../train/train.h"
#include "cli.h"
#include "lmx.h"

typedef struct train_opts {
    const char *model, *data, *out, *backend, *schedule, *resume;
    int rank, num_layers, iters, batch, accum, max_len, mask_prompt, save_every, eval_every, warmup, skip_bad, threads;
    int ckpt;                    /* gradient checkpointing: 1 on, 0 off, -1 by memory (cuda) or length (cpu) */
    int offload;                 /* checkpoints in host memory where the backend can (1, default) or not (0) */
    int replay, replay_qkv;      /* a checkpointed layer run again takes back its first run's attention (1, default),
                                  * and its q, k, v (1, default) */
    int embed_host;              /* the token embeddings in host memory where the backend can (1, default) or not (0) */
    unsigned targets;
    double alpha, lr, wd, clip, dropout;
    uint64_t seed;
} train_opts;

/* learning rate of step s (0-based) */
static double lr_at(const train_opts *o, int s) {
    if (o->warmup > 0 && s < o->warmup) return o->lr * (s + 1) / o->warmup;
    const double f = o->iters > o->warmup ? (double)(s - o->warmup) / (o->iters - o->warmup) : 0.0;
    if (!strcmp(o->schedule, "cosine")) return o->lr * 0.5 * (1.0 + cos(M_PI * f));
    if (!strcmp(o->schedule, "linear")) return o->lr * (1.0 - f);
    return o->lr;
}

/* The padded batch of examples idx[0..B): inputs, targets, mask [B, T]; T = longest - 1. */
static int make_batch(const lmx_train_set *set, const int *idx, int B, int mask_prompt, int32_t **in, int32_t **tg,
                      float **mask) {
    int T = 1;
    for (int b = 0; b < B; b++) T = set->ex[idx[b]].n - 1 > T ? set->ex[idx[b]].n - 1 : T;
    const size_t n = (size_t)(unsigned)B * (unsigned)T;
    *in = calloc(n, sizeof **in), *tg = calloc(n, sizeof **tg), *mask = calloc(n, sizeof **mask);
    if (!*in || !*tg || !*mask) return 0;
    for (int b = 0; b < B; b++) {
        const lmx_train_example *e = &set->ex[idx[b]];
        for (int t = 0; t < e->n - 1; t++) {
            (*in)[b * T + t] = e->ids[t];
            (*tg)[b * T + t] = e->ids[t + 1];
            (*mask)[b * T + t] = !mask_prompt || t + 1 >= e->n_prompt ? 1.0f : 0.0f;
        }
    }
    return T;
}

/* mean loss over a whole set, batch by batch (token-weighted) */
static lmx_status set_loss(lmx_trainer *tr, const lmx_train_set *set, int B, int mask_prompt, double *loss, double *tokens) {
    double sum = 0, n = 0;
    int *idx = malloc((size_t)B * sizeof *idx);
    lmx_status st = idx ? LMX_OK : LMX_ERR_NOMEM;
    for (int i0 = 0; i0 < set->n && !st; i0 += B) {
        const int nb = set->n - i0 < B ? set->n - i0 : B;
        for (int b = 0; b < nb; b++) idx[b] = i0 + b;
        int32_t *in, *tg;
        float *mk;
        const int T = make_batch(set, idx, nb, mask_prompt, &in, &tg, &mk);
        double l = 0, w = 0;
        for (int i = 0; i < nb * T; i++) w += mk[i];
        if (w > 0) st = lmx_trainer_loss(tr, in, tg, mk, nb, T, 0.0, 0, &l);
        sum += l * w, n += w;
        free(in), free(tg), free(mk);
    }
    free(idx);
    *loss = n > 0 ? sum / n : 0, *tokens = n;
    return st;
}

static void shuffle(int *a, int n, uint64_t *rng) {
    for (int i = n - 1; i > 0; i--) {
        const int j = (int)(cli_xorshift(rng) % (uint64_t)(i + 1)), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static const lmx_train_set *g_sort_set; /* qsort's context (this command only, single-threaded) */
static int by_len(const void *x, const void *y) {
    return g_sort_set->ex[*(const int *)x].n - g_sort_set->ex[*(const int *)y].n;
}

/* Where training stands between steps: what --resume needs to go on exactly as an uninterrupted run. */
typedef struct train_state {
    int step;                    /* steps done */
    int pos;                     /* next example of the epoch order */
    uint64_t rng;                /* the shuffle's state */
    int *order;                  /* [n examples] this epoch's order */
} train_state;

static volatile sig_atomic_t g_interrupted; /* Ctrl-C: save a checkpoint, then stop (this command only) */
static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

/* OUT/sub/{peft,mlx} (the adapter), and with st its optimizer state and training position:
 * state.safetensors (AdamW moments m1.i / m2.i of gradient i, the epoch order) and state.json. */
static int save_checkpoint(lmx_trainer *tr, const train_opts *o, const char *sub,
                           const train_state *st, int n_examples) {
    mkdir(o->out, 0777);
    char *dir = lmx_path_join(o->out, sub), *peft = lmx_path_join(dir, "peft"), *mlx = lmx_path_join(dir, "mlx");
    char *sp = lmx_path_join(dir, "state.safetensors"), *jp = lmx_path_join(dir, "state.json");
    lmx_err err = {0};
    mkdir(dir, 0777);
    int ok = !lmx_adapter_write(tr->ad, peft, LMX_LORA_PEFT, &err);
    if (ok && lmx_adapter_write(tr->ad, mlx, LMX_LORA_MLX, &err)) {
        if (err.status != LMX_ERR_UNSUPPORTED) ok = 0;
        else fprintf(stderr, "train: no mlx-lm copy: %s\n", err.msg);
    }
    if (ok && st) {
        const int ng = 2 * tr->n;
        lmx_st_write_item *items = calloc((size_t)2 * ng + 1, sizeof *items);
        char (*names)[32] = calloc((size_t)2 * ng, sizeof *names);
        float **mom = calloc((size_t)2 * ng, sizeof *mom);
        ok = items && names && mom;
        for (int i = 0; ok && i < ng; i++)
            for (int k = 0; ok && k < 2; k++) {
                lmx_st_write_item *it = &items[2 * i + k];
                const int64_t n = lmx_tensor_nelem(&tr->grad[i]);
                snprintf(names[2 * i + k], 32, "m%d.%d", k + 1, i);
                ok = (mom[2 * i + k] = malloc((size_t)n * sizeof(float))) &&
                     !lmx_trainer_moment_read(tr, i, k, mom[2 * i + k]);
                *it = (lmx_st_write_item){.name = names[2 * i + k], .dtype = LMX_DTYPE_F32, .ndim = 1,
                                          .data = mom[2 * i + k]};
                it->shape[0] = n;
            }
        if (ok) {
            items[2 * ng] = (lmx_st_write_item){.name = "order", .dtype = LMX_DTYPE_I32, .ndim = 1, .data = st->order};
            items[2 * ng].shape[0] = n_examples;
            ok = !lmx_st_write(sp, items, (size_t)2 * ng + 1, &err);
        }
        char js[160];
        snprintf(js, sizeof js, "{\"step\": %d, \"pos\": %d, \"rng\": \"%llu\"}\n", st->step, st->pos,
                 (unsigned long long)st->rng);
        if (ok) ok = !lmx_write_file(jp, js, strlen(js), &err);
        for (int i = 0; mom && i < 2 * ng; i++) free(mom[i]);
        free(mom);
        free(items);
        free(names);
    }
    if (!ok) fprintf(stderr, "train: saving a checkpoint in %s: %s\n", dir, err.msg[0] ? err.msg : "out of memory");
    free(dir), free(peft), free(mlx), free(sp), free(jp);
    return ok;
}

/* The optimizer state and position of a checkpoint made by save_checkpoint (dir: OUT/stepN). */
static int load_state(lmx_trainer *tr, const char *dir, train_state *st, int n_examples) {
    char *sp = lmx_path_join(dir, "state.safetensors"), *jp = lmx_path_join(dir, "state.json"), *text = NULL;
    size_t len = 0;
    lmx_err err = {0};
    lmx_st_file *f = NULL;
    cJSON *js = NULL;
    int ok = !lmx_read_file(jp, &text, &len, &err) && (js = cJSON_ParseWithLength(text, len)) && !lmx_st_open(sp, &f, &err);
    const cJSON *step = js ? cJSON_GetObjectItem(js, "step") : NULL, *pos = js ? cJSON_GetObjectItem(js, "pos") : NULL;
    const cJSON *rng = js ? cJSON_GetObjectItem(js, "rng") : NULL;
    ok = ok && cJSON_IsNumber(step) && cJSON_IsNumber(pos) && cJSON_IsString(rng);
    for (int i = 0; ok && i < 2 * tr->n; i++)
        for (int k = 0; ok && k < 2; k++) {
            char name[32];
            snprintf(name, sizeof name, "m%d.%d", k + 1, i);
            const lmx_st_tensor *t = lmx_st_find(f, name);
            ok = t && t->dtype == LMX_DTYPE_F32 && t->n_elements == lmx_tensor_nelem(&tr->grad[i]);
            if (ok) ok = !lmx_trainer_moment_write(tr, i, k, (const float *)t->data);
        }
    const lmx_st_tensor *ord = ok ? lmx_st_find(f, "order") : NULL;
    ok = ok && ord && ord->dtype == LMX_DTYPE_I32 && ord->n_elements == n_examples;
    if (ok) {
        memcpy(st->order, ord->data, (size_t)n_examples * sizeof(int));
        for (int i = 0; i < n_examples; i++) ok &= st->order[i] >= 0 && st->order[i] < n_examples;
        st->step = step->valueint, st->pos = pos->valueint, st->rng = strtoull(rng->valuestring, NULL, 10);
        ok &= st->step >= 0 && st->pos >= 0 && st->pos <= n_examples;
        tr->step = st->step;
    }
    if (!ok)
        fprintf(stderr, "train: %s is not a checkpoint of this run (state.json, state.safetensors: %s)\n", dir,
                err.msg[0] ? err.msg : "missing or mismatched values; the same data and adapter settings are needed");
    lmx_st_close(f);
    cJSON_Delete(js);
    free(text), free(sp), free(jp);
    return ok;
}

static int train_run(const train_opts *op);

/* The options parse_args takes without a value (a config's true / false turns them on / leaves them off). */
static int is_flag(const char *opt) { return !strcmp(opt, "--mask-prompt") || !strcmp(opt, "--skip-bad"); }

/* Options from argv[first..] into o; -1 when all are taken, else the exit code (help: 0, bad: 2). */
static int parse_args(train_opts *o, int argc, char **argv, int first) {
    for (int i = first; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (!strcmp(a, name) && v && ++i)
        if (OPT("--data")) o->data = v;
        else if (OPT("--adapter-out")) o->out = v;
        else if (OPT("--resume")) o->resume = v;
        else if (OPT("--backend")) o->backend = v;
        else if (OPT("--grad-checkpoint")) {
            if (cli_parse_checkpoint(v, &o->ckpt)) {
                fprintf(stderr, "train: --grad-checkpoint takes on, off or auto\n");
                return 2;
            }
        }
        else if (OPT("--offload") || OPT("--embed-host")) {
            if (cli_parse_onoff(v, !strcmp(a, "--offload") ? &o->offload : &o->embed_host)) {
                fprintf(stderr, "train: %s takes on or off\n", a);
                return 2;
            }
        } else if (OPT("--replay")) {
            if (cli_parse_replay(v, &o->replay, &o->replay_qkv)) {
                fprintf(stderr, "train: --replay takes on, outputs or off\n");
                return 2;
            }
        } else if (OPT("--rank")) o->rank = atoi(v);
        else if (OPT("--alpha")) o->alpha = atof(v);
        else if (OPT("--lora-dropout")) o->dropout = atof(v);
        else if (OPT("--targets")) {
            if (!(o->targets = lmx_lora_targets_parse(v))) {
                fprintf(stderr, "train: --targets %s: use q,k,v,o,gate,up,down\n", v);
                return 2;
            }
        } else if (OPT("--num-layers")) o->num_layers = atoi(v);
        else if (OPT("--lr")) o->lr = atof(v);
        else if (OPT("--schedule")) o->schedule = v;
        else if (OPT("--warmup")) o->warmup = atoi(v);
        else if (OPT("--weight-decay")) o->wd = atof(v);
        else if (OPT("--clip-grad-norm")) o->clip = atof(v);
        else if (OPT("--iters")) o->iters = atoi(v);
        else if (OPT("--batch-size")) o->batch = atoi(v);
        else if (OPT("--grad-accum")) o->accum = atoi(v);
        else if (OPT("--max-seq-length")) o->max_len = atoi(v);
        else if (OPT("--save-every")) o->save_every = atoi(v);
        else if (OPT("--eval-every")) o->eval_every = atoi(v);
        else if (OPT("--seed")) o->seed = strtoull(v, NULL, 10);
        else if (OPT("--threads")) o->threads = atoi(v);
        else if (OPT("--config")) continue; /* read before the other options (cmd_train) */
        else if (!strcmp(a, "--mask-prompt")) o->mask_prompt = 1; /* the flags: is_flag */
        else if (!strcmp(a, "--skip-bad")) o->skip_bad = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            printf("usage: lmx train MODEL --data DIR [--adapter-out DIR] [--rank 8] [--alpha 16] [--targets q,k,v,o,gate,up,down]\n"
                   "         [--num-layers N] [--lr 1e-4] [--schedule constant|linear|cosine] [--warmup N] [--weight-decay X]\n"
                   "         [--clip-grad-norm X] [--iters 100] [--batch-size 4] [--grad-accum 1] [--max-seq-length 2048]\n"
                   "         [--mask-prompt] [--save-every N] [--eval-every N] [--seed N] [--skip-bad] [--backend cpu]\n"
                   "         [--grad-checkpoint on|off|auto]   (auto: when a step would not fit the GPU without it; on the cpu,\n"
                   "         from 1024-token sequences) [--offload on|off]   (on: a checkpointed step holds the layers'\n"
                   "         inputs in host memory, on a GPU) [--embed-host on|off]   (on: an untied token embedding table\n"
                   "         stays in host memory, on a GPU) [--replay on|outputs|off]   (on: a checkpointed layer run again\n"
                   "         for backward takes its attention output, the hidden state after it and, without q / k norms,\n"
                   "         the attention's q, k, v from its first run, held beside its input, instead of computing them;\n"
                   "         outputs: not q, k, v) [--lora-dropout P]\n"
                   "         [--resume OUT/stepN]   (a checkpoint of --save-every or Ctrl-C: goes on exactly where it stopped)\n"
                   "         [--config FILE.json|FILE.yaml]   (the same settings as keys: {\"lr\": 1e-4, \"mask_prompt\": true, ...}\n"
                   "                                 or YAML lines such as lr: 1e-4; options on the command line win)\n"
                   "  DIR/train.jsonl (and DIR/valid.jsonl): {\"text\"}, {\"prompt\", \"completion\"} or {\"messages\"} lines\n");
            return 0;
        } else if (!o->model && a[0] != '-') o->model = a;
        else {
            fprintf(stderr, "train: unknown or incomplete option %s (lmx train --help)\n", a);
            return 2;
        }
#undef OPT
    }
    return -1;
}

/* The settings of a JSON or YAML config file as options ("lr": 1e-4 -> --lr 1e-4; true -> a flag, or on/off
 * for an option that takes a value; an array of strings -> a comma list; "model" -> MODEL), appended to
 * *args (strings owned by it). */
static int config_args(const char *path, char ***args, int *n) {
    char *text = NULL;
    size_t len = 0;
    lmx_err err = {0};
    cJSON *js = NULL;
    char ymsg[256] = "";
    const int yaml = lmx_ends_with(path, ".yaml") || lmx_ends_with(path, ".yml");
    if (lmx_read_file(path, &text, &len, &err) ||
        !(js = yaml ? cli_yaml_object(text, len, ymsg, sizeof ymsg) : cJSON_ParseWithLength(text, len)) ||
        !cJSON_IsObject(js)) {
        fprintf(stderr, "train: --config %s: %s\n", path,
                err.msg[0] ? err.msg : ymsg[0] ? ymsg : "not a JSON object (a .yaml or .yml file is read as YAML)");
        free(text);
        cJSON_Delete(js);
        return 0;
    }
    free(text);
    const cJSON *it;
    int ok = 1;
    cJSON_ArrayForEach(it, js) {
        char key[64], val[512] = "";
        snprintf(key, sizeof key, "--%s", it->string);
        for (char *c = key; *c; c++) *c = *c == '_' ? '-' : *c;
        int flag = 0;
        if (cJSON_IsBool(it) && is_flag(key)) {
            if (!cJSON_IsTrue(it)) continue;
            flag = 1;
        } else if (cJSON_IsBool(it)) snprintf(val, sizeof val, "%s", cJSON_IsTrue(it) ? "on" : "off"); /* grad_checkpoint */
        else if (cJSON_IsNumber(it)) snprintf(val, sizeof val, "%.17g", it->valuedouble);
        else if (cJSON_IsString(it)) snprintf(val, sizeof val, "%s", it->valuestring);
        else if (cJSON_IsArray(it)) {
            const cJSON *e;
            cJSON_ArrayForEach(e, it) {
                if (!cJSON_IsString(e)) ok = 0;
                else snprintf(val + strlen(val), sizeof val - strlen(val), "%s%s", val[0] ? "," : "", e->valuestring);
            }
        } else ok = 0;
        if (!ok) {
            fprintf(stderr, "train: --config %s: %s must be a number, a string, true/false or a list of strings\n", path,
                    it->string);
            break;
        }
        char **g = realloc(*args, (size_t)(*n + 2) * sizeof **args);
        if (!g) {
            ok = 0;
            break;
        }
        *args = g;
        if (!strcmp(it->string, "model")) (*args)[(*n)++] = strdup(val);
        else {
            (*args)[(*n)++] = strdup(key);
            if (!flag) (*args)[(*n)++] = strdup(val);
        }
    }
    cJSON_Delete(js);
    return ok;
}

int cmd_train(int argc, char **argv) {
    train_opts o = {.out = "adapters", .backend = "cpu", .ckpt = -1, .offload = 1, .replay = 1, .replay_qkv = 1, .embed_host = 1, .schedule = "constant", .rank = 8, .iters = 100, .batch = 4,
                    .accum = 1, .max_len = 2048, .alpha = 16, .lr = 1e-4, .dropout = -1, .targets = (1u << LMX_PROJ_N) - 1};
    char **cfg = NULL;
    int ncfg = 0, rc = 2;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config") && !config_args(argv[i + 1], &cfg, &ncfg)) goto out_cfg;
    if ((rc = parse_args(&o, ncfg, cfg, 0)) >= 0 || (rc = parse_args(&o, argc, argv, 1)) >= 0) goto out_cfg;
    rc = train_run(&o);
out_cfg:
    for (int i = 0; i < ncfg; i++) free(cfg[i]);
    free(cfg);
    return rc;
}

static int train_run(const train_opts *op) {
    train_opts o = *op;
    if (!o.model || !o.data || o.rank <= 0 || o.iters <= 0 || o.batch <= 0 || o.batch > 4096 || o.accum <= 0 || o.lr <= 0 ||
        !(o.dropout == -1 || (o.dropout >= 0 && o.dropout < 1)) ||
        (strcmp(o.schedule, "constant") && strcmp(o.schedule, "linear") && strcmp(o.schedule, "cosine"))) {
        fprintf(stderr, "usage: lmx train MODEL --data DIR [options] (lmx train --help)\n");
        return 2;
    }
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = o.backend;
    lp.n_threads = o.threads;
    lp.embed_on_host = o.embed_host;
    lmx_model *m = NULL;
    lmx_adapter *ad = NULL;
    lmx_trainer *tr = NULL;
    lmx_train_set train = {0}, valid = {0};
    lmx_err err = {0};
    int rc = 1, have_valid = 0;
    FILE *csv = NULL;
    char *tpath = lmx_path_join(o.data, "train.jsonl"), *vpath = lmx_path_join(o.data, "valid.jsonl");
    char *cpath = lmx_path_join(o.out, "metrics.csv");
    const lmx_lora_spec spec = {.rank = o.rank, .alpha = o.alpha, .targets = o.targets, .num_layers = o.num_layers,
                                .seed = o.seed, .dropout = o.dropout > 0 ? (float)o.dropout : 0.0f};
    if (lmx_model_load(o.model, &lp, &m)) {
        fprintf(stderr, "train: %s\n", lmx_last_error(m));
        goto done;
    }
    if (lmx_train_set_load(m, tpath, o.mask_prompt, o.max_len, o.skip_bad, &train, &err)) {
        fprintf(stderr, "train: %s\n", err.msg);
        goto done;
    }
    if (lmx_is_file(vpath)) {
        if (lmx_train_set_load(m, vpath, o.mask_prompt, o.max_len, o.skip_bad, &valid, &err)) {
            fprintf(stderr, "train: %s\n", err.msg);
            goto done;
        }
        have_valid = 1;
    }
    char *rpeft = o.resume ? lmx_path_join(o.resume, "peft") : NULL;
    lmx_status ast = rpeft ? lmx_adapter_load(m, rpeft, &ad) : lmx_adapter_create(m, &spec, &ad);
    free(rpeft);
    if (ast || lmx_trainer_create(m, ad, &tr, &err)) {
        fprintf(stderr, "train: %s\n", ad ? err.msg : lmx_last_error(m));
        goto done;
    }
    tr->checkpoint = o.ckpt;
    tr->offload = o.offload;
    tr->replay = o.replay, tr->replay_qkv = o.replay_qkv;
    if (o.dropout >= 0) tr->dropout = (float)o.dropout; /* else the new or resumed adapter's own */
    tr->seed = o.seed;
    mkdir(o.out, 0777);
    if (!(csv = fopen(cpath, o.resume ? "a" : "w"))) { /* a resumed run goes on with the same file */
        fprintf(stderr, "train: cannot write %s\n", cpath);
        goto done;
    }
    if (!o.resume || ftell(csv) == 0) fprintf(csv, "step,loss,lr,tokens,tokens_per_s,grad_norm,valid_loss\n");
    lmx_adapter_info info;
    lmx_adapter_get_info(ad, &info);
    fprintf(stderr, "train: %d examples (%d skipped), %s%d valid; rank %d alpha %g on %s, %lld parameters; %d steps of %d x %d\n",
            train.n, train.skipped, have_valid ? "" : "no valid.jsonl, ", valid.n, o.rank, o.alpha, info.targets,
            (long long)info.n_params, o.iters, o.batch, o.accum);
    train_state state = {.pos = train.n, .rng = o.seed * 0x9e3779b97f4a7c15ull + 1,
                      .order = malloc((size_t)train.n * sizeof(int))};
    if (!state.order || (o.resume && !load_state(tr, o.resume, &state, train.n))) {
        free(state.order);
        goto done;
    }
    if (o.resume) fprintf(stderr, "train: resuming %s after step %d\n", o.resume, state.step);
    int *order = state.order, pos = state.pos;
    uint64_t rng = state.rng;
    g_interrupted = 0;
    void (*old_handler)(int) = signal(SIGINT, on_sigint);
    const lmx_adamw opt = {.beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = o.wd, .clip_grad_norm = o.clip};
    double t0 = cli_now_s(), tokens_all = 0, best = INFINITY;
    int ok = 1;
    for (int s = state.step; s < o.iters && ok; s++) {
        if (g_interrupted) { /* Ctrl-C: the state before step s */
            state = (train_state){.step = s, .pos = pos, .rng = rng, .order = order};
            save_checkpoint(tr, &o, "interrupted", &state, train.n);
            fprintf(stderr, "train: interrupted; --resume %s/interrupted goes on\n", o.out);
            ok = 0;
            break;
        }
        double loss_sum = 0, toks = 0, ts = cli_now_s();
        for (int a = 0; a < o.accum && ok; a++) {
            int idx[4096]; /* --batch-size is at most 4096 */
            const int B = o.batch;
            for (int b = 0; b < B; b++) {
                if (pos == train.n) { /* a new epoch: shuffled, each window of 8 batches sorted by length */
                    for (int i = 0; i < train.n; i++) order[i] = i;
                    shuffle(order, train.n, &rng);
                    g_sort_set = &train;
                    for (int w = 0; w < train.n; w += 8 * B)
                        qsort(order + w, (size_t)(train.n - w < 8 * B ? train.n - w : 8 * B), sizeof *order, by_len);
                    pos = 0;
                }
                idx[b] = order[pos++];
            }
            int32_t *in, *tg;
            float *mk;
            const int T = make_batch(&train, idx, B, o.mask_prompt, &in, &tg, &mk);
            double l = 0;
            if (lmx_trainer_loss(tr, in, tg, mk, B, T, 1.0 / o.accum, a > 0, &l)) {
                fprintf(stderr, "train: step %d: %s\n", s, tr->err.msg);
                ok = 0;
            }
            for (int b = 0; b < B; b++) toks += train.ex[idx[b]].n - 1; /* every position the step runs */
            loss_sum += l / o.accum;
            free(in), free(tg), free(mk);
        }
        if (!ok) break;
        lmx_adamw so = opt;
        so.lr = lr_at(&o, s);
        double gnorm = 0;
        if (lmx_trainer_adamw(tr, &so, &gnorm)) {
            fprintf(stderr, "train: step %d: %s\n", s, tr->err.msg);
            break;
        }
        tokens_all += toks;
        const double dt = cli_now_s() - ts, el = cli_now_s() - t0, eta = el / (s + 1) * (o.iters - s - 1);
        double vloss = NAN, vt;
        if (have_valid && ((o.eval_every > 0 && (s + 1) % o.eval_every == 0) || s + 1 == o.iters)) {
            if (set_loss(tr, &valid, o.batch, o.mask_prompt, &vloss, &vt)) {
                fprintf(stderr, "train: validation: %s\n", tr->err.msg);
                break;
            }
            if (vloss < best) {
                best = vloss;
                ok = save_checkpoint(tr, &o, "best", NULL, train.n);
            }
        }
        lmx_memory_info mi = {0};
        lmx_model_get_memory(m, &mi);
        fprintf(stderr, "step %d/%d  loss %.4f  lr %.3g  %.0f tok/s  grad norm %.3g  mem %.0f MiB  eta %.0fs%s",
                s + 1, o.iters, loss_sum, so.lr, toks / dt, gnorm, mi.peak_bytes / 1048576.0, eta, isnan(vloss) ? "\n" : "");
        if (!isnan(vloss)) fprintf(stderr, "  valid loss %.4f (ppl %.2f)\n", vloss, exp(vloss));
        fprintf(csv, "%d,%.6f,%.6g,%.0f,%.1f,%.6g,", s + 1, loss_sum, so.lr, toks, toks / dt, gnorm);
        if (!isnan(vloss)) fprintf(csv, "%.6f", vloss);
        fprintf(csv, "\n");
        fflush(csv);
        state = (train_state){.step = s + 1, .pos = pos, .rng = rng, .order = order};
        if (o.save_every > 0 && (s + 1) % o.save_every == 0 && ok) {
            char sub[32];
            snprintf(sub, sizeof sub, "step%07d", s + 1);
            ok = save_checkpoint(tr, &o, sub, &state, train.n);
        }
        if (s + 1 == o.iters && ok) ok = save_checkpoint(tr, &o, ".", &state, train.n);
    }
    signal(SIGINT, old_handler);
    free(order);
    if (csv) fflush(csv);
    char *png = lmx_path_join(o.out, "loss.png");
    if (csv && ftell(csv) > 0) { /* the curve so far, also after an error or Ctrl-C */
        if (cli_plot_loss(cpath, png, o.model) == 0) fprintf(stderr, "train: loss curve in %s\n", png);
        else fprintf(stderr, "train: no loss curve (it needs python3 with matplotlib: scripts/setup.sh installs it)\n");
    }
    free(png);
    if (ok) {
        fprintf(stderr, "train: done, %.0f tokens in %.1fs; adapter in %s/peft and %s/mlx\n", tokens_all, cli_now_s() - t0,
                o.out, o.out);
        rc = 0;
    }
done:
    if (csv) fclose(csv);
    lmx_trainer_free(tr);
    lmx_train_set_free(&train);
    lmx_train_set_free(&valid);
    if (m) lmx_model_free(m);
    free(tpath), free(vpath), free(cpath);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    const char *model = NULL, *adapter = NULL, *data = NULL, *backend = "cpu";
    int mask_prompt = 0, batch = 4;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--adapter") && i + 1 < argc) adapter = argv[++i];
        else if (!strcmp(argv[i], "--data") && i + 1 < argc) data = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--batch-size") && i + 1 < argc) batch = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mask-prompt")) mask_prompt = 1;
        else if (!model && argv[i][0] != '-') model = argv[i];
        else {
            fprintf(stderr, "usage: lmx eval MODEL --data FILE.jsonl [--adapter DIR] [--mask-prompt] [--batch-size N]\n");
            return 2;
        }
    }
    if (!model || !data || batch <= 0) {
        fprintf(stderr, "usage: lmx eval MODEL --data FILE.jsonl [--adapter DIR] [--mask-prompt] [--batch-size N]\n");
        return 2;
    }
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = backend;
    lmx_model *m = NULL;
    lmx_adapter *ad = NULL;
    lmx_trainer *tr = NULL;
    lmx_train_set set = {0};
    lmx_err err = {0};
    int rc = 1;
    if (lmx_model_load(model, &lp, &m)) {
        fprintf(stderr, "eval: %s\n", lmx_last_error(m));
        goto done;
    }
    /* without an adapter: a rank-1 one with B = 0 adds nothing and lets the trainer run the pass */
    const lmx_lora_spec none = {.rank = 1, .alpha = 1, .targets = 1u << LMX_PROJ_Q};
    if ((adapter ? lmx_adapter_load(m, adapter, &ad) : lmx_adapter_create(m, &none, &ad))) {
        fprintf(stderr, "eval: %s\n", lmx_last_error(m));
        goto done;
    }
    if (lmx_train_set_load(m, data, mask_prompt, 0, 0, &set, &err) || lmx_trainer_create(m, ad, &tr, &err)) {
        fprintf(stderr, "eval: %s\n", err.msg);
        goto done;
    }
    double loss, toks;
    if (set_loss(tr, &set, batch, mask_prompt, &loss, &toks)) {
        fprintf(stderr, "eval: %s\n", tr->err.msg);
        goto done;
    }
    printf("%s: %d examples, %.0f tokens: loss %.4f, perplexity %.3f\n", data, set.n, toks, loss, exp(loss));
    rc = 0;
done:
    lmx_trainer_free(tr);
    lmx_train_set_free(&set);
    if (m) lmx_model_free(m);
    return rc;
}
