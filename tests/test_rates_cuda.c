/* The machine rates on the cuda backend: every rate the GPU machine has is measured, positive and
 * finite (none is judged against another: that would judge timing), and the entry is cached and
 * read back with the same bits. Skips (77) without a GPU. */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/runtime.h"
#include "kernels/compute.h"
#include "testlib.h"
#include "trainer/step/rates.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static void test_cuda_rates(void **state) {
  (void)state;
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  tz_runtime *rt = NULL;
  tz_comm *comm = NULL;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt));
  TZ_ASSERT_OK(tz_comm_create("single", &bs, NULL, &comm));
  char *dir = tz_test_mkdtemp("rates-cuda");
  char path[4096];
  snprintf(path, sizeof path, "%s/rates.json", dir);

  struct tz_plan_rates r, again;
  TZ_ASSERT_OK(tz_rates_get(&cfg, "cuda", rt, comm, path, 1, &r));
  print_message("copy_in %.1f GB/s, copy_out %.1f GB/s, copy_duplex %.1f GB/s, copy_local "
                "%.1f GB/s, flops %.1f TFLOP/s, adam %.2f G elements/s (CPU at the homes %.2f)\n",
                r.copy_in / 1e9, r.copy_out / 1e9, r.copy_duplex / 1e9, r.copy_local / 1e9,
                r.flops / 1e12, r.adam / 1e9, r.adam_home / 1e9);
  assert_true(r.copy_in > 0);
  assert_true(r.copy_out > 0);
  assert_true(r.copy_duplex > 0);
  assert_true(r.copy_local > 0);
  assert_true(r.flops > 0);
  assert_true(r.adam > 0);
  assert_true(r.adam_home > 0); /* CPU Adam, for home phases */
  /* Measured, not judged: no rate is compared with another. Each is a timing of the moment, and
   * on a loaded machine the order of two of them is noise (the H100 machine, 2026-12-05: the
   * link in beside the CPU's Adam 46.2 GB/s, beside the link out alone 35.4, which the 1.1 this
   * asserted between them failed; the CPU's Adam beside the copies faster than alone before).
   * The plan takes what it is given, and docs/benchmarks.md has the figures. */
  print_message("copy_in_both %.1f GB/s, copy_out_both %.1f GB/s\n", r.copy_in_both / 1e9,
                r.copy_out_both / 1e9);
  print_message("beside each other: CPU Adam %.2f G elements/s (alone %.2f), link in %.1f, out "
                "%.1f GB/s\n",
                r.adam_home_busy / 1e9, r.adam_home / 1e9, r.copy_in_adam / 1e9,
                r.copy_out_adam / 1e9);
  const double measured[] = {r.copy_duplex,    r.copy_in_both, r.copy_out_both,
                             r.adam_home_busy, r.copy_in_adam, r.copy_out_adam};
  for (size_t i = 0; i < sizeof measured / sizeof *measured; i++)
    assert_true(measured[i] > 0 && isfinite(measured[i]));

  TZ_ASSERT_OK(tz_rates_get(&cfg, "cuda", rt, comm, path, 0, &again));
  assert_true(again.copy_duplex == r.copy_duplex);
  assert_true(again.copy_in == r.copy_in);
  assert_true(again.copy_in_both == r.copy_in_both && again.copy_out_both == r.copy_out_both);
  assert_true(again.adam_home_busy == r.adam_home_busy && again.copy_in_adam == r.copy_in_adam);
  assert_true(again.flops == r.flops);
  assert_true(again.adam == r.adam);

  tz_test_rmdir(dir);
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  tz_config_free(&cfg);
}

int main(void) {
  char why[256] = "";
  if (tz_compute_probe("cuda", why, sizeof why) < 0)
    tz_test_skip("no CUDA device (%s)", why);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cuda_rates),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
