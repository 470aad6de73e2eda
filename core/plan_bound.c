/* The plan's bound: two steps of the scheduler's lanes simulated over a placement (core/plan.h:
 * tz_plan_bound, tz_plan_timeline; tz_plan_make calls tz_plan_simulate for each placement it
 * tries). */
#include "core/error.h"
#include "core/plan.h"
#include "core/plan_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double cost(double amount, double rate, int *unknown) {
  if (amount <= 0)
    return 0;
  if (rate <= 0) {
    *unknown = 1;
    return 0;
  }
  return amount / rate;
}

static double max2(double a, double b) { return a > b ? a : b; }

enum { LANE_IN, LANE_OUT, LANE_NVME };

/* The copies the scheduler's window holds between phases, kept by the scheduler's rule
 * (evict_score in core/sched_window.c): a miss evicts the copies the current phase does not use,
 * farthest next use in the cyclic order first, until the block fits. Every copy held was placed
 * by some phase, so the scheduler's first choice (a copy no phase uses) never arises here, nor
 * do stale copies (the plan runs every phase in the compute tier, where a write updates the copy
 * itself). Arrays of nb = n_groups * TZ_PLAN_KINDS entries, indexed by block (g * KINDS + k),
 * except the held set's, indexed by slot. */
struct resident {
  int n;               /* phases in the step */
  uint64_t room, used; /* the window less the scheduler's chunk; bytes held */
  const int *next;     /* (n, TZ_PLAN_MAX_USES): the phase of the block's next use after phase p,
                          cyclically (p itself when no other phase uses it) */
  int *slot;           /* (nb): where the block is held, or -1 */
  int *mark;           /* (nb): 1 + the index of the last phase instance that used it */
  int *id;             /* (nb slots): the block held there */
  int *at;             /* (nb slots): the phase of its next use */
  uint64_t *bytes;     /* (nb slots): its bytes (block_bytes, rounded as the scheduler's are) */
  int held;            /* slots in use */
};

/* next[p * TZ_PLAN_MAX_USES + u]: walking two steps backwards, the last phase seen using a
 * block is its next use after the one being visited. seen: nb ints of scratch. */
static void next_uses(const struct tz_plan_request *r, int *next, int *seen) {
  int n = r->n_phases;
  for (int i = 2 * n - 1; i >= 0; i--) {
    const struct tz_plan_phase *ph = &r->phases[i % n];
    if (i < n) /* the block's use in the second step was seen: seen[] is set and past i */
      for (int u = 0; u < ph->n_uses; u++)
        next[i * TZ_PLAN_MAX_USES + u] =
            seen[ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind] % n;
    for (int u = 0; u < ph->n_uses; u++)
      seen[ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind] = i;
  }
}

static void resident_drop(struct resident *w, int s) {
  int last = --w->held;
  w->used -= w->bytes[s];
  w->slot[w->id[s]] = -1;
  if (s != last) {
    w->id[s] = w->id[last];
    w->at[s] = w->at[last];
    w->bytes[s] = w->bytes[last];
    w->slot[w->id[s]] = s;
  }
}

/* Use u of phase p, in phase instance idx (marked on the blocks it uses beforehand): 1 when the
 * window holds the block (a hit: no copy in), 0 when it must be placed. A placed block evicts
 * others until it fits; when it cannot (the phase's own blocks fill the window) it is copied in
 * and not kept, as if evicted at once. */
