/* The scheduler. docs/scheduler.md explains the rules; in short:
 *
 * - One mutex guards all state. Decisions are made under it; transfers are issued and promise
 *   fences signalled outside it, by whichever thread is "pumping" (the progress engine or the
 *   client), so a callback that fires at once from inside a transfer never re-enters a locked
 *   section. Completion callbacks do only what cannot wait (a phase's end is pushed on a stack,
 *   a fill's promise is signalled) and leave the rest to the progress engine, through a poller:
 *   the compute lane's thread goes straight on to its next job.
 * - A block has a home extent and at most one copy, in the compute tier, carved from the budget.
 *   Generation numbers: a writer's enter makes the block a new generation, which its copy will
 *   hold once the writer's fence completes; tz_sched_block_store makes one in the home. A copy is
 *   used only while it holds the block's generation.
 * - A block homed in the compute tier itself is used in place: it never has a copy, takes no
 *   budget and is never filled or written back; its home holds a writer's generation once the
 *   writer's fence completes. The compute lane runs phases in order, so its readers and writers
 *   are ordered by the lane (and by the last writer's fence, handed to the lane as for copies).
 * - Instances (a phase in a given step) are created and reserved strictly in order: the window
 *   walks the order across step boundaries and reserves the next instance only when every earlier
 *   one is reserved, so a later phase never holds bytes an earlier one waits for.
 * - A copy is freed only with no pins, no writer running, no fill or write-back in flight, and no
 *   unsaved generation; so a write-back needs no allocation and nothing is freed under a reader. */
#define _GNU_SOURCE
#include "core/sched.h"
#include "core/arena.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/sched_trace.h"
#include "core/tier_impl.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_XLANES 16
#define STEP_RING 256
#define TIMES_RING 256
#define MAX_SPANS (1 << 20)
#define TRACE_HOME_LANE (1 + MAX_XLANES) /* the home lane's spans; written after the others */

struct copy {
  tz_extent ext;      /* in the compute tier; tier NULL when there is no copy */
  uint64_t gen;       /* the generation it holds, or will once its fill or running writer is done */
  int pins;           /* instances reserved or running that use it, and loads reading it */
  int writers;        /* running instances that write it */
  int filling, flushing;
  int unwritten;      /* placed for a phase that overwrites it, which has not entered yet: its
                         bytes are nobody's until then */
  tz_fence *ready;    /* the transfer fence of its last fill; NULL while a fill is decided and not
                         yet issued, or when never filled (contents are the writer's) */
  tz_fence *flushed;  /* the transfer fence of its last write-back; NULL while one is decided and
                         not yet issued */
  uint64_t fill_no, flush_no; /* the transfer the fences above belong to (struct xfer.no) */
  tz_fence *writer;   /* the fence of the last writer that left */
  uint64_t last_use;  /* seq of the last instance that reserved it: LRU when the order is unknown */
};

struct block {
  char name[64];
  uint64_t bytes;     /* as the client gave it */
  uint64_t xfer;      /* bytes moved: rounded up to the home tier's alignment */
  uint64_t size;      /* bytes of the copy: xfer rounded up to the compute tier's alignment */
  tz_extent home;
  uint64_t gen;       /* the latest generation */
  uint64_t home_gen;  /* the generation the home holds */
  int storing;        /* tz_sched_block_store is writing the home */
  int running;        /* running instances that use it */
  struct copy c;
  uint64_t n_fills, n_flushes, n_refills;
  int *pos, n_pos;    /* positions in the order of a step where it is used */
  int xl_in, xl_out;  /* transfer lanes home -> compute and back; -1 for a block in place */
  int staged;         /* its transfers go through the scheduler's staging chunks (two hops) */
  int in_place;       /* homed in the compute tier: phases use the home, c holds no extent */
  int home_writers;   /* running home phases that write it */
  tz_fence *cuse;     /* the fence of the last compute-lane phase that used it */
};

struct phase {
  char name[48];
  struct tz_block_use uses[TZ_SCHED_MAX_USES];
  int n_uses;
  uint64_t ws;        /* bytes of its copies */
  int at_home;        /* a home phase: runs on the home lane at the blocks' homes */
  uint64_t runs, stalls, stall_ns, compute_ns;
};

/* One phase in one step. */
struct inst {
  tz_sched *s;
  uint64_t seq, step;
  int phase, pos;     /* pos: its position in the step's order */
  int reserved, entered;
  tz_fence *done;     /* recorded at leave */
  struct tz_lane_wait wait;
  struct inst *prev, *next;
  struct inst *next_done; /* the completed stack */
  int rc;
  uint64_t t_done;
  char msg[256];
  uint64_t want[TZ_SCHED_MAX_USES]; /* a home phase: the generation it reads of each block */
};

/* A home phase waits on its lane for a block's home to hold generation gen: f is signalled (by
 * the pump, outside the lock) once a write-back has brought it there, or with the scheduler's
 * error. */
struct home_wait {
  tz_fence *f;
  int block;
  uint64_t gen;
};

struct xlane {
  const tz_tier *src, *dst;
  char name[64];
  uint64_t bytes, ops, busy_ns, busy_since;
  int in_flight;
};

struct step_rec {
  uint64_t step;
  int live, ended;
  uint64_t entered, done;
  uint64_t t_first_enter, t_lane_begin, t_last_done;
  uint64_t stall_ns, compute_ns;
};

enum { ACT_FILL, ACT_FLUSH };

/* A transfer decided under the lock and issued outside it. */
struct xfer {
  tz_sched *s;
  struct block *b;
  int kind, refill, lane;
  tz_extent dst, src;
  uint64_t n, gen, step, t0;
  uint64_t no;        /* the copy's fill_no or flush_no when it was decided */
  /* Staged (b->staged): piece by piece through one staging chunk, held from the first hop until
   * the last completes: hop 0 src -> chunk, hop 1 chunk -> dst, then the next piece. Pieces are
   * serial, so when the last piece's device-side hop completes, every earlier one has. */
  int chunk;          /* the staging chunk held; -1 none yet */
  int hop;
  uint64_t off;       /* bytes of the block moved by the pieces before this one */
  struct xfer *next;  /* in the scheduler's queue of staged hops (waiting for a chunk or ready) */
};

struct tz_sched {
  tz_runtime *rt;
  struct tz_sched_params p;
  char *trace_path;
  tz_tier *compute;
  tz_lane *lane;
  tz_lane *home_lane;     /* NULL until a home phase is declared (or params gave one) */
  int own_lane, own_home_lane, debug;
  uint64_t t0, chunk;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* broadcast whenever state moves on */

  struct block *blocks;
  int n_blocks, cap_blocks;
  struct phase *phases;
  int n_phases, declared;
  int *order, order_n;    /* the order of a step; order_n 0 while unknown */
  int order_cap;
  int recording;          /* the order of this step is being recorded */
  int *cur, cur_cap;      /* phases entered in this step (pos of them) */

  tz_extent region;       /* the budget, taken from the compute tier at declare */
  tz_arena *arena;
  uint64_t align, budget, min_budget, used, peak, over;
  uint64_t scratch_off;

  struct inst *head, *tail; /* running (entered, not done), then created and not entered */
  uint64_t next_seq;
  uint64_t step;          /* the client's step */
  int pos;                /* phases entered in it */
  uint64_t wstep;         /* the window's cursor: the next instance it creates */
  int wpos;
  int n_ahead, n_running, n_xfers;
  struct inst *open;      /* entered and not left */
  struct inst *waiting;   /* the instance tz_sched_enter waits to be reserved */
  int closing;

  int pumping, again;
  struct xfer **acts;
  int n_acts, cap_acts;

  /* Staging for blocks whose home is neither host nor device memory (nvme) when the compute lane
   * is a device stream: a pinned host tier of the scheduler's own, created at declare, before any
   * budget is taken ("staging carved first"), one chunk per staged transfer lane. */
  int stage_all;          /* params: stage such homes on a CPU lane too */
  tz_tier *stage_tier;
  tz_extent stage_ext;
  uint64_t stage_chunk;
  int n_chunks;
  unsigned chunk_busy;    /* bit k: chunk k is held by a transfer */
  struct xfer *chunk_wait, *chunk_wait_tail; /* staged transfers waiting for a chunk, FIFO */
  struct xfer *hops, *hops_tail;             /* staged hops the pump issues next, FIFO */

  struct home_wait *hw;   /* pending home waits */
  int n_hw, cap_hw;

  int err;
  char err_msg[512];
  int outstanding;        /* atomic: callbacks registered and not yet returned */
  struct inst *completed; /* atomic: a stack of instances whose fence completed */
  int pump_wanted;        /* atomic: a callback asked the progress engine to pump */
  int polling;            /* the poller is registered with the progress engine */

