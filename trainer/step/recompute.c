/* tierzero.recompute: see recompute.h. */
#define _GNU_SOURCE
#include "trainer/step/recompute.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define KEY "tierzero.recompute"
/* While a list is parsed: the layer's whole attention part is named ("attn", or no part), which
 * wins over "attn-proj" (its output kept) whatever the order. */
#define WHOLE_ATTN 0x80u

/* One list item: a layer or a range of layers (all of them when absent) and a part (both when
 * absent) into parts[]. */
static int parse_item(const char *item, int n_layer, uint8_t *parts) {
  if (!item[0])
    return tz_err_set(TZ_ECONFIG, "config: %s: an empty item names no layer", KEY);
  const char *dot = strrchr(item, '.'), *part = item;
  unsigned which = TZ_PARTS_ALL | WHOLE_ATTN;
  size_t range_len = strlen(item);
  if (dot) {
    part = dot + 1;
    range_len = (size_t)(dot - item);
  }
  static const struct {
    const char *name;
    unsigned which;
  } named[] = {{"attn", TZ_PART_ATTN | WHOLE_ATTN},
               {"attn-proj", TZ_PART_ATTN | TZ_PART_ATTN_OUT},
               {"mlp", TZ_PART_MLP}};
  size_t n = 0;
  while (n < sizeof named / sizeof named[0] && strcmp(part, named[n].name) != 0)
    n++;
  if (n < sizeof named / sizeof named[0]) {
    which = named[n].which;
    if (!dot)
      range_len = 0;
  } else if (dot) {
    return tz_err_set(TZ_ECONFIG,
                      "config: %s: \"%s\": the part after the dot must be \"attn\", "
                      "\"attn-proj\" or \"mlp\"",
                      KEY, item);
  }
  long first = 0, last = n_layer - 1;
  if (range_len > 0) {
    char range[64];
    if (range_len >= sizeof range)
      return tz_err_set(TZ_ECONFIG, "config: %s: \"%s\" is not a layer range", KEY, item);
    memcpy(range, item, range_len);
    range[range_len] = 0;
    char *end;
    errno = 0;
    first = strtol(range, &end, 10);
    last = first;
    if (end != range && *end == '-') {
      const char *second = end + 1;
      last = strtol(second, &end, 10);
      if (end == second)
        end = (char *)second - 1; /* "3-": not a range */
    }
    if (end == range || *end || errno)
      return tz_err_set(TZ_ECONFIG,
                        "config: %s: \"%s\" is not \"auto\", \"all\", \"none\" or a list item "
                        "(\"LAYER\", \"FIRST-LAST\", either with \".attn\", \".attn-proj\" or "
                        "\".mlp\", or \"attn\", \"attn-proj\" or \"mlp\" alone)",
                        KEY, item);
  }
  if (first < 0 || last < first || last >= n_layer)
    return tz_err_set(TZ_ECONFIG,
                      "config: %s: \"%s\": layers %ld to %ld are not within the "
                      "model's 0 to %d",
                      KEY, item, first, last, n_layer - 1);
  for (long i = first; i <= last; i++)
    parts[i] |= (uint8_t)which;
  return 0;
}

int tz_recompute_parse(const struct tz_config *c, int n_layer, int *mode, uint8_t *parts) {
  const struct tz_config_paths *p = &c->tierzero.recompute;
  memset(parts, TZ_PARTS_ALL, (size_t)n_layer);
  *mode = TZ_RECOMPUTE_AUTO;
  if (p->n == 0)
    return 0;
  static const struct {
    const char *name;
    int mode;
  } whole[] = {{"auto", TZ_RECOMPUTE_AUTO}, {"all", TZ_RECOMPUTE_ALL}, {"none", TZ_RECOMPUTE_NONE}};
  for (size_t w = 0; w < sizeof whole / sizeof whole[0]; w++)
    for (int i = 0; i < p->n; i++)
      if (strcmp(p->path[i], whole[w].name) == 0) {
        if (p->n > 1)
          return tz_err_set(TZ_ECONFIG, "config: %s: \"%s\" stands alone, not in a list", KEY,
                            whole[w].name);
        *mode = whole[w].mode;
        if (*mode == TZ_RECOMPUTE_NONE)
          memset(parts, 0, (size_t)n_layer);
        return 0;
      }
  memset(parts, 0, (size_t)n_layer);
  for (int i = 0; i < p->n; i++)
    TZ_CHECK(parse_item(p->path[i], n_layer, parts));
  for (int i = 0; i < n_layer; i++)
    if (parts[i] & WHOLE_ATTN)
      parts[i] &= (uint8_t) ~(WHOLE_ATTN | TZ_PART_ATTN_OUT);
  *mode = TZ_RECOMPUTE_LIST;
  return 0;
}