static int resident_use(struct resident *w, const struct tz_plan_request *r, int p, int u,
                        int idx) {
  const struct tz_plan_use *x = &r->phases[p].uses[u];
  int b = x->group * TZ_PLAN_KINDS + x->kind, next = w->next[p * TZ_PLAN_MAX_USES + u];
  /* Without carry, a block whose next use is in the next step is not kept past this use (the
   * scheduler frees it first, and the next step reads it again). The scheduler keeps a copy
   * still busy when the next step's first use is placed (its write-back not landed), which the
   * simulation does not: it reads those bytes again, and it does not make that read wait for
   * the write-back either (sched_window.c, reserve_needs). */
  int last = r->no_carry && next <= p;
  if (w->slot[b] >= 0) {
    w->at[w->slot[b]] = next;
    if (last)
      resident_drop(w, w->slot[b]);
    return 1;
  }
  if (last)
    return 0;
  uint64_t size = block_bytes(r, x->group, x->kind);
  while (w->used + size > w->room) {
    int victim = -1, far = -1;
    for (int s = 0; s < w->held; s++) {
      if (w->mark[w->id[s]] == idx + 1)
        continue;
      int d = ((w->at[s] - p) % w->n + w->n) % w->n;
      if (d > far || (d == far && w->id[s] < w->id[victim])) {
        victim = s;
        far = d;
      }
    }
    if (victim < 0)
      return 0;
    resident_drop(w, victim);
  }
  int s = w->held++;
  w->id[s] = b;
  w->at[s] = next;
  w->bytes[s] = size;
  w->slot[b] = s;
  w->used += size;
  return 0;
}

/* The most any run of consecutive phases (the order repeating across steps, so a run may wrap
 * past the last phase) takes beyond its own compute: the largest sum over a run of
 * v[p] = (copy[p] + copy2[p]) / rate - comp[p], less carry / rate; 0 with no rate. A run that
 * wraps is the whole cycle less a run that does not, so it is the total less the smallest such
 * sum (Kadane's scan both ways, O(n): the plan simulates many placements). */
static double longest_run(int n, const double *copy, const double *copy2, const double *comp,
                          double rate, double carry) {
  if (rate <= 0 || n <= 0)
    return 0;
  double total = 0, hi = 0, lo = 0, best = -1e300, least = 1e300;
  for (int p = 0; p < n; p++) {
    double v = (copy[p] + (copy2 ? copy2[p] : 0)) / rate - comp[p];
    total += v;
    hi = p > 0 && hi > 0 ? hi + v : v;
    lo = p > 0 && lo < 0 ? lo + v : v;
    best = max2(best, hi);
    least = least < lo ? least : lo;
  }
  best = max2(best, max2(total, total - least));
  return max2(0, best - carry / rate);
}

/* A bound the lanes' list schedule cannot see: it runs each copy lane at its one-way rate beside
 * the other, while the host link moves less with both directions busy (two H200s, each rank
 * copying: 28.8 GB/s in beside 47.4 out, against 52.7 and 52.8 alone), and the phases that need
 * the most copies come together (the folded step's state moves during the forward). A run of
 * consecutive phases computes for comp(run), and the compute lane runs nothing else from its
 * first phase's start to its last one's end. What the run copies in crosses the link in that
 * time but for what the window held when it began (a copy's room is taken when it is issued);
 * what it writes goes back in that time but for what the window still holds when it ends: each
 * at most the window. Phases outside the run compute outside its time. So the step takes at
 * least compute_s + (bytes(run) - 2 window) / link - comp(run), for every run, with link the most
 * the link moves at once (either direction alone, copy_duplex, or each one's rate beside the
 * other summed), and likewise each direction alone with one window at its own rate. */
static double window_bound(const struct tz_plan_rates *rt, int n, const double *in,
                           const double *out, const double *comp, double compute_s, double window) {
  double both = max2(rt->copy_duplex, rt->copy_in_both + rt->copy_out_both);
  if (both > 0) /* unknown: the directions independent; known: one alone may move more */
    both = max2(both, max2(rt->copy_in, rt->copy_out));
  double over = longest_run(n, in, out, comp, both, 2 * window);
  over = max2(over, longest_run(n, in, NULL, comp, rt->copy_in, window));
  over = max2(over, longest_run(n, out, NULL, comp, rt->copy_out, window));
  return compute_s + over;
}

/* The lanes through simulate's two steps: where each lane's last work ends, what it has done in
 * the second step, and the arrays simulate allocates (sim_alloc). */
