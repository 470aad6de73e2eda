/* Logging to stderr with levels. TZ_LOG=error|warn|info|debug|trace (default warn) is read once. */
#ifndef TZ_LOG_H
#define TZ_LOG_H

enum tz_log_level { TZ_LOG_ERROR, TZ_LOG_WARN, TZ_LOG_INFO, TZ_LOG_DEBUG, TZ_LOG_TRACE };

void tz_log(enum tz_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tz_log_enabled(enum tz_log_level level);
/* Overrides TZ_LOG (a program's --verbose, say). */
void tz_log_set_level(enum tz_log_level level);

#define TZ_LOG_ERR(...) tz_log(TZ_LOG_ERROR, __VA_ARGS__)
#define TZ_WARN(...) tz_log(TZ_LOG_WARN, __VA_ARGS__)
#define TZ_INFO(...) tz_log(TZ_LOG_INFO, __VA_ARGS__)
#define TZ_DEBUG(...)                                                                              \
  do {                                                                                             \
    if (tz_log_enabled(TZ_LOG_DEBUG))                                                              \
      tz_log(TZ_LOG_DEBUG, __VA_ARGS__);                                                           \
  } while (0)

#endif
