/* driver.c - lmx's own fuzzing driver, linked with a harness where libFuzzer is not available (no
 * clang).  It takes libFuzzer's command line, so scripts and tests use one syntax for both:
 *
 *   fuzz_NAME [-runs=N] [-max_total_time=S] [-seed=N] [-max_len=N] [-timeout=S] [-dict=FILE]
 *             [-artifact_prefix=P] CORPUS_DIR_OR_FILE...
 *
 * Every input of the corpus runs once first (the regression replay; -runs=0 stops there).  Then,
 * until -runs inputs or -max_total_time seconds, it mutates corpus inputs at random: bit flips,
 * interesting bytes and integers, insertions, deletions, copies within an input, splices of two
 * inputs, tokens from -dict (libFuzzer's dictionary format: one "quoted" token per line).  There is no
 * coverage feedback, so new inputs are not kept; it finds the shallower bugs libFuzzer finds, slower.
 *
 * A crash (a sanitizer report, a signal, an abort) writes the input to <artifact_prefix>crash-<hash>
 * before the process dies, through the sanitizers' death callback or a signal handler; an input
 * running past -timeout writes timeout-<hash> and exits 70.  Other flags are ignored. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

typedef struct blob {
    uint8_t *p;
    size_t n;
} blob;

typedef struct blobs {
    blob *v;
    size_t n, cap;
} blobs;

static void free_blobs(blobs *b) {
    for (size_t i = 0; i < b->n; i++) free(b->v[i].p);
    free(b->v);
    memset(b, 0, sizeof *b);
}

static void push(blobs *b, uint8_t *p, size_t n) {
    if (b->n == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        b->v = realloc(b->v, b->cap * sizeof *b->v);
        if (!b->v) abort();
    }
    b->v[b->n++] = (blob){p, n};
}

/* ---- the input being run, saved if the process dies ------------------------------------------- */
static const uint8_t *cur_p;
static size_t cur_n;
static char prefix[512] = "./";

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Async-signal-safe: open, write, close; no stdio, no allocation. */
static void save_current(const char *kind) {
    if (!cur_p) return; /* between inputs */
    char path[640], hex[17];
    uint64_t h = fnv1a(cur_p, cur_n);
    for (int i = 15; i >= 0; i--, h >>= 4) hex[i] = "0123456789abcdef"[h & 15];
    hex[16] = 0;
    size_t k = 0;
    for (const char *s = prefix; *s && k < sizeof path - 40; s++) path[k++] = *s;
    for (const char *s = kind; *s; s++) path[k++] = *s;
    path[k++] = '-';
    for (int i = 0; i < 16; i++) path[k++] = hex[i];
    path[k] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t off = 0;
        while (off < cur_n) {
            ssize_t w = write(fd, cur_p + off, cur_n - off);
            if (w <= 0) break;
            off += (size_t)w;
        }
        close(fd);
    }
    static const char msg[] = "\nlmx fuzz driver: the input that failed was written to ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, path, k) < 0 || write(2, "\n", 1) < 0) return;
}

static void on_death(void) { save_current("crash"); }

static void on_signal(int sig) {
    save_current("crash");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_alarm(int sig) {
    (void)sig;
    save_current("timeout");
    static const char msg[] = "lmx fuzz driver: an input ran past -timeout\n";
    if (write(2, msg, sizeof msg - 1) < 0) _exit(70);
    _exit(70);
}

static int timeout_s = 20;

static void run_one(const uint8_t *p, size_t n) {
    /* a private copy, exactly sized, so that reads past the end are caught */
    uint8_t *copy = malloc(n ? n : 1);
    if (!copy) abort();
    if (n) memcpy(copy, p, n);
    cur_p = copy;
    cur_n = n;
    alarm((unsigned)timeout_s);
    LLVMFuzzerTestOneInput(copy, n);
    alarm(0);
    cur_p = NULL;
    cur_n = 0;
    free(copy);
}

/* ---- corpus and dictionary ----------------------------------------------------------------------- */
static int read_file(const char *path, blobs *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    uint8_t *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            p = realloc(p, cap);
            if (!p) abort();
        }
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    fclose(f);
    push(out, p, n);
    return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void read_corpus(const char *path, blobs *out) {
    struct stat st;
    if (stat(path, &st) != 0) {
        fprintf(stderr, "lmx fuzz driver: %s: no such file or directory\n", path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        read_file(path, out);
        return;
    }
    DIR *d = opendir(path);
    struct dirent *e;
    char **names = NULL;
    size_t n = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        names = realloc(names, (n + 1) * sizeof *names);
        if (!names || !(names[n] = malloc(strlen(path) + strlen(e->d_name) + 2))) abort();
        sprintf(names[n++], "%s/%s", path, e->d_name);
    }
    if (d) closedir(d);
    if (n) qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) read_file(names[i], out);
        free(names[i]);
    }
    free(names);
}

