/* The window: copies of blocks in the compute tier, their eviction, the instances (a phase in a
 * given step) reserved ahead of the client, strictly in order, and what the pump is to issue next
 * (tz_sched_decide). */
#define _GNU_SOURCE
#include "core/sched_internal.h"

#include <stdlib.h>

/* ---- copies ---- */

static void check_budget(tz_sched *s) {
  if (s->used > s->peak)
    s->peak = s->used;
  if (s->used > s->budget) {
    s->over++;
    fail_locked(s, TZ_ENOMEM, "sched: %llu bytes in use exceed the budget of %llu (a bug)",
                (unsigned long long)s->used, (unsigned long long)s->budget);
  }
}

static int evictable(const struct block *b) {
  const struct copy *c = &b->c;
  return c->ext.tier && c->pins == 0 && c->writers == 0 && !c->filling && !c->flushing &&
         c->gen <= b->home_gen && !b->storing;
}

void tz_sched_copy_free(tz_sched *s, struct block *b, const char *why) {
  struct copy *c = &b->c;
  dbg(s, "free '%s' (%s): %llu bytes, used %llu of %llu", b->name, why, (unsigned long long)b->size,
      (unsigned long long)(s->used - b->size), (unsigned long long)s->budget);
  tz_arena_free(s->arena, c->ext.offset - s->region.offset);
  s->used -= b->size;
  c->ext.tier = NULL;
  c->fill_no++; /* no transfer of the copy that went publishes its fence on a later one */
  c->flush_no++;
  tz_fence_release(c->ready);
  tz_fence_release(c->flushed);
  tz_fence_release(c->writer);
  c->ready = c->flushed = c->writer = NULL;
  c->wait_home = 0;
}

static int push_act(tz_sched *s, struct xfer *x) {
  if (s->n_acts == s->cap_acts) {
    int cap = s->cap_acts ? 2 * s->cap_acts : 64;
    struct xfer **n = realloc(s->acts, sizeof *n * (size_t)cap);
    if (!n)
      return TZ_ENOMEM;
    s->acts = n;
    s->cap_acts = cap;
  }
  s->acts[s->n_acts++] = x;
  return 0;
}

/* Decides a transfer of b (a fill into its copy or a write-back to its home); the pumping thread
 * issues it and publishes its fence in the copy (issue), which is what the copy's users wait on:
 * until then tz_sched_enter waits on the host (DESIGN.md: until the inputs' transfers are
 * submitted), so a device lane is always handed the transfer's own fence. */
void tz_sched_start_xfer(tz_sched *s, struct block *b, int kind, int refill, uint64_t step) {
  struct copy *c = &b->c;
  struct xfer *x = calloc(1, sizeof *x);
  if (!x || push_act(s, x) < 0) {
    free(x);
    fail_locked(s, TZ_ENOMEM, "sched: no memory for a transfer of block '%s'", b->name);
    return;
  }
  uint64_t now = tz_now_ns();
  *x = (struct xfer){.s = s,
                     .b = b,
                     .kind = kind,
                     .refill = refill,
                     .n = b->xfer,
                     .gen = c->gen,
                     .step = step,
                     .t0 = now,
                     .need = kind == ACT_FILL ? c->need : s->next_seq,
                     .chunk = -1};
  if (kind == ACT_FILL) {
    x->dst = c->ext;
    x->src = b->home;
    x->lane = b->xl_in;
    c->filling = 1;
    tz_fence_release(c->ready);
    c->ready = NULL;
    x->no = ++c->fill_no;
  } else {
    x->dst = b->home;
    x->src = c->ext;
    x->lane = b->xl_out;
    c->flushing = 1;
    tz_fence_release(c->flushed);
    c->flushed = NULL;
    x->no = ++c->flush_no;
  }
  s->n_xfers++;
  __atomic_add_fetch(&s->outstanding, 1, __ATOMIC_ACQ_REL);
  tz_sched_xlane_begin(s, x->lane, x->n, now);
  dbg(s, "%s '%s' generation %llu: %llu bytes %s",
      kind == ACT_FLUSH ? "write back"
      : refill          ? "refill stale"
                        : "fill",
      b->name, (unsigned long long)c->gen, (unsigned long long)x->n, s->xl[x->lane].name);
}

