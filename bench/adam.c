/* tz-bench adam: CPU Adam throughput beside the streaming ceiling measured in the same run (the
 * same loads and stores, no arithmetic, same threads), for 1 thread up to all of the cpu set;
 * with --gpu, GPU Adam beside the device's own copy bandwidth (bench/adam_cuda.cu). */
#define _GNU_SOURCE
#include <errno.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/adam.h"
#include "util/clock.h"

struct opts {
  int json, gpu, reps;
  size_t n, gpu_n;
  int threads; /* the most threads; 0: one per cpu of the set */
  int *cpus, ncpus;
  enum tz_dtype gdt, cdt;
  int has_copy;
  enum tz_adam_cpu_path path;
};

static void usage(FILE *f) {
  fprintf(f,
          "usage: tz-bench adam [--json] [--n N] [--threads T] [--cpus LIST] [--reps R]\n"
          "                     [--grad f32|bf16|f16] [--copy bf16|f16|f32|none]\n"
          "                     [--path auto|scalar|avx2|avx512] [--gpu] [--gpu-n N]\n"
          "  CPU Adam (fp32 master, m, v; gradient in; parameter copy out) in Gparam/s and GB/s\n"
          "  beside a ceiling measured in the same run: the same loads and stores on the same\n"
          "  threads with no arithmetic. Rows for 1, 2, 4, ... threads up to T.\n"
          "  --n N        parameters (default 64M; K/M/G suffixes are powers of two)\n"
          "  --threads T  the most threads (default: one per cpu of the set)\n"
          "  --cpus LIST  the cpu set, e.g. 0-15,32-47 (default: this process's affinity);\n"
          "               thread i runs on the i-th cpu of the list\n"
          "  --reps R     timed repetitions of each kernel, interleaved; the median counts (5)\n"
          "  --gpu        also GPU Adam against device-to-device copy bandwidth (CUDA builds)\n"
          "  --gpu-n N    parameters on the GPU (default 256M)\n"
          "  --json       one JSON object per line instead of the table\n");
}

static int parse_dtype(const char *s, enum tz_dtype *dt, int allow_none, int *none) {
  if (allow_none && strcmp(s, "none") == 0) {
    *none = 1;
    return 0;
  }
  if (none)
    *none = 0;
  if (strcmp(s, "f32") == 0)
    *dt = TZ_F32;
  else if (strcmp(s, "bf16") == 0)
    *dt = TZ_BF16;
  else if (strcmp(s, "f16") == 0)
    *dt = TZ_F16;
  else
    return -1;
  return 0;
}

/* "0-3,8,10-11" -> cpus; returns the count, or -1 on a malformed list. */
static int parse_cpus(const char *s, int **out) {
  int cap = 64, n = 0;
  int *v = malloc((size_t)cap * sizeof *v);
  if (!v)
    return -1;
  const char *p = s;
  while (*p) {
    char *end;
    long a = strtol(p, &end, 10), b;
    if (end == p || a < 0 || a >= CPU_SETSIZE)
      goto bad;
    b = a;
    p = end;
    if (*p == '-') {
      b = strtol(p + 1, &end, 10);
      if (end == p + 1 || b < a || b >= CPU_SETSIZE)
        goto bad;
      p = end;
    }
    for (long c = a; c <= b; c++) {
      if (n == cap) {
        int *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
        if (!nv)
          goto bad;
        v = nv;
      }
      v[n++] = (int)c;
    }
    if (*p == ',')
      p++;
    else if (*p)
      goto bad;
  }
  if (n == 0)
    goto bad;
  *out = v;
  return n;
bad:
  free(v);
  return -1;
}

static int affinity_cpus(int **out) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return -1;
  int n = 0, *v = malloc((size_t)CPU_COUNT(&set) * sizeof *v);
  if (!v)
    return -1;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &set))
      v[n++] = c;
  *out = v;
  return n;
}

static void cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f)
    return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon) {
      colon += 1 + (colon[1] == ' ');
      colon[strcspn(colon, "\n")] = 0;
      snprintf(buf, len, "%s", colon);
      break;
    }
  }
  fclose(f);
}

