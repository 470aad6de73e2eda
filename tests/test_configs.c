/* The JSON files shipped in configs/: each loads with tz_config_load_file, resolves its batch
 * at the world size it is meant for, names a model preset that exists, and has the settings its
 * name promises. The DeepSpeed ones keep DeepSpeed-only sections, which are listed as ignored,
 * and a tensorboard section, which is honoured. */
#define _GNU_SOURCE
#include "testlib.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/error.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"

static char *configs_dir(void) {
  const char *data = getenv("TZ_TEST_DATA");
  char *p = NULL;
  if (asprintf(&p, "%s/../../configs", data ? data : "tests/data") < 0)
    return NULL;
  return p;
}

static int is_ignored(const struct tz_config *c, const char *path) {
  for (int i = 0; i < tz_config_ignored_count(c); i++)
    if (strcmp(tz_config_ignored(c, i), path) == 0)
      return 1;
  return 0;
}

static void load(const char *name, struct tz_config *c) {
  char *dir = configs_dir(), *p = NULL;
  assert_true(asprintf(&p, "%s/%s", dir, name) > 0);
  tz_config_defaults(c);
  TZ_ASSERT_OK(tz_config_load_file(c, p));
  free(p);
  free(dir);
}

/* The generic checks: a known model (when named), the batch resolved at world size W, ZeRO-3. */
static void check_common(struct tz_config *c, int world) {
  assert_int_equal(c->zero_optimization.stage, 3);
  if (c->tierzero.model) {
    struct tz_model_config m;
    TZ_ASSERT_OK(tz_model_preset(c->tierzero.model, &m));
  }
  TZ_ASSERT_OK(tz_config_resolve_batch(c, world));
  assert_int_equal(c->train_batch_size,
                   c->train_micro_batch_size_per_gpu * c->gradient_accumulation_steps * world);
}

static void test_demo(void **state) {
  (void)state;
  struct tz_config c;
  load("demo.json", &c);
  check_common(&c, 1);
  assert_string_equal(c.tierzero.model, "tiny");
  /* Small enough that the tiny model's state (about 15 MB of parameters, gradients and Adam
   * state) does not fit and streams, yet above the scheduler's minimum for it (about 14 MB of
   * buffers and window: tz-train --plan). */
  assert_true(c.tierzero.hbm_budget > 0 && c.tierzero.hbm_budget <= (16u << 20));
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_CPU);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NVME);
  assert_string_equal(c.zero_optimization.offload_optimizer.nvme_path, "/tmp");
  /* /tmp is often tmpfs, which has no O_DIRECT. */
  assert_int_equal(c.tierzero.nvme_buffered, 1);
  /* Runs on the CPU backend as well: fp32. */
  assert_int_equal(c.precision, TZ_PRECISION_FP32);
  assert_int_equal(tz_config_ignored_count(&c), 0);
  tz_config_free(&c);
}

static void test_llama(void **state) {
  (void)state;
  static const struct {
    const char *file, *model;
    int world;
    enum tz_offload_device param, optim;
  } cases[] = {
      {"llama-1b-1gpu.json", "llama-1b", 1, TZ_OFFLOAD_NONE, TZ_OFFLOAD_CPU},
      {"llama-7b-1gpu.json", "llama-7b", 1, TZ_OFFLOAD_CPU, TZ_OFFLOAD_CPU},
      {"llama-13b-1gpu.json", "llama-13b", 1, TZ_OFFLOAD_CPU, TZ_OFFLOAD_NVME},
      {"llama-7b-2gpu.json", "llama-7b", 2, TZ_OFFLOAD_CPU, TZ_OFFLOAD_CPU},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tz_config c;
    load(cases[i].file, &c);
    check_common(&c, cases[i].world);
    assert_string_equal(c.tierzero.model, cases[i].model);
    assert_int_equal(c.precision, TZ_PRECISION_BF16);
    assert_int_equal(c.zero_optimization.offload_param.device, cases[i].param);
    assert_int_equal(c.zero_optimization.offload_optimizer.device, cases[i].optim);
    assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAMW);
    assert_true(c.gradient_clipping == 1.0);
    assert_int_equal(tz_config_ignored_count(&c), 0);
    tz_config_free(&c);
  }
  /* Two GPUs: 64 sequences of 4 per GPU make 8 accumulation steps. */
  struct tz_config c;
  load("llama-7b-2gpu.json", &c);
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 2));
  assert_int_equal(c.gradient_accumulation_steps, 8);
  tz_config_free(&c);
}

static void test_cpu_only(void **state) {
  (void)state;
  struct tz_config c;
  load("cpu-only.json", &c);
  check_common(&c, 1);
  assert_string_equal(c.tierzero.model, "tiny");
  assert_int_equal(c.precision, TZ_PRECISION_FP32);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_NONE);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NONE);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP);
  tz_config_free(&c);
}

