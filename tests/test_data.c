/* Training data: raw text, llm.c shards of both versions, globs of shards, the built-in corpus;
 * every malformed input with the file and offset in its message; the sample order (a bijection,
 * a pure function of seed and index, the same union of samples at every world size, disjoint
 * across ranks); the validation split; determinism. */
#define _GNU_SOURCE
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "trainer/data/corpus.h"
#include "trainer/data/data.h"
#include "trainer/data/pack.h"

#define ASSERT_MSG_HAS(sub)                                                                        \
  do {                                                                                             \
    if (!strstr(tz_err_msg(), (sub)))                                                              \
      print_error("message \"%s\" lacks \"%s\"\n", tz_err_msg(), (sub));                           \
    assert_non_null(strstr(tz_err_msg(), (sub)));                                                  \
  } while (0)

static char *path_in(const char *dir, const char *name) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  return p;
}

static void write_bytes(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(buf, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* An llm.c shard: the header says n_header tokens; n tokens of tsize bytes follow. */
static void write_shard_hdr(const char *path, int32_t magic, int32_t version, int32_t n_header,
                            const uint32_t *tok, size_t n, int tsize) {
  int32_t hdr[TZ_DATA_SHARD_HEADER_INTS] = {0};
  hdr[0] = magic;
  hdr[1] = version;
  hdr[2] = n_header;
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(hdr, sizeof hdr, 1, f), 1);
  for (size_t i = 0; i < n; i++) {
    if (tsize == 2) {
      uint16_t v = (uint16_t)tok[i];
      assert_int_equal(fwrite(&v, 2, 1, f), 1);
    } else {
      assert_int_equal(fwrite(&tok[i], 4, 1, f), 1);
    }
  }
  assert_int_equal(fclose(f), 0);
}

static void write_shard(const char *path, int version, const uint32_t *tok, size_t n) {
  write_shard_hdr(path, TZ_DATA_SHARD_MAGIC, version, (int32_t)n, tok, n, version == 1 ? 2 : 4);
}

/* n tokens in [0, vocab) from seed. */
static uint32_t *make_tokens(size_t n, uint32_t vocab, uint64_t seed) {
  uint32_t *t = malloc(n * sizeof *t);
  assert_non_null(t);
  uint64_t s = seed;
  for (size_t i = 0; i < n; i++)
    t[i] = (uint32_t)(tz_test_rand(&s) % vocab);
  return t;
}

static struct tz_data_params params_T(int T) {
  return (struct tz_data_params){.seq_len = T, .seed = 1234};
}

/* Every training sample of epoch 0 read through tz_data_batch, compared with the expected
 * stream: window w of a file is expect[w*T .. w*T+T]; windows of all samples cover each window
 * exactly once. */
static void check_epoch(tz_data *d, const uint32_t *expect, uint64_t n_windows, int T) {
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN), n_windows);
  uint8_t *seen = calloc(n_windows, 1);
  int32_t *row = malloc((size_t)(T + 1) * sizeof *row);
  for (uint64_t i = 0; i < n_windows; i++) {
    TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, i, 1, row));
    uint64_t w = tz_data_window(d, TZ_DATA_TRAIN, i);
    assert_true(w < n_windows);
    assert_int_equal(seen[w], 0);
    seen[w] = 1;
    for (int t = 0; t <= T; t++)
      assert_int_equal(row[t], (int32_t)expect[w * (uint64_t)T + (uint64_t)t]);
  }
  free(row);
  free(seen);
}

static void test_raw_text(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  char *p = path_in(dir, "text.txt");
  const char *text = "the quick brown fox jumps over the lazy dog, again and again.\n";
  size_t n = strlen(text);
  write_bytes(p, text, n);
  uint32_t *expect = malloc(n * sizeof *expect);
  for (size_t i = 0; i < n; i++)
    expect[i] = (uint8_t)text[i];

  const int T = 8;
  struct tz_data_params prm = params_T(T);
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(p, 256, &prm, &d));
  assert_int_equal(tz_data_seq_len(d), T);
  assert_int_equal(tz_data_n_tokens(d), n);
  assert_int_equal(tz_data_n_files(d), 1);
  check_epoch(d, expect, (n - 1) / T, T);
  assert_non_null(strstr(tz_data_describe(d), "raw text"));
  tz_data_destroy(d);

  /* "text:" reads a .bin name as text too. */
  char *pb = path_in(dir, "text.bin");
  write_bytes(pb, text, n);
  char *spec = NULL;
  assert_true(asprintf(&spec, "text:%s", pb) > 0);
  TZ_ASSERT_OK(tz_data_open(spec, 256, &prm, &d));
  check_epoch(d, expect, (n - 1) / T, T);
  tz_data_destroy(d);

  /* Inputs and targets: the window and the window shifted by one. */
  TZ_ASSERT_OK(tz_data_open(p, 256, &prm, &d));
  int32_t in[3 * 8], tg[3 * 8], row[3 * 9];
  TZ_ASSERT_OK(tz_data_batch_io(d, TZ_DATA_TRAIN, 2, 3, in, tg));
  TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, 2, 3, row));
  for (int b = 0; b < 3; b++)
    for (int t = 0; t < T; t++) {
      assert_int_equal(in[b * T + t], row[b * (T + 1) + t]);
      assert_int_equal(tg[b * T + t], row[b * (T + 1) + t + 1]);
    }
  tz_data_destroy(d);

  /* A byte at or above a small vocabulary: the file, byte offset and token index. */
  assert_int_equal(tz_data_open(p, 'u', &prm, &d), TZ_EFORMAT);
  assert_null(d);
  size_t first_bad = strcspn(text, "uvwxyz");
  char want[128];
  snprintf(want, sizeof want,
           "token %d at byte offset %zu (token %zu) is not below the "
           "vocabulary size %d",
           (unsigned char)text[first_bad], first_bad, first_bad, 'u');
  ASSERT_MSG_HAS(want);
  ASSERT_MSG_HAS(p);

  /* Too short for one window. */
  struct tz_data_params big = params_T((int)n);
  assert_int_equal(tz_data_open(p, 256, &big, &d), TZ_EINVAL);
  ASSERT_MSG_HAS("none to train on");

  /* No such file. */
  char *missing = path_in(dir, "missing.txt");
  assert_int_equal(tz_data_open(missing, 256, &prm, &d), TZ_ENOENT);
  ASSERT_MSG_HAS(missing);

  free(missing);
  free(spec);
  free(pb);
  free(expect);
  free(p);
  tz_test_rmdir(dir);
}

