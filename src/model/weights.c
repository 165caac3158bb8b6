/* weights.c - find each tensor of the architecture in the checkpoint, check its shape and dtype,
 * and hand it to the backend (zero-copy on the cpu).
 *
 * Text weights sit under "model." in plain checkpoints and under "language_model.model." or
 * "model.language_model." in multimodal ones; the first prefix whose embedding exists wins. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/half.h"
#include "../formats/ggml_types.h"
#include "model.h"

typedef struct binder {
    lmx_model *m;
    const char *prefix;          /* "model." etc. */
    const char *head_prefix;     /* where lm_head lives: "" or "language_model." */
    int host;                    /* 1: the tensor being bound goes to host memory (upload_weight_host) */
} binder;

/* t (pointing at the file's bytes) made usable by the backend's ops */
static lmx_status upload_weight(const binder *b, lmx_tensor *t) {
    lmx_backend *be = b->m->be;
    return (b->host ? be->ops->upload_weight_host : be->ops->upload_weight)(be, t);
}

static const lmx_st_tensor *lookup(const binder *b, const char *prefix, const char *name) {
    char full[512];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    return b->m->gguf.file ? lmx_gguf_weights_find(&b->m->gguf, full) : lmx_st_set_find(b->m->weights, full);
}

/* prefix+name into *st; absent: *st NULL and LMX_OK when optional, else the missing-tensor error. */
static lmx_status find(const binder *b, const char *prefix, const char *name, int optional, const lmx_st_tensor **st) {
    lmx_model *m = b->m;
    *st = lookup(b, prefix, name);
    if (*st || optional) return LMX_OK;
    char full[512], file_name[512];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    if (m->gguf.file && lmx_gguf_weights_file_name(&m->gguf, full, file_name, sizeof file_name))
        return lmx_err_set(&m->err, LMX_ERR_MISSING, "missing tensor %s (%s, %s model)", LMX_QUOTED(file_name),
                           LMX_QUOTED(full), m->cfg.model_type);
    return lmx_err_set(&m->err, LMX_ERR_MISSING, "missing tensor \"%s\" (%s model)", full, lmx_arch_name(m->cfg.arch));
}

static int is_float(lmx_dtype t) { return t == LMX_DTYPE_F32 || t == LMX_DTYPE_F16 || t == LMX_DTYPE_BF16; }

/* The GGUF block type of st (0: not block-quantized, or not a GGUF file). */
static int block_of(const binder *b, const lmx_st_tensor *st) {
    return b->m->gguf.file ? b->m->gguf.block_type[st - b->m->gguf.t] : 0;
}

/* An MLX affine-quantized weight: name ("....weight", U32 [d0, d1*bits/32]) plus ".scales" and
 * ".biases" [d0, d1/group] beside it.  Bits and group follow from the shapes. */
