/* Trainer state through checkpoints: see resume.h. */
#define _GNU_SOURCE
#include "trainer/checkpoint/resume.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fence.h"
#include "core/log.h"
#include "core/plan.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/step/decay.h"
#include "trainer/model/model.h"

#include <stddef.h>

/* The kinds a checkpoint holds; grad is zero between steps. */
static const int saved_kinds[] = {TZ_PLAN_PARAM, TZ_PLAN_MASTER, TZ_PLAN_M, TZ_PLAN_V};
#define N_SAVED ((int)(sizeof saved_kinds / sizeof saved_kinds[0]))

static int n_blocks(const tz_trainer *tr) {
  const char *const *names = tz_trainer_group_names(tr);
  int n = 0;
  while (names[n])
    n++;
  return n;
}

static void section_name(const tz_trainer *tr, int block, int kind, char *out, size_t len) {
  snprintf(out, len, "%s.%s", tz_trainer_group_names(tr)[block], tz_plan_kind_name(kind));
}

/* Every rank learns whether any rank failed: the sum over ranks of a failure flag. A rank whose
 * own rc is 0 gets TZ_ECOMM when another failed; a failing rank keeps its own rc and message. */
static int agree(tz_comm *comm, int rc, const char *what) {
  if (tz_comm_size(comm) == 1)
    return rc;
  char saved[1024];
  snprintf(saved, sizeof saved, "%s", tz_err_msg());
  float mine = rc < 0 ? 1.0f : 0.0f, sum = 0;
  tz_fence *f = NULL;
  int crc = tz_comm_all_reduce(comm, &mine, &sum, 1, TZ_F32, NULL, &f);
  if (crc == 0) {
    crc = tz_fence_wait(f, -1);
    tz_fence_release(f);
  }
  if (crc < 0)
    return rc < 0 ? tz_err_set(rc, "%s", saved) : crc;
  if (rc < 0)
    return tz_err_set(rc, "%s", saved);
  if (sum > 0)
    return tz_err_set(TZ_ECOMM, "%s: %g other rank(s) failed (their messages say why)", what,
                      (double)sum);
  return 0;
}

/* The model record of the state (version 2): every field of struct tz_model_config, the family by
 * name, head_dim as the model uses it (tz_model_head_dim). A resume compares the fields that
 * change what the saved state means (compared 1): not the initialisation (the state replaces it),
 * max_seq (a bound on the sequence, no weight depends on it) or the token ids (the export's). */
enum { F_INT, F_DBL, F_FAMILY, F_HALF_D /* head_dim / 2 doubles, saved when longrope's */ };
/* clang-format off */
#define MF(f, t) {#f, t, offsetof(struct tz_model_config, f), 1}
#define MF_INFO(f, t) {#f, t, offsetof(struct tz_model_config, f), 0}
/* clang-format on */
static const struct {
  const char *name;
  int type;
  size_t off;
  int compared;
} model_fields[] = {
    MF(d_model, F_INT),
    MF(n_layer, F_INT),
    MF(n_head, F_INT),
    MF(n_kv_head, F_INT),
    MF(ffn_dim, F_INT),
    MF(vocab, F_INT),
    MF_INFO(max_seq, F_INT),
    MF(rope_theta, F_DBL),
    MF(norm_eps, F_DBL),
    MF(tie_embeddings, F_INT),
    MF(head_dim, F_INT),
    MF(family, F_FAMILY),
    MF(qkv_bias, F_INT),
    MF(qk_norm, F_INT),
    MF(rope_type, F_INT),
    MF(rope_factor, F_DBL),
    MF(rope_low_freq_factor, F_DBL),
    MF(rope_high_freq_factor, F_DBL),
    MF(rope_original_max_pos, F_INT),
    MF_INFO(init_std, F_DBL),
    MF_INFO(has_bos, F_INT),
    MF_INFO(has_eos, F_INT),
    MF_INFO(has_pad, F_INT),
    MF_INFO(bos_id, F_INT),
    MF_INFO(eos_id, F_INT),
    MF_INFO(pad_id, F_INT),
    /* later fields: a checkpoint without them is not compared on them (check_model) */
    MF(norm_offset, F_INT),
    MF(glu_act, F_INT),
    MF(embed_scale, F_INT),
    MF(attn_scale, F_DBL),
    MF(attn_softcap, F_DBL),
    MF(final_softcap, F_DBL),
    MF(sliding_window, F_INT),
    MF(window_pattern, F_INT),
    MF(window_from, F_INT),
    MF(rope_local_theta, F_DBL),
    MF(rope_beta_fast, F_DBL),
    MF(rope_beta_slow, F_DBL),
    MF(rope_truncate, F_INT),
    MF(rope_attn_factor, F_DBL),
    MF(rope_rot, F_INT),
    MF(rope_short_factor, F_HALF_D),
    MF(rope_long_factor, F_HALF_D),
    MF(n_expert, F_INT),
    MF(n_expert_used, F_INT),
    MF(moe_ffn_dim, F_INT),
    MF(norm_topk, F_INT),
    MF(router_aux_coef, F_DBL),
    MF(moe_aux, F_INT),
    MF(shared_ffn_dim, F_INT),
};
#undef MF
#undef MF_INFO
#define N_MODEL_FIELDS ((int)(sizeof model_fields / sizeof model_fields[0]))
_Static_assert(sizeof(enum tz_model_family) == sizeof(int), "family stored as int");

