/* The built-in corpus (corpus.h): paragraphs of sentences drawn from a small grammar with a
 * fixed pseudo-random generator, written until the buffer is full. */
#include "trainer/data/corpus.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "util/mix.h"

/* The generator's fixed seed: the corpus is part of the program, not of a run. */
#define CORPUS_SEED 0x7469657273656564ull

struct gen {
  char *buf;
  size_t len, cap; /* cap excludes the terminating NUL */
  uint64_t state;
};

/* Uniform in [0, n); the modulo bias is irrelevant for n this small. */
static int pick(struct gen *g, int n) { return (int)(tz_mix_next(&g->state) % (uint64_t)n); }

#define PICK(g, arr) ((arr)[pick((g), (int)(sizeof(arr) / sizeof((arr)[0])))])

/* Appends what fits; the caller stops once the buffer is full. */
static void put(struct gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct gen *g, const char *fmt, ...) {
  if (g->len >= g->cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g->buf + g->len, g->cap - g->len + 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  g->len += (size_t)n < g->cap - g->len ? (size_t)n : g->cap - g->len;
}

static const char *const nouns[] = {"cat", "dog",  "fox",  "bird", "fish", "horse", "mouse",
                                    "owl", "bear", "frog", "wolf", "goat", "duck",  "hen"};
static const char *const adjs[] = {"red",   "small", "big",   "old",   "young",
                                   "quick", "lazy",  "happy", "green", "brown"};
static const char *const verbs[] = {"sees",  "chases", "follows", "watches",
                                    "finds", "meets",  "helps"};
static const char *const places[] = {"river",  "hill",  "house", "garden",
                                     "forest", "field", "road",  "lake"};
static const char *const preps[] = {"near", "by", "behind", "under"};
static const char *const names[] = {"anna", "tom", "lena", "max", "sara", "ben"};
static const char *const things[] = {"apples", "stones", "books", "coins", "shells", "cakes"};
static const char *const days[] = {"monday", "tuesday",  "wednesday", "thursday",
                                   "friday", "saturday", "sunday"};
static const char *const months[] = {"january",   "february", "march",    "april",
                                     "may",       "june",     "july",     "august",
                                     "september", "october",  "november", "december"};
static const char *const digits[] = {"zero", "one", "two",   "three", "four",
                                     "five", "six", "seven", "eight", "nine"};

static void sentence_scene(struct gen *g) {
  put(g, "the %s %s %s the %s %s %s the %s.", PICK(g, adjs), PICK(g, nouns), PICK(g, verbs),
      PICK(g, adjs), PICK(g, nouns), PICK(g, preps), PICK(g, places));
}

static void sentence_count(struct gen *g) {
  int from = pick(g, 20), to = from + 3 + pick(g, 7);
  put(g, "count from %d to %d:", from, to);
  for (int i = from; i <= to; i++)
    put(g, " %d", i);
  put(g, ".");
}

static void sentence_sum(struct gen *g) {
  int a = pick(g, 10), b = pick(g, 10);
  if (pick(g, 2))
    put(g, "%d plus %d is %d.", a, b, a + b);
  else
    put(g, "%s plus %s is %d.", digits[a], digits[b], a + b);
}

static void sentence_story(struct gen *g) {
  const char *who = PICK(g, names), *other = PICK(g, names), *what = PICK(g, things);
  int have = 2 + pick(g, 8), give = 1 + pick(g, have - 1);
  put(g, "%s has %d %s. %s gives %d to %s. now %s has %d %s.", who, have, what, who, give, other,
      who, have - give, what);
}

static void sentence_order(struct gen *g) {
  if (pick(g, 2)) {
    int d = pick(g, 7);
    put(g, "after %s comes %s.", days[d], days[(d + 1) % 7]);
  } else {
    int m = pick(g, 12);
    put(g, "the month after %s is %s.", months[m], months[(m + 1) % 12]);
  }
}

static void sentence_spell(struct gen *g) {
  const char *w = pick(g, 2) ? PICK(g, nouns) : PICK(g, places);
  put(g, "%s is spelled ", w);
  for (const char *c = w; *c; c++)
    put(g, c[1] ? "%c-" : "%c", *c);
  put(g, ".");
}

static void sentence_repeat(struct gen *g) {
  const char *w = PICK(g, nouns);
  int n = 2 + pick(g, 3);
  put(g, "say %s %d times:", w, n);
  for (int i = 0; i < n; i++)
    put(g, " %s", w);
  put(g, ".");
}

static void paragraph(struct gen *g) {
  static void (*const kinds[])(struct gen *) = {sentence_scene, sentence_count, sentence_sum,
                                                sentence_story, sentence_order, sentence_spell,
                                                sentence_repeat};
  int n = 3 + pick(g, 4);
  for (int i = 0; i < n; i++) {
    if (i)
      put(g, " ");
    PICK(g, kinds)(g);
  }
  put(g, "\n\n");
}

int tz_corpus_generate(char **out, size_t *len) {
  struct gen g = {.cap = TZ_CORPUS_BYTES, .state = CORPUS_SEED};
  g.buf = malloc(g.cap + 1);
  if (!g.buf)
    return tz_err_set(TZ_ENOMEM, "corpus: cannot allocate %zu bytes", g.cap + 1);
  while (g.len < g.cap)
    paragraph(&g);
  g.buf[g.cap] = '\0';
  *out = g.buf;
  *len = g.cap;
  return 0;
}
