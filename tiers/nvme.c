/* nvme: files on one or more drives, striped, read and written with io_uring and O_DIRECT.
 *
 * One ring per tier, submitted to from any thread under a lock, reaped by the runtime's
 * progress engine through the ring's eventfd. Every operation is cut into stripe-sized requests;
 * a request that comes back short, or with -EAGAIN or -EINTR, is resubmitted for what is left
 * (one place: complete_req()). Files are created here (never one that exists) and unlinked at
 * once: the tier keeps the descriptor, and the kernel frees the space when the last descriptor
 * closes, however the process ends (kill -9 included). The name is kept as text, for messages.
 * Files are preallocated so that a full disk shows at start. Older versions kept the name until
 * destroy; their files of processes no longer running are removed when a tier is created in the
 * same directory. Host arenas are registered as fixed buffers (in pieces of at most 1 GiB) and
 * used when a request's buffer lies in one. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/faults.h"
#include "core/fence.h"
#include "core/progress.h"
#include "core/log.h"
#include "core/tier_impl.h"
#include "util/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/statfs.h>
#include <unistd.h>

#define MAX_FIXED 64
#define FIXED_PIECE (1ull << 30)

struct op {
  tz_fence *fence;
  struct req *reqs; /* owned: every request of the op */
  int pending;      /* requests not yet complete; guarded by the ring lock */
  int rc;
  char msg[384];
};

struct req {
  struct op *op;
  struct req *next; /* the pending list */
  unsigned char *buf;
  uint64_t file_off;
  uint32_t len, done;
  int file;
  int write;
  int fixed;  /* fixed-buffer index, or -1 */
  int eagain; /* an injected -EAGAIN: the ring got a no-op instead of the transfer */
};

struct nfile {
  int fd;
  int linked;          /* the name could not be unlinked at creation: it is, at destroy */
  char path[PATH_MAX]; /* for messages: the file has no name once created */
};

struct fixed {
  unsigned char *base;
  uint64_t len;
  void *arena; /* the host arena this piece belongs to */
};

struct nvme {
  struct nfile files[TZ_MAX_PATHS];
  int n_files;
  uint64_t stripe;
  int direct;
  struct io_uring ring;
  int ring_ok, efd;
  unsigned qd, in_flight;
  pthread_mutex_t mu; /* the submission queue, the pending list, ops' counters, busy time */
  /* Time with requests on the ring (in_flight > 0), as the ring sees it: from the submission
   * that finds it empty to the reaping of the completion that empties it. */
  uint64_t busy_ns, busy_since;
  struct req *pend, **pend_tail;
  struct fixed fixed[MAX_FIXED];
  int fixed_ok;
  tz_tier *t;
  /* Injected faults (tiers/fault.c documents the spec), to exercise the resubmission path with
   * the real ring: the Nth request put on the ring (resubmissions and retries counted) asks the
   * kernel for half its length (nvme-short@N), or is not submitted at all and completes with
   * -EAGAIN (nvme-eagain@N); either way the rest must be moved by complete_req(). */
  uint64_t submitted;
  uint64_t short_at[16], eagain_at[16];
  int n_short, n_eagain;
};

static int nvme_probe(char *why, size_t len) {
  struct io_uring ring;
  int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    snprintf(why, len, "nvme: io_uring_queue_init: %s", strerror(-rc));
    return TZ_ENOTSUP;
  }
  io_uring_queue_exit(&ring);
  if (len)
    why[0] = '\0';
  return 0;
}

/* The direct-I/O alignment of a file: statx(STATX_DIOALIGN), else the filesystem block size. */
static uint64_t dio_align(int fd) {
  uint64_t a = 0;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    a = sx.stx_dio_offset_align > sx.stx_dio_mem_align ? sx.stx_dio_offset_align
                                                       : sx.stx_dio_mem_align;
  }
