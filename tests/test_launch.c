/* Launch and bootstrap: detection from each launcher's variables, the TCP rendezvous on loopback
 * (threads as ranks), and tz_launch_run starting copies of this program as workers: their
 * environment, the relayed blobs, CPU binding, and a dying or failing worker ending the others
 * with a message that names it. */
#define _GNU_SOURCE
#include "collectives/launch.h"
#include "core/error.h"
#include "testlib.h"
#include "util/clock.h"

#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static char *self_path;

static const char *const launch_vars[] = {"TZ_RANK",
                                          "TZ_WORLD_SIZE",
                                          "TZ_LOCAL_RANK",
                                          "TZ_LOCAL_WORLD_SIZE",
                                          "TZ_BOOTSTRAP_FDS",
                                          "RANK",
                                          "WORLD_SIZE",
                                          "LOCAL_RANK",
                                          "LOCAL_WORLD_SIZE",
                                          "MASTER_ADDR",
                                          "MASTER_PORT",
                                          "TZ_MASTER_PORT",
                                          "TORCHELASTIC_USE_AGENT_STORE",
                                          "OMPI_COMM_WORLD_RANK",
                                          "OMPI_COMM_WORLD_SIZE",
                                          "OMPI_COMM_WORLD_LOCAL_RANK",
                                          "OMPI_COMM_WORLD_LOCAL_SIZE",
                                          "PMI_RANK",
                                          "PMI_SIZE",
                                          "MPI_LOCALRANKID",
                                          "MPI_LOCALNRANKS",
                                          "SLURM_PROCID",
                                          "SLURM_NTASKS",
                                          "SLURM_LOCALID",
                                          "SLURM_STEP_ID",
                                          "SLURM_STEPID",
                                          "SLURM_STEP_NUM_TASKS",
                                          "SLURM_STEP_TASKS_PER_NODE",
                                          "SLURM_NTASKS_PER_NODE",
                                          "SLURM_STEP_NODELIST",
                                          "SLURM_JOB_NODELIST",
                                          "SLURM_NODELIST",
                                          "SLURM_JOB_ID",
                                          "TZ_COMM_TIMEOUT"};

static void clear_env(void) {
  for (size_t i = 0; i < sizeof launch_vars / sizeof *launch_vars; i++)
    unsetenv(launch_vars[i]);
}

/* ---- Detection ---- */

static void test_detect_single(void **state) {
  (void)state;
  clear_env();
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_SINGLE);
  assert_int_equal(bs.rank, 0);
  assert_int_equal(bs.size, 1);
  assert_int_equal(bs.local_size, 1);
  assert_true(tz_bootstrap_has_channel(&bs));
  char blob[8] = "abc";
  TZ_ASSERT_OK(tz_bootstrap_bcast(&bs, blob, sizeof blob));
}

static void test_detect_torchrun(void **state) {
  (void)state;
  clear_env();
  setenv("RANK", "5", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "node7", 1);
  setenv("MASTER_PORT", "29500", 1);
  setenv("TZ_COMM_TIMEOUT", "12.5", 1);
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_TORCHRUN);
  assert_int_equal(bs.rank, 5);
  assert_int_equal(bs.size, 8);
  assert_int_equal(bs.local_rank, 1);
  assert_int_equal(bs.local_size, 4);
  assert_string_equal(bs.master_addr, "node7");
  assert_int_equal(bs.master_port, 29500);
  assert_true(bs.timeout_s == 12.5);
  assert_true(tz_bootstrap_has_channel(&bs));
  /* An agent that keeps its store on MASTER_PORT: ours is the next port; TZ_MASTER_PORT wins. */
  setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.master_port, 29501);
  setenv("TZ_MASTER_PORT", "40000", 1);
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.master_port, 40000);
  /* Bad values are named. */
  setenv("RANK", "8", 1);
  assert_int_equal(tz_bootstrap_detect(&bs), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "rank 8"));
  setenv("RANK", "x1", 1);
  assert_int_equal(tz_bootstrap_detect(&bs), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "RANK=x1"));
  unsetenv("WORLD_SIZE");
  setenv("RANK", "1", 1);
  assert_int_equal(tz_bootstrap_detect(&bs), TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "WORLD_SIZE"));
  clear_env();
}

static void test_detect_mpirun(void **state) {
  (void)state;
  clear_env();
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  struct tz_bootstrap bs;
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_MPIRUN);
  assert_int_equal(bs.rank, 3);
  assert_int_equal(bs.size, 4);
  assert_int_equal(bs.local_rank, 1);
  assert_int_equal(bs.local_size, 2);
  /* No TCP address and no MPI bridge: a broadcast has no way to go. */
  assert_false(tz_bootstrap_has_channel(&bs));
  char blob[4];
  assert_int_equal(tz_bootstrap_bcast(&bs, blob, sizeof blob), TZ_ENOTSUP);
  assert_non_null(strstr(tz_err_msg(), "MASTER_ADDR"));
  /* The torchrun variables take precedence over mpirun's. */
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "1", 1);
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_TORCHRUN);
  clear_env();
}

