/* The machine rates the plan's bound is costed with (core/plan.h), measured once with transfers
 * through the tiers and short compute and Adam probes, on a CPU-only machine or on a GPU, and
 * cached in a file so later runs start at once. */
#ifndef TZ_TRAINER_RATES_H
#define TZ_TRAINER_RATES_H

#include <stddef.h>

#include "collectives/comm.h"
#include "core/config.h"
#include "core/plan.h"
#include "core/runtime.h"
#include "kernels/compute.h"
#include "trainer/model/model.h"

/* The default cache file: $XDG_CACHE_HOME/tierzero/rates-<host>.json, else
 * ~/.cache/tierzero/rates-<host>.json. 0, or TZ_ENOENT when neither variable is set. */
int tz_rates_default_path(char *buf, size_t len);

/* Fills *out (collective). Rank 0 reads the cache at path (NULL: the default) when it holds an
 * entry measured for this machine's set-up (the compute backend and the NVMe directory of cfg),
 * else measures, and writes the cache (a failure to write it is only logged):
 * - backend "cpu" (a CPU-only machine, whose compute tier is host memory): copies between two
 *   host tiers in rt (copy_in, copy_out, copy_local; copy_duplex is left 0), the backend's
 *   512^3 matrix multiply, CPU Adam.
 * - backend "cuda": 64 MiB tz_transfer copies between a host tier and an hbm tier in rt on GPU
 *   cfg->tierzero.device (0 when it is -1): host -> hbm (copy_in), hbm -> host (copy_out), both
 *   at once (copy_duplex, the two summed), each beside copies the other way that outlast it
 *   (copy_in_both, copy_out_both), hbm -> hbm (copy_local); the cuda backend's bf16
 *   matrix multiply at 4096^3; GPU Adam over 64M elements in device memory; CPU Adam at the host
 *   homes (adam_home) over 32M elements, bf16 parameters written, on tz_rates_home_threads
 *   threads, as the home phases run it. The host tier lies
 *   on cfg->tierzero.numa_node, else the GPU's node. While it measures, the hbm tier page-locks
 *   every host arena of rt (docs/hbm.md), cheap when rt already has an hbm tier or no large host
 *   tier; it needs about 1.3 GiB free on the GPU. TZ_ENOTSUP in a build without CUDA.
 * Both measure nvme reads, writes, and the two at once (nvme_duplex, summed), 64 MiB each way
 * against a host tier of their own, under cfg's NVMe directory when there is one. The result is
 * broadcast. Then, on a world of GPUs (the cuda backend with the nccl comm), every rank times its
 * own host link at the same time as the others, and copy_in, copy_out, copy_duplex,
 * copy_in_both and copy_out_both become the slowest rank's where that is below the rate alone
 * (not cached; if a rank cannot time its link, a warning, and the rates alone); and every rank
 * times an all-gather for the collective rate (0 on a world of one; on GPUs eight of 64 MiB a
 * rank, issued back to back and waited for together). refresh != 0 measures even when the cache
 * has an entry. */
/* Threads CPU Adam at the host homes runs on beside a GPU: tierzero.threads when set, else every
 * CPU this process may run on but two (left to the thread that launches the GPU's kernels and to
 * the progress engine); at least 1. */
int tz_rates_home_threads(const struct tz_config *cfg);

int tz_rates_get(const struct tz_config *cfg, const char *backend, tz_runtime *rt, tz_comm *comm,
                 const char *path, int refresh, struct tz_plan_rates *out);

/* Drops the cache's entry for this set-up (path NULL: the default cache) and the backend's layer
 * timings (trainer/step/rates_cache.h), so that the next run measures again: a run that came in
 * under its bound shows that the rates were measured slow (docs/training.md "The bound"). 0 when
 * there was nothing to drop or it is dropped. */
int tz_rates_forget(const struct tz_config *cfg, const char *backend, const char *path);

/* Records in the cache's entry for this set-up (path NULL: the default cache) what a run
 * measured: the rate its home phases reached, elements per second (tz_plan_rates.adam_home_run:
 * later plans run the CPU's Adam at the homes at the slower of it and the probe's), and the
 * rate its disk moved reads and writes together over its busy time, bytes per second
 * (nvme_run: later plans cost the disk at the faster of it and the probe's, tz_plan_disk_rates).
 * A rate that is not positive is left as it was. Nothing when the cache holds no complete entry
 * for the set-up (the next run measures anew). 0, or the error writing the file. */
int tz_rates_learn(const struct tz_config *cfg, const char *backend, const char *path,
                   double adam_home_run, double nvme_run);

/* How long timing a layer may take for tz-train --plan, in seconds. */
#define TZ_RATES_PLAN_PROBE_S 3.0

/* The time of one layer's forward and recomputing backward on cm at micro-batch B, sequence T
 * (what the trainer's fwd and bwd phases of a layer take; 4 x tz_model_layer_flop), in
 * *seconds: the fastest of at least TZ_RATES_LAYER_PASSES passes, each timed on its own, after
 * TZ_LAYER_PROBE_WARM_S of untimed ones, and of more while the timed ones have taken less than
 * TZ_RATES_LAYER_MIN_S. The fastest, not the mean: work beside the probe on a busy machine only
 * ever slows a pass, and a mean over disturbed passes gave a bound 6-14 times the step the run
 * then achieved; the fastest pass is the closest to what the machine can do, which a lower bound
 * needs. budget_s > 0 (a plan): when the probe would take longer than budget_s by the estimate
 * from matmul_flops (the matmul probe's rate, which a layer's pass never beats; 0: unknown, no
 * estimate), nothing is timed, *seconds is 0 (the plan then costs compute at the matmul rate, a
 * looser bound) and a warning says how long the probe would take and that --layer-rate gives
 * the rate instead. TZ_ENOMEM and the backend's errors. */
#define TZ_RATES_LAYER_PASSES 5
#define TZ_RATES_LAYER_MIN_S 0.2
int tz_rates_layer_time(tz_compute *cm, const struct tz_model_config *mc, int B, int T,
                        double budget_s, double matmul_flops, double *seconds, double *part_s);
/* part_s (may be NULL; zeros when the layer is not timed): on the same probe, the forward of the
 * layer's attention part and of its MLP part (TZ_PART_ATTN, TZ_PART_MLP) alone, part_s[0] and
 * part_s[1] in seconds, and the attention part's without its op (TZ_PART_ATTN_OUT) part_s[2],
 * the fastest of TZ_RATES_LAYER_PASSES each: what recomputing each costs a backward
 * (tierzero.recompute orders the parts it keeps by it: the attention's kernels run slower per
 * FLOP than the MLP's matrix products). */

#endif
