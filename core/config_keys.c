/* The key table: every key tierzero reads, with its type, range and default; the DeepSpeed keys
 * it knows and ignores; and the lookups in it (by path, by likeness, by environment name). */
#define _GNU_SOURCE
#include "core/config_internal.h"

#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/tier.h"

_Static_assert(TZ_CONFIG_MAX_PATHS == TZ_MAX_PATHS, "one limit on NVMe directories");
/* Enum fields are read and written as int through the table. */
_Static_assert(sizeof(enum tz_optimizer_type) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_lr_schedule) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_warmup_type) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_offload_device) == sizeof(int), "enum stored as int");
_Static_assert(sizeof(enum tz_precision) == sizeof(int), "enum stored as int");
_Static_assert(TZ_LOG_ERROR == 0 && TZ_LOG_TRACE == 4, "log level names below follow the enum");

/* The key macros and the tables below are aligned by hand. */
/* clang-format off */
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
/* A string that may be "" (a value, not "not set"). */
#define STR_EMPTY(p, f)                                                                            \
  {.path = p, .type = _Generic(FT(f), char *: K_STR), .off = OFF(f), .flags = F_EMPTY}
/* A backend's setting: its text in the config's slot s, for backend b's setting n. */
#define SETTING(p, b, n, s)                                                                        \
  {.path = p, .type = K_STR, .off = OFF(setting_[s]), .flags = F_BACKEND, .backend = b,          \
   .setting = n}
#define PATHS(p, f)                                                                                \
  {.path = p, .type = _Generic(FT(f), struct tz_config_paths: K_PATHS), .off = OFF(f)}
#define FIXED(p, v) {.path = p, .type = K_FIXED, .imin = 0, .imax = 1, .def = {v}}
/* The same with the reason the other value is refused, added to the message. */
#define FIXED_WHY(p, v, w) {.path = p, .type = K_FIXED, .imin = 0, .imax = 1, .def = {v}, .why = w}
/* DeepSpeed keys tierzero accepts and checks as DeepSpeed does but has no use for: no field, no
 * default, nothing stored and nothing dumped. */
#define NO_BOOL(p) {.path = p, .type = K_BOOL, .imin = 0, .imax = 1, .flags = F_NO_FIELD}
#define NO_INT(p, lo, hi, fl)                                                                      \
  {.path = p, .type = K_INT, .imin = lo, .imax = hi, .flags = (fl) | F_NO_FIELD}
#define NO_I64(p, lo, fl)                                                                          \
  {.path = p, .type = K_I64, .imin = lo, .imax = INT64_MAX, .flags = (fl) | F_NO_FIELD}
#define NO_DBL(p, lo, hi, fl)                                                                      \
  {.path = p, .type = K_DOUBLE, .dmin = lo, .dmax = hi, .flags = (fl) | F_NO_FIELD}

static const char *const optimizer_names[] = {"Adam", "AdamW"};
static const char *const schedule_names[] = {NULL, "WarmupLR", "WarmupDecayLR", "WarmupCosineLR"};
static const char *const warmup_names[] = {"log", "linear"};
static const char *const device_names[] = {"none", "cpu", "nvme"};
static const char *const precision_names[] = {"fp32", "fp16", "bf16"};
static const char *const log_names[] = {"error", "warn", "info", "debug", "trace"};
static const char *const long_doc_names[] = {"cut", "split"};
/* "auto", then device_names' in their order: tierzero.offload_activations - 1 is a device */
static const char *const act_device_names[] = {"auto", "none", "cpu", "nvme"};
_Static_assert(TZ_OFFLOAD_NONE == 0 && TZ_OFFLOAD_CPU == 1 && TZ_OFFLOAD_NVME == 2,
               "act_device_names follow device_names");

