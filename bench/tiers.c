/* tz-bench tiers: read and write bandwidth host<->nvme through the tier API over block sizes and
 * queue depths, each row beside fio (io_uring, O_DIRECT, same directory, block size, depth and
 * size) run in the same invocation; the two are interleaved and the median of each kept. A third
 * row per block size reads and writes at once (two streams, two fio jobs), as a training step
 * with optimizer state on the disk does. GPU pairs come from bench/tiers_gpu.cu where the build
 * has CUDA and the machine a GPU. */
#define _GNU_SOURCE
#include "bench/bench.h"
#include "core/error.h"
#include "core/runtime.h"
#include "core/tier.h"

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int tz_bench_tiers_gpu(const struct tz_bench_tiers_opts *o) __attribute__((weak));

/* Moves size bytes between one host buffer region and the nvme extent with qd operations in
 * flight, the way a prefetching scheduler does; returns GB/s or a negative code. */
static double run_tier(tz_tier *nvme, tz_tier *host, uint64_t size, uint64_t block, int qd,
                       int write) {
  tz_extent ext, buf;
  if (tz_tier_alloc(nvme, size, &ext) < 0 || tz_tier_alloc(host, block * (uint64_t)qd, &buf) < 0)
    return TZ_ENOMEM;
  double seconds;
  int rc = tz_tier_stream(&ext, tz_tier_host_ptr(host, buf.offset), size / block * block, block, qd,
                          write, &seconds);
  tz_tier_free(&ext);
  tz_tier_free(&buf);
  if (rc < 0)
    return rc;
  return (double)(size / block * block) / seconds / 1e9;
}

struct stream_arg {
  const tz_extent *ext;
  void *buf;
  uint64_t bytes, block;
  int qd, write, rc;
  double seconds;
};

static void *stream_main(void *p) {
  struct stream_arg *a = p;
  a->rc = tz_tier_stream(a->ext, a->buf, a->bytes, a->block, a->qd, a->write, &a->seconds);
  return NULL;
}

/* Reads size bytes from one extent while writing size bytes to another, qd operations in
 * flight each: GB/s of each direction over its own time into rw[0] (read) and rw[1] (write);
 * 0 or a negative code. */
static int run_tier_rw(tz_tier *nvme, tz_tier *host, uint64_t size, uint64_t block, int qd,
                       double rw[2]) {
  tz_extent ext[2] = {{0}, {0}}, buf = {0};
  uint64_t bytes = size / block * block;
  int rc = tz_tier_alloc(nvme, size, &ext[0]);
  if (rc == 0)
    rc = tz_tier_alloc(nvme, size, &ext[1]);
  if (rc == 0)
    rc = tz_tier_alloc(host, 2 * block * (uint64_t)qd, &buf);
  unsigned char *b = rc == 0 ? tz_tier_host_ptr(host, buf.offset) : NULL;
  struct stream_arg a[2] = {{&ext[0], b, bytes, block, qd, 0, 0, 0},
                            {&ext[1], b + block * (uint64_t)qd, bytes, block, qd, 1, 0, 0}};
  double laid;
  if (rc == 0) /* the extent read holds data first: never-written blocks read no disk */
    rc = tz_tier_stream(&ext[0], b, bytes, block, qd, 1, &laid);
  pthread_t t;
  if (rc == 0 && pthread_create(&t, NULL, stream_main, &a[1]) != 0)
    rc = tz_err_set(TZ_ENOMEM, "tiers: cannot start the writing thread");
  if (rc == 0) {
    stream_main(&a[0]);
    pthread_join(t, NULL);
    rc = a[0].rc < 0 ? a[0].rc : a[1].rc;
  }
  for (int i = 0; i < 2 && rc == 0; i++)
    rw[i] = (double)bytes / a[i].seconds / 1e9;
  tz_tier_free(&ext[0]);
  tz_tier_free(&ext[1]);
  tz_tier_free(&buf);
  return rc < 0 ? rc : 0;
}

