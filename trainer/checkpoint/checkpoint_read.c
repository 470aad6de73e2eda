/* The reader: a step directory's manifest, one rank's file checked against it, and its sections,
 * each verified by its crc32c as it is read; and a root's checkpoints listed and checked, so that
 * a damaged one's message names the previous intact one. */
#define _GNU_SOURCE
#include "trainer/checkpoint/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void tz_ckpt_manifest_free(struct manifest *m) {
  free(m->bytes);
  free(m->index_crc);
  m->bytes = NULL;
  m->index_crc = NULL;
}

static int parse_uint(const char **p, uint64_t *v) {
  const char *s = *p;
  uint64_t x = 0;
  int digits = 0;
  for (; *s >= '0' && *s <= '9'; s++, digits++) {
    if (x > (UINT64_MAX - 9) / 10)
      return 0;
    x = x * 10 + (uint64_t)(*s - '0');
  }
  *p = s;
  *v = x;
  return digits > 0;
}

static int json_uint(json_t *o, const char *key, uint64_t max, uint64_t *v) {
  json_t *x = json_object_get(o, key);
  if (!json_is_integer(x) || json_integer_value(x) < 0 || (uint64_t)json_integer_value(x) > max)
    return 0;
  *v = (uint64_t)json_integer_value(x);
  return 1;
}

/* The manifest's first line, "tierzero-checkpoint <version> <body bytes> <crc hex8>\n", checked
 * against the body after it, which *body and *body_len then give. */
static int manifest_head(const char *path, const char *text, uint64_t len, const char **body,
                         uint64_t *body_len, int *out_version) {
  const char *p = text;
  uint64_t version, crc = 0;
  size_t tag = strlen(TZ_CKPT_MANIFEST_TAG);
  int ok = strncmp(p, TZ_CKPT_MANIFEST_TAG " ", tag + 1) == 0;
  if (ok) {
    p += tag + 1;
    ok = parse_uint(&p, &version) && *p++ == ' ' && parse_uint(&p, body_len) && *p++ == ' ';
  }
  for (int i = 0; ok && i < 8; i++, p++) {
    int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10 : -1;
    ok = d >= 0;
    crc = crc << 4 | (uint64_t)(d & 15);
  }
  ok = ok && *p++ == '\n';
  if (!ok)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: the first line is not \"%s <version> <bytes> "
                      "<crc32c>\"",
                      path, TZ_CKPT_MANIFEST_TAG);
  if (version < TZ_CKPT_VERSION_MIN || version > TZ_CKPT_VERSION)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: format version %" PRIu64 ", this build reads %d to %d", path,
                      version, TZ_CKPT_VERSION_MIN, TZ_CKPT_VERSION);
  *out_version = (int)version;
  uint64_t head = (uint64_t)(p - text);
  if (*body_len != len - head)
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: the body is %" PRIu64 " bytes, the first line says %" PRIu64
                      " (truncated?)",
                      path, len - head, *body_len);
  uint32_t got = tz_crc32c(0, p, *body_len);
  if (got != (uint32_t)crc)
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: crc32c mismatch at offset %" PRIu64 ": %08x, the first line "
                      "says %08x",
                      path, head, got, (uint32_t)crc);
  *body = p;
  return 0;
}

/* The manifest's body, {"step", "world", "ranks": [{"file", "bytes", "index_crc32c"}, ...]},
 * into m. The step must equal the directory's name when the name is a step-N one. */
