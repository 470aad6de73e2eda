/* Chrome/Perfetto trace JSON: a "thread" per track with its name, and one complete ("X") event per
 * span. Tracks: 1 the compute lane (phases and the stalls before them), then for each transfer lane
 * as many tracks as it had transfers in flight at once (Perfetto draws overlapping spans on one
 * track badly), numbered 100 * (lane) + slot. */
#include "core/sched_trace.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

#define MAX_SLOTS 64

static void put_json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static int by_start(const void *a, const void *b) {
  const struct tz_trace_span *x = a, *y = b;
  if (x->lane != y->lane)
    return x->lane - y->lane;
  return (x->t0 > y->t0) - (x->t0 < y->t0);
}

static const char *const kind_names[] = {"compute", "stall", "fill", "flush"};

int tz_trace_write_json(FILE *f, struct tz_trace_span *spans, int n_spans,
                        const char *const *lane_names, int n_lanes, uint64_t t_begin,
                        uint64_t t_end, const char *meta) {
  qsort(spans, (size_t)n_spans, sizeof *spans, by_start);
  int *tid = calloc((size_t)n_spans + 1, sizeof *tid);
  int *slots_used = calloc((size_t)n_lanes + 1, sizeof *slots_used);
  if (!tid || !slots_used) {
    free(tid);
    free(slots_used);
    return tz_err_set(TZ_ENOMEM, "trace: no memory");
  }
  /* Greedy interval colouring per lane: a span goes on the lowest slot free at its start. */
  uint64_t busy_until[MAX_SLOTS];
  int lane = -1;
  for (int i = 0; i < n_spans; i++) {
    struct tz_trace_span *e = &spans[i];
    if (e->t1 < t_begin || e->t0 > t_end) {
      tid[i] = -1;
      continue;
    }
    if (e->lane == 0) {
      tid[i] = 1;
      continue;
    }
    if (e->lane != lane) {
      lane = e->lane;
      memset(busy_until, 0, sizeof busy_until);
    }
    int slot = 0;
    while (slot < MAX_SLOTS - 1 && busy_until[slot] > e->t0)
      slot++;
    busy_until[slot] = e->t1;
    if (e->lane <= n_lanes && slot + 1 > slots_used[e->lane])
      slots_used[e->lane] = slot + 1;
    tid[i] = 100 * e->lane + slot;
  }
  fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{%s},\"traceEvents\":[\n",
          meta ? meta : "");
  fprintf(f, "{\"ph\":\"M\",\"pid\":1,\"tid\":1,\"name\":\"process_name\",\"args\":{\"name\":"
             "\"tierzero scheduler\"}}");
  for (int l = 0; l < n_lanes; l++) {
    int n_tracks = l == 0 ? 1 : slots_used[l];
    for (int k = 0; k < n_tracks; k++) {
      int t = l == 0 ? 1 : 100 * l + k;
      fprintf(
          f,
          ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":", t);
      char name[96];
      if (l == 0 || n_tracks == 1)
        snprintf(name, sizeof name, "%s", lane_names[l]);
      else
        snprintf(name, sizeof name, "%s #%d", lane_names[l], k);
      put_json_string(f, name);
      fprintf(f,
              "}},\n{\"ph\":\"M\",\"pid\":1,\"tid\":%d,\"name\":\"thread_sort_index\","
              "\"args\":{\"sort_index\":%d}}",
              t, t);
    }
  }
  for (int i = 0; i < n_spans; i++) {
    if (tid[i] < 0)
      continue;
    const struct tz_trace_span *e = &spans[i];
    double ts = ((double)e->t0 - (double)t_begin) * 1e-3;
    double dur = (double)(e->t1 - e->t0) * 1e-3;
    fprintf(f, ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":%d,\"cat\":\"%s\",\"name\":", tid[i],
            kind_names[e->kind]);
    if (e->kind == TZ_TRACE_STALL) {
      char name[80];
      snprintf(name, sizeof name, "stall %s", e->name);
      put_json_string(f, name);
    } else {
      put_json_string(f, e->name);
    }
    fprintf(f, ",\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"step\":%llu", ts, dur,
            (unsigned long long)e->step);
    if (e->kind == TZ_TRACE_COMPUTE || e->kind == TZ_TRACE_STALL)
      fprintf(f, ",\"phase\":%d", e->phase);
    else
      fprintf(f, ",\"bytes\":%llu", (unsigned long long)e->bytes);
    fprintf(f, "}}");
  }
  fprintf(f, "\n]}\n");
  free(tid);
  free(slots_used);
  return ferror(f) ? tz_err_set(TZ_EIO, "trace: write failed") : 0;
}
