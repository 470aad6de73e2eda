/* The plan's bound (core/plan.h, core/plan_bound.c) on made-up machines and requests, no trainer:
 * a phase waits for its inputs and slower tiers cost more; the window's hits; home phases; the
 * window traded for homes; write-backs, room, the disk's duplex and learned rates, the host link
 * both ways, overlapped collectives. */
#define _GNU_SOURCE
#include "core/error.h"
#include "core/plan.h"
#include "core/sched.h" /* the uses' access: enum tz_access */
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bound on a made-up machine: a phase waits for its inputs; slower tiers cost more. */
static void test_bound(void **state) {
  (void)state;
  uint64_t bytes[2][TZ_PLAN_KINDS] = {{1000000, 2000000, 2000000, 2000000, 2000000},
                                      {1000000, 2000000, 2000000, 2000000, 2000000}};
  struct tz_plan_phase ph[4];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "fwd%d", i);
    ph[i].flop = 1e9;
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_PARAM, 1};
    snprintf(ph[2 + i].name, sizeof ph[2 + i].name, "opt%d", i);
    ph[2 + i].adam_elems = 5e5;
    ph[2 + i].n_uses = 2;
    ph[2 + i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, 3};
    ph[2 + i].uses[1] = (struct tz_plan_use){i, TZ_PLAN_PARAM, 2};
  }
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = 2;
  r.bytes = (const uint64_t(*)[TZ_PLAN_KINDS])bytes;
  r.n_phases = 4;
  r.phases = ph;
  r.align = 4096;
  r.chunk = 4096;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e9,
                                   .copy_out = 1e9,
                                   .copy_local = 1e11,
                                   .nvme_read = 1e8,
                                   .nvme_write = 1e8,
                                   .adam = 1e9};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  struct tz_plan a, b, c;
  memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &a));
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &b));
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 1 << 24, &c));
  /* Compute: 2 x 1 ms of forward, 2 x 0.5 ms of Adam = 3 ms; inputs in place cost 10-20 us. */
  assert_true(a.compute_s > 2.99e-3 && a.compute_s < 3.01e-3);
  assert_true(a.bound_s >= a.compute_s && a.bound_s < 3.2e-3);
  /* From host, through a window that holds every block: after the first step every read is a
   * hit, and the 6 MB written per step go out at 1 GB/s. */
  assert_true(b.bound_s > a.bound_s);
  assert_true(b.lane_s[0] == 0 && b.moved[TZ_PLAN_HOST] == 0);
  assert_true(b.lane_s[1] > 5.99e-3 && b.lane_s[1] < 6.01e-3);
  assert_true(b.bound_s >= b.lane_s[1]);
  /* The write-backs overlap the next step's compute: the out lane (6 ms) is the bound, not the
   * compute and the copies one after the other (9 ms). */
  assert_true(b.bound_s < b.lane_s[1] + 1e-6);
  /* From nvme: 60 ms of writes through the device, which is the bound. */
  assert_true(c.bound_s > b.bound_s);
  assert_true(c.bound_s >= c.lane_s[2] && c.bound_s < c.lane_s[2] + 1e-6);
  assert_true(c.lane_s[2] > 0.059 && c.lane_s[2] < 0.061);
  /* With no window to look ahead, every input waits for the phase before, and the window no
   * longer holds every block: some are read again every step. Slower still. */
  struct tz_plan d;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 4096 + 4 * 1024 * 1024, &d));
  assert_true(d.lookahead < c.lookahead);
  assert_true(d.moved[TZ_PLAN_NVME] > c.moved[TZ_PLAN_NVME]);
  assert_true(d.bound_s >= c.bound_s);
}

static void assert_close(double got, double want) {
  if (!(fabs(got - want) <= 1e-12 * fabs(want))) {
    fprintf(stderr, "got %.17g, want %.17g\n", got, want);
    fail();
  }
}

/* A plan request for the bound's tests: groups of blocks (bytes), one step's phases, 4 KiB
 * alignment, the scheduler's chunk, nothing forced. */
static struct tz_plan_request plan_request(int n_groups, const uint64_t (*bytes)[TZ_PLAN_KINDS],
                                           const struct tz_plan_phase *ph, int n_phases,
                                           uint64_t chunk) {
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = n_groups;
  r.bytes = bytes;
  r.n_phases = n_phases;
  r.phases = ph;
  r.align = 4096;
  r.chunk = chunk;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  return r;
}