#endif
  if (!a) {
    struct stat st;
    if (fstat(fd, &st) == 0)
      a = (uint64_t)st.st_blksize;
  }
  return a ? a : 4096;
}

/* Every nvme-short@N and nvme-eagain@N item of the spec (core/faults.h); the others are the fault
 * tier's. */
static int parse_faults(struct nvme *n, const char *spec) {
  struct tz_faults f;
  int rc = tz_faults_parse(spec, &f);
  if (rc < 0) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(rc, "%s: %s", n->t->name, why);
  }
  memcpy(n->short_at, f.short_at, sizeof n->short_at);
  memcpy(n->eagain_at, f.eagain_at, sizeof n->eagain_at);
  n->n_short = f.n_short;
  n->n_eagain = f.n_eagain;
  return 0;
}

static int listed(const uint64_t *at, int count, uint64_t v) {
  for (int i = 0; i < count; i++)
    if (at[i] == v)
      return 1;
  return 0;
}

static int nvme_poll(void *arg);

static void close_files(struct nvme *n) {
  for (int i = 0; i < n->n_files; i++) {
    if (n->files[i].fd >= 0) {
      close(n->files[i].fd);
      if (n->files[i].linked && unlink(n->files[i].path) != 0)
        TZ_WARN("%s: cannot remove %s: %s", n->t->name, n->files[i].path, strerror(errno));
    }
  }
  n->n_files = 0;
}

/* Removes dir's tierzero-<pid>-<tier>-<i>.bin files whose process is gone (left by versions that
 * kept the name until destroy, when killed). A pid that exists, or that kill() may not signal,
 * is alive: its files are never touched. */
static void reclaim_dead(const tz_tier *t, const char *dir) {
  DIR *d = opendir(dir);
  if (!d)
    return; /* the create below names the directory's problem */
  unsigned long long files = 0, bytes = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    int pid = 0, end = 0;
    size_t len = strlen(de->d_name);
    if (sscanf(de->d_name, "tierzero-%d-%n", &pid, &end) != 1 || end == 0 || pid <= 0 || len < 4 ||
        strcmp(de->d_name + len - 4, ".bin") != 0 || pid == (int)getpid())
      continue;
    if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      continue;
    if (unlinkat(dirfd(d), de->d_name, 0) == 0) {
      files++;
      bytes += (unsigned long long)st.st_blocks * 512ull;
    } else if (errno != ENOENT) {
      TZ_WARN("%s: cannot remove %s/%s, left by process %d that is no longer running: %s", t->name,
              dir, de->d_name, pid, strerror(errno));
    }
  }
  closedir(d);
  if (files)
    TZ_INFO("%s: removed %llu file(s) in %s left by processes no longer running (%llu bytes "
            "freed)",
            t->name, files, dir, bytes);
}