static int parse(int argc, char **argv, struct opts *o) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE()                                                                               \
  do {                                                                                             \
    if (!val) {                                                                                    \
      fprintf(stderr, "tz-bench adam: %s needs a value\n", a);                                     \
      return 2;                                                                                    \
    }                                                                                              \
    i++;                                                                                           \
  } while (0)
    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return 1;
    } else if (strcmp(a, "--json") == 0) {
      o->json = 1;
    } else if (strcmp(a, "--gpu") == 0) {
      o->gpu = 1;
    } else if (strcmp(a, "--n") == 0 || strcmp(a, "--gpu-n") == 0) {
      NEED_VALUE();
      uint64_t n = tz_bench_parse_size(val);
      if (!n) {
        fprintf(stderr, "tz-bench adam: %s '%s' is not a size\n", a, val);
        return 2;
      }
      *(strcmp(a, "--n") == 0 ? &o->n : &o->gpu_n) = (size_t)n;
    } else if (strcmp(a, "--threads") == 0 || strcmp(a, "--reps") == 0) {
      NEED_VALUE();
      char *end;
      long v = strtol(val, &end, 10);
      if (*end || v < 1 || v > 1 << 20) {
        fprintf(stderr, "tz-bench adam: %s '%s' is not a positive count\n", a, val);
        return 2;
      }
      *(strcmp(a, "--threads") == 0 ? &o->threads : &o->reps) = (int)v;
    } else if (strcmp(a, "--cpus") == 0) {
      NEED_VALUE();
      free(o->cpus);
      o->ncpus = parse_cpus(val, &o->cpus);
      if (o->ncpus < 0) {
        o->cpus = NULL;
        fprintf(stderr, "tz-bench adam: --cpus '%s' is not a cpu list like 0-3,8\n", val);
        return 2;
      }
    } else if (strcmp(a, "--grad") == 0) {
      NEED_VALUE();
      if (parse_dtype(val, &o->gdt, 0, NULL)) {
        fprintf(stderr, "tz-bench adam: --grad '%s': f32, bf16 or f16\n", val);
        return 2;
      }
    } else if (strcmp(a, "--copy") == 0) {
      NEED_VALUE();
      int none;
      if (parse_dtype(val, &o->cdt, 1, &none)) {
        fprintf(stderr, "tz-bench adam: --copy '%s': bf16, f16, f32 or none\n", val);
        return 2;
      }
      o->has_copy = !none;
    } else if (strcmp(a, "--path") == 0) {
      NEED_VALUE();
      const enum tz_adam_cpu_path all[] = {TZ_ADAM_CPU_AUTO, TZ_ADAM_CPU_SCALAR, TZ_ADAM_CPU_AVX2,
                                           TZ_ADAM_CPU_AVX512};
      int found = 0;
      for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        if (strcmp(val, tz_adam_cpu_path_name(all[k])) == 0) {
          o->path = all[k];
          found = 1;
        }
      if (!found) {
        fprintf(stderr, "tz-bench adam: --path '%s': auto, scalar, avx2 or avx512\n", val);
        return 2;
      }
    } else {
      fprintf(stderr, "tz-bench adam: unknown option '%s'\n", a);
      usage(stderr);
      return 2;
    }
#undef NEED_VALUE
  }
  return 0;
}

/* The arrays of one run, filled by the threads that will use them (first touch), in the same
 * chunks, with values that keep Adam's arithmetic normal (no NaN, no subnormal) over many runs. */
struct arrays {
  float *p, *m, *v;
  void *g, *copy;
};

static void *alloc_pages(size_t bytes) {
  void *ptr = NULL;
  return posix_memalign(&ptr, 2u << 20, bytes ? bytes : 1) ? NULL : ptr;
}

static int arrays_create(struct arrays *a, const struct opts *o,
                         const struct tz_adam_cpu_opts *ko) {
  size_t n = o->n;
  a->p = alloc_pages(n * 4);
  a->m = alloc_pages(n * 4);
  a->v = alloc_pages(n * 4);
  a->g = alloc_pages(n * tz_dtype_size(o->gdt));
  a->copy = o->has_copy ? alloc_pages(n * tz_dtype_size(o->cdt)) : NULL;
  if (!a->p || !a->m || !a->v || !a->g || (o->has_copy && !a->copy))
    return tz_err_set(TZ_ENOMEM, "tz-bench adam: allocating %zu parameters' arrays", n);
  /* the fill below then runs on the pool's bound threads, where the work will */
  TZ_CHECK(tz_adam_cpu_bind(ko));
  size_t nchunks = (n + TZ_ADAM_CPU_CHUNK - 1) / TZ_ADAM_CPU_CHUNK;
#pragma omp parallel for num_threads(ko->threads) schedule(static)
  for (size_t k = 0; k < nchunks; k++) {
    size_t b = k * TZ_ADAM_CPU_CHUNK, e = n - b < TZ_ADAM_CPU_CHUNK ? n : b + TZ_ADAM_CPU_CHUNK;
    for (size_t i = b; i < e; i++) {
      float x = (float)(i % 1009) * (1.0f / 1009.0f);
      a->p[i] = 0.5f + x;
      a->m[i] = 1e-3f * (x - 0.5f);
      a->v[i] = 1e-6f * (1.0f + x);
      float g = 1e-3f * (0.5f - x);
      if (o->gdt == TZ_F32)
        ((float *)a->g)[i] = g;
      else
        ((uint16_t *)a->g)[i] = o->gdt == TZ_BF16 ? tz_f32_to_bf16(g) : tz_f32_to_f16(g);
      if (a->copy && o->cdt == TZ_F32)
        ((float *)a->copy)[i] = 0.0f;
      else if (a->copy)
        ((uint16_t *)a->copy)[i] = 0;
    }
  }
  return 0;
}