/* A block the scheduler's window still holds costs no copy in: the bound and the bytes moved
 * follow the window's hits and misses (the scheduler's eviction rule: farthest next use first).
 * Blocks of 1 MiB at 1 ms a copy; 0.5 ms of compute per phase. */
static void test_plan_bound_counts_window_hits(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3;
  uint64_t bytes[3][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_PARAM] = bytes[1][TZ_PLAN_PARAM] = bytes[2][TZ_PLAN_PARAM] = S;
  bytes[2][TZ_PLAN_MASTER] = S;
  /* Two micro-batches' forward over layers 0 and 1 (as gradient accumulation runs them), then a
   * phase that needs two blocks. */
  struct tz_plan_phase ph[5];
  memset(ph, 0, sizeof ph);
  const char *names[5] = {"fwd0.0", "fwd1.0", "fwd0.1", "fwd1.1", "head"};
  const int group[5] = {0, 1, 0, 1, 2};
  for (int i = 0; i < 5; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "%s", names[i]);
    ph[i].flop = 5e8;
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){group[i], TZ_PLAN_PARAM, TZ_ACCESS_READ};
  }
  ph[4].n_uses = 2;
  ph[4].uses[1] = (struct tz_plan_use){2, TZ_PLAN_MASTER, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(3, bytes, ph, 4, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e3 * (double)S,
                                   .copy_out = 1e3 * (double)S,
                                   .nvme_read = 1e3 * (double)S};
  int8_t tiers[3 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;

  /* The four forward phases, a window of one phase's working set: each layer evicts the other,
   * and every use is a miss. No phase can be prefetched beside another: each waits for the one
   * before, then for its copy. 4 x (t + c), as when every use was copied in. */
  r.n_phases = 4;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_int_equal(p.lookahead, 0);
  assert_close(p.bound_s, 4 * (t + c));
  assert_close(p.compute_s, 4 * c);
  assert_close(p.lane_s[0], 4 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 4.0 * (double)S);

  /* A window that holds both layers: after the first step nothing is copied in, and the step is
   * its compute. The same from nvme: no read from the disk either. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, 4 * c);
  assert_true(p.lane_s[0] == 0 && p.lane_s[2] == 0 && p.moved[TZ_PLAN_HOST] == 0);
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, 4 * c);
  assert_true(p.lane_s[0] == 0 && p.lane_s[2] == 0 && p.moved[TZ_PLAN_NVME] == 0);
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);

  /* With head, the same window (head's working set, the minimum): head evicts layer 1 (used
   * again later than layer 0), then layer 0, so each step reads both layers for the first
   * micro-batch and finds them there for the second. Lookahead: the three phases after fwd0.0
   * are prefetched one phase ahead, fwd0.0 and head none. The second step, from head's end in
   * the first (6 ms):
   *   fwd0.0 copy 6-7, compute 7-7.5;   fwd1.0 copy 7-8, compute 8-8.5;
   *   fwd0.1 and fwd1.1 hits, compute 8.5-9.5;   head copies 9.5-11.5, compute 11.5-12.
   * 6 ms with 4 MiB copied in, where copying every use in read 6 MiB and took 7 ms. */
  r.n_phases = 5;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_int_equal(p.lookahead, 0);
  assert_close(p.bound_s, 6e-3);
  assert_close(p.compute_s, 5 * c);
  assert_close(p.lane_s[0], 4 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 4.0 * (double)S);

  /* A window below that minimum: head's second block cannot stay beside its first (it is copied
   * in and dropped), and every use is a miss: 4 x (t + c) + (2t + c). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.bound_s, 4 * (t + c) + 2 * t + c);
  assert_close(p.lane_s[0], 6 * t);
  assert_close(p.moved[TZ_PLAN_HOST], 6.0 * (double)S);
}

/* A block written first takes room in the window but is not copied in; the written copy is
 * copied out and stays, so the next phase that reads it finds it there. */
static void test_plan_bound_keeps_written_copies(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_GRAD] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "bwd0");
  ph[0].flop = 5e8;
  ph[0].n_uses = 1;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_GRAD, TZ_ACCESS_WRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "opt0");
  ph[1].adam_elems = 5e5;
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){0, TZ_PLAN_GRAD, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){
      .flops = 1e12, .copy_in = 1e3 * (double)S, .copy_out = 1e3 * (double)S, .adam = 1e9};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  /* Each step: bwd0 computes, its copy goes out (t) while opt0 computes on the copy kept. Steps
   * repeat as fast as the slower of the compute path (2c) and the out lane (t): the write-back
   * of one step overlaps the next (the bound does not model the next bwd0 waiting to overwrite a
   * copy still being written back). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_true(p.lane_s[0] == 0 && p.moved[TZ_PLAN_HOST] == 0);
  assert_close(p.lane_s[1], t);
  assert_close(p.compute_s, 2 * c);
  assert_close(p.bound_s, 2 * c > t ? 2 * c : t);
}

/* A copy in needs room in the window, and a dirty copy holds its room until it is written back:
 * p0 updates A (fill, compute, write-back), p1 reads B, and the window holds one of them. B's
 * copy in waits for A's write-back, so a step is three copies one after the other (3t), not
 * two with the write-back beside the second copy in (2t). */
