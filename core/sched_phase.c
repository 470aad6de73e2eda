/* The client contract (DESIGN.md): declare the phases, enter a phase, submit work to its lane,
 * leave it, end the step, sync, destroy. */
#define _GNU_SOURCE
#include "core/sched_internal.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- the client contract ---- */

static void order_changed(tz_sched *s, const char *what) {
  s->st.order_changes++;
  TZ_WARN("sched: step %llu: %s; the order is recorded again from this step",
          (unsigned long long)s->step, what);
  dbg(s, "order change at step %llu: %s", (unsigned long long)s->step, what);
  tz_sched_cancel_ahead(s);
  s->recording = 1;
}

/* I is reserved and every transfer its inputs wait for has been issued, so each has a fence of
 * its own to hand the lane (a device lane waits on those, never on the host). */
static int ready_to_enter(tz_sched *s, void *arg) {
  const struct inst *I = arg;
  if (!I->reserved)
    return 0;
  const struct phase *ph = &s->phases[I->phase];
  if (ph->at_home) /* its lane waits for what it needs; nothing to issue first */
    return 1;
  for (int k = 0; k < ph->n_uses; k++) {
    const struct copy *c = &s->blocks[ph->uses[k].block].c;
    if ((c->filling && !c->ready) || c->wait_home)
      return 0;
    if ((ph->uses[k].access & TZ_ACCESS_WRITE) && c->flushing && !c->flushed)
      return 0;
  }
  return 1;
}

static int enter_check(tz_sched *s, int phase) {
  if (s->err)
    return err_return(s);
  if (!s->declared || phase < 0 || phase >= s->n_phases)
    return tz_err_set(TZ_EINVAL, "sched: enter of phase %d: %s", phase,
                      s->declared ? "no such phase" : "no phases declared");
  if (s->open)
    return tz_err_set(TZ_EINVAL, "sched: enter of phase '%s' while '%s' is open (leave it first)",
                      s->phases[phase].name, s->phases[s->open->phase].name);
  return 0;
}

/* The instance entered now: the one the order expects, or, when another phase comes (the order
 * changed) or the window has none, a new one; the phase is recorded in the step's order. */
static int enter_instance(tz_sched *s, int phase, struct inst **out) {
  struct phase *ph = &s->phases[phase];
  /* The instance the order expects next: the window's first, or the next of the order. */
  struct inst *I = s->head;
  while (I && I->entered)
    I = I->next;
  if (!s->recording) {
    int expected = -1;
    if (I && I->step == s->step && I->pos == s->pos)
      expected = I->phase;
    else if (!I && s->pos < s->order_n)
      expected = s->order[s->pos];
    if (expected != phase) {
      char what[192];
      snprintf(what, sizeof what, "phase '%s' entered where '%s' was expected", ph->name,
               expected >= 0 ? s->phases[expected].name : "the end of the step");
      order_changed(s, what);
      I = NULL;
    }
  }
  if (!I) {
    I = tz_sched_inst_new(s, s->step, s->pos, phase);
    if (!I)
      return err_return(s);
    if (!s->recording && ++s->wpos == s->order_n) {
      s->wpos = 0;
      s->wstep++;
    }
  }
  if (s->pos == s->cur_cap) {
    int *n = realloc(s->cur, sizeof *n * (size_t)(2 * s->cur_cap));
    if (!n) {
      fail_locked(s, TZ_ENOMEM, "sched: no memory to record the order");
      return err_return(s);
    }
    s->cur = n;
    s->cur_cap *= 2;
  }
  s->cur[s->pos] = phase;
  *out = I;
  return 0;
}

/* Pumps, then waits until I is reserved and its inputs' transfers are issued (ready_to_enter).
 * Lock held, dropped while pumping. */
static int enter_wait(tz_sched *s, struct inst *I) {
  const struct phase *ph = &s->phases[I->phase];
  s->waiting = I;
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s);
  pthread_mutex_lock(&s->mu);
  char what[128];
  snprintf(what, sizeof what, "room for phase '%s' of step %llu and its transfers", ph->name,
           (unsigned long long)s->step);
  int rc = tz_sched_wait_until(s, ready_to_enter, I, what, 1);
  s->waiting = NULL;
  if (rc < 0 || s->err)
    return err_return(s);
  return 0;
}

