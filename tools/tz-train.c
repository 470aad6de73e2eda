/* tz-train: ZeRO-3 training of a Llama-shaped model on the scheduler (docs/training.md). The run
 * itself is trainer/run/run.h's and what it prints trainer/run/report.h's; this main parses the
 * flags, starts the world and hands the run its report. */
#define _GNU_SOURCE
#include "collectives/comm.h"
#include "collectives/launch.h"
#include "core/error.h"
#include "trainer/run/fit.h"
#include "trainer/run/metrics.h"
#include "trainer/run/report.h"
#include "trainer/run/run.h"
#include "trainer/run/signals.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tz_demo_config.h"
#include "tz_version.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tz-train [options]\n"
      "Trains a Llama-shaped model with ZeRO-3 sharding, its state placed across the compute\n"
      "tier, host memory and NVMe.\n\n"
      "  --config FILE        DeepSpeed-style JSON (docs/config.md); may be repeated\n"
      "  --model M            a preset (tiny, llama-1b, llama-3b, llama-7b, llama-13b) or a\n"
      "                       Hugging Face config.json (the file, or its directory) of\n"
      "                       model_type llama, mistral, qwen2 or qwen3: that shape, with no\n"
      "                       weights, initialised from --seed as transformers does\n"
      "                       (default: the config's tierzero.model, else tiny)\n"
      "  --steps N            optimizer steps (default 10; 0 trains nothing: with the flags\n"
      "                       below, an evaluation or a conversion)\n"
      "  --epochs X           train X passes over --data instead (tierzero.epochs; also\n"
      "                       --num-train-epochs): ceil(X * samples / global batch) steps,\n"
      "                       a sample a packed row for fine-tuning data; --steps too must\n"
      "                       agree\n"
      "  --seed N             initialisation and data seed (default: the config's seed)\n"
      "  --seq N              tokens per sequence (default 64, at most the model's max_seq)\n"
      "  --data SPEC          builtin (the built-in corpus, the default), text:PATH, an llm.c\n"
      "                       shard or a glob of them (tools/tz-data makes them from text\n"
      "                       with the model's tokenizer; docs/data.md), or synthetic\n"
      "  --tokenizer FILE     the tokenizer.json the shards' sidecars must name (default: the\n"
      "                       import's or the --model directory's tokenizer.json, if any)\n"
      "  --metrics FILE       one JSON object per step (docs/data.md: step, loss, grad_norm,\n"
      "                       lr, step_s, bound_s, stall_s, coll_s, tokens_per_s, skipped,\n"
      "                       loss_scale, eval_loss, ...), then a summary object; a new\n"
      "                       file for a new run, continued after the checkpoint's step\n"
      "                       with --resume\n"
      "  --progress MODE      plain (a line per step, no control characters: for logs),\n"
      "                       bar (one line redrawn in place) or auto (the default: a bar\n"
      "                       when stdout is a terminal, plain otherwise)\n"
      "  --eval-every N       every N steps and after the last, the loss on the validation\n"
      "                       split (forward only, parameters unchanged)\n"
      "  --val-fraction F     share of the data's windows held out for --eval-every, in\n"
      "                       (0, 1) (default 0.05)\n"
      "  --val-data SPEC      with --eval-every: evaluate on this separate data set (a SPEC\n"
      "                       as --data) instead of holding out a share of --data\n"
      "  --import-safetensors DIR\n"
      "                       start from a Hugging Face checkpoint (config.json and\n"
      "                       model.safetensors or its shards); the model is its config\n"
      "                       unless --model or tierzero.model names one, which must match\n"
      "  --export-safetensors DIR\n"
      "                       after training, write DIR/config.json, generation_config.json,\n"
      "                       model.safetensors (or its shards and index, Hugging Face names)\n"
      "                       and the tokenizer files of the import or --model directory;\n"
      "                       with --resume and --steps 0, the checkpoint's model, at any\n"
      "                       number of ranks\n"
      "  --export-dtype T     bf16 (default; rounded to nearest even), f32 or fp16\n"
      "  --export-shard-size SIZE\n"
      "                       the largest safetensors file of an export (default 5GB, as\n"
      "                       save_pretrained; 500MB, 2GiB, ...)\n"
      "  --trace-step N       record the lanes of step N (counted from 0, the step printed\n"
      "                       as N+1; sets tierzero.trace_step) ...\n"
      "  --trace FILE         ... and write them to FILE as a Chrome/Perfetto trace (JSON)\n"
      "  --backend B          cpu, cuda, or auto (the default: cuda when this build has it\n"
      "                       and a GPU is visible, unless the ranks run under mpirun)\n"
      "  --plan               print the placement and the predicted bound, and stop\n"
      "  --fit WHAT           with --plan: the largest micro-batch (WHAT micro-batch), the\n"
      "                       most layers of the model's shape (layers) or the longest\n"
      "                       sequence (seq) that this machine holds, by bisection over the\n"
      "                       plan, with its bound\n"
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
      "  --learning-rate, --weight-decay, --max-grad-norm, --warmup-steps, --warmup-ratio,\n"
      "  --per-device-train-batch-size, --gradient-accumulation-steps, --num-train-epochs\n"
      "                       Hugging Face TrainingArguments' names, each the --set of its\n"
      "                       key (docs/config.md), over the config files\n"
      "  --ckpt-dir DIR       save checkpoints under DIR (every --save-every steps, at the\n"
      "                       end, and on SIGTERM/SIGINT); docs/checkpoints.md\n"
      "  --save-every N       save every N steps (default 0: only at the end and on a signal)\n"
      "  --keep N             keep the newest N checkpoints (default 0: all)\n"
      "  --resume [DIR]       continue from the checkpoint DIR (a --ckpt-dir, whose latest is\n"
      "                       taken, or one step-N directory); DIR defaults to --ckpt-dir,\n"
      "                       and --ckpt-dir to DIR when DIR is not a step directory.\n"
      "                       --steps stays the total: the run ends after step N.\n"
      "                       --resume auto: --ckpt-dir's checkpoints when it holds one,\n"
      "                       else a new start (a job a scheduler requeues)\n"
      "  --reseed             with --resume: the seed of the configuration (or --seed) instead\n"
      "                       of the checkpoint's; the data order changes from there on\n"
      "  --version            the version, the commit and the libraries compiled in\n"
      "  -h, --help           this text\n\n"
      "Precedence: built-in defaults, then each --config file in order, then TZ_* environment\n"
      "variables, then --set, then the flags above (--seed, --model, --trace-step).\n"
      "Output, on stdout: the progress (--progress), then a summary; errors on stderr. Exit\n"
      "status: 0 done, 1 a failure while running, 2 a usage or configuration error.\n"
      "Without arguments tz-train runs the demo (a tiny Llama, optimizer state on NVMe files).\n");
}

