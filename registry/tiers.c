/* The tier registry: the one place that knows which tier backends this build has, and creating a
 * tier (or a runtime, whose staging lives in a host tier) by backend name. */
#include "core/error.h"
#include "core/runtime.h"
#include "core/tier.h"
#include "core/tier_impl.h"

#include <stdio.h>
#include <string.h>

static const struct tz_tier_ops *const backends[] = {
    &tz_tier_host_ops,
    &tz_tier_nvme_ops,
    &tz_tier_fault_ops,
#ifdef TZ_HAVE_CUDA
    &tz_tier_hbm_ops,
#endif
};
#define N_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

static const struct tz_tier_ops *find_backend(const char *name) {
  for (int i = 0; i < N_BACKENDS; i++)
    if (strcmp(backends[i]->name, name) == 0)
      return backends[i];
  return NULL;
}

int tz_tier_probe(const char *backend, char *why, size_t why_len) {
  const struct tz_tier_ops *ops = find_backend(backend);
  if (!ops) {
    snprintf(why, why_len, "%s: not built into this tierzero%s", backend,
             strcmp(backend, "hbm") == 0 ? " (no CUDA toolkit at build time)" : "");
    return TZ_ENOENT;
  }
  if (!ops->probe) {
    if (why_len)
      why[0] = '\0';
    return 0;
  }
  return ops->probe(why, why_len);
}

int tz_tier_create(tz_runtime *rt, const char *backend, const struct tz_tier_params *p,
                   tz_tier **out) {
  const struct tz_tier_ops *ops = find_backend(backend);
  if (!ops) {
    char why[160];
    tz_tier_probe(backend, why, sizeof why);
    return tz_err_set(TZ_ENOENT, "%s", why);
  }
  return tz_tier_create_from(rt, ops, p, out);
}

int tz_tier_settings_check(const char *backend, const char *settings) {
  const struct tz_tier_ops *ops = find_backend(backend);
  if (!ops)
    return tz_err_set(TZ_ENOENT, "tier: no backend '%s' in this build", backend);
  int64_t v[64];
  if (ops->n_settings > 64)
    return tz_err_set(TZ_EINVAL, "%s: %d settings, more than 64", backend, ops->n_settings);
  return tz_settings_parse(backend, ops->settings, ops->n_settings, settings, v);
}

int tz_tier_backend_built(const char *backend) { return find_backend(backend) != NULL; }

int tz_runtime_create(const struct tz_runtime_params *p, tz_runtime **out) {
  return tz_runtime_create_from(p, &tz_tier_host_ops, out);
}
