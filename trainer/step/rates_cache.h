/* The rates cache's entries (trainer/step/rates_cache.c), for the probes' file
 * (trainer/step/rates.c): the set-up's key, an entry read and written whole, and the fields an
 * entry holds, in order. */
#ifndef TZ_TRAINER_RATES_CACHE_H
#define TZ_TRAINER_RATES_CACHE_H

#include "trainer/step/rates.h"

#include <stddef.h>

#define TZ_RATES_N_FIELDS 17

/* The set-up's key in the cache: the backend and the real path of c's NVMe directory, or "-". */
void tz_rates_cache_key(const struct tz_config *c, const char *backend, char *buf, size_t len);
/* Field i of r (0 <= i < TZ_RATES_N_FIELDS), in the cache's order. */
double *tz_rates_field(struct tz_plan_rates *r, int i);
/* 1 and *out the entry's rates when path holds a complete entry of this version for key, else 0
 * and *out as it was. */
int tz_rates_cache_read(const char *path, const char *key, struct tz_plan_rates *out);
/* Writes r as key's entry in path (the others kept), durably; the error when it cannot. */
int tz_rates_cache_write(const char *path, const char *key, const struct tz_plan_rates *r);

/* A layer's timed forward and backward (tz_rates_layer_time: the pass, the attention and MLP
 * parts' forwards and the attention's without its op, seconds), under its own key in the same file
 * ("layer|..." naming the shape, batch, backend and settings): the probe takes about a second on a
 * tiny layer and minutes on a large one on CPUs, and gives the same figure on the same machine.
 * read: 1 and s[] when path has a complete entry of this version for key, else 0. write: the error
 * when it cannot. */
#define TZ_RATES_LAYER_FIELDS 4
int tz_rates_layer_read(const char *path, const char *key, double s[TZ_RATES_LAYER_FIELDS]);
int tz_rates_layer_write(const char *path, const char *key, const double s[TZ_RATES_LAYER_FIELDS]);

#endif
