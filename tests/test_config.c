/* Configuration: defaults, DeepSpeed files as users write them, "auto", the tierzero section,
 * every kind of rejected input with its message, environment overrides, ignored keys with their
 * suggestions, batch-size resolution, the dump read back, and the documentation's coverage. */
#define _GNU_SOURCE
#include "testlib.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/comm_impl.h" /* tz_comm_timeout, tz_comm_env_timeout */
#include "core/config.h"
#include "core/error.h"
#include "core/log.h"

/* Exact double comparison: every value below is written in the file exactly as expected. */
#define ASSERT_DBL(a, b)                                                                           \
  do {                                                                                             \
    double a_ = (a), b_ = (b);                                                                     \
    if (a_ != b_)                                                                                  \
      print_error("%s = %.17g, expected %.17g\n", #a, a_, b_);                                     \
    assert_true(a_ == b_);                                                                         \
  } while (0)

#define ASSERT_MSG_HAS(sub)                                                                        \
  do {                                                                                             \
    if (!strstr(tz_err_msg(), (sub)))                                                              \
      print_error("message \"%s\" lacks \"%s\"\n", tz_err_msg(), (sub));                           \
    assert_non_null(strstr(tz_err_msg(), (sub)));                                                  \
  } while (0)

static char *data_path(const char *name) {
  const char *dir = getenv("TZ_TEST_DATA");
  char *p = NULL;
  if (asprintf(&p, "%s/config/%s", dir ? dir : "tests/data", name) < 0)
    return NULL;
  return p;
}

/* The effective configuration as a string (caller frees). */
static char *dump_string(const struct tz_config *c) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  assert_non_null(f);
  TZ_ASSERT_OK(tz_config_dump(c, f));
  fclose(f);
  return buf;
}

static void load_data(struct tz_config *c, const char *name) {
  char *p = data_path(name);
  TZ_ASSERT_OK(tz_config_load_file(c, p));
  free(p);
}

/* Every TZ_* variable of the config, so that a test starts from a clean environment. */
static void clear_env(void) {
  for (int i = 0; i < tz_config_key_count(); i++)
    if (tz_config_key_env(i))
      unsetenv(tz_config_key_env(i));
}

static void test_defaults(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  assert_int_equal(c.train_batch_size, 0);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 0);
  assert_int_equal(c.gradient_accumulation_steps, 0);
  ASSERT_DBL(c.gradient_clipping, 0);
  assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAMW);
  ASSERT_DBL(c.optimizer.lr, 1e-3);
  ASSERT_DBL(c.optimizer.betas[0], 0.9);
  ASSERT_DBL(c.optimizer.betas[1], 0.999);
  ASSERT_DBL(c.optimizer.eps, 1e-8);
  ASSERT_DBL(c.optimizer.weight_decay, 0);
  assert_int_equal(c.optimizer.adam_w_mode, 1);
  assert_int_equal(c.scheduler.type, TZ_LR_CONSTANT);
  ASSERT_DBL(c.scheduler.warmup_min_lr, 0);
  ASSERT_DBL(c.scheduler.warmup_max_lr, -1); /* not set: the schedule's own peak (lr.c) */
  assert_int_equal(c.scheduler.warmup_num_steps, 1000);
  assert_int_equal(c.scheduler.warmup_type, TZ_WARMUP_LOG);
  assert_int_equal(c.scheduler.total_num_steps, 0);
  ASSERT_DBL(c.scheduler.warmup_min_ratio, 0);
  ASSERT_DBL(c.scheduler.cos_min_ratio, 1e-4);
  assert_int_equal(c.bf16.enabled, 0);
  assert_int_equal(c.fp16.enabled, 0);
  ASSERT_DBL(c.fp16.loss_scale, 0);
  assert_int_equal(c.fp16.initial_scale_power, 16);
  assert_int_equal(c.fp16.loss_scale_window, 1000);
  assert_int_equal(c.fp16.hysteresis, 2);
  ASSERT_DBL(c.fp16.min_loss_scale, 1);
  assert_int_equal(c.precision, TZ_PRECISION_FP32);
  assert_int_equal(c.zero_optimization.stage, 3);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_NONE);
  assert_null(c.zero_optimization.offload_param.nvme_path);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NONE);
  assert_null(c.zero_optimization.offload_optimizer.nvme_path);
  assert_int_equal(c.zero_optimization.overlap_comm, 1);
  assert_int_equal(c.aio.block_size, 1048576);
  ASSERT_DBL(c.gradient_predivide_factor, 1);
  assert_int_equal(c.prescale_gradients, 0);
  assert_int_equal(c.communication_data_type, TZ_PRECISION_FP32);
  assert_int_equal(c.seed, 42);
  assert_null(c.tierzero.model);
  assert_int_equal(c.tierzero.hbm_budget, 0);
  assert_int_equal(c.tierzero.host_budget, 0);
  assert_int_equal(c.tierzero.nvme_budget, 0);
  assert_int_equal(c.tierzero.nvme_path.n, 0);
  assert_int_equal(c.tierzero.nvme_checksum, 1);
  assert_int_equal(c.tierzero.nvme_buffered, 0);
  assert_int_equal(c.tierzero.staging_bytes, 64u << 20);
  assert_int_equal(c.tierzero.chunk_bytes, 4u << 20);
  assert_int_equal(c.tierzero.queue_depth, 0);
  assert_null(c.tierzero.faults);
  assert_int_equal(c.tierzero.lookahead, -1);
  assert_int_equal(c.tierzero.jitter_us, 0);
  assert_int_equal(c.tierzero.sched_debug, 0);
  assert_int_equal(c.tierzero.log, TZ_LOG_WARN);
  assert_int_equal(c.tierzero.trace_step, -1);
  assert_int_equal(c.tierzero.threads, 0);
  assert_true(c.tierzero.cpu_adam == -1.0);
  assert_int_equal(c.tierzero.cpu_adam_search, -1); /* auto */
  assert_int_equal(c.tierzero.overlap_collectives, -1); /* auto */
  assert_int_equal(c.tierzero.numa_node, -1);
  assert_int_equal(c.tierzero.device, -1);
  assert_int_equal(tz_config_ignored_count(&c), 0);
  tz_config_free(&c);
}

