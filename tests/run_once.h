/* tz_run in a world of one, with the configuration tz-train would make from o and the --set
 * lines sets[0..n_sets): the sequence tz-train's main follows, for the tests that run the trainer
 * end to end. Returns tz_run's code; tz_err_msg() says why when it fails. */
#ifndef TZ_TESTS_RUN_ONCE_H
#define TZ_TESTS_RUN_ONCE_H

#include "collectives/launch.h"
#include "testlib.h"
#include "trainer/run/run.h"

static inline int tz_test_run_once(struct tz_run_options *o, const char *const *sets, int n_sets,
                                   struct tz_run_result *res) {
  struct tz_run_sources src = {.sets = sets, .n_sets = n_sets};
  TZ_ASSERT_OK(tz_run_options_check(o, 1));
  struct tz_config cfg;
  TZ_ASSERT_OK(tz_run_config(o, &src, 1, &cfg));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_run_world w;
  TZ_ASSERT_OK(tz_run_world_open(&bs, &cfg, &w));
  int rc = tz_run(o, &cfg, w.comm, w.rt, res);
  tz_run_world_close(&w);
  tz_config_free(&cfg);
  return rc;
}

#endif
