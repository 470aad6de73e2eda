/* tz-bench prefetch: a synthetic client of the scheduler. L layers, one block each, live in a home
 * tier (host or nvme); a phase per layer "computes" for a set time on the compute lane (a timed
 * busy loop on a CPU lane, or with --lane gpu a spin kernel on a CUDA-stream lane whose compute
 * tier is the GPU's memory) and the scheduler streams the blocks in ahead of it within a budget of
 * a few layers. The bound it is compared with is the critical path
 * over the two lanes, from rates measured here first (the home tier's read rate with as many
 * blocks in flight as the window keeps; the compute lane's time per phase, run back to back):
 * max(L x compute, L x transfer) per step, plus one layer's transfer in the first step, which
 * nothing can hide. Later steps hide it behind the step before: the window crosses the boundary. */
#define _GNU_SOURCE
#include "bench/bench.h"
#include "core/error.h"
#include "core/lane.h"
#include "core/runtime.h"
#include "core/sched.h"
#include "core/tier.h"
#include "util/clock.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct opts {
  int layers, steps, lookahead, json;
  int checksum; /* nvme: -1 the tier's default (on), 0 off, 1 on */
  uint64_t block, budget;
  double compute_ms;
  const char *home, *path, *trace;
  const char *lane; /* "cpu" or "gpu"; NULL: gpu where one is present */
};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tz-bench prefetch [--layers L] [--block BYTES] [--compute-ms X] [--home host|nvme]\n"
      "                         [--path DIR] [--steps N] [--lookahead K] [--budget BYTES]\n"
      "                         [--checksum on|off] [--lane cpu|gpu] [--trace FILE] [--json]\n"
      "  L layers of one block each in the home tier; a phase per layer computes for X ms on\n"
      "  the compute lane while the scheduler brings the next layers in.\n"
      "  --layers L      layers (default 16)\n"
      "  --block BYTES   bytes per layer (default 8M)\n"
      "  --compute-ms X  compute time per phase (default 10)\n"
      "  --home KIND     host or nvme (default nvme; host with --lane gpu)\n"
      "  --path DIR      directory for the nvme file (default /var/tmp)\n"
      "  --steps N       steps; the first is the cold start (default 6)\n"
      "  --lookahead K   phases brought in ahead (default 2)\n"
      "  --budget BYTES  compute-tier budget (default: K+1 layers and one chunk)\n"
      "  --checksum X    nvme: verify a crc32c of every read on the progress engine (default on)\n"
      "  --lane KIND     cpu: a busy loop on a CPU lane, compute tier in host memory; gpu: a\n"
      "                  spin kernel on a CUDA stream, compute tier in GPU 0's memory, host\n"
      "                  home only (default gpu where a GPU is present)\n"
      "  --trace FILE    Chrome/Perfetto trace of the last step\n");
}

static int spin(void *arg) {
  double until = tz_now_s() + *(const double *)arg;
  while (tz_now_s() < until)
    ;
  return 0;
}

/* GB/s of home -> compute with `depth` blocks in flight, as the window keeps them. */
static double measure_rate(tz_runtime *rt, const tz_extent *homes, int n, tz_tier *compute,
                           uint64_t block, int depth) {
  tz_extent *buf = calloc((size_t)depth, sizeof *buf);
  tz_fence **f = calloc((size_t)depth, sizeof *f);
  double rate = -1;
  int ok = buf && f;
  for (int i = 0; ok && i < depth; i++)
    ok = tz_tier_alloc(compute, block, &buf[i]) == 0;
  if (ok) {
    int issued = 0, done = 0;
    int total = n < 4 * depth ? 4 * depth : n;
    double t0 = tz_now_s();
    while (done < total && ok) {
      while (issued < total && issued - done < depth) {
        int slot = issued % depth;
        if (tz_transfer(rt, &buf[slot], 0, &homes[issued % n], 0, block, &f[slot]) < 0) {
          ok = 0;
          break;
        }
        issued++;
      }
      if (!ok)
        break;
      int slot = done % depth;
      ok = tz_fence_wait(f[slot], -1) == 0;
      tz_fence_release(f[slot]);
      done++;
    }
    while (done < issued) {
      int slot = done++ % depth;
      tz_fence_wait(f[slot], -1);
      tz_fence_release(f[slot]);
    }
    if (ok)
      rate = (double)total * (double)block / (tz_now_s() - t0) / 1e9;
  }
  for (int i = 0; buf && i < depth; i++)
    tz_tier_free(&buf[i]);
  free(buf);
  free(f);
  return rate;
}