static void test_zero_infinity_file(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "zero_infinity_nvme.json");
  assert_int_equal(c.train_batch_size, 64);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 4);
  assert_int_equal(c.gradient_accumulation_steps, 8);
  ASSERT_DBL(c.gradient_clipping, 1.0);
  assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAMW); /* "adamw": case-insensitive */
  ASSERT_DBL(c.optimizer.lr, 3e-4);
  ASSERT_DBL(c.optimizer.betas[0], 0.9);
  ASSERT_DBL(c.optimizer.betas[1], 0.95);
  ASSERT_DBL(c.optimizer.eps, 1e-8);
  ASSERT_DBL(c.optimizer.weight_decay, 0.1);
  assert_int_equal(c.optimizer.adam_w_mode, 1);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP_COSINE);
  assert_int_equal(c.scheduler.total_num_steps, 100000);
  assert_int_equal(c.scheduler.warmup_num_steps, 2000);
  ASSERT_DBL(c.scheduler.warmup_min_ratio, 0.01);
  ASSERT_DBL(c.scheduler.cos_min_ratio, 0.1);
  assert_int_equal(c.scheduler.warmup_type, TZ_WARMUP_LINEAR);
  assert_int_equal(c.bf16.enabled, 1);
  assert_int_equal(c.fp16.enabled, 0);
  assert_int_equal(c.precision, TZ_PRECISION_BF16);
  assert_int_equal(c.zero_optimization.stage, 3);
  assert_int_equal(c.zero_optimization.overlap_comm, 1);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NVME);
  assert_string_equal(c.zero_optimization.offload_optimizer.nvme_path, "/local_nvme");
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_NVME);
  assert_string_equal(c.zero_optimization.offload_param.nvme_path, "/local_nvme");
  assert_int_equal(c.aio.block_size, 1048576);
  assert_int_equal(c.communication_data_type, TZ_PRECISION_BF16);
  ASSERT_DBL(c.gradient_predivide_factor, 2.0);
  assert_int_equal(c.seed, 1234);
  /* DeepSpeed's monitor, honoured during the run (trainer/run/monitor.h) */
  assert_int_equal(c.tensorboard.enabled, 1);
  assert_string_equal(c.tensorboard.output_path, "logs/");
  assert_string_equal(c.tensorboard.job_name, "zero_infinity");
  /* DeepSpeed keys that do not apply, in file order. */
  static const char *const ignored[] = {
      "zero_optimization.stage3_gather_16bit_weights_on_model_save", "flops_profiler",
      "zero_allow_untested_optimizer"};
  assert_int_equal(tz_config_ignored_count(&c), 3);
  for (int i = 0; i < 3; i++) {
    assert_string_equal(tz_config_ignored(&c, i), ignored[i]);
    assert_null(tz_config_ignored_hint(&c, i));
  }
  assert_null(tz_config_ignored(&c, 3));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 2));
  tz_config_free(&c);
}

static void test_auto_values(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  /* Values set earlier: "auto" gives Hugging Face TrainingArguments' defaults (learning_rate
   * 5e-5, max_grad_norm 1.0, warmup_steps 0) where they differ from tierzero's, else tierzero's
   * built-in default. */
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.lr", "0.5"));
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.betas", "0.8,0.9"));
  TZ_ASSERT_OK(tz_config_set(&c, "train_batch_size", "32"));
  TZ_ASSERT_OK(tz_config_set(&c, "gradient_clipping", "2"));
  load_data(&c, "auto.json");
  assert_int_equal(c.train_batch_size, 0);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 0);
  assert_int_equal(c.gradient_accumulation_steps, 0);
  ASSERT_DBL(c.gradient_clipping, 1.0);
  assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAM);
  assert_int_equal(c.optimizer.adam_w_mode, 0); /* Adam keeps an explicit false */
  ASSERT_DBL(c.optimizer.lr, 5e-5);
  ASSERT_DBL(c.optimizer.betas[0], 0.9);
  ASSERT_DBL(c.optimizer.betas[1], 0.999);
  ASSERT_DBL(c.optimizer.eps, 1e-8);
  ASSERT_DBL(c.optimizer.weight_decay, 0);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP_DECAY);
  assert_int_equal(c.scheduler.total_num_steps, 0);
  assert_int_equal(c.scheduler.warmup_num_steps, 0); /* filled by --warmup-ratio */
  ASSERT_DBL(c.scheduler.warmup_max_lr, -1);         /* until tz_config_resolve_batch */
  assert_int_equal(c.fp16.enabled, 0);
  assert_int_equal(c.bf16.enabled, 0);
  assert_int_equal(c.precision, TZ_PRECISION_FP32);
  assert_int_equal(c.fp16.loss_scale_window, 500);
  assert_int_equal(c.fp16.initial_scale_power, 12);
  assert_int_equal(c.fp16.hysteresis, 3);
  ASSERT_DBL(c.fp16.min_loss_scale, 0.5);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_CPU);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_CPU);
  /* With every batch size "auto", the micro-batch is per_device_train_batch_size's default, 8 */
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 8));
  assert_int_equal(c.train_micro_batch_size_per_gpu, 8);
  assert_int_equal(c.train_batch_size, 64);
  assert_int_equal(c.gradient_accumulation_steps, 1);
  TZ_ASSERT_OK(tz_config_set(&c, "train_micro_batch_size_per_gpu", "2"));
  c.train_batch_size = 0; /* as loaded, before resolution */
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 8));
  assert_int_equal(c.train_batch_size, 16);
  assert_int_equal(c.gradient_accumulation_steps, 1);
  tz_config_free(&c);
}

static void test_tierzero_section(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "tierzero.json");
  assert_string_equal(c.tierzero.model, "llama-1b");
  assert_int_equal(c.tierzero.hbm_budget, 40ull << 30);
  assert_int_equal(c.tierzero.host_budget, 128ull << 30);
  assert_int_equal(c.tierzero.nvme_budget, 2000000000000ull);
  assert_int_equal(c.tierzero.nvme_path.n, 2);
  assert_string_equal(c.tierzero.nvme_path.path[0], "/mnt/nvme0/tz");
  assert_string_equal(c.tierzero.nvme_path.path[1], "/mnt/nvme1/tz");
  assert_int_equal(c.tierzero.nvme_checksum, 0);
  assert_int_equal(c.tierzero.nvme_buffered, 1);
  assert_int_equal(c.tierzero.staging_bytes, 256u << 20);
  assert_int_equal(c.tierzero.chunk_bytes, 8u << 20);
  assert_int_equal(c.tierzero.queue_depth, 128);
  assert_string_equal(c.tierzero.faults, "eio-read@3,short%5,seed=7");
  assert_int_equal(c.tierzero.lookahead, 6);
  assert_int_equal(c.tierzero.jitter_us, 50);
  assert_int_equal(c.tierzero.sched_debug, 1);
  assert_int_equal(c.tierzero.log, TZ_LOG_INFO);
  assert_int_equal(c.tierzero.trace_step, 20);
  assert_int_equal(c.tierzero.threads, 24);
  assert_int_equal(c.tierzero.numa_node, 1);
  assert_int_equal(c.tierzero.device, 0);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NVME);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_CPU);
  assert_int_equal(tz_config_ignored_count(&c), 0);
  /* A single string is a list of one directory. */
  TZ_ASSERT_OK(tz_config_load_string(&c, "{\"tierzero\": {\"nvme_path\": \"/scratch\"}}", "t"));
  assert_int_equal(c.tierzero.nvme_path.n, 1);
  assert_string_equal(c.tierzero.nvme_path.path[0], "/scratch");
  tz_config_free(&c);
}

/* Two files merge: the second changes only what it names. */
static void test_merge_files(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "zero_infinity_nvme.json");
  load_data(&c, "tierzero.json");
  assert_int_equal(c.train_batch_size, 64);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 2);
  ASSERT_DBL(c.optimizer.lr, 3e-4);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_CPU);
  assert_string_equal(c.zero_optimization.offload_param.nvme_path, "/local_nvme");
  assert_string_equal(c.tierzero.model, "llama-1b");
  assert_int_equal(tz_config_ignored_count(&c), 3); /* tensorboard is used */
  /* null leaves a value as it was; a legacy "bfloat16" section is bf16. */
  TZ_ASSERT_OK(tz_config_load_string(
      &c, "{\"optimizer\": {\"params\": {\"lr\": null}}, \"bfloat16\": {\"enabled\": false}}",
      "n"));
  ASSERT_DBL(c.optimizer.lr, 3e-4);
  assert_int_equal(c.bf16.enabled, 0);
  assert_int_equal(c.precision, TZ_PRECISION_FP32);
  tz_config_free(&c);
}

