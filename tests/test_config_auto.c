/* DeepSpeed "auto" values and keys without effect (issue #27 item 10), docs/config.md:
 *  - "auto" resolves as Hugging Face Trainer's DeepSpeed integration resolves it where its rule
 *    ties the key to another value of the run: scheduler.params.warmup_max_lr takes the
 *    optimizer's lr, warmup_min_lr 0, total_num_steps the run's steps; elsewhere Hugging Face
 *    TrainingArguments' default (lr 5e-5, clipping 1.0, micro-batch 8 with no batch size given;
 *    a warm-up "auto" needs --warmup-ratio), and the report says which rule gave each value;
 *  - the keys given "auto" and the keys set that have no effect in tierzero are listed once each,
 *    in table order, however often they were set;
 *  - tz-train prints both at start, and the metrics file's first line holds the resolved
 *    configuration. */
#define _GNU_SOURCE
#include "testlib.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/config.h"
#include "core/error.h"

static char *dir;

static const char *auto_json =
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": \"auto\",\n"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": \"auto\"}},\n"
    " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": \"auto\",\n"
    "   \"warmup_max_lr\": \"auto\", \"warmup_num_steps\": 2}},\n"
    " \"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 1e9,\n"
    "   \"reduce_bucket_size\": \"auto\"},\n"
    " \"aio\": {\"thread_count\": 2},\n"
    " \"activation_checkpointing\": {\"partition_activations\": true},\n"
    " \"steps_per_print\": 10}\n";

static char *report(const struct tz_config *c, int64_t steps, char **err) {
  char *out = NULL, *e = NULL;
  size_t n = 0, ne = 0;
  FILE *f = open_memstream(&out, &n), *fe = open_memstream(&e, &ne);
  tz_config_report(c, steps, f, fe);
  fclose(f);
  fclose(fe);
  *err = e;
  return out;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
    n++;
  return n;
}

static void test_warmup_max_lr_takes_the_optimizer_lr(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, auto_json, "auto.json"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  assert_float_equal(c.scheduler.warmup_max_lr, 3e-4, 0);
  assert_float_equal(c.scheduler.warmup_min_lr, 0, 0);
  assert_int_equal(c.gradient_accumulation_steps, 1);
  /* An explicit value stays. */
  TZ_ASSERT_OK(tz_config_set(&c, "scheduler.params.warmup_max_lr", "0.002"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  assert_float_equal(c.scheduler.warmup_max_lr, 2e-3, 0);
  tz_config_free(&c);
}

static void test_lists(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, auto_json, "auto.json"));
  /* Loaded twice: still listed once. */
  TZ_ASSERT_OK(tz_config_load_string(&c, auto_json, "auto.json"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  static const char *const autos[] = {"gradient_accumulation_steps", "optimizer.params.betas",
                                      "scheduler.params.warmup_min_lr",
                                      "scheduler.params.warmup_max_lr"};
  assert_int_equal(tz_config_auto_count(&c), 4);
  for (int i = 0; i < 4; i++)
    assert_string_equal(tz_config_auto_key(&c, i), autos[i]);
  assert_null(tz_config_auto_key(&c, 4));
  static const char *const none[] = {
      "zero_optimization.reduce_bucket_size", "zero_optimization.sub_group_size",
      "aio.thread_count", "activation_checkpointing.partition_activations", "steps_per_print"};
  assert_int_equal(tz_config_no_effect_count(&c), 5);
  for (int i = 0; i < 5; i++)
    assert_string_equal(tz_config_no_effect_key(&c, i), none[i]);
  assert_null(tz_config_no_effect_key(&c, 5));
  /* A value given later replaces the "auto". */
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.betas", "0.9,0.95"));
  assert_int_equal(tz_config_auto_count(&c), 3);
  /* A copy keeps both lists. */
  struct tz_config d;
  TZ_ASSERT_OK(tz_config_copy(&d, &c));
  assert_int_equal(tz_config_auto_count(&d), 3);
  assert_int_equal(tz_config_no_effect_count(&d), 5);
  tz_config_free(&d);
  tz_config_free(&c);
}

static void test_report(void **state) {
  (void)state;
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, auto_json, "auto.json"));
  TZ_ASSERT_OK(tz_config_set(&c, "scheduler.params.total_num_steps", "auto"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  char *err, *out = report(&c, 20, &err);
  const char *want[] = {"scheduler.params.warmup_max_lr = 0.0003 (optimizer.params.lr",
                        "scheduler.params.warmup_min_lr = 0 (",
                        "scheduler.params.total_num_steps = 20 (the run's steps",
                        "optimizer.params.betas = [0.9, 0.999] (Hugging Face's --adam_beta1",
                        "gradient_accumulation_steps = 1 ("};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (!strstr(out, want[i]))
      print_error("the report lacks \"%s\":\n%s\n", want[i], out);
    assert_non_null(strstr(out, want[i]));
  }
  const char *none[] = {"zero_optimization.sub_group_size", "aio.thread_count",
                        "activation_checkpointing.partition_activations", "steps_per_print",
                        "zero_optimization.reduce_bucket_size"};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
    if (count_of(err, none[i]) != 1)
      print_error("%s should be named once:\n%s\n", none[i], err);
    assert_int_equal(count_of(err, none[i]), 1);
  }
  assert_non_null(strstr(err, "no effect"));
  free(out);
  free(err);
  /* Nothing "auto" and nothing without effect: nothing to say. */
  tz_config_free(&c);
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "train_micro_batch_size_per_gpu", "2"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  out = report(&c, 20, &err);
  assert_string_equal(out, "");
  assert_string_equal(err, "");
  free(out);
  free(err);
  tz_config_free(&c);
}

