/* What tz-train prints of a run (trainer/run/report.h). */
#include "trainer/run/report.h"
#include "core/plan.h"
#include "core/sched.h"
#include "trainer/step/train.h"
#include "util/size.h"

#include <stdio.h>
#include <string.h>

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
  printf("tz-train: the plan's rates: host link %.1f GB/s in, %.1f out%s%s%s%s\n", r->copy_in / 1e9,
         r->copy_out / 1e9, both, shared ? " (every rank copying)" : "", disk, coll);
  if (r->adam_home_busy > 0 && r->adam_home > 0)
    printf(
        "tz-train: beside each other, the CPU's Adam %.2f G elements/s (%.2f alone) and the host "
        "link %.1f GB/s in, %.1f out (with the CPU's Adam at the homes, the plan takes these)\n",
        r->adam_home_busy / 1e9, r->adam_home / 1e9, r->copy_in_adam / 1e9, r->copy_out_adam / 1e9);
  if (r->adam_home_run > 0)
    printf("tz-train: the CPU's Adam at the homes in the last run on this set-up: %.2f G "
           "elements/s (the plan takes the slower of it and the probe's)\n",
           r->adam_home_run / 1e9);
  if (r->nvme_run > 0)
    printf("tz-train: the disk in the last run on this set-up: %.2f GB/s, reads and writes "
           "together (the plan takes the faster of it and the probe's %.2f)\n",
           r->nvme_run / 1e9, tz_plan_disk_probe_rate(r) / 1e9);
}

/* What the backward recomputes, and with "auto" what keeping the rest saves in the bound. */
static void print_recompute(const tz_trainer *tr) {
  char what[256], kept[32], all[32], bound[32];
  uint64_t bytes = 0;
  double all_s = 0;
  tz_trainer_recompute(tr, what, sizeof what, &bytes, &all_s);
  tz_bytes_format(kept, sizeof kept, (double)bytes, &tz_bytes_plan);
  printf("tz-train: recomputed in backward (tierzero.recompute): %s; activations kept: %s", what,
         kept);
  if (all_s > 0) {
    snprintf(bound, sizeof bound, "%.4g s", tz_trainer_plan(tr)->bound_s);
    snprintf(all, sizeof all, "%.4g s", all_s);
    printf(", bound %s against %s recomputing all", bound, all);
  }
  printf("\n");
}

/* What weight decay applies to, when there is any (docs/config.md, "Weight decay per tensor"). */
static void print_decay(const struct tz_config *cfg) {
  if (cfg->optimizer.weight_decay == 0)
    return;
  const struct tz_config_paths *ex = &cfg->tierzero.weight_decay_exclude;
  char what[128] = "";
  for (int i = 0; i < ex->n; i++)
    snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s", i ? ", " : "", ex->path[i]);
  if (ex->n == 0 || (ex->n == 1 && strcmp(ex->path[0], "none") == 0))
    printf("tz-train: weight decay %g on every tensor (DeepSpeed's one group for a ds_config's "
           "optimizer; tierzero.weight_decay_exclude names what to leave out)\n",
           cfg->optimizer.weight_decay);
  else
    printf("tz-train: weight decay %g on every tensor but: %s (tierzero.weight_decay_exclude; "
           "Hugging Face Trainer's groups are bias and norm)\n",
           cfg->optimizer.weight_decay, what);
}

