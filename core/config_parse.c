/* Values: parsing JSON and text for a key, and the messages that say what was expected. */
#define _GNU_SOURCE
#include "core/config_internal.h"
#include "util/size.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------ */
/* Messages */

int tz_config_where_err(const struct where *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
int tz_config_where_err(const struct where *w, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (w->origin)
    return tz_err_set(TZ_ECONFIG, "%s: %s: %s", w->origin, w->name, what);
  return tz_err_set(TZ_ECONFIG, "%s: %s", w->name, what);
}

/* A JSON value as it would be written, shortened for a message. */
void tz_config_render_json(const json_t *v, char *buf, size_t len) {
  /* 15 digits: 0.9, not 0.90000000000000002 */
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
  if (!s) {
    snprintf(buf, len, "(unprintable)");
    return;
  }
  if (strlen(s) > 60)
    snprintf(buf, len, "%.57s...", s);
  else
    snprintf(buf, len, "%s", s);
  free(s);
}

/* Text quoted like a JSON string, shortened for a message. */
static void render_text(const char *text, char *buf, size_t len) {
  json_t *j = json_stringn_nocheck(text, strlen(text));
  if (!j) {
    snprintf(buf, len, "\"%.57s\"", text);
    return;
  }
  tz_config_render_json(j, buf, len);
  json_decref(j);
}

void tz_config_fmt_num(double d, char *buf, size_t len) {
  /* The shortest form that reads back as the same double. */
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, d);
    if (strtod(buf, NULL) == d)
      return;
  }
}

/* What k accepts, as the message's "expected ...". text: the value comes as text (env, set). */
static void describe(const struct key *k, int text, char *buf, size_t len) {
  char lo[32], hi[32];
  size_t n = 0;
  switch (k->type) {
  case K_BOOL:
    if (k->flags & F_AUTO)
      snprintf(buf, len, "%s",
               text ? "1, 0, true, false, yes, no, on, off or \"auto\""
                    : "true, false or \"auto\"");
    else
      snprintf(buf, len, "%s", text ? "1, 0, true, false, yes, no, on or off" : "true or false");
    return;
  case K_FIXED: n = (size_t)snprintf(buf, len, "%s", k->def[0] != 0 ? "true" : "false"); break;
  case K_INT:
  case K_I64: {
    int64_t natural = k->type == K_INT ? INT_MAX : INT64_MAX;
    if (k->imax >= natural && k->imin == 1)
      n = (size_t)snprintf(buf, len, "a positive integer");
    else if (k->imax >= natural && k->imin == 0)
      n = (size_t)snprintf(buf, len, "a non-negative integer");
    else if (k->imax >= natural)
      n = (size_t)snprintf(buf, len, "an integer >= %" PRId64, k->imin);
    else
      n = (size_t)snprintf(buf, len, "an integer in [%" PRId64 ", %" PRId64 "]", k->imin, k->imax);
    break;
  }
  case K_SIZE:
    n = (size_t)snprintf(buf, len, "%s",
                         k->imin > 0 ? "a non-zero size like 64MiB" : "a size like 64GiB");
    break;
  case K_DOUBLE:
  case K_PAIR:
    tz_config_fmt_num(k->dmin, lo, sizeof lo);
    tz_config_fmt_num(k->dmax, hi, sizeof hi);
    if (k->type == K_PAIR)
      n = (size_t)snprintf(buf, len, "%s", text ? "2 numbers \"a,b\"" : "an array of 2 numbers");
    else
      n = (size_t)snprintf(buf, len, "a number");
    if (isinf(k->dmax))
      n += (size_t)snprintf(buf + n, len - n, " %s %s", k->flags & F_MIN_OPEN ? ">" : ">=", lo);
    else
      n += (size_t)snprintf(buf + n, len - n, " in %c%s, %s%c", k->flags & F_MIN_OPEN ? '(' : '[',
                            lo, hi, k->flags & F_MAX_OPEN ? ')' : ']');
    break;
  case K_ENUM:
    n = (size_t)snprintf(buf, len, "one of");
    for (int i = 0, first = 1; i < k->n_names && n < len; i++) {
      if (!k->names[i])
        continue;
      n += (size_t)snprintf(buf + n, len - n, "%s %s", first ? "" : ",", k->names[i]);
      first = 0;
    }
    break;
  case K_STR:
    n = (size_t)snprintf(buf, len, "%s", k->flags & F_EMPTY ? "a string" : "a non-empty string");
    break;
  case K_PATHS:
    n = (size_t)snprintf(buf, len,
                         text ? "a ':'-separated list of 1 to %d directories"
                              : "a directory or an array of 1 to %d directories",
                         TZ_CONFIG_MAX_PATHS);
    break;
  }
  if ((k->flags & F_AUTO) && n < len)
    snprintf(buf + n, len - n, " or \"auto\"");
}

