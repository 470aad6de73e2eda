/* Splitting Adam between the CPU and the GPU (docs/training.md "Splitting Adam"): where in a
 * folded step the opt phases that run at the homes go, and what that does to the bound and to
 * the bits.
 *
 * The folded step as tz_train_build_phases builds it puts opt(b) just before fwd(b). An opt phase
 * at the homes is entered only when the client's in-order walk reaches it, and the client walks
 * at the pace of the window, which the GPU's streamed opt phases fill: the CPU's update of the
 * last blocks then starts after the link has carried the others', and the forward waits for it.
 * The trainer moves the home opt phases to the front of the step (placement.c home_first): the
 * home lane starts with the step, beside the GPU's opt phases. */
#define _GNU_SOURCE
#include "core/plan.h"
#include "core/sched.h"
#include "testlib.h"
#include "train_cases.h"
#include "trainer/step/train_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int jitter_us;
static char *nvme_dir;

static void assert_close(double got, double want) {
  if (!(fabs(got - want) <= 1e-9 * fabs(want))) {
    fprintf(stderr, "got %.17g, want %.17g\n", got, want);
    fail();
  }
}

/* ---- the bound ---- */

#define NG 4 /* blocks the GPU steps, their state streamed from the host */
#define NC 2 /* blocks the CPU steps at their homes */
#define NB (NG + NC)
#define NP (2 * NB + 1) /* opt and fwd of each block, one backward */

static const uint64_t S = 1 << 20, chunk = 4096;
static const double t = 1e-3, c = 0.5e-3, h = 5e-3, bwd = 1e-3; /* a copy, a fwd, CPU Adam */

static void opt_phase(struct tz_plan_phase *p, int g, int at_home) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "opt%d", g);
  p->adam_elems = 1e6;
  p->at_home = at_home;
  p->n_uses = 2;
  p->uses[0] = (struct tz_plan_use){g, TZ_PLAN_MASTER, TZ_ACCESS_READ | TZ_ACCESS_WRITE};
  p->uses[1] = (struct tz_plan_use){g, TZ_PLAN_PARAM, TZ_ACCESS_WRITE};
}

static void fwd_phase(struct tz_plan_phase *p, int g) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "fwd%d", g);
  p->flop = c * 1e12;
  p->n_uses = 1;
  p->uses[0] = (struct tz_plan_use){g, TZ_PLAN_PARAM, TZ_ACCESS_READ};
}

/* The step in the order tz_train_build_phases gives it (home_first 0: opt(b) before fwd(b)) or
 * with the home opt phases first (1). The last NC blocks are stepped at their homes. */
static void build_step(struct tz_plan_phase *ph, int home_first) {
  int n = 0;
  if (home_first)
    for (int g = NG; g < NB; g++)
      opt_phase(&ph[n++], g, 1);
  for (int g = 0; g < NB; g++) {
    if (!home_first || g < NG)
      opt_phase(&ph[n++], g, g >= NG);
    fwd_phase(&ph[n++], g);
  }
  memset(&ph[n], 0, sizeof ph[n]);
  snprintf(ph[n].name, sizeof ph[n].name, "bwd");
  ph[n].flop = bwd * 1e12;
  assert_int_equal(n + 1, NP);
}

static struct tz_plan_request request(const uint64_t (*bytes)[TZ_PLAN_KINDS],
                                      const struct tz_plan_phase *ph) {
  struct tz_plan_request r;
  memset(&r, 0, sizeof r);
  r.n_groups = NB;
  r.bytes = bytes;
  r.n_phases = NP;
  r.phases = ph;
  r.align = 4096;
  r.chunk = chunk;
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    r.force[k] = TZ_PLAN_AUTO;
  r.rates = (struct tz_plan_rates){.flops = 1e12,
                                   .copy_in = (double)S / t,
                                   .copy_out = (double)S / t,
                                   .adam = 1e15,
                                   .adam_home = 1e6 / h};
  return r;
}

/* Every block's parameters and master of S bytes; every master on the host, the GPU-stepped
 * blocks' parameters in the compute tier (used in place), the CPU-stepped ones' on the host. */