static int nvme_init(tz_tier *t, const struct tz_tier_params *p) {
  if (p->n_paths < 1)
    return tz_err_set(TZ_EINVAL, "%s: no directory given (nvme_path)", t->name);
  struct nvme *n = calloc(1, sizeof *n);
  if (!n)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  n->t = t;
  n->pend_tail = &n->pend;
  n->efd = -1;
  pthread_mutex_init(&n->mu, NULL);
  t->ctx = n;
  int rc = parse_faults(n, p->faults);
  if (rc < 0) {
    pthread_mutex_destroy(&n->mu);
    free(n);
    t->ctx = NULL;
    return rc;
  }
  n->stripe = p->stripe_bytes ? p->stripe_bytes : 1ull << 20;
  n->qd = p->queue_depth > 0 ? (unsigned)p->queue_depth : 64;
  n->direct = !p->buffered;
  uint64_t align = 1;
  uint64_t units = (p->capacity + n->stripe - 1) / n->stripe;
  uint64_t per_file = (units + (uint64_t)p->n_paths - 1) / (uint64_t)p->n_paths * n->stripe;
  for (int i = 0; i < p->n_paths; i++) {
    struct nfile *f = &n->files[i];
    reclaim_dead(t, p->paths[i]);
    snprintf(f->path, sizeof f->path, "%s/tierzero-%d-%s-%d.bin", p->paths[i], (int)getpid(),
             t->name, i);
    int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
    f->fd = n->direct ? open(f->path, flags | O_DIRECT, 0600) : -1;
    if (f->fd < 0 && n->direct && errno == EINVAL) {
      TZ_WARN("%s: %s does not support O_DIRECT; using buffered I/O there (slower, and it "
              "competes with the page cache)",
              t->name, p->paths[i]);
      n->direct = 0;
    }
    if (f->fd < 0)
      f->fd = open(f->path, flags, 0600);
    if (f->fd < 0) {
      rc = tz_err_errno(errno, "%s: cannot create %s", t->name, f->path);
      goto fail;
    }
    n->n_files = i + 1;
    if (unlink(f->path) != 0) {
      TZ_WARN("%s: cannot unlink %s once open (%s): it stays until the tier is destroyed, and "
              "after a crash until the next tier created there removes it",
              t->name, f->path, strerror(errno));
      f->linked = 1;
    }
    int e = posix_fallocate(f->fd, 0, (off_t)per_file);
    if (e == EOPNOTSUPP || e == EINVAL) {
      if (ftruncate(f->fd, (off_t)per_file) != 0)
        e = errno;
      else
        e = 0;
    }
    if (e) {
      struct statfs sf;
      unsigned long long avail = statfs(p->paths[i], &sf) == 0 ? (unsigned long long)sf.f_bavail *
                                                                     (unsigned long long)sf.f_bsize
                                                               : 0;
      rc = tz_err_errno(e, "%s: cannot preallocate %llu bytes in %s (%llu bytes available)",
                        t->name, (unsigned long long)per_file, f->path, avail);
      goto fail;
    }
    uint64_t a = dio_align(f->fd);
    if (a > align)
      align = a;
  }
  if (n->direct)
    t->io_align = align < 4096 ? 4096 : align;
  else
    t->io_align = 4096; /* checksum unit; buffered files need no alignment otherwise */
  if (n->stripe % t->io_align) {
    rc = tz_err_set(TZ_EINVAL, "%s: stripe of %llu bytes is not a multiple of the alignment %llu",
                    t->name, (unsigned long long)n->stripe, (unsigned long long)t->io_align);
    goto fail;
  }
  t->capacity = per_file * (uint64_t)p->n_paths;
  t->integrity = p->checksum != 0;
  rc = io_uring_queue_init(n->qd, &n->ring, 0);
  if (rc < 0) {
    rc = tz_err_errno(-rc, "%s: io_uring_queue_init(%u)", t->name, n->qd);
    goto fail;
  }
  n->ring_ok = 1;
  int fds[TZ_MAX_PATHS];
  for (int i = 0; i < n->n_files; i++)
    fds[i] = n->files[i].fd;
  rc = io_uring_register_files(&n->ring, fds, (unsigned)n->n_files);
  if (rc < 0) {
    rc = tz_err_errno(-rc, "%s: io_uring_register_files", t->name);
    goto fail;
  }
  if (io_uring_register_buffers_sparse(&n->ring, MAX_FIXED) == 0)
    n->fixed_ok = 1;
  else
    TZ_INFO("%s: no fixed buffers on this kernel; plain reads and writes", t->name);
  n->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (n->efd < 0 || io_uring_register_eventfd(&n->ring, n->efd) < 0) {
    rc = tz_err_errno(errno, "%s: eventfd for the ring", t->name);
    goto fail;
  }
  rc = tz_progress_add(tz_runtime_progress(t->rt), nvme_poll, t, n->efd);
  if (rc < 0)
    goto fail;
  TZ_INFO("%s: %d file(s), %s, stripe %llu, queue depth %u, alignment %llu", t->name, n->n_files,
          n->direct ? "O_DIRECT" : "buffered", (unsigned long long)n->stripe, n->qd,
          (unsigned long long)t->io_align);
  return 0;
fail:
  if (n->ring_ok)
    io_uring_queue_exit(&n->ring);
  if (n->efd >= 0)
    close(n->efd);
  close_files(n);
  pthread_mutex_destroy(&n->mu);
  free(n);
  t->ctx = NULL;
  return rc;
}

