/* hbm: one GPU's memory. One cudaMalloc arena per tier, allocated at creation; extents are carved
 * from it by the tier registry, so the steady state makes no cudaMalloc.
 *
 * Lanes: a non-blocking copy stream per direction (host->GPU, GPU->host) and one for GPU->GPU.
 * Every copy records a CUDA event from a pool made at creation (no cudaEventCreate in the steady
 * state; the pool grows, counted, only if more copies are in flight than it holds). The event is
 * the copy's fence: the progress engine polls it, and a compute stream waits on it with
 * cudaStreamWaitEvent (tz_hbm_stream_wait), never on the host. An event returns to the pool when
 * its fence is released.
 *
 * Host arenas (host tiers, the runtime's staging) are page-locked for the GPU through the
 * register_host hook, in pieces of at most 64 GiB, timed. A copy that crosses a piece boundary is
 * split there, since each piece is its own registration. Copies from pageable memory work (the
 * driver stages them) but are counted and reported once: that is the slow path.
 *
 * nvme<->hbm has no direct path here: the runtime stages it through pinned host chunks. Whether
 * GPUDirect Storage could be used is detected once and logged (tz_hbm_gds_usable). */
#define _GNU_SOURCE
#include "tiers/hbm.h"
#include "tiers/hbm_impl.h"
#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "core/settings.h"
#include "core/tier_impl.h"
#include "util/clock.h"
#include "util/gpu.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <numaif.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EVENTS_AT_INIT 256
#define EVENTS_GROW 64
#define PIN_PIECE (64ull << 30) /* cudaHostRegister takes at most this much at once */
#define MAX_ARENAS 64
#define PAGE 4096ull
/* How long an event seen pending stands for the later ones of its stream (see event_poll). */
#define HINT_NS 5000ull

struct hbm;

/* A copy stream. Its events are numbered in the order they are recorded on it; a stream runs in
 * order, so once event k has completed every event before k has too, and while k is pending so is
 * every event after it. The progress engine polls each copy's fence; with this it calls
 * cudaEventQuery about once per stream and round instead of once per copy in flight. */
struct lane {
  cudaStream_t s;
  pthread_mutex_t mu; /* numbers and records together, so numbers follow the stream's order */
  uint64_t next_seq;  /* under mu */
  uint64_t done_seq;  /* atomic: every event numbered up to it has completed */
  uint64_t hint_seq;  /* atomic: an event seen pending at hint_ns */
  uint64_t hint_ns;   /* atomic */
};
enum { LANE_H2D, LANE_D2H, LANE_D2D, N_LANES };

/* One pooled event; the ctx of the polled fence of one copy. */
struct hbm_event {
  cudaEvent_t ev;
  struct hbm *h;
  struct hbm_event *next_free;
  struct lane *lane;
  uint64_t seq;     /* its number on the lane */
  const char *what; /* for the error message: which copy this event ends */
  uint64_t off, n;
};

struct event_block {
  struct event_block *next;
  int n;
  struct hbm_event ev[];
};

/* A host arena this GPU knows, for telling pinned from pageable buffers and splitting copies at
 * registration pieces. */
struct arena {
  unsigned char *base;
  uint64_t bytes;
  uint64_t piece; /* registrations cover [base + k*piece, +piece); 0: one registration */
  int pinned;     /* 0: page-locking failed, copies from it take the slow path */
  int ref;        /* holds a reference in the process's pin table */
};

struct hbm {
  int refs; /* atomic: one for the tier, one per event out of the pool */
  int device;
  char name[48];
  unsigned char *base; /* the arena: capacity bytes of device memory */
  uint64_t bytes;
  struct lane lanes[N_LANES]; /* host->GPU, GPU->host, GPU->GPU */
  tz_progress *pe;
  int host_numa;
  uint64_t pin_piece;
  pthread_mutex_t ev_mu; /* the event pool */
  struct hbm_event *free_events;
  struct event_block *blocks;
  uint64_t events_at_init, events_created, events_in_use;
  pthread_mutex_t reg_mu; /* arenas and pin figures */
  struct arena arenas[MAX_ARENAS];
  int n_arenas;
  uint64_t pinned_bytes;
  double pin_seconds;
  uint64_t h2d_copies, d2h_copies, d2d_copies, pageable_copies; /* atomic */
  uint64_t stream_waits, waits_done;                            /* atomic */
  int warned_pageable;                                          /* atomic */
};

/* Sets the thread's message from a failed CUDA call and clears the runtime's last error, so it
 * does not resurface in an unrelated call on this thread. */
