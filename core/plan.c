/* The plan: the request's checks, placement of blocks in tiers, and printing (core/plan.h); the
 * bound's simulation of a step is core/plan_bound.c. */
#include "core/plan.h"
#include "core/error.h"
#include "core/plan_internal.h"
#include "util/size.h"

#include <stdlib.h>
#include <string.h>

static const char *const tier_names[] = {"compute", "host", "nvme"};
static const char *const kind_names[] = {"param", "master", "m", "v", "grad", "act"};

const char *tz_plan_kind_name(int kind) {
  return kind >= 0 && kind < TZ_PLAN_KINDS ? kind_names[kind] : "?";
}

uint64_t tz_plan_phase_ws(const struct tz_plan_request *r, const int8_t *tiers, int p) {
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
    uint64_t ws = tz_plan_phase_ws(r, tiers, p);
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

int tz_plan_check_request(const struct tz_plan_request *r) {
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

/* The window: the one asked for, else what the homes `tiers` leave of the compute tier, but no
 * more than the state homed outside it plus the least window: one that holds all of that at once
 * beside a phase's working set has nothing more to hold, and a small model's run leaves the rest
 * of the GPU's free memory to whatever else runs there. */
static uint64_t window_for(const struct tz_plan_request *r, const int8_t *tiers,
                           uint64_t used_compute) {
  if (r->window)
    return r->window;
  uint64_t taken = r->compute_fixed + used_compute;
  uint64_t left = r->capacity[TZ_PLAN_COMPUTE] > taken ? r->capacity[TZ_PLAN_COMPUTE] - taken : 0;
  uint64_t outside = 0;
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS && outside < left; i++)
    if (tiers[i] != TZ_PLAN_COMPUTE)
      outside += block_bytes(r, i / TZ_PLAN_KINDS, i % TZ_PLAN_KINDS);
  if (outside >= left)
    return left;
  uint64_t useful = outside + min_window(r, tiers);
  return useful < left ? useful : left;
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
  tz_plan_simulate(r, tiers, window_for(r, tiers, used[TZ_PLAN_COMPUTE]), scratch, NULL);
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
    tz_plan_simulate(r, tiers, window_for(r, tiers, uc), scratch, NULL);
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
 * of a large model's state but a working set in the compute tier): move blocks out, the
 * cheapest first (move_one), and keep the placement with the least bound seen, trying up to
 * r->widen_moves moves past it (0: none, the first that does not lower it ends the search). One
 * move at a time is not enough: a window grows in steps (a phase's blocks), and a move may buy
 * nothing until the next few do. llama-13b at 8 x 2048 on the H200's rates stopped at 5.59 s where,
 * four moves on, the bound is 4.16 (what the plan made with 4 GiB less HBM: the greedy stopped at
 * the first move that did not lower it; 12 moves on, 3.94). */
static int widen_window(const struct tz_plan_request *r, int8_t *tiers, const int8_t *fixed,
                        uint64_t used[], struct tz_plan *scratch) {
  int n = r->n_groups * TZ_PLAN_KINDS;
  int8_t *best = malloc((size_t)n);
  if (!best)
    return tz_err_set(TZ_ENOMEM, "plan: no memory");
  tz_plan_simulate(r, tiers, window_for(r, tiers, used[TZ_PLAN_COMPUTE]), scratch, NULL);
  double best_s = scratch->bound_s;
  uint64_t best_used[TZ_PLAN_TIERS];
  memcpy(best, tiers, (size_t)n);
  memcpy(best_used, used, sizeof best_used);
  for (int moves = 0, past = 0; moves < n && past <= r->widen_moves; moves++) {
    if (!move_one(r, tiers, fixed, used, TZ_PLAN_COMPUTE, scratch))
      break;
    tz_plan_simulate(r, tiers, window_for(r, tiers, used[TZ_PLAN_COMPUTE]), scratch, NULL);
    if (scratch->bound_s < best_s * (1 - 1e-9)) {
      best_s = scratch->bound_s;
      memcpy(best, tiers, (size_t)n);
      memcpy(best_used, used, sizeof best_used);
      past = 0;
    } else {
      past++;
    }
  }
  memcpy(tiers, best, (size_t)n);
  memcpy(used, best_used, sizeof best_used);
  free(best);
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
                      "plan: nvme's budget of %s is %s short: %s of state is placed "
                      "there (%s)",
                      a, b, c,
                      r->nvme_capacity_why ? r->nvme_capacity_why : "no nvme_path is configured");
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
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++) {
    uint64_t b = block_bytes(r, i / TZ_PLAN_KINDS, i % TZ_PLAN_KINDS);
    out->kind_bytes[i % TZ_PLAN_KINDS][tiers[i]] += b;
    out->kind_blocks[i % TZ_PLAN_KINDS][tiers[i]] += b > 0;
  }
  out->min_window = min_window(r, out->tier);
  out->window = window_for(r, out->tier, used[TZ_PLAN_COMPUTE]);
  for (int i = 0; i < r->n_groups * TZ_PLAN_KINDS; i++)
    out->moves += !fixed[i] && out->tier[i] != TZ_PLAN_COMPUTE;
  tz_plan_simulate(r, out->tier, out->window, out, NULL);
}

int tz_plan_make(const struct tz_plan_request *r, struct tz_plan *out) {
  memset(out, 0, sizeof *out);
  TZ_CHECK(tz_plan_check_request(r));
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
    fprintf(f, "  %-7s", kind_names[k]);
    for (int t = 0; t < TZ_PLAN_TIERS; t++)
      fprintf(f, "  %s %d", tier_names[t], p->kind_blocks[k][t]);
    fputc('\n', f);
  }
  if (group_names) {
    fprintf(f, "  per group (param master m v grad act):\n");
    int w = 10; /* the names' column: "layer12.moe" and longer widen it */
    for (int g = 0; g < p->n_groups; g++)
      w = (int)strlen(group_names[g]) > w ? (int)strlen(group_names[g]) : w;
    for (int g = 0; g < p->n_groups; g++) {
      fprintf(f, "    %-*s", w, group_names[g]);
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
static const int table_kinds[] = {TZ_PLAN_PARAM, TZ_PLAN_GRAD, TZ_PLAN_MASTER,
                                  TZ_PLAN_M,     TZ_PLAN_V,    TZ_PLAN_ACT};
static const char *const table_names[] = {"parameters", "gradients", "master",
                                          "m",          "v",         "layer inputs"};

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
           "the state: parameters %s, gradients %s, master %s, m %s, v %s, the layers' inputs "
           "%s; compute-tier buffers %s and activations %s",
           a[0], a[1], a[2], a[3], a[4], a[5], a[TZ_PLAN_KINDS], a[TZ_PLAN_KINDS + 1]);
}
