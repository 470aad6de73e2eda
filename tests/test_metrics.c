/* Metrics: the JSONL file read back with jansson, the display in its plain-line mode (not a
 * terminal) and its bar mode (a pseudo-terminal), the summary's figures, and the FLOPs formula
 * against the known size of llama-7b; a resumed run's file, and the names of the display modes. */
#define _GNU_SOURCE
#include "testlib.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "trainer/run/metrics.h"
#include "trainer/model/model.h"

static void fill_step(struct tz_step_metrics *m, int64_t step, int64_t total) {
  tz_step_metrics_init(m);
  m->step = step;
  m->total_steps = total;
  m->elapsed_s = 0.5 * (double)step;
  m->loss = 5.0 / (double)step;
  m->lr = 3e-4;
  m->grad_norm = 0.75;
  m->tokens = 2048;
  m->step_s = 0.5;
  m->bound_s = 0.25;
  m->stall_s = 0.125;
  m->coll_s = 0.0625;
}

static void test_jsonl(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("metrics");
  char *path = NULL;
  assert_true(asprintf(&path, "%s/m.jsonl", dir) > 0);
  tz_metrics_writer *w = NULL;
  TZ_ASSERT_OK(tz_metrics_writer_create(path, 0, &w));
  double fpt = 1e6, peak = 1e12;
  struct tz_metrics_summary sum;
  tz_metrics_summary_init(&sum, fpt, peak);
  for (int64_t s = 1; s <= 3; s++) {
    struct tz_step_metrics m;
    fill_step(&m, s, 3);
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "read", 1000 * (uint64_t)s));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "write", 10));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "host", "h2d", 7));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "read", 1)); /* accumulates */
    if (s == 2) {
      m.has_eval = 1;
      m.eval_loss = 2.5;
      m.grad_norm = NAN; /* not known: null */
    }
    if (s == 3) {
      m.skipped = 1;
      m.loss_scale = 32768;
      m.bound_s = 0; /* no plan: null */
    }
    tz_metrics_derive(&m, fpt, peak);
    TZ_ASSERT_OK(tz_metrics_write_step(w, &m));
    tz_metrics_summary_add(&sum, &m);
  }
  TZ_ASSERT_OK(tz_metrics_write_summary(w, &sum));
  tz_metrics_writer_destroy(w);

  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    n++;
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    if (!o)
      print_error("line %d does not parse: %s: %s", n, err.text, line);
    assert_non_null(o);
    assert_true(json_is_object(o));
    if (n <= 3) {
      assert_int_equal(json_integer_value(json_object_get(o, "step")), n);
      assert_int_equal(json_integer_value(json_object_get(o, "total_steps")), 3);
      /* 10 significant digits are written: every float32 value reads back exactly. */
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "loss")), 5.0 / n, 1e-9);
      assert_true((float)json_real_value(json_object_get(o, "loss")) == (float)(5.0 / n));
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "lr")), 3e-4, 1e-12);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "tokens_per_s")), 4096.0, 1e-12);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "tflops")), 4096.0 * 1e6 / 1e12, 1e-9);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "mfu")), 4096.0 * 1e6 / 1e12, 1e-9);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "step_s")), 0.5, 0);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "stall_s")), 0.125, 0);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "coll_s")), 0.0625, 0);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "elapsed_s")), 0.5 * n, 0);
      assert_int_equal(json_integer_value(json_object_get(o, "tokens")), 2048);
      json_t *bytes = json_object_get(o, "bytes");
      assert_true(json_is_object(bytes));
      assert_int_equal(json_integer_value(json_object_get(json_object_get(bytes, "nvme"), "read")),
                       1000 * n + 1);
      assert_int_equal(json_integer_value(json_object_get(json_object_get(bytes, "nvme"), "write")),
                       10);
      assert_int_equal(json_integer_value(json_object_get(json_object_get(bytes, "host"), "h2d")),
                       7);
      /* Optional fields only where they apply. */
      assert_int_equal(json_object_get(o, "eval_loss") != NULL, n == 2);
      assert_int_equal(json_object_get(o, "loss_scale") != NULL, n == 3);
      assert_int_equal(json_is_true(json_object_get(o, "skipped")), n == 3);
      assert_true(json_is_null(json_object_get(o, "grad_norm")) == (n == 2));
      assert_true(json_is_null(json_object_get(o, "bound_s")) == (n == 3));
      if (n == 2)
        TZ_ASSERT_REL(json_real_value(json_object_get(o, "eval_loss")), 2.5, 0);
    } else {
      /* The summary: steps 2 and 3 timed. */
      assert_true(json_is_true(json_object_get(o, "summary")));
      assert_int_equal(json_integer_value(json_object_get(o, "steps")), 3);
      assert_int_equal(json_integer_value(json_object_get(o, "timed_steps")), 2);
      assert_int_equal(json_integer_value(json_object_get(o, "skipped")), 1);
      assert_int_equal(json_integer_value(json_object_get(o, "tokens")), 3 * 2048);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "tokens_per_s")), 4096.0, 1e-12);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "stall_share")), 0.25, 1e-12);
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "coll_share")), 0.125, 1e-12);
      /* Step 3 had no bound, so no bound is claimed for the timed steps. */
      assert_true(json_is_null(json_object_get(o, "bound_s")));
      TZ_ASSERT_REL(json_real_value(json_object_get(o, "eval_loss")), 2.5, 0);
      json_t *nv = json_object_get(json_object_get(o, "bytes"), "nvme");
      assert_int_equal(json_integer_value(json_object_get(nv, "read")), 1001 + 2001 + 3001);
    }
    json_decref(o);
  }
  assert_int_equal(n, 4);
  fclose(f);

  /* Appending (a resumed run) keeps what is there. */
  TZ_ASSERT_OK(tz_metrics_writer_create(path, 1, &w));
  struct tz_step_metrics m;
  fill_step(&m, 4, 4);
  TZ_ASSERT_OK(tz_metrics_write_step(w, &m));
  tz_metrics_writer_destroy(w);
  f = fopen(path, "r");
  n = 0;
  while (fgets(line, sizeof line, f))
    n++;
  fclose(f);
  assert_int_equal(n, 5);

  /* A directory that does not exist: the path in the message. */
  char *bad = NULL;
  assert_true(asprintf(&bad, "%s/no/such/dir/m.jsonl", dir) > 0);
  assert_int_equal(tz_metrics_writer_create(bad, 0, &w), TZ_ENOENT);
  assert_non_null(strstr(tz_err_msg(), bad));
  tz_metrics_writer_destroy(NULL);
  free(bad);
  free(path);
  tz_test_rmdir(dir);
}