static void nvme_fini(tz_tier *t) {
  struct nvme *n = t->ctx;
  if (!n)
    return;
  /* Operations still in flight complete first: their buffers belong to callers. */
  for (;;) {
    pthread_mutex_lock(&n->mu);
    unsigned busy = n->in_flight;
    int pend = n->pend != NULL;
    pthread_mutex_unlock(&n->mu);
    if (!busy && !pend)
      break;
    tz_progress_kick(tz_runtime_progress(t->rt));
    usleep(100);
  }
  tz_progress_remove(tz_runtime_progress(t->rt), nvme_poll, t);
  struct tz_tier_io_stats st;
  tz_tier_io_stats(t, &st);
  if (st.resubmits || st.retries)
    TZ_INFO("%s: %llu requests resubmitted after a short transfer, %llu retried after -EAGAIN "
            "or -EINTR",
            t->name, (unsigned long long)st.resubmits, (unsigned long long)st.retries);
  io_uring_queue_exit(&n->ring);
  close(n->efd);
  close_files(n);
  pthread_mutex_destroy(&n->mu);
  free(n);
}

static int fixed_index(struct nvme *n, const unsigned char *buf, uint64_t len) {
  if (!n->fixed_ok)
    return -1;
  for (int i = 0; i < MAX_FIXED; i++) {
    const struct fixed *f = &n->fixed[i];
    if (f->base && buf >= f->base && buf + len <= f->base + f->len)
      return i;
  }
  return -1;
}

static int nvme_register_host(tz_tier *t, void *base, uint64_t bytes) {
  struct nvme *n = t->ctx;
  if (!n->fixed_ok)
    return 0;
  pthread_mutex_lock(&n->mu);
  for (uint64_t off = 0; off < bytes; off += FIXED_PIECE) {
    int slot = -1;
    for (int i = 0; i < MAX_FIXED && slot < 0; i++)
      if (!n->fixed[i].base)
        slot = i;
    if (slot < 0)
      break; /* out of slots: the rest is used through plain reads and writes */
    uint64_t len = bytes - off < FIXED_PIECE ? bytes - off : FIXED_PIECE;
    struct iovec iov = {(unsigned char *)base + off, len};
    __u64 tag = 0;
    int rc = io_uring_register_buffers_update_tag(&n->ring, (unsigned)slot, &iov, &tag, 1);
    if (rc < 0) {
      TZ_DEBUG("%s: cannot register %llu bytes as a fixed buffer: %s", t->name,
               (unsigned long long)len, strerror(-rc));
      break;
    }
    n->fixed[slot] = (struct fixed){iov.iov_base, len, base};
  }
  pthread_mutex_unlock(&n->mu);
  return 0;
}

static void nvme_unregister_host(tz_tier *t, void *base) {
  struct nvme *n = t->ctx;
  pthread_mutex_lock(&n->mu);
  for (int i = 0; i < MAX_FIXED; i++) {
    if (n->fixed[i].arena != base)
      continue;
    struct iovec iov = {NULL, 0};
    __u64 tag = 0;
    io_uring_register_buffers_update_tag(&n->ring, (unsigned)i, &iov, &tag, 1);
    n->fixed[i] = (struct fixed){NULL, 0, NULL};
  }
  pthread_mutex_unlock(&n->mu);
}

