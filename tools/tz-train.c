/* tz-train: ZeRO-3 training of a Llama-shaped model on the scheduler (docs/training.md). */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "collectives/launch.h"
#include "core/config.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/log.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "core/sched.h"
#include "kernels/compute.h"
#include "topo/topo.h"
#include "trainer/data.h"
#include "trainer/hf.h"
#include "trainer/metrics.h"
#include "trainer/model.h"
#include "trainer/rates.h"
#include "trainer/resume.h"
#include "trainer/signals.h"
#include "trainer/synthetic.h"
#include "trainer/train.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tz_demo_config.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: tz-train [options]\n"
          "Trains a Llama-shaped model with ZeRO-3 sharding, its state placed across the compute\n"
          "tier, host memory and NVMe.\n\n"
          "  --config FILE        DeepSpeed-style JSON (docs/config.md); may be repeated\n"
          "  --model PRESET       tiny, llama-1b, llama-3b, llama-7b, llama-13b (default: the\n"
          "                       config's tierzero.model, else tiny)\n"
          "  --steps N            optimizer steps (default 10; 0 trains nothing: with the flags\n"
          "                       below, an evaluation or a conversion)\n"
          "  --seed N             initialisation and data seed (default: the config's seed)\n"
          "  --seq N              tokens per sequence (default 64, at most the model's max_seq)\n"
          "  --data SPEC          builtin (the built-in corpus, the default), text:PATH, an llm.c\n"
          "                       shard or a glob of them (docs/data.md), or synthetic\n"
          "  --metrics FILE       one JSON object per step (docs/data.md: step, loss, grad_norm,\n"
          "                       lr, step_s, bound_s, stall_s, coll_s, tokens_per_s, skipped,\n"
          "                       loss_scale, eval_loss, ...), then a summary object\n"
          "  --eval-every N       every N steps and after the last, the loss on the validation\n"
          "                       split (forward only, parameters unchanged)\n"
          "  --val-fraction F     share of the data's windows held out for --eval-every, in\n"
          "                       (0, 1) (default 0.05)\n"
          "  --import-safetensors DIR\n"
          "                       start from a Hugging Face Llama checkpoint (config.json and\n"
          "                       model.safetensors or its shards); the model is its config\n"
          "                       unless --model or tierzero.model names one, which must match\n"
          "  --export-safetensors DIR\n"
          "                       after training, write DIR/config.json and DIR/model.safetensors\n"
          "                       (fp32, Hugging Face names); with --resume and --steps 0,\n"
          "                       the checkpoint's model, at any number of ranks\n"
          "  --export-dtype T     f32 (default) or bf16 (rounded to nearest even) for\n"
          "                       --export-safetensors\n"
          "  --trace-step N       record the lanes of step N (counted from 0, the step printed\n"
          "                       as N+1; sets tierzero.trace_step) ...\n"
          "  --trace FILE         ... and write them to FILE as a Chrome/Perfetto trace (JSON)\n"
          "  --backend B          cpu, cuda, or auto (the default: cuda when this build has it\n"
          "                       and a GPU is visible, unless the ranks run under mpirun)\n"
          "  --plan               print the placement and the predicted bound, and stop\n"
          "  --gpu-memory SIZE    with --plan --backend cuda: plan for a GPU with SIZE free (as\n"
          "                       tz-train measures it there) instead of asking this machine's;\n"
          "                       --rates must hold that machine's rates\n"
          "  --layer-rate TFLOPS  with --plan: a layer's forward and backward rate (tz-train's\n"
          "                       \"a layer's ... run at\" line on that machine) instead of\n"
          "                       timing one\n"
          "  --world N            with --plan: plan one rank of N (its shards, its share of the\n"
          "                       host) without starting them; --rates then holds the rates of\n"
          "                       a rank copying beside the others (tz-train's \"plan's rates\"\n"
          "                       line on that machine)\n"
          "  --collective-rate GBPS  with --plan: the all-gather's bus rate (the same line's\n"
          "                       \"collectives\") instead of timing one\n"
          "  --auto-placement     let the plan choose homes instead of the offload_* devices\n"
          "  --optimizer-step M   auto, folded, overlapped or unfolded (default auto)\n"
          "  --rates FILE         rates cache (default ~/.cache/tierzero/rates-<host>.json)\n"
          "  --remeasure          measure the machine's rates even when cached\n"
          "  --nproc N            start N workers on this machine (needs a GPU per worker);\n"
          "                       on CPUs run N ranks under mpirun instead\n"
          "  --set KEY=VALUE      set one config key (JSON path), after the files\n"
          "  --ckpt-dir DIR       save checkpoints under DIR (every --save-every steps, at the\n"
          "                       end, and on SIGTERM/SIGINT); docs/checkpoints.md\n"
          "  --save-every N       save every N steps (default 0: only at the end and on a signal)\n"
          "  --keep N             keep the newest N checkpoints (default 0: all)\n"
          "  --resume [DIR]       continue from the checkpoint DIR (a --ckpt-dir, whose latest is\n"
          "                       taken, or one step-N directory); DIR defaults to --ckpt-dir,\n"
          "                       and --ckpt-dir to DIR when DIR is not a step directory.\n"
          "                       --steps stays the total: the run ends after step N\n"
          "  -h, --help           this text\n\n"
          "Precedence: built-in defaults, then each --config file in order, then TZ_* environment\n"
          "variables, then --set, then the flags above (--seed, --model, --trace-step).\n"
          "Output: a progress bar on a terminal, otherwise a line per step (\"step N/M | loss\n"
          "...\"), then a summary. Exit status: 0 done, 1 a failure while running, 2 a usage or\n"
          "configuration error.\n"
          "Without arguments tz-train runs the demo (a tiny Llama, optimizer state on NVMe files).\n");
}

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

