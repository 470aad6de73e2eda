/* The plan: placement of blocks in tiers and the predicted bound (core/plan.h). */
#include "core/plan.h"
#include "core/error.h"
#include "util/size.h"

#include <stdlib.h>
#include <string.h>

static const char *const tier_names[] = {"compute", "host", "nvme"};
static const char *const kind_names[] = {"param", "master", "m", "v", "grad"};

const char *tz_plan_kind_name(int kind) {
  return kind >= 0 && kind < TZ_PLAN_KINDS ? kind_names[kind] : "?";
}

static uint64_t round_up(uint64_t x, uint64_t a) { return a ? (x + a - 1) / a * a : x; }

static uint64_t block_bytes(const struct tz_plan_request *r, int g, int k) {
  return round_up(r->bytes[g][k], r->align);
}

/* The bytes of phase p's blocks the window holds at once with the homes `tiers`: the scheduler
 * uses blocks homed in the compute tier in place, so they take none. */
static uint64_t phase_ws(const struct tz_plan_request *r, const int8_t *tiers, int p) {
  uint64_t ws = 0;
  if (r->phases[p].at_home) /* at the homes: nothing in the window */
    return 0;
  for (int u = 0; u < r->phases[p].n_uses; u++) {
    const struct tz_plan_use *x = &r->phases[p].uses[u];
    if (tiers[x->group * TZ_PLAN_KINDS + x->kind] != TZ_PLAN_COMPUTE)
      ws += block_bytes(r, x->group, x->kind);
  }
  return ws;
}

/* The scheduler's minimum window with the homes `tiers` (tz_sched_min_budget). */
static uint64_t min_window(const struct tz_plan_request *r, const int8_t *tiers) {
  uint64_t max = 0;
  for (int p = 0; p < r->n_phases; p++) {
    uint64_t ws = phase_ws(r, tiers, p);
    if (ws > max)
      max = ws;
  }
  return max + round_up(r->chunk, r->align);
}

/* The tier block i is forced to, or TZ_PLAN_AUTO. */
static int forced_tier(const struct tz_plan_request *r, int i) {
  int f = r->force_each ? r->force_each[i] : TZ_PLAN_AUTO;
  return f == TZ_PLAN_AUTO ? r->force[i % TZ_PLAN_KINDS] : f;
}

uint64_t tz_plan_min_window(const struct tz_plan_request *req) {
  int n = req->n_groups * TZ_PLAN_KINDS;
  int8_t *tiers = n > 0 ? malloc((size_t)n) : NULL;
  if (!tiers) { /* every block outside the compute tier: larger still, so still enough */
    uint64_t max = 0;
    for (int p = 0; p < req->n_phases; p++) {
      uint64_t ws = 0;
      for (int u = 0; u < req->phases[p].n_uses; u++)
        ws += block_bytes(req, req->phases[p].uses[u].group, req->phases[p].uses[u].kind);
      max = ws > max ? ws : max;
    }
    return max + round_up(req->chunk, req->align);
  }
  for (int i = 0; i < n; i++)
    tiers[i] = (int8_t)(forced_tier(req, i) == TZ_PLAN_COMPUTE ? TZ_PLAN_COMPUTE : TZ_PLAN_HOST);
  uint64_t w = min_window(req, tiers);
  free(tiers);
  return w;
}

static int check_request(const struct tz_plan_request *r) {
  if (r->n_groups < 1 || !r->bytes || r->n_phases < 1 || !r->phases)
    return tz_err_set(TZ_EINVAL, "plan: a request needs groups of blocks and phases");
  for (int k = 0; k < TZ_PLAN_KINDS; k++)
    if (r->force[k] != TZ_PLAN_AUTO && (r->force[k] < 0 || r->force[k] >= TZ_PLAN_TIERS))
      return tz_err_set(TZ_EINVAL, "plan: %s forced to tier %d", kind_names[k], r->force[k]);
  for (int p = 0; p < r->n_phases; p++) {
    const struct tz_plan_phase *ph = &r->phases[p];
    if (ph->n_uses < 0 || ph->n_uses > TZ_PLAN_MAX_USES)
      return tz_err_set(TZ_EINVAL, "plan: phase '%s' uses %d blocks", ph->name, ph->n_uses);
    for (int u = 0; u < ph->n_uses; u++) {
      const struct tz_plan_use *x = &ph->uses[u];
      if (x->group < 0 || x->group >= r->n_groups || x->kind < 0 || x->kind >= TZ_PLAN_KINDS ||
          x->access < 1 || x->access > 3)
        return tz_err_set(TZ_EINVAL,
                          "plan: phase '%s' has a bad use (group %d, kind %d, access %d)", ph->name,
                          x->group, x->kind, x->access);
    }
  }
  return 0;
}

