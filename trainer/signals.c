/* Stop requests (signals.h). The handler only touches lock-free atomics and async-signal-safe
 * calls (sigaction, raise). */
#define _GNU_SOURCE
#include "trainer/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#include "core/error.h"

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the handler needs a lock-free int");

static atomic_int pending;
static atomic_int installed;
static struct sigaction old_term, old_int;

static void on_signal(int sig) {
  int none = 0;
  if (!atomic_compare_exchange_strong(&pending, &none, sig) && sig == SIGINT) {
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
  atomic_store(&installed, 1);
  return 0;
}

void tz_signals_restore(void) {
  if (!atomic_exchange(&installed, 0))
    return;
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGINT, &old_int, NULL);
}

int tz_signals_pending(void) { return atomic_load(&pending); }

void tz_signals_clear(void) { atomic_store(&pending, 0); }
