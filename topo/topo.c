/* Loading a topology (hwloc), the lists behind the accessors, and the path-class matrix. */
#define _GNU_SOURCE
#include "topo/internal.h"

#include "core/error.h"
#include "core/log.h"

#include <errno.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void *topo_keep(tz_topo *t, void *p) {
  if (!p)
    return NULL;
  if (t->n_owned == t->cap_owned) {
    int cap = t->cap_owned ? 2 * t->cap_owned : 64;
    void **n = realloc(t->owned, (size_t)cap * sizeof *n);
    if (!n) {
      free(p);
      return NULL;
    }
    t->owned = n;
    t->cap_owned = cap;
  }
  t->owned[t->n_owned++] = p;
  return p;
}

const char *topo_strdup(tz_topo *t, const char *s) { return topo_keep(t, strdup(s ? s : "")); }

void tz_topo_load_params_init(struct tz_topo_load_params *p) {
  memset(p, 0, sizeof *p);
  p->use_nvml = 1;
}

void topo_bitmap_to_cpuset(hwloc_const_bitmap_t b, tz_cpuset *out) {
  tz_cpuset_zero(out);
  if (!b)
    return;
  int i;
  hwloc_bitmap_foreach_begin(i, b) { tz_cpuset_set(out, i); }
  hwloc_bitmap_foreach_end();
}

int topo_parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn) {
  char tail;
  if (sscanf(s, "%x:%x:%x.%x%c", dom, bus, dev, fn, &tail) != 4)
    return -1;
  return 0;
}

static void busid_of(hwloc_obj_t o, char out[16]) {
  snprintf(out, 16, "%04x:%02x:%02x.%01x", o->attr->pcidev.domain & 0xffffu, o->attr->pcidev.bus,
           o->attr->pcidev.dev, o->attr->pcidev.func & 0xfu);
}

/* Index of the package whose CPUs hold all of set, or -1. */
static int package_of_cpus(const tz_topo *t, const tz_cpuset *set) {
  if (tz_cpuset_empty(set))
    return -1;
  for (int i = 0; i < t->n_packages; i++)
    if (tz_cpuset_includes(&t->packages[i].cpus, set))
      return i;
  return -1;
}

void topo_locality(const tz_topo *t, hwloc_obj_t io, int *numa, int *package, tz_cpuset *cpus) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(t->hw, io);
  tz_cpuset set;
  topo_bitmap_to_cpuset(a ? a->cpuset : NULL, &set);
  if (cpus)
    *cpus = set;
  if (numa)
    *numa = a && a->nodeset && hwloc_bitmap_weight(a->nodeset) == 1 ? hwloc_bitmap_first(a->nodeset)
                                                                    : -1;
  if (package)
    *package = package_of_cpus(t, &set);
}

static uint64_t count_inside(hwloc_topology_t hw, hwloc_const_cpuset_t set, hwloc_obj_type_t type) {
  return set ? (uint64_t)hwloc_get_nbobjs_inside_cpuset_by_type(hw, set, type) : 0;
}

