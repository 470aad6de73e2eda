/* A run's options from text, their consistency, and the configuration they make
 * (trainer/run/run.h). */
#include "trainer/run/run.h"

#include "core/error.h"
#include "core/log.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/run/monitor.h"
#include "trainer/checkpoint/resume.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* How an option's text is read: a string, a switch, an integer (NUM with its limits), a count, a
 * rate; the others have a case of their own in tz_run_option_set, named by a letter. */
enum { STR = 256, SWITCH, COUNT, RATE, NUM = 512, POS = 1, MAX32 = 2, INT = 4 };

struct option_kind {
  const char *name;
  int kind;
  size_t off;       /* where the value goes in struct tz_run_options */
  const char *unit; /* RATE: the unit of the text, and its value in the option's */
  double scale;
};

#define AT(field) offsetof(struct tz_run_options, field)
static const struct option_kind options[] = {
    {"model", STR, AT(model), 0, 0},
    {"steps", NUM, AT(steps), 0, 0},
    {"epochs", 'e', 0, 0, 0},
    {"seed", NUM, AT(seed), 0, 0},
    {"seq", NUM | POS | MAX32 | INT, AT(seq), 0, 0},
    {"metrics", STR, AT(metrics), 0, 0},
    {"plan", SWITCH, AT(plan_only), 0, 0},
    {"gpu-memory", 'G', 0, 0, 0},
    {"layer-rate", RATE, AT(layer_rate), "TFLOP/s", 1e12},
    {"world", 'N', 0, 0, 0},
    {"collective-rate", RATE, AT(coll_rate), "GB/s", 1e9},
    {"backend", 'B', 0, 0, 0},
    {"auto-placement", SWITCH, AT(auto_placement), 0, 0},
    {"optimizer-step", 'o', 0, 0, 0},
    {"rates", STR, AT(rates), 0, 0},
    {"remeasure", SWITCH, AT(remeasure), 0, 0},
    {"data", STR, AT(data), 0, 0},
    {"ckpt-dir", STR, AT(ckpt_dir), 0, 0},
    {"save-every", COUNT, AT(save_every), 0, 0},
    {"keep", COUNT, AT(keep), 0, 0},
    {"resume", STR, AT(resume), 0, 0},
    {"reseed", SWITCH, AT(reseed), 0, 0},
    {"eval-every", NUM | POS | MAX32, AT(eval_every), 0, 0},
    {"val-fraction", 'v', 0, 0, 0},
    {"val-data", STR, AT(val_data), 0, 0},
    {"tokenizer", STR, AT(tokenizer), 0, 0},
    {"import-safetensors", STR, AT(import_dir), 0, 0},
    {"export-safetensors", STR, AT(export_dir), 0, 0},
    {"export-dtype", 'D', 0, 0, 0},
    {"export-shard-size", 'S', 0, 0, 0},
    {"trace-step", NUM | MAX32, AT(trace_step), 0, 0},
    {"trace", STR, AT(trace_path), 0, 0},
};

int tz_run_option_is_switch(const char *name) {
  for (size_t i = 0; i < sizeof options / sizeof *options; i++)
    if (strcmp(options[i].name, name) == 0)
      return options[i].kind == SWITCH;
  return -1;
}

/* v as the integer of a NUM option into *(int64_t or int *)p. */
static int set_num(const struct option_kind *k, const char *v, void *p) {
  char *end;
  errno = 0;
  long long n = strtoll(v, &end, 10);
  if (end == v || *end || errno || n < 0 || ((k->kind & POS) && n < 1) ||
      ((k->kind & MAX32) && n > INT32_MAX))
    return tz_err_set(TZ_EINVAL, "--%s: expected a %s integer, got '%s'", k->name,
                      k->kind & POS ? "positive" : "non-negative", v);
  if (k->kind & INT)
    *(int *)p = (int)n;
  else
    *(int64_t *)p = n;
  return 0;
}

