/* test_bridge.c - the mlx_lm backend (src/runtime/bridge.c + mlx_lm_bridge.py).
 *
 * Always: a missing Python and a missing mlx-lm are clear errors naming what to install; a child
 * that answers garbage, or nothing, is an error status within the timeout, never a hang.
 * With mlx-lm (LMX_PYTHON, else the venv scripts/fetch_models.sh mlx-lm caches, else python3;
 * skipped with exit 77 when none has it): greedy tokens equal the native cpu backend's on the llama
 * and gemma3 fixtures (they carry rope_theta at the top level, which every mlx-lm 0.32 model reads;
 * some ignore transformers-5 rope_parameters, which the qwen2 / gemma2 fixtures use alone) and on
 * qwen3 (whose mlx-lm 0.32.2 model reads rope_parameters); cancel mid-stream,
 * a stopping callback, freeing an unfinished stream; a child killed mid-stream gives an error and
 * the next request starts a fresh child; the child is reaped and the script removed on free; text
 * prompts, chat and stop strings through a byte-level tokenizer (tests/data/bridge) on the llama
 * fixture give the cpu backend's text.
 * usage: test_bridge FIXTURES_DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "lmx.h"
#include "runtime/bridge.h"
#include "test_files.h"

static char tmpdir[256];

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int dir_entries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (!strncmp(e->d_name, "lmx-", 4)) n++; /* ours (mlx itself may keep a cache folder here) */
    if (d) closedir(d);
    return n;
}

static lmx_status load_bridge(const char *path, lmx_model **m) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "mlx_lm";
    return lmx_model_load(path, &lp, m);
}

static void write_exe(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
    chmod(path, 0700);
}

/* Children that do not speak the protocol: errors, quickly, and reaped. */
static void bad_children(const char *model) {
    lmx_model *m = NULL;
    char exe[512];
    setenv("LMX_PYTHON", "/nonexistent/python3", 1);
    CHECK(load_bridge(model, &m) == LMX_ERR_BACKEND && !m);
    CHECK_CONTAINS(lmx_last_error(NULL), "Python 3");
    CHECK_CONTAINS(lmx_last_error(NULL), "pip install");

    snprintf(exe, sizeof exe, "%s/garbage.sh", tmpdir);
    write_exe(exe, "#!/bin/sh\nread x\necho 'this is not json'\nsleep 30\n");
    setenv("LMX_PYTHON", exe, 1);
    CHECK(load_bridge(model, &m) == LMX_ERR_BACKEND && !m);
    CHECK_CONTAINS(lmx_last_error(NULL), "malformed reply");

    snprintf(exe, sizeof exe, "%s/silent.sh", tmpdir);
    write_exe(exe, "#!/bin/sh\nread x\nsleep 30\n");
    setenv("LMX_PYTHON", exe, 1);
    setenv("LMX_MLX_LM_TIMEOUT_MS", "300", 1);
    double t0 = now_ms();
    CHECK(load_bridge(model, &m) == LMX_ERR_BACKEND && !m);
    CHECK_CONTAINS(lmx_last_error(NULL), "timeout");
    CHECK_MSG(now_ms() - t0 < 5000, "a silent child took %.0f ms", now_ms() - t0);
    unsetenv("LMX_MLX_LM_TIMEOUT_MS");

    snprintf(exe, sizeof exe, "%s/crash.sh", tmpdir);
    write_exe(exe, "#!/bin/sh\nread x\necho 'boom' >&2\nexit 5\n");
    setenv("LMX_PYTHON", exe, 1);
    CHECK(load_bridge(model, &m) == LMX_ERR_BACKEND && !m);
    CHECK_CONTAINS(lmx_last_error(NULL), "exit status 5");
    CHECK_CONTAINS(lmx_last_error(NULL), "boom");
    unlink(exe);
    snprintf(exe, sizeof exe, "%s/garbage.sh", tmpdir);
    unlink(exe);
    snprintf(exe, sizeof exe, "%s/silent.sh", tmpdir);
    unlink(exe);
    CHECK_MSG(dir_entries(tmpdir) == 0, "%d files left in %s", dir_entries(tmpdir), tmpdir);
}

/* A python3 without mlx-lm names the package to install. */
static void missing_mlx_lm(const char *model) {
    if (system("python3 -c 'import mlx_lm' 2>/dev/null") == 0 || system("python3 -c '' 2>/dev/null") != 0) {
        printf("skip: python3 has mlx-lm (or there is no python3): the missing-package message is not checked\n");
        return;
    }
    setenv("LMX_PYTHON", "python3", 1);
    lmx_model *m = NULL;
    CHECK(load_bridge(model, &m) == LMX_ERR_BACKEND && !m);
    CHECK_CONTAINS(lmx_last_error(NULL), "mlx");
    CHECK_CONTAINS(lmx_last_error(NULL), "pip install \"mlx[cpu]\" mlx-lm");
}

