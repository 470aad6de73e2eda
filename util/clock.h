/* Monotonic clocks: the one time base every lane, meter, deadline and progress bar reads. */
#ifndef TZ_UTIL_CLOCK_H
#define TZ_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds of CLOCK_MONOTONIC: never goes back, unaffected by changes of the wall clock.
 * Inline: lanes and the scheduler read it on every operation. */
static inline uint64_t tz_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The same clock in seconds, for deadlines and timings printed to people. */
static inline double tz_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The moment ns nanoseconds from now on clock, as pthread_cond_timedwait takes it: CLOCK_MONOTONIC
 * for a condition variable made with pthread_condattr_setclock, CLOCK_REALTIME for a default one.
 */
static inline struct timespec tz_deadline(clockid_t clock, uint64_t ns) {
  struct timespec t;
  clock_gettime(clock, &t);
  uint64_t n = (uint64_t)t.tv_nsec + ns;
  t.tv_sec += (time_t)(n / 1000000000ull);
  t.tv_nsec = (long)(n % 1000000000ull);
  return t;
}

#endif
