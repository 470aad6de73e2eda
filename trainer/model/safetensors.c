/* safetensors reading and writing (safetensors.h). */
#define _GNU_SOURCE
#include "trainer/model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "core/error.h"
#include "core/dtype.h"
#include "util/crc32c.h"
#include "util/file.h"

/* Larger headers than this are refused rather than read into memory (the reference
 * implementation's limit is 100 MB). */
#define MAX_HEADER (100u << 20)
/* F32 is read straight into the caller's memory in large reads; 2-byte dtypes through a buffer
 * small enough to stay in cache while it is cast. */
#define IO_CHUNK (4u << 20)
#define IO_CHUNK_2 (512u << 10)

struct tz_st_file {
  char *path;
  int fd;
  uint64_t data_off; /* 8 + header length */
  uint64_t data_size;
  int n;
  struct tz_st_tensor *t;
  json_t *meta; /* the __metadata__ object, or NULL */
  int threads;  /* of a read; 0: the default */
};

static const struct {
  const char *name;
  int size;
} st_dtypes[] = {{"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
                 {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
                 {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};

static int st_dtype_size(const char *name) {
  for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
    if (strcmp(st_dtypes[i].name, name) == 0)
      return st_dtypes[i].size;
  return 0;
}

static const char *st_dtype_of(enum tz_dtype dt) {
  return dt == TZ_BF16 ? "BF16" : dt == TZ_F16 ? "F16" : "F32";
}

void tz_st_close(tz_st_file *f) {
  if (!f)
    return;
  if (f->fd >= 0)
    close(f->fd);
  for (int i = 0; i < f->n; i++)
    free((char *)f->t[i].name);
  free(f->t);
  json_decref(f->meta);
  free(f->path);
  free(f);
}

static int cmp_begin(const void *a, const void *b) {
  const struct tz_st_tensor *x = *(const struct tz_st_tensor *const *)a,
                            *y = *(const struct tz_st_tensor *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* One header entry into t; the message names the file and the tensor. */
static int parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                       struct tz_st_tensor *t) {
  if (!json_is_object(v))
    return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': header entry is not an object", path, name);
  json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
         *offs = json_object_get(v, "data_offsets");
  if (!json_is_string(dt) || strlen(json_string_value(dt)) >= sizeof t->dtype)
    return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': missing or bad \"dtype\"", path, name);
  strcpy(t->dtype, json_string_value(dt));
  int es = st_dtype_size(t->dtype);
  if (!es)
    return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': unknown dtype \"%s\"", path, name, t->dtype);
  if (!json_is_array(shape) || json_array_size(shape) > TZ_ST_MAX_DIMS)
    return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': missing or bad \"shape\"", path, name);
  t->ndim = (int)json_array_size(shape);
  t->numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    json_t *s = json_array_get(shape, (size_t)d);
    if (!json_is_integer(s) || json_integer_value(s) < 0 ||
        json_integer_value(s) > (json_int_t)1 << 40)
      return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': shape[%d] is not a valid size", path, name,
                        d);
    t->shape[d] = json_integer_value(s);
    if (__builtin_mul_overflow(t->numel, (uint64_t)t->shape[d], &t->numel))
      return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': shape overflows", path, name);
  }
  if (!json_is_array(offs) || json_array_size(offs) != 2 ||
      !json_is_integer(json_array_get(offs, 0)) || !json_is_integer(json_array_get(offs, 1)))
    return tz_err_set(TZ_EFORMAT, "%s: tensor '%s': missing or bad \"data_offsets\"", path, name);
  json_int_t b = json_integer_value(json_array_get(offs, 0)),
             e = json_integer_value(json_array_get(offs, 1));
  if (b < 0 || e < b || (uint64_t)e > data_size)
    return tz_err_set(TZ_EFORMAT,
                      "%s: tensor '%s': data_offsets [%lld, %lld] outside the %llu bytes of data",
                      path, name, (long long)b, (long long)e, (unsigned long long)data_size);
  if ((uint64_t)(e - b) != t->numel * (uint64_t)es)
    return tz_err_set(TZ_EFORMAT,
                      "%s: tensor '%s': data_offsets [%lld, %lld] hold %lld bytes, but %s shape "
                      "needs %llu",
                      path, name, (long long)b, (long long)e, (long long)(e - b), t->dtype,
                      (unsigned long long)(t->numel * (uint64_t)es));
  t->begin = (uint64_t)b;
  t->end = (uint64_t)e;
  return 0;
}

int tz_st_open(const char *path, tz_st_file **out) {
  *out = NULL;
  int rc = 0;
  char *hdr = NULL;
  json_t *root = NULL;
  struct tz_st_tensor **sorted = NULL;
  tz_st_file *f = calloc(1, sizeof *f);
  if (!f || !(f->path = strdup(path))) {
    free(f);
    return tz_err_set(TZ_ENOMEM, "%s: out of memory", path);
  }
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    rc = tz_err_errno(errno, "safetensors: cannot open %s", path);
    goto fail;
  }
  struct stat sb;
  if (fstat(f->fd, &sb) < 0) {
    rc = tz_err_errno(errno, "safetensors: fstat %s", path);
    goto fail;
  }
  uint64_t size = (uint64_t)sb.st_size;
  uint8_t lenb[8];
  if (size < 8 || pread(f->fd, lenb, 8, 0) != 8) {
    rc = tz_err_set(TZ_EFORMAT, "%s: truncated: %llu bytes, shorter than the 8-byte header length",
                    path, (unsigned long long)size);
    goto fail;
  }
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | lenb[i];
  if (hlen > MAX_HEADER || hlen > size - 8) {
    rc = tz_err_set(TZ_EFORMAT,
                    "%s: header length %llu at offset 0 runs past the end of the %llu-byte file%s",
                    path, (unsigned long long)hlen, (unsigned long long)size,
                    hlen > MAX_HEADER ? " (or exceeds 100 MB)" : "");
    goto fail;
  }
  f->data_off = 8 + hlen;
  f->data_size = size - f->data_off;
  hdr = malloc(hlen + 1);
  if (!hdr) {
    rc = tz_err_set(TZ_ENOMEM, "%s: cannot allocate a %llu-byte header", path,
                    (unsigned long long)hlen);
    goto fail;
  }
  if (pread(f->fd, hdr, hlen, 8) != (ssize_t)hlen) {
    rc = tz_err_errno(errno ? errno : EIO, "%s: short read of the header", path);
    goto fail;
  }
  hdr[hlen] = '\0';
  json_error_t jerr;
  root = json_loadb(hdr, hlen, JSON_REJECT_DUPLICATES, &jerr);
  if (!root) {
    rc = tz_err_set(TZ_EFORMAT, "%s: header JSON at byte %d (file offset %llu): %s", path,
                    jerr.position, (unsigned long long)(8 + (uint64_t)jerr.position), jerr.text);
    goto fail;
  }
  if (!json_is_object(root)) {
    rc = tz_err_set(TZ_EFORMAT, "%s: header JSON is not an object", path);
    goto fail;
  }
  size_t n = json_object_size(root);
  f->t = calloc(n ? n : 1, sizeof *f->t);
  if (!f->t) {
    rc = tz_err_set(TZ_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  const char *key;
  json_t *val;
  json_object_foreach(root, key, val) {
    if (strcmp(key, "__metadata__") == 0) {
      if (!json_is_object(val)) {
        rc = tz_err_set(TZ_EFORMAT, "%s: __metadata__ is not an object", path);
        goto fail;
      }
      f->meta = json_incref(val);
      continue;
    }
    struct tz_st_tensor *t = &f->t[f->n];
    if (!(t->name = strdup(key))) {
      rc = tz_err_set(TZ_ENOMEM, "%s: out of memory", path);
      goto fail;
    }
    f->n++;
    TZ_CHECK_GOTO(parse_entry(path, key, val, f->data_size, t), rc, fail);
  }
  /* No two tensors may share bytes. */
  sorted = malloc(sizeof *sorted * (f->n ? f->n : 1));
  if (!sorted) {
    rc = tz_err_set(TZ_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  for (int i = 0; i < f->n; i++)
    sorted[i] = &f->t[i];
  qsort(sorted, (size_t)f->n, sizeof *sorted, cmp_begin);
  for (int i = 1; i < f->n; i++)
    if (sorted[i]->begin < sorted[i - 1]->end) {
      rc = tz_err_set(
          TZ_EFORMAT, "%s: tensor '%s' at data offset %llu overlaps tensor '%s' [%llu, %llu)", path,
          sorted[i]->name, (unsigned long long)sorted[i]->begin, sorted[i - 1]->name,
          (unsigned long long)sorted[i - 1]->begin, (unsigned long long)sorted[i - 1]->end);
      goto fail;
    }
  free(sorted);
  free(hdr);
  json_decref(root);
  *out = f;
  return 0;
fail:
  free(sorted);
  free(hdr);
  json_decref(root);
  tz_st_close(f);
  return rc;
}

int tz_st_count(const tz_st_file *f) { return f->n; }

const struct tz_st_tensor *tz_st_get(const tz_st_file *f, int i) {
  return i >= 0 && i < f->n ? &f->t[i] : NULL;
}

const struct tz_st_tensor *tz_st_find(const tz_st_file *f, const char *name) {
  for (int i = 0; i < f->n; i++)
    if (strcmp(f->t[i].name, name) == 0)
      return &f->t[i];
  return NULL;
}

const char *tz_st_metadata(const tz_st_file *f, const char *key) {
  json_t *v = f->meta ? json_object_get(f->meta, key) : NULL;
  return json_is_string(v) ? json_string_value(v) : NULL;
}

void tz_st_shape_text(char *buf, size_t len, int ndim, const int64_t *shape) {
  size_t o = (size_t)snprintf(buf, len, "[");
  for (int d = 0; d < ndim && o < len; d++)
    o += (size_t)snprintf(buf + o, len - o, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (o < len)
    snprintf(buf + o, len - o, "]");
}

const char *tz_st_path(const tz_st_file *f) { return f->path; }

int tz_st_read_f32(tz_st_file *f, const char *name, int ndim, const int64_t *shape, float *out) {
  const struct tz_st_tensor *t = tz_st_find(f, name);
  if (!t)
    return tz_err_set(TZ_ENOENT, "%s: no tensor '%s'", f->path, name);
  if (ndim > 0) {
    int same = t->ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
      same = t->shape[d] == shape[d];
    if (!same) {
      char a[128], b[128];
      tz_st_shape_text(a, sizeof a, t->ndim, t->shape);
      tz_st_shape_text(b, sizeof b, ndim, shape);
      return tz_err_set(TZ_EFORMAT, "%s: tensor '%s' has shape %s, expected %s", f->path, name, a,
                        b);
    }
  }
  return tz_st_read_tensor_f32(f, t, out, NULL);
}

/* The exponent bits of a non-finite value in each format: any element with all of them set is
 * an inf or a NaN. */
#define F32_EXP 0x7f800000u
#define BF16_EXP 0x7f80u
#define F16_EXP 0x7c00u

/* The index of the first element of x[0..n) with every bit of exp set, or -1. The loop is a
 * branch-free OR the compiler vectorises; only a hit is searched for again. */
static int64_t first_exp32(const uint32_t *x, uint64_t n) {
  uint32_t any = 0;
  for (uint64_t i = 0; i < n; i++)
    any |= (x[i] & F32_EXP) == F32_EXP;
  if (!any)
    return -1;
  for (uint64_t i = 0; i < n; i++)
    if ((x[i] & F32_EXP) == F32_EXP)
      return (int64_t)i;
  return -1;
}

/* o[0..n) = the bf16 values h[0..n) as floats; nonzero when one of them is an inf or a NaN.
 * The cast is a shift, and the output is twice the input: where SSE2 is there the floats go out
 * with streaming stores, which do not read the destination's lines first, so the cast moves the
 * bytes it must and no more. */
static uint16_t cast_bf16(float *o, const uint16_t *h, uint64_t n) {
  uint16_t any = 0;
  uint64_t i = 0;
#ifdef __SSE2__
  for (; i < n && ((uintptr_t)(o + i) & 15); i++) {
    o[i] = tz_bf16_to_f32(h[i]);
    any |= (uint16_t)((h[i] & BF16_EXP) == BF16_EXP);
  }
  const __m128i zero = _mm_setzero_si128(), mask = _mm_set1_epi16((short)BF16_EXP);
  __m128i hit = zero;
  for (; i + 8 <= n; i += 8) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(h + i));
    hit = _mm_or_si128(hit, _mm_cmpeq_epi16(_mm_and_si128(x, mask), mask));
    _mm_stream_si128((__m128i *)(void *)(o + i), _mm_unpacklo_epi16(zero, x));
    _mm_stream_si128((__m128i *)(void *)(o + i + 4), _mm_unpackhi_epi16(zero, x));
  }
  _mm_sfence(); /* the streamed stores are seen before whatever the caller does next */
  any |= (uint16_t)(_mm_movemask_epi8(hit) != 0);
#endif
  for (; i < n; i++) {
    o[i] = tz_bf16_to_f32(h[i]);
    any |= (uint16_t)((h[i] & BF16_EXP) == BF16_EXP);
  }
  return any;
}

/* Bytes [begin, begin + len) of t's data (begin a multiple of the element size es) into out:
 * straight into place for F32, staged in buf and cast otherwise. *bad gets the index (within
 * the tensor) of the chunk's first non-finite element, or -1. */
static int read_chunk(tz_st_file *f, const struct tz_st_tensor *t, uint64_t begin, uint64_t len,
                      float *out, uint8_t *buf, int es, int bf16, int64_t *bad) {
  *bad = -1;
  uint64_t first = begin / (uint64_t)es, n = len / (uint64_t)es;
  uint8_t *dst = es == 4 ? (uint8_t *)(out + first) : buf;
  for (uint64_t done = 0; done < len;) {
    uint64_t off = f->data_off + t->begin + begin + done;
    ssize_t got = pread(f->fd, dst + done, len - done, (off_t)off);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return got < 0 ? tz_err_errno(errno, "%s: reading tensor '%s' at offset %llu", f->path,
                                    t->name, (unsigned long long)off)
                     : tz_err_set(TZ_EIO, "%s: tensor '%s': file ends at offset %llu", f->path,
                                  t->name, (unsigned long long)off);
    done += (uint64_t)got;
  }
  if (es == 4) {
    int64_t at = first_exp32((const uint32_t *)(const void *)(out + first), n);
    *bad = at < 0 ? -1 : (int64_t)first + at;
    return 0;
  }
  const uint16_t *h = (const uint16_t *)(const void *)buf;
  float *o = out + first;
  uint16_t exp = bf16 ? BF16_EXP : F16_EXP, any = 0;
  if (bf16)
    any = cast_bf16(o, h, n);
  else
    for (uint64_t i = 0; i < n; i++) {
      o[i] = tz_f16_to_f32(h[i]);
      any |= (uint16_t)((h[i] & exp) == exp);
    }
  for (uint64_t i = 0; any && i < n; i++)
    if ((h[i] & exp) == exp) {
      *bad = (int64_t)(first + i);
      break;
    }
  return 0;
}

/* A batch's read: the chunks of its tensors, one after another, shared by threads that take them
 * in order, so that each file is read front to back as one reader would (what the kernel's
 * readahead expects), each thread casting the chunk it read while the others read theirs. Which
 * chunk failed first and which element of a tensor was its first non-finite one do not depend on
 * the number of threads: every chunk before the first failing one is read, and the smallest
 * index of each wins. */
struct read_job {
  struct tz_st_read *r;
  int n;
  const int64_t *first;    /* first[i]: the batch's index of tensor i's chunk 0; first[n]: all */
  _Atomic int64_t next;    /* the next chunk to take */
  _Atomic int64_t fail_at; /* the smallest chunk known to have failed, or first[n] */
  pthread_mutex_t lock;    /* over the fields below and r[].nonfinite */
  int64_t rc_chunk;        /* the smallest failed chunk a thread reported, or first[n] */
  int rc;                  /* its error, the message in msg */
  char msg[1024];
};

struct read_share_arg {
  struct read_job *j;
  uint8_t *buf; /* IO_CHUNK_2 bytes of this thread's own */
};

static int elem_size(const struct tz_st_tensor *t) { return strcmp(t->dtype, "F32") == 0 ? 4 : 2; }
static uint64_t chunk_of(int es) { return es == 4 ? IO_CHUNK : IO_CHUNK_2; }

/* A thread's share: chunks taken one at a time until none is left or a chunk before the next
 * one has failed. An error's message is in the failing thread's own buffer (tz_err_msg), so it is
 * copied into the job. */
static void *read_share(void *arg) {
  struct read_job *j = ((struct read_share_arg *)arg)->j;
  uint8_t *buf = ((struct read_share_arg *)arg)->buf;
  int i = 0; /* the tensor of the chunk: a thread's chunks come in increasing order */
  for (;;) {
    int64_t c = atomic_fetch_add(&j->next, 1), b;
    if (c >= j->first[j->n] || c > atomic_load(&j->fail_at))
      break;
    while (c >= j->first[i + 1])
      i++;
    struct tz_st_read *r = &j->r[i];
    int es = elem_size(r->t);
    uint64_t chunk = chunk_of(es), total = r->t->end - r->t->begin;
    uint64_t begin = (uint64_t)(c - j->first[i]) * chunk;
    uint64_t len = total - begin < chunk ? total - begin : chunk;
    int rc = read_chunk(r->f, r->t, begin, len, r->out, buf, es, r->t->dtype[0] == 'B', &b);
    if (rc) {
      int64_t seen = atomic_load(&j->fail_at);
      while (c < seen && !atomic_compare_exchange_weak(&j->fail_at, &seen, c))
        ;
      pthread_mutex_lock(&j->lock);
      if (c < j->rc_chunk) {
        j->rc_chunk = c;
        j->rc = rc;
        snprintf(j->msg, sizeof j->msg, "%s", tz_err_msg());
      }
      pthread_mutex_unlock(&j->lock);
      break;
    }
    if (b >= 0) { /* rare: the lock costs nothing */
      pthread_mutex_lock(&j->lock);
      if (r->nonfinite < 0 || b < r->nonfinite)
        r->nonfinite = b;
      pthread_mutex_unlock(&j->lock);
    }
  }
  return NULL;
}

/* The default number of threads of a read: the CPUs this process may run on, at most 8 (beyond a
 * few threads the reads wait on memory; more would mostly take cores from other work). */
#define READ_THREADS_MAX 8

static int default_threads(void) {
  cpu_set_t set;
  int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
  return n < 1 ? 1 : n > READ_THREADS_MAX ? READ_THREADS_MAX : n;
}

void tz_st_set_threads(tz_st_file *f, int n) { f->threads = n > 0 ? n : 0; }

int tz_st_read_tensors_f32(struct tz_st_read *r, int n, int threads) {
  if (n <= 0)
    return 0;
  for (int i = 0; i < n; i++) {
    r[i].nonfinite = -1;
    if (strcmp(r[i].t->dtype, "F32") != 0 && strcmp(r[i].t->dtype, "BF16") != 0 &&
        strcmp(r[i].t->dtype, "F16") != 0)
      return tz_err_set(TZ_ENOTSUP, "%s: tensor '%s' has dtype %s (F32, BF16 and F16 are read)",
                        r[i].f->path, r[i].t->name, r[i].t->dtype);
  }
  int64_t *first = malloc(sizeof *first * ((size_t)n + 1));
  if (!first)
    return tz_err_set(TZ_ENOMEM, "safetensors: out of memory reading %d tensors", n);
  first[0] = 0;
  for (int i = 0; i < n; i++) {
    uint64_t chunk = chunk_of(elem_size(r[i].t));
    first[i + 1] = first[i] + (int64_t)((r[i].t->end - r[i].t->begin + chunk - 1) / chunk);
  }
  int64_t nch = first[n];
  int nt = threads > 0 ? threads : default_threads();
  if (nt > nch)
    nt = nch > 1 ? (int)nch : 1;
  /* Threads, not one: one thread is bound by the work of its core (the copy out of the page
   * cache, the cast, the floats' streaming stores, twice the bytes read); two on two idle cores
   * import in about 0.6 of the time, near what the memory takes. Threads that block rather than
   * spin (pthreads, not an OpenMP team) and chunks taken by whichever thread is free keep a read on
   * cores busy with other work about as fast as one thread: an OpenMP team, whose waiting threads
   * spin, took twice as long as one thread there. docs/benchmarks-history.md has the figures. */
  struct read_job *j = calloc(1, sizeof *j);
  struct read_share_arg *args = calloc((size_t)nt, sizeof *args);
  pthread_t *tid = calloc((size_t)nt, sizeof *tid);
  uint8_t *bufs = malloc((size_t)nt * IO_CHUNK_2);
  int rc = 0;
  if (!j || !args || !tid || !bufs) {
    rc = tz_err_set(TZ_ENOMEM, "%s: out of memory reading tensor '%s'", r[0].f->path, r[0].t->name);
    goto out;
  }
  j->r = r;
  j->n = n;
  j->first = first;
  j->rc_chunk = nch;
  atomic_init(&j->next, 0);
  atomic_init(&j->fail_at, nch);
  pthread_mutex_init(&j->lock, NULL);
  /* The caller's thread is the first of them; one that cannot be started leaves its share to
   * the others. The others block every signal, so that signals reach the threads they reached
   * before. */
  int started = 1;
  for (int i = 0; i < nt; i++)
    args[i] = (struct read_share_arg){j, bufs + (size_t)i * IO_CHUNK_2};
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (int i = 1; i < nt; i++)
    if (pthread_create(&tid[started], NULL, read_share, &args[started]) == 0)
      started++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  read_share(&args[0]);
  for (int i = 1; i < started; i++)
    pthread_join(tid[i], NULL);
  pthread_mutex_destroy(&j->lock);
  rc = j->rc;
  if (rc)
    tz_err_set(rc, "%s", j->msg);
out:
  free(bufs);
  free(tid);
  free(args);
  free(j);
  free(first);
  return rc;
}

int tz_st_read_tensor_f32(tz_st_file *f, const struct tz_st_tensor *t, float *out,
                          int64_t *nonfinite) {
  struct tz_st_read r = {.f = f, .t = t, .out = out};
  int rc = tz_st_read_tensors_f32(&r, 1, f->threads);
  if (nonfinite)
    *nonfinite = rc ? -1 : r.nonfinite;
  return rc;
}

/* ---- writer ---- */

struct tz_st_writer {
  char *path;
  tz_atomic_file *f; /* the temporary file, renamed over path on commit */
  int n, next;
  struct tz_st_entry *e;
  uint64_t *numel;
  int failed;
  uint32_t crc;   /* crc32c of the bytes written so far */
  uint64_t bytes; /* their count */
};

/* n bytes of the file, counted in its crc32c */
static int writer_write(tz_st_writer *w, const void *buf, size_t n) {
  int rc = tz_atomic_write(w->f, buf, n);
  if (rc == 0) {
    w->crc = tz_crc32c(w->crc, buf, n);
    w->bytes += n;
  }
  return rc;
}

void tz_st_writer_sum(const tz_st_writer *w, uint32_t *crc, uint64_t *bytes) {
  *crc = w->crc;
  *bytes = w->bytes;
}

static void writer_free(tz_st_writer *w) {
  tz_atomic_abort(w->f);
  free(w->path);
  free(w->e);
  free(w->numel);
  free(w);
}

int tz_st_writer_open(const char *path, const struct tz_st_entry *e, int n, const char *const *meta,
                      tz_st_writer **out) {
  *out = NULL;
  tz_st_writer *w = calloc(1, sizeof *w);
  json_t *root = json_object();
  char *hdr = NULL;
  int rc = 0;
  if (!w || !root || !(w->path = strdup(path)) || !(w->e = calloc((size_t)n + 1, sizeof *w->e)) ||
      !(w->numel = calloc((size_t)n + 1, sizeof *w->numel))) {
    rc = tz_err_set(TZ_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  w->n = n;
  memcpy(w->e, e, sizeof *e * (size_t)n);
  if (meta) {
    json_t *m = json_object();
    for (int i = 0; meta[i] && meta[i + 1]; i += 2)
      json_object_set_new(m, meta[i], json_string(meta[i + 1]));
    json_object_set_new(root, "__metadata__", m);
  }
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    if (e[i].ndim < 0 || e[i].ndim > TZ_ST_MAX_DIMS || json_object_get(root, e[i].name)) {
      rc = tz_err_set(TZ_EINVAL, "%s: tensor '%s': bad ndim or a duplicate name", path, e[i].name);
      goto fail;
    }
    json_t *t = json_object(), *shape = json_array();
    uint64_t numel = 1;
    for (int d = 0; d < e[i].ndim; d++) {
      json_array_append_new(shape, json_integer(e[i].shape[d]));
      numel *= (uint64_t)e[i].shape[d];
    }
    uint64_t bytes = numel * tz_dtype_size(e[i].dtype);
    json_object_set_new(t, "dtype", json_string(st_dtype_of(e[i].dtype)));
    json_object_set_new(t, "shape", shape);
    json_t *offs = json_array();
    json_array_append_new(offs, json_integer((json_int_t)off));
    json_array_append_new(offs, json_integer((json_int_t)(off + bytes)));
    json_object_set_new(t, "data_offsets", offs);
    json_object_set_new(root, e[i].name, t);
    w->numel[i] = numel;
    off += bytes;
  }
  hdr = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  if (!hdr) {
    rc = tz_err_set(TZ_ENOMEM, "%s: cannot format the header", path);
    goto fail;
  }
  /* Spaces pad the header so that the data starts 8-byte aligned, as the reference writer does. */
  size_t hl = strlen(hdr), padded = (hl + 7) & ~(size_t)7;
  TZ_CHECK_GOTO(tz_atomic_open(path, &(struct tz_atomic_params){.what = "safetensors"}, &w->f), rc,
                fail);
  uint8_t lenb[8];
  for (int i = 0; i < 8; i++)
    lenb[i] = (uint8_t)((uint64_t)padded >> (8 * i));
  TZ_CHECK_GOTO(writer_write(w, lenb, 8), rc, fail);
  TZ_CHECK_GOTO(writer_write(w, hdr, hl), rc, fail);
  TZ_CHECK_GOTO(writer_write(w, "        ", padded - hl), rc, fail);
  free(hdr);
  json_decref(root);
  *out = w;
  return 0;
fail:
  free(hdr);
  json_decref(root);
  if (w)
    writer_free(w);
  return rc;
}

int tz_st_writer_put(tz_st_writer *w, const float *data, uint64_t n) {
  if (w->next >= w->n)
    return tz_err_set(TZ_EINVAL, "%s: all %d tensors are written already", w->path, w->n);
  const struct tz_st_entry *e = &w->e[w->next];
  if (n != w->numel[w->next])
    return tz_err_set(TZ_EINVAL, "%s: tensor '%s' has %llu elements, got %llu", w->path, e->name,
                      (unsigned long long)w->numel[w->next], (unsigned long long)n);
  int rc = 0;
  if (e->dtype == TZ_F32) {
    rc = writer_write(w, data, 4 * n);
  } else {
    uint16_t buf[4096];
    for (uint64_t i = 0; !rc && i < n; i += 4096) {
      uint64_t m = n - i < 4096 ? n - i : 4096;
      for (uint64_t j = 0; j < m; j++)
        buf[j] = e->dtype == TZ_BF16 ? tz_f32_to_bf16(data[i + j]) : tz_f32_to_f16(data[i + j]);
      rc = writer_write(w, buf, 2 * m);
    }
  }
  if (rc < 0) {
    w->failed = 1;
    char msg[512]; /* the message names the file and the error; add the tensor */
    snprintf(msg, sizeof msg, "%s", tz_err_msg());
    return tz_err_set(rc, "%s (writing tensor '%s')", msg, e->name);
  }
  w->next++;
  return 0;
}

int tz_st_writer_close(tz_st_writer *w, int commit) {
  if (!w)
    return 0;
  int rc = 0;
  if (commit && !w->failed && w->next != w->n)
    rc = tz_err_set(TZ_EINVAL, "%s: only %d of %d tensors were written", w->path, w->next, w->n);
  if (commit && !rc && !w->failed) {
    tz_atomic_file *f = w->f;
    w->f = NULL; /* the commit frees it, whatever happens */
    rc = tz_atomic_commit(f);
  } else if (commit && !rc) {
    rc = tz_err_set(TZ_EIO, "%s: an earlier write failed", w->path);
  }
  writer_free(w); /* an uncommitted temporary file is removed */
  return rc;
}