static lmx_status bind_quantized(binder *b, lmx_tensor *t, const char *prefix, const char *name,
                                 const lmx_st_tensor *st, int64_t d0, int64_t d1) {
    lmx_model *m = b->m;
    char base[400];
    size_t len = strlen(name);
    if (len < 7 || strcmp(name + len - 7, ".weight") != 0 || len - 7 >= sizeof base)
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "tensor %s in %s: u32 is not a weight dtype", LMX_QUOTED(st->name), st->file);
    memcpy(base, name, len - 7);
    base[len - 7] = 0;
    char sname[420], bname[420];
    snprintf(sname, sizeof sname, "%s.scales", base);
    snprintf(bname, sizeof bname, "%s.biases", base);
    const lmx_st_tensor *sc = lookup(b, prefix, sname), *bi = lookup(b, prefix, bname);
    if (!sc || !bi)
        return lmx_err_set(&m->err, LMX_ERR_MISSING, "quantized tensor %s in %s has no \"%s%s\"", LMX_QUOTED(st->name),
                           st->file, prefix, sc ? bname : sname);
    int64_t packed = st->ndim == 2 ? st->shape[1] : -1;
    int64_t groups = sc->ndim == 2 ? sc->shape[1] : -1;
    int bits = packed > 0 && (32 * packed) % d1 == 0 ? (int)(32 * packed / d1) : 0;
    int group = groups > 0 && d1 % groups == 0 ? (int)(d1 / groups) : 0;
    if (st->ndim != 2 || st->shape[0] != d0 || bits == 0)
        return lmx_err_set(&m->err, LMX_ERR_SHAPE, "quantized tensor %s in %s has shape [%lld, %lld], which packs no "
                           "whole bit width of [%lld, %lld]", LMX_QUOTED(st->name), st->file, (long long)st->shape[0],
                           (long long)packed, (long long)d0, (long long)d1);
    if (bits != 2 && bits != 4 && bits != 8)
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "quantized tensor %s: %d-bit weights are not supported "
                           "(2, 4, 8)", LMX_QUOTED(st->name), bits);
    if (sc->shape[0] != d0 || group == 0 || group % 8 || bi->ndim != 2 || bi->shape[0] != d0 ||
        bi->shape[1] != groups || sc->dtype != bi->dtype || !is_float(sc->dtype))
        return lmx_err_set(&m->err, LMX_ERR_SHAPE, "scales/biases of quantized tensor %s in %s do not match it",
                           LMX_QUOTED(st->name), st->file);
    memset(t, 0, sizeof *t);
    t->dtype = LMX_DTYPE_U32;
    t->ndim = 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = (void *)st->data;
    t->q = (lmx_quant){.bits = bits, .group = group, .scale_dtype = sc->dtype,
                       .scales = (void *)sc->data, .biases = (void *)bi->data};
    lmx_status s = upload_weight(b, t);
    if (s != LMX_OK) return lmx_err_set(&m->err, s, "%s", m->be->err.msg);
    m->n_params += d0 * d1;
    m->weight_bytes += (int64_t)(st->nbytes + sc->nbytes + bi->nbytes);
    if (!m->quantized) snprintf(m->dtype_name, sizeof m->dtype_name, "q%d", bits);
    m->quantized = 1;
    return LMX_OK;
}

/* st's shape as "[a, b, c]" into buf. */
static const char *shape_str(const lmx_st_tensor *st, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < st->ndim && i < 4 && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)st->shape[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
    return buf;
}

/* A GGUF block-quantized weight: logical [d0, d1] rows of lmx_ggml_row_bytes(type, d1) bytes; stacked
 * = E > 0: the 3-D [E, d0 / E, d1] of llama.cpp's experts, its rows one after another as well. */
static lmx_status bind_blocks(binder *b, lmx_tensor *t, const lmx_st_tensor *st, int type, int64_t d0,
                              int64_t d1, int stacked) {
    lmx_model *m = b->m;
    if (!lmx_ggml_is_supported_quant(type))
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "tensor %s in %s: GGUF type %s is not supported",
                           LMX_QUOTED(st->name), st->file, lmx_ggml_type_name(type));
    const int want_dims = stacked ? 3 : 2;
    const int64_t rows = stacked && st->ndim == 3 ? st->shape[0] * st->shape[1] : st->shape[0];
    if (d1 < 0 || st->ndim != want_dims || (stacked && st->shape[0] != stacked) || rows != d0 ||
        st->shape[want_dims - 1] != d1 || lmx_ggml_row_bytes(type, d1) * (size_t)d0 != st->nbytes) {
        char got[96], want[96];
        if (stacked) snprintf(want, sizeof want, "[%d, %lld, %lld]", stacked, (long long)(d0 / stacked), (long long)d1);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)d0, (long long)d1);
        return lmx_err_set(&m->err, LMX_ERR_SHAPE, "tensor %s in %s has shape %s (%s), expected %s", LMX_QUOTED(st->name),
                           st->file, shape_str(st, got, sizeof got), lmx_ggml_type_name(type), want);
    }
    memset(t, 0, sizeof *t);
    t->dtype = LMX_DTYPE_U8;
    t->ndim = 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = (void *)st->data;
    t->q.ggml_type = type;
    t->q.experts = stacked ? stacked : m->cfg.n_experts > 0 ? -1 : 0;
    lmx_status s = upload_weight(b, t);
    if (s != LMX_OK) return lmx_err_set(&m->err, s, "%s", m->be->err.msg);
    m->n_params += d0 * d1;
    m->weight_bytes += lmx_weight_bytes(t); /* as the backend holds it (cuda may rewrite GGUF blocks as MLX groups) */
    if (type >= 0 && type < 32) m->bytes_by_ggml_type[type] += (int64_t)st->nbytes;
    int main_type = type; /* name the model after the type holding most of its bytes */
    for (int i = 0; i < 32; i++)
        if (m->bytes_by_ggml_type[i] > m->bytes_by_ggml_type[main_type]) main_type = i;
    snprintf(m->dtype_name, sizeof m->dtype_name, "%s", lmx_ggml_type_name(main_type));
    m->quantized = 1;
    return LMX_OK;
}

