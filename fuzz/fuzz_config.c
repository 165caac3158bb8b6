/* fuzz_config.c - a model's config.json (and generation_config.json beside it).
 * Input: config.json, optionally followed by a NUL byte and generation_config.json.  Parsed from
 * memory (lmx_config_parse) and loaded from a directory (lmx_config_load); a config that parses
 * must describe a usable shape (positive sizes, a sliding flag per layer). */
#include "fuzz.h"

#include "model/config.h"

static void check_config(const lmx_config *c) {
    FZ_ASSERT(c->n_layers > 0 && c->hidden > 0 && c->n_heads > 0 && c->n_kv_heads > 0);
    FZ_ASSERT(c->layer_sliding != NULL && c->n_eos >= 0 && c->n_eos <= LMX_MAX_EOS);
    for (int i = 0; i < c->n_layers; i++) FZ_ASSERT(c->layer_sliding[i] <= 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *gen;
    size_t gen_n, n = fz_split(data, size, &gen, &gen_n);
    char *json = fz_strndup(data, n);
    lmx_err err = {0};
    lmx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    lmx_status s = lmx_config_parse(json, "config.json", &cfg, &err);
    fz_check_status("lmx_config_parse", s, err.msg);
    if (s == LMX_OK) check_config(&cfg);
    lmx_config_free(&cfg);
    free(json);

    fz_write("config.json", data, n);
    if (gen) fz_write("generation_config.json", gen, gen_n);
    else fz_remove("generation_config.json");
    memset(&cfg, 0, sizeof cfg);
    s = lmx_config_load(fz_dir(), &cfg, &err);
    fz_check_status("lmx_config_load", s, err.msg);
    if (s == LMX_OK) check_config(&cfg);
    lmx_config_free(&cfg);
    return 0;
}
