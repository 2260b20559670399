/* Subcommands of the tpflex command-line tool; tools/tpflex_main.c dispatches to them. Each takes
 * the arguments after the subcommand name (argv[0] is the subcommand) and returns the process
 * exit status: 0 success, 1 a failed check or run, 2 bad arguments. */
#ifndef TPF_CMDS_H
#define TPF_CMDS_H

/* tpflex plan: prints the layout and every rank's schedule, then runs the schedule checker. */
int tpf_cmd_plan(int argc, char **argv);
/* tpflex demo: packed-sequence microbatches through one fixed-capacity manager. */
int tpf_cmd_demo(int argc, char **argv);
/* tpflex bench: nccl-tests style timing tables. */
int tpf_cmd_bench(int argc, char **argv);
/* tpflex calibrate: measures this machine's cost table for the planner. */
int tpf_cmd_calibrate(int argc, char **argv);

#endif /* TPF_CMDS_H */
