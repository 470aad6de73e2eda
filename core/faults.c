/* tierzero.faults parsed (core/faults.h). */
#include "core/faults.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

static const char *const kind_names[TZ_FAULT_KINDS] = {"eio",    "eio-read", "eio-write",
                                                       "enospc", "short",    "flip"};

const char *tz_fault_kind_name(enum tz_fault_kind k) {
  return (unsigned)k < TZ_FAULT_KINDS ? kind_names[k] : "?";
}

/* A whole number, all of s, into *v; 0 or -1. */
static int whole(const char *s, unsigned long long *v) {
  char *end = NULL;
  errno = 0;
  if (!(*s >= '0' && *s <= '9'))
    return -1;
  *v = strtoull(s, &end, 10);
  return errno || *end ? -1 : 0;
}

/* The refusal of item: the key it came from, the item, what would work. */
static int bad_item(const char *item, const char *why) {
  return tz_err_set(TZ_EINVAL, "tierzero.faults (or TZ_FAULTS): bad fault item \"%s\": %s", item,
                    why);
}

static int parse_nvme(struct tz_faults *f, const char *item) {
  int is_short = strncmp(item, "nvme-short@", 11) == 0;
  int is_eagain = strncmp(item, "nvme-eagain@", 12) == 0;
  unsigned long long at = 0;
  int *count = is_short ? &f->n_short : &f->n_eagain;
  if (!(is_short || is_eagain) || whole(item + (is_short ? 11 : 12), &at) < 0 || at == 0 ||
      *count == TZ_FAULTS_MAX_NVME)
    return bad_item(item, "expected nvme-short@N or nvme-eagain@N with N from 1 to 2^64-1, at "
                          "most 16 of each");
  (is_short ? f->short_at : f->eagain_at)[(*count)++] = at;
  return 0;
}

static int parse_item(struct tz_faults *f, const char *item) {
  unsigned long long u;
  if (strncmp(item, "nvme-", 5) == 0)
    return parse_nvme(f, item);
  if (strncmp(item, "delay=", 6) == 0) {
    if (whole(item + 6, &u) < 0 || u > TZ_FAULTS_MAX_DELAY_US)
      return bad_item(item, "delay is in microseconds, 0 to 10000000 (10 s) per operation");
    f->delay_us = (unsigned)u;
    return 0;
  }
  if (strncmp(item, "seed=", 5) == 0) {
    if (whole(item + 5, &u) < 0)
      return bad_item(item, "seed=S takes a whole number");
    f->seed = u;
    return 0;
  }
  const char *sep = strpbrk(item, "@%");
  int kind = -1;
  for (int k = 0; sep && k < TZ_FAULT_KINDS; k++)
    if ((size_t)(sep - item) == strlen(kind_names[k]) &&
        strncmp(item, kind_names[k], (size_t)(sep - item)) == 0)
      kind = k;
  if (kind < 0)
    return bad_item(item, "expected KIND@N or KIND%P with KIND one of eio, eio-read, eio-write, "
                          "enospc, short, flip; or delay=US, seed=S, nvme-short@N, nvme-eagain@N");
  if (f->n_rules == TZ_FAULTS_MAX_RULES)
    return bad_item(item, "at most 32 KIND@N and KIND%P items");
  struct tz_fault_rule *r = &f->rules[f->n_rules];
  if (*sep == '@') {
    if (whole(sep + 1, &u) < 0 || u == 0)
      return bad_item(item, "KIND@N takes an operation number, a whole number from 1");
    r->at = u;
  } else {
    char *end = NULL;
    double v = strtod(sep + 1, &end);
    if (end == sep + 1 || *end || !(v > 0 && v <= 100))
      return bad_item(item, "KIND%P takes a percentage above 0 and at most 100");
    r->pct = v;
  }
  r->kind = (enum tz_fault_kind)kind;
  f->n_rules++;
  return 0;
}

int tz_faults_parse(const char *spec, struct tz_faults *out) {
  memset(out, 0, sizeof *out);
  out->seed = 1;
  if (!spec || !*spec)
    return 0;
  char *copy = strdup(spec), *save = NULL;
  if (!copy)
    return tz_err_set(TZ_ENOMEM, "tierzero.faults: no memory");
  int rc = 0;
  for (char *item = strtok_r(copy, ",", &save); item && rc == 0;
       item = strtok_r(NULL, ",", &save)) {
    while (*item == ' ')
      item++;
    rc = parse_item(out, item);
  }
  free(copy);
  return rc;
}
