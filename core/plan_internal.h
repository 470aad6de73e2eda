/* What the plan's two files share (plan.c: the request's checks, placement and printing;
 * plan_bound.c: the bound's simulation of a step). */
#ifndef TZ_PLAN_INTERNAL_H
#define TZ_PLAN_INTERNAL_H

#include "core/plan.h"

#include <stdint.h>

static inline uint64_t round_up(uint64_t x, uint64_t a) { return a ? (x + a - 1) / a * a : x; }

static inline uint64_t block_bytes(const struct tz_plan_request *r, int g, int k) {
  return round_up(r->bytes[g][k], r->align);
}

/* 0, or TZ_EINVAL naming what is malformed in r. */
int tz_plan_check_request(const struct tz_plan_request *r);

/* The bytes of phase p's blocks the window holds at once with the homes `tiers`: the scheduler
 * uses blocks homed in the compute tier in place, so they take none. */
uint64_t tz_plan_phase_ws(const struct tz_plan_request *r, const int8_t *tiers, int p);

/* Two steps over the lanes with the homes `tiers` and this window; the second step's duration
 * is the bound. Fills out's timing fields, and with ev (n_phases) the second step's phases. */
void tz_plan_simulate(const struct tz_plan_request *r, const int8_t *tiers, uint64_t window,
                      struct tz_plan *out, struct tz_plan_event *ev);

#endif
