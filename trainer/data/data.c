/* Training data (data.h): memory-mapped token files, validated once, cut into windows and served
 * in a keyed pseudo-random order. */
#define _GNU_SOURCE
#include "trainer/data/data.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "core/error.h"
#include "core/log.h"
#include "trainer/data/corpus.h"
#include "trainer/data/pack.h"
#include "util/crc32.h"
#include "util/mix.h"
#include "util/input.h"

enum file_kind { KIND_TEXT, KIND_SHARD, KIND_BUILTIN };

struct file {
  char *path;
  enum file_kind kind;
  int version;        /* shards: 1 or 7 */
  void *base;         /* the mapping (or, builtin, the malloc'd corpus); NULL when empty */
  size_t base_len;    /* bytes of the mapping */
  const uint8_t *tok; /* the first token */
  int tsize;          /* bytes per token: 1, 2 or 4 */
  uint64_t n_tokens;
  uint64_t n_windows;    /* (n_tokens - 1) / T */
  uint64_t first_window; /* windows of the files before this one */
  int named_text;        /* read as text because its spec said "text:" */
  /* The mask file beside a shard (PATH.mask, tools/tz-data's), when there is one: a byte a
   * token, TZ_DATA_MASK_TARGET and TZ_DATA_MASK_START. */
  const uint8_t *mask;
  void *mask_base;
  size_t mask_len;
};

/* A piece of a document as packed rows hold it: len tokens from token start of file f (len - 1
 * predictions), of which targets are targets. */
struct piece {
  uint64_t start;
  uint32_t len, targets;
  int f;
};

/* Packed rows of a split (the pieces of source src). */
struct rows {
  const struct source *src;
  struct piece *pieces;
  struct tz_pack pack;
  uint32_t *targets; /* per row */
};

/* One source: the files of a spec, and their windows numbered in file order. */
struct source {
  int n;
  struct file *f;
  uint64_t n_windows;
  uint64_t n_tokens;
};

struct tz_data {
  int T;
  struct tz_data_tokenizer tok; /* the sidecars' */
  uint64_t seed;
  struct source src;     /* the spec */
  struct source val_src; /* val_spec, when given (n == 0 otherwise) */
  uint64_t n_train;      /* windows [0, n_train) of src */
  uint64_t n_val;        /* windows [n_train, n_train + n_val) of src, or all of val_src */
  int packed;            /* the shards have masks: samples are packed rows (train, val) */
  struct rows train, val;
  char desc[768];
  char pack_desc[384];
};

/* ---- the order ---- */

#define FEISTEL_ROUNDS 6

/* A balanced Feistel network on 2*half bits: a bijection for any round function. */
static uint64_t feistel(uint64_t key, int half, uint64_t x) {
  uint64_t mask = (1ull << half) - 1;
  uint64_t l = x >> half, r = x & mask;
  for (int round = 0; round < FEISTEL_ROUNDS; round++) {
    uint64_t f = tz_mix_data(key ^ tz_mix_data(((uint64_t)round << 56) ^ r)) & mask;
    uint64_t t = r;
    r = l ^ f;
    l = t;
  }
  return (l << half) | r;
}

uint64_t tz_data_permute(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t i) {
  if (n <= 1)
    return 0;
  /* The smallest even number of bits whose range holds n: at most 4n values, so cycle walking
   * (applying the network again until the value falls below n, which stays a bijection on
   * [0, n)) takes fewer than four rounds on average. */
  int bits = 64 - __builtin_clzll(n - 1);
  if (bits < 2)
    bits = 2;
  bits += bits & 1;
  uint64_t key = tz_mix_data(seed ^ tz_mix_data(epoch ^ 0x5eed0f0e0c0ffee5ull));
  uint64_t x = i;
  do
    x = feistel(key, bits / 2, x);
  while (x >= n);
  return x;
}

uint64_t tz_data_sample_index(uint64_t step, int A, int a, int W, int r, int B) {
  return ((step * (uint64_t)A + (uint64_t)a) * (uint64_t)W + (uint64_t)r) * (uint64_t)B;
}

/* ---- files ---- */

static void file_release(struct file *f) {
  if (f->mask_base)
    munmap(f->mask_base, f->mask_len);
  if (f->base) {
    if (f->kind == KIND_BUILTIN)
      free(f->base);
    else
      munmap(f->base, f->base_len);
  }
  free(f->path);
}

static void source_release(struct source *s) {
  for (int i = 0; i < s->n; i++)
    file_release(&s->f[i]);
  free(s->f);
  memset(s, 0, sizeof *s);
}

static uint32_t token_at(const struct file *f, uint64_t k) {
  const uint8_t *p = f->tok + k * (uint64_t)f->tsize;
  if (f->tsize == 1)
    return p[0];
  if (f->tsize == 2) {
    uint16_t v;
    memcpy(&v, p, 2);
    return le16toh(v);
  }
  uint32_t v;
  memcpy(&v, p, 4);
  return le32toh(v);
}

/* Every token below vocab, or TZ_EFORMAT naming the first that is not. Chunks are scanned for
 * their maximum (a loop the compiler vectorises); only a chunk that fails is searched. */
static int file_check_tokens(const struct file *f, int vocab) {
  if (f->tsize == 1 && vocab >= 256)
    return 0;
  if (f->tsize == 2 && vocab >= 65536)
    return 0;
  const uint64_t chunk = 1 << 16;
  for (uint64_t k0 = 0; k0 < f->n_tokens; k0 += chunk) {
    uint64_t k1 = k0 + chunk < f->n_tokens ? k0 + chunk : f->n_tokens;
    uint32_t mx = 0;
    if (f->tsize == 1) {
      for (uint64_t k = k0; k < k1; k++)
        mx = f->tok[k] > mx ? f->tok[k] : mx;
    } else {
      for (uint64_t k = k0; k < k1; k++) {
        uint32_t t = token_at(f, k);
        mx = t > mx ? t : mx;
      }
    }
    if (mx < (uint32_t)vocab)
      continue;
    for (uint64_t k = k0; k < k1; k++) {
      uint32_t t = token_at(f, k);
      if (t >= (uint32_t)vocab) {
        uint64_t off = (uint64_t)(f->tok - (const uint8_t *)f->base) + k * (uint64_t)f->tsize;
        return tz_err_set(TZ_EFORMAT,
                          "file %s: token %" PRIu32 " at byte offset %" PRIu64 " (token %" PRIu64
                          ") is not below the vocabulary size %d",
                          f->path, t, off, k, vocab);
      }
    }
  }
  return 0;
}