/* The throughput harness's configs (tools/bench-train.sh): the settings of the FSDP2 peer it is
 * compared with (bench/fsdp_peer.py: micro-batch 4, no accumulation, AdamW at a constant 1e-4
 * with betas 0.9/0.95 and weight decay 0.1, clipping at 1.0, bf16 with fp32 reduction), no model
 * named (the harness passes --model), and only the placement differing between them. */
static void test_bench(void **state) {
  (void)state;
  static const struct {
    const char *file;
    enum tz_offload_device param, optim;
    uint64_t host_budget;
    const char *nvme_dir; /* tierzero.nvme_path or the optimizer's, NULL: none */
  } cases[] = {
      {"bench-offload.json", TZ_OFFLOAD_CPU, TZ_OFFLOAD_CPU, 116ull << 30, NULL},
      {"bench-auto.json", TZ_OFFLOAD_CPU, TZ_OFFLOAD_CPU, 116ull << 30, "/var/tmp/tz-bench-nvme"},
      {"bench-nvme.json", TZ_OFFLOAD_CPU, TZ_OFFLOAD_NVME, 48ull << 30, "/var/tmp/tz-bench-nvme"},
      {"bench-stream.json", TZ_OFFLOAD_CPU, TZ_OFFLOAD_NONE, 116ull << 30, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    struct tz_config c;
    load(cases[i].file, &c);
    check_common(&c, 1);
    assert_null(c.tierzero.model);
    assert_int_equal(c.train_micro_batch_size_per_gpu, 4);
    assert_int_equal(c.gradient_accumulation_steps, 1);
    assert_true(c.gradient_clipping == 1.0);
    assert_int_equal(c.precision, TZ_PRECISION_BF16);
    assert_int_equal(c.communication_data_type, TZ_PRECISION_FP32);
    assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAMW);
    assert_true(c.optimizer.lr == 1e-4);
    assert_true(c.optimizer.betas[0] == 0.9 && c.optimizer.betas[1] == 0.95);
    assert_true(c.optimizer.weight_decay == 0.1);
    assert_int_equal(c.scheduler.type, TZ_LR_CONSTANT);
    assert_int_equal(c.zero_optimization.offload_param.device, cases[i].param);
    assert_int_equal(c.zero_optimization.offload_optimizer.device, cases[i].optim);
    assert_true(c.tierzero.host_budget == cases[i].host_budget);
    const char *dir = c.tierzero.nvme_path.n > 0 ? c.tierzero.nvme_path.path[0]
                                                 : c.zero_optimization.offload_optimizer.nvme_path;
    if (cases[i].nvme_dir)
      assert_string_equal(dir, cases[i].nvme_dir);
    else
      assert_null(dir);
    assert_int_equal(tz_config_ignored_count(&c), 0);
    tz_config_free(&c);
  }
}

static void test_deepspeed(void **state) {
  (void)state;
  struct tz_config c;
  load("ds-zero-infinity-cpu.json", &c);
  check_common(&c, 1);
  assert_int_equal(c.train_batch_size, 16);
  assert_null(c.tierzero.model);
  assert_int_equal(c.precision, TZ_PRECISION_FP16);
  assert_true(c.fp16.loss_scale == 0.0);
  assert_int_equal(c.fp16.initial_scale_power, 16);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_CPU);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_CPU);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP);
  /* DeepSpeed's monitor: written during the run, as DeepSpeed writes it */
  assert_int_equal(c.tensorboard.enabled, 1);
  assert_string_equal(c.tensorboard.output_path, "output/ds_logs/");
  assert_string_equal(c.tensorboard.job_name, "zero_infinity_cpu");
  assert_false(is_ignored(&c, "tensorboard"));
  assert_true(is_ignored(&c, "flops_profiler"));
  assert_true(is_ignored(&c, "zero_optimization.stage3_gather_16bit_weights_on_model_save"));
  tz_config_free(&c);

  load("ds-zero-infinity-nvme.json", &c);
  check_common(&c, 4);
  assert_int_equal(c.gradient_accumulation_steps, 8);
  assert_int_equal(c.precision, TZ_PRECISION_BF16);
  assert_int_equal(c.optimizer.type, TZ_OPTIMIZER_ADAM);
  assert_int_equal(c.optimizer.adam_w_mode, 1);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP_DECAY);
  assert_int_equal(c.scheduler.total_num_steps, 100000);
  assert_int_equal(c.zero_optimization.offload_param.device, TZ_OFFLOAD_NVME);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_NVME);
  assert_string_equal(c.zero_optimization.offload_param.nvme_path, "/local_nvme");
  assert_int_equal(c.aio.block_size, 1048576);
  assert_int_equal(c.tensorboard.enabled, 1);
  assert_string_equal(c.tensorboard.job_name, "zero_infinity_nvme");
  assert_true(is_ignored(&c, "flops_profiler"));
  assert_true(is_ignored(&c, "comms_logger"));
  tz_config_free(&c);
}