/* Whether b's copy may not serve a phase of `step`: without carry (tz_sched_params.carry 0) a
 * copy serves only the step that placed or last reserved it; the next reads it from its home. */
static int not_carried(const tz_sched *s, const struct block *b, uint64_t step) {
  return !s->p.carry && b->c.ext.tier && b->c.use_step < step;
}

/* Eviction order: stale copies first, and without carry those no later phase of their step uses;
 * with a known order the copy used farthest ahead of I's position (Belady), otherwise the least
 * recently reserved. */
static uint64_t evict_score(tz_sched *s, const struct block *b, const struct inst *I) {
  if (b->c.gen < b->gen || (s->order_n && b->n_pos == 0) || not_carried(s, b, I->step))
    return UINT64_MAX;
  if (!s->order_n || s->recording)
    return I->seq - b->c.last_use;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < b->n_pos; i++) {
    uint64_t d = (uint64_t)((b->pos[i] - I->pos + s->order_n) % s->order_n);
    if (d < best)
      best = d;
  }
  /* its next use is in the next step (at or before I's position), which reads it again */
  if (!s->p.carry && best >= (uint64_t)(s->order_n - I->pos))
    return UINT64_MAX;
  return best;
}

static int uses_block(const struct phase *ph, int id) {
  for (int i = 0; i < ph->n_uses; i++)
    if (ph->uses[i].block == id)
      return 1;
  return 0;
}

/* A copy that only its write-back in flight keeps from being evictable: it will be once that
 * ends, whatever else happens. Only a write-back to a home in memory the CPU addresses (host
 * memory: one copy over the link, milliseconds) is worth waiting for; one to the disk takes the
 * disk's time (a 470 MiB block at 0.65 GB/s: 0.75 s), and the reads the window waits to make
 * from that disk would wait behind it (the 15.5 B model's step on an H200: 1561 waits, the disk
 * idle 36% of the step, bound/step 0.77, against 0.92 in a run before the wait, on another
 * machine of the same kind). */
static int evictable_after_flush(const struct block *b) {
  const struct copy *c = &b->c;
  return c->ext.tier && c->flushing && c->pins == 0 && c->writers == 0 && !c->filling &&
         !b->storing && tz_tier_host_ptr(b->home.tier, b->home.offset) != NULL;
}

/* Frees one evictable copy, not one of I's own unless own is set. 1 if it freed one; 0 if none
 * can go; -1 if I should wait instead: I is brought in ahead of need (the client does not wait
 * for it yet, or the compute lane still has phases to run) and a copy whose write-back is in
 * flight is used later than every copy that could go now. Evicting the one used sooner would
 * bring it in again (a block the backward reads again, where the optimizer's state just written
 * back is not used before the next step); waiting costs only the rest of that write-back, while
 * the lane computes. */
static int evict_one(tz_sched *s, const struct inst *I, int own) {
  const struct phase *ph = &s->phases[I->phase];
  struct block *victim = NULL;
  uint64_t best = 0, later = 0;
  int prefetch = s->p.wait_for_write_back && s->order_n && !s->recording &&
                 (s->waiting != I || s->n_running > 0);
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (!own && uses_block(ph, i))
      continue;
    if (!evictable(b)) {
      if (prefetch && evictable_after_flush(b)) {
        uint64_t sc = evict_score(s, b, I);
        later = sc > later ? sc : later;
      }
      continue;
    }
    uint64_t sc = evict_score(s, b, I);
    if (!victim || sc > best) {
      victim = b;
      best = sc;
    }
  }
  if (victim && best != UINT64_MAX && later > best)
    return -1;
  if (!victim)
    return 0;
  s->st.evictions++;
  tz_sched_copy_free(s, victim, best == UINT64_MAX ? "evicted, not needed again" : "evicted");
  return 1;
}

