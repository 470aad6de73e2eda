/* tz-train from the command line ($TZ_BIN/tz-train): a short run writes one JSON object per step
 * with its step and loss, and the loss falls; --plan prints the placement and the bound without
 * training; a compute budget below the minimum is refused with the missing amount; bad flags are
 * usage errors. */
#define _GNU_SOURCE
#include "testlib.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char *dir;
static char bin[1024];

/* Runs tz-train with args; its output goes to dir/out. Returns the exit status. */
static int tz_train(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s %s > %s/out 2>&1", dir,
           bin, args, dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *output(void) {
  char path[1100];
  snprintf(path, sizeof path, "%s/out", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void write_config(const char *name, const char *json) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(json, f);
  fclose(f);
}

static void test_run(void **state) {
  (void)state;
  write_config("ds.json",
               "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"
               " \"gradient_clipping\": 1.0,\n"
               " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},\n"
               " \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\"},\n"
               "   \"offload_optimizer\": {\"device\": \"cpu\"}}}\n");
  char args[2048];
  snprintf(args, sizeof args,
           "--config %s/ds.json --model tiny --steps 8 --seed 3 --seq 32 "
           "--data synthetic --metrics %s/m.jsonl",
           dir, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 8/8"));
  char path[1100];
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int n = 0;
  double first = 0, last = 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    assert_non_null(o);
    if (json_is_true(json_object_get(o, "summary"))) {
      json_decref(o);
      continue;
    }
    assert_int_equal(json_integer_value(json_object_get(o, "step")), n + 1);
    json_t *loss = json_object_get(o, "loss");
    assert_true(json_is_number(loss));
    assert_true(json_is_number(json_object_get(o, "step_s")));
    assert_true(json_is_number(json_object_get(o, "bound_s")));
    assert_true(json_is_number(json_object_get(o, "stall_s")));
    if (n == 0)
      first = json_number_value(loss);
    last = json_number_value(loss);
    json_decref(o);
    n++;
  }
  fclose(f);
  assert_int_equal(n, 8);
  assert_true(last < first);
}

/* The built-in corpus, the default data. */
static void test_corpus(void **state) {
  (void)state;
  int rc = tz_train("--model tiny --steps 2 --seq 32");
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 2/2"));
  assert_non_null(strstr(output(), "data: "));
}

static void test_plan(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --plan --auto-placement --set tierzero.hbm_budget=24MiB "
           "--set tierzero.host_budget=4MiB --set tierzero.nvme_path=%s",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  const char *out = output();
  assert_non_null(strstr(out, "bound"));
  assert_non_null(strstr(out, "layer3"));
  assert_null(strstr(out, "step 1/"));
  assert_int_equal(tz_train("--model tiny --plan --set tierzero.hbm_budget=3MiB"), 1);
  assert_non_null(strstr(output(), "short of the minimum"));
  assert_int_equal(tz_train("--steps -1"), 2);
  assert_int_equal(tz_train("--optimizer-step sideways"), 2);
  assert_int_equal(tz_train("--model tiny --steps 1 --set gradient_clipping=1 "
                            "--optimizer-step overlapped"),
                   1);
  assert_non_null(strstr(output(), "gradient_clipping"));
}

/* A read of the optimizer state from NVMe fails, or returns a flipped bit: the run stops with the
 * error, naming the block, instead of hanging or training on bad data. */
static void test_faults(void **state) {
  (void)state;
  /* Creation writes the 18 nvme blocks (master, m, v of 6 model blocks) through the fault tier
   * first; the 20th operation is one of the first step's. */
  const char *specs[] = {"eio@20", "flip@20"};
  const char *says[] = {"failed", "checksum"};
  for (int i = 0; i < 2; i++) {
    char args[2048];
    snprintf(args, sizeof args,
             "--model tiny --steps 3 --seq 16 --data synthetic "
             "--set zero_optimization.offload_optimizer.device=nvme "
             "--set tierzero.nvme_path=%s --set tierzero.nvme_buffered=true "
             "--set tierzero.faults=%s",
             dir, specs[i]);
    int rc = tz_train(args);
    const char *out = output();
    if (rc != 1 || !strstr(out, says[i]) || !strstr(out, "block '"))
      print_error("%s: exit %d\n%s", specs[i], rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, says[i]));
    assert_non_null(strstr(out, "block '"));
  }
}

int main(void) {
  const char *b = getenv("TZ_BIN");
  if (!b)
    tz_test_skip("TZ_BIN is not set (run through ctest)");
  snprintf(bin, sizeof bin, "%s/tz-train", b);
  dir = tz_test_mkdtemp("train-cli");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run),
      cmocka_unit_test(test_corpus),
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_faults),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
