/* topo/: the hwloc XML fixtures in tests/data/topo (machines from their public descriptions),
 * a sysfs tree laid out in a temporary directory, this machine, and bad input. */
#define _GNU_SOURCE
#include "testlib.h"

#include "core/error.h"
#include "core/tier.h"
#include "topo/topo.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <numa.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers --------------------------------------------------------------------------------- */

static char *data_path(const char *name) {
  const char *d = getenv("TZ_TEST_DATA");
  char *p = NULL;
  assert_true(asprintf(&p, "%s/topo/%s", d && *d ? d : "tests/data", name) > 0);
  return p;
}

static tz_topo *load_fixture(const char *xml, const char *mountinfo, const char *sysfs) {
  struct tz_topo_load_params lp;
  tz_topo_load_params_init(&lp);
  char *x = data_path(xml);
  char *m = mountinfo ? data_path(mountinfo) : NULL;
  lp.xml = x;
  lp.mountinfo = m;
  lp.sysfs_root = sysfs;
  tz_topo *t = NULL;
  TZ_ASSERT_OK(tz_topo_load(&lp, &t));
  free(x);
  free(m);
  return t;
}

/* Facts fixed so that the advice does not depend on the machine running the test. */
static void quiet_params(struct tz_topo_advice_params *p) {
  tz_topo_advice_params_init(p);
  p->memlock_bytes = TZ_TOPO_UNLIMITED;
  p->cap_ipc_lock = 0;
  p->thp = "madvise";
}

static struct tz_topo_advice *advise(const tz_topo *t, const struct tz_topo_advice_params *p) {
  struct tz_topo_advice *a = NULL;
  TZ_ASSERT_OK(tz_topo_advise(t, p, &a));
  return a;
}

static void assert_cpus(const tz_cpuset *s, const char *want) {
  char got[512];
  tz_cpuset_format(s, got, sizeof got);
  assert_string_equal(got, want);
}

static int ep(const tz_topo *t, enum tz_topo_kind k, int i) {
  int e = tz_topo_endpoint_find(t, k, i);
  assert_true(e >= 0);
  return e;
}

static int ep_block(const tz_topo *t, const char *name) {
  return ep(t, TZ_TOPO_KIND_BLOCK, tz_topo_blockdev_find(t, name));
}

static const char *cls(const tz_topo *t, int i, int j) {
  return tz_topo_link_name(tz_topo_link(t, i, j, NULL));
}

static int count_code(const struct tz_topo_advice *a, const char *code) {
  int n = 0;
  for (int i = 0; i < a->n_warnings; i++)
    n += strcmp(a->warnings[i].code, code) == 0;
  return n;
}

static void print_warnings(const struct tz_topo_advice *a) {
  for (int i = 0; i < a->n_warnings; i++)
    print_message("  warning [%s] %s\n", a->warnings[i].code, a->warnings[i].message);
}

static void mkdirs(const char *path) {
  char buf[PATH_MAX];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++)
    if (*p == '/') {
      *p = '\0';
      mkdir(buf, 0755);
      *p = '/';
    }
  mkdir(buf, 0755);
}

/* Writes root/rel (parents made) holding text and a newline, as sysfs files read. */
static void put(const char *root, const char *rel, const char *text) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  char *slash = strrchr(path, '/');
  *slash = '\0';
  mkdirs(path);
  *slash = '/';
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fprintf(f, "%s\n", text);
  fclose(f);
}

static void link_to(const char *root, const char *rel, const char *target) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", root, rel);
  char *slash = strrchr(path, '/');
  *slash = '\0';
  mkdirs(path);
  *slash = '/';
  assert_int_equal(symlink(target, path), 0);
}

static char *write_temp(const char *dir, const char *name, const char *text, size_t n) {
  char *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, n, f), n);
  fclose(f);
  return p;
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char *buf = NULL;
  size_t cap = 0;
  FILE *m = open_memstream(&buf, &cap);
  char chunk[4096];
  size_t r;
  while ((r = fread(chunk, 1, sizeof chunk, f)) > 0)
    fwrite(chunk, 1, r, m);
  fclose(f);
  fclose(m);
  *n = cap;
  return buf;
}

/* ---- cpusets --------------------------------------------------------------------------------- */

static void test_cpuset(void **state) {
  (void)state;
  tz_cpuset s;
  TZ_ASSERT_OK(tz_cpuset_parse(&s, " 0-3,8,10-11 "));
  assert_int_equal(tz_cpuset_count(&s), 7);
  assert_cpus(&s, "0-3,8,10-11");
  TZ_ASSERT_OK(tz_cpuset_parse(&s, ""));
  assert_true(tz_cpuset_empty(&s));
  assert_cpus(&s, "");
  TZ_ASSERT_OK(tz_cpuset_parse(&s, "1023"));
  assert_int_equal(tz_cpuset_next(&s, 0), 1023);
  assert_int_equal(tz_cpuset_parse(&s, "1024"), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "1024"));
  assert_int_equal(tz_cpuset_parse(&s, "3-1"), TZ_EINVAL);
  assert_int_equal(tz_cpuset_parse(&s, "1,,2"), TZ_EINVAL);
  assert_int_equal(tz_cpuset_parse(&s, "a"), TZ_EINVAL);
  /* A short buffer truncates but reports the full length. */
  tz_cpuset_parse(&s, "0,2,4,6,8,10");
  char small[6];
  assert_int_equal(tz_cpuset_format(&s, small, sizeof small), 12);
  assert_int_equal(strlen(small), 5);
  tz_cpuset a, b;
  tz_cpuset_parse(&a, "0-7");
  tz_cpuset_parse(&b, "4-5");
  assert_true(tz_cpuset_includes(&a, &b));
  assert_false(tz_cpuset_includes(&b, &a));
  tz_cpuset_andnot(&a, &b);
  assert_cpus(&a, "0-3,6-7");
  assert_false(tz_cpuset_intersects(&a, &b));
}

/* ---- the DGX H100-like fixture --------------------------------------------------------------- */