static void test_plan_bound_copy_waits_for_room(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_MASTER] = bytes[1][TZ_PLAN_PARAM] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "p0");
  ph[0].n_uses = 1;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "p1");
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){1, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(2, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){
      .flops = 1e12, .copy_in = 1e3 * (double)S, .copy_out = 1e3 * (double)S, .adam = 1e9};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_int_equal(p.lookahead, 0);
  assert_close(p.lane_s[0], 2 * t);
  assert_close(p.lane_s[1], t);
  assert_close(p.bound_s, 3 * t);
  /* With room for both, B comes in while A goes out, and A stays: one copy in a step, beside the
   * write-back (t). */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, t);
}

/* The two phases of the disk tests below: p0 updates block 0's master of S bytes, p1 block 1's
 * (bytes and ph: the caller's, which the request points into). */
static struct tz_plan_request disk_plan(uint64_t S, uint64_t chunk,
                                        uint64_t bytes[2][TZ_PLAN_KINDS],
                                        struct tz_plan_phase ph[2]) {
  memset(bytes, 0, sizeof(uint64_t) * 2 * TZ_PLAN_KINDS);
  bytes[0][TZ_PLAN_MASTER] = bytes[1][TZ_PLAN_MASTER] = S;
  memset(ph, 0, sizeof *ph * 2);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  }
  return plan_request(2, bytes, ph, 2, chunk);
}

/* The disk reading and writing at once: the bytes the two directions share cost nvme_duplex
 * (their sum a second), the rest its own direction's rate; without nvme_duplex the two time-share
 * the disk at the one-way rates. p0 updates A, p1 updates B, both homed on nvme, and the window
 * holds one of them, so each step reads and writes both; reads of S take r, writes w, a read and
 * a write of S at once d. */
static void test_plan_bound_disk_duplex(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double r_s = 1e-3, w_s = 0.5e-3, d_s = 2e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  struct tz_plan_phase ph[2];
  struct tz_plan_request r = disk_plan(S, chunk, bytes, ph);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e6 * (double)S,
                                   .copy_out = 1e6 * (double)S,
                                   .nvme_read = (double)S / r_s,
                                   .nvme_write = (double)S / w_s};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.moved[TZ_PLAN_NVME], 2.0 * (double)S);
  assert_close(p.lane_s[2], 2 * (r_s + w_s));
  assert_true(p.bound_s >= 2 * (r_s + w_s) && p.bound_s < 2 * (r_s + w_s) + 1e-4);
  /* At once the disk moves less than time-sharing gives: 2d for the two reads and writes. */
  r.rates.nvme_duplex = 2.0 * (double)S / d_s;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s);
  assert_close(p.bound_s, 2 * d_s);
  /* ... and where it moves more, time-sharing's figure stays: the lane is never faster. */
  r.rates.nvme_duplex = 2.0 * (double)S / (0.5 * (r_s + w_s));
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * (r_s + w_s));
  /* p1 only reads B: reads of 2S and a write of S, S each way at once (d), the second read
   * alone (r). */
  r.rates.nvme_duplex = 2.0 * (double)S / d_s;
  ph[1].uses[0].access = TZ_ACCESS_READ;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], d_s + r_s);
  assert_true(p.bound_s >= d_s + r_s);
  /* Reads only: nothing to share, 2r. */
  ph[0].uses[0].access = TZ_ACCESS_READ;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * r_s);
}