struct opts {
  struct tz_run_options run; /* backend NULL: auto */
  struct tz_run_sources src; /* the config's sources: files in configs, KEY=VALUE in sets */
  const char *configs[8];
  const char *sets[32];
  int nproc;
  const char *demo_dir; /* no arguments: the demo, with its nvme files in this directory */
  enum tz_display_mode progress;
  const char *fit;         /* --fit: micro-batch or layers */
  const char *hf_value[8]; /* the value of each TrainingArguments flag given (hf_flags), or NULL */
};

/* The flags in the order --help lists them (getopt_long names them in this order when a prefix is
 * ambiguous), one space after each. Those of a run are read by tz_run_option_set; config, nproc,
 * set, resume and progress are tz-train's own. */
static const char flag_names[] =
    "config model steps epochs seed seq metrics progress plan fit gpu-memory layer-rate world "
    "collective-rate "
    "backend "
    "auto-placement optimizer-step rates remeasure nproc set data ckpt-dir save-every keep resume "
    "reseed "
    "eval-every val-fraction val-data tokenizer import-safetensors export-safetensors export-dtype "
    "export-shard-size trace-step trace ";

/* Flags with the names of Hugging Face TrainingArguments for what people set most, each the
 * --set of its key, after the config files (and so over them); tz-train says where each value
 * came from. */