/* ---- the bound ---- */

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
 * (evict_score in core/sched.c): a miss evicts the copies the current phase does not use,
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
  if (w->slot[b] >= 0) {
    w->at[w->slot[b]] = next;
    return 1;
  }
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
  uint64_t *ws; /* (n): each phase's working set in the window (phase_ws) */
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
    ws[p] = phase_ws(m->r, m->tiers, p);
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
    double d = cost(b, rt->copy_in, &m->unknown);
    m->lane[LANE_IN] = max2(m->lane[LANE_IN], at) + d;
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
    double d2 = cost(b, rt->copy_out, &m->unknown);
    m->lane[LANE_OUT] = max2(m->lane[LANE_OUT], m->comp) + d2;
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

/* Two steps over the lanes; the second step's duration is the bound. tiers: the homes. A block
 * not homed in the compute tier comes through the scheduler's window: a read of it costs a copy
 * in (and a read from nvme before) unless the window still holds it (struct resident, which
 * carries over from the first step into the second, as in a run's steady state); a write costs
 * its copy out (and a write to nvme after), and the written copy stays in the window. A home
 * phase runs on the home lane (or on the compute lane with home_on_compute) on the homes in
 * place: after the write-backs of the copies it uses, before the copies in of what it wrote,
 * whose held copies it makes stale. */
