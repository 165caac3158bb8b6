/* adapter.h - LoRA adapters bound to a model (the public lmx_adapter).
 *
 * An adapter keeps, for each (layer, projection) it modifies, one lmx_lora_pair in the model's
 * backend: A [r, K] and B [N, r] in f32 (K, N: the projection's in and out), and its scale.  The
 * forward pass gives each sequence's pair to the backend's lora op after the projection's matmul.
 * A model owns its adapters; contexts and requests refer to them by id, so a freed adapter is
 * noticed instead of read. */
#ifndef LMX_MODEL_ADAPTER_H
#define LMX_MODEL_ADAPTER_H

#include <stdio.h>

#include "../formats/lora_file.h"
#include "model.h"

/* What an adapter is: rank, alpha (scale alpha / rank, alpha / sqrt(rank) with rsLoRA), the projections
 * of targets (bit p: lmx_proj p) on the last num_layers layers (0: all), and for a new one the seed of
 * A's initialisation.  A loaded adapter's is read off its pairs (alpha = scale * rank). */
typedef struct lmx_lora_spec {
    int rank;
    double alpha;
    int use_rslora;
    unsigned targets;
    int num_layers;
    uint64_t seed;
    float dropout;               /* training: dropout on the pairs' inputs (PEFT's lora_dropout) */
} lmx_lora_spec;

struct lmx_adapter {
    lmx_model *m;
    unsigned id;                 /* > 0, unique on m */
    lmx_lora_pair *pairs;        /* [n_layers * LMX_PROJ_N]; a.data NULL where not adapted */
    lmx_adapter_info info;
    char *path;
    char targets[96];            /* "q_proj,v_proj" */
    lmx_lora_spec spec;
};

/* The pair of (layer, projection), or NULL when a does not adapt it. */
static inline const lmx_lora_pair *lmx_adapter_pair(const lmx_adapter *a, int layer, lmx_proj p) {
    const lmx_lora_pair *q = &a->pairs[layer * LMX_PROJ_N + p];
    return q->a.data ? q : NULL;
}

/* Projection p's weight of layer L ([N, K]: its outputs and inputs). */
const lmx_tensor *lmx_proj_weight(const lmx_layer *L, lmx_proj p);

/* Layer l of m has experts in place of its dense MLP (gate / up / down there are the experts'). */
static inline int lmx_layer_experts_only(const lmx_model *m, int l) {
    return m->layers[l].moe && !m->cfg.moe_beside_mlp;
}

/* HF PEFT's name of the A (is_b 0) or B matrix of (layer, p): "base_model.model.model.layers.N.<module>.lora_A.weight". */
static inline void lmx_lora_peft_name(char *name, size_t cap, int64_t layer, lmx_proj p, int is_b) {
    snprintf(name, cap, "base_model.model.model.layers.%lld.%s.lora_%c.weight", (long long)layer, lmx_proj_module(p),
             is_b ? 'B' : 'A');
}

/* A new adapter on m initialised as PEFT does (A ~ U(-1/sqrt(in), 1/sqrt(in)), B = 0), owned by m as
 * loaded ones are (adapter_new.c). */
lmx_status lmx_adapter_create(lmx_model *m, const lmx_lora_spec *spec, lmx_adapter **out);
/* Write a into dir in HF PEFT's layout (adapter_config.json, adapter_model.safetensors) or mlx-lm's
 * (adapter_config.json, adapters.safetensors: the last layers only), its config from a->spec.  GGUF
 * llama q/k rows go back to HF order. */
lmx_status lmx_adapter_write(const lmx_adapter *a, const char *dir, lmx_lora_format fmt, lmx_err *err);
/* "q,k,v,o,gate,up,down" (or q_proj, ...) as lmx_lora_spec targets bits; 0 for an unknown name. */
unsigned lmx_lora_targets_parse(const char *list);

/* Room in m->adapters for one more. */
lmx_status lmx_adapter_reserve(lmx_model *m);

/* The live adapter of m with this id; NULL for id 0 or a freed adapter. */
lmx_adapter *lmx_adapter_by_id(const lmx_model *m, unsigned id);
/* The adapter a request's choice stands for: NULL -> the model's default, LMX_NO_ADAPTER -> none
 * (*id = 0).  LMX_ERR_INVALID_ARG (message in m->err) when a belongs to another model. */
lmx_status lmx_adapter_resolve(lmx_model *m, lmx_adapter *a, unsigned *id);
/* Free every adapter of m (lmx_model_free). */
void lmx_adapters_free_all(lmx_model *m);

#endif