static int manifest_body(const char *dir, const char *path, const char *body, uint64_t body_len,
                         struct manifest *m) {
  int rc = 0;
  json_error_t je;
  json_t *root = json_loadb(body, body_len, JSON_REJECT_DUPLICATES, &je);
  uint64_t step = 0, world = 0;
  json_t *ranks = NULL;
  if (!root || !json_is_object(root) || !json_uint(root, "step", INT64_MAX, &step) ||
      !json_uint(root, "world", MAX_WORLD, &world) || world < 1 ||
      !json_is_array(ranks = json_object_get(root, "ranks")) || json_array_size(ranks) != world) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: the body is not {\"step\", \"world\", \"ranks\"}%s%s", path,
                    root ? "" : ": ", root ? "" : je.text);
    goto out;
  }
  uint64_t named;
  const char *base = strrchr(dir, '/');
  base = base ? base + 1 : dir;
  if (tz_ckpt_parse_step_name(base, "", &named) && named != step) {
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: holds step %" PRIu64 ", not the %" PRIu64
                    " of its directory's name",
                    path, step, named);
    goto out;
  }
  m->step = step;
  m->world = (int)world;
  m->bytes = calloc(world, sizeof *m->bytes);
  m->index_crc = calloc(world, sizeof *m->index_crc);
  if (!m->bytes || !m->index_crc) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto out;
  }
  for (int r = 0; r < m->world; r++) {
    json_t *e = json_array_get(ranks, (size_t)r), *file = json_object_get(e, "file");
    char want[32];
    snprintf(want, sizeof want, "rank-%05d.bin", r);
    uint64_t ic = 0;
    if (!json_is_object(e) || !json_is_string(file) || strcmp(json_string_value(file), want) ||
        !json_uint(e, "bytes", INT64_MAX, &m->bytes[r]) ||
        !json_uint(e, "index_crc32c", UINT32_MAX, &ic)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: ranks[%d] is not {\"file\": \"%s\", \"bytes\", "
                      "\"index_crc32c\"}",
                      path, r, want);
      goto out;
    }
    m->index_crc[r] = (uint32_t)ic;
  }
out:
  json_decref(root);
  return rc;
}

/* Reads and checks dir/manifest. The step must equal the directory's name when the name is a
 * step-N one. */
int tz_ckpt_manifest_read(const char *dir, struct manifest *m) {
  memset(m, 0, sizeof *m);
  char *path = tz_ckpt_path_join(dir, TZ_CKPT_MANIFEST), *text = NULL;
  uint64_t len = 0, body_len = 0;
  const char *body = NULL;
  int rc = 0;
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  TZ_CHECK_GOTO(tz_ckpt_io_slurp(path, MAX_MANIFEST_BYTES, &text, &len), rc, out);
  int version = 0;
  rc = manifest_head(path, text, len, &body, &body_len, &version);
  if (rc == 0)
    rc = manifest_body(dir, path, body, body_len, m);
  if (rc == 0)
    m->version = version;
out:
  if (rc)
    tz_ckpt_manifest_free(m);
  free(text);
  free(path);
  return rc;
}

struct rsec {
  char *name;
  uint64_t off, bytes;
  uint32_t crc;
  int kind;
};

struct tz_ckpt_reader {
  char *dir;  /* the step directory */
  char *path; /* the rank file */
  int fd;
  uint64_t step;
  int rank, world, version;
  int hints; /* damaged files get the previous checkpoint suggested in their message */
  struct rsec *sec;
  int n;
  uint8_t *buf; /* IO_BYTES, for streaming */
};

void tz_ckpt_close(tz_ckpt_reader *r) {
  if (!r)
    return;
  if (r->fd >= 0)
    close(r->fd);
  for (int i = 0; i < r->n; i++)
    free(r->sec[i].name);
  free(r->sec);
  free(r->buf);
  free(r->path);
  free(r->dir);
  free(r);
}

/* ---- a root's checkpoints ---- */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int tz_ckpt_list(const char *root, uint64_t *steps, int cap) {
  DIR *d = opendir(root);
  if (!d)
    return errno == ENOENT ? 0 : tz_err_errno(errno, "checkpoint: cannot list %s", root);
  uint64_t *all = NULL;
  int n = 0, cap_all = 0, rc = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    uint64_t step = 0;
    if (!tz_ckpt_parse_step_name(de->d_name, "", &step))
      continue;
    char *dir = tz_ckpt_path_join(root, de->d_name);
    struct manifest m;
    if (!dir) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    int ok = tz_ckpt_manifest_read(dir, &m) == 0;
    free(dir);
    if (!ok)
      continue;
    tz_ckpt_manifest_free(&m);
    if (n == cap_all) {
      cap_all = cap_all ? 2 * cap_all : 16;
      uint64_t *a = realloc(all, sizeof *a * (size_t)cap_all);
      if (!a) {
        rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
        break;
      }
      all = a;
    }
    all[n++] = step;
  }
  closedir(d);
  if (rc == 0) {
    if (n > 1)
      qsort(all, (size_t)n, sizeof *all, cmp_u64);
    for (int i = 0; i < n && i < cap; i++)
      steps[i] = all[i];
    rc = n;
  }
  free(all);
  return rc;
}

