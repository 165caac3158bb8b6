/* fuzz_jsonl.c - the JSON Lines readers of the lmx command: `lmx tokenize TOKENIZER --jsonl` (lines
 * {"text": ...}) and `lmx template TOKENIZER` (lines {"messages", "add_generation_prompt", "kwargs",
 * "tools"}), run as the command runs them (src/cli/tokenize.c and template.c are linked in).
 * Input: what the command reads on stdin.  The tokenizer (a small byte-level BPE) and the chat
 * template are written to the scratch directory once; stdout is discarded, and so is what the
 * commands print to stderr (through the stdio stream only: sanitizer reports still reach fd 2). */
#include <cjson/cJSON.h>

#include "fuzz.h"

#include "cli/cli.h"
#include "tokenizer/tok_internal.h"

/* The stubs of src/cli/main.c that the two commands use (main.c itself holds main). */
int cli_usage_error(const char *fmt, ...) {
    (void)fmt;
    return 2;
}

int cli_parse_int(const char *s, int *out) {
    if (!s || !*s) return -1;
    *out = atoi(s);
    return 0;
}

static const char k_template[] =
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role not in ['system', 'user', 'assistant', 'tool'] %}{{ raise_exception('bad role ' ~ m.role) }}{% endif %}"
    "<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content | trim }}"
    "{%- else %}{% for part in m.content %}{{ part.text | default('') }}{% endfor %}{% endif %}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

static char tok_dir[600], tpl_path[600];
static FILE *devnull;

static void write_tokenizer(void) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    cJSON *merges = cJSON_CreateArray(), *added = cJSON_CreateArray();
    char s[8];
    uint16_t byte_cp[256];
    int16_t cp_byte[324];
    lmx_tok_bytelevel_tables(byte_cp, cp_byte); /* GPT-2's byte-level alphabet */
    for (int b = 0; b < 256; b++) {
        s[lmx_tok_utf8_encode(byte_cp[b], s)] = 0;
        cJSON_AddNumberToObject(vocab, s, b);
    }
    static const char *const m[][2] = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"\xc4\xa0", "w"}, {"o", "r"}, {"\xc4\xa0w", "or"}};
    for (int i = 0; i < 6; i++) {
        char tok[16];
        snprintf(tok, sizeof tok, "%s%s", m[i][0], m[i][1]);
        cJSON_AddNumberToObject(vocab, tok, 256 + i);
        snprintf(tok, sizeof tok, "%s %s", m[i][0], m[i][1]);
        cJSON_AddItemToArray(merges, cJSON_CreateString(tok));
    }
    static const char *const specials[] = {"<|im_start|>", "<|im_end|>"};
    for (int i = 0; i < 2; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", 262 + i);
        cJSON_AddStringToObject(a, "content", specials[i]);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON *pre = cJSON_CreateObject(), *dec = cJSON_CreateObject();
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddBoolToObject(pre, "add_prefix_space", 0);
    cJSON_AddBoolToObject(pre, "use_regex", 1);
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddItemToObject(root, "added_tokens", added);
    cJSON_AddItemToObject(root, "pre_tokenizer", pre);
    cJSON_AddItemToObject(root, "decoder", dec);
    cJSON_AddItemToObject(root, "model", model);
    char *text = cJSON_PrintUnformatted(root);
    if (!text) abort();
    snprintf(tok_dir, sizeof tok_dir, "%s", fz_write("tokenizer.json", text, strlen(text)));
    *strrchr(tok_dir, '/') = 0;
    free(text);
    cJSON_Delete(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    write_tokenizer();
    snprintf(tpl_path, sizeof tpl_path, "%s", fz_write("chat_template.jinja", k_template, sizeof k_template - 1));
    devnull = fopen("/dev/null", "w");
    if (!devnull || !freopen("/dev/null", "w", stdout)) abort();
    return 0;
}

static void run(int (*cmd)(int, char **), int argc, char **argv, const char *input) {
    if (!freopen(input, "r", stdin)) abort();
#if defined(__GLIBC__)
    FILE *err = stderr; /* glibc lets stderr be reassigned: the commands' messages go nowhere */
    stderr = devnull;
#endif
    int rc = cmd(argc, argv);
#if defined(__GLIBC__)
    stderr = err;
#endif
    FZ_ASSERT(rc == 0 || rc == 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *input = fz_write("stdin.jsonl", data, size);
    char *tok_argv[] = {"tokenize", tok_dir, "--jsonl", NULL};
    char *tpl_argv[] = {"template", tpl_path, NULL};
    run(cmd_tokenize, 3, tok_argv, input);
    run(cmd_template, 2, tpl_argv, input);
    return 0;
}
