/* tpflex: the command-line tool. Subcommands: plan (layout and schedule), demo (the main job:
 * packed-sequence microbatches through one fixed-capacity manager), bench (benchmarks),
 * calibrate (this machine's cost table for the planner). */
#include "cmds.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tpflex/tpflex.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: tpflex <command> [options]\n"
          "  plan       print the registered bytes, active layout and schedule of one operation\n"
          "             (--predict: the planner's candidates; --project: the 8-GPU projection)\n"
          "  demo       run packed-sequence microbatches of varying T through one manager\n"
          "  bench      benchmark set_active_shape, dynamic vs padded, chunking, overlap and\n"
          "             the planner (--section planner)\n"
          "  calibrate  measure this machine's cost table for the planner\n"
          "  version\n"
          "`tpflex <command> --help` describes each command's options. Every command takes\n"
          "`--name value` or `--name=value`; numbers are plain decimal (no sign, no 0x, no\n"
          "leading zero) within the range --help prints. Exit 0 OK, 1 a failed check or run,\n"
          "2 bad arguments.\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "plan") == 0) return tpf_cmd_plan(argc - 1, argv + 1);
  if (strcmp(cmd, "demo") == 0) return tpf_cmd_demo(argc - 1, argv + 1);
  if (strcmp(cmd, "bench") == 0) return tpf_cmd_bench(argc - 1, argv + 1);
  if (strcmp(cmd, "calibrate") == 0) return tpf_cmd_calibrate(argc - 1, argv + 1);
  const bool simple = strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0 ||
                      strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 ||
                      strcmp(cmd, "-h") == 0;
  if (simple && argc > 2) {
    fprintf(stderr, "tpflex %s: unexpected argument '%s' (it takes none)\n", cmd, argv[2]);
    return 2;
  }
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("tpflex %d.%d.%d\n", TPF_VERSION_MAJOR, TPF_VERSION_MINOR, TPF_VERSION_PATCH);
    return 0;
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "tpflex: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