static void test_dgx_inventory(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", NULL, NULL);
  const struct tz_topo_machine *m = tz_topo_machine(t);
  assert_int_equal(m->live, 0);
  assert_string_equal(m->hostname, "dgx-h100");
  assert_int_equal(m->n_packages, 2);
  assert_int_equal(m->n_numa, 2);
  assert_int_equal(m->n_cores, 16);
  assert_int_equal(m->n_pus, 32);
  assert_int_equal(m->n_l3, 2);
  assert_int_equal(m->l3_bytes, 105ull << 20);
  assert_int_equal(m->memory_bytes, 2ull << 40);
  assert_int_equal(m->free_known, 0);
  assert_int_equal(tz_topo_numa_count(t), 2);
  for (int i = 0; i < 2; i++) {
    const struct tz_topo_numa *n = tz_topo_numa(t, i);
    assert_int_equal(n->os_index, i);
    assert_int_equal(n->package, i);
    assert_int_equal(n->free_bytes, -1);
    assert_int_equal(n->n_cores, 8);
    assert_int_equal(n->n_pus, 16);
  }
  assert_cpus(&tz_topo_numa(t, 0)->cpus, "0-7,16-23");
  assert_cpus(&tz_topo_numa(t, 1)->cpus, "8-15,24-31");
  assert_string_equal(tz_topo_package(t, 1)->cpu_model, "Intel(R) Xeon(R) Platinum 8480C");

  static const char *const busids[8] = {"0000:1b:00.0", "0000:1c:00.0", "0000:21:00.0",
                                        "0000:22:00.0", "0000:99:00.0", "0000:9a:00.0",
                                        "0000:9f:00.0", "0000:a0:00.0"};
  assert_int_equal(tz_topo_gpu_count(t), 8);
  for (int i = 0; i < 8; i++) {
    const struct tz_topo_gpu *g = tz_topo_gpu(t, i);
    assert_int_equal(g->index, i);
    assert_string_equal(g->busid, busids[i]);
    assert_string_equal(g->name, "NVIDIA H100 80GB HBM3");
    assert_string_equal(g->name_source, "hwloc");
    assert_int_equal(g->device_id, 0x2330);
    assert_int_equal(g->numa_node, i / 4);
    assert_int_equal(g->package, i / 4);
    assert_true(tz_cpuset_equal(&g->local_cpus, &tz_topo_numa(t, i / 4)->cpus));
    assert_true(g->link.bandwidth_gbs > 60 && g->link.bandwidth_gbs < 64);
    assert_int_equal(g->link.gen, 0); /* no sysfs for an XML */
  }
  assert_int_equal(tz_topo_nic_count(t), 4);
  for (int i = 0; i < 4; i++) {
    const struct tz_topo_nic *n = tz_topo_nic(t, i);
    char name[16];
    snprintf(name, sizeof name, "mlx5_%d", i);
    assert_string_equal(n->name, name);
    assert_string_equal(n->kind, "infiniband");
    assert_true(!strncmp(n->netdev, "ibp", 3));
    assert_int_equal(n->numa_node, i / 2);
  }
  assert_int_equal(tz_topo_blockdev_count(t), 8);
  for (int i = 0; i < 8; i++) {
    const struct tz_topo_blockdev *b = tz_topo_blockdev(t, i);
    char name[16];
    snprintf(name, sizeof name, "nvme%dn1", i);
    assert_string_equal(b->name, name);
    assert_string_equal(b->kind, "nvme");
    assert_int_equal(b->size_bytes, 3750738264ull * 1024);
    assert_int_equal(b->rotational, -1);
    assert_int_equal(b->numa_node, i / 4);
    assert_int_equal(b->n_mounts, 0);
  }
  assert_int_equal(tz_topo_endpoint_count(t), 20);
  assert_string_equal(tz_topo_endpoint(t, 0)->label, "GPU0");
  assert_string_equal(tz_topo_endpoint(t, 8)->label, "mlx5_0");
  assert_string_equal(tz_topo_endpoint(t, 12)->label, "nvme0n1");
  tz_topo_destroy(t);
}

static void test_dgx_matrix(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", NULL, NULL);
  int g[8];
  for (int i = 0; i < 8; i++)
    g[i] = ep(t, TZ_TOPO_KIND_GPU, i);
  /* GPU pairs: one switch, two switches under one root port, one host bridge, two sockets. */
  assert_string_equal(cls(t, g[0], g[0]), "X");
  assert_string_equal(cls(t, g[0], g[1]), "PIX");
  assert_string_equal(cls(t, g[0], g[2]), "PXB");
  assert_string_equal(cls(t, g[2], g[3]), "PIX");
  assert_string_equal(cls(t, g[4], g[5]), "PIX");
  assert_string_equal(cls(t, g[4], g[6]), "PHB");
  assert_string_equal(cls(t, g[0], g[4]), "SYS");
  assert_string_equal(cls(t, g[3], g[7]), "SYS");
  /* GPU to NVMe: behind its switch, across switches, another host bridge of its node, remote. */
  assert_string_equal(cls(t, g[0], ep_block(t, "nvme0n1")), "PIX");
  assert_string_equal(cls(t, g[0], ep_block(t, "nvme1n1")), "PXB");
  assert_string_equal(cls(t, g[0], ep_block(t, "nvme2n1")), "NODE");
  assert_string_equal(cls(t, g[0], ep_block(t, "nvme4n1")), "SYS");
  assert_string_equal(cls(t, g[4], ep_block(t, "nvme5n1")), "PHB");
  assert_string_equal(cls(t, g[6], ep_block(t, "nvme5n1")), "PIX");
  assert_string_equal(cls(t, g[7], ep_block(t, "nvme7n1")), "NODE");
  /* GPU to NIC. */
  assert_string_equal(cls(t, g[0], ep(t, TZ_TOPO_KIND_NIC, 0)), "PIX");
  assert_string_equal(cls(t, g[0], ep(t, TZ_TOPO_KIND_NIC, 1)), "PXB");
  assert_string_equal(cls(t, g[5], ep(t, TZ_TOPO_KIND_NIC, 3)), "PHB");
  assert_string_equal(cls(t, g[1], ep(t, TZ_TOPO_KIND_NIC, 2)), "SYS");
  /* Symmetric, and no NVLink without NVML. */
  int n = tz_topo_endpoint_count(t);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < n; j++) {
      int nv = -1;
      assert_int_equal(tz_topo_link(t, i, j, &nv), tz_topo_link(t, j, i, NULL));
      assert_int_equal(nv, 0);
      assert_int_equal(tz_topo_link(t, i, j, NULL) == TZ_TOPO_SELF, i == j);
      assert_int_not_equal(tz_topo_link(t, i, j, NULL), TZ_TOPO_UNKNOWN);
    }
  assert_int_equal(tz_topo_link(t, 0, n, NULL), TZ_TOPO_UNKNOWN);
  tz_topo_destroy(t);
}

