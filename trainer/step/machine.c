/* What this machine can give each tier, and a plan's needs checked against it
 * (trainer/step/machine.h).
 */
#define _GNU_SOURCE
#include "trainer/step/machine.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/compute.h"
#include "util/size.h"

#include <inttypes.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* VmSize of /proc/self/status in bytes, 0 when it cannot be read. */
static uint64_t read_vm_size(void) {
  FILE *in = fopen("/proc/self/status", "r");
  if (!in)
    return 0;
  char line[256];
  unsigned long long kib = 0;
  while (fgets(line, sizeof line, in))
    if (sscanf(line, "VmSize: %llu kB", &kib) == 1)
      break;
  fclose(in);
  return (uint64_t)kib << 10;
}

static void read_meminfo(struct tz_machine_facts *f) {
  FILE *in = fopen("/proc/meminfo", "r");
  if (!in)
    return;
  char key[64];
  unsigned long long kib;
  while (fscanf(in, "%63s %llu kB", key, &kib) == 2) {
    if (strcmp(key, "MemAvailable:") == 0)
      f->mem_available = (uint64_t)kib << 10;
    else if (strcmp(key, "MemTotal:") == 0)
      f->mem_total = (uint64_t)kib << 10;
  }
  fclose(in);
}

/* A cgroup file holding one number or "max"; UNKNOWN for max or none. */
static uint64_t read_cgroup_value(const char *dir, const char *name) {
  char path[PATH_MAX + 64], text[64];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *in = fopen(path, "r");
  if (!in)
    return TZ_MACHINE_UNKNOWN;
  char *got = fgets(text, sizeof text, in);
  fclose(in);
  char *end = NULL;
  unsigned long long v = got ? strtoull(text, &end, 10) : 0;
  return got && end != text ? (uint64_t)v : TZ_MACHINE_UNKNOWN;
}

/* The tightest limit from the cgroup dir (under root) up to root: the file `max` (v2 memory.max,
 * v1 memory.limit_in_bytes, whose "unlimited" is a number near 2^63), with the `current` of the
 * cgroup that sets it. */
static void walk_cgroup(struct tz_machine_facts *f, const char *root, const char *rel,
                        const char *max_file, const char *cur_file) {
  char dir[2 * PATH_MAX];
  snprintf(dir, sizeof dir, "%s%s", root, strcmp(rel, "/") == 0 ? "" : rel);
  for (;;) {
    uint64_t max = read_cgroup_value(dir, max_file);
    if (max < (1ull << 62) && (f->cgroup_max == TZ_MACHINE_UNKNOWN || max < f->cgroup_max)) {
      f->cgroup_max = max;
      uint64_t cur = read_cgroup_value(dir, cur_file);
      f->cgroup_current = cur == TZ_MACHINE_UNKNOWN ? 0 : cur;
    }
    char *slash = strrchr(dir, '/');
    if (!slash || slash - dir < (ptrdiff_t)strlen(root))
      break;
    *slash = 0;
  }
}

/* The cgroup limits of this process: v2 (the "0::" line of /proc/self/cgroup, under
 * /sys/fs/cgroup) and v1's memory controller (the "memory:" line, under /sys/fs/cgroup/memory). A
 * path that does not exist below the mount (a container's namespace) is walked up to the
 * mount's root, which is then the container's own cgroup. */
static void read_cgroup(struct tz_machine_facts *f) {
  FILE *in = fopen("/proc/self/cgroup", "r");
  if (!in)
    return;
  char line[PATH_MAX], v2[PATH_MAX] = "", v1[PATH_MAX] = "";
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = 0;
    char *colon = strchr(line, ':');
    char *path = colon ? strchr(colon + 1, ':') : NULL;
    if (!path)
      continue;
    if (strncmp(line, "0::", 3) == 0)
      snprintf(v2, sizeof v2, "%s", path + 1);
    else if (strncmp(colon + 1, "memory:", 7) == 0)
      snprintf(v1, sizeof v1, "%s", path + 1);
  }
  fclose(in);
  if (v2[0])
    walk_cgroup(f, "/sys/fs/cgroup", v2, "memory.max", "memory.current");
  if (v1[0])
    walk_cgroup(f, "/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes", "memory.usage_in_bytes");
}