/* "5GB", "500MB", "2GiB", "1000000" (bytes) into *out: KB, MB, GB, TB are powers of 1000 as in
 * Hugging Face's max_shard_size, KiB ... TiB powers of 1024. */
static int parse_shard_size(const char *v, uint64_t *out) {
  static const struct {
    const char *unit;
    double scale;
  } units[] = {{"", 1},
               {"B", 1},
               {"KB", 1e3},
               {"MB", 1e6},
               {"GB", 1e9},
               {"TB", 1e12},
               {"KiB", 1024.0},
               {"MiB", 1048576.0},
               {"GiB", 1073741824.0},
               {"TiB", 1099511627776.0}};
  char *end;
  errno = 0;
  double n = strtod(v, &end);
  if (end == v || errno || !(n > 0))
    return -1;
  while (*end == ' ')
    end++;
  for (size_t i = 0; i < sizeof units / sizeof *units; i++)
    if (strcasecmp(end, units[i].unit) == 0 && n * units[i].scale >= 1 &&
        n * units[i].scale < 1.8e19) {
      *out = (uint64_t)(n * units[i].scale);
      return 0;
    }
  return -1;
}

/* The options with a rule of their own. */
static int set_special(struct tz_run_options *o, const struct option_kind *k, const char *v) {
  char *end;
  switch (k->kind) {
  case 'B':
    if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "auto"))
      return tz_err_set(TZ_EINVAL, "--backend: expected cpu, cuda or auto, got '%s'", v);
    o->backend = v;
    return 0;
  case 'G':
    if (tz_config_parse_size(v, &o->gpu_memory) < 0 || !o->gpu_memory)
      return tz_err_set(TZ_EINVAL, "--gpu-memory: expected a size (e.g. 139GiB), got '%s'", v);
    return 0;
  case 'N':
    o->plan_world = (int)strtol(v, &end, 10);
    if (end == v || *end || o->plan_world < 1 || o->plan_world > 4096)
      return tz_err_set(TZ_EINVAL, "--world: expected a rank count from 1 to 4096, got '%s'", v);
    return 0;
  case 'D':
    if (strcmp(v, "f32") == 0)
      o->export_dtype = TZ_F32;
    else if (strcmp(v, "bf16") == 0)
      o->export_dtype = TZ_BF16;
    else if (strcmp(v, "fp16") == 0 || strcmp(v, "f16") == 0)
      o->export_dtype = TZ_F16;
    else
      return tz_err_set(TZ_EINVAL, "--export-dtype: expected f32, bf16 or fp16, got '%s'", v);
    return 0;
  case 'S':
    /* Decimal units as save_pretrained's max_shard_size ("5GB" is 5e9 bytes), binary ones too. */
    if (parse_shard_size(v, &o->export_shard_bytes) < 0)
      return tz_err_set(TZ_EINVAL,
                        "--export-shard-size: expected a size above 0 (e.g. 5GB, 500MB, 2GiB), "
                        "got '%s'",
                        v);
    return 0;
  case 'e': {
    double f = strtod(v, &end);
    if (end == v || *end || !(f > 0 && f <= 1e6))
      return tz_err_set(TZ_EINVAL,
                        "--epochs: expected a number of passes over the data above 0, "
                        "got '%s'",
                        v);
    o->epochs = f;
    return 0;
  }
  case 'v': {
    double f = strtod(v, &end);
    if (end == v || *end || !(f > 0 && f < 1))
      return tz_err_set(TZ_EINVAL, "--val-fraction: expected a number in (0, 1), got '%s'", v);
    o->val_fraction = f;
    return 0;
  }
  case 'o':
    if (tz_opt_mode_parse(v, &o->mode) < 0) {
      char why[256];
      snprintf(why, sizeof why, "%s", tz_err_msg());
      return tz_err_set(TZ_EINVAL, "--%s", why);
    }
    return 0;
  }
  return tz_err_set(TZ_EINVAL, "--%s: no rule for this option", k->name);
}

