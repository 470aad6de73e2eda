/* The report: a tree and matrix for people, one JSON object for programs (docs/tz-topo.md). */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/error.h"
#include "util/size.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void pcie_text(const struct tz_topo_pcie *l, char *buf, size_t len) {
  int n = 0;
  buf[0] = '\0';
  if (l->gen > 0 && l->width > 0) {
    n = snprintf(buf, len, "PCIe Gen%d x%d", l->gen, l->width);
    if ((l->max_gen > l->gen || l->max_width > l->width) && n >= 0 && (size_t)n < len)
      n += snprintf(buf + n, len - (size_t)n, " (max Gen%d x%d)", l->max_gen, l->max_width);
  }
  if (l->bandwidth_gbs > 0 && n >= 0 && (size_t)n < len)
    snprintf(buf + n, len - (size_t)n, "%s%.1f GB/s", n ? ", " : "PCIe ", l->bandwidth_gbs);
}

static const char *rot_text(int r) {
  return r == 1 ? "rotational" : r == 0 ? "solid-state" : "rotation unknown";
}

static const char *odirect_text(int o) { return o == 1 ? "yes" : o == 0 ? "no" : "unknown"; }

static void print_gpu(FILE *f, const tz_topo *t, int i, const char *indent) {
  const struct tz_topo_gpu *g = &t->gpus[i];
  char link[96], cpus[256];
  pcie_text(&g->link, link, sizeof link);
  tz_cpuset_format(&g->local_cpus, cpus, sizeof cpus);
  fprintf(f, "%sGPU%d  %s  %s  [%04x:%04x, name from %s]%s%s\n", indent, i, g->busid, g->name,
          g->vendor_id, g->device_id, g->name_source, link[0] ? "  " : "", link);
}

static void print_nic(FILE *f, const tz_topo *t, int i, const char *indent) {
  const struct tz_topo_nic *n = &t->nics[i];
  char link[96];
  pcie_text(&n->link, link, sizeof link);
  fprintf(f, "%sNIC   %s%s%s%s  %s  %s  [%04x:%04x]%s%s\n", indent, n->name,
          n->netdev[0] && strcmp(n->netdev, n->name) ? " (" : "",
          n->netdev[0] && strcmp(n->netdev, n->name) ? n->netdev : "",
          n->netdev[0] && strcmp(n->netdev, n->name) ? ")" : "", n->kind, n->busid, n->vendor_id,
          n->device_id, link[0] ? "  " : "", link);
}

static void print_block(FILE *f, const tz_topo *t, int i, const char *indent) {
  const struct tz_topo_blockdev *b = &t->blockdevs[i];
  char size[32], link[96];
  tz_bytes_format(size, sizeof size, (double)b->size_bytes, &tz_bytes_iec);
  pcie_text(&b->link, link, sizeof link);
  fprintf(f, "%sdisk  %s  %s  %s  %s", indent, b->name, b->kind, b->size_bytes ? size : "size?",
          rot_text(b->rotational));
  if (b->busid[0])
    fprintf(f, "  %s", b->busid);
  if (b->model[0])
    fprintf(f, "  \"%s\"", b->model);
  if (link[0])
    fprintf(f, "  %s", link);
  if (b->n_members) {
    fprintf(f, "  on");
    for (int k = 0; k < b->n_members; k++)
      fprintf(f, "%s%s", k ? "," : " ", t->blockdevs[b->members[k]].name);
  }
  fprintf(f, "\n");
  for (int k = 0; k < b->n_mounts; k++) {
    const struct tz_topo_mount *m = &t->mounts[b->mounts[k]];
    fprintf(f, "%s        %s  %s%s  O_DIRECT %s\n", indent, m->path, m->fstype,
            m->read_only ? " (read-only)" : "", odirect_text(m->odirect));
  }
}

/* Devices whose locality is node (OS index), or, with node -1, package pkg and no single node, or,
 * with both -1, neither. */
