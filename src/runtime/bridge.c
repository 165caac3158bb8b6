/* bridge.c - the mlx_lm backend: generation delegated to a child Python process running mlx-lm
 * (see bridge.h and the protocol at the top of mlx_lm_bridge.py). */
#define _GNU_SOURCE
#include "bridge.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "../base/json.h"

extern char **environ;

/* the script, embedded by CMake (mlx_lm_bridge_script.c, generated from mlx_lm_bridge.py) */
extern const unsigned char lmx_mlx_lm_bridge_py[];
extern const size_t lmx_mlx_lm_bridge_py_len;

#define INSTALL_HINT "pip install \"mlx[cpu]\" mlx-lm (Linux; mlx-cuda-13 instead of mlx[cpu] on a GPU) or pip install mlx-lm (macOS)"
#define LINE_MAX_BYTES (64u << 20)

struct lmx_bridge {
    char *path, *adapter, *python;
    char script[4096];           /* the private copy of the script ("" until first use) */
    int errfd;                   /* the child's stderr: an unlinked temporary file (-1: none) */
    pid_t pid;                   /* 0: no child */
    int fd;                      /* our end of the socket pair */
    char *rbuf;                  /* bytes read, not yet consumed */
    size_t rlen, rcap;
    int busy;                    /* a generation request is in flight (its done not read yet) */
    int cancel_sent;
    int timeout_ms;
    /* info from the load reply */
    char arch[64], dtype[16];
    lmx_model_info info;
};

/* ---- the backend stub: a name and memory accounting (generation never reaches its ops) ------ */

static void stub_destroy(lmx_backend *be) { free(be); }
static const lmx_backend_ops stub_ops = {.name = LMX_BRIDGE_BACKEND, .destroy = stub_destroy};

/* ---- the child -------------------------------------------------------------------------------- */

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Write the embedded script to a private temporary file (mode 0600), once per bridge. */
static lmx_status ensure_script(lmx_bridge *b, lmx_err *err) {
    if (b->script[0]) return LMX_OK;
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir) dir = "/tmp";
    char path[sizeof b->script];
    if (snprintf(path, sizeof path, "%s/lmx-mlx-lm-bridge-XXXXXX.py", dir) >= (int)sizeof path)
        return lmx_err_set(err, LMX_ERR_IO, "TMPDIR is too long");
    int fd = mkstemps(path, 3);
    if (fd < 0) return lmx_err_set(err, LMX_ERR_IO, "cannot create the bridge script in %s: %s", dir, strerror(errno));
    int bad = write_all(fd, lmx_mlx_lm_bridge_py, lmx_mlx_lm_bridge_py_len);
    if (close(fd) || bad) {
        unlink(path);
        return lmx_err_set(err, LMX_ERR_IO, "cannot write the bridge script %s", path);
    }
    memcpy(b->script, path, sizeof path);
    if (b->errfd < 0) {
        char ep[sizeof b->script];
        snprintf(ep, sizeof ep, "%s/lmx-mlx-lm-stderr-XXXXXX", dir);
        b->errfd = mkostemp(ep, O_CLOEXEC);
        if (b->errfd >= 0) unlink(ep);
    }
    return LMX_OK;
}

/* The last line of the child's stderr (for messages), in out. */
static void stderr_tail(lmx_bridge *b, char *out, size_t cap) {
    out[0] = 0;
    if (b->errfd < 0) return;
    off_t end = lseek(b->errfd, 0, SEEK_END);
    if (end <= 0) return;
    off_t start = end > (off_t)(cap - 1) ? end - (off_t)(cap - 1) : 0;
    ssize_t n = pread(b->errfd, out, (size_t)(end - start), start);
    if (n <= 0) return;
    out[n] = 0;
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' ')) out[--n] = 0;
    char *nl = strrchr(out, '\n');
    if (nl) memmove(out, nl + 1, strlen(nl + 1) + 1);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* End the child: politely (quit, up to 2 s) or at once; always reaped.  Returns its wait status
 * (-1 when none was running). */
