/* Best-fit decreasing (pack.h). Rows are kept in lists by their room (0..T), and a two-level
 * bitmap of the non-empty lists finds the least room >= a length in a few word scans, so n
 * pieces pack in O(n log n) (the sort) whatever T. */
#include "trainer/data/pack.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct item {
  uint64_t i;
  uint32_t len;
};

static int cmp_item(const void *a, const void *b) {
  const struct item *x = a, *y = b;
  if (x->len != y->len)
    return x->len > y->len ? -1 : 1;     /* longest first */
  return x->i < y->i ? -1 : x->i > y->i; /* then by index */
}

/* Bits of the rooms whose list is not empty: lo[w] bit k for room 64w + k, hi[v] bit k for a
 * non-zero lo[64v + k]. */
struct rooms {
  uint64_t *lo, *hi;
  int64_t *head; /* T + 1: the first row with this room, or -1 */
};

static void room_set(struct rooms *r, int c) {
  r->lo[c / 64] |= 1ull << (c % 64);
  r->hi[c / 4096] |= 1ull << ((c / 64) % 64);
}

static void room_clear(struct rooms *r, int c) {
  r->lo[c / 64] &= ~(1ull << (c % 64));
  if (!r->lo[c / 64])
    r->hi[c / 4096] &= ~(1ull << ((c / 64) % 64));
}

/* The least room >= c with a row, or -1. */
static int room_find(const struct rooms *r, int c, int T) {
  int w = c / 64;
  uint64_t m = r->lo[w] & (~0ull << (c % 64));
  if (m)
    return w * 64 + __builtin_ctzll(m);
  int nw = T / 64 + 1;
  for (int v = (w + 1) / 64; v * 64 < nw; v++) {
    uint64_t h = r->hi[v];
    if (v == (w + 1) / 64)
      h &= (w + 1) % 64 ? ~0ull << ((w + 1) % 64) : ~0ull;
    if (h) {
      int ww = v * 64 + __builtin_ctzll(h);
      return ww * 64 + __builtin_ctzll(r->lo[ww]);
    }
  }
  return -1;
}

int tz_pack_best_fit(const uint32_t *len, uint64_t n, int T, struct tz_pack *out) {
  memset(out, 0, sizeof *out);
  if (T < 1)
    return tz_err_set(TZ_EINVAL, "pack: row length %d must be at least 1", T);
  for (uint64_t i = 0; i < n; i++)
    if (len[i] < 1 || len[i] > (uint32_t)T)
      return tz_err_set(TZ_EINVAL, "pack: piece %" PRIu64 " has %" PRIu32 " tokens, not in [1, %d]",
                        i, len[i], T);
  int nw = T / 64 + 1, nv = nw / 64 + 1;
  struct item *order = malloc((n ? n : 1) * sizeof *order);
  int64_t *row_of = malloc((n ? n : 1) * sizeof *row_of); /* each piece's row */
  int64_t *next = malloc((n ? n : 1) * sizeof *next);     /* rows: the next of the same room */
  int *room = malloc((n ? n : 1) * sizeof *room);         /* rows: the room left */
  struct rooms r = {calloc((size_t)nw, 8), calloc((size_t)nv, 8),
                    malloc(((size_t)T + 1) * sizeof(int64_t))};
  int rc = 0;
  if (!order || !row_of || !next || !room || !r.lo || !r.hi || !r.head) {
    rc = tz_err_set(TZ_ENOMEM, "pack: no memory for %" PRIu64 " pieces", n);
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    order[i] = (struct item){i, len[i]};
  qsort(order, n, sizeof *order, cmp_item);
  for (int c = 0; c <= T; c++)
    r.head[c] = -1;
  uint64_t rows = 0;
  for (uint64_t k = 0; k < n; k++) {
    uint64_t i = order[k].i;
    int L = (int)len[i];
    int c = room_find(&r, L, T);
    int64_t row;
    if (c < 0) { /* a new row */
      row = (int64_t)rows++;
      room[row] = T;
    } else { /* off the list of its room */
      row = r.head[c];
      r.head[c] = next[row];
      if (r.head[c] < 0)
        room_clear(&r, c);
    }
    row_of[i] = row;
    room[row] -= L;
    next[row] = r.head[room[row]];
    r.head[room[row]] = row;
    room_set(&r, room[row]);
  }
  /* Rows in creation order, each row's pieces in placing order (a counting sort by row). */
  out->row_start = calloc(rows + 1, sizeof *out->row_start);
  out->piece = malloc((n ? n : 1) * sizeof *out->piece);
  if (!out->row_start || !out->piece) {
    rc = tz_err_set(TZ_ENOMEM, "pack: no memory for %" PRIu64 " rows", rows);
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    out->row_start[row_of[i] + 1]++;
  for (uint64_t q = 0; q < rows; q++)
    out->row_start[q + 1] += out->row_start[q];
  uint64_t *fill = calloc(rows + 1, sizeof *fill);
  if (!fill) {
    rc = tz_err_set(TZ_ENOMEM, "pack: no memory for %" PRIu64 " rows", rows);
    goto out;
  }
  for (uint64_t k = 0; k < n; k++) {
    uint64_t i = order[k].i;
    out->piece[out->row_start[row_of[i]] + fill[row_of[i]]++] = i;
  }
  free(fill);
  out->n_rows = rows;
out:
  free(order), free(row_of), free(next), free(room), free(r.lo), free(r.hi), free(r.head);
  if (rc < 0)
    tz_pack_free(out);
  return rc;
}

void tz_pack_free(struct tz_pack *p) {
  free(p->row_start);
  free(p->piece);
  memset(p, 0, sizeof *p);
}
