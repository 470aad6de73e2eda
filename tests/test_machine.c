/* A plan checked against what the machine can give (trainer/step/machine.h): host memory
 * (MemAvailable, or the cgroup's limit where it has one), GPU memory, NVMe space and
 * RLIMIT_MEMLOCK, with made-up machines; the trainer refuses an impossible plan before allocating
 * anything and before its layer probe. Nothing here allocates the machine's memory: the facts are
 * injected. */
#define _GNU_SOURCE
#include "testlib.h"

#include "collectives/comm.h"
#include "core/config.h"
#include "core/error.h"
#include "core/runtime.h"
#include "trainer/step/machine.h"
#include "trainer/model/model.h"
#include "trainer/step/rates.h"
#include "trainer/step/train.h"
#include "util/clock.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#define GIB (1ull << 30)
#define MIB (1ull << 20)
#define U TZ_MACHINE_UNKNOWN

static struct tz_machine_facts unknown(void) {
  return (struct tz_machine_facts){.mem_available = U,
                                   .mem_total = U,
                                   .cgroup_max = U,
                                   .memlock = U,
                                   .nvme_free = U,
                                   .device_free = U,
                                   .device_total = U};
}

static void assert_msg(const char *part) {
  if (!strstr(tz_err_msg(), part))
    print_error("expected \"%s\" in: %s\n", part, tz_err_msg());
  assert_non_null(strstr(tz_err_msg(), part));
}

/* The case: a CPU machine, whose compute tier is host memory, asked for more than it has:
 * refused naming the tier, the need, what is there and the shortfall. */
static void test_cpu_host_short(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  f.mem_available = 8 * GIB;
  f.mem_total = 24 * GIB;
  struct tz_machine_need n = {.compute = 10 * GIB, .host = 1 * GIB, .ranks = 1};
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("host memory needs 11.00 GiB");
  assert_msg("3.00 GiB more than this machine can give (8.00 GiB: MemAvailable");
  assert_msg("tierzero.hbm_budget");
  n.compute = 6 * GIB; /* 7 of 8 */
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
}

/* Under ulimit -v the address space is the limit: its room is the limit less what the process
 * has mapped and TZ_MACHINE_THREAD_VM a CPU, said by name (issue 48: OpenBLAS retried a refused
 * 128 MiB allocation forever, and the run hung with no word); a limit with room to spare leaves
 * memory's room as it was. */
static void test_address_space_limit(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  f.mem_available = 8 * GIB;
  f.mem_total = 24 * GIB;
  f.as_limit = 2 * GIB;
  f.vm_size = 1 * GIB;
  f.cpus = 2;
  char how[512];
  uint64_t room = tz_machine_host_room(&f, how, sizeof how);
  assert_int_equal(room, 1 * GIB - 2 * TZ_MACHINE_THREAD_VM);
  assert_non_null(strstr(how, "ulimit -v (RLIMIT_AS) 2.00 GiB"));
  assert_non_null(strstr(how, "its 2 CPUs' threads"));
  struct tz_machine_need n = {.compute = 600 * MIB, .host = 10 * MIB, .ranks = 1};
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("ulimit -v (RLIMIT_AS)");
  assert_msg("OpenBLAS");
  n.compute = 400 * MIB;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  f.as_limit = 64 * GIB; /* far above: memory's room, memory's words */
  assert_int_equal(tz_machine_host_room(&f, how, sizeof how), 8 * GIB);
  assert_non_null(strstr(how, "MemAvailable"));
  f.vm_size = 70 * GIB; /* past the limit: no room at all */
  f.as_limit = 64 * GIB;
  assert_int_equal(tz_machine_host_room(&f, how, sizeof how), 0);
}

/* A VM whose MemAvailable is far below its real limit until touched: the cgroup's limit (less
 * what the cgroup holds) is the truth, both ways. */
static void test_cgroup_is_the_truth(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  f.mem_available = 2 * GIB;
  f.mem_total = 4 * GIB;
  f.cgroup_max = 64 * GIB;
  f.cgroup_current = 4 * GIB;
  struct tz_machine_need n = {.compute = 50 * GIB, .host = 1 * GIB, .ranks = 1};
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  n.compute = 60 * GIB; /* 61 of 60 */
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("1.00 GiB more");
  assert_msg("memory.max 64.00 GiB less its memory.current 4.00 GiB");
}

