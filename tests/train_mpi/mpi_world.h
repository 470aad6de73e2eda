/* What the trainer's tests under mpirun share: the world of P ranks (the mpi comm over one
 * runtime, made and destroyed as the cmocka group's setup and teardown), a watchdog that ends a
 * hung rank, and the same options run in a world of one accumulating P times as many
 * micro-batches, which the P ranks' run must equal. */
#ifndef TZ_TEST_MPI_WORLD_H
#define TZ_TEST_MPI_WORLD_H

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "core/error.h"
#include "core/runtime.h"
#include "testlib.h"
#include "train_cases.h"

static tz_runtime *rt;
static tz_comm *comm;
static int P, me;
static char mw_hang[96]; /* the watchdog's message, made before it is armed */

static void mw_watchdog(int sig) {
  (void)sig;
  ssize_t r = write(2, mw_hang, strlen(mw_hang));
  (void)r;
  _exit(1);
}

/* Ends the process, saying which test program hung, after seconds. */
static inline void mw_watchdog_arm(const char *prog, unsigned seconds) {
  snprintf(mw_hang, sizeof mw_hang, "%s: a test hung for %u s (watchdog)\n", prog, seconds);
  signal(SIGALRM, mw_watchdog);
  alarm(seconds);
}

static int mw_setup(void **state) {
  (void)state;
  struct tz_bootstrap bs;
  if (tz_bootstrap_detect(&bs) < 0 || tz_runtime_create(NULL, &rt) < 0)
    return -1;
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = tz_runtime_progress(rt);
  if (tz_comm_create("mpi", &bs, &p, &comm) < 0) {
    fprintf(stderr, "rank %d: %s\n", bs.rank, tz_err_msg());
    return -1;
  }
  P = tz_comm_size(comm);
  me = tz_comm_rank(comm);
  return 0;
}

static int mw_teardown(void **state) {
  (void)state;
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  return 0;
}

/* The same options in a world of one (its own runtime and "single" comm), accumulating P times
 * as many micro-batches. */
static inline void mw_run_single(struct tc_opts o, struct tc_result *r) {
  tz_runtime *rt1;
  tz_comm *c1;
  TZ_ASSERT_OK(tz_runtime_create(NULL, &rt1));
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.progress = tz_runtime_progress(rt1);
  TZ_ASSERT_OK(tz_comm_create("single", &bs, &p, &c1));
  o.accum *= P;
  TZ_ASSERT_OK(tc_run(&o, c1, rt1, r));
  tz_comm_destroy(c1);
  tz_runtime_destroy(rt1);
}

#endif