static void arrays_destroy(struct arrays *a) {
  free(a->p);
  free(a->m);
  free(a->v);
  free(a->g);
  free(a->copy);
}

struct result {
  int threads;
  double adam_s, ceil_s; /* medians */
  double ratio;          /* median over repetitions of ceiling time / Adam time, each pair run
                            back to back, so that load from elsewhere mostly cancels */
};

static int measure(const struct opts *o, const struct arrays *a, int threads, struct result *r) {
  struct tz_adam_cpu_opts ko = {
      .threads = threads, .path = o->path, .cpus = o->cpus, .ncpus = o->ncpus};
  struct tz_adam_params hp = {.lr = 1e-3f,
                              .beta1 = 0.9f,
                              .beta2 = 0.999f,
                              .eps = 1e-8f,
                              .weight_decay = 0.01f,
                              .decoupled = 1,
                              .grad_scale = 1.0f};
  double *ta = calloc((size_t)o->reps, sizeof *ta), *tc = calloc((size_t)o->reps, sizeof *tc);
  double *tr = calloc((size_t)o->reps, sizeof *tr);
  if (!ta || !tc || !tr) {
    free(ta);
    free(tc);
    free(tr);
    return tz_err_set(TZ_ENOMEM, "tz-bench adam: timing arrays");
  }
  int rc = 0;
  void *copy = a->copy;
  /* one untimed run of each, then interleaved timed runs */
  for (int r0 = -1; r0 < o->reps && rc == 0; r0++) {
    TZ_CHECK_GOTO(tz_adam_params_for_step(&hp, r0 + 2), rc, out);
    double t0 = tz_now_s();
    TZ_CHECK_GOTO(tz_adam_cpu(&hp, a->p, a->m, a->v, a->g, o->gdt, copy, o->cdt, o->n, &ko), rc,
                  out);
    double t1 = tz_now_s();
    TZ_CHECK_GOTO(tz_adam_cpu_ceiling(a->p, a->m, a->v, a->g, o->gdt, copy, o->cdt, o->n, &ko), rc,
                  out);
    double t2 = tz_now_s();
    if (r0 >= 0) {
      ta[r0] = t1 - t0;
      tc[r0] = t2 - t1;
    }
  }
  r->threads = threads;
  double *pair = tr;
  for (int k = 0; k < o->reps; k++)
    pair[k] = tc[k] / ta[k];
  r->ratio = tz_bench_median(pair, o->reps);
  r->adam_s = tz_bench_median(ta, o->reps);
  r->ceil_s = tz_bench_median(tc, o->reps);
out:
  free(ta);
  free(tc);
  free(tr);
  return rc;
}

