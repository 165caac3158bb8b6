/* text_io.h - the CLI's text side of generation: a model's tokenizer, and a streaming decoder that
 * writes generated text to stdout as it completes (seeded with the prompt ids, so the first
 * generated token decodes in context) and keeps it for the caller (chat history). */
#ifndef LMX_CLI_TEXT_IO_H
#define LMX_CLI_TEXT_IO_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

typedef struct cli_text {
    lmx_tokenizer *tok;
    lmx_tok_stream *stream;
    char *out;           /* text emitted since the last cli_text_encode (NUL-terminated) */
    size_t out_len, out_cap;
} cli_text;

/* Load the tokenizer of a model directory or GGUF file; 0, or -1 after printing the error. */
int cli_text_open(cli_text *t, const char *model);
/* Encode text (add_special: the tokenizer's BOS/EOS rules) into a malloc'ed *ids, restart the
 * stream seeded with them, clear the kept text; 0, or -1 after printing the error. */
int cli_text_encode(cli_text *t, const char *text, int add_special, int32_t **ids, int *n);
/* Decode one generated id (or flush the stream's remainder) to stdout and the kept text. */
void cli_text_emit(cli_text *t, int32_t id, int flush);
void cli_text_close(cli_text *t);

#endif