/* Keys of one section are contiguous: tz_config_dump nests by walking this order. */
const struct key tz_config_keys[] = {
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
  NO_BOOL("optimizer.params.torch_adam"),
  FIXED("optimizer.params.amsgrad", 0),
  FIXED("optimizer.params.bias_correction", 1),
  ENUM("scheduler.type", scheduler.type, schedule_names, TZ_LR_CONSTANT, 0),
  DBL("scheduler.params.warmup_min_lr", scheduler.warmup_min_lr, 0, INFINITY, 0, F_AUTO),
  /* not set (-1): WarmupLR's peak is optimizer.params.lr, WarmupDecayLR's 0.001 (trainer/step/lr.c) */
  DBL("scheduler.params.warmup_max_lr", scheduler.warmup_max_lr, 0, INFINITY, -1, F_AUTO),
  I64("scheduler.params.warmup_num_steps", scheduler.warmup_num_steps, 0, 1000,
      F_AUTO | F_AUTO_UNSET),
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
  NO_BOOL("zero_optimization.offload_param.pin_memory"),
  NO_INT("zero_optimization.offload_param.buffer_count", 1, INT_MAX, 0),
  NO_I64("zero_optimization.offload_param.buffer_size", 1, 0),
  NO_I64("zero_optimization.offload_param.max_in_cpu", 0, 0),
  ENUM("zero_optimization.offload_optimizer.device", zero_optimization.offload_optimizer.device,
       device_names, TZ_OFFLOAD_NONE, 0),
  STR("zero_optimization.offload_optimizer.nvme_path",
      zero_optimization.offload_optimizer.nvme_path),
  NO_BOOL("zero_optimization.offload_optimizer.pin_memory"),
  NO_INT("zero_optimization.offload_optimizer.buffer_count", 1, INT_MAX, 0),
  NO_BOOL("zero_optimization.offload_optimizer.fast_init"),
  NO_DBL("zero_optimization.offload_optimizer.ratio", 0, 1, 0),
  NO_I64("zero_optimization.stage3_prefetch_bucket_size", 0, F_AUTO),
  NO_I64("zero_optimization.stage3_max_live_parameters", 0, 0),
  NO_I64("zero_optimization.stage3_max_reuse_distance", 0, 0),
  NO_I64("zero_optimization.stage3_param_persistence_threshold", 0, F_AUTO),
  BOOL("zero_optimization.overlap_comm", zero_optimization.overlap_comm, 1),
  NO_BOOL("zero_optimization.contiguous_gradients"),
  NO_I64("zero_optimization.reduce_bucket_size", 1, F_AUTO),
  /* 0 accepted as DeepSpeed does (Axolotl's shipped zero3 configs use it) */
  NO_I64("zero_optimization.sub_group_size", 0, 0),
  I64("aio.block_size", aio.block_size, 1, 1048576, 0),
  NO_INT("aio.queue_depth", 1, 32768, 0),
  NO_INT("aio.thread_count", 1, 1024, 0),
  NO_BOOL("aio.single_submit"),
  NO_BOOL("aio.overlap_events"),
  NO_BOOL("activation_checkpointing.partition_activations"),
  BOOL("activation_checkpointing.cpu_checkpointing", activation_checkpointing.cpu_checkpointing, 0),
  NO_BOOL("activation_checkpointing.contiguous_memory_optimization"),
  NO_INT("activation_checkpointing.number_checkpoints", 1, INT_MAX, F_AUTO),
  NO_BOOL("activation_checkpointing.synchronize_checkpoint_boundary"),
  NO_BOOL("activation_checkpointing.profile"),
  NO_I64("steps_per_print", 1, 0),
  NO_BOOL("wall_clock_breakdown"),
  DBL("gradient_predivide_factor", gradient_predivide_factor, 0, INFINITY, 1, F_MIN_OPEN),
  BOOL("prescale_gradients", prescale_gradients, 0),
  ENUM("communication_data_type", communication_data_type, precision_names, TZ_PRECISION_FP32, 0),
  I64("seed", seed, 0, 42, 0),
  /* DeepSpeed's monitors (trainer/run/monitor.h; DeepSpeed's deepspeed/monitor/config.py) */
  BOOL("tensorboard.enabled", tensorboard.enabled, 0),
  STR_EMPTY("tensorboard.output_path", tensorboard.output_path),
  STR_EMPTY("tensorboard.job_name", tensorboard.job_name),
  BOOL("csv_monitor.enabled", csv_monitor.enabled, 0),
  STR_EMPTY("csv_monitor.output_path", csv_monitor.output_path),
  STR_EMPTY("csv_monitor.job_name", csv_monitor.job_name),
  FIXED_WHY("wandb.enabled", 0,
            "tierzero has no W&B client; the tensorboard section writes TensorBoard events "
            "during the run (`wandb sync` uploads that directory to W&B) and csv_monitor CSV "
            "files"),
  /* tierzero's own keys; each is also the environment variable TZ_<KEY> */
  STR("tierzero.model", tierzero.model),
  STR("tierzero.data", tierzero.data),
  DBL("tierzero.epochs", tierzero.epochs, 0, 1e6, 0, 0),
  DBL("tierzero.warmup_ratio", tierzero.warmup_ratio, 0, 1, 0, F_MAX_OPEN),
  ENUM("tierzero.long_documents", tierzero.long_documents, long_doc_names, 0, 0),
  ENUM("tierzero.offload_activations", tierzero.offload_activations, act_device_names, 0, 0),
  SIZE("tierzero.hbm_budget", tierzero.hbm_budget, 0, 0, 0),
  SIZE("tierzero.host_budget", tierzero.host_budget, 0, 0, 0),
  SIZE("tierzero.nvme_budget", tierzero.nvme_budget, 0, 0, 0),
  PATHS("tierzero.nvme_path", tierzero.nvme_path),
  BOOL("tierzero.nvme_checksum", tierzero.nvme_checksum, 1),
  BOOL("tierzero.nvme_buffered", tierzero.nvme_buffered, 0),
  SIZE("tierzero.staging_bytes", tierzero.staging_bytes, 1, 64 << 20, 0),
  SIZE("tierzero.chunk_bytes", tierzero.chunk_bytes, 1, 4 << 20, 0),
  INT("tierzero.queue_depth", tierzero.queue_depth, 0, 32768, 0, 0),
  SIZE("tierzero.nvme_stage_bytes", tierzero.nvme_stage_bytes, 1, 32 << 20, 0),
  INT("tierzero.nvme_stage_chunks", tierzero.nvme_stage_chunks, 1, 16, 2, 0),
  STR("tierzero.faults", tierzero.faults),
  INT("tierzero.lookahead", tierzero.lookahead, -1, 65536, -1, 0),
  INT("tierzero.plan_widen_moves", tierzero.plan_widen_moves, 0, 4096, 12, 0),
  INT("tierzero.jitter_us", tierzero.jitter_us, 0, 10000000, 0, 0),
  BOOL("tierzero.sched_debug", tierzero.sched_debug, 0),
  BOOL("tierzero.wait_for_write_back", tierzero.wait_for_write_back, 1),
  BOOLA("tierzero.window_carry", tierzero.window_carry, -1),
  BOOL("tierzero.defer_rewrite", tierzero.defer_rewrite, 1),
  SIZE("tierzero.copy_queue", tierzero.copy_queue, 0, 512ull << 20, 0),
  ENUM("tierzero.log", tierzero.log, log_names, TZ_LOG_WARN, 0),
  I64("tierzero.trace_step", tierzero.trace_step, -1, -1, 0),
  INT("tierzero.threads", tierzero.threads, 0, 4096, 0, 0),
  DBL("tierzero.cpu_adam", tierzero.cpu_adam, 0, 1, -1, 0),
  BOOLA("tierzero.cpu_adam_search", tierzero.cpu_adam_search, -1),
  BOOLA("tierzero.overlap_collectives", tierzero.overlap_collectives, -1),
  INT("tierzero.numa_node", tierzero.numa_node, -1, 1023, -1, 0),
  INT("tierzero.device", tierzero.device, -1, 1023, -1, 0),
  /* the cuda backend's (kernels/cuda/choice.c says what they accept and mean) */
  SETTING("tierzero.cuda_attention", "cuda", "attention", 0),
  SETTING("tierzero.cuda_matmul", "cuda", "matmul", 1),
  SETTING("tierzero.cuda_variants", "cuda", "variants", 2),
  SETTING("tierzero.cuda_norm_bwd", "cuda", "norm_bwd", 3),
  SETTING("tierzero.cuda_softcap_tanh", "cuda", "softcap_tanh", 6),
  /* the hbm tier's (tiers/hbm.c) */
  SETTING("tierzero.gds", "hbm", "gds", 4),
  SETTING("tierzero.hbm_pin_piece", "hbm", "pin_piece", 5),
  DBL("tierzero.comm_timeout", tierzero.comm_timeout, 0, INFINITY, 300, F_MIN_OPEN),
  DBL("tierzero.stop_grace", tierzero.stop_grace, 0, 86400, 0, 0),
  PATHS("tierzero.weight_decay_exclude", tierzero.weight_decay_exclude),
  PATHS("tierzero.recompute", tierzero.recompute),
};
/* clang-format on */
#define N_KEYS ((int)(sizeof tz_config_keys / sizeof tz_config_keys[0]))
const int tz_config_n_keys = N_KEYS;