/* terse v3: field 7 is read bandwidth in KiB/s, field 48 write bandwidth (1-based); GB/s. */
static double terse_gbps(const char *line, int write) {
  int field = 1;
  for (const char *s = line; *s; s++)
    if (*s == ';' && ++field == (write ? 48 : 7))
      return strtod(s + 1, NULL) * 1024.0 / 1e9;
  return -1;
}

/* fio reading file_r while writing file_w, two jobs at once with the same parameters: GB/s of
 * each into rw; 0, or -1 when fio is missing or failed. */
static int run_fio_rw(const char *file_r, const char *file_w, uint64_t size, uint64_t block, int qd,
                      double rw[2]) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "fio --ioengine=io_uring --direct=1 --bs=%llu --iodepth=%d --size=%llu --fixedbufs "
           "--registerfiles --output-format=terse --terse-version=3 --name=r --filename=%s "
           "--rw=read --name=w --filename=%s --rw=write 2>/dev/null",
           (unsigned long long)block, qd, (unsigned long long)size, file_r, file_w);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  char line[8192];
  int got = 0;
  while (got < 2 && fgets(line, sizeof line, p)) {
    /* one line per job, in the order given: r, then w */
    rw[got] = terse_gbps(line, got);
    got += rw[got] >= 0;
  }
  int st = pclose(p);
  return got == 2 && st == 0 ? 0 : -1;
}

/* fio with the same parameters; GB/s, or a negative value when fio is missing or failed. */
static double run_fio(const char *file, uint64_t size, uint64_t block, int qd, int write) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "fio --name=tz --filename=%s --ioengine=io_uring --direct=1 --rw=%s --bs=%llu "
           "--iodepth=%d --size=%llu --fixedbufs --registerfiles --output-format=terse "
           "--terse-version=3 2>/dev/null",
           file, write ? "write" : "read", (unsigned long long)block, qd, (unsigned long long)size);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  char line[8192] = "";
  char *ok = fgets(line, sizeof line, p);
  int st = pclose(p);
  if (!ok || st != 0)
    return -1;
  return terse_gbps(line, write);
}

static void usage(FILE *f) {
  fprintf(
      f, "usage: tz-bench tiers [--json] [--path DIR] [--size BYTES] [--reps N] [--qd N]\n"
         "  host<->nvme through the tier API beside fio (io_uring, O_DIRECT) over block sizes\n"
         "  128K..8M, reading, writing, and both at once (r+w: the sum of the two directions);\n"
         "  GPU pairs too where there is a GPU.\n"
         "  --path DIR   directory on the drive to measure (default /var/tmp)\n"
         "  --size BYTES bytes moved per measurement (default 512M; at least --qd x --max,\n"
         "               raised to that, with a line on stderr that says so)\n"
         "  --reps N     interleaved repetitions; the median is kept (default 3)\n"
         "  --qd N       operations in flight (default 32)\n"
         "  --min B --max B  block size range (default 128K..8M)\n"
         "  Exit status: 0 when the rows this machine has are measured (host<->nvme, and the\n"
         "  GPU rows where there is a GPU), 77 when nvme cannot run here, 1 a failure, 2 usage.\n");
}

