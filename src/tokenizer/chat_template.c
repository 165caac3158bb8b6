/* chat_template.c - loading a model's chat template (chat_template.jinja, tokenizer_config.json,
 * or a built-in family format) and rendering conversations with it (see chat_template.h). */
#include "chat_template.h"

#include "../formats/gguf.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "jinja.h"

enum { TOK_BOS, TOK_EOS, TOK_UNK, TOK_PAD, TOK_COUNT };
static const char *const TOKEN_KEYS[TOK_COUNT] = {"bos_token", "eos_token", "unk_token",
                                                  "pad_token"};

struct lmx_chat_template {
    lmx_jinja *jinja;
    char *source;
    char *tokens[TOK_COUNT];   /* NULL: not passed to the template */
};

/* One message's content: a string, or the text parts of a list of {type, text}. */
#define BUILTIN_CONTENT                                                                         \
    "{% if m.content is string %}{{ m.content }}{% elif m.content is iterable %}"               \
    "{% for p in m.content %}{% if p is mapping and p.text is defined %}{{ p.text }}{% endif %}" \
    "{% endfor %}{% endif %}"

static const char *const BUILTIN_GEMMA =
    "{% for m in messages %}"
    "{{ '<start_of_turn>' ~ ('model' if m.role == 'assistant' else m.role) ~ '\\n' }}"
    BUILTIN_CONTENT "{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

static const char *const BUILTIN_QWEN =
    "{% for m in messages %}{{ '<|im_start|>' ~ m.role ~ '\\n' }}" BUILTIN_CONTENT
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

static const char *const BUILTIN_LLAMA3 =
    "{% for m in messages %}{{ '<|start_header_id|>' ~ m.role ~ '<|end_header_id|>\\n\\n' }}"
    BUILTIN_CONTENT "{{ '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}";

static const char *builtin_source(const char *family) {
    if (!family) return NULL;
    if (!strncmp(family, "gemma", 5)) return BUILTIN_GEMMA;
    if (!strncmp(family, "qwen", 4)) return BUILTIN_QWEN;
    if (!strncmp(family, "llama", 5)) return BUILTIN_LLAMA3;
    return NULL;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = malloc(n);
    if (p) memcpy(p, s, n);
    return p;
}

void lmx_chat_template_free(lmx_chat_template *t) {
    if (!t) return;
    lmx_jinja_free(t->jinja);
    free(t->source);
    for (int k = 0; k < TOK_COUNT; k++) free(t->tokens[k]);
    free(t);
}

const char *lmx_chat_template_source(const lmx_chat_template *t) { return t ? t->source : NULL; }

/* A template owning a copy of source, parsed. */
static lmx_status make(const char *source, lmx_chat_template **out, lmx_err *err) {
    lmx_chat_template *t = calloc(1, sizeof *t);
    if (!t || !(t->source = dup_str(source))) {
        free(t);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory loading a chat template");
    }
    lmx_status s = lmx_jinja_parse(t->source, strlen(t->source), &t->jinja, err);
    if (s != LMX_OK) {
        lmx_chat_template_free(t);
        return s;
    }
    *out = t;
    return LMX_OK;
}

