/* The nccl backend on two GPUs of one machine: the collectives of tests/mpi against the serial
 * reference, in two launches (tz_launch_run --nproc style, and torchrun-style variables with a
 * TCP rendezvous on loopback), and the two ways a job must end (a killed rank; a rank that never
 * joins, caught by the watchdog, which aborts the communicator).
 *
 * With two ranks every order of summation is the same single addition, so fp32 results are
 * bit-identical to the reference whatever algorithm NCCL picks; bf16 and f16 payloads summed in
 * fp32 go through the backend's own rank-order sum and are bit-identical at any world size.
 *
 * Host buffers work too, through a device copy (the control plane's small exchanges).
 *
 * argv[1] picks the case (ctest runs each as its own entry): nproc, torchrun, killed, hung.
 * Workers are this program again, with argv[1] = worker-suite / worker-kill / worker-hang. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collectives/comm.h"
#include "comm_ref.h"
#include "core/error.h"
#include "testlib.h"
#include "util/clock.h"

static char *self_path;

/* ---- Workers ---- */

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "rank %d: %s:%d: ", me, __FILE__, __LINE__);                                 \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fprintf(stderr, "\n");                                                                       \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)
#define CHECK_OK(call) CHECK((call) == 0, "%s: %s", #call, tz_err_msg())
#define CHECK_CUDA(call) CHECK((call) == cudaSuccess, "%s failed", #call)

static int me, P;

/* The comm's stream does not wait for the legacy default stream, and a copy from pageable memory
 * may still be in flight when cudaMemcpy returns: inputs are made complete before a collective. */
static cudaError_t to_dev(void *dst, const void *src, size_t n) {
  cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
  return e == cudaSuccess ? cudaDeviceSynchronize() : e;
}

static int wait_fence(tz_fence *f) {
  int rc = tz_fence_wait(f, 120ll * 1000000000ll);
  tz_fence_release(f);
  return rc;
}

/* 16-bit results of a native-dtype sum: NCCL may round once from the exact sum where the
 * reference rounds fp32 first, so allow one unit in the last place. */
static long diff_beyond_ulp(const uint16_t *a, const uint16_t *b, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int d = (int)a[i] - (int)b[i];
    if (d > 1 || d < -1)
      return (long)i;
  }
  return -1;
}

static int check_reductions(tz_comm *c, int native) {
  const size_t counts[] = {1, 3, 1001, 65537, (1u << 20) + 7};
  for (int dti = 0; dti < 3; dti++) {
    enum tz_dtype dt = (enum tz_dtype)dti;
    if (native && dt == TZ_F16)
      continue; /* the native comm is configured for bf16 */
    size_t es = ref_esize(dt);
    for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
      size_t n = counts[ci];
      void *all[8];
      for (int q = 0; q < P; q++) {
        all[q] = malloc((size_t)P * n * es);
        ref_fill(all[q], (size_t)P * n, dt, (uint64_t)(dti * 100 + ci) * 10 + (uint64_t)q);
      }
      char *ref = malloc((size_t)P * n * es), *got = malloc((size_t)P * n * es);
      void *dsend, *drecv;
      CHECK_CUDA(cudaMalloc(&dsend, (size_t)P * n * es));
      CHECK_CUDA(cudaMalloc(&drecv, (size_t)P * n * es));
      CHECK_CUDA(to_dev(dsend, all[me], (size_t)P * n * es));
      tz_fence *f;
      CHECK_OK(tz_comm_reduce_scatter(c, dsend, drecv, n, dt, NULL, &f));
      CHECK_OK(wait_fence(f));
      CHECK_CUDA(cudaMemcpy(got, drecv, n * es, cudaMemcpyDeviceToHost));
      ref_sum(ref, all, (size_t)me * n, n, P, dt, !native || dt == TZ_F32);
      long d = native && dt != TZ_F32 ? diff_beyond_ulp((uint16_t *)got, (uint16_t *)ref, n)
                                      : ref_first_diff(got, ref, n, es);
      CHECK(d < 0, "reduce_scatter dt %d n %zu native %d: first difference at %ld", dti, n, native,
            d);
      /* All-reduce, in place. */
      CHECK_CUDA(to_dev(drecv, all[me], n * es));
      CHECK_OK(tz_comm_all_reduce(c, drecv, drecv, n, dt, NULL, &f));
      CHECK_OK(wait_fence(f));
      CHECK_CUDA(cudaMemcpy(got, drecv, n * es, cudaMemcpyDeviceToHost));
      ref_sum(ref, all, 0, n, P, dt, !native || dt == TZ_F32);
      d = native && dt != TZ_F32 ? diff_beyond_ulp((uint16_t *)got, (uint16_t *)ref, n)
                                 : ref_first_diff(got, ref, n, es);
      CHECK(d < 0, "all_reduce dt %d n %zu native %d: first difference at %ld", dti, n, native, d);
      cudaFree(dsend);
      cudaFree(drecv);
      for (int q = 0; q < P; q++)
        free(all[q]);
      free(ref);
      free(got);
    }
  }
  return 0;
}

