/* bench_decode.c - CPU decode benchmark: tokens per second and achieved memory bandwidth.
 *
 * 1. Writes a model directory with a realistic geometry (Qwen3-0.6B or Llama-3.2-1B) and random
 *    bf16 weights (xorshift, uniform with std ~0.02; norms 1.0), sharded with an index file so
 *    only one shard is in memory at a time.  A directory that already holds the same config is
 *    reused (config.json is written last, so its presence means the weights are complete).
 * 2. Measures the machine's memory bandwidth: memcpy of 1 GiB (read + write bytes counted) and a
 *    read-only summing loop over 1 GiB, best of 5, with one thread and with every online core.
 * 3. Loads the model, prefills a random prompt (once cold, i.e. first touch of the mapped
 *    weights, then again warm after a context reset), and decodes greedily one token at a time.
 *
 * Bytes per decoded token = every weight byte except the embedding table (one row is read) plus
 * the lm_head (the tied embedding read in full as the output head) plus the KV cache read at the
 * mean context (n_layers * 2 * ctx * kv_heads * head_dim * 4 bytes, float32 caches).
 *
 * usage: bench_decode [--arch qwen3|llama] [--dir DIR] [--tokens N] [--prompt N] [--threads N]
 *                     [--keep] [--json]
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/kernels.h"
#include "base/dtype.h"
#include "base/half.h"
#include "formats/safetensors.h"
#include "lmx.h"
#include "bench_util.h"

#define SEED 0x9e3779b97f4a7c15ull
#define SHARD_BYTES_MAX (512ll << 20) /* layers are grouped into shards of at most this size */
#define BW_BYTES (1ull << 30)
#define BW_REPS 5
#define MAX_SHARDS 64

/* ---- model geometry ------------------------------------------------------------------------ */

typedef struct arch_spec {
    const char *name;         /* --arch value */
    const char *model_type;
    const char *hf_class;
    const char *hf_name;      /* the model whose geometry this is */
    int n_layers, hidden, n_heads, n_kv_heads, head_dim, ffn, vocab, max_pos;
    int qk_norm;
    double rope_theta, eps;
    const char *rope_scaling; /* JSON text, "null" for none */
    int bos, eos;
} arch_spec;

static const arch_spec ARCHS[] = {
    {"qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 40960, 1,
     1000000.0, 1e-6, "null", 151643, 151645},
    {"llama", "llama", "LlamaForCausalLM", "Llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256, 131072, 0,
     500000.0, 1e-5,
     "{\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
     "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}",
     128000, 128001},
};

/* One weight tensor of a layer: name suffix and shape ([rows] when cols == 0). */
typedef struct tensor_def {
    const char *suffix;
    int64_t rows, cols;
    int is_norm;
} tensor_def;

static int layer_tensors(const arch_spec *a, tensor_def *out) {
    int64_t C = a->hidden, HD = (int64_t)a->n_heads * a->head_dim, KD = (int64_t)a->n_kv_heads * a->head_dim;
    int n = 0;
    out[n++] = (tensor_def){"input_layernorm.weight", C, 0, 1};
    out[n++] = (tensor_def){"self_attn.q_proj.weight", HD, C, 0};
    out[n++] = (tensor_def){"self_attn.k_proj.weight", KD, C, 0};
    out[n++] = (tensor_def){"self_attn.v_proj.weight", KD, C, 0};
    out[n++] = (tensor_def){"self_attn.o_proj.weight", C, HD, 0};
    if (a->qk_norm) {
        out[n++] = (tensor_def){"self_attn.q_norm.weight", a->head_dim, 0, 1};
        out[n++] = (tensor_def){"self_attn.k_norm.weight", a->head_dim, 0, 1};
    }
    out[n++] = (tensor_def){"post_attention_layernorm.weight", C, 0, 1};
    out[n++] = (tensor_def){"mlp.gate_proj.weight", a->ffn, C, 0};
    out[n++] = (tensor_def){"mlp.up_proj.weight", a->ffn, C, 0};
    out[n++] = (tensor_def){"mlp.down_proj.weight", C, a->ffn, 0};
    return n;
}

