/* Checkpoints (trainer/checkpoint/checkpoint.h): round trips of every kind of section at world size
 * 2, the writer's refusals, latest/list/previous and --keep, replacing a checkpoint of the same
 * step, damaged files named with section and offset (with the previous checkpoint offered), a save
 * killed with SIGKILL before each of its file-system operations in turn, and a full disk at each
 * write and fsync in turn. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/config.h"
#include "core/log.h"
#include "core/error.h"
#include "testlib.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_format.h"

#define WORLD 2

/* The sections every rank saves: sizes around the 4096 alignment and the writer's 1 MiB buffer
 * (a section that large goes straight to the file). */
static const struct {
  const char *name;
  uint64_t bytes;
} sections[] = {
    {"empty", 0},
    {"one", 1},
    {"layer.0.param", 4095},
    {"layer.0.adam_m", 4096},
    {"layer.0.adam_v", 4097},
    {"layer.1.param", (1u << 20) + 12345},
    {"rng", 100},
};
#define N_SECTIONS (int)(sizeof sections / sizeof sections[0])

/* Section i of rank `rank` in save (step, variant): bytes no other save has. */
static void *section_data(uint64_t step, int variant, int rank, int i) {
  void *p = malloc(sections[i].bytes + 1);
  assert_non_null(p);
  tz_test_fill(p, sections[i].bytes,
               step * 1000003u + (uint64_t)variant * 7919u + (uint64_t)rank * 131u + (uint64_t)i);
  return p;
}

static char *meta_json(uint64_t step, int variant, int rank) {
  char *s;
  assert_true(asprintf(&s, "{\"step\": %" PRIu64 ", \"variant\": %d, \"rank\": %d}", step, variant,
                       rank) > 0);
  return s;
}

/* Saves checkpoint (step, variant) of every rank as the ranks of a job would, in one process,
 * with the save's options opt (NULL: none). On an error, cleans up as the trainer would (writers
 * dropped, then abandon) and returns it, the thread's message being that of the failure. */
static int save_with(const char *root, uint64_t step, int variant, int keep,
                     const struct tz_ckpt_options *opt) {
  tz_ckpt_writer *w[WORLD] = {0};
  int rc = 0;
  for (int r = 0; r < WORLD && rc == 0; r++)
    rc = tz_ckpt_begin(root, step, r, WORLD, opt, &w[r]);
  for (int r = 0; r < WORLD && rc == 0; r++) {
    for (int i = 0; i < N_SECTIONS && rc == 0; i++) {
      void *d = section_data(step, variant, r, i);
      rc = tz_ckpt_put(w[r], sections[i].name, d, sections[i].bytes);
      free(d);
    }
    char *m = meta_json(step, variant, r);
    if (rc == 0)
      rc = tz_ckpt_put_json(w[r], "meta", m);
    free(m);
    if (rc == 0) {
      struct tz_config c;
      tz_config_defaults(&c);
      c.optimizer.lr = 1e-3 * (double)(step + 1);
      /* settings of the run, which the checkpoint must not keep (verify) */
      TZ_ASSERT_OK(tz_config_set(&c, "tierzero.faults", "delay=1"));
      TZ_ASSERT_OK(tz_config_set(&c, "tierzero.log", "debug"));
      TZ_ASSERT_OK(tz_config_set(&c, "tierzero.sched_debug", "1"));
      rc = tz_ckpt_put_config(w[r], &c);
      tz_config_free(&c);
    }
  }
  for (int r = 0; r < WORLD; r++) {
    if (w[r] && rc == 0)
      rc = tz_ckpt_commit(w[r]);
    else
      tz_ckpt_writer_destroy(w[r]);
    w[r] = NULL;
  }
  if (rc == 0)
    rc = tz_ckpt_finalize(root, step, WORLD, keep, opt);
  if (rc < 0) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", tz_err_msg());
    tz_ckpt_abandon(root, step, opt);
    tz_err_set(rc, "%s", msg);
  }
  return rc;
}

static int save(const char *root, uint64_t step, int variant, int keep) {
  return save_with(root, step, variant, keep, NULL);
}

/* Opens every rank of the checkpoint at path (a root or a step directory), checks that every
 * section holds exactly what save() wrote, and returns its step and variant. */