/* Bind prefix+name with the expected shape (dims < 0 are not checked).  optional: absent is ok.
 * stacked = E > 0: a float tensor [E, d0 / E, d1] (gemma4's experts) binds as the matrix [d0, d1]. */
static lmx_status bind_as(binder *b, lmx_tensor *t, const char *prefix, const char *name, int optional, int64_t d0,
                          int64_t d1, int stacked) {
    lmx_model *m = b->m;
    const lmx_st_tensor *st;
    lmx_status fs = find(b, prefix, name, optional, &st);
    if (fs || !st) return fs;
    if (st->dtype == LMX_DTYPE_U32 && d1 >= 0) return bind_quantized(b, t, prefix, name, st, d0, d1);
    const int block = block_of(b, st);
    if (block) return bind_blocks(b, t, st, block, d0, d1, stacked);
    if (!is_float(st->dtype))
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "tensor %s in %s: dtype %s is not supported for weights",
                           LMX_QUOTED(st->name), st->file, lmx_dtype_name(st->dtype));
    int want_dims = d1 >= 0 ? 2 + (stacked != 0) : 1;
    int64_t rows = st->ndim == 3 ? st->shape[0] * st->shape[1] : st->shape[0];
    if (st->ndim != want_dims || (d0 >= 0 && rows != d0) || (d1 >= 0 && st->shape[st->ndim - 1] != d1) ||
        (stacked && st->shape[0] != stacked)) {
        char got[96];
        shape_str(st, got, sizeof got);
        if (stacked)
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "tensor %s in %s has shape %s, expected [%d, %lld, %lld]",
                               LMX_QUOTED(st->name), st->file, got, stacked, (long long)(d0 / stacked), (long long)d1);
        if (d1 >= 0)
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "tensor %s in %s has shape %s, expected [%lld, %lld]",
                               LMX_QUOTED(st->name), st->file, got, (long long)d0, (long long)d1);
        return lmx_err_set(&m->err, LMX_ERR_SHAPE, "tensor %s in %s has shape %s, expected [%lld]", LMX_QUOTED(st->name),
                           st->file, got, (long long)d0);
    }
    memset(t, 0, sizeof *t);
    t->dtype = st->dtype;
    t->ndim = want_dims > 1 ? 2 : 1;
    t->shape[0] = rows;
    if (t->ndim == 2) t->shape[1] = st->shape[st->ndim - 1];
    t->data = (void *)st->data;
    lmx_status s = upload_weight(b, t);
    if (s != LMX_OK) return lmx_err_set(&m->err, s, "%s", m->be->err.msg);
    m->n_params += st->n_elements;
    m->weight_bytes += (int64_t)st->nbytes;
    if (!m->quantized) snprintf(m->dtype_name, sizeof m->dtype_name, "%s", lmx_dtype_name(st->dtype));
    return LMX_OK;
}

static lmx_status bind(binder *b, lmx_tensor *t, const char *prefix, const char *name, int optional, int64_t d0,
                       int64_t d1) {
    return bind_as(b, t, prefix, name, optional, d0, d1, 0);
}

/* The token embeddings; in host memory where asked (m->embed_on_host), the backend can, and the table is
 * its own (untied): only the embed op reads it, a row a token. */
static lmx_status bind_embed(binder *b, int untied) {
    lmx_model *m = b->m;
    b->host = m->embed_on_host && untied && m->be->ops->upload_weight_host;
    lmx_status st = bind(b, &m->embed, b->prefix, "embed_tokens.weight", 0, m->cfg.vocab, m->cfg.hidden);
    b->host = 0;
    return st;
}

