/* test_unaligned.c - weights at any address (issue 14).  The safetensors format does not align its
 * tensors: a header of any length (the fixtures' own headers with trailing spaces added, still valid
 * JSON) moves every tensor of the file off its natural alignment.  Each check compares against the
 * same data aligned, bit for bit (the same kernels on the same values):
 *   - every kernel table this CPU runs: dense matmuls (f32, bf16, f16) and widenings with weight rows
 *     at byte offsets 1..3, the MLX-quantized dequantization and fused matvec with packed words,
 *     scales and biases each at an odd address;
 *   - whole models (MLX q4 and q8, dense bf16, dense f32 written here, a LoRA adapter) whose header
 *     has 1, 2 or 3 extra spaces: prefill (the many-row path) and decode (the matvec path) logits,
 *     with the auto-selected kernels and with LMX_CPU_ISA=scalar.
 * Under the sanitizer build a misaligned load is a UBSan error, so this fails there before the fix. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/quant.h"
#include "check.h"
#include "lmx.h"
#include "test_files.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static float frand(void) { return (float)(next_u32() % 20001) / 10000.0f - 1.0f; }

/* A copy of n bytes at (16-aligned address + off); free the returned base. */
static void *shifted_copy(const void *src, size_t n, int off, void **base) {
    *base = aligned_alloc(16, (n + 16 + 15) / 16 * 16);
    CHECK(*base != NULL);
    if (!*base) return NULL;
    memcpy((char *)*base + off, src, n);
    return (char *)*base + off;
}

/* ---- kernels ---------------------------------------------------------------------------------- */
static void test_dense_kernels(const lmx_cpu_kernels *k) {
    const int M = 3;
    const int64_t K = 37, N = 5; /* odd K: rows of a matrix are misaligned from each other too */
    float x[3 * 37], w32[5 * 37], ref[3 * 5], got[3 * 5], wide[5 * 37], wide_ref[5 * 37];
    uint16_t w16[5 * 37];
    for (int i = 0; i < M * K; i++) x[i] = frand();
    for (int i = 0; i < N * K; i++) {
        w32[i] = frand();
        w16[i] = lmx_f32_to_bf16(w32[i]);
    }
    for (int t = 0; t < 3; t++) {
        lmx_matmul_rows_fn fn = t == 0 ? k->matmul_f32 : t == 1 ? k->matmul_bf16 : k->matmul_f16;
        const void *w = t == 0 ? (const void *)w32 : (const void *)w16;
        size_t bytes = (size_t)(N * K) * (t == 0 ? 4 : 2);
        fn(x, K, M, K, w, 0, N, ref, N);
        for (int off = 1; off < 4; off++) {
            void *base;
            const void *ws = shifted_copy(w, bytes, off, &base);
            if (!ws) return;
            memset(got, 0, sizeof got);
            fn(x, K, M, K, ws, 0, N, got, N);
            CHECK_MSG(!memcmp(got, ref, sizeof ref), "%s matmul type %d at offset %d", k->isa, t, off);
            if (t) {
                void (*widen)(float *, const void *, int64_t) = t == 1 ? k->bf16_to_f32 : k->f16_to_f32;
                widen(wide_ref, w, N * K);
                widen(wide, ws, N * K);
                CHECK_MSG(!memcmp(wide, wide_ref, sizeof wide), "%s widen type %d at offset %d", k->isa, t, off);
            }
            free(base);
        }
    }
}

