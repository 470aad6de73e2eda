/* The plan (DESIGN.md "The bound"): for every block of model state, which tier is its home; how
 * much of the compute tier the scheduler gets as its window; and the predicted lower bound on the
 * step's time, the critical path of the step's phases over the lanes that run them.
 *
 * The scheduler uses blocks homed in the compute tier in place: they take no room in its window
 * and cost no copy, so the plan counts them in neither; the window's minimum then depends on the
 * placement (only the blocks homed elsewhere count).
 *
 * The plan knows nothing of models. Its client describes one step as the scheduler will run it:
 * groups of blocks (a model block: the embedding, a layer, the head), each with one block of every
 * kind below, and the phases in order, each with its compute, its collective bytes and the blocks
 * it uses. The plan then
 *   - places each (group, kind) in the compute tier, host or nvme: where the configuration forces
 *     it, there; elsewhere it starts from the fastest tier and moves, one block at a time, the
 *     block whose move costs the bound least per byte freed, until every tier is within its
 *     capacity (the compute tier's with the window that placement needs);
 *   - refuses a compute tier too small for the fixed buffers plus the scheduler's minimum window,
 *     or state that fits nowhere, with a message saying how many bytes are missing where;
 *   - predicts the bound by simulating two steps over the lanes (compute; copies into and out of
 *     the compute tier; the NVMe device, shared by reads and writes) with the rates measured on
 *     this machine, each phase's inputs issued as soon as the window lets the scheduler look that
 *     far ahead, and no copy in for a block the window still holds (kept by the scheduler's
 *     eviction rule: farthest next use first); the second step's duration is the bound.
 * Pure functions of their inputs: tested with made-up machines. */
#ifndef TZ_PLAN_H
#define TZ_PLAN_H

#include <stdint.h>
#include <stdio.h>

enum tz_plan_tier {
  TZ_PLAN_COMPUTE = 0, /* the tier phases run in: HBM, or host memory on a CPU-only machine */
  TZ_PLAN_HOST = 1,    /* pinned host memory */
  TZ_PLAN_NVME = 2,    /* files on NVMe */
  TZ_PLAN_TIERS = 3
};

enum tz_plan_kind {
  TZ_PLAN_PARAM = 0,       /* the rank's shard of the parameters, in the storage dtype */
  TZ_PLAN_MASTER = 1,      /* fp32 master weights of the shard */
  TZ_PLAN_M = 2,           /* Adam first moment */
  TZ_PLAN_V = 3,           /* Adam second moment */
  TZ_PLAN_GRAD = 4,        /* the shard's gradient, accumulated over micro-batches */
  TZ_PLAN_STATE_KINDS = 5, /* the kinds above: the model's state, kept across steps */
  /* The group's input activation (what its backward recomputes from): written by the phase
   * before the group's forward, read by the group's forward and backward; rewritten every
   * micro-batch, kept across no step. A group without one has 0 bytes of it. */
  TZ_PLAN_ACT = 5,
  TZ_PLAN_KINDS = 6
};

#define TZ_PLAN_AUTO (-1) /* in tz_plan_request.force: the plan chooses */

const char *tz_plan_kind_name(int kind); /* "param", "master", "m", "v", "grad", "act" */

/* Machine rates, in bytes or elements or FLOP per second. 0 means unknown: the lanes it costs
 * are treated as free, and the bound says so (tz_plan.unknown_rates). */
