/* threadpool.c - fixed worker pool; each lmx_pool_run is one parallel-for.
 *
 * Tasks are handed out through an atomic counter, so uneven tasks balance themselves.  A new
 * generation number starts the workers; a pending count tells the caller when all are done.
 * Decode dispatches a few hundred small jobs per token, so both sides spin briefly on those
 * atomics before sleeping on a condition variable (the sleep/wake path is what costs). */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

#define SPIN_ITERS 20000  /* about 0.1-0.5 ms of pause instructions before sleeping */

struct lmx_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;      /* workers wait here for a new generation */
    pthread_cond_t done;      /* the caller waits here for pending == 0 */
    atomic_uint generation;   /* bumped (under mu) to start a job */
    atomic_int pending;       /* workers still inside the current generation */
    atomic_int stop;
    /* the current job */
    lmx_pool_fn fn;
    void *arg;
    int n_tasks;
    atomic_int next_task;
};

typedef struct worker_arg {
    lmx_pool *pool;
    int index;
} worker_arg;

static void run_tasks(lmx_pool *p, int thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&p->next_task, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->arg, t, thread);
    }
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    lmx_pool *p = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        for (int spin = 0; (g = atomic_load(&p->generation)) == seen && !atomic_load(&p->stop); spin++) {
            if (spin < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&p->mu); /* generation changes under mu: no lost wake-up */
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) break;
        seen = g;
        run_tasks(p, index);
        if (atomic_fetch_sub(&p->pending, 1) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int lmx_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : (int)n;
}

lmx_status lmx_pool_create(int n_threads, lmx_pool **out, lmx_err *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = lmx_cpu_count();
    lmx_pool *p = calloc(1, sizeof *p);
    if (!p) return lmx_err_set(err, LMX_ERR_NOMEM, "thread pool: out of memory");
    p->n_threads = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) {
            lmx_pool_free(p);
            return lmx_err_set(err, LMX_ERR_NOMEM, "thread pool: out of memory");
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) *wa = (worker_arg){p, i};
        if (!wa || pthread_create(&p->threads[i - 1], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i; /* only the threads started so far get joined */
            lmx_pool_free(p);
            return lmx_err_set(err, LMX_ERR_BACKEND, "thread pool: cannot start thread %d", i);
        }
    }
    *out = p;
    return LMX_OK;
}

void lmx_pool_free(lmx_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int lmx_pool_size(const lmx_pool *p) { return p ? p->n_threads : 1; }

void lmx_pool_run(lmx_pool *p, int n_tasks, lmx_pool_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store(&p->next_task, 0);
    atomic_store(&p->pending, p->n_threads - 1);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->generation, 1); /* publishes the job fields above */
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);

    run_tasks(p, 0);

    for (int spin = 0; atomic_load(&p->pending) > 0 && spin < SPIN_ITERS; spin++) cpu_relax();
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}