static int gen(lmx_model *m, const int32_t *p, int n, int max_tokens, lmx_result *r) {
    lmx_gen_params gp = lmx_gen_default_params();
    gp.sampler.temperature = 0;
    gp.max_tokens = max_tokens;
    return lmx_generate_ids(m, p, n, &gp, r);
}

/* Greedy tokens of the bridge equal the cpu backend's. */
static void same_as_native(lmx_model *bm, const char *path) {
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    lmx_model *nm = NULL;
    CHECK(lmx_model_load(path, &lp, &nm) == LMX_OK);
    if (!nm) return;
    static const int32_t prompts[][7] = {{1, 5, 6, 7, 8}, {1, 100, 200, 33, 4, 17, 250}, {1, 42}};
    static const int lens[] = {5, 7, 2};
    for (int i = 0; i < 3; i++) {
        lmx_result a, b;
        CHECK_MSG(gen(bm, prompts[i], lens[i], 48, &a) == LMX_OK, "%s", lmx_last_error(bm));
        int na = a.n_ids;
        int32_t ids[64];
        memcpy(ids, a.ids, (size_t)na * sizeof *ids);
        lmx_finish fa = a.finish;
        CHECK(gen(nm, prompts[i], lens[i], 48, &b) == LMX_OK);
        CHECK_MSG(na == b.n_ids && !memcmp(ids, b.ids, (size_t)na * sizeof *ids) && fa == b.finish,
                  "%s prompt %d: mlx_lm %d tokens (%s), cpu %d (%s)", path, i, na, lmx_finish_str(fa), b.n_ids,
                  lmx_finish_str(b.finish));
        lmx_metrics mt;
        CHECK(lmx_get_metrics(bm, &mt) == LMX_OK && mt.prompt_tokens == lens[i] && mt.generated_tokens == na);
    }
    lmx_model_free(nm);
}

static int stop_after;
static int on_token_stop(const lmx_token *t, void *user) {
    (void)t;
    return ++*(int *)user >= stop_after;
}
static int on_token_cancel(const lmx_token *t, void *user) {
    (void)t;
    lmx_model *m = user;
    if (t->index == 4) lmx_cancel(m);
    return 0;
}

