/* Measuring the plan's machine rates (trainer/step/rates.h); their cache is
 * trainer/step/rates_cache.c. */
#define _GNU_SOURCE
#include "trainer/step/rates.h"
#include "trainer/step/machine.h"
#include "trainer/step/rates_cache.h"
#include "core/error.h"
#include "core/log.h"
#include "core/tier.h"
#include "kernels/adam.h"
#include "kernels/compute.h"
#include "trainer/step/train_internal.h"
#include "util/clock.h"
#include "util/file.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define PROBE_BYTES (8u << 20)
#define REPS 5
/* The GPU's probes: a copy of 256 MiB reaches the PCIe rate (tz-bench tiers: from 4 MiB) and,
 * two of them being over twice the largest last-level cache, moves host memory as a step's
 * copies do, a 4096^3 bf16 matmul is the size of a large layer's, and Adam over 64M elements
 * (2 GB of HBM traffic) runs far longer than a launch. (With copies of 64 MiB one H200 machine
 * measured the CPU's Adam at 5.11 G elements/s beside the link where its run's homes reached
 * 3.3; with 256 MiB four machines measured 3.5-4.0, the homes still 1.2-1.3x slower at one
 * micro-batch: docs/benchmarks-history.md, "Issue 26 on the H200, 2026-12-04".) */
#define GPU_COPY_BYTES (256ull << 20)
#define GPU_MATMUL 4096
#define GPU_ADAM_ELEMS ((size_t)64 << 20)

/* The disk's probe: large enough that its queue is kept full (32 requests of 1 MiB) for a while
 * in each direction, and that reads and writes at once (nvme_duplex) meet in the device. */
#define NVME_PROBE_BYTES (64u << 20)
/* The shortest of REPS timed runs of run(arg), after `warmups` untimed ones (a first call that
 * sets something up: an algorithm choice, a lazily made handle). Each run must return only when
 * its work is done. */
static int best_time(int (*run)(void *), void *arg, int warmups, double *seconds) {
  double best = 0;
  for (int i = 0; i < warmups + REPS; i++) {
    double t0 = tz_now_s();
    TZ_CHECK(run(arg));
    double t = tz_now_s() - t0;
    if (i >= warmups && (best == 0 || t < best))
      best = t;
  }
  *seconds = best;
  return 0;
}

static double per_second(double amount, double seconds) {
  return seconds > 0 ? amount / seconds : 0;
}

/* n transfers (at most 2) of bytes each, src[k] to dst[k], started together, waited for. */
struct transfers {
  tz_runtime *rt;
  int n;
  const tz_extent *dst[2], *src[2];
  uint64_t bytes;
};

/* Waits for and releases the n fences of f (NULL ones skipped): rc, else the first wait's
 * error. Every fence is waited for, also after a failure: its work may still use the buffers. */
static int wait_all(tz_fence **f, int n, int rc) {
  for (int k = 0; k < n; k++) {
    if (f[k]) {
      int w = tz_fence_wait(f[k], -1);
      if (rc == 0)
        rc = w;
    }
    tz_fence_release(f[k]);
  }
  return rc;
}

static int run_transfers(void *arg) {
  const struct transfers *x = arg;
  tz_fence *f[2] = {NULL, NULL};
  int rc = 0;
  for (int k = 0; rc == 0 && k < x->n; k++)
    rc = tz_transfer(x->rt, x->dst[k], 0, x->src[k], 0, x->bytes, &f[k]);
  return wait_all(f, x->n, rc);
}

/* Bytes per second, summed over the transfers of x. */
static int time_transfers(const struct transfers *x, int warmups, double *out) {
  double s;
  TZ_CHECK(best_time(run_transfers, (void *)x, warmups, &s));
  *out = per_second((double)x->bytes * x->n, s);
  return 0;
}

/* Bytes per second of one transfer of bytes from src to dst. */
static int time_transfer(tz_runtime *rt, const tz_extent *dst, const tz_extent *src, uint64_t bytes,
                         int warmups, double *out) {
  struct transfers x = {.rt = rt, .n = 1, .dst = {dst}, .src = {src}, .bytes = bytes};
  return time_transfers(&x, warmups, out);
}

/* How many times the other direction's transfer is issued around the timed one: enough that it
 * outlasts the timed one unless the link gives the timed direction over BESIDE times the other's
 * rate. */
#define BESIDE 4

/* Bytes per second of one transfer of bytes from src to dst while the other direction copies
 * from osrc to odst the whole time: that one issued first, BESIDE times back to back on its own
 * stream; the fastest of REPS after a warm-up. The link shares itself unevenly between the
 * directions (an H200's writes to the host took ~51 GB/s of the ~87 both moved at once, the
 * reads ~36), so the plan needs each direction's share, not only their sum. */
static int time_beside(tz_runtime *rt, const tz_extent *dst, const tz_extent *src,
                       const tz_extent *odst, const tz_extent *osrc, uint64_t bytes, double *out) {
  double best = 0;
  int rc = 0;
  for (int i = 0; rc == 0 && i < 1 + REPS; i++) {
    tz_fence *f[BESIDE + 1] = {NULL};
    double t0 = tz_now_s(), t = 0;
    rc = tz_transfer(rt, odst, 0, osrc, 0, bytes, &f[1]);
    if (rc == 0)
      rc = tz_transfer(rt, dst, 0, src, 0, bytes, &f[0]);
    for (int k = 2; rc == 0 && k <= BESIDE; k++)
      rc = tz_transfer(rt, odst, 0, osrc, 0, bytes, &f[k]);
    if (rc == 0 && (rc = tz_fence_wait(f[0], -1)) == 0)
      t = tz_now_s() - t0;
    rc = wait_all(f, BESIDE + 1, rc);
    if (rc == 0 && i > 0 && (best == 0 || t < best))
      best = t;
  }
  *out = per_second((double)bytes, best);
  return rc;
}

