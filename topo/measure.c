/* Measured bandwidth per path, through the tier backends the runtime itself uses: O_DIRECT reads
 * (and the writes that lay the file out first) per NVMe directory, and pinned host-to-GPU and
 * GPU-to-host copies per GPU. Host buffers are a host tier on the NUMA node the advice gives the
 * path, so the figure is the one the scheduler will see. */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/error.h"
#include "core/fence.h"
#include "core/runtime.h"
#include "core/tier.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct measured {
  struct tz_topo_measured pub;
  int cap;
  void **owned;
  int n_owned, cap_owned;
};

static const char *mstrdup(struct measured *m, const char *s) {
  char *d = strdup(s ? s : "");
  if (!d)
    return NULL;
  if (m->n_owned == m->cap_owned) {
    int cap = m->cap_owned ? 2 * m->cap_owned : 16;
    void **n = realloc(m->owned, (size_t)cap * sizeof *n);
    if (!n) {
      free(d);
      return NULL;
    }
    m->owned = n;
    m->cap_owned = cap;
  }
  m->owned[m->n_owned++] = d;
  return d;
}

static struct tz_topo_bandwidth *add(struct measured *m, const char *kind, int gpu, const char *dir,
                                     int node) {
  if (m->pub.n == m->cap) {
    int cap = m->cap ? 2 * m->cap : 8;
    struct tz_topo_bandwidth *n = realloc(m->pub.items, (size_t)cap * sizeof *n);
    if (!n)
      return NULL;
    m->pub.items = n;
    m->cap = cap;
  }
  struct tz_topo_bandwidth *b = &m->pub.items[m->pub.n];
  memset(b, 0, sizeof *b);
  b->kind = kind;
  b->gpu = gpu;
  b->dir = dir ? mstrdup(m, dir) : NULL;
  b->numa_node = node;
  b->odirect = -1;
  b->gbps = -1;
  if (dir && !b->dir)
    return NULL;
  m->pub.n++;
  return b;
}

/* GB/s of one streaming pass, or a negative code with the thread's message set. */
static double stream(const tz_extent *ext, unsigned char *buf, uint64_t bytes, uint64_t block,
                     int qd, int write) {
  double seconds;
  int rc = tz_tier_stream(ext, buf, bytes / block * block, block, qd, write, &seconds);
  return rc < 0 ? rc : (double)(bytes / block * block) / seconds / 1e9;
}

/* One path: a host tier on node for the buffers, the far tier from backend/params, and two timed
 * passes (write, then read: a read of blocks never written would read no disk). */
static int measure_path(struct measured *m, tz_runtime *rt, const char *backend,
                        const struct tz_tier_params *far_params, int node,
                        const struct tz_topo_measure_params *p, struct tz_topo_bandwidth *w,
                        struct tz_topo_bandwidth *r) {
  tz_tier *host = NULL, *far = NULL;
  tz_extent hext = {0}, fext = {0};
  struct tz_tier_params hp;
  tz_tier_params_init(&hp);
  hp.name = "topo-measure-host";
  hp.capacity = p->block * (uint64_t)p->queue_depth;
  hp.numa_node = node;
  int rc = tz_tier_create(rt, "host", &hp, &host);
  if (rc == 0)
    rc = tz_tier_create(rt, backend, far_params, &far);
  if (rc == 0)
    rc = tz_tier_alloc(host, hp.capacity, &hext);
  if (rc == 0)
    rc = tz_tier_alloc(far, p->bytes, &fext);
  double gw = rc, gr = rc;
  if (rc == 0) {
    unsigned char *buf = tz_tier_host_ptr(host, hext.offset);
    memset(buf, 0x5a, hp.capacity);
    gw = stream(&fext, buf, p->bytes, p->block, p->queue_depth, 1);
    gr = gw < 0 ? gw : stream(&fext, buf, p->bytes, p->block, p->queue_depth, 0);
  }
  const char *why = rc < 0 || gw < 0 || gr < 0 ? mstrdup(m, tz_err_msg()) : NULL;
  w->gbps = gw >= 0 ? gw : -1;
  r->gbps = gr >= 0 ? gr : -1;
  w->bytes = r->bytes = p->bytes;
  w->error = gw < 0 ? why : NULL;
  r->error = gr < 0 ? why : NULL;
  tz_tier_free(&fext);
  tz_tier_free(&hext);
  tz_tier_destroy(far);
  tz_tier_destroy(host);
  return 0;
}

void tz_topo_measure_params_init(struct tz_topo_measure_params *p) {
  memset(p, 0, sizeof *p);
  p->bytes = 256ull << 20;
  p->block = 1ull << 20;
  p->queue_depth = 32;
  p->gpus = 1;
}