static int print_devices(FILE *f, const tz_topo *t, int node, int pkg, const char *indent) {
  int n = 0;
#define HERE(x)                                                                                    \
  ((node >= 0 && (x).numa_node == node) || (node < 0 && (x).numa_node < 0 && (x).package == pkg))
  for (int i = 0; i < t->n_gpus; i++)
    if (HERE(t->gpus[i])) {
      print_gpu(f, t, i, indent);
      n++;
    }
  for (int i = 0; i < t->n_nics; i++)
    if (HERE(t->nics[i])) {
      print_nic(f, t, i, indent);
      n++;
    }
  for (int i = 0; i < t->n_blockdevs; i++)
    if (HERE(t->blockdevs[i])) {
      print_block(f, t, i, indent);
      n++;
    }
#undef HERE
  return n;
}

static void print_numa(FILE *f, const tz_topo *t, const struct tz_topo_numa *n,
                       const char *indent) {
  char total[32], free_b[32], cpus[256];
  tz_bytes_format(total, sizeof total, (double)n->total_bytes, &tz_bytes_iec);
  if (n->free_bytes >= 0)
    tz_bytes_format(free_b, sizeof free_b, (double)(uint64_t)n->free_bytes, &tz_bytes_iec);
  else
    snprintf(free_b, sizeof free_b, "%s", t->machine.live ? "unknown" : "not in the XML");
  tz_cpuset_format(&n->cpus, cpus, sizeof cpus);
  fprintf(f, "%sNUMA node %d: %s, free %s, cpus %s (%d cores, %d threads)\n", indent, n->os_index,
          total, free_b, cpus[0] ? cpus : "none", n->n_cores, n->n_pus);
}

static void print_tree(FILE *f, const tz_topo *t) {
  const struct tz_topo_machine *m = &t->machine;
  char mem[32], l3[32];
  tz_bytes_format(mem, sizeof mem, (double)m->memory_bytes, &tz_bytes_iec);
  tz_bytes_format(l3, sizeof l3, (double)m->l3_bytes, &tz_bytes_iec);
  if (m->live)
    fprintf(f, "This machine");
  else
    fprintf(f, "Machine described by %s", m->xml_path);
  fprintf(f, "%s%s%s: %s %s, %s; hwloc %s; NVML %s\n", m->hostname[0] ? " \"" : "", m->hostname,
          m->hostname[0] ? "\"" : "", m->os_release[0] ? "Linux" : "", m->os_release,
          m->arch[0] ? m->arch : "unknown architecture", m->hwloc_version, m->nvml);
  fprintf(f, "  %d package%s, %d NUMA node%s, %d cores, %d hardware threads, ", m->n_packages,
          m->n_packages == 1 ? "" : "s", m->n_numa, m->n_numa == 1 ? "" : "s", m->n_cores,
          m->n_pus);
  if (m->n_l3)
    fprintf(f, "%d x %s L3, ", m->n_l3, l3);
  fprintf(f, "%s memory\n", mem);
  for (int p = 0; p < t->n_packages; p++) {
    const struct tz_topo_package *pk = &t->packages[p];
    char cpus[256], pl3[32];
    tz_cpuset_format(&pk->cpus, cpus, sizeof cpus);
    tz_bytes_format(pl3, sizeof pl3, (double)pk->l3_bytes, &tz_bytes_iec);
    fprintf(f, "  Package %d: %s, %d cores, %d threads (cpus %s)", pk->os_index,
            pk->cpu_model[0] ? pk->cpu_model : "unknown CPU", pk->n_cores, pk->n_pus, cpus);
    if (pk->n_l3 == 1)
      fprintf(f, ", L3 %s", pl3);
    else if (pk->n_l3 > 1)
      fprintf(f, ", %d x %s L3", pk->n_l3, pl3);
    fprintf(f, "\n");
    for (int i = 0; i < t->n_numa; i++)
      if (t->numa[i].package == p) {
        print_numa(f, t, &t->numa[i], "    ");
        print_devices(f, t, t->numa[i].os_index, -2, "      ");
      }
    print_devices(f, t, -1, p, "    ");
  }
  for (int i = 0; i < t->n_numa; i++)
    if (t->numa[i].package < 0) {
      print_numa(f, t, &t->numa[i], "  ");
      print_devices(f, t, t->numa[i].os_index, -2, "    ");
    }
  int cnt = 0;
  for (int i = 0; i < t->n_gpus; i++)
    cnt += t->gpus[i].numa_node < 0 && t->gpus[i].package < 0;
  for (int i = 0; i < t->n_nics; i++)
    cnt += t->nics[i].numa_node < 0 && t->nics[i].package < 0;
  for (int i = 0; i < t->n_blockdevs; i++)
    cnt += t->blockdevs[i].numa_node < 0 && t->blockdevs[i].package < 0;
  if (cnt) {
    fprintf(f, "  Not local to one package:\n");
    print_devices(f, t, -1, -1, "    ");
  }
  if (t->n_gpus == 0)
    fprintf(f, "  GPUs: none (no NVIDIA display-class PCI device)\n");
  if (t->n_blockdevs == 0)
    fprintf(f, "  Block devices: none found\n");
}