struct sim {
  const struct tz_plan_request *r;
  const int8_t *tiers; /* the homes */
  const struct tz_plan_rates *rt;
  int n, unknown; /* phases in the step; some lane costed with an unknown rate */
  /* How far ahead of phase p the window reaches: the most phases before p whose working sets fit
   * beside p's (the order repeats across steps). */
  int *ahead;
  uint64_t *ws; /* (n): each phase's working set in the window (tz_plan_phase_ws) */
  /* end[i]: where phase instance i's compute ends; end[2n + i]: where its write-backs end (its
   * dirty copies hold their room in the window until then). */
  double *end;
  int *ints;            /* the window's next, slot, mark, id and at, and next_uses' scratch */
  uint64_t *held_bytes; /* the window's bytes */
  /* (nb each): when a home phase last wrote the block's home (a copy in starts after it), and
   * when its last dirty copy reached its home (a home phase reading it starts after it). */
  double *home_at, *back_at;
  /* (n each, the second step's): each phase's bytes copied in for it, written back after it,
   * and its time on the compute lane. */
  double *ph_in, *ph_out, *ph_comp;
  struct resident w;
  struct tz_plan_event *ev; /* (n): the second step's phases (tz_plan_timeline), or NULL */
  double comp, lane[3], busy[3], compute_s;
  double home, home_s;               /* the home lane: where its last phase ends, its busy time */
  double home_elems;                 /* Adam elements the home phases update in a step */
  double coll;                       /* the comm's lane (overlapped collectives): where it ends */
  double moved[TZ_PLAN_TIERS], link; /* link: bytes over the host link, a step */
  double disk_r, disk_w;             /* bytes read from and written to nvme */
  /* The CPU's Adam at the homes beside the GPU's streamed opt phases (sim_contends): both share
   * host memory, so the home phases run at adam_home_busy and a copy moves at copy_in_adam or
   * copy_out_adam while a step's home phases run, from the first one's start to the last one's
   * end (span_lo[s], span_hi[s], as far as they have been simulated when the copy is issued: in
   * the folded step the home phases come first, so a step's span is known before its copies). */
  int contend;
  double span_lo[2], span_hi[2];
};

static void sim_free(struct sim *m) {
  free(m->ph_in);
  free(m->ahead);
  free(m->ws);
  free(m->end);
  free(m->ints);
  free(m->held_bytes);
  free(m->home_at);
}

/* Allocates m's arrays and sets up its window (struct resident) with `room`; 0, or -1 with
 * nothing allocated. */
static int sim_alloc(struct sim *m, uint64_t room) {
  int n = m->n, nb = m->r->n_groups * TZ_PLAN_KINDS;
  m->ahead = malloc(sizeof *m->ahead * (size_t)n);
  m->ws = malloc(sizeof *m->ws * (size_t)n);
  m->end = malloc(sizeof *m->end * (size_t)(4 * n));
  m->ints = malloc(sizeof *m->ints * ((size_t)n * TZ_PLAN_MAX_USES + 5 * (size_t)nb));
  m->held_bytes = malloc(sizeof *m->held_bytes * (size_t)nb);
  m->home_at = calloc(2 * (size_t)nb, sizeof *m->home_at);
  m->ph_in = calloc(3 * (size_t)n, sizeof *m->ph_in);
  if (!m->ahead || !m->ws || !m->end || !m->ints || !m->held_bytes || !m->home_at || !m->ph_in) {
    sim_free(m);
    return -1;
  }
  m->back_at = m->home_at + nb;
  m->ph_out = m->ph_in + n;
  m->ph_comp = m->ph_out + n;
  m->w = (struct resident){.n = n,
                           .room = room,
                           .next = m->ints,
                           .slot = m->ints + (size_t)n * TZ_PLAN_MAX_USES,
                           .bytes = m->held_bytes};
  m->w.mark = m->w.slot + nb;
  m->w.id = m->w.mark + nb;
  m->w.at = m->w.id + nb;
  next_uses(m->r, m->ints, m->w.at + nb);
  for (int i = 0; i < nb; i++) {
    m->w.slot[i] = -1;
    m->w.mark[i] = 0;
  }
  return 0;
}