static void test_dgx_advice(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", NULL, NULL);
  struct tz_topo_advice_params p;
  quiet_params(&p);
  struct tz_topo_advice *a = advise(t, &p);
  print_warnings(a);
  assert_int_equal(a->n_warnings, 0);
  assert_int_equal(a->n_placements, 8);
  /* 8 cores per node, 4 GPUs per node: two cores each, the first kept for the progress engine. */
  assert_cpus(&tz_topo_advice_for_gpu(a, 0)->progress_cpus, "0,16");
  assert_cpus(&tz_topo_advice_for_gpu(a, 0)->cpus, "1,17");
  assert_cpus(&tz_topo_advice_for_gpu(a, 3)->cpus, "7,23");
  assert_cpus(&tz_topo_advice_for_gpu(a, 4)->progress_cpus, "8,24");
  assert_cpus(&tz_topo_advice_for_gpu(a, 7)->cpus, "15,31");
  tz_cpuset used;
  tz_cpuset_zero(&used);
  for (int g = 0; g < 8; g++) {
    const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, g);
    assert_non_null(pl);
    assert_int_equal(pl->gpu, g);
    assert_int_equal(pl->numa_node, g / 4);
    assert_int_equal(pl->n_cores, 1);
    const tz_cpuset *node = &tz_topo_numa_by_os(t, pl->numa_node)->cpus;
    assert_true(tz_cpuset_includes(node, &pl->cpus));
    assert_true(tz_cpuset_includes(node, &pl->progress_cpus));
    assert_false(tz_cpuset_intersects(&pl->cpus, &pl->progress_cpus));
    /* Disjoint from every other GPU's threads and progress engine. */
    assert_false(tz_cpuset_intersects(&used, &pl->cpus));
    assert_false(tz_cpuset_intersects(&used, &pl->progress_cpus));
    tz_cpuset_or(&used, &pl->cpus);
    tz_cpuset_or(&used, &pl->progress_cpus);
    /* Its socket's four drives, nearest first; no remote one. */
    assert_int_equal(pl->n_nvme, 4);
    for (int k = 0; k < 4; k++)
      assert_int_equal(tz_topo_blockdev(t, pl->nvme[k])->numa_node, g / 4);
    assert_int_equal(pl->n_dirs, 0); /* no mount table for this XML */
  }
  assert_int_equal(tz_cpuset_count(&used), 32);
  static const char *const first_nvme[8] = {"nvme0n1", "nvme0n1", "nvme1n1", "nvme1n1",
                                            "nvme4n1", "nvme4n1", "nvme5n1", "nvme5n1"};
  static const char *const second_nvme[8] = {"nvme1n1", "nvme1n1", "nvme0n1", "nvme0n1",
                                             "nvme5n1", "nvme5n1", "nvme4n1", "nvme4n1"};
  static const int nic[8] = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int g = 0; g < 8; g++) {
    const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, g);
    assert_string_equal(tz_topo_blockdev(t, pl->nvme[0])->name, first_nvme[g]);
    assert_string_equal(tz_topo_blockdev(t, pl->nvme[1])->name, second_nvme[g]);
    assert_int_equal(pl->nic, nic[g]);
  }
  assert_null(tz_topo_advice_for_gpu(a, 8));
  assert_null(tz_topo_advice_for_gpu(a, -1));
  tz_topo_advice_destroy(a);

  /* No progress core: both cores go to the threads. */
  p.progress_cores = 0;
  a = advise(t, &p);
  assert_cpus(&tz_topo_advice_for_gpu(a, 0)->cpus, "0-1,16-17");
  assert_true(tz_cpuset_empty(&tz_topo_advice_for_gpu(a, 0)->progress_cpus));
  assert_int_equal(a->n_warnings, 0);
  tz_topo_advice_destroy(a);

  /* Three progress cores wanted, two available per GPU: said, not hidden. */
  p.progress_cores = 3;
  a = advise(t, &p);
  assert_int_equal(count_code(a, "cores_shared"), 8);
  const struct tz_topo_warning *w = tz_topo_advice_warning(a, "cores_shared", 5);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "GPU5"));
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

static void test_dgx_swap_dirs(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", "dgx-h100.mountinfo", NULL);
  assert_int_equal(tz_topo_blockdev(t, 3)->n_mounts, 1);
  const struct tz_topo_mount *m = tz_topo_mount(t, tz_topo_blockdev(t, 3)->mounts[0]);
  assert_string_equal(m->path, "/mnt/nvme3");
  assert_string_equal(m->fstype, "xfs");
  assert_int_equal(m->odirect, -1); /* not this machine: not probed */
  assert_int_equal(tz_topo_mount(t, tz_topo_mount_for_path(t, "/mnt/nvme6/tz/x"))->blockdev,
                   tz_topo_blockdev_find(t, "nvme6n1"));
  assert_string_equal(tz_topo_mount(t, tz_topo_mount_for_path(t, "/mnt/nvme66"))->path, "/");

  /* No swap dirs: the NVMe mounts on each GPU's socket, nearest first. */
  struct tz_topo_advice_params p;
  quiet_params(&p);
  struct tz_topo_advice *a = advise(t, &p);
  print_warnings(a);
  assert_int_equal(a->n_warnings, 0);
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, 2);
  assert_int_equal(pl->n_dirs, 4);
  assert_string_equal(pl->dirs[0], "/mnt/nvme1");
  assert_string_equal(pl->dirs[1], "/mnt/nvme0");
  assert_string_equal(pl->dirs[2], "/mnt/nvme2");
  assert_string_equal(pl->dirs[3], "/mnt/nvme3");
  tz_topo_advice_destroy(a);

  /* Only socket 1's drives given: GPUs 0-3 are told their reads cross the socket link. */
  for (int i = 0; i < 4; i++) {
    static char dirs[4][32];
    snprintf(dirs[i], sizeof dirs[i], "/mnt/nvme%d/tz", 4 + i);
    p.swap_dirs[p.n_swap_dirs++] = dirs[i];
  }
  a = advise(t, &p);
  print_warnings(a);
  assert_int_equal(a->n_warnings, 4);
  for (int g = 0; g < 8; g++) {
    const struct tz_topo_warning *w = tz_topo_advice_warning(a, "gpu_nvme_remote", g);
    pl = tz_topo_advice_for_gpu(a, g);
    assert_int_equal(pl->n_dirs, 4);
    if (g < 4) {
      assert_non_null(w);
      assert_non_null(strstr(w->message, "SYS"));
      assert_string_equal(pl->dirs[0], "/mnt/nvme4/tz"); /* all remote: kept in the given order */
    } else {
      assert_null(w);
    }
  }
  assert_string_equal(tz_topo_advice_for_gpu(a, 4)->dirs[0], "/mnt/nvme4/tz");
  assert_string_equal(tz_topo_advice_for_gpu(a, 4)->dirs[1], "/mnt/nvme5/tz");
  assert_string_equal(tz_topo_advice_for_gpu(a, 6)->dirs[0], "/mnt/nvme5/tz");
  assert_string_equal(tz_topo_advice_for_gpu(a, 6)->dirs[1], "/mnt/nvme4/tz");
  tz_topo_advice_destroy(a);

  /* A dir on a device the report cannot see (the md root) is named as such. */
  p.n_swap_dirs = 0;
  p.swap_dirs[p.n_swap_dirs++] = "/var/tz";
  a = advise(t, &p);
  const struct tz_topo_warning *w = tz_topo_advice_warning(a, "swap_dir_unknown", -1);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "/dev/md1"));
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

static void test_machine_warnings(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", NULL, NULL);
  struct tz_topo_advice_params p;
  quiet_params(&p);
  p.pinned_pool_bytes = 1ull << 30;
  p.memlock_bytes = 64ll << 20;
  p.thp = "never";
  struct tz_topo_advice *a = advise(t, &p);
  const struct tz_topo_warning *w = tz_topo_advice_warning(a, "memlock_low", -1);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "64.0 MiB"));
  assert_non_null(strstr(w->message, "1.0 GiB"));
  assert_non_null(tz_topo_advice_warning(a, "thp_disabled", -1));
  assert_int_equal(a->n_warnings, 2);
  assert_int_equal(a->memlock_bytes, 64ll << 20);
  assert_string_equal(a->thp, "never");
  tz_topo_advice_destroy(a);

  /* CAP_IPC_LOCK lifts the limit. */
  p.cap_ipc_lock = 1;
  a = advise(t, &p);
  assert_null(tz_topo_advice_warning(a, "memlock_low", -1));
  tz_topo_advice_destroy(a);
  p.cap_ipc_lock = 0;

  p.memlock_bytes = TZ_TOPO_UNLIMITED;
  p.thp = "always";
  a = advise(t, &p);
  assert_int_equal(a->n_warnings, 0);
  tz_topo_advice_destroy(a);
  p.memlock_bytes = 1ll << 30; /* exactly enough */
  a = advise(t, &p);
  assert_int_equal(a->n_warnings, 0);
  tz_topo_advice_destroy(a);

  /* For an XML the live facts are unknown, and unknown warns about nothing. */
  tz_topo_advice_params_init(&p);
  p.pinned_pool_bytes = 1ull << 40;
  a = advise(t, &p);
  assert_int_equal(a->memlock_bytes, TZ_TOPO_FACT_LIVE);
  assert_int_equal(a->cap_ipc_lock, TZ_TOPO_FACT_LIVE);
  assert_null(a->thp);
  assert_int_equal(a->n_warnings, 0);
  tz_topo_advice_destroy(a);

  /* Bad parameters. */
  quiet_params(&p);
  p.thp = "sometimes";
  assert_int_equal(tz_topo_advise(t, &p, &a), TZ_EINVAL);
  assert_null(a);
  quiet_params(&p);
  p.n_swap_dirs = TZ_TOPO_MAX_SWAP_DIRS + 1;
  assert_int_equal(tz_topo_advise(t, &p, &a), TZ_EINVAL);
  quiet_params(&p);
  p.n_swap_dirs = 1;
  assert_int_equal(tz_topo_advise(t, &p, &a), TZ_EINVAL);
  quiet_params(&p);
  p.progress_cores = -1;
  assert_int_equal(tz_topo_advise(t, &p, &a), TZ_EINVAL);
  tz_topo_advice_destroy(NULL);
  tz_topo_destroy(t);
}

