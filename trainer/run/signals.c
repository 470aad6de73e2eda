/* Stop requests (signals.h). The handlers only touch lock-free atomics and async-signal-safe
 * calls (sigaction, raise, alarm, write, _exit). */
#define _GNU_SOURCE
#include "trainer/run/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the handler needs a lock-free int");

static atomic_int pending;
static atomic_int installed;
static atomic_uint grace;
static struct sigaction old_term, old_int, old_alrm;

/* The watchdog's end: nothing but write and _exit here. */
static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] =
      "tz-train: a stop was requested and the step has not ended within its grace "
      "(tierzero.stop_grace): the run cannot make progress (a library blocked? under ulimit -v, "
      "OpenBLAS retries an allocation forever); exiting now, nothing saved\n";
  ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)n;
  _exit(1);
}

static void on_signal(int sig) {
  int none = 0;
  int first = atomic_compare_exchange_strong(&pending, &none, sig);
  if (first && atomic_load(&grace) > 0)
    alarm(atomic_load(&grace));
  if (!first && sig == SIGINT) {
    /* A stop was requested already: this SIGINT means now. The signal is blocked while its
     * handler runs, so the re-raised one is delivered, to the default action, on return. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGINT, &dfl, NULL);
    raise(SIGINT);
  }
}

int tz_signals_install(void) {
  atomic_store(&pending, 0);
  if (atomic_load(&installed))
    return 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaddset(&sa.sa_mask, SIGINT);
  /* Interrupted reads and writes restart: the flag is polled between steps. */
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &sa, &old_term) < 0)
    return tz_err_errno(errno, "signals: cannot install a handler for SIGTERM");
  if (sigaction(SIGINT, &sa, &old_int) < 0) {
    int rc = tz_err_errno(errno, "signals: cannot install a handler for SIGINT");
    sigaction(SIGTERM, &old_term, NULL);
    return rc;
  }
  struct sigaction al;
  memset(&al, 0, sizeof al);
  al.sa_handler = on_alarm;
  sigemptyset(&al.sa_mask);
  if (sigaction(SIGALRM, &al, &old_alrm) < 0) {
    int rc = tz_err_errno(errno, "signals: cannot install a handler for SIGALRM");
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGINT, &old_int, NULL);
    return rc;
  }
  atomic_store(&installed, 1);
  return 0;
}

void tz_signals_restore(void) {
  if (!atomic_exchange(&installed, 0))
    return;
  alarm(0);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGALRM, &old_alrm, NULL);
}

int tz_signals_pending(void) { return atomic_load(&pending); }

void tz_signals_clear(void) {
  alarm(0);
  atomic_store(&pending, 0);
}

void tz_signals_set_grace(unsigned seconds) { atomic_store(&grace, seconds); }

void tz_signals_progress(void) {
  if (atomic_load(&pending))
    alarm(0);
}