/* Seconds per phase of the compute lane: n phases' jobs back to back on a lane of its own of the
 * same kind (a CPU lane, or a CUDA stream of the compute tier), so that what this machine takes
 * to run one (scheduling, launches, other load) is in the bound too. */
static double measure_compute(double *t_comp, int n, tz_tier *gpu) {
  tz_lane *lane;
  if (gpu ? tz_bench_gpu_lane_create(gpu, &lane) < 0 : tz_lane_create_cpu("measure", &lane) < 0)
    return -1;
  struct tz_bench_gpu_spin_arg ga = {lane, *t_comp};
  double t0 = tz_now_s();
  int ok = 1;
  for (int i = 0; i < n && ok; i++)
    ok = (gpu ? tz_lane_submit(lane, tz_bench_gpu_spin_job, &ga)
              : tz_lane_submit(lane, spin, t_comp)) == 0;
  tz_fence *f;
  ok = ok && tz_lane_record(lane, &f) == 0;
  ok = ok && tz_fence_wait(f, -1) == 0;
  if (ok)
    tz_fence_release(f);
  double t = (tz_now_s() - t0) / n;
  tz_lane_destroy(lane);
  return ok ? t : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int tz_bench_prefetch(int argc, char **argv) {
  struct opts o = {.layers = 16,
                   .steps = 6,
                   .lookahead = 2,
                   .block = 8ull << 20,
                   .compute_ms = 10,
                   .path = "/var/tmp",
                   .checksum = -1};
  static const struct option longopts[] = {{"layers", required_argument, 0, 'L'},
                                           {"block", required_argument, 0, 'b'},
                                           {"compute-ms", required_argument, 0, 'c'},
                                           {"home", required_argument, 0, 'H'},
                                           {"path", required_argument, 0, 'p'},
                                           {"steps", required_argument, 0, 's'},
                                           {"lookahead", required_argument, 0, 'k'},
                                           {"budget", required_argument, 0, 'B'},
                                           {"trace", required_argument, 0, 't'},
                                           {"json", no_argument, 0, 'j'},
                                           {"checksum", required_argument, 0, 'C'},
                                           {"lane", required_argument, 0, 'g'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'L': o.layers = atoi(optarg); break;
    case 'b': o.block = tz_bench_parse_size(optarg); break;
    case 'c': o.compute_ms = atof(optarg); break;
    case 'H': o.home = optarg; break;
    case 'p': o.path = optarg; break;
    case 's': o.steps = atoi(optarg); break;
    case 'k': o.lookahead = atoi(optarg); break;
    case 'B': o.budget = tz_bench_parse_size(optarg); break;
    case 't': o.trace = optarg; break;
    case 'j': o.json = 1; break;
    case 'g': o.lane = optarg; break;
    case 'C':
      o.checksum = strcmp(optarg, "on") == 0 ? 1 : strcmp(optarg, "off") == 0 ? 0 : -2;
      break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  char why[256];
  /* A GPU: the hbm backend is built and finds a device, and the GPU side of this file is linked. */
  int have_gpu = tz_bench_gpu_lane_create && tz_bench_gpu_spin_job &&
                 tz_tier_probe("hbm", why, sizeof why) == 0;
  if (o.lane && strcmp(o.lane, "cpu") != 0 && strcmp(o.lane, "gpu") != 0) {
    usage(stderr);
    return 2;
  }
  int gpu = o.lane ? strcmp(o.lane, "gpu") == 0 : have_gpu;
  if (gpu && !have_gpu) {
    fprintf(stderr, "tz-bench prefetch: --lane gpu: %s\n",
            tz_bench_gpu_lane_create ? why : "built without CUDA");
    return 77;
  }
  if (!o.home)
    o.home = gpu ? "host" : "nvme";
  int nvme = strcmp(o.home, "nvme") == 0;
  if (o.layers < 1 || o.steps < 2 || o.lookahead < 0 || !o.block || o.compute_ms < 0 ||
      o.checksum == -2 || (!nvme && strcmp(o.home, "host") != 0)) {
    usage(stderr);
    return 2;
  }
  if (nvme && tz_tier_probe("nvme", why, sizeof why) < 0) {
    fprintf(stderr, "tz-bench prefetch: %s\n", why);
    return 77;
  }
  tz_runtime *rt = NULL;
  tz_sched *s = NULL;
  tz_lane *lane = NULL;
  tz_extent *homes = calloc((size_t)o.layers, sizeof *homes);
  struct tz_phase_decl *ph = calloc((size_t)o.layers, sizeof *ph);
  struct tz_block_use *uses = calloc((size_t)o.layers, sizeof *uses);
  char(*names)[24] = calloc((size_t)o.layers, sizeof *names);
  int rc = 1;
  if (!homes || !ph || !uses || !names || tz_runtime_create(NULL, &rt) < 0)
    goto fail;
  uint64_t chunk = tz_runtime_chunk_bytes(rt);
  uint64_t block = (o.block + 4095) / 4096 * 4096;
  if (!o.budget)
    o.budget = (uint64_t)(o.lookahead + 1) * block + chunk;
  struct tz_tier_params tp;
  tz_tier_params_init(&tp);
  tp.name = "compute";
  tp.capacity = o.budget + (uint64_t)(o.lookahead + 1) * block; /* and the rate measurement's */
  tp.device = 0;
  tz_tier *compute, *home;
  if (tz_tier_create(rt, gpu ? "hbm" : "host", &tp, &compute) < 0)
    goto fail;
  tz_tier_params_init(&tp);
  tp.name = o.home;
  tp.capacity = (uint64_t)o.layers * block;
  tp.checksum = o.checksum;
  if (nvme) {
    tp.paths[0] = o.path;
    tp.n_paths = 1;
  }
  if (tz_tier_create(rt, nvme ? "nvme" : "host", &tp, &home) < 0)
    goto fail;
  /* Real bytes in every block: a drive reads blocks never written without touching the disk. */
  unsigned char *fill = NULL;
  if (posix_memalign((void **)&fill, 4096, block) != 0)
    goto fail;
  for (uint64_t i = 0; i < block; i++)
    fill[i] = (unsigned char)(i * 131 + 7);
  for (int l = 0; l < o.layers; l++)
    if (tz_tier_alloc(home, block, &homes[l]) < 0 ||
        tz_tier_write_sync(&homes[l], 0, fill, block) < 0) {
      free(fill);
      goto fail;
    }
  free(fill);
  /* Each rate is the median of three measurements: this machine's other load moves them. */
  int depth = o.lookahead > 0 ? o.lookahead : 1;
  double t_comp = o.compute_ms * 1e-3, rates[3], lanes[3];
  for (int r = 0; r < 3; r++) {
    rates[r] = measure_rate(rt, homes, o.layers, compute, block, depth);
    lanes[r] = measure_compute(&t_comp, o.layers, gpu ? compute : NULL);
    if (rates[r] <= 0 || lanes[r] <= 0)
      goto fail;
  }
  qsort(rates, 3, sizeof rates[0], cmp_double);
  qsort(lanes, 3, sizeof lanes[0], cmp_double);
  double gbps = rates[1], t_lane = lanes[1];
  double t_xfer = (double)block / (gbps * 1e9);
  double path = o.layers * (t_lane > t_xfer ? t_lane : t_xfer);
  double path0 = path + t_xfer;

  struct tz_sched_params sp;
  tz_sched_params_init(&sp);
  sp.compute = compute;
  sp.budget = o.budget;
  sp.lookahead = o.lookahead;
  sp.trace_step = o.trace ? o.steps - 1 : -1;
  sp.trace_path = o.trace;
  if (gpu && tz_bench_gpu_lane_create(compute, &lane) < 0)
    goto fail;
  sp.lane = lane; /* NULL: the scheduler's own CPU lane */
  if (tz_sched_create(rt, &sp, &s) < 0)
    goto fail;
  struct tz_bench_gpu_spin_arg ga = {lane, t_comp};
  for (int l = 0; l < o.layers; l++) {
    int id;
    snprintf(names[l], sizeof names[l], "layer%d", l);
    if (tz_sched_block_add(s, names[l], block, &homes[l], &id) < 0)
      goto fail;
    uses[l] = (struct tz_block_use){id, TZ_ACCESS_READ};
    ph[l] = (struct tz_phase_decl){names[l], &uses[l], 1};
  }
  if (tz_sched_declare(s, ph, o.layers) < 0)
    goto fail;
  for (int step = 0; step < o.steps; step++) {
    for (int l = 0; l < o.layers; l++) {
      struct tz_view v;
      if (tz_sched_enter(s, l, &v) < 0 ||
          (gpu ? tz_sched_submit(s, tz_bench_gpu_spin_job, &ga)
               : tz_sched_submit(s, spin, &t_comp)) < 0 ||
          tz_sched_leave(s, l) < 0)
        goto fail;
    }
    if (tz_sched_step_end(s) < 0)
      goto fail;
  }
  if (tz_sched_sync(s) < 0)
    goto fail;

  /* Per step, besides the critical path from the rates measured before: the bound from what
   * the compute lane actually took in that step (this machine's other load slows it), so the
   * ratio shows what the overlap itself loses. */
  struct tz_sched_step_time st[256];
  int n_steps = tz_sched_step_times(s, st, 256);
  double steady[256], in_run[256], ratio_run[256], stall_steady = 0, time_steady = 0;
  int n_steady = 0;
  for (int i = 0; i < n_steps; i++) {
    double xfer = o.layers * t_xfer + (st[i].step == 0 ? t_xfer : 0);
    in_run[i] = st[i].compute_s > xfer ? st[i].compute_s : xfer;
    if (st[i].step > 0) {
      ratio_run[n_steady] = st[i].seconds / in_run[i];
      steady[n_steady++] = st[i].seconds;
      stall_steady += st[i].stall_s;
      time_steady += st[i].seconds;
    }
  }
  qsort(steady, (size_t)n_steady, sizeof *steady, cmp_double);
  qsort(ratio_run, (size_t)n_steady, sizeof *ratio_run, cmp_double);
  double median =
      n_steady % 2 ? steady[n_steady / 2] : 0.5 * (steady[n_steady / 2 - 1] + steady[n_steady / 2]);
  double median_run = n_steady % 2 ? ratio_run[n_steady / 2]
                                   : 0.5 * (ratio_run[n_steady / 2 - 1] + ratio_run[n_steady / 2]);
  double stall_frac = time_steady > 0 ? stall_steady / time_steady : 0;
  struct tz_sched_phase_stats *ps = calloc((size_t)o.layers, sizeof *ps);
  struct tz_sched_lane_stats ls[16];
  int n_lanes = tz_sched_lane_stats(s, ls, 16);
  if (!ps)
    goto fail;
  tz_sched_phase_stats(s, ps, o.layers);
  struct tz_sched_stats ss;
  tz_sched_stats(s, &ss);
  if (o.json) {
    printf("{\"bench\":\"prefetch\",\"layers\":%d,\"block_bytes\":%llu,\"home\":\"%s\","
           "\"checksum\":%s,\"compute_ms\":%.3f,\"compute\":\"%s\",\"lookahead\":%d,"
           "\"budget_bytes\":%llu,\"rate_gbps\":%.4f,\"transfer_ms\":%.3f,"
           "\"compute_lane_ms\":%.3f,\"critical_path_ms\":%.3f,\"critical_path_first_ms\":%.3f,"
           "\"step_ms\":[",
           o.layers, (unsigned long long)block, o.home, nvme && o.checksum != 0 ? "true" : "false",
           o.compute_ms, gpu ? "gpu spin kernel" : "cpu busy loop", o.lookahead,
           (unsigned long long)ss.budget, gbps, 1e3 * t_xfer, 1e3 * t_lane, 1e3 * path,
           1e3 * path0);
    for (int i = 0; i < n_steps; i++)
      printf("%s%.3f", i ? "," : "", 1e3 * st[i].seconds);
    printf("],\"stall_ms\":[");
    for (int i = 0; i < n_steps; i++)
      printf("%s%.3f", i ? "," : "", 1e3 * st[i].stall_s);
    printf("],\"compute_lane_step_ms\":[");
    for (int i = 0; i < n_steps; i++)
      printf("%s%.3f", i ? "," : "", 1e3 * st[i].compute_s);
    printf("],\"median_step_ms\":%.3f,\"ratio\":%.4f,\"ratio_in_run\":%.4f,"
           "\"stall_fraction\":%.4f,\"phases\":[",
           1e3 * median, median / path, median_run, stall_frac);
    for (int l = 0; l < o.layers; l++)
      printf("%s{\"name\":\"%s\",\"runs\":%llu,\"stall_ms\":%.3f}", l ? "," : "", ps[l].name,
             (unsigned long long)ps[l].runs, 1e3 * ps[l].stall_s);
    printf("],\"lanes\":[");
    for (int i = 0; i < n_lanes && i < 16; i++)
      printf("%s{\"name\":\"%s\",\"busy_s\":%.4f,\"bytes\":%llu,\"ops\":%llu}", i ? "," : "",
             ls[i].name, ls[i].busy_s, (unsigned long long)ls[i].bytes,
             (unsigned long long)ls[i].ops);
    printf("]}\n");
  } else {
    printf("prefetch: %d layers x %.1f MiB in %s%s%s%s, compute %.3f ms per phase (%s "
           "on the compute lane), lookahead %d, budget %.1f MiB (minimum %.1f)\n",
           o.layers, (double)block / (1 << 20), o.home, nvme ? " at " : "", nvme ? o.path : "",
           nvme && o.checksum == 0 ? " without checksums" : "", o.compute_ms,
           gpu ? "GPU spin kernel on a CUDA stream, compute tier in GPU memory" : "CPU busy loop",
           o.lookahead, (double)ss.budget / (1 << 20), (double)ss.min_budget / (1 << 20));
    printf("lane rate %s->compute: %.3f GB/s with %d in flight, %.3f ms per layer\n", o.home, gbps,
           depth, 1e3 * t_xfer);
    printf("lane rate compute: %.3f ms per phase, measured (%.3f asked)\n", 1e3 * t_lane,
           o.compute_ms);
    printf("critical path per step: max(compute %.1f ms, transfer %.1f ms) = %.1f ms; the first "
           "step adds one transfer: %.1f ms\n",
           1e3 * o.layers * t_lane, 1e3 * o.layers * t_xfer, 1e3 * path, 1e3 * path0);
    printf("%-5s %9s %9s %6s | %11s %9s %6s | %9s %7s\n", "step", "time ms", "path ms", "ratio",
           "lane ms", "bound ms", "ratio", "stall ms", "stall%");
    for (int i = 0; i < n_steps; i++) {
      double bound = st[i].step == 0 ? path0 : path;
      printf("%-5llu %9.2f %9.2f %6.3f | %11.2f %9.2f %6.3f | %9.2f %6.1f%%\n",
             (unsigned long long)st[i].step, 1e3 * st[i].seconds, 1e3 * bound,
             st[i].seconds / bound, 1e3 * st[i].compute_s, 1e3 * in_run[i],
             st[i].seconds / in_run[i], 1e3 * st[i].stall_s, 100 * st[i].stall_s / st[i].seconds);
    }
    printf("(path: the critical path from the rates measured first; lane: the compute lane's time "
           "in the step, and the bound max(lane, transfers) it gives)\n");
    printf("steps 1..%d: median %.2f ms = %.3fx the critical path, %.3fx the in-run bound; stall "
           "%.2f%% of the time\n",
           o.steps - 1, 1e3 * median, median / path, median_run, 100 * stall_frac);
    printf("%-10s %6s %12s %12s\n", "phase", "runs", "stall ms", "per run ms");
    for (int l = 0; l < o.layers; l++)
      printf("%-10s %6llu %12.3f %12.3f\n", ps[l].name, (unsigned long long)ps[l].runs,
             1e3 * ps[l].stall_s, ps[l].runs ? 1e3 * ps[l].stall_s / (double)ps[l].runs : 0);
    printf("%-18s %10s %12s %8s\n", "lane", "busy s", "MiB", "ops");
    for (int i = 0; i < n_lanes && i < 16; i++)
      printf("%-18s %10.3f %12.1f %8llu\n", ls[i].name, ls[i].busy_s,
             (double)ls[i].bytes / (1 << 20), (unsigned long long)ls[i].ops);
  }
  free(ps);
  rc = 0;
fail:
  if (rc)
    fprintf(stderr, "tz-bench prefetch: %s\n", tz_err_msg());
  tz_sched_destroy(s);
  tz_lane_destroy(lane);
  tz_runtime_destroy(rt);
  free(homes);
  free(ph);
  free(uses);
  free(names);
  return rc;
}
