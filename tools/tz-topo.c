/* tz-topo: the hardware topology report and placement advice (docs/tz-topo.md). */
#define _GNU_SOURCE
#include "core/error.h"
#include "topo/topo.h"
#include "util/size.h"
#include "tz_version.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: tz-topo [options]\n"
          "Reports GPUs, NUMA nodes, disks and NICs with their PCIe paths, and where tierzero\n"
          "would put each GPU's pinned buffers, threads and NVMe files.\n\n"
          "  --json               one JSON object (schema in docs/tz-topo.md) instead of text\n"
          "  --xml FILE           a topology saved with `lstopo --of xml FILE` on another machine\n"
          "  --sysfs DIR          read block devices and PCIe links below DIR instead of /\n"
          "  --mountinfo FILE     mounts from FILE (a saved /proc/self/mountinfo)\n"
          "  --swap-dir DIR       a directory the nvme tier would use (repeatable, up to %d)\n"
          "  --pinned-pool SIZE   pinned host memory the run will lock (e.g. 64G), for the\n"
          "                       RLIMIT_MEMLOCK check\n"
          "  --memlock SIZE       assume this RLIMIT_MEMLOCK ('unlimited' allowed) and no\n"
          "                       CAP_IPC_LOCK\n"
          "  --thp MODE           assume transparent hugepages are always|madvise|never\n"
          "  --progress-cores N   cores per GPU kept for its progress engine (default 1)\n"
          "  --no-nvml            do not ask NVML for GPU names and NVLinks\n"
          "  --bind GPU           bind this process's thread as the advice says for GPU (-1: the\n"
          "                       CPU-only placement) and print the binding read back\n"
          "  --measure            measure each path through the tier backends: O_DIRECT write\n"
          "                       and read per NVMe directory (the --swap-dir ones, else those\n"
          "                       advised), pinned H2D and D2H per GPU\n"
          "  --measure-size SIZE  bytes per path and direction (default 256M)\n"
          "  --version            the version, the commit and the libraries compiled in\n"
          "  -h, --help\n",
          TZ_TOPO_MAX_SWAP_DIRS);
}

static int fail(int rc) {
  fprintf(stderr, "tz-topo: %s (%s)\n", tz_err_msg(), tz_strerror(rc));
  return 1;
}

