/* Functions core files share with each other and with backends, but not with clients. */
#ifndef TZ_INTERNAL_H
#define TZ_INTERNAL_H

#include <stdint.h>
#include <time.h>

#include "core/fence.h"
#include "core/progress.h"

/* progress.c: polls f's ops until done, then signals f and drops the engine's reference. */
int tz_progress_watch(tz_progress *pe, tz_fence *f);
/* fence.c: the poll ops and ctx of a polled fence, for the engine. */
int tz_fence_poll_once(tz_fence *f);

static inline uint64_t tz_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* crc32c (Castagnoli), hardware-accelerated where the CPU has SSE4.2. */
uint32_t tz_crc32c(uint32_t crc, const void *buf, size_t n);

#endif