  struct tz_sched_stats st;
  struct xlane xl[MAX_XLANES];
  int n_xl;
  struct step_rec steps[STEP_RING];
  struct tz_sched_step_time times[TIMES_RING];
  uint64_t n_times, last_step_done;

  int trace_on, trace_complete, trace_written;
  uint64_t trace_begin, trace_end;
  struct tz_trace_span *spans;
  int n_spans, cap_spans;
};

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static void dbg(tz_sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void dbg(tz_sched *s, const char *fmt, ...) {
  if (!s->debug)
    return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tz-sched %11.6f %s\n", 1e-9 * (double)(tz_now_ns() - s->t0), line);
}

/* The first error is kept; everything after it reports it. Called with the lock held. */
static void fail_locked(tz_sched *s, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_locked(tz_sched *s, int rc, const char *fmt, ...) {
  if (s->err)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err_msg, sizeof s->err_msg, fmt, ap);
  va_end(ap);
  s->err = rc;
  TZ_LOG_ERR("%s", s->err_msg);
  dbg(s, "error: %s", s->err_msg);
  pthread_cond_broadcast(&s->cv);
}

static int err_return(tz_sched *s) { return tz_err_set(s->err, "%s", s->err_msg); }

static const char *copy_state(const struct block *b) {
  const struct copy *c = &b->c;
  if (!c->ext.tier)
    return "empty";
  if (c->filling)
    return "filling";
  if (c->unwritten)
    return "placed for a writer";
  if (c->flushing)
    return "flushing";
  return c->gen > b->home_gen ? "dirty" : "ready";
}

static void check_budget(tz_sched *s) {
  if (s->used > s->peak)
    s->peak = s->used;
  if (s->used > s->budget) {
    s->over++;
    fail_locked(s, TZ_ENOMEM, "sched: %llu bytes in use exceed the budget of %llu (a bug)",
                (unsigned long long)s->used, (unsigned long long)s->budget);
  }
}

/* ---- transfer lanes and the trace ---- */

static int xlane_get(tz_sched *s, const tz_tier *src, const tz_tier *dst) {
  for (int i = 0; i < s->n_xl; i++)
    if (s->xl[i].src == src && s->xl[i].dst == dst)
      return i;
  if (s->n_xl == MAX_XLANES)
    return MAX_XLANES - 1; /* shares the last lane's counters; never more pairs in practice */
  struct xlane *x = &s->xl[s->n_xl];
  memset(x, 0, sizeof *x);
  x->src = src;
  x->dst = dst;
  snprintf(x->name, sizeof x->name, "%s->%s", tz_tier_name(src), tz_tier_name(dst));
  return s->n_xl++;
}

static void xlane_begin(tz_sched *s, int i, uint64_t n, uint64_t now) {
  struct xlane *x = &s->xl[i];
  x->bytes += n;
  x->ops++;
  if (x->in_flight++ == 0)
    x->busy_since = now;
}

static void xlane_end(tz_sched *s, int i, uint64_t now) {
  struct xlane *x = &s->xl[i];
  if (--x->in_flight == 0)
    x->busy_ns += now - x->busy_since;
}

static void trace_add(tz_sched *s, int kind, int lane, const char *name, uint64_t t0, uint64_t t1,
                      uint64_t step, int phase, uint64_t bytes) {
  if (!s->trace_on || s->n_spans == MAX_SPANS)
    return;
  if (s->n_spans == s->cap_spans) {
    int cap = s->cap_spans ? 2 * s->cap_spans : 1024;
    struct tz_trace_span *n = realloc(s->spans, sizeof *n * (size_t)cap);
    if (!n)
      return; /* a trace with spans missing; the schedule is not affected */
    s->spans = n;
    s->cap_spans = cap;
  }
  struct tz_trace_span *e = &s->spans[s->n_spans++];
  e->kind = kind;
  e->lane = lane;
  snprintf(e->name, sizeof e->name, "%s", name);
  e->t0 = t0;
  e->t1 = t1 > t0 ? t1 : t0;
  e->step = step;
  e->phase = phase;
  e->bytes = bytes;
}

/* ---- steps ---- */

static struct step_rec *step_get(tz_sched *s, uint64_t step, uint64_t now) {
  struct step_rec *r = &s->steps[step % STEP_RING];
  if (!r->live || r->step != step) {
    memset(r, 0, sizeof *r);
    r->live = 1;
    r->step = step;
    r->t_first_enter = now;
    r->t_lane_begin = UINT64_MAX;
  }
  return r;
}

static void step_check_done(tz_sched *s, struct step_rec *r) {
  if (!r->live || !r->ended || r->done != r->entered)
    return;
  r->live = 0;
  if (r->entered == 0)
    return;
  uint64_t from = s->last_step_done ? s->last_step_done : r->t_first_enter;
  struct tz_sched_step_time *t = &s->times[s->n_times++ % TIMES_RING];
  *t = (struct tz_sched_step_time){r->step, 1e-9 * (double)(r->t_last_done - from),
                                   1e-9 * (double)r->stall_ns, 1e-9 * (double)r->compute_ns};
  s->last_step_done = r->t_last_done;
  dbg(s, "step %llu complete: %.3f ms, stalled %.3f ms", (unsigned long long)r->step,
      1e3 * t->seconds, 1e3 * t->stall_s);
  if (s->p.trace_step >= 0 && r->step == (uint64_t)s->p.trace_step) {
    s->trace_on = 0;
    s->trace_complete = 1;
    /* From when the lane could start the step's first phase (its stall included). */
    s->trace_begin = r->t_lane_begin != UINT64_MAX ? r->t_lane_begin : r->t_first_enter;
    s->trace_end = r->t_last_done;
  }
}

/* ---- copies ---- */

static int evictable(const struct block *b) {
  const struct copy *c = &b->c;
  return c->ext.tier && c->pins == 0 && c->writers == 0 && !c->filling && !c->flushing &&
         c->gen <= b->home_gen && !b->storing;
}

static void copy_free(tz_sched *s, struct block *b, const char *why) {
  struct copy *c = &b->c;
  dbg(s, "free '%s' (%s): %llu bytes, used %llu of %llu", b->name, why,
      (unsigned long long)b->size, (unsigned long long)(s->used - b->size),
      (unsigned long long)s->budget);
  tz_arena_free(s->arena, c->ext.offset - s->region.offset);
  s->used -= b->size;
  c->ext.tier = NULL;
  c->fill_no++; /* no transfer of the copy that went publishes its fence on a later one */
  c->flush_no++;
  tz_fence_release(c->ready);
  tz_fence_release(c->flushed);
  tz_fence_release(c->writer);
  c->ready = c->flushed = c->writer = NULL;
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
static void start_xfer(tz_sched *s, struct block *b, int kind, int refill, uint64_t step) {
  struct copy *c = &b->c;
  struct xfer *x = calloc(1, sizeof *x);
  if (!x || push_act(s, x) < 0) {
    free(x);
    fail_locked(s, TZ_ENOMEM, "sched: no memory for a transfer of block '%s'", b->name);
    return;
  }
  uint64_t now = tz_now_ns();
  *x = (struct xfer){.s = s, .b = b, .kind = kind, .refill = refill, .n = b->xfer, .gen = c->gen,
                     .step = step, .t0 = now, .chunk = -1};
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
  xlane_begin(s, x->lane, x->n, now);
  dbg(s, "%s '%s' generation %llu: %llu bytes %s", kind == ACT_FLUSH ? "write back" :
      refill ? "refill stale" : "fill", b->name, (unsigned long long)c->gen,
      (unsigned long long)x->n, s->xl[x->lane].name);
}

/* Eviction order: stale copies first; with a known order the copy used farthest ahead of `pos`
 * (Belady), otherwise the least recently reserved. */
static uint64_t evict_score(tz_sched *s, const struct block *b, int pos, uint64_t seq) {
  if (b->c.gen < b->gen || (s->order_n && b->n_pos == 0))
    return UINT64_MAX;
  if (!s->order_n || s->recording)
    return seq - b->c.last_use;
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < b->n_pos; i++) {
    uint64_t d = (uint64_t)((b->pos[i] - pos + s->order_n) % s->order_n);
    if (d < best)
      best = d;
  }
  return best;
}

static int uses_block(const struct phase *ph, int id) {
  for (int i = 0; i < ph->n_uses; i++)
    if (ph->uses[i].block == id)
      return 1;
  return 0;
}

/* Frees one evictable copy, not one of I's own unless own is set. 1 if it freed one. */
static int evict_one(tz_sched *s, const struct inst *I, int own) {
  const struct phase *ph = &s->phases[I->phase];
  struct block *victim = NULL;
  uint64_t best = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (!evictable(b) || (!own && uses_block(ph, i)))
      continue;
    uint64_t sc = evict_score(s, b, I->pos, I->seq);
    if (!victim || sc > best) {
      victim = b;
      best = sc;
    }
  }
  if (!victim)
    return 0;
  s->st.evictions++;
  copy_free(s, victim, best == UINT64_MAX ? "evicted, not needed again" : "evicted");
  return 1;
}

