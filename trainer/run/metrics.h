/* What the user sees of a training run: per-step figures (struct tz_step_metrics, filled by the
 * trainer), a JSONL metrics file with one object per step, a progress display on the terminal
 * (a redrawn bar on a TTY, plain lines otherwise) and an end-of-run summary. The schema of the
 * file is in docs/data.md.
 *
 * FLOPs. Model FLOPs per token of a decoder with N parameters, L layers, width d, at sequence
 * length T (the PaLM paper's accounting, appendix B):
 *     6*N + 12*L*T*d
 * 2*N for the forward multiply-adds and 4*N for the backward, plus the attention scores and their
 * weighted sum (2 matmuls of 2*T*d per token per layer forward, twice that backward; the causal
 * mask is not subtracted, as in that accounting). N is every parameter, the embedding included
 * and a tied head counted once, as llm.c and nanoGPT count it; the embedding lookup does no
 * multiply-adds, so this overstates the work by 6*V*d per token when the head is untied (2% for
 * llama-7b). With activation recomputation the forward runs twice: 8*N + 16*L*T*d. MFU uses the
 * first (model FLOPs, what the model needs); the second is the hardware FLOPs actually done. */
#ifndef TZ_TRAINER_METRICS_H
#define TZ_TRAINER_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "core/config.h"
#include "core/tier.h"
#include "trainer/model/model.h"

#define TZ_METRICS_MAX_TRAFFIC 32
#define TZ_METRICS_MAX_TIERS 8

/* Bytes moved by one lane of one tier during a step (or, in a summary, the run). */
struct tz_traffic {
  char tier[16]; /* "hbm", "host", "nvme", "net" */
  char lane[32]; /* "read", "write", "h2d", "d2h", "allgather", ... */
  uint64_t bytes;
};

/* What one tier holds at the end of a step: its arena's used bytes and its budget. */
struct tz_tier_memory {
  char tier[16];
  uint64_t used, capacity;
};

/* The disk (the tier named "nvme") over a step, or over the run's timed steps in a summary:
 * bytes read from it and written to it, and the time it was busy (docs/data.md, "The disk's
 * rates"). */
struct tz_disk_traffic {
  uint64_t read, written;
  double busy_s; /* time with a transfer of the tier in flight; NaN when the tier cannot tell */
};

/* What the metrics file and the summary say of a disk's traffic over wall_s seconds. Rates in
 * GB/s (1e9 bytes a second); NaN where a figure is not known (no time, no busy time). */
struct tz_disk_rates {
  double read_gbs, write_gbs;           /* bytes over wall_s */
  double busy_read_gbs, busy_write_gbs; /* bytes over busy_s: the device's rates while in use */
  double busy_share;                    /* busy_s / wall_s */
  double read_share;                    /* read / (read + written); NaN when nothing moved */
};
void tz_disk_rates_of(const struct tz_disk_traffic *d, double wall_s, struct tz_disk_rates *out);

/* One optimizer step, as the trainer fills it. NaN in a double means "not known" and is written
 * as null (JSON has no NaN). tokens_per_s, tflops and mfu come from tz_metrics_derive. */
struct tz_step_metrics {
  int64_t step;        /* 1-based: the number of optimizer steps done */
  int64_t total_steps; /* of the run; 0 when unknown (no ETA) */
  double elapsed_s;    /* wall time since training started, at the end of this step */
  double loss;         /* mean training loss of the step's tokens, all ranks */
  double lr;           /* learning rate used by this step's update */
  double grad_norm;    /* global gradient norm before clipping */
  uint64_t tokens;     /* tokens in the step, all ranks together */
  double step_s;       /* wall time of the step */
  double bound_s;      /* the plan's lower bound for the step; 0 = no plan */
  double stall_s;      /* time the compute lane waited on transfers during the step */
  double coll_s;       /* time the compute lane spent in collectives or waiting for them */
  int skipped;         /* 1: fp16 overflow, the update was skipped */
  double loss_scale;   /* fp16 loss scale; 0 when not fp16 */
  int has_eval;        /* 1: eval_loss was measured after this step */
  double eval_loss;    /* mean validation loss */
  double epoch;        /* passes over the training samples at the end of this step (Hugging Face's
                          "epoch"); NaN without a data set (synthetic sequences) */
  double tokens_per_s; /* derived: tokens / step_s */
  double tflops;       /* derived: model TFLOP/s achieved, all ranks */
  double mfu;          /* derived: tflops / peak of all ranks; NaN when the peak is unknown */
  int n_traffic;
  struct tz_traffic traffic[TZ_METRICS_MAX_TRAFFIC];
  int n_memory;
  struct tz_tier_memory memory[TZ_METRICS_MAX_TIERS];
  int has_disk; /* 1: the run has an nvme tier, and disk holds its traffic in the step */
  struct tz_disk_traffic disk;
};

