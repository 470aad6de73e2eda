/* Fences: the completion of one piece of work submitted to a lane (DESIGN.md). A fence is
 * reference counted; whoever gets one from a function owns one reference and drops it with
 * tz_fence_release. Waiting on a fence is the only way one lane waits for another. */
#ifndef TZ_FENCE_H
#define TZ_FENCE_H

#include <stdint.h>

typedef struct tz_fence tz_fence;

/* A pending fence completed by tz_fence_signal. NULL when out of memory. */
tz_fence *tz_fence_create(void);
/* A fence that is already complete with status rc (0 or a negative TZ_E* code). */
tz_fence *tz_fence_completed(int rc);

tz_fence *tz_fence_retain(tz_fence *f);
void tz_fence_release(tz_fence *f); /* NULL is a no-op */

/* Completes f with status rc and runs its callbacks on this thread. Signalling twice is a bug. */
void tz_fence_signal(tz_fence *f, int rc);
/* The same, with the message a waiter gets as its thread's error message when rc < 0 (the
 * signalling thread is often not the waiting one). */
void tz_fence_signal_msg(tz_fence *f, int rc, const char *msg);

/* 1 complete and ok, 0 pending, negative: complete with that error. Never blocks. */
int tz_fence_query(tz_fence *f);

/* Waits on the host until f completes or timeout_ns passes (negative: no limit).
 * Returns f's status (and on error sets this thread's message to the fence's), or TZ_ETIMEDOUT. */
int tz_fence_wait(tz_fence *f, int64_t timeout_ns);

/* Runs fn(arg, status) once f completes: at once on this thread if it already has, otherwise on
 * the thread that signals it. Callbacks run in the order they were added: one added while the
 * signalling thread still runs earlier ones runs there, after them. fn must not block.
 * Returns TZ_ENOMEM if it cannot be recorded. */
int tz_fence_then(tz_fence *f, void (*fn)(void *arg, int rc), void *arg);

/* A fence that completes when every one of fs[0..n) has; its status is the first error among them.
 * NULL entries count as complete. */
tz_fence *tz_fence_all(tz_fence *const *fs, int n);

/* Backend-side fences, completed by polling (a CUDA event): the progress engine calls
 * ops->poll(ctx) until it returns non-zero (1 done, negative error), then signals the fence and
 * calls ops->destroy(ctx). native() hands the backend object back to its own backend (the event
 * that cudaStreamWaitEvent needs); other backends ignore it. */
struct tz_fence_poll_ops {
  const char *kind;           /* "cuda-event" */
  int (*poll)(void *ctx);     /* 1 done, 0 pending, negative: failed */
  void (*destroy)(void *ctx); /* optional: NULL means nothing to free */
};
typedef struct tz_progress tz_progress;
tz_fence *tz_fence_create_polled(tz_progress *pe, const struct tz_fence_poll_ops *ops, void *ctx);
/* The backend object of a polled fence whose ops are `ops`, or NULL (another kind, or done).
 * For a fence that forwards another (below), the object of the fence it forwards, for as long as
 * f is pending: f holds a reference to it, so the object stays valid (a CUDA event that has
 * completed since is still a valid, and then trivial, thing to wait on). */
void *tz_fence_native(tz_fence *f, const struct tz_fence_poll_ops *ops);

/* Declares that f completes exactly when inner does, with inner's status, and only host
 * bookkeeping in between (a transfer's fence around the copy's event). Then tz_fence_native(f)
 * is inner's, so a device lane can wait on f without the host. f keeps a reference to inner.
 * Call it once, before f is handed to anyone. */
void tz_fence_forward(tz_fence *f, tz_fence *inner);

#endif
