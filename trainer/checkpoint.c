/* Checkpoint directories (checkpoint.h; format in checkpoint_format.h; docs/checkpoints.md).
 *
 * Every file-system call of the save path that changes something goes through the ck_* wrappers
 * below, which count it and, for tests, kill the process or fail with ENOSPC at a chosen one. */
#define _GNU_SOURCE
#include "trainer/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "trainer/checkpoint_format.h"

/* Bytes buffered by the writer, and read per piece by the reader. */
#define IO_BYTES (1u << 20)
/* Bounds on what the reader loads into memory from a file it has not verified yet. */
#define MAX_MANIFEST_BYTES (64u << 20)
#define MAX_INDEX_BYTES (256u << 20)
#define MAX_WORLD (1 << 20)
#define STEP_FMT "step-%08" PRIu64

/* ------------------------------------------------------------------------------------------ */
/* Fault injection and the save path's system calls */

static atomic_int fault_kind;
static atomic_long fault_at, fault_ops;

void tz_ckpt_fault_set(enum tz_ckpt_fault kind, long n) {
  atomic_store(&fault_kind, (int)kind);
  atomic_store(&fault_at, kind == TZ_CKPT_FAULT_NONE ? 0 : n);
  atomic_store(&fault_ops, 0);
}

long tz_ckpt_fault_count(void) { return atomic_load(&fault_ops); }

/* Called right before each operation; data_op: a write or an fsync. Returns an errno to fail the
 * operation with, or 0. */
static int fault_before(int data_op) {
  int kind = atomic_load(&fault_kind);
  if (kind == TZ_CKPT_FAULT_ENOSPC && !data_op)
    return 0;
  long n = atomic_fetch_add(&fault_ops, 1) + 1;
  if (n != atomic_load(&fault_at))
    return 0;
  if (kind == TZ_CKPT_FAULT_CRASH) {
    kill(getpid(), SIGKILL);
    for (;;)
      pause();
  }
  return kind == TZ_CKPT_FAULT_ENOSPC ? ENOSPC : 0;
}

/* Each returns 0 or a positive errno. */
static int ck_create(const char *path, int *fd) {
  int e = fault_before(0);
  if (e)
    return e;
  *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  return *fd < 0 ? errno : 0;
}

/* All n bytes at off, resubmitting short writes and EINTR. */
static int ck_pwrite(int fd, const void *buf, size_t n, uint64_t off) {
  const char *p = buf;
  while (n > 0) {
    int e = fault_before(1);
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

static int ck_fsync(int fd) {
  int e = fault_before(1);
  if (e)
    return e;
  return fsync(fd) < 0 ? errno : 0;
}

static int ck_rename(const char *from, const char *to) {
  int e = fault_before(0);
  if (e)
    return e;
  return rename(from, to) < 0 ? errno : 0;
}

static int ck_exchange(const char *a, const char *b) {
  int e = fault_before(0);
  if (e)
    return e;
  return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) < 0 ? errno : 0;
}

static int ck_mkdir(const char *path) {
  int e = fault_before(0);
  if (e)
    return e;
  return mkdir(path, 0755) < 0 ? errno : 0;
}

static int ck_unlink(const char *path) {
  int e = fault_before(0);
  if (e)
    return e;
  return unlink(path) < 0 ? errno : 0;
}

static int ck_rmdir(const char *path) {
  int e = fault_before(0);
  if (e)
    return e;
  return rmdir(path) < 0 ? errno : 0;
}

/* Makes a directory's entries (creations, renames into it) durable. */
static int ck_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return errno;
  int e = ck_fsync(fd);
  close(fd);
  return e;
}

/* Removes path and, for a directory, everything under it (symbolic links are removed, never
 * followed). 0 if it does not exist. */
static int rm_tree(const char *path) {
  struct stat sb;
  if (lstat(path, &sb) < 0)
    return errno == ENOENT ? 0 : errno;
  if (!S_ISDIR(sb.st_mode))
    return ck_unlink(path);
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
    e = rm_tree(sub);
    free(sub);
  }
  closedir(d);
  return e ? e : ck_rmdir(path);
}

static char *path_join(const char *a, const char *b) {
  char *p = NULL;
  return asprintf(&p, "%s/%s", a, b) < 0 ? NULL : p;
}

static char *step_path(const char *root, uint64_t step, const char *suffix) {
  char *p = NULL;
  return asprintf(&p, "%s/" STEP_FMT "%s", root, step, suffix) < 0 ? NULL : p;
}

static char *rank_path(const char *dir, int rank) {
  char *p = NULL;
  return asprintf(&p, "%s/rank-%05d.bin", dir, rank) < 0 ? NULL : p;
}