static int ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The mask file of shard f (f->path + ".mask") when there is one, mapped and checked against the
 * shard: its header (magic, version, token count, the crc32 of the shard's tokens and of its own
 * bytes, the targets and documents it counts) and every byte (docs/data.md, "Mask files"). */
static int mask_open(struct file *f) {
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s.mask", f->path) >= sizeof path)
    return tz_err_set(TZ_EINVAL, "data: path %s is too long", f->path);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return e == ENOENT ? 0 : tz_err_errno(e, "data: cannot open %s", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return tz_err_set(TZ_EINVAL, "data: %s is not a regular file", path);
  }
  size_t size = (size_t)st.st_size;
  uint64_t n = f->n_tokens;
  if (size != TZ_DATA_SHARD_HEADER_BYTES + n) {
    close(fd);
    return tz_err_set(TZ_EFORMAT,
                      "file %s: %zu bytes, but the mask of %s (%" PRIu64 " tokens) has %" PRIu64
                      ": it is not this shard's mask",
                      path, size, f->path, n, (uint64_t)TZ_DATA_SHARD_HEADER_BYTES + n);
  }
  void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (m == MAP_FAILED)
    return tz_err_errno(e, "data: cannot map %s (%zu bytes)", path, size);
  f->mask_base = m;
  f->mask_len = size;
  f->mask = (const uint8_t *)m + TZ_DATA_SHARD_HEADER_BYTES;
  uint32_t h[7];
  memcpy(h, m, sizeof h);
  for (int i = 0; i < 7; i++)
    h[i] = le32toh(h[i]);
  if (h[0] != TZ_DATA_MASK_MAGIC)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: bad magic %" PRIu32 " at byte offset 0 (a mask file starts with "
                      "%d)",
                      path, h[0], TZ_DATA_MASK_MAGIC);
  if (h[1] != 1)
    return tz_err_set(TZ_EFORMAT, "file %s: unknown mask version %" PRIu32 " at byte offset 4",
                      path, h[1]);
  if (h[2] != n)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: header says %" PRIu32
                      " tokens at byte offset 8, but %s holds %" PRIu64
                      ": it is not this shard's mask",
                      path, h[2], f->path, n);
  uint32_t crc_tok = tz_crc32(0, f->tok, n * (uint64_t)f->tsize);
  if (h[3] != crc_tok)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: made for a shard whose tokens have crc32 %08" PRIx32
                      " (byte offset "
                      "12), but %s's have %08" PRIx32 ": it is another shard's mask, or the shard "
                      "changed since",
                      path, h[3], f->path, crc_tok);
  uint32_t crc_mask = tz_crc32(0, f->mask, n);
  if (h[4] != crc_mask)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: its bytes have crc32 %08" PRIx32 ", not the %08" PRIx32
                      " its header says at byte offset 16: the file is damaged",
                      path, crc_mask, h[4]);
  uint64_t targets = 0, docs = 0;
  for (uint64_t k = 0; k < n; k++) {
    uint8_t v = f->mask[k];
    int start = (v & TZ_DATA_MASK_START) != 0;
    const char *bad = v & ~(TZ_DATA_MASK_TARGET | TZ_DATA_MASK_START) ? "has unknown bits"
                      : k == 0 && !start ? "does not start a document (the first token must)"
                      : start && (v & TZ_DATA_MASK_TARGET)
                          ? "marks a document's first token a target (nothing predicts it)"
                          : NULL;
    if (bad)
      return tz_err_set(TZ_EFORMAT,
                        "file %s: byte 0x%02x at byte offset %" PRIu64 " (token %" PRIu64 ") %s",
                        path, v, (uint64_t)TZ_DATA_SHARD_HEADER_BYTES + k, k, bad);
    targets += (v & TZ_DATA_MASK_TARGET) != 0;
    docs += start;
  }
  if (h[5] != targets || h[6] != docs)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: header says %" PRIu32 " targets and %" PRIu32 " documents (byte "
                      "offsets 20, 24), the bytes hold %" PRIu64 " and %" PRIu64,
                      path, h[5], h[6], targets, docs);
  return 0;
}

/* Maps path and works out its kind: force_text, or an llm.c shard when must_shard, the name ends
 * in ".bin" or the first four bytes are the magic; raw text otherwise. */