static void split_homes(uint64_t bytes[NB][TZ_PLAN_KINDS], int8_t tiers[NB * TZ_PLAN_KINDS]) {
  memset(bytes, 0, sizeof(uint64_t) * NB * TZ_PLAN_KINDS);
  memset(tiers, TZ_PLAN_HOST, NB * TZ_PLAN_KINDS);
  for (int g = 0; g < NB; g++) {
    bytes[g][TZ_PLAN_PARAM] = S;
    bytes[g][TZ_PLAN_MASTER] = S;
    if (g < NG)
      tiers[g * TZ_PLAN_KINDS + TZ_PLAN_PARAM] = TZ_PLAN_COMPUTE;
  }
}

/* Homes: every master on the host; the GPU-stepped blocks' parameters in the compute tier (used
 * in place), the CPU-stepped ones' on the host (the CPU writes them, the forward copies them in).
 * A window of one block: the GPU's opt phases stream one after the other. Home first, the CPU
 * starts with the step and its path is the bound: NC * h of Adam, the last block's parameters
 * copied in, its forward and the backward. In the forward, the CPU starts only once the window
 * has reached its first phase, later by the GPU's opt phases before it. The CPU's busy time is
 * the same either way, and so is what crosses the link. */
static void test_home_first_bound(void **state) {
  (void)state;
  uint64_t bytes[NB][TZ_PLAN_KINDS];
  int8_t tiers[NB * TZ_PLAN_KINDS];
  split_homes(bytes, tiers);
  struct tz_plan_phase inter[NP], first[NP];
  build_step(inter, 0);
  build_step(first, 1);
  struct tz_plan_request ri = request(bytes, inter), rf = request(bytes, first);
  struct tz_plan pi, pf;
  TZ_ASSERT_OK(tz_plan_bound(&ri, tiers, S + chunk, &pi));
  TZ_ASSERT_OK(tz_plan_bound(&rf, tiers, S + chunk, &pf));
  assert_false(pi.unknown_rates || pf.unknown_rates);
  assert_close(pf.bound_s, NC * h + t + c + bwd);
  assert_close(pf.lane_s[3], NC * h);
  assert_close(pi.lane_s[3], NC * h);
  assert_close(pf.lane_s[0], pi.lane_s[0]);
  assert_close(pf.lane_s[1], pi.lane_s[1]);
  assert_true(pi.bound_s > pf.bound_s + 2 * t);

  /* The timelines say why: home first, the CPU's first update starts with the step and the
   * second right after it; in the forward, the first waits for the window. */
  struct tz_plan_event ei[NP], ef[NP];
  TZ_ASSERT_OK(tz_plan_timeline(&ri, tiers, S + chunk, ei));
  TZ_ASSERT_OK(tz_plan_timeline(&rf, tiers, S + chunk, ef));
  assert_true(ef[0].at_home && ef[1].at_home && !ef[2].at_home);
  assert_string_equal(ef[0].name, "opt4");
  assert_true(fabs(ef[0].start) < 1e-12);
  assert_close(ef[1].start, h);
  assert_close(ef[1].end, NC * h);
  assert_close(ef[NP - 1].end, pf.bound_s);
  int home = 2 * NG; /* opt4 in the interleaved order */
  assert_true(ei[home].at_home);
  assert_string_equal(ei[home].name, "opt4");
  assert_true(ei[home].start > 2 * t);
  assert_close(ei[NP - 1].end, pi.bound_s);
  for (int p = 0; p < NP; p++)
    assert_true(ef[p].end >= ef[p].start && ef[p].start >= ef[p].inputs - 1e-12);
  /* The copies the step's phases wait for: every GPU-stepped master in and out, the CPU-stepped
   * parameters in. */
  double in = 0, out = 0;
  for (int p = 0; p < NP; p++) {
    in += ef[p].in_bytes;
    out += ef[p].out_bytes;
  }
  assert_close(in, (double)((NG + NC) * S));
  assert_close(out, (double)(NG * S));
}

/* The home-first step of test_home_first_bound, its homes and its bound at the rates alone. */
struct home_first {
  uint64_t bytes[NB][TZ_PLAN_KINDS];
  int8_t tiers[NB * TZ_PLAN_KINDS];
  struct tz_plan_phase ph[NP];
  struct tz_plan_request r; /* points into bytes and ph */
  struct tz_plan alone;
};