/* A small float tensor prefix+name of n values read on the host into out (router scales, layer
 * scalars); absent: out untouched when optional, else an error. */
static lmx_status read_host(binder *b, const char *prefix, const char *name, int optional, int64_t n, float *out) {
    lmx_model *m = b->m;
    const lmx_st_tensor *st;
    lmx_status fs = find(b, prefix, name, optional, &st);
    if (fs || !st) return fs;
    if (!is_float(st->dtype) || st->n_elements != n || st->ndim != 1 || block_of(b, st))
        return lmx_err_set(&m->err, LMX_ERR_SHAPE, "tensor %s in %s must hold %lld float values", LMX_QUOTED(st->name),
                           st->file, (long long)n);
    for (int64_t i = 0; i < n; i++) out[i] = lmx_float_at(st->data, st->dtype, i);
    m->n_params += n;
    m->weight_bytes += (int64_t)st->nbytes;
    return LMX_OK;
}

/* Stacked experts p+where+NAME: gate and up as one gate_up_proj [E, 2Fm, C] (gate rows, then up; into
 * L->gate_up_exps) or as gate_proj and up_proj [E, Fm, C] each, and down_proj [E, C, Fm] (into
 * L->down_exps); expert e's gate, up and down become row views of them (any dtype, GGUF blocks too).
 * fused: which form a missing pair is reported as. */
/* Whether a and b are stored in one format (dtype, and MLX or GGUF quantization). */
static int stored_alike(const lmx_tensor *a, const lmx_tensor *b) {
    return a->dtype == b->dtype && a->q.bits == b->q.bits && a->q.group == b->q.group &&
           a->q.scale_dtype == b->q.scale_dtype && a->q.ggml_type == b->q.ggml_type;
}

static lmx_status bind_stacked_experts(binder *b, lmx_layer *L, const char *p, const char *where, int fused) {
    const lmx_config *c = &b->m->cfg;
    const int64_t C = c->hidden, E = c->n_experts, Fm = c->moe_ffn;
    char gu[96], g[96], u[96], d[96];
    snprintf(gu, sizeof gu, "%sgate_up_proj", where);
    snprintf(g, sizeof g, "%sgate_proj", where);
    snprintf(u, sizeof u, "%sup_proj", where);
    snprintf(d, sizeof d, "%sdown_proj", where);
    lmx_tensor gate = {0}, up = {0}; /* split: [E*Fm, C] each */
    lmx_status st;
    if (lookup(b, p, gu) || (fused && !lookup(b, p, g))) {
        if ((st = bind_as(b, &L->gate_up_exps, p, gu, 0, E * 2 * Fm, C, (int)E))) return st;
    } else if ((st = bind_as(b, &gate, p, g, 0, E * Fm, C, (int)E)) || (st = bind_as(b, &up, p, u, 0, E * Fm, C, (int)E))) {
        return st;
    }
    if ((st = bind_as(b, &L->down_exps, p, d, 0, E * C, Fm, (int)E))) return st;
    /* expert e's gate and up: rows e*stride (+ off) of gate and up, or of the fused tensor (gate rows, then up) */
    const int fused_rows = L->gate_up_exps.data != NULL;
    const lmx_tensor *g_src = fused_rows ? &L->gate_up_exps : &gate, *u_src = fused_rows ? &L->gate_up_exps : &up;
    const int64_t stride = fused_rows ? 2 * Fm : Fm, off = fused_rows ? Fm : 0;
    for (int64_t e = 0; e < E; e++) {
        L->experts[3 * e] = lmx_tensor_rows(g_src, stride * e, Fm);                /* [Fm, C] */
        L->experts[3 * e + 1] = lmx_tensor_rows(u_src, stride * e + off, Fm);      /* [Fm, C] */
        L->experts[3 * e + 2] = lmx_tensor_rows(&L->down_exps, C * e, C);          /* [C, Fm] */
    }
    L->experts_alike = 1; /* views of the same stacked tensors */
    return LMX_OK;
}