/* A run's disk rate (nvme_run) above the probe's scales the probe's disk rates up to it: the same
 * plan as test_plan_bound_disk_duplex's first, its lane 1.5 times faster with a run at 1.5 times
 * the probe's "at once" rate; one at or below the probe's changes nothing (the faster of the
 * two), and without nvme_duplex the slower direction is the probe's rate. */
static void test_plan_bound_disk_learned(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double r_s = 1e-3, w_s = 0.5e-3, d_s = 2e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  struct tz_plan_phase ph[2];
  struct tz_plan_request r = disk_plan(S, chunk, bytes, ph);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e6 * (double)S,
                                   .copy_out = 1e6 * (double)S,
                                   .nvme_read = (double)S / r_s,
                                   .nvme_write = (double)S / w_s,
                                   .nvme_duplex = 2.0 * (double)S / d_s};
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_NVME, sizeof tiers);
  struct tz_plan p;
  r.rates.nvme_run = 1.5 * r.rates.nvme_duplex;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s / 1.5);
  assert_close(p.bound_s, 2 * d_s / 1.5);
  r.rates.nvme_run = 0.5 * r.rates.nvme_duplex; /* slower than the probe: the probe's */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], 2 * d_s);
  /* No "at once" rate: the probe's is the slower direction's (reads, S / r_s); a run at twice
   * it halves the time-shared lane. */
  r.rates.nvme_duplex = 0;
  r.rates.nvme_run = 2.0 * (double)S / r_s;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &p));
  assert_close(p.lane_s[2], (r_s + w_s));
  struct tz_plan_rates e = tz_plan_disk_rates(&r.rates);
  assert_close(e.nvme_read, 2.0 * (double)S / r_s);
  assert_close(e.nvme_write, 2.0 * (double)S / w_s);
  assert_true(e.flops == r.rates.flops && e.copy_in == r.rates.copy_in);
}

/* The host link moves less with both directions busy than each alone, and a window carries
 * only so much of a run of phases' copies across its ends. K = 12 phases p0..p11 update their
 * own block of S (read, write) with no compute, then bwd computes C = 10t with none; copies of S
 * take t each way alone; the window W holds two blocks and a chunk. Farthest next use keeps
 * blocks 0 and 11 across the step's end, so each step copies in the other ten and writes all
 * twelve back (the out lane busy 12t). p1's copy comes in during bwd; each later one follows the
 * write-back that frees its room, one t after another, and the last two write-backs run into
 * bwd: the lanes' path is C + 10t. The link term: the run
 * p0..p11 computes nothing, and of its 22S the window carries at most 2W across its ends; the
 * rest crosses while it runs, at most at the link's rate. */
static void test_plan_bound_link_both_ways(void **state) {
  (void)state;
  enum { K = 12 };
  const uint64_t S = 1 << 20, chunk = 4096, W = 2 * S + chunk;
  const double t = 1e-3, C = 10 * t;
  uint64_t bytes[K][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  struct tz_plan_phase ph[K + 1];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < K; i++) {
    bytes[i][TZ_PLAN_MASTER] = S;
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].n_uses = 1;
    ph[i].uses[0] = (struct tz_plan_use){i, TZ_PLAN_MASTER, TZ_ACCESS_READWRITE};
  }
  snprintf(ph[K].name, sizeof ph[K].name, "bwd");
  ph[K].flop = C * 1e12;
  struct tz_plan_request r = plan_request(K, bytes, ph, K + 1, chunk);
  r.rates =
      (struct tz_plan_rates){.flops = 1e12, .copy_in = (double)S / t, .copy_out = (double)S / t};
  int8_t tiers[K * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_false(p.unknown_rates);
  assert_close(p.moved[TZ_PLAN_HOST], (K - 2.0) * (double)S);
  assert_close(p.lane_s[1], K * t);
  assert_close(p.compute_s, C);
  double path = C + (K - 2) * t;
  assert_close(p.path_s, path);
  /* Nothing known of the two directions at once: each alone, less one window (the out lane's
   * 12S at S/t, less W), below the path. */
  assert_close(p.link_s, C + (K * (double)S - (double)W) * t / (double)S);
  assert_close(p.bound_s, path);
  /* Both at once at 1.2 S/t (0.6 each beside the other): (22S - 2W) / 1.2 is longer than the
   * path, and is the bound. */
  r.rates.copy_in_both = r.rates.copy_out_both = 0.6 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  double link = C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / (1.2 * (double)S / t);
  assert_close(p.path_s, path);
  assert_close(p.link_s, link);
  assert_close(p.bound_s, link);
  /* copy_duplex, where it is above the two beside each other summed, is the link's rate; and
   * where both at once move less than one direction alone, the link is that direction's (a
   * schedule could run the directions one after the other). */
  r.rates.copy_duplex = 1.5 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_close(p.link_s, C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / (1.5 * (double)S / t));
  r.rates.copy_duplex = 0;
  r.rates.copy_in_both = r.rates.copy_out_both = 0.25 * (double)S / t;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, W, &p));
  assert_close(p.link_s, C + ((2 * K - 2.0) * (double)S - 2.0 * (double)W) / ((double)S / t));
  /* A window that holds every block: nothing is copied in after the first step, and the
   * write-backs go out beside bwd and the next forward. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, K * S + chunk, &p));
  assert_true(p.moved[TZ_PLAN_HOST] == 0);
  assert_true(p.bound_s < path);
}

/* Collectives issued at a phase's start run beside its compute (coll_async): a phase takes the
 * longer of the two; in the phase (coll_bytes) they add to it. Two phases of compute c. */
