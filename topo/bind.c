/* Binding the calling thread, and reading back what the kernel actually did. */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int need_live(const tz_topo *t, const char *what) {
  if (!t->machine.live)
    return tz_err_set(TZ_ENOTSUP, "topo: %s needs this machine's topology, not one from %s", what,
                      t->machine.xml_path);
  return 0;
}

static hwloc_bitmap_t to_bitmap(const tz_cpuset *s) {
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  if (!b)
    return NULL;
  for (int c = tz_cpuset_next(s, 0); c >= 0; c = tz_cpuset_next(s, c + 1))
    hwloc_bitmap_set(b, (unsigned)c);
  return b;
}

int tz_topo_bind_thread(tz_topo *t, const tz_cpuset *cpus) {
  TZ_CHECK(need_live(t, "binding a thread"));
  char list[256];
  tz_cpuset_format(cpus, list, sizeof list);
  if (tz_cpuset_empty(cpus))
    return tz_err_set(TZ_EINVAL, "topo: cannot bind a thread to an empty CPU set");
  hwloc_bitmap_t b = to_bitmap(cpus);
  if (!b)
    return tz_err_set(TZ_ENOMEM, "topo: no memory");
  int r = hwloc_set_cpubind(t->hw, b, HWLOC_CPUBIND_THREAD | HWLOC_CPUBIND_STRICT);
  int e = errno;
  hwloc_bitmap_free(b);
  if (r != 0)
    return tz_err_errno(e, "topo: binding the thread to cpus %s", list);
  return 0;
}

/* Adds the N<node>=<pages> fields of /proc/self/numa_maps, in bytes, to out->node_bytes. */
static int read_numa_maps(struct tz_topo_binding *out) {
  FILE *f = fopen("/proc/self/numa_maps", "re");
  if (!f)
    return tz_err_errno(errno, "topo: /proc/self/numa_maps");
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, f) > 0) {
    uint64_t page_kb = 4;
    uint64_t pages[TZ_TOPO_MAX_NODES] = {0};
    for (char *save = NULL, *tok = strtok_r(line, " \n", &save); tok;
         tok = strtok_r(NULL, " \n", &save)) {
      unsigned node;
      unsigned long long n;
      if (sscanf(tok, "N%u=%llu", &node, &n) == 2 && node < TZ_TOPO_MAX_NODES)
        pages[node] += n;
      else if (sscanf(tok, "kernelpagesize_kB=%llu", &n) == 1)
        page_kb = n;
    }
    for (int i = 0; i < TZ_TOPO_MAX_NODES; i++) {
      out->node_bytes[i] += pages[i] * page_kb * 1024;
      if (pages[i] && i > out->max_node)
        out->max_node = i;
    }
  }
  free(line);
  fclose(f);
  return 0;
}

int tz_topo_binding_readback(tz_topo *t, struct tz_topo_binding *out) {
  TZ_CHECK(need_live(t, "reading back the binding"));
  memset(out, 0, sizeof *out);
  out->last_cpu = -1;
  out->max_node = -1;
  out->mempolicy = "default";
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  if (!b)
    return tz_err_set(TZ_ENOMEM, "topo: no memory");
  int rc = 0;
  if (hwloc_get_cpubind(t->hw, b, HWLOC_CPUBIND_THREAD) != 0) {
    rc = tz_err_errno(errno, "topo: hwloc_get_cpubind");
    goto out;
  }
  topo_bitmap_to_cpuset(b, &out->cpus);
  if (hwloc_get_last_cpu_location(t->hw, b, HWLOC_CPUBIND_THREAD) == 0)
    out->last_cpu = hwloc_bitmap_first(b);
  hwloc_membind_policy_t pol;
  if (hwloc_get_membind(t->hw, b, &pol, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET) == 0) {
    topo_bitmap_to_cpuset(b, &out->mem_nodes);
    switch (pol) {
    case HWLOC_MEMBIND_FIRSTTOUCH: out->mempolicy = "firsttouch"; break;
    case HWLOC_MEMBIND_BIND: out->mempolicy = "bind"; break;
    case HWLOC_MEMBIND_INTERLEAVE: out->mempolicy = "interleave"; break;
    case HWLOC_MEMBIND_NEXTTOUCH: out->mempolicy = "nexttouch"; break;
    case HWLOC_MEMBIND_MIXED: out->mempolicy = "mixed"; break;
    default: out->mempolicy = "default"; break;
    }
  }
  rc = read_numa_maps(out);
out:
  hwloc_bitmap_free(b);
  return rc;
}

struct strbuf {
  char *buf;
  size_t len, n; /* n: what the whole text needs, as snprintf counts */
};

static void sb_printf(struct strbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct strbuf *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r =
      vsnprintf(s->n < s->len ? s->buf + s->n : NULL, s->n < s->len ? s->len - s->n : 0, fmt, ap);
  va_end(ap);
  if (r > 0)
    s->n += (size_t)r;
}

int tz_topo_binding_format(const struct tz_topo_binding *b, char *buf, size_t len) {
  struct strbuf s = {buf, len, 0};
  if (len)
    buf[0] = '\0';
  char cpus[256], nodes[128];
  tz_cpuset_format(&b->cpus, cpus, sizeof cpus);
  tz_cpuset_format(&b->mem_nodes, nodes, sizeof nodes);
  sb_printf(&s, "cpus %s", cpus);
  if (b->last_cpu >= 0)
    sb_printf(&s, " (last ran on %d)", b->last_cpu);
  sb_printf(&s, ", memory policy %s%s%s, resident:", b->mempolicy, nodes[0] ? " on nodes " : "",
            nodes);
  for (int i = 0; i <= b->max_node; i++)
    if (b->node_bytes[i])
      sb_printf(&s, " node%d %.1f MiB", i, (double)b->node_bytes[i] / (1 << 20));
  if (b->max_node < 0)
    sb_printf(&s, " none reported");
  return (int)s.n;
}

int tz_topo_area_node(tz_topo *t, const void *addr, size_t len, int *node) {
  TZ_CHECK(need_live(t, "locating memory"));
  *node = -1;
  hwloc_bitmap_t b = hwloc_bitmap_alloc();
  if (!b)
    return tz_err_set(TZ_ENOMEM, "topo: no memory");
  int r = hwloc_get_area_memlocation(t->hw, addr, len, b, HWLOC_MEMBIND_BYNODESET);
  int e = errno;
  if (r != 0) {
    hwloc_bitmap_free(b);
    return tz_err_errno(e, "topo: locating the pages of %zu bytes at %p", len, addr);
  }
  if (hwloc_bitmap_weight(b) == 1)
    *node = hwloc_bitmap_first(b);
  hwloc_bitmap_free(b);
  return 0;
}