/* "step-<digits>" followed by suffix exactly (suffix "" for a checkpoint). */
static int parse_step_name(const char *name, const char *suffix, uint64_t *step) {
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

/* mkdir -p; each directory it creates is made durable in its parent. */
static int mkdir_p(const char *path) {
  struct stat sb;
  if (stat(path, &sb) == 0)
    return S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
  char *copy = strdup(path);
  if (!copy)
    return ENOMEM;
  char *slash = strrchr(copy, '/');
  while (slash && slash > copy && slash[1] == '\0') { /* trailing slashes */
    *slash = '\0';
    slash = strrchr(copy, '/');
  }
  int e = 0;
  if (slash && slash != copy) {
    *slash = '\0';
    e = mkdir_p(copy);
    *slash = '/';
  }
  if (!e) {
    e = ck_mkdir(copy);
    if (e == EEXIST)
      e = 0;
    else if (!e) {
      if (slash && slash != copy) {
        *slash = '\0';
        e = ck_fsync_dir(copy);
      } else {
        e = ck_fsync_dir(slash ? "/" : ".");
      }
    }
  }
  free(copy);
  return e;
}

/* ------------------------------------------------------------------------------------------ */
/* Writer */

struct wsec {
  char *name;
  uint64_t off, bytes;
  uint32_t crc;
  uint16_t kind;
};

struct tz_ckpt_writer {
  char *path; /* the rank file, inside the temporary directory */
  int fd;
  uint64_t step;
  int rank, world;
  uint8_t *buf; /* IO_BYTES, holding the bytes from file offset `flushed` on */
  size_t buf_len;
  uint64_t flushed; /* bytes written to the file */
  struct wsec *sec;
  int n, cap;
  int open;      /* section sec[n - 1] is being written */
  uint64_t done; /* its bytes so far */
  int failed;    /* an operation failed: only destroy (or a failing commit) remains */
};

static uint64_t w_pos(const tz_ckpt_writer *w) { return w->flushed + w->buf_len; }

/* A failed write, of the bytes from file offset w->flushed on. */
static int w_fail(tz_ckpt_writer *w, int e, const char *what) {
  w->failed = 1;
  return tz_err_errno(e, "checkpoint %s: %s at offset %" PRIu64, w->path, what, w->flushed);
}

static int w_flush(tz_ckpt_writer *w) {
  if (!w->buf_len)
    return 0;
  int e = ck_pwrite(w->fd, w->buf, w->buf_len, w->flushed);
  if (e)
    return w_fail(w, e, "write");
  w->flushed += w->buf_len;
  w->buf_len = 0;
  return 0;
}

static int w_append(tz_ckpt_writer *w, const void *data, uint64_t n) {
  const uint8_t *p = data;
  while (n > 0) {
    if (w->buf_len == 0 && n >= IO_BYTES) {
      /* Large pieces go straight to the file, in whole buffers' worth. */
      uint64_t m = n - n % IO_BYTES;
      int e = ck_pwrite(w->fd, p, m, w->flushed);
      if (e)
        return w_fail(w, e, "write");
      w->flushed += m;
      p += m;
      n -= m;
      continue;
    }
    size_t m = IO_BYTES - w->buf_len < n ? IO_BYTES - w->buf_len : (size_t)n;
    memcpy(w->buf + w->buf_len, p, m);
    w->buf_len += m;
    p += m;
    n -= m;
    if (w->buf_len == IO_BYTES)
      TZ_CHECK(w_flush(w));
  }
  return 0;
}

static int w_pad(tz_ckpt_writer *w) {
  static const uint8_t zeros[TZ_CKPT_ALIGN];
  uint64_t r = w_pos(w) % TZ_CKPT_ALIGN;
  return r ? w_append(w, zeros, TZ_CKPT_ALIGN - r) : 0;
}

static void w_free(tz_ckpt_writer *w) {
  if (w->fd >= 0)
    close(w->fd);
  for (int i = 0; i < w->n; i++)
    free(w->sec[i].name);
  free(w->sec);
  free(w->buf);
  free(w->path);
  free(w);
}

void tz_ckpt_writer_destroy(tz_ckpt_writer *w) {
  if (!w)
    return;
  if (w->fd >= 0) {
    close(w->fd);
    w->fd = -1;
  }
  int e = ck_unlink(w->path);
  if (e && e != ENOENT)
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove the partial file %s: %s", w->path, strerror(e));
  w_free(w);
}

int tz_ckpt_begin(const char *root, uint64_t step, int rank, int world, tz_ckpt_writer **out) {
  *out = NULL;
  if (!root || !*root || world < 1 || world > MAX_WORLD || rank < 0 || rank >= world ||
      step > INT64_MAX)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint: bad arguments (root %s, step %" PRIu64 ", rank %d of %d)",
                      root ? root : "NULL", step, rank, world);
  int rc = 0, e;
  char *tmp = step_path(root, step, ".tmp");
  tz_ckpt_writer *w = calloc(1, sizeof *w);
  if (!tmp || !w) {
    free(tmp);
    free(w);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  w->fd = -1;
  w->step = step;
  w->rank = rank;
  w->world = world;
  if (!(w->path = rank_path(tmp, rank)) || !(w->buf = aligned_alloc(TZ_CKPT_ALIGN, IO_BYTES))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  if (rank == 0) {
    if ((e = mkdir_p(root))) {
      rc = tz_err_errno(e, "checkpoint: cannot create the directory %s", root);
      goto fail;
    }
    /* A directory of this name is what a crashed save of the same step left. */
    if ((e = rm_tree(tmp))) {
      rc = tz_err_errno(e, "checkpoint: cannot remove the stale %s", tmp);
      goto fail;
    }
    if ((e = ck_mkdir(tmp))) {
      rc = tz_err_errno(e, "checkpoint: cannot create %s", tmp);
      goto fail;
    }
  }
  if ((e = ck_create(w->path, &w->fd))) {
    if (e == ENOENT && rank > 0)
      rc = tz_err_set(TZ_ENOENT, "checkpoint: %s does not exist: rank 0 must begin the save first",
                      tmp);
    else if (e == EEXIST)
      rc = tz_err_set(TZ_EEXIST, "checkpoint: %s exists already: two processes with rank %d?",
                      w->path, rank);
    else
      rc = tz_err_errno(e, "checkpoint: cannot create %s", w->path);
    goto fail;
  }
  uint8_t hdr[TZ_CKPT_HEADER_BYTES] = {0};
  memcpy(hdr, TZ_CKPT_MAGIC, 8);
  tz_ckpt_put_le(hdr + 8, TZ_CKPT_VERSION, 4);
  tz_ckpt_put_le(hdr + 12, (uint64_t)rank, 4);
  tz_ckpt_put_le(hdr + 16, (uint64_t)world, 4);
  tz_ckpt_put_le(hdr + 20, TZ_CKPT_ALIGN, 4);
  tz_ckpt_put_le(hdr + 24, step, 8);
  tz_ckpt_put_le(hdr + TZ_CKPT_HEADER_CRC_AT, tz_crc32c(0, hdr, TZ_CKPT_HEADER_CRC_AT), 4);
  TZ_CHECK_GOTO(w_append(w, hdr, sizeof hdr), rc, fail_file);
  free(tmp);
  *out = w;
  return 0;
fail_file:
  tz_ckpt_writer_destroy(w);
  free(tmp);
  return rc;
fail:
  w_free(w);
  free(tmp);
  return rc;
}

static int name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > TZ_CKPT_MAX_NAME)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (name[i] < 0x21 || name[i] > 0x7e)
      return 0;
  return 1;
}

static int section_begin(tz_ckpt_writer *w, const char *name, uint64_t bytes, uint16_t kind) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" is still open", w->path,
                      w->sec[w->n - 1].name);
  if (!name_ok(name))
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: bad section name \"%s\" (1..%d printable ASCII characters, "
                      "no spaces)",
                      w->path, name ? name : "(null)", TZ_CKPT_MAX_NAME);
  for (int i = 0; i < w->n; i++)
    if (strcmp(w->sec[i].name, name) == 0)
      return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" was written already", w->path,
                        name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    struct wsec *s = realloc(w->sec, sizeof *s * (size_t)cap);
    if (!s)
      return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    w->sec = s;
    w->cap = cap;
  }
  int rc = w_pad(w);
  if (rc < 0)
    return rc;
  struct wsec *s = &w->sec[w->n];
  if (!(s->name = strdup(name)))
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  s->off = w_pos(w);
  s->bytes = bytes;
  s->crc = 0;
  s->kind = kind;
  w->n++;
  w->open = 1;
  w->done = 0;
  return 0;
}

int tz_ckpt_section_begin(tz_ckpt_writer *w, const char *name, uint64_t bytes) {
  return section_begin(w, name, bytes, TZ_CKPT_KIND_BYTES);
}

