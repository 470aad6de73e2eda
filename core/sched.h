/* The scheduler (DESIGN.md "The client contract"): blocks of model state live in home tiers; a
 * phase of the client's step needs some of them in the compute tier; the scheduler brings them in
 * ahead of time within a byte budget, makes the compute lane wait for them on fences, writes back
 * what phases wrote, and accounts for every byte and every stall.
 *
 *   tz_sched_block_add(s, "L0.w", bytes, &home, &id);     once per block
 *   tz_sched_declare(s, phases, n);                        the phases of one step, in order
 *   for each step:
 *     for each phase p:
 *       tz_sched_enter(s, p, &view);      view: the blocks' addresses in the compute tier
 *       tz_sched_submit(s, fn, arg);      compute on the compute lane (or launch on view.lane)
 *       tz_sched_leave(s, p);             outputs become dirty, pins drop, when the lane gets here
 *     tz_sched_step_end(s);
 *
 * The host waits inside tz_sched_enter only until the phase's blocks have room in the budget and
 * their transfers are issued; the compute lane waits for the transfers. Nothing is reused, written
 * back or freed before the fence of its last reader or writer has completed.
 *
 * A block whose home is in the compute tier (params.compute) is used in place: the view gives its
 * home, and it has no copy, takes none of the budget and is never filled or written back. The
 * compute lane runs phases in order, so a reader runs after the writers entered before it and a
 * writer after the readers entered before it, as for copies.
 *
 * A home phase (tz_sched_declare_homes) runs at the homes of its blocks instead, on a second lane
 * (params.home_lane, a CPU lane: the CPU optimizer). Its view gives the blocks' homes (host
 * pointers), it takes no budget, and the scheduler orders it against the compute lane's phases
 * through the homes: it reads a block's latest generation there (the dirty copy of a compute
 * writer is written back first, and the home lane, not the host, waits for it), it writes only
 * after every earlier user of the block has completed, and what it writes is a new generation in
 * the home, so a copy made before is stale and a later compute phase's copy is brought in only
 * after the home phase's fence. docs/scheduler.md "Home phases".
 *
 * Threads: one client thread calls the functions below (they are not meant to be called from two
 * threads at once); the scheduler's own work runs in fence callbacks on the progress engine, the
 * runtime's copy lane and the compute lane.
 *
 * Errors: the first failure (a transfer, a compute job, a timeout) is kept; every later call
 * returns it with its message, until tz_sched_destroy. */
#ifndef TZ_SCHED_H
#define TZ_SCHED_H

#include <stdint.h>

#include "core/lane.h"
#include "core/runtime.h"
#include "core/tier.h"

typedef struct tz_sched tz_sched;

enum tz_access {
  TZ_ACCESS_READ = 1,      /* the phase reads the block */
  TZ_ACCESS_WRITE = 2,     /* the phase overwrites all of it; its old contents are not brought in */
  TZ_ACCESS_READWRITE = 3, /* reads, then changes it */
};

/* One block a phase uses; needed in the scheduler's compute tier. */
struct tz_block_use {
  int block;  /* id from tz_sched_block_add */
  int access; /* enum tz_access */
};

#define TZ_SCHED_MAX_USES 32

struct tz_phase_decl {
  const char *name;                /* "fwd3"; copied */
  const struct tz_block_use *uses; /* n_uses entries, each block at most once; copied */
  int n_uses;                      /* 0..TZ_SCHED_MAX_USES */
};