static int64_t def_elems(const tensor_def *d) { return d->cols ? d->rows * d->cols : d->rows; }

static int64_t layer_bytes(const arch_spec *a) {
    tensor_def defs[16];
    int n = layer_tensors(a, defs);
    int64_t b = 0;
    for (int i = 0; i < n; i++) b += def_elems(&defs[i]) * 2;
    return b;
}

/* ---- small helpers ------------------------------------------------------------------------- */

static char *path_join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Whole file into a NUL-terminated malloc'ed buffer; NULL if absent or unreadable. */
static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0) break;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[len] = 0;
    return buf;
}

static int write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "bench_decode: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "bench_decode: cannot write %s: %s\n", path, strerror(errno));
    return ok ? 0 : -1;
}

/* A growable string for JSON text. */
typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

#if defined(__GNUC__)
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#endif
static void sb_printf(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* ---- the model directory ------------------------------------------------------------------- */

typedef struct shard_plan {
    int n_shards;
    int first_layer[MAX_SHARDS]; /* shard 0 holds the embedding and final norm: first_layer -1 */
    int n_layers[MAX_SHARDS];
} shard_plan;

static void plan_shards(const arch_spec *a, shard_plan *p) {
    int64_t lb = layer_bytes(a);
    int per = (int)(SHARD_BYTES_MAX / lb);
    if (per < 1) per = 1;
    p->n_shards = 1;
    p->first_layer[0] = -1;
    p->n_layers[0] = 0;
    for (int l = 0; l < a->n_layers && p->n_shards < MAX_SHARDS; l += per) {
        p->first_layer[p->n_shards] = l;
        p->n_layers[p->n_shards] = a->n_layers - l < per ? a->n_layers - l : per;
        p->n_shards++;
    }
}

static void shard_name(char *out, size_t n, int i, int total) {
    snprintf(out, n, "model-%05d-of-%05d.safetensors", i + 1, total);
}

static char *make_config(const arch_spec *a) {
    sbuf b = {0};
    sb_printf(&b,
              "{\n"
              "  \"architectures\": [\"%s\"],\n"
              "  \"model_type\": \"%s\",\n"
              "  \"hidden_size\": %d,\n"
              "  \"intermediate_size\": %d,\n"
              "  \"num_hidden_layers\": %d,\n"
              "  \"num_attention_heads\": %d,\n"
              "  \"num_key_value_heads\": %d,\n"
              "  \"head_dim\": %d,\n"
              "  \"vocab_size\": %d,\n"
              "  \"max_position_embeddings\": %d,\n"
              "  \"rms_norm_eps\": %g,\n"
              "  \"rope_theta\": %.1f,\n"
              "  \"rope_scaling\": %s,\n"
              "  \"hidden_act\": \"silu\",\n"
              "  \"attention_bias\": false,\n"
              "  \"tie_word_embeddings\": true,\n"
              "  \"torch_dtype\": \"bfloat16\",\n"
              "  \"bos_token_id\": %d,\n"
              "  \"eos_token_id\": %d,\n"
              "  \"lmx_bench\": {\"geometry\": \"%s\", \"weights\": \"random bf16, xorshift64 seed %llu\"}\n"
              "}\n",
              a->hf_class, a->model_type, a->hidden, a->ffn, a->n_layers, a->n_heads, a->n_kv_heads,
              a->head_dim, a->vocab, a->max_pos, a->eps, a->rope_theta, a->rope_scaling, a->bos, a->eos,
              a->hf_name, (unsigned long long)SEED);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* 65536 bf16 values evenly spread over [-amp, amp]: 16 random bits pick one. */
static void make_value_table(uint16_t *table) {
    const double amp = 0.02 * sqrt(3.0); /* uniform with standard deviation 0.02 */
    for (int i = 0; i < 65536; i++)
        table[i] = lmx_f32_to_bf16((float)(((i + 0.5) / 65536.0 * 2.0 - 1.0) * amp));
}

static void fill_random(uint16_t *dst, int64_t n, const uint16_t *table, uint64_t *rng) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint64_t r = bench_xorshift64(rng);
        dst[i] = table[r & 0xffff];
        dst[i + 1] = table[(r >> 16) & 0xffff];
        dst[i + 2] = table[(r >> 32) & 0xffff];
        dst[i + 3] = table[r >> 48];
    }
    for (; i < n; i++) dst[i] = table[bench_xorshift64(rng) & 0xffff];
}

