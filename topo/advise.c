/* Placement advice: a pure function of the topology and the facts in the parameters. */
#define _GNU_SOURCE
#include "topo/internal.h"
#include "util/size.h"

#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The public advice and what it owns. */
struct advice {
  struct tz_topo_advice pub;
  void **owned;
  int n_owned, cap_owned;
  int cap_warnings;
};

static void *keep(struct advice *a, void *p) {
  if (!p)
    return NULL;
  if (a->n_owned == a->cap_owned) {
    int cap = a->cap_owned ? 2 * a->cap_owned : 32;
    void **n = realloc(a->owned, (size_t)cap * sizeof *n);
    if (!n) {
      free(p);
      return NULL;
    }
    a->owned = n;
    a->cap_owned = cap;
  }
  a->owned[a->n_owned++] = p;
  return p;
}

static int warn(struct advice *a, const char *code, int gpu, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int warn(struct advice *a, const char *code, int gpu, const char *fmt, ...) {
  if (a->pub.n_warnings == a->cap_warnings) {
    int cap = a->cap_warnings ? 2 * a->cap_warnings : 8;
    struct tz_topo_warning *w = realloc(a->pub.warnings, (size_t)cap * sizeof *w);
    if (!w)
      return tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
    a->pub.warnings = w;
    a->cap_warnings = cap;
  }
  char *msg = NULL;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&msg, fmt, ap);
  va_end(ap);
  if (n < 0 || !keep(a, msg))
    return tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
  a->pub.warnings[a->pub.n_warnings++] = (struct tz_topo_warning){code, gpu, msg};
  return 0;
}

void tz_topo_advice_params_init(struct tz_topo_advice_params *p) {
  memset(p, 0, sizeof *p);
  p->memlock_bytes = TZ_TOPO_FACT_LIVE;
  p->cap_ipc_lock = TZ_TOPO_FACT_LIVE;
  p->progress_cores = 1;
}

/* Cores (each as the set of its hardware threads) inside set and outside taken, in hwloc's order.
 */
static int cores_in(const tz_topo *t, const tz_cpuset *set, const tz_cpuset *taken,
                    tz_cpuset **out) {
  hwloc_obj_type_t type =
      hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE) > 0 ? HWLOC_OBJ_CORE : HWLOC_OBJ_PU;
  int total = hwloc_get_nbobjs_by_type(t->hw, type);
  tz_cpuset *cores = calloc((size_t)total + 1, sizeof *cores);
  if (!cores)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
  int n = 0;
  for (int i = 0; i < total; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(t->hw, type, (unsigned)i);
    tz_cpuset c;
    topo_bitmap_to_cpuset(o->cpuset, &c);
    if (!tz_cpuset_empty(&c) && tz_cpuset_includes(set, &c) &&
        (!taken || !tz_cpuset_intersects(taken, &c)))
      cores[n++] = c;
  }
  *out = cores;
  return n;
}

/* The worse (farther) of two classes, UNKNOWN counting as farthest. */
static enum tz_topo_link worse(enum tz_topo_link a, enum tz_topo_link b) { return a > b ? a : b; }

/* Class of the path from endpoint e (a GPU) to block device b; md/dm count as their farthest
 * member. */
static enum tz_topo_link gpu_to_block(const tz_topo *t, int e, int b) {
  if (b < 0)
    return TZ_TOPO_UNKNOWN;
  const struct tz_topo_blockdev *d = &t->blockdevs[b];
  if (d->n_members > 0) {
    enum tz_topo_link l = TZ_TOPO_SELF;
    for (int k = 0; k < d->n_members; k++)
      l = worse(l, gpu_to_block(t, e, d->members[k]));
    return l;
  }
  if (e < 0)
    return TZ_TOPO_UNKNOWN;
  return tz_topo_pci_link(t, e, tz_topo_endpoint_find(t, TZ_TOPO_KIND_BLOCK, b));
}

static int is_nvme(const tz_topo *t, int b) {
  if (b < 0)
    return 0;
  const struct tz_topo_blockdev *d = &t->blockdevs[b];
  if (d->n_members == 0)
    return strcmp(d->kind, "nvme") == 0;
  for (int k = 0; k < d->n_members; k++)
    if (!is_nvme(t, d->members[k]))
      return 0;
  return 1;
}