struct bad_case {
  const char *json;
  const char *message; /* a substring of the message after "bad.json: " */
};

static const struct bad_case bad_cases[] = {
    /* wrong type */
    {"{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": \"four\"}}}",
     "bad.json: zero_optimization.offload_param.buffer_count: expected a positive integer, got "
     "\"four\""},
    {"{\"zero_optimization\": {\"stage\": true}}",
     "zero_optimization.stage: expected an integer in [0, 3], got true"},
    {"{\"bf16\": {\"enabled\": 1}}", "bf16.enabled: expected true, false or \"auto\", got 1"},
    {"{\"aio\": {\"single_submit\": \"yes\"}}",
     "aio.single_submit: expected true or false, got \"yes\""},
    {"{\"optimizer\": \"adam\"}", "bad.json: optimizer: expected an object, got \"adam\""},
    {"{\"zero_optimization\": {\"offload_param\": [1]}}",
     "zero_optimization.offload_param: expected an object, got [1]"},
    {"{\"optimizer\": {\"params\": {\"lr\": \"3e-4\"}}}",
     "optimizer.params.lr: expected a number >= 0 or \"auto\", got \"3e-4\""},
    {"{\"tierzero\": {\"model\": 7}}", "tierzero.model: expected a non-empty string, got 7"},
    {"{\"tierzero\": {\"model\": \"\"}}", "tierzero.model: expected a non-empty string, got \"\""},
    {"{\"zero_optimization\": {\"offload_param\": {\"nvme_path\": [\"/a\"]}}}",
     "zero_optimization.offload_param.nvme_path: expected a non-empty string, got [\"/a\"]"},
    {"[1, 2]", "bad.json: expected a JSON object at the top level, got [1,2]"},
    /* "auto" where DeepSpeed does not allow it */
    {"{\"zero_optimization\": {\"sub_group_size\": \"auto\"}}",
     "zero_optimization.sub_group_size: expected a non-negative integer, got \"auto\""},
    {"{\"tierzero\": {\"threads\": \"auto\"}}",
     "tierzero.threads: expected an integer in [0, 4096], got \"auto\""},
    /* out of range */
    {"{\"zero_optimization\": {\"stage\": 4}}",
     "zero_optimization.stage: expected an integer in [0, 3], got 4"},
    {"{\"zero_optimization\": {\"stage\": -1}}",
     "zero_optimization.stage: expected an integer in [0, 3], got -1"},
    {"{\"train_micro_batch_size_per_gpu\": 0}",
     "train_micro_batch_size_per_gpu: expected a positive integer or \"auto\", got 0"},
    {"{\"optimizer\": {\"params\": {\"lr\": -0.1}}}",
     "optimizer.params.lr: expected a number >= 0 or \"auto\", got -0.1"},
    {"{\"optimizer\": {\"params\": {\"eps\": 0}}}",
     "optimizer.params.eps: expected a number > 0 or \"auto\", got 0"},
    {"{\"zero_optimization\": {\"offload_optimizer\": {\"ratio\": 1.5}}}",
     "zero_optimization.offload_optimizer.ratio: expected a number in [0, 1], got 1.5"},
    {"{\"aio\": {\"queue_depth\": 1e6}}",
     "aio.queue_depth: expected an integer in [1, 32768], got 1000000.0"},
    {"{\"fp16\": {\"min_loss_scale\": 0}}", "fp16.min_loss_scale: expected a number > 0, got 0"},
    {"{\"tierzero\": {\"lookahead\": -2}}",
     "tierzero.lookahead: expected an integer in [-1, 65536], got -2"},
    {"{\"seed\": -1}", "seed: expected a non-negative integer, got -1"},
    /* a float where an integer is needed */
    {"{\"train_batch_size\": 2.5}",
     "train_batch_size: expected a positive integer or \"auto\", got 2.5"},
    {"{\"zero_optimization\": {\"reduce_bucket_size\": 1e300}}",
     "zero_optimization.reduce_bucket_size: expected a positive integer or \"auto\", got 1e300"},
    /* sizes */
    {"{\"tierzero\": {\"host_budget\": -5}}",
     "tierzero.host_budget: expected a size like 64GiB, got -5"},
    {"{\"tierzero\": {\"nvme_budget\": \"1.5GB\"}}",
     "tierzero.nvme_budget: expected a size like 64GiB, got \"1.5GB\""},
    {"{\"tierzero\": {\"hbm_budget\": \"16 G\"}}",
     "tierzero.hbm_budget: expected a size like 64GiB, got \"16 G\""},
    {"{\"tierzero\": {\"staging_bytes\": 0}}",
     "tierzero.staging_bytes: expected a non-zero size like 64MiB, got 0"},
    {"{\"tierzero\": {\"nvme_path\": []}}",
     "tierzero.nvme_path: expected a directory or an array of 1 to 16 directories, got []"},
    {"{\"tierzero\": {\"nvme_path\": [\"/a\", 3]}}",
     "tierzero.nvme_path: expected a directory or an array of 1 to 16 directories, got [\"/a\",3]"},
    /* unknown enum values */
    {"{\"optimizer\": {\"type\": \"Adamax\"}}",
     "bad.json: optimizer.type: unknown value \"Adamax\" (expected one of Adam, AdamW)"},
    {"{\"optimizer\": {\"type\": 1}}", "optimizer.type: expected one of Adam, AdamW, got 1"},
    {"{\"scheduler\": {\"type\": \"OneCycle\"}}",
     "scheduler.type: unknown value \"OneCycle\" (expected one of WarmupLR, WarmupDecayLR, "
     "WarmupCosineLR)"},
    {"{\"scheduler\": {\"type\": \"warmuplr\"}}", "scheduler.type: unknown value \"warmuplr\""},
    {"{\"scheduler\": {\"params\": {\"warmup_type\": \"cosine\"}}}",
     "scheduler.params.warmup_type: unknown value \"cosine\" (expected one of log, linear)"},
    {"{\"zero_optimization\": {\"offload_param\": {\"device\": \"gpu\"}}}",
     "zero_optimization.offload_param.device: unknown value \"gpu\" (expected one of none, cpu, "
     "nvme)"},
    {"{\"communication_data_type\": \"fp8\"}",
     "communication_data_type: unknown value \"fp8\" (expected one of fp32, fp16, bf16)"},
    {"{\"tierzero\": {\"log\": \"verbose\"}}",
     "tierzero.log: unknown value \"verbose\" (expected one of error, warn, info, debug, trace)"},
    /* betas */
    {"{\"optimizer\": {\"params\": {\"betas\": [0.9]}}}",
     "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"},
    {"{\"optimizer\": {\"params\": {\"betas\": [0.9, 1.0]}}}",
     "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"},
    {"{\"optimizer\": {\"params\": {\"betas\": [0.9, \"0.99\"]}}}",
     "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"},
    {"{\"optimizer\": {\"params\": {\"betas\": 0.9}}}",
     "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"},
    {"{\"optimizer\": {\"params\": {\"betas\": [-0.1, 0.9]}}}",
     "optimizer.params.betas: expected an array of 2 numbers in [0, 1)"},
    /* unsupported DeepSpeed switches */
    {"{\"optimizer\": {\"params\": {\"amsgrad\": true}}}",
     "optimizer.params.amsgrad: only false is supported, got true"},
    {"{\"optimizer\": {\"params\": {\"bias_correction\": false}}}",
     "optimizer.params.bias_correction: only true is supported, got false"},
    /* rules between keys */
    {"{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
     "bad.json: fp16.enabled and bf16.enabled are both true: choose one"},
    {"{\"fp16\": {\"enabled\": true}, \"bfloat16\": {\"enabled\": true}}",
     "fp16.enabled and bf16.enabled are both true: choose one"},
    {"{\"tierzero\": {\"staging_bytes\": \"4MiB\", \"chunk_bytes\": \"8MiB\"}}",
     "bad.json: tierzero.chunk_bytes 8388608 is larger than tierzero.staging_bytes 4194304"},
    /* a chunk the staging buffers cannot be cut into (it was "staging: cannot allocate 256
     * bytes: 0 of 0 bytes free" at the runtime's creation) */
    {"{\"tierzero\": {\"chunk_bytes\": \"1B\"}}",
     "bad.json: tierzero.chunk_bytes 1 B: a chunk is a multiple of 4 KiB (the direct-I/O "
     "alignment of the nvme tier), at least 4 KiB; the default is 4 MiB"},
    {"{\"tierzero\": {\"chunk_bytes\": 6000}}", "bad.json: tierzero.chunk_bytes 5.9 KiB: a chunk"},
    /* a fault spec is refused when read, though this run may build no fault tier (it was
     * accepted then, and a delay of 99999999999 us made every operation of one wait) */
    {"{\"tierzero\": {\"faults\": \"delay=99999999999\"}}",
     "bad.json: tierzero.faults (or TZ_FAULTS): bad fault item \"delay=99999999999\": delay is in "
     "microseconds, 0 to 10000000 (10 s)"},
    {"{\"tierzero\": {\"faults\": \"eio@1,nvme-short@0\"}}",
     "bad fault item \"nvme-short@0\": expected nvme-short@N or nvme-eagain@N"},
    {"{\"tierzero\": {\"faults\": \"bogus@3\"}}", "bad fault item \"bogus@3\": expected KIND@N"},
    /* syntax, with line and column */
    {"{\"train_batch_size\": 8,\n \"seed\": 1,,\n}", "bad.json:2:12: JSON syntax error: "},
    {"{\"seed\": 1,\n \"seed\": 2}", "bad.json:2:7: JSON syntax error: duplicate object key"},
    {"", "bad.json:1:0: JSON syntax error: "},
};