int tz_ckpt_section_write(tz_ckpt_writer *w, const void *data, uint64_t n) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (!w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: no section is open", w->path);
  struct wsec *s = &w->sec[w->n - 1];
  if (n > s->bytes - w->done)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: section \"%s\" is %" PRIu64 " bytes; %" PRIu64
                      " are written and %" PRIu64 " more would exceed it",
                      w->path, s->name, s->bytes, w->done, n);
  s->crc = tz_crc32c(s->crc, data, n);
  TZ_CHECK(w_append(w, data, n));
  w->done += n;
  return 0;
}

int tz_ckpt_section_end(tz_ckpt_writer *w) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (!w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: no section is open", w->path);
  struct wsec *s = &w->sec[w->n - 1];
  if (w->done != s->bytes)
    return tz_err_set(
        TZ_EINVAL, "checkpoint %s: section \"%s\" ended after %" PRIu64 " of its %" PRIu64 " bytes",
        w->path, s->name, w->done, s->bytes);
  w->open = 0;
  return 0;
}

static int put_kind(tz_ckpt_writer *w, const char *name, const void *data, uint64_t bytes,
                    uint16_t kind) {
  TZ_CHECK(section_begin(w, name, bytes, kind));
  TZ_CHECK(tz_ckpt_section_write(w, data, bytes));
  return tz_ckpt_section_end(w);
}

int tz_ckpt_put(tz_ckpt_writer *w, const char *name, const void *data, uint64_t bytes) {
  return put_kind(w, name, data, bytes, TZ_CKPT_KIND_BYTES);
}

int tz_ckpt_put_json(tz_ckpt_writer *w, const char *name, const char *json) {
  json_error_t je;
  json_t *v = json_loads(json, JSON_DECODE_ANY, &je);
  if (!v)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\": not JSON: %d:%d: %s", w->path,
                      name, je.line, je.column, je.text);
  json_decref(v);
  return put_kind(w, name, json, strlen(json), TZ_CKPT_KIND_JSON);
}

int tz_ckpt_put_config(tz_ckpt_writer *w, const struct tz_config *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = tz_config_dump(c, f);
  if (fclose(f) != 0 && rc == 0)
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  if (rc == 0)
    rc = tz_ckpt_put_json(w, "config", text);
  free(text);
  return rc;
}

int tz_ckpt_commit(tz_ckpt_writer *w) {
  int rc = 0, e;
  uint8_t *index = NULL;
  if (w->failed) {
    rc = tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
    goto fail;
  }
  if (w->open) {
    rc = tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" was not ended", w->path,
                    w->sec[w->n - 1].name);
    goto fail;
  }
  TZ_CHECK_GOTO(w_pad(w), rc, fail);
  uint64_t index_off = w_pos(w), index_bytes = 0;
  for (int i = 0; i < w->n; i++)
    index_bytes += TZ_CKPT_ENTRY_FIXED + strlen(w->sec[i].name);
  if (!(index = malloc(index_bytes ? index_bytes : 1))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  uint8_t *p = index;
  for (int i = 0; i < w->n; i++) {
    const struct wsec *s = &w->sec[i];
    size_t len = strlen(s->name);
    tz_ckpt_put_le(p, s->off, 8);
    tz_ckpt_put_le(p + 8, s->bytes, 8);
    tz_ckpt_put_le(p + 16, s->crc, 4);
    tz_ckpt_put_le(p + 20, s->kind, 2);
    tz_ckpt_put_le(p + 22, len, 2);
    memcpy(p + TZ_CKPT_ENTRY_FIXED, s->name, len);
    p += TZ_CKPT_ENTRY_FIXED + len;
  }
  uint8_t tr[TZ_CKPT_TRAILER_BYTES] = {0};
  memcpy(tr, TZ_CKPT_INDEX_MAGIC, 8);
  tz_ckpt_put_le(tr + 8, index_off, 8);
  tz_ckpt_put_le(tr + 16, index_bytes, 8);
  tz_ckpt_put_le(tr + 24, (uint64_t)w->n, 4);
  tz_ckpt_put_le(tr + TZ_CKPT_TRAILER_INDEX_CRC_AT, tz_crc32c(0, index, index_bytes), 4);
  tz_ckpt_put_le(tr + 32, w->step, 8);
  tz_ckpt_put_le(tr + 40, (uint64_t)w->rank, 4);
  tz_ckpt_put_le(tr + 44, (uint64_t)w->world, 4);
  tz_ckpt_put_le(tr + 48, index_off + index_bytes + TZ_CKPT_TRAILER_BYTES, 8);
  tz_ckpt_put_le(tr + TZ_CKPT_TRAILER_CRC_AT, tz_crc32c(0, tr, TZ_CKPT_TRAILER_CRC_AT), 4);
  TZ_CHECK_GOTO(w_append(w, index, index_bytes), rc, fail);
  TZ_CHECK_GOTO(w_append(w, tr, sizeof tr), rc, fail);
  TZ_CHECK_GOTO(w_flush(w), rc, fail);
  if ((e = ck_fsync(w->fd))) {
    w->failed = 1;
    rc = tz_err_errno(e, "checkpoint %s: fsync after writing %" PRIu64 " bytes", w->path,
                      w->flushed);
    goto fail;
  }
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: close", w->path);
    goto fail;
  }
  free(index);
  w_free(w);
  return 0;
fail:
  free(index);
  tz_ckpt_writer_destroy(w);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Reading a rank file's structure and a manifest */

struct manifest {
  uint64_t step;
  int world;
  uint64_t *bytes;     /* (world) */
  uint32_t *index_crc; /* (world) */
};

static void manifest_free(struct manifest *m) {
  free(m->bytes);
  free(m->index_crc);
  m->bytes = NULL;
  m->index_crc = NULL;
}

/* Reads all n bytes at off; a file that ends first is TZ_EFORMAT (truncated). */
static int read_at(int fd, const char *path, void *buf, uint64_t n, uint64_t off) {
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
static int slurp(const char *path, uint64_t max, char **out, uint64_t *len) {
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
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
  } else if ((rc = read_at(fd, path, buf, (uint64_t)sb.st_size, 0)) == 0) {
    buf[sb.st_size] = '\0';
    *len = (uint64_t)sb.st_size;
    *out = buf;
    buf = NULL;
  }
  free(buf);
  close(fd);
  return rc;
}

static int parse_uint(const char **p, uint64_t *v) {
  const char *s = *p;
  uint64_t x = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    if (x > (UINT64_MAX - 9) / 10)
      return 0;
    x = x * 10 + (uint64_t)(*s - '0');
  }
  *p = s;
  *v = x;
  return digits > 0;
}

static int json_uint(json_t *o, const char *key, uint64_t max, uint64_t *v) {
  json_t *x = json_object_get(o, key);
  if (!json_is_integer(x) || json_integer_value(x) < 0 || (uint64_t)json_integer_value(x) > max)
    return 0;
  *v = (uint64_t)json_integer_value(x);
  return 1;
}

/* Reads and checks dir/manifest. The step must equal the directory's name when the name is a
 * step-N one. */
