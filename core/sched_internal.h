/* The scheduler's private state, shared by its files (sched.c: creation, declare, destroy;
 * sched_phase.c: the client contract; sched_window.c: reserving phases ahead, deciding;
 * sched_pump.c: issuing transfers and completions; sched_host.c: host access to blocks;
 * sched_stats.c: accounting and the trace). docs/scheduler.md explains the rules; in short:
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
#ifndef TZ_SCHED_INTERNAL_H
#define TZ_SCHED_INTERNAL_H

#include "core/arena.h"
#include "core/error.h"
#include "core/internal.h"
#include "core/log.h"
#include "core/sched.h"
#include "core/sched_trace.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

#define MAX_XLANES 16
#define STEP_RING 256
#define TIMES_RING 256
#define MAX_SPANS (1 << 20)
#define TRACE_HOME_LANE (1 + MAX_XLANES) /* the home lane's spans; written after the others */

struct copy {
  tz_extent ext; /* in the compute tier; tier NULL when there is no copy */
  uint64_t gen;  /* the generation it holds, or will once its fill or running writer is done */
  int pins;      /* instances reserved or running that use it, and loads reading it */
  int writers;   /* running instances that write it */
  int filling, flushing;
  int unwritten;     /* placed for a phase that overwrites it, which has not entered yet: its
                        bytes are nobody's until then */
  int wait_home;     /* placed for compute phases that read what a running home phase writes:
                        its fill waits until that phase has brought its generation home */
  tz_fence *ready;   /* the transfer fence of its last fill; NULL while a fill is decided and not
                        yet issued, or when never filled (contents are the writer's) */
  tz_fence *flushed; /* the transfer fence of its last write-back; NULL while one is decided and
                        not yet issued */
  uint64_t fill_no, flush_no; /* the transfer the fences above belong to (struct xfer.no) */
  tz_fence *writer;           /* the fence of the last writer that left */
  uint64_t last_use; /* seq of the last instance that reserved it: LRU when the order is unknown */
  uint64_t use_step; /* the step of that instance (tz_sched_params.carry) */
  uint64_t need;     /* seq of the instance it was placed for: its fill's place in the line */
  int dirty_at;      /* 1 + the order position of the last compute writer that completed; 0 when
                        unknown (tz_sched_params.defer_rewrite) */
};

struct block {
  char name[64];
  uint64_t bytes; /* as the client gave it */
  uint64_t xfer;  /* bytes moved: rounded up to the home tier's alignment */
  uint64_t size;  /* bytes of the copy: xfer rounded up to the compute tier's alignment */
  tz_extent home;
  uint64_t gen;      /* the latest generation */
  uint64_t home_gen; /* the generation the home holds */
  int storing;       /* tz_sched_block_store is writing the home */
  int running;       /* running instances that use it */
  struct copy c;
  uint64_t n_fills, n_flushes, n_refills;
  int *pos, n_pos;   /* positions in the order of a step where it is used */
  int xl_in, xl_out; /* transfer lanes home -> compute and back; -1 for a block in place */
  int staged;        /* its transfers go through the scheduler's staging chunks (two hops) */
  int in_place;      /* homed in the compute tier: phases use the home, c holds no extent */
  int home_writers;  /* running home phases that write it */
  tz_fence *cuse;    /* the fence of the last compute-lane phase that used it */
};

struct phase {
  char name[48];
  struct tz_block_use uses[TZ_SCHED_MAX_USES];
  int n_uses;
  uint64_t ws; /* bytes of its copies */
  int at_home; /* a home phase: runs on the home lane at the blocks' homes */
  uint64_t runs, stalls, stall_ns, compute_ns;
};

/* One phase in one step. */
struct inst {
  tz_sched *s;
  uint64_t seq, step;
  int phase, pos; /* pos: its position in the step's order */
  int reserved, entered;
  tz_fence *done; /* recorded at leave */
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
  uint64_t queued; /* bytes of unstaged transfers issued and not complete (params.queue_bytes) */
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
  uint64_t no; /* the copy's fill_no or flush_no when it was decided */
  /* Its place in the line (params.queue_bytes): a fill's is the seq of the instance its copy was
   * placed for, a write-back's the next seq when it was decided; the smaller goes first, the
   * order decided on a tie. A fill that waited for a home phase (copy.wait_home) is decided after
   * fills for phases further ahead, and must not queue behind them. */
  uint64_t need;
  /* Staged (b->staged): piece by piece through one staging chunk, held from the first hop until
   * the last completes: hop 0 src -> chunk, hop 1 chunk -> dst, then the next piece. Pieces are
   * serial, so when the last piece's device-side hop completes, every earlier one has. */
  int chunk; /* the staging chunk held; -1 none yet */
  int hop;
  uint64_t off;      /* bytes of the block moved by the pieces before this one */
  struct xfer *next; /* in the scheduler's queue of staged hops (waiting for a chunk or ready),
                        or, unstaged, in its line (params.queue_bytes) */
  int queued;        /* counted in its lane's queued bytes */
  int waited;        /* counted in tz_sched_stats.queue_waits */
};

struct tz_sched {
  tz_runtime *rt;
  struct tz_sched_params p;
  char *trace_path;
  tz_tier *compute;
  tz_lane *lane;
  tz_lane *home_lane; /* NULL until a home phase is declared (or params gave one) */
  int own_lane, own_home_lane, debug;
  uint64_t t0, chunk;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* broadcast whenever state moves on */