int tz_topo_measure(tz_topo *t, const struct tz_topo_advice *a,
                    const struct tz_topo_measure_params *p, struct tz_topo_measured **out) {
  struct tz_topo_measure_params def;
  if (!p) {
    tz_topo_measure_params_init(&def);
    p = &def;
  }
  if (!t || !a || !out)
    return tz_err_set(TZ_EINVAL, "topo: tz_topo_measure needs a topology, advice and output");
  *out = NULL;
  if (!t->machine.live)
    return tz_err_set(TZ_ENOTSUP, "topo: measuring needs this machine, not the one in %s",
                      t->machine.xml_path);
  if (!p->block || p->queue_depth < 1 || p->bytes < p->block || p->n_dirs < 0 ||
      p->n_dirs > TZ_TOPO_MAX_SWAP_DIRS)
    return tz_err_set(TZ_EINVAL,
                      "topo: measuring %llu bytes in blocks of %llu with %d in flight over %d "
                      "dirs does not make sense",
                      (unsigned long long)p->bytes, (unsigned long long)p->block, p->queue_depth,
                      p->n_dirs);
  struct measured *m = calloc(1, sizeof *m);
  if (!m)
    return tz_err_set(TZ_ENOMEM, "topo: no memory");
  int rc = 0;
  tz_runtime *rt = NULL;
  TZ_CHECK_GOTO(tz_runtime_create(NULL, &rt), rc, fail);
  /* Whole blocks only: the tiers move multiples of their alignment. */
  struct tz_topo_measure_params q = *p;
  q.bytes -= q.bytes % q.block;

  /* The directories: those given, else every one the advice names, each once. */
  const char *dirs[TZ_TOPO_MAX_SWAP_DIRS * 8];
  int n_dirs = 0;
  for (int i = 0; i < p->n_dirs; i++)
    dirs[n_dirs++] = p->dirs[i];
  for (int i = 0; p->n_dirs == 0 && i < a->n_placements; i++)
    for (int k = 0; k < a->placements[i].n_dirs; k++) {
      int seen = 0;
      for (int j = 0; j < n_dirs; j++)
        seen |= strcmp(dirs[j], a->placements[i].dirs[k]) == 0;
      if (!seen && n_dirs < (int)(sizeof dirs / sizeof dirs[0]))
        dirs[n_dirs++] = a->placements[i].dirs[k];
    }
  for (int i = 0; i < n_dirs; i++) {
    int mi = tz_topo_mount_for_path(t, dirs[i]);
    int b = mi >= 0 ? t->mounts[mi].blockdev : -1;
    int node = b >= 0 ? t->blockdevs[b].numa_node : -1;
    struct tz_topo_bandwidth *w = add(m, "nvme_write", -1, dirs[i], node);
    struct tz_topo_bandwidth *r = w ? add(m, "nvme_read", -1, dirs[i], node) : NULL;
    if (!w || !r) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
      goto fail;
    }
    w = &m->pub.items[m->pub.n - 2]; /* add may have moved the array */
    w->odirect = r->odirect = mi >= 0 ? t->mounts[mi].odirect : -1;
    struct tz_tier_params np;
    tz_tier_params_init(&np);
    np.name = "topo-measure-nvme";
    np.capacity = q.bytes;
    np.paths[0] = dirs[i];
    np.n_paths = 1;
    np.queue_depth = q.queue_depth;
    np.stripe_bytes = q.block;
    np.checksum = 0; /* the drive's rate, not the CRC's */
    measure_path(m, rt, "nvme", &np, node, &q, w, r);
  }

  for (int g = 0; p->gpus && g < t->n_gpus; g++) {
    const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, g);
    int node = pl ? pl->numa_node : t->gpus[g].numa_node;
    struct tz_topo_bandwidth *h2d = add(m, "h2d", g, NULL, node);
    struct tz_topo_bandwidth *d2h = h2d ? add(m, "d2h", g, NULL, node) : NULL;
    if (!h2d || !d2h) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
      goto fail;
    }
    h2d = &m->pub.items[m->pub.n - 2];
    char why[256];
    if (tz_tier_probe("hbm", why, sizeof why) < 0) {
      h2d->error = d2h->error = mstrdup(m, why);
      continue;
    }
    struct tz_tier_params gp;
    tz_tier_params_init(&gp);
    gp.name = "topo-measure-hbm";
    gp.capacity = q.bytes;
    gp.device = g;
    /* hbm's write is host to device and its read device to host. */
    measure_path(m, rt, "hbm", &gp, node, &q, h2d, d2h);
  }
  tz_runtime_destroy(rt);
  *out = &m->pub;
  return 0;
fail:
  tz_runtime_destroy(rt);
  tz_topo_measured_destroy(&m->pub);
  return rc;
}

void tz_topo_measured_destroy(struct tz_topo_measured *pub) {
  if (!pub)
    return;
  struct measured *m = (struct measured *)pub;
  for (int i = 0; i < m->n_owned; i++)
    free(m->owned[i]);
  free(m->owned);
  free(m->pub.items);
  free(m);
}
