/* chat.c - `lmx chat MODEL`: multi-turn chat with the model's own chat template.
 *
 * Each line on stdin is a user turn ("/reset" forgets the conversation, "/quit" ends it).  The
 * conversation goes to lmx_chat, which renders it with the template, reuses the KV cache of the
 * previous turns (the prompt cache) and streams the answer to stdout; the answer joins the
 * conversation.  Works with a terminal or piped stdin. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "generate.h"
#include "lmx.h"

typedef struct conversation {
    lmx_message *msgs;
    char **owned;     /* [n] the strdup'ed content of each message */
    int n, cap;
} conversation;

static int add(conversation *c, const char *role, const char *content) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        lmx_message *m = realloc(c->msgs, (size_t)cap * sizeof *m);
        if (m) c->msgs = m;
        char **o = m ? realloc(c->owned, (size_t)cap * sizeof *o) : NULL;
        if (!o) return -1;
        c->owned = o;
        c->cap = cap;
    }
    char *copy = strdup(content);
    if (!copy) return -1;
    c->owned[c->n] = copy;
    c->msgs[c->n++] = (lmx_message){.role = role, .content = copy};
    return 0;
}

static void clear(conversation *c) {
    for (int i = 0; i < c->n; i++) free(c->owned[i]);
    c->n = 0;
}

int cmd_chat(int argc, char **argv) {
    const char *path = NULL, *system = NULL;
    cli_gen_opts o;
    cli_gen_opts_init(&o, 512);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: lmx chat MODEL [--system TEXT] [options]\n\n"
                   "Chat with the model's own template: each line on stdin is a user turn; the answer streams\n"
                   "to stdout (at most --max-tokens tokens, default 512).  /reset forgets the conversation,\n"
                   "/quit ends it.  Earlier turns are not evaluated again (the prompt cache).\n\noptions:\n"
                   "  --system TEXT          a system message first\n%s",
                   cli_gen_opts_help);
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

    lmx_model *m = cli_load(path, &o);
    if (!m) return 1;
    conversation conv = {0};
    char *line = NULL;
    size_t cap = 0;
    int rc = 1, interactive = isatty(STDIN_FILENO);
    if (system && add(&conv, "system", system)) goto nomem;
    o.gen.on_token = cli_print_token;
    for (;;) {
        if (interactive) fprintf(stderr, "> ");
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) continue;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            clear(&conv);
            if (system && add(&conv, "system", system)) goto nomem;
            continue;
        }
        if (add(&conv, "user", line)) goto nomem;
        lmx_result r;
        if (lmx_chat(m, conv.msgs, conv.n, &o.gen, &r) != LMX_OK) {
            fprintf(stderr, "lmx: %s\n", lmx_last_error(m));
            goto done;
        }
        printf("\n");
        fflush(stdout);
        cli_report(m, &o, &r);
        if (add(&conv, "assistant", r.text)) goto nomem;
    }
    rc = 0;
    goto done;
nomem:
    fprintf(stderr, "lmx: out of memory\n");
done:
    free(line);
    clear(&conv);
    free(conv.msgs);
    free(conv.owned);
    lmx_model_free(m);
    return rc;
}