/* gemma4's experts beside the MLP: the router (proj, the scale of its input's RMSNorm, per-expert
 * scales read to the host), the stacked experts (gate_up_proj [E, 2Fm, C], down_proj [E, C, Fm]) and
 * the three extra norms. */
static lmx_status bind_gemma4_experts(binder *b, lmx_layer *L, const char *p) {
    lmx_model *m = b->m;
    const lmx_config *c = &m->cfg;
    const int64_t C = c->hidden, E = c->n_experts;
    lmx_status st;
    if (!(L->expert_scale = malloc((size_t)E * sizeof *L->expert_scale)))
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int64_t e = 0; e < E; e++) L->expert_scale[e] = 1.0f;
    if ((st = bind(b, &L->router, p, "router.proj.weight", 0, E, C)) ||
        (st = bind(b, &L->router_norm, p, "router.scale", 0, C, -1)) ||
        (st = read_host(b, p, "router.per_expert_scale", 0, E, L->expert_scale)) ||
        (st = bind_stacked_experts(b, L, p, "experts.", 1)) ||
        (st = bind(b, &L->ffn_norm_2, p, "pre_feedforward_layernorm_2.weight", 0, C, -1)) ||
        (st = bind(b, &L->post_ffn_norm_1, p, "post_feedforward_layernorm_1.weight", 0, C, -1)) ||
        (st = bind(b, &L->post_ffn_norm_2, p, "post_feedforward_layernorm_2.weight", 0, C, -1)))
        return st;
    return LMX_OK;
}

static lmx_status bind_layer(binder *b, int i) {
    lmx_model *m = b->m;
    const lmx_config *c = &m->cfg;
    lmx_layer *L = &m->layers[i];
    int64_t C = c->hidden, D = L->head_dim, H = c->n_heads, Hk = L->n_kv_heads, F = L->ffn;
    char p[96];
    snprintf(p, sizeof p, "%slayers.%d.", b->prefix, i);
    int gemma = m->traits.gemma_norms;
    const int own_kv = L->kv_src == i;                              /* gemma4: shared layers have no k, v */
    const int own_v = own_kv && !(c->k_eq_v && !L->sliding);       /* gemma4's K = V: full layers' v is k */
    lmx_status st;
#define BIND(t, name, opt, d0, d1) \
    if ((st = bind(b, t, p, name, opt, d0, d1)) != LMX_OK) return st
    BIND(&L->attn_norm, "input_layernorm.weight", 0, C, -1);
    BIND(&L->wq, "self_attn.q_proj.weight", 0, H * D, C);
    if (own_kv) BIND(&L->wk, "self_attn.k_proj.weight", 0, Hk * D, C);
    if (own_v) BIND(&L->wv, "self_attn.v_proj.weight", 0, Hk * D, C);
    BIND(&L->wo, "self_attn.o_proj.weight", 0, C, H * D);
    int opt = !m->traits.qkv_bias;
    BIND(&L->bq, "self_attn.q_proj.bias", opt, H * D, -1);
    if (own_kv) BIND(&L->bk, "self_attn.k_proj.bias", opt, Hk * D, -1);
    if (own_v) BIND(&L->bv, "self_attn.v_proj.bias", opt, Hk * D, -1);
    BIND(&L->bo, "self_attn.o_proj.bias", 1, C, -1);
    if (m->traits.qk_norm) {
        BIND(&L->q_norm, "self_attn.q_norm.weight", 0, D, -1);
        if (own_kv) BIND(&L->k_norm, "self_attn.k_norm.weight", 0, D, -1);
    }
    if (gemma) {
        BIND(&L->post_attn_norm, "post_attention_layernorm.weight", 0, C, -1);
        BIND(&L->ffn_norm, "pre_feedforward_layernorm.weight", 0, C, -1);
        BIND(&L->post_ffn_norm, "post_feedforward_layernorm.weight", 0, C, -1);
    } else {
        BIND(&L->ffn_norm, "post_attention_layernorm.weight", 0, C, -1);
    }
    L->moe = c->layer_moe && c->layer_moe[i];
    if (L->moe && !(L->experts = calloc((size_t)(3 * c->n_experts), sizeof *L->experts)))
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    if (L->moe && c->moe_beside_mlp) {
        if ((st = bind_gemma4_experts(b, L, p))) return st;
    } else if (L->moe) { /* the router and each expert's gate / up / down, or stacked (GGUF's *_exps) */
        const int64_t E = c->n_experts, Fm = c->moe_ffn;
        BIND(&L->router, "mlp.gate.weight", 0, E, C);
        if (m->gguf.file || lookup(b, p, "mlp.experts.down_proj")) {
            if ((st = bind_stacked_experts(b, L, p, "mlp.experts.", 0))) return st;
        } else {
            for (int e = 0; e < E; e++) {
                char n[3][64];
                snprintf(n[0], sizeof n[0], "mlp.experts.%d.gate_proj.weight", e);
                snprintf(n[1], sizeof n[1], "mlp.experts.%d.up_proj.weight", e);
                snprintf(n[2], sizeof n[2], "mlp.experts.%d.down_proj.weight", e);
                BIND(&L->experts[3 * e], n[0], 0, Fm, C);
                BIND(&L->experts[3 * e + 1], n[1], 0, Fm, C);
                BIND(&L->experts[3 * e + 2], n[2], 0, C, Fm);
            }
            L->experts_alike = 1;
            for (int i = 3; i < 3 * E; i++) L->experts_alike &= stored_alike(&L->experts[i], &L->experts[i % 3]);
        }
    }
    if (!L->moe || c->moe_beside_mlp) {
        BIND(&L->w_gate, "mlp.gate_proj.weight", 0, F, C);
        BIND(&L->w_up, "mlp.up_proj.weight", 0, F, C);
        BIND(&L->w_down, "mlp.down_proj.weight", 0, C, F);
        BIND(&L->b_gate, "mlp.gate_proj.bias", 1, F, -1);
        BIND(&L->b_up, "mlp.up_proj.bias", 1, F, -1);
        BIND(&L->b_down, "mlp.down_proj.bias", 1, C, -1);
    }
    if (c->ple_dim > 0) { /* gemma4's per-layer input */
        BIND(&L->ple_gate, "per_layer_input_gate.weight", 0, c->ple_dim, C);
        BIND(&L->ple_proj, "per_layer_projection.weight", 0, C, c->ple_dim);
        BIND(&L->ple_norm, "post_per_layer_input_norm.weight", 0, C, -1);
    }
#undef BIND
    L->layer_scalar = 1.0f;
    if (m->traits.gemma4 && (st = read_host(b, p, "layer_scalar", 1, 1, &L->layer_scalar))) return st;
    L->rope.rot_dim = (int)D;
    L->rope.interleaved = m->interleaved_rope;
    L->rope.attn_factor = 1.0f;
    return LMX_OK;
}