struct tz_sched_params {
  tz_tier *compute; /* the tier phases need their blocks in (hbm; on a CPU-only machine a host
                       tier with an HBM's budget). Required, borrowed. */
  uint64_t budget;  /* bytes of the compute tier the scheduler takes at tz_sched_declare and
                       never exceeds; 0: the largest free range of the tier */
  int lookahead;    /* phases after the one last entered whose blocks may be brought in, across
                       step boundaries; 0 none; default 2 */
  int record;       /* 0: the order is the declared one. 1: the phases given to tz_sched_declare
                       are a table, and the order is recorded on the first step */
  tz_lane *lane;    /* the compute lane (a CUDA stream lane on a GPU), borrowed; NULL: the
                       scheduler makes and owns a CPU lane */
  int jitter_us;    /* test mode: random delays up to this on the compute lane, the progress
                       engine and the runtime's copy lane; 0 off */
  uint64_t seed;    /* for jitter */
  int trace_step;   /* the step whose lanes are traced (-1: none, the default) */
  const char
      *trace_path;    /* where tz_sched_destroy writes that trace if not written before; copied */
  int64_t timeout_ms; /* the longest one host wait inside the scheduler may take before it fails
                         with TZ_ETIMEDOUT and says what it waited for; default 60000 */
  int stage_homes;    /* 1: blocks homed in neither host nor device memory (nvme) go through the
                         scheduler's staging chunks on a CPU lane too (tests of the device lane's
                         path); with a device lane they always do. Default 0 */
  uint64_t stage_chunk_bytes; /* the size of each staging chunk, a piece of a staged transfer
                                 (the nvme tier's requests of one piece are in flight at once);
                                 0 (default): the runtime's chunk_bytes */
  int stage_chunks;           /* staging chunks per transfer lane of staged blocks, so that as
                                 many staged transfers move at once (one's disk hop beside
                                 another's device copy); 0 (default): 1 */
  tz_lane *home_lane; /* the lane home phases run on, borrowed; NULL: the scheduler makes and
                         owns a CPU lane "home" at declare when a declared phase is a home
                         phase. It must run host functions and wait on the compute lane's
                         fences and on transfer fences. */
  int debug;          /* 1: every decision on stderr (tierzero.sched_debug), as TZ_SCHED_DEBUG=1
                         in the environment does */
  int wait_for_write_back; /* 1 (default): a copy brought in ahead of need waits for a write-back
                              in flight when the copy it frees is used later than every copy that
                              could go now (sched_window.c, evict_one); 0: evicts the one that can
                              go now */
  int defer_rewrite; /* 1: a dirty copy whose next use in the step is a compute phase writing it
                        again (a gradient added into over micro-batches) is written back only
                        then, or when the window needs its room, or at a sync; 0 (default): as
                        soon as no running phase writes it (sched_pump.c, decide) */
  int carry; /* 1 (default): a copy the window still holds serves the next step too; 0: a copy
                serves only its own step, and each step reads every block from its home again
                (the window a working set of the step, never a cache across steps); a copy still
                busy (its write-back not landed) serves the next step's phase only when the
                client waits for that phase and the lane has nothing else to run, since its home
                would get those bytes only later */
  uint64_t queue_bytes; /* the most bytes of transfers issued and not yet complete on one
                           transfer lane (a direction between two tiers); a transfer decided
                           beyond it waits in the scheduler's line, the one needed soonest
                           first (a fill by the phase its copy was placed for, a write-back by
                           when it was decided), until earlier ones of its lane complete (one is
                           always let through). What
                           an issued transfer queues, a device's copy engine or work queue takes
                           in order, and anything else queued there waits behind it. Staged
                           transfers have their chunks instead. 0 (default): no limit */
};
void tz_sched_params_init(struct tz_sched_params *p);

/* The scheduler borrows rt and its tiers; it must be destroyed before them. params.debug, or
 * TZ_SCHED_DEBUG=1 in the environment, prints every decision on stderr. */
int tz_sched_create(tz_runtime *rt, const struct tz_sched_params *p, tz_sched **out);
/* Waits for every phase entered and every transfer issued, then frees the scheduler's memory in
 * the compute tier and its lane. NULL is a no-op. */
void tz_sched_destroy(tz_sched *s);

/* A block of `bytes` whose home is `home` (borrowed; at least bytes long). Its current contents
 * are the block's. A home in params.compute is used in place (above). Only before
 * tz_sched_declare. *id counts from 0. */
int tz_sched_block_add(tz_sched *s, const char *name, uint64_t bytes, const tz_extent *home,
                       int *id);

/* The smallest budget that phases[0..n) can run in: the largest working set of one phase (each
 * block rounded to the compute tier's alignment; blocks used in place count nothing) plus one
 * chunk for the compute lane. Every phase counts as a compute phase here; tz_sched_declare_homes
 * leaves its home phases out (they take no budget), and tz_sched_stats.min_budget says what it
 * found. */
int tz_sched_min_budget(tz_sched *s, const struct tz_phase_decl *phases, int n, uint64_t *bytes);

/* Declares the phases (copied), once. Takes the budget from the compute tier. TZ_ENOMEM when the
 * budget is below tz_sched_min_budget, with a message saying how many bytes are missing. */
