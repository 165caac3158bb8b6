/* threadpool.h - a fixed pool of worker threads running one parallel-for at a time.
 *
 * The calling thread takes part as worker 0, so a pool of n threads starts n - 1 pthreads.
 * lmx_pool_run blocks until every task has finished.  One pool serves one caller at a time. */
#ifndef LMX_BASE_THREADPOOL_H
#define LMX_BASE_THREADPOOL_H

#include "status.h"

typedef struct lmx_pool lmx_pool;

/* task: index in [0, n_tasks); thread: worker index in [0, lmx_pool_size(p)). */
typedef void (*lmx_pool_fn)(void *arg, int task, int thread);

lmx_status lmx_pool_create(int n_threads, lmx_pool **out, lmx_err *err);
void lmx_pool_free(lmx_pool *p);
int lmx_pool_size(const lmx_pool *p);
void lmx_pool_run(lmx_pool *p, int n_tasks, lmx_pool_fn fn, void *arg);

/* Number of online CPUs (at least 1). */
int lmx_cpu_count(void);

#endif