int tz_run_option_set(struct tz_run_options *o, const char *name, const char *value) {
  const struct option_kind *k = NULL;
  for (size_t i = 0; i < sizeof options / sizeof *options && !k; i++)
    if (strcmp(options[i].name, name) == 0)
      k = &options[i];
  if (!k)
    return tz_err_set(TZ_EINVAL, "--%s: not an option of a run", name);
  if (k->kind != SWITCH && !value)
    return tz_err_set(TZ_EINVAL, "--%s: needs a value", name);
  void *p = (char *)o + k->off;
  char *end;
  if (k->kind & NUM) {
    o->steps_set |= p == (void *)&o->steps;
    return set_num(k, value, p);
  }
  switch (k->kind) {
  case STR: *(const char **)p = value; return 0;
  case SWITCH: *(int *)p = 1; return 0;
  case COUNT: {
    long long n = strtoll(value, &end, 10);
    if (*end || !*value || n < 0)
      return tz_err_set(TZ_EINVAL, "--%s: expected a non-negative integer, got '%s'", name, value);
    *(int64_t *)p = n;
    return 0;
  }
  case RATE: {
    double r = strtod(value, &end);
    if (end == value || *end || !(r > 0))
      return tz_err_set(TZ_EINVAL, "--%s: expected %s above 0, got '%s'", name, k->unit, value);
    *(double *)p = r * k->scale;
    return 0;
  }
  }
  return set_special(o, k, value);
}

int tz_run_options_check(struct tz_run_options *o, int launch_ranks) {
  /* --resume auto: the checkpoints of --ckpt-dir when it holds one, else a start from nothing (a
   * job that a scheduler such as Slurm requeues runs the same command each time) */
  if (o->resume && strcmp(o->resume, "auto") == 0) {
    if (!o->ckpt_dir)
      return tz_err_set(TZ_EINVAL, "--resume auto needs --ckpt-dir: the directory whose "
                                   "checkpoints it continues from, when it holds one");
    int n = tz_ckpt_list(o->ckpt_dir, NULL, 0);
    if (n < 0)
      return n;
    o->resume = n > 0 ? o->ckpt_dir : NULL;
    tz_log(TZ_LOG_INFO, "--resume auto: %s",
           n > 0 ? "continuing from --ckpt-dir's checkpoints"
                 : "no checkpoint in --ckpt-dir: a new start");
  }
  if (o->resume && !*o->resume && !(o->resume = o->ckpt_dir))
    return tz_err_set(TZ_EINVAL, "--resume without DIR needs --ckpt-dir");
  if (o->resume && !o->ckpt_dir) { /* a root (not one step directory): saves continue there */
    char manifest[4096];
    snprintf(manifest, sizeof manifest, "%s/manifest", o->resume);
    if (access(manifest, F_OK) != 0)
      o->ckpt_dir = o->resume;
  }
  if ((o->gpu_memory || o->layer_rate) && !o->plan_only)
    return tz_err_set(TZ_EINVAL, "--gpu-memory and --layer-rate are for --plan (planning for "
                                 "another machine's GPU)");
  if ((o->plan_world || o->coll_rate) && !o->plan_only)
    return tz_err_set(TZ_EINVAL, "--world and --collective-rate are for --plan (planning a world "
                                 "of ranks without starting them)");
  if (o->plan_world && launch_ranks > 1)
    return tz_err_set(TZ_EINVAL, "--world plans without starting ranks; --nproc starts them: "
                                 "give one");
  if (o->gpu_memory && (!o->backend || strcmp(o->backend, "cuda") != 0))
    return tz_err_set(TZ_EINVAL, "--gpu-memory plans for a GPU: it needs --backend cuda");
  if ((o->trace_step >= 0) != (o->trace_path != NULL))
    return tz_err_set(TZ_EINVAL, "--trace-step and --trace go together (the step to record and "
                                 "the file to write)");
  if (o->trace_step >= o->steps && o->trace_path)
    return tz_err_set(TZ_EINVAL, "--trace-step %lld: the run has %lld steps, numbered from 0",
                      (long long)o->trace_step, (long long)o->steps);
  struct tz_model_config named;
  struct stat st;
  /* A name that is no preset and is a file or directory is a config.json (tz_run_model). */
  if (o->model && tz_model_preset(o->model, &named) < 0 && stat(o->model, &st) != 0) {
    char why[256];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(TZ_EINVAL,
                      "--model: %s; or a Hugging Face config.json (a file, or a directory "
                      "holding one): no such file %s",
                      why, o->model);
  }
  if (o->val_data && !o->eval_every)
    return tz_err_set(TZ_EINVAL, "--val-data %s is evaluated on with --eval-every N: give it",
                      o->val_data);
  return 0;
}