typedef struct pending_tensor {
    char name[128];
    tensor_def def;
} pending_tensor;

/* Write one shard: generate every tensor, write, free. */
static int write_shard(const char *path, const pending_tensor *ts, int n, const uint16_t *table,
                       uint64_t *rng) {
    lmx_st_write_item *items = calloc((size_t)n, sizeof *items);
    uint16_t **bufs = calloc((size_t)n, sizeof *bufs);
    int rc = -1;
    if (!items || !bufs) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        const tensor_def *d = &ts[i].def;
        int64_t ne = def_elems(d);
        bufs[i] = malloc((size_t)ne * 2);
        if (!bufs[i]) {
            fprintf(stderr, "bench_decode: out of memory for %s (%lld bytes)\n", ts[i].name, (long long)ne * 2);
            goto done;
        }
        if (d->is_norm)
            for (int64_t k = 0; k < ne; k++) bufs[i][k] = 0x3f80; /* bf16 1.0 */
        else
            fill_random(bufs[i], ne, table, rng);
        items[i].name = ts[i].name;
        items[i].dtype = LMX_DTYPE_BF16;
        items[i].ndim = d->cols ? 2 : 1;
        items[i].shape[0] = d->rows;
        items[i].shape[1] = d->cols;
        items[i].data = bufs[i];
    }
    lmx_err err = {0};
    if (lmx_st_write(path, items, (size_t)n, &err) != LMX_OK) {
        fprintf(stderr, "bench_decode: %s\n", err.msg);
        goto done;
    }
    rc = 0;
done:
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(items);
    return rc;
}

/* Tensors of shard s (names and shapes). Returns the count, or -1 on allocation failure. */
static int shard_tensors(const arch_spec *a, const shard_plan *p, int s, pending_tensor **out) {
    tensor_def defs[16];
    int per_layer = layer_tensors(a, defs);
    int n = s == 0 ? 2 : p->n_layers[s] * per_layer;
    pending_tensor *ts = calloc((size_t)n, sizeof *ts);
    if (!ts) return -1;
    if (s == 0) {
        snprintf(ts[0].name, sizeof ts[0].name, "model.embed_tokens.weight");
        ts[0].def = (tensor_def){"", a->vocab, a->hidden, 0};
        snprintf(ts[1].name, sizeof ts[1].name, "model.norm.weight");
        ts[1].def = (tensor_def){"", a->hidden, 0, 1};
    } else {
        int k = 0;
        for (int l = p->first_layer[s]; l < p->first_layer[s] + p->n_layers[s]; l++)
            for (int i = 0; i < per_layer; i++, k++) {
                snprintf(ts[k].name, sizeof ts[k].name, "model.layers.%d.%s", l, defs[i].suffix);
                ts[k].def = defs[i];
            }
    }
    *out = ts;
    return n;
}

/* Remove the files this benchmark writes in dir (nothing else). */
static void remove_model_files(const char *dir, const arch_spec *a) {
    shard_plan p;
    plan_shards(a, &p);
    char name[64];
    for (int s = 0; s < p.n_shards; s++) {
        shard_name(name, sizeof name, s, p.n_shards);
        char *f = path_join(dir, name);
        if (f) unlink(f);
        free(f);
    }
    const char *fixed[] = {"config.json", "model.safetensors.index.json"};
    for (size_t i = 0; i < 2; i++) {
        char *f = path_join(dir, fixed[i]);
        if (f) unlink(f);
        free(f);
    }
}

/* Make sure dir holds the model: reuse it when config.json matches, else write it.
 * *reused is set to 1 when nothing had to be written. */
