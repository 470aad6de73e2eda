/* tz-bench tiers from the command line ($TZ_BIN/tz-bench): it exits 0 when it measured the tiers
 * this machine has (host<->nvme on a machine without a GPU included), and a --size below one queue
 * of the largest block is not raised without saying so. */
#define _GNU_SOURCE
#include "core/tier.h"
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char *dir;
static char bin[1024];

/* Runs tz-bench tiers with args on a directory of the test's; stdout goes to dir/out, stderr to
 * dir/err. Returns the exit status. */
static int bench_tiers(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "%s tiers --path %s --reps 1 %s > %s/out 2> %s/err", bin, dir, args,
           dir, dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *slurp(const char *name) {
  static char buf[2][1 << 15];
  static int k;
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *b = buf[k++ & 1];
  size_t n = fread(b, 1, sizeof buf[0] - 1, f);
  b[n] = 0;
  fclose(f);
  return b;
}

/* NVMe measured, whatever the GPU rows could do: status 0. */
static void test_tiers_exit_zero_when_nvme_measured(void **state) {
  (void)state;
  int rc = bench_tiers("--size 1M --min 256K --max 256K --qd 4");
  if (rc != 0)
    print_error("status %d\nstdout:\n%s\nstderr:\n%s\n", rc, slurp("out"), slurp("err"));
  assert_int_equal(rc, 0);
  assert_non_null(strstr(slurp("out"), "write"));
  assert_non_null(strstr(slurp("out"), "read"));
}

/* --size 1M with 4 blocks of 1 MiB in flight moves 4 MiB a run: said on stderr, and the header
 * gives the size used. */
static void test_tiers_size_raise_is_said(void **state) {
  (void)state;
  int rc = bench_tiers("--size 1M --min 1M --max 1M --qd 4");
  if (rc != 0)
    print_error("status %d\nstdout:\n%s\nstderr:\n%s\n", rc, slurp("out"), slurp("err"));
  assert_int_equal(rc, 0);
  const char *err = slurp("err");
  if (!strstr(err, "--size") || !strstr(err, "4 MiB"))
    print_error("stderr does not say that --size was raised to 4 MiB:\n%s\n", err);
  assert_non_null(strstr(err, "--size"));
  assert_non_null(strstr(err, "4 MiB"));
  assert_non_null(strstr(slurp("out"), "4 MiB per run"));
}

int main(void) {
  const char *b = getenv("TZ_BIN");
  if (!b)
    tz_test_skip("TZ_BIN is not set (run through ctest)");
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  snprintf(bin, sizeof bin, "%s/tz-bench", b);
  dir = tz_test_mkdtemp("bench-tiers");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiers_exit_zero_when_nvme_measured),
      cmocka_unit_test(test_tiers_size_raise_is_said),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