static void test_bad_inputs(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  char *before = dump_string(&c);
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
    const struct bad_case *b = &bad_cases[i];
    tz_err_clear();
    int rc = tz_config_load_string(&c, b->json, "bad.json");
    if (rc != TZ_ECONFIG || !strstr(tz_err_msg(), b->message))
      print_error("case %zu: %s\n  rc %d, message \"%s\"\n  expected \"%s\"\n", i, b->json, rc,
                  tz_err_msg(), b->message);
    assert_int_equal(rc, TZ_ECONFIG);
    assert_non_null(strstr(tz_err_msg(), b->message));
    /* A rejected file changes nothing. */
    char *after = dump_string(&c);
    assert_string_equal(before, after);
    free(after);
  }
  assert_int_equal(tz_config_ignored_count(&c), 0);
  free(before);
  tz_config_free(&c);
}

/* The style of messages in full, not only a substring. */
static void test_exact_messages(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  assert_int_equal(tz_config_load_string(
                       &c,
                       "{\"zero_optimization\": {\"offload_param\": {\"buffer_count\": \"four\"}}}",
                       "ds.json"),
                   TZ_ECONFIG);
  assert_string_equal(tz_err_msg(), "ds.json: zero_optimization.offload_param.buffer_count: "
                                    "expected a positive integer, got \"four\"");
  assert_int_equal(tz_config_load_string(&c, "{\"optimizer\": {\"type\": \"Adamax\"}}", "ds.json"),
                   TZ_ECONFIG);
  assert_string_equal(
      tz_err_msg(),
      "ds.json: optimizer.type: unknown value \"Adamax\" (expected one of Adam, AdamW)");
  assert_int_equal(tz_config_load_string(&c, "{\"train_batch_size\": 8}", NULL), 0);
  assert_int_equal(tz_config_load_string(&c, "{\"train_batch_size\": 8.5}", NULL), TZ_ECONFIG);
  assert_string_equal(
      tz_err_msg(), "<string>: train_batch_size: expected a positive integer or \"auto\", got 8.5");
  assert_int_equal(c.train_batch_size, 8);
  tz_config_free(&c);
}

static void test_file_errors(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  char *p = data_path("syntax_error.json");
  assert_int_equal(tz_config_load_file(&c, p), TZ_ECONFIG);
  char *want = NULL;
  assert_true(asprintf(&want, "%s:7:19: JSON syntax error: ", p) > 0);
  if (strncmp(tz_err_msg(), want, strlen(want)) != 0)
    print_error("message \"%s\", expected to start with \"%s\"\n", tz_err_msg(), want);
  assert_int_equal(strncmp(tz_err_msg(), want, strlen(want)), 0);
  free(want);
  free(p);

  p = data_path("no_such_file.json");
  assert_int_equal(tz_config_load_file(&c, p), TZ_ENOENT);
  ASSERT_MSG_HAS(p);
  free(p);

  /* A key path in a file's message is prefixed with the file's path. */
  char *dir = tz_test_mkdtemp("config");
  assert_non_null(dir);
  assert_true(asprintf(&p, "%s/ds_config.json", dir) > 0);
  FILE *f = fopen(p, "w");
  assert_non_null(f);
  fputs("{\n  \"zero_optimization\": {\n    \"stage\": 5\n  }\n}\n", f);
  fclose(f);
  assert_int_equal(tz_config_load_file(&c, p), TZ_ECONFIG);
  assert_true(
      asprintf(&want, "%s: zero_optimization.stage: expected an integer in [0, 3], got 5", p) > 0);
  assert_string_equal(tz_err_msg(), want);
  free(want);
  free(p);
  tz_test_rmdir(dir);
  tz_config_free(&c);
}

