/* text_io.c - see text_io.h. */
#include "text_io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_text_open(cli_text *t, const char *model) {
    lmx_err err = {0};
    memset(t, 0, sizeof *t);
    if (lmx_tok_load(model, &t->tok, &err) != LMX_OK || lmx_tok_stream_create(t->tok, 1, &t->stream, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int cli_text_encode(cli_text *t, const char *text, int add_special, int32_t **ids, int *n) {
    lmx_err err = {0};
    size_t count = 0;
    *ids = NULL;
    if (lmx_tok_encode(t->tok, text, strlen(text), add_special, ids, &count, &err) != LMX_OK) {
        fprintf(stderr, "lmx: %s\n", err.msg);
        return -1;
    }
    if (count == 0) {
        fprintf(stderr, "lmx: the prompt encodes to no tokens\n");
        return -1;
    }
    lmx_tok_stream_reset(t->stream);
    for (size_t i = 0; i < count; i++) { /* context only: the prompt's text is not printed */
        const char *s;
        size_t len;
        lmx_tok_stream_push(t->stream, (*ids)[i], &s, &len, &err);
    }
    t->out_len = 0;
    if (t->out) t->out[0] = 0;
    *n = (int)count;
    return 0;
}

void cli_text_emit(cli_text *t, int32_t id, int flush) {
    lmx_err err = {0};
    const char *s = NULL;
    size_t len = 0;
    if (flush ? lmx_tok_stream_flush(t->stream, &s, &len, &err) : lmx_tok_stream_push(t->stream, id, &s, &len, &err))
        return;
    if (!len) return;
    fwrite(s, 1, len, stdout);
    fflush(stdout);
    if (t->out_len + len + 1 > t->out_cap) {
        size_t cap = (t->out_len + len + 1) * 2;
        char *p = realloc(t->out, cap);
        if (!p) return; /* the screen still got the text; the history keeps what fit */
        t->out = p;
        t->out_cap = cap;
    }
    memcpy(t->out + t->out_len, s, len);
    t->out_len += len;
    t->out[t->out_len] = 0;
}

void cli_text_close(cli_text *t) {
    lmx_tok_stream_free(t->stream);
    lmx_tok_free(t->tok);
    free(t->out);
    memset(t, 0, sizeof *t);
}
