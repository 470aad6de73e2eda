/* config.json's reading helpers that the config reader (hf_config.c) and its rope keys (hf_rope.c)
 * share: a key's value, its text for messages, a number key checked (hf_internal.h). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "trainer/model/hf_internal.h"

/* v as JSON text, for messages (at most 80 characters kept). */
const char *tz_hf_jtext(json_t *v, char *buf, size_t len) {
  char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  snprintf(buf, len, "%.80s%s", s ? s : "(absent)", s && strlen(s) > 80 ? "..." : "");
  free(s);
  return buf;
}

json_t *tz_hf_jget(const struct tz_hf_cfgp *p, const char *key) {
  json_t *v = json_object_get(p->root, key);
  return json_is_null(v) ? NULL : v;
}

/* A finite number key of object obj (named in messages as where.key). */
int tz_hf_num_of(const struct tz_hf_cfgp *p, json_t *obj, const char *where, const char *key,
                 int required, double dflt, double *out) {
  json_t *v = json_object_get(obj, key);
  char t[100];
  if (!v || json_is_null(v)) {
    if (required)
      return tz_err_set(TZ_ECONFIG, "%s: missing \"%s%s%s\"", p->path, where, *where ? "." : "",
                        key);
    *out = dflt;
    return 0;
  }
  if (!json_is_number(v) || !isfinite(json_number_value(v)))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s%s%s\" must be a number, not %s", p->path, where,
                      *where ? "." : "", key, tz_hf_jtext(v, t, sizeof t));
  *out = json_number_value(v);
  return 0;
}