static void test_ignored_and_suggestions(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "typo.json");
  static const struct {
    const char *path, *hint;
  } want[] = {
      {"zero_optimization.offload_parm", "offload_param"},
      {"zero_optimization.allgather_partitions", NULL},
      {"optimiser", "optimizer"},
      {"amp", NULL},
      {"my_custom_key", NULL},
  };
  int n = (int)(sizeof want / sizeof want[0]);
  assert_int_equal(tz_config_ignored_count(&c), n);
  for (int i = 0; i < n; i++) {
    assert_string_equal(tz_config_ignored(&c, i), want[i].path);
    if (want[i].hint)
      assert_string_equal(tz_config_ignored_hint(&c, i), want[i].hint);
    else
      assert_null(tz_config_ignored_hint(&c, i));
  }
  /* The typo's section was not applied; the rest of the file was. */
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_NONE);
  assert_int_equal(c.train_batch_size, 16);
  /* Loading the same file again lists each key once. */
  load_data(&c, "typo.json");
  assert_int_equal(tz_config_ignored_count(&c), n);

  /* More suggestions, at each level and in the tierzero section. */
  TZ_ASSERT_OK(tz_config_load_string(&c,
                                     "{\"train_batch_sise\": 1, \"Gradient_Clipping\": 1,"
                                     " \"optimizer\": {\"params\": {\"betas1\": 0.9, \"lt\": 1}},"
                                     " \"tierzero\": {\"lookahed\": 3, \"x\": 1}}",
                                     "more.json"));
  static const struct {
    const char *path, *hint;
  } more[] = {
      {"train_batch_sise", "train_batch_size"}, {"Gradient_Clipping", "gradient_clipping"},
      {"optimizer.params.betas1", "betas"},     {"optimizer.params.lt", "lr"},
      {"tierzero.lookahed", "lookahead"},       {"tierzero.x", NULL},
  };
  for (int i = 0; i < (int)(sizeof more / sizeof more[0]); i++) {
    assert_string_equal(tz_config_ignored(&c, n + i), more[i].path);
    if (more[i].hint)
      assert_string_equal(tz_config_ignored_hint(&c, n + i), more[i].hint);
    else
      assert_null(tz_config_ignored_hint(&c, n + i));
  }
  assert_int_equal(c.tierzero.lookahead, -1);

  /* A copy has its own list. */
  struct tz_config d;
  TZ_ASSERT_OK(tz_config_copy(&d, &c));
  tz_config_free(&c);
  assert_int_equal(tz_config_ignored_count(&d), n + 6);
  assert_string_equal(tz_config_ignored(&d, 0), "zero_optimization.offload_parm");
  tz_config_free(&d);
}

static void test_env(void **state) {
  (void)state;
  clear_env();
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "tierzero.json");
  setenv("TZ_HOST_BUDGET", "64GiB", 1);
  setenv("TZ_HBM_BUDGET", "80000000000", 1);
  setenv("TZ_NVME_PATH", "/d0:/d1:/d2", 1);
  setenv("TZ_NVME_CHECKSUM", "on", 1);
  setenv("TZ_NVME_BUFFERED", "0", 1);
  setenv("TZ_LOG", "debug", 1);
  setenv("TZ_MODEL", "llama-7b", 1);
  setenv("TZ_LOOKAHEAD", "-1", 1);
  setenv("TZ_FAULTS", "flip@1", 1);
  setenv("TZ_SCHED_DEBUG", "false", 1);
  setenv("TZ_THREADS", "", 1); /* empty: not set */
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  assert_int_equal(c.tierzero.host_budget, 64ull << 30);
  assert_int_equal(c.tierzero.hbm_budget, 80000000000ull);
  assert_int_equal(c.tierzero.nvme_path.n, 3);
  assert_string_equal(c.tierzero.nvme_path.path[2], "/d2");
  assert_int_equal(c.tierzero.nvme_checksum, 1);
  assert_int_equal(c.tierzero.nvme_buffered, 0);
  assert_int_equal(c.tierzero.log, TZ_LOG_DEBUG);
  assert_string_equal(c.tierzero.model, "llama-7b");
  assert_int_equal(c.tierzero.lookahead, -1);
  assert_string_equal(c.tierzero.faults, "flip@1");
  assert_int_equal(c.tierzero.sched_debug, 0);
  assert_int_equal(c.tierzero.threads, 24); /* from the file */
  assert_int_equal(c.tierzero.nvme_budget, 2000000000000ull);
  clear_env();

  /* Errors name the variable and leave the config as it was. */
  static const struct {
    const char *var, *value, *message;
  } bad[] = {
      {"TZ_HOST_BUDGET", "lots", "TZ_HOST_BUDGET: expected a size like 64GiB, got \"lots\""},
      {"TZ_NVME_BUDGET", "-1", "TZ_NVME_BUDGET: expected a size like 64GiB, got \"-1\""},
      {"TZ_STAGING_BYTES", "0", "TZ_STAGING_BYTES: expected a non-zero size like 64MiB, got \"0\""},
      {"TZ_LOG", "loud",
       "TZ_LOG: unknown value \"loud\" (expected one of error, warn, info, debug, trace)"},
      {"TZ_NVME_CHECKSUM", "maybe",
       "TZ_NVME_CHECKSUM: expected 1, 0, true, false, yes, no, on or off, got \"maybe\""},
      {"TZ_QUEUE_DEPTH", "12x", "TZ_QUEUE_DEPTH: expected an integer in [0, 32768], got \"12x\""},
      {"TZ_THREADS", "2.5", "TZ_THREADS: expected an integer in [0, 4096], got \"2.5\""},
      {"TZ_DEVICE", "99999999999999999999",
       "TZ_DEVICE: expected an integer in [-1, 1023], got \"99999999999999999999\""},
      {"TZ_NVME_PATH", "/a::/b",
       "TZ_NVME_PATH: expected a ':'-separated list of 1 to 16 directories, got \"/a::/b\""},
      {"TZ_CHUNK_BYTES", "1GiB",
       "environment: tierzero.chunk_bytes 1073741824 is larger than tierzero.staging_bytes "
       "268435456"},
  };
  char *before = dump_string(&c);
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("TZ_MODEL", "changed", 1); /* a valid variable applied before the bad one */
    setenv(bad[i].var, bad[i].value, 1);
    int rc = tz_config_apply_env(&c);
    if (rc != TZ_ECONFIG || strcmp(tz_err_msg(), bad[i].message) != 0)
      print_error("%s=%s: rc %d, message \"%s\"\n", bad[i].var, bad[i].value, rc, tz_err_msg());
    assert_int_equal(rc, TZ_ECONFIG);
    assert_string_equal(tz_err_msg(), bad[i].message);
    char *after = dump_string(&c);
    assert_string_equal(before, after);
    free(after);
    clear_env();
  }
  free(before);
  tz_config_free(&c);
}

