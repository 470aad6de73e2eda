/* tz-train from the command line ($TZ_BIN/tz-train): a short run writes one JSON object per step
 * with its step and loss, and the loss falls; --plan prints the placement and the bound without
 * training; a compute budget below the minimum is refused with the missing amount; bad flags are
 * usage errors; evaluation, export and import (bit-exact round trip), export from a checkpoint
 * (f32 and bf16), the lane trace, and fp16 loss scaling from the command line, resumed with its
 * scaler state; a diverging run (lr 1e30) exiting 1 at its first non-finite step; a SIGTERM after
 * the last step ending nothing; a resumed
 * run's metrics file, --progress, and --version of every program. */
#define _GNU_SOURCE
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/compute.h"
#include "testlib.h"
#include "trainer/checkpoint/checkpoint.h"

#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char *dir;
static char bin[1024];

/* Runs tz-train with args on the cpu backend (what these checks expect: fp32 compute under fp16
 * storage, host->compute traffic of a tiny model; test_train_gpu covers the GPU); its output goes
 * to dir/out. Returns the exit status. */
static int tz_train(const char *args) {
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 %s --backend cpu %s > %s/out 2>&1", dir, bin,
           args, dir);
  int st = system(cmd);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static char *output(void) {
  char path[1100];
  snprintf(path, sizeof path, "%s/out", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = 0;
  fclose(f);
  return buf;
}

static void write_config(const char *name, const char *json) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(json, f);
  fclose(f);
}

/* The rate of "a layer's forward and backward run at R TFLOP/s here" in the output, and whether
 * it says it was cached; -1 without the line. */
static double layer_line(int *cached) {
  const char *at = strstr(output(), "a layer's forward and backward run at ");
  if (!at)
    return -1;
  *cached = strstr(at, "cached") && strstr(at, "cached") < strchr(at, '\n');
  return atof(at + strlen("a layer's forward and backward run at "));
}

/* Whether the last run came in under its plan's bound (which drops the cached rates and the
 * layer's timing, so that the next run measures again). */
static int under_bound(void) { return strstr(output(), "under the plan's") != NULL; }

/* The layer's timed rate is cached beside the machine's rates (the probe takes about a second
 * for a tiny layer, minutes for a large one on CPUs): the next run at the same shape reads it,
 * unless the run before came in under its bound (it drops the timing: a loaded machine, or a
 * sanitizer's, can time the layer slow); --remeasure times it again, another shape or micro-batch
 * is timed. */
static void test_layer_rate_cached(void **state) {
  (void)state;
  char cache[1100], args[1024];
  snprintf(cache, sizeof cache, "rm -rf %s/cache", dir);
  assert_int_equal(system(cache), 0);
  const char *base = "--model tiny --steps 1 --seq 16 --data synthetic";
  int cached = -1;
  assert_int_equal(tz_train(base), 0);
  double first = layer_line(&cached);
  assert_true(first > 0 && cached == 0);
  int dropped = under_bound();
  assert_int_equal(tz_train(base), 0);
  double again = layer_line(&cached);
  if (dropped)
    assert_true(again > 0 && cached == 0);
  else
    assert_true(again == first && cached == 1);
  snprintf(args, sizeof args, "%s --remeasure", base);
  assert_int_equal(tz_train(args), 0);
  assert_true(layer_line(&cached) > 0 && cached == 0);
  assert_int_equal(tz_train("--model tiny --steps 1 --seq 32 --data synthetic"), 0);
  assert_true(layer_line(&cached) > 0 && cached == 0);
  snprintf(args, sizeof args, "%s --set train_micro_batch_size_per_gpu=2", base);
  assert_int_equal(tz_train(args), 0);
  assert_true(layer_line(&cached) > 0 && cached == 0);
  for (int n = 0; n < 2; n++) { /* read unless the run before dropped it */
    dropped = under_bound();
    assert_int_equal(tz_train(args), 0);
    assert_true(layer_line(&cached) > 0);
    assert_int_equal(cached, !dropped);
  }
}

static void test_run(void **state) {
  (void)state;
  write_config("ds.json",
               "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,\n"
               " \"gradient_clipping\": 1.0,\n"
               " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},\n"
               " \"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\"},\n"
               "   \"offload_optimizer\": {\"device\": \"cpu\"}}}\n");
  char args[2048];
  snprintf(args, sizeof args,
           "--config %s/ds.json --model tiny --steps 8 --seed 3 --seq 32 "
           "--data synthetic --metrics %s/m.jsonl",
           dir, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 8/8"));
  assert_null(strstr(output(), "tz-sched "));
  /* tierzero.sched_debug: the scheduler's decisions on stderr. */
  assert_int_equal(tz_train("--model tiny --steps 1 --seq 32 --set tierzero.sched_debug=true"), 0);
  assert_non_null(strstr(output(), "tz-sched "));
  char path[1100];
  snprintf(path, sizeof path, "%s/m.jsonl", dir);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int n = 0;
  double first = 0, last = 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    assert_non_null(o);
    if (json_is_true(json_object_get(o, "summary")) || !json_object_get(o, "step")) {
      json_decref(o);
      continue;
    }
    assert_int_equal(json_integer_value(json_object_get(o, "step")), n + 1);
    json_t *loss = json_object_get(o, "loss");
    assert_true(json_is_number(loss));
    assert_true(json_is_number(json_object_get(o, "step_s")));
    assert_true(json_is_number(json_object_get(o, "bound_s")));
    assert_true(json_is_number(json_object_get(o, "stall_s")));
    if (n == 0)
      first = json_number_value(loss);
    last = json_number_value(loss);
    json_decref(o);
    n++;
  }
  fclose(f);
  assert_int_equal(n, 8);
  assert_true(last < first);
}