static void simulate(const struct tz_plan_request *r, const int8_t *tiers, uint64_t window,
                     struct tz_plan *out, struct tz_plan_event *ev) {
  int n = r->n_phases;
  uint64_t chunk = round_up(r->chunk, r->align);
  uint64_t room = window > chunk ? window - chunk : 0;
  int cap = r->lookahead > 0 ? r->lookahead : n;
  if (cap > n)
    cap = n;
  struct sim m = {.r = r, .tiers = tiers, .rt = &r->rates, .n = n, .ev = ev};
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

double tz_plan_host_mem_rate(const struct tz_plan_rates *r, double adam_bytes) {
  if (r->adam_home_busy <= 0 || r->copy_in_adam <= 0 || r->copy_out_adam <= 0 || adam_bytes <= 0)
    return 0;
  return r->copy_in_adam + r->copy_out_adam + r->adam_home_busy * adam_bytes;
}

int tz_plan_bound(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                  struct tz_plan *out) {
  TZ_CHECK(check_request(req));
  simulate(req, tiers, window, out, NULL);
  return 0;
}

int tz_plan_timeline(const struct tz_plan_request *req, const int8_t *tiers, uint64_t window,
                     struct tz_plan_event *ev) {
  TZ_CHECK(check_request(req));
  struct tz_plan out;
  memset(&out, 0, sizeof out);
  memset(ev, 0, sizeof *ev * (size_t)req->n_phases);
  simulate(req, tiers, window, &out, ev);
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

/* ---- placement ---- */

static void account(const struct tz_plan_request *r, const int8_t *tiers, uint64_t used[]) {
  for (int t = 0; t < TZ_PLAN_TIERS; t++)
    used[t] = 0;
  for (int g = 0; g < r->n_groups; g++)
    for (int k = 0; k < TZ_PLAN_KINDS; k++)
      used[tiers[g * TZ_PLAN_KINDS + k]] += block_bytes(r, g, k);
}

/* The compute tier's bytes the homes `tiers` need: the fixed buffers, the homes there and the
 * window, the one asked for or else the least these homes let the scheduler run in. Moving a
 * block out of the compute tier frees its bytes and grows that least window by at most as many,
 * so this never grows as blocks move out. */
static uint64_t compute_need(const struct tz_plan_request *r, const int8_t *tiers,
                             uint64_t used_compute) {
  return r->compute_fixed + used_compute + (r->window ? r->window : min_window(r, tiers));
}

static uint64_t window_for(const struct tz_plan_request *r, uint64_t used_compute) {
  if (r->window)
    return r->window;
  uint64_t taken = r->compute_fixed + used_compute;
  return r->capacity[TZ_PLAN_COMPUTE] > taken ? r->capacity[TZ_PLAN_COMPUTE] - taken : 0;
}

/* Moves, among the blocks the plan may move that sit in `from`, the one whose move to the next
 * tier with room costs the bound least per byte freed (ties: the larger block, so fewer moves).
 * Out of the compute tier, a byte freed is one less the compute tier needs (compute_need): a
 * block moved out comes back through the window, whose minimum may grow by up to its size. A
 * move that frees nothing there is taken only when none frees anything (a later one may then:
 * both blocks of the largest phase may have to go before either frees a byte), and none that
 * would leave a window asked for (req.window) below its minimum. 1 if it moved one. */
static int move_one(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                    uint64_t used[], int from, struct tz_plan *scratch) {
  simulate(r, tiers, window_for(r, used[TZ_PLAN_COMPUTE]), scratch, NULL);
  double before = scratch->bound_s;
  uint64_t minw = min_window(r, tiers);
  int best = -1, best_to = -1, best_frees = 0;
  double best_score = 0;
  uint64_t best_bytes = 0;
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++) {
    if (fixed[i] || tiers[i] != from)
      continue;
    uint64_t b = block_bytes(r, i / TZ_PLAN_KINDS, i % TZ_PLAN_KINDS);
    int to = -1;
    for (int t = from + 1; t < TZ_PLAN_TIERS && to < 0; t++)
      if (r->capacity[t] >= used[t] + b)
        to = t;
    if (to < 0 || b == 0)
      continue;
    tiers[i] = (int8_t)to;
    uint64_t freed = b;
    if (from == TZ_PLAN_COMPUTE) {
      uint64_t grown = min_window(r, tiers) - minw;
      if (r->window && minw + grown > r->window) {
        tiers[i] = (int8_t)from;
        continue;
      }
      if (!r->window)
        freed = grown >= b ? 0 : b - grown;
    }
    uint64_t uc = used[TZ_PLAN_COMPUTE] - (from == TZ_PLAN_COMPUTE ? b : 0);
    simulate(r, tiers, window_for(r, uc), scratch, NULL);
    tiers[i] = (int8_t)from;
    int frees = freed > 0;
    double per = (double)(frees ? freed : b);
    double score = (scratch->bound_s - before) / per;
    double tol = 1e-12 * (before > 0 ? before : 1) / per;
    if (best < 0 || frees > best_frees ||
        (frees == best_frees &&
         (score < best_score - tol || (score <= best_score + tol && b > best_bytes)))) {
      best = i;
      best_to = to;
      best_frees = frees;
      best_score = score;
      best_bytes = b;
    }
  }
  if (best < 0)
    return 0;
  tiers[best] = (int8_t)best_to;
  used[from] -= best_bytes;
  used[best_to] += best_bytes;
  return 1;
}

/* The plan's messages print sizes up to GiB (util/size.h). */
static void fmt_bytes(char *buf, size_t len, uint64_t b) {
  tz_bytes_format(buf, len, (double)b, &tz_bytes_plan);
}

/* Sets every block's starting home: its forced tier, or the compute tier; fixed[i]: forced. */
static int start_homes(const struct tz_plan_request *r, int8_t *tiers, int8_t *fixed) {
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++) {
    int f = forced_tier(r, i);
    if (f != TZ_PLAN_AUTO && (f < 0 || f >= TZ_PLAN_TIERS))
      return tz_err_set(TZ_EINVAL, "plan: group %d %s forced to tier %d", i / TZ_PLAN_KINDS,
                        kind_names[i % TZ_PLAN_KINDS], f);
    fixed[i] = f != TZ_PLAN_AUTO;
    tiers[i] = (int8_t)(fixed[i] ? f : TZ_PLAN_COMPUTE);
  }
  return 0;
}