/* Precedence: defaults < file < environment, whatever order the program happens to call in. */
static void test_env_precedence(void **state) {
  (void)state;
  clear_env();
  struct tz_config c;
  tz_config_defaults(&c);
  setenv("TZ_THREADS", "3", 1);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  assert_int_equal(c.tierzero.threads, 3);
  load_data(&c, "tierzero.json");
  assert_int_equal(c.tierzero.threads, 24);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  assert_int_equal(c.tierzero.threads, 3);
  assert_int_equal(c.tierzero.numa_node, 1); /* not in the environment: the file's */
  /* Every tierzero key has its variable; no DeepSpeed key has one. */
  for (int i = 0; i < tz_config_key_count(); i++) {
    const char *k = tz_config_key(i), *e = tz_config_key_env(i);
    if (strncmp(k, "tierzero.", 9) != 0) {
      assert_null(e);
      continue;
    }
    assert_non_null(e);
    char want[64];
    int n = snprintf(want, sizeof want, "TZ_");
    for (const char *p = k + 9; *p; p++)
      want[n++] = (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
    want[n] = '\0';
    assert_string_equal(e, want);
  }
  clear_env();
  tz_config_free(&c);
}

static void test_set(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.lr", "3e-4"));
  ASSERT_DBL(c.optimizer.lr, 3e-4);
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.betas", "0.9,0.95"));
  ASSERT_DBL(c.optimizer.betas[1], 0.95);
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.type", "adam"));
  assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAM);
  TZ_ASSERT_OK(tz_config_set(&c, "zero_optimization.offload_param.nvme_path", "/nvme"));
  TZ_ASSERT_OK(tz_config_set(&c, "zero_optimization.offload_param.nvme_path", "/nvme2"));
  assert_string_equal(c.zero_optimization.offload_param.nvme_path, "/nvme2");
  TZ_ASSERT_OK(tz_config_set(&c, "fp16.enabled", "true"));
  assert_int_equal(c.precision, TZ_PRECISION_FP16);
  assert_int_equal(tz_config_set(&c, "bf16.enabled", "1"), TZ_ECONFIG);
  ASSERT_MSG_HAS("fp16.enabled and bf16.enabled are both true: choose one");
  assert_int_equal(c.bf16.enabled, 0);
  assert_int_equal(tz_config_set(&c, "optimizer.params.betas", "0.9"), TZ_ECONFIG);
  assert_string_equal(tz_err_msg(), "optimizer.params.betas: expected 2 numbers \"a,b\" in [0, 1) "
                                    "or \"auto\", got \"0.9\"");
  assert_int_equal(tz_config_set(&c, "optimizer.params.lrr", "1"), TZ_ENOENT);
  assert_string_equal(tz_err_msg(), "optimizer.params.lrr: unknown key (did you mean lr?)");
  assert_int_equal(tz_config_set(&c, "nonsense", "1"), TZ_ENOENT);
  assert_string_equal(tz_err_msg(), "nonsense: unknown key");
  /* Text JSON cannot hold is refused rather than dumped as null (found by tests/fuzz). */
  assert_int_equal(tz_config_set(&c, "tierzero.nvme_path", "/a:/b\371c"), TZ_ECONFIG);
  assert_string_equal(tz_err_msg(), "tierzero.nvme_path: not valid UTF-8 text");
  assert_int_equal(tz_config_set(&c, "tierzero.model", "\377"), TZ_ECONFIG);
  assert_int_equal(c.tierzero.nvme_path.n, 0);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.nvme_path", "/d\303\251j\303\240:/b"));
  assert_int_equal(c.tierzero.nvme_path.n, 2);
  /* A negative zero is stored as zero: the dump could not carry its sign (found by tests/fuzz). */
  TZ_ASSERT_OK(tz_config_set(&c, "gradient_clipping", "-0"));
  assert_false(signbit(c.gradient_clipping));
  TZ_ASSERT_OK(tz_config_load_string(&c,
                                     "{\"optimizer\": {\"params\": {\"betas\": [-0.0, 0.9], "
                                     "\"weight_decay\": -0.0}}}",
                                     NULL));
  assert_false(signbit(c.optimizer.betas[0]));
  assert_false(signbit(c.optimizer.weight_decay));
  tz_config_free(&c);
}

static void test_sizes(void **state) {
  (void)state;
  static const struct {
    const char *s;
    int ok;
    uint64_t v;
  } cases[] = {
      {"0", 1, 0},
      {"512", 1, 512},
      {"512B", 1, 512},
      {"4KiB", 1, 4096},
      {"4kB", 1, 4000},
      {"4KB", 1, 4000},
      {"64 GiB", 1, 64ull << 30},
      {"64gib", 1, 64ull << 30},
      {"2TB", 1, 2000000000000ull},
      {"1PiB", 1, 1ull << 50},
      {"9223372036854775807", 1, 9223372036854775807ull},
      {"9223372036854775808", 0, 0},
      {"8192PiB", 0, 0},
      {"99999999999999999999999", 0, 0},
      {"1.5GB", 0, 0},
      {"1e9", 0, 0},
      {"16K", 0, 0},
      {"16 G", 0, 0},
      {"64  GiB", 0, 0},
      {"1 ", 0, 0},
      {" 1", 0, 0},
      {"-1", 0, 0},
      {"+1", 0, 0},
      {"GiB", 0, 0},
      {"", 0, 0},
      {"lots", 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t v = 12345;
    int rc = tz_config_parse_size(cases[i].s, &v);
    if ((rc == 0) != cases[i].ok || (cases[i].ok && v != cases[i].v))
      print_error("\"%s\": rc %d value %llu\n", cases[i].s, rc, (unsigned long long)v);
    assert_int_equal(rc == 0, cases[i].ok);
    if (cases[i].ok)
      assert_int_equal(v, cases[i].v);
  }
}

static void test_resolve_batch(void **state) {
  (void)state;
  static const struct {
    int64_t tb, mb, gas;
    int world;
    int rc;
    int64_t want_tb, want_mb, want_gas;
    const char *message;
  } cases[] = {
      {64, 4, 8, 2, 0, 64, 4, 8, NULL},
      {64, 4, 0, 2, 0, 64, 4, 8, NULL},
      {64, 0, 8, 2, 0, 64, 4, 8, NULL},
      {64, 0, 0, 2, 0, 64, 32, 1, NULL},
      {0, 4, 0, 2, 0, 8, 4, 1, NULL},
      {0, 4, 8, 2, 0, 64, 4, 8, NULL},
      {8, 8, 0, 1, 0, 8, 8, 1, NULL},
      {64, 4, 4, 2, TZ_ECONFIG, 0, 0, 0,
       "train_batch_size 64 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 4 * "
       "world_size 2"},
      {30, 4, 0, 2, TZ_ECONFIG, 0, 0, 0,
       "train_batch_size 30 is not divisible by train_micro_batch_size_per_gpu 4 * world_size 2"},
      {4, 4, 0, 2, TZ_ECONFIG, 0, 0, 0,
       "train_batch_size 4 is not divisible by train_micro_batch_size_per_gpu 4 * world_size 2"},
      {30, 0, 2, 4, TZ_ECONFIG, 0, 0, 0,
       "train_batch_size 30 is not divisible by gradient_accumulation_steps 2 * world_size 4"},
      {6, 0, 0, 4, TZ_ECONFIG, 0, 0, 0,
       "train_batch_size 6 is not divisible by gradient_accumulation_steps 1 * world_size 4"},
      {0, 0, 4, 2, TZ_ECONFIG, 0, 0, 0,
       "neither train_batch_size nor train_micro_batch_size_per_gpu is set "
       "(gradient_accumulation_steps 4, world_size 2)"},
      {0, INT64_MAX / 2, 2, 2, TZ_ECONFIG, 0, 0, 0, "overflows"},
      {8, 4, 0, 0, TZ_EINVAL, 0, 0, 0, "world_size 0 is not positive"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tz_config c;
    tz_config_defaults(&c);
    c.train_batch_size = cases[i].tb;
    c.train_micro_batch_size_per_gpu = cases[i].mb;
    c.gradient_accumulation_steps = cases[i].gas;
    int rc = tz_config_resolve_batch(&c, cases[i].world);
    if (rc != cases[i].rc)
      print_error("case %zu: rc %d: %s\n", i, rc, tz_err_msg());
    assert_int_equal(rc, cases[i].rc);
    if (rc == 0) {
      assert_int_equal(c.train_batch_size, cases[i].want_tb);
      assert_int_equal(c.train_micro_batch_size_per_gpu, cases[i].want_mb);
      assert_int_equal(c.gradient_accumulation_steps, cases[i].want_gas);
    } else {
      ASSERT_MSG_HAS(cases[i].message);
      /* Refused: nothing changed. */
      assert_int_equal(c.train_batch_size, cases[i].tb);
      assert_int_equal(c.train_micro_batch_size_per_gpu, cases[i].mb);
      assert_int_equal(c.gradient_accumulation_steps, cases[i].gas);
    }
    tz_config_free(&c);
  }
}

/* DeepSpeed keys tierzero has no use for are accepted and checked as the others, not ignored. */
static void test_keys_without_field(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c,
                                     "{\"aio\": {\"thread_count\": 2}, \"steps_per_print\": 5, "
                                     "\"activation_checkpointing\": {\"profile\": true}}",
                                     "ds.json"));
  assert_int_equal(tz_config_ignored_count(&c), 0);
  TZ_ASSERT_OK(tz_config_set(&c, "zero_optimization.reduce_bucket_size", "auto"));
  assert_int_equal(tz_config_load_string(&c, "{\"aio\": {\"thread_count\": 0}}", "ds.json"),
                   TZ_ECONFIG);
  assert_string_equal(tz_err_msg(),
                      "ds.json: aio.thread_count: expected an integer in [1, 1024], got 0");
  assert_int_equal(tz_config_set(&c, "wall_clock_breakdown", "maybe"), TZ_ECONFIG);
  tz_config_free(&c);
}