lmx_status lmx_chat_template_from_string(const char *source, const char *bos_token,
                                         const char *eos_token, lmx_chat_template **out,
                                         lmx_err *err) {
    if (!out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL out");
    *out = NULL;
    if (!source) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL source");
    lmx_chat_template *t;
    lmx_status s = make(source, &t, err);
    if (s != LMX_OK) return lmx_err_prefix(err, "chat template");
    const char *toks[2] = {bos_token, eos_token};
    for (int k = 0; k < 2; k++)
        if (toks[k] && !(t->tokens[k] = dup_str(toks[k]))) {
            lmx_chat_template_free(t);
            return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory loading a chat template");
        }
    *out = t;
    return LMX_OK;
}

lmx_status lmx_chat_template_builtin(const char *family, lmx_chat_template **out, lmx_err *err) {
    if (!out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL out");
    *out = NULL;
    const char *src = builtin_source(family);
    if (!src)
        return lmx_err_set(err, LMX_ERR_UNSUPPORTED,
                           "no built-in chat format for family \"%s\" (known: gemma, qwen, llama3)",
                           family ? family : "(null)");
    return make(src, out, err);
}

/* Read and parse a JSON file; *out NULL (and LMX_OK) when the file does not exist. */
static lmx_status read_json(const char *path, cJSON **out, lmx_err *err) {
    *out = NULL;
    if (!lmx_is_file(path)) return LMX_OK;
    char *text;
    size_t n;
    lmx_status s = lmx_read_file(path, &text, &n, err);
    if (s != LMX_OK) return s;
    *out = cJSON_ParseWithLength(text, n);
    free(text);
    if (!*out) return lmx_err_set(err, LMX_ERR_FORMAT, "%s: not valid JSON", path);
    return LMX_OK;
}

/* The "chat_template" of a tokenizer config: a string, or [{name, template}] ("default"). */
static const char *config_template(const cJSON *cfg, const char *path, lmx_err *err, int *bad) {
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    *bad = 0;
    if (!ct || cJSON_IsNull(ct)) return NULL;
    if (cJSON_IsString(ct)) return ct->valuestring;
    if (cJSON_IsArray(ct)) {
        const char *first = NULL;
        for (const cJSON *e = ct->child; e; e = e->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
            const cJSON *tpl = cJSON_GetObjectItemCaseSensitive(e, "template");
            if (!cJSON_IsString(tpl)) continue;
            if (!first) first = tpl->valuestring;
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default")) return tpl->valuestring;
        }
        if (first) return first;
    }
    *bad = 1;
    lmx_err_set(err, LMX_ERR_FORMAT,
                "%s: \"chat_template\" must be a string or a list of {name, template}", path);
    return NULL;
}

/* The family named by config.json's model_type in dir, or NULL. */
static const char *family_from_config(const char *dir, char *buf, size_t n) {
    char *path = lmx_path_join(dir, "config.json");
    cJSON *cfg = NULL;
    lmx_err e = {0};
    if (path) read_json(path, &cfg, &e);
    free(path);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(cfg, "model_type");
    const char *res = NULL;
    if (cJSON_IsString(mt) && builtin_source(mt->valuestring)) {
        snprintf(buf, n, "%s", mt->valuestring);
        res = buf;
    }
    cJSON_Delete(cfg);
    return res;
}

/* A GGUF file: tokenizer.chat_template from its metadata, else the family's built-in format. */
static lmx_status load_from_gguf(const char *path, const char *family, lmx_chat_template **out, lmx_err *err) {
    lmx_tokenizer *tok = NULL;
    lmx_status s = lmx_tok_load(path, &tok, err);
    if (s != LMX_OK) return s;
    lmx_tok_info in;
    lmx_tok_get_info(tok, &in);
    if (in.chat_template) {
        s = lmx_chat_template_from_string(in.chat_template, in.bos_token, in.eos_token, out, err);
        if (s != LMX_OK) lmx_err_prefix(err, "%s (tokenizer.chat_template)", path);
    } else { /* the built-in format of the family, or of general.architecture */
        lmx_gguf *g = NULL;
        char *arch = NULL;
        if (!family && lmx_gguf_open(path, &g, NULL) == LMX_OK) arch = lmx_gguf_get_string(g, "general.architecture");
        const char *fam = family ? family : arch && builtin_source(arch) ? arch : NULL;
        s = fam ? lmx_chat_template_builtin(fam, out, err)
                : lmx_err_set(err, LMX_ERR_MISSING, "%s: no tokenizer.chat_template in the GGUF metadata and no "
                              "built-in format for its architecture (name a family)", path);
        free(arch);
        lmx_gguf_close(g);
    }
    lmx_tok_free(tok);
    return s;
}

lmx_status lmx_chat_template_load(const char *path, const char *family, lmx_chat_template **out,
                                  lmx_err *err) {
    if (!out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL out");
    *out = NULL;
    if (!path) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL path");
    if (lmx_is_file(path) && lmx_gguf_is_gguf(path)) return load_from_gguf(path, family, out, err);
    char *cfg_path = NULL, *jinja_path = NULL, *dir = NULL, *source = NULL;
    cJSON *cfg = NULL;
    lmx_chat_template *t = NULL;
    lmx_status s = LMX_OK;
    if (lmx_is_dir(path)) {
        dir = dup_str(path);
        cfg_path = lmx_path_join(path, "tokenizer_config.json");
        jinja_path = lmx_path_join(path, "chat_template.jinja");
    } else if (lmx_is_file(path)) {
        dir = dup_str(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        if (slash) *slash = '\0';
        else if (dir) strcpy(dir, ".");
        if (lmx_ends_with(path, ".json")) cfg_path = dup_str(path);
        else {
            jinja_path = dup_str(path);
            cfg_path = dir ? lmx_path_join(dir, "tokenizer_config.json") : NULL;
        }
    } else {
        return lmx_err_set(err, LMX_ERR_IO, "%s: no such file or directory", path);
    }
    if (!dir || !cfg_path || (lmx_is_dir(path) && !jinja_path)) {
        s = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory loading a chat template");
        goto done;
    }
    if ((s = read_json(cfg_path, &cfg, err)) != LMX_OK) goto done;
    if (jinja_path && lmx_is_file(jinja_path)) {
        size_t n;
        if ((s = lmx_read_file(jinja_path, &source, &n, err)) != LMX_OK) goto done;
        if (strlen(source) != n) {
            s = lmx_err_set(err, LMX_ERR_FORMAT, "%s: contains a NUL byte", jinja_path);
            goto done;
        }
        if ((s = make(source, &t, err)) != LMX_OK) {
            lmx_err_prefix(err, "%s", jinja_path);
            goto done;
        }
    } else {
        int bad = 0;
        const char *src = cfg ? config_template(cfg, cfg_path, err, &bad) : NULL;
        if (bad) { s = LMX_ERR_FORMAT; goto done; }
        if (src) {
            if ((s = make(src, &t, err)) != LMX_OK) {
                lmx_err_prefix(err, "%s: chat_template", cfg_path);
                goto done;
            }
        } else {
            char fam[64];
            const char *f = family ? family : family_from_config(dir, fam, sizeof fam);
            if (!f) {
                s = lmx_err_set(err, LMX_ERR_MISSING,
                                "%s: no chat template (no chat_template.jinja, no \"chat_template\" "
                                "in tokenizer_config.json) and no model family to fall back on",
                                path);
                goto done;
            }
            if ((s = lmx_chat_template_builtin(f, &t, err)) != LMX_OK) goto done;
        }
    }
    for (int k = 0; k < TOK_COUNT && cfg; k++) {   /* special tokens: "x" or {"content": "x"} */
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, TOKEN_KEYS[k]);
        if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (!cJSON_IsString(v)) continue;
        if (!(t->tokens[k] = dup_str(v->valuestring))) {
            s = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory loading a chat template");
            goto done;
        }
    }
done:
    if (s != LMX_OK) {
        lmx_chat_template_free(t);
        t = NULL;
    }
    *out = t;
    cJSON_Delete(cfg);
    free(source);
    free(cfg_path);
    free(jinja_path);
    free(dir);
    return s;
}

lmx_status lmx_chat_template_render(const lmx_chat_template *t, const cJSON *messages,
                                    int add_generation_prompt, const cJSON *kwargs,
                                    const cJSON *tools, char **out, lmx_err *err) {
    if (!out) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL out");
    *out = NULL;
    if (!t) return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: NULL template");
    if (!cJSON_IsArray(messages))
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: messages must be a JSON array");
    if (kwargs && !cJSON_IsObject(kwargs) && !cJSON_IsNull(kwargs))
        return lmx_err_set(err, LMX_ERR_INVALID_ARG, "chat template: kwargs must be a JSON object");
    cJSON *vars = cJSON_CreateObject();
    int ok = vars != NULL;
    /* references: the caller's JSON is read, never copied or freed */
    ok = ok && cJSON_AddItemReferenceToObject(vars, "messages", (cJSON *)messages);
    if (tools && !cJSON_IsNull(tools))
        ok = ok && cJSON_AddItemReferenceToObject(vars, "tools", (cJSON *)tools);
    else ok = ok && cJSON_AddNullToObject(vars, "tools");
    ok = ok && cJSON_AddNullToObject(vars, "documents");
    ok = ok && cJSON_AddBoolToObject(vars, "add_generation_prompt", add_generation_prompt != 0);
    for (int k = 0; k < TOK_COUNT && ok; k++)
        if (t->tokens[k]) ok = cJSON_AddStringToObject(vars, TOKEN_KEYS[k], t->tokens[k]) != NULL;
    for (const cJSON *c = kwargs && cJSON_IsObject(kwargs) ? kwargs->child : NULL; c && ok; c = c->next)
        ok = cJSON_AddItemReferenceToObject(vars, c->string, (cJSON *)c);   /* later ones win */
    lmx_status s;
    if (!ok) s = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory rendering a chat template");
    else s = lmx_jinja_render(t->jinja, vars, out, err);
    cJSON_Delete(vars);
    return s;
}