int main(int argc, char **argv) {
  enum {
    OPT_XML = 256,
    OPT_SYSFS,
    OPT_MOUNTINFO,
    OPT_SWAP,
    OPT_POOL,
    OPT_MEMLOCK,
    OPT_THP,
    OPT_PROGRESS,
    OPT_NO_NVML,
    OPT_BIND,
    OPT_MEASURE,
    OPT_MEASURE_SIZE,
    OPT_JSON,
    OPT_VERSION
  };
  static const struct option opts[] = {
      {"json", no_argument, NULL, OPT_JSON},
      {"xml", required_argument, NULL, OPT_XML},
      {"sysfs", required_argument, NULL, OPT_SYSFS},
      {"mountinfo", required_argument, NULL, OPT_MOUNTINFO},
      {"swap-dir", required_argument, NULL, OPT_SWAP},
      {"pinned-pool", required_argument, NULL, OPT_POOL},
      {"memlock", required_argument, NULL, OPT_MEMLOCK},
      {"thp", required_argument, NULL, OPT_THP},
      {"progress-cores", required_argument, NULL, OPT_PROGRESS},
      {"no-nvml", no_argument, NULL, OPT_NO_NVML},
      {"bind", required_argument, NULL, OPT_BIND},
      {"measure", no_argument, NULL, OPT_MEASURE},
      {"measure-size", required_argument, NULL, OPT_MEASURE_SIZE},
      {"version", no_argument, NULL, OPT_VERSION},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  struct tz_topo_load_params lp;
  struct tz_topo_advice_params ap;
  struct tz_topo_measure_params mp;
  tz_topo_load_params_init(&lp);
  tz_topo_advice_params_init(&ap);
  tz_topo_measure_params_init(&mp);
  int json = 0, bind = 0, bind_gpu = 0, measure = 0;
  for (int c; (c = getopt_long(argc, argv, "h", opts, NULL)) != -1;) {
    uint64_t size;
    char *end;
    switch (c) {
    case OPT_JSON: json = 1; break;
    case OPT_XML: lp.xml = optarg; break;
    case OPT_SYSFS: lp.sysfs_root = optarg; break;
    case OPT_MOUNTINFO: lp.mountinfo = optarg; break;
    case OPT_NO_NVML: lp.use_nvml = 0; break;
    case OPT_SWAP:
      if (ap.n_swap_dirs == TZ_TOPO_MAX_SWAP_DIRS) {
        fprintf(stderr, "tz-topo: at most %d --swap-dir\n", TZ_TOPO_MAX_SWAP_DIRS);
        return 2;
      }
      ap.swap_dirs[ap.n_swap_dirs++] = optarg;
      break;
    case OPT_POOL:
      if (tz_size_parse(optarg, TZ_SIZE_REAL, &size) < 0) {
        fprintf(stderr, "tz-topo: --pinned-pool %s: not a size (e.g. 64G)\n", optarg);
        return 2;
      }
      ap.pinned_pool_bytes = size;
      break;
    case OPT_MEMLOCK:
      if (strcmp(optarg, "unlimited") == 0) {
        ap.memlock_bytes = TZ_TOPO_UNLIMITED;
      } else if (tz_size_parse(optarg, TZ_SIZE_REAL, &size) == 0) {
        ap.memlock_bytes = (int64_t)size;
      } else {
        fprintf(stderr, "tz-topo: --memlock %s: not a size or 'unlimited'\n", optarg);
        return 2;
      }
      ap.cap_ipc_lock = 0;
      break;
    case OPT_THP: ap.thp = optarg; break;
    case OPT_PROGRESS:
      ap.progress_cores = (int)strtol(optarg, &end, 10);
      if (end == optarg || *end || ap.progress_cores < 0) {
        fprintf(stderr, "tz-topo: --progress-cores %s: not a count\n", optarg);
        return 2;
      }
      break;
    case OPT_BIND:
      bind = 1;
      bind_gpu = (int)strtol(optarg, &end, 10);
      if (end == optarg || *end) {
        fprintf(stderr, "tz-topo: --bind %s: not a GPU index\n", optarg);
        return 2;
      }
      break;
    case OPT_MEASURE: measure = 1; break;
    case OPT_MEASURE_SIZE:
      if (tz_size_parse(optarg, TZ_SIZE_REAL, &size) < 0 || size == 0) {
        fprintf(stderr, "tz-topo: --measure-size %s: not a size (e.g. 256M)\n", optarg);
        return 2;
      }
      mp.bytes = size;
      break;
    case 'h': usage(stdout); return 0;
    case OPT_VERSION: tz_version_print(stdout, "tz-topo"); return 0;
    default: usage(stderr); return 2;
    }
  }
  /* This machine's directories must exist: their mount decides the advice (another machine's,
   * with its --mountinfo, need not be here). */
  for (int i = 0; !lp.mountinfo && i < ap.n_swap_dirs; i++) {
    struct stat st;
    const char *why = stat(ap.swap_dirs[i], &st) != 0 ? strerror(errno)
                      : !S_ISDIR(st.st_mode)          ? "not a directory"
                                                      : NULL;
    if (why) {
      fprintf(stderr,
              "tz-topo: --swap-dir %s: %s (another machine's directory needs its --mountinfo)\n",
              ap.swap_dirs[i], why);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "tz-topo: unexpected argument '%s'\n", argv[optind]);
    usage(stderr);
    return 2;
  }

  tz_topo *t = NULL;
  struct tz_topo_advice *a = NULL;
  struct tz_topo_measured *m = NULL;
  int rc = tz_topo_load(&lp, &t);
  if (rc < 0)
    return fail(rc);
  if ((rc = tz_topo_advise(t, &ap, &a)) < 0) {
    tz_topo_destroy(t);
    return fail(rc);
  }
  int status = 0;
  if (bind) {
    const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, bind_gpu);
    struct tz_topo_binding b;
    char text[1024];
    if (!pl) {
      fprintf(stderr, "tz-topo: --bind %d: no such placement (%d GPUs)\n", bind_gpu,
              tz_topo_gpu_count(t));
      status = 2;
    } else if ((rc = tz_topo_bind_thread(t, &pl->cpus)) < 0 ||
               (rc = tz_topo_binding_readback(t, &b)) < 0) {
      status = fail(rc);
    } else {
      tz_topo_binding_format(&b, text, sizeof text);
      if (bind_gpu >= 0)
        fprintf(json ? stderr : stdout, "Bound for GPU%d, read back: %s\n\n", bind_gpu, text);
      else
        fprintf(json ? stderr : stdout, "Bound for the CPU-only placement, read back: %s\n\n",
                text);
    }
  }
  if (status == 0 && measure) {
    for (int i = 0; i < ap.n_swap_dirs; i++)
      mp.dirs[mp.n_dirs++] = ap.swap_dirs[i];
    if ((rc = tz_topo_measure(t, a, &mp, &m)) < 0)
      status = fail(rc);
  }
  if (status == 0) {
    rc = json ? tz_topo_json(stdout, t, a, m) : tz_topo_print(stdout, t, a, m);
    if (rc < 0)
      status = fail(rc);
  }
  tz_topo_measured_destroy(m);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
  return status;
}
