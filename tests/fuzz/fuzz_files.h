/* What the fuzz targets that read files share: a directory of their own for the files an input
 * becomes, and writing one. Any failure here is the harness's, not the code's under test: abort. */
#ifndef TZ_FUZZ_FILES_H
#define TZ_FUZZ_FILES_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* A new directory tz-fuzz-<tag>-XXXXXX under $TZ_TEST_TMPDIR, else /dev/shm (files in memory),
 * else /tmp, into root (its size n). */
static inline void fuzz_tmpdir(char *root, size_t n, const char *tag) {
  const char *base = getenv("TZ_TEST_TMPDIR");
  if (!base || !*base)
    base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
  if ((size_t)snprintf(root, n, "%s/tz-fuzz-%s-XXXXXX", base, tag) >= n || !mkdtemp(root))
    abort();
}

/* path made of head (nh bytes) then body (nb; NULL when 0), replacing what was there. */
static inline void fuzz_put2(const char *path, const void *head, size_t nh, const void *body,
                             size_t nb) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 || (nh && write(fd, head, nh) != (ssize_t)nh) ||
      (nb && write(fd, body, nb) != (ssize_t)nb) || close(fd) < 0)
    abort();
}

static inline void fuzz_put(const char *path, const void *data, size_t n) {
  fuzz_put2(path, data, n, NULL, 0);
}

#endif