/* nvme_write, nvme_read and nvme_duplex (a read and a write at once, summed): NVME_PROBE_BYTES
 * each way between a fresh nvme tier under c's NVMe directory and a host tier of its own;
 * nothing when c has no directory. */
static int measure_nvme(const struct tz_config *c, tz_runtime *rt, struct tz_plan_rates *r) {
  const char *dir = tz_machine_nvme_dir(c);
  if (!dir)
    return 0;
  /* A small directory is probed with less (a quarter of its free space at most, down to 1 MiB),
   * or not at all: whether the run's state fits there is the plan's to say, with its budget. */
  uint64_t bytes = NVME_PROBE_BYTES;
  struct statvfs vfs;
  uint64_t room =
      statvfs(dir, &vfs) == 0 ? (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize : UINT64_MAX;
  while (2 * bytes > room / 4 && bytes > (1u << 20))
    bytes /= 2;
  if (2 * bytes > room / 4) {
    TZ_WARN("rates: the nvme directory %s has %llu bytes free, too few to time: the nvme rates "
            "are unknown (the bound counts nvme as free)",
            dir, (unsigned long long)room);
    return 0;
  }
  tz_tier *n = NULL, *h = NULL;
  tz_extent en[2] = {{0}, {0}}, eh[2] = {{0}, {0}};
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = "rates-nvme-host";
  p.capacity = 2 * bytes;
  p.numa_node = c->tierzero.numa_node;
  int rc;
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &h), rc, out);
  tz_tier_params_init(&p);
  p.name = "rates-nvme";
  p.capacity = 2 * bytes;
  p.paths[0] = dir;
  p.n_paths = 1;
  p.checksum = c->tierzero.nvme_checksum;
  p.buffered = c->tierzero.nvme_buffered;
  TZ_CHECK_GOTO(tz_tier_create(rt, "nvme", &p, &n), rc, out);
  for (int k = 0; k < 2; k++) {
    TZ_CHECK_GOTO(tz_tier_alloc(h, bytes, &eh[k]), rc, out);
    TZ_CHECK_GOTO(tz_tier_alloc(n, bytes, &en[k]), rc, out);
    memset(tz_tier_host_ptr(h, eh[k].offset), 1 + k, bytes);
  }
  /* en[1] is written first so that the reads below find data there, not holes. */
  TZ_CHECK_GOTO(time_transfer(rt, &en[1], &eh[1], bytes, 0, &r->nvme_write), rc, out);
  TZ_CHECK_GOTO(time_transfer(rt, &eh[1], &en[1], bytes, 0, &r->nvme_read), rc, out);
  struct transfers both = {
      .rt = rt, .n = 2, .dst = {&en[0], &eh[1]}, .src = {&eh[0], &en[1]}, .bytes = bytes};
  TZ_CHECK_GOTO(time_transfers(&both, 0, &r->nvme_duplex), rc, out);
out:
  for (int k = 0; k < 2; k++) {
    tz_tier_free(&en[k]);
    tz_tier_free(&eh[k]);
  }
  tz_tier_destroy(n);
  tz_tier_destroy(h);
  return rc;
}

/* The CPU machine: the compute tier is host memory, so copies are between two host tiers. */
static int measure_tiers(const struct tz_config *c, tz_runtime *rt, struct tz_plan_rates *r) {
  tz_tier *a = NULL, *b = NULL;
  tz_extent ea = {0}, ea2 = {0}, eb = {0};
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 2 * PROBE_BYTES;
  p.name = "rates-host";
  int rc;
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &a), rc, out);
  p.name = "rates-compute";
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &b), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(a, PROBE_BYTES, &ea), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(a, PROBE_BYTES, &ea2), rc, out);
  TZ_CHECK_GOTO(tz_tier_alloc(b, PROBE_BYTES, &eb), rc, out);
  memset(tz_tier_host_ptr(a, ea.offset), 1, PROBE_BYTES);
  memset(tz_tier_host_ptr(b, eb.offset), 2, PROBE_BYTES);
  TZ_CHECK_GOTO(time_transfer(rt, &eb, &ea, PROBE_BYTES, 0, &r->copy_in), rc, out);
  TZ_CHECK_GOTO(time_transfer(rt, &ea, &eb, PROBE_BYTES, 0, &r->copy_out), rc, out);
  TZ_CHECK_GOTO(time_transfer(rt, &ea2, &ea, PROBE_BYTES, 0, &r->copy_local), rc, out);
  TZ_CHECK_GOTO(measure_nvme(c, rt, r), rc, out);
out:
  tz_tier_free(&ea);
  tz_tier_free(&ea2);
  tz_tier_free(&eb);
  tz_tier_destroy(b);
  tz_tier_destroy(a);
  return rc;
}

/* `calls` matmuls C (M,M) = A (M,M) B (M,M) of the compute instance, then its sync. */
struct matmul {
  tz_compute *cm;
  int M, calls;
  void *a, *b, *c;
};