/* tierzero.warmup_ratio (--warmup-ratio) against what this invocation gave: a warm-up in steps
 * given too is refused (as Hugging Face's warmup_steps would win silently over the ratio), one
 * given alone wins over a ratio a resumed checkpoint carries; a ratio without a schedule, whose
 * warm-up it would set, is refused. */
static int warmup_ratio_check(struct tz_config *cfg) {
  /* "auto" is no value: Hugging Face's Trainer fills it from --warmup_steps or --warmup_ratio */
  int autow = tz_config_is_auto(cfg, "scheduler.params.warmup_num_steps");
  int steps = tz_config_section_given(cfg, "scheduler.params.warmup_num_steps") && !autow;
  int ratio = tz_config_section_given(cfg, "tierzero.warmup_ratio");
  /* (a resumed run's ratio comes from its checkpoint, not given again) */
  if (autow && !(cfg->tierzero.warmup_ratio > 0) && cfg->scheduler.type != TZ_LR_CONSTANT)
    return tz_err_set(TZ_ECONFIG,
                      "scheduler.params.warmup_num_steps is \"auto\": Hugging Face's Trainer "
                      "fills it from --warmup_steps (default 0), which DeepSpeed 0.19 refuses; "
                      "give --warmup-steps N or --warmup-ratio R (a fraction of the run's steps)");
  if (steps && ratio)
    return tz_err_set(TZ_ECONFIG,
                      "tierzero.warmup_ratio %g (--warmup-ratio) and "
                      "scheduler.params.warmup_num_steps %lld (--warmup-steps, or the config) "
                      "are both given: give one",
                      cfg->tierzero.warmup_ratio, (long long)cfg->scheduler.warmup_num_steps);
  if (steps)
    cfg->tierzero.warmup_ratio = 0;
  if (cfg->tierzero.warmup_ratio > 0 && cfg->scheduler.type == TZ_LR_CONSTANT)
    return tz_err_set(TZ_ECONFIG,
                      "tierzero.warmup_ratio %g (--warmup-ratio): the config has no scheduler "
                      "section, and a constant rate has no warm-up; add \"scheduler\": "
                      "{\"type\": \"WarmupDecayLR\"} or WarmupCosineLR (docs/config.md)",
                      cfg->tierzero.warmup_ratio);
  return 0;
}