static int file_open(struct file *f, const char *path, int force_text) {
  memset(f, 0, sizeof *f);
  f->path = strdup(path);
  if (!f->path)
    return tz_err_set(TZ_ENOMEM, "data: out of memory");
  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer; a regular file ignores it,
   * and anything else is refused below. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    return tz_err_errno(e, "data: cannot open %s", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return tz_err_errno(e, "data: cannot stat %s", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return tz_err_set(TZ_EINVAL, "data: %s is not a regular file", path);
  }
  size_t size = (size_t)st.st_size;
  if (size > 0) {
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      close(fd);
      return tz_err_errno(e, "data: cannot map %s (%zu bytes)", path, size);
    }
    f->base = m;
    f->base_len = size;
  }
  close(fd);
  const uint8_t *b = f->base;

  int32_t hdr[3] = {0, 0, 0};
  if (size >= sizeof hdr) {
    memcpy(hdr, b, sizeof hdr);
    for (int i = 0; i < 3; i++)
      hdr[i] = (int32_t)le32toh((uint32_t)hdr[i]);
  }
  int shard =
      !force_text && (ends_with(path, ".bin") || (size >= 4 && hdr[0] == TZ_DATA_SHARD_MAGIC));
  if (!shard) {
    f->named_text = force_text;
    f->kind = KIND_TEXT;
    f->tok = b;
    f->tsize = 1;
    f->n_tokens = size;
    return 0;
  }

  f->kind = KIND_SHARD;
  if (size < TZ_DATA_SHARD_HEADER_BYTES)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: %zu bytes, shorter than the %d-byte header of an llm.c token shard",
                      path, size, TZ_DATA_SHARD_HEADER_BYTES);
  if (hdr[0] != TZ_DATA_SHARD_MAGIC)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: bad magic %" PRId32 " at byte offset 0 (an llm.c token shard "
                      "starts with %d)",
                      path, hdr[0], TZ_DATA_SHARD_MAGIC);
  if (hdr[1] == 1)
    f->tsize = 2;
  else if (hdr[1] == 7)
    f->tsize = 4;
  else
    return tz_err_set(TZ_EFORMAT,
                      "file %s: unknown shard version %" PRId32 " at byte offset 4 (1: uint16 "
                      "tokens, 7: uint32 tokens)",
                      path, hdr[1]);
  f->version = hdr[1];
  if (hdr[2] < 0)
    return tz_err_set(TZ_EFORMAT, "file %s: header says %" PRId32 " tokens at byte offset 8", path,
                      hdr[2]);
  uint64_t want = (uint64_t)hdr[2] * (uint64_t)f->tsize;
  uint64_t have = size - TZ_DATA_SHARD_HEADER_BYTES;
  if (want != have)
    return tz_err_set(TZ_EFORMAT,
                      "file %s: header says %" PRId32 " tokens (%" PRIu64
                      " bytes) but the file has %" PRIu64 " bytes after the header",
                      path, hdr[2], want, have);
  f->tok = b + TZ_DATA_SHARD_HEADER_BYTES;
  f->n_tokens = (uint64_t)hdr[2];
  return mask_open(f);
}

/* ---- sidecars ---- */

/* SHA-256 (FIPS 180-4), to compare a tokenizer.json with the hash tools/tz-data recorded. */
struct sha256 {
  uint32_t h[8];
  uint64_t len;
  uint8_t buf[64];
  size_t n;
};

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_block(struct sha256 *c, const uint8_t *p) {
  uint32_t w[64], v[8];
  for (int i = 0; i < 16; i++)
    w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
           p[4 * i + 3];
  for (int i = 16; i < 64; i++) {
    uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  memcpy(v, c->h, sizeof v);
  for (int i = 0; i < 64; i++) {
    uint32_t s1 = ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25);
    uint32_t t1 = v[7] + s1 + ((v[4] & v[5]) ^ (~v[4] & v[6])) + sha_k[i] + w[i];
    uint32_t s0 = ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22);
    uint32_t t2 = s0 + ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
    memmove(v + 1, v, 7 * sizeof *v);
    v[4] += t1;
    v[0] = t1 + t2;
  }
  for (int i = 0; i < 8; i++)
    c->h[i] += v[i];
}

static void sha_init(struct sha256 *c) {
  static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  memcpy(c->h, h0, sizeof h0);
  c->len = 0;
  c->n = 0;
}

static void sha_update(struct sha256 *c, const uint8_t *p, size_t n) {
  c->len += n;
  while (n > 0) {
    size_t k = 64 - c->n < n ? 64 - c->n : n;
    memcpy(c->buf + c->n, p, k);
    c->n += k;
    p += k;
    n -= k;
    if (c->n == 64) {
      sha_block(c, c->buf);
      c->n = 0;
    }
  }
}

static void sha_final(struct sha256 *c, char hex[65]) {
  uint64_t bits = c->len * 8;
  uint8_t pad = 0x80, zero = 0, be[8];
  sha_update(c, &pad, 1);
  while (c->n != 56)
    sha_update(c, &zero, 1);
  for (int i = 0; i < 8; i++)
    be[i] = (uint8_t)(bits >> (56 - 8 * i));
  sha_update(c, be, 8);
  for (int i = 0; i < 8; i++)
    snprintf(hex + 8 * i, 9, "%08" PRIx32, c->h[i]);
}

int tz_data_file_sha256(const char *path, char hex[65]) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    int e = errno;
    return tz_err_errno(e, "data: cannot read %s", path);
  }
  struct sha256 c;
  sha_init(&c);
  uint8_t buf[1 << 16];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0)
    sha_update(&c, buf, n);
  int bad = ferror(f);
  fclose(f);
  if (bad)
    return tz_err_set(TZ_EIO, "data: cannot read %s", path);
  sha_final(&c, hex);
  return 0;
}

/* An id of a sidecar: an integer below the tokenizer's vocabulary, or null / absent (no such
 * token). */
static int sidecar_id(json_t *root, const char *path, const char *key, int vocab, int *has,
                      int *id) {
  json_t *v = json_object_get(root, key);
  *has = 0;
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
    return tz_err_set(TZ_ECONFIG,
                      "data: sidecar %s: \"%s\" must be a token id below its vocab_size %d, or "
                      "null",
                      path, key, vocab);
  *has = 1;
  *id = (int)json_integer_value(v);
  return 0;
}

/* The sidecar of shard f (f->path + ".json") into *t when there is one (t->known 0 otherwise),
 * checked against f and the model's vocabulary. */