static int load_cpu_side(tz_topo *t) {
  hwloc_topology_t hw = t->hw;
  int np = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
  t->packages = topo_keep(t, calloc((size_t)(np > 0 ? np : 1), sizeof *t->packages));
  if (!t->packages)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for %d packages", np);
  for (int i = 0; i < np; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PACKAGE, (unsigned)i);
    struct tz_topo_package *p = &t->packages[i];
    p->os_index = o->os_index == HWLOC_UNKNOWN_INDEX ? i : (int)o->os_index;
    p->cpu_model = topo_strdup(t, hwloc_obj_get_info_by_name(o, "CPUModel"));
    topo_bitmap_to_cpuset(o->cpuset, &p->cpus);
    p->n_cores = (int)count_inside(hw, o->cpuset, HWLOC_OBJ_CORE);
    p->n_pus = (int)count_inside(hw, o->cpuset, HWLOC_OBJ_PU);
    p->n_l3 = (int)count_inside(hw, o->cpuset, HWLOC_OBJ_L3CACHE);
    for (int k = 0; k < p->n_l3; k++) {
      hwloc_obj_t c =
          hwloc_get_obj_inside_cpuset_by_type(hw, o->cpuset, HWLOC_OBJ_L3CACHE, (unsigned)k);
      if (c && c->attr->cache.size > p->l3_bytes)
        p->l3_bytes = c->attr->cache.size;
    }
  }
  t->n_packages = np;

  int nn = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
  t->numa = topo_keep(t, calloc((size_t)(nn > 0 ? nn : 1), sizeof *t->numa));
  if (!t->numa)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for %d NUMA nodes", nn);
  int libnuma = t->machine.live && numa_available() >= 0;
  for (int i = 0; i < nn; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
    struct tz_topo_numa *n = &t->numa[i];
    n->os_index = (int)o->os_index;
    n->total_bytes = o->attr->numanode.local_memory;
    n->free_bytes = -1;
    topo_bitmap_to_cpuset(o->cpuset, &n->cpus);
    n->n_cores = (int)count_inside(hw, o->cpuset, HWLOC_OBJ_CORE);
    n->n_pus = (int)count_inside(hw, o->cpuset, HWLOC_OBJ_PU);
    hwloc_obj_t pk = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_PACKAGE, o);
    n->package = pk ? (int)pk->logical_index : package_of_cpus(t, &n->cpus);
    if (libnuma) {
      long long free_b = 0;
      long long total = numa_node_size64(n->os_index, &free_b);
      if (total >= 0)
        n->free_bytes = free_b;
    }
    t->machine.memory_bytes += n->total_bytes;
  }
  t->n_numa = nn;
  t->machine.free_known = libnuma;

  t->machine.n_packages = np;
  t->machine.n_numa = nn;
  t->machine.n_cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
  t->machine.n_pus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
  t->machine.n_l3 = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_L3CACHE);
  for (int i = 0; i < t->machine.n_l3; i++) {
    hwloc_obj_t c = hwloc_get_obj_by_type(hw, HWLOC_OBJ_L3CACHE, (unsigned)i);
    if (c->attr->cache.size > t->machine.l3_bytes)
      t->machine.l3_bytes = c->attr->cache.size;
  }
  return 0;
}

static int is_nvidia_gpu(hwloc_obj_t o) {
  /* Any display class (VGA 0300, 3D 0302, ...): a GPU seen only on PCI, with no CUDA or NVML
   * object (a saved XML, a VM without the driver), is still a GPU. NVSwitches are 0680. */
  return o->attr->pcidev.vendor_id == 0x10de && (o->attr->pcidev.class_id >> 8) == 0x03;
}

static int cmp_busid(const void *a, const void *b) {
  hwloc_obj_t x = *(hwloc_obj_t const *)a, y = *(hwloc_obj_t const *)b;
  const struct hwloc_pcidev_attr_s *p = &x->attr->pcidev, *q = &y->attr->pcidev;
  if (p->domain != q->domain)
    return p->domain < q->domain ? -1 : 1;
  if (p->bus != q->bus)
    return p->bus < q->bus ? -1 : 1;
  if (p->dev != q->dev)
    return p->dev < q->dev ? -1 : 1;
  return (int)p->func - (int)q->func;
}

static void pcie_of(const tz_topo *t, hwloc_obj_t o, const char *busid, struct tz_topo_pcie *l) {
  memset(l, 0, sizeof *l);
  l->bandwidth_gbs = o ? o->attr->pcidev.linkspeed : 0;
  topo_sysfs_pcie(t, busid, l);
}

