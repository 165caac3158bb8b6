/* fuzz_adapter.c - a LoRA adapter folder (src/formats/lora_file.c): adapter_config.json of HF PEFT or
 * mlx-lm, and the adapter's safetensors file.
 * Input: adapter_config.json, optionally followed by a NUL byte and the weights file (written under
 * both names, adapter_model.safetensors and adapters.safetensors); without one, small valid weights
 * of both layouts are used.  An adapter that opens must have entries whose A and B agree on the rank,
 * and widen to f32 without reading outside its tensors. */
#include "fuzz.h"

#include "base/fileio.h"
#include "formats/lora_file.h"
#include "formats/safetensors.h"

static char *peft_w, *mlx_w;
static size_t peft_n, mlx_n;

/* Tensors written with lmx_st_write, read back as bytes. */
static char *make_weights(const lmx_st_write_item *items, size_t n, size_t *len) {
    const char *p = fz_path("init.safetensors");
    lmx_err err = {0};
    char *buf = NULL;
    if (lmx_st_write(p, items, n, &err) != LMX_OK || lmx_read_file(p, &buf, len, &err) != LMX_OK) {
        fprintf(stderr, "lmx fuzz: %s\n", err.msg);
        abort();
    }
    fz_remove("init.safetensors");
    return buf;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    static float w[64];
    for (int i = 0; i < 64; i++) w[i] = (float)(i % 7) * 0.25f - 0.5f;
    const lmx_st_write_item peft[] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", LMX_DTYPE_F32, 2, {4, 8}, w},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", LMX_DTYPE_F32, 2, {8, 4}, w},
        {"base_model.model.model.layers.1.mlp.down_proj.lora_A.weight", LMX_DTYPE_BF16, 2, {4, 16}, w},
        {"base_model.model.model.layers.1.mlp.down_proj.lora_B.weight", LMX_DTYPE_BF16, 2, {8, 4}, w},
    };
    const lmx_st_write_item mlx[] = {
        {"model.layers.0.self_attn.q_proj.lora_a", LMX_DTYPE_F32, 2, {8, 4}, w},
        {"model.layers.0.self_attn.q_proj.lora_b", LMX_DTYPE_F32, 2, {4, 8}, w},
        {"model.layers.1.mlp.down_proj.lora_a", LMX_DTYPE_F16, 2, {16, 4}, w},
        {"model.layers.1.mlp.down_proj.lora_b", LMX_DTYPE_F16, 2, {4, 8}, w},
    };
    peft_w = make_weights(peft, 4, &peft_n);
    mlx_w = make_weights(mlx, 4, &mlx_n);
    return 0;
}

static void widen(const lmx_lora_file *f) {
    for (int i = 0; i < f->n; i++) {
        const lmx_lora_entry *e = &f->e[i];
        FZ_ASSERT(e->a && e->b && e->a->ndim == 2 && e->b->ndim == 2 && e->rank > 0);
        int64_t r = e->rank, K = e->transposed ? e->a->shape[0] : e->a->shape[1];
        int64_t N = e->transposed ? e->b->shape[1] : e->b->shape[0];
        FZ_ASSERT(e->a->n_elements == r * K && e->b->n_elements == N * r);
        if (r * K > (1 << 20) || N * r > (1 << 20)) continue;
        float *A = malloc((size_t)(r * K + 1) * sizeof *A), *B = malloc((size_t)(N * r + 1) * sizeof *B);
        if (!A || !B) abort();
        lmx_err err = {0};
        fz_check_status("lmx_lora_widen", lmx_lora_widen(e, K, N, N % 4 == 0 ? 2 : 0, A, B, &err), err.msg);
        free(A);
        free(B);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *wts;
    size_t wn, n = fz_split(data, size, &wts, &wn);
    fz_write("adapter_config.json", data, n);
    fz_write("adapter_model.safetensors", wts ? (const char *)wts : peft_w, wts ? wn : peft_n);
    fz_write("adapters.safetensors", wts ? (const char *)wts : mlx_w, wts ? wn : mlx_n);
    static const char *const paths[] = {NULL, "adapters.safetensors"};
    for (int i = 0; i < 2; i++) {
        lmx_lora_file f;
        memset(&f, 0, sizeof f);
        lmx_err err = {0};
        lmx_status s = lmx_lora_file_open(paths[i] ? fz_path(paths[i]) : fz_dir(), &f, &err);
        fz_check_status("lmx_lora_file_open", s, err.msg);
        if (s != LMX_OK) continue;
        widen(&f);
        char family[32];
        (void)lmx_lora_arch_mismatch(&f, "llama", family, sizeof family);
        lmx_lora_file_close(&f);
    }
    return 0;
}
