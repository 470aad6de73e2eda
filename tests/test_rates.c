/* The machine rates on the cpu backend: measured (every rate the CPU machine has is positive,
 * copy_duplex is 0), cached and read back with the same bits, an entry written by hand read field
 * by field (copy_duplex included), an entry without copy_duplex (or another field) measured again
 * with nothing kept from it, and the cuda backend refused by a build without CUDA; an entry
 * forgotten (a run under its bound) is measured again and the others stay; a run's rate at the
 * homes joins its entry and is read back, a new measurement drops it; the layer probe is
 * the fastest of its passes, and a plan's probe that would be slow is not run but said (issue #27
 * item 11). */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/runtime.h"
#include "testlib.h"
#include "kernels/compute.h"
#include "trainer/model/model.h"
#include "trainer/step/rates.h"

#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct env {
  struct tz_config cfg;
  tz_runtime *rt;
  tz_comm *comm;
  char *dir;
  char path[PATH_MAX];
};

static int setup(void **state) {
  struct env *e = calloc(1, sizeof *e);
  tz_config_defaults(&e->cfg);
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  int rc = tz_runtime_create(NULL, &e->rt);
  if (rc == 0)
    rc = tz_comm_create("single", &bs, NULL, &e->comm);
  if (rc < 0) {
    print_error("setup: %s\n", tz_err_msg());
    return -1;
  }
  e->dir = tz_test_mkdtemp("rates");
  snprintf(e->path, sizeof e->path, "%s/cache/rates.json", e->dir);
  *state = e;
  return 0;
}

static int teardown(void **state) {
  struct env *e = *state;
  tz_comm_destroy(e->comm);
  tz_runtime_destroy(e->rt);
  tz_config_free(&e->cfg);
  tz_test_rmdir(e->dir);
  free(e);
  return 0;
}

static void assert_same(const struct tz_plan_rates *a, const struct tz_plan_rates *b) {
  assert_true(a->flops == b->flops);
  assert_true(a->copy_in == b->copy_in);
  assert_true(a->copy_out == b->copy_out);
  assert_true(a->copy_duplex == b->copy_duplex);
  assert_true(a->copy_local == b->copy_local);
  assert_true(a->nvme_read == b->nvme_read);
  assert_true(a->nvme_write == b->nvme_write);
  assert_true(a->nvme_duplex == b->nvme_duplex);
  assert_true(a->adam == b->adam);
  assert_true(a->adam_home == b->adam_home);
  assert_true(a->adam_home_busy == b->adam_home_busy);
  assert_true(a->copy_in_adam == b->copy_in_adam);
  assert_true(a->copy_out_adam == b->copy_out_adam);
  assert_true(a->adam_home_run == b->adam_home_run);
  assert_true(a->nvme_run == b->nvme_run);
  assert_true(a->collective == b->collective);
}

/* Measured with an NVMe directory (so nvme rates too), then read back from the cache. */
static void test_measure_and_cache(void **state) {
  struct env *e = *state;
  TZ_ASSERT_OK(tz_config_set(&e->cfg, "tierzero.nvme_path", e->dir));
  struct tz_plan_rates a, b;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 1, &a));
  assert_true(a.flops > 0);
  assert_true(a.copy_in > 0);
  assert_true(a.copy_out > 0);
  assert_true(a.copy_local > 0);
  assert_true(a.nvme_read > 0);
  assert_true(a.nvme_write > 0);
  assert_true(a.nvme_duplex > 0); /* a read and a write at once */
  assert_true(a.adam > 0);
  assert_true(a.adam_home == a.adam); /* a CPU-only machine: the same CPU Adam */
  assert_true(a.copy_duplex == 0);
  assert_true(a.collective == 0); /* a world of one */
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &b));
  assert_same(&a, &b);
  /* The cache holds copy_duplex beside the others. */
  json_error_t err;
  json_t *root = json_load_file(e->path, 0, &err);
  assert_non_null(root);
  const char *key;
  json_t *entry, *found = NULL;
  json_object_foreach(root, key, entry) {
    if (strncmp(key, "cpu|nvme:", 9) == 0)
      found = entry;
  }
  assert_non_null(found);
  assert_true(json_is_number(json_object_get(found, "copy_duplex")));
  json_decref(root);
}

/* An entry for the set-up without an NVMe directory, every field but `omit` (NULL: none), in a
 * cache of `version`. */
