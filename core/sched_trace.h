/* The scheduler's trace writer (private to core/): spans on lanes, written as Chrome/Perfetto JSON
 * (docs/scheduler.md describes the format). */
#ifndef TZ_SCHED_TRACE_H
#define TZ_SCHED_TRACE_H

#include <stdint.h>
#include <stdio.h>

enum tz_trace_kind { TZ_TRACE_COMPUTE, TZ_TRACE_STALL, TZ_TRACE_FILL, TZ_TRACE_FLUSH };

/* One span on one lane. Transfer spans of one lane may overlap; the writer spreads them over as
 * many tracks as there are transfers in flight at once. */
struct tz_trace_span {
  int kind;        /* enum tz_trace_kind */
  int lane;        /* 0: the compute lane; 1 + i: the scheduler's transfer lane i */
  char name[64];   /* phase or block name */
  uint64_t t0, t1; /* CLOCK_MONOTONIC ns */
  uint64_t step;
  int phase;      /* compute and stall spans */
  uint64_t bytes; /* transfer spans */
};

/* Writes every span that overlaps [t_begin, t_end] to f, times in microseconds from t_begin.
 * lane_names[0..n_lanes) name the lanes; meta is a JSON object's members ("\"step\":3,...")
 * written under "otherData". Sorts spans in place. Returns 0 or a negative code. */
int tz_trace_write_json(FILE *f, struct tz_trace_span *spans, int n_spans,
                        const char *const *lane_names, int n_lanes, uint64_t t_begin,
                        uint64_t t_end, const char *meta);

#endif
