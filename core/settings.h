/* A backend's own settings: what a backend lets its user choose (kernel variants, test hooks),
 * handed to it as one string of "name=value" pairs that the backend parses against its own table.
 * No layer above a backend holds a field for one of them: the config stores the text a user wrote
 * (core/config.h, tz_config_backend_settings) and the backend says what it means, so a new
 * variant is one row in the backend's table and nothing else changes.
 *
 * What the string names is what the caller asked for and is kept: tz-train builds it from the
 * config, where the key's environment variable already won over the file, and a benchmark or a
 * test that names a variant gets that variant. A setting the string leaves out takes its
 * environment variable's value where one is set (a program without a config still honours it),
 * else its default. */
#ifndef TZ_CORE_SETTINGS_H
#define TZ_CORE_SETTINGS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tz_setting_kind {
  TZ_SETTING_ENUM, /* one of values[]; its index */
  TZ_SETTING_BOOL, /* 0/1, false/true, off/on, no/yes; 0 or 1 */
  TZ_SETTING_SIZE, /* bytes, as the config writes sizes ("64MiB", "4096"); the bytes */
};

struct tz_setting {
  const char *name; /* "attention": what the string says before '=' */
  enum tz_setting_kind kind;
  const char *const *values; /* TZ_SETTING_ENUM: its names, NULL-terminated */
  int64_t def;               /* the default (TZ_SETTING_ENUM: its index in values[]) */
  const char *env;           /* the environment variable that also sets it; NULL: none */
  const char *help;          /* one line: what it chooses */
};

/* Parses s ("name=value,name=value"; NULL or "" for none) against the n settings of t into
 * values[n]: s's value, else the setting's environment variable's where that is set and not
 * empty, else its default. who names the backend in messages ("compute cuda"). Errors: TZ_ECONFIG
 * naming the setting (or the variable), the value, and what it accepts; values[] is then
 * unspecified. */
int tz_settings_parse(const char *who, const struct tz_setting *t, int n, const char *s,
                      int64_t *values);

/* The index of setting `name` in t, or -1. */
int tz_settings_find(const struct tz_setting *t, int n, const char *name);

#ifdef __cplusplus
}
#endif

#endif