uint64_t tz_recompute_kept_bytes(const struct tz_model_config *mc, enum tz_dtype S, int B, int T,
                                 const uint8_t *parts) {
  uint64_t bytes[8];
  for (unsigned k = 0; k < 8; k++)
    bytes[k] = tz_model_acts_kept_bytes(mc, S, B, T, k);
  uint64_t total = 0;
  for (int i = 0; i < mc->n_layer; i++)
    total += bytes[tz_model_parts_kept(parts[i])];
  return total;
}

void tz_recompute_order(const struct tz_model_config *mc, enum tz_dtype S, int B, int T,
                        const double cost[TZ_RECOMPUTE_ITEMS], struct tz_recompute_item *items) {
  /* what each item saves a byte, in the order ties keep (the MLP first, as before the output
   * was an item of its own; the output before the rest of its part, always) */
  unsigned part[TZ_RECOMPUTE_ITEMS] = {TZ_PART_MLP, TZ_PART_ATTN_OUT, TZ_PART_ATTN};
  double out = (double)tz_model_acts_kept_bytes(mc, S, B, T, TZ_PART_ATTN_OUT);
  double attn = (double)tz_model_acts_kept_bytes(mc, S, B, T, TZ_PART_ATTN);
  double per[TZ_RECOMPUTE_ITEMS] = {cost[1] /
                                        (double)tz_model_acts_kept_bytes(mc, S, B, T, TZ_PART_MLP),
                                    (cost[0] - cost[2]) / out, cost[2] / (attn - out)};
  if (per[2] > per[1])
    per[2] = per[1];
  for (int a = 1; a < TZ_RECOMPUTE_ITEMS; a++) /* insertion sort, stable, most first */
    for (int b = a; b > 0 && per[b] > per[b - 1]; b--) {
      double t = per[b];
      per[b] = per[b - 1];
      per[b - 1] = t;
      unsigned u = part[b];
      part[b] = part[b - 1];
      part[b - 1] = u;
    }
  int L = mc->n_layer, n = 0;
  for (int k = 0; k < TZ_RECOMPUTE_ITEMS; k++)
    for (int i = L - 1; i >= 0; i--)
      items[n++] = (struct tz_recompute_item){i, part[k]};
}

void tz_recompute_keep_first(const struct tz_recompute_item *items, int k, int n_layer,
                             uint8_t *parts) {
  memset(parts, TZ_PARTS_ALL, (size_t)n_layer);
  for (int i = 0; i < k; i++) {
    uint8_t *p = &parts[items[i].layer];
    if (items[i].part == TZ_PART_ATTN_OUT) /* kept beside a recomputed attention part */
      *p |= (uint8_t)(*p & TZ_PART_ATTN ? TZ_PART_ATTN_OUT : 0);
    else if (items[i].part == TZ_PART_ATTN) /* the whole part kept, its output with it */
      *p &= (uint8_t) ~(TZ_PART_ATTN | TZ_PART_ATTN_OUT);
    else
      *p &= (uint8_t)~items[i].part;
  }
}

/* The layers that recompute part, as ranges ("0-19, 24"), or "none". */
static size_t ranges(const uint8_t *parts, int n_layer, unsigned part, char *buf, size_t len) {
  size_t n = 0;
  for (int i = 0; i < n_layer;) {
    if (!(parts[i] & part)) {
      i++;
      continue;
    }
    int j = i;
    while (j + 1 < n_layer && (parts[j + 1] & part))
      j++;
    const char *sep = n ? ", " : "";
    if (j > i)
      n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%d-%d", sep, i, j);
    else
      n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%d", sep, i);
    i = j + 1;
  }
  if (n == 0)
    n = (size_t)snprintf(buf, len, "none");
  return n < len ? n : len ? len - 1 : 0;
}

const char *tz_recompute_describe(const uint8_t *parts, int n_layer, char *buf, size_t len) {
  int all = 1, none = 1;
  int out = 0;
  for (int i = 0; i < n_layer; i++) {
    all &= parts[i] == TZ_PARTS_ALL;
    none &= parts[i] == 0;
    out |= (parts[i] & TZ_PART_ATTN) && (parts[i] & TZ_PART_ATTN_OUT);
  }
  if (len == 0)
    return buf;
  if (all || none) {
    snprintf(buf, len, "%s", n_layer == 0 ? "none" : all ? "all" : "none");
    return buf;
  }
  size_t n = (size_t)snprintf(buf, len, "attention in layers ");
  if (n >= len)
    return buf;
  n += ranges(parts, n_layer, TZ_PART_ATTN, buf + n, len - n);
  if (out && n + 1 < len) {
    n += (size_t)snprintf(buf + n, len - n, " (its output kept in ");
    if (n + 1 < len)
      n += ranges(parts, n_layer, TZ_PART_ATTN_OUT, buf + n, len - n);
    if (n + 1 < len)
      n += (size_t)snprintf(buf + n, len - n, ")");
  }
  if (n + 1 < len)
    n += (size_t)snprintf(buf + n, len - n, "; MLP in ");
  if (n + 1 < len)
    ranges(parts, n_layer, TZ_PART_MLP, buf + n, len - n);
  return buf;
}
