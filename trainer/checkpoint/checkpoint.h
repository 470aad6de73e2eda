/* Checkpoints: one directory per saved step under a root directory, written so that a crash or a
 * full disk at any moment of a save leaves the previous checkpoint loadable, and every byte read
 * back verified by a checksum. docs/checkpoints.md has the format and the reasoning.
 *
 *   root/
 *     latest               "step-00000123\n": the checkpoint a resume takes by default
 *     step-00000123/
 *       manifest           step, world size, each rank file's size and index checksum
 *       rank-00000.bin     one per rank: named sections, each crc32c-checked, 4096-aligned
 *     step-00000130.tmp/   a save in progress, or one a crash interrupted: never read
 *
 * Saving, on every rank of a job (world ranks, one save at a time per root):
 *   rank 0: tz_ckpt_begin; then a barrier; the other ranks: tz_ckpt_begin
 *   every rank: tz_ckpt_put / tz_ckpt_put_json / tz_ckpt_section_* ...; tz_ckpt_commit
 *   barrier; rank 0: tz_ckpt_finalize (renames the directory into place, then updates latest)
 * If any rank fails: every rank drops its writer (tz_ckpt_writer_destroy, or a failed commit
 * already did), barrier, and rank 0 calls tz_ckpt_abandon; the previous checkpoint is untouched.
 *
 * Loading: tz_ckpt_open(root or step directory, rank), tz_ckpt_get... When a file fails its
 * checks the error names the file, the section and its offset, and suggests the newest earlier
 * checkpoint that passes the structural check (tz_ckpt_previous).
 *
 * Byte order: little-endian on disk, whatever the host. Section payloads are opaque bytes; the
 * caller names them ("layer.3.adam_m") and knows their dtype and shape. */
#ifndef TZ_TRAINER_CHECKPOINT_H
#define TZ_TRAINER_CHECKPOINT_H

#include <stdint.h>

#include "core/config.h"

/* Longest section name, in bytes, without the terminating NUL. */
#define TZ_CKPT_MAX_NAME 255

/* ---- writing ---- */

/* A writer is used by one thread at a time. */
typedef struct tz_ckpt_writer tz_ckpt_writer;

/* Hooks into the save path, for tests (a crash or a full disk at a chosen operation). */
struct tz_ckpt_hooks {
  /* optional: NULL means nothing is called. Called right before each file-system operation of
   * the save path that changes something (create, write, fsync, rename, mkdir, unlink, rmdir);
   * data_op is 1 for a write or an fsync, else 0. Returns 0 to let the operation run, or a
   * positive errno that it then fails with, as the system call would (ENOSPC: a full disk). It
   * may not return at all (a test that kills the process there). Called from the thread that
   * runs the operation, with ctx. */
  int (*before_op)(void *ctx, int data_op);
  /* optional: NULL means statvfs. The bytes free to an unprivileged writer on root's file system,
   * for tz_ckpt_dir_check (a test gives a small disk without filling one). 0 or an errno. */
  int (*free_bytes)(void *ctx, const char *root, uint64_t *bytes);
  void *ctx;
};

/* Options of one save, given to tz_ckpt_begin (kept by the writer), tz_ckpt_finalize and
 * tz_ckpt_abandon. NULL, or all zero, is the default. */
struct tz_ckpt_options {
  struct tz_ckpt_hooks hooks;
  /* test hook: the format version written (the header and the manifest; trainer/checkpoint/resume.c
   * then writes that version's "state"), to make checkpoints of an earlier version; 0: the current
   */
  int version;
};

/* Starts this rank's file of checkpoint `step` under root. Rank 0 must call it before every other
 * rank (the caller's barrier): it creates root if missing, removes a stale root/step-<step>.tmp
 * left by an earlier crash, and creates that directory afresh; the other ranks only create their
 * file in it (TZ_ENOENT if it is not there). 0 <= rank < world. The caller owns *out: commit it or
 * destroy it. */
int tz_ckpt_begin(const char *root, uint64_t step, int rank, int world,
                  const struct tz_ckpt_options *opt, tz_ckpt_writer **out);

/* Streams one section of exactly `bytes` bytes: begin, any number of writes adding up to bytes,
 * end. Names are 1..TZ_CKPT_MAX_NAME bytes of printable ASCII, unique within the rank's file
 * (TZ_EINVAL otherwise). Data is buffered and written in large pieces; its crc32c is computed as
 * it passes. After an error the writer accepts nothing but commit (which fails) and destroy. */
int tz_ckpt_section_begin(tz_ckpt_writer *w, const char *name, uint64_t bytes);
int tz_ckpt_section_write(tz_ckpt_writer *w, const void *data, uint64_t n);
int tz_ckpt_section_end(tz_ckpt_writer *w);

