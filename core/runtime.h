/* The runtime: one per process (rank). It owns the progress engine, the tiers created through it,
 * the pinned staging buffers that transfers between two non-host tiers go through, and the counters
 * per tier pair. Not a singleton: two runtimes in one process are independent. */
#ifndef TZ_RUNTIME_H
#define TZ_RUNTIME_H

#include <stdint.h>

#include "core/fence.h"
#include "core/progress.h"
#include "core/tier.h"

typedef struct tz_runtime tz_runtime;

struct tz_runtime_params {
  uint64_t staging_bytes; /* pinned host bytes for staged transfers; default 64 MiB */
  uint64_t chunk_bytes;   /* bytes per staged chunk; default 4 MiB */
  int numa_node;          /* where staging memory lives; -1 default */
};
void tz_runtime_params_init(struct tz_runtime_params *p);

/* p may be NULL for defaults. Owns what it creates; tz_runtime_destroy destroys its tiers.
 * Defined by the registry (registry/tiers.c), which passes the host tier backend to core's
 * tz_runtime_create_from (core/tier_impl.h). */
int tz_runtime_create(const struct tz_runtime_params *p, tz_runtime **out);
void tz_runtime_destroy(tz_runtime *rt); /* NULL is a no-op; waits for transfers in flight */

/* Creates a tier of pinned host memory (the backend the runtime was created with, "host"), as
 * tz_tier_create(rt, "host", p, out) does: for core's own staging memory, which cannot name a
 * backend. */
int tz_runtime_host_tier(tz_runtime *rt, const struct tz_tier_params *p, tz_tier **out);

tz_progress *tz_runtime_progress(tz_runtime *rt);
/* Bytes per staged chunk (params.chunk_bytes after defaults). */
uint64_t tz_runtime_chunk_bytes(const tz_runtime *rt);

/* Moves n bytes from src at src_off to dst at dst_off, whatever the two tiers are: a host-
 * addressable side is read or written directly; a pair with a direct path uses it; anything else
 * is staged through pinned host buffers in chunks, the read of chunk k+1 overlapping the write of
 * chunk k. Offsets and n follow tz_tier_read's rules for both tiers. */
int tz_transfer(tz_runtime *rt, const tz_extent *dst, uint64_t dst_off, const tz_extent *src,
                uint64_t src_off, uint64_t n, tz_fence **done);

/* Counters per (source tier, destination tier) pair, for tz-bench and metrics. */
struct tz_pair_stats {
  const char *src, *dst; /* tier names */
  uint64_t bytes, transfers;
  uint64_t staged; /* transfers that went through the staged path */
  double busy_s;   /* time with at least one transfer of this pair in flight */
};
/* Fills up to max entries, returns how many pairs have counters. */
int tz_runtime_pair_stats(tz_runtime *rt, struct tz_pair_stats *out, int max);

#endif