/* A zeroed step with the unknown doubles set to NaN. */
void tz_step_metrics_init(struct tz_step_metrics *m);

/* Adds bytes to (tier, lane), creating the entry. TZ_EINVAL for a name longer than its field,
 * TZ_ENOMEM when TZ_METRICS_MAX_TRAFFIC entries are taken. */
int tz_step_metrics_add_traffic(struct tz_step_metrics *m, const char *tier, const char *lane,
                                uint64_t bytes);

/* ---- Tier traffic: the tiers' I/O counters (core/tier.h tz_tier_io_stats) between steps ---- */

/* The counters of a run's tiers at one moment (tz_metrics_counters_take). */
struct tz_traffic_counters {
  int n;
  struct {
    const tz_tier *t;
    char name[16];
    uint64_t read, written;
    uint64_t busy_ns; /* tz_tier_io_stats' */
    int has_busy;
  } tier[TZ_METRICS_MAX_TIERS];
};

/* Takes the counters of tiers[0..n) (n <= TZ_METRICS_MAX_TIERS; NULL entries are skipped). */
void tz_metrics_counters_take(tz_tier *const *tiers, int n, struct tz_traffic_counters *out);

/* A step's traffic: for each tier of tiers, the bytes it read ("read": moved out of the tier) and
 * wrote ("write": into it) since *last, added to m's traffic as (tier name, lane); also each
 * tier's memory in use, and for the tier named "nvme" (the disk) m->disk, has_disk set. *last
 * becomes the counters now, so that consecutive steps account for every byte once. A tier that is
 * not in *last counts from 0. TZ_ENOMEM or TZ_EINVAL as tz_step_metrics_add_traffic. */
int tz_metrics_step_traffic(struct tz_step_metrics *m, tz_tier *const *tiers, int n,
                            struct tz_traffic_counters *last);

/* Model FLOPs per token at sequence length T (the header's formula): recompute 0 gives
 * 6N + 12LTd, 1 gives 8N + 16LTd, N the parameters a token uses (tz_model_n_active_params: with
 * experts, the k a token is routed to, not all E). */
double tz_metrics_flops_per_token(const struct tz_model_config *cfg, int T, int recompute);

/* Dense peak FLOP/s of one GPU at a compute precision (tensor cores for fp16/bf16, plain fp32
 * otherwise), from its name as CUDA reports it ("NVIDIA H200"); 0 when the device is not in the
 * table (the MFU is then not reported). */
double tz_metrics_peak_flops(const char *device_name, enum tz_precision precision);

/* Fills tokens_per_s, tflops and mfu from tokens and step_s. peak_flops is the peak of all ranks
 * together (0: unknown). */
void tz_metrics_derive(struct tz_step_metrics *m, double flops_per_token, double peak_flops);

/* ---- The run summary ---- */

/* Totals over a run. Rates and the step-time comparison leave out the first step (which pays
 * for allocation, first reads and warm-up) when there are more. */
struct tz_metrics_summary {
  double flops_per_token, peak_flops;
  int64_t steps, skipped;
  uint64_t tokens;
  double time_s;       /* sum of step_s */
  int64_t timed_steps; /* the steps rates are taken over */
  uint64_t timed_tokens;
  double timed_s, timed_bound_s, timed_stall_s, timed_coll_s;
  int bound_steps; /* timed steps with a bound */
  double last_loss, last_eval_loss;
  int n_traffic;
  struct tz_traffic traffic[TZ_METRICS_MAX_TRAFFIC];
  int has_disk;                      /* a step had the disk's figures */
  struct tz_disk_traffic timed_disk; /* the timed steps' together; busy_s NaN if one's was */
};

void tz_metrics_summary_init(struct tz_metrics_summary *s, double flops_per_token,
                             double peak_flops);