/* ---- the 1-GPU virtual machine --------------------------------------------------------------- */

static void test_vm_pci_only_gpu(void **state) {
  (void)state;
  tz_topo *t = load_fixture("vm-1gpu.xml", NULL, NULL);
  /* hwloc shows the GPU only as PCI 10de:27b8 class 0302: still a GPU, named from its ids. */
  assert_int_equal(tz_topo_gpu_count(t), 1);
  const struct tz_topo_gpu *g = tz_topo_gpu(t, 0);
  assert_string_equal(g->name, "NVIDIA GPU [10de:27b8]");
  assert_string_equal(g->name_source, "pci-ids");
  assert_string_equal(g->busid, "0000:00:04.0");
  assert_int_equal(g->numa_node, 0);
  assert_int_equal(tz_topo_blockdev_count(t), 1);
  assert_string_equal(tz_topo_blockdev(t, 0)->kind, "virtio");
  assert_int_equal(tz_topo_blockdev(t, 0)->size_bytes, 200ull << 30);
  assert_string_equal(tz_topo_nic(t, 0)->kind, "ethernet");
  assert_string_equal(cls(t, ep(t, TZ_TOPO_KIND_GPU, 0), ep_block(t, "vda")), "PHB");
  assert_string_equal(cls(t, ep(t, TZ_TOPO_KIND_GPU, 0), ep(t, TZ_TOPO_KIND_NIC, 0)), "PHB");

  struct tz_topo_advice_params p;
  quiet_params(&p);
  struct tz_topo_advice *a = advise(t, &p);
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, 0);
  assert_int_equal(pl->numa_node, 0);
  assert_cpus(&pl->progress_cpus, "0,4");
  assert_cpus(&pl->cpus, "1-3,5-7");
  assert_int_equal(pl->n_cores, 3);
  assert_int_equal(pl->n_nvme, 0);
  assert_int_equal(pl->nic, 0);
  assert_non_null(tz_topo_advice_warning(a, "no_nvme", -1));
  assert_int_equal(a->n_warnings, 1);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

/* The VM's sysfs as the kernel lays it out: the disk behind its virtio function, a partition, a
 * loop device, and a GPU link trained to x8 of x16. */
static char *vm_sysfs(void) {
  char *root = tz_test_mkdtemp("topo-sysfs");
  assert_non_null(root);
  const char *vda = "sys/devices/pci0000:00/0000:00:05.0/virtio2/block/vda";
  char rel[256];
  snprintf(rel, sizeof rel, "%s/size", vda);
  put(root, rel, "419430400");
  snprintf(rel, sizeof rel, "%s/dev", vda);
  put(root, rel, "254:0");
  snprintf(rel, sizeof rel, "%s/queue/rotational", vda);
  put(root, rel, "1");
  snprintf(rel, sizeof rel, "%s/vda1/dev", vda);
  put(root, rel, "254:1");
  snprintf(rel, sizeof rel, "%s/device", vda);
  link_to(root, rel, "../../../virtio2");
  link_to(root, "sys/block/vda", "../devices/pci0000:00/0000:00:05.0/virtio2/block/vda");
  link_to(root, "sys/dev/block/254:1",
          "../../devices/pci0000:00/0000:00:05.0/virtio2/block/vda/vda1");
  put(root, "sys/devices/virtual/block/loop0/size", "0");
  link_to(root, "sys/block/loop0", "../devices/virtual/block/loop0");
  put(root, "sys/bus/pci/devices/0000:00:04.0/current_link_speed", "16.0 GT/s PCIe");
  put(root, "sys/bus/pci/devices/0000:00:04.0/max_link_speed", "16.0 GT/s PCIe");
  put(root, "sys/bus/pci/devices/0000:00:04.0/current_link_width", "8");
  put(root, "sys/bus/pci/devices/0000:00:04.0/max_link_width", "16");
  return root;
}

static void test_vm_sysfs(void **state) {
  (void)state;
  char *root = vm_sysfs();
  tz_topo *t = load_fixture("vm-1gpu.xml", "vm-1gpu.mountinfo", root);
  assert_int_equal(tz_topo_blockdev_count(t), 1); /* loop0 skipped */
  const struct tz_topo_blockdev *b = tz_topo_blockdev(t, 0);
  assert_string_equal(b->name, "vda");
  assert_int_equal(b->rotational, 1);
  assert_int_equal(b->size_bytes, 200ull << 30);
  assert_string_equal(b->busid, "0000:00:05.0");
  assert_int_equal(b->numa_node, 0);
  /* "/" through the partition's sysfs link, /boot/efi through its source name. */
  assert_int_equal(b->n_mounts, 2);
  assert_string_equal(tz_topo_mount(t, b->mounts[0])->path, "/");
  assert_string_equal(tz_topo_mount(t, b->mounts[1])->path, "/boot/efi");
  const struct tz_topo_gpu *g = tz_topo_gpu(t, 0);
  assert_int_equal(g->link.gen, 4);
  assert_int_equal(g->link.width, 8);
  assert_int_equal(g->link.max_gen, 4);
  assert_int_equal(g->link.max_width, 16);

  struct tz_topo_advice_params p;
  quiet_params(&p);
  p.swap_dirs[p.n_swap_dirs++] = "/var/lib/tz";
  p.swap_dirs[p.n_swap_dirs++] = "/dev/shm/tz";
  struct tz_topo_advice *a = advise(t, &p);
  print_warnings(a);
  const struct tz_topo_warning *w = tz_topo_advice_warning(a, "swap_dir_rotational", -1);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "/var/lib/tz"));
  assert_non_null(strstr(w->message, "vda"));
  w = tz_topo_advice_warning(a, "swap_dir_tmpfs", -1);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "/dev/shm/tz"));
  w = tz_topo_advice_warning(a, "pcie_link_degraded", 0);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "x8 of x16"));
  assert_null(tz_topo_advice_warning(a, "no_nvme", -2)); /* dirs were given */
  assert_int_equal(a->n_warnings, 3);
  /* The tmpfs dir has no disk, so it is local to nothing: only the disk's dir is advised. */
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, 0);
  assert_int_equal(pl->n_dirs, 1);
  assert_string_equal(pl->dirs[0], "/var/lib/tz");
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
  tz_test_rmdir(root);
}

