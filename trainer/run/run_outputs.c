/* What a run writes and guards (trainer/run/run_internal.h): the checkpoint directory claimed
 * and checked before the first step, the outputs checked before it, and the export's fallback
 * when it fails after the last step. */
#define _GNU_SOURCE
#include "trainer/run/run_internal.h"

#include "core/error.h"
#include "core/fence.h"
#include "trainer/checkpoint/resume.h"
#include "trainer/run/export.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- The checkpoint directory, claimed and checked before the first step ---- */

/* Rank 0's verdict on what it alone makes (what), for every rank: the other ranks of its run
 * follow it, failing with a message that points to rank 0's. */
int tz_run_rank0_agree(struct tz_run_state *r, int rc, const char *what) {
  if (r->world == 1)
    return rc;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tz_err_msg());
  float mine = rc < 0 ? 1.0f : 0.0f, sum = 0;
  tz_fence *f = NULL;
  int crc = tz_comm_all_reduce(r->comm, &mine, &sum, 1, TZ_F32, NULL, &f);
  if (crc == 0) {
    crc = tz_fence_wait(f, -1);
    tz_fence_release(f);
  }
  if (rc < 0)
    return tz_err_set(rc, "%s", saved);
  if (crc < 0)
    return crc;
  return sum > 0 ? tz_err_set(TZ_ECOMM, "%s: refused by rank 0 (its message says why)", what) : 0;
}

/* Rank 0's verdict on ckpt_dir for every rank: rank 0 alone holds the lock and writes the
 * directory's shared files (the ranks write their files into the save's directory that rank 0
 * made, so all of them see the same file system), and the other ranks of its run follow it. */
static int ckpt_agree(struct tz_run_state *r, int rc) {
  char what[4200];
  snprintf(what, sizeof what, "--ckpt-dir %s", r->o->ckpt_dir);
  return tz_run_rank0_agree(r, rc, what);
}

/* The flag before the checkpoint layer's message, which starts with the directory. */
static int ckpt_refused(int rc) {
  char why[1024];
  snprintf(why, sizeof why, "%s", tz_err_msg());
  return tz_err_set(rc, "--ckpt-dir %s", why);
}

/* The step the run starts from: the resumed checkpoint's (0 when it cannot be read: the resume
 * itself then fails with its message). */
int64_t tz_run_ckpt_start(const struct tz_run_options *o) {
  int64_t start = 0;
  tz_ckpt_reader *rd = NULL;
  if (o->resume && tz_ckpt_open(o->resume, 0, &rd) == 0)
    start = (int64_t)tz_ckpt_step(rd);
  tz_ckpt_close(rd);
  return start;
}

/* A run that takes no step saves nothing (an export from a checkpoint: --resume DIR --steps 0),
 * so it may read the directory of a run that is going on. */
static int ckpt_saves(const struct tz_run_state *r) {
  return r->o->ckpt_dir && !r->o->plan_only && r->o->steps > tz_run_ckpt_start(r->o);
}

/* Two runs saving into one directory would replace each other's checkpoints: the first to start
 * keeps it until it ends. */
int tz_run_ckpt_claim(struct tz_run_state *r) {
  if (!ckpt_saves(r))
    return 0;
  int rc = r->rank == 0 ? tz_ckpt_claim(r->o->ckpt_dir, &r->lock) : 0;
  return ckpt_agree(r, rc < 0 ? ckpt_refused(rc) : 0);
}

/* The disk space of one save, from what trainer/checkpoint/resume.c's writer puts in each rank
 * file: the config, the state (a JSON text bounded here: its fixed fields and a short entry per
 * block) and each block's param, master, m and v shards, the same size on every rank. */