static void test_shards(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  const int T = 16;
  struct tz_data_params prm = params_T(T);
  for (int version = 1; version <= 7; version += 6) {
    uint32_t vocab = version == 1 ? 50257 : 128256;
    size_t n = 1000;
    uint32_t *tok = make_tokens(n, vocab, (uint64_t)version);
    /* The extremes of the range are representable. */
    tok[3] = vocab - 1;
    tok[4] = 0;
    char *p = path_in(dir, version == 1 ? "gpt2.bin" : "llama3.bin");
    write_shard(p, version, tok, n);
    tz_data *d = NULL;
    TZ_ASSERT_OK(tz_data_open(p, (int)vocab, &prm, &d));
    assert_int_equal(tz_data_n_tokens(d), n);
    check_epoch(d, tok, (n - 1) / T, T);
    assert_non_null(strstr(tz_data_describe(d), version == 1 ? "v1" : "v7"));
    tz_data_destroy(d);

    /* A token one past the vocabulary: file, byte offset and index. */
    tok[37] = vocab;
    write_shard(p, version, tok, n);
    assert_int_equal(tz_data_open(p, (int)vocab, &prm, &d), TZ_EFORMAT);
    char want[160];
    snprintf(want, sizeof want,
             "file %s: token %u at byte offset %d (token 37) is not below the vocabulary size %u",
             p, vocab, TZ_DATA_SHARD_HEADER_BYTES + 37 * (version == 1 ? 2 : 4), vocab);
    ASSERT_MSG_HAS(want);

    /* A smaller model vocabulary rejects the same, valid-looking data. */
    tok[37] = 7;
    write_shard(p, version, tok, n);
    assert_int_equal(tz_data_open(p, 256, &prm, &d), TZ_EFORMAT);
    ASSERT_MSG_HAS("is not below the vocabulary size 256");
    free(p);
    free(tok);
  }
  tz_test_rmdir(dir);
}