/* ---- the CPU-only laptop --------------------------------------------------------------------- */

static void test_laptop(void **state) {
  (void)state;
  tz_topo *t = load_fixture("laptop.xml", NULL, NULL);
  /* The Intel iGPU (8086:9a49, class 0300) is not a GPU tierzero can use. */
  assert_int_equal(tz_topo_gpu_count(t), 0);
  assert_int_equal(tz_topo_nic_count(t), 1);
  assert_string_equal(tz_topo_nic(t, 0)->kind, "wifi");
  assert_string_equal(tz_topo_nic(t, 0)->name, "wlp0s20f3");
  assert_int_equal(tz_topo_blockdev_count(t), 1);
  struct tz_topo_advice_params p;
  quiet_params(&p);
  struct tz_topo_advice *a = advise(t, &p);
  assert_int_equal(a->n_placements, 1);
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, -1);
  assert_non_null(pl);
  assert_int_equal(pl->numa_node, 0);
  assert_cpus(&pl->progress_cpus, "0,4");
  assert_cpus(&pl->cpus, "1-3,5-7");
  assert_int_equal(pl->nic, -1);
  assert_int_equal(pl->n_nvme, 1);
  assert_int_equal(a->n_warnings, 0);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

/* The laptop's NVMe with an LVM root on dm-0 over its third partition. */
static void test_laptop_sysfs(void **state) {
  (void)state;
  char *root = tz_test_mkdtemp("topo-sysfs");
  assert_non_null(root);
  const char *nv = "sys/devices/pci0000:00/0000:00:1d.0/0000:01:00.0/nvme/nvme0/nvme0n1";
  char rel[256], target[256];
  snprintf(rel, sizeof rel, "%s/size", nv);
  put(root, rel, "1000215216");
  snprintf(rel, sizeof rel, "%s/dev", nv);
  put(root, rel, "259:0");
  snprintf(rel, sizeof rel, "%s/queue/rotational", nv);
  put(root, rel, "0");
  for (int i = 1; i <= 3; i++) {
    snprintf(rel, sizeof rel, "%s/nvme0n1p%d/dev", nv, i);
    char dev[16];
    snprintf(dev, sizeof dev, "259:%d", i);
    put(root, rel, dev);
  }
  put(root, "sys/devices/pci0000:00/0000:00:1d.0/0000:01:00.0/nvme/nvme0/model",
      "SAMSUNG MZVL2512HCJQ-00BL7              ");
  snprintf(rel, sizeof rel, "%s/device", nv);
  link_to(root, rel, "../../nvme0");
  snprintf(target, sizeof target, "../%s", nv + 4);
  link_to(root, "sys/block/nvme0n1", target);
  snprintf(target, sizeof target, "../../%s/nvme0n1p2", nv + 4);
  link_to(root, "sys/dev/block/259:2", target);
  put(root, "sys/devices/virtual/block/dm-0/size", "990000000");
  put(root, "sys/devices/virtual/block/dm-0/dev", "253:0");
  put(root, "sys/devices/virtual/block/dm-0/queue/rotational", "0");
  snprintf(target, sizeof target, "../../../../%s/nvme0n1p3", nv + 8);
  link_to(root, "sys/devices/virtual/block/dm-0/slaves/nvme0n1p3", target);
  link_to(root, "sys/block/dm-0", "../devices/virtual/block/dm-0");

  tz_topo *t = load_fixture("laptop.xml", "laptop.mountinfo", root);
  assert_int_equal(tz_topo_blockdev_count(t), 2);
  int nvme = tz_topo_blockdev_find(t, "nvme0n1"), dm = tz_topo_blockdev_find(t, "dm-0");
  assert_int_equal(nvme, 0); /* hardware first */
  assert_int_equal(dm, 1);
  const struct tz_topo_blockdev *b = tz_topo_blockdev(t, nvme);
  assert_string_equal(b->model, "SAMSUNG MZVL2512HCJQ-00BL7");
  assert_int_equal(b->rotational, 0);
  assert_string_equal(b->busid, "0000:01:00.0");
  assert_int_equal(b->n_mounts, 2);
  assert_string_equal(tz_topo_mount(t, b->mounts[0])->path, "/boot");
  assert_string_equal(tz_topo_mount(t, b->mounts[1])->path, "/boot/efi");
  const struct tz_topo_blockdev *d = tz_topo_blockdev(t, dm);
  assert_string_equal(d->kind, "dm");
  assert_int_equal(d->n_members, 1);
  assert_int_equal(d->members[0], nvme);
  assert_int_equal(d->numa_node, 0);
  assert_int_equal(d->n_mounts, 1);
  assert_string_equal(tz_topo_mount(t, d->mounts[0])->path, "/");
  assert_int_equal(tz_topo_endpoint_count(t), 2); /* the wifi NIC and the NVMe; dm has no PCI */
  /* mountinfo's \040 is a space. */
  int mi = tz_topo_mount_for_path(t, "/home/dana/My Data/ckpt");
  assert_string_equal(tz_topo_mount(t, mi)->fstype, "fuse.sshfs");

  struct tz_topo_advice_params p;
  quiet_params(&p);
  struct tz_topo_advice *a = advise(t, &p);
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(a, -1);
  assert_int_equal(pl->n_dirs, 1); /* "/" on dm-0 over NVMe; /boot and /boot/efi left out */
  assert_string_equal(pl->dirs[0], "/");
  tz_topo_advice_destroy(a);

  p.swap_dirs[p.n_swap_dirs++] = "/tmp/tz";
  p.swap_dirs[p.n_swap_dirs++] = "/home/dana/My Data/ckpt";
  a = advise(t, &p);
  print_warnings(a);
  assert_non_null(tz_topo_advice_warning(a, "swap_dir_tmpfs", -1));
  const struct tz_topo_warning *w = tz_topo_advice_warning(a, "swap_dir_unknown", -1);
  assert_non_null(w);
  assert_non_null(strstr(w->message, "fuse.sshfs"));
  assert_int_equal(a->n_warnings, 2);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
  tz_test_rmdir(root);
}

/* ---- the report ------------------------------------------------------------------------------ */

static json_t *report_json(const tz_topo *t, const struct tz_topo_advice *a) {
  char *buf = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&buf, &n);
  TZ_ASSERT_OK(tz_topo_json(f, t, a, NULL));
  fclose(f);
  json_error_t err;
  json_t *j = json_loads(buf, 0, &err);
  if (!j)
    print_error("JSON does not parse: %s at line %d\n%s\n", err.text, err.line, buf);
  assert_non_null(j);
  free(buf);
  return j;
}