int tz_ckpt_check(const char *stepdir, int full) {
  struct manifest m;
  TZ_CHECK(tz_ckpt_manifest_read(stepdir, &m));
  int rc = 0;
  for (int rank = 0; rc == 0 && rank < m.world; rank++) {
    tz_ckpt_reader *r;
    TZ_CHECK_GOTO(tz_ckpt_open_dir(stepdir, rank, 0, &r), rc, out);
    for (int i = 0; full && rc == 0 && i < tz_ckpt_count(r); i++)
      rc = tz_ckpt_get_stream(r, tz_ckpt_name(r, i), NULL, NULL);
    tz_ckpt_close(r);
  }
out:
  tz_ckpt_manifest_free(&m);
  return rc;
}

int tz_ckpt_previous(const char *root, uint64_t step, uint64_t *prev) {
  int n = tz_ckpt_list(root, NULL, 0);
  if (n < 0)
    return n;
  uint64_t *steps = malloc(sizeof *steps * (size_t)(n ? n : 1));
  if (!steps)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  n = tz_ckpt_list(root, steps, n);
  if (n < 0) {
    free(steps);
    return n;
  }
  int rc = TZ_ENOENT;
  for (int i = n - 1; rc == TZ_ENOENT && i >= 0; i--) {
    if (steps[i] >= step)
      continue;
    char *dir = tz_ckpt_step_path(root, steps[i], "");
    if (!dir) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    if (tz_ckpt_check(dir, 1) == 0) {
      *prev = steps[i];
      rc = 0;
    }
    free(dir);
  }
  free(steps);
  if (rc == TZ_ENOENT)
    tz_err_set(rc, "checkpoint: no intact checkpoint older than " STEP_FMT " in %s", step, root);
  return rc;
}

/* ---- the reader ---- */

/* Appends to the thread's error message the newest intact checkpoint before the damaged one in
 * dir (a root's step-N directory), so that the caller can offer it. Returns rc. */
static int hint_previous(int rc, const char *dir, uint64_t step) {
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", tz_err_msg());
  char *root = strdup(dir);
  if (!root)
    return rc;
  char *slash = strrchr(root, '/');
  if (slash)
    *slash = '\0';
  else
    strcpy(root, ".");
  uint64_t prev;
  if (tz_ckpt_previous(root, step, &prev) == 0)
    tz_err_set(rc, "%s; the previous checkpoint " STEP_FMT " is intact: --resume %s/" STEP_FMT, msg,
               prev, root, prev);
  else
    tz_err_set(rc, "%s; no earlier intact checkpoint in %s", msg, root);
  free(root);
  return rc;
}

/* Where a rank file's index lies, from its trailer. */
struct index_loc {
  uint64_t off, bytes, n;
  uint32_t crc;
};

/* The header of r's file: that of rank r->rank of m's checkpoint, intact. */
static int check_header(tz_ckpt_reader *r, const struct manifest *m) {
  uint8_t h[TZ_CKPT_HEADER_CRC_AT + 4];
  TZ_CHECK(tz_ckpt_io_read_at(r->fd, r->path, h, sizeof h, 0));
  uint32_t hc = (uint32_t)tz_ckpt_get_le(h + TZ_CKPT_HEADER_CRC_AT, 4);
  if (tz_crc32c(0, h, TZ_CKPT_HEADER_CRC_AT) != hc)
    return tz_err_set(TZ_ECHECKSUM, "checkpoint %s: header at offset 0: crc32c mismatch", r->path);
  if (memcmp(h, TZ_CKPT_MAGIC, 8) != 0 || tz_ckpt_get_le(h + 8, 4) != (uint64_t)m->version ||
      tz_ckpt_get_le(h + 12, 4) != (uint64_t)r->rank ||
      tz_ckpt_get_le(h + 16, 4) != (uint64_t)m->world ||
      tz_ckpt_get_le(h + 20, 4) != TZ_CKPT_ALIGN || tz_ckpt_get_le(h + 24, 8) != m->step)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: header at offset 0 is not that of a version %d rank file "
                      "of rank %d of %d, step %" PRIu64,
                      r->path, m->version, r->rank, m->world, m->step);
  return 0;
}