/* A home wait for generation gen of block id at home; *f gets its fence, which the list holds
 * the creator's reference of. TZ_ENOMEM when there is no memory for it. */
static int home_wait_add(tz_sched *s, int id, uint64_t gen, tz_fence **f) {
  *f = NULL;
  if (s->n_hw == s->cap_hw) {
    int cap = s->cap_hw ? 2 * s->cap_hw : 16;
    struct home_wait *n = realloc(s->hw, sizeof *n * (size_t)cap);
    if (n) {
      s->hw = n;
      s->cap_hw = cap;
    }
  }
  if (s->n_hw < s->cap_hw)
    *f = tz_fence_create();
  if (!*f)
    return TZ_ENOMEM;
  s->hw[s->n_hw++] = (struct home_wait){*f, id, gen};
  return 0;
}

/* A home phase's view and inputs (fs[*nf..]). At the homes: the lane waits for the home to hold
 * the generation of a dirty copy (a home wait, signalled when the copy's write-back completes:
 * the write-back is decided as soon as the copy's writers have completed), or, in place, for the
 * last writer; a writer also for the last compute phase that used the block (its fills read the
 * home, its in-place work used it). Earlier home phases are before it on the home lane. The host
 * never waits here. */
static int enter_home(tz_sched *s, struct inst *I, struct tz_view *view, tz_fence **fs, int *nf) {
  const struct phase *ph = &s->phases[I->phase];
  int nhw0 = s->n_hw;
  view->lane = s->home_lane;
  view->scratch = NULL;
  view->scratch_bytes = 0;
  for (int k = 0; k < ph->n_uses; k++) {
    const struct tz_block_use *u = &ph->uses[k];
    struct block *b = &s->blocks[u->block];
    struct copy *c = &b->c;
    view->blocks[k].block = u->block;
    view->blocks[k].access = u->access;
    view->blocks[k].bytes = b->bytes;
    view->blocks[k].ptr = tz_tier_host_ptr(b->home.tier, b->home.offset);
    I->want[k] = b->gen;
    if (b->in_place && c->writer)
      fs[(*nf)++] = c->writer;
    if (!b->in_place && c->ext.tier && c->gen > b->home_gen) {
      tz_fence *f;
      if (home_wait_add(s, u->block, c->gen, &f) < 0) {
        while (s->n_hw > nhw0) { /* the waits made for this phase go with it */
          tz_fence *g = s->hw[--s->n_hw].f;
          tz_fence_signal(g, TZ_ENOMEM);
          tz_fence_release(g);
        }
        fail_locked(s, TZ_ENOMEM, "sched: no memory for home phase '%s'", ph->name);
        return err_return(s);
      }
      /* The lane holds it through fs (retained below); the list holds the creator's. */
      fs[(*nf)++] = f;
      dbg(s, "home phase '%s' waits for generation %llu of '%s' at home (%s)", ph->name,
          (unsigned long long)c->gen, b->name, copy_state(b));
    }
    if ((u->access & TZ_ACCESS_WRITE) && b->cuse)
      fs[(*nf)++] = b->cuse;
  }
  for (int k = 0; k < ph->n_uses; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    b->running++;
    if (ph->uses[k].access & TZ_ACCESS_WRITE) {
      b->gen++; /* made in the home; any copy is stale from now on */
      b->home_writers++;
    }
  }
  return 0;
}

/* A compute phase's view and inputs (fs[*nf..]), each its own fence (a device lane waits on each
 * one's event): each copy's fill, its last writer, and for a write its last write-back (which
 * reads the copy). Same-lane order already puts this phase after earlier readers. */
