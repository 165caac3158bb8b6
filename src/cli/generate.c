/* generate.c - see generate.h. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void cli_gen_opts_init(cli_gen_opts *o, int max_tokens) {
    memset(o, 0, sizeof *o);
    o->backend = "auto";
    o->gen = lmx_gen_default_params();
    o->gen.max_tokens = max_tokens;
    o->gen.stop_strings = o->stops;
}

const char cli_gen_opts_help[] =
    "  --max-tokens N         generate at most N tokens\n"
    "  --temp T               temperature; 0 = greedy (default 0.8)\n"
    "  --top-k K              keep the K likeliest tokens; 0 = off (default 40)\n"
    "  --top-p P              nucleus sampling; 1 = off (default 0.95)\n"
    "  --min-p P              drop tokens below P x the likeliest; 0 = off (default 0.05)\n"
    "  --repeat-penalty R     penalise the last 64 tokens; 1 = off (default)\n"
    "  --presence-penalty X   --frequency-penalty X   OpenAI-style penalties (default 0)\n"
    "  --seed N               sampling seed (default 0)\n"
    "  --stop TEXT            stop when TEXT appears (not printed; repeatable)\n"
    "  --ctx N                keep at most N positions (rotating caches); 0 = unbounded\n"
    "  --threads N            CPU threads (default: all cores)\n"
    "  --backend NAME         auto, cpu, cuda or mlx_lm (mlx-lm in a Python child; default auto)\n"
    "  --adapter DIR          apply a LoRA adapter (PEFT or mlx-lm folder) unmerged\n"
    "  --json                 print the metrics as one JSON line on stderr\n";

static int parse_float(const char *s, float *out) {
    char *end;
    float v = strtof(s, &end);
    if (!*s || *end || v != v) return -1;
    *out = v;
    return 0;
}

int cli_parse_gen_opt(const char *cmd, int argc, char **argv, int *i, cli_gen_opts *o) {
    const char *a = argv[*i];
    if (!strcmp(a, "--json")) {
        o->json = 1;
        return 1;
    }
    lmx_sampler_params *sp = &o->gen.sampler;
    int *ip = !strcmp(a, "--threads") ? &o->threads : !strcmp(a, "--ctx") ? &o->n_ctx
            : !strcmp(a, "--max-tokens") ? &o->gen.max_tokens : !strcmp(a, "--top-k") ? &sp->top_k : NULL;
    float *fp = !strcmp(a, "--temp") ? &sp->temperature : !strcmp(a, "--top-p") ? &sp->top_p
              : !strcmp(a, "--min-p") ? &sp->min_p : !strcmp(a, "--repeat-penalty") ? &sp->repeat_penalty
              : !strcmp(a, "--presence-penalty") ? &sp->presence_penalty
              : !strcmp(a, "--frequency-penalty") ? &sp->frequency_penalty : NULL;
    int is_str = !strcmp(a, "--backend") || !strcmp(a, "--stop") || !strcmp(a, "--seed") || !strcmp(a, "--adapter");
    if (!ip && !fp && !is_str) return 0;
    if (*i + 1 >= argc) {
        cli_usage_error("%s: %s needs a value", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (ip ? cli_parse_int(v, ip) != 0 : fp ? parse_float(v, fp) != 0 : 0) {
        cli_usage_error("%s: bad value for %s: %s", cmd, a, v);
        return -1;
    }
    if (!strcmp(a, "--backend")) o->backend = v;
    if (!strcmp(a, "--adapter")) o->adapter = v;
    if (!strcmp(a, "--seed")) {
        char *end;
        long long s = strtoll(v, &end, 10);
        if (!*v || *end || s < 0) {
            cli_usage_error("%s: bad value for --seed: %s", cmd, v);
            return -1;
        }
        sp->seed = s;
    }
    if (!strcmp(a, "--stop")) {
        if (o->gen.n_stop_strings == CLI_MAX_STOP || !*v) {
            cli_usage_error("%s: at most %d non-empty --stop strings", cmd, CLI_MAX_STOP);
            return -1;
        }
        o->stops[o->gen.n_stop_strings++] = v;
    }
    return 1;
}

/* ---- loading with a progress bar --------------------------------------------------------- */

static void progress_bar(float done, void *user) {
    int width = 40, n = (int)(done * (float)width + 0.5f);
    fprintf(stderr, "\r%s [", (const char *)user);
    for (int i = 0; i < width; i++) fputc(i < n ? '#' : ' ', stderr);
    fprintf(stderr, "] %3d%%", (int)(done * 100.0f + 0.5f));
    if (done >= 1.0f) fprintf(stderr, "\r%*s\r", width + 16, "");
    fflush(stderr);
}

lmx_model *cli_load(const char *path, const cli_gen_opts *o) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = o->backend;
    lp.n_threads = o->threads;
    lp.n_ctx = o->n_ctx;
    lp.adapter = o->adapter;
    if (isatty(STDERR_FILENO)) {
        lp.progress = progress_bar;
        lp.progress_user = "loading";
    }
    lmx_model *m = NULL;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        return NULL;
    }
    return m;
}

int cli_print_token(const lmx_token *t, void *user) {
    if (t->text_len) {
        fwrite(t->text, 1, t->text_len, stdout);
        fflush(stdout);
    }
    return 0;
}

void cli_report(lmx_model *m, const cli_gen_opts *o, const lmx_result *r) {
    if (!o->json) return;
    lmx_metrics x;
    lmx_get_metrics(m, &x);
    fprintf(stderr,
            "{\"finish\": \"%s\", \"prompt_tokens\": %d, \"cached_tokens\": %d, \"generated_tokens\": %d, "
            "\"ttft_ms\": %.2f, \"prefill_tokens_per_s\": %.2f, \"decode_tokens_per_s\": %.2f, "
            "\"memory_bytes\": %lld, \"peak_memory_bytes\": %lld}\n",
            lmx_finish_str(r ? r->finish : LMX_FINISH_NONE), x.prompt_tokens, x.cached_tokens, x.generated_tokens,
            x.ttft_ms, x.prefill_tokens_per_s, x.decode_tokens_per_s, (long long)x.memory_bytes,
            (long long)x.peak_memory_bytes);
}