static int run_cpu(const struct opts *o) {
  const size_t bpp = 12 + tz_dtype_size(o->gdt) + 12 + (o->has_copy ? tz_dtype_size(o->cdt) : 0);
  enum tz_adam_cpu_path path = o->path == TZ_ADAM_CPU_AUTO ? tz_adam_cpu_path_best() : o->path;
  if (!tz_adam_cpu_path_supported(path)) {
    fprintf(stderr, "tz-bench adam: this CPU lacks the %s path\n", tz_adam_cpu_path_name(path));
    return 77;
  }
  struct tz_adam_cpu_opts all = {
      .threads = o->threads, .path = o->path, .cpus = o->cpus, .ncpus = o->ncpus};
  struct arrays a = {0};
  int rc = arrays_create(&a, o, &all);
  if (rc) {
    fprintf(stderr, "tz-bench adam: %s\n", tz_err_msg());
    arrays_destroy(&a);
    return 1;
  }
  char model[256];
  cpu_model(model, sizeof model);
  if (!o->json) {
    printf("tz-bench adam: %s, cpus", model);
    for (int i = 0; i < o->ncpus && i < 16; i++)
      printf("%s%d", i ? "," : " ", o->cpus[i]);
    printf("%s; path %s; %zu params, grad %s, copy %s\n", o->ncpus > 16 ? ",..." : "",
           tz_adam_cpu_path_name(path), o->n, tz_dtype_name(o->gdt),
           o->has_copy ? tz_dtype_name(o->cdt) : "none");
    printf("  %zu bytes/param counted: read master 4 + grad %zu + m 4 + v 4, write master 4 + m 4 "
           "+ v 4 + copy %zu\n",
           bpp, tz_dtype_size(o->gdt), o->has_copy ? tz_dtype_size(o->cdt) : 0);
    printf("  ceiling: the same loads and stores with no arithmetic, same threads, interleaved; "
           "medians of %d (ratio: of the back-to-back pairs)\n",
           o->reps);
    printf("  %7s %10s %9s %14s %9s %7s\n", "threads", "Gparam/s", "GB/s", "ceiling GB/s",
           "Gparam/s", "ratio");
  }
  struct result last = {0};
  for (int t = 1; rc == 0; t = t * 2 > o->threads && t < o->threads ? o->threads : t * 2) {
    struct result r = {0};
    rc = measure(o, &a, t, &r);
    if (rc)
      break;
    double gp = (double)o->n / r.adam_s * 1e-9, cgp = (double)o->n / r.ceil_s * 1e-9;
    double ratio = r.ratio;
    if (o->json)
      printf("{\"bench\":\"adam\",\"device\":\"cpu\",\"path\":\"%s\",\"threads\":%d,\"n\":%zu,"
             "\"grad\":\"%s\",\"copy\":\"%s\",\"bytes_per_param\":%zu,\"seconds\":%.6f,"
             "\"gparams_per_s\":%.4f,\"gbps\":%.3f,\"ceiling\":%.3f,"
             "\"ceiling_gparams_per_s\":%.4f,\"ratio\":%.4f}\n",
             tz_adam_cpu_path_name(path), t, o->n, tz_dtype_name(o->gdt),
             o->has_copy ? tz_dtype_name(o->cdt) : "none", bpp, r.adam_s, gp, gp * (double)bpp,
             cgp * (double)bpp, cgp, ratio);
    else
      printf("  %7d %10.3f %9.2f %14.2f %9.3f %7.3f\n", t, gp, gp * (double)bpp, cgp * (double)bpp,
             cgp, ratio);
    fflush(stdout);
    last = r;
    if (t >= o->threads)
      break;
  }
  if (rc == 0 && !o->json)
    printf("  all %d threads: %.3f of the ceiling (target >= 0.90)%s\n", last.threads, last.ratio,
           last.ratio < 0.90 ? ": BELOW TARGET" : "");
  if (rc)
    fprintf(stderr, "tz-bench adam: %s\n", tz_err_msg());
  arrays_destroy(&a);
  return rc ? 1 : 0;
}

int tz_bench_adam(int argc, char **argv) {
  struct opts o = {.reps = 5,
                   .n = (size_t)64 << 20,
                   .gpu_n = (size_t)256 << 20,
                   .gdt = TZ_F32,
                   .cdt = TZ_BF16,
                   .has_copy = 1,
                   .path = TZ_ADAM_CPU_AUTO};
  int rc = parse(argc, argv, &o);
  if (rc) {
    free(o.cpus);
    return rc == 1 ? 0 : rc;
  }
  if (!o.cpus && (o.ncpus = affinity_cpus(&o.cpus)) < 0) {
    fprintf(stderr, "tz-bench adam: reading this process's cpu affinity: %s\n", strerror(errno));
    return 1;
  }
  if (!o.threads)
    o.threads = o.ncpus;
  rc = run_cpu(&o);
  if (rc == 0 && o.gpu) {
    if (tz_bench_adam_gpu) {
      rc = tz_bench_adam_gpu(o.gpu_n, o.gdt, o.has_copy, o.cdt, o.reps, o.json);
    } else {
      fprintf(stderr, "tz-bench adam: --gpu: this build has no CUDA\n");
      rc = 77;
    }
  }
  free(o.cpus);
  return rc;
}