static void home_first_open(struct home_first *f) {
  split_homes(f->bytes, f->tiers);
  build_step(f->ph, 1);
  f->r = request(f->bytes, f->ph);
  TZ_ASSERT_OK(tz_plan_bound(&f->r, f->tiers, S + chunk, &f->alone));
}

/* Host memory as a lane of its own: with the rates the CPU's Adam and the link reach beside each
 * other, the step takes at least what both move through host memory (the link's bytes, and each
 * element the CPU updates at home_adam_bytes) over their sum; not costed without those rates, or
 * without the bytes an element moves. With those rates the home phases also run at the CPU's
 * rate beside the link (here half its rate alone: the home-first path of test_home_first_bound
 * with twice the CPU's time), and the bound is the larger of the two. */
static void test_host_memory_lane(void **state) {
  (void)state;
  struct home_first f;
  home_first_open(&f);
  struct tz_plan_request r = f.r;
  struct tz_plan with, no_bytes;
  assert_true(f.alone.host_mem_s == 0);
  r.rates.copy_in_adam = r.rates.copy_out_adam = (double)S / t;
  r.rates.adam_home_busy = 1e8;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &no_bytes)); /* home_adam_bytes 0 */
  assert_true(no_bytes.host_mem_s == 0);
  assert_close(no_bytes.lane_s[3], 2 * f.alone.lane_s[3]);
  assert_close(no_bytes.bound_s, 2 * NC * h + t + c + bwd);
  r.home_adam_bytes = 30;
  double rate = 2.0 * (double)S / t + 1e8 * 30;
  assert_close(tz_plan_host_mem_rate(&r.rates, 30), rate);
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &with));
  /* the link: every GPU-stepped master in and out, the CPU-stepped parameters in */
  double host_bytes = (double)((NG + NC) * S + NG * S) + NC * 1e6 * 30;
  assert_close(with.host_mem_s, host_bytes / rate);
  assert_true(with.host_mem_s > f.alone.bound_s);
  assert_close(with.bound_s,
               with.host_mem_s > no_bytes.bound_s ? with.host_mem_s : no_bytes.bound_s);
  /* The lane's term is a mediant of the link's and the CPU's times at those rates, so with the
   * lanes at them too (the GPU's opt phases streaming beside the CPU) it never passes both. */
  r.rates.adam_home_busy = r.rates.adam_home;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &with));
  assert_true(with.host_mem_s > 0 && with.host_mem_s <= with.path_s);
  /* One of the rates unknown: neither costed. */
  r.rates.copy_out_adam = 0;
  assert_true(tz_plan_host_mem_rate(&r.rates, 30) == 0);
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &with));
  assert_close(with.bound_s, f.alone.bound_s);
  assert_close(with.lane_s[3], f.alone.lane_s[3]);
}

/* The rate a run's homes reached (tz_plan_rates.adam_home_run): slower than the probe's, the
 * home phases run at it (the home-first path with the CPU's time doubled, beside the link's
 * rates or without them); faster, the probe's holds. */
static void test_home_rate_of_a_run(void **state) {
  (void)state;
  struct home_first f;
  home_first_open(&f);
  struct tz_plan_request r = f.r;
  struct tz_plan slow, fast;
  r.rates.adam_home_run = r.rates.adam_home / 2;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &slow));
  assert_close(slow.lane_s[3], 2 * f.alone.lane_s[3]);
  assert_close(slow.bound_s, 2 * NC * h + t + c + bwd);
  r.rates.adam_home_run = 2 * r.rates.adam_home;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &fast));
  assert_close(fast.lane_s[3], f.alone.lane_s[3]);
  assert_close(fast.bound_s, f.alone.bound_s);
  /* Beside the link the probe's rate is adam_home_busy: the run's slower one still rules. */
  r.rates.copy_in_adam = r.rates.copy_in;
  r.rates.copy_out_adam = r.rates.copy_out;
  r.rates.adam_home_busy = r.rates.adam_home;
  r.rates.adam_home_run = r.rates.adam_home / 2;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &slow));
  assert_close(slow.lane_s[3], 2 * f.alone.lane_s[3]);
}