static void test_traffic_limits(void **state) {
  (void)state;
  struct tz_step_metrics m;
  tz_step_metrics_init(&m);
  assert_true(isnan(m.loss) && isnan(m.mfu));
  assert_int_equal(tz_step_metrics_add_traffic(&m, "a-tier-name-too-long", "read", 1), TZ_EINVAL);
  assert_int_equal(tz_step_metrics_add_traffic(&m, "nvme", "", 1), TZ_EINVAL);
  char lane[16];
  for (int i = 0; i < TZ_METRICS_MAX_TRAFFIC; i++) {
    snprintf(lane, sizeof lane, "lane%d", i);
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "host", lane, 1));
  }
  assert_int_equal(tz_step_metrics_add_traffic(&m, "host", "one-more", 1), TZ_ENOMEM);
  /* An existing pair still accumulates when full. */
  TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "host", "lane0", 5));
  assert_int_equal(m.traffic[0].bytes, 6);
}

/* Everything written to f since the start. */
static char *slurp(FILE *f) {
  fflush(f);
  long n = ftell(f);
  assert_true(n >= 0);
  char *buf = calloc((size_t)n + 1, 1);
  rewind(f);
  assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
  return buf;
}

static int count_lines(const char *s) {
  int n = 0;
  for (; *s; s++)
    n += *s == '\n';
  return n;
}