static void verify(const char *path, uint64_t *step, int *variant) {
  for (int r = 0; r < WORLD; r++) {
    tz_ckpt_reader *rd;
    TZ_ASSERT_OK(tz_ckpt_open(path, r, &rd));
    assert_int_equal(tz_ckpt_world(rd), WORLD);
    char *m;
    TZ_ASSERT_OK(tz_ckpt_get_json(rd, "meta", &m));
    json_t *j = json_loads(m, 0, NULL);
    assert_non_null(j);
    uint64_t s = (uint64_t)json_integer_value(json_object_get(j, "step"));
    int v = (int)json_integer_value(json_object_get(j, "variant"));
    assert_int_equal(json_integer_value(json_object_get(j, "rank")), r);
    json_decref(j);
    free(m);
    assert_int_equal(s, tz_ckpt_step(rd));
    if (r == 0) {
      *step = s;
      *variant = v;
    } else {
      assert_int_equal(s, *step);
      assert_int_equal(v, *variant);
    }
    assert_int_equal(tz_ckpt_count(rd), N_SECTIONS + 2);
    for (int i = 0; i < N_SECTIONS; i++) {
      assert_string_equal(tz_ckpt_name(rd, i), sections[i].name);
      void *want = section_data(s, v, r, i), *got = malloc(sections[i].bytes + 1);
      TZ_ASSERT_OK(tz_ckpt_get(rd, sections[i].name, got, sections[i].bytes));
      assert_memory_equal(got, want, sections[i].bytes);
      free(want);
      free(got);
    }
    struct tz_config c;
    tz_config_defaults(&c);
    TZ_ASSERT_OK(tz_ckpt_get_config(rd, &c));
    assert_true(c.optimizer.lr == 1e-3 * (double)(s + 1));
    /* the run's faults, log level and debug prints are not the training's: a resume without them
     * has none (issue 48: a resume without TZ_FAULTS still injected the saved faults) */
    assert_null(c.tierzero.faults);
    assert_int_equal(c.tierzero.log, TZ_LOG_WARN);
    assert_int_equal(c.tierzero.sched_debug, 0);
    tz_config_free(&c);
    tz_ckpt_close(rd);
  }
}

static char *join(const char *a, const char *b) {
  char *p;
  assert_true(asprintf(&p, "%s/%s", a, b) > 0);
  return p;
}

static char *step_dir(const char *root, uint64_t step) {
  char *p;
  assert_true(asprintf(&p, "%s/step-%08" PRIu64, root, step) > 0);
  return p;
}

/* Entries of root whose name ends with suffix. */
static int count_suffix(const char *root, const char *suffix) {
  DIR *d = opendir(root);
  assert_non_null(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d))) {
    size_t l = strlen(de->d_name), s = strlen(suffix);
    n += l >= s && strcmp(de->d_name + l - s, suffix) == 0;
  }
  closedir(d);
  return n;
}

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  assert_int_equal(fclose(f), 0);
}

static void flip_byte(const char *path, uint64_t off) {
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  uint8_t b;
  assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
  b ^= 0x40;
  assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
  close(fd);
}

static uint64_t section_offset(const char *dir, int rank, const char *name) {
  /* The writer lays sections out in order, each at the next multiple of 4096 after the header. */
  (void)dir, (void)rank;
  uint64_t off = TZ_CKPT_HEADER_BYTES;
  for (int i = 0; i < N_SECTIONS; i++) {
    if (strcmp(sections[i].name, name) == 0)
      return off;
    off += (sections[i].bytes + TZ_CKPT_ALIGN - 1) / TZ_CKPT_ALIGN * TZ_CKPT_ALIGN;
  }
  fail_msg("no section %s", name);
  return 0;
}

/* Collects a streamed section, checking that the pieces come in order. */
struct sink {
  uint8_t *buf;
  uint64_t next;
  int calls;
};

