/* Tiers: places bytes live (DESIGN.md): hbm, host, nvme, fault. A tier is created from a backend of
 * the registry, carves extents out of one arena allocated at creation, and moves bytes between its
 * arena and host memory asynchronously, each operation completing on a fence. */
#ifndef TZ_TIER_H
#define TZ_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "core/fence.h"

typedef struct tz_tier tz_tier;
typedef struct tz_runtime tz_runtime;

/* An allocation inside a tier. offset is from the start of the tier's arena. */
typedef struct tz_extent {
  tz_tier *tier;
  uint64_t offset;
  uint64_t bytes; /* as asked for; the arena may hold a little more, up to the alignment */
} tz_extent;

#define TZ_MAX_PATHS 16

/* What a backend needs to create an instance. Zero means "the backend's default" throughout. */
struct tz_tier_params {
  const char *name;  /* instance name in messages and counters; default: the backend's */
  uint64_t capacity; /* bytes the tier may hold (its budget); required */
  int numa_node;     /* host: node to allocate on; -1 the calling thread's (set by init) */
  int device;        /* hbm: GPU index */
  const char *paths[TZ_MAX_PATHS]; /* nvme: directories, one file striped in each */
  int n_paths;
  int queue_depth;       /* nvme: io_uring entries per ring */
  uint64_t stripe_bytes; /* nvme: bytes per stripe unit across paths */
  int checksum;          /* 1 on, 0 off; default (-1 after tz_tier_params_init) on for nvme */
  int buffered;          /* nvme: 1 forces buffered I/O (no O_DIRECT) */
  tz_tier *base;         /* fault: the tier it wraps (borrowed) */
  const char *faults;    /* fault: injection spec, see tiers/fault.c; also TZ_FAULTS */
  /* The backend's own settings, "name=value,..." against its table (core/settings.h; the hbm
   * tier's gds and pin_piece, tiers/hbm.c): what the string leaves out comes from the setting's
   * variable, else its default. NULL: none given. A backend without settings refuses any. */
  const char *settings;
};
void tz_tier_params_init(struct tz_tier_params *p);

/* Creating a tier by backend name ("host", "nvme", "fault", and "hbm" with CUDA) is the
 * registry's (registry/tiers.c, above every backend): core creates tiers only from an ops table
 * (tz_tier_create_from, core/tier_impl.h), so the four below are declared here for the clients
 * and defined there; no core file calls them (tests/layering checks that it links without).
 *
 * 0 when the backend can run on this machine; otherwise a negative code, and why[] says why
 * ("nvme: io_uring_queue_init: Operation not permitted"). */
int tz_tier_probe(const char *backend, char *why, size_t why_len);

/* Creates a tier of the named backend. The runtime keeps it and destroys it with itself; the tier
 * allocates its whole arena here. Errors: TZ_ENOENT (no such backend), TZ_ENOTSUP (cannot run
 * here), TZ_ENOMEM, TZ_EIO, TZ_ENOSPC (nvme file could not be preallocated). */
int tz_tier_create(tz_runtime *rt, const char *backend, const struct tz_tier_params *p,
                   tz_tier **out);
/* Whether this build has the backend (1) or not (0). */
int tz_tier_backend_built(const char *backend);
/* Checks a settings string against the backend's table (tz_tier_params.settings): 0, or
 * TZ_ECONFIG naming the setting, the value and what it accepts; TZ_ENOENT for a backend this
 * build lacks. */
int tz_tier_settings_check(const char *backend, const char *settings);
void tz_tier_destroy(tz_tier *t); /* NULL is a no-op; the runtime calls it for tiers left */

const char *tz_tier_name(const tz_tier *t);
const char *tz_tier_backend(const tz_tier *t);
uint64_t tz_tier_capacity(const tz_tier *t);
uint64_t tz_tier_alignment(const tz_tier *t);
/* The host address of off, for tiers whose memory the CPU can address (host), else NULL. */
void *tz_tier_host_ptr(tz_tier *t, uint64_t off);
/* The address of off in the device's memory (hbm), else NULL. */
void *tz_tier_device_ptr(tz_tier *t, uint64_t off);

/* Extents. Sizes are rounded up to the tier's alignment inside the arena. TZ_ENOMEM with a
 * message naming the tier, the request and what is free when the budget is exhausted. */
int tz_tier_alloc(tz_tier *t, uint64_t bytes, tz_extent *out);
void tz_tier_free(tz_extent *e); /* a zero extent (tier NULL) is a no-op */

/* Asynchronous moves between an extent and host memory. [off, off+n) lies in the extent; off and
 * n are multiples of the tier's alignment, except that n may end at the extent's end; buf is
 * aligned to tz_tier_alignment for O_DIRECT tiers. *done gets a fence the caller owns.
 * The buffer must stay valid, and unmodified for a write, until the fence completes. */
int tz_tier_write(const tz_extent *dst, uint64_t off, const void *buf, uint64_t n, tz_fence **done);
int tz_tier_read(const tz_extent *src, uint64_t off, void *buf, uint64_t n, tz_fence **done);

/* Synchronous forms, for set-up and tests. */
int tz_tier_write_sync(const tz_extent *dst, uint64_t off, const void *buf, uint64_t n);
int tz_tier_read_sync(const tz_extent *src, uint64_t off, void *buf, uint64_t n);

/* Moves the first `bytes` of ext (a multiple of block) to the tier (write) or from it, through
 * buf, which holds depth * block bytes used as a ring, with `depth` operations in flight; waits for
 * all of them and puts the elapsed time in *seconds. How fast a tier streams, for tz-bench and
 * tz-topo --measure. After an error it still waits for what is in flight before returning it. */
int tz_tier_stream(const tz_extent *ext, void *buf, uint64_t bytes, uint64_t block, int depth,
                   int write, double *seconds);

/* Arena statistics. fragmentation = 1 - largest_free / free (0 when free is 0). */
struct tz_arena_stats {
  uint64_t capacity, used, free, largest_free;
  uint64_t allocs, frees, failed;
  uint32_t n_extents, n_free_ranges;
  double fragmentation;
};
void tz_tier_arena_stats(const tz_tier *t, struct tz_arena_stats *out);

/* I/O counters since creation: what callers asked for, and what the backend had to do again to
 * complete it. A resubmission moves the rest of a request the device transferred only in part
 * (the nvme tier; the fault tier's `short`); a retry resubmits a request refused with -EAGAIN or
 * interrupted (-EINTR) before it moved anything. */
struct tz_tier_io_stats {
  uint64_t bytes_read, bytes_written, n_reads, n_writes, csum_errors;
  uint64_t resubmits, retries;
  /* Nanoseconds since creation with at least one of the tier's transfers in flight on its
   * device, reads and writes together, the period in progress included; has_busy is 0 (and
   * busy_ns 0) for a tier that cannot tell (memory tiers, the fault tier). */
  uint64_t busy_ns;
  int has_busy;
};
void tz_tier_io_stats(const tz_tier *t, struct tz_tier_io_stats *out);

/* Test mode: random delays of up to max_us (from seed) in the runtime's CPU copy lane, which
 * carries the copies of host-memory tiers; 0 turns them off. The scheduler's jitter sets it. */
void tz_tier_set_copy_jitter(tz_runtime *rt, int max_us, uint64_t seed);

#endif
