/* The rope keys of config.json, read and written (hf.h; the rest of the grammar is hf_config.c's):
 * rope_theta, rope_scaling (hub configs, transformers 4) and rope_parameters (transformers 5) with
 * each rope_type's numbers, Gemma 3's rope per layer type, and partial_rotary_factor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "trainer/model/family.h"
#include "trainer/model/hf_internal.h"

/* yarn's mscale (transformers' yarn_get_mscale): 0.1 m ln(s) + 1 above a scale of 1. */
static double yarn_mscale(double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * log(s) + 1.0; }

/* rope_type "yarn", as transformers' _compute_yarn_parameters reads it: factor (absent: the
 * ratio of max_position_embeddings to original_max_position_embeddings, which defaults to
 * max_position_embeddings), beta_fast 32 and beta_slow 1 when absent or 0, truncate true, and
 * the attention factor given, or from mscale and mscale_all_dim, or 0.1 ln(factor) + 1. */
static int parse_yarn(const struct tz_hf_cfgp *p, const char *key, json_t *rs, int *type,
                      struct tz_model_config *cfg) {
  double orig = 0, factor = 0, af = 0, ms = 0, msa = 0;
  *type = TZ_ROPE_YARN;
  TZ_CHECK(tz_hf_num_of(p, rs, key, "original_max_position_embeddings", 0, cfg->max_seq, &orig));
  if (orig != floor(orig) || orig < 1 || orig > INT32_MAX)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"%s.original_max_position_embeddings\" %g must be a positive integer",
                      p->path, key, orig);
  cfg->rope_original_max_pos = (int)orig;
  TZ_CHECK(tz_hf_num_of(p, rs, key, "factor", 0, cfg->max_seq / orig, &factor));
  cfg->rope_factor = factor;
  TZ_CHECK(tz_hf_num_of(p, rs, key, "beta_fast", 0, 0.0, &cfg->rope_beta_fast));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "beta_slow", 0, 0.0, &cfg->rope_beta_slow));
  if (cfg->rope_beta_fast == 0)
    cfg->rope_beta_fast = 32;
  if (cfg->rope_beta_slow == 0)
    cfg->rope_beta_slow = 1;
  json_t *tr = json_object_get(rs, "truncate");
  char t[100];
  if (tr && !json_is_boolean(tr))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s.truncate\" must be true or false, not %s", p->path, key,
                      tz_hf_jtext(tr, t, sizeof t));
  cfg->rope_truncate = !tr || json_is_true(tr);
  TZ_CHECK(tz_hf_num_of(p, rs, key, "attention_factor", 0, 0.0, &af));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "mscale", 0, 0.0, &ms));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "mscale_all_dim", 0, 0.0, &msa));
  if (af == 0)
    af = ms != 0 && msa != 0 ? yarn_mscale(factor, ms) / yarn_mscale(factor, msa)
                             : yarn_mscale(factor, 1);
  if (!(af > 0) || !isfinite(af))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\": yarn's attention factor %g must be positive",
                      p->path, key, af);
  cfg->rope_attn_factor = af;
  return 0;
}

/* A longrope factor list: tz_model_rope_dims / 2 positive numbers. */
static int longrope_factors(const struct tz_hf_cfgp *p, const char *key, json_t *rs,
                            const char *name, int n, double *out) {
  json_t *a = json_object_get(rs, name);
  char t[100];
  if (!json_is_array(a) || json_array_size(a) != (size_t)n)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"%s.%s\" must be a list of rotated dims / 2 (%d) numbers, not %s",
                      p->path, key, name, n, tz_hf_jtext(a, t, sizeof t));
  for (int i = 0; i < n; i++) {
    json_t *v = json_array_get(a, (size_t)i);
    if (!json_is_number(v) || !(json_number_value(v) > 0) || !isfinite(json_number_value(v)))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s.%s\"[%d] is %s, not a positive number", p->path, key,
                        name, i, tz_hf_jtext(v, t, sizeof t));
    out[i] = json_number_value(v);
  }
  return 0;
}

/* rope_type "longrope" (Phi-3.5), as transformers' _compute_longrope_parameters reads it: the
 * short and long factors (rotated dims / 2 each), original_max_position_embeddings (in the rope
 * object or, as Phi-3.5's configs have it, beside it), factor (absent: max_position_embeddings
 * over it) and the attention factor (absent: 1 at a factor of at most 1, else
 * sqrt(1 + ln(factor) / ln(original))). */