/* The step of each line of path (-1 for a summary line), in order; returns their number. */
static int file_steps(const char *path, int64_t *steps, int max) {
  FILE *f = fopen(path, "r");
  assert_non_null(f);
  char line[8192];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    if (!o)
      print_error("line %d does not parse: %s", n + 1, line);
    assert_non_null(o);
    assert_true(n < max);
    steps[n++] = json_is_true(json_object_get(o, "summary"))
                     ? -1
                     : json_integer_value(json_object_get(o, "step"));
    json_decref(o);
  }
  fclose(f);
  return n;
}

/* A run resumed from the checkpoint of step 4 appends to a file whose run went on to step 6 and
 * died while writing step 7: the lines after step 4 (steps 5 and 6, the torn line) go, the rest
 * stays, and the resumed steps follow; a file without lines past the step is kept whole, and a
 * missing one is created. */
static void test_metrics_resume_drops_steps_past_checkpoint(void **state) {
  (void)state;
  char *dir = tz_test_mkdtemp("metrics-resume");
  char *path = NULL;
  assert_true(asprintf(&path, "%s/m.jsonl", dir) > 0);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  for (int s = 1; s <= 6; s++)
    fprintf(f, "{\"step\":%d,\"loss\":1.5}\n", s);
  fputs("{\"step\":7,\"lo", f);
  fclose(f);
  tz_metrics_writer *w = NULL;
  TZ_ASSERT_OK(tz_metrics_writer_resume(path, 4, &w));
  int64_t steps[16];
  assert_int_equal(file_steps(path, steps, 16), 4); /* rewritten before the first step */
  for (int64_t s = 5; s <= 6; s++) {
    struct tz_step_metrics m;
    fill_step(&m, s, 6);
    TZ_ASSERT_OK(tz_metrics_write_step(w, &m));
  }
  struct tz_metrics_summary sum;
  tz_metrics_summary_init(&sum, 1e6, 0);
  TZ_ASSERT_OK(tz_metrics_write_summary(w, &sum));
  tz_metrics_writer_destroy(w);
  assert_int_equal(file_steps(path, steps, 16), 7);
  for (int i = 0; i < 6; i++)
    assert_int_equal(steps[i], i + 1);
  assert_int_equal(steps[6], -1);
  /* Resumed from its last step: nothing to drop, the first segment's summary stays. */
  TZ_ASSERT_OK(tz_metrics_writer_resume(path, 6, &w));
  tz_metrics_writer_destroy(w);
  assert_int_equal(file_steps(path, steps, 16), 7);
  /* Resumed from step 0 (a checkpoint before any step): every step goes. */
  TZ_ASSERT_OK(tz_metrics_writer_resume(path, 0, &w));
  tz_metrics_writer_destroy(w);
  assert_int_equal(file_steps(path, steps, 16), 0);
  char *fresh = NULL;
  assert_true(asprintf(&fresh, "%s/new.jsonl", dir) > 0);
  TZ_ASSERT_OK(tz_metrics_writer_resume(fresh, 3, &w));
  tz_metrics_writer_destroy(w);
  assert_int_equal(file_steps(fresh, steps, 16), 0);
  free(fresh);
  free(path);
  tz_test_rmdir(dir);
}