struct opts {
  const char *configs[8];
  int n_configs;
  const char *sets[32];
  int n_sets;
  const char *model, *metrics, *rates, *data, *backend;
  int device; /* the GPU of this rank: tierzero.device, else the local rank */
  const char *import_dir, *export_dir, *trace_path;
  enum tz_dtype export_dtype;
  int64_t steps, seed, eval_every, trace_step;
  double val_fraction;
  int seq, plan, auto_place, remeasure, nproc;
  uint64_t gpu_memory; /* --gpu-memory: plan for a GPU with this much free; 0: this machine's */
  double layer_rate;   /* --layer-rate, FLOP/s; 0: timed */
  int world;           /* --world: plan one rank of this many; 0: the ranks running */
  double coll_rate;    /* --collective-rate, bytes/s; 0: timed (unknown on one rank) */
  enum tz_opt_mode mode;
  const char *demo_dir; /* no arguments: the demo, with its nvme files in this directory */
  const char *ckpt_dir, *resume; /* resume: "" for --resume without DIR (the ckpt dir) */
  int64_t save_every, keep;
};

/* optarg as a rate above 0 in unit, times scale into *out; -1 with the flag named if not. */
static int parse_rate(const char *flag, const char *unit, double scale, double *out) {
  char *end;
  double v = strtod(optarg, &end);
  if (end == optarg || *end || !(v > 0))
    return fprintf(stderr, "tz-train: %s: expected %s above 0, got '%s'\n", flag, unit, optarg),
           -1;
  *out = v * scale;
  return 0;
}