struct delayed {
  tz_fence *f;
};

static void *signal_later(void *arg) {
  usleep(100000);
  tz_fence_signal(((struct delayed *)arg)->f, 0);
  return NULL;
}

static int worker_suite(void) {
  struct tz_bootstrap bs;
  CHECK_OK(tz_bootstrap_detect(&bs));
  me = bs.rank;
  tz_comm *c;
  CHECK_OK(tz_comm_create("nccl", &bs, NULL, &c));
  P = tz_comm_size(c);
  CHECK(P == 2 && tz_comm_rank(c) == me, "world %d rank %d", P, tz_comm_rank(c));
  CHECK(tz_comm_native(c, "cuda_stream") && tz_comm_native(c, "nccl_comm"), "native handles");
  int dev = -1;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK(dev == bs.local_rank, "bound to GPU %d, local rank %d", dev, bs.local_rank);

  /* All-gather of odd sizes, then an all-reduce that depends on it through its fence. */
  const size_t sizes[] = {1, 13, 4099, 1000003};
  for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
    size_t n = sizes[si];
    unsigned char *ref = malloc((size_t)P * n), *got = malloc((size_t)P * n);
    for (int q = 0; q < P; q++)
      tz_test_fill(ref + (size_t)q * n, n, si * 10 + (size_t)q);
    void *dsend, *drecv;
    CHECK_CUDA(cudaMalloc(&dsend, n));
    CHECK_CUDA(cudaMalloc(&drecv, (size_t)P * n));
    CHECK_CUDA(to_dev(dsend, ref + (size_t)me * n, n));
    tz_fence *f;
    CHECK_OK(tz_comm_all_gather(c, dsend, drecv, n, NULL, &f));
    CHECK_OK(wait_fence(f));
    CHECK_CUDA(cudaMemcpy(got, drecv, (size_t)P * n, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, ref, (size_t)P * n) == 0, "all_gather of %zu bytes differs", n);
    cudaFree(dsend);
    cudaFree(drecv);
    free(ref);
    free(got);
  }
  CHECK(check_reductions(c, 0) == 0, "reductions");

  /* Broadcast from rank 1; a barrier; an `after` on the host and one of this comm. */
  enum { N = 4099 };
  unsigned char host[N], ref[N];
  tz_test_fill(ref, N, 77);
  void *dbuf;
  CHECK_CUDA(cudaMalloc(&dbuf, N));
  memset(host, 0, N);
  CHECK_CUDA(to_dev(dbuf, me == 1 ? ref : host, N));
  tz_fence *f1, *f2;
  CHECK_OK(tz_comm_broadcast(c, dbuf, N, 1, NULL, &f1));
  CHECK_OK(tz_comm_barrier(c, f1, &f2)); /* after a fence of this comm: stream order */
  CHECK_OK(wait_fence(f2));
  CHECK_OK(wait_fence(f1));
  CHECK_CUDA(cudaMemcpy(host, dbuf, N, cudaMemcpyDeviceToHost));
  CHECK(memcmp(host, ref, N) == 0, "broadcast differs");
  struct delayed d = {tz_fence_create()};
  pthread_t th;
  pthread_create(&th, NULL, signal_later, &d);
  double t0 = tz_now_s();
  CHECK_OK(tz_comm_barrier(c, d.f, &f1)); /* a host fence: waited for before the launch */
  CHECK(tz_now_s() - t0 >= 0.05, "the barrier did not wait for its input");
  CHECK_OK(wait_fence(f1));
  pthread_join(th, NULL);
  tz_fence_release(d.f);
  cudaFree(dbuf);

  /* Host buffers (the control plane: a rank's rates, stop flags) go through a device copy: a
   * broadcast in place, an all-gather whose input lies inside its output, an fp32 all-reduce in
   * place and out of place, a reduce-scatter into the stack. */
  memset(host, 0, N);
  CHECK_OK(tz_comm_broadcast(c, me == 1 ? ref : host, N, 1, NULL, &f1));
  CHECK_OK(wait_fence(f1));
  if (me == 0)
    CHECK(memcmp(host, ref, N) == 0, "broadcast of a host buffer differs");
  unsigned char *hall = malloc(2 * N), *hwant = malloc(2 * N);
  tz_test_fill(hwant, 2 * N, 91);
  memset(hall, 0, 2 * N);
  memcpy(hall + (size_t)me * N, hwant + (size_t)me * N, N);
  CHECK_OK(tz_comm_all_gather(c, hall + (size_t)me * N, hall, N, NULL, &f1));
  CHECK_OK(wait_fence(f1));
  CHECK(memcmp(hall, hwant, 2 * N) == 0, "all_gather of host buffers differs");
  free(hall);
  free(hwant);
  float v[3] = {1.5f + (float)me, -2.0f, 0.25f * (float)(me + 1)}, sum[3] = {0, 0, 0};
  CHECK_OK(tz_comm_all_reduce(c, v, sum, 3, TZ_F32, NULL, &f1));
  CHECK_OK(wait_fence(f1));
  CHECK(sum[0] == 4.0f && sum[1] == -4.0f && sum[2] == 0.75f, "host all_reduce: %g %g %g",
        (double)sum[0], (double)sum[1], (double)sum[2]);
  CHECK_OK(tz_comm_all_reduce(c, v, v, 3, TZ_F32, NULL, &f1));
  CHECK_OK(wait_fence(f1));
  CHECK(memcmp(v, sum, sizeof v) == 0, "host all_reduce in place differs");
  float rs_in[4] = {1, 2, 3 + (float)me, 4}, rs_out[2] = {0, 0};
  CHECK_OK(tz_comm_reduce_scatter(c, rs_in, rs_out, 2, TZ_F32, NULL, &f1));
  CHECK_OK(wait_fence(f1));
  CHECK(me == 0 ? rs_out[0] == 2 && rs_out[1] == 4 : rs_out[0] == 7 && rs_out[1] == 8,
        "host reduce_scatter: %g %g", (double)rs_out[0], (double)rs_out[1]);
  tz_comm_destroy(c);

  /* bf16 summed in bf16 by NCCL itself. */
  struct tz_comm_params p;
  tz_comm_params_init(&p);
  p.accum = TZ_BF16;
  CHECK_OK(tz_comm_create("nccl", &bs, &p, &c));
  CHECK(check_reductions(c, 1) == 0, "native reductions");
  tz_comm_destroy(c);
  return 0;
}