static void print_matrix(FILE *f, const tz_topo *t) {
  int n = t->n_endpoints;
  if (n == 0) {
    fprintf(f, "\nMatrix: no GPU, NIC or disk on PCI to relate\n");
    return;
  }
  int w = 4;
  for (int i = 0; i < n; i++) {
    int l = (int)strlen(t->endpoints[i].label);
    if (l > w)
      w = l;
  }
  fprintf(f, "\nMatrix (classes as nvidia-smi topo -m):\n%*s", w + 2, "");
  for (int j = 0; j < n; j++)
    fprintf(f, " %-*s", w, t->endpoints[j].label);
  fprintf(f, "  CPU Affinity  NUMA Affinity\n");
  for (int i = 0; i < n; i++) {
    fprintf(f, "  %-*s", w, t->endpoints[i].label);
    for (int j = 0; j < n; j++) {
      int nv;
      enum tz_topo_link l = tz_topo_link(t, i, j, &nv);
      char c[16];
      if (l == TZ_TOPO_NVLINK)
        snprintf(c, sizeof c, "NV%d", nv);
      else
        snprintf(c, sizeof c, "%s", tz_topo_link_name(l));
      fprintf(f, " %-*s", w, c);
    }
    const struct tz_topo_endpoint *e = &t->endpoints[i];
    int node = e->kind == TZ_TOPO_KIND_GPU   ? t->gpus[e->index].numa_node
               : e->kind == TZ_TOPO_KIND_NIC ? t->nics[e->index].numa_node
                                             : t->blockdevs[e->index].numa_node;
    if (e->kind == TZ_TOPO_KIND_GPU) {
      char cpus[256];
      tz_cpuset_format(&t->gpus[e->index].local_cpus, cpus, sizeof cpus);
      fprintf(f, "  %-12s", cpus);
    } else {
      fprintf(f, "  %-12s", "");
    }
    if (node >= 0)
      fprintf(f, "  %d\n", node);
    else
      fprintf(f, "  N/A\n");
  }
  fprintf(f, "Legend:\n"
             "  X    = self\n"
             "  SYS  = through PCIe and the link between NUMA nodes (UPI, Infinity Fabric)\n"
             "  NODE = through PCIe and between PCIe host bridges within a NUMA node\n"
             "  PHB  = through PCIe and a PCIe host bridge (the CPU's root complex)\n"
             "  PXB  = through several PCIe switches, without a host bridge\n"
             "  PIX  = through at most one PCIe switch\n"
             "  NV#  = through # NVLinks (direct or by NVSwitch; from NVML on this machine)\n");
}