/* A compute instance I must wait for an earlier home instance J (in the list: not completed) when
 * J writes a block I uses (I's copy must be brought in from J's result, after J's fence), or when
 * I writes a block used in place that J uses (both work on the one home). The compute lane is
 * then never handed a home-lane fence: J has completed before I is reserved. And I may not write
 * the copy of a block J reads until J's generation of it is home (J entered, and the write-back
 * it waits for has completed): I's generation would be written back only after J, which waits
 * for the one before it. */
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
        if ((jh->uses[a].access & TZ_ACCESS_WRITE) || (b->in_place && iw))
          return 1;
        if (iw && (!J->entered || J->want[a] > b->home_gen))
          return 1;
      }
  }
  return 0;
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
  for (int k = 0; k < ph->n_uses; k++) {
    struct block *b = &s->blocks[ph->uses[k].block];
    if (b->in_place) /* nothing to place or bring in: the phase uses the home */
      continue;
    if (b->storing)
      return 0;
    if (b->c.ext.tier && b->c.gen < b->gen) { /* stale: never used */
      if (!evictable(b))
        return 0;
      copy_free(s, b, "stale");
    }
    if (!b->c.ext.tier)
      need[n_need++] = k;
  }
  uint64_t offs[TZ_SCHED_MAX_USES];
  for (;;) {
    int got = 0;
    for (; got < n_need; got++)
      if (tz_arena_alloc(s->arena, s->blocks[ph->uses[need[got]].block].size, &offs[got]) < 0)
        break;
    if (got == n_need)
      break;
    while (got > 0)
      tz_arena_free(s->arena, offs[--got]);
    if (evict_one(s, I, 0))
      continue;
    /* Nothing else can go. If nothing is in flight either and the client waits for I, the bytes
     * fit (budget >= its working set) but the free space is cut up by I's own cached blocks:
     * drop those too and bring them in again. */
    int idle = s->n_running == 0 && s->n_xfers == 0 && s->head == I && s->waiting == I;
    if (idle && evict_one(s, I, 1)) {
      for (int k = 0; k < ph->n_uses; k++) { /* what was evicted must now be placed too */
        const struct block *b = &s->blocks[ph->uses[k].block];
        if (!b->in_place && !b->c.ext.tier) {
          int listed = 0;
          for (int j = 0; j < n_need; j++)
            listed |= need[j] == k;
          if (!listed)
            need[n_need++] = k;
        }
      }
      continue;
    }
    if (idle)
      fail_locked(s, TZ_ENOMEM, "sched: phase '%s' cannot be placed in an idle budget of %llu "
                  "bytes (%llu used): a bug", ph->name, (unsigned long long)s->budget,
                  (unsigned long long)s->used);
    return 0;
  }
  for (int j = 0; j < n_need; j++) {
    struct block *b = &s->blocks[ph->uses[need[j]].block];
    b->c.ext = (tz_extent){s->compute, s->region.offset + offs[j], b->size};
    b->c.gen = b->gen;
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
    if (b->in_place) {
      dbg(s, "step %llu phase '%s': '%s' is used in place (generation %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)b->gen);
    } else if (!placed) {
      s->st.hits++;
      dbg(s, "step %llu phase '%s': '%s' is there (%s, generation %llu)",
          (unsigned long long)I->step, ph->name, b->name, copy_state(b),
          (unsigned long long)b->c.gen);
    } else if (u->access & TZ_ACCESS_READ) {
      if (b->home_gen != b->gen) {
        fail_locked(s, TZ_EINVAL, "sched: block '%s' has no copy and its home holds generation "
                    "%llu of %llu (a bug)", b->name, (unsigned long long)b->home_gen,
                    (unsigned long long)b->gen);
        return 0;
      }
      dbg(s, "step %llu phase '%s': place '%s' (%llu bytes, used %llu of %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)b->size,
          (unsigned long long)s->used, (unsigned long long)s->budget);
      start_xfer(s, b, ACT_FILL, 0, I->step);
    } else {
      dbg(s, "step %llu phase '%s': place '%s' to be written, not filled (used %llu of %llu)",
          (unsigned long long)I->step, ph->name, b->name, (unsigned long long)s->used,
          (unsigned long long)s->budget);
    }
  }
  check_budget(s);
  I->reserved = 1;
  return 1;
}

/* ---- instances ---- */

static struct inst *inst_new(tz_sched *s, uint64_t step, int pos, int phase) {
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

static void inst_unlink(tz_sched *s, struct inst *I) {
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
static void cancel_ahead(tz_sched *s) {
  struct inst *I = s->tail;
  while (I && !I->entered) {
    struct inst *prev = I->prev;
    if (I->reserved && !s->phases[I->phase].at_home) {
      const struct phase *ph = &s->phases[I->phase];
      for (int k = 0; k < ph->n_uses; k++)
        s->blocks[ph->uses[k].block].c.pins--;
    }
    dbg(s, "cancel step %llu phase '%s'", (unsigned long long)I->step, s->phases[I->phase].name);
    inst_unlink(s, I);
    free(I);
    s->n_ahead--;
    I = prev;
  }
  /* A copy placed for a cancelled writer holds nothing: it must not be found by anyone later. */
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (b->c.ext.tier && b->c.unwritten && b->c.pins == 0)
      copy_free(s, b, "its writer was cancelled");
  }
  s->wstep = s->step;
  s->wpos = s->pos;
}

/* ---- the pump ---- */

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
      if (ph->uses[k].block == id && (ph->uses[k].access & TZ_ACCESS_READ) &&
          I->want[k] < b->c.gen)
        return 1;
  }
  return 0;
}

/* Takes the home waits that can be signalled now (their generation is home, or an error is
 * kept) into out[0..n), which the caller signals with the lock dropped. Lock held. */
static int home_waits_take(tz_sched *s, tz_fence **out, int max) {
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

static void home_waits_signal(tz_fence **fs, int n, int err, const char *msg) {
  for (int i = 0; i < n; i++) {
    if (err)
      tz_fence_signal_msg(fs[i], err, msg);
    else
      tz_fence_signal(fs[i], 0);
    tz_fence_release(fs[i]);
  }
}

/* Everything that can be decided now: write-backs of blocks no running phase writes, then the
 * window's reservations, in order. Lock held. */
static void decide(tz_sched *s) {
  if (s->err)
    return;
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    struct copy *c = &b->c;
    if (c->ext.tier && !c->filling && !c->flushing && c->writers == 0 && c->gen > b->home_gen &&
        !home_read_hold(s, i))
      start_xfer(s, b, ACT_FLUSH, 0, s->step);
  }
  if (s->closing)
    return;
  for (struct inst *I = s->head; I; I = I->next)
    if (!I->reserved && !try_reserve(s, I))
      return;
  while (!s->err && s->order_n && !s->recording && s->n_ahead < s->p.lookahead) {
    struct inst *I = inst_new(s, s->wstep, s->wpos, s->order[s->wpos]);
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

static void xfer_done(void *arg, int rc);
static void hop_done(void *arg, int rc);
static void want_pump(tz_sched *s);

static void hop_queue(tz_sched *s, struct xfer *x) {
  x->next = NULL;
  if (s->hops_tail)
    s->hops_tail->next = x;
  else
    s->hops = x;
  s->hops_tail = x;
}

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
      x->next = NULL;
      if (s->chunk_wait_tail)
        s->chunk_wait_tail->next = x;
      else
        s->chunk_wait = x;
      s->chunk_wait_tail = x;
      pthread_mutex_unlock(&s->mu);
      return;
    }
    s->chunk_busy |= 1u << k;
    x->chunk = k;
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

static void pump(tz_sched *s) {
  pthread_mutex_lock(&s->mu);
  if (s->pumping) {
    s->again = 1;
    pthread_mutex_unlock(&s->mu);
    return;
  }
  s->pumping = 1;
  for (;;) {
    s->again = 0;
    decide(s);
    tz_fence *ready[32];
    int n_ready = home_waits_take(s, ready, 32);
    if (n_ready) {
      int err = s->err;
      char msg[512];
      snprintf(msg, sizeof msg, "%s", s->err_msg);
      pthread_mutex_unlock(&s->mu);
      home_waits_signal(ready, n_ready, err, msg);
      pthread_mutex_lock(&s->mu);
      continue;
    }
    if (s->n_acts == 0 && !s->hops && !s->again)
      break;
    struct xfer *hops = s->hops;
    s->hops = s->hops_tail = NULL;
    int n = s->n_acts;
    struct xfer *local[64];
    struct xfer **acts = n <= 64 ? local : malloc(sizeof *acts * (size_t)n);
    if (!acts) {
      acts = s->acts;
      s->acts = NULL;
      s->cap_acts = 0;
    } else {
      memcpy(acts, s->acts, sizeof *acts * (size_t)n);
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
  xlane_end(s, x->lane, now);
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
      fail_locked(s, rc, "sched: writing block '%s' (%llu bytes) back to %s failed: %s",
                  b->name, (unsigned long long)x->n, tz_tier_name(x->dst.tier), msg);
  }
  dbg(s, "%s '%s' done in %.3f ms%s%s", x->kind == ACT_FILL ? "fill" : "write back", b->name,
      1e-6 * (double)(now - x->t0), rc < 0 ? ": " : "", rc < 0 ? msg : "");
  trace_add(s, x->kind == ACT_FILL ? TZ_TRACE_FILL : TZ_TRACE_FLUSH, 1 + x->lane, b->name, x->t0,
            now, x->step, -1, x->n);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  free(x);
  want_pump(s);
  __atomic_sub_fetch(&s->outstanding, 1, __ATOMIC_ACQ_REL);
}

/* A phase's fence completed (on whatever thread signalled it: the compute lane's, for a CPU
 * lane): note when, and leave the rest to the progress engine. */
static void inst_done(void *arg, int rc) {
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
    if (ph->uses[k].access & TZ_ACCESS_WRITE)
      b->c.writers--;
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
                ph->name,
                (unsigned long long)I->step, msg);
  dbg(s, "step %llu phase '%s' done: stalled %.3f ms, computed %.3f ms", (unsigned long long)I->step,
      ph->name, 1e-6 * (double)I->wait.stall_ns, 1e-6 * (double)compute);
  int tl = ph->at_home ? TRACE_HOME_LANE : 0;
  if (I->wait.stall_ns)
    trace_add(s, TZ_TRACE_STALL, tl, ph->name, ready - I->wait.stall_ns, ready, I->step, I->phase,
              0);
  trace_add(s, TZ_TRACE_COMPUTE, tl, ph->name, ready, now, I->step, I->phase, 0);
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
    step_check_done(s, r);
  }
  inst_unlink(s, I);
  tz_fence_release(I->done);
  free(I);
}

