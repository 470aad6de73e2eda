/* Runs a fuzz target over files and directories of files without libFuzzer: the smoke test that
 * CI runs with any compiler, and the way to replay a crash input under a debugger. Every input is
 * run once, in name order; the target's own checks abort on a failure. No input at all is an
 * error, so that a corpus that went missing is noticed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: cannot open %s\n", path);
    return -1;
  }
  size_t cap = 1 << 16, n = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
    n += got;
    if (n == cap) {
      uint8_t *b = realloc(buf, cap *= 2);
      if (!b) {
        free(buf);
        buf = NULL;
      }
      buf = b;
    }
  }
  int err = ferror(f) || !buf;
  fclose(f);
  if (err) {
    free(buf);
    fprintf(stderr, "replay: cannot read %s\n", path);
    return -1;
  }
  /* A copy of exactly n bytes, so that a read past the end is caught by a sanitizer. */
  uint8_t *exact = malloc(n ? n : 1);
  memcpy(exact, buf, n);
  free(buf);
  LLVMFuzzerTestOneInput(exact, n);
  free(exact);
  return 1;
}

int main(int argc, char **argv) {
  if (LLVMFuzzerInitialize)
    LLVMFuzzerInitialize(&argc, &argv);
  long inputs = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) < 0) {
      fprintf(stderr, "replay: %s does not exist\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
      if (run_file(argv[i]) < 0)
        return 1;
      inputs++;
      continue;
    }
    struct dirent **names;
    int n = scandir(argv[i], &names, NULL, alphasort);
    if (n < 0) {
      fprintf(stderr, "replay: cannot list %s\n", argv[i]);
      return 1;
    }
    for (int j = 0; j < n; j++) {
      char *path = NULL;
      if (names[j]->d_name[0] != '.' && asprintf(&path, "%s/%s", argv[i], names[j]->d_name) > 0) {
        struct stat fs;
        if (stat(path, &fs) == 0 && S_ISREG(fs.st_mode)) {
          if (run_file(path) < 0)
            return 1;
          inputs++;
        }
      }
      free(path);
      free(names[j]);
    }
    free(names);
  }
  printf("replay: %ld inputs, no failure\n", inputs);
  return inputs > 0 ? 0 : 1;
}
