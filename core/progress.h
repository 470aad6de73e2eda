/* The progress engine (DESIGN.md): one thread per rank that owns every lane's completions. It
 * reaps io_uring completions, polls CUDA events and runs each transfer's next stage from the
 * completion callbacks. Lanes register a poller; the engine sleeps on an eventfd when no poller has
 * work in flight, and spins gently (a short sleep that backs off) when one does. */
#ifndef TZ_PROGRESS_H
#define TZ_PROGRESS_H

#include <stdint.h>

typedef struct tz_progress tz_progress;

/* Returns the number of completions it handled (0 if none), or a negative error, which is logged
 * and then ignored: a poller reports its failures through the fences of its operations. */
typedef int (*tz_poll_fn)(void *ctx);

int tz_progress_create(tz_progress **out); /* starts the thread */
void tz_progress_destroy(tz_progress *pe); /* stops and joins it; NULL is a no-op */

/* Registers a poller. wake_fd >= 0: an fd that becomes readable when the poller has completions
 * (an io_uring's registered eventfd); the engine then need not spin for it. The engine keeps
 * polling a poller while tz_progress_busy has been raised for it. */
int tz_progress_add(tz_progress *pe, tz_poll_fn fn, void *ctx, int wake_fd);
void tz_progress_remove(tz_progress *pe, tz_poll_fn fn, void *ctx);

/* Work in flight that needs polling goes up with busy(+1) and down with busy(-1). */
void tz_progress_busy(tz_progress *pe, int delta);
/* Wakes the engine thread at once. */
void tz_progress_kick(tz_progress *pe);

/* Test hook: jitter mode. With max_us > 0 the engine sleeps a random 0..max_us before each round.
 */
void tz_progress_set_jitter(tz_progress *pe, int max_us, uint64_t seed);

#endif