/* The window's minimum depends on the homes (blocks homed in the compute tier are used in
 * place): least with every block the plan may move still in the compute tier (lo), largest
 * with all of them out (hi). A window asked for below lo fits no placement; buffers plus hi
 * (the least the compute tier needs, whatever is placed) beyond the capacity neither. tiers: the
 * starting homes. */
static int check_minimum(const struct tz_plan_request *r, const int8_t *tiers) {
  uint64_t minw_lo = min_window(r, tiers), minw_hi = tz_plan_min_window(r);
  uint64_t cap = r->capacity[TZ_PLAN_COMPUTE];
  uint64_t least = r->compute_fixed + (r->window ? r->window : minw_hi);
  char a[32], b[32], c[32], d[32];
  if (r->window && r->window < minw_lo) {
    fmt_bytes(a, sizeof a, r->window);
    fmt_bytes(b, sizeof b, minw_lo - r->window);
    fmt_bytes(c, sizeof c, minw_lo);
    return tz_err_set(TZ_ENOMEM,
                      "plan: the scheduler's window of %s is %s short of its minimum %s "
                      "(the largest phase's blocks not homed in the compute tier, plus one chunk)",
                      a, b, c);
  }
  if (least > cap) {
    fmt_bytes(a, sizeof a, cap);
    fmt_bytes(b, sizeof b, least - cap);
    fmt_bytes(c, sizeof c, r->compute_fixed);
    fmt_bytes(d, sizeof d, least - r->compute_fixed);
    return tz_err_set(TZ_ENOMEM,
                      "plan: the compute tier's budget of %s is %s short of the minimum: "
                      "%s for activations, gathered weights and full gradients, plus %s for the "
                      "scheduler's window (%s)",
                      a, b, c, d,
                      r->window ? "the window asked for"
                                : "the largest phase's blocks not forced into the compute tier, "
                                  "plus one chunk");
  }
  return 0;
}

/* Moves blocks out of the compute tier until it holds what the homes need (compute_need). */
static int fit_compute(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                       uint64_t used[], struct tz_plan *scratch) {
  uint64_t cap = r->capacity[TZ_PLAN_COMPUTE];
  while (compute_need(r, tiers, used[TZ_PLAN_COMPUTE]) > cap)
    if (!move_one(r, tiers, fixed, used, TZ_PLAN_COMPUTE, scratch)) {
      uint64_t forced = 0, need = compute_need(r, tiers, used[TZ_PLAN_COMPUTE]);
      for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++)
        if (fixed[i] && tiers[i] == TZ_PLAN_COMPUTE)
          forced += block_bytes(r, i / TZ_PLAN_KINDS, i % TZ_PLAN_KINDS);
      char a[32], b[32], c[32], d[32], e[32], f[32];
      fmt_bytes(a, sizeof a, cap);
      fmt_bytes(b, sizeof b, need - cap);
      fmt_bytes(c, sizeof c, used[TZ_PLAN_COMPUTE]);
      fmt_bytes(d, sizeof d, forced);
      fmt_bytes(e, sizeof e, need - used[TZ_PLAN_COMPUTE]);
      fmt_bytes(f, sizeof f, r->window);
      return tz_err_set(TZ_ENOMEM,
                        "plan: the compute tier's budget of %s is %s short: %s of state "
                        "stays there (%s of it forced there) beside %s of buffers and minimum "
                        "window, and host and nvme have no room to take more%s%s%s",
                        a, b, c, d, e,
                        r->window ? ", or a move would raise the minimum window "
                                    "above the "
                                  : "",
                        r->window ? f : "", r->window ? " asked for" : "");
    }
  return 0;
}

/* The homes fit. A window of what the homes leave can still be too small to look ahead (all
 * of a large model's state but a working set in the compute tier): while moving a block out
 * lowers the bound, through the window it frees, move it. */
