/* Configuration: one table of keys drives parsing (JSON and text), defaults, copying, freeing and
 * dumping, so a new tunable is one line in keys[] plus its field in struct tz_config. */
#define _GNU_SOURCE
#include "core/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"
#include "core/tier.h"

extern char **environ;

_Static_assert(TZ_CONFIG_MAX_PATHS == TZ_MAX_PATHS, "one limit on NVMe directories");
/* Enum fields are read and written as int through the table. */
_Static_assert(sizeof(enum tz_optimizer_type) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_lr_schedule) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_warmup_type) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_offload_device) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_precision) == sizeof(int), "enum stored as int");
_Static_assert(TZ_LOG_ERROR == 0 && TZ_LOG_TRACE == 4, "log level names below follow the enum");

enum ktype {
  K_BOOL,   /* int 0/1 */
  K_INT,    /* int */
  K_I64,    /* int64_t; DeepSpeed's element counts (5e8 is accepted when integral) */
  K_SIZE,   /* uint64_t bytes: an integer, or a string with a unit ("64GiB") */
  K_DOUBLE, /* double */
  K_PAIR,   /* double[2] */
  K_ENUM,   /* int holding an enum value, chosen by name */
  K_STR,    /* owned char *, NULL = not set */
  K_PATHS,  /* struct tz_config_paths: one string or an array of them */
  K_FIXED,  /* no field: a DeepSpeed switch that tierzero supports in one position only */
};

enum {
  F_AUTO = 1 << 0,     /* "auto" accepted: the built-in default */
  F_MIN_OPEN = 1 << 1, /* K_DOUBLE/K_PAIR: the value must be > dmin, not >= */
  F_MAX_OPEN = 1 << 2, /* K_DOUBLE/K_PAIR: the value must be < dmax, not <= */
  F_ICASE = 1 << 3,    /* K_ENUM: names match case-insensitively (DeepSpeed's optimizer.type) */
};

struct key {
  const char *path; /* JSON path, sections joined by '.' */
  enum ktype type;
  size_t off;                 /* offset of the field in struct tz_config */
  int64_t imin, imax;         /* K_INT, K_I64, K_SIZE: accepted range, inclusive */
  double dmin, dmax;          /* K_DOUBLE, K_PAIR: accepted range (F_MIN_OPEN, F_MAX_OPEN) */
  unsigned flags;
  const char *const *names;   /* K_ENUM: name of each value (NULL: a value with no name) */
  int n_names;
  double def[2]; /* default: number, 0/1, enum value; K_PAIR both; K_FIXED the required 0/1.
                  * Defaults may lie outside [min, max]: such a value means "not set". */
};

#define OFF(f) offsetof(struct tz_config, f)
/* The _Generic selections make a key whose field has the wrong C type fail to compile. */
#define FT(f) (((struct tz_config *)0)->f)
#define BOOL(p, f, d)                                                                              \
  {.path = p, .type = _Generic(FT(f), int: K_BOOL), .off = OFF(f), .imin = 0, .imax = 1,         \
   .def = {d}}
#define BOOLA(p, f, d)                                                                             \
  {.path = p, .type = _Generic(FT(f), int: K_BOOL), .off = OFF(f), .imin = 0, .imax = 1,         \
   .flags = F_AUTO, .def = {d}}
#define INT(p, f, lo, hi, d, fl)                                                                   \
  {.path = p, .type = _Generic(FT(f), int: K_INT), .off = OFF(f), .imin = lo, .imax = hi,        \
   .flags = fl, .def = {d}}
#define I64(p, f, lo, d, fl)                                                                       \
  {.path = p, .type = _Generic(FT(f), int64_t: K_I64), .off = OFF(f), .imin = lo,                \
   .imax = INT64_MAX, .flags = fl, .def = {d}}
#define SIZE(p, f, lo, d, fl)                                                                      \
  {.path = p, .type = _Generic(FT(f), uint64_t: K_SIZE), .off = OFF(f), .imin = lo,              \
   .imax = INT64_MAX, .flags = fl, .def = {d}}
#define DBL(p, f, lo, hi, d, fl)                                                                   \
  {.path = p, .type = _Generic(FT(f), double: K_DOUBLE), .off = OFF(f), .dmin = lo, .dmax = hi,  \
   .flags = fl, .def = {d}}
#define PAIR(p, f, lo, hi, d0, d1, fl)                                                             \
  {.path = p, .type = _Generic(&FT(f), double(*)[2]: K_PAIR), .off = OFF(f), .dmin = lo,         \
   .dmax = hi, .flags = fl, .def = {d0, d1}}
/* Enum fields are checked by the _Static_asserts above (an enum is not "int" to _Generic). */
#define ENUM(p, f, nm, d, fl)                                                                      \
  {.path = p, .type = K_ENUM, .off = OFF(f), .names = nm,                                          \
   .n_names = (int)(sizeof nm / sizeof nm[0]), .flags = fl, .def = {d}}
#define STR(p, f) {.path = p, .type = _Generic(FT(f), char *: K_STR), .off = OFF(f)}
#define PATHS(p, f)                                                                                \
  {.path = p, .type = _Generic(FT(f), struct tz_config_paths: K_PATHS), .off = OFF(f)}
#define FIXED(p, v) {.path = p, .type = K_FIXED, .imin = 0, .imax = 1, .def = {v}}