static int cuda_fail(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cuda_fail(cudaError_t e, const char *fmt, ...) {
  char what[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  cudaGetLastError();
  int rc = e == cudaErrorMemoryAllocation ? TZ_ENOMEM : TZ_ECUDA;
  return tz_err_set(rc, "%s: %s", what, cudaGetErrorString(e));
}

/* Runtime-API calls that allocate act on the calling thread's current device; callers of the tier
 * keep theirs. Copies and event records need no current device (a copy may go to any device's
 * stream; an event is recorded on a stream of its own device). */
static int device_enter(const struct hbm *h, int *prev) {
  if (cudaGetDevice(prev) != cudaSuccess) {
    cudaGetLastError();
    *prev = -1;
  }
  cudaError_t e = cudaSetDevice(h->device);
  return e == cudaSuccess ? 0 : cuda_fail(e, "%s: cudaSetDevice(%d)", h->name, h->device);
}

static void device_leave(int prev) {
  if (prev >= 0)
    cudaSetDevice(prev);
}

/* ---- the event pool ---- */

static void hbm_free(struct hbm *h) {
  for (struct event_block *b = h->blocks, *n; b; b = n) {
    n = b->next;
    for (int i = 0; i < b->n; i++)
      cudaEventDestroy(b->ev[i].ev);
    free(b);
  }
  pthread_mutex_destroy(&h->ev_mu);
  pthread_mutex_destroy(&h->reg_mu);
  for (int i = 0; i < N_LANES; i++)
    pthread_mutex_destroy(&h->lanes[i].mu);
  free(h);
}

/* Fences may outlive the tier (a caller releases one late): the struct, holding the events, goes
 * with its last reference; the arena and the streams go with the tier. */
static void hbm_unref(struct hbm *h) {
  if (__atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0)
    hbm_free(h);
}

/* Adds n events to the pool. Called at creation, or with ev_mu held. */
static int events_grow(struct hbm *h, int n) {
  struct event_block *b = calloc(1, sizeof *b + (size_t)n * sizeof b->ev[0]);
  if (!b)
    return tz_err_set(TZ_ENOMEM, "%s: no memory for %d events", h->name, n);
  int prev, rc = device_enter(h, &prev);
  for (int i = 0; i < n && rc == 0; i++) {
    cudaError_t e = cudaEventCreateWithFlags(&b->ev[i].ev, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      rc = cuda_fail(e, "%s: cudaEventCreate on GPU %d", h->name, h->device);
      for (int j = 0; j < i; j++)
        cudaEventDestroy(b->ev[j].ev);
    }
  }
  device_leave(prev);
  if (rc < 0) {
    free(b);
    return rc;
  }
  b->n = n;
  for (int i = 0; i < n; i++) {
    b->ev[i].h = h;
    b->ev[i].next_free = i + 1 < n ? &b->ev[i + 1] : h->free_events;
  }
  h->free_events = &b->ev[0];
  b->next = h->blocks;
  h->blocks = b;
  h->events_created += (uint64_t)n;
  return 0;
}

static int event_get(struct hbm *h, struct hbm_event **out) {
  pthread_mutex_lock(&h->ev_mu);
  if (!h->free_events) {
    int rc = events_grow(h, EVENTS_GROW);
    if (rc < 0) {
      pthread_mutex_unlock(&h->ev_mu);
      return rc;
    }
    TZ_DEBUG("%s: event pool grown to %llu (more copies in flight than it held)", h->name,
             (unsigned long long)h->events_created);
  }
  struct hbm_event *e = h->free_events;
  h->free_events = e->next_free;
  h->events_in_use++;
  pthread_mutex_unlock(&h->ev_mu);
  __atomic_add_fetch(&h->refs, 1, __ATOMIC_ACQ_REL);
  *out = e;
  return 0;
}

/* The fence's destroy: its event goes back to the pool. */
static void event_put(void *ctx) {
  struct hbm_event *e = ctx;
  struct hbm *h = e->h;
  pthread_mutex_lock(&h->ev_mu);
  e->next_free = h->free_events;
  h->free_events = e;
  h->events_in_use--;
  pthread_mutex_unlock(&h->ev_mu);
  hbm_unref(h);
}

/* Only the progress engine polls. A stale hint costs a delay of at most HINT_NS, never a wrong
 * answer: an event is reported complete only by the driver, or after a later one of its stream. */
static int event_poll(void *ctx) {
  struct hbm_event *e = ctx;
  struct lane *l = e->lane;
  uint64_t done = __atomic_load_n(&l->done_seq, __ATOMIC_ACQUIRE);
  if (e->seq <= done)
    return 1;
  uint64_t hint = __atomic_load_n(&l->hint_seq, __ATOMIC_RELAXED);
  uint64_t t = tz_now_ns();
  int fresh = hint > done && t - __atomic_load_n(&l->hint_ns, __ATOMIC_RELAXED) < HINT_NS;
  if (fresh && e->seq > hint)
    return 0;
  cudaError_t r = cudaEventQuery(e->ev);
  if (r == cudaSuccess) {
    uint64_t d = done;
    while (d < e->seq && !__atomic_compare_exchange_n(&l->done_seq, &d, e->seq, 0, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_ACQUIRE))
      ;
    return 1;
  }
  if (r == cudaErrorNotReady) {
    if (!fresh || e->seq < hint) {
      __atomic_store_n(&l->hint_seq, e->seq, __ATOMIC_RELAXED);
      __atomic_store_n(&l->hint_ns, t, __ATOMIC_RELAXED);
    }
    return 0;
  }
  return cuda_fail(r, "%s: %s of %llu bytes at offset %llu on GPU %d failed", e->h->name, e->what,
                   (unsigned long long)e->n, (unsigned long long)e->off, e->h->device);
}

static const struct tz_fence_poll_ops cuda_event_ops = {
    .kind = "cuda-event",
    .poll = event_poll,
    .destroy = event_put,
};

/* Ends a copy enqueued on lane l with a pooled event and hands out its fence. On failure the
 * copies already enqueued are drained first: the caller may reuse its buffer once we return. */
static int record(struct hbm *h, struct lane *l, const char *what, uint64_t off, uint64_t n,
                  tz_fence **done) {
  cudaStream_t s = l->s;
  struct hbm_event *e;
  int rc = event_get(h, &e);
  if (rc < 0) {
    cudaStreamSynchronize(s);
    return rc;
  }
  e->what = what;
  e->off = off;
  e->n = n;
  e->lane = l;
  pthread_mutex_lock(&l->mu);
  e->seq = ++l->next_seq;
  cudaError_t r = cudaEventRecord(e->ev, s);
  pthread_mutex_unlock(&l->mu);
  if (r != cudaSuccess) {
    rc = cuda_fail(r, "%s: cudaEventRecord after the %s at offset %llu", h->name, what,
                   (unsigned long long)off);
    cudaStreamSynchronize(s);
    event_put(e);
    return rc;
  }
  tz_fence *f = tz_fence_create_polled(h->pe, &cuda_event_ops, e);
  if (!f) {
    cudaStreamSynchronize(s);
    event_put(e);
    return tz_err_set(TZ_ENOMEM, "%s: no memory for a fence", h->name);
  }
  *done = f;
  return 0;
}

/* ---- page-locking host arenas ---- */

/* Page-locking is per process (cudaHostRegisterPortable: every GPU's context sees it) and a range
 * can be registered only once, so hbm tiers of several GPUs in one process share a registration,
 * counted here. */
struct pin {
  unsigned char *base;
  uint64_t bytes, piece;
  int refs;
  struct pin *next;
};
static pthread_mutex_t pins_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pin *pins;

static void unregister_pieces(unsigned char *base, uint64_t bytes, uint64_t piece) {
  for (uint64_t o = 0; o < bytes; o += piece)
    if (cudaHostUnregister(base + o) != cudaSuccess)
      cudaGetLastError();
}

/* 1: page-locked, with a reference in the pin table (*secs > 0 when this call did the work);
 * 2: already page-locked by someone else (no reference); 0: could not be page-locked (warned);
 * negative: out of memory. */
static int pin_acquire(struct hbm *h, unsigned char *base, uint64_t bytes, uint64_t *piece,
                       double *secs) {
  *secs = 0;
  pthread_mutex_lock(&pins_mu);
  for (struct pin *p = pins; p; p = p->next)
    if (p->base == base) {
      p->refs++;
      *piece = p->piece;
      pthread_mutex_unlock(&pins_mu);
      return 1;
    }
  struct pin *p = calloc(1, sizeof *p);
  if (!p) {
    pthread_mutex_unlock(&pins_mu);
    return tz_err_set(TZ_ENOMEM, "%s: no memory", h->name);
  }
  /* Whole pages: host arenas are mappings, so the last page is theirs. */
  uint64_t len = bytes;
  if ((uintptr_t)base % PAGE == 0)
    len = (bytes + PAGE - 1) & ~(PAGE - 1);
  double t0 = tz_now_s();
  uint64_t done = 0;
  cudaError_t e = cudaSuccess;
  while (done < len) {
    uint64_t n = len - done < h->pin_piece ? len - done : h->pin_piece;
    e = cudaHostRegister(base + done, n, cudaHostRegisterPortable);
    if (e != cudaSuccess)
      break;
    done += n;
  }
  *secs = tz_now_s() - t0;
  if (e == cudaErrorHostMemoryAlreadyRegistered && done == 0) {
    cudaGetLastError();
    free(p);
    pthread_mutex_unlock(&pins_mu);
    TZ_DEBUG("%s: host memory at %p is page-locked already (by its owner)", h->name, (void *)base);
    *secs = 0;
    *piece = 0;
    return 2;
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    unregister_pieces(base, done, h->pin_piece);
    free(p);
    pthread_mutex_unlock(&pins_mu);
    TZ_WARN("%s: cannot page-lock %.3f GiB of host memory at %p (cudaHostRegister at +%llu: %s); "
            "copies from it take the slow pageable path",
            h->name, (double)len / (1 << 30), (void *)base, (unsigned long long)done,
            cudaGetErrorString(e));
    *secs = 0;
    return 0;
  }
  *p = (struct pin){base, len, h->pin_piece, 1, pins};
  pins = p;
  pthread_mutex_unlock(&pins_mu);
  *piece = h->pin_piece;
  return 1;
}

static void pin_release(unsigned char *base) {
  pthread_mutex_lock(&pins_mu);
  for (struct pin **pp = &pins; *pp; pp = &(*pp)->next) {
    struct pin *p = *pp;
    if (p->base != base)
      continue;
    if (--p->refs == 0) {
      unregister_pieces(p->base, p->bytes, p->piece);
      *pp = p->next;
      free(p);
    }
    break;
  }
  pthread_mutex_unlock(&pins_mu);
}

static void check_numa(struct hbm *h, void *base, uint64_t bytes) {
  int node = -1;
  if (h->host_numa < 0 || get_mempolicy(&node, NULL, 0, base, MPOL_F_NODE | MPOL_F_ADDR) != 0)
    return;
  if (node != h->host_numa)
    TZ_WARN("%s: %.3f GiB of host memory at %p is on NUMA node %d, but GPU %d is attached to node "
            "%d: its copies cross the link between sockets (create the host tier with numa_node "
            "%d, as tz-topo advises)",
            h->name, (double)bytes / (1 << 30), base, node, h->device, h->host_numa, h->host_numa);
}

static int hbm_register_host(tz_tier *t, void *base, uint64_t bytes) {
  struct hbm *h = t->ctx;
  pthread_mutex_lock(&h->reg_mu);
  int full = h->n_arenas == MAX_ARENAS;
  pthread_mutex_unlock(&h->reg_mu);
  if (full) {
    TZ_WARN("%s: more than %d host arenas; the one at %p stays pageable for this GPU", h->name,
            MAX_ARENAS, base);
    return 0;
  }
  check_numa(h, base, bytes);
  uint64_t piece = 0;
  double secs;
  int prev;
  TZ_CHECK(device_enter(h, &prev));
  int rc = pin_acquire(h, base, bytes, &piece, &secs);
  device_leave(prev);
  if (rc < 0)
    return rc;
  pthread_mutex_lock(&h->reg_mu);
  h->arenas[h->n_arenas++] = (struct arena){base, bytes, piece, rc > 0, rc == 1};
  if (secs > 0) {
    h->pinned_bytes += bytes;
    h->pin_seconds += secs;
  }
  pthread_mutex_unlock(&h->reg_mu);
  if (secs > 0) {
    double gib = (double)bytes / (1 << 30);
    TZ_INFO("%s: pinned %.3f GiB in %.3f s (%.3f s/GiB)", h->name, gib, secs, secs / gib);
  }
  return 0;
}

static void hbm_unregister_host(tz_tier *t, void *base) {
  struct hbm *h = t->ctx;
  /* Nothing may still be copying from or into it. */
  cudaStreamSynchronize(h->lanes[LANE_H2D].s);
  cudaStreamSynchronize(h->lanes[LANE_D2H].s);
  struct arena a = {0};
  pthread_mutex_lock(&h->reg_mu);
  for (int i = 0; i < h->n_arenas; i++)
    if (h->arenas[i].base == base) {
      a = h->arenas[i];
      h->arenas[i] = h->arenas[--h->n_arenas];
      break;
    }
  pthread_mutex_unlock(&h->reg_mu);
  if (a.ref)
    pin_release(a.base);
}

/* 1 when [p, p+n) is page-locked, with the arena's base and registration piece (0: no split);
 * 0 when pageable. */
static int host_pinned(struct hbm *h, const unsigned char *p, uint64_t n,
                       const unsigned char **base, uint64_t *piece) {
  *base = p;
  *piece = 0;
  pthread_mutex_lock(&h->reg_mu);
  for (int i = 0; i < h->n_arenas; i++) {
    const struct arena *a = &h->arenas[i];
    if (p >= a->base && n <= a->bytes && (uint64_t)(p - a->base) <= a->bytes - n) {
      int pinned = a->pinned;
      *base = a->base;
      *piece = a->piece;
      pthread_mutex_unlock(&h->reg_mu);
      return pinned;
    }
  }
  pthread_mutex_unlock(&h->reg_mu);
  /* Memory the caller page-locked itself (cudaHostAlloc, its own cudaHostRegister). */
  struct cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return at.type == cudaMemoryTypeHost || at.type == cudaMemoryTypeManaged;
}

/* ---- the tier ---- */

static int hbm_probe(char *why, size_t len) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    snprintf(why, len, "hbm: no CUDA device (cudaGetDeviceCount: %s)",
             e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    cudaGetLastError();
    return TZ_ENOTSUP;
  }
  if (len)
    why[0] = '\0';
  return 0;
}

/* GPUDirect Storage: decided once per process. A VM rarely has the nvidia-fs module, and then
 * cuFileDriverOpen is not even tried (it would fall back to its own POSIX compatibility mode,
 * which is not a direct path, and write a log file into the working directory). */
static pthread_once_t gds_once = PTHREAD_ONCE_INIT;
static int gds_ok;
static char gds_why[256];

typedef struct {
  int err;    /* CUfileOpError */
  int cu_err; /* CUresult */
} cufile_status;

/* The tier's settings (tz_tier_params.settings; the config's tierzero.gds and
 * tierzero.hbm_pin_piece, docs/hbm.md) */
enum { SET_GDS, SET_PIN_PIECE, N_SETTINGS };
static const struct tz_setting settings[N_SETTINGS] = {
    [SET_GDS] = {.name = "gds",
                 .kind = TZ_SETTING_BOOL,
                 .def = 1,
                 .env = "TZ_GDS",
                 .help = "probe for GPUDirect Storage and log the answer (tierzero.gds)"},
    [SET_PIN_PIECE] = {.name = "pin_piece",
                       .kind = TZ_SETTING_SIZE,
                       .def = 0,
                       .env = "TZ_HBM_PIN_PIECE",
                       .help = "test hook: bytes per registration piece of host memory, a "
                               "multiple of 4096 up to 64 GiB; 0: 64 GiB "
                               "(tierzero.hbm_pin_piece)"},
};

/* s's values (NULL: each from its variable, else its default), the piece checked */
static int settings_of(const char *s, int64_t *v) {
  TZ_CHECK(tz_settings_parse("hbm", settings, N_SETTINGS, s, v));
  uint64_t piece = (uint64_t)v[SET_PIN_PIECE];
  if (piece % PAGE || piece > PIN_PIECE)
    return tz_err_set(TZ_ECONFIG,
                      "hbm: pin_piece (tierzero.hbm_pin_piece) is %llu bytes, not a multiple of "
                      "%llu up to 64 GiB",
                      (unsigned long long)piece, PAGE);
  if (piece == 0)
    v[SET_PIN_PIECE] = (int64_t)PIN_PIECE;
  return 0;
}

/* gds from the environment (TZ_GDS), for a caller without settings: 1 unless turned off there. */
static int gds_from_env(void) {
  int64_t v[N_SETTINGS];
  if (settings_of(NULL, v) < 0) {
    TZ_WARN("%s; GPUDirect Storage is probed", tz_err_msg());
    return 1;
  }
  return v[SET_GDS] != 0;
}

static void gds_probe(void) {
  if (!gds_from_env()) {
    snprintf(gds_why, sizeof gds_why, "turned off with TZ_GDS=0");
    return;
  }
  void *lib = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(gds_why, sizeof gds_why, "libcufile.so.0 cannot be loaded: %s", dlerror());
    return;
  }
  if (access("/proc/driver/nvidia-fs/version", F_OK) != 0 &&
      access("/sys/module/nvidia_fs", F_OK) != 0) {
    snprintf(gds_why, sizeof gds_why, "the nvidia-fs kernel module is not loaded");
    dlclose(lib);
    return;
  }
  cufile_status (*drv_open)(void) = (cufile_status(*)(void))dlsym(lib, "cuFileDriverOpen");
  cufile_status (*drv_close)(void) = (cufile_status(*)(void))dlsym(lib, "cuFileDriverClose_v2");
  if (!drv_close)
    drv_close = (cufile_status(*)(void))dlsym(lib, "cuFileDriverClose");
  if (!drv_open || !drv_close) {
    snprintf(gds_why, sizeof gds_why, "libcufile.so.0 lacks cuFileDriverOpen/Close");
    dlclose(lib);
    return;
  }
  cufile_status s = drv_open();
  if (s.err != 0) {
    snprintf(gds_why, sizeof gds_why, "cuFileDriverOpen failed: cuFile error %d, CUDA error %d",
             s.err, s.cu_err);
    dlclose(lib);
    return;
  }
  drv_close();
  gds_ok = 1;
  snprintf(gds_why, sizeof gds_why, "cuFileDriverOpen succeeds, but tierzero has no direct path");
  /* The library stays loaded: it may have started threads that outlive the close. */
}