int tz_bench_tiers(int argc, char **argv) {
  struct tz_bench_tiers_opts o = {.json = 0, .path = "/var/tmp", .size = 512ull << 20, .reps = 3};
  int qd = 32;
  uint64_t bmin = 128 << 10, bmax = 8 << 20;
  static const struct option longopts[] = {{"json", no_argument, 0, 'j'},
                                           {"path", required_argument, 0, 'p'},
                                           {"size", required_argument, 0, 's'},
                                           {"reps", required_argument, 0, 'r'},
                                           {"qd", required_argument, 0, 'q'},
                                           {"min", required_argument, 0, 'a'},
                                           {"max", required_argument, 0, 'b'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};
  int c;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (c) {
    case 'j': o.json = 1; break;
    case 'p': o.path = optarg; break;
    case 's': o.size = tz_bench_parse_size(optarg); break;
    case 'r': o.reps = atoi(optarg); break;
    case 'q': qd = atoi(optarg); break;
    case 'a': bmin = tz_bench_parse_size(optarg); break;
    case 'b': bmax = tz_bench_parse_size(optarg); break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!o.size || o.reps < 1 || qd < 1 || !bmin || bmax < bmin) {
    usage(stderr);
    return 2;
  }
  if (o.size < bmax * (uint64_t)qd) {
    /* Each measurement keeps qd blocks of the largest size in flight: less than that is no
     * measurement of that depth. */
    uint64_t need = bmax * (uint64_t)qd;
    char size[32];
    snprintf(size, sizeof size, need % (1 << 20) ? "%llu bytes" : "%llu MiB",
             (unsigned long long)(need % (1 << 20) ? need : need >> 20));
    fprintf(stderr,
            "tz-bench tiers: --size %llu bytes raised to %s: --qd %d blocks of --max %llu bytes "
            "in flight at once\n",
            (unsigned long long)o.size, size, qd, (unsigned long long)bmax);
    o.size = need;
  }
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0) {
    fprintf(stderr, "tz-bench tiers: %s\n", why);
    return 77;
  }
  tz_runtime *rt;
  tz_tier *nvme, *host;
  struct tz_tier_params p;
  if (tz_runtime_create(NULL, &rt) < 0) {
    fprintf(stderr, "tz-bench tiers: %s\n", tz_err_msg());
    return 1;
  }
  tz_tier_params_init(&p);
  p.name = "host";
  p.capacity = 2 * bmax * (uint64_t)qd + (64 << 20); /* r+w keeps a queue of each direction */
  if (tz_tier_create(rt, "host", &p, &host) < 0)
    goto fail;
  tz_tier_params_init(&p);
  p.name = "nvme";
  p.capacity = 2 * o.size;
  p.paths[0] = o.path;
  p.n_paths = 1;
  p.queue_depth = qd;
  p.stripe_bytes = bmax;
  if (tz_tier_create(rt, "nvme", &p, &nvme) < 0)
    goto fail;
  char fio_file[1024], fio_file2[1024];
  snprintf(fio_file, sizeof fio_file, "%s/tierzero-bench-fio-%d.bin", o.path, (int)getpid());
  snprintf(fio_file2, sizeof fio_file2, "%s/tierzero-bench-fio-%d-w.bin", o.path, (int)getpid());
  /* Lay both files out with real data first: reading never-written blocks reads no disk. */
  if (run_tier(nvme, host, o.size, bmax, qd, 1) < 0)
    goto fail;
  int have_fio = run_fio(fio_file, o.size, bmax, qd, 1) >= 0;
  if (!have_fio)
    fprintf(stderr, "tz-bench tiers: fio did not run (apt-get install fio): rows have no "
                    "raw figure\n");
  if (!o.json)
    printf("host<->nvme in %s, %llu MiB per run, queue depth %d, median of %d; raw = fio "
           "io_uring O_DIRECT with fixed buffers and registered files, as the tier\n%-6s %10s %12s "
           "%12s %7s\n",
           o.path, (unsigned long long)(o.size >> 20), qd, o.reps, "op", "block", "tier GB/s",
           "fio GB/s", "ratio");
  int rc = 0;
  for (uint64_t block = bmin; block <= bmax; block *= 2) {
    for (int w = 1; w >= 0; w--) {
      double tier[64], raw[64];
      int reps = o.reps > 64 ? 64 : o.reps;
      for (int r = 0; r < reps; r++) {
        tier[r] = run_tier(nvme, host, o.size, block, qd, w);
        raw[r] = have_fio ? run_fio(fio_file, o.size, block, qd, w) : -1;
        if (tier[r] < 0) {
          fprintf(stderr, "tz-bench tiers: %s\n", tz_err_msg());
          rc = 1;
          goto done;
        }
      }
      double tm = tz_bench_median(tier, reps), rm = have_fio ? tz_bench_median(raw, reps) : -1;
      const char *op = w ? "write" : "read";
      if (o.json)
        printf("{\"bench\":\"tiers\",\"pair\":\"%s\",\"block_bytes\":%llu,\"queue_depth\":%d,"
               "\"op\":\"%s\",\"tier_gbps\":%.4f,\"raw_gbps\":%.4f,\"ratio\":%.4f}\n",
               w ? "host->nvme" : "nvme->host", (unsigned long long)block, qd, op, tm, rm,
               rm > 0 ? tm / rm : 0.0);
      else
        printf("%-6s %9lluK %12.3f %12.3f %7.3f\n", op, (unsigned long long)(block >> 10), tm, rm,
               rm > 0 ? tm / rm : 0.0);
      fflush(stdout);
    }
    /* Both at once: each direction's rate over its own time, summed. */
    double tier[64], raw[64], tr[64][2] = {{0}}, fr[64][2] = {{0}};
    int reps = o.reps > 64 ? 64 : o.reps;
    for (int r = 0; r < reps; r++) {
      if (run_tier_rw(nvme, host, o.size, block, qd, tr[r]) < 0) {
        fprintf(stderr, "tz-bench tiers: %s\n", tz_err_msg());
        rc = 1;
        goto done;
      }
      tier[r] = tr[r][0] + tr[r][1];
      raw[r] = have_fio && run_fio_rw(fio_file, fio_file2, o.size, block, qd, fr[r]) == 0
                   ? fr[r][0] + fr[r][1]
                   : -1;
    }
    /* The repetitions whose sums are the medians (tz_bench_median sorts, so on copies), for
     * their two parts. */
    double tc[64], rcp[64];
    memcpy(tc, tier, sizeof(double) * (size_t)reps);
    memcpy(rcp, raw, sizeof(double) * (size_t)reps);
    double tm = tz_bench_median(tc, reps), rm = have_fio ? tz_bench_median(rcp, reps) : -1;
    int mt = 0, mr = 0;
    for (int r = 0; r < reps; r++) {
      mt = tier[r] == tm ? r : mt;
      mr = raw[r] == rm ? r : mr;
    }
    if (o.json)
      printf("{\"bench\":\"tiers\",\"pair\":\"host<->nvme\",\"block_bytes\":%llu,"
             "\"queue_depth\":%d,\"op\":\"read+write\",\"tier_gbps\":%.4f,\"raw_gbps\":%.4f,"
             "\"ratio\":%.4f,\"tier_read_gbps\":%.4f,\"tier_write_gbps\":%.4f,"
             "\"raw_read_gbps\":%.4f,\"raw_write_gbps\":%.4f}\n",
             (unsigned long long)block, qd, tm, rm, rm > 0 ? tm / rm : 0.0, tr[mt][0], tr[mt][1],
             rm > 0 ? fr[mr][0] : -1, rm > 0 ? fr[mr][1] : -1);
    else
      printf("%-6s %9lluK %12.3f %12.3f %7.3f   (tier r %.3f + w %.3f, fio r %.3f + w %.3f)\n",
             "r+w", (unsigned long long)(block >> 10), tm, rm, rm > 0 ? tm / rm : 0.0, tr[mt][0],
             tr[mt][1], rm > 0 ? fr[mr][0] : -1, rm > 0 ? fr[mr][1] : -1);
    fflush(stdout);
  }
done:
  unlink(fio_file);
  unlink(fio_file2);
  tz_runtime_destroy(rt);
  /* The nvme rows are measured: a machine without a GPU (77 from the GPU rows) is measured
   * whole, not skipped. */
  if (rc == 0 && tz_bench_tiers_gpu) {
    int gpu = tz_bench_tiers_gpu(&o);
    rc = gpu == 77 ? 0 : gpu;
  }
  return rc;
fail:
  fprintf(stderr, "tz-bench tiers: %s\n", tz_err_msg());
  tz_runtime_destroy(rt);
  return 1;
}
