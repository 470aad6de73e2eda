/* Files and directories made durable: mkdir -p, and atomic writes (a temporary name, fsync,
 * rename, fsync of the directory), each operation optionally passed through a caller's fault
 * hooks so that tests can fail or stop any one of them.
 *
 * The single operations return 0 or a positive errno, so the caller words the message
 * (tz_err_errno(e, "checkpoint: cannot create %s", path)); the atomic writes return 0 or a
 * negative TZ_E* code with the message set. */
#ifndef TZ_UTIL_FILE_H
#define TZ_UTIL_FILE_H

#include <stddef.h>
#include <stdint.h>

enum tz_file_op {
  TZ_FILE_CREATE, /* open with O_CREAT | O_EXCL */
  TZ_FILE_WRITE,  /* one write call (a short write resubmits: one operation each) */
  TZ_FILE_FSYNC,  /* fsync of a file or a directory */
  TZ_FILE_RENAME, /* rename, or the exchange of two names */
  TZ_FILE_MKDIR,
  TZ_FILE_UNLINK,
  TZ_FILE_RMDIR,
};

/* Fault hooks a caller passes in; a NULL hooks pointer means none. */
struct tz_file_hooks {
  /* optional: NULL means no faults. Called right before each operation with its kind and the
   * path it acts on (NULL for writes and syncs of an open file); returns 0 to go on, or a
   * positive errno to fail the operation with, which is then not done. It may also stop the
   * process there, to test what a crash at that point leaves. */
  int (*before)(void *ctx, enum tz_file_op op, const char *path);
  void *ctx;
};

/* ---- single operations: 0 or a positive errno ---- */

/* Creates path for writing (O_EXCL: EEXIST if it exists) with mode (less the umask); *fd is the
 * descriptor. */
int tz_file_create(const struct tz_file_hooks *h, const char *path, unsigned mode, int *fd);
/* All n bytes at off, resubmitting short writes and EINTR; EIO when a write makes no progress. */
int tz_file_pwrite(const struct tz_file_hooks *h, int fd, const void *buf, size_t n, uint64_t off);
int tz_file_fsync(const struct tz_file_hooks *h, int fd);
/* Makes a directory's entries (creations, renames into it) durable. */
int tz_file_fsync_dir(const struct tz_file_hooks *h, const char *path);
int tz_file_rename(const struct tz_file_hooks *h, const char *from, const char *to);
/* Swaps the names a and b atomically (renameat2 RENAME_EXCHANGE); both must exist. */
int tz_file_exchange(const struct tz_file_hooks *h, const char *a, const char *b);
int tz_file_mkdir(const struct tz_file_hooks *h, const char *path); /* mode 0755 */
int tz_file_unlink(const struct tz_file_hooks *h, const char *path);
int tz_file_rmdir(const struct tz_file_hooks *h, const char *path);

enum {
  TZ_MKDIR_DURABLE = 1, /* fsync the parent of each directory created, so the creation survives
                         * a crash */
  TZ_MKDIR_PARENTS = 2, /* path names a file (or a directory made later): create only the
                         * directories above its last component */
};
/* mkdir -p: creates path (mode 0755) and each missing directory above it; 0 if it is a directory
 * already, ENOTDIR if it is something else. flags: TZ_MKDIR_*. */
int tz_file_mkdir_p(const struct tz_file_hooks *h, const char *path, unsigned flags);
/* The crc32c (util/crc32c.h) of the first bytes bytes of the file at path (its size: the caller
 * has checked it), mapped rather than copied out of the page cache. 0, or an errno. */
int tz_file_crc32c(const char *path, uint64_t bytes, uint32_t *crc);

/* ---- atomic writes: 0 or a negative TZ_E* code with the message set ---- */

enum {
  /* Skip both fsyncs: the rename is still atomic (a reader sees the old file or the new one),
   * but after a crash the new one may be empty. For caches that are cheap to remake. */
  TZ_ATOMIC_NO_SYNC = 1,
};

/* A file being written under a temporary name (path + ".tmp", or path + "." + pid + ".tmp") and
 * published by tz_atomic_commit. Messages begin with `what` ("hf", "safetensors"). */
typedef struct tz_atomic_file tz_atomic_file;

struct tz_atomic_params {
  const char *what;                  /* the message prefix; NULL: "file" */
  unsigned flags;                    /* TZ_ATOMIC_* */
  int tmp_pid;                       /* 1: the temporary name carries the process id, so that
                                      * processes writing the same path do not collide */
  const struct tz_file_hooks *hooks; /* NULL: none */
};

/* Creates the temporary file (mode 0666 less the umask, as fopen makes files), replacing one a
 * crashed writer left. p may be NULL (defaults).
 * Ownership: *out is the caller's until tz_atomic_commit or tz_atomic_abort. */
int tz_atomic_open(const char *path, const struct tz_atomic_params *p, tz_atomic_file **out);
/* Appends n bytes. After a failure, commit fails and removes the temporary file. */
int tz_atomic_write(tz_atomic_file *f, const void *buf, size_t n);
/* Makes the data durable, renames the temporary file over path and makes the rename durable;
 * frees f whatever happens, removing the temporary file on failure. */
int tz_atomic_commit(tz_atomic_file *f);
/* Removes the temporary file and frees f. NULL is a no-op. */
void tz_atomic_abort(tz_atomic_file *f);
/* The temporary file's name, for messages of the caller's. */
const char *tz_atomic_tmp_path(const tz_atomic_file *f);

/* Writes n bytes of buf to path atomically: open, write, commit. */
int tz_atomic_write_file(const char *path, const void *buf, size_t n,
                         const struct tz_atomic_params *p);

#endif