static int end_child(lmx_bridge *b, int politely) {
    int ws = -1;
    if (b->pid > 0) {
        if (politely && b->fd >= 0) {
            static const char quit[] = "{\"op\": \"quit\"}\n";
            ssize_t sent = send(b->fd, quit, sizeof quit - 1, MSG_NOSIGNAL);
            close(b->fd); /* the child still reads the quit; a write of its own fails instead of blocking */
            b->fd = -1;
            if (sent == (ssize_t)(sizeof quit - 1)) {
                for (int i = 0; i < 200; i++) {
                    pid_t r = waitpid(b->pid, &ws, WNOHANG);
                    if (r == b->pid || (r < 0 && errno != EINTR)) {
                        b->pid = 0;
                        break;
                    }
                    sleep_ms(10);
                }
            }
        }
        if (b->pid > 0) {
            pid_t r = waitpid(b->pid, &ws, WNOHANG); /* it may have exited already */
            if (r == 0) {
                kill(b->pid, SIGKILL);
                while (waitpid(b->pid, &ws, 0) < 0 && errno == EINTR) {
                }
            }
        }
    }
    b->pid = 0;
    if (b->fd >= 0) close(b->fd);
    b->fd = -1;
    b->rlen = 0;
    b->busy = 0;
    b->cancel_sent = 0;
    return ws;
}

/* A protocol failure: end the child, set the message (with how the child ended and its last
 * stderr line when there is one). */
static lmx_status broken(lmx_bridge *b, lmx_err *err, const char *what) {
    int ws = end_child(b, 0);
    char how[64] = "", tail[512];
    if (ws != -1 && WIFEXITED(ws)) snprintf(how, sizeof how, " (exit status %d)", WEXITSTATUS(ws));
    else if (ws != -1 && WIFSIGNALED(ws)) snprintf(how, sizeof how, " (signal %d)", WTERMSIG(ws));
    stderr_tail(b, tail, sizeof tail);
    return lmx_err_set(err, LMX_ERR_BACKEND, "mlx_lm bridge: %s%s%s%s", what, how, tail[0] ? ": " : "", tail);
}

static lmx_status send_line(lmx_bridge *b, cJSON *req, lmx_err *err) {
    char *s = cJSON_PrintUnformatted(req);
    if (!s) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    size_t n = strlen(s);
    s[n] = '\n'; /* cJSON's buffer has the NUL's byte: the newline takes it */
    const char *c = s;
    size_t left = n + 1;
    while (left) {
        ssize_t w = send(b->fd, c, left, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            free(s);
            return broken(b, err, "the child process is gone");
        }
        c += w;
        left -= (size_t)w;
    }
    free(s);
    return LMX_OK;
}

/* Read one reply line (NUL-terminated, in b->rbuf; *used = bytes to consume after parsing).
 * While waiting, a set cancel flag sends the child a cancel request (once per generation). */
static lmx_status read_line(lmx_bridge *b, atomic_int *cancel, int timeout_ms, size_t *used, lmx_err *err) {
    double deadline = lmx_now_ms() + timeout_ms;
    for (;;) {
        char *nl = b->rlen ? memchr(b->rbuf, '\n', b->rlen) : NULL;
        if (nl) {
            *nl = 0;
            *used = (size_t)(nl - b->rbuf) + 1;
            return LMX_OK;
        }
        if (b->rlen >= LINE_MAX_BYTES) return broken(b, err, "a reply line is too long");
        if (cancel && b->busy && !b->cancel_sent && atomic_load(cancel)) {
            static const char msg[] = "{\"op\": \"cancel\"}\n";
            if (send(b->fd, msg, sizeof msg - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof msg - 1))
                return broken(b, err, "the child process is gone");
            b->cancel_sent = 1;
        }
        double left = deadline - lmx_now_ms();
        if (left <= 0) return broken(b, err, "no reply within the timeout (LMX_MLX_LM_TIMEOUT_MS)");
        struct pollfd pfd = {.fd = b->fd, .events = POLLIN};
        int r = poll(&pfd, 1, left < 50 ? (int)left + 1 : 50); /* wakes to look at the cancel flag */
        if (r < 0 && errno != EINTR) return broken(b, err, "poll failed");
        if (r <= 0) continue;
        if (b->rcap - b->rlen < 4096) {
            size_t cap = b->rcap ? b->rcap * 2 : 65536;
            char *p = realloc(b->rbuf, cap);
            if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
            b->rbuf = p;
            b->rcap = cap;
        }
        ssize_t n = read(b->fd, b->rbuf + b->rlen, b->rcap - b->rlen - 1);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return broken(b, err, "the child process exited");
        b->rlen += (size_t)n;
    }
}