/* A compute instance I must wait for an earlier home instance J (in the list: not completed) when
 * J writes a block I uses (I's copy must be brought in from J's result, after J's fence), or when
 * I writes a block used in place that J uses (both work on the one home). The compute lane is
 * then never handed a home-lane fence: J has completed before I enters. Once J has entered, the
 * generation it makes is known, so I may be reserved beside it when I only reads such a block:
 * the copy is placed now and its fill waits for J (copy.wait_home), and so does I's enter; the
 * window looks on past I. Waiting to reserve I held the in-order window at the first forward
 * after a block the CPU steps, and with it every fill of the next step's optimizer state, until
 * the last update at the homes had ended (llama-3b offloaded: the next step's fills idle for 100
 * ms of the forward, test_home_written_read_reserved_ahead). And I may not write the copy of a
 * block J reads until J's generation of it is home (J entered, and the write-back it waits for
 * has completed): I's generation would be written back only after J, which waits for the one
 * before it. */
static int home_conflict(tz_sched *s, const struct inst *I) {
  const struct phase *ph = &s->phases[I->phase];
  for (const struct inst *J = s->head; J && J != I; J = J->next) {
    const struct phase *jh = &s->phases[J->phase];
    if (!jh->at_home)
      continue;
    for (int a = 0; a < jh->n_uses; a++)
      for (int k = 0; k < ph->n_uses; k++) {
        if (jh->uses[a].block != ph->uses[k].block)
          continue;
        const struct block *b = &s->blocks[ph->uses[k].block];
        int iw = (ph->uses[k].access & TZ_ACCESS_WRITE) != 0;
        if ((jh->uses[a].access & TZ_ACCESS_WRITE) && !(J->entered && !b->in_place && !iw))
          return 1;
        if (b->in_place && iw)
          return 1;
        if (iw && (!J->entered || J->want[a] > b->home_gen))
          return 1;
      }
  }
  return 0;
}

/* The uses of I's phase whose block needs a copy placed, into need[]. 0 when the phase must wait
 * (a block is being stored at its home, or a stale copy cannot go yet). */
static int reserve_needs(tz_sched *s, const struct inst *I, int *need, int *n_need) {
  const struct phase *ph = &s->phases[I->phase];
  for (int k = 0; k < ph->n_uses; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    if (b->in_place) /* nothing to place or bring in: the phase uses the home */
      continue;
    if (b->storing)
      return 0;
    if (b->c.ext.tier && b->c.gen < b->gen) { /* stale: never used */
      if (!evictable(b))
        return 0;
      tz_sched_copy_free(s, b, "stale");
    }
    /* Not carried into I's step: an idle copy goes and I reads the block from its home. One
     * still busy (its write-back in flight or not yet started, a fill or a phase of the step
     * before on it) makes I wait until it is idle, then goes the same way, unless waiting would
     * stall the lane: the client waits for I and the lane has nothing else to run. Then it
     * serves I, since its home gets those same bytes only when the write-back lands, and
     * waiting for that to read them back would stall I behind every write-back queued before it
     * (the step's first forward behind the whole folded update's, about a second on an H200).
     * Serving a busy copy any earlier would carry it: with a lookahead as long as a step, the
     * next step's use of every block written late in a step is placed while its write-back is
     * in flight. A use that only writes reads nothing to carry: the copy, busy or not, serves as
     * the place it writes (its enter waits for the copy's write-back in flight, and the lane runs
     * it after every phase before it). Waiting there would hold the window's in-order look at
     * the step's end: the folded update writes each layer's parameters, whose copies the last
     * backward reads, so no fill of the next step's optimizer state could start before the step
     * ended (test_not_carried_write_only_use_looks_ahead). */
    if (not_carried(s, b, I->step) && (ph->uses[k].access & TZ_ACCESS_READ)) {
      if (evictable(b))
        tz_sched_copy_free(s, b, "not carried into the next step");
      else if (s->waiting != I || s->n_running > 0)
        return 0;
    }
    if (!b->c.ext.tier)
      need[(*n_need)++] = k;
  }
  return 1;
}

/* Allocates the copies need[] lists (offs[]), evicting what can go; all or nothing. 0 when I
 * must wait for something to finish. */
