/* test_tokenizer.c - the tokenizer against HF tokenizers and llama.cpp references.
 *
 * For qwen3, llama3 and gemma3 (fixtures/tokenizers/NAME): every row of NAME.public.jsonl exactly
 * (ids, ids_with_special, decoded, and the decode of each id alone); llama.cpp's vocabulary test
 * vectors (llama-bpe = llama3, qwen2 = qwen3); the streaming detokenizer against full decodes for
 * every string; a seeded fuzz round trip decode(encode(s)) == s on the byte-level tokenizers;
 * and the API's edges (token ids, config tokens, invalid input, bad paths). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/fileio.h"
#include "check.h"
#include "tokenizer/tokenizer.h"

static int n_rows, n_vectors, n_streams, n_fuzz;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int same_ids(const int32_t *a, size_t na, const cJSON *arr) {
    if ((size_t)cJSON_GetArraySize(arr) != na) return 0;
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if ((int32_t)x->valuedouble != a[i++]) return 0;
    return 1;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 64; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* UTF-8 validity, written here independently of the library. */
static int valid_utf8(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t L = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!L || i + L > n || (L == 2 && c < 0xC2)) return 0;
        for (size_t k = 1; k < L; k++)
            if ((p[i + k] & 0xC0) != 0x80) return 0;
        uint32_t cp = L == 1 ? c : L == 2 ? c & 0x1F : L == 3 ? c & 0x0F : c & 0x07;
        for (size_t k = 1; k < L; k++) cp = (cp << 6) | (p[i + k] & 0x3F);
        if ((L == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) || (L == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
            return 0;
        i += L;
    }
    return 1;
}

/* Streaming decode of ids (one at a time) must equal the full decode; no chunk is broken UTF-8. */
static void check_stream(const lmx_tokenizer *tok, const int32_t *ids, size_t n, int skip,
                         const char *label) {
    lmx_err err = {0};
    char *full = NULL;
    size_t full_len = 0;
    CHECK(lmx_tok_decode(tok, ids, n, skip, &full, &full_len, &err) == LMX_OK);
    lmx_tok_stream *s = NULL;
    CHECK(lmx_tok_stream_create(tok, skip, &s, &err) == LMX_OK);
    if (!s || !full) {
        free(full);
        return;
    }
    char *acc = malloc(full_len * 2 + 64);
    size_t acc_n = 0, acc_cap = full_len * 2 + 64;
    int chunks_ok = 1;
    for (size_t i = 0; i <= n; i++) {
        const char *t = NULL;
        size_t tl = 0;
        lmx_status st = i < n ? lmx_tok_stream_push(s, ids[i], &t, &tl, &err) : lmx_tok_stream_flush(s, &t, &tl, &err);
        CHECK(st == LMX_OK);
        if (st) break;
        if (i < n && !valid_utf8(t, tl)) chunks_ok = 0;
        if (acc_n + tl > acc_cap) {
            acc_cap = (acc_n + tl) * 2;
            acc = realloc(acc, acc_cap);
        }
        memcpy(acc + acc_n, t, tl);
        acc_n += tl;
    }
    CHECK_MSG(chunks_ok, "%s: a streamed chunk is not valid UTF-8", label);
    CHECK_MSG(acc_n == full_len && !memcmp(acc, full, full_len), "%s: stream \"%.*s\" != decode \"%s\"",
              label, (int)acc_n, acc, full);
    n_streams++;
    free(acc);
    free(full);
    lmx_tok_stream_free(s);
}

static lmx_tokenizer *load(const char *fixtures, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/%s", fixtures, name);
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    double t0 = now_s();
    lmx_status st = lmx_tok_load(path, &tok, &err);
    CHECK_MSG(st == LMX_OK, "load %s: %s", path, err.msg);
    if (tok) printf("%s: loaded in %.3f s (vocab %d)\n", name, now_s() - t0, lmx_tok_vocab_size(tok));
    return tok;
}

