/* The save path's file-system helpers and the paths of a checkpoint root. Every call of the save
 * path that changes something goes through util/file.h with the save's test hook (struct
 * tz_ckpt_hooks, served as struct tz_file_hooks by tz_ckpt_file_hooks): a test can kill the
 * process or fail with ENOSPC at a chosen operation. */
#define _GNU_SOURCE
#include "trainer/checkpoint/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The save's hook as util/file.h calls it: a data op is a write or an fsync. */
static int ckpt_before(void *ctx, enum tz_file_op op, const char *path) {
  (void)path;
  const struct tz_ckpt_hooks *h = ctx;
  return h->before_op ? h->before_op(h->ctx, op == TZ_FILE_WRITE || op == TZ_FILE_FSYNC) : 0;
}

const struct tz_file_hooks *tz_ckpt_file_hooks(const struct tz_ckpt_hooks *h,
                                               struct tz_file_hooks *out) {
  if (!h)
    return NULL;
  out->before = ckpt_before;
  out->ctx = (void *)h;
  return out;
}

/* Removes path and, for a directory, everything under it (symbolic links are removed, never
 * followed). 0 if it does not exist. */
int tz_ckpt_io_rm_tree(const struct tz_file_hooks *h, const char *path) {
  struct stat sb;
  if (lstat(path, &sb) < 0)
    return errno == ENOENT ? 0 : errno;
  if (!S_ISDIR(sb.st_mode))
    return tz_file_unlink(h, path);
  DIR *d = opendir(path);
  if (!d)
    return errno;
  int e = 0;
  struct dirent *de;
  while (!e && (de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    char *sub = NULL;
    if (asprintf(&sub, "%s/%s", path, de->d_name) < 0) {
      e = ENOMEM;
      break;
    }
    e = tz_ckpt_io_rm_tree(h, sub);
    free(sub);
  }
  closedir(d);
  return e ? e : tz_file_rmdir(h, path);
}

char *tz_ckpt_path_join(const char *a, const char *b) {
  char *p = NULL;
  return asprintf(&p, "%s/%s", a, b) < 0 ? NULL : p;
}

char *tz_ckpt_step_path(const char *root, uint64_t step, const char *suffix) {
  char *p = NULL;
  return asprintf(&p, "%s/" STEP_FMT "%s", root, step, suffix) < 0 ? NULL : p;
}

char *tz_ckpt_rank_path(const char *dir, int rank) {
  char *p = NULL;
  return asprintf(&p, "%s/rank-%05d.bin", dir, rank) < 0 ? NULL : p;
}

/* "step-<digits>" followed by suffix exactly (suffix "" for a checkpoint). */
int tz_ckpt_parse_step_name(const char *name, const char *suffix, uint64_t *step) {
  if (strncmp(name, "step-", 5) != 0)
    return 0;
  const char *p = name + 5;
  uint64_t v = 0;
  int digits = 0;
  for (; *p >= '0' && *p <= '9'; p++, digits++) {
    if (v > (UINT64_MAX - 9) / 10)
      return 0;
    v = v * 10 + (uint64_t)(*p - '0');
  }
  if (digits == 0 || strcmp(p, suffix) != 0)
    return 0;
  *step = v;
  return 1;
}

/* Reads all n bytes at off; a file that ends first is TZ_EFORMAT (truncated). */
int tz_ckpt_io_read_at(int fd, const char *path, void *buf, uint64_t n, uint64_t off) {
  uint8_t *p = buf;
  while (n > 0) {
    ssize_t got = pread(fd, p, n, (off_t)off);
    if (got < 0) {
      if (errno == EINTR)
        continue;
      return tz_err_errno(errno, "checkpoint %s: read at offset %" PRIu64, path, off);
    }
    if (got == 0)
      return tz_err_set(TZ_EFORMAT, "checkpoint %s: the file ends at offset %" PRIu64, path, off);
    p += got;
    off += (uint64_t)got;
    n -= (uint64_t)got;
  }
  return 0;
}

/* The whole of a small file (at most max bytes), NUL-terminated; *len without the NUL. */
int tz_ckpt_io_slurp(const char *path, uint64_t max, char **out, uint64_t *len) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below, not waited on */
  if (fd < 0)
    return tz_err_errno(errno, "checkpoint: cannot open %s", path);
  struct stat sb;
  int rc = 0;
  char *buf = NULL;
  if (fstat(fd, &sb) < 0) {
    rc = tz_err_errno(errno, "checkpoint: fstat %s", path);
  } else if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
    rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: not a regular file of at most %" PRIu64 " bytes",
                    path, max);
  } else if (!(buf = malloc((size_t)sb.st_size + 1))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  } else if ((rc = tz_ckpt_io_read_at(fd, path, buf, (uint64_t)sb.st_size, 0)) == 0) {
    buf[sb.st_size] = '\0';
    *len = (uint64_t)sb.st_size;
    *out = buf;
    buf = NULL;
  }
  free(buf);
  close(fd);
  return rc;
}

/* Writes path with text: created, written, fsynced, closed. */
int tz_ckpt_io_write_file(const struct tz_file_hooks *h, const char *path, const char *text,
                          size_t len) {
  int fd = -1, e = tz_file_create(h, path, 0644, &fd);
  if (e == EEXIST && (e = tz_file_unlink(h, path)) == 0)
    e = tz_file_create(h, path, 0644, &fd);
  if (e)
    return tz_err_errno(e, "checkpoint: cannot create %s", path);
  if ((e = tz_file_pwrite(h, fd, text, len, 0)) == 0)
    e = tz_file_fsync(h, fd);
  int ce = close(fd) < 0 ? errno : 0;
  if (e || ce) {
    int rc = tz_err_errno(e ? e : ce, "checkpoint: writing %s", path);
    tz_file_unlink(h, path);
    return rc;
  }
  return 0;
}