static int run_matmul(void *arg) {
  const struct matmul *x = arg;
  enum tz_dtype dt = tz_compute_dtype(x->cm);
  for (int i = 0; i < x->calls; i++)
    TZ_CHECK(tz_compute_matmul(x->cm, 0, 1, x->M, x->M, x->M, 1.0f, x->a, x->M, x->b, x->M, 0.0f,
                               x->c, dt, x->M));
  return tz_compute_sync(x->cm);
}

/* flops: the backend's matmul of M^3 in its storage dtype (p: NULL for the defaults), `calls`
 * back to back per timed run, after one untimed run (the first call chooses the algorithm). */
static int measure_compute(const char *backend, const struct tz_compute_params *p, int M, int calls,
                           struct tz_plan_rates *r) {
  struct matmul x = {.M = M, .calls = calls};
  int rc;
  TZ_CHECK(tz_compute_create(backend, p, &x.cm));
  enum tz_dtype dt = tz_compute_dtype(x.cm);
  size_t n = (size_t)M * M, bytes = n * tz_dtype_size(dt);
  TZ_CHECK_GOTO(tz_compute_alloc(x.cm, bytes, &x.a), rc, out);
  TZ_CHECK_GOTO(tz_compute_alloc(x.cm, bytes, &x.b), rc, out);
  TZ_CHECK_GOTO(tz_compute_alloc(x.cm, bytes, &x.c), rc, out);
  TZ_CHECK_GOTO(tz_compute_fill(x.cm, dt, x.a, 0.5f, n), rc, out);
  TZ_CHECK_GOTO(tz_compute_fill(x.cm, dt, x.b, 0.25f, n), rc, out);
  double s;
  TZ_CHECK_GOTO(best_time(run_matmul, &x, 1, &s), rc, out);
  r->flops = per_second(2.0 * M * M * M * calls, s);
out:
  tz_compute_free(x.cm, x.a);
  tz_compute_free(x.cm, x.b);
  tz_compute_free(x.cm, x.c);
  tz_compute_destroy(x.cm);
  return rc;
}

static struct tz_adam_params probe_adam_params(void) {
  return (struct tz_adam_params){.lr = 1e-3f,
                                 .beta1 = 0.9f,
                                 .beta2 = 0.999f,
                                 .eps = 1e-8f,
                                 .decoupled = 1,
                                 .grad_scale = 1.0f};
}

/* One Adam step over n elements: state (4n floats: master, m, v, grad) and the parameter copy. */
struct adam {
  struct tz_adam_params p;
  float *state;
  void *copy;
  enum tz_dtype copy_dtype;
  size_t n;
  tz_compute *cm; /* cuda: the stream it runs on and waits for; NULL: tz_adam_cpu */
  int threads;    /* tz_adam_cpu's; 0: OpenMP's count */
};

static int run_adam_cpu(void *arg) {
  const struct adam *x = arg;
  float *s = x->state;
  struct tz_adam_cpu_opts o = {.threads = x->threads};
  return tz_adam_cpu(&x->p, s, s + x->n, s + 2 * x->n, s + 3 * x->n, TZ_F32, x->copy, x->copy_dtype,
                     x->n, &o);
}

int tz_rates_home_threads(const struct tz_config *cfg) {
  if (cfg && cfg->tierzero.threads > 0)
    return cfg->tierzero.threads;
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  return n > 3 ? n - 2 : 1;
}

/* CPU Adam over n zeroed f32 elements on `threads` threads (0: OpenMP's count), the copy in
 * copy_dtype (into the last fifth), in elements per second. */
static int measure_adam(uint64_t n, int threads, enum tz_dtype copy_dtype, double *out) {
  struct adam x = {.p = probe_adam_params(), .n = n, .copy_dtype = copy_dtype, .threads = threads};
  x.state = calloc(5 * x.n, sizeof(float));
  if (!x.state)
    return tz_err_set(TZ_ENOMEM, "rates: no memory for the Adam probe");
  x.copy = x.state + 4 * x.n;
  double s = 0;
  int rc = tz_adam_params_for_step(&x.p, 1);
  if (rc == 0)
    rc = best_time(run_adam_cpu, &x, 0, &s);
  free(x.state);
  *out = per_second((double)x.n, s);
  return rc;
}

/* The GPU rank 0 runs on: the configured one, else the first (local rank 0's). */
static int gpu_device(const struct tz_config *c) {
  return c->tierzero.device >= 0 ? c->tierzero.device : 0;
}

/* Waits until every rank of comm has reached it; nothing without comm. */
static int barrier(tz_comm *comm) {
  if (!comm)
    return 0;
  tz_fence *f = NULL;
  TZ_CHECK(tz_comm_barrier(comm, NULL, &f));
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  return rc;
}

/* The host link of one GPU: two extents of GPU_COPY_BYTES in a host tier and two in an hbm tier,
 * between which tz_transfer copies as the scheduler moves blocks. The runtime page-locks the host
 * tier for the hbm tier (docs/hbm.md), and it lies on the GPU's NUMA node unless the config names
 * one, so the copies run at the PCIe rate. */
struct link_probe {
  tz_tier *host, *hbm;
  tz_extent h[2], d[2];
};

static void link_probe_close(struct link_probe *lp) {
  for (int k = 0; k < 2; k++) {
    tz_tier_free(&lp->h[k]);
    tz_tier_free(&lp->d[k]);
  }
  tz_tier_destroy(lp->hbm);
  tz_tier_destroy(lp->host);
  memset(lp, 0, sizeof *lp);
}