/* Pick the prefix, settle the architecture and head_dim from the weights. */
static lmx_status find_layout(binder *b) {
    lmx_model *m = b->m;
    static const char *prefixes[][2] = {
        {"model.", ""}, {"language_model.model.", "language_model."}, {"model.language_model.", ""}};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++) {
        if (lookup(b, prefixes[i][0], "embed_tokens.weight")) {
            b->prefix = prefixes[i][0];
            b->head_prefix = prefixes[i][1];
            break;
        }
    }
    if (!b->prefix) return lmx_err_set(&m->err, LMX_ERR_MISSING, "missing tensor \"model.embed_tokens.weight\"");
    if (m->cfg.arch == LMX_ARCH_UNKNOWN) { /* no model_type: Qwen 3 has q_norm, Qwen 2 has q bias */
        if (lookup(b, b->prefix, "layers.0.self_attn.q_norm.weight")) m->cfg.arch = LMX_ARCH_QWEN3;
        else if (lookup(b, b->prefix, "layers.0.self_attn.q_proj.bias")) m->cfg.arch = LMX_ARCH_QWEN2;
        else return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED,
                                "config.json has no model_type and the weights match no known architecture");
    }
    m->head_dim = m->cfg.head_dim;
    if (m->head_dim == 0) {
        const lmx_st_tensor *q = lookup(b, b->prefix, "layers.0.self_attn.q_proj.weight");
        if (!q) return lmx_err_set(&m->err, LMX_ERR_MISSING, "missing tensor \"%slayers.0.self_attn.q_proj.weight\"",
                                   b->prefix);
        if (q->ndim != 2 || q->shape[0] % m->cfg.n_heads != 0)
            return lmx_err_set(&m->err, LMX_ERR_SHAPE, "cannot infer head_dim from q_proj of shape [%lld, ...]",
                               (long long)q->shape[0]);
        m->head_dim = (int)(q->shape[0] / m->cfg.n_heads);
    }
    if (m->head_dim <= 0 || m->head_dim % 2)
        return lmx_err_set(&m->err, LMX_ERR_FORMAT, "head_dim %d must be positive and even", m->head_dim);
    return LMX_OK;
}

