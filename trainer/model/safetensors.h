/* safetensors files (the format of Hugging Face weights): an 8-byte little-endian header length n,
 * n bytes of JSON {"name": {"dtype": "BF16", "shape": [r, c], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {"key": "value"}}, then the data, offsets relative to its start.
 * The reader validates the whole header on open and reads F32, BF16 and F16 tensors into float;
 * the writer streams tensors one after another (F32 or BF16 or F16 from float), so a model never
 * needs to be in memory at once. Little-endian hosts only, like the format. */
#ifndef TZ_TRAINER_SAFETENSORS_H
#define TZ_TRAINER_SAFETENSORS_H

#include <stdint.h>

#include "kernels/compute.h"

#define TZ_ST_MAX_DIMS 8

struct tz_st_tensor {
  const char *name;
  char dtype[12]; /* as in the file: "F32", "BF16", "I64", ... */
  int ndim;
  int64_t shape[TZ_ST_MAX_DIMS];
  uint64_t numel;
  uint64_t begin, end; /* bytes, relative to the start of the data */
};

typedef struct tz_st_file tz_st_file;

/* Opens and validates: the header length against the file size, the JSON, every entry's dtype
 * (a safetensors dtype), shape and data_offsets (inside the data, end - begin = numel * size, no
 * two tensors overlapping). TZ_EFORMAT with the file, tensor name and offsets in the message;
 * TZ_ENOENT / TZ_EIO from the file system. The caller owns *out. */
int tz_st_open(const char *path, tz_st_file **out);
void tz_st_close(tz_st_file *f); /* NULL is a no-op */

int tz_st_count(const tz_st_file *f);
const struct tz_st_tensor *tz_st_get(const tz_st_file *f, int i);             /* file order */
const struct tz_st_tensor *tz_st_find(const tz_st_file *f, const char *name); /* NULL: absent */
/* "[d0, d1, ...]" of a shape of ndim dimensions into buf (len bytes), for messages. */
void tz_st_shape_text(char *buf, size_t len, int ndim, const int64_t *shape);
/* A string of __metadata__, or NULL. Valid until tz_st_close. */
const char *tz_st_metadata(const tz_st_file *f, const char *key);

/* Reads tensor `name` into out (numel floats), converting F32, BF16 or F16. The file's shape must
 * equal shape[0..ndim) (TZ_EFORMAT naming both); ndim 0 skips the check. TZ_ENOENT if absent,
 * TZ_ENOTSUP for another dtype, TZ_EIO on a short read. */
int tz_st_read_f32(tz_st_file *f, const char *name, int ndim, const int64_t *shape, float *out);

/* Reads tensor t (one of f's) into out (t->numel floats), converting F32, BF16 or F16, in large
 * sequential reads shared by threads (tz_st_set_threads). nonfinite (may be NULL) gets the index
 * of its first element that is an inf or a NaN, or -1: found in the same pass as the cast. */
int tz_st_read_tensor_f32(tz_st_file *f, const struct tz_st_tensor *t, float *out,
                          int64_t *nonfinite);
const char *tz_st_path(const tz_st_file *f); /* as given to tz_st_open */
/* Threads of each tz_st_read_tensor_f32 on f: n, or with n 0 (the default) the CPUs the process
 * may run on, at most 8. The result does not depend on it. */
void tz_st_set_threads(tz_st_file *f, int n);

/* One tensor of a batch: t (one of f's) into out (t->numel floats). */
struct tz_st_read {
  tz_st_file *f;
  const struct tz_st_tensor *t;
  float *out;
  int64_t nonfinite; /* set: the index of t's first inf or NaN, or -1 */
};
/* Reads r[0..n) as tz_st_read_tensor_f32 would one after another, their chunks shared by
 * `threads` threads (0: the default of tz_st_set_threads): one start of threads for all of
 * them. Returns the error of the first chunk, in the order of r, that could not be read (with
 * its file, tensor and offset), whatever the threads; on success the floats and every nonfinite
 * are those one thread gives. Tensors of one or several files; the files must stay open. */
int tz_st_read_tensors_f32(struct tz_st_read *r, int n, int threads);

/* ---- writing ---- */

struct tz_st_entry {
  const char *name;
  enum tz_dtype dtype; /* stored as F32, BF16 or F16 */
  int ndim;
  int64_t shape[TZ_ST_MAX_DIMS];
};

typedef struct tz_st_writer tz_st_writer;

/* Writes the header for tensors e[0..n) (in that order in the data) and metadata pairs
 * meta[0], meta[1], meta[2], ... ending with NULL (meta may be NULL) to "<path>.tmp". */
int tz_st_writer_open(const char *path, const struct tz_st_entry *e, int n, const char *const *meta,
                      tz_st_writer **out);
/* Appends the next tensor's numel elements, converted from float. TZ_EINVAL if n is not its
 * numel or all tensors were written. */
int tz_st_writer_put(tz_st_writer *w, const float *data, uint64_t n);
/* The crc32c (tz_crc32c) and the count of the bytes written so far: the whole file's once every
 * tensor is put. */
void tz_st_writer_sum(const tz_st_writer *w, uint32_t *crc, uint64_t *bytes);
/* commit != 0: checks that every tensor was written, fsyncs and renames to path; otherwise (or on
 * any error) removes the temporary file. Frees w either way. */
int tz_st_writer_close(tz_st_writer *w, int commit);

#endif
