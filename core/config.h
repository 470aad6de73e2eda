/* Configuration: every tunable of tierzero in one struct, filled once at start-up and read from
 * there by everything else (no other module calls getenv for a tunable; a module used without a
 * config reads its variable through tz_config_env_key. The one exception is TZ_LOG, read by
 * core/log.c before any config exists: see log_init there).
 *
 * Layers, lowest precedence first:
 *   1. built-in defaults                      tz_config_defaults
 *   2. a JSON file: the part of DeepSpeed's    tz_config_load_file (may be called more than once;
 *      ds_config.json that applies, plus a     each file merges over what is there)
 *      "tierzero" section for our own keys
 *   3. TZ_* environment variables (env wins)  tz_config_apply_env
 * then tz_config_resolve_batch once the world size is known.
 *
 * Every key, its type, default and meaning: docs/config.md. In the JSON, null means "not given"
 * (the value stays as it was) and, where DeepSpeed allows it, "auto" means "unset": the built-in
 * default, which for batch sizes and step counts is 0 = derive it.
 *
 * Ownership: a tz_config owns its strings (the char * fields below) and its list of ignored keys.
 * Read them freely; change them only through tz_config_set, which frees what it replaces. A
 * tz_config that has been filled is released with tz_config_free. Loading is all or nothing: on
 * an error the struct is left exactly as it was. */
#ifndef TZ_CONFIG_H
#define TZ_CONFIG_H

#include <stdint.h>
#include <stdio.h>

/* At most this many NVMe directories (the same limit as struct tz_tier_params.paths). */
#define TZ_CONFIG_MAX_PATHS 16
/* The most backend settings the tierzero section has keys for (tz_config_backend_setting). */
#define TZ_CONFIG_MAX_SETTINGS 8
/* Words of the per-key bit sets of struct tz_config: room for 64 * 4 keys. */
#define TZ_CONFIG_KEY_WORDS 4

enum tz_optimizer_type {
  TZ_OPTIMIZER_ADAM,  /* "Adam": decoupled weight decay unless adam_w_mode is false */
  TZ_OPTIMIZER_ADAMW, /* "AdamW": always decoupled weight decay */
};

enum tz_lr_schedule {
  TZ_LR_CONSTANT,      /* no "scheduler" section: optimizer.params.lr throughout */
  TZ_LR_WARMUP,        /* "WarmupLR": warm up to warmup_max_lr, then constant */
  TZ_LR_WARMUP_DECAY,  /* "WarmupDecayLR": warm up, then linear decay to 0 at total_num_steps */
  TZ_LR_WARMUP_COSINE, /* "WarmupCosineLR": warm up (ratios of lr), then cosine to cos_min_ratio */
};

enum tz_warmup_type {
  TZ_WARMUP_LOG,    /* "log": lr rises with log(step) (DeepSpeed's default) */
  TZ_WARMUP_LINEAR, /* "linear" */
};

enum tz_offload_device {
  TZ_OFFLOAD_NONE, /* "none": the state stays in GPU memory */
  TZ_OFFLOAD_CPU,  /* "cpu": pinned host memory */
  TZ_OFFLOAD_NVME, /* "nvme": files on NVMe, staged through host memory */
};

enum tz_precision {
  TZ_PRECISION_FP32, /* "fp32" */
  TZ_PRECISION_FP16, /* "fp16" */
  TZ_PRECISION_BF16, /* "bf16" */
};

/* A list of directories (owned strings). */
struct tz_config_paths {
  int n;
  char *path[TZ_CONFIG_MAX_PATHS];
};

/* One key of the file that tierzero did not use, with its JSON path ("tensorboard",
 * "zero_optimization.offload_parm"); hint is the known key it is probably a typo of, or NULL. */
struct tz_config_ignored_key {
  char *path;
  char *hint;
};

/* Only what tierzero uses has a field. The other DeepSpeed keys it knows (offload buffer counts,
 * bucket sizes, aio threads, activation_checkpointing, steps_per_print, ...) are accepted and
 * checked as DeepSpeed would, and stored nowhere (core/config_keys.c). */
struct tz_config {
  /* Batch: train_batch_size = micro * gradient_accumulation_steps * world size. 0 = not given;
   * tz_config_resolve_batch derives the missing ones. */
  int64_t train_batch_size;               /* sequences per optimizer step, all ranks together */
  int64_t train_micro_batch_size_per_gpu; /* sequences per forward/backward on one rank */
  int64_t gradient_accumulation_steps;    /* micro-batches accumulated before each step */
  double gradient_clipping;               /* global gradient-norm clip; 0 = off */