static void test_quant_kernels(const lmx_cpu_kernels *k) {
    const int64_t N = 3, K = 128;
    for (int bits = 2; bits <= 8; bits *= 2)
        for (int sd = 0; sd < 3; sd++) {
            const int group = 32, per = 32 / bits;
            const int64_t G = K / group, words = N * K / per;
            lmx_dtype sdt = sd == 0 ? LMX_DTYPE_BF16 : sd == 1 ? LMX_DTYPE_F16 : LMX_DTYPE_F32;
            size_t ssz = sdt == LMX_DTYPE_F32 ? 4 : 2;
            uint32_t packed[3 * 128 / 2];
            unsigned char scales[3 * 4 * 4], biases[3 * 4 * 4];
            for (int64_t i = 0; i < words; i++) packed[i] = next_u32();
            for (int64_t i = 0; i < N * G; i++) {
                float s = 0.01f + 0.05f * frand() * frand(), b = 0.1f * frand();
                if (sdt == LMX_DTYPE_F32) {
                    memcpy(scales + 4 * i, &s, 4);
                    memcpy(biases + 4 * i, &b, 4);
                } else {
                    uint16_t hs = sdt == LMX_DTYPE_BF16 ? lmx_f32_to_bf16(s) : lmx_f32_to_f16(s);
                    uint16_t hb = sdt == LMX_DTYPE_BF16 ? lmx_f32_to_bf16(b) : lmx_f32_to_f16(b);
                    memcpy(scales + 2 * i, &hs, 2);
                    memcpy(biases + 2 * i, &hb, 2);
                }
            }
            float x[128], xsum[4], ref_row[128], row[128], ref_y[3], y[3];
            for (int64_t i = 0; i < K; i++) x[i] = frand();
            lmx_quant_xsum(x, K, group, xsum);
            lmx_tensor w = {.dtype = LMX_DTYPE_U32, .ndim = 2, .shape = {N, K}, .data = packed,
                            .q = {.bits = bits, .group = group, .scale_dtype = sdt, .scales = scales, .biases = biases}};
            lmx_qmatvec_fn fns[2] = {lmx_qmatvec_scalar, strcmp(k->isa, "avx512") == 0 ? lmx_qmatvec_avx512() : NULL};
            for (int off = 1; off < 4; off++) {
                void *b0, *b1, *b2;
                lmx_tensor u = w;
                u.data = shifted_copy(packed, (size_t)words * 4, off, &b0);
                u.q.scales = shifted_copy(scales, (size_t)(N * G) * ssz, 4 - off, &b1);
                u.q.biases = shifted_copy(biases, (size_t)(N * G) * ssz, off, &b2);
                if (!u.data || !u.q.scales || !u.q.biases) return;
                for (int64_t n = 0; n < N; n++) {
                    lmx_dequant_row(&w, n, ref_row);
                    lmx_dequant_row(&u, n, row);
                    CHECK_MSG(!memcmp(row, ref_row, sizeof row), "dequant_row bits %d scales %s offset %d", bits,
                              lmx_dtype_name(sdt), off);
                }
                for (int f = 0; f < 2; f++) {
                    if (!fns[f]) continue;
                    fns[f](x, xsum, &w, 0, N, ref_y);
                    fns[f](x, xsum, &u, 0, N, y);
                    CHECK_MSG(!memcmp(y, ref_y, sizeof y), "qmatvec %d bits %d scales %s offset %d", f, bits,
                              lmx_dtype_name(sdt), off);
                }
                free(b0), free(b1), free(b2);
            }
        }
}

/* ---- whole models ----------------------------------------------------------------------------- */
/* Copy src to dst with `pad` spaces added to the JSON header (still a valid safetensors file). */
static void copy_padded(const char *src, const char *dst, int pad) {
    char *buf = NULL;
    size_t n = 0;
    lmx_err err = {0};
    CHECK_MSG(lmx_read_file(src, &buf, &n, &err) == LMX_OK, "%s", err.msg);
    if (!buf) return;
    uint64_t h = 0;
    if (n >= 8) memcpy(&h, buf, 8);
    CHECK(n >= 8 && h <= n - 8);
    char *out = malloc(n + (size_t)pad);
    uint64_t h2 = h + (uint64_t)pad;
    memcpy(out, &h2, 8);
    memcpy(out + 8, buf + 8, (size_t)h);
    memset(out + 8 + h, ' ', (size_t)pad);
    memcpy(out + 8 + h + pad, buf + 8 + h, n - 8 - (size_t)h);
    write_file(dst, out, n + (size_t)pad);
    free(out);
    free(buf);
}

/* Copy a model or adapter folder: safetensors files padded, every other file as is. */
static void copy_folder(const char *src, const char *dst, int pad) {
    DIR *d = opendir(src);
    CHECK_MSG(d != NULL, "cannot open %s", src);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.' || !strcmp(e->d_name, "reference.safetensors")) continue;
        char *s = lmx_path_join(src, e->d_name), *t = lmx_path_join(dst, e->d_name);
        size_t len = strlen(e->d_name);
        if (len > 12 && !strcmp(e->d_name + len - 12, ".safetensors")) {
            copy_padded(s, t, pad);
        } else if (lmx_is_file(s)) {
            char *buf = NULL;
            size_t n = 0;
            lmx_err err = {0};
            if (lmx_read_file(s, &buf, &n, &err) == LMX_OK) write_file(t, buf, n);
            free(buf);
        }
        free(s);
        free(t);
    }
    if (d) closedir(d);
}

/* A copy of the dense fixture with every tensor widened to f32 (header aligned by lmx_st_write). */
static void make_f32_model(const char *src, const char *dst) {
    lmx_err err = {0};
    char *st_path = lmx_path_join(src, "model.safetensors"), *out_path = lmx_path_join(dst, "model.safetensors");
    lmx_st_file *f = NULL;
    CHECK_MSG(lmx_st_open(st_path, &f, &err) == LMX_OK, "%s", err.msg);
    size_t n = f ? lmx_st_count(f) : 0;
    lmx_st_write_item *items = calloc(n + 1, sizeof *items);
    for (size_t i = 0; i < n; i++) {
        const lmx_st_tensor *t = lmx_st_at(f, i);
        float *v = malloc((size_t)(t->n_elements + 1) * 4);
        for (int64_t j = 0; j < t->n_elements; j++) v[j] = lmx_float_at(t->data, t->dtype, j);
        items[i] = (lmx_st_write_item){.name = t->name, .dtype = LMX_DTYPE_F32, .ndim = t->ndim, .data = v};
        memcpy(items[i].shape, t->shape, sizeof items[i].shape);
    }
    CHECK_MSG(lmx_st_write(out_path, items, n, &err) == LMX_OK, "%s", err.msg);
    for (size_t i = 0; i < n; i++) free((void *)items[i].data);
    free(items);
    lmx_st_close(f);
    char *cfg = lmx_path_join(src, "config.json"), *cfg_out = lmx_path_join(dst, "config.json"), *buf = NULL;
    size_t len = 0;
    if (lmx_read_file(cfg, &buf, &len, &err) == LMX_OK) write_file(cfg_out, buf, len);
    free(buf), free(cfg), free(cfg_out), free(st_path), free(out_path);
}