static int worker_failure(const char *mode) {
  struct tz_bootstrap bs;
  CHECK_OK(tz_bootstrap_detect(&bs));
  me = bs.rank;
  tz_comm *c;
  CHECK_OK(tz_comm_create("nccl", &bs, NULL, &c));
  float *x;
  CHECK_CUDA(cudaMalloc((void **)&x, 1 << 20));
  CHECK_CUDA(cudaMemset(x, 0, 1 << 20));
  CHECK_CUDA(cudaDeviceSynchronize());
  if (strcmp(mode, "worker-hang") == 0 && me == 1) {
    sleep(60); /* never joins; the launcher ends this process once rank 0 fails */
    return 0;
  }
  for (int i = 0;; i++) {
    if (strcmp(mode, "worker-kill") == 0 && i == 5 && me == 1)
      raise(SIGKILL);
    tz_fence *f;
    int rc = tz_comm_all_reduce(c, x, x, (1 << 20) / 4, TZ_F32, NULL, &f);
    if (rc == 0)
      rc = wait_fence(f);
    if (rc < 0) {
      fprintf(stderr, "rank %d: %s (%s)\n", me, tz_err_msg(), tz_strerror(rc));
      return rc == TZ_ETIMEDOUT ? 4 : 5;
    }
  }
}

/* ---- The cases, run by ctest ---- */