  struct {
    enum tz_optimizer_type type;
    double lr;           /* peak learning rate (the schedule scales it) */
    double betas[2];     /* Adam beta1, beta2, each in [0, 1) */
    double eps;          /* Adam epsilon, added to sqrt(v_hat) */
    double weight_decay; /* decoupled (AdamW) or L2 (Adam with adam_w_mode false) */
    int adam_w_mode;     /* 1: decoupled weight decay; forced to 1 for AdamW */
  } optimizer;

  struct {
    enum tz_lr_schedule type;
    double warmup_min_lr;     /* WarmupLR/WarmupDecayLR: lr at step 0 */
    double warmup_max_lr;     /* WarmupLR/WarmupDecayLR: lr at the end of warmup; -1 not set
                                 (trainer/step/lr.c) */
    int64_t warmup_num_steps; /* steps of warmup */
    enum tz_warmup_type warmup_type;
    int64_t total_num_steps; /* WarmupDecayLR/WarmupCosineLR: 0 = the trainer's step count */
    double warmup_min_ratio; /* WarmupCosineLR: lr/peak at step 0 */
    double cos_min_ratio;    /* WarmupCosineLR: lr/peak at total_num_steps */
  } scheduler;

  struct {
    int enabled; /* bf16 weights and activations, fp32 master and optimizer state */
  } bf16;

  struct {
    int enabled;             /* fp16 weights and activations with loss scaling */
    double loss_scale;       /* 0 = dynamic; otherwise a fixed scale */
    int initial_scale_power; /* dynamic: the scale starts at 2^this */
    int loss_scale_window;   /* dynamic: steps without overflow before the scale doubles */
    int hysteresis;          /* dynamic: overflows tolerated before the scale halves */
    double min_loss_scale;   /* dynamic: the scale never drops below this */
  } fp16;

  /* Derived from bf16.enabled and fp16.enabled after each load: the compute precision. */
  enum tz_precision precision;

  struct {
    int stage; /* 3 = shard parameters, gradients and optimizer state (native); 0..2 shard less */
    struct {
      enum tz_offload_device device; /* where parameter shards live between uses */
      char *nvme_path;               /* directory for device nvme; NULL = tierzero.nvme_path */
    } offload_param;
    struct {
      enum tz_offload_device device; /* where optimizer state (fp32 master, m, v) lives */
      char *nvme_path;               /* directory for device nvme; NULL = tierzero.nvme_path */
    } offload_optimizer;
    int overlap_comm; /* overlap collectives with compute */
  } zero_optimization;

  struct {
    int64_t block_size; /* bytes per NVMe request */
  } aio;

  struct {
    int cpu_checkpointing; /* each layer's input (the checkpoint its backward recomputes from)
                              homed in host memory (tierzero.offload_activations "auto") */
  } activation_checkpointing;

  double gradient_predivide_factor;          /* divide gradients by this before the reduction */
  int prescale_gradients;                    /* divide by the world size before rather than after */
  enum tz_precision communication_data_type; /* dtype of gradient reductions */
  int64_t seed;                              /* initialisation and data order are functions of it */

  /* DeepSpeed's monitors (its deepspeed/monitor/config.py), written during the run by rank 0
   * (trainer/run/monitor.h): TensorBoard events and CSV files in the directory
   * os.path.join(output_path, job_name). Settings of one run: checkpoints do not keep them
   * (tz_config_forget_run). wandb.enabled true is refused (config_keys.c). */
  struct tz_config_monitor {
    int enabled;
    char *output_path; /* where job_name's directory goes; NULL = "" (DeepSpeed's default: the
                          directory is job_name, under the current one) */
    char *job_name;    /* NULL = "DeepSpeedJobName" (DeepSpeed's default) */
  } tensorboard, csv_monitor;

