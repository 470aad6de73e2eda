/* The effective configuration written as JSON, for metrics and checkpoints. */
#define _GNU_SOURCE
#include "core/config_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void dump_string(FILE *f, const char *s) {
  json_t *j = json_string(s);
  char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
  fputs(t ? t : "null", f);
  free(t);
  json_decref(j);
}

static void dump_value(FILE *f, const struct tz_config *c, const struct key *k) {
  char num[40];
  switch (k->type) {
  case K_BOOL: /* below 0: "auto", a default outside 0/1 (F_AUTO) */
    fputs(get_int(c, k) < 0 ? "\"auto\"" : get_int(c, k) ? "true" : "false", f);
    return;
  case K_ENUM: {
    int v = get_int(c, k);
    if (v >= 0 && v < k->n_names && k->names[v])
      fprintf(f, "\"%s\"", k->names[v]);
    else
      fputs("null", f);
    return;
  }
  case K_INT:
  case K_I64:
  case K_SIZE: {
    int64_t v = k->type == K_INT   ? get_int(c, k)
                : k->type == K_I64 ? *(const int64_t *)cfield(c, k)
                                   : (int64_t) * (const uint64_t *)cfield(c, k);
    /* Out of range is the "not set" default. */
    if ((k->flags & F_AUTO_UNSET) && v == 0 && tz_config_is_auto(c, k->path))
      fputs("\"auto\"", f);
    else if (check_irange(k, v))
      fprintf(f, "%" PRId64, v);
    else
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
    return;
  }
  case K_DOUBLE: {
    double d = *(const double *)cfield(c, k);
    if (!in_drange(k, d)) {
      fputs(k->flags & F_AUTO ? "\"auto\"" : "null", f);
      return;
    }
    tz_config_fmt_num(d, num, sizeof num);
    fputs(num, f);
    return;
  }
  case K_PAIR: {
    const double *d = cfield(c, k);
    tz_config_fmt_num(d[0], num, sizeof num);
    fprintf(f, "[%s, ", num);
    tz_config_fmt_num(d[1], num, sizeof num);
    fprintf(f, "%s]", num);
    return;
  }
  case K_STR: {
    const char *s = *(char *const *)cfield(c, k);
    if (s)
      dump_string(f, s);
    else
      fputs("null", f);
    return;
  }
  case K_PATHS: {
    const struct tz_config_paths *p = cfield(c, k);
    if (p->n == 0) {
      fputs("null", f);
      return;
    }
    fputc('[', f);
    for (int i = 0; i < p->n; i++) {
      if (i)
        fputs(", ", f);
      dump_string(f, p->path[i]);
    }
    fputc(']', f);
    return;
  }
  case K_FIXED: return;
  }
}

/* Splits a path into at most max components of at most 63 characters; returns the count. */
static int split_path(const char *path, char comp[][64], int max) {
  int n = 0;
  for (const char *p = path; *p && n < max; n++) {
    size_t len = strcspn(p, ".");
    snprintf(comp[n], 64, "%.*s", (int)len, p);
    p += len;
    if (*p == '.')
      p++;
  }
  return n;
}

int tz_config_dump(const struct tz_config *c, FILE *f) {
  enum { MAXD = 6 };
  char open[MAXD][64]; /* the sections open now, outermost first */
  int depth = 0;
  fputc('{', f);
  int first = 1;
  for (int i = 0; i < tz_config_n_keys; i++) {
    const struct key *k = &tz_config_keys[i];
    if (k->type == K_FIXED || (k->flags & F_NO_FIELD))
      continue;
    char comp[MAXD + 1][64];
    int n = split_path(k->path, comp, MAXD + 1);
    int common = 0;
    while (common < depth && common < n - 1 && strcmp(open[common], comp[common]) == 0)
      common++;
    for (; depth > common; depth--)
      fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
    for (; depth < n - 1; depth++) {
      fprintf(f, "%s\n%*s\"%s\": {", first ? "" : ",", 2 * depth + 2, "", comp[depth]);
      snprintf(open[depth], sizeof open[depth], "%s", comp[depth]);
      first = 1;
    }
    fprintf(f, "%s\n%*s\"%s\": ", first ? "" : ",", 2 * depth + 2, "", comp[n - 1]);
    dump_value(f, c, k);
    first = 0;
  }
  for (; depth > 0; depth--)
    fprintf(f, "\n%*s}", 2 * (depth - 1) + 2, "");
  fputs("\n}\n", f);
  if (ferror(f))
    return tz_err_errno(errno ? errno : EIO, "config: cannot write the configuration");
  return 0;
}