static void consume(lmx_bridge *b, size_t used) {
    memmove(b->rbuf, b->rbuf + used, b->rlen - used);
    b->rlen -= used;
}

/* Read one reply and parse it: a JSON object with a string "type"; NULL with err set otherwise. */
static cJSON *read_reply(lmx_bridge *b, atomic_int *cancel, int timeout_ms, lmx_err *err) {
    size_t used = 0;
    if (read_line(b, cancel, timeout_ms, &used, err)) return NULL;
    cJSON *j = cJSON_Parse(b->rbuf);
    consume(b, used);
    if (!j || !cJSON_IsObject(j) || !cJSON_IsString(cJSON_GetObjectItem(j, "type"))) {
        cJSON_Delete(j);
        broken(b, err, "a malformed reply");
        return NULL;
    }
    return j;
}

/* An error reply into err (the child stays: it answered). */
static lmx_status error_reply(lmx_bridge *b, const cJSON *r, lmx_err *err) {
    const char *msg = lmx_json_str(r, "message"), *missing = lmx_json_str(r, "missing");
    if (missing) {
        end_child(b, 0);
        return lmx_err_set(err, LMX_ERR_BACKEND, "the mlx_lm backend needs the Python package %s for %s (%s): %s",
                           missing, b->python, msg ? msg : "not installed", INSTALL_HINT);
    }
    return lmx_err_set(err, LMX_ERR_BACKEND, "mlx_lm: %s", msg ? msg : "an error without a message");
}

static void take_info(lmx_bridge *b, const cJSON *in) {
    lmx_model_info *o = &b->info;
    snprintf(b->arch, sizeof b->arch, "%s", lmx_json_str(in, "architecture") ? lmx_json_str(in, "architecture") : "unknown");
    snprintf(b->dtype, sizeof b->dtype, "%s", lmx_json_str(in, "dtype") ? lmx_json_str(in, "dtype") : "mlx");
    o->n_layers = (int)lmx_json_num(in, "n_layers", 0);
    o->hidden_size = (int)lmx_json_num(in, "hidden_size", 0);
    o->n_heads = (int)lmx_json_num(in, "n_heads", 0);
    o->n_kv_heads = (int)lmx_json_num(in, "n_kv_heads", 0);
    o->head_dim = (int)lmx_json_num(in, "head_dim", 0);
    if (!o->head_dim && o->n_heads) o->head_dim = o->hidden_size / o->n_heads;
    o->ffn_size = (int)lmx_json_num(in, "ffn_size", 0);
    o->vocab_size = (int)lmx_json_num(in, "vocab_size", 0);
    o->max_context = (int)lmx_json_num(in, "max_context", 0);
    o->n_params = (int64_t)lmx_json_num(in, "n_params", 0);
    o->bos_id = (int32_t)lmx_json_num(in, "bos_id", -1);
    const cJSON *eos = cJSON_GetObjectItem(in, "eos_ids"), *e;
    o->n_eos = 0;
    cJSON_ArrayForEach(e, eos) if (cJSON_IsNumber(e) && o->n_eos < 8) o->eos_ids[o->n_eos++] = (int32_t)e->valuedouble;
}