static int sidecar_read(const struct file *f, int vocab, struct tz_data_tokenizer *t) {
  memset(t, 0, sizeof *t);
  if (f->kind != KIND_SHARD)
    return 0;
  char path[4096];
  if ((size_t)snprintf(path, sizeof path, "%s.json", f->path) >= sizeof path || access(path, F_OK))
    return 0;
  json_error_t jerr;
  json_t *root = tz_input_json(path, 0, &jerr);
  if (!root)
    return tz_err_set(TZ_ECONFIG, "data: sidecar %s: line %d: %s", path, jerr.line, jerr.text);
  int rc = 0;
  json_t *sha = json_object_get(root, "tokenizer_sha256");
  json_t *vs = json_object_get(root, "vocab_size");
  json_t *tokens = json_object_get(root, "tokens");
  if (!json_is_object(root) || !json_is_string(sha) || strlen(json_string_value(sha)) != 64 ||
      strspn(json_string_value(sha), "0123456789abcdef") != 64 || !json_is_integer(vs) ||
      json_integer_value(vs) < 1 || json_integer_value(vs) > INT32_MAX) {
    rc = tz_err_set(TZ_ECONFIG,
                    "data: sidecar %s: expected an object with \"tokenizer_sha256\" (64 hex "
                    "digits) and \"vocab_size\" (a positive integer), as tools/tz-data writes",
                    path);
    goto out;
  }
  if (tokens && (!json_is_integer(tokens) || (uint64_t)json_integer_value(tokens) != f->n_tokens)) {
    rc = tz_err_set(TZ_ECONFIG,
                    "data: sidecar %s says %lld tokens but %s holds %" PRIu64
                    ": it is not this shard's",
                    path, json_is_integer(tokens) ? (long long)json_integer_value(tokens) : -1LL,
                    f->path, f->n_tokens);
    goto out;
  }
  json_t *mk = json_object_get(root, "mask");
  if (mk && !json_is_null(mk) && !f->mask) {
    rc = tz_err_set(TZ_ECONFIG,
                    "data: sidecar %s names the mask file %s, but %s.mask is not there: without "
                    "it every token would be a target and documents would see each other",
                    path, json_is_string(mk) ? json_string_value(mk) : "(not a string)", f->path);
    goto out;
  }
  snprintf(t->sha256, sizeof t->sha256, "%s", json_string_value(sha));
  snprintf(t->path, sizeof t->path, "%s", path);
  t->vocab = (int)json_integer_value(vs);
  if ((rc = sidecar_id(root, path, "bos_id", t->vocab, &t->has_bos, &t->bos_id)) < 0 ||
      (rc = sidecar_id(root, path, "eos_id", t->vocab, &t->has_eos, &t->eos_id)) < 0 ||
      (rc = sidecar_id(root, path, "pad_id", t->vocab, &t->has_pad, &t->pad_id)) < 0)
    goto out;
  if (t->vocab > vocab) {
    rc = tz_err_set(TZ_ECONFIG,
                    "data: sidecar %s: the tokenizer's vocabulary (vocab_size %d) is larger than "
                    "the model's (vocab_size %d): its tokens would not all have an embedding; "
                    "use a model of at least %d tokens, or data made by its own tokenizer",
                    path, t->vocab, vocab, t->vocab);
    goto out;
  }
  t->known = 1;
out:
  json_decref(root);
  return rc;
}

/* One tokenizer for every sidecar of d (into d->tok), and that tokenizer the one asked for. */
static int sidecars_check(tz_data *d, const struct source *s, int vocab, const char *tokenizer) {
  for (int i = 0; i < s->n; i++) {
    struct tz_data_tokenizer t;
    TZ_CHECK(sidecar_read(&s->f[i], vocab, &t));
    if (!t.known)
      continue;
    if (!d->tok.known) {
      d->tok = t;
      continue;
    }
    if (strcmp(t.sha256, d->tok.sha256) != 0)
      return tz_err_set(TZ_ECONFIG,
                        "data: %s and %s were made by different tokenizers (tokenizer_sha256 %s "
                        "and %s): one data set is tokenized once",
                        t.path, d->tok.path, t.sha256, d->tok.sha256);
  }
  if (!d->tok.known || !tokenizer)
    return 0;
  char hex[65];
  TZ_CHECK(tz_data_file_sha256(tokenizer, hex));
  if (strcmp(hex, d->tok.sha256) != 0)
    return tz_err_set(TZ_ECONFIG,
                      "data: %s was made by another tokenizer than %s: its tokenizer_sha256 is "
                      "%s, that file's sha256 is %s (tokenize the text again with tools/tz-data "
                      "--tokenizer %s, or train with the tokenizer it names)",
                      d->tok.path, tokenizer, d->tok.sha256, hex, tokenizer);
  return 0;
}

const struct tz_data_tokenizer *tz_data_tokenizer(const tz_data *d) { return &d->tok; }

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static const char *kind_name(const struct file *f) {
  switch (f->kind) {
  case KIND_TEXT: return "raw text";
  case KIND_SHARD: return f->version == 1 ? "llm.c shard v1 (uint16)" : "llm.c shard v7 (uint32)";
  default: return "the built-in corpus";
  }
}

/* A file that is not a token shard, given where tokens are expected, is read as raw text (a byte
 * a token) only where that is what was meant: named with "text:", or a plain file for a byte
 * vocabulary (the presets). JSON lines, or any text for a model with a real tokenizer's vocabulary,
 * would train on the bytes of the text: refused with the tz-data command that tokenizes it. */
static int source_check_text(const struct source *s, int vocab) {
  for (int i = 0; i < s->n; i++) {
    const struct file *f = &s->f[i];
    if (f->kind != KIND_TEXT || f->named_text)
      continue;
    int json = ends_with(f->path, ".jsonl") || ends_with(f->path, ".json");
    if (!json && vocab <= 256)
      continue;
    return tz_err_set(TZ_EFORMAT,
                      "data: %s is %s, not token shards: tokenize it with the model's tokenizer, "
                      "tools/tz-data --tokenizer MODEL_DIR --out DIR %s%s, and give --data "
                      "'DIR/*_train_*.bin' (docs/data.md); --data text:%s trains on its raw "
                      "bytes, one token a byte",
                      f->path, json ? "JSON text" : "text", json ? "--field text " : "", f->path,
                      f->path);
  }
  return 0;
}

/* Opens every file of spec into s and numbers their windows (the tokens are checked by
 * source_check_tokens, after the sidecars, whose message says more). */
