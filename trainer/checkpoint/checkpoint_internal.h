/* The checkpoint layer's private parts, shared by its files (checkpoint.h is the API; the format
 * is in checkpoint_format.h; docs/checkpoints.md): checkpoint_io.c (the save path's file-system
 * calls, paths), checkpoint_write.c (the writer), checkpoint_read.c (manifest and reader) and
 * checkpoint_dir.c (the root directory: list, check, finalize, prune). */
#ifndef TZ_TRAINER_CHECKPOINT_INTERNAL_H
#define TZ_TRAINER_CHECKPOINT_INTERNAL_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/checkpoint_format.h"
#include "util/crc32c.h"
#include "util/file.h"

/* Bytes buffered by the writer, and read per piece by the reader. */
#define IO_BYTES (1u << 20)
/* Bounds on what the reader loads into memory from a file it has not verified yet. */
#define MAX_MANIFEST_BYTES (64u << 20)
#define MAX_INDEX_BYTES (256u << 20)
#define MAX_WORLD (1 << 20)
#define STEP_FMT "step-%08" PRIu64

/* A section name as the writer accepts it and the reader expects it. */
static inline int tz_ckpt_name_ok(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > TZ_CKPT_MAX_NAME)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (name[i] < 0x21 || name[i] > 0x7e)
      return 0;
  return 1;
}

/* checkpoint_io.c. The save path's calls are util/file.h's (0 or a positive errno), with the
 * save's hooks as *out serves them: NULL when h is NULL. out must live as long as the result. */
const struct tz_file_hooks *tz_ckpt_file_hooks(const struct tz_ckpt_hooks *h,
                                               struct tz_file_hooks *out);
/* Removes path and, for a directory, everything under it (symbolic links are removed, never
 * followed). 0 if it does not exist. */
int tz_ckpt_io_rm_tree(const struct tz_file_hooks *h, const char *path);
/* Writes path with text: created, written, fsynced, closed. 0 or a negative code with the
 * message set. */
int tz_ckpt_io_write_file(const struct tz_file_hooks *h, const char *path, const char *text,
                          size_t len);
/* Reading: 0 or a negative code with the message set. */
/* All n bytes at off; a file that ends first is TZ_EFORMAT (truncated). */
int tz_ckpt_io_read_at(int fd, const char *path, void *buf, uint64_t n, uint64_t off);
/* The whole of a small file (at most max bytes), NUL-terminated; *len without the NUL. */
int tz_ckpt_io_slurp(const char *path, uint64_t max, char **out, uint64_t *len);

/* Paths (NULL when out of memory; the caller frees them). */
char *tz_ckpt_path_join(const char *a, const char *b);
char *tz_ckpt_step_path(const char *root, uint64_t step, const char *suffix);
char *tz_ckpt_rank_path(const char *dir, int rank);
/* "step-<digits>" followed by suffix exactly (suffix "" for a checkpoint). */
int tz_ckpt_parse_step_name(const char *name, const char *suffix, uint64_t *step);

/* checkpoint_read.c */
struct manifest {
  int version; /* of the format, from the first line */
  uint64_t step;
  int world;
  uint64_t *bytes;     /* (world) */
  uint32_t *index_crc; /* (world) */
};
void tz_ckpt_manifest_free(struct manifest *m);
/* Reads and checks dir/manifest. The step must equal the directory's name when the name is a
 * step-N one. */
int tz_ckpt_manifest_read(const char *dir, struct manifest *m);
/* Opens rank's file of the checkpoint in step directory dir; hints: a damaged file's message
 * suggests the previous intact checkpoint. */
int tz_ckpt_open_dir(const char *dir, int rank, int hints, tz_ckpt_reader **out);

#endif
