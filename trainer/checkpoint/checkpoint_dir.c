/* The root directory: what it holds, said (tz_ckpt_describe), a save's last steps (the manifest,
 * the rename into place, latest, pruning) or its abandonment, the root's claim and the room its
 * saves need. Listing and checking its checkpoints is the reader's (checkpoint_read.c), which
 * names the previous intact one when a checkpoint is damaged. */
#define _GNU_SOURCE
#include "trainer/checkpoint/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* The root directory */

/* Appends printf-style text to buf (len bytes, NUL-terminated), truncating. */
static void append(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strlen(buf);
  if (n + 1 >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + n, len - n, fmt, ap);
  va_end(ap);
}

const char *tz_ckpt_describe(const char *root, char *buf, size_t len) {
  char saved[2048];
  snprintf(saved, sizeof saved, "%s", tz_err_msg());
  buf[0] = 0;
  uint64_t latest = 0, newest = 0;
  int have_latest = 0, n = tz_ckpt_list(root, NULL, 0);
  uint64_t *steps = n > 0 ? malloc(sizeof *steps * (size_t)n) : NULL;
  if (n > 0 && steps && tz_ckpt_list(root, steps, n) == n)
    newest = steps[n - 1];
  else
    n = 0;
  int rc = tz_ckpt_latest(root, &latest);
  if (rc == TZ_ENOENT && n == 0) {
    append(buf, len, "%s holds no checkpoint (no latest): nothing to resume from", root);
  } else if (rc < 0) {
    append(buf, len, "%s: latest cannot be read (%s)", root, tz_err_msg());
  } else {
    have_latest = 1;
    char *dir = tz_ckpt_step_path(root, latest, "");
    int ok = dir ? tz_ckpt_check(dir, 1) : TZ_ENOMEM;
    if (ok == 0) {
      append(buf, len,
             "latest still names " STEP_FMT " in %s, intact (its checksums verified): --resume %s",
             latest, root, root);
    } else {
      append(buf, len, "latest names " STEP_FMT ", which is damaged (%s); ", latest, tz_err_msg());
      uint64_t prev = 0;
      if (tz_ckpt_previous(root, latest, &prev) == 0)
        append(buf, len,
               "the newest intact checkpoint (its checksums verified) is " STEP_FMT
               ": --resume %s/" STEP_FMT,
               prev, root, prev);
      else
        append(buf, len, "no earlier checkpoint in %s is intact", root);
    }
    free(dir);
  }
  /* A complete checkpoint newer than what latest names: the resume a user wants is probably that
   * one, which latest does not give. */
  if (n > 0 && (!have_latest || newest > latest)) {
    char *dir = tz_ckpt_step_path(root, newest, "");
    int ok = dir ? tz_ckpt_check(dir, 0) : TZ_ENOMEM;
    append(buf, len, "; latest is %s " STEP_FMT ", the newest complete checkpoint",
           have_latest ? "older than" : "missing, but there is", newest);
    if (ok == 0)
      append(buf, len,
             ": --resume %s/" STEP_FMT
             " (its files pass the structural check; its checksums are verified when it is read)",
             root, newest);
    else
      append(buf, len, ", whose files fail the structural check (%s)", tz_err_msg());
    free(dir);
  }
  free(steps);
  tz_err_set(TZ_EIO, "%s", saved); /* the message only: callers keep their rc */
  return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* Finalize: manifest, rename, latest, pruning */

/* Reads and checks rank r's committed file in tmp: its size and index crc, for the manifest. */
static int committed_file(const char *tmp, uint64_t step, int rank, int world, uint64_t *bytes,
                          uint32_t *index_crc) {
  char *path = tz_ckpt_rank_path(tmp, rank);
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = 0, fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  uint8_t t[TZ_CKPT_TRAILER_BYTES];
  if (fd < 0) {
    rc = errno == ENOENT
             ? tz_err_set(TZ_ENOENT, "checkpoint %s: missing: rank %d did not commit", path, rank)
             : tz_err_errno(errno, "checkpoint %s: cannot open", path);
  } else if (fstat(fd, &sb) < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: fstat", path);
  } else if ((uint64_t)sb.st_size < TZ_CKPT_HEADER_BYTES + TZ_CKPT_TRAILER_BYTES ||
             tz_ckpt_io_read_at(fd, path, t, sizeof t, (uint64_t)sb.st_size - sizeof t) < 0 ||
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

static int write_manifest(const struct tz_file_hooks *h, const char *tmp, uint64_t step, int world,
                          int version) {
  json_t *root = json_object(), *ranks = json_array();
  char *body = NULL, *path = tz_ckpt_path_join(tmp, TZ_CKPT_MANIFEST), *text = NULL;
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
  if (!body || asprintf(&text, TZ_CKPT_MANIFEST_TAG " %d %zu %08x\n%s", version, blen,
                        tz_crc32c(0, body, blen), body) < 0) {
    text = NULL;
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  rc = tz_ckpt_io_write_file(h, path, text, strlen(text));
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
static int install_dir(const struct tz_file_hooks *h, const char *tmp, const char *dir,
                       char **replaced) {
  *replaced = NULL;
  struct stat sb;
  int e;
  if (lstat(dir, &sb) < 0) {
    if (errno != ENOENT)
      return tz_err_errno(errno, "checkpoint: cannot stat %s", dir);
    if ((e = tz_file_rename(h, tmp, dir)))
      return tz_err_errno(e, "checkpoint: cannot rename %s to %s", tmp, dir);
    return 0;
  }
  char *old = NULL;
  e = tz_file_exchange(h, tmp, dir);
  if (e == 0) {
    if (!(*replaced = strdup(tmp)))
      tz_log(TZ_LOG_WARN, "checkpoint: out of memory; the replaced checkpoint stays in %s", tmp);
    return 0;
  }
  if (e != EINVAL && e != ENOSYS && e != EOPNOTSUPP)
    return tz_err_errno(e, "checkpoint: cannot exchange %s and %s", tmp, dir);
  if (asprintf(&old, "%s.old", dir) < 0)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  if ((e = tz_ckpt_io_rm_tree(h, old)) || (e = tz_file_rename(h, dir, old))) {
    int rc = tz_err_errno(e, "checkpoint: cannot move %s aside to %s", dir, old);
    free(old);
    return rc;
  }
  if ((e = tz_file_rename(h, tmp, dir))) {
    int rc = tz_err_errno(e, "checkpoint: cannot rename %s to %s", tmp, dir);
    if ((e = tz_file_rename(h, old, dir)))
      tz_log(TZ_LOG_WARN, "checkpoint: cannot move %s back to %s: %s", old, dir, strerror(e));
    free(old);
    return rc;
  }
  *replaced = old;
  return 0;
}

/* Removes leftovers of crashed saves and, with keep > 0, the checkpoints older than step beyond
 * the newest keep. Failures are warnings: the checkpoint is saved already. */
static void prune(const struct tz_file_hooks *h, const char *root, uint64_t step, int keep) {
  DIR *d = opendir(root);
  if (!d) {
    tz_log(TZ_LOG_WARN, "checkpoint: cannot list %s: %s", root, strerror(errno));
    return;
  }
  struct dirent *de;
  uint64_t s = 0;
  while ((de = readdir(d))) {
    if (!tz_ckpt_parse_step_name(de->d_name, ".tmp", &s) &&
        !tz_ckpt_parse_step_name(de->d_name, ".old", &s))
      continue;
    char *p = tz_ckpt_path_join(root, de->d_name);
    int e = p ? tz_ckpt_io_rm_tree(h, p) : ENOMEM;
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
    char *dir = tz_ckpt_step_path(root, steps[i], "");
    char *old = tz_ckpt_step_path(root, steps[i], ".old");
    int e = !dir || !old ? ENOMEM : tz_file_rename(h, dir, old);
    if (!e)
      e = tz_ckpt_io_rm_tree(h, old);
    if (e)
      tz_log(TZ_LOG_WARN, "checkpoint: cannot remove %s: %s", dir ? dir : root, strerror(e));
    free(dir);
    free(old);
  }
  free(steps);
}

int tz_ckpt_finalize(const char *root, uint64_t step, int world, int keep,
                     const struct tz_ckpt_options *opt) {
  struct tz_file_hooks fh;
  const struct tz_file_hooks *h = tz_ckpt_file_hooks(opt ? &opt->hooks : NULL, &fh);
  if (!root || !*root || world < 1 || world > MAX_WORLD || step > INT64_MAX)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint: bad arguments to finalize (step %" PRIu64 ", world %d)", step,
                      world);
  char *tmp = tz_ckpt_step_path(root, step, ".tmp"), *dir = tz_ckpt_step_path(root, step, ""),
       *latest = tz_ckpt_path_join(root, TZ_CKPT_LATEST),
       *latest_tmp = tz_ckpt_path_join(root, "latest.tmp"), *replaced = NULL;
  char name[48];
  int rc = 0, e, len = snprintf(name, sizeof name, STEP_FMT "\n", step);
  if (!tmp || !dir || !latest || !latest_tmp) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  /* The rank files and the manifest must be durable under the temporary name before the rename
   * publishes the directory: after a crash, a step-N is complete or absent. */
  TZ_CHECK_GOTO(write_manifest(h, tmp, step, world, tz_ckpt_options_version(opt)), rc, fail_tmp);
  if ((e = tz_file_fsync_dir(h, tmp))) {
    rc = tz_err_errno(e, "checkpoint: fsync of %s", tmp);
    goto fail_tmp;
  }
  TZ_CHECK_GOTO(install_dir(h, tmp, dir, &replaced), rc, fail_tmp);
  /* The rename must be durable before latest names it: latest never points at nothing. */
  if ((e = tz_file_fsync_dir(h, root))) {
    rc = tz_err_errno(e, "checkpoint: fsync of %s", root);
    goto fail_latest;
  }
  if (replaced && (e = tz_ckpt_io_rm_tree(h, replaced)))
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove the replaced checkpoint %s: %s", replaced,
           strerror(e));
  TZ_CHECK_GOTO(tz_ckpt_io_write_file(h, latest_tmp, name, (size_t)len), rc, fail_latest);
  if ((e = tz_file_rename(h, latest_tmp, latest))) {
    rc = tz_err_errno(e, "checkpoint: cannot rename %s to %s", latest_tmp, latest);
    tz_file_unlink(h, latest_tmp);
    goto fail_latest;
  }
  if ((e = tz_file_fsync_dir(h, root))) {
    rc = tz_err_errno(e,
                      "checkpoint: fsync of %s after renaming %s into it (latest names %s, "
                      "but a crash may still bring back the previous one)",
                      root, latest_tmp, dir);
    goto out;
  }
  prune(h, root, step, keep);
  goto out;
fail_latest : {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tz_err_msg());
  tz_err_set(rc, "%s; %s is complete, but %s still names the previous checkpoint", msg, dir,
             latest);
  goto out;
}
fail_tmp:
  if ((e = tz_ckpt_io_rm_tree(h, tmp)))
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove %s: %s", tmp, strerror(e));
out:
  free(replaced);
  free(tmp);
  free(dir);
  free(latest);
  free(latest_tmp);
  return rc;
}

int tz_ckpt_abandon(const char *root, uint64_t step, const struct tz_ckpt_options *opt) {
  struct tz_file_hooks fh;
  const struct tz_file_hooks *h = tz_ckpt_file_hooks(opt ? &opt->hooks : NULL, &fh);
  char *tmp = tz_ckpt_step_path(root, step, ".tmp");
  if (!tmp)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int e = tz_ckpt_io_rm_tree(h, tmp);
  int rc = e ? tz_err_errno(e, "checkpoint: cannot remove %s", tmp) : 0;
  free(tmp);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* One run per root, checked before its first step */

#define LOCK_NAME ".lock"

struct tz_ckpt_lock {
  int fd;
};

/* Who holds root's lock, from the text the holder wrote: "pid N on HOST since TIME". */
static void holder_text(int fd, char *out, size_t len) {
  char buf[512];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  long pid = 0;
  char host[256] = "", since[64] = "";
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "pid %ld host %255s since %63s", &pid, host, since) == 3) {
      snprintf(out, len, "pid %ld on %s since %s", pid, host, since);
      return;
    }
  }
  /* Between the holder's flock and its write. */
  snprintf(out, len, "another run (which has not written its pid yet)");
}