static const void *model_field(const struct tz_model_config *mc, int i) {
  return (const char *)mc + model_fields[i].off;
}

static json_t *model_json(const struct tz_model_config *cfg) {
  struct tz_model_config m = *cfg;
  const struct tz_model_config *mc = &m;
  m.head_dim = tz_model_head_dim(cfg);
  json_t *o = json_object();
  for (int i = 0; o && i < N_MODEL_FIELDS; i++) {
    const void *p = model_field(mc, i);
    const char *fam = NULL;
    switch (model_fields[i].type) {
    case F_INT: json_object_set_new(o, model_fields[i].name, json_integer(*(const int *)p)); break;
    case F_DBL: json_object_set_new(o, model_fields[i].name, json_real(*(const double *)p)); break;
    case F_HALF_D: /* an array only for longrope: the field is absent otherwise (not compared) */
      if (mc->rope_type == TZ_ROPE_LONGROPE) {
        json_t *a = json_array();
        for (int k = 0; k < tz_model_head_dim(mc) / 2; k++)
          json_array_append_new(a, json_real(((const double *)p)[k]));
        json_object_set_new(o, model_fields[i].name, a);
      }
      break;
    case F_FAMILY:
      fam = tz_model_family_name(*(const enum tz_model_family *)p);
      json_object_set_new(o, model_fields[i].name, fam ? json_string(fam) : json_null());
      break;
    }
  }
  return o;
}

/* A field's value as text, for messages. */
static void field_text(const json_t *v, char *buf, size_t len) {
  if (json_is_integer(v))
    snprintf(buf, len, "%lld", (long long)json_integer_value(v));
  else if (json_is_number(v)) /* the shortest text that reads back as the same double */
    for (int digits = 15; digits <= 17; digits++) {
      snprintf(buf, len, "%.*g", digits, json_number_value(v));
      if (strtod(buf, NULL) == json_number_value(v))
        break;
    }
  else if (json_is_string(v))
    snprintf(buf, len, "\"%s\"", json_string_value(v));
  else
    snprintf(buf, len, "(missing)");
}

/* The checkpoint's model record m against the run's model mc: the first field that differs, by
 * name, with both values. */
static int check_model(tz_ckpt_reader *r, json_t *m, const struct tz_model_config *mc) {
  if (!json_is_object(m))
    return tz_err_set(TZ_EFORMAT,
                      "resume: %s: section \"state\" of a version %d checkpoint lacks the model",
                      tz_ckpt_dir(r), tz_ckpt_version(r));
  json_t *mine = model_json(mc);
  if (!mine)
    return tz_err_set(TZ_ENOMEM, "resume: no memory");
  int rc = 0;
  for (int i = 0; i < N_MODEL_FIELDS && rc == 0; i++) {
    if (!model_fields[i].compared)
      continue;
    json_t *a = json_object_get(m, model_fields[i].name),
           *b = json_object_get(mine, model_fields[i].name);
    /* A field the checkpoint lacks came after it: its run computed what the field says now
     * (Gemma's fields were 0 then; a Mistral window, now every layer's, was refused at longer
     * sequences, and at shorter ones is none). */
    int same =
        !a || (json_is_number(a) && json_is_number(b) ? json_number_value(a) == json_number_value(b)
                                                      : json_equal(a, b));
    if (!same) {
      char va[64], vb[64];
      field_text(a, va, sizeof va);
      field_text(b, vb, sizeof vb);
      rc = tz_err_set(TZ_ECONFIG,
                      "resume: %s: the checkpoint's model has %s %s, this run's %s: resume with "
                      "the model it was saved with (--model, tierzero.model or "
                      "--import-safetensors)",
                      tz_ckpt_dir(r), model_fields[i].name, va, vb);
    }
  }
  json_decref(mine);
  return rc;
}