#define T_PROMPT 9 /* >= 8 rows: the prefill path (GEMM / BLAS over widened rows) */

/* Logits of a 9-token prefill then two decode steps ((T_PROMPT + 2) * V floats, malloc'ed), or NULL. */
static float *run_model(const char *dir, const char *adapter, int *V) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lp.n_threads = 2;
    lp.adapter = adapter;
    lmx_model *m = NULL;
    lmx_context *c = NULL;
    if (lmx_model_load(dir, &lp, &m) != LMX_OK) {
        CHECK_MSG(0, "load %s: %s", dir, lmx_last_error(NULL));
        return NULL;
    }
    lmx_model_info info;
    lmx_model_get_info(m, &info);
    *V = info.vocab_size;
    float *logits = calloc((size_t)(T_PROMPT + 2) * (size_t)*V, sizeof *logits);
    int32_t ids[T_PROMPT + 2];
    for (int i = 0; i < T_PROMPT + 2; i++) ids[i] = (int32_t)((7 + 13 * i) % *V);
    int ok = logits && lmx_context_create(m, NULL, &c) == LMX_OK &&
             lmx_context_eval(c, ids, T_PROMPT, logits, 1) == LMX_OK &&
             lmx_context_eval(c, ids + T_PROMPT, 1, logits + (size_t)T_PROMPT * *V, 0) == LMX_OK &&
             lmx_context_eval(c, ids + T_PROMPT + 1, 1, logits + (size_t)(T_PROMPT + 1) * *V, 0) == LMX_OK;
    CHECK_MSG(ok, "eval %s: %s", dir, lmx_last_error(m));
    lmx_context_free(c);
    lmx_model_free(m);
    if (!ok) free(logits);
    return ok ? logits : NULL;
}

/* model (a folder) with each padding against itself unpadded; adapter: a folder applied to both. */
static void check_model(const char *label, const char *model, const char *adapter) {
    static const char *const isas[] = {"", "scalar"};
    for (int i = 0; i < 2; i++) {
        setenv("LMX_CPU_ISA", isas[i], 1);
        int V = 0, V2 = 0;
        float *ref = run_model(model, adapter, &V);
        for (int pad = 1; pad <= 3 && ref; pad++) {
            char *dir = case_dir("unaligned");
            char *mdir = lmx_path_join(dir, "model"), *adir = adapter ? lmx_path_join(dir, "adapter") : NULL;
            CHECK(mkdir(mdir, 0755) == 0);
            copy_folder(model, mdir, pad);
            if (adir) {
                CHECK(mkdir(adir, 0755) == 0);
                copy_folder(adapter, adir, pad);
            }
            float *got = run_model(mdir, adir, &V2);
            CHECK_MSG(got && V2 == V && !memcmp(got, ref, (size_t)(T_PROMPT + 2) * (size_t)V * sizeof *got),
                      "%s with %d header spaces (isa \"%s\"): logits differ from the aligned file", label, pad,
                      isas[i]);
            free(got);
            free(mdir);
            free(adir);
            end_case(dir);
        }
        free(ref);
    }
    unsetenv("LMX_CPU_ISA");
}

int main(int argc, char **argv) {
    if (argc > 1) g_fixtures = argv[1];
    else if (getenv("LMX_FIXTURES")) g_fixtures = getenv("LMX_FIXTURES");

    static const char *const names[] = {"avx2", "avx512"};
    lmx_cpu_kernels k;
    lmx_cpu_kernels_init_scalar(&k);
    test_dense_kernels(&k);
    test_quant_kernels(&k);
    for (int i = 0; i < 2; i++) {
        lmx_cpu_kernels_init(&k, names[i]);
        if (strcmp(k.isa, names[i]) != 0) continue;
        test_dense_kernels(&k);
        test_quant_kernels(&k);
    }

    static const char *const models[] = {"qwen3_q4", "llama_q8", "qwen3"};
    for (int i = 0; i < 3; i++) {
        char *dir = fixture(models[i], NULL);
        check_model(models[i], dir, NULL);
        free(dir);
    }
    char *base = fixture("qwen3_q4", NULL), *adapter = fixture("qwen3_lora", "mlx_adapter");
    check_model("qwen3_q4 + mlx adapter", base, adapter);
    free(base);
    free(adapter);

    char *dense = fixture("qwen3", NULL), *dir = case_dir("unaligned_f32");
    make_f32_model(dense, dir);
    check_model("qwen3 widened to f32", dir, NULL);
    end_case(dir);
    free(dense);
    return check_summary("test_unaligned");
}