static int parse(int argc, char **argv, struct opts *o) {
  static const struct option longs[] = {{"config", required_argument, 0, 'c'},
                                        {"model", required_argument, 0, 'm'},
                                        {"steps", required_argument, 0, 's'},
                                        {"seed", required_argument, 0, 'S'},
                                        {"seq", required_argument, 0, 'T'},
                                        {"metrics", required_argument, 0, 'M'},
                                        {"plan", no_argument, 0, 'p'},
                                        {"gpu-memory", required_argument, 0, 'G'},
                                        {"layer-rate", required_argument, 0, 'L'},
                                        {"world", required_argument, 0, 'N'},
                                        {"collective-rate", required_argument, 0, 'Q'},
                                        {"backend", required_argument, 0, 'B'},
                                        {"auto-placement", no_argument, 0, 'a'},
                                        {"optimizer-step", required_argument, 0, 'o'},
                                        {"rates", required_argument, 0, 'r'},
                                        {"remeasure", no_argument, 0, 'R'},
                                        {"nproc", required_argument, 0, 'n'},
                                        {"set", required_argument, 0, 'k'},
                                        {"data", required_argument, 0, 'd'},
                                        {"ckpt-dir", required_argument, 0, 'C'},
                                        {"save-every", required_argument, 0, 'W'},
                                        {"keep", required_argument, 0, 'K'},
                                        {"resume", optional_argument, 0, 'U'},
                                        {"eval-every", required_argument, 0, 'e'},
                                        {"val-fraction", required_argument, 0, 'v'},
                                        {"import-safetensors", required_argument, 0, 'I'},
                                        {"export-safetensors", required_argument, 0, 'E'},
                                        {"export-dtype", required_argument, 0, 'D'},
                                        {"trace-step", required_argument, 0, 't'},
                                        {"trace", required_argument, 0, 'x'},
                                        {"help", no_argument, 0, 'h'},
                                        {0, 0, 0, 0}};
  memset(o, 0, sizeof *o);
  o->steps = 10;
  o->seed = -1;
  o->trace_step = -1;
  o->val_fraction = 0.05;
  o->seq = 64;
  o->export_dtype = TZ_F32;
  int c;
  char *end;
  while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
    switch (c) {
    case 'c':
      if (o->n_configs == 8)
        return fprintf(stderr, "tz-train: at most 8 --config files\n"), -1;
      o->configs[o->n_configs++] = optarg;
      break;
    case 'k':
      if (o->n_sets == 32)
        return fprintf(stderr, "tz-train: at most 32 --set options\n"), -1;
      o->sets[o->n_sets++] = optarg;
      break;
    case 'm':
      o->model = optarg;
      break;
    case 'd':
      o->data = optarg;
      break;
    case 'M':
      o->metrics = optarg;
      break;
    case 'r':
      o->rates = optarg;
      break;
    case 'p':
      o->plan = 1;
      break;
    case 'B':
      if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") && strcmp(optarg, "auto"))
        return fprintf(stderr, "tz-train: --backend: expected cpu, cuda or auto, got '%s'\n",
                       optarg),
               -1;
      o->backend = optarg;
      break;
    case 'a':
      o->auto_place = 1;
      break;
    case 'R':
      o->remeasure = 1;
      break;
    case 'G':
      if (tz_config_parse_size(optarg, &o->gpu_memory) < 0 || !o->gpu_memory)
        return fprintf(stderr, "tz-train: --gpu-memory: expected a size (e.g. 139GiB), got '%s'\n",
                       optarg),
               -1;
      break;
    case 'L':
      if (parse_rate("--layer-rate", "TFLOP/s", 1e12, &o->layer_rate) < 0)
        return -1;
      break;
    case 'N':
      o->world = (int)strtol(optarg, &end, 10);
      if (end == optarg || *end || o->world < 1 || o->world > 4096)
        return fprintf(stderr, "tz-train: --world: expected a rank count from 1 to 4096, got "
                               "'%s'\n", optarg),
               -1;
      break;
    case 'Q':
      if (parse_rate("--collective-rate", "GB/s", 1e9, &o->coll_rate) < 0)
        return -1;
      break;
    case 'I':
      o->import_dir = optarg;
      break;
    case 'E':
      o->export_dir = optarg;
      break;
    case 'x':
      o->trace_path = optarg;
      break;
    case 'D':
      if (strcmp(optarg, "f32") == 0)
        o->export_dtype = TZ_F32;
      else if (strcmp(optarg, "bf16") == 0)
        o->export_dtype = TZ_BF16;
      else
        return fprintf(stderr, "tz-train: --export-dtype: expected f32 or bf16, got '%s'\n",
                       optarg),
               -1;
      break;
    case 'v': {
      double f = strtod(optarg, &end);
      if (end == optarg || *end || !(f > 0 && f < 1))
        return fprintf(stderr, "tz-train: --val-fraction: expected a number in (0, 1), got '%s'\n",
                       optarg),
               -1;
      o->val_fraction = f;
      break;
    }
    case 's':
    case 'S':
    case 'T':
    case 'n':
    case 'e':
    case 't': {
      int nonneg = c == 's' || c == 'S' || c == 't';
      const char *name = c == 's'   ? "steps"
                         : c == 'S' ? "seed"
                         : c == 'T' ? "seq"
                         : c == 'n' ? "nproc"
                         : c == 'e' ? "eval-every"
                                    : "trace-step";
      errno = 0;
      long long v = strtoll(optarg, &end, 10);
      if (end == optarg || *end || errno || v < 0 || (!nonneg && v < 1) ||
          (c != 's' && c != 'S' && v > INT32_MAX))
        return fprintf(stderr, "tz-train: --%s: expected a %s integer, got '%s'\n", name,
                       nonneg ? "non-negative" : "positive", optarg),
               -1;
      if (c == 's')
        o->steps = v;
      else if (c == 'S')
        o->seed = v;
      else if (c == 'T')
        o->seq = (int)v;
      else if (c == 'n')
        o->nproc = (int)v;
      else if (c == 'e')
        o->eval_every = v;
      else
        o->trace_step = v;
      break;
    }
    case 'C':
      o->ckpt_dir = optarg;
      break;
    case 'U': /* --resume DIR as well as --resume=DIR */
      o->resume = optarg ? optarg
                  : optind < argc && argv[optind][0] != '-' ? argv[optind++]
                                                            : "";
      break;
    case 'W':
    case 'K': {
      long long v = strtoll(optarg, &end, 10);
      if (*end || !*optarg || v < 0)
        return fprintf(stderr, "tz-train: --%s: expected a non-negative integer, got '%s'\n",
                       c == 'W' ? "save-every" : "keep", optarg),
               -1;
      *(c == 'W' ? &o->save_every : &o->keep) = v;
      break;
    }
    case 'o':
      if (tz_opt_mode_parse(optarg, &o->mode) < 0)
        return fprintf(stderr, "tz-train: --%s\n", tz_err_msg()), -1;
      break;
    case 'h':
      usage(stdout);
      exit(0);
    default:
      usage(stderr);
      return -1;
    }
  }
  if (optind < argc)
    return fprintf(stderr, "tz-train: unexpected argument '%s'\n", argv[optind]), -1;
  if (o->resume && !*o->resume && !(o->resume = o->ckpt_dir))
    return fprintf(stderr, "tz-train: --resume without DIR needs --ckpt-dir\n"), -1;
  if (o->resume && !o->ckpt_dir) { /* a root (not one step directory): saves continue there */
    static char manifest[4096];
    snprintf(manifest, sizeof manifest, "%s/manifest", o->resume);
    if (access(manifest, F_OK) != 0)
      o->ckpt_dir = o->resume;
  }
  if ((o->gpu_memory || o->layer_rate) && !o->plan)
    return fprintf(stderr, "tz-train: --gpu-memory and --layer-rate are for --plan (planning for "
                           "another machine's GPU)\n"),
           -1;
  if ((o->world || o->coll_rate) && !o->plan)
    return fprintf(stderr, "tz-train: --world and --collective-rate are for --plan (planning a "
                           "world of ranks without starting them)\n"),
           -1;
  if (o->world && o->nproc > 1)
    return fprintf(stderr, "tz-train: --world plans without starting ranks; --nproc starts them: "
                           "give one\n"),
           -1;
  if (o->gpu_memory && (!o->backend || strcmp(o->backend, "cuda") != 0))
    return fprintf(stderr, "tz-train: --gpu-memory plans for a GPU: it needs --backend cuda\n"),
           -1;
  if ((o->trace_step >= 0) != (o->trace_path != NULL))
    return fprintf(stderr, "tz-train: --trace-step and --trace go together (the step to record and "
                           "the file to write)\n"),
           -1;
  if (o->trace_step >= o->steps && o->trace_path)
    return fprintf(stderr,
                   "tz-train: --trace-step %lld: the run has %lld steps, numbered from 0\n",
                   (long long)o->trace_step, (long long)o->steps),
           -1;
  return 0;
}