/* --progress's names: plain (lines), bar, auto; anything else is refused by name. */
static void test_display_mode_parse(void **state) {
  (void)state;
  enum tz_display_mode m = TZ_DISPLAY_QUIET;
  TZ_ASSERT_OK(tz_display_mode_parse("plain", &m));
  assert_int_equal(m, TZ_DISPLAY_LINES);
  TZ_ASSERT_OK(tz_display_mode_parse("bar", &m));
  assert_int_equal(m, TZ_DISPLAY_BAR);
  TZ_ASSERT_OK(tz_display_mode_parse("auto", &m));
  assert_int_equal(m, TZ_DISPLAY_AUTO);
  assert_int_equal(tz_display_mode_parse("fancy", &m), TZ_EINVAL);
  assert_non_null(strstr(tz_err_msg(), "'fancy'"));
  assert_non_null(strstr(tz_err_msg(), "plain"));
  assert_int_equal(m, TZ_DISPLAY_AUTO);
}

static void test_display_lines(void **state) {
  (void)state;
  FILE *f = tmpfile();
  assert_non_null(f);
  tz_display *d = NULL;
  assert_int_equal(tz_display_create(f, TZ_DISPLAY_AUTO, 0, &d), TZ_EINVAL);
  TZ_ASSERT_OK(tz_display_create(f, TZ_DISPLAY_AUTO, 10, &d));
  /* Not a terminal: plain lines. */
  assert_int_equal(tz_display_mode_of(d), TZ_DISPLAY_LINES);
  for (int64_t s = 1; s <= 25; s++) {
    struct tz_step_metrics m;
    fill_step(&m, s, 25);
    if (s == 13) {
      m.has_eval = 1;
      m.eval_loss = 1.25;
    }
    tz_metrics_derive(&m, 1e6, 0);
    tz_display_step(d, &m);
  }
  tz_display_message(d, "checkpoint written");
  tz_display_destroy(d);
  char *out = slurp(f);
  /* Steps 1, 10, 13 (eval), 20, 25 (last), and the message. */
  assert_int_equal(count_lines(out), 6);
  assert_null(strchr(out, '\r'));
  assert_null(strchr(out, '\033'));
  assert_non_null(strstr(out, "step 1/25 | loss 5.0000 | lr 3.00e-04"));
  assert_non_null(strstr(out, "step 10/25 "));
  assert_non_null(strstr(out, "step 13/25 "));
  assert_non_null(strstr(out, "eval loss 1.2500"));
  assert_non_null(strstr(out, "step 25/25 "));
  assert_null(strstr(out, "step 11/25"));
  assert_non_null(strstr(out, "4.10k tok/s"));
  assert_non_null(strstr(out, "0.0041 TFLOP/s"));
  assert_null(strstr(out, "MFU")); /* no peak, no MFU */
  /* 12 steps left at 0.5 s: ETA 6s at step 13. */
  assert_non_null(strstr(out, "ETA 6s | eval"));
  assert_non_null(strstr(out, "\ncheckpoint written\n"));
  free(out);
  fclose(f);
}