static void print_setup(const struct tz_run_report *p, const struct tz_run_event *ev) {
  const struct tz_run_options *o = p->run;
  const struct tz_config *cfg = p->cfg;
  const tz_trainer *tr = ev->trainer;
  const char *gpu = tz_trainer_device_name(tr);
  print_decay(cfg);
  for (int i = 0; p->overrides && p->overrides[i]; i++)
    printf("tz-train: %s (over the config files)\n", p->overrides[i]);
  printf("tz-train: model %s (%llu parameters), %s backend%s%s, %d rank%s, micro-batch %lld x "
         "%d tokens, accumulation %lld, optimizer step %s%s\n",
         ev->model_name, (unsigned long long)tz_model_n_params(ev->model), o->backend,
         gpu ? " on " : "", gpu ? gpu : "", ev->world, ev->world > 1 ? "s" : "",
         (long long)cfg->train_micro_batch_size_per_gpu, o->seq,
         (long long)cfg->gradient_accumulation_steps, tz_opt_mode_name(tz_trainer_opt_mode(tr)),
         tz_trainer_overlaps_collectives(tr) ? ", collectives overlapped" : "");
  if (tz_model_moe(ev->model))
    printf("tz-train: experts: %d a layer, %d a token, %llu parameters active a token of the "
           "%llu (every expert's state is placed and streamed; the compute is the active ones')\n",
           ev->model->n_expert, ev->model->n_expert_used,
           (unsigned long long)tz_model_n_active_params(ev->model),
           (unsigned long long)tz_model_n_params(ev->model));
  if (tz_trainer_layer_rate(tr) > 0)
    printf("tz-train: a layer's forward and backward run at %.3g TFLOP/s here (the plan's "
           "compute rate%s; the matmul probe's: %.3g)\n",
           tz_trainer_layer_rate(tr) / 1e12,
           tz_trainer_layer_cached(tr) ? ", cached: --remeasure times it again" : "",
           ev->rates->flops / 1e12);
  print_rates(ev->rates, ev->world > 1 && gpu);
  if (tz_trainer_cpu_adam_searched(tr))
    printf("tz-train: CPU Adam at the host homes for %g of the parameters (the plan's pick, "
           "tierzero.cpu_adam_search%s)\n",
           tz_trainer_cpu_adam(tr), cfg->tierzero.cpu_adam_search < 0 ? " auto" : "");
  if (!tz_trainer_window_carry(tr) && cfg->tierzero.window_carry < 0)
    printf("tz-train: the scheduler's window is a working set in the GPU's free memory: each "
           "step reads the offloaded state from its homes again (tierzero.window_carry auto)\n");
  print_recompute(tr);
  tz_plan_print(stdout, tz_trainer_plan(tr), o->plan_only ? tz_trainer_group_names(tr) : NULL);
  if (!o->plan_only) {
    struct tz_trainer_setup_times st = tz_trainer_setup_times(tr);
    printf("tz-train: set up in %.1f s (rates %.1f s, plan %.1f s, tiers %.1f s, initial shards "
           "%.1f s, scheduler %.1f s)\n",
           ev->setup_s, ev->rates_s, st.plan_s, st.tiers_s, st.shards_s, st.sched_s);
  }
  fflush(stdout);
}

static void print_summary(const struct tz_run_report *p, const struct tz_run_event *ev) {
  const struct tz_sched_stats *st = ev->sched;
  tz_metrics_summary_print(ev->summary, stdout);
  printf("tz-train: %llu phases, %llu fills (%.1f MiB), %llu write-backs (%.1f MiB), %llu hits, "
         "%llu uses in place, %llu evictions (%llu waits for a write-back), stalled %.3f s of "
         "%.3f s computing\n",
         (unsigned long long)st->phases, (unsigned long long)st->fills,
         (double)st->fill_bytes / (1 << 20), (unsigned long long)st->flushes,
         (double)st->flush_bytes / (1 << 20), (unsigned long long)st->hits,
         (unsigned long long)st->in_place, (unsigned long long)st->evictions,
         (unsigned long long)st->flush_waits, st->stall_s, st->compute_s);
  printf("tz-train: copies queued on one direction at most %.1f MiB (tierzero.copy_queue), "
         "%llu waited in line\n",
         (double)st->queue_peak / (1 << 20), (unsigned long long)st->queue_waits);
  double home_s, home_plan_s;
  int home_n = tz_trainer_home_times(ev->trainer, &home_s, &home_plan_s);
  if (home_n > 0 && home_plan_s > 0)
    printf("tz-train: the CPU's Adam at the homes: %.1f ms a step in %d phases, the plan's "
           "%.1f ms (%.2fx)\n",
           1e3 * home_s, home_n, 1e3 * home_plan_s, home_s / home_plan_s);
  else if (home_n > 0)
    printf("tz-train: the CPU's Adam at the homes: %.1f ms a step in %d phases\n", 1e3 * home_s,
           home_n);
  if (ev->home_rate > 0)
    printf("tz-train: the homes' rate after the first step, %.2f G elements/s, is the rates "
           "cache's for the next plan on this set-up%s\n",
           ev->home_rate / 1e9,
           home_plan_s > 0 && home_s > 1.1 * home_plan_s
               ? " (slower than planned: with tierzero.cpu_adam_search its share is picked again)"
               : "");
  if (ev->disk_rate > 0 && ev->rates) {
    double probe = tz_plan_disk_probe_rate(ev->rates);
    printf("tz-train: the disk moved %.2f GB/s (reads and writes together, over its busy time; "
           "the probe's %.2f), the rates cache's for the next plan on this set-up%s\n",
           ev->disk_rate / 1e9, probe / 1e9,
           ev->disk_rate > probe ? " (the plan costs the disk at it)" : "");
  }
  if (p->demo)
    printf("tz-train: demo: loss %.4f at the first step, %.4f at the last (%.2f of the first)\n",
           ev->first_loss, ev->last_loss, ev->last_loss / ev->first_loss);
}