static int load_config(const struct opts *o, int world, struct tz_config *cfg) {
  tz_config_defaults(cfg);
  if (o->demo_dir) {
    TZ_CHECK(tz_config_load_string(cfg, tz_demo_config_json, "the built-in demo (configs/demo.json)"));
    TZ_CHECK(tz_config_set(cfg, "tierzero.nvme_path", o->demo_dir));
  }
  if (o->resume) /* the saved effective config first; files and --set may change it */
    TZ_CHECK(tz_resume_config(o->resume, world, cfg));
  for (int i = 0; i < o->n_configs; i++)
    TZ_CHECK(tz_config_load_file(cfg, o->configs[i]));
  TZ_CHECK(tz_config_apply_env(cfg));
  for (int i = 0; i < o->n_sets; i++) {
    char key[256];
    const char *eq = strchr(o->sets[i], '=');
    if (!eq || eq == o->sets[i] || (size_t)(eq - o->sets[i]) >= sizeof key)
      return tz_err_set(TZ_ECONFIG, "--set %s: expected KEY=VALUE", o->sets[i]);
    memcpy(key, o->sets[i], (size_t)(eq - o->sets[i]));
    key[eq - o->sets[i]] = 0;
    TZ_CHECK(tz_config_set(cfg, key, eq + 1));
  }
  char buf[32];
  if (o->seed >= 0) {
    snprintf(buf, sizeof buf, "%lld", (long long)o->seed);
    TZ_CHECK(tz_config_set(cfg, "seed", buf));
  }
  if (o->trace_step >= 0) {
    snprintf(buf, sizeof buf, "%lld", (long long)o->trace_step);
    TZ_CHECK(tz_config_set(cfg, "tierzero.trace_step", buf));
  }
  if (cfg->train_batch_size == 0 && cfg->train_micro_batch_size_per_gpu == 0)
    TZ_CHECK(tz_config_set(cfg, "train_micro_batch_size_per_gpu", "4"));
  TZ_CHECK(tz_config_resolve_batch(cfg, world));
  tz_log_set_level((enum tz_log_level)cfg->tierzero.log);
  return 0;
}

/* The first field in which two model configs differ, or NULL. */
static const char *model_mismatch(const struct tz_model_config *a, const struct tz_model_config *b) {
  return a->d_model != b->d_model                ? "d_model (hidden_size)"
         : a->n_layer != b->n_layer              ? "n_layer (num_hidden_layers)"
         : a->n_head != b->n_head                ? "n_head (num_attention_heads)"
         : a->n_kv_head != b->n_kv_head          ? "n_kv_head (num_key_value_heads)"
         : a->ffn_dim != b->ffn_dim              ? "ffn_dim (intermediate_size)"
         : a->vocab != b->vocab                  ? "vocab (vocab_size)"
         : a->rope_theta != b->rope_theta        ? "rope_theta"
         : a->norm_eps != b->norm_eps            ? "norm_eps (rms_norm_eps)"
         : a->tie_embeddings != b->tie_embeddings ? "tie_embeddings (tie_word_embeddings)"
                                                 : NULL;
}

/* The model: the preset named by --model or tierzero.model; with --import-safetensors and no
 * preset named, the checkpoint's config (its max_seq from the checkpoint too). */
static int choose_model(const struct opts *o, const struct tz_config *cfg, tz_hf_model *hm,
                        struct tz_model_config *mc, const char **name) {
  const char *preset = o->model ? o->model : cfg->tierzero.model;
  if (!preset && !hm)
    preset = "tiny";
  if (!preset) {
    *mc = *tz_hf_config(hm);
    *name = o->import_dir;
    return 0;
  }
  TZ_CHECK(tz_model_preset(preset, mc));
  *name = preset;
  const char *diff = hm ? model_mismatch(mc, tz_hf_config(hm)) : NULL;
  if (diff)
    return tz_err_set(TZ_ECONFIG, "--import-safetensors %s: its %s differs from model %s's",
                      o->import_dir, diff, preset);
  return 0;
}

/* Every block of the checkpoint into the trainer's master and parameter shards. */
static int import_params(tz_trainer *tr, tz_hf_model *hm, const struct tz_model_config *mc) {
  uint64_t most = 0;
  for (int b = 0; b < tz_model_n_blocks(mc); b++)
    if (tz_model_block_numel(mc, b) > most)
      most = tz_model_block_numel(mc, b);
  float *buf = malloc(most * sizeof(float));
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory to import a block");
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(mc) && rc == 0; b++) {
    rc = tz_hf_read_block(hm, b, buf);
    if (rc == 0)
      rc = tz_trainer_param_store(tr, b, buf);
  }
  free(buf);
  return rc;
}

static int export_block(void *arg, int block, float *buf) {
  return tz_trainer_param_load(arg, block, TZ_PLAN_MASTER, buf);
}

/* Creates dir's missing parents (tz_hf_export creates dir itself). */
static int make_parents(const char *dir) {
  char path[4096];
  if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
    return tz_err_set(TZ_EINVAL, "--export-safetensors: path too long: %s", dir);
  for (char *p = strchr(path + 1, '/'); p; p = strchr(p + 1, '/')) {
    *p = 0;
    if (mkdir(path, 0755) < 0 && errno != EEXIST)
      return tz_err_errno(errno, "--export-safetensors: cannot create %s", path);
    *p = '/';
  }
  return 0;
}

/* The fp32 master weights to dir, stored as dtype. Gathering is collective: rank 0 writes while the others take
 * part in the same gathers, block by block. */
static int export_params(tz_trainer *tr, const struct tz_model_config *mc, const char *dir,
                         enum tz_dtype dtype, int rank) {
  TZ_CHECK(tz_trainer_sync(tr));
  if (rank == 0) {
    TZ_CHECK(make_parents(dir));
    return tz_hf_export(dir, mc, dtype, export_block, tr);
  }
  uint64_t most = 0;
  for (int b = 0; b < tz_model_n_blocks(mc); b++)
    if (tz_model_block_numel(mc, b) > most)
      most = tz_model_block_numel(mc, b);
  float *buf = malloc(most * sizeof(float));
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "tz-train: no memory to export a block");
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(mc) && rc == 0; b++)
    rc = export_block(tr, b, buf);
  free(buf);
  return rc;
}