/* One whole section from memory: begin, write, end. */
int tz_ckpt_put(tz_ckpt_writer *w, const char *name, const void *data, uint64_t bytes);

/* A section holding a JSON text (RNG state, data position, ...). TZ_EINVAL, with jansson's
 * message, if json does not parse: what is saved always loads. */
int tz_ckpt_put_json(tz_ckpt_writer *w, const char *name, const char *json);

/* The effective configuration (tz_config_dump) as the JSON section "config". */
int tz_ckpt_put_config(tz_ckpt_writer *w, const struct tz_config *c);

/* Finishes this rank's file: the index and trailer, then fsync. Frees w whether it succeeds or
 * not; on failure the partial file is removed and the message names it. */
int tz_ckpt_commit(tz_ckpt_writer *w);

/* Drops a writer that will not be committed and removes its partial file. NULL is a no-op. */
void tz_ckpt_writer_destroy(tz_ckpt_writer *w);

/* Rank 0, after every rank's commit returned 0 (the caller's barrier): checks that each of the
 * world rank files is complete, writes the manifest, fsyncs, renames step-<step>.tmp to
 * step-<step> (atomically exchanging it with an existing step-<step>, which a run resumed from an
 * earlier step may have left), fsyncs root, then points latest at it (temporary file, fsync,
 * rename, fsync root). Only then, with keep > 0, checkpoints older than step beyond the newest
 * keep (this one included) are removed; keep 0 keeps all. Leftovers of crashed saves (*.tmp,
 * *.old) are removed too. Checkpoints newer than step (from a run this one was resumed before)
 * are left alone. Failures of that clean-up are logged as warnings and do not fail the save.
 * On an error before the rename, the temporary directory is removed and latest is untouched; on
 * an error writing latest, step-<step> is complete but latest still names the previous one (the
 * message says so). */
int tz_ckpt_finalize(const char *root, uint64_t step, int world, int keep,
                     const struct tz_ckpt_options *opt);

/* Rank 0, after a failed save (every rank's writer gone): removes root/step-<step>.tmp. 0 if it
 * is not there. */
int tz_ckpt_abandon(const char *root, uint64_t step, const struct tz_ckpt_options *opt);

/* ---- reading ---- */

/* A reader is used by one thread at a time; readers of different ranks or checkpoints are
 * independent. */
typedef struct tz_ckpt_reader tz_ckpt_reader;

/* Opens rank `rank`'s file of a checkpoint. path is either a step directory (it holds a
 * manifest) or a root whose latest names one. Checks the manifest's checksum and contents, and
 * the rank file's size, header, trailer and index against it; section payloads are checked as
 * they are read. TZ_ENOENT (no checkpoint there, or no such rank: rank >= world), TZ_ECHECKSUM,
 * TZ_EFORMAT, TZ_EIO with the file and offset in the message. The caller owns *out. */
int tz_ckpt_open(const char *path, int rank, tz_ckpt_reader **out);
void tz_ckpt_close(tz_ckpt_reader *r); /* NULL is a no-op */

uint64_t tz_ckpt_step(const tz_ckpt_reader *r);
/* The format version the checkpoint was written in, TZ_CKPT_VERSION_MIN..TZ_CKPT_VERSION. */
int tz_ckpt_version(const tz_ckpt_reader *r);
/* The version a save with opt writes (opt->version, else TZ_CKPT_VERSION). */
int tz_ckpt_options_version(const struct tz_ckpt_options *opt);
int tz_ckpt_world(const tz_ckpt_reader *r);
const char *tz_ckpt_dir(const tz_ckpt_reader *r); /* the step directory; valid until close */

/* Sections of the rank file, in the order they were written. */
int tz_ckpt_count(const tz_ckpt_reader *r);
const char *tz_ckpt_name(const tz_ckpt_reader *r, int i); /* NULL outside [0, count) */
/* *bytes = the section's size. TZ_ENOENT if there is no such section. */
int tz_ckpt_size(const tz_ckpt_reader *r, const char *name, uint64_t *bytes);

/* Reads section `name` into dst, which holds exactly `bytes` (TZ_EINVAL naming both sizes
 * otherwise), and verifies its crc32c: TZ_ECHECKSUM names the file, section and offset. On any
 * error dst holds no usable data. */
int tz_ckpt_get(tz_ckpt_reader *r, const char *name, void *dst, uint64_t bytes);

/* Streams section `name` in pieces of at most 1 MiB: sink(ctx, data, offset within the section,
 * n) for each, in order; a negative return from sink stops and is returned. The crc32c is checked
 * after the last piece, so on TZ_ECHECKSUM the sink has seen bad data and must discard it. */