/* The trailer at the end of r's file (size bytes): intact, describing this file and matching
 * m's index crc. *x: where the index is. */
static int read_trailer(tz_ckpt_reader *r, const struct manifest *m, uint64_t size,
                        struct index_loc *x) {
  uint8_t t[TZ_CKPT_TRAILER_BYTES];
  uint64_t toff = size - TZ_CKPT_TRAILER_BYTES;
  TZ_CHECK(tz_ckpt_io_read_at(r->fd, r->path, t, sizeof t, toff));
  if (tz_crc32c(0, t, TZ_CKPT_TRAILER_CRC_AT) != tz_ckpt_get_le(t + TZ_CKPT_TRAILER_CRC_AT, 4))
    return tz_err_set(TZ_ECHECKSUM, "checkpoint %s: trailer at offset %" PRIu64 ": crc32c mismatch",
                      r->path, toff);
  uint64_t index_off = tz_ckpt_get_le(t + 8, 8), index_bytes = tz_ckpt_get_le(t + 16, 8),
           n = tz_ckpt_get_le(t + 24, 4);
  uint32_t index_crc = (uint32_t)tz_ckpt_get_le(t + TZ_CKPT_TRAILER_INDEX_CRC_AT, 4);
  if (memcmp(t, TZ_CKPT_INDEX_MAGIC, 8) != 0 || tz_ckpt_get_le(t + 32, 8) != m->step ||
      tz_ckpt_get_le(t + 40, 4) != (uint64_t)r->rank ||
      tz_ckpt_get_le(t + 44, 4) != (uint64_t)m->world || tz_ckpt_get_le(t + 48, 8) != size ||
      index_off % TZ_CKPT_ALIGN || index_off < TZ_CKPT_HEADER_BYTES || index_off > toff ||
      index_bytes != toff - index_off || index_bytes > MAX_INDEX_BYTES ||
      n > index_bytes / TZ_CKPT_ENTRY_FIXED)
    return tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: trailer at offset %" PRIu64 " does not describe this file",
                      r->path, toff);
  if (index_crc != m->index_crc[r->rank])
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: index crc32c %08x, the manifest says %08x (a file of "
                      "another save?)",
                      r->path, index_crc, m->index_crc[r->rank]);
  *x = (struct index_loc){index_off, index_bytes, n, index_crc};
  return 0;
}

/* Entry i of the index (at `at` in it): its fields into s and the length of its name, which
 * follows them. 0 when it is malformed; end is where the previous section ends. */
static int index_entry(const uint8_t *index, const struct index_loc *x, uint64_t at, uint64_t end,
                       struct rsec *s, uint64_t *len) {
  *len = 0;
  if (x->bytes - at >= TZ_CKPT_ENTRY_FIXED) {
    s->off = tz_ckpt_get_le(index + at, 8);
    s->bytes = tz_ckpt_get_le(index + at + 8, 8);
    s->crc = (uint32_t)tz_ckpt_get_le(index + at + 16, 4);
    s->kind = (int)tz_ckpt_get_le(index + at + 20, 2);
    *len = tz_ckpt_get_le(index + at + 22, 2);
  }
  return !(x->bytes - at < TZ_CKPT_ENTRY_FIXED || *len == 0 || *len > TZ_CKPT_MAX_NAME ||
           *len > x->bytes - at - TZ_CKPT_ENTRY_FIXED || s->off % TZ_CKPT_ALIGN || s->off < end ||
           s->off > x->off || s->bytes > x->off - s->off ||
           (s->kind != TZ_CKPT_KIND_BYTES && s->kind != TZ_CKPT_KIND_JSON));
}