static int widen_window(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                        uint64_t used[], struct tz_plan *scratch) {
  int n = r->n_groups * TZ_PLAN_KINDS;
  int8_t *before = malloc((size_t)n);
  if (!before)
    return tz_err_set(TZ_ENOMEM, "plan: no memory");
  for (int moves = 0; moves < n; moves++) {
    simulate(r, tiers, window_for(r, used[TZ_PLAN_COMPUTE]), scratch, NULL);
    double bound = scratch->bound_s;
    uint64_t kept[TZ_PLAN_TIERS];
    memcpy(before, tiers, (size_t)n);
    memcpy(kept, used, sizeof kept);
    if (!move_one(r, tiers, fixed, used, TZ_PLAN_COMPUTE, scratch))
      break;
    simulate(r, tiers, window_for(r, used[TZ_PLAN_COMPUTE]), scratch, NULL);
    if (!(scratch->bound_s < bound * (1 - 1e-9))) {
      memcpy(tiers, before, (size_t)n);
      memcpy(used, kept, sizeof kept);
      break;
    }
  }
  free(before);
  return 0;
}

/* Moves blocks from host memory to nvme until host memory holds its homes; then checks nvme's. */
static int fit_host_nvme(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                         uint64_t used[], struct tz_plan *scratch) {
  char a[32], b[32], c[32];
  while (used[TZ_PLAN_HOST] > r->capacity[TZ_PLAN_HOST])
    if (!move_one(r, tiers, fixed, used, TZ_PLAN_HOST, scratch)) {
      fmt_bytes(a, sizeof a, r->capacity[TZ_PLAN_HOST]);
      fmt_bytes(b, sizeof b, used[TZ_PLAN_HOST] - r->capacity[TZ_PLAN_HOST]);
      fmt_bytes(c, sizeof c, used[TZ_PLAN_HOST]);
      return tz_err_set(TZ_ENOMEM,
                        "plan: host memory's budget of %s is %s short: %s of state must "
                        "live there (forced, or no room in nvme)",
                        a, b, c);
    }
  if (used[TZ_PLAN_NVME] > r->capacity[TZ_PLAN_NVME]) {
    fmt_bytes(a, sizeof a, r->capacity[TZ_PLAN_NVME]);
    fmt_bytes(b, sizeof b, used[TZ_PLAN_NVME] - r->capacity[TZ_PLAN_NVME]);
    fmt_bytes(c, sizeof c, used[TZ_PLAN_NVME]);
    return tz_err_set(TZ_ENOMEM,
                      "plan: nvme's budget of %s is %s short: %s of state is placed there%s", a, b,
                      c, r->capacity[TZ_PLAN_NVME] ? "" : " (no nvme_path is configured)");
  }
  return 0;
}

/* Fills out with the placement `tiers` (out takes it) and its bound. */
static void fill_plan(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                      const uint64_t used[], struct tz_plan *out) {
  out->n_groups = r->n_groups;
  out->tier = tiers;
  for (int t = 0; t < TZ_PLAN_TIERS; t++) {
    out->used[t] = used[t];
    out->capacity[t] = r->capacity[t];
  }
  out->compute_fixed = r->compute_fixed;
  out->compute_acts = r->compute_acts;
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++)
    out->kind_bytes[i % TZ_PLAN_KINDS][tiers[i]] +=
        block_bytes(r, i / TZ_PLAN_KINDS, i % TZ_PLAN_KINDS);
  out->min_window = min_window(r, out->tier);
  out->window = window_for(r, used[TZ_PLAN_COMPUTE]);
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++)
    out->moves += !fixed[i] && out->tier[i] != TZ_PLAN_COMPUTE;
  simulate(r, out->tier, out->window, out, NULL);
}