/* Start the child and load the model in it. */
static lmx_status start(lmx_bridge *b, lmx_err *err) {
    lmx_status st = ensure_script(b, err);
    if (st) return st;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
        return lmx_err_set(err, LMX_ERR_BACKEND, "socketpair: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 0);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 1);
    if (b->errfd >= 0) {
        if (ftruncate(b->errfd, 0) == 0) lseek(b->errfd, 0, SEEK_SET);
        posix_spawn_file_actions_adddup2(&fa, b->errfd, 2);
    }
    char *argv[] = {b->python, "-u", b->script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, b->python, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    if (rc) {
        close(sv[0]);
        if (rc == ENOENT)
            return lmx_err_set(err, LMX_ERR_BACKEND,
                               "the mlx_lm backend needs Python 3: %s not found (install python3, or set LMX_PYTHON "
                               "to an interpreter), then %s", b->python, INSTALL_HINT);
        return lmx_err_set(err, LMX_ERR_BACKEND, "cannot start %s: %s", b->python, strerror(rc));
    }
    b->pid = pid;
    b->fd = sv[0];
    b->rlen = 0;
    b->busy = 0;
    cJSON *req = cJSON_CreateObject();
    if (!req || !cJSON_AddStringToObject(req, "op", "load") || !cJSON_AddStringToObject(req, "path", b->path) ||
        !(b->adapter ? cJSON_AddStringToObject(req, "adapter", b->adapter) : cJSON_AddNullToObject(req, "adapter"))) {
        cJSON_Delete(req);
        end_child(b, 0);
        return lmx_err_set(err, LMX_ERR_NOMEM, "out of memory");
    }
    st = send_line(b, req, err);
    cJSON_Delete(req);
    if (st) return st;
    cJSON *r = read_reply(b, NULL, b->timeout_ms * 2, err);
    if (!r) {
        if (strstr(err->msg, "exit status 127"))
            lmx_err_prefix(err, "the mlx_lm backend needs Python 3 (%s) and %s", b->python, INSTALL_HINT);
        return err->status;
    }
    const char *type = lmx_json_str(r, "type");
    const cJSON *info = cJSON_GetObjectItem(r, "info");
    if (!strcmp(type, "error")) {
        st = error_reply(b, r, err);
        end_child(b, 0);
        lmx_err_prefix(err, "%s", b->path);
    } else if (!strcmp(type, "done") && cJSON_IsObject(info)) {
        take_info(b, info);
    } else {
        st = broken(b, err, "a reply to load that is not done with info");
    }
    cJSON_Delete(r);
    return st;
}

/* ---- the model ------------------------------------------------------------------------------ */

lmx_status lmx_bridge_model_load(const char *path, const lmx_load_params *p, lmx_model **out) {
    lmx_model *m = calloc(1, sizeof *m);
    lmx_bridge *b = calloc(1, sizeof *b);
    lmx_backend *be = calloc(1, sizeof *be);
    lmx_status st;
    lmx_err err = {0};
    *out = NULL;
    if (!m || !b || !be) {
        free(m), free(b), free(be);
        st = lmx_err_set(&err, LMX_ERR_NOMEM, "out of memory");
        lmx_set_thread_error(&err);
        return st;
    }
    be->ops = &stub_ops;
    m->be = be;
    m->bridge = b;
    b->fd = b->errfd = -1;
    const char *py = getenv("LMX_PYTHON"), *to = getenv("LMX_MLX_LM_TIMEOUT_MS");
    b->timeout_ms = to && atoi(to) > 0 ? atoi(to) : 300000;
    b->python = strdup(py && *py ? py : "python3");
    b->path = path ? strdup(path) : NULL;
    b->adapter = p->adapter ? strdup(p->adapter) : NULL;
    if (!path) {
        st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the model path is NULL");
        goto fail;
    }
    if (!b->python || !b->path || (p->adapter && !b->adapter)) {
        st = lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (p->n_ctx < 0) {
        st = lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "context length %d is negative", p->n_ctx);
        goto fail;
    }
    if ((st = lmx_runtime_create(m, path, p))) goto fail;
    if ((st = start(b, &m->err))) goto fail;
    m->cfg.vocab = b->info.vocab_size;
    *out = m;
    return LMX_OK;
fail:
    lmx_set_thread_error(&m->err);
    lmx_model_free(m);
    return st;
}

void lmx_bridge_free(lmx_bridge *b) {
    if (!b) return;
    end_child(b, 1);
    if (b->script[0]) unlink(b->script);
    if (b->errfd >= 0) close(b->errfd);
    free(b->rbuf);
    free(b->path);
    free(b->adapter);
    free(b->python);
    free(b);
}

lmx_status lmx_bridge_get_info(const lmx_model *m, lmx_model_info *out) {
    const lmx_bridge *b = m->bridge;
    *out = b->info;
    out->architecture = b->arch;
    out->backend = LMX_BRIDGE_BACKEND;
    out->dtype = b->dtype;
    out->n_ctx = m->rt ? m->rt->n_ctx : 0;
    out->memory_bytes = m->be->mem_now;
    out->peak_memory_bytes = m->be->mem_peak;
    return LMX_OK;
}

long lmx_bridge_child_pid(const lmx_model *m) {
    return m && m->bridge ? (long)m->bridge->pid : 0;
}

/* ---- generation -------------------------------------------------------------------------------- */

/* The request line of a generation: msgs (lmx_messages_json's array, taken over) for chat, else the
 * prompt or its ids. */
static cJSON *gen_request(lmx_model *m, const char *prompt, const int32_t *ids, cJSON *msgs, int n,
                          const lmx_gen_params *p) {
    cJSON *r = cJSON_CreateObject();
    if (!r) {
        cJSON_Delete(msgs);
        return NULL;
    }
    int ok = 1;
    if (msgs) {
        cJSON_AddItemToObject(r, "messages", msgs);
        ok = cJSON_AddStringToObject(r, "op", "chat") != NULL;
    } else {
        ok = cJSON_AddStringToObject(r, "op", "generate") != NULL;
        if (prompt) ok = ok && cJSON_AddStringToObject(r, "prompt", prompt);
        else ok = ok && cJSON_AddItemToObject(r, "ids", cJSON_CreateIntArray((const int *)ids, n));
    }
    const lmx_sampler_params *s = &p->sampler;
    ok = ok && cJSON_AddNumberToObject(r, "max_tokens", p->max_tokens) &&
         cJSON_AddNumberToObject(r, "temperature", s->temperature) && cJSON_AddNumberToObject(r, "top_k", s->top_k) &&
         cJSON_AddNumberToObject(r, "top_p", s->top_p) && cJSON_AddNumberToObject(r, "min_p", s->min_p) &&
         cJSON_AddNumberToObject(r, "repetition_penalty", s->repeat_penalty) &&
         cJSON_AddNumberToObject(r, "penalty_last_n", s->penalty_last_n < 0 ? 1 << 20 : s->penalty_last_n) &&
         cJSON_AddNumberToObject(r, "seed", (double)(s->seed >= 0 ? (uint64_t)s->seed : m->rt->seed)) &&
         cJSON_AddBoolToObject(r, "ignore_eos", p->ignore_eos);
    if (ok && p->n_stop_ids > 0)
        ok = cJSON_AddItemToObject(r, "stop_ids", cJSON_CreateIntArray((const int *)p->stop_ids, p->n_stop_ids));
    if (ok && p->n_stop_strings > 0)
        ok = cJSON_AddItemToObject(r, "stop_strings", cJSON_CreateStringArray(p->stop_strings, p->n_stop_strings));
    if (!ok) {
        cJSON_Delete(r);
        return NULL;
    }
    return r;
}

lmx_status lmx_bridge_stream_open(lmx_model *m, const char *prompt, const int32_t *ids, const lmx_message *msgs,
                                  int n, const lmx_gen_params *params, lmx_stream **out) {
    lmx_bridge *b = m->bridge;
    lmx_runtime *rt = m->rt;
    lmx_stream *s = &rt->stream;
    lmx_gen_seq *g = &s->seq;
    double t0 = lmx_now_ms();
    lmx_gen_params dp = lmx_gen_default_params();
    const lmx_gen_params *p = params ? params : &dp;
    if (!prompt && !msgs && (!ids || n <= 0)) return lmx_err_set(&m->err, LMX_ERR_INVALID_ARG, "the prompt is empty");
    cJSON *msg_json = NULL;
    lmx_status st;
    if (msgs && (st = lmx_messages_json(m, msgs, n, &msg_json))) return st;
    if (p->adapter && p->adapter != LMX_NO_ADAPTER) {
        cJSON_Delete(msg_json);
        return lmx_err_set(&m->err, LMX_ERR_UNSUPPORTED, "the mlx_lm backend takes its adapter at load only");
    }
    if (b->busy) lmx_bridge_stream_stop(s); /* cannot happen through the API; be safe */
    if (b->pid <= 0 && (st = start(b, &m->err))) {
        cJSON_Delete(msg_json);
        return st; /* a fresh child after a failure */
    }
    cJSON *req = gen_request(m, prompt, ids, msg_json, n, p);
    if (!req) return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    st = send_line(b, req, &m->err);
    cJSON_Delete(req);
    if (st) return st;
    b->busy = 1;
    b->cancel_sent = 0;
    g->text.len = g->ids.len = g->emit.len = 0;
    size_t want = (size_t)(p->max_tokens > 0 && p->max_tokens < (1 << 16) ? p->max_tokens : 256) * sizeof(int32_t);
    if (lmx_buf_reserve(m->be, &g->ids, want) || lmx_buf_reserve(m->be, &g->text, 256) ||
        lmx_buf_reserve(m->be, &g->emit, 64)) {
        lmx_bridge_stream_stop(s);
        return lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
    }
    g->text.data[0] = g->emit.data[0] = 0;
    g->p = *p;
    g->index = 0;
    g->finish = LMX_FINISH_NONE;
    g->finish_id = -1;
    g->to_eval = -1;
    rt->metrics.prompt_tokens = ids && !prompt && !msgs ? n : 0;
    s->open = 1;
    s->started = 0;
    s->t_start = t0;
    s->t_first = 0;
    *out = s;
    return LMX_OK;
}

static lmx_finish finish_of(const char *name) {
    static const char *names[] = {"none", "eos", "stop_token", "stop_string", "length", "context", "callback", "cancelled"};
    for (int i = 0; name && i < (int)(sizeof names / sizeof names[0]); i++)
        if (!strcmp(name, names[i])) return (lmx_finish)i;
    return LMX_FINISH_NONE;
}

/* Read replies until a token to yield (returns 1), the done (0) or a failure (-1, m->err set).
 * discard: drop tokens (after a cancel). */
static int next_reply(lmx_model *m, lmx_stream *s, int discard) {
    lmx_bridge *b = m->bridge;
    lmx_gen_seq *g = &s->seq;
    for (;;) {
        cJSON *r = read_reply(b, &m->rt->cancel, b->timeout_ms, &m->err);
        if (!r) return -1;
        const char *type = lmx_json_str(r, "type");
        int ret = -2;
        if (!strcmp(type, "token")) {
            const char *text = lmx_json_str(r, "text");
            const cJSON *id = cJSON_GetObjectItem(r, "id");
            if (!cJSON_IsNumber(id) || !text) {
                broken(b, &m->err, "a malformed token reply");
                ret = -1;
            } else if (!discard && !b->cancel_sent) {
                int32_t v = (int32_t)id->valuedouble;
                size_t len = strlen(text);
                g->emit.len = 0; /* id -1: the held-back text at the end, as lmx_gen_seq_end yields it */
                if ((v >= 0 && lmx_buf_append(m->be, &g->ids, &v, sizeof v)) || lmx_buf_append(m->be, &g->text, text, len) ||
                    lmx_buf_append(m->be, &g->emit, text, len)) {
                    lmx_err_set(&m->err, LMX_ERR_NOMEM, "out of memory");
                    ret = -1;
                } else {
                    g->tok = (lmx_token){.id = v, .text = g->emit.data, .text_len = len, .index = g->index};
                    if (v >= 0) g->index++;
                    ret = 1;
                }
            }
        } else if (!strcmp(type, "done")) {
            b->busy = 0;
            lmx_finish f = finish_of(lmx_json_str(r, "finish"));
            if (g->finish == LMX_FINISH_NONE) g->finish = b->cancel_sent ? LMX_FINISH_CANCELLED : f;
            if (g->finish == LMX_FINISH_NONE) {
                broken(b, &m->err, "a done reply without a known finish reason");
                ret = -1;
            } else {
                if (g->finish == f) g->finish_id = (int32_t)lmx_json_num(r, "finish_id", -1);
                m->rt->metrics.prompt_tokens = (int)lmx_json_num(r, "prompt_tokens", m->rt->metrics.prompt_tokens);
                b->cancel_sent = 0;
                ret = 0;
            }
        } else if (!strcmp(type, "error")) {
            b->busy = 0;
            b->cancel_sent = 0;
            error_reply(b, r, &m->err);
            ret = -1;
        } else {
            broken(b, &m->err, "a reply of unknown type");
            ret = -1;
        }
        cJSON_Delete(r);
        if (ret != -2) return ret;
    }
}

lmx_status lmx_bridge_stream_next(lmx_stream *s, const lmx_token **tok) {
    lmx_model *m = s->m;
    lmx_bridge *b = m->bridge;
    lmx_gen_seq *g = &s->seq;
    int r = 0;
    if (b->busy && g->finish == LMX_FINISH_NONE && atomic_load(&m->rt->cancel)) g->finish = LMX_FINISH_CANCELLED;
    if (b->busy && g->finish != LMX_FINISH_NONE) { /* stopped by lmx_cancel or the caller (a token callback) */
        lmx_bridge_stream_stop(s);
    } else if (b->busy) {
        r = next_reply(m, s, 0);
        if (r < 0) {
            s->open = 0;
            lmx_status st = m->err.status ? m->err.status : LMX_ERR_BACKEND;
            return st;
        }
        if (r == 0) { /* the child prefills and decodes in one go: its first token ends the prefill */
            lmx_metrics *x = &m->rt->metrics;
            x->prefill_ms = (s->started ? s->t_first : lmx_now_ms()) - s->t_start;
            x->prefill_tokens_per_s = x->prefill_ms > 0 ? x->prompt_tokens / (x->prefill_ms * 1e-3) : 0;
        }
    }
    lmx_stream_emit(s, r, tok);
    return LMX_OK;
}

void lmx_bridge_stream_stop(lmx_stream *s) {
    lmx_model *m = s->m;
    lmx_bridge *b = m->bridge;
    if (!b->busy) return;
    if (!b->cancel_sent) {
        static const char msg[] = "{\"op\": \"cancel\"}\n";
        if (send(b->fd, msg, sizeof msg - 1, MSG_NOSIGNAL) != (ssize_t)(sizeof msg - 1)) {
            end_child(b, 0);
            return;
        }
        b->cancel_sent = 1;
    }
    lmx_err saved = m->err; /* stopping is not a failure of the call that stops */
    while (b->busy) {
        int r = next_reply(m, s, 1);
        if (r < 0) {
            end_child(b, 0); /* the next request starts a fresh child */
            break;
        }
    }
    m->err = saved;
}
