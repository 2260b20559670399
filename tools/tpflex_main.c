/* tpflex: the command-line tool. Subcommands: plan (layout and schedule), demo (the main job:
 * packed-sequence microbatches through one fixed-capacity manager), bench (benchmarks),
 * calibrate (this machine's cost table for the planner). */
#include "cli_args.h"
#include "cmds.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "tpflex/tpflex.h"

static const char kUsage[] =
    "usage: tpflex <command> [options]\n"
    "  plan       print the registered bytes, active layout and schedule of one operation\n"
    "             (--predict: the planner's candidates; --project: the 8-GPU projection)\n"
    "  demo       run packed-sequence microbatches of varying T through one manager\n"
    "  bench      benchmark set_active_shape, dynamic vs padded, chunking, overlap and\n"
    "             the planner (--section planner)\n"
    "  calibrate  measure this machine's cost table for the planner\n"
    "  version    print the version (also --version)\n"
    "  help       this text (also --help, -h)\n"
    "`tpflex <command> --help` describes each command's options. Every command takes\n"
    "`--name value` or `--name=value`; numbers are plain decimal (no sign, no 0x, no\n"
    "leading zero) within the range --help prints. Exit 0 OK, 1 a failed check or run,\n"
    "2 bad arguments.";

/* version and help take no options: the commands' parser (cli_args.h) with an empty table, so
 * they refuse a stray word or an unknown option as every command does. */
static int no_options(const char *cmd, const char *intro, int argc, char **argv) {
  static const cli_opt none[1] = {{"--", CLI_FLAG, 0, 0, NULL, NULL, "", 0, false}};
  cli_val v[1];
  const cli_ctx ctx = {cmd, false, NULL};
  return cli_parse(&ctx, none, 0, argc, argv, v, intro);
}

/* A command's standard output must reach its destination: `tpflex bench > /dev/full` is a
 * failure (exit 1 and a message naming standard output), not "all checks passed". A command that
 * already failed keeps its own exit status. */
static int finish(const char *cmd, int rc) {
  if (cli_finish_output(cmd, stdout, "standard output") != 0 && rc == 0) rc = 1;
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "%s\n", kUsage);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "plan") == 0) return finish("tpflex plan", tpf_cmd_plan(argc - 1, argv + 1));
  if (strcmp(cmd, "demo") == 0) return finish("tpflex demo", tpf_cmd_demo(argc - 1, argv + 1));
  if (strcmp(cmd, "bench") == 0) return finish("tpflex bench", tpf_cmd_bench(argc - 1, argv + 1));
  if (strcmp(cmd, "calibrate") == 0)
    return finish("tpflex calibrate", tpf_cmd_calibrate(argc - 1, argv + 1));
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    int rc = no_options("tpflex version", "usage: tpflex version   (prints the version)", argc - 1,
                        argv + 1);
    if (rc >= 0) return rc;
    printf("tpflex %d.%d.%d\n", TPF_VERSION_MAJOR, TPF_VERSION_MINOR, TPF_VERSION_PATCH);
    return finish("tpflex version", 0);
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    int rc = no_options("tpflex help", kUsage, argc - 1, argv + 1);
    if (rc >= 0) return rc;
    printf("%s\n", kUsage);
    return finish("tpflex help", 0);
  }
  fprintf(stderr, "tpflex: unknown command '%s'\n%s\n", cmd, kUsage);
  return 2;
}
