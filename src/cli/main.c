/* main.c - the lmx command: dispatch to subcommands. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "lmx.h"

int cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lmx: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see lmx --help)\n");
    va_end(ap);
    return 2;
}

int cli_parse_int(const char *s, int *out) {
    if (!s || !*s) return -1;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > 1000000000) return -1;
    *out = (int)v;
    return 0;
}

/* Comma-separated ids into a malloc'ed array; 0 or -1. */
int cli_parse_ids(const char *s, int32_t **out, int *n) {
    int cap = 16, k = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 2147483647L || (*end && *end != ',')) {
            free(ids);
            return -1;
        }
        if (k == cap) {
            int32_t *g = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!g) {
                free(ids);
                return -1;
            }
            ids = g;
        }
        ids[k++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    if (k == 0) {
        free(ids);
        return -1;
    }
    *out = ids;
    *n = k;
    return 0;
}

int cli_parse_checkpoint(const char *s, int *out) {
    const int v = !s ? -2 : !strcmp(s, "on") ? 1 : !strcmp(s, "off") ? 0 : !strcmp(s, "auto") ? -1 : -2;
    if (v == -2) return -1;
    *out = v;
    return 0;
}

int cli_parse_onoff(const char *s, int *out) {
    int v = -1;
    if (cli_parse_checkpoint(s, &v) || v < 0) return -1;
    *out = v;
    return 0;
}

int cli_parse_replay(const char *s, int *replay, int *qkv) {
    if (!strcmp(s, "outputs")) return *replay = 1, *qkv = 0, 0;
    if (cli_parse_onoff(s, replay)) return -1;
    *qkv = *replay;
    return 0;
}

static void usage(FILE *f) {
    fprintf(f,
            "lmx %s - run language models on CPUs and GPUs\n\n"
            "usage: lmx <command> [options]\n\n"
            "commands:\n"
            "  run MODEL [PROMPT]           generation, streamed (prompt from stdin; --prompt-ids for ids)\n"
            "  chat MODEL                   chat with the model's own template (lines on stdin)\n"
            "  info MODEL                   what a model is\n"
            "  discover DIR                 every model under DIR\n"
            "  devices                      the CPU and GPUs lmx can use, their memory and features\n"
            "  inspect MODEL PROMPT         each layer's post-RoPE keys (--probs: attention) [--out FILE]\n"
            "  bench MODEL                  load, prefill and decode speed\n"
            "  bench-train MODEL            LoRA training speed, memory and MFU\n"
            "  check-reference MODEL        compare logits with MODEL/reference.safetensors\n"
            "  check-train BASE LORA_DIR    LoRA training steps against LORA_DIR/train_reference.*\n"
            "  train MODEL --data DIR       LoRA fine-tuning on DIR/train.jsonl (lmx train --help)\n"
            "  eval MODEL --data FILE       loss and perplexity on a JSON Lines file [--adapter DIR]\n"
            "  quantize SRC DST             MLX-layout 4/8-bit copy of a model directory\n"
            "  fuse BASE ADAPTER OUT        merge a LoRA adapter into a copy of a model directory\n"
            "  tokenize TOKENIZER [TEXT]    token ids of TEXT (--jsonl: one {\"text\"} per line)\n"
            "  template TOKENIZER           render chat templates of {\"messages\"} lines on stdin\n\n"
            "`lmx <command> --help` describes each command.\n",
            LMX_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("lmx %s\n", LMX_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "check-reference")) return cmd_check_reference(argc - 1, argv + 1);
    if (!strcmp(cmd, "check-train")) return cmd_check_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "run")) return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat")) return cmd_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "discover")) return cmd_discover(argc - 1, argv + 1);
    if (!strcmp(cmd, "devices")) return cmd_devices(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(cmd, "bench-train")) return cmd_bench_train(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return cmd_quantize(argc - 1, argv + 1);
    if (!strcmp(cmd, "fuse")) return cmd_fuse(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "template")) return cmd_template(argc - 1, argv + 1);
    return cli_usage_error("unknown command \"%s\"", cmd);
}