static const struct {
  const char *flag, *key;
} hf_flags[] = {
    {"learning-rate", "optimizer.params.lr"},
    {"weight-decay", "optimizer.params.weight_decay"},
    {"max-grad-norm", "gradient_clipping"},
    {"warmup-steps", "scheduler.params.warmup_num_steps"},
    {"per-device-train-batch-size", "train_micro_batch_size_per_gpu"},
    {"gradient-accumulation-steps", "gradient_accumulation_steps"},
    {"num-train-epochs", "tierzero.epochs"},
    {"warmup-ratio", "tierzero.warmup_ratio"},
};
#define N_HF_FLAGS ((int)(sizeof hf_flags / sizeof hf_flags[0]))
_Static_assert(sizeof hf_flags / sizeof hf_flags[0] <= 8, "struct opts.hf_value holds them");

/* Edits between a and b (insertions, deletions, substitutions), at most 64 characters each. */
static int distance(const char *a, const char *b) {
  int la = (int)strlen(a), lb = (int)strlen(b), d[65][65];
  if (la > 64 || lb > 64)
    return 1 << 20;
  for (int i = 0; i <= la; i++)
    for (int j = 0; j <= lb; j++) {
      if (!i || !j) {
        d[i][j] = i + j;
        continue;
      }
      int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[la][lb];
}

/* "tz-train: " and the message on stderr; -1 (a usage error). */
#define BAD(...) (fprintf(stderr, "tz-train: " __VA_ARGS__), fputc('\n', stderr), -1)

/* A flag of tz-train's own. */
static int own_flag(const char *f, int argc, char **argv, struct opts *o) {
  char *end;
  if (strcmp(f, "resume") == 0) /* --resume DIR as well as --resume=DIR */
    o->run.resume = optarg ? optarg : optind < argc && argv[optind][0] != '-' ? argv[optind++] : "";
  else if (strcmp(f, "config") == 0 && o->src.n_files == 8)
    return BAD("at most 8 --config files");
  else if (strcmp(f, "config") == 0)
    o->configs[o->src.n_files++] = optarg;
  else if (strcmp(f, "set") == 0 && o->src.n_sets == 32)
    return BAD("at most 32 --set options");
  else if (strcmp(f, "set") == 0)
    o->sets[o->src.n_sets++] = optarg;
  else if (strcmp(f, "progress") == 0 && tz_display_mode_parse(optarg, &o->progress) < 0)
    return BAD("--progress: %s", tz_err_msg());
  else if (strcmp(f, "progress") == 0)
    return 0;
  else if (strcmp(f, "fit") == 0)
    o->fit = optarg;
  else { /* nproc */
    errno = 0;
    long long v = strtoll(optarg, &end, 10);
    if (end == optarg || *end || errno || v < 1 || v > INT32_MAX)
      return BAD("--nproc: expected a positive integer, got '%s'", optarg);
    o->nproc = (int)v;
  }
  return 0;
}

static int parse(int argc, char **argv, struct opts *o) {
  char names[sizeof flag_names];
  const char *flags[sizeof flag_names / 2];
  int n = 0;
  memcpy(names, flag_names, sizeof names);
  for (char *t = strtok(names, " "); t; t = strtok(NULL, " "))
    flags[n++] = t;
  struct option longs[sizeof flag_names / 2 + N_HF_FLAGS + 3];
  for (int i = 0; i < n; i++) { /* distinct values: else a prefix of two is not ambiguous */
    int sw = tz_run_option_is_switch(flags[i]) == 1;
    longs[i] = (struct option){flags[i],
                               strcmp(flags[i], "resume") == 0 ? optional_argument
                               : sw                            ? no_argument
                                                               : required_argument,
                               0, 256 + i};
  }
  for (int i = 0; i < N_HF_FLAGS; i++)
    longs[n + i] = (struct option){hf_flags[i].flag, required_argument, 0, 1024 + i};
  longs[n + N_HF_FLAGS] = (struct option){"help", no_argument, 0, 'h'};
  longs[n + N_HF_FLAGS + 1] = (struct option){"version", no_argument, 0, 'V'};
  longs[n + N_HF_FLAGS + 2] = (struct option){0, 0, 0, 0};
  memset(o, 0, sizeof *o);
  tz_run_options_init(&o->run);
  o->run.backend = NULL; /* auto, resolved once the launch is known */
  o->src = (struct tz_run_sources){.files = o->configs, .sets = o->sets};
  int c;
  opterr = 0; /* an unknown flag gets one line naming the closest (below), not getopt's */
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c == 'h') {
      usage(stdout);
      exit(0);
    }
    if (c == 'V') {
      tz_version_print(stdout, "tz-train");
      exit(0);
    }
    if (c == '?' || c == ':') {
      const char *arg = argv[optind - 1];
      if (c == ':')
        return BAD("%s needs a value (tz-train --help)", arg);
      const char *name = arg + strspn(arg, "-");
      char bare[128];
      snprintf(bare, sizeof bare, "%.*s", (int)strcspn(name, "="), name);
      const char *best = NULL;
      int bd = 1 << 20;
      for (int i = 0; i < n + N_HF_FLAGS + 2; i++) {
        int d = distance(bare, longs[i].name);
        if (d < bd)
          bd = d, best = longs[i].name;
      }
      if (best && bd <= 3 && bd < (int)strlen(bare))
        return BAD("unknown flag '%s' (did you mean --%s?); tz-train --help lists them", arg, best);
      return BAD("unknown flag '%s'; tz-train --help lists them", arg);
    }
    if (c >= 1024) { /* a TrainingArguments name: the --set of its key */
      static char sets[N_HF_FLAGS][160];
      int i = c - 1024;
      if (o->src.n_sets == 32)
        return BAD("at most 32 --set options and flags like --%s", hf_flags[i].flag);
      snprintf(sets[i], sizeof sets[i], "%s=%s", hf_flags[i].key, optarg);
      o->sets[o->src.n_sets++] = sets[i];
      o->hf_value[i] = optarg;
      continue;
    }
    if (c < 256) {
      usage(stderr);
      return -1;
    }
    const char *f = flags[c - 256];
    if (strcmp(f, "resume") && tz_run_option_is_switch(f) >= 0) {
      if (tz_run_option_set(&o->run, f, optarg) < 0)
        return BAD("%s", tz_err_msg());
    } else if (own_flag(f, argc, argv, o) < 0) {
      return -1;
    }
  }
  if (optind < argc)
    return BAD("unexpected argument '%s'", argv[optind]);
  enum tz_fit_what fw;
  if (o->fit && (tz_fit_parse(o->fit, &fw) < 0 || !o->run.plan_only))
    return BAD("%s", o->run.plan_only ? tz_err_msg() : "--fit is for --plan");
  return tz_run_options_check(&o->run, o->nproc) < 0 ? BAD("%s", tz_err_msg()) : 0;
}

