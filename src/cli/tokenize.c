/* tokenize.c - `lmx tokenize TOKENIZER [TEXT] [--jsonl] [--add-special]`: token ids of a text,
 * or of every {"text": ...} line on stdin as {"ids", "ids_with_special", "decoded"} lines. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/tokenizer.h"

static void usage(void) {
    printf("usage: lmx tokenize TOKENIZER TEXT [--add-special]\n"
           "       lmx tokenize TOKENIZER --jsonl < lines\n\n"
           "TOKENIZER is a model directory, a tokenizer directory, a tokenizer.json file or a GGUF\n"
           "file (the tokenizer in its metadata).\n"
           "With TEXT: print the ids of TEXT, then one line per token: id, then the token's decode\n"
           "as a JSON string.  --add-special applies the tokenizer's post-processor (e.g. BOS).\n"
           "With --jsonl: read lines {\"text\": ...} from stdin and write for each a line\n"
           "{\"ids\": [...], \"ids_with_special\": [...], \"decoded\": \"...\"} (decoded = decode of ids).\n");
}

static cJSON *ids_json(const int32_t *ids, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* One {"text"} line -> one output line; returns 0, or 1 after printing an error. */
static int jsonl_line(const lmx_tokenizer *tok, const char *line, long lineno) {
    cJSON *in = cJSON_Parse(line);
    const cJSON *jt = cJSON_GetObjectItemCaseSensitive(in, "text");
    if (!cJSON_IsString(jt)) {
        fprintf(stderr, "lmx: stdin line %ld: expected {\"text\": \"...\"}\n", lineno);
        cJSON_Delete(in);
        return 1;
    }
    const char *text = jt->valuestring;
    lmx_err err = {0};
    int32_t *ids = NULL, *ids2 = NULL;
    size_t n = 0, n2 = 0, dl = 0;
    char *dec = NULL;
    int rc = 0;
    if (lmx_tok_encode(tok, text, strlen(text), 0, &ids, &n, &err) ||
        lmx_tok_encode(tok, text, strlen(text), 1, &ids2, &n2, &err) ||
        lmx_tok_decode(tok, ids, n, 0, &dec, &dl, &err)) {
        fprintf(stderr, "lmx: stdin line %ld: %s\n", lineno, err.msg);
        rc = 1;
    } else {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddItemToObject(out, "ids", ids_json(ids, n));
        cJSON_AddItemToObject(out, "ids_with_special", ids_json(ids2, n2));
        cJSON_AddStringToObject(out, "decoded", dec);
        char *s = cJSON_PrintUnformatted(out);
        if (s) printf("%s\n", s);
        else rc = 1;
        free(s);
        cJSON_Delete(out);
    }
    free(ids);
    free(ids2);
    free(dec);
    cJSON_Delete(in);
    return rc;
}

static int run_jsonl(const lmx_tokenizer *tok) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (!got) continue;
        if (jsonl_line(tok, line, lineno)) {
            rc = 1;
            break;
        }
    }
    free(line);
    return rc;
}

static int run_text(const lmx_tokenizer *tok, const char *text, int add_special) {
    lmx_err err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (lmx_tok_encode(tok, text, strlen(text), add_special, &ids, &n, &err)) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
    printf("\n");
    for (size_t i = 0; i < n; i++) {
        char *p = NULL;
        if (lmx_tok_piece(tok, ids[i], &p, NULL, &err)) {
            fprintf(stderr, "lmx: %s\n", err.msg);
            free(ids);
            return 1;
        }
        cJSON *s = cJSON_CreateString(p);
        char *q = s ? cJSON_PrintUnformatted(s) : NULL;
        printf("%8d  %s\n", ids[i], q ? q : "?");
        free(q);
        cJSON_Delete(s);
        free(p);
    }
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL;
    int jsonl = 0, add_special = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            return 0;
        }
        if (!strcmp(argv[i], "--jsonl")) jsonl = 1;
        else if (!strcmp(argv[i], "--add-special")) add_special = 1;
        else if (argv[i][0] == '-' && argv[i][1]) return cli_usage_error("tokenize: unknown option %s", argv[i]);
        else if (!path) path = argv[i];
        else if (!text) text = argv[i];
        else return cli_usage_error("tokenize: too many arguments");
    }
    if (!path) return cli_usage_error("tokenize: no tokenizer given");
    if (jsonl && text) return cli_usage_error("tokenize: TEXT and --jsonl exclude each other");
    if (!jsonl && !text) return cli_usage_error("tokenize: no TEXT given (or use --jsonl)");
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    if (lmx_tok_load(path, &tok, &err)) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return 1;
    }
    int rc = jsonl ? run_jsonl(tok) : run_text(tok, text, add_special);
    lmx_tok_free(tok);
    return rc;
}