static void test_shard_errors(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  char *p = path_in(dir, "bad.bin");
  struct tz_data_params prm = params_T(4);
  uint32_t *tok = make_tokens(100, 1000, 9);
  tz_data *d = NULL;
  char want[256];

  /* Truncated: the header promises more than the file holds. */
  write_shard_hdr(p, TZ_DATA_SHARD_MAGIC, 1, 100, tok, 75, 2);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  snprintf(want, sizeof want,
           "file %s: header says 100 tokens (200 bytes) but the file has 150 bytes after the "
           "header",
           p);
  ASSERT_MSG_HAS(want);

  /* Longer than the header says. */
  write_shard_hdr(p, TZ_DATA_SHARD_MAGIC, 7, 10, tok, 11, 4);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("header says 10 tokens (40 bytes) but the file has 44 bytes after the header");

  /* Bad magic. */
  write_shard_hdr(p, 20240521, 1, 100, tok, 100, 2);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  snprintf(want, sizeof want, "file %s: bad magic 20240521 at byte offset 0", p);
  ASSERT_MSG_HAS(want);

  /* Unknown version. */
  write_shard_hdr(p, TZ_DATA_SHARD_MAGIC, 3, 100, tok, 100, 2);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  snprintf(want, sizeof want, "file %s: unknown shard version 3 at byte offset 4", p);
  ASSERT_MSG_HAS(want);

  /* Negative count. */
  write_shard_hdr(p, TZ_DATA_SHARD_MAGIC, 1, -2, tok, 0, 2);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("header says -2 tokens");

  /* Shorter than the header. */
  write_bytes(p, "abc", 3);
  assert_int_equal(tz_data_open(p, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("3 bytes, shorter than the 1024-byte header");

  /* A file without the .bin name but with the magic is read as a shard (and checked as one). */
  char *q = path_in(dir, "tokens.dat");
  write_shard_hdr(q, TZ_DATA_SHARD_MAGIC, 1, 100, tok, 99, 2);
  assert_int_equal(tz_data_open(q, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("header says 100 tokens");
  write_shard(q, 1, tok, 100);
  TZ_ASSERT_OK(tz_data_open(q, 50257, &prm, &d));
  check_epoch(d, tok, 99 / 4, 4);
  tz_data_destroy(d);

  /* Bad parameters. */
  struct tz_data_params bad = {.seq_len = 0};
  assert_int_equal(tz_data_open(q, 50257, &bad, &d), TZ_EINVAL);
  bad = (struct tz_data_params){.seq_len = 4, .val_fraction = 1.0};
  assert_int_equal(tz_data_open(q, 50257, &bad, &d), TZ_EINVAL);

  free(q);
  free(tok);
  free(p);
  tz_test_rmdir(dir);
}

static void test_glob(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  const int T = 10;
  /* Written out of order: the glob is read sorted. One shard is too short for a window and one
   * is empty; neither contributes. */
  const size_t lens[] = {101, 5, 0, 57, 333};
  const char *names[] = {"d_000.bin", "d_001.bin", "d_002.bin", "d_003.bin", "d_004.bin"};
  const int order[] = {3, 0, 4, 2, 1};
  uint32_t *tok[5];
  for (int k = 0; k < 5; k++) {
    int i = order[k];
    tok[i] = make_tokens(lens[i] ? lens[i] : 1, 50000, 100 + (uint64_t)i);
    char *p = path_in(dir, names[i]);
    write_shard(p, 1, tok[i], lens[i]);
    free(p);
  }
  uint64_t n_windows = 0;
  for (int i = 0; i < 5; i++)
    n_windows += lens[i] > (size_t)T ? (lens[i] - 1) / T : 0;
  char *spec = path_in(dir, "d_*.bin");
  struct tz_data_params prm = params_T(T);
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(spec, 50257, &prm, &d));
  assert_int_equal(tz_data_n_files(d), 5);
  assert_int_equal(tz_data_n_tokens(d), 101 + 5 + 57 + 333);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN), n_windows);
  int32_t row[11];
  uint8_t *seen = calloc(n_windows, 1);
  for (uint64_t i = 0; i < n_windows; i++) {
    TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, i, 1, row));
    uint64_t win = tz_data_window(d, TZ_DATA_TRAIN, i);
    assert_false(seen[win]);
    seen[win] = 1;
    /* Which file and where. */
    uint64_t base = 0;
    int f = 0;
    for (; f < 5; f++) {
      uint64_t nw = lens[f] > (size_t)T ? (lens[f] - 1) / T : 0;
      if (win < base + nw)
        break;
      base += nw;
    }
    assert_true(f < 5);
    for (int t = 0; t <= T; t++)
      assert_int_equal(row[t], (int32_t)tok[f][(win - base) * T + (uint64_t)t]);
  }
  assert_non_null(strstr(tz_data_describe(d), "5 files"));
  tz_data_destroy(d);

  /* One bad shard among good ones: that shard is named. */
  char *p2 = path_in(dir, "d_001.bin");
  write_shard_hdr(p2, TZ_DATA_SHARD_MAGIC, 1, 6, tok[1], 5, 2);
  assert_int_equal(tz_data_open(spec, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS(p2);
  ASSERT_MSG_HAS("header says 6 tokens (12 bytes) but the file has 10 bytes after the header");
  write_shard(p2, 1, tok[1], 5);

  /* Shards of two versions in one glob. */
  char *p7 = path_in(dir, "d_005.bin");
  write_shard(p7, 7, tok[0], 101);
  assert_int_equal(tz_data_open(spec, 50257, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("one source holds one kind of token");
  remove(p7);

  /* Nothing matches. */
  char *none = path_in(dir, "x_*.bin");
  assert_int_equal(tz_data_open(none, 50257, &prm, &d), TZ_ENOENT);
  ASSERT_MSG_HAS(none);

  free(none);
  free(p7);
  free(p2);
  free(seen);
  free(spec);
  for (int i = 0; i < 5; i++)
    free(tok[i]);
  tz_test_rmdir(dir);
}

static void test_permutation(void **state) {
  (void)state;
  const uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097, 65537};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    uint64_t n = sizes[k];
    uint8_t *seen = calloc(n, 1);
    uint64_t fixed = 0;
    for (uint64_t i = 0; i < n; i++) {
      uint64_t j = tz_data_permute(77, 3, n, i);
      assert_true(j < n);
      assert_false(seen[j]);
      seen[j] = 1;
      /* A pure function: the same answer again. */
      assert_true(tz_data_permute(77, 3, n, i) == j);
      fixed += j == i;
    }
    /* A shuffle, not the identity: few fixed points once n is large. */
    if (n >= 100)
      assert_true(fixed < n / 10);
    free(seen);
  }
  /* Another seed or epoch gives another order. */
  int same_seed = 0, same_epoch = 0;
  for (uint64_t i = 0; i < 1000; i++) {
    same_seed += tz_data_permute(1, 0, 1000, i) == tz_data_permute(2, 0, 1000, i);
    same_epoch += tz_data_permute(1, 0, 1000, i) == tz_data_permute(1, 1, 1000, i);
  }
  assert_true(same_seed < 50);
  assert_true(same_epoch < 50);
  /* Pinned values: the order must not change between versions, or resumed runs would see other
   * samples. */
  const uint64_t pinned[] = {172456, 145253, 73288, 788031, 77994, 755090, 952587, 72735};
  for (uint64_t i = 0; i < 8; i++)
    assert_true(tz_data_permute(2024, 1, 1000003, i) == pinned[i]);
  /* A huge domain stays in range (the largest Feistel width). */
  uint64_t big = (1ull << 63) + 12345;
  for (uint64_t i = 0; i < 64; i++)
    assert_true(tz_data_permute(5, 0, big, i * 0x9e3779b97f4a7c1ull % big) < big);
}

/* A data set of text with n_windows windows of T+1 bytes. */
static tz_data *open_text(const char *dir, uint64_t n_windows, int T,
                          const struct tz_data_params *prm, char **bytes) {
  size_t n = n_windows * T + 1;
  char *buf = malloc(n);
  tz_test_fill(buf, n, 42);
  char *p = path_in(dir, "ranks.txt");
  write_bytes(p, buf, n);
  tz_data *d = NULL;
  struct tz_data_params q = *prm;
  q.seq_len = T;
  TZ_ASSERT_OK(tz_data_open(p, 256, &q, &d));
  free(p);
  if (bytes)
    *bytes = buf;
  else
    free(buf);
  return d;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static void test_ranks(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  struct tz_data_params prm = {.seed = 99};
  const int T = 4;
  const uint64_t n_windows = 1000;
  tz_data *d = open_text(dir, n_windows, T, &prm, NULL);
  /* Global batch of 24 sequences per step: W ranks x A micro-batches x B sequences. Over S steps
   * that crosses an epoch boundary (1000 windows), so the second epoch is checked too. */
  const int G = 24, A = 2, S = 50;
  const uint64_t total = (uint64_t)G * S;
  uint64_t *ref = NULL;
  for (int W = 1; W <= 4; W *= 2) {
    int B = G / (W * A);
    uint64_t *all = malloc(total * sizeof *all);
    uint64_t k = 0;
    int32_t *tok = malloc((size_t)B * (T + 1) * sizeof *tok);
    for (int s = 0; s < S; s++)
      for (int a = 0; a < A; a++)
        for (int r = 0; r < W; r++) {
          uint64_t first = tz_data_sample_index((uint64_t)s, A, a, W, r, B);
          TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, first, B, tok));
          for (int b = 0; b < B; b++) {
            uint64_t win = tz_data_window(d, TZ_DATA_TRAIN, first + (uint64_t)b);
            /* Tag with the epoch so the two epochs' samples are told apart. */
            all[k++] = ((first + (uint64_t)b) / n_windows) << 32 | win;
          }
        }
    assert_int_equal(k, total);
    /* Within an epoch no window is read twice, by any rank. */
    qsort(all, total, sizeof *all, cmp_u64);
    for (uint64_t i = 1; i < total; i++)
      assert_true(all[i] != all[i - 1]);
    /* The same multiset at every world size. */
    if (!ref)
      ref = all;
    else {
      assert_memory_equal(all, ref, total * sizeof *all);
      free(all);
    }
    free(tok);
  }
  /* The first epoch covers every window. */
  uint64_t in_first = 0;
  for (uint64_t i = 0; i < total; i++)
    in_first += (ref[i] >> 32) == 0;
  assert_int_equal(in_first, n_windows);
  free(ref);

  /* Rank r's samples at W=2 are exactly the W=1 samples of its half of the micro-batch. */
  int32_t one[8 * 5], two[4 * 5];
  for (int s = 0; s < 3; s++)
    for (int r = 0; r < 2; r++) {
      TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, tz_data_sample_index((uint64_t)s, 1, 0, 1, 0, 8),
                                 8, one));
      TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_TRAIN, tz_data_sample_index((uint64_t)s, 1, 0, 2, r, 4),
                                 4, two));
      assert_memory_equal(two, one + r * 4 * 5, sizeof two);
    }
  tz_data_destroy(d);
  tz_test_rmdir(dir);
}

