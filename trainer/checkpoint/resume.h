/* Saving and restoring a trainer's whole state through checkpoints
 * (trainer/checkpoint/checkpoint.h), so that a run stopped after step N and resumed continues with
 * exactly the losses and parameters of a run that never stopped, whatever the placement of either
 * (docs/checkpoints.md, "Resuming with tz-train").
 *
 * What a checkpoint of step N holds, in each rank's file:
 *   "config"                  the effective configuration (tz_config_dump)
 *   "state"                   JSON: step N (the data position: batches are functions of the seed
 *                             and the global step), world, seed, model shape, storage dtype, the
 *                             shard elements of every block; the RNG is the seed itself, since
 *                             initialisation and data order are functions of (seed, index);
 *                             with fp16, "loss_scale": the scaler (tz_loss_scale_state)
 *   "<block>.<kind>"          the rank's shard of block <block> ("embed", "layer0", ..., "head")
 *                             of kind param (storage dtype), master, m, v (fp32), padding included
 * Gradient shards are not saved: they are zero between steps. The pending (folded) update is
 * applied before anything is read.
 *
 * A checkpoint saved at world W loads at any world W': every rank's shard is a slice of the block
 * padded to a multiple of W * TZ_TRAIN_NORM_SEGMENT, laid out flat, so a rank of W' reads the
 * pieces of the W rank files that overlap its own slice (only the first numel elements carry data;
 * the padding is zero at every world size).
 *
 * All three calls are collective: every rank of comm calls them, in the same order. */
#ifndef TZ_TRAINER_RESUME_H
#define TZ_TRAINER_RESUME_H

#include <stdint.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/step/train.h"

/* Saves tr's state as checkpoint tz_trainer_steps_done(tr) under root (created if missing), then
 * keeps the newest `keep` (0: all). cfg is the effective configuration (the one tr was made
 * with). On any rank's failure every rank returns an error (the failing rank's own message; the
 * others' say that a rank failed), the temporary directory is removed and the previous
 * checkpoint and latest are untouched. The message starts "the save of step N failed: ", and
 * rank 0's ends with what a resume can use now (tz_ckpt_describe: latest's checkpoint verified to
 * its checksums, or none, or a newer complete one). */
int tz_resume_save(tz_trainer *tr, tz_comm *comm, const struct tz_config *cfg, const char *root,
                   int keep);
/* The same with the checkpoint layer's options (its test hooks); opt may be NULL. */
int tz_resume_save_with(tz_trainer *tr, tz_comm *comm, const struct tz_config *cfg,
                        const char *root, int keep, const struct tz_ckpt_options *opt);

/* Merges the configuration saved in the checkpoint at path (a root with latest, or a step
 * directory) over c. When the checkpoint's world size differs from `world`, the saved
 * gradient_accumulation_steps is dropped so that tz_config_resolve_batch derives it again from
 * train_batch_size (the global batch, and so the numbers, stay the same). Local: reads rank 0's
 * file. */
int tz_resume_config(const char *path, int world, struct tz_config *c);

/* After the resumed run's configuration c is complete (files, environment, --set, --seed over the
 * checkpoint's): when its seed differs from the one the checkpoint at path was trained with, the
 * checkpoint's wins (c->seed is set back: the data order of a run is a function of its seed and
 * the step, so the resumed run continues the saved one's), unless reseed, which keeps c's (the
 * data order changes from the checkpoint's step on). Either way one warning names both seeds.
 * Local: reads rank 0's file. */
int tz_resume_seed(const char *path, int reseed, struct tz_config *c);

/* Restores tr (freshly created, no step taken, with the model and storage dtype of the
 * checkpoint) from the checkpoint at path, resharding when it was saved at another world size,
 * and sets its steps done to the checkpoint's step (*step, may be NULL). A damaged file fails with
 * the checkpoint layer's message: the file, the section, and the previous intact checkpoint. */
int tz_resume_load(tz_trainer *tr, tz_comm *comm, const char *path, int64_t *step);

/* Whether any rank has a stop request pending, from this rank's (mine: SIGTERM, SIGINT or 0, as
 * trainer/run/signals.h says): *sig gets SIGTERM or SIGINT (SIGTERM when ranks differ), or 0. A
 * signal may reach only some ranks of a job; agreeing once per step, on every rank alike, makes
 * them all stop after the same step. */
int tz_resume_stop_agree(tz_comm *comm, int mine, int *sig);

#endif
