/* 64-bit mixing from splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
 * generators", 2014): deterministic hashes of (seed, index) and small random sequences.
 *
 * Initialisation and data order must stay bit-identical across versions (resumed runs and
 * checkpoints depend on them), and the two were built on different forms of the mix: the
 * parameter initialisation on the finalizer alone, the data order on the finalizer after the
 * golden-ratio increment. Each keeps its own function, named for what it feeds; merging them would
 * change every initial weight or every epoch's order. */
#ifndef TZ_UTIL_MIX_H
#define TZ_UTIL_MIX_H

#include <stdint.h>

/* splitmix64's increment, the golden ratio in 64 bits. */
#define TZ_MIX_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's finalizer alone (no increment): the hash of the model's initialisation
 * (trainer/model/model.c), which adds TZ_MIX_GAMMA itself where it wants it. Also the output step
 * of tz_mix_next. */
static inline uint64_t tz_mix_init(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* splitmix64 of one value: the increment, then the finalizer. The hash of the data order (the
 * Feistel rounds of trainer/data/data.c), of synthetic batches and of the fault tier's decisions.
 */
static inline uint64_t tz_mix_data(uint64_t z) { return tz_mix_init(z + TZ_MIX_GAMMA); }

/* The next value of the splitmix64 sequence whose state is *state (advanced by one step). */
static inline uint64_t tz_mix_next(uint64_t *state) { return tz_mix_init(*state += TZ_MIX_GAMMA); }

#endif