static uint64_t ckpt_bytes(struct tz_run_state *r) {
  static const int kinds[] = {TZ_PLAN_PARAM, TZ_PLAN_MASTER, TZ_PLAN_M, TZ_PLAN_V};
  const char *const *groups = tz_trainer_group_names(r->tr);
  int nb = 0;
  while (groups[nb])
    nb++;
  int n = 2 + 4 * nb;
  char(*names)[TZ_CKPT_MAX_NAME + 1] = calloc((size_t)n, sizeof *names);
  const char **np = calloc((size_t)n, sizeof *np);
  uint64_t *bytes = calloc((size_t)n, sizeof *bytes), total = 0;
  if (names && np && bytes) {
    snprintf(names[0], sizeof names[0], "config");
    bytes[0] = tz_ckpt_config_bytes(r->cfg);
    snprintf(names[1], sizeof names[1], "state");
    bytes[1] = 256;
    for (int b = 0; b < nb; b++) {
      bytes[1] += 64 + strlen(groups[b]);
      for (int k = 0; k < 4; k++) {
        snprintf(names[2 + 4 * b + k], sizeof names[0], "%s.%s", groups[b],
                 tz_plan_kind_name(kinds[k]));
        bytes[2 + 4 * b + k] = tz_trainer_shard_bytes(r->tr, b, kinds[k]);
      }
    }
    for (int i = 0; i < n; i++)
      np[i] = names[i];
    total = tz_ckpt_bytes(r->world, tz_ckpt_rank_file_bytes(n, np, bytes));
  }
  free(names);
  free(np);
  free(bytes);
  return total;
}

/* How many of this run's checkpoints are on disk at once at most: every save it makes with keep
 * 0 (all kept); else a save is written before the oldest beyond keep goes, so up to keep + 1 with
 * those already in the directory. */
static int ckpt_count(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  int64_t start = tz_run_ckpt_start(o);
  int64_t saves =
      o->save_every && o->steps > start ? o->steps / o->save_every - start / o->save_every : 0;
  if (o->steps > start && (!o->save_every || o->steps % o->save_every))
    saves++; /* the last step's */
  if (o->keep > 0) {
    int have = tz_ckpt_list(o->ckpt_dir, NULL, 0);
    int64_t room = o->keep + 1 - (have > 0 ? have : 0);
    saves = saves < (room > 1 ? room : 1) ? saves : (room > 1 ? room : 1);
  }
  return saves > INT32_MAX ? INT32_MAX : (int)saves;
}

/* A directory that cannot take the run's saves fails it before its first step, not at its first
 * save with the steps lost. */
int tz_run_ckpt_check(struct tz_run_state *r) {
  if (!ckpt_saves(r))
    return 0;
  int rc = 0;
  if (r->rank == 0) {
    uint64_t one = ckpt_bytes(r);
    rc = one ? tz_ckpt_dir_check(r->o->ckpt_dir, one, ckpt_count(r), r->o->ckpt_options)
             : tz_err_set(TZ_ENOMEM, "--ckpt-dir %s: no memory", r->o->ckpt_dir);
    if (rc < 0 && one)
      rc = ckpt_refused(rc);
  }
  return ckpt_agree(r, rc);
}

/* An output file the run will write: absent, or a regular file. A FIFO held the run in its
 * open for good (--metrics before the first step, --trace after the last; SIGTERM restarts the
 * open), a device or a directory would take what was meant for a file: refused by name. */
static int output_file(const char *what, const char *path) {
  struct stat st;
  if (!path || stat(path, &st) != 0 || S_ISREG(st.st_mode))
    return 0;
  const char *kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                     : S_ISDIR(st.st_mode)  ? "a directory"
                     : S_ISSOCK(st.st_mode) ? "a socket"
                                            : "a device";
  return tz_err_set(TZ_EINVAL, "%s %s: %s, not a regular file: give the path of a file to write",
                    what, path, kind);
}

/* What the run writes after its steps (the export, the trace) checked before the first: a place
 * that cannot take it would otherwise be found after every step ran, the training lost without a
 * checkpoint (issue 48). Every rank checks, so that every rank stops with the message. The
 * metrics file and the trace are files of their own (output_file). */
