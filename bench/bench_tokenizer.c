/* bench_tokenizer.c - tokenizer load time and single-thread encode/decode throughput.
 *
 * usage: bench_tokenizer [FIXTURES] [--text FILE] [--mb N] [--doc BYTES] [--dump FILE]
 *
 * For qwen3, llama3 and gemma3 (FIXTURES/tokenizers/NAME): load time (best of 3), then encode
 * of a corpus cut into documents of about --doc bytes (default 4096) at string boundaries.
 * The corpus is FILE, or else every fixture string (the *.public.jsonl texts and llama.cpp's
 * vectors) repeated up to --mb megabytes (default 4).  --dump writes the documents, one JSON
 * string per line, so another tokenizer (HF tokenizers in Python) can be timed on the same text.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fileio.h"
#include "tokenizer/tokenizer.h"
#include "bench_util.h"

typedef struct strs {
    char **v;
    size_t *len;
    size_t n, cap;
} strs;

static void add(strs *s, const char *p, size_t n) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        s->len = realloc(s->len, s->cap * sizeof *s->len);
        if (!s->v || !s->len) exit(1);
    }
    s->v[s->n] = malloc(n + 1);
    if (!s->v[s->n]) exit(1);
    memcpy(s->v[s->n], p, n);
    s->v[s->n][n] = 0;
    s->len[s->n++] = n;
}

static void fixture_strings(const char *fx, strs *out) {
    static const char *names[] = {"qwen3", "llama3", "gemma3"};
    char path[1024];
    lmx_err err = {0};
    for (int k = 0; k < 3; k++) {
        char *text = NULL;
        size_t size;
        snprintf(path, sizeof path, "%s/tokenizers/%s.public.jsonl", fx, names[k]);
        if (lmx_read_file(path, &text, &size, &err)) continue;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            cJSON *row = cJSON_Parse(line);
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(row, "text");
            if (cJSON_IsString(t)) add(out, t->valuestring, strlen(t->valuestring));
            cJSON_Delete(row);
        }
        free(text);
    }
    char *inp = NULL;
    size_t size;
    snprintf(path, sizeof path, "%s/tokenizers/vectors/ggml-vocab-llama-bpe.gguf.inp", fx);
    if (!lmx_read_file(path, &inp, &size, &err)) {
        static const char sep[] = "\n__ggml_vocab_test__\n";
        for (char *p = inp, *e; (e = strstr(p, sep)); p = e + strlen(sep)) add(out, p, (size_t)(e - p));
        free(inp);
    }
}

int main(int argc, char **argv) {
    const char *fx = "../shared/fixtures", *file = NULL, *dump = NULL;
    double mb = 4;
    size_t doc = 4096;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--text") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) mb = atof(argv[++i]);
        else if (!strcmp(argv[i], "--doc") && i + 1 < argc) doc = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (argv[i][0] != '-') fx = argv[i];
        else {
            fprintf(stderr, "usage: bench_tokenizer [FIXTURES] [--text FILE] [--mb N] [--doc BYTES] [--dump FILE]\n");
            return 2;
        }
    }
    /* the corpus, as documents */
    strs pieces = {0}, docs = {0};
    lmx_err err = {0};
    if (file) {
        char *text = NULL;
        size_t size;
        if (lmx_read_file(file, &text, &size, &err)) {
            fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
            return 1;
        }
        for (size_t off = 0; off < size;) {   /* cut at newlines near doc bytes */
            size_t end = off + doc < size ? off + doc : size;
            while (end < size && text[end - 1] != '\n' && end < off + 2 * doc) end++;
            add(&docs, text + off, end - off);
            off = end;
        }
        free(text);
    } else {
        fixture_strings(fx, &pieces);
        if (!pieces.n) {
            fprintf(stderr, "bench_tokenizer: no fixture strings under %s\n", fx);
            return 1;
        }
        size_t total = 0, target = (size_t)(mb * 1e6);
        char *buf = malloc(doc * 2 + 65536);
        size_t bn = 0;
        for (size_t k = 0; total < target; k = (k + 1) % pieces.n) {
            memcpy(buf + bn, pieces.v[k], pieces.len[k]);
            bn += pieces.len[k];
            buf[bn++] = '\n';
            if (bn >= doc) {
                add(&docs, buf, bn);
                total += bn;
                bn = 0;
            }
        }
        free(buf);
    }
    size_t bytes = 0;
    for (size_t i = 0; i < docs.n; i++) bytes += docs.len[i];
    printf("corpus: %zu documents, %.2f MB\n", docs.n, (double)bytes / 1e6);
    if (dump) {
        FILE *f = fopen(dump, "w");
        for (size_t i = 0; f && i < docs.n; i++) {
            cJSON *s = cJSON_CreateString(docs.v[i]);
            char *p = cJSON_PrintUnformatted(s);
            fprintf(f, "%s\n", p);
            free(p);
            cJSON_Delete(s);
        }
        if (f) fclose(f);
    }

    static const char *names[] = {"qwen3", "llama3", "gemma3"};
    printf("%-8s %10s %12s %14s %12s\n", "name", "load s", "encode MB/s", "encode tok/s", "decode MB/s");
    for (int k = 0; k < 3; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/tokenizers/%s", fx, names[k]);
        lmx_tokenizer *tok = NULL;
        double best = 1e9;
        for (int r = 0; r < 3; r++) {
            lmx_tokenizer *t = NULL;
            double t0 = bench_now_s();
            if (lmx_tok_load(path, &t, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
            double dt = bench_now_s() - t0;
            if (dt < best) best = dt;
            if (tok) lmx_tok_free(t);
            else tok = t;
        }
        lmx_tok_ids ids = {0};
        double t0 = bench_now_s();
        for (size_t i = 0; i < docs.n; i++) {
            ids.n = 0;
            if (lmx_tok_encode_into(tok, docs.v[i], docs.len[i], 0, &ids, &err)) {
                fprintf(stderr, "bench_tokenizer: %s\n", err.msg);
                return 1;
            }
        }
        double enc = bench_now_s() - t0;
        /* token count and decode time, in a second pass */
        size_t ntok = 0;
        double dec = 0;
        for (size_t i = 0; i < docs.n; i++) {
            ids.n = 0;
            lmx_tok_encode_into(tok, docs.v[i], docs.len[i], 0, &ids, &err);
            ntok += ids.n;
            char *out = NULL;
            size_t ol;
            double d0 = bench_now_s();
            lmx_tok_decode(tok, ids.ids, ids.n, 0, &out, &ol, &err);
            dec += bench_now_s() - d0;
            free(out);
        }
        printf("%-8s %10.3f %12.2f %14.0f %12.2f\n", names[k], best, (double)bytes / 1e6 / enc,
               (double)ntok / enc, (double)bytes / 1e6 / dec);
        lmx_tok_ids_free(&ids);
        lmx_tok_free(tok);
    }
    for (size_t i = 0; i < pieces.n; i++) free(pieces.v[i]);
    for (size_t i = 0; i < docs.n; i++) free(docs.v[i]);
    free(pieces.v);
    free(pieces.len);
    free(docs.v);
    free(docs.len);
    return 0;
}