static void stopping(lmx_model *m, const char *path) {
    static const int32_t p[] = {1, 5, 6, 7, 8};
    lmx_gen_params gp = lmx_gen_default_params();
    gp.sampler.temperature = 0;
    gp.max_tokens = 100000; /* far more than get generated: the child is still busy when we stop */
    gp.ignore_eos = 1;
    lmx_result r;
    lmx_stream *s = NULL;

    /* the pull stream, cancelled after 3 tokens */
    CHECK(lmx_stream_open_ids(m, p, 5, &gp, &s) == LMX_OK);
    const lmx_token *t;
    for (int i = 0; i < 3; i++) CHECK(lmx_stream_next(s, &t) == LMX_OK && t && t->index == i);
    lmx_cancel(m);
    CHECK(lmx_stream_next(s, &t) == LMX_OK && !t);
    CHECK(lmx_stream_result(s, &r) == LMX_OK && r.finish == LMX_FINISH_CANCELLED && r.n_ids == 3);
    lmx_stream_free(s);

    /* cancel from the token callback */
    gp.on_token = on_token_cancel;
    gp.user = m;
    CHECK(lmx_generate_ids(m, p, 5, &gp, &r) == LMX_OK);
    CHECK_MSG(r.finish == LMX_FINISH_CANCELLED && r.n_ids == 5, "%s after %d", lmx_finish_str(r.finish), r.n_ids);

    /* a callback that stops the generation */
    int count = 0;
    stop_after = 7;
    gp.on_token = on_token_stop;
    gp.user = &count;
    CHECK(lmx_generate_ids(m, p, 5, &gp, &r) == LMX_OK);
    CHECK_MSG(r.finish == LMX_FINISH_CALLBACK && r.n_ids == 7, "%s after %d", lmx_finish_str(r.finish), r.n_ids);

    /* an unfinished stream freed */
    gp.on_token = NULL;
    CHECK(lmx_stream_open_ids(m, p, 5, &gp, &s) == LMX_OK);
    CHECK(lmx_stream_next(s, &t) == LMX_OK && t);
    lmx_stream_free(s);

    /* the child is still the same one, and the next request is right */
    long pid = lmx_bridge_child_pid(m);
    same_as_native(m, path);
    CHECK(lmx_bridge_child_pid(m) == pid);

    /* a child killed mid-stream: an error, then a fresh child */
    CHECK(lmx_stream_open_ids(m, p, 5, &gp, &s) == LMX_OK);
    CHECK(lmx_stream_next(s, &t) == LMX_OK && t);
    CHECK(kill((pid_t)pid, SIGKILL) == 0);
    lmx_status st = LMX_OK;
    int n = 0;
    while (n < 200000 && (st = lmx_stream_next(s, &t)) == LMX_OK && t) n++; /* lines already sent, then EOF */
    CHECK_MSG(st == LMX_ERR_BACKEND, "after the kill: %s (%d tokens)", lmx_status_str(st), n);
    CHECK_CONTAINS(lmx_last_error(m), "signal 9");
    CHECK(lmx_bridge_child_pid(m) == 0);
    lmx_stream_free(s);
    CHECK(kill((pid_t)pid, 0) == -1 && errno == ESRCH); /* reaped */
    same_as_native(m, path);
    CHECK(lmx_bridge_child_pid(m) > 0 && lmx_bridge_child_pid(m) != pid);

    /* an error reply keeps the child: no tokenizer in the fixture, so text prompts fail */
    pid = lmx_bridge_child_pid(m);
    CHECK(lmx_generate(m, "hello", &gp, &r) == LMX_ERR_BACKEND);
    CHECK_CONTAINS(lmx_last_error(m), "no tokenizer");
    lmx_message msg = {"user", "hi"};
    CHECK(lmx_chat(m, &msg, 1, &gp, &r) == LMX_ERR_BACKEND);
    CHECK(lmx_bridge_child_pid(m) == pid);
    /* calls the bridge does not serve are refused cleanly */
    lmx_context *c = NULL;
    CHECK(lmx_context_create(m, NULL, &c) == LMX_ERR_UNSUPPORTED && !c);
    CHECK(lmx_prompt_cache_warm_ids(m, p, 5) == LMX_ERR_UNSUPPORTED);
    lmx_adapter *a = NULL;
    CHECK(lmx_adapter_load(m, path, &a) == LMX_ERR_UNSUPPORTED && !a);
    int32_t next = -1;
    const int32_t *pp = p;
    int len = 5;
    CHECK(lmx_classify_ids(m, &pp, &len, 1, NULL, NULL, &next, NULL) != LMX_OK);
    CHECK(lmx_batch_generate_ids(m, &pp, &len, 1, &gp, &r) != LMX_OK);
    CHECK(lmx_bridge_child_pid(m) == pid);
    CHECK(gen(m, p, 5, 8, &r) == LMX_OK && r.n_ids == 8);
}

/* Text calls: the llama fixture with a byte-level tokenizer (tests/data/bridge: 256 byte tokens,
 * <s> / </s>, a one-line chat template), read by lmx natively and by transformers in the child. */
static void text_calls(const char *llama) {
    char dir[600], cmd[4096], data[512];
    test_data_dir(data, sizeof data, "bridge");
    snprintf(dir, sizeof dir, "%s/model", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && ln -s '%s'/config.json '%s'/model.safetensors '%s'/ && cp '%s'/tokenizer*.json '%s'/",
             dir, llama, llama, dir, data, dir);
    CHECK(system(cmd) == 0);
    lmx_model *bm = NULL, *nm = NULL;
    lmx_load_params lp = lmx_load_default_params();
    lp.backend = "cpu";
    CHECK_MSG(load_bridge(dir, &bm) == LMX_OK, "%s", lmx_last_error(NULL));
    CHECK(lmx_model_load(dir, &lp, &nm) == LMX_OK);
    if (!bm || !nm) goto done;
    lmx_gen_params gp = lmx_gen_default_params();
    gp.sampler.temperature = 0;
    gp.max_tokens = 30;
    lmx_result a, b;
    char text[256];
    static const char *prompts[] = {"The quick brown fox", "Zebra"};
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(lmx_generate(bm, prompts[i], &gp, &a) == LMX_OK, "%s", lmx_last_error(bm));
        snprintf(text, sizeof text, "%s", a.text);
        int n = a.n_ids;
        CHECK(lmx_generate(nm, prompts[i], &gp, &b) == LMX_OK);
        CHECK_MSG(!strcmp(text, b.text) && n == b.n_ids, "\"%s\": mlx_lm \"%s\", cpu \"%s\"", prompts[i], text, b.text);
    }
    lmx_message msg = {"user", "hi there"};
    CHECK_MSG(lmx_chat(bm, &msg, 1, &gp, &a) == LMX_OK, "%s", lmx_last_error(bm));
    snprintf(text, sizeof text, "%s", a.text);
    CHECK(lmx_chat(nm, &msg, 1, &gp, &b) == LMX_OK);
    CHECK_MSG(!strcmp(text, b.text), "chat: mlx_lm \"%s\", cpu \"%s\"", text, b.text);
    lmx_metrics mt;
    CHECK(lmx_get_metrics(bm, &mt) == LMX_OK && mt.prompt_tokens > 0 && mt.generated_tokens == a.n_ids);
    /* a stop string (its first character also ends the text before it: held back, then released) */
    CHECK(lmx_generate(bm, "abc xyz 123", &gp, &a) == LMX_OK);
    snprintf(text, sizeof text, "%s", a.text);
    const char *stop = "3~~", *at = strstr(text, stop);
    CHECK_MSG(at != NULL, "no \"%s\" in \"%s\"", stop, text);
    gp.stop_strings = &stop;
    gp.n_stop_strings = 1;
    CHECK(lmx_generate(bm, "abc xyz 123", &gp, &a) == LMX_OK);
    CHECK_MSG(at && a.finish == LMX_FINISH_STOP_STRING && a.text_len == (size_t)(at - text) &&
                  !strncmp(a.text, text, a.text_len),
              "stop \"%s\": \"%s\" (%s)", stop, a.text, lmx_finish_str(a.finish));