  /* The "tierzero" section; each key is also TZ_<KEY> in the environment. */
  struct {
    char *model;             /* model preset name; NULL = the trainer's default */
    char *data;              /* the training data (tz-train --data; docs/data.md); NULL = the
                                built-in corpus. Saved in checkpoints: a resume without --data
                                trains on what the run it continues trained on */
    double warmup_ratio;     /* > 0: the schedule's warm-up is ceil(warmup_ratio * its total steps)
                                (Hugging Face TrainingArguments' warmup_ratio; tz-train
                                --warmup-ratio) in place of scheduler.params.warmup_num_steps; 0 =
                                not set (trainer/step/lr.c) */
    double epochs;           /* the run's length in passes over the training data (tz-train
                                --epochs; trainer/run/run.c): ceil(epochs * samples / the global batch)
                                steps; 0 = --steps */
    int offload_activations; /* where each layer's input lives between its forward and its
                                backward: 0 "auto" (the plan's choice with --auto-placement,
                                else the compute tier; host memory with
                                activation_checkpointing.cpu_checkpointing), 1 "none" (the
                                compute tier), 2 "cpu", 3 "nvme" (trainer/step/placement.c) */
    int long_documents;      /* packed fine-tuning data: a document longer than a row is cut to
                                its first seq_len + 1 tokens (0, "cut") or split (1, "split")
                                (trainer/data/data.h, split_long) */
    uint64_t hbm_budget;     /* bytes of GPU memory to use; 0 = what is free */
    uint64_t host_budget;    /* bytes of pinned host memory; 0 = most of what is available */
    uint64_t nvme_budget;    /* bytes of NVMe space; 0 = a share of what is free */
    struct tz_config_paths nvme_path; /* NVMe directories, one file striped over each */
    int nvme_checksum;                /* checksum blocks written to NVMe and verify on read */
    int nvme_buffered;                /* use the page cache instead of O_DIRECT */
    uint64_t staging_bytes;           /* pinned host bytes for staged transfers */
    uint64_t chunk_bytes;             /* bytes per staged chunk (<= staging_bytes) */
    int queue_depth;                  /* io_uring entries per ring; 0 = the backend's default */
    uint64_t nvme_stage_bytes;        /* a piece of a staged nvme <-> GPU transfer, the scheduler's
                                         staging chunk (tz_sched_params.stage_chunk_bytes) */
    int nvme_stage_chunks;   /* staging chunks per direction (tz_sched_params.stage_chunks) */
    char *faults;            /* fault-injection spec for the fault tier; NULL = none */
    int lookahead;           /* phases prefetched ahead; -1 = as far as budget allows */
    int plan_widen_moves;    /* the plan's moves tried past its best (tz_plan_request) */
    int jitter_us;           /* test hook: random delay up to this before each progress round */
    int sched_debug;         /* log every placement decision */
    int wait_for_write_back; /* a prefetch waits for a write-back in flight rather than evict a
                                copy used sooner (tz_sched_params.wait_for_write_back) */
    int window_carry;        /* the window's copies serve the next step too (tz_sched_params.carry);
                                -1 = auto: not on a GPU with forced placement and no
                                tierzero.hbm_budget (the window then takes the GPU's free memory
                                as a working set), else they do */
    int defer_rewrite;       /* a write-back that the step's next use would supersede waits for it
                                (tz_sched_params.defer_rewrite) */
    uint64_t copy_queue;     /* the most bytes of copies queued on one direction between two tiers
                                at once (tz_sched_params.queue_bytes); 512 MiB by default, 0 = no
                                limit */
    int log;                 /* enum tz_log_level (core/log.h) */
    int64_t trace_step;      /* step to record a lane trace for; -1 = none */
    int threads;             /* CPU optimizer threads; 0 = auto */
    double cpu_adam;         /* share of the parameters whose host-homed optimizer state the
                                CPU steps at its homes (the last layers first); -1 = all on
                                a CPU-only machine, none with a GPU */
    int cpu_adam_search;     /* the plan picks cpu_adam: the least bound of 0, 1/8, ..., 1; -1 =
                                auto: on a GPU with the optimizer offloaded to cpu by the config
                                and no cpu_adam given */
    int overlap_collectives; /* with several ranks, each phase gathers the next layer and
                                reduce-scatters the previous one's gradient while it
                                computes (docs/training.md); -1 = auto: on GPUs when the
                                parameters are not forced off them */
    int numa_node;           /* NUMA node for host memory and threads; -1 = the GPU's */
    int device;              /* GPU index; -1 = from the local rank */
    double comm_timeout;     /* seconds each collective and launcher exchange may take */
    double stop_grace; /* seconds a stop request gives the step to end (trainer/run/signals.h);
                          0: auto, 20x the plan's bound (>= 120) before the first step
                          ends, then 3x the longest step (>= 60) */
    /* what weight decay skips: "bias", "norm", "embed" (trainer/step/decay.h), or "none"; n 0 = not
     * set: bias and norm */
    struct tz_config_paths weight_decay_exclude;
    /* which parts of which layers the backward recomputes: "auto", "all", "none", or a list of
     * layer ranges and parts (trainer/step/recompute.h); n 0 = not set: auto */
    struct tz_config_paths recompute;
  } tierzero;