int tz_hbm_gds_usable(char *why, size_t len) {
  pthread_once(&gds_once, gds_probe);
  if (len)
    snprintf(why, len, "%s", gds_why);
  return gds_ok;
}

static void log_gds(void) {
  char why[256];
  if (tz_hbm_gds_usable(why, sizeof why))
    TZ_INFO("hbm: GPUDirect Storage is available (%s); nvme<->hbm is staged through pinned host "
            "memory",
            why);
  else
    TZ_INFO("hbm: GPUDirect Storage not usable (%s); nvme<->hbm is staged through pinned host "
            "memory",
            why);
}
static pthread_once_t gds_log_once = PTHREAD_ONCE_INIT;

static void release_device(struct hbm *h) {
  for (int i = 0; i < N_LANES; i++)
    if (h->lanes[i].s) {
      cudaStreamSynchronize(h->lanes[i].s);
      cudaStreamDestroy(h->lanes[i].s);
      h->lanes[i].s = NULL;
    }
  if (h->base)
    cudaFree(h->base);
  h->base = NULL;
  cudaGetLastError();
}

static int hbm_init(tz_tier *t, const struct tz_tier_params *p) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess)
    cudaGetLastError();
  if (p->device < 0 || p->device >= count)
    return tz_err_set(TZ_EINVAL, "%s: GPU %d does not exist (%d visible)", t->name, p->device,
                      count);
  int64_t set[N_SETTINGS];
  int rc = settings_of(p->settings, set);
  if (rc < 0)
    return rc;
  struct hbm *h = calloc(1, sizeof *h);
  if (!h)
    return tz_err_set(TZ_ENOMEM, "%s: no memory", t->name);
  h->refs = 1;
  h->device = p->device;
  snprintf(h->name, sizeof h->name, "%s", t->name);
  h->pe = tz_runtime_progress(t->rt);
  h->bytes = t->capacity;
  h->host_numa = tz_gpu_host_numa_node(h->device);
  h->pin_piece = (uint64_t)set[SET_PIN_PIECE];
  pthread_mutex_init(&h->ev_mu, NULL);
  pthread_mutex_init(&h->reg_mu, NULL);
  for (int i = 0; i < N_LANES; i++)
    pthread_mutex_init(&h->lanes[i].mu, NULL);
  int prev;
  rc = device_enter(h, &prev);
  if (rc < 0) {
    hbm_unref(h);
    return rc;
  }
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
    cudaGetLastError();
  cudaError_t e = cudaMalloc((void **)&h->base, t->capacity);
  if (e != cudaSuccess) {
    rc = cuda_fail(e, "%s: cudaMalloc of %llu bytes on GPU %d (%llu of %llu bytes free)", t->name,
                   (unsigned long long)t->capacity, h->device, (unsigned long long)free_b,
                   (unsigned long long)total_b);
    h->base = NULL;
    goto fail;
  }
  for (int i = 0; i < N_LANES; i++) {
    e = cudaStreamCreateWithFlags(&h->lanes[i].s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      h->lanes[i].s = NULL;
      rc = cuda_fail(e, "%s: cudaStreamCreate on GPU %d", t->name, h->device);
      goto fail;
    }
  }
  rc = events_grow(h, EVENTS_AT_INIT);
  if (rc < 0)
    goto fail;
  h->events_at_init = h->events_created;
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, h->device) != cudaSuccess) {
    cudaGetLastError();
    snprintf(prop.name, sizeof prop.name, "?");
  }
  device_leave(prev);
  t->ctx = h;
  if (!set[SET_GDS])
    TZ_INFO("hbm: GPUDirect Storage not probed (tierzero.gds is off); nvme<->hbm is staged "
            "through pinned host memory");
  else
    pthread_once(&gds_log_once, log_gds);
  TZ_INFO("%s: GPU %d (%s), %.3f GiB arena, host NUMA node %d, %d events pooled", t->name,
          h->device, prop.name, (double)t->capacity / (1 << 30), h->host_numa, EVENTS_AT_INIT);
  return 0;
