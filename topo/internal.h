/* Private to the files of topo/: the topology behind the opaque tz_topo handle. */
#ifndef TZ_TOPO_INTERNAL_H
#define TZ_TOPO_INTERNAL_H

#include <hwloc.h>

#include "topo/topo.h"

#if HWLOC_API_VERSION < 0x00020100 || HWLOC_API_VERSION >= 0x00030000
#error "topo/ needs hwloc 2.1 to 2.x (the osdev types and filters of the 2.x API)"
#endif

struct tz_topo {
  hwloc_topology_t hw;
  struct tz_topo_machine machine;

  struct tz_topo_package *packages;
  int n_packages;
  struct tz_topo_numa *numa;
  int n_numa;
  struct tz_topo_gpu *gpus;
  hwloc_obj_t *gpu_obj; /* (n_gpus) their PCI objects */
  int n_gpus;
  struct tz_topo_blockdev *blockdevs;
  hwloc_obj_t *blockdev_obj;  /* (n_blockdevs) the controller's PCI object, or NULL */
  char (*blockdev_devno)[16]; /* (n_blockdevs) "259:0", "" unknown */
  int n_blockdevs;
  struct tz_topo_nic *nics;
  hwloc_obj_t *nic_obj; /* (n_nics) */
  int n_nics;
  struct tz_topo_mount *mounts;
  int n_mounts;

  struct tz_topo_endpoint *endpoints;
  int n_endpoints;
  unsigned char *pci_class; /* (n_endpoints, n_endpoints) enum tz_topo_link */
  int *nvlinks;             /* (n_gpus, n_gpus) NVLinks between GPU pairs; NULL without NVML */

  char *sysfs_root; /* NULL: no sysfs (an XML without one) */
  int probe_live;   /* 1: the mounts are this process's, so they may be probed */

  void **owned; /* strings and arrays freed with the topology */
  int n_owned, cap_owned;
};

/* Keeps p to be freed with t; returns p, or NULL (and frees p) when the list cannot grow. */
void *topo_keep(tz_topo *t, void *p);
/* A copy of s owned by t; "" for NULL; NULL only when out of memory. */
const char *topo_strdup(tz_topo *t, const char *s);

void topo_bitmap_to_cpuset(hwloc_const_bitmap_t b, tz_cpuset *out);
/* The NUMA node, package index and CPUs of an I/O object's locality. */
void topo_locality(const tz_topo *t, hwloc_obj_t io, int *numa, int *package, tz_cpuset *cpus);
/* Parses "DDDD:BB:DD.F" (hex); 0 on success. */
int topo_parse_busid(const char *s, unsigned *dom, unsigned *bus, unsigned *dev, unsigned *fn);

/* "nvme", "sd", "virtio", "mmc", "md", "dm", "other" from a block device's name and controller. */
const char *topo_disk_kind(const char *name, hwloc_obj_t pci);

/* linux.c: what sysfs and /proc say. */
int topo_sysfs_blockdevs(tz_topo *t);
int topo_read_mountinfo(tz_topo *t, const char *path);
void topo_probe_odirect(tz_topo *t);
void topo_sysfs_pcie(const tz_topo *t, const char *busid, struct tz_topo_pcie *link);
int topo_sysfs_numa_node(const tz_topo *t, const char *busid);
int64_t topo_live_memlock(void);
/* 1 when the process's effective capabilities include CAP_IPC_LOCK, 0 when not, -2 unknown. */
int topo_live_cap_ipc_lock(void);
/* "always", "madvise", "never", or NULL when the file is missing. Static strings. */
const char *topo_live_thp(void);

/* nvml.c: names and NVLinks of the GPUs from NVML, when it loads. Never fails: what it could
 * not learn stays as it was, and machine.nvml says why. */
void topo_nvml(tz_topo *t);

#endif