static int load_gpus(tz_topo *t) {
  int n = 0;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t->hw, NULL); o; o = hwloc_get_next_pcidev(t->hw, o))
    n += is_nvidia_gpu(o);
  t->gpus = topo_keep(t, calloc((size_t)n + 1, sizeof *t->gpus));
  t->gpu_obj = topo_keep(t, calloc((size_t)n + 1, sizeof *t->gpu_obj));
  if (!t->gpus || !t->gpu_obj)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for %d GPUs", n);
  n = 0;
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t->hw, NULL); o; o = hwloc_get_next_pcidev(t->hw, o))
    if (is_nvidia_gpu(o))
      t->gpu_obj[n++] = o;
  qsort(t->gpu_obj, (size_t)n, sizeof *t->gpu_obj, cmp_busid);
  for (int i = 0; i < n; i++) {
    hwloc_obj_t o = t->gpu_obj[i];
    struct tz_topo_gpu *g = &t->gpus[i];
    g->index = i;
    busid_of(o, g->busid);
    g->vendor_id = o->attr->pcidev.vendor_id;
    g->device_id = o->attr->pcidev.device_id;
    topo_locality(t, o, &g->numa_node, &g->package, &g->local_cpus);
    pcie_of(t, o, g->busid, &g->link);
    /* Names, best first: a CUDA or NVML object below it (NVML itself is asked later, live only),
     * hwloc's PCI name database, the PCI ids. */
    for (hwloc_obj_t c = o->io_first_child; c && !g->name; c = c->next_sibling) {
      const char *m =
          c->type == HWLOC_OBJ_OS_DEVICE ? hwloc_obj_get_info_by_name(c, "GPUModel") : NULL;
      if (m && *m) {
        g->name = topo_strdup(t, m);
        g->name_source = "hwloc";
      }
    }
    if (!g->name) {
      const char *dev = hwloc_obj_get_info_by_name(o, "PCIDevice");
      const char *ven = hwloc_obj_get_info_by_name(o, "PCIVendor");
      if (dev && *dev) {
        char buf[160];
        snprintf(buf, sizeof buf, "%s%s%s", ven ? ven : "", ven ? " " : "", dev);
        g->name = topo_strdup(t, buf);
        g->name_source = "pci-names";
      }
    }
    if (!g->name) {
      char buf[64];
      snprintf(buf, sizeof buf, "NVIDIA GPU [%04x:%04x]", g->vendor_id, g->device_id);
      g->name = topo_strdup(t, buf);
      g->name_source = "pci-ids";
    }
    if (!g->name)
      return tz_err_set(TZ_ENOMEM, "topo: no memory for GPU names");
  }
  t->n_gpus = n;
  return 0;
}

static const char *nic_kind(hwloc_obj_t pci, int rdma) {
  unsigned cls = pci->attr->pcidev.class_id;
  if (cls == 0x0207)
    return "infiniband";
  if (rdma)
    return "roce";
  if (cls == 0x0280)
    return "wifi";
  if ((cls >> 8) == 0x02)
    return "ethernet";
  return "other";
}

static int load_nics(tz_topo *t) {
  int cap = 0;
  for (hwloc_obj_t o = hwloc_get_next_osdev(t->hw, NULL); o; o = hwloc_get_next_osdev(t->hw, o))
    cap++;
  t->nics = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->nics));
  t->nic_obj = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->nic_obj));
  if (!t->nics || !t->nic_obj)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for %d network adapters", cap);
  /* One entry per PCI function: an InfiniBand HCA shows both an interface (ib0) and an RDMA device
   * (mlx5_0) below the same PCI object. */
  for (hwloc_obj_t o = hwloc_get_next_pcidev(t->hw, NULL); o; o = hwloc_get_next_pcidev(t->hw, o)) {
    const char *netdev = NULL, *rdma = NULL;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name)
        continue;
      if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK && !netdev)
        netdev = c->name;
      else if (c->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS && !rdma)
        rdma = c->name;
    }
    if (!netdev && !rdma)
      continue;
    struct tz_topo_nic *n = &t->nics[t->n_nics];
    t->nic_obj[t->n_nics++] = o;
    n->name = topo_strdup(t, rdma ? rdma : netdev);
    n->netdev = topo_strdup(t, netdev);
    n->kind = nic_kind(o, rdma != NULL);
    busid_of(o, n->busid);
    n->vendor_id = o->attr->pcidev.vendor_id;
    n->device_id = o->attr->pcidev.device_id;
    topo_locality(t, o, &n->numa_node, &n->package, NULL);
    pcie_of(t, o, n->busid, &n->link);
    if (!n->name || !n->netdev)
      return tz_err_set(TZ_ENOMEM, "topo: no memory for NIC names");
  }
  return 0;
}

