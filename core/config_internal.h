/* The configuration's private parts, shared by its files: config_keys.c (the key table and the
 * lookups in it), config_parse.c (values and their messages), config.c (loading, environment,
 * lifetime), config_batch.c and config_dump.c. One table of keys drives parsing (JSON and text),
 * defaults, copying, freeing and dumping, so a new tunable is one line in the table plus its field
 * in struct tz_config. */
#ifndef TZ_CONFIG_INTERNAL_H
#define TZ_CONFIG_INTERNAL_H

#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

enum ktype {
  K_BOOL,   /* int 0/1 */
  K_INT,    /* int */
  K_I64,    /* int64_t; DeepSpeed's element counts (5e8 is accepted when integral) */
  K_SIZE,   /* uint64_t bytes: an integer, or a string with a unit ("64GiB") */
  K_DOUBLE, /* double */
  K_PAIR,   /* double[2] */
  K_ENUM,   /* int holding an enum value, chosen by name */
  K_STR,    /* owned char *, NULL = not set */
  K_PATHS,  /* struct tz_config_paths: one string or an array of them */
  K_FIXED,  /* no field: a DeepSpeed switch that tierzero supports in one position only */
};

enum {
  F_AUTO = 1 << 0,       /* "auto" accepted: the built-in default */
  F_MIN_OPEN = 1 << 1,   /* K_DOUBLE/K_PAIR: the value must be > dmin, not >= */
  F_MAX_OPEN = 1 << 2,   /* K_DOUBLE/K_PAIR: the value must be < dmax, not <= */
  F_ICASE = 1 << 3,      /* K_ENUM: names match case-insensitively (DeepSpeed's optimizer.type) */
  F_NO_FIELD = 1 << 4,   /* accepted and checked, stored nowhere: tierzero has no use for it */
  F_BACKEND = 1 << 5,    /* K_STR: a backend's setting (backend, setting below), its text stored
                            for the backend to parse (core/settings.h) */
  F_AUTO_UNSET = 1 << 6, /* "auto" stands for a value that is filled later (tz-train fills the
                            warm-up from --warmup-ratio): the dump writes "auto" while the key is
                            "auto" and at its default, so a checkpoint's config reads back so */
  F_EMPTY = 1 << 7,      /* K_STR: "" is a value (DeepSpeed's default of a monitor's output_path) */
};

struct key {
  const char *path; /* JSON path, sections joined by '.' */
  enum ktype type;
  size_t off;         /* offset of the field in struct tz_config */
  int64_t imin, imax; /* K_INT, K_I64, K_SIZE: accepted range, inclusive */
  double dmin, dmax;  /* K_DOUBLE, K_PAIR: accepted range (F_MIN_OPEN, F_MAX_OPEN) */
  unsigned flags;
  const char *const *names; /* K_ENUM: name of each value (NULL: a value with no name) */
  int n_names;
  double def[2]; /* default: number, 0/1, enum value; K_PAIR both; K_FIXED the required 0/1.
                  * Defaults may lie outside [min, max]: such a value means "not set". */
  const char *backend, *setting; /* F_BACKEND: whose setting, and its name there */
  const char *why;               /* K_FIXED: optional, why the other value is refused and what
                                    to use instead, added to the message */
};

/* The table (config_keys.c). Keys of one section are contiguous: tz_config_dump nests by walking
 * this order. */
extern const struct key tz_config_keys[];
extern const int tz_config_n_keys;

/* A parsed value, not yet stored. s and paths are owned until stored. */
struct val {
  int is_default; /* "auto": store the built-in default */
  int64_t i;
  double d[2];
  char *s;
  struct tz_config_paths paths;
};

/* A value being parsed and where it came from: "<file>: <json path>" or, for text, the variable
 * or path alone. */
struct where {
  const char *origin; /* file or string name; NULL for text values */
  const char *name;   /* JSON path, or environment variable */
  const json_t *json; /* the value, from a file */
  const char *text;   /* or the value, as text */
};

/* Field access */

static inline void *field(struct tz_config *c, const struct key *k) { return (char *)c + k->off; }
static inline const void *cfield(const struct tz_config *c, const struct key *k) {
  return (const char *)c + k->off;
}

static inline int get_int(const struct tz_config *c, const struct key *k) {
  int v;
  memcpy(&v, cfield(c, k), sizeof v);
  return v;
}

static inline void set_int(struct tz_config *c, const struct key *k, int v) {
  memcpy(field(c, k), &v, sizeof v);
}

static inline int check_irange(const struct key *k, int64_t i) {
  return i >= k->imin && i <= k->imax;
}

static inline int in_drange(const struct key *k, double d) {
  if (!isfinite(d))
    return 0;
  if (k->flags & F_MIN_OPEN ? !(d > k->dmin) : !(d >= k->dmin))
    return 0;
  if (k->flags & F_MAX_OPEN ? !(d < k->dmax) : !(d <= k->dmax))
    return 0;
  return 1;
}

/* config_keys.c */
void tz_config_free_owned(struct tz_config *c, const struct key *k);
/* The default of k; owned fields are freed (their default is "not set"). */
void tz_config_set_default(struct tz_config *c, const struct key *k);
/* A key given "auto": Hugging Face TrainingArguments' default where it is not tierzero's. */
void tz_config_set_auto(struct tz_config *c, const struct key *k);
void tz_config_val_free(struct val *v);
/* Moves v into c (v's strings now belong to c). */
void tz_config_store(struct tz_config *c, const struct key *k, struct val *v);
const struct key *tz_config_find_key(const char *path);
int tz_config_is_known_ignored(const char *path);
/* A section tierzero parses: some key lies under it. */
int tz_config_is_section(const char *path);
/* The section a top-level name stands for: itself, or what an older DeepSpeed spelling means. */
const char *tz_config_section_alias(const char *name);
/* Edit distance with adjacent transpositions, case-insensitive. */
int tz_config_distance(const char *a, const char *b);
/* The known key of section closest to name, or 0 if none is close. */
int tz_config_suggest(const char *section, const char *name, char *out, size_t len);
/* TZ_<KEY> for key i of the tierzero section, NULL for the others. */
const char *tz_config_env_name(int i);

/* config_parse.c */
int tz_config_where_err(const struct where *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A JSON value as it would be written, shortened for a message. */
void tz_config_render_json(const json_t *v, char *buf, size_t len);
void tz_config_fmt_num(double d, char *buf, size_t len);
/* The value as given, for "got ...": JSON as written, text quoted. */
void tz_config_render_got(const struct where *w, char *buf, size_t len);
/* A JSON value for k (not null). */
int tz_config_parse_json(const struct where *w, const struct key *k, json_t *j, struct val *v);
/* A value given as text (environment variable, command line) for k. */
int tz_config_parse_text(const struct where *w, const struct key *k, const char *s, struct val *v);

#endif