/* The weight-decay exclusion the checkpoint's run used (name: its record; NULL: a version 1
 * checkpoint, whose run decayed every tensor) against this run's: the same update, or refused
 * naming both. Without weight decay the exclusion changes nothing. */
static int check_decay(tz_ckpt_reader *r, const char *name, const tz_trainer *tr) {
  const struct tz_config *c = tz_trainer_config(tr);
  unsigned mine = 0, theirs = 0;
  char a[64], b[64];
  TZ_CHECK(tz_decay_exclude_parse(c, &mine));
  if (!name) {
    if (mine && c->optimizer.weight_decay != 0)
      tz_log(TZ_LOG_WARN,
             "resume: %s is a version %d checkpoint, whose run decayed every tensor; this run "
             "excludes %s from weight decay (tierzero.weight_decay_exclude \"none\" continues as "
             "it was)",
             tz_ckpt_dir(r), tz_ckpt_version(r), tz_decay_exclude_name(mine, a, sizeof a));
    return 0;
  }
  if (tz_decay_exclude_from_name(name, &theirs) < 0)
    return tz_err_set(TZ_EFORMAT,
                      "resume: %s: section \"state\": weight_decay_exclude \"%s\" is not a list "
                      "of bias, norm, embed",
                      tz_ckpt_dir(r), name);
  if (theirs != mine && c->optimizer.weight_decay != 0)
    return tz_err_set(TZ_ECONFIG,
                      "resume: %s was trained with tierzero.weight_decay_exclude \"%s\", this run "
                      "has \"%s\": set it to \"%s\" to continue that run (or start a new one)",
                      tz_ckpt_dir(r), tz_decay_exclude_name(theirs, a, sizeof a),
                      tz_decay_exclude_name(mine, b, sizeof b), a);
  return 0;
}

static int put_state(tz_ckpt_writer *w, tz_trainer *tr, const struct tz_config *cfg, int world,
                     int version) {
  int nb = n_blocks(tr);
  json_t *o = json_object(), *blocks = json_array();
  int rc = 0;
  if (!o || !blocks) {
    json_decref(o);
    json_decref(blocks);
    return tz_err_set(TZ_ENOMEM, "resume: no memory");
  }
  json_object_set_new(o, "step", json_integer(tz_trainer_steps_done(tr)));
  json_object_set_new(o, "world", json_integer(world));
  json_object_set_new(o, "seed", json_integer(cfg->seed));
  if (version >= 2) {
    unsigned ex = 0;
    char name[64];
    if ((rc = tz_decay_exclude_parse(tz_trainer_config(tr), &ex)) < 0) {
      json_decref(o);
      json_decref(blocks);
      return rc;
    }
    json_object_set_new(o, "model", model_json(tz_trainer_model(tr)));
    json_object_set_new(o, "weight_decay_exclude",
                        json_string(tz_decay_exclude_name(ex, name, sizeof name)));
  }
  struct tz_loss_scale_state ls;
  tz_trainer_loss_scale_get(tr, &ls);
  if (ls.scale > 0) { /* fp16 */
    json_t *l = json_object();
    json_object_set_new(l, "scale", json_real(ls.scale));
    json_object_set_new(l, "hysteresis_left", json_integer(ls.hysteresis_left));
    json_object_set_new(l, "iter", json_integer(ls.scale_iter));
    json_object_set_new(l, "last_overflow_iter", json_integer(ls.last_overflow_iter));
    json_object_set_new(l, "skipped", json_integer(ls.skipped));
    json_object_set_new(o, "loss_scale", l);
  }
  for (int b = 0; b < nb; b++) {
    json_t *e = json_object();
    json_object_set_new(e, "name", json_string(tz_trainer_group_names(tr)[b]));
    json_object_set_new(
        e, "shard", json_integer((json_int_t)tz_trainer_shard_bytes(tr, b, TZ_PLAN_MASTER) / 4));
    json_object_set_new(e, "param_bytes",
                        json_integer((json_int_t)tz_trainer_shard_bytes(tr, b, TZ_PLAN_PARAM)));
    json_array_append_new(blocks, e);
  }
  json_object_set_new(o, "blocks", blocks);
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!s)
    return tz_err_set(TZ_ENOMEM, "resume: no memory");
  rc = tz_ckpt_put_json(w, "state", s);
  free(s);
  return rc;
}