static int any_rotational(const tz_topo *t, int b) {
  const struct tz_topo_blockdev *d = &t->blockdevs[b];
  if (d->rotational == 1)
    return 1;
  for (int k = 0; k < d->n_members; k++)
    if (any_rotational(t, d->members[k]))
      return 1;
  return 0;
}

/* A candidate directory for the nvme tier and the device under it. */
struct cand {
  const char *dir;
  int blockdev;
};

/* Mounts on NVMe that a tier could write to: read-write, and not the boot partitions. */
static int nvme_mounts(const tz_topo *t, struct cand *out, int max) {
  int n = 0;
  for (int i = 0; i < t->n_mounts && n < max; i++) {
    const struct tz_topo_mount *m = &t->mounts[i];
    if (m->read_only || !is_nvme(t, m->blockdev) || strncmp(m->path, "/boot", 5) == 0)
      continue;
    out[n++] = (struct cand){m->path, m->blockdev};
  }
  return n;
}

static int check_swap_dirs(const tz_topo *t, const struct tz_topo_advice_params *p,
                           struct advice *a, struct cand *cands) {
  for (int i = 0; i < p->n_swap_dirs; i++) {
    const char *dir = p->swap_dirs[i];
    int mi = tz_topo_mount_for_path(t, dir);
    cands[i] = (struct cand){dir, -1};
    if (mi < 0) {
      TZ_CHECK(warn(a, "swap_dir_unknown", -1,
                    "swap dir %s: no mount holds it%s, so its disk and locality are unknown", dir,
                    t->n_mounts ? "" : " (no mount table: pass one from the described machine)"));
      continue;
    }
    const struct tz_topo_mount *m = &t->mounts[mi];
    cands[i].blockdev = m->blockdev;
    if (!strcmp(m->fstype, "tmpfs") || !strcmp(m->fstype, "ramfs"))
      TZ_CHECK(warn(a, "swap_dir_tmpfs", -1,
                    "swap dir %s is on %s (%s): it lives in RAM, so offloading there frees no "
                    "memory; use a directory on an NVMe drive",
                    dir, m->fstype, m->path));
    else if (m->blockdev >= 0 && any_rotational(t, m->blockdev))
      TZ_CHECK(warn(a, "swap_dir_rotational", -1,
                    "swap dir %s is on %s, which the kernel reports as rotational: a spinning "
                    "disk moves 100-250 MB/s where an NVMe drive moves several GB/s (virtual "
                    "disks often claim this wrongly; tz-topo --measure shows the real rate)",
                    dir, t->blockdevs[m->blockdev].name));
    else if (m->blockdev < 0)
      TZ_CHECK(warn(a, "swap_dir_unknown", -1,
                    "swap dir %s is on %s (%s), not on a local disk this report knows", dir,
                    m->fstype, m->source));
    if (m->odirect == 0)
      TZ_CHECK(warn(a, "swap_dir_no_odirect", -1,
                    "swap dir %s: %s at %s refuses O_DIRECT, so the nvme tier falls back to "
                    "buffered I/O through the page cache",
                    dir, m->fstype, m->path));
  }
  return 0;
}

/* Fills the placement's NVMe devices and directories: those on its NUMA node, nearest first; all of
 * them, nearest first, with a warning, when none is. */