const char *topo_disk_kind(const char *name, hwloc_obj_t pci) {
  if (!strncmp(name, "nvme", 4) || (pci && pci->attr->pcidev.class_id == 0x0108))
    return "nvme";
  if (!strncmp(name, "vd", 2))
    return "virtio";
  if (!strncmp(name, "sd", 2))
    return "sd";
  if (!strncmp(name, "mmcblk", 6))
    return "mmc";
  if (!strncmp(name, "md", 2))
    return "md";
  if (!strncmp(name, "dm-", 3))
    return "dm";
  return "other";
}

/* Block devices from the XML's OS devices, when there is no sysfs to read. */
static int load_xml_blockdevs(tz_topo *t) {
  int cap = 0;
  for (hwloc_obj_t o = hwloc_get_next_osdev(t->hw, NULL); o; o = hwloc_get_next_osdev(t->hw, o))
    cap += o->attr->osdev.type == HWLOC_OBJ_OSDEV_BLOCK;
  t->blockdevs = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->blockdevs));
  t->blockdev_obj = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->blockdev_obj));
  t->blockdev_devno = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->blockdev_devno));
  if (!t->blockdevs || !t->blockdev_obj || !t->blockdev_devno)
    return tz_err_set(TZ_ENOMEM, "topo: no memory for %d block devices", cap);
  for (hwloc_obj_t o = hwloc_get_next_osdev(t->hw, NULL); o; o = hwloc_get_next_osdev(t->hw, o)) {
    if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_BLOCK || !o->name)
      continue;
    int i = t->n_blockdevs++;
    struct tz_topo_blockdev *b = &t->blockdevs[i];
    hwloc_obj_t pci = o->parent && o->parent->type == HWLOC_OBJ_PCI_DEVICE ? o->parent : NULL;
    t->blockdev_obj[i] = pci;
    b->name = topo_strdup(t, o->name);
    b->kind = topo_disk_kind(o->name, pci);
    b->model = topo_strdup(t, hwloc_obj_get_info_by_name(o, "Model"));
    const char *size_kib = hwloc_obj_get_info_by_name(o, "Size");
    b->size_bytes = size_kib ? strtoull(size_kib, NULL, 10) * 1024 : 0;
    b->rotational = -1; /* hwloc does not record it */
    b->numa_node = b->package = -1;
    if (pci) {
      busid_of(pci, b->busid);
      topo_locality(t, pci, &b->numa_node, &b->package, NULL);
      b->link.bandwidth_gbs = pci->attr->pcidev.linkspeed;
    }
    const char *devno = hwloc_obj_get_info_by_name(o, "LinuxDeviceID");
    snprintf(t->blockdev_devno[i], sizeof t->blockdev_devno[i], "%s", devno ? devno : "");
    if (!b->name || !b->model)
      return tz_err_set(TZ_ENOMEM, "topo: no memory for block device names");
  }
  return 0;
}