int tz_run_config(const struct tz_run_options *o, const struct tz_run_sources *src, int world,
                  struct tz_config *cfg) {
  tz_config_defaults(cfg);
  if (src->base_json) {
    TZ_CHECK(tz_config_load_string(cfg, src->base_json, src->base_name));
    if (src->base_nvme_path)
      TZ_CHECK(tz_config_set(cfg, "tierzero.nvme_path", src->base_nvme_path));
  }
  if (o->resume) /* the saved effective config first; files and --set may change it */
    TZ_CHECK(tz_resume_config(o->resume, world, cfg));
  tz_config_given_clear(cfg);
  for (int i = 0; i < src->n_files; i++)
    TZ_CHECK(tz_config_load_file(cfg, src->files[i]));
  /* A ds_config with an optimizer section: DeepSpeed builds that optimizer over the model's
   * parameters in one group, so weight decay applies to every tensor (as it does when Hugging
   * Face's Trainer hands DeepSpeed the model); without one, tierzero excludes biases and norms
   * as the Trainer's own optimizer does (trainer/step/decay.h). */
  int ds_optimizer = tz_config_section_given(cfg, "optimizer");
  TZ_CHECK(tz_config_apply_env(cfg));
  for (int i = 0; i < src->n_sets; i++) {
    char key[256];
    const char *eq = strchr(src->sets[i], '=');
    if (!eq || eq == src->sets[i] || (size_t)(eq - src->sets[i]) >= sizeof key)
      return tz_err_set(TZ_ECONFIG, "--set %s: expected KEY=VALUE", src->sets[i]);
    memcpy(key, src->sets[i], (size_t)(eq - src->sets[i]));
    key[eq - src->sets[i]] = 0;
    TZ_CHECK(tz_config_set(cfg, key, eq + 1));
  }
  char buf[32];
  if (o->seed >= 0) {
    snprintf(buf, sizeof buf, "%lld", (long long)o->seed);
    TZ_CHECK(tz_config_set(cfg, "seed", buf));
  }
  if (o->resume) /* the checkpoint's seed wins over the files' and --seed, unless --reseed */
    TZ_CHECK(tz_resume_seed(o->resume, o->reseed, cfg));
  if (o->trace_step >= 0) {
    snprintf(buf, sizeof buf, "%lld", (long long)o->trace_step);
    TZ_CHECK(tz_config_set(cfg, "tierzero.trace_step", buf));
  }
  /* The data in the config, so that checkpoints record it and a resume without --data trains
   * on what the run it continues trained on (it took the built-in corpus: issue 49 item 6). */
  if (o->data)
    TZ_CHECK(tz_config_set(cfg, "tierzero.data", o->data));
  if (o->epochs > 0) { /* recorded alike: a resume goes on to the same end */
    snprintf(buf, sizeof buf, "%.17g", o->epochs);
    TZ_CHECK(tz_config_set(cfg, "tierzero.epochs", buf));
  }
  /* Real weights trained on the built-in toy corpus (what no data means, for the demo and the
   * presets) would be ruined without a word (issue 49 item 6). */
  if (o->import_dir && !cfg->tierzero.data && o->steps > 0 && !o->plan_only)
    return tz_err_set(TZ_ECONFIG,
                      "--import-safetensors %s: give --data, token shards of your text made with "
                      "tools/tz-data --tokenizer %s (docs/data.md): without it the model would "
                      "train on the built-in toy corpus (--data builtin does that on purpose)",
                      o->import_dir, o->import_dir);
  /* The choice written into the config, so that checkpoints record it and a resume keeps it (a
   * checkpoint from before the rule keeps the exclusion it recorded: not resolved here). */
  if (cfg->tierzero.weight_decay_exclude.n == 0 && !o->resume)
    TZ_CHECK(
        tz_config_set(cfg, "tierzero.weight_decay_exclude", ds_optimizer ? "none" : "bias:norm"));
  TZ_CHECK(warmup_ratio_check(cfg));
  /* The monitors' directories are made when the run starts (trainer/run/run.c); a config that names
   * none is refused here, with the other configuration errors. */
  TZ_CHECK(tz_monitor_check(cfg));
  if (cfg->train_batch_size == 0 && cfg->train_micro_batch_size_per_gpu == 0 &&
      !tz_config_is_auto(cfg, "train_micro_batch_size_per_gpu"))
    TZ_CHECK(tz_config_set(cfg, "train_micro_batch_size_per_gpu", "4"));
  TZ_CHECK(tz_config_resolve_batch(cfg, world));
  tz_log_set_level((enum tz_log_level)cfg->tierzero.log);
  return 0;
}