static int reserve_alloc(tz_sched *s, struct inst *I, int *need, int *n_need, uint64_t *offs) {
  const struct phase *ph = &s->phases[I->phase];
  for (;;) {
    int got = 0;
    for (; got < *n_need; got++)
      if (tz_arena_alloc(s->arena, s->blocks[ph->uses[need[got]].block].size, &offs[got]) < 0)
        break;
    if (got == *n_need)
      return 1;
    while (got > 0)
      tz_arena_free(s->arena, offs[--got]);
    int ev = evict_one(s, I, 0);
    if (ev > 0)
      continue;
    if (ev < 0) {
      s->st.flush_waits++;
      return 0; /* a write-back in flight ends, and frees what is used latest */
    }
    /* Copies whose write-back was deferred (tz_sched_params.defer_rewrite) can go once written
     * back: the room is worth more than the write-back saved. */
    if (tz_sched_flush_deferred(s) > 0)
      return 0;
    /* Nothing else can go. If nothing is in flight either and the client waits for I, the bytes
     * fit (budget >= its working set) but the free space is cut up by I's own cached blocks:
     * drop those too and bring them in again. */
    int idle = s->n_running == 0 && s->n_xfers == 0 && s->head == I && s->waiting == I;
    if (idle && evict_one(s, I, 1) > 0) {
      for (int k = 0; k < ph->n_uses; k++) { /* what was evicted must now be placed too */
        const struct block *b = &s->blocks[ph->uses[k].block];
        if (!b->in_place && !b->c.ext.tier) {
          int listed = 0;
          for (int j = 0; j < *n_need; j++)
            listed |= need[j] == k;
          if (!listed)
            need[(*n_need)++] = k;
        }
      }
      continue;
    }
    if (idle)
      fail_locked(s, TZ_ENOMEM,
                  "sched: phase '%s' cannot be placed in an idle budget of %llu "
                  "bytes (%llu used): a bug",
                  ph->name, (unsigned long long)s->budget, (unsigned long long)s->used);
    return 0;
  }
}

/* The copies allocated at offs[] take their blocks' generation; every block of I gets a pin, and
 * a placed copy I reads is filled. 0 on a bug (kept as the scheduler's error). */
static int reserve_pin(tz_sched *s, struct inst *I, const int *need, int n_need,
                       const uint64_t *offs) {
  const struct phase *ph = &s->phases[I->phase];
  for (int j = 0; j < n_need; j++) {
    struct block *b = &s->blocks[ph->uses[need[j]].block];
    b->c.ext = (tz_extent){s->compute, s->region.offset + offs[j], b->size};
    b->c.gen = b->gen;
    b->c.need = I->seq;
    b->c.pins = b->c.writers = 0;
    b->c.unwritten = !(ph->uses[need[j]].access & TZ_ACCESS_READ);
    s->used += b->size;
  }
  for (int k = 0; k < ph->n_uses; k++) {
    const struct tz_block_use *u = &ph->uses[k];
    struct block *b = &s->blocks[u->block];
    int placed = 0;
    for (int j = 0; j < n_need; j++)
      placed |= need[j] == k;
    b->c.pins++;
    b->c.last_use = I->seq;
    b->c.use_step = I->step;
    if (b->in_place) {
      dbg(s, "step %llu phase '%s': '%s' is used in place (generation %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)b->gen);
    } else if (!placed) {
      s->st.hits++;
      dbg(s, "step %llu phase '%s': '%s' is there (%s, generation %llu)",
          (unsigned long long)I->step, ph->name, b->name, copy_state(b),
          (unsigned long long)b->c.gen);
    } else if ((u->access & TZ_ACCESS_READ) && b->home_gen != b->gen && b->home_writers > 0) {
      b->c.wait_home = 1; /* home_conflict: a home phase entered makes it; filled after */
      dbg(s, "step %llu phase '%s': place '%s' to be filled once generation %llu is home",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)b->gen);
    } else if (u->access & TZ_ACCESS_READ) {
      if (b->home_gen != b->gen) {
        fail_locked(s, TZ_EINVAL,
                    "sched: block '%s' has no copy and its home holds generation "
                    "%llu of %llu (a bug)",
                    b->name, (unsigned long long)b->home_gen, (unsigned long long)b->gen);
        return 0;
      }
      dbg(s, "step %llu phase '%s': place '%s' (%llu bytes, used %llu of %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)b->size,
          (unsigned long long)s->used, (unsigned long long)s->budget);
      tz_sched_start_xfer(s, b, ACT_FILL, 0, I->step);
    } else {
      dbg(s, "step %llu phase '%s': place '%s' to be written, not filled (used %llu of %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)s->used,
          (unsigned long long)s->budget);
    }
  }
  return 1;
}

