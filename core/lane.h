/* Lanes that do work (DESIGN.md): an in-order queue whose work waits on fences, never on the host.
 * A CPU lane is a thread that really runs concurrently with the caller; a GPU lane (a CUDA stream,
 * from the GPU backend) has the same interface behind its own ops table, so the scheduler holds a
 * tz_lane and never knows which it is.
 *
 * A lane is fed by one thread at a time (the client's); its work completes on other threads.
 * An error poisons a lane: once a fence it waited on has failed, or a job of it has, every later
 * job is skipped and every later fence completes with that first error. */
#ifndef TZ_LANE_H
#define TZ_LANE_H

#include <stdint.h>

#include "core/fence.h"

typedef struct tz_lane tz_lane;

/* A CPU lane: one thread of its own. Jobs run one after the other in submission order. */
int tz_lane_create_cpu(const char *name, tz_lane **out);
/* Waits (on the host) for everything submitted, then frees the lane. NULL is a no-op. */
void tz_lane_destroy(tz_lane *l);

const char *tz_lane_name(const tz_lane *l);
/* The backend's own handle (a cudaStream_t for a CUDA lane), or NULL for a CPU lane. */
void *tz_lane_native(tz_lane *l);

/* What a lane measured about one wait. The lane fills it before any fence recorded on the lane
 * after the wait completes, so a reader that has seen such a fence complete may read it. */
struct tz_lane_wait {
  uint64_t stall_ns; /* time the lane sat idle because f was late: from when the lane had finished
                        the work before the wait (or when the wait was made, if later) to f */
  uint64_t ready_ns; /* monotonic time (CLOCK_MONOTONIC ns) at which the lane could go on */
};

/* Work submitted to l after this call starts only after f completes. f is retained as needed;
 * the caller keeps its reference. info may be NULL. */
int tz_lane_wait(tz_lane *l, tz_fence *f, struct tz_lane_wait *info);
/* The same for several fences at once (NULL entries count as complete), measured as one wait.
 * A CUDA-stream lane waits on each fence's own event, so every one of them must be the fence of a
 * device copy or of a lane's record (or complete): a pending host fence is refused with TZ_EINVAL
 * before anything is enqueued. */
int tz_lane_wait_all(tz_lane *l, tz_fence *const *fs, int n, struct tz_lane_wait *info);
/* Queues fn(arg) on the lane. fn runs on the lane's thread and returns 0 or a negative TZ_E* code
 * with a message. TZ_ENOTSUP on lanes that run no host functions (the client launches its kernels
 * on tz_lane_native instead). */
int tz_lane_submit(tz_lane *l, int (*fn)(void *arg), void *arg);
/* *out (owned by the caller) completes when everything submitted to l so far has, waits included. */
int tz_lane_record(tz_lane *l, tz_fence **out);

struct tz_lane_stats {
  double busy_s;  /* time spent running jobs */
  double stall_s; /* sum of tz_lane_wait's stall_ns */
  uint64_t jobs, waits;
};
void tz_lane_stats(const tz_lane *l, struct tz_lane_stats *out);

/* Test hook: each job first sleeps a random 0..max_us microseconds. */
void tz_lane_set_jitter(tz_lane *l, int max_us, uint64_t seed);

#endif