/* libFuzzer's dictionary format: name="token" or "token" per line, with \\ \" \xNN escapes. */
static void read_dict(const char *path, blobs *out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "lmx fuzz driver: cannot read the dictionary %s\n", path);
        exit(2);
    }
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *q = strchr(line, '"'), *end = strrchr(line, '"');
        if (line[0] == '#' || !q || end == q) continue;
        uint8_t *tok = malloc((size_t)(end - q));
        size_t n = 0;
        if (!tok) abort();
        for (char *s = q + 1; s < end; s++) {
            if (*s == '\\' && s + 1 < end && s[1] == 'x' && s + 3 < end) {
                char hx[3] = {s[2], s[3], 0};
                tok[n++] = (uint8_t)strtol(hx, NULL, 16);
                s += 3;
            } else if (*s == '\\' && s + 1 < end) {
                tok[n++] = (uint8_t)*++s;
            } else {
                tok[n++] = (uint8_t)*s;
            }
        }
        push(out, tok, n);
    }
    fclose(f);
}

/* ---- mutation ------------------------------------------------------------------------------------ */
static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ull;
}

static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* Insert k bytes (from src, or random when src is NULL) at pos; the buffer holds cap bytes. */
static size_t insert(uint8_t *b, size_t n, size_t cap, size_t pos, const uint8_t *src, size_t k) {
    if (n + k > cap) k = cap - n;
    memmove(b + pos + k, b + pos, n - pos);
    for (size_t i = 0; i < k; i++) b[pos + i] = src ? src[i] : (uint8_t)rnd();
    return n + k;
}

static size_t mutate(uint8_t *b, size_t n, size_t cap, const blobs *corpus, const blobs *dict) {
    static const uint8_t bytes[] = {0, 1, 0x7f, 0x80, 0xff, '"', '\\', '{', '}', '[', ']', ',', ':', '\n', ' ', '%', '\'', '-', '0', '9', 'e'};
    static const int64_t ints[] = {0, 1, -1, 2, 7, 8, 16, 32, 64, 127, 128, 255, 256, 4096, 65535, 65536, INT32_MAX,
                                   (int64_t)INT32_MAX + 1, INT64_MAX, INT64_MIN};
    int rounds = 1 + (int)below(6);
    for (int r = 0; r < rounds; r++) {
        size_t pos = below(n + 1), k;
        switch (below(11)) {
        case 0: if (n) b[below(n)] ^= (uint8_t)(1u << below(8)); break;
        case 1: if (n) b[below(n)] = bytes[below(sizeof bytes)]; break;
        case 2: if (n) b[below(n)] = (uint8_t)rnd(); break;
        case 3: /* a little-endian integer of 1, 2, 4 or 8 bytes */
            k = (size_t)1 << below(4);
            if (n >= k) {
                int64_t v = ints[below(sizeof ints / sizeof ints[0])];
                size_t at = below(n - k + 1);
                for (size_t i = 0; i < k; i++) b[at + i] = (uint8_t)((uint64_t)v >> (8 * i));
            }
            break;
        case 4: n = insert(b, n, cap, pos, NULL, 1 + below(8)); break;
        case 5: /* delete a range */
            if (n) {
                k = 1 + below(n - pos < 64 ? n - pos + 1 : 64);
                if (pos + k > n) k = n - pos;
                memmove(b + pos, b + pos + k, n - pos - k);
                n -= k;
            }
            break;
        case 6: /* copy a range of the input elsewhere in it */
            if (n) {
                size_t from = below(n);
                k = 1 + below(n - from < 128 ? n - from : 128);
                uint8_t tmp[128];
                memcpy(tmp, b + from, k);
                n = insert(b, n, cap, pos, tmp, k);
            }
            break;
        case 7: case 8: /* a dictionary token */
            if (dict->n) {
                const blob *t = &dict->v[below(dict->n)];
                n = insert(b, n, cap, pos, t->p, t->n);
            }
            break;
        case 9: /* splice: the head of this input, the tail of another */
            if (corpus->n) {
                const blob *o = &corpus->v[below(corpus->n)];
                size_t from = below(o->n + 1);
                k = o->n - from;
                if (pos + k > cap) k = cap - pos;
                memcpy(b + pos, o->p + from, k);
                n = pos + k;
            }
            break;
        default: /* repeat a byte */
            if (n) {
                uint8_t c = b[below(n)], run[32];
                memset(run, c, sizeof run);
                n = insert(b, n, cap, pos, run, 1 + below(sizeof run));
            }
            break;
        }
    }
    return n;
}

