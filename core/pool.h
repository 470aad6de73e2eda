/* A CPU lane: a pool of threads that runs submitted jobs concurrently with the caller, in
 * submission order of start, each completing on a fence. */
#ifndef TZ_POOL_H
#define TZ_POOL_H

#include <stdint.h>

#include "core/fence.h"

typedef struct tz_pool tz_pool;

int tz_pool_create(int threads, const char *name, tz_pool **out);
/* Finishes the jobs already queued, then joins the threads. NULL is a no-op. */
void tz_pool_destroy(tz_pool *p);

/* Queues fn(arg); *done (owned by the caller, may be NULL if not wanted) completes with fn's
 * return value, and fn's thread-local error message when that is negative. */
int tz_pool_submit(tz_pool *p, int (*fn)(void *arg), void *arg, tz_fence **done);

/* Test hook: each job first sleeps a random 0..max_us microseconds. */
void tz_pool_set_jitter(tz_pool *p, int max_us, uint64_t seed);

#endif
