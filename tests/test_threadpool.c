/* test_threadpool.c - every task of every job runs exactly once, for back-to-back jobs (the
 * spinning path), jobs after an idle pause (the sleeping path), and pools of 1..4 threads. */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "base/threadpool.h"
#include "check.h"

#define MAX_TASKS 257

typedef struct job {
    atomic_int hits[MAX_TASKS];
    atomic_int bad_thread;
    int n_threads;
} job;

static void count_task(void *arg, int task, int thread) {
    job *j = arg;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= j->n_threads) atomic_store(&j->bad_thread, 1);
}

static int run_and_check(lmx_pool *p, job *j, int n_tasks) {
    for (int t = 0; t < MAX_TASKS; t++) atomic_store(&j->hits[t], 0);
    lmx_pool_run(p, n_tasks, count_task, j);
    for (int t = 0; t < MAX_TASKS; t++)
        if (atomic_load(&j->hits[t]) != (t < n_tasks)) return 0;
    return 1;
}

int main(void) {
    for (int n = 1; n <= 4; n++) {
        lmx_pool *p = NULL;
        lmx_err err = {0};
        CHECK(lmx_pool_create(n, &p, &err) == LMX_OK);
        if (!p) continue;
        CHECK(lmx_pool_size(p) == n);
        job *j = calloc(1, sizeof *j);
        j->n_threads = n;
        int ok = 1;
        unsigned seed = 7;
        for (int r = 0; r < 3000; r++) { /* back to back: workers never get to sleep */
            seed = seed * 1103515245u + 12345u;
            ok &= run_and_check(p, j, 1 + (int)(seed >> 8) % MAX_TASKS);
        }
        CHECK_MSG(ok, "pool of %d: a task ran zero or several times", n);
        for (int r = 0; r < 3; r++) { /* after a pause long enough for workers to sleep */
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            CHECK(run_and_check(p, j, 64));
        }
        lmx_pool_run(p, 0, count_task, j); /* no tasks: returns at once */
        CHECK(!atomic_load(&j->bad_thread));
        free(j);
        lmx_pool_free(p);
    }
    lmx_pool_free(NULL);
    CHECK(lmx_cpu_count() >= 1);
    return check_summary("test_threadpool");
}