static void test_display_bar(void **state) {
  (void)state;
  /* A real terminal: AUTO picks the bar. */
  int master = -1, slave = -1;
  if (openpty(&master, &slave, NULL, NULL, NULL) != 0) {
    print_message("no pseudo-terminal here; the bar is checked on a plain file only\n");
  } else {
    FILE *tty = fdopen(slave, "w");
    assert_non_null(tty);
    tz_display *d = NULL;
    TZ_ASSERT_OK(tz_display_create(tty, TZ_DISPLAY_AUTO, 10, &d));
    assert_int_equal(tz_display_mode_of(d), TZ_DISPLAY_BAR);
    struct tz_step_metrics m;
    fill_step(&m, 1, 5);
    tz_metrics_derive(&m, 1e6, 1e12);
    tz_display_step(d, &m);
    tz_display_destroy(d);
    fclose(tty);
    char buf[2048] = "";
    size_t n = 0;
    struct pollfd p = {.fd = master, .events = POLLIN};
    while (n < sizeof buf - 1 && poll(&p, 1, 200) > 0) {
      ssize_t r = read(master, buf + n, sizeof buf - 1 - n);
      if (r <= 0)
        break;
      n += (size_t)r;
    }
    buf[n] = '\0';
    assert_non_null(strchr(buf, '\r'));
    assert_non_null(strstr(buf, "step 1/5 ["));
    assert_non_null(strstr(buf, "ETA 2s"));
    close(master);
  }

  /* Forced bar on a file: every step redrawn in place, an eval result on a line of its own, a
   * message above the bar and the bar drawn again. */
  FILE *f = tmpfile();
  tz_display *d = NULL;
  TZ_ASSERT_OK(tz_display_create(f, TZ_DISPLAY_BAR, 10, &d));
  struct tz_step_metrics m;
  fill_step(&m, 1, 4);
  tz_metrics_derive(&m, 1e6, 1e12);
  tz_display_step(d, &m);
  tz_display_message(d, "hello");
  fill_step(&m, 2, 4);
  m.has_eval = 1;
  m.eval_loss = 0.5;
  tz_display_step(d, &m);
  fill_step(&m, 4, 4);
  tz_display_step(d, &m); /* the last step is always drawn */
  tz_display_destroy(d);
  char *out = slurp(f);
  assert_non_null(strstr(out, "\rstep 1/4 ["));
  assert_non_null(strstr(out, "\r\033[Khello\nstep 1/4 ["));
  assert_non_null(strstr(out, "step 2: eval loss 0.5000\n"));
  assert_non_null(strstr(out, "\rstep 4/4 ["));
  assert_non_null(strstr(out, "[########"));
  /* Ends with a newline so the shell prompt starts on a line of its own. */
  assert_int_equal(out[strlen(out) - 1], '\n');
  free(out);
  fclose(f);

  /* Quiet: nothing at all. */
  f = tmpfile();
  TZ_ASSERT_OK(tz_display_create(f, TZ_DISPLAY_QUIET, 1, &d));
  tz_display_step(d, &m);
  tz_display_message(d, "not shown");
  tz_display_destroy(d);
  assert_int_equal(ftell(f), 0);
  fclose(f);
}

static void test_flops(void **state) {
  (void)state;
  struct tz_model_config c;
  TZ_ASSERT_OK(tz_model_preset("llama-7b", &c));
  const int T = 2048;
  double attn = 12.0 * c.n_layer * (double)T * c.d_model;
  double f = tz_metrics_flops_per_token(&c, T, 0);
  /* The 6N part against the published size of LLaMA-7B, 6.74e9 parameters. */
  TZ_ASSERT_REL(f - attn, 6.0 * 6.74e9, 0.01);
  /* Exactly the formula. */
  TZ_ASSERT_REL(f, 6.0 * (double)tz_model_n_params(&c) + attn, 1e-15);
  double fr = tz_metrics_flops_per_token(&c, T, 1);
  TZ_ASSERT_REL(fr, 8.0 * (double)tz_model_n_params(&c) + 16.0 * c.n_layer * (double)T * c.d_model,
                1e-15);
  /* At T = 0 only the parameter term is left. */
  TZ_ASSERT_REL(tz_metrics_flops_per_token(&c, 0, 0), 6.0 * (double)tz_model_n_params(&c), 1e-15);
  /* With experts only the k a token is routed to count: Mixtral-8x7B's shape (8 experts of
   * 14336, 2 a token, 8 KV heads), published as 46.7 B parameters, 12.9 B of them active. */
  struct tz_model_config x = c;
  x.n_kv_head = 8;
  x.n_expert = 8;
  x.n_expert_used = 2;
  x.moe_ffn_dim = 14336;
  TZ_ASSERT_REL((double)tz_model_n_params(&x), 46.7e9, 0.01);
  TZ_ASSERT_REL(tz_metrics_flops_per_token(&x, 0, 0), 6.0 * 12.9e9, 0.01);
  TZ_ASSERT_REL(tz_metrics_flops_per_token(&x, T, 0),
                6.0 * (double)tz_model_n_active_params(&x) + attn, 1e-15);

  /* derive: 2048 tokens in 0.5 s. */
  struct tz_step_metrics m;
  tz_step_metrics_init(&m);
  m.tokens = 2048;
  m.step_s = 0.5;
  tz_metrics_derive(&m, f, 989.4e12);
  TZ_ASSERT_REL(m.tokens_per_s, 4096.0, 1e-15);
  TZ_ASSERT_REL(m.tflops, f * 4096.0 / 1e12, 1e-12);
  TZ_ASSERT_REL(m.mfu, f * 4096.0 / 989.4e12, 1e-12);
  tz_metrics_derive(&m, f, 0);
  assert_true(isnan(m.mfu));
  m.step_s = 0;
  tz_metrics_derive(&m, f, 1e12);
  assert_true(isnan(m.tokens_per_s) && isnan(m.tflops));

  /* Peaks by device name. */
  TZ_ASSERT_REL(tz_metrics_peak_flops("NVIDIA H200", TZ_PRECISION_BF16), 989.4e12, 0);
  TZ_ASSERT_REL(tz_metrics_peak_flops("NVIDIA H100 80GB HBM3", TZ_PRECISION_FP16), 989.4e12, 0);
  TZ_ASSERT_REL(tz_metrics_peak_flops("NVIDIA H100 PCIe", TZ_PRECISION_BF16), 756.5e12, 0);
  TZ_ASSERT_REL(tz_metrics_peak_flops("NVIDIA A100-SXM4-80GB", TZ_PRECISION_FP32), 19.5e12, 0);
  assert_true(tz_metrics_peak_flops("cpu", TZ_PRECISION_FP32) == 0.0);
  assert_true(tz_metrics_peak_flops(NULL, TZ_PRECISION_BF16) == 0.0);
}