/* The link's lanes beside the CPU's Adam (tz_plan_rates.copy_in_adam, copy_out_adam): a copy
 * moves at those rates while the step's home phases run and at its rate alone outside them. The
 * same rates beside as alone give the same bound and lanes, and so do faster ones (taken as
 * alone); the link at half its rate beside the CPU slows each copy inside the CPU's span, at
 * most twice; with every GPU-stepped block in the compute tier (no state crosses the link beside
 * the CPU), the rates beside are not taken. */
static void test_link_beside_home(void **state) {
  (void)state;
  struct home_first f;
  home_first_open(&f);
  struct tz_plan_request r = f.r;
  struct tz_plan same, half;
  r.rates.copy_in_adam = r.rates.copy_in;
  r.rates.copy_out_adam = r.rates.copy_out;
  r.rates.adam_home_busy = r.rates.adam_home;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &same));
  assert_close(same.bound_s, f.alone.bound_s);
  for (int i = 0; i < 4; i++)
    assert_close(same.lane_s[i], f.alone.lane_s[i]);
  /* Faster beside than alone (a probe's noise): taken as alone. */
  r.rates.copy_in_adam = 2 * r.rates.copy_in;
  r.rates.copy_out_adam = 2 * r.rates.copy_out;
  r.rates.adam_home_busy = 2 * r.rates.adam_home;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &same));
  assert_close(same.bound_s, f.alone.bound_s);
  for (int i = 0; i < 4; i++)
    assert_close(same.lane_s[i], f.alone.lane_s[i]);
  r.rates.adam_home_busy = r.rates.adam_home;
  r.rates.copy_in_adam = r.rates.copy_in / 2;
  r.rates.copy_out_adam = r.rates.copy_out / 2;
  TZ_ASSERT_OK(tz_plan_bound(&r, f.tiers, S + chunk, &half));
  assert_close(half.lane_s[3], f.alone.lane_s[3]);
  for (int i = 0; i < 2; i++) {
    assert_true(half.lane_s[i] > f.alone.lane_s[i] * (1 + 1e-9));
    assert_true(half.lane_s[i] <= 2 * f.alone.lane_s[i] * (1 + 1e-9));
  }
  assert_true(half.bound_s >= f.alone.bound_s);
  /* The CPU-stepped blocks' parameters are copied in after their update, the second one after
   * the CPU's span has ended: its copy at the rate alone, so the copies in are not all slowed. */
  assert_true(half.lane_s[0] < 2 * f.alone.lane_s[0] * (1 - 1e-9));
  /* Every master in the compute tier: nothing streams beside the CPU. */
  int8_t resident[NB * TZ_PLAN_KINDS];
  memcpy(resident, f.tiers, sizeof resident);
  for (int g = 0; g < NG; g++)
    resident[g * TZ_PLAN_KINDS + TZ_PLAN_MASTER] = TZ_PLAN_COMPUTE;
  struct tz_plan a2, h2;
  struct tz_plan_request r0 = request(f.bytes, f.ph);
  TZ_ASSERT_OK(tz_plan_bound(&r0, resident, S + chunk, &a2));
  TZ_ASSERT_OK(tz_plan_bound(&r, resident, S + chunk, &h2));
  assert_close(h2.bound_s, a2.bound_s);
  for (int i = 0; i < 4; i++)
    assert_close(h2.lane_s[i], a2.lane_s[i]);
}

/* tz_plan_request.no_carry (tierzero.window_carry false): with a window holding every block, the
 * GPU-stepped masters stay in it from one step to the next and only the CPU-stepped parameters,
 * new at their homes, are read again; without carry every block the step reads comes in each
 * step, as the scheduler then does (test_sched's test_random_budgets). */
static void test_plan_no_carry(void **state) {
  (void)state;
  struct home_first f;
  home_first_open(&f);
  struct tz_plan carry, none;
  uint64_t window = 16 * S + chunk;
  TZ_ASSERT_OK(tz_plan_bound(&f.r, f.tiers, window, &carry));
  assert_close(carry.moved[TZ_PLAN_HOST], (double)(NC * S));
  f.r.no_carry = 1;
  TZ_ASSERT_OK(tz_plan_bound(&f.r, f.tiers, window, &none));
  assert_close(none.moved[TZ_PLAN_HOST], (double)((NG + NC) * S));
  assert_true(none.lane_s[0] > carry.lane_s[0]);
}

