/* tz-bench tiers, the GPU rows. Each tier path is measured beside a raw baseline in the same run,
 * the two interleaved repetition by repetition, the median of each reported:
 * - host->hbm, hbm->host, and both at once: tz_transfer between a host extent and an hbm extent in
 *   chunks, every chunk in flight at once; raw: cudaMemcpyAsync of the same chunks between the
 *   same pinned and device buffers on one stream (two streams for both at once). Both at once
 *   also gives each direction's raw rate over its own time from a common start: how the link
 *   shares itself between the two (two GPUs offloading llama-7b got ~49 GB/s out and ~22 in).
 * - nvme->hbm and hbm->nvme, staged by the runtime through pinned chunks: raw is the same pipeline
 *   written out by hand (io_uring reads or writes of a file of its own into as many pinned buffers
 *   as the runtime has staging slots, each followed or preceded by cudaMemcpyAsync). Besides, the
 *   file's own rate (the I/O alone, as deep) and PCIe's (the copies alone, through the same
 *   buffers): the pipeline is held to min(file, PCIe). Once from tmpfs (a source faster than disk,
 *   often than PCIe) and once from the disk at --path. nvme checksums are off here: the pipeline
 *   itself is measured.
 * Targets (the ratio each row is held to): 0.95 of raw per direction and 0.90 both at once at
 * chunks of 4 MiB and more; 0.90 of min(file, PCIe) for the staged rows. */
#define _GNU_SOURCE
#include "bench/bench.h"
#include "core/error.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "tiers/hbm.h"
#include "util/clock.h"

#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#define MIN_CHUNK (1ull << 20)
#define MAX_CHUNK (64ull << 20)
#define TARGET_CHUNK (4ull << 20) /* targets apply from this chunk size up */
#define SLOTS 8                   /* staging chunks, and the raw pipeline's buffers */
#define WAIT_NS (300ll * 1000000000ll)
#define MAX_REPS 101
#define STAGED_MAX (1ull << 30)

enum { H2D = 1, D2H = 2, BOTH = 3 };

/* ---- output ---- */

struct row {
  const char *pair;   /* "host->hbm" */
  const char *op;     /* relative to hbm: write (into it), read (out of it), both */
  const char *medium; /* staged rows: "tmpfs" or "disk"; NULL otherwise */
  uint64_t chunk;
  double tier, raw;  /* GB/s, medians */
  double file, pcie; /* staged rows: the file's rate alone and PCIe's alone, GB/s */
  double target;     /* the ratio wanted; 0: none at this chunk size */
};

struct out {
  int json;
  int checked, met;
};

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void emit(struct out *o, const struct row *r) {
  double ratio = r->raw > 0 ? r->tier / r->raw : 0;
  double bound = r->medium ? (r->file < r->pcie ? r->file : r->pcie) : 0;
  double bratio = bound > 0 ? r->tier / bound : 0;
  double held = r->medium ? bratio : ratio;
  int ok = held >= r->target;
  if (r->target > 0) {
    o->checked++;
    o->met += ok;
  }
  if (o->json) {
    printf("{\"bench\":\"tiers\",\"pair\":\"%s\",\"block_bytes\":%llu,\"op\":\"%s\","
           "\"tier_gbps\":%.3f,\"raw_gbps\":%.3f,\"ratio\":%.4f",
           r->pair, (unsigned long long)r->chunk, r->op, r->tier, r->raw, ratio);
    if (r->medium)
      printf(",\"medium\":\"%s\",\"file_gbps\":%.3f,\"pcie_gbps\":%.3f,\"bound_gbps\":%.3f,"
             "\"bound_ratio\":%.4f",
             r->medium, r->file, r->pcie, bound, bratio);
    if (r->target > 0)
      printf(",\"target\":%.2f,\"met\":%s", r->target, ok ? "true" : "false");
    printf("}\n");
  } else {
    char pair[48], tgt[24] = "-", extra[64] = "";
    if (r->medium)
      snprintf(pair, sizeof pair, "%s (%s)", r->pair, r->medium);
    else
      snprintf(pair, sizeof pair, "%s", r->pair);
    if (r->target > 0)
      snprintf(tgt, sizeof tgt, ">= %.2f %s", r->target, ok ? "ok" : "MISSED");
    if (r->medium)
      snprintf(extra, sizeof extra, "%8.2f %8.2f %8.3f", r->file, r->pcie, bratio);
    else
      snprintf(extra, sizeof extra, "%8s %8s %8s", "-", "-", "-");
    printf("%-24s %4llu MiB %9.2f %9.2f %7.3f %s   %s\n", pair,
           (unsigned long long)(r->chunk >> 20), r->tier, r->raw, ratio, extra, tgt);
  }
  fflush(stdout);
}