struct tz_plan_rates {
  double flops;         /* the compute backend's matrix multiply */
  double copy_in;       /* host -> compute tier */
  double copy_out;      /* compute tier -> host */
  double copy_duplex;   /* both directions at once, bytes per second summed; 0: unknown, the plan
                           then treats the directions as independent */
  double copy_in_both;  /* host -> compute tier while compute -> host runs too; with */
  double copy_out_both; /* compute -> host while host -> compute runs too: how the link shares
                           itself between the directions (0: unknown, each at its own rate) */
  double copy_local;    /* within the compute tier; not in the bound (blocks homed there are used
                           in place), measured for reference */
  double nvme_read;     /* nvme -> host */
  double nvme_write;    /* host -> nvme */
  double nvme_duplex;   /* reads and writes at once, bytes per second summed; 0: unknown, the plan
                           then takes them as time-sharing the disk at nvme_read and nvme_write */
  double adam;          /* Adam elements per second where opt phases run */
  double adam_home;     /* Adam elements per second of the CPU on host memory (home phases) */
  /* The CPU's Adam and the host link share host memory: each moves less beside the other (an
   * H200's step with half of llama-3b's Adam on the CPU: the CPU at about half its rate alone, the
   * link at 32 GB/s in and 38 out where it moves 47 and 48 beside each other). Measured with both
   * running: the CPU's Adam on its home threads while each direction of the link is timed beside
   * the other. 0: unknown. Together they give host memory's rate for the two (host_mem_rate). */
  double adam_home_busy; /* adam_home while the link copies both ways */
  double copy_in_adam;   /* host -> compute tier beside the other direction and the CPU's Adam */
  double copy_out_adam;  /* compute tier -> host beside the other direction and the CPU's Adam */
  /* The CPU's Adam at the homes as a run on this set-up measured it (elements per second over its
   * home phases' time after the first step; 0: no run yet). The probe beside the link measured
   * 1.2-1.4x what a run's homes reach on H200 machines (docs/benchmarks-history.md, "Issue 26
   * on the H200, 2026-12-04, later"), and the error lands on the step through the folded update:
   * the home phases run at the slower of it and the probe's rate. */
  double adam_home_run;
  /* The disk's reads and writes together over the time it was busy, bytes per second, as a run
   * on this set-up moved them (0: no run yet). The probe times one 64 MiB transfer each way; a
   * step's transfers are larger and several are in flight, and on a virtual disk they moved 1.38x
   * the probe's rate together (docs/benchmarks-history.md, "The 15.5 B model ..."). Where it is
   * above the probe's (nvme_duplex, else the slower direction), the plan costs the disk at the
   * probe's rates scaled up to it (tz_plan_disk_rates): a bound costed slower than the machine
   * ran is not a lower bound. */
  double nvme_run;
  double collective; /* bus bytes per second of all-gather and reduce-scatter (0: one rank) */
};

#define TZ_PLAN_MAX_USES 8

/* One phase of the step, as the scheduler runs it. */
struct tz_plan_phase {
  char name[24];
  double flop;       /* compute on the compute lane */
  double coll_bytes; /* bytes moved by this rank's collectives inside the phase */
  double coll_async; /* bytes of collectives issued at the phase's start that run beside its
                        compute (tierzero.overlap_collectives): on a lane of their own, one after
                        the other; the next phase starts when they are done */
  double adam_elems; /* optimizer elements updated in the phase */
  int at_home;       /* a home phase (tz_sched_declare_homes): it runs on the CPU at its blocks'
                        host homes, takes no window room and copies nothing; its Adam elements
                        at rates.adam_home */
  int n_uses;
  struct tz_plan_use {
    int group, kind; /* the block */
    int access;      /* enum tz_access (core/sched.h): 1 read, 2 write, 3 read and write */
  } uses[TZ_PLAN_MAX_USES];
};

/* Bytes per second host memory moves for the host link's copies (both ways) and the CPU's Adam
 * together, each element of that Adam moving adam_bytes: what the rates measured beside each
 * other add up to. 0 when they were not measured. */
double tz_plan_host_mem_rate(const struct tz_plan_rates *r, double adam_bytes);

/* The disk rate the probe measured that a run's nvme_run is compared with: nvme_duplex (reads
 * and writes at once), else the slower direction; 0 when the disk was not timed. */
