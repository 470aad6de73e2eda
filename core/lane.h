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
typedef struct tz_tier tz_tier;

/* A CPU lane: one thread of its own. Jobs run one after the other in submission order. */
int tz_lane_create_cpu(const char *name, tz_lane **out);
/* A lane on the device behind tier t, made by t's backend (the registry in registry/lanes.c; an hbm
 * tier gives a CUDA-stream lane of its GPU, tiers/hbm.h). native NULL gives the lane a stream of
 * its own; else the lane runs on native (a cudaStream_t of that GPU), which stays the caller's and
 * must outlive the lane: work others enqueue on it (a comm's collectives) is then ordered with the
 * lane's by the stream itself. name NULL is the backend's default ("compute:<device>"). t must
 * outlive the lane; *out is the caller's (tz_lane_destroy). TZ_ENOTSUP when t's backend has no
 * device lanes (a host tier: use tz_lane_create_cpu). */
int tz_lane_create_device(tz_tier *t, void *native, const char *name, tz_lane **out);
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
/* *out (owned by the caller) completes when everything submitted to l so far has, waits included.
 */
int tz_lane_record(tz_lane *l, tz_fence **out);
/* Work submitted to `to` after this call starts only after everything submitted to `from` so far
 * has completed: tz_lane_record on from and tz_lane_wait on to, or, where both lanes are of one
 * backend that can order them itself (two CUDA streams: an event recorded on one that the other
 * waits for), that alone, with no host fence and no wait measured on `to`. */
int tz_lane_order(tz_lane *from, tz_lane *to);

/* Timing marks: n points recorded in a lane's work, the time between two of them read once the
 * lane has passed both (a CUDA lane times them with events on its stream). For measuring what
 * part of a lane's time some of its work took. Made once, reused: marking allocates nothing. */
typedef struct tz_lane_timer tz_lane_timer;
/* TZ_ENOTSUP when the lane cannot time its work (a CPU lane: time it on the host instead).
 * *out is the caller's and is destroyed before the lane. */
int tz_lane_timer_create(tz_lane *l, int n, tz_lane_timer **out);
/* Records mark i (0 <= i < n) at the end of the work submitted to the lane so far; marking i again
 * moves it. */
int tz_lane_timer_mark(tz_lane_timer *t, int i);
/* *seconds from mark i to mark j, both recorded and passed by the lane; a negative code (and
 * *seconds 0) when either is not. */
int tz_lane_timer_elapsed(tz_lane_timer *t, int i, int j, double *seconds);
void tz_lane_timer_destroy(tz_lane_timer *t); /* NULL is a no-op */

struct tz_lane_stats {
  double busy_s;  /* time spent running jobs */
  double stall_s; /* sum of tz_lane_wait's stall_ns */
  uint64_t jobs, waits;
};
void tz_lane_stats(const tz_lane *l, struct tz_lane_stats *out);

/* Test hook: each job first sleeps a random 0..max_us microseconds. */
void tz_lane_set_jitter(tz_lane *l, int max_us, uint64_t seed);

#endif
