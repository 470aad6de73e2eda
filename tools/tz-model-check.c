/* tz-model-check: run the model on given tokens and print the loss and a summary of the logits,
 * to compare with tools/hf_check.py (transformers) on the same weights; or write a freshly
 * initialised model in Hugging Face format. Every family of trainer/model/hf.h.
 *   tz-model-check --import DIR --tokens 1,2,3,...     loss of predicting tokens[1:] from [:-1]
 *        [--generate N]   then N tokens of greedy generation after the given ones (stops at eos)
 *        [--logits FILE]  every logit to FILE, (T, V) little-endian float32
 *        [--backend cuda --dtype bf16]  on another backend and storage dtype
 *   tz-model-check --import DIR --read-only            every block read, timed (the import's cost)
 *   tz-model-check --preset tiny | --config PATH  [--seed 1] --export DIR [--dtype bf16]
 *        [--shard-size BYTES] [--tokenizer DIR] */
#include <time.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "trainer/model/family.h"
#include "trainer/model/hf.h"
#include "trainer/model/model.h"
#include "tz_version.h"

static void usage(FILE *fp) {
  fprintf(fp, "usage: tz-model-check --import DIR --tokens T0,T1,... [--generate N]"
              " [--logits FILE] [--backend cpu|cuda] [--dtype f32|bf16|f16] [--threads N]\n"
              "       tz-model-check --import DIR --read-only\n"
              "       tz-model-check --preset NAME|--config PATH [--seed S] --export DIR"
              " [--dtype f32|bf16|f16] [--shard-size BYTES] [--tokenizer DIR]\n"
              "       tz-model-check --families   (the family table as JSON)\n"
              "       tz-model-check --version\n");
}

static int parse_tokens(const char *s, int32_t **out, int *n) {
  int cap = 16, k = 0;
  int32_t *t = malloc(sizeof *t * cap);
  for (const char *p = s; t && *p;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX) {
      free(t);
      return tz_err_set(TZ_EINVAL, "--tokens: bad number at \"%s\"", p);
    }
    if (k == cap) {
      int32_t *g = realloc(t, sizeof *t * (size_t)(cap *= 2));
      if (!g)
        free(t);
      t = g;
      if (!t)
        break;
    }
    t[k++] = (int32_t)v;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') {
      free(t);
      return tz_err_set(TZ_EINVAL, "--tokens: expected ',' at \"%s\"", end);
    }
  }
  if (!t)
    return tz_err_set(TZ_ENOMEM, "--tokens: out of memory");
  if (k < 2) {
    free(t);
    return tz_err_set(TZ_EINVAL, "--tokens: need at least two tokens");
  }
  *out = t;
  *n = k;
  return 0;
}

/* Prints what hf_check.py prints, in the same format. */
static int check(tz_compute *cm, const struct tz_model_config *cfg, void *const *blocks,
                 const int32_t *tok, int n, const char *logits_path) {
  int T = n - 1, rc;
  tz_model_runner *r = NULL;
  float *logits = malloc(sizeof(float) * (size_t)T * cfg->vocab), loss = 0;
  if (!logits)
    return tz_err_set(TZ_ENOMEM, "out of memory");
  TZ_CHECK_GOTO(tz_model_runner_create(cm, cfg, 1, T, 1, &r), rc, out);
  TZ_CHECK_GOTO(tz_model_runner_step(r, blocks, NULL, tok, tok + 1, 0, &loss), rc, out);
  TZ_CHECK_GOTO(tz_model_runner_logits(r, blocks, tok, logits), rc, out);
  double sum = 0, asum = 0;
  for (size_t i = 0; i < (size_t)T * cfg->vocab; i++)
    sum += logits[i], asum += fabs(logits[i]);
  printf("tokens %d\nloss %.7f\nlogits_sum %.6f\nlogits_abs_sum %.6f\nlogits_first", T, loss, sum,
         asum);
  for (int j = 0; j < 8 && j < cfg->vocab; j++)
    printf(" %.6f", logits[j]);
  printf("\n");
  if (logits_path) { /* every logit, (T, V) little-endian float32 row-major, for hf_check.py */
    FILE *f = fopen(logits_path, "wb");
    size_t nl = (size_t)T * cfg->vocab;
    if (!f || fwrite(logits, sizeof(float), nl, f) != nl || fclose(f) != 0) {
      rc = tz_err_set(TZ_EIO, "--logits %s: cannot write %zu floats", logits_path, nl);
      goto out;
    }
  }
out:
  tz_model_runner_destroy(r);
  free(logits);
  return rc;
}