/* Reserves instance I: every block it uses gets a copy (found, or allocated and filled) and a pin.
 * All or nothing. 1 when reserved, 0 when it must wait for something to finish. A home phase
 * takes nothing: it is reserved at once. */
static int try_reserve(tz_sched *s, struct inst *I) {
  const struct phase *ph = &s->phases[I->phase];
  if (ph->at_home) {
    I->reserved = 1;
    return 1;
  }
  if (home_conflict(s, I))
    return 0;
  int need[TZ_SCHED_MAX_USES], n_need = 0;
  uint64_t offs[TZ_SCHED_MAX_USES];
  if (!reserve_needs(s, I, need, &n_need) || !reserve_alloc(s, I, need, &n_need, offs) ||
      !reserve_pin(s, I, need, n_need, offs))
    return 0;
  check_budget(s);
  I->reserved = 1;
  return 1;
}

/* ---- instances ---- */

struct inst *tz_sched_inst_new(tz_sched *s, uint64_t step, int pos, int phase) {
  struct inst *I = calloc(1, sizeof *I);
  if (!I) {
    fail_locked(s, TZ_ENOMEM, "sched: no memory for a phase");
    return NULL;
  }
  I->s = s;
  I->seq = s->next_seq++;
  I->step = step;
  I->pos = pos;
  I->phase = phase;
  I->prev = s->tail;
  if (s->tail)
    s->tail->next = I;
  else
    s->head = I;
  s->tail = I;
  s->n_ahead++;
  return I;
}

void tz_sched_inst_unlink(tz_sched *s, struct inst *I) {
  if (I->prev)
    I->prev->next = I->next;
  else
    s->head = I->next;
  if (I->next)
    I->next->prev = I->prev;
  else
    s->tail = I->prev;
}

/* Drops every instance created and not entered (the window's guesses), with their pins. */
void tz_sched_cancel_ahead(tz_sched *s) {
  struct inst *I = s->tail;
  while (I && !I->entered) {
    struct inst *prev = I->prev;
    if (I->reserved && !s->phases[I->phase].at_home) {
      const struct phase *ph = &s->phases[I->phase];
      for (int k = 0; k < ph->n_uses; k++)
        s->blocks[ph->uses[k].block].c.pins--;
    }
    dbg(s, "cancel step %llu phase '%s'", (unsigned long long)I->step, s->phases[I->phase].name);
    tz_sched_inst_unlink(s, I);
    free(I);
    s->n_ahead--;
    I = prev;
  }
  /* A copy placed for a cancelled writer holds nothing: it must not be found by anyone later. */
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (b->c.ext.tier && (b->c.unwritten || b->c.wait_home) && b->c.pins == 0)
      tz_sched_copy_free(
          s, b, b->c.unwritten ? "its writer was cancelled" : "its readers were cancelled");
  }
  s->wstep = s->step;
  s->wpos = s->pos;
}

/* ---- write-backs: which can start now, and the deferred ones ---- */

/* A running home phase reads an earlier generation of block id at home than its copy holds: the
 * write-back of the copy waits for it. (A home phase that waits for this very write-back reads
 * the generation it brings.) */
static int home_read_hold(tz_sched *s, int id) {
  const struct block *b = &s->blocks[id];
  for (const struct inst *I = s->head; I; I = I->next) {
    const struct phase *ph = &s->phases[I->phase];
    if (!I->entered || !ph->at_home)
      continue;
    for (int k = 0; k < ph->n_uses; k++)
      if (ph->uses[k].block == id && (ph->uses[k].access & TZ_ACCESS_READ) && I->want[k] < b->c.gen)
        return 1;
  }
  return 0;
}