/* Each layer's sizes (D, Hk, F), whose cache it attends over (gemma4's shared KV: the last earlier
 * non-shared layer of its type, as transformers' store_full_length_kv), the workspace widths, and each
 * layer's RoPE frequencies (inv_freq [n_layers, max D / 2]). */
static lmx_status plan_layers(lmx_model *m) {
    const lmx_config *c = &m->cfg;
    const int n = c->n_layers, first_shared = n - c->n_kv_shared;
    int max_d = 0;
    m->max_ffn = c->layer_moe && c->moe_ffn > c->ffn ? c->moe_ffn : c->ffn; /* an expert's too */
    for (int l = 0; l < n; l++) {
        lmx_layer *L = &m->layers[l];
        L->head_dim = c->layer_head_dim ? c->layer_head_dim[l] : m->head_dim;
        L->n_kv_heads = c->layer_kv_heads ? c->layer_kv_heads[l] : c->n_kv_heads;
        L->sliding = c->layer_sliding[l];
        L->kv_src = L->kv_last = l;
        L->kv_slot = -1;
        L->ffn = c->ffn * (c->double_wide_mlp && l >= first_shared && first_shared > 0 ? 2 : 1);
        if (L->head_dim > max_d) max_d = L->head_dim;
        if (L->ffn > m->max_ffn) m->max_ffn = L->ffn;
        if ((int64_t)c->n_heads * L->head_dim > m->q_width) m->q_width = (int64_t)c->n_heads * L->head_dim;
        if ((int64_t)L->n_kv_heads * L->head_dim > m->kv_width) m->kv_width = (int64_t)L->n_kv_heads * L->head_dim;
    }
    for (int l = first_shared; l < n; l++) { /* config.c checked that each has a source */
        lmx_layer *L = &m->layers[l], *S = NULL;
        for (int j = 0; j < first_shared; j++)
            if (m->layers[j].sliding == L->sliding) S = &m->layers[j], L->kv_src = j;
        if (!S) return lmx_err_set(&m->err, LMX_ERR_FORMAT, "layer %d has no layer to share keys and values with", l);
        if (S->head_dim != L->head_dim || S->n_kv_heads != L->n_kv_heads)
            return lmx_err_set(&m->err, LMX_ERR_FORMAT, "layer %d (%d kv heads of %d) shares the keys and values of "
                               "layer %d (%d kv heads of %d): their sizes must match", l, L->n_kv_heads, L->head_dim,
                               L->kv_src, S->n_kv_heads, S->head_dim);
        S->kv_last = l;
        S->kv_slot = L->kv_slot = L->sliding; /* one source per layer type */
    }
    const int half = max_d / 2;
    if (!(m->inv_freq = calloc((size_t)n * (size_t)(half ? half : 1), sizeof(float))))
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    for (int l = 0; l < n; l++) {
        lmx_layer *L = &m->layers[l];
        float *f = m->inv_freq + (size_t)l * half;
        lmx_rope_inv_freq(L->sliding ? &c->rope_local : &c->rope_global, L->head_dim, f);
        if (m->gguf.rope_freqs && !L->sliding) { /* GGUF llama 3: per-frequency divisors of the global RoPE */
            if (m->gguf.n_rope_freqs != L->head_dim / 2)
                return lmx_err_set(&m->err, LMX_ERR_SHAPE, "rope_freqs has %lld entries, expected %d",
                                   (long long)m->gguf.n_rope_freqs, L->head_dim / 2);
            for (int i = 0; i < L->head_dim / 2; i++) f[i] /= lmx_float_at(m->gguf.rope_freqs, LMX_DTYPE_F32, i);
        }
        L->rope.inv_freq = f;
    }
    if (m->traits.gemma4) { /* the weight of an RMSNorm without one: zeros, with add_one 1 */
        m->unit_norm = (lmx_tensor){.dtype = LMX_DTYPE_F32, .ndim = 1, .shape = {max_d}};
        if (m->be->ops->alloc(m->be, &m->unit_norm)) return lmx_err_set(&m->err, m->be->err.status, "%s", m->be->err.msg);
    }
    return LMX_OK;
}