static void check_jsonl(const lmx_tokenizer *tok, const char *fixtures, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizers/%s.public.jsonl", fixtures, name);
    char *text = NULL;
    size_t size = 0;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(path, &text, &size, &err) == LMX_OK, "%s", err.msg);
    if (!text) return;
    int rows = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *row = cJSON_Parse(line);
        CHECK_MSG(row != NULL, "%s: bad JSON line", path);
        if (!row) continue;
        const cJSON *jt = cJSON_GetObjectItemCaseSensitive(row, "text");
        const char *s = jt->valuestring;
        const cJSON *jids = cJSON_GetObjectItemCaseSensitive(row, "ids");
        const cJSON *jsp = cJSON_GetObjectItemCaseSensitive(row, "ids_with_special");
        const cJSON *jdec = cJSON_GetObjectItemCaseSensitive(row, "decoded");
        const cJSON *jpieces = cJSON_GetObjectItemCaseSensitive(row, "pieces");
        int32_t *ids = NULL, *ids2 = NULL;
        size_t n = 0, n2 = 0;
        CHECK(lmx_tok_encode(tok, s, strlen(s), 0, &ids, &n, &err) == LMX_OK);
        int ok = same_ids(ids, n, jids);
        CHECK_MSG(ok, "%s: ids of \"%s\"", name, s);
        if (!ok) print_ids("got", ids, n);
        CHECK(lmx_tok_encode(tok, s, strlen(s), 1, &ids2, &n2, &err) == LMX_OK);
        CHECK_MSG(same_ids(ids2, n2, jsp), "%s: ids_with_special of \"%s\"", name, s);
        /* decode the reference ids, so decode is checked even where encode is wrong */
        size_t nr = (size_t)cJSON_GetArraySize(jids), i = 0;
        int32_t *ref = malloc((nr + 1) * sizeof *ref);
        const cJSON *x;
        cJSON_ArrayForEach(x, jids) ref[i++] = (int32_t)x->valuedouble;
        char *dec = NULL;
        size_t dl = 0;
        CHECK(lmx_tok_decode(tok, ref, nr, 0, &dec, &dl, &err) == LMX_OK);
        CHECK_MSG(dec && !strcmp(dec, jdec->valuestring) && dl == strlen(dec), "%s: decode \"%s\" != \"%s\"",
                  name, dec ? dec : "(null)", jdec->valuestring);
        free(dec);
        i = 0;
        cJSON_ArrayForEach(x, jpieces) {
            char *p = NULL;
            CHECK(lmx_tok_piece(tok, ref[i], &p, NULL, &err) == LMX_OK);
            CHECK_MSG(p && !strcmp(p, x->valuestring), "%s: piece of %d: \"%s\" != \"%s\"", name, ref[i],
                      p ? p : "(null)", x->valuestring);
            free(p);
            i++;
        }
        check_stream(tok, ref, nr, 0, name);
        check_stream(tok, ids2, n2, 1, name);
        check_stream(tok, ids2, n2, 0, name);
        free(ref);
        free(ids);
        free(ids2);
        cJSON_Delete(row);
        rows++;
    }
    free(text);
    printf("%s: %d jsonl rows checked\n", name, rows);
    n_rows += rows;
}

static void check_vectors(const lmx_tokenizer *tok, const char *fixtures, const char *vocab) {
    char path[1024];
    char *inp = NULL, *out = NULL;
    size_t ni = 0, no = 0;
    lmx_err err = {0};
    snprintf(path, sizeof path, "%s/tokenizers/vectors/ggml-vocab-%s.gguf.inp", fixtures, vocab);
    CHECK_MSG(lmx_read_file(path, &inp, &ni, &err) == LMX_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/tokenizers/vectors/ggml-vocab-%s.gguf.out", fixtures, vocab);
    CHECK_MSG(lmx_read_file(path, &out, &no, &err) == LMX_OK, "%s", err.msg);
    if (!inp || !out) {
        free(inp);
        free(out);
        return;
    }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    char *p = inp, *o = out;
    int count = 0;
    for (;;) {
        char *e = strstr(p, sep);
        if (!e) break;
        char *oe = strchr(o, '\n');
        CHECK_MSG(oe != NULL, "%s: fewer output lines than inputs", vocab);
        if (!oe) break;
        *oe = 0;
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(lmx_tok_encode(tok, p, (size_t)(e - p), 0, &ids, &n, &err) == LMX_OK);
        /* expected ids */
        size_t k = 0;
        int ok = 1;
        for (char *q = o; *q;) {
            char *end;
            long v = strtol(q, &end, 10);
            if (end == q) break;
            if (k >= n || ids[k] != v) ok = 0;
            k++;
            q = end;
        }
        if (k != n) ok = 0;
        CHECK_MSG(ok, "%s: vector %d \"%.*s\": expected %s", vocab, count, (int)(e - p), p, o);
        if (!ok) print_ids("got", ids, n);
        check_stream(tok, ids, n, 0, vocab);
        free(ids);
        count++;
        p = e + strlen(sep);
        o = oe + 1;
    }
    printf("%s: %d llama.cpp vectors checked\n", vocab, count);
    n_vectors += count;
    free(inp);
    free(out);
}

/* ---- fuzz: random valid UTF-8 that NFC leaves alone ----------------------------------------- */
static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng % n);
}

