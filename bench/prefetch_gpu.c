/* The GPU side of tz-bench prefetch (CUDA builds only, bench/CMakeLists.txt): the compute lane is
 * a CUDA stream of the hbm compute tier, and a phase's compute is a spin kernel launched on it. */
#include "bench/bench.h"
#include "core/error.h"
#include "tiers/hbm.h"

int tz_bench_gpu_lane_create(tz_tier *hbm, tz_lane **out) { return tz_hbm_lane_create(hbm, out); }

int tz_bench_gpu_spin_job(void *arg) {
  const struct tz_bench_gpu_spin_arg *a = arg;
  char why[256];
  if (tz_bench_gpu_spin(tz_lane_native(a->lane), a->seconds, why, sizeof why) < 0)
    return tz_err_set(TZ_ECUDA, "prefetch: launching the spin kernel on lane %s: %s",
                      tz_lane_name(a->lane), why);
  return 0;
}
