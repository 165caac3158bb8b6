/* fuzz_jinja.c - the Jinja engine under chat templates: a template, and the conversation it renders.
 * Input: the template source, optionally followed by a NUL byte and one JSON object as `lmx template`
 * reads it: {"messages": [...], "add_generation_prompt": bool, "kwargs": {...}, "tools": [...]};
 * without one (or when it is not an object), a fixed four-turn conversation.  The template is
 * rendered as a chat template (lmx_chat_template_*), and by the bare engine with the object's
 * members as its variables (lmx_jinja_*). */
#include <cjson/cJSON.h>

#include "fuzz.h"

#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

static const char k_default[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
    " {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"2+2?\"}],"
    " \"add_generation_prompt\": true, \"kwargs\": {\"enable_thinking\": false}}";

static void check_text(const char *what, lmx_status s, const char *msg, const char *out) {
    fz_check_status(what, s, msg);
    FZ_ASSERT((s == LMX_OK) == (out != NULL));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *vars;
    size_t vars_n, n = fz_split(data, size, &vars, &vars_n);
    char *src = fz_strndup(data, n), *js = vars ? fz_strndup(vars, vars_n) : NULL;
    cJSON *in = js ? cJSON_Parse(js) : NULL;
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        in = cJSON_Parse(k_default);
    }
    lmx_err err = {0};
    lmx_chat_template *t = NULL;
    lmx_status s = lmx_chat_template_from_string(src, "<bos>", "<eos>", &t, &err);
    fz_check_status("lmx_chat_template_from_string", s, err.msg);
    if (s == LMX_OK) {
        char *out = NULL;
        s = lmx_chat_template_render(t, cJSON_GetObjectItemCaseSensitive(in, "messages"),
                                     cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(in, "add_generation_prompt")),
                                     cJSON_GetObjectItemCaseSensitive(in, "kwargs"),
                                     cJSON_GetObjectItemCaseSensitive(in, "tools"), &out, &err);
        check_text("lmx_chat_template_render", s, err.msg, out);
        free(out);
        lmx_chat_template_free(t);
    }
    lmx_jinja *j = NULL;
    s = lmx_jinja_parse(src, n, &j, &err);
    fz_check_status("lmx_jinja_parse", s, err.msg);
    if (s == LMX_OK) {
        char *out = NULL;
        s = lmx_jinja_render(j, in, &out, &err);
        check_text("lmx_jinja_render", s, err.msg, out);
        free(out);
        lmx_jinja_free(j);
    }
    cJSON_Delete(in);
    free(js);
    free(src);
    return 0;
}