/* The value as given, for "got ...": JSON as written, text quoted. */
void tz_config_render_got(const struct where *w, char *buf, size_t len) {
  if (w->json)
    tz_config_render_json(w->json, buf, len);
  else
    render_text(w->text, buf, len);
}

static int bad_value(const struct where *w, const struct key *k) {
  char want[160], got[80];
  describe(k, w->json == NULL, want, sizeof want);
  tz_config_render_got(w, got, sizeof got);
  if (k->type == K_FIXED && k->why)
    return tz_config_where_err(w, "only %s is supported, got %s: %s", want, got, k->why);
  if (k->type == K_FIXED)
    return tz_config_where_err(w, "only %s is supported, got %s", want, got);
  return tz_config_where_err(w, "expected %s, got %s", want, got);
}

static int unknown_enum(const struct where *w, const struct key *k) {
  char want[160], got[80];
  describe(k, 0, want, sizeof want);
  tz_config_render_got(w, got, sizeof got);
  /* "one of A, B" reads "(expected one of A, B)" */
  return tz_config_where_err(w, "unknown value %s (expected %s)", got, want);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing values */

static int is_auto(const char *s) { return strcmp(s, "auto") == 0; }

/* An integral double that fits int64_t. */
static int real_to_i64(double d, int64_t *out) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != trunc(d))
    return -1;
  *out = (int64_t)d;
  return 0;
}

int tz_config_parse_size(const char *s, uint64_t *out) {
  return tz_size_parse(s, TZ_SIZE_UNITS, out);
}

static int find_name(const struct key *k, const char *s) {
  for (int i = 0; i < k->n_names; i++) {
    if (!k->names[i])
      continue;
    if (k->flags & F_ICASE ? strcasecmp(k->names[i], s) == 0 : strcmp(k->names[i], s) == 0)
      return i;
  }
  return -1;
}

static int dup_str(const char *s, size_t n, char **out) {
  *out = strndup(s, n);
  return *out ? 0 : tz_err_set(TZ_ENOMEM, "config: out of memory");
}

/* A JSON value for k (not null). One case per key type, kept in one switch so that it reads
 * beside tz_config_parse_text, its twin for text. */
int tz_config_parse_json(const struct where *w, const struct key *k, json_t *j, struct val *v) {
  memset(v, 0, sizeof *v);
  if (json_is_string(j) && (k->flags & F_AUTO) && is_auto(json_string_value(j))) {
    v->is_default = 1;
    return 0;
  }
  switch (k->type) {
  case K_BOOL:
  case K_FIXED:
    if (!json_is_boolean(j))
      return bad_value(w, k);
    v->i = json_is_true(j);
    if (k->type == K_FIXED && v->i != (int64_t)k->def[0])
      return bad_value(w, k);
    return 0;
  case K_INT:
  case K_I64:
  case K_SIZE:
    if (json_is_integer(j))
      v->i = json_integer_value(j);
    else if (json_is_real(j)) {
      if (real_to_i64(json_real_value(j), &v->i) < 0)
        return bad_value(w, k);
    } else if (k->type == K_SIZE && json_is_string(j)) {
      uint64_t u;
      if (tz_config_parse_size(json_string_value(j), &u) < 0)
        return bad_value(w, k);
      v->i = (int64_t)u;
    } else {
      return bad_value(w, k);
    }
    return check_irange(k, v->i) ? 0 : bad_value(w, k);
  case K_DOUBLE:
    if (!json_is_number(j) || !in_drange(k, json_number_value(j)))
      return bad_value(w, k);
    v->d[0] = json_number_value(j);
    return 0;
  case K_PAIR:
    if (!json_is_array(j) || json_array_size(j) != 2)
      return bad_value(w, k);
    for (int i = 0; i < 2; i++) {
      json_t *e = json_array_get(j, (size_t)i);
      if (!json_is_number(e) || !in_drange(k, json_number_value(e)))
        return bad_value(w, k);
      v->d[i] = json_number_value(e);
    }
    return 0;
  case K_ENUM: {
    if (!json_is_string(j))
      return bad_value(w, k);
    int i = find_name(k, json_string_value(j));
    if (i < 0)
      return unknown_enum(w, k);
    v->i = i;
    return 0;
  }
  case K_STR:
    if ((k->flags & F_BACKEND) && (json_is_boolean(j) || json_is_integer(j))) {
      /* a backend's setting as JSON writes a bool or a count ("gds": false): its text, which
       * the backend parses as it parses the same from --set or the variable */
      char t[32];
      if (json_is_boolean(j))
        snprintf(t, sizeof t, "%s", json_is_true(j) ? "true" : "false");
      else
        snprintf(t, sizeof t, "%lld", (long long)json_integer_value(j));
      return dup_str(t, strlen(t), &v->s);
    }
    if (!json_is_string(j) || (json_string_length(j) == 0 && !(k->flags & F_EMPTY)) ||
        strlen(json_string_value(j)) != json_string_length(j))
      return bad_value(w, k);
    return dup_str(json_string_value(j), json_string_length(j), &v->s);
  case K_PATHS: {
    /* One string is a list of one. */
    size_t n = json_is_array(j) ? json_array_size(j) : 1;
    if (n < 1 || n > TZ_CONFIG_MAX_PATHS)
      return bad_value(w, k);
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_is_array(j) ? json_array_get(j, i) : j;
      if (!json_is_string(e) || json_string_length(e) == 0 ||
          strlen(json_string_value(e)) != json_string_length(e)) {
        tz_config_val_free(v);
        return bad_value(w, k);
      }
      int rc = dup_str(json_string_value(e), json_string_length(e), &v->paths.path[i]);
      if (rc < 0) {
        tz_config_val_free(v);
        return rc;
      }
      v->paths.n = (int)i + 1;
    }
    return 0;
  }
  }
  return tz_err_set(TZ_EINVAL, "config: key %s has no parser", k->path);
}