static void write_entry_v(const char *path, const char *omit, int version) {
  json_t *e =
      json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f}", "flops", 1.5e11,
                "copy_in", 2.5e10, "copy_out", 3.5e10, "copy_duplex", 9.25e10, "copy_in_both",
                3.25e10, "copy_out_both", 5.75e10, "copy_local", 4.5e10, "nvme_read", 5.5e9,
                "nvme_write", 6.5e9, "nvme_duplex", 4.75e9, "adam", 7.5e8, "adam_home", 6.25e8);
  assert_non_null(e);
  if (omit)
    assert_int_equal(json_object_del(e, omit), 0);
  json_t *root = json_pack("{s:i, s:o}", "version", version, "cpu|nvme:-", e);
  assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
  json_decref(root);
}

static void write_entry(const char *path, const char *omit) { write_entry_v(path, omit, 5); }

/* Every field, copy_duplex included, comes from an entry for this set-up (no NVMe directory). */
static void test_read_entry(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/by-hand.json", e->dir);
  write_entry(e->path, NULL);
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  struct tz_plan_rates want = {.flops = 1.5e11,
                               .copy_in = 2.5e10,
                               .copy_out = 3.5e10,
                               .copy_duplex = 9.25e10,
                               .copy_in_both = 3.25e10,
                               .copy_out_both = 5.75e10,
                               .copy_local = 4.5e10,
                               .nvme_read = 5.5e9,
                               .nvme_write = 6.5e9,
                               .nvme_duplex = 4.75e9,
                               .adam = 7.5e8,
                               .adam_home = 6.25e8};
  assert_same(&r, &want); /* the rates beside the CPU's Adam 0: the entry has none */
}

/* Sets field `name` of the set-up without an NVMe directory in the cache at path to v. */
static void set_entry_field(const char *path, const char *name, double v) {
  json_error_t err;
  json_t *root = json_load_file(path, 0, &err);
  assert_non_null(root);
  json_object_set_new(json_object_get(root, "cpu|nvme:-"), name, json_real(v));
  assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
  json_decref(root);
}

/* The rates beside the CPU's Adam came after version 4's other fields: an entry without them
 * (every entry above) is used, they 0 (unknown); with them, they are read too. */
static void test_entry_with_beside_rates(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/beside.json", e->dir);
  write_entry(e->path, NULL);
  set_entry_field(e->path, "adam_home_busy", 3.25e8);
  set_entry_field(e->path, "copy_in_adam", 1.75e10);
  set_entry_field(e->path, "copy_out_adam", 2.25e10);
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops == 1.5e11); /* the entry's, not measured */
  assert_true(r.adam_home_busy == 3.25e8);
  assert_true(r.copy_in_adam == 1.75e10);
  assert_true(r.copy_out_adam == 2.25e10);
  /* a negative one is no rate: the entry is measured again */
  write_entry(e->path, NULL);
  set_entry_field(e->path, "copy_in_adam", -1);
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops != 1.5e11 && r.copy_in_adam == 0);
}

/* An entry written before copy_duplex existed is incomplete: the rates are measured again and
 * the entry rewritten with it. */
static void test_old_entry_remeasured(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/old.json", e->dir);
  write_entry(e->path, "copy_duplex");
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops > 0 && r.flops != 1.5e11);
  assert_true(r.copy_duplex == 0);
  assert_true(r.nvme_read == 0); /* no NVMe directory in this set-up */
  json_error_t err;
  json_t *root = json_load_file(e->path, 0, &err);
  assert_non_null(root);
  json_t *entry = json_object_get(root, "cpu|nvme:-");
  assert_true(json_is_number(json_object_get(entry, "copy_duplex")));
  assert_true(json_number_value(json_object_get(entry, "flops")) == r.flops);
  json_decref(root);
}

/* A cache of an older version (version 1: adam_home measured another way) is not used: measured
 * again and written as the current one. */
static void test_old_version_remeasured(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/v1.json", e->dir);
  write_entry_v(e->path, NULL, 1);
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops > 0 && r.flops != 1.5e11 && r.adam_home != 6.25e8);
  json_error_t err;
  json_t *root = json_load_file(e->path, 0, &err);
  assert_non_null(root);
  assert_int_equal(json_integer_value(json_object_get(root, "version")), 5);
  json_decref(root);
}

/* A cache of version 2 (the disk timed on 8 MiB, one direction at a time) is measured again, even
 * with nvme_duplex added by hand. */
