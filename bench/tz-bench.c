/* tz-bench: standalone memory benchmarks, each printed beside the raw ceiling it is compared with.
 */
#include "bench/bench.h"

#include <stdio.h>
#include <string.h>

#include "tz_version.h"

static const struct {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *help;
} subcommands[] = {
    {"tiers", tz_bench_tiers, "tier-to-tier bandwidth beside fio and raw copies"},
    {"adam", tz_bench_adam,
     "CPU (and --gpu GPU) Adam beside the streaming ceiling of the same run"},
    {"collectives", tz_bench_collectives,
     "all-gather and reduce-scatter busbw beside direct MPI or NCCL calls"},
    {"layer", tz_bench_layer, "one transformer layer fwd+bwd on the cuda backend beside PyTorch"},
    {"prefetch", tz_bench_prefetch,
     "the scheduler streaming layers in ahead of compute, against the critical path"},
    {NULL, NULL, NULL}, /* subcommands are added above this line */
};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: tz-bench <benchmark> [options]   (tz-bench <benchmark> --help for its options)\n\n");
  for (size_t i = 0; subcommands[i].name; i++)
    fprintf(f, "  %-12s %s\n", subcommands[i].name, subcommands[i].help);
  fprintf(f, "\n  tz-bench --version   the version, the commit and the libraries compiled in\n");
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    tz_version_print(stdout, "tz-bench");
    return 0;
  }
  for (size_t i = 0; subcommands[i].name; i++)
    if (strcmp(argv[1], subcommands[i].name) == 0)
      return subcommands[i].run(argc - 1, argv + 1);
  fprintf(stderr, "tz-bench: unknown benchmark '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