/* configs/models/: Hugging Face config.json shapes for tz-train --model (and tools/bench-train.sh
 * MODEL). llama-15b is issue 26's shape for all three tiers: hidden 5120, ffn 13824, 40 heads, 48
 * layers, vocab 32000, untied: 15.55 B parameters, some 260 GiB of state at 18 bytes each. */
static void test_models(void **state) {
  (void)state;
  char *dir = configs_dir(), *path = NULL;
  assert_true(asprintf(&path, "%s/models/llama-15b.json", dir) > 0);
  struct tz_model_config mc;
  enum tz_dtype dt;
  TZ_ASSERT_OK(tz_hf_config_read(path, &mc, &dt));
  assert_int_equal(mc.d_model, 5120);
  assert_int_equal(mc.ffn_dim, 13824);
  assert_int_equal(mc.n_head, 40);
  assert_int_equal(mc.n_kv_head, 40);
  assert_int_equal(mc.n_layer, 48);
  assert_int_equal(mc.vocab, 32000);
  assert_false(mc.tie_embeddings);
  assert_true(tz_model_n_params(&mc) == 15553500160ull);
  free(path);
  free(dir);
}

/* sft-1gpu.json: fine-tuning as TRL's SFTTrainer defaults have it (lr 2e-5, no weight decay,
 * clipping 1.0), a cosine schedule, bf16, optimizer state in host memory, long documents cut. */
static void test_sft(void **state) {
  (void)state;
  struct tz_config c;
  load("sft-1gpu.json", &c);
  assert_true(c.optimizer.lr == 2e-5 && c.optimizer.weight_decay == 0.0);
  assert_true(c.gradient_clipping == 1.0);
  assert_int_equal(c.scheduler.type, TZ_LR_WARMUP_COSINE);
  assert_int_equal(c.zero_optimization.offload_optimizer.device, TZ_OFFLOAD_CPU);
  assert_int_equal(c.tierzero.long_documents, 0);
  assert_int_equal(c.tierzero.epochs, 0);
  tz_config_free(&c);
}

/* Every file in configs/ is one of those checked above, and loads. */
static void test_all_listed(void **state) {
  (void)state;
  static const char *const known[] = {
      "bench-auto.json",
      "bench-nvme.json",
      "bench-offload.json",
      "bench-stream.json",
      "cpu-only.json",
      "demo.json",
      "ds-zero-infinity-cpu.json",
      "ds-zero-infinity-nvme.json",
      "llama-13b-1gpu.json",
      "llama-1b-1gpu.json",
      "llama-7b-1gpu.json",
      "llama-7b-2gpu.json",
      "sft-1gpu.json",
  };
  char *dir = configs_dir(), *pat = NULL;
  assert_true(asprintf(&pat, "%s/*.json", dir) > 0);
  glob_t g;
  assert_int_equal(glob(pat, 0, NULL, &g), 0);
  assert_int_equal(g.gl_pathc, sizeof known / sizeof known[0]);
  for (size_t i = 0; i < g.gl_pathc; i++) {
    const char *base = strrchr(g.gl_pathv[i], '/') + 1;
    int found = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
      found |= strcmp(base, known[k]) == 0;
    if (!found)
      print_error("configs/%s has no test in test_configs.c\n", base);
    assert_true(found);
    struct tz_config c;
    tz_config_defaults(&c);
    TZ_ASSERT_OK(tz_config_load_file(&c, g.gl_pathv[i]));
    tz_config_free(&c);
  }
  globfree(&g);
  free(pat);
  free(dir);
}

int main(void) {
  char *dir = configs_dir();
  char *probe = NULL;
  if (!dir || asprintf(&probe, "%s/demo.json", dir) < 0)
    return 1;
  FILE *f = fopen(probe, "r");
  if (!f)
    tz_test_skip("%s not found (TZ_TEST_DATA should be the source tree's tests/data)", probe);
  fclose(f);
  free(probe);
  free(dir);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_demo),       cmocka_unit_test(test_llama),
      cmocka_unit_test(test_cpu_only),   cmocka_unit_test(test_bench),
      cmocka_unit_test(test_deepspeed),  cmocka_unit_test(test_sft),
      cmocka_unit_test(test_all_listed), cmocka_unit_test(test_models),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