/* This rank's file: config, state, then every saved shard, each loaded from wherever it lives. */
static int write_rank(tz_ckpt_writer *w, tz_trainer *tr, const struct tz_config *cfg, int world,
                      int version) {
  TZ_CHECK(tz_ckpt_put_config(w, cfg));
  TZ_CHECK(put_state(w, tr, cfg, world, version));
  int nb = n_blocks(tr);
  uint64_t max = 0;
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < N_SAVED; i++)
      if (tz_trainer_shard_bytes(tr, b, saved_kinds[i]) > max)
        max = tz_trainer_shard_bytes(tr, b, saved_kinds[i]);
  void *buf = malloc(max ? max : 1);
  if (!buf)
    return tz_err_set(TZ_ENOMEM, "resume: no memory for a shard of %llu bytes",
                      (unsigned long long)max);
  int rc = 0;
  for (int b = 0; b < nb && rc == 0; b++)
    for (int i = 0; i < N_SAVED && rc == 0; i++) {
      char name[TZ_CKPT_MAX_NAME + 1];
      section_name(tr, b, saved_kinds[i], name, sizeof name);
      rc = tz_trainer_shard_load(tr, b, saved_kinds[i], buf);
      if (rc == 0)
        rc = tz_ckpt_put(w, name, buf, tz_trainer_shard_bytes(tr, b, saved_kinds[i]));
    }
  free(buf);
  return rc;
}

int tz_resume_save(tz_trainer *tr, tz_comm *comm, const struct tz_config *cfg, const char *root,
                   int keep) {
  return tz_resume_save_with(tr, comm, cfg, root, keep, NULL);
}

int tz_resume_save_with(tz_trainer *tr, tz_comm *comm, const struct tz_config *cfg,
                        const char *root, int keep, const struct tz_ckpt_options *opt) {
  int rank = tz_comm_rank(comm), world = tz_comm_size(comm);
  uint64_t step = (uint64_t)tz_trainer_steps_done(tr);
  /* Applies the pending update on every rank alike (collective). */
  int rc = agree(comm, tz_trainer_sync(tr), "resume: save");
  if (rc < 0)
    return rc;
  tz_ckpt_writer *w = NULL;
  if (rank == 0)
    rc = tz_ckpt_begin(root, step, rank, world, opt, &w);
  rc = agree(comm, rc, "resume: save");
  if (rc == 0 && rank != 0)
    rc = tz_ckpt_begin(root, step, rank, world, opt, &w);
  if (rc == 0)
    rc = write_rank(w, tr, cfg, world, tz_ckpt_options_version(opt));
  if (rc == 0) {
    rc = tz_ckpt_commit(w); /* frees w either way */
    w = NULL;
  }
  tz_ckpt_writer_destroy(w);
  rc = agree(comm, rc, "resume: save");
  if (rc == 0 && rank == 0)
    rc = tz_ckpt_finalize(root, step, world, keep, opt);
  else if (rc < 0 && rank == 0) {
    char saved[1024];
    snprintf(saved, sizeof saved, "%s", tz_err_msg());
    if (tz_ckpt_abandon(root, step, opt) < 0)
      tz_log(TZ_LOG_WARN, "resume: %s", tz_err_msg());
    tz_err_set(rc, "%s", saved);
  }
  /* finalize failed on rank 0 only: the others must fail too. */
  rc = agree(comm, rc, "resume: save");
  if (rc < 0) { /* which save, and (rank 0, which writes root's shared files) what is left */
    char saved[1024], left[2048] = "";
    snprintf(saved, sizeof saved, "%s", tz_err_msg());
    if (rank == 0)
      tz_ckpt_describe(root, left, sizeof left);
    tz_err_set(rc, "the save of step %llu failed: %s%s%s", (unsigned long long)step, saved,
               rank == 0 ? "; " : "", left);
  }
  return rc;
}