static void test_detect_slurm(void **state) {
  (void)state;
  clear_env();
  setenv("SLURM_PROCID", "6", 1);
  setenv("SLURM_NTASKS", "8", 1);
  setenv("SLURM_LOCALID", "2", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
  setenv("SLURM_JOB_NODELIST", "gpu[03-04,9],cpu1", 1);
  setenv("SLURM_JOB_ID", "123456", 1);
  struct tz_bootstrap bs;
  /* A batch script has the variables too, but is no step: not a world of 8. */
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_SINGLE);
  setenv("SLURM_STEP_ID", "0", 1);
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_int_equal(bs.kind, TZ_LAUNCH_SLURM);
  assert_int_equal(bs.rank, 6);
  assert_int_equal(bs.size, 8);
  assert_int_equal(bs.local_rank, 2);
  assert_int_equal(bs.local_size, 4);
  assert_string_equal(bs.master_addr, "gpu03");
  assert_int_equal(bs.master_port, 20000 + 123456 % 20000);
  setenv("MASTER_ADDR", "head", 1);
  setenv("MASTER_PORT", "1234", 1);
  TZ_ASSERT_OK(tz_bootstrap_detect(&bs));
  assert_string_equal(bs.master_addr, "head");
  assert_int_equal(bs.master_port, 1234);
  clear_env();
}

/* ---- TCP rendezvous, ranks as threads ---- */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
      getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

struct tcp_rank {
  struct tz_bootstrap bs;
  int rc[3];
  char got[3][64];
};

static void *tcp_rank_main(void *arg) {
  struct tcp_rank *r = arg;
  for (int round = 0; round < 3; round++) {
    char blob[64];
    memset(blob, 0, sizeof blob);
    if (r->bs.rank == 0)
      snprintf(blob, sizeof blob, "round %d from rank 0", round);
    /* Rank 2 starts late: the others must wait for it, and it for rank 0's listener. */
    if (r->bs.rank == 2 && round == 0)
      usleep(300000);
    r->rc[round] = tz_bootstrap_bcast(&r->bs, blob, sizeof blob);
    memcpy(r->got[round], blob, sizeof blob);
  }
  return NULL;
}

static void test_tcp_bcast(void **state) {
  (void)state;
  int port = free_port();
  assert_true(port > 0);
  enum { P = 4 };
  struct tcp_rank ranks[P];
  pthread_t th[P];
  for (int i = 0; i < P; i++) {
    memset(&ranks[i], 0, sizeof ranks[i]);
    tz_bootstrap_single(&ranks[i].bs);
    ranks[i].bs.kind = TZ_LAUNCH_TORCHRUN;
    ranks[i].bs.rank = i;
    ranks[i].bs.size = P;
    ranks[i].bs.timeout_s = 20;
    strcpy(ranks[i].bs.master_addr, "127.0.0.1");
    ranks[i].bs.master_port = port;
  }
  for (int i = P - 1; i >= 0; i--) /* rank 0 last: the others retry until it listens */
    pthread_create(&th[i], NULL, tcp_rank_main, &ranks[i]);
  for (int i = 0; i < P; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < P; i++)
    for (int round = 0; round < 3; round++) {
      char want[64];
      snprintf(want, sizeof want, "round %d from rank 0", round);
      if (ranks[i].rc[round])
        print_error("rank %d round %d: %d\n", i, round, ranks[i].rc[round]);
      assert_int_equal(ranks[i].rc[round], 0);
      assert_string_equal(ranks[i].got[round], want);
    }
}

static void test_tcp_missing_ranks_named(void **state) {
  (void)state;
  int port = free_port();
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  bs.kind = TZ_LAUNCH_TORCHRUN;
  bs.size = 3;
  bs.timeout_s = 0.5;
  strcpy(bs.master_addr, "127.0.0.1");
  bs.master_port = port;
  char blob[16] = "x";
  double t0 = tz_now_s();
  assert_int_equal(tz_bootstrap_bcast(&bs, blob, sizeof blob), TZ_ETIMEDOUT);
  assert_true(tz_now_s() - t0 < 5);
  assert_non_null(strstr(tz_err_msg(), "missing: 1 2"));
  /* A rank whose rank 0 never comes says where it looked. */
  bs.rank = 1;
  assert_int_equal(tz_bootstrap_bcast(&bs, blob, sizeof blob), TZ_ETIMEDOUT);
  assert_non_null(strstr(tz_err_msg(), "127.0.0.1"));
  assert_int_equal(tz_bootstrap_bcast(&bs, blob, TZ_BOOTSTRAP_MAX_BLOB + 1), TZ_EINVAL);
}

/* ---- Workers: this program, re-executed by tz_launch_run ---- */