fail:
  release_device(h);
  device_leave(prev);
  hbm_unref(h);
  return rc;
}

static void hbm_fini(tz_tier *t) {
  struct hbm *h = t->ctx;
  if (!h)
    return;
  int prev;
  if (device_enter(h, &prev) < 0)
    prev = -1;
  release_device(h);
  /* Arenas the runtime did not take back (it always does; this is the safety net). */
  for (int i = 0; i < h->n_arenas; i++)
    if (h->arenas[i].ref)
      pin_release(h->arenas[i].base);
  h->n_arenas = 0;
  device_leave(prev);
  if (h->pageable_copies)
    TZ_INFO("%s: %llu copies used pageable host memory (slow path)", h->name,
            (unsigned long long)h->pageable_copies);
  if (h->events_created > h->events_at_init)
    TZ_INFO("%s: the event pool grew from %llu to %llu events", h->name,
            (unsigned long long)h->events_at_init, (unsigned long long)h->events_created);
  t->ctx = NULL;
  hbm_unref(h);
}

/* A copy between the arena at off and host memory, on the stream of its direction. */
static int host_copy(tz_tier *t, int to_gpu, uint64_t off, unsigned char *host, uint64_t n,
                     tz_fence **done) {
  struct hbm *h = t->ctx;
  struct lane *l = &h->lanes[to_gpu ? LANE_H2D : LANE_D2H];
  cudaStream_t s = l->s;
  const char *what = to_gpu ? "host->GPU copy" : "GPU->host copy";
  const unsigned char *abase;
  uint64_t piece;
  if (!host_pinned(h, host, n, &abase, &piece)) {
    __atomic_add_fetch(&h->pageable_copies, 1, __ATOMIC_RELAXED);
    if (!__atomic_exchange_n(&h->warned_pageable, 1, __ATOMIC_ACQ_REL))
      TZ_WARN("%s: %s with pageable host memory at %p: the driver stages it (slower, and the "
              "call may block); memory of a host tier is page-locked for the GPU (counted in "
              "tz_hbm_stats; logged once)",
              h->name, what, (void *)host);
  }
  unsigned char *dev = h->base + off;
  for (uint64_t d = 0; d < n;) {
    uint64_t len = n - d;
    if (piece) { /* each registration piece is its own copy */
      uint64_t left = piece - (uint64_t)(host + d - abase) % piece;
      if (len > left)
        len = left;
    }
    cudaError_t e = to_gpu ? cudaMemcpyAsync(dev + d, host + d, len, cudaMemcpyHostToDevice, s)
                           : cudaMemcpyAsync(host + d, dev + d, len, cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess) {
      int rc = cuda_fail(e, "%s: %s of %llu bytes at offset %llu on GPU %d (host %p)", h->name,
                         what, (unsigned long long)len, (unsigned long long)(off + d), h->device,
                         (void *)(host + d));
      cudaStreamSynchronize(s);
      return rc;
    }
    d += len;
  }
  __atomic_add_fetch(to_gpu ? &h->h2d_copies : &h->d2h_copies, 1, __ATOMIC_RELAXED);
  return record(h, l, what, off, n, done);
}