static void test_json_fixture(void **state) {
  (void)state;
  tz_topo *t = load_fixture("dgx-h100.xml", "dgx-h100.mountinfo", NULL);
  struct tz_topo_advice_params p;
  quiet_params(&p);
  p.thp = "never";
  struct tz_topo_advice *a = advise(t, &p);
  json_t *j = report_json(t, a);
  assert_string_equal(json_string_value(json_object_get(j, "schema")), "tierzero.topo");
  assert_int_equal(json_integer_value(json_object_get(j, "schema_version")), 1);
  json_t *src = json_object_get(j, "source");
  assert_true(json_is_false(json_object_get(src, "live")));
  assert_true(json_is_null(
      json_object_get(json_array_get(json_object_get(j, "numa_nodes"), 0), "free_bytes")));
  json_t *gpus = json_object_get(j, "gpus");
  assert_int_equal(json_array_size(gpus), 8);
  json_t *g0 = json_array_get(gpus, 0);
  assert_string_equal(json_string_value(json_object_get(g0, "pci_bus_id")), "0000:1b:00.0");
  assert_string_equal(json_string_value(json_object_get(g0, "device_id")), "2330");
  assert_string_equal(json_string_value(json_object_get(g0, "local_cpus")), "0-7,16-23");
  assert_true(json_is_null(json_object_get(json_object_get(g0, "pcie"), "gen")));
  json_t *b0 = json_array_get(json_object_get(j, "block_devices"), 0);
  assert_true(json_is_null(json_object_get(b0, "rotational")));
  assert_string_equal(
      json_string_value(json_object_get(json_array_get(json_object_get(b0, "mounts"), 0), "path")),
      "/mnt/nvme0");
  assert_int_equal(json_array_size(json_object_get(j, "nics")), 4);
  json_t *mx = json_object_get(j, "matrix");
  assert_int_equal(json_array_size(json_object_get(mx, "labels")), 20);
  assert_string_equal(
      json_string_value(json_array_get(json_array_get(json_object_get(mx, "classes"), 0), 1)),
      "PIX");
  assert_string_equal(json_string_value(json_array_get(json_object_get(mx, "kinds"), 19)), "block");
  json_t *adv = json_object_get(j, "advice");
  json_t *p0 = json_array_get(json_object_get(adv, "placements"), 0);
  assert_string_equal(json_string_value(json_object_get(p0, "cpus")), "1,17");
  assert_string_equal(json_string_value(json_object_get(p0, "nic")), "mlx5_0");
  assert_string_equal(json_string_value(json_array_get(json_object_get(p0, "dirs"), 0)),
                      "/mnt/nvme0");
  assert_string_equal(
      json_string_value(json_object_get(json_object_get(adv, "facts"), "memlock_bytes")),
      "unlimited");
  json_t *w0 = json_array_get(json_object_get(adv, "warnings"), 0);
  assert_string_equal(json_string_value(json_object_get(w0, "code")), "thp_disabled");
  assert_true(json_is_null(json_object_get(w0, "gpu")));
  json_decref(j);

  j = report_json(t, NULL);
  assert_true(json_is_null(json_object_get(j, "advice")));
  json_decref(j);

  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  TZ_ASSERT_OK(tz_topo_print(f, t, a, NULL));
  fclose(f);
  assert_non_null(strstr(text, "GPU0  0000:1b:00.0  NVIDIA H100 80GB HBM3"));
  assert_non_null(strstr(text, "[thp_disabled]"));
  assert_non_null(strstr(text, "PXB  = through several PCIe switches"));
  free(text);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

/* ---- this machine ---------------------------------------------------------------------------- */

/* NVIDIA display-class functions in sysfs: what the report must call GPUs. */
static int sysfs_nvidia_gpus(void) {
  DIR *d = opendir("/sys/bus/pci/devices");
  if (!d)
    return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char path[PATH_MAX], buf[32];
    unsigned vendor = 0, cls = 0;
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/vendor", e->d_name);
    FILE *f = fopen(path, "r");
    if (f) {
      if (fgets(buf, sizeof buf, f))
        vendor = (unsigned)strtoul(buf, NULL, 16);
      fclose(f);
    }
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%s/class", e->d_name);
    f = fopen(path, "r");
    if (f) {
      if (fgets(buf, sizeof buf, f))
        cls = (unsigned)strtoul(buf, NULL, 16);
      fclose(f);
    }
    n += vendor == 0x10de && (cls >> 16) == 0x03;
  }
  closedir(d);
  return n;
}

static void test_live(void **state) {
  (void)state;
  tz_topo *t = NULL;
  TZ_ASSERT_OK(tz_topo_load(NULL, &t));
  const struct tz_topo_machine *m = tz_topo_machine(t);
  assert_int_equal(m->live, 1);
  assert_null(m->xml_path);
  assert_true(m->n_pus >= 1 && m->n_cores >= 1 && m->n_numa >= 1);
  assert_true(m->nvml[0] != '\0');
  if (numa_available() >= 0) {
    assert_int_equal(m->free_known, 1);
    assert_int_equal(m->n_numa, numa_num_configured_nodes());
    for (int i = 0; i < m->n_numa; i++) {
      const struct tz_topo_numa *n = tz_topo_numa(t, i);
      assert_true(n->free_bytes >= 0 && (uint64_t)n->free_bytes <= n->total_bytes);
    }
  }
  /* Every CPU this process may run on is in some NUMA node's set. */
  cpu_set_t aff;
  assert_int_equal(sched_getaffinity(0, sizeof aff, &aff), 0);
  tz_cpuset all;
  tz_cpuset_zero(&all);
  for (int i = 0; i < m->n_numa; i++)
    tz_cpuset_or(&all, &tz_topo_numa(t, i)->cpus);
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &aff))
      assert_true(tz_cpuset_isset(&all, c));
  int want = sysfs_nvidia_gpus();
  if (want >= 0)
    assert_int_equal(tz_topo_gpu_count(t), want);
  /* Where NVML answered, it named every GPU it found, and NVLink classes are symmetric. */
  for (int g = 0; g < tz_topo_gpu_count(t); g++) {
    const struct tz_topo_gpu *gp = tz_topo_gpu(t, g);
    print_message("  GPU%d %s %s (%s), node %d\n", g, gp->busid, gp->name, gp->name_source,
                  gp->numa_node);
    if (!strncmp(m->nvml, "driver", 6) && strstr(m->nvml, "of") &&
        atoi(strstr(m->nvml, ", ") + 2) == tz_topo_gpu_count(t))
      assert_string_equal(gp->name_source, "nvml");
    for (int h = 0; h < tz_topo_gpu_count(t); h++) {
      int i = ep(t, TZ_TOPO_KIND_GPU, g), j = ep(t, TZ_TOPO_KIND_GPU, h);
      int a = 0, b = 0;
      assert_int_equal(tz_topo_link(t, i, j, &a), tz_topo_link(t, j, i, &b));
      assert_int_equal(a, b);
    }
  }
  for (int i = 0; i < tz_topo_blockdev_count(t); i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "/sys/block/%s", tz_topo_blockdev(t, i)->name);
    assert_int_equal(access(path, F_OK), 0);
  }
  assert_true(tz_topo_mount_for_path(t, "/") >= 0);
  /* A swap dir that does not exist yet, reached through a symlink, is on the link target's mount.
   */
  int shm = tz_topo_mount_for_path(t, "/dev/shm");
  if (shm >= 0 && strcmp(tz_topo_mount(t, shm)->path, "/dev/shm") == 0) {
    char *dir = tz_test_mkdtemp("topo-link");
    char *link = NULL, *deep = NULL;
    assert_true(asprintf(&link, "%s/shm", dir) > 0);
    assert_true(asprintf(&deep, "%s/not/yet/made", link) > 0);
    assert_int_equal(symlink("/dev/shm", link), 0);
    assert_int_equal(tz_topo_mount_for_path(t, deep), shm);
    unlink(link);
    free(link);
    free(deep);
    tz_test_rmdir(dir);
  }
  print_message("  live: %d NUMA nodes, %d cores, %d GPUs, %d block devices, %d NICs; NVML %s\n",
                m->n_numa, m->n_cores, tz_topo_gpu_count(t), tz_topo_blockdev_count(t),
                tz_topo_nic_count(t), m->nvml);

  struct tz_topo_advice *a = NULL;
  TZ_ASSERT_OK(tz_topo_advise(t, NULL, &a));
  assert_int_equal(a->n_placements, tz_topo_gpu_count(t) ? tz_topo_gpu_count(t) : 1);
  json_t *j = report_json(t, a);
  assert_true(json_is_true(json_object_get(json_object_get(j, "source"), "live")));
  assert_int_equal(json_array_size(json_object_get(j, "numa_nodes")), (size_t)m->n_numa);
  assert_int_equal(json_array_size(json_object_get(j, "gpus")), (size_t)tz_topo_gpu_count(t));
  assert_int_equal(json_array_size(json_object_get(j, "block_devices")),
                   (size_t)tz_topo_blockdev_count(t));
  json_decref(j);
  char *text = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&text, &n);
  TZ_ASSERT_OK(tz_topo_print(f, t, a, NULL));
  fclose(f);
  assert_non_null(strstr(text, "NUMA node"));
  free(text);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

