/* Input files opened without blocking (util/input.h). */
#define _GNU_SOURCE
#include "util/input.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

FILE *tz_input_open(const char *path) {
  /* O_NONBLOCK: a FIFO opened for reading would wait for a writer; a regular file ignores it */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return NULL;
  struct stat st;
  int e = fstat(fd, &st) != 0   ? errno
          : S_ISREG(st.st_mode) ? 0
          : S_ISDIR(st.st_mode) ? EISDIR
                                : EINVAL;
  if (e) {
    close(fd);
    errno = e;
    return NULL;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0)
    (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  FILE *f = fdopen(fd, "r");
  if (!f) {
    e = errno;
    close(fd);
    errno = e;
  }
  return f;
}

const char *tz_input_why(int err) {
  return err == EINVAL ? "not a regular file (a FIFO, a device or a socket)" : strerror(err);
}

json_t *tz_input_json(const char *path, size_t flags, json_error_t *e) {
  FILE *f = tz_input_open(path);
  if (!f) {
    if (e) {
      memset(e, 0, sizeof *e);
      snprintf(e->text, sizeof e->text, "%s", tz_input_why(errno));
      snprintf(e->source, sizeof e->source, "%s", path);
    }
    return NULL;
  }
  json_t *root = json_loadf(f, flags, e);
  fclose(f);
  return root;
}