static int link_probe_open(const struct tz_config *c, tz_runtime *rt, int device,
                           struct link_probe *lp) {
  memset(lp, 0, sizeof *lp);
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = "rates-host";
  p.capacity = 2 * GPU_COPY_BYTES;
  p.numa_node = c->tierzero.numa_node;
  if (p.numa_node < 0) {
    struct tz_compute_device d;
    p.numa_node = tz_compute_device_info("cuda", device, &d) == 0 ? d.numa_node : -1;
  }
  int rc;
  TZ_CHECK_GOTO(tz_tier_create(rt, "host", &p, &lp->host), rc, fail);
  tz_tier_params_init(&p);
  p.name = "rates-hbm";
  p.capacity = 2 * GPU_COPY_BYTES;
  p.device = device;
  TZ_CHECK_GOTO(tz_tier_create(rt, "hbm", &p, &lp->hbm), rc, fail);
  for (int k = 0; k < 2; k++) {
    TZ_CHECK_GOTO(tz_tier_alloc(lp->host, GPU_COPY_BYTES, &lp->h[k]), rc, fail);
    TZ_CHECK_GOTO(tz_tier_alloc(lp->hbm, GPU_COPY_BYTES, &lp->d[k]), rc, fail);
    memset(tz_tier_host_ptr(lp->host, lp->h[k].offset), 1 + k, GPU_COPY_BYTES);
  }
  return 0;
fail:
  link_probe_close(lp);
  return rc;
}

/* A copy each way at once over the probe's link: host -> hbm and hbm -> host. */
static struct transfers both_ways(struct link_probe *lp, tz_runtime *rt) {
  return (struct transfers){.rt = rt,
                            .n = 2,
                            .dst = {&lp->d[0], &lp->h[1]},
                            .src = {&lp->h[0], &lp->d[1]},
                            .bytes = GPU_COPY_BYTES};
}

/* copy_in (host -> hbm), copy_out (hbm -> host), copy_duplex (the two at once, summed), each
 * beside the other (copy_in_both, copy_out_both) and, with local, copy_local (hbm -> hbm). With
 * comm, every rank of it runs each probe at the same time (a barrier before each), as the ranks'
 * schedulers copy during a step; a rank whose copy failed goes on meeting the others at the
 * barriers and returns its error at the end. */
static int link_probe_time(struct link_probe *lp, tz_runtime *rt, tz_comm *comm, int local,
                           struct tz_plan_rates *r) {
  int rc = 0;
  TZ_CHECK(barrier(comm));
  if (rc == 0)
    rc = time_transfer(rt, &lp->d[0], &lp->h[0], GPU_COPY_BYTES, 1, &r->copy_in);
  TZ_CHECK(barrier(comm));
  if (rc == 0)
    rc = time_transfer(rt, &lp->h[1], &lp->d[1], GPU_COPY_BYTES, 1, &r->copy_out);
  /* The two directions share part of the link's capacity (on an H200: 55 GB/s each alone, 92
   * together), so the plan needs their sum measured at once. */
  struct transfers both = both_ways(lp, rt);
  TZ_CHECK(barrier(comm));
  if (rc == 0)
    rc = time_transfers(&both, 1, &r->copy_duplex);
  TZ_CHECK(barrier(comm));
  if (rc == 0)
    rc = time_beside(rt, &lp->d[0], &lp->h[0], &lp->h[1], &lp->d[1], GPU_COPY_BYTES,
                     &r->copy_in_both);
  TZ_CHECK(barrier(comm));
  if (rc == 0)
    rc = time_beside(rt, &lp->h[1], &lp->d[1], &lp->d[0], &lp->h[0], GPU_COPY_BYTES,
                     &r->copy_out_both);
  if (rc == 0 && local)
    rc = time_transfer(rt, &lp->d[1], &lp->d[0], GPU_COPY_BYTES, 1, &r->copy_local);
  return rc;
}

/* The CPU's Adam beside the link: passes of it on a thread of its own, each one's start and end,
 * until stopped. */
#define BESIDE_PASSES 256
struct adam_beside {
  struct adam x;
  int stop; /* atomic */
  int n, rc;
  double t0[BESIDE_PASSES], t1[BESIDE_PASSES];
};

static void *adam_beside_run(void *arg) {
  struct adam_beside *a = arg;
  while (!__atomic_load_n(&a->stop, __ATOMIC_ACQUIRE) && a->n < BESIDE_PASSES) {
    double t0 = tz_now_s();
    int rc = run_adam_cpu(&a->x);
    if (rc < 0) {
      __atomic_store_n(&a->rc, rc, __ATOMIC_RELEASE);
      break;
    }
    a->t0[a->n] = t0;
    a->t1[a->n] = tz_now_s();
    __atomic_store_n(&a->n, a->n + 1, __ATOMIC_RELEASE);
  }
  return NULL;
}

/* The first n passes of a that started at or after `from` and ended by `to`: their elements over
 * their time (0 if none); *count how many. */
static double adam_within(const struct adam_beside *a, int n, double from, double to, int *count) {
  double elems = 0, s = 0;
  *count = 0;
  for (int i = 0; i < n; i++)
    if (a->t0[i] >= from && a->t1[i] <= to) {
      elems += (double)a->x.n;
      s += a->t1[i] - a->t0[i];
      ++*count;
    }
  return per_second(elems, s);
}