static void test_live_binding(void **state) {
  (void)state;
  tz_topo *t = NULL;
  TZ_ASSERT_OK(tz_topo_load(NULL, &t));
  struct tz_topo_advice *a = NULL;
  TZ_ASSERT_OK(tz_topo_advise(t, NULL, &a));
  const struct tz_topo_placement *pl = &a->placements[0];
  assert_false(tz_cpuset_empty(&pl->cpus));
  cpu_set_t saved;
  assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);

  /* What the kernel reports after binding, not what was asked. */
  struct tz_topo_binding b;
  TZ_ASSERT_OK(tz_topo_bind_thread(t, &pl->cpus));
  TZ_ASSERT_OK(tz_topo_binding_readback(t, &b));
  assert_true(tz_cpuset_equal(&b.cpus, &pl->cpus));
  if (b.last_cpu >= 0)
    assert_true(tz_cpuset_isset(&pl->cpus, b.last_cpu));
  cpu_set_t now;
  assert_int_equal(sched_getaffinity(0, sizeof now, &now), 0);
  for (int c = 0; c < CPU_SETSIZE; c++)
    assert_int_equal(!!CPU_ISSET(c, &now), tz_cpuset_isset(&pl->cpus, c));
  if (!tz_cpuset_empty(&pl->progress_cpus)) {
    TZ_ASSERT_OK(tz_topo_bind_thread(t, &pl->progress_cpus));
    TZ_ASSERT_OK(tz_topo_binding_readback(t, &b));
    assert_true(tz_cpuset_equal(&b.cpus, &pl->progress_cpus));
  }

  /* Touched memory shows up on a node in numa_maps and in the page query. */
  size_t len = 8 << 20;
  char *buf = malloc(len);
  assert_non_null(buf);
  memset(buf, 1, len);
  TZ_ASSERT_OK(tz_topo_binding_readback(t, &b));
  uint64_t total = 0;
  for (int i = 0; i <= b.max_node; i++)
    total += b.node_bytes[i];
  assert_true(total >= len);
  int node = -2;
  TZ_ASSERT_OK(tz_topo_area_node(t, buf, len, &node));
  if (tz_topo_numa_count(t) == 1)
    assert_int_equal(node, tz_topo_numa(t, 0)->os_index);
  else
    assert_true(node >= -1);
  if (node >= 0)
    assert_true(b.node_bytes[node] > 0);
  char text[512];
  assert_true(tz_topo_binding_format(&b, text, sizeof text) > 0);
  assert_non_null(strstr(text, "resident: node"));
  print_message("  binding read back: %s\n", text);
  free(buf);

  tz_cpuset empty;
  tz_cpuset_zero(&empty);
  assert_int_equal(tz_topo_bind_thread(t, &empty), TZ_EINVAL);
  assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
}

/* Bandwidth through the nvme and host tiers into a temporary directory; GPU rows only with GPUs. */
static void test_live_measure(void **state) {
  (void)state;
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0) {
    print_message("  SKIP: the nvme tier cannot run here: %s\n", why);
    skip();
  }
  char *dir = tz_test_mkdtemp("topo-measure");
  assert_non_null(dir);
  tz_topo *t = NULL;
  TZ_ASSERT_OK(tz_topo_load(NULL, &t));
  struct tz_topo_advice_params ap;
  tz_topo_advice_params_init(&ap);
  ap.swap_dirs[ap.n_swap_dirs++] = dir;
  struct tz_topo_advice *a = advise(t, &ap);
  struct tz_topo_measure_params mp;
  tz_topo_measure_params_init(&mp);
  mp.bytes = 8 << 20;
  mp.block = 256 << 10;
  mp.queue_depth = 4;
  mp.dirs[mp.n_dirs++] = dir;
  struct tz_topo_measured *m = NULL;
  TZ_ASSERT_OK(tz_topo_measure(t, a, &mp, &m));
  assert_int_equal(m->n, 2 + 2 * tz_topo_gpu_count(t));
  for (int i = 0; i < 2; i++) {
    const struct tz_topo_bandwidth *b = &m->items[i];
    assert_string_equal(b->kind, i ? "nvme_read" : "nvme_write");
    assert_string_equal(b->dir, dir);
    assert_int_equal(b->gpu, -1);
    if (b->error)
      print_error("%s: %s\n", b->kind, b->error);
    assert_null(b->error);
    assert_int_equal(b->bytes, 8 << 20);
    assert_true(b->gbps > 0);
    print_message("  %s %s: %.2f GB/s\n", b->kind, b->dir, b->gbps);
  }
  for (int i = 2; i < m->n; i++) /* h2d, d2h per GPU: measured, or saying why not */
    assert_true(m->items[i].gbps > 0 || m->items[i].error);
  /* The tier's file is gone afterwards. */
  DIR *d = opendir(dir);
  assert_non_null(d);
  int files = 0;
  for (struct dirent *e; (e = readdir(d));)
    files += e->d_name[0] != '.';
  closedir(d);
  assert_int_equal(files, 0);
  json_t *j = NULL;
  {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    TZ_ASSERT_OK(tz_topo_json(f, t, a, m));
    fclose(f);
    j = json_loads(buf, 0, NULL);
    free(buf);
  }
  assert_non_null(j);
  json_t *rows = json_object_get(j, "measured");
  assert_int_equal(json_array_size(rows), (size_t)m->n);
  assert_true(json_real_value(json_object_get(json_array_get(rows, 1), "gbps")) > 0);
  json_decref(j);
  tz_topo_measured_destroy(m);

  /* Nonsense parameters, and another machine's topology. */
  mp.block = 0;
  assert_int_equal(tz_topo_measure(t, a, &mp, &m), TZ_EINVAL);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
  t = load_fixture("laptop.xml", NULL, NULL);
  a = advise(t, NULL);
  assert_int_equal(tz_topo_measure(t, a, NULL, &m), TZ_ENOTSUP);
  tz_topo_measured_destroy(NULL);
  tz_topo_advice_destroy(a);
  tz_topo_destroy(t);
  tz_test_rmdir(dir);
}

/* ---- bad input ------------------------------------------------------------------------------- */