static int parse_longrope(const struct tz_hf_cfgp *p, const char *key, json_t *rs, int *type,
                          struct tz_model_config *cfg) {
  int n = tz_model_rope_dims(cfg) / 2;
  double orig = 0, factor = 0, af = 0;
  *type = TZ_ROPE_LONGROPE;
  TZ_CHECK(longrope_factors(p, key, rs, "short_factor", n, cfg->rope_short_factor));
  TZ_CHECK(longrope_factors(p, key, rs, "long_factor", n, cfg->rope_long_factor));
  if (json_object_get(rs, "original_max_position_embeddings"))
    TZ_CHECK(tz_hf_num_of(p, rs, key, "original_max_position_embeddings", 1, 0, &orig));
  else
    TZ_CHECK(tz_hf_num_of(p, p->root, "", "original_max_position_embeddings", 1, 0, &orig));
  if (orig != floor(orig) || orig < 2 || orig > INT32_MAX)
    return tz_err_set(TZ_ECONFIG,
                      "%s: longrope's original_max_position_embeddings %g must be an integer of "
                      "at least 2",
                      p->path, orig);
  cfg->rope_original_max_pos = (int)orig;
  TZ_CHECK(tz_hf_num_of(p, rs, key, "factor", 0, cfg->max_seq / orig, &factor));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "attention_factor", 0, 0.0, &af));
  if (af == 0)
    af = factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig));
  if (!(af > 0) || !isfinite(af))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\": longrope's attention factor %g must be positive",
                      p->path, key, af);
  cfg->rope_factor = factor;
  cfg->rope_attn_factor = af;
  return 0;
}

/* One rope object (rope_scaling or rope_parameters): its type into *type (0 default, 1 llama3)
 * with the llama3 numbers into cfg, and its rope_theta into *theta (0 when it has none). */
static int parse_rope(const struct tz_hf_cfgp *p, const char *key, json_t *rs, int *type,
                      struct tz_model_config *cfg, double *theta) {
  char t[100];
  if (!json_is_object(rs))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" must be an object or null, not %s", p->path, key,
                      tz_hf_jtext(rs, t, sizeof t));
  json_t *ty = json_object_get(rs, "rope_type");
  const char *tkey = "rope_type";
  if (!ty) {
    ty = json_object_get(rs, "type");
    tkey = "type";
  }
  if (!ty)
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" has no \"rope_type\"", p->path, key);
  if (!json_is_string(ty))
    return tz_err_set(TZ_ECONFIG, "%s: \"%s.%s\" must be a string, not %s", p->path, key, tkey,
                      tz_hf_jtext(ty, t, sizeof t));
  const char *s = json_string_value(ty);
  TZ_CHECK(tz_hf_num_of(p, rs, key, "rope_theta", 0, 0.0, theta));
  /* transformers 5 moves partial_rotary_factor into the rope object (Phi-3 and Phi-4 write 1.0
   * there, Phi-4-mini 0.75): the config's (parse_partial_rotary) */
  json_t *prf = json_object_get(rs, "partial_rotary_factor");
  if (prf && !(json_is_number(prf) && json_number_value(prf) == p->partial))
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"%s.partial_rotary_factor\" is %s, where the config's is %g (1 when "
                      "it has none)",
                      p->path, key, tz_hf_jtext(prf, t, sizeof t), p->partial);
  if (strcmp(s, "default") == 0) {
    *type = TZ_ROPE_DEFAULT;
    return 0;
  }
  if (strcmp(s, "linear") == 0) { /* position interpolation: every frequency / factor */
    *type = TZ_ROPE_LINEAR;
    return tz_hf_num_of(p, rs, key, "factor", 1, 0.0, &cfg->rope_factor);
  }
  if (strcmp(s, "yarn") == 0)
    return parse_yarn(p, key, rs, type, cfg);
  if (strcmp(s, "longrope") == 0)
    return parse_longrope(p, key, rs, type, cfg);
  if (strcmp(s, "dynamic") == 0) { /* the default rope up to max_position_embeddings (model.h) */
    *type = TZ_MODEL_ROPE_DYNAMIC;
    TZ_CHECK(tz_hf_num_of(p, rs, key, "factor", 1, 0.0, &cfg->rope_factor));
    if (!(cfg->rope_factor >= 1.0))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s.factor\" %g must be at least 1", p->path, key,
                        cfg->rope_factor);
    return 0;
  }
  if (strcmp(s, "llama3") != 0)
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"%s.%s\" is \"%s\": only \"default\", \"linear\", \"llama3\", "
                      "\"yarn\", \"longrope\" and \"dynamic\" RoPE are implemented (another "
                      "scaling would change every position's angle)",
                      p->path, key, tkey, s);
  *type = TZ_ROPE_LLAMA3;
  double orig = 0;
  TZ_CHECK(tz_hf_num_of(p, rs, key, "factor", 1, 0.0, &cfg->rope_factor));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "low_freq_factor", 1, 0.0, &cfg->rope_low_freq_factor));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "high_freq_factor", 1, 0.0, &cfg->rope_high_freq_factor));
  TZ_CHECK(tz_hf_num_of(p, rs, key, "original_max_position_embeddings", 1, 0.0, &orig));
  if (orig != floor(orig) || orig < 1 || orig > INT32_MAX)
    return tz_err_set(TZ_ECONFIG,
                      "%s: \"%s.original_max_position_embeddings\" %g must be a positive integer",
                      p->path, key, orig);
  cfg->rope_original_max_pos = (int)orig;
  return 0;
}