/* Loads the index x locates into r->sec, checking every entry. */
static int load_index(tz_ckpt_reader *r, const struct index_loc *x) {
  uint8_t *index = malloc(x->bytes ? x->bytes : 1);
  r->sec = calloc(x->n ? x->n : 1, sizeof *r->sec);
  if (!index || !r->sec) {
    free(index);
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  }
  int rc = tz_ckpt_io_read_at(r->fd, r->path, index, x->bytes, x->off);
  if (rc == 0 && tz_crc32c(0, index, x->bytes) != x->crc)
    rc = tz_err_set(TZ_ECHECKSUM, "checkpoint %s: index at offset %" PRIu64 ": crc32c mismatch",
                    r->path, x->off);
  uint64_t at = 0, end = TZ_CKPT_HEADER_BYTES;
  for (uint64_t i = 0; rc == 0 && i < x->n; i++) {
    struct rsec *s = &r->sec[i];
    uint64_t len;
    if (!index_entry(index, x, at, end, s, &len)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: index entry %" PRIu64 " at offset %" PRIu64 " is malformed",
                      r->path, i, x->off + at);
      break;
    }
    if (!(s->name = strndup((const char *)index + at + TZ_CKPT_ENTRY_FIXED, len))) {
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
      break;
    }
    r->n++;
    if (strlen(s->name) != len || !tz_ckpt_name_ok(s->name)) {
      rc = tz_err_set(TZ_EFORMAT,
                      "checkpoint %s: index entry %" PRIu64 " at offset %" PRIu64
                      " has a malformed name",
                      r->path, i, x->off + at);
      break;
    }
    for (int j = 0; rc == 0 && j < r->n - 1; j++)
      if (strcmp(r->sec[j].name, s->name) == 0)
        rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: section \"%s\" appears twice in the index",
                        r->path, s->name);
    at += TZ_CKPT_ENTRY_FIXED + len;
    end = s->off + s->bytes;
  }
  if (rc == 0 && at != x->bytes)
    rc = tz_err_set(TZ_EFORMAT,
                    "checkpoint %s: index at offset %" PRIu64 " has %" PRIu64
                    " bytes after its %" PRIu64 " entries",
                    r->path, x->off, x->bytes - at, x->n);
  free(index);
  return rc;
}

/* Checks rank r's file against the manifest and loads its index. */
static int reader_load(tz_ckpt_reader *r, const struct manifest *m) {
  struct stat sb;
  if (fstat(r->fd, &sb) < 0)
    return tz_err_errno(errno, "checkpoint %s: fstat", r->path);
  uint64_t size = (uint64_t)sb.st_size;
  if (size != m->bytes[r->rank])
    return tz_err_set(TZ_ECHECKSUM,
                      "checkpoint %s: %" PRIu64 " bytes, the manifest says %" PRIu64
                      " (truncated or replaced)",
                      r->path, size, m->bytes[r->rank]);
  if (size < TZ_CKPT_HEADER_BYTES + TZ_CKPT_TRAILER_BYTES)
    return tz_err_set(TZ_EFORMAT, "checkpoint %s: %" PRIu64 " bytes is too short", r->path, size);
  struct index_loc x = {0, 0, 0, 0};
  TZ_CHECK(check_header(r, m));
  TZ_CHECK(read_trailer(r, m, size, &x));
  return load_index(r, &x);
}