static void test_plan_bound_overlapped_collectives(void **state) {
  (void)state;
  const uint64_t chunk = 4096;
  const double c = 1e-3, a = 0.5e-3, rate = 1e9;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  for (int i = 0; i < 2; i++) {
    snprintf(ph[i].name, sizeof ph[i].name, "p%d", i);
    ph[i].flop = 1e12 * c;
    ph[i].coll_async = rate * a;
  }
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12, .collective = rate};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.bound_s, 2 * c);
  for (int i = 0; i < 2; i++)
    ph[i].coll_async = rate * 3 * a;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_close(p.bound_s, 2 * 3 * a);
  for (int i = 0; i < 2; i++) {
    ph[i].coll_async = 0;
    ph[i].coll_bytes = rate * a;
  }
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, chunk, &p));
  assert_close(p.bound_s, 2 * (c + a));
}

/* A home phase (Adam on the CPU at the host homes) copies nothing; a phase reading what it wrote
 * copies it in after it ends, and it starts after the previous step's compute (a folded update
 * waits for the norm). opt0 at home (h), then fwd0 reading the new parameters (copy t, compute
 * c): each step is h + t + c; on its own lane the CPU's time is the home lane's, with
 * home_on_compute (a CPU-only machine) the compute lane's. */
static void test_plan_bound_home_phases(void **state) {
  (void)state;
  const uint64_t S = 1 << 20, chunk = 4096;
  const double t = 1e-3, c = 0.5e-3, h = 2e-3;
  uint64_t bytes[1][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_PARAM] = S;
  bytes[0][TZ_PLAN_MASTER] = S;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "opt0");
  ph[0].adam_elems = 1e6;
  ph[0].at_home = 1;
  ph[0].n_uses = 2;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_MASTER, TZ_ACCESS_READ | TZ_ACCESS_WRITE};
  ph[0].uses[1] = (struct tz_plan_use){0, TZ_PLAN_PARAM, TZ_ACCESS_WRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "fwd0");
  ph[1].flop = 5e8;
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){0, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  struct tz_plan_request r = plan_request(1, bytes, ph, 2, chunk);
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = 1e3 * (double)S,
                                   .copy_out = 1e3 * (double)S,
                                   .adam = 1e12,
                                   .adam_home = 5e8};
  int8_t tiers[TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  struct tz_plan p;
  /* A window that holds both blocks: the parameters are read again all the same, being new. */
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_false(p.unknown_rates);
  assert_close(p.bound_s, h + t + c);
  assert_close(p.lane_s[3], h);
  assert_close(p.compute_s, c);
  assert_close(p.lane_s[0], t);
  assert_true(p.lane_s[1] == 0);
  assert_close(p.moved[TZ_PLAN_HOST], (double)S); /* the parameters in; no master, no copy out */
  r.home_on_compute = 1;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_close(p.bound_s, h + t + c);
  assert_true(p.lane_s[3] == 0);
  assert_close(p.compute_s, h + c);
  /* The same phase on the compute lane: master comes in and both go out, Adam at its rate. */
  ph[0].at_home = 0;
  r.home_on_compute = 0;
  TZ_ASSERT_OK(tz_plan_bound(&r, tiers, 2 * S + chunk, &p));
  assert_true(p.lane_s[3] == 0);
  assert_close(p.lane_s[1], 2 * t);
  assert_true(p.moved[TZ_PLAN_HOST] == 0); /* the window holds both from the first step */
}