int tz_resume_config(const char *path, int world, struct tz_config *c) {
  tz_ckpt_reader *r = NULL;
  TZ_CHECK(tz_ckpt_open(path, 0, &r));
  int rc = tz_ckpt_get_config(r, c);
  if (rc == 0 && tz_ckpt_world(r) != world && c->train_batch_size > 0)
    c->gradient_accumulation_steps = 0;
  tz_ckpt_close(r);
  return rc;
}

int tz_resume_seed(const char *path, int reseed, struct tz_config *c) {
  tz_ckpt_reader *r = NULL;
  char *s = NULL;
  TZ_CHECK(tz_ckpt_open(path, 0, &r));
  int rc = tz_ckpt_get_json(r, "state", &s);
  json_t *o = rc == 0 ? json_loads(s, 0, NULL) : NULL;
  json_t *seed = json_object_get(o, "seed");
  if (rc == 0 && !json_is_integer(seed))
    rc = tz_err_set(TZ_EFORMAT, "resume: %s: section \"state\" lacks the seed", tz_ckpt_dir(r));
  if (rc == 0 && json_integer_value(seed) != c->seed) {
    long long saved = (long long)json_integer_value(seed), asked = (long long)c->seed;
    unsigned long long step = (unsigned long long)tz_ckpt_step(r);
    if (reseed) {
      TZ_WARN("resume: --reseed: seed %lld instead of the checkpoint's seed %lld from step %llu on "
              "(%s): the data order differs from that of the run saved there",
              asked, saved, step + 1, tz_ckpt_dir(r));
    } else {
      char buf[32];
      snprintf(buf, sizeof buf, "%lld", saved);
      rc = tz_config_set(c, "seed", buf);
      if (rc == 0)
        TZ_WARN("resume: the configuration asks for seed %lld, the checkpoint %s was trained with "
                "seed %lld: seed %lld is kept, so the data order continues that run's (--reseed "
                "takes seed %lld from step %llu on)",
                asked, tz_ckpt_dir(r), saved, saved, asked, step + 1);
    }
  }
  json_decref(o);
  free(s);
  tz_ckpt_close(r);
  return rc;
}

/* Reshards one section: the target's slice [lo, lo + n) elements of es bytes of the flat padded
 * block, from the source ranks' slices [j * src, (j + 1) * src). */
struct piece {
  unsigned char *dst;
  uint64_t lo, n, es; /* the target slice, in elements */
  uint64_t base;      /* the source slice's first element */
};

static int sink(void *ctx, const void *data, uint64_t off, uint64_t n) {
  struct piece *p = ctx;
  uint64_t a = p->base * p->es + off, e = a + n; /* bytes of the flat block */
  uint64_t ta = p->lo * p->es, te = (p->lo + p->n) * p->es;
  uint64_t s = a > ta ? a : ta, t = e < te ? e : te;
  if (s < t)
    memcpy(p->dst + (s - ta), (const unsigned char *)data + (s - a), t - s);
  return 0;
}

/* The "loss_scale" object of the state (fp16 runs): *ls all zero when absent. */
static int read_loss_scale(tz_ckpt_reader *r, json_t *o, struct tz_loss_scale_state *ls) {
  memset(ls, 0, sizeof *ls);
  json_t *l = json_object_get(o, "loss_scale");
  if (!l)
    return 0;
  json_t *sc = json_object_get(l, "scale"), *h = json_object_get(l, "hysteresis_left"),
         *it = json_object_get(l, "iter"), *lo = json_object_get(l, "last_overflow_iter"),
         *sk = json_object_get(l, "skipped");
  if (!json_is_number(sc) || !json_is_integer(h) || !json_is_integer(it) || !json_is_integer(lo) ||
      !json_is_integer(sk))
    return tz_err_set(TZ_EFORMAT,
                      "resume: %s: section \"state\": loss_scale needs scale, hysteresis_left, "
                      "iter, last_overflow_iter and skipped",
                      tz_ckpt_dir(r));
  ls->scale = json_number_value(sc);
  ls->hysteresis_left = (int)json_integer_value(h);
  ls->scale_iter = json_integer_value(it);
  ls->last_overflow_iter = json_integer_value(lo);
  ls->skipped = json_integer_value(sk);
  return 0;
}

/* The state of r's checkpoint: step, world and the scaler; from version 2 on, its model and
 * weight-decay exclusion checked against tr's. */