int64_t lmx_model_kv_row(const lmx_model *m, int l) {
    const lmx_layer *L = &m->layers[l];
    return L->kv_src == l ? (int64_t)L->n_kv_heads * L->head_dim : 0;
}

lmx_status lmx_model_bind(lmx_model *m) {
    binder b = {m, NULL, NULL, 0};
    lmx_status st = find_layout(&b);
    if (st) return st;
    const lmx_config *c = &m->cfg;
    lmx_arch a = c->arch;
    m->traits.gemma_norms = a == LMX_ARCH_GEMMA2 || a == LMX_ARCH_GEMMA3 || a == LMX_ARCH_GEMMA4;
    m->traits.qk_norm = a == LMX_ARCH_QWEN3 || a == LMX_ARCH_GEMMA3 || a == LMX_ARCH_GEMMA4;
    m->traits.qkv_bias = a == LMX_ARCH_QWEN2;
    m->traits.gemma4 = a == LMX_ARCH_GEMMA4;
    m->norm_add_one = m->traits.gemma_norms && !m->traits.gemma4 && !m->norms_stored_plus_one ? 1.0f : 0.0f;
    m->embed_scale = m->traits.gemma_norms ? sqrtf((float)c->hidden) : 1.0f;
    double qs = c->query_pre_attn_scalar > 0 && m->traits.gemma_norms ? c->query_pre_attn_scalar : m->head_dim;
    m->attn_scale = m->traits.gemma4 ? 1.0f : (float)(1.0 / sqrt(qs)); /* gemma4: q and k are RMS-normed */

    if (!(m->layers = calloc((size_t)c->n_layers, sizeof *m->layers)))
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    if ((st = plan_layers(m))) return st;

    const int has_head = lookup(&b, b.head_prefix, "lm_head.weight") != NULL;
    if ((st = bind_embed(&b, c->tie_embeddings != 1 && has_head))) return st;
    if ((st = bind(&b, &m->final_norm, b.prefix, "norm.weight", 0, c->hidden, -1))) return st;
    if (c->ple_dim > 0) { /* gemma4's per-layer inputs: a token table and a projection of the embeddings */
        const int64_t LP = (int64_t)c->n_layers * c->ple_dim;
        if ((st = bind(&b, &m->embed_ple, b.prefix, "embed_tokens_per_layer.weight", 0, c->ple_vocab, LP)) ||
            (st = bind(&b, &m->ple_model_proj, b.prefix, "per_layer_model_projection.weight", 0, LP, c->hidden)) ||
            (st = bind(&b, &m->ple_proj_norm, b.prefix, "per_layer_projection_norm.weight", 0, c->ple_dim, -1)))
            return st;
    }
    for (int i = 0; i < c->n_layers; i++) {
        if ((st = bind_layer(&b, i))) return st;
        if (m->progress) m->progress((float)(i + 1) / (float)(c->n_layers + 1), m->progress_user);
    }
    if (c->tie_embeddings == 1 || !has_head) {
        if (c->tie_embeddings == 0)
            return lmx_err_set(&m->err, LMX_ERR_MISSING, "missing tensor \"%slm_head.weight\" (tie_word_embeddings is false)",
                               b.head_prefix);
        m->lm_head = m->embed;
    } else if ((st = bind(&b, &m->lm_head, b.head_prefix, "lm_head.weight", 0, c->vocab, c->hidden))) {
        return st;
    }
    if (m->progress) m->progress(1.0f, m->progress_user);
    return LMX_OK;
}
