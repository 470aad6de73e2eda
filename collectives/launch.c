#define _GNU_SOURCE
#include "collectives/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collectives/comm_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "util/clock.h"

extern char **environ;

/* Every exchange is a header and a payload; the header's seq catches a rank that is one exchange
 * ahead of or behind rank 0 (a bug in the caller, or a stale connection). */
#define BS_MAGIC 0x545a4253u /* "TZBS" */
struct bs_header {
  uint32_t magic;
  uint32_t seq;
  uint32_t len; /* payload bytes */
  int32_t rank; /* the sender (TCP hello) */
};
#define BS_MSG_MAX (sizeof(struct bs_header) + TZ_BOOTSTRAP_MAX_BLOB)
_Static_assert(BS_MSG_MAX <= PIPE_BUF, "a relay message must be one atomic pipe write");

static int ms_left(double deadline) {
  double left = deadline - tz_now_s();
  if (left <= 0)
    return 0;
  return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

const char *tz_launch_kind_name(enum tz_launch_kind k) {
  switch (k) {
  case TZ_LAUNCH_SINGLE: return "single";
  case TZ_LAUNCH_NPROC: return "nproc";
  case TZ_LAUNCH_TORCHRUN: return "torchrun";
  case TZ_LAUNCH_MPIRUN: return "mpirun";
  case TZ_LAUNCH_SLURM: return "slurm";
  }
  return "?";
}

/* ---- Detection ---- */

/* 1 and *out when name is set to a whole integer, 0 when unset, TZ_ECONFIG when malformed. */
static int env_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || !*s)
    return 0;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < INT_MIN || v > INT_MAX)
    return tz_err_set(TZ_ECONFIG, "launch: %s=%s is not an integer", name, s);
  *out = (int)v;
  return 1;
}

/* The leading integer of a Slurm tasks-per-node value such as "4(x2),3". */
static int env_leading_int(const char *name, int *out) {
  const char *s = getenv(name);
  if (!s || *s < '0' || *s > '9')
    return 0;
  *out = (int)strtol(s, NULL, 10);
  return 1;
}

/* The first host of a Slurm node list: "gpu[03-05,9],cpu1" gives "gpu03". */
static int slurm_first_host(const char *list, char *out, size_t len) {
  size_t i = 0;
  while (list[i] && list[i] != ',' && list[i] != '[')
    i++;
  if (i == 0 || i >= len)
    return TZ_EINVAL;
  memcpy(out, list, i);
  size_t n = i;
  if (list[i] == '[') {
    size_t j = i + 1;
    while (list[j] >= '0' && list[j] <= '9') {
      if (n + 1 >= len)
        return TZ_EINVAL;
      out[n++] = list[j++];
    }
    if (j == i + 1)
      return TZ_EINVAL;
  }
  out[n] = '\0';
  return 0;
}

void tz_bootstrap_single(struct tz_bootstrap *bs) {
  memset(bs, 0, sizeof *bs);
  bs->kind = TZ_LAUNCH_SINGLE;
  bs->size = 1;
  bs->local_size = 1;
  bs->fd_from_parent = -1;
  bs->fd_to_parent = -1;
  bs->timeout_s = tz_comm_env_timeout();
}

/* Reads the rank variables of one launcher. Returns 1 when found, 0 when the launcher's rank
 * variable is absent, negative on a malformed value. */
static int read_world(struct tz_bootstrap *bs, const char *rank, const char *size,
                      const char *local_rank, const char *local_size) {
  int rc = env_int(rank, &bs->rank);
  if (rc <= 0)
    return rc;
  rc = env_int(size, &bs->size);
  if (rc < 0)
    return rc;
  if (rc == 0)
    return tz_err_set(TZ_ECONFIG, "launch: %s is set but %s is not", rank, size);
  if (local_rank && (rc = env_int(local_rank, &bs->local_rank)) < 0)
    return rc;
  if (local_size && (rc = env_int(local_size, &bs->local_size)) < 0)
    return rc;
  return 1;
}