/* Opens rank's file of the checkpoint in step directory dir. */
int tz_ckpt_open_dir(const char *dir, int rank, int hints, tz_ckpt_reader **out) {
  *out = NULL;
  struct manifest m;
  uint64_t named = 0;
  const char *base = strrchr(dir, '/');
  int has_step = tz_ckpt_parse_step_name(base ? base + 1 : dir, "", &named);
  int rc = tz_ckpt_manifest_read(dir, &m);
  if (rc < 0)
    return hints && has_step && rc != TZ_ENOMEM ? hint_previous(rc, dir, named) : rc;
  if (rank < 0 || rank >= m.world) {
    tz_ckpt_manifest_free(&m);
    return tz_err_set(TZ_ENOENT, "checkpoint %s: has ranks 0..%d, not rank %d", dir, m.world - 1,
                      rank);
  }
  tz_ckpt_reader *r = calloc(1, sizeof *r);
  if (!r || !(r->dir = strdup(dir)) || !(r->path = tz_ckpt_rank_path(dir, rank))) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    goto fail;
  }
  r->rank = rank;
  r->world = m.world;
  r->step = m.step;
  r->version = m.version;
  r->hints = hints && has_step;
  r->fd = open(r->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO is never waited on */
  if (r->fd < 0) {
    rc = tz_err_errno(errno, "checkpoint %s: cannot open", r->path);
    goto fail;
  }
  TZ_CHECK_GOTO(reader_load(r, &m), rc, fail);
  tz_ckpt_manifest_free(&m);
  *out = r;
  return 0;
fail:
  tz_ckpt_manifest_free(&m);
  tz_ckpt_close(r);
  if (hints && has_step && rc != TZ_ENOMEM)
    hint_previous(rc, dir, named);
  return rc;
}

/* The step latest names. */
static int latest_read(const char *root, uint64_t *step) {
  char *path = tz_ckpt_path_join(root, TZ_CKPT_LATEST), *text = NULL;
  uint64_t len = 0;
  if (!path)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = tz_ckpt_io_slurp(path, 64, &text, &len);
  if (rc == 0) {
    if (len > 0 && text[len - 1] == '\n')
      text[--len] = '\0';
    if (strlen(text) != len || !tz_ckpt_parse_step_name(text, "", step))
      rc = tz_err_set(TZ_EFORMAT, "checkpoint %s: does not hold a step-N directory name", path);
  }
  free(text);
  free(path);
  return rc;
}

int tz_ckpt_latest(const char *root, uint64_t *step) { return latest_read(root, step); }

int tz_ckpt_open(const char *path, int rank, tz_ckpt_reader **out) {
  *out = NULL;
  char *manifest = tz_ckpt_path_join(path, TZ_CKPT_MANIFEST);
  char *latest = tz_ckpt_path_join(path, TZ_CKPT_LATEST);
  int rc = 0;
  if (!manifest || !latest) {
    rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  } else if (access(manifest, F_OK) == 0) {
    rc = tz_ckpt_open_dir(path, rank, 1, out);
  } else if (access(latest, F_OK) == 0) {
    uint64_t step = 0;
    rc = latest_read(path, &step);
    char *dir = rc == 0 ? tz_ckpt_step_path(path, step, "") : NULL;
    if (rc == 0 && !dir)
      rc = tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
    if (rc == 0)
      rc = tz_ckpt_open_dir(dir, rank, 1, out);
    free(dir);
  } else {
    /* A crash between a first save's rename and its latest leaves a checkpoint but no latest. */
    uint64_t newest[1];
    int n = tz_ckpt_list(path, NULL, 0), m = n > 0 ? n : 0;
    uint64_t *steps = m ? malloc(sizeof *steps * (size_t)m) : newest;
    if (steps && m && tz_ckpt_list(path, steps, m) == m)
      rc = tz_err_set(TZ_ENOENT,
                      "checkpoint: %s has no latest, but holds complete checkpoints; the newest "
                      "is " STEP_FMT ": --resume %s/" STEP_FMT,
                      path, steps[m - 1], path, steps[m - 1]);
    else
      rc = tz_err_set(TZ_ENOENT,
                      "checkpoint: nothing to resume at %s: it has neither a manifest (a step "
                      "directory) nor a latest (a checkpoint root)",
                      path);
    if (steps != newest)
      free(steps);
  }
  free(manifest);
  free(latest);
  return rc;
}

uint64_t tz_ckpt_step(const tz_ckpt_reader *r) { return r->step; }
int tz_ckpt_world(const tz_ckpt_reader *r) { return r->world; }
int tz_ckpt_version(const tz_ckpt_reader *r) { return r->version; }
int tz_ckpt_options_version(const struct tz_ckpt_options *opt) {
  return opt && opt->version ? opt->version : TZ_CKPT_VERSION;
}
const char *tz_ckpt_dir(const tz_ckpt_reader *r) { return r->dir; }
int tz_ckpt_count(const tz_ckpt_reader *r) { return r->n; }