static int manifest_read(const char *dir, struct manifest *m) {
  memset(m, 0, sizeof *m);
  char *path = path_join(dir, TZ_CKPT_MANIFEST), *text = NULL;
  json_t *root = NULL;
  uint64_t len = 0;
  int rc = 0;
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  TZ_CHECK_GOTO(slurp(path, MAX_MANIFEST_BYTES, &text, &len), rc, out);
  /* "tierzero-checkpoint <version> <body bytes> <crc hex8>\n" */
  const char *p = text;
  uint64_t version, body_len, crc = 0;
  size_t tag = strlen(TZ_CKPT_MANIFEST_TAG);
  int ok = strncmp(p, TZ_CKPT_MANIFEST_TAG " ", tag + 1) == 0;
  if (ok) {
    p += tag + 1;
    ok = parse_uint(&p, &version) && *p++ == ' ' && parse_uint(&p, &body_len) && *p++ == ' ';
  }
  for (int i = 0; ok && i < 8; i++, p++) {
    int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
    ok = d >= 0;
    crc = crc << 4 | (uint64_t)(d & 15);
  }
  ok = ok && *p++ == '\n';
  if (!ok) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: the first line is not \"%s <version> <bytes> "
                    "<crc32c>\"",
                    path, TZ_CKPT_MANIFEST_TAG);
    goto out;
  }
  if (version != TZ_CKPT_VERSION) {
    rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: format version %" PRIu64 ", this build reads %d",
                    path, version, TZ_CKPT_VERSION);
    goto out;
  }
  uint64_t head = (uint64_t)(p - text);
  if (body_len != len - head) {
    rc = tz_err_set(TZ_ECHECKSUM,
                    "checkpoint %s: the body is %" PRIu64 " bytes, the first line says %" PRIu64
                    " (truncated?)",
                    path, len - head, body_len);
    goto out;
  }
  uint32_t got = tz_crc32c(0, p, body_len);
  if (got != (uint32_t)crc) {
    rc = tz_err_set(TZ_ECHECKSUM,
                    "checkpoint %s: crc32c mismatch at offset %" PRIu64 ": %08x, the first line "
                    "says %08x",
                    path, head, got, (uint32_t)crc);
    goto out;
  }
  json_error_t je;
  root = json_loadb(p, body_len, JSON_REJECT_DUPLICATES, &je);
  uint64_t step = 0, world = 0;
  json_t *ranks = NULL;
  if (!root || !json_is_object(root) || !json_uint(root, "step", INT64_MAX, &step) ||
      !json_uint(root, "world", MAX_WORLD, &world) || world < 1 ||
      !json_is_array(ranks = json_object_get(root, "ranks")) || json_array_size(ranks) != world) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: the body is not {\"step\", \"world\", \"ranks\"}%s%s", path,
                    root ? "" : ": ", root ? "" : je.text);
    goto out;
  }
  uint64_t named;
  const char *base = strrchr(dir, '/');
  base = base ? base + 1 : dir;
  if (parse_step_name(base, "", &named) && named != step) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: holds step %" PRIu64 ", not the %" PRIu64
                    " of its directory's name",
                    path, step, named);
    goto out;
  }
  m->step = step;
  m->world = (int)world;
  m->bytes = calloc(world, sizeof *m->bytes);
  m->index_crc = calloc(world, sizeof *m->index_crc);
  if (!m->bytes || !m->index_crc) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  for (int r = 0; r < m->world; r++) {
    json_t *e = json_array_get(ranks, (size_t)r), *file = json_object_get(e, "file");
    char want[32];
    snprintf(want, sizeof want, "rank-%05d.bin", r);
    uint64_t ic = 0;
    if (!json_is_object(e) || !json_is_string(file) || strcmp(json_string_value(file), want) ||
        !json_uint(e, "bytes", INT64_MAX, &m->bytes[r]) ||
        !json_uint(e, "index_crc32c", UINT32_MAX, &ic)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: ranks[%d] is not {\"file\": \"%s\", \"bytes\", "
                      "\"index_crc32c\"}",
                      path, r, want);
      goto out;
    }
    m->index_crc[r] = (uint32_t)ic;
  }
out:
  if (rc)
    manifest_free(m);
  json_decref(root);
  free(text);
  free(path);
  return rc;
}

struct rsec {
  char *name;
  uint64_t off, bytes;
  uint32_t crc;
  int kind;
};

struct tz_ckpt_reader {
  char *dir;  /* the step directory */
  char *path; /* the rank file */
  int fd;
  uint64_t step;
  int rank, world;
  int hints; /* damaged files get the previous checkpoint suggested in their message */
  struct rsec *sec;
  int n;
  uint8_t *buf; /* IO_BYTES, for streaming */
};

void tz_ckpt_close(tz_ckpt_reader *r) {
  if (!r)
    return;
  if (r->fd >= 0)
    close(r->fd);
  for (int i = 0; i < r->n; i++)
    free(r->sec[i].name);
  free(r->sec);
  free(r->buf);
  free(r->path);
  free(r->dir);
  free(r);
}

/* Appends to the thread's error message the newest intact checkpoint before the damaged one in
 * dir (a root's step-N directory), so that the caller can offer it. Returns rc. */
static int hint_previous(int rc, const char *dir, uint64_t step) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tz_err_msg());
  char *root = strdup(dir);
  if (!root)
    return rc;
  char *slash = strrchr(root, '/');
  if (slash)
    *slash = '\0';
  else
    strcpy(root, ".");
  uint64_t prev;
  if (tz_ckpt_previous(root, step, &prev) == 0)
    tz_err_set(rc, "%s; the previous checkpoint " STEP_FMT " is intact: --resume %s/" STEP_FMT, msg,
               prev, root, prev);
  else
    tz_err_set(rc, "%s; no earlier intact checkpoint in %s", msg, root);
  free(root);
  return rc;
}