/* The built-in corpus, the default data. */
static void test_corpus(void **state) {
  (void)state;
  int rc = tz_train("--model tiny --steps 2 --seq 32");
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 2/2"));
  assert_non_null(strstr(output(), "data: "));
}

static void test_plan(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --plan --auto-placement --set tierzero.hbm_budget=24MiB "
           "--set tierzero.host_budget=4MiB --set tierzero.nvme_path=%s",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  const char *out = output();
  assert_non_null(strstr(out, "bound"));
  assert_non_null(strstr(out, "the plan's rates: host link"));
  assert_non_null(strstr(out, "layer3"));
  assert_null(strstr(out, "step 1/"));
  assert_int_equal(tz_train("--model tiny --plan --set tierzero.hbm_budget=3MiB"), 1);
  assert_non_null(strstr(output(), "short of the minimum"));
  assert_int_equal(tz_train("--steps -1"), 2);
  assert_int_equal(tz_train("--optimizer-step sideways"), 2);
  assert_int_equal(tz_train("--model tiny --steps 1 --set gradient_clipping=1 "
                            "--optimizer-step overlapped"),
                   2);
  assert_non_null(strstr(output(), "gradient_clipping"));
}

/* A compute budget that cannot hold the layers' inputs beside the rest: the plan homes them in
 * host memory (its table's "act" row), and the run trains with them there. */
static void test_inputs_on_host(void **state) {
  (void)state;
  int rc = tz_train("--model tiny --seq 256 --steps 2 --data synthetic --auto-placement "
                    "--set tierzero.recompute=all --set tierzero.hbm_budget=26MiB");
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  const char *act = strstr(output(), "  act  ");
  assert_non_null(act);
  int compute = -1, host = -1;
  assert_int_equal(sscanf(act, " act compute %d host %d", &compute, &host), 2);
  if (host == 0)
    print_error("%s", output());
  assert_true(host > 0);
  assert_int_equal(compute + host, 5); /* four layers and the head; nothing on nvme */
  assert_non_null(strstr(output(), "step 2/2"));
}

/* --plan --fit with --model a Hugging Face config.json: the model tz_run would train (it said
 * "no preset" where --fit chose its model by a preset's name alone). */
static void test_fit_config_json(void **state) {
  (void)state;
  write_config("fit-config.json",
               "{\"model_type\": \"llama\", \"architectures\": [\"LlamaForCausalLM\"], "
               "\"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 2, "
               "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"vocab_size\": 256, "
               "\"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-6, \"rope_theta\": 10000, "
               "\"tie_word_embeddings\": true}");
  char args[2048];
  snprintf(args, sizeof args,
           "--model %s/fit-config.json --seq 16 --plan --fit micro-batch "
           "--set tierzero.host_budget=64MiB",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "--fit micro-batch: the largest micro-batch"));
}

/* Planning for a GPU from a machine without one: --gpu-memory and --layer-rate stand in for what
 * the GPU would say, the rates come from the GPU machine's cache (--rates); without them there the
 * error says so; both options are for --plan only. */
