/* Functions core files share with each other and with backends, but not with clients. */
#ifndef TZ_INTERNAL_H
#define TZ_INTERNAL_H

#include <stdint.h>

#include "core/fence.h"
#include "core/progress.h"
/* Kept for the files that took tz_now_ns and tz_crc32c from here; new code includes these. */
#include "util/clock.h"
#include "util/crc32c.h"

/* progress.c: polls f's ops until done, then signals f and drops the engine's reference. */
int tz_progress_watch(tz_progress *pe, tz_fence *f);
/* fence.c: the poll ops and ctx of a polled fence, for the engine. */
int tz_fence_poll_once(tz_fence *f);

#endif