/* Checks rank r's file against the manifest and loads its index. */
static int reader_load(tz_ckpt_reader *r, const struct manifest *m) {
  struct stat sb;
  if (fstat(r->fd, &sb) < 0)
    return tz_err_errno(errno, "checkpoint %s: fstat", r->path);
  uint64_t size = (uint64_t)sb.st_size;
  if (size != m->bytes[r->rank])
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: %" PRIu64 " bytes, the manifest says %" PRIu64
                      " (truncated or replaced)",
                      r->path, size, m->bytes[r->rank]);
  if (size < TZ_CKPT_HEADER_BYTES + TZ_CKPT_TRAILER_BYTES)
    return tz_err_set(TZ_EFORMAT, "checkpoint %s: %" PRIu64 " bytes is too short", r->path, size);
  uint8_t h[TZ_CKPT_HEADER_CRC_AT + 4];
  TZ_CHECK(read_at(r->fd, r->path, h, sizeof h, 0));
  uint32_t hc = (uint32_t)tz_ckpt_get_le(h + TZ_CKPT_HEADER_CRC_AT, 4);
  if (tz_crc32c(0, h, TZ_CKPT_HEADER_CRC_AT) != hc)
    return tz_err_set(TZ_ECHECKSUM, "checkpoint %s: header at offset 0: crc32c mismatch", r->path);
  if (memcmp(h, TZ_CKPT_MAGIC, 8) != 0 || tz_ckpt_get_le(h + 8, 4) != TZ_CKPT_VERSION ||
      tz_ckpt_get_le(h + 12, 4) != (uint64_t)r->rank ||
      tz_ckpt_get_le(h + 16, 4) != (uint64_t)m->world ||
      tz_ckpt_get_le(h + 20, 4) != TZ_CKPT_ALIGN || tz_ckpt_get_le(h + 24, 8) != m->step)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: header at offset 0 is not that of a version %d rank file "
                      "of rank %d of %d, step %" PRIu64,
                      r->path, TZ_CKPT_VERSION, r->rank, m->world, m->step);
  uint8_t t[TZ_CKPT_TRAILER_BYTES];
  uint64_t toff = size - TZ_CKPT_TRAILER_BYTES;
  TZ_CHECK(read_at(r->fd, r->path, t, sizeof t, toff));
  if (tz_crc32c(0, t, TZ_CKPT_TRAILER_CRC_AT) != tz_ckpt_get_le(t + TZ_CKPT_TRAILER_CRC_AT, 4))
    return tz_err_set(TZ_ECHECKSUM, "checkpoint %s: trailer at offset %" PRIu64 ": crc32c mismatch",
                      r->path, toff);
  uint64_t index_off = tz_ckpt_get_le(t + 8, 8), index_bytes = tz_ckpt_get_le(t + 16, 8),
           n = tz_ckpt_get_le(t + 24, 4);
  uint32_t index_crc = (uint32_t)tz_ckpt_get_le(t + TZ_CKPT_TRAILER_INDEX_CRC_AT, 4);
  if (memcmp(t, TZ_CKPT_INDEX_MAGIC, 8) != 0 || tz_ckpt_get_le(t + 32, 8) != m->step ||
      tz_ckpt_get_le(t + 40, 4) != (uint64_t)r->rank ||
      tz_ckpt_get_le(t + 44, 4) != (uint64_t)m->world || tz_ckpt_get_le(t + 48, 8) != size ||
      index_off % TZ_CKPT_ALIGN || index_off < TZ_CKPT_HEADER_BYTES || index_off > toff ||
      index_bytes != toff - index_off || index_bytes > MAX_INDEX_BYTES ||
      n > index_bytes / TZ_CKPT_ENTRY_FIXED)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: trailer at offset %" PRIu64 " does not describe this file",
                      r->path, toff);
  if (index_crc != m->index_crc[r->rank])
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: index crc32c %08x, the manifest says %08x (a file of "
                      "another save?)",
                      r->path, index_crc, m->index_crc[r->rank]);
  uint8_t *index = malloc(index_bytes ? index_bytes : 1);
  r->sec = calloc(n ? n : 1, sizeof *r->sec);
  if (!index || !r->sec) {
    free(index);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  int rc = read_at(r->fd, r->path, index, index_bytes, index_off);
  if (rc == 0 && tz_crc32c(0, index, index_bytes) != index_crc)
    rc = tz_err_set(TZ_ECHECKSUM, "checkpoint %s: index at offset %" PRIu64 ": crc32c mismatch",
                    r->path, index_off);
  uint64_t at = 0, end = TZ_CKPT_HEADER_BYTES;
  for (uint64_t i = 0; rc == 0 && i < n; i++) {
    struct rsec *s = &r->sec[i];
    uint64_t len = 0;
    if (index_bytes - at >= TZ_CKPT_ENTRY_FIXED) {
      s->off = tz_ckpt_get_le(index + at, 8);
      s->bytes = tz_ckpt_get_le(index + at + 8, 8);
      s->crc = (uint32_t)tz_ckpt_get_le(index + at + 16, 4);
      s->kind = (int)tz_ckpt_get_le(index + at + 20, 2);
      len = tz_ckpt_get_le(index + at + 22, 2);
    }
    if (index_bytes - at < TZ_CKPT_ENTRY_FIXED || len == 0 || len > TZ_CKPT_MAX_NAME ||
        len > index_bytes - at - TZ_CKPT_ENTRY_FIXED || s->off % TZ_CKPT_ALIGN || s->off < end ||
        s->off > index_off || s->bytes > index_off - s->off ||
        (s->kind != TZ_CKPT_KIND_BYTES && s->kind != TZ_CKPT_KIND_JSON)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: index entry %" PRIu64 " at offset %" PRIu64 " is malformed",
                      r->path, i, index_off + at);
      break;
    }
    if (!(s->name = strndup((const char *)index + at + TZ_CKPT_ENTRY_FIXED, len))) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    r->n++;
    if (strlen(s->name) != len || !name_ok(s->name)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: index entry %" PRIu64 " at offset %" PRIu64
                      " has a malformed name",
                      r->path, i, index_off + at);
      break;
    }
    for (int j = 0; rc == 0 && j < r->n - 1; j++)
      if (strcmp(r->sec[j].name, s->name) == 0)
        rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: section \"%s\" appears twice in the index",
                        r->path, s->name);
    at += TZ_CKPT_ENTRY_FIXED + len;
    end = s->off + s->bytes;
  }
  if (rc == 0 && at != index_bytes)
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: index at offset %" PRIu64 " has %" PRIu64
                    " bytes after its %" PRIu64 " entries",
                    r->path, index_off, index_bytes - at, n);
  free(index);
  return rc;
}