static const char *const optimizer_names[] = {"Adam", "AdamW"};
static const char *const schedule_names[] = {NULL, "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
static const char *const warmup_names[] = {"log", "linear"};
static const char *const device_names[] = {"none", "cpu", "nvme"};
static const char *const precision_names[] = {"fp32", "fp16", "bf16"};
static const char *const log_names[] = {"error", "warn", "info", "debug", "trace"};

/* Keys of one section are contiguous: tz_config_dump nests by walking this order. */
static const struct key keys[] = {
  I64("train_batch_size", train_batch_size, 1, 0, F_AUTO),
  I64("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, 1, 0, F_AUTO),
  I64("gradient_accumulation_steps", gradient_accumulation_steps, 1, 0, F_AUTO),
  DBL("gradient_clipping", gradient_clipping, 0, INFINITY, 0, F_AUTO),
  ENUM("optimizer.type", optimizer.type, optimizer_names, TZ_OPTIMIZER_ADAMW, F_ICASE),
  DBL("optimizer.params.lr", optimizer.lr, 0, INFINITY, 1e-3, F_AUTO),
  PAIR("optimizer.params.betas", optimizer.betas, 0, 1, 0.9, 0.999, F_AUTO | F_MAX_OPEN),
  DBL("optimizer.params.eps", optimizer.eps, 0, INFINITY, 1e-8, F_AUTO | F_MIN_OPEN),
  DBL("optimizer.params.weight_decay", optimizer.weight_decay, 0, INFINITY, 0, F_AUTO),
  BOOL("optimizer.params.adam_w_mode", optimizer.adam_w_mode, 1),
  BOOL("optimizer.params.torch_adam", optimizer.torch_adam, 0),
  FIXED("optimizer.params.amsgrad", 0),
  FIXED("optimizer.params.bias_correction", 1),
  ENUM("scheduler.type", scheduler.type, schedule_names, TZ_LR_CONSTANT, 0),
  DBL("scheduler.params.warmup_min_lr", scheduler.warmup_min_lr, 0, INFINITY, 0, F_AUTO),
  DBL("scheduler.params.warmup_max_lr", scheduler.warmup_max_lr, 0, INFINITY, 1e-3, F_AUTO),
  I64("scheduler.params.warmup_num_steps", scheduler.warmup_num_steps, 0, 1000, F_AUTO),
  ENUM("scheduler.params.warmup_type", scheduler.warmup_type, warmup_names, TZ_WARMUP_LOG, 0),
  I64("scheduler.params.total_num_steps", scheduler.total_num_steps, 1, 0, F_AUTO),
  DBL("scheduler.params.warmup_min_ratio", scheduler.warmup_min_ratio, 0, 1, 0, 0),
  DBL("scheduler.params.cos_min_ratio", scheduler.cos_min_ratio, 0, 1, 1e-4, 0),
  BOOLA("bf16.enabled", bf16.enabled, 0),
  BOOLA("fp16.enabled", fp16.enabled, 0),
  DBL("fp16.loss_scale", fp16.loss_scale, 0, INFINITY, 0, 0),
  INT("fp16.initial_scale_power", fp16.initial_scale_power, 0, 127, 16, 0),
  INT("fp16.loss_scale_window", fp16.loss_scale_window, 1, INT_MAX, 1000, 0),
  INT("fp16.hysteresis", fp16.hysteresis, 1, INT_MAX, 2, 0),
  DBL("fp16.min_loss_scale", fp16.min_loss_scale, 0, INFINITY, 1, F_MIN_OPEN),
  INT("zero_optimization.stage", zero_optimization.stage, 0, 3, 3, 0),
  ENUM("zero_optimization.offload_param.device", zero_optimization.offload_param.device,
       device_names, TZ_OFFLOAD_NONE, 0),
  STR("zero_optimization.offload_param.nvme_path", zero_optimization.offload_param.nvme_path),
  BOOL("zero_optimization.offload_param.pin_memory", zero_optimization.offload_param.pin_memory, 0),
  INT("zero_optimization.offload_param.buffer_count", zero_optimization.offload_param.buffer_count,
      1, INT_MAX, 5, 0),
  I64("zero_optimization.offload_param.buffer_size", zero_optimization.offload_param.buffer_size, 1,
      1e8, 0),
  I64("zero_optimization.offload_param.max_in_cpu", zero_optimization.offload_param.max_in_cpu, 0,
      1e9, 0),
  ENUM("zero_optimization.offload_optimizer.device", zero_optimization.offload_optimizer.device,
       device_names, TZ_OFFLOAD_NONE, 0),
  STR("zero_optimization.offload_optimizer.nvme_path",
      zero_optimization.offload_optimizer.nvme_path),
  BOOL("zero_optimization.offload_optimizer.pin_memory",
       zero_optimization.offload_optimizer.pin_memory, 0),
  INT("zero_optimization.offload_optimizer.buffer_count",
      zero_optimization.offload_optimizer.buffer_count, 1, INT_MAX, 4, 0),
  BOOL("zero_optimization.offload_optimizer.fast_init",
       zero_optimization.offload_optimizer.fast_init, 0),
  DBL("zero_optimization.offload_optimizer.ratio", zero_optimization.offload_optimizer.ratio, 0, 1,
      1, 0),
  I64("zero_optimization.stage3_prefetch_bucket_size",
      zero_optimization.stage3_prefetch_bucket_size, 0, 5e7, F_AUTO),
  I64("zero_optimization.stage3_max_live_parameters", zero_optimization.stage3_max_live_parameters,
      0, 1e9, 0),
  I64("zero_optimization.stage3_max_reuse_distance", zero_optimization.stage3_max_reuse_distance, 0,
      1e9, 0),
  I64("zero_optimization.stage3_param_persistence_threshold",
      zero_optimization.stage3_param_persistence_threshold, 0, 1e5, F_AUTO),
  BOOL("zero_optimization.overlap_comm", zero_optimization.overlap_comm, 1),
  BOOL("zero_optimization.contiguous_gradients", zero_optimization.contiguous_gradients, 1),
  I64("zero_optimization.reduce_bucket_size", zero_optimization.reduce_bucket_size, 1, 5e8, F_AUTO),
  I64("zero_optimization.sub_group_size", zero_optimization.sub_group_size, 1, 1e9, 0),
  I64("aio.block_size", aio.block_size, 1, 1048576, 0),
  INT("aio.queue_depth", aio.queue_depth, 1, 32768, 8, 0),
  INT("aio.thread_count", aio.thread_count, 1, 1024, 1, 0),
  BOOL("aio.single_submit", aio.single_submit, 0),
  BOOL("aio.overlap_events", aio.overlap_events, 1),
  BOOL("activation_checkpointing.partition_activations",
       activation_checkpointing.partition_activations, 0),
  BOOL("activation_checkpointing.cpu_checkpointing", activation_checkpointing.cpu_checkpointing, 0),
  BOOL("activation_checkpointing.contiguous_memory_optimization",
       activation_checkpointing.contiguous_memory_optimization, 0),
  INT("activation_checkpointing.number_checkpoints", activation_checkpointing.number_checkpoints, 1,
      INT_MAX, 0, F_AUTO),
  BOOL("activation_checkpointing.synchronize_checkpoint_boundary",
       activation_checkpointing.synchronize_checkpoint_boundary, 0),
  BOOL("activation_checkpointing.profile", activation_checkpointing.profile, 0),
  I64("steps_per_print", steps_per_print, 1, 10, 0),
  BOOL("wall_clock_breakdown", wall_clock_breakdown, 0),
  DBL("gradient_predivide_factor", gradient_predivide_factor, 0, INFINITY, 1, F_MIN_OPEN),
  BOOL("prescale_gradients", prescale_gradients, 0),
  ENUM("communication_data_type", communication_data_type, precision_names, TZ_PRECISION_FP32, 0),
  I64("seed", seed, 0, 42, 0),
  /* tierzero's own keys; each is also the environment variable TZ_<KEY> */
  STR("tierzero.model", tierzero.model),
  SIZE("tierzero.hbm_budget", tierzero.hbm_budget, 0, 0, 0),
  SIZE("tierzero.host_budget", tierzero.host_budget, 0, 0, 0),
  SIZE("tierzero.nvme_budget", tierzero.nvme_budget, 0, 0, 0),
  PATHS("tierzero.nvme_path", tierzero.nvme_path),
  BOOL("tierzero.nvme_checksum", tierzero.nvme_checksum, 1),
  BOOL("tierzero.nvme_buffered", tierzero.nvme_buffered, 0),
  SIZE("tierzero.staging_bytes", tierzero.staging_bytes, 1, 64 << 20, 0),
  SIZE("tierzero.chunk_bytes", tierzero.chunk_bytes, 1, 4 << 20, 0),
  INT("tierzero.queue_depth", tierzero.queue_depth, 0, 32768, 0, 0),
  STR("tierzero.faults", tierzero.faults),
  INT("tierzero.lookahead", tierzero.lookahead, -1, 65536, -1, 0),
  INT("tierzero.jitter_us", tierzero.jitter_us, 0, 10000000, 0, 0),
  BOOL("tierzero.sched_debug", tierzero.sched_debug, 0),
  ENUM("tierzero.log", tierzero.log, log_names, TZ_LOG_WARN, 0),
  I64("tierzero.trace_step", tierzero.trace_step, -1, -1, 0),
  INT("tierzero.threads", tierzero.threads, 0, 4096, 0, 0),
  DBL("tierzero.cpu_adam", tierzero.cpu_adam, 0, 1, -1, 0),
  BOOL("tierzero.cpu_adam_search", tierzero.cpu_adam_search, 0),
  BOOLA("tierzero.overlap_collectives", tierzero.overlap_collectives, -1),
  INT("tierzero.numa_node", tierzero.numa_node, -1, 1023, -1, 0),
  INT("tierzero.device", tierzero.device, -1, 1023, -1, 0),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

/* DeepSpeed keys tierzero knows and deliberately does not use: listed as ignored, never given a
 * "did you mean". A section listed here is ignored whole. */
static const char *const known_ignored[] = {
  "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config", "flops_profiler",
  "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "amp", "sparse_attention",
  "pipeline", "compression_training", "data_efficiency", "curriculum_learning", "elasticity",
  "autotuning", "checkpoint", "data_types", "dump_state", "memory_breakdown", "sparse_gradients",
  "disable_allgather", "eigenvalue", "progressive_layer_drop", "nebula", "quantize_training",
  "weight_quantization", "hybrid_engine", "comms_logger", "dataloader_drop_last",
  "torch_autocast", "compile", "timers", "graph_harvesting", "tensor_parallel",
  "sequence_parallel_size", "seq_parallel_communication_data_type",
  "use_data_before_expert_parallelism", "gradient_accumulation_dtype",
  "optimizer.params.fused", "scheduler.params.last_batch_iteration",
  "fp16.auto_cast", "fp16.consecutive_hysteresis", "fp16.fp16_master_weights_and_grads",
  "bf16.immediate_grad_update", "bf16.bf16_master_weights_and_grads",
  "bf16.bf16_optimizer_states", "bf16.check_grad_overflow",
  "zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size",
  "zero_optimization.reduce_scatter", "zero_optimization.load_from_fp32_weights",
  "zero_optimization.elastic_checkpoint", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
  "zero_optimization.stage3_gather_fp16_weights_on_model_save",
  "zero_optimization.gather_16bit_weights_on_model_save",
  "zero_optimization.stage3_module_granularity_threshold",
  "zero_optimization.ignore_unused_parameters", "zero_optimization.round_robin_gradients",
  "zero_optimization.zero_hpz_partition_size", "zero_optimization.zero_quantized_weights",
  "zero_optimization.zero_quantized_nontrainable_weights",
  "zero_optimization.zero_quantized_gradients", "zero_optimization.mics_shard_size",
  "zero_optimization.mics_hierarchical_params_gather", "zero_optimization.memory_efficient_linear",
  "zero_optimization.pipeline_loading_checkpoint", "zero_optimization.override_module_apply",
  "zero_optimization.use_all_reduce_for_fetch_params", "zero_optimization.cpu_offload",
  "zero_optimization.cpu_offload_params", "zero_optimization.cpu_offload_use_pin_memory",
  "zero_optimization.log_trace_cache_warnings", "zero_optimization.legacy_stage1",
  "zero_optimization.offload_optimizer.pipeline_read",
  "zero_optimization.offload_optimizer.pipeline_write",
  "zero_optimization.offload_optimizer.pipeline",
  "aio.intra_op_parallelism", "aio.use_gds",
};
#define N_KNOWN_IGNORED ((int)(sizeof known_ignored / sizeof known_ignored[0]))

/* Older DeepSpeed spellings of a top-level section. */
static const struct {
  const char *alias, *name;
} section_aliases[] = {{"bfloat16", "bf16"}};

/* ------------------------------------------------------------------------------------------ */
/* Field access */

static void *field(struct tz_config *c, const struct key *k) { return (char *)c + k->off; }
static const void *cfield(const struct tz_config *c, const struct key *k) {
  return (const char *)c + k->off;
}

static int get_int(const struct tz_config *c, const struct key *k) {
  int v;
  memcpy(&v, cfield(c, k), sizeof v);
  return v;
}

static void set_int(struct tz_config *c, const struct key *k, int v) {
  memcpy(field(c, k), &v, sizeof v);
}

static void free_owned(struct tz_config *c, const struct key *k) {
  if (k->type == K_STR) {
    char **s = field(c, k);
    free(*s);
    *s = NULL;
  } else if (k->type == K_PATHS) {
    struct tz_config_paths *p = field(c, k);
    for (int i = 0; i < p->n; i++)
      free(p->path[i]);
    memset(p, 0, sizeof *p);
  }
}

/* The default of k; owned fields are freed (their default is "not set"). */
static void set_default(struct tz_config *c, const struct key *k) {
  switch (k->type) {
  case K_BOOL:
  case K_INT:
  case K_ENUM: set_int(c, k, (int)k->def[0]); break;
  case K_I64: *(int64_t *)field(c, k) = (int64_t)k->def[0]; break;
  case K_SIZE: *(uint64_t *)field(c, k) = (uint64_t)k->def[0]; break;
  case K_DOUBLE: *(double *)field(c, k) = k->def[0]; break;
  case K_PAIR: memcpy(field(c, k), k->def, 2 * sizeof(double)); break;
  case K_STR:
  case K_PATHS: free_owned(c, k); break;
  case K_FIXED: break;
  }
}

/* A parsed value, not yet stored. s and paths are owned until stored. */
struct val {
  int is_default; /* "auto": store the built-in default */
  int64_t i;
  double d[2];
  char *s;
  struct tz_config_paths paths;
};

static void val_free(struct val *v) {
  free(v->s);
  for (int i = 0; i < v->paths.n; i++)
    free(v->paths.path[i]);
  memset(v, 0, sizeof *v);
}

/* Moves v into c (v's strings now belong to c). */
static void store(struct tz_config *c, const struct key *k, struct val *v) {
  if (v->is_default) {
    set_default(c, k);
    val_free(v);
    return;
  }
  switch (k->type) {
  case K_BOOL:
  case K_INT:
  case K_ENUM: set_int(c, k, (int)v->i); break;
  case K_I64: *(int64_t *)field(c, k) = v->i; break;
  case K_SIZE: *(uint64_t *)field(c, k) = (uint64_t)v->i; break;
  /* + 0.0 turns -0.0 into 0.0: the dump writes -0.0 as -0, which JSON reads back as the integer
   * 0, so a signed zero would not survive a checkpoint (found by tests/fuzz). */
  case K_DOUBLE: *(double *)field(c, k) = v->d[0] + 0.0; break;
  case K_PAIR:
    v->d[0] += 0.0;
    v->d[1] += 0.0;
    memcpy(field(c, k), v->d, 2 * sizeof(double));
    break;
  case K_STR:
    free_owned(c, k);
    *(char **)field(c, k) = v->s;
    v->s = NULL;
    break;
  case K_PATHS:
    free_owned(c, k);
    *(struct tz_config_paths *)field(c, k) = v->paths;
    memset(&v->paths, 0, sizeof v->paths);
    break;
  case K_FIXED: break;
  }
  val_free(v);
}

static const struct key *find_key(const char *path) {
  for (int i = 0; i < N_KEYS; i++)
    if (strcmp(keys[i].path, path) == 0)
      return &keys[i];
  return NULL;
}

static int starts_section(const char *path, const char *section) {
  size_t n = strlen(section);
  return strncmp(path, section, n) == 0 && path[n] == '.';
}

static int is_known_ignored(const char *path) {
  for (int i = 0; i < N_KNOWN_IGNORED; i++)
    if (strcmp(known_ignored[i], path) == 0)
      return 1;
  return 0;
}

/* A section tierzero parses: some key lies under it. */
static int is_section(const char *path) {
  for (int i = 0; i < N_KEYS; i++)
    if (starts_section(keys[i].path, path))
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Messages */

/* A value being parsed and where it came from: "<file>: <json path>" or, for text, the variable
 * or path alone. */
struct where {
  const char *origin; /* file or string name; NULL for text values */
  const char *name;   /* JSON path, or environment variable */
  const json_t *json; /* the value, from a file */
  const char *text;   /* or the value, as text */
};

static int where_err(const struct where *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int where_err(const struct where *w, const char *fmt, ...) {
  char what[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (w->origin)
    return tz_err_set(TZ_ECONFIG, "%s: %s: %s", w->origin, w->name, what);
  return tz_err_set(TZ_ECONFIG, "%s: %s", w->name, what);
}

/* A JSON value as it would be written, shortened for a message. */
static void render_json(const json_t *v, char *buf, size_t len) {
  /* 15 digits: 0.9, not 0.90000000000000002 */
  char *s = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(15));
  if (!s) {
    snprintf(buf, len, "(unprintable)");
    return;
  }
  if (strlen(s) > 60)
    snprintf(buf, len, "%.57s...", s);
  else
    snprintf(buf, len, "%s", s);
  free(s);
}

/* Text quoted like a JSON string, shortened for a message. */
static void render_text(const char *text, char *buf, size_t len) {
  json_t *j = json_stringn_nocheck(text, strlen(text));
  if (!j) {
    snprintf(buf, len, "\"%.57s\"", text);
    return;
  }
  render_json(j, buf, len);
  json_decref(j);
}

static void fmt_num(double d, char *buf, size_t len) {
  /* The shortest form that reads back as the same double. */
  for (int prec = 1; prec <= 17; prec++) {
    snprintf(buf, len, "%.*g", prec, d);
    if (strtod(buf, NULL) == d)
      return;
  }
}

/* What k accepts, as the message's "expected ...". text: the value comes as text (env, set). */
static void describe(const struct key *k, int text, char *buf, size_t len) {
  char lo[32], hi[32];
  size_t n = 0;
  switch (k->type) {
  case K_BOOL:
    if (k->flags & F_AUTO)
      snprintf(buf, len, "%s", text ? "1, 0, true, false, yes, no, on, off or \"auto\""
                                    : "true, false or \"auto\"");
    else
      snprintf(buf, len, "%s", text ? "1, 0, true, false, yes, no, on or off" : "true or false");
    return;
  case K_FIXED:
    n = (size_t)snprintf(buf, len, "%s", k->def[0] != 0 ? "true" : "false");
    break;
  case K_INT:
  case K_I64: {
    int64_t natural = k->type == K_INT ? INT_MAX : INT64_MAX;
    if (k->imax >= natural && k->imin == 1)
      n = (size_t)snprintf(buf, len, "a positive integer");
    else if (k->imax >= natural && k->imin == 0)
      n = (size_t)snprintf(buf, len, "a non-negative integer");
    else if (k->imax >= natural)
      n = (size_t)snprintf(buf, len, "an integer >= %" PRId64, k->imin);
    else
      n = (size_t)snprintf(buf, len, "an integer in [%" PRId64 ", %" PRId64 "]", k->imin, k->imax);
    break;
  }
  case K_SIZE:
    n = (size_t)snprintf(buf, len, "%s", k->imin > 0 ? "a non-zero size like 64MiB"
                                                     : "a size like 64GiB");
    break;
  case K_DOUBLE:
  case K_PAIR:
    fmt_num(k->dmin, lo, sizeof lo);
    fmt_num(k->dmax, hi, sizeof hi);
    if (k->type == K_PAIR)
      n = (size_t)snprintf(buf, len, "%s", text ? "2 numbers \"a,b\"" : "an array of 2 numbers");
    else
      n = (size_t)snprintf(buf, len, "a number");
    if (isinf(k->dmax))
      n += (size_t)snprintf(buf + n, len - n, " %s %s", k->flags & F_MIN_OPEN ? ">" : ">=", lo);
    else
      n += (size_t)snprintf(buf + n, len - n, " in %c%s, %s%c", k->flags & F_MIN_OPEN ? '(' : '[',
                            lo, hi, k->flags & F_MAX_OPEN ? ')' : ']');
    break;
  case K_ENUM:
    n = (size_t)snprintf(buf, len, "one of");
    for (int i = 0, first = 1; i < k->n_names && n < len; i++) {
      if (!k->names[i])
        continue;
      n += (size_t)snprintf(buf + n, len - n, "%s %s", first ? "" : ",", k->names[i]);
      first = 0;
    }
    break;
  case K_STR: n = (size_t)snprintf(buf, len, "a non-empty string"); break;
  case K_PATHS:
    n = (size_t)snprintf(buf, len,
                         text ? "a ':'-separated list of 1 to %d directories"
                              : "a directory or an array of 1 to %d directories",
                         TZ_CONFIG_MAX_PATHS);
    break;
  }
  if ((k->flags & F_AUTO) && n < len)
    snprintf(buf + n, len - n, " or \"auto\"");
}

/* The value as given, for "got ...": JSON as written, text quoted. */
static void render_got(const struct where *w, char *buf, size_t len) {
  if (w->json)
    render_json(w->json, buf, len);
  else
    render_text(w->text, buf, len);
}

static int bad_value(const struct where *w, const struct key *k) {
  char want[160], got[80];
  describe(k, w->json == NULL, want, sizeof want);
  render_got(w, got, sizeof got);
  if (k->type == K_FIXED)
    return where_err(w, "only %s is supported, got %s", want, got);
  return where_err(w, "expected %s, got %s", want, got);
}

static int unknown_enum(const struct where *w, const struct key *k) {
  char want[160], got[80];
  describe(k, 0, want, sizeof want);
  render_got(w, got, sizeof got);
  /* "one of A, B" reads "(expected one of A, B)" */
  return where_err(w, "unknown value %s (expected %s)", got, want);
}

/* ------------------------------------------------------------------------------------------ */
/* Parsing values */

static int is_auto(const char *s) { return strcmp(s, "auto") == 0; }

static int in_drange(const struct key *k, double d) {
  if (!isfinite(d))
    return 0;
  if (k->flags & F_MIN_OPEN ? !(d > k->dmin) : !(d >= k->dmin))
    return 0;
  if (k->flags & F_MAX_OPEN ? !(d < k->dmax) : !(d <= k->dmax))
    return 0;
  return 1;
}

/* An integral double that fits int64_t. */
static int real_to_i64(double d, int64_t *out) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != trunc(d))
    return -1;
  *out = (int64_t)d;
  return 0;
}

int tz_config_parse_size(const char *s, uint64_t *out) {
  static const struct {
    const char *unit;
    uint64_t mult;
  } units[] = {
    {"B", 1},
    {"kB", 1000ull},
    {"KB", 1000ull},
    {"MB", 1000000ull},
    {"GB", 1000000000ull},
    {"TB", 1000000000000ull},
    {"PB", 1000000000000000ull},
    {"KiB", 1ull << 10},
    {"MiB", 1ull << 20},
    {"GiB", 1ull << 30},
    {"TiB", 1ull << 40},
    {"PiB", 1ull << 50},
  };
  const char *p = s;
  uint64_t v = 0;
  if (!isdigit((unsigned char)*p))
    return -1;
  for (; isdigit((unsigned char)*p); p++)
    if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, (uint64_t)(*p - '0'), &v))
      return -1;
  if (*p == ' ')
    p++;
  uint64_t mult = 1;
  if (*p) {
    mult = 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
      if (strcasecmp(p, units[i].unit) == 0)
        mult = units[i].mult;
    if (!mult)
      return -1;
  } else if (p != s && p[-1] == ' ') {
    return -1; /* a trailing space without a unit */
  }
  if (__builtin_mul_overflow(v, mult, &v) || v > (uint64_t)INT64_MAX)
    return -1;
  *out = v;
  return 0;
}

static int check_irange(const struct key *k, int64_t i) { return i >= k->imin && i <= k->imax; }

static int find_name(const struct key *k, const char *s) {
  for (int i = 0; i < k->n_names; i++) {
    if (!k->names[i])
      continue;
    if (k->flags & F_ICASE ? strcasecmp(k->names[i], s) == 0 : strcmp(k->names[i], s) == 0)
      return i;
  }
  return -1;
}

static int dup_str(const char *s, size_t n, char **out) {
  *out = strndup(s, n);
  return *out ? 0 : tz_err_set(TZ_ENOMEM, "config: out of memory");
}

/* A JSON value for k (not null). */
static int parse_json(const struct where *w, const struct key *k, json_t *j, struct val *v) {
  memset(v, 0, sizeof *v);
  if (json_is_string(j) && (k->flags & F_AUTO) && is_auto(json_string_value(j))) {
    v->is_default = 1;
    return 0;
  }
  switch (k->type) {
  case K_BOOL:
  case K_FIXED:
    if (!json_is_boolean(j))
      return bad_value(w, k);
    v->i = json_is_true(j);
    if (k->type == K_FIXED && v->i != (int64_t)k->def[0])
      return bad_value(w, k);
    return 0;
  case K_INT:
  case K_I64:
  case K_SIZE:
    if (json_is_integer(j))
      v->i = json_integer_value(j);
    else if (json_is_real(j)) {
      if (real_to_i64(json_real_value(j), &v->i) < 0)
        return bad_value(w, k);
    } else if (k->type == K_SIZE && json_is_string(j)) {
      uint64_t u;
      if (tz_config_parse_size(json_string_value(j), &u) < 0)
        return bad_value(w, k);
      v->i = (int64_t)u;
    } else {
      return bad_value(w, k);
    }
    return check_irange(k, v->i) ? 0 : bad_value(w, k);
  case K_DOUBLE:
    if (!json_is_number(j) || !in_drange(k, json_number_value(j)))
      return bad_value(w, k);
    v->d[0] = json_number_value(j);
    return 0;
  case K_PAIR:
    if (!json_is_array(j) || json_array_size(j) != 2)
      return bad_value(w, k);
    for (int i = 0; i < 2; i++) {
      json_t *e = json_array_get(j, (size_t)i);
      if (!json_is_number(e) || !in_drange(k, json_number_value(e)))
        return bad_value(w, k);
      v->d[i] = json_number_value(e);
    }
    return 0;
  case K_ENUM: {
    if (!json_is_string(j))
      return bad_value(w, k);
    int i = find_name(k, json_string_value(j));
    if (i < 0)
      return unknown_enum(w, k);
    v->i = i;
    return 0;
  }
  case K_STR:
    if (!json_is_string(j) || json_string_length(j) == 0 ||
        strlen(json_string_value(j)) != json_string_length(j))
      return bad_value(w, k);
    return dup_str(json_string_value(j), json_string_length(j), &v->s);
  case K_PATHS: {
    /* One string is a list of one. */
    size_t n = json_is_array(j) ? json_array_size(j) : 1;
    if (n < 1 || n > TZ_CONFIG_MAX_PATHS)
      return bad_value(w, k);
    for (size_t i = 0; i < n; i++) {
      json_t *e = json_is_array(j) ? json_array_get(j, i) : j;
      if (!json_is_string(e) || json_string_length(e) == 0 ||
          strlen(json_string_value(e)) != json_string_length(e)) {
        val_free(v);
        return bad_value(w, k);
      }
      int rc = dup_str(json_string_value(e), json_string_length(e), &v->paths.path[i]);
      if (rc < 0) {
        val_free(v);
        return rc;
      }
      v->paths.n = (int)i + 1;
    }
    return 0;
  }
  }
  return tz_err_set(TZ_EINVAL, "config: key %s has no parser", k->path);
}

static int parse_bool_text(const char *s, int64_t *out) {
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  for (int i = 0; i < 4; i++) {
    if (strcasecmp(s, yes[i]) == 0 || strcasecmp(s, no[i]) == 0) {
      *out = strcasecmp(s, yes[i]) == 0;
      return 0;
    }
  }
  return -1;
}

static int parse_double_text(const char *s, double *out) {
  char *end;
  errno = 0;
  double d = strtod(s, &end);
  if (end == s || *end || errno == ERANGE || !isfinite(d))
    return -1;
  *out = d;
  return 0;
}

/* Text for a string key must be UTF-8: the configuration is dumped as JSON (tz_config_dump),
 * which holds nothing else, and a string jansson refuses would be dumped as null. */
static int text_utf8(const struct where *w, const char *s, size_t n) {
  json_t *j = json_stringn(s, n);
  if (!j)
    return where_err(w, "not valid UTF-8 text");
  json_decref(j);
  return 0;
}

/* A value given as text (environment variable, command line) for k. */
static int parse_text(const struct where *w, const struct key *k, const char *s, struct val *v) {
  memset(v, 0, sizeof *v);
  if ((k->flags & F_AUTO) && is_auto(s)) {
    v->is_default = 1;
    return 0;
  }
  switch (k->type) {
  case K_BOOL:
  case K_FIXED:
    if (parse_bool_text(s, &v->i) < 0 || (k->type == K_FIXED && v->i != (int64_t)k->def[0]))
      return bad_value(w, k);
    return 0;
  case K_INT:
  case K_I64: {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (end == s || *end || errno == ERANGE || !check_irange(k, x))
      return bad_value(w, k);
    v->i = x;
    return 0;
  }
  case K_SIZE: {
    uint64_t u;
    if (tz_config_parse_size(s, &u) < 0 || !check_irange(k, (int64_t)u))
      return bad_value(w, k);
    v->i = (int64_t)u;
    return 0;
  }
  case K_DOUBLE:
    if (parse_double_text(s, &v->d[0]) < 0 || !in_drange(k, v->d[0]))
      return bad_value(w, k);
    return 0;
  case K_PAIR: {
    const char *comma = strchr(s, ',');
    char first[64];
    if (!comma || (size_t)(comma - s) >= sizeof first)
      return bad_value(w, k);
    memcpy(first, s, (size_t)(comma - s));
    first[comma - s] = '\0';
    if (parse_double_text(first, &v->d[0]) < 0 || parse_double_text(comma + 1, &v->d[1]) < 0 ||
        !in_drange(k, v->d[0]) || !in_drange(k, v->d[1]))
      return bad_value(w, k);
    return 0;
  }
  case K_ENUM: {
    int i = find_name(k, s);
    if (i < 0)
      return unknown_enum(w, k);
    v->i = i;
    return 0;
  }
  case K_STR:
    if (!*s)
      return bad_value(w, k);
    if (text_utf8(w, s, strlen(s)) < 0)
      return TZ_ECONFIG;
    return dup_str(s, strlen(s), &v->s);
  case K_PATHS:
    for (const char *p = s;;) {
      const char *colon = strchr(p, ':');
      size_t n = colon ? (size_t)(colon - p) : strlen(p);
      if (n == 0 || v->paths.n == TZ_CONFIG_MAX_PATHS) {
        val_free(v);
        return bad_value(w, k);
      }
      if (text_utf8(w, p, n) < 0) {
        val_free(v);
        return TZ_ECONFIG;
      }
      int rc = dup_str(p, n, &v->paths.path[v->paths.n]);
      if (rc < 0) {
        val_free(v);
        return rc;
      }
      v->paths.n++;
      if (!colon)
        return 0;
      p = colon + 1;
    }
  }
  return tz_err_set(TZ_EINVAL, "config: key %s has no parser", k->path);
}

/* ------------------------------------------------------------------------------------------ */
/* Did you mean */

/* Edit distance with adjacent transpositions, case-insensitive; strings longer than 63 are
 * treated as far from everything. */
static int distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 63 || m > 63)
    return INT_MAX;
  int d[64][64];
  for (size_t i = 0; i <= n; i++)
    d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++)
    d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++) {
    for (size_t j = 1; j <= m; j++) {
      int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
      int best = d[i - 1][j - 1] + (ca != cb);
      if (d[i - 1][j] + 1 < best)
        best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best)
        best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  }
  return d[n][m];
}