static int place_storage(const tz_topo *t, struct advice *a, struct tz_topo_placement *pl,
                         const struct cand *cands, int n_cands, int dirs_given) {
  int e = pl->gpu >= 0 ? tz_topo_endpoint_find(t, TZ_TOPO_KIND_GPU, pl->gpu) : -1;
  int *devs = keep(a, calloc((size_t)t->n_blockdevs + 1, sizeof *devs));
  const char **dirs = keep(a, calloc((size_t)n_cands + 1, sizeof *dirs));
  enum tz_topo_link *cls =
      calloc((size_t)(n_cands > t->n_blockdevs ? n_cands : t->n_blockdevs) + 1, sizeof *cls);
  if (!devs || !dirs || !cls) {
    free(cls);
    return tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
  }
  /* Local means the same NUMA node: PIX, PXB, PHB or NODE. A CPU-only rank takes every drive. */
  enum tz_topo_link local = pl->gpu >= 0 ? TZ_TOPO_NODE : TZ_TOPO_UNKNOWN;
  int n = 0;
  for (int b = 0; b < t->n_blockdevs; b++) {
    if (!is_nvme(t, b) || t->blockdevs[b].n_members > 0)
      continue;
    enum tz_topo_link l = pl->gpu >= 0 ? gpu_to_block(t, e, b) : TZ_TOPO_SELF;
    if (l > local)
      continue;
    int k = n++;
    while (k > 0 && cls[k - 1] > l) { /* insertion keeps name order within a class */
      devs[k] = devs[k - 1];
      cls[k] = cls[k - 1];
      k--;
    }
    devs[k] = b;
    cls[k] = l;
  }
  pl->nvme = devs;
  pl->n_nvme = n;

  int nearest = -1;
  enum tz_topo_link nearest_cls = TZ_TOPO_UNKNOWN;
  int nd = 0;
  for (int pass = 0; pass < 2 && nd == 0; pass++) {
    for (int i = 0; i < n_cands; i++) {
      enum tz_topo_link l = pl->gpu >= 0 ? gpu_to_block(t, e, cands[i].blockdev) : TZ_TOPO_SELF;
      if (nearest < 0 || l < nearest_cls) {
        nearest = i;
        nearest_cls = l;
      }
      if (pass == 0 && l > local)
        continue;
      int k = nd++;
      while (k > 0 && cls[k - 1] > l) {
        dirs[k] = dirs[k - 1];
        cls[k] = cls[k - 1];
        k--;
      }
      dirs[k] = cands[i].dir;
      cls[k] = l;
    }
    if (nd == 0 && n_cands > 0 && pl->gpu >= 0) {
      const struct tz_topo_gpu *g = &t->gpus[pl->gpu];
      int b = cands[nearest].blockdev;
      int rc =
          warn(a, "gpu_nvme_remote", pl->gpu,
               "GPU%d (NUMA node %d) has no %s on its NUMA node; the nearest, %s (%s), is %s "
               "away, so its reads cross %s",
               pl->gpu, g->numa_node, dirs_given ? "swap dir" : "NVMe drive", cands[nearest].dir,
               b >= 0 ? t->blockdevs[b].name : "unknown disk", tz_topo_link_name(nearest_cls),
               nearest_cls == TZ_TOPO_SYS ? "the link between the sockets" : "an unknown path");
      if (rc < 0) {
        free(cls);
        return rc;
      }
    }
  }
  free(cls);
  pl->dirs = dirs;
  pl->n_dirs = nd;
  return 0;
}

static int nearest_nic(const tz_topo *t, int gpu) {
  int e = tz_topo_endpoint_find(t, TZ_TOPO_KIND_GPU, gpu);
  int best = -1;
  enum tz_topo_link best_cls = TZ_TOPO_UNKNOWN;
  for (int i = 0; i < t->n_nics; i++) {
    enum tz_topo_link l = tz_topo_pci_link(t, e, tz_topo_endpoint_find(t, TZ_TOPO_KIND_NIC, i));
    if (l < best_cls) {
      best = i;
      best_cls = l;
    }
  }
  return best;
}

/* Shares the cores of one locality among its GPUs: contiguous runs, the first progress_cores of
 * each run kept for that GPU's progress engine. */