/* Opens rank's file of the checkpoint in step directory dir. */
static int open_dir(const char *dir, int rank, int hints, tz_ckpt_reader **out) {
  *out = NULL;
  struct manifest m;
  uint64_t named = 0;
  const char *base = strrchr(dir, '/');
  int has_step = parse_step_name(base ? base + 1 : dir, "", &named);
  int rc = manifest_read(dir, &m);
  if (rc < 0)
    return hints && has_step && rc != TZ_ENOMEM ? hint_previous(rc, dir, named) : rc;
  if (rank < 0 || rank >= m.world) {
    manifest_free(&m);
    return tz_err_set(TZ_ENOENT, "checkpoint %s: has ranks 0..%d, not rank %d", dir, m.world - 1,
                      rank);
  }
  tz_ckpt_reader *r = calloc(1, sizeof *r);
  if (!r || !(r->dir = strdup(dir)) || !(r->path = rank_path(dir, rank))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  r->rank = rank;
  r->world = m.world;
  r->step = m.step;
  r->hints = hints && has_step;
  r->fd = open(r->path, O_RDONLY | O_CLOEXEC);
  if (r->fd < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: cannot open", r->path);
    goto fail;
  }
  TZ_CHECK_GOTO(reader_load(r, &m), rc, fail);
  manifest_free(&m);
  *out = r;
  return 0;
fail:
  manifest_free(&m);
  tz_ckpt_close(r);
  if (hints && has_step && rc != TZ_ENOMEM)
    hint_previous(rc, dir, named);
  return rc;
}

/* The step latest names. */
static int latest_read(const char *root, uint64_t *step) {
  char *path = path_join(root, TZ_CKPT_LATEST), *text = NULL;
  uint64_t len = 0;
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = slurp(path, 64, &text, &len);
  if (rc == 0) {
    if (len > 0 && text[len - 1] == '\n')
      text[--len] = '\0';
    if (strlen(text) != len || !parse_step_name(text, "", step))
      rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: does not hold a step-N directory name", path);
  }
  free(text);
  free(path);
  return rc;
}

int tz_ckpt_latest(const char *root, uint64_t *step) { return latest_read(root, step); }

int tz_ckpt_open(const char *path, int rank, tz_ckpt_reader **out) {
  *out = NULL;
  char *manifest = path_join(path, TZ_CKPT_MANIFEST), *latest = path_join(path, TZ_CKPT_LATEST);
  int rc = 0;
  if (!manifest || !latest) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  } else if (access(manifest, F_OK) == 0) {
    rc = open_dir(path, rank, 1, out);
  } else if (access(latest, F_OK) == 0) {
    uint64_t step = 0;
    rc = latest_read(path, &step);
    char *dir = rc == 0 ? step_path(path, step, "") : NULL;
    if (rc == 0 && !dir)
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    if (rc == 0)
      rc = open_dir(dir, rank, 1, out);
    free(dir);
  } else {
    /* A crash between a first save's rename and its latest leaves a checkpoint but no latest. */
    uint64_t newest[1];
    int n = tz_ckpt_list(path, NULL, 0), m = n > 0 ? n : 0;
    uint64_t *steps = m ? malloc(sizeof *steps * (size_t)m) : newest;
    if (steps && m && tz_ckpt_list(path, steps, m) == m)
      rc = tz_err_set(TZ_ENOENT,
                      "checkpoint: %s has no latest, but holds complete checkpoints; the newest "
                      "is " STEP_FMT ": --resume %s/" STEP_FMT,
                      path, steps[m - 1], path, steps[m - 1]);
    else
      rc = tz_err_set(TZ_ENOENT,
                      "checkpoint: nothing to resume at %s: it has neither a manifest (a step "
                      "directory) nor a latest (a checkpoint root)",
                      path);
    if (steps != newest)
      free(steps);
  }
  free(manifest);
  free(latest);
  return rc;
}

uint64_t tz_ckpt_step(const tz_ckpt_reader *r) { return r->step; }
int tz_ckpt_world(const tz_ckpt_reader *r) { return r->world; }
const char *tz_ckpt_dir(const tz_ckpt_reader *r) { return r->dir; }
int tz_ckpt_count(const tz_ckpt_reader *r) { return r->n; }

const char *tz_ckpt_name(const tz_ckpt_reader *r, int i) {
  return i >= 0 && i < r->n ? r->sec[i].name : NULL;
}

static const struct rsec *find(const tz_ckpt_reader *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->sec[i].name, name) == 0)
      return &r->sec[i];
  return NULL;
}

int tz_ckpt_size(const tz_ckpt_reader *r, const char *name, uint64_t *bytes) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  *bytes = s->bytes;
  return 0;
}

static int crc_mismatch(const tz_ckpt_reader *r, const struct rsec *s, uint32_t got) {
  tz_err_set(TZ_ECHECKSUM,
             "checkpoint %s: section \"%s\" at offset %" PRIu64 ": crc32c mismatch (%08x, the "
             "index says %08x)",
             r->path, s->name, s->off, got, s->crc);
  return r->hints ? hint_previous(TZ_ECHECKSUM, r->dir, r->step) : TZ_ECHECKSUM;
}

static int read_failed(const tz_ckpt_reader *r, int rc) {
  return r->hints && rc != TZ_ENOMEM ? hint_previous(rc, r->dir, r->step) : rc;
}

int tz_ckpt_get(tz_ckpt_reader *r, const char *name, void *dst, uint64_t bytes) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (bytes != s->bytes)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: section \"%s\" is %" PRIu64
                      " bytes, the caller expects %" PRIu64,
                      r->path, name, s->bytes, bytes);
  int rc = read_at(r->fd, r->path, dst, bytes, s->off);
  if (rc < 0)
    return read_failed(r, rc);
  uint32_t crc = tz_crc32c(0, dst, bytes);
  return crc == s->crc ? 0 : crc_mismatch(r, s, crc);
}

int tz_ckpt_get_stream(tz_ckpt_reader *r, const char *name, tz_ckpt_sink sink, void *ctx) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (!r->buf && !(r->buf = malloc(IO_BYTES)))
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  uint32_t crc = 0;
  for (uint64_t done = 0; done < s->bytes;) {
    uint64_t n = s->bytes - done < IO_BYTES ? s->bytes - done : IO_BYTES;
    int rc = read_at(r->fd, r->path, r->buf, n, s->off + done);
    if (rc < 0)
      return read_failed(r, rc);
    crc = tz_crc32c(crc, r->buf, n);
    if (sink && (rc = sink(ctx, r->buf, done, n)) < 0)
      return rc;
    done += n;
  }
  return crc == s->crc ? 0 : crc_mismatch(r, s, crc);
}

int tz_ckpt_get_json(tz_ckpt_reader *r, const char *name, char **out) {
  *out = NULL;
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (s->kind != TZ_CKPT_KIND_JSON)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" holds bytes, not JSON", r->path,
                      name);
  char *text = malloc(s->bytes + 1);
  if (!text)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = tz_ckpt_get(r, name, text, s->bytes);
  if (rc < 0) {
    free(text);
    return rc;
  }
  text[s->bytes] = '\0';
  *out = text;
  return 0;
}

int tz_ckpt_get_config(tz_ckpt_reader *r, struct tz_config *c) {
  char *text = NULL, *origin = NULL;
  TZ_CHECK(tz_ckpt_get_json(r, "config", &text));
  if (asprintf(&origin, "%s: section \"config\"", r->path) < 0)
    origin = NULL;
  int rc = tz_config_load_string(c, text, origin);
  free(origin);
  free(text);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* The root directory */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int tz_ckpt_list(const char *root, uint64_t *steps, int cap) {
  DIR *d = opendir(root);
  if (!d)
    return errno == ENOENT ? 0 : tz_err_errno(errno, "checkpoint: cannot list %s", root);
  uint64_t *all = NULL;
  int n = 0, cap_all = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    uint64_t step = 0;
    if (!parse_step_name(de->d_name, "", &step))
      continue;
    char *dir = path_join(root, de->d_name);
    struct manifest m;
    if (!dir) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    int ok = manifest_read(dir, &m) == 0;
    free(dir);
    if (!ok)
      continue;
    manifest_free(&m);
    if (n == cap_all) {
      cap_all = cap_all ? 2 * cap_all : 16;
      uint64_t *a = realloc(all, sizeof *a * (size_t)cap_all);
      if (!a) {
        rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
        break;
      }
      all = a;
    }
    all[n++] = step;
  }
  closedir(d);
  if (rc == 0) {
    if (n > 1)
      qsort(all, (size_t)n, sizeof *all, cmp_u64);
    for (int i = 0; i < n && i < cap; i++)
      steps[i] = all[i];
    rc = n;
  }
  free(all);
  return rc;
}