static void print_advice(FILE *f, const tz_topo *t, const struct tz_topo_advice *a) {
  fprintf(f, "\nAdvice:\n");
  for (int i = 0; i < a->n_placements; i++) {
    const struct tz_topo_placement *p = &a->placements[i];
    char cpus[256], prog[256];
    tz_cpuset_format(&p->cpus, cpus, sizeof cpus);
    tz_cpuset_format(&p->progress_cpus, prog, sizeof prog);
    if (p->gpu >= 0)
      fprintf(f, "  GPU%d: pinned buffers on NUMA node ", p->gpu);
    else
      fprintf(f, "  CPU-only: host memory on NUMA node ");
    if (p->numa_node >= 0)
      fprintf(f, "%d", p->numa_node);
    else
      fprintf(f, "(any)");
    fprintf(f, "; I/O and optimizer threads on cpus %s (%d core%s); progress engine on cpus %s\n",
            cpus[0] ? cpus : "none", p->n_cores, p->n_cores == 1 ? "" : "s",
            prog[0] ? prog : "none");
    int e = p->gpu >= 0 ? tz_topo_endpoint_find(t, TZ_TOPO_KIND_GPU, p->gpu) : -1;
    fprintf(f, "        NVMe:");
    if (!p->n_nvme)
      fprintf(f, " none local");
    for (int k = 0; k < p->n_nvme; k++) {
      int b = p->nvme[k];
      int be = tz_topo_endpoint_find(t, TZ_TOPO_KIND_BLOCK, b);
      fprintf(f, "%s %s", k ? "," : "", t->blockdevs[b].name);
      if (e >= 0)
        fprintf(f, " (%s)", tz_topo_link_name(tz_topo_pci_link(t, e, be)));
    }
    fprintf(f, "; dirs:");
    if (!p->n_dirs)
      fprintf(f, " none");
    for (int k = 0; k < p->n_dirs; k++)
      fprintf(f, "%s %s", k ? "," : "", p->dirs[k]);
    if (p->gpu >= 0) {
      fprintf(f, "; NIC: ");
      if (p->nic >= 0)
        fprintf(f, "%s (%s)", t->nics[p->nic].name,
                tz_topo_link_name(
                    tz_topo_pci_link(t, e, tz_topo_endpoint_find(t, TZ_TOPO_KIND_NIC, p->nic))));
      else
        fprintf(f, "none");
    }
    fprintf(f, "\n");
  }
  char ml[32];
  if (a->memlock_bytes == TZ_TOPO_UNLIMITED)
    snprintf(ml, sizeof ml, "unlimited");
  else if (a->memlock_bytes >= 0)
    tz_bytes_format(ml, sizeof ml, (double)(uint64_t)a->memlock_bytes, &tz_bytes_iec);
  else
    snprintf(ml, sizeof ml, "unknown");
  fprintf(f, "  Facts: RLIMIT_MEMLOCK %s%s, transparent hugepages %s\n", ml,
          a->cap_ipc_lock == 1   ? " (lifted: the process holds CAP_IPC_LOCK)"
          : a->cap_ipc_lock == 0 ? ""
                                 : " (CAP_IPC_LOCK unknown)",
          a->thp ? a->thp : "unknown");
  fprintf(f, "Warnings:%s\n", a->n_warnings ? "" : " none");
  for (int i = 0; i < a->n_warnings; i++)
    fprintf(f, "  [%s] %s\n", a->warnings[i].code, a->warnings[i].message);
}

static void print_measured(FILE *f, const struct tz_topo_measured *m) {
  fprintf(f, "\nMeasured (through the tier backends):\n");
  if (!m->n)
    fprintf(f, "  nothing to measure: no NVMe directory (give one with --swap-dir) and no GPU\n");
  for (int i = 0; i < m->n; i++) {
    const struct tz_topo_bandwidth *b = &m->items[i];
    char what[300], node[32] = "";
    if (b->gpu >= 0)
      snprintf(what, sizeof what, "GPU%d %s", b->gpu,
               strcmp(b->kind, "h2d") ? "GPU->host (D2H)" : "host->GPU (H2D)");
    else
      snprintf(what, sizeof what, "%s %s%s", b->dir,
               strcmp(b->kind, "nvme_read") ? "write" : "read",
               b->odirect == 1   ? " (O_DIRECT)"
               : b->odirect == 0 ? " (buffered)"
                                 : "");
    if (b->numa_node >= 0)
      snprintf(node, sizeof node, ", buffer on node %d", b->numa_node);
    if (b->gbps >= 0)
      fprintf(f, "  %-48s %8.2f GB/s  (%llu MiB%s)\n", what, b->gbps,
              (unsigned long long)(b->bytes >> 20), node);
    else
      fprintf(f, "  %-48s not measured: %s\n", what, b->error ? b->error : "unknown");
  }
}

