/* host: pinned-to-be RAM on one NUMA node. One anonymous mapping per tier (so io_uring and
 * cudaHostRegister can register it), transparent huge pages where available, bound to the node
 * with mbind and first-touched by threads running on that node. Reads and writes are memcpy on
 * the runtime's copy lane. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/tier_impl.h"

#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <omp.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

struct host {
  unsigned char *base;
  uint64_t mapped;
  int node;
};

/* Copies below this size are done on the caller's thread: a lane round trip costs more. */
#define HOST_SYNC_BYTES (64u << 10)

static int host_init(tz_tier *t, const struct tz_tier_params *p) {
  struct host *h = calloc(1, sizeof *h);
  if (!h)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  const uint64_t huge = 2ull << 20;
  h->mapped = (p->capacity + huge - 1) & ~(huge - 1);
  h->node = p->numa_node;
  if (h->node < 0 && numa_available() >= 0)
    h->node = numa_node_of_cpu(sched_getcpu());
  if (h->node < 0)
    h->node = 0;
  void *m = mmap(NULL, h->mapped, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    unsigned long long bytes = h->mapped;
    free(h);
    return tz_err_errno(e, "%s: mmap of %llu bytes", t->name, bytes);
  }
  h->base = m;
  if (madvise(m, h->mapped, MADV_HUGEPAGE) != 0)
    TZ_DEBUG("%s: no transparent huge pages (madvise: %s)", t->name, strerror(errno));
  if (numa_available() >= 0 && h->node <= numa_max_node()) {
    unsigned long mask[16] = {0};
    mask[h->node / (8 * sizeof(unsigned long))] |= 1ul << (h->node % (8 * sizeof(unsigned long)));
    if (mbind(m, h->mapped, MPOL_PREFERRED, mask, 8 * sizeof mask, 0) != 0)
      TZ_DEBUG("%s: mbind to node %d: %s", t->name, h->node, strerror(errno));
  }
  /* First touch from threads on the node, so every page is node-local and already faulted in:
   * the steady state then takes no page faults. */
  const uint64_t step = huge;
  const int64_t n_steps = (int64_t)(h->mapped / step);
  int node = h->node;
#pragma omp parallel
  {
    cpu_set_t saved;
    int have = sched_getaffinity(0, sizeof saved, &saved) == 0;
    if (numa_available() >= 0)
      numa_run_on_node(node);
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n_steps; i++)
      memset(h->base + (uint64_t)i * step, 0, step);
    if (have) /* leave every thread bound as it was (the topology advice, say) */
      sched_setaffinity(0, sizeof saved, &saved);
  }
  t->ctx = h;
  t->align = 4096; /* page-aligned extents: usable as O_DIRECT buffers as they are */
  return 0;
}

static void host_fini(tz_tier *t) {
  struct host *h = t->ctx;
  if (!h)
    return;
  munmap(h->base, h->mapped);
  free(h);
}

struct copy_job {
  void *dst;
  const void *src;
  uint64_t n;
};

static int copy_run(void *arg) {
  struct copy_job *j = arg;
  memcpy(j->dst, j->src, j->n);
  free(j);
  return 0;
}

static int host_copy(tz_tier *t, void *dst, const void *src, uint64_t n, tz_fence **done) {
  if (n <= HOST_SYNC_BYTES) {
    memcpy(dst, src, n);
    *done = tz_fence_completed(0);
    return *done ? 0 : tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  }
  struct copy_job *j = malloc(sizeof *j);
  if (!j)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  *j = (struct copy_job){dst, src, n};
  int rc = tz_pool_submit(tz_runtime_copy_pool(t->rt), copy_run, j, done);
  if (rc < 0)
    free(j);
  return rc;
}

static int host_read(tz_tier *t, uint64_t off, void *buf, uint64_t n, tz_fence **done) {
  struct host *h = t->ctx;
  return host_copy(t, buf, h->base + off, n, done);
}

static int host_write(tz_tier *t, uint64_t off, const void *buf, uint64_t n, tz_fence **done) {
  struct host *h = t->ctx;
  return host_copy(t, h->base + off, buf, n, done);
}

static void *host_ptr(tz_tier *t, uint64_t off) {
  struct host *h = t->ctx;
  return h->base + off;
}

static int host_probe(char *why, size_t len) {
  if (len)
    why[0] = '\0';
  return 0;
}

const struct tz_tier_ops tz_tier_host_ops = {
    .name = "host",
    .probe = host_probe,
    .init = host_init,
    .fini = host_fini,
    .read = host_read,
    .write = host_write,
    .host_ptr = host_ptr,
};