static int worker(const char *mode) {
  struct tz_bootstrap bs;
  if (tz_bootstrap_detect(&bs) < 0) {
    fprintf(stderr, "worker: %s\n", tz_err_msg());
    return 10;
  }
  const char *nvls = getenv("NCCL_NVLS_ENABLE");
  if (bs.kind != TZ_LAUNCH_NPROC || bs.local_rank != bs.rank || bs.local_size != bs.size ||
      bs.fd_from_parent < 0 || !nvls || strcmp(nvls, "0") != 0) {
    fprintf(stderr, "worker %d: wrong environment (kind %s)\n", bs.rank,
            tz_launch_kind_name(bs.kind));
    return 11;
  }
  for (int round = 0; round < 3; round++) {
    char blob[40] = "";
    if (bs.rank == 0)
      snprintf(blob, sizeof blob, "blob %d of %d", round, bs.size);
    if (tz_bootstrap_bcast(&bs, blob, sizeof blob) < 0) {
      fprintf(stderr, "worker %d: %s\n", bs.rank, tz_err_msg());
      return 12;
    }
    char want[40];
    snprintf(want, sizeof want, "blob %d of %d", round, bs.size);
    if (strcmp(blob, want) != 0) {
      fprintf(stderr, "worker %d: got '%s', want '%s'\n", bs.rank, blob, want);
      return 13;
    }
  }
  if (strcmp(mode, "worker-cpu0") == 0) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) < 0 || CPU_COUNT(&set) != 1 || !CPU_ISSET(0, &set))
      return 14;
  }
  if (strcmp(mode, "worker-kill") == 0) {
    if (bs.rank == 1)
      raise(SIGKILL);
    sleep(60); /* the others would wait for rank 1 */
  }
  if (strcmp(mode, "worker-status") == 0 && bs.rank == 2)
    return 3;
  if (strcmp(mode, "worker-status") == 0)
    sleep(60);
  if (strcmp(mode, "worker-stubborn") == 0) {
    if (bs.rank == 0) {
      signal(SIGTERM, SIG_IGN);
      sleep(60);
    }
    return bs.rank == 1 ? 1 : 0;
  }
  return 0;
}

static int run_workers(const char *mode, int n, double grace, const char *const *cpulists,
                       struct tz_launch_result *res, double *seconds) {
  char *argv[] = {self_path, (char *)mode, NULL};
  struct tz_launch_params lp;
  tz_launch_params_init(&lp);
  lp.nproc = n;
  lp.grace_s = grace;
  lp.cpulists = cpulists;
  double t0 = tz_now_s();
  int rc = tz_launch_run(&lp, 2, argv, res);
  *seconds = tz_now_s() - t0;
  return rc;
}

static void test_nproc_ok(void **state) {
  (void)state;
  struct tz_launch_result res;
  double s;
  TZ_ASSERT_OK(run_workers("worker-ok", 3, 5, NULL, &res, &s));
  assert_int_equal(res.failed_rank, -1);
  assert_int_equal(res.exit_code, 0);
  const char *cpus[] = {"0", "0"};
  TZ_ASSERT_OK(run_workers("worker-cpu0", 2, 5, cpus, &res, &s));
  const char *bad[] = {"0", "seven"};
  assert_int_equal(run_workers("worker-cpu0", 2, 5, bad, &res, &s), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "seven"));
}

static void test_nproc_killed_rank_ends_the_others(void **state) {
  (void)state;
  struct tz_launch_result res;
  double s;
  assert_int_equal(run_workers("worker-kill", 3, 5, NULL, &res, &s), TZ_ECOMM);
  assert_non_null(strstr(tz_err_msg(), "rank 1 died (signal 9"));
  assert_int_equal(res.failed_rank, 1);
  assert_int_equal(res.signal, SIGKILL);
  assert_int_equal(res.exit_code, 128 + SIGKILL);
  assert_true(s < 10); /* not the 60 s the others would sleep */
}

static void test_nproc_exit_status(void **state) {
  (void)state;
  struct tz_launch_result res;
  double s;
  assert_int_equal(run_workers("worker-status", 4, 5, NULL, &res, &s), TZ_ECOMM);
  assert_non_null(strstr(tz_err_msg(), "rank 2 exited with status 3"));
  assert_int_equal(res.failed_rank, 2);
  assert_int_equal(res.exit_status, 3);
  assert_int_equal(res.exit_code, 3);
  assert_true(s < 10);
}

static void test_nproc_sigkill_after_grace(void **state) {
  (void)state;
  struct tz_launch_result res;
  double s;
  assert_int_equal(run_workers("worker-stubborn", 2, 0.5, NULL, &res, &s), TZ_ECOMM);
  assert_int_equal(res.failed_rank, 1);
  assert_int_equal(res.exit_status, 1);
  assert_true(s < 10);
}

int main(int argc, char **argv) {
  if (tz_launch_is_worker())
    return worker(argc > 1 ? argv[1] : "worker-ok");
  self_path = argv[0];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect_single),
      cmocka_unit_test(test_detect_torchrun),
      cmocka_unit_test(test_detect_mpirun),
      cmocka_unit_test(test_detect_slurm),
      cmocka_unit_test(test_tcp_bcast),
      cmocka_unit_test(test_tcp_missing_ranks_named),
      cmocka_unit_test(test_nproc_ok),
      cmocka_unit_test(test_nproc_killed_rank_ends_the_others),
      cmocka_unit_test(test_nproc_exit_status),
      cmocka_unit_test(test_nproc_sigkill_after_grace),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