int tz_topo_print(FILE *f, const tz_topo *t, const struct tz_topo_advice *a,
                  const struct tz_topo_measured *m) {
  print_tree(f, t);
  print_matrix(f, t);
  if (a)
    print_advice(f, t, a);
  if (m)
    print_measured(f, m);
  if (fflush(f) != 0 || ferror(f))
    return tz_err_errno(errno ? errno : EIO, "topo: writing the report");
  return 0;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static json_t *jint_or_null(long long v) { return v >= 0 ? json_integer(v) : json_null(); }

static json_t *jcpus(const tz_cpuset *s) {
  char buf[4096];
  tz_cpuset_format(s, buf, sizeof buf);
  return json_string(buf);
}

static json_t *jhex4(unsigned v) {
  char buf[8];
  snprintf(buf, sizeof buf, "%04x", v & 0xffffu);
  return json_string(buf);
}

static json_t *jpcie(const struct tz_topo_pcie *l) {
  return json_pack("{s:o, s:o, s:o, s:o, s:o}", "bandwidth_gbs",
                   l->bandwidth_gbs > 0 ? json_real(l->bandwidth_gbs) : json_null(), "gen",
                   l->gen > 0 ? json_integer(l->gen) : json_null(), "width",
                   l->width > 0 ? json_integer(l->width) : json_null(), "max_gen",
                   l->max_gen > 0 ? json_integer(l->max_gen) : json_null(), "max_width",
                   l->max_width > 0 ? json_integer(l->max_width) : json_null());
}

static json_t *jbool_or_null(int v) { return v < 0 ? json_null() : json_boolean(v); }

static json_t *jstr_or_null(const char *s) { return s && s[0] ? json_string(s) : json_null(); }

static json_t *json_cpu_side(const tz_topo *t, json_t *root) {
  const struct tz_topo_machine *m = &t->machine;
  json_object_set_new(root, "source",
                      json_pack("{s:b, s:o, s:s, s:s, s:b}", "live", m->live, "xml",
                                jstr_or_null(m->xml_path), "hwloc_version", m->hwloc_version,
                                "nvml", m->nvml, "free_memory_known", m->free_known));
  json_object_set_new(
      root, "machine",
      json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:I, s:I}", "hostname", m->hostname,
                "os_release", m->os_release, "arch", m->arch, "packages", m->n_packages,
                "numa_nodes", m->n_numa, "cores", m->n_cores, "pus", m->n_pus, "l3_count", m->n_l3,
                "l3_bytes", (json_int_t)m->l3_bytes, "memory_bytes", (json_int_t)m->memory_bytes));
  json_t *pk = json_array();
  for (int i = 0; i < t->n_packages; i++) {
    const struct tz_topo_package *p = &t->packages[i];
    json_array_append_new(pk, json_pack("{s:i, s:s, s:o, s:i, s:i, s:i, s:I}", "os_index",
                                        p->os_index, "cpu_model", p->cpu_model, "cpus",
                                        jcpus(&p->cpus), "cores", p->n_cores, "pus", p->n_pus,
                                        "l3_count", p->n_l3, "l3_bytes", (json_int_t)p->l3_bytes));
  }
  json_object_set_new(root, "packages", pk);
  json_t *nodes = json_array();
  for (int i = 0; i < t->n_numa; i++) {
    const struct tz_topo_numa *n = &t->numa[i];
    json_array_append_new(nodes, json_pack("{s:i, s:o, s:I, s:o, s:o, s:i, s:i}", "os_index",
                                           n->os_index, "package", jint_or_null(n->package),
                                           "total_bytes", (json_int_t)n->total_bytes, "free_bytes",
                                           jint_or_null(n->free_bytes), "cpus", jcpus(&n->cpus),
                                           "cores", n->n_cores, "pus", n->n_pus));
  }
  json_object_set_new(root, "numa_nodes", nodes);
  return root;
}