int tz_ckpt_check(const char *stepdir, int full) {
  struct manifest m;
  TZ_CHECK(manifest_read(stepdir, &m));
  int rc = 0;
  for (int rank = 0; rc == 0 && rank < m.world; rank++) {
    tz_ckpt_reader *r;
    TZ_CHECK_GOTO(open_dir(stepdir, rank, 0, &r), rc, out);
    for (int i = 0; full && rc == 0 && i < r->n; i++)
      rc = tz_ckpt_get_stream(r, r->sec[i].name, NULL, NULL);
    tz_ckpt_close(r);
  }
out:
  manifest_free(&m);
  return rc;
}

int tz_ckpt_previous(const char *root, uint64_t step, uint64_t *prev) {
  int n = tz_ckpt_list(root, NULL, 0);
  if (n < 0)
    return n;
  uint64_t *steps = malloc(sizeof *steps * (size_t)(n ? n : 1));
  if (!steps)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  n = tz_ckpt_list(root, steps, n);
  if (n < 0) {
    free(steps);
    return n;
  }
  int rc = TZ_ENOENT;
  for (int i = n - 1; rc == TZ_ENOENT && i >= 0; i--) {
    if (steps[i] >= step)
      continue;
    char *dir = step_path(root, steps[i], "");
    if (!dir) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    if (tz_ckpt_check(dir, 0) == 0) {
      *prev = steps[i];
      rc = 0;
    }
    free(dir);
  }
  free(steps);
  if (rc == TZ_ENOENT)
    tz_err_set(rc, "checkpoint: no intact checkpoint older than " STEP_FMT " in %s", step, root);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Finalize: manifest, rename, latest, pruning */

/* Reads and checks rank r's committed file in tmp: its size and index crc, for the manifest. */
static int committed_file(const char *tmp, uint64_t step, int rank, int world, uint64_t *bytes,
                          uint32_t *index_crc) {
  char *path = rank_path(tmp, rank);
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = 0, fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  uint8_t t[TZ_CKPT_TRAILER_BYTES];
  if (fd < 0) {
    rc = errno == ENOENT
             ? tz_err_set(TZ_ENOENT, "checkpoint %s: missing: rank %d did not commit", path, rank)
             : tz_err_errno(errno, "checkpoint %s: cannot open", path);
  } else if (fstat(fd, &sb) < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: fstat", path);
  } else if ((uint64_t)sb.st_size < TZ_CKPT_HEADER_BYTES + TZ_CKPT_TRAILER_BYTES ||
             read_at(fd, path, t, sizeof t, (uint64_t)sb.st_size - sizeof t) < 0 ||
             memcmp(t, TZ_CKPT_INDEX_MAGIC, 8) != 0 ||
             tz_crc32c(0, t, TZ_CKPT_TRAILER_CRC_AT) !=
                 tz_ckpt_get_le(t + TZ_CKPT_TRAILER_CRC_AT, 4) ||
             tz_ckpt_get_le(t + 32, 8) != step || tz_ckpt_get_le(t + 40, 4) != (uint64_t)rank ||
             tz_ckpt_get_le(t + 44, 4) != (uint64_t)world ||
             tz_ckpt_get_le(t + 48, 8) != (uint64_t)sb.st_size) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: not a committed rank file of rank %d of %d, step %" PRIu64
                    " (did every rank commit?)",
                    path, rank, world, step);
  } else {
    *bytes = (uint64_t)sb.st_size;
    *index_crc = (uint32_t)tz_ckpt_get_le(t + TZ_CKPT_TRAILER_INDEX_CRC_AT, 4);
  }
  if (fd >= 0)
    close(fd);
  free(path);
  return rc;
}

/* Writes path with text: created, written, fsynced, closed. */
static int write_file(const char *path, const char *text, size_t len) {
  int fd = -1, e = ck_create(path, &fd);
  if (e == EEXIST && (e = ck_unlink(path)) == 0)
    e = ck_create(path, &fd);
  if (e)
    return tz_err_errno(e, "checkpoint: cannot create %s", path);
  if ((e = ck_pwrite(fd, text, len, 0)) == 0)
    e = ck_fsync(fd);
  int ce = close(fd) < 0 ? errno : 0;
  if (e || ce) {
    int rc = tz_err_errno(e ? e : ce, "checkpoint: writing %s", path);
    ck_unlink(path);
    return rc;
  }
  return 0;
}