static int sink_fn(void *ctx, const void *data, uint64_t off, uint64_t n) {
  struct sink *s = ctx;
  assert_int_equal(off, s->next);
  memcpy(s->buf + off, data, n);
  s->next += n;
  s->calls++;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */

static void test_round_trip(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  TZ_ASSERT_OK(save(root, 7, 3, 0));
  uint64_t step;
  int variant;
  verify(root, &step, &variant);
  assert_int_equal(step, 7);
  assert_int_equal(variant, 3);
  char *dir = step_dir(root, 7);
  verify(dir, &step, &variant);
  TZ_ASSERT_OK(tz_ckpt_check(dir, 1));
  TZ_ASSERT_OK(tz_ckpt_latest(root, &step));
  assert_int_equal(step, 7);
  assert_int_equal(count_suffix(root, ".tmp"), 0);
  /* Without latest (a first save that crashed before writing it), open offers what is there. */
  char *latest = join(root, "latest");
  char *aside = join(root, "latest.aside");
  assert_int_equal(rename(latest, aside), 0);
  tz_ckpt_reader *none;
  assert_int_equal(tz_ckpt_open(root, 0, &none), TZ_ENOENT);
  if (!strstr(tz_err_msg(), "has no latest") || !strstr(tz_err_msg(), "step-00000007"))
    fail_msg("%s", tz_err_msg());
  assert_int_equal(rename(aside, latest), 0);
  free(aside);
  free(latest);

  tz_ckpt_reader *r;
  TZ_ASSERT_OK(tz_ckpt_open(root, 1, &r));
  assert_string_equal(tz_ckpt_dir(r), dir);
  uint64_t bytes;
  TZ_ASSERT_OK(tz_ckpt_size(r, "layer.1.param", &bytes));
  assert_int_equal(bytes, sections[5].bytes);
  /* Streamed in pieces, the same bytes. */
  uint8_t *got = calloc(1, bytes), *want = section_data(7, 3, 1, 5);
  struct sink sk = {got, 0, 0};
  TZ_ASSERT_OK(tz_ckpt_get_stream(r, "layer.1.param", sink_fn, &sk));
  assert_int_equal(sk.next, bytes);
  assert_int_equal(sk.calls, 2);
  assert_memory_equal(got, want, bytes);
  free(got);
  free(want);
  /* Wrong sizes and names, a bytes section read as JSON, ranks beyond the world. */
  uint8_t small[8];
  assert_int_equal(tz_ckpt_get(r, "rng", small, sizeof small), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "100 bytes"));
  assert_int_equal(tz_ckpt_get(r, "nope", small, sizeof small), TZ_ENOENT);
  assert_int_equal(tz_ckpt_size(r, "nope", &bytes), TZ_ENOENT);
  char *js;
  assert_int_equal(tz_ckpt_get_json(r, "rng", &js), TZ_EINVAL);
  assert_null(tz_ckpt_name(r, -1));
  assert_null(tz_ckpt_name(r, N_SECTIONS + 2));
  tz_ckpt_close(r);
  tz_ckpt_close(NULL);
  assert_int_equal(tz_ckpt_open(root, WORLD, &r), TZ_ENOENT);
  assert_int_equal(tz_ckpt_open(dir, -1, &r), TZ_ENOENT);
  char *nothing = join(root, "nothing");
  assert_int_equal(tz_ckpt_open(nothing, 0, &r), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "neither a manifest"));
  free(nothing);

  /* The config section loads back to what tz_config_dump wrote. */
  TZ_ASSERT_OK(tz_ckpt_open(root, 0, &r));
  TZ_ASSERT_OK(tz_ckpt_get_json(r, "config", &js));
  struct tz_config c;
  tz_config_defaults(&c);
  c.optimizer.lr = 1e-3 * 8;
  char *dump = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&dump, &len);
  TZ_ASSERT_OK(tz_config_dump(&c, f));
  fclose(f);
  assert_string_equal(js, dump);
  free(dump);
  free(js);
  tz_config_free(&c);
  tz_ckpt_close(r);
  free(dir);
  tz_test_rmdir(root);
}