/* Four phases, each reading its own 1 MiB block (1 ms of compute, 2 ms to copy in), the host
 * room for all four; the compute tier's capacity is the caller's. */
enum { FOUR_S = 1 << 20, FOUR_CHUNK = 4096 };
struct four {
  uint64_t bytes[4][TZ_PLAN_KINDS];
  struct tz_plan_phase ph[4];
  struct tz_plan_request r;
};
static void four_phases(struct four *f) {
  memset(f, 0, sizeof *f);
  for (int g = 0; g < 4; g++) {
    f->bytes[g][TZ_PLAN_PARAM] = FOUR_S;
    snprintf(f->ph[g].name, sizeof f->ph[g].name, "fwd%d", g);
    f->ph[g].flop = 1e9;
    f->ph[g].n_uses = 1;
    f->ph[g].uses[0] = (struct tz_plan_use){g, TZ_PLAN_PARAM, TZ_ACCESS_READ};
  }
  f->r = plan_request(4, f->bytes, f->ph, 4, FOUR_CHUNK);
  f->r.capacity[TZ_PLAN_HOST] = 4 * FOUR_S;
  f->r.rates = (struct tz_plan_rates){.flops = 1e12,
                                      .copy_in = 0.5e3 * (double)FOUR_S,
                                      .copy_out = 1e3 * (double)FOUR_S,
                                      .adam = 1e9};
}

/* A placement that only moves out of the compute tier what its capacity asks leaves the window
 * at its minimum, too small to prefetch the next block while the last streams: the plan moves
 * more out while that lowers the bound. Four phases, each reading its own 1 MiB block (1 ms of
 * compute, 2 ms to copy), room for two blocks and the least window: with two blocks out each
 * copy overlaps one phase (6 ms a step); with three out and a window of two blocks, the copies
 * overlap and the window keeps one of them (4 ms, the compute). */
static void test_plan_trades_homes_for_window(void **state) {
  (void)state;
  const uint64_t S = FOUR_S, chunk = FOUR_CHUNK;
  struct four f;
  four_phases(&f);
  struct tz_plan_request r = f.r;
  r.capacity[TZ_PLAN_COMPUTE] = 3 * S + chunk;
  struct tz_plan p;
  TZ_ASSERT_OK(tz_plan_make(&r, &p));
  double best_two = 0;
  for (int a = 0; a < 4; a++)
    for (int b = a + 1; b < 4; b++) {
      int8_t tiers[4 * TZ_PLAN_KINDS];
      memset(tiers, TZ_PLAN_COMPUTE, sizeof tiers);
      tiers[a * TZ_PLAN_KINDS + TZ_PLAN_PARAM] = TZ_PLAN_HOST;
      tiers[b * TZ_PLAN_KINDS + TZ_PLAN_PARAM] = TZ_PLAN_HOST;
      struct tz_plan q;
      TZ_ASSERT_OK(tz_plan_bound(&r, tiers, S + chunk, &q));
      if (best_two == 0 || q.bound_s < best_two)
        best_two = q.bound_s;
    }
  assert_true(p.used[TZ_PLAN_HOST] > 2 * S && p.used[TZ_PLAN_HOST] <= r.capacity[TZ_PLAN_HOST]);
  assert_true(p.compute_fixed + p.used[TZ_PLAN_COMPUTE] + p.window <= r.capacity[TZ_PLAN_COMPUTE]);
  assert_true(p.bound_s < best_two * (1 - 1e-9));
  tz_plan_free(&p);
}

/* Without a window asked for, the window is what the homes leave of the compute tier, but no more
 * than the state homed outside it plus the least window (a phase's working set and the chunk):
 * four 1 MiB blocks forced to the host and a compute tier of 1 TiB give a window of 5 MiB and a
 * chunk, whose bound is that of the whole terabyte; with a compute tier of 3 MiB, what is left. */