static int place_group(const tz_topo *t, struct advice *a, struct tz_topo_placement **pls, int k,
                       const tz_cpuset *set, tz_cpuset *taken, int progress) {
  tz_cpuset *cores = NULL;
  int c = cores_in(t, set, taken, &cores);
  if (c < 0)
    return c;
  int shared = c < k;
  if (c == 0) {
    /* Every core here went to GPUs of a narrower locality: share them. */
    free(cores);
    TZ_CHECK(c = cores_in(t, set, NULL, &cores));
  }
  int start = 0;
  for (int i = 0; i < k; i++) {
    struct tz_topo_placement *pl = pls[i];
    int share = c >= k ? c / k + (i < c % k) : 1;
    int first = c >= k ? start : (c ? i % c : 0);
    start += share;
    tz_cpuset_zero(&pl->cpus);
    tz_cpuset_zero(&pl->progress_cpus);
    if (c == 0)
      continue;
    int keep_n = share > progress ? progress : share - 1;
    for (int j = 0; j < share; j++) {
      if (j < keep_n)
        tz_cpuset_or(&pl->progress_cpus, &cores[first + j]);
      else
        tz_cpuset_or(&pl->cpus, &cores[first + j]);
      tz_cpuset_or(taken, &cores[first + j]);
    }
    pl->n_cores = share - keep_n;
    if (progress > 0 && keep_n < progress)
      tz_cpuset_or(&pl->progress_cpus, &pl->cpus); /* too few cores: the engine shares them */
    int rc = 0;
    char list[256], who[32];
    tz_cpuset_format(&pl->cpus, list, sizeof list);
    if (pl->gpu >= 0)
      snprintf(who, sizeof who, "GPU%d", pl->gpu);
    else
      snprintf(who, sizeof who, "the machine");
    if (shared)
      rc = warn(a, "cores_shared", pl->gpu,
                "%s: %d cores for %d GPUs here, so GPUs share cores (cpus %s) and their "
                "threads compete",
                who, c, k, list);
    else if (progress > 0 && keep_n < progress)
      rc = warn(a, "cores_shared", pl->gpu,
                "%s has %d core%s: its progress engine shares cpus %s with its I/O and "
                "optimizer threads",
                who, share, share == 1 ? "" : "s", list);
    if (rc < 0) {
      free(cores);
      return rc;
    }
  }
  free(cores);
  return 0;
}

static int place_gpus(const tz_topo *t, struct advice *a, int progress) {
  int n = t->n_gpus;
  tz_cpuset all;
  topo_bitmap_to_cpuset(hwloc_topology_get_topology_cpuset(t->hw), &all);
  /* Group GPUs by locality; narrow localities choose first, so a GPU placed only at the machine
   * level (unknown NUMA node) takes what the others leave. */
  tz_cpuset *sets = calloc((size_t)n, sizeof *sets);
  int *group_of = calloc((size_t)n, sizeof *group_of);
  int *order = calloc((size_t)n, sizeof *order);
  struct tz_topo_placement **members = calloc((size_t)n, sizeof *members);
  int rc = 0;
  if (!sets || !group_of || !order || !members) {
    rc = tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
    goto out;
  }
  int n_groups = 0;
  for (int g = 0; g < n; g++) {
    const tz_cpuset *loc = tz_cpuset_empty(&t->gpus[g].local_cpus) ? &all : &t->gpus[g].local_cpus;
    int found = -1;
    for (int j = 0; j < n_groups && found < 0; j++)
      if (tz_cpuset_equal(&sets[j], loc))
        found = j;
    if (found < 0) {
      found = n_groups++;
      sets[found] = *loc;
    }
    group_of[g] = found;
  }
  for (int j = 0; j < n_groups; j++) {
    int k = j, cj = tz_cpuset_count(&sets[j]);
    while (k > 0 && tz_cpuset_count(&sets[order[k - 1]]) > cj) {
      order[k] = order[k - 1];
      k--;
    }
    order[k] = j;
  }
  tz_cpuset taken;
  tz_cpuset_zero(&taken);
  for (int oi = 0; oi < n_groups; oi++) {
    int j = order[oi], k = 0;
    for (int g = 0; g < n; g++)
      if (group_of[g] == j)
        members[k++] = &a->pub.placements[g];
    TZ_CHECK_GOTO(place_group(t, a, members, k, &sets[j], &taken, progress), rc, out);
  }
out:
  free(sets);
  free(group_of);
  free(order);
  free(members);
  return rc;
}

