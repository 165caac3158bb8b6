/* tok_internal.h - the tokenizer's data structures, shared by the src/tokenizer/tok_*.c files.
 *
 * A loaded tokenizer is a set of compact tables built once from tokenizer.json:
 *   - id -> token string (one string arena), flags per id;
 *   - the model's encode map: token bytes -> id.  For GPT-2 byte-level vocabularies the keys are
 *     the raw bytes the token stands for (the byte-to-unicode mapping undone), so encoding works
 *     on the text's bytes directly;
 *   - BPE merges: (left id, right id) -> (rank, merged id) in an open-addressing map;
 *   - the pipeline steps (normalizers, pre-tokenizers, post-processor, decoders) flattened into
 *     arrays (a Sequence becomes its members in order);
 *   - added tokens in byte tries, one for tokens matched on the raw text, one on normalized text.
 */
#ifndef LMX_TOKENIZER_TOK_INTERNAL_H
#define LMX_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tokenizer/tokenizer.h"

/* ---- growable byte buffer --------------------------------------------------------------- */
typedef struct lmx_tok_buf {
    char *p;
    size_t n, cap;
} lmx_tok_buf;

int lmx_tok_buf_reserve(lmx_tok_buf *b, size_t extra);   /* 0, or -1 when out of memory */
int lmx_tok_buf_put(lmx_tok_buf *b, const void *s, size_t n);
int lmx_tok_buf_putc(lmx_tok_buf *b, char c);
void lmx_tok_buf_free(lmx_tok_buf *b);

int lmx_tok_ids_push(lmx_tok_ids *v, int32_t id);          /* 0, or -1 when out of memory */

/* ---- string -> int32 map (owns copies of its keys) ------------------------------------- */
typedef struct lmx_tok_smap {
    uint32_t *slot;   /* [cap] entry index + 1; 0 = empty */
    uint32_t cap;     /* power of two */
    uint32_t n, ecap;
    uint32_t *eoff, *elen, *ehash;
    int32_t *eval;
    lmx_tok_buf keys;
} lmx_tok_smap;

int lmx_tok_smap_init(lmx_tok_smap *m, size_t expect);
int lmx_tok_smap_put(lmx_tok_smap *m, const char *k, size_t n, int32_t v);   /* overwrites */
int32_t lmx_tok_smap_get(const lmx_tok_smap *m, const char *k, size_t n);     /* -1: absent */
void lmx_tok_smap_free(lmx_tok_smap *m);

/* ---- uint64 -> uint64 map ---------------------------------------------------------------- */
typedef struct lmx_tok_map64 {
    uint64_t *keys;   /* UINT64_MAX = empty */
    uint64_t *vals;
    uint32_t cap, n;
} lmx_tok_map64;

int lmx_tok_map64_init(lmx_tok_map64 *m, size_t expect);
int lmx_tok_map64_put(lmx_tok_map64 *m, uint64_t k, uint64_t v);   /* overwrites */
int lmx_tok_map64_get(const lmx_tok_map64 *m, uint64_t k, uint64_t *v);   /* 1 found, 0 not */
void lmx_tok_map64_free(lmx_tok_map64 *m);

/* ---- UTF-8 ------------------------------------------------------------------------------- */
int lmx_tok_utf8_valid(const char *s, size_t n);
/* Length of the UTF-8 sequence starting at s[0] (1 for an invalid lead byte). */
size_t lmx_tok_utf8_len(unsigned char c);
/* Decode the code point at s; stores its length.  A byte that starts no sequence, or a lead byte
 * whose continuation bytes are missing (cut by a NUL or another character), gives U+FFFD and length
 * 1, read no further than the first byte that does not continue the sequence. */
uint32_t lmx_tok_utf8_decode(const char *s, size_t *len);
size_t lmx_tok_utf8_encode(uint32_t cp, char *out);
/* Append s to out, each maximal invalid subpart replaced by U+FFFD (Rust's from_utf8_lossy). */
int lmx_tok_utf8_lossy(const char *s, size_t n, lmx_tok_buf *out);
/* Bytes at the end of s that begin a valid UTF-8 sequence still missing bytes (0..3). */
size_t lmx_tok_utf8_incomplete_tail(const char *s, size_t n);
/* 1 for Unicode White_Space (Rust char::is_whitespace). */
int lmx_tok_is_space(uint32_t cp);

/* GPT-2 byte-level alphabet: byte b is written as code point byte_cp[b]; cp_byte[cp] undoes it
 * (-1 for code points outside the alphabet, cp < 324). */
void lmx_tok_bytelevel_tables(uint16_t byte_cp[256], int16_t cp_byte[324]);
/* The key a vocabulary string is stored under in t->enc: for byte-level vocabularies the raw bytes
 * its characters stand for, else the string itself.  0, -1 (a character outside the byte-level
 * alphabet) or -2 (out of memory). */
int lmx_tok_enc_key(const lmx_tokenizer *t, const char *s, size_t n, lmx_tok_buf *out);