static int read_master(struct tz_bootstrap *bs) {
  const char *addr = getenv("MASTER_ADDR");
  if (addr && *addr) {
    if (strlen(addr) >= sizeof bs->master_addr)
      return tz_err_set(TZ_ECONFIG, "launch: MASTER_ADDR is longer than %zu bytes",
                        sizeof bs->master_addr - 1);
    strcpy(bs->master_addr, addr);
  }
  int rc = env_int("MASTER_PORT", &bs->master_port);
  if (rc < 0)
    return rc;
  /* A torchrun agent that hosts its own store on MASTER_PORT leaves that port taken on rank 0's
   * machine; the next one is ours. TZ_MASTER_PORT overrides both. */
  const char *agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (rc > 0 && agent_store && strcasecmp(agent_store, "true") == 0)
    bs->master_port++;
  if ((rc = env_int("TZ_MASTER_PORT", &bs->master_port)) < 0)
    return rc;
  return 0;
}

int tz_bootstrap_detect(struct tz_bootstrap *bs) {
  tz_bootstrap_single(bs);
  bs->local_size = 0;
  int rc;
  if ((rc = read_world(bs, "TZ_RANK", "TZ_WORLD_SIZE", "TZ_LOCAL_RANK", "TZ_LOCAL_WORLD_SIZE")) >
      0) {
    bs->kind = TZ_LAUNCH_NPROC;
    const char *fds = getenv("TZ_BOOTSTRAP_FDS");
    if (fds && sscanf(fds, "%d,%d", &bs->fd_from_parent, &bs->fd_to_parent) != 2)
      return tz_err_set(TZ_ECONFIG, "launch: TZ_BOOTSTRAP_FDS=%s is not 'read_fd,write_fd'", fds);
  } else if (rc == 0 &&
             (rc = read_world(bs, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")) > 0) {
    bs->kind = TZ_LAUNCH_TORCHRUN;
    TZ_CHECK(read_master(bs));
  } else if (rc == 0 &&
             ((rc = read_world(bs, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")) > 0 ||
              (rc == 0 && (rc = read_world(bs, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS")) > 0))) {
    bs->kind = TZ_LAUNCH_MPIRUN;
    TZ_CHECK(read_master(bs));
  } else if (rc == 0 && (getenv("SLURM_STEP_ID") || getenv("SLURM_STEPID")) &&
             (rc = read_world(bs, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL)) > 0) {
    /* Only inside an srun step: a batch script also has SLURM_PROCID=0 and SLURM_NTASKS=N, and
     * taking those for a world would wait for N-1 ranks that were never started. */
    bs->kind = TZ_LAUNCH_SLURM;
    int step_tasks = 0;
    if ((rc = env_int("SLURM_STEP_NUM_TASKS", &step_tasks)) < 0)
      return rc;
    if (rc > 0)
      bs->size = step_tasks;
    if (!env_leading_int("SLURM_STEP_TASKS_PER_NODE", &bs->local_size))
      env_leading_int("SLURM_NTASKS_PER_NODE", &bs->local_size);
    TZ_CHECK(read_master(bs));
    if (!bs->master_addr[0]) {
      const char *list = getenv("SLURM_STEP_NODELIST");
      if (!list)
        list = getenv("SLURM_JOB_NODELIST");
      if (!list)
        list = getenv("SLURM_NODELIST");
      if (list && slurm_first_host(list, bs->master_addr, sizeof bs->master_addr) < 0)
        return tz_err_set(TZ_ECONFIG,
                          "launch: cannot read the first host of node list '%s'; "
                          "set MASTER_ADDR",
                          list);
    }
    if (!bs->master_port) {
      /* One port per job, so that two jobs sharing a node do not collide. */
      int job = 0;
      if (env_int("SLURM_JOB_ID", &job) < 0)
        job = 0;
      bs->master_port = 20000 + (job % 20000);
    }
  }
  if (rc < 0)
    return rc;
  if (bs->size < 1 || bs->rank < 0 || bs->rank >= bs->size)
    return tz_err_set(TZ_ECONFIG, "launch (%s): rank %d is outside a world of %d",
                      tz_launch_kind_name(bs->kind), bs->rank, bs->size);
  if (bs->local_size <= 0)
    bs->local_size = bs->kind == TZ_LAUNCH_SINGLE ? 1 : bs->local_rank + 1;
  if (bs->local_rank < 0 || bs->local_rank >= bs->local_size)
    return tz_err_set(TZ_ECONFIG, "launch (%s): local rank %d is outside %d local ranks",
                      tz_launch_kind_name(bs->kind), bs->local_rank, bs->local_size);
  if (bs->master_addr[0] && (bs->master_port <= 0 || bs->master_port > 65535))
    return tz_err_set(TZ_ECONFIG,
                      "launch (%s): MASTER_ADDR=%s needs MASTER_PORT in 1..65535 "
                      "(got %d)",
                      tz_launch_kind_name(bs->kind), bs->master_addr, bs->master_port);
  return 0;
}

/* Rank 0 writes to the launcher, the others read from it. */
static int has_pipe(const struct tz_bootstrap *bs) {
  return bs->rank == 0 ? bs->fd_to_parent >= 0 : bs->fd_from_parent >= 0;
}

int tz_bootstrap_has_channel(const struct tz_bootstrap *bs) {
  return bs->size == 1 || bs->bcast_fn || has_pipe(bs) || bs->master_addr[0];
}

/* ---- Byte moving with deadlines ---- */

static int write_all(int fd, const void *buf, size_t n, double deadline, const char *what) {
  const char *p = buf;
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= (size_t)w;
      continue;
    }
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int ms = ms_left(deadline);
      if (ms == 0)
        return tz_err_set(TZ_ETIMEDOUT, "bootstrap: timed out writing to %s", what);
      poll(&pfd, 1, ms);
      continue;
    }
    return tz_err_errno(w < 0 ? errno : EPIPE, "bootstrap: write to %s", what);
  }
  return 0;
}

/* Reads exactly n bytes. TZ_ECOMM on end of file (the peer went away), TZ_ETIMEDOUT. */
static int read_all(int fd, void *buf, size_t n, double deadline, const char *what) {
  char *p = buf;
  while (n) {
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int ms = ms_left(deadline);
    if (ms == 0)
      return tz_err_set(TZ_ETIMEDOUT, "bootstrap: timed out reading from %s", what);
    int pr = poll(&pfd, 1, ms);
    if (pr < 0 && errno != EINTR)
      return tz_err_errno(errno, "bootstrap: poll on %s", what);
    if (pr <= 0)
      continue;
    ssize_t r = read(fd, p, n);
    if (r > 0) {
      p += r;
      n -= (size_t)r;
    } else if (r == 0) {
      return tz_err_set(TZ_ECOMM, "bootstrap: %s closed the connection", what);
    } else if (errno != EINTR && errno != EAGAIN) {
      return tz_err_errno(errno, "bootstrap: read from %s", what);
    }
  }
  return 0;
}

static int check_header(const struct bs_header *h, const struct tz_bootstrap *bs, size_t len,
                        const char *what) {
  if (h->magic != BS_MAGIC)
    return tz_err_set(TZ_ECOMM, "bootstrap: rank %d: %s sent a message without the magic", bs->rank,
                      what);
  if (h->seq != bs->seq || h->len != len)
    return tz_err_set(TZ_ECOMM,
                      "bootstrap: rank %d: exchange %u of %zu bytes does not match "
                      "%s's exchange %u of %u bytes (ranks disagree on the order of set-up)",
                      bs->rank, bs->seq, len, what, h->seq, h->len);
  return 0;
}

/* ---- The relay pipes of tz_launch_nproc ---- */

static int pipe_bcast(struct tz_bootstrap *bs, void *buf, size_t len) {
  double deadline = tz_now_s() + bs->timeout_s;
  char msg[BS_MSG_MAX];
  struct bs_header h = {.magic = BS_MAGIC, .seq = bs->seq, .len = (uint32_t)len, .rank = bs->rank};
  if (bs->rank == 0) {
    memcpy(msg, &h, sizeof h);
    memcpy(msg + sizeof h, buf, len);
    return write_all(bs->fd_to_parent, msg, sizeof h + len, deadline, "the launcher");
  }
  TZ_CHECK(read_all(bs->fd_from_parent, &h, sizeof h, deadline, "the launcher"));
  TZ_CHECK(check_header(&h, bs, len, "rank 0"));
  return read_all(bs->fd_from_parent, buf, len, deadline, "the launcher");
}

/* ---- TCP rendezvous with rank 0 ---- */

static int tcp_listen(const struct tz_bootstrap *bs, int *out) {
  char port[16];
  snprintf(port, sizeof port, "%d", bs->master_port);
  struct addrinfo hints = {
      .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
  struct addrinfo *ai;
  int g = getaddrinfo(NULL, port, &hints, &ai);
  if (g)
    return tz_err_set(TZ_ECOMM, "bootstrap: getaddrinfo for port %s: %s", port, gai_strerror(g));
  int err = 0, fd = -1;
  for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) < 0 || listen(fd, 128) < 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(ai);
  if (fd < 0)
    return tz_err_errno(err, "bootstrap: rank 0 cannot listen on port %d%s", bs->master_port,
                        err == EADDRINUSE ? " (taken: set TZ_MASTER_PORT to a free port)" : "");
  *out = fd;
  return 0;
}

/* Rank 0: serves one exchange to each of the other ranks, as they connect. */
static int tcp_serve(struct tz_bootstrap *bs, const void *buf, size_t len) {
  double deadline = tz_now_s() + bs->timeout_s;
  int lfd = -1;
  TZ_CHECK(tcp_listen(bs, &lfd));
  unsigned char *served = calloc((size_t)bs->size, 1);
  if (!served) {
    close(lfd);
    return tz_err_set(TZ_ENOMEM, "bootstrap: out of memory");
  }
  char msg[BS_MSG_MAX];
  struct bs_header h = {.magic = BS_MAGIC, .seq = bs->seq, .len = (uint32_t)len, .rank = 0};
  memcpy(msg, &h, sizeof h);
  memcpy(msg + sizeof h, buf, len);
  int rc = 0, left = bs->size - 1;
  while (left > 0) {
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int ms = ms_left(deadline);
    if (ms == 0) {
      char missing[256] = "";
      size_t n = 0;
      for (int r = 1; r < bs->size && n + 16 < sizeof missing; r++)
        if (!served[r])
          n += (size_t)snprintf(missing + n, sizeof missing - n, "%s%d", n ? " " : "", r);
      rc = tz_err_set(TZ_ETIMEDOUT,
                      "bootstrap: rank 0 waited %.0f s on port %d for %d of %d ranks;"
                      " missing: %s",
                      bs->timeout_s, bs->master_port, left, bs->size - 1, missing);
      break;
    }
    int pr = poll(&pfd, 1, ms);
    if (pr <= 0)
      continue;
    int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (cfd < 0)
      continue;
    struct bs_header hello;
    /* A peer gets a short while to say who it is, so that a stray connection cannot stall us. */
    double hello_deadline = tz_now_s() + 5.0 < deadline ? tz_now_s() + 5.0 : deadline;
    if (read_all(cfd, &hello, sizeof hello, hello_deadline, "a connecting rank") == 0 &&
        hello.magic == BS_MAGIC && hello.rank > 0 && hello.rank < bs->size) {
      if (hello.seq != bs->seq || hello.len != len) {
        /* Closed without an answer: a peer one exchange ahead retries until we get there. */
        TZ_DEBUG("bootstrap: rank %d came for exchange %u, serving %u", hello.rank, hello.seq,
                 bs->seq);
      } else if (write_all(cfd, msg, sizeof h + len, deadline, "a connecting rank") == 0) {
        if (!served[hello.rank]) {
          served[hello.rank] = 1;
          left--;
        }
      }
    }
    close(cfd);
  }
  free(served);
  close(lfd);
  return rc;
}

static int tcp_connect_once(const struct tz_bootstrap *bs, double deadline, int *out) {
  char port[16];
  snprintf(port, sizeof port, "%d", bs->master_port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  struct addrinfo *ai;
  int g = getaddrinfo(bs->master_addr, port, &hints, &ai);
  if (g)
    return tz_err_set(TZ_ECOMM, "bootstrap: cannot resolve MASTER_ADDR %s: %s", bs->master_addr,
                      gai_strerror(g));
  int rc = TZ_ECOMM;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0)
      continue;
    int c = connect(fd, a->ai_addr, a->ai_addrlen);
    if (c < 0 && errno == EINPROGRESS) {
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int ms = ms_left(deadline);
      if (poll(&pfd, 1, ms < 5000 ? ms : 5000) == 1) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        c = err ? -1 : 0;
        errno = err ? err : ETIMEDOUT;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (c == 0) {
      *out = fd;
      rc = 0;
      break;
    }
    rc = tz_err_errno(errno, "bootstrap: connect to %s:%d", bs->master_addr, bs->master_port);
    close(fd);
  }
  freeaddrinfo(ai);
  return rc;
}

static int tcp_fetch(struct tz_bootstrap *bs, void *buf, size_t len) {
  double deadline = tz_now_s() + bs->timeout_s;
  struct bs_header hello = {
      .magic = BS_MAGIC, .seq = bs->seq, .len = (uint32_t)len, .rank = bs->rank};
  int rc = 0;
  for (;;) {
    int fd = -1;
    rc = tcp_connect_once(bs, deadline, &fd);
    if (rc == 0) {
      struct bs_header h;
      rc = write_all(fd, &hello, sizeof hello, deadline, "rank 0");
      if (rc == 0)
        rc = read_all(fd, &h, sizeof h, deadline, "rank 0");
      if (rc == 0 && (rc = check_header(&h, bs, len, "rank 0")) == 0)
        rc = read_all(fd, buf, len, deadline, "rank 0");
      close(fd);
      if (rc == 0)
        return 0;
    }
    /* Rank 0 may not be listening yet, or is still serving the previous exchange. */
    if (tz_now_s() + 0.1 >= deadline)
      break;
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return tz_err_set(TZ_ETIMEDOUT,
                    "bootstrap: rank %d could not get exchange %u from rank 0 at "
                    "%s:%d within %.0f s; last error: %s",
                    bs->rank, bs->seq, bs->master_addr, bs->master_port, bs->timeout_s,
                    tz_err_msg());
}

int tz_bootstrap_bcast(struct tz_bootstrap *bs, void *buf, size_t len) {
  if (len > TZ_BOOTSTRAP_MAX_BLOB)
    return tz_err_set(TZ_EINVAL, "bootstrap: %zu bytes is more than the %d a broadcast carries",
                      len, TZ_BOOTSTRAP_MAX_BLOB);
  if (bs->size == 1)
    return 0;
  int rc;
  if (bs->bcast_fn)
    rc = bs->bcast_fn(bs->bcast_arg, buf, len);
  else if (has_pipe(bs))
    rc = pipe_bcast(bs, buf, len);
  else if (bs->master_addr[0])
    rc = bs->rank == 0 ? tcp_serve(bs, buf, len) : tcp_fetch(bs, buf, len);
  else
    return tz_err_set(TZ_ENOTSUP,
                      "bootstrap (%s): rank %d of %d has no way to reach rank 0: set "
                      "MASTER_ADDR and MASTER_PORT, or launch with --nproc or mpirun",
                      tz_launch_kind_name(bs->kind), bs->rank, bs->size);
  if (rc == 0)
    bs->seq++;
  return rc;
}

/* ---- tz_launch_nproc: the parent ---- */

int tz_launch_is_worker(void) {
  const char *s = getenv("TZ_RANK");
  return s && *s;
}

void tz_launch_params_init(struct tz_launch_params *lp) {
  memset(lp, 0, sizeof *lp);
  lp->nproc = 1;
  lp->grace_s = 5;
}

/* Parses a Linux cpu list ("0-3,8,10-11") into set. */
static int parse_cpulist(const char *s, cpu_set_t *set) {
  CPU_ZERO(set);
  const char *p = s;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b;
    if (end == p || a < 0 || a >= CPU_SETSIZE)
      return TZ_EINVAL;
    b = a;
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (end == p + 1 || b < a || b >= CPU_SETSIZE)
        return TZ_EINVAL;
      p = end;
    }
    for (long c = a; c <= b; c++)
      CPU_SET((int)c, set);
    if (*p == ',')
      p++;
    else if (*p)
      return TZ_EINVAL;
  }
  return CPU_COUNT(set) ? 0 : TZ_EINVAL;
}

struct child {
  pid_t pid;
  int down_w; /* parent writes relayed blobs here; -1 when closed */
  int up_r;   /* rank 0 only: its blobs arrive here; -1 else */
  int running;
  char **envp;
};

static volatile sig_atomic_t forwarded_signal;

static void on_signal(int sig) { forwarded_signal = sig; }

static char *env_entry(const char *name, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static char *env_entry(const char *name, const char *fmt, ...) {
  char value[128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(value, sizeof value, fmt, ap);
  va_end(ap);
  char *s = NULL;
  if (asprintf(&s, "%s=%s", name, value) < 0)
    return NULL;
  return s;
}

static int is_launch_var(const char *e) {
  static const char *const names[] = {
      "TZ_RANK=", "TZ_WORLD_SIZE=", "TZ_LOCAL_RANK=", "TZ_LOCAL_WORLD_SIZE=", "TZ_BOOTSTRAP_FDS="};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strncmp(e, names[i], strlen(names[i])) == 0)
      return 1;
  return 0;
}

/* The environment of worker `rank`: ours without launch variables, plus the worker's. */
static char **worker_env(int rank, int n, int fd_in, int fd_out) {
  size_t count = 0;
  for (char **e = environ; *e; e++)
    count++;
  char **envp = calloc(count + 8, sizeof *envp);
  if (!envp)
    return NULL;
  size_t k = 0;
  int ok = 1;
  for (char **e = environ; *e; e++)
    if (!is_launch_var(*e))
      envp[k++] = strdup(*e);
  envp[k++] = env_entry("TZ_RANK", "%d", rank);
  envp[k++] = env_entry("TZ_WORLD_SIZE", "%d", n);
  envp[k++] = env_entry("TZ_LOCAL_RANK", "%d", rank);
  envp[k++] = env_entry("TZ_LOCAL_WORLD_SIZE", "%d", n);
  envp[k++] = env_entry("TZ_BOOTSTRAP_FDS", "%d,%d", fd_in, fd_out);
  /* NVLink SHARP multicast needs a fabric manager set-up that these machines do not have. */
  if (!getenv("NCCL_NVLS_ENABLE"))
    envp[k++] = strdup("NCCL_NVLS_ENABLE=0");
  for (size_t i = 0; i < k; i++)
    ok &= envp[i] != NULL;
  if (!ok) {
    for (size_t i = 0; i < k; i++)
      free(envp[i]);
    free(envp);
    return NULL;
  }
  return envp;
}

static void free_env(char **envp) {
  if (!envp)
    return;
  for (char **e = envp; *e; e++)
    free(*e);
  free(envp);
}

static void describe_exit(int rank, int status, char *msg, size_t len) {
  if (WIFSIGNALED(status))
    snprintf(msg, len, "rank %d died (signal %d: %s)", rank, WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  else
    snprintf(msg, len, "rank %d exited with status %d", rank, WEXITSTATUS(status));
}

/* Reads what rank 0 wrote and passes every complete message on to the other ranks. */
static void relay(struct child *ch, int n, char *buf, size_t *have) {
  ssize_t r = read(ch[0].up_r, buf + *have, BS_MSG_MAX - *have);
  if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
    close(ch[0].up_r);
    ch[0].up_r = -1;
    return;
  }
  if (r < 0)
    return;
  *have += (size_t)r;
  while (*have >= sizeof(struct bs_header)) {
    struct bs_header h;
    memcpy(&h, buf, sizeof h);
    if (h.magic != BS_MAGIC || h.len > TZ_BOOTSTRAP_MAX_BLOB) {
      TZ_LOG_ERR("launch: rank 0 wrote a malformed bootstrap message; no more relaying");
      close(ch[0].up_r);
      ch[0].up_r = -1;
      *have = 0;
      return;
    }
    size_t m = sizeof h + h.len;
    if (*have < m)
      return;
    for (int i = 1; i < n; i++) {
      if (ch[i].down_w < 0)
        continue;
      /* One write of at most PIPE_BUF bytes: whole or not at all. A worker that has not read
       * 16 earlier messages is not reading at all; it will time out on its own. */
      if (write(ch[i].down_w, buf, m) != (ssize_t)m)
        TZ_WARN("launch: could not pass bootstrap message %u to rank %d: %s", h.seq, i,
                strerror(errno));
    }
    memmove(buf, buf + m, *have - m);
    *have -= m;
  }
}

int tz_launch_run(const struct tz_launch_params *lp, int argc, char **argv,
                  struct tz_launch_result *res) {
  struct tz_launch_result local;
  if (!res)
    res = &local;
  *res = (struct tz_launch_result){.failed_rank = -1, .exit_status = -1};
  int n = lp->nproc;
  if (n < 1 || n > 4096 || argc < 1 || !argv)
    return tz_err_set(TZ_EINVAL, "launch: nproc %d must be in 1..4096", n);
  (void)argc;
  double grace = lp->grace_s > 0 ? lp->grace_s : 5;

  cpu_set_t *sets = NULL;
  if (lp->cpulists) {
    sets = calloc((size_t)n, sizeof *sets);
    if (!sets)
      return tz_err_set(TZ_ENOMEM, "launch: out of memory");
    for (int i = 0; i < n; i++)
      if (!lp->cpulists[i] || parse_cpulist(lp->cpulists[i], &sets[i]) < 0) {
        free(sets);
        return tz_err_set(TZ_EINVAL,
                          "launch: CPU list '%s' for local rank %d is not a Linux cpu "
                          "list such as 0-15,32-47",
                          lp->cpulists[i] ? lp->cpulists[i] : "(null)", i);
      }
  }
  struct child *ch = calloc((size_t)n, sizeof *ch);
  if (!ch) {
    free(sets);
    return tz_err_set(TZ_ENOMEM, "launch: out of memory");
  }
  for (int i = 0; i < n; i++)
    ch[i].down_w = ch[i].up_r = -1;

  /* Handlers go in before the first fork so that a signal in between is not lost; the workers
   * get the default dispositions back before exec. */
  struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term, old_hup, old_pipe;
  sigemptyset(&sa.sa_mask);
  forwarded_signal = 0;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  sigaction(SIGHUP, &sa, &old_hup);
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigemptyset(&ign.sa_mask);
  sigaction(SIGPIPE, &ign, &old_pipe);
  pid_t parent = getpid();
  int rc = 0, started = 0;
  char msg[256] = "";

  for (int i = 0; i < n; i++) {
    int down[2], up[2] = {-1, -1};
    if (pipe2(down, O_CLOEXEC) < 0 || (i == 0 && pipe2(up, O_CLOEXEC) < 0)) {
      rc = tz_err_errno(errno, "launch: pipe for rank %d", i);
      break;
    }
    ch[i].envp = worker_env(i, n, down[0], up[1]);
    if (!ch[i].envp) {
      close(down[0]), close(down[1]);
      if (up[0] >= 0)
        close(up[0]), close(up[1]);
      rc = tz_err_set(TZ_ENOMEM, "launch: out of memory");
      break;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      rc = tz_err_errno(errno, "launch: fork for rank %d", i);
      close(down[0]), close(down[1]);
      if (up[0] >= 0)
        close(up[0]), close(up[1]);
      break;
    }
    if (pid == 0) {
      /* The worker: only async-signal-safe calls until exec. */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(127);
      struct sigaction dfl = {.sa_handler = SIG_DFL};
      sigemptyset(&dfl.sa_mask);
      sigaction(SIGINT, &dfl, NULL);
      sigaction(SIGTERM, &dfl, NULL);
      sigaction(SIGHUP, &dfl, NULL);
      sigaction(SIGPIPE, &dfl, NULL);
      fcntl(down[0], F_SETFD, 0);
      if (up[1] >= 0)
        fcntl(up[1], F_SETFD, 0);
      if (sets)
        sched_setaffinity(0, sizeof sets[i], &sets[i]);
      execve("/proc/self/exe", argv, ch[i].envp);
      static const char fail[] = "tierzero error: launch: cannot execute /proc/self/exe\n";
      ssize_t ignored = write(2, fail, sizeof fail - 1);
      (void)ignored;
      _exit(127);
    }
    started++;
    ch[i].pid = pid;
    ch[i].running = 1;
    close(down[0]);
    ch[i].down_w = down[1];
    fcntl(ch[i].down_w, F_SETFL, O_NONBLOCK);
    if (i == 0) {
      close(up[1]);
      ch[i].up_r = up[0];
      fcntl(ch[i].up_r, F_SETFL, O_NONBLOCK);
    }
  }

  char relay_buf[BS_MSG_MAX];
  size_t relay_have = 0;
  int running = started, stopping = rc < 0;
  double kill_at = stopping ? tz_now_s() + grace : 0;
  if (stopping) {
    for (int i = 0; i < n; i++)
      if (ch[i].running)
        kill(ch[i].pid, SIGTERM);
  }
  while (running > 0) {
    struct pollfd pfd = {.fd = ch[0].up_r, .events = POLLIN};
    int pr = poll(&pfd, ch[0].up_r >= 0 ? 1 : 0, 50);
    if (pr > 0 && ch[0].up_r >= 0)
      relay(ch, n, relay_buf, &relay_have);
    if (forwarded_signal && !stopping) {
      int sig = forwarded_signal;
      TZ_LOG_ERR("launch: got signal %d (%s); stopping %d workers", sig, strsignal(sig), running);
      for (int i = 0; i < n; i++)
        if (ch[i].running)
          kill(ch[i].pid, sig);
      stopping = 1;
      kill_at = tz_now_s() + grace;
      if (!msg[0])
        snprintf(msg, sizeof msg, "stopped by signal %d (%s)", sig, strsignal(sig));
      if (res->failed_rank < 0)
        res->signal = sig, res->exit_code = 128 + sig;
    }
    for (int i = 0; i < n; i++) {
      if (!ch[i].running)
        continue;
      int status;
      pid_t w = waitpid(ch[i].pid, &status, WNOHANG);
      if (w == 0 || (w < 0 && errno == EINTR))
        continue;
      ch[i].running = 0;
      running--;
      if (ch[i].down_w >= 0) {
        close(ch[i].down_w);
        ch[i].down_w = -1;
      }
      int failed = w < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (!failed || stopping) {
        if (failed) {
          char m[160];
          describe_exit(i, status, m, sizeof m);
          TZ_INFO("launch: %s", m);
        }
        continue;
      }
      describe_exit(i, status, msg, sizeof msg);
      res->failed_rank = i;
      res->exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      res->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      res->exit_code = res->signal ? 128 + res->signal : res->exit_status;
      TZ_LOG_ERR("%s; stopping the other %d rank%s", msg, running, running == 1 ? "" : "s");
      for (int j = 0; j < n; j++)
        if (ch[j].running)
          kill(ch[j].pid, SIGTERM);
      stopping = 1;
      kill_at = tz_now_s() + grace;
    }
    if (stopping && running > 0 && tz_now_s() >= kill_at) {
      TZ_LOG_ERR("launch: %d worker%s still running %.1f s after SIGTERM; sending SIGKILL", running,
                 running == 1 ? "" : "s", grace);
      for (int i = 0; i < n; i++)
        if (ch[i].running)
          kill(ch[i].pid, SIGKILL);
      kill_at = tz_now_s() + 3600;
    }
  }

  for (int i = 0; i < n; i++) {
    if (ch[i].down_w >= 0)
      close(ch[i].down_w);
    if (ch[i].up_r >= 0)
      close(ch[i].up_r);
    free_env(ch[i].envp);
  }
  free(ch);
  free(sets);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  sigaction(SIGPIPE, &old_pipe, NULL);
  if (rc < 0) {
    if (res->exit_code == 0)
      res->exit_code = 1;
    return rc;
  }
  if (msg[0]) {
    if (res->exit_code == 0)
      res->exit_code = 1;
    return tz_err_set(TZ_ECOMM, "launch: %s", msg);
  }
  return 0;
}

int tz_launch_nproc(int n, int argc, char **argv) {
  struct tz_launch_params lp;
  tz_launch_params_init(&lp);
  lp.nproc = n;
  struct tz_launch_result res;
  int rc = tz_launch_run(&lp, argc, argv, &res);
  if (rc < 0 && res.failed_rank < 0)
    TZ_LOG_ERR("%s", tz_err_msg());
  return rc < 0 ? (res.exit_code ? res.exit_code : 1) : 0;
}