/* A budget the user gave overrides the check (with a warning); the other tiers still count. */
static void test_budget_given_goes_ahead(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  f.mem_available = 8 * GIB;
  struct tz_machine_need n = {.compute = 10 * GIB, .host = 1 * GIB, .ranks = 1};
  n.compute_budget = 10 * GIB;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  n.compute_budget = 0;
  n.host_budget = 1 * GIB;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  f.nvme_free = 10 * MIB;
  n.nvme_per_dir = 20 * MIB;
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("nvme space needs 20.00 MiB");
  assert_msg("10.00 MiB more");
  assert_msg("tierzero.nvme_budget");
  n.nvme_budget = 20 * MIB;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
}

/* With a GPU the compute tier is its memory, and host memory holds the host tier alone. */
static void test_gpu(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  f.mem_available = 8 * GIB;
  f.device_free = 10 * GIB;
  f.device_total = 12 * GIB;
  struct tz_machine_need n = {.gpu = 1, .compute = 10 * GIB, .host = 7 * GIB, .ranks = 1};
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  n.compute = 11 * GIB;
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("compute tier (GPU memory) needs 11.00 GiB");
  assert_msg("1.00 GiB more");
  n.compute = 10 * GIB;
  n.host = 9 * GIB;
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("host memory needs 9.00 GiB");
  /* Page-locking beyond RLIMIT_MEMLOCK only slows copies: a warning, not a refusal. */
  n.host = 7 * GIB;
  n.pinned = 7 * GIB;
  f.memlock = 64 * MIB;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
}

/* Ranks on one machine share its host memory; unknown limits refuse nothing. */
static void test_ranks_and_unknown(void **state) {
  (void)state;
  struct tz_machine_facts f = unknown();
  struct tz_machine_need n = {
      .compute = 100 * GIB, .host = 100 * GIB, .nvme_per_dir = 1ull << 50, .ranks = 4};
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
  f.mem_available = 16 * GIB;
  n = (struct tz_machine_need){.compute = 4 * GIB, .host = 1 * GIB, .ranks = 4};
  assert_int_equal(tz_machine_check(&n, &f), TZ_ENOMEM);
  assert_msg("shared by 4 ranks");
  n.ranks = 2;
  TZ_ASSERT_OK(tz_machine_check(&n, &f));
}

/* The facts of this machine read without error, and MemAvailable is below MemTotal. */
static void test_read_this_machine(void **state) {
  (void)state;
  struct tz_machine_facts f;
  const char *dirs[1] = {"/tmp"};
  tz_machine_facts_read(dirs, 1, "cpu", 0, &f);
  if (f.mem_total != U)
    assert_true(f.mem_available <= f.mem_total);
  assert_true(f.nvme_free != U);
  assert_true(f.device_free == U);
  char how[256];
  assert_true(tz_machine_host_room(&f, how, sizeof how) > 0);
}

/* ---- through the trainer ---- */

static tz_runtime *rt;
static tz_comm *comm;

static int make(const struct tz_model_config *mc, const char *hbm, int plan_only, int measure,
                const struct tz_machine_facts *f, tz_trainer **tr) {
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  int rc = tz_config_set(&cfg, "train_micro_batch_size_per_gpu", "2");
  if (rc == 0 && hbm)
    rc = tz_config_set(&cfg, "tierzero.hbm_budget", hbm);
  if (rc == 0)
    rc = tz_config_resolve_batch(&cfg, 1);
  if (rc == 0) {
    struct tz_trainer_params tp;
    tz_trainer_params_init(&tp);
    tp.seq_len = 16;
    tp.plan_only = plan_only;
    tp.measure_layer = measure;
    tp.machine = f;
    rc = tz_trainer_create(&cfg, mc, comm, rt, &tp, tr);
  }
  tz_config_free(&cfg);
  return rc;
}

/* A machine with 1 MiB of host memory: the trainer is refused before it makes a tier (a real
 * creation, not plan_only), and is made with enough. */
static void test_trainer_refused(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("tiny", &mc));
  struct tz_machine_facts f = unknown();
  f.mem_available = 1 * MIB;
  tz_trainer *tr = NULL;
  assert_int_equal(make(&mc, NULL, 0, 0, &f, &tr), TZ_ENOMEM);
  assert_null(tr);
  assert_msg("the plan's host memory needs");
  assert_msg("more than this machine can give (1.00 MiB: MemAvailable");
  f.mem_available = 64 * GIB;
  TZ_ASSERT_OK(make(&mc, NULL, 0, 0, &f, &tr));
  tz_trainer_destroy(tr);
}

/* On a CPU-only machine the compute tier is host memory: without budgets the host tier's default
 * is what the compute tier leaves of the default share (MemAvailable less a tenth of the
 * machine, at least 8 GiB: here 40 - 8 GiB), so that the two together fit the machine; a plan
 * too large for that goes to the disk or is refused, not killed for memory mid-run. */