static int read_state(tz_ckpt_reader *r, const tz_trainer *tr, int64_t *step, int *world,
                      struct tz_loss_scale_state *ls) {
  char *s = NULL;
  TZ_CHECK(tz_ckpt_get_json(r, "state", &s));
  json_error_t err;
  json_t *o = json_loads(s, 0, &err);
  free(s);
  if (!o || !json_is_integer(json_object_get(o, "step")) ||
      !json_is_integer(json_object_get(o, "world"))) {
    json_decref(o);
    return tz_err_set(TZ_EFORMAT, "resume: %s: section \"state\" lacks step or world",
                      tz_ckpt_dir(r));
  }
  *step = json_integer_value(json_object_get(o, "step"));
  *world = (int)json_integer_value(json_object_get(o, "world"));
  int rc = read_loss_scale(r, o, ls);
  if (rc == 0 && tz_ckpt_version(r) >= 2)
    rc = check_model(r, json_object_get(o, "model"), tz_trainer_model(tr));
  if (rc == 0) {
    json_t *d = json_object_get(o, "weight_decay_exclude");
    if (tz_ckpt_version(r) >= 2 && !json_is_string(d))
      rc = tz_err_set(TZ_EFORMAT,
                      "resume: %s: section \"state\" of a version %d checkpoint lacks "
                      "weight_decay_exclude",
                      tz_ckpt_dir(r), tz_ckpt_version(r));
    else
      rc = check_decay(r, json_is_string(d) ? json_string_value(d) : NULL, tr);
  }
  json_decref(o);
  return rc;
}

/* Block b's kind-k shard of this rank, bytes into buf, gathered from the pieces of the src_world
 * rank files rs (of checkpoint directory dir) that overlap it: a checkpoint saved at another
 * world size. */
static int load_resharded(tz_trainer *tr, tz_ckpt_reader **rs, const char *dir, int src_world,
                          int rank, int b, int k, void *buf, uint64_t bytes) {
  char name[TZ_CKPT_MAX_NAME + 1];
  uint64_t n = tz_trainer_shard_bytes(tr, b, TZ_PLAN_MASTER) / 4, es = bytes / n, sb = 0;
  uint64_t src_bytes = 0, src_master = 0;
  section_name(tr, b, k, name, sizeof name);
  TZ_CHECK(tz_ckpt_size(rs[0], name, &src_bytes));
  section_name(tr, b, TZ_PLAN_MASTER, name, sizeof name);
  TZ_CHECK(tz_ckpt_size(rs[0], name, &src_master));
  section_name(tr, b, k, name, sizeof name);
  sb = src_master / 4; /* the source shard, in elements */
  if (sb == 0 || src_bytes != sb * es)
    return tz_err_set(TZ_EINVAL,
                      "resume: %s: section \"%s\" holds %llu bytes for a shard of %llu "
                      "elements of %llu bytes: another model or storage dtype",
                      dir, name, (unsigned long long)src_bytes, (unsigned long long)sb,
                      (unsigned long long)es);
  memset(buf, 0, bytes);
  struct piece p = {.dst = buf, .lo = (uint64_t)rank * n, .n = n, .es = es};
  for (int j = 0; j < src_world; j++) {
    uint64_t a = (uint64_t)j * sb, e = a + sb;
    if (e <= p.lo || a >= p.lo + p.n)
      continue;
    uint64_t got = 0;
    TZ_CHECK(tz_ckpt_size(rs[j], name, &got));
    if (got != src_bytes)
      return tz_err_set(TZ_EFORMAT,
                        "resume: %s: section \"%s\" of rank %d holds %llu bytes, "
                        "rank 0's %llu",
                        dir, name, j, (unsigned long long)got, (unsigned long long)src_bytes);
    p.base = a;
    TZ_CHECK(tz_ckpt_get_stream(rs[j], name, sink, &p));
  }
  return 0;
}