/* Puts r on the ring, or on the pending list when the ring is full. Called with n->mu held. */
static void queue_req(struct nvme *n, struct req *r) {
  struct io_uring_sqe *sqe = n->in_flight < n->qd ? io_uring_get_sqe(&n->ring) : NULL;
  if (!sqe) {
    r->next = NULL;
    *n->pend_tail = r;
    n->pend_tail = &r->next;
    return;
  }
  unsigned char *b = r->buf + r->done;
  unsigned len = r->len - r->done;
  uint64_t off = r->file_off + r->done;
  n->submitted++;
  if (n->n_short && listed(n->short_at, n->n_short, n->submitted) && len >= 2 * n->t->io_align)
    len = (unsigned)(len / 2 / n->t->io_align * n->t->io_align);
  r->eagain = n->n_eagain && listed(n->eagain_at, n->n_eagain, n->submitted);
  if (r->eagain)
    io_uring_prep_nop(sqe);
  else if (r->fixed >= 0 && r->write)
    io_uring_prep_write_fixed(sqe, r->file, b, len, off, r->fixed);
  else if (r->fixed >= 0)
    io_uring_prep_read_fixed(sqe, r->file, b, len, off, r->fixed);
  else if (r->write)
    io_uring_prep_write(sqe, r->file, b, len, off);
  else
    io_uring_prep_read(sqe, r->file, b, len, off);
  sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, r);
  if (n->in_flight++ == 0)
    n->busy_since = tz_now_ns();
}

static void submit_locked(struct nvme *n) {
  while (n->pend && n->in_flight < n->qd) {
    struct req *r = n->pend;
    n->pend = r->next;
    if (!n->pend)
      n->pend_tail = &n->pend;
    queue_req(n, r);
    if (n->pend == r) /* the ring had no entry after all */
      break;
  }
  int rc = io_uring_submit(&n->ring);
  if (rc < 0 && rc != -EAGAIN && rc != -EBUSY)
    TZ_WARN("%s: io_uring_submit: %s", n->t->name, strerror(-rc));
}

static int nvme_io(tz_tier *t, uint64_t off, unsigned char *buf, uint64_t len, int write,
                   tz_fence **done) {
  struct nvme *n = t->ctx;
  uint64_t n_req = 0;
  for (uint64_t o = off; o < off + len; o = (o / n->stripe + 1) * n->stripe)
    n_req++;
  struct op *op = calloc(1, sizeof *op);
  struct req *reqs = calloc(n_req, sizeof *reqs);
  tz_fence *f = tz_fence_create();
  if (!op || !reqs || !f) {
    free(op);
    free(reqs);
    tz_fence_release(f);
    return tz_err_set(TZ_ENOMEM, "%s: no memory for a request", t->name);
  }
  op->fence = tz_fence_retain(f);
  op->reqs = reqs;
  op->pending = (int)n_req;
  uint64_t i = 0;
  for (uint64_t o = off; o < off + len; i++) {
    uint64_t unit = o / n->stripe, end = (unit + 1) * n->stripe;
    if (end > off + len)
      end = off + len;
    struct req *r = &reqs[i];
    r->op = op;
    r->file = (int)(unit % (uint64_t)n->n_files);
    r->file_off = unit / (uint64_t)n->n_files * n->stripe + o % n->stripe;
    r->buf = buf + (o - off);
    r->len = (uint32_t)(end - o);
    r->write = write;
    r->fixed = fixed_index(n, r->buf, r->len);
    o = end;
  }
  pthread_mutex_lock(&n->mu);
  for (i = 0; i < n_req; i++)
    queue_req(n, &reqs[i]);
  submit_locked(n);
  pthread_mutex_unlock(&n->mu);
  *done = f;
  return 0;
}

static int nvme_read(tz_tier *t, uint64_t off, void *buf, uint64_t n, tz_fence **done) {
  return nvme_io(t, off, buf, n, 0, done);
}

static int nvme_write(tz_tier *t, uint64_t off, const void *buf, uint64_t n, tz_fence **done) {
  return nvme_io(t, off, (unsigned char *)buf, n, 1, done);
}