static int source_open(struct source *s, const char *spec, int T) {
  memset(s, 0, sizeof *s);
  int rc = 0;
  glob_t g = {0};
  int globbed = 0;

  if (!spec || strcmp(spec, "builtin") == 0) {
    s->f = calloc(1, sizeof *s->f);
    if (!s->f)
      return tz_err_set(TZ_ENOMEM, "data: out of memory");
    s->n = 1;
    struct file *f = &s->f[0];
    f->kind = KIND_BUILTIN;
    f->path = strdup("built-in corpus");
    char *text = NULL;
    size_t len = 0;
    if (!f->path)
      rc = tz_err_set(TZ_ENOMEM, "data: out of memory");
    else
      rc = tz_corpus_generate(&text, &len);
    if (rc < 0)
      goto fail;
    f->base = text;
    f->base_len = len;
    f->tok = (const uint8_t *)text;
    f->tsize = 1;
    f->n_tokens = len;
  } else if (strncmp(spec, "text:", 5) == 0) {
    s->f = calloc(1, sizeof *s->f);
    if (!s->f)
      return tz_err_set(TZ_ENOMEM, "data: out of memory");
    s->n = 1;
    TZ_CHECK_GOTO(file_open(&s->f[0], spec + 5, 1), rc, fail);
  } else if (strpbrk(spec, "*?[")) {
    int grc = glob(spec, GLOB_ERR | GLOB_NOSORT, NULL, &g);
    globbed = 1;
    if (grc == GLOB_NOMATCH) {
      rc = tz_err_set(TZ_ENOENT, "data: no file matches %s", spec);
      goto fail;
    }
    if (grc != 0) {
      rc = tz_err_set(grc == GLOB_NOSPACE ? TZ_ENOMEM : TZ_EIO, "data: cannot expand %s", spec);
      goto fail;
    }
    /* Sorted by bytes, not by the locale, so every machine reads the files in one order. */
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
    s->f = calloc(g.gl_pathc, sizeof *s->f);
    if (!s->f) {
      rc = tz_err_set(TZ_ENOMEM, "data: out of memory");
      goto fail;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
      s->n++;
      TZ_CHECK_GOTO(file_open(&s->f[i], g.gl_pathv[i], 0), rc, fail);
    }
  } else {
    s->f = calloc(1, sizeof *s->f);
    if (!s->f)
      return tz_err_set(TZ_ENOMEM, "data: out of memory");
    s->n = 1;
    TZ_CHECK_GOTO(file_open(&s->f[0], spec, 0), rc, fail);
  }

  for (int i = 0; i < s->n; i++) {
    struct file *f = &s->f[i];
    /* Tokens of two tokenizers in one stream would be meaningless. */
    if (f->kind != s->f[0].kind || f->version != s->f[0].version) {
      rc = tz_err_set(TZ_EFORMAT, "data: %s is %s but %s is %s: one source holds one kind of token",
                      f->path, kind_name(f), s->f[0].path, kind_name(&s->f[0]));
      goto fail;
    }
    f->n_windows = f->n_tokens > (uint64_t)T ? (f->n_tokens - 1) / (uint64_t)T : 0;
    if (f->n_windows == 0 && f->n_tokens > 0)
      TZ_WARN("data: %s has %" PRIu64 " tokens, fewer than one window of %d; it is not used",
              f->path, f->n_tokens, T + 1);
    f->first_window = s->n_windows;
    s->n_windows += f->n_windows;
    s->n_tokens += f->n_tokens;
  }
  if (globbed)
    globfree(&g);
  return 0;

fail:
  if (globbed)
    globfree(&g);
  source_release(s);
  return rc;
}

/* Every token of s below vocab. */
static int source_check_tokens(const struct source *s, int vocab) {
  for (int i = 0; i < s->n; i++)
    TZ_CHECK(file_check_tokens(&s->f[i], vocab));
  return 0;
}

static void source_describe(const struct source *s, char *buf, size_t n) {
  const struct file *f = &s->f[0];
  if (f->kind == KIND_BUILTIN)
    snprintf(buf, n, "the built-in corpus, %" PRIu64 " byte tokens", s->n_tokens);
  else if (s->n == 1)
    snprintf(buf, n, "%s (%s), %" PRIu64 " tokens", f->path, kind_name(f), s->n_tokens);
  else
    snprintf(buf, n, "%d files (%s) from %s to %s, %" PRIu64 " tokens", s->n, kind_name(f), f->path,
             s->f[s->n - 1].path, s->n_tokens);
}

/* ---- packed documents (shards with masks) ---- */

static void rows_release(struct rows *r) {
  free(r->pieces);
  free(r->targets);
  tz_pack_free(&r->pack);
  memset(r, 0, sizeof *r);
}

struct doc {
  uint64_t start, len; /* tokens of file f */
  int f;
};

/* 1 when s's files have masks, 0 when none has; one with and one without is TZ_EFORMAT. */
static int source_masked(const struct source *s, int *out) {
  *out = s->n > 0 && s->f[0].mask;
  for (int i = 1; i < s->n; i++)
    if (!s->f[i].mask != !*out)
      return tz_err_set(TZ_EFORMAT,
                        "data: %s has a mask file and %s has none: a data set is fine-tuning "
                        "data (tools/tz-data's shards with .mask files) or not, throughout",
                        s->f[*out ? 0 : i].path, s->f[*out ? i : 0].path);
  return 0;
}

/* The documents of s in file order (a document starts at each TZ_DATA_MASK_START). */
static int source_docs(const struct source *s, struct doc **out, uint64_t *n) {
  uint64_t cap = 0, k = 0;
  for (int i = 0; i < s->n; i++)
    for (uint64_t t = 0; t < s->f[i].n_tokens; t++)
      cap += (s->f[i].mask[t] & TZ_DATA_MASK_START) != 0;
  struct doc *d = malloc((cap ? cap : 1) * sizeof *d);
  if (!d)
    return tz_err_set(TZ_ENOMEM, "data: no memory for %" PRIu64 " documents", cap);
  for (int i = 0; i < s->n; i++) {
    const struct file *f = &s->f[i];
    for (uint64_t t = 0; t < f->n_tokens; t++) {
      if (f->mask[t] & TZ_DATA_MASK_START) {
        if (k)
          d[k - 1].len = d[k - 1].f == i ? t - d[k - 1].start : d[k - 1].len;
        d[k++] = (struct doc){t, f->n_tokens - t, i};
      }
    }
  }
  *out = d;
  *n = k;
  return 0;
}

