/* The pump: issues what was decided under the lock (tz_sched_decide, by the window's rules in
 * sched_window.c),
 * staged transfers hop by hop, and takes in the completions of transfers and phases (through the
 * progress engine's poller). */
#define _GNU_SOURCE
#include "core/sched_internal.h"
#include "util/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the pump ---- */

/* Takes the home waits that can be signalled now (their generation is home, or an error is
 * kept) into out[0..n), which the caller signals with the lock dropped. Lock held. */
int tz_sched_home_waits_take(tz_sched *s, tz_fence **out, int max) {
  int n = 0;
  for (int i = 0; i < s->n_hw && n < max;) {
    const struct home_wait *w = &s->hw[i];
    if (s->err || s->blocks[w->block].home_gen >= w->gen) {
      out[n++] = w->f;
      s->hw[i] = s->hw[--s->n_hw];
    } else {
      i++;
    }
  }
  return n;
}

void tz_sched_home_waits_signal(tz_fence **fs, int n, int err, const char *msg) {
  for (int i = 0; i < n; i++) {
    if (err)
      tz_fence_signal_msg(fs[i], err, msg);
    else
      tz_fence_signal(fs[i], 0);
    tz_fence_release(fs[i]);
  }
}

static void xfer_done(void *arg, int rc);
static void hop_done(void *arg, int rc);
static void want_pump(tz_sched *s);

/* x at the tail of the FIFO (*head, *tail) linked by next. */
static void fifo_push(struct xfer **head, struct xfer **tail, struct xfer *x) {
  x->next = NULL;
  if (*tail)
    (*tail)->next = x;
  else
    *head = x;
  *tail = x;
}

static void hop_queue(tz_sched *s, struct xfer *x) { fifo_push(&s->hops, &s->hops_tail, x); }

/* Chunk k is free again: the first transfer waiting for one takes it. Lock held. */
static void chunk_put(tz_sched *s, int k) {
  struct xfer *x = s->chunk_wait;
  if (!x) {
    s->chunk_busy &= ~(1u << k);
    return;
  }
  s->chunk_wait = x->next;
  if (!s->chunk_wait)
    s->chunk_wait_tail = NULL;
  x->chunk = k;
  hop_queue(s, x);
}

/* Issues the next hop of a staged transfer. Without a chunk it waits in line for one (a chunk is
 * given back when the transfer holding it completes, whatever the phases do, so the line moves).
 * The fence the copy's users wait on is a fill's last copy into the compute tier and a
 * write-back's last copy out of it: on a device lane both are device copies with an event. */