static void test_writer_refusals(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  tz_ckpt_writer *w;
  /* Rank 1 before rank 0: the directory does not exist yet. */
  assert_int_equal(tz_ckpt_begin(root, 1, 1, 2, NULL, &w), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "rank 0 must begin"));
  assert_int_equal(tz_ckpt_begin(root, 1, 2, 2, NULL, &w), TZ_EINVAL);
  assert_int_equal(tz_ckpt_begin(root, 1, 0, 0, NULL, &w), TZ_EINVAL);
  TZ_ASSERT_OK(tz_ckpt_begin(root, 1, 0, 2, NULL, &w));
  /* Two processes claiming one rank. */
  tz_ckpt_writer *w1, *again;
  TZ_ASSERT_OK(tz_ckpt_begin(root, 1, 1, 2, NULL, &w1));
  assert_int_equal(tz_ckpt_begin(root, 1, 1, 2, NULL, &again), TZ_EEXIST);
  tz_ckpt_writer_destroy(w1);
  uint8_t d[16] = {0};
  assert_int_equal(tz_ckpt_put(w, "", d, 1), TZ_EINVAL);
  assert_int_equal(tz_ckpt_put(w, "a b", d, 1), TZ_EINVAL);
  char longname[TZ_CKPT_MAX_NAME + 2];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  assert_int_equal(tz_ckpt_put(w, longname, d, 1), TZ_EINVAL);
  longname[TZ_CKPT_MAX_NAME] = '\0';
  TZ_ASSERT_OK(tz_ckpt_put(w, longname, d, 1));
  TZ_ASSERT_OK(tz_ckpt_put(w, "a", d, 16));
  assert_int_equal(tz_ckpt_put(w, "a", d, 16), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "written already"));
  assert_int_equal(tz_ckpt_put_json(w, "j", "{\"x\": "), TZ_EINVAL);
  assert_int_equal(tz_ckpt_section_write(w, d, 1), TZ_EINVAL); /* none open */
  TZ_ASSERT_OK(tz_ckpt_section_begin(w, "s", 10));
  assert_int_equal(tz_ckpt_section_begin(w, "t", 10), TZ_EINVAL); /* s still open */
  TZ_ASSERT_OK(tz_ckpt_section_write(w, d, 6));
  assert_int_equal(tz_ckpt_section_write(w, d, 5), TZ_EINVAL); /* past its 10 bytes */
  assert_int_equal(tz_ckpt_section_end(w), TZ_EINVAL);         /* 6 of 10 */
  TZ_ASSERT_OK(tz_ckpt_section_write(w, d, 4));
  TZ_ASSERT_OK(tz_ckpt_section_end(w));
  TZ_ASSERT_OK(tz_ckpt_section_begin(w, "u", 3));
  /* Committing with a section open fails and removes the file. */
  assert_int_equal(tz_ckpt_commit(w), TZ_EINVAL);
  char *file = join(root, "step-00000001.tmp/rank-00000.bin");
  assert_int_equal(access(file, F_OK), -1);
  /* finalize sees that rank 0 did not commit, and removes the temporary directory. */
  assert_int_equal(tz_ckpt_finalize(root, 1, 2, 0, NULL), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), "rank 0 did not commit"));
  assert_int_equal(count_suffix(root, ".tmp"), 0);
  uint64_t s;
  assert_int_equal(tz_ckpt_latest(root, &s), TZ_ENOENT);
  tz_ckpt_writer_destroy(NULL);
  /* A writer dropped without commit removes its file. */
  TZ_ASSERT_OK(tz_ckpt_begin(root, 2, 0, 1, NULL, &w));
  TZ_ASSERT_OK(tz_ckpt_put(w, "a", d, 16));
  tz_ckpt_writer_destroy(w);
  char *file2 = join(root, "step-00000002.tmp/rank-00000.bin");
  assert_int_equal(access(file2, F_OK), -1);
  TZ_ASSERT_OK(tz_ckpt_abandon(root, 2, NULL));
  TZ_ASSERT_OK(tz_ckpt_abandon(root, 2, NULL));
  assert_int_equal(count_suffix(root, ".tmp"), 0);
  assert_int_equal(tz_ckpt_list(root, NULL, 0), 0);
  free(file);
  free(file2);
  tz_test_rmdir(root);
}

static void test_keep_and_list(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  char *missing = join(root, "a/b/c");
  assert_int_equal(tz_ckpt_list(missing, NULL, 0), 0);
  /* The root is created, parents included. */
  TZ_ASSERT_OK(save(missing, 1, 0, 0));
  assert_int_equal(tz_ckpt_list(missing, NULL, 0), 1);
  free(missing);

  TZ_ASSERT_OK(save(root, 10, 0, 0));
  TZ_ASSERT_OK(save(root, 20, 0, 0));
  /* What crashed saves leave behind, cleaned up by the next finalize. */
  char *stale = join(root, "step-00000005.tmp"), *stale_old = join(root, "step-00000003.old");
  assert_int_equal(mkdir(stale, 0755), 0);
  assert_int_equal(mkdir(stale_old, 0755), 0);
  char *junk = join(stale, "rank-00000.bin");
  write_text(junk, "partial");
  TZ_ASSERT_OK(save(root, 30, 0, 0));
  assert_int_equal(access(stale, F_OK), -1);
  assert_int_equal(access(stale_old, F_OK), -1);
  TZ_ASSERT_OK(save(root, 40, 0, 2));
  uint64_t steps[8];
  assert_int_equal(tz_ckpt_list(root, steps, 8), 2);
  assert_int_equal(steps[0], 30);
  assert_int_equal(steps[1], 40);
  /* cap smaller than the count: the count, and the oldest cap. */
  assert_int_equal(tz_ckpt_list(root, steps, 1), 2);
  assert_int_equal(steps[0], 30);
  uint64_t s;
  TZ_ASSERT_OK(tz_ckpt_latest(root, &s));
  assert_int_equal(s, 40);
  TZ_ASSERT_OK(tz_ckpt_previous(root, 40, &s));
  assert_int_equal(s, 30);
  assert_int_equal(tz_ckpt_previous(root, 30, &s), TZ_ENOENT);

  /* A run resumed from 30 saves 35 with keep 1: 40, newer, stays; 30 goes. */
  TZ_ASSERT_OK(save(root, 35, 1, 1));
  assert_int_equal(tz_ckpt_list(root, steps, 8), 2);
  assert_int_equal(steps[0], 35);
  assert_int_equal(steps[1], 40);
  TZ_ASSERT_OK(tz_ckpt_latest(root, &s));
  assert_int_equal(s, 35);
  int variant;
  verify(root, &s, &variant);
  assert_int_equal(s, 35);
  assert_int_equal(variant, 1);
  /* The directories that do not look like checkpoints are ignored by list. */
  char *other = join(root, "step-12x");
  assert_int_equal(mkdir(other, 0755), 0);
  char *empty = join(root, "step-00000050");
  assert_int_equal(mkdir(empty, 0755), 0);
  assert_int_equal(tz_ckpt_list(root, steps, 8), 2);
  free(other);
  free(empty);
  free(junk);
  free(stale);
  free(stale_old);
  tz_test_rmdir(root);
}