struct pack_counts {
  uint64_t docs, cut, no_targets, tokens_cut, targets, rows;
};

/* Rows of T predictions from documents docs[0, n) of s: each document is a piece of its tokens
 * (len - 1 predictions); one with more than T predictions is cut to its first T + 1 tokens, or
 * with split_long into pieces of T + 1 tokens that share one (as windows do); a piece with no
 * target is left out. Then best-fit decreasing (pack.h). */
static int rows_build(struct rows *r, const struct source *s, const struct doc *docs, uint64_t n,
                      int T, int split_long, struct pack_counts *c) {
  memset(r, 0, sizeof *r);
  r->src = s;
  uint64_t cap = 0;
  for (uint64_t i = 0; i < n; i++)
    cap += docs[i].len < 2 ? 0 : split_long ? (docs[i].len - 2) / (uint64_t)T + 1 : 1;
  r->pieces = malloc((cap ? cap : 1) * sizeof *r->pieces);
  uint32_t *len = malloc((cap ? cap : 1) * sizeof *len);
  int rc = 0;
  if (!r->pieces || !len) {
    rc = tz_err_set(TZ_ENOMEM, "data: no memory for %" PRIu64 " documents", n);
    goto out;
  }
  uint64_t np = 0;
  for (uint64_t i = 0; i < n; i++) {
    const struct doc *d = &docs[i];
    const struct file *f = &s->f[d->f];
    c->docs++;
    if (d->len > (uint64_t)T + 1) {
      c->cut++;
      if (!split_long)
        c->tokens_cut += d->len - (uint64_t)T - 1;
    }
    uint64_t end =
        split_long || d->len <= (uint64_t)T + 1 ? d->start + d->len : d->start + (uint64_t)T + 1;
    for (uint64_t p0 = d->start; p0 + 1 < end; p0 += (uint64_t)T) {
      uint64_t p1 = p0 + (uint64_t)T + 1 < end ? p0 + (uint64_t)T + 1 : end;
      uint32_t tg = 0;
      for (uint64_t t = p0 + 1; t < p1; t++)
        tg += f->mask[t] & TZ_DATA_MASK_TARGET;
      if (!tg) {
        c->no_targets++;
        continue;
      }
      r->pieces[np] = (struct piece){p0, (uint32_t)(p1 - p0), tg, d->f};
      len[np] = (uint32_t)(p1 - p0 - 1);
      c->targets += tg;
      np++;
    }
  }
  TZ_CHECK_GOTO(tz_pack_best_fit(len, np, T, &r->pack), rc, out);
  r->targets = calloc(r->pack.n_rows ? r->pack.n_rows : 1, sizeof *r->targets);
  if (!r->targets) {
    rc = tz_err_set(TZ_ENOMEM, "data: no memory for %" PRIu64 " rows", r->pack.n_rows);
    goto out;
  }
  for (uint64_t q = 0; q < r->pack.n_rows; q++)
    for (uint64_t j = r->pack.row_start[q]; j < r->pack.row_start[q + 1]; j++)
      r->targets[q] += r->pieces[r->pack.piece[j]].targets;
  c->rows += r->pack.n_rows;
out:
  free(len);
  if (rc < 0)
    rows_release(r);
  return rc;
}

/* Row q of r into in, tgt and pos (T each; pos may be NULL): its pieces one after the other,
 * then padding (token 0, no target, a document of its own). */
static void read_row(const struct rows *r, int T, uint64_t q, int32_t *in, int32_t *tgt,
                     int32_t *pos) {
  int t = 0;
  for (uint64_t j = r->pack.row_start[q]; j < r->pack.row_start[q + 1]; j++) {
    const struct piece *p = &r->pieces[r->pack.piece[j]];
    const struct file *f = &r->src->f[p->f];
    for (uint32_t i = 0; i + 1 < p->len; i++, t++) {
      uint64_t k = p->start + i;
      in[t] = (int32_t)token_at(f, k);
      tgt[t] = f->mask[k + 1] & TZ_DATA_MASK_TARGET ? (int32_t)token_at(f, k + 1) : -1;
      if (pos)
        pos[t] = (int32_t)i;
    }
  }
  for (int t0 = t; t < T; t++) {
    in[t] = 0;
    tgt[t] = -1; /* TZ_TARGET_IGNORE */
    if (pos)
      pos[t] = t - t0;
  }
}

/* d's splits as packed rows: the training documents of d->src, and for validation those of
 * val_src, or the last documents of src (a val_fraction of them, or the fewest whose tokens
 * reach val_tokens). */
