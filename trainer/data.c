/* Training data (data.h): memory-mapped token files, validated once, cut into windows and served
 * in a keyed pseudo-random order. */
#define _GNU_SOURCE
#include "trainer/data.h"

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

#include "core/error.h"
#include "core/log.h"
#include "trainer/corpus.h"
#include "util/mix.h"

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
  uint64_t seed;
  struct source src;     /* the spec */
  struct source val_src; /* val_spec, when given (n == 0 otherwise) */
  uint64_t n_train;      /* windows [0, n_train) of src */
  uint64_t n_val;        /* windows [n_train, n_train + n_val) of src, or all of val_src */
  char desc[384];
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
  return 0;
}

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

/* Opens every file of spec into s, checks their tokens against vocab, numbers their windows. */
static int source_open(struct source *s, const char *spec, int vocab, int T) {
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
    TZ_CHECK_GOTO(file_check_tokens(f, vocab), rc, fail);
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

/* ---- the data set ---- */

void tz_data_destroy(tz_data *d) {
  if (!d)
    return;
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
  TZ_CHECK_GOTO(source_open(&d->src, spec, vocab, d->T), rc, fail);
  uint64_t n = d->src.n_windows;
  if (p->val_spec) {
    TZ_CHECK_GOTO(source_open(&d->val_src, p->val_spec, vocab, d->T), rc, fail);
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
  uint64_t held = p->val_spec ? 0 : d->n_val;
  if (held >= n) {
    char what[256];
    source_describe(&d->src, what, sizeof what);
    rc = tz_err_set(TZ_EINVAL,
                    "data: %s holds %" PRIu64 " windows of %d tokens; holding out %" PRIu64
                    " for validation leaves none to train on",
                    what, n, d->T + 1, held);
    goto fail;
  }
  d->n_train = n - held;

  char what[256], val[256] = "";
  source_describe(&d->src, what, sizeof what);
  if (p->val_spec) {
    char v[200];
    source_describe(&d->val_src, v, sizeof v);
    snprintf(val, sizeof val, " from %s", v);
  }
  snprintf(d->desc, sizeof d->desc,
           "%s; %" PRIu64 " train + %" PRIu64 " val%s windows of %d tokens", what, d->n_train,
           d->n_val, val, d->T + 1);
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
  return d->val_src.n ? w : d->n_train + w;
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
  const struct source *src = s == TZ_DATA_VAL && d->val_src.n ? &d->val_src : &d->src;
  for (int b = 0; b < B; b++)
    read_window(src, d->T, tz_data_window(d, s, first + (uint64_t)b),
                tokens + (size_t)b * (size_t)(d->T + 1));
  return 0;
}

int tz_data_batch_io(const tz_data *d, enum tz_data_split s, uint64_t first, int B, int32_t *inputs,
                     int32_t *targets) {
  TZ_CHECK(check_split(d, s, B));
  const struct source *src = s == TZ_DATA_VAL && d->val_src.n ? &d->val_src : &d->src;
  int T = d->T;
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
