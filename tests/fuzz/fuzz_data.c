/* Fuzz target: the data loader (trainer/data/data.h) on a file made of the input.
 *
 * Input: u8 seq_len - 1 (T = 1 + it % 64), u8 vocabulary choice, u8 mode, u8 a parameter, u64
 * seed and sample index, then the file (a memory file opened by its /proc/self/fd path, so that
 * the loader tells an llm.c shard from text by its magic). Mode: bits 0-1 the validation split
 * (none, a fraction, val_tokens from the parameter, the same file as val_spec); bit 2 "text:"
 * before the path. Besides memory errors it checks what data.h promises of a source that opens:
 * every token served is below the vocabulary, inputs and targets are the sample shifted by one,
 * windows are in range, and the permutation is a bijection. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "trainer/data/data.h"

#define MAX_B 3

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR);
  return 0;
}

static void check_split(const tz_data *d, enum tz_data_split s, int vocab, uint64_t first, int B) {
  int T = tz_data_seq_len(d);
  uint64_t n = tz_data_n_samples(d, s);
  int32_t tokens[MAX_B * 65], in[MAX_B * 64], tg[MAX_B * 64];
  int rc = tz_data_batch(d, s, first, B, tokens);
  if (n == 0) {
    if (rc == 0)
      abort(); /* no such split: refused */
    return;
  }
  if (rc != 0 || tz_data_batch_io(d, s, first, B, in, tg) != 0) {
    fprintf(stderr, "batch of %d at %llu: %s\n", B, (unsigned long long)first, tz_err_msg());
    abort();
  }
  for (int b = 0; b < B; b++) {
    for (int t = 0; t <= T; t++)
      if (tokens[b * (T + 1) + t] < 0 || tokens[b * (T + 1) + t] >= vocab)
        abort();
    for (int t = 0; t < T; t++)
      if (in[b * T + t] != tokens[b * (T + 1) + t] || tg[b * T + t] != tokens[b * (T + 1) + t + 1])
        abort();
    uint64_t all = tz_data_n_samples(d, TZ_DATA_TRAIN) +
                   (s == TZ_DATA_VAL ? tz_data_n_samples(d, TZ_DATA_VAL) : 0);
    if (s == TZ_DATA_TRAIN && tz_data_window(d, s, first + (uint64_t)b) >= all)
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 12)
    return 0;
  static const int vocabs[] = {256, 17, 50257, 128256, 65536, 1};
  int T = 1 + data[0] % 64, vocab = vocabs[data[1] % 6], mode = data[2], param = data[3];
  uint64_t x;
  memcpy(&x, data + 4, 8);
  const uint8_t *file = data + 12;
  size_t n = size - 12;

  int fd = memfd_create("fuzz.data", MFD_CLOEXEC);
  if (fd < 0)
    abort();
  if (n && write(fd, file, n) != (ssize_t)n)
    abort();
  char path[64], spec[80];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  snprintf(spec, sizeof spec, "%s%s", mode & 4 ? "text:" : "", path);
  struct tz_data_params p = {.seq_len = T, .seed = x};
  switch (mode & 3) {
  case 1: p.val_fraction = 0.25; break;
  case 2: p.val_tokens = (uint64_t)param + 1; break;
  case 3: p.val_spec = spec; break;
  }
  tz_data *d = NULL;
  if (tz_data_open(spec, vocab, &p, &d) == 0) {
    if (!tz_data_describe(d) || tz_data_seq_len(d) != T ||
        tz_data_n_files(d) != (p.val_spec ? 2 : 1))
      abort();
    uint64_t first = x >> 2; /* any index: epochs wrap around the split */
    int B = 1 + param % MAX_B;
    check_split(d, TZ_DATA_TRAIN, vocab, first, B);
    check_split(d, TZ_DATA_VAL, vocab, first, B);
    /* The order is a bijection on the training windows (checked on the first 256). */
    uint64_t nt = tz_data_n_samples(d, TZ_DATA_TRAIN), m = nt < 256 ? nt : 256;
    if (nt <= 256) {
      uint8_t seen[256] = {0};
      for (uint64_t i = 0; i < m; i++) {
        uint64_t j = tz_data_permute(x, param, nt, i);
        if (j >= nt || seen[j]++)
          abort();
      }
    }
  }
  tz_data_destroy(d);
  close(fd);
  return 0;
}
