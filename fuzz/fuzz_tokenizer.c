/* fuzz_tokenizer.c - a tokenizer.json (model, added tokens, normalizer, pre-tokenizer, post-processor,
 * decoder) and the tokenizer_config.json beside it.
 * Input: tokenizer.json, optionally followed by a NUL byte and tokenizer_config.json.  A tokenizer
 * that loads encodes a few texts (and the start of the input when it is UTF-8), decodes the ids, and
 * its streaming detokenizer must give the same text as the decode (tokenizer.h). */
#include "fuzz.h"

#include "tokenizer/tokenizer.h"

static int utf8_ok(const uint8_t *s, size_t n) {
    char *z = fz_strndup(s, n);
    int ok = strlen(z) == n && one_line_utf8(z); /* conservative: printable UTF-8 without NULs */
    free(z);
    return ok;
}

static void round_trip(const lmx_tokenizer *tok, const char *text, size_t len) {
    lmx_err err = {0};
    for (int special = 0; special < 2; special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        lmx_status s = lmx_tok_encode(tok, text, len, special, &ids, &n, &err);
        fz_check_status("lmx_tok_encode", s, err.msg);
        if (s != LMX_OK) continue;
        char *dec = NULL;
        size_t dl = 0;
        s = lmx_tok_decode(tok, ids, n, special, &dec, &dl, &err);
        fz_check_status("lmx_tok_decode", s, err.msg);
        lmx_tok_stream *st = NULL;
        if (s == LMX_OK && lmx_tok_stream_create(tok, special, &st, &err) == LMX_OK) {
            char *acc = calloc(1, dl + 1);
            size_t an = 0;
            const char *t;
            size_t tl;
            int ok = acc != NULL;
            for (size_t i = 0; ok && i < n; i++) {
                ok = lmx_tok_stream_push(st, ids[i], &t, &tl, &err) == LMX_OK && an + tl <= dl;
                if (ok) memcpy(acc + an, t, tl), an += tl;
            }
            ok = ok && lmx_tok_stream_flush(st, &t, &tl, &err) == LMX_OK && an + tl <= dl;
            if (ok) memcpy(acc + an, t, tl), an += tl;
            FZ_ASSERT(ok && an == dl && !memcmp(acc, dec, dl));
            free(acc);
            lmx_tok_stream_free(st);
        }
        free(dec);
        for (size_t i = 0; i < n && i < 8; i++) {
            char *p = NULL;
            size_t pl = 0;
            fz_check_status("lmx_tok_piece", lmx_tok_piece(tok, ids[i], &p, &pl, &err), err.msg);
            free(p);
        }
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *cfg;
    size_t cfg_n, n = fz_split(data, size, &cfg, &cfg_n);
    fz_write("tokenizer.json", data, n);
    if (cfg) fz_write("tokenizer_config.json", cfg, cfg_n);
    else fz_remove("tokenizer_config.json");
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    lmx_status s = lmx_tok_load(fz_dir(), &tok, &err);
    fz_check_status("lmx_tok_load", s, err.msg);
    if (s != LMX_OK) return 0;
    lmx_tok_info info;
    lmx_tok_get_info(tok, &info);
    FZ_ASSERT(!info.note || one_line_utf8(info.note));
    static const char *const texts[] = {
        "Hello world!  It's 2024: caf\xc3\xa9, \xe4\xb8\xad\xe6\x96\x87, \xf0\x9f\x98\x80\n\n\tend ",
        "<|im_start|>user\nhi<|im_end|><s></s><bos><start_of_turn>",
        "",
        "   \r\n x",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) round_trip(tok, texts[i], strlen(texts[i]));
    size_t m = n < 256 ? n : 256;
    while (m > 0 && !utf8_ok(data, m)) m--; /* the longest clean prefix of the input */
    round_trip(tok, (const char *)data, m);
    int32_t v = lmx_tok_vocab_size(tok);
    for (int32_t id = v > 16 ? v - 16 : 0; id <= v; id++) {
        size_t len = 0;
        const char *str = lmx_tok_token_str(tok, id, &len);
        if (str) FZ_ASSERT(lmx_tok_token_id_n(tok, str, len) >= 0);
        (void)lmx_tok_is_special(tok, id);
    }
    lmx_tok_free(tok);
    return 0;
}