int tz_sched_declare(tz_sched *s, const struct tz_phase_decl *phases, int n);
/* The same, with at_home[i] nonzero making phase i a home phase (at_home NULL: none; n entries,
 * read during the call). Every block a home phase uses must have a home in host memory (a host
 * tier, or the compute tier when that is host memory): TZ_EINVAL naming the phase and the block
 * otherwise. The first home phase makes the home lane if params.home_lane is NULL. */
int tz_sched_declare_homes(tz_sched *s, const struct tz_phase_decl *phases, int n,
                           const int *at_home);

/* What tz_sched_enter gives the client: where the phase's blocks are in the compute tier. */
struct tz_view {
  uint64_t step;
  int phase;
  const char *name;
  int n_blocks;
  struct tz_view_block {
    int block, access;
    void *ptr;      /* in the compute tier: a device pointer on a GPU tier, else a host pointer;
                       for a block used in place, its home; for a home phase, the home (a host
                       pointer) */
    uint64_t bytes; /* the block's size */
  } blocks[TZ_SCHED_MAX_USES]; /* in the order of the phase's uses */
  void *scratch; /* the compute lane's chunk in the compute tier, for the phase's own use;
                    NULL (and 0 bytes) for a home phase */
  uint64_t scratch_bytes;
  tz_lane *lane; /* the compute lane; the home lane for a home phase */
};

/* Enters phase `phase` (an index into the declared phases). Makes the compute lane (the home lane
 * for a home phase) wait on fences for the phase's blocks; fills *view. A home phase never keeps
 * the host waiting: its lane waits for the write-backs it needs. A phase other than the one the
 * order expects is reported (a warning, stats.order_changes) and handled: the order is recorded
 * again from this step on. */
int tz_sched_enter(tz_sched *s, int phase, struct tz_view *view);
/* Queues fn(arg) on the phase's lane (compute, or home for a home phase), behind the current
 * phase's inputs. Between enter and leave. fn returns 0 or a negative TZ_E* code with a message;
 * a failure becomes the scheduler's error. */
int tz_sched_submit(tz_sched *s, int (*fn)(void *arg), void *arg);
/* Leaves the phase entered last: records a fence on its lane; when it completes the phase's
 * written blocks become dirty (and are written back) and its pins drop; a home phase's writes
 * are then in the homes. */
int tz_sched_leave(tz_sched *s, int phase);
/* Ends a step. In recording mode the first step's order becomes the order. */
int tz_sched_step_end(tz_sched *s);

/* Waits on the host until every phase entered so far has completed and every dirty block has been
 * written back to its home. Then the homes hold the latest contents. */
int tz_sched_sync(tz_sched *s);

/* Latest contents of a block into dst (bytes long), waiting for phases in flight that use it
 * (for a block used in place, the home is read once they have completed). For tests and
 * checkpoints, not for the step. */
int tz_sched_block_load(tz_sched *s, int id, void *dst);
/* tz_sched_block_load's first len bytes of the block (all of it where len is larger): a caller's
 * buffer shorter than the block's padded bytes. */
int tz_sched_block_load_bytes(tz_sched *s, int id, void *dst, uint64_t len);
/* Replaces a block's contents from the host: waits for phases in flight that use the block, writes
 * its home and makes the block a new generation, so that copies made earlier (prefetched ones
 * included) are stale and are brought in again before use. */
int tz_sched_block_store(tz_sched *s, int id, const void *src);
/* tz_sched_block_store with the contents written by fill(dst, bytes, arg) into the scheduler's
 * own staging buffer (the block's bytes; the transfer's padding past them is zeroed after): a
 * caller that makes the bytes (a cast, a slice of a larger buffer) stages no copy of its own. */
int tz_sched_block_fill(tz_sched *s, int id, void (*fill)(void *dst, uint64_t bytes, void *arg),
                        void *arg);
/* A block's home written in place by the client, between phases (the trainer's pending update):
 * begin waits for the phases and transfers that use the block and gives its home, which must
 * hold the latest generation (TZ_EINVAL when a copy is newer: tz_sched_sync first); end, with the
 * writer's status, makes what the home holds the block's new generation, as tz_sched_block_store
 * does (rc < 0 fails the scheduler with it). No phase may use the block in between. */
