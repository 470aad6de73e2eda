/* Accounting: transfer lanes, step records, counters, and the trace of one step. */
#define _GNU_SOURCE
#include "core/sched_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- transfer lanes and the trace ---- */

int tz_sched_xlane_get(tz_sched *s, const tz_tier *src, const tz_tier *dst) {
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

void tz_sched_xlane_begin(tz_sched *s, int i, uint64_t n, uint64_t now) {
  struct xlane *x = &s->xl[i];
  x->bytes += n;
  x->ops++;
  if (x->in_flight++ == 0)
    x->busy_since = now;
}

void tz_sched_xlane_end(tz_sched *s, int i, uint64_t now) {
  struct xlane *x = &s->xl[i];
  if (--x->in_flight == 0)
    x->busy_ns += now - x->busy_since;
}

void tz_sched_trace_add(tz_sched *s, int kind, int lane, const char *name, uint64_t t0, uint64_t t1,
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

struct step_rec *tz_sched_step_get(tz_sched *s, uint64_t step, uint64_t now) {
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

void tz_sched_step_check_done(tz_sched *s, struct step_rec *r) {
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
    out[i] = (struct tz_sched_phase_stats){ph->name,
                                           ph->runs,
                                           ph->stalls,
                                           1e-9 * (double)ph->stall_ns,
                                           1e-9 * (double)ph->compute_ns,
                                           ph->at_home};
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
  snprintf(meta, sizeof meta,
           "\"step\":%d,\"budget\":%llu,\"min_budget\":%llu,\"lookahead\":%d,"
           "\"compute_tier\":\"%s\"",
           s->p.trace_step, (unsigned long long)s->budget, (unsigned long long)s->min_budget,
           s->p.lookahead, tz_tier_name(s->compute));
  rc = tz_trace_write_json(f, s->spans, s->n_spans, names, n_lanes, s->trace_begin, s->trace_end,
                           meta);
  if (fclose(f) != 0 && rc == 0)
    rc = tz_err_errno(errno, "sched: writing the trace to %s", path);
  if (rc == 0)
    s->trace_written = 1;
  pthread_mutex_unlock(&s->mu);
  return rc;
}