/* The batch of step s (this rank's accum micro-batches), or with val set the validation batch. */
static int fill_batch(const struct opts *o, const struct tz_config *cfg, const tz_data *data,
                      int vocab, int rank, int world, int64_t s, int val, int32_t *tok,
                      int32_t *tgt) {
  int micro = (int)cfg->train_micro_batch_size_per_gpu;
  int accum = (int)cfg->gradient_accumulation_steps;
  for (int k = 0; k < accum; k++) {
    int32_t *ti = tok + (int64_t)k * micro * o->seq, *tt = tgt + (int64_t)k * micro * o->seq;
    if (!data) {
      /* Synthetic validation sequences: indices far past any training run's. */
      uint64_t first = tz_synthetic_first(s, k, rank, world, accum, micro);
      tz_synthetic_batch((uint64_t)cfg->seed, val ? (1ull << 48) + first : first, micro, o->seq,
                         vocab, ti, tt);
    } else {
      TZ_CHECK(tz_data_batch_io(data, val ? TZ_DATA_VAL : TZ_DATA_TRAIN,
                                tz_data_sample_index((uint64_t)s, accum, k, world, rank, micro),
                                micro, ti, tt));
    }
  }
  return 0;
}

/* The transfer rates the plan costs with (measured, or the cache's), on one line. */
static void print_rates(const struct tz_plan_rates *r, int shared) {
  if (r->copy_in <= 0)
    return;
  char both[96] = "", disk[128] = "", coll[64] = "";
  if (r->copy_duplex > 0)
    snprintf(both, sizeof both, ", %.1f both at once", r->copy_duplex / 1e9);
  if (r->copy_in_both > 0 && r->copy_out_both > 0)
    snprintf(both + strlen(both), sizeof both - strlen(both), " (in %.1f beside out %.1f)",
             r->copy_in_both / 1e9, r->copy_out_both / 1e9);
  if (r->nvme_read > 0)
    snprintf(disk, sizeof disk, "; disk %.2f GB/s read, %.2f written%s", r->nvme_read / 1e9,
             r->nvme_write / 1e9, r->nvme_duplex > 0 ? "" : " (one way at a time)");
  if (r->nvme_duplex > 0)
    snprintf(disk + strlen(disk), sizeof disk - strlen(disk), ", %.2f both at once",
             r->nvme_duplex / 1e9);
  if (r->collective > 0)
    snprintf(coll, sizeof coll, "; collectives %.1f GB/s", r->collective / 1e9);
  printf("tz-train: the plan's rates: host link %.1f GB/s in, %.1f out%s%s%s%s\n",
         r->copy_in / 1e9, r->copy_out / 1e9, both, shared ? " (every rank copying)" : "", disk,
         coll);
}

/* *stopped is set when the run ends on a stop request that every rank agreed on (it returns
 * TZ_ECANCELED then): all ranks leave together, so none aborts the job. */
