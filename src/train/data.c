/* data.c - training data as mlx-lm reads it: JSON Lines of {"text"}, {"prompt", "completion"} or
 * {"messages"} (train/data.h). */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../base/fileio.h"
#include "../runtime/runtime.h"
#include "../base/json.h"

void lmx_train_set_free(lmx_train_set *s) {
    for (int i = 0; i < s->n; i++) free(s->ex[i].ids);
    free(s->ex);
    memset(s, 0, sizeof *s);
}

/* text rendered from messages [0, n) of arr (generation prompt when gen) */
static lmx_status render(lmx_model *m, const cJSON *arr, int n, int gen, char **out) {
    lmx_message *msgs = calloc((size_t)(n ? n : 1), sizeof *msgs);
    if (!msgs) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (i == n) break;
        msgs[i].role = lmx_json_str(it, "role");
        msgs[i].content = lmx_json_str(it, "content");
        if (!msgs[i].role || !msgs[i].content) {
            free(msgs);
            return lmx_err_set(&m->err, LMX_ERR_FORMAT, "message %d has no string role or content", i);
        }
        i++;
    }
    lmx_status st = lmx_chat_render(m, msgs, n, gen, out);
    free(msgs);
    return st;
}

/* One line into ex (ids, and the prompt length that mask_prompt leaves out of the loss). */
static lmx_status example(lmx_model *m, const char *line, int mask_prompt, lmx_train_example *ex) {
    cJSON *o = cJSON_Parse(line);
    if (!o || !cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return lmx_err_set(&m->err, LMX_ERR_FORMAT, "not a JSON object");
    }
    const char *text = lmx_json_str(o, "text"), *prompt = lmx_json_str(o, "prompt"), *completion = lmx_json_str(o, "completion");
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    char *full = NULL, *head = NULL;
    lmx_status st = LMX_OK;
    if (cJSON_IsArray(msgs)) {
        const int n = cJSON_GetArraySize(msgs);
        if (n < 1) st = lmx_err_set(&m->err, LMX_ERR_FORMAT, "\"messages\" is empty");
        if (!st) st = render(m, msgs, n, 0, &full);
        if (!st && mask_prompt && n > 1) st = render(m, msgs, n - 1, 1, &head); /* train on the last turn */
    } else if (prompt && completion) {
        cJSON *arr = cJSON_CreateArray(), *u = cJSON_CreateObject(), *a = cJSON_CreateObject();
        cJSON_AddStringToObject(u, "role", "user"), cJSON_AddStringToObject(u, "content", prompt);
        cJSON_AddStringToObject(a, "role", "assistant"), cJSON_AddStringToObject(a, "content", completion);
        cJSON_AddItemToArray(arr, u), cJSON_AddItemToArray(arr, a);
        st = render(m, arr, 2, 0, &full);
        if (!st && mask_prompt) st = render(m, arr, 1, 1, &head);
        cJSON_Delete(arr);
    } else if (text) {
        if (!(full = strdup(text))) st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    } else {
        st = lmx_err_set(&m->err, LMX_ERR_FORMAT, "no \"text\", \"prompt\" and \"completion\", or \"messages\"");
    }
    cJSON_Delete(o);
    int32_t *ids = NULL, *hids = NULL;
    int n = 0, nh = 0;
    if (!st) st = lmx_runtime_encode(m, full, &ids, &n);
    if (!st && head) st = lmx_runtime_encode(m, head, &hids, &nh);
    /* mlx-lm ends a text with the tokenizer's EOS (else the model's) */
    int32_t eos = m->cfg.n_eos > 0 ? m->cfg.eos_ids[0] : -1;
    lmx_tokenizer *tok = text && !st ? lmx_runtime_tokenizer(m) : NULL;
    if (tok) {
        lmx_tok_info ti;
        lmx_tok_get_info(tok, &ti);
        if (ti.eos_id >= 0) eos = ti.eos_id;
    }
    if (!st && text && eos >= 0 && (n == 0 || ids[n - 1] != eos)) {
        int32_t *g = realloc(ids, (size_t)(n + 1) * sizeof *ids);
        if (!g) st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        else ids = g, ids[n++] = eos;
    }
    if (!st && n < 2) st = lmx_err_set(&m->err, LMX_ERR_FORMAT, "fewer than 2 tokens");
    /* the prompt's length masks the example's first tokens, as mlx-lm does (a template whose generation
     * prompt differs from its rendering of the assistant turn masks by length all the same) */
    if (!st && nh >= n - 1) st = lmx_err_set(&m->err, LMX_ERR_FORMAT, "nothing to train on after the prompt");
    free(full), free(head), free(hids);
    if (st) {
        free(ids);
        return st;
    }
    ex->ids = ids, ex->n = n, ex->n_prompt = nh;
    return LMX_OK;
}

lmx_status lmx_train_set_load(lmx_model *m, const char *path, int mask_prompt, int max_len, int skip_bad,
                              lmx_train_set *out, lmx_err *err) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return lmx_err_set(err, LMX_ERR_IO, "cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, cap_ex = 0;
    lmx_status st = LMX_OK;
    while (!st && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
        if (len == 0) continue;
        lmx_train_example ex;
        lmx_status e = example(m, line, mask_prompt, &ex);
        if (!e && max_len > 0 && ex.n > max_len) {
            free(ex.ids);
            e = lmx_err_set(&m->err, LMX_ERR_FORMAT, "%d tokens, over the maximum sequence length %d", ex.n, max_len);
        }
        if (e) {
            if (skip_bad && e != LMX_ERR_NOMEM) {
                out->skipped++;
                continue;
            }
            st = lmx_err_set(err, e, "%s:%d: %s", path, lineno, m->err.msg);
            break;
        }
        if (out->n == cap_ex) {
            cap_ex = cap_ex ? 2 * cap_ex : 64;
            lmx_train_example *g = realloc(out->ex, (size_t)cap_ex * sizeof *g);
            if (!g) {
                free(ex.ids);
                st = lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
                break;
            }
            out->ex = g;
        }
        out->ex[out->n++] = ex;
    }
    free(line);
    fclose(f);
    if (!st && out->n == 0) st = lmx_err_set(err, LMX_ERR_FORMAT, "%s: no examples", path);
    if (st) lmx_train_set_free(out);
    return st;
}
