/* What this machine can really give each tier, and the check of a plan against it (issue #27):
 * a plan that asks for more host memory, GPU memory or NVMe space than there is is refused before
 * anything is allocated, naming the tier and the shortfall, instead of being killed by the kernel
 * minutes later with nothing printed.
 *
 * The facts are read once (tz_machine_facts_read) and the check is a pure function of them
 * (tz_machine_check), so that tests give it made-up machines and never allocate this one's
 * memory. */
#ifndef TZ_TRAINER_MACHINE_H
#define TZ_TRAINER_MACHINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

#define TZ_MACHINE_UNKNOWN UINT64_MAX /* a limit that could not be read, or none */

struct tz_machine_facts {
  uint64_t mem_available;  /* /proc/meminfo MemAvailable: free plus reclaimable; UNKNOWN */
  uint64_t mem_total;      /* MemTotal; UNKNOWN */
  uint64_t cgroup_max;     /* the tightest cgroup memory limit from this process's cgroup up to
                              the root: v2 memory.max, v1 memory.limit_in_bytes; UNKNOWN: none
                              ("max", v1's "unlimited") or no cgroup to read */
  uint64_t cgroup_current; /* memory.current (v1 memory.usage_in_bytes) of that cgroup (0 when
                              unknown) */
  uint64_t memlock;        /* RLIMIT_MEMLOCK's soft limit; UNKNOWN: unlimited */
  int memlock_exempt;      /* the process may lock without limit (CAP_IPC_LOCK: root) */
  uint64_t nvme_free;      /* statvfs free bytes (f_bavail) of the smallest nvme directory;
                              UNKNOWN: none given or not readable */
  uint64_t device_free;    /* the compute backend's device memory free (tz_compute_device_memory);
                              UNKNOWN: no device */
  uint64_t device_total;
  uint64_t as_limit; /* RLIMIT_AS's soft limit (ulimit -v); 0: unlimited */
  uint64_t vm_size;  /* the process's address space now (/proc/self/status VmSize); 0: unknown */
  int cpus;          /* CPUs this process may run on (0: unknown): threads to leave room for */
};

/* The address space a CPU's threads take beside the plan's memory: OpenBLAS's per-thread buffer
 * (Debian's 0.3.21: a 128 MiB allocation it retries forever when refused, issue 48), stacks and
 * malloc arenas' reservations (64 MiB each). Measured with the release build on the 2-core VM: a
 * tiny run's address space was 1.12 GiB when the plan was checked, and under ulimit -v it hung
 * up to 1.6e6 KiB (1.53 GiB) and ran from 1.65e6, so a CPU took about 210 MiB; 256 leaves a
 * margin (runs between 1.53 and 1.62 GiB are refused, not hung). */
#define TZ_MACHINE_THREAD_VM (256ull << 20)

/* The first directory the nvme tier would use: tierzero.nvme_path's first, else an offload
 * section's nvme_path (optimizer, then parameters); NULL for none. */
const char *tz_machine_nvme_dir(const struct tz_config *c);

/* Fills f from this machine: /proc/meminfo, /proc/self/cgroup and /sys/fs/cgroup, getrlimit,
 * statvfs of each of the n_dirs nvme directories, and for backend "cuda" its device memory.
 * What cannot be read is TZ_MACHINE_UNKNOWN. */
void tz_machine_facts_read(const char *const *nvme_dirs, int n_dirs, const char *backend,
                           int device, struct tz_machine_facts *f);

/* The host memory this process can still take: with a cgroup limit, that limit less what the
 * cgroup holds (on some VMs MemTotal is far below the real limit until memory is touched, and the
 * cgroup's limit is the truth); else MemAvailable. TZ_MACHINE_UNKNOWN when neither is known.
 * how (optional): where the figure came from, for messages. */
uint64_t tz_machine_host_room(const struct tz_machine_facts *f, char *how, size_t len);

/* What a plan asks of the machine. */
struct tz_machine_need {
  int gpu;               /* the compute tier is the device's memory; else it is host memory */
  uint64_t compute;      /* the compute tier's capacity: homes, buffers and the window */
  uint64_t host;         /* other host memory: the host tier's homes, staging, io buffers */
  uint64_t pinned;       /* of host, what a GPU page-locks (RLIMIT_MEMLOCK) */
  uint64_t nvme_per_dir; /* nvme homes over the directories they are striped across */
  int ranks;             /* ranks sharing this machine's host memory (at least 1) */
  /* Budgets the user gave (tierzero.hbm_budget, host_budget, nvme_budget; 0: none): a tier whose
   * budget was given is not refused, only warned about (the user may know better, as on the VMs
   * whose MemTotal grows when touched). */
  uint64_t compute_budget, host_budget, nvme_budget;
};

/* 0 when the machine can give what n asks (warnings logged for budgets given beyond it, and for
 * pinned memory beyond RLIMIT_MEMLOCK, which only slows copies); TZ_ENOMEM naming the tier, what
 * it needs, what the machine has, the shortfall and what would work. */
int tz_machine_check(const struct tz_machine_need *n, const struct tz_machine_facts *f);

#endif