static int run_launch(const char *mode, int n, struct tz_launch_result *res, double *secs) {
  char *argv[] = {self_path, (char *)mode, NULL};
  struct tz_launch_params lp;
  tz_launch_params_init(&lp);
  lp.nproc = n;
  double t0 = tz_now_s();
  int rc = tz_launch_run(&lp, 2, argv, res);
  *secs = tz_now_s() - t0;
  return rc;
}

static void test_nproc(void **state) {
  (void)state;
  struct tz_launch_result res;
  double s;
  TZ_ASSERT_OK(run_launch("worker-suite", 2, &res, &s));
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* Two workers started the way torchrun starts them: variables, no pipes, rendezvous over TCP. */
static void test_torchrun(void **state) {
  (void)state;
  int port = free_port();
  assert_true(port > 0);
  pid_t pids[2];
  for (int r = 0; r < 2; r++) {
    pids[r] = fork();
    assert_true(pids[r] >= 0);
    if (pids[r] == 0) {
      char v[16];
      snprintf(v, sizeof v, "%d", r);
      setenv("RANK", v, 1);
      setenv("LOCAL_RANK", v, 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("LOCAL_WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(v, sizeof v, "%d", port);
      setenv("MASTER_PORT", v, 1);
      execl(self_path, self_path, "worker-suite", (char *)NULL);
      _exit(127);
    }
  }
  /* Like torchrun: when one worker fails, the other is stopped. */
  double deadline = tz_now_s() + 240;
  int status[2] = {0, 0}, done[2] = {0, 0}, left = 2;
  while (left > 0 && tz_now_s() < deadline) {
    for (int r = 0; r < 2; r++)
      if (!done[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        done[r] = 1;
        left--;
        if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0)
          kill(pids[1 - r], SIGKILL);
      }
    usleep(100000);
  }
  for (int r = 0; r < 2; r++)
    if (!done[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      print_error("rank %d was still running after 240 s\n", r);
    }
  for (int r = 0; r < 2; r++) {
    if (!(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0))
      print_error("rank %d: status 0x%x\n", r, status[r]);
    assert_true(done[r] && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0);
  }
}

static void test_killed_rank(void **state) {
  (void)state;
  setenv("TZ_COMM_TIMEOUT", "60", 1); /* the launcher, not the watchdog, must end this one */
  struct tz_launch_result res;
  double s;
  assert_int_equal(run_launch("worker-kill", 2, &res, &s), TZ_ECOMM);
  assert_non_null(strstr(tz_err_msg(), "rank 1 died (signal 9"));
  assert_int_equal(res.failed_rank, 1);
  assert_true(s < 45);
}

static void test_hung_rank(void **state) {
  (void)state;
  setenv("TZ_COMM_TIMEOUT", "3", 1);
  struct tz_launch_result res;
  double s;
  assert_int_equal(run_launch("worker-hang", 2, &res, &s), TZ_ECOMM);
  /* Rank 0's watchdog aborted the communicator and its collective failed with TZ_ETIMEDOUT. */
  assert_int_equal(res.failed_rank, 0);
  assert_int_equal(res.exit_status, 4);
  assert_true(s < 45);
}

int main(int argc, char **argv) {
  self_path = argv[0];
  const char *mode = argc > 1 ? argv[1] : "nproc";
  if (strcmp(mode, "worker-suite") == 0)
    return worker_suite();
  if (strncmp(mode, "worker-", 7) == 0)
    return worker_failure(mode);
  char why[256] = "";
  int gpus = tz_comm_probe("nccl", why, sizeof why);
  if (gpus < 0)
    tz_test_skip("%s", why);
  if (gpus < 2)
    tz_test_skip("nccl: %d GPU visible; these tests need 2", gpus);
  struct CMUnitTest one[1];
  if (strcmp(mode, "nproc") == 0)
    one[0] = (struct CMUnitTest)cmocka_unit_test(test_nproc);
  else if (strcmp(mode, "torchrun") == 0)
    one[0] = (struct CMUnitTest)cmocka_unit_test(test_torchrun);
  else if (strcmp(mode, "killed") == 0)
    one[0] = (struct CMUnitTest)cmocka_unit_test(test_killed_rank);
  else if (strcmp(mode, "hung") == 0)
    one[0] = (struct CMUnitTest)cmocka_unit_test(test_hung_rank);
  else {
    fprintf(stderr, "unknown case %s\n", mode);
    return 2;
  }
  return cmocka_run_group_tests(one, NULL, NULL);
}