int tz_plan_make(const struct tz_plan_request *r, struct tz_plan *out) {
  memset(out, 0, sizeof *out);
  TZ_CHECK(check_request(r));
  int n = r->n_groups * TZ_PLAN_KINDS;
  int8_t *tiers = malloc((size_t)n), *fixed = malloc((size_t)n);
  if (!tiers || !fixed) {
    free(tiers);
    free(fixed);
    return tz_err_set(TZ_ENOMEM, "plan: no memory");
  }
  uint64_t used[TZ_PLAN_TIERS];
  struct tz_plan scratch;
  int rc;
  if ((rc = start_homes(r, tiers, fixed)) < 0 || (rc = check_minimum(r, tiers)) < 0)
    goto out;
  account(r, tiers, used);
  memset(&scratch, 0, sizeof scratch);
  if ((rc = fit_compute(r, tiers, fixed, used, &scratch)) < 0 ||
      (!r->window && (rc = widen_window(r, tiers, fixed, used, &scratch)) < 0) ||
      (rc = fit_host_nvme(r, tiers, fixed, used, &scratch)) < 0)
    goto out;
  fill_plan(r, tiers, fixed, used, out);
  tiers = NULL;
out:
  free(tiers);
  free(fixed);
  return rc;
}

void tz_plan_free(struct tz_plan *p) {
  if (!p)
    return;
  free(p->tier);
  p->tier = NULL;
}

static void fmt_time(char *buf, size_t len, double s) {
  if (s >= 1)
    snprintf(buf, len, "%.3f s", s);
  else if (s >= 1e-3)
    snprintf(buf, len, "%.3f ms", s * 1e3);
  else
    snprintf(buf, len, "%.1f us", s * 1e6);
}

void tz_plan_print(FILE *f, const struct tz_plan *p, const char *const *group_names) {
  char a[32], b[32], c[32];
  fprintf(f, "plan: homes per kind of block (%d groups)\n", p->n_groups);
  for (int k = 0; k < TZ_PLAN_KINDS; k++) {
    int cnt[TZ_PLAN_TIERS] = {0, 0, 0};
    for (int g = 0; g < p->n_groups; g++)
      cnt[p->tier[g * TZ_PLAN_KINDS + k]]++;
    fprintf(f, "  %-7s", kind_names[k]);
    for (int t = 0; t < TZ_PLAN_TIERS; t++)
      fprintf(f, "  %s %d", tier_names[t], cnt[t]);
    fputc('\n', f);
  }
  if (group_names) {
    fprintf(f, "  per group (param master m v grad):\n");
    for (int g = 0; g < p->n_groups; g++) {
      fprintf(f, "    %-10s", group_names[g]);
      for (int k = 0; k < TZ_PLAN_KINDS; k++)
        fprintf(f, " %-7s", tier_names[p->tier[g * TZ_PLAN_KINDS + k]]);
      fputc('\n', f);
    }
  }
  for (int t = 0; t < TZ_PLAN_TIERS; t++) {
    fmt_bytes(a, sizeof a, p->used[t]);
    fmt_bytes(b, sizeof b, p->capacity[t]);
    fprintf(f, "  %-7s  homes %s of %s\n", tier_names[t], a, b);
  }
  tz_plan_print_table(f, p, "    ");
  fmt_bytes(a, sizeof a, p->compute_fixed);
  fmt_bytes(b, sizeof b, p->window);
  fmt_bytes(c, sizeof c, p->min_window);
  fprintf(f, "  compute  buffers %s, scheduler window %s (minimum %s), lookahead %d phases\n", a, b,
          c, p->lookahead);
  char t0[32], t1[32], t2[32], t3[32], t4[32], t5[32], at_home[96] = "";
  fmt_time(t0, sizeof t0, p->bound_s);
  fmt_time(t1, sizeof t1, p->compute_s);
  fmt_time(t2, sizeof t2, p->lane_s[0]);
  fmt_time(t3, sizeof t3, p->lane_s[1]);
  fmt_time(t4, sizeof t4, p->lane_s[2]);
  fmt_time(t5, sizeof t5, p->lane_s[3]);
  if (p->lane_s[3] > 0)
    snprintf(at_home, sizeof at_home, ", CPU at the homes %s", t5);
  if (p->host_mem_s > 0) {
    char t7[32];
    fmt_time(t7, sizeof t7, p->host_mem_s);
    snprintf(at_home + strlen(at_home), sizeof at_home - strlen(at_home),
             ", host memory for both %s", t7);
  }
  char link[96] = "";
  if (p->link_s > 1.001 * p->path_s) { /* the link, not the lanes' path, sets the bound */
    char t6[32];
    fmt_time(t6, sizeof t6, p->path_s);
    snprintf(link, sizeof link, "; the host link both ways beside the window: the lanes' path %s",
             t6);
  }
  fprintf(f, "  bound    %s per step (compute %s; copy in %s, copy out %s, nvme %s%s%s)%s\n", t0,
          t1, t2, t3, t4, at_home, link,
          p->unknown_rates ? " [some rates unknown: counted as free]" : "");
}