/* ---- The report at start: "auto" values and keys without effect ---- */

/* Where an "auto" value came from: Hugging Face Trainer's DeepSpeed integration
 * (integrations/deepspeed.py, trainer_config_process and trainer_config_finalize) fills each key
 * from a Trainer argument or from another value; tierzero has no Trainer arguments, so a key that
 * the Trainer fills from one takes tierzero's default, and the report names the argument. */
static const struct {
  const char *path, *rule;
} auto_rules[] = {
    {"train_batch_size", "train_micro_batch_size_per_gpu x gradient_accumulation_steps x world "
                         "size, DeepSpeed's rule, as Hugging Face's Trainer fills it"},
    {"train_micro_batch_size_per_gpu", "train_batch_size / (gradient_accumulation_steps x world "
                                       "size), or 8 when neither is given: Hugging Face's "
                                       "--per_device_train_batch_size default"},
    {"gradient_accumulation_steps", "train_batch_size / (micro-batch x world size), else 1; "
                                    "Hugging Face's Trainer takes --gradient_accumulation_steps"},
    {"gradient_clipping", "Hugging Face's --max_grad_norm default; tz-train --max-grad-norm "
                          "sets it"},
    {"optimizer.params.lr", "Hugging Face's --learning_rate default; tz-train --learning-rate "
                            "sets it"},
    {"optimizer.params.betas", "Hugging Face's --adam_beta1 and --adam_beta2 defaults"},
    {"optimizer.params.eps", "Hugging Face's --adam_epsilon default"},
    {"optimizer.params.weight_decay", "Hugging Face's --weight_decay default; tz-train "
                                      "--weight-decay sets it"},
    {"scheduler.params.warmup_min_lr", "0, as Hugging Face's Trainer sets it"},
    {"scheduler.params.warmup_max_lr", "optimizer.params.lr, as Hugging Face's Trainer sets it"},
    {"scheduler.params.warmup_num_steps", "--warmup-ratio x the run's steps, as Hugging Face's "
                                          "Trainer fills it from --warmup_ratio"},
    {"scheduler.params.total_num_steps", "the run's steps, as Hugging Face's Trainer sets it "
                                         "from --max_steps"},
    {"bf16.enabled", "tierzero's default: off; Hugging Face's Trainer takes --bf16"},
    {"fp16.enabled", "tierzero's default: off; Hugging Face's Trainer takes --fp16"},
};

static const char *auto_rule(const char *path) {
  for (size_t i = 0; i < sizeof auto_rules / sizeof auto_rules[0]; i++)
    if (strcmp(auto_rules[i].path, path) == 0)
      return auto_rules[i].rule;
  return "decided at start; docs/config.md says how";
}

void tz_config_report(const struct tz_config *c, int64_t steps, FILE *out, FILE *err) {
  for (int i = 0; i < tz_config_auto_count(c); i++) {
    const char *path = tz_config_auto_key(c, i);
    const struct key *k = tz_config_find_key(path);
    fprintf(out, "tz-train: config \"auto\": %s = ", path);
    if (strcmp(path, "scheduler.params.total_num_steps") == 0 && steps > 0)
      fprintf(out, "%" PRId64, steps);
    else if (strcmp(path, "scheduler.params.warmup_num_steps") == 0 && steps > 0 &&
             c->scheduler.warmup_num_steps == 0 && c->tierzero.warmup_ratio > 0)
      fprintf(
          out, "%.0f", /* trainer/step/lr.c's */
          ceil(c->tierzero.warmup_ratio *
               (double)(c->scheduler.total_num_steps > 0 ? c->scheduler.total_num_steps : steps)));
    else
      dump_value(out, c, k);
    fprintf(out, " (%s)\n", auto_rule(path));
  }
  int n = tz_config_no_effect_count(c);
  if (n == 0)
    return;
  fprintf(err,
          "tz-train: config key%s set but with no effect in tierzero (accepted for "
          "DeepSpeed compatibility; docs/config.md): ",
          n > 1 ? "s" : "");
  for (int i = 0; i < n; i++)
    fprintf(err, "%s%s", i ? ", " : "", tz_config_no_effect_key(c, i));
  fputc('\n', err);
}