/* ---- main ---------------------------------------------------------------------------------------- */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    long long runs = -1;
    double max_time = 0;
    size_t max_len = 0;
    blobs corpus = {0}, dict = {0};
    const char *paths[256];
    int n_paths = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strncmp(a, "-runs=", 6)) runs = atoll(a + 6);
        else if (!strncmp(a, "-max_total_time=", 16)) max_time = atof(a + 16);
        else if (!strncmp(a, "-seed=", 6)) rng_state = (uint64_t)atoll(a + 6) * 2654435761ull + 1;
        else if (!strncmp(a, "-max_len=", 9)) max_len = (size_t)atoll(a + 9);
        else if (!strncmp(a, "-timeout=", 9)) timeout_s = atoi(a + 9);
        else if (!strncmp(a, "-dict=", 6)) read_dict(a + 6, &dict);
        else if (!strncmp(a, "-artifact_prefix=", 17)) snprintf(prefix, sizeof prefix, "%s", a + 17);
        else if (!strncmp(a, "-rss_limit_mb=", 14) || !strncmp(a, "-print_final_stats=", 19)) continue; /* libFuzzer's */
        else if (a[0] == '-') fprintf(stderr, "lmx fuzz driver: ignoring %s\n", a);
        else if (n_paths < 256) paths[n_paths++] = a;
    }
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(on_death);
    static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], on_signal);
    signal(SIGALRM, on_alarm);

    for (int i = 0; i < n_paths; i++) read_corpus(paths[i], &corpus);
    size_t largest = 0;
    for (size_t i = 0; i < corpus.n; i++) {
        run_one(corpus.v[i].p, corpus.v[i].n);
        if (corpus.v[i].n > largest) largest = corpus.v[i].n;
    }
    fprintf(stderr, "lmx fuzz driver: replayed %zu inputs\n", corpus.n);
    if (runs == 0 || (runs < 0 && max_time <= 0 && n_paths > 0)) {
        free_blobs(&corpus);
        free_blobs(&dict);
        return 0;
    }

    if (!max_len) max_len = largest > 4096 ? largest : 4096;
    uint8_t *buf = malloc(max_len + 1);
    if (!buf) abort();
    double t0 = now(), last = t0;
    long long done = 0;
    while ((runs < 0 || done < runs) && (max_time <= 0 || now() - t0 < max_time)) {
        size_t n = 0;
        if (corpus.n && below(16)) {
            const blob *s = &corpus.v[below(corpus.n)];
            n = s->n < max_len ? s->n : max_len;
            memcpy(buf, s->p, n);
        }
        n = mutate(buf, n, max_len, &corpus, &dict);
        run_one(buf, n);
        done++;
        if (now() - last >= 5) {
            last = now();
            fprintf(stderr, "lmx fuzz driver: #%lld  %.0f execs/s\n", done, (double)done / (last - t0));
        }
    }
    fprintf(stderr, "lmx fuzz driver: done, %lld inputs in %.1f s, no crash\n", done, now() - t0);
    free(buf);
    free_blobs(&corpus);
    free_blobs(&dict);
    return 0;
}