/* Considers the child of section (or top-level name) that known path lies under. */
static void consider(const char *known, const char *section, const char *name, int *best,
                     char *out, size_t len) {
  const char *rest = known;
  if (*section) {
    if (!starts_section(known, section))
      return;
    rest = known + strlen(section) + 1;
  }
  char child[64];
  size_t n = strcspn(rest, ".");
  if (n >= sizeof child)
    return;
  memcpy(child, rest, n);
  child[n] = '\0';
  size_t shorter = strlen(name) < n ? strlen(name) : n;
  int d = distance(name, child);
  /* Within 2 edits, and not a rewrite of most of a short name ("x" is not a typo of "lr"). */
  if (d <= 2 && (size_t)d < shorter && d < *best) {
    *best = d;
    snprintf(out, len, "%s", child);
  }
}

/* The known key of section closest to name, or 0 if none is close. */
static int suggest(const char *section, const char *name, char *out, size_t len) {
  int best = INT_MAX;
  for (int i = 0; i < N_KEYS; i++)
    consider(keys[i].path, section, name, &best, out, len);
  for (int i = 0; i < N_KNOWN_IGNORED; i++)
    consider(known_ignored[i], section, name, &best, out, len);
  return best != INT_MAX;
}

/* ------------------------------------------------------------------------------------------ */
/* Ignored keys */

