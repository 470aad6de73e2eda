/* The effective configuration written as JSON, for metrics and checkpoints. */
#define _GNU_SOURCE
#include "core/config_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void dump_string(FILE *f, const char *s) {
  json_t *j = json_string(s);
  char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
  fputs(t ? t : "null", f);
  free(t);
  json_decref(j);
}

static void dump_value(FILE *f, const struct tz_config *c, const struct key *k) {
  char num[40];
  switch (k->type) {
  case K_BOOL: /* below 0: "auto", a default outside 0/1 (F_AUTO) */
    fputs(get_int(c, k) < 0 ? "\"auto\"" : get_int(c, k) ? "true" : "false", f);
    return;
  case K_ENUM: {
    int v = get_int(c, k);
    if (v >= 0 && v < k->n_names && k->names[v])
      fprintf(f, "\"%s\"", k->names[v]);
    else
      fputs("null", f);
    return;
  }
  case K_INT:
  case K_I64:
  case K_SIZE: {
    int64_t v = k->type == K_INT   ? get_int(c, k)
                : k->type == K_I64 ? *(const int64_t *)cfield(c, k)
                                   : (int64_t) * (const uint64_t *)cfield(c, k);
    /* Out of range is the "not set" default. */
    if (check_irange(k, v))
      fprintf(f, "%" PRId64, v);
    else
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
    return;
  }
  case K_DOUBLE: {
    double d = *(const double *)cfield(c, k);
    if (!in_drange(k, d)) {
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
      return;
    }
    tz_config_fmt_num(d, num, sizeof num);
    fputs(num, f);
    return;
  }
  case K_PAIR: {
    const double *d = cfield(c, k);
    tz_config_fmt_num(d[0], num, sizeof num);
    fprintf(f, "[%s, ", num);
    tz_config_fmt_num(d[1], num, sizeof num);
    fprintf(f, "%s]", num);
    return;
  }
  case K_STR: {
    const char *s = *(char *const *)cfield(c, k);
    if (s)
      dump_string(f, s);
    else
      fputs("null", f);
    return;
  }
  case K_PATHS: {
    const struct tz_config_paths *p = cfield(c, k);
    if (p->n == 0) {
      fputs("null", f);
      return;
    }
    fputc('[', f);
    for (int i = 0; i < p->n; i++) {
      if (i)
        fputs(", ", f);
      dump_string(f, p->path[i]);
    }
    fputc(']', f);
    return;
  }
  case K_FIXED: return;
  }
}

/* Splits a path into at most max components of at most 63 characters; returns the count. */
static int split_path(const char *path, char comp[][64], int max) {
  int n = 0;
  for (const char *p = path; *p && n < max; n++) {
    size_t len = strcspn(p, ".");
    snprintf(comp[n], 64, "%.*s", (int)len, p);
    p += len;
    if (*p == '.')
      p++;
  }
  return n;
}

int tz_config_dump(const struct tz_config *c, FILE *f) {
  enum { MAXD = 6 };
  char open[MAXD][64]; /* the sections open now, outermost first */
  int depth = 0;
  fputc('{', f);
  int first = 1;
  for (int i = 0; i < tz_config_n_keys; i++) {
    const struct key *k = &tz_config_keys[i];
    if (k->type == K_FIXED || (k->flags & F_NO_FIELD))
      continue;
    char comp[MAXD + 1][64];
    int n = split_path(k->path, comp, MAXD + 1);
    int common = 0;
    while (common < depth && common < n - 1 && strcmp(open[common], comp[common]) == 0)
      common++;
    for (; depth > common; depth--)
      fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
    for (; depth < n - 1; depth++) {
      fprintf(f, "%s\n%*s\"%s\": {", first ? "" : ",", 2 * depth + 2, "", comp[depth]);
      snprintf(open[depth], sizeof open[depth], "%s", comp[depth]);
      first = 1;
    }
    fprintf(f, "%s\n%*s\"%s\": ", first ? "" : ",", 2 * depth + 2, "", comp[n - 1]);
    dump_value(f, c, k);
    first = 0;
  }
  for (; depth > 0; depth--)
    fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
  fputs("\n}\n", f);
  if (ferror(f))
    return tz_err_errno(errno ? errno : EIO, "config: cannot write the configuration");
  return 0;
}
