/* The README's main command: tz-train without arguments trains the demo to its end, and its loss
 * falls to at most 0.8 of the first. */
#include "testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_demo_loss_falls(void **state) {
  (void)state;
  const char *bin = getenv("TZ_BIN");
  assert_non_null(bin);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/tz-train 2>&1", bin);
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char line[1024];
  double first = -1, last = -1, ratio = -1;
  int steps = 0;
  /* The last lines, printed when the demo fails, so that the log says why. */
  static char tail[16][1024];
  int n_lines = 0;
  while (fgets(line, sizeof line, p)) {
    snprintf(tail[n_lines++ % 16], sizeof tail[0], "%s", line);
    if (strncmp(line, "step ", 5) == 0)
      steps++;
    if (sscanf(line, "tz-train: demo: loss %lf at the first step, %lf at the last (%lf", &first,
               &last, &ratio) == 3)
      print_message("%s", line);
  }
  int st = pclose(p);
  if (st != 0)
    for (int i = n_lines > 16 ? n_lines - 16 : 0; i < n_lines; i++)
      print_error("%s", tail[i % 16]);
  assert_int_equal(st, 0);
  assert_int_equal(steps, 100);
  assert_true(first > 0 && last > 0);
  assert_true(last <= 0.8 * first);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_demo_loss_falls)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