const char *tz_ckpt_name(const tz_ckpt_reader *r, int i) {
  return i >= 0 && i < r->n ? r->sec[i].name : NULL;
}

static const struct rsec *find(const tz_ckpt_reader *r, const char *name) {
  for (int i = 0; i < r->n; i++)
    if (strcmp(r->sec[i].name, name) == 0)
      return &r->sec[i];
  return NULL;
}

int tz_ckpt_size(const tz_ckpt_reader *r, const char *name, uint64_t *bytes) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  *bytes = s->bytes;
  return 0;
}

static int crc_mismatch(const tz_ckpt_reader *r, const struct rsec *s, uint32_t got) {
  tz_err_set(TZ_ECHECKSUM,
             "checkpoint %s: section \"%s\" at offset %" PRIu64 ": crc32c mismatch (%08x, the "
             "index says %08x)",
             r->path, s->name, s->off, got, s->crc);
  return r->hints ? hint_previous(TZ_ECHECKSUM, r->dir, r->step) : TZ_ECHECKSUM;
}

static int read_failed(const tz_ckpt_reader *r, int rc) {
  return r->hints && rc != TZ_ENOMEM ? hint_previous(rc, r->dir, r->step) : rc;
}

int tz_ckpt_get(tz_ckpt_reader *r, const char *name, void *dst, uint64_t bytes) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (bytes != s->bytes)
    return tz_err_set(TZ_EINVAL,
                      "checkpoint %s: section \"%s\" is %" PRIu64
                      " bytes, the caller expects %" PRIu64,
                      r->path, name, s->bytes, bytes);
  int rc = tz_ckpt_io_read_at(r->fd, r->path, dst, bytes, s->off);
  if (rc < 0)
    return read_failed(r, rc);
  uint32_t crc = tz_crc32c(0, dst, bytes);
  return crc == s->crc ? 0 : crc_mismatch(r, s, crc);
}

int tz_ckpt_get_stream(tz_ckpt_reader *r, const char *name, tz_ckpt_sink sink, void *ctx) {
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (!r->buf && !(r->buf = malloc(IO_BYTES)))
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  uint32_t crc = 0;
  for (uint64_t done = 0; done < s->bytes;) {
    uint64_t n = s->bytes - done < IO_BYTES ? s->bytes - done : IO_BYTES;
    int rc = tz_ckpt_io_read_at(r->fd, r->path, r->buf, n, s->off + done);
    if (rc < 0)
      return read_failed(r, rc);
    crc = tz_crc32c(crc, r->buf, n);
    if (sink && (rc = sink(ctx, r->buf, done, n)) < 0)
      return rc;
    done += n;
  }
  return crc == s->crc ? 0 : crc_mismatch(r, s, crc);
}

int tz_ckpt_get_json(tz_ckpt_reader *r, const char *name, char **out) {
  *out = NULL;
  const struct rsec *s = find(r, name);
  if (!s)
    return tz_err_set(TZ_ENOENT, "checkpoint %s: no section \"%s\"", r->path, name);
  if (s->kind != TZ_CKPT_KIND_JSON)
    return tz_err_set(TZ_EINVAL, "checkpoint %s: section \"%s\" holds bytes, not JSON", r->path,
                      name);
  char *text = malloc(s->bytes + 1);
  if (!text)
    return tz_err_set(TZ_ENOMEM, "checkpoint: out of memory");
  int rc = tz_ckpt_get(r, name, text, s->bytes);
  if (rc < 0) {
    free(text);
    return rc;
  }
  text[s->bytes] = '\0';
  *out = text;
  return 0;
}

int tz_ckpt_get_config(tz_ckpt_reader *r, struct tz_config *c) {
  char *text = NULL, *origin = NULL;
  TZ_CHECK(tz_ckpt_get_json(r, "config", &text));
  if (asprintf(&origin, "%s: section \"config\"", r->path) < 0)
    origin = NULL;
  int rc = tz_config_load_string(c, text, origin);
  free(origin);
  free(text);
  return rc;
}