/* 64 Mi elements: 1.25 GiB of state and copy, far beyond the caches as the homes are, a pass
 * some 12-25 ms (with 16 Mi, 3 ms: passes fell between the link's copies). */
#define BESIDE_ADAM_ELEMS ((size_t)64 << 20)

/* adam_home_busy, copy_in_adam and copy_out_adam: the CPU's Adam on the home threads passes over
 * its state the whole time while each direction of the link is timed beside the other
 * (time_beside), then both directions copy on until at least two of its passes lie within the
 * link's busy time; its rate over those passes. The two share host memory (docs/training.md,
 * "Splitting Adam"). */
static int time_adam_beside_link(struct link_probe *lp, tz_runtime *rt, int threads,
                                 struct tz_plan_rates *r) {
  struct adam_beside *a = calloc(1, sizeof *a);
  if (!a)
    return tz_err_set(TZ_ENOMEM, "rates: no memory for the Adam probe beside the link");
  a->x = (struct adam){
      .p = probe_adam_params(), .n = BESIDE_ADAM_ELEMS, .copy_dtype = TZ_BF16, .threads = threads};
  a->x.state = calloc(5 * a->x.n, sizeof(float));
  int rc = a->x.state
               ? tz_adam_params_for_step(&a->x.p, 1)
               : tz_err_set(TZ_ENOMEM, "rates: no memory for the Adam probe beside the link");
  if (rc == 0) {
    a->x.copy = a->x.state + 4 * a->x.n;
    rc = run_adam_cpu(&a->x); /* its pages touched and its threads made, untimed */
  }
  pthread_t th;
  int started = 0;
  if (rc == 0) {
    int e = pthread_create(&th, NULL, adam_beside_run, a);
    rc = e ? tz_err_errno(e, "rates: cannot start the Adam probe's thread") : 0;
    started = e == 0;
  }
  double from = tz_now_s(), to = from;
  if (rc == 0)
    rc = time_beside(rt, &lp->d[0], &lp->h[0], &lp->h[1], &lp->d[1], GPU_COPY_BYTES,
                     &r->copy_in_adam);
  if (rc == 0)
    rc = time_beside(rt, &lp->h[1], &lp->d[1], &lp->d[0], &lp->h[0], GPU_COPY_BYTES,
                     &r->copy_out_adam);
  struct transfers both = both_ways(lp, rt);
  for (;;) {
    to = tz_now_s();
    int n = __atomic_load_n(&a->n, __ATOMIC_ACQUIRE), inside = 0;
    adam_within(a, n, from, to, &inside);
    if (rc < 0 || inside >= 2 || to - from > 5.0 || n == BESIDE_PASSES ||
        __atomic_load_n(&a->rc, __ATOMIC_ACQUIRE) < 0)
      break;
    rc = run_transfers(&both);
  }
  __atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
  if (started)
    pthread_join(th, NULL);
  if (rc == 0)
    rc = a->rc;
  if (rc == 0) {
    int inside;
    r->adam_home_busy = adam_within(a, a->n, from, to, &inside);
    if (r->adam_home_busy <= 0)
      rc = tz_err_set(TZ_ETIMEDOUT,
                      "rates: no pass of the CPU's Adam ended within %.1f s of "
                      "copies beside it",
                      to - from);
  }
  free(a->x.state);
  free(a);
  return rc;
}

/* The GPU machine's tiers: the host link of `device` alone and beside the CPU's Adam, then nvme
 * as on a CPU machine. */
static int measure_tiers_gpu(const struct tz_config *c, tz_runtime *rt, int device,
                             struct tz_plan_rates *r) {
  struct link_probe lp;
  TZ_CHECK(link_probe_open(c, rt, device, &lp));
  int rc = link_probe_time(&lp, rt, NULL, 1, r);
  if (rc == 0 && time_adam_beside_link(&lp, rt, tz_rates_home_threads(c), r) < 0) {
    /* the plan goes on without it, as with a cache entry written before it */
    TZ_WARN("%s; the plan takes the CPU's Adam and the link at their rates alone", tz_err_msg());
    r->adam_home_busy = r->copy_in_adam = r->copy_out_adam = 0;
  }
  link_probe_close(&lp);
  TZ_CHECK(rc);
  return measure_nvme(c, rt, r);
}

/* The link's rates every rank times beside the others: copy_in, copy_out, copy_duplex,
 * copy_in_both, copy_out_both. */
#define N_LINK 5

static double *link_rate(struct tz_plan_rates *r, int i) {
  double *f[N_LINK] = {&r->copy_in, &r->copy_out, &r->copy_duplex, &r->copy_in_both,
                       &r->copy_out_both};
  return f[i];
}

/* Every rank's v (status, then its N_LINK rates) into all; 1 when every status is 0, 0 when some
 * rank's is not (rank 0 says which), the comm's error when it fails. */
static int gather_links(tz_comm *comm, const double v[1 + N_LINK], double *all) {
  tz_fence *f = NULL;
  int rc = tz_comm_all_gather(comm, v, all, (1 + N_LINK) * sizeof(double), NULL, &f);
  if (rc == 0)
    rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  if (rc < 0)
    return rc;
  int ok = 1;
  for (int k = 0; k < tz_comm_size(comm); k++)
    if (all[(1 + N_LINK) * k] < 0) {
      ok = 0;
      if (tz_comm_rank(comm) == 0)
        TZ_WARN("rates: rank %d could not time its host link beside the others%s%s; the plan "
                "takes the rates of one GPU alone",
                k, k == 0 ? ": " : "", k == 0 ? tz_err_msg() : "");
    }
  return ok;
}