  /* Private: the text of each backend's setting (tz_config_backend_setting), NULL = not set. */
  char *setting_[TZ_CONFIG_MAX_SETTINGS];
  /* Private: keys of the file that were not used (tz_config_ignored). */
  struct tz_config_ignored_key *ignored_;
  int n_ignored_, cap_ignored_;
  /* Private: bit i stands for key i of the table: given "auto" (tz_config_auto_key), and set
   * though it has no effect in tierzero (tz_config_no_effect_key). */
  uint64_t auto_[TZ_CONFIG_KEY_WORDS], no_effect_[TZ_CONFIG_KEY_WORDS];
  /* Private: bit i: key i given by a source since tz_config_given_clear (tz_config_section_given).
   */
  uint64_t given_[TZ_CONFIG_KEY_WORDS];
};

/* Fills c with the built-in defaults. Overwrites c without freeing it: on a struct that holds
 * strings, call tz_config_free first. */
void tz_config_defaults(struct tz_config *c);

/* Merges the JSON file at path over c. Errors: TZ_ENOENT (no such file; the message has the
 * path), TZ_EPERM/TZ_EIO (cannot read it), TZ_ECONFIG (syntax error with line and column, a wrong
 * type or value, with the file and the key's JSON path in the message). c is unchanged on error.
 * Keys that do not apply are recorded (tz_config_ignored); a likely typo of a known key also gets
 * a warning with the suggestion. */
int tz_config_load_file(struct tz_config *c, const char *path);

/* The same from a string; origin names it in messages (NULL: "<string>"). */
int tz_config_load_string(struct tz_config *c, const char *json, const char *origin);

/* Applies the TZ_* variables of the tierzero section (TZ_HBM_BUDGET, ...; docs/config.md). Unset
 * or empty variables change nothing. TZ_ECONFIG names the variable; c is unchanged on error. A
 * TZ_* variable that is not known but is close to a known name is warned about. */
int tz_config_apply_env(struct tz_config *c);

/* Reads the environment variable of one tierzero key (TZ_<KEY>, by the mapping
 * tz_config_apply_env uses) into c, for a library or program used without a config (a test,
 * tz-bench) that still honours the variable. 1: the variable is set and its value stored in c; 0:
 * it is not set (or empty), c untouched; TZ_ECONFIG for a bad value (the message names the
 * variable), TZ_ENOENT when key is no tierzero key. */
int tz_config_env_key(struct tz_config *c, const char *key);

/* Puts back the defaults of the settings that belong to one run, not to the training it does:
 * fault injection, the log level, the scheduler's jitter and debug prints, the traced step. A
 * checkpoint's configuration is saved without them, so that a resume has only what it asks for
 * (a resume without TZ_FAULTS injects nothing). */
void tz_config_forget_run(struct tz_config *c);

/* Whether a source (a file, the environment, tz_config_set) gave a key under section ("optimizer"),
 * or the key itself, since c was made or since tz_config_given_clear; 1 or 0. tz-train asks it of
 * the user's files alone (a ds_config's optimizer section decays every tensor, as DeepSpeed's
 * does: docs/config.md, "Weight decay per tensor"). */
int tz_config_section_given(const struct tz_config *c, const char *section);
void tz_config_given_clear(struct tz_config *c);

/* Backend settings: keys of the tierzero section that choose inside one backend
 * (tierzero.cuda_attention, tierzero.cuda_matmul). The config stores the text (from the file, or
 * its environment variable, which wins as for every key) and knows nothing of what it means:
 * the backend parses and checks it (core/settings.h). The i-th such key (from 0) that c sets:
 * its path, its backend ("cuda"), the setting's name there ("attention") and the text; 0 when
 * there is no i-th, 1 otherwise. */