static void test_summary(void **state) {
  (void)state;
  struct tz_metrics_summary s;
  tz_metrics_summary_init(&s, 1e9, 1e13);
  for (int64_t i = 1; i <= 3; i++) {
    struct tz_step_metrics m;
    fill_step(&m, i, 3);
    m.tokens = 1000;
    m.step_s = i == 1 ? 2.0 : 1.0; /* a slow first step, left out of the rates */
    m.bound_s = 0.5;
    m.stall_s = 0.25;
    m.coll_s = 0.125;
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "nvme", "read", 1000000000));
    TZ_ASSERT_OK(tz_step_metrics_add_traffic(&m, "host", "h2d", 500000000));
    tz_metrics_summary_add(&s, &m);
  }
  assert_int_equal(s.steps, 3);
  assert_int_equal(s.timed_steps, 2);
  assert_int_equal(s.tokens, 3000);
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  tz_metrics_summary_print(&s, f);
  fclose(f);
  assert_non_null(strstr(buf, "summary: 3 steps, 3.00k tokens in 4s"));
  assert_non_null(strstr(buf, "1.00k tokens/s, 1 TFLOP/s, MFU 10.0% of 10 TFLOP/s peak"));
  assert_non_null(strstr(buf, "1 s achieved, 0.5 s bound: 2.00x the bound"));
  assert_non_null(strstr(buf, "stalls 25.0% of step time, collectives 12.5%"));
  /* 3 GB over 4 s. */
  assert_non_null(strstr(buf, "nvme   read              3.00 GB  750.00 MB/s"));
  assert_non_null(strstr(buf, "host   h2d               1.50 GB  375.00 MB/s"));
  free(buf);
  assert_false(tz_metrics_summary_below_bound(&s));

  /* Under its bound: no ratio below 1, but what it means (issue #27 item 11). */
  tz_metrics_summary_init(&s, 1e9, 0);
  for (int64_t i = 1; i <= 3; i++) {
    struct tz_step_metrics m;
    fill_step(&m, i, 3);
    m.tokens = 1000;
    m.step_s = 0.25;
    m.bound_s = 2.0;
    tz_metrics_summary_add(&s, &m);
  }
  assert_true(tz_metrics_summary_below_bound(&s));
  f = open_memstream(&buf, &len);
  tz_metrics_summary_print(&s, f);
  fclose(f);
  if (!strstr(buf, "under the plan's 2 s bound"))
    print_error("%s", buf);
  assert_non_null(strstr(buf, "0.25 s achieved, under the plan's 2 s bound"));
  assert_non_null(strstr(buf, "measured again"));
  assert_null(strstr(buf, "x the bound"));
  free(buf);

  /* Within the rates' noise under it (2%): at the bound, no claim that it is wrong. */
  tz_metrics_summary_init(&s, 1e9, 0);
  for (int64_t i = 1; i <= 3; i++) {
    struct tz_step_metrics m;
    fill_step(&m, i, 3);
    m.tokens = 1000;
    m.step_s = 0.98;
    m.bound_s = 1.0;
    tz_metrics_summary_add(&s, &m);
  }
  assert_false(tz_metrics_summary_below_bound(&s));
  f = open_memstream(&buf, &len);
  tz_metrics_summary_print(&s, f);
  fclose(f);
  assert_non_null(strstr(buf, "0.98 s achieved, 1 s bound: at the bound (0.980x, within the "
                              "rates' 3% noise)"));
  assert_null(strstr(buf, "bound is wrong"));
  free(buf);

  /* One step only: it is the timed one. */
  tz_metrics_summary_init(&s, 1e9, 0);
  struct tz_step_metrics m;
  fill_step(&m, 1, 1);
  tz_metrics_summary_add(&s, &m);
  assert_int_equal(s.timed_steps, 1);
  f = open_memstream(&buf, &len);
  tz_metrics_summary_print(&s, f);
  fclose(f);
  assert_non_null(strstr(buf, "MFU unknown"));
  free(buf);
}