/* ---- pipeline steps ------------------------------------------------------------------------ */
enum {
    LMX_TOK_NORM_NFC, LMX_TOK_NORM_NFD, LMX_TOK_NORM_NFKC, LMX_TOK_NORM_NFKD,
    LMX_TOK_NORM_LOWERCASE, LMX_TOK_NORM_REPLACE, LMX_TOK_NORM_PREPEND, LMX_TOK_NORM_STRIP,
};

typedef struct lmx_tok_norm {
    int kind;
    char *pat;          /* REPLACE: literal pattern (re == NULL) */
    size_t pat_len;
    pcre2_code *re;     /* REPLACE with a Regex pattern */
    char *content;      /* REPLACE: replacement; PREPEND: prefix */
    size_t content_len;
    int left, right;    /* STRIP */
} lmx_tok_norm;

enum {
    LMX_TOK_PRE_SPLIT, LMX_TOK_PRE_BYTELEVEL, LMX_TOK_PRE_METASPACE, LMX_TOK_PRE_DIGITS,
    LMX_TOK_PRE_WHITESPACE_SPLIT,
};
enum {
    LMX_TOK_SPLIT_REMOVED, LMX_TOK_SPLIT_ISOLATED, LMX_TOK_SPLIT_PREV, LMX_TOK_SPLIT_NEXT,
    LMX_TOK_SPLIT_CONTIGUOUS,
};
enum { LMX_TOK_PREPEND_ALWAYS, LMX_TOK_PREPEND_FIRST, LMX_TOK_PREPEND_NEVER };

typedef struct lmx_tok_pre {
    int kind;
    pcre2_code *re;     /* SPLIT with a regex, BYTELEVEL with use_regex, DIGITS, WHITESPACE */
    char *lit;          /* SPLIT with a String pattern */
    size_t lit_len;
    int behavior, invert;
    int add_prefix_space;            /* BYTELEVEL */
    char repl[8];                    /* METASPACE replacement (UTF-8) */
    size_t repl_len;
    int prepend_scheme, split;       /* METASPACE */
} lmx_tok_pre;

enum {
    LMX_TOK_DEC_BYTELEVEL, LMX_TOK_DEC_REPLACE, LMX_TOK_DEC_BYTEFALLBACK, LMX_TOK_DEC_FUSE,
    LMX_TOK_DEC_STRIP, LMX_TOK_DEC_METASPACE,
};

typedef struct lmx_tok_dec {
    int kind;
    char *pat, *content;             /* REPLACE (literal) */
    size_t pat_len, content_len;
    char strip_c[8];                 /* STRIP: the character removed */
    size_t strip_len;
    int start, stop;                 /* STRIP counts */
    char repl[8];                    /* METASPACE */
    size_t repl_len;
    int prepend_scheme;
} lmx_tok_dec;

/* ---- added tokens ------------------------------------------------------------------------ */
typedef struct lmx_tok_added {
    int32_t id;
    uint32_t off, len;   /* content in tok->strs (normalized content for normalized tokens) */
    uint8_t lstrip, rstrip, single_word, normalized, special;
} lmx_tok_added;

typedef struct lmx_tok_trie {
    uint32_t root[256];     /* child node of the root per first byte; 0 = none */
    lmx_tok_map64 edges;    /* (node << 8 | byte) -> child */
    int32_t *term;          /* [n_nodes] index into tok->added, -1 when no token ends here */
    uint32_t n_nodes, cap_nodes;
} lmx_tok_trie;

/* ---- the tokenizer ------------------------------------------------------------------------ */
enum { LMX_TOK_F_ADDED = 1, LMX_TOK_F_SPECIAL = 2 };

struct lmx_tokenizer {
    /* id -> token string */
    int32_t n_vocab;
    size_t str_cap;                  /* allocated entries of str_off / str_len / flags */
    lmx_tok_buf strs;                /* every string, NUL-separated */
    uint32_t *str_off, *str_len;     /* [n_vocab]; str_len UINT32_MAX: no token */
    uint8_t *flags;                  /* [n_vocab] LMX_TOK_F_* */
    lmx_tok_smap names;              /* token string -> id (added tokens win) */

    /* the BPE model */
    lmx_tok_smap enc;                /* encode key -> id (raw bytes when byte_level) */
    lmx_tok_map64 merges;            /* (a << 32 | b) -> (rank << 32 | merged id) */
    int byte_level;                  /* a ByteLevel pre-tokenizer: encode on raw bytes */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    char *cont_prefix, *eow_suffix;  /* NULL when empty */
    int32_t byte_id[256];            /* byte_level: raw byte -> id; byte_fallback: <0xNN> -> id */
    uint16_t byte_cp[256];
    int16_t cp_byte[324];

    lmx_tok_norm *norms;
    size_t n_norms;
    lmx_tok_pre *pres;
    size_t n_pres;
    lmx_tok_dec *decs;
    size_t n_decs;
    int has_decoder;
    int32_t *post_pre, *post_post;   /* post-processor ids before / after the sequence */
    size_t n_post_pre, n_post_post;