/* ---- the disk's room ---- */

/* A block homed on the disk keeps its room in the window until its write-back has reached the
 * disk (the scheduler frees a copy once its write-back completes, and a staged one completes
 * with its last write to nvme). Phase A reads and writes D, homed on the disk; phase B reads H,
 * homed on the host; the window holds one of them. B's copy in waits for D's disk write, so
 * the step is the disk's read, D in, D out, the disk's write, then H in: r + 2t + w + t. Were
 * D's room free once it left the GPU, H's copy would hide under the disk's write. */
static void test_disk_write_holds_room(void **state) {
  (void)state;
  const double r = 4e-3, w = 3e-3;
  uint64_t bytes[2][TZ_PLAN_KINDS];
  memset(bytes, 0, sizeof bytes);
  bytes[0][TZ_PLAN_MASTER] = S;
  bytes[1][TZ_PLAN_MASTER] = S;
  int8_t tiers[2 * TZ_PLAN_KINDS];
  memset(tiers, TZ_PLAN_HOST, sizeof tiers);
  tiers[0 * TZ_PLAN_KINDS + TZ_PLAN_MASTER] = TZ_PLAN_NVME;
  struct tz_plan_phase ph[2];
  memset(ph, 0, sizeof ph);
  snprintf(ph[0].name, sizeof ph[0].name, "A");
  ph[0].n_uses = 1;
  ph[0].uses[0] = (struct tz_plan_use){0, TZ_PLAN_MASTER, TZ_ACCESS_READ | TZ_ACCESS_WRITE};
  snprintf(ph[1].name, sizeof ph[1].name, "B");
  ph[1].n_uses = 1;
  ph[1].uses[0] = (struct tz_plan_use){1, TZ_PLAN_MASTER, TZ_ACCESS_READ};
  struct tz_plan_request q = request(bytes, ph);
  q.n_groups = 2;
  q.n_phases = 2;
  q.rates.nvme_read = (double)S / r;
  q.rates.nvme_write = (double)S / w;
  struct tz_plan b;
  TZ_ASSERT_OK(tz_plan_bound(&q, tiers, S + chunk, &b));
  assert_false(b.unknown_rates);
  assert_close(b.bound_s, r + 2 * t + w + t);
  assert_close(b.lane_s[2], r + w);
}

/* ---- the trainer's order and bits ---- */

/* The trainer, made for its plan only with forced host offload and tierzero.cpu_adam share:
 * folded (clipping on), the opt phases at the homes come first in the step, in block order, and
 * no phase after them runs at the homes; overlapped (no clipping), the order is the one built. */
static void test_home_first_order(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  o.cpu_adam = "0.5";
  for (int folded = 1; folded >= 0; folded--) {
    o.clip = folded ? 0.05 : 0;
    tz_trainer *tr = NULL;
    TZ_ASSERT_OK(tc_plan_only(&o, &w, NULL, 0, &tr));
    assert_int_equal(tr->mode, folded ? TZ_OPT_FOLDED : TZ_OPT_OVERLAPPED);
    int n_home = 0, first_block = -1;
    for (int b = 0; b < tr->nb; b++)
      n_home += tr->cpu_step[b];
    assert_true(n_home > 0 && n_home < tr->nb);
    for (int b = tr->nb - 1; b >= 0 && tr->cpu_step[b]; b--)
      first_block = b;
    int seen = 0;
    for (int i = 0; i < tr->n_ph; i++) {
      if (!tr->at_home[i])
        continue;
      assert_int_equal(tr->ph[i].kind, PH_OPT);
      if (folded) { /* the first n_home phases, blocks in order */
        assert_int_equal(i, seen);
        assert_int_equal(tr->ph[i].block, first_block + seen);
      }
      seen++;
    }
    assert_int_equal(seen, n_home);
    if (!folded) /* built order: each home opt phase after the backward of its block */
      assert_false(tr->at_home[0]);
    /* The loss phase moved with the phases: the last micro-batch's embedding backward. */
    assert_int_equal(tr->ph[tr->loss_phase].kind, PH_EMBED_BWD);
    assert_int_equal(tr->ph[tr->loss_phase].micro, tr->G - 1);
    tz_trainer_destroy(tr);
  }
  tc_world_close(&w);
}

