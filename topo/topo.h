/* Hardware topology and placement advice (docs/tz-topo.md).
 *
 * tz_topo_load reads a machine: this one (hwloc's live discovery, sysfs, /proc/self/mountinfo,
 * libnuma, and NVML when the driver's libnvidia-ml.so.1 can be opened), or one saved with
 * `lstopo --of xml` elsewhere. The result lists packages, NUMA nodes, GPUs, block devices with
 * their mounts and network adapters, each with its PCI bus id and NUMA locality, and the class of
 * the path between every pair of GPUs, NICs and disks (as `nvidia-smi topo -m` prints it).
 *
 * tz_topo_advise turns that into placement: for each GPU, the NUMA node for its pinned buffers, the
 * CPUs for its I/O and optimizer threads (disjoint from every other GPU's), the core kept for its
 * progress engine, the NVMe directories nearest to it, and warnings where the machine costs
 * bandwidth. It is a pure function of the topology and the few facts in its parameters, so the
 * fixtures in tests/data/topo test it.
 *
 * Indices: GPUs are numbered in PCI bus order, which is NVML's order and CUDA's under
 * CUDA_DEVICE_ORDER=PCI_BUS_ID. NUMA nodes and CPUs are OS indices (numactl's numbers). */
#ifndef TZ_TOPO_H
#define TZ_TOPO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/cpuset.h"

typedef struct tz_topo tz_topo;

#define TZ_TOPO_MAX_NODES 64 /* NUMA nodes the binding read-back reports */

/* ---- loading --------------------------------------------------------------------------------- */

struct tz_topo_load_params {
  const char *xml;        /* hwloc XML of a machine; NULL: this machine */
  const char *sysfs_root; /* a directory laid out like / (sys/block, sys/bus/pci/devices) that
                             block devices and PCIe links are read from; NULL: "/" for this machine,
                             none for an XML (block devices then come from the XML) */
  const char *mountinfo;  /* a file in /proc/self/mountinfo's format; NULL: this process's for this
                             machine, none for an XML */
  int use_nvml;           /* 1 (default): on this machine, ask NVML for GPU names and NVLinks */
};
void tz_topo_load_params_init(struct tz_topo_load_params *p);

/* p NULL loads this machine with the defaults. The caller owns *out (tz_topo_destroy).
 * Errors: TZ_ENOENT (the XML, the sysfs root or the mountinfo file does not exist; the message
 * names it), TZ_EFORMAT (the XML does not load as an hwloc topology), TZ_ENOMEM, TZ_EIO. */
int tz_topo_load(const struct tz_topo_load_params *p, tz_topo **out);
void tz_topo_destroy(tz_topo *t); /* NULL is a no-op */

/* ---- what was found (pointers stay valid until tz_topo_destroy) ------------------------------ */

struct tz_topo_pcie {
  double bandwidth_gbs; /* hwloc's link bandwidth in GB/s; 0 unknown */
  int gen, width;       /* current link from sysfs (5 = 32 GT/s, 16 lanes); 0 unknown */
  int max_gen, max_width;
};

struct tz_topo_machine {
  int live;             /* 1: this machine; 0: described by an XML file */
  const char *xml_path; /* NULL when live */
  const char *hostname; /* "" when the XML does not say */
  const char *os_release;
  const char *arch;
  const char *hwloc_version; /* hwloc release that discovered it (an XML: the one that saved it) */
  const char *nvml;          /* "driver 550.54.15", or why NVML was not used */
  int n_packages, n_numa, n_cores, n_pus;
  int n_l3;
  uint64_t l3_bytes;     /* one L3 (the largest) */
  uint64_t memory_bytes; /* all NUMA nodes */
  int free_known;        /* 1 when tz_topo_numa.free_bytes is a live figure (libnuma) */
};

struct tz_topo_package {
  int os_index;
  const char *cpu_model; /* "" unknown */
  tz_cpuset cpus;
  int n_cores, n_pus, n_l3;
  uint64_t l3_bytes;
};

struct tz_topo_numa {
  int os_index;
  int package; /* index into the package list; -1 none */
  uint64_t total_bytes;
  int64_t free_bytes; /* -1 unknown (an XML describes no live figure) */
  tz_cpuset cpus;     /* empty for a memory-only node */
  int n_cores, n_pus;
};