static int train(const struct opts *o, tz_comm *comm, tz_runtime *rt, struct tz_config *cfg,
                 int *stopped) {
  int rank = tz_comm_rank(comm), world = o->world ? o->world : tz_comm_size(comm);
  int rc = 0;
  double t_last = 0; /* when the last step returned */
  tz_hf_model *hm = NULL;
  if (o->import_dir)
    TZ_CHECK(tz_hf_open(o->import_dir, &hm));
  struct tz_model_config mc;
  const char *preset = NULL;
  TZ_CHECK_GOTO(choose_model(o, cfg, hm, &mc, &preset), rc, out_hf);
  if (rank == 0)
    for (int i = 0; i < tz_config_ignored_count(cfg); i++)
      fprintf(stderr, "tz-train: config key %s is not used%s%s%s\n", tz_config_ignored(cfg, i),
              tz_config_ignored_hint(cfg, i) ? " (did you mean " : "",
              tz_config_ignored_hint(cfg, i) ? tz_config_ignored_hint(cfg, i) : "",
              tz_config_ignored_hint(cfg, i) ? "?)" : "");
  struct tz_plan_rates rates;
  double t_start = seconds();
  rc = tz_rates_get(cfg, o->backend, rt, comm, o->rates, o->remeasure, &rates);
  if (rc < 0 && o->gpu_memory) {
    char why[512];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    rc = tz_err_set(rc, "--gpu-memory: %s holds no rates for this set-up and this machine cannot "
                    "measure a GPU's (%s): give --rates the cache of a run on the GPU machine",
                    o->rates ? o->rates : "the rates cache", why);
  }
  if (rc < 0)
    goto out_hf;
  double t_rates = seconds();
  struct tz_trainer_params tp;
  tz_trainer_params_init(&tp);
  tp.seq_len = o->seq;
  tp.total_steps = o->steps;
  tp.opt_mode = o->mode;
  tp.auto_placement = o->auto_place;
  tp.rates = &rates;
  tp.plan_only = o->plan;
  tp.compute_backend = o->backend;
  tp.device = o->device;
  tp.measure_layer = 1;
  tp.gpu_free = o->gpu_memory;
  tp.layer_rate = o->layer_rate;
  tp.plan_world = o->world;
  if (o->coll_rate > 0)
    rates.collective = o->coll_rate;
  tz_trainer *tr = NULL;
  TZ_CHECK_GOTO(tz_trainer_create(cfg, &mc, comm, rt, &tp, &tr), rc, out_hf);
  const struct tz_plan *plan = tz_trainer_plan(tr);
  if (rank == 0) {
    const char *gpu = tz_trainer_device_name(tr);
    printf("tz-train: model %s (%llu parameters), %s backend%s%s, %d rank%s, micro-batch %lld x "
           "%d tokens, accumulation %lld, optimizer step %s%s\n",
           preset, (unsigned long long)tz_model_n_params(&mc), o->backend, gpu ? " on " : "",
           gpu ? gpu : "", world, world > 1 ? "s" : "",
           (long long)cfg->train_micro_batch_size_per_gpu, o->seq,
           (long long)cfg->gradient_accumulation_steps, tz_opt_mode_name(tz_trainer_opt_mode(tr)),
           tz_trainer_overlaps_collectives(tr) ? ", collectives overlapped" : "");
    if (tz_trainer_layer_rate(tr) > 0)
      printf("tz-train: a layer's forward and backward run at %.3g TFLOP/s here (the plan's "
             "compute rate; the matmul probe's: %.3g)\n",
             tz_trainer_layer_rate(tr) / 1e12, rates.flops / 1e12);
    print_rates(&rates, world > 1 && gpu);
    if (cfg->tierzero.cpu_adam_search)
      printf("tz-train: CPU Adam at the host homes for %g of the parameters (the plan's pick, "
             "tierzero.cpu_adam_search)\n",
             tz_trainer_cpu_adam(tr));
    tz_plan_print(stdout, plan, o->plan ? tz_trainer_group_names(tr) : NULL);
    if (!o->plan)
      printf("tz-train: set up in %.1f s (rates %.1f s; plan, tiers and initial shards %.1f s)\n",
             seconds() - t_start, t_rates - t_start, seconds() - t_rates);
    fflush(stdout);
  }
  tz_metrics_writer *mw = NULL;
  tz_display *disp = NULL;
  tz_data *data = NULL;
  int synthetic = o->data && strcmp(o->data, "synthetic") == 0;
  int micro = (int)cfg->train_micro_batch_size_per_gpu;
  int accum = (int)cfg->gradient_accumulation_steps;
  int64_t n = (int64_t)accum * micro * o->seq;
  int32_t *tok = NULL, *tgt = NULL;
  if (o->plan)
    goto out;
  if (hm) {
    TZ_CHECK_GOTO(import_params(tr, hm, &mc), rc, out);
    if (rank == 0)
      printf("tz-train: parameters from %s\n", o->import_dir);
  }
  int64_t start = 0, saved = -1;
  if (o->resume) {
    TZ_CHECK_GOTO(tz_resume_load(tr, comm, o->resume, &start), rc, out);
    saved = start;
    if (rank == 0)
      printf("tz-train: resumed from %s at step %lld\n", o->resume, (long long)start);
  }
  if (!synthetic) {
    struct tz_data_params dp = {.seq_len = o->seq, .seed = (uint64_t)cfg->seed};
    if (o->eval_every)
      dp.val_fraction = o->val_fraction;
    TZ_CHECK_GOTO(tz_data_open(o->data, mc.vocab, &dp, &data), rc, out);
    if (rank == 0)
      printf("tz-train: data: %s\n", tz_data_describe(data));
  }
  if (rank == 0) {
    if (o->metrics)
      TZ_CHECK_GOTO(tz_metrics_writer_create(o->metrics, 0, &mw), rc, out);
    TZ_CHECK_GOTO(tz_display_create(stdout, TZ_DISPLAY_AUTO, 1, &disp), rc, out);
  }
  tok = malloc(sizeof *tok * (size_t)n);
  tgt = malloc(sizeof *tgt * (size_t)n);
  if (!tok || !tgt) {
    rc = tz_err_set(TZ_ENOMEM, "tz-train: no memory for a batch");
    goto out;
  }
  double fpt = tz_metrics_flops_per_token(&mc, o->seq, 0), elapsed = 0;
  struct tz_metrics_summary sum;
  /* MFU against the GPU's dense peak at the precision it computes in (bf16 unless fp16). */
  double peak = tz_metrics_peak_flops(tz_trainer_device_name(tr),
                                      cfg->precision == TZ_PRECISION_FP16 ? TZ_PRECISION_FP16
                                                                          : TZ_PRECISION_BF16) *
                (double)world;
  tz_metrics_summary_init(&sum, fpt, peak);
  double first_loss = 0, last_loss = 0;
  for (int64_t s = start; s < o->steps; s++) {
    TZ_CHECK_GOTO(fill_batch(o, cfg, data, mc.vocab, rank, world, s, 0, tok, tgt), rc, out);
    struct tz_step_result r;
    TZ_CHECK_GOTO(tz_trainer_step(tr, tok, tgt, &r), rc, out);
    if (s == start)
      first_loss = r.loss;
    last_loss = r.loss;
    elapsed += r.step_s;
    struct tz_step_metrics m;
    tz_step_metrics_init(&m);
    m.step = s + 1;
    m.total_steps = o->steps;
    m.elapsed_s = elapsed;
    m.loss = r.loss;
    m.lr = r.lr;
    m.grad_norm = r.grad_norm;
    m.tokens = (uint64_t)n * (uint64_t)world;
    m.step_s = r.step_s;
    m.bound_s = plan->bound_s;
    m.stall_s = r.stall_s;
    m.coll_s = r.coll_s;
    m.skipped = r.skipped;
    m.loss_scale = r.loss_scale;
    if (o->eval_every && (m.step % o->eval_every == 0 || m.step == o->steps)) {
      float el;
      TZ_CHECK_GOTO(fill_batch(o, cfg, data, mc.vocab, rank, world, 0, 1, tok, tgt), rc, out);
      TZ_CHECK_GOTO(tz_trainer_eval(tr, tok, tgt, &el), rc, out);
      m.has_eval = 1;
      m.eval_loss = el;
    }
    tz_metrics_derive(&m, fpt, peak);
    tz_metrics_summary_add(&sum, &m);
    if (rank == 0) {
      tz_display_step(disp, &m);
      if (mw)
        TZ_CHECK_GOTO(tz_metrics_write_step(mw, &m), rc, out);
    }
    int sig = 0;
    TZ_CHECK_GOTO(tz_resume_stop_requested(comm, &sig), rc, out);
    if (o->ckpt_dir && (sig || (o->save_every && (s + 1) % o->save_every == 0))) {
      TZ_CHECK_GOTO(tz_resume_save(tr, comm, cfg, o->ckpt_dir, (int)o->keep), rc, out);
      saved = s + 1;
      if (rank == 0)
        printf("tz-train: checkpoint %s/step-%08lld saved\n", o->ckpt_dir, (long long)saved);
    }
    if (sig) {
      *stopped = 1;
      rc = o->ckpt_dir ? tz_err_set(TZ_ECANCELED,
                                    "stopped by %s after step %lld; checkpoint saved: resume "
                                    "with --resume %s",
                                    strsignal(sig), (long long)(s + 1), o->ckpt_dir)
                       : tz_err_set(TZ_ECANCELED,
                                    "stopped by %s after step %lld; nothing saved (no --ckpt-dir)",
                                    strsignal(sig), (long long)(s + 1));
      goto out;
    }
  }
  t_last = seconds();
  if (o->ckpt_dir && saved != o->steps && o->steps > start) {
    TZ_CHECK_GOTO(tz_resume_save(tr, comm, cfg, o->ckpt_dir, (int)o->keep), rc, out);
    if (rank == 0)
      printf("tz-train: checkpoint %s/step-%08lld saved\n", o->ckpt_dir, (long long)o->steps);
  }
  if (o->eval_every && o->steps == 0) {
    float el;
    TZ_CHECK_GOTO(fill_batch(o, cfg, data, mc.vocab, rank, world, 0, 1, tok, tgt), rc, out);
    TZ_CHECK_GOTO(tz_trainer_eval(tr, tok, tgt, &el), rc, out);
    if (rank == 0)
      tz_display_message(disp, "tz-train: eval loss %.6f (no training steps)", el);
  }
  /* Nothing reads the parameters from here on but an export (which applies the last update
   * itself): the last step's folded update is left pending rather than applied for nothing. */
  TZ_CHECK_GOTO(tz_trainer_wait(tr), rc, out);
  tz_display_destroy(disp);
  disp = NULL;
  if (o->trace_path && rank == 0) {
    TZ_CHECK_GOTO(tz_trainer_trace_write(tr, o->trace_path), rc, out);
    printf("tz-train: trace of step %lld (printed as %lld) written to %s\n",
           (long long)o->trace_step, (long long)o->trace_step + 1, o->trace_path);
  }
  if (o->export_dir) {
    TZ_CHECK_GOTO(export_params(tr, &mc, o->export_dir, o->export_dtype, rank), rc, out);
    if (rank == 0)
      printf("tz-train: parameters after %lld steps written to %s (%s)\n",
             (long long)tz_trainer_steps_done(tr), o->export_dir,
             tz_dtype_name(o->export_dtype));
  }
  if (rank == 0 && o->steps > 0) {
    struct tz_sched_stats st;
    tz_trainer_sched_stats(tr, &st);
    tz_metrics_summary_print(&sum, stdout);
    printf("tz-train: %llu phases, %llu fills (%.1f MiB), %llu write-backs (%.1f MiB), %llu hits, "
           "%llu uses in place, %llu evictions, stalled %.3f s of %.3f s computing\n",
           (unsigned long long)st.phases, (unsigned long long)st.fills,
           (double)st.fill_bytes / (1 << 20), (unsigned long long)st.flushes,
           (double)st.flush_bytes / (1 << 20), (unsigned long long)st.hits,
           (unsigned long long)st.in_place, (unsigned long long)st.evictions, st.stall_s,
           st.compute_s);
    if (mw)
      TZ_CHECK_GOTO(tz_metrics_write_summary(mw, &sum), rc, out);
    if (o->demo_dir)
      printf("tz-train: demo: loss %.4f at the first step, %.4f at the last (%.2f of the first)\n",
             first_loss, last_loss, last_loss / first_loss);
  }
out:
  tz_display_destroy(disp);
  tz_metrics_writer_destroy(mw);
  tz_data_destroy(data);
  free(tok);
  free(tgt);
  tz_trainer_destroy(tr);
  /* What a run costs past its steps is part of its price (once, a pending update applied
   * through host copies kept llama-7b running minutes after its last step). */
  if (rc == 0 && rank == 0 && t_last > 0)
    printf("tz-train: ended %.1f s after its last step (checkpoint, export, trace, teardown)\n",
           seconds() - t_last);
out_hf:
  tz_hf_close(hm);
  return rc;
}