/* The rope keys: rope_theta, rope_scaling (hub configs, transformers 4) and rope_parameters
 * (transformers 5, with rope_theta inside); two that are present must agree. */
static int parse_ropes(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  static const char *const keys[2] = {"rope_scaling", "rope_parameters"};
  double top = 0, theta[2] = {0, 0};
  int type[2] = {-1, -1};
  struct tz_model_config got[2];
  TZ_CHECK(tz_hf_num_of(p, p->root, "", "rope_theta", 0, 0.0, &top));
  for (int i = 0; i < 2; i++) {
    json_t *rs = tz_hf_jget(p, keys[i]);
    got[i] = *cfg;
    if (rs)
      TZ_CHECK(parse_rope(p, keys[i], rs, &type[i], &got[i], &theta[i]));
  }
  if (type[0] >= 0 && type[1] >= 0 &&
      (type[0] != type[1] || got[0].rope_factor != got[1].rope_factor ||
       got[0].rope_low_freq_factor != got[1].rope_low_freq_factor ||
       got[0].rope_high_freq_factor != got[1].rope_high_freq_factor ||
       got[0].rope_original_max_pos != got[1].rope_original_max_pos))
    return tz_err_set(TZ_ECONFIG, "%s: \"rope_scaling\" and \"rope_parameters\" disagree", p->path);
  int use = type[1] >= 0 ? 1 : 0;
  if (type[use] >= 0) {
    *cfg = got[use];
    cfg->rope_type = type[use];
  }
  double th = 0;
  const char *from = NULL;
  const char *names[3] = {"rope_theta", "rope_scaling.rope_theta", "rope_parameters.rope_theta"};
  double vals[3] = {top, theta[0], theta[1]};
  for (int i = 0; i < 3; i++) {
    if (vals[i] == 0)
      continue;
    if (from && vals[i] != th)
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" %g and \"%s\" %g disagree", p->path, from, th,
                        names[i], vals[i]);
    th = vals[i];
    from = names[i];
  }
  const struct tz_family *fam = tz_family_of(cfg->family);
  /* the default of the families' configs: 10000, Gemma 3's 1e6 */
  cfg->rope_theta = from ? th : fam->rope_theta_default > 0 ? fam->rope_theta_default : 10000.0;
  if (cfg->rope_theta <= 0)
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\" %g must be positive", p->path,
                      from ? from : "rope_theta", cfg->rope_theta);
  struct tz_rope r;
  tz_model_rope(cfg, &r);
  if (tz_rope_check(&r) < 0) {
    char why[400];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(TZ_ECONFIG, "%s: \"%s\": %s", p->path, keys[use], why);
  }
  return 0;
}

/* Gemma 3's two ropes (family.h, rope_local): transformers 5's rope_parameters holds one per
 * layer type; hub configs (transformers 4) give rope_theta and rope_scaling for the full layers
 * and rope_local_base_freq for the sliding ones. */