/* A checkpoint of a step that exists already (the run was resumed from before it) replaces it. */
static void test_replace(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  TZ_ASSERT_OK(save(root, 10, 0, 0));
  TZ_ASSERT_OK(save(root, 20, 1, 0));
  TZ_ASSERT_OK(save(root, 20, 2, 0));
  uint64_t s;
  int variant;
  verify(root, &s, &variant);
  assert_int_equal(s, 20);
  assert_int_equal(variant, 2);
  assert_int_equal(count_suffix(root, ".tmp"), 0);
  assert_int_equal(count_suffix(root, ".old"), 0);
  assert_int_equal(tz_ckpt_list(root, NULL, 0), 2);
  tz_test_rmdir(root);
}

static void expect_damaged(const char *path, int rank, int rc_open, const char *name, int rc_get,
                           const char *const *words) {
  tz_ckpt_reader *r = NULL;
  int rc = tz_ckpt_open(path, rank, &r);
  if (rc_open) {
    assert_int_equal(rc, rc_open);
    assert_null(r);
  } else {
    TZ_ASSERT_OK(rc);
    uint64_t bytes;
    TZ_ASSERT_OK(tz_ckpt_size(r, name, &bytes));
    void *buf = malloc(bytes + 1);
    assert_int_equal(tz_ckpt_get(r, name, buf, bytes), rc_get);
    free(buf);
  }
  for (int i = 0; words[i]; i++)
    if (!strstr(tz_err_msg(), words[i]))
      fail_msg("\"%s\" is not in the message: %s", words[i], tz_err_msg());
  tz_ckpt_close(r);
}

/* The previous checkpoint that a damaged one's message offers is verified to its checksums: one
 * whose structure is intact but a payload byte is flipped is not offered (issue #27 item 7). */
static void test_previous_verified(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  TZ_ASSERT_OK(save(root, 80, 0, 0));
  TZ_ASSERT_OK(save(root, 90, 0, 0));
  TZ_ASSERT_OK(save(root, 100, 0, 0));
  char *d90 = step_dir(root, 90), *r90 = join(d90, "rank-00001.bin");
  uint64_t off = section_offset(d90, 1, "layer.0.adam_m"), prev = 0;
  flip_byte(r90, off + 5);
  TZ_ASSERT_OK(tz_ckpt_check(d90, 0)); /* only the checksums can tell */
  TZ_ASSERT_OK(tz_ckpt_previous(root, 100, &prev));
  assert_int_equal(prev, 80);
  free(r90);
  free(d90);
  tz_test_rmdir(root);
}

/* Damage in each part of a file in turn, each undone before the next, on the one saved root; a
 * list of cases, longer than a function should be but read top to bottom. */