/* The progress engine's poller: finishes completed phases in the order they were entered, then
 * pumps. Returns the number of things it did. */
static int sched_poll(void *arg) {
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
  pump(s);
  return n + 1;
}

/* Waits on the condition until done(s) holds or an error is kept. Lock held. what names the wait
 * in the timeout's message. */
static int wait_until(tz_sched *s, int (*done)(tz_sched *s, void *arg), void *arg, const char *what,
                      int stop_on_error) {
  struct timespec dl;
  clock_gettime(CLOCK_MONOTONIC, &dl);
  int64_t ms = s->p.timeout_ms > 0 ? s->p.timeout_ms : 60000;
  dl.tv_sec += (time_t)(ms / 1000);
  dl.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (dl.tv_nsec >= 1000000000L) {
    dl.tv_sec++;
    dl.tv_nsec -= 1000000000L;
  }
  while (!done(s, arg)) {
    if (stop_on_error && s->err)
      return s->err;
    if (pthread_cond_timedwait(&s->cv, &s->mu, &dl) == ETIMEDOUT && !done(s, arg)) {
      fail_locked(s, TZ_ETIMEDOUT, "sched: waited %.3f s for %s: %d phases running, %d "
                  "transfers in flight, %llu of %llu budget bytes used", 1e-3 * (double)ms, what,
                  s->n_running, s->n_xfers, (unsigned long long)s->used,
                  (unsigned long long)s->budget);
      return s->err;
    }
  }
  return 0;
}

/* ---- creation ---- */

void tz_sched_params_init(struct tz_sched_params *p) {
  memset(p, 0, sizeof *p);
  p->lookahead = 2;
  p->trace_step = -1;
  p->timeout_ms = 60000;
  p->seed = 1;
}