static void json_devices(const tz_topo *t, json_t *root) {
  json_t *gpus = json_array();
  for (int i = 0; i < t->n_gpus; i++) {
    const struct tz_topo_gpu *g = &t->gpus[i];
    json_array_append_new(
        gpus, json_pack("{s:i, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "index", g->index,
                        "name", g->name, "name_source", g->name_source, "pci_bus_id", g->busid,
                        "vendor_id", jhex4(g->vendor_id), "device_id", jhex4(g->device_id), "pcie",
                        jpcie(&g->link), "numa_node", jint_or_null(g->numa_node), "package",
                        jint_or_null(g->package), "local_cpus", jcpus(&g->local_cpus)));
  }
  json_object_set_new(root, "gpus", gpus);
  json_t *blocks = json_array();
  for (int i = 0; i < t->n_blockdevs; i++) {
    const struct tz_topo_blockdev *b = &t->blockdevs[i];
    json_t *members = json_array(), *mounts = json_array();
    for (int k = 0; k < b->n_members; k++)
      json_array_append_new(members, json_string(t->blockdevs[b->members[k]].name));
    for (int k = 0; k < b->n_mounts; k++) {
      const struct tz_topo_mount *m = &t->mounts[b->mounts[k]];
      json_array_append_new(mounts, json_pack("{s:s, s:s, s:s, s:b, s:o}", "path", m->path,
                                              "fstype", m->fstype, "source", m->source, "read_only",
                                              m->read_only, "odirect", jbool_or_null(m->odirect)));
    }
    json_array_append_new(
        blocks,
        json_pack("{s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "name", b->name,
                  "kind", b->kind, "model", b->model, "size_bytes",
                  b->size_bytes ? json_integer((json_int_t)b->size_bytes) : json_null(),
                  "rotational", jbool_or_null(b->rotational), "pci_bus_id", jstr_or_null(b->busid),
                  "pcie", jpcie(&b->link), "numa_node", jint_or_null(b->numa_node), "package",
                  jint_or_null(b->package), "members", members, "mounts", mounts));
  }
  json_object_set_new(root, "block_devices", blocks);
  json_t *nics = json_array();
  for (int i = 0; i < t->n_nics; i++) {
    const struct tz_topo_nic *n = &t->nics[i];
    json_array_append_new(
        nics,
        json_pack("{s:s, s:o, s:s, s:s, s:o, s:o, s:o, s:o, s:o}", "name", n->name, "netdev",
                  jstr_or_null(n->netdev), "kind", n->kind, "pci_bus_id", n->busid, "vendor_id",
                  jhex4(n->vendor_id), "device_id", jhex4(n->device_id), "pcie", jpcie(&n->link),
                  "numa_node", jint_or_null(n->numa_node), "package", jint_or_null(n->package)));
  }
  json_object_set_new(root, "nics", nics);
}

static void json_matrix(const tz_topo *t, json_t *root) {
  static const char *const kinds[] = {"gpu", "nic", "block"};
  json_t *labels = json_array(), *kind = json_array(), *index = json_array(), *rows = json_array();
  for (int i = 0; i < t->n_endpoints; i++) {
    const struct tz_topo_endpoint *e = &t->endpoints[i];
    json_array_append_new(labels, json_string(e->label));
    json_array_append_new(kind, json_string(kinds[e->kind]));
    json_array_append_new(index, json_integer(e->index));
    json_t *row = json_array();
    for (int j = 0; j < t->n_endpoints; j++) {
      int nv;
      enum tz_topo_link l = tz_topo_link(t, i, j, &nv);
      char c[16];
      if (l == TZ_TOPO_NVLINK)
        snprintf(c, sizeof c, "NV%d", nv);
      else
        snprintf(c, sizeof c, "%s", tz_topo_link_name(l));
      json_array_append_new(row, json_string(c));
    }
    json_array_append_new(rows, row);
  }
  json_object_set_new(root, "matrix",
                      json_pack("{s:o, s:o, s:o, s:o}", "labels", labels, "kinds", kind, "indices",
                                index, "classes", rows));
}

