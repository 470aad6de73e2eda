/* Stop requests (trainer/run/signals.h): SIGTERM and SIGINT set the pending signal instead of
 * ending the process; a second SIGINT ends it at once, by SIGINT; restore puts the old actions
 * back. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "testlib.h"
#include "trainer/run/signals.h"

static void test_term_then_int(void **state) {
  (void)state;
  TZ_ASSERT_OK(tz_signals_install());
  assert_int_equal(tz_signals_pending(), 0);
  raise(SIGTERM);
  assert_int_equal(tz_signals_pending(), SIGTERM);
  raise(SIGTERM); /* a repeated SIGTERM keeps the first request */
  assert_int_equal(tz_signals_pending(), SIGTERM);
  tz_signals_clear();
  assert_int_equal(tz_signals_pending(), 0);
  raise(SIGINT);
  assert_int_equal(tz_signals_pending(), SIGINT);
  tz_signals_clear();
  /* Installing again is harmless and clears. */
  raise(SIGTERM);
  TZ_ASSERT_OK(tz_signals_install());
  assert_int_equal(tz_signals_pending(), 0);
  tz_signals_restore();
  tz_signals_restore();
}

static volatile sig_atomic_t before;
static void count_term(int sig) {
  (void)sig;
  before++;
}

/* restore puts back the action that install replaced. */
static void test_restore(void **state) {
  (void)state;
  struct sigaction sa = {0}, old;
  sa.sa_handler = count_term;
  sigemptyset(&sa.sa_mask);
  assert_int_equal(sigaction(SIGTERM, &sa, &old), 0);
  TZ_ASSERT_OK(tz_signals_install());
  raise(SIGTERM);
  assert_int_equal(before, 0);
  assert_int_equal(tz_signals_pending(), SIGTERM);
  tz_signals_restore();
  raise(SIGTERM);
  assert_int_equal(before, 1);
  assert_int_equal(sigaction(SIGTERM, &old, NULL), 0);
}

/* In a child: the first SIGINT is a request, the second ends the process by SIGINT. */
static void test_second_sigint(void **state) {
  (void)state;
  int pipefd[2];
  assert_int_equal(pipe(pipefd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    close(pipefd[0]);
    if (tz_signals_install() < 0)
      _exit(2);
    raise(SIGINT);
    char c = (char)tz_signals_pending();
    if (write(pipefd[1], &c, 1) != 1)
      _exit(3);
    raise(SIGINT);
    _exit(4); /* not reached: the second SIGINT ends the process */
  }
  close(pipefd[1]);
  char c = 0;
  assert_int_equal(read(pipefd[0], &c, 1), 1);
  assert_int_equal(c, SIGINT);
  close(pipefd[0]);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGINT);
}

/* A stop requested by SIGTERM makes the next SIGINT immediate too. */
static void test_term_then_sigint_kills(void **state) {
  (void)state;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (tz_signals_install() < 0)
      _exit(2);
    raise(SIGTERM);
    if (tz_signals_pending() != SIGTERM)
      _exit(3);
    raise(SIGINT);
    _exit(4);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFSIGNALED(st));
  assert_int_equal(WTERMSIG(st), SIGINT);
}

/* A signal from another process, while the main thread sleeps: the flag, not the default. */
static void test_from_outside(void **state) {
  (void)state;
  TZ_ASSERT_OK(tz_signals_install());
  assert_int_equal(kill(getpid(), SIGTERM), 0);
  for (int i = 0; i < 1000 && !tz_signals_pending(); i++)
    usleep(1000);
  assert_int_equal(tz_signals_pending(), SIGTERM);
  tz_signals_restore();
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_term_then_int), cmocka_unit_test(test_restore),
      cmocka_unit_test(test_second_sigint), cmocka_unit_test(test_term_then_sigint_kills),
      cmocka_unit_test(test_from_outside),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