static int enter_compute(tz_sched *s, struct inst *I, struct tz_view *view, tz_fence **fs,
                         int *nf) {
  const struct phase *ph = &s->phases[I->phase];
  view->lane = s->lane;
  view->scratch_bytes = round_up(s->chunk, s->align);
  uint64_t off = s->region.offset + s->scratch_off;
  view->scratch = tz_tier_device_ptr(s->compute, off);
  if (!view->scratch)
    view->scratch = tz_tier_host_ptr(s->compute, off);
  for (int k = 0; k < ph->n_uses; k++) {
    const struct tz_block_use *u = &ph->uses[k];
    struct block *b = &s->blocks[u->block];
    struct copy *c = &b->c;
    view->blocks[k].block = u->block;
    view->blocks[k].access = u->access;
    view->blocks[k].bytes = b->bytes;
    if (b->in_place) {
      /* The home itself. The lane is handed the last writer's fence, as for a copy (on the one
       * in-order lane it has been passed already); there is no fill or write-back to wait for. */
      if (c->writer)
        fs[(*nf)++] = c->writer;
      view->blocks[k].ptr = tz_tier_device_ptr(b->home.tier, b->home.offset);
      if (!view->blocks[k].ptr)
        view->blocks[k].ptr = tz_tier_host_ptr(b->home.tier, b->home.offset);
      continue;
    }
    if (c->gen != b->gen) {
      fail_locked(s, TZ_EINVAL,
                  "sched: phase '%s' would use a stale copy of '%s' (generation "
                  "%llu, the block is at %llu): a bug",
                  ph->name, b->name, (unsigned long long)c->gen, (unsigned long long)b->gen);
      return err_return(s);
    }
    if (c->ready)
      fs[(*nf)++] = c->ready;
    if (c->writer)
      fs[(*nf)++] = c->writer;
    if ((u->access & TZ_ACCESS_WRITE) && c->flushed)
      fs[(*nf)++] = c->flushed;
    view->blocks[k].ptr = tz_tier_device_ptr(s->compute, c->ext.offset);
    if (!view->blocks[k].ptr)
      view->blocks[k].ptr = tz_tier_host_ptr(s->compute, c->ext.offset);
  }
  for (int k = 0; k < ph->n_uses; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    b->running++;
    s->st.in_place += (uint64_t)b->in_place;
    if (ph->uses[k].access & TZ_ACCESS_WRITE) {
      b->gen++;
      b->c.writers++;
      if (!b->in_place) {
        b->c.gen = b->gen;
        b->c.unwritten = 0;
      }
    }
  }
  return 0;
}

/* I is entered: its inputs are retained (the lane is handed them unlocked) and it is the open
 * phase. Returns the lane it runs on. */
static tz_lane *enter_commit(tz_sched *s, struct inst *I, tz_fence **fs, int nf) {
  const struct phase *ph = &s->phases[I->phase];
  for (int i = 0; i < nf; i++)
    tz_fence_retain(fs[i]);
  I->entered = 1;
  s->n_ahead--;
  s->n_running++;
  s->open = I;
  s->pos++;
  uint64_t now = tz_now_ns();
  struct step_rec *r = tz_sched_step_get(s, s->step, now);
  r->entered++;
  dbg(s, "enter step %llu %sphase '%s' (%d blocks, %d fences)", (unsigned long long)s->step,
      ph->at_home ? "home " : "", ph->name, ph->n_uses, nf);
  return ph->at_home ? s->home_lane : s->lane;
}

int tz_sched_enter(tz_sched *s, int phase, struct tz_view *view) {
  pthread_mutex_lock(&s->mu);
  struct inst *I = NULL;
  int rc = enter_check(s, phase);
  if (rc == 0)
    rc = enter_instance(s, phase, &I);
  if (rc == 0)
    rc = enter_wait(s, I);
  tz_fence *fs[3 * TZ_SCHED_MAX_USES];
  int nf = 0;
  if (rc == 0) {
    const struct phase *ph = &s->phases[phase];
    view->step = s->step;
    view->phase = phase;
    view->name = ph->name;
    view->n_blocks = ph->n_uses;
    rc = ph->at_home ? enter_home(s, I, view, fs, &nf) : enter_compute(s, I, view, fs, &nf);
  }
  if (rc < 0) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  tz_lane *lane = enter_commit(s, I, fs, nf);
  pthread_mutex_unlock(&s->mu);
  rc = tz_lane_wait_all(lane, fs, nf, &I->wait);
  for (int i = 0; i < nf; i++)
    tz_fence_release(fs[i]);
  if (rc < 0) {
    pthread_mutex_lock(&s->mu);
    fail_locked(s, rc, "sched: %s lane: %s", tz_lane_name(lane), tz_err_msg());
    rc = err_return(s);
    pthread_mutex_unlock(&s->mu);
  }
  return rc;
}