static int ensure_model(const char *dir, const arch_spec *a, int *reused, double *write_s) {
    *reused = 0;
    *write_s = 0;
    char *cfg = make_config(a);
    char *cfg_path = path_join(dir, "config.json");
    char *idx_path = path_join(dir, "model.safetensors.index.json");
    int rc = -1;
    if (!cfg || !cfg_path || !idx_path) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto done;
    }
    shard_plan p;
    plan_shards(a, &p);
    char *old = slurp(cfg_path);
    int same = old && strcmp(old, cfg) == 0;
    free(old);
    if (same) {
        int all = access(idx_path, R_OK) == 0;
        for (int s = 0; all && s < p.n_shards; s++) {
            char name[64];
            shard_name(name, sizeof name, s, p.n_shards);
            char *f = path_join(dir, name);
            all = f && access(f, R_OK) == 0;
            free(f);
        }
        if (all) {
            *reused = 1;
            rc = 0;
            goto done;
        }
    }
    unlink(cfg_path); /* written last: absent until the weights are complete */

    double t0 = bench_now_s();
    uint16_t *table = malloc(65536 * sizeof *table);
    if (!table) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto done;
    }
    make_value_table(table);
    uint64_t rng = SEED;
    sbuf idx = {0};
    int64_t total = 0;
    sb_printf(&idx, "{\n  \"metadata\": {\"total_size\": @TOTAL@},\n  \"weight_map\": {");
    int first = 1, ok = 1;
    for (int s = 0; s < p.n_shards && ok; s++) {
        char name[64];
        shard_name(name, sizeof name, s, p.n_shards);
        pending_tensor *ts = NULL;
        int n = shard_tensors(a, &p, s, &ts);
        char *f = path_join(dir, name);
        if (n < 0 || !f) {
            fprintf(stderr, "bench_decode: out of memory\n");
            ok = 0;
        } else {
            fprintf(stderr, "bench_decode: writing %s (%d tensors)\n", f, n);
            if (write_shard(f, ts, n, table, &rng) != 0) ok = 0;
            for (int i = 0; ok && i < n; i++) {
                sb_printf(&idx, "%s\n    \"%s\": \"%s\"", first ? "" : ",", ts[i].name, name);
                total += def_elems(&ts[i].def) * 2;
                first = 0;
            }
        }
        free(f);
        free(ts);
    }
    free(table);
    sb_printf(&idx, "\n  }\n}\n");
    if (ok && idx.oom) {
        fprintf(stderr, "bench_decode: out of memory\n");
        ok = 0;
    }
    if (ok) {
        /* fill in the total size now that it is known */
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)total);
        char *at = strstr(idx.p, "@TOTAL@");
        sbuf fin = {0};
        sb_printf(&fin, "%.*s%s%s", (int)(at - idx.p), idx.p, num, at + strlen("@TOTAL@"));
        ok = !fin.oom && write_text(idx_path, fin.p) == 0 && write_text(cfg_path, cfg) == 0;
        free(fin.p);
    }
    free(idx.p);
    *write_s = bench_now_s() - t0;
    rc = ok ? 0 : -1;
done:
    free(cfg);
    free(cfg_path);
    free(idx_path);
    return rc;
}

/* ---- memory bandwidth ---------------------------------------------------------------------- */

typedef struct bw_job {
    char *dst;
    const char *src;
    size_t n;
    uint64_t sum;
    int copy;
} bw_job;

static void *bw_worker(void *arg) {
    bw_job *j = arg;
    if (j->copy) {
        memcpy(j->dst, j->src, j->n);
    } else {
        const uint64_t *p = (const uint64_t *)j->src;
        size_t n = j->n / 8;
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
            s0 += p[i];
            s1 += p[i + 1];
            s2 += p[i + 2];
            s3 += p[i + 3];
            s4 += p[i + 4];
            s5 += p[i + 5];
            s6 += p[i + 6];
            s7 += p[i + 7];
        }
        for (; i < n; i++) s0 += p[i];
        j->sum = s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    }
    return NULL;
}