static void test_plan_for_gpu(void **state) {
  (void)state;
  char rates[1100], args[4096];
  snprintf(rates, sizeof rates, "%s/gpu-rates.json", dir);
  FILE *f = fopen(rates, "w");
  assert_non_null(f);
  fprintf(f, "{\"version\": 5, \"cuda|nvme:-\": {\"flops\": 8.6e14, \"copy_in\": 5.3e10, "
             "\"copy_out\": 5.4e10, \"copy_duplex\": 9.6e10, \"copy_in_both\": 4.0e10, "
             "\"copy_out_both\": 5.1e10, \"copy_local\": 1.6e12, "
             "\"nvme_read\": 0, \"nvme_write\": 0, \"nvme_duplex\": 0, \"adam\": 1.3e11, "
             "\"adam_home\": 1.4e9}}\n");
  fclose(f);
  /* the host budget given: this machine's (what is available now) depends on what else runs */
  const char *offload = "--model llama-1b --seq 2048 --set train_micro_batch_size_per_gpu=4 "
                        "--set zero_optimization.offload_param.device=cpu "
                        "--set zero_optimization.offload_optimizer.device=cpu "
                        "--set tierzero.host_budget=100GiB";
  snprintf(args, sizeof args,
           "--backend cuda --plan --gpu-memory 139GiB --layer-rate 446 %s --rates %s", offload,
           rates);
  int rc = tz_train(args);
  if (rc != 0 && strstr(output(), "has no CUDA")) {
    print_message("this build has no CUDA: planning for a GPU not checked\n");
  } else {
    if (rc != 0)
      print_error("%s", output());
    assert_int_equal(rc, 0);
    const char *out = output();
    assert_non_null(strstr(out, "cuda backend"));
    assert_non_null(strstr(out, "446 TFLOP/s"));
    assert_non_null(strstr(out, "scheduler window"));
    assert_non_null(strstr(out, "bound "));
    snprintf(args, sizeof args,
             "--backend cuda --plan --gpu-memory 139GiB --layer-rate 446 %s --rates %s/none.json",
             offload, dir);
    char why[256];
    rc = tz_train(args);
    if (tz_compute_probe("cuda", why, sizeof why) == 0) {
      /* This machine has a GPU: it measures the rates the file lacks. */
      if (rc != 0)
        print_error("%s", output());
      assert_int_equal(rc, 0);
      assert_non_null(strstr(output(), "plan's rates"));
    } else {
      assert_int_not_equal(rc, 0);
      assert_non_null(strstr(output(), "holds no rates"));
    }
    /* One rank of two, planned here: its shards, the rates as given, the host budget given. */
    snprintf(args, sizeof args,
             "--backend cuda --plan --world 2 --collective-rate 150 --gpu-memory 139GiB "
             "--layer-rate 446 %s --rates %s",
             offload, rates);
    rc = tz_train(args);
    if (rc != 0)
      print_error("%s", output());
    assert_int_equal(rc, 0);
    out = output();
    assert_non_null(strstr(out, "2 ranks"));
    assert_non_null(strstr(out, "(in 40.0 beside out 51.0)"));
    assert_non_null(strstr(out, "collectives 150.0 GB/s"));
    assert_null(strstr(out, "some rates unknown"));
  }
  assert_int_equal(tz_train("--model tiny --world 2"), 2); /* not --plan */
  assert_int_equal(tz_train("--model tiny --plan --world 0"), 2);
  assert_int_equal(tz_train("--model tiny --plan --world 2 --nproc 2"), 2); /* one or the other */
  assert_int_equal(tz_train("--model tiny --plan --collective-rate x"), 2);
  assert_int_equal(tz_train("--model tiny --gpu-memory 100GiB --backend cuda"), 2);
  assert_int_equal(tz_train("--model tiny --plan --gpu-memory 100GiB"), 2); /* --backend cpu */
  assert_int_equal(tz_train("--model tiny --plan --layer-rate -3"), 2);
}

/* A read of the optimizer state from NVMe fails, or returns a flipped bit: the run stops with the
 * error, naming the block, instead of hanging or training on bad data. */
static void test_faults(void **state) {
  (void)state;
  /* Creation writes the 18 nvme blocks (master, m, v of 6 model blocks) through the fault tier
   * first; the 20th operation is one of the first step's. */
  const char *specs[] = {"eio@20", "flip@20"};
  const char *says[] = {"failed", "checksum"};
  for (int i = 0; i < 2; i++) {
    char args[2048];
    snprintf(args, sizeof args,
             "--model tiny --steps 3 --seq 16 --data synthetic "
             "--set zero_optimization.offload_optimizer.device=nvme "
             "--set tierzero.nvme_path=%s --set tierzero.nvme_buffered=true "
             "--set tierzero.faults=%s",
             dir, specs[i]);
    int rc = tz_train(args);
    const char *out = output();
    if (rc != 1 || !strstr(out, says[i]) || !strstr(out, "block '"))
      print_error("%s: exit %d\n%s", specs[i], rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, says[i]));
    assert_non_null(strstr(out, "block '"));
  }
}

/* The step objects of a metrics file (the summary left out), into objs; returns how many. */
static int read_metrics(const char *name, json_t **objs, int max, json_t **summary) {
  char path[1100];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[8192];
  int n = 0;
  *summary = NULL;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    assert_non_null(o);
    if (json_is_true(json_object_get(o, "summary"))) {
      *summary = o;
      continue;
    }
    if (json_object_get(o, "config")) { /* a run's header */
      json_decref(o);
      continue;
    }
    assert_true(n < max);
    objs[n++] = o;
  }
  fclose(f);
  return n;
}

/* --eval-every 2 over 5 steps: eval_loss after steps 2, 4 and the last, in the file and on the
 * step lines; the same validation batch each time, scored with the parameters of the moment. */
static void test_eval(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 5 --seq 16 --data synthetic --eval-every 2 --metrics %s/ev.jsonl "
           "--set optimizer.params.lr=0.01",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 2/5 | loss "));
  assert_non_null(strstr(output(), "| eval loss "));
  json_t *o[8], *sum;
  assert_int_equal(read_metrics("ev.jsonl", o, 8, &sum), 5);
  double first = 0, last = 0;
  for (int i = 0; i < 5; i++) {
    json_t *e = json_object_get(o[i], "eval_loss");
    int want = i == 1 || i == 3 || i == 4;
    assert_int_equal(e != NULL, want);
    if (e) {
      assert_true(json_is_number(e));
      if (i == 1)
        first = json_number_value(e);
      last = json_number_value(e);
    }
    json_decref(o[i]);
  }
  assert_true(first > 0 && last > 0 && last != first); /* the same batch, trained parameters */
  assert_non_null(sum);
  assert_true(json_number_value(json_object_get(sum, "eval_loss")) == last);
  json_decref(sum);
  /* The built-in corpus with a held-out share. */
  rc = tz_train("--model tiny --steps 1 --seq 32 --eval-every 1 --val-fraction 0.1");
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "val"));
  assert_non_null(strstr(output(), "| eval loss "));
}

