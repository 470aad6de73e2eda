/* The writer: one rank's file of a checkpoint, section by section, then its index and trailer. */
#define _GNU_SOURCE
#include "trainer/checkpoint/checkpoint_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Writer */

struct wsec {
  char *name;
  uint64_t off, bytes;
  uint32_t crc;
  uint16_t kind;
};

struct tz_ckpt_writer {
  char *path; /* the rank file, inside the temporary directory */
  int fd;
  uint64_t step;
  int rank, world;
  int version;  /* of the format written */
  uint8_t *buf; /* IO_BYTES, holding the bytes from file offset `flushed` on */
  size_t buf_len;
  uint64_t flushed; /* bytes written to the file */
  struct wsec *sec;
  int n, cap;
  int open;                   /* section sec[n - 1] is being written */
  uint64_t done;              /* its bytes so far */
  int failed;                 /* an operation failed: only destroy (or a failing commit) remains */
  struct tz_ckpt_hooks hooks; /* the save's test hooks (tz_ckpt_options) */
  struct tz_file_hooks fh;    /* the same, as util/file.h calls them */
};

static uint64_t w_pos(const tz_ckpt_writer *w) { return w->flushed + w->buf_len; }

/* A failed write, of the bytes from file offset w->flushed on. */
static int w_fail(tz_ckpt_writer *w, int e, const char *what) {
  w->failed = 1;
  return tz_err_errno(e, "checkpoint %s: %s at offset %" PRIu64, w->path, what, w->flushed);
}

static int w_flush(tz_ckpt_writer *w) {
  if (!w->buf_len)
    return 0;
  int e = tz_file_pwrite(&w->fh, w->fd, w->buf, w->buf_len, w->flushed);
  if (e)
    return w_fail(w, e, "write");
  w->flushed += w->buf_len;
  w->buf_len = 0;
  return 0;
}

static int w_append(tz_ckpt_writer *w, const void *data, uint64_t n) {
  const uint8_t *p = data;
  while (n > 0) {
    if (w->buf_len == 0 && n >= IO_BYTES) {
      /* Large pieces go straight to the file, in whole buffers' worth. */
      uint64_t m = n - n % IO_BYTES;
      int e = tz_file_pwrite(&w->fh, w->fd, p, m, w->flushed);
      if (e)
        return w_fail(w, e, "write");
      w->flushed += m;
      p += m;
      n -= m;
      continue;
    }
    size_t m = IO_BYTES - w->buf_len < n ? IO_BYTES - w->buf_len : (size_t)n;
    memcpy(w->buf + w->buf_len, p, m);
    w->buf_len += m;
    p += m;
    n -= m;
    if (w->buf_len == IO_BYTES)
      TZ_CHECK(w_flush(w));
  }
  return 0;
}

static int w_pad(tz_ckpt_writer *w) {
  static const uint8_t zeros[TZ_CKPT_ALIGN];
  uint64_t r = w_pos(w) % TZ_CKPT_ALIGN;
  return r ? w_append(w, zeros, TZ_CKPT_ALIGN - r) : 0;
}

static void w_free(tz_ckpt_writer *w) {
  if (w->fd >= 0)
    close(w->fd);
  for (int i = 0; i < w->n; i++)
    free(w->sec[i].name);
  free(w->sec);
  free(w->buf);
  free(w->path);
  free(w);
}

void tz_ckpt_writer_destroy(tz_ckpt_writer *w) {
  if (!w)
    return;
  if (w->fd >= 0) {
    close(w->fd);
    w->fd = -1;
  }
  int e = tz_file_unlink(&w->fh, w->path);
  if (e && e != ENOENT)
    tz_log(TZ_LOG_WARN, "checkpoint: cannot remove the partial file %s: %s", w->path, strerror(e));
  w_free(w);
}