static void header(const struct out *o) {
  if (!o->json)
    printf("%-24s %8s %9s %9s %7s %8s %8s %8s   %s\n", "pair", "chunk", "tier GB/s", "raw GB/s",
           "ratio", "file", "pcie", "tier/min", "target");
}

static double gbps(uint64_t bytes, double secs) {
  return secs > 0 ? (double)bytes / secs / 1e9 : 0;
}

static int cuda_check(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  cudaGetLastError();
  return tz_err_set(TZ_ECUDA, "tiers: %s: %s", what, cudaGetErrorString(e));
}
#define CU(call) TZ_CHECK(cuda_check((call), #call))

/* Waits on every fence of fs[0..n) and releases it; the first error wins. */
static int wait_all(tz_fence **fs, int n) {
  int rc = 0;
  for (int i = 0; i < n; i++) {
    int r = tz_fence_wait(fs[i], WAIT_NS);
    if (r < 0 && rc == 0)
      rc = r;
    tz_fence_release(fs[i]);
  }
  return rc;
}

/* ---- host <-> hbm ---- */

struct pcie {
  tz_runtime *rt;
  tz_tier *host, *hbm;
  tz_extent hs, hd, gs, gd; /* host source, host destination, GPU source, GPU destination */
  unsigned char *hsp, *hdp, *gsp, *gdp;
  cudaStream_t s1, s2;
  cudaEvent_t e0, e_in, e_out; /* both at once, raw: the start, and each direction's end */
  double in_s, out_s;          /* ... and each direction's seconds in the last such run */
  uint64_t size;
  tz_fence **f;
};

static int pcie_tier(struct pcie *b, int dirs, uint64_t chunk, double *secs) {
  uint64_t n = b->size / chunk;
  int k = 0, rc = 0;
  double t0 = tz_now_s();
  for (uint64_t i = 0; i < n && rc == 0; i++) {
    uint64_t off = i * chunk;
    if (dirs & H2D) {
      rc = tz_transfer(b->rt, &b->gs, off, &b->hs, off, chunk, &b->f[k]);
      k += rc == 0;
    }
    if ((dirs & D2H) && rc == 0) {
      rc = tz_transfer(b->rt, &b->hd, off, &b->gd, off, chunk, &b->f[k]);
      k += rc == 0;
    }
  }
  int w = wait_all(b->f, k);
  *secs = tz_now_s() - t0;
  return rc < 0 ? rc : w;
}

/* Both at once also times each direction from a common start (events on the two streams): the
 * one that ends first ran its whole time beside the other, so its rate is its share of the link
 * while both are busy. */
static int pcie_raw(struct pcie *b, int dirs, uint64_t chunk, double *secs) {
  uint64_t n = b->size / chunk;
  double t0 = tz_now_s();
  if (dirs == BOTH) {
    CU(cudaEventRecord(b->e0, b->s1));
    CU(cudaStreamWaitEvent(b->s2, b->e0, 0));
  }
  for (uint64_t i = 0; i < n; i++) {
    uint64_t off = i * chunk;
    if (dirs & H2D)
      CU(cudaMemcpyAsync(b->gsp + off, b->hsp + off, chunk, cudaMemcpyHostToDevice, b->s1));
    if (dirs & D2H)
      CU(cudaMemcpyAsync(b->hdp + off, b->gdp + off, chunk, cudaMemcpyDeviceToHost,
                         dirs == BOTH ? b->s2 : b->s1));
  }
  if (dirs == BOTH) {
    CU(cudaEventRecord(b->e_in, b->s1));
    CU(cudaEventRecord(b->e_out, b->s2));
  }
  CU(cudaStreamSynchronize(b->s1));
  CU(cudaStreamSynchronize(b->s2));
  *secs = tz_now_s() - t0;
  if (dirs == BOTH) {
    float in_ms = 0, out_ms = 0;
    CU(cudaEventElapsedTime(&in_ms, b->e0, b->e_in));
    CU(cudaEventElapsedTime(&out_ms, b->e0, b->e_out));
    b->in_s = in_ms * 1e-3;
    b->out_s = out_ms * 1e-3;
  }
  return 0;
}