static int load_rank(tz_trainer *tr, tz_comm *comm, const char *path, int64_t *step) {
  int rank = tz_comm_rank(comm), world = tz_comm_size(comm);
  tz_ckpt_reader *r0 = NULL, **rs = NULL;
  void *buf = NULL;
  int rc = 0, src_world = 0;
  struct tz_loss_scale_state ls;
  TZ_CHECK(tz_ckpt_open(path, 0, &r0));
  TZ_CHECK_GOTO(read_state(r0, tr, step, &src_world, &ls), rc, out);
  if (src_world != tz_ckpt_world(r0)) {
    rc = tz_err_set(TZ_EFORMAT, "resume: %s: state says world %d, the manifest %d", tz_ckpt_dir(r0),
                    src_world, tz_ckpt_world(r0));
    goto out;
  }
  if ((uint64_t)*step != tz_ckpt_step(r0)) {
    rc = tz_err_set(TZ_EFORMAT, "resume: %s: state says step %lld, the manifest %llu",
                    tz_ckpt_dir(r0), (long long)*step, (unsigned long long)tz_ckpt_step(r0));
    goto out;
  }
  /* The same path may be a root whose latest moves; every reader takes the step directory. */
  rs = calloc((size_t)src_world, sizeof *rs);
  if (!rs) {
    rc = tz_err_set(TZ_ENOMEM, "resume: no memory");
    goto out;
  }
  if (src_world == world) {
    TZ_CHECK_GOTO(tz_ckpt_open(tz_ckpt_dir(r0), rank, &rs[rank]), rc, out);
  } else {
    for (int j = 0; j < src_world; j++)
      TZ_CHECK_GOTO(tz_ckpt_open(tz_ckpt_dir(r0), j, &rs[j]), rc, out);
  }
  int nb = n_blocks(tr);
  /* config, state and the shards: a checkpoint of another model has other sections. */
  if (tz_ckpt_count(r0) != 2 + nb * N_SAVED) {
    rc = tz_err_set(TZ_EINVAL, "resume: %s holds %d sections, this model needs %d: another model",
                    tz_ckpt_dir(r0), tz_ckpt_count(r0), 2 + nb * N_SAVED);
    goto out;
  }
  uint64_t max = 0;
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < N_SAVED; i++)
      if (tz_trainer_shard_bytes(tr, b, saved_kinds[i]) > max)
        max = tz_trainer_shard_bytes(tr, b, saved_kinds[i]);
  buf = malloc(max ? max : 1);
  if (!buf) {
    rc = tz_err_set(TZ_ENOMEM, "resume: no memory");
    goto out;
  }
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < N_SAVED; i++) {
      int k = saved_kinds[i];
      char name[TZ_CKPT_MAX_NAME + 1];
      section_name(tr, b, k, name, sizeof name);
      uint64_t bytes = tz_trainer_shard_bytes(tr, b, k);
      if (src_world == world) {
        TZ_CHECK_GOTO(tz_ckpt_get(rs[rank], name, buf, bytes), rc, out);
      } else {
        TZ_CHECK_GOTO(load_resharded(tr, rs, tz_ckpt_dir(r0), src_world, rank, b, k, buf, bytes),
                      rc, out);
      }
      TZ_CHECK_GOTO(tz_trainer_shard_store(tr, b, k, buf), rc, out);
    }
  TZ_CHECK_GOTO(tz_trainer_set_steps_done(tr, *step), rc, out);
  /* A checkpoint from before the scaler was saved keeps the trainer's initial scale. */
  if (ls.scale > 0 || tz_trainer_loss_scale(tr) == 0) {
    rc = tz_trainer_loss_scale_set(tr, &ls);
    if (rc < 0) {
      char why[512];
      snprintf(why, sizeof why, "%s", tz_err_msg());
      rc = tz_err_set(rc, "resume: %s: %s", tz_ckpt_dir(r0), why);
      goto out;
    }
  }
out:
  free(buf);
  if (rs)
    for (int j = 0; j < src_world; j++)
      tz_ckpt_close(rs[j]);
  free(rs);
  tz_ckpt_close(r0);
  return rc;
}

int tz_resume_load(tz_trainer *tr, tz_comm *comm, const char *path, int64_t *step) {
  int64_t s = 0;
  int rc = agree(comm, load_rank(tr, comm, path, &s), "resume: load");
  if (rc == 0 && step)
    *step = s;
  return rc;
}

int tz_resume_stop_agree(tz_comm *comm, int mine, int *sig) {
  *sig = mine;
  if (tz_comm_size(comm) == 1)
    return 0;
  float flags[2] = {mine == SIGTERM ? 1.0f : 0.0f, mine == SIGINT ? 1.0f : 0.0f}, sum[2] = {0, 0};
  tz_fence *f = NULL;
  TZ_CHECK(tz_comm_all_reduce(comm, flags, sum, 2, TZ_F32, NULL, &f));
  int rc = tz_fence_wait(f, -1);
  tz_fence_release(f);
  if (rc < 0)
    return rc;
  *sig = sum[0] > 0 ? SIGTERM : sum[1] > 0 ? SIGINT : 0;
  return 0;
}