/* --plan --fit: the bisection's answer, said by rank 0. */
static int print_fit(const struct opts *o, const struct tz_config *cfg, struct tz_run_world *w,
                     int rank) {
  enum tz_fit_what what;
  struct tz_fit_result r;
  TZ_CHECK(tz_fit_parse(o->fit, &what));
  TZ_CHECK(tz_run_fit(&o->run, cfg, w->comm, w->rt, what, &r));
  if (rank == 0)
    tz_run_report_fit(&r);
  return 0;
}

/* This rank's world and placement, then the run; its error printed. */
static int run(struct opts *o, struct tz_bootstrap *bs, struct tz_config *cfg) {
  o->run.device = cfg->tierzero.device >= 0 ? cfg->tierzero.device : bs->local_rank;
  o->run.backend = tz_run_compute_backend(o->run.backend, tz_run_comm_backend(bs));
  struct tz_run_world w;
  int rc = tz_run_world_open(bs, cfg, &w);
  const struct tz_run_placement *pl = &w.placement;
  if (pl->known && bs->rank == 0)
    printf("tz-train: placement: pinned buffers on NUMA node %d%s; %s\n", pl->numa_node,
           pl->advised ? " (topology advice)" : " (config)", pl->binding);
  if (rc == 0 && !o->run.plan_only)
    rc = tz_signals_install();
  /* the TrainingArguments flags given, said at the set-up: "KEY VALUE from --FLAG" */
  char lines[N_HF_FLAGS][256];
  const char *overrides[N_HF_FLAGS + 1];
  int n = 0;
  for (int i = 0; i < N_HF_FLAGS; i++)
    if (o->hf_value[i]) {
      snprintf(lines[n], sizeof lines[n], "%s %s from --%s", hf_flags[i].key, o->hf_value[i],
               hf_flags[i].flag);
      overrides[n] = lines[n];
      n++;
    }
  overrides[n] = NULL;
  struct tz_run_report p = {.run = &o->run,
                            .cfg = cfg,
                            .overrides = overrides,
                            .progress = o->progress,
                            .demo = o->demo_dir != NULL};
  o->run.on_event = tz_run_report_event;
  o->run.arg = &p;
  struct tz_run_result res = {0};
  if (rc == 0 && o->fit)
    rc = print_fit(o, cfg, &w, bs->rank);
  else if (rc == 0)
    rc = tz_run(&o->run, cfg, w.comm, w.rt, &res);
  /* test hook (tests/test_train_cli.c): a stop request right after the last step */
  const char *late_hook = getenv("TZ_TEST_SIGTERM_AFTER_RUN");
  if (late_hook && *late_hook == '1')
    raise(SIGTERM);
  if (rc < 0) {
    fprintf(stderr, "tz-train: rank %d: %s\n", bs->rank, tz_err_msg());
    /* A failure on some ranks leaves the others waiting in a collective: abort the job. A stop
     * request is agreed on by every rank after the same step, so each leaves on its own. */
    if (w.comm && bs->size > 1 && !res.stopped)
      tz_comm_abort(w.comm, rc, tz_err_msg());
  }
  tz_run_world_close(&w);
  /* The handlers stay until the run's files are written and its world closed: a stop request
   * that arrives after the last step (the checkpoint, the export, the teardown) has nothing left
   * to stop, and the run that completed exits 0 saying so, instead of ending with the signal
   * mid-teardown (issue 48). */
  int late = tz_signals_pending();
  tz_signals_restore();
  if (late && rc == 0 && !res.stopped && !o->run.plan_only)
    fprintf(stderr,
            "tz-train: rank %d: %s arrived after the last step; the run had completed (exit 0)\n",
            bs->rank, strsignal(late));
  return rc;
}