static int pcie_rows(struct out *o, uint64_t size, int reps) {
  struct pcie b = {0};
  b.size = size;
  int rc;
  struct tz_tier_params p;
  TZ_CHECK_GOTO(tz_runtime_create(NULL, &b.rt), rc, done);
  tz_tier_params_init(&p);
  p.name = "bench-host";
  p.capacity = 2 * size;
  TZ_CHECK_GOTO(tz_tier_create(b.rt, "host", &p, &b.host), rc, done);
  tz_tier_params_init(&p);
  p.name = "bench-hbm";
  p.capacity = 2 * size;
  p.device = 0;
  TZ_CHECK_GOTO(tz_tier_create(b.rt, "hbm", &p, &b.hbm), rc, done);
  TZ_CHECK_GOTO(tz_tier_alloc(b.host, size, &b.hs), rc, done);
  TZ_CHECK_GOTO(tz_tier_alloc(b.host, size, &b.hd), rc, done);
  TZ_CHECK_GOTO(tz_tier_alloc(b.hbm, size, &b.gs), rc, done);
  TZ_CHECK_GOTO(tz_tier_alloc(b.hbm, size, &b.gd), rc, done);
  b.hsp = tz_tier_host_ptr(b.host, b.hs.offset);
  b.hdp = tz_tier_host_ptr(b.host, b.hd.offset);
  b.gsp = tz_tier_device_ptr(b.hbm, b.gs.offset);
  b.gdp = tz_tier_device_ptr(b.hbm, b.gd.offset);
  memset(b.hsp, 0x5a, size);
  TZ_CHECK_GOTO(cuda_check(cudaSetDevice(0), "cudaSetDevice"), rc, done);
  TZ_CHECK_GOTO(cuda_check(cudaStreamCreateWithFlags(&b.s1, cudaStreamNonBlocking), "stream"), rc,
                done);
  TZ_CHECK_GOTO(cuda_check(cudaStreamCreateWithFlags(&b.s2, cudaStreamNonBlocking), "stream"), rc,
                done);
  cudaEvent_t *ev[] = {&b.e0, &b.e_in, &b.e_out};
  for (int i = 0; i < 3; i++)
    TZ_CHECK_GOTO(cuda_check(cudaEventCreate(ev[i]), "event"), rc, done);
  b.f = calloc(2 * (size / MIN_CHUNK) + 2, sizeof *b.f);
  if (!b.f) {
    rc = tz_err_set(TZ_ENOMEM, "tiers: no memory");
    goto done;
  }
  struct tz_hbm_stats st;
  TZ_CHECK_GOTO(tz_hbm_stats(b.hbm, &st), rc, done);
  double spg = tz_hbm_pin_seconds_per_gib(b.hbm);
  if (o->json)
    printf("{\"bench\":\"tiers\",\"pair\":\"host-pin\",\"pinned_bytes\":%llu,"
           "\"seconds_per_gib\":%.4f}\n",
           (unsigned long long)st.pinned_bytes, spg);
  else
    printf("host memory page-locked for the GPU: %.3f GiB at %.3f s/GiB\n",
           (double)st.pinned_bytes / (1 << 30), spg);
  header(o);
  /* Warm-up, untimed: first touches of the copy paths, and the hbm tier's event pool grown to
   * the most fences these runs keep in flight (both directions in the smallest chunks). */
  double t;
  for (int d = H2D; d <= BOTH; d++) {
    TZ_CHECK_GOTO(pcie_tier(&b, d, MIN_CHUNK, &t), rc, done);
    TZ_CHECK_GOTO(pcie_raw(&b, d, MIN_CHUNK, &t), rc, done);
  }
  static const struct {
    int dirs;
    const char *pair, *op;
    double target;
  } kinds[] = {
      {H2D, "host->hbm", "write", 0.95},
      {D2H, "hbm->host", "read", 0.95},
      {BOTH, "host<->hbm", "both", 0.90},
  };
  for (uint64_t chunk = MIN_CHUNK; chunk <= MAX_CHUNK && chunk <= size; chunk *= 2) {
    double tier[3][MAX_REPS], raw[3][MAX_REPS], in_s[MAX_REPS], out_s[MAX_REPS];
    for (int r = 0; r < reps; r++)
      for (int k = 0; k < 3; k++) {
        /* Alternate which goes first, so that drift favours neither. */
        if (r % 2 == 0) {
          TZ_CHECK_GOTO(pcie_tier(&b, kinds[k].dirs, chunk, &tier[k][r]), rc, done);
          TZ_CHECK_GOTO(pcie_raw(&b, kinds[k].dirs, chunk, &raw[k][r]), rc, done);
        } else {
          TZ_CHECK_GOTO(pcie_raw(&b, kinds[k].dirs, chunk, &raw[k][r]), rc, done);
          TZ_CHECK_GOTO(pcie_tier(&b, kinds[k].dirs, chunk, &tier[k][r]), rc, done);
        }
        if (kinds[k].dirs == BOTH) {
          in_s[r] = b.in_s;
          out_s[r] = b.out_s;
        }
      }
    for (int k = 0; k < 3; k++) {
      uint64_t bytes = size / chunk * chunk * (kinds[k].dirs == BOTH ? 2 : 1);
      struct row row = {
          .pair = kinds[k].pair,
          .op = kinds[k].op,
          .chunk = chunk,
          .tier = gbps(bytes, tz_bench_median(tier[k], reps)),
          .raw = gbps(bytes, tz_bench_median(raw[k], reps)),
          .target = chunk >= TARGET_CHUNK ? kinds[k].target : 0,
      };
      emit(o, &row);
    }
    uint64_t one = size / chunk * chunk;
    double gin = gbps(one, tz_bench_median(in_s, reps));
    double gout = gbps(one, tz_bench_median(out_s, reps));
    if (o->json)
      printf("{\"bench\":\"tiers\",\"pair\":\"host<->hbm\",\"block_bytes\":%llu,"
             "\"op\":\"both-split\",\"in_gbps\":%.3f,\"out_gbps\":%.3f}\n",
             (unsigned long long)chunk, gin, gout);
    else
      printf("%-24s %4llu MiB  raw, each direction over its own time: in %.2f, out %.2f GB/s\n",
             "  both at once", (unsigned long long)(chunk >> 20), gin, gout);
  }
  rc = 0;
done:
  if (b.e0)
    cudaEventDestroy(b.e0);
  if (b.e_in)
    cudaEventDestroy(b.e_in);
  if (b.e_out)
    cudaEventDestroy(b.e_out);
  if (b.s1)
    cudaStreamDestroy(b.s1);
  if (b.s2)
    cudaStreamDestroy(b.s2);
  free(b.f);
  tz_runtime_destroy(b.rt);
  return rc;
}

