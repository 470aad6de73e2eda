/* Stop requests for the trainer: SIGTERM (a scheduler's notice before it kills the job) and SIGINT
 * (Ctrl-C) set a flag instead of ending the process, so that the training loop can finish its
 * step, save a checkpoint and exit cleanly. A SIGINT that arrives when a stop is pending already
 * (a second Ctrl-C) is an impatient user: it restores the default action and re-raises, ending
 * the process at once. A repeated SIGTERM only keeps the request pending. */
#ifndef TZ_TRAINER_SIGNALS_H
#define TZ_TRAINER_SIGNALS_H

/* Installs the handlers (process-wide), remembering the actions they replace, and clears the
 * flag. A second call only clears the flag. TZ_EIO with the signal named if sigaction fails. */
int tz_signals_install(void);

/* Puts back the actions tz_signals_install replaced. No-op when not installed. */
void tz_signals_restore(void);

/* The first stop signal received since install or the last clear (SIGTERM or SIGINT), or 0.
 * Async-signal-safe and cheap: poll it once per step. */
int tz_signals_pending(void);

/* Forgets a received signal (after a save that the signal asked for, say). A later SIGINT is
 * again the first one. */
void tz_signals_clear(void);

/* The watchdog of a run that cannot make progress (a library blocked in a retry loop, say: OpenBLAS
 * under `ulimit -v`): once a stop is requested, the run has seconds (0: no watchdog, the default)
 * to reach the end of its step and tz_signals_progress; past them the process says so on stderr
 * and exits with status 1 at once, nothing saved. The run sets it before its steps and after each
 * (from its step times); async-signal-safe to read. */
void tz_signals_set_grace(unsigned seconds);
/* The run reached a step's end: a watchdog armed by a stop request is disarmed (the stop is
 * honoured from here, its checkpoint however long it takes). */
void tz_signals_progress(void);

#endif