/* The dump is valid JSON that loads back to the same configuration. */
static void test_dump_round_trip(void **state) {
  (void)state;
  const char *const layers[][2] = {
      {NULL, NULL},
      {"zero_infinity_nvme.json", NULL},
      {"zero_infinity_nvme.json", "tierzero.json"},
      {"auto.json", NULL},
  };
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
    struct tz_config a, b;
    tz_config_defaults(&a);
    for (int j = 0; j < 2; j++)
      if (layers[i][j])
        load_data(&a, layers[i][j]);
    char *s1 = dump_string(&a);
    tz_config_defaults(&b);
    TZ_ASSERT_OK(tz_config_load_string(&b, s1, "dump"));
    assert_int_equal(tz_config_ignored_count(&b), 0);
    char *s2 = dump_string(&b);
    assert_string_equal(s1, s2);
    /* Spot checks that the values, not only the text, survive. */
    ASSERT_DBL(b.optimizer.lr, a.optimizer.lr);
    ASSERT_DBL(b.optimizer.betas[1], a.optimizer.betas[1]);
    ASSERT_DBL(b.scheduler.cos_min_ratio, a.scheduler.cos_min_ratio);
    assert_int_equal(b.precision, a.precision);
    assert_int_equal(b.tierzero.host_budget, a.tierzero.host_budget);
    assert_int_equal(b.tierzero.nvme_path.n, a.tierzero.nvme_path.n);
    assert_int_equal(b.train_batch_size, a.train_batch_size);
    free(s1);
    free(s2);
    tz_config_free(&a);
    tz_config_free(&b);
  }
  /* Readable numbers: the shortest form that reads back exactly. */
  struct tz_config c;
  tz_config_defaults(&c);
  load_data(&c, "zero_infinity_nvme.json");
  char *s = dump_string(&c);
  assert_non_null(strstr(s, "\"lr\": 0.0003,"));
  assert_non_null(strstr(s, "\"betas\": [0.9, 0.95]"));
  assert_non_null(strstr(s, "\"type\": \"AdamW\""));
  assert_non_null(strstr(s, "\"block_size\": 1048576"));
  /* A key tierzero accepts but has no use for has no field: it is not dumped. */
  assert_null(strstr(s, "stage3_prefetch_bucket_size"));
  free(s);
  /* A bool whose default is "auto" dumps as "auto" and reads back as it; set, as the value. */
  s = dump_string(&c);
  assert_non_null(strstr(s, "\"overlap_collectives\": \"auto\""));
  free(s);
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.overlap_collectives", "false"));
  s = dump_string(&c);
  assert_non_null(strstr(s, "\"overlap_collectives\": false"));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.overlap_collectives", "auto"));
  assert_int_equal(c.tierzero.overlap_collectives, -1);
  free(s);
  tz_config_free(&c);
}

/* docs/config.md names every key and every environment variable. */
static void test_docs_cover_keys(void **state) {
  (void)state;
  const char *data = getenv("TZ_TEST_DATA");
  char *p = NULL;
  assert_true(asprintf(&p, "%s/../../docs/config.md", data ? data : "tests/data") > 0);
  FILE *f = fopen(p, "r");
  if (!f)
    print_error("cannot open %s\n", p);
  assert_non_null(f);
  char *doc = NULL;
  size_t cap = 0;
  ssize_t n = getdelim(&doc, &cap, '\0', f);
  fclose(f);
  assert_true(n > 0);
  for (int i = 0; i < tz_config_key_count(); i++) {
    char want[128];
    snprintf(want, sizeof want, "`%s`", tz_config_key(i));
    if (!strstr(doc, want))
      print_error("docs/config.md lacks %s\n", want);
    assert_non_null(strstr(doc, want));
    if (tz_config_key_env(i)) {
      snprintf(want, sizeof want, "`%s`", tz_config_key_env(i));
      if (!strstr(doc, want))
        print_error("docs/config.md lacks %s\n", want);
      assert_non_null(strstr(doc, want));
    }
  }
  /* The example in the documentation loads and means what the text says. */
  const char *ex = strstr(doc, "## Example");
  assert_non_null(ex);
  const char *start = strstr(ex, "```json\n");
  assert_non_null(start);
  start += strlen("```json\n");
  const char *end = strstr(start, "```");
  assert_non_null(end);
  char *json = strndup(start, (size_t)(end - start));
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, json, "docs/config.md"));
  assert_int_equal(tz_config_ignored_count(&c), 1);
  assert_string_equal(tz_config_ignored(&c, 0), "flops_profiler");
  assert_int_equal(c.tensorboard.enabled, 1);
  assert_string_equal(c.tensorboard.output_path, "/var/log/tierzero");
  assert_null(c.tensorboard.job_name);
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 2));
  assert_int_equal(c.gradient_accumulation_steps, 8);
  assert_int_equal(c.tierzero.nvme_path.n, 2);
  tz_config_free(&c);
  free(json);
  free(doc);
  free(p);
}

/* The tunables that were read with getenv by their modules: each is a tierzero key, its variable
 * and the key give the same configuration, and a bad value is refused naming the key (or, from
 * the environment, its variable). */