/* Best-of-BW_REPS GB/s of a copy (bytes counted: read + write) or a read over n bytes. */
static double bw_measure(char *dst, const char *src, size_t n, int threads, int copy) {
    static volatile uint64_t sink;
    bw_job jobs[64];
    pthread_t tid[64];
    if (threads > 64) threads = 64;
    if (threads < 1) threads = 1;
    double best = 0;
    for (int r = 0; r < BW_REPS; r++) {
        size_t per = n / (size_t)threads / 64 * 64;
        double t0 = bench_now_s();
        int started = 0;
        for (int t = 0; t < threads; t++) {
            size_t off = per * (size_t)t;
            jobs[t] = (bw_job){.dst = dst + off, .src = src + off,
                               .n = t == threads - 1 ? n - off : per, .copy = copy};
            if (t == 0) continue;
            if (pthread_create(&tid[t], NULL, bw_worker, &jobs[t]) != 0) break;
            started = t;
        }
        bw_worker(&jobs[0]);
        for (int t = 1; t <= started; t++) pthread_join(tid[t], NULL);
        for (int t = started + 1; t < threads; t++) bw_worker(&jobs[t]); /* threads that failed to start */
        double dt = bench_now_s() - t0;
        for (int t = 0; t < threads; t++) sink += jobs[t].sum;
        double gbs = (double)n * (copy ? 2.0 : 1.0) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    return best;
}

typedef struct bw_result {
    double copy1, copyN, read1, readN;
    int threads;
} bw_result;

static int measure_bandwidth(bw_result *r) {
    r->threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (r->threads < 1) r->threads = 1;
    char *a = malloc(BW_BYTES), *b = malloc(BW_BYTES);
    if (!a || !b) {
        free(a);
        free(b);
        fprintf(stderr, "bench_decode: cannot allocate 2 GiB for the bandwidth test\n");
        return -1;
    }
    memset(a, 1, BW_BYTES); /* fault every page in before timing */
    memset(b, 2, BW_BYTES);
    r->copy1 = bw_measure(b, a, BW_BYTES, 1, 1);
    r->copyN = bw_measure(b, a, BW_BYTES, r->threads, 1);
    r->read1 = bw_measure(NULL, a, BW_BYTES, 1, 0);
    r->readN = bw_measure(NULL, a, BW_BYTES, r->threads, 0);
    free(a);
    free(b);
    return 0;
}

/* ---- misc reporting ------------------------------------------------------------------------ */

static void cpu_model_name(char *out, size_t n) {
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (!c) continue;
            c++;
            while (*c == ' ' || *c == '\t') c++;
            c[strcspn(c, "\n")] = 0;
            snprintf(out, n, "%s", c);
            break;
        }
    }
    fclose(f);
}

/* The 1-minute load average (other work on the machine skews every number). */
static double load_average(void) {
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1) l = -1;
        fclose(f);
    }
    return l;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int32_t argmax(const float *v, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: bench_decode [--arch qwen3|llama] [--dir DIR] [--tokens N] [--prompt N]\n"
            "                    [--threads N] [--keep] [--json]\n\n"
            "  --arch     geometry: qwen3 (Qwen3-0.6B, default) or llama (Llama-3.2-1B)\n"
            "  --dir      model directory; reused when it holds the same config, kept at the end\n"
            "             (default: a fresh mkdtemp under /tmp, deleted at the end unless --keep)\n"
            "  --tokens   tokens to decode (default 64)\n"
            "  --prompt   prompt tokens to prefill (default 128)\n"
            "  --threads  engine threads (default 0: one per online core)\n"
            "  --keep     keep the temporary model directory\n"
            "  --json     also print one JSON object line with every number\n"
            "The environment variable LMX_CPU_ISA=scalar|avx2|avx512 forces the kernels.\n");
}