static json_t *json_advice(const tz_topo *t, const struct tz_topo_advice *a) {
  json_t *pls = json_array();
  for (int i = 0; i < a->n_placements; i++) {
    const struct tz_topo_placement *p = &a->placements[i];
    json_t *nvme = json_array(), *dirs = json_array();
    for (int k = 0; k < p->n_nvme; k++)
      json_array_append_new(nvme, json_string(t->blockdevs[p->nvme[k]].name));
    for (int k = 0; k < p->n_dirs; k++)
      json_array_append_new(dirs, json_string(p->dirs[k]));
    json_array_append_new(
        pls, json_pack("{s:o, s:o, s:o, s:o, s:i, s:o, s:o, s:o}", "gpu", jint_or_null(p->gpu),
                       "numa_node", jint_or_null(p->numa_node), "cpus", jcpus(&p->cpus),
                       "progress_cpus", jcpus(&p->progress_cpus), "cores", p->n_cores, "nic",
                       p->nic >= 0 ? json_string(t->nics[p->nic].name) : json_null(), "nvme", nvme,
                       "dirs", dirs));
  }
  json_t *warns = json_array();
  for (int i = 0; i < a->n_warnings; i++) {
    const struct tz_topo_warning *w = &a->warnings[i];
    json_array_append_new(warns, json_pack("{s:s, s:o, s:s}", "code", w->code, "gpu",
                                           jint_or_null(w->gpu), "message", w->message));
  }
  json_t *memlock = a->memlock_bytes == TZ_TOPO_UNLIMITED ? json_string("unlimited")
                    : a->memlock_bytes >= 0               ? json_integer(a->memlock_bytes)
                                                          : json_null();
  json_t *facts =
      json_pack("{s:o, s:o, s:o}", "memlock_bytes", memlock, "cap_ipc_lock",
                jbool_or_null(a->cap_ipc_lock == TZ_TOPO_FACT_LIVE ? -1 : a->cap_ipc_lock), "thp",
                jstr_or_null(a->thp));
  return json_pack("{s:o, s:o, s:o}", "facts", facts, "placements", pls, "warnings", warns);
}

static json_t *json_measured(const struct tz_topo_measured *m) {
  json_t *arr = json_array();
  for (int i = 0; i < m->n; i++) {
    const struct tz_topo_bandwidth *b = &m->items[i];
    json_array_append_new(arr,
                          json_pack("{s:s, s:o, s:o, s:o, s:o, s:I, s:o, s:o}", "kind", b->kind,
                                    "gpu", jint_or_null(b->gpu), "dir", jstr_or_null(b->dir),
                                    "numa_node", jint_or_null(b->numa_node), "odirect",
                                    jbool_or_null(b->odirect), "bytes", (json_int_t)b->bytes,
                                    "gbps", b->gbps >= 0 ? json_real(b->gbps) : json_null(),
                                    "error", jstr_or_null(b->error)));
  }
  return arr;
}

int tz_topo_json(FILE *f, const tz_topo *t, const struct tz_topo_advice *a,
                 const struct tz_topo_measured *m) {
  json_t *root = json_object();
  if (!root)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for JSON");
  json_object_set_new(root, "schema", json_string("tierzero.topo"));
  json_object_set_new(root, "schema_version", json_integer(1));
  json_cpu_side(t, root);
  json_devices(t, root);
  json_matrix(t, root);
  json_object_set_new(root, "advice", a ? json_advice(t, a) : json_null());
  json_object_set_new(root, "measured", m ? json_measured(m) : json_null());
  /* json_pack returns NULL on a bad format or no memory, and a NULL value is not set: check that
   * every key arrived. */
  static const char *const keys[] = {"source", "machine",       "packages", "numa_nodes",
                                     "gpus",   "block_devices", "nics",     "matrix",
                                     "advice", "measured"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!json_object_get(root, keys[i])) {
      json_decref(root);
      return tz_err_set(TZ_ENOMEM, "topo: building the JSON report failed at \"%s\"", keys[i]);
    }
  int r = json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (r != 0 || fputc('\n', f) == EOF || fflush(f) != 0)
    return tz_err_errno(errno ? errno : EIO, "topo: writing the JSON report");
  return 0;
}
