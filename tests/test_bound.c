/* The bound (docs/training.md "The bound"; issue #27 item 11), from the command line:
 *  - tz-train --plan --model llama-7b answers in seconds on a CPU machine, where timing its layer
 *    would take a minute: the probe is not run, the output says so and points to --layer-rate,
 *    and the plan still prints a bound (costed at the matmul rate);
 *  - with --layer-rate the plan uses that rate and says nothing about a probe;
 *  - a short run prints its step time against the bound as a ratio of at least 1, or says it came
 *    in under the bound, never a ratio below 1. */
#define _GNU_SOURCE
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "util/clock.h"

static char *dir;
static const char *bin;

static int tz_train(const char *args, char **out) {
  char *cmd = NULL;
  assert_true(asprintf(&cmd,
                       "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s/tz-train --backend cpu %s > "
                       "%s/out 2>&1",
                       dir, bin, args, dir) > 0);
  int st = system(cmd);
  free(cmd);
  char path[1100];
  snprintf(path, sizeof path, "%s/out", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[1 << 17];
  buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
  fclose(f);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_plan_answers_in_seconds(void **state) {
  (void)state;
  char *out;
  /* The rates are measured (and cached) first, so that the timed run only plans. */
  assert_int_equal(tz_train("--model tiny --plan", &out), 0);
  double t0 = tz_now_s();
  /* The budget given: this machine need not hold llama-7b for its plan to be made (the check
   * against the machine's memory only warns then). */
  int rc = tz_train("--model llama-7b --plan --set tierzero.host_budget=200GiB", &out);
  double took = tz_now_s() - t0;
  if (rc != 0)
    print_error("%s\n", out);
  assert_int_equal(rc, 0);
  if (took > 15)
    print_error("--plan took %.1f s:\n%s\n", took, out);
  assert_true(took < 15);
  assert_non_null(strstr(out, "--layer-rate"));
  assert_non_null(strstr(out, "not timed"));
  assert_non_null(strstr(out, "bound "));
  /* --layer-rate: no probe, nothing said about one. */
  assert_int_equal(
      tz_train("--model llama-7b --plan --layer-rate 0.001 --set tierzero.host_budget=200GiB",
               &out),
      0);
  assert_null(strstr(out, "not timed"));
  assert_non_null(strstr(out, "bound "));
}

static void test_no_ratio_below_one(void **state) {
  (void)state;
  char *out;
  int rc = tz_train("--model tiny --steps 4 --seq 16 --data synthetic", &out);
  if (rc != 0)
    print_error("%s\n", out);
  assert_int_equal(rc, 0);
  const char *ratio = strstr(out, "x the bound");
  if (ratio) {
    const char *p = ratio;
    while (p > out && p[-1] != ' ')
      p--;
    double r = atof(p);
    if (r < 1)
      print_error("a ratio below 1: %.40s\n", p);
    assert_true(r >= 1);
  } else {
    assert_non_null(strstr(out, "under the plan's"));
  }
}

int main(void) {
  bin = getenv("TZ_BIN");
  if (!bin)
    tz_test_skip("TZ_BIN is not set (ctest sets it to the build's bin directory)");
  dir = tz_test_mkdtemp("bound");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_answers_in_seconds),
      cmocka_unit_test(test_no_ratio_below_one),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