double tz_plan_disk_probe_rate(const struct tz_plan_rates *r);
/* r with its disk rates (nvme_read, nvme_write, nvme_duplex) scaled by nvme_run over
 * tz_plan_disk_probe_rate where that is above 1: what the plan costs the disk at. */
struct tz_plan_rates tz_plan_disk_rates(const struct tz_plan_rates *r);

struct tz_plan_request {
  int n_groups;
  const uint64_t (*bytes)[TZ_PLAN_KINDS]; /* n_groups rows: bytes of each block (the rank's) */
  int n_phases;
  const struct tz_plan_phase *phases; /* one step, in order */
  uint64_t capacity[TZ_PLAN_TIERS];   /* bytes each tier may hold (compute: the HBM budget) */
  /* optional: where nvme's capacity comes from, for the refusal when it is short ("half the
   * free space of DIR, 12 GiB free"); NULL: no nvme directory is configured */
  const char *nvme_capacity_why;
  uint64_t compute_fixed;   /* compute-tier bytes the client takes before any home: activations,
                               gathered weights, full gradients */
  uint64_t compute_acts;    /* optional, for the table (tz_plan_print): of compute_fixed, the
                               activations and their scratch */
  uint64_t align;           /* the compute tier's alignment (blocks are rounded up to it) */
  uint64_t chunk;           /* the runtime's chunk: the scheduler keeps one for its lane */
  uint64_t window;          /* the scheduler's budget; 0: all the compute tier has left */
  int lookahead;            /* phases the scheduler may look ahead; <= 0: unlimited */
  int widen_moves;          /* moves out of the compute tier tried past the best placement seen
                               while the window is widened (plan.c, widen_window); 0: stop at
                               the first move that does not lower the bound */
  int no_carry;             /* the scheduler's copies serve only their own step
                               (tz_sched_params.carry 0): each step reads every block again */
  int force[TZ_PLAN_KINDS]; /* a tier, or TZ_PLAN_AUTO */
  const int8_t *force_each; /* optional (n_groups * TZ_PLAN_KINDS, row-major): a tier per
                               block, or TZ_PLAN_AUTO; wins over force[] */
  int home_on_compute;      /* home phases share the compute lane's cores (a CPU-only machine):
                               their time goes on that lane */
  double home_adam_bytes;   /* bytes of host memory the CPU's Adam reads and writes for one
                               element at the homes (master, m, v both ways, the gradient, the
                               parameter's copy); 0: the host-memory lane is not costed */
  struct tz_plan_rates rates;
};

struct tz_plan {
  int n_groups;
  int8_t *tier;                 /* (n_groups, TZ_PLAN_KINDS): the home tier of each block */
  uint64_t used[TZ_PLAN_TIERS]; /* home bytes in each tier (compute: without fixed, window) */
  uint64_t compute_fixed;
  uint64_t compute_acts; /* of compute_fixed, the activations (the request's) */
  uint64_t kind_bytes[TZ_PLAN_KINDS][TZ_PLAN_TIERS]; /* home bytes of each kind in each tier */
  int kind_blocks[TZ_PLAN_KINDS][TZ_PLAN_TIERS];     /* blocks of them (of more than 0 bytes) */
  uint64_t window;     /* the scheduler's budget in the compute tier */
  uint64_t min_window; /* for this placement: the largest phase's blocks not homed in the
                          compute tier, plus one chunk (tz_sched_min_budget of the same) */
  uint64_t capacity[TZ_PLAN_TIERS];
  int lookahead;                    /* phases the window lets the scheduler look ahead (the
                                       fewest over the step) */
  double bound_s;                   /* predicted step time: the larger of path_s and link_s */
  double path_s;                    /* the simulated critical path over the lanes */
  double link_s;                    /* the least the step takes with the host link moving both
                                       directions at once at most at its shared rate and the
                                       window carrying copies across a run of phases' ends
                                       (docs/training.md, "The bound's link term") */
  double compute_s;                 /* the compute lane's busy time in one step */
  double lane_s[TZ_PLAN_TIERS + 1]; /* busy time of: copy in, copy out, nvme, the CPU at
                                       the homes (home phases; 0 with home_on_compute) */
  double host_mem_s; /* the host memory's busy time: the link's bytes and the CPU's Adam at the
                        homes over their rate together (0: not costed; tz_plan_host_mem_rate) */
  double moved[TZ_PLAN_TIERS]; /* bytes per step read from each home tier (compute: 0, its
                                  blocks are used in place; reads the window holds: 0) */
  int unknown_rates;           /* some lane was costed with an unknown (0) rate */
  int moves;                   /* blocks the plan moved down from the fastest tier */
};