static void test_plan_window_holds_what_there_is(void **state) {
  (void)state;
  const uint64_t S = FOUR_S, chunk = FOUR_CHUNK;
  struct four f;
  four_phases(&f);
  struct tz_plan_request r = f.r;
  r.force[TZ_PLAN_PARAM] = TZ_PLAN_HOST;
  r.capacity[TZ_PLAN_COMPUTE] = 1ull << 40;
  struct tz_plan p, whole;
  TZ_ASSERT_OK(tz_plan_make(&r, &p));
  assert_int_equal(p.window, 5 * S + chunk);
  TZ_ASSERT_OK(tz_plan_bound(&r, p.tier, r.capacity[TZ_PLAN_COMPUTE], &whole));
  assert_true(p.bound_s == whole.bound_s);
  tz_plan_free(&p);
  r.capacity[TZ_PLAN_COMPUTE] = 3 * S;
  TZ_ASSERT_OK(tz_plan_make(&r, &p));
  assert_int_equal(p.window, 3 * S);
  tz_plan_free(&p);
}

/* widen_moves: the window's widening tries moves past the best placement it has seen and keeps
 * the best, so its bound is never above the search that stops at the first move that does not
 * lower it, and on some requests below: random ones of 8 groups (blocks of 1 to 3 MiB, each
 * phase reading its own block and maybe the next group's, compute of 0.2 to 3 ms, copies at
 * 1 GB/s in and out), compute tiers between the least that fits and all of it. */
static void test_plan_widen_moves(void **state) {
  (void)state;
  enum { G = 8 };
  const uint64_t M = 1 << 20, chunk = 4096;
  uint64_t st = 42;
  int better = 0, cases = 0;
  for (int n = 0; n < 200; n++) {
    uint64_t bytes[G][TZ_PLAN_KINDS];
    struct tz_plan_phase ph[G];
    memset(bytes, 0, sizeof bytes);
    memset(ph, 0, sizeof ph);
    uint64_t total = 0;
    for (int g = 0; g < G; g++) {
      bytes[g][TZ_PLAN_PARAM] = M * (1 + tz_test_rand(&st) % 3);
      total += bytes[g][TZ_PLAN_PARAM];
    }
    for (int g = 0; g < G; g++) {
      snprintf(ph[g].name, sizeof ph[g].name, "fwd%d", g);
      ph[g].flop = 1e9 * (0.2 + (double)(tz_test_rand(&st) % 29) / 10);
      ph[g].uses[ph[g].n_uses++] = (struct tz_plan_use){g, TZ_PLAN_PARAM, TZ_ACCESS_READ};
      if (g + 1 < G && tz_test_rand(&st) % 2)
        ph[g].uses[ph[g].n_uses++] = (struct tz_plan_use){g + 1, TZ_PLAN_PARAM, TZ_ACCESS_READ};
    }
    struct tz_plan_request r = plan_request(G, bytes, ph, G, chunk);
    r.capacity[TZ_PLAN_HOST] = total;
    r.rates = (struct tz_plan_rates){.flops = 1e12, .copy_in = 1e9, .copy_out = 1e9, .adam = 1e9};
    r.capacity[TZ_PLAN_COMPUTE] = 6 * M + chunk + tz_test_rand(&st) % total;
    struct tz_plan p0, p1;
    r.widen_moves = 0;
    if (tz_plan_make(&r, &p0) < 0)
      continue;
    r.widen_moves = 12;
    TZ_ASSERT_OK(tz_plan_make(&r, &p1));
    cases++;
    assert_true(p1.bound_s <= p0.bound_s * (1 + 1e-9));
    better += p1.bound_s < p0.bound_s * (1 - 1e-9);
    assert_true(p1.compute_fixed + p1.used[TZ_PLAN_COMPUTE] + p1.window <=
                r.capacity[TZ_PLAN_COMPUTE]);
    tz_plan_free(&p0);
    tz_plan_free(&p1);
  }
  printf("widen_moves: %d of %d requests planned a lower bound\n", better, cases);
  assert_true(cases > 100 && better > 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_window_holds_what_there_is),
      cmocka_unit_test(test_bound),
      cmocka_unit_test(test_plan_bound_counts_window_hits),
      cmocka_unit_test(test_plan_bound_home_phases),
      cmocka_unit_test(test_plan_trades_homes_for_window),
      cmocka_unit_test(test_plan_widen_moves),
      cmocka_unit_test(test_plan_bound_keeps_written_copies),
      cmocka_unit_test(test_plan_bound_copy_waits_for_room),
      cmocka_unit_test(test_plan_bound_disk_duplex),
      cmocka_unit_test(test_plan_bound_disk_learned),
      cmocka_unit_test(test_plan_bound_link_both_ways),
      cmocka_unit_test(test_plan_bound_overlapped_collectives),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