static void where(struct nvme *n, const struct req *r, char *buf, size_t len) {
  snprintf(buf, len, "%s offset %llu", n->files[r->file].path,
           (unsigned long long)(r->file_off + r->done));
}

/* One completion. Returns 1 when r is finished (ok or failed), 0 when it was resubmitted.
 * Called with n->mu held. */
static int complete_req(struct nvme *n, struct req *r, int res) {
  if (r->eagain) {
    r->eagain = 0;
    res = -EAGAIN;
  }
  struct op *op = r->op;
  if (res == -EAGAIN || res == -EINTR) {
    __atomic_add_fetch(&n->t->retries, 1, __ATOMIC_RELAXED);
    queue_req(n, r);
    return 0;
  }
  if (res < 0 || (res == 0 && r->done < r->len)) {
    if (op->rc == 0) {
      char w[PATH_MAX + 64];
      where(n, r, w, sizeof w);
      op->rc = res < 0 ? tz_err_from_errno(-res) : TZ_EIO;
      snprintf(op->msg, sizeof op->msg, "%s: %s of %u bytes at %s failed: %s", n->t->name,
               r->write ? "write" : "read", r->len - r->done, w,
               res < 0 ? strerror(-res) : "unexpected end of file");
    }
    return 1;
  }
  r->done += (uint32_t)res;
  if (r->done < r->len) {
    __atomic_add_fetch(&n->t->resubmits, 1, __ATOMIC_RELAXED);
    queue_req(n, r);
    return 0;
  }
  return 1;
}

static int nvme_poll(void *arg) {
  tz_tier *t = arg;
  struct nvme *n = t->ctx;
  struct op *finished[64];
  int n_fin = 0, handled = 0;
  pthread_mutex_lock(&n->mu);
  struct io_uring_cqe *cqe;
  while (n_fin < 64 && io_uring_peek_cqe(&n->ring, &cqe) == 0) {
    struct req *r = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&n->ring, cqe);
    if (--n->in_flight == 0)
      n->busy_ns += tz_now_ns() - n->busy_since;
    handled++;
    if (complete_req(n, r, res) && --r->op->pending == 0)
      finished[n_fin++] = r->op;
  }
  if (handled)
    submit_locked(n);
  pthread_mutex_unlock(&n->mu);
  /* Fences are signalled outside the lock: their callbacks submit the next stage, maybe here. */
  for (int i = 0; i < n_fin; i++) {
    struct op *op = finished[i];
    tz_fence_signal_msg(op->fence, op->rc, op->msg);
    tz_fence_release(op->fence);
    free(op->reqs);
    free(op);
  }
  return handled;
}

static uint64_t nvme_busy_ns(const tz_tier *t) {
  struct nvme *n = t->ctx;
  if (!n)
    return 0;
  pthread_mutex_lock(&n->mu);
  uint64_t b = n->busy_ns + (n->in_flight ? tz_now_ns() - n->busy_since : 0);
  pthread_mutex_unlock(&n->mu);
  return b;
}

static void nvme_describe(tz_tier *t, uint64_t off, char *buf, size_t len) {
  struct nvme *n = t->ctx;
  uint64_t unit = off / n->stripe;
  snprintf(buf, len, "%s offset %llu", n->files[unit % (uint64_t)n->n_files].path,
           (unsigned long long)(unit / (uint64_t)n->n_files * n->stripe + off % n->stripe));
}

const struct tz_tier_ops tz_tier_nvme_ops = {
    .name = "nvme",
    .probe = nvme_probe,
    .init = nvme_init,
    .fini = nvme_fini,
    .read = nvme_read,
    .write = nvme_write,
    .register_host = nvme_register_host,
    .unregister_host = nvme_unregister_host,
    .describe = nvme_describe,
    .busy_ns = nvme_busy_ns,
};