/* Places the blocks and predicts the bound. The caller owns *out (tz_plan_free).
 * Errors: TZ_EINVAL (a malformed request), TZ_ENOMEM when the compute tier cannot hold the fixed
 * buffers, the forced homes and the minimum window, or when state fits in no tier allowed to it;
 * the message says how many bytes are missing and where. */
int tz_plan_make(const struct tz_plan_request *req, struct tz_plan *out);
void tz_plan_free(struct tz_plan *p); /* frees what tz_plan_make allocated; NULL-safe fields */

/* The bound of req with the placement tiers (n_groups * TZ_PLAN_KINDS) and this window, without
 * placing anything: for the client's own what-ifs and for tests. Fills the timing fields of out
 * (bound_s, compute_s, lane_s, moved, lookahead); out->tier is not touched. */
int tz_plan_bound(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                  struct tz_plan *out);

/* One phase of the simulated second step (tz_plan_timeline), its times in seconds from the end of
 * the first step's last phase (the second step's origin). A compute phase: entered (its window
 * reaches it), its inputs arrived, its compute from start to end, its write-backs done at back.
 * A home phase: the same on the home lane (inputs: the write-backs it waited for). */
struct tz_plan_event {
  char name[24];
  int at_home;
  double entered, inputs, start, end, back;
  double in_bytes, out_bytes; /* copied in for it, written back after it */
};

/* The second step of the bound's simulation phase by phase, into ev (req->n_phases entries), with
 * the homes tiers and this window: where the bound's time goes, for `TZ_LOG=debug tz-train
 * --plan` and for tests. */
int tz_plan_timeline(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                     struct tz_plan_event *ev);

/* Prints tz_plan_timeline's events, one line a phase, each starting with indent. */
void tz_plan_print_timeline(FILE *f, const struct tz_plan_event *ev, int n, const char *indent);

/* The scheduler's minimum window for req before placement: the largest phase's blocks (each
 * rounded up to align) plus one chunk, as tz_sched_min_budget counts it, with the blocks forced
 * into the compute tier (force, force_each) counted as used in place and every other block as
 * homed elsewhere. That is the largest minimum of any placement tz_plan_make may choose, so a
 * window of it is enough whatever it chooses; tz_plan.min_window is the one of its placement. */
uint64_t tz_plan_min_window(const struct tz_plan_request *req);

/* Prints the placement per kind (blocks and bytes in each tier), the window, and the bound with
 * its lanes, for `tz-train --plan` and the start of a run. group_names may be NULL. */
void tz_plan_print(FILE *f, const struct tz_plan *p, const char *const *group_names);

/* The table of bytes per kind of state (param, grad, master, m, v, the layers' inputs, the
 * buffers, the activations, the window) and per tier, with each row's and column's total, as
 * estimate_zero3_model_states_mem_needs prints DeepSpeed's; one line per row, each starting with
 * indent. */
void tz_plan_print_table(FILE *f, const struct tz_plan *p, const char *indent);

/* What the state of req needs in all, whatever the placement, into buf (cut to len): "param X,
 * grad X, master X, m X, v X, the layers' inputs X; buffers X (activations X)", for the
 * refusals' messages. */
void tz_plan_state_summary(const struct tz_plan_request *req, char *buf, size_t len);

#endif
