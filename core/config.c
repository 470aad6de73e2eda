/* Configuration: the layers (files, the environment, tz_config_set), the rules between keys, and
 * the lifetime of a tz_config. The table of keys that drives all of it is in config_keys.c. */
#define _GNU_SOURCE
#include "core/config_internal.h"
#include "core/faults.h"
#include "util/size.h"
#include "util/input.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* ------------------------------------------------------------------------------------------ */
/* Ignored keys */

static int add_ignored(struct tz_config *c, const char *path, const char *hint) {
  for (int i = 0; i < c->n_ignored_; i++)
    if (strcmp(c->ignored_[i].path, path) == 0)
      return 0;
  if (c->n_ignored_ == c->cap_ignored_) {
    int cap = c->cap_ignored_ ? 2 * c->cap_ignored_ : 8;
    struct tz_config_ignored_key *p = realloc(c->ignored_, (size_t)cap * sizeof *p);
    if (!p)
      return tz_err_set(TZ_ENOMEM, "config: out of memory");
    c->ignored_ = p;
    c->cap_ignored_ = cap;
  }
  struct tz_config_ignored_key *e = &c->ignored_[c->n_ignored_];
  e->path = strdup(path);
  e->hint = hint ? strdup(hint) : NULL;
  if (!e->path || (hint && !e->hint)) {
    free(e->path);
    free(e->hint);
    return tz_err_set(TZ_ENOMEM, "config: out of memory");
  }
  c->n_ignored_++;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Loading */

static char *join(const char *section, const char *name) {
  char *s = NULL;
  if (asprintf(&s, "%s%s%s", section, *section ? "." : "", name) < 0)
    return NULL;
  return s;
}

/* Walks one object. canon: its path in tz_config_keys[] terms; shown: as the file spells it. */
static int walk(struct tz_config *c, const char *origin, json_t *obj, const char *canon,
                const char *shown) {
  const char *name;
  json_t *j;
  json_object_foreach(obj, name, j) {
    const char *cname = name;
    if (!*canon)
      cname = tz_config_section_alias(name);
    char *cpath = join(canon, cname), *spath = join(shown, name);
    int rc = 0;
    if (!cpath || !spath) {
      rc = tz_err_set(TZ_ENOMEM, "config: out of memory");
      goto next;
    }
    struct where w = {.origin = origin, .name = spath, .json = j};
    const struct key *k = tz_config_find_key(cpath);
    if (json_is_null(j)) {
      /* null: not given */
    } else if (k) {
      struct val v;
      rc = tz_config_parse_json(&w, k, j, &v);
      if (rc == 0)
        tz_config_store(c, k, &v);
    } else if (tz_config_is_section(cpath)) {
      if (!json_is_object(j)) {
        char got[80];
        tz_config_render_got(&w, got, sizeof got);
        rc = tz_config_where_err(&w, "expected an object, got %s", got);
      } else {
        rc = walk(c, origin, j, cpath, spath);
      }
    } else {
      char hint[64];
      int have_hint =
          !tz_config_is_known_ignored(cpath) && tz_config_suggest(canon, cname, hint, sizeof hint);
      if (have_hint)
        TZ_WARN("%s: %s: unknown key, ignored (did you mean %s?)", origin, spath, hint);
      rc = add_ignored(c, spath, have_hint ? hint : NULL);
    }
  next:
    free(cpath);
    free(spath);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Rules between keys, checked after each layer. pre names the layer: the file, "environment",
 * or the key tz_config_set was given. */
static int finish(struct tz_config *c, const char *pre) {
  if (c->fp16.enabled && c->bf16.enabled)
    return tz_err_set(TZ_ECONFIG, "%s: fp16.enabled and bf16.enabled are both true: choose one",
                      pre);
  c->precision = c->bf16.enabled   ? TZ_PRECISION_BF16
                 : c->fp16.enabled ? TZ_PRECISION_FP16
                                   : TZ_PRECISION_FP32;
  /* DeepSpeed: AdamW is decoupled whatever adam_w_mode says. */
  if (c->optimizer.type == TZ_OPTIMIZER_ADAMW)
    c->optimizer.adam_w_mode = 1;
  /* DeepSpeed 0.19.3's WarmupLR, WarmupDecayLR and WarmupCosineLR raise on a warm-up that is not
   * a positive integer (earlier versions raised it to 2, as they still do 1). "auto" is no value
   * yet: tz-train fills it from --warmup-ratio or refuses it (trainer/run/run_options.c). */
  if (c->scheduler.type != TZ_LR_CONSTANT && c->scheduler.warmup_num_steps <= 0 &&
      !tz_config_is_auto(c, "scheduler.params.warmup_num_steps"))
    return tz_err_set(TZ_ECONFIG,
                      "%s: scheduler.params.warmup_num_steps %" PRId64
                      ": DeepSpeed's warm-up schedules refuse a warm-up that is not a positive "
                      "integer (and warm up over at least 2 steps: 1 is raised to 2); give 1 or "
                      "more, or no scheduler section for a constant rate",
                      pre, c->scheduler.warmup_num_steps);
  /* The nvme tier's requests are aio.block_size long and aligned to 4 KiB at least: refused here,
   * naming the key, not when the tier is built after the plan. */
  if (c->aio.block_size % 4096 != 0)
    return tz_err_set(TZ_ECONFIG,
                      "%s: aio.block_size %" PRId64
                      " must be a multiple of 4096 (the nvme tier's requests are that long and "
                      "aligned to 4 KiB; DeepSpeed's default is 1048576)",
                      pre, c->aio.block_size);
  /* A fault spec is refused when it is read, not when (and only if) a fault tier is built. */
  if (c->tierzero.faults) {
    struct tz_faults f;
    int rc = tz_faults_parse(c->tierzero.faults, &f);
    if (rc < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", tz_err_msg());
      return tz_err_set(rc == TZ_EINVAL ? TZ_ECONFIG : rc, "%s: %s", pre, why);
    }
  }
  /* The runtime cuts its staging buffers into chunks that every tier can transfer whole: a
   * chunk the nvme tier's direct I/O cannot take failed only at the runtime's creation, as
   * "staging: cannot allocate 256 bytes". */
  if (c->tierzero.chunk_bytes < 4096 || c->tierzero.chunk_bytes % 4096) {
    char got[32];
    tz_bytes_format(got, sizeof got, (double)c->tierzero.chunk_bytes, &tz_bytes_plan);
    return tz_err_set(TZ_ECONFIG,
                      "%s: tierzero.chunk_bytes %s: a chunk is a multiple of 4 KiB (the "
                      "direct-I/O alignment of the nvme tier), at least 4 KiB; the default is "
                      "4 MiB",
                      pre, got);
  }
  if (c->tierzero.nvme_stage_bytes % 4096) {
    char got[32];
    tz_bytes_format(got, sizeof got, (double)c->tierzero.nvme_stage_bytes, &tz_bytes_plan);
    return tz_err_set(TZ_ECONFIG,
                      "%s: tierzero.nvme_stage_bytes %s: a staging chunk is a multiple of 4 KiB "
                      "(the direct-I/O alignment of the nvme tier); the default is 32 MiB",
                      pre, got);
  }
  if (c->tierzero.chunk_bytes > c->tierzero.staging_bytes)
    return tz_err_set(TZ_ECONFIG,
                      "%s: tierzero.chunk_bytes %" PRIu64
                      " is larger than tierzero.staging_bytes %" PRIu64,
                      pre, c->tierzero.chunk_bytes, c->tierzero.staging_bytes);
  return 0;
}

/* Applies a parsed document to a copy of c and keeps it only if everything is valid. */
static int load_json(struct tz_config *c, json_t *root, const char *origin) {
  if (!json_is_object(root)) {
    char got[80];
    tz_config_render_json(root, got, sizeof got);
    return tz_err_set(TZ_ECONFIG, "%s: expected a JSON object at the top level, got %s", origin,
                      got);
  }
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  rc = walk(&tmp, origin, root, "", "");
  if (rc == 0)
    rc = finish(&tmp, origin);
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  if (tmp.scheduler.total_num_steps > 0 &&
      tmp.scheduler.total_num_steps < tmp.scheduler.warmup_num_steps)
    TZ_WARN("%s: scheduler.params.total_num_steps %" PRId64
            " is less than scheduler.params.warmup_num_steps %" PRId64,
            origin, tmp.scheduler.total_num_steps, tmp.scheduler.warmup_num_steps);
  tz_config_free(c);
  *c = tmp;
  return 0;
}

static int syntax_error(const char *origin, const json_error_t *e) {
  return tz_err_set(TZ_ECONFIG, "%s:%d:%d: JSON syntax error: %s", origin, e->line, e->column,
                    e->text);
}

/* DeepSpeed refuses duplicate keys too. */
#define JSON_FLAGS JSON_REJECT_DUPLICATES

int tz_config_load_string(struct tz_config *c, const char *json, const char *origin) {
  if (!origin)
    origin = "<string>";
  json_error_t e;
  json_t *root = json_loads(json, JSON_FLAGS, &e);
  if (!root)
    return syntax_error(origin, &e);
  int rc = load_json(c, root, origin);
  json_decref(root);
  return rc;
}

int tz_config_load_file(struct tz_config *c, const char *path) {
  FILE *f = tz_input_open(path); /* a FIFO is refused, never waited on */
  if (!f && errno == EINVAL)
    return tz_err_set(TZ_ECONFIG, "config: %s is %s", path, tz_input_why(EINVAL));
  if (!f)
    return tz_err_errno(errno, "config: cannot open %s", path);
  json_error_t e;
  json_t *root = json_loadf(f, JSON_FLAGS, &e);
  int read_error = ferror(f);
  fclose(f);
  if (!root) {
    if (read_error)
      return tz_err_set(TZ_EIO, "config: cannot read %s", path);
    return syntax_error(path, &e);
  }
  int rc = load_json(c, root, path);
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Environment and text */

/* Warns about TZ_* variables that look like a misspelt tierzero variable. */
static void warn_unknown_env(void) {
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "TZ_", 3) != 0)
      continue;
    char name[64];
    size_t n = strcspn(*e, "=");
    if (n >= sizeof name)
      continue;
    memcpy(name, *e, n);
    name[n] = '\0';
    int known = 0, best = INT_MAX, best_i = -1;
    for (int i = 0; i < tz_config_n_keys && !known; i++) {
      const char *en = tz_config_env_name(i);
      if (!en)
        continue;
      if (strcmp(en, name) == 0) {
        known = 1;
      } else {
        int d = tz_config_distance(name + 3, en + 3);
        if (d < best) {
          best = d;
          best_i = i;
        }
      }
    }
    if (!known && best <= 2 && (size_t)best < strlen(name + 3))
      TZ_WARN("environment: %s is not a tierzero variable (did you mean %s?)", name,
              tz_config_env_name(best_i));
  }
}

/* Key i's value from its environment variable into c: 1 when set, 0 when not (or empty), or a
 * negative code. The one place a tunable is read from the environment. */
static int env_key(struct tz_config *c, int i) {
  const char *name = tz_config_env_name(i);
  const char *s = name ? getenv(name) : NULL;
  if (!s || !*s)
    return 0;
  struct where w = {.name = name, .text = s};
  struct val v;
  int rc = tz_config_parse_text(&w, &tz_config_keys[i], s, &v);
  if (rc < 0)
    return rc;
  tz_config_store(c, &tz_config_keys[i], &v);
  return 1;
}

int tz_config_env_key(struct tz_config *c, const char *key) {
  const struct key *k = tz_config_find_key(key);
  int i = k ? (int)(k - tz_config_keys) : -1;
  if (i < 0 || !tz_config_env_name(i))
    return tz_err_set(TZ_ENOENT, "%s: not a key of the tierzero section", key);
  return env_key(c, i);
}

int tz_config_apply_env(struct tz_config *c) {
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  for (int i = 0; i < tz_config_n_keys && rc == 0; i++) {
    int got = env_key(&tmp, i);
    rc = got < 0 ? got : 0;
  }
  if (rc == 0)
    rc = finish(&tmp, "environment");
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  warn_unknown_env();
  tz_config_free(c);
  *c = tmp;
  return 0;
}

int tz_config_set(struct tz_config *c, const char *path, const char *value) {
  const struct key *k = tz_config_find_key(path);
  if (!k) {
    char hint[64], section[128];
    const char *dot = strrchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : 0;
    snprintf(section, sizeof section, "%.*s", (int)n, path);
    if (n < sizeof section && tz_config_suggest(section, dot ? dot + 1 : path, hint, sizeof hint))
      return tz_err_set(TZ_ENOENT, "%s: unknown key (did you mean %s?)", path, hint);
    return tz_err_set(TZ_ENOENT, "%s: unknown key", path);
  }
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  struct where w = {.name = path, .text = value};
  struct val v;
  rc = tz_config_parse_text(&w, k, value, &v);
  if (rc == 0) {
    tz_config_store(&tmp, k, &v);
    rc = finish(&tmp, path);
  }
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  tz_config_free(c);
  *c = tmp;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Lifetime */

void tz_config_defaults(struct tz_config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < tz_config_n_keys; i++)
    tz_config_set_default(c, &tz_config_keys[i]);
  c->precision = TZ_PRECISION_FP32;
}

void tz_config_free(struct tz_config *c) {
  if (!c)
    return;
  for (int i = 0; i < tz_config_n_keys; i++)
    tz_config_free_owned(c, &tz_config_keys[i]);
  for (int i = 0; i < c->n_ignored_; i++) {
    free(c->ignored_[i].path);
    free(c->ignored_[i].hint);
  }
  free(c->ignored_);
  c->ignored_ = NULL;
  c->n_ignored_ = c->cap_ignored_ = 0;
}

int tz_config_copy(struct tz_config *dst, const struct tz_config *src) {
  memcpy(dst, src, sizeof *dst);
  /* dst now aliases src's strings: detach them all before duplicating any. */
  for (int i = 0; i < tz_config_n_keys; i++)
    if (tz_config_keys[i].type == K_STR)
      *(char **)field(dst, &tz_config_keys[i]) = NULL;
    else if (tz_config_keys[i].type == K_PATHS)
      memset(field(dst, &tz_config_keys[i]), 0, sizeof(struct tz_config_paths));
  dst->ignored_ = NULL;
  dst->n_ignored_ = dst->cap_ignored_ = 0;
  for (int i = 0; i < tz_config_n_keys; i++) {
    const struct key *k = &tz_config_keys[i];
    if (k->type == K_STR) {
      const char *s = *(char *const *)cfield(src, k);
      if (s && !(*(char **)field(dst, k) = strdup(s)))
        goto oom;
    } else if (k->type == K_PATHS) {
      const struct tz_config_paths *sp = cfield(src, k);
      struct tz_config_paths *dp = field(dst, k);
      for (int j = 0; j < sp->n; j++) {
        if (!(dp->path[j] = strdup(sp->path[j])))
          goto oom;
        dp->n = j + 1;
      }
    }
  }
  for (int i = 0; i < src->n_ignored_; i++)
    if (add_ignored(dst, src->ignored_[i].path, src->ignored_[i].hint) < 0)
      goto oom;
  return 0;
oom:
  tz_config_free(dst);
  tz_config_defaults(dst);
  return tz_err_set(TZ_ENOMEM, "config: out of memory copying the configuration");
}

int tz_config_ignored_count(const struct tz_config *c) { return c->n_ignored_; }

const char *tz_config_ignored(const struct tz_config *c, int i) {
  return i >= 0 && i < c->n_ignored_ ? c->ignored_[i].path : NULL;
}

const char *tz_config_ignored_hint(const struct tz_config *c, int i) {
  return i >= 0 && i < c->n_ignored_ ? c->ignored_[i].hint : NULL;
}

int tz_config_key_count(void) { return tz_config_n_keys; }
const char *tz_config_key(int i) {
  return i >= 0 && i < tz_config_n_keys ? tz_config_keys[i].path : NULL;
}
const char *tz_config_key_env(int i) {
  return i >= 0 && i < tz_config_n_keys ? tz_config_env_name(i) : NULL;
}
