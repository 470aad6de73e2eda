/* Per-tensor weight decay: see decay.h. */
#define _GNU_SOURCE
#include "trainer/step/decay.h"

#include <stdio.h>
#include <string.h>

#include "core/error.h"

static const struct {
  const char *name;
  unsigned bit;
} names[] = {{"bias", TZ_DECAY_BIAS}, {"norm", TZ_DECAY_NORM}, {"embed", TZ_DECAY_EMBED}};
#define N_NAMES ((int)(sizeof names / sizeof names[0]))
#define KEY "tierzero.weight_decay_exclude"

static int bit_of(const char *s, unsigned *bit) {
  for (int i = 0; i < N_NAMES; i++)
    if (strcmp(s, names[i].name) == 0) {
      *bit = names[i].bit;
      return 0;
    }
  return -1;
}

int tz_decay_exclude_parse(const struct tz_config *c, unsigned *out) {
  const struct tz_config_paths *p = &c->tierzero.weight_decay_exclude;
  if (p->n == 0) {
    *out = TZ_DECAY_DEFAULT;
    return 0;
  }
  unsigned set = 0;
  for (int i = 0; i < p->n; i++) {
    unsigned bit = 0;
    if (strcmp(p->path[i], "none") == 0 && p->n == 1)
      break;
    if (bit_of(p->path[i], &bit) < 0)
      return tz_err_set(TZ_ECONFIG,
                        "config: %s: \"%s\" is not one of \"bias\", \"norm\", \"embed\" (a list "
                        "of them), or \"none\" alone (decay every tensor)",
                        KEY, p->path[i]);
    set |= bit;
  }
  *out = set;
  return 0;
}

const char *tz_decay_exclude_name(unsigned exclude, char *buf, size_t len) {
  size_t n = 0;
  buf[0] = 0;
  for (int i = 0; i < N_NAMES; i++)
    if (exclude & names[i].bit)
      n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "," : "", names[i].name);
  if (n == 0)
    snprintf(buf, len, "none");
  return buf;
}

int tz_decay_exclude_from_name(const char *name, unsigned *out) {
  unsigned set = 0;
  if (strcmp(name, "none") != 0)
    for (const char *s = name;;) {
      const char *comma = strchr(s, ',');
      size_t n = comma ? (size_t)(comma - s) : strlen(s);
      char word[16];
      unsigned bit = 0;
      if (n == 0 || n >= sizeof word)
        return tz_err_set(TZ_EINVAL, "decay: \"%s\" is not a list of bias, norm, embed", name);
      memcpy(word, s, n);
      word[n] = 0;
      if (bit_of(word, &bit) < 0)
        return tz_err_set(TZ_EINVAL, "decay: \"%s\" is not a list of bias, norm, embed", name);
      set |= bit;
      if (!comma)
        break;
      s = comma + 1;
    }
  *out = set;
  return 0;
}

int tz_decay_tensor_excluded(enum tz_block_kind kind, int t, unsigned exclude) {
  switch (kind) {
  case TZ_BLOCK_EMBED: return (exclude & TZ_DECAY_EMBED) != 0;
  case TZ_BLOCK_HEAD:
    return t == TZ_H_NORM ? (exclude & TZ_DECAY_NORM) != 0 : (exclude & TZ_DECAY_EMBED) != 0;
  case TZ_BLOCK_LAYER:
  case TZ_BLOCK_MOE:
    switch (t) {
    case TZ_L_ATTN_NORM:
    case TZ_L_MLP_NORM:
    case TZ_L_QNORM:
    case TZ_L_KNORM:
    case TZ_L_ATTN_POST_NORM:
    case TZ_L_MLP_POST_NORM: return (exclude & TZ_DECAY_NORM) != 0;
    case TZ_L_BQ:
    case TZ_L_BK:
    case TZ_L_BV: return (exclude & TZ_DECAY_BIAS) != 0;
    default: return 0;
    }
  }
  return 0;
}

int tz_decay_runs(const struct tz_model_config *cfg, int block, unsigned exclude, uint64_t begin,
                  uint64_t end, struct tz_decay_run runs[TZ_DECAY_MAX_RUNS]) {
  struct tz_block_layout l;
  TZ_CHECK(tz_model_block_layout(cfg, block, &l));
  if (end <= begin)
    return 0;
  /* The tensors by offset (the table's order is not the memory order once biases and q/k norms
   * exist), each owning the elements up to the next one's offset. */
  int order[TZ_L_COUNT], n = 0;
  for (int i = 0; i < l.n; i++) {
    if (l.t[i].numel == 0)
      continue;
    int j = n++;
    while (j > 0 && l.t[order[j - 1]].offset > l.t[i].offset) {
      order[j] = order[j - 1];
      j--;
    }
    order[j] = i;
  }
  int nr = 0;
  for (int k = 0; k < n; k++) {
    uint64_t a = k == 0 ? 0 : l.t[order[k]].offset;
    uint64_t e = k + 1 < n ? l.t[order[k + 1]].offset : UINT64_MAX;
    uint64_t lo = a > begin ? a : begin, hi = e < end ? e : end;
    if (lo >= hi)
      continue;
    int decay = !tz_decay_tensor_excluded(l.kind, order[k], exclude);
    if (nr > 0 && runs[nr - 1].decay == decay) {
      runs[nr - 1].end = hi - begin;
      continue;
    }
    runs[nr++] = (struct tz_decay_run){.begin = lo - begin, .end = hi - begin, .decay = decay};
  }
  if (nr == 0) /* a block without tensors: one run of padding */
    runs[nr++] = (struct tz_decay_run){.begin = 0, .end = end - begin, .decay = 1};
  return nr;
}

int tz_decay_adam(const struct tz_model_config *cfg, int block, unsigned exclude, uint64_t begin,
                  uint64_t n, const struct tz_adam_params *p, tz_decay_adam_fn fn, void *ctx) {
  struct tz_decay_run runs[TZ_DECAY_MAX_RUNS];
  int nr = tz_decay_runs(cfg, block, exclude, begin, begin + n, runs);
  if (nr < 0)
    return nr;
  for (int i = 0; i < nr; i++) {
    struct tz_adam_params q = *p;
    if (!runs[i].decay)
      q.weight_decay = 0.0f;
    TZ_CHECK(fn(ctx, &q, runs[i].begin, runs[i].end - runs[i].begin));
  }
  return 0;
}