static void test_val_split(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  const int T = 4;
  struct tz_data_params prm = {.seed = 5, .val_fraction = 0.1};
  char *bytes = NULL;
  tz_data *d = open_text(dir, 1000, T, &prm, &bytes);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_VAL), 100);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN), 900);
  /* Validation: the last 100 windows, in order, cycling. */
  for (uint64_t i = 0; i < 250; i++)
    assert_int_equal(tz_data_window(d, TZ_DATA_VAL, i), 900 + i % 100);
  /* Training never reads them, over several epochs. */
  for (uint64_t i = 0; i < 3000; i++)
    assert_true(tz_data_window(d, TZ_DATA_TRAIN, i) < 900);
  /* Validation samples 99 and 100: the file's last window, then its first held-out one. */
  int32_t v[2 * 5];
  TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_VAL, 99, 2, v));
  for (int t = 0; t <= T; t++) {
    assert_int_equal(v[t], (unsigned char)bytes[999 * T + t]);
    assert_int_equal(v[5 + t], (unsigned char)bytes[900 * T + t]);
  }
  free(bytes);
  tz_data_destroy(d);

  /* val_tokens: ceil(41 / 4) = 11 windows. */
  prm = (struct tz_data_params){.seed = 5, .val_tokens = 41};
  d = open_text(dir, 1000, T, &prm, NULL);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_VAL), 11);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN), 989);
  tz_data_destroy(d);

  /* No split asked for: no validation batches. */
  prm = (struct tz_data_params){.seed = 5};
  d = open_text(dir, 50, T, &prm, NULL);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_VAL), 0);
  int32_t row[5];
  assert_int_equal(tz_data_batch(d, TZ_DATA_VAL, 0, 1, row), TZ_EINVAL);
  ASSERT_MSG_HAS("no validation split");
  tz_data_destroy(d);

  /* A separate validation source: all its windows, none of the training file's held out. */
  char *vp = path_in(dir, "val.txt");
  write_bytes(vp, "0123456789abcdefghij", 20);
  prm = (struct tz_data_params){.seed = 5, .val_spec = vp, .val_fraction = 0.5};
  d = open_text(dir, 100, T, &prm, NULL);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN), 100);
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_VAL), 4);
  TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_VAL, 5, 1, row)); /* sample 5 = window 1 */
  const char *w1 = "4567"
                   "8";
  for (int i = 0; i < 5; i++)
    assert_int_equal(row[i], w1[i]);
  tz_data_destroy(d);
  free(vp);
  tz_test_rmdir(dir);
}

static void test_determinism(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  struct tz_data_params prm = {.seed = 7};
  const int T = 16, B = 8;
  int32_t a[8 * 17], b[8 * 17];
  tz_data *d1 = open_text(dir, 500, T, &prm, NULL);
  tz_data *d2 = open_text(dir, 500, T, &prm, NULL);
  for (uint64_t first = 0; first < 2000; first += 333) {
    TZ_ASSERT_OK(tz_data_batch(d1, TZ_DATA_TRAIN, first, B, a));
    TZ_ASSERT_OK(tz_data_batch(d2, TZ_DATA_TRAIN, first, B, b));
    assert_memory_equal(a, b, sizeof a);
  }
  /* Reading an index again, after others, gives the same (no hidden cursor). */
  TZ_ASSERT_OK(tz_data_batch(d1, TZ_DATA_TRAIN, 0, B, a));
  TZ_ASSERT_OK(tz_data_batch(d1, TZ_DATA_TRAIN, 1332, B, b));
  TZ_ASSERT_OK(tz_data_batch(d1, TZ_DATA_TRAIN, 0, B, b));
  assert_memory_equal(a, b, sizeof a);
  tz_data_destroy(d2);
  /* Another seed, another order. */
  prm.seed = 8;
  d2 = open_text(dir, 500, T, &prm, NULL);
  TZ_ASSERT_OK(tz_data_batch(d2, TZ_DATA_TRAIN, 0, B, b));
  assert_memory_not_equal(a, b, sizeof a);
  tz_data_destroy(d2);
  tz_data_destroy(d1);
  tz_test_rmdir(dir);
}