int tz_ckpt_begin(const char *root, uint64_t step, int rank, int world,
                  const struct tz_ckpt_options *opt, tz_ckpt_writer **out) {
  *out = NULL;
  if (!root || !*root || world < 1 || world > MAX_WORLD || rank < 0 || rank >= world ||
      step > INT64_MAX)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint: bad arguments (root %s, step %" PRIu64 ", rank %d of %d)",
                      root ? root : "NULL", step, rank, world);
  int rc = 0, e;
  char *tmp = tz_ckpt_step_path(root, step, ".tmp");
  tz_ckpt_writer *w = calloc(1, sizeof *w);
  if (!tmp || !w) {
    free(tmp);
    free(w);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  w->fd = -1;
  w->step = step;
  w->rank = rank;
  w->world = world;
  if (opt)
    w->hooks = opt->hooks;
  w->version = tz_ckpt_options_version(opt);
  const struct tz_file_hooks *h = tz_ckpt_file_hooks(&w->hooks, &w->fh);
  if (!(w->path = tz_ckpt_rank_path(tmp, rank)) ||
      !(w->buf = aligned_alloc(TZ_CKPT_ALIGN, IO_BYTES))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  if (rank == 0) {
    if ((e = tz_file_mkdir_p(h, root, TZ_MKDIR_DURABLE))) {
      rc = tz_err_errno(e, "checkpoint: cannot create the directory %s", root);
      goto fail;
    }
    /* A directory of this name is what a crashed save of the same step left. */
    if ((e = tz_ckpt_io_rm_tree(h, tmp))) {
      rc = tz_err_errno(e, "checkpoint: cannot remove the stale %s", tmp);
      goto fail;
    }
    if ((e = tz_file_mkdir(h, tmp))) {
      rc = tz_err_errno(e, "checkpoint: cannot create %s", tmp);
      goto fail;
    }
  }
  if ((e = tz_file_create(h, w->path, 0644, &w->fd))) {
    if (e == ENOENT && rank > 0)
      rc = tz_err_set(TZ_ENOENT, "checkpoint: %s does not exist: rank 0 must begin the save first",
                      tmp);
    else if (e == EEXIST)
      rc = tz_err_set(TZ_EEXIST, "checkpoint: %s exists already: two processes with rank %d?",
                      w->path, rank);
    else
      rc = tz_err_errno(e, "checkpoint: cannot create %s", w->path);
    goto fail;
  }
  uint8_t hdr[TZ_CKPT_HEADER_BYTES] = {0};
  memcpy(hdr, TZ_CKPT_MAGIC, 8);
  tz_ckpt_put_le(hdr + 8, (uint64_t)w->version, 4);
  tz_ckpt_put_le(hdr + 12, (uint64_t)rank, 4);
  tz_ckpt_put_le(hdr + 16, (uint64_t)world, 4);
  tz_ckpt_put_le(hdr + 20, TZ_CKPT_ALIGN, 4);
  tz_ckpt_put_le(hdr + 24, step, 8);
  tz_ckpt_put_le(hdr + TZ_CKPT_HEADER_CRC_AT, tz_crc32c(0, hdr, TZ_CKPT_HEADER_CRC_AT), 4);
  TZ_CHECK_GOTO(w_append(w, hdr, sizeof hdr), rc, fail_file);
  free(tmp);
  *out = w;
  return 0;
fail_file:
  tz_ckpt_writer_destroy(w);
  free(tmp);
  return rc;
fail:
  w_free(w);
  free(tmp);
  return rc;
}

static int section_begin(tz_ckpt_writer *w, const char *name, uint64_t bytes, uint16_t kind) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" is still open", w->path,
                      w->sec[w->n - 1].name);
  if (!tz_ckpt_name_ok(name))
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: bad section name \"%s\" (1..%d printable ASCII characters, "
                      "no spaces)",
                      w->path, name ? name : "(null)", TZ_CKPT_MAX_NAME);
  for (int i = 0; i < w->n; i++)
    if (strcmp(w->sec[i].name, name) == 0)
      return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" was written already", w->path,
                        name);
  if (w->n == w->cap) {
    int cap = w->cap ? 2 * w->cap : 64;
    struct wsec *s = realloc(w->sec, sizeof *s * (size_t)cap);
    if (!s)
      return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    w->sec = s;
    w->cap = cap;
  }
  int rc = w_pad(w);
  if (rc < 0)
    return rc;
  struct wsec *s = &w->sec[w->n];
  if (!(s->name = strdup(name)))
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  s->off = w_pos(w);
  s->bytes = bytes;
  s->crc = 0;
  s->kind = kind;
  w->n++;
  w->open = 1;
  w->done = 0;
  return 0;
}

int tz_ckpt_section_begin(tz_ckpt_writer *w, const char *name, uint64_t bytes) {
  return section_begin(w, name, bytes, TZ_CKPT_KIND_BYTES);
}

int tz_ckpt_section_write(tz_ckpt_writer *w, const void *data, uint64_t n) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (!w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: no section is open", w->path);
  struct wsec *s = &w->sec[w->n - 1];
  if (n > s->bytes - w->done)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: section \"%s\" is %" PRIu64 " bytes; %" PRIu64
                      " are written and %" PRIu64 " more would exceed it",
                      w->path, s->name, s->bytes, w->done, n);
  s->crc = tz_crc32c(s->crc, data, n);
  TZ_CHECK(w_append(w, data, n));
  w->done += n;
  return 0;
}

int tz_ckpt_section_end(tz_ckpt_writer *w) {
  if (w->failed)
    return tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
  if (!w->open)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: no section is open", w->path);
  struct wsec *s = &w->sec[w->n - 1];
  if (w->done != s->bytes)
    return tz_err_set(
        TZ_EINVAL, "checkpoint %s: section \"%s\" ended after %" PRIu64 " of its %" PRIu64 " bytes",
        w->path, s->name, w->done, s->bytes);
  w->open = 0;
  return 0;
}

static int put_kind(tz_ckpt_writer *w, const char *name, const void *data, uint64_t bytes,
                    uint16_t kind) {
  TZ_CHECK(section_begin(w, name, bytes, kind));
  TZ_CHECK(tz_ckpt_section_write(w, data, bytes));
  return tz_ckpt_section_end(w);
}