static void issue_staged(struct xfer *x) {
  tz_sched *s = x->s;
  struct copy *c = &x->b->c;
  pthread_mutex_lock(&s->mu);
  if (x->chunk < 0) {
    int k = 0;
    while (k < s->n_chunks && (s->chunk_busy & (1u << k)))
      k++;
    if (k == s->n_chunks) {
      fifo_push(&s->chunk_wait, &s->chunk_wait_tail, x);
      pthread_mutex_unlock(&s->mu);
      return;
    }
    s->chunk_busy |= 1u << k;
    x->chunk = k;
    uint64_t held = (uint64_t)__builtin_popcount(s->chunk_busy);
    if (held > s->st.staging_peak)
      s->st.staging_peak = held;
  }
  pthread_mutex_unlock(&s->mu);
  uint64_t n = x->n - x->off < s->stage_chunk ? x->n - x->off : s->stage_chunk;
  tz_extent chunk = {s->stage_tier, s->stage_ext.offset + (uint64_t)x->chunk * s->stage_chunk,
                     s->stage_chunk};
  int kind = x->kind, last = x->off + n == x->n;
  int publish = last && (kind == ACT_FILL ? x->hop == 1 : x->hop == 0);
  uint64_t no = x->no;
  tz_fence *f;
  int rc = x->hop == 0 ? tz_transfer(s->rt, &chunk, 0, &x->src, x->off, n, &f)
                       : tz_transfer(s->rt, &x->dst, x->off, &chunk, 0, n, &f);
  if (rc < 0) {
    hop_done(x, rc);
    return;
  }
  if (tz_fence_then(f, hop_done, x) < 0) /* x may be gone after this */
    hop_done(x, tz_fence_wait(f, -1));
  pthread_mutex_lock(&s->mu);
  tz_fence **slot = kind == ACT_FILL ? &c->ready : &c->flushed;
  if (publish && c->ext.tier && (kind == ACT_FILL ? c->fill_no : c->flush_no) == no && !*slot) {
    *slot = f;
    f = NULL;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  tz_fence_release(f);
}

/* A hop of a staged transfer completed: the next hop or piece goes to the pump; after the last,
 * or on a failure, the chunk goes back and the transfer is done. */
static void hop_done(void *arg, int rc) {
  struct xfer *x = arg;
  tz_sched *s = x->s;
  uint64_t n = x->n - x->off < s->stage_chunk ? x->n - x->off : s->stage_chunk;
  pthread_mutex_lock(&s->mu);
  if (rc == 0 && x->hop == 0) {
    x->hop = 1;
  } else if (rc == 0 && x->off + n < x->n) {
    x->hop = 0;
    x->off += n;
  } else {
    if (x->chunk >= 0)
      chunk_put(s, x->chunk);
    x->chunk = -1;
    pthread_mutex_unlock(&s->mu);
    xfer_done(x, rc); /* which asks for a pump: a waiter may have got the chunk */
    return;
  }
  hop_queue(s, x);
  pthread_mutex_unlock(&s->mu);
  want_pump(s);
}

/* Issues a transfer and publishes its fence in the copy. xfer_done is registered first, so the
 * scheduler's bookkeeping (and on failure its message) comes before any waiter's callback. */
static void issue(struct xfer *x) {
  if (x->b->staged) {
    issue_staged(x);
    return;
  }
  tz_sched *s = x->s;
  struct copy *c = &x->b->c;
  int kind = x->kind;
  uint64_t no = x->no;
  tz_fence *f;
  int rc = tz_transfer(s->rt, &x->dst, 0, &x->src, 0, x->n, &f);
  if (rc < 0) {
    xfer_done(x, rc);
    return;
  }
  if (tz_fence_then(f, xfer_done, x) < 0) /* x is gone after this */
    xfer_done(x, tz_fence_wait(f, -1));
  pthread_mutex_lock(&s->mu);
  tz_fence **slot = kind == ACT_FILL ? &c->ready : &c->flushed;
  if (c->ext.tier && (kind == ACT_FILL ? c->fill_no : c->flush_no) == no && !*slot) {
    *slot = f;
    f = NULL;
  }
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  tz_fence_release(f);
}

/* ---- the line: params.queue_bytes ---- */

/* Whether x may be issued now: its lane has nothing queued, or room for it. Lock held. */
static int queue_fits(const tz_sched *s, const struct xfer *x) {
  const struct xlane *l = &s->xl[x->lane];
  return l->queued == 0 || l->queued + x->n <= s->p.queue_bytes;
}

/* The line's rule: x, next in line, goes when no earlier transfer of its lane waits (blocked)
 * and its lane has room; otherwise its lane is blocked for the rest of the line. */
static int line_goes(const tz_sched *s, const struct xfer *x, int *blocked) {
  if (!blocked[x->lane] && queue_fits(s, x))
    return 1;
  blocked[x->lane] = 1;
  return 0;
}

static void queue_count(tz_sched *s, struct xfer *x) {
  struct xlane *l = &s->xl[x->lane];
  l->queued += x->n;
  x->queued = 1;
  if (l->queued > s->st.queue_peak)
    s->st.queue_peak = l->queued;
}

/* Puts x into the line after every transfer whose need is not greater (struct xfer.need). */
static void line_insert(tz_sched *s, struct xfer *x) {
  if (!s->line_tail || s->line_tail->need <= x->need) {
    fifo_push(&s->line, &s->line_tail, x);
    return;
  }
  struct xfer **at = &s->line;
  while ((*at)->need <= x->need)
    at = &(*at)->next;
  x->next = *at;
  *at = x;
  s->st.line_jumps++;
}

/* Of the transfers decided (acts[0..n), in the order decided) and those in line, the ones that
 * go now into go[], the rest into the line: a transfer waits behind an earlier one of its lane,
 * and while its lane's queue has no room for it. Returns how many go. Lock held. */
static int queue_take(tz_sched *s, struct xfer **acts, int n, struct xfer **go) {
  int ngo = 0;
  for (int i = 0; i < n; i++) {
    struct xfer *x = acts[i];
    if (x->b->staged || !s->p.queue_bytes) {
      if (!x->b->staged)
        queue_count(s, x);
      go[ngo++] = x;
      continue;
    }
    line_insert(s, x);
    s->n_line++;
  }
  int blocked[MAX_XLANES] = {0};
  struct xfer *prev = NULL;
  for (struct xfer *x = s->line, *next; x; x = next) {
    next = x->next;
    if (!line_goes(s, x, blocked)) {
      prev = x;
      continue;
    }
    if (prev)
      prev->next = next;
    else
      s->line = next;
    if (s->line_tail == x)
      s->line_tail = prev;
    s->n_line--;
    queue_count(s, x);
    go[ngo++] = x;
  }
  for (struct xfer *x = s->line; x; x = x->next)
    if (!x->waited) {
      x->waited = 1;
      s->st.queue_waits++;
    }
  return ngo;
}

/* Whether the line has a transfer that may go now. Lock held. */
static int queue_ready(const tz_sched *s) {
  int blocked[MAX_XLANES] = {0};
  for (const struct xfer *x = s->line; x; x = x->next)
    if (line_goes(s, x, blocked))
      return 1;
  return 0;
}

void tz_sched_pump(tz_sched *s) {
  pthread_mutex_lock(&s->mu);
  if (s->pumping) {
    s->again = 1;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  s->pumping = 1;
  for (;;) {
    s->again = 0;
    tz_sched_decide(s);
    tz_fence *ready[32];
    int n_ready = tz_sched_home_waits_take(s, ready, 32);
    if (n_ready) {
      int err = s->err;
      char msg[512];
      snprintf(msg, sizeof msg, "%s", s->err_msg);
      pthread_mutex_unlock(&s->mu);
      tz_sched_home_waits_signal(ready, n_ready, err, msg);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (s->n_acts == 0 && !s->hops && !s->again && !queue_ready(s))
      break;
    struct xfer *hops = s->hops;
    s->hops = s->hops_tail = NULL;
    int n_in = s->n_acts, room = n_in + s->n_line;
    struct xfer *local[64];
    struct xfer **acts = room <= 64 ? local : malloc(sizeof *acts * (size_t)room);
    int n;
    if (!acts) { /* no memory: everything decided goes now, the line waits for the next pass */
      acts = s->acts;
      n = n_in;
      s->acts = NULL;
      s->cap_acts = 0;
    } else {
      n = queue_take(s, s->acts, n_in, acts);
    }
    s->n_acts = 0;
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < n; i++)
      issue(acts[i]);
    if (acts != local)
      free(acts);
    while (hops) { /* staged hops in the order they became ready */
      struct xfer *next = hops->next;
      issue_staged(hops);
      hops = next;
    }
    pthread_mutex_lock(&s->mu);
  }
  s->pumping = 0;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Asks the progress engine to pump (a callback never pumps on the thread that signalled it). */
static void want_pump(tz_sched *s) {
  __atomic_store_n(&s->pump_wanted, 1, __ATOMIC_RELEASE);
  tz_progress_kick(tz_runtime_progress(s->rt));
}

static void xfer_done(void *arg, int rc) {
  struct xfer *x = arg;
  tz_sched *s = x->s;
  struct block *b = x->b;
  struct copy *c = &b->c;
  char msg[512] = "";
  if (rc < 0)
    snprintf(msg, sizeof msg, "%s", tz_err_msg());
  uint64_t now = tz_now_ns();
  pthread_mutex_lock(&s->mu);
  s->n_xfers--;
  tz_sched_xlane_end(s, x->lane, now);
  if (x->queued)
    s->xl[x->lane].queued -= x->n;
  if (x->kind == ACT_FILL) {
    c->filling = 0;
    b->n_fills++;
    b->n_refills += (uint64_t)x->refill;
    s->st.fills++;
    s->st.refills += (uint64_t)x->refill;
    s->st.fill_bytes += x->n;
    if (rc < 0)
      fail_locked(s, rc, "sched: bringing block '%s' (%llu bytes) from %s into %s failed: %s",
                  b->name, (unsigned long long)x->n, tz_tier_name(x->src.tier),
                  tz_tier_name(x->dst.tier), msg);
  } else {
    c->flushing = 0;
    b->n_flushes++;
    s->st.flushes++;
    s->st.flush_bytes += x->n;
    if (rc == 0 && x->gen > b->home_gen)
      b->home_gen = x->gen;
    if (rc < 0)
      fail_locked(s, rc, "sched: writing block '%s' (%llu bytes) back to %s failed: %s", b->name,
                  (unsigned long long)x->n, tz_tier_name(x->dst.tier), msg);
  }
  dbg(s, "%s '%s' done in %.3f ms%s%s", x->kind == ACT_FILL ? "fill" : "write back", b->name,
      1e-6 * (double)(now - x->t0), rc < 0 ? ": " : "", rc < 0 ? msg : "");
  tz_sched_trace_add(s, x->kind == ACT_FILL ? TZ_TRACE_FILL : TZ_TRACE_FLUSH, 1 + x->lane, b->name,
                     x->t0, now, x->step, -1, x->n);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  free(x);
  want_pump(s);
  __atomic_sub_fetch(&s->outstanding, 1, __ATOMIC_ACQ_REL);
}

/* A phase's fence completed (on whatever thread signalled it: the compute lane's, for a CPU
 * lane): note when, and leave the rest to the progress engine. */
void tz_sched_inst_done(void *arg, int rc) {
  struct inst *I = arg;
  tz_sched *s = I->s;
  I->t_done = tz_now_ns();
  I->rc = rc;
  if (rc < 0)
    snprintf(I->msg, sizeof I->msg, "%s", tz_err_msg());
  I->next_done = __atomic_load_n(&s->completed, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(&s->completed, &I->next_done, I, 1, __ATOMIC_RELEASE,
                                      __ATOMIC_RELAXED))
    ;
  want_pump(s);
  __atomic_sub_fetch(&s->outstanding, 1, __ATOMIC_ACQ_REL);
}

/* The phase's pins drop, what it wrote is dirty (the pump writes it back). Lock held. */
static void inst_finish(tz_sched *s, struct inst *I) {
  int rc = I->rc;
  const char *msg = I->msg;
  uint64_t now = I->t_done;
  struct phase *ph = &s->phases[I->phase];
  for (int k = 0; k < ph->n_uses && ph->at_home; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    int a = ph->uses[k].access;
    b->running--;
    /* The home holds the latest generation once the last home writer has completed: compute
     * phases that use the block after it are reserved only then, so none made a later one. */
    if ((a & TZ_ACCESS_WRITE) && --b->home_writers == 0)
      b->home_gen = b->gen;
  }
  for (int k = 0; k < ph->n_uses && !ph->at_home; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    b->running--;
    b->c.pins--;
    if (ph->uses[k].access & TZ_ACCESS_WRITE) {
      b->c.writers--;
      b->c.dirty_at = s->order_n && !s->recording ? I->pos + 1 : 0;
    }
    /* In place, the home holds what the writers made once the last of them has completed (the
     * latest generation was made by the last writer entered, which is among them). */
    if (b->in_place && (ph->uses[k].access & TZ_ACCESS_WRITE) && b->c.writers == 0)
      b->home_gen = b->gen;
  }
  s->n_running--;
  uint64_t ready = I->wait.ready_ns ? I->wait.ready_ns : now;
  uint64_t compute = now > ready ? now - ready : 0;
  ph->runs++;
  ph->stall_ns += I->wait.stall_ns;
  ph->stalls += I->wait.stall_ns > 0;
  ph->compute_ns += compute;
  s->st.phases++;
  if (rc < 0)
    fail_locked(s, rc, "sched: %sphase '%s' of step %llu failed: %s", ph->at_home ? "home " : "",
                ph->name, (unsigned long long)I->step, msg);
  dbg(s, "step %llu phase '%s' done: stalled %.3f ms, computed %.3f ms",
      (unsigned long long)I->step, ph->name, 1e-6 * (double)I->wait.stall_ns,
      1e-6 * (double)compute);
  int tl = ph->at_home ? TRACE_HOME_LANE : 0;
  if (I->wait.stall_ns)
    tz_sched_trace_add(s, TZ_TRACE_STALL, tl, ph->name, ready - I->wait.stall_ns, ready, I->step,
                       I->phase, 0);
  tz_sched_trace_add(s, TZ_TRACE_COMPUTE, tl, ph->name, ready, now, I->step, I->phase, 0);
  struct step_rec *r = &s->steps[I->step % STEP_RING];
  if (r->live && r->step == I->step) {
    r->done++;
    if (now > r->t_last_done)
      r->t_last_done = now;
    if (!ph->at_home) { /* the step's stall and compute are the compute lane's */
      r->stall_ns += I->wait.stall_ns;
      r->compute_ns += compute;
      if (ready - I->wait.stall_ns < r->t_lane_begin)
        r->t_lane_begin = ready - I->wait.stall_ns;
    }
    tz_sched_step_check_done(s, r);
  }
  tz_sched_inst_unlink(s, I);
  tz_fence_release(I->done);
  free(I);
}

/* The progress engine's poller: finishes completed phases in the order they were entered, then
 * pumps. Returns the number of things it did. */
int tz_sched_poll(void *arg) {
  tz_sched *s = arg;
  struct inst *stack = __atomic_exchange_n(&s->completed, NULL, __ATOMIC_ACQUIRE);
  int wanted = __atomic_exchange_n(&s->pump_wanted, 0, __ATOMIC_ACQ_REL);
  if (!stack && !wanted)
    return 0;
  int n = 0;
  if (stack) {
    struct inst *fifo = NULL; /* the stack reversed: oldest first */
    while (stack) {
      struct inst *next = stack->next_done;
      stack->next_done = fifo;
      fifo = stack;
      stack = next;
    }
    pthread_mutex_lock(&s->mu);
    while (fifo) {
      struct inst *next = fifo->next_done;
      inst_finish(s, fifo);
      fifo = next;
      n++;
    }
    pthread_mutex_unlock(&s->mu);
  }
  tz_sched_pump(s);
  return n + 1;
}

/* Waits on the condition until done(s) holds or an error is kept. Lock held. what names the wait
 * in the timeout's message. */
int tz_sched_wait_until(tz_sched *s, int (*done)(tz_sched *s, void *arg), void *arg,
                        const char *what, int stop_on_error) {
  int64_t ms = s->p.timeout_ms > 0 ? s->p.timeout_ms : 60000;
  struct timespec dl = tz_deadline(CLOCK_MONOTONIC, (uint64_t)ms * 1000000ull);
  while (!done(s, arg)) {
    if (stop_on_error && s->err)
      return s->err;
    if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && !done(s, arg)) {
      fail_locked(s, TZ_ETIMEDOUT,
                  "sched: waited %.3f s for %s: %d phases running, %d "
                  "transfers in flight, %llu of %llu budget bytes used",
                  1e-3 * (double)ms, what, s->n_running, s->n_xfers, (unsigned long long)s->used,
                  (unsigned long long)s->budget);
      return s->err;
    }
  }
  return 0;
}