void tz_machine_facts_read(const char *const *nvme_dirs, int n_dirs, const char *backend,
                           int device, struct tz_machine_facts *f) {
  *f = (struct tz_machine_facts){.mem_available = TZ_MACHINE_UNKNOWN,
                                 .mem_total = TZ_MACHINE_UNKNOWN,
                                 .cgroup_max = TZ_MACHINE_UNKNOWN,
                                 .memlock = TZ_MACHINE_UNKNOWN,
                                 .nvme_free = TZ_MACHINE_UNKNOWN,
                                 .device_free = TZ_MACHINE_UNKNOWN,
                                 .device_total = TZ_MACHINE_UNKNOWN};
  read_meminfo(f);
  read_cgroup(f);
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    f->memlock = (uint64_t)rl.rlim_cur;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    f->as_limit = (uint64_t)rl.rlim_cur;
    f->vm_size = read_vm_size();
    cpu_set_t set;
    f->cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  }
  f->memlock_exempt = geteuid() == 0;
  for (int i = 0; i < n_dirs; i++) {
    struct statvfs vfs;
    if (nvme_dirs[i] && statvfs(nvme_dirs[i], &vfs) == 0) {
      uint64_t free_bytes = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
      if (f->nvme_free == TZ_MACHINE_UNKNOWN || free_bytes < f->nvme_free)
        f->nvme_free = free_bytes;
    }
  }
  uint64_t fr = 0, tot = 0;
  if (backend && strcmp(backend, "cpu") != 0 &&
      tz_compute_device_memory(backend, device, &fr, &tot) == 0) {
    f->device_free = fr;
    f->device_total = tot;
  }
}

static void fmt(char *buf, size_t len, uint64_t b) {
  tz_bytes_format(buf, len, (double)b, &tz_bytes_plan);
}

/* Under ulimit -v: the limit less the address space the process has and its threads' (cpus x
 * TZ_MACHINE_THREAD_VM), where that is less than room (said in how). */
static uint64_t address_room(const struct tz_machine_facts *f, uint64_t room, char *how,
                             size_t len) {
  if (!f->as_limit)
    return room;
  int cpus = f->cpus > 0 ? f->cpus : 1;
  uint64_t taken = f->vm_size + (uint64_t)cpus * TZ_MACHINE_THREAD_VM;
  uint64_t as_room = f->as_limit > taken ? f->as_limit - taken : 0;
  if (room != TZ_MACHINE_UNKNOWN && room <= as_room)
    return room;
  char a[32], b[32], c[32];
  fmt(a, sizeof a, f->as_limit);
  fmt(b, sizeof b, f->vm_size);
  fmt(c, sizeof c, TZ_MACHINE_THREAD_VM);
  if (how)
    snprintf(how, len,
             "ulimit -v (RLIMIT_AS) %s less the process's address space %s and %s for each of "
             "its %d CPUs' threads (OpenBLAS's buffer, stacks, malloc arenas), where an "
             "allocation refused would leave OpenBLAS retrying it for good",
             a, b, c, cpus);
  return as_room;
}

/* What memory (cgroup, else MemAvailable) gives, said in how. */
static uint64_t memory_room(const struct tz_machine_facts *f, char *how, size_t len) {
  char a[32], b[32];
  if (f->cgroup_max != TZ_MACHINE_UNKNOWN) {
    uint64_t room = f->cgroup_max > f->cgroup_current ? f->cgroup_max - f->cgroup_current : 0;
    fmt(a, sizeof a, f->cgroup_max);
    fmt(b, sizeof b, f->cgroup_current);
    if (how)
      snprintf(how, len, "the cgroup's memory.max %s less its memory.current %s", a, b);
    return room;
  }
  if (f->mem_available != TZ_MACHINE_UNKNOWN) {
    fmt(a, sizeof a, f->mem_total);
    if (how)
      snprintf(how, len, "MemAvailable in /proc/meminfo, of MemTotal %s; no cgroup memory limit",
               f->mem_total != TZ_MACHINE_UNKNOWN ? a : "unknown");
    return f->mem_available;
  }
  if (how)
    snprintf(how, len, "unknown");
  return TZ_MACHINE_UNKNOWN;
}

const char *tz_machine_nvme_dir(const struct tz_config *c) {
  if (c->tierzero.nvme_path.n > 0)
    return c->tierzero.nvme_path.path[0];
  if (c->zero_optimization.offload_optimizer.nvme_path)
    return c->zero_optimization.offload_optimizer.nvme_path;
  return c->zero_optimization.offload_param.nvme_path;
}

uint64_t tz_machine_host_room(const struct tz_machine_facts *f, char *how, size_t len) {
  uint64_t room = memory_room(f, how, len);
  return address_room(f, room, how, len);
}

