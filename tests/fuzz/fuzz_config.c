/* Fuzz target: the configuration loader (core/config.h).
 *
 * An input is a JSON text for tz_config_load_string, or "set:<path>=<value>" for tz_config_set
 * and tz_config_parse_size. Besides memory errors, it checks what config.h promises: a load that
 * fails leaves the struct as it was, and the dump of a loaded config reads back over the defaults
 * to the same dump. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/log.h"

static char *dump(const struct tz_config *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f || tz_config_dump(c, f) != 0)
    abort();
  fclose(f);
  return text;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  tz_log_set_level(TZ_LOG_ERROR); /* typo warnings would flood the output */
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';
  struct tz_config c;
  tz_config_defaults(&c);
  char *before = dump(&c);
  int rc;
  if (strncmp(s, "set:", 4) == 0) {
    char *eq = strchr(s + 4, '=');
    const char *path = s + 4, *value = eq ? eq + 1 : "";
    if (eq)
      *eq = '\0';
    uint64_t v;
    tz_config_parse_size(value, &v);
    rc = tz_config_set(&c, path, value);
  } else {
    rc = tz_config_load_string(&c, s, "fuzz");
  }
  char *after = dump(&c);
  if (rc != 0 && strcmp(before, after) != 0) {
    fprintf(stderr, "a failed load changed the config:\n%s\n---\n%s\n", before, after);
    abort();
  }
  if (rc == 0) {
    struct tz_config c2;
    tz_config_defaults(&c2);
    if (tz_config_load_string(&c2, after, "dump") != 0) {
      fprintf(stderr, "the dump does not load:\n%s\n", after);
      abort();
    }
    char *again = dump(&c2);
    if (strcmp(after, again) != 0) {
      fprintf(stderr, "the dump does not read back to itself:\n%s\n---\n%s\n", after, again);
      abort();
    }
    free(again);
    tz_config_free(&c2);
    for (int i = 0; i < tz_config_ignored_count(&c); i++)
      if (!tz_config_ignored(&c, i))
        abort();
    struct tz_config c3;
    if (tz_config_copy(&c3, &c) == 0) {
      tz_config_resolve_batch(&c3, 1 + (int)(size % 8));
      tz_config_free(&c3);
    }
  }
  free(before);
  free(after);
  tz_config_free(&c);
  free(s);
  return 0;
}