static int pack_open(tz_data *d, const struct tz_data_params *p) {
  struct doc *docs = NULL, *vdocs = NULL;
  uint64_t n = 0, nv = 0;
  int rc = 0;
  struct pack_counts c = {0}, cv = {0};
  TZ_CHECK_GOTO(source_docs(&d->src, &docs, &n), rc, out);
  uint64_t held = 0;
  if (p->val_spec) {
    TZ_CHECK_GOTO(source_docs(&d->val_src, &vdocs, &nv), rc, out);
  } else if (p->val_tokens > 0) {
    for (uint64_t tok = 0; held < n && tok < p->val_tokens; held++)
      tok += docs[n - 1 - held].len;
  } else if (p->val_fraction > 0.0) {
    held = (uint64_t)ceil(p->val_fraction * (double)n);
  }
  if (held >= n) {
    rc = tz_err_set(TZ_EINVAL,
                    "data: %s holds %" PRIu64 " documents; holding out %" PRIu64
                    " for validation leaves none to train on",
                    d->src.f[0].path, n, held);
    goto out;
  }
  TZ_CHECK_GOTO(rows_build(&d->train, &d->src, docs, n - held, d->T, p->split_long, &c), rc, out);
  if (p->val_spec)
    TZ_CHECK_GOTO(rows_build(&d->val, &d->val_src, vdocs, nv, d->T, p->split_long, &cv), rc, out);
  else if (held)
    TZ_CHECK_GOTO(rows_build(&d->val, &d->src, docs + (n - held), held, d->T, p->split_long, &cv),
                  rc, out);
  if (!d->train.pack.n_rows) {
    rc = tz_err_set(TZ_EINVAL,
                    "data: %s: none of its %" PRIu64 " documents has a target token within its "
                    "first %d",
                    d->src.f[0].path, c.docs, d->T + 1);
    goto out;
  }
  if ((p->val_spec || held) && !d->val.pack.n_rows) {
    rc = tz_err_set(TZ_EINVAL,
                    "data: %s: none of the %" PRIu64 " validation documents%s has a target token "
                    "within its first %d",
                    p->val_spec ? d->val_src.f[0].path : d->src.f[0].path, cv.docs,
                    p->val_spec ? "" : " held out of it", d->T + 1);
    goto out;
  }
  d->packed = 1;
  d->n_train = d->train.pack.n_rows;
  d->n_val = d->val.pack.n_rows;
  double row_tokens = (double)c.rows * d->T;
  snprintf(d->pack_desc, sizeof d->pack_desc,
           "packed: %" PRIu64 " documents into %" PRIu64 " rows of %d (targets %.1f%% of the row "
           "tokens); %" PRIu64 " longer than %d tokens %s; %" PRIu64 " without a target left out",
           c.docs, c.rows, d->T, 100.0 * (double)c.targets / row_tokens, c.cut, d->T + 1,
           p->split_long ? "split into pieces" : "cut to their first ones", c.no_targets);
out:
  free(docs);
  free(vdocs);
  return rc;
}

uint64_t tz_data_targets(const tz_data *d, enum tz_data_split s, uint64_t first, uint64_t n) {
  if (!d->packed)
    return n * (uint64_t)d->T;
  const struct rows *r = s == TZ_DATA_TRAIN ? &d->train : &d->val;
  uint64_t sum = 0;
  for (uint64_t i = 0; i < n; i++)
    sum += r->targets[tz_data_window(d, s, first + i)];
  return sum;
}

int tz_data_packed(const tz_data *d) { return d->packed; }

const char *tz_data_pack_describe(const tz_data *d) { return d->packed ? d->pack_desc : ""; }

/* ---- the data set ---- */

void tz_data_destroy(tz_data *d) {
  if (!d)
    return;
  rows_release(&d->train);
  rows_release(&d->val);
  source_release(&d->src);
  source_release(&d->val_src);
  free(d);
}

int tz_data_open(const char *spec, int vocab, const struct tz_data_params *p, tz_data **out) {
  *out = NULL;
  if (!p || p->seq_len < 1)
    return tz_err_set(TZ_EINVAL, "data: seq_len %d must be at least 1", p ? p->seq_len : 0);
  if (vocab < 1)
    return tz_err_set(TZ_EINVAL, "data: vocabulary size %d must be positive", vocab);
  if (!(p->val_fraction >= 0.0 && p->val_fraction < 1.0))
    return tz_err_set(TZ_EINVAL, "data: val_fraction %g must be in [0, 1)", p->val_fraction);
  tz_data *d = calloc(1, sizeof *d);
  if (!d)
    return tz_err_set(TZ_ENOMEM, "data: out of memory");
  d->T = p->seq_len;
  d->seed = p->seed;
  int rc = 0;
  TZ_CHECK_GOTO(source_open(&d->src, spec, d->T), rc, fail);
  TZ_CHECK_GOTO(source_check_text(&d->src, vocab), rc, fail);
  TZ_CHECK_GOTO(sidecars_check(d, &d->src, vocab, p->tokenizer), rc, fail);
  TZ_CHECK_GOTO(source_check_tokens(&d->src, vocab), rc, fail);
  int masked = 0, val_masked = 0;
  TZ_CHECK_GOTO(source_masked(&d->src, &masked), rc, fail);
  uint64_t n = d->src.n_windows;
  if (masked || p->val_spec) {
    if (p->val_spec) {
      TZ_CHECK_GOTO(source_open(&d->val_src, p->val_spec, d->T), rc, fail);
      TZ_CHECK_GOTO(source_check_text(&d->val_src, vocab), rc, fail);
      TZ_CHECK_GOTO(sidecars_check(d, &d->val_src, vocab, p->tokenizer), rc, fail);
      TZ_CHECK_GOTO(source_check_tokens(&d->val_src, vocab), rc, fail);
      TZ_CHECK_GOTO(source_masked(&d->val_src, &val_masked), rc, fail);
      if (val_masked != masked) {
        rc = tz_err_set(TZ_EFORMAT,
                        "data: %s %s mask files but the validation data %s %s: both are "
                        "fine-tuning data (tools/tz-data's shards with .mask files), or neither",
                        spec, masked ? "has" : "has no", p->val_spec,
                        val_masked ? "has" : "has none");
        goto fail;
      }
    }
  }
  if (masked) {
    TZ_CHECK_GOTO(pack_open(d, p), rc, fail);
  } else if (p->val_spec) {
    d->n_val = d->val_src.n_windows;
    if (d->n_val == 0) {
      rc = tz_err_set(
          TZ_EINVAL, "data: validation data %s has %" PRIu64 " tokens, fewer than one window of %d",
          p->val_spec, d->val_src.n_tokens, d->T + 1);
      goto fail;
    }
  } else if (p->val_tokens > 0) {
    d->n_val = (p->val_tokens + (uint64_t)d->T - 1) / (uint64_t)d->T;
  } else if (p->val_fraction > 0.0) {
    d->n_val = (uint64_t)ceil(p->val_fraction * (double)n);
  }
  uint64_t held = p->val_spec || masked ? 0 : d->n_val;
  if (!masked && held >= n) {
    char what[256];
    source_describe(&d->src, what, sizeof what);
    rc = tz_err_set(TZ_EINVAL,
                    "data: %s holds %" PRIu64 " windows of %d tokens; holding out %" PRIu64
                    " for validation leaves none to train on",
                    what, n, d->T + 1, held);
    goto fail;
  }
  if (!masked)
    d->n_train = n - held;

  char what[256], val[256] = "";
  source_describe(&d->src, what, sizeof what);
  if (p->val_spec) {
    char v[200];
    source_describe(&d->val_src, v, sizeof v);
    snprintf(val, sizeof val, " from %s", v);
  }
  snprintf(d->desc, sizeof d->desc, "%s; %" PRIu64 " train + %" PRIu64 " val %s of %d tokens%s",
           what, d->n_train, d->n_val, masked ? "packed rows" : "windows", masked ? d->T : d->T + 1,
           val);
  if (masked) {
    size_t used = strlen(d->desc);
    snprintf(d->desc + used, sizeof d->desc - used, "; %s", d->pack_desc);
  }
  *out = d;
  return 0;

fail:
  tz_data_destroy(d);
  return rc;
}