static enum tz_topo_link pci_class(const tz_topo *t, hwloc_obj_t a, hwloc_obj_t b) {
  if (!a || !b)
    return TZ_TOPO_UNKNOWN;
  if (a == b)
    return TZ_TOPO_SELF;
  /* hwloc_get_common_ancestor_obj compares depths, which I/O objects do not have: walk parents. */
  hwloc_obj_t c = NULL;
  for (hwloc_obj_t p = b; p && !c; p = p->parent)
    for (hwloc_obj_t q = a; q && !c; q = q->parent)
      if (p == q)
        c = p;
  if (!c)
    return TZ_TOPO_UNKNOWN;
  if (c->type == HWLOC_OBJ_BRIDGE) {
    if (c->attr->bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST)
      return TZ_TOPO_PHB;
    /* Below a PCI bridge: one switch when each side reaches it through at most one bridge (its
     * downstream port), several switches otherwise. */
    int hops_a = 0, hops_b = 0;
    for (hwloc_obj_t p = a->parent; p && p != c; p = p->parent)
      hops_a += p->type == HWLOC_OBJ_BRIDGE;
    for (hwloc_obj_t p = b->parent; p && p != c; p = p->parent)
      hops_b += p->type == HWLOC_OBJ_BRIDGE;
    return hops_a <= 1 && hops_b <= 1 ? TZ_TOPO_PIX : TZ_TOPO_PXB;
  }
  if (c->type == HWLOC_OBJ_PCI_DEVICE || c->type == HWLOC_OBJ_OS_DEVICE)
    return TZ_TOPO_PIX;
  int na, nb;
  topo_locality(t, a, &na, NULL, NULL);
  topo_locality(t, b, &nb, NULL, NULL);
  return na >= 0 && na == nb ? TZ_TOPO_NODE : TZ_TOPO_SYS;
}

static int build_matrix(tz_topo *t) {
  int cap = t->n_gpus + t->n_nics + t->n_blockdevs;
  t->endpoints = topo_keep(t, calloc((size_t)cap + 1, sizeof *t->endpoints));
  hwloc_obj_t *objs = calloc((size_t)cap + 1, sizeof *objs);
  if (!t->endpoints || !objs) {
    free(objs);
    return tz_err_set(TZ_ENOMEM, "topo: no memory for the matrix");
  }
  int n = 0;
  for (int i = 0; i < t->n_gpus; i++) {
    char label[16];
    snprintf(label, sizeof label, "GPU%d", i);
    t->endpoints[n] = (struct tz_topo_endpoint){TZ_TOPO_KIND_GPU, i, topo_strdup(t, label)};
    objs[n++] = t->gpu_obj[i];
  }
  for (int i = 0; i < t->n_nics; i++) {
    t->endpoints[n] = (struct tz_topo_endpoint){TZ_TOPO_KIND_NIC, i, t->nics[i].name};
    objs[n++] = t->nic_obj[i];
  }
  for (int i = 0; i < t->n_blockdevs; i++) {
    if (!t->blockdev_obj[i])
      continue;
    t->endpoints[n] = (struct tz_topo_endpoint){TZ_TOPO_KIND_BLOCK, i, t->blockdevs[i].name};
    objs[n++] = t->blockdev_obj[i];
  }
  t->n_endpoints = n;
  t->pci_class = topo_keep(t, calloc((size_t)n * (size_t)n + 1, 1));
  if (!t->pci_class) {
    free(objs);
    return tz_err_set(TZ_ENOMEM, "topo: no memory for the matrix");
  }
  for (int i = 0; i < n; i++) {
    if (!t->endpoints[i].label) {
      free(objs);
      return tz_err_set(TZ_ENOMEM, "topo: no memory for the matrix");
    }
    for (int j = 0; j < n; j++)
      t->pci_class[i * n + j] =
          (unsigned char)(i == j ? TZ_TOPO_SELF : pci_class(t, objs[i], objs[j]));
  }
  free(objs);
  return 0;
}

static int check_path(const char *what, const char *path, int want_dir) {
  struct stat st;
  if (stat(path, &st) != 0)
    return tz_err_errno(errno, "topo: %s %s", what, path);
  if (want_dir && !S_ISDIR(st.st_mode))
    return tz_err_set(TZ_EINVAL, "topo: %s %s is not a directory", what, path);
  if (!want_dir && S_ISDIR(st.st_mode))
    return tz_err_set(TZ_EINVAL, "topo: %s %s is a directory, not a file", what, path);
  return 0;
}

