#include "core/arena.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

struct range {
  uint64_t off, len;
};

/* Two sorted arrays: free ranges and live allocations. Binary search finds; memmove inserts.
 * A tier holds thousands of extents at most, so this stays simple and fast enough. */
struct tz_arena {
  uint64_t capacity, align;
  struct range *free, *used;
  uint32_t n_free, cap_free, n_used, cap_used;
  uint64_t used_bytes, allocs, frees, failed;
};

static int grow(struct range **v, uint32_t *cap, uint32_t need) {
  if (need <= *cap)
    return 0;
  uint32_t c = *cap ? *cap * 2 : 64;
  while (c < need)
    c *= 2;
  struct range *n = realloc(*v, sizeof *n * c);
  if (!n)
    return TZ_ENOMEM;
  *v = n;
  *cap = c;
  return 0;
}

/* First index whose off is >= off. */
static uint32_t lower(const struct range *v, uint32_t n, uint64_t off) {
  uint32_t lo = 0, hi = n;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (v[mid].off < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void insert_at(struct range *v, uint32_t *n, uint32_t i, struct range r) {
  memmove(&v[i + 1], &v[i], sizeof *v * (*n - i));
  v[i] = r;
  (*n)++;
}

static void erase_at(struct range *v, uint32_t *n, uint32_t i) {
  memmove(&v[i], &v[i + 1], sizeof *v * (*n - i - 1));
  (*n)--;
}

int tz_arena_create(uint64_t capacity, uint64_t align, tz_arena **out) {
  if (align == 0 || (align & (align - 1)))
    return tz_err_set(TZ_EINVAL, "arena: alignment %llu is not a power of two",
                      (unsigned long long)align);
  tz_arena *a = calloc(1, sizeof *a);
  if (!a)
    return tz_err_set(TZ_ENOMEM, "arena: no memory");
  a->capacity = capacity & ~(align - 1);
  a->align = align;
  if (a->capacity) {
    if (grow(&a->free, &a->cap_free, 1)) {
      free(a);
      return tz_err_set(TZ_ENOMEM, "arena: no memory");
    }
    a->free[a->n_free++] = (struct range){0, a->capacity};
  }
  *out = a;
  return 0;
}

void tz_arena_destroy(tz_arena *a) {
  if (!a)
    return;
  free(a->free);
  free(a->used);
  free(a);
}

int tz_arena_alloc(tz_arena *a, uint64_t bytes, uint64_t *off) {
  if (bytes == 0)
    return TZ_EINVAL;
  uint64_t len = (bytes + a->align - 1) & ~(a->align - 1);
  if (len < bytes) /* overflow */
    return TZ_ENOMEM;
  /* Best fit: the smallest free range that holds len; ties go to the lowest offset. */
  uint32_t best = UINT32_MAX;
  for (uint32_t i = 0; i < a->n_free; i++)
    if (a->free[i].len >= len && (best == UINT32_MAX || a->free[i].len < a->free[best].len))
      best = i;
  if (best == UINT32_MAX || grow(&a->used, &a->cap_used, a->n_used + 1)) {
    a->failed++;
    return TZ_ENOMEM;
  }
  uint64_t o = a->free[best].off;
  if (a->free[best].len == len) {
    erase_at(a->free, &a->n_free, best);
  } else {
    a->free[best].off += len;
    a->free[best].len -= len;
  }
  insert_at(a->used, &a->n_used, lower(a->used, a->n_used, o), (struct range){o, len});
  a->used_bytes += len;
  a->allocs++;
  *off = o;
  return 0;
}

int tz_arena_free(tz_arena *a, uint64_t off) {
  uint32_t i = lower(a->used, a->n_used, off);
  if (i == a->n_used || a->used[i].off != off)
    return tz_err_set(TZ_EINVAL, "arena: offset %llu is not an allocation",
                      (unsigned long long)off);
  uint64_t len = a->used[i].len;
  erase_at(a->used, &a->n_used, i);
  a->used_bytes -= len;
  a->frees++;
  /* Insert into the free list, merging with the neighbours it touches. */
  uint32_t j = lower(a->free, a->n_free, off);
  int merge_prev = j > 0 && a->free[j - 1].off + a->free[j - 1].len == off;
  int merge_next = j < a->n_free && off + len == a->free[j].off;
  if (merge_prev && merge_next) {
    a->free[j - 1].len += len + a->free[j].len;
    erase_at(a->free, &a->n_free, j);
  } else if (merge_prev) {
    a->free[j - 1].len += len;
  } else if (merge_next) {
    a->free[j].off = off;
    a->free[j].len += len;
  } else {
    if (grow(&a->free, &a->cap_free, a->n_free + 1))
      return tz_err_set(TZ_ENOMEM, "arena: no memory");
    insert_at(a->free, &a->n_free, j, (struct range){off, len});
  }
  return 0;
}

uint64_t tz_arena_size(const tz_arena *a, uint64_t off) {
  uint32_t i = lower(a->used, a->n_used, off);
  return i < a->n_used && a->used[i].off == off ? a->used[i].len : 0;
}

void tz_arena_stats(const tz_arena *a, struct tz_arena_stats *s) {
  memset(s, 0, sizeof *s);
  s->capacity = a->capacity;
  s->used = a->used_bytes;
  s->free = a->capacity - a->used_bytes;
  for (uint32_t i = 0; i < a->n_free; i++)
    if (a->free[i].len > s->largest_free)
      s->largest_free = a->free[i].len;
  s->allocs = a->allocs;
  s->frees = a->frees;
  s->failed = a->failed;
  s->n_extents = a->n_used;
  s->n_free_ranges = a->n_free;
  s->fragmentation = s->free ? 1.0 - (double)s->largest_free / (double)s->free : 0.0;
}