int tz_sched_create(tz_runtime *rt, const struct tz_sched_params *p, tz_sched **out) {
  if (!rt || !p || !p->compute)
    return tz_err_set(TZ_EINVAL, "sched: a runtime and a compute tier are required");
  if (p->lookahead < 0)
    return tz_err_set(TZ_EINVAL, "sched: lookahead %d is negative", p->lookahead);
  tz_sched *s = calloc(1, sizeof *s);
  if (!s)
    return tz_err_set(TZ_ENOMEM, "sched: no memory");
  s->rt = rt;
  s->p = *p;
  s->compute = p->compute;
  s->t0 = tz_now_ns();
  s->chunk = tz_runtime_chunk_bytes(rt);
  s->stage_all = p->stage_homes;
  const char *d = getenv("TZ_SCHED_DEBUG");
  s->debug = p->debug || (d && *d && strcmp(d, "0") != 0);
  pthread_mutex_init(&s->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  int rc = 0;
  if (p->trace_path && !(s->trace_path = strdup(p->trace_path)))
    rc = tz_err_set(TZ_ENOMEM, "sched: no memory");
  s->p.trace_path = NULL;
  s->home_lane = p->home_lane;
  if (rc == 0 && p->lane) {
    s->lane = p->lane;
  } else if (rc == 0) {
    rc = tz_lane_create_cpu("compute", &s->lane);
    s->own_lane = rc == 0;
  }
  if (rc < 0) {
    free(s->trace_path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
  }
  if (rc == 0 && (rc = tz_progress_add(tz_runtime_progress(rt), sched_poll, s, -1)) == 0)
    s->polling = 1;
  if (rc < 0) {
    if (s->own_lane)
      tz_lane_destroy(s->lane);
    free(s->trace_path);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    return rc;
  }
  if (p->jitter_us > 0) {
    tz_progress_set_jitter(tz_runtime_progress(rt), p->jitter_us, p->seed);
    tz_pool_set_jitter(tz_runtime_copy_pool(rt), p->jitter_us, p->seed + 1);
    tz_lane_set_jitter(s->lane, p->jitter_us, p->seed + 2);
  }
  s->trace_on = p->trace_step == 0 || p->trace_step == 1;
  dbg(s, "created: compute tier %s, lookahead %d, %s order, jitter %d us", tz_tier_name(s->compute),
      p->lookahead, p->record ? "recorded" : "declared", p->jitter_us);
  *out = s;
  return 0;
}

static int block_add(tz_sched *s, const char *name, uint64_t bytes, const tz_extent *home,
                     int *id) {
  if (s->declared)
    return tz_err_set(TZ_EINVAL, "sched: block '%s' added after the phases were declared", name);
  if (!home || !home->tier || bytes == 0)
    return tz_err_set(TZ_EINVAL, "sched: block '%s' needs a home extent and a size", name);
  /* A device lane waits only on device events, so a fill's last hop must be a copy to the
   * device (from host or device memory). A home in neither (nvme) would go through the runtime's
   * staged path, whose transfer fence is host work: such blocks go through staging chunks of the
   * scheduler's own instead, nvme -> pinned chunk -> device, the last hop a copy with an event. */
  int staged = (tz_lane_native(s->lane) || s->stage_all) &&
               !tz_tier_host_ptr(home->tier, home->offset) &&
               !tz_tier_device_ptr(home->tier, home->offset);
  uint64_t xfer = round_up(bytes, tz_tier_alignment(home->tier));
  if (xfer > home->bytes)
    return tz_err_set(TZ_EINVAL, "sched: block '%s' of %llu bytes (%llu rounded to %s's alignment) "
                      "does not fit its home extent of %llu bytes", name,
                      (unsigned long long)bytes, (unsigned long long)xfer,
                      tz_tier_name(home->tier), (unsigned long long)home->bytes);
  if (s->n_blocks == s->cap_blocks) {
    int cap = s->cap_blocks ? 2 * s->cap_blocks : 64;
    struct block *n = realloc(s->blocks, sizeof *n * (size_t)cap);
    if (!n)
      return tz_err_set(TZ_ENOMEM, "sched: no memory for block '%s'", name);
    s->blocks = n;
    s->cap_blocks = cap;
  }
  struct block *b = &s->blocks[s->n_blocks];
  memset(b, 0, sizeof *b);
  snprintf(b->name, sizeof b->name, "%s", name);
  b->bytes = bytes;
  b->xfer = xfer;
  b->home = *home;
  b->gen = b->home_gen = 1;
  b->in_place = home->tier == s->compute;
  b->staged = staged && !b->in_place;
  *id = s->n_blocks++;
  return 0;
}

int tz_sched_block_add(tz_sched *s, const char *name, uint64_t bytes, const tz_extent *home,
                       int *id) {
  pthread_mutex_lock(&s->mu);
  int rc = block_add(s, name, bytes, home, id);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

static int check_phases(tz_sched *s, const struct tz_phase_decl *phases, int n,
                        const int *at_home) {
  if (n < 1 || !phases)
    return tz_err_set(TZ_EINVAL, "sched: no phases declared");
  for (int i = 0; i < n; i++) {
    const struct tz_phase_decl *d = &phases[i];
    const char *name = d->name ? d->name : "(unnamed)";
    if (d->n_uses < 0 || d->n_uses > TZ_SCHED_MAX_USES || (d->n_uses && !d->uses))
      return tz_err_set(TZ_EINVAL, "sched: phase '%s' uses %d blocks (0..%d)", name, d->n_uses,
                        TZ_SCHED_MAX_USES);
    for (int k = 0; k < d->n_uses; k++) {
      const struct tz_block_use *u = &d->uses[k];
      if (u->block < 0 || u->block >= s->n_blocks)
        return tz_err_set(TZ_EINVAL, "sched: phase '%s' uses block %d; there are %d", name,
                          u->block, s->n_blocks);
      if (u->access < TZ_ACCESS_READ || u->access > TZ_ACCESS_READWRITE)
        return tz_err_set(TZ_EINVAL, "sched: phase '%s': block '%s' has access %d", name,
                          s->blocks[u->block].name, u->access);
      for (int j = 0; j < k; j++)
        if (d->uses[j].block == u->block)
          return tz_err_set(TZ_EINVAL, "sched: phase '%s' lists block '%s' twice", name,
                            s->blocks[u->block].name);
      /* A home phase runs on the host at the homes: each must be host memory. */
      const struct block *b = &s->blocks[u->block];
      if (at_home && at_home[i] && !tz_tier_host_ptr(b->home.tier, b->home.offset))
        return tz_err_set(TZ_EINVAL, "sched: home phase '%s' uses block '%s', whose home in %s "
                          "is not host memory (a home phase runs at its blocks' homes)", name,
                          b->name, tz_tier_name(b->home.tier));
    }
  }
  return 0;
}

/* Bytes of the copies a phase needs at once: blocks used in place take none. */
static uint64_t phase_ws(tz_sched *s, const struct tz_phase_decl *d, int home, uint64_t align) {
  uint64_t ws = 0;
  if (home) /* at the homes: no copies */
    return 0;
  for (int k = 0; k < d->n_uses; k++) {
    const struct block *b = &s->blocks[d->uses[k].block];
    ws += b->in_place ? 0 : round_up(b->xfer, align);
  }
  return ws;
}

#define HOME(at_home, i) ((at_home) && (at_home)[i])

static int min_budget(tz_sched *s, const struct tz_phase_decl *phases, int n, const int *at_home,
                      uint64_t *bytes) {
  TZ_CHECK(check_phases(s, phases, n, at_home));
  uint64_t align = tz_tier_alignment(s->compute), max = 0;
  for (int i = 0; i < n; i++) {
    uint64_t ws = phase_ws(s, &phases[i], HOME(at_home, i), align);
    if (ws > max)
      max = ws;
  }
  *bytes = max + round_up(s->chunk, align);
  return 0;
}

int tz_sched_min_budget(tz_sched *s, const struct tz_phase_decl *phases, int n, uint64_t *bytes) {
  pthread_mutex_lock(&s->mu);
  int rc = min_budget(s, phases, n, NULL, bytes);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* Positions in the order where each block is used, for the eviction order. */
static int index_order(tz_sched *s) {
  for (int i = 0; i < s->n_blocks; i++) {
    free(s->blocks[i].pos);
    s->blocks[i].pos = NULL;
    s->blocks[i].n_pos = 0;
  }
  for (int p = 0; p < s->order_n; p++) {
    const struct phase *ph = &s->phases[s->order[p]];
    for (int k = 0; k < ph->n_uses; k++) {
      struct block *b = &s->blocks[ph->uses[k].block];
      int *n = realloc(b->pos, sizeof *n * (size_t)(b->n_pos + 1));
      if (!n)
        return tz_err_set(TZ_ENOMEM, "sched: no memory");
      b->pos = n;
      b->pos[b->n_pos++] = p;
    }
  }
  return 0;
}

static int declare(tz_sched *s, const struct tz_phase_decl *phases, int n, const int *at_home) {
  if (s->declared)
    return tz_err_set(TZ_EINVAL, "sched: phases are declared once");
  uint64_t min;
  TZ_CHECK(min_budget(s, phases, n, at_home, &min));
  s->align = tz_tier_alignment(s->compute);
  uint64_t budget = s->p.budget;
  if (!budget) {
    struct tz_arena_stats st;
    tz_tier_arena_stats(s->compute, &st);
    budget = st.largest_free;
  }
  budget = budget / s->align * s->align;
  int worst = 0;
  for (int i = 0; i < n; i++)
    if (phase_ws(s, &phases[i], HOME(at_home, i), s->align) >
        phase_ws(s, &phases[worst], HOME(at_home, worst), s->align))
      worst = i;
  /* One staging chunk per transfer lane of staged blocks (home -> compute and back, per home
   * tier), in pinned host memory outside the compute budget. */
  int n_chunks = 0;
  uint64_t lanes_seen = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    if (!b->staged || b->in_place)
      continue;
    int in = xlane_get(s, b->home.tier, s->compute), out = xlane_get(s, s->compute, b->home.tier);
    for (int l = 0; l < 2; l++) {
      int k = l ? out : in;
      if (k >= 0 && k < 64 && !(lanes_seen & (1ull << k))) {
        lanes_seen |= 1ull << k;
        n_chunks++;
      }
    }
  }
  if (n_chunks > 32)
    n_chunks = 32;
  char staging[160] = "";
  if (n_chunks)
    snprintf(staging, sizeof staging, "; besides, %d staging chunks of %llu bytes in pinned host "
             "memory for the blocks homed in neither host nor device memory", n_chunks,
             (unsigned long long)s->chunk);
  if (budget < min)
    return tz_err_set(TZ_ENOMEM, "sched: the budget of %llu bytes in %s is %llu bytes short of the "
                      "minimum %llu: phase '%s' needs %llu bytes of blocks at once, plus %llu for "
                      "one chunk per lane (1 compute lane)%s", (unsigned long long)budget,
                      tz_tier_name(s->compute), (unsigned long long)(min - budget),
                      (unsigned long long)min, phases[worst].name ? phases[worst].name : "?",
                      (unsigned long long)phase_ws(s, &phases[worst], HOME(at_home, worst),
                                                   s->align),
                      (unsigned long long)round_up(s->chunk, s->align), staging);
  int any_home = 0;
  for (int i = 0; i < n; i++)
    any_home |= HOME(at_home, i);
  if (any_home && !s->home_lane) {
    TZ_CHECK(tz_lane_create_cpu("home", &s->home_lane));
    s->own_home_lane = 1;
    if (s->p.jitter_us > 0)
      tz_lane_set_jitter(s->home_lane, s->p.jitter_us, s->p.seed + 3);
  }
  if (n_chunks) { /* staging carved first (DESIGN.md), before the budget */
    struct tz_tier_params tp;
    tz_tier_params_init(&tp);
    tp.name = "sched-staging";
    tp.capacity = (uint64_t)n_chunks * s->chunk;
    int rc = tz_tier_create(s->rt, "host", &tp, &s->stage_tier);
    if (rc == 0 && (rc = tz_tier_alloc(s->stage_tier, tp.capacity, &s->stage_ext)) < 0) {
      tz_tier_destroy(s->stage_tier);
      s->stage_tier = NULL;
    }
    if (rc < 0)
      return tz_err_set(rc, "sched: %d staging chunks of %llu bytes in pinned host memory could "
                        "not be reserved: %s", n_chunks, (unsigned long long)s->chunk,
                        tz_err_msg());
    s->n_chunks = n_chunks;
    s->stage_chunk = s->chunk;
  }
  int rc_region = tz_tier_alloc(s->compute, budget, &s->region);
  if (rc_region < 0) {
    tz_tier_free(&s->stage_ext);
    tz_tier_destroy(s->stage_tier);
    s->stage_tier = NULL;
    s->n_chunks = 0;
    return rc_region;
  }
  s->phases = calloc((size_t)n, sizeof *s->phases);
  s->order = malloc(sizeof *s->order * (size_t)n);
  s->order_cap = n;
  s->cur_cap = 2 * n;
  s->cur = malloc(sizeof *s->cur * (size_t)s->cur_cap);
  int rc = s->phases && s->order && s->cur ? tz_arena_create(budget, s->align, &s->arena)
                                           : TZ_ENOMEM;
  if (rc == 0)
    rc = tz_arena_alloc(s->arena, round_up(s->chunk, s->align), &s->scratch_off);
  if (rc < 0) {
    tz_tier_free(&s->region);
    tz_tier_free(&s->stage_ext);
    tz_tier_destroy(s->stage_tier);
    s->stage_tier = NULL;
    s->n_chunks = 0;
    tz_arena_destroy(s->arena);
    free(s->phases);
    free(s->order);
    free(s->cur);
    s->arena = NULL;
    s->phases = NULL;
    s->order = s->cur = NULL;
    return tz_err_set(TZ_ENOMEM, "sched: no memory for %d phases", n);
  }
  for (int i = 0; i < n; i++) {
    struct phase *ph = &s->phases[i];
    snprintf(ph->name, sizeof ph->name, "%s", phases[i].name ? phases[i].name : "");
    if (!ph->name[0])
      snprintf(ph->name, sizeof ph->name, "phase%d", i);
    ph->n_uses = phases[i].n_uses;
    if (ph->n_uses)
      memcpy(ph->uses, phases[i].uses, sizeof ph->uses[0] * (size_t)ph->n_uses);
    ph->ws = phase_ws(s, &phases[i], HOME(at_home, i), s->align);
    ph->at_home = HOME(at_home, i);
  }
  for (int i = 0; i < s->n_blocks; i++) {
    struct block *b = &s->blocks[i];
    b->size = round_up(b->xfer, s->align);
    /* No transfer lane for a block in place: nothing moves, and the lane stats list only pairs
     * bytes are moved over. */
    b->xl_in = b->in_place ? -1 : xlane_get(s, b->home.tier, s->compute);
    b->xl_out = b->in_place ? -1 : xlane_get(s, s->compute, b->home.tier);
  }
  s->n_phases = n;
  s->budget = budget;
  s->min_budget = min;
  s->used = round_up(s->chunk, s->align);
  s->peak = s->used;
  if (s->p.record) {
    s->recording = 1;
  } else {
    for (int i = 0; i < n; i++)
      s->order[i] = i;
    s->order_n = n;
    TZ_CHECK(index_order(s));
  }
  s->declared = 1;
  s->st.staging = (uint64_t)s->n_chunks * s->stage_chunk;
  dbg(s, "declared %d phases over %d blocks: budget %llu bytes in %s, minimum %llu%s", n,
      s->n_blocks, (unsigned long long)budget, tz_tier_name(s->compute), (unsigned long long)min,
      staging);
  return 0;
}

int tz_sched_declare(tz_sched *s, const struct tz_phase_decl *phases, int n) {
  return tz_sched_declare_homes(s, phases, n, NULL);
}

int tz_sched_declare_homes(tz_sched *s, const struct tz_phase_decl *phases, int n,
                           const int *at_home) {
  pthread_mutex_lock(&s->mu);
  int rc = declare(s, phases, n, at_home);
  pthread_mutex_unlock(&s->mu);
  if (rc == 0)
    pump(s); /* the window starts bringing in the first phases */
  return rc;
}

/* ---- the client contract ---- */

static void order_changed(tz_sched *s, const char *what) {
  s->st.order_changes++;
  TZ_WARN("sched: step %llu: %s; the order is recorded again from this step",
          (unsigned long long)s->step, what);
  dbg(s, "order change at step %llu: %s", (unsigned long long)s->step, what);
  cancel_ahead(s);
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
    if (c->filling && !c->ready)
      return 0;
    if ((ph->uses[k].access & TZ_ACCESS_WRITE) && c->flushing && !c->flushed)
      return 0;
  }
  return 1;
}

int tz_sched_enter(tz_sched *s, int phase, struct tz_view *view) {
  pthread_mutex_lock(&s->mu);
  int rc = 0;
  if (s->err) {
    rc = err_return(s);
    goto out;
  }
  if (!s->declared || phase < 0 || phase >= s->n_phases) {
    rc = tz_err_set(TZ_EINVAL, "sched: enter of phase %d: %s", phase,
                    s->declared ? "no such phase" : "no phases declared");
    goto out;
  }
  if (s->open) {
    rc = tz_err_set(TZ_EINVAL, "sched: enter of phase '%s' while '%s' is open (leave it first)",
                    s->phases[phase].name, s->phases[s->open->phase].name);
    goto out;
  }
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
    I = inst_new(s, s->step, s->pos, phase);
    if (!I) {
      rc = err_return(s);
      goto out;
    }
    if (!s->recording && ++s->wpos == s->order_n) {
      s->wpos = 0;
      s->wstep++;
    }
  }
  if (s->pos == s->cur_cap) {
    int *n = realloc(s->cur, sizeof *n * (size_t)(2 * s->cur_cap));
    if (!n) {
      fail_locked(s, TZ_ENOMEM, "sched: no memory to record the order");
      rc = err_return(s);
      goto out;
    }
    s->cur = n;
    s->cur_cap *= 2;
  }
  s->cur[s->pos] = phase;
  s->waiting = I;
  pthread_mutex_unlock(&s->mu);
  pump(s);
  pthread_mutex_lock(&s->mu);
  char what[128];
  snprintf(what, sizeof what, "room for phase '%s' of step %llu and its transfers", ph->name,
           (unsigned long long)s->step);
  rc = wait_until(s, ready_to_enter, I, what, 1);
  s->waiting = NULL;
  if (rc < 0 || s->err) {
    rc = err_return(s);
    goto out;
  }
  /* Inputs, each its own fence (a device lane waits on each one's event): each copy's fill, its
   * last writer, and for a write its last write-back (which reads the copy). Same-lane order
   * already puts this phase after earlier readers. Retained: the lane is handed them unlocked. */
  tz_fence *fs[3 * TZ_SCHED_MAX_USES];
  int nf = 0;
  view->step = s->step;
  view->phase = phase;
  view->name = ph->name;
  view->n_blocks = ph->n_uses;
  if (ph->at_home) {
    /* At the homes: the lane waits for the home to hold the generation of a dirty copy (a home
     * wait, signalled when the copy's write-back completes: the write-back is decided as soon as
     * the copy's writers have completed), or, in place, for the last writer; a writer also for
     * the last compute phase that used the block (its fills read the home, its in-place work used
     * it). Earlier home phases are before it on the home lane. The host never waits here. */
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
        fs[nf++] = c->writer;
      if (!b->in_place && c->ext.tier && c->gen > b->home_gen) {
        tz_fence *f = NULL;
        if (s->n_hw == s->cap_hw) {
          int cap = s->cap_hw ? 2 * s->cap_hw : 16;
          struct home_wait *n = realloc(s->hw, sizeof *n * (size_t)cap);
          if (n) {
            s->hw = n;
            s->cap_hw = cap;
          }
        }
        if (s->n_hw < s->cap_hw)
          f = tz_fence_create();
        if (!f) {
          while (s->n_hw > nhw0) { /* the waits made for this phase go with it */
            tz_fence *g = s->hw[--s->n_hw].f;
            tz_fence_signal(g, TZ_ENOMEM);
            tz_fence_release(g);
          }
          fail_locked(s, TZ_ENOMEM, "sched: no memory for home phase '%s'", ph->name);
          rc = err_return(s);
          goto out;
        }
        /* The lane holds it through fs (retained below); the list holds the creator's. */
        s->hw[s->n_hw++] = (struct home_wait){f, u->block, c->gen};
        fs[nf++] = f;
        dbg(s, "home phase '%s' waits for generation %llu of '%s' at home (%s)", ph->name,
            (unsigned long long)c->gen, b->name, copy_state(b));
      }
      if ((u->access & TZ_ACCESS_WRITE) && b->cuse)
        fs[nf++] = b->cuse;
    }
    for (int k = 0; k < ph->n_uses; k++) {
      struct block *b = &s->blocks[ph->uses[k].block];
      b->running++;
      if (ph->uses[k].access & TZ_ACCESS_WRITE) {
        b->gen++; /* made in the home; any copy is stale from now on */
        b->home_writers++;
      }
    }
    goto entered;
  }
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
        fs[nf++] = c->writer;
      view->blocks[k].ptr = tz_tier_device_ptr(b->home.tier, b->home.offset);
      if (!view->blocks[k].ptr)
        view->blocks[k].ptr = tz_tier_host_ptr(b->home.tier, b->home.offset);
      continue;
    }
    if (c->gen != b->gen) {
      fail_locked(s, TZ_EINVAL, "sched: phase '%s' would use a stale copy of '%s' (generation "
                  "%llu, the block is at %llu): a bug", ph->name, b->name,
                  (unsigned long long)c->gen, (unsigned long long)b->gen);
      rc = err_return(s);
      goto out;
    }
    if (c->ready)
      fs[nf++] = c->ready;
    if (c->writer)
      fs[nf++] = c->writer;
    if ((u->access & TZ_ACCESS_WRITE) && c->flushed)
      fs[nf++] = c->flushed;
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
entered:
  for (int i = 0; i < nf; i++)
    tz_fence_retain(fs[i]);
  I->entered = 1;
  s->n_ahead--;
  s->n_running++;
  s->open = I;
  s->pos++;
  uint64_t now = tz_now_ns();
  struct step_rec *r = step_get(s, s->step, now);
  r->entered++;
  dbg(s, "enter step %llu %sphase '%s' (%d blocks, %d fences)", (unsigned long long)s->step,
      ph->at_home ? "home " : "", ph->name, ph->n_uses, nf);
  tz_lane *lane = ph->at_home ? s->home_lane : s->lane;
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
out:
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int tz_sched_submit(tz_sched *s, int (*fn)(void *arg), void *arg) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err ? err_return(s) : !s->open ? tz_err_set(TZ_EINVAL, "sched: submit outside a phase") : 0;
  tz_lane *lane = rc == 0 && s->phases[s->open->phase].at_home ? s->home_lane : s->lane;
  pthread_mutex_unlock(&s->mu);
  if (rc < 0)
    return rc;
  return tz_lane_submit(lane, fn, arg);
}