void tz_metrics_summary_add(struct tz_metrics_summary *s, const struct tz_step_metrics *m);
/* The bytes moved since the last step's figures (the write-backs it left in flight, the last
 * checkpoint: tz_metrics_step_traffic's rules) added to the run's totals, so that they equal the
 * counters' change over the whole run. */
int tz_metrics_summary_traffic_rest(struct tz_metrics_summary *s, tz_tier *const *tiers, int n,
                                    struct tz_traffic_counters *last);
/* A step within this share under its bound is at the bound: the rates it was costed with are
 * measured to about this much (a probe's run-to-run spread), so it shows nothing wrong. */
#define TZ_BOUND_NOISE 0.03
/* 1 when the timed steps came in under their bound by more than TZ_BOUND_NOISE: the bound is
 * then wrong (docs/training.md "The bound"), and the summary says so instead of printing a ratio
 * below 1; within it, the summary prints the ratio as at the bound. */
int tz_metrics_summary_below_bound(const struct tz_metrics_summary *s);
/* Multi-line summary: tokens/s, TFLOP/s and MFU, step time against the bound (docs/training.md
 * "The bound"), stall share, the disk's bytes and rates in the timed steps (with an nvme tier),
 * bytes per tier and lane. */
void tz_metrics_summary_print(const struct tz_metrics_summary *s, FILE *f);

/* ---- The metrics file ---- */

typedef struct tz_metrics_writer tz_metrics_writer;

/* Opens path for JSONL (truncated, or appended to when append is set: a resumed run). Lines are
 * buffered and flushed one by one, never fsynced. TZ_EIO/TZ_EPERM/TZ_ENOENT with the path. */
int tz_metrics_writer_create(const char *path, int append, tz_metrics_writer **out);
/* Opens path for a run resumed after step: the file (created if missing) is appended to, once the
 * lines it has from step + 1 on (a run that went past its last checkpoint before it stopped, and
 * a line torn by the crash) are cut off, by an atomic rewrite, so that every step has one line.
 * TZ_EIO/TZ_EPERM/TZ_ENOENT/TZ_ENOSPC with the path. */
int tz_metrics_writer_resume(const char *path, int64_t step, tz_metrics_writer **out);
void tz_metrics_writer_destroy(tz_metrics_writer *w); /* closes; NULL is a no-op */
/* One line: {"config": {...}, "start_step": N}, the run's resolved configuration (core/config.h
 * tz_config_dump) and where it starts, written first by every run (a resumed one too, since its
 * options may differ). Readers skip lines without "step". */
int tz_metrics_write_config(tz_metrics_writer *w, const struct tz_config *cfg, int64_t start_step);
/* One line: the step object (docs/data.md). TZ_EIO with the path when the write fails. */
int tz_metrics_write_step(tz_metrics_writer *w, const struct tz_step_metrics *m);
/* One line: {"summary": true, ...} with the summary's figures. */
int tz_metrics_write_summary(tz_metrics_writer *w, const struct tz_metrics_summary *s);

/* ---- The progress display ---- */

typedef struct tz_display tz_display;

enum tz_display_mode {
  TZ_DISPLAY_AUTO,  /* a bar when f is a terminal, lines otherwise */
  TZ_DISPLAY_BAR,   /* one line redrawn in place with \r */
  TZ_DISPLAY_LINES, /* a plain line every `every` steps, at the last step and at each eval */
  TZ_DISPLAY_QUIET, /* nothing */
};

/* The mode a name gives (tz-train --progress): "plain" (LINES), "bar" or "auto"; TZ_EINVAL
 * naming the value and the names otherwise, *out unchanged. */
int tz_display_mode_parse(const char *name, enum tz_display_mode *out);

/* Writes to f (borrowed; tz-train gives stdout). every >= 1. TZ_EINVAL, TZ_ENOMEM. */
int tz_display_create(FILE *f, enum tz_display_mode mode, int64_t every, tz_display **out);
/* Ends a bar that is showing (a newline) and frees d; NULL is a no-op. */
void tz_display_destroy(tz_display *d);
/* The mode in use (AUTO resolved). */
enum tz_display_mode tz_display_mode_of(const tz_display *d);
void tz_display_step(tz_display *d, const struct tz_step_metrics *m);
/* A line of text (a warning, "checkpoint written") that does not garble the bar: the bar is
 * cleared, the line printed, and the bar drawn again below it. */
void tz_display_message(tz_display *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
