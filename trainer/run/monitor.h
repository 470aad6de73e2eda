/* Live monitoring: a ds_config's tensorboard and csv_monitor sections honoured during the run, as
 * DeepSpeed 0.19's monitors write them (deepspeed/monitor/tensorboard.py, csv_monitor.py; the
 * rules and the tags are in docs/training.md, "Live monitoring"):
 * - the directory of each is os.path.join(output_path, job_name) (tz_monitor_dir), created at
 *   start with its parents;
 * - tensorboard: one event file per monitor, events.out.tfevents.<%010d seconds>.<host>.<pid>.<n>
 *   as TensorBoard's EventFileWriter names it, written here (TFRecord framing, masked CRC-32C,
 *   Event protocol buffers with simple_value scalars), its first record holding file_version
 *   "brain.Event:2";
 * - csv_monitor: one file per tag, <tag with '/' and ' ' as '_'>.csv, appended to, with the row
 *   "step,<the tag's last '/' part>" before the first value this monitor writes to it and then
 *   "<step>,<value>" rows, lines ended by "\r\n" and values written as Python's repr(float).
 * Every write ends with the files flushed, so that a reader sees each step whole while the run
 * goes on (fflush, no fsync).
 *
 * One client thread; rank 0 alone makes a monitor (trainer/run/run.c), as DeepSpeed's write only on
 * global rank 0. */
#ifndef TZ_TRAINER_MONITOR_H
#define TZ_TRAINER_MONITOR_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"

typedef struct tz_monitor tz_monitor;

/* The most scalars one write takes, the longest tag, and the most tags a monitor writes. */
#define TZ_MONITOR_MAX_SCALARS 16
#define TZ_MONITOR_MAX_TAG 96
#define TZ_MONITOR_MAX_TAGS 64

struct tz_monitor_scalar {
  const char *tag; /* "Train/Samples/lr"; at most TZ_MONITOR_MAX_TAG bytes */
  double value;    /* the event file holds it as a float (simple_value), the CSV file as is */
};

/* One optimizer step, as DeepSpeed's engine reports it (tz_monitor_write_step). */
struct tz_monitor_step {
  int64_t samples;   /* the x-axis: DeepSpeed's global_samples after the step, the steps done
                        (skipped ones included) times train_batch_size */
  double train_loss; /* Train/Samples/train_loss: the step's mean loss */
  double lr;         /* Train/Samples/lr: the rate DeepSpeed's get_lr() gives after the step,
                        its scheduler stepped for the step's update: the next update's rate */
  int has_loss_scale;
  double loss_scale; /* Train/Samples/loss_scale (fp16): the scale after the step */
  int has_eval;
  double eval_loss;    /* Train/Samples/eval_loss, when the step was followed by an evaluation */
  double grad_norm;    /* tierzero/grad_norm: the global norm before clipping */
  double step_s;       /* tierzero/step_time_s: the step's wall time */
  double tokens_per_s; /* tierzero/tokens_per_s: all ranks together */
};

/* DeepSpeed's directory of a monitor into buf: os.path.join(output_path, job_name), NULL taking
 * DeepSpeed's defaults ("" and "DeepSpeedJobName"): job_name alone when it is absolute or
 * output_path is "", else output_path, a '/' unless it ends with one, and job_name. TZ_EINVAL
 * when it does not fit in len. */
int tz_monitor_dir(const char *output_path, const char *job_name, char *buf, size_t len);

/* What cfg asks of the monitors, checked before anything is made: TZ_ECONFIG naming the keys of
 * an enabled monitor whose directory is "" (output_path and job_name both ""; DeepSpeed's
 * os.makedirs fails on it too) or too long. wandb.enabled true is refused when the config is
 * read (core/config_keys.c). */
int tz_monitor_check(const struct tz_config *cfg);

/* The monitors cfg enables: their directories made, the event file created with its first
 * record, the CSV directory shown to take files (a file created, written, fsynced and removed).
 * *out is NULL when none is enabled. Errors name the keys and the path: TZ_ECONFIG as
 * tz_monitor_check, TZ_EIO/TZ_EPERM/TZ_ENOSPC/... from the file system. The caller owns *out
 * (tz_monitor_destroy). */
int tz_monitor_create(const struct tz_config *cfg, tz_monitor **out);
/* Closes the files; NULL is a no-op. */
void tz_monitor_destroy(tz_monitor *m);

/* The event file's path, NULL without tensorboard; the CSV directory, NULL without csv_monitor.
 * Borrowed from m. */
const char *tz_monitor_event_file(const tz_monitor *m);
const char *tz_monitor_csv_dir(const tz_monitor *m);

/* Writes n scalars at x: one event holding them all, a row in each tag's CSV file; then flushes.
 * TZ_EINVAL for n above TZ_MONITOR_MAX_SCALARS or a tag that is empty or too long (nothing
 * written), or for a CSV tag past the first TZ_MONITOR_MAX_TAGS; TZ_EIO and the like naming the
 * file when a write fails. */
int tz_monitor_write(tz_monitor *m, int64_t x, const struct tz_monitor_scalar *v, int n);
/* The step's scalars under DeepSpeed's tags, and tierzero's own under "tierzero/", at
 * s->samples. As tz_monitor_write. */
int tz_monitor_write_step(tz_monitor *m, const struct tz_monitor_step *s);

#endif
