/* Fuzz target: the data loader (trainer/data/data.h) on fine-tuning data, an llm.c shard with a
 * mask file beside it (PATH.mask: which tokens are targets, where documents start), packed into
 * rows at open (trainer/data/pack.h).
 *
 * Input: u8 T - 1 (T = 1 + it % 64), u8 flags, u8 vocabulary choice, u8 a parameter, u64 seed and
 * sample index, u16 n (little-endian, cut to the tokens there are), n u16 tokens, the mask
 * header's first 7 u32 (magic, version, tokens, the tokens' crc32, the mask bytes' crc32, targets,
 * documents), then the mask's n bytes (zero where the input ends). The shard's own header is
 * always right (fuzz_data fuzzes shards). Flags:
 *   1  split documents longer than a row into pieces (tz_data_params.split_long), else cut them
 *   2  correct the mask header for its bytes, so that mutations reach the checks of the bytes
 *   4  make the mask bytes valid (known bits, token 0 a start, a start never a target; with 2),
 *      so that mutations reach the packing
 *   8  hold out a quarter of the rows for validation
 *   16 write what follows the mask's bytes as the shard's sidecar (PATH.json, tools/tz-data's:
 *      the tokenizer's sha256, vocabulary and token ids)
 * Besides memory errors and undefined behaviour, it checks what data.h promises of a refusal (a
 * message naming the shard or its mask) and of packed rows: every token below the vocabulary;
 * positions 0 at a row's start and restarting at 0 or counting up by one; inside a document a
 * target is the next input; each of a row's documents a piece of one of the shard's (from its
 * first token, or T apart when split) with the mask's targets and no others, then padding that
 * is never a target; as many targets in the rows as tz_data_targets counts (the loss's
 * divisor); a sidecar's tokenizer no larger than the model's vocabulary, its ids below its own. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "tests/fuzz/fuzz_files.h"
#include "trainer/data/data.h"
#include "util/crc32.h"

#define MAX_B 3
#define MAX_T 64

static char root[256], shard[300], mask[320], sidecar[320];

static void cleanup(void) {
  unlink(shard);
  unlink(mask);
  unlink(sidecar);
  rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR);
  fuzz_tmpdir(root, sizeof root, "packed");
  snprintf(shard, sizeof shard, "%s/sft.bin", root);
  snprintf(mask, sizeof mask, "%s/sft.bin.mask", root);
  snprintf(sidecar, sizeof sidecar, "%s/sft.bin.json", root);
  atexit(cleanup);
  return 0;
}

static void fail(const char *what, uint64_t at) {
  fprintf(stderr, "fuzz_packed: %s (sample %llu)\n", what, (unsigned long long)at);
  abort();
}

/* A row that breaks a promise, printed before the abort: input, target, position a token. */
static void dump_row(const int32_t *x, const int32_t *y, const int32_t *p, int T) {
  for (int t = 0; t < T; t++)
    fprintf(stderr, "  %2d: input %5d target %5d pos %2d\n", t, x[t], y[t], p[t]);
}

/* The shard's tokens and mask bytes as written, for check_rows. */
static const uint8_t *g_tok, *g_mask;
static size_t g_n;
static int g_split;

static unsigned tok_at(size_t k) {
  return (unsigned)g_tok[2 * k] | (unsigned)g_tok[2 * k + 1] << 8;
}

/* 1 when a row's segment (k predictions from document position 0: inputs x, targets y) is a
 * piece of a document of the shard: it starts at a document's first token (split documents: T
 * tokens on from one, T apart), stays inside that document, its inputs are the shard's tokens
 * and its targets the next tokens where the mask marks them targets, -1 elsewhere. */
static int is_piece(const int32_t *x, const int32_t *y, int k, int T) {
  for (size_t s = 0; s + (size_t)k < g_n; s++) {
    size_t doc = s;
    while (!(g_mask[doc] & TZ_DATA_MASK_START))
      doc--; /* token 0 starts a document (the mask check refuses a mask where it does not) */
    if (g_split ? (s - doc) % (size_t)T != 0 : s != doc)
      continue;
    int ok = 1;
    for (int i = 0; ok && i < k; i++) {
      size_t t = s + (size_t)i;
      int32_t want = g_mask[t + 1] & TZ_DATA_MASK_TARGET ? (int32_t)tok_at(t + 1) : -1;
      ok = !(g_mask[t + 1] & TZ_DATA_MASK_START) && x[i] == (int32_t)tok_at(t) && y[i] == want;
    }
    if (ok)
      return 1;
  }
  return 0;
}

