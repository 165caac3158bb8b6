/* chat_template.h - a model's chat template, rendered as HF transformers' apply_chat_template
 * renders it (tokenize=False).
 *
 * Where the template comes from (lmx_chat_template_load):
 *   - DIR/chat_template.jinja when present (as transformers 5 prefers it), else
 *   - "chat_template" of DIR/tokenizer_config.json: a string, or a list of {name, template}
 *     of which "default" is used (the first entry when none is named so);
 *   - otherwise a built-in format chosen by family ("gemma", "qwen", "llama3"), or, with family
 *     NULL, by config.json's model_type in DIR; LMX_ERR_MISSING when none applies.
 * path may also be a .jinja file or a tokenizer_config.json-like .json file.
 *
 * The template's variables are those transformers passes: messages, tools (none when NULL),
 * documents (none), add_generation_prompt, the special tokens of tokenizer_config.json
 * (bos_token, eos_token, unk_token, pad_token; strings or {"content": ...} objects; absent
 * when null), then every member of kwargs (e.g. enable_thinking), which override the rest.
 *
 * Built-in formats (no BOS; the tokenizer adds it):
 *   gemma   <start_of_turn>ROLE\nCONTENT<end_of_turn>\n  (assistant is "model"), prompt
 *           <start_of_turn>model\n
 *   qwen    <|im_start|>ROLE\nCONTENT<|im_end|>\n, prompt <|im_start|>assistant\n
 *   llama3  <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, prompt
 *           <|start_header_id|>assistant<|end_header_id|>\n\n
 *
 * Limitation: JSON numbers reach templates through cJSON, which keeps no int/float
 * distinction: integral numbers become ints (so tojson writes 1, not 1.0).
 *
 * Thread safety: a loaded template is immutable; several threads may render it at once. */
#ifndef LMX_TOKENIZER_CHAT_TEMPLATE_H
#define LMX_TOKENIZER_CHAT_TEMPLATE_H

#include "base/status.h"

struct cJSON;
typedef struct lmx_chat_template lmx_chat_template;

/* Load the chat template of a model or tokenizer directory (see above).  family may be NULL.
 * On success *out owns it; free with lmx_chat_template_free. */
lmx_status lmx_chat_template_load(const char *path, const char *family, lmx_chat_template **out,
                                  lmx_err *err);

/* A template from Jinja source; bos_token / eos_token may be NULL (then undefined). */
lmx_status lmx_chat_template_from_string(const char *source, const char *bos_token,
                                         const char *eos_token, lmx_chat_template **out,
                                         lmx_err *err);

/* The built-in format of a family ("gemma", "qwen", "llama3"; also "gemma2", "gemma3",
 * "qwen2", "qwen3", "llama"); LMX_ERR_UNSUPPORTED for others. */
lmx_status lmx_chat_template_builtin(const char *family, lmx_chat_template **out, lmx_err *err);

/* Render messages (a cJSON array of {role, content, ...}).  kwargs: a cJSON object of extra
 * variables or NULL; tools: a cJSON array or NULL.  On success *out is a malloc'ed string the
 * caller frees.  Errors: LMX_ERR_INVALID_ARG with the template's raise_exception message or
 * "template error at line N: ..."; LMX_ERR_NOMEM past the engine's limits. */
lmx_status lmx_chat_template_render(const lmx_chat_template *t, const struct cJSON *messages,
                                    int add_generation_prompt, const struct cJSON *kwargs,
                                    const struct cJSON *tools, char **out, lmx_err *err);

/* The Jinja source in use (built-in formats included); owned by t. */
const char *lmx_chat_template_source(const lmx_chat_template *t);

void lmx_chat_template_free(lmx_chat_template *t);

#endif
