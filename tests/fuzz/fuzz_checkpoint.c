/* Fuzz target: the checkpoint reader (trainer/checkpoint/checkpoint.h) on a directory built from
 * the input.
 *
 * Input: u8 flags, u16 manifest length, the manifest, u16 latest length, latest, then the rank 0
 * file (all lengths little-endian and cut to what is there). Flags:
 *   1  ignore the input's manifest and write a consistent one for the rank file (step 1, world 1,
 *      its size and index checksum), so that mutations reach the rank file's index and sections
 *   2  otherwise, correct the manifest's first line (body length, checksum), so that mutations
 *      reach its JSON
 *   4  correct the rank file's header, index and trailer checksums
 *   8  write latest from the input rather than "step-00000001"
 * Checksums are what a random mutation breaks first; correcting them lets the fuzzer test the
 * parsing behind them. Everything that opens is read through every entry point. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/config.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "tests/fuzz/fuzz_files.h"

static char root[256], dir[300], manifest[320], latest[320], rank0[320];

static void cleanup(void) {
  unlink(rank0);
  unlink(manifest);
  unlink(latest);
  rmdir(dir);
  rmdir(root);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR);
  fuzz_tmpdir(root, sizeof root, "ckpt");
  snprintf(dir, sizeof dir, "%s/step-00000001", root);
  snprintf(manifest, sizeof manifest, "%s/manifest", dir);
  snprintf(latest, sizeof latest, "%s/latest", root);
  snprintf(rank0, sizeof rank0, "%s/rank-00000.bin", dir);
  if (mkdir(dir, 0755) < 0)
    abort();
  atexit(cleanup);
  return 0;
}

static const uint8_t *take(const uint8_t **p, size_t *left, size_t *n) {
  size_t len = 0;
  if (*left >= 2) {
    len = (size_t)tz_ckpt_get_le(*p, 2);
    *p += 2;
    *left -= 2;
  } else {
    *p += *left;
    *left = 0;
  }
  if (len > *left)
    len = *left;
  const uint8_t *out = *p;
  *p += len;
  *left -= len;
  *n = len;
  return out;
}

/* Recomputes the header, index and trailer checksums where the file has them. */
static void fix_rank_file(uint8_t *f, size_t n) {
  if (n >= TZ_CKPT_HEADER_CRC_AT + 4)
    tz_ckpt_put_le(f + TZ_CKPT_HEADER_CRC_AT, tz_crc32c(0, f, TZ_CKPT_HEADER_CRC_AT), 4);
  if (n < TZ_CKPT_TRAILER_BYTES)
    return;
  uint8_t *t = f + n - TZ_CKPT_TRAILER_BYTES;
  uint64_t off = tz_ckpt_get_le(t + 8, 8), bytes = tz_ckpt_get_le(t + 16, 8);
  if (off <= n && bytes <= n - off)
    tz_ckpt_put_le(t + TZ_CKPT_TRAILER_INDEX_CRC_AT, tz_crc32c(0, f + off, bytes), 4);
  tz_ckpt_put_le(t + TZ_CKPT_TRAILER_CRC_AT, tz_crc32c(0, t, TZ_CKPT_TRAILER_CRC_AT), 4);
}

static void write_manifest(const char *body, size_t len) {
  char head[96];
  int h = snprintf(head, sizeof head, "%s %d %zu %08x\n", TZ_CKPT_MANIFEST_TAG, TZ_CKPT_VERSION,
                   len, tz_crc32c(0, body, len));
  char *all = malloc((size_t)h + len + 1);
  if (!all)
    abort();
  memcpy(all, head, (size_t)h);
  memcpy(all + h, body, len);
  fuzz_put(manifest, all, (size_t)h + len);
  free(all);
}

static int sink(void *ctx, const void *data, uint64_t off, uint64_t n) {
  (void)data;
  uint64_t *next = ctx;
  if (off != *next)
    abort();
  *next += n;
  return 0;
}

static void read_all(const char *path) {
  tz_ckpt_reader *r = NULL;
  if (tz_ckpt_open(path, 0, &r) != 0)
    return;
  for (int i = 0; i < tz_ckpt_count(r); i++) {
    const char *name = tz_ckpt_name(r, i);
    uint64_t bytes = 0;
    if (!name || tz_ckpt_size(r, name, &bytes) != 0)
      abort();
    /* The index was checked against the file's size, which the input bounds. */
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
      abort();
    tz_ckpt_get(r, name, buf, bytes);
    free(buf);
    uint64_t next = 0;
    int rc = tz_ckpt_get_stream(r, name, sink, &next);
    if (rc == 0 && next != bytes)
      abort();
    char *json = NULL;
    if (tz_ckpt_get_json(r, name, &json) == 0 && strlen(json) > bytes)
      abort();
    free(json);
  }
  struct tz_config c;
  tz_config_defaults(&c);
  tz_ckpt_get_config(r, &c);
  tz_config_free(&c);
  tz_ckpt_close(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  int flags = data[0];
  const uint8_t *p = data + 1;
  size_t left = size - 1, mlen, llen;
  const uint8_t *m = take(&p, &left, &mlen), *l = take(&p, &left, &llen);
  uint8_t *file = malloc(left ? left : 1);
  if (!file)
    abort();
  memcpy(file, p, left);
  if (flags & 4)
    fix_rank_file(file, left);
  fuzz_put(rank0, file, left);
  if (flags & 1) {
    uint32_t icrc = left >= TZ_CKPT_TRAILER_BYTES
                        ? (uint32_t)tz_ckpt_get_le(
                              file + left - TZ_CKPT_TRAILER_BYTES + TZ_CKPT_TRAILER_INDEX_CRC_AT, 4)
                        : 0;
    char body[256];
    int n = snprintf(body, sizeof body,
                     "{\"step\": 1, \"world\": 1, \"ranks\": [{\"file\": \"rank-00000.bin\", "
                     "\"bytes\": %zu, \"index_crc32c\": %u}]}",
                     left, icrc);
    write_manifest(body, (size_t)n);
  } else if (flags & 2) {
    /* The body is what follows the first line of the input's manifest. */
    const uint8_t *nl = memchr(m, '\n', mlen);
    size_t skip = nl ? (size_t)(nl - m) + 1 : 0;
    write_manifest((const char *)m + skip, mlen - skip);
  } else {
    fuzz_put(manifest, m, mlen);
  }
  if (flags & 8)
    fuzz_put(latest, l, llen);
  else
    fuzz_put(latest, "step-00000001\n", 14);
  free(file);

  read_all(root);
  read_all(dir);
  uint64_t steps[4], s;
  tz_ckpt_list(root, steps, 4);
  tz_ckpt_latest(root, &s);
  tz_ckpt_previous(root, 2, &s);
  tz_ckpt_check(dir, 1);
  return 0;
}