static int parse_local_ropes(const struct tz_hf_cfgp *p, struct tz_model_config *cfg) {
  json_t *rp = tz_hf_jget(p, "rope_parameters");
  char t[100];
  json_t *full = json_is_object(rp) ? json_object_get(rp, "full_attention") : NULL;
  json_t *slide = json_is_object(rp) ? json_object_get(rp, "sliding_attention") : NULL;
  if (!full && !slide) {
    /* no per-type rope_parameters: the flat keys of every family for the full layers */
    TZ_CHECK(parse_ropes(p, cfg));
    TZ_CHECK(
        tz_hf_num_of(p, p->root, "", "rope_local_base_freq", 0, 10000.0, &cfg->rope_local_theta));
  } else {
    if (!json_is_object(full) || !json_is_object(slide))
      return tz_err_set(TZ_ECONFIG,
                        "%s: \"rope_parameters\" must hold objects \"full_attention\" and "
                        "\"sliding_attention\", not %s",
                        p->path, tz_hf_jtext(rp, t, sizeof t));
    int type = 0, ltype = 0;
    double theta = 0, ltheta = 0;
    struct tz_model_config local = *cfg;
    TZ_CHECK(parse_rope(p, "rope_parameters.full_attention", full, &type, cfg, &theta));
    TZ_CHECK(parse_rope(p, "rope_parameters.sliding_attention", slide, &ltype, &local, &ltheta));
    if (ltype != TZ_ROPE_DEFAULT)
      return tz_err_set(TZ_ENOTSUP,
                        "%s: \"rope_parameters.sliding_attention\" is not of rope_type "
                        "\"default\": the sliding layers' scaling is not implemented",
                        p->path);
    cfg->rope_type = type;
    cfg->rope_theta = theta > 0 ? theta : tz_family_of(cfg->family)->rope_theta_default;
    cfg->rope_local_theta = ltheta > 0 ? ltheta : 10000.0;
  }
  if (!(cfg->rope_local_theta > 0))
    return tz_err_set(TZ_ECONFIG, "%s: the sliding layers' rope base %g must be positive", p->path,
                      cfg->rope_local_theta);
  struct tz_rope r;
  tz_model_rope(cfg, &r);
  if (tz_rope_check(&r) < 0) {
    char why[400];
    snprintf(why, sizeof why, "%s", tz_err_msg());
    return tz_err_set(TZ_ECONFIG, "%s: the full layers' rope: %s", p->path, why);
  }
  return 0;
}

/* partial_rotary_factor (Phi-4-mini: 0.75), at the top or in a flat rope_parameters (transformers
 * 5), both the same where both are: RoPE rotates the first int(head_dim * factor) dims of each
 * head, as transformers' rope init and apply_rotary_pos_emb take them (the model's rope_rot; an
 * odd count, which transformers cannot apply either, is refused). Families whose attention
 * rotates the whole head (family.h, partial_rotary 0) refuse a factor other than 1. */
static int parse_partial_rotary(struct tz_hf_cfgp *p, const struct tz_family *fam,
                                struct tz_model_config *cfg) {
  json_t *rp = tz_hf_jget(p, "rope_parameters");
  json_t *vals[2] = {tz_hf_jget(p, "partial_rotary_factor"),
                     json_is_object(rp) ? json_object_get(rp, "partial_rotary_factor") : NULL};
  const char *names[2] = {"partial_rotary_factor", "rope_parameters.partial_rotary_factor"};
  char t[100];
  p->partial = 1.0;
  for (int i = 0, seen = 0; i < 2; i++) {
    if (!vals[i])
      continue;
    double f = json_is_number(vals[i]) ? json_number_value(vals[i]) : -1;
    if (!(f > 0 && f <= 1))
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" is %s, not a number in (0, 1]", p->path, names[i],
                        tz_hf_jtext(vals[i], t, sizeof t));
    if (seen && f != p->partial)
      return tz_err_set(TZ_ECONFIG, "%s: \"%s\" %g and \"%s\" %g disagree", p->path, names[0],
                        p->partial, names[1], f);
    p->partial = f;
    seen = 1;
  }
  if (p->partial == 1.0)
    return 0;
  if (!fam->partial_rotary)
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"partial_rotary_factor\" is %g: model_type %s's attention rotates the "
                      "whole head (1)",
                      p->path, p->partial, fam->model_type);
  int D = tz_model_head_dim(cfg);
  int rot = (int)(D * p->partial);
  if (rot < 2 || rot % 2 != 0)
    return tz_err_set(TZ_ENOTSUP,
                      "%s: \"partial_rotary_factor\" %g of head_dim %d rotates %d dims, which must "
                      "be even and at least 2",
                      p->path, p->partial, D, rot);
  cfg->rope_rot = rot < D ? rot : 0;
  return 0;
}

int tz_hf_rope_read(struct tz_hf_cfgp *p, const struct tz_family *fam,
                    struct tz_model_config *cfg) {
  TZ_CHECK(parse_partial_rotary(p, fam, cfg));
  return fam->rope_local ? parse_local_ropes(p, cfg) : parse_ropes(p, cfg);
}