/* Records the open phase's fence; forced: also after an error (destroy closes what is open). */
static int leave_open(tz_sched *s, int phase, int forced) {
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
  if (tz_fence_then(done, inst_done, I) < 0)
    inst_done(I, tz_fence_wait(done, -1));
  return rc;
}

int tz_sched_leave(tz_sched *s, int phase) { return leave_open(s, phase, 0); }

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
    rc = index_order(s);
    if (rc < 0)
      fail_locked(s, rc, "%s", tz_err_msg());
    dbg(s, "order recorded: %d phases per step", s->order_n);
  }
  uint64_t now = tz_now_ns();
  struct step_rec *r = step_get(s, s->step, now);
  r->ended = 1;
  step_check_done(s, r);
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
  pump(s);
  return rc;
}

static int dirty_blocks(tz_sched *s) {
  int n = 0;
  for (int i = 0; i < s->n_blocks; i++) {
    const struct block *b = &s->blocks[i];
    n += b->c.ext.tier && (b->c.gen > b->home_gen || b->c.flushing);
  }
  return n;
}

static int all_saved(tz_sched *s, void *arg) {
  (void)arg;
  return s->n_running == 0 && dirty_blocks(s) == 0;
}

int tz_sched_sync(tz_sched *s) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err ? err_return(s) : 0;
  if (rc == 0 && s->open)
    rc = tz_err_set(TZ_EINVAL, "sched: sync while phase '%s' is open",
                    s->phases[s->open->phase].name);
  /* The last phase to complete may be the one that failed: its error is the sync's. */
  if (rc == 0 && (wait_until(s, all_saved, NULL, "the phases entered and their write-backs", 1) < 0 ||
                  s->err))
    rc = err_return(s);
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- host access to blocks ---- */