/* DeepSpeed keys tierzero knows and deliberately does not use: listed as ignored, never given a
 * "did you mean". A section listed here is ignored whole. */
/* clang-format off */
static const char *const known_ignored[] = {
  "comet", "monitor_config", "wandb.group", "wandb.team", "wandb.project", "flops_profiler",
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
  "zero_optimization.elastic_checkpoint",
  "zero_optimization.stage3_gather_16bit_weights_on_model_save",
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
/* clang-format on */
#define N_KNOWN_IGNORED ((int)(sizeof known_ignored / sizeof known_ignored[0]))

/* Older DeepSpeed spellings of a top-level section. */
static const struct { const char *alias, *name; } section_aliases[] = {{"bfloat16", "bf16"}};

const char *tz_config_section_alias(const char *name) {
  const char *canon = name;
  for (size_t i = 0; i < sizeof section_aliases / sizeof section_aliases[0]; i++)
    if (strcmp(name, section_aliases[i].alias) == 0)
      canon = section_aliases[i].name;
  return canon;
}

void tz_config_free_owned(struct tz_config *c, const struct key *k) {
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
void tz_config_set_default(struct tz_config *c, const struct key *k) {
  if (k->flags & F_NO_FIELD)
    return;
  switch (k->type) {
  case K_BOOL:
  case K_INT:
  case K_ENUM: set_int(c, k, (int)k->def[0]); break;
  case K_I64: *(int64_t *)field(c, k) = (int64_t)k->def[0]; break;
  case K_SIZE: *(uint64_t *)field(c, k) = (uint64_t)k->def[0]; break;
  case K_DOUBLE: *(double *)field(c, k) = k->def[0]; break;
  case K_PAIR: memcpy(field(c, k), k->def, 2 * sizeof(double)); break;
  case K_STR:
  case K_PATHS: tz_config_free_owned(c, k); break;
  case K_FIXED: break;
  }
}

/* "auto" is what Hugging Face's Trainer writes for DeepSpeed to be filled from its
 * TrainingArguments (integrations/deepspeed.py, trainer_config_process), so a key left "auto"
 * takes those arguments' defaults where they differ from tierzero's own: learning_rate 5e-5,
 * max_grad_norm 1.0, warmup_steps 0 (refused at the run's start
 * unless --warmup-ratio fills it: DeepSpeed 0.19 refuses a warm-up of 0). betas (0.9, 0.999),
 * eps 1e-8 and weight_decay 0 are tierzero's defaults too; per_device_train_batch_size 8 is
 * the micro-batch's when no batch size is given (tz_config_resolve_batch). The flags named as the
 * Trainer's
 * arguments (--learning-rate, ...) set the keys after the files, as the Trainer fills them. */
void tz_config_set_auto(struct tz_config *c, const struct key *k) {
  if (strcmp(k->path, "optimizer.params.lr") == 0)
    c->optimizer.lr = 5e-5;
  else if (strcmp(k->path, "gradient_clipping") == 0)
    c->gradient_clipping = 1.0;
  else if (strcmp(k->path, "scheduler.params.warmup_num_steps") == 0)
    c->scheduler.warmup_num_steps = 0;
}

void tz_config_val_free(struct val *v) {
  free(v->s);
  for (int i = 0; i < v->paths.n; i++)
    free(v->paths.path[i]);
  memset(v, 0, sizeof *v);
}

_Static_assert(N_KEYS <= 64 * TZ_CONFIG_KEY_WORDS, "TZ_CONFIG_KEY_WORDS has room for every key");

static void bit_set(uint64_t *bits, int i, int on) {
  if (on)
    bits[i / 64] |= 1ull << (i % 64);
  else
    bits[i / 64] &= ~(1ull << (i % 64));
}

static int bit_get(const uint64_t *bits, int i) { return (bits[i / 64] >> (i % 64)) & 1; }

/* Moves v into c (v's strings now belong to c). */
void tz_config_store(struct tz_config *c, const struct key *k, struct val *v) {
  int idx = (int)(k - tz_config_keys);
  if (idx >= 0 && idx < N_KEYS) {
    /* The last source to set a key decides whether it is "auto". */
    bit_set(c->auto_, idx, v->is_default && !(k->flags & F_NO_FIELD));
    bit_set(c->given_, idx, 1);
    if (k->flags & F_NO_FIELD)
      bit_set(c->no_effect_, idx, 1);
  }
  if (k->flags & F_NO_FIELD) {
    tz_config_val_free(v);
    return;
  }
  if (v->is_default) {
    tz_config_set_default(c, k);
    tz_config_set_auto(c, k);
    tz_config_val_free(v);
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
    tz_config_free_owned(c, k);
    *(char **)field(c, k) = v->s;
    v->s = NULL;
    break;
  case K_PATHS:
    tz_config_free_owned(c, k);
    *(struct tz_config_paths *)field(c, k) = v->paths;
    memset(&v->paths, 0, sizeof v->paths);
    break;
  case K_FIXED: break;
  }
  tz_config_val_free(v);
}

const struct key *tz_config_find_key(const char *path) {
  for (int i = 0; i < N_KEYS; i++)
    if (strcmp(tz_config_keys[i].path, path) == 0)
      return &tz_config_keys[i];
  return NULL;
}

static int starts_section(const char *path, const char *section) {
  size_t n = strlen(section);
  return strncmp(path, section, n) == 0 && path[n] == '.';
}

int tz_config_is_known_ignored(const char *path) {
  for (int i = 0; i < N_KNOWN_IGNORED; i++)
    if (strcmp(known_ignored[i], path) == 0)
      return 1;
  return 0;
}

/* A section tierzero parses: some key lies under it. */
int tz_config_is_section(const char *path) {
  for (int i = 0; i < N_KEYS; i++)
    if (starts_section(tz_config_keys[i].path, path))
      return 1;
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Did you mean */

/* Edit distance with adjacent transpositions, case-insensitive; strings longer than 63 are
 * treated as far from everything. */
int tz_config_distance(const char *a, const char *b) {
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
static void consider(const char *known, const char *section, const char *name, int *best, char *out,
                     size_t len) {
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
  int d = tz_config_distance(name, child);
  /* Within 2 edits, and not a rewrite of most of a short name ("x" is not a typo of "lr"). */
  if (d <= 2 && (size_t)d < shorter && d < *best) {
    *best = d;
    snprintf(out, len, "%s", child);
  }
}

/* The known key of section closest to name, or 0 if none is close. */
int tz_config_suggest(const char *section, const char *name, char *out, size_t len) {
  int best = INT_MAX;
  for (int i = 0; i < N_KEYS; i++)
    consider(tz_config_keys[i].path, section, name, &best, out, len);
  for (int i = 0; i < N_KNOWN_IGNORED; i++)
    consider(known_ignored[i], section, name, &best, out, len);
  return best != INT_MAX;
}

/* Environment names */

static char env_names[N_KEYS][48];
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

/* TZ_<KEY> for each key of the tierzero section. */
static void env_init(void) {
  for (int i = 0; i < N_KEYS; i++) {
    if (!starts_section(tz_config_keys[i].path, "tierzero"))
      continue;
    const char *name = tz_config_keys[i].path + strlen("tierzero.");
    size_t n = (size_t)snprintf(env_names[i], sizeof env_names[i], "TZ_");
    for (; *name && n + 1 < sizeof env_names[i]; name++)
      env_names[i][n++] = (char)toupper((unsigned char)*name);
    env_names[i][n] = '\0';
  }
}

const char *tz_config_env_name(int i) {
  pthread_once(&env_once, env_init);
  return env_names[i][0] ? env_names[i] : NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* Keys given "auto", keys without effect */

/* The path of the i-th key (0-based) whose bit is set, or NULL; *count gets how many are set. */
static const char *nth_set(const uint64_t *bits, int i, int *count) {
  int n = 0;
  const char *hit = NULL;
  for (int k = 0; k < N_KEYS; k++)
    if (bit_get(bits, k) && n++ == i)
      hit = tz_config_keys[k].path;
  *count = n;
  return hit;
}

int tz_config_auto_count(const struct tz_config *c) {
  int n;
  nth_set(c->auto_, -1, &n);
  return n;
}

const char *tz_config_auto_key(const struct tz_config *c, int i) {
  int n;
  return i < 0 ? NULL : nth_set(c->auto_, i, &n);
}

int tz_config_no_effect_count(const struct tz_config *c) {
  int n;
  nth_set(c->no_effect_, -1, &n);
  return n;
}

const char *tz_config_no_effect_key(const struct tz_config *c, int i) {
  int n;
  return i < 0 ? NULL : nth_set(c->no_effect_, i, &n);
}

int tz_config_is_auto(const struct tz_config *c, const char *path) {
  const struct key *k = tz_config_find_key(path);
  return k && bit_get(c->auto_, (int)(k - tz_config_keys));
}

/* ------------------------------------------------------------------------------------------ */
/* Backend settings */

int tz_config_backend_setting(const struct tz_config *c, int i, const char **key,
                              const char **backend, const char **setting, const char **value) {
  int n = 0;
  for (int k = 0; k < N_KEYS; k++) {
    const struct key *kk = &tz_config_keys[k];
    if (!(kk->flags & F_BACKEND))
      continue;
    const char *v = *(char *const *)((const char *)c + kk->off);
    if (!v || n++ != i)
      continue;
    *key = kk->path;
    *backend = kk->backend;
    *setting = kk->setting;
    *value = v;
    return 1;
  }
  return 0;
}

int tz_config_backend_settings(const struct tz_config *c, const char *backend, char *buf,
                               size_t len) {
  size_t at = 0;
  const char *key, *b, *name, *value;
  buf[0] = '\0';
  for (int i = 0; tz_config_backend_setting(c, i, &key, &b, &name, &value); i++) {
    if (strcmp(b, backend) != 0)
      continue;
    int n = snprintf(buf + at, len - at, "%s%s=%s", at ? "," : "", name, value);
    if (n < 0 || (size_t)n >= len - at)
      return tz_err_set(TZ_EINVAL, "config: the %s backend's settings are longer than %zu bytes",
                        backend, len);
    at += (size_t)n;
  }
  return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Keys given */

int tz_config_section_given(const struct tz_config *c, const char *section) {
  size_t n = strlen(section);
  for (int k = 0; k < N_KEYS; k++) {
    const char *p = tz_config_keys[k].path;
    if (bit_get(c->given_, k) && strncmp(p, section, n) == 0 && (p[n] == '.' || p[n] == '\0'))
      return 1;
  }
  return 0;
}

void tz_config_given_clear(struct tz_config *c) { memset(c->given_, 0, sizeof c->given_); }

/* ------------------------------------------------------------------------------------------ */
/* Settings of one run */

/* Test and diagnostic settings, and where the run's monitors write: the run that asked for them
 * has them, its checkpoints do not. */
static const char *const run_only[] = {
    "tierzero.faults",         "tierzero.log",         "tierzero.jitter_us",
    "tierzero.sched_debug",    "tierzero.trace_step",  "tensorboard.enabled",
    "tensorboard.output_path", "tensorboard.job_name", "csv_monitor.enabled",
    "csv_monitor.output_path", "csv_monitor.job_name"};

void tz_config_forget_run(struct tz_config *c) {
  for (size_t i = 0; i < sizeof run_only / sizeof run_only[0]; i++) {
    const struct key *k = tz_config_find_key(run_only[i]);
    if (k)
      tz_config_set_default(c, k);
  }
}
