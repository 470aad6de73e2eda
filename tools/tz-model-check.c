/* tz-model-check: run the model on given tokens and print the loss and a summary of the logits,
 * to compare with tools/hf_check.py (transformers) on the same weights; or write a freshly
 * initialised model in Hugging Face format.
 *   tz-model-check --import DIR --tokens 1,2,3,...     loss of predicting tokens[1:] from [:-1]
 *   tz-model-check --preset tiny --seed 1 --export DIR [--dtype bf16] */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kernels/compute.h"
#include "trainer/hf.h"
#include "trainer/model.h"
#include "tz_version.h"

static void usage(FILE *fp) {
  fprintf(fp, "usage: tz-model-check --import DIR --tokens T0,T1,... [--backend cpu]"
              " [--threads N]\n"
              "       tz-model-check --preset NAME [--seed S] --export DIR"
              " [--dtype f32|bf16|f16]\n"
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
                 const int32_t *tok, int n) {
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
out:
  tz_model_runner_destroy(r);
  free(logits);
  return rc;
}

int main(int argc, char **argv) {
  const char *import = NULL, *export = NULL, *preset = NULL, *tokens = NULL, *backend = "cpu";
  const char *dtype_s = "f32";
  unsigned long long seed = 1;
  int threads = 0;
  static const struct option opts[] = {{"import", required_argument, 0, 'i'},
                                       {"export", required_argument, 0, 'e'},
                                       {"preset", required_argument, 0, 'p'},
                                       {"tokens", required_argument, 0, 't'},
                                       {"seed", required_argument, 0, 's'},
                                       {"dtype", required_argument, 0, 'd'},
                                       {"backend", required_argument, 0, 'b'},
                                       {"threads", required_argument, 0, 'j'},
                                       {"help", no_argument, 0, 'h'},
                                       {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
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
    case 'h': usage(stdout); return 0;
    case 'V': tz_version_print(stdout, "tz-model-check"); return 0;
    default: usage(stderr); return 2;
    }
  }
  if (!!import == !!preset || (import && !tokens) || (preset && !export)) {
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
  if (import) {
    TZ_CHECK_GOTO(parse_tokens(tokens, &tok, &ntok), rc, out);
    TZ_CHECK_GOTO(tz_hf_open(import, &hf), rc, out);
    cfg = *tz_hf_config(hf);
  } else {
    TZ_CHECK_GOTO(tz_model_preset(preset, &cfg), rc, out);
  }
  TZ_CHECK_GOTO(tz_compute_create(backend, &cp, &cm), rc, out);
  TZ_CHECK_GOTO(tz_model_blocks_alloc(cm, &cfg, &blocks), rc, out);
  if (import) {
    TZ_CHECK_GOTO(tz_hf_load(hf, cm, blocks), rc, out);
    TZ_CHECK_GOTO(check(cm, &cfg, blocks, tok, ntok), rc, out);
  } else {
    TZ_CHECK_GOTO(tz_model_blocks_init(cm, &cfg, seed, blocks), rc, out);
    TZ_CHECK_GOTO(tz_hf_export_compute(export, &cfg, dtype, cm, blocks), rc, out);
    printf("exported %s (%llu parameters, %s) to %s\n", preset,
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