static long file_bytes(const char *path, unsigned char **data) {
  FILE *f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc((size_t)n);
  assert_non_null(*data);
  assert_int_equal(fread(*data, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  return n;
}

/* Export after 3 steps, import into a fresh run and export again without training: the two
 * safetensors files are the same bytes, and the imported model's eval loss is the exporting
 * run's to the printed digit. An imported run then trains on. */
static void test_export_import(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 3 --seq 16 --data synthetic --eval-every 3 "
           "--metrics %s/ex.jsonl --export-safetensors %s/exported --export-dtype f32",
           dir, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "written to"));
  json_t *o[4], *sum;
  assert_int_equal(read_metrics("ex.jsonl", o, 4, &sum), 3);
  double eval = json_number_value(json_object_get(o[2], "eval_loss"));
  for (int i = 0; i < 3; i++)
    json_decref(o[i]);
  json_decref(sum);
  snprintf(args, sizeof args,
           "--steps 0 --seq 16 --data synthetic --eval-every 1 --import-safetensors %s/exported "
           "--export-safetensors %s/again --export-dtype f32",
           dir, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  char want[128];
  snprintf(want, sizeof want, "eval loss %.6f", eval);
  if (!strstr(output(), want))
    print_error("expected '%s' in\n%s", want, output());
  assert_non_null(strstr(output(), want));
  char pa[1100], pb[1100];
  snprintf(pa, sizeof pa, "%s/exported/model.safetensors", dir);
  snprintf(pb, sizeof pb, "%s/again/model.safetensors", dir);
  unsigned char *a, *b;
  long na = file_bytes(pa, &a), nb = file_bytes(pb, &b);
  assert_int_equal(na, nb);
  assert_true(na > 1000000); /* the tiny model in fp32 */
  assert_memory_equal(a, b, (size_t)na);
  free(a);
  free(b);
  snprintf(pa, sizeof pa, "%s/exported/config.json", dir);
  json_error_t err;
  json_t *cfg = json_load_file(pa, 0, &err);
  assert_non_null(cfg);
  assert_string_equal(json_string_value(json_object_get(cfg, "model_type")), "llama");
  json_decref(cfg);
  /* The imported model named explicitly, and trained further. */
  snprintf(args, sizeof args,
           "--model tiny --steps 2 --seq 16 --data synthetic --import-safetensors %s/exported",
           dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "step 2/2"));
}

/* The tensor `name` of a safetensors file's bytes: its dtype string and its data. */
static const unsigned char *st_tensor(const unsigned char *file, long size, const char *name,
                                      const char **dtype, uint64_t *bytes, json_t **header) {
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--)
    hl = hl << 8 | file[i];
  assert_true(8 + hl <= (uint64_t)size);
  json_error_t err;
  *header = json_loadb((const char *)file + 8, (size_t)hl, 0, &err);
  assert_non_null(*header);
  json_t *t = json_object_get(*header, name);
  assert_non_null(t);
  *dtype = json_string_value(json_object_get(t, "dtype"));
  json_t *off = json_object_get(t, "data_offsets");
  uint64_t a = (uint64_t)json_integer_value(json_array_get(off, 0));
  uint64_t e = (uint64_t)json_integer_value(json_array_get(off, 1));
  assert_true(a <= e && 8 + hl + e <= (uint64_t)size);
  *bytes = e - a;
  return file + 8 + hl + a;
}

/* A checkpoint exports what the run that saved it would have: `--resume DIR --steps 0
 * --export-safetensors` gives the bytes of the straight run's export at the same step, and
 * the default export dtype, bf16, gives every f32 value rounded to nearest even. */
