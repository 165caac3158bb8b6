/* test_gguf.c - the GGUF reader on a real file (stories260K.gguf: metadata and tensor directory
 * as the fixtures README and reference describe), and on damaged copies: every truncation, a bad
 * magic, an unknown version and absurd counts give a clean error naming the file, never a crash. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "check.h"
#include "formats/gguf.h"

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(data, 1, n, f);
        fclose(f);
    }
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : getenv("LMX_FIXTURES");
    if (!fixtures) fixtures = "../shared/fixtures";
    char path[4096];
    snprintf(path, sizeof path, "%s/real/stories260K.gguf", fixtures);
    lmx_gguf *g = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_gguf_open(path, &g, &err) == LMX_OK, "%s", err.msg);
    if (g) {
        int64_t v = 0;
        CHECK(lmx_gguf_get_int(g, "llama.block_count", &v) && v == 5);
        CHECK(lmx_gguf_get_int(g, "llama.embedding_length", &v) && v == 64);
        CHECK(lmx_gguf_get_int(g, "tokenizer.ggml.bos_token_id", &v) && v == 1);
        char *arch = lmx_gguf_get_string(g, "general.architecture");
        CHECK(arch && !strcmp(arch, "llama"));
        free(arch);
        const lmx_gguf_kv *tokens = lmx_gguf_find_kv(g, "tokenizer.ggml.tokens");
        CHECK(tokens && tokens->type == LMX_GGUF_ARRAY && tokens->elem_type == LMX_GGUF_STRING && tokens->count == 512);
        if (tokens) CHECK(tokens->strs[1].len == 3 && !memcmp(tokens->strs[1].s, "<s>", 3));
        const lmx_gguf_kv *scores = lmx_gguf_find_kv(g, "tokenizer.ggml.scores");
        CHECK(scores && scores->elem_type == LMX_GGUF_F32 && scores->count == 512);
        const lmx_gguf_tensor *emb = lmx_gguf_find_tensor(g, "token_embd.weight");
        CHECK(emb && emb->type == 0 && emb->ne[0] == 64 && emb->ne[1] == 512 && emb->nbytes == 64 * 512 * 4);
        CHECK(lmx_gguf_find_tensor(g, "nope") == NULL && lmx_gguf_find_kv(g, "nope") == NULL);
        CHECK(lmx_gguf_tensor_count(g) == 48);
        lmx_gguf_close(g);
    }

    /* damaged copies */
    char *data = NULL;
    size_t n = 0;
    CHECK(lmx_read_file(path, &data, &n, &err) == LMX_OK);
    char tmp[] = "/tmp/lmx_gguf_XXXXXX";
    int fd = mkstemp(tmp);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    int clean = 1, named = 1;
    for (size_t cut = 0; data && cut < n; cut += cut < 4096 ? 1 : 997) { /* every header prefix */
        write_bytes(tmp, data, cut);
        lmx_err e = {0};
        g = NULL;
        lmx_status s = lmx_gguf_open(tmp, &g, &e);
        clean &= s != LMX_OK && g == NULL;
        named &= strstr(e.msg, tmp) != NULL;
        lmx_gguf_close(g);
    }
    CHECK_MSG(clean, "a truncated GGUF file opened");
    CHECK_MSG(named, "an error message does not name the file");
    if (data && n > 24) {
        struct { size_t at; uint8_t byte; lmx_status want; const char *word; } cases[] = {
            {0, 'X', LMX_ERR_FORMAT, "magic"},           /* bad magic */
            {4, 9, LMX_ERR_UNSUPPORTED, "version"},      /* version 9 */
            {15, 0x7f, LMX_ERR_FORMAT, "exceed"},        /* absurd tensor count */
            {23, 0x7f, LMX_ERR_FORMAT, "exceed"},        /* absurd metadata count */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            char saved = data[cases[i].at];
            data[cases[i].at] = (char)cases[i].byte;
            write_bytes(tmp, data, n);
            data[cases[i].at] = saved;
            lmx_err e = {0};
            g = NULL;
            lmx_status s = lmx_gguf_open(tmp, &g, &e);
            CHECK_MSG(s == cases[i].want, "case %zu: got status %d (%s)", i, (int)s, e.msg);
            CHECK_CONTAINS(e.msg, cases[i].word);
            lmx_gguf_close(g);
        }
    }
    /* a tensor of a type number past the file types (LMX_GGML_LAYOUTS: a backend's layout, e.g. cuda's 16-byte
     * aligned Q6_K) is refused as unknown: the type field after the first tensor's name, dims count and dims */
    const char *name = "token_embd.weight";
    char *at = data ? memmem(data, n, name, strlen(name)) : NULL;
    CHECK(at != NULL);
    if (at) {
        const size_t tpos = (size_t)(at - data) + strlen(name) + 4 + 8 * (size_t)(uint8_t)at[strlen(name)];
        uint8_t saved[4];
        memcpy(saved, data + tpos, 4);
        const uint8_t layout[4] = {14, 1, 0, 0}; /* 256 + 14, little-endian */
        memcpy(data + tpos, layout, 4);
        write_bytes(tmp, data, n);
        memcpy(data + tpos, saved, 4);
        lmx_err e = {0};
        g = NULL;
        CHECK_MSG(lmx_gguf_open(tmp, &g, &e) == LMX_ERR_UNSUPPORTED, "type 270: %s", e.msg);
        CHECK_CONTAINS(e.msg, "unknown ggml type 270");
        lmx_gguf_close(g);
    }
    CHECK(lmx_gguf_is_gguf(path) && !lmx_gguf_is_gguf("/nonexistent"));
    unlink(tmp);
    free(data);
    return check_summary("test_gguf");
}