static int hbm_read(tz_tier *t, uint64_t off, void *buf, uint64_t n, tz_fence **done) {
  return host_copy(t, 0, off, buf, n, done);
}

static int hbm_write(tz_tier *t, uint64_t off, const void *buf, uint64_t n, tz_fence **done) {
  return host_copy(t, 1, off, (unsigned char *)buf, n, done);
}

static void *hbm_device_ptr(tz_tier *t, uint64_t off) {
  struct hbm *h = t->ctx;
  return h->base + off;
}

/* hbm->hbm, on this GPU or from another (peer copy; the driver stages it where the GPUs have no
 * peer access). Anything else has no direct path here: the runtime stages it. */
static int hbm_copy(tz_tier *dst, uint64_t dst_off, tz_tier *src, uint64_t src_off, uint64_t n,
                    tz_fence **done) {
  if (src->ops != &tz_tier_hbm_ops)
    return tz_err_set(TZ_ENOTSUP, "%s: no direct path from %s (%s)", dst->name, src->name,
                      src->ops->name);
  struct hbm *d = dst->ctx, *s = src->ctx;
  struct lane *l = &d->lanes[LANE_D2D];
  cudaError_t e;
  if (d->device == s->device)
    e = cudaMemcpyAsync(d->base + dst_off, s->base + src_off, n, cudaMemcpyDeviceToDevice, l->s);
  else
    e = cudaMemcpyPeerAsync(d->base + dst_off, d->device, s->base + src_off, s->device, n, l->s);
  if (e != cudaSuccess) {
    int rc = cuda_fail(e,
                       "%s: copy of %llu bytes from %s offset %llu (GPU %d) to offset %llu "
                       "(GPU %d)",
                       d->name, (unsigned long long)n, s->name, (unsigned long long)src_off,
                       s->device, (unsigned long long)dst_off, d->device);
    cudaStreamSynchronize(l->s);
    return rc;
  }
  __atomic_add_fetch(&d->d2d_copies, 1, __ATOMIC_RELAXED);
  return record(d, l, "GPU->GPU copy", dst_off, n, done);
}