/* Fills m->ahead for a window of `room` and at most `cap` phases; returns the fewest. The phases
 * a window reaches back from p start no earlier than those it reaches from p - 1 (working sets
 * are never negative), so one pass with a sliding sum does it: O(n), where scanning back from
 * every phase took O(n cap), most of a large plan's time (llama-13b with 8 accumulation steps:
 * 1,710 phases a step, two minutes of planning). */
static int sim_ahead(struct sim *m, uint64_t room, int cap) {
  int n = m->n, fewest = cap;
  uint64_t *ws = m->ws;
  for (int p = 0; p < n; p++)
    ws[p] = tz_plan_phase_ws(m->r, m->tiers, p);
  /* Positions in the step repeated twice: phase p is position n + p, and the window behind it
   * starts at position lo, holding sum. k = n + p - lo phases before p, at most cap <= n. */
  int lo = n;
  uint64_t sum = 0;
  for (int p = 0; p < n; p++) {
    int at = n + p;
    sum += ws[p];
    if (p == 0) { /* the first window grows back from phase 0 */
      while (at - lo < cap && sum + ws[(lo - 1) % n] <= room)
        sum += ws[--lo % n];
    }
    while (lo < at && (sum > room || at - lo > cap))
      sum -= ws[lo++ % n];
    int k = at - lo;
    m->ahead[p] = k;
    if (k < fewest)
      fewest = k;
  }
  return fewest;
}

/* Whether the step runs the CPU's Adam at the homes beside GPU opt phases whose blocks cross the
 * host link (a placement of split Adam), with the rates both reach beside each other measured
 * (tz_plan_rates.adam_home_busy, copy_in_adam, copy_out_adam) and the home phases on their own
 * cores. */
static int sim_contends(const struct tz_plan_request *r, const int8_t *tiers) {
  const struct tz_plan_rates *rt = &r->rates;
  if (rt->adam_home_busy <= 0 || rt->copy_in_adam <= 0 || rt->copy_out_adam <= 0 ||
      r->home_on_compute)
    return 0;
  int home = 0, streamed = 0;
  for (int p = 0; p < r->n_phases; p++) {
    const struct tz_plan_phase *ph = &r->phases[p];
    if (ph->adam_elems <= 0)
      continue;
    if (ph->at_home) {
      home = 1;
      continue;
    }
    for (int u = 0; u < ph->n_uses; u++)
      streamed |= tiers[ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind] != TZ_PLAN_COMPUTE;
  }
  return home && streamed;
}

/* The time a copy of b bytes takes on a link lane from `at`: at `alone` outside the steps' home
 * spans, at `beside` inside them (struct sim, contend), never faster than alone (a probe's noise
 * can measure it so). */
static double link_time(struct sim *m, double at, double b, double alone, double beside) {
  if (!m->contend || b <= 0 || alone <= 0)
    return cost(b, alone, &m->unknown);
  beside = beside < alone ? beside : alone;
  double now = at, left = b;
  for (int s = 0; s < 2; s++) {
    double lo = m->span_lo[s], hi = m->span_hi[s];
    if (hi <= lo || hi <= now)
      continue;
    if (now < lo) {
      if ((lo - now) * alone >= left)
        return now + left / alone - at;
      left -= (lo - now) * alone;
      now = lo;
    }
    if ((hi - now) * beside >= left)
      return now + left / beside - at;
    left -= (hi - now) * beside;
    now = hi;
  }
  return now + left / alone - at;
}