/* The ranks' GPUs share the host's memory and may share a PCIe switch: with every rank copying at
 * once, each one's link runs slower than alone (two H200s offloading llama-7b copied in at 28.9
 * GB/s while busy, one alone at 45). So on a world of GPUs every rank times its own link at the
 * same time as the others, and the plan gets the slowest rank's link rates (each direction
 * alone, both at once, each beside the other) where they are below the ones measured alone.
 * Not cached: it takes a fraction of a second and depends on the world. */
static int time_links_shared(const struct tz_config *c, tz_runtime *rt, tz_comm *comm,
                             struct tz_plan_rates *out) {
  int world = tz_comm_size(comm);
  int *device = tz_comm_native(comm, "device");
  if (world < 2 || !device)
    return 0;
  double *all = calloc((size_t)world, (1 + N_LINK) * sizeof(double));
  if (!all)
    return tz_err_set(TZ_ENOMEM, "rates: no memory for the ranks' link rates");
  struct link_probe lp;
  struct tz_plan_rates mine = *out;
  /* Every rank learns whether all could open their probe before any waits at a barrier. */
  double v[1 + N_LINK] = {link_probe_open(c, rt, *device, &lp)};
  int ok = gather_links(comm, v, all);
  if (ok == 1) {
    v[0] = link_probe_time(&lp, rt, comm, 0, &mine);
    for (int i = 0; i < N_LINK; i++)
      v[1 + i] = *link_rate(&mine, i);
    ok = gather_links(comm, v, all);
  }
  link_probe_close(&lp);
  if (ok == 1) {
    struct tz_plan_rates alone = *out;
    for (int i = 0; i < N_LINK; i++)
      for (int k = 0; k < world; k++) {
        double x = all[(1 + N_LINK) * k + 1 + i];
        if (x > 0 && x < *link_rate(out, i))
          *link_rate(out, i) = x;
      }
    if (tz_comm_rank(comm) == 0)
      TZ_INFO("rates: %d ranks copying at once: in %.1f, out %.1f, both %.1f (in %.1f beside "
              "out %.1f) GB/s a rank (one alone: %.1f, %.1f, %.1f (%.1f, %.1f))",
              world, out->copy_in / 1e9, out->copy_out / 1e9, out->copy_duplex / 1e9,
              out->copy_in_both / 1e9, out->copy_out_both / 1e9, alone.copy_in / 1e9,
              alone.copy_out / 1e9, alone.copy_duplex / 1e9, alone.copy_in_both / 1e9,
              alone.copy_out_both / 1e9);
  }
  free(all);
  return ok < 0 ? ok : 0; /* only the comm's failure is the run's */
}

static int run_adam_cuda(void *arg) {
  const struct adam *x = arg;
  float *s = x->state;
  TZ_CHECK(tz_compute_adam(x->cm, &x->p, s, s + x->n, s + 2 * x->n, s + 3 * x->n, TZ_F32, x->copy,
                           x->copy_dtype, x->n));
  return tz_compute_sync(x->cm);
}

/* adam: GPU Adam as the opt phases run it on state brought into HBM: f32 master, m, v and
 * gradient, a bf16 parameter copy, all in device memory of the cuda backend. */
static int measure_adam_gpu(int device, struct tz_plan_rates *r) {
  struct tz_compute_params cp;
  tz_compute_params_init(&cp);
  cp.device = device;
  struct adam x = {.p = probe_adam_params(), .n = GPU_ADAM_ELEMS, .copy_dtype = TZ_BF16};
  void *state = NULL;
  int rc;
  TZ_CHECK(tz_compute_create("cuda", &cp, &x.cm));
  TZ_CHECK_GOTO(tz_compute_alloc(x.cm, 4 * x.n * sizeof(float), &state), rc, out);
  TZ_CHECK_GOTO(tz_compute_alloc(x.cm, x.n * tz_dtype_size(TZ_BF16), &x.copy), rc, out);
  x.state = state;
  TZ_CHECK_GOTO(tz_compute_zero(x.cm, x.state, 4 * x.n * sizeof(float)), rc, out);
  TZ_CHECK_GOTO(tz_adam_params_for_step(&x.p, 1), rc, out);
  double s;
  TZ_CHECK_GOTO(best_time(run_adam_cuda, &x, 1, &s), rc, out);
  r->adam = per_second((double)x.n, s);
out:
  tz_compute_free(x.cm, state);
  tz_compute_free(x.cm, x.copy);
  tz_compute_destroy(x.cm);
  return rc;
}

/* The GPU machine's rates: copies between host and hbm, nvme as on a CPU machine, the cuda
 * backend's bf16 matmul at a layer's size, GPU Adam, and CPU Adam for the home phases. */
