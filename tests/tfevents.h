/* A reader of TensorBoard event files for the tests, written independently of the writers
 * (trainer/run/monitor.c, tools/tz-tensorboard): TFRecord framing with both masked CRC32Cs checked,
 * and the Event protocol buffer's fields the writers use (wall_time, step, file_version,
 * summary.value's tag and simple_value). A field or framing it does not expect fails the test. */
#ifndef TZ_TESTS_TFEVENTS_H
#define TZ_TESTS_TFEVENTS_H

#include <stdint.h>

#define TFEV_MAX_VALUES 32
#define TFEV_MAX_TAG 96

struct tfev {
  double wall;
  int has_step;
  int64_t step;
  char version[32];
  int n; /* values, each with a tag and a value (a Value lacking either fails) */
  char tag[TFEV_MAX_VALUES][TFEV_MAX_TAG + 1];
  float value[TFEV_MAX_VALUES];
};

/* Every record of path into ev[0..max), its CRCs checked and the file ending at a record's end;
 * the count. */
int tfev_read(const char *path, struct tfev *ev, int max);
/* The value of tag in e (fails the test when e has none), and whether it has one. */
float tfev_scalar(const struct tfev *e, const char *tag);
int tfev_has(const struct tfev *e, const char *tag);

#endif