static int load_hwloc(tz_topo *t, const char *xml) {
  if (hwloc_topology_init(&t->hw) != 0)
    return tz_err_errno(errno, "topo: hwloc_topology_init");
  /* An XML is kept as it was saved; live, hwloc keeps the PCI devices that matter (GPUs, NICs,
   * storage) and the bridges above them. Components that add nothing here stay off: OpenCL, GL,
   * Level Zero and RSMI find nothing tierzero uses (OpenCL can take seconds to start), and "pci"
   * only adds names from libpciaccess on Linux, where the linux component discovers the devices
   * itself; it also leaks on every load. */
  hwloc_topology_set_io_types_filter(t->hw, xml ? HWLOC_TYPE_FILTER_KEEP_ALL
                                                : HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  static const char *const off[] = {"opencl", "gl", "levelzero", "rsmi", "pci"};
  for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
    hwloc_topology_set_components(t->hw, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, off[i]);
  if (xml) {
    if (hwloc_topology_set_xml(t->hw, xml) != 0)
      return tz_err_set(TZ_EFORMAT,
                        "topo: %s is not an hwloc XML topology: hwloc could not parse it "
                        "(HWLOC_XML_VERBOSE=1 makes hwloc say why); save one with "
                        "`lstopo --of xml FILE`",
                        xml);
  }
  if (hwloc_topology_load(t->hw) != 0) {
    if (xml)
      return tz_err_set(TZ_EFORMAT,
                        "topo: %s is not an hwloc XML topology: hwloc parsed it but could not "
                        "load a machine from it (HWLOC_XML_VERBOSE=1 makes hwloc say why)",
                        xml);
    return tz_err_errno(errno, "topo: hwloc could not discover this machine");
  }
  if (hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PU) <= 0)
    return tz_err_set(TZ_EFORMAT, "topo: the topology in %s has no processing unit",
                      xml ? xml : "of this machine");
  return 0;
}

