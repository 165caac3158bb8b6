/* test_tokenizer_strip.c - the Llama 2 / Mistral decoder chain (Replace "▁" -> " ", ByteFallback,
 * Fuse, Strip(" ", 1, 0)): HF strips one leading space of the whole decoded text, so a streamed
 * decode must strip only its first chunk and concatenate to exactly the full decode. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "tokenizer/tokenizer.h"

static const char *TOKENIZER_JSON =
    "{\"version\":\"1.0\",\"added_tokens\":[],\"normalizer\":null,\"pre_tokenizer\":null,\"post_processor\":null,"
    "\"decoder\":{\"type\":\"Sequence\",\"decoders\":["
    "{\"type\":\"Replace\",\"pattern\":{\"String\":\"\\u2581\"},\"content\":\" \"},"
    "{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},"
    "{\"type\":\"Strip\",\"content\":\" \",\"start\":1,\"stop\":0}]},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":\"<unk>\",\"continuing_subword_prefix\":null,"
    "\"end_of_word_suffix\":null,\"fuse_unk\":true,\"byte_fallback\":true,"
    "\"vocab\":{\"<unk>\":0,\"\\u2581Hello\":1,\"\\u2581world\":2,\"!\":3,\"\\u2581\":4,\"<0x0A>\":5},"
    "\"merges\":[]}}";

int main(void) {
    char dir[] = "/tmp/lmx_strip_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(TOKENIZER_JSON, f);
        fclose(f);
    }
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_tok_load(path, &tok, &err) == LMX_OK, "%s", err.msg);
    if (tok) {
        /* expected values follow HF: the fused text " Hello world!\n world" loses one leading space */
        const struct { int32_t ids[6]; int n; const char *want; } cases[] = {
            {{1, 2, 3}, 3, "Hello world!"},
            {{1, 5, 2}, 3, "Hello\n world"},
            {{4, 1}, 2, " Hello"},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char *full = NULL;
            size_t len = 0;
            CHECK(lmx_tok_decode(tok, cases[c].ids, (size_t)cases[c].n, 0, &full, &len, &err) == LMX_OK);
            CHECK_MSG(full && !strcmp(full, cases[c].want), "case %zu: full decode \"%s\"", c, full ? full : "");
            lmx_tok_stream *s = NULL;
            CHECK(lmx_tok_stream_create(tok, 0, &s, &err) == LMX_OK);
            char streamed[256] = "";
            for (int i = 0; s && i < cases[c].n; i++) {
                const char *t = NULL;
                size_t n = 0;
                CHECK(lmx_tok_stream_push(s, cases[c].ids[i], &t, &n, &err) == LMX_OK);
                strncat(streamed, t ? t : "", n < sizeof streamed - strlen(streamed) - 1 ? n : 0);
            }
            const char *t = NULL;
            size_t n = 0;
            if (s) CHECK(lmx_tok_stream_flush(s, &t, &n, &err) == LMX_OK);
            if (t) strncat(streamed, t, n);
            CHECK_MSG(full && !strcmp(streamed, full), "case %zu: streamed \"%s\" != full \"%s\"", c, streamed,
                      full ? full : "");
            lmx_tok_stream_free(s);
            free(full);
        }
        lmx_tok_free(tok);
    }
    unlink(path);
    rmdir(dir);
    return check_summary("test_tokenizer_strip");
}
