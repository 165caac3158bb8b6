/* test_error_messages.c - error messages are one line of valid UTF-8 and quote file content escaped
 * (issue 14: a tokenizer.json whose model.vocab is {} or {"": 0} failed with a message holding a merge
 * token's raw newlines).
 *   1. lmx_quote: escapes, invalid UTF-8, cuts that never split a character or an escape;
 *   2. lmx_err_set / lmx_err_prefix escape whatever their arguments hold;
 *   3. every parser of user files, fed names and values with newlines, quotes and bytes that are not
 *      UTF-8: tokenizer.json (the case first), safetensors headers, GGUF metadata and tensor
 *      infos, config.json, adapter_config.json, chat templates (syntax and runtime errors). */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "one_line.h"
#include "test_files.h"

#include "base/status.h"
#include "formats/gguf.h"
#include "formats/lora_file.h"
#include "formats/safetensors.h"
#include "model/config.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"
#include "tokenizer/tokenizer.h"


/* A failure whose message is one line and holds want (the escaped file content). */
static void check_msg(const char *label, lmx_status s, const char *msg, const char *want) {
    CHECK_MSG(s != LMX_OK, "%s: did not fail", label);
    CHECK_MSG(one_line_utf8(msg), "%s: message is not one printable line: %s", label, msg);
    if (want) CHECK_MSG(strstr(msg, want) != NULL, "%s: message \"%s\" lacks %s", label, msg, want);
    if (getenv("LMX_TEST_VERBOSE")) printf("  %-28s %s\n", label, msg);
}

/* ---- 1. lmx_quote ------------------------------------------------------------------------------ */
static void test_quote(void) {
    char b[LMX_QUOTE_MAX];
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, "abc"), "\"abc\""));
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, NULL), "\"\""));
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, "a\nb\"c\\d\te\r\x01\x7f"), "\"a\\nb\\\"c\\\\d\\te\\r\\u0001\\u007f\""));
    CHECK(!strcmp(lmx_quote(b, sizeof b, "a\0b", 3), "\"a\\u0000b\""));
    /* UTF-8 kept, C1 controls and the Unicode line separators escaped, stray bytes as \xNN */
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, "\xc4\xa0\xe4\xb8\xad"), "\"\xc4\xa0\xe4\xb8\xad\""));
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, "\xc2\x85|\xe2\x80\xa8|\xe2\x80\xa9"), "\"\\u0085|\\u2028|\\u2029\""));
    CHECK(!strcmp(lmx_quote_str(b, sizeof b, "\xff\xc3(\xed\xa0\x80\xc0\xaf"),
                  "\"\\xff\\xc3(\\xed\\xa0\\x80\\xc0\\xaf\""));
    /* too long: a whole prefix, the closing quote, then ... */
    char big[400];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    char small[32];
    lmx_quote_str(small, sizeof small, big);
    size_t n = strlen(small);
    CHECK(n < sizeof small && n > 8 && !strcmp(small + n - 4, "\"...") && small[0] == '"');
    memset(big, '\n', sizeof big - 1);
    lmx_quote_str(small, sizeof small, big);
    n = strlen(small);
    CHECK(n >= 4 && !strcmp(small + n - 4, "\"...") && (n - 5) % 2 == 0); /* whole "\n" pairs only */
    big[0] = 0;
    for (int i = 0; i < 60; i++) strcat(big, "\xe4\xb8\xad");
    lmx_quote_str(small, sizeof small, big);
    CHECK(one_line_utf8(small) && !strcmp(small + strlen(small) - 4, "\"..."));
    CHECK(lmx_quote(small, 4, "abc", 3)[0] == '\0'); /* too small a buffer: empty */
}

/* ---- 2. lmx_err_set / lmx_err_prefix ------------------------------------------------------------- */
static void test_err_set(void) {
    lmx_err e = {0};
    lmx_err_set(&e, LMX_ERR_FORMAT, "bad %s here", "line1\nline2\r\x7f\xff");
    CHECK_MSG(!strcmp(e.msg, "bad line1\\nline2\\r\\u007f\\xff here"), "%s", e.msg);
    lmx_err_prefix(&e, "in\t%s", "file");
    CHECK_MSG(!strcmp(e.msg, "in\\tfile: bad line1\\nline2\\r\\u007f\\xff here"), "%s", e.msg);
    lmx_err_set(&e, LMX_ERR_FORMAT, "%s", e.msg); /* escaping twice changes nothing */
    CHECK_MSG(!strcmp(e.msg, "in\\tfile: bad line1\\nline2\\r\\u007f\\xff here"), "%s", e.msg);
    char big[2000] = "";
    for (int i = 0; i < 600; i++) strcat(big, "\xe4\xb8\xad");
    lmx_err_set(&e, LMX_ERR_FORMAT, "%s", big); /* cut at the message size: no broken character */
    CHECK(one_line_utf8(e.msg) && strlen(e.msg) >= LMX_ERR_MSG_MAX - 8);
}