int tz_sched_submit(tz_sched *s, int (*fn)(void *arg), void *arg) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err     ? err_return(s)
           : !s->open ? tz_err_set(TZ_EINVAL, "sched: submit outside a phase")
                      : 0;
  tz_lane *lane = rc == 0 && s->phases[s->open->phase].at_home ? s->home_lane : s->lane;
  pthread_mutex_unlock(&s->mu);
  if (rc < 0)
    return rc;
  return tz_lane_submit(lane, fn, arg);
}

/* Records the open phase's fence; forced: also after an error (destroy closes what is open). */
int tz_sched_leave_open(tz_sched *s, int phase, int forced) {
  pthread_mutex_lock(&s->mu);
  struct inst *I = s->open;
  int rc = 0;
  if (s->err && !forced)
    rc = err_return(s);
  else if (!I || (phase >= 0 && I->phase != phase))
    rc = tz_err_set(TZ_EINVAL, "sched: leave of phase %d, but %s", phase,
                    I ? s->phases[I->phase].name : "no phase is open");
  tz_lane *lane = rc == 0 && s->phases[I->phase].at_home ? s->home_lane : s->lane;
  pthread_mutex_unlock(&s->mu);
  if (rc < 0)
    return rc;
  tz_fence *done;
  rc = tz_lane_record(lane, &done);
  if (rc < 0) {
    done = tz_fence_completed(rc);
    if (!done) /* out of memory twice over: the phase can only be waited for by destroy */
      return rc;
  }
  pthread_mutex_lock(&s->mu);
  const struct phase *ph = &s->phases[I->phase];
  I->done = done;
  for (int k = 0; k < ph->n_uses && !ph->at_home; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    tz_fence_release(b->cuse);
    b->cuse = tz_fence_retain(done);
    if (ph->uses[k].access & TZ_ACCESS_WRITE) {
      struct copy *c = &b->c;
      tz_fence_release(c->writer);
      c->writer = tz_fence_retain(done);
    }
  }
  s->open = NULL;
  __atomic_add_fetch(&s->outstanding, 1, __ATOMIC_ACQ_REL);
  dbg(s, "leave step %llu phase '%s'", (unsigned long long)I->step, ph->name);
  pthread_mutex_unlock(&s->mu);
  if (tz_fence_then(done, tz_sched_inst_done, I) < 0)
    tz_sched_inst_done(I, tz_fence_wait(done, -1));
  return rc;
}

int tz_sched_leave(tz_sched *s, int phase) { return tz_sched_leave_open(s, phase, 0); }

int tz_sched_step_end(tz_sched *s) {
  pthread_mutex_lock(&s->mu);
  int rc = 0;
  if (s->err) {
    rc = err_return(s);
  } else if (s->open) {
    rc = tz_err_set(TZ_EINVAL, "sched: step end while phase '%s' is open",
                    s->phases[s->open->phase].name);
  } else if (!s->declared) {
    rc = tz_err_set(TZ_EINVAL, "sched: step end before the phases are declared");
  }
  if (rc < 0) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  if (s->pos > 0 && !s->recording && s->pos != s->order_n) {
    char what[128];
    snprintf(what, sizeof what, "the step ended after %d phases; the order has %d", s->pos,
             s->order_n);
    order_changed(s, what);
  }
  if (s->recording && s->pos > 0) {
    if (s->pos > s->order_cap) { /* a phase more than once a step: the order outgrows the table */
      int *n = realloc(s->order, sizeof *n * (size_t)s->pos);
      if (!n) {
        fail_locked(s, TZ_ENOMEM, "sched: no memory for the order");
        rc = err_return(s);
        pthread_mutex_unlock(&s->mu);
        return rc;
      }
      s->order = n;
      s->order_cap = s->pos;
    }
    memcpy(s->order, s->cur, sizeof *s->order * (size_t)s->pos);
    s->order_n = s->pos;
    s->recording = 0;
    rc = tz_sched_index_order(s);
    if (rc < 0)
      fail_locked(s, rc, "%s", tz_err_msg());
    dbg(s, "order recorded: %d phases per step", s->order_n);
  }
  uint64_t now = tz_now_ns();
  struct step_rec *r = tz_sched_step_get(s, s->step, now);
  r->ended = 1;
  tz_sched_step_check_done(s, r);
  s->st.steps++;
  s->step++;
  s->pos = 0;
  if (s->n_ahead == 0) {
    s->wstep = s->step;
    s->wpos = 0;
  }
  if (s->p.trace_step >= 0 && s->step + 1 == (uint64_t)s->p.trace_step)
    s->trace_on = 1;
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s);
  return rc;
}