static int measure_gpu(const struct tz_config *c, tz_runtime *rt, struct tz_plan_rates *r) {
  if (!tz_compute_backend_built("cuda"))
    return tz_err_set(TZ_ENOTSUP, "rates: backend cuda: this build has no CUDA toolkit");
  int device = gpu_device(c);
  struct tz_compute_params cp;
  tz_compute_params_init(&cp);
  cp.device = device;
  cp.dtype = TZ_BF16;
  cp.grad_dtype = TZ_F32;
  TZ_CHECK(measure_tiers_gpu(c, rt, device, r));
  /* One 4096^3 matmul takes a fraction of a millisecond: ten per timed run keep the launch and
   * the host's timer out of the rate. */
  TZ_CHECK(measure_compute("cuda", &cp, GPU_MATMUL, 10, r));
  TZ_CHECK(measure_adam_gpu(device, r));
  /* CPU Adam for home phases, on state far larger than the caches, as the homes are. */
  return measure_adam(32u << 20, tz_rates_home_threads(c), TZ_BF16, &r->adam_home);
}

/* The CPU machine's rates: copies between host tiers, nvme, the backend's matmul at 512^3, CPU
 * Adam. */
static int measure_cpu(const struct tz_config *c, const char *backend, tz_runtime *rt,
                       struct tz_plan_rates *r) {
  TZ_CHECK(measure_tiers(c, rt, r));
  TZ_CHECK(measure_compute(backend, NULL, 512, 1, r));
  /* Home phases run the same CPU Adam the compute lane would. */
  TZ_CHECK(measure_adam(1u << 20, 0, TZ_F32, &r->adam));
  r->adam_home = r->adam;
  return 0;
}

/* The probe's buffer: in the GPU's memory for a comm that works on device buffers (nccl: a host
 * buffer would time its copies too), else host memory. */
static int probe_buffer(tz_runtime *rt, tz_comm *comm, size_t bytes, tz_tier **tier, char **buf) {
  *tier = NULL;
  *buf = NULL;
  int *device = tz_comm_native(comm, "device");
  if (device) {
    struct tz_tier_params p;
    tz_tier_params_init(&p);
    p.name = "rates-collective";
    p.capacity = bytes;
    p.device = *device;
    tz_extent e = {0};
    TZ_CHECK(tz_tier_create(rt, "hbm", &p, tier));
    int rc = tz_tier_alloc(*tier, bytes, &e);
    if (rc == 0)
      *buf = tz_tier_device_ptr(*tier, e.offset);
    if (rc == 0 && !*buf)
      rc = tz_err_set(TZ_ENOTSUP, "rates: the hbm tier hands out no device pointer");
    if (rc < 0) {
      tz_tier_destroy(*tier);
      *tier = NULL;
    }
    return rc;
  }
  *buf = calloc(1, bytes);
  return *buf ? 0 : tz_err_set(TZ_ENOMEM, "rates: no memory for the collective probe");
}

/* All-gathers issued back to back and waited for together in time_collective: one alone is
 * timed with the progress engine's polling (up to 200 us between polls), a fifth of a 64 MiB
 * gather's time on two H200s (the probe read 122-170 GB/s where tz-bench collectives measures
 * 208-239); the step's collectives follow each other on the compute stream. */
#define COLL_BURST 8

static int time_collective(tz_runtime *rt, tz_comm *comm, double *out) {
  int world = tz_comm_size(comm);
  *out = 0;
  if (world < 2)
    return 0;
  /* On GPUs a layer's shard is hundreds of MB, and a 1 MiB gather runs at a fraction of the
   * link's rate (the 2-GPU plan's bound came out at 2.3x the achieved step time): time 64 MiB
   * pieces there. Host memory (mpi on CPUs, where tests run many ranks) keeps 1 MiB. */
  size_t per = tz_comm_native(comm, "device") ? 64u << 20 : 1u << 20;
  tz_tier *dev = NULL;
  char *buf = NULL;
  TZ_CHECK(probe_buffer(rt, comm, per * (size_t)world, &dev, &buf));
  char *mine = buf + per * (size_t)tz_comm_rank(comm);
  double best = 0;
  int rc = 0;
  for (int i = 0; rc == 0 && i < 1 + REPS; i++) { /* the first sets the communicator up */
    tz_fence *f[COLL_BURST] = {NULL};
    double t0 = tz_now_s();
    for (int k = 0; rc == 0 && k < COLL_BURST; k++)
      rc = tz_comm_all_gather(comm, mine, buf, per, NULL, &f[k]);
    rc = wait_all(f, COLL_BURST, rc);
    double t = (tz_now_s() - t0) / COLL_BURST;
    if (i == 1 || (i > 1 && t < best))
      best = t;
  }
  if (dev)
    tz_tier_destroy(dev);
  else
    free(buf);
  /* Bus bandwidth as nccl-tests counts it: the gathered size over the time, times (P-1)/P. */
  if (rc == 0 && best > 0)
    *out = (double)per * world / best * (world - 1) / world;
  return rc < 0 ? rc : 0;
}