/* need against have for one tier: 0, a warning (given), or the refusal. */
static int check_one(const char *tier, const char *parts, uint64_t need, uint64_t have,
                     const char *how, const char *given, const char *budget_key,
                     const char *would_work) {
  if (have == TZ_MACHINE_UNKNOWN || need <= have)
    return 0;
  char n[32], h[32], s[32];
  fmt(n, sizeof n, need);
  fmt(h, sizeof h, have);
  fmt(s, sizeof s, need - have);
  if (given) {
    TZ_WARN("train: %s needs %s (%s), %s more than this machine can give (%s: %s); going ahead "
            "since %s says so",
            tier, n, parts, s, h, how, given);
    return 0;
  }
  return tz_err_set(TZ_ENOMEM,
                    "train: the plan's %s needs %s (%s), %s more than this machine can give "
                    "(%s: %s); %s, or give %s to go ahead anyway",
                    tier, n, parts, s, h, how, would_work, budget_key);
}

/* "KEY SIZE" of the budgets given, or NULL for none. */
static const char *given_budgets(char *buf, size_t len, const char *k1, uint64_t v1, const char *k2,
                                 uint64_t v2) {
  char a[32], b[32];
  fmt(a, sizeof a, v1);
  fmt(b, sizeof b, v2);
  if (v1 && v2)
    snprintf(buf, len, "%s %s and %s %s", k1, a, k2, b);
  else if (v1 || v2)
    snprintf(buf, len, "%s %s", v1 ? k1 : k2, v1 ? a : b);
  return v1 || v2 ? buf : NULL;
}

int tz_machine_check(const struct tz_machine_need *n, const struct tz_machine_facts *f) {
  char given[160];
  int ranks = n->ranks > 0 ? n->ranks : 1;
  char how[256], parts[256], a[32], b[32], c[32];
  uint64_t room = tz_machine_host_room(f, how, sizeof how);
  if (room != TZ_MACHINE_UNKNOWN && ranks > 1) {
    size_t l = strlen(how);
    snprintf(how + l, sizeof how - l, ", shared by %d ranks", ranks);
    room /= (uint64_t)ranks;
  }
  static const char *const fewer =
      "a smaller model, micro-batch or sequence would fit, or state offloaded to nvme "
      "(zero_optimization.offload_optimizer.device nvme with tierzero.nvme_path, or "
      "--auto-placement)";
  if (n->gpu) {
    fmt(a, sizeof a, n->compute);
    snprintf(parts, sizeof parts, "homes, buffers and the scheduler's window");
    TZ_CHECK(check_one(
        "compute tier (GPU memory)", parts, n->compute, f->device_free, "free device memory",
        given_budgets(given, sizeof given, "tierzero.hbm_budget", n->compute_budget, NULL, 0),
        "tierzero.hbm_budget",
        "offloading more to host memory (offload_param.device cpu) would fit"));
    fmt(a, sizeof a, n->host);
    snprintf(parts, sizeof parts, "the host tier's homes, staging and io buffers");
    TZ_CHECK(check_one(
        "host memory", parts, n->host, room, how,
        given_budgets(given, sizeof given, "tierzero.host_budget", n->host_budget, NULL, 0),
        "tierzero.host_budget", fewer));
    if (n->pinned && !f->memlock_exempt && f->memlock != TZ_MACHINE_UNKNOWN &&
        n->pinned > f->memlock) {
      fmt(a, sizeof a, n->pinned);
      fmt(b, sizeof b, f->memlock);
      TZ_WARN("train: %s of host memory is to be page-locked for the GPU, beyond RLIMIT_MEMLOCK's "
              "%s: what cannot be locked is copied through the driver's staging, slower (raise "
              "it with `ulimit -l` or the container's memlock limit)",
              a, b);
    }
  } else {
    fmt(a, sizeof a, n->compute);
    fmt(b, sizeof b, n->host);
    snprintf(parts, sizeof parts,
             "the compute tier's %s, host memory on a CPU-only machine, and %s of host tier, "
             "staging and io buffers",
             a, b);
    TZ_CHECK(check_one("host memory", parts, n->compute + n->host, room, how,
                       given_budgets(given, sizeof given, "tierzero.hbm_budget", n->compute_budget,
                                     "tierzero.host_budget", n->host_budget),
                       "tierzero.hbm_budget or tierzero.host_budget", fewer));
  }
  fmt(c, sizeof c, n->nvme_per_dir);
  snprintf(parts, sizeof parts, "homes striped over the nvme directories, %s in each", c);
  return check_one(
      "nvme space", parts, n->nvme_per_dir, f->nvme_free,
      "free in the smallest "
      "nvme directory (statvfs)",
      given_budgets(given, sizeof given, "tierzero.nvme_budget", n->nvme_budget, NULL, 0),
      "tierzero.nvme_budget",
      "a directory with more free space (tierzero.nvme_path), or more of the state "
      "in host memory");
}