static void test_builtin(void **state) {
  (void)state;
  char *c1 = NULL, *c2 = NULL;
  size_t n1 = 0, n2 = 0;
  TZ_ASSERT_OK(tz_corpus_generate(&c1, &n1));
  TZ_ASSERT_OK(tz_corpus_generate(&c2, &n2));
  assert_int_equal(n1, TZ_CORPUS_BYTES);
  assert_true(n1 >= 200 * 1024 && n1 <= 500 * 1024);
  assert_int_equal(n1, n2);
  assert_memory_equal(c1, c2, n1);
  assert_int_equal(strlen(c1), n1);
  /* Printable ASCII and newlines only, made of the grammar's sentences. */
  for (size_t i = 0; i < n1; i++)
    assert_true(c1[i] == '\n' || (c1[i] >= ' ' && c1[i] < 127));
  assert_non_null(strstr(c1, "count from "));
  assert_non_null(strstr(c1, " is spelled "));
  assert_non_null(strstr(c1, "\n\n"));
  /* Varied: many distinct lines. */
  int paragraphs = 0;
  for (const char *p = c1; (p = strstr(p, "\n\n")); p += 2)
    paragraphs++;
  assert_true(paragraphs > 500);

  struct tz_data_params prm = {.seq_len = 64, .val_fraction = 0.05, .seed = 1};
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(NULL, 256, &prm, &d));
  uint64_t nw = (n1 - 1) / 64;
  assert_int_equal(tz_data_n_samples(d, TZ_DATA_TRAIN) + tz_data_n_samples(d, TZ_DATA_VAL), nw);
  int32_t row[65];
  TZ_ASSERT_OK(tz_data_batch(d, TZ_DATA_VAL, 0, 1, row));
  uint64_t w = tz_data_window(d, TZ_DATA_VAL, 0);
  for (int t = 0; t <= 64; t++)
    assert_int_equal(row[t], (unsigned char)c1[w * 64 + (uint64_t)t]);
  assert_non_null(strstr(tz_data_describe(d), "built-in corpus"));
  tz_data_destroy(d);
  TZ_ASSERT_OK(tz_data_open("builtin", 256, &prm, &d));
  tz_data_destroy(d);
  /* The corpus is bytes: a model with a smaller vocabulary cannot read it. */
  assert_int_equal(tz_data_open(NULL, 100, &prm, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("built-in corpus");
  tz_data_destroy(NULL);
  free(c1);
  free(c2);
}

/* A data path that is not a regular file (a FIFO nobody writes) is refused at once, naming it;
 * opening it for reading must not wait for a writer. The open runs in a child with an alarm so
 * that a hang fails the test instead of stopping the suite. */
static void test_fifo_refused(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data-fifo");
  char *p = path_in(dir, "fifo");
  assert_int_equal(mkfifo(p, 0600), 0);
  char spec[1100];
  snprintf(spec, sizeof spec, "text:%s", p);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(5);
    struct tz_data_params prm = params_T(8);
    tz_data *d = NULL;
    int rc = tz_data_open(spec, 256, &prm, &d);
    _exit(rc == TZ_EINVAL && strstr(tz_err_msg(), p) && strstr(tz_err_msg(), "not a regular file")
              ? 0
              : 1);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (WIFSIGNALED(status))
    print_error("tz_data_open of a FIFO hung (killed by signal %d)\n", WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 0);
  unlink(p);
  free(p);
  tz_test_rmdir(dir);
}

/* Text where tokens are expected is read as bytes only where that is meant (issue 49 item 6):
 * JSON lines are refused whatever the vocabulary, any text for a vocabulary larger than bytes',
 * each naming the file and the tz-data command; "text:" reads either as bytes. */
static void test_text_as_tokens_refused(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data-json");
  char *js = path_in(dir, "chat.jsonl"), *txt = path_in(dir, "notes.txt");
  const char *line = "{\"text\": \"the quick brown fox jumps over the lazy dog\"}\n";
  write_bytes(js, line, strlen(line));
  write_bytes(txt, line, strlen(line));
  struct tz_data_params prm = params_T(8);
  tz_data *d = NULL;
  assert_int_equal(tz_data_open(js, 256, &prm, &d), TZ_EFORMAT);
  assert_non_null(strstr(tz_err_msg(), js));
  assert_non_null(strstr(tz_err_msg(), "tools/tz-data --tokenizer MODEL_DIR --out DIR --field"));
  assert_int_equal(tz_data_open(txt, 32000, &prm, &d), TZ_EFORMAT);
  assert_non_null(strstr(tz_err_msg(), "not token shards"));
  /* a byte vocabulary reads a text file as bytes, as the presets do */
  TZ_ASSERT_OK(tz_data_open(txt, 256, &prm, &d));
  tz_data_destroy(d);
  char spec[1100];
  snprintf(spec, sizeof spec, "text:%s", js);
  TZ_ASSERT_OK(tz_data_open(spec, 32000, &prm, &d));
  tz_data_destroy(d);
  /* and as validation data too */
  prm.val_spec = js;
  assert_int_equal(tz_data_open(spec, 256, &prm, &d), TZ_EFORMAT);
  unlink(js);
  unlink(txt);
  free(js);
  free(txt);
  tz_test_rmdir(dir);
}

/* SHA-256 of known texts (FIPS 180-4's examples, and one of more than one block). */
static void test_sha256(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  char *p = path_in(dir, "t");
  static const struct {
    const char *text, *hex;
  } cases[] = {
      {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
      {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
      {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
       "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
  };
  char hex[65];
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    write_bytes(p, cases[i].text, strlen(cases[i].text));
    TZ_ASSERT_OK(tz_data_file_sha256(p, hex));
    assert_string_equal(hex, cases[i].hex);
  }
  /* A million 'a': many blocks, and reads of more than one buffer. */
  char *a = malloc(1000000);
  assert_non_null(a);
  memset(a, 'a', 1000000);
  write_bytes(p, a, 1000000);
  free(a);
  TZ_ASSERT_OK(tz_data_file_sha256(p, hex));
  assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  unlink(p);
  assert_int_equal(tz_data_file_sha256(p, hex), TZ_ENOENT);
  ASSERT_MSG_HAS(p);
  free(p);
  tz_test_rmdir(dir);
}

/* sidecar of shard p: the tokenizer's hash and vocabulary, its ids, and the token count. */
static void write_sidecar(const char *p, const char *sha, int vocab, long long tokens) {
  char *side = NULL, text[512];
  assert_true(asprintf(&side, "%s.json", p) > 0);
  snprintf(text, sizeof text,
           "{\"format\": \"tierzero.tokens\", \"version\": 1, \"tokenizer_sha256\": \"%s\", "
           "\"vocab_size\": %d, \"bos_id\": 1, \"eos_id\": 2, \"pad_id\": null, \"tokens\": %lld}",
           sha, vocab, tokens);
  write_bytes(side, text, strlen(text));
  free(side);
}

/* Sidecars (tools/tz-data's): read and given back; a tokenizer vocabulary larger than the
 * model's, another tokenizer than the one asked for, two tokenizers in one data set and the
 * sidecar of another shard are refused, naming the files and both values. */
static void test_sidecar(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  const size_t n = 400;
  uint32_t *tok = make_tokens(n, 300, 5);
  char *a = path_in(dir, "x_000.bin"), *b = path_in(dir, "x_001.bin"), *v = path_in(dir, "v.bin");
  char *tj = path_in(dir, "tokenizer.json"), *other = path_in(dir, "other.json");
  char *glob_spec = path_in(dir, "x_*.bin");
  write_shard(a, 1, tok, n);
  write_shard(b, 1, tok, n);
  write_shard(v, 1, tok, n);
  write_bytes(tj, "{\"model\": 1}", 12);
  write_bytes(other, "{\"model\": 2}", 12);
  char sha[65], sha2[65];
  TZ_ASSERT_OK(tz_data_file_sha256(tj, sha));
  TZ_ASSERT_OK(tz_data_file_sha256(other, sha2));
  struct tz_data_params prm = params_T(16);
  tz_data *d = NULL;

  /* No sidecar: nothing known, and a tokenizer to check against changes nothing. */
  prm.tokenizer = tj;
  TZ_ASSERT_OK(tz_data_open(glob_spec, 300, &prm, &d));
  assert_int_equal(tz_data_tokenizer(d)->known, 0);
  tz_data_destroy(d);

  write_sidecar(a, sha, 300, (long long)n);
  write_sidecar(b, sha, 300, (long long)n);
  TZ_ASSERT_OK(tz_data_open(glob_spec, 320, &prm, &d));
  const struct tz_data_tokenizer *t = tz_data_tokenizer(d);
  assert_int_equal(t->known, 1);
  assert_string_equal(t->sha256, sha);
  assert_int_equal(t->vocab, 300);
  assert_true(t->has_bos && t->bos_id == 1 && t->has_eos && t->eos_id == 2 && !t->has_pad);
  tz_data_destroy(d);

  /* The model is smaller than the tokenizer, though every token of the shard fits. */
  uint32_t *small = make_tokens(n, 200, 6);
  write_shard(a, 1, small, n);
  write_shard(b, 1, small, n);
  assert_int_equal(tz_data_open(glob_spec, 256, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("x_000.bin.json: the tokenizer's vocabulary (vocab_size 300) is larger than "
                 "the model's (vocab_size 256)");

  /* Another tokenizer than the model's: both files and both hashes named. */
  prm.tokenizer = other;
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("x_000.bin.json was made by another tokenizer than ");
  ASSERT_MSG_HAS(other);
  ASSERT_MSG_HAS(sha);
  ASSERT_MSG_HAS(sha2);
  prm.tokenizer = NULL; /* nothing to compare with: accepted */
  TZ_ASSERT_OK(tz_data_open(glob_spec, 300, &prm, &d));
  tz_data_destroy(d);

  /* Two tokenizers in one data set, and in the validation set against the training set's. */
  write_sidecar(b, sha2, 300, (long long)n);
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("were made by different tokenizers");
  write_sidecar(b, sha, 300, (long long)n);
  write_sidecar(v, sha2, 300, (long long)n);
  prm.val_spec = v;
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("v.bin.json and ");
  write_sidecar(v, sha, 300, (long long)n);
  TZ_ASSERT_OK(tz_data_open(glob_spec, 300, &prm, &d));
  tz_data_destroy(d);
  prm.val_spec = NULL;

  /* The sidecar of another shard (its token count), and one that is not tz-data's. */
  write_sidecar(a, sha, 300, (long long)n + 1);
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("says 401 tokens but");
  char *side = path_in(dir, "x_000.bin.json");
  write_bytes(side, "[1, 2]", 6);
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("x_000.bin.json: expected an object");
  /* An id past the tokenizer's own vocabulary (the export would write a config.json that no
   * reader takes), and a hash that is not hex. */
  write_sidecar(a, sha, 2, (long long)n);
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("\"eos_id\" must be a token id below its vocab_size 2");
  char bad_sha[65];
  memset(bad_sha, 'G', 64);
  bad_sha[64] = '\0';
  write_sidecar(a, bad_sha, 300, (long long)n);
  assert_int_equal(tz_data_open(glob_spec, 300, &prm, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("x_000.bin.json: expected an object with \"tokenizer_sha256\" (64 hex");
  free(side);
  free(small);
  free(tok);
  free(a);
  free(b);
  free(v);
  free(tj);
  free(other);
  free(glob_spec);
  tz_test_rmdir(dir);
}

/* ---- packed documents ---- */

/* Best-fit decreasing by hand: 9, 8, 7 and 5 open rows of 10; 2 goes to the row with room 2 (the
 * 8's), 1 to the one with room 1 (the 9's). Ties by index; a length outside [1, T] is refused. */
static void test_pack_best_fit(void **state) {
  (void)state;
  const uint32_t len[] = {9, 8, 2, 7, 1, 5};
  struct tz_pack p;
  TZ_ASSERT_OK(tz_pack_best_fit(len, 6, 10, &p));
  assert_int_equal(p.n_rows, 4);
  const uint64_t start[] = {0, 2, 4, 5, 6}, piece[] = {0, 4, 1, 2, 3, 5};
  assert_memory_equal(p.row_start, start, sizeof start);
  assert_memory_equal(p.piece, piece, sizeof piece);
  tz_pack_free(&p);
  const uint32_t same[] = {3, 3, 3, 3};
  TZ_ASSERT_OK(tz_pack_best_fit(same, 4, 6, &p));
  const uint64_t piece2[] = {0, 1, 2, 3};
  assert_int_equal(p.n_rows, 2);
  assert_memory_equal(p.piece, piece2, sizeof piece2);
  tz_pack_free(&p);
  const uint32_t bad[] = {3, 7};
  assert_int_equal(tz_pack_best_fit(bad, 2, 6, &p), TZ_EINVAL);
  ASSERT_MSG_HAS("piece 1 has 7 tokens");
  /* Many random lengths at T = 4096 (the two-level room bitmap past one word of words): every
   * row holds at most T, and a row is opened only when no row had room. */
  enum { N = 3000, T = 4096 };
  uint32_t *many = malloc(N * sizeof *many);
  uint64_t st = 3;
  for (int i = 0; i < N; i++)
    many[i] = 1 + (uint32_t)(tz_test_rand(&st) % T);
  TZ_ASSERT_OK(tz_pack_best_fit(many, N, T, &p));
  uint64_t total = 0, least_room = T;
  for (uint64_t r = 0; r < p.n_rows; r++) {
    uint64_t used = 0;
    for (uint64_t j = p.row_start[r]; j < p.row_start[r + 1]; j++)
      used += many[p.piece[j]];
    assert_true(used <= T);
    total += used;
    if (T - used < least_room)
      least_room = T - used;
  }
  for (int i = 0; i < N; i++)
    total -= many[i];
  assert_true(total == 0);
  assert_true(p.n_rows < N);
  free(many);
  tz_pack_free(&p);
}

/* Documents of random lengths 2..40 (some longer than T + 1 = 17), their second halves targets,
 * every seventh with none; n tokens into tok and m. Returns the number of documents. */
static int make_docs(uint32_t *tok, uint8_t *m, size_t n, uint64_t seed) {
  uint64_t st = seed;
  size_t k = 0;
  int docs = 0;
  while (k < n) {
    size_t len = 2 + tz_test_rand(&st) % 39;
    if (len > n - k)
      len = n - k;
    for (size_t i = 0; i < len; i++) {
      tok[k + i] = 3 + (uint32_t)(tz_test_rand(&st) % 290);
      m[k + i] = i == 0                          ? TZ_DATA_MASK_START
                 : docs % 7 != 3 && i >= len / 2 ? TZ_DATA_MASK_TARGET
                                                 : 0;
    }
    k += len;
    docs++;
  }
  return docs;
}

/* Every training row of epoch 0 read back: each document with a target appears once, whole (cut
 * to T + 1 tokens), its inputs and targets as the mask says and positions from 0; one without
 * targets never; padding is token 0, no target, positions from 0; tz_data_targets counts the
 * targets. With split, the long ones come as pieces of T + 1 sharing a token. */
static void check_packed(tz_data *d, const uint32_t *tok, const uint8_t *m, size_t n, int T,
                         int split) {
  uint64_t rows = tz_data_n_samples(d, TZ_DATA_TRAIN);
  assert_true(tz_data_packed(d));
  int32_t *in = malloc(rows * T * 4), *tg = malloc(rows * T * 4), *pos = malloc(rows * T * 4);
  TZ_ASSERT_OK(tz_data_batch_docs(d, TZ_DATA_TRAIN, 0, (int)rows, in, tg, pos));
  /* The expected pieces, in document order: (start, tokens). */
  size_t np = 0, cap = n, *ps = malloc(cap * sizeof *ps), *pl = malloc(cap * sizeof *pl);
  uint64_t targets = 0;
  for (size_t k = 0; k < n;) {
    size_t e = k + 1;
    while (e < n && !(m[e] & TZ_DATA_MASK_START))
      e++;
    size_t end = split || e - k <= (size_t)T + 1 ? e : k + T + 1;
    for (size_t p0 = k; p0 + 1 < end; p0 += T) {
      size_t p1 = p0 + T + 1 < end ? p0 + T + 1 : end, tgs = 0;
      for (size_t t = p0 + 1; t < p1; t++)
        tgs += m[t] & TZ_DATA_MASK_TARGET;
      if (tgs) {
        ps[np] = p0, pl[np++] = p1 - p0;
        targets += tgs;
      }
    }
    k = e;
  }
  int *seen = calloc(np, sizeof *seen);
  uint64_t row_targets = 0;
  for (uint64_t r = 0; r < rows; r++) {
    const int32_t *ri = in + r * T, *rt = tg + r * T, *rp = pos + r * T;
    assert_int_equal(rp[0], 0);
    for (int t = 0; t < T;) {
      int e = t + 1;
      while (e < T && rp[e] != 0)
        e++;
      for (int u = t; u < e; u++)
        assert_int_equal(rp[u], u - t);
      size_t which = np;
      for (size_t q = 0; q < np && which == np; q++)
        if (pl[q] - 1 == (size_t)(e - t) && (uint32_t)ri[t] == tok[ps[q]] &&
            (uint32_t)ri[e - 1] == tok[ps[q] + pl[q] - 2] && !seen[q]) {
          int same = 1;
          for (int u = t; u < e && same; u++)
            same = (uint32_t)ri[u] == tok[ps[q] + (u - t)];
          which = same ? q : np;
        }
      if (which == np) { /* padding: the row's end */
        assert_int_equal(e, T);
        for (int u = t; u < e; u++)
          assert_true(ri[u] == 0 && rt[u] == -1);
      } else {
        seen[which]++;
        for (int u = t; u < e; u++) {
          size_t k = ps[which] + (u - t) + 1;
          int32_t want = m[k] & TZ_DATA_MASK_TARGET ? (int32_t)tok[k] : -1;
          assert_int_equal(rt[u], want);
          row_targets += want >= 0;
        }
      }
      t = e;
    }
  }
  for (size_t q = 0; q < np; q++)
    assert_int_equal(seen[q], 1);
  assert_true(row_targets == targets);
  assert_true(tz_data_targets(d, TZ_DATA_TRAIN, 0, rows) == targets);
  free(in), free(tg), free(pos), free(ps), free(pl), free(seen);
}

static void test_packed(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("data");
  enum { N = 3000, T = 16 };
  uint32_t *tok = malloc(N * sizeof *tok);
  uint8_t *m = malloc(N);
  int docs = make_docs(tok, m, N, 9);
  char *a = path_in(dir, "c_000.bin");
  write_shard(a, 1, tok, N);
  tz_test_write_mask(a, tok, m, N);
  struct tz_data_params p = params_T(T);
  tz_data *d = NULL;
  TZ_ASSERT_OK(tz_data_open(a, 300, &p, &d));
  check_packed(d, tok, m, N, T, 0);
  char want[64];
  snprintf(want, sizeof want, "packed: %d documents", docs);
  assert_non_null(strstr(tz_data_describe(d), want));
  assert_non_null(strstr(tz_data_describe(d), "without a target left out"));
  int32_t x[T], y[T * 2];
  assert_int_equal(tz_data_batch(d, TZ_DATA_TRAIN, 0, 1, y), TZ_EINVAL); /* T+1 form: none */
  (void)x;
  tz_data_destroy(d);
  p.split_long = 1;
  TZ_ASSERT_OK(tz_data_open(a, 300, &p, &d));
  check_packed(d, tok, m, N, T, 1);
  tz_data_destroy(d);
  p.split_long = 0;
  /* Validation: the last tenth of the documents, packed apart. */
  p.val_fraction = 0.1;
  TZ_ASSERT_OK(tz_data_open(a, 300, &p, &d));
  assert_true(tz_data_n_samples(d, TZ_DATA_VAL) > 0);
  int32_t vi[T], vt[T], vp[T];
  TZ_ASSERT_OK(tz_data_batch_docs(d, TZ_DATA_VAL, 0, 1, vi, vt, vp));
  assert_true(tz_data_targets(d, TZ_DATA_VAL, 0, 1) > 0);
  tz_data_destroy(d);
  p.val_fraction = 0;

  /* The mask of another shard: same length, other tokens. */
  char *b = path_in(dir, "c_001.bin"), *bm = NULL, *am = NULL;
  assert_true(asprintf(&bm, "%s.mask", b) > 0 && asprintf(&am, "%s.mask", a) > 0);
  uint32_t *tok2 = make_tokens(N, 290, 4);
  write_shard(b, 1, tok2, N);
  assert_int_equal(link(am, bm), 0);
  assert_int_equal(tz_data_open(b, 300, &p, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("c_001.bin.mask: made for a shard whose tokens have crc32");
  ASSERT_MSG_HAS("another shard's mask");
  unlink(bm);
  /* One shard with a mask and one without. */
  char *glob = path_in(dir, "c_*.bin");
  assert_int_equal(tz_data_open(glob, 300, &p, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("has a mask file and");
  /* A damaged byte. */
  uint8_t *m2 = malloc(N);
  memcpy(m2, m, N);
  tz_test_write_mask(b, tok2, m2, N);
  FILE *f = fopen(bm, "r+b");
  assert_non_null(f);
  assert_int_equal(fseek(f, TZ_DATA_SHARD_HEADER_BYTES + 100, SEEK_SET), 0);
  assert_int_equal(fputc(m2[100] ^ TZ_DATA_MASK_TARGET, f), m2[100] ^ TZ_DATA_MASK_TARGET);
  assert_int_equal(fclose(f), 0);
  assert_int_equal(tz_data_open(b, 300, &p, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("the file is damaged");
  /* A document's first token marked a target. */
  m2[0] |= TZ_DATA_MASK_TARGET;
  tz_test_write_mask(b, tok2, m2, N);
  assert_int_equal(tz_data_open(b, 300, &p, &d), TZ_EFORMAT);
  ASSERT_MSG_HAS("byte offset 1024 (token 0) marks a document's first token a target");
  /* A sidecar naming a mask that is gone. */
  unlink(bm);
  char *side = NULL, text[400];
  assert_true(asprintf(&side, "%s.json", b) > 0);
  snprintf(text, sizeof text,
           "{\"tokenizer_sha256\": \"%064d\", \"vocab_size\": 300, \"tokens\": %d, \"mask\": "
           "\"c_001.bin.mask\"}",
           0, N);
  write_bytes(side, text, strlen(text));
  assert_int_equal(tz_data_open(b, 300, &p, &d), TZ_ECONFIG);
  ASSERT_MSG_HAS("names the mask file c_001.bin.mask");
  free(tok), free(m), free(m2), free(tok2), free(a), free(b), free(am), free(bm), free(glob);
  free(side);
  tz_test_rmdir(dir);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_raw_text),
      cmocka_unit_test(test_shards),
      cmocka_unit_test(test_shard_errors),
      cmocka_unit_test(test_glob),
      cmocka_unit_test(test_permutation),
      cmocka_unit_test(test_ranks),
      cmocka_unit_test(test_val_split),
      cmocka_unit_test(test_determinism),
      cmocka_unit_test(test_builtin),
      cmocka_unit_test(test_fifo_refused),
      cmocka_unit_test(test_sha256),
      cmocka_unit_test(test_sidecar),
      cmocka_unit_test(test_text_as_tokens_refused),
      cmocka_unit_test(test_pack_best_fit),
      cmocka_unit_test(test_packed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
