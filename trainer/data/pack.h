/* Packing documents into rows of T tokens by best-fit decreasing, as fine-tuning stacks pack
 * conversations (TRL's "bfd", LLaMA-Factory's neat_packing): each piece goes, longest first, into
 * the row with the least room that still holds it, else into a new row; the rest of a row is
 * padding. The order is a pure function of the lengths: ties go by piece index, so every rank and
 * every run packs the same rows. */
#ifndef TZ_TRAINER_PACK_H
#define TZ_TRAINER_PACK_H

#include <stdint.h>

struct tz_pack {
  uint64_t n_rows;
  uint64_t *row_start; /* n_rows + 1: row r holds piece[row_start[r] .. row_start[r+1]) */
  uint64_t *piece;     /* the n pieces' indices, row after row, each row's in placing order */
};

/* Packs n pieces of len[i] in [1, T] into rows of T. *out owns its arrays (tz_pack_free).
 * TZ_EINVAL naming the piece for a length outside [1, T]; TZ_ENOMEM. */
int tz_pack_best_fit(const uint32_t *len, uint64_t n, int T, struct tz_pack *out);
void tz_pack_free(struct tz_pack *p); /* a zeroed one: no-op */

#endif