int tz_topo_load(const struct tz_topo_load_params *p, tz_topo **out) {
  struct tz_topo_load_params def;
  if (!p) {
    tz_topo_load_params_init(&def);
    p = &def;
  }
  if (!out)
    return tz_err_set(TZ_EINVAL, "topo: tz_topo_load needs an output pointer");
  *out = NULL;
  if (p->xml)
    TZ_CHECK(check_path("XML topology", p->xml, 0));
  if (p->sysfs_root)
    TZ_CHECK(check_path("sysfs root", p->sysfs_root, 1));
  if (p->mountinfo)
    TZ_CHECK(check_path("mountinfo file", p->mountinfo, 0));

  tz_topo *t = calloc(1, sizeof *t);
  if (!t)
    return tz_err_set(TZ_ENOMEM, "topo: no memory");
  int rc = 0;
  t->machine.live = p->xml == NULL;
  t->machine.xml_path = p->xml ? topo_strdup(t, p->xml) : NULL;
  if (p->sysfs_root || !p->xml) {
    t->sysfs_root = strdup(p->sysfs_root ? p->sysfs_root : "/");
    if (!t->sysfs_root) {
      rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
      goto fail;
    }
  }
  t->probe_live = t->machine.live && !p->mountinfo && !p->sysfs_root;

  TZ_CHECK_GOTO(load_hwloc(t, p->xml), rc, fail);
  hwloc_obj_t root = hwloc_get_root_obj(t->hw);
  t->machine.hostname = topo_strdup(t, hwloc_obj_get_info_by_name(root, "HostName"));
  t->machine.os_release = topo_strdup(t, hwloc_obj_get_info_by_name(root, "OSRelease"));
  t->machine.arch = topo_strdup(t, hwloc_obj_get_info_by_name(root, "Architecture"));
  /* The release of hwloc that discovered the machine (for an XML, the lstopo that saved it); the
   * API version is a fallback, as it lags the release (2.9 has API 2.8). */
  const char *hv = hwloc_obj_get_info_by_name(root, "hwlocVersion");
  char ver[32];
  unsigned v = hwloc_get_api_version();
  snprintf(ver, sizeof ver, "API %u.%u.%u", v >> 16, (v >> 8) & 0xff, v & 0xff);
  t->machine.hwloc_version = topo_strdup(t, hv && *hv ? hv : ver);
  t->machine.nvml = topo_strdup(t, p->xml        ? "not asked (the topology is from an XML file)"
                                   : p->use_nvml ? "not asked (no NVIDIA GPU)"
                                                 : "not asked (disabled)");
  if (!t->machine.hostname || !t->machine.os_release || !t->machine.arch ||
      !t->machine.hwloc_version || !t->machine.nvml) {
    rc = tz_err_set(TZ_ENOMEM, "topo: no memory");
    goto fail;
  }

  TZ_CHECK_GOTO(load_cpu_side(t), rc, fail);
  TZ_CHECK_GOTO(load_gpus(t), rc, fail);
  TZ_CHECK_GOTO(load_nics(t), rc, fail);
  if (t->sysfs_root)
    TZ_CHECK_GOTO(topo_sysfs_blockdevs(t), rc, fail);
  else
    TZ_CHECK_GOTO(load_xml_blockdevs(t), rc, fail);
  const char *mi = p->mountinfo ? p->mountinfo : t->machine.live ? "/proc/self/mountinfo" : NULL;
  if (mi)
    TZ_CHECK_GOTO(topo_read_mountinfo(t, mi), rc, fail);
  if (t->probe_live)
    topo_probe_odirect(t);
  if (t->machine.live && p->use_nvml && t->n_gpus > 0)
    topo_nvml(t);
  TZ_CHECK_GOTO(build_matrix(t), rc, fail);
  *out = t;
  return 0;
fail:
  tz_topo_destroy(t);
  return rc;
}

void tz_topo_destroy(tz_topo *t) {
  if (!t)
    return;
  if (t->hw)
    hwloc_topology_destroy(t->hw);
  for (int i = 0; i < t->n_owned; i++)
    free(t->owned[i]);
  free(t->owned);
  free(t->nvlinks);
  free(t->sysfs_root);
  free(t);
}

const struct tz_topo_machine *tz_topo_machine(const tz_topo *t) { return &t->machine; }
const struct tz_topo_package *tz_topo_package(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_packages ? &t->packages[i] : NULL;
}
int tz_topo_numa_count(const tz_topo *t) { return t->n_numa; }
const struct tz_topo_numa *tz_topo_numa(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_numa ? &t->numa[i] : NULL;
}
const struct tz_topo_numa *tz_topo_numa_by_os(const tz_topo *t, int os_index) {
  for (int i = 0; i < t->n_numa; i++)
    if (t->numa[i].os_index == os_index)
      return &t->numa[i];
  return NULL;
}
int tz_topo_gpu_count(const tz_topo *t) { return t->n_gpus; }
const struct tz_topo_gpu *tz_topo_gpu(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_gpus ? &t->gpus[i] : NULL;
}
int tz_topo_blockdev_count(const tz_topo *t) { return t->n_blockdevs; }
const struct tz_topo_blockdev *tz_topo_blockdev(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_blockdevs ? &t->blockdevs[i] : NULL;
}
int tz_topo_blockdev_find(const tz_topo *t, const char *name) {
  for (int i = 0; i < t->n_blockdevs; i++)
    if (strcmp(t->blockdevs[i].name, name) == 0)
      return i;
  return -1;
}
int tz_topo_nic_count(const tz_topo *t) { return t->n_nics; }
const struct tz_topo_nic *tz_topo_nic(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_nics ? &t->nics[i] : NULL;
}
const struct tz_topo_mount *tz_topo_mount(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_mounts ? &t->mounts[i] : NULL;
}