int tz_data_seq_len(const tz_data *d) { return d->T; }

uint64_t tz_data_n_samples(const tz_data *d, enum tz_data_split s) {
  return s == TZ_DATA_TRAIN ? d->n_train : d->n_val;
}

uint64_t tz_data_n_tokens(const tz_data *d) { return d->src.n_tokens + d->val_src.n_tokens; }

int tz_data_n_files(const tz_data *d) { return d->src.n + d->val_src.n; }

const char *tz_data_describe(const tz_data *d) { return d->desc; }

uint64_t tz_data_window(const tz_data *d, enum tz_data_split s, uint64_t sample) {
  if (s == TZ_DATA_TRAIN) {
    uint64_t epoch = sample / d->n_train;
    return tz_data_permute(d->seed, epoch, d->n_train, sample % d->n_train);
  }
  uint64_t w = sample % d->n_val;
  return d->val_src.n || d->packed ? w : d->n_train + w;
}

/* Copies window w of s (T+1 tokens) into row. */
static void read_window(const struct source *s, int T, uint64_t w, int32_t *row) {
  /* The last file whose first window is <= w: files without windows come before the one that
   * holds w (their first window equals its) or after it (theirs is larger). */
  int lo = 0, hi = s->n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (s->f[mid].first_window <= w)
      lo = mid;
    else
      hi = mid - 1;
  }
  const struct file *f = &s->f[lo];
  uint64_t k0 = (w - f->first_window) * (uint64_t)T;
  if (f->tsize == 1) {
    for (int t = 0; t <= T; t++)
      row[t] = f->tok[k0 + (uint64_t)t];
  } else {
    for (int t = 0; t <= T; t++)
      row[t] = (int32_t)token_at(f, k0 + (uint64_t)t);
  }
}

static int check_split(const tz_data *d, enum tz_data_split s, int B) {
  if (B < 1)
    return tz_err_set(TZ_EINVAL, "data: batch size %d must be positive", B);
  if (s != TZ_DATA_TRAIN && s != TZ_DATA_VAL)
    return tz_err_set(TZ_EINVAL, "data: unknown split %d", (int)s);
  if (s == TZ_DATA_VAL && d->n_val == 0)
    return tz_err_set(TZ_EINVAL,
                      "data: no validation split (set val_fraction, val_tokens or val_spec)");
  return 0;
}

int tz_data_batch(const tz_data *d, enum tz_data_split s, uint64_t first, int B, int32_t *tokens) {
  TZ_CHECK(check_split(d, s, B));
  if (d->packed)
    return tz_err_set(TZ_EINVAL, "data: packed rows have targets of their own: read them with "
                                 "tz_data_batch_docs");
  const struct source *src = s == TZ_DATA_VAL && d->val_src.n ? &d->val_src : &d->src;
  for (int b = 0; b < B; b++)
    read_window(src, d->T, tz_data_window(d, s, first + (uint64_t)b),
                tokens + (size_t)b * (size_t)(d->T + 1));
  return 0;
}

int tz_data_batch_io(const tz_data *d, enum tz_data_split s, uint64_t first, int B, int32_t *inputs,
                     int32_t *targets) {
  return tz_data_batch_docs(d, s, first, B, inputs, targets, NULL);
}

int tz_data_batch_docs(const tz_data *d, enum tz_data_split s, uint64_t first, int B,
                       int32_t *inputs, int32_t *targets, int32_t *pos) {
  TZ_CHECK(check_split(d, s, B));
  int T = d->T;
  if (d->packed) {
    const struct rows *r = s == TZ_DATA_TRAIN ? &d->train : &d->val;
    for (int b = 0; b < B; b++) {
      size_t o = (size_t)b * (size_t)T;
      read_row(r, T, tz_data_window(d, s, first + (uint64_t)b), inputs + o, targets + o,
               pos ? pos + o : NULL);
    }
    return 0;
  }
  if (pos)
    for (int b = 0; b < B; b++)
      for (int t = 0; t < T; t++)
        pos[(size_t)b * (size_t)T + (size_t)t] = t;
  const struct source *src = s == TZ_DATA_VAL && d->val_src.n ? &d->val_src : &d->src;
  int32_t *row = malloc((size_t)(T + 1) * sizeof *row);
  if (!row)
    return tz_err_set(TZ_ENOMEM, "data: out of memory");
  for (int b = 0; b < B; b++) {
    read_window(src, T, tz_data_window(d, s, first + (uint64_t)b), row);
    memcpy(inputs + (size_t)b * (size_t)T, row, (size_t)T * sizeof *row);
    memcpy(targets + (size_t)b * (size_t)T, row + 1, (size_t)T * sizeof *row);
  }
  free(row);
  return 0;
}