static void test_tunable_keys(void **state) {
  (void)state;
  static const struct {
    const char *key, *var, *value, *bad, *bad_msg;
  } keys[] = {
      {"tierzero.sched_debug", "TZ_SCHED_DEBUG", "1", "2",
       "tierzero.sched_debug: expected 1, 0, true, false, yes, no, on or off, got \"2\""},
      {"tierzero.comm_timeout", "TZ_COMM_TIMEOUT", "12.5", "0", NULL},
  };
  clear_env();
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    struct tz_config by_key, by_env, one;
    tz_config_defaults(&by_key);
    tz_config_defaults(&by_env);
    tz_config_defaults(&one);
    char *dflt = dump_string(&by_key);
    TZ_ASSERT_OK(tz_config_set(&by_key, keys[i].key, keys[i].value));
    setenv(keys[i].var, keys[i].value, 1);
    TZ_ASSERT_OK(tz_config_apply_env(&by_env));
    assert_int_equal(tz_config_env_key(&one, keys[i].key), 1);
    char *a = dump_string(&by_key), *b = dump_string(&by_env), *c = dump_string(&one);
    if (strcmp(a, dflt) == 0)
      print_error("%s=%s leaves the default\n", keys[i].key, keys[i].value);
    assert_string_not_equal(a, dflt);
    assert_string_equal(a, b);
    assert_string_equal(a, c);
    free(a);
    free(b);
    free(c);

    /* A bad value: refused by the key, by the variable, and by the one-key reading. */
    assert_int_equal(tz_config_set(&by_key, keys[i].key, keys[i].bad), TZ_ECONFIG);
    if (keys[i].bad_msg)
      assert_string_equal(tz_err_msg(), keys[i].bad_msg);
    assert_true(strncmp(tz_err_msg(), keys[i].key, strlen(keys[i].key)) == 0);
    setenv(keys[i].var, keys[i].bad, 1);
    assert_int_equal(tz_config_apply_env(&by_env), TZ_ECONFIG);
    assert_true(strncmp(tz_err_msg(), keys[i].var, strlen(keys[i].var)) == 0);
    assert_int_equal(tz_config_env_key(&one, keys[i].key), TZ_ECONFIG);
    assert_true(strncmp(tz_err_msg(), keys[i].var, strlen(keys[i].var)) == 0);
    unsetenv(keys[i].var);
    assert_int_equal(tz_config_env_key(&one, keys[i].key), 0);
    free(dflt);
    tz_config_free(&by_key);
    tz_config_free(&by_env);
    tz_config_free(&one);
  }
  struct tz_config c;
  tz_config_defaults(&c);
  assert_true(c.tierzero.comm_timeout == 300);
  assert_int_equal(tz_config_env_key(&c, "optimizer.params.lr"), TZ_ENOENT);
  tz_config_free(&c);
}

/* zero_optimization.sub_group_size 0, which DeepSpeed accepts and Axolotl's shipped zero3
 * configs use, is accepted (it was refused as not positive). */
static void test_sub_group_size_zero(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, "{\"zero_optimization\": {\"sub_group_size\": 0}}",
                                     "axolotl.json"));
  assert_int_equal(
      tz_config_load_string(&c, "{\"zero_optimization\": {\"sub_group_size\": -1}}", "bad.json"),
      TZ_ECONFIG);
  tz_config_free(&c);
}

/* A backend's settings (tierzero.cuda_attention, tierzero.cuda_matmul): the config keeps the text
 * from the file, --set or the variable (which wins), in the key table's order, and hands each
 * backend its own as one string; what the text means is the backend's to check
 * (tests/test_cuda_choice.c), so any text is stored. */
static void test_backend_settings_text(void **state) {
  (void)state;
  clear_env();
  struct tz_config c;
  tz_config_defaults(&c);
  char buf[128];
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cuda", buf, sizeof buf));
  assert_string_equal(buf, "");
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_matmul", "plain"));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", "wgmma"));
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cuda", buf, sizeof buf));
  assert_string_equal(buf, "attention=wgmma,matmul=plain");
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cpu", buf, sizeof buf));
  assert_string_equal(buf, "");
  const char *key, *backend, *setting, *value;
  assert_int_equal(tz_config_backend_setting(&c, 1, &key, &backend, &setting, &value), 1);
  assert_string_equal(key, "tierzero.cuda_matmul");
  assert_string_equal(backend, "cuda");
  assert_string_equal(setting, "matmul");
  assert_string_equal(value, "plain");
  assert_int_equal(tz_config_backend_setting(&c, 2, &key, &backend, &setting, &value), 0);
  /* the variable wins over the file, as for every key */
  setenv("TZ_CUDA_ATTENTION", "two-pass", 1);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  unsetenv("TZ_CUDA_ATTENTION");
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cuda", buf, sizeof buf));
  assert_string_equal(buf, "attention=two-pass,matmul=plain");
  /* too long for the caller's buffer: said, not cut */
  assert_int_equal(tz_config_backend_settings(&c, "cuda", buf, 10), TZ_EINVAL);
  /* text the backend will refuse is the backend's to refuse */
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.cuda_attention", "fancy"));
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cuda", buf, sizeof buf));
  assert_string_equal(buf, "attention=fancy,matmul=plain");
  tz_config_free(&c);
  /* the hbm tier's (tierzero.gds, tierzero.hbm_pin_piece): a file's bool or count is kept as its
   * text, as --set or the variable would give it */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(
      &c, "{\"tierzero\": {\"gds\": false, \"hbm_pin_piece\": 1048576}}", "t.json"));
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "hbm", buf, sizeof buf));
  assert_string_equal(buf, "gds=false,pin_piece=1048576");
  setenv("TZ_HBM_PIN_PIECE", "2MiB", 1);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  unsetenv("TZ_HBM_PIN_PIECE");
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "hbm", buf, sizeof buf));
  assert_string_equal(buf, "gds=false,pin_piece=2MiB");
  TZ_ASSERT_OK(tz_config_backend_settings(&c, "cuda", buf, sizeof buf));
  assert_string_equal(buf, "");
  /* other JSON kinds are refused by the key, as before */
  assert_int_equal(tz_config_load_string(&c, "{\"tierzero\": {\"gds\": [1]}}", "t.json"),
                   TZ_ECONFIG);
  assert_non_null(strstr(tz_err_msg(), "tierzero.gds"));
  tz_config_free(&c);
}

/* The comm timeout reaches the communicator: through its params from the config (as tz-train
 * sets them), and for a caller without a config from TZ_COMM_TIMEOUT through the same mapping. */
static void test_comm_timeout_reaches_comm(void **state) {
  (void)state;
  clear_env();
  struct tz_comm_params cp;
  tz_comm_params_init(&cp);
  assert_true(tz_comm_timeout(&cp) == 300);
  setenv("TZ_COMM_TIMEOUT", "7.5", 1);
  assert_true(tz_comm_env_timeout() == 7.5);
  assert_true(tz_comm_timeout(&cp) == 7.5);
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_apply_env(&c));
  TZ_ASSERT_OK(tz_config_set(&c, "tierzero.comm_timeout", "42"));
  cp.timeout_s = c.tierzero.comm_timeout;
  assert_true(tz_comm_timeout(&cp) == 42);
  /* A bad variable: warned about, the default kept. */
  setenv("TZ_COMM_TIMEOUT", "soon", 1);
  assert_true(tz_comm_env_timeout() == 300);
  clear_env();
  tz_config_free(&c);
}

int main(void) {
  /* The did-you-mean warnings are expected here; keep the output to failures. */
  tz_log_set_level(TZ_LOG_ERROR);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_zero_infinity_file),
      cmocka_unit_test(test_auto_values),
      cmocka_unit_test(test_tierzero_section),
      cmocka_unit_test(test_merge_files),
      cmocka_unit_test(test_bad_inputs),
      cmocka_unit_test(test_exact_messages),
      cmocka_unit_test(test_file_errors),
      cmocka_unit_test(test_ignored_and_suggestions),
      cmocka_unit_test(test_env),
      cmocka_unit_test(test_env_precedence),
      cmocka_unit_test(test_set),
      cmocka_unit_test(test_sizes),
      cmocka_unit_test(test_resolve_batch),
      cmocka_unit_test(test_keys_without_field),
      cmocka_unit_test(test_dump_round_trip),
      cmocka_unit_test(test_docs_cover_keys),
      cmocka_unit_test(test_tunable_keys),
      cmocka_unit_test(test_backend_settings_text),
      cmocka_unit_test(test_sub_group_size_zero),
      cmocka_unit_test(test_comm_timeout_reaches_comm),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