int tz_rates_get(const struct tz_config *cfg, const char *backend, tz_runtime *rt, tz_comm *comm,
                 const char *path, int refresh, struct tz_plan_rates *out) {
  memset(out, 0, sizeof *out);
  double v[TZ_RATES_N_FIELDS + 1] = {0};
  int rc0 = 0;
  if (tz_comm_rank(comm) == 0) {
    char def[PATH_MAX], key[PATH_MAX + 64];
    if (!path && tz_rates_default_path(def, sizeof def) == 0)
      path = def;
    tz_rates_cache_key(cfg, backend, key, sizeof key);
    int cached = !refresh && path && tz_rates_cache_read(path, key, out);
    int rc = 0;
    if (!cached) {
      rc = strcmp(backend, "cuda") == 0 ? measure_gpu(cfg, rt, out)
                                        : measure_cpu(cfg, backend, rt, out);
      if (rc == 0 && path && tz_rates_cache_write(path, key, out) < 0)
        TZ_WARN("%s (the rates are measured again next time)", tz_err_msg());
      if (rc == 0)
        TZ_INFO("rates: measured for %s%s%s", key, path ? ", cached in " : "", path ? path : "");
    }
    for (int i = 0; i < TZ_RATES_N_FIELDS; i++)
      v[i] = *tz_rates_field(out, i);
    v[TZ_RATES_N_FIELDS] = rc; /* the other ranks fail with rank 0 instead of waiting */
    rc0 = rc;
    if (tz_comm_size(comm) == 1)
      TZ_CHECK(rc);
  }
  if (tz_comm_size(comm) > 1) {
    tz_fence *f = NULL;
    TZ_CHECK(tz_comm_broadcast(comm, v, sizeof v, 0, NULL, &f));
    int rc = tz_fence_wait(f, -1);
    tz_fence_release(f);
    TZ_CHECK(rc);
    if (rc0 < 0)
      return rc0;
    if (v[TZ_RATES_N_FIELDS] < 0)
      return tz_err_set((int)v[TZ_RATES_N_FIELDS],
                        "rates: rank 0 could not measure the machine's rates");
    for (int i = 0; i < TZ_RATES_N_FIELDS; i++)
      *tz_rates_field(out, i) = v[i];
  }
  if (strcmp(backend, "cuda") == 0)
    TZ_CHECK(time_links_shared(cfg, rt, comm, out));
  return time_collective(rt, comm, &out->collective);
}

/* part_s[0], part_s[1], part_s[2]: the attention's and the MLP's forward alone on the probe l,
 * and the attention's without its op (its output the probe's last), the fastest of
 * TZ_RATES_LAYER_PASSES each after one untimed (the layer's passes have warmed the GPU). */
static int time_parts(tz_compute *cm, const struct tz_model_config *mc,
                      const struct tz_layer_probe *l, double part_s[3]) {
  const unsigned parts[3] = {TZ_PART_ATTN, TZ_PART_MLP, TZ_PART_ATTN | TZ_PART_ATTN_OUT};
  int rc = 0;
  for (int p = 0; p < 3 && rc == 0; p++) {
    double best = 0;
    for (int n = 0; rc == 0 && n < 1 + TZ_RATES_LAYER_PASSES; n++) {
      double t0 = tz_now_s();
      rc = tz_model_layer_part_fwd(cm, mc, 0, l->w, l->x_in, l->x_out, &l->acts, parts[p], l->B,
                                   l->T, NULL);
      if (rc == 0)
        rc = tz_compute_sync(cm);
      double t = tz_now_s() - t0;
      if (rc == 0 && n > 0 && (best == 0 || t < best))
        best = t;
    }
    part_s[p] = best;
  }
  return rc;
}

int tz_rates_layer_time(tz_compute *cm, const struct tz_model_config *mc, int B, int T,
                        double budget_s, double matmul_flops, double *seconds, double *part_s) {
  *seconds = 0;
  if (part_s)
    part_s[0] = part_s[1] = part_s[2] = 0;
  double flop = 4.0 * tz_model_layer_flop(mc, B, T);
  if (budget_s > 0 && matmul_flops > 0) {
    /* The warm-up (at least one pass) and the timed passes, each at least a pass at the matmul
     * rate. */
    double pass = flop / matmul_flops;
    double est = (pass > TZ_LAYER_PROBE_WARM_S ? pass : TZ_LAYER_PROBE_WARM_S) +
                 TZ_RATES_LAYER_PASSES * pass;
    if (est > budget_s) {
      TZ_WARN("rates: timing a layer's forward and backward here would take %.0f s or more (a pass "
              "of %.3g TFLOP at this machine's matmul rate, %.3g TFLOP/s): not timed; the plan "
              "costs compute at the matmul rate, a looser bound. --layer-rate R (TFLOP/s, as "
              "tz-train prints it for a run on this machine) gives the layer's rate instead",
              est, flop / 1e12, matmul_flops / 1e12);
      return 0;
    }
  }
  struct tz_layer_probe l;
  TZ_CHECK(tz_layer_probe_alloc(cm, mc, B, T, &l));
  int rc = 0;
  double w0 = tz_now_s();
  do
    rc = tz_layer_probe_step(cm, mc, &l, TZ_PARTS_ALL);
  while (rc == 0 && (rc = tz_compute_sync(cm)) == 0 && tz_now_s() - w0 < TZ_LAYER_PROBE_WARM_S);
  double best = 0, timed = 0;
  for (int n = 0; rc == 0 && (n < TZ_RATES_LAYER_PASSES || timed < TZ_RATES_LAYER_MIN_S); n++) {
    double t0 = tz_now_s();
    rc = tz_layer_probe_step(cm, mc, &l, TZ_PARTS_ALL);
    if (rc == 0)
      rc = tz_compute_sync(cm);
    double t = tz_now_s() - t0;
    timed += t;
    if (rc == 0 && (best == 0 || t < best))
      best = t;
  }
  if (rc == 0 && part_s)
    rc = time_parts(cm, mc, &l, part_s);
  tz_layer_probe_free(cm, &l);
  if (rc == 0)
    *seconds = best;
  return rc;
}
