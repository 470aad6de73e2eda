/* The grammar of tierzero.faults (or TZ_FAULTS), the fault-injection spec of the tests: parsed
 * here once, so that the config refuses a bad spec when it is read (a run that builds no fault
 * tier included) and the tiers that act on it (tiers/fault.c, tiers/nvme.c) read the same thing.
 * A comma-separated list of items:
 *   KIND@N      the Nth operation (reads and writes counted together, from 1)
 *   KIND%P      each operation with probability P percent, P in (0, 100] (seeded: seed=S)
 *   delay=US    every operation starts US microseconds late, 0 to TZ_FAULTS_MAX_DELAY_US
 *   seed=S      the seed of the KIND%P draws (a whole number; default 1)
 *   nvme-short@N, nvme-eagain@N   the nvme tier's own: its Nth ring request asks for half its
 *               length, or is answered -EAGAIN without being submitted (N from 1)
 * KIND is eio, eio-read, eio-write, enospc, short or flip (tiers/fault.c says what each does). */
#ifndef TZ_CORE_FAULTS_H
#define TZ_CORE_FAULTS_H

#include <stdint.h>

enum tz_fault_kind {
  TZ_FAULT_EIO,
  TZ_FAULT_EIO_READ,
  TZ_FAULT_EIO_WRITE,
  TZ_FAULT_ENOSPC,
  TZ_FAULT_SHORT,
  TZ_FAULT_FLIP,
  TZ_FAULT_KINDS
};

/* The longest delay=US: longer would look like a hang (a run's every operation waits it). */
#define TZ_FAULTS_MAX_DELAY_US 10000000ull
#define TZ_FAULTS_MAX_RULES 32
#define TZ_FAULTS_MAX_NVME 16 /* of each nvme item */

struct tz_fault_rule {
  enum tz_fault_kind kind;
  uint64_t at; /* fires at this operation, or 0 */
  double pct;  /* or with this probability, percent */
};

struct tz_faults {
  struct tz_fault_rule rules[TZ_FAULTS_MAX_RULES];
  int n_rules;
  unsigned delay_us;
  uint64_t seed;
  uint64_t short_at[TZ_FAULTS_MAX_NVME], eagain_at[TZ_FAULTS_MAX_NVME];
  int n_short, n_eagain;
};

/* "eio", ... "flip"; "?" outside the enum. */
const char *tz_fault_kind_name(enum tz_fault_kind k);
/* spec (NULL or "" is no fault) -> *out. TZ_EINVAL naming the key, the item and what would work;
 * TZ_ENOMEM. */
int tz_faults_parse(const char *spec, struct tz_faults *out);

#endif