/* Home phase p of step s, instance idx, entered at gate. */
static void sim_home_phase(struct sim *m, int s, int p, int idx, double gate) {
  const struct tz_plan_request *r = m->r;
  const struct tz_plan_rates *rt = m->rt;
  const struct tz_plan_phase *ph = &r->phases[p];
  int n = m->n;
  /* Entered as far ahead as a compute phase, after the previous step's compute (a folded
   * update waits for its norm), and after the write-back of any dirty copy it uses. */
  double start = max2(gate, s > 0 ? m->end[n - 1] : 0), inputs = gate;
  for (int u = 0; u < ph->n_uses; u++) {
    int b = ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind;
    if (m->tiers[b] != TZ_PLAN_COMPUTE)
      inputs = max2(inputs, m->back_at[b]);
  }
  start = max2(start, inputs);
  /* Sharing the compute lane's cores, the CPU's Adam is that lane's when not measured. */
  double home_rate = rt->adam_home > 0 ? rt->adam_home : r->home_on_compute ? rt->adam : 0;
  if (m->contend && (home_rate <= 0 || rt->adam_home_busy < home_rate))
    home_rate = rt->adam_home_busy; /* beside the link, never faster than alone */
  if (rt->adam_home_run > 0 && (home_rate <= 0 || rt->adam_home_run < home_rate))
    home_rate = rt->adam_home_run; /* what a run's homes reached */
  double d = cost(ph->flop, rt->flops, &m->unknown) + cost(ph->adam_elems, home_rate, &m->unknown);
  double done, begin;
  if (r->home_on_compute) {
    begin = max2(m->comp, start);
    m->comp = begin + d;
    done = m->comp;
    if (s == 1) {
      m->compute_s += d;
      m->ph_comp[p] = d;
    }
  } else {
    begin = max2(m->home, start);
    m->home = begin + d;
    done = m->home;
    m->span_lo[s] = m->span_lo[s] < begin ? m->span_lo[s] : begin;
    m->span_hi[s] = max2(m->span_hi[s], done);
    if (s == 1)
      m->home_s += d;
  }
  if (s == 1)
    m->home_elems += ph->adam_elems;
  /* What it writes is new at the home: a copy the window held is stale. */
  for (int u = 0; u < ph->n_uses; u++) {
    int b = ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind;
    if (!(ph->uses[u].access & 2) || m->tiers[b] == TZ_PLAN_COMPUTE)
      continue;
    m->home_at[b] = done;
    if (m->w.slot[b] >= 0)
      resident_drop(&m->w, m->w.slot[b]);
  }
  m->end[idx] = m->comp;
  m->end[2 * n + idx] = idx > 0 ? max2(m->comp, m->end[2 * n + idx - 1]) : m->comp;
  if (s == 1 && m->ev)
    m->ev[p] = (struct tz_plan_event){
        .at_home = 1, .entered = gate, .inputs = inputs, .start = begin, .end = done, .back = done};
}

/* The copies in for phase p of step s, instance idx, each issued once its room is free at
 * room_at; returns when the last of them has arrived, or `ready` if later. */
static double sim_copies_in(struct sim *m, int s, int p, int idx, double room_at, double ready) {
  const struct tz_plan_request *r = m->r;
  const struct tz_plan_rates *rt = m->rt;
  const struct tz_plan_phase *ph = &r->phases[p];
  /* The scheduler never evicts a copy for the phase that uses it. */
  for (int u = 0; u < ph->n_uses; u++)
    m->w.mark[ph->uses[u].group * TZ_PLAN_KINDS + ph->uses[u].kind] = idx + 1;
  for (int u = 0; u < ph->n_uses; u++) {
    const struct tz_plan_use *x = &ph->uses[u];
    int t = m->tiers[x->group * TZ_PLAN_KINDS + x->kind];
    if (t == TZ_PLAN_COMPUTE) /* used in place */
      continue;
    /* Held by the window, or written first (placed, not filled): no copy in. */
    if (resident_use(&m->w, r, p, u, idx) || !(x->access & 1))
      continue;
    double b = (double)r->bytes[x->group][x->kind];
    double at = max2(room_at, m->home_at[x->group * TZ_PLAN_KINDS + x->kind]);
    if (t == TZ_PLAN_NVME) {
      double d = cost(b, rt->nvme_read, &m->unknown);
      m->lane[LANE_NVME] = max2(m->lane[LANE_NVME], at) + d;
      at = m->lane[LANE_NVME];
      if (s == 1) {
        m->busy[LANE_NVME] += d;
        m->disk_r += b;
      }
    }
    double from = max2(m->lane[LANE_IN], at);
    double d = link_time(m, from, b, rt->copy_in, rt->copy_in_adam);
    m->lane[LANE_IN] = from + d;
    ready = max2(ready, m->lane[LANE_IN]);
    if (s == 1) {
      m->busy[LANE_IN] += d;
      m->moved[t] += b;
      m->link += b;
      m->ph_in[p] += b;
    }
  }
  return ready;
}