/* ---- nvme <-> hbm, staged ---- */

struct staged {
  tz_runtime *rt;
  tz_tier *nvme, *hbm, *bounce;
  tz_extent nx, gx, bx;
  unsigned char *buf; /* SLOTS pinned buffers of chunk bytes: the bounce tier's extent */
  unsigned char *dev; /* the hbm extent */
  uint64_t chunk, n;  /* n chunks per repetition */
  int fd;             /* the raw pipeline's file */
  struct io_uring ring;
  int ring_ok, fixed;
  cudaStream_t s;
  cudaEvent_t ev[SLOTS];
  int n_ev;
};

enum { FREE, IO, COPY };

static int io_submit_one(struct staged *b, int slot, int write, uint64_t idx, uint32_t done) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
  if (!sqe)
    return tz_err_set(TZ_EIO, "tiers: io_uring has no free entry");
  unsigned char *p = b->buf + (uint64_t)slot * b->chunk + done;
  unsigned len = (unsigned)(b->chunk - done);
  uint64_t off = idx * b->chunk + done;
  if (b->fixed && write)
    io_uring_prep_write_fixed(sqe, b->fd, p, len, off, slot);
  else if (b->fixed)
    io_uring_prep_read_fixed(sqe, b->fd, p, len, off, slot);
  else if (write)
    io_uring_prep_write(sqe, b->fd, p, len, off);
  else
    io_uring_prep_read(sqe, b->fd, p, len, off);
  io_uring_sqe_set_data(sqe, (void *)(uintptr_t)slot);
  return 0;
}