/* The table's rows: the kinds in the order DeepSpeed's estimate names them, then the buffers. */
static const int table_kinds[] = {TZ_PLAN_PARAM, TZ_PLAN_GRAD, TZ_PLAN_MASTER, TZ_PLAN_M,
                                  TZ_PLAN_V};
static const char *const table_names[] = {"parameters", "gradients", "master", "m", "v"};

static void table_row(FILE *f, const char *indent, const char *name, const uint64_t *b,
                      uint64_t col_total[TZ_PLAN_TIERS]) {
  char c[TZ_PLAN_TIERS + 1][32];
  uint64_t total = 0;
  for (int t = 0; t < TZ_PLAN_TIERS; t++) {
    fmt_bytes(c[t], sizeof c[t], b[t]);
    total += b[t];
    col_total[t] += b[t];
  }
  fmt_bytes(c[TZ_PLAN_TIERS], sizeof c[TZ_PLAN_TIERS], total);
  fprintf(f, "%s%-12s %12s %12s %12s %12s\n", indent, name, c[0], c[1], c[2], c[3]);
}

void tz_plan_print_table(FILE *f, const struct tz_plan *p, const char *indent) {
  uint64_t col[TZ_PLAN_TIERS] = {0, 0, 0}, none[TZ_PLAN_TIERS] = {0, 0, 0};
  fprintf(f, "%s%-12s %12s %12s %12s %12s\n", indent, "state", "compute", "host", "nvme", "total");
  for (int i = 0; i < TZ_PLAN_KINDS; i++)
    table_row(f, indent, table_names[i], p->kind_bytes[table_kinds[i]], col);
  uint64_t row[TZ_PLAN_TIERS] = {0, 0, 0};
  uint64_t acts = p->compute_acts < p->compute_fixed ? p->compute_acts : p->compute_fixed;
  row[TZ_PLAN_COMPUTE] = p->compute_fixed - acts;
  table_row(f, indent, "buffers", row, col);
  row[TZ_PLAN_COMPUTE] = acts;
  table_row(f, indent, "activations", row, col);
  row[TZ_PLAN_COMPUTE] = p->window;
  table_row(f, indent, "window", row, col);
  table_row(f, indent, "total", col, none);
}

void tz_plan_state_summary(const struct tz_plan_request *r, char *buf, size_t len) {
  uint64_t k[TZ_PLAN_KINDS] = {0};
  for (int g = 0; g < r->n_groups; g++)
    for (int i = 0; i < TZ_PLAN_KINDS; i++)
      k[i] += block_bytes(r, g, i);
  char a[TZ_PLAN_KINDS + 2][32];
  for (int i = 0; i < TZ_PLAN_KINDS; i++)
    fmt_bytes(a[i], sizeof a[i], k[table_kinds[i]]);
  uint64_t acts = r->compute_acts < r->compute_fixed ? r->compute_acts : r->compute_fixed;
  fmt_bytes(a[TZ_PLAN_KINDS], sizeof a[0], r->compute_fixed - acts);
  fmt_bytes(a[TZ_PLAN_KINDS + 1], sizeof a[0], acts);
  snprintf(buf, len,
           "the state: parameters %s, gradients %s, master %s, m %s, v %s; compute-tier "
           "buffers %s and activations %s",
           a[0], a[1], a[2], a[3], a[4], a[TZ_PLAN_KINDS], a[TZ_PLAN_KINDS + 1]);
}