static void test_export_from_checkpoint(void **state) {
  (void)state;
  char args[2048];
  const char *common = "--model tiny --seed 5 --seq 16 --data synthetic";
  snprintf(args, sizeof args, "%s --steps 2 --export-safetensors %s/straight2 --export-dtype f32",
           common, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  snprintf(args, sizeof args, "%s --steps 4 --save-every 2 --ckpt-dir %s/ck", common, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  snprintf(args, sizeof args,
           "--resume %s/ck/step-00000002 --steps 0 --export-safetensors %s/fromck "
           "--export-dtype f32",
           dir, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "parameters after 2 steps written to"));
  char pa[1100], pb[1100];
  snprintf(pa, sizeof pa, "%s/straight2/model.safetensors", dir);
  snprintf(pb, sizeof pb, "%s/fromck/model.safetensors", dir);
  unsigned char *a, *b;
  long na = file_bytes(pa, &a), nb = file_bytes(pb, &b);
  assert_int_equal(na, nb);
  assert_true(na > 1000000);
  assert_memory_equal(a, b, (size_t)na);
  free(b);
  /* The latest checkpoint (step 4) is not step 2's export; bf16 is the default dtype. */
  snprintf(args, sizeof args, "--resume %s/ck --steps 0 --export-safetensors %s/latest", dir, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "parameters after 4 steps written to"));
  snprintf(args, sizeof args,
           "--resume %s/ck --steps 0 --export-safetensors %s/latest32 --export-dtype f32", dir,
           dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  snprintf(pb, sizeof pb, "%s/latest32/model.safetensors", dir);
  nb = file_bytes(pb, &b);
  assert_int_equal(na, nb);
  assert_true(memcmp(a, b, (size_t)na) != 0);
  free(a);
  snprintf(pa, sizeof pa, "%s/latest/model.safetensors", dir);
  na = file_bytes(pa, &a);
  const char *names[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.1.mlp.down_proj.weight", "model.norm.weight"};
  for (int k = 0; k < 4; k++) {
    json_t *ha, *hb;
    const char *da, *db;
    uint64_t la, lb;
    const unsigned char *ta = st_tensor(a, na, names[k], &da, &la, &ha);
    const unsigned char *tb = st_tensor(b, nb, names[k], &db, &lb, &hb);
    assert_string_equal(da, "BF16");
    assert_string_equal(db, "F32");
    assert_int_equal(la * 2, lb);
    assert_true(la > 0);
    for (uint64_t i = 0; i < la / 2; i++) {
      float f;
      uint16_t h;
      memcpy(&f, tb + 4 * i, 4);
      memcpy(&h, ta + 2 * i, 2);
      if (h != tz_f32_to_bf16(f))
        print_error("%s[%llu]: bf16 0x%04x, f32 %.9g rounds to 0x%04x\n", names[k],
                    (unsigned long long)i, h, (double)f, tz_f32_to_bf16(f));
      assert_int_equal(h, tz_f32_to_bf16(f));
    }
    json_decref(ha);
    json_decref(hb);
  }
  free(a);
  free(b);
  /* fp16 as asked, and a dtype that is none of the three refused by the flag's name. */
  snprintf(args, sizeof args,
           "--resume %s/ck --steps 0 --export-dtype fp16 --export-safetensors %s/half", dir, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  snprintf(pa, sizeof pa, "%s/half/model.safetensors", dir);
  na = file_bytes(pa, &a);
  json_t *h;
  const char *dt;
  uint64_t len;
  st_tensor(a, na, names[0], &dt, &len, &h);
  assert_string_equal(dt, "F16");
  json_decref(h);
  free(a);
  snprintf(args, sizeof args, "--steps 0 --export-dtype f64 --export-safetensors %s/x", dir);
  assert_int_equal(tz_train(args), 2);
  assert_non_null(strstr(output(), "--export-dtype: expected f32, bf16 or fp16, got 'f64'"));
}

/* --trace-step 1 --trace FILE: the file is written and is a Chrome trace of that step (parameters
 * offloaded, so that transfer lanes and the home lane show); tools/trace_summary.py reads it
 * (where python3 is). */
static void test_trace(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 3 --seq 16 --data synthetic --trace-step 1 --trace %s/t.json "
           "--set zero_optimization.offload_param.device=cpu",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  /* the home lane's time a step in the summary (the cpu backend's plan costs it on the compute
   * lane, so no plan figure beside it) */
  assert_non_null(strstr(output(), "tz-train: the CPU's Adam at the homes: "));
  assert_non_null(strstr(output(), " ms a step in "));
  char path[1100];
  snprintf(path, sizeof path, "%s/t.json", dir);
  json_error_t err;
  json_t *t = json_load_file(path, 0, &err);
  if (!t)
    print_error("%s: %s at line %d\n", path, err.text, err.line);
  assert_non_null(t);
  json_t *ev = json_object_get(t, "traceEvents");
  assert_true(json_is_array(ev));
  assert_true(json_array_size(ev) > 10);
  assert_int_equal(json_integer_value(json_object_get(json_object_get(t, "otherData"), "step")), 1);
  int compute = 0;
  for (size_t i = 0; i < json_array_size(ev); i++) {
    const char *name = json_string_value(json_object_get(json_array_get(ev, i), "name"));
    compute += name && strncmp(name, "fwd", 3) == 0;
  }
  assert_true(compute > 0);
  json_decref(t);
  if (system("python3 -c '' >/dev/null 2>&1") != 0) {
    print_message("no python3: tools/trace_summary.py not checked\n");
    return;
  }
  const char *data = getenv("TZ_TEST_DATA");
  char cmd[4096];
  snprintf(cmd, sizeof cmd, "python3 %s/../../tools/trace_summary.py %s > %s/out 2>&1",
           data ? data : "tests/data", path, dir);
  int st = system(cmd);
  char *out = output();
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    print_error("%s", out);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_non_null(strstr(out, "step 1:"));
  assert_non_null(strstr(out, "compute "));
  assert_non_null(strstr(out, "\n    fwd ")); /* compute time by kind of phase */
  assert_non_null(strstr(out, "host->compute"));
  assert_non_null(strstr(out, "stalls:"));
  assert_non_null(strstr(out, "compute idle, no stall named: "));
  assert_non_null(strstr(out, "host link:"));
  /* The opt phases of the host-homed blocks run at their homes on the cpu backend: the home
   * lane apart from the compute lane, and the link's rates beside it and without it. */
  assert_non_null(strstr(out, "\n  home "));
  assert_non_null(strstr(out, " phases, "));
  assert_non_null(strstr(out, "GB/s beside it"));
}

/* fp16 from the command line: an initial scale of 2^90 overflows; the skipped steps are in the
 * file with the scale after each, following DeepSpeed's rule, and counted in the summary. */
static void test_fp16(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 36 --seq 16 --data synthetic --metrics %s/fp16.jsonl "
           "--set fp16.enabled=true --set fp16.initial_scale_power=90 --set fp16.hysteresis=2 "
           "--set fp16.loss_scale_window=4",
           dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "skipped: fp16 overflow (loss scale now"));
  json_t *o[40], *sum;
  assert_int_equal(read_metrics("fp16.jsonl", o, 40, &sum), 36);
  double scale = ldexp(1, 90);
  int left = 2, skipped = 0, good = 0;
  long last_overflow = -1;
  for (int i = 0; i < 36; i++) {
    int sk = json_is_true(json_object_get(o[i], "skipped"));
    if (sk) {
      if (left == 1)
        scale /= 2;
      else
        left--;
      last_overflow = i;
      skipped++;
    } else {
      if ((i - last_overflow) % 4 == 0) {
        left = 2;
        scale *= 2;
      }
      good++;
    }
    double got = json_number_value(json_object_get(o[i], "loss_scale"));
    /* The file keeps 10 significant digits. */
    if (fabs(got - scale) > 1e-9 * scale)
      print_error("step %d: loss_scale %.17g, expected %.17g\n", i + 1, got, scale);
    assert_true(fabs(got - scale) <= 1e-9 * scale);
    json_decref(o[i]);
  }
  assert_true(skipped >= 20 && good >= 4);
  assert_non_null(sum);
  assert_int_equal(json_integer_value(json_object_get(sum, "skipped")), skipped);
  json_decref(sum);
}

/* fp16 with overflows, stopped and resumed: the scaler's state (scale, hysteresis left, steps
 * since the last overflow, skipped count) is in the checkpoint, so runs resumed after step 8 (a
 * doubling pending) and after step 10 (an overflow just used up one unit of hysteresis) give the
 * straight run's losses, scales and skips, every value as printed (10 significant digits). */
static void test_fp16_resume(void **state) {
  (void)state;
  const char *common = "--model tiny --steps 14 --seq 16 --data synthetic --set fp16.enabled=true "
                       "--set fp16.initial_scale_power=66 --set fp16.hysteresis=2 "
                       "--set fp16.loss_scale_window=3";
  char args[2048];
  snprintf(args, sizeof args, "%s --metrics %s/f16s.jsonl --save-every 2 --ckpt-dir %s/f16ck",
           common, dir, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  json_t *s[16], *r[16], *sum;
  assert_int_equal(read_metrics("f16s.jsonl", s, 16, &sum), 14);
  json_decref(sum);
  int skipped = 0;
  for (int i = 0; i < 14; i++)
    skipped += json_is_true(json_object_get(s[i], "skipped"));
  assert_true(skipped >= 3 && skipped <= 11); /* overflows and good steps both */
  const int from[] = {8, 10};
  for (int k = 0; k < 2; k++) {
    /* A file of its own per resume: a resumed run appends to its metrics file. */
    snprintf(args, sizeof args, "%s --metrics %s/f16r%d.jsonl --resume %s/f16ck/step-%08d", common,
             dir, k, dir, from[k]);
    rc = tz_train(args);
    if (rc != 0)
      print_error("%s", output());
    assert_int_equal(rc, 0);
    char name[32];
    snprintf(name, sizeof name, "f16r%d.jsonl", k);
    assert_int_equal(read_metrics(name, r, 16, &sum), 14 - from[k]);
    int rskipped = 0;
    for (int i = 0; i < 14 - from[k]; i++) {
      json_t *a = s[from[k] + i], *b = r[i];
      rskipped += json_is_true(json_object_get(b, "skipped"));
      assert_int_equal(json_integer_value(json_object_get(b, "step")), from[k] + i + 1);
      const char *keys[] = {"loss", "loss_scale", "lr"};
      for (int q = 0; q < 3; q++) {
        double x = json_number_value(json_object_get(a, keys[q]));
        double y = json_number_value(json_object_get(b, keys[q]));
        if (x != y)
          print_error("resumed after step %d: step %d: %s %.17g, straight %.17g\n", from[k],
                      from[k] + i + 1, keys[q], y, x);
        assert_true(x == y);
      }
      assert_int_equal(json_is_true(json_object_get(a, "skipped")),
                       json_is_true(json_object_get(b, "skipped")));
      json_decref(b);
    }
    assert_non_null(sum);
    assert_int_equal(json_integer_value(json_object_get(sum, "skipped")), rskipped);
    json_decref(sum);
  }
  /* The last checkpoint's state: the run's whole skipped count and its last scale. */
  char path[1100];
  snprintf(path, sizeof path, "%s/f16ck", dir);
  tz_ckpt_reader *ck = NULL;
  TZ_ASSERT_OK(tz_ckpt_open(path, 0, &ck));
  assert_int_equal(tz_ckpt_step(ck), 14);
  char *js = NULL;
  TZ_ASSERT_OK(tz_ckpt_get_json(ck, "state", &js));
  tz_ckpt_close(ck);
  json_error_t err;
  json_t *st = json_loads(js, 0, &err);
  free(js);
  assert_non_null(st);
  json_t *ls = json_object_get(st, "loss_scale");
  assert_non_null(ls);
  assert_int_equal(json_integer_value(json_object_get(ls, "skipped")), skipped);
  double last = json_number_value(json_object_get(s[13], "loss_scale"));
  double saved = json_number_value(json_object_get(ls, "scale"));
  assert_true(fabs(saved - last) <= 1e-9 * last);
  json_decref(st);
  for (int i = 0; i < 14; i++)
    json_decref(s[i]);
}

/* lr 1e30: the gradient norm goes non-finite at step 2; tz-train stops there with a non-zero
 * exit, names the step and the last checkpoint, and saves neither that step nor an export. */
static void test_nonfinite_stops(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 6 --seq 16 --set optimizer.params.lr=1e30 --ckpt-dir %s/nan-ck "
           "--save-every 1 --export-safetensors %s/nan-export",
           dir, dir);
  int rc = tz_train(args);
  const char *out = output();
  if (rc == 0)
    print_error("%s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "step 2: gradient norm is nan"));
  assert_non_null(strstr(out, "stopping"));
  assert_non_null(strstr(out, "nan-ck/step-00000001 is the last finite state"));
  assert_null(strstr(out, "step 3/6"));
  assert_null(strstr(out, "parameters after"));
  char path[1100];
  snprintf(path, sizeof path, "%s/nan-ck/step-00000002", dir);
  assert_int_not_equal(access(path, F_OK), 0);
  snprintf(path, sizeof path, "%s/nan-export", dir);
  assert_int_not_equal(access(path, F_OK), 0);
}

/* A SIGTERM after the last step (tz-train's test hook raises one as tz_run returns: the
 * checkpoint and export written, the world still open) ends nothing: the completed run exits 0,
 * says the signal came late, and its export is there (before, the handlers were already gone and
 * the signal ended it with 143). */
static void test_sigterm_after_last_step(void **state) {
  (void)state;
  char args[2048];
  snprintf(args, sizeof args,
           "--model tiny --steps 2 --seq 16 --ckpt-dir %s/late-ck --export-safetensors "
           "%s/late-export",
           dir, dir);
  setenv("TZ_TEST_SIGTERM_AFTER_RUN", "1", 1);
  int rc = tz_train(args);
  unsetenv("TZ_TEST_SIGTERM_AFTER_RUN");
  const char *out = output();
  if (rc != 0)
    print_error("%s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "arrived after the last step; the run had completed (exit 0)"));
  char path[1100];
  snprintf(path, sizeof path, "%s/late-export/model.safetensors", dir);
  assert_int_equal(access(path, F_OK), 0);
}

/* A run that cannot make progress (tz-train's test hook blocks it after step 2, as OpenBLAS's
 * allocation retry under `ulimit -v` did) ends on SIGTERM once its grace (tierzero.stop_grace, 2 s
 * here) has passed, saying why, with status 1; without the watchdog it hung until killed. */
static void test_stuck_run_ends_on_sigterm(void **state) {
  (void)state;
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "XDG_CACHE_HOME=%s/cache OMP_NUM_THREADS=1 TZ_TEST_HANG_AFTER_STEP=2 exec %s --backend "
           "cpu --model tiny --steps 5 --seq 16 --set tierzero.stop_grace=2 > %s/out 2>&1",
           dir, bin, dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  /* step 2 printed: the run is in its hook */
  int seen = 0;
  for (int i = 0; i < 600 && !seen; i++) {
    seen = strstr(output(), "step 2/5") != NULL;
    if (!seen)
      usleep(100000);
  }
  assert_true(seen);
  kill(pid, SIGTERM);
  int st = 0, done = 0;
  for (int i = 0; i < 600 && !done; i++) { /* up to 60 s: the grace is 2 */
    done = waitpid(pid, &st, WNOHANG) == pid;
    if (!done)
      usleep(100000);
  }
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  const char *out = output();
  if (!done || !WIFEXITED(st) || WEXITSTATUS(st) != 1)
    print_error("%s", out);
  assert_true(done);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
  assert_non_null(strstr(out, "the run cannot make progress"));
}

/* The steps of a metrics file's step objects, in file order; returns their number. */
static int metric_steps(const char *name, int64_t *steps, int max) {
  json_t *o[32], *sum;
  int n = read_metrics(name, o, max < 32 ? max : 32, &sum);
  for (int i = 0; i < n; i++) {
    steps[i] = json_integer_value(json_object_get(o[i], "step"));
    json_decref(o[i]);
  }
  json_decref(sum);
  return n;
}

/* A resumed run appends to its --metrics file; the lines of steps after the checkpoint it resumes
 * from (a run that went on past its last checkpoint before it stopped) are dropped, so that the
 * file has steps 1..N once each, in order. A run without --resume starts the file anew. */
static void test_resumed_metrics_keep_every_step_once(void **state) {
  (void)state;
  const char *common = "--model tiny --seq 16 --data synthetic";
  char args[2048];
  snprintf(args, sizeof args, "%s --steps 6 --save-every 2 --ckpt-dir %s/mck --metrics %s/rm.jsonl",
           common, dir, dir);
  int rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  /* From step 4: steps 5 and 6 of the file are past the checkpoint. */
  snprintf(args, sizeof args, "%s --steps 8 --resume %s/mck/step-00000004 --metrics %s/rm.jsonl",
           common, dir, dir);
  rc = tz_train(args);
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  int64_t steps[32];
  int n = metric_steps("rm.jsonl", steps, 32);
  for (int i = 0; i < n; i++)
    if (steps[i] != i + 1)
      print_error("line %d of the step objects has step %lld\n", i + 1, (long long)steps[i]);
  assert_int_equal(n, 8);
  for (int i = 0; i < n; i++)
    assert_int_equal(steps[i], i + 1);
  /* A fresh run's file holds that run only. */
  snprintf(args, sizeof args, "%s --steps 2 --metrics %s/rm.jsonl", common, dir);
  assert_int_equal(tz_train(args), 0);
  assert_int_equal(metric_steps("rm.jsonl", steps, 32), 2);
}

/* --progress plain writes lines without a control character (what `mpirun ... > log` should
 * hold); --progress bar redraws its line even into a file; an unknown mode is refused by name. */
static void test_progress_plain_has_no_control_characters(void **state) {
  (void)state;
  int rc = tz_train("--model tiny --steps 3 --seq 16 --data synthetic --progress plain");
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  const char *out = output();
  assert_non_null(strstr(out, "step 3/3"));
  for (const char *c = out; *c; c++)
    if ((unsigned char)*c < 0x20 && *c != '\n') {
      print_error("control character 0x%02x at offset %td\n", *c, c - out);
      fail();
    }
  assert_int_equal(tz_train("--model tiny --steps 2 --seq 16 --data synthetic --progress bar"), 0);
  assert_non_null(strchr(output(), '\r'));
  assert_int_equal(tz_train("--model tiny --steps 1 --progress sparkle"), 2);
  assert_non_null(strstr(output(), "--progress"));
  assert_non_null(strstr(output(), "sparkle"));
}

/* bench/rates-h200.json, the GPU machine's rates the docs plan from offline (--plan --rates),
 * is of the cache's current version: a version change that leaves it behind turns every offline
 * plan in docs/ into "holds no rates". */
static void test_committed_gpu_rates_plan(void **state) {
  (void)state;
  const char *data = getenv("TZ_TEST_DATA");
  char args[4096];
  snprintf(args, sizeof args,
           "--backend cuda --plan --gpu-memory 140GiB --layer-rate 530 --model llama-1b --seq 2048 "
           "--set train_micro_batch_size_per_gpu=4 --rates %s/../../bench/rates-h200.json",
           data ? data : "tests/data");
  int rc = tz_train(args);
  if (rc != 0 && strstr(output(), "has no CUDA")) {
    print_message("this build has no CUDA: planning for a GPU not checked\n");
    return;
  }
  if (rc != 0)
    print_error("%s", output());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(output(), "530 TFLOP/s"));
  assert_non_null(strstr(output(), "bound "));
}

/* Every program answers --version with one line: its name, the project's version, the commit it
 * was built from, and which of CUDA, NCCL and MPI it was built with; exit status 0. */
static void test_version_of_every_program(void **state) {
  (void)state;
  const char *progs[] = {"tz-train", "tz-bench", "tz-topo", "tz-model-check"};
  for (int i = 0; i < 4; i++) {
    char cmd[4096], pattern[256];
    snprintf(cmd, sizeof cmd, "%s/%s --version > %s/out 2>&1", getenv("TZ_BIN"), progs[i], dir);
    int st = system(cmd);
    const char *out = output();
    snprintf(pattern, sizeof pattern,
             "^%s [0-9]+\\.[0-9]+(\\.[0-9]+)* \\(commit [^ ;]+; CUDA (yes|no), NCCL (yes|no), MPI "
             "(yes|no)\\)\n$",
             progs[i]);
    regex_t re;
    assert_int_equal(regcomp(&re, pattern, REG_EXTENDED | REG_NOSUB), 0);
    int match = regexec(&re, out, 0, NULL, 0);
    regfree(&re);
    if (match != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      print_error("%s --version: status %d, output: %s\n", progs[i], st, out);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(match, 0);
  }
}

int main(void) {
  const char *b = getenv("TZ_BIN");
  if (!b)
    tz_test_skip("TZ_BIN is not set (run through ctest)");
  snprintf(bin, sizeof bin, "%s/tz-train", b);
  dir = tz_test_mkdtemp("train-cli");
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_run),
      cmocka_unit_test(test_layer_rate_cached),
      cmocka_unit_test(test_corpus),
      cmocka_unit_test(test_plan),
      cmocka_unit_test(test_inputs_on_host),
      cmocka_unit_test(test_fit_config_json),
      cmocka_unit_test(test_plan_for_gpu),
      cmocka_unit_test(test_faults),
      cmocka_unit_test(test_eval),
      cmocka_unit_test(test_export_import),
      cmocka_unit_test(test_export_from_checkpoint),
      cmocka_unit_test(test_trace),
      cmocka_unit_test(test_fp16),
      cmocka_unit_test(test_fp16_resume),
      cmocka_unit_test(test_nonfinite_stops),
      cmocka_unit_test(test_sigterm_after_last_step),
      cmocka_unit_test(test_stuck_run_ends_on_sigterm),
      cmocka_unit_test(test_resumed_metrics_keep_every_step_once),
      cmocka_unit_test(test_progress_plain_has_no_control_characters),
      cmocka_unit_test(test_committed_gpu_rates_plan),
      cmocka_unit_test(test_version_of_every_program),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  tz_test_rmdir(dir);
  return rc;
}