static void hbm_describe(tz_tier *t, uint64_t off, char *buf, size_t len) {
  struct hbm *h = t->ctx;
  snprintf(buf, len, "%s (GPU %d) offset %llu", t->name, h->device, (unsigned long long)off);
}

const struct tz_tier_ops tz_tier_hbm_ops = {
    .name = "hbm",
    .settings = settings,
    .n_settings = N_SETTINGS,
    .probe = hbm_probe,
    .init = hbm_init,
    .fini = hbm_fini,
    .read = hbm_read,
    .write = hbm_write,
    .device_ptr = hbm_device_ptr,
    .copy = hbm_copy,
    .register_host = hbm_register_host,
    .unregister_host = hbm_unregister_host,
    .describe = hbm_describe,
};

/* ---- the public extras (tiers/hbm.h) ---- */

static struct hbm *hbm_of(tz_tier *t) { return t && t->ops == &tz_tier_hbm_ops ? t->ctx : NULL; }

int tz_hbm_stream_wait(tz_tier *t, tz_fence *f, void *cuda_stream) {
  struct hbm *h = hbm_of(t);
  if (!h)
    return tz_err_set(TZ_EINVAL, "hbm: stream wait through %s, which is not an hbm tier",
                      t ? t->name : "(no tier)");
  struct hbm_event *e = tz_fence_native(f, &cuda_event_ops);
  if (e) {
    cudaError_t r = cudaStreamWaitEvent((cudaStream_t)cuda_stream, e->ev, 0);
    if (r != cudaSuccess)
      return cuda_fail(r, "%s: cudaStreamWaitEvent on the event of the %s at offset %llu", h->name,
                       e->what, (unsigned long long)e->off);
    __atomic_add_fetch(&h->stream_waits, 1, __ATOMIC_RELAXED);
    return 0;
  }
  int q = tz_fence_query(f);
  if (q == 1) {
    __atomic_add_fetch(&h->waits_done, 1, __ATOMIC_RELAXED);
    return 0;
  }
  if (q < 0)
    return tz_fence_wait(f, 0); /* its status, and its message as ours */
  return tz_err_set(TZ_EINVAL,
                    "%s: a CUDA stream cannot wait on a pending host fence (an nvme read, a staged "
                    "transfer, a fence of several): hand it the fence of the host->hbm copy that "
                    "follows",
                    h->name);
}

