/* The built-in corpus: English-like text generated on the fly from a small grammar, so a demo
 * can train without a data file and nothing large lives in the repository. The same bytes every
 * time (a fixed generator and seed); byte tokens (vocabulary 256, all of them ASCII).
 *
 * What it holds, in paragraphs of a few sentences each: simple sentences from a fixed vocabulary
 * ("the quick fox follows the old dog near the river."), counting runs ("count from 4 to 9: 4 5
 * 6 7 8 9."), sums of small numbers ("3 plus 5 is 8."), weekdays and months in order, spelled
 * words ("fox is spelled f-o-x."), and a word repeated in its sentence. Every structure repeats
 * with variations, so a byte model of a few hundred thousand parameters learns spelling, word
 * order and the counting patterns within minutes on a CPU. */
#ifndef TZ_TRAINER_CORPUS_H
#define TZ_TRAINER_CORPUS_H

#include <stddef.h>

/* The corpus is this many bytes long. */
#define TZ_CORPUS_BYTES ((size_t)320 * 1024)

/* Writes the corpus into a new buffer: *out (TZ_CORPUS_BYTES bytes plus a terminating NUL, the
 * caller frees it with free()), *len = TZ_CORPUS_BYTES. TZ_ENOMEM if the buffer cannot be had. */
int tz_corpus_generate(char **out, size_t *len);

#endif
