/* What a tier backend implements (private to core/ and tiers/). One static const ops table per
 * backend file, filled with designated initializers. Offsets below are absolute in the tier's
 * arena; the public wrappers in core/tier.c have checked bounds and alignment, kept the counters
 * and, where integrity is on, the checksums. */
#ifndef TZ_TIER_IMPL_H
#define TZ_TIER_IMPL_H

#include <pthread.h>

#include "core/arena.h"
#include "core/runtime.h"
#include "core/settings.h"
#include "core/tier.h"

struct tz_tier_ops {
  const char *name;
  /* optional: the backend's settings (tz_tier_params.settings), which its init parses */
  const struct tz_setting *settings;
  int n_settings;
  /* optional: NULL means the backend can always run. 0 or negative with why[] filled. */
  int (*probe)(char *why, size_t why_len);
  /* Creates the instance: sets t->ctx, and may lower t->capacity or raise t->align and
   * t->io_align. Allocates the whole arena (memory, file) here. On failure frees what it made. */
  int (*init)(tz_tier *t, const struct tz_tier_params *p);
  void (*fini)(tz_tier *t);
  /* Asynchronous move of n bytes between the arena at off and host memory buf. The returned
   * fence (owned by the caller) completes with 0 or a negative code and a message that names
   * the tier, the file and the offset. On a negative return no fence is made. */
  int (*read)(tz_tier *t, uint64_t off, void *buf, uint64_t n, tz_fence **done);
  int (*write)(tz_tier *t, uint64_t off, const void *buf, uint64_t n, tz_fence **done);
  /* optional: NULL means the CPU cannot address the arena. */
  void *(*host_ptr)(tz_tier *t, uint64_t off);
  /* optional: NULL means not device memory. */
  void *(*device_ptr)(tz_tier *t, uint64_t off);
  /* optional: NULL means no direct path. Copies from src (any tier) into dst = this tier;
   * TZ_ENOTSUP for a pair it has no direct path for, and the runtime then stages the copy. */
  int (*copy)(tz_tier *dst, uint64_t dst_off, tz_tier *src, uint64_t src_off, uint64_t n,
              tz_fence **done);
  /* optional: NULL means nothing to do. Called for every host-addressable arena the runtime
   * knows (those of host tiers, staging), so this tier can register it (cudaHostRegister,
   * io_uring fixed buffers). Called before the arena is used and undone before it is freed. */
  int (*register_host)(tz_tier *t, void *base, uint64_t bytes);
  void (*unregister_host)(tz_tier *t, void *base);
  /* optional: NULL means "<tier> offset <off>". Where off lives, for error messages. */
  void (*describe)(tz_tier *t, uint64_t off, char *buf, size_t len);
  /* optional: NULL means the tier cannot tell. tz_tier_io_stats' busy_ns: the time its device
   * had at least one of its transfers in flight, the period in progress included. */
  uint64_t (*busy_ns)(const tz_tier *t);
};

struct tz_tier {
  const struct tz_tier_ops *ops;
  void *ctx;
  tz_runtime *rt;
  char name[48];
  uint64_t capacity; /* bytes the arena manages */
  uint64_t align;    /* extent alignment: offsets and sizes of extents */
  uint64_t io_align; /* offsets and lengths of reads and writes (O_DIRECT); 1 for memory */
  int integrity;     /* checksum per io_align unit on write, verified on read */
  /* Extents are carved from alloc_owner's arena (a fault tier shares its base's). */
  tz_tier *alloc_owner;
  tz_arena *arena;
  pthread_mutex_t mu;
  uint32_t *csum;       /* (capacity / io_align) */
  uint64_t *csum_valid; /* bitmap over the same units: written at least once */
  uint64_t bytes_read, bytes_written, n_reads, n_writes, csum_errors; /* atomic */
  uint64_t resubmits, retries; /* atomic; kept by the backend (tz_tier_io_stats) */
  struct tz_tier *next;        /* the runtime's list */
};

/* Creates a tier of the backend behind ops: probes it, runs its init, carves the arena, and
 * hands the tier to the runtime (tz_tier_create's errors). The registry's tz_tier_create finds
 * ops by name; core, which knows no backend, creates its host tiers from the ops the runtime
 * was created with (tz_runtime_host_tier). */
int tz_tier_create_from(tz_runtime *rt, const struct tz_tier_ops *ops,
                        const struct tz_tier_params *p, tz_tier **out);
/* tz_runtime_create with the backend of the runtime's host tiers (its staging, the scheduler's)
 * passed in, since core cannot name one; the registry's tz_runtime_create passes "host". */
int tz_runtime_create_from(const struct tz_runtime_params *p, const struct tz_tier_ops *host,
                           tz_runtime **out);

/* runtime.c, for tier.c: keep t in the runtime's list, register host arenas across tiers. */
int tz_runtime_attach(tz_runtime *rt, tz_tier *t);
void tz_runtime_detach(tz_runtime *rt, tz_tier *t);
/* The runtime's CPU copy lane (memcpy for host tiers). */
struct tz_pool *tz_runtime_copy_pool(tz_runtime *rt);

/* Registry entries: tiers/<name>.c defines these, registry/tiers.c lists them; nothing below
 * the registry refers to one (tests/layering). */
extern const struct tz_tier_ops tz_tier_host_ops;
extern const struct tz_tier_ops tz_tier_nvme_ops;
extern const struct tz_tier_ops tz_tier_fault_ops;
extern const struct tz_tier_ops tz_tier_hbm_ops;

#endif