static void test_damaged(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  TZ_ASSERT_OK(save(root, 90, 0, 0));
  TZ_ASSERT_OK(save(root, 100, 0, 0));
  char *dir = step_dir(root, 100), *rank1 = join(dir, "rank-00001.bin"),
       *manifest = join(dir, "manifest"), hint[512];
  snprintf(hint, sizeof hint,
           "the previous checkpoint step-00000090 is intact: --resume %s/"
           "step-00000090",
           root);
  uint64_t off = section_offset(dir, 1, "layer.0.adam_m");

  /* A flipped payload byte: found when the section is read, named with its offset. */
  flip_byte(rank1, off + 17);
  char offs[64];
  snprintf(offs, sizeof offs, "at offset %" PRIu64 ": crc32c mismatch", off);
  const char *w1[] = {rank1, "section \"layer.0.adam_m\"", offs, hint, NULL};
  expect_damaged(root, 1, 0, "layer.0.adam_m", TZ_ECHECKSUM, w1);
  assert_int_equal(tz_ckpt_check(dir, 1), TZ_ECHECKSUM);
  TZ_ASSERT_OK(tz_ckpt_check(dir, 0)); /* the structure is intact */
  /* Streaming reports it too, after the last piece. */
  tz_ckpt_reader *r;
  TZ_ASSERT_OK(tz_ckpt_open(dir, 1, &r));
  assert_int_equal(tz_ckpt_get_stream(r, "layer.0.adam_m", NULL, NULL), TZ_ECHECKSUM);
  TZ_ASSERT_OK(tz_ckpt_get_stream(r, "layer.0.adam_v", NULL, NULL));
  tz_ckpt_close(r);
  flip_byte(rank1, off + 17);
  TZ_ASSERT_OK(tz_ckpt_check(dir, 1));

  /* The header, the trailer and the index. */
  struct stat sb;
  assert_int_equal(stat(rank1, &sb), 0);
  const char *w2[] = {rank1, "header at offset 0: crc32c mismatch", hint, NULL};
  flip_byte(rank1, 9);
  expect_damaged(root, 1, TZ_ECHECKSUM, NULL, 0, w2);
  flip_byte(rank1, 9);
  const char *w3[] = {rank1, "trailer at offset", "crc32c mismatch", hint, NULL};
  flip_byte(rank1, (uint64_t)sb.st_size - 20);
  expect_damaged(root, 1, TZ_ECHECKSUM, NULL, 0, w3);
  flip_byte(rank1, (uint64_t)sb.st_size - 20);
  const char *w4[] = {rank1, "index at offset", "crc32c mismatch", hint, NULL};
  flip_byte(rank1, (uint64_t)sb.st_size - TZ_CKPT_TRAILER_BYTES - 3);
  expect_damaged(root, 1, TZ_ECHECKSUM, NULL, 0, w4);
  flip_byte(rank1, (uint64_t)sb.st_size - TZ_CKPT_TRAILER_BYTES - 3);
  TZ_ASSERT_OK(tz_ckpt_check(dir, 1));

  /* Truncated: the size no longer matches the manifest. */
  assert_int_equal(truncate(rank1, sb.st_size - 4096), 0);
  const char *w5[] = {rank1, "truncated", hint, NULL};
  expect_damaged(root, 1, TZ_ECHECKSUM, NULL, 0, w5);
  /* Rank 0's file is intact and still loads. */
  TZ_ASSERT_OK(tz_ckpt_open(root, 0, &r));
  tz_ckpt_close(r);
  uint64_t prev;
  TZ_ASSERT_OK(tz_ckpt_previous(root, 100, &prev));
  assert_int_equal(prev, 90);
  /* The truncated one is still listed (its manifest is intact), but fails the check. */
  assert_int_equal(tz_ckpt_list(root, NULL, 0), 2);
  assert_true(tz_ckpt_check(dir, 0) < 0);

  /* A damaged manifest: the checkpoint is no longer listed; open names the manifest. */
  flip_byte(manifest, 60);
  const char *w6[] = {manifest, "crc32c mismatch", hint, NULL};
  expect_damaged(root, 0, TZ_ECHECKSUM, NULL, 0, w6);
  assert_int_equal(tz_ckpt_list(root, NULL, 0), 1);
  /* A missing rank file. */
  flip_byte(manifest, 60);
  assert_int_equal(unlink(rank1), 0);
  const char *w7[] = {rank1, "No such file", hint, NULL};
  expect_damaged(dir, 1, TZ_ENOENT, NULL, 0, w7);
  /* latest names a directory that is gone. */
  char *dir90 = step_dir(root, 90), *latest = join(root, "latest");
  write_text(latest, "step-00000095\n");
  const char *w8[] = {"step-00000095/manifest", hint, NULL};
  expect_damaged(root, 0, TZ_ENOENT, NULL, 0, w8);
  write_text(latest, "step-0000009x\n");
  const char *w9[] = {"latest: does not hold", NULL};
  expect_damaged(root, 0, TZ_EFORMAT, NULL, 0, w9);
  /* No earlier one to offer. */
  const char *w10[] = {"no earlier intact checkpoint in", NULL};
  char *man90 = join(dir90, "manifest");
  flip_byte(man90, 60);
  write_text(latest, "step-00000100\n");
  expect_damaged(root, 1, TZ_ENOENT, NULL, 0, w10);
  free(man90);
  free(dir90);
  free(latest);
  free(dir);
  free(rank1);
  free(manifest);
  tz_test_rmdir(root);
}