typedef int (*tz_ckpt_sink)(void *ctx, const void *data, uint64_t offset, uint64_t n);
int tz_ckpt_get_stream(tz_ckpt_reader *r, const char *name, tz_ckpt_sink sink, void *ctx);

/* A JSON section as a NUL-terminated string; the caller frees *out. */
int tz_ckpt_get_json(tz_ckpt_reader *r, const char *name, char **out);

/* Merges the "config" section over c (tz_config_load_string); c is unchanged on error. */
int tz_ckpt_get_config(tz_ckpt_reader *r, struct tz_config *c);

/* ---- the root directory ---- */

/* Complete checkpoints under root (step-<N> directories whose manifest is intact; *.tmp and
 * *.old are ignored), ascending. Returns how many there are (>= 0) and writes the first
 * min(that, cap) to steps; a negative TZ_E* on error. A missing root holds none. */
int tz_ckpt_list(const char *root, uint64_t *steps, int cap);

/* The step latest names. TZ_ENOENT if there is no latest, TZ_EFORMAT if it is malformed. */
int tz_ckpt_latest(const char *root, uint64_t *step);

/* The newest checkpoint older than step that passes tz_ckpt_check(dir, 1): every checksum is
 * verified (it reads the checkpoints it tries), so one offered as intact is. TZ_ENOENT if none. */
int tz_ckpt_previous(const char *root, uint64_t step, uint64_t *prev);

/* After a failed save: what a resume from root can use now, as a clause for the save's message,
 * into buf (returned): the checkpoint latest names, verified to its checksums
 * ("latest still names step-00000002 in ROOT, intact (its checksums verified): --resume ROOT");
 * that root holds none; that latest's is damaged (why) and the newest intact one before it, or
 * none; and when a complete checkpoint newer than latest's exists (a save whose update of latest
 * failed, or one left by a run resumed before), that latest is older than it. Leaves the thread's
 * error message as it found it. */
const char *tz_ckpt_describe(const char *root, char *buf, size_t len);

/* ---- one run per root, checked before its first step ---- */

/* A run's claim on a root: an exclusive flock on root/.lock, held as long as the handle lives.
 * The kernel drops it when the holder exits however it dies (kill -9 included), so a dead run
 * never blocks the next; the file's text (pid, host, since when) is only for the message. */
typedef struct tz_ckpt_lock tz_ckpt_lock;

/* Creates root if missing and takes its lock without waiting. TZ_EBUSY when another holds it:
 * "<root> is in use by pid N on HOST since TIME"; other errors name root and the reason. The
 * caller owns *out (tz_ckpt_release). The descriptor is close-on-exec: programs the run starts do
 * not keep the directory. */
int tz_ckpt_claim(const char *root, tz_ckpt_lock **out);
void tz_ckpt_release(tz_ckpt_lock *l); /* releases; NULL is a no-op */

/* The bytes of a rank file holding n sections of these names and sizes, in write order, as the
 * writer lays them out (checkpoint_format.h): header, 4096-aligned payloads, index, trailer. */
uint64_t tz_ckpt_rank_file_bytes(int n, const char *const *names, const uint64_t *bytes);
/* The bytes of the "config" section tz_ckpt_put_config writes for c; 0 if it cannot be made. */
uint64_t tz_ckpt_config_bytes(const struct tz_config *c);
/* The disk space one checkpoint of world rank files of rank_file_bytes each takes: the files in
 * whole 4096-byte blocks, the manifest and latest. */
uint64_t tz_ckpt_bytes(int world, uint64_t rank_file_bytes);

/* Whether root can take the saves of a run: creates root if missing, creates, writes, fsyncs and
 * removes a probe file in it, then asks for count checkpoints of ckpt_bytes free (statvfs's
 * f_bavail, or the free_bytes hook of opt). TZ_ENOSPC "<root>: keeping 3 checkpoints of B bytes
 * (...) at once needs N bytes (...), the file system has M bytes free (...)"; other errors name
 * root and the failing operation. opt may be NULL. */
int tz_ckpt_dir_check(const char *root, uint64_t ckpt_bytes, int count,
                      const struct tz_ckpt_options *opt);

/* Whether a run's output directory root takes what the run will write there, before the run's
 * first step (so that no failure after training loses it): in root, or where it is missing in
 * its nearest existing ancestor (nothing is created), creates, writes, fsyncs and removes a probe
 * file, and with bytes > 0 asks for that much free.
 * Messages start with what ("--export-safetensors") and root. */
int tz_ckpt_out_check(const char *what, const char *root, uint64_t bytes);

/* Checks a step directory: the manifest and every rank file's size, header, trailer and index;
 * with full != 0 also every section's crc32c (reads everything). 0 or the first error. */
int tz_ckpt_check(const char *stepdir, int full);

#endif