/* Every share gives the same bits with the home opt phases first, folded (clipping), also with
 * a window that streams and evicts, with accumulation, and with untied embeddings; the home
 * lane ran, and less crossed into the compute tier than with every block stepped there. */
static void test_home_first_same_bits(void **state) {
  (void)state;
  for (int v = 0; v < 3; v++) {
    struct tc_opts o;
    tc_opts_init(&o);
    o.param_dev = "cpu";
    o.opt_dev = "cpu";
    o.small_window = v == 1;
    o.untied = v == 2;
    o.accum = v == 2 ? 1 : 2;
    const char *shares[] = {"0", "0.3", "0.6", "1"};
    struct tc_result r[4];
    for (int s = 0; s < 4; s++) {
      o.cpu_adam = shares[s];
      tc_run_single(&o, jitter_us, nvme_dir, &r[s]);
    }
    char what[64];
    for (int s = 1; s < 4; s++) {
      snprintf(what, sizeof what, "variant %d, share %s against 0", v, shares[s]);
      tc_expect_same(&r[0], &r[s], what);
      assert_true(r[s].st.home_s > 0);
      assert_true(r[s].st.fill_bytes < r[0].st.fill_bytes);
    }
    assert_true(r[0].st.home_s == 0);
    for (int s = 0; s < 4; s++)
      tc_result_free(&r[s]);
  }
}

/* tierzero.cpu_adam_search: a count of last blocks (the share it reports is theirs), and a bound
 * no worse than any eighth's. */
static void test_search_by_blocks(void **state) {
  (void)state;
  struct tc_world w;
  tc_world_open(&w);
  struct tc_opts o;
  tc_opts_init(&o);
  o.param_dev = "cpu";
  o.opt_dev = "cpu";
  struct tz_plan_rates rates = {.flops = 1e9, .copy_in = 2e9, .copy_out = 2e9, .adam = 1e8};
  tz_trainer *tr = NULL;
  o.cpu_adam_search = 1;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  double best = tz_trainer_plan(tr)->bound_s, share = tz_trainer_cpu_adam(tr);
  uint64_t total = 0, taken = 0;
  int k = 0;
  for (int b = 0; b < tr->nb; b++)
    total += tr->numel[b];
  for (int b = tr->nb - 1; b >= 0 && tr->cpu_step[b]; b--, k++)
    taken += tr->numel[b];
  for (int b = 0; b < tr->nb - k; b++)
    assert_false(tr->cpu_step[b]); /* the last k, and only they */
  assert_close(share, (double)taken / (double)total);
  tz_trainer_destroy(tr);
  o.cpu_adam_search = 0;
  /* The share as tz-train prints it gives the same blocks. */
  char printed[32];
  snprintf(printed, sizeof printed, "%g", share);
  o.cpu_adam = printed;
  TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
  for (int b = 0; b < tr->nb; b++)
    assert_int_equal(tr->cpu_step[b], b >= tr->nb - k);
  assert_true(tz_trainer_plan(tr)->bound_s == best);
  tz_trainer_destroy(tr);
  for (int e = 0; e <= 8; e++) {
    char buf[16];
    snprintf(buf, sizeof buf, "%g", e / 8.0);
    o.cpu_adam = buf;
    TZ_ASSERT_OK(tc_plan_only(&o, &w, &rates, 0, &tr));
    assert_true(best <= tz_trainer_plan(tr)->bound_s * (1 + 1e-9));
    tz_trainer_destroy(tr);
  }
  tc_world_close(&w);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "jitter") == 0)
    jitter_us = 200;
  nvme_dir = tz_test_mkdtemp("tz_plan_home");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_home_first_bound), cmocka_unit_test(test_host_memory_lane),
      cmocka_unit_test(test_link_beside_home), cmocka_unit_test(test_home_rate_of_a_run),
      cmocka_unit_test(test_plan_no_carry),    cmocka_unit_test(test_disk_write_holds_room),
      cmocka_unit_test(test_home_first_order), cmocka_unit_test(test_home_first_same_bits),
      cmocka_unit_test(test_search_by_blocks),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(nvme_dir);
  return rc;
}