    lmx_tok_added *added;
    size_t n_added;
    lmx_tok_trie trie_raw, trie_norm;

    /* tokenizer_config.json (GGUF: the tokenizer.ggml.* special token keys) */
    char *bos_token, *eos_token, *pad_token, *unk_token;
    int32_t bos_id, eos_id, pad_id;
    int add_bos, add_eos;
    char *chat_template;             /* GGUF tokenizer.chat_template, or NULL */
    char *note;                      /* a remark on how it was built (lmx_tok_info.note), or NULL */
};

/* tok_steps.c: parse the pipeline sections of tokenizer.json (cJSON items) */
struct cJSON;
lmx_status lmx_tok_parse_normalizer(lmx_tokenizer *t, const struct cJSON *j, lmx_err *err);
lmx_status lmx_tok_parse_pretokenizer(lmx_tokenizer *t, const struct cJSON *j, lmx_err *err);
lmx_status lmx_tok_parse_decoder(lmx_tokenizer *t, const struct cJSON *j, lmx_err *err);
lmx_status lmx_tok_parse_postprocessor(lmx_tokenizer *t, const struct cJSON *j, lmx_err *err);
void lmx_tok_steps_free(lmx_tokenizer *t);
/* Compile a regex as HF would use it (UTF, UCP, JIT). */
lmx_status lmx_tok_regex_compile(const char *pat, size_t len, pcre2_code **out, lmx_err *err);

/* tok_load.c: set the string of id (growing the id tables as needed) */
lmx_status lmx_tok_set_string(lmx_tokenizer *t, int32_t id, const char *s, size_t n, lmx_err *err);

/* tok_gguf.c: lmx_tok_load for a .gguf file (errors prefixed with its path) */
lmx_status lmx_tok_load_gguf_path(const char *path, lmx_tokenizer **out, lmx_err *err);

/* tok_model.c: load the BPE model section */
lmx_status lmx_tok_load_bpe(lmx_tokenizer *t, const struct cJSON *model, lmx_err *err);

/* tok_added.c */
int lmx_tok_trie_add(lmx_tok_trie *tr, const char *s, size_t n, int32_t idx);   /* 0 or -1 */
void lmx_tok_trie_free(lmx_tok_trie *tr);
/* Longest added token matching at s[0..n); returns its length (0: none) and index. */
size_t lmx_tok_trie_match(const lmx_tok_trie *tr, const char *s, size_t n, int32_t *idx);

/* A piece of text during encoding: bytes [off, off+len) of a work buffer. */
typedef struct lmx_tok_span {
    uint32_t off, len;
    int32_t added;     /* >= 0: this piece is added token added[i]; -1: text */
    uint8_t first;     /* starts at original offset 0 (Metaspace prepend_scheme "first") */
} lmx_tok_span;

typedef struct lmx_tok_pieces {
    lmx_tok_span *v;
    size_t n, cap;
} lmx_tok_pieces;

int lmx_tok_pieces_push(lmx_tok_pieces *p, uint32_t off, uint32_t len, int32_t added, int first);

/* Split [off, off+len) of buf by the trie's tokens into out (text pieces and added pieces). */
lmx_status lmx_tok_split_added(const lmx_tokenizer *t, const lmx_tok_trie *tr, const char *buf,
                               uint32_t off, uint32_t len, int first, lmx_tok_pieces *out,
                               lmx_err *err);

/* tok_normalize.c: normalize s into out (appending); the result is valid UTF-8. */
lmx_status lmx_tok_normalize(const lmx_tokenizer *t, const char *s, size_t n, lmx_tok_buf *out,
                             lmx_err *err);

/* tok_pretok.c: apply the pre-tokenizers to the text pieces of *pieces (in buffer *buf), in place. */
typedef struct lmx_tok_work {
    lmx_tok_buf a, b;            /* ping-pong buffers */
    lmx_tok_pieces pa, pb;
    pcre2_match_data *md;        /* sized for the largest regex of the tokenizer */
    struct lmx_tok_seg *segs;    /* split scratch */
    size_t seg_cap;
    /* BPE scratch */
    int32_t *sym_id, *sym_prev, *sym_next;
    uint32_t *sym_len;
    size_t sym_cap;
    struct lmx_tok_merge *heap;
    size_t heap_cap;
} lmx_tok_work;

void lmx_tok_work_free(lmx_tok_work *w);
lmx_status lmx_tok_pretokenize(const lmx_tokenizer *t, lmx_tok_work *w, lmx_err *err);

/* tok_bpe.c: append the ids of one pre-token (bytes in the encode-key space) to out. */
lmx_status lmx_tok_bpe_word(const lmx_tokenizer *t, lmx_tok_work *w, const char *s, size_t n,
                            lmx_tok_ids *out, lmx_err *err);

/* tok_decode.c: decode ids; first: the first id is the first of the whole sequence. */
lmx_status lmx_tok_decode_ids(const lmx_tokenizer *t, const int32_t *ids, size_t n,
                              int skip_special, int first, lmx_tok_buf *out, lmx_err *err);

#endif