static size_t put_cp(char *o, uint32_t cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static size_t random_text(char *o, size_t cap) {
    static const char *words[] = {"the", " quick", "Hello", " world", "'s", "'ll", "don't", "<|im_end|>",
                                  "<|begin_of_text|>", "ing", " 123", "2024", "...", "->", "==", "__init__"};
    size_t n = 0, items = rnd(40);
    for (size_t i = 0; i < items && n + 64 < cap; i++) {
        switch (rnd(10)) {
        case 0: n += put_cp(o + n, 0x20 + rnd(0x5F)); break;                 /* printable ASCII */
        case 1: { const char *w = words[rnd(16)]; memcpy(o + n, w, strlen(w)); n += strlen(w); break; }
        case 2: n += put_cp(o + n, 0xC0 + rnd(0x40)); break;                 /* accented Latin-1 */
        case 3: n += put_cp(o + n, 0x4E00 + rnd(0x5000)); break;             /* CJK */
        case 4: n += put_cp(o + n, 0x1F300 + rnd(0x350)); break;             /* emoji */
        case 5: { static const char ws[] = " \t\n\r"; for (uint32_t k = rnd(6) + 1; k--;) o[n++] = ws[rnd(4)]; break; }
        case 6: for (uint32_t k = rnd(7) + 1; k--;) o[n++] = (char)('0' + rnd(10)); break;
        case 7: n += put_cp(o + n, 0x3041 + rnd(0x56)); break;               /* hiragana (no marks) */
        case 8: n += put_cp(o + n, 0x410 + rnd(0x40)); break;                /* Cyrillic */
        default: { static const uint32_t sp[] = {0xA0, 0x3000, 0x2003, 0x200B}; n += put_cp(o + n, sp[rnd(4)]); break; }
        }
    }
    return n;
}

static void fuzz(const lmx_tokenizer *tok, const char *name, int iters) {
    char buf[4096];
    lmx_err err = {0};
    int fails = 0;
    for (int it = 0; it < iters; it++) {
        size_t n = random_text(buf, sizeof buf);
        int32_t *ids = NULL;
        size_t k = 0;
        char *dec = NULL;
        size_t dl = 0;
        CHECK(lmx_tok_encode(tok, buf, n, 0, &ids, &k, &err) == LMX_OK);
        CHECK(lmx_tok_decode(tok, ids, k, 0, &dec, &dl, &err) == LMX_OK);
        int ok = dec && dl == n && !memcmp(dec, buf, n);
        if (!ok && fails++ < 5) {
            fprintf(stderr, "%s: round trip of \"%.*s\" gave \"%s\"\n  ", name, (int)n, buf, dec ? dec : "");
            for (size_t j = 0; j < n; j++) fprintf(stderr, "%02x", (unsigned char)buf[j]);
            fprintf(stderr, "\n  ");
            for (size_t j = 0; j < dl; j++) fprintf(stderr, "%02x", (unsigned char)dec[j]);
            fprintf(stderr, "\n");
        }
        CHECK(ok);
        if (it % 8 == 0) check_stream(tok, ids, k, 0, name);
        free(ids);
        free(dec);
        n_fuzz++;
    }
    printf("%s: %d fuzz round trips\n", name, iters);
}

static void check_api(const lmx_tokenizer *qwen, const lmx_tokenizer *llama, const lmx_tokenizer *gemma) {
    lmx_err err = {0};
    lmx_tok_info in;
    CHECK(lmx_tok_token_id(qwen, "<|im_end|>") == 151645);
    CHECK(lmx_tok_token_id(qwen, "no such token") == -1);
    CHECK(lmx_tok_is_special(qwen, 151645) && !lmx_tok_is_special(qwen, 9707));
    lmx_tok_get_info(qwen, &in);
    CHECK(in.eos_id == 151645 && in.bos_id == -1 && in.pad_id == 151643 && in.add_bos == 0);
    CHECK(in.vocab_size == 151669);
    lmx_tok_get_info(llama, &in);
    CHECK(in.bos_id == 128000 && in.eos_id == 128001 && !strcmp(in.bos_token, "<|begin_of_text|>"));
    lmx_tok_get_info(gemma, &in);
    CHECK(in.bos_id == 2 && in.eos_id == lmx_tok_token_id(gemma, "<end_of_turn>") && in.add_bos == 1 && in.add_eos == 0);
    size_t len = 0;
    const char *s = lmx_tok_token_str(qwen, 1879, &len);
    CHECK(s && !strcmp(s, "\xC4\xA0world") && len == 7);   /* "Ġworld" */
    CHECK(lmx_tok_token_str(qwen, -1, NULL) == NULL && lmx_tok_token_str(qwen, 1 << 30, NULL) == NULL);

    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(lmx_tok_encode(qwen, "\xFF\xFE", 2, 0, &ids, &n, &err) == LMX_ERR_INVALID_ARG);
    CHECK(ids == NULL && strstr(err.msg, "UTF-8"));
    CHECK(lmx_tok_encode(qwen, "", 0, 1, &ids, &n, &err) == LMX_OK && n == 0);
    free(ids);
    CHECK(lmx_tok_encode(gemma, "", 0, 1, &ids, &n, &err) == LMX_OK && n == 1 && ids[0] == 2);
    free(ids);

    /* an emoji over byte-level tokens streams out whole, with nothing before it */
    static const char *emojis[] = {"\xF0\x9F\xAB\xA0", "\xF0\x9F\xA7\xBF", "\xF0\x9F\xA6\xA9",
                                   "\xF0\x9F\xA6\x99"};   /* U+1FAE0 U+1F9FF U+1F9A9 U+1F999 */
    const char *emoji = NULL;
    for (int e = 0; e < 4 && !emoji; e++) {
        CHECK(lmx_tok_encode(qwen, emojis[e], 4, 0, &ids, &n, &err) == LMX_OK);
        if (n >= 2) emoji = emojis[e];
        else free(ids);
    }
    CHECK_MSG(emoji != NULL, "no emoji split over byte tokens");
    if (!emoji) return;
    lmx_tok_stream *st = NULL;
    CHECK(lmx_tok_stream_create(qwen, 0, &st, &err) == LMX_OK);
    const char *t = NULL;
    size_t tl = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        CHECK(lmx_tok_stream_push(st, ids[i], &t, &tl, &err) == LMX_OK);
        CHECK(tl == 0);
    }
    CHECK(lmx_tok_stream_push(st, ids[n - 1], &t, &tl, &err) == LMX_OK);
    CHECK(tl == 4 && !memcmp(t, emoji, 4));
    /* a dangling partial character comes out as U+FFFD at the flush, as decode does */
    lmx_tok_stream_reset(st);
    CHECK(lmx_tok_stream_push(st, ids[0], &t, &tl, &err) == LMX_OK && tl == 0);
    CHECK(lmx_tok_stream_flush(st, &t, &tl, &err) == LMX_OK && !strcmp(t, "\xEF\xBF\xBD"));
    lmx_tok_stream_free(st);
    free(ids);

    /* decode skips special tokens on request and ignores ids outside the vocabulary */
    int32_t seq[] = {151644, 9707, -5, 999999999, 151645};
    char *d = NULL;
    CHECK(lmx_tok_decode(qwen, seq, 5, 1, &d, NULL, &err) == LMX_OK && !strcmp(d, "Hello"));
    free(d);
    CHECK(lmx_tok_decode(qwen, seq, 5, 0, &d, NULL, &err) == LMX_OK && !strcmp(d, "<|im_start|>Hello<|im_end|>"));
    free(d);

    lmx_tokenizer *bad = NULL;
    CHECK(lmx_tok_load("/nonexistent/dir", &bad, &err) != LMX_OK && bad == NULL && err.msg[0]);
    lmx_tok_free(NULL);
    lmx_tok_stream_free(NULL);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : getenv("LMX_FIXTURES");
    if (!fixtures) fixtures = "../shared/fixtures";
    lmx_tokenizer *qwen = load(fixtures, "qwen3");
    lmx_tokenizer *llama = load(fixtures, "llama3");
    lmx_tokenizer *gemma = load(fixtures, "gemma3");
    if (qwen) {
        check_jsonl(qwen, fixtures, "qwen3");
        check_vectors(qwen, fixtures, "qwen2");
        fuzz(qwen, "qwen3", 2000);
    }
    if (llama) {
        check_jsonl(llama, fixtures, "llama3");
        check_vectors(llama, fixtures, "llama-bpe");
        fuzz(llama, "llama3", 2000);
    }
    if (gemma) check_jsonl(gemma, fixtures, "gemma3");
    if (qwen && llama && gemma) check_api(qwen, llama, gemma);
    printf("checked %d jsonl rows, %d llama.cpp vectors, %d streams, %d fuzz strings\n", n_rows, n_vectors,
           n_streams, n_fuzz);
    lmx_tok_free(qwen);
    lmx_tok_free(llama);
    lmx_tok_free(gemma);
    return check_summary("test_tokenizer");
}
