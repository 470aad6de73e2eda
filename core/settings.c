/* A backend's own settings (core/settings.h): the one parser of their strings and the one reader
 * of their environment variables. */
#include "core/settings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "util/size.h"

int tz_settings_find(const struct tz_setting *t, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(t[i].name, name) == 0)
      return i;
  return -1;
}

/* What setting t accepts, for messages: "one of auto, simple", "a boolean", "a size". */
static void accepts(const struct tz_setting *t, char *buf, size_t len) {
  size_t at = 0;
  if (t->kind == TZ_SETTING_BOOL) {
    snprintf(buf, len, "0 or 1 (false/true, off/on, no/yes)");
    return;
  }
  if (t->kind == TZ_SETTING_SIZE) {
    snprintf(buf, len, "a size in bytes (\"4096\", \"64MiB\")");
    return;
  }
  at += (size_t)snprintf(buf, len, "one of");
  for (int i = 0; t->values[i] && at < len; i++)
    at += (size_t)snprintf(buf + at, len - at, "%s %s", i ? "," : "", t->values[i]);
}

/* The value text v (length n) of setting t; where names it in the message (the setting, or the
 * variable it came from). */
static int parse_value(const char *who, const char *where, const struct tz_setting *t,
                       const char *v, size_t n, int64_t *out) {
  char text[256];
  if (n >= sizeof text)
    n = sizeof text - 1;
  memcpy(text, v, n);
  text[n] = '\0';
  switch (t->kind) {
  case TZ_SETTING_ENUM:
    for (int i = 0; t->values[i]; i++)
      if (strcmp(text, t->values[i]) == 0) {
        *out = i;
        return 0;
      }
    break;
  case TZ_SETTING_BOOL: {
    static const char *const on[] = {"1", "true", "on", "yes"}, *const off[] = {"0", "false", "off",
                                                                                "no"};
    for (int i = 0; i < 4; i++) {
      if (strcasecmp(text, on[i]) == 0 || strcasecmp(text, off[i]) == 0) {
        *out = strcasecmp(text, on[i]) == 0;
        return 0;
      }
    }
    break;
  }
  case TZ_SETTING_SIZE: {
    uint64_t b;
    if (tz_size_parse(text, TZ_SIZE_UNITS, &b) == 0) {
      *out = (int64_t)b;
      return 0;
    }
    break;
  }
  }
  char acc[256];
  accepts(t, acc, sizeof acc);
  return tz_err_set(TZ_ECONFIG, "%s: %s \"%s\" is not %s", who, where, text, acc);
}

int tz_settings_parse(const char *who, const struct tz_setting *t, int n, const char *s,
                      int64_t *values) {
  uint64_t given = 0; /* bit i: s gives setting i */
  if (n > 64)
    return tz_err_set(TZ_EINVAL, "%s: %d settings, more than 64", who, n);
  for (int i = 0; i < n; i++)
    values[i] = t[i].def;
  for (const char *p = s; p && *p;) {
    size_t len = strcspn(p, ",");
    const char *eq = memchr(p, '=', len);
    char name[64];
    size_t nlen = eq ? (size_t)(eq - p) : len;
    snprintf(name, sizeof name, "%.*s", (int)(nlen < sizeof name ? nlen : sizeof name - 1), p);
    int i = tz_settings_find(t, n, name);
    if (i < 0 || !eq) {
      char list[512];
      size_t at = 0;
      list[0] = '\0';
      for (int j = 0; j < n && at < sizeof list; j++)
        at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", j ? ", " : "", t[j].name);
      if (i < 0)
        return tz_err_set(TZ_ECONFIG, "%s: no setting \"%s\" (it has: %s)", who, name,
                          n ? list : "none");
      return tz_err_set(TZ_ECONFIG, "%s: setting \"%s\" has no value (want %s=VALUE)", who, name,
                        name);
    }
    int rc = parse_value(who, t[i].name, &t[i], eq + 1, len - nlen - 1, &values[i]);
    if (rc < 0)
      return rc;
    given |= 1ull << i;
    p += len;
    if (*p == ',')
      p++;
  }
  for (int i = 0; i < n; i++) {
    const char *e = t[i].env && !(given >> i & 1) ? getenv(t[i].env) : NULL;
    if (e && *e) {
      int rc = parse_value(who, t[i].env, &t[i], e, strlen(e), &values[i]);
      if (rc < 0)
        return rc;
    }
  }
  return 0;
}