/* Phase p of step s, instance idx, on the compute lane once its inputs are ready. */
static void sim_compute(struct sim *m, int s, int p, int idx, double gate, double ready) {
  const struct tz_plan_rates *rt = m->rt;
  const struct tz_plan_phase *ph = &m->r->phases[p];
  int n = m->n;
  double d = cost(ph->flop, rt->flops, &m->unknown) +
             cost(ph->coll_bytes, rt->collective, &m->unknown) +
             cost(ph->adam_elems, rt->adam, &m->unknown);
  double start = max2(m->comp, ready);
  m->comp = start + d;
  /* Collectives issued at the start run beside the compute, one after the other on the
   * comm's own lane, and the phase ends when both are done. */
  if (ph->coll_async > 0) {
    m->coll = max2(m->coll, start) + cost(ph->coll_async, rt->collective, &m->unknown);
    m->comp = max2(m->comp, m->coll);
  }
  m->end[idx] = m->comp;
  m->end[2 * n + idx] = idx > 0 ? max2(m->comp, m->end[2 * n + idx - 1]) : m->comp;
  if (s == 1) {
    m->compute_s += d;
    m->ph_comp[p] = d;
  }
  if (s == 1 && m->ev)
    m->ev[p] = (struct tz_plan_event){
        .entered = gate, .inputs = ready, .start = start, .end = m->comp, .back = m->comp};
}

/* The write-backs of phase p of step s, instance idx, after its compute. */
static void sim_write_backs(struct sim *m, int s, int p, int idx) {
  const struct tz_plan_request *r = m->r;
  const struct tz_plan_rates *rt = m->rt;
  const struct tz_plan_phase *ph = &r->phases[p];
  int n = m->n;
  for (int u = 0; u < ph->n_uses; u++) {
    const struct tz_plan_use *x = &ph->uses[u];
    int t = m->tiers[x->group * TZ_PLAN_KINDS + x->kind];
    if (!(x->access & 2) || t == TZ_PLAN_COMPUTE) /* read only, or written in place */
      continue;
    double b = (double)r->bytes[x->group][x->kind];
    double from = max2(m->lane[LANE_OUT], m->comp);
    double d2 = link_time(m, from, b, rt->copy_out, rt->copy_out_adam);
    m->lane[LANE_OUT] = from + d2;
    m->back_at[x->group * TZ_PLAN_KINDS + x->kind] = m->lane[LANE_OUT];
    if (s == 1) {
      m->busy[LANE_OUT] += d2;
      m->link += b;
      m->ph_out[p] += b;
    }
    m->end[2 * n + idx] = max2(m->end[2 * n + idx], m->lane[LANE_OUT]);
    if (t == TZ_PLAN_NVME) {
      double d3 = cost(b, rt->nvme_write, &m->unknown);
      m->lane[LANE_NVME] = max2(m->lane[LANE_NVME], m->lane[LANE_OUT]) + d3;
      m->back_at[x->group * TZ_PLAN_KINDS + x->kind] = m->lane[LANE_NVME];
      /* The copy keeps its room until the disk has it: the scheduler frees a copy only once
       * its write-back has completed, and a staged one completes with its last write to nvme
       * (sched_pump.c, hop_done). */
      m->end[2 * n + idx] = max2(m->end[2 * n + idx], m->lane[LANE_NVME]);
      if (s == 1) {
        m->busy[LANE_NVME] += d3;
        m->disk_w += b;
      }
    }
    if (s == 1 && m->ev)
      m->ev[p].back = max2(m->ev[p].back, m->back_at[x->group * TZ_PLAN_KINDS + x->kind]);
  }
}