static void test_version2_remeasured(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/v2.json", e->dir);
  write_entry_v(e->path, NULL, 2);
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops != 1.5e11 && r.nvme_duplex == 0); /* measured: no NVMe directory here */
}

/* An entry missing another field gives none of its values: the stale copy_duplex is not kept
 * beside the new measurement, which leaves it 0 on the cpu backend. */
static void test_incomplete_entry_unused(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/partial.json", e->dir);
  write_entry(e->path, "adam");
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.adam > 0 && r.adam != 7.5e8);
  assert_true(r.flops != 1.5e11);
  assert_true(r.copy_duplex == 0);
}

/* CPU Adam at the homes beside a GPU: tierzero.threads when set, else the CPUs this process may
 * run on but two (at least one). */
static void test_home_threads(void **state) {
  struct env *e = *state;
  cpu_set_t set;
  assert_int_equal(sched_getaffinity(0, sizeof set, &set), 0);
  int n = CPU_COUNT(&set);
  assert_int_equal(tz_rates_home_threads(&e->cfg), n > 3 ? n - 2 : 1);
  e->cfg.tierzero.threads = 3;
  assert_int_equal(tz_rates_home_threads(&e->cfg), 3);
}

static void test_cuda_backend(void **state) {
#ifdef TZ_HAVE_CUDA
  (void)state;
  skip(); /* measured by test_rates_cuda on a GPU */
#else
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/cuda.json", e->dir);
  struct tz_plan_rates r;
  assert_int_equal(tz_rates_get(&e->cfg, "cuda", e->rt, e->comm, e->path, 1, &r), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "CUDA"));
#endif
}

/* tz_rates_forget drops this set-up's entry only. */
static void test_forget(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/forget.json", e->dir);
  write_entry(e->path, NULL);
  json_error_t err;
  json_t *root = json_load_file(e->path, 0, &err);
  assert_non_null(root);
  json_object_set_new(root, "other|nvme:/elsewhere", json_object());
  /* the backend's layer timings go with it (the bound's compute term), another backend's stay */
  json_object_set_new(root, "layer|cpu|f32|threads 2|-|C 128|B 4 T 16", json_object());
  json_object_set_new(root, "layer|cuda NVIDIA H200|bf16|threads 1|-|C 128|B 4 T 16",
                      json_object());
  assert_int_equal(json_dump_file(root, e->path, 0), 0);
  size_t keys = json_object_size(root);
  json_decref(root);
  TZ_ASSERT_OK(tz_rates_forget(&e->cfg, "cpu", e->path));
  root = json_load_file(e->path, 0, &err);
  assert_non_null(root);
  assert_int_equal(json_object_size(root), keys - 2);
  assert_non_null(json_object_get(root, "other|nvme:/elsewhere"));
  assert_null(json_object_get(root, "layer|cpu|f32|threads 2|-|C 128|B 4 T 16"));
  assert_non_null(json_object_get(root, "layer|cuda NVIDIA H200|bf16|threads 1|-|C 128|B 4 T 16"));
  json_decref(root);
  /* Measured again: not the hand-written numbers. */
  struct tz_plan_rates r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.flops != 1.5e11);
  /* Nothing to forget: fine. */
  TZ_ASSERT_OK(tz_rates_forget(&e->cfg, "cpu", e->path));
  char missing[PATH_MAX];
  snprintf(missing, sizeof missing, "%s/none.json", e->dir);
  TZ_ASSERT_OK(tz_rates_forget(&e->cfg, "cpu", missing));
}

/* A run's rates (tz_rates_learn: the homes' and the disk's) join its set-up's entry, the other
 * fields and entries kept, and are read back; a rate not given keeps the one there; measuring
 * again drops them (the probes do not make them); with no entry for the set-up, or no rate,
 * nothing is written. */