int tz_run_report_event(void *arg, const struct tz_run_event *ev) {
  struct tz_run_report *p = arg;
  const struct tz_run_options *o = p->run;
  if (ev->rank != 0)
    return 0;
  switch (ev->kind) {
  case TZ_RUN_MODEL:
    for (int i = 0; i < tz_config_ignored_count(p->cfg); i++)
      fprintf(stderr, "tz-train: config key %s is not used%s%s%s\n", tz_config_ignored(p->cfg, i),
              tz_config_ignored_hint(p->cfg, i) ? " (did you mean " : "",
              tz_config_ignored_hint(p->cfg, i) ? tz_config_ignored_hint(p->cfg, i) : "",
              tz_config_ignored_hint(p->cfg, i) ? "?)" : "");
    tz_config_report(p->cfg, ev->step, stdout, stderr); /* --epochs resolved */
    break;
  case TZ_RUN_PLANNED: print_setup(p, ev); break;
  case TZ_RUN_IMPORTED: printf("tz-train: parameters from %s\n", o->import_dir); break;
  case TZ_RUN_RESUMED:
    printf("tz-train: resumed from %s at step %lld\n", o->resume, (long long)ev->step);
    break;
  case TZ_RUN_DATA: printf("tz-train: data: %s\n", tz_data_describe(ev->data)); break;
  case TZ_RUN_BEGIN: return tz_display_create(stdout, p->progress, 1, &p->disp);
  case TZ_RUN_STEP: tz_display_step(p->disp, ev->metrics); break;
  case TZ_RUN_CHECKPOINT:
    printf("tz-train: checkpoint %s/step-%08lld saved\n", o->ckpt_dir, (long long)ev->step);
    break;
  case TZ_RUN_EVAL:
    tz_display_message(p->disp, "tz-train: eval loss %.6f (no training steps)", ev->eval_loss);
    break;
  case TZ_RUN_STEPS_END:
    tz_display_destroy(p->disp);
    p->disp = NULL;
    break;
  case TZ_RUN_TRACE:
    printf("tz-train: trace of step %lld (printed as %lld) written to %s\n", (long long)ev->step,
           (long long)ev->step + 1, o->trace_path);
    break;
  case TZ_RUN_EXPORTED:
    printf("tz-train: parameters after %lld steps written to %s (%s)\n", (long long)ev->step,
           o->export_dir, tz_dtype_name(o->export_dtype));
    break;
  case TZ_RUN_SUMMARY: print_summary(p, ev); break;
  case TZ_RUN_ENDED:
    printf("tz-train: ended %.1f s after its last step (checkpoint, export, trace, teardown)\n",
           ev->tail_s);
    break;
  }
  return 0;
}

/* --plan --fit: the bisection's answer (trainer/run/fit.h). */
void tz_run_report_fit(const struct tz_fit_result *r) {
  const char *fit = tz_fit_name(r->what);
  const char *name = r->what == TZ_FIT_MICRO_BATCH ? "micro-batch"
                     : r->what == TZ_FIT_LAYERS    ? "number of layers"
                                                   : "sequence (tokens)";
  if (!r->best)
    printf("tz-train: --fit %s: not even 1 holds: %s\n", fit, r->why);
  else if (!r->refused)
    printf("tz-train: --fit %s: the largest %s this machine holds is at least %lld (the "
           "search's limit; %d plans); its bound %.4g s per step%s\n",
           fit, name, (long long)r->best, r->plans, r->bound_s,
           r->unknown_rates ? " [some rates unknown: counted as free]" : "");
  else
    printf("tz-train: --fit %s: the largest %s this machine holds is %lld (%d plans); its bound "
           "%.4g s per step%s; %lld does not fit: %s\n",
           fit, name, (long long)r->best, r->plans, r->bound_s,
           r->unknown_rates ? " [some rates unknown: counted as free]" : "", (long long)r->refused,
           r->why);
  if (r->what == TZ_FIT_SEQ && r->best > r->model_max)
    printf("tz-train: --fit seq: beyond the model's max_position_embeddings %lld, which a run "
           "refuses (a config.json with it raised, and RoPE scaling for it, trains longer)\n",
           (long long)r->model_max);
}
