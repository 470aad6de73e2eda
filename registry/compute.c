/* The compute registry: the one place that knows which compute backends this build has,
 * creating an instance by backend name, and the device queries, which name a backend too. */
#include "kernels/compute.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "core/settings.h"
#include "kernels/compute_impl.h"

static const struct tz_compute_backend *const backends[] = {
    &tz_compute_backend_cpu,
#ifdef TZ_HAVE_CUDA
    &tz_compute_backend_cuda,
#endif
};
#define N_BACKENDS ((int)(sizeof backends / sizeof backends[0]))

int tz_compute_backend_count(void) { return N_BACKENDS; }

const char *tz_compute_backend_name(int i) {
  return i >= 0 && i < N_BACKENDS ? backends[i]->name : NULL;
}

static const struct tz_compute_backend *find_backend(const char *name) {
  for (int i = 0; name && i < N_BACKENDS; i++)
    if (strcmp(backends[i]->name, name) == 0)
      return backends[i];
  return NULL;
}

int tz_compute_backend_built(const char *name) { return find_backend(name) != NULL; }

int tz_compute_probe(const char *backend, char *why, size_t why_len) {
  const struct tz_compute_backend *b = find_backend(backend);
  if (!b) {
    int known = backend && strcmp(backend, "cuda") == 0;
    if (why && why_len)
      snprintf(why, why_len, "%s: %s", backend ? backend : "(null)",
               known ? "not compiled in (this build has no CUDA toolkit)" : "no such backend");
    return known ? TZ_ENOTSUP : TZ_ENOENT;
  }
  if (why && why_len)
    why[0] = '\0';
  return b->probe(why, why_len);
}

const struct tz_setting *tz_compute_settings(const char *backend, int *n) {
  const struct tz_compute_backend *b = find_backend(backend);
  *n = b ? b->n_settings : 0;
  return b ? b->settings : NULL;
}

int tz_compute_settings_check(const char *backend, const char *settings) {
  const struct tz_compute_backend *b = find_backend(backend);
  if (!b)
    return tz_err_set(TZ_ENOENT, "compute: no backend '%s' in this build", backend);
  char who[64];
  snprintf(who, sizeof who, "compute %s", b->name);
  int64_t v[TZ_COMPUTE_MAX_SETTINGS];
  if (b->n_settings > TZ_COMPUTE_MAX_SETTINGS)
    return tz_err_set(TZ_EINVAL, "%s: %d settings, more than %d", who, b->n_settings,
                      TZ_COMPUTE_MAX_SETTINGS);
  return tz_settings_parse(who, b->settings, b->n_settings, settings, v);
}

int tz_compute_variants(const char *backend, const char *settings) {
  TZ_CHECK(tz_compute_settings_check(backend, settings));
  const struct tz_compute_backend *b = find_backend(backend);
  if (!b->variants)
    return b->variants_always;
  int64_t v[TZ_COMPUTE_MAX_SETTINGS];
  TZ_CHECK(tz_settings_parse(b->name, b->settings, b->n_settings, settings, v));
  return b->variants(v);
}

int tz_compute_moe(const char *backend) {
  const struct tz_compute_backend *b = find_backend(backend);
  if (!b)
    return tz_err_set(TZ_ENOENT, "compute: no backend '%s' in this build", backend);
  return b->moe;
}

int tz_compute_create(const char *backend, const struct tz_compute_params *p, tz_compute **out) {
  *out = NULL;
  char why[256];
  int rc = tz_compute_probe(backend, why, sizeof why);
  if (rc < 0)
    return tz_err_set(rc, "compute: %s", why);
  return tz_compute_create_from(find_backend(backend), p, out);
}

/* The backend of a device query: one compiled in, with devices. */
static int device_backend(const char *backend, const struct tz_compute_backend **out) {
  *out = find_backend(backend);
  if (!*out) {
    char why[256];
    int rc = tz_compute_probe(backend, why, sizeof why); /* says why there is none */
    return tz_err_set(rc, "compute: %s", why);
  }
  if (!(*out)->device_info || !(*out)->device_memory)
    return tz_err_set(TZ_ENOTSUP, "compute %s: the backend has no devices", (*out)->name);
  return 0;
}

int tz_compute_device_info(const char *backend, int device, struct tz_compute_device *out) {
  memset(out, 0, sizeof *out);
  out->index = device;
  out->numa_node = -1;
  const struct tz_compute_backend *b;
  TZ_CHECK(device_backend(backend, &b));
  return b->device_info(device < 0 ? -1 : device, out);
}

int tz_compute_device_memory(const char *backend, int device, uint64_t *free_bytes,
                             uint64_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  const struct tz_compute_backend *b;
  TZ_CHECK(device_backend(backend, &b));
  return b->device_memory(device, free_bytes, total_bytes);
}