static int block_quiet(tz_sched *s, void *arg) {
  (void)s;
  const struct block *b = arg;
  return b->running == 0 && !b->c.filling && !b->c.flushing;
}

static void *bounce_alloc(tz_sched *s, const struct block *b) {
  uint64_t a = tz_tier_alignment(b->home.tier);
  if (a < s->align)
    a = s->align;
  void *p = NULL;
  return posix_memalign(&p, a, b->xfer) == 0 ? p : NULL;
}

int tz_sched_block_load(tz_sched *s, int id, void *dst) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err ? err_return(s) : id < 0 || id >= s->n_blocks
                                        ? tz_err_set(TZ_EINVAL, "sched: no block %d", id) : 0;
  if (rc < 0) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  struct block *b = &s->blocks[id];
  if (wait_until(s, block_quiet, b, "a block to load", 1) < 0) {
    rc = err_return(s);
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  /* The copy when there is a current one (pinned while read), else the home, which then holds
   * the latest generation. */
  tz_extent from = b->home;
  int from_copy = b->c.ext.tier && b->c.gen == b->gen && !b->c.unwritten;
  if (from_copy) {
    from = b->c.ext;
    b->c.pins++;
  }
  pthread_mutex_unlock(&s->mu);
  void *buf = bounce_alloc(s, b);
  rc = buf ? tz_tier_read_sync(&from, 0, buf, b->xfer)
           : tz_err_set(TZ_ENOMEM, "sched: no memory to load '%s'", b->name);
  if (rc == 0)
    memcpy(dst, buf, b->bytes);
  free(buf);
  pthread_mutex_lock(&s->mu);
  if (from_copy)
    b->c.pins--;
  pthread_mutex_unlock(&s->mu);
  pump(s);
  return rc;
}

