/* tokenizer.h - HuggingFace tokenizer.json tokenizers (internal API, sub-prefix lmx_tok_).
 *
 * Encodes and decodes byte-exactly like HF `tokenizers`: BPE models (GPT-2 byte-level as in
 * Qwen 2/3 and Llama 3; SentencePiece-style with byte_fallback as in Gemma 3), added/special
 * tokens, normalizers, pre-tokenizers, post-processors and decoders as tokenizer.json lists them.
 *
 * Ownership: lmx_tok_load returns a tokenizer the caller frees with lmx_tok_free.  Arrays and
 * strings returned through char ** / int32_t ** are malloc'ed and owned by the caller (free()).
 * Pointers returned as const (token strings, info strings) are owned by the tokenizer and live
 * as long as it does.
 *
 * Thread safety: a loaded tokenizer is never modified, so any number of threads may encode and
 * decode with one tokenizer at once.  A stream (lmx_tok_stream) belongs to one thread at a time.
 */
#ifndef LMX_TOKENIZER_TOKENIZER_H
#define LMX_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct lmx_tokenizer lmx_tokenizer;

/* Load a tokenizer.  path: a model directory or tokenizer directory (holding tokenizer.json and,
 * optionally, tokenizer_config.json), a tokenizer.json file (tokenizer_config.json is then
 * looked for beside it), or a GGUF file (the tokenizer in its metadata, see lmx_tok_load_gguf).
 * On failure *out is NULL and err says why. */
lmx_status lmx_tok_load(const char *path, lmx_tokenizer **out, lmx_err *err);

/* The tokenizer stored in an open GGUF file's metadata (tokenizer.ggml.*): "llama" (SentencePiece
 * BPE with byte fallback, as llama.cpp and HF's LlamaTokenizer) or "gpt2" (byte-level BPE with
 * the pre-tokenizer regex named by tokenizer.ggml.pre).  Control / unknown tokens become special
 * added tokens, user-defined ones plain added tokens; add_special adds BOS / EOS as
 * add_bos_token (default true for "llama", false for "gpt2") / add_eos_token say.  The tokenizer
 * keeps nothing of g, which may be closed at once.  Errors: LMX_ERR_MISSING when the file has no
 * tokenizer (no tokenizer.ggml.model or tokens), LMX_ERR_UNSUPPORTED for another model type,
 * LMX_ERR_FORMAT for inconsistent metadata. */
struct lmx_gguf;
lmx_status lmx_tok_load_gguf(const struct lmx_gguf *g, lmx_tokenizer **out, lmx_err *err);
void lmx_tok_free(lmx_tokenizer *tok);

/* A growable array of token ids. */
typedef struct lmx_tok_ids {
    int32_t *ids;
    size_t n, cap;
} lmx_tok_ids;

void lmx_tok_ids_free(lmx_tok_ids *v);

/* Encode len bytes of UTF-8 text (LMX_ERR_INVALID_ARG when not valid UTF-8).  add_special != 0
 * applies the post-processor of tokenizer.json (e.g. a BOS).  Special/added tokens written in
 * the text are always recognised, as HF does.  *ids is malloc'ed (the caller frees it; it may
 * be NULL when *n == 0). */
lmx_status lmx_tok_encode(const lmx_tokenizer *tok, const char *text, size_t len, int add_special,
                          int32_t **ids, size_t *n, lmx_err *err);
/* The same, appending to out (which keeps its contents on failure). */
lmx_status lmx_tok_encode_into(const lmx_tokenizer *tok, const char *text, size_t len,
                               int add_special, lmx_tok_ids *out, lmx_err *err);

/* Decode n ids into malloc'ed, NUL-terminated UTF-8 (*len bytes without the NUL).
 * skip_special != 0 leaves special tokens out.  Ids outside the vocabulary are skipped, as HF
 * does. */
lmx_status lmx_tok_decode(const lmx_tokenizer *tok, const int32_t *ids, size_t n, int skip_special,
                          char **out, size_t *len, lmx_err *err);
/* The decode of one id alone (what HF's decode([id]) gives, special tokens kept). */
lmx_status lmx_tok_piece(const lmx_tokenizer *tok, int32_t id, char **out, size_t *len,
                         lmx_err *err);

/* The token's string as tokenizer.json writes it (e.g. "Ġworld", "▁world", "<0x0A>"), NUL-
 * terminated, owned by tok; NULL for an id without a token.  *len (may be NULL) gets its size. */
const char *lmx_tok_token_str(const lmx_tokenizer *tok, int32_t id, size_t *len);
/* The id of the token whose string is s (added tokens included), or -1. */
int32_t lmx_tok_token_id(const lmx_tokenizer *tok, const char *s);
int32_t lmx_tok_token_id_n(const lmx_tokenizer *tok, const char *s, size_t len);
/* 1 when id is an added token flagged special (skipped by decode with skip_special). */
int lmx_tok_is_special(const lmx_tokenizer *tok, int32_t id);
/* One more than the largest id (model vocabulary and added tokens). */
int32_t lmx_tok_vocab_size(const lmx_tokenizer *tok);

/* What tokenizer_config.json (or the GGUF metadata) says (ids -1 and strings NULL when absent;
 * strings owned by tok). */
typedef struct lmx_tok_info {
    int32_t vocab_size;
    int32_t bos_id, eos_id, pad_id, unk_id;
    const char *bos_token, *eos_token, *pad_token, *unk_token;
    int add_bos, add_eos;   /* add_bos_token / add_eos_token; -1 when not given */
    const char *model;      /* "BPE" */
    const char *chat_template;   /* GGUF tokenizer.chat_template (Jinja source), else NULL; for
                                  * directories see chat_template.h */
    const char *note;       /* how lmx read something it only partly knows (e.g. an unknown GGUF
                             * pre-tokenizer), else NULL */
} lmx_tok_info;

void lmx_tok_get_info(const lmx_tokenizer *tok, lmx_tok_info *out);

/* Streaming detokenizer: push ids one by one, get back the newly completed text.  Text is only
 * returned once it is final: never a broken UTF-8 sequence (an emoji split over byte tokens comes
 * out whole), and the concatenation of every push and the final flush equals lmx_tok_decode of
 * all the ids with the same skip_special.  The stream keeps a pointer to tok. */
typedef struct lmx_tok_stream lmx_tok_stream;

lmx_status lmx_tok_stream_create(const lmx_tokenizer *tok, int skip_special, lmx_tok_stream **out,
                                 lmx_err *err);
void lmx_tok_stream_free(lmx_tok_stream *s);
/* Start over (as if newly created). */
void lmx_tok_stream_reset(lmx_tok_stream *s);
/* Push one id.  *text (NUL-terminated, possibly "") is owned by the stream and valid until its
 * next call. */
lmx_status lmx_tok_stream_push(lmx_tok_stream *s, int32_t id, const char **text, size_t *len,
                               lmx_err *err);
/* Emit whatever is pending (an incomplete UTF-8 tail becomes U+FFFD, as decode does). */
lmx_status lmx_tok_stream_flush(lmx_tok_stream *s, const char **text, size_t *len, lmx_err *err);

#endif
