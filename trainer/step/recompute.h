/* Which parts of which layers the backward recomputes (tierzero.recompute, docs/training.md
 * "Recompute only what memory forces").
 *
 * Each layer has two parts (TZ_PART_ATTN, TZ_PART_MLP, trainer/model/model.h). A kept part's
 * activations stay in the compute tier from the layer's forward to its backward; a recomputed
 * part's are written into the one shared buffer and made again by the backward from the layer's
 * input. A recomputed attention part may keep its op's output (TZ_PART_ATTN_OUT: att and lse),
 * so that only its norm, projections and RoPE run again, not the scores. Each gives the same bits
 * (the same kernels on the same inputs), so the choice moves only memory and time. The key
 * takes:
 *   "auto" (the default): the plan chooses (trainer/step/placement.c): of the parts in the order
 *          tz_recompute_order gives, it keeps the first k, for the k whose bound is least
 *          among those that fit;
 *   "all": every part recomputed (activation checkpointing of every layer, as DeepSpeed and
 *          FSDP run it);
 *   "none": every part kept;
 *   a list of what is recomputed, the rest kept: items "FIRST-LAST", "LAYER", either with
 *          ".attn", ".attn-proj" or ".mlp" for one part, or "attn" / "attn-proj" / "mlp" alone
 *          for that part of every layer; "attn-proj" is the attention part but its op, whose
 *          output is kept ("attn" names the whole part and wins where both name a layer)
 *          (["0-15", "16-31.attn"]: layers 0 to 15 recomputed whole, 16 to 31 keep their MLP;
 *          ["attn-proj", "mlp"]: every layer keeps its attention's output and nothing else). */
#ifndef TZ_TRAINER_RECOMPUTE_H
#define TZ_TRAINER_RECOMPUTE_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "kernels/compute.h"
#include "trainer/model/model.h"

enum tz_recompute_mode {
  TZ_RECOMPUTE_AUTO,
  TZ_RECOMPUTE_ALL,
  TZ_RECOMPUTE_NONE,
  TZ_RECOMPUTE_LIST,
};

/* The key for n_layer layers: *mode, and parts[i], the parts (TZ_PART_*) layer i recomputes
 * (auto: all of them, until the plan chooses). TZ_ECONFIG naming the item that is wrong. */
int tz_recompute_parse(const struct tz_config *c, int n_layer, int *mode, uint8_t *parts);

/* The bytes the kept parts of every layer take in the compute tier (dtype S, B x T tokens). */
uint64_t tz_recompute_kept_bytes(const struct tz_model_config *mc, enum tz_dtype S, int B, int T,
                                 const uint8_t *parts);

/* One part of one layer, in the order auto keeps them. */
struct tz_recompute_item {
  int layer;
  unsigned part;
};

/* The items a layer has: its attention's output, the rest of its attention part, its MLP. */
#define TZ_RECOMPUTE_ITEMS 3

/* The TZ_RECOMPUTE_ITEMS x n_layer items in the order auto keeps them: the one that saves the
 * most per byte kept first, by what recomputing costs (in any unit: the plan gives its timed share
 * of the forward): cost[0] the attention part, cost[1] the MLP's, cost[2] the attention part but
 * its op. An item's part is TZ_PART_ATTN_OUT (keeping the op's output saves cost[0] - cost[2]),
 * TZ_PART_ATTN (the rest of the attention part, cost[2]: never before its layer's output) or
 * TZ_PART_MLP. Every layer has the same shape, so all of one item before any of the next, from the
 * last layer down. */
void tz_recompute_order(const struct tz_model_config *mc, enum tz_dtype S, int B, int T,
                        const double cost[TZ_RECOMPUTE_ITEMS], struct tz_recompute_item *items);

/* parts: every layer recomputes everything but the first k items, which are kept. */
void tz_recompute_keep_first(const struct tz_recompute_item *items, int k, int n_layer,
                             uint8_t *parts);

/* The choice in words, for the plan's report: "all", "none", or which layers recompute which
 * part ("attention in layers 0-19; MLP in none", with "(its output kept in 0-19)" after the
 * attention's layers where some keep it). */
const char *tz_recompute_describe(const uint8_t *parts, int n_layer, char *buf, size_t len);

#endif