static int parse_bool_text(const char *s, int64_t *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
      *out = strcasecmp(s, yes[i]) == 0;
      return 0;
    }
  }
  return -1;
}

static int parse_double_text(const char *s, double *out) {
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(d))
    return -1;
  *out = d;
  return 0;
}

/* Text for a string key must be UTF-8: the configuration is dumped as JSON (tz_config_dump),
 * which holds nothing else, and a string jansson refuses would be dumped as null. */
static int text_utf8(const struct where *w, const char *s, size_t n) {
  json_t *j = json_stringn(s, n);
  if (!j)
    return tz_config_where_err(w, "not valid UTF-8 text");
  json_decref(j);
  return 0;
}

/* A value given as text (environment variable, command line) for k. One case per key type, as in
 * tz_config_parse_json. */
int tz_config_parse_text(const struct where *w, const struct key *k, const char *s, struct val *v) {
  memset(v, 0, sizeof *v);
  if ((k->flags & F_AUTO) && is_auto(s)) {
    v->is_default = 1;
    return 0;
  }
  switch (k->type) {
  case K_BOOL:
  case K_FIXED:
    if (parse_bool_text(s, &v->i) < 0 || (k->type == K_FIXED && v->i != (int64_t)k->def[0]))
      return bad_value(w, k);
    return 0;
  case K_INT:
  case K_I64: {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || !check_irange(k, x))
      return bad_value(w, k);
    v->i = x;
    return 0;
  }
  case K_SIZE: {
    uint64_t u;
    if (tz_config_parse_size(s, &u) < 0 || !check_irange(k, (int64_t)u))
      return bad_value(w, k);
    v->i = (int64_t)u;
    return 0;
  }
  case K_DOUBLE:
    if (parse_double_text(s, &v->d[0]) < 0 || !in_drange(k, v->d[0]))
      return bad_value(w, k);
    return 0;
  case K_PAIR: {
    const char *comma = strchr(s, ',');
    char first[64];
    if (!comma || (size_t)(comma - s) >= sizeof first)
      return bad_value(w, k);
    memcpy(first, s, (size_t)(comma - s));
    first[comma - s] = '\0';
    if (parse_double_text(first, &v->d[0]) < 0 || parse_double_text(comma + 1, &v->d[1]) < 0 ||
        !in_drange(k, v->d[0]) || !in_drange(k, v->d[1]))
      return bad_value(w, k);
    return 0;
  }
  case K_ENUM: {
    int i = find_name(k, s);
    if (i < 0)
      return unknown_enum(w, k);
    v->i = i;
    return 0;
  }
  case K_STR:
    if (!*s && !(k->flags & F_EMPTY))
      return bad_value(w, k);
    if (text_utf8(w, s, strlen(s)) < 0)
      return TZ_ECONFIG;
    return dup_str(s, strlen(s), &v->s);
  case K_PATHS:
    for (const char *p = s;;) {
      const char *colon = strchr(p, ':');
      size_t n = colon ? (size_t)(colon - p) : strlen(p);
      if (n == 0 || v->paths.n == TZ_CONFIG_MAX_PATHS) {
        tz_config_val_free(v);
        return bad_value(w, k);
      }
      if (text_utf8(w, p, n) < 0) {
        tz_config_val_free(v);
        return TZ_ECONFIG;
      }
      int rc = dup_str(p, n, &v->paths.path[v->paths.n]);
      if (rc < 0) {
        tz_config_val_free(v);
        return rc;
      }
      v->paths.n++;
      if (!colon)
        return 0;
      p = colon + 1;
    }
  }
  return tz_err_set(TZ_EINVAL, "config: key %s has no parser", k->path);
}