static void test_cpu_host_default_leaves_compute(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("tiny", &mc));
  struct tz_machine_facts f = unknown();
  f.mem_available = 40 * GIB;
  f.mem_total = 48 * GIB;
  tz_trainer *tr = NULL;
  TZ_ASSERT_OK(make(&mc, NULL, 1, 0, &f, &tr));
  const struct tz_plan *pl = tz_trainer_plan(tr);
  const uint64_t compute = pl->capacity[TZ_PLAN_COMPUTE], host = pl->capacity[TZ_PLAN_HOST];
  assert_true(compute > 1 * MIB);
  assert_true(compute + host <= 32 * GIB);
  assert_true(compute + host >= 32 * GIB - 2 * 4096);
  tz_trainer_destroy(tr);
}

/* A llama-13b that cannot fit (a 16 MiB compute budget; a machine of 1 GiB) is refused in
 * seconds: before the layer probe, which takes minutes for such a layer on a CPU. */
static void test_refused_before_layer_probe(void **state) {
  (void)state;
  struct tz_model_config mc;
  TZ_ASSERT_OK(tz_model_preset("llama-13b", &mc));
  struct tz_machine_facts f = unknown();
  f.mem_available = 64 * GIB;
  tz_trainer *tr = NULL;
  double t0 = tz_now_s();
  assert_int_equal(make(&mc, "16MiB", 1, 1, &f, &tr), TZ_ENOMEM);
  assert_msg("compute tier's budget of 16.00 MiB");
  f.mem_available = 1 * GIB;
  assert_int_equal(make(&mc, NULL, 1, 1, &f, &tr), TZ_ENOMEM);
  assert_msg("more than this machine can give (1.00 GiB");
  double took = tz_now_s() - t0;
  if (took > 10)
    print_error("the refusals took %.1f s\n", took);
  assert_true(took < 10);
}

/* The rates probe in a 20 MiB nvme directory (a tmpfs of that size, where this process may mount
 * one): timed with less, not refused before the plan's own nvme budget is considered. */
static void test_rates_small_nvme_dir(void **state) {
  (void)state;
  char *d = tz_test_mkdtemp("machine");
  if (mount("tmpfs", d, "tmpfs", 0, "size=20m") != 0) {
    tz_test_rmdir(d);
    skip(); /* no permission to mount a filesystem of that size here */
  }
  struct tz_config cfg;
  tz_config_defaults(&cfg);
  TZ_ASSERT_OK(tz_config_set(&cfg, "tierzero.nvme_path", d));
  TZ_ASSERT_OK(tz_config_set(&cfg, "tierzero.nvme_buffered", "true"));
  char cache[1100];
  snprintf(cache, sizeof cache, "%s.rates.json", d);
  struct tz_plan_rates r;
  memset(&r, 0, sizeof r);
  int rc = tz_rates_get(&cfg, "cpu", rt, comm, cache, 1, &r);
  if (rc != 0)
    print_error("%s\n", tz_err_msg());
  umount(d);
  unlink(cache);
  tz_config_free(&cfg);
  tz_test_rmdir(d);
  assert_int_equal(rc, 0);
  assert_true(r.nvme_read > 0 && r.nvme_write > 0);
}

int main(void) {
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.chunk_bytes = 64 << 10;
  rp.staging_bytes = 1 << 20;
  if (tz_runtime_create(&rp, &rt) < 0)
    tz_test_skip("no runtime: %s", tz_err_msg());
  struct tz_bootstrap bs;
  tz_bootstrap_single(&bs);
  struct tz_comm_params cp;
  tz_comm_params_init(&cp);
  cp.progress = tz_runtime_progress(rt);
  if (tz_comm_create("single", &bs, &cp, &comm) < 0)
    tz_test_skip("no comm: %s", tz_err_msg());
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpu_host_short),
      cmocka_unit_test(test_address_space_limit),
      cmocka_unit_test(test_cgroup_is_the_truth),
      cmocka_unit_test(test_budget_given_goes_ahead),
      cmocka_unit_test(test_gpu),
      cmocka_unit_test(test_ranks_and_unknown),
      cmocka_unit_test(test_read_this_machine),
      cmocka_unit_test(test_trainer_refused),
      cmocka_unit_test(test_cpu_host_default_leaves_compute),
      cmocka_unit_test(test_refused_before_layer_probe),
      cmocka_unit_test(test_rates_small_nvme_dir),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  return rc;
}
