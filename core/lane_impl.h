/* What a lane backend implements (private to core/ and the backends). One static const ops table
 * per backend, filled with designated initializers. The CPU lane is in core/lane.c; a GPU backend
 * makes a CUDA-stream lane with tz_lane_create_ops. */
#ifndef TZ_LANE_IMPL_H
#define TZ_LANE_IMPL_H

#include "core/lane.h"

struct tz_lane_ops {
  const char *kind; /* "cpu", "cuda-stream" */
  /* Later work waits for every one of fs[0..n) (NULL entries count as complete). info (may be
   * NULL) measures them as one wait and must be filled before any fence recorded on the lane
   * after this call completes. A failed fence poisons the lane (see core/lane.h). */
  int (*wait)(tz_lane *l, tz_fence *const *fs, int n, struct tz_lane_wait *info);
  /* optional: NULL means the lane runs no host functions (TZ_ENOTSUP). */
  int (*submit)(tz_lane *l, int (*fn)(void *arg), void *arg);
  int (*record)(tz_lane *l, tz_fence **out);
  /* optional: NULL means no native handle. */
  void *(*native)(tz_lane *l);
  /* optional: NULL means the lane has no jitter hook. */
  void (*set_jitter)(tz_lane *l, int max_us, uint64_t seed);
  /* optional: NULL means tz_lane_order records a fence on `from` and waits for it on `to`.
   * Called only when both lanes have these ops. */
  int (*order)(tz_lane *from, tz_lane *to);
  /* optional, all four or none: NULL means the lane cannot time its work (TZ_ENOTSUP).
   * timer_create makes n marks in *ctx; the others have the meaning of tz_lane_timer_*. */
  int (*timer_create)(tz_lane *l, int n, void **ctx);
  int (*timer_mark)(tz_lane *l, void *ctx, int i);
  int (*timer_elapsed)(tz_lane *l, void *ctx, int i, int j, double *seconds);
  void (*timer_destroy)(tz_lane *l, void *ctx);
  /* Waits for the lane's work and frees ctx. */
  void (*destroy)(tz_lane *l);
};

struct tz_lane {
  const struct tz_lane_ops *ops;
  void *ctx;
  char name[32];
  /* Kept by the backend, read by tz_lane_stats; atomic. */
  uint64_t busy_ns, stall_ns, jobs, waits;
};

/* A lane over a backend's ops; ctx is handed over and freed by ops->destroy. */
int tz_lane_create_ops(const struct tz_lane_ops *ops, void *ctx, const char *name, tz_lane **out);

/* A tier backend whose device has lanes of its own (tz_lane_create_device): `tier` is the tier
 * backend's name (tz_tier_backend); create has the meaning of tz_lane_create_device for a tier
 * of that backend. */
struct tz_lane_backend {
  const char *tier;
  int (*create)(tz_tier *t, void *native, const char *name, tz_lane **out);
};

/* Registry entries: tiers/hbm_lane.c (CUDA builds only); registry/lanes.c lists them. */
extern const struct tz_lane_backend tz_lane_backend_hbm;

#endif