int tz_config_backend_setting(const struct tz_config *c, int i, const char **key,
                              const char **backend, const char **setting, const char **value);
/* The settings string (core/settings.h) of the keys c sets for backend: "attention=wgmma,
 * matmul=plain", or "" for none. TZ_EINVAL when it does not fit in len. */
int tz_config_backend_settings(const struct tz_config *c, const char *backend, char *buf,
                               size_t len);

/* Sets one key from text, as an environment variable would give it: path is the JSON path
 * ("tierzero.host_budget", "optimizer.params.lr"); value is parsed by the key's type (sizes take
 * units, booleans 1/0/true/false/yes/no/on/off, pairs "0.9,0.95", lists of paths "a:b"). For
 * command-line overrides. TZ_ENOENT for an unknown path, TZ_ECONFIG for a bad value. */
int tz_config_set(struct tz_config *c, const char *path, const char *value);

/* Parses a size as the config takes it: decimal digits, an optional single space, an optional
 * unit, case-insensitive: B, kB (10^3), MB, GB, TB, PB, KiB (2^10), MiB, GiB, TiB, PiB. No sign,
 * fraction or exponent; at most INT64_MAX bytes. For programs that take sizes on their command
 * line. 0, or -1 when s is not such a size. */
int tz_config_parse_size(const char *s, uint64_t *out);

/* DeepSpeed's rule train_batch_size = micro * gradient_accumulation_steps * world_size: any two
 * given determine the third; gradient_accumulation_steps defaults to 1; the micro batch is
 * derived when train_batch_size is divisible. TZ_ECONFIG with all the numbers when they disagree
 * or do not divide, or when neither train_batch_size nor the micro batch is given. */
int tz_config_resolve_batch(struct tz_config *c, int world_size);

/* Keys given "auto" (by a file, the environment or tz_config_set) and not set again since, in the
 * key table's order, keys without effect left out. tz_config_resolve_batch resolves them as
 * Hugging Face Trainer's DeepSpeed integration does where its rule ties a key to another value of
 * the run (docs/config.md "auto"); the others take tierzero's default. Strings are static. */
/* 1 when the key at path was given "auto" by the last source that set it. */
int tz_config_is_auto(const struct tz_config *c, const char *path);
int tz_config_auto_count(const struct tz_config *c);
const char *tz_config_auto_key(const struct tz_config *c, int i); /* NULL past the end */

/* Keys tierzero knows, accepts and checks, but that change nothing here (aio.thread_count,
 * zero_optimization.sub_group_size, activation_checkpointing.*, steps_per_print, ...), that
 * were set: once each, in table order. Strings are static. */
int tz_config_no_effect_count(const struct tz_config *c);
const char *tz_config_no_effect_key(const struct tz_config *c, int i); /* NULL past the end */

/* What a run prints at start, after tz_config_resolve_batch: to out, one line per "auto" key with
 * the value it resolved to and the rule that gave it (steps: the run's steps, which
 * scheduler.params.total_num_steps "auto" stands for; 0 when not known); to err, one line naming
 * every key set that has no effect. Nothing when there is none of either. */
void tz_config_report(const struct tz_config *c, int64_t steps, FILE *out, FILE *err);

/* Keys the loaded files had that tierzero does not use, in file order. The strings belong to c. */
int tz_config_ignored_count(const struct tz_config *c);
const char *tz_config_ignored(const struct tz_config *c, int i);      /* the JSON path */
const char *tz_config_ignored_hint(const struct tz_config *c, int i); /* suggestion or NULL */

/* Deep copy; dst is overwritten (not freed). TZ_ENOMEM leaves dst as after tz_config_defaults. */
int tz_config_copy(struct tz_config *dst, const struct tz_config *src);

/* Frees the strings and the ignored list c owns and sets those pointers to NULL. */
void tz_config_free(struct tz_config *c);

/* Writes the effective configuration as JSON (DeepSpeed layout plus "tierzero"), which
 * tz_config_load_string reads back over tz_config_defaults to the same values. Values that are
 * not set are written "auto" or null; keys with no field are not written. For metrics and
 * checkpoints. */
int tz_config_dump(const struct tz_config *c, FILE *f);

/* The known keys by JSON path, for help output and for checking the documentation. */
int tz_config_key_count(void);
const char *tz_config_key(int i);
/* The environment variable of key i, or NULL if it has none. */
const char *tz_config_key_env(int i);

#endif