done:
    lmx_model_free(bm);
    lmx_model_free(nm);
}

int main(int argc, char **argv) {
    const char *fx = argc > 1 ? argv[1] : getenv("LMX_FIXTURES");
    if (!fx) {
        fprintf(stderr, "usage: test_bridge FIXTURES_DIR\n");
        return 2;
    }
    char llama[512], gemma3[512], qwen3[512], py[512] = "";
    snprintf(llama, sizeof llama, "%s/models/llama", fx);
    snprintf(gemma3, sizeof gemma3, "%s/models/gemma3", fx);
    snprintf(qwen3, sizeof qwen3, "%s/models/qwen3", fx);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/lmx-test-bridge-XXXXXX");
    if (!mkdtemp(tmpdir)) return 2;
    setenv("TMPDIR", tmpdir, 1); /* the bridge's script goes here: it must be gone after each free */

    const char *env = getenv("LMX_PYTHON");
    if (env && *env) snprintf(py, sizeof py, "%s", env);
    else {
        const char *cache = getenv("LMX_MODEL_CACHE"), *home = getenv("HOME");
        if (cache && *cache) snprintf(py, sizeof py, "%s/mlx-lm-venv/bin/python", cache);
        else if (home) snprintf(py, sizeof py, "%s/.cache/lmx/mlx-lm-venv/bin/python", home);
        if (access(py, X_OK)) snprintf(py, sizeof py, "python3");
    }
    bad_children(llama);
    missing_mlx_lm(llama);

    setenv("LMX_PYTHON", py, 1);
    lmx_model *m = NULL;
    lmx_status st = load_bridge(llama, &m);
    if (st && strstr(lmx_last_error(NULL), "needs")) {
        printf("skip: mlx-lm is not installed for %s (%s); run scripts/fetch_models.sh mlx-lm\n", py,
               lmx_last_error(NULL));
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
        check_summary("test_bridge");
        return check_n_failed ? 1 : 77;
    }
    CHECK_MSG(st == LMX_OK, "%s", lmx_last_error(NULL));
    if (m) {
        lmx_model_info in;
        CHECK(lmx_model_get_info(m, &in) == LMX_OK);
        CHECK(!strcmp(in.backend, "mlx_lm") && !strcmp(in.architecture, "llama") && in.vocab_size == 320 &&
              in.n_layers == 2 && in.n_eos >= 1 && in.eos_ids[0] == 2);
        CHECK(dir_entries(tmpdir) == 1); /* the script (the child's stderr file is unlinked) */
        same_as_native(m, llama);
        stopping(m, llama);
        long pid = lmx_bridge_child_pid(m);
        lmx_model_free(m);
        CHECK(kill((pid_t)pid, 0) == -1 && errno == ESRCH); /* ended and reaped */
        CHECK_MSG(dir_entries(tmpdir) == 0, "%d files left in %s", dir_entries(tmpdir), tmpdir);
    }
    text_calls(llama);
    const char *more[] = {gemma3, qwen3};
    for (int i = 0; i < 2; i++) {
        m = NULL;
        CHECK_MSG(load_bridge(more[i], &m) == LMX_OK, "%s", lmx_last_error(NULL));
        if (m) same_as_native(m, more[i]);
        lmx_model_free(m);
    }
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd)) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return check_summary("test_bridge");
}