int tz_hf_rope_write(json_t *r, const struct tz_model_config *cfg) {
  const struct tz_family *fam = tz_family_of(cfg->family);
  json_t *rp = json_object();
  if (!rp)
    return tz_err_set(TZ_ENOMEM, "hf: out of memory writing the rope keys");
  json_object_set_new(r, "rope_theta", json_real(cfg->rope_theta));
  json_object_set_new(rp, "rope_theta", json_real(cfg->rope_theta));
  if (cfg->rope_type == TZ_ROPE_LLAMA3) {
    json_t *rs = json_object();
    json_object_set_new(rs, "rope_type", json_string("llama3"));
    json_object_set_new(rs, "factor", json_real(cfg->rope_factor));
    json_object_set_new(rs, "low_freq_factor", json_real(cfg->rope_low_freq_factor));
    json_object_set_new(rs, "high_freq_factor", json_real(cfg->rope_high_freq_factor));
    json_object_set_new(rs, "original_max_position_embeddings",
                        json_integer(cfg->rope_original_max_pos));
    json_object_update(rp, rs);
    json_object_set_new(r, "rope_scaling", rs);
  } else if (cfg->rope_type == TZ_ROPE_LONGROPE) {
    /* transformers 4's Phi3Config takes exactly type, short_factor and long_factor, the
     * original length beside them; 5 reads rope_parameters with everything */
    json_t *rs = json_object(), *sf = json_array(), *lf = json_array();
    for (int i = 0; i < tz_model_rope_dims(cfg) / 2; i++) {
      json_array_append_new(sf, json_real(cfg->rope_short_factor[i]));
      json_array_append_new(lf, json_real(cfg->rope_long_factor[i]));
    }
    json_object_set_new(rs, "type", json_string("longrope"));
    json_object_set_new(rs, "short_factor", sf);
    json_object_set_new(rs, "long_factor", lf);
    json_object_set_new(r, "original_max_position_embeddings",
                        json_integer(cfg->rope_original_max_pos));
    json_object_update(rp, rs);
    json_object_del(rp, "type");
    json_object_set_new(rp, "rope_type", json_string("longrope"));
    json_object_set_new(rp, "original_max_position_embeddings",
                        json_integer(cfg->rope_original_max_pos));
    json_object_set_new(rp, "factor", json_real(cfg->rope_factor));
    json_object_set_new(rp, "attention_factor", json_real(cfg->rope_attn_factor));
    json_object_set_new(r, "rope_scaling", rs);
  } else if (cfg->rope_type == TZ_ROPE_YARN) {
    json_t *rs = json_object();
    json_object_set_new(rs, "rope_type", json_string("yarn"));
    json_object_set_new(rs, "factor", json_real(cfg->rope_factor));
    json_object_set_new(rs, "original_max_position_embeddings",
                        json_integer(cfg->rope_original_max_pos));
    json_object_set_new(rs, "beta_fast", json_real(cfg->rope_beta_fast));
    json_object_set_new(rs, "beta_slow", json_real(cfg->rope_beta_slow));
    json_object_set_new(rs, "truncate", json_boolean(cfg->rope_truncate));
    json_object_set_new(rs, "attention_factor", json_real(cfg->rope_attn_factor));
    json_object_update(rp, rs);
    json_object_set_new(r, "rope_scaling", rs);
  } else if (cfg->rope_type == TZ_ROPE_LINEAR || cfg->rope_type == TZ_MODEL_ROPE_DYNAMIC) {
    json_t *rs = json_object();
    json_object_set_new(rs, "rope_type",
                        json_string(cfg->rope_type == TZ_ROPE_LINEAR ? "linear" : "dynamic"));
    json_object_set_new(rs, "factor", json_real(cfg->rope_factor));
    json_object_update(rp, rs);
    json_object_set_new(r, "rope_scaling", rs);
  } else {
    json_object_set_new(rp, "rope_type", json_string("default"));
    json_object_set_new(r, "rope_scaling", json_null());
  }
  if (fam->rope_local) { /* transformers 5: one per layer type; 4: rope_local_base_freq */
    json_t *nested = json_object(), *loc = json_object();
    json_object_set_new(loc, "rope_type", json_string("default"));
    json_object_set_new(loc, "rope_theta", json_real(cfg->rope_local_theta));
    json_object_set_new(nested, "full_attention", rp);
    json_object_set_new(nested, "sliding_attention", loc);
    rp = nested;
    json_object_set_new(r, "rope_local_base_freq", json_real(cfg->rope_local_theta));
  }
  if (cfg->rope_rot) { /* the factor whose int(head_dim * factor) is rope_rot */
    double f = (double)cfg->rope_rot / tz_model_head_dim(cfg);
    json_object_set_new(r, "partial_rotary_factor", json_real(f));
    json_object_set_new(rp, "partial_rotary_factor", json_real(f));
  }
  json_object_set_new(r, "rope_parameters", rp);
  return 0;
}
