/* template.c - `lmx template TOKENIZER`: render a model's chat template for conversations read
 * from stdin, one JSON object per line:
 *   {"messages": [...], "add_generation_prompt": bool, "kwargs": {...}, "tools": [...]}
 * and write one line per input: {"text": "..."} or {"error": "..."} (non-ASCII kept raw). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/chat_template.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: lmx template TOKENIZER [--family NAME]\n\n"
            "Render TOKENIZER's chat template (chat_template.jinja or the \"chat_template\" of\n"
            "tokenizer_config.json; TOKENIZER is a model or tokenizer directory, a .jinja file or\n"
            "a tokenizer_config.json) exactly as transformers' apply_chat_template does.\n\n"
            "stdin: one JSON object per line:\n"
            "  {\"messages\": [{\"role\": ..., \"content\": ...}, ...], \"add_generation_prompt\": true,\n"
            "   \"kwargs\": {\"enable_thinking\": false}, \"tools\": [...]}\n"
            "stdout: one line per input: {\"text\": \"...\"} or {\"error\": \"...\"}\n\n"
            "options:\n"
            "  --family NAME   built-in format when there is no chat template: gemma, qwen, llama3\n"
            "                  (default: from config.json's model_type)\n");
}

static void put_line(const char *key, const char *value) {
    cJSON *o = cJSON_CreateObject();
    char *s = NULL;
    if (o && cJSON_AddStringToObject(o, key, value)) s = cJSON_PrintUnformatted(o);
    if (s) printf("%s\n", s);
    else printf("{\"error\": \"out of memory\"}\n");
    fflush(stdout);
    free(s);
    cJSON_Delete(o);
}

static void render_line(const lmx_chat_template *t, const char *line, long lineno) {
    char msg[LMX_ERR_MSG_MAX + 64];
    cJSON *in = cJSON_Parse(line);
    if (!cJSON_IsObject(in)) {
        snprintf(msg, sizeof msg, "input line %ld: not a JSON object", lineno);
        put_line("error", msg);
        cJSON_Delete(in);
        return;
    }
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(in, "messages");
    const cJSON *agp = cJSON_GetObjectItemCaseSensitive(in, "add_generation_prompt");
    const cJSON *kwargs = cJSON_GetObjectItemCaseSensitive(in, "kwargs");
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(in, "tools");
    lmx_err err = {0};
    char *text = NULL;
    if (lmx_chat_template_render(t, messages, cJSON_IsTrue(agp), kwargs, tools, &text, &err) == LMX_OK)
        put_line("text", text);
    else
        put_line("error", err.msg);
    free(text);
    cJSON_Delete(in);
}

int cmd_template(int argc, char **argv) {
    const char *path = NULL, *family = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--family")) {
            if (i + 1 >= argc) return cli_usage_error("template: --family needs a value");
            family = argv[++i];
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return cli_usage_error("template: unknown option \"%s\"", argv[i]);
        } else if (!path) {
            path = argv[i];
        } else {
            return cli_usage_error("template: unexpected argument \"%s\"", argv[i]);
        }
    }
    if (!path) return cli_usage_error("template: missing TOKENIZER");

    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    if (lmx_chat_template_load(path, family, &t, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    long lineno = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        size_t k = 0;
        while (line[k] == ' ' || line[k] == '\t') k++;
        if (!line[k]) continue;
        render_line(t, line, lineno);
    }
    free(line);
    lmx_chat_template_free(t);
    return 0;
}