/* Where this rank's pinned buffers and threads go: tz-topo's advice, unless the config says
 * (tierzero.numa_node). With GPUs the calling thread, and so every thread it starts (the progress
 * engine, the lanes, OpenMP), is bound to the cores the advice gives this rank's GPU; a CPU-only
 * rank keeps every core for compute. A topology that cannot be read changes nothing. */
static void place_from_topology(const struct tz_bootstrap *bs, struct tz_config *cfg,
                                struct tz_runtime_params *rp) {
  struct tz_topo_load_params lp;
  tz_topo_load_params_init(&lp);
  struct tz_topo_advice_params ap;
  tz_topo_advice_params_init(&ap);
  tz_topo *topo = NULL;
  struct tz_topo_advice *adv = NULL;
  if (tz_topo_load(&lp, &topo) < 0 || tz_topo_advise(topo, &ap, &adv) < 0) {
    tz_log(TZ_LOG_INFO, "tz-train: no placement advice: %s", tz_err_msg());
    goto out;
  }
  int gpu = tz_topo_gpu_count(topo) > 0 ? bs->local_rank % tz_topo_gpu_count(topo) : -1;
  const struct tz_topo_placement *pl = tz_topo_advice_for_gpu(adv, gpu);
  if (!pl)
    goto out;
  int advised = cfg->tierzero.numa_node < 0 && pl->numa_node >= 0;
  if (advised) /* the effective config says where every host tier goes */
    cfg->tierzero.numa_node = pl->numa_node;
  rp->numa_node = cfg->tierzero.numa_node;
  if (gpu >= 0 && tz_topo_bind_thread(topo, &pl->cpus) < 0)
    tz_log(TZ_LOG_WARN, "tz-train: cannot bind to the advised cpus: %s", tz_err_msg());
  struct tz_topo_binding b;
  char desc[256] = "";
  if (tz_topo_binding_readback(topo, &b) == 0)
    tz_topo_binding_format(&b, desc, sizeof desc);
  if (bs->rank == 0)
    printf("tz-train: placement: pinned buffers on NUMA node %d%s; %s\n", rp->numa_node,
           advised ? " (topology advice)" : " (config)", desc);
out:
  tz_topo_advice_destroy(adv);
  tz_topo_destroy(topo);
}

