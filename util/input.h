/* Opening a file a program reads its input from (a config, a model's config.json, a rates cache,
 * a sidecar, an index) without ever blocking: a FIFO, a device or a directory given where a file
 * is expected is refused at once, where fopen would wait forever for a FIFO's writer. */
#ifndef TZ_UTIL_INPUT_H
#define TZ_UTIL_INPUT_H

#include <jansson.h>
#include <stdio.h>

/* path opened for reading as a stdio stream, when it is a regular file; NULL otherwise, errno
 * set: the open's error, or EINVAL when it is not a regular file (EISDIR for a directory). */
FILE *tz_input_open(const char *path);

/* What tz_input_open's errno means, for a message: "is not a regular file (a FIFO, a device or a
 * socket)" for EINVAL, else strerror's text. */
const char *tz_input_why(int err);

/* json_load_file through tz_input_open: NULL, with e->text saying why (a FIFO: "not a regular
 * file ..."), for what is not a regular file as for a syntax error. */
json_t *tz_input_json(const char *path, size_t flags, json_error_t *e);

#endif
