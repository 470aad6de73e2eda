/* Durable files and directories (util/file.h). */
#define _GNU_SOURCE
#include "util/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "util/crc32c.h"

static int before(const struct tz_file_hooks *h, enum tz_file_op op, const char *path) {
  return h && h->before ? h->before(h->ctx, op, path) : 0;
}

int tz_file_create(const struct tz_file_hooks *h, const char *path, unsigned mode, int *fd) {
  int e = before(h, TZ_FILE_CREATE, path);
  if (e)
    return e;
  *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
  return *fd < 0 ? errno : 0;
}

int tz_file_pwrite(const struct tz_file_hooks *h, int fd, const void *buf, size_t n, uint64_t off) {
  const char *p = buf;
  while (n > 0) {
    int e = before(h, TZ_FILE_WRITE, NULL);
    if (e)
      return e;
    ssize_t got = pwrite(fd, p, n, (off_t)off);
    if (got < 0) {
      if (errno == EINTR)
        continue;
      return errno;
    }
    if (got == 0)
      return EIO;
    p += got;
    off += (uint64_t)got;
    n -= (size_t)got;
  }
  return 0;
}

int tz_file_fsync(const struct tz_file_hooks *h, int fd) {
  int e = before(h, TZ_FILE_FSYNC, NULL);
  if (e)
    return e;
  return fsync(fd) < 0 ? errno : 0;
}

int tz_file_fsync_dir(const struct tz_file_hooks *h, const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int e = tz_file_fsync(h, fd);
  close(fd);
  return e;
}

int tz_file_rename(const struct tz_file_hooks *h, const char *from, const char *to) {
  int e = before(h, TZ_FILE_RENAME, from);
  if (e)
    return e;
  return rename(from, to) < 0 ? errno : 0;
}

int tz_file_exchange(const struct tz_file_hooks *h, const char *a, const char *b) {
  int e = before(h, TZ_FILE_RENAME, a);
  if (e)
    return e;
  return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) < 0 ? errno : 0;
}

int tz_file_mkdir(const struct tz_file_hooks *h, const char *path) {
  int e = before(h, TZ_FILE_MKDIR, path);
  if (e)
    return e;
  return mkdir(path, 0755) < 0 ? errno : 0;
}

int tz_file_unlink(const struct tz_file_hooks *h, const char *path) {
  int e = before(h, TZ_FILE_UNLINK, path);
  if (e)
    return e;
  return unlink(path) < 0 ? errno : 0;
}

int tz_file_rmdir(const struct tz_file_hooks *h, const char *path) {
  int e = before(h, TZ_FILE_RMDIR, path);
  if (e)
    return e;
  return rmdir(path) < 0 ? errno : 0;
}

/* mkdir -p of copy, which the recursion cuts and restores in place. */
int tz_file_crc32c(const char *path, uint64_t bytes, uint32_t *crc) {
  *crc = 0;
  if (!bytes)
    return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  void *p = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (p == MAP_FAILED)
    return e;
  madvise(p, bytes, MADV_SEQUENTIAL);
  *crc = tz_crc32c(0, p, bytes);
  munmap(p, bytes);
  return 0;
}

static int mkdir_p(const struct tz_file_hooks *h, char *copy, int durable) {
  struct stat sb;
  if (stat(copy, &sb) == 0)
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
  char *slash = strrchr(copy, '/');
  while (slash && slash > copy && slash[1] == '\0') { /* trailing slashes */
    *slash = '\0';
    slash = strrchr(copy, '/');
  }
  int e = 0;
  if (slash && slash != copy) {
    *slash = '\0';
    e = mkdir_p(h, copy, durable);
    *slash = '/';
  }
  if (e)
    return e;
  e = tz_file_mkdir(h, copy);
  if (e == EEXIST)
    return 0;
  if (e || !durable)
    return e;
  if (slash && slash != copy) {
    *slash = '\0';
    e = tz_file_fsync_dir(h, copy);
    *slash = '/';
    return e;
  }
  return tz_file_fsync_dir(h, slash ? "/" : ".");
}

int tz_file_mkdir_p(const struct tz_file_hooks *h, const char *path, unsigned flags) {
  char *copy = strdup(path);
  if (!copy)
    return ENOMEM;
  int e = 0;
  if (flags & TZ_MKDIR_PARENTS) {
    char *slash = strrchr(copy, '/');
    if (slash && slash != copy) {
      *slash = '\0';
      e = mkdir_p(h, copy, flags & TZ_MKDIR_DURABLE);
    }
  } else {
    e = mkdir_p(h, copy, flags & TZ_MKDIR_DURABLE);
  }
  free(copy);
  return e;
}

/* ---- atomic writes ---- */