static int copy_start(struct staged *b, int slot, int to_gpu, uint64_t idx) {
  unsigned char *h = b->buf + (uint64_t)slot * b->chunk, *d = b->dev + idx * b->chunk;
  if (to_gpu)
    CU(cudaMemcpyAsync(d, h, b->chunk, cudaMemcpyHostToDevice, b->s));
  else
    CU(cudaMemcpyAsync(h, d, b->chunk, cudaMemcpyDeviceToHost, b->s));
  CU(cudaEventRecord(b->ev[slot], b->s));
  return 0;
}

/* The raw pipeline. to_gpu: file -> pinned buffer -> GPU; else GPU -> pinned buffer -> file.
 * io and copy say which stages run: both (the baseline), io alone (the file's rate at the same
 * depth), copy alone (PCIe through the same buffers). One thread, spinning: nothing in between. */
static int raw_pipe(struct staged *b, int to_gpu, int io, int copy, double *secs) {
  int state[SLOTS] = {0}, slots = b->n < SLOTS ? (int)b->n : SLOTS;
  uint64_t idx[SLOTS] = {0};
  uint32_t got[SLOTS] = {0};
  uint64_t next = 0, finished = 0;
  double t0 = tz_now_s();
  while (finished < b->n) {
    int submit = 0;
    for (int s = 0; s < slots; s++) {
      if (state[s] != FREE || next == b->n)
        continue;
      idx[s] = next++;
      got[s] = 0;
      int first_io = to_gpu ? io : !copy;
      if (first_io) {
        TZ_CHECK(io_submit_one(b, s, !to_gpu, idx[s], 0));
        state[s] = IO;
        submit = 1;
      } else {
        TZ_CHECK(copy_start(b, s, to_gpu, idx[s]));
        state[s] = COPY;
      }
    }
    if (submit) {
      int r = io_uring_submit(&b->ring);
      if (r < 0)
        return tz_err_set(TZ_EIO, "tiers: io_uring_submit: %s", strerror(-r));
    }
    struct io_uring_cqe *cqe;
    submit = 0;
    while (io_uring_peek_cqe(&b->ring, &cqe) == 0) {
      int s = (int)(uintptr_t)io_uring_cqe_get_data(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(&b->ring, cqe);
      if (res < 0 && res != -EAGAIN && res != -EINTR)
        return tz_err_set(TZ_EIO, "tiers: %s of chunk %llu: %s", to_gpu ? "read" : "write",
                          (unsigned long long)idx[s], strerror(-res));
      if (res == 0)
        return tz_err_set(TZ_EIO, "tiers: %s of chunk %llu made no progress",
                          to_gpu ? "read" : "write", (unsigned long long)idx[s]);
      if (res > 0)
        got[s] += (uint32_t)res;
      if (got[s] < b->chunk) { /* short, or -EAGAIN: the rest again */
        TZ_CHECK(io_submit_one(b, s, !to_gpu, idx[s], got[s]));
        submit = 1;
        continue;
      }
      if (to_gpu && copy) {
        TZ_CHECK(copy_start(b, s, 1, idx[s]));
        state[s] = COPY;
      } else {
        state[s] = FREE;
        finished++;
      }
    }
    for (int s = 0; s < slots; s++) {
      if (state[s] != COPY)
        continue;
      cudaError_t q = cudaEventQuery(b->ev[s]);
      if (q == cudaErrorNotReady)
        continue;
      CU(q);
      if (!to_gpu && io) {
        TZ_CHECK(io_submit_one(b, s, 1, idx[s], 0));
        state[s] = IO;
        submit = 1;
      } else {
        state[s] = FREE;
        finished++;
      }
    }
    if (submit) {
      int r = io_uring_submit(&b->ring);
      if (r < 0)
        return tz_err_set(TZ_EIO, "tiers: io_uring_submit: %s", strerror(-r));
    }
  }
  *secs = tz_now_s() - t0;
  return 0;
}

/* The tier path: the runtime stages it. A few transfers at once, so that every staging slot is
 * busy (each transfer keeps up to 4 chunks in flight). */
static int tier_staged(struct staged *b, int to_gpu, double *secs) {
  int t = b->n < SLOTS ? (int)b->n : SLOTS;
  tz_fence *f[SLOTS];
  int k = 0, rc = 0;
  double t0 = tz_now_s();
  for (int j = 0; j < t && rc == 0; j++) {
    uint64_t c0 = b->n * (uint64_t)j / (uint64_t)t, c1 = b->n * (uint64_t)(j + 1) / (uint64_t)t;
    uint64_t off = c0 * b->chunk, len = (c1 - c0) * b->chunk;
    rc = to_gpu ? tz_transfer(b->rt, &b->gx, off, &b->nx, off, len, &f[k])
                : tz_transfer(b->rt, &b->nx, off, &b->gx, off, len, &f[k]);
    k += rc == 0;
  }
  int w = wait_all(f, k);
  *secs = tz_now_s() - t0;
  return rc < 0 ? rc : w;
}

static void staged_close(struct staged *b) {
  for (int i = 0; i < b->n_ev; i++)
    cudaEventDestroy(b->ev[i]);
  if (b->s)
    cudaStreamDestroy(b->s);
  if (b->ring_ok)
    io_uring_queue_exit(&b->ring);
  tz_runtime_destroy(b->rt);
  memset(b, 0, sizeof *b);
  b->fd = -1;
}

static int staged_open(struct staged *b, const char *dir, int fd, uint64_t chunk, uint64_t n) {
  memset(b, 0, sizeof *b);
  b->fd = fd;
  b->chunk = chunk;
  b->n = n;
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = chunk;
  rp.staging_bytes = SLOTS * chunk;
  TZ_CHECK(tz_runtime_create(&rp, &b->rt));
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.name = "bench-bounce";
  p.capacity = SLOTS * chunk;
  TZ_CHECK(tz_tier_create(b->rt, "host", &p, &b->bounce));
  tz_tier_params_init(&p);
  p.name = "bench-hbm";
  p.capacity = n * chunk;
  p.device = 0;
  TZ_CHECK(tz_tier_create(b->rt, "hbm", &p, &b->hbm));
  tz_tier_params_init(&p);
  p.name = "bench-nvme";
  p.capacity = n * chunk;
  p.paths[0] = dir;
  p.n_paths = 1;
  p.checksum = 0;
  TZ_CHECK(tz_tier_create(b->rt, "nvme", &p, &b->nvme));
  TZ_CHECK(tz_tier_alloc(b->bounce, SLOTS * chunk, &b->bx));
  TZ_CHECK(tz_tier_alloc(b->hbm, n * chunk, &b->gx));
  TZ_CHECK(tz_tier_alloc(b->nvme, n * chunk, &b->nx));
  b->buf = tz_tier_host_ptr(b->bounce, b->bx.offset);
  b->dev = tz_tier_device_ptr(b->hbm, b->gx.offset);
  CU(cudaSetDevice(0));
  CU(cudaStreamCreateWithFlags(&b->s, cudaStreamNonBlocking));
  for (; b->n_ev < SLOTS; b->n_ev++)
    CU(cudaEventCreateWithFlags(&b->ev[b->n_ev], cudaEventDisableTiming));
  int r = io_uring_queue_init(2 * SLOTS, &b->ring, 0);
  if (r < 0)
    return tz_err_set(TZ_EIO, "tiers: io_uring_queue_init: %s", strerror(-r));
  b->ring_ok = 1;
  struct iovec iov[SLOTS];
  for (int i = 0; i < SLOTS; i++)
    iov[i] = (struct iovec){b->buf + (uint64_t)i * chunk, chunk};
  b->fixed = io_uring_register_buffers(&b->ring, iov, SLOTS) == 0;
  /* Real bytes on the GPU, then in the tier's file: an extent never written reads as holes,
   * which the disk never serves. The file is written by the tier's own staged path (warm-up). */
  CU(cudaMemset(b->dev, 0x3c, n * chunk));
  CU(cudaDeviceSynchronize());
  double t;
  TZ_CHECK(tier_staged(b, 0, &t));
  return 0;
}

/* The raw pipeline's file: size bytes written once, O_DIRECT where the filesystem has it. */
static int raw_file(const char *dir, uint64_t size, char *path, size_t len, int *direct) {
  snprintf(path, len, "%s/tz-bench-raw-%d.bin", dir, (int)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_DIRECT, 0600);
  *direct = fd >= 0;
  if (fd < 0 && errno == EINVAL)
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return tz_err_errno(errno, "tiers: cannot create %s", path);
  const size_t piece = 4 << 20;
  void *buf = NULL;
  if (posix_memalign(&buf, 4096, piece) != 0) {
    close(fd);
    unlink(path);
    return tz_err_set(TZ_ENOMEM, "tiers: no memory");
  }
  memset(buf, 0xa7, piece);
  for (uint64_t off = 0; off < size; off += piece) {
    size_t n = size - off < piece ? (size_t)(size - off) : piece;
    if (pwrite(fd, buf, n, (off_t)off) != (ssize_t)n) {
      int e = errno;
      free(buf);
      close(fd);
      unlink(path);
      return tz_err_errno(e ? e : EIO, "tiers: cannot write %s at %llu", path,
                          (unsigned long long)off);
    }
  }
  free(buf);
  if (fsync(fd) != 0) {
    int e = errno;
    close(fd);
    unlink(path);
    return tz_err_errno(e, "tiers: fsync %s", path);
  }
  return fd;
}

static int staged_rows(struct out *o, const char *dir, const char *medium, uint64_t size,
                       int reps) {
  char path[4096];
  int direct;
  uint64_t total = size / MAX_CHUNK * MAX_CHUNK;
  if (total == 0)
    total = size / MIN_CHUNK * MIN_CHUNK;
  int fd = raw_file(dir, total, path, sizeof path, &direct);
  if (fd < 0)
    return fd;
  if (!o->json)
    printf("staged through pinned chunks, %s at %s (%s)\n", medium, dir,
           direct ? "O_DIRECT" : "buffered: no O_DIRECT here");
  header(o);
  int rc = 0;
  struct staged b;
  memset(&b, 0, sizeof b);
  for (uint64_t chunk = MIN_CHUNK; chunk <= MAX_CHUNK && chunk <= total && rc == 0; chunk *= 2) {
    rc = staged_open(&b, dir, fd, chunk, total / chunk);
    if (rc < 0)
      break;
    /* [0] tier, [1] raw, [2] file alone, [3] PCIe alone; for each direction. */
    double in[4][MAX_REPS], out_[4][MAX_REPS];
    for (int r = 0; r < reps && rc == 0; r++) {
      int first_raw = r % 2;
      if (first_raw)
        rc = raw_pipe(&b, 1, 1, 1, &in[1][r]);
      if (rc == 0)
        rc = tier_staged(&b, 1, &in[0][r]);
      if (rc == 0 && !first_raw)
        rc = raw_pipe(&b, 1, 1, 1, &in[1][r]);
      if (rc == 0)
        rc = raw_pipe(&b, 1, 1, 0, &in[2][r]);
      if (rc == 0)
        rc = raw_pipe(&b, 1, 0, 1, &in[3][r]);
      if (rc == 0 && first_raw)
        rc = raw_pipe(&b, 0, 1, 1, &out_[1][r]);
      if (rc == 0)
        rc = tier_staged(&b, 0, &out_[0][r]);
      if (rc == 0 && !first_raw)
        rc = raw_pipe(&b, 0, 1, 1, &out_[1][r]);
      if (rc == 0)
        rc = raw_pipe(&b, 0, 1, 0, &out_[2][r]);
      if (rc == 0)
        rc = raw_pipe(&b, 0, 0, 1, &out_[3][r]);
    }
    if (rc == 0) {
      double m[2][4];
      for (int i = 0; i < 4; i++) {
        m[0][i] = gbps(total, tz_bench_median(in[i], reps));
        m[1][i] = gbps(total, tz_bench_median(out_[i], reps));
      }
      struct row ri = {"nvme->hbm", "write", medium,  chunk, m[0][0],
                       m[0][1],     m[0][2], m[0][3], 0.90};
      struct row ro = {"hbm->nvme", "read",  medium,  chunk, m[1][0],
                       m[1][1],     m[1][2], m[1][3], 0.90};
      emit(o, &ri);
      emit(o, &ro);
    }
    staged_close(&b);
  }
  if (rc < 0)
    staged_close(&b);
  close(fd);
  unlink(path);
  return rc;
}

int tz_bench_tiers_gpu(const struct tz_bench_tiers_opts *opts) {
  char why[256];
  if (tz_tier_probe("hbm", why, sizeof why) < 0) {
    fprintf(stderr, "tiers: no GPU rows: %s\n", why);
    return 77;
  }
  uint64_t size = opts->size ? opts->size : 1ull << 30;
  int reps = opts->reps > 5 ? opts->reps : 5; /* a median of at least 5 */
  if (reps > MAX_REPS)
    reps = MAX_REPS;
  if (size < MIN_CHUNK) {
    fprintf(stderr, "tiers: size %llu is below the smallest chunk (1 MiB)\n",
            (unsigned long long)size);
    return 2;
  }
  size = size / MIN_CHUNK * MIN_CHUNK;
  struct out o = {.json = opts->json};
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    snprintf(prop.name, sizeof prop.name, "?");
  }
  int gds = tz_hbm_gds_usable(why, sizeof why);
  if (o.json) {
    printf("{\"bench\":\"tiers\",\"pair\":\"gpu\",\"device\":");
    json_str(prop.name);
    printf(",\"bytes_per_rep\":%llu,\"reps\":%d,\"gds\":%s,\"gds_why\":", (unsigned long long)size,
           reps, gds ? "true" : "false");
    json_str(why);
    printf("}\n");
  } else {
    printf("GPU 0 (%s): %.3f GiB per repetition, median of %d, tier and raw interleaved\n",
           prop.name, (double)size / (1 << 30), reps);
    printf("GPUDirect Storage %s (%s): nvme<->hbm is staged through pinned host memory\n",
           gds ? "available" : "not usable", why);
  }
  int rc = pcie_rows(&o, size, reps);
  /* Staged rows move at most 1 GiB per measurement: ten measurements per chunk size and
   * repetition, against a disk, add up. */
  uint64_t staged = size < STAGED_MAX ? size : STAGED_MAX;
  if (rc == 0 && access("/dev/shm", W_OK) == 0)
    rc = staged_rows(&o, "/dev/shm", "tmpfs", staged, reps);
  else if (rc == 0 && !o.json)
    printf("no writable /dev/shm: the tmpfs rows are left out\n");
  if (rc == 0 && opts->path)
    rc = staged_rows(&o, opts->path, "disk", staged, reps);
  else if (rc == 0 && !o.json)
    printf("no --path: the disk rows are left out\n");
  if (rc < 0) {
    fprintf(stderr, "tiers: %s\n", tz_err_msg());
    return 1;
  }
  if (o.json)
    printf("{\"bench\":\"tiers\",\"pair\":\"gpu-targets\",\"checked\":%d,\"met\":%d}\n", o.checked,
           o.met);
  else
    printf("targets met: %d of %d\n", o.met, o.checked);
  return 0;
}