int tz_sched_dirty_blocks(tz_sched *s) {
  int n = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    const struct block *b = &s->blocks[i];
    n += b->c.ext.tier && (b->c.gen > b->home_gen || b->c.flushing);
  }
  return n;
}

static int all_saved(tz_sched *s, void *arg) {
  (void)arg;
  return s->n_running == 0 && tz_sched_dirty_blocks(s) == 0;
}

int tz_sched_sync(tz_sched *s) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err ? err_return(s) : 0;
  if (rc == 0 && s->open)
    rc = tz_err_set(TZ_EINVAL, "sched: sync while phase '%s' is open",
                    s->phases[s->open->phase].name);
  /* No write-back is deferred while the sync waits; the pump starts those deferred so far. */
  s->syncing++;
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s);
  pthread_mutex_lock(&s->mu);
  /* The last phase to complete may be the one that failed: its error is the sync's. */
  if (rc == 0 &&
      (tz_sched_wait_until(s, all_saved, NULL, "the phases entered and their write-backs", 1) < 0 ||
       s->err))
    rc = err_return(s);
  s->syncing--;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- declaring, and the end ---- */

int tz_sched_declare(tz_sched *s, const struct tz_phase_decl *phases, int n) {
  return tz_sched_declare_homes(s, phases, n, NULL);
}

int tz_sched_declare_homes(tz_sched *s, const struct tz_phase_decl *phases, int n,
                           const int *at_home) {
  pthread_mutex_lock(&s->mu);
  int rc = tz_sched_declare_tables(s, phases, n, at_home);
  pthread_mutex_unlock(&s->mu);
  if (rc == 0)
    tz_sched_pump(s); /* the window starts bringing in the first phases */
  return rc;
}

/* Destroying: the phase left open closed, the work in flight drained, home waits signalled, the
 * trace written; then sched.c frees what it made (tz_sched_free). */
static int all_quiet(tz_sched *s, void *arg) {
  (void)arg;
  return s->n_running == 0 && s->n_xfers == 0 && (s->err || tz_sched_dirty_blocks(s) == 0);
}

void tz_sched_destroy(tz_sched *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  int open = s->open != NULL;
  pthread_mutex_unlock(&s->mu);
  if (open)
    tz_sched_leave_open(s, -1, 1);
  pthread_mutex_lock(&s->mu);
  s->closing = 1;
  pthread_mutex_unlock(&s->mu);
  tz_sched_pump(s); /* home waits an error left pending are signalled with it */
  pthread_mutex_lock(&s->mu);
  /* Running phases and transfers must finish before their memory goes: wait as long as it
   * takes, saying so each timeout period. */
  while (tz_sched_wait_until(s, all_quiet, NULL,
                             "the scheduler's work to finish before destroying it", 0) < 0 &&
         !all_quiet(s, NULL))
    TZ_LOG_ERR("sched: destroy still waits for %d phases and %d transfers", s->n_running,
               s->n_xfers);
  tz_sched_cancel_ahead(s);
  tz_fence *left[32];
  int n_left;
  /* None once quiet; an error's too. */
  while ((n_left = tz_sched_home_waits_take(s, left, 32)) > 0) {
    pthread_mutex_unlock(&s->mu);
    tz_sched_home_waits_signal(left, n_left, TZ_ECANCELED, "sched: destroyed");
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  /* The last callbacks may still be on their way out; then the engine lets go of the poller
   * (tz_progress_remove waits until it is out of any call to it). */
  while (__atomic_load_n(&s->outstanding, __ATOMIC_ACQUIRE) > 0)
    usleep(50);
  if (s->polling)
    tz_progress_remove(tz_runtime_progress(s->rt), tz_sched_poll, s);
  if (s->trace_path && !s->trace_written && s->trace_complete &&
      tz_sched_trace_write(s, s->trace_path) < 0)
    TZ_LOG_ERR("%s", tz_err_msg());
  if (s->p.jitter_us > 0) {
    tz_progress_set_jitter(tz_runtime_progress(s->rt), 0, 0);
    tz_tier_set_copy_jitter(s->rt, 0, 0);
  }
  tz_sched_free(s);
}
