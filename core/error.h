/* Errors: every library function returns 0 or a negative TZ_E* code, and on failure leaves a
 * thread-local message with context ("nvme: short read of 1048576 at offset 8388608 in ...").
 * TZ_CHECK returns the code upward and logs file and line at each level (a pseudo-backtrace). */
#ifndef TZ_ERROR_H
#define TZ_ERROR_H

#include <stdarg.h>

enum {
  TZ_OK = 0,
  TZ_EINVAL = -1,     /* bad argument or input */
  TZ_ENOMEM = -2,     /* host allocation failed, or a tier's budget is exhausted */
  TZ_EIO = -3,        /* an I/O operation failed */
  TZ_ENOSPC = -4,     /* no space left on a device */
  TZ_ENOTSUP = -5,    /* the machine or build lacks what this needs */
  TZ_ECHECKSUM = -6,  /* data failed its integrity check */
  TZ_ETIMEDOUT = -7,  /* a wait ran past its limit */
  TZ_ECONFIG = -8,    /* a configuration value is wrong */
  TZ_ECUDA = -9,      /* a CUDA, cuBLAS or NCCL call failed */
  TZ_ECOMM = -10,     /* a collective or a peer rank failed */
  TZ_ENOENT = -11,    /* a file, key or object does not exist */
  TZ_EFORMAT = -12,   /* a file is malformed */
  TZ_EBUSY = -13,     /* the object is in use */
  TZ_ECANCELED = -14, /* the operation was abandoned (an earlier error, shutdown) */
  TZ_EEXIST = -15,    /* the object already exists */
  TZ_EPERM = -16,     /* not permitted */
  TZ_ERR_COUNT_ = 17
};

/* A short constant name for a code ("I/O error"). Never NULL. */
const char *tz_strerror(int rc);

/* The calling thread's last error message, or "" if none. Valid until the next tz_err_set. */
const char *tz_err_msg(void);

/* Sets the thread's message from a printf format and returns rc, so that
 * `return tz_err_set(TZ_EIO, "nvme: ...", ...);` reads as one statement. */
int tz_err_set(int rc, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tz_err_setv(int rc, const char *fmt, va_list ap);

/* Like tz_err_set, with ": <strerror(errnum)>" appended; returns the TZ_E* code for errnum. */
int tz_err_errno(int errnum, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The TZ_E* code closest to a positive errno value. */
int tz_err_from_errno(int errnum);

void tz_err_clear(void);

/* Logs "file:line: call failed: <code>" at debug level; the trail TZ_CHECK leaves. */
void tz_err_trace(const char *file, int line, const char *expr, int rc);

#define TZ_CHECK(call)                                                                             \
  do {                                                                                             \
    int tz_rc_ = (call);                                                                           \
    if (tz_rc_ < 0) {                                                                              \
      tz_err_trace(__FILE__, __LINE__, #call, tz_rc_);                                             \
      return tz_rc_;                                                                               \
    }                                                                                              \
  } while (0)

#define TZ_CHECK_GOTO(call, rc, label)                                                             \
  do {                                                                                             \
    (rc) = (call);                                                                                 \
    if ((rc) < 0) {                                                                                \
      tz_err_trace(__FILE__, __LINE__, #call, (rc));                                               \
      goto label;                                                                                  \
    }                                                                                              \
  } while (0)

#endif