struct tz_topo_gpu {
  int index;
  const char *name;        /* "NVIDIA H100 80GB HBM3", or "NVIDIA GPU [10de:2330]" */
  const char *name_source; /* "nvml", "hwloc" (a CUDA or NVML object in the topology), "pci-names"
                              (hwloc's PCI name database), "pci-ids" */
  char busid[16];          /* "0000:1b:00.0" */
  uint16_t vendor_id, device_id;
  struct tz_topo_pcie link;
  int numa_node;        /* OS index; -1 when the locality spans several nodes or is unknown */
  int package;          /* index into the package list; -1 */
  tz_cpuset local_cpus; /* CPUs of its locality (hwloc's non-I/O ancestor) */
};

struct tz_topo_mount {
  const char *path, *fstype, *source;
  unsigned major, minor; /* st_dev of the filesystem */
  int read_only;
  int blockdev; /* index into the block device list; -1 for tmpfs, network, pseudo */
  int odirect;  /* 1 O_DIRECT works there, 0 it does not, -1 unknown (not probed:
                   an XML, a read-only or unwritable mount) */
};

struct tz_topo_blockdev {
  const char *name;    /* "nvme0n1" */
  const char *kind;    /* "nvme", "sd", "virtio", "mmc", "md", "dm", "other" */
  const char *model;   /* "" unknown */
  uint64_t size_bytes; /* 0 unknown */
  int rotational;      /* 1 spinning, 0 not, -1 unknown */
  char busid[16];      /* controller's PCI bus id; "" none (md, dm, not on PCI) */
  struct tz_topo_pcie link;
  int numa_node, package; /* -1 unknown or several */
  const int *members;     /* md/dm: block device indices it is built on */
  int n_members;
  const int *mounts; /* indices into the mount list */
  int n_mounts;
};

struct tz_topo_nic {
  const char *name;   /* the RDMA device ("mlx5_0") if any, else the interface */
  const char *netdev; /* the interface ("ibp26s0", "eth0"); "" none */
  const char *kind;   /* "infiniband", "roce", "ethernet", "wifi", "other" */
  char busid[16];
  uint16_t vendor_id, device_id;
  struct tz_topo_pcie link;
  int numa_node, package;
};

const struct tz_topo_machine *tz_topo_machine(const tz_topo *t);
/* i from 0 to machine.n_packages - 1; NULL out of range. */
const struct tz_topo_package *tz_topo_package(const tz_topo *t, int i);
int tz_topo_numa_count(const tz_topo *t);
const struct tz_topo_numa *tz_topo_numa(const tz_topo *t, int i);
/* The node with this OS index, or NULL. */
const struct tz_topo_numa *tz_topo_numa_by_os(const tz_topo *t, int os_index);
int tz_topo_gpu_count(const tz_topo *t);
const struct tz_topo_gpu *tz_topo_gpu(const tz_topo *t, int i);
int tz_topo_blockdev_count(const tz_topo *t);
const struct tz_topo_blockdev *tz_topo_blockdev(const tz_topo *t, int i);
/* The block device named name ("nvme0n1"), its index, or -1. */
int tz_topo_blockdev_find(const tz_topo *t, const char *name);
int tz_topo_nic_count(const tz_topo *t);
const struct tz_topo_nic *tz_topo_nic(const tz_topo *t, int i);
/* Indices come from a block device's mounts or tz_topo_mount_for_path; NULL out of range. */
const struct tz_topo_mount *tz_topo_mount(const tz_topo *t, int i);
/* The mount holding path (the longest mount point that is a prefix of it, after realpath on this
 * machine), its index, or -1. */
int tz_topo_mount_for_path(const tz_topo *t, const char *path);

/* ---- the matrix ------------------------------------------------------------------------------ */

/* Path classes, nearest first (nvidia-smi's legend). */
enum tz_topo_link {
  TZ_TOPO_SELF,   /* X */
  TZ_TOPO_NVLINK, /* NV#: # NVLinks, direct or through NVSwitches (GPU pairs, from NVML) */
  TZ_TOPO_PIX,    /* at most one PCIe switch */
  TZ_TOPO_PXB,    /* several PCIe switches, no host bridge */
  TZ_TOPO_PHB,    /* a PCIe host bridge */
  TZ_TOPO_NODE,   /* host bridges within one NUMA node */
  TZ_TOPO_SYS,    /* the link between NUMA nodes (UPI, Infinity Fabric) */
  TZ_TOPO_UNKNOWN /* a device hwloc does not place */
};
/* "X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS", "?" */
const char *tz_topo_link_name(enum tz_topo_link l);