int main(int argc, char **argv) {
  /* A run killed (the OOM killer, kill -9) keeps every line it printed. */
  setvbuf(stdout, NULL, _IOLBF, 0);
  /* A file past the size limit (ulimit -f): its write fails with EFBIG, which the writer reports
   * naming the file, instead of SIGXFSZ killing the run without a word (issue 48). */
  signal(SIGXFSZ, SIG_IGN);
  struct opts o;
  if (parse(argc, argv, &o) < 0)
    return 2;
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
    o.run.steps = 100;
    o.src.base_json = tz_demo_config_json;
    o.src.base_name = "the built-in demo (configs/demo.json)";
    o.src.base_nvme_path = demo_dir;
    printf("tz-train: no arguments: the demo (configs/demo.json, optimizer state in %s); "
           "tz-train --help for the options\n",
           demo_dir);
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
  if (tz_run_config(&o.run, &o.src, o.run.plan_world ? o.run.plan_world : bs.size, &cfg) < 0) {
    fprintf(stderr, "tz-train: %s\n", tz_err_msg());
    tz_config_free(&cfg);
    return 2;
  }
  int rc = run(&o, &bs, &cfg);
  tz_config_free(&cfg);
  if (o.demo_dir)
    rmdir(o.demo_dir);
  /* 2: what was asked cannot be run as given (a model's config.json, a data sidecar, a setting
   * the machine or build lacks), as for the command line and the ds_config above; 1: a failure
   * while running (docs/training.md, "Exit status") */
  int code = rc >= 0 ? 0 : rc == TZ_ECONFIG || rc == TZ_ENOTSUP ? 2 : 1;
  if (rc < 0) {
    /* A failed run ends here: the libraries' exit handlers are not run, since one may wait
     * forever for its threads (OpenBLAS's, still retrying an allocation under ulimit -v, held
     * the process after the run had failed and said why). Every file of the run is closed. */
    fflush(NULL);
    _exit(code);
  }
  return code;
}
