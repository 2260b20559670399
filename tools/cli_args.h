/* One option table and one strict number parser for every tpflex command (plan, demo, bench,
 * calibrate, and the top level's version and help).
 *
 * Numbers are decimal digits only: no sign, no '+', no leading zero (so no octal), no hex, no
 * exponent, no wrap; each option has its own [min, max] range, checked before the value is
 * stored. Errors name the command and the option, echo the exact text typed and give the range,
 * e.g. "tpflex demo: --tp '-1' is not a decimal number in [1, 64]". Options are "--name value"
 * or "--name=value"; flags take no value ("--flag=x" is refused); in "--name value" the value may
 * not start with "--" (that word is an option: the value is missing; "--name=--x" passes one). */
#ifndef TPF_CLI_ARGS_H
#define TPF_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
  CLI_FLAG,   /* no value */
  CLI_U64,    /* a decimal number in [min, max] */
  CLI_STR,    /* any non-empty text (a file name, ...) */
  CLI_CHOICE, /* one of the '|'-separated words in choices; the index is stored */
} cli_kind;

typedef struct {
  const char *name; /* "--tp" */
  cli_kind kind;
  uint64_t min, max;   /* CLI_U64 */
  const char *choices; /* CLI_CHOICE: "bf16|fp16|fp32" */
  const char *metavar; /* "P", "FILE" (usage) */
  const char *help;    /* one line; the default belongs here */
  unsigned applies;    /* command-defined mask (plan: algorithms); 0 = always */
  bool repeat;         /* may be given more than once (CLI_CHOICE: indices are or-ed as bits) */
} cli_opt;

typedef struct {
  bool set;
  uint64_t u;    /* CLI_U64 value; CLI_CHOICE index; repeatable CLI_CHOICE: bit mask */
  const char *s; /* the text typed (CLI_STR, CLI_CHOICE, CLI_U64) */
} cli_val;

typedef struct {
  const char *cmd; /* "tpflex demo" */
  bool json;       /* errors as {"status":..,"message":..} on stdout */
  FILE *usage_to;  /* unused by the parser; for callers */
} cli_ctx;

/* Strict decimal: true and *out when text is digits only (no leading zero unless "0"), fits in
 * 64 bits and lies in [min, max]. */
bool cli_parse_u64(const char *text, uint64_t min, uint64_t max, uint64_t *out);

/* Writes s to stdout as the inside of a JSON string (quotes, backslashes, control characters
 * escaped). */
void cli_json_escaped(const char *s);

/* Reports an error (stderr, or a JSON object on stdout when ctx->json) and returns 2. */
int cli_error(const cli_ctx *ctx, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Parses argv[1..argc) against opts into vals (n entries, zeroed here). Returns -1 on success,
 * 0 after printing usage for --help/-h, 2 after reporting an error. */
int cli_parse(const cli_ctx *ctx, const cli_opt *opts, int n, int argc, char **argv, cli_val *vals,
              const char *usage_intro);

/* Index of the option called name in opts, or -1. */
int cli_find(const cli_opt *opts, int n, const char *name);

/* Prints usage_intro, then one line per option (name, value, help). */
void cli_usage(FILE *f, const cli_opt *opts, int n, const char *usage_intro, const char *outro);

/* True when argv[1..argc) contains exactly the word w (to decide --json before parsing). */
bool cli_has_word(int argc, char **argv, const char *w);

/* True when path could be written: an existing file (not a directory) that is writable, or a new
 * one in a writable, searchable directory. Creates nothing (stat(2), access(2)); errno says why
 * not. */
bool cli_path_writable(const char *path);

/* The whole file as a NUL-terminated string (malloc'ed; free it), or NULL when it cannot be read
 * or is longer than max bytes. */
char *cli_read_text(const char *path, size_t max);

/* Loads a cost table (include/tpflex/tpflex_cost.h) into *out: from `path` when it is not NULL,
 * else the shipped table `default_name` ("h200.txt", "sim.txt") from the installed
 * share/tpflex/cost found relative to this executable (/proc/self/exe, then ../share/tpflex/cost,
 * as the install rules lay it out), then from the source tree's data/cost. `used` (len bytes)
 * receives the path read. Returns -1 on success, else 2 after reporting through cli_error (`opt`,
 * e.g. "--cost", names the option in the message, and a missing default names both places). */
struct tpf_cost_table;
int cli_load_cost(const cli_ctx *ctx, const char *opt, const char *path, const char *default_name,
                  struct tpf_cost_table *out, char *used, size_t len);

/* Finishes an output the command wrote: flushes f and, unless it is stdout or stderr, closes it.
 * Any write error on the way (an earlier fprintf that failed, the flush, the close) is reported
 * on stderr as "<cmd>: writing <what> failed: <strerror>" (what: "'PATH'" or "standard output")
 * and 1 is returned; 0 when every byte reached the file. f is closed either way. */
int cli_finish_output(const char *cmd, FILE *f, const char *what);

#endif /* TPF_CLI_ARGS_H */