static void test_learn(void **state) {
  struct env *e = *state;
  snprintf(e->path, sizeof e->path, "%s/learn.json", e->dir);
  TZ_ASSERT_OK(tz_rates_learn(&e->cfg, "cpu", e->path, 2.5e9, 3e9));
  assert_int_equal(access(e->path, F_OK), -1); /* no entry: no file made */
  write_entry(e->path, NULL);
  struct tz_plan_rates before, r;
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &before));
  assert_true(before.adam_home_run == 0 && before.nvme_run == 0);
  TZ_ASSERT_OK(tz_rates_learn(&e->cfg, "cpu", e->path, 2.5e9, 0));
  TZ_ASSERT_OK(tz_rates_learn(&e->cfg, "cpu", e->path, 0, 3e9)); /* the homes' kept */
  TZ_ASSERT_OK(tz_rates_learn(&e->cfg, "cpu", e->path, 0, 0));   /* nothing: both kept */
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.adam_home_run == 2.5e9);
  assert_true(r.nvme_run == 3e9);
  r.adam_home_run = 0;
  r.nvme_run = 0;
  r.collective = before.collective;
  assert_same(&r, &before);
  /* Another set-up's entry is not this one's. */
  TZ_ASSERT_OK(tz_rates_learn(&e->cfg, "cuda", e->path, 1e9, 1e9));
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.adam_home_run == 2.5e9 && r.nvme_run == 3e9);
  /* Measured again: the probes' entry has no run's rates. */
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 1, &r));
  assert_true(r.adam_home_run == 0 && r.nvme_run == 0 && r.flops != 1.5e11);
  TZ_ASSERT_OK(tz_rates_get(&e->cfg, "cpu", e->rt, e->comm, e->path, 0, &r));
  assert_true(r.adam_home_run == 0 && r.nvme_run == 0);
}

/* The layer probe (and its parts' forwards): a positive time at a real shape, no faster than the
 * matmul rate allows; a plan's probe that the matmul rate says would take longer than the budget is
 * not run (0, at once, with a warning naming --layer-rate). */
static void test_layer_probe(void **state) {
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("tiny", &mc));
  tz_compute *cm = NULL;
  TZ_ASSERT_OK(tz_compute_create("cpu", NULL, &cm));
  double s = 0;
  TZ_ASSERT_OK(tz_rates_layer_time(cm, &mc, 2, 16, 0, 0, &s, NULL));
  assert_true(s > 0);
  /* A budget the estimate fits: timed. */
  double part[3] = {0, 0, 0};
  TZ_ASSERT_OK(tz_rates_layer_time(cm, &mc, 2, 16, 60, 1e15, &s, part));
  assert_true(s > 0);
  /* Each part's forward alone: timed, positive. Not judged against the layer's time: on a loaded
   * machine the microseconds of a tiny layer's timings are noise (CI, 2026-12-05: outside a
   * factor of 100 of each other). */
  assert_true(part[0] > 0 && part[1] > 0 && part[2] > 0);
  /* A matmul rate that makes one pass last an hour: not timed, and said. */
  double flop = 4.0 * tz_model_layer_flop(&mc, 2, 16);
  /* stderr, where the warning goes, into a file for the while. */
  char log[PATH_MAX];
  snprintf(log, sizeof log, "%s/warn.txt", ((struct env *)*state)->dir);
  fflush(stderr);
  int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  assert_true(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  close(fd);
  int rc = tz_rates_layer_time(cm, &mc, 2, 16, TZ_RATES_PLAN_PROBE_S, flop / 3600, &s, NULL);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  TZ_ASSERT_OK(rc);
  static char said[4096];
  FILE *f = fopen(log, "r");
  assert_non_null(f);
  said[fread(said, 1, sizeof said - 1, f)] = 0;
  fclose(f);
  assert_true(s == 0); /* no pass ran */
  if (!strstr(said, "--layer-rate"))
    print_error("the warning: %s\n", said);
  assert_non_null(strstr(said, "--layer-rate"));
  tz_compute_destroy(cm);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_measure_and_cache, setup, teardown),
      cmocka_unit_test_setup_teardown(test_read_entry, setup, teardown),
      cmocka_unit_test_setup_teardown(test_old_entry_remeasured, setup, teardown),
      cmocka_unit_test_setup_teardown(test_incomplete_entry_unused, setup, teardown),
      cmocka_unit_test_setup_teardown(test_entry_with_beside_rates, setup, teardown),
      cmocka_unit_test_setup_teardown(test_old_version_remeasured, setup, teardown),
      cmocka_unit_test_setup_teardown(test_version2_remeasured, setup, teardown),
      cmocka_unit_test_setup_teardown(test_home_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_cuda_backend, setup, teardown),
      cmocka_unit_test_setup_teardown(test_forget, setup, teardown),
      cmocka_unit_test_setup_teardown(test_learn, setup, teardown),
      cmocka_unit_test_setup_teardown(test_layer_probe, setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
