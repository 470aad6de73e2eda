#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char err_msg[1024];

static const char *const err_names[TZ_ERR_COUNT_] = {
    [0] = "success",
    [-TZ_EINVAL] = "invalid argument",
    [-TZ_ENOMEM] = "out of memory",
    [-TZ_EIO] = "I/O error",
    [-TZ_ENOSPC] = "no space left on device",
    [-TZ_ENOTSUP] = "not supported here",
    [-TZ_ECHECKSUM] = "checksum mismatch",
    [-TZ_ETIMEDOUT] = "timed out",
    [-TZ_ECONFIG] = "bad configuration",
    [-TZ_ECUDA] = "CUDA error",
    [-TZ_ECOMM] = "communication error",
    [-TZ_ENOENT] = "not found",
    [-TZ_EFORMAT] = "malformed file",
    [-TZ_EBUSY] = "busy",
    [-TZ_ECANCELED] = "canceled",
    [-TZ_EEXIST] = "already exists",
    [-TZ_EPERM] = "not permitted",
};

const char *tz_strerror(int rc) {
  if (rc > 0 || rc <= -TZ_ERR_COUNT_)
    return "unknown error";
  return err_names[-rc];
}

const char *tz_err_msg(void) { return err_msg; }

void tz_err_clear(void) { err_msg[0] = '\0'; }

int tz_err_setv(int rc, const char *fmt, va_list ap) {
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  return rc;
}

int tz_err_set(int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  tz_err_setv(rc, fmt, ap);
  va_end(ap);
  return rc;
}

int tz_err_from_errno(int e) {
  switch (e) {
  case 0: return TZ_OK;
  case ENOMEM: return TZ_ENOMEM;
  case ENOSPC:
  case EDQUOT: return TZ_ENOSPC;
  case EINVAL: return TZ_EINVAL;
  case ENOENT: return TZ_ENOENT;
  case EEXIST: return TZ_EEXIST;
  case EPERM:
  case EACCES: return TZ_EPERM;
  case EBUSY: return TZ_EBUSY;
  case ETIMEDOUT: return TZ_ETIMEDOUT;
  case ENOSYS:
  case EOPNOTSUPP: return TZ_ENOTSUP;
  case ECANCELED: return TZ_ECANCELED;
  default: return TZ_EIO;
  }
}

int tz_err_errno(int errnum, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err_msg, sizeof err_msg, fmt, ap);
  va_end(ap);
  size_t n = strlen(err_msg);
  snprintf(err_msg + n, sizeof err_msg - n, ": %s", strerror(errnum));
  return tz_err_from_errno(errnum);
}

void tz_err_trace(const char *file, int line, const char *expr, int rc) {
  tz_log(TZ_LOG_DEBUG, "%s:%d: %s: %s", file, line, expr, tz_strerror(rc));
}