static int load_xml_rc(const char *xml) {
  struct tz_topo_load_params lp;
  tz_topo_load_params_init(&lp);
  lp.xml = xml;
  tz_topo *t = (tz_topo *)&lp; /* must come back NULL */
  int rc = tz_topo_load(&lp, &t);
  assert_null(t);
  return rc;
}

static void test_bad_input(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("topo-bad");
  assert_non_null(dir);
  char *missing = NULL;
  assert_true(asprintf(&missing, "%s/no-such-machine.xml", dir) > 0);
  assert_int_equal(load_xml_rc(missing), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), missing));
  assert_int_equal(load_xml_rc(dir), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "directory"));

  /* A fixture cut in half, text that is not XML, an empty file, XML that is not a topology. */
  size_t n;
  char *fixture = data_path("dgx-h100.xml");
  char *whole = slurp(fixture, &n);
  char *paths[4];
  paths[0] = write_temp(dir, "truncated.xml", whole, n / 2);
  paths[1] = write_temp(dir, "garbage.xml", "this is not a topology\n", 23);
  paths[2] = write_temp(dir, "empty.xml", "", 0);
  paths[3] = write_temp(dir, "other.xml", "<?xml version=\"1.0\"?>\n<html><body/></html>\n", 43);
  for (int i = 0; i < 4; i++) {
    assert_int_equal(load_xml_rc(paths[i]), TZ_EFORMAT);
    assert_non_null(strstr(tz_err_msg(), paths[i]));
    print_message("  %s\n", tz_err_msg());
    free(paths[i]);
  }
  free(whole);

  /* A mount table that is not one, and one that is missing. */
  struct tz_topo_load_params lp;
  tz_topo_load_params_init(&lp);
  lp.xml = fixture;
  char *bad_mi =
      write_temp(dir, "mountinfo", "28 1 254:1 / / rw - ext4 /dev/vda1 rw\nnonsense\n", 48);
  lp.mountinfo = bad_mi;
  tz_topo *t = NULL;
  assert_int_equal(tz_topo_load(&lp, &t), TZ_EFORMAT);
  assert_non_null(strstr(tz_err_msg(), ":2:"));
  lp.mountinfo = missing;
  assert_int_equal(tz_topo_load(&lp, &t), TZ_ENOENT);
  lp.mountinfo = NULL;
  lp.sysfs_root = missing;
  assert_int_equal(tz_topo_load(&lp, &t), TZ_ENOENT);
  assert_null(t);

  /* Binding needs this machine. */
  t = load_fixture("dgx-h100.xml", NULL, NULL);
  tz_cpuset s;
  tz_cpuset_parse(&s, "0");
  assert_int_equal(tz_topo_bind_thread(t, &s), TZ_ENOTSUP);
  struct tz_topo_binding b;
  assert_int_equal(tz_topo_binding_readback(t, &b), TZ_ENOTSUP);
  int node;
  assert_int_equal(tz_topo_area_node(t, &node, sizeof node, &node), TZ_ENOTSUP);
  tz_topo_destroy(t);
  tz_topo_destroy(NULL);
  assert_int_equal(tz_topo_load(NULL, NULL), TZ_EINVAL);
  free(bad_mi);
  free(fixture);
  free(missing);
  tz_test_rmdir(dir);
}

/* ---- the program ----------------------------------------------------------------------------- */

static int run(const char *args, char **out) {
  const char *bin = getenv("TZ_BIN");
  char *cmd = NULL;
  assert_true(asprintf(&cmd, "%s/tz-topo %s 2>&1", bin && *bin ? bin : "build/bin", args) > 0);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char *buf = NULL;
  size_t n = 0;
  FILE *m = open_memstream(&buf, &n);
  char chunk[4096];
  size_t r;
  while ((r = fread(chunk, 1, sizeof chunk, p)) > 0)
    fwrite(chunk, 1, r, m);
  fclose(m);
  int st = pclose(p);
  free(cmd);
  *out = buf;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_tool(void **state) {
  (void)state;
  char *xml = data_path("dgx-h100.xml"), *mi = data_path("dgx-h100.mountinfo");
  char *args = NULL, *out = NULL;
  assert_true(asprintf(&args, "--xml %s --mountinfo %s --swap-dir /mnt/nvme5 --thp never --json",
                       xml, mi) > 0);
  assert_int_equal(run(args, &out), 0);
  json_error_t err;
  json_t *j = json_loads(out, 0, &err);
  if (!j)
    print_error("%s\n", out);
  assert_non_null(j);
  json_t *adv = json_object_get(j, "advice");
  assert_int_equal(json_array_size(json_object_get(adv, "placements")), 8);
  assert_int_equal(json_array_size(json_object_get(adv, "warnings")), 5); /* 4 remote + THP */
  json_decref(j);
  free(out);
  free(args);

  assert_int_equal(run("--json", &out), 0);
  j = json_loads(out, 0, &err);
  assert_non_null(j);
  assert_true(json_is_true(json_object_get(json_object_get(j, "source"), "live")));
  json_decref(j);
  free(out);

  /* this machine's --swap-dir must be a directory here (issue 48 item 5: it exited 0) */
  assert_int_equal(run("--swap-dir /nonexistent-tz-dir", &out), 2);
  assert_non_null(strstr(out, "--swap-dir /nonexistent-tz-dir: No such file or directory"));
  free(out);

  assert_int_equal(run("", &out), 0);
  assert_non_null(strstr(out, "This machine"));
  assert_non_null(strstr(out, "Advice:"));
  free(out);

  /* --bind: the CPUs read back are the ones the advice printed beside them. */
  if (sysfs_nvidia_gpus() == 0) {
    assert_int_equal(run("--bind -1", &out), 0);
    const char *got = strstr(out, "read back: cpus ");
    const char *want = strstr(out, "I/O and optimizer threads on cpus ");
    assert_non_null(got);
    assert_non_null(want);
    got += strlen("read back: cpus ");
    want += strlen("I/O and optimizer threads on cpus ");
    size_t n = strcspn(want, " ");
    assert_true(n > 0);
    assert_memory_equal(got, want, n);
    assert_true(got[n] == ' ' || got[n] == ',');
    free(out);
  }
  assert_int_equal(run("--bind 99", &out), 2);
  free(out);

  assert_int_equal(run("--xml /nonexistent/topo.xml", &out), 1);
  assert_non_null(strstr(out, "/nonexistent/topo.xml"));
  assert_null(strstr(out, "Advice"));
  free(out);
  assert_int_equal(run("--pinned-pool lots", &out), 2);
  free(out);
  free(xml);
  free(mi);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cpuset),          cmocka_unit_test(test_dgx_inventory),
      cmocka_unit_test(test_dgx_matrix),      cmocka_unit_test(test_dgx_advice),
      cmocka_unit_test(test_dgx_swap_dirs),   cmocka_unit_test(test_machine_warnings),
      cmocka_unit_test(test_vm_pci_only_gpu), cmocka_unit_test(test_vm_sysfs),
      cmocka_unit_test(test_laptop),          cmocka_unit_test(test_laptop_sysfs),
      cmocka_unit_test(test_json_fixture),    cmocka_unit_test(test_live),
      cmocka_unit_test(test_live_binding),    cmocka_unit_test(test_live_measure),
      cmocka_unit_test(test_bad_input),       cmocka_unit_test(test_tool),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