/* Whether id ends generation: the config's eos, or any of its eos list. */
static int is_eos(const struct tz_model_config *cfg, const struct tz_hf_info *info, int32_t id) {
  if (cfg->has_eos && id == cfg->eos_id)
    return 1;
  for (int i = 0; info && i < info->n_eos; i++)
    if (id == info->eos[i])
      return 1;
  return 0;
}

/* Greedy generation as transformers' generate(do_sample=False): each step runs the whole sequence
 * and takes the argmax of the last position's logits (the lowest id of equal ones, as torch's
 * argmax), until n tokens, an eos, or max_seq. Prints "generated" and the new ids. */
static int generate(tz_compute *cm, const struct tz_model_config *cfg,
                    const struct tz_hf_info *info, void *const *blocks, const int32_t *tok,
                    int ntok, int n) {
  int32_t *seq = malloc(sizeof *seq * (size_t)(ntok + n));
  float *logits = malloc(sizeof(float) * (size_t)(ntok + n) * cfg->vocab);
  int rc = 0, len = ntok;
  if (!seq || !logits) {
    free(seq);
    free(logits);
    return tz_err_set(TZ_ENOMEM, "--generate: out of memory");
  }
  memcpy(seq, tok, sizeof *seq * (size_t)ntok);
  printf("generated");
  for (int k = 0; k < n && len < cfg->max_seq && !rc; k++) {
    tz_model_runner *r = NULL;
    rc = tz_model_runner_create(cm, cfg, 1, len, 0, &r);
    if (!rc)
      rc = tz_model_runner_logits(r, blocks, seq, logits);
    tz_model_runner_destroy(r);
    if (rc)
      break;
    const float *last = logits + (size_t)(len - 1) * cfg->vocab;
    int32_t best = 0;
    for (int32_t v = 1; v < cfg->vocab; v++)
      if (last[v] > last[best])
        best = v;
    seq[len++] = best;
    printf(" %d", best);
    if (is_eos(cfg, info, best))
      break;
  }
  printf("\n");
  free(seq);
  free(logits);
  return rc;
}

/* Every block read into one host buffer, as an import does before it stores them: the time and
 * the bytes of the files. */
static int read_only(tz_hf_model *hf) {
  const struct tz_model_config *cfg = tz_hf_config(hf);
  uint64_t most = 0, params = 0;
  for (int b = 0; b < tz_model_n_blocks(cfg); b++)
    if (tz_model_block_numel(cfg, b) > most)
      most = tz_model_block_numel(cfg, b);
  float *buf = malloc(sizeof(float) * most);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "--read-only: cannot allocate %llu floats",
                      (unsigned long long)most);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = 0;
  for (int b = 0; b < tz_model_n_blocks(cfg) && !rc; b++)
    rc = tz_hf_read_block(hf, b, buf);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  free(buf);
  params = tz_model_n_params(cfg);
  if (!rc)
    printf("read %llu parameters in %.3f s\n", (unsigned long long)params,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return rc;
}