/* A step whose loss or gradient norm is not finite (a run stopped by it): the summary reports that
 * step's loss as the last one, not the last finite loss before it, and the step's line prints
 * "nan" (never "-nan", which a negative NaN's printf gives). A skipped fp16 step's inf does not
 * replace the last loss. */
static void test_nonfinite_last_step(void **state) {
  (void)state;
  struct tz_metrics_summary s;
  tz_metrics_summary_init(&s, 1e9, 0);
  struct tz_step_metrics m;
  fill_step(&m, 1, 3);
  m.loss = 2.5;
  tz_metrics_summary_add(&s, &m);
  fill_step(&m, 2, 3);
  m.loss = INFINITY;
  m.skipped = 1;
  tz_metrics_summary_add(&s, &m);
  assert_true(s.last_loss == 2.5);
  fill_step(&m, 3, 3);
  m.loss = -NAN;
  m.grad_norm = -NAN;
  tz_metrics_summary_add(&s, &m);
  assert_true(isnan(s.last_loss));
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  tz_metrics_summary_print(&s, f);
  fclose(f);
  assert_non_null(strstr(buf, "  loss        nan (last step)"));
  free(buf);

  f = tmpfile();
  assert_non_null(f);
  tz_display *d = NULL;
  TZ_ASSERT_OK(tz_display_create(f, TZ_DISPLAY_LINES, 1, &d));
  tz_metrics_derive(&m, 1e6, 0);
  tz_display_step(d, &m);
  tz_display_destroy(d);
  char *out = slurp(f);
  assert_non_null(strstr(out, "| loss nan |"));
  assert_non_null(strstr(out, "| grad norm nan |"));
  assert_null(strstr(out, "-nan"));
  free(out);
  fclose(f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_jsonl),
      cmocka_unit_test(test_traffic_limits),
      cmocka_unit_test(test_display_lines),
      cmocka_unit_test(test_display_bar),
      cmocka_unit_test(test_flops),
      cmocka_unit_test(test_summary),
      cmocka_unit_test(test_metrics_resume_drops_steps_past_checkpoint),
      cmocka_unit_test(test_display_mode_parse),
      cmocka_unit_test(test_nonfinite_last_step),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