int tz_run_check_outputs(struct tz_run_state *r) {
  const struct tz_run_options *o = r->o;
  if (o->plan_only)
    return 0;
  TZ_CHECK(output_file("--metrics", o->metrics));
  TZ_CHECK(output_file("--trace", o->trace_path));
  if (o->export_dir) {
    /* the tensors in the export's dtype, and a little for config, index and tokenizer files */
    uint64_t bytes = tz_model_n_params(&r->mc) * tz_dtype_size(o->export_dtype) + (16u << 20);
    TZ_CHECK(tz_ckpt_out_check("--export-safetensors", o->export_dir, bytes));
    TZ_CHECK(tz_hf_export_check_dir(o->export_dir));
  }
  if (o->trace_path) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", o->trace_path);
    TZ_CHECK(tz_ckpt_out_check("--trace", dirname(dir), 0));
  }
  return 0;
}

/* The checkpoint the run would resume from now, into buf: "checkpoint DIR/step-N" or why none. */
void tz_run_last_checkpoint(const struct tz_run_state *r, char *buf, size_t len) {
  const struct tz_run_options *o = r->o;
  int64_t saved = r->res->saved;
  const char *root = o->resume && saved == r->res->start ? o->resume : o->ckpt_dir;
  if (saved >= 0 && root)
    snprintf(buf, len, "the last checkpoint %s/step-%08lld is the last finite state", root,
             (long long)saved);
  else
    snprintf(buf, len, "nothing was saved%s", o->ckpt_dir ? " before it" : " (no --ckpt-dir)");
}

/* An export that failed after the steps, every rank told (rank0_agree): the trained state is not
 * lost. Where the last step is in the run's checkpoint the message says how to export from it;
 * else an emergency checkpoint is saved, beside the export (DIR.emergency-ckpt) or, failing that,
 * in the working directory (tz-emergency-ckpt), and the message names it. rc and the export's
 * message are returned either way: the run did not do all it was asked. */
int tz_run_export_failed(struct tz_run_state *r, int rc) {
  const struct tz_run_options *o = r->o;
  char why[2048];
  snprintf(why, sizeof why, "%s", tz_err_msg());
  long long n = (long long)tz_trainer_steps_done(r->tr);
  if (o->ckpt_dir && r->res->saved == n)
    return tz_err_set(rc,
                      "%s; the trained state is in %s (step %lld): export it with --resume %s "
                      "--steps %lld --export-safetensors DIR",
                      why, o->ckpt_dir, n, o->ckpt_dir, n);
  char roots[2][4200];
  size_t dl = strlen(o->export_dir);
  while (dl > 1 && o->export_dir[dl - 1] == '/')
    dl--;
  snprintf(roots[0], sizeof roots[0], "%.*s.emergency-ckpt", (int)dl, o->export_dir);
  snprintf(roots[1], sizeof roots[1], "tz-emergency-ckpt");
  char last[1024] = "";
  for (int i = 0; i < 2; i++) {
    tz_ckpt_lock *lock = NULL;
    int lrc = r->rank == 0 ? tz_ckpt_claim(roots[i], &lock) : 0;
    lrc = tz_run_rank0_agree(r, lrc, roots[i]);
    if (lrc == 0)
      lrc = tz_resume_save(r->tr, r->comm, r->cfg, roots[i], 1);
    tz_ckpt_release(lock);
    if (lrc == 0)
      return tz_err_set(rc,
                        "%s; the trained state is saved in the emergency checkpoint %s (step "
                        "%lld): export it with --resume %s --steps %lld --export-safetensors DIR",
                        why, roots[i], n, roots[i], n);
    snprintf(last, sizeof last, "%s", tz_err_msg());
  }
  return tz_err_set(rc,
                    "%s; no emergency checkpoint could be written either (%s): the training "
                    "is lost",
                    why, last);
}