int tz_ckpt_claim(const char *root, tz_ckpt_lock **out) {
  *out = NULL;
  int e = tz_file_mkdir_p(NULL, root, TZ_MKDIR_DURABLE);
  if (e)
    return tz_err_errno(e, "%s: cannot create the directory", root);
  char *path = tz_ckpt_path_join(root, LOCK_NAME);
  tz_ckpt_lock *l = calloc(1, sizeof *l);
  if (!path || !l) {
    free(path);
    free(l);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  int rc = 0;
  l->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (l->fd < 0) {
    rc = tz_err_errno(errno, "%s: cannot open %s", root, path);
    goto fail;
  }
  /* flock, not fcntl: its lock belongs to this open file, so a second claim from the same process
   * (two runs in one test) conflicts too, and closing another descriptor of the file does not
   * drop it. */
  if (flock(l->fd, LOCK_EX | LOCK_NB) < 0) {
    if (errno == EWOULDBLOCK) {
      char who[512];
      holder_text(l->fd, who, sizeof who);
      rc = tz_err_set(TZ_EBUSY, "%s is in use by %s (%s holds the lock of a running run)", root,
                      who, path);
    } else {
      rc = tz_err_errno(errno, "%s: cannot lock %s", root, path);
    }
    goto fail;
  }
  char host[256] = "unknown", since[64] = "unknown", text[512];
  if (gethostname(host, sizeof host) == 0)
    host[sizeof host - 1] = 0;
  time_t now = time(NULL);
  struct tm tm;
  if (gmtime_r(&now, &tm))
    strftime(since, sizeof since, "%Y-%m-%dT%H:%M:%SZ", &tm);
  int n = snprintf(text, sizeof text, "pid %ld host %s since %s\n", (long)getpid(), host, since);
  /* Only the message reads it: a failure to write it does not fail the claim. */
  if (ftruncate(l->fd, 0) < 0 || pwrite(l->fd, text, (size_t)n, 0) != n)
    tz_log(TZ_LOG_WARN, "checkpoint: cannot write the holder into %s: %s", path, strerror(errno));
  free(path);
  *out = l;
  return 0;
fail:
  if (l->fd >= 0)
    close(l->fd);
  free(l);
  free(path);
  return rc;
}

void tz_ckpt_release(tz_ckpt_lock *l) {
  if (!l)
    return;
  close(l->fd); /* drops the flock; the file stays, its text says who held it last */
  free(l);
}

static uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

uint64_t tz_ckpt_rank_file_bytes(int n, const char *const *names, const uint64_t *bytes) {
  uint64_t pos = TZ_CKPT_HEADER_BYTES, index = 0;
  for (int i = 0; i < n; i++) {
    pos = round_up(pos, TZ_CKPT_ALIGN) + bytes[i];
    index += TZ_CKPT_ENTRY_FIXED + strlen(names[i]);
  }
  return round_up(pos, TZ_CKPT_ALIGN) + index + TZ_CKPT_TRAILER_BYTES;
}

uint64_t tz_ckpt_bytes(int world, uint64_t rank_file_bytes) {
  /* The manifest: a line, then about 80 bytes of JSON per rank; latest: one line. */
  uint64_t manifest = 128 + 96 * (uint64_t)world;
  return (uint64_t)world * round_up(rank_file_bytes, TZ_CKPT_ALIGN) +
         round_up(manifest, TZ_CKPT_ALIGN) + TZ_CKPT_ALIGN;
}

/* A file created, written, fsynced and removed in root: what every save does first. */
static int probe(const char *root) {
  char name[64];
  snprintf(name, sizeof name, ".probe-%ld", (long)getpid());
  char *path = tz_ckpt_path_join(root, name);
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int fd = -1, rc = 0, e;
  static const char text[] = "tierzero checks that this directory takes files\n";
  (void)unlink(path); /* a probe a crash left */
  if ((e = tz_file_create(NULL, path, 0644, &fd)))
    rc = tz_err_errno(e, "%s: cannot create a file in it (%s)", root, path);
  else if ((e = tz_file_pwrite(NULL, fd, text, sizeof text - 1, 0)))
    rc = tz_err_errno(e, "%s: cannot write a file in it (%s)", root, path);
  else if ((e = tz_file_fsync(NULL, fd)))
    rc = tz_err_errno(e, "%s: cannot fsync a file in it (%s)", root, path);
  if (fd >= 0 && close(fd) < 0 && rc == 0)
    rc = tz_err_errno(errno, "%s: cannot close a file in it (%s)", root, path);
  if (fd >= 0 && (e = tz_file_unlink(NULL, path)) && rc == 0)
    rc = tz_err_errno(e, "%s: cannot remove a file from it (%s)", root, path);
  free(path);
  return rc;
}

/* bytes as "12.8 MiB" or "3.20 GiB", for the message. */
static void human(uint64_t bytes, char *out, size_t len) {
  if (bytes >= (1ull << 30))
    snprintf(out, len, "%.2f GiB", (double)bytes / (1ull << 30));
  else
    snprintf(out, len, "%.1f MiB", (double)bytes / (1ull << 20));
}

static int statvfs_free(void *ctx, const char *root, uint64_t *bytes) {
  (void)ctx;
  struct statvfs sv;
  if (statvfs(root, &sv) < 0)
    return errno;
  *bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
  return 0;
}

int tz_ckpt_dir_check(const char *root, uint64_t ckpt_bytes, int count,
                      const struct tz_ckpt_options *opt) {
  uint64_t need = ckpt_bytes * (uint64_t)count;
  int e = tz_file_mkdir_p(NULL, root, TZ_MKDIR_DURABLE);
  if (e)
    return tz_err_errno(e, "%s: cannot create the directory", root);
  TZ_CHECK(probe(root));
  int (*free_bytes)(void *, const char *, uint64_t *) =
      opt && opt->hooks.free_bytes ? opt->hooks.free_bytes : statvfs_free;
  uint64_t avail = 0;
  if ((e = free_bytes(opt ? opt->hooks.ctx : NULL, root, &avail)))
    return tz_err_errno(e, "%s: cannot read the free space of its file system", root);
  if (avail < need) {
    char one[32], all[32], fr[32];
    human(ckpt_bytes, one, sizeof one);
    human(need, all, sizeof all);
    human(avail, fr, sizeof fr);
    return tz_err_set(TZ_ENOSPC,
                      "%s: keeping %d checkpoint%s of %" PRIu64 " bytes (%s) at once needs %" PRIu64
                      " bytes (%s), the file system has %" PRIu64
                      " bytes free (%s) (a save writes the new checkpoint before it removes the "
                      "oldest)",
                      root, count, count == 1 ? "" : "s", ckpt_bytes, one, need, all, avail, fr);
  }
  return 0;
}

int tz_ckpt_out_check(const char *what, const char *root, uint64_t bytes) {
  /* root, or where it would be made: its nearest existing ancestor (nothing is created here, so
   * a run that stops early leaves no empty directory behind) */
  char at[4096];
  snprintf(at, sizeof at, "%s", root);
  struct stat st;
  while (stat(at, &st) != 0) {
    if (errno != ENOENT && errno != ENOTDIR)
      return tz_err_errno(errno, "%s %s: cannot stat %s", what, root, at);
    char *slash = strrchr(at, '/');
    if (!slash)
      snprintf(at, sizeof at, ".");
    else if (slash == at)
      at[1] = '\0';
    else
      *slash = '\0';
  }
  if (!S_ISDIR(st.st_mode))
    return tz_err_set(TZ_EINVAL, "%s %s: %s is not a directory", what, root, at);
  int rc = probe(at);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(rc, "%s %s", what, why);
  }
  uint64_t avail = 0;
  int e;
  if (bytes && (e = statvfs_free(NULL, at, &avail)))
    return tz_err_errno(e, "%s %s: cannot read the free space of its file system", what, root);
  if (bytes && avail < bytes) {
    char need[32], fr[32];
    human(bytes, need, sizeof need);
    human(avail, fr, sizeof fr);
    return tz_err_set(TZ_ENOSPC,
                      "%s %s: it needs %" PRIu64 " bytes (%s), the file system has %" PRIu64
                      " bytes free (%s)",
                      what, root, bytes, need, avail, fr);
  }
  return 0;
}