/* The canonical form of path on this machine: realpath of its longest existing prefix (a swap dir
 * need not exist yet) with the rest appended; relative paths are taken from the working directory.
 * NULL when nothing resolves or memory runs out. */
static char *resolve_live(const char *path) {
  char *abs = NULL;
  if (path[0] == '/') {
    abs = strdup(path);
  } else {
    char *cwd = getcwd(NULL, 0);
    if (cwd && asprintf(&abs, "%s/%s", cwd, path) < 0)
      abs = NULL;
    free(cwd);
  }
  if (!abs)
    return NULL;
  for (char *cut = abs + strlen(abs); cut > abs;) {
    char saved = *cut;
    *cut = '\0';
    char *real = realpath(abs, NULL);
    *cut = saved;
    if (real) {
      char *out = NULL;
      if (asprintf(&out, "%s%s", strcmp(real, "/") == 0 && *cut == '/' ? "" : real, cut) < 0)
        out = NULL;
      free(real);
      free(abs);
      return out;
    }
    while (cut > abs && *--cut != '/')
      ;
  }
  free(abs);
  return NULL;
}

int tz_topo_mount_for_path(const tz_topo *t, const char *path) {
  char *real = t->probe_live ? resolve_live(path) : NULL;
  const char *p = real ? real : path;
  int best = -1;
  size_t best_len = 0;
  for (int i = 0; i < t->n_mounts; i++) {
    const char *m = t->mounts[i].path;
    size_t n = strlen(m);
    int under =
        strcmp(m, "/") == 0 ? p[0] == '/' : strncmp(p, m, n) == 0 && (p[n] == '\0' || p[n] == '/');
    /* The later of two mounts on the same point hides the earlier, so >= keeps the last. */
    if (under && (best < 0 || n >= best_len)) {
      best = i;
      best_len = n;
    }
  }
  free(real);
  return best;
}

const char *tz_topo_link_name(enum tz_topo_link l) {
  static const char *const names[] = {"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?"};
  return (unsigned)l <= TZ_TOPO_UNKNOWN ? names[l] : "?";
}

int tz_topo_endpoint_count(const tz_topo *t) { return t->n_endpoints; }
const struct tz_topo_endpoint *tz_topo_endpoint(const tz_topo *t, int i) {
  return i >= 0 && i < t->n_endpoints ? &t->endpoints[i] : NULL;
}
int tz_topo_endpoint_find(const tz_topo *t, enum tz_topo_kind kind, int index) {
  for (int i = 0; i < t->n_endpoints; i++)
    if (t->endpoints[i].kind == kind && t->endpoints[i].index == index)
      return i;
  return -1;
}

enum tz_topo_link tz_topo_pci_link(const tz_topo *t, int i, int j) {
  if (i < 0 || j < 0 || i >= t->n_endpoints || j >= t->n_endpoints)
    return TZ_TOPO_UNKNOWN;
  return (enum tz_topo_link)t->pci_class[i * t->n_endpoints + j];
}

enum tz_topo_link tz_topo_link(const tz_topo *t, int i, int j, int *nvlinks) {
  if (nvlinks)
    *nvlinks = 0;
  enum tz_topo_link l = tz_topo_pci_link(t, i, j);
  if (l == TZ_TOPO_SELF || l == TZ_TOPO_UNKNOWN || !t->nvlinks)
    return l;
  const struct tz_topo_endpoint *a = &t->endpoints[i], *b = &t->endpoints[j];
  if (a->kind != TZ_TOPO_KIND_GPU || b->kind != TZ_TOPO_KIND_GPU)
    return l;
  int nv = t->nvlinks[a->index * t->n_gpus + b->index];
  if (nv <= 0)
    return l;
  if (nvlinks)
    *nvlinks = nv;
  return TZ_TOPO_NVLINK;
}