int tz_topo_advise(const tz_topo *t, const struct tz_topo_advice_params *p,
                   struct tz_topo_advice **out) {
  struct tz_topo_advice_params def;
  if (!p) {
    tz_topo_advice_params_init(&def);
    p = &def;
  }
  if (!t || !out)
    return tz_err_set(TZ_EINVAL, "topo: tz_topo_advise needs a topology and an output pointer");
  *out = NULL;
  if (p->n_swap_dirs < 0 || p->n_swap_dirs > TZ_TOPO_MAX_SWAP_DIRS)
    return tz_err_set(TZ_EINVAL, "topo: %d swap dirs (at most %d)", p->n_swap_dirs,
                      TZ_TOPO_MAX_SWAP_DIRS);
  for (int i = 0; i < p->n_swap_dirs; i++)
    if (!p->swap_dirs[i] || !p->swap_dirs[i][0])
      return tz_err_set(TZ_EINVAL, "topo: swap dir %d is empty", i);
  if (p->progress_cores < 0)
    return tz_err_set(TZ_EINVAL, "topo: progress_cores %d is negative", p->progress_cores);
  if (p->thp && strcmp(p->thp, "always") && strcmp(p->thp, "madvise") && strcmp(p->thp, "never"))
    return tz_err_set(TZ_EINVAL, "topo: thp \"%s\" is not always, madvise or never", p->thp);
  if (p->memlock_bytes < TZ_TOPO_FACT_LIVE)
    return tz_err_set(TZ_EINVAL, "topo: memlock_bytes %lld", (long long)p->memlock_bytes);
  if (p->cap_ipc_lock != TZ_TOPO_FACT_LIVE && p->cap_ipc_lock != 0 && p->cap_ipc_lock != 1)
    return tz_err_set(TZ_EINVAL, "topo: cap_ipc_lock %d is not 0, 1 or TZ_TOPO_FACT_LIVE",
                      p->cap_ipc_lock);

  struct advice *a = calloc(1, sizeof *a);
  if (!a)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
  int rc = 0;
  struct cand *cands = NULL;
  int live = t->machine.live;
  a->pub.memlock_bytes = p->memlock_bytes != TZ_TOPO_FACT_LIVE ? p->memlock_bytes
                         : live                                ? topo_live_memlock()
                                                               : TZ_TOPO_FACT_LIVE;
  a->pub.cap_ipc_lock = p->cap_ipc_lock != TZ_TOPO_FACT_LIVE ? p->cap_ipc_lock
                        : live                               ? topo_live_cap_ipc_lock()
                                                             : TZ_TOPO_FACT_LIVE;
  a->pub.thp = p->thp ? p->thp : live ? topo_live_thp() : NULL;

  int np = t->n_gpus > 0 ? t->n_gpus : 1;
  a->pub.placements = keep(a, calloc((size_t)np, sizeof *a->pub.placements));
  cands = calloc((size_t)(p->n_swap_dirs + t->n_mounts) + 1, sizeof *cands);
  if (!a->pub.placements || !cands) {
    rc = tz_err_set(TZ_ENOMEM, "topo: no memory for advice");
    goto fail;
  }
  a->pub.n_placements = np;

  int n_cands = p->n_swap_dirs;
  TZ_CHECK_GOTO(check_swap_dirs(t, p, a, cands), rc, fail);
  if (n_cands == 0)
    n_cands = nvme_mounts(t, cands, t->n_mounts);

  if (t->n_gpus == 0) {
    /* CPU-only: the whole machine computes; one core is kept for the progress engine. */
    struct tz_topo_placement *pl = &a->pub.placements[0];
    pl->gpu = -1;
    pl->numa_node = t->n_numa == 1 ? t->numa[0].os_index : -1;
    pl->nic = -1;
    tz_cpuset all, taken;
    topo_bitmap_to_cpuset(hwloc_topology_get_topology_cpuset(t->hw), &all);
    tz_cpuset_zero(&taken);
    TZ_CHECK_GOTO(place_group(t, a, &pl, 1, &all, &taken, p->progress_cores), rc, fail);
  } else {
    for (int g = 0; g < t->n_gpus; g++) {
      struct tz_topo_placement *pl = &a->pub.placements[g];
      const struct tz_topo_gpu *gp = &t->gpus[g];
      pl->gpu = g;
      pl->numa_node = gp->numa_node >= 0 ? gp->numa_node
                      : t->n_numa == 1   ? t->numa[0].os_index
                                         : -1;
      pl->nic = nearest_nic(t, g);
      if (pl->numa_node < 0)
        TZ_CHECK_GOTO(warn(a, "gpu_locality_unknown", g,
                           "GPU%d (%s): hwloc places it on no single NUMA node, so its pinned "
                           "buffers go wherever the allocating thread runs",
                           g, gp->busid),
                      rc, fail);
      if (gp->link.width > 0 && gp->link.max_width > gp->link.width)
        TZ_CHECK_GOTO(warn(a, "pcie_link_degraded", g,
                           "GPU%d (%s) runs its PCIe link at x%d of x%d: host transfers get a "
                           "fraction of their bandwidth (reseat the card or check the slot)",
                           g, gp->busid, gp->link.width, gp->link.max_width),
                      rc, fail);
    }
    TZ_CHECK_GOTO(place_gpus(t, a, p->progress_cores), rc, fail);
  }
  for (int i = 0; i < np; i++)
    TZ_CHECK_GOTO(place_storage(t, a, &a->pub.placements[i], cands, n_cands, p->n_swap_dirs > 0),
                  rc, fail);

  int any_nvme = 0;
  for (int b = 0; b < t->n_blockdevs; b++)
    any_nvme |= is_nvme(t, b);
  if (!any_nvme && t->n_gpus > 0 && p->n_swap_dirs == 0)
    TZ_CHECK_GOTO(warn(a, "no_nvme", -1,
                       "no NVMe drive: state that does not fit in GPU and host memory has no fast "
                       "place to go"),
                  rc, fail);
  /* CAP_IPC_LOCK (root has it) lifts the limit for mlock and io_uring buffer registration. */
  if (p->pinned_pool_bytes > 0 && a->pub.memlock_bytes >= 0 && a->pub.cap_ipc_lock != 1 &&
      (uint64_t)a->pub.memlock_bytes < p->pinned_pool_bytes) {
    char have[32], need[32];
    tz_bytes_format(have, sizeof have, (double)(uint64_t)a->pub.memlock_bytes, &tz_bytes_iec);
    tz_bytes_format(need, sizeof need, (double)p->pinned_pool_bytes, &tz_bytes_iec);
    TZ_CHECK_GOTO(warn(a, "memlock_low", -1,
                       "RLIMIT_MEMLOCK is %s but the pinned pool needs %s: io_uring cannot "
                       "register the buffers (raise it: `ulimit -l unlimited`, memlock in "
                       "/etc/security/limits.conf, or LimitMEMLOCK= for a service)",
                       have, need),
                  rc, fail);
  }
  if (a->pub.thp && strcmp(a->pub.thp, "never") == 0)
    TZ_CHECK_GOTO(warn(a, "thp_disabled", -1,
                       "transparent hugepages are disabled: pinned buffers and optimizer state "
                       "use 4 KiB pages, costing TLB misses (echo madvise > "
                       "/sys/kernel/mm/transparent_hugepage/enabled)"),
                  rc, fail);
  free(cands);
  *out = &a->pub;
  return 0;
fail:
  free(cands);
  tz_topo_advice_destroy(&a->pub);
  return rc;
}

void tz_topo_advice_destroy(struct tz_topo_advice *pub) {
  if (!pub)
    return;
  struct advice *a = (struct advice *)pub;
  for (int i = 0; i < a->n_owned; i++)
    free(a->owned[i]);
  free(a->owned);
  free(a->pub.warnings);
  free(a);
}

const struct tz_topo_placement *tz_topo_advice_for_gpu(const struct tz_topo_advice *a, int gpu) {
  for (int i = 0; a && i < a->n_placements; i++)
    if (a->placements[i].gpu == gpu)
      return &a->placements[i];
  return NULL;
}

const struct tz_topo_warning *tz_topo_advice_warning(const struct tz_topo_advice *a,
                                                     const char *code, int gpu) {
  for (int i = 0; a && i < a->n_warnings; i++)
    if (strcmp(a->warnings[i].code, code) == 0 && (gpu == -2 || a->warnings[i].gpu == gpu))
      return &a->warnings[i];
  return NULL;
}