enum tz_topo_kind { TZ_TOPO_KIND_GPU, TZ_TOPO_KIND_NIC, TZ_TOPO_KIND_BLOCK };
struct tz_topo_endpoint {
  enum tz_topo_kind kind;
  int index;         /* into the GPU, NIC or block device list */
  const char *label; /* "GPU0", "mlx5_0", "nvme0n1" */
};
/* The matrix's rows: GPUs, then NICs, then block devices on PCI. */
int tz_topo_endpoint_count(const tz_topo *t);
const struct tz_topo_endpoint *tz_topo_endpoint(const tz_topo *t, int i);
int tz_topo_endpoint_find(const tz_topo *t, enum tz_topo_kind kind, int index); /* or -1 */
/* Class of the path between endpoints i and j. NVLink wins over PCIe where both exist; *nvlinks
 * (may be NULL) gets the link count for TZ_TOPO_NVLINK, else 0. */
enum tz_topo_link tz_topo_link(const tz_topo *t, int i, int j, int *nvlinks);
/* The PCIe class alone, whatever NVLink there is. */
enum tz_topo_link tz_topo_pci_link(const tz_topo *t, int i, int j);

/* ---- advice ---------------------------------------------------------------------------------- */

#define TZ_TOPO_FACT_LIVE (-2) /* read the fact on this machine; unknown for an XML */
#define TZ_TOPO_UNLIMITED (-1)
#define TZ_TOPO_MAX_SWAP_DIRS 16

struct tz_topo_advice_params {
  uint64_t pinned_pool_bytes; /* pinned host bytes the run will lock; 0 skips the MEMLOCK check */
  const char *swap_dirs[TZ_TOPO_MAX_SWAP_DIRS]; /* the nvme tier's directories (DeepSpeed's
                                                   nvme_path); none: advise NVMe mounts */
  int n_swap_dirs;
  int64_t memlock_bytes; /* RLIMIT_MEMLOCK: bytes, TZ_TOPO_UNLIMITED, or TZ_TOPO_FACT_LIVE */
  int cap_ipc_lock;      /* 1: the process holds CAP_IPC_LOCK, which lifts the limit; 0 not;
                            TZ_TOPO_FACT_LIVE (default) */
  const char *thp;       /* "always", "madvise", "never", or NULL for TZ_TOPO_FACT_LIVE */
  int progress_cores;    /* cores per GPU kept for its progress engine; default 1 */
};
void tz_topo_advice_params_init(struct tz_topo_advice_params *p);

/* Where one rank's work goes: one per GPU, or a single one with gpu -1 on a machine without. */
struct tz_topo_placement {
  int gpu;                 /* -1: CPU-only */
  int numa_node;           /* for its pinned buffers (OS index; -1 unknown) */
  tz_cpuset cpus;          /* its I/O and optimizer threads; disjoint from every other GPU's */
  tz_cpuset progress_cpus; /* the core kept for its progress engine (all its hardware threads) */
  int n_cores;             /* cores in cpus */
  int nic;                 /* nearest NIC, or -1 */
  const int *nvme;         /* block devices local to it, nearest first */
  int n_nvme;
  const char *const *dirs; /* directories for its nvme tier, nearest first */
  int n_dirs;
};

struct tz_topo_warning {
  const char *code; /* stable: "gpu_nvme_remote", "memlock_low", "thp_disabled", ... */
  int gpu;          /* the GPU it is about, or -1 */
  const char *message;
};

struct tz_topo_advice {
  struct tz_topo_placement *placements;
  int n_placements;
  struct tz_topo_warning *warnings;
  int n_warnings;
  int64_t memlock_bytes; /* the facts used: bytes, TZ_TOPO_UNLIMITED, or TZ_TOPO_FACT_LIVE when
                            unknown */
  int cap_ipc_lock;      /* 1, 0, or TZ_TOPO_FACT_LIVE when unknown */
  const char *thp;       /* NULL unknown */
};

/* The caller owns *out (tz_topo_advice_destroy). Errors: TZ_EINVAL (bad params), TZ_ENOMEM. */
int tz_topo_advise(const tz_topo *t, const struct tz_topo_advice_params *p,
                   struct tz_topo_advice **out);