/* Fills out's timing fields from the two steps simulated in m. */
static void sim_bound(struct sim *m, uint64_t window, int fewest, struct tz_plan *out) {
  const struct tz_plan_rates *rt = m->rt;
  int n = m->n;
  /* The second step's compute path, from the first one's last phase; and no step repeats faster
   * than any lane can do its step's work. Write-backs left from one step overlap the next, so
   * the out and nvme lanes count by their step's busy time: their end, measured from the first
   * step's last phase, would carry the first step's backlog too. */
  /* The disk reads and writes at once for as long as both have work (a virtual disk, or a
   * drive's controller, moves less in both directions together than time-sharing it at the one-way
   * rates would): the bytes both directions share at nvme_duplex, the rest at their own rate. */
  if (rt->nvme_duplex > 0) {
    double both = 2 * (m->disk_r < m->disk_w ? m->disk_r : m->disk_w);
    double mixed = both / rt->nvme_duplex + cost(m->disk_r - both / 2, rt->nvme_read, &m->unknown) +
                   cost(m->disk_w - both / 2, rt->nvme_write, &m->unknown);
    m->busy[LANE_NVME] = max2(m->busy[LANE_NVME], mixed);
  }
  out->bound_s = max2(max2(m->end[2 * n - 1] - m->end[n - 1], m->home_s),
                      max2(m->busy[LANE_IN], max2(m->busy[LANE_OUT], m->busy[LANE_NVME])));
  /* The two directions share the host link (PCIe): together they move at most copy_duplex. */
  if (rt->copy_duplex > 0)
    out->bound_s = max2(out->bound_s, m->link / rt->copy_duplex);
  out->path_s = out->bound_s;
  out->link_s = window_bound(rt, n, m->ph_in, m->ph_out, m->ph_comp, m->compute_s, (double)window);
  out->bound_s = max2(out->bound_s, out->link_s);
  /* Host memory carries the link's bytes and the CPU's Adam at the homes at once: together at
   * most the rate they reach beside each other. Without home phases the link's own lanes bound
   * what host memory moves for it. */
  double hm = tz_plan_host_mem_rate(rt, m->r->home_adam_bytes);
  out->host_mem_s =
      hm > 0 && m->home_elems > 0 ? (m->link + m->home_elems * m->r->home_adam_bytes) / hm : 0;
  out->bound_s = max2(out->bound_s, out->host_mem_s);
  out->compute_s = m->compute_s;
  for (int i = 0; i < 3; i++)
    out->lane_s[i] = m->busy[i];
  out->lane_s[3] = m->home_s;
  for (int t = 0; t < TZ_PLAN_TIERS; t++)
    out->moved[t] = m->moved[t];
  out->lookahead = fewest;
  out->unknown_rates = m->unknown;
}

/* A block not homed in the compute tier comes through the scheduler's window: a read of it costs
 * a copy in (and a read from nvme before) unless the window still holds it (struct resident,
 * which carries over from the first step into the second, as in a run's steady state); a write
 * costs its copy out (and a write to nvme after), and the written copy stays in the window. A
 * home phase runs on the home lane (or on the compute lane with home_on_compute) on the homes in
 * place: after the write-backs of the copies it uses, before the copies in of what it wrote,
 * whose held copies it makes stale. */