/* With tz_sched_params.defer_rewrite: the next phase of the step to use block b is a compute
 * phase that writes its copy again (a gradient added into by the next micro-batch's backward),
 * so nothing reads b's home before then: a write-back now would be superseded, and that writer
 * would first wait for it to finish reading the copy, behind whatever the link out has queued.
 * Not while a sync waits or the scheduler closes; the window takes such a copy's room by
 * writing it back (tz_sched_flush_deferred). */
static int rewritten_next(const tz_sched *s, const struct block *b) {
  if (!s->p.defer_rewrite || s->syncing || s->closing || !s->order_n || s->recording ||
      !b->c.dirty_at)
    return 0;
  int next = -1; /* b->pos is ascending: built walking the order */
  for (int i = 0; i < b->n_pos && next < 0; i++)
    if (b->pos[i] >= b->c.dirty_at)
      next = b->pos[i];
  if (next < 0) /* its next use is in the next step */
    return 0;
  const struct phase *ph = &s->phases[s->order[next]];
  if (ph->at_home)
    return 0;
  for (int k = 0; k < ph->n_uses; k++)
    if (&s->blocks[ph->uses[k].block] == b)
      return (ph->uses[k].access & TZ_ACCESS_WRITE) != 0;
  return 0;
}

/* A write-back of block i that can start now: a dirty copy no running phase writes. */
static int flushable(tz_sched *s, int i) {
  const struct block *b = &s->blocks[i];
  const struct copy *c = &b->c;
  return c->ext.tier && !c->filling && !c->flushing && !c->wait_home && c->writers == 0 &&
         c->gen > b->home_gen && !home_read_hold(s, i);
}

int tz_sched_flush_deferred(tz_sched *s) {
  int n = 0;
  /* Only copies no reserved phase pins: a pinned one stays after its write-back, so writing it
   * back frees no room and its next writer waits for the write-back (a gradient accumulated
   * over micro-batches, written back after each while the window fills ahead: llama-7b at 8
   * micro-batches without carry, 28 GiB more out a step and the head's next micro-batch 0.28 s
   * behind it). */
  for (int i = 0; i < s->n_blocks && !s->err; i++)
    if (flushable(s, i) && rewritten_next(s, &s->blocks[i]) && s->blocks[i].c.pins == 0) {
      tz_sched_start_xfer(s, &s->blocks[i], ACT_FLUSH, 0, s->step);
      n++;
    }
  return n;
}

/* ---- deciding ---- */

/* Everything that can be decided now: the fills that waited for a home phase (copy.wait_home)
 * once its generation is home, write-backs of blocks no running phase writes (unless deferred:
 * rewritten_next), then the window's reservations, in order. Lock held. */
void tz_sched_decide(tz_sched *s) {
  if (s->err)
    return;
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (b->c.wait_home) { /* never dirty: nothing to write back */
      if (b->home_writers > 0 || b->storing)
        continue;
      if (b->home_gen != b->c.gen) {
        fail_locked(s, TZ_EINVAL,
                    "sched: block '%s' waited for generation %llu at home, which holds %llu "
                    "(a bug)",
                    b->name, (unsigned long long)b->c.gen, (unsigned long long)b->home_gen);
        return;
      }
      b->c.wait_home = 0;
      tz_sched_start_xfer(s, b, ACT_FILL, 0, b->c.use_step);
    } else if (flushable(s, i) && !rewritten_next(s, b)) {
      tz_sched_start_xfer(s, b, ACT_FLUSH, 0, s->step);
    }
  }
  if (s->closing)
    return;
  for (struct inst *I = s->head; I; I = I->next)
    if (!I->reserved && !try_reserve(s, I))
      return;
  while (!s->err && s->order_n && !s->recording && s->n_ahead < s->p.lookahead) {
    struct inst *I = tz_sched_inst_new(s, s->wstep, s->wpos, s->order[s->wpos]);
    if (!I)
      return;
    if (++s->wpos == s->order_n) {
      s->wpos = 0;
      s->wstep++;
    }
    if (!try_reserve(s, I))
      return;
  }
}
