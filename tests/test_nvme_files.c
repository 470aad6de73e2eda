/* The nvme tier's swap files: none is left behind by a process killed with SIGKILL, and files an
 * older version left for a process that is gone are reclaimed by the next tier created in the
 * same directory, while those of a live process are left alone. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "testlib.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int count_tierzero_files(const char *dir) {
  DIR *d = opendir(dir);
  assert_non_null(d);
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strncmp(de->d_name, "tierzero-", 9) == 0) {
      print_message("left in %s: %s\n", dir, de->d_name);
      n++;
    }
  closedir(d);
  return n;
}

static int make_nvme(const char *dir, tz_runtime **rt, tz_tier **t) {
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  int rc = tz_runtime_create(&rp, rt);
  if (rc < 0)
    return rc;
  struct tz_tier_params p;
  tz_tier_params_init(&p);
  p.capacity = 8 << 20;
  p.paths[0] = dir;
  p.n_paths = 1;
  return tz_tier_create(*rt, "nvme", &p, t);
}

static void test_no_file_left_after_sigkill(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("nvme-kill");
  assert_non_null(dir);
  int ready[2];
  assert_int_equal(pipe(ready), 0);
  pid_t child = fork();
  assert_true(child >= 0);
  if (child == 0) {
    close(ready[0]);
    tz_runtime *rt;
    tz_tier *t;
    char ok = make_nvme(dir, &rt, &t) == 0 ? 'y' : 'n';
    if (ok != 'y')
      fprintf(stderr, "child: %s\n", tz_err_msg());
    if (write(ready[1], &ok, 1) != 1)
      _exit(2);
    for (;;)
      pause(); /* killed here, with the tier alive */
  }
  close(ready[1]);
  char ok = 0;
  assert_int_equal(read(ready[0], &ok, 1), 1);
  close(ready[0]);
  assert_int_equal(ok, 'y');
  assert_int_equal(kill(child, SIGKILL), 0);
  int status;
  assert_int_equal(waitpid(child, &status, 0), child);
  assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  assert_int_equal(count_tierzero_files(dir), 0);
  tz_test_rmdir(dir);
}

static void put_file(const char *path, size_t bytes) {
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
  close(fd);
}

static void test_dead_process_files_reclaimed(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("nvme-reclaim");
  assert_non_null(dir);
  /* A pid that is surely not alive: a child that has exited and been reaped. */
  pid_t dead = fork();
  assert_true(dead >= 0);
  if (dead == 0)
    _exit(0);
  assert_int_equal(waitpid(dead, NULL, 0), dead);
  char dead_file[512], live_file[512];
  snprintf(dead_file, sizeof dead_file, "%s/tierzero-%d-nvme-0.bin", dir, (int)dead);
  snprintf(live_file, sizeof live_file, "%s/tierzero-%d-nvme-0.bin", dir, (int)getppid());
  put_file(dead_file, 1 << 20);
  put_file(live_file, 1 << 20);
  tz_runtime *rt;
  tz_tier *t;
  TZ_ASSERT_OK(make_nvme(dir, &rt, &t));
  assert_int_equal(access(dead_file, F_OK), -1);
  assert_int_equal(access(live_file, F_OK), 0);
  tz_runtime_destroy(rt);
  assert_int_equal(access(live_file, F_OK), 0);
  unlink(live_file);
  tz_test_rmdir(dir);
}

int main(void) {
  char why[256];
  if (tz_tier_probe("nvme", why, sizeof why) < 0)
    tz_test_skip("%s", why);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_no_file_left_after_sigkill),
      cmocka_unit_test(test_dead_process_files_reclaimed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