static void check_rows(const tz_data *d, enum tz_data_split s, int vocab, uint64_t first, int B) {
  const int T = tz_data_seq_len(d);
  int32_t in[MAX_B * MAX_T], tg[MAX_B * MAX_T], pos[MAX_B * MAX_T];
  int rc = tz_data_batch_docs(d, s, first, B, in, tg, pos);
  if (tz_data_n_samples(d, s) == 0) {
    if (rc == 0)
      fail("a batch of a split without samples", first);
    return;
  }
  if (rc != 0) {
    fprintf(stderr, "fuzz_packed: batch of %d at %llu: %s\n", B, (unsigned long long)first,
            tz_err_msg());
    abort();
  }
  uint64_t targets = 0;
  for (int b = 0; b < B; b++) {
    const int32_t *x = in + b * T, *y = tg + b * T, *p = pos + b * T;
    if (p[0] != 0)
      fail("a row that does not start at position 0", first + (uint64_t)b);
    for (int t = 0; t < T; t++) {
      if (x[t] < 0 || x[t] >= vocab || y[t] < -1 || y[t] >= vocab)
        fail("a token outside the vocabulary", first + (uint64_t)b);
      if (t > 0 && p[t] != 0 && p[t] != p[t - 1] + 1)
        fail("a position that neither restarts nor counts up", first + (uint64_t)b);
      if (y[t] < 0)
        continue;
      targets++;
      /* inside a document the target is the next input; a document's last prediction is of
       * its last token, which is no input (it predicts nothing of its own document) */
      if (t + 1 < T && p[t + 1] == p[t] + 1 && y[t] != x[t + 1] && (dump_row(x, y, p, T), 1))
        fail("a target that is not the next input of its document", first + (uint64_t)b);
    }
  }
  /* every segment a piece of a document of the shard, but padding (no target: token 0, a
   * document of its own) at the row's end */
  for (int b = 0; b < B; b++) {
    const int32_t *x = in + b * T, *y = tg + b * T, *p = pos + b * T;
    for (int t0 = 0, t1; t0 < T; t0 = t1) {
      int any = y[t0] >= 0;
      for (t1 = t0 + 1; t1 < T && p[t1] == p[t1 - 1] + 1; t1++)
        any |= y[t1] >= 0;
      int padding = !any && t1 == T;
      for (int t = t0; padding && t < T; t++)
        padding = x[t] == 0;
      if (!padding && !is_piece(x + t0, y + t0, t1 - t0, T) && (dump_row(x, y, p, T), 1))
        fail("a row's document that is no piece of the shard's", first + (uint64_t)b);
    }
  }
  if (targets != tz_data_targets(d, s, first, (uint64_t)B))
    fail("rows whose targets tz_data_targets does not count", first);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 14)
    return 0;
  static const int vocabs[] = {65536, 256, 17, 1};
  const int T = 1 + data[0] % MAX_T, flags = data[1], vocab = vocabs[data[2] % 4], param = data[3];
  uint64_t x;
  memcpy(&x, data + 4, 8);
  size_t n = (size_t)data[12] | (size_t)data[13] << 8;
  const uint8_t *rest = data + 14;
  size_t left = size - 14;
  if (n > left / 2)
    n = left / 2;
  const uint8_t *tok = rest;
  rest += 2 * n, left -= 2 * n;

  /* the shard: llm.c's header (magic, version 1: u16 tokens, count), then the tokens */
  int32_t sh[TZ_DATA_SHARD_HEADER_INTS] = {TZ_DATA_SHARD_MAGIC, 1, (int32_t)n};
  fuzz_put2(shard, sh, sizeof sh, tok, 2 * n);

  /* the mask: the input's header and bytes, corrected as the flags say */
  uint32_t mh[TZ_DATA_SHARD_HEADER_INTS] = {0};
  memcpy(mh, rest, left < 28 ? left : 28);
  rest += left < 28 ? left : 28, left -= left < 28 ? left : 28;
  uint8_t *m = calloc(n ? n : 1, 1);
  if (!m)
    abort();
  memcpy(m, rest, left < n ? left : n);
  if (flags & 2) {
    uint32_t targets = 0, docs = 0;
    for (size_t k = 0; k < n; k++) {
      if (flags & 4) {
        m[k] &= TZ_DATA_MASK_TARGET | TZ_DATA_MASK_START;
        if (k == 0)
          m[k] |= TZ_DATA_MASK_START;
        if (m[k] & TZ_DATA_MASK_START)
          m[k] &= (uint8_t)~TZ_DATA_MASK_TARGET;
      }
      targets += (m[k] & TZ_DATA_MASK_TARGET) != 0;
      docs += (m[k] & TZ_DATA_MASK_START) != 0;
    }
    mh[0] = TZ_DATA_MASK_MAGIC, mh[1] = 1, mh[2] = (uint32_t)n;
    mh[3] = tz_crc32(0, tok, 2 * n), mh[4] = tz_crc32(0, m, n), mh[5] = targets, mh[6] = docs;
  }
  fuzz_put2(mask, mh, sizeof mh, m, n);
  g_tok = tok, g_mask = m, g_n = n, g_split = flags & 1;
  /* the sidecar: what follows the mask's bytes */
  rest += left < n ? left : n, left -= left < n ? left : n;
  if (flags & 16)
    fuzz_put(sidecar, rest, left);
  else
    unlink(sidecar);

  struct tz_data_params p = {.seq_len = T, .seed = x, .split_long = flags & 1};
  if (flags & 8)
    p.val_fraction = 0.25;
  tz_data *d = NULL;
  tz_err_clear();
  if (tz_data_open(shard, vocab, &p, &d) != 0) {
    const char *msg = tz_err_msg();
    if (!msg || !*msg || !strstr(msg, shard))
      fail(msg && *msg ? msg : "a refusal without a message", 0);
    free(m);
    return 0;
  }
  if (!tz_data_packed(d) || !tz_data_pack_describe(d) || !*tz_data_pack_describe(d))
    fail("a shard with a mask that is not read as packed rows", 0);
  const struct tz_data_tokenizer *tk = tz_data_tokenizer(d);
  if (tk->known && (!(flags & 16) || tk->vocab < 1 || tk->vocab > vocab ||
                    (tk->has_bos && (tk->bos_id < 0 || tk->bos_id >= tk->vocab)) ||
                    (tk->has_eos && (tk->eos_id < 0 || tk->eos_id >= tk->vocab)) ||
                    (tk->has_pad && (tk->pad_id < 0 || tk->pad_id >= tk->vocab)) ||
                    strspn(tk->sha256, "0123456789abcdef") != 64))
    fail("a sidecar's tokenizer outside what data.h promises", 0);
  const int B = 1 + param % MAX_B;
  check_rows(d, TZ_DATA_TRAIN, vocab, x >> 2, B);
  check_rows(d, TZ_DATA_VAL, vocab, x >> 2, B);
  tz_data_destroy(d);
  free(m);
  return 0;
}
