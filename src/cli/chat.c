/* chat.c - `lmx chat MODEL`: multi-turn chat with the model's own chat template.
 *
 * Each line on stdin is a user turn ("/reset" forgets the conversation, "/quit" ends it).  The
 * whole conversation is rendered with the template (generation prompt on), encoded, evaluated in a
 * fresh context and answered greedily until an end-of-sequence or end-of-turn token; the answer
 * streams to stdout and joins the conversation.  Works with a terminal or piped stdin. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "lmx.h"
#include "generate.h"
#include "text_io.h"
#include "tokenizer/chat_template.h"

#define MAX_STOP 16

/* End-of-sequence ids of the model and the end-of-turn tokens of the known chat formats. */
static int stop_ids(const lmx_model_info *in, const lmx_tokenizer *tok, int32_t *out) {
    static const char *turn_ends[] = {"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|endoftext|>", "</s>"};
    int n = 0;
    for (int i = 0; i < in->n_eos && n < MAX_STOP; i++) out[n++] = in->eos_ids[i];
    lmx_tok_info ti;
    lmx_tok_get_info(tok, &ti);
    if (ti.eos_id >= 0 && n < MAX_STOP) out[n++] = ti.eos_id;
    for (size_t i = 0; i < sizeof turn_ends / sizeof turn_ends[0] && n < MAX_STOP; i++) {
        int32_t id = lmx_tok_token_id(tok, turn_ends[i]);
        if (id >= 0) out[n++] = id;
    }
    return n;
}

static void add_message(cJSON *messages, const char *role, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", role);
    cJSON_AddStringToObject(m, "content", content);
    cJSON_AddItemToArray(messages, m);
}

static void emit_text(int32_t id, int index, void *user) { cli_text_emit(user, id, 0); }

/* One assistant turn: render, encode, generate greedily.  Returns 0, or -1 on an error. */
static int answer(lmx_model *m, cli_text *text, const lmx_chat_template *tpl, cJSON *messages,
                  const int32_t *stop, int n_stop, const cli_gen_opts *o) {
    lmx_err err = {0};
    char *prompt = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = -1;
    if (lmx_chat_template_render(tpl, messages, 1, NULL, NULL, &prompt, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        goto done;
    }
    lmx_tok_info ti;
    lmx_tok_get_info(text->tok, &ti);
    /* templates that write the BOS token themselves must not get a second one */
    int has_bos = ti.bos_token && *ti.bos_token && !strncmp(prompt, ti.bos_token, strlen(ti.bos_token));
    if (cli_text_encode(text, prompt, !has_bos, &ids, &n) != 0) goto done;
    if (cli_greedy(m, o->n_ctx, ids, n, o->max_tokens, stop, n_stop, 0, emit_text, text) != 0) goto done;
    cli_text_emit(text, 0, 1);
    add_message(messages, "assistant", text->out ? text->out : "");
    rc = 0;
done:
    free(prompt);
    free(ids);
    return rc;
}

int cmd_chat(int argc, char **argv) {
    const char *path = NULL, *system = NULL;
    cli_gen_opts o = {.backend = "auto", .max_tokens = 256};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help")) {
            printf("usage: lmx chat MODEL [--system TEXT] [--max-tokens N] [--ctx N] [--threads N] [--backend NAME]\n\n"
                   "Chat with the model's own template: each line on stdin is a user turn, answered greedily\n"
                   "(at most --max-tokens tokens, default 256).  /reset forgets the conversation, /quit ends it.\n");
            return 0;
        }
        int r = cli_parse_gen_opt("chat", argc, argv, &i, &o);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "--system") && i + 1 < argc) system = argv[++i];
        else if (a[0] == '-') return cli_usage_error("chat: unknown option or missing value: %s", a);
        else if (path) return cli_usage_error("chat: more than one model given");
        else path = a;
    }
    if (!path) return cli_usage_error("chat: no model given");

    lmx_load_params lp = lmx_load_default_params();
    lp.backend = o.backend;
    lp.n_threads = o.threads;
    lmx_model *m = NULL;
    lmx_chat_template *tpl = NULL;
    cli_text text = {0};
    cJSON *messages = cJSON_CreateArray();
    lmx_err err = {0};
    char *line = NULL;
    size_t cap = 0;
    int rc = 1;
    if (lmx_model_load(path, &lp, &m) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", lmx_last_error(NULL));
        goto done;
    }
    lmx_model_info in;
    lmx_model_get_info(m, &in);
    if (cli_text_open(&text, path) != 0) goto done;
    if (lmx_chat_template_load(path, in.architecture, &tpl, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        goto done;
    }
    int32_t stop[MAX_STOP];
    int n_stop = stop_ids(&in, text.tok, stop);
    if (system) add_message(messages, "system", system);
    int interactive = isatty(STDIN_FILENO);
    for (;;) {
        if (interactive) fprintf(stderr, "> ");
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            cJSON_Delete(messages);
            messages = cJSON_CreateArray();
            if (system) add_message(messages, "system", system);
            continue;
        }
        add_message(messages, "user", line);
        if (answer(m, &text, tpl, messages, stop, n_stop, &o) != 0) goto done;
        printf("\n");
        fflush(stdout);
    }
    rc = 0;
done:
    free(line);
    cJSON_Delete(messages);
    lmx_chat_template_free(tpl);
    cli_text_close(&text);
    lmx_model_free(m);
    return rc;
}