/* ---- 3. parsers ---------------------------------------------------------------------------------- */
static void put(const char *dir, const char *name, const void *data, size_t n) {
    char *p = lmx_path_join(dir, name);
    write_file(p, data, n);
    free(p);
}

static void test_tokenizer(void) {
    /* the issue: gemma3's first merges are runs of newlines; with no vocabulary they are quoted raw */
    static const char *const vocabs[] = {"{}", "{\"\": 0}"};
    for (int i = 0; i < 2; i++) {
        char *dir = case_dir("errmsg_tok");
        char json[512];
        snprintf(json, sizeof json,
                 "{\"version\": \"1.0\", \"added_tokens\": [], \"normalizer\": null, \"pre_tokenizer\": null, "
                 "\"post_processor\": null, \"decoder\": null, \"model\": {\"type\": \"BPE\", \"vocab\": %s, "
                 "\"merges\": [[\"\\n\\n\\n\", \"\\n\"], [\"\\u2028\", \"x\"]]}}",
                 vocabs[i]);
        put(dir, "tokenizer.json", json, strlen(json));
        lmx_tokenizer *t = NULL;
        lmx_err err = {0};
        check_msg(vocabs[i], lmx_tok_load(dir, &t, &err), err.msg, "\"\\n\\n\\n\" + \"\\n\" not in the vocabulary");
        lmx_tok_free(t);
        end_case(dir);
    }
    static const struct { const char *json, *want; } cases[] = {
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\\nb\\\"c\"]}}", "no space in \"a\\nb\\\"c\""},
        {"{\"model\": {\"type\": \"Uni\\ngram\", \"vocab\": {}, \"merges\": []}}", "\"Uni\\ngram\""},
        {"{\"pre_tokenizer\": {\"type\": \"Foo\\r\\nBar\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, "
         "\"merges\": []}}", "\"Foo\\r\\nBar\""},
        {"{\"normalizer\": {\"type\": \"N\\u0085\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
         "\"N\\u0085\""},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\\n\"}, \"behavior\": \"Isolated\"}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", "\"(\\n\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir("errmsg_tok");
        put(dir, "tokenizer.json", cases[i].json, strlen(cases[i].json));
        lmx_tokenizer *t = NULL;
        lmx_err err = {0};
        check_msg("tokenizer.json", lmx_tok_load(dir, &t, &err), err.msg, cases[i].want);
        lmx_tok_free(t);
        end_case(dir);
    }
}

