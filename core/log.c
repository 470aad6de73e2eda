#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int log_level = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

/* The one tunable read from the environment outside core/config.c, on purpose: messages are
 * logged before any configuration exists (the config's own parse warns), and the config cannot
 * serve the logger, which it logs through. The variable is TZ_LOG, the environment name of
 * tierzero.log, with the same level names; once a program has its configuration it sets the level
 * from that key (tz_log_set_level), so both readings agree. */
static void log_init(void) {
  const char *s = getenv("TZ_LOG");
  int level = TZ_LOG_WARN;
  if (s && *s) {
    for (int i = 0; i <= TZ_LOG_TRACE; i++)
      if (strcmp(s, level_names[i]) == 0)
        level = i;
  }
  if (__atomic_load_n(&log_level, __ATOMIC_RELAXED) < 0)
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
}

int tz_log_enabled(enum tz_log_level level) {
  pthread_once(&log_once, log_init);
  return (int)level <= __atomic_load_n(&log_level, __ATOMIC_RELAXED);
}

void tz_log_set_level(enum tz_log_level level) {
  pthread_once(&log_once, log_init);
  __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

void tz_log(enum tz_log_level level, const char *fmt, ...) {
  if (!tz_log_enabled(level))
    return;
  char line[2048];
  int n = snprintf(line, sizeof line, "tierzero %s: ", level_names[level]);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
  va_end(ap);
  /* One write per line so that lines from several threads do not interleave. */
  fprintf(stderr, "%s\n", line);
}