static int parse_int_arg(const char *opt, const char *s, int min, int *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < min || v > 1000000) {
        fprintf(stderr, "bench_decode: %s needs an integer >= %d (got \"%s\")\n", opt, min, s ? s : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* ---- main ---------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    const char *arch_name = "qwen3", *dir_arg = NULL;
    int n_tokens = 64, n_prompt = 128, n_threads = 0, keep = 0, json = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--arch") && v) {
            arch_name = v;
            i++;
        } else if (!strcmp(o, "--dir") && v) {
            dir_arg = v;
            i++;
        } else if (!strcmp(o, "--tokens")) {
            if (parse_int_arg(o, v, 1, &n_tokens)) return 2;
            i++;
        } else if (!strcmp(o, "--prompt")) {
            if (parse_int_arg(o, v, 1, &n_prompt)) return 2;
            i++;
        } else if (!strcmp(o, "--threads")) {
            if (parse_int_arg(o, v, 0, &n_threads)) return 2;
            i++;
        } else if (!strcmp(o, "--keep")) {
            keep = 1;
        } else if (!strcmp(o, "--json")) {
            json = 1;
        } else {
            fprintf(stderr, "bench_decode: unknown or incomplete option \"%s\"\n", o);
            usage(stderr);
            return 2;
        }
    }
    const arch_spec *a = NULL;
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if (!strcmp(arch_name, ARCHS[i].name)) a = &ARCHS[i];
    if (!a) {
        fprintf(stderr, "bench_decode: unknown --arch \"%s\" (qwen3, llama)\n", arch_name);
        return 2;
    }

    /* the model directory */
    char tmpl[] = "/tmp/lmx_bench_XXXXXX";
    const char *dir = dir_arg;
    int temp_dir = 0;
    if (!dir) {
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "bench_decode: mkdtemp %s: %s\n", tmpl, strerror(errno));
            return 1;
        }
        dir = tmpl;
        temp_dir = 1;
    } else if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "bench_decode: cannot create %s: %s\n", dir, strerror(errno));
        return 1;
    }

    int rc = 1;
    lmx_model *m = NULL;
    lmx_context *ctx = NULL;
    float *logits = NULL;
    int32_t *prompt = NULL;
    double *lat = NULL;

    double load_before = load_average();
    int reused = 0;
    double write_s = 0;
    if (ensure_model(dir, a, &reused, &write_s) != 0) goto cleanup;

    bw_result bw;
    if (measure_bandwidth(&bw) != 0) goto cleanup;

    lmx_cpu_kernels kern;
    lmx_cpu_kernels_init(&kern, getenv("LMX_CPU_ISA"));

    /* load */
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lp.n_threads = n_threads;
    double t0 = bench_now_s();
    if (lmx_model_load(dir, &lp, &m) != LMX_OK) {
        fprintf(stderr, "bench_decode: load %s: %s\n", dir, lmx_last_error(NULL));
        goto cleanup;
    }
    double load_s = bench_now_s() - t0;
    lmx_model_info info;
    if (lmx_model_get_info(m, &info) != LMX_OK) {
        fprintf(stderr, "bench_decode: lmx_model_get_info failed\n");
        goto cleanup;
    }
    if (lmx_context_create(m, NULL, &ctx) != LMX_OK) {
        fprintf(stderr, "bench_decode: context: %s\n", lmx_last_error(m));
        goto cleanup;
    }
    int V = info.vocab_size;
    logits = malloc((size_t)V * sizeof *logits);
    prompt = malloc((size_t)n_prompt * sizeof *prompt);
    lat = malloc((size_t)n_tokens * sizeof *lat);
    if (!logits || !prompt || !lat) {
        fprintf(stderr, "bench_decode: out of memory\n");
        goto cleanup;
    }
    uint64_t rng = 0x2545f4914f6cdd1dull;
    for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)(bench_xorshift64(&rng) % (uint64_t)V);

    /* prefill: cold (first touch of the mapped weights), then warm after a reset */
    t0 = bench_now_s();
    if (lmx_context_eval(ctx, prompt, n_prompt, logits, 0) != LMX_OK) {
        fprintf(stderr, "bench_decode: prefill: %s\n", lmx_last_error(m));
        goto cleanup;
    }
    double prefill_cold_s = bench_now_s() - t0;
    lmx_context_reset(ctx);
    t0 = bench_now_s();
    if (lmx_context_eval(ctx, prompt, n_prompt, logits, 0) != LMX_OK) {
        fprintf(stderr, "bench_decode: prefill: %s\n", lmx_last_error(m));
        goto cleanup;
    }
    double prefill_s = bench_now_s() - t0;

    /* decode greedily, one token per call */
    int32_t tok = argmax(logits, V);
    double decode_total = 0;
    for (int i = 0; i < n_tokens; i++) {
        t0 = bench_now_s();
        if (lmx_context_eval(ctx, &tok, 1, logits, 0) != LMX_OK) {
            fprintf(stderr, "bench_decode: decode step %d: %s\n", i, lmx_last_error(m));
            goto cleanup;
        }
        lat[i] = bench_now_s() - t0;
        decode_total += lat[i];
        tok = argmax(logits, V);
    }
    int finite = 1;
    for (int i = 0; i < V; i++)
        if (!isfinite(logits[i])) finite = 0;
    qsort(lat, (size_t)n_tokens, sizeof *lat, cmp_double);
    double mean_s = decode_total / n_tokens;
    double med_s = n_tokens % 2 ? lat[n_tokens / 2] : 0.5 * (lat[n_tokens / 2 - 1] + lat[n_tokens / 2]);
    double min_s = lat[0];

    /* bytes per decoded token */
    int64_t emb_bytes = (int64_t)info.vocab_size * info.hidden_size * 2;
    int64_t weight_tok = info.weight_bytes - emb_bytes + (int64_t)info.hidden_size * 2 /* one row */
                         + emb_bytes /* lm_head (tied: the embedding read in full) */;
    double ctx_mean = n_prompt + (n_tokens + 1) / 2.0;
    double kv_tok = (double)info.n_layers * 2.0 * ctx_mean * info.n_kv_heads * info.head_dim * 4.0;
    double bytes_tok = (double)weight_tok + kv_tok;
    double ach_gbs = bytes_tok / mean_s / 1e9;
    double ach_med_gbs = bytes_tok / med_s / 1e9;
    char cpu[256];
    cpu_model_name(cpu, sizeof cpu);
    int engine_threads = n_threads > 0 ? n_threads : bw.threads;

    printf("lmx %s decode benchmark: %s geometry (%s), random bf16 weights\n", LMX_VERSION, a->hf_name,
           info.architecture);
    printf("  %-30s %s\n", "model dir", dir);
    printf("  %-30s %s\n", "model files", reused ? "reused" : "written");
    if (!reused) printf("  %-30s %.2f s\n", "write time", write_s);
    printf("  %-30s %s, %d online cores\n", "cpu", cpu, bw.threads);
    printf("  %-30s %s (LMX_CPU_ISA=%s)\n", "kernel ISA", kern.isa,
           getenv("LMX_CPU_ISA") ? getenv("LMX_CPU_ISA") : "unset");
    printf("  %-30s %d\n", "engine threads", engine_threads);
    printf("  %-30s %.2f at start, %.2f at end\n", "load average (1 min)", load_before, load_average());
    printf("  %-30s %d layers, hidden %d, %d/%d heads, head_dim %d, ffn %d, vocab %d\n", "geometry",
           info.n_layers, info.hidden_size, info.n_heads, info.n_kv_heads, info.head_dim, info.ffn_size,
           info.vocab_size);
    printf("  %-30s %.3f G params, %.1f MiB (%s)\n", "weights", info.n_params / 1e9,
           info.weight_bytes / 1048576.0, info.dtype);
    printf("\n  %-30s %10s %10s\n", "memory bandwidth (best of 5)", "1 thread", "all cores");
    printf("  %-30s %10.2f %10.2f  GB/s (read+write bytes)\n", "memcpy 1 GiB", bw.copy1, bw.copyN);
    printf("  %-30s %10.2f %10.2f  GB/s\n", "read (sum) 1 GiB", bw.read1, bw.readN);
    printf("\n  %-30s %10.3f s\n", "load", load_s);
    printf("  %-30s %10.1f tok/s  (%d tokens, %.3f s)\n", "prefill, cold (first touch)",
           n_prompt / prefill_cold_s, n_prompt, prefill_cold_s);
    printf("  %-30s %10.1f tok/s  (%d tokens, %.3f s)\n", "prefill, warm", n_prompt / prefill_s, n_prompt,
           prefill_s);
    printf("  %-30s %10.2f tok/s  (mean %.2f ms, median %.2f ms, min %.2f ms; %d tokens)\n", "decode",
           1.0 / mean_s, mean_s * 1e3, med_s * 1e3, min_s * 1e3, n_tokens);
    printf("  %-30s %10.1f MB  (weights %.1f MB + KV %.1f MB at mean context %.1f)\n", "bytes / token",
           bytes_tok / 1e6, weight_tok / 1e6, kv_tok / 1e6, ctx_mean);
    printf("  %-30s %10.2f GB/s  (%.2f GB/s at the median latency)\n", "achieved bandwidth", ach_gbs,
           ach_med_gbs);
    printf("  %-30s %10.1f %%  of read, all cores (%.1f %% of read, 1 thread; %.1f %% of memcpy, all)\n",
           "roofline (achieved / peak)", 100.0 * ach_gbs / bw.readN, 100.0 * ach_gbs / bw.read1,
           100.0 * ach_gbs / bw.copyN);
    printf("  %-30s %s\n", "final logits finite", finite ? "yes" : "NO");

    if (json)
        printf("{\"arch\":\"%s\",\"geometry\":\"%s\",\"cpu\":\"%s\",\"cores\":%d,\"isa\":\"%s\",\"threads\":%d,\"loadavg\":%.2f,"
               "\"n_layers\":%d,\"hidden\":%d,\"n_heads\":%d,\"n_kv_heads\":%d,\"head_dim\":%d,\"ffn\":%d,"
               "\"vocab\":%d,\"n_params\":%lld,\"weight_bytes\":%lld,\"reused\":%s,"
               "\"memcpy_gbs_1t\":%.3f,\"memcpy_gbs_all\":%.3f,\"read_gbs_1t\":%.3f,\"read_gbs_all\":%.3f,"
               "\"load_s\":%.4f,\"prompt_tokens\":%d,\"prefill_cold_tok_s\":%.3f,\"prefill_tok_s\":%.3f,"
               "\"decode_tokens\":%d,\"decode_tok_s\":%.4f,\"decode_mean_ms\":%.4f,\"decode_median_ms\":%.4f,"
               "\"decode_min_ms\":%.4f,\"bytes_per_token\":%.0f,\"weight_bytes_per_token\":%lld,"
               "\"kv_bytes_per_token\":%.0f,\"achieved_gbs\":%.3f,\"roofline_read_all\":%.4f,"
               "\"roofline_read_1t\":%.4f,\"logits_finite\":%s}\n",
               a->name, a->hf_name, cpu, bw.threads, kern.isa, engine_threads, load_before, info.n_layers, info.hidden_size,
               info.n_heads, info.n_kv_heads, info.head_dim, info.ffn_size, info.vocab_size,
               (long long)info.n_params, (long long)info.weight_bytes, reused ? "true" : "false", bw.copy1,
               bw.copyN, bw.read1, bw.readN, load_s, n_prompt, n_prompt / prefill_cold_s, n_prompt / prefill_s,
               n_tokens, 1.0 / mean_s, mean_s * 1e3, med_s * 1e3, min_s * 1e3, bytes_tok, (long long)weight_tok,
               kv_tok, ach_gbs, ach_gbs / bw.readN, ach_gbs / bw.read1, finite ? "true" : "false");
    rc = finite ? 0 : 1;
    if (!finite) fprintf(stderr, "bench_decode: the final logits are not finite\n");

cleanup:
    free(lat);
    free(prompt);
    free(logits);
    lmx_context_free(ctx);
    lmx_model_free(m);
    if (temp_dir) {
        if (keep) {
            fprintf(stderr, "bench_decode: kept %s\n", dir);
        } else {
            remove_model_files(dir, a);
            if (rmdir(dir) != 0) fprintf(stderr, "bench_decode: cannot remove %s: %s\n", dir, strerror(errno));
        }
    }
    return rc;
}