static void put_safetensors(const char *path, const char *header) {
    size_t n = strlen(header);
    unsigned char *buf = calloc(8 + n + 16, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(buf + 8, header, n);
    write_file(path, buf, 8 + n + 16);
    free(buf);
}

static void test_safetensors(void) {
    static const struct { const char *header, *want; } cases[] = {
        {"{\"a\\nb\\\"c\": {\"dtype\": \"X\\nY\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "\"a\\nb\\\"c\""},
        {"{\"a\\nb\\\"c\": {\"dtype\": \"X\\nY\", \"shape\": [1], \"data_offsets\": [0, 4]}}", "\"X\\nY\""},
        {"{\"__metadata__\": {\"k\\u2028\": 1}}", "\"k\\u2028\""},
        {"{\"t\\n1\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"t\\n2\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}", "\"t\\n2\""},
        {"{\"t\\t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
         "\"t\\t\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 16]}}", "\"t\\t\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir("errmsg_st"), *path = lmx_path_join(dir, "m.safetensors");
        put_safetensors(path, cases[i].header);
        lmx_st_file *f = NULL;
        lmx_err err = {0};
        check_msg("safetensors", lmx_st_open(path, &f, &err), err.msg, cases[i].want);
        lmx_st_close(f);
        free(path);
        end_case(dir);
    }
}

/* A GGUF v3 file: one metadata key (value type vtype, no value) or one tensor info (n_dims 0). */
static void put_gguf(const char *path, const char *name, int tensor, uint32_t vtype) {
    unsigned char buf[256];
    size_t n = 0, len = strlen(name);
    memcpy(buf, "GGUF", 4), n = 4;
#define PUT(v, bytes) do { uint64_t x_ = (uint64_t)(v); for (int k_ = 0; k_ < (bytes); k_++) buf[n++] = (unsigned char)(x_ >> (8 * k_)); } while (0)
    PUT(3, 4);
    PUT(tensor ? 1 : 0, 8);
    PUT(tensor ? 0 : 1, 8);
    PUT(len, 8);
    memcpy(buf + n, name, len), n += len;
    PUT(tensor ? 0 : vtype, 4); /* tensor: n_dims 0; key: the value type */
    PUT(0, 8);
    PUT(0, 8);
#undef PUT
    write_file(path, buf, n);
}

static void test_gguf(void) {
    char *dir = case_dir("errmsg_gguf"), *path = lmx_path_join(dir, "m.gguf");
    lmx_gguf *g = NULL;
    lmx_err err = {0};
    put_gguf(path, "bad\nkey\"q\xff", 0, 99);
    check_msg("gguf key", lmx_gguf_open(path, &g, &err), err.msg, "key \"bad\\nkey\\\"q\\xff\": unknown value type 99");
    lmx_gguf_close(g);
    g = NULL;
    put_gguf(path, "t\r\n1", 1, 0);
    check_msg("gguf tensor", lmx_gguf_open(path, &g, &err), err.msg, "tensor \"t\\r\\n1\" has 0 dimensions");
    lmx_gguf_close(g);
    free(path);
    end_case(dir);
}

static void test_config(void) {
    static const struct { const char *json, *want; } cases[] = {
        {"{\"model_type\": \"llama\\nx\"}", "\"llama\\nx\""},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
         "\"intermediate_size\": 8, \"vocab_size\": 8, \"hidden_act\": \"ge\\nlu\"}", "\"ge\\nlu\""},
        {"{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
         "\"intermediate_size\": 8, \"vocab_size\": 8, \"rope_scaling\": {\"rope_type\": \"yarn\\n\"}}", "\"yarn\\n\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmx_config cfg;
        memset(&cfg, 0, sizeof cfg);
        lmx_err err = {0};
        check_msg("config.json", lmx_config_parse(cases[i].json, "config.json", &cfg, &err), err.msg, cases[i].want);
        lmx_config_free(&cfg);
    }
}

static void test_adapter(void) {
    static const struct { const char *json, *want; } cases[] = {
        {"{\"peft_type\": \"LORA\\nX\", \"r\": 4, \"lora_alpha\": 8}", "\"LORA\\nX\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"bias\": \"all\\n\"}", "\"all\\n\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_pro\\nj\"]}", "\"q_pro\\nj\""},
        {"{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": \"(\\n\"}", "\"(\\n\""},
    };
    float zeros[16] = {0};
    lmx_st_write_item items[] = {
        {.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", .dtype = LMX_DTYPE_F32, .ndim = 2,
         .shape = {4, 4}, .data = zeros},
        {.name = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", .dtype = LMX_DTYPE_F32, .ndim = 2,
         .shape = {4, 4}, .data = zeros},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *dir = case_dir("errmsg_lora"), *w = lmx_path_join(dir, "adapter_model.safetensors");
        lmx_err err = {0};
        CHECK(lmx_st_write(w, items, 2, &err) == LMX_OK);
        put(dir, "adapter_config.json", cases[i].json, strlen(cases[i].json));
        lmx_lora_file f;
        memset(&f, 0, sizeof f);
        lmx_status s = lmx_lora_file_open(dir, &f, &err);
        check_msg("adapter_config.json", s, err.msg, cases[i].want);
        if (s == LMX_OK) lmx_lora_file_close(&f);
        free(w);
        end_case(dir);
    }
}

static void test_templates(void) {
    static const struct { const char *src, *want; } cases[] = {
        {"{{ {}['x\ny'].z }}", "has no attribute 'x\\ny'"},
        {"{{ raise_exception('line1\nline2\x01') }}", "line1\\nline2"},
        {"{{ [1]|map('no\nfilter')|list }}", "no filter named 'no\\nfilter'"},
        {"{{ [1]|select('no\ttest')|list }}", "no test named 'no\\ttest'"},
        {"{{ x.\n }}", NULL},
        {"{% for %}\n\x01\n", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        lmx_chat_template *t = NULL;
        lmx_err err = {0};
        char *out = NULL;
        lmx_status s = lmx_chat_template_from_string(cases[i].src, NULL, NULL, &t, &err);
        if (s == LMX_OK) {
            cJSON *msgs = cJSON_CreateArray();
            s = lmx_chat_template_render(t, msgs, 0, NULL, NULL, &out, &err);
            cJSON_Delete(msgs);
        }
        check_msg("template", s, err.msg, cases[i].want);
        free(out);
        lmx_chat_template_free(t);
    }
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    test_quote();
    test_err_set();
    test_tokenizer();
    test_safetensors();
    test_gguf();
    test_config();
    test_adapter();
    test_templates();
    return check_summary("test_error_messages");
}
