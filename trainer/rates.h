/* The machine rates the plan's bound is costed with (core/plan.h), measured once with small
 * transfers through the tiers and short compute and Adam probes, and cached in a file so later
 * runs start at once. */
#ifndef TZ_TRAINER_RATES_H
#define TZ_TRAINER_RATES_H

#include <stddef.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "core/plan.h"
#include "core/runtime.h"

/* The default cache file: $XDG_CACHE_HOME/tierzero/rates-<host>.json, else
 * ~/.cache/tierzero/rates-<host>.json. 0, or TZ_ENOENT when neither variable is set. */
int tz_rates_default_path(char *buf, size_t len);

/* Fills *out (collective). Rank 0 reads the cache at path (NULL: the default) when it holds an
 * entry measured for this machine's set-up (the compute backend and the NVMe directory of cfg),
 * else measures: copies between two host tiers in rt (the compute tier is host memory on a
 * CPU-only machine), reads and writes of an nvme tier under cfg's NVMe directory when there is
 * one, the backend's matrix multiply, CPU Adam; and writes the cache (a failure to write it is
 * only logged). The result is broadcast; then every rank times an all-gather for the collective
 * rate (0 on a world of one). refresh != 0 measures even when the cache has an entry. */
int tz_rates_get(const struct tz_config *cfg, const char *backend, tz_runtime *rt, tz_comm *comm,
                 const char *path, int refresh, struct tz_plan_rates *out);

#endif
