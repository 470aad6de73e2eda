#include "trainer/data/synthetic.h"
#include "util/mix.h"

void tz_synthetic_batch(uint64_t seed, uint64_t first, int n_seq, int T, int vocab, int32_t *tokens,
                        int32_t *targets) {
  for (int s = 0; s < n_seq; s++) {
    uint64_t h = tz_mix_data(tz_mix_data(seed) ^ (first + (uint64_t)s));
    uint64_t start = h % (uint64_t)vocab, stride = 1 + (h >> 40) % 7;
    for (int t = 0; t < T; t++) {
      tokens[(int64_t)s * T + t] = (int32_t)((start + stride * (uint64_t)t) % (uint64_t)vocab);
      targets[(int64_t)s * T + t] =
          (int32_t)((start + stride * (uint64_t)(t + 1)) % (uint64_t)vocab);
    }
  }
}

uint64_t tz_synthetic_first(int64_t step, int micro, int rank, int world, int accum,
                            int micro_batch) {
  uint64_t per_step = (uint64_t)world * (uint64_t)accum * (uint64_t)micro_batch;
  return (uint64_t)step * per_step +
         ((uint64_t)micro * (uint64_t)world + (uint64_t)rank) * (uint64_t)micro_batch;
}
