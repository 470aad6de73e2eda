/* Synthetic token batches for tests and demos: sequence g of a run is a function of (seed, g)
 * only, so every world size and every resumed run sees the same samples in the same places. Each
 * sequence is an arithmetic progression modulo the vocabulary (a start and a stride drawn from the
 * hash of seed and g), which a model learns in a few steps: the loss visibly falls. */
#ifndef TZ_TRAINER_SYNTHETIC_H
#define TZ_TRAINER_SYNTHETIC_H

#include <stdint.h>

/* Fills tokens and targets (n_seq * T int32 each) with sequences first .. first + n_seq - 1:
 * targets are the tokens shifted by one (next-token prediction). vocab >= 2. */
void tz_synthetic_batch(uint64_t seed, uint64_t first, int n_seq, int T, int vocab, int32_t *tokens,
                        int32_t *targets);

/* The global index of the first sequence of micro-batch `micro` on `rank` in step `step`: a step
 * takes world * accum * micro_batch sequences, micro-batch k of rank r being the (k * world + r)th
 * group of micro_batch, so that world w with accumulation a and world w*a without accumulation
 * see the same sequences in the same order of reduction. */
uint64_t tz_synthetic_first(int64_t step, int micro, int rank, int world, int accum,
                            int micro_batch);

#endif