int tz_sched_home_begin(tz_sched *s, int id, tz_extent *home) {
  pthread_mutex_lock(&s->mu);
  int rc = s->err ? err_return(s) : id < 0 || id >= s->n_blocks
                                        ? tz_err_set(TZ_EINVAL, "sched: no block %d", id) : 0;
  if (rc == 0 && s->open)
    rc = tz_err_set(TZ_EINVAL, "sched: store while phase '%s' is open",
                    s->phases[s->open->phase].name);
  struct block *b = rc == 0 ? &s->blocks[id] : NULL;
  if (rc == 0 && wait_until(s, block_quiet, b, "a block to store", 1) < 0)
    rc = err_return(s);
  if (rc == 0 && b->storing)
    rc = tz_err_set(TZ_EINVAL, "sched: '%s' is already being written at its home", b->name);
  if (rc == 0 && !b->in_place && b->c.ext.tier && b->c.gen > b->home_gen)
    rc = tz_err_set(TZ_EINVAL, "sched: the home of '%s' is older than its copy (generation %llu "
                    "of %llu): sync first", b->name, (unsigned long long)b->home_gen,
                    (unsigned long long)b->c.gen);
  if (rc == 0) {
    b->storing = 1; /* no fill reads the home, no copy goes, while it is written */
    *home = b->home;
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

int tz_sched_home_end(tz_sched *s, int id, int rc) {
  pthread_mutex_lock(&s->mu);
  if (id < 0 || id >= s->n_blocks || !s->blocks[id].storing) {
    pthread_mutex_unlock(&s->mu);
    return tz_err_set(TZ_EINVAL, "sched: block %d is not being written at its home", id);
  }
  struct block *b = &s->blocks[id];
  b->storing = 0;
  if (rc < 0) {
    fail_locked(s, rc, "sched: storing block '%s' in %s failed: %s", b->name,
                tz_tier_name(b->home.tier), tz_err_msg());
    rc = err_return(s);
  } else {
    b->gen++;
    b->home_gen = b->gen;
    dbg(s, "store '%s': generation %llu in %s", b->name, (unsigned long long)b->gen,
        tz_tier_name(b->home.tier));
    /* A copy made before is stale. Unused, it goes; pinned by phases the window has reserved,
     * it is brought in again now, before any of them can enter. */
    if (b->c.ext.tier && b->c.pins == 0) {
      copy_free(s, b, "stale");
    } else if (b->c.ext.tier) {
      b->c.gen = b->gen;
      b->c.unwritten = 0;
      start_xfer(s, b, ACT_FILL, 1, s->step);
    }
  }
  pthread_mutex_unlock(&s->mu);
  pump(s);
  return rc;
}

int tz_sched_block_store(tz_sched *s, int id, const void *src) {
  tz_extent home;
  TZ_CHECK(tz_sched_home_begin(s, id, &home));
  const struct block *b = &s->blocks[id];
  void *buf = bounce_alloc(s, b);
  int rc;
  if (buf) {
    memcpy(buf, src, b->bytes);
    memset((char *)buf + b->bytes, 0, b->xfer - b->bytes);
    rc = tz_tier_write_sync(&home, 0, buf, b->xfer);
  } else {
    rc = tz_err_set(TZ_ENOMEM, "sched: no memory to store '%s'", b->name);
  }
  free(buf);
  return tz_sched_home_end(s, id, rc);
}

/* ---- accounting ---- */

void tz_sched_stats(tz_sched *s, struct tz_sched_stats *out) {
  pthread_mutex_lock(&s->mu);
  *out = s->st;
  out->budget = s->budget;
  out->min_budget = s->min_budget;
  out->used = s->used;
  out->peak_used = s->peak;
  out->over_budget = s->over;
  uint64_t stall[2] = {0, 0}, compute[2] = {0, 0};
  for (int i = 0; i < s->n_phases; i++) {
    stall[s->phases[i].at_home] += s->phases[i].stall_ns;
    compute[s->phases[i].at_home] += s->phases[i].compute_ns;
  }
  out->stall_s = 1e-9 * (double)stall[0];
  out->compute_s = 1e-9 * (double)compute[0];
  out->home_stall_s = 1e-9 * (double)stall[1];
  out->home_s = 1e-9 * (double)compute[1];
  pthread_mutex_unlock(&s->mu);
}

int tz_sched_phase_stats(tz_sched *s, struct tz_sched_phase_stats *out, int max) {
  pthread_mutex_lock(&s->mu);
  for (int i = 0; i < s->n_phases && i < max; i++) {
    const struct phase *ph = &s->phases[i];
    out[i] = (struct tz_sched_phase_stats){ph->name, ph->runs, ph->stalls,
                                           1e-9 * (double)ph->stall_ns,
                                           1e-9 * (double)ph->compute_ns, ph->at_home};
  }
  pthread_mutex_unlock(&s->mu);
  return s->n_phases;
}

int tz_sched_lane_stats(tz_sched *s, struct tz_sched_lane_stats *out, int max) {
  pthread_mutex_lock(&s->mu);
  uint64_t now = tz_now_ns(), compute = 0, runs = 0;
  for (int i = 0; i < s->n_phases; i++)
    if (!s->phases[i].at_home) {
      compute += s->phases[i].compute_ns;
      runs += s->phases[i].runs;
    }
  int n = 0;
  if (max > 0) {
    memset(&out[0], 0, sizeof out[0]);
    snprintf(out[0].name, sizeof out[0].name, "%s", tz_lane_name(s->lane));
    out[0].busy_s = 1e-9 * (double)compute;
    out[0].ops = runs;
  }
  n++;
  for (int i = 0; i < s->n_xl; i++, n++) {
    if (n >= max)
      continue;
    const struct xlane *x = &s->xl[i];
    struct tz_sched_lane_stats *o = &out[n];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", x->name);
    o->src = tz_tier_name(x->src);
    o->dst = tz_tier_name(x->dst);
    o->busy_s = 1e-9 * (double)(x->busy_ns + (x->in_flight ? now - x->busy_since : 0));
    o->bytes = x->bytes;
    o->ops = x->ops;
  }
  pthread_mutex_unlock(&s->mu);
  return n;
}

int tz_sched_block_stats(tz_sched *s, int id, uint64_t *fills, uint64_t *flushes,
                         uint64_t *refills) {
  if (id < 0 || id >= s->n_blocks)
    return tz_err_set(TZ_EINVAL, "sched: no block %d", id);
  pthread_mutex_lock(&s->mu);
  const struct block *b = &s->blocks[id];
  if (fills)
    *fills = b->n_fills;
  if (flushes)
    *flushes = b->n_flushes;
  if (refills)
    *refills = b->n_refills;
  pthread_mutex_unlock(&s->mu);
  return 0;
}

int tz_sched_step_times(tz_sched *s, struct tz_sched_step_time *out, int max) {
  pthread_mutex_lock(&s->mu);
  uint64_t n = s->n_times < TIMES_RING ? s->n_times : TIMES_RING;
  if ((uint64_t)max < n)
    n = (uint64_t)max;
  for (uint64_t i = 0; i < n; i++)
    out[i] = s->times[(s->n_times - n + i) % TIMES_RING];
  pthread_mutex_unlock(&s->mu);
  return (int)n;
}

int tz_sched_trace_write(tz_sched *s, const char *path) {
  pthread_mutex_lock(&s->mu);
  int rc = 0;
  if (s->p.trace_step < 0)
    rc = tz_err_set(TZ_ENOENT, "sched: no step is traced (params.trace_step)");
  else if (!s->trace_complete)
    rc = tz_err_set(TZ_EBUSY, "sched: step %d has not completed yet", s->p.trace_step);
  if (rc < 0) {
    pthread_mutex_unlock(&s->mu);
    return rc;
  }
  FILE *f = fopen(path, "w");
  if (!f) {
    pthread_mutex_unlock(&s->mu);
    return tz_err_errno(errno, "sched: cannot write the trace to %s", path);
  }
  const char *names[2 + MAX_XLANES];
  names[0] = tz_lane_name(s->lane);
  for (int i = 0; i < s->n_xl; i++)
    names[1 + i] = s->xl[i].name;
  int n_lanes = 1 + s->n_xl;
  if (s->home_lane) { /* the home lane's track comes after the transfer lanes */
    names[n_lanes] = tz_lane_name(s->home_lane);
    for (int i = 0; i < s->n_spans; i++)
      if (s->spans[i].lane == TRACE_HOME_LANE)
        s->spans[i].lane = n_lanes;
    n_lanes++;
  }
  char meta[512];
  snprintf(meta, sizeof meta, "\"step\":%d,\"budget\":%llu,\"min_budget\":%llu,\"lookahead\":%d,"
           "\"compute_tier\":\"%s\"", s->p.trace_step, (unsigned long long)s->budget,
           (unsigned long long)s->min_budget, s->p.lookahead, tz_tier_name(s->compute));
  rc = tz_trace_write_json(f, s->spans, s->n_spans, names, n_lanes, s->trace_begin,
                           s->trace_end, meta);
  if (fclose(f) != 0 && rc == 0)
    rc = tz_err_errno(errno, "sched: writing the trace to %s", path);
  if (rc == 0)
    s->trace_written = 1;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/* ---- destruction ---- */

static int all_quiet(tz_sched *s, void *arg) {
  (void)arg;
  return s->n_running == 0 && s->n_xfers == 0 && (s->err || dirty_blocks(s) == 0);
}

void tz_sched_destroy(tz_sched *s) {
  if (!s)
    return;
  pthread_mutex_lock(&s->mu);
  int open = s->open != NULL;
  pthread_mutex_unlock(&s->mu);
  if (open)
    leave_open(s, -1, 1);
  pthread_mutex_lock(&s->mu);
  s->closing = 1;
  pthread_mutex_unlock(&s->mu);
  pump(s); /* home waits an error left pending are signalled with it */
  pthread_mutex_lock(&s->mu);
  /* Running phases and transfers must finish before their memory goes: wait as long as it
   * takes, saying so each timeout period. */
  while (wait_until(s, all_quiet, NULL, "the scheduler's work to finish before destroying it", 0) < 0 &&
         !all_quiet(s, NULL))
    TZ_LOG_ERR("sched: destroy still waits for %d phases and %d transfers", s->n_running,
               s->n_xfers);
  cancel_ahead(s);
  tz_fence *left[32];
  int n_left;
  while ((n_left = home_waits_take(s, left, 32)) > 0) { /* none once quiet; an error's too */
    pthread_mutex_unlock(&s->mu);
    home_waits_signal(left, n_left, TZ_ECANCELED, "sched: destroyed");
    pthread_mutex_lock(&s->mu);
  }
  pthread_mutex_unlock(&s->mu);
  /* The last callbacks may still be on their way out; then the engine lets go of the poller
   * (tz_progress_remove waits until it is out of any call to it). */
  while (__atomic_load_n(&s->outstanding, __ATOMIC_ACQUIRE) > 0)
    usleep(50);
  if (s->polling)
    tz_progress_remove(tz_runtime_progress(s->rt), sched_poll, s);
  if (s->trace_path && !s->trace_written && s->trace_complete &&
      tz_sched_trace_write(s, s->trace_path) < 0)
    TZ_LOG_ERR("%s", tz_err_msg());
  if (s->p.jitter_us > 0) {
    tz_progress_set_jitter(tz_runtime_progress(s->rt), 0, 0);
    tz_pool_set_jitter(tz_runtime_copy_pool(s->rt), 0, 0);
  }
  for (int i = 0; i < s->n_blocks; i++) {
    struct copy *c = &s->blocks[i].c;
    tz_fence_release(c->ready);
    tz_fence_release(c->flushed);
    tz_fence_release(c->writer);
    tz_fence_release(s->blocks[i].cuse);
    free(s->blocks[i].pos);
  }
  if (s->own_lane)
    tz_lane_destroy(s->lane);
  if (s->own_home_lane)
    tz_lane_destroy(s->home_lane);
  tz_arena_destroy(s->arena);
  tz_tier_free(&s->region);
  tz_tier_free(&s->stage_ext);
  tz_tier_destroy(s->stage_tier);
  dbg(s, "destroyed");
  free(s->blocks);
  free(s->phases);
  free(s->order);
  free(s->cur);
  free(s->acts);
  free(s->hw);
  free(s->spans);
  free(s->trace_path);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
  free(s);
}