static int write_manifest(const char *tmp, uint64_t step, int world) {
  json_t *root = json_object(), *ranks = json_array();
  char *body = NULL, *path = path_join(tmp, TZ_CKPT_MANIFEST), *text = NULL;
  int rc = 0;
  if (!root || !ranks || !path) {
    json_decref(ranks);
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  json_object_set_new(root, "step", json_integer((json_int_t)step));
  json_object_set_new(root, "world", json_integer(world));
  json_object_set_new(root, "ranks", ranks);
  for (int r = 0; r < world; r++) {
    uint64_t bytes = 0;
    uint32_t crc = 0;
    char name[32];
    TZ_CHECK_GOTO(committed_file(tmp, step, r, world, &bytes, &crc), rc, out);
    snprintf(name, sizeof name, "rank-%05d.bin", r);
    json_t *e = json_object();
    if (!e || json_array_append_new(ranks, e) < 0) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      goto out;
    }
    json_object_set_new(e, "file", json_string(name));
    json_object_set_new(e, "bytes", json_integer((json_int_t)bytes));
    json_object_set_new(e, "index_crc32c", json_integer(crc));
  }
  body = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
  size_t blen = body ? strlen(body) : 0;
  if (!body || asprintf(&text, TZ_CKPT_MANIFEST_TAG " %d %zu %08x\n%s", TZ_CKPT_VERSION, blen,
                        tz_crc32c(0, body, blen), body) < 0) {
    text = NULL;
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  rc = write_file(path, text, strlen(text));
out:
  free(text);
  free(body);
  free(path);
  json_decref(root);
  return rc;
}

/* Moves tmp into place as dir. An existing dir (a checkpoint of this step from a run that was
 * later resumed from an earlier step) is exchanged atomically, so that dir is always either the
 * old checkpoint or the new one; where the file system cannot exchange, the old one is first
 * renamed aside to dir.old. *replaced: where the old one now is (to remove once the rename is
 * durable), or NULL. */
static int install_dir(const char *tmp, const char *dir, char **replaced) {
  *replaced = NULL;
  struct stat sb;
  int e;
  if (lstat(dir, &sb) < 0) {
    if (errno != ENOENT)
      return tz_err_errno(errno, "checkpoint: cannot stat %s", dir);
    if ((e = ck_rename(tmp, dir)))
      return tz_err_errno(e, "checkpoint: cannot rename %s to %s", tmp, dir);
    return 0;
  }
  char *old = NULL;
  e = ck_exchange(tmp, dir);
  if (e == 0) {
    if (!(*replaced = strdup(tmp)))
      tz_log(TZ_LOG_WARN, "checkpoint: out of memory; the replaced checkpoint stays in %s", tmp);
    return 0;
  }
  if (e != EINVAL && e != ENOSYS && e != EOPNOTSUPP)
    return tz_err_errno(e, "checkpoint: cannot exchange %s and %s", tmp, dir);
  if (asprintf(&old, "%s.old", dir) < 0)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  if ((e = rm_tree(old)) || (e = ck_rename(dir, old))) {
    int rc = tz_err_errno(e, "checkpoint: cannot move %s aside to %s", dir, old);
    free(old);
    return rc;
  }
  if ((e = ck_rename(tmp, dir))) {
    int rc = tz_err_errno(e, "checkpoint: cannot rename %s to %s", tmp, dir);
    if ((e = ck_rename(old, dir)))
      tz_log(TZ_LOG_WARN, "checkpoint: cannot move %s back to %s: %s", old, dir, strerror(e));
    free(old);
    return rc;
  }
  *replaced = old;
  return 0;
}

/* Removes leftovers of crashed saves and, with keep > 0, the checkpoints older than step beyond
 * the newest keep. Failures are warnings: the checkpoint is saved already. */
static void prune(const char *root, uint64_t step, int keep) {
  DIR *d = opendir(root);
  if (!d) {
    tz_log(TZ_LOG_WARN, "checkpoint: cannot list %s: %s", root, strerror(errno));
    return;
  }
  struct dirent *de;
  uint64_t s = 0;
  while ((de = readdir(d))) {
    if (!parse_step_name(de->d_name, ".tmp", &s) && !parse_step_name(de->d_name, ".old", &s))
      continue;
    char *p = path_join(root, de->d_name);
    int e = p ? rm_tree(p) : ENOMEM;
    if (e)
      tz_log(TZ_LOG_WARN, "checkpoint: cannot remove %s/%s: %s", root, de->d_name, strerror(e));
    free(p);
  }
  closedir(d);
  if (keep <= 0)
    return;
  int n = tz_ckpt_list(root, NULL, 0);
  uint64_t *steps = n > 0 ? malloc(sizeof *steps * (size_t)n) : NULL;
  if (n < 0 || (n > 0 && !steps)) {
    tz_log(TZ_LOG_WARN, "checkpoint: cannot list %s to keep %d checkpoints", root, keep);
    free(steps);
    return;
  }
  n = tz_ckpt_list(root, steps, n);
  int newer = 0; /* checkpoints at or below step, counted from the newest */
  for (int i = n - 1; i >= 0; i--) {
    if (steps[i] > step || ++newer <= keep)
      continue;
    /* Renamed aside first, so that a crash mid-removal never leaves a half-removed step-N. */
    char *dir = step_path(root, steps[i], ""), *old = step_path(root, steps[i], ".old");
    int e = !dir || !old ? ENOMEM : ck_rename(dir, old);
    if (!e)
      e = rm_tree(old);
    if (e)
      tz_log(TZ_LOG_WARN, "checkpoint: cannot remove %s: %s", dir ? dir : root, strerror(e));
    free(dir);
    free(old);
  }
  free(steps);
}

int tz_ckpt_finalize(const char *root, uint64_t step, int world, int keep) {
  if (!root || !*root || world < 1 || world > MAX_WORLD || step > INT64_MAX)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint: bad arguments to finalize (step %" PRIu64 ", world %d)", step,
                      world);
  char *tmp = step_path(root, step, ".tmp"), *dir = step_path(root, step, ""),
       *latest = path_join(root, TZ_CKPT_LATEST), *latest_tmp = path_join(root, "latest.tmp"),
       *replaced = NULL;
  char name[48];
  int rc = 0, e, len = snprintf(name, sizeof name, STEP_FMT "\n", step);
  if (!tmp || !dir || !latest || !latest_tmp) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  /* The rank files and the manifest must be durable under the temporary name before the rename
   * publishes the directory: after a crash, a step-N is complete or absent. */
  TZ_CHECK_GOTO(write_manifest(tmp, step, world), rc, fail_tmp);
  if ((e = ck_fsync_dir(tmp))) {
    rc = tz_err_errno(e, "checkpoint: fsync of %s", tmp);
    goto fail_tmp;
  }
  TZ_CHECK_GOTO(install_dir(tmp, dir, &replaced), rc, fail_tmp);
  /* The rename must be durable before latest names it: latest never points at nothing. */
  if ((e = ck_fsync_dir(root))) {
    rc = tz_err_errno(e, "checkpoint: fsync of %s", root);
    goto fail_latest;
  }
  if (replaced && (e = rm_tree(replaced)))
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove the replaced checkpoint %s: %s", replaced,
           strerror(e));
  TZ_CHECK_GOTO(write_file(latest_tmp, name, (size_t)len), rc, fail_latest);
  if ((e = ck_rename(latest_tmp, latest))) {
    rc = tz_err_errno(e, "checkpoint: cannot rename %s to %s", latest_tmp, latest);
    ck_unlink(latest_tmp);
    goto fail_latest;
  }
  if ((e = ck_fsync_dir(root))) {
    rc = tz_err_errno(e,
                      "checkpoint: fsync of %s after renaming %s into it (latest names %s, "
                      "but a crash may still bring back the previous one)",
                      root, latest_tmp, dir);
    goto out;
  }
  prune(root, step, keep);
  goto out;
fail_latest : {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tz_err_msg());
  tz_err_set(rc, "%s; %s is complete, but %s still names the previous checkpoint", msg, dir,
             latest);
  goto out;
}
fail_tmp:
  if ((e = rm_tree(tmp)))
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove %s: %s", tmp, strerror(e));
out:
  free(replaced);
  free(tmp);
  free(dir);
  free(latest);
  free(latest_tmp);
  return rc;
}

int tz_ckpt_abandon(const char *root, uint64_t step) {
  char *tmp = step_path(root, step, ".tmp");
  if (!tmp)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int e = rm_tree(tmp), rc = e ? tz_err_errno(e, "checkpoint: cannot remove %s", tmp) : 0;
  free(tmp);
  return rc;
}