int tz_hbm_stats(tz_tier *t, struct tz_hbm_stats *out) {
  struct hbm *h = hbm_of(t);
  if (!h)
    return tz_err_set(TZ_EINVAL, "hbm: %s is not an hbm tier", t ? t->name : "(no tier)");
  memset(out, 0, sizeof *out);
  out->device = h->device;
  pthread_mutex_lock(&h->ev_mu);
  out->events_at_init = h->events_at_init;
  out->events_created = h->events_created;
  out->events_in_use = h->events_in_use;
  pthread_mutex_unlock(&h->ev_mu);
  out->h2d_copies = __atomic_load_n(&h->h2d_copies, __ATOMIC_RELAXED);
  out->d2h_copies = __atomic_load_n(&h->d2h_copies, __ATOMIC_RELAXED);
  out->d2d_copies = __atomic_load_n(&h->d2d_copies, __ATOMIC_RELAXED);
  out->pageable_copies = __atomic_load_n(&h->pageable_copies, __ATOMIC_RELAXED);
  out->stream_waits = __atomic_load_n(&h->stream_waits, __ATOMIC_RELAXED);
  out->waits_done = __atomic_load_n(&h->waits_done, __ATOMIC_RELAXED);
  pthread_mutex_lock(&h->reg_mu);
  for (int i = 0; i < h->n_arenas; i++)
    out->pinned_arenas += (uint64_t)h->arenas[i].pinned;
  out->pinned_bytes = h->pinned_bytes;
  out->pin_seconds = h->pin_seconds;
  pthread_mutex_unlock(&h->reg_mu);
  return 0;
}

