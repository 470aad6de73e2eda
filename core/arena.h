/* The allocator every tier carves its extents with: offsets inside [0, capacity), aligned, with
 * best-fit placement and coalescing of neighbouring free ranges. It manages offsets only; the
 * memory (or file) behind them belongs to the tier. Not thread-safe: the tier locks around it. */
#ifndef TZ_ARENA_H
#define TZ_ARENA_H

#include <stdint.h>

#include "core/tier.h"

typedef struct tz_arena tz_arena;

int tz_arena_create(uint64_t capacity, uint64_t align, tz_arena **out);
void tz_arena_destroy(tz_arena *a); /* NULL is a no-op */
/* Rounds bytes up to the alignment. TZ_ENOMEM (no message) when no free range fits;
 * TZ_EINVAL for 0 bytes. */
int tz_arena_alloc(tz_arena *a, uint64_t bytes, uint64_t *off);
/* TZ_EINVAL when off is not the start of a live allocation. */
int tz_arena_free(tz_arena *a, uint64_t off);
/* The rounded size of the allocation at off, or 0. */
uint64_t tz_arena_size(const tz_arena *a, uint64_t off);
void tz_arena_stats(const tz_arena *a, struct tz_arena_stats *out);

#endif