  struct block *blocks;
  int n_blocks, cap_blocks;
  struct phase *phases;
  int n_phases, declared;
  int *order, order_n; /* the order of a step; order_n 0 while unknown */
  int order_cap;
  int recording;     /* the order of this step is being recorded */
  int *cur, cur_cap; /* phases entered in this step (pos of them) */

  tz_extent region; /* the budget, taken from the compute tier at declare */
  tz_arena *arena;
  uint64_t align, budget, min_budget, used, peak, over;
  uint64_t scratch_off;

  struct inst *head, *tail; /* running (entered, not done), then created and not entered */
  uint64_t next_seq;
  uint64_t step;  /* the client's step */
  int pos;        /* phases entered in it */
  uint64_t wstep; /* the window's cursor: the next instance it creates */
  int wpos;
  int n_ahead, n_running, n_xfers;
  struct inst *open;    /* entered and not left */
  struct inst *waiting; /* the instance tz_sched_enter waits to be reserved */
  int closing;
  int syncing; /* tz_sched_sync waits: no write-back is deferred (defer_rewrite) */

  int pumping, again;
  struct xfer **acts;
  int n_acts, cap_acts;

  /* Staging for blocks whose home is neither host nor device memory (nvme) when the compute lane
   * is a device stream: a pinned host tier of the scheduler's own, created at declare, before any
   * budget is taken ("staging carved first"), one chunk per staged transfer lane. */
  int stage_all; /* params: stage such homes on a CPU lane too */
  tz_tier *stage_tier;
  tz_extent stage_ext;
  uint64_t stage_chunk;
  int n_chunks;
  unsigned chunk_busy;                       /* bit k: chunk k is held by a transfer */
  struct xfer *chunk_wait, *chunk_wait_tail; /* staged transfers waiting for a chunk, FIFO */
  struct xfer *hops, *hops_tail;             /* staged hops the pump issues next, FIFO */
  struct xfer *line, *line_tail; /* unstaged transfers waiting for room in their lane's queue
                                    (params.queue_bytes), in the order decided */
  int n_line;

  struct home_wait *hw; /* pending home waits */
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

static inline uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

static inline void dbg(tz_sched *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void dbg(tz_sched *s, const char *fmt, ...) {
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
static inline void fail_locked(tz_sched *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline void fail_locked(tz_sched *s, int rc, const char *fmt, ...) {
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

static inline int err_return(tz_sched *s) { return tz_err_set(s->err, "%s", s->err_msg); }

static inline const char *copy_state(const struct block *b) {
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

/* sched_window.c: copies and the window's instances. Lock held for all of them. */
void tz_sched_copy_free(tz_sched *s, struct block *b, const char *why);
void tz_sched_start_xfer(tz_sched *s, struct block *b, int kind, int refill, uint64_t step);
struct inst *tz_sched_inst_new(tz_sched *s, uint64_t step, int pos, int phase);
void tz_sched_inst_unlink(tz_sched *s, struct inst *I);
void tz_sched_cancel_ahead(tz_sched *s);
/* Starts the write-backs tz_sched_params.defer_rewrite has deferred; how many. */
int tz_sched_flush_deferred(tz_sched *s);
/* Everything that can be decided now, for the pump to issue: fills that waited for a home phase,
 * write-backs, then the window's reservations, in order. */
void tz_sched_decide(tz_sched *s);

/* sched_pump.c: transfers issued, completions taken in. */
void tz_sched_pump(tz_sched *s); /* lock not held */
int tz_sched_home_waits_take(tz_sched *s, tz_fence **out, int max);
void tz_sched_home_waits_signal(tz_fence **fs, int n, int err, const char *msg);
void tz_sched_inst_done(void *arg, int rc);
int tz_sched_poll(void *arg);
int tz_sched_wait_until(tz_sched *s, int (*done)(tz_sched *s, void *arg), void *arg,
                        const char *what, int stop_on_error);

/* sched_stats.c: transfer lanes, step records and trace spans. Lock held. */
int tz_sched_xlane_get(tz_sched *s, const tz_tier *src, const tz_tier *dst);
void tz_sched_xlane_begin(tz_sched *s, int i, uint64_t n, uint64_t now);
void tz_sched_xlane_end(tz_sched *s, int i, uint64_t now);
void tz_sched_trace_add(tz_sched *s, int kind, int lane, const char *name, uint64_t t0, uint64_t t1,
                        uint64_t step, int phase, uint64_t bytes);
struct step_rec *tz_sched_step_get(tz_sched *s, uint64_t step, uint64_t now);
void tz_sched_step_check_done(tz_sched *s, struct step_rec *r);

/* sched.c and sched_phase.c. Lock held, except for leave_open, which takes it. */
int tz_sched_index_order(tz_sched *s);
/* sched.c, below the client contract (sched_phase.c): the declared phases' tables and budget
 * (lock held), and freeing what creation, blocks and declaring made once nothing runs. */
int tz_sched_declare_tables(tz_sched *s, const struct tz_phase_decl *phases, int n,
                            const int *at_home);
void tz_sched_free(tz_sched *s);
int tz_sched_dirty_blocks(tz_sched *s);
int tz_sched_leave_open(tz_sched *s, int phase, int forced);

#endif