void tz_plan_simulate(const struct tz_plan_request *r, const int8_t *tiers, uint64_t window,
                      struct tz_plan *out, struct tz_plan_event *ev) {
  int n = r->n_phases;
  uint64_t chunk = round_up(r->chunk, r->align);
  uint64_t room = window > chunk ? window - chunk : 0;
  int cap = r->lookahead > 0 ? r->lookahead : n;
  if (cap > n)
    cap = n;
  struct tz_plan_rates rates = tz_plan_disk_rates(&r->rates);
  struct sim m = {.r = r,
                  .tiers = tiers,
                  .rt = &rates,
                  .n = n,
                  .ev = ev,
                  .contend = sim_contends(r, tiers),
                  .span_lo = {1e300, 1e300},
                  .span_hi = {-1e300, -1e300}};
  if (sim_alloc(&m, room) < 0) {
    out->bound_s = out->compute_s = out->path_s = out->link_s = out->host_mem_s = 0;
    for (int i = 0; i < TZ_PLAN_TIERS + 1; i++)
      out->lane_s[i] = 0;
    for (int t = 0; t < TZ_PLAN_TIERS; t++)
      out->moved[t] = 0;
    out->lookahead = 0;
    out->unknown_rates = 1;
    return;
  }
  int fewest = sim_ahead(&m, room, cap);
  for (int s = 0; s < 2; s++) {
    for (int p = 0; p < n; p++) {
      int idx = s * n + p;
      int from = idx - m.ahead[p] - 1;
      double gate = from >= 0 ? m.end[from] : 0, ready = gate;
      /* The room a copy in takes is freed by phase `from` once it has computed and its dirty
       * copies have been written back (the out lane is in order: the earlier ones' are back). */
      double room_at = from >= 0 ? max2(gate, m.end[2 * n + from]) : 0;
      if (r->phases[p].at_home) {
        sim_home_phase(&m, s, p, idx, gate);
        continue;
      }
      ready = sim_copies_in(&m, s, p, idx, room_at, ready);
      sim_compute(&m, s, p, idx, gate, ready);
      sim_write_backs(&m, s, p, idx);
    }
  }
  sim_bound(&m, window, fewest, out);
  if (ev) { /* from the second step's origin, with each phase's bytes */
    double t0 = m.end[n - 1];
    for (int p = 0; p < n; p++) {
      snprintf(ev[p].name, sizeof ev[p].name, "%s", r->phases[p].name);
      ev[p].entered -= t0;
      ev[p].inputs -= t0;
      ev[p].start -= t0;
      ev[p].end -= t0;
      ev[p].back -= t0;
      ev[p].in_bytes = m.ph_in[p];
      ev[p].out_bytes = m.ph_out[p];
    }
  }
  sim_free(&m);
}

double tz_plan_disk_probe_rate(const struct tz_plan_rates *r) {
  if (r->nvme_duplex > 0)
    return r->nvme_duplex;
  return r->nvme_read < r->nvme_write ? r->nvme_read : r->nvme_write;
}

struct tz_plan_rates tz_plan_disk_rates(const struct tz_plan_rates *r) {
  struct tz_plan_rates e = *r;
  double probe = tz_plan_disk_probe_rate(r);
  if (probe > 0 && r->nvme_run > probe) {
    double k = r->nvme_run / probe;
    e.nvme_read *= k;
    e.nvme_write *= k;
    e.nvme_duplex *= k;
  }
  return e;
}

double tz_plan_host_mem_rate(const struct tz_plan_rates *r, double adam_bytes) {
  if (r->adam_home_busy <= 0 || r->copy_in_adam <= 0 || r->copy_out_adam <= 0 || adam_bytes <= 0)
    return 0;
  return r->copy_in_adam + r->copy_out_adam + r->adam_home_busy * adam_bytes;
}

int tz_plan_bound(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                  struct tz_plan *out) {
  TZ_CHECK(tz_plan_check_request(req));
  tz_plan_simulate(req, tiers, window, out, NULL);
  return 0;
}

int tz_plan_timeline(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                     struct tz_plan_event *ev) {
  TZ_CHECK(tz_plan_check_request(req));
  struct tz_plan out;
  memset(&out, 0, sizeof out);
  memset(ev, 0, sizeof *ev * (size_t)req->n_phases);
  tz_plan_simulate(req, tiers, window, &out, ev);
  return 0;
}

void tz_plan_print_timeline(FILE *f, const struct tz_plan_event *ev, int n, const char *indent) {
  fprintf(f, "%s%-16s %-7s %9s %9s %9s %9s %9s %9s %9s\n", indent, "phase", "lane", "entered",
          "inputs", "start", "end", "back", "in MB", "out MB");
  for (int p = 0; p < n; p++)
    fprintf(f, "%s%-16s %-7s %9.2f %9.2f %9.2f %9.2f %9.2f %9.1f %9.1f\n", indent, ev[p].name,
            ev[p].at_home ? "home" : "compute", 1e3 * ev[p].entered, 1e3 * ev[p].inputs,
            1e3 * ev[p].start, 1e3 * ev[p].end, 1e3 * ev[p].back, ev[p].in_bytes / 1e6,
            ev[p].out_bytes / 1e6);
}