int main(int argc, char **argv) {
  const char *import = NULL, *export = NULL, *preset = NULL, *tokens = NULL, *backend = "cpu";
  const char *dtype_s = "f32", *config = NULL, *tokenizer = NULL, *logits_path = NULL;
  unsigned long long seed = 1, shard = 0;
  int threads = 0, gen = 0, ronly = 0;
  static const struct option opts[] = {
      {"import", required_argument, 0, 'i'},    {"export", required_argument, 0, 'e'},
      {"preset", required_argument, 0, 'p'},    {"tokens", required_argument, 0, 't'},
      {"seed", required_argument, 0, 's'},      {"dtype", required_argument, 0, 'd'},
      {"backend", required_argument, 0, 'b'},   {"threads", required_argument, 0, 'j'},
      {"config", required_argument, 0, 'c'},    {"generate", required_argument, 0, 'g'},
      {"read-only", no_argument, 0, 'r'},       {"shard-size", required_argument, 0, 'z'},
      {"tokenizer", required_argument, 0, 'k'}, {"help", no_argument, 0, 'h'},
      {"version", no_argument, 0, 'V'},         {"logits", required_argument, 0, 'l'},
      {"families", no_argument, 0, 'F'},        {0, 0, 0, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'i': import = optarg; break;
    case 'e': export = optarg; break;
    case 'p': preset = optarg; break;
    case 't': tokens = optarg; break;
    case 's': seed = strtoull(optarg, NULL, 0); break;
    case 'd': dtype_s = optarg; break;
    case 'b': backend = optarg; break;
    case 'j': threads = atoi(optarg); break;
    case 'c': config = optarg; break;
    case 'g': gen = atoi(optarg); break;
    case 'r': ronly = 1; break;
    case 'z': shard = strtoull(optarg, NULL, 0); break;
    case 'k': tokenizer = optarg; break;
    case 'l': logits_path = optarg; break;
    case 'h': usage(stdout); return 0;
    case 'V': tz_version_print(stdout, "tz-model-check"); return 0;
    case 'F': {
      char *t = tz_family_table_json();
      if (!t) {
        fprintf(stderr, "tz-model-check: out of memory\n");
        return 1;
      }
      printf("%s\n", t);
      free(t);
      return 0;
    }
    default: usage(stderr); return 2;
    }
  }
  if (!!import + !!preset + !!config != 1 || (import && !tokens && !ronly) ||
      (!import && !export) || gen < 0) {
    usage(stderr);
    return 2;
  }
  struct tz_model_config cfg = {0};
  tz_hf_model *hf = NULL;
  tz_compute *cm = NULL;
  void **blocks = NULL;
  int32_t *tok = NULL;
  int ntok = 0, rc;
  enum tz_dtype dtype;
  struct tz_compute_params cp;
  tz_compute_params_init(&cp);
  cp.n_threads = threads;
  TZ_CHECK_GOTO(tz_dtype_parse(dtype_s, &dtype), rc, out);
  if (import)
    cp.dtype = dtype; /* the backend computes in it (the cpu backend in f32 only) */
  if (import) {
    if (tokens)
      TZ_CHECK_GOTO(parse_tokens(tokens, &tok, &ntok), rc, out);
    TZ_CHECK_GOTO(tz_hf_open(import, &hf), rc, out);
    cfg = *tz_hf_config(hf);
    if (ronly) {
      rc = read_only(hf);
      goto out;
    }
  } else if (config) {
    TZ_CHECK_GOTO(tz_hf_config_read(config, &cfg, NULL), rc, out);
  } else {
    TZ_CHECK_GOTO(tz_model_preset(preset, &cfg), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_create(backend, &cp, &cm), rc, out);
  TZ_CHECK_GOTO(tz_model_blocks_alloc(cm, &cfg, &blocks), rc, out);
  if (import) {
    TZ_CHECK_GOTO(tz_hf_load(hf, cm, blocks), rc, out);
    TZ_CHECK_GOTO(check(cm, &cfg, blocks, tok, ntok, logits_path), rc, out);
    if (gen)
      TZ_CHECK_GOTO(generate(cm, &cfg, tz_hf_info(hf), blocks, tok, ntok, gen), rc, out);
  } else {
    struct tz_hf_export_opts eo;
    tz_hf_export_opts_init(&eo);
    eo.dtype = dtype;
    eo.tokenizer_dir = tokenizer;
    if (shard)
      eo.shard_bytes = shard;
    TZ_CHECK_GOTO(tz_model_blocks_init(cm, &cfg, seed, blocks), rc, out);
    TZ_CHECK_GOTO(tz_hf_export_compute(export, &cfg, &eo, cm, blocks), rc, out);
    printf("exported %s (%llu parameters, %s) to %s\n", preset ? preset : config,
           (unsigned long long)tz_model_n_params(&cfg), tz_dtype_name(dtype), export);
  }
out:
  if (rc < 0)
    fprintf(stderr, "tz-model-check: %s: %s\n", tz_strerror(rc), tz_err_msg());
  tz_model_blocks_free(cm, &cfg, blocks);
  tz_compute_destroy(cm);
  tz_hf_close(hf);
  free(tok);
  return rc < 0 ? 1 : 0;
}
