/* fuzz_gguf.c - a GGUF file: header, metadata key/values, tensor infos, and what lmx reads from them
 * (the model config and renamed tensors, the tokenizer and the chat template in the metadata).
 * Input: the file's bytes.  On success every value must be readable through the typed getters and
 * every tensor must lie inside the file; a tokenizer that loads must encode and decode a text. */
#include <cjson/cJSON.h>

#include "fuzz.h"

#include "formats/gguf.h"
#include "model/gguf_model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

static volatile double fz_sink;

static void walk(const lmx_gguf *g, const uint8_t *data, size_t size) {
    for (size_t i = 0; i < lmx_gguf_kv_count(g); i++) {
        const lmx_gguf_kv *kv = lmx_gguf_kv_at(g, i);
        FZ_ASSERT(kv && kv->key && lmx_gguf_find_kv(g, kv->key));
        int64_t iv;
        double fv;
        fz_sink = lmx_gguf_get_int(g, kv->key, &iv) ? (double)iv : 0;
        fz_sink = lmx_gguf_get_float(g, kv->key, &fv) ? fv : 0;
        free(lmx_gguf_get_string(g, kv->key));
        if (kv->type == LMX_GGUF_ARRAY && kv->count) {
            fz_sink = lmx_gguf_array_float(kv, 0) + (double)lmx_gguf_array_int(kv, kv->count - 1);
            fz_sink = lmx_gguf_array_float(kv, kv->count); /* out of range: 0 */
        }
        if (kv->strs) /* strings point into the file */
            for (uint64_t k = 0; k < kv->count; k += 1 + kv->count / 8) {
                const uint8_t *p = (const uint8_t *)kv->strs[k].s;
                FZ_ASSERT(kv->strs[k].len <= size);
                if (kv->strs[k].len) fz_sink = p[0] + p[kv->strs[k].len - 1];
            }
    }
    for (size_t i = 0; i < lmx_gguf_tensor_count(g); i++) {
        const lmx_gguf_tensor *t = lmx_gguf_tensor_at(g, i);
        FZ_ASSERT(t && t->name && t->n_dims >= 1 && t->n_dims <= 4 && t->nbytes <= size);
        if (t->nbytes) fz_sink = ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->nbytes - 1];
    }
    (void)data;
}

static void use_tokenizer(const lmx_gguf *g) {
    lmx_tokenizer *tok = NULL;
    lmx_err err = {0};
    lmx_status s = lmx_tok_load_gguf(g, &tok, &err);
    fz_check_status("lmx_tok_load_gguf", s, err.msg);
    if (s != LMX_OK) return;
    static const char text[] = "Hello world! <s> \xc3\xa9t\xc3\xa9 123\n\t  x";
    int32_t *ids = NULL;
    size_t n = 0;
    s = lmx_tok_encode(tok, text, sizeof text - 1, 1, &ids, &n, &err);
    fz_check_status("lmx_tok_encode", s, err.msg);
    if (s == LMX_OK) {
        char *dec = NULL;
        size_t dl = 0;
        fz_check_status("lmx_tok_decode", lmx_tok_decode(tok, ids, n, 0, &dec, &dl, &err), err.msg);
        free(dec);
    }
    free(ids);
    lmx_tok_free(tok);
}

static void use_chat_template(const char *path) {
    lmx_chat_template *t = NULL;
    lmx_err err = {0};
    lmx_status s = lmx_chat_template_load(path, NULL, &t, &err);
    fz_check_status("lmx_chat_template_load", s, err.msg);
    if (s != LMX_OK) return;
    cJSON *msgs = cJSON_Parse("[{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Yo\"}]");
    char *out = NULL;
    fz_check_status("lmx_chat_template_render", lmx_chat_template_render(t, msgs, 1, NULL, NULL, &out, &err), err.msg);
    free(out);
    cJSON_Delete(msgs);
    lmx_chat_template_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fz_write("model.gguf", data, size);
    lmx_err err = {0};
    lmx_gguf *g = NULL;
    lmx_status s = lmx_gguf_open(path, &g, &err);
    fz_check_status("lmx_gguf_open", s, err.msg);
    if (s != LMX_OK) return 0;
    walk(g, data, size);
    use_tokenizer(g);
    lmx_gguf_close(g);

    lmx_config cfg;
    lmx_gguf_weights w;
    memset(&cfg, 0, sizeof cfg);
    memset(&w, 0, sizeof w);
    int interleaved = 0, plus_one = 0;
    s = lmx_gguf_model_open(path, &cfg, &w, &interleaved, &plus_one, &err);
    fz_check_status("lmx_gguf_model_open", s, err.msg);
    if (s == LMX_OK)
        for (size_t i = 0; i < w.n; i++) FZ_ASSERT(lmx_gguf_weights_find(&w, w.names[i]) != NULL);
    lmx_gguf_weights_free(&w);
    lmx_config_free(&cfg);
    use_chat_template(path);
    return 0;
}