double tz_hbm_pin_seconds_per_gib(tz_tier *t) {
  struct tz_hbm_stats s = {0};
  if (tz_hbm_stats(t, &s) < 0 || s.pinned_bytes == 0)
    return 0;
  return s.pin_seconds / ((double)s.pinned_bytes / (1 << 30));
}

/* ---- streams of other lanes (tiers/hbm_impl.h) ---- */

struct tz_hbm_stream {
  struct hbm *h; /* holds a reference */
  struct lane l; /* numbered events, as the copy streams have */
  int borrowed;  /* l.s belongs to the caller (tz_hbm_stream_adopt): not destroyed here */
  int pending;   /* atomic: fences recorded and not yet complete (their polls read l) */
};

static void stream_fence_done(void *arg, int rc) {
  (void)rc;
  struct tz_hbm_stream *st = arg;
  __atomic_sub_fetch(&st->pending, 1, __ATOMIC_ACQ_REL);
}

/* A stream wrapper on hbm's GPU: the caller's stream when `borrowed`, else a new one. */
static int stream_make(tz_tier *t, void *borrowed, struct tz_hbm_stream **out) {
  struct hbm *h = hbm_of(t);
  if (!h)
    return tz_err_set(TZ_EINVAL, "hbm: a stream on %s, which is not an hbm tier",
                      t ? t->name : "(no tier)");
  struct tz_hbm_stream *st = calloc(1, sizeof *st);
  if (!st)
    return tz_err_set(TZ_ENOMEM, "%s: no memory for a stream", h->name);
  int rc = 0;
  if (borrowed) {
    st->l.s = (cudaStream_t)borrowed;
    st->borrowed = 1;
  } else {
    int prev;
    rc = device_enter(h, &prev);
    if (rc == 0) {
      cudaError_t e = cudaStreamCreateWithFlags(&st->l.s, cudaStreamNonBlocking);
      if (e != cudaSuccess)
        rc = cuda_fail(e, "%s: cudaStreamCreate on GPU %d", h->name, h->device);
      device_leave(prev);
    }
  }
  if (rc < 0) {
    free(st);
    return rc;
  }
  pthread_mutex_init(&st->l.mu, NULL);
  __atomic_add_fetch(&h->refs, 1, __ATOMIC_ACQ_REL);
  st->h = h;
  *out = st;
  return 0;
}

int tz_hbm_stream_create(tz_tier *t, struct tz_hbm_stream **out) {
  return stream_make(t, NULL, out);
}

int tz_hbm_stream_adopt(tz_tier *t, void *cuda_stream, struct tz_hbm_stream **out) {
  if (!cuda_stream)
    return tz_err_set(TZ_EINVAL, "hbm: adopting the legacy default stream (NULL) as a lane");
  return stream_make(t, cuda_stream, out);
}

void tz_hbm_stream_destroy(struct tz_hbm_stream *st) {
  if (!st)
    return;
  cudaStreamSynchronize(st->l.s);
  /* The progress engine may still be about to poll a fence whose event has completed; the poll
   * reads the lane's numbers, so they stay until every fence has been seen complete. */
  while (__atomic_load_n(&st->pending, __ATOMIC_ACQUIRE) > 0) {
    tz_progress_kick(st->h->pe);
    usleep(50);
  }
  int prev;
  if (device_enter(st->h, &prev) < 0)
    prev = -1;
  if (!st->borrowed)
    cudaStreamDestroy(st->l.s);
  cudaGetLastError();
  device_leave(prev);
  pthread_mutex_destroy(&st->l.mu);
  hbm_unref(st->h);
  free(st);
}

void *tz_hbm_stream_handle(struct tz_hbm_stream *st) { return st->l.s; }

int tz_hbm_stream_device(const struct tz_hbm_stream *st) { return st->h->device; }

int tz_hbm_stream_record(struct tz_hbm_stream *st, const char *what, tz_fence **out) {
  tz_fence *f;
  TZ_CHECK(record(st->h, &st->l, what, 0, 0, &f));
  __atomic_add_fetch(&st->pending, 1, __ATOMIC_ACQ_REL);
  if (tz_fence_then(f, stream_fence_done, st) < 0) {
    tz_fence_wait(f, -1);
    stream_fence_done(st, 0);
  }
  *out = f;
  return 0;
}

int tz_hbm_fence_waitable(tz_fence *f) {
  return !f || tz_fence_native(f, &cuda_event_ops) != NULL || tz_fence_query(f) != 0;
}
