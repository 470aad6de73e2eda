/* Fuzz target: the safetensors reader (trainer/model/safetensors.h). The input is the whole file,
 * put in a memory file and opened by its /proc/self/fd path; every F32, BF16 and F16 tensor of a
 * file that opens is read, and every other tensor must be refused as unsupported. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/error.h"
#include "trainer/model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
  if (fd < 0)
    abort();
  if (size && write(fd, data, size) != (ssize_t)size)
    abort();
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  tz_st_file *f = NULL;
  if (tz_st_open(path, &f) == 0) {
    tz_st_metadata(f, "format");
    for (int i = 0; i < tz_st_count(f); i++) {
      const struct tz_st_tensor *t = tz_st_get(f, i);
      if (!t || tz_st_find(f, t->name) == NULL)
        abort();
      int readable =
          !strcmp(t->dtype, "F32") || !strcmp(t->dtype, "BF16") || !strcmp(t->dtype, "F16");
      /* open checked end - begin = numel * element size against the file, so this is bounded by
       * the input's size. */
      float *out = malloc(sizeof(float) * (t->numel ? t->numel : 1));
      if (!out)
        abort();
      int rc = tz_st_read_f32(f, t->name, t->ndim, t->shape, out);
      if (readable ? rc != 0 : rc != TZ_ENOTSUP) {
        fprintf(stderr, "tensor %s (%s): %s\n", t->name, t->dtype, tz_err_msg());
        abort();
      }
      free(out);
    }
    if (tz_st_get(f, tz_st_count(f)) != NULL)
      abort();
  }
  tz_st_close(f);
  close(fd);
  return 0;
}