/* ---- the save's fault hook ---- */

enum fault_kind {
  FAULT_NONE, /* only counts */
  /* SIGKILL the process right before the nth file-system operation of the save path that changes
   * something (create, write, fsync, rename, mkdir, unlink, rmdir). */
  FAULT_CRASH,
  /* The nth write or fsync of the save path fails with ENOSPC, as a full disk makes it. */
  FAULT_ENOSPC,
};

struct fault {
  enum fault_kind kind;
  long at;  /* the operation it strikes, from 1 */
  long ops; /* operations counted so far (FAULT_ENOSPC: writes and fsyncs only) */
};

/* struct tz_ckpt_hooks.before_op for a struct fault. */
static int fault_before(void *ctx, int data_op) {
  struct fault *f = ctx;
  if (f->kind == FAULT_ENOSPC && !data_op)
    return 0;
  if (++f->ops != f->at)
    return 0;
  if (f->kind == FAULT_CRASH) {
    kill(getpid(), SIGKILL);
    for (;;)
      pause();
  }
  return f->kind == FAULT_ENOSPC ? ENOSPC : 0;
}

/* Options whose hook is f, armed for operation at (0: never). */
static struct tz_ckpt_options fault_options(struct fault *f, enum fault_kind kind, long at) {
  *f = (struct fault){kind, at, 0};
  return (struct tz_ckpt_options){.hooks = {.before_op = fault_before, .ctx = f}};
}

/* ---- crash at every operation of the save path ---- */

enum crash_case {
  FIRST_SAVE,   /* an empty root */
  OVER_OLDER,   /* a root holding step 1 */
  REPLACE_SAME, /* a root holding step 1 (latest) and a step 2 from a run resumed from step 1 */
};

/* What latest names must be complete and hold one of the expected saves: step 1, variant 0 or
 * step 2, variant 2 (or nothing, when the first save crashed before its latest was written). */
static void verify_after_crash(const char *root, int *saw_old, int *saw_new) {
  uint64_t s;
  int v;
  if (tz_ckpt_latest(root, &s) == TZ_ENOENT) {
    tz_ckpt_reader *r;
    assert_int_equal(tz_ckpt_open(root, 0, &r), TZ_ENOENT);
    (*saw_old)++;
  } else {
    verify(root, &s, &v);
    char *dir = step_dir(root, s);
    TZ_ASSERT_OK(tz_ckpt_check(dir, 1));
    free(dir);
    if (s == 1 && v == 0)
      (*saw_old)++;
    else if (s == 2 && v == 2)
      (*saw_new)++;
    else
      fail_msg("latest holds step %" PRIu64 " variant %d", s, v);
  }
  /* Every checkpoint that list reports is complete as well. */
  uint64_t steps[8];
  int n = tz_ckpt_list(root, steps, 8);
  assert_true(n >= 0 && n <= 8);
  for (int i = 0; i < n; i++) {
    char *d = step_dir(root, steps[i]);
    TZ_ASSERT_OK(tz_ckpt_check(d, 1));
    free(d);
  }
}

/* Saves step 2 (variant 2) with --keep keep, killed before the 1st, 2nd, ... operation of the
 * save until one completes. Returns the number of points. */