int tz_ckpt_put(tz_ckpt_writer *w, const char *name, const void *data, uint64_t bytes) {
  return put_kind(w, name, data, bytes, TZ_CKPT_KIND_BYTES);
}

int tz_ckpt_put_json(tz_ckpt_writer *w, const char *name, const char *json) {
  json_error_t je;
  json_t *v = json_loads(json, JSON_DECODE_ANY, &je);
  if (!v)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\": not JSON: %d:%d: %s", w->path,
                      name, je.line, je.column, je.text);
  json_decref(v);
  return put_kind(w, name, json, strlen(json), TZ_CKPT_KIND_JSON);
}

int tz_ckpt_put_config(tz_ckpt_writer *w, const struct tz_config *c) {
  char *text = NULL;
  size_t len = 0;
  /* the training's settings, not the run's (faults, log level, ...: tz_config_forget_run) */
  struct tz_config saved;
  TZ_CHECK(tz_config_copy(&saved, c));
  tz_config_forget_run(&saved);
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    tz_config_free(&saved);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  int rc = tz_config_dump(&saved, f);
  tz_config_free(&saved);
  if (fclose(f) != 0 && rc == 0)
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  if (rc == 0)
    rc = tz_ckpt_put_json(w, "config", text);
  free(text);
  return rc;
}

int tz_ckpt_commit(tz_ckpt_writer *w) {
  int rc = 0, e;
  uint8_t *index = NULL;
  if (w->failed) {
    rc = tz_err_set(TZ_ECANCELED, "checkpoint %s: an earlier error stopped this save", w->path);
    goto fail;
  }
  if (w->open) {
    rc = tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" was not ended", w->path,
                    w->sec[w->n - 1].name);
    goto fail;
  }
  TZ_CHECK_GOTO(w_pad(w), rc, fail);
  uint64_t index_off = w_pos(w), index_bytes = 0;
  for (int i = 0; i < w->n; i++)
    index_bytes += TZ_CKPT_ENTRY_FIXED + strlen(w->sec[i].name);
  if (!(index = malloc(index_bytes ? index_bytes : 1))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  uint8_t *p = index;
  for (int i = 0; i < w->n; i++) {
    const struct wsec *s = &w->sec[i];
    size_t len = strlen(s->name);
    tz_ckpt_put_le(p, s->off, 8);
    tz_ckpt_put_le(p + 8, s->bytes, 8);
    tz_ckpt_put_le(p + 16, s->crc, 4);
    tz_ckpt_put_le(p + 20, s->kind, 2);
    tz_ckpt_put_le(p + 22, len, 2);
    memcpy(p + TZ_CKPT_ENTRY_FIXED, s->name, len);
    p += TZ_CKPT_ENTRY_FIXED + len;
  }
  uint8_t tr[TZ_CKPT_TRAILER_BYTES] = {0};
  memcpy(tr, TZ_CKPT_INDEX_MAGIC, 8);
  tz_ckpt_put_le(tr + 8, index_off, 8);
  tz_ckpt_put_le(tr + 16, index_bytes, 8);
  tz_ckpt_put_le(tr + 24, (uint64_t)w->n, 4);
  tz_ckpt_put_le(tr + TZ_CKPT_TRAILER_INDEX_CRC_AT, tz_crc32c(0, index, index_bytes), 4);
  tz_ckpt_put_le(tr + 32, w->step, 8);
  tz_ckpt_put_le(tr + 40, (uint64_t)w->rank, 4);
  tz_ckpt_put_le(tr + 44, (uint64_t)w->world, 4);
  tz_ckpt_put_le(tr + 48, index_off + index_bytes + TZ_CKPT_TRAILER_BYTES, 8);
  tz_ckpt_put_le(tr + TZ_CKPT_TRAILER_CRC_AT, tz_crc32c(0, tr, TZ_CKPT_TRAILER_CRC_AT), 4);
  TZ_CHECK_GOTO(w_append(w, index, index_bytes), rc, fail);
  TZ_CHECK_GOTO(w_append(w, tr, sizeof tr), rc, fail);
  TZ_CHECK_GOTO(w_flush(w), rc, fail);
  if ((e = tz_file_fsync(&w->fh, w->fd))) {
    w->failed = 1;
    rc = tz_err_errno(e, "checkpoint %s: fsync after writing %" PRIu64 " bytes", w->path,
                      w->flushed);
    goto fail;
  }
  int fd = w->fd;
  w->fd = -1;
  if (close(fd) < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: close", w->path);
    goto fail;
  }
  free(index);
  w_free(w);
  return 0;
fail:
  free(index);
  tz_ckpt_writer_destroy(w);
  return rc;
}

uint64_t tz_ckpt_config_bytes(const struct tz_config *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f)
    return 0;
  int rc = tz_config_dump(c, f);
  if (fclose(f) != 0)
    rc = -1;
  free(text);
  return rc == 0 ? len : 0;
}