int tz_sched_home_begin(tz_sched *s, int id, tz_extent *home);
int tz_sched_home_end(tz_sched *s, int id, int rc);

/* ---- accounting ---- */

struct tz_sched_stats {
  uint64_t steps;                /* tz_sched_step_end calls */
  uint64_t phases;               /* phase runs completed */
  uint64_t fills, fill_bytes;    /* home -> compute */
  uint64_t flushes, flush_bytes; /* compute -> home (write-back) */
  uint64_t hits;                 /* block uses served by a copy already there or on its way */
  uint64_t in_place;        /* block uses by entered phases of blocks homed in the compute tier,
                               served by their home: never fills, write-backs or hits */
  uint64_t evictions;       /* copies dropped to make room */
  uint64_t flush_waits;     /* reservations ahead of need deferred to a write-back in flight
                               rather than evicting a copy used sooner (core/sched_window.c) */
  uint64_t refills;         /* stale copies brought in again */
  uint64_t order_changes;   /* phases entered out of the expected order */
  uint64_t budget;          /* bytes the scheduler holds in the compute tier */
  uint64_t min_budget;      /* tz_sched_min_budget of the declared phases */
  uint64_t used, peak_used; /* of the budget, now and at most; checked at every decision */
  uint64_t over_budget;     /* decisions that found used > budget: 0 unless there is a bug */
  uint64_t staging;         /* pinned host bytes of the scheduler's staging chunks, reserved at
                               declare outside the budget: params.stage_chunks per transfer lane
                               of blocks homed in neither host nor device memory, on a device
                               lane */
  uint64_t staging_peak;    /* the most staging chunks held by transfers at once */
  uint64_t queue_peak;      /* the most bytes issued and not complete on one transfer lane */
  uint64_t queue_waits;     /* transfers that waited in line (params.queue_bytes) */
  uint64_t line_jumps;      /* transfers put into the line ahead of one waiting there, needed
                               later (the line goes by need, not by the order decided) */
  double stall_s;           /* compute-lane time waiting on fences, all compute phases */
  double compute_s;         /* compute-lane time running phases */
  double home_stall_s;      /* home-lane time waiting on fences, all home phases */
  double home_s;            /* home-lane time running home phases */
};
void tz_sched_stats(tz_sched *s, struct tz_sched_stats *out);

struct tz_sched_phase_stats {
  const char *name;
  uint64_t runs, stalls; /* stalls: runs that waited for their inputs */
  double stall_s;        /* its lane's idle time waiting for this phase's inputs */
  double compute_s;      /* its lane's time from inputs ready to the phase's fence */
  int at_home;           /* a home phase: the times above are the home lane's */
};
/* Fills up to max entries (one per declared phase); returns the number of phases. */
int tz_sched_phase_stats(tz_sched *s, struct tz_sched_phase_stats *out, int max);

/* One per lane: the compute lane, then a transfer lane per (source tier, destination tier) pair
 * the scheduler moved bytes over. busy_s: time with work in flight on the lane. */
struct tz_sched_lane_stats {
  char name[64];         /* "compute", "host->compute" */
  const char *src, *dst; /* tier names; NULL for the compute lane */
  double busy_s;
  uint64_t bytes, ops;
};
int tz_sched_lane_stats(tz_sched *s, struct tz_sched_lane_stats *out, int max);

/* Fills, write-backs and stale refills of one block so far. */
int tz_sched_block_stats(tz_sched *s, int id, uint64_t *fills, uint64_t *flushes,
                         uint64_t *refills);

/* One completed step. It lasts from the end of the previous step's last phase on the compute
 * lane (for the first step: its first enter) to the end of its own. */
struct tz_sched_step_time {
  uint64_t step;
  double seconds;
  double stall_s;   /* compute-lane time its phases waited for their inputs */
  double compute_s; /* compute-lane time its phases ran */
};
/* The last completed steps (up to 256 are kept), oldest first. Returns how many it wrote. */
int tz_sched_step_times(tz_sched *s, struct tz_sched_step_time *out, int max);

/* Writes the Chrome/Perfetto trace (JSON, docs/scheduler.md) of params.trace_step: a track per
 * lane (compute, stalls, each transfer lane) over the time that step ran. TZ_EBUSY when that step
 * has not completed yet, TZ_ENOENT when no step is traced. */
int tz_sched_trace_write(tz_sched *s, const char *path);

#endif