int main(int argc, char **argv) {
  struct opts o;
  if (parse(argc, argv, &o) < 0)
    return 2;
  struct tz_model_config named;
  if (o.model && tz_model_preset(o.model, &named) < 0) {
    fprintf(stderr, "tz-train: --model: %s\n", tz_err_msg());
    return 2;
  }
  /* No arguments: the demo. A tiny Llama on the built-in corpus, its parameters streaming from
   * host memory through a small compute-tier budget, its optimizer state on nvme files in a
   * temporary directory removed at the end. */
  char demo_dir[] = "/var/tmp/tierzero-demo-XXXXXX";
  if (argc == 1) {
    if (!mkdtemp(demo_dir)) {
      perror("tz-train: mkdtemp /var/tmp/tierzero-demo-XXXXXX");
      return 1;
    }
    o.demo_dir = demo_dir;
    o.steps = 100;
    printf("tz-train: no arguments: the demo (configs/demo.json, optimizer state in %s); "
           "tz-train --help for the options\n", demo_dir);
  }
  if (o.nproc > 1 && !tz_launch_is_worker()) {
    char why[256];
    if (tz_comm_probe("nccl", why, sizeof why) < 0) {
      fprintf(stderr,
              "tz-train: --nproc %d starts one worker per GPU, and %s; on CPUs run "
              "`mpirun -np %d tz-train ...`\n",
              o.nproc, why, o.nproc);
      return 2;
    }
    return tz_launch_nproc(o.nproc, argc, argv);
  }
  struct tz_bootstrap bs;
  if (tz_bootstrap_detect(&bs) < 0) {
    fprintf(stderr, "tz-train: %s\n", tz_err_msg());
    return 1;
  }
  struct tz_config cfg;
  if (load_config(&o, o.world ? o.world : bs.size, &cfg) < 0) {
    fprintf(stderr, "tz-train: %s\n", tz_err_msg());
    tz_config_free(&cfg);
    return 2;
  }
  const char *backend = bs.size == 1 ? "single" : bs.kind == TZ_LAUNCH_MPIRUN ? "mpi" : "nccl";
  o.device = cfg.tierzero.device >= 0 ? cfg.tierzero.device : bs.local_rank;
  if (!o.backend || strcmp(o.backend, "auto") == 0) {
    char why[256];
    o.backend = strcmp(backend, "mpi") != 0 && tz_compute_probe("cuda", why, sizeof why) == 0
                    ? "cuda"
                    : "cpu";
  }
  tz_runtime *rt = NULL;
  tz_comm *comm = NULL;
  struct tz_runtime_params rp;
  tz_runtime_params_init(&rp);
  rp.staging_bytes = cfg.tierzero.staging_bytes;
  rp.chunk_bytes = cfg.tierzero.chunk_bytes;
  rp.numa_node = cfg.tierzero.numa_node;
  place_from_topology(&bs, &cfg, &rp);
  int rc = tz_runtime_create(&rp, &rt);
  if (rc == 0) {
    struct tz_comm_params cp;
    tz_comm_params_init(&cp);
    cp.progress = tz_runtime_progress(rt);
    rc = tz_comm_create(backend, &bs, &cp, &comm);
  }
  if (rc == 0 && !o.plan)
    rc = tz_signals_install();
  int stopped = 0;
  if (rc == 0)
    rc = train(&o, comm, rt, &cfg, &stopped);
  tz_signals_restore();
  if (rc < 0) {
    fprintf(stderr, "tz-train: rank %d: %s\n", bs.rank, tz_err_msg());
    /* A failure on some ranks leaves the others waiting in a collective: abort the job. A stop
     * request is agreed on by every rank after the same step, so each leaves on its own. */
    if (comm && bs.size > 1 && !stopped)
      tz_comm_abort(comm, rc, tz_err_msg());
  }
  tz_comm_destroy(comm);
  tz_runtime_destroy(rt);
  tz_config_free(&cfg);
  if (o.demo_dir)
    rmdir(o.demo_dir);
  return rc < 0 ? 1 : 0;
}