void tz_topo_advice_destroy(struct tz_topo_advice *a); /* NULL is a no-op */
/* The placement for GPU gpu (-1: the CPU-only one), or NULL. */
const struct tz_topo_placement *tz_topo_advice_for_gpu(const struct tz_topo_advice *a, int gpu);
/* The first warning with this code (and this gpu unless gpu is -2), or NULL. */
const struct tz_topo_warning *tz_topo_advice_warning(const struct tz_topo_advice *a,
                                                     const char *code, int gpu);

/* ---- binding, read back from the kernel ------------------------------------------------------ */

/* Binds the calling thread to cpus. This machine only: TZ_ENOTSUP for an XML topology. TZ_EINVAL
 * for an empty set; TZ_EIO (with the errno) when the kernel refuses. */
int tz_topo_bind_thread(tz_topo *t, const tz_cpuset *cpus);

struct tz_topo_binding {
  tz_cpuset cpus;        /* hwloc_get_cpubind of the calling thread */
  int last_cpu;          /* where it last ran; -1 unknown */
  const char *mempolicy; /* "default", "bind", "interleave", "firsttouch", "nexttouch", "mixed" */
  tz_cpuset mem_nodes;   /* the nodes of that policy (node OS indices) */
  uint64_t node_bytes[TZ_TOPO_MAX_NODES]; /* resident bytes per node, /proc/self/numa_maps */
  int max_node;                           /* highest node with bytes, -1 none */
};
int tz_topo_binding_readback(tz_topo *t, struct tz_topo_binding *out);
/* "cpus 0-3 (last ran on 2), memory policy default, resident: node0 12.3 MiB" */
int tz_topo_binding_format(const struct tz_topo_binding *b, char *buf, size_t len);
/* The node holding every page of [addr, addr+len) that is resident, in *node; -1 when the pages
 * are on several nodes or none is resident. This machine only. */
int tz_topo_area_node(tz_topo *t, const void *addr, size_t len, int *node);

/* ---- measured bandwidth ---------------------------------------------------------------------- */

struct tz_topo_measure_params {
  uint64_t bytes;  /* per path and direction; default 256 MiB (rounded down to blocks) */
  uint64_t block;  /* bytes per operation; default 1 MiB */
  int queue_depth; /* operations in flight; default 32 */
  const char *dirs[TZ_TOPO_MAX_SWAP_DIRS]; /* NVMe directories; none: every dir the advice names */
  int n_dirs;
  int gpus; /* 1 (default): pinned H2D and D2H per GPU as well */
};
void tz_topo_measure_params_init(struct tz_topo_measure_params *p);

struct tz_topo_bandwidth {
  const char *kind;  /* "nvme_write", "nvme_read" (O_DIRECT), "h2d", "d2h" (pinned) */
  int gpu;           /* h2d, d2h: the GPU; else -1 */
  const char *dir;   /* nvme_*: the directory; else NULL */
  int numa_node;     /* where the host buffer lived; -1 unknown */
  int odirect;       /* nvme_*: 1 O_DIRECT opens there, 0 the tier fell back to buffered
                        I/O, -1 unknown; else -1 */
  uint64_t bytes;    /* moved in the timed pass */
  double gbps;       /* 1e9 bytes per second; -1 not measured */
  const char *error; /* why not measured, or NULL */
};

struct tz_topo_measured {
  struct tz_topo_bandwidth *items;
  int n;
};

/* Measures each path through the tier backends (nvme, host, hbm), with host buffers on the node
 * the advice gives. This machine only (TZ_ENOTSUP for an XML). A path that cannot be measured (no
 * GPU tier in this build, a full disk) is listed with its error rather than failing the call.
 * Each NVMe directory gets a file of p->bytes for the duration. The caller owns *out. */
int tz_topo_measure(tz_topo *t, const struct tz_topo_advice *a,
                    const struct tz_topo_measure_params *p, struct tz_topo_measured **out);
void tz_topo_measured_destroy(struct tz_topo_measured *m); /* NULL is a no-op */

/* ---- output ---------------------------------------------------------------------------------- */

/* The tree, the matrix and, when a (m) is not NULL, the advice (the measurements), as tz-topo
 * prints them. */
int tz_topo_print(FILE *f, const tz_topo *t, const struct tz_topo_advice *a,
                  const struct tz_topo_measured *m);
/* One JSON object (schema in docs/tz-topo.md); advice (measured) is null when a (m) is NULL. */
int tz_topo_json(FILE *f, const tz_topo *t, const struct tz_topo_advice *a,
                 const struct tz_topo_measured *m);

#endif