/* Keys left "auto" take Hugging Face TrainingArguments' defaults where they differ from
 * tierzero's (learning_rate 5e-5, max_grad_norm 1.0, per_device_train_batch_size 8); a value
 * given after them (tz-train's flags) wins; a micro-batch "auto" beside a train_batch_size is
 * derived from it. */
static void test_trainer_defaults(void **state) {
  (void)state;
  static const char *hf =
      "{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\",\n"
      " \"gradient_accumulation_steps\": \"auto\", \"gradient_clipping\": \"auto\",\n"
      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": "
      "\"auto\",\n   \"eps\": \"auto\", \"weight_decay\": \"auto\"}}}\n";
  struct tz_config c;
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, hf, "hf.json"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 2));
  assert_float_equal(c.optimizer.lr, 5e-5, 0);
  assert_float_equal(c.gradient_clipping, 1.0, 0);
  assert_float_equal(c.optimizer.weight_decay, 0.0, 0);
  assert_float_equal(c.optimizer.eps, 1e-8, 0);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 8);
  assert_int_equal(c.gradient_accumulation_steps, 1);
  assert_int_equal(c.train_batch_size, 16);
  tz_config_free(&c);
  /* the flags after the file */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_load_string(&c, hf, "hf.json"));
  TZ_ASSERT_OK(tz_config_set(&c, "optimizer.params.lr", "2e-5"));
  TZ_ASSERT_OK(tz_config_set(&c, "gradient_clipping", "0.5"));
  TZ_ASSERT_OK(tz_config_set(&c, "train_batch_size", "12"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  assert_float_equal(c.optimizer.lr, 2e-5, 0);
  assert_float_equal(c.gradient_clipping, 0.5, 0);
  assert_int_equal(c.train_micro_batch_size_per_gpu, 12);
  tz_config_free(&c);
  /* absent, not "auto": tierzero's own defaults */
  tz_config_defaults(&c);
  TZ_ASSERT_OK(tz_config_set(&c, "train_micro_batch_size_per_gpu", "2"));
  TZ_ASSERT_OK(tz_config_resolve_batch(&c, 1));
  assert_float_equal(c.optimizer.lr, 1e-3, 0);
  assert_float_equal(c.gradient_clipping, 0.0, 0);
  tz_config_free(&c);
}

/* tz-train on the cpu backend with json as its --config and args after; its output (stdout and
 * stderr) in out. Returns the exit status, -1 when it did not exit. Skips without TZ_BIN. */
static int tz_train_with(const char *json, const char *args, char *out, size_t len) {
  const char *bin = getenv("TZ_BIN");
  if (!bin)
    skip();
  char path[1100], cmd[4096];
  snprintf(path, sizeof path, "%s/given.json", dir);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(json, f);
  fclose(f);
  snprintf(cmd, sizeof cmd,
           "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s/tz-train --backend cpu --config %s "
           "--model tiny --seq 16 --data synthetic %s > %s/out 2>&1",
           dir, bin, path, args, dir);
  int st = system(cmd);
  snprintf(path, sizeof path, "%s/out", dir);
  f = fopen(path, "r");
  assert_non_null(f);
  out[fread(out, 1, len - 1, f)] = 0;
  fclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A warm-up left "auto" is filled by --warmup-ratio, as Hugging Face's Trainer fills it; without
 * one tz-train refuses it naming the flags (the Trainer's default, 0, is refused by DeepSpeed
 * 0.19), where it refused --warmup-ratio beside it as two warm-ups. */
static void test_warmup_auto(void **state) {
  (void)state;
  static const char *json =
      "{\"train_micro_batch_size_per_gpu\": 2, \"scheduler\": {\"type\": \"WarmupDecayLR\",\n"
      " \"params\": {\"warmup_num_steps\": \"auto\", \"total_num_steps\": \"auto\"}}}\n";
  static char out[1 << 16];
  for (int ratio = 0; ratio < 2; ratio++) {
    int st =
        tz_train_with(json, ratio ? "--steps 4 --warmup-ratio 0.5" : "--steps 4", out, sizeof out);
    if ((st == 0) != ratio)
      print_error("--warmup-ratio %s: exit %d\n%s\n", ratio ? "0.5" : "absent", st, out);
    assert_int_equal(st == 0, ratio);
    if (!ratio)
      assert_true(strstr(out, "warmup_num_steps is \"auto\"") && strstr(out, "--warmup-ratio"));
  }
}

/* tz-train prints the report once at start, and the metrics file's header holds the resolved
 * configuration. */
static void test_tz_train(void **state) {
  (void)state;
  static char out[1 << 16];
  char args[1200], path[1100];
  snprintf(args, sizeof args, "--steps 2 --metrics %s/m.jsonl", dir);
  int st = tz_train_with(auto_json, args, out, sizeof out);
  if (st != 0)
    print_error("%s\n", out);
  assert_int_equal(st, 0);
  assert_int_equal(count_of(out, "scheduler.params.warmup_max_lr = 0.0003"), 1);
  assert_int_equal(count_of(out, "aio.thread_count"), 1);
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  json_error_t err;
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[1 << 14];
  assert_non_null(fgets(line, sizeof line, f));
  fclose(f);
  json_t *o = json_loads(line, 0, &err);
  assert_non_null(o);
  json_t *sp =
      json_object_get(json_object_get(json_object_get(o, "config"), "scheduler"), "params");
  assert_float_equal(json_number_value(json_object_get(sp, "warmup_max_lr")), 3e-4, 1e-15);
  json_decref(o);
}

int main(void) {
  dir = tz_test_mkdtemp("config-auto");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_warmup_max_lr_takes_the_optimizer_lr),
      cmocka_unit_test(test_lists),
      cmocka_unit_test(test_report),
      cmocka_unit_test(test_tz_train),
      cmocka_unit_test(test_trainer_defaults),
      cmocka_unit_test(test_warmup_auto),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
