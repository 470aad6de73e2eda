/* The device-lane registry: the tier backends whose devices have lanes of their own, and making
 * one for a tier by its backend's name. */
#include "core/error.h"
#include "core/lane.h"
#include "core/lane_impl.h"
#include "core/tier.h"

#include <string.h>

/* The registry of device lanes: the tier backends that make them, by the tier backend's name. */
static const struct tz_lane_backend *const device_lanes[] = {
#ifdef TZ_HAVE_CUDA
    &tz_lane_backend_hbm,
#endif
    NULL,
};

int tz_lane_create_device(tz_tier *t, void *native, const char *name, tz_lane **out) {
  *out = NULL;
  const char *backend = tz_tier_backend(t);
  for (int i = 0; device_lanes[i]; i++)
    if (strcmp(device_lanes[i]->tier, backend) == 0)
      return device_lanes[i]->create(t, native, name, out);
  return tz_err_set(TZ_ENOTSUP, "lane: tier %s (%s) has no device lanes", tz_tier_name(t), backend);
}