static int crash_loop(enum crash_case cc, int keep) {
  int saw_old = 0, saw_new = 0, n;
  for (n = 1;; n++) {
    char *root = tz_test_mkdtemp("ckpt-crash");
    if (cc == REPLACE_SAME)
      TZ_ASSERT_OK(save(root, 2, 1, 0));
    if (cc != FIRST_SAVE)
      TZ_ASSERT_OK(save(root, 1, 0, 0));
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      struct fault f;
      struct tz_ckpt_options opt = fault_options(&f, FAULT_CRASH, n);
      int rc = save_with(root, 2, 2, keep, &opt);
      if (rc)
        fprintf(stderr, "save: %s\n", tz_err_msg());
      _exit(rc ? 1 : 0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    int completed = WIFEXITED(st);
    if (completed)
      assert_int_equal(WEXITSTATUS(st), 0);
    else
      assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    verify_after_crash(root, &saw_old, &saw_new);
    if (completed) {
      uint64_t s;
      TZ_ASSERT_OK(tz_ckpt_latest(root, &s));
      assert_int_equal(s, 2);
      assert_int_equal(count_suffix(root, ".tmp"), 0);
      assert_int_equal(count_suffix(root, ".old"), 0);
      if (keep == 1)
        assert_int_equal(tz_ckpt_list(root, NULL, 0), 1);
    } else {
      /* The next save after a crash succeeds and cleans up what the crash left. */
      TZ_ASSERT_OK(save(root, 3, 0, keep));
      uint64_t s;
      int v;
      verify(root, &s, &v);
      assert_int_equal(s, 3);
      assert_int_equal(count_suffix(root, ".tmp"), 0);
      assert_int_equal(count_suffix(root, ".old"), 0);
    }
    tz_test_rmdir(root);
    if (completed)
      break;
  }
  print_message("crash points: %d (latest was the old checkpoint after %d, the new after %d)\n",
                n - 1, saw_old, saw_new - 1);
  /* Two rank files and a manifest, each created, written and fsynced, and the renames and
   * fsyncs of the directories: many more than 12 points. */
  assert_true(n - 1 > 12);
  assert_true(saw_old > 0);
  assert_true(saw_new > 1); /* latest renamed, then killed; and the save that completed */
  return n - 1;
}

static void test_crash_first_save(void **state) {
  (void)state;
  crash_loop(FIRST_SAVE, 1);
}

static void test_crash_over_older(void **state) {
  (void)state;
  crash_loop(OVER_OLDER, 1);
}

static void test_crash_replace_step(void **state) {
  (void)state;
  crash_loop(REPLACE_SAME, 0);
}

/* The fault hook counts what the save does, without a fault. */
static void test_fault_count(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("ckpt");
  TZ_ASSERT_OK(save(root, 1, 0, 0));
  struct fault f;
  struct tz_ckpt_options opt = fault_options(&f, FAULT_NONE, 0);
  TZ_ASSERT_OK(save_with(root, 2, 0, 0, &opt));
  long all = f.ops;
  opt = fault_options(&f, FAULT_ENOSPC, 1000000);
  TZ_ASSERT_OK(save_with(root, 3, 0, 0, &opt));
  long data = f.ops;
  print_message("save path: %ld operations, %ld of them writes and fsyncs\n", all, data);
  assert_true(data > 8 && all > data);
  tz_test_rmdir(root);
}

/* ---- disk full at every write and fsync ---- */

static void test_enospc(void **state) {
  (void)state;
  int n, in_latest = 0, after_latest = 0;
  for (n = 1;; n++) {
    char *root = tz_test_mkdtemp("ckpt-full");
    TZ_ASSERT_OK(save(root, 1, 0, 0));
    struct fault f;
    struct tz_ckpt_options opt = fault_options(&f, FAULT_ENOSPC, n);
    int rc = save_with(root, 2, 0, 1, &opt);
    if (rc == 0) {
      tz_test_rmdir(root);
      break;
    }
    assert_int_equal(rc, TZ_ENOSPC);
    const char *msg = tz_err_msg();
    if (!strstr(msg, "No space left on device") || !strstr(msg, root))
      fail_msg("unclear message: %s", msg);
    /* The previous checkpoint is what latest names, intact; nothing temporary is left. */
    uint64_t s;
    int v;
    verify(root, &s, &v);
    assert_int_equal(count_suffix(root, ".tmp"), 0);
    if (strstr(msg, "a crash may still bring back the previous one")) {
      /* The last fsync, of latest's rename: latest names the new checkpoint already. */
      assert_int_equal(s, 2);
      after_latest++;
    } else if (strstr(msg, "latest")) {
      assert_int_equal(s, 1);
      /* latest could not be written: step 2 is complete, and the message says latest is old. */
      assert_non_null(strstr(msg, "still names the previous checkpoint"));
      char *d = step_dir(root, 2);
      TZ_ASSERT_OK(tz_ckpt_check(d, 1));
      free(d);
      in_latest++;
    } else {
      assert_int_equal(s, 1);
      assert_int_equal(tz_ckpt_list(root, NULL, 0), 1);
    }
    tz_test_rmdir(root);
  }
  print_message("ENOSPC points: %d (%d while writing latest, %d after)\n", n - 1, in_latest,
                after_latest);
  assert_true(n - 1 > 8);
  assert_true(in_latest >= 2); /* its write and its fsync */
  assert_int_equal(after_latest, 1);
}

int main(int argc, char **argv) {
  (void)argc, (void)argv;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),       cmocka_unit_test(test_writer_refusals),
      cmocka_unit_test(test_keep_and_list),    cmocka_unit_test(test_replace),
      cmocka_unit_test(test_damaged),          cmocka_unit_test(test_fault_count),
      cmocka_unit_test(test_crash_first_save), cmocka_unit_test(test_previous_verified),
      cmocka_unit_test(test_crash_over_older), cmocka_unit_test(test_crash_replace_step),
      cmocka_unit_test(test_enospc),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