static int add_ignored(struct tz_config *c, const char *path, const char *hint) {
  for (int i = 0; i < c->n_ignored_; i++)
    if (strcmp(c->ignored_[i].path, path) == 0)
      return 0;
  if (c->n_ignored_ == c->cap_ignored_) {
    int cap = c->cap_ignored_ ? 2 * c->cap_ignored_ : 8;
    struct tz_config_ignored_key *p = realloc(c->ignored_, (size_t)cap * sizeof *p);
    if (!p)
      return tz_err_set(TZ_ENOMEM, "config: out of memory");
    c->ignored_ = p;
    c->cap_ignored_ = cap;
  }
  struct tz_config_ignored_key *e = &c->ignored_[c->n_ignored_];
  e->path = strdup(path);
  e->hint = hint ? strdup(hint) : NULL;
  if (!e->path || (hint && !e->hint)) {
    free(e->path);
    free(e->hint);
    return tz_err_set(TZ_ENOMEM, "config: out of memory");
  }
  c->n_ignored_++;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Loading */

static char *join(const char *section, const char *name) {
  char *s = NULL;
  if (asprintf(&s, "%s%s%s", section, *section ? "." : "", name) < 0)
    return NULL;
  return s;
}

/* Walks one object. canon: its path in keys[] terms; shown: as the file spells it. */
static int walk(struct tz_config *c, const char *origin, json_t *obj, const char *canon,
                const char *shown) {
  const char *name;
  json_t *j;
  json_object_foreach(obj, name, j) {
    const char *cname = name;
    if (!*canon)
      for (size_t i = 0; i < sizeof section_aliases / sizeof section_aliases[0]; i++)
        if (strcmp(name, section_aliases[i].alias) == 0)
          cname = section_aliases[i].name;
    char *cpath = join(canon, cname), *spath = join(shown, name);
    int rc = 0;
    if (!cpath || !spath) {
      rc = tz_err_set(TZ_ENOMEM, "config: out of memory");
      goto next;
    }
    struct where w = {.origin = origin, .name = spath, .json = j};
    const struct key *k = find_key(cpath);
    if (json_is_null(j)) {
      /* null: not given */
    } else if (k) {
      struct val v;
      rc = parse_json(&w, k, j, &v);
      if (rc == 0)
        store(c, k, &v);
    } else if (is_section(cpath)) {
      if (!json_is_object(j)) {
        char got[80];
        render_got(&w, got, sizeof got);
        rc = where_err(&w, "expected an object, got %s", got);
      } else {
        rc = walk(c, origin, j, cpath, spath);
      }
    } else {
      char hint[64];
      int have_hint = !is_known_ignored(cpath) && suggest(canon, cname, hint, sizeof hint);
      if (have_hint)
        TZ_WARN("%s: %s: unknown key, ignored (did you mean %s?)", origin, spath, hint);
      rc = add_ignored(c, spath, have_hint ? hint : NULL);
    }
  next:
    free(cpath);
    free(spath);
    if (rc < 0)
      return rc;
  }
  return 0;
}

/* Rules between keys, checked after each layer. pre names the layer: the file, "environment",
 * or the key tz_config_set was given. */
static int finish(struct tz_config *c, const char *pre) {
  if (c->fp16.enabled && c->bf16.enabled)
    return tz_err_set(TZ_ECONFIG, "%s: fp16.enabled and bf16.enabled are both true: choose one",
                      pre);
  c->precision = c->bf16.enabled  ? TZ_PRECISION_BF16
                 : c->fp16.enabled ? TZ_PRECISION_FP16
                                   : TZ_PRECISION_FP32;
  /* DeepSpeed: AdamW is decoupled whatever adam_w_mode says. */
  if (c->optimizer.type == TZ_OPTIMIZER_ADAMW)
    c->optimizer.adam_w_mode = 1;
  if (c->tierzero.chunk_bytes > c->tierzero.staging_bytes)
    return tz_err_set(TZ_ECONFIG,
                      "%s: tierzero.chunk_bytes %" PRIu64
                      " is larger than tierzero.staging_bytes %" PRIu64,
                      pre, c->tierzero.chunk_bytes, c->tierzero.staging_bytes);
  return 0;
}

/* Applies a parsed document to a copy of c and keeps it only if everything is valid. */
static int load_json(struct tz_config *c, json_t *root, const char *origin) {
  if (!json_is_object(root)) {
    char got[80];
    render_json(root, got, sizeof got);
    return tz_err_set(TZ_ECONFIG, "%s: expected a JSON object at the top level, got %s", origin,
                      got);
  }
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  rc = walk(&tmp, origin, root, "", "");
  if (rc == 0)
    rc = finish(&tmp, origin);
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  if (tmp.scheduler.total_num_steps > 0 &&
      tmp.scheduler.total_num_steps < tmp.scheduler.warmup_num_steps)
    TZ_WARN("%s: scheduler.params.total_num_steps %" PRId64
            " is less than scheduler.params.warmup_num_steps %" PRId64,
            origin, tmp.scheduler.total_num_steps, tmp.scheduler.warmup_num_steps);
  tz_config_free(c);
  *c = tmp;
  return 0;
}

static int syntax_error(const char *origin, const json_error_t *e) {
  return tz_err_set(TZ_ECONFIG, "%s:%d:%d: JSON syntax error: %s", origin, e->line, e->column,
                    e->text);
}

/* DeepSpeed refuses duplicate keys too. */
#define JSON_FLAGS JSON_REJECT_DUPLICATES

int tz_config_load_string(struct tz_config *c, const char *json, const char *origin) {
  if (!origin)
    origin = "<string>";
  json_error_t e;
  json_t *root = json_loads(json, JSON_FLAGS, &e);
  if (!root)
    return syntax_error(origin, &e);
  int rc = load_json(c, root, origin);
  json_decref(root);
  return rc;
}

int tz_config_load_file(struct tz_config *c, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return tz_err_errno(errno, "config: cannot open %s", path);
  json_error_t e;
  json_t *root = json_loadf(f, JSON_FLAGS, &e);
  int read_error = ferror(f);
  fclose(f);
  if (!root) {
    if (read_error)
      return tz_err_set(TZ_EIO, "config: cannot read %s", path);
    return syntax_error(path, &e);
  }
  int rc = load_json(c, root, path);
  json_decref(root);
  return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* Environment and text */

static char env_names[N_KEYS][48];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* TZ_<KEY> for each key of the tierzero section. */
static void env_init(void) {
  for (int i = 0; i < N_KEYS; i++) {
    if (!starts_section(keys[i].path, "tierzero"))
      continue;
    const char *name = keys[i].path + strlen("tierzero.");
    size_t n = (size_t)snprintf(env_names[i], sizeof env_names[i], "TZ_");
    for (; *name && n + 1 < sizeof env_names[i]; name++)
      env_names[i][n++] = (char)toupper((unsigned char)*name);
    env_names[i][n] = '\0';
  }
}

static const char *env_name(int i) {
  pthread_once(&env_once, env_init);
  return env_names[i][0] ? env_names[i] : NULL;
}

/* Warns about TZ_* variables that look like a misspelt tierzero variable. */
static void warn_unknown_env(void) {
  for (char **e = environ; e && *e; e++) {
    if (strncmp(*e, "TZ_", 3) != 0)
      continue;
    char name[64];
    size_t n = strcspn(*e, "=");
    if (n >= sizeof name)
      continue;
    memcpy(name, *e, n);
    name[n] = '\0';
    int known = 0, best = INT_MAX, best_i = -1;
    for (int i = 0; i < N_KEYS && !known; i++) {
      const char *en = env_name(i);
      if (!en)
        continue;
      if (strcmp(en, name) == 0) {
        known = 1;
      } else {
        int d = distance(name + 3, en + 3);
        if (d < best) {
          best = d;
          best_i = i;
        }
      }
    }
    if (!known && best <= 2 && (size_t)best < strlen(name + 3))
      TZ_WARN("environment: %s is not a tierzero variable (did you mean %s?)", name,
              env_name(best_i));
  }
}

int tz_config_apply_env(struct tz_config *c) {
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  for (int i = 0; i < N_KEYS && rc == 0; i++) {
    const char *name = env_name(i);
    const char *s = name ? getenv(name) : NULL;
    if (!s || !*s)
      continue;
    struct where w = {.name = name, .text = s};
    struct val v;
    rc = parse_text(&w, &keys[i], s, &v);
    if (rc == 0)
      store(&tmp, &keys[i], &v);
  }
  if (rc == 0)
    rc = finish(&tmp, "environment");
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  warn_unknown_env();
  tz_config_free(c);
  *c = tmp;
  return 0;
}

int tz_config_set(struct tz_config *c, const char *path, const char *value) {
  const struct key *k = find_key(path);
  if (!k) {
    char hint[64], section[128];
    const char *dot = strrchr(path, '.');
    size_t n = dot ? (size_t)(dot - path) : 0;
    snprintf(section, sizeof section, "%.*s", (int)n, path);
    if (n < sizeof section && suggest(section, dot ? dot + 1 : path, hint, sizeof hint))
      return tz_err_set(TZ_ENOENT, "%s: unknown key (did you mean %s?)", path, hint);
    return tz_err_set(TZ_ENOENT, "%s: unknown key", path);
  }
  struct tz_config tmp;
  int rc = tz_config_copy(&tmp, c);
  if (rc < 0)
    return rc;
  struct where w = {.name = path, .text = value};
  struct val v;
  rc = parse_text(&w, k, value, &v);
  if (rc == 0) {
    store(&tmp, k, &v);
    rc = finish(&tmp, path);
  }
  if (rc < 0) {
    tz_config_free(&tmp);
    return rc;
  }
  tz_config_free(c);
  *c = tmp;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Batch sizes */

int tz_config_resolve_batch(struct tz_config *c, int world_size) {
  if (world_size < 1)
    return tz_err_set(TZ_EINVAL, "batch: world_size %d is not positive", world_size);
  int64_t tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu;
  int64_t gas = c->gradient_accumulation_steps, w = world_size, prod;
  if (tb > 0 && mb > 0 && gas > 0) {
    if (__builtin_mul_overflow(mb, gas, &prod) || __builtin_mul_overflow(prod, w, &prod) ||
        prod != tb)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " != train_micro_batch_size_per_gpu %" PRId64
                        " * gradient_accumulation_steps %" PRId64 " * world_size %d",
                        tb, mb, gas, world_size);
  } else if (tb > 0 && mb > 0) {
    if (__builtin_mul_overflow(mb, w, &prod) || tb % prod != 0)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " is not divisible by train_micro_batch_size_per_gpu %" PRId64
                        " * world_size %d",
                        tb, mb, world_size);
    gas = tb / prod;
  } else if (tb > 0) {
    if (gas <= 0)
      gas = 1;
    if (__builtin_mul_overflow(gas, w, &prod) || tb % prod != 0)
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_batch_size %" PRId64
                        " is not divisible by gradient_accumulation_steps %" PRId64
                        " * world_size %d",
                        tb, gas, world_size);
    mb = tb / prod;
  } else if (mb > 0) {
    if (gas <= 0)
      gas = 1;
    if (__builtin_mul_overflow(mb, gas, &tb) || __builtin_mul_overflow(tb, w, &tb))
      return tz_err_set(TZ_ECONFIG,
                        "batch: train_micro_batch_size_per_gpu %" PRId64
                        " * gradient_accumulation_steps %" PRId64 " * world_size %d overflows",
                        mb, gas, world_size);
  } else {
    return tz_err_set(TZ_ECONFIG,
                      "batch: neither train_batch_size nor train_micro_batch_size_per_gpu is set "
                      "(gradient_accumulation_steps %" PRId64 ", world_size %d)",
                      gas, world_size);
  }
  c->train_batch_size = tb;
  c->train_micro_batch_size_per_gpu = mb;
  c->gradient_accumulation_steps = gas;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Lifetime */

void tz_config_defaults(struct tz_config *c) {
  memset(c, 0, sizeof *c);
  for (int i = 0; i < N_KEYS; i++)
    set_default(c, &keys[i]);
  c->precision = TZ_PRECISION_FP32;
}

void tz_config_free(struct tz_config *c) {
  if (!c)
    return;
  for (int i = 0; i < N_KEYS; i++)
    free_owned(c, &keys[i]);
  for (int i = 0; i < c->n_ignored_; i++) {
    free(c->ignored_[i].path);
    free(c->ignored_[i].hint);
  }
  free(c->ignored_);
  c->ignored_ = NULL;
  c->n_ignored_ = c->cap_ignored_ = 0;
}

int tz_config_copy(struct tz_config *dst, const struct tz_config *src) {
  memcpy(dst, src, sizeof *dst);
  /* dst now aliases src's strings: detach them all before duplicating any. */
  for (int i = 0; i < N_KEYS; i++)
    if (keys[i].type == K_STR)
      *(char **)field(dst, &keys[i]) = NULL;
    else if (keys[i].type == K_PATHS)
      memset(field(dst, &keys[i]), 0, sizeof(struct tz_config_paths));
  dst->ignored_ = NULL;
  dst->n_ignored_ = dst->cap_ignored_ = 0;
  for (int i = 0; i < N_KEYS; i++) {
    const struct key *k = &keys[i];
    if (k->type == K_STR) {
      const char *s = *(char *const *)cfield(src, k);
      if (s && !(*(char **)field(dst, k) = strdup(s)))
        goto oom;
    } else if (k->type == K_PATHS) {
      const struct tz_config_paths *sp = cfield(src, k);
      struct tz_config_paths *dp = field(dst, k);
      for (int j = 0; j < sp->n; j++) {
        if (!(dp->path[j] = strdup(sp->path[j])))
          goto oom;
        dp->n = j + 1;
      }
    }
  }
  for (int i = 0; i < src->n_ignored_; i++)
    if (add_ignored(dst, src->ignored_[i].path, src->ignored_[i].hint) < 0)
      goto oom;
  return 0;
oom:
  tz_config_free(dst);
  tz_config_defaults(dst);
  return tz_err_set(TZ_ENOMEM, "config: out of memory copying the configuration");
}

int tz_config_ignored_count(const struct tz_config *c) { return c->n_ignored_; }

const char *tz_config_ignored(const struct tz_config *c, int i) {
  return i >= 0 && i < c->n_ignored_ ? c->ignored_[i].path : NULL;
}

const char *tz_config_ignored_hint(const struct tz_config *c, int i) {
  return i >= 0 && i < c->n_ignored_ ? c->ignored_[i].hint : NULL;
}

int tz_config_key_count(void) { return N_KEYS; }
const char *tz_config_key(int i) { return i >= 0 && i < N_KEYS ? keys[i].path : NULL; }
const char *tz_config_key_env(int i) { return i >= 0 && i < N_KEYS ? env_name(i) : NULL; }

/* ------------------------------------------------------------------------------------------ */
/* Dump */

static void dump_string(FILE *f, const char *s) {
  json_t *j = json_string(s);
  char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
  fputs(t ? t : "null", f);
  free(t);
  json_decref(j);
}

static void dump_value(FILE *f, const struct tz_config *c, const struct key *k) {
  char num[40];
  switch (k->type) {
  case K_BOOL: /* below 0: "auto", a default outside 0/1 (F_AUTO) */
    fputs(get_int(c, k) < 0 ? "\"auto\"" : get_int(c, k) ? "true" : "false", f);
    return;
  case K_ENUM: {
    int v = get_int(c, k);
    if (v >= 0 && v < k->n_names && k->names[v])
      fprintf(f, "\"%s\"", k->names[v]);
    else
      fputs("null", f);
    return;
  }
  case K_INT:
  case K_I64:
  case K_SIZE: {
    int64_t v = k->type == K_INT   ? get_int(c, k)
                : k->type == K_I64 ? *(const int64_t *)cfield(c, k)
                                   : (int64_t)*(const uint64_t *)cfield(c, k);
    /* Out of range is the "not set" default. */
    if (check_irange(k, v))
      fprintf(f, "%" PRId64, v);
    else
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
    return;
  }
  case K_DOUBLE: {
    double d = *(const double *)cfield(c, k);
    if (!in_drange(k, d)) {
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
      return;
    }
    fmt_num(d, num, sizeof num);
    fputs(num, f);
    return;
  }
  case K_PAIR: {
    const double *d = cfield(c, k);
    fmt_num(d[0], num, sizeof num);
    fprintf(f, "[%s, ", num);
    fmt_num(d[1], num, sizeof num);
    fprintf(f, "%s]", num);
    return;
  }
  case K_STR: {
    const char *s = *(char *const *)cfield(c, k);
    if (s)
      dump_string(f, s);
    else
      fputs("null", f);
    return;
  }
  case K_PATHS: {
    const struct tz_config_paths *p = cfield(c, k);
    if (p->n == 0) {
      fputs("null", f);
      return;
    }
    fputc('[', f);
    for (int i = 0; i < p->n; i++) {
      if (i)
        fputs(", ", f);
      dump_string(f, p->path[i]);
    }
    fputc(']', f);
    return;
  }
  case K_FIXED: return;
  }
}

/* Splits a path into at most max components of at most 63 characters; returns the count. */
static int split_path(const char *path, char comp[][64], int max) {
  int n = 0;
  for (const char *p = path; *p && n < max; n++) {
    size_t len = strcspn(p, ".");
    snprintf(comp[n], 64, "%.*s", (int)len, p);
    p += len;
    if (*p == '.')
      p++;
  }
  return n;
}

int tz_config_dump(const struct tz_config *c, FILE *f) {
  enum { MAXD = 6 };
  char open[MAXD][64]; /* the sections open now, outermost first */
  int depth = 0;
  fputc('{', f);
  int first = 1;
  for (int i = 0; i < N_KEYS; i++) {
    const struct key *k = &keys[i];
    if (k->type == K_FIXED)
      continue;
    char comp[MAXD + 1][64];
    int n = split_path(k->path, comp, MAXD + 1);
    int common = 0;
    while (common < depth && common < n - 1 && strcmp(open[common], comp[common]) == 0)
      common++;
    for (; depth > common; depth--)
      fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
    for (; depth < n - 1; depth++) {
      fprintf(f, "%s\n%*s\"%s\": {", first ? "" : ",", 2 * depth + 2, "", comp[depth]);
      snprintf(open[depth], sizeof open[depth], "%s", comp[depth]);
      first = 1;
    }
    fprintf(f, "%s\n%*s\"%s\": ", first ? "" : ",", 2 * depth + 2, "", comp[n - 1]);
    dump_value(f, c, k);
    first = 0;
  }
  for (; depth > 0; depth--)
    fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
  fputs("\n}\n", f);
  if (ferror(f))
    return tz_err_errno(errno ? errno : EIO, "config: cannot write the configuration");
  return 0;
}
