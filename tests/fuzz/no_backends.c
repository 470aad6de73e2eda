/* The compute registry of the libFuzzer build (TZ_FUZZ, tests/fuzz/CMakeLists.txt): no backend.
 * The model's config code (trainer/model/model_config.c) asks the registry which backends compute
 * a variant or the experts; the fuzz targets never create a backend, and linking the real
 * registry would build every backend with coverage. Each answers as for an unknown name. */
#include "core/error.h"
#include "kernels/compute.h"

int tz_compute_variants(const char *backend, const char *settings) {
  (void)settings;
  return tz_err_set(TZ_ENOENT, "compute: no backend '%s' in the fuzz build", backend);
}

int tz_compute_moe(const char *backend) {
  return tz_err_set(TZ_ENOENT, "compute: no backend '%s' in the fuzz build", backend);
}