struct tz_atomic_file {
  char *path, *tmp;
  const char *what;
  unsigned flags;
  const struct tz_file_hooks *hooks;
  FILE *fp; /* buffered: callers write in small pieces */
  int failed;
};

static void atomic_free(tz_atomic_file *f) {
  free(f->path);
  free(f->tmp);
  free(f);
}

int tz_atomic_open(const char *path, const struct tz_atomic_params *p, tz_atomic_file **out) {
  static const struct tz_atomic_params defaults = {0};
  *out = NULL;
  if (!p)
    p = &defaults;
  const char *what = p->what ? p->what : "file";
  tz_atomic_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path)) ||
      (p->tmp_pid ? asprintf(&f->tmp, "%s.%d.tmp", path, (int)getpid())
                  : asprintf(&f->tmp, "%s.tmp", path)) < 0) {
    if (f) {
      f->tmp = NULL;
      atomic_free(f);
    }
    return tz_err_set(TZ_ENOMEM, "%s: out of memory for %s", what, path);
  }
  f->what = what;
  f->flags = p->flags;
  f->hooks = p->hooks;
  /* A temporary file of this name is what a crashed writer left. */
  int fd = -1, e = tz_file_create(f->hooks, f->tmp, 0666, &fd);
  if (e == EEXIST && (e = tz_file_unlink(f->hooks, f->tmp)) == 0)
    e = tz_file_create(f->hooks, f->tmp, 0666, &fd);
  if (!e && !(f->fp = fdopen(fd, "wb"))) {
    e = errno;
    close(fd);
    unlink(f->tmp);
  }
  if (e) {
    int rc = tz_err_errno(e, "%s: cannot create %s", what, f->tmp);
    atomic_free(f);
    return rc;
  }
  *out = f;
  return 0;
}

int tz_atomic_write(tz_atomic_file *f, const void *buf, size_t n) {
  if (f->failed)
    return tz_err_set(TZ_EIO, "%s: an earlier write to %s failed", f->what, f->tmp);
  int e = before(f->hooks, TZ_FILE_WRITE, NULL);
  errno = 0;
  if (!e && n > 0 && fwrite(buf, 1, n, f->fp) != n)
    e = errno ? errno : EIO;
  if (e) {
    f->failed = 1;
    return tz_err_errno(e, "%s: writing %s", f->what, f->tmp);
  }
  return 0;
}

const char *tz_atomic_tmp_path(const tz_atomic_file *f) { return f->tmp; }

void tz_atomic_abort(tz_atomic_file *f) {
  if (!f)
    return;
  if (f->fp)
    fclose(f->fp);
  unlink(f->tmp);
  atomic_free(f);
}

/* The directory path is in, for its fsync: "." for a bare name, "/" for one at the root. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash)
    return strdup(".");
  return slash == path ? strdup("/") : strndup(path, (size_t)(slash - path));
}

int tz_atomic_commit(tz_atomic_file *f) {
  int sync = !(f->flags & TZ_ATOMIC_NO_SYNC), e = 0, rc = 0;
  if (f->failed) {
    rc = tz_err_set(TZ_EIO, "%s: an earlier write to %s failed", f->what, f->tmp);
    goto fail;
  }
  if (fflush(f->fp) != 0 || (sync && (e = tz_file_fsync(f->hooks, fileno(f->fp))))) {
    rc = tz_err_errno(e ? e : errno, "%s: flushing %s", f->what, f->tmp);
    goto fail;
  }
  FILE *fp = f->fp;
  f->fp = NULL;
  if (fclose(fp) != 0) {
    rc = tz_err_errno(errno, "%s: closing %s", f->what, f->tmp);
    goto fail;
  }
  if ((e = tz_file_rename(f->hooks, f->tmp, f->path))) {
    rc = tz_err_errno(e, "%s: renaming %s to %s", f->what, f->tmp, f->path);
    goto fail;
  }
  if (sync) {
    /* The new name is published; only its durability can still fail. */
    char *dir = dir_of(f->path);
    e = dir ? tz_file_fsync_dir(f->hooks, dir) : ENOMEM;
    if (e)
      rc = tz_err_errno(e, "%s: fsync of %s after renaming %s into it", f->what,
                        dir ? dir : "the directory", f->tmp);
    free(dir);
  }
  atomic_free(f);
  return rc;
fail:
  tz_atomic_abort(f);
  return rc;
}

int tz_atomic_write_file(const char *path, const void *buf, size_t n,
                         const struct tz_atomic_params *p) {
  tz_atomic_file *f;
  TZ_CHECK(tz_atomic_open(path, p, &f));
  int rc = tz_atomic_write(f, buf, n);
  if (rc < 0) {
    tz_atomic_abort(f);
    return rc;
  }
  return tz_atomic_commit(f);
}
